/* test_dispatch.c: unit tests for the daemon core in-process: a server on a private libev loop, clients on socketpairs. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "describe.h"
#include "errnames.h"
#include "frame.h"
#include "log.h"
#include "ops.h"
#include "server.h"
#include "shim.pb-c.h"
#include "worker.h"

/* How long to wait for an answer that should come at once (the worker included). */
#define WAIT_MS 2000

static struct server S;
static struct ev_loop *L;
static bool started;

/* The last frame recv_frame() read. */
static struct frame_hdr rh;
static uint8_t rp[FRAME_DEFAULT_MAX];

/* ---- fixture ---- */

static void setup(void)
{
	memset(&S, 0, sizeof(S));
	server_config_defaults(&S.cfg);
	S.cfg.workers = 1;
	S.cfg.max_workers = 4;
	S.cfg.keepalive = 0;
	log_max_level = LOG_ERROR;
	started = false;
}

static void teardown(void)
{
	if (!started)
		return;
	server_free(&S);
	ev_loop_destroy(L);
	started = false;
}

/* Start the server with S.cfg as the test left it. */
static void start(void)
{
	L = ev_loop_new(EVFLAG_AUTO);
	ck_assert_ptr_nonnull(L);
	ck_assert_int_eq(server_init(&S, L), 0);
	ck_assert_ptr_eq(srv, &S);
	started = true;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Let the daemon run: read, handle, flush, reap. Each round runs the prepare watcher
 * (flush, free dead connections) and then the callbacks that are ready. */
static void pump(void)
{
	for (int i = 0; i < 3; i++)
		ev_run(L, EVRUN_NOWAIT);
}

static void pause_ms(int ms)
{
	poll(NULL, 0, ms);
}

/* Pump until the number of live connections drops to n. */
static void wait_conns(unsigned n)
{
	uint64_t deadline = now_ms() + WAIT_MS;
	while (S.n_conns != n && now_ms() < deadline) {
		pump();
		pause_ms(1);
	}
	ck_assert_uint_eq(S.n_conns, n);
}

/* A new connection on a socketpair: the daemon owns one end, the test gets the other
 * (non-blocking). */
static int client(bool need_token, struct conn **cp)
{
	int sv[2];
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	struct conn *c = conn_new(&S, sv[0], sv[0], NULL, need_token, "unit");
	ck_assert_ptr_nonnull(c);
	if (cp != NULL)
		*cp = c;
	return sv[1];
}

/* ---- writing ---- */

/* Write all of buf, pumping the daemon while the socket is full. -1 if the daemon has
 * closed its end. */
static int send_raw(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint64_t deadline = now_ms() + WAIT_MS;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w > 0) {
			p += w;
			len -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
			return -1;
		ck_assert_msg(w < 0 && errno == EAGAIN, "write: %s", strerror(errno));
		ck_assert_msg(now_ms() < deadline, "daemon does not read");
		pump();
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		poll(&pf, 1, 1);
	}
	return 0;
}

/* Lay one frame out in out (room for FRAME_HDR_LEN + len); returns its size. */
static size_t put_frame(uint8_t *out, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, uint32_t len)
{
	struct frame_hdr h = {.len = len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(out, &h);
	if (len > 0)
		memcpy(out + FRAME_HDR_LEN, payload, len);
	return FRAME_HDR_LEN + len;
}

static void send_frame(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, uint32_t len)
{
	uint8_t *buf = malloc(FRAME_HDR_LEN + len);
	ck_assert_ptr_nonnull(buf);
	size_t n = put_frame(buf, stream, type, flags, payload, len);
	int rc = send_raw(fd, buf, n);
	free(buf);
	ck_assert_msg(rc == 0, "the daemon closed the connection while a %s was sent", frame_type_name(type));
}

/* A packed Hello; max_frame and window 0 leave those fields out. */
static size_t pack_hello(uint8_t *buf, uint32_t version, const char *token, size_t token_len, uint32_t max_frame,
			 uint32_t window)
{
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = version;
	m.client_name = "unit-test";
	if (token != NULL) {
		m.has_token = 1;
		m.token.data = (uint8_t *)token;
		m.token.len = token_len;
	}
	if (max_frame != 0) {
		m.has_max_frame = 1;
		m.max_frame = max_frame;
	}
	if (window != 0) {
		m.has_initial_window = 1;
		m.initial_window = window;
	}
	return shim__v1__hello__pack(&m, buf);
}

static void hello_ex(int fd, uint32_t version, const char *token, size_t token_len, uint32_t max_frame, uint32_t window)
{
	uint8_t buf[512];
	size_t n = pack_hello(buf, version, token, token_len, max_frame, window);
	send_frame(fd, 0, FRAME_HELLO, 0, buf, (uint32_t)n);
}

static void hello(int fd, uint32_t version, const char *token)
{
	hello_ex(fd, version, token, token ? strlen(token) : 0, 0, 0);
}

static size_t pack_request(uint8_t *buf, Shim__V1__Request__KindCase kind)
{
	Shim__V1__Request r = SHIM__V1__REQUEST__INIT;
	Shim__V1__InfoRequest info = SHIM__V1__INFO_REQUEST__INIT;
	Shim__V1__EchoRequest echo = SHIM__V1__ECHO_REQUEST__INIT;
	r.kind_case = kind;
	if (kind == SHIM__V1__REQUEST__KIND_INFO)
		r.info = &info;
	else if (kind == SHIM__V1__REQUEST__KIND_ECHO)
		r.echo = &echo;
	return shim__v1__request__pack(&r, buf);
}

static void request(int fd, uint32_t stream, Shim__V1__Request__KindCase kind)
{
	uint8_t buf[64];
	size_t n = pack_request(buf, kind);
	send_frame(fd, stream, FRAME_REQUEST, 0, buf, (uint32_t)n);
}

static void window(int fd, uint32_t stream, uint32_t inc)
{
	uint8_t p[4];
	frame_put_u32(p, inc);
	send_frame(fd, stream, FRAME_WINDOW, 0, p, 4);
}

/* ---- reading ---- */

/* Read exactly n bytes, pumping the daemon meanwhile. n: done; 0: EOF before the
 * first byte; the test fails on EOF in the middle, or when nothing comes in time. */
static size_t read_full(int fd, void *buf, size_t n, int timeout_ms)
{
	uint8_t *p = buf;
	size_t got = 0;
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	while (got < n) {
		ssize_t r = read(fd, p + got, n - got);
		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		if (r == 0) {
			ck_assert_msg(got == 0, "EOF after %zu of %zu bytes", got, n);
			return 0;
		}
		if (errno == EINTR)
			continue;
		if (errno == ECONNRESET)
			return 0;
		ck_assert_msg(errno == EAGAIN, "read: %s", strerror(errno));
		ck_assert_msg(now_ms() < deadline, "no answer within %d ms (%zu of %zu bytes)", timeout_ms, got, n);
		pump();
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		poll(&pf, 1, 1);
	}
	return got;
}

/* Read one frame into h and buf (room for cap bytes). 1: a frame; 0: EOF. */
static int recv_frame(int fd, struct frame_hdr *h, uint8_t *buf, size_t cap, int timeout_ms)
{
	uint8_t hdr[FRAME_HDR_LEN];
	if (read_full(fd, hdr, FRAME_HDR_LEN, timeout_ms) == 0)
		return 0;
	frame_get_hdr(hdr, h);
	ck_assert_uint_eq(h->reserved, 0);
	ck_assert_msg(h->len <= cap, "frame of %u bytes from the daemon", h->len);
	if (h->len > 0)
		ck_assert_uint_eq(read_full(fd, buf, h->len, timeout_ms), h->len);
	return 1;
}

static const char *desc(const struct frame_hdr *h, const uint8_t *p)
{
	static char buf[600];
	frame_describe(h, p, buf, sizeof(buf));
	return buf;
}

/* The next frame into rh/rp; failing at EOF. */
static void next_frame(int fd)
{
	ck_assert_msg(recv_frame(fd, &rh, rp, sizeof(rp), WAIT_MS) == 1, "EOF where a frame was expected");
}

static void expect_frame(int fd, uint32_t stream, uint8_t type)
{
	next_frame(fd);
	ck_assert_msg(rh.stream == stream && rh.type == type, "wanted %s on stream %u, got %s", frame_type_name(type),
		      stream, desc(&rh, rp));
}

/* The next frame is ERROR on stream with errnum; its message contains substr (if given). */
static void expect_error(int fd, uint32_t stream, int errnum, const char *substr)
{
	expect_frame(fd, stream, FRAME_ERROR);
	ck_assert_uint_eq(rh.flags, 0);
	Shim__V1__Error *e = shim__v1__error__unpack(NULL, rh.len, rp);
	ck_assert_msg(e != NULL, "undecodable Error");
	ck_assert_msg(e->errno_num == errnum, "wanted errno %d (%s), got %d (%s): %s", errnum, errname_name(errnum),
		      e->errno_num, e->errno_name ? e->errno_name : "-", e->message ? e->message : "");
	ck_assert_ptr_nonnull(e->errno_name);
	ck_assert_str_eq(e->errno_name, errname_name(errnum));
	ck_assert_ptr_nonnull(e->message);
	if (substr != NULL)
		ck_assert_msg(strstr(e->message, substr) != NULL, "message \"%s\" lacks \"%s\"", e->message, substr);
	shim__v1__error__free_unpacked(e, NULL);
}

/* The daemon has closed the connection: EOF with no further frame. Closes fd. */
static void expect_closed(int fd)
{
	struct frame_hdr h;
	int got = recv_frame(fd, &h, rp, sizeof(rp), WAIT_MS);
	ck_assert_msg(got == 0, "wanted EOF, got %s", desc(&h, rp));
	close(fd);
}

static void expect_data(int fd, uint32_t stream, uint8_t flags, const void *payload, uint32_t len)
{
	expect_frame(fd, stream, FRAME_DATA);
	ck_assert_uint_eq(rh.flags, flags);
	ck_assert_uint_eq(rh.len, len);
	if (len > 0)
		ck_assert_mem_eq(rp, payload, len);
}

static void expect_window(int fd, uint32_t stream, uint32_t inc)
{
	expect_frame(fd, stream, FRAME_WINDOW);
	ck_assert_uint_eq(rh.len, 4);
	ck_assert_uint_eq(frame_get_u32(rp), inc);
}

/* END carrying an EchoReply of the given byte count. */
static void expect_echo_end(int fd, uint32_t stream, uint64_t bytes)
{
	expect_frame(fd, stream, FRAME_END);
	Shim__V1__Result *r = shim__v1__result__unpack(NULL, rh.len, rp);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->kind_case, SHIM__V1__RESULT__KIND_ECHO);
	ck_assert_ptr_nonnull(r->echo);
	ck_assert_uint_eq(r->echo->bytes, bytes);
	shim__v1__result__free_unpacked(r, NULL);
}

/* HELLO (version 1) and HELLO_OK; returns the decoded reply (free it). */
static Shim__V1__HelloReply *handshake_ex(int fd, const char *token, uint32_t max_frame, uint32_t win)
{
	hello_ex(fd, 1, token, token ? strlen(token) : 0, max_frame, win);
	expect_frame(fd, 0, FRAME_HELLO_OK);
	ck_assert_uint_eq(rh.flags, 0);
	Shim__V1__HelloReply *r = shim__v1__hello_reply__unpack(NULL, rh.len, rp);
	ck_assert_msg(r != NULL, "undecodable HelloReply");
	return r;
}

static void handshake(int fd)
{
	shim__v1__hello_reply__free_unpacked(handshake_ex(fd, NULL, 0, 0), NULL);
}

static void ping_pong(int fd, const void *payload, uint32_t len)
{
	send_frame(fd, 0, FRAME_PING, 0, payload, len);
	expect_frame(fd, 0, FRAME_PONG);
	ck_assert_uint_eq(rh.len, len);
	if (len > 0)
		ck_assert_mem_eq(rp, payload, len);
}

/* The daemon still serves: a new connection completes HELLO and PING. */
static void assert_serving(void)
{
	unsigned before = S.n_conns;
	int fd = client(false, NULL);
	handshake(fd);
	ping_pong(fd, "still serving", 13);
	close(fd);
	wait_conns(before);
}

/* Open a connection (after HELLO if asked), send bytes, expect ERROR errnum on stream 0
 * and the close, then check that the daemon serves a second connection. */
static void conn_error_case(bool do_hello, const void *bytes, size_t len, int errnum, const char *substr)
{
	int fd = client(false, NULL);
	if (do_hello)
		handshake(fd);
	ck_assert_int_eq(send_raw(fd, bytes, len), 0);
	expect_error(fd, 0, errnum, substr);
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}

/* ---- handshake ---- */

static bool has_feature(char **features, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(features[i], name) == 0)
			return true;
	return false;
}

START_TEST(test_hello_ok_contents)
{
	S.cfg.max_streams = 17;
	S.cfg.initial_window = 100000;
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, 65536, 0);
	ck_assert_uint_eq(r->protocol_version, 1);
	ck_assert_str_eq(r->shim_version, SHIM_VERSION);
	ck_assert_uint_eq(r->max_frame, 65536);
	ck_assert_uint_eq(r->pid, (uint32_t)getpid());
	ck_assert_int_eq(r->pid1, getpid() == 1);
	ck_assert_uint_eq(r->uid, (uint32_t)getuid());
	ck_assert_uint_eq(r->initial_window, 100000);
	ck_assert(r->has_max_streams);
	ck_assert_uint_eq(r->max_streams, 17);
	ck_assert(has_feature(r->features, r->n_features, "echo"));
	ck_assert(has_feature(r->features, r->n_features, "info"));
	ck_assert_ptr_nonnull(r->hostname);
	ck_assert_str_eq(r->hostname, S.hostname);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	ck_assert_int_eq(S.conns->state, CONN_READY);
	ck_assert_uint_eq(S.conns->max_frame, 65536);
	ping_pong(fd, "", 0);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_hello_max_frame_negotiation)
{
	/* effective = min(client's, shim's), never below 16 KiB */
	static const struct {
		uint32_t shim, client, want;
	} cases[] = {
		{FRAME_DEFAULT_MAX, 0, FRAME_DEFAULT_MAX},
		{FRAME_DEFAULT_MAX, 65536, 65536},
		{FRAME_DEFAULT_MAX, 2u << 20, FRAME_DEFAULT_MAX},
		{FRAME_DEFAULT_MAX, FRAME_DEFAULT_MAX, FRAME_DEFAULT_MAX},
		{FRAME_DEFAULT_MAX, 100, FRAME_MIN_MAX},
		{FRAME_DEFAULT_MAX, 1, FRAME_MIN_MAX},
		{FRAME_DEFAULT_MAX, FRAME_MIN_MAX + 1, FRAME_MIN_MAX + 1},
		{32768, FRAME_DEFAULT_MAX, 32768},
		{32768, 0, 32768},
		{FRAME_ABS_MAX, UINT32_MAX, FRAME_ABS_MAX},
	};
	S.cfg.max_frame = cases[_i].shim;
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, cases[_i].client, 0);
	ck_assert_uint_eq(r->max_frame, cases[_i].want);
	ck_assert_uint_eq(S.conns->max_frame, cases[_i].want);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_hello_wrong_version)
{
	static const uint32_t versions[] = {0, 2, 3, UINT32_MAX};
	start();
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		int fd = client(false, NULL);
		hello(fd, versions[i], NULL);
		char want[128];
		snprintf(want, sizeof(want), "protocol version %u not supported (this shim speaks 1)", versions[i]);
		expect_error(fd, 0, EPROTONOSUPPORT, want);
		ck_assert_int_eq(EPROTONOSUPPORT, 93);
		expect_closed(fd);
		wait_conns(0);
		assert_serving();
	}
}
END_TEST

START_TEST(test_hello_undecodable)
{
	start();
	/* junk, a truncated field, and a Hello without its required version */
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
	static const uint8_t cut[] = {0x12, 0x10, 'a', 'b'};
	uint8_t buf[64];
	size_t n = put_frame(buf, 0, FRAME_HELLO, 0, junk, sizeof(junk));
	conn_error_case(false, buf, n, EBADMSG, "cannot decode Hello");
	n = put_frame(buf, 0, FRAME_HELLO, 0, cut, sizeof(cut));
	conn_error_case(false, buf, n, EBADMSG, "cannot decode Hello");
	n = put_frame(buf, 0, FRAME_HELLO, 0, NULL, 0);
	conn_error_case(false, buf, n, EBADMSG, "cannot decode Hello");
	ck_assert_int_eq(EBADMSG, 74);
}
END_TEST

START_TEST(test_hello_on_stream_not_zero)
{
	start();
	uint8_t p[64], buf[128];
	size_t n = pack_hello(p, 1, NULL, 0, 0, 0);
	n = put_frame(buf, 1, FRAME_HELLO, 0, p, (uint32_t)n);
	conn_error_case(false, buf, n, EPROTO, "HELLO on stream 1");
}
END_TEST

START_TEST(test_frames_before_hello)
{
	start();
	uint8_t buf[128], req[64];
	size_t n = put_frame(buf, 0, FRAME_PING, 0, "hi", 2);
	conn_error_case(false, buf, n, EPROTO, "expected HELLO, got PING");
	n = put_frame(buf, 1, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO));
	conn_error_case(false, buf, n, EPROTO, "expected HELLO, got REQUEST");
	n = put_frame(buf, 1, FRAME_DATA, 0, "x", 1);
	conn_error_case(false, buf, n, EPROTO, "expected HELLO, got DATA");
	n = put_frame(buf, 0, FRAME_HELLO_OK, 0, NULL, 0);
	conn_error_case(false, buf, n, EPROTO, "expected HELLO, got HELLO_OK");
	/* the header checks come first (PROTOCOL.md 2): an unknown type is that */
	n = put_frame(buf, 0, 12, 0, NULL, 0);
	conn_error_case(false, buf, n, EPROTO, "unknown frame type 12");
	ck_assert_int_eq(EPROTO, 71);
}
END_TEST

/* Let the daemon run for ms milliseconds. */
static void run_for(int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;
	while (now_ms() < end) {
		pump();
		pause_ms(1);
	}
}

/* Nothing has come from the daemon (fd is non-blocking). */
static void expect_silence(int fd)
{
	uint8_t b;
	ssize_t r = read(fd, &b, 1);
	ck_assert_msg(r < 0 && errno == EAGAIN, "the daemon sent something (read %zd)", r);
}

/* The handshake has its own deadline, with the keepalive off too: a client that never
 * sends its HELLO, or only part of it, is refused with ETIMEDOUT and closed. */
START_TEST(test_handshake_timeout)
{
	S.cfg.handshake_timeout = 0.2;
	S.cfg.keepalive = 0;
	start();
	uint64_t t0 = now_ms();
	int fd = client(false, NULL);
	expect_error(fd, 0, ETIMEDOUT, "no HELLO within 0.2 s");
	ck_assert_uint_ge(now_ms() - t0, 190);
	expect_closed(fd);
	wait_conns(0);

	/* a byte at a time does not move the deadline */
	uint8_t hb[64], fb[80];
	size_t n = put_frame(fb, 0, FRAME_HELLO, 0, hb, (uint32_t)pack_hello(hb, 1, NULL, 0, 0, 0));
	t0 = now_ms();
	fd = client(false, NULL);
	for (size_t i = 0; i + 1 < n && now_ms() - t0 < 150; i++) {
		ck_assert_int_eq(send_raw(fd, fb + i, 1), 0);
		run_for(20);
	}
	expect_error(fd, 0, ETIMEDOUT, "no HELLO within 0.2 s");
	expect_closed(fd);
	wait_conns(0);

	/* a HELLO in time ends the deadline */
	fd = client(false, NULL);
	handshake(fd);
	run_for(400);
	ping_pong(fd, "still here", 10);
	ck_assert_uint_eq(S.n_conns, 1);
	close(fd);
	wait_conns(0);
}
END_TEST

/* No PING before HELLO_OK (PROTOCOL.md 11): the keepalive starts with the handshake's end. */
START_TEST(test_no_ping_before_hello_ok)
{
	S.cfg.keepalive = 0.1;
	S.cfg.handshake_timeout = 5;
	start();
	int fd = client(false, NULL);
	run_for(350);
	expect_silence(fd);
	handshake(fd); /* HELLO_OK is the first frame */
	expect_frame(fd, 0, FRAME_PING);
	ck_assert_uint_eq(rh.len, 9);
	ck_assert_mem_eq(rp, "keepalive", 9);
	close(fd);
	wait_conns(0);
}
END_TEST

/* Input first, verdict second: the daemon stopped (no loop iterations, as under
 * SIGSTOP) across its keepalive period, after it sent a PING that the client answered
 * at once. When it runs again, the expired timer and the PONG in the socket come due
 * together: the PONG counts and the client stays. */
START_TEST(test_keepalive_after_pause)
{
	S.cfg.keepalive = 0.2;
	start();
	int fd = client(false, NULL);
	handshake(fd);
	expect_frame(fd, 0, FRAME_PING);
	uint8_t payload[FRAME_PING_MAX];
	uint32_t len = rh.len;
	memcpy(payload, rp, len);
	/* "stopped": no pump() from here */
	ck_assert_int_eq(write(fd, (uint8_t[]){0, 0, 0, (uint8_t)len, 0, 0, 0, 0, FRAME_PONG, 0, 0, 0}, 12), 12);
	ck_assert_int_eq(write(fd, payload, len), (ssize_t)len);
	pause_ms(600); /* three keepalive periods */
	pump();
	ck_assert_uint_eq(S.n_conns, 1);
	ping_pong(fd, "served", 6);
	/* and a client that does not answer is still closed: PING, then silence */
	expect_frame(fd, 0, FRAME_PING);
	uint8_t b[FRAME_HDR_LEN];
	uint64_t deadline = now_ms() + WAIT_MS;
	while (S.n_conns == 1 && now_ms() < deadline) {
		pump();
		pause_ms(1);
		while (read(fd, b, sizeof(b)) > 0) /* PINGs unanswered */
			;
	}
	ck_assert_uint_eq(S.n_conns, 0);
	close(fd);
}
END_TEST

START_TEST(test_hello_twice)
{
	start();
	uint8_t p[64], buf[128];
	size_t n = pack_hello(p, 1, NULL, 0, 0, 0);
	n = put_frame(buf, 0, FRAME_HELLO, 0, p, (uint32_t)n);
	conn_error_case(true, buf, n, EPROTO, "HELLO sent twice");
}
END_TEST

static void start_with_token(const char *token)
{
	S.cfg.token = strdup(token);
	ck_assert_ptr_nonnull(S.cfg.token);
	S.cfg.token_len = strlen(token);
	start();
}

START_TEST(test_token_missing)
{
	start_with_token("t0ken-Secret");
	int fd = client(true, NULL);
	hello(fd, 1, NULL);
	expect_error(fd, 0, EACCES, "token required");
	ck_assert_int_eq(EACCES, 13);
	expect_closed(fd);
	wait_conns(0);
	/* an empty token is no token */
	fd = client(true, NULL);
	hello_ex(fd, 1, "", 0, 0, 0);
	expect_error(fd, 0, EACCES, "token required");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_token_wrong)
{
	/* wrong bytes, a prefix, a longer one, a NUL in the middle, a different case */
	static const struct {
		const char *tok;
		size_t len;
	} bad[] = {
		{"t0ken-Secreu", 12},  {"t0ken-Secre", 11},  {"t0ken-Secret-", 13},
		{"t0ken\0Secret", 12}, {"T0KEN-SECRET", 12}, {"x", 1},
	};
	start_with_token("t0ken-Secret");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int fd = client(true, NULL);
		hello_ex(fd, 1, bad[i].tok, bad[i].len, 0, 0);
		expect_error(fd, 0, EACCES, "bad token");
		expect_closed(fd);
		wait_conns(0);
	}
	/* the daemon keeps serving, and the right token still works */
	int fd = client(true, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, "t0ken-Secret", 0, 0);
	ck_assert_uint_eq(r->protocol_version, 1);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	ping_pong(fd, "ok", 2);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_token_right)
{
	start_with_token("t0ken-Secret");
	int fd = client(true, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, "t0ken-Secret", 0, 0);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	ping_pong(fd, "in", 2);
	close(fd);
	/* a connection that needs no token (stdio) gets in without one */
	fd = client(false, NULL);
	handshake(fd);
	ping_pong(fd, "stdio", 5);
	close(fd);
	wait_conns(0);
}
END_TEST

/* ---- framing ---- */

START_TEST(test_hello_too_big)
{
	/* before HELLO the limit is 64 KiB; the header alone is refused, nothing is buffered */
	start();
	struct conn *c;
	int fd = client(false, &c);
	size_t cap0 = c->incap;
	uint8_t buf[FRAME_HDR_LEN + 100];
	memset(buf, 'h', sizeof(buf));
	struct frame_hdr h = {.len = FRAME_HELLO_MAX + 1, .stream = 0, .type = FRAME_HELLO};
	frame_put_hdr(buf, &h);
	ck_assert_int_eq(send_raw(fd, buf, sizeof(buf)), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(c->state, CONN_CLOSING);
	ck_assert_uint_eq(c->incap, cap0);
	expect_error(fd, 0, EMSGSIZE, "frame of 65537 bytes exceeds the limit of 65536");
	ck_assert_int_eq(EMSGSIZE, 90);
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_frame_too_big)
{
	static const uint32_t lens[] = {FRAME_MIN_MAX + 1, FRAME_DEFAULT_MAX + 1, UINT32_MAX};
	start();
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		struct conn *c;
		int fd = client(false, &c);
		size_t cap0 = c->incap;
		Shim__V1__HelloReply *r = handshake_ex(fd, NULL, FRAME_MIN_MAX, 0);
		ck_assert_uint_eq(r->max_frame, FRAME_MIN_MAX);
		shim__v1__hello_reply__free_unpacked(r, NULL);
		request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
		/* the header and a little of the announced payload */
		uint8_t buf[FRAME_HDR_LEN + 1000];
		memset(buf, 'd', sizeof(buf));
		struct frame_hdr h = {.len = lens[i], .stream = 1, .type = FRAME_DATA};
		frame_put_hdr(buf, &h);
		ck_assert_int_eq(send_raw(fd, buf, sizeof(buf)), 0);
		/* one round: the request and the header are read and judged */
		ev_run(L, EVRUN_NOWAIT);
		ck_assert_int_eq(c->state, CONN_CLOSING);
		ck_assert_uint_eq(c->incap, cap0);
		ck_assert_uint_eq(c->nstreams, 0);
		char want[128];
		snprintf(want, sizeof(want), "frame of %u bytes exceeds the limit of %u", lens[i], FRAME_MIN_MAX);
		/* the connection error is the only answer: the echo stream dies silently */
		expect_error(fd, 0, EMSGSIZE, want);
		expect_closed(fd);
		wait_conns(0);
		assert_serving();
	}
}
END_TEST

START_TEST(test_frame_at_limit)
{
	/* a DATA frame of exactly max_frame bytes is fine */
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, FRAME_MIN_MAX, 0);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	uint8_t *data = malloc(FRAME_MIN_MAX);
	ck_assert_ptr_nonnull(data);
	memset(data, 'L', FRAME_MIN_MAX);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, data, FRAME_MIN_MAX);
	expect_data(fd, 1, 0, data, FRAME_MIN_MAX);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, FRAME_MIN_MAX);
	free(data);
	close(fd);
	wait_conns(0);
}
END_TEST

/* Send the first cut bytes of frame, then EOF (half close or full close): the
 * connection goes away, at most an ERROR EPROTO on stream 0 is sent first. */
static void cut_and_eof(const uint8_t *frame, size_t total, bool after_hello, bool full_close)
{
	for (size_t cut = 0; cut < total; cut++) {
		int fd = client(false, NULL);
		if (after_hello)
			handshake(fd);
		ck_assert_int_eq(send_raw(fd, frame, cut), 0);
		if (full_close) {
			close(fd);
			wait_conns(0);
			continue;
		}
		ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
		struct frame_hdr h;
		int frames = 0;
		while (recv_frame(fd, &h, rp, sizeof(rp), WAIT_MS) == 1) {
			ck_assert_msg(cut > 0, "cut 0: got %s", desc(&h, rp));
			ck_assert_msg(h.type == FRAME_ERROR && h.stream == 0, "cut %zu: got %s", cut, desc(&h, rp));
			Shim__V1__Error *e = shim__v1__error__unpack(NULL, h.len, rp);
			ck_assert_ptr_nonnull(e);
			ck_assert_int_eq(e->errno_num, EPROTO);
			shim__v1__error__free_unpacked(e, NULL);
			frames++;
		}
		ck_assert_int_le(frames, 1);
		close(fd);
		wait_conns(0);
	}
}

START_TEST(test_truncated_hello)
{
	start();
	uint8_t p[128], frame[256];
	size_t n = pack_hello(p, 1, NULL, 0, 65536, 65536);
	size_t total = put_frame(frame, 0, FRAME_HELLO, 0, p, (uint32_t)n);
	ck_assert_uint_gt(total, FRAME_HDR_LEN + 10);
	cut_and_eof(frame, total, false, false);
	cut_and_eof(frame, total, false, true);
	assert_serving();
}
END_TEST

START_TEST(test_eof_flushes_queued_replies)
{
	/* whole frames and then EOF (a pipe into --stdio, a client that shuts its write
	 * side): the answers already made are sent before the close */
	start();
	uint8_t p[128], req[64], buf[512];
	size_t n = put_frame(buf, 0, FRAME_HELLO, 0, p, (uint32_t)pack_hello(p, 1, NULL, 0, 0, 0));
	n += put_frame(buf + n, 0, FRAME_PING, 0, "eof", 3);
	n += put_frame(buf + n, 1, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO));
	n += put_frame(buf + n, 1, FRAME_DATA, FRAME_FLAG_FIN, "last", 4);
	int fd = client(false, NULL);
	ck_assert_int_eq(send_raw(fd, buf, n), 0);
	ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
	expect_frame(fd, 0, FRAME_HELLO_OK);
	expect_frame(fd, 0, FRAME_PONG);
	ck_assert_mem_eq(rp, "eof", 3);
	expect_data(fd, 1, 0, "last", 4);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 4);
	expect_closed(fd);
	wait_conns(0);

	/* a stream still open at EOF is cancelled; what it had sent still arrives */
	n = put_frame(buf, 0, FRAME_HELLO, 0, p, (uint32_t)pack_hello(p, 1, NULL, 0, 0, 0));
	n += put_frame(buf + n, 1, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO));
	n += put_frame(buf + n, 1, FRAME_DATA, 0, "open", 4);
	fd = client(false, NULL);
	ck_assert_int_eq(send_raw(fd, buf, n), 0);
	ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
	expect_frame(fd, 0, FRAME_HELLO_OK);
	expect_data(fd, 1, 0, "open", 4);
	expect_window(fd, 1, 4);
	struct frame_hdr h;
	if (recv_frame(fd, &h, rp, sizeof(rp), WAIT_MS) == 1) {
		/* the stream may be ended with ECANCELED (or silently: nobody to tell) */
		ck_assert_msg(h.type == FRAME_ERROR && h.stream == 1, "got %s", desc(&h, rp));
		Shim__V1__Error *e = shim__v1__error__unpack(NULL, h.len, rp);
		ck_assert_ptr_nonnull(e);
		ck_assert_int_eq(e->errno_num, ECANCELED);
		shim__v1__error__free_unpacked(e, NULL);
		expect_closed(fd);
	} else {
		close(fd);
	}
	wait_conns(0);
	ck_assert_uint_eq(S.n_streams, 0);
	assert_serving();
}
END_TEST

START_TEST(test_truncated_after_hello)
{
	start();
	uint8_t frame[64];
	size_t total = put_frame(frame, 0, FRAME_PING, 0, "0123456789", 10);
	cut_and_eof(frame, total, true, false);
	cut_and_eof(frame, total, true, true);
	assert_serving();
}
END_TEST

START_TEST(test_malformed_header)
{
	start();
	uint8_t buf[FRAME_HDR_LEN + 4];
	for (int after_hello = 0; after_hello < 2; after_hello++) {
		/* type 0 */
		size_t n = put_frame(buf, 0, 0, 0, "abcd", 4);
		conn_error_case(after_hello, buf, n, EPROTO, "malformed frame header");
		/* each reserved bit */
		for (unsigned bit = 0; bit < 16; bit += 5) {
			struct frame_hdr h = {
				.len = 0, .stream = 0, .type = FRAME_PING, .reserved = (uint16_t)(1u << bit)};
			frame_put_hdr(buf, &h);
			conn_error_case(after_hello, buf, FRAME_HDR_LEN, EPROTO, "malformed frame header");
		}
	}
}
END_TEST

START_TEST(test_unknown_frame_type)
{
	static const uint8_t types[] = {12, 13, 100, 255};
	start();
	for (size_t i = 0; i < sizeof(types); i++) {
		int fd = client(false, NULL);
		handshake(fd);
		/* an open stream dies silently with the connection */
		request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
		send_frame(fd, 1, FRAME_DATA, 0, "abc", 3);
		expect_data(fd, 1, 0, "abc", 3);
		expect_window(fd, 1, 3);
		send_frame(fd, 0, types[i], 0, "??", 2);
		char want[64];
		snprintf(want, sizeof(want), "unknown frame type %u", types[i]);
		expect_error(fd, 0, EPROTO, want);
		expect_closed(fd);
		wait_conns(0);
		ck_assert_uint_eq(S.n_streams, 0);
		assert_serving();
	}
}
END_TEST

START_TEST(test_client_forbidden_types)
{
	static const uint8_t types[] = {FRAME_HELLO_OK, FRAME_EVENT, FRAME_END, FRAME_ERROR};
	start();
	for (size_t i = 0; i < sizeof(types); i++) {
		int fd = client(false, NULL);
		handshake(fd);
		/* on an open stream, as an END would come */
		request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
		send_frame(fd, 1, types[i], 0, NULL, 0);
		expect_error(fd, 0, EPROTO, "may not be sent by a client");
		expect_closed(fd);
		wait_conns(0);
		assert_serving();
	}
	/* and on stream 0 */
	uint8_t buf[FRAME_HDR_LEN];
	size_t n = put_frame(buf, 0, FRAME_END, 0, NULL, 0);
	conn_error_case(true, buf, n, EPROTO, "may not be sent by a client");
}
END_TEST

START_TEST(test_ping)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	uint8_t p[FRAME_PING_MAX + 1];
	for (size_t i = 0; i < sizeof(p); i++)
		p[i] = (uint8_t)(i * 7 + 1);
	ping_pong(fd, NULL, 0);
	ping_pong(fd, p, 1);
	ping_pong(fd, p, FRAME_PING_MAX);
	/* PONGs from the client are fine (an answer to the daemon's keepalive) */
	send_frame(fd, 0, FRAME_PONG, 0, "keepalive", 9);
	ping_pong(fd, "after pong", 10);
	close(fd);
	wait_conns(0);

	uint8_t buf[FRAME_HDR_LEN + sizeof(p)];
	size_t n = put_frame(buf, 0, FRAME_PING, 0, p, FRAME_PING_MAX + 1);
	conn_error_case(true, buf, n, EPROTO, "PING payload of 65 bytes");
	n = put_frame(buf, 1, FRAME_PING, 0, p, 4);
	conn_error_case(true, buf, n, EPROTO, "PING on stream 1");
}
END_TEST

/* ---- streams ---- */

static size_t put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

START_TEST(test_unknown_request_kind)
{
	/* a kind from a newer client: an unknown field, so no oneof case is set. Field
	 * numbers far above any kind this shim may learn soon, and an empty Request. */
	static const uint32_t fields[] = {1000, 536870911, 0};
	start();
	int fd = client(false, NULL);
	handshake(fd);
	uint32_t id = 1;
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++, id += 2) {
		uint8_t p[16];
		size_t n = 0;
		if (fields[i] != 0) {
			n = put_varint(p, (uint64_t)fields[i] << 3); /* wire type 0: varint */
			n += put_varint(p + n, 1);
		}
		send_frame(fd, id, FRAME_REQUEST, 0, p, (uint32_t)n);
		expect_error(fd, id, ENOSYS, "unknown request kind");
		ck_assert_int_eq(ENOSYS, 38);
		/* a stream error: the connection goes on */
		ping_pong(fd, "ping", 4);
	}
	ck_assert_uint_eq(S.n_streams, 0);
	/* and the next stream works */
	request(fd, id, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, id, FRAME_DATA, FRAME_FLAG_FIN, "z", 1);
	expect_data(fd, id, 0, "z", 1);
	expect_data(fd, id, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, id, 1);
	close(fd);
	wait_conns(0);
}
END_TEST

/* A REQUEST whose payload does not decode fails its own stream with EBADMSG saying
 * what is wrong; the connection and its other streams go on (issue 16). */
static void bad_request(int fd, uint32_t id, const void *payload, uint32_t len, int errnum, const char *msg)
{
	send_frame(fd, id, FRAME_REQUEST, 0, payload, len);
	expect_error(fd, id, errnum, NULL);
	Shim__V1__Error *e = shim__v1__error__unpack(NULL, rh.len, rp);
	ck_assert_ptr_nonnull(e);
	ck_assert_str_eq(e->message, msg);
	shim__v1__error__free_unpacked(e, NULL);
}

START_TEST(test_request_undecodable)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	/* an echo stream in flight meanwhile */
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 1, FRAME_DATA, 0, "abc", 3);
	expect_data(fd, 1, 0, "abc", 3);
	expect_window(fd, 1, 3);

	/* field 1 (info) announced as 5 bytes long with 1 present */
	static const uint8_t cut[] = {0x0a, 0x05, 0x01};
	bad_request(fd, 3, cut, sizeof(cut), EBADMSG,
		    "cannot decode Request: Request.info (field 1) at offset 0: its length 5 runs past the end of the "
		    "message (1 bytes left)");
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff};
	bad_request(fd, 5, junk, sizeof(junk), EBADMSG,
		    "cannot decode Request: Request: a field's tag at offset 0 is cut short by the end of the message");
	/* stat (field 10) without its path: a proto3-style encoder's empty string */
	static const uint8_t nopath[] = {0x52, 0x00};
	bad_request(fd, 7, nopath, sizeof(nopath), EBADMSG,
		    "cannot decode Request: missing required field StatRequest.path (in stat)");
	/* exec (40) with an rlimit that has no name: found below two levels */
	static const uint8_t rl[] = {0xc2, 0x02, 0x05, 0xaa, 0x01, 0x02, 0x10, 0x01};
	bad_request(fd, 9, rl, sizeof(rl), EBADMSG,
		    "cannot decode Request: missing required field Rlimit.name (in exec.rlimits[0])");
	/* stat as a varint instead of a message */
	static const uint8_t wt[] = {0x50, 0x01};
	bad_request(fd, 11, wt, sizeof(wt), EBADMSG,
		    "cannot decode Request: Request.stat (field 10) at offset 0: a varint, want length-delimited");
	/* a group (wire type 3), which protobuf-c does not skip */
	static const uint8_t grp[] = {0x12, 0x00, 0x1b, 0x1c};
	bad_request(
		fd, 13, grp, sizeof(grp), EBADMSG,
		"cannot decode Request: Request: field 3 at offset 2: wire type 3 (a group start) is not supported");
	/* restore (61) with mode 7: decodes, but no such RestoreMode */
	static const uint8_t mode[] = {0xea, 0x03, 0x05, 0x0a, 0x01, '/', 0x10, 0x07};
	bad_request(fd, 15, mode, sizeof(mode), EINVAL, "RestoreRequest.mode: unknown value 7 (in restore)");
	/* truncate (23) with no size: optional, absent means 0 (a proto3-style encoder
	 * leaves a zero out), so it decodes and goes to the operation */
	ck_assert_uint_eq(S.n_streams, 1);

	/* the echo stream was not disturbed */
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, "de", 2);
	expect_data(fd, 1, 0, "de", 2);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 5);
	ping_pong(fd, "ok", 2);
	close(fd);
	wait_conns(0);
	ck_assert_uint_eq(S.n_streams, 0);
}
END_TEST

/* Flags a client may set: FIN on DATA only (PROTOCOL.md 4): the rest are refused. */
START_TEST(test_reserved_flags)
{
	start();
	uint8_t buf[64], w[4];
	frame_put_u32(w, 100);
	size_t n;
	uint8_t req[64];
	uint32_t rn = (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO);
	static const struct {
		uint8_t type, flags;
		const char *msg;
	} cases[] = {
		{FRAME_DATA, FRAME_FLAG_STDERR, "reserved flags 0x02 on a DATA frame"},
		{FRAME_DATA, 0x80 | FRAME_FLAG_FIN, "reserved flags 0x80 on a DATA frame"},
		{FRAME_WINDOW, FRAME_FLAG_FIN, "reserved flags 0x01 on a WINDOW frame"},
		{FRAME_CANCEL, 0x10, "reserved flags 0x10 on a CANCEL frame"},
		{FRAME_PING, FRAME_FLAG_FIN, "reserved flags 0x01 on a PING frame"},
		{FRAME_PONG, 0x40, "reserved flags 0x40 on a PONG frame"},
		{FRAME_REQUEST, FRAME_FLAG_FIN, "reserved flags 0x01 on a REQUEST frame"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int fd = client(false, NULL);
		handshake(fd);
		if (cases[i].type != FRAME_REQUEST)
			request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
		uint32_t stream = cases[i].type == FRAME_PING || cases[i].type == FRAME_PONG ? 0 : 1;
		const void *p = cases[i].type == FRAME_WINDOW  ? (const void *)w :
				cases[i].type == FRAME_REQUEST ? (const void *)req :
								 (const void *)"x";
		uint32_t len = cases[i].type == FRAME_WINDOW ? 4 : cases[i].type == FRAME_REQUEST ? rn : 1;
		if (cases[i].type == FRAME_CANCEL)
			len = 0;
		n = put_frame(buf, stream, cases[i].type, cases[i].flags, p, len);
		ck_assert_int_eq(send_raw(fd, buf, n), 0);
		expect_error(fd, 0, EPROTO, cases[i].msg);
		expect_closed(fd);
		wait_conns(0);
	}
	/* and on HELLO */
	uint8_t hp[64];
	size_t hn = pack_hello(hp, 1, NULL, 0, 0, 0);
	n = put_frame(buf, 0, FRAME_HELLO, FRAME_FLAG_FIN, hp, (uint32_t)hn);
	conn_error_case(false, buf, n, EPROTO, "reserved flags 0x01 on a HELLO frame");
	assert_serving();
}
END_TEST

/* PING and PONG belong to stream 0 (PROTOCOL.md 3); CANCEL is empty. */
START_TEST(test_stream0_frames)
{
	start();
	uint8_t buf[64];
	size_t n = put_frame(buf, 3, FRAME_PONG, 0, "x", 1);
	conn_error_case(true, buf, n, EPROTO, "PONG on stream 3 (must be 0)");
	uint8_t big[FRAME_PING_MAX + 1] = {0};
	uint8_t bbuf[FRAME_HDR_LEN + sizeof(big)];
	n = put_frame(bbuf, 0, FRAME_PONG, 0, big, sizeof(big));
	conn_error_case(true, bbuf, n, EPROTO, "PONG payload of 65 bytes (limit 64)");
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 1, FRAME_CANCEL, 0, "x", 1);
	expect_error(fd, 0, EPROTO, "CANCEL payload of 1 bytes (must be empty)");
	expect_closed(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_stream_id_reused)
{
	start();
	/* the same id while the stream is open */
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	expect_error(fd, 0, EPROTO, "stream id 1 reused");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();

	/* a lower id than one already opened (never used itself) */
	fd = client(false, NULL);
	handshake(fd);
	request(fd, 5, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 3, SHIM__V1__REQUEST__KIND_ECHO);
	expect_error(fd, 0, EPROTO, "stream id 3 reused");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();

	/* the id of a stream that has ended */
	fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 0);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	expect_error(fd, 0, EPROTO, "stream id 1 reused");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_stream_id_even)
{
	start();
	uint8_t req[64], buf[128];
	uint32_t n = (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO);
	size_t len = put_frame(buf, 2, FRAME_REQUEST, 0, req, n);
	conn_error_case(true, buf, len, EPROTO, "even stream id 2");
	len = put_frame(buf, 0, FRAME_REQUEST, 0, req, n);
	conn_error_case(true, buf, len, EPROTO, "even stream id 0");
	/* even, and above the highest odd id opened */
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 4, SHIM__V1__REQUEST__KIND_ECHO);
	expect_error(fd, 0, EPROTO, "even stream id 4");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_frames_for_unknown_stream)
{
	start();
	uint8_t buf[64], w[4];
	frame_put_u32(w, 100);
	/* never opened: above the highest id, even, or stream 0 */
	size_t n = put_frame(buf, 7, FRAME_DATA, 0, "data", 4);
	conn_error_case(true, buf, n, EPROTO, "unknown stream 7");
	n = put_frame(buf, 2, FRAME_DATA, 0, "data", 4);
	conn_error_case(true, buf, n, EPROTO, "unknown stream 2");
	n = put_frame(buf, 0, FRAME_DATA, 0, "data", 4);
	conn_error_case(true, buf, n, EPROTO, "unknown stream 0");
	n = put_frame(buf, 9, FRAME_WINDOW, 0, w, 4);
	conn_error_case(true, buf, n, EPROTO, "unknown stream 9");
	n = put_frame(buf, 11, FRAME_CANCEL, 0, NULL, 0);
	conn_error_case(true, buf, n, EPROTO, "unknown stream 11");

	/* with streams open: the next odd id is still unknown */
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 3, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 5, FRAME_DATA, 0, "early", 5);
	expect_error(fd, 0, EPROTO, "unknown stream 5");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_late_frames_ignored)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, "bye", 3);
	expect_data(fd, 1, 0, "bye", 3);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 3);
	ck_assert_uint_eq(S.n_streams, 0);
	/* the client had not seen END yet: its late frames are a race, not an error */
	send_frame(fd, 1, FRAME_DATA, 0, "late", 4);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	window(fd, 1, 4096);
	send_frame(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	/* nothing answers them: the next frame is the PONG */
	ping_pong(fd, "alive", 5);
	ck_assert_int_eq(S.conns->state, CONN_READY);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_window_bad)
{
	start();
	uint8_t w[8] = {0, 0, 1, 0, 0, 0, 0, 0};
	for (uint32_t len = 0; len <= 8; len++) {
		if (len == 4)
			continue;
		int fd = client(false, NULL);
		handshake(fd);
		request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
		send_frame(fd, 1, FRAME_WINDOW, 0, w, len);
		char want[64];
		snprintf(want, sizeof(want), "WINDOW payload of %u bytes", len);
		expect_error(fd, 0, EPROTO, want);
		expect_closed(fd);
		wait_conns(0);
		assert_serving();
	}
	/* an increment of 0 */
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	window(fd, 1, 0);
	expect_error(fd, 0, EPROTO, "WINDOW of 0");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
	/* credit past 2^31-1 */
	fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	window(fd, 1, 0x7fffffffu);
	expect_error(fd, 0, EPROTO, "WINDOW overflows");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
}
END_TEST

START_TEST(test_flow_control_violation)
{
	S.cfg.initial_window = 16384;
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, 0, 0);
	ck_assert_uint_eq(r->initial_window, 16384);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	uint8_t *data = calloc(1, 20000);
	ck_assert_ptr_nonnull(data);
	send_frame(fd, 1, FRAME_DATA, 0, data, 20000);
	expect_error(fd, 0, EPROTO, "flow control violated on stream 1");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();

	/* the credit is counted across frames: a client window of 1 byte is raised to
	 * the 4 KiB minimum, so the echo hands back only 4096 bytes of credit and
	 * 3 x 10000 is over 16384 + 4096 */
	fd = client(false, NULL);
	r = handshake_ex(fd, NULL, 0, 1);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	uint8_t three[3 * (FRAME_HDR_LEN + 10000)];
	size_t n = put_frame(three, 1, FRAME_DATA, 0, data, 10000);
	n += put_frame(three + n, 1, FRAME_DATA, 0, data, 10000);
	n += put_frame(three + n, 1, FRAME_DATA, 0, data, 10000);
	ck_assert_int_eq(send_raw(fd, three, n), 0);
	expect_data(fd, 1, 0, data, FRAME_MIN_WINDOW);
	expect_window(fd, 1, FRAME_MIN_WINDOW);
	expect_error(fd, 0, EPROTO, "flow control violated on stream 1");
	expect_closed(fd);
	wait_conns(0);
	assert_serving();
	free(data);
}
END_TEST

START_TEST(test_flow_control_exact_credit)
{
	S.cfg.initial_window = 16384;
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	uint8_t *data = malloc(16384);
	ck_assert_ptr_nonnull(data);
	for (size_t i = 0; i < 16384; i++)
		data[i] = (uint8_t)(i * 31);
	/* all of the credit in one frame, then again once it has been handed back */
	send_frame(fd, 1, FRAME_DATA, 0, data, 16384);
	expect_data(fd, 1, 0, data, 16384);
	expect_window(fd, 1, 16384);
	send_frame(fd, 1, FRAME_DATA, 0, data, 16384);
	expect_data(fd, 1, 0, data, 16384);
	expect_window(fd, 1, 16384);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 32768);
	free(data);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_too_many_streams)
{
	S.cfg.max_streams = 2;
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 3, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 5, SHIM__V1__REQUEST__KIND_ECHO);
	expect_error(fd, 5, EAGAIN, "too many streams in flight (limit 2)");
	ck_assert_int_eq(EAGAIN, 11);
	ck_assert_uint_eq(S.conns->nstreams, 2);
	/* late DATA for the refused stream is ignored like any ended stream's */
	send_frame(fd, 5, FRAME_DATA, 0, "refused", 7);
	/* the first two still work */
	send_frame(fd, 3, FRAME_DATA, FRAME_FLAG_FIN, "three", 5);
	expect_data(fd, 3, 0, "three", 5);
	expect_data(fd, 3, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 3, 5);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, "one", 3);
	expect_data(fd, 1, 0, "one", 3);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 3);
	/* and their slots are free again */
	request(fd, 7, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 9, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 9, FRAME_DATA, FRAME_FLAG_FIN, "9", 1);
	expect_data(fd, 9, 0, "9", 1);
	expect_data(fd, 9, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 9, 1);
	ck_assert_uint_eq(S.conns->nstreams, 1);
	close(fd);
	wait_conns(0);
	ck_assert_uint_eq(S.n_streams, 0);
}
END_TEST

/* ---- operations ---- */

START_TEST(test_echo_small)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	static const uint8_t bin[] = {0, 1, 2, 0xff, '\n', 0};
	send_frame(fd, 1, FRAME_DATA, 0, "hello", 5);
	expect_data(fd, 1, 0, "hello", 5);
	expect_window(fd, 1, 5);
	send_frame(fd, 1, FRAME_DATA, 0, bin, sizeof(bin));
	expect_data(fd, 1, 0, bin, sizeof(bin));
	expect_window(fd, 1, sizeof(bin));
	/* an empty DATA without FIN is no data at all */
	send_frame(fd, 1, FRAME_DATA, 0, NULL, 0);
	send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, "!", 1);
	expect_data(fd, 1, 0, "!", 1);
	expect_data(fd, 1, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 1, 5 + sizeof(bin) + 1);
	ck_assert_uint_eq(S.n_streams, 0);
	ping_pong(fd, "done", 4);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_echo_large_flow_control)
{
	/* more than both windows, so both sides must wait for WINDOW frames */
	S.cfg.initial_window = 65536;
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, FRAME_MIN_MAX, 32768);
	int64_t credit = r->initial_window;
	ck_assert_int_eq(credit, 65536);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);

	const size_t total = 600000;
	uint8_t *src = malloc(total), *dst = malloc(total);
	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	uint32_t x = 12345;
	for (size_t i = 0; i < total; i++) {
		x = x * 1103515245u + 12345u;
		src[i] = (uint8_t)(x >> 16);
	}
	size_t sent = 0, got = 0;
	bool fin_sent = false, fin_got = false, ended = false;
	while (!ended) {
		while (sent < total && credit > 0) {
			size_t n = total - sent;
			if (n > 10007)
				n = 10007;
			if ((int64_t)n > credit)
				n = (size_t)credit;
			send_frame(fd, 1, FRAME_DATA, 0, src + sent, (uint32_t)n);
			sent += n;
			credit -= (int64_t)n;
		}
		if (sent == total && !fin_sent) {
			send_frame(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
			fin_sent = true;
		}
		next_frame(fd);
		if (rh.stream != 1)
			ck_abort_msg("unexpected %s", desc(&rh, rp));
		if (rh.type == FRAME_DATA) {
			ck_assert(!fin_got);
			ck_assert_uint_le(rh.len, FRAME_MIN_MAX);
			if (rh.flags & FRAME_FLAG_FIN) {
				ck_assert_uint_eq(rh.len, 0);
				fin_got = true;
				continue;
			}
			ck_assert_uint_le(got + rh.len, total);
			memcpy(dst + got, rp, rh.len);
			got += rh.len;
			window(fd, 1, rh.len);
		} else if (rh.type == FRAME_WINDOW) {
			ck_assert_uint_eq(rh.len, 4);
			credit += frame_get_u32(rp);
			ck_assert_int_le(credit, 65536);
		} else if (rh.type == FRAME_END) {
			ck_assert(fin_got);
			Shim__V1__Result *res = shim__v1__result__unpack(NULL, rh.len, rp);
			ck_assert_ptr_nonnull(res);
			ck_assert_int_eq(res->kind_case, SHIM__V1__RESULT__KIND_ECHO);
			ck_assert_uint_eq(res->echo->bytes, total);
			shim__v1__result__free_unpacked(res, NULL);
			ended = true;
		} else {
			ck_abort_msg("unexpected %s", desc(&rh, rp));
		}
	}
	ck_assert_uint_eq(got, total);
	ck_assert_mem_eq(dst, src, total);
	ck_assert_int_eq(memcmp(dst, src, total), 0);
	free(src);
	free(dst);
	close(fd);
	wait_conns(0);
}
END_TEST

/* Echo big frames while the client writes them in awkward pieces: a header alone, a
 * header with the start of its payload, a payload cut anywhere, two frames in one write.
 * The daemon splices what it can of each payload into the echo's pipe (conn.c's
 * data_pipe) and reads the rest; the bytes come back exact and in order, in frames of
 * the sizes sent, whichever way each was received. Two streams interleave, with pings
 * between the frames. */
static void echo_cut_case(uint32_t window_bytes, uint32_t client_window, unsigned pieces_seed)
{
	S.cfg.initial_window = window_bytes;
	start();
	int fd = client(false, NULL);
	Shim__V1__HelloReply *r = handshake_ex(fd, NULL, 0, client_window);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 3, SHIM__V1__REQUEST__KIND_ECHO);
	const size_t total = 3u << 20;
	uint8_t *src = malloc(total), *dst[2] = {malloc(total), malloc(total)};
	ck_assert(src != NULL && dst[0] != NULL && dst[1] != NULL);
	uint32_t x = 777 + pieces_seed;
	for (size_t i = 0; i < total; i++) {
		x = x * 1103515245u + 12345u;
		src[i] = (uint8_t)(x >> 16);
	}
	uint64_t spliced0 = conn_rx_spliced, copied0 = conn_rx_copied;
	size_t sent[2] = {0, 0}, got[2] = {0, 0};
	int64_t credit[2] = {window_bytes, window_bytes};
	bool ended[2] = {false, false}, fin_sent[2] = {false, false};
	uint8_t *wbuf = malloc(2 * (FRAME_HDR_LEN + (256u << 10)) + 64);
	ck_assert_ptr_nonnull(wbuf);
	unsigned round = 0;
	while (!ended[0] || !ended[1]) {
		/* up to two frames (either stream), laid out, then written in pieces */
		size_t wlen = 0;
		for (int k = 0; k < 2; k++) {
			int i = (int)((round + (unsigned)k) % 2);
			uint32_t id = i == 0 ? 1 : 3;
			size_t n = total - sent[i];
			size_t cap = (round * 7919u + (unsigned)k * 104729u) % (200u << 10) + (20u << 10);
			if (n > cap)
				n = cap;
			if ((int64_t)n > credit[i])
				n = (size_t)credit[i];
			if (n > 0) {
				wlen += put_frame(wbuf + wlen, id, FRAME_DATA, 0, src + sent[i], (uint32_t)n);
				sent[i] += n;
				credit[i] -= (int64_t)n;
			} else if (sent[i] == total && !fin_sent[i]) {
				wlen += put_frame(wbuf + wlen, id, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
				fin_sent[i] = true;
			}
		}
		if (round % 3 == 0)
			wlen += put_frame(wbuf + wlen, 0, FRAME_PING, 0, "pp", 2);
		size_t off = 0;
		unsigned y = round * 2654435761u + pieces_seed;
		while (off < wlen) {
			y = y * 1103515245u + 12345u;
			size_t cut = (y >> 8) % 5 == 0 ? FRAME_HDR_LEN : (y >> 8) % 70000 + 1;
			if (cut > wlen - off)
				cut = wlen - off;
			ck_assert_int_eq(send_raw(fd, wbuf + off, cut), 0);
			off += cut;
			pump();
		}
		round++;
		/* read back what is there; hand back credit for it */
		for (;;) {
			struct frame_hdr h;
			struct pollfd pf = {.fd = fd, .events = POLLIN};
			if (poll(&pf, 1, 0) == 0) {
				pump();
				if (poll(&pf, 1, 1) == 0)
					break; /* nothing now: send more */
			}
			ck_assert_int_eq(recv_frame(fd, &h, rp, sizeof(rp), WAIT_MS), 1);
			if (h.type == FRAME_PONG)
				continue;
			ck_assert_msg(h.stream == 1 || h.stream == 3, "unexpected %s", desc(&h, rp));
			int i = h.stream == 1 ? 0 : 1;
			if (h.type == FRAME_WINDOW) {
				credit[i] += frame_get_u32(rp);
				ck_assert_int_le(credit[i], window_bytes);
			} else if (h.type == FRAME_DATA) {
				if (h.flags & FRAME_FLAG_FIN) {
					ck_assert_uint_eq(h.len, 0);
					continue;
				}
				ck_assert_uint_le(got[i] + h.len, total);
				memcpy(dst[i] + got[i], rp, h.len);
				got[i] += h.len;
				window(fd, h.stream, h.len);
			} else if (h.type == FRAME_END) {
				Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, rp);
				ck_assert_ptr_nonnull(res);
				ck_assert_uint_eq(res->echo->bytes, total);
				shim__v1__result__free_unpacked(res, NULL);
				ended[i] = true;
			} else {
				ck_abort_msg("unexpected %s", desc(&h, rp));
			}
		}
		ck_assert_msg(round < 100000, "no progress: sent %zu/%zu, got %zu/%zu", sent[0], sent[1], got[0],
			      got[1]);
	}
	for (int i = 0; i < 2; i++) {
		ck_assert_uint_eq(got[i], total);
		ck_assert_int_eq(memcmp(dst[i], src, total), 0);
	}
	/* the pipe path was taken for a good part of it; with the pipe that runs out of
	 * room, the fallback to data() too */
	ck_assert_msg(conn_rx_spliced - spliced0 > (op_echo_pipe_real_size > 0 ? 0 : total / 4),
		      "only %llu bytes spliced", (unsigned long long)(conn_rx_spliced - spliced0));
	if (op_echo_pipe_real_size > 0)
		ck_assert_msg(conn_rx_copied - copied0 > 0, "the pipe never ran out of room");
	free(wbuf);
	free(src);
	free(dst[0]);
	free(dst[1]);
	close(fd);
	wait_conns(0);
}

START_TEST(test_echo_spliced_cut)
{
	echo_cut_case(FRAME_DEFAULT_WINDOW, 0, 1);
}
END_TEST

START_TEST(test_echo_spliced_pipe_full)
{
	/* the pipe counts 2 MiB of room but holds one page: every payload fills it and the
	 * rest comes through data(), queued behind what is in the pipe (which stays there
	 * for want of credit: the client's window is 16 KiB) */
	op_echo_pipe_real_size = 4096;
	echo_cut_case(1u << 20, 16384, 3);
}
END_TEST

START_TEST(test_echo_spliced_big_window)
{
	/* frames up to 220 KiB, more than one in the window */
	echo_cut_case(1u << 20, 0, 2);
}
END_TEST

/* A big DATA frame cut in the middle of its payload, then EOF: the connection fails
 * (EPROTO: closed in the middle of a frame) and goes; nothing hangs on the pipe. */
START_TEST(test_echo_spliced_eof_mid_payload)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	size_t n = 100000;
	uint8_t *f = malloc(FRAME_HDR_LEN + n);
	ck_assert_ptr_nonnull(f);
	memset(f + FRAME_HDR_LEN, 'z', n);
	put_frame(f, 1, FRAME_DATA, 0, f + FRAME_HDR_LEN, (uint32_t)n);
	uint64_t spliced0 = conn_rx_spliced;
	/* a header alone first: the payload goes to the pipe */
	ck_assert_int_eq(send_raw(fd, f, FRAME_HDR_LEN), 0);
	pump();
	ck_assert_int_eq(send_raw(fd, f + FRAME_HDR_LEN, n / 2), 0);
	pump();
	ck_assert_uint_gt(conn_rx_spliced, spliced0);
	shutdown(fd, SHUT_WR);
	expect_error(fd, 0, EPROTO, "closed in the middle of a frame");
	free(f);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_cancel_echo)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_ECHO);
	request(fd, 3, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 1, FRAME_DATA, 0, "abc", 3);
	expect_data(fd, 1, 0, "abc", 3);
	expect_window(fd, 1, 3);
	send_frame(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	expect_error(fd, 1, ECANCELED, "cancelled");
	ck_assert_int_eq(ECANCELED, 125);
	ck_assert_uint_eq(S.conns->nstreams, 1);
	/* CANCEL and DATA for the ended stream are ignored */
	send_frame(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	send_frame(fd, 1, FRAME_DATA, 0, "x", 1);
	ping_pong(fd, "p", 1);
	/* the other stream is untouched */
	send_frame(fd, 3, FRAME_DATA, FRAME_FLAG_FIN, "def", 3);
	expect_data(fd, 3, 0, "def", 3);
	expect_data(fd, 3, FRAME_FLAG_FIN, NULL, 0);
	expect_echo_end(fd, 3, 3);
	/* a stream cancelled before any data */
	request(fd, 5, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(fd, 5, FRAME_CANCEL, 0, NULL, 0);
	expect_error(fd, 5, ECANCELED, "cancelled");
	ck_assert_uint_eq(S.n_streams, 0);
	close(fd);
	wait_conns(0);
}
END_TEST

/* Pump until the worker pool has finished every job. */
static void wait_workers_idle(void)
{
	uint64_t deadline = now_ms() + WAIT_MS;
	while (worker_pending() != 0 && now_ms() < deadline) {
		pump();
		pause_ms(1);
	}
	ck_assert_uint_eq(worker_pending(), 0);
}

START_TEST(test_info)
{
	S.cfg.max_streams = 33;
	S.cfg.max_connections = 44;
	start();
	int fd = client(false, NULL);
	handshake(fd);
	request(fd, 1, SHIM__V1__REQUEST__KIND_INFO);
	expect_frame(fd, 1, FRAME_END);
	Shim__V1__Result *res = shim__v1__result__unpack(NULL, rh.len, rp);
	ck_assert_ptr_nonnull(res);
	ck_assert_int_eq(res->kind_case, SHIM__V1__RESULT__KIND_INFO);
	Shim__V1__InfoReply *r = res->info;
	ck_assert_ptr_nonnull(r);
	ck_assert_str_eq(r->shim_version, SHIM_VERSION);
	ck_assert_uint_eq(r->protocol_version, 1);
	ck_assert(has_feature(r->features, r->n_features, "info"));
	ck_assert(has_feature(r->features, r->n_features, "echo"));
	ck_assert_uint_eq(r->pid, (uint32_t)getpid());
	ck_assert_int_eq(r->pid1, getpid() == 1);
	ck_assert_uint_eq(r->uid, (uint32_t)getuid());
	ck_assert_uint_eq(r->gid, (uint32_t)getgid());
	ck_assert(r->has_connections);
	ck_assert_uint_ge(r->connections, 1);
	ck_assert_uint_eq(r->connections, 1);
	ck_assert(r->has_streams);
	ck_assert_uint_eq(r->streams, 1); /* this one */
	ck_assert(r->has_max_streams);
	ck_assert_uint_eq(r->max_streams, 33);
	ck_assert(r->has_max_connections);
	ck_assert_uint_eq(r->max_connections, 44);
	ck_assert(r->has_workers);
	ck_assert_uint_ge(r->workers, 1);
	ck_assert_uint_le(r->workers, 4);
	ck_assert(r->has_rss_bytes);
	ck_assert_uint_gt(r->rss_bytes, 0);
	ck_assert_ptr_nonnull(r->hostname);
	ck_assert_str_eq(r->hostname, S.hostname);
	shim__v1__result__free_unpacked(res, NULL);
	ck_assert_uint_eq(S.n_streams, 0);
	ping_pong(fd, "after info", 10);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_cancel_info)
{
	/* REQUEST and CANCEL in one write: both are handled before the worker's answer
	 * can come back, so the job is orphaned and must not answer */
	start();
	int fd = client(false, NULL);
	handshake(fd);
	uint8_t req[64], buf[256];
	size_t n = put_frame(buf, 1, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_INFO));
	n += put_frame(buf + n, 1, FRAME_CANCEL, 0, NULL, 0);
	ck_assert_int_eq(send_raw(fd, buf, n), 0);
	expect_error(fd, 1, ECANCELED, "cancelled");
	wait_workers_idle();
	ck_assert_uint_eq(S.n_streams, 0);
	/* no END for stream 1: the next frame is the PONG */
	ping_pong(fd, "no end", 6);
	close(fd);
	wait_conns(0);
}
END_TEST

START_TEST(test_disconnect_cancels_streams)
{
	start();
	int fd = client(false, NULL);
	handshake(fd);
	uint8_t req[64], buf[512];
	size_t n = put_frame(buf, 1, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_ECHO));
	n += put_frame(buf + n, 1, FRAME_DATA, 0, "pending", 7);
	n += put_frame(buf + n, 3, FRAME_REQUEST, 0, req, (uint32_t)pack_request(req, SHIM__V1__REQUEST__KIND_INFO));
	ck_assert_int_eq(send_raw(fd, buf, n), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_uint_eq(S.n_streams, 2);
	close(fd);
	wait_conns(0);
	wait_workers_idle();
	ck_assert_uint_eq(S.n_streams, 0);
	assert_serving();
}
END_TEST

START_TEST(test_shutdown)
{
	S.cfg.shutdown_timeout = 60; /* the loop must end because the work is done, not by the timer */
	start();
	/* one connection with an echo stream in flight, one idle, one before HELLO */
	int a = client(false, NULL);
	handshake(a);
	request(a, 1, SHIM__V1__REQUEST__KIND_ECHO);
	send_frame(a, 1, FRAME_DATA, 0, "in flight", 9);
	expect_data(a, 1, 0, "in flight", 9);
	expect_window(a, 1, 9);
	int b = client(false, NULL);
	handshake(b);
	int c = client(false, NULL);
	ck_assert_uint_eq(S.n_conns, 3);

	server_shutdown(&S, "unit test");
	ck_assert(S.shutting_down);
	expect_error(a, 1, ECANCELED, "shim shutting down");
	expect_closed(a);
	expect_closed(b);
	expect_closed(c);
	wait_conns(0);
	ck_assert_uint_eq(S.n_streams, 0);
	/* with nothing left, the loop ends by itself */
	ev_run(L, 0);
}
END_TEST

static void add_fixture(TCase *tc)
{
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
}

static Suite *dispatch_suite(void)
{
	Suite *s = suite_create("dispatch");
	TCase *tc = tcase_create("handshake");
	add_fixture(tc);
	tcase_add_test(tc, test_hello_ok_contents);
	tcase_add_loop_test(tc, test_hello_max_frame_negotiation, 0, 10);
	tcase_add_test(tc, test_hello_wrong_version);
	tcase_add_test(tc, test_hello_undecodable);
	tcase_add_test(tc, test_hello_on_stream_not_zero);
	tcase_add_test(tc, test_frames_before_hello);
	tcase_add_test(tc, test_hello_twice);
	tcase_add_test(tc, test_handshake_timeout);
	tcase_add_test(tc, test_no_ping_before_hello_ok);
	tcase_add_test(tc, test_keepalive_after_pause);
	tcase_add_test(tc, test_token_missing);
	tcase_add_test(tc, test_token_wrong);
	tcase_add_test(tc, test_token_right);
	suite_add_tcase(s, tc);

	tc = tcase_create("framing");
	add_fixture(tc);
	tcase_add_test(tc, test_hello_too_big);
	tcase_add_test(tc, test_frame_too_big);
	tcase_add_test(tc, test_frame_at_limit);
	tcase_add_test(tc, test_truncated_hello);
	tcase_add_test(tc, test_eof_flushes_queued_replies);
	tcase_add_test(tc, test_truncated_after_hello);
	tcase_add_test(tc, test_malformed_header);
	tcase_add_test(tc, test_unknown_frame_type);
	tcase_add_test(tc, test_client_forbidden_types);
	tcase_add_test(tc, test_ping);
	suite_add_tcase(s, tc);

	tc = tcase_create("streams");
	add_fixture(tc);
	tcase_add_test(tc, test_unknown_request_kind);
	tcase_add_test(tc, test_request_undecodable);
	tcase_add_test(tc, test_reserved_flags);
	tcase_add_test(tc, test_stream0_frames);
	tcase_add_test(tc, test_stream_id_reused);
	tcase_add_test(tc, test_stream_id_even);
	tcase_add_test(tc, test_frames_for_unknown_stream);
	tcase_add_test(tc, test_late_frames_ignored);
	tcase_add_test(tc, test_window_bad);
	tcase_add_test(tc, test_flow_control_violation);
	tcase_add_test(tc, test_flow_control_exact_credit);
	tcase_add_test(tc, test_too_many_streams);
	suite_add_tcase(s, tc);

	tc = tcase_create("ops");
	add_fixture(tc);
	tcase_add_test(tc, test_echo_small);
	tcase_add_test(tc, test_echo_large_flow_control);
	tcase_add_test(tc, test_echo_spliced_cut);
	tcase_add_test(tc, test_echo_spliced_big_window);
	tcase_add_test(tc, test_echo_spliced_pipe_full);
	tcase_add_test(tc, test_echo_spliced_eof_mid_payload);
	tcase_add_test(tc, test_cancel_echo);
	tcase_add_test(tc, test_info);
	tcase_add_test(tc, test_cancel_info);
	tcase_add_test(tc, test_disconnect_cancels_streams);
	tcase_add_test(tc, test_shutdown);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(dispatch_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
