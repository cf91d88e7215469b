/* it_backup_sdk.c: backups and restores through libsbx against the real daemon: the archive
 * streamed to a sink while the shim still works, the record's fields checked against what
 * arrived, atomic local files, restores from a source, wrong sha256s and cancels that leave
 * the directory as it was. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024u
#define MiB (1024u * 1024u)

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

#if defined(__SANITIZE_ADDRESS__)
/* ASan's quarantine would make the big in-memory archives cost far more than they are. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "quarantine_size_mb=16";
}
#endif

/* ---- helpers ---- */

static struct it_daemon *daemon_;
static struct sbx_client *client_;

static struct sbx_client *start(const char *name)
{
	char sock[64], state[64];
	snprintf(sock, sizeof(sock), "%s.sock", name);
	snprintf(state, sizeof(state), "%s.state", name);
	const char *sp = it_path(sock);
	daemon_ = it_daemon_start(name, "--listen", it_unix_target(sp), "--state-dir", it_path(state), NULL);
	client_ = it_connect(it_unix_target(sp), NULL);
	return client_;
}

/* Skip the case: close its client (no leak reports under ASan). */
static int skip_case(void)
{
	sbx_client_close(client_);
	client_ = NULL;
	return IT_SKIP;
}

/* it_path(name) copied into buf (it_path's own buffers are reused after 8 calls). */
static void keep_path(char buf[1024], const char *name)
{
	snprintf(buf, 1024, "%s", it_path(name));
}

/* The backup feature may not be there yet: ENOSYS skips the case. */
static int skip_if_enosys(const struct sbx_error *err)
{
	if (err->kind == SBX_ERR_REMOTE && err->code == ENOSYS) {
		fprintf(stderr, "SKIP: the daemon has no backups yet (%s)\n", it_errstr(err));
		return 1;
	}
	return 0;
}

static void mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0)
			CHECKF(errno == EEXIST, "mkdir %s: %s", buf, strerror(errno));
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0)
		CHECKF(errno == EEXIST, "mkdir %s: %s", buf, strerror(errno));
}

static void put_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, len) == (ssize_t)len);
	CHECK(close(fd) == 0);
}

static void put_str(const char *path, const char *s)
{
	put_file(path, s, strlen(s));
}

/* A tree under root: nbig files of big_size pseudo-random bytes (incompressible) in
 * big/, and nsmall small files spread over a few subdirectories. Returns the file
 * bytes written. */
static uint64_t make_tree(const char *root, unsigned nbig, size_t big_size, unsigned nsmall)
{
	char p[4096];
	uint64_t total = 0;
	mkdirs(root);
	snprintf(p, sizeof(p), "%s/big", root);
	mkdirs(p);
	uint8_t *buf = malloc(big_size > 4096 ? big_size : 4096);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < nbig; i++) {
		it_fill(buf, big_size, 1000 + i);
		snprintf(p, sizeof(p), "%s/big/f%03u", root, i);
		put_file(p, buf, big_size);
		total += big_size;
	}
	for (unsigned i = 0; i < nsmall; i++) {
		snprintf(p, sizeof(p), "%s/s%u", root, i % 8);
		mkdirs(p);
		size_t n = 1 + (i * 37) % 3000;
		it_fill(buf, n, i);
		snprintf(p, sizeof(p), "%s/s%u/file%u", root, i % 8, i);
		put_file(p, buf, n);
		total += n;
	}
	free(buf);
	return total;
}

/* The small tree of the record checks: 5 + 1000 bytes of file data in 6 entries. */
static void make_small_tree(const char *root)
{
	char p[4096];
	uint8_t buf[1000];
	mkdirs(root);
	snprintf(p, sizeof(p), "%s/a", root);
	put_str(p, "hello");
	snprintf(p, sizeof(p), "%s/sub", root);
	mkdirs(p);
	snprintf(p, sizeof(p), "%s/sub/b", root);
	it_fill(buf, sizeof(buf), 7);
	put_file(p, buf, sizeof(buf));
	snprintf(p, sizeof(p), "%s/empty", root);
	mkdirs(p);
	snprintf(p, sizeof(p), "%s/link", root);
	CHECK(symlink("a", p) == 0);
}

/* Run a shell command; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int st = system(cmd);
	return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The two trees hold the same names, types and file contents. */
static void check_same_tree(const char *a, const char *b)
{
	int rc = sh("diff -r --no-dereference '%s' '%s' >&2", a, b);
	CHECKF(rc == 0, "trees %s and %s differ (diff exited %d)", a, b, rc);
}

/* The first line of a command's output, without its newline (static buffer). */
static const char *sh_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *sh_out(const char *fmt, ...)
{
	static char line[8192];
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	FILE *f = popen(cmd, "r");
	CHECKF(f != NULL, "popen %s: %s", cmd, strerror(errno));
	line[0] = '\0';
	if (fgets(line, sizeof(line), f) == NULL)
		line[0] = '\0';
	while (fgetc(f) != EOF)
		;
	pclose(f);
	line[strcspn(line, "\n")] = '\0';
	return line;
}

/* sha256sum's hex digest of len bytes. */
static void sha256_of(const void *data, size_t len, char out[65])
{
	const char *tmp = it_path("sha-input");
	put_file(tmp, data, len);
	const char *l = sh_out("sha256sum '%s'", tmp);
	CHECKF(strlen(l) > 64 && l[64] == ' ', "sha256sum printed '%s'", l);
	memcpy(out, l, 64);
	out[64] = '\0';
	unlink(tmp);
}

static void sha256_of_file(const char *path, char out[65])
{
	const char *l = sh_out("sha256sum '%s'", path);
	CHECKF(strlen(l) > 64 && l[64] == ' ', "sha256sum printed '%s'", l);
	memcpy(out, l, 64);
	out[64] = '\0';
}

/* Names in dir other than . and .., sorted, joined with '|' (static buffer). */
static const char *names_in(const char *dir)
{
	static char out[4096];
	char *names[256];
	int n = 0;
	DIR *d = opendir(dir);
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d)) != NULL && n < 256)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			names[n++] = strdup(e->d_name);
	closedir(d);
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char *t = names[j];
			names[j] = names[j - 1];
			names[j - 1] = t;
		}
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (i > 0)
			strncat(out, "|", sizeof(out) - strlen(out) - 1);
		strncat(out, names[i], sizeof(out) - strlen(out) - 1);
		free(names[i]);
	}
	return out;
}

/* Wait (up to 5 s) until dir holds exactly the names want (as names_in gives them):
 * the shim may remove its temporary tree just after it answered. */
static void wait_names(const char *dir, const char *want)
{
	uint64_t deadline = it_now_ms() + 5000;
	while (strcmp(names_in(dir), want) != 0) {
		CHECKF(it_now_ms() < deadline, "%s holds '%s', want '%s'", dir, names_in(dir), want);
		it_sleep_ms(10);
	}
}

/* An archive held in memory, with the sizes of the chunks it arrived in. */
struct mem {
	uint8_t *p;
	size_t len, cap;
	size_t *chunks;
	size_t nchunks, chunks_cap;
	/* optional behaviour */
	struct sbx_cancel *cancel_after_tok; /* fire it once len >= cancel_after */
	size_t cancel_after;
	unsigned sleep_ms; /* per chunk */
	void (*on_first)(struct mem *m);
	uint64_t first_ms;
	/* progress events seen: total, before the first chunk; last values */
	unsigned events, events_before_first;
	uint64_t ev_bytes, ev_entries;
	uint64_t rchar_at_first; /* the daemon's read bytes when the first chunk was handled */
};

static int mem_sink(void *ud, const void *buf, size_t len)
{
	struct mem *m = ud;
	CHECK(len > 0);
	if (m->nchunks == 0) {
		m->first_ms = it_now_ms();
		if (m->on_first != NULL)
			m->on_first(m);
	}
	if (m->len + len > m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 1 * MiB;
		while (cap < m->len + len)
			cap *= 2;
		m->p = realloc(m->p, cap);
		CHECK(m->p != NULL);
		m->cap = cap;
	}
	memcpy(m->p + m->len, buf, len);
	m->len += len;
	if (m->nchunks == m->chunks_cap) {
		m->chunks_cap = m->chunks_cap ? m->chunks_cap * 2 : 256;
		m->chunks = realloc(m->chunks, m->chunks_cap * sizeof(*m->chunks));
		CHECK(m->chunks != NULL);
	}
	m->chunks[m->nchunks++] = len;
	if (m->cancel_after_tok != NULL && m->len >= m->cancel_after)
		sbx_cancel_fire(m->cancel_after_tok);
	if (m->sleep_ms)
		it_sleep_ms(m->sleep_ms);
	return 0;
}

static void mem_progress(void *ud, uint64_t bytes, uint64_t entries)
{
	struct mem *m = ud;
	m->events++;
	if (m->nchunks == 0)
		m->events_before_first++;
	/* progress only goes forward */
	CHECKF(bytes >= m->ev_bytes && entries >= m->ev_entries,
	       "progress went back: %" PRIu64 "/%" PRIu64 " after %" PRIu64 "/%" PRIu64, bytes, entries, m->ev_bytes,
	       m->ev_entries);
	m->ev_bytes = bytes;
	m->ev_entries = entries;
}

static void mem_free(struct mem *m)
{
	free(m->p);
	free(m->chunks);
	memset(m, 0, sizeof(*m));
}

/* A source handing out a buffer in odd sizes (1, 7, 4096, ...): chunking must not matter. */
struct src {
	const uint8_t *p;
	size_t len, off;
	unsigned i;
	/* optional behaviour */
	size_t fail_at; /* 0: never; else fail with fail_errno once off >= fail_at */
	int fail_errno;
	struct sbx_cancel *cancel_tok; /* fire it once off >= cancel_at */
	size_t cancel_at;
	unsigned sleep_ms; /* per call */
	unsigned calls;
};

static long src_fn(void *ud, void *buf, size_t len)
{
	static const size_t sizes[] = {1, 7, 4096, 65535, 3, 100000, 65536, 777};
	struct src *s = ud;
	s->calls++;
	if (s->fail_at != 0 && s->off >= s->fail_at) {
		errno = s->fail_errno;
		return -1;
	}
	if (s->cancel_tok != NULL && s->off >= s->cancel_at)
		sbx_cancel_fire(s->cancel_tok);
	if (s->sleep_ms)
		it_sleep_ms(s->sleep_ms);
	size_t n = sizes[s->i++ % 8];
	if (n > len)
		n = len;
	if (n > s->len - s->off)
		n = s->len - s->off;
	memcpy(buf, s->p + s->off, n);
	s->off += n;
	return (long)n;
}

/* The daemon's read bytes (rchar of /proc/PID/io), or 0 if unreadable. */
static uint64_t daemon_rchar(void)
{
	char path[64], line[128];
	snprintf(path, sizeof(path), "/proc/%d/io", (int)daemon_->pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	uint64_t v = 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "rchar: %" SCNu64, &v) == 1)
			break;
	fclose(f);
	return v;
}

/* "2024-05-01T12:34:56Z" or with a fraction: seconds since the epoch, or -1. */
static int64_t parse_rfc3339_utc(const char *s)
{
	struct tm tm = {0};
	int n = 0;
	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
		   &tm.tm_sec, &n) != 6 ||
	    n != 19)
		return -1;
	const char *p = s + n;
	if (*p == '.') {
		p++;
		if (*p < '0' || *p > '9')
			return -1;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if (strcmp(p, "Z") != 0)
		return -1;
	if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
	    tm.tm_sec > 60)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm);
}

static bool is_uuid(const char *s)
{
	if (strlen(s) != 36)
		return false;
	for (int i = 0; i < 36; i++) {
		bool dash = i == 8 || i == 13 || i == 18 || i == 23;
		if (dash ? s[i] != '-' : strchr("0123456789abcdefABCDEF", s[i]) == NULL || s[i] == '\0')
			return false;
	}
	return true;
}

static bool is_hex64(const char *s)
{
	return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* ---- cases ---- */

static void stall_and_measure(struct mem *m)
{
	/* let the shim run on until the credit we granted is spent */
	it_sleep_ms(400);
	m->rchar_at_first = daemon_rchar();
}

/* The archive reaches the sink in chunks while the shim is still walking the tree:
 * at the first chunk (after a pause long enough for the shim to use up all its credit)
 * it has read only a part of the 48 MiB of file data; progress events come along. */
static int case_stream(void)
{
	struct sbx_client *c = start("stream");
	char dir[1024];
	keep_path(dir, "tree");
	uint64_t data = make_tree(dir, 48, 1 * MiB, 600);
	struct mem m = {.on_first = stall_and_measure};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.progress = mem_progress;
	bo.progress_ud = &m;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	uint64_t r0 = daemon_rchar();
	uint64_t t0 = it_now_ms();
	if (sbx_backup(c, &no_timeout, dir, &bo, mem_sink, &m, &rec, &err) < 0) {
		if (skip_if_enosys(&err))
			return skip_case();
		it_fail(__FILE__, __LINE__, "backup: %s", it_errstr(&err));
	}
	uint64_t t1 = it_now_ms();
	fprintf(stderr,
		"backup of %" PRIu64 " bytes: %zu bytes in %zu chunks, first after %" PRIu64 " ms, all in %" PRIu64
		" ms; %u progress events (%u before the first chunk); daemon read %" PRIu64
		" bytes by the first chunk\n",
		data, m.len, m.nchunks, m.first_ms - t0, t1 - t0, m.events, m.events_before_first,
		m.rchar_at_first - r0);
	CHECK_EQ(rec.bytes, m.len);
	CHECK(m.len > data);
	CHECKF(m.nchunks >= 16, "only %zu chunks", m.nchunks);
	size_t sum = 0;
	for (size_t i = 0; i < m.nchunks; i++) {
		CHECKF(m.chunks[i] > 0 && m.chunks[i] <= 1 * MiB, "chunk %zu of %zu bytes", i, m.chunks[i]);
		sum += m.chunks[i];
	}
	CHECK_EQ(sum, m.len);
	if (m.rchar_at_first != 0) {
		/* streamed, back-pressured: the shim cannot have read the tree, let alone
		 * finished, before we gave credit for more than ~4.25 MiB */
		CHECKF(m.rchar_at_first - r0 < data / 2,
		       "the daemon had read %" PRIu64 " of %" PRIu64 " bytes when the first chunk arrived",
		       m.rchar_at_first - r0, data);
	}
	CHECKF(m.events > 0, "no progress events");
	CHECKF(m.ev_bytes <= rec.bytes && m.ev_entries <= rec.entries,
	       "progress %" PRIu64 "/%" PRIu64 " beyond the record's %" PRIu64 "/%" PRIu64, m.ev_bytes, m.ev_entries,
	       rec.bytes, rec.entries);
	CHECK_EQ(rec.source_bytes, data);
	char sha[65];
	sha256_of(m.p, m.len, sha);
	CHECKF(strcmp(sha, rec.sha256) == 0, "sha256 %s, the record says %s", sha, rec.sha256);
	sbx_backup_record_free(&rec);
	mem_free(&m);
	sbx_client_close(c);
	return 0;
}

/* One backup of the small tree with the given compression: the record against what arrived. */
static void check_record(struct sbx_client *c, const char *dir, int compression)
{
	struct mem m = {0};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.compression = compression;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	time_t before = time(NULL);
	CHECK_SBX(sbx_backup(c, &no_timeout, dir, &bo, mem_sink, &m, &rec, &err), &err);
	time_t after = time(NULL);
	CHECK_EQ(rec.bytes, m.len);
	char sha[65];
	sha256_of(m.p, m.len, sha);
	CHECKF(strcmp(sha, rec.sha256) == 0, "sha256 %s, the record says %s", sha, rec.sha256);
	CHECKF(is_hex64(rec.sha256), "sha256 '%s'", rec.sha256);
	CHECKF(is_uuid(rec.id), "id '%s' is not a UUID", rec.id);
	CHECKF(strcmp(rec.dir, dir) == 0, "dir '%s', want '%s'", rec.dir, dir);
	/* ., a, sub, sub/b, empty, link */
	CHECKF(rec.entries >= 5 && rec.entries <= 6, "entries %" PRIu64, rec.entries);
	CHECK_EQ(rec.source_bytes, 1005);
	CHECK_EQ(rec.compression, compression);
	int64_t t = parse_rfc3339_utc(rec.created_at);
	CHECKF(t >= 0, "created_at '%s' is not RFC 3339 UTC", rec.created_at);
	CHECKF(t >= (int64_t)before - 2 && t <= (int64_t)after + 2, "created_at %s is not now", rec.created_at);
	CHECK_EQ(rec.n_skipped, 0);
	CHECK_EQ(rec.n_changed, 0);
	CHECK(rec.to_path == NULL);
	/* what arrived is the archive: tar lists it */
	char f[1024];
	keep_path(f, "rec.tar");
	put_file(f, m.p, m.len);
	const char *unz = compression == SBX_COMPRESS_ZSTD ? "zstd -dc" :
			  compression == SBX_COMPRESS_GZIP ? "gzip -dc" :
							     "cat";
	int rc = sh("%s '%s' | tar -tvf - >&2 && %s '%s' | tar -tf - | grep -qx '\\(\\./\\)\\?sub/b'", unz, f, unz, f);
	CHECKF(rc == 0, "tar does not list sub/b of the archive (%d)", rc);
	/* the JSON form parses and carries the same values */
	char *json = sbx_backup_record_json(&rec);
	CHECK(json != NULL);
	fprintf(stderr, "%s\n", json);
	put_str(it_path("rec.json"), json);
	rc = sh("python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); "
		"assert r[\"sha256\"]==sys.argv[2] and r[\"bytes\"]==int(sys.argv[3]) and r[\"dir\"]==sys.argv[4] "
		"and r[\"compression\"]==sys.argv[5] and r[\"skipped\"]==[] and r[\"changed\"]==[] "
		"and \"to_path\" not in r and r[\"created_at\"].endswith(\"Z\") and r[\"entries\"]>=5, r' '%s' %s %zu '%s' %s",
		it_path("rec.json"), rec.sha256, m.len, dir,
		compression == SBX_COMPRESS_ZSTD ? "zstd" :
		compression == SBX_COMPRESS_GZIP ? "gzip" :
						   "none");
	CHECKF(rc == 0, "the record's JSON does not match: %s", json);
	free(json);
	sbx_backup_record_free(&rec);
	CHECK(rec.skipped == NULL && rec.changed == NULL);
	mem_free(&m);
}

static int case_record(void)
{
	struct sbx_client *c = start("record");
	char dir[1024];
	keep_path(dir, "small");
	make_small_tree(dir);
	struct sbx_error err;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct mem m = {0};
	if (sbx_backup(c, &no_timeout, dir, NULL, mem_sink, &m, &rec, &err) < 0) {
		if (skip_if_enosys(&err))
			return skip_case();
		it_fail(__FILE__, __LINE__, "backup: %s", it_errstr(&err));
	}
	sbx_backup_record_free(&rec);
	mem_free(&m);
	check_record(c, dir, SBX_COMPRESS_NONE);
	check_record(c, dir, SBX_COMPRESS_GZIP);
	check_record(c, dir, SBX_COMPRESS_ZSTD);
	sbx_client_close(c);
	return 0;
}

/* sbx_backup_record_json on a record filled by hand: escapes, lists, to_path. */
static int case_record_json(void)
{
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	snprintf(rec.id, sizeof(rec.id), "0b6f3c1e-3a51-4a8e-9d1c-7f2b9e0c4d21");
	rec.dir = "/d\"q\\x";
	rec.bytes = 10240;
	memset(rec.sha256, 'a', 64);
	rec.entries = 3;
	rec.source_bytes = 5;
	rec.compression = SBX_COMPRESS_ZSTD;
	snprintf(rec.created_at, sizeof(rec.created_at), "2024-05-01T12:34:56.5Z");
	char *sk[] = {"a\nb\tc", "\xff\xfe", "\xc3\xa9t\xc3\xa9", "\x01", "\xe2\x82"};
	char *ch[] = {"changed"};
	rec.skipped = sk;
	rec.n_skipped = 5;
	rec.changed = ch;
	rec.n_changed = 1;
	rec.to_path = "/t/a.tar";
	char *j = sbx_backup_record_json(&rec);
	CHECK(j != NULL);
	const char *want =
		"{\"id\":\"0b6f3c1e-3a51-4a8e-9d1c-7f2b9e0c4d21\",\"dir\":\"/d\\\"q\\\\x\",\"bytes\":10240,"
		"\"sha256\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"entries\":3,"
		"\"source_bytes\":5,\"compression\":\"zstd\","
		"\"skipped\":[\"a\\nb\\tc\",\"\\u00ff\\u00fe\",\"\xc3\xa9t\xc3\xa9\",\"\\u0001\",\"\\u00e2\\u0082\"],"
		"\"changed\":[\"changed\"],\"created_at\":\"2024-05-01T12:34:56.5Z\",\"to_path\":\"/t/a.tar\"}";
	CHECKF(strcmp(j, want) == 0, "JSON\n%s\nwant\n%s", j, want);
	free(j);
	/* no lists, no to_path */
	rec.skipped = rec.changed = NULL;
	rec.n_skipped = rec.n_changed = 0;
	rec.to_path = NULL;
	rec.compression = SBX_COMPRESS_NONE;
	j = sbx_backup_record_json(&rec);
	CHECK(j != NULL);
	CHECK_CONTAINS(j, "\"compression\":\"none\",\"skipped\":[],\"changed\":[],\"created_at\"");
	CHECK(strstr(j, "to_path") == NULL);
	free(j);
	/* record_free on a zeroed record, twice */
	memset(&rec, 0, sizeof(rec));
	sbx_backup_record_free(&rec);
	sbx_backup_record_free(&rec);
	sbx_backup_record_free(NULL);
	return 0;
}

/* Bad arguments fail locally with EINVAL, before anything is sent. */
static int case_args(void)
{
	struct sbx_client *c = start("args");
	struct sbx_error err;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct mem m = {0};
	CHECK(sbx_backup(c, NULL, "/tmp", NULL, NULL, NULL, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	bo.compression = 7;
	CHECK(sbx_backup(c, NULL, "/tmp", &bo, mem_sink, &m, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	bo.compression = 0;
	bo.struct_size = 0;
	CHECK(sbx_backup(c, NULL, "/tmp", &bo, mem_sink, &m, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	struct sbx_backup_opts bo2 = SBX_BACKUP_OPTS_INIT;
	bo2.to_path = "/tmp/x.tar";
	CHECK(sbx_backup_to_file(c, NULL, "/tmp", &bo2, it_path("x.tar"), &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_backup_to_file(c, NULL, "/tmp", NULL, "", &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_restore(c, NULL, it_path("r"), NULL, NULL, NULL, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	ro.sha256 = "abc";
	struct src s = {0};
	CHECK(sbx_restore(c, NULL, it_path("r"), &ro, src_fn, &s, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_EQ(s.calls, 0);
	ro.sha256 = NULL;
	ro.from_path = "/tmp/x.tar";
	CHECK(sbx_restore_from_file(c, NULL, it_path("r"), &ro, it_path("x.tar"), &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_restore_from_file(c, NULL, it_path("r"), NULL, it_path("missing.tar"), &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ENOENT);
	/* nothing was created */
	CHECK(access(it_path("x.tar"), F_OK) < 0 && access(it_path("r"), F_OK) < 0);
	/* the connection is fine */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	return 0;
}

static mode_t current_umask(void)
{
	mode_t u = umask(022);
	umask(u);
	return u;
}

struct cancel_on_progress {
	struct sbx_cancel *tok;
	unsigned events;
};

static void cancel_progress(void *ud, uint64_t bytes, uint64_t entries)
{
	struct cancel_on_progress *cp = ud;
	(void)entries;
	(void)bytes;
	cp->events++;
	sbx_cancel_fire(cp->tok);
}

/* sbx_backup_to_file: the file appears complete (mode 0666 less the umask) or not at all. */
static int case_to_file(void)
{
	struct sbx_client *c = start("tofile");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 4, 1 * MiB, 50);
	char outdir[1024];
	keep_path(outdir, "out");
	mkdirs(outdir);
	char out[1100];
	snprintf(out, sizeof(out), "%s/a.tar", outdir);
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	if (sbx_backup_to_file(c, &no_timeout, dir, NULL, out, &rec, &err) < 0) {
		if (skip_if_enosys(&err))
			return skip_case();
		it_fail(__FILE__, __LINE__, "backup_to_file: %s", it_errstr(&err));
	}
	CHECKF(strcmp(names_in(outdir), "a.tar") == 0, "out/ holds '%s'", names_in(outdir));
	struct stat st;
	CHECK(stat(out, &st) == 0);
	CHECK_EQ(st.st_size, rec.bytes);
	CHECK_EQ(st.st_mode & 07777, 0666 & ~current_umask());
	char sha[65];
	sha256_of_file(out, sha);
	CHECKF(strcmp(sha, rec.sha256) == 0, "file sha256 %s, record %s", sha, rec.sha256);
	CHECK(sh("tar -tf '%s' | grep -q 'big/f003$'", out) == 0);
	sbx_backup_record_free(&rec);

	/* a backup that fails at once (no such directory) leaves the old file as it was */
	put_str(out, "OLD");
	CHECK(sbx_backup_to_file(c, &no_timeout, it_path("nope"), NULL, out, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(rec.skipped == NULL && rec.bytes == 0);
	CHECK(strcmp(sh_out("cat '%s'", out), "OLD") == 0);
	CHECKF(strcmp(names_in(outdir), "a.tar") == 0, "out/ holds '%s'", names_in(outdir));

	/* one that fails part way (the local file may not grow past 1 MiB: EFBIG) leaves
	 * no file and no temp */
	unlink(out);
	struct rlimit old, rl;
	CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
	rl = old;
	rl.rlim_cur = 1 * MiB;
	signal(SIGXFSZ, SIG_IGN);
	CHECK(setrlimit(RLIMIT_FSIZE, &rl) == 0);
	int r = sbx_backup_to_file(c, &no_timeout, dir, NULL, out, &rec, &err);
	CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
	signal(SIGXFSZ, SIG_DFL);
	CHECK(r < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EFBIG);
	CHECKF(strcmp(names_in(outdir), "") == 0, "out/ holds '%s' after a failed backup", names_in(outdir));

	/* cancelled part way (the token fired by the first progress event; zstd at level 19
	 * on incompressible data makes the backup last long enough for one): the same */
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts co = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	struct cancel_on_progress cp = {.tok = tok};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.progress = cancel_progress;
	bo.progress_ud = &cp;
	bo.compression = SBX_COMPRESS_ZSTD;
	bo.level = 19;
	uint64_t t0 = it_now_ms();
	r = sbx_backup_to_file(c, &co, dir, &bo, out, &rec, &err);
	CHECKF(r < 0, "the backup ended before its first progress event (%u events)", cp.events);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(cp.events == 1);
	fprintf(stderr, "cancelled at the first progress event, after %" PRIu64 " ms\n", it_now_ms() - t0);
	CHECKF(strcmp(names_in(outdir), "") == 0, "out/ holds '%s' after a cancelled backup", names_in(outdir));
	/* a token fired before the call cancels it too, leaving nothing */
	sbx_cancel_fire(tok);
	CHECK(sbx_backup_to_file(c, &co, dir, NULL, out, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECKF(strcmp(names_in(outdir), "") == 0, "out/ holds '%s' after a cancelled backup", names_in(outdir));
	sbx_cancel_free(tok);

	/* the client is still good, and a second backup to the same file works */
	CHECK_SBX(sbx_backup_to_file(c, &no_timeout, dir, NULL, out, &rec, &err), &err);
	CHECK(strcmp(names_in(outdir), "a.tar") == 0);
	sbx_backup_record_free(&rec);
	sbx_client_close(c);
	return 0;
}

/* Back up dir into memory (or skip the case when backups are not there). */
static int backup_mem(struct sbx_client *c, const char *dir, int compression, struct mem *m,
		      struct sbx_backup_record *rec)
{
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_error err;
	bo.compression = compression;
	memset(m, 0, sizeof(*m));
	if (sbx_backup(c, &no_timeout, dir, &bo, mem_sink, m, rec, &err) < 0) {
		if (skip_if_enosys(&err))
			return IT_SKIP;
		it_fail(__FILE__, __LINE__, "backup: %s", it_errstr(&err));
	}
	return 0;
}

/* Restores from a source (odd chunk sizes), replace and merge, with the right sha256 in
 * upper case, and from a local file. */
static int case_restore(void)
{
	struct sbx_client *c = start("restore");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 3, 700 * KiB, 200);
	struct mem m;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	if (backup_mem(c, dir, SBX_COMPRESS_ZSTD, &m, &rec) == IT_SKIP)
		return skip_case();
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_error err;
	struct mem pm = {0};
	ro.progress = mem_progress;
	ro.progress_ud = &pm;

	char work[1024];
	keep_path(work, "work");
	mkdirs(work);
	/* into a directory that does not exist yet */
	char r1[1100];
	snprintf(r1, sizeof(r1), "%s/r1", work);
	struct src s = {.p = m.p, .len = m.len};
	CHECK_SBX(sbx_restore(c, &no_timeout, r1, &ro, src_fn, &s, &res, &err), &err);
	check_same_tree(dir, r1);
	CHECK_EQ(s.off, m.len);
	CHECK_EQ(res.bytes, m.len);
	CHECKF(strcmp(res.sha256, rec.sha256) == 0, "restore sha256 %s, backup %s", res.sha256, rec.sha256);
	CHECKF(res.entries == rec.entries, "restored %" PRIu64 " entries of %" PRIu64, res.entries, rec.entries);
	fprintf(stderr, "restore: %u progress events\n", pm.events);

	/* replace: what was there and is not in the archive goes; the right sha256 (upper case) */
	char r2[1100];
	snprintf(r2, sizeof(r2), "%s/r2", work);
	mkdirs(r2);
	char p[4096];
	snprintf(p, sizeof(p), "%s/extra", r2);
	put_str(p, "extra");
	char upper[65];
	for (int i = 0; i < 65; i++)
		upper[i] = (char)(rec.sha256[i] >= 'a' && rec.sha256[i] <= 'f' ? rec.sha256[i] - 32 : rec.sha256[i]);
	ro.sha256 = upper;
	s = (struct src){.p = m.p, .len = m.len};
	pm = (struct mem){0};
	CHECK_SBX(sbx_restore(c, &no_timeout, r2, &ro, src_fn, &s, &res, &err), &err);
	check_same_tree(dir, r2);
	CHECK(access(p, F_OK) < 0);
	ro.sha256 = NULL;

	/* merge: what was there stays */
	char r3[1100];
	snprintf(r3, sizeof(r3), "%s/r3", work);
	mkdirs(r3);
	snprintf(p, sizeof(p), "%s/extra", r3);
	put_str(p, "extra");
	ro.merge = 1;
	s = (struct src){.p = m.p, .len = m.len};
	pm = (struct mem){0};
	CHECK_SBX(sbx_restore(c, &no_timeout, r3, &ro, src_fn, &s, &res, &err), &err);
	CHECK(strcmp(sh_out("cat '%s'", p), "extra") == 0);
	unlink(p);
	check_same_tree(dir, r3);
	ro.merge = 0;

	/* from a local file written by sbx_backup_to_file (uncompressed this time) */
	char f[1024];
	keep_path(f, "a.tar");
	CHECK_SBX(sbx_backup_to_file(c, &no_timeout, dir, NULL, f, NULL, &err), &err);
	char r4[1100];
	snprintf(r4, sizeof(r4), "%s/r4", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r4, NULL, f, &res, &err), &err);
	check_same_tree(dir, r4);
	struct stat st;
	CHECK(stat(f, &st) == 0);
	CHECK_EQ(res.bytes, st.st_size);

	/* no temporary trees left beside the restored directories */
	wait_names(work, "r1|r2|r3|r4");
	sbx_backup_record_free(&rec);
	mem_free(&m);
	sbx_client_close(c);
	return 0;
}

/* ---- sbx_restore_from_file by splice ---- */

/* This program's splice() stands in for libc's (libsbx's calls come here): it counts the
 * splices into a pipe (from the local file) and into a socket (into the connection), and
 * refuses one kind or the other with EINVAL, as an fd without splice would. */
enum { SPLICE_ALL, SPLICE_NO_FILE, SPLICE_NO_CONN };
static int splice_mode;
static unsigned splices_to_pipe, splices_to_sock, splices_refused;

ssize_t splice(int fd_in, loff_t *off_in, int fd_out, loff_t *off_out, size_t len, unsigned int flags)
{
	struct stat st;
	bool to_pipe = fstat(fd_out, &st) == 0 && S_ISFIFO(st.st_mode);
	bool to_sock = !to_pipe && S_ISSOCK(st.st_mode);
	if ((splice_mode == SPLICE_NO_FILE && to_pipe) || (splice_mode == SPLICE_NO_CONN && to_sock)) {
		__atomic_add_fetch(&splices_refused, 1, __ATOMIC_RELAXED);
		errno = EINVAL;
		return -1;
	}
	__atomic_add_fetch(to_pipe ? &splices_to_pipe : &splices_to_sock, 1, __ATOMIC_RELAXED);
	return syscall(SYS_splice, fd_in, off_in, fd_out, off_out, len, flags);
}

static void splice_reset(int mode)
{
	splice_mode = mode;
	splices_to_pipe = splices_to_sock = splices_refused = 0;
}

struct fifo_writer {
	const char *fifo, *from;
};

static void *fifo_write(void *arg)
{
	struct fifo_writer *w = arg;
	int in = open(w->from, O_RDONLY | O_CLOEXEC), out = open(w->fifo, O_WRONLY | O_CLOEXEC);
	char buf[65536];
	ssize_t n;
	while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0) {
		for (ssize_t off = 0, k; off < n; off += k)
			if ((k = write(out, buf + off, (size_t)(n - off))) <= 0)
				goto done;
	}
done:
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return NULL;
}

/* The archive goes from the file into the connection by splice (no copy through the
 * client); a file or a connection that refuses it gets the same bytes by read and write,
 * and a connection that refused once is not asked again. Every way, the same tree, the
 * whole archive counted, nothing left beside the restored directories; a FIFO as the
 * local file too. */
static int case_restore_splice(void)
{
	struct sbx_client *c = start("restore_splice");
	char dir[1024], f[1024], work[1024], fifo[1024];
	keep_path(dir, "tree");
	make_tree(dir, 3, 700 * KiB, 200);
	keep_path(f, "a.tar");
	struct sbx_error err;
	CHECK_SBX(sbx_backup_to_file(c, &no_timeout, dir, NULL, f, NULL, &err), &err);
	struct stat st;
	CHECK(stat(f, &st) == 0);
	CHECK(st.st_size > 2 * 1024 * 1024);
	keep_path(work, "work");
	mkdirs(work);
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	char r[1100];

	/* spliced both ways */
	splice_reset(SPLICE_ALL);
	snprintf(r, sizeof(r), "%s/r1", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r, NULL, f, &res, &err), &err);
	check_same_tree(dir, r);
	CHECK_EQ(res.bytes, st.st_size);
	/* (the last one into the pipe finds the end of the file) */
	CHECKF(splices_to_pipe > 10 && splices_to_sock + 1 >= splices_to_pipe,
	       "%u splices into the pipe, %u into the connection", splices_to_pipe, splices_to_sock);

	/* the file refuses: read, then written from memory */
	splice_reset(SPLICE_NO_FILE);
	snprintf(r, sizeof(r), "%s/r2", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r, NULL, f, &res, &err), &err);
	check_same_tree(dir, r);
	CHECK_EQ(res.bytes, st.st_size);
	CHECK_EQ(splices_refused, 1);
	CHECK_EQ(splices_to_sock, 0);

	/* the connection refuses: that frame's payload is read back from the pipe and sent,
	 * the rest copied; the next restore on this client does not try again */
	splice_reset(SPLICE_NO_CONN);
	snprintf(r, sizeof(r), "%s/r3", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r, NULL, f, &res, &err), &err);
	check_same_tree(dir, r);
	CHECK_EQ(res.bytes, st.st_size);
	CHECK_EQ(splices_refused, 1);
	CHECK_EQ(splices_to_pipe, 1);
	splice_reset(SPLICE_ALL);
	snprintf(r, sizeof(r), "%s/r4", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r, NULL, f, &res, &err), &err);
	check_same_tree(dir, r);
	CHECK_EQ(splices_to_pipe + splices_to_sock, 0);
	sbx_client_close(c);

	/* a FIFO, on a new client: spliced from the pipe it is */
	c = client_ = it_connect(it_unix_target(it_path("restore_splice.sock")), NULL);
	keep_path(fifo, "fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	struct fifo_writer fw = {fifo, f};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, fifo_write, &fw) == 0);
	splice_reset(SPLICE_ALL);
	snprintf(r, sizeof(r), "%s/r5", work);
	CHECK_SBX(sbx_restore_from_file(c, &no_timeout, r, NULL, fifo, &res, &err), &err);
	pthread_join(t, NULL);
	check_same_tree(dir, r);
	CHECK_EQ(res.bytes, st.st_size);
	CHECK(splices_to_pipe > 0 && splices_to_sock > 0);

	wait_names(work, "r1|r2|r3|r4|r5");
	sbx_client_close(c);
	return 0;
}

/* A snapshot of dir to compare with later: a copy beside it (cp -a). */
static void snapshot(const char *dir, const char *name, char copy[1024])
{
	keep_path(copy, name);
	CHECK(sh("cp -a '%s' '%s'", dir, copy) == 0);
}

static void make_target(const char *r)
{
	char p[4096];
	mkdirs(r);
	snprintf(p, sizeof(p), "%s/keep", r);
	put_str(p, "keep me");
	snprintf(p, sizeof(p), "%s/sub", r);
	mkdirs(p);
	snprintf(p, sizeof(p), "%s/sub/x", r);
	put_str(p, "x");
}

/* A wrong expected sha256 fails the restore, and the directory is exactly as it was. */
static int case_wrong_sha(void)
{
	struct sbx_client *c = start("wrongsha");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 2, 300 * KiB, 40);
	struct mem m;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	if (backup_mem(c, dir, SBX_COMPRESS_NONE, &m, &rec) == IT_SKIP)
		return skip_case();
	char work[1024];
	keep_path(work, "work");
	mkdirs(work);
	char r[1100];
	snprintf(r, sizeof(r), "%s/r", work);
	make_target(r);
	char snap[1024];
	snapshot(r, "snap", snap);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_error err;
	char wrong[65];
	memcpy(wrong, rec.sha256, 65);
	wrong[10] = wrong[10] == '0' ? '1' : '0';
	ro.sha256 = wrong;
	struct src s = {.p = m.p, .len = m.len};
	CHECK(sbx_restore(c, &no_timeout, r, &ro, src_fn, &s, &res, &err) < 0);
	fprintf(stderr, "wrong sha256: %s\n", it_errstr(&err));
	CHECKF(err.kind == SBX_ERR_REMOTE && err.code != 0, "want a remote error, got %s", it_errstr(&err));
	check_same_tree(snap, r);
	wait_names(work, "r");
	/* merge mode checks it too, before extracting anything */
	ro.merge = 1;
	s = (struct src){.p = m.p, .len = m.len};
	CHECK(sbx_restore(c, &no_timeout, r, &ro, src_fn, &s, &res, &err) < 0);
	CHECKF(err.kind == SBX_ERR_REMOTE && err.code != 0, "want a remote error, got %s", it_errstr(&err));
	/* and the right one works */
	ro.merge = 0;
	ro.sha256 = rec.sha256;
	s = (struct src){.p = m.p, .len = m.len};
	CHECK_SBX(sbx_restore(c, &no_timeout, r, &ro, src_fn, &s, &res, &err), &err);
	check_same_tree(dir, r);
	wait_names(work, "r");
	sbx_backup_record_free(&rec);
	mem_free(&m);
	sbx_client_close(c);
	return 0;
}

struct delayed_fire {
	struct sbx_cancel *tok;
	unsigned ms;
};

static void *fire_later(void *arg)
{
	struct delayed_fire *d = arg;
	it_sleep_ms(d->ms);
	sbx_cancel_fire(d->tok);
	return NULL;
}

/* Cancel tokens mid-backup (fired from the sink, and from another thread while the call
 * waits) end the call with ECANCELED; the connection stays usable. */
static int case_cancel_backup(void)
{
	struct sbx_client *c = start("cbackup");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 24, 1 * MiB, 100);
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts co = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;

	struct mem m = {.cancel_after_tok = tok, .cancel_after = 1 * MiB};
	if (sbx_backup(c, &co, dir, NULL, mem_sink, &m, &rec, &err) == 0)
		it_fail(__FILE__, __LINE__, "the backup was not cancelled");
	if (skip_if_enosys(&err)) {
		sbx_cancel_free(tok);
		return skip_case();
	}
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(m.len >= 1 * MiB && m.len < 2 * MiB);
	CHECK(rec.bytes == 0 && rec.skipped == NULL);
	mem_free(&m);

	/* from another thread, while the call waits on a slow sink (20 ms a chunk) */
	sbx_cancel_reset(tok);
	m = (struct mem){.sleep_ms = 20};
	struct delayed_fire d = {tok, 300};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fire_later, &d) == 0);
	uint64_t t0 = it_now_ms();
	CHECK(sbx_backup(c, &co, dir, NULL, mem_sink, &m, &rec, &err) < 0);
	uint64_t took = it_now_ms() - t0;
	pthread_join(th, NULL);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECKF(took < 3000, "the cancel took %" PRIu64 " ms", took);
	CHECK(m.len < 24 * MiB);
	mem_free(&m);

	/* the shim let go of the stream; the client works */
	uint64_t deadline = it_now_ms() + 5000;
	struct sbx_info in = SBX_INFO_INIT;
	for (;;) {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.streams == 1)
			break;
		CHECKF(it_now_ms() < deadline, "the daemon still has %u streams", in.streams);
		it_sleep_ms(10);
	}
	CHECK_SBX(sbx_backup(c, &no_timeout, dir, NULL, mem_sink, &m, &rec, &err), &err);
	CHECK_EQ(rec.bytes, m.len);
	sbx_backup_record_free(&rec);
	mem_free(&m);
	sbx_cancel_free(tok);
	sbx_client_close(c);
	return 0;
}

/* A restore cancelled part way (token fired by the source, or from another thread) or
 * whose source fails leaves the directory as it was and nothing beside it. */
static int case_cancel_restore(void)
{
	struct sbx_client *c = start("crestore");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 8, 1 * MiB, 100);
	struct mem m;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	if (backup_mem(c, dir, SBX_COMPRESS_NONE, &m, &rec) == IT_SKIP)
		return skip_case();
	char work[1024];
	keep_path(work, "work");
	mkdirs(work);
	char r[1100];
	snprintf(r, sizeof(r), "%s/r", work);
	make_target(r);
	char snap[1024];
	snapshot(r, "snap", snap);
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts co = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_error err;

	/* token fired from the source after 3 MiB */
	struct src s = {.p = m.p, .len = m.len, .cancel_tok = tok, .cancel_at = 3 * MiB};
	CHECK(sbx_restore(c, &co, r, NULL, src_fn, &s, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(s.off < m.len);
	check_same_tree(snap, r);
	wait_names(work, "r");

	/* the source fails after 2 MiB */
	s = (struct src){.p = m.p, .len = m.len, .fail_at = 2 * MiB, .fail_errno = EIO};
	CHECK(sbx_restore(c, &no_timeout, r, NULL, src_fn, &s, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EIO);
	check_same_tree(snap, r);
	wait_names(work, "r");

	/* merge mode: a failing source stops it too (what was extracted may stay) */
	s = (struct src){.p = m.p, .len = m.len, .fail_at = 1 * MiB, .fail_errno = EPIPE};
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.merge = 1;
	CHECK(sbx_restore(c, &no_timeout, r, &ro, src_fn, &s, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EPIPE);

	/* from another thread, while a slow source (20 ms a call) feeds the restore */
	(void)sh("rm -rf '%s' && cp -a '%s' '%s'", r, snap, r);
	sbx_cancel_reset(tok);
	struct delayed_fire d = {tok, 300};
	pthread_t th;
	s = (struct src){.p = m.p, .len = m.len, .sleep_ms = 20};
	CHECK(pthread_create(&th, NULL, fire_later, &d) == 0);
	uint64_t t0 = it_now_ms();
	CHECK(sbx_restore(c, &co, r, NULL, src_fn, &s, &res, &err) < 0);
	uint64_t took = it_now_ms() - t0;
	pthread_join(th, NULL);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECKF(took < 3000, "the cancel took %" PRIu64 " ms", took);
	CHECK(s.off > 0 && s.off < m.len);
	check_same_tree(snap, r);
	wait_names(work, "r");

	/* the connection is fine and a full restore works */
	CHECK_SBX(sbx_restore(c, &no_timeout, r, NULL, src_fn, &(struct src){.p = m.p, .len = m.len}, &res, &err),
		  &err);
	check_same_tree(dir, r);
	sbx_cancel_free(tok);
	sbx_backup_record_free(&rec);
	mem_free(&m);
	sbx_client_close(c);
	return 0;
}

/* to_path and from_path: the archive stays inside the sandbox. */
static int case_in_sandbox(void)
{
	struct sbx_client *c = start("insbx");
	char dir[1024];
	keep_path(dir, "tree");
	make_tree(dir, 2, 500 * KiB, 60);
	char arch[1024];
	keep_path(arch, "in-sandbox.tar.zst");
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct mem pm = {0};
	bo.to_path = arch;
	bo.compression = SBX_COMPRESS_ZSTD;
	bo.level = 3;
	bo.progress = mem_progress;
	bo.progress_ud = &pm;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	if (sbx_backup(c, &no_timeout, dir, &bo, NULL, NULL, &rec, &err) < 0) {
		if (skip_if_enosys(&err))
			return skip_case();
		it_fail(__FILE__, __LINE__, "backup to_path: %s", it_errstr(&err));
	}
	CHECKF(strcmp(rec.to_path, arch) == 0, "to_path '%s'", rec.to_path);
	CHECK_EQ(rec.compression, SBX_COMPRESS_ZSTD);
	struct stat st;
	CHECK(stat(arch, &st) == 0);
	CHECK_EQ(st.st_size, rec.bytes);
	char sha[65];
	sha256_of_file(arch, sha);
	CHECKF(strcmp(sha, rec.sha256) == 0, "file sha256 %s, record %s", sha, rec.sha256);
	char *json = sbx_backup_record_json(&rec);
	CHECK(json != NULL);
	CHECK_CONTAINS(json, "\"to_path\":\"");
	CHECK_CONTAINS(json, arch);
	free(json);

	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	ro.from_path = arch;
	ro.sha256 = rec.sha256;
	char r[1024];
	keep_path(r, "r");
	CHECK_SBX(sbx_restore(c, &no_timeout, r, &ro, NULL, NULL, &res, &err), &err);
	check_same_tree(dir, r);
	CHECK_EQ(res.bytes, rec.bytes);
	CHECK(strcmp(res.sha256, rec.sha256) == 0);

	/* from_path with a wrong sha256: r stays as it is */
	char snap[1024];
	snapshot(r, "snap", snap);
	char wrong[65];
	memset(wrong, 'f', 64);
	wrong[64] = '\0';
	ro.sha256 = wrong;
	make_target(it_path("r/sub2"));
	(void)sh("rm -rf '%s' && cp -a '%s' '%s'", snap, r, snap);
	CHECK(sbx_restore(c, &no_timeout, r, &ro, NULL, NULL, &res, &err) < 0);
	CHECK(err.kind == SBX_ERR_REMOTE);
	check_same_tree(snap, r);
	/* a missing from_path is the shim's ENOENT */
	ro.sha256 = NULL;
	ro.from_path = it_path("missing.tar");
	CHECK(sbx_restore(c, &no_timeout, r, &ro, NULL, NULL, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	check_same_tree(snap, r);
	sbx_backup_record_free(&rec);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"stream", case_stream},
		{"record", case_record},
		{"record_json", case_record_json},
		{"args", case_args},
		{"to_file", case_to_file},
		{"restore", case_restore},
		{"wrong_sha", case_wrong_sha},
		{"cancel_backup", case_cancel_backup},
		{"cancel_restore", case_cancel_restore},
		{"in_sandbox", case_in_sandbox},
		{"restore_splice", case_restore_splice},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
