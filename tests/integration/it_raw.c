/* it_raw.c: clients that vanish mid-stream, SIGTERM with streams in flight, and the shim keeping
 * to a small credit, watched at the frame level. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

/* The echo's paths through the daemon, at the frame level: bytes written straight back
 * from its input with their WINDOW (an idle output), queued behind a socket the client
 * does not read (the shim's writes come short, the rest of a frame is queued), kept in
 * its buffer when the output is full; frames of every size, and frames that arrive in
 * pieces (the input kept in place across reads). Every byte comes back in order, the
 * WINDOWs hand back exactly the credit used, and the END counts them all. (The client
 * gives back the credit of what it read, keeping the daemon's at one window.) */
static int case_echo_paths(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	int r = raw_connect_unix(sock);
	raw_hello(r, NULL);
	raw_request_echo(r, 1);
	static uint8_t buf[256 << 10];
	it_fill(buf, sizeof(buf), 21);
	uint64_t total = 0;

	/* 1: one frame at a time, read back at once (the output idle: written straight) */
	static const size_t one[] = {1, 4095, 4096, 65536, 12, 65535, 3};
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++) {
		raw_send(r, 1, FRAME_DATA, 0, buf, one[i]);
		read_echo(r, 1, buf, one[i]);
		send_window(r, 1, (uint32_t)one[i]);
		total += one[i];
	}

	/* 2: the whole window of four echo streams sent unread, more than the daemon's
	 * socket holds: its writes come short or not at all, the rest of a frame waits in
	 * its output, DATA is queued behind it and the rest in the echo buffers */
	enum { NS = 4 };
	static const size_t sizes[] = {65536, 1, 30000, 65536, 7, 65536};
	size_t each = 0;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		each += sizes[i];
	CHECK(each <= sizeof(buf));
	for (uint32_t k = 1; k < NS; k++)
		raw_request_echo(r, 1 + 2 * k);
	for (size_t i = 0, off = 0; i < sizeof(sizes) / sizeof(sizes[0]); off += sizes[i++])
		for (uint32_t k = 0; k < NS; k++)
			raw_send(r, 1 + 2 * k, FRAME_DATA, 0, buf + off, sizes[i]);
	size_t got[NS] = {0}, granted[NS] = {0};
	for (;;) {
		bool all = true;
		for (uint32_t k = 0; k < NS; k++)
			all = all && got[k] == each && granted[k] == each;
		if (all)
			break;
		struct frame_hdr fh;
		uint8_t *fp;
		CHECKF(raw_recv(r, &fh, &fp, 5000) == 1, "EOF while reading the echoes");
		uint32_t k = (fh.stream - 1) / 2;
		CHECKF(fh.stream % 2 == 1 && k < NS, "a frame on stream %u", fh.stream);
		if (fh.type == FRAME_DATA) {
			CHECK(got[k] + fh.len <= each);
			CHECK(memcmp(fp, buf + got[k], fh.len) == 0);
			got[k] += fh.len;
		} else {
			CHECKF(fh.type == FRAME_WINDOW && fh.len == 4, "unexpected %s frame", frame_type_name(fh.type));
			granted[k] += frame_get_u32(fp);
			CHECK(granted[k] <= got[k]);
		}
		free(fp);
	}
	for (uint32_t k = 0; k < NS; k++)
		send_window(r, 1 + 2 * k, (uint32_t)each);
	total += each;

	/* 3: frames in pieces: a header alone, a payload cut anywhere, two frames in one
	 * write with the second cut short; an info call between the pieces lets the
	 * daemon read each piece on its own */
	static uint8_t wire[2 * (FRAME_HDR_LEN + 40000)];
	struct frame_hdr h = {.len = 40000, .stream = 1, .type = FRAME_DATA};
	frame_put_hdr(wire, &h);
	memcpy(wire + FRAME_HDR_LEN, buf, 40000);
	frame_put_hdr(wire + FRAME_HDR_LEN + 40000, &h);
	memcpy(wire + 2 * FRAME_HDR_LEN + 40000, buf + 40000, 40000);
	static const size_t cuts[] = {5, FRAME_HDR_LEN, 1000, 30000, 40000 + FRAME_HDR_LEN + 100, sizeof(wire)};
	size_t at = 0;
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		raw_send_bytes(r, wire + at, cuts[i] - at);
		at = cuts[i];
		info_of(c);
	}
	read_echo(r, 1, buf, 80000);
	total += 80000;

	/* the end: FIN, the FIN echoed, END with the count */
	raw_send(r, 1, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
	uint8_t *p;
	CHECK(raw_recv(r, &h, &p, 5000) == 1);
	CHECKF(h.type == FRAME_DATA && h.stream == 1 && h.len == 0 && (h.flags & FRAME_FLAG_FIN),
	       "got %s (%u bytes, flags %#x) instead of the FIN", frame_type_name(h.type), h.len, h.flags);
	free(p);
	CHECK(raw_recv(r, &h, &p, 5000) == 1);
	CHECKF(h.type == FRAME_END && h.stream == 1, "got %s instead of END", frame_type_name(h.type));
	Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, p);
	CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_ECHO);
	CHECK_EQ(res->echo->bytes, total);
	shim__v1__result__free_unpacked(res, NULL);
	free(p);

	close(r);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* An echo of up to 64 KiB goes out with its REQUEST in one write (REQUEST, DATA with
 * FIN): the exact bytes back on both sides of that limit, from threads sharing one
 * client (several such pairs in one read of the daemon), and the connection alive. */
struct whole_echo {
	struct sbx_client *c;
	int id, rc;
	struct sbx_error err;
};

static const size_t whole_echo_sizes[] = {0, 1, 100, 4096, 65535, 65536, 65537, 200000};

static void *whole_echo_thread(void *arg)
{
	struct whole_echo *w = arg;
	static __thread uint8_t in[200000], out[200000];
	size_t nsizes = sizeof(whole_echo_sizes) / sizeof(whole_echo_sizes[0]);
	for (int i = 0; i < 64 && w->rc == 0; i++) {
		size_t len = whole_echo_sizes[(size_t)(i + w->id) % nsizes];
		it_fill(in, len, (uint64_t)w->id * 100 + (uint64_t)i);
		memset(out, 0xee, len);
		w->rc = sbx_echo(w->c, NULL, in, len, out, &w->err);
		if (w->rc == 0 && memcmp(in, out, len) != 0) {
			w->rc = -1;
			snprintf(w->err.message, sizeof(w->err.message), "echo %d of %zu bytes came back different", i,
				 len);
		}
	}
	return NULL;
}

static int case_echo_whole(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct whole_echo w[4];
	pthread_t th[4];
	for (int t = 0; t < 4; t++) {
		w[t] = (struct whole_echo){.c = c, .id = t};
		CHECK(pthread_create(&th[t], NULL, whole_echo_thread, &w[t]) == 0);
	}
	for (int t = 0; t < 4; t++) {
		CHECK(pthread_join(th[t], NULL) == 0);
		CHECKF(w[t].rc == 0, "thread %d: %s", t, w[t].err.message);
	}
	uint8_t one[3] = {1, 2, 3}, back[3] = {0};
	struct sbx_error err;
	CHECK_SBX(sbx_echo(c, NULL, one, sizeof(one), back, &err), &err);
	CHECK(memcmp(one, back, sizeof(one)) == 0);
	sbx_client_close(c);
	it_daemon_stop(d);
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
		{"echo_paths", case_echo_paths},
		{"echo_whole", case_echo_whole},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
