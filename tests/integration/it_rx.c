/* it_rx.c: libsbx's receiving side against a scripted fake shim: DATA frames of every
 * size split at every kind of boundary, frames for calls given up on in the middle of
 * their payload, the connection lost or a bad frame after half a payload. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

/* ---- the fake shim: one connection, driven by a script on its own thread ---- */

struct fake {
	int lfd, fd;
	void (*script)(struct fake *f);
	pthread_t thread;
	uint8_t in[1 << 16]; /* what the client sent, not yet parsed */
	size_t inlen;
	uint32_t requests[64]; /* stream ids of the REQUESTs seen */
	unsigned nreq;
	uint32_t cancels[64];
	unsigned ncancel;
	uint8_t ping[FRAME_PING_MAX]; /* the last PING not answered yet */
	uint32_t ping_len;
	bool ping_pending;
};

/* Parse what the client sent; false on EOF. */
static bool fake_pump(struct fake *f, int timeout_ms)
{
	struct pollfd pf = {.fd = f->fd, .events = POLLIN};
	if (poll(&pf, 1, timeout_ms) <= 0)
		return true;
	ssize_t n = read(f->fd, f->in + f->inlen, sizeof(f->in) - f->inlen);
	if (n <= 0)
		return n < 0 && errno == EINTR;
	f->inlen += (size_t)n;
	size_t off = 0;
	for (;;) {
		struct frame_hdr h;
		enum frame_status fs = frame_check(f->in + off, f->inlen - off, sizeof(f->in) - FRAME_HDR_LEN, &h);
		if (fs == FRAME_NEED_MORE)
			break;
		CHECKF(fs == FRAME_OK, "bad frame from the client");
		const uint8_t *p = f->in + off + FRAME_HDR_LEN;
		if (h.type == FRAME_HELLO) {
			Shim__V1__HelloReply r = SHIM__V1__HELLO_REPLY__INIT;
			r.protocol_version = SHIM_PROTOCOL_VERSION;
			r.shim_version = (char *)"fake";
			r.max_frame = FRAME_DEFAULT_MAX;
			r.pid = (uint32_t)getpid();
			r.initial_window = FRAME_DEFAULT_WINDOW;
			uint8_t buf[256];
			size_t len = shim__v1__hello_reply__get_packed_size(&r);
			CHECK(len <= sizeof(buf));
			shim__v1__hello_reply__pack(&r, buf);
			raw_send(f->fd, 0, FRAME_HELLO_OK, 0, buf, len);
		} else if (h.type == FRAME_REQUEST) {
			CHECK(f->nreq < 64);
			__atomic_store_n(&f->requests[f->nreq], h.stream, __ATOMIC_RELAXED);
			__atomic_store_n(&f->nreq, f->nreq + 1, __ATOMIC_RELEASE);
		} else if (h.type == FRAME_CANCEL) {
			CHECK(f->ncancel < 64);
			f->cancels[f->ncancel++] = h.stream;
		} else if (h.type == FRAME_PING) {
			memcpy(f->ping, p, h.len);
			f->ping_len = h.len;
			f->ping_pending = true;
		}
		off += FRAME_HDR_LEN + h.len;
	}
	memmove(f->in, f->in + off, f->inlen - off);
	f->inlen -= off;
	return true;
}

/* Read what the client sends until it sent REQUEST number n (from 1); its stream id. */
static uint32_t fake_wait_request(struct fake *f, unsigned n)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (f->nreq < n) {
		CHECKF(it_now_ms() < deadline, "no REQUEST from the client");
		CHECKF(fake_pump(f, 10), "the client hung up before its REQUEST");
	}
	return f->requests[n - 1];
}

static void fake_wait_cancel(struct fake *f, uint32_t stream)
{
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		for (unsigned i = 0; i < f->ncancel; i++)
			if (f->cancels[i] == stream)
				return;
		CHECKF(it_now_ms() < deadline, "no CANCEL for stream %u", stream);
		CHECKF(fake_pump(f, 10), "the client hung up before its CANCEL");
	}
}

static void fake_answer_ping(struct fake *f)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (!f->ping_pending) {
		CHECKF(it_now_ms() < deadline, "no PING from the client");
		CHECKF(fake_pump(f, 10), "the client hung up before its PING");
	}
	f->ping_pending = false;
	raw_send(f->fd, 0, FRAME_PONG, 0, f->ping, f->ping_len);
}

static void write_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		CHECKF(w > 0, "send: %s", strerror(errno));
		p += w;
		len -= (size_t)w;
	}
}

/* Until the client has read every byte sent (the socket's send queue is empty). */
static void fake_wait_drained(struct fake *f)
{
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		int q = 0;
		CHECK(ioctl(f->fd, SIOCOUTQ, &q) == 0);
		if (q == 0)
			return;
		CHECKF(it_now_ms() < deadline, "the client stopped reading (%d bytes queued)", q);
		fake_pump(f, 0);
		usleep(20);
	}
}

/* Send wire in pieces ending at the cuts (increasing; ones past the end ignored), each
 * one read by the client before the next is sent when wait is set. */
static void fake_send_cut(struct fake *f, const uint8_t *wire, size_t len, const size_t *cuts, size_t ncuts, bool wait)
{
	size_t at = 0;
	for (size_t i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : len;
		if (end > len)
			end = len;
		if (end <= at)
			continue;
		write_all(f->fd, wire + at, end - at);
		at = end;
		if (wait)
			fake_wait_drained(f);
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	CHECK(f->fd >= 0);
	f->script(f);
	close(f->fd);
	return NULL;
}

static const char *fake_start(struct fake *f, void (*script)(struct fake *))
{
	const char *path = it_path("fake.sock");
	unlink(path);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	memset(f, 0, sizeof(*f));
	f->script = script;
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(f->lfd >= 0);
	CHECK(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(f->lfd, 1) == 0);
	CHECK(pthread_create(&f->thread, NULL, fake_main, f) == 0);
	return it_unix_target(path);
}

static void fake_join(struct fake *f)
{
	CHECK(pthread_join(f->thread, NULL) == 0);
	close(f->lfd);
}

/* ---- the bytes of a read ---- */

/* Byte pos of a read's data: letters, so that traces show them as they are. */
static uint8_t pattern(uint32_t seed, uint64_t pos)
{
	uint64_t x = (pos + seed * 1000003u) * 0x9E3779B97F4A7C15u;
	return (uint8_t)('a' + (x >> 40) % 26);
}

struct wire {
	uint8_t *p;
	size_t len, cap;
	size_t starts[256]; /* where each frame begins */
	unsigned nframes;
};

static void wire_put(struct wire *w, uint32_t stream, uint8_t type, uint8_t flags, const uint8_t *payload, size_t len)
{
	if (w->len + FRAME_HDR_LEN + len > w->cap) {
		w->cap = (w->len + FRAME_HDR_LEN + len) * 2;
		w->p = realloc(w->p, w->cap);
		CHECK(w->p != NULL);
	}
	CHECK(w->nframes < 256);
	w->starts[w->nframes++] = w->len;
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(w->p + w->len, &h);
	if (len > 0)
		memcpy(w->p + w->len + FRAME_HDR_LEN, payload, len);
	w->len += FRAME_HDR_LEN + len;
}

/* DATA of len bytes continuing the read at *pos. */
static void wire_data(struct wire *w, uint32_t stream, uint32_t seed, uint64_t *pos, size_t len)
{
	uint8_t *buf = malloc(len + 1);
	CHECK(buf != NULL);
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(seed, *pos + i);
	*pos += len;
	wire_put(w, stream, FRAME_DATA, 0, buf, len);
	free(buf);
}

static void wire_end_read(struct wire *w, uint32_t stream, uint64_t bytes)
{
	wire_put(w, stream, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	Shim__V1__ReadReply rr = SHIM__V1__READ_REPLY__INIT;
	rr.bytes = bytes;
	Shim__V1__Result r = SHIM__V1__RESULT__INIT;
	r.kind_case = SHIM__V1__RESULT__KIND_READ;
	r.read = &rr;
	uint8_t buf[64];
	size_t n = shim__v1__result__get_packed_size(&r);
	CHECK(n <= sizeof(buf));
	shim__v1__result__pack(&r, buf);
	wire_put(w, stream, FRAME_END, 0, buf, n);
}

/* The sizes of the DATA frames of a read: the usual chunks, and around every
 * threshold; a few frames for nobody in between. */
static const uint32_t read_sizes[] = {65536, 65536, 100,   4095,  4096,  4097,  65536,  65536, 65536, 65536,
				      65535, 65536, 65537, 65536, 12,    65536, 200000, 65536, 65536, 1,
				      65536, 65536, 65536, 30000, 65536, 65536, 65536,  65536};
#define STRANGER 999u /* a stream nobody opened */

/* A whole read on stream s: DATA (and frames for others) then FIN and END. */
static void wire_read(struct wire *w, uint32_t s, uint32_t seed, uint64_t *total)
{
	uint64_t pos = 0, other = 0;
	uint8_t win[4] = {0, 0, 1, 0};
	wire_put(w, s, FRAME_WINDOW, 0, win, sizeof(win));
	for (size_t i = 0; i < sizeof(read_sizes) / sizeof(read_sizes[0]); i++) {
		wire_data(w, s, seed, &pos, read_sizes[i]);
		if (i == 3 || i == 9)
			wire_data(w, STRANGER, 7, &other, 65536);
		if (i == 12)
			wire_data(w, STRANGER, 7, &other, 5000);
		if (i == 5) {
			uint8_t ping[8] = {1, 2, 3, 4, 5, 6, 7, 8};
			wire_put(w, 0, FRAME_PING, 0, ping, sizeof(ping));
		}
	}
	wire_end_read(w, s, pos);
	*total = pos;
}

/* ---- the client's side ---- */

struct sink {
	uint8_t *p;
	size_t len, cap;
};

static int sink_put(void *ud, const void *buf, size_t len)
{
	struct sink *s = ud;
	if (s->len + len > s->cap) {
		s->cap = (s->len + len) * 2;
		s->p = realloc(s->p, s->cap);
		if (s->p == NULL)
			return ENOMEM;
	}
	memcpy(s->p + s->len, buf, len);
	s->len += len;
	return 0;
}

struct tracer {
	pthread_mutex_t mu;
	unsigned data_mine, data_stranger, bad;
	uint32_t stream;
	uint32_t seed;
	uint64_t pos; /* of the next DATA on stream */
};

/* Every DATA frame received shows up in the trace, with its first bytes. */
static void trace_line(void *ud, const char *line)
{
	struct tracer *t = ud;
	unsigned stream, len;
	if (sscanf(line, "< DATA stream=%u len=%u", &stream, &len) != 2)
		return;
	pthread_mutex_lock(&t->mu);
	if (stream == STRANGER) {
		t->data_stranger++;
	} else if (stream == t->stream) {
		t->data_mine++;
		if (len > 0) {
			char want[16];
			size_t n = len < 8 ? len : 8;
			for (size_t i = 0; i < n; i++)
				want[i] = (char)pattern(t->seed, t->pos + i);
			want[n] = '\0';
			const char *q = strchr(line, '"');
			if (q == NULL || strncmp(q + 1, want, n) != 0)
				t->bad++;
			t->pos += len;
		}
	}
	pthread_mutex_unlock(&t->mu);
}

/* ---- case split: reads whose frames arrive cut everywhere ---- */

enum { CUT_NONE, CUT_EDGES, CUT_BYTES, CUT_RANDOM, CUT_MODES };

/* Cuts around each frame's edges; with every_byte, at every byte near them. */
static size_t cuts_edges(const struct wire *w, size_t *cuts, size_t max, bool every_byte)
{
	size_t n = 0;
	for (unsigned i = 0; i < w->nframes; i++) {
		size_t f = w->starts[i], end = i + 1 < w->nframes ? w->starts[i + 1] : w->len;
		size_t len = end - f - FRAME_HDR_LEN;
		size_t c[] = {f + 1,    f + 5,    f + 11,   f + 12, f + 13, f + 12 + len / 2,
			      end - 13, end - 12, end - 11, end - 1};
		if (every_byte) {
			for (size_t b = f + 1; b < f + 24 && b < end && n < max; b++)
				cuts[n++] = b;
			for (size_t b = end > 24 ? end - 24 : 0; b < end && n < max; b++)
				if (b > f + 24)
					cuts[n++] = b;
		} else {
			for (size_t j = 0; j < sizeof(c) / sizeof(c[0]) && n < max; j++)
				if (c[j] > f && c[j] < end && (n == 0 || c[j] > cuts[n - 1]))
					cuts[n++] = c[j];
		}
	}
	return n;
}

static void script_split(struct fake *f)
{
	static size_t cuts[20000];
	for (unsigned mode = 0; mode < CUT_MODES; mode++) {
		uint32_t s = fake_wait_request(f, mode + 1);
		struct wire w = {0};
		uint64_t total;
		wire_read(&w, s, mode + 1, &total);
		size_t n = 0;
		if (mode == CUT_EDGES || mode == CUT_BYTES) {
			n = cuts_edges(&w, cuts, sizeof(cuts) / sizeof(cuts[0]), mode == CUT_BYTES);
		} else if (mode == CUT_RANDOM) {
			uint64_t x = 12345;
			for (size_t at = 0; at < w.len && n < 2000; n++) {
				x = x * 6364136223846793005u + 1442695040888963407u;
				at += 1 + (x >> 33) % 150000;
				cuts[n] = at;
			}
		}
		/* the random cuts go unwaited for: the client finds what the kernel has */
		fake_send_cut(f, w.p, w.len, cuts, n, mode != CUT_RANDOM && mode != CUT_NONE);
		free(w.p);
	}
	fake_answer_ping(f);
	while (fake_pump(f, 1000)) {
	}
}

static int case_split(void)
{
	struct fake f;
	const char *target = fake_start(&f, script_split);
	struct tracer t = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.trace = trace_line;
	o.trace_ud = &t;
	struct sbx_client *c;
	struct sbx_error err;
	CHECK_SBX(sbx_connect(target, &o, &c, &err), &err);
	for (unsigned mode = 0; mode < CUT_MODES; mode++) {
		pthread_mutex_lock(&t.mu);
		t.stream = 1 + 2 * mode; /* the ids the client gives its streams */
		t.seed = mode + 1;
		t.pos = 0;
		t.data_mine = t.data_stranger = 0;
		pthread_mutex_unlock(&t.mu);
		struct sink s = {0};
		uint64_t bytes = 0;
		uint64_t t0 = it_now_ms();
		CHECK_SBX(sbx_read_file(c, NULL, "/x", 0, SBX_TO_END, sink_put, &s, &bytes, &err), &err);
		printf("mode %u: %zu bytes in %llu ms\n", mode, s.len, (unsigned long long)(it_now_ms() - t0));
		uint64_t want = 0;
		for (size_t i = 0; i < sizeof(read_sizes) / sizeof(read_sizes[0]); i++)
			want += read_sizes[i];
		CHECK_EQ(s.len, want);
		CHECK_EQ(bytes, want);
		for (size_t i = 0; i < s.len; i++)
			CHECKF(s.p[i] == pattern(mode + 1, i), "mode %u: byte %zu is wrong", mode, i);
		free(s.p);
		pthread_mutex_lock(&t.mu);
		CHECK_EQ(t.data_mine, sizeof(read_sizes) / sizeof(read_sizes[0]) + 1);
		CHECK_EQ(t.data_stranger, 3);
		CHECK_EQ(t.bad, 0);
		pthread_mutex_unlock(&t.mu);
		CHECK_EQ(sbx_client_pending(c), 0);
	}
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	fake_join(&f);
	return 0;
}

/* ---- case abandon: a call given up on with half a DATA frame in ---- */

#define HALF 30000u

/* Stream s gets one whole DATA frame and the first HALF bytes of the next. */
static void send_half(struct fake *f, uint32_t s, struct wire *w)
{
	uint64_t pos = 0;
	wire_data(w, s, 3, &pos, 65536);
	wire_data(w, s, 3, &pos, 65536);
	size_t half = w->starts[1] + FRAME_HDR_LEN + HALF;
	fake_send_cut(f, w->p, half, NULL, 0, true);
}

static void script_abandon(struct fake *f)
{
	for (unsigned round = 0; round < 2; round++) {
		uint32_t s = fake_wait_request(f, 2 * round + 1);
		struct wire w = {0};
		send_half(f, s, &w);
		fake_wait_cancel(f, s);
		/* the rest of that frame and more for the forgotten stream, then a read that
		 * must come through whole */
		uint64_t pos = 65536 + 65536;
		for (int i = 0; i < 5; i++)
			wire_data(&w, s, 3, &pos, 65536);
		wire_data(&w, s, 3, &pos, 100);
		wire_end_read(&w, s, pos);
		size_t half = w.starts[1] + FRAME_HDR_LEN + HALF;
		write_all(f->fd, w.p + half, w.len - half);
		free(w.p);
		fake_answer_ping(f);
		uint32_t s2 = fake_wait_request(f, 2 * round + 2);
		struct wire w2 = {0};
		uint64_t total;
		wire_read(&w2, s2, 11 + round, &total);
		/* round 0: cut at the edges of every frame; round 1: all at once */
		static size_t cuts2[4000];
		size_t n2 = round == 0 ? cuts_edges(&w2, cuts2, 4000, false) : 0;
		fake_send_cut(f, w2.p, w2.len, cuts2, n2, round == 0);
		free(w2.p);
	}
	while (fake_pump(f, 1000)) {
	}
}

static int case_abandon(void)
{
	struct fake f;
	const char *target = fake_start(&f, script_abandon);
	struct sbx_client *c = it_connect(target, NULL);
	struct sbx_error err;
	for (unsigned round = 0; round < 2; round++) {
		struct sink s = {0};
		struct sbx_call_opts opts = {.timeout_ms = 300};
		memset(&err, 0, sizeof(err));
		CHECK(sbx_read_file(c, &opts, "/x", 0, SBX_TO_END, sink_put, &s, NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
		CHECK_EQ(s.len, 65536);
		free(s.p);
		/* the rest of the frame cut short, and what follows it for the forgotten call,
		 * are passed over: the connection goes on */
		CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
		struct sink s2 = {0};
		CHECK_SBX(sbx_read_file(c, NULL, "/y", 0, SBX_TO_END, sink_put, &s2, NULL, &err), &err);
		uint64_t want = 0;
		for (size_t i = 0; i < sizeof(read_sizes) / sizeof(read_sizes[0]); i++)
			want += read_sizes[i];
		CHECK_EQ(s2.len, want);
		for (size_t i = 0; i < s2.len; i++)
			CHECKF(s2.p[i] == pattern(11 + round, i), "round %u: byte %zu is wrong", round, i);
		free(s2.p);
		CHECK_EQ(sbx_client_pending(c), 0);
	}
	sbx_client_close(c);
	fake_join(&f);
	return 0;
}

/* ---- cases eof and bad: the connection ends, or a bad frame comes, after half a payload ---- */

static void script_eof(struct fake *f)
{
	uint32_t s = fake_wait_request(f, 1);
	struct wire w = {0};
	send_half(f, s, &w);
	free(w.p);
	/* and hang up */
}

static int case_eof(void)
{
	struct fake f;
	const char *target = fake_start(&f, script_eof);
	struct sbx_client *c = it_connect(target, NULL);
	struct sbx_error err;
	struct sink s = {0};
	memset(&err, 0, sizeof(err));
	CHECK(sbx_read_file(c, NULL, "/x", 0, SBX_TO_END, sink_put, &s, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNRESET);
	free(s.p);
	fake_join(&f);
	CHECK(sbx_ping(c, NULL, NULL, &err) < 0);
	sbx_client_close(c);
	return 0;
}

static unsigned bad_kind;

static void script_bad(struct fake *f)
{
	uint32_t s = fake_wait_request(f, 1);
	struct wire w = {0};
	send_half(f, s, &w);
	/* the rest of the frame, then a bad header (and bytes that must not be taken for a
	 * payload) */
	uint8_t junk[FRAME_HDR_LEN + 100] = {0};
	struct frame_hdr h = {.len = 100, .stream = s, .type = FRAME_DATA};
	if (bad_kind == 0)
		h.reserved = 1;
	else
		h.len = FRAME_DEFAULT_MAX + 1;
	frame_put_hdr(junk, &h);
	size_t half = w.starts[1] + FRAME_HDR_LEN + HALF;
	write_all(f->fd, w.p + half, w.len - half);
	write_all(f->fd, junk, sizeof(junk));
	free(w.p);
	while (fake_pump(f, 1000)) {
	}
}

static int case_bad(void)
{
	for (bad_kind = 0; bad_kind < 2; bad_kind++) {
		struct fake f;
		const char *target = fake_start(&f, script_bad);
		struct sbx_client *c = it_connect(target, NULL);
		struct sbx_error err;
		struct sink s = {0};
		memset(&err, 0, sizeof(err));
		CHECK(sbx_read_file(c, NULL, "/x", 0, SBX_TO_END, sink_put, &s, NULL, &err) < 0);
		printf("bad frame %u: %s\n", bad_kind, it_errstr(&err));
		CHECK_ERR(&err, SBX_ERR_PROTOCOL, bad_kind == 0 ? EPROTO : EMSGSIZE);
		CHECK_CONTAINS(err.message, "bad frame from the shim");
		free(s.p);
		sbx_client_close(c);
		fake_join(&f);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"split", case_split},
		{"abandon", case_abandon},
		{"eof", case_eof},
		{"bad", case_bad},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
