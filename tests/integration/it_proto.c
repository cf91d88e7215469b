/* it_proto.c: the daemon against PROTOCOL.md at the frame level: every error text of §5 and §9,
 * the handshake deadline, pipelined frames, a pause across the keepalive, the token file, restore's window. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PROTOCOL_MD
#error "PROTOCOL_MD must name proto/PROTOCOL.md"
#endif

/* ---- the spec's tables ----
 *
 * Every message in the last column of §5's refusal table and of §9's table, with the
 * errno of its row. A case names the pattern it checks; the daemon's errno must be the
 * row's and its message must be exactly the one the case expects, which must fit the
 * pattern. At the end every pattern must have been checked (or be listed in elsewhere[]). */

struct row {
	char pattern[200];
	int errnum; /* the first number of the errno column; -1 if none */
	bool checked;
};

static struct row rows[64];
static unsigned n_rows;

/* Patterns checked by other programs (they need a daemon out of fds, or such). */
static const char *const elsewhere[] = {
	"too many connections: the shim is out of file descriptors", /* it_limits.emfile */
	/* the daemon-wide memory budget (issue 16, point 4): its own tests, it_memory, are
	 * the place for it (being written at the time of this list) */
	"memory budget exhausted (N of --max-buffer M bytes held): try again",
};

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	CHECKF(f != NULL, "%s: %s", path, strerror(errno));
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* The backticked strings of a message cell, up to its first '(' outside backticks
 * (what follows is commentary, e.g. "(the type received, e.g. `PING`)"). */
static void add_patterns(const char *cell, int errnum)
{
	bool in = false;
	const char *start = NULL;
	for (const char *p = cell; *p != '\0'; p++) {
		if (*p == '`') {
			if (in) {
				CHECK(n_rows < sizeof(rows) / sizeof(rows[0]));
				struct row *r = &rows[n_rows++];
				size_t n = (size_t)(p - start);
				CHECK(n < sizeof(r->pattern));
				memcpy(r->pattern, start, n);
				r->pattern[n] = '\0';
				r->errnum = errnum;
				r->checked = false;
			} else {
				start = p + 1;
			}
			in = !in;
		} else if (*p == '(' && !in) {
			return;
		}
	}
}

/* The table rows of the section that starts with heading (up to the next "## "). */
static void load_section(const char *doc, const char *heading)
{
	const char *sec = strstr(doc, heading);
	CHECKF(sec != NULL, "PROTOCOL.md has no '%s'", heading);
	const char *end = strstr(sec + strlen(heading), "\n## ");
	for (const char *line = sec; line != NULL && (end == NULL || line < end);) {
		const char *nl = strchr(line, '\n');
		size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
		char buf[2048];
		CHECK(len < sizeof(buf));
		memcpy(buf, line, len);
		buf[len] = '\0';
		if (len > 2 && buf[0] == '|' && strncmp(buf, "|--", 3) != 0 && strstr(buf, "| errno |") == NULL) {
			/* cells: ... | errno | message | */
			char *cells[16];
			int nc = 0;
			for (char *save = NULL, *c = strtok_r(buf, "|", &save); c != NULL && nc < 16;
			     c = strtok_r(NULL, "|", &save))
				cells[nc++] = c;
			if (nc >= 2) {
				int errnum = -1;
				sscanf(cells[nc - 2], " %d", &errnum);
				add_patterns(cells[nc - 1], errnum);
			}
		}
		line = nl != NULL ? nl + 1 : NULL;
	}
}

static void load_spec(void)
{
	if (n_rows > 0)
		return;
	const char *doc = read_file(PROTOCOL_MD);
	load_section(doc, "\n## 5. Handshake");
	load_section(doc, "\n## 9. Errors");
	CHECKF(n_rows >= 30, "only %u messages found in PROTOCOL.md 5 and 9", n_rows);
}

/* A placeholder is one capital letter standing alone (N, M, T...): it matches a run of
 * characters up to a space or one of ",).:"; "..." matches any text (at least a character). */
static bool is_placeholder(const char *pat, const char *p)
{
	bool before = p == pat || !((p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= 'a' && p[-1] <= 'z') || p[-1] == '_');
	bool after = !((p[1] >= 'A' && p[1] <= 'Z') || (p[1] >= 'a' && p[1] <= 'z') || p[1] == '_' ||
		       (p[1] >= '0' && p[1] <= '9'));
	return *p >= 'A' && *p <= 'Z' && before && after;
}

static bool match_from(const char *pat, const char *p, const char *m)
{
	while (*p != '\0') {
		if (strncmp(p, "...", 3) == 0) {
			for (const char *k = m + 1; k <= m + strlen(m); k++)
				if (*m != '\0' && match_from(pat, p + 3, k))
					return true;
			return false;
		}
		if (is_placeholder(pat, p)) {
			const char *s = m;
			while (*m != '\0' && strchr(" ,).:", *m) == NULL)
				m++;
			if (m == s)
				return false;
			p++;
			continue;
		}
		if (*p++ != *m++)
			return false;
	}
	return *m == '\0';
}

static bool pattern_match(const char *pat, const char *msg)
{
	return match_from(pat, pat, msg);
}

static struct row *spec_row(const char *pattern)
{
	load_spec();
	for (unsigned i = 0; i < n_rows; i++)
		if (strcmp(rows[i].pattern, pattern) == 0)
			return &rows[i];
	it_fail(__FILE__, __LINE__, "PROTOCOL.md 5 and 9 list no message `%s`", pattern);
}

/* The spec's row for pattern: its errno, marked checked; msg must fit the pattern. */
static int spec_errno(const char *pattern, const char *msg)
{
	struct row *r = spec_row(pattern);
	CHECKF(pattern_match(pattern, msg), "the expected '%s' does not fit PROTOCOL.md's `%s`", msg, pattern);
	CHECKF(r->errnum > 0, "PROTOCOL.md gives no errno for `%s`", pattern);
	r->checked = true;
	return r->errnum;
}

static void spec_all_checked(void)
{
	for (unsigned i = 0; i < n_rows; i++) {
		bool other = false;
		for (size_t j = 0; j < sizeof(elsewhere) / sizeof(elsewhere[0]); j++)
			other |= strcmp(rows[i].pattern, elsewhere[j]) == 0;
		CHECKF(rows[i].checked || other, "PROTOCOL.md lists `%s`, which no case checks", rows[i].pattern);
	}
}

/* ---- frames ---- */

static void send_hello(int fd, const char *token, size_t token_len, uint32_t window)
{
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = SHIM_PROTOCOL_VERSION;
	m.client_name = (char *)"it_proto";
	if (token != NULL) {
		m.has_token = 1;
		m.token.data = (uint8_t *)(uintptr_t)token;
		m.token.len = token_len;
	}
	if (window != 0) {
		m.has_initial_window = 1;
		m.initial_window = window;
	}
	uint8_t buf[256];
	size_t n = shim__v1__hello__get_packed_size(&m);
	CHECK(n <= sizeof(buf));
	shim__v1__hello__pack(&m, buf);
	raw_send(fd, 0, FRAME_HELLO, 0, buf, n);
}

static void expect_hello_ok(int fd)
{
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF instead of HELLO_OK");
	CHECKF(h.type == FRAME_HELLO_OK, "got %s on stream %u instead of HELLO_OK", frame_type_name(h.type), h.stream);
	free(p);
}

/* A connection past its handshake; window 0: the default. */
static int ready(const char *sock, uint32_t window)
{
	int fd = raw_connect_unix(sock);
	send_hello(fd, NULL, 0, window);
	expect_hello_ok(fd);
	return fd;
}

static void send_header(int fd, uint32_t len, uint32_t stream, uint8_t type, uint8_t flags, uint16_t reserved)
{
	uint8_t b[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = len, .stream = stream, .type = type, .flags = flags, .reserved = reserved};
	frame_put_hdr(b, &h);
	CHECK(send(fd, b, sizeof(b), MSG_NOSIGNAL) == (ssize_t)sizeof(b));
}

static void send_window(int fd, uint32_t stream, uint32_t n)
{
	uint8_t p[4];
	frame_put_u32(p, n);
	raw_send(fd, stream, FRAME_WINDOW, 0, p, sizeof(p));
}

static void send_request(int fd, uint32_t stream, const Shim__V1__Request *req)
{
	size_t n = shim__v1__request__get_packed_size(req);
	uint8_t *buf = malloc(n + 1);
	CHECK(buf != NULL);
	shim__v1__request__pack(req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
	free(buf);
}

static void request_info(int fd, uint32_t stream)
{
	Shim__V1__InfoRequest ir = SHIM__V1__INFO_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_INFO;
	req.info = &ir;
	send_request(fd, stream, &req);
}

/* Frames until one of type `type` on stream `stream` (others of other streams, WINDOWs
 * and PINGs, which are answered, are skipped). The caller frees *p. */
static void wait_frame(int fd, uint32_t stream, uint8_t type, struct frame_hdr *h, uint8_t **p, unsigned ms)
{
	uint64_t deadline = it_now_ms() + ms;
	for (;;) {
		uint64_t now = it_now_ms();
		CHECKF(now < deadline, "no %s on stream %u within %u ms", frame_type_name(type), stream, ms);
		CHECKF(raw_recv(fd, h, p, (unsigned)(deadline - now)) == 1, "EOF while waiting for %s on stream %u",
		       frame_type_name(type), stream);
		if (h->type == type && h->stream == stream)
			return;
		CHECKF(h->type != FRAME_ERROR, "got ERROR on stream %u while waiting for %s on stream %u", h->stream,
		       frame_type_name(type), stream);
		if (h->type == FRAME_PING)
			raw_send(fd, 0, FRAME_PONG, 0, *p, h->len);
		free(*p);
	}
}

/* The next ERROR on stream must carry the errno of the spec's row for pattern and
 * exactly msg. */
static void expect_error(int fd, uint32_t stream, const char *pattern, const char *msg)
{
	int want = spec_errno(pattern, msg);
	struct frame_hdr h;
	uint8_t *p;
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		CHECKF(raw_recv(fd, &h, &p, (unsigned)(deadline - it_now_ms())) == 1, "EOF instead of ERROR '%s'", msg);
		if (h.type == FRAME_ERROR && (h.stream == stream || h.stream == 0))
			break;
		free(p);
	}
	CHECKF(h.stream == stream, "ERROR on stream %u, want stream %u ('%s')", h.stream, stream, msg);
	char got[256];
	int code = raw_error_code(p, h.len, got, sizeof(got));
	free(p);
	CHECKF(code == want && strcmp(got, msg) == 0, "got errno %d '%s', want %d '%s'", code, got, want, msg);
}

/* Connection-level: ERROR on stream 0, then EOF. Closes fd. */
static void expect_refusal(int fd, const char *pattern, const char *msg)
{
	expect_error(fd, 0, pattern, msg);
	struct frame_hdr h;
	uint8_t *p = NULL;
	CHECKF(raw_recv(fd, &h, &p, 5000) == 0, "a %s frame after the connection-level ERROR", frame_type_name(h.type));
	close(fd);
}

/* ---- §9 connection level, §5 refusals, §9 stream level ---- */

static void echo_on(int fd, uint32_t stream)
{
	raw_request_echo(fd, stream);
}

static void conn_errors(const char *sock)
{
	int fd = ready(sock, 0);
	send_header(fd, FRAME_DEFAULT_MAX + 1, 1, FRAME_DATA, 0, 0);
	expect_refusal(fd, "frame of N bytes exceeds the limit of M",
		       "frame of 1048577 bytes exceeds the limit of 1048576");

	fd = ready(sock, 0);
	send_header(fd, 0, 0, 0, 0, 0);
	expect_refusal(fd, "malformed frame header (type T, reserved R)",
		       "malformed frame header (type 0, reserved 0)");
	fd = ready(sock, 0);
	send_header(fd, 0, 0, FRAME_PING, 0, 1);
	expect_refusal(fd, "malformed frame header (type T, reserved R)",
		       "malformed frame header (type 10, reserved 1)");

	/* refused from the header: the 100 bytes it announces never come */
	fd = ready(sock, 0);
	send_header(fd, 100, 1, 12, 0, 0);
	expect_refusal(fd, "unknown frame type T", "unknown frame type 12");

	static const uint8_t forbidden[] = {FRAME_HELLO_OK, FRAME_EVENT, FRAME_END, FRAME_ERROR};
	for (size_t i = 0; i < sizeof(forbidden); i++) {
		char msg[100];
		snprintf(msg, sizeof(msg), "frame type %s may not be sent by a client", frame_type_name(forbidden[i]));
		fd = ready(sock, 0);
		raw_send(fd, forbidden[i] == FRAME_HELLO_OK ? 0 : 1, forbidden[i], 0, NULL, 0);
		expect_refusal(fd, "frame type T may not be sent by a client", msg);
	}
	fd = ready(sock, 0);
	send_hello(fd, NULL, 0, 0);
	expect_refusal(fd, "HELLO sent twice", "HELLO sent twice");

	fd = ready(sock, 0);
	echo_on(fd, 1);
	uint8_t w[4];
	frame_put_u32(w, 10);
	raw_send(fd, 1, FRAME_WINDOW, FRAME_FLAG_FIN, w, 4);
	expect_refusal(fd, "reserved flags F on a T frame", "reserved flags 0x01 on a WINDOW frame");
	fd = ready(sock, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_DATA, FRAME_FLAG_STDERR, "x", 1);
	expect_refusal(fd, "reserved flags F on a T frame", "reserved flags 0x02 on a DATA frame");

	fd = ready(sock, 0);
	echo_on(fd, 2);
	expect_refusal(fd, "even stream id N", "even stream id 2");
	fd = ready(sock, 0);
	echo_on(fd, 3);
	echo_on(fd, 1);
	expect_refusal(fd, "stream id N reused", "stream id 1 reused");
	fd = ready(sock, 0);
	raw_send(fd, 7, FRAME_DATA, 0, "x", 1);
	expect_refusal(fd, "T for unknown stream N", "DATA for unknown stream 7");

	fd = ready(sock, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_WINDOW, 0, w, 3);
	expect_refusal(fd, "WINDOW payload of N bytes (must be 4)", "WINDOW payload of 3 bytes (must be 4)");
	fd = ready(sock, 0);
	echo_on(fd, 1);
	send_window(fd, 1, 0);
	expect_refusal(fd, "WINDOW of 0 on stream N", "WINDOW of 0 on stream 1");
	fd = ready(sock, 0);
	echo_on(fd, 1);
	send_window(fd, 1, 0x7fffffff);
	expect_refusal(fd, "WINDOW overflows the credit of stream N", "WINDOW overflows the credit of stream 1");

	fd = ready(sock, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_PING, 0, "p", 1);
	expect_refusal(fd, "T on stream N (must be 0)", "PING on stream 1 (must be 0)");
	fd = ready(sock, 0);
	raw_send(fd, 5, FRAME_PONG, 0, "p", 1);
	expect_refusal(fd, "T on stream N (must be 0)", "PONG on stream 5 (must be 0)");
	uint8_t big[FRAME_PING_MAX + 1] = {0};
	fd = ready(sock, 0);
	raw_send(fd, 0, FRAME_PING, 0, big, sizeof(big));
	expect_refusal(fd, "T payload of N bytes (limit 64)", "PING payload of 65 bytes (limit 64)");
	fd = ready(sock, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_CANCEL, 0, "xy", 2);
	expect_refusal(fd, "CANCEL payload of N bytes (must be empty)", "CANCEL payload of 2 bytes (must be empty)");

	/* one byte more than the shim's initial window (256 KiB) */
	size_t n = FRAME_DEFAULT_WINDOW + 1;
	uint8_t *data = calloc(1, n);
	CHECK(data != NULL);
	fd = ready(sock, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_DATA, 0, data, n);
	expect_refusal(fd, "flow control violated on stream N", "flow control violated on stream 1");
	/* the echo cannot send more than the client's 4 KiB of credit, so the stream is
	 * still open after the client's FIN */
	fd = ready(sock, 4096);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_DATA, 0, data, 100000);
	raw_send(fd, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	raw_send(fd, 1, FRAME_DATA, 0, "x", 1);
	expect_refusal(fd, "DATA after FIN on stream N", "DATA after FIN on stream 1");
	free(data);

	/* a PING cut short, then the write side shut: the ERROR is still read */
	fd = ready(sock, 0);
	send_header(fd, 10, 0, FRAME_PING, 0, 0);
	CHECK(send(fd, "abc", 3, MSG_NOSIGNAL) == 3);
	CHECK(shutdown(fd, SHUT_WR) == 0);
	expect_refusal(fd, "connection closed in the middle of a frame", "connection closed in the middle of a frame");
}

static void refusals(const char *sock)
{
	int fd = raw_connect_unix(sock);
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = 2;
	uint8_t buf[FRAME_HELLO_MAX + 1];
	size_t n = shim__v1__hello__pack(&m, buf);
	raw_send(fd, 0, FRAME_HELLO, 0, buf, n);
	expect_refusal(fd, "protocol version N not supported (this shim speaks 1)",
		       "protocol version 2 not supported (this shim speaks 1)");

	fd = raw_connect_unix(sock);
	raw_send(fd, 0, FRAME_PING, 0, "hi", 2);
	expect_refusal(fd, "expected HELLO, got T", "expected HELLO, got PING");
	fd = raw_connect_unix(sock);
	m.protocol_version = 1;
	n = shim__v1__hello__pack(&m, buf);
	raw_send(fd, 1, FRAME_HELLO, 0, buf, n);
	expect_refusal(fd, "HELLO on stream N (must be 0)", "HELLO on stream 1 (must be 0)");
	fd = raw_connect_unix(sock);
	send_header(fd, FRAME_HELLO_MAX + 1, 0, FRAME_HELLO, 0, 0);
	expect_refusal(fd, "frame of N bytes exceeds the limit of 65536",
		       "frame of 65537 bytes exceeds the limit of 65536");
	/* client_name only: protocol_version left out */
	fd = raw_connect_unix(sock);
	raw_send(fd, 0, FRAME_HELLO, 0, (const uint8_t[]){0x12, 0x01, 'x'}, 3);
	expect_refusal(fd, "cannot decode Hello: ...",
		       "cannot decode Hello: missing required field Hello.protocol_version");
	/* nothing at all: the handshake deadline (1 s here) */
	uint64_t t0 = it_now_ms();
	fd = raw_connect_unix(sock);
	expect_refusal(fd, "no HELLO within S s", "no HELLO within 1 s");
	uint64_t ms = it_now_ms() - t0;
	CHECKF(ms >= 900, "refused after %llu ms, before the deadline", (unsigned long long)ms);
}

static void refusals_limits(void)
{
	/* one connection allowed */
	const char *sock = it_path("one");
	it_daemon_start("one", "--listen", it_unix_target(sock), "--max-connections", "1", NULL);
	int held = ready(sock, 0);
	int fd = raw_connect_unix(sock);
	/* checked at HELLO: the admitted budget */
	send_hello(fd, NULL, 0, 0);
	expect_refusal(fd, "too many connections (limit N)", "too many connections (limit 1)");
	close(held);

	/* one connection before HELLO per listener (on a unix socket the budget is as large as
	 * --max-connections: both 1 here) */
	sock = it_path("pend");
	it_daemon_start("pend", "--listen", it_unix_target(sock), "--max-pending", "1", "--max-connections", "1", NULL);
	held = raw_connect_unix(sock);
	fd = raw_connect_unix(sock);
	expect_refusal(fd, "too many connections before HELLO on this listener (limit N)",
		       "too many connections before HELLO on this listener (limit 1)");
	close(held);

	/* another uid only */
	sock = it_path("uid");
	it_daemon_start("uid", "--listen", it_unix_target(sock), "--allow-uid", "4242", NULL);
	char msg[64];
	snprintf(msg, sizeof(msg), "peer uid %u not allowed", (unsigned)getuid());
	CHECK(getuid() != 4242);
	fd = raw_connect_unix(sock);
	expect_refusal(fd, "peer uid U not allowed", msg);

	/* a token */
	sock = it_path("tok");
	const char *tok = it_path("token");
	it_write_file(tok, "s3cret\n");
	it_daemon_start("tok", "--listen", it_unix_target(sock), "--token-file", tok, NULL);
	fd = raw_connect_unix(sock);
	send_hello(fd, NULL, 0, 0);
	expect_refusal(fd, "token required", "token required");
	fd = raw_connect_unix(sock);
	send_hello(fd, "s3cret!", 7, 0);
	expect_refusal(fd, "bad token", "bad token");
}

static void stream_errors(const char *sock)
{
	int fd = ready(sock, 0);
	/* an echo in flight throughout: stream errors leave it alone */
	struct frame_hdr h;
	uint8_t *p;
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_DATA, 0, "abc", 3);
	wait_frame(fd, 1, FRAME_DATA, &h, &p, 5000);
	CHECK(h.len == 3 && memcmp(p, "abc", 3) == 0);
	free(p);

	/* stat (field 10) without its path */
	raw_send(fd, 3, FRAME_REQUEST, 0, (const uint8_t[]){0x52, 0x00}, 2);
	expect_error(fd, 3, "cannot decode Request: ...",
		     "cannot decode Request: missing required field StatRequest.path (in stat)");
	/* restore (field 61) with mode 7 */
	raw_send(fd, 5, FRAME_REQUEST, 0, (const uint8_t[]){0xea, 0x03, 0x05, 0x0a, 0x01, '/', 0x10, 0x07}, 8);
	expect_error(fd, 5, "M.F: unknown value N (in ...)", "RestoreRequest.mode: unknown value 7 (in restore)");
	raw_send(fd, 7, FRAME_REQUEST, 0, NULL, 0);
	expect_error(fd, 7, "unknown request kind", "unknown request kind");

	/* --max-streams 2: the echo and a watch, then a third */
	Shim__V1__WatchRequest wr = SHIM__V1__WATCH_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)it_dir();
	wr.path.len = strlen(it_dir());
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WATCH;
	req.watch = &wr;
	send_request(fd, 9, &req);
	request_info(fd, 11);
	expect_error(fd, 11, "too many streams in flight (limit N)", "too many streams in flight (limit 2)");
	raw_send(fd, 9, FRAME_DATA, 0, "x", 1);
	expect_error(fd, 9, "this request takes no data", "this request takes no data");

	/* the echo still works, and ends with a CANCEL */
	raw_send(fd, 1, FRAME_DATA, 0, "def", 3);
	wait_frame(fd, 1, FRAME_DATA, &h, &p, 5000);
	CHECK(h.len == 3 && memcmp(p, "def", 3) == 0);
	free(p);
	raw_send(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	expect_error(fd, 1, "cancelled", "cancelled");
	close(fd);

	/* shutdown: a stream in flight ends with ECANCELED */
	const char *s2 = it_path("down");
	struct it_daemon *d = it_daemon_start("down", "--listen", it_unix_target(s2), NULL);
	fd = ready(s2, 0);
	echo_on(fd, 1);
	raw_send(fd, 1, FRAME_DATA, 0, "abc", 3);
	wait_frame(fd, 1, FRAME_DATA, &h, &p, 5000);
	free(p);
	CHECK(kill(d->pid, SIGTERM) == 0);
	expect_error(fd, 1, "shim shutting down", "shim shutting down");
	close(fd);
}

static int case_errors(void)
{
	load_spec();
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--handshake-timeout", "1", "--max-streams", "2",
			NULL);
	conn_errors(sock);
	refusals(sock);
	refusals_limits();
	stream_errors(sock);
	spec_all_checked();
	/* the daemon served all of that: it still does */
	int fd = ready(sock, 0);
	request_info(fd, 1);
	struct frame_hdr h;
	uint8_t *p;
	wait_frame(fd, 1, FRAME_END, &h, &p, 5000);
	free(p);
	close(fd);
	printf("%u messages of PROTOCOL.md 5 and 9 checked\n", n_rows);
	return 0;
}

/* ---- the handshake ---- */

/* Nothing arrives on fd within ms. */
static void expect_nothing(int fd, int ms)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	int r = poll(&pf, 1, ms);
	CHECKF(r == 0, "the shim sent something (or closed) within %d ms", ms);
}

static int case_handshake(void)
{
	/* the deadline holds with the keepalive off */
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--keepalive", "0", "--handshake-timeout", "1", NULL);
	uint64_t t0 = it_now_ms();
	int silent = raw_connect_unix(sock);
	/* a client that speaks in time stays, well past the deadline */
	int slow = raw_connect_unix(sock);
	it_sleep_ms(300);
	send_hello(slow, NULL, 0, 0);
	expect_hello_ok(slow);
	expect_refusal(silent, "no HELLO within S s", "no HELLO within 1 s");
	uint64_t ms = it_now_ms() - t0;
	printf("a client that never spoke was refused after %llu ms\n", (unsigned long long)ms);
	CHECK(ms >= 900 && ms < 5000);
	expect_nothing(slow, 700);
	request_info(slow, 1);
	struct frame_hdr h;
	uint8_t *p;
	wait_frame(slow, 1, FRAME_END, &h, &p, 5000);
	free(p);
	close(slow);

	/* no PING before HELLO_OK, though the keepalive is short */
	const char *s2 = it_path("k");
	it_daemon_start("k", "--listen", it_unix_target(s2), "--keepalive", "0.3", "--handshake-timeout", "5", NULL);
	int fd = raw_connect_unix(s2);
	expect_nothing(fd, 1000);
	send_hello(fd, NULL, 0, 0);
	expect_hello_ok(fd);
	CHECKF(raw_recv(fd, &h, &p, 5000) == 1 && h.type == FRAME_PING, "no PING after HELLO_OK");
	free(p);
	close(fd);

	/* pipelined: a REQUEST right behind the HELLO, in the same write, is served */
	uint8_t out[512];
	size_t n = 0;
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = 1;
	uint8_t hp[64];
	size_t hn = shim__v1__hello__pack(&m, hp);
	Shim__V1__InfoRequest ir = SHIM__V1__INFO_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_INFO;
	req.info = &ir;
	uint8_t rp[64];
	size_t rn = shim__v1__request__pack(&req, rp);
	struct frame_hdr fh = {.len = (uint32_t)hn, .type = FRAME_HELLO};
	frame_put_hdr(out, &fh);
	memcpy(out + FRAME_HDR_LEN, hp, hn);
	n = FRAME_HDR_LEN + hn;
	fh = (struct frame_hdr){.len = (uint32_t)rn, .stream = 1, .type = FRAME_REQUEST};
	frame_put_hdr(out + n, &fh);
	memcpy(out + n + FRAME_HDR_LEN, rp, rn);
	n += FRAME_HDR_LEN + rn;
	fd = raw_connect_unix(sock);
	CHECK(send(fd, out, n, MSG_NOSIGNAL) == (ssize_t)n);
	expect_hello_ok(fd);
	CHECKF(raw_recv(fd, &h, &p, 5000) == 1 && h.type == FRAME_END && h.stream == 1,
	       "the pipelined REQUEST got %s on stream %u, want END on stream 1", frame_type_name(h.type), h.stream);
	free(p);
	close(fd);

	/* ... but not behind a refused HELLO */
	const char *s3 = it_path("t");
	const char *tok = it_path("token");
	it_write_file(tok, "right");
	it_daemon_start("t", "--listen", it_unix_target(s3), "--token-file", tok, NULL);
	fd = raw_connect_unix(s3);
	CHECK(send(fd, out, n, MSG_NOSIGNAL) == (ssize_t)n); /* no token */
	expect_refusal(fd, "token required", "token required");
	return 0;
}

/* ---- a pause across the keepalive ---- */

static char proc_state(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	CHECK(it_read_text(path, buf, sizeof(buf)) > 0);
	const char *close_paren = strrchr(buf, ')');
	CHECK(close_paren != NULL && close_paren[1] == ' ');
	return close_paren[2];
}

static void wait_state(pid_t pid, char want)
{
	uint64_t deadline = it_now_ms() + 5000;
	while (proc_state(pid) != want) {
		CHECKF(it_now_ms() < deadline, "the daemon's state is %c, want %c", proc_state(pid), want);
		it_sleep_ms(2);
	}
}

/* The daemon is stopped right after it sent a keepalive PING; the client answers at
 * once, and the PONG waits in the socket while the keepalive period passes twice.
 * After SIGCONT the client must stay connected and be served. */
static int case_pause(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--keepalive", "1", NULL);
	int fd = ready(sock, 0);
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 5000) == 1 && h.type == FRAME_PING, "no keepalive PING");
	CHECK(kill(d->pid, SIGSTOP) == 0);
	wait_state(d->pid, 'T');
	raw_send(fd, 0, FRAME_PONG, 0, p, h.len);
	free(p);
	/* stopped for 2.5 keepalive periods: its timer is long due when it runs again */
	it_sleep_ms(2500);
	CHECK(kill(d->pid, SIGCONT) == 0);
	request_info(fd, 1);
	wait_frame(fd, 1, FRAME_END, &h, &p, 5000);
	free(p);
	/* and it stays: a keepalive round later it still answers */
	it_sleep_ms(1200);
	request_info(fd, 3);
	wait_frame(fd, 3, FRAME_END, &h, &p, 5000);
	free(p);
	char *log = it_daemon_log(d);
	CHECKF(strstr(log, "no answer to keepalive PING") == NULL, "the daemon dropped a client after the pause");
	free(log);
	close(fd);
	return 0;
}

/* ---- the token file ---- */

static void token_ok(const char *sock, const char *tok, size_t len, bool ok)
{
	int fd = raw_connect_unix(sock);
	send_hello(fd, tok, len, 0);
	if (ok)
		expect_hello_ok(fd);
	else
		expect_refusal(fd, "bad token", "bad token");
	close(fd);
}

/* PROTOCOL.md 14: the token is the file's bytes with trailing newlines, CRs, spaces and
 * tabs removed (only at the end); any other bytes are the token's, NUL included. */
static int case_token_file(void)
{
	const char *tok = it_path("token");
	FILE *f = fopen(tok, "w");
	CHECK(f != NULL);
	fwrite("  a\0b c \t\r\n\n", 1, 12, f);
	fclose(f);
	CHECK(chmod(tok, 0600) == 0);
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--token-file", tok, NULL);
	token_ok(sock, "  a\0b c", 7, true);
	token_ok(sock, "  a\0b c \t\r\n\n", 12, false);
	token_ok(sock, "  a\0b c\n", 8, false);
	token_ok(sock, "a\0b c", 5, false);

	/* only whitespace: no token, the daemon does not start */
	it_write_file(tok, " \n");
	const char *const argv[] = {SHIM_BIN, "--listen", it_unix_target(it_path("s2")), "--token-file", tok, NULL};
	struct it_daemon *d = it_daemon_spawn_argv("empty", argv);
	CHECK(it_daemon_wait_exit(d, 5000));
	CHECK(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 1);
	it_daemon_wait_log(d, "the token must be 1 to 4095 bytes", 1000);
	return 0;
}

/* ---- restore's window (PROTOCOL.md 12.3) ---- */

static void restore_on(int fd, uint32_t stream, const char *dir)
{
	Shim__V1__RestoreRequest rr = SHIM__V1__RESTORE_REQUEST__INIT;
	rr.dir.data = (uint8_t *)(uintptr_t)dir;
	rr.dir.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESTORE;
	req.restore = &rr;
	send_request(fd, stream, &req);
}

static int case_restore_window(void)
{
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	int fd = ready(sock, 0);
	struct frame_hdr h;
	uint8_t *p;
	/* the first: 16 MiB of credit at once (its initial 256 KiB and one WINDOW) */
	restore_on(fd, 1, it_path("a"));
	wait_frame(fd, 1, FRAME_WINDOW, &h, &p, 5000);
	CHECK_EQ(frame_get_u32(p), (16u << 20) - FRAME_DEFAULT_WINDOW);
	free(p);
	/* one more while it runs: 4 MiB */
	restore_on(fd, 3, it_path("b"));
	wait_frame(fd, 3, FRAME_WINDOW, &h, &p, 5000);
	CHECK_EQ(frame_get_u32(p), (4u << 20) - FRAME_DEFAULT_WINDOW);
	free(p);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"errors", case_errors},         {"handshake", case_handshake},           {"pause", case_pause},
		{"token_file", case_token_file}, {"restore_window", case_restore_window},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
