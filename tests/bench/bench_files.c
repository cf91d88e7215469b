/* bench_files.c: file throughput through the daemon against same-run baselines: a 1 GiB read from the
 * page cache against a raw socketpair copy of the same bytes, a 1 GiB durable write against
 * `dd conv=fsync`, 4 KiB atomic writes per second, and the daemon's peak RSS growth meanwhile. */
#include "bench_util.h"
#include "sbx.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_MIB 1024
#define TRIES 3
/* Even: each side goes first as often as the other. The one that goes second often
 * runs while the disk below (the host's) still writes the first one's gigabyte back,
 * at a third of the speed; with 5 tries one side went second three times, and its
 * median was such a run. */
#define WRITE_TRIES 6
#define COPY_BUF (256u << 10)
#define SMALL_FILES 2000
#define SMALL_SIZE 4096
#define SMALL_ROUND 100

static double mb_per_s(uint64_t bytes, uint64_t ns)
{
	return (double)bytes / 1e6 / ((double)ns / 1e9);
}

static void die(const char *what, const struct sbx_error *err)
{
	char msg[1400];
	if (err != NULL)
		fprintf(stderr, "bench_files: %s: %s\n", what, sbx_error_format(err, msg, sizeof(msg)));
	else
		fprintf(stderr, "bench_files: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* VmHWM (peak RSS) of pid in kB; reset it first with reset_peak(). */
static long status_kb(pid_t pid, const char *key)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -1;
	long kb = -1;
	size_t klen = strlen(key);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, key, klen) == 0) {
			kb = strtol(line + klen, NULL, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

/* Start a new peak: "5" to clear_refs resets VmHWM to the current RSS. */
static void reset_peak(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "5", 1) != 1)
			fprintf(stderr, "bench_files: cannot reset the peak RSS: %s\n", strerror(errno));
		close(fd);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed | 1;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(buf + i, &x, len - i < 8 ? len - i : 8);
	}
}

static void make_file(const char *path, uint64_t len)
{
	uint8_t *buf = malloc(1u << 20);
	if (buf == NULL)
		die("malloc", NULL);
	fill(buf, 1u << 20, 7);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		die(path, NULL);
	for (uint64_t off = 0; off < len; off += 1u << 20) {
		buf[0] = (uint8_t)(off >> 20); /* no two MiB alike */
		size_t n = len - off < (1u << 20) ? (size_t)(len - off) : 1u << 20;
		if (bench_write_all(fd, buf, n) < 0)
			die(path, NULL);
	}
	close(fd);
	free(buf);
}

/* ---- reads ---- */

static int count_sink(void *ud, const void *buf, size_t len)
{
	(void)buf;
	*(uint64_t *)ud += len;
	return 0;
}

static double shim_read(struct sbx_client *c, const char *path, uint64_t len)
{
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};
	struct sbx_error err;
	uint64_t got = 0;
	uint64_t t0 = bench_now_ns();
	if (sbx_read_file(c, &o, path, 0, SBX_TO_END, count_sink, &got, NULL, &err) < 0)
		die("sbx_read_file", &err);
	uint64_t dt = bench_now_ns() - t0;
	if (got != len) {
		fprintf(stderr, "bench_files: read %llu bytes of %llu\n", (unsigned long long)got,
			(unsigned long long)len);
		exit(1);
	}
	return mb_per_s(len, dt);
}

/* The baseline: a child preads the file and writes it into a socketpair; we read it out. */
static double raw_read(const char *path, uint64_t len)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair", NULL);
	uint64_t t0 = bench_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		die("fork", NULL);
	if (pid == 0) {
		close(sv[0]);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		uint8_t *b = malloc(COPY_BUF);
		if (fd < 0 || b == NULL)
			_exit(1);
		for (off_t off = 0;;) {
			ssize_t n = pread(fd, b, COPY_BUF, off);
			if (n <= 0 || bench_write_all(sv[1], b, (size_t)n) < 0)
				break;
			off += n;
		}
		_exit(0);
	}
	close(sv[1]);
	uint8_t *b = malloc(COPY_BUF);
	uint64_t got = 0;
	for (;;) {
		ssize_t n = read(sv[0], b, COPY_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (uint64_t)n;
	}
	uint64_t dt = bench_now_ns() - t0;
	close(sv[0]);
	waitpid(pid, NULL, 0);
	free(b);
	if (got != len) {
		fprintf(stderr, "bench_files: the raw copy moved %llu bytes of %llu\n", (unsigned long long)got,
			(unsigned long long)len);
		exit(1);
	}
	return mb_per_s(len, dt);
}

/* ---- writes ---- */

struct pattern_source {
	const uint8_t *pat; /* 1 MiB */
	uint64_t left, off;
};

static long pattern_source_fn(void *ud, void *buf, size_t len)
{
	struct pattern_source *s = ud;
	size_t pos = (size_t)(s->off % (1u << 20));
	size_t n = len < (1u << 20) - pos ? len : (1u << 20) - pos;
	if (n > s->left)
		n = (size_t)s->left;
	memcpy(buf, s->pat + pos, n);
	s->left -= n;
	s->off += n;
	return (long)n;
}

static double shim_write(struct sbx_client *c, const char *path, const uint8_t *pat, uint64_t len)
{
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};
	struct sbx_error err;
	struct pattern_source s = {pat, len, 0};
	struct sbx_stat st = SBX_STAT_INIT;
	uint64_t t0 = bench_now_ns();
	if (sbx_write_file(c, &o, path, 0, SBX_MODE_KEEP, pattern_source_fn, &s, &st, &err) < 0)
		die("sbx_write_file", &err);
	uint64_t dt = bench_now_ns() - t0;
	if (st.size != len) {
		fprintf(stderr, "bench_files: wrote a file of %llu bytes, not %llu\n", (unsigned long long)st.size,
			(unsigned long long)len);
		exit(1);
	}
	return mb_per_s(len, dt);
}

static double dd_write(const char *path, unsigned mib)
{
	char of[512], count[32];
	snprintf(of, sizeof(of), "of=%s", path);
	snprintf(count, sizeof(count), "count=%u", mib);
	uint64_t t0 = bench_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		die("fork", NULL);
	if (pid == 0) {
		execlp("dd", "dd", "if=/dev/zero", of, "bs=1M", count, "conv=fsync", "status=none", (char *)NULL);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	uint64_t dt = bench_now_ns() - t0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "bench_files: dd failed (status %#x)\n", (unsigned)st);
		exit(1);
	}
	return mb_per_s((uint64_t)mib << 20, dt);
}

/* The same steps as an atomic write, done locally: temp file, write, fsync, rename,
 * fsync of the directory. */
static void local_atomic_write(int dfd, const char *name, const uint8_t *data, size_t len)
{
	char tmp[300];
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || bench_write_all(fd, data, len) < 0 || fchmod(fd, 0644) < 0 || fsync(fd) < 0 ||
	    renameat(dfd, tmp, dfd, name) < 0 || fsync(dfd) < 0)
		die("local atomic write", NULL);
	close(fd);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	/* BENCH_FILES_MIB: a smaller run on a small machine */
	const char *e = getenv("BENCH_FILES_MIB");
	unsigned mib = e != NULL && atoi(e) > 0 ? (unsigned)atoi(e) : DEFAULT_MIB;
	uint64_t len = (uint64_t)mib << 20;

	char dir[256], sock[300], target[320], path[400], small[300];
	bench_tmpdir(dir, sizeof(dir));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(target, sizeof(target), "unix:%s", sock);
	pid_t pid = bench_start_shim(SHIM_BIN, dir);
	struct sbx_connect_opts co = SBX_CONNECT_OPTS_INIT;
	co.client_name = "bench_files";
	struct sbx_client *c;
	struct sbx_error err;
	if (sbx_connect(target, &co, &c, &err) < 0)
		die("connect", &err);

	/* -- read 1 GiB from the page cache -- */
	snprintf(path, sizeof(path), "%s/read.bin", dir);
	make_file(path, len);
	raw_read(path, len); /* warm-up: the whole file in the page cache */
	shim_read(c, path, len);
	long rss0 = status_kb(pid, "VmRSS:");
	reset_peak(pid);
	double shim_r = 0, raw_r = 0;
	for (int t = 0; t < TRIES; t++) {
		double a = shim_read(c, path, len), b = raw_read(path, len);
		if (a > shim_r)
			shim_r = a;
		if (b > raw_r)
			raw_r = b;
	}
	long hwm_r = status_kb(pid, "VmHWM:");
	unlink(path);
	printf("read %u MiB (page cache): sbx_read_file %.0f MB/s, raw socketpair copy %.0f MB/s, ratio %.2f (best of "
	       "%d)\n",
	       mib, shim_r, raw_r, shim_r / raw_r, TRIES);
	printf("read: daemon peak RSS growth %ld kB (VmHWM %ld kB, VmRSS before %ld kB)\n", hwm_r - rss0, hwm_r, rss0);

	/* -- write 1 GiB durably -- */
	/* the bytes dd writes (from /dev/zero): a disk or a host below that treats runs
	 * of zeros specially does so for both */
	uint8_t *pat = calloc(1, 1u << 20);
	if (pat == NULL)
		die("malloc", NULL);
	snprintf(path, sizeof(path), "%s/write.bin", dir);
	char ddpath[400];
	snprintf(ddpath, sizeof(ddpath), "%s/dd.bin", dir);
	rss0 = status_kb(pid, "VmRSS:");
	reset_peak(pid);
	double shim_w[WRITE_TRIES], dd_w[WRITE_TRIES];
	for (int t = 0; t < WRITE_TRIES; t++) {
		/* taking turns at going first: the disk is shared and its speed drifts */
		if (t % 2 == 0) {
			dd_w[t] = dd_write(ddpath, mib);
			shim_w[t] = shim_write(c, path, pat, len);
		} else {
			shim_w[t] = shim_write(c, path, pat, len);
			dd_w[t] = dd_write(ddpath, mib);
		}
		unlink(ddpath);
		unlink(path);
		if (getenv("BENCH_VERBOSE") != NULL)
			printf("  try %d: sbx_write_file %.0f MB/s, dd %.0f MB/s\n", t + 1, shim_w[t], dd_w[t]);
	}
	qsort(shim_w, WRITE_TRIES, sizeof(double), cmp_double);
	qsort(dd_w, WRITE_TRIES, sizeof(double), cmp_double);
	double shim_med = (shim_w[WRITE_TRIES / 2 - 1] + shim_w[WRITE_TRIES / 2]) / 2;
	double dd_med = (dd_w[WRITE_TRIES / 2 - 1] + dd_w[WRITE_TRIES / 2]) / 2;
	long hwm_w = status_kb(pid, "VmHWM:");
	/* the disk's speed varies from run to run: the medians say more than the bests */
	printf("durable write %u MiB: sbx_write_file %.0f MB/s, dd conv=fsync %.0f MB/s, ratio %.2f (medians of %d; "
	       "bests %.0f and %.0f MB/s, ratio %.2f)\n",
	       mib, shim_med, dd_med, shim_med / dd_med, WRITE_TRIES, shim_w[WRITE_TRIES - 1], dd_w[WRITE_TRIES - 1],
	       shim_w[WRITE_TRIES - 1] / dd_w[WRITE_TRIES - 1]);
	printf("write: daemon peak RSS growth %ld kB (VmHWM %ld kB, VmRSS before %ld kB)\n", hwm_w - rss0, hwm_w, rss0);

	/* -- small files -- */
	snprintf(small, sizeof(small), "%s/small", dir);
	if (mkdir(small, 0755) < 0)
		die(small, NULL);
	uint8_t data[SMALL_SIZE];
	fill(data, sizeof(data), 3);
	int dfd = open(small, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		die(small, NULL);
	/* The disk's speed drifts over seconds: the two sides take turns, SMALL_ROUND
	 * files at a time (each round started by the other side than the last), so
	 * both meet the same disk and the same directory size. */
	static uint64_t lat_shim[SMALL_FILES], lat_local[SMALL_FILES];
	uint64_t shim_ns = 0, local_ns = 0;
	for (int r = 0; r < SMALL_FILES / SMALL_ROUND; r++) {
		for (int side = 0; side < 2; side++) {
			bool shim_side = (side == 0) == (r % 2 == 0);
			for (int j = 0; j < SMALL_ROUND; j++) {
				int i = r * SMALL_ROUND + j;
				uint64_t t0 = bench_now_ns();
				if (shim_side) {
					snprintf(path, sizeof(path), "%s/f%d", small, i);
					if (sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, data, sizeof(data),
							       NULL, &err) < 0)
						die("sbx_write_file_buf", &err);
				} else {
					char name[32];
					snprintf(name, sizeof(name), "g%d", i);
					local_atomic_write(dfd, name, data, sizeof(data));
				}
				uint64_t dt = bench_now_ns() - t0;
				if (shim_side)
					lat_shim[i] = dt, shim_ns += dt;
				else
					lat_local[i] = dt, local_ns += dt;
			}
		}
	}
	double shim_s = SMALL_FILES / ((double)shim_ns / 1e9);
	double local_s = SMALL_FILES / ((double)local_ns / 1e9);
	uint64_t shim_p50 = bench_percentile(lat_shim, SMALL_FILES, 50);
	uint64_t local_p50 = bench_percentile(lat_local, SMALL_FILES, 50);
	printf("small-file writes (%d x %d bytes, atomic, fsync'd): sbx_write_file_buf %.0f files/s, the same steps "
	       "locally %.0f files/s, ratio %.2f (interleaved in rounds of %d); per file p50 %.0f us vs %.0f us\n",
	       SMALL_FILES, SMALL_SIZE, shim_s, local_s, shim_s / local_s, SMALL_ROUND, (double)shim_p50 / 1e3,
	       (double)local_p50 / 1e3);
	for (int i = 0; i < SMALL_FILES; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%d", i);
		unlinkat(dfd, name, 0);
		snprintf(name, sizeof(name), "g%d", i);
		unlinkat(dfd, name, 0);
	}
	close(dfd);
	rmdir(small);

	sbx_client_close(c);
	bench_stop(pid);
	snprintf(path, sizeof(path), "%s/state/pending-writes", dir);
	rmdir(path);
	bench_rmdir(dir);
	free(pat);
	return 0;
}
