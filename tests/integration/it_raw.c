/* it_raw.c: clients that vanish mid-stream, SIGTERM with streams in flight, and the shim keeping
 * to a small credit, watched at the frame level. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sbx_info info_of(struct sbx_client *c)
{
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	return in;
}

/* Wait until the daemon counts these connections and streams (an info call is one
 * of the streams). */
static void wait_counts(struct sbx_client *c, unsigned conns, unsigned streams)
{
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		struct sbx_info in = info_of(c);
		if (in.connections == conns && in.streams == streams)
			return;
		CHECKF(it_now_ms() < deadline, "daemon counts %u connections and %u streams, want %u and %u",
		       in.connections, in.streams, conns, streams);
		it_sleep_ms(5);
	}
}

/* Read the echo of n bytes on stream id: the DATA coming back, and the WINDOWs that
 * give back exactly the credit those bytes used. */
static void read_echo(int fd, uint32_t id, const uint8_t *want, size_t n)
{
	size_t got = 0, granted = 0;
	while (got < n || granted < n) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 5000) == 1, "EOF while reading the echo");
		CHECK_EQ(h.stream, id);
		if (h.type == FRAME_DATA) {
			CHECK(got + h.len <= n);
			CHECK(memcmp(p, want + got, h.len) == 0);
			got += h.len;
		} else {
			CHECKF(h.type == FRAME_WINDOW && h.len == 4, "unexpected %s frame", frame_type_name(h.type));
			granted += frame_get_u32(p);
			CHECK(granted <= got);
		}
		free(p);
	}
}

static int case_vanish(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	wait_counts(c, 1, 1);

	uint8_t buf[100000];
	it_fill(buf, sizeof(buf), 3);

	/* 1: vanishes between frames, with an echo stream open and its echo unread */
	int r1 = raw_connect_unix(sock);
	raw_hello(r1, NULL);
	raw_request_echo(r1, 1);
	raw_send(r1, 1, FRAME_DATA, 0, buf, sizeof(buf));
	/* 2: vanishes in the middle of a DATA frame on its open echo stream */
	int r2 = raw_connect_unix(sock);
	raw_hello(r2, NULL);
	raw_request_echo(r2, 1);
	raw_send(r2, 1, FRAME_DATA, 0, buf, 5000);
	read_echo(r2, 1, buf, 5000);
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = 4000, .stream = 1, .type = FRAME_DATA};
	frame_put_hdr(hdr, &h);
	CHECK(write(r2, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr));
	CHECK(write(r2, buf, 1000) == 1000);
	/* 3: vanishes right after its HELLO */
	int r3 = raw_connect_unix(sock);
	raw_hello(r3, NULL);

	wait_counts(c, 4, 3);
	close(r1);
	close(r2);
	close(r3);

	/* the daemon keeps serving, and is back to its baseline */
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	wait_counts(c, 1, 1);
	struct sbx_client *c2 = it_connect(it_unix_target(sock), NULL);
	uint8_t back[sizeof(buf)];
	CHECK_SBX(sbx_echo(c2, NULL, buf, sizeof(buf), back, &err), &err);
	CHECK(memcmp(buf, back, sizeof(buf)) == 0);
	sbx_client_close(c2);
	wait_counts(c, 1, 1);
	it_daemon_wait_log(d, "connection closed in the middle of a frame", 2000);
	sbx_client_close(c);
	return 0;
}

static int case_sigterm(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *a = it_connect(it_unix_target(sock), NULL);
	struct sbx_client *b = it_connect(it_unix_target(sock), NULL);
	int r = raw_connect_unix(sock);
	raw_hello(r, NULL);
	raw_request_echo(r, 1);
	uint8_t buf[1000];
	it_fill(buf, sizeof(buf), 9);
	raw_send(r, 1, FRAME_DATA, 0, buf, sizeof(buf));
	read_echo(r, 1, buf, sizeof(buf));
	wait_counts(a, 3, 2);

	uint64_t t0 = it_now_ms();
	CHECK(kill(d->pid, SIGTERM) == 0);

	/* the stream in flight ends with ERROR ECANCELED, then the connection closes */
	struct frame_hdr h;
	uint8_t *p;
	for (;;) {
		CHECKF(raw_recv(r, &h, &p, 5000) == 1, "EOF without an ERROR for the stream in flight");
		if (h.type != FRAME_WINDOW)
			break;
		free(p);
	}
	CHECKF(h.type == FRAME_ERROR && h.stream == 1, "got %s on stream %u, want ERROR on stream 1",
	       frame_type_name(h.type), h.stream);
	char msg[256];
	CHECK_EQ(raw_error_code(p, h.len, msg, sizeof(msg)), ECANCELED);
	CHECK_CONTAINS(msg, "shutting down");
	free(p);
	CHECKF(raw_recv(r, &h, &p, 5000) == 0, "got %s after the ERROR, want EOF", frame_type_name(h.type));
	close(r);

	/* the daemon exits 0 within 2 s and removes its socket */
	CHECKF(it_daemon_wait_exit(d, 2000), "the daemon still runs 2 s after SIGTERM");
	uint64_t ms = it_now_ms() - t0;
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 0, "exit status 0x%x, want 0", d->status);
	printf("daemon exited %llu ms after SIGTERM\n", (unsigned long long)ms);
	struct stat st;
	CHECKF(lstat(sock, &st) < 0 && errno == ENOENT, "the socket file is still there");

	/* the idle clients see their connections closed: on a call, and from the event loop */
	struct sbx_error err;
	CHECK(sbx_ping(a, NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNRESET);
	struct pollfd pf = {.fd = sbx_client_fd(b), .events = POLLIN};
	CHECK(poll(&pf, 1, 2000) == 1);
	CHECK(sbx_client_process(b, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNRESET);
	sbx_client_close(a);
	sbx_client_close(b);
	return 0;
}

/* ---- the shim keeps to the client's credit (PROTOCOL.md 8) ----
 *
 * A client that grants 4 KiB (Hello.initial_window 4096, the least the shim honours) must
 * get exactly 4 KiB of DATA on a stream that has more to send, then nothing until its next
 * WINDOW: for read, list, watch, backup and exec output. */

#define CREDIT 4096u
/* How long "nothing more" is watched for: a shim that ignored the credit would have
 * sent the next bytes within this, as they are ready (the one fixed wait of these tests). */
#define QUIET_MS 300

/* A raw connection that grants `window` per stream. */
static int connect_window(const char *sock, uint32_t window)
{
	int fd = raw_connect_unix(sock);
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = SHIM_PROTOCOL_VERSION;
	m.client_name = (char *)"it_raw credit";
	m.has_initial_window = 1;
	m.initial_window = window;
	uint8_t buf[256];
	size_t n = shim__v1__hello__get_packed_size(&m);
	CHECK(n <= sizeof(buf));
	shim__v1__hello__pack(&m, buf);
	raw_send(fd, 0, FRAME_HELLO, 0, buf, n);
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 10000) == 1 && h.type == FRAME_HELLO_OK, "no HELLO_OK");
	free(p);
	return fd;
}

static void send_request(int fd, uint32_t stream, const Shim__V1__Request *req)
{
	size_t n = shim__v1__request__get_packed_size(req);
	uint8_t *buf = malloc(n);
	CHECK(buf != NULL);
	shim__v1__request__pack(req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
	free(buf);
}

static void send_window(int fd, uint32_t stream, uint32_t n)
{
	uint8_t p[4];
	frame_put_u32(p, n);
	raw_send(fd, stream, FRAME_WINDOW, 0, p, sizeof(p));
}

/* The DATA of a stream, as it came. */
struct got {
	uint8_t *buf;
	size_t len, cap;
};

static void got_add(struct got *g, const uint8_t *p, size_t n)
{
	if (g->len + n > g->cap) {
		g->cap = (g->len + n) * 2;
		g->buf = realloc(g->buf, g->cap);
		CHECK(g->buf != NULL);
	}
	memcpy(g->buf + g->len, p, n);
	g->len += n;
}

/* The next frame, which must be for stream id; DATA is added to g. The caller frees *p. */
static int recv_on(int fd, uint32_t id, struct got *g, struct frame_hdr *h, uint8_t **p, unsigned timeout_ms)
{
	CHECKF(raw_recv(fd, h, p, timeout_ms) == 1, "EOF on stream %u", id);
	CHECKF(h->stream == id, "%s on stream %u, want stream %u", frame_type_name(h->type), h->stream, id);
	(*p)[h->len] = '\0';
	if (h->type == FRAME_DATA)
		got_add(g, *p, h->len);
	return h->type;
}

/* Exactly `credit` bytes of DATA on stream id (more: the shim overran the credit), then
 * nothing but EVENTs (which use no credit) for QUIET_MS. */
static void expect_exactly(int fd, uint32_t id, size_t credit, struct got *g, const char *what)
{
	size_t got = 0;
	struct frame_hdr h;
	uint8_t *p;
	while (got < credit) {
		int type = recv_on(fd, id, g, &h, &p, 10000);
		free(p);
		if (type == FRAME_EVENT)
			continue;
		CHECKF(type == FRAME_DATA && h.len > 0, "%s: %s after %zu of %zu bytes of credit, with more to send",
		       what, frame_type_name(type), got, credit);
		got += h.len;
		CHECKF(got <= credit, "%s: the shim sent %zu bytes of DATA with %zu of credit", what, got, credit);
	}
	uint64_t deadline = it_now_ms() + QUIET_MS;
	for (;;) {
		uint64_t now = it_now_ms();
		if (now >= deadline)
			break;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int r = poll(&pf, 1, (int)(deadline - now));
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r >= 0);
		if (r == 0)
			break;
		int type = recv_on(fd, id, g, &h, &p, 10000);
		free(p);
		if (type == FRAME_EVENT)
			continue;
		CHECKF(type != FRAME_DATA || h.len == 0, "%s: %u more bytes of DATA came with no credit left", what,
		       h.len);
		CHECKF(false, "%s: %s with no credit left and more to send", what,
		       type == FRAME_DATA ? "DATA FIN" : frame_type_name(type));
	}
}

/* Both rounds: CREDIT bytes, a WINDOW of CREDIT, CREDIT bytes more. */
static void two_rounds(int fd, uint32_t id, struct got *g, const char *what)
{
	expect_exactly(fd, id, CREDIT, g, what);
	send_window(fd, id, CREDIT);
	expect_exactly(fd, id, CREDIT, g, what);
	printf("%s: %u bytes, nothing more for %d ms, %u more after a WINDOW of %u\n", what, CREDIT, QUIET_MS, CREDIT,
	       CREDIT);
}

/* Plenty of credit, then the rest of the stream up to END: its Result (caller frees). */
static Shim__V1__Result *drain_to_end(int fd, uint32_t id, struct got *g, const char *what)
{
	send_window(fd, id, 64u << 20);
	for (;;) {
		struct frame_hdr h;
		uint8_t *p;
		int type = recv_on(fd, id, g, &h, &p, 20000);
		if (type == FRAME_END) {
			Shim__V1__Result *r = shim__v1__result__unpack(NULL, h.len, p);
			free(p);
			CHECKF(r != NULL, "%s: undecodable END", what);
			return r;
		}
		if (type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(false, "%s: ERROR %d %s", what, code, msg);
		}
		free(p);
		CHECKF(type == FRAME_DATA || type == FRAME_EVENT, "%s: unexpected %s", what, frame_type_name(type));
	}
}

static struct it_daemon *credit_daemon(const char **sockp)
{
	const char *sock = it_path("s");
	struct it_daemon *d =
		it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	*sockp = sock;
	return d;
}

static void write_local(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, buf, len) == (ssize_t)len);
	close(fd);
}

static int case_credit_read(void)
{
	const char *sock;
	credit_daemon(&sock);
	size_t size = 64u << 10;
	uint8_t *data = malloc(size);
	CHECK(data != NULL);
	it_fill(data, size, 21);
	const char *path = it_path("f");
	write_local(path, data, size);

	int fd = connect_window(sock, CREDIT);
	Shim__V1__ReadRequest rr = SHIM__V1__READ_REQUEST__INIT;
	rr.path.data = (uint8_t *)(uintptr_t)path;
	rr.path.len = strlen(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READ;
	req.read = &rr;
	send_request(fd, 1, &req);
	struct got g = {0};
	two_rounds(fd, 1, &g, "read");
	shim__v1__result__free_unpacked(drain_to_end(fd, 1, &g, "read"), NULL);
	CHECKF(g.len == size && memcmp(g.buf, data, size) == 0, "read: %zu bytes, not the file's %zu", g.len, size);
	free(g.buf);
	free(data);
	close(fd);
	return 0;
}

static int case_credit_list(void)
{
	const char *sock;
	credit_daemon(&sock);
	const char *dir = it_path("d");
	CHECK(mkdir(dir, 0755) == 0);
	/* each entry's DirEntry (name and FileStat) is some 60 bytes: far more than 8 KiB */
	for (int i = 0; i < 500; i++) {
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/entry-with-a-longish-name-%04d", dir, i);
		write_local(p, "", 0);
	}
	int fd = connect_window(sock, CREDIT);
	Shim__V1__ListRequest lr = SHIM__V1__LIST_REQUEST__INIT;
	lr.path.data = (uint8_t *)(uintptr_t)dir;
	lr.path.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_LIST;
	req.list = &lr;
	send_request(fd, 1, &req);
	struct got g = {0};
	two_rounds(fd, 1, &g, "list");
	Shim__V1__Result *end = drain_to_end(fd, 1, &g, "list");
	CHECK(end->kind_case == SHIM__V1__RESULT__KIND_LIST);
	CHECK_EQ(end->list->entries, 500);
	shim__v1__result__free_unpacked(end, NULL);
	/* the whole listing came through: 500 delimited entries */
	unsigned entries = 0;
	for (size_t off = 0; off < g.len; entries++) {
		uint64_t len = 0;
		int shift = 0;
		while (off < g.len && (g.buf[off] & 0x80)) {
			len |= (uint64_t)(g.buf[off++] & 0x7f) << shift;
			shift += 7;
		}
		CHECK(off < g.len);
		len |= (uint64_t)g.buf[off++] << shift;
		CHECK(off + len <= g.len);
		off += len;
	}
	CHECK_EQ(entries, 500);
	free(g.buf);
	close(fd);
	return 0;
}

static int case_credit_watch(void)
{
	const char *sock;
	credit_daemon(&sock);
	const char *dir = it_path("w");
	CHECK(mkdir(dir, 0755) == 0);
	int fd = connect_window(sock, CREDIT);
	Shim__V1__WatchRequest wr = SHIM__V1__WATCH_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)dir;
	wr.path.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WATCH;
	req.watch = &wr;
	send_request(fd, 1, &req);
	/* the watch is live once an event comes: create probe files until one does */
	struct got g = {0};
	size_t got = 0;
	uint64_t deadline = it_now_ms() + 10000;
	for (int i = 0; got == 0; i++) {
		CHECKF(it_now_ms() < deadline, "watch: no event for the probe files");
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/probe-%d", dir, i);
		write_local(p, "", 0);
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, 50) == 1) {
			struct frame_hdr h;
			uint8_t *pl;
			int type = recv_on(fd, 1, &g, &h, &pl, 10000);
			free(pl);
			CHECKF(type == FRAME_DATA && h.len > 0, "watch: %s instead of an event", frame_type_name(type));
			got = h.len;
		}
	}
	/* then far more than 8 KiB of events (CREATE, MODIFY and CLOSE of each file, 50 bytes
	 * or more each), all of them queued in the shim before the credit runs out */
	for (int i = 0; i < 400; i++) {
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/event-with-a-longish-name-%04d", dir, i);
		write_local(p, "x", 1);
	}
	expect_exactly(fd, 1, CREDIT - got, &g, "watch");
	send_window(fd, 1, CREDIT);
	expect_exactly(fd, 1, CREDIT, &g, "watch");
	printf("watch: %u bytes, nothing more for %d ms, %u more after a WINDOW of %u\n", CREDIT, QUIET_MS, CREDIT,
	       CREDIT);
	/* cancelled: the stream ends with ECANCELED */
	raw_send(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	for (;;) {
		struct frame_hdr h;
		uint8_t *pl;
		int type = recv_on(fd, 1, &g, &h, &pl, 10000);
		char msg[256];
		int code = type == FRAME_ERROR ? raw_error_code(pl, h.len, msg, sizeof(msg)) : 0;
		free(pl);
		CHECKF(type != FRAME_DATA, "watch: DATA after the credit was used up and CANCEL sent");
		if (type == FRAME_ERROR) {
			CHECK_EQ(code, ECANCELED);
			break;
		}
	}
	free(g.buf);
	close(fd);
	return 0;
}

static int case_credit_backup(void)
{
	const char *sock;
	credit_daemon(&sock);
	const char *dir = it_path("b");
	CHECK(mkdir(dir, 0755) == 0);
	size_t size = 256u << 10;
	uint8_t *data = malloc(size);
	CHECK(data != NULL);
	it_fill(data, size, 22); /* (uncompressed anyway) */
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/file", dir);
	write_local(p, data, size);
	int fd = connect_window(sock, CREDIT);
	Shim__V1__BackupRequest br = SHIM__V1__BACKUP_REQUEST__INIT;
	br.dir.data = (uint8_t *)(uintptr_t)dir;
	br.dir.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_BACKUP;
	req.backup = &br;
	send_request(fd, 1, &req);
	struct got g = {0};
	two_rounds(fd, 1, &g, "backup");
	shim__v1__result__free_unpacked(drain_to_end(fd, 1, &g, "backup"), NULL);
	/* the archive holds the file: a tar stream larger than it */
	CHECKF(g.len > size, "backup: an archive of %zu bytes for a file of %zu", g.len, size);
	free(g.buf);
	free(data);
	close(fd);
	return 0;
}

static int case_credit_exec(void)
{
	const char *sock;
	credit_daemon(&sock);
	int fd = connect_window(sock, CREDIT);
	Shim__V1__ExecRequest er = SHIM__V1__EXEC_REQUEST__INIT;
	/* stdout and stderr share the stream's credit */
	const char *cmd = "head -c 100000 /dev/zero; head -c 100000 /dev/zero >&2";
	er.has_shell = 1;
	er.shell.data = (uint8_t *)(uintptr_t)cmd;
	er.shell.len = strlen(cmd);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_EXEC;
	req.exec = &er;
	send_request(fd, 1, &req);
	struct got g = {0};
	two_rounds(fd, 1, &g, "exec");
	Shim__V1__Result *end = drain_to_end(fd, 1, &g, "exec");
	CHECK(end->kind_case == SHIM__V1__RESULT__KIND_EXIT);
	CHECK_EQ(end->exit->exit_code, 0);
	shim__v1__result__free_unpacked(end, NULL);
	CHECK_EQ(g.len, 200000);
	free(g.buf);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"vanish", case_vanish},
		{"sigterm", case_sigterm},
		{"credit_read", case_credit_read},
		{"credit_list", case_credit_list},
		{"credit_watch", case_credit_watch},
		{"credit_backup", case_credit_backup},
		{"credit_exec", case_credit_exec},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
