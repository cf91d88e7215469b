/* it_fs_io.c: streamed reads and atomic writes through the real daemon: exact bytes, big sparse files,
 * bounded memory, failures that leave the old file intact and no temp file behind, cancellation. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB 1024u
#define MiB (1024u * 1024u)
#define GiB (1024ull * 1024u * 1024u)

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

#if defined(__SANITIZE_ADDRESS__)
/* ASan keeps freed blocks in a quarantine (256 MiB by default): big_stream's RSS
 * check would count it as growth. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "quarantine_size_mb=8";
}
#endif

/* ---- helpers ---- */

/* A daemon on a fresh socket with its own state dir; returns the client. */
static struct sbx_client *start(const char *name, struct it_daemon **dp)
{
	char sock[64], state[64];
	snprintf(sock, sizeof(sock), "%s.sock", name);
	snprintf(state, sizeof(state), "%s.state", name);
	const char *sp = it_path(sock);
	struct it_daemon *d =
		it_daemon_start(name, "--listen", it_unix_target(sp), "--state-dir", it_path(state), NULL);
	if (dp != NULL)
		*dp = d;
	return it_connect(it_unix_target(sp), NULL);
}

/* The whole local file (NULL if it does not exist); *len gets its size. */
static uint8_t *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	CHECK(fstat(fd, &st) == 0);
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	CHECK(buf != NULL);
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		CHECK(n > 0);
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return buf;
}

static void put_local(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, len) == (ssize_t)len);
	close(fd);
}

static void check_local(const char *path, const void *want, size_t want_len)
{
	size_t len = 0;
	uint8_t *got = slurp(path, &len);
	CHECKF(got != NULL, "%s: %s", path, strerror(errno));
	CHECKF(len == want_len && memcmp(got, want, len) == 0, "%s: %zu bytes, not the %zu expected (or other bytes)",
	       path, len, want_len);
	free(got);
}

/* Read the whole file through the SDK and compare. */
static void check_remote(struct sbx_client *c, const char *path, const void *want, size_t want_len)
{
	void *data = NULL;
	size_t len = 0;
	struct sbx_error err;
	CHECK_SBX(sbx_read_file_alloc(c, &no_timeout, path, 64 * MiB, &data, &len, &err), &err);
	CHECKF(len == want_len && memcmp(data, want, len) == 0, "%s read back %zu bytes, not the %zu written", path,
	       len, want_len);
	free(data);
}

static bool is_temp_name(const char *n)
{
	size_t len = strlen(n);
	return len > 12 && n[0] == '.' && memcmp(n + len - 11, ".sbx-", 5) == 0;
}

/* Number of temp files (".NAME.sbx-XXXXXX") in dir. */
static int count_temps(const char *dir)
{
	DIR *d = opendir(dir);
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (is_temp_name(e->d_name))
			n++;
	closedir(d);
	return n;
}

/* Entries in dir other than . and .. (-1 if it does not exist). */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

static void wait_temps(const char *dir, int want, unsigned timeout_ms)
{
	uint64_t deadline = it_now_ms() + timeout_ms;
	int n;
	while ((n = count_temps(dir)) != want) {
		CHECKF(it_now_ms() < deadline, "%s holds %d temp files, not %d, after %u ms", dir, n, want, timeout_ms);
		it_sleep_ms(5);
	}
}

/* Wait until dir (the pending-writes journal) holds want entries. A cancelled or
 * abandoned write is cleaned up after its stream has ended: the temp file goes first,
 * then its journal entry (so that a crash in between leaves an entry naming nothing,
 * never a temp file that no entry names), so a test that has seen the temp file go
 * must wait for the entry too. */
static void wait_entries(const char *dir, int want, unsigned timeout_ms)
{
	uint64_t deadline = it_now_ms() + timeout_ms;
	int n;
	while ((n = it_journal_pending(dir)) != want) {
		CHECKF(it_now_ms() < deadline, "%s holds %d entries, not %d, after %u ms", dir, n, want, timeout_ms);
		it_sleep_ms(5);
	}
}

static void wait_streams_idle(struct sbx_client *c)
{
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.streams == 1)
			return;
		CHECKF(it_now_ms() < deadline, "the daemon still has %u streams", in.streams);
		it_sleep_ms(5);
	}
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

/* A source handing out data in the sizes of a cycle (1, 7, 4096, ...), to check that
 * chunking does not matter. */
struct odd_source {
	const uint8_t *p;
	size_t left;
	unsigned i;
};

static long odd_source_fn(void *ud, void *buf, size_t len)
{
	static const size_t sizes[] = {1, 7, 4096, 65535, 3, 100000, 65536};
	struct odd_source *s = ud;
	size_t n = sizes[s->i++ % 7];
	if (n > len)
		n = len;
	if (n > s->left)
		n = s->left;
	memcpy(buf, s->p, n);
	s->p += n;
	s->left -= n;
	return (long)n;
}

static long vmrss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	CHECK(f != NULL);
	char line[256];
	long kb = -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "VmRSS:", 6) == 0)
			kb = strtol(line + 6, NULL, 10);
	fclose(f);
	return kb;
}

/* ---- cases ---- */

static int case_roundtrip(void)
{
	struct sbx_client *c = start("shim", NULL);
	static const size_t sizes[] = {0, 1, 64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 256 * KiB + 3, MiB + 7, 3 * MiB};
	size_t maxlen = 3 * MiB;
	uint8_t *data = malloc(maxlen);
	CHECK(data != NULL);
	struct sbx_error err;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t len = sizes[i];
		it_fill(data, len, i + 1);
		/* NULs, 0xff and newlines in every file */
		for (size_t j = 0; j < len; j += 97)
			data[j] = (uint8_t)(j % 3 == 0 ? 0 : j % 3 == 1 ? 0xff : '\n');
		char name[32];
		snprintf(name, sizeof(name), "f%zu", len);
		const char *path = it_path(name);
		struct sbx_stat st = SBX_STAT_INIT;
		CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, data, len, &st, &err), &err);
		CHECK_EQ(st.size, len);
		CHECK_EQ(st.type, SBX_FT_FILE);
		CHECK_EQ(st.mode, 0644);
		check_local(path, data, len);
		check_remote(c, path, data, len);

		/* the same through a source of odd chunk sizes and a sink of our own */
		struct odd_source src = {data, len, (unsigned)i};
		CHECK_SBX(sbx_write_file(c, NULL, path, 0, SBX_MODE_KEEP, odd_source_fn, &src, &st, &err), &err);
		CHECK_EQ(st.size, len);
		check_local(path, data, len);
		struct membuf m = {malloc(len + 1), 0, len};
		CHECK(m.p != NULL);
		uint64_t n = 0;
		CHECK_SBX(sbx_read_file(c, NULL, path, 0, SBX_TO_END, membuf_sink, &m, &n, &err), &err);
		CHECK_EQ(n, len);
		CHECK(m.len == len && memcmp(m.p, data, len) == 0);
		free(m.p);
	}
	/* a file written locally reads back exactly too */
	it_fill(data, maxlen, 99);
	put_local(it_path("local"), data, maxlen);
	check_remote(c, it_path("local"), data, maxlen);
	/* read_file_alloc: a file of exactly max bytes fits, one byte more does not */
	void *buf = NULL;
	size_t len = 0;
	CHECK_SBX(sbx_read_file_alloc(c, NULL, it_path("local"), maxlen, &buf, &len, &err), &err);
	CHECK_EQ(len, maxlen);
	free(buf);
	buf = NULL;
	CHECK(sbx_read_file_alloc(c, NULL, it_path("local"), maxlen - 1, &buf, &len, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EFBIG);
	CHECK(buf == NULL);
	CHECK_EQ(count_temps(it_dir()), 0);
	wait_streams_idle(c);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* A sink that cuts the file it reads short on its first call. */
struct trunc_sink {
	struct membuf m;
	const char *path;
};

static int trunc_sink_fn(void *ud, const void *buf, size_t len)
{
	struct trunc_sink *t = ud;
	if (t->m.len == 0)
		CHECK(truncate(t->path, 100000) == 0);
	return membuf_sink(&t->m, buf, len);
}

static int case_offsets(void)
{
	struct sbx_client *c = start("shim", NULL);
	size_t len = 300000;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 3);
	const char *path = it_path("f");
	put_local(path, data, len);
	static const struct {
		uint64_t off, len;
	} r[] = {
		{0, 10},
		{0, 0},
		{1, 1},
		{65530, 20},
		{262140, 10},
		{299990, 100},
		{299999, SBX_TO_END},
		{300000, SBX_TO_END},
		{300000, 5},
		{1000000000, 10},
		{5 * GiB, SBX_TO_END},
		{100, SBX_TO_END},
		{0, 300000},
		{0, 300001},
		{7, UINT64_MAX - 1},
	};
	struct sbx_error err;
	uint8_t *out = malloc(len);
	CHECK(out != NULL);
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		uint64_t off = r[i].off, want = 0;
		if (off < len)
			want = len - off < r[i].len ? len - off : r[i].len;
		struct membuf m = {out, 0, len};
		uint64_t n = 99;
		CHECK_SBX(sbx_read_file(c, NULL, path, off, r[i].len, membuf_sink, &m, &n, &err), &err);
		CHECKF(n == want && m.len == want, "offset %llu length %llu: %llu bytes, want %llu",
		       (unsigned long long)off, (unsigned long long)r[i].len, (unsigned long long)n,
		       (unsigned long long)want);
		CHECK(want == 0 || memcmp(out, data + off, want) == 0);
	}
	/* a file cut short while it is read: not an error; what was read before is exact */
	size_t biglen = 8 * MiB;
	uint8_t *big = malloc(biglen);
	CHECK(big != NULL);
	it_fill(big, biglen, 4);
	put_local(path, big, biglen);
	struct trunc_sink ts = {.m = {malloc(biglen), 0, biglen}, .path = path};
	uint64_t n = 0;
	CHECK_SBX(sbx_read_file(c, NULL, path, 0, SBX_TO_END, trunc_sink_fn, &ts, &n, &err), &err);
	printf("a read of an 8 MiB file cut to 100000 bytes meanwhile delivered %llu bytes\n", (unsigned long long)n);
	CHECK(n >= 100000 && n < biglen);
	CHECK(ts.m.len == n && memcmp(ts.m.p, big, n) == 0);
	free(ts.m.p);
	free(big);
	free(out);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* A 5 GiB sparse file: offsets past 4 GiB are exact. */
static int case_big_sparse(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = it_path("sparse");
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)(5 * GiB)) == 0);
	static const char marker[] = "MARKER at 4.5 GiB\n";
	uint64_t at = 4 * GiB + GiB / 2;
	CHECK(pwrite(fd, marker, sizeof(marker) - 1, (off_t)at) == (ssize_t)sizeof(marker) - 1);
	close(fd);

	struct sbx_error err;
	uint8_t out[256];
	struct membuf m = {out, 0, sizeof(out)};
	uint64_t n;
	CHECK_SBX(sbx_read_file(c, NULL, path, at - 5, 40, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, 40);
	uint8_t want[40] = {0};
	memcpy(want + 5, marker, sizeof(marker) - 1);
	CHECK(memcmp(out, want, 40) == 0);
	/* the last bytes of the file, and past its end */
	m.len = 0;
	CHECK_SBX(sbx_read_file(c, NULL, path, 5 * GiB - 3, 100, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, 3);
	m.len = 0;
	CHECK_SBX(sbx_read_file(c, NULL, path, 5 * GiB, 100, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, 0);
	/* just past 4 GiB, where a 32-bit offset would wrap to 0 */
	m.len = 0;
	CHECK_SBX(sbx_read_file(c, NULL, path, 4 * GiB + 1, 10, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, 10);
	CHECK(memcmp(out, want, 5) == 0);

	/* an append lands past 4 GiB too */
	struct sbx_stat st = SBX_STAT_INIT;
	CHECK(truncate(path, (off_t)(4 * GiB + 7)) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, "tail", 4, &st, &err), &err);
	CHECK_EQ(st.size, 4 * GiB + 11);
	m.len = 0;
	CHECK_SBX(sbx_read_file(c, NULL, path, 4 * GiB + 5, SBX_TO_END, membuf_sink, &m, &n, &err), &err);
	CHECK_EQ(n, 6);
	CHECK(memcmp(out, "\0\0tail", 6) == 0);
	sbx_client_close(c);
	return 0;
}

struct zero_sink {
	uint64_t bytes;
	bool nonzero;
};

static int zero_sink_fn(void *ud, const void *buf, size_t len)
{
	struct zero_sink *z = ud;
	static const uint8_t zeros[64 * 1024];
	const uint8_t *p = buf;
	for (size_t off = 0; off < len; off += sizeof(zeros)) {
		size_t n = len - off < sizeof(zeros) ? len - off : sizeof(zeros);
		if (memcmp(p + off, zeros, n) != 0)
			z->nonzero = true;
	}
	z->bytes += len;
	return 0;
}

/* Streaming 5 GiB through a sink: bounded memory in the SDK's process. */
static int case_big_stream(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = it_path("sparse");
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)(5 * GiB)) == 0);
	close(fd);
	struct sbx_error err;
	long rss0 = vmrss_kb();
	struct zero_sink z = {0, false};
	uint64_t n = 0, t0 = it_now_ms();
	CHECK_SBX(sbx_read_file(c, &no_timeout, path, 0, SBX_TO_END, zero_sink_fn, &z, &n, &err), &err);
	uint64_t ms = it_now_ms() - t0;
	long rss1 = vmrss_kb();
	printf("5 GiB sparse read in %llu ms (%.0f MB/s); client RSS %ld -> %ld kB\n", (unsigned long long)ms,
	       (double)n / 1e3 / (double)(ms ? ms : 1), rss0, rss1);
	CHECK_EQ(n, 5 * GiB);
	CHECK_EQ(z.bytes, 5 * GiB);
	CHECK(!z.nonzero);
	CHECKF(rss1 - rss0 < 32 * 1024, "client RSS grew by %ld kB", rss1 - rss0);
	sbx_client_close(c);
	return 0;
}

static int case_append(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = it_path("log");
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	/* append creates a missing file (0644) */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, "abc", 3, &st, &err), &err);
	CHECK_EQ(st.mode, 0644);
	uint64_t ino = st.inode;
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, "def\0g", 5, &st, &err), &err);
	CHECK_EQ(st.size, 8);
	CHECK_EQ(st.inode, ino); /* in place */
	check_local(path, "abcdef\0g", 8);
	/* appending nothing changes nothing */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, NULL, 0, &st, &err), &err);
	check_local(path, "abcdef\0g", 8);
	/* a mode given is applied in place too */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, 0600, "h", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0600);
	check_local(path, "abcdef\0gh", 9);
	/* appends from two clients interleave whole, never overwrite each other */
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("shim.sock")), NULL);
	CHECK_SBX(sbx_write_file_buf(c2, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, "ij", 2, &st, &err), &err);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_APPEND, SBX_MODE_KEEP, "kl", 2, &st, &err), &err);
	check_local(path, "abcdef\0ghijkl", 13);
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

static int case_exclusive(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = it_path("x");
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, "one", 3, &st, &err), &err);
	check_local(path, "one", 3);
	static const int modes[] = {0, SBX_WRITE_APPEND, SBX_WRITE_NO_ATOMIC};
	for (int i = 0; i < 3; i++) {
		memset(&err, 0, sizeof(err));
		CHECK(sbx_write_file_buf(c, NULL, path, SBX_WRITE_EXCLUSIVE | modes[i], SBX_MODE_KEEP, "two", 3, &st,
					 &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EEXIST);
		CHECK(strcmp(err.path, path) == 0);
		check_local(path, "one", 3);
	}
	/* a big upload is refused before its bytes are kept anywhere */
	size_t big = 3 * MiB;
	uint8_t *data = calloc(1, big);
	CHECK(data != NULL);
	CHECK(sbx_write_file_buf(c, NULL, path, SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, data, big, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EEXIST);
	free(data);
	check_local(path, "one", 3);
	/* a dangling symlink exists too */
	CHECK(symlink("nowhere", it_path("dangling")) == 0);
	CHECK(sbx_write_file_buf(c, NULL, it_path("dangling"), SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, "z", 1, &st, &err) <
	      0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EEXIST);
	CHECK_EQ(count_temps(it_dir()), 0);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

static int case_parents(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	char path[300];
	snprintf(path, sizeof(path), "%s/a/b//c/file", it_dir());
	CHECK(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "p", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, path) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_PARENTS, SBX_MODE_KEEP, "p", 1, &st, &err), &err);
	check_local(path, "p", 1);
	struct stat ls;
	CHECK(stat(it_path("a/b"), &ls) == 0 && S_ISDIR(ls.st_mode));
	/* again: the directories exist already */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_PARENTS, SBX_MODE_KEEP, "q", 1, &st, &err), &err);
	check_local(path, "q", 1);
	/* in place too */
	snprintf(path, sizeof(path), "%s/d/e/f", it_dir());
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_PARENTS | SBX_WRITE_APPEND, SBX_MODE_KEEP, "r", 1, &st,
				     &err),
		  &err);
	check_local(path, "r", 1);
	/* a file where a directory should be */
	snprintf(path, sizeof(path), "%s/a/b/c/file/sub/x", it_dir());
	CHECK(sbx_write_file_buf(c, NULL, path, SBX_WRITE_PARENTS, SBX_MODE_KEEP, "p", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	CHECK(strcmp(err.path, path) == 0);
	sbx_client_close(c);
	return 0;
}

static int case_mode(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	const char *path = it_path("m");
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "1", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0644);
	/* an existing file's mode is kept */
	CHECK(chmod(path, 0600) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "22", 2, &st, &err), &err);
	CHECK_EQ(st.mode, 0600);
	struct stat ls;
	CHECK(stat(path, &ls) == 0);
	CHECK_EQ(ls.st_mode & 07777, 0600);
	check_local(path, "22", 2);
	/* with set-id and sticky bits */
	CHECK(chmod(path, 04751) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "3", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 04751);
	/* a mode given is applied, atomic or not */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, 0640, "4", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0640);
	CHECK(stat(path, &ls) == 0);
	CHECK_EQ(ls.st_mode & 07777, 0640);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_NO_ATOMIC, 0604, "5", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0604);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "6", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0604);
	/* a new file with a mode, whatever the umask */
	CHECK_SBX(sbx_write_file_buf(c, NULL, it_path("n"), 0, 0777, "7", 1, &st, &err), &err);
	CHECK_EQ(st.mode, 0777);
	CHECK_SBX(sbx_write_file_buf(c, NULL, it_path("o"), SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "8", 1, &st, &err),
		  &err);
	CHECK_EQ(st.mode, 0644);
	/* the owner is kept too (the daemon runs as root here) */
	if (getuid() == 0) {
		CHECK(chown(path, 1234, 5678) == 0);
		CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "9", 1, &st, &err), &err);
		CHECK_EQ(st.uid, 1234);
		CHECK_EQ(st.gid, 5678);
		CHECK_EQ(st.mode, 0604);
	}
	/* bad modes are refused before anything is sent */
	CHECK(sbx_write_file_buf(c, NULL, path, 0, 010000, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_write_file_buf(c, NULL, path, 0, -5, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_write_file_buf(c, NULL, path, 0x100, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	check_local(path, "9", 1);
	sbx_client_close(c);
	return 0;
}

/* Atomic writes replace the file (a new inode); no_atomic writes into it. */
static int case_in_place(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	const char *path = it_path("f");
	put_local(path, "old contents", 12);
	struct stat ls;
	CHECK(stat(path, &ls) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "new", 3, &st, &err), &err);
	CHECK_EQ(st.inode, ls.st_ino);
	check_local(path, "new", 3);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "newer", 5, &st, &err), &err);
	CHECK(st.inode != ls.st_ino);
	check_local(path, "newer", 5);
	/* a reader holding the old file keeps the old bytes */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "newest", 6, &st, &err), &err);
	char buf[16];
	CHECK_EQ(pread(fd, buf, sizeof(buf), 0), 5);
	CHECK(memcmp(buf, "newer", 5) == 0);
	close(fd);
	/* a write through a symlink replaces the file it names; the link stays */
	CHECK(symlink("f", it_path("link")) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, it_path("link"), 0, SBX_MODE_KEEP, "via link", 8, &st, &err), &err);
	CHECK(lstat(it_path("link"), &ls) == 0 && S_ISLNK(ls.st_mode));
	check_local(path, "via link", 8);
	/* a device is written, never replaced (with allow_special; without, EPERM) */
	CHECK(sbx_write_file_buf(c, NULL, "/dev/null", 0, SBX_MODE_KEEP, "discard", 7, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "a character device");
	CHECK_SBX(sbx_write_file_buf(c, NULL, "/dev/null", SBX_WRITE_ALLOW_SPECIAL, SBX_MODE_KEEP, "discard", 7, &st,
				     &err),
		  &err);
	CHECK_EQ(st.type, SBX_FT_CHARACTER_DEVICE);
	CHECK(stat("/dev/null", &ls) == 0 && S_ISCHR(ls.st_mode));
	CHECK_EQ(count_temps(it_dir()), 0);
	sbx_client_close(c);
	return 0;
}

static int case_errors(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	uint64_t n;
	struct membuf m = {NULL, 0, 0};
	const char *missing = it_path("missing");
	CHECK(sbx_read_file(c, NULL, missing, 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, missing) == 0);
	CHECK_EQ(n, 0);
	CHECK(sbx_read_file(c, NULL, it_dir(), 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	CHECK(strcmp(err.path, it_dir()) == 0);
	it_write_file(it_path("file"), "x");
	CHECK(sbx_read_file(c, NULL, it_path("file/sub"), 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	static const char *const bad[] = {"relative/path", "", "."};
	for (int i = 0; i < 3; i++) {
		CHECK(sbx_read_file(c, NULL, bad[i], 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
		CHECK(sbx_write_file_buf(c, NULL, bad[i], 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	}
	char longp[5000];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	CHECK(sbx_read_file(c, NULL, longp, 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENAMETOOLONG);
	CHECK(sbx_write_file_buf(c, NULL, longp, 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENAMETOOLONG);
	/* a name too long for the filesystem */
	char longn[400];
	snprintf(longn, sizeof(longn), "%s/%0300d", it_dir(), 0);
	CHECK(sbx_write_file_buf(c, NULL, longn, 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENAMETOOLONG);
	/* writes: into a missing directory, over a directory, to a directory path */
	char path[300];
	snprintf(path, sizeof(path), "%s/nodir/f", it_dir());
	CHECK(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, path) == 0);
	CHECK(mkdir(it_path("dir"), 0755) == 0);
	static const int modes[] = {0, SBX_WRITE_APPEND, SBX_WRITE_NO_ATOMIC};
	for (int i = 0; i < 3; i++) {
		CHECK(sbx_write_file_buf(c, NULL, it_path("dir"), modes[i], SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	}
	snprintf(path, sizeof(path), "%s/", it_path("newdir"));
	CHECK(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	CHECK(sbx_write_file_buf(c, NULL, "/", 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	snprintf(path, sizeof(path), "%s/x", it_path("file"));
	CHECK(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "x", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	/* a sink that refuses the data: its errno, the read is cancelled in the shim */
	size_t big = 2 * MiB;
	uint8_t *data = malloc(big);
	CHECK(data != NULL);
	it_fill(data, big, 1);
	put_local(it_path("big"), data, big);
	free(data);
	struct membuf small = {malloc(100000), 0, 100000};
	CHECK(sbx_read_file(c, NULL, it_path("big"), 0, SBX_TO_END, membuf_sink, &small, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EFBIG);
	CHECK(n < 100000);
	free(small.p);
	/* no sink, no source */
	CHECK(sbx_read_file(c, NULL, it_path("big"), 0, SBX_TO_END, NULL, NULL, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_write_file(c, NULL, it_path("big"), 0, SBX_MODE_KEEP, NULL, NULL, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_EQ(count_temps(it_dir()), 0);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* A read that fails after bytes went out ends with an error, never as a short file.
 * /proc/self/mem of the daemon gives a real one: reading up to the end of a mapping
 * succeeds, the first unmapped byte fails with EIO. */
static int case_read_error_midway(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start("shim", &d);
	char maps[64];
	snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)d->pid);
	FILE *f = fopen(maps, "re");
	CHECK(f != NULL);
	/* runs of adjacent readable mappings followed by a wide gap */
	uint64_t run_start = 0, run_end = 0, best_start = 0, best_end = 0;
	char line[512];
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long a, b;
		char perms[8];
		if (sscanf(line, "%llx-%llx %7s", &a, &b, perms) != 3)
			continue;
		bool special = strstr(line, "[v") != NULL;
		if (run_end != 0 && a - run_end >= 4096 && run_end - run_start >= 64 * KiB && best_end == 0) {
			best_start = run_start;
			best_end = run_end;
		}
		if (perms[0] == 'r' && !special) {
			if (a != run_end)
				run_start = a;
			run_end = b;
		} else {
			run_start = run_end = 0;
		}
	}
	fclose(f);
	if (best_end == 0) {
		printf("no readable mapping followed by a gap in the daemon: skipped\n");
		sbx_client_close(c);
		return IT_SKIP;
	}
	struct membuf m = {malloc(2 * MiB), 0, 2 * MiB};
	struct sbx_error err;
	uint64_t n = 0;
	uint64_t off = best_end - best_start > 600 * KiB ? best_end - 600 * KiB : best_start;
	int rc = sbx_read_file(c, NULL, "/proc/self/mem", off, MiB, membuf_sink, &m, &n, &err);
	printf("read of /proc/self/mem across the end of a mapping: rc %d, %llu bytes delivered, %s\n", rc,
	       (unsigned long long)n, rc < 0 ? it_errstr(&err) : "");
	CHECK(rc < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EIO);
	CHECK(strcmp(err.path, "/proc/self/mem") == 0);
	/* every byte up to the end of the mapping was delivered, then the error */
	CHECKF(n == best_end - off, "%llu bytes were delivered, not %llu", (unsigned long long)n,
	       (unsigned long long)(best_end - off));
	free(m.p);
	/* the connection goes on */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* ---- FIFOs: a blocked open stays off the event loop ---- */

struct fifo_reader {
	struct sbx_client *c;
	const char *path;
	struct sbx_cancel *tok;
	int rc;
	struct sbx_error err;
	uint64_t done_at;
	struct membuf m;
};

static void *fifo_read_thread(void *arg)
{
	struct fifo_reader *r = arg;
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = r->tok};
	uint64_t n;
	r->rc = sbx_read_file_ex(r->c, &o, r->path, 0, SBX_TO_END, SBX_READ_ALLOW_SPECIAL, membuf_sink, &r->m, &n,
				 &r->err);
	r->done_at = it_now_ms();
	return NULL;
}

static int case_fifo(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *fifo = it_path("fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	uint8_t data[200000];
	it_fill(data, sizeof(data), 8);
	put_local(it_path("other"), data, sizeof(data));

	struct fifo_reader r = {.c = c, .path = fifo, .tok = sbx_cancel_new()};
	r.m.p = malloc(4096);
	r.m.cap = 4096;
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fifo_read_thread, &r) == 0);
	it_sleep_ms(200); /* the read waits for a writer on the loop by now */
	uint64_t worst = 0;
	struct sbx_error err;
	for (int i = 0; i < 20; i++) {
		uint64_t rtt;
		CHECK_SBX(sbx_ping(c, NULL, &rtt, &err), &err);
		if (rtt > worst)
			worst = rtt;
	}
	uint64_t t0 = it_now_ms();
	check_remote(c, it_path("other"), data, sizeof(data));
	uint64_t read_ms = it_now_ms() - t0;
	printf("while a FIFO open is stuck: worst ping %.2f ms, a 200 kB read %llu ms\n", (double)worst / 1e6,
	       (unsigned long long)read_ms);
	CHECKF(worst < 100000000, "a ping took %.1f ms", (double)worst / 1e6);
	CHECKF(read_ms < 1000, "a read took %llu ms", (unsigned long long)read_ms);
	CHECK_EQ(r.done_at, 0);

	uint64_t fired = it_now_ms();
	sbx_cancel_fire(r.tok);
	CHECK(pthread_join(th, NULL) == 0);
	printf("the stuck read returned %llu ms after the cancel\n", (unsigned long long)(r.done_at - fired));
	CHECK_EQ(r.rc, -1);
	CHECK_ERR(&r.err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(r.done_at - fired < 500);
	/* the daemon ended the stream (its worker was interrupted) and still serves */
	wait_streams_idle(c);
	check_remote(c, it_path("other"), data, sizeof(data));

	/* a FIFO with a writer streams what the writer sends */
	sbx_cancel_reset(r.tok);
	r.m.len = 0;
	r.done_at = 0;
	CHECK(pthread_create(&th, NULL, fifo_read_thread, &r) == 0);
	int wfd = open(fifo, O_WRONLY | O_CLOEXEC); /* waits for the daemon's open */
	CHECK(wfd >= 0);
	CHECK(write(wfd, "through ", 8) == 8);
	it_sleep_ms(50);
	CHECK(write(wfd, "a pipe", 6) == 6);
	close(wfd);
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(r.rc == 0, "FIFO read: %s", it_errstr(&r.err));
	CHECK(r.m.len == 14 && memcmp(r.m.p, "through a pipe", 14) == 0);
	/* no offsets on a FIFO */
	uint64_t n;
	CHECK(sbx_read_file_ex(c, NULL, fifo, 1, SBX_TO_END, SBX_READ_ALLOW_SPECIAL, membuf_sink, &r.m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ESPIPE);
	/* and without allow_special, not read at all: EPERM naming the type */
	CHECK(sbx_read_file(c, NULL, fifo, 0, SBX_TO_END, membuf_sink, &r.m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "a FIFO");

	sbx_cancel_free(r.tok);
	free(r.m.p);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* ---- no_atomic writes to files that cannot seek ---- */

struct pipe_drain {
	const char *path;
	uint8_t *buf;
	size_t len, cap;
	int err;
};

/* Read the FIFO until its writer closes it. */
static void *drain_thread(void *arg)
{
	struct pipe_drain *d = arg;
	int fd = open(d->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		d->err = errno;
		return NULL;
	}
	while (d->len < d->cap) {
		ssize_t n = read(fd, d->buf + d->len, d->cap - d->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			d->err = errno;
		if (n <= 0)
			break;
		d->len += (size_t)n;
	}
	close(fd);
	return NULL;
}

/* no_atomic writes to what cannot take a positional write are written sequentially:
 * a FIFO (its reader gets exactly the bytes, more than a pipe holds), a character
 * device, and a proc file, which is S_ISREG but refuses pwrite (ESPIPE before). */
static int case_nonseekable(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	const char *fifo = it_path("fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	static uint8_t data[1 * MiB + 777];
	it_fill(data, sizeof(data), 16);
	static uint8_t got[sizeof(data) + 1];
	struct pipe_drain d = {.path = fifo, .buf = got, .cap = sizeof(got)};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, drain_thread, &d) == 0);
	CHECK_SBX(sbx_write_file_buf(c, &no_timeout, fifo, SBX_WRITE_NO_ATOMIC | SBX_WRITE_ALLOW_SPECIAL, SBX_MODE_KEEP,
				     data, sizeof(data), &st, &err),
		  &err);
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(d.err == 0, "reading the FIFO: %s", strerror(d.err));
	CHECKF(d.len == sizeof(data) && memcmp(got, data, sizeof(data)) == 0,
	       "the FIFO's reader got %zu bytes, not the %zu written (or other bytes)", d.len, sizeof(data));
	CHECK_EQ(st.type, SBX_FT_FIFO);
	struct stat ls;
	CHECK(lstat(fifo, &ls) == 0 && S_ISFIFO(ls.st_mode));

	CHECK_SBX(sbx_write_file_buf(c, &no_timeout, "/dev/null", SBX_WRITE_NO_ATOMIC | SBX_WRITE_ALLOW_SPECIAL,
				     SBX_MODE_KEEP, data, sizeof(data), &st, &err),
		  &err);
	CHECK_EQ(st.type, SBX_FT_CHARACTER_DEVICE);
	CHECK(stat("/dev/null", &ls) == 0 && S_ISCHR(ls.st_mode));

	/* a proc file of a child of ours: its timer slack, which the daemon (root, or
	 * CAP_SYS_NICE) may set and we can read back */
	pid_t kid = fork();
	CHECK(kid >= 0);
	if (kid == 0) {
		for (;;)
			pause();
	}
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/%d/timerslack_ns", (int)kid);
	int wr = sbx_write_file_buf(c, &no_timeout, proc, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "123457\n", 7, &st, &err);
	char back[32] = "";
	int fd = open(proc, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, back, sizeof(back) - 1);
		back[n > 0 ? n : 0] = '\0';
		close(fd);
	}
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	CHECKF(wr == 0, "no_atomic write to %s: %s", proc, it_errstr(&err));
	CHECK_EQ(st.type, SBX_FT_FILE);
	CHECKF(strcmp(back, "123457\n") == 0, "%s reads '%s' after the write", proc, back);
	CHECK_EQ(count_temps(it_dir()), 0);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* ---- writes that do not finish ---- */

/* A source that hands out `first` bytes, then blocks until told to go on (or the
 * token fires), then gives `then` (a result for source()). */
struct slow_source {
	size_t first, sent;
	struct sbx_cancel *tok;
	volatile int go;
	long then;
	int then_errno;
	volatile int blocked;
};

static long slow_source_fn(void *ud, void *buf, size_t len)
{
	struct slow_source *s = ud;
	if (s->sent < s->first) {
		size_t n = s->first - s->sent < len ? s->first - s->sent : len;
		memset(buf, 'N', n);
		s->sent += n;
		return (long)n;
	}
	s->blocked = 1;
	while (!s->go && (s->tok == NULL || !sbx_cancel_fired(s->tok)))
		it_sleep_ms(1);
	if (s->then < 0) {
		errno = s->then_errno;
		return -1;
	}
	size_t n = (size_t)s->then < len ? (size_t)s->then : len;
	memset(buf, 'M', n);
	s->then -= (long)n;
	return (long)n;
}

struct writer {
	struct sbx_client *c;
	const char *path;
	int flags;
	struct slow_source *src;
	struct sbx_cancel *tok;
	int rc;
	struct sbx_error err;
	uint64_t done_at;
};

static void *writer_thread(void *arg)
{
	struct writer *w = arg;
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = w->tok};
	struct sbx_stat st = SBX_STAT_INIT;
	w->rc = sbx_write_file(w->c, &o, w->path, w->flags, SBX_MODE_KEEP, slow_source_fn, w->src, &st, &w->err);
	w->done_at = it_now_ms();
	return NULL;
}

static uint8_t old_data[100000];

/* The file a case overwrites, with old_data in it. */
static const char *make_old(void)
{
	static char path[256];
	snprintf(path, sizeof(path), "%s", it_path("target"));
	it_fill(old_data, sizeof(old_data), 42);
	put_local(path, old_data, sizeof(old_data));
	return path;
}

static int case_cancel_write(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = make_old();
	struct slow_source src = {.first = 700 * KiB, .then = 1000};
	struct writer w = {.c = c, .path = path, .src = &src, .tok = sbx_cancel_new()};
	src.tok = w.tok;
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	while (!src.blocked)
		it_sleep_ms(1);
	wait_temps(it_dir(), 1, 5000);
	it_sleep_ms(50);
	uint64_t fired = it_now_ms();
	sbx_cancel_fire(w.tok);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(w.rc, -1);
	CHECK_ERR(&w.err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(w.done_at - fired < 500);
	wait_temps(it_dir(), 0, 5000);
	wait_entries(it_path("shim.state/pending-writes"), 0, 5000);
	check_local(path, old_data, sizeof(old_data));

	/* a source that fails: its errno, and the same clean-up */
	struct slow_source fail = {.first = 300 * KiB, .go = 1, .then = -1, .then_errno = EIO};
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_error err;
	CHECK(sbx_write_file(c, NULL, path, 0, SBX_MODE_KEEP, slow_source_fn, &fail, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EIO);
	wait_temps(it_dir(), 0, 5000);
	check_local(path, old_data, sizeof(old_data));
	wait_streams_idle(c);
	wait_entries(it_path("shim.state/pending-writes"), 0, 5000);
	sbx_cancel_free(w.tok);
	sbx_client_close(c);
	return 0;
}

/* The client goes away in the middle of an upload. */
static int case_disconnect_write(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = make_old();
	for (int round = 0; round < 2; round++) {
		int fd = raw_connect_unix(it_path("shim.sock"));
		raw_hello(fd, NULL);
		Shim__V1__WriteRequest wr = SHIM__V1__WRITE_REQUEST__INIT;
		wr.path.data = (uint8_t *)(uintptr_t)path;
		wr.path.len = strlen(path);
		wr.has_no_atomic = 1;
		wr.no_atomic = 0;
		Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
		req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
		req.write = &wr;
		uint8_t buf[512];
		size_t n = shim__v1__request__get_packed_size(&req);
		CHECK(n <= sizeof(buf));
		shim__v1__request__pack(&req, buf);
		raw_send(fd, 1, FRAME_REQUEST, 0, buf, n);
		static uint8_t chunk[64 * 1024];
		memset(chunk, 'D', sizeof(chunk));
		for (int i = 0; i < 3; i++)
			raw_send(fd, 1, FRAME_DATA, 0, chunk, sizeof(chunk));
		wait_temps(it_dir(), 1, 5000);
		if (round == 0) {
			close(fd);
		} else {
			/* only the write side: the daemon sees EOF, answers what it can */
			shutdown(fd, SHUT_WR);
		}
		wait_temps(it_dir(), 0, 5000);
		check_local(path, old_data, sizeof(old_data));
		if (round == 1)
			close(fd);
	}
	wait_streams_idle(c);
	wait_entries(it_path("shim.state/pending-writes"), 0, 5000);
	/* closing our own SDK client in the middle: the same */
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("shim.sock")), NULL);
	struct slow_source src = {.first = 200 * KiB, .then = -1, .then_errno = EIO};
	struct writer w = {.c = c2, .path = path, .src = &src};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	wait_temps(it_dir(), 1, 5000);
	while (!src.blocked)
		it_sleep_ms(1);
	/* the connection breaks under the call (sbx_client_close must wait for it) */
	CHECK(shutdown(sbx_client_fd(c2), SHUT_RDWR) == 0);
	wait_temps(it_dir(), 0, 5000);
	src.go = 1;
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(w.rc, -1);
	sbx_client_close(c2);
	check_local(path, old_data, sizeof(old_data));
	sbx_client_close(c);
	return 0;
}

/* ---- small writes: the open, the bytes and the commit in one job ---- */

/* Frames put one after the other in buf, sent with one send(): the daemon reads them
 * all at once, as it does a small write's REQUEST and DATA. */
static size_t put_frame(uint8_t *buf, size_t off, uint32_t stream, uint8_t type, uint8_t flags, const void *p,
			size_t len)
{
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(buf + off, &h);
	if (len > 0)
		memcpy(buf + off + FRAME_HDR_LEN, p, len);
	return off + FRAME_HDR_LEN + len;
}

static size_t put_write_request(uint8_t *buf, size_t off, uint32_t stream, const char *path)
{
	Shim__V1__WriteRequest wr = SHIM__V1__WRITE_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)path;
	wr.path.len = strlen(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
	req.write = &wr;
	uint8_t pb[512];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(pb));
	shim__v1__request__pack(&req, pb);
	return put_frame(buf, off, stream, FRAME_REQUEST, 0, pb, n);
}

static void send_all(int fd, const uint8_t *buf, size_t len)
{
	CHECK(send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
}

/* The next frame of stream (skipping WINDOW frames), payload freed. */
static uint8_t next_frame_type(int fd, uint32_t stream, uint8_t **payload, size_t *len)
{
	for (;;) {
		struct frame_hdr h;
		uint8_t *p = NULL;
		CHECK(raw_recv(fd, &h, &p, 5000) == 1);
		if (h.type == FRAME_WINDOW || h.stream != stream) {
			free(p);
			continue;
		}
		if (payload != NULL) {
			*payload = p;
			*len = h.len;
		} else {
			free(p);
		}
		return h.type;
	}
}

/* A spare journal entry's file: an empty first line, then nothing but NUL bytes (no
 * piece of an old path). */
static bool spare_text(const uint8_t *text, size_t len)
{
	if (len == 0 || text[0] != '\n')
		return false;
	for (size_t i = 1; i < len; i++)
		if (text[i] != 0)
			return false;
	return true;
}

/* The one entry of the journal after one write at a time, a spare (its inode), or 0 if
 * there is none. */
static ino_t spare_inode(const char *journal)
{
	DIR *d = opendir(journal);
	if (d == NULL)
		return 0;
	ino_t ino = 0;
	int n = 0;
	struct dirent *e;
	char ent[PATH_MAX + 300];
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		n++;
		ino = e->d_ino;
		snprintf(ent, sizeof(ent), "%s/%s", journal, e->d_name);
	}
	closedir(d);
	CHECKF(n <= 1, "%d entries in %s after one write at a time", n, journal);
	if (n == 1) {
		size_t len = 0;
		uint8_t *text = slurp(ent, &len);
		CHECKF(text != NULL && spare_text(text, len), "the spare entry %s holds '%.*s'", ent, (int)len,
		       text ? (char *)text : "");
		free(text);
	}
	return ino;
}

/* Small writes whose bytes (and FIN) come with the request: exact bytes whatever the
 * size, the old file's mode kept, failures at the open before any byte is written,
 * special files still written on the loop; and the journal entry is reused from one
 * write to the next, not created and deleted (the same inode each time). */
static int case_small_writes(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start("shim", &d);
	char journal[PATH_MAX];
	snprintf(journal, sizeof(journal), "%s", it_path("shim.state/pending-writes"));
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	static uint8_t data[70100];
	it_fill(data, sizeof(data), 21);
	static const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 65535, 65536, 70000};
	char path[PATH_MAX];
	ino_t ino0 = 0;
	for (int round = 0; round < 3; round++) {
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			snprintf(path, sizeof(path), "%s/small%zu", it_dir(), i);
			const uint8_t *b = data + round * 7 + i;
			size_t len = sizes[i] - (sizes[i] > 0 && round > 0 ? 1 : 0) - i * (sizes[i] > 1000);
			if (round == 1)
				CHECK(chmod(path, 0640) == 0);
			CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, b, len, &st, &err), &err);
			check_local(path, b, len);
			CHECK_EQ(st.size, len);
			struct stat ls;
			CHECK(stat(path, &ls) == 0);
			CHECK_EQ(ls.st_mode & 07777, round == 0 ? 0644u : 0640u);
			CHECK_EQ(it_journal_pending(journal), 0);
			ino_t ino = spare_inode(journal);
			CHECKF(ino != 0, "no spare journal entry in %s", journal);
			if (ino0 == 0)
				ino0 = ino;
			CHECKF(ino == ino0, "the journal entry was made anew (inode %llu, then %llu)",
			       (unsigned long long)ino0, (unsigned long long)ino);
		}
	}
	CHECK_EQ(count_temps(it_dir()), 0);

	/* failures at the open: nothing written, nothing left */
	snprintf(path, sizeof(path), "%s/small1", it_dir());
	CHECK(sbx_write_file_buf(c, NULL, path, SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, "new", 3, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EEXIST);
	check_local(path, data + 2 * 7 + 1, 0);
	snprintf(path, sizeof(path), "%s/no/such/dir/f", it_dir());
	CHECK(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "new", 3, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_PARENTS, SBX_MODE_KEEP, "new", 3, NULL, &err), &err);
	check_local(path, "new", 3);
	CHECK(sbx_write_file_buf(c, NULL, it_dir(), 0, SBX_MODE_KEEP, "new", 3, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(journal), 0);

	/* a FIFO with a reader: the bytes that came with the request go on the loop */
	char fifo[PATH_MAX];
	snprintf(fifo, sizeof(fifo), "%s", it_path("small.fifo"));
	CHECK(mkfifo(fifo, 0600) == 0);
	uint8_t got[64];
	struct pipe_drain dr = {.path = fifo, .buf = got, .cap = sizeof(got)};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, drain_thread, &dr) == 0);
	CHECK_SBX(sbx_write_file_buf(c, &no_timeout, fifo, SBX_WRITE_NO_ATOMIC | SBX_WRITE_ALLOW_SPECIAL, SBX_MODE_KEEP,
				     "through the loop", 16, &st, &err),
		  &err);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK(dr.err == 0 && dr.len == 16 && memcmp(got, "through the loop", 16) == 0);
	CHECK_EQ(st.type, SBX_FT_FIFO);

	/* in place (no_atomic) on a regular file, shorter than before: truncated */
	snprintf(path, sizeof(path), "%s/small8", it_dir());
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "in place", 8, &st, &err),
		  &err);
	check_local(path, "in place", 8);

	/* REQUEST, DATA and FIN in one read, raw: END with the bytes in place */
	int fd = raw_connect_unix(it_path("shim.sock"));
	raw_hello(fd, NULL);
	static uint8_t buf[16384];
	snprintf(path, sizeof(path), "%s/raw", it_dir());
	size_t off = put_write_request(buf, 0, 1, path);
	off = put_frame(buf, off, 1, FRAME_DATA, 0, "one ", 4);
	off = put_frame(buf, off, 1, FRAME_DATA, FRAME_FLAG_FIN, "read", 4);
	send_all(fd, buf, off);
	CHECK_EQ(next_frame_type(fd, 1, NULL, NULL), FRAME_END);
	check_local(path, "one read", 8);
	/* REQUEST and DATA without FIN: the bytes are written, the commit waits */
	off = put_write_request(buf, 0, 3, path);
	off = put_frame(buf, off, 3, FRAME_DATA, 0, "first ", 6);
	send_all(fd, buf, off);
	wait_temps(it_dir(), 1, 5000);
	check_local(path, "one read", 8);
	raw_send(fd, 3, FRAME_DATA, FRAME_FLAG_FIN, "then", 4);
	CHECK_EQ(next_frame_type(fd, 3, NULL, NULL), FRAME_END);
	check_local(path, "first then", 10);
	/* REQUEST, DATA and CANCEL in one read: the write never starts, the file stays */
	off = put_write_request(buf, 0, 5, path);
	off = put_frame(buf, off, 5, FRAME_DATA, 0, "gone", 4);
	off = put_frame(buf, off, 5, FRAME_CANCEL, 0, NULL, 0);
	/* and a ping after them: answered once the cancelled write has been dealt with */
	off = put_frame(buf, off, 0, FRAME_PING, 0, "p", 1);
	send_all(fd, buf, off);
	for (;;) {
		struct frame_hdr h;
		uint8_t *p = NULL;
		CHECK(raw_recv(fd, &h, &p, 5000) == 1);
		free(p);
		if (h.type == FRAME_PONG)
			break;
	}
	wait_temps(it_dir(), 0, 5000);
	check_local(path, "first then", 10);
	/* REQUEST and DATA, then the connection goes, all in one read */
	off = put_write_request(buf, 0, 7, path);
	off = put_frame(buf, off, 7, FRAME_DATA, FRAME_FLAG_FIN, "lost", 4);
	send_all(fd, buf, off);
	close(fd);
	wait_streams_idle(c);
	wait_temps(it_dir(), 0, 5000);
	wait_entries(journal, 0, 5000);
	size_t len = 0;
	uint8_t *now = slurp(path, &len);
	CHECK(now != NULL);
	/* (the write may have been done before the daemon saw the connection go) */
	CHECK((len == 10 && memcmp(now, "first then", 10) == 0) || (len == 4 && memcmp(now, "lost", 4) == 0));
	free(now);

	/* SIGTERM: the spare entries go with the daemon */
	CHECKF(it_journal_spares(journal) >= 1, "no spare entry in %s", journal);
	sbx_client_close(c);
	int status = it_daemon_stop(d);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %#x", status);
	CHECK_EQ(count_entries(journal), 0);
	return 0;
}

/* libsbx sends a small buffer (up to 64 KiB) with its REQUEST in one write, as one DATA
 * frame with FIN: exact bytes from threads sharing one client (several such pairs in
 * one read of the shim, frames across its reads), on both sides of the 64 KiB limit; a
 * cancel token fired before the call fails it, the file as it was; the connection goes
 * on after a write refused at the open (the shim drops the DATA that came with it). */
struct whole_writer {
	struct sbx_client *c;
	int id, rc;
	struct sbx_error err;
};

static const size_t whole_sizes[] = {0, 1, 17, 4096, 65535, 65536, 65537, 100000};

static void whole_fill(uint8_t *b, size_t len, int id, int i)
{
	it_fill(b, len, (uint64_t)id * 1000 + (uint64_t)i);
}

static void *whole_thread(void *arg)
{
	struct whole_writer *w = arg;
	static __thread uint8_t buf[100000];
	char path[PATH_MAX];
	for (int i = 0; i < 40 && w->rc == 0; i++) {
		size_t len = whole_sizes[(size_t)(i + w->id) % (sizeof(whole_sizes) / sizeof(whole_sizes[0]))];
		whole_fill(buf, len, w->id, i);
		snprintf(path, sizeof(path), "%s/w%d.%d", it_dir(), w->id, i);
		w->rc = sbx_write_file_buf(w->c, NULL, path, 0, SBX_MODE_KEEP, buf, len, NULL, &w->err);
	}
	return NULL;
}

static int case_whole_writes(void)
{
	struct sbx_client *c = start("shim", NULL);
	struct whole_writer w[4];
	pthread_t th[4];
	for (int t = 0; t < 4; t++) {
		w[t] = (struct whole_writer){.c = c, .id = t};
		CHECK(pthread_create(&th[t], NULL, whole_thread, &w[t]) == 0);
	}
	for (int t = 0; t < 4; t++) {
		CHECK(pthread_join(th[t], NULL) == 0);
		CHECK_SBX(w[t].rc, &w[t].err);
	}
	static uint8_t want[100000];
	char path[PATH_MAX];
	for (int t = 0; t < 4; t++) {
		for (int i = 0; i < 40; i++) {
			size_t len = whole_sizes[(size_t)(i + t) % (sizeof(whole_sizes) / sizeof(whole_sizes[0]))];
			whole_fill(want, len, t, i);
			snprintf(path, sizeof(path), "%s/w%d.%d", it_dir(), t, i);
			check_local(path, want, len);
		}
	}
	CHECK_EQ(count_temps(it_dir()), 0);

	/* a token fired before the call: ECANCELED, the file as it was */
	const char *old = make_old();
	struct sbx_cancel *tok = sbx_cancel_new();
	CHECK(tok != NULL);
	sbx_cancel_fire(tok);
	struct sbx_call_opts o = SBX_CALL_OPTS_INIT;
	o.cancel = tok;
	struct sbx_error err;
	CHECK(sbx_write_file_buf(c, &o, old, 0, SBX_MODE_KEEP, "never", 5, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	sbx_cancel_free(tok);
	check_local(old, old_data, sizeof(old_data));

	/* refused at the open, DATA already sent: the error, then the next write works */
	for (int i = 0; i < 3; i++) {
		CHECK(sbx_write_file_buf(c, NULL, old, SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, "excl", 4, NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EEXIST);
		check_local(old, old_data, sizeof(old_data));
	}
	struct sbx_stat st = SBX_STAT_INIT;
	CHECK_SBX(sbx_write_file_buf(c, NULL, old, 0, SBX_MODE_KEEP, "after", 5, &st, &err), &err);
	CHECK_EQ(st.size, 5);
	check_local(old, "after", 5);
	CHECK_EQ(count_temps(it_dir()), 0);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* The inodes of the journal's entries, sorted, into v (at most max); their count. */
static int entry_inodes(const char *journal, ino_t *v, int max)
{
	DIR *d = opendir(journal);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.' && n < max)
			v[n++] = e->d_ino;
	closedir(d);
	for (int a = 1; a < n; a++)
		for (int b = a; b > 0 && v[b - 1] > v[b]; b--) {
			ino_t t = v[b];
			v[b] = v[b - 1];
			v[b - 1] = t;
		}
	return n;
}

/* Spare journal entries: kept in the journal, locked, naming nothing. Another daemon
 * starting on the same state dir leaves a live daemon's spares alone, and they serve
 * its next writes; a clean exit removes them; those of a daemon that died (SIGKILL)
 * are removed by the next start, and so are an older daemon's spares in
 * STATE/pending-writes.idle with that directory. */
static int case_journal_spares(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start("shim", &d);
	char journal[PATH_MAX], idle[PATH_MAX];
	snprintf(journal, sizeof(journal), "%s", it_path("shim.state/pending-writes"));
	snprintf(idle, sizeof(idle), "%s", it_path("shim.state/pending-writes.idle"));
	struct sbx_error err;
	char path[PATH_MAX];
	/* writes in parallel: more than one spare entry */
	struct sbx_client *cs[4];
	for (int i = 0; i < 4; i++)
		cs[i] = it_connect(it_unix_target(it_path("shim.sock")), NULL);
	struct slow_source src[4];
	struct writer w[4];
	char paths[4][PATH_MAX];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		snprintf(paths[i], sizeof(paths[i]), "%s/par%d", it_dir(), i);
		src[i] = (struct slow_source){.first = 10 * KiB, .then = 3};
		w[i] = (struct writer){.c = cs[i], .path = paths[i], .src = &src[i]};
		CHECK(pthread_create(&th[i], NULL, writer_thread, &w[i]) == 0);
	}
	wait_temps(it_dir(), 4, 5000);
	CHECK_EQ(it_journal_pending(journal), 4);
	for (int i = 0; i < 4; i++)
		src[i].go = 1;
	for (int i = 0; i < 4; i++) {
		CHECK(pthread_join(th[i], NULL) == 0);
		CHECKF(w[i].rc == 0, "write %d: %s", i, it_errstr(&w[i].err));
		sbx_client_close(cs[i]);
	}
	CHECK_EQ(it_journal_pending(journal), 0);
	int spares = it_journal_spares(journal);
	CHECKF(spares >= 1 && spares <= 4, "%d spare entries", spares);
	CHECK_EQ(count_entries(journal), spares);

	/* a longer path, then a shorter one: the entry's first line names exactly the new
	 * temp file, and nothing of the old one is left after it */
	snprintf(path, sizeof(path), "%s/a-rather-long-name-for-a-file-to-write", it_dir());
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "x", 1, NULL, &err), &err);
	char shortp[PATH_MAX];
	snprintf(shortp, sizeof(shortp), "%s", it_path("s"));
	for (int k = 0; k < 4; k++) {
		struct slow_source ss = {.first = 10 * KiB, .then = 1};
		struct writer sw = {.c = c, .path = shortp, .src = &ss};
		pthread_t t;
		CHECK(pthread_create(&t, NULL, writer_thread, &sw) == 0);
		wait_temps(it_dir(), 1, 5000);
		CHECK_EQ(it_journal_pending(journal), 1);
		DIR *dd = opendir(journal);
		CHECK(dd != NULL);
		struct dirent *e;
		char ent[PATH_MAX + 300] = "";
		while ((e = readdir(dd)) != NULL) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(ent, sizeof(ent), "%s/%s", journal, e->d_name);
			size_t elen = 0;
			uint8_t *text = slurp(ent, &elen);
			CHECK(text != NULL);
			bool spare = spare_text(text, elen);
			free(text);
			if (!spare)
				break;
			ent[0] = '\0';
		}
		closedir(dd);
		CHECK(ent[0] != '\0');
		size_t elen = 0;
		uint8_t *text = slurp(ent, &elen);
		CHECK(text != NULL);
		char want[PATH_MAX + 300];
		char real[PATH_MAX];
		CHECK(realpath(it_dir(), real) != NULL);
		DIR *td = opendir(it_dir());
		CHECK(td != NULL);
		char tmpname[256] = "";
		while ((e = readdir(td)) != NULL)
			if (is_temp_name(e->d_name))
				snprintf(tmpname, sizeof(tmpname), "%s", e->d_name);
		closedir(td);
		snprintf(want, sizeof(want), "%s/%s\n", real, tmpname);
		size_t wl = strlen(want), nuls = 0;
		while (wl + nuls < elen && text[wl + nuls] == 0)
			nuls++;
		CHECKF(elen >= wl && memcmp(text, want, wl) == 0 && wl + nuls == elen,
		       "the entry holds '%.*s', not '%s' and NUL bytes", (int)elen, (char *)text, want);
		free(text);
		ss.go = 1;
		CHECK(pthread_join(t, NULL) == 0);
		CHECKF(sw.rc == 0, "%s", it_errstr(&sw.err));
	}
	CHECK_EQ(it_journal_pending(journal), 0);

	/* another daemon starting on the state dir: the spares are locked, it leaves them */
	ino_t before[8], after[8];
	int nb = entry_inodes(journal, before, 8);
	CHECK(nb >= 1 && nb <= 4);
	struct it_daemon *d2 = it_daemon_start("other", "--listen", it_unix_target(it_path("other.sock")),
					       "--state-dir", it_path("shim.state"), NULL);
	CHECK_EQ(entry_inodes(journal, after, 8), nb);
	CHECK(memcmp(before, after, (size_t)nb * sizeof(ino_t)) == 0);
	/* and the first daemon's next writes take them: no entry made anew */
	for (int i = 0; i < 3; i++) {
		CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "again", 5, NULL, &err), &err);
		check_local(path, "again", 5);
		CHECK_EQ(it_journal_pending(journal), 0);
		CHECK_EQ(entry_inodes(journal, after, 8), nb);
		CHECK(memcmp(before, after, (size_t)nb * sizeof(ino_t)) == 0);
	}
	CHECK_EQ(it_daemon_stop(d2), 0);
	CHECK_EQ(it_journal_spares(journal), nb); /* (the first daemon's, still alive) */

	/* SIGKILL: its spare entries are left, and removed by the next start; so are an
	 * older daemon's spares in pending-writes.idle, and that directory */
	sbx_client_close(c);
	CHECK(kill(d->pid, SIGKILL) == 0);
	CHECK(it_daemon_wait_exit(d, 5000));
	CHECK_EQ(it_journal_spares(journal), nb);
	CHECK(mkdir(idle, 0700) == 0);
	char old_spare[PATH_MAX + 32];
	snprintf(old_spare, sizeof(old_spare), "%s/0123456789abcdef", idle);
	it_write_file(old_spare, "/no/such/.f.sbx-AAAAAA\n");
	struct it_daemon *d3 = it_daemon_start("shim3", "--listen", it_unix_target(it_path("shim3.sock")),
					       "--state-dir", it_path("shim.state"), NULL);
	CHECK_EQ(count_entries(journal), 0);
	struct stat ist;
	CHECKF(lstat(idle, &ist) < 0 && errno == ENOENT, "%s is still there", idle);
	check_local(path, "again", 5);
	/* a clean exit removes its spares */
	c = it_connect(it_unix_target(it_path("shim3.sock")), NULL);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "third", 5, NULL, &err), &err);
	CHECK_EQ(it_journal_spares(journal), 1);
	sbx_client_close(c);
	CHECK_EQ(it_daemon_stop(d3), 0);
	CHECK_EQ(count_entries(journal), 0);
	check_local(path, "third", 5);
	return 0;
}

/* SIGKILL in the middle of a write: the temp file stays, the next start removes it. */
static int case_sigkill_write(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start("shim", &d);
	const char *path = make_old();
	struct slow_source src = {.first = 300 * KiB, .then = -1, .then_errno = EIO};
	struct writer w = {.c = c, .path = path, .src = &src};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	wait_temps(it_dir(), 1, 5000);
	while (!src.blocked)
		it_sleep_ms(1);
	const char *journal = it_path("shim.state/pending-writes");
	CHECK_EQ(it_journal_pending(journal), 1);
	CHECK(kill(d->pid, SIGKILL) == 0);
	CHECK(it_daemon_wait_exit(d, 5000));
	it_sleep_ms(50);
	CHECK_EQ(count_temps(it_dir()), 1);
	CHECK_EQ(it_journal_pending(journal), 1);
	check_local(path, old_data, sizeof(old_data));
	src.go = 1;
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(w.rc, -1);
	sbx_client_close(c);

	/* the same state dir: the leftover goes before the daemon takes connections */
	struct it_daemon *d2 = it_daemon_start("shim2", "--listen", it_unix_target(it_path("shim2.sock")),
					       "--state-dir", it_path("shim.state"), NULL);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(journal), 0);
	check_local(path, old_data, sizeof(old_data));
	char *log = it_daemon_log(d2);
	CHECK_CONTAINS(log, "removed");
	free(log);
	c = it_connect(it_unix_target(it_path("shim2.sock")), NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, "after", 5, NULL, &err), &err);
	check_local(path, "after", 5);
	sbx_client_close(c);
	return 0;
}

/* Two daemons sharing a state dir: the second one's start-up sweep leaves the first
 * one's write in progress alone. And SIGTERM in the middle of a write cleans up. */
static int case_shared_state(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start("shim", &d);
	const char *path = make_old();
	struct slow_source src = {.first = 300 * KiB, .then = 5};
	struct writer w = {.c = c, .path = path, .src = &src};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	wait_temps(it_dir(), 1, 5000);
	while (!src.blocked)
		it_sleep_ms(1);
	it_daemon_start("other", "--listen", it_unix_target(it_path("other.sock")), "--state-dir",
			it_path("shim.state"), NULL);
	CHECK_EQ(count_temps(it_dir()), 1);
	CHECK_EQ(it_journal_pending(it_path("shim.state/pending-writes")), 1);
	src.go = 1;
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(w.rc == 0, "the write failed: %s", it_errstr(&w.err));
	size_t len;
	uint8_t *got = slurp(path, &len);
	CHECK(got != NULL && len == 300 * KiB + 5 && got[0] == 'N' && got[len - 1] == 'M');
	free(got);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(it_path("shim.state/pending-writes")), 0);

	/* SIGTERM while a write waits for its bytes: cancelled, nothing left */
	put_local(path, old_data, sizeof(old_data));
	struct slow_source src2 = {.first = 300 * KiB, .then = -1, .then_errno = EIO};
	struct writer w2 = {.c = c, .path = path, .src = &src2};
	CHECK(pthread_create(&th, NULL, writer_thread, &w2) == 0);
	wait_temps(it_dir(), 1, 5000);
	while (!src2.blocked)
		it_sleep_ms(1);
	int status = it_daemon_stop(d);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %#x", status);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(it_path("shim.state/pending-writes")), 0);
	check_local(path, old_data, sizeof(old_data));
	src2.go = 1;
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(w2.rc, -1);
	sbx_client_close(c);
	return 0;
}

/* A slow upload holds back only its own stream. */
static int case_parallel(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *path = make_old();
	struct slow_source src = {.first = 2 * MiB, .then = 0};
	struct writer w = {.c = c, .path = path, .src = &src};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	while (!src.blocked)
		it_sleep_ms(1);
	/* meanwhile other reads and writes on the same client complete */
	uint8_t data[300000];
	struct sbx_error err;
	for (int i = 0; i < 5; i++) {
		char name[16];
		snprintf(name, sizeof(name), "p%d", i);
		it_fill(data, sizeof(data), (uint64_t)i);
		CHECK_SBX(sbx_write_file_buf(c, NULL, it_path(name), 0, SBX_MODE_KEEP, data, sizeof(data), NULL, &err),
			  &err);
		check_remote(c, it_path(name), data, sizeof(data));
	}
	check_local(path, old_data, sizeof(old_data));
	src.go = 1;
	CHECK(pthread_join(th, NULL) == 0);
	CHECKF(w.rc == 0, "%s", it_errstr(&w.err));
	size_t len;
	uint8_t *got = slurp(path, &len);
	CHECK(got != NULL && len == 2 * MiB);
	for (size_t i = 0; i < len; i++)
		CHECK(got[i] == 'N');
	free(got);
	CHECK_EQ(count_temps(it_dir()), 0);
	sbx_client_close(c);
	return 0;
}

/* Timeouts and cancel tokens end a stuck read or write on time; the daemon lets go too. */
static int case_timeouts(void)
{
	struct sbx_client *c = start("shim", NULL);
	const char *fifo = it_path("fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	struct sbx_error err;
	struct membuf m = {malloc(16), 0, 16};
	uint64_t n;
	/* a read that waits for a FIFO's writer */
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 200};
	uint64_t t0 = it_now_ms();
	CHECK(sbx_read_file_ex(c, &o, fifo, 0, SBX_TO_END, SBX_READ_ALLOW_SPECIAL, membuf_sink, &m, &n, &err) < 0);
	uint64_t ms = it_now_ms() - t0;
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	CHECKF(ms >= 190 && ms < 1000, "a 200 ms timeout took %llu ms", (unsigned long long)ms);
	wait_streams_idle(c);
	/* a write stuck the same way (a FIFO without a reader is written in place); a
	 * FIFO of its own: the read's worker may still be in its interrupted open(),
	 * and as a reader it would let this write's open through */
	fifo = it_path("fifo2");
	CHECK(mkfifo(fifo, 0600) == 0);
	size_t big = MiB;
	uint8_t *data = calloc(1, big);
	CHECK(data != NULL);
	t0 = it_now_ms();
	CHECK(sbx_write_file_buf(c, &o, fifo, SBX_WRITE_ALLOW_SPECIAL, SBX_MODE_KEEP, data, big, NULL, &err) < 0);
	ms = it_now_ms() - t0;
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	CHECKF(ms >= 190 && ms < 1000, "a 200 ms timeout took %llu ms", (unsigned long long)ms);
	wait_streams_idle(c);
	/* and with a token fired from another thread */
	struct sbx_cancel *tok = sbx_cancel_new();
	struct slow_source src = {.first = 0, .tok = tok, .then = 10};
	struct writer w = {.c = c, .path = fifo, .src = &src, .tok = tok, .flags = SBX_WRITE_ALLOW_SPECIAL};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, writer_thread, &w) == 0);
	it_sleep_ms(100);
	uint64_t fired = it_now_ms();
	sbx_cancel_fire(tok);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(w.rc, -1);
	CHECK_ERR(&w.err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(w.done_at - fired < 500);
	wait_streams_idle(c);
	/* the daemon still serves, and nothing was left in the directory */
	CHECK_SBX(sbx_write_file_buf(c, NULL, it_path("after"), 0, SBX_MODE_KEEP, "ok", 2, NULL, &err), &err);
	check_local(it_path("after"), "ok", 2);
	CHECK_EQ(count_temps(it_dir()), 0);
	struct stat ls;
	CHECK(lstat(fifo, &ls) == 0 && S_ISFIFO(ls.st_mode));
	sbx_cancel_free(tok);
	free(data);
	free(m.p);
	sbx_client_close(c);
	return 0;
}

/* ENOSPC on a 1 MiB tmpfs in the daemon's own mount namespace. */
static int case_enospc(void)
{
	const char *dir = it_path("small");
	CHECK(mkdir(dir, 0755) == 0);
	char probe[512];
	snprintf(probe, sizeof(probe),
		 "unshare -m --propagation private sh -c 'mount -t tmpfs -o size=1m tmpfs \"$0\"' %s 2>/dev/null", dir);
	if (system(probe) != 0) {
		printf("cannot mount a tmpfs in a private mount namespace (needs root and unshare): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("ns.sock");
	char target[300];
	snprintf(target, sizeof(target), "unix:%s", sock);
	const char *argv[] = {"unshare",
			      "-m",
			      "--propagation",
			      "private",
			      "sh",
			      "-c",
			      "mount -t tmpfs -o size=1m tmpfs \"$0\" && exec \"$@\"",
			      dir,
			      SHIM_BIN,
			      "--listen",
			      target,
			      "--state-dir",
			      it_path("ns.state"),
			      NULL};
	struct it_daemon *d = it_daemon_start_argv("ns", argv);
	struct sbx_client *c = it_connect(target, NULL);
	char path[300];
	snprintf(path, sizeof(path), "%s/file", dir);
	uint8_t old[50000];
	it_fill(old, sizeof(old), 5);
	struct sbx_error err;
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, old, sizeof(old), NULL, &err), &err);
	/* not on our side of the mount */
	CHECK_EQ(count_entries(dir), 0);

	size_t big = 2 * MiB;
	uint8_t *data = malloc(big);
	CHECK(data != NULL);
	it_fill(data, big, 6);
	static const int modes[] = {0, SBX_WRITE_PARENTS, SBX_WRITE_EXCLUSIVE};
	char inside[300];
	snprintf(inside, sizeof(inside), "/proc/%d/root%s", (int)d->pid, dir);
	for (int i = 0; i < 3; i++) {
		const char *p = path;
		char other[300];
		if (modes[i] == SBX_WRITE_EXCLUSIVE) {
			snprintf(other, sizeof(other), "%s/new", dir);
			p = other;
		}
		memset(&err, 0, sizeof(err));
		CHECK(sbx_write_file_buf(c, NULL, p, modes[i], SBX_MODE_KEEP, data, big, NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, ENOSPC);
		CHECK(strcmp(err.path, p) == 0);
		check_remote(c, path, old, sizeof(old));
		/* the daemon's view of the directory: the old file and nothing else */
		CHECK_EQ(count_temps(inside), 0);
		CHECK_EQ(count_entries(inside), 1);
	}
	/* the space is back: a write that fits succeeds */
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, data, 600 * KiB, NULL, &err), &err);
	check_remote(c, path, data, 600 * KiB);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* A file bind-mounted over another (a container's /etc/hosts) cannot be replaced by
 * a rename: it is written in place. */
static int case_bind_mounted(void)
{
	const char *src = it_path("hosts.src"), *dst = it_path("hosts");
	it_write_file(src, "old hosts\n");
	it_write_file(dst, "hidden\n");
	char probe[600];
	snprintf(probe, sizeof(probe),
		 "unshare -m --propagation private sh -c 'mount --bind \"$0\" \"$1\"' %s %s 2>/dev/null", src, dst);
	if (system(probe) != 0) {
		printf("cannot bind-mount in a private mount namespace (needs root and unshare): skipped\n");
		return IT_SKIP;
	}
	const char *sock = it_path("ns.sock");
	char target[300];
	snprintf(target, sizeof(target), "unix:%s", sock);
	const char *argv[] = {"unshare",
			      "-m",
			      "--propagation",
			      "private",
			      "sh",
			      "-c",
			      "mount --bind \"$0\" \"$1\" && shift && exec \"$@\"",
			      src,
			      dst,
			      SHIM_BIN,
			      "--listen",
			      target,
			      "--state-dir",
			      it_path("ns.state"),
			      NULL};
	it_daemon_start_argv("ns", argv);
	struct sbx_client *c = it_connect(target, NULL);
	struct sbx_error err;
	check_remote(c, dst, "old hosts\n", 10);
	CHECK_SBX(sbx_write_file_buf(c, NULL, dst, 0, SBX_MODE_KEEP, "new hosts\n", 10, NULL, &err), &err);
	check_remote(c, dst, "new hosts\n", 10);
	/* in place: the mounted file itself changed */
	check_local(src, "new hosts\n", 10);
	check_local(dst, "hidden\n", 7);
	CHECK_EQ(count_temps(it_dir()), 0);
	sbx_client_close(c);
	return 0;
}

/* --root: writes and reads resolve beneath the root. */
static int case_confined(void)
{
	const char *root = it_path("root");
	CHECK(mkdir(root, 0755) == 0);
	CHECK(mkdir(it_path("outside"), 0755) == 0);
	char link[300];
	snprintf(link, sizeof(link), "%s/escape", root);
	CHECK(symlink(it_path("outside"), link) == 0);
	it_daemon_start("shim", "--listen", it_unix_target(it_path("s.sock")), "--root", root, "--state-dir",
			it_path("state"), NULL);
	struct sbx_client *c = it_connect(it_unix_target(it_path("s.sock")), NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_write_file_buf(c, NULL, "/../../x", 0, SBX_MODE_KEEP, "in root", 7, NULL, &err), &err);
	char p[400];
	snprintf(p, sizeof(p), "%s/x", root);
	check_local(p, "in root", 7);
	check_remote(c, "/x", "in root", 7);
	/* the symlink's absolute target is taken beneath the root: not there */
	char target[300];
	snprintf(target, sizeof(target), "/escape/f");
	CHECK(sbx_write_file_buf(c, NULL, target, 0, SBX_MODE_KEEP, "no", 2, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	/* like mkdir -p, parents does not create what a dangling symlink names */
	CHECK(sbx_write_file_buf(c, NULL, target, SBX_WRITE_PARENTS, SBX_MODE_KEEP, "no", 2, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK_EQ(count_entries(it_path("outside")), 0);
	/* reads likewise */
	it_write_file(it_path("outside/secret"), "s");
	struct membuf m = {malloc(16), 0, 16};
	uint64_t n;
	CHECK(sbx_read_file(c, NULL, "/escape/secret", 0, SBX_TO_END, membuf_sink, &m, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	free(m.p);
	/* a symlink to the top inside the root, written through */
	snprintf(link, sizeof(link), "%s/top", root);
	CHECK(symlink("/", link) == 0);
	CHECK_SBX(sbx_write_file_buf(c, NULL, "/top/y", 0, SBX_MODE_KEEP, "y", 1, NULL, &err), &err);
	snprintf(p, sizeof(p), "%s/y", root);
	check_local(p, "y", 1);
	CHECK_EQ(count_temps(root), 0);
	sbx_client_close(c);
	return 0;
}

/* ---- durability: fsync failures injected into the daemon (fsync_fault.c, LD_PRELOAD) ---- */

/* Does the interposer's log hold a line starting with prefix? */
static bool fault_logged(const char *log, const char *prefix)
{
	size_t len = 0;
	char *text = (char *)slurp(log, &len);
	if (text == NULL)
		return false;
	text[len] = '\0';
	bool found = false;
	for (char *line = text; line != NULL && *line != '\0' && !found;) {
		found = strncmp(line, prefix, strlen(prefix)) == 0;
		line = strchr(line, '\n');
		if (line != NULL)
			line++;
	}
	free(text);
	return found;
}

/* A daemon whose fsync/fdatasync fail with EIO for fds whose path matches the glob match;
 * *logp: the interposer's log. Skips when LD_PRELOAD cannot reach the daemon (static). */
static struct sbx_client *start_faulty(const char *match, const char **logp)
{
#ifdef SHIM_IS_STATIC
	(void)match;
	(void)logp;
	printf("the daemon is linked statically: LD_PRELOAD cannot reach it, skipped\n");
	exit(IT_SKIP);
#else
	/* (it_path() reuses its buffers: the log's path is kept here) */
	static char log[PATH_MAX], env_match[PATH_MAX + 32], env_log[PATH_MAX + 32], env_asan[1024], target[PATH_MAX];
	const char *sock = it_path("faulty.sock");
	snprintf(log, sizeof(log), "%s", it_path("fault.log"));
	snprintf(env_match, sizeof(env_match), "FSYNC_FAULT_MATCH=%s", match);
	snprintf(env_log, sizeof(env_log), "FSYNC_FAULT_LOG=%s", log);
	/* an ASan daemon insists on its runtime coming first; the interposer does not touch
	 * memory ASan watches */
	const char *asan = getenv("ASAN_OPTIONS");
	snprintf(env_asan, sizeof(env_asan), "ASAN_OPTIONS=%s%sverify_asan_link_order=0", asan ? asan : "",
		 asan && asan[0] ? ":" : "");
	snprintf(target, sizeof(target), "unix:%s", sock);
	const char *argv[] = {
		"env",         "LD_PRELOAD=" FSYNC_FAULT_SO, env_match, env_log, env_asan, SHIM_BIN, "--listen", target,
		"--state-dir", it_path("faulty.state"),      NULL};
	struct it_daemon *d = it_daemon_start_argv("faulty", argv);
	char want[64];
	snprintf(want, sizeof(want), "loaded %d\n", (int)d->pid);
	CHECKF(fault_logged(log, want), "the fsync interposer %s is not loaded in the daemon (no \"%s\" in %s)",
	       FSYNC_FAULT_SO, want, log);
	*logp = log;
	return it_connect(target, NULL);
#endif
}

static ino_t inode_of(const char *path)
{
	struct stat st;
	CHECKF(stat(path, &st) == 0, "stat %s: %s", path, strerror(errno));
	return st.st_ino;
}

/* The temp file's fsync before the rename fails: the write fails with EIO and leaves the
 * old file as it was (same inode, same bytes), no temp file and no journal entry; a new
 * name is not created. (A daemon that skipped this fsync would report success.) */
static int case_fsync_temp(void)
{
	char dir[PATH_MAX], other[PATH_MAX], match[PATH_MAX + 16], path[PATH_MAX + 16], fresh[PATH_MAX + 16];
	CHECK(mkdir(it_path("d"), 0755) == 0 && mkdir(it_path("other"), 0755) == 0);
	CHECK(realpath(it_path("d"), dir) != NULL && realpath(it_path("other"), other) != NULL);
	snprintf(match, sizeof(match), "%s/.*.sbx-*", dir);
	snprintf(path, sizeof(path), "%s/target", dir);
	snprintf(fresh, sizeof(fresh), "%s/fresh", dir);
	char journal[PATH_MAX];
	snprintf(journal, sizeof(journal), "%s", it_path("faulty.state/pending-writes"));
	const char *log;
	struct sbx_client *c = start_faulty(match, &log);

	uint8_t old[100000];
	it_fill(old, sizeof(old), 41);
	put_local(path, old, sizeof(old));
	ino_t ino = inode_of(path);
	size_t n = 600 * KiB; /* more than one window: several write jobs before the commit */
	uint8_t *data = malloc(n);
	CHECK(data != NULL);
	it_fill(data, n, 42);

	const char *targets[] = {path, fresh};
	for (int i = 0; i < 2; i++) {
		struct sbx_error err;
		memset(&err, 0, sizeof(err));
		CHECKF(sbx_write_file_buf(c, NULL, targets[i], 0, SBX_MODE_KEEP, data, n, NULL, &err) < 0,
		       "write %s succeeded although the fsync of its temp file failed", targets[i]);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EIO);
		CHECK_CONTAINS(err.message, "fsync");
		CHECK(strcmp(err.path, targets[i]) == 0);
		/* the ERROR comes after the clean-up: nothing to wait for */
		check_local(path, old, sizeof(old));
		CHECK_EQ(inode_of(path), ino);
		CHECKF(access(fresh, F_OK) < 0 && errno == ENOENT, "%s exists after the failed write", fresh);
		CHECK_EQ(count_temps(dir), 0);
		CHECK_EQ(count_entries(dir), 1);
		CHECK_EQ(it_journal_pending(journal), 0);
	}
	char want[PATH_MAX + 32];
	snprintf(want, sizeof(want), "fsync %s/.target.sbx-", dir);
	CHECKF(fault_logged(log, want), "the interposer failed no fsync of a temp file of %s", path);

	/* elsewhere the same daemon writes as usual */
	char ok[PATH_MAX + 16];
	snprintf(ok, sizeof(ok), "%s/file", other);
	struct sbx_error err;
	CHECK_SBX(sbx_write_file_buf(c, NULL, ok, 0, SBX_MODE_KEEP, data, n, NULL, &err), &err);
	check_local(ok, data, n);
	CHECK_EQ(it_journal_pending(journal), 0);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* The directory's fsync after the rename fails: the new file is in place, but the write
 * must not report success (PROTOCOL.md 12.1): EIO saying so, no temp file, no journal
 * entry. (A daemon that skipped this fsync, or ignored its failure, would report success.) */
static int case_fsync_dir(void)
{
	char dir[PATH_MAX], other[PATH_MAX], path[PATH_MAX + 16];
	CHECK(mkdir(it_path("d"), 0755) == 0 && mkdir(it_path("other"), 0755) == 0);
	CHECK(realpath(it_path("d"), dir) != NULL && realpath(it_path("other"), other) != NULL);
	snprintf(path, sizeof(path), "%s/target", dir);
	char journal[PATH_MAX];
	snprintf(journal, sizeof(journal), "%s", it_path("faulty.state/pending-writes"));
	const char *log;
	struct sbx_client *c = start_faulty(dir, &log);

	uint8_t old[100000];
	it_fill(old, sizeof(old), 43);
	put_local(path, old, sizeof(old));
	ino_t ino = inode_of(path);
	size_t n = 600 * KiB;
	uint8_t *data = malloc(n);
	CHECK(data != NULL);
	it_fill(data, n, 44);

	struct sbx_error err;
	memset(&err, 0, sizeof(err));
	CHECKF(sbx_write_file_buf(c, NULL, path, 0, SBX_MODE_KEEP, data, n, NULL, &err) < 0,
	       "write %s succeeded although the fsync of its directory failed", path);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EIO);
	CHECK_CONTAINS(err.message, "fsync of the directory after the rename");
	CHECK_CONTAINS(err.message, "the new file is in place");
	CHECK(strcmp(err.path, path) == 0);
	/* the rename happened: the new bytes, in a new inode */
	check_local(path, data, n);
	CHECK(inode_of(path) != ino);
	CHECK_EQ(count_temps(dir), 0);
	CHECK_EQ(count_entries(dir), 1);
	CHECK_EQ(it_journal_pending(journal), 0);
	char want[PATH_MAX + 16];
	snprintf(want, sizeof(want), "fsync %s\n", dir);
	CHECKF(fault_logged(log, want), "the interposer failed no fsync of %s", dir);

	char ok[PATH_MAX + 16];
	snprintf(ok, sizeof(ok), "%s/file", other);
	CHECK_SBX(sbx_write_file_buf(c, NULL, ok, 0, SBX_MODE_KEEP, data, n, NULL, &err), &err);
	check_local(ok, data, n);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* ---- a big upload's ring ---- */

#define UP_WINDOW (256u << 10) /* the initial window */
#define UP_RING (2u << 20)     /* op_fs_io.c's WR_RING */

/* Read frames until the credit granted on stream a (WINDOW frames) reaches want_a and
 * that on b reaches want_b (b 0: no stream), adding to got[]; any other frame of those
 * streams fails the check. */
static void credit_until(int fd, uint32_t a, uint64_t want_a, uint32_t b, uint64_t want_b, uint64_t got[2])
{
	while (got[0] < want_a || (b != 0 && got[1] < want_b)) {
		struct frame_hdr h;
		uint8_t *p = NULL;
		CHECK(raw_recv(fd, &h, &p, 10000) == 1);
		if (h.type == FRAME_WINDOW && h.len == 4 && (h.stream == a || h.stream == b))
			got[h.stream == a ? 0 : 1] += frame_get_u32(p);
		else
			CHECKF(h.stream != a && h.stream != b, "frame type %u on stream %u while waiting for credit",
			       h.type, h.stream);
		free(p);
	}
}

/* n bytes of DATA on stream, the last frame with FIN if fin, from pat at off. */
static void send_upload(int fd, uint32_t stream, const uint8_t *pat, size_t off, size_t n, bool fin)
{
	for (size_t done = 0; done < n;) {
		size_t k = n - done < (64u << 10) ? n - done : (64u << 10);
		raw_send(fd, stream, FRAME_DATA, fin && done + k == n ? FRAME_FLAG_FIN : 0, pat + off + done, k);
		done += k;
	}
}

/* A write that goes on past its first job gets a ring of 2 MiB and the difference as
 * credit (its client may then send 2 MiB at once, and must be able to); with the
 * daemon's memory budget short, a second one keeps the initial window and still writes
 * every byte; once both are done the budget is back (a third one grows again). */
static int case_upload_ring(void)
{
	struct it_daemon *d = it_daemon_start("ring", "--listen", it_unix_target(it_path("ring.sock")), "--state-dir",
					      it_path("ring.state"), "--max-buffer", "4194304", NULL);
	(void)d;
	size_t total = UP_WINDOW + UP_RING;
	uint8_t *pat = malloc(total);
	CHECK(pat != NULL);
	for (size_t i = 0; i < total; i++)
		pat[i] = (uint8_t)(i * 131 + (i >> 12));
	char a[PATH_MAX], b[PATH_MAX], e[PATH_MAX];
	snprintf(a, sizeof(a), "%s/up-a", it_dir());
	snprintf(b, sizeof(b), "%s/up-b", it_dir());
	snprintf(e, sizeof(e), "%s/up-c", it_dir());
	int fd = raw_connect_unix(it_path("ring.sock"));
	raw_hello(fd, NULL);
	static uint8_t buf[4096];

	/* a: the initial window's worth, no FIN: its credit comes back with the ring's */
	send_all(fd, buf, put_write_request(buf, 0, 1, a));
	send_upload(fd, 1, pat, 0, UP_WINDOW, false);
	uint64_t got[2] = {0, 0};
	credit_until(fd, 1, UP_RING, 0, 0, got);
	CHECK_EQ(got[0], UP_RING);
	/* b, while a holds its ring: 4 MiB of budget has no room for another */
	send_all(fd, buf, put_write_request(buf, 0, 3, b));
	send_upload(fd, 3, pat, 0, UP_WINDOW, false);
	got[0] = got[1] = 0;
	credit_until(fd, 3, UP_WINDOW, 0, 0, got);
	CHECK_EQ(got[0], UP_WINDOW);
	/* a sends all the credit it has at once; b its window again */
	send_upload(fd, 1, pat, UP_WINDOW, UP_RING, true);
	send_upload(fd, 3, pat, UP_WINDOW, UP_WINDOW, true);
	int ends = 0;
	while (ends < 2) {
		struct frame_hdr h;
		uint8_t *p = NULL;
		CHECK(raw_recv(fd, &h, &p, 10000) == 1);
		if (h.stream == 1 || h.stream == 3) {
			CHECKF(h.type == FRAME_WINDOW || h.type == FRAME_END, "frame type %u on stream %u", h.type,
			       h.stream);
			ends += h.type == FRAME_END;
		}
		free(p);
	}
	check_local(a, pat, total);
	check_local(b, pat, 2 * UP_WINDOW);
	/* the budget is back: the next big one grows */
	send_all(fd, buf, put_write_request(buf, 0, 5, e));
	send_upload(fd, 5, pat, 0, UP_WINDOW, false);
	got[0] = got[1] = 0;
	credit_until(fd, 5, UP_RING, 0, 0, got);
	CHECK_EQ(got[0], UP_RING);
	send_upload(fd, 5, pat, UP_WINDOW, UP_RING, true);
	CHECK_EQ(next_frame_type(fd, 5, NULL, NULL), FRAME_END);
	check_local(e, pat, total);
	close(fd);
	CHECK_EQ(it_journal_pending(it_path("ring.state/pending-writes")), 0);
	free(pat);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"roundtrip", case_roundtrip},
		{"offsets", case_offsets},
		{"big_sparse", case_big_sparse},
		{"big_stream", case_big_stream},
		{"append", case_append},
		{"exclusive", case_exclusive},
		{"parents", case_parents},
		{"mode", case_mode},
		{"in_place", case_in_place},
		{"errors", case_errors},
		{"read_error_midway", case_read_error_midway},
		{"fifo", case_fifo},
		{"nonseekable", case_nonseekable},
		{"cancel_write", case_cancel_write},
		{"disconnect_write", case_disconnect_write},
		{"small_writes", case_small_writes},
		{"whole_writes", case_whole_writes},
		{"journal_spares", case_journal_spares},
		{"sigkill_write", case_sigkill_write},
		{"shared_state", case_shared_state},
		{"parallel", case_parallel},
		{"timeouts", case_timeouts},
		{"enospc", case_enospc},
		{"bind_mounted", case_bind_mounted},
		{"confined", case_confined},
		{"fsync_temp", case_fsync_temp},
		{"fsync_dir", case_fsync_dir},
		{"upload_ring", case_upload_ring},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
