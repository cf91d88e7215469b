/* it_fs_special.c: FIFOs, sockets and devices where the host reads and writes (issue 17, 6): refused unless
 * the request allows them, and an allowed one waits on the loop, never on a worker thread. The planted files
 * are made by nobody in a directory of nobody's, as a user inside the sandbox would. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define NOBODY 65534
#define MiB (1024u * 1024u)
#define NFIFOS 70
/* "immediately": a refusal, or a call on a fresh connection while the FIFOs wait. A
 * call queued behind 64 pool threads held by FIFOs would never come back. */
#define PROMPT_MS 2000u

#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

static long threads(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	CHECKF(f != NULL, "%s: %s", path, strerror(errno));
	long v = -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Threads:", 8) == 0)
			v = strtol(line + 8, NULL, 10);
	fclose(f);
	CHECK(v > 0);
	return v;
}

static bool have_setpriv(void)
{
	return geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0;
}

/* A directory of nobody's, 0755, in the case's temp dir (which nobody may then cross). */
static const char *nobody_dir(void)
{
	CHECK(chmod(it_dir(), 0711) == 0);
	const char *d = it_path("planted");
	CHECK(mkdir(d, 0755) == 0);
	CHECK(chown(d, NOBODY, NOBODY) == 0);
	return d;
}

/* mkfifo as nobody: names[i] = DIR/fifo-i, i < n. */
static void nobody_fifos(const char *dir, unsigned n, const char *prefix)
{
	char cmd[512];
	SPRINTF(cmd,
		"setpriv --reuid=%d --regid=%d --clear-groups sh -c 'i=0; while [ $i -lt %u ]; do mkfifo -m 0644 "
		"\"$0/%s-$i\" || exit 1; i=$((i+1)); done' '%s'",
		NOBODY, NOBODY, n, prefix, dir);
	CHECKF(system(cmd) == 0, "%s failed", cmd);
}

static const char *fifo_name(const char *dir, const char *prefix, unsigned i)
{
	static char buf[8][512];
	static unsigned slot;
	char *b = buf[slot++ % 8];
	snprintf(b, sizeof(buf[0]), "%s/%s-%u", dir, prefix, i);
	return b;
}

static struct it_daemon *start(const char *sock)
{
	return it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
}

/* ---- raw requests ---- */

static int connect_raw(const char *sock)
{
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	return fd;
}

static void send_request(int fd, uint32_t stream, const Shim__V1__Request *req)
{
	uint8_t buf[1024];
	size_t n = shim__v1__request__get_packed_size(req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

static void send_read(int fd, uint32_t stream, const char *path, bool allow)
{
	Shim__V1__ReadRequest rr = SHIM__V1__READ_REQUEST__INIT;
	rr.path.data = (uint8_t *)(uintptr_t)path;
	rr.path.len = strlen(path);
	rr.has_allow_special = allow;
	rr.allow_special = allow;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READ;
	req.read = &rr;
	send_request(fd, stream, &req);
}

/* A no_atomic write of data (sent with the request, FIN included). */
static void send_write(int fd, uint32_t stream, const char *path, const char *data)
{
	Shim__V1__WriteRequest wr = SHIM__V1__WRITE_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)path;
	wr.path.len = strlen(path);
	wr.has_no_atomic = wr.no_atomic = 1;
	wr.has_allow_special = wr.allow_special = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
	req.write = &wr;
	send_request(fd, stream, &req);
	raw_send(fd, stream, FRAME_DATA, FRAME_FLAG_FIN, data, strlen(data));
}

/* ---- a fresh client's calls, timed ---- */

struct lat {
	unsigned stat_ms, exec_ms, info_ms;
};

static struct lat calls(const char *sock, const char *path)
{
	struct lat l;
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_stat st = SBX_STAT_INIT;
	CHECK_SBX(sbx_stat(c, NULL, path, 0, &st, &err), &err);
	uint64_t t1 = it_now_ms();
	static const char *const argv[] = {"true", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	sbx_output_free(&out);
	CHECK_EQ(sbx_exit_status(&ex), 0);
	uint64_t t2 = it_now_ms();
	struct sbx_info info = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c, NULL, &info, &err), &err);
	uint64_t t3 = it_now_ms();
	sbx_client_close(c);
	l.stat_ms = (unsigned)(t1 - t0); /* with the connect and the handshake */
	l.exec_ms = (unsigned)(t2 - t1);
	l.info_ms = (unsigned)(t3 - t2);
	return l;
}

static unsigned lat_max(struct lat l)
{
	unsigned m = l.stat_ms > l.exec_ms ? l.stat_ms : l.exec_ms;
	return m > l.info_ms ? m : l.info_ms;
}

/* ---- the cases ---- */

struct membuf {
	uint8_t *p;
	size_t len, cap;
};

static int membuf_sink(void *ud, const void *buf, size_t len)
{
	struct membuf *m = ud;
	if (len > m->cap - m->len)
		return EFBIG;
	memcpy(m->p + m->len, buf, len);
	m->len += len;
	return 0;
}

/* Files of the temp dir whose names start with '.' (an atomic write's temp files). */
static unsigned count_hidden(const char *dir)
{
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

/* Each kind of special file without allow_special: read, write (atomic, no_atomic,
 * append) and truncate fail at once with EPERM naming the type, and the file is the
 * same file afterwards (type, mode, owner, inode), with no temp file beside it. */
static void refused_all(struct sbx_client *c, const char *path, const char *kind, const char *dir)
{
	struct stat before, after;
	CHECK(lstat(path, &before) == 0);
	struct sbx_error err;
	struct membuf m = {malloc(16), 0, 16};
	uint64_t n;
	static const int wflags[] = {0, SBX_WRITE_NO_ATOMIC, SBX_WRITE_APPEND};
	for (int op = 0; op < 5; op++) {
		uint64_t t0 = it_now_ms();
		int rc;
		const char *verb;
		if (op == 0) {
			rc = sbx_read_file(c, NULL, path, 0, SBX_TO_END, membuf_sink, &m, &n, &err);
			verb = "read";
		} else if (op <= 3) {
			rc = sbx_write_file_buf(c, NULL, path, wflags[op - 1], SBX_MODE_KEEP, "planted", 7, NULL, &err);
			verb = "write";
		} else {
			rc = sbx_truncate(c, NULL, path, 0, &err);
			verb = "truncate";
		}
		unsigned ms = (unsigned)(it_now_ms() - t0);
		CHECKF(rc < 0, "%s of %s (%s) succeeded without allow_special", verb, path, kind);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
		CHECK_CONTAINS(err.message, kind);
		CHECK_CONTAINS(err.message, "allow_special");
		CHECKF(strcmp(err.path, path) == 0, "the error names %s", err.path);
		CHECKF(ms < PROMPT_MS, "%s of %s refused after %u ms", verb, kind, ms);
		if (op == 0)
			printf("%s: \"%s\" in %u ms\n", kind, err.message, ms);
	}
	CHECK_EQ(m.len, 0);
	free(m.p);
	CHECK(lstat(path, &after) == 0);
	CHECK_EQ(after.st_mode, before.st_mode);
	CHECK_EQ(after.st_ino, before.st_ino);
	CHECK_EQ(after.st_uid, before.st_uid);
	CHECK_EQ(after.st_rdev, before.st_rdev);
	CHECK_EQ(count_hidden(dir), 0);
}

static int case_refused(void)
{
	if (!have_setpriv()) {
		printf("needs root and setpriv(1): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("s");
	start(sock);
	const char *dir = nobody_dir();
	nobody_fifos(dir, 1, "fifo");
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	refused_all(c, fifo_name(dir, "fifo", 0), "a FIFO", dir);
	/* a unix socket file (open() says ENXIO: the error still names the type) */
	char spath[256];
	SPRINTF(spath, "%s/sock", it_dir());
	int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	CHECK(strlen(spath) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, spath);
	CHECK(bind(sfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	refused_all(c, spath, "a socket", it_dir());
	close(sfd);
	/* a character device: read and truncate refused; a write is never tried on it (a
	 * refusal is the expected outcome, but /dev/null is the machine's) */
	struct sbx_error err;
	struct membuf m = {malloc(16), 0, 16};
	uint64_t n;
	CHECK(sbx_read_file(c, NULL, "/dev/zero", 0, 16, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "a character device");
	CHECK(sbx_truncate(c, NULL, "/dev/zero", 0, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "a character device");
	free(m.p);
	sbx_client_close(c);
	return 0;
}

struct fifo_writer {
	const char *path;
	const char *msg;
	int err;
};

/* Open the FIFO for writing (waits for the daemon's reader), write msg, close. */
static void *fifo_writer_thread(void *arg)
{
	struct fifo_writer *w = arg;
	int fd = open(w->path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		w->err = errno;
		return NULL;
	}
	size_t len = strlen(w->msg);
	if (write(fd, w->msg, len) != (ssize_t)len)
		w->err = errno ? errno : EIO;
	close(fd);
	return NULL;
}

/* A FIFO whose writer writes "hello" and closes: exactly "hello", with allow_special. */
static int case_fifo_hello(void)
{
	if (!have_setpriv()) {
		printf("needs root and setpriv(1): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("s");
	start(sock);
	const char *dir = nobody_dir();
	nobody_fifos(dir, 1, "fifo");
	const char *fifo = fifo_name(dir, "fifo", 0);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct fifo_writer w = {.path = fifo, .msg = "hello"};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fifo_writer_thread, &w) == 0);
	struct sbx_error err;
	struct membuf m = {malloc(64), 0, 64};
	uint64_t n;
	CHECK_SBX(sbx_read_file_ex(c, NULL, fifo, 0, SBX_TO_END, SBX_READ_ALLOW_SPECIAL, membuf_sink, &m, &n, &err),
		  &err);
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(w.err == 0, "the writer: %s", strerror(w.err));
	CHECKF(m.len == 5 && memcmp(m.p, "hello", 5) == 0, "read %zu bytes '%.*s'", m.len, (int)m.len, m.p);
	CHECK_EQ(n, 5);
	free(m.p);
	sbx_client_close(c);
	return 0;
}

/* /dev/zero and /dev/urandom with allow_special: exactly the bytes asked for. */
static int case_devices(void)
{
	const char *sock = it_path("s");
	start(sock);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_error err;
	struct membuf m = {malloc(MiB), 0, MiB};
	memset(m.p, 0xa5, MiB);
	uint64_t n;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_read_file_ex(c, NULL, "/dev/zero", 0, MiB, SBX_READ_ALLOW_SPECIAL, membuf_sink, &m, &n, &err),
		  &err);
	unsigned ms = (unsigned)(it_now_ms() - t0);
	CHECK_EQ(m.len, MiB);
	CHECK_EQ(n, MiB);
	for (size_t i = 0; i < MiB; i++)
		CHECKF(m.p[i] == 0, "byte %zu of /dev/zero is %u", i, m.p[i]);
	m.len = 0;
	CHECK_SBX(sbx_read_file_ex(c, NULL, "/dev/urandom", 0, 65536, SBX_READ_ALLOW_SPECIAL, membuf_sink, &m, &n,
				   &err),
		  &err);
	CHECK_EQ(m.len, 65536);
	size_t zeros = 0;
	for (size_t i = 0; i < 65536; i++)
		zeros += m.p[i] == 0;
	CHECKF(zeros < 1024, "%zu zero bytes in 64 KiB of /dev/urandom", zeros);
	printf("1 MiB of /dev/zero in %u ms; 64 KiB of /dev/urandom\n", ms);
	free(m.p);
	sbx_client_close(c);
	return 0;
}

struct drain {
	const char *path;
	uint8_t *buf;
	size_t len, cap;
	int err;
};

static void *drain_thread(void *arg)
{
	struct drain *d = arg;
	int fd = open(d->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		d->err = errno;
		return NULL;
	}
	for (;;) {
		ssize_t k = read(fd, d->buf + d->len, d->cap - d->len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			d->err = errno;
		if (k <= 0)
			break;
		d->len += (size_t)k;
	}
	close(fd);
	return NULL;
}

struct writer {
	struct sbx_client *c;
	const char *path;
	const uint8_t *data;
	size_t len;
	int flags;
	int rc;
	struct sbx_error err;
};

static void *writer_thread(void *arg)
{
	struct writer *w = arg;
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 30000};
	w->rc = sbx_write_file_buf(w->c, &o, w->path, w->flags, SBX_MODE_KEEP, w->data, w->len, NULL, &w->err);
	return NULL;
}

/* Writing into a FIFO with allow_special: the write waits (on the loop) for a reader
 * that comes later, then the reader gets exactly the bytes, more than a pipe holds.
 * Meanwhile the daemon holds no extra thread. Truncating one with allow_special is
 * the kernel's answer, at once. */
static int case_write_fifo(void)
{
	if (!have_setpriv()) {
		printf("needs root and setpriv(1): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("s");
	struct it_daemon *d = start(sock);
	const char *dir = nobody_dir();
	nobody_fifos(dir, 1, "fifo");
	const char *fifo = fifo_name(dir, "fifo", 0);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	it_sleep_ms(100);
	long thr0 = threads(d->pid);
	size_t len = 300000;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 5);
	struct writer w = {.c = c, .path = fifo, .data = data, .len = len, .flags = SBX_WRITE_ALLOW_SPECIAL};
	pthread_t wt;
	CHECK(pthread_create(&wt, NULL, writer_thread, &w) == 0);
	it_sleep_ms(300); /* no reader yet: the write waits */
	long thr_wait = threads(d->pid);
	struct lat l = calls(sock, fifo);
	struct drain dr = {.path = fifo, .buf = malloc(len + 1), .cap = len + 1};
	CHECK(dr.buf != NULL);
	pthread_t rt;
	CHECK(pthread_create(&rt, NULL, drain_thread, &dr) == 0);
	CHECK(pthread_join(wt, NULL) == 0);
	CHECK(pthread_join(rt, NULL) == 0);
	CHECKF(w.rc == 0, "the write: %s", it_errstr(&w.err));
	CHECKF(dr.err == 0, "the reader: %s", strerror(dr.err));
	CHECKF(dr.len == len && memcmp(dr.buf, data, len) == 0, "the reader got %zu bytes of %zu (or others)", dr.len,
	       len);
	printf("a write into a FIFO without a reader: daemon threads %ld idle, %ld while it waits; a fresh client's "
	       "stat %u ms, exec %u ms, info %u ms meanwhile\n",
	       thr0, thr_wait, l.stat_ms, l.exec_ms, l.info_ms);
	CHECKF(thr_wait <= thr0, "%ld threads while the write waits (idle %ld)", thr_wait, thr0);
	/* truncate with allow_special: no reader, ENXIO from the non-blocking open */
	uint64_t t0 = it_now_ms();
	CHECK(sbx_truncate_ex(c, NULL, fifo, 0, SBX_TRUNCATE_ALLOW_SPECIAL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENXIO);
	CHECK(it_now_ms() - t0 < PROMPT_MS);
	struct stat st;
	CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_uid == NOBODY);
	free(dr.buf);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* Read frames on fd until every one of the n streams from first (step 2) has ended
 * with END; want[i] is the bytes stream i must have delivered. */
static void expect_ends(int fd, uint32_t first, unsigned n, const char *want)
{
	size_t *got = calloc(n, sizeof(*got));
	char **bytes = calloc(n, sizeof(*bytes));
	CHECK(got != NULL && bytes != NULL);
	size_t wl = strlen(want);
	for (unsigned ended = 0; ended < n;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF with %u of %u streams ended", ended, n);
		CHECK(h.stream >= first && (h.stream - first) % 2 == 0 && (h.stream - first) / 2 < n);
		unsigned i = (h.stream - first) / 2;
		if (h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(false, "stream %u: ERROR %d %s", h.stream, code, msg);
		}
		if (h.type == FRAME_DATA && h.len > 0) {
			CHECKF(got[i] + h.len <= wl && memcmp(want + got[i], p, h.len) == 0, "stream %u: wrong bytes",
			       h.stream);
			got[i] += h.len;
		}
		if (h.type == FRAME_END) {
			CHECKF(got[i] == wl, "stream %u ended with %zu bytes, want %zu", h.stream, got[i], wl);
			ended++;
		}
		free(p);
	}
	free(got);
	free(bytes);
}

/* 70 planted FIFOs read with allow_special (on two connections) and 70 more written
 * into with allow_special, none with a peer: a fresh client's stat, exec and info answer
 * as fast as when idle, and the daemon holds no more threads than when idle. Then each
 * FIFO gets a writer that writes "x" and closes: each read ends with exactly "x". */
static int case_many(void)
{
	if (!have_setpriv()) {
		printf("needs root and setpriv(1): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("s");
	struct it_daemon *d = start(sock);
	const char *dir = nobody_dir();
	nobody_fifos(dir, NFIFOS, "r");
	nobody_fifos(dir, NFIFOS, "w");
	const char *probe = fifo_name(dir, "r", 0);
	struct lat idle = calls(sock, probe);
	for (int i = 0; i < 2; i++) {
		struct lat l = calls(sock, probe);
		if (lat_max(l) < lat_max(idle))
			idle = l;
	}
	it_sleep_ms(100);
	long thr0 = threads(d->pid);

	int fa = connect_raw(sock), fb = connect_raw(sock), fw = connect_raw(sock);
	for (unsigned i = 0; i < NFIFOS; i++)
		send_read(i % 2 ? fb : fa, 1 + 2 * (i / 2), fifo_name(dir, "r", i), true);
	for (unsigned i = 0; i < NFIFOS; i++)
		send_write(fw, 1 + 2 * i, fifo_name(dir, "w", i), "y");
	/* every one of them opened: a FIFO with a reader, a ping behind the requests */
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	it_sleep_ms(300);
	long thr_wait = 0;
	struct lat worst = {0, 0, 0};
	for (int round = 0; round < 3; round++) {
		struct lat l = calls(sock, probe);
		worst.stat_ms = l.stat_ms > worst.stat_ms ? l.stat_ms : worst.stat_ms;
		worst.exec_ms = l.exec_ms > worst.exec_ms ? l.exec_ms : worst.exec_ms;
		worst.info_ms = l.info_ms > worst.info_ms ? l.info_ms : worst.info_ms;
		long t = threads(d->pid);
		thr_wait = t > thr_wait ? t : thr_wait;
	}
	/* without allow_special, at once */
	struct membuf m = {malloc(16), 0, 16};
	uint64_t n, t0 = it_now_ms();
	CHECK(sbx_read_file(c, NULL, probe, 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	unsigned refuse_ms = (unsigned)(it_now_ms() - t0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "a FIFO");
	free(m.p);
	printf("idle: stat %u ms (with connect), exec %u ms, info %u ms, %ld threads\n", idle.stat_ms, idle.exec_ms,
	       idle.info_ms, thr0);
	printf("with %u FIFO reads and %u FIFO writes waiting: stat %u ms, exec %u ms, info %u ms (worst of 3), at "
	       "most %ld threads; a read without allow_special refused in %u ms\n",
	       NFIFOS, NFIFOS, worst.stat_ms, worst.exec_ms, worst.info_ms, thr_wait, refuse_ms);
	CHECKF(lat_max(worst) < PROMPT_MS, "a call took %u ms with the FIFOs waiting (idle: %u ms)", lat_max(worst),
	       lat_max(idle));
	CHECKF(thr_wait <= thr0 + 1, "%ld threads with the FIFOs waiting (idle: %ld)", thr_wait, thr0);
	CHECK(refuse_ms < PROMPT_MS);

	/* a writer for each read FIFO: "x", then EOF */
	for (unsigned i = 0; i < NFIFOS; i++) {
		int wfd = open(fifo_name(dir, "r", i), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
		CHECKF(wfd >= 0, "open %s: %s (the daemon's reader is not there)", fifo_name(dir, "r", i),
		       strerror(errno));
		CHECK(write(wfd, "x", 1) == 1);
		close(wfd);
	}
	expect_ends(fa, 1, NFIFOS / 2, "x");
	expect_ends(fb, 1, NFIFOS / 2, "x");
	/* and a reader for each written FIFO, all at once: "y" (a read says 0 until the
	 * daemon's retried open has found the reader and written) */
	int rfd[NFIFOS];
	bool seen[NFIFOS] = {false};
	for (unsigned i = 0; i < NFIFOS; i++) {
		rfd[i] = open(fifo_name(dir, "w", i), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
		CHECK(rfd[i] >= 0);
	}
	uint64_t deadline = it_now_ms() + 20000;
	for (unsigned left = NFIFOS; left > 0;) {
		CHECKF(it_now_ms() < deadline, "%u of the written FIFOs got nothing", left);
		for (unsigned i = 0; i < NFIFOS; i++) {
			if (seen[i])
				continue;
			char b[4];
			ssize_t k = read(rfd[i], b, sizeof(b));
			CHECKF(k >= 0 || errno == EAGAIN, "FIFO w-%u: %s", i, strerror(errno));
			if (k > 0) {
				CHECKF(k == 1 && b[0] == 'y', "FIFO w-%u: %zd bytes", i, k);
				seen[i] = true;
				left--;
			}
		}
		it_sleep_ms(5);
	}
	for (unsigned i = 0; i < NFIFOS; i++)
		close(rfd[i]);
	/* every write ends with END */
	for (unsigned ended = 0; ended < NFIFOS;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fw, &h, &p, 20000) == 1, "EOF with %u of %u writes ended", ended, NFIFOS);
		if (h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(false, "write stream %u: ERROR %d %s", h.stream, code, msg);
		}
		if (h.type == FRAME_END)
			ended++;
		free(p);
	}
	close(fa);
	close(fb);
	close(fw);
	sbx_client_close(c);
	return 0;
}

static const struct it_case cases[] = {
	{"refused", case_refused}, {"fifo_hello", case_fifo_hello},
	{"devices", case_devices}, {"write_fifo", case_write_fifo},
	{"many", case_many},
};

int main(int argc, char **argv)
{
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
