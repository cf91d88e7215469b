/* it_credit.c: libsbx checks incoming DATA against the credit it granted, against a fake shim.
 *
 * PROTOCOL.md 8: DATA beyond the receiver's credit is a connection error EPROTO "flow control
 * violated on stream N". A fake shim on a unix socket (a thread) sends exactly the credit a
 * call has granted, which must be taken, then on another call one byte more, and goes on as if
 * nothing had happened: that byte must fail the connection.
 *   oneshot  a call that takes no DATA (mkdir): its credit is the initial window, 256 KiB,
 *            as libsbx drops such DATA without granting it back
 *   read     a read whose sink holds on to the first bytes, so that no credit goes back
 *            meanwhile: the initial window plus the read's extra 4 MiB (fs_io.c); another
 *            thread's pings read the connection in the meantime */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define KiB 1024u
#define WINDOW (256 * KiB)      /* libsbx's Hello.initial_window */
#define READ_EXTRA (4096 * KiB) /* the WINDOW libsbx's reads send after their REQUEST */
#define CHUNK (64 * KiB)

/* ---- the fake shim ---- */

struct fake {
	int lfd;
	char path[256];
	pthread_t thread;
	void (*script)(int fd);
};

static uint8_t pattern[CHUNK];

/* Send one frame. A client that has gone is no error here: after a violation it closes
 * without reading what follows, and the cases check what the client saw. */
static void fake_send(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(hdr, &h);
	struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)(uintptr_t)payload, len}};
	size_t total = sizeof(hdr) + len;
	for (size_t off = 0; off < total;) {
		struct iovec v[2];
		int n = 0;
		size_t skip = off;
		for (int i = 0; i < 2; i++) {
			if (skip >= iov[i].iov_len) {
				skip -= iov[i].iov_len;
				continue;
			}
			v[n].iov_base = (uint8_t *)iov[i].iov_base + skip;
			v[n].iov_len = iov[i].iov_len - skip;
			skip = 0;
			n++;
		}
		struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n};
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
			return;
		CHECKF(w > 0, "send %s: %s", frame_type_name(type), strerror(errno));
		off += (size_t)w;
	}
}

static void fake_hello(int fd)
{
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "no HELLO");
	CHECK(h.type == FRAME_HELLO && h.stream == 0);
	Shim__V1__Hello *m = shim__v1__hello__unpack(NULL, h.len, p);
	CHECK(m != NULL);
	/* the credit the cases count on */
	CHECKF(m->has_initial_window && m->initial_window == WINDOW, "libsbx asks for a window of %u, not %u",
	       m->initial_window, WINDOW);
	shim__v1__hello__free_unpacked(m, NULL);
	free(p);
	Shim__V1__HelloReply r = SHIM__V1__HELLO_REPLY__INIT;
	r.protocol_version = 1;
	r.shim_version = (char *)"fake";
	r.max_frame = 1u << 20;
	r.initial_window = WINDOW;
	uint8_t buf[256];
	size_t n = shim__v1__hello_reply__get_packed_size(&r);
	CHECK(n <= sizeof(buf));
	shim__v1__hello_reply__pack(&r, buf);
	fake_send(fd, 0, FRAME_HELLO_OK, 0, buf, n);
}

/* Read exactly n bytes; false on EOF or a reset (the client closed with our last frames
 * unread: after a violation it reads no more). */
static bool fake_read(int fd, uint8_t *buf, size_t n)
{
	for (size_t got = 0; got < n;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int r = poll(&pf, 1, 20000);
		CHECKF(r != 0, "the client sent nothing for 20 s");
		if (r < 0 && errno == EINTR)
			continue;
		ssize_t k = read(fd, buf + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			return false;
		CHECKF(k > 0, "read: %s", strerror(errno));
		got += (size_t)k;
	}
	return true;
}

/* One frame from the client: 1, or 0 when it has gone. */
static int fake_recv(int fd, struct frame_hdr *h, uint8_t **p)
{
	uint8_t hdr[FRAME_HDR_LEN];
	if (!fake_read(fd, hdr, sizeof(hdr)))
		return 0;
	frame_get_hdr(hdr, h);
	CHECKF(h->len <= (1u << 20) && h->type != 0 && h->reserved == 0, "bad frame header from the client");
	*p = malloc(h->len + 1u);
	CHECK(*p != NULL);
	if (!fake_read(fd, *p, h->len)) {
		free(*p);
		return 0;
	}
	return 1;
}

/* The next frame that is not a WINDOW (the credit libsbx gives back is not checked here). */
static int fake_next(int fd, struct frame_hdr *h, uint8_t **p)
{
	for (;;) {
		if (fake_recv(fd, h, p) == 0)
			return 0;
		if (h->type != FRAME_WINDOW)
			return 1;
		free(*p);
	}
}

static uint32_t fake_request(int fd)
{
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(fake_next(fd, &h, &p) == 1, "EOF instead of a REQUEST");
	CHECKF(h.type == FRAME_REQUEST, "got %s instead of a REQUEST", frame_type_name(h.type));
	free(p);
	return h.stream;
}

/* The WINDOW a read sends right after its REQUEST. */
static void fake_window(int fd, uint32_t stream, uint32_t want)
{
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(fake_recv(fd, &h, &p) == 1, "EOF instead of the read's WINDOW");
	CHECKF(h.type == FRAME_WINDOW && h.stream == stream && h.len == 4 && frame_get_u32(p) == want,
	       "got %s (%u bytes) on stream %u, want WINDOW %u on stream %u", frame_type_name(h.type), h.len, h.stream,
	       want, stream);
	free(p);
}

/* n bytes of DATA on stream, in frames of CHUNK bytes (the last one shorter). */
static void fake_data(int fd, uint32_t stream, uint64_t n)
{
	for (uint64_t off = 0; off < n;) {
		size_t k = n - off < CHUNK ? (size_t)(n - off) : CHUNK;
		fake_send(fd, stream, FRAME_DATA, 0, pattern, k);
		off += k;
	}
}

static void fake_end(int fd, uint32_t stream, const Shim__V1__Result *res)
{
	uint8_t buf[64];
	size_t n = shim__v1__result__get_packed_size(res);
	CHECK(n <= sizeof(buf));
	shim__v1__result__pack(res, buf);
	fake_send(fd, stream, FRAME_END, 0, buf, n);
}

/* Answer PINGs until a REQUEST comes (returns its stream) or EOF (returns 0). */
static uint32_t fake_serve(int fd, bool pong)
{
	struct frame_hdr h;
	uint8_t *p;
	while (fake_next(fd, &h, &p) == 1) {
		uint32_t id = h.type == FRAME_REQUEST ? h.stream : 0;
		if (h.type == FRAME_PING && pong)
			fake_send(fd, 0, FRAME_PONG, 0, p, h.len);
		else
			CHECKF(h.type == FRAME_PING || h.type == FRAME_REQUEST || h.type == FRAME_CANCEL,
			       "unexpected %s from the client", frame_type_name(h.type));
		free(p);
		if (id != 0)
			return id;
	}
	return 0;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	int fd = accept(f->lfd, NULL, NULL);
	CHECKF(fd >= 0, "accept: %s", strerror(errno));
	fake_hello(fd);
	f->script(fd);
	close(fd);
	return NULL;
}

static const char *fake_start(struct fake *f, void (*script)(int fd))
{
	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (uint8_t)('a' + i % 26);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(f->path, sizeof(f->path), "%s", it_path("fake.sock"));
	CHECK(strlen(f->path) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, f->path);
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(f->lfd >= 0);
	CHECK(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(f->lfd, 1) == 0);
	f->script = script;
	CHECK(pthread_create(&f->thread, NULL, fake_main, f) == 0);
	return it_unix_target(f->path);
}

static struct sbx_client *client_for(const char *target)
{
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.default_timeout_ms = 30000; /* a hang fails the call, not the watchdog */
	struct sbx_client *c;
	struct sbx_error err;
	CHECK_SBX(sbx_connect(target, &o, &c, &err), &err);
	return c;
}

static void check_violation(const struct sbx_error *err, uint32_t stream)
{
	char want[64];
	snprintf(want, sizeof(want), "flow control violated on stream %u", stream);
	CHECK_ERR(err, SBX_ERR_PROTOCOL, EPROTO);
	CHECK_CONTAINS(err->message, want);
}

/* ---- oneshot ---- */

static void script_oneshot(int fd)
{
	Shim__V1__Done d = SHIM__V1__DONE__INIT;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_DONE;
	res.done = &d;
	/* all of the credit: taken (and dropped) */
	uint32_t id = fake_request(fd);
	fake_data(fd, id, WINDOW);
	fake_end(fd, id, &res);
	/* one byte beyond it, and on as if nothing had happened */
	id = fake_request(fd);
	fake_data(fd, id, WINDOW + 1);
	fake_end(fd, id, &res);
	fake_serve(fd, true);
}

static int case_oneshot(void)
{
	struct fake f;
	struct sbx_client *c = client_for(fake_start(&f, script_oneshot));
	struct sbx_error err;
	CHECK_SBX(sbx_mkdir(c, NULL, "/a", 0, -1, &err), &err);
	CHECKF(sbx_mkdir(c, NULL, "/b", 0, -1, &err) < 0, "a call took %u bytes of DATA with %u of credit", WINDOW + 1,
	       WINDOW);
	check_violation(&err, 3);
	/* a connection error: the connection is over */
	CHECK(sbx_ping(c, NULL, NULL, &err) < 0);
	check_violation(&err, 3);
	sbx_client_close(c);
	CHECK(pthread_join(f.thread, NULL) == 0);
	close(f.lfd);
	return 0;
}

/* ---- read ---- */

/* A sink that holds the first bytes of each read until released: no credit goes back
 * meanwhile (libsbx grants after the sink has taken the bytes). */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool entered, released;
	uint64_t got;
	bool bad;
} hold = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, 0, false};

static int hold_sink(void *ud, const void *buf, size_t len)
{
	(void)ud;
	pthread_mutex_lock(&hold.mu);
	hold.entered = true;
	pthread_cond_broadcast(&hold.cv);
	while (!hold.released)
		pthread_cond_wait(&hold.cv, &hold.mu);
	for (size_t i = 0; i < len; i++)
		if (((const uint8_t *)buf)[i] != pattern[(hold.got + i) % CHUNK])
			hold.bad = true;
	hold.got += len;
	pthread_mutex_unlock(&hold.mu);
	return 0;
}

static void hold_reset(void)
{
	pthread_mutex_lock(&hold.mu);
	hold.entered = hold.released = hold.bad = false;
	hold.got = 0;
	pthread_mutex_unlock(&hold.mu);
}

static void hold_wait_entered(void)
{
	pthread_mutex_lock(&hold.mu);
	while (!hold.entered)
		pthread_cond_wait(&hold.cv, &hold.mu);
	pthread_mutex_unlock(&hold.mu);
}

static void hold_release(void)
{
	pthread_mutex_lock(&hold.mu);
	hold.released = true;
	pthread_cond_broadcast(&hold.cv);
	pthread_mutex_unlock(&hold.mu);
}

struct reader {
	struct sbx_client *c;
	pthread_t thread;
	int rc;
	uint64_t bytes;
	struct sbx_error err;
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	r->rc = sbx_read_file(r->c, NULL, "/f", 0, SBX_TO_END, hold_sink, NULL, &r->bytes, &r->err);
	return NULL;
}

static void script_read(int fd)
{
	/* all of the credit, FIN and END; PONGs only after them (a pong proves it was all
	 * taken, or refused) */
	uint32_t id = fake_request(fd);
	fake_window(fd, id, READ_EXTRA);
	fake_data(fd, id, WINDOW + READ_EXTRA);
	fake_send(fd, id, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	Shim__V1__ReadReply rr = SHIM__V1__READ_REPLY__INIT;
	rr.bytes = WINDOW + READ_EXTRA;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_READ;
	res.read = &rr;
	fake_end(fd, id, &res);
	/* one byte beyond it */
	id = fake_serve(fd, true);
	CHECKF(id != 0, "EOF instead of the second read");
	fake_window(fd, id, READ_EXTRA);
	fake_data(fd, id, WINDOW + READ_EXTRA + 1);
	fake_send(fd, id, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	rr.bytes = WINDOW + READ_EXTRA + 1;
	fake_end(fd, id, &res);
	fake_serve(fd, true);
}

static int case_read(void)
{
	struct fake f;
	struct sbx_client *c = client_for(fake_start(&f, script_read));
	struct sbx_error err;

	/* exactly the credit: the pong comes after all of it, which was taken */
	struct reader r = {.c = c};
	hold_reset();
	CHECK(pthread_create(&r.thread, NULL, reader_main, &r) == 0);
	hold_wait_entered();
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	hold_release();
	CHECK(pthread_join(r.thread, NULL) == 0);
	CHECK_SBX(r.rc, &r.err);
	CHECK_EQ(r.bytes, WINDOW + READ_EXTRA);
	CHECK(!hold.bad);

	/* one byte more than the credit, while the sink still holds the first bytes */
	struct reader r2 = {.c = c};
	hold_reset();
	CHECK(pthread_create(&r2.thread, NULL, reader_main, &r2) == 0);
	hold_wait_entered();
	CHECKF(sbx_ping(c, NULL, NULL, &err) < 0, "a read took %u bytes of DATA with %u of credit",
	       WINDOW + READ_EXTRA + 1, WINDOW + READ_EXTRA);
	check_violation(&err, 3);
	hold_release();
	CHECK(pthread_join(r2.thread, NULL) == 0);
	CHECK(r2.rc < 0);
	check_violation(&r2.err, 3);
	sbx_client_close(c);
	CHECK(pthread_join(f.thread, NULL) == 0);
	close(f.lfd);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"oneshot", case_oneshot},
		{"read", case_read},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
