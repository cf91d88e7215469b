/* fuzz_rx.c: libFuzzer harness for libsbx's receiving side (sdk/src/reader.c): bytes as from a shim, fed to a
 * client over a socketpair while it has calls in flight; built without libFuzzer, fuzz_util.c's main() replays a
 * corpus. */
#include "fuzz.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* An input is one control byte and then the bytes the shim sends:
 *   bit 0     the bytes start with the shim's answer to HELLO (else the harness sends a HELLO_OK first)
 *   bits 1-2  the bytes after the handshake go in (bits + 1) chunks, the client reading in between
 *   bit 3     the client traces every frame (frame_describe decodes the payloads)
 *   bits 4-7  move the split points
 * Once connected, the client has these calls in flight, as a program using it would:
 *   stream 1  a download (sbx_read_file's receiving loop): its DATA goes to a sink, which refuses a
 *             piece that starts with 0xff; on any error the call is given up (CANCEL goes out)
 *   stream 3  a request whose frames wait in its queue; once the input is over its END is decoded
 *             as a Result (sbx__wait_result)
 *   stream 5  given up on when its first frame arrives (later ones must be dropped)
 *   stream 7  an echo's receiving loop (sbx_echo): its DATA may be read straight into its buffer
 *             (sbx__call_sink), SINK_CAP bytes; each frame must be at its place there or be copied
 *             there, and nothing may write into the buffer once the call is given up (when a
 *             frame would not fit, or one starts with 0xfe)
 *   pings     seq 1 waits for "PONG 00000000 00000001"; seq 2 is an sbx_ping_async whose callback
 *             must run exactly once
 * What the client sends (HELLO, REQUESTs, WINDOW, CANCEL, PONG) is read and dropped.
 * tests/fuzz/make_corpus.py writes seeds in this layout (corpus_rx/). */
#define CTL_RAW_HANDSHAKE 0x01
#define CTL_TRACE 0x08

const char fuzz_name[] = "fuzz_rx";

#define SINK_CAP 150000

/* the canned HELLO_OK frame (bit 0 clear), made once */
static uint8_t hello_ok[256];
static size_t hello_ok_len;

struct fz {
	struct sbx_client *c;
	int peer; /* the shim's end */
	bool dead;
	struct call *dl, *req, *drop, *ping, *echo;
	uint8_t *sink, *shadow; /* the echo's buffer, and what it should hold */
	size_t sink_got;
	bool sink_ended; /* the echo was given up: its buffer holds SINK_GONE bytes only */
	struct sbx__download d;
	uint64_t sunk;
	unsigned async_done;
	size_t trace_bytes;
};

static void make_hello_ok(void)
{
	Shim__V1__HelloReply r = SHIM__V1__HELLO_REPLY__INIT;
	char *features[] = {(char *)"fs", (char *)"exec", (char *)"backup"};
	r.protocol_version = SBX_PROTOCOL_VERSION;
	r.shim_version = (char *)"fuzz";
	r.features = features;
	r.n_features = 3;
	r.max_frame = FRAME_DEFAULT_MAX;
	r.pid = 1;
	r.pid1 = 1;
	r.initial_window = FRAME_DEFAULT_WINDOW;
	size_t n = shim__v1__hello_reply__get_packed_size(&r);
	if (FRAME_HDR_LEN + n > sizeof(hello_ok))
		fuzz_die("HELLO_OK too big");
	struct frame_hdr h = {.len = (uint32_t)n, .type = FRAME_HELLO_OK};
	frame_put_hdr(hello_ok, &h);
	shim__v1__hello_reply__pack(&r, hello_ok + FRAME_HDR_LEN);
	hello_ok_len = FRAME_HDR_LEN + n;
}

static void trace_cb(void *ud, const char *line)
{
	struct fz *z = ud;
	z->trace_bytes += strlen(line);
}

static int sink_cb(void *ud, const void *buf, size_t len)
{
	struct fz *z = ud;
	if (len > 0 && *(const uint8_t *)buf == 0xff)
		return EIO;
	z->sunk += len;
	return 0;
}

static void ping_cb(void *ud, int rc, uint64_t rtt_ns, const struct sbx_error *err)
{
	struct fz *z = ud;
	(void)rtt_ns;
	if ((rc < 0) != (err != NULL))
		fuzz_die("ping callback: result and error disagree");
	z->async_done++;
}

/* Read and drop what the client sent. */
static void drain_peer(struct fz *z)
{
	uint8_t buf[16384];
	while (read(z->peer, buf, sizeof(buf)) > 0)
		;
}

static uint64_t deadline(void)
{
	/* nothing here waits: every wait ends as soon as it looks */
	return sbx__now_ns() + 5000000000u;
}

#define SINK_GONE 0xaa

/* The echo call ends: its buffer holds what its frames brought, and from now on nothing
 * may write into it. */
static void echo_end(struct fz *z)
{
	sbx__call_free(z->echo);
	z->echo = NULL;
	if (memcmp(z->sink, z->shadow, z->sink_got) != 0)
		fuzz_die("the echo's buffer does not hold what its frames brought");
	memset(z->sink, SINK_GONE, SINK_CAP);
	z->sink_ended = true;
}

/* Take the echo's frames as sbx_echo does; false once it is given up. */
static bool echo_take(struct fz *z, struct rx_item *it)
{
	struct sbx_error err;
	if (it->type != FRAME_DATA)
		return true;
	if (it->len > SINK_CAP - z->sink_got)
		return false; /* more than was sent */
	if (it->ext != NULL && it->ext != z->sink + z->sink_got)
		fuzz_die("DATA read into the echo's buffer at the wrong place");
	if (it->ext == NULL)
		memcpy(z->sink + z->sink_got, it->data, it->len);
	memcpy(z->shadow + z->sink_got, z->sink + z->sink_got, it->len);
	z->sink_got += it->len;
	if (it->len > 0 && z->sink[z->sink_got - it->len] == 0xfe)
		return false;
	return sbx__call_grant(z->echo, it->len, deadline(), &err) == 0;
}

/* What a program does with the frames its calls got: not blocking, as the input
 * may not be all there yet. */
static void service(struct fz *z)
{
	struct rx_item *it;
	struct sbx_error err;
	while (z->dl != NULL && (it = sbx__call_pop(z->dl)) != NULL) {
		int rc = 0;
		if (it->type == FRAME_DATA)
			rc = sbx__download_data(z->dl, &z->d, it, deadline(), "/fuzz", &err);
		sbx__rx_free(it);
		if (rc < 0) {
			sbx__call_free(z->dl);
			z->dl = NULL;
		}
	}
	while (z->echo != NULL && (it = sbx__call_pop(z->echo)) != NULL) {
		bool more = echo_take(z, it);
		sbx__rx_free(it);
		if (!more)
			echo_end(z);
	}
	if (z->drop != NULL && ((it = sbx__call_pop(z->drop)) != NULL || sbx__call_done(z->drop))) {
		sbx__rx_free(it);
		sbx__call_free(z->drop);
		z->drop = NULL;
	}
}

/* Let the client read all that is in its socket; true while it is alive. */
static bool pump(struct fz *z)
{
	struct sbx_error err;
	int fd = sbx_client_fd(z->c);
	int avail;
	while (!z->dead && ioctl(fd, FIONREAD, &avail) == 0 && avail > 0) {
		if (sbx_client_process(z->c, &err) < 0) {
			z->dead = true;
		} else {
			int left;
			if (ioctl(fd, FIONREAD, &left) == 0 && left == avail)
				fuzz_die("the client did not read what was there");
		}
		service(z);
		drain_peer(z);
	}
	return !z->dead;
}

/* Write len bytes to the client, letting it read whenever the socket is full. */
static void feed(struct fz *z, const uint8_t *p, size_t len)
{
	while (len > 0 && !z->dead) {
		ssize_t w = write(z->peer, p, len);
		if (w > 0) {
			p += w;
			len -= (size_t)w;
		} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
			fuzz_die("write to the client failed");
		}
		pump(z);
	}
}

/* The input is over: the client reads to the end, which kills the connection. */
static void finish(struct fz *z)
{
	struct sbx_error err;
	shutdown(z->peer, SHUT_WR);
	while (!z->dead) {
		if (sbx_client_process(z->c, &err) < 0)
			z->dead = true;
		service(z);
		drain_peer(z);
	}
	service(z);
	if (z->req != NULL) {
		Shim__V1__Result *r = sbx__wait_result(z->req, deadline(), NULL, &err);
		if (r != NULL)
			shim__v1__result__free_unpacked(r, NULL);
		sbx__call_free(z->req);
	}
	if (z->dl != NULL)
		sbx__call_free(z->dl);
	if (z->drop != NULL)
		sbx__call_free(z->drop);
	if (z->ping != NULL)
		sbx__call_free(z->ping);
	if (z->echo != NULL)
		echo_end(z);
	z->dl = z->req = z->drop = z->ping = NULL;
}

/* The calls in flight: four streams (ids 1, 3, 5, 7) and two pings (seq 1, 2). */
static int open_calls(struct fz *z)
{
	struct sbx_error err;
	struct call **streams[] = {&z->dl, &z->req, &z->drop, &z->echo};
	for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
		struct call *k = sbx__call_new(z->c, true);
		if (k == NULL)
			fuzz_die("out of memory");
		*streams[i] = k;
		if (sbx__send_request(k, "", 0, deadline(), &err) < 0)
			return -1;
	}
	z->d.sink = sink_cb;
	z->d.ud = z;
	sbx__call_sink(z->echo, z->sink, SINK_CAP);
	/* a ping whose PING the shim is taken to have had */
	z->ping = sbx__call_new(z->c, false);
	if (z->ping == NULL)
		fuzz_die("out of memory");
	if (sbx_ping_async(z->c, ping_cb, z, &err) < 0)
		z->async_done++; /* the callback will not run */
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	uint8_t ctl = data[0];
	data++;
	size--;

	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		fuzz_die("socketpair failed");
	struct fz z = {.peer = sv[1], .sink = malloc(SINK_CAP), .shadow = malloc(SINK_CAP)};
	if (z.sink == NULL || z.shadow == NULL)
		fuzz_die("out of memory");

	/* The handshake reads one frame: it is all in the socket before the client
	 * looks, so the handshake never waits (an incomplete one is followed by the end). */
	const uint8_t *first = hello_ok;
	size_t first_len = hello_ok_len;
	if (ctl & CTL_RAW_HANDSHAKE) {
		first = data;
		first_len = size;
		if (size >= FRAME_HDR_LEN) {
			/* a header the handshake refuses needs nothing after it */
			struct frame_hdr h;
			frame_get_hdr(data, &h);
			first_len = h.len <= FRAME_HELLO_MAX ? FRAME_HDR_LEN + h.len : FRAME_HDR_LEN;
			if (first_len > size)
				first_len = size;
		}
		data += first_len;
		size -= first_len;
	}
	if (first_len > 0 && write(z.peer, first, first_len) != (ssize_t)first_len)
		fuzz_die("cannot write the handshake");
	if ((ctl & CTL_RAW_HANDSHAKE) && size == 0)
		shutdown(z.peer, SHUT_WR);

	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.connect_timeout_ms = 5000;
	o.default_timeout_ms = 5000;
	o.client_name = "fuzz_rx";
	if (ctl & CTL_TRACE) {
		o.trace = trace_cb;
		o.trace_ud = &z;
	}
	struct sbx_error err;
	if (sbx__client_adopt(sv[0], &o, &z.c, &err) < 0) {
		close(z.peer);
		free(z.sink);
		free(z.shadow);
		return 0;
	}
	/* what a program asks about the shim (the HelloReply's strings) */
	sbx_client_has_feature(z.c, "fs");
	z.trace_bytes += strlen(sbx_client_server(z.c)->shim_version);

	if (open_calls(&z) < 0)
		z.dead = true;
	drain_peer(&z);
	unsigned chunks = 1 + ((ctl >> 1) & 3);
	size_t shift = ctl >> 4;
	size_t off = 0;
	for (unsigned i = 1; i <= chunks && !z.dead; i++) {
		size_t end = i == chunks ? size : size * i / chunks + shift * i * 97;
		if (end > size)
			end = size;
		if (end < off)
			end = off;
		feed(&z, data + off, end - off);
		off = end;
		pump(&z);
	}
	finish(&z);
	sbx_client_close(z.c);
	close(z.peer);
	if (z.async_done != 1)
		fuzz_die("the async ping's callback did not run exactly once");
	for (size_t i = 0; z.sink_ended && i < SINK_CAP; i++)
		if (z.sink[i] != SINK_GONE)
			fuzz_die("bytes were read into the echo's buffer after it was given up");
	free(z.sink);
	free(z.shadow);
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	make_hello_ok();
	return 0;
}

void fuzz_teardown(void)
{
}
