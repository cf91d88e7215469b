/* it_memory.c: the daemon-wide memory budget against credit hoarders, and reads without credit that hold no thread (issue 16, 4 and 9). */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024u * 1024u)
#define BIG_SIZE (128u * MiB)
/* what a client asks for on one connection: all but one of --max-streams (256) */
#define HOARD_STREAMS 255
#define HOARD_CONNS 6
/* RSS beyond the budget: spare buffers kept for reuse (2 MiB of read buffers, 2 MiB of
 * output chunks), the malloc heaps' own overhead, a thread stack or two */
#define SLACK_KB (8L * 1024)
/* Under AddressSanitizer freed memory waits in a quarantine: the daemon's RSS then says
 * nothing about what it holds, and is printed but not checked. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED false
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_CHECKED false
#endif
#endif
#ifndef RSS_CHECKED
#define RSS_CHECKED true
#endif

/* the least credit the shim honours (Hello.initial_window) */
#define WINDOW 4096u
/* every call of a client that is not hoarding, while the others hoard */
#define SERVED_MS 3000u

/* A field of /proc/PID/status: kB for VmRSS, a count for Threads. */
static long proc_status(pid_t pid, const char *key)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	CHECKF(f != NULL, "%s: %s", path, strerror(errno));
	long v = -1;
	size_t klen = strlen(key);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
			v = strtol(line + klen + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	CHECKF(v >= 0, "no %s in %s", key, path);
	return v;
}

static long rss_kb(pid_t pid)
{
	return proc_status(pid, "VmRSS");
}

static long threads(pid_t pid)
{
	return proc_status(pid, "Threads");
}

/* A real file of size bytes (pseudo-random, not sparse). */
static void make_big(const char *path, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	uint8_t *buf = malloc(MiB);
	CHECK(buf != NULL);
	for (size_t off = 0; off < size; off += MiB) {
		it_fill(buf, MiB, off / MiB + 1);
		CHECK(write(fd, buf, MiB) == (ssize_t)MiB);
	}
	free(buf);
	close(fd);
}

/* A raw connection whose streams each get `window` bytes of credit from the start. */
static int connect_window(const char *sock, uint32_t window)
{
	int fd = raw_connect_unix(sock);
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = SHIM_PROTOCOL_VERSION;
	m.client_name = (char *)"it_memory";
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

/* n READ requests of path on streams first, first + 2, ..., written at once. */
static void send_reads(int fd, uint32_t first, unsigned n, const char *path)
{
	Shim__V1__ReadRequest rr = SHIM__V1__READ_REQUEST__INIT;
	rr.path.data = (uint8_t *)(uintptr_t)path;
	rr.path.len = strlen(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READ;
	req.read = &rr;
	size_t plen = shim__v1__request__get_packed_size(&req);
	size_t flen = FRAME_HDR_LEN + plen;
	uint8_t *buf = malloc(flen * n);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < n; i++) {
		struct frame_hdr h = {.len = (uint32_t)plen, .stream = first + 2 * i, .type = FRAME_REQUEST};
		frame_put_hdr(buf + i * flen, &h);
		shim__v1__request__pack(&req, buf + i * flen + FRAME_HDR_LEN);
	}
	size_t off = 0;
	while (off < flen * n) {
		ssize_t w = send(fd, buf + off, flen * n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		CHECKF(w > 0, "send: %s", strerror(errno));
		off += (size_t)w;
	}
	free(buf);
}

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

/* The bytes make_big() put at off. */
static void check_big_bytes(const uint8_t *got, size_t off, size_t len)
{
	uint8_t *want = malloc(MiB);
	CHECK(want != NULL && off % MiB == 0 && len % MiB == 0);
	for (size_t o = 0; o < len; o += MiB) {
		it_fill(want, MiB, (off + o) / MiB + 1);
		CHECKF(memcmp(got + o, want, MiB) == 0, "the bytes read at %zu are not the file's", off + o);
	}
	free(want);
}

/* A client that is not hoarding gets its answers: ping, stat, exec, and 1 MiB of the
 * big file; returns the slowest call in ms. */
static unsigned served(struct sbx_client *c, const char *big, const char *when)
{
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	uint64_t t1 = it_now_ms();
	struct sbx_stat st = SBX_STAT_INIT;
	CHECK_SBX(sbx_stat(c, NULL, big, 0, &st, &err), &err);
	CHECK_EQ(st.size, BIG_SIZE);
	uint64_t t2 = it_now_ms();
	static const char *const argv[] = {"true", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	sbx_output_free(&out);
	CHECK_EQ(sbx_exit_status(&ex), 0);
	uint64_t t3 = it_now_ms();
	struct membuf m = {malloc(MiB), 0, MiB};
	CHECK(m.p != NULL);
	uint64_t n = 0;
	CHECK_SBX(sbx_read_file(c, NULL, big, 5 * MiB, MiB, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, MiB);
	check_big_bytes(m.p, 5 * MiB, MiB);
	free(m.p);
	uint64_t t4 = it_now_ms();
	unsigned d[] = {(unsigned)(t1 - t0), (unsigned)(t2 - t1), (unsigned)(t3 - t2), (unsigned)(t4 - t3)};
	unsigned worst = 0;
	for (unsigned i = 0; i < 4; i++)
		worst = d[i] > worst ? d[i] : worst;
	CHECKF(worst < SERVED_MS, "%s: ping %u ms, stat %u ms, exec %u ms, read 1 MiB %u ms (bound %u ms)", when, d[0],
	       d[1], d[2], d[3], SERVED_MS);
	return worst;
}

static struct it_daemon *start_daemon(const char *sock, const char *max_buffer)
{
	if (max_buffer != NULL)
		return it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
				       "--max-buffer", max_buffer, NULL);
	return it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
}

/* ---- 4: clients that grant credit and never read stay within --max-buffer ----
 *
 * Each hoarder grants 1 GiB of credit per stream (Hello.initial_window), asks for the
 * big file on 255 streams and never reads its socket. The daemon's RSS must stay under
 * its baseline plus the budget (and a little slack), a client that plays fair is served
 * all along, and the memory goes back once the hoarders are gone. */

/* A client that asks for n reads while hoarders hold the budget: the reads whose state
 * still fits get their first WINDOW bytes, the others are refused with EAGAIN at once
 * (not queued, not grown into). Returns how many were refused. */
static unsigned refused_reads(const char *sock, const char *big, unsigned n)
{
	int fd = connect_window(sock, WINDOW);
	send_reads(fd, 1, n, big);
	size_t *got = calloc(n, sizeof(*got));
	CHECK(got != NULL);
	unsigned done = 0, refused = 0;
	while (done < n) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF with %u of %u reads answered", done, n);
		unsigned i = (h.stream - 1) / 2;
		CHECK(h.stream >= 1 && i < n);
		if (h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(code == EAGAIN && strstr(msg, "memory budget exhausted") != NULL,
			       "read refused with %d '%s'", code, msg);
			refused++;
			done++;
		} else {
			CHECKF(h.type == FRAME_DATA, "%s on stream %u", frame_type_name(h.type), h.stream);
			got[i] += h.len;
			CHECK(got[i] <= WINDOW);
			if (got[i] == WINDOW)
				done++;
		}
		free(p);
	}
	free(got);
	close(fd);
	return refused;
}

/* After the hoarders: this close to the baseline. */
#define NEAR_KB (4L * 1024)

static void hoard(const char *max_buffer, long budget_kb, bool expect_refusals)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_daemon(sock, max_buffer);
	const char *big = it_path("big");
	make_big(big, BIG_SIZE);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	served(c, big, "before");
	it_sleep_ms(300);
	long rss0 = rss_kb(d->pid), thr0 = threads(d->pid);

	int fds[HOARD_CONNS];
	for (unsigned i = 0; i < HOARD_CONNS; i++) {
		fds[i] = connect_window(sock, 1u << 30);
		send_reads(fds[i], 1, HOARD_STREAMS, big);
	}
	long rss_max = 0, thr_max = 0;
	unsigned worst = 0, calls = 0;
	uint64_t end = it_now_ms() + 3000, next = it_now_ms() + 300;
	while (it_now_ms() < end) {
		long r = rss_kb(d->pid), t = threads(d->pid);
		rss_max = r > rss_max ? r : rss_max;
		thr_max = t > thr_max ? t : thr_max;
		if (it_now_ms() >= next) {
			unsigned w = served(c, big, "while the hoarders hold their streams");
			worst = w > worst ? w : worst;
			calls++;
			next = it_now_ms() + 400;
		}
		it_sleep_ms(20);
	}
	/* they were really sent to: their sockets are full of DATA they do not read */
	for (unsigned i = 0; i < HOARD_CONNS; i++) {
		int q = 0;
		CHECK(ioctl(fds[i], FIONREAD, &q) == 0);
		CHECKF(q > 0, "hoarder %u was sent nothing", i);
	}
	long limit = rss0 + budget_kb + SLACK_KB;
	printf("budget %ld MiB: daemon RSS %ld kB before, at most %ld kB (+%ld kB) with %u hoarders x %u streams "
	       "(limit %ld kB), threads %ld before, at most %ld during; the other client's slowest call %u ms (%u "
	       "rounds of ping, stat, exec, read 1 MiB)\n",
	       budget_kb / 1024, rss0, rss_max, rss_max - rss0, HOARD_CONNS, HOARD_STREAMS, limit, thr0, thr_max, worst,
	       calls);
	CHECKF(!RSS_CHECKED || rss_max <= limit,
	       "daemon RSS %ld kB with the hoarders, over baseline %ld kB + budget %ld kB + %ld kB", rss_max, rss0,
	       budget_kb, SLACK_KB);
	if (expect_refusals) {
		unsigned refused = refused_reads(sock, big, 64);
		printf("a new client's 64 reads meanwhile: %u refused with EAGAIN (memory budget exhausted), %u served\n",
		       refused, 64 - refused);
		CHECKF(refused > 0 && refused < 64,
		       "%u of 64 reads refused: want some served (the floor), some refused", refused);
	}

	for (unsigned i = 0; i < HOARD_CONNS; i++)
		close(fds[i]);
	uint64_t deadline = it_now_ms() + 5000;
	long rss_after;
	do {
		it_sleep_ms(50);
		rss_after = rss_kb(d->pid);
	} while (RSS_CHECKED && rss_after > rss0 + NEAR_KB && it_now_ms() < deadline);
	long thr_after = threads(d->pid);
	printf("after the hoarders left: daemon RSS %ld kB (%+ld kB from before), threads %ld\n", rss_after,
	       rss_after - rss0, thr_after);
	CHECKF(!RSS_CHECKED || rss_after <= rss0 + NEAR_KB,
	       "daemon RSS %ld kB 5 s after the hoarders left, baseline %ld kB", rss_after, rss0);
	served(c, big, "after");
	sbx_client_close(c);
}

static int case_hoard(void)
{
	hoard(NULL, 64L * 1024, false);
	return 0;
}

/* The same with a budget smaller than what the hoarders' connections would hold each
 * (output and read-ahead): the budget is what bounds them. */
static int case_hoard_budget(void)
{
	hoard("8388608", 8L * 1024, true);
	return 0;
}

/* ---- 9: waiting is not work ---- */

#define HOLD_STREAMS 256

/* Read frames until each of the n streams from `first` has had exactly WINDOW bytes of
 * DATA (more fails: the daemon overran the credit). */
static void take_windows(int fd, uint32_t first, unsigned n)
{
	size_t *got = calloc(n, sizeof(*got));
	CHECK(got != NULL);
	size_t total = 0;
	while (total < (size_t)n * WINDOW) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF with %zu of %u bytes", total, n * WINDOW);
		if (h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(false, "ERROR %d (%s) on stream %u", code, msg, h.stream);
		}
		CHECKF(h.type == FRAME_DATA, "%s on stream %u", frame_type_name(h.type), h.stream);
		unsigned i = (h.stream - first) / 2;
		CHECK(h.stream >= first && i < n);
		got[i] += h.len;
		CHECKF(got[i] <= WINDOW, "stream %u got %zu bytes with %u of credit", h.stream, got[i], WINDOW);
		total += h.len;
		free(p);
	}
	free(got);
}

/* No frame at all for ms (every stream is out of credit). */
static void expect_quiet(int fd, unsigned ms)
{
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	int r = poll(&pf, 1, (int)ms);
	if (r == 1) {
		struct frame_hdr h;
		uint8_t *p;
		CHECK(raw_recv(fd, &h, &p, 1000) == 1);
		CHECKF(false, "%s (%u bytes) on stream %u with no credit left", frame_type_name(h.type), h.len,
		       h.stream);
	}
}

/* Cancel the n streams from `first`; each ends with ERROR ECANCELED. */
static void cancel_all(int fd, uint32_t first, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		raw_send(fd, first + 2 * i, FRAME_CANCEL, 0, NULL, 0);
	for (unsigned done = 0; done < n;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF after %u of %u cancels", done, n);
		CHECKF(h.type == FRAME_ERROR, "%s on stream %u after its CANCEL", frame_type_name(h.type), h.stream);
		char msg[256];
		CHECK_EQ(raw_error_code(p, h.len, msg, sizeof(msg)), ECANCELED);
		free(p);
		done++;
	}
}

/* The thread count, once a thread started on probation meanwhile has left (it does
 * within a spell, 30 ms, of the queue being empty). */
static long settled_threads(pid_t pid, long idle)
{
	long t = threads(pid);
	for (int i = 0; i < 20 && t > idle; i++) {
		it_sleep_ms(10);
		t = threads(pid);
	}
	return t;
}

struct fifo_read {
	struct sbx_client *c;
	const char *path;
	struct membuf m;
	int rc;
	struct sbx_error err;
};

static void *fifo_read_thread(void *arg)
{
	struct fifo_read *f = arg;
	uint64_t n;
	f->rc = sbx_read_file_ex(f->c, NULL, f->path, 0, SBX_TO_END, SBX_READ_ALLOW_SPECIAL, membuf_sink, &f->m, &n,
				 &f->err);
	return NULL;
}

/* 256 reads of the big file at the least credit (Hello.initial_window 4096), none
 * granted more: each gets its 4 KiB, then nothing; the daemon's thread count stays at
 * its idle value meanwhile, a FIFO read whose writer says nothing for a while holds no
 * thread either and gets its bytes, and the other calls answer at once. */
static int case_zero_credit(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_daemon(sock, NULL);
	const char *big = it_path("big");
	make_big(big, BIG_SIZE);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	served(c, big, "before");
	it_sleep_ms(200);
	long thr0 = settled_threads(d->pid, 0), rss0 = rss_kb(d->pid);

	int fd = connect_window(sock, WINDOW);
	uint64_t t0 = it_now_ms();
	send_reads(fd, 1, HOLD_STREAMS, big);
	long burst_max = thr0;
	take_windows(fd, 1, HOLD_STREAMS);
	unsigned first_ms = (unsigned)(it_now_ms() - t0);
	burst_max = threads(d->pid) > burst_max ? threads(d->pid) : burst_max;
	long thr_hold = settled_threads(d->pid, thr0);
	expect_quiet(fd, 300);
	long thr_quiet = threads(d->pid), rss_hold = rss_kb(d->pid);
	printf("256 reads at zero credit: their first 4 KiB each in %u ms; daemon threads %ld idle, %ld while they wait "
	       "(%ld right after the burst), RSS %ld kB -> %ld kB\n",
	       first_ms, thr0, thr_quiet, burst_max, rss0, rss_hold);
	CHECKF(thr_hold == thr0 && thr_quiet == thr0, "%ld threads while 256 reads wait for credit (idle: %ld)",
	       thr_quiet, thr0);
	unsigned w = served(c, big, "while 256 reads wait for credit");

	/* a FIFO whose writer opens it and then says nothing for a while */
	const char *fifo = it_path("fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	struct fifo_read f = {.c = it_connect(it_unix_target(sock), NULL), .path = fifo};
	f.m = (struct membuf){malloc(4096), 0, 4096};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fifo_read_thread, &f) == 0);
	int wfd = open(fifo, O_WRONLY | O_CLOEXEC); /* returns once the daemon has it open */
	CHECKF(wfd >= 0, "open %s: %s", fifo, strerror(errno));
	it_sleep_ms(100);
	unsigned wf = served(c, big, "while a FIFO read waits for its writer");
	long thr_fifo = settled_threads(d->pid, thr0);
	it_sleep_ms(200);
	static const char msg[] = "bytes after a pause";
	CHECK(write(wfd, msg, sizeof(msg) - 1) == (ssize_t)(sizeof(msg) - 1));
	close(wfd);
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(f.rc == 0, "the FIFO read: %s", it_errstr(&f.err));
	CHECK(f.m.len == sizeof(msg) - 1 && memcmp(f.m.p, msg, f.m.len) == 0);
	free(f.m.p);
	sbx_client_close(f.c);
	printf("while they wait: other calls at most %u ms; with a FIFO read waiting for its writer too: %u ms, %ld "
	       "threads\n",
	       w, wf, thr_fifo);
	CHECKF(thr_fifo == thr0, "%ld threads while a FIFO read waits for its writer (idle: %ld)", thr_fifo, thr0);

	/* the reads are still there, and still get nothing without credit */
	expect_quiet(fd, 100);
	cancel_all(fd, 1, HOLD_STREAMS);
	close(fd);
	sbx_client_close(c);
	return 0;
}

/* Rounds of 256 reads held at zero credit, then cancelled: the daemon's RSS does not
 * grow from round to round, and its thread count stays at its idle value. */
static int case_hold_cancel(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_daemon(sock, NULL);
	const char *big = it_path("big");
	make_big(big, BIG_SIZE);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	served(c, big, "before");
	it_sleep_ms(200);
	long thr0 = settled_threads(d->pid, 0), rss0 = rss_kb(d->pid);
	int fd = connect_window(sock, WINDOW);
	enum { ROUNDS = 10 };
	long rss[ROUNDS], thr_max = 0;
	for (unsigned r = 0; r < ROUNDS; r++) {
		uint32_t first = 1 + 2u * HOLD_STREAMS * r;
		send_reads(fd, first, HOLD_STREAMS, big);
		take_windows(fd, first, HOLD_STREAMS);
		long t = settled_threads(d->pid, thr0);
		thr_max = t > thr_max ? t : thr_max;
		cancel_all(fd, first, HOLD_STREAMS);
		it_sleep_ms(50);
		rss[r] = rss_kb(d->pid);
	}
	printf("daemon RSS %ld kB before; after each of %d rounds of 256 reads held, then cancelled:", rss0, ROUNDS);
	for (unsigned r = 0; r < ROUNDS; r++)
		printf(" %ld", rss[r]);
	printf(" kB; threads %ld idle, at most %ld\n", thr0, thr_max);
	/* the heap may settle at its size over the first rounds; after that, no growth */
	long settled = 0;
	for (unsigned r = 0; r < ROUNDS / 2; r++)
		settled = rss[r] > settled ? rss[r] : settled;
	CHECKF(!RSS_CHECKED || rss[ROUNDS - 1] <= settled + 1024,
	       "RSS grew from %ld kB to %ld kB over %d hold-then-cancel rounds", settled, rss[ROUNDS - 1], ROUNDS);
	CHECKF(!RSS_CHECKED || rss[ROUNDS - 1] <= rss0 + NEAR_KB, "RSS %ld kB after the rounds, %ld kB before",
	       rss[ROUNDS - 1], rss0);
	CHECK_EQ(thr_max, thr0);
	served(c, big, "after");
	close(fd);
	sbx_client_close(c);
	return 0;
}

/* ---- 9: backups and restores that wait for the client hold no pool thread ---- */

#define JOBS_CAP 6
#define JOBS (JOBS_CAP + 2)
#define JOB_FILE (16u * MiB) /* more than a backup's buffers (12 MiB at most): it stalls */
#define SMALL_SIZE (64u << 10)

static void send_window(int fd, uint32_t stream, uint32_t n)
{
	uint8_t p[4];
	frame_put_u32(p, n);
	raw_send(fd, stream, FRAME_WINDOW, 0, p, sizeof(p));
}

static void send_backup(int fd, uint32_t stream, const char *dir)
{
	Shim__V1__BackupRequest br = SHIM__V1__BACKUP_REQUEST__INIT;
	br.dir.data = (uint8_t *)(uintptr_t)dir;
	br.dir.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_BACKUP;
	req.backup = &br;
	uint8_t buf[512];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

/* The daemon's threads by name: its own (the loop and the pool's, named as the
 * process), jobs' ("shim-job") and the jobs' helpers ("backup-walk", "restore-files"). */
struct thread_counts {
	long pool, jobs, walkers, total;
};

static struct thread_counts thread_counts(pid_t pid)
{
	struct thread_counts t = {0, 0, 0, 0};
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);
	CHECKF(dir != NULL, "%s: %s", path, strerror(errno));
	struct dirent *e;
	while ((e = readdir(dir)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char cpath[128], comm[64] = "";
		snprintf(cpath, sizeof(cpath), "%s/%.20s/comm", path, e->d_name);
		FILE *f = fopen(cpath, "re");
		if (f == NULL)
			continue; /* ended meanwhile */
		if (fgets(comm, sizeof(comm), f) == NULL)
			comm[0] = '\0';
		fclose(f);
		comm[strcspn(comm, "\n")] = '\0';
		t.total++;
		if (strcmp(comm, "shim-job") == 0)
			t.jobs++;
		else if (strcmp(comm, "backup-walk") == 0 || strcmp(comm, "restore-files") == 0)
			t.walkers++;
		else
			t.pool++;
	}
	closedir(dir);
	return t;
}

/* ping, stat, exec on c, and a FIFO read (allow_special) whose writer says "hello":
 * the slowest in ms. */
static unsigned served_small(struct sbx_client *c, const char *path, const char *fifo, const char *when)
{
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
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
	struct fifo_read f = {.c = c, .path = fifo};
	f.m = (struct membuf){malloc(64), 0, 64};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fifo_read_thread, &f) == 0);
	int wfd = open(fifo, O_WRONLY | O_CLOEXEC);
	CHECKF(wfd >= 0, "open %s: %s", fifo, strerror(errno));
	CHECK(write(wfd, "hello", 5) == 5);
	close(wfd);
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(f.rc == 0, "the FIFO read: %s", it_errstr(&f.err));
	CHECK(f.m.len == 5 && memcmp(f.m.p, "hello", 5) == 0);
	free(f.m.p);
	uint64_t t4 = it_now_ms();
	unsigned d[] = {(unsigned)(t1 - t0), (unsigned)(t2 - t1), (unsigned)(t3 - t2), (unsigned)(t4 - t3)};
	unsigned worst = 0;
	for (unsigned i = 0; i < 4; i++)
		worst = d[i] > worst ? d[i] : worst;
	printf("%s: ping+stat %u ms, exec %u ms, info %u ms, FIFO read %u ms\n", when, d[0], d[1], d[2], d[3]);
	CHECKF(worst < SERVED_MS, "%s: a call took %u ms (bound %u ms)", when, worst, SERVED_MS);
	return worst;
}

/* 256 reads and JOBS backups at zero credit on one connection (--max-jobs JOBS_CAP):
 * the daemon's threads stay within the idle pool plus two per running job (the job and
 * its walker), bounded by the cap (the two beyond it wait queued, holding none); other
 * clients' calls and a FIFO read are served meanwhile; then, with credit granted, every
 * stream completes, byte-exact. */
static int case_stalled_jobs(void)
{
	const char *sock = it_path("s");
	char cap[16];
	snprintf(cap, sizeof(cap), "%d", JOBS_CAP);
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
					      "--max-jobs", cap, "--max-streams", "512", NULL);
	const char *small = it_path("small");
	make_big(small, SMALL_SIZE < MiB ? MiB : SMALL_SIZE);
	CHECK(truncate(small, SMALL_SIZE) == 0);
	const char *tree = it_path("tree");
	CHECK(mkdir(tree, 0755) == 0);
	char file[512];
	snprintf(file, sizeof(file), "%s/data", tree);
	make_big(file, JOB_FILE);
	const char *fifo = it_path("fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	served_small(c, small, fifo, "idle");
	it_sleep_ms(200);
	long thr0 = settled_threads(d->pid, 0);

	int fd = connect_window(sock, WINDOW);
	send_reads(fd, 1, HOLD_STREAMS, small);
	uint32_t first_job = 1 + 2 * HOLD_STREAMS;
	for (unsigned i = 0; i < JOBS; i++)
		send_backup(fd, first_job + 2 * i, tree);
	/* the reads' first 4 KiB, and the backups' (the running ones') */
	size_t *got = calloc(HOLD_STREAMS + JOBS, sizeof(*got));
	uint8_t **arch = calloc(JOBS, sizeof(*arch));
	CHECK(got != NULL && arch != NULL);
	size_t arch_cap = JOB_FILE + 4 * MiB;
	for (unsigned i = 0; i < JOBS; i++)
		CHECK((arch[i] = malloc(arch_cap)) != NULL);
	uint8_t *smallbuf = malloc((size_t)HOLD_STREAMS * SMALL_SIZE);
	CHECK(smallbuf != NULL);
	bool *ended = calloc(HOLD_STREAMS + JOBS, sizeof(*ended));
	CHECK(ended != NULL);
	unsigned n_ended = 0;
	/* one frame of any stream: DATA kept, END counted, ERROR fails */
#define TAKE_FRAME(timeout)                                                                                           \
	do {                                                                                                          \
		struct frame_hdr h;                                                                                   \
		uint8_t *p;                                                                                           \
		CHECKF(raw_recv(fd, &h, &p, (timeout)) == 1, "EOF with %u streams ended", n_ended);                   \
		CHECK(h.stream >= 1 && h.stream % 2 == 1 && (h.stream - 1) / 2 < HOLD_STREAMS + JOBS);                \
		unsigned k = (h.stream - 1) / 2;                                                                      \
		if (h.type == FRAME_ERROR) {                                                                          \
			char msg[256];                                                                                \
			int code = raw_error_code(p, h.len, msg, sizeof(msg));                                        \
			CHECKF(false, "stream %u: ERROR %d %s", h.stream, code, msg);                                 \
		}                                                                                                     \
		if (h.type == FRAME_DATA && h.len > 0) {                                                              \
			uint8_t *dst = k < HOLD_STREAMS ? smallbuf + (size_t)k * SMALL_SIZE : arch[k - HOLD_STREAMS]; \
			size_t room = k < HOLD_STREAMS ? SMALL_SIZE : arch_cap;                                       \
			CHECKF(got[k] + h.len <= room, "stream %u: too many bytes", h.stream);                        \
			memcpy(dst + got[k], p, h.len);                                                               \
			got[k] += h.len;                                                                              \
		}                                                                                                     \
		if (h.type == FRAME_END) {                                                                            \
			CHECK(!ended[k]);                                                                             \
			ended[k] = true;                                                                              \
			n_ended++;                                                                                    \
		}                                                                                                     \
		free(p);                                                                                              \
	} while (0)
	/* every read has its window, and the running backups theirs */
	uint64_t deadline = it_now_ms() + 20000;
	for (;;) {
		size_t reads = 0, jobs_full = 0;
		for (unsigned k = 0; k < HOLD_STREAMS; k++)
			reads += got[k] == WINDOW;
		for (unsigned k = HOLD_STREAMS; k < HOLD_STREAMS + JOBS; k++)
			jobs_full += got[k] == WINDOW;
		if (reads == HOLD_STREAMS && jobs_full >= JOBS_CAP)
			break;
		CHECKF(it_now_ms() < deadline, "%zu reads and %zu backups had their first window", reads, jobs_full);
		TAKE_FRAME(20000);
	}
	/* the backups fill their buffers, then wait */
	long thr_max = 0;
	struct thread_counts tc_max = {0, 0, 0, 0};
	for (int i = 0; i < 10; i++) {
		it_sleep_ms(50);
		long t = threads(d->pid);
		thr_max = t > thr_max ? t : thr_max;
		struct thread_counts tc = thread_counts(d->pid);
		tc_max.pool = tc.pool > tc_max.pool ? tc.pool : tc_max.pool;
		tc_max.jobs = tc.jobs > tc_max.jobs ? tc.jobs : tc_max.jobs;
		tc_max.walkers = tc.walkers > tc_max.walkers ? tc.walkers : tc_max.walkers;
	}
	long thr_hold = settled_threads(d->pid, thr0 + 2 * JOBS_CAP);
	struct thread_counts tc = thread_counts(d->pid);
	unsigned running = 0;
	for (unsigned k = HOLD_STREAMS; k < HOLD_STREAMS + JOBS; k++)
		running += got[k] > 0;
	unsigned w = served_small(c, small, fifo, "with 256 reads and the backups stalled");
	printf("256 reads and %d backups at zero credit (--max-jobs %d): daemon threads %ld idle, %ld while they wait "
	       "(at most %ld: loop and pool %ld, jobs %ld, walkers %ld; now %ld, %ld, %ld), %u backups sending; the "
	       "other client's slowest call %u ms\n",
	       JOBS, JOBS_CAP, thr0, thr_hold, thr_max, tc_max.pool, tc_max.jobs, tc_max.walkers, tc.pool, tc.jobs,
	       tc.walkers, running, w);
	CHECKF(running == JOBS_CAP, "%u backups running with --max-jobs %d", running, JOBS_CAP);
	CHECKF(tc.pool <= thr0, "%ld threads of the loop and the pool with the backups stalled (idle: %ld)", tc.pool,
	       thr0);
	CHECKF(tc_max.jobs <= JOBS_CAP && tc_max.walkers <= JOBS_CAP, "%ld job threads and %ld walkers (cap %d)",
	       tc_max.jobs, tc_max.walkers, JOBS_CAP);
	CHECKF(thr_hold <= thr0 + 2 * JOBS_CAP,
	       "%ld threads with %d backups stalled (idle %ld; each running job may have 2, cap %d)", thr_hold, JOBS,
	       thr0, JOBS_CAP);

	/* credit for all: every stream ends, byte-exact */
	for (unsigned k = 0; k < HOLD_STREAMS; k++)
		send_window(fd, 1 + 2 * k, SMALL_SIZE);
	for (unsigned i = 0; i < JOBS; i++)
		send_window(fd, first_job + 2 * i, (uint32_t)arch_cap);
	while (n_ended < HOLD_STREAMS + JOBS)
		TAKE_FRAME(30000);
#undef TAKE_FRAME
	uint8_t *want = malloc(SMALL_SIZE);
	CHECK(want != NULL);
	int sfd = open(small, O_RDONLY | O_CLOEXEC);
	CHECK(sfd >= 0 && read(sfd, want, SMALL_SIZE) == (ssize_t)SMALL_SIZE);
	close(sfd);
	for (unsigned k = 0; k < HOLD_STREAMS; k++)
		CHECKF(got[k] == SMALL_SIZE && memcmp(smallbuf + (size_t)k * SMALL_SIZE, want, SMALL_SIZE) == 0,
		       "read %u: %zu bytes (or other bytes)", k, got[k]);
	for (unsigned i = 0; i < JOBS; i++) {
		char a[256], x[256], cmd[1400];
		snprintf(a, sizeof(a), "%s/arch-%u.tar", it_dir(), i);
		snprintf(x, sizeof(x), "%s/x-%u", it_dir(), i);
		int afd = open(a, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		CHECK(afd >= 0 && write(afd, arch[i], got[HOLD_STREAMS + i]) == (ssize_t)got[HOLD_STREAMS + i]);
		close(afd);
		CHECK(mkdir(x, 0700) == 0);
		snprintf(cmd, sizeof(cmd), "tar -xf '%s' -C '%s' && cmp -s '%s/data' '%s'", a, x, x, file);
		CHECKF(system(cmd) == 0, "backup %u (%zu bytes): its archive does not hold the file as it is", i,
		       got[HOLD_STREAMS + i]);
		free(arch[i]);
	}
	printf("with credit: the 256 reads and the %d backups all ended, byte-exact\n", JOBS);
	free(want);
	free(smallbuf);
	free(arch);
	free(got);
	free(ended);
	close(fd);
	sbx_client_close(c);
	return 0;
}

/* ---- 4: write streams whose bytes wait in the daemon ----
 *
 * Each of HOARD_CONNS connections opens 255 writes (allow_special) into one FIFO whose
 * reader never reads, and sends each its whole initial window: those bytes wait in the
 * writes' rings. The rings count against --max-buffer: writes beyond it are refused
 * with EAGAIN at their request, and the daemon's RSS stays under baseline + budget. */

#define WRITE_WINDOW FRAME_DEFAULT_WINDOW

static void send_write_req(int fd, uint32_t stream, const char *path)
{
	Shim__V1__WriteRequest wr = SHIM__V1__WRITE_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)path;
	wr.path.len = strlen(path);
	wr.has_allow_special = wr.allow_special = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
	req.write = &wr;
	uint8_t buf[512];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

static int case_write_hoard(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_daemon(sock, NULL);
	const char *fifo = it_path("fifo"), *sink = it_path("sink");
	CHECK(mkfifo(fifo, 0600) == 0);
	CHECK(mkfifo(sink, 0600) == 0);
	int rfd = open(sink, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a reader that never reads */
	CHECK(rfd >= 0);
	const char *small = it_path("small");
	it_write_file(small, "small");
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	served_small(c, small, fifo, "idle");
	it_sleep_ms(300);
	long rss0 = rss_kb(d->pid);
	uint8_t *data = malloc(WRITE_WINDOW);
	CHECK(data != NULL);
	it_fill(data, WRITE_WINDOW, 3);

	int fds[HOARD_CONNS];
	unsigned accepted = 0, refused = 0;
	for (unsigned i = 0; i < HOARD_CONNS; i++) {
		fds[i] = connect_window(sock, WINDOW);
		for (unsigned k = 0; k < HOARD_STREAMS; k++)
			send_write_req(fds[i], 1 + 2 * k, sink);
		/* the refusals come before the PONG (requests are taken in order) */
		raw_send(fds[i], 0, FRAME_PING, 0, "w", 1);
		bool *gone = calloc(HOARD_STREAMS, sizeof(*gone));
		CHECK(gone != NULL);
		for (;;) {
			struct frame_hdr h;
			uint8_t *p;
			CHECKF(raw_recv(fds[i], &h, &p, 20000) == 1, "EOF before the PONG");
			bool pong = h.type == FRAME_PONG;
			if (h.type == FRAME_ERROR) {
				char msg[256];
				int code = raw_error_code(p, h.len, msg, sizeof(msg));
				CHECKF(code == EAGAIN && strstr(msg, "memory budget exhausted") != NULL,
				       "write refused with %d '%s'", code, msg);
				gone[(h.stream - 1) / 2] = true;
				refused++;
			}
			free(p);
			if (pong)
				break;
		}
		for (unsigned k = 0; k < HOARD_STREAMS; k++) {
			if (gone[k])
				continue;
			raw_send(fds[i], 1 + 2 * k, FRAME_DATA, 0, data, WRITE_WINDOW);
			accepted++;
		}
		free(gone);
	}
	long rss_max = 0;
	unsigned worst = 0;
	uint64_t end = it_now_ms() + 2000, next = it_now_ms() + 200;
	while (it_now_ms() < end) {
		long r = rss_kb(d->pid);
		rss_max = r > rss_max ? r : rss_max;
		if (it_now_ms() >= next) {
			unsigned w = served_small(c, small, fifo, "with the writes' bytes waiting");
			worst = w > worst ? w : worst;
			next = it_now_ms() + 400;
		}
		it_sleep_ms(20);
	}
	long budget_kb = 64L * 1024, limit = rss0 + budget_kb + SLACK_KB;
	printf("%u writes of %u connections into a FIFO nobody reads: %u accepted (%u KiB sent to each), %u refused "
	       "with EAGAIN; daemon RSS %ld kB before, at most %ld kB (+%ld kB; limit %ld kB); the other client's "
	       "slowest call %u ms\n",
	       HOARD_CONNS * HOARD_STREAMS, HOARD_CONNS, accepted, WRITE_WINDOW >> 10, refused, rss0, rss_max,
	       rss_max - rss0, limit, worst);
	CHECKF(refused > 0 && accepted > 0, "%u writes accepted, %u refused: want both", accepted, refused);
	CHECKF(!RSS_CHECKED || rss_max <= limit, "daemon RSS %ld kB with the writes waiting, over %ld kB", rss_max,
	       limit);
	for (unsigned i = 0; i < HOARD_CONNS; i++)
		close(fds[i]);
	uint64_t deadline = it_now_ms() + 5000;
	long rss_after;
	do {
		it_sleep_ms(50);
		rss_after = rss_kb(d->pid);
	} while (RSS_CHECKED && rss_after > rss0 + NEAR_KB && it_now_ms() < deadline);
	printf("after they left: daemon RSS %ld kB (%+ld kB)\n", rss_after, rss_after - rss0);
	CHECKF(!RSS_CHECKED || rss_after <= rss0 + NEAR_KB, "daemon RSS %ld kB after the writers left, %ld kB before",
	       rss_after, rss0);
	served_small(c, small, fifo, "after");
	close(rfd);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* ---- 4: restore rings count against the budget ----
 *
 * With --max-buffer at its least (4 MiB), restores opened at once on one connection get
 * smaller rings as the budget shrinks (down to the initial window) and then EAGAIN; one
 * accepted is still fed an archive and restores it. */

static void send_restore(int fd, uint32_t stream, const char *dir)
{
	Shim__V1__RestoreRequest rr = SHIM__V1__RESTORE_REQUEST__INIT;
	rr.dir.data = (uint8_t *)(uintptr_t)dir;
	rr.dir.len = strlen(dir);
	rr.has_mode = 1;
	rr.mode = SHIM__V1__RESTORE_MODE__RESTORE_MERGE;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESTORE;
	req.restore = &rr;
	uint8_t buf[512];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

#define RESTORES 40

static int case_restore_budget(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
					      "--max-buffer", "4194304", "--max-jobs", "64", NULL);
	(void)d;
	const char *src = it_path("src"), *dst = it_path("dst"), *arch = it_path("a.tar");
	CHECK(mkdir(src, 0755) == 0 && mkdir(dst, 0755) == 0);
	char f[512], cmd[1400];
	snprintf(f, sizeof(f), "%s/hello", src);
	it_write_file(f, "restored through a ring the budget counts\n");
	snprintf(cmd, sizeof(cmd), "tar -C '%s' -cf '%s' .", src, arch);
	CHECK(system(cmd) == 0);
	int fd = connect_window(sock, WINDOW);
	for (unsigned i = 0; i < RESTORES; i++)
		send_restore(fd, 1 + 2 * i, dst);
	raw_send(fd, 0, FRAME_PING, 0, "r", 1);
	bool refused[RESTORES] = {false};
	uint64_t granted[RESTORES] = {0};
	unsigned nref = 0;
	for (;;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF before the PONG");
		bool pong = h.type == FRAME_PONG;
		unsigned k = h.stream > 0 ? (h.stream - 1) / 2 : 0;
		if (h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(code == EAGAIN && strstr(msg, "memory budget exhausted") != NULL,
			       "restore refused with %d '%s'", code, msg);
			refused[k] = true;
			nref++;
		} else if (h.type == FRAME_WINDOW) {
			granted[k] += frame_get_u32(p);
		}
		free(p);
		if (pong)
			break;
	}
	unsigned first = RESTORES, small = 0;
	for (unsigned i = 0; i < RESTORES; i++) {
		if (!refused[i] && first == RESTORES)
			first = i;
		small += !refused[i] && granted[i] == 0;
	}
	printf("%d restores at once under --max-buffer 4 MiB: %u refused with EAGAIN, %u with a ring of just the "
	       "initial window; the first one's extra credit %llu bytes\n",
	       RESTORES, nref, small, (unsigned long long)granted[0]);
	CHECKF(nref > 0 && first < RESTORES, "%u of %d restores refused: want some accepted, some refused", nref,
	       RESTORES);
	CHECKF(granted[first] < (16u << 20), "the first restore got %llu bytes of credit with a 4 MiB budget",
	       (unsigned long long)granted[first]);
	/* the first accepted one restores an archive sent to it */
	int afd = open(arch, O_RDONLY | O_CLOEXEC);
	CHECK(afd >= 0);
	static uint8_t abuf[64 << 10];
	ssize_t an = read(afd, abuf, sizeof(abuf));
	close(afd);
	CHECK(an > 0 && an < (ssize_t)sizeof(abuf) && (size_t)an <= WINDOW + granted[first] + (256u << 10));
	uint32_t st = 1 + 2 * first;
	for (ssize_t off = 0; off < an;) {
		size_t n = (size_t)(an - off) > 16384 ? 16384 : (size_t)(an - off);
		raw_send(fd, st, FRAME_DATA, off + (ssize_t)n == an ? FRAME_FLAG_FIN : 0, abuf + off, n);
		off += (ssize_t)n;
	}
	for (;;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 20000) == 1, "EOF before the restore's END");
		if (h.stream == st && h.type == FRAME_ERROR) {
			char msg[256];
			int code = raw_error_code(p, h.len, msg, sizeof(msg));
			CHECKF(false, "the restore failed: %d %s", code, msg);
		}
		bool end = h.stream == st && h.type == FRAME_END;
		free(p);
		if (end)
			break;
	}
	snprintf(f, sizeof(f), "%s/hello", dst);
	snprintf(cmd, sizeof(cmd), "cmp -s '%s/hello' '%s'", src, f);
	CHECKF(system(cmd) == 0, "%s is not the archived file", f);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"hoard", case_hoard},
		{"hoard_budget", case_hoard_budget},
		{"zero_credit", case_zero_credit},
		{"hold_cancel", case_hold_cancel},
		{"stalled_jobs", case_stalled_jobs},
		{"write_hoard", case_write_hoard},
		{"restore_budget", case_restore_budget},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
