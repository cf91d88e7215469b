/* it_fs_list.c: directory listings and watches through libsbx against the real daemon. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define IT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IT_ASAN 1
#endif
#endif
#ifndef IT_ASAN
#define IT_ASAN 0
#endif

/* ---- helpers ---- */

static struct sbx_client *start(struct it_daemon **dp, const char *root)
{
	const char *sock = it_path("s");
	struct it_daemon *d;
	if (root != NULL)
		d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), "--root",
				    root, NULL);
	else
		d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	if (dp != NULL)
		*dp = d;
	return it_connect(it_unix_target(sock), NULL);
}

static void mkfile(const char *path, const char *content)
{
	it_write_file(path, content);
}

static void mkdir_or_fail(const char *path)
{
	CHECKF(mkdir(path, 0755) == 0, "mkdir %s: %s", path, strerror(errno));
}

static void symlink_or_fail(const char *target, const char *path)
{
	CHECKF(symlink(target, path) == 0, "symlink %s: %s", path, strerror(errno));
}

/* "<dir>/<name>" in a malloc'd buffer. */
static char *pjoin(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	CHECK(p != NULL);
	snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* The daemon has ended every stream but the info call asking. */
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

/* VmRSS / VmHWM of a process, in KiB. */
static long proc_kib(pid_t pid, const char *key)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	CHECKF(f != NULL, "open %s: %s", path, strerror(errno));
	long v = -1;
	size_t kl = strlen(key);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
			v = strtol(line + kl + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	CHECKF(v >= 0, "no %s in %s", key, path);
	return v;
}

/* Reset the peak RSS (VmHWM) of pid to its current RSS. */
static void reset_hwm(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, "5", 1) == 1);
	close(fd);
}

/* A directory for many files. Creating 100,000 files on a busy disk can take
 * minutes; as root the case gets a private mount namespace with a tmpfs there
 * (nothing leaks onto the machine; the daemon, started afterwards, shares it).
 * Call before starting the daemon, while the test has no other thread. */
static char fast_mnt[256];

static const char *fast_dir(const char *name)
{
	const char *p = it_path(name);
	mkdir_or_fail(p);
	if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
	    mount("sbx-it", p, "tmpfs", 0, "mode=0755") == 0)
		snprintf(fast_mnt, sizeof(fast_mnt), "%s", p);
	else
		printf("no private tmpfs (%s): using the disk\n", strerror(errno));
	return p;
}

static void fast_done(void)
{
	if (fast_mnt[0] != '\0')
		umount2(fast_mnt, MNT_DETACH);
	fast_mnt[0] = '\0';
}

/* ---- listings collected ---- */

struct ent {
	char *name;
	size_t name_len;
	int type;
	uint64_t size;
	char *target;
};

struct listing {
	struct ent *e;
	size_t n, cap;
};

static int collect_cb(void *ud, const struct sbx_dirent *de)
{
	struct listing *l = ud;
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 64;
		l->e = realloc(l->e, l->cap * sizeof(*l->e));
		CHECK(l->e != NULL);
	}
	struct ent *e = &l->e[l->n++];
	CHECK(strlen(de->name) == de->name_len); /* NUL-terminated, no NUL inside */
	e->name = malloc(de->name_len + 1);
	CHECK(e->name != NULL);
	memcpy(e->name, de->name, de->name_len + 1);
	e->name_len = de->name_len;
	e->type = de->stat->type;
	e->size = de->stat->size;
	e->target = strdup(de->stat->link_target);
	CHECK(e->target != NULL);
	return 0;
}

static void listing_free(struct listing *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->e[i].name);
		free(l->e[i].target);
	}
	free(l->e);
	memset(l, 0, sizeof(*l));
}

static int ent_cmp(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	return strcmp(x->name, y->name);
}

static const struct ent *find(const struct listing *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->e[i].name, name) == 0)
			return &l->e[i];
	return NULL;
}

static size_t index_of(const struct listing *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->e[i].name, name) == 0)
			return i;
	it_fail(__FILE__, __LINE__, "'%s' not listed", name);
}

/* List dir and compare the names, as a set, with want (NULL-terminated). Keeps
 * the listing in *out (in the order received) when out is not NULL. */
static void expect_list(struct sbx_client *c, const char *dir, unsigned depth, int flags, const char *const *want,
			struct listing *out)
{
	struct listing l = {0};
	struct sbx_error err;
	uint64_t count = 0;
	CHECK_SBX(sbx_list(c, NULL, dir, depth, flags, collect_cb, &l, &count, &err), &err);
	CHECK_EQ(count, l.n);
	struct listing sorted = l;
	sorted.e = malloc((l.n ? l.n : 1) * sizeof(*l.e));
	CHECK(sorted.e != NULL);
	if (l.n > 0)
		memcpy(sorted.e, l.e, l.n * sizeof(*l.e));
	qsort(sorted.e, sorted.n, sizeof(*sorted.e), ent_cmp);
	size_t nw = 0;
	while (want[nw] != NULL)
		nw++;
	const char **w = malloc((nw ? nw : 1) * sizeof(*w));
	CHECK(w != NULL);
	if (nw > 0)
		memcpy(w, want, nw * sizeof(*w));
	for (size_t i = 1; i < nw; i++)
		for (size_t j = i; j > 0 && strcmp(w[j - 1], w[j]) > 0; j--) {
			const char *t = w[j];
			w[j] = w[j - 1];
			w[j - 1] = t;
		}
	bool same = sorted.n == nw;
	for (size_t i = 0; same && i < nw; i++)
		same = strcmp(sorted.e[i].name, w[i]) == 0;
	if (!same) {
		fprintf(stderr, "listing %s depth %u flags %d:\n  got:", dir, depth, flags);
		for (size_t i = 0; i < sorted.n; i++)
			fprintf(stderr, " '%s'", sorted.e[i].name);
		fprintf(stderr, "\n  want:");
		for (size_t i = 0; i < nw; i++)
			fprintf(stderr, " '%s'", w[i]);
		fputc('\n', stderr);
		it_fail(__FILE__, __LINE__, "listing of %s differs", dir);
	}
	free(w);
	free(sorted.e);
	if (out != NULL)
		*out = l;
	else
		listing_free(&l);
}

/* ---- list cases ---- */

static int case_names(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *dir = it_path("t");
	mkdir_or_fail(dir);
	/* names with a space, a newline, a tab, invalid UTF-8, a backslash, UTF-8 */
	static const char *const names[] = {"with space",  "new\nline",         "tab\there", "bad\xff\xfeutf8", "\xff",
					    "back\\slash", "\xc3\xbcn\xc3\xaf", "-dash",     "plain",           NULL};
	for (size_t i = 0; names[i] != NULL; i++) {
		char *p = pjoin(dir, names[i]);
		mkfile(p, names[i]); /* content: the name, so sizes differ */
		free(p);
	}
	char *p = pjoin(dir, ".hidden");
	mkfile(p, "h");
	free(p);
	p = pjoin(dir, ".hdir");
	mkdir_or_fail(p);
	free(p);
	p = pjoin(dir, "sub dir\n");
	mkdir_or_fail(p);
	free(p);
	p = pjoin(dir, "ln\xff");
	symlink_or_fail("target\nwith\xffodd bytes", p);
	free(p);

	static const char *const want[] = {"with space",        "new\nline", "tab\there",
					   "bad\xff\xfeutf8",   "\xff",      "back\\slash",
					   "\xc3\xbcn\xc3\xaf", "-dash",     "plain",
					   "sub dir\n",         "ln\xff",    NULL};
	struct listing l;
	expect_list(c, dir, 1, 0, want, &l);
	for (size_t i = 0; names[i] != NULL; i++) {
		const struct ent *e = find(&l, names[i]);
		CHECK_EQ(e->type, SBX_FT_FILE);
		CHECK_EQ(e->size, strlen(names[i]));
	}
	CHECK_EQ(find(&l, "sub dir\n")->type, SBX_FT_DIRECTORY);
	const struct ent *ln = find(&l, "ln\xff");
	CHECK_EQ(ln->type, SBX_FT_SYMLINK);
	CHECK(strcmp(ln->target, "target\nwith\xffodd bytes") == 0);
	listing_free(&l);

	/* hidden names only when asked; a trailing slash changes nothing */
	static const char *const want_h[] = {"with space",
					     "new\nline",
					     "tab\there",
					     "bad\xff\xfeutf8",
					     "\xff",
					     "back\\slash",
					     "\xc3\xbcn\xc3\xaf",
					     "-dash",
					     "plain",
					     "sub dir\n",
					     "ln\xff",
					     ".hidden",
					     ".hdir",
					     NULL};
	char slash[300];
	snprintf(slash, sizeof(slash), "%s//", dir);
	expect_list(c, slash, 1, SBX_LIST_HIDDEN, want_h, NULL);

	/* an empty directory */
	p = pjoin(dir, ".hdir");
	static const char *const none[] = {NULL};
	expect_list(c, p, 1, SBX_LIST_HIDDEN, none, NULL);
	free(p);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* t/a, t/d1/b, t/d1/d2/c, t/d1/d2/d3/e, t/d1/d2/d3/d4/, t/.h/x, t/d1/.g */
static void make_tree(const char *t)
{
	mkdir_or_fail(t);
	static const char *const dirs[] = {"d1", "d1/d2", "d1/d2/d3", "d1/d2/d3/d4", ".h", NULL};
	static const char *const files[] = {"a", "d1/b", "d1/d2/c", "d1/d2/d3/e", ".h/x", "d1/.g", NULL};
	for (size_t i = 0; dirs[i] != NULL; i++) {
		char *p = pjoin(t, dirs[i]);
		mkdir_or_fail(p);
		free(p);
	}
	for (size_t i = 0; files[i] != NULL; i++) {
		char *p = pjoin(t, files[i]);
		mkfile(p, files[i]);
		free(p);
	}
}

static int case_depth(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *t = it_path("t");
	make_tree(t);
	static const char *const d1[] = {"a", "d1", NULL};
	static const char *const d2[] = {"a", "d1", "d1/b", "d1/d2", NULL};
	static const char *const d3[] = {"a", "d1", "d1/b", "d1/d2", "d1/d2/c", "d1/d2/d3", NULL};
	static const char *const all[] = {"a",        "d1",         "d1/b",        "d1/d2", "d1/d2/c",
					  "d1/d2/d3", "d1/d2/d3/e", "d1/d2/d3/d4", NULL};
	static const char *const all_h[] = {"a",          "d1",          "d1/b", "d1/d2", "d1/d2/c", "d1/d2/d3",
					    "d1/d2/d3/e", "d1/d2/d3/d4", ".h",   ".h/x",  "d1/.g",   NULL};
	expect_list(c, t, 1, 0, d1, NULL);
	expect_list(c, t, 2, 0, d2, NULL);
	expect_list(c, t, 3, 0, d3, NULL);
	expect_list(c, t, 4, 0, all, NULL);
	expect_list(c, t, 100, 0, all, NULL);
	struct listing l;
	expect_list(c, t, 0, 0, all, &l);
	/* depth first: every directory right before what is below it, and its
	 * contents before its next sibling */
	CHECK(index_of(&l, "d1") < index_of(&l, "d1/b"));
	CHECK(index_of(&l, "d1/d2") < index_of(&l, "d1/d2/c"));
	CHECK(index_of(&l, "d1/d2/d3") < index_of(&l, "d1/d2/d3/e"));
	size_t a = index_of(&l, "a"), d = index_of(&l, "d1");
	if (a > d)
		CHECK(a > index_of(&l, "d1/d2/d3/e"));
	CHECK_EQ(find(&l, "d1/d2/d3/d4")->type, SBX_FT_DIRECTORY);
	CHECK_EQ(find(&l, "d1/d2/c")->size, strlen("d1/d2/c"));
	listing_free(&l);
	expect_list(c, t, 0, SBX_LIST_HIDDEN, all_h, NULL);

	/* a subdirectory listed by itself: names relative to it */
	char *sub = pjoin(t, "d1/d2");
	static const char *const sub_all[] = {"c", "d3", "d3/e", "d3/d4", NULL};
	expect_list(c, sub, 0, 0, sub_all, NULL);
	free(sub);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

static int case_symlinks(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *t = it_path("t");
	mkdir_or_fail(t);
	char *p;
	p = pjoin(t, "real");
	mkdir_or_fail(p);
	free(p);
	p = pjoin(t, "real/f1");
	mkfile(p, "1");
	free(p);
	p = pjoin(t, "real/f2");
	mkfile(p, "22");
	free(p);
	p = pjoin(t, "real/up");
	symlink_or_fail("..", p); /* a loop: real/up/real/up/... */
	free(p);
	p = pjoin(t, "link");
	symlink_or_fail("real", p);
	free(p);
	p = pjoin(t, "dangling");
	symlink_or_fail("nowhere", p);
	free(p);
	p = pjoin(t, "flink");
	symlink_or_fail("real/f1", p);
	free(p);
	p = pjoin(t, "self");
	symlink_or_fail("self", p); /* ELOOP when followed */
	free(p);

	/* not followed: symlinks are entries, with their targets */
	static const char *const nofollow[] = {"real",     "real/f1", "real/f2", "real/up", "link",
					       "dangling", "flink",   "self",    NULL};
	struct listing l;
	expect_list(c, t, 0, 0, nofollow, &l);
	CHECK_EQ(find(&l, "link")->type, SBX_FT_SYMLINK);
	CHECK(strcmp(find(&l, "link")->target, "real") == 0);
	CHECK(strcmp(find(&l, "real/up")->target, "..") == 0);
	CHECK(strcmp(find(&l, "dangling")->target, "nowhere") == 0);
	CHECK_EQ(find(&l, "real")->type, SBX_FT_DIRECTORY);
	listing_free(&l);

	/* followed: link's contents too (as link/...), but no way around the loop:
	 * real/up and link/up lead to t, which is on the path */
	static const char *const follow[] = {"real",    "real/f1", "real/f2",  "real/up", "link", "link/f1",
					     "link/f2", "link/up", "dangling", "flink",   "self", NULL};
	expect_list(c, t, 0, SBX_LIST_FOLLOW, follow, &l);
	/* entries keep their lstat: a symlink followed is still reported as one */
	CHECK_EQ(find(&l, "link")->type, SBX_FT_SYMLINK);
	CHECK_EQ(find(&l, "link/f2")->type, SBX_FT_FILE);
	CHECK_EQ(find(&l, "link/f2")->size, 2);
	listing_free(&l);

	/* with a depth limit the loop is not an issue either */
	static const char *const follow2[] = {"real",    "real/f1", "real/f2",  "real/up", "link", "link/f1",
					      "link/f2", "link/up", "dangling", "flink",   "self", NULL};
	expect_list(c, t, 2, SBX_LIST_FOLLOW, follow2, NULL);

	/* the listed path itself may be a symlink to a directory */
	p = pjoin(t, "link");
	static const char *const via_link[] = {"f1", "f2", "up", NULL};
	expect_list(c, p, 1, 0, via_link, NULL);
	free(p);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

static int case_errors(void)
{
	struct sbx_client *c = start(NULL, NULL);
	struct sbx_error err;
	const char *t = it_path("t");
	make_tree(t);
	struct listing l = {0};

	char *file = pjoin(t, "a");
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, file, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	CHECK(strcmp(err.path, file) == 0);
	free(file);

	char *missing = pjoin(t, "missing");
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, missing, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, missing) == 0);
	free(missing);

	char *below_file = pjoin(t, "a/x");
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, below_file, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	free(below_file);

	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, "relative/path", 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK(strcmp(err.path, "relative/path") == 0);

	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, "", 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);

	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, t, 1, 0, NULL, NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);

	/* a FIFO: ENOTDIR at once, never an open that waits for a writer */
	char *fifo = pjoin(t, "fifo");
	CHECK(mkfifo(fifo, 0600) == 0);
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, fifo, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	free(fifo);
	CHECK_EQ(l.n, 0);

	/* a name of 255 bytes at depth 3 and a path near PATH_MAX */
	char name[256];
	memset(name, 'n', 255);
	name[255] = '\0';
	char *deep = pjoin(t, "d1/d2");
	char *longf = pjoin(deep, name);
	mkfile(longf, "x");
	struct listing ll = {0};
	CHECK_SBX(sbx_list(c, NULL, t, 0, 0, collect_cb, &ll, NULL, &err), &err);
	char want[300];
	snprintf(want, sizeof(want), "d1/d2/%s", name);
	CHECK(find(&ll, want) != NULL);
	listing_free(&ll);
	free(longf);
	free(deep);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* An unreadable subdirectory: listed at depth 1, fails a recursive listing with
 * EACCES naming it. Needs a daemon that permission checks apply to. */
static int case_eacces(void)
{
	if (geteuid() == 0) {
		/* root: take the DAC override capabilities out of what the daemon we
		 * spawn can have (the bounding set survives execve; we keep ours) */
		if (prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) < 0 ||
		    prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) < 0) {
			printf("cannot drop CAP_DAC_OVERRIDE from the bounding set (%s): skipped\n", strerror(errno));
			return IT_SKIP;
		}
	}
	struct sbx_client *c = start(NULL, NULL);
	struct sbx_error err;
	const char *t = it_path("t");
	make_tree(t);
	char *locked = pjoin(t, "d1/locked");
	mkdir_or_fail(locked);
	char *inside = pjoin(locked, "secret");
	mkfile(inside, "s");
	CHECK(chmod(locked, 0) == 0);

	static const char *const d2[] = {"a", "d1", "d1/b", "d1/d2", "d1/locked", NULL};
	expect_list(c, t, 2, 0, d2, NULL);

	struct listing l = {0};
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, t, 0, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECKF(strcmp(err.path, locked) == 0, "error path '%s', want '%s'", err.path, locked);
	listing_free(&l);

	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, locked, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECK(strcmp(err.path, locked) == 0);

	/* readable but not searchable: names come, lstat fails */
	CHECK(chmod(locked, 0444) == 0);
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, NULL, locked, 1, 0, collect_cb, &l, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECK(strcmp(err.path, inside) == 0);
	listing_free(&l);
	CHECK(chmod(locked, 0755) == 0);
	free(inside);
	free(locked);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

#define BIG_N 100000
#define BIG_PAD 110

struct big_ctx {
	uint8_t *seen;
	uint64_t n;
	uint64_t bytes;
	size_t prefix_len;
};

static int big_cb(void *ud, const struct sbx_dirent *de)
{
	struct big_ctx *x = ud;
	/* "f-<6 digits>-xxxx..." */
	CHECKF(de->name_len == 2 + 6 + 1 + BIG_PAD && de->name[0] == 'f', "bad name '%s'", de->name);
	unsigned i = (unsigned)strtoul(de->name + 2, NULL, 10);
	CHECKF(i < BIG_N && !x->seen[i], "entry %u twice or out of range", i);
	x->seen[i] = 1;
	CHECK_EQ(de->stat->type, SBX_FT_FILE);
	x->n++;
	x->bytes += de->name_len;
	return 0;
}

static void make_big(const char *dir)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);
	char name[256], pad[BIG_PAD + 1];
	memset(pad, 'x', BIG_PAD);
	pad[BIG_PAD] = '\0';
	for (unsigned i = 0; i < BIG_N; i++) {
		snprintf(name, sizeof(name), "f-%06u-%s", i, pad);
		int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		CHECKF(fd >= 0, "create %s: %s", name, strerror(errno));
		close(fd);
	}
	close(dfd);
}

static int case_big(void)
{
	const char *dir = fast_dir("big");
	struct it_daemon *d;
	struct sbx_client *c = start(&d, NULL);
	uint64_t t0 = it_now_ms();
	make_big(dir);
	printf("created %u files in %llu ms\n", BIG_N, (unsigned long long)(it_now_ms() - t0));

	struct big_ctx x = {.seen = calloc(BIG_N, 1)};
	CHECK(x.seen != NULL);
	struct sbx_error err;
	/* warm up both sides (allocator pools, the daemon's workers) with a small listing */
	struct listing warm = {0};
	CHECK_SBX(sbx_list(c, NULL, it_dir(), 1, 0, collect_cb, &warm, NULL, &err), &err);
	listing_free(&warm);

	long my_rss0 = proc_kib(getpid(), "VmRSS");
	long d_rss0 = proc_kib(d->pid, "VmRSS");
	reset_hwm(getpid());
	reset_hwm(d->pid);
	uint64_t count = 0;
	t0 = it_now_ms();
	CHECK_SBX(sbx_list(c, NULL, dir, 1, 0, big_cb, &x, &count, &err), &err);
	uint64_t ms = it_now_ms() - t0;
	long my_peak = proc_kib(getpid(), "VmHWM") - my_rss0;
	long d_peak = proc_kib(d->pid, "VmHWM") - d_rss0;
	CHECK_EQ(count, BIG_N);
	CHECK_EQ(x.n, BIG_N);
	for (unsigned i = 0; i < BIG_N; i++)
		CHECKF(x.seen[i], "entry %u missing", i);
	printf("listed %u entries (%llu bytes of names) in %llu ms; RSS growth: client %ld KiB, daemon %ld KiB%s\n",
	       BIG_N, (unsigned long long)x.bytes, (unsigned long long)ms, my_peak, d_peak,
	       IT_ASAN ? " (ASan build: not checked)" : "");
	/* the names alone are 12 MB and the encoded listing ~20 MB: neither side may
	 * hold it */
	CHECK(x.bytes > 11000000);
	if (!IT_ASAN) {
		CHECKF(my_peak < 16 * 1024, "client RSS grew by %ld KiB", my_peak);
		CHECKF(d_peak < 16 * 1024, "daemon RSS grew by %ld KiB", d_peak);
	}

	/* the same listing again: a leak per entry would show now */
	memset(x.seen, 0, BIG_N);
	x.n = 0;
	CHECK_SBX(sbx_list(c, NULL, dir, 1, 0, big_cb, &x, &count, &err), &err);
	CHECK_EQ(count, BIG_N);
	long d_rss1 = proc_kib(d->pid, "VmRSS");
	printf("daemon RSS after two listings: %ld KiB (before: %ld KiB)\n", d_rss1, d_rss0);
	if (!IT_ASAN)
		CHECKF(d_rss1 - d_rss0 < 16 * 1024, "daemon RSS grew by %ld KiB", d_rss1 - d_rss0);
	free(x.seen);
	wait_streams_idle(c);
	sbx_client_close(c);
	fast_done();
	return 0;
}

/* A tree over many batches: descending and climbing back across batch boundaries
 * loses and repeats nothing. */
static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int case_big_tree(void)
{
	const char *t = fast_dir("tree");
	struct sbx_client *c = start(NULL, NULL);
	char p[512];
	unsigned want_all = 0, want_d2 = 0;
	for (unsigned d = 0; d < 30; d++) {
		snprintf(p, sizeof(p), "%s/dir-%02u", t, d);
		mkdir_or_fail(p);
		snprintf(p, sizeof(p), "%s/dir-%02u/sub", t, d);
		mkdir_or_fail(p);
		want_all += 2, want_d2 += 2;
		for (unsigned f = 0; f < 500; f++) {
			snprintf(p, sizeof(p), "%s/dir-%02u/file-%04u-with-a-longer-name-for-bigger-batches", t, d, f);
			int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
			CHECK(fd >= 0);
			close(fd);
			want_all++, want_d2++;
		}
		for (unsigned g = 0; g < 10; g++) {
			snprintf(p, sizeof(p), "%s/dir-%02u/sub/g%u", t, d, g);
			mkfile(p, "g");
			want_all++;
		}
	}
	struct listing l = {0};
	struct sbx_error err;
	uint64_t count;
	CHECK_SBX(sbx_list(c, NULL, t, 0, 0, collect_cb, &l, &count, &err), &err);
	CHECK_EQ(count, want_all);
	CHECK_EQ(l.n, want_all);
	char **names = malloc(l.n * sizeof(*names));
	CHECK(names != NULL);
	for (size_t i = 0; i < l.n; i++)
		names[i] = l.e[i].name;
	qsort(names, l.n, sizeof(*names), cmp_str);
	for (size_t i = 1; i < l.n; i++)
		CHECKF(strcmp(names[i - 1], names[i]) != 0, "'%s' listed twice", names[i]);
	/* and each under its own directory: dir-NN/sub/gK right after dir-NN/sub's
	 * other entries, never under another directory */
	for (size_t i = 0; i < l.n; i++) {
		const char *n = l.e[i].name;
		if (strncmp(n, "dir-", 4) == 0 && strstr(n, "/sub/g") != NULL) {
			char parent[64];
			snprintf(parent, sizeof(parent), "%.*s", (int)(strstr(n, "/g") - n), n);
			CHECK(index_of(&l, parent) < i);
		}
	}
	free(names);
	listing_free(&l);
	CHECK_SBX(sbx_list(c, NULL, t, 2, 0, collect_cb, &l, &count, &err), &err);
	CHECK_EQ(count, want_d2);
	listing_free(&l);
	wait_streams_idle(c);
	sbx_client_close(c);
	fast_done();
	return 0;
}

struct stop_ctx {
	unsigned n, stop_after;
	int code;
	struct sbx_cancel *tok;
};

static int stop_cb(void *ud, const struct sbx_dirent *de)
{
	(void)de;
	struct stop_ctx *x = ud;
	if (++x->n == x->stop_after) {
		if (x->tok != NULL) {
			sbx_cancel_fire(x->tok);
			return 0;
		}
		return x->code;
	}
	return 0;
}

/* A callback that stops, a cancel token, a timeout, a client that vanishes: the
 * daemon stops walking and frees the stream; the client stays usable. */
static int case_list_stop(void)
{
	const char *dir = fast_dir("many");
	struct it_daemon *d;
	struct sbx_client *c = start(&d, NULL);
	char name[64];
	for (unsigned i = 0; i < 20000; i++) {
		snprintf(name, sizeof(name), "%s/file-%05u-padding-padding-padding", dir, i);
		int fd = open(name, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		CHECK(fd >= 0);
		close(fd);
	}
	struct sbx_error err;
	struct stop_ctx x = {.stop_after = 100, .code = EINTR};
	memset(&err, 0, sizeof(err));
	uint64_t count = 0;
	CHECK(sbx_list(c, NULL, dir, 1, 0, stop_cb, &x, &count, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINTR);
	CHECK_EQ(x.n, 100);
	CHECK_EQ(count, 100);
	wait_streams_idle(c);

	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	x = (struct stop_ctx){.stop_after = 50, .tok = tok};
	memset(&err, 0, sizeof(err));
	CHECK(sbx_list(c, &opts, dir, 1, 0, stop_cb, &x, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(x.n < 20000);
	sbx_cancel_free(tok);
	wait_streams_idle(c);

	/* a client that disconnects in the middle of a listing */
	for (int i = 0; i < 3; i++) {
		struct sbx_client *c2 = it_connect(it_unix_target(it_path("s")), NULL);
		x = (struct stop_ctx){.stop_after = 10, .code = 0};
		struct sbx_call_opts o2 = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 1 + i * 5};
		memset(&err, 0, sizeof(err));
		int rc = sbx_list(c2, &o2, dir, 0, 0, stop_cb, &x, NULL, &err);
		CHECK(rc < 0);
		CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
		sbx_client_close(c2);
	}
	wait_streams_idle(c);
	struct stop_ctx all = {.stop_after = 0};
	CHECK_SBX(sbx_list(c, NULL, dir, 1, 0, stop_cb, &all, &count, &err), &err);
	CHECK_EQ(count, 20000);
	sbx_client_close(c);
	fast_done();
	return 0;
}

/* --root: following a symlink to "/" stays beneath the root. */
static int case_confined(void)
{
	const char *root = it_path("root");
	mkdir_or_fail(root);
	char *d = pjoin(root, "d");
	mkdir_or_fail(d);
	char *marker = pjoin(root, "marker");
	mkfile(marker, "m");
	char *esc = pjoin(root, "d/esc");
	symlink_or_fail("/", esc);
	char *up = pjoin(root, "d/up");
	symlink_or_fail("../../../../../../..", up);
	struct sbx_client *c = start(NULL, root);
	/* "/" is the root: esc and up lead there; d is on the path, not entered again */
	static const char *const want[] = {"esc", "esc/d", "esc/marker", "up", "up/d", "up/marker", NULL};
	struct listing l;
	expect_list(c, "/d", 0, SBX_LIST_FOLLOW, want, &l);
	CHECK_EQ(find(&l, "esc/marker")->size, 1);
	listing_free(&l);
	static const char *const top[] = {"d", "marker", NULL};
	expect_list(c, "/", 1, 0, top, NULL);
	expect_list(c, "/d/esc", 1, 0, top, NULL);
	free(d);
	free(marker);
	free(esc);
	free(up);
	sbx_client_close(c);
	return 0;
}

/* ---- watch ---- */

struct wev {
	int type;
	char *path;
	int is_dir;
	uint32_t cookie;
};

struct watch {
	struct sbx_client *c;
	char path[512];
	int flags;
	struct sbx_call_opts opts;
	pthread_t th;
	pthread_mutex_t mu;
	struct wev *ev;
	size_t n, cap;
	char stop_path[512]; /* the callback returns 1 on an event for this path */
	volatile int stall;  /* the callback waits while set */
	volatile int stalled;
	int rc;
	struct sbx_error err;
	volatile int finished;
};

static int watch_cb(void *ud, const struct sbx_watch_event *e)
{
	struct watch *w = ud;
	if (e->path != NULL)
		CHECK(strlen(e->path) == e->path_len);
	else
		CHECK_EQ(e->type, SBX_WATCH_OVERFLOW);
	pthread_mutex_lock(&w->mu);
	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 256;
		w->ev = realloc(w->ev, w->cap * sizeof(*w->ev));
		CHECK(w->ev != NULL);
	}
	struct wev *v = &w->ev[w->n++];
	v->type = e->type;
	v->path = e->path ? strdup(e->path) : NULL;
	v->is_dir = e->is_dir;
	v->cookie = e->cookie;
	bool stop = e->path != NULL && w->stop_path[0] != '\0' && strcmp(e->path, w->stop_path) == 0;
	pthread_mutex_unlock(&w->mu);
	while (w->stall) {
		w->stalled = 1;
		it_sleep_ms(5);
	}
	return stop ? 1 : 0;
}

static void *watch_thread(void *arg)
{
	struct watch *w = arg;
	w->rc = sbx_watch(w->c, &w->opts, w->path, w->flags, watch_cb, w, &w->err);
	w->finished = 1;
	return NULL;
}

static void watch_clear(struct watch *w)
{
	pthread_mutex_lock(&w->mu);
	for (size_t i = 0; i < w->n; i++)
		free(w->ev[i].path);
	w->n = 0;
	pthread_mutex_unlock(&w->mu);
}

/* Index of the first event at or after from for path with this type (-1: any), or -1. */
static long watch_find(struct watch *w, size_t from, int type, const char *path)
{
	long r = -1;
	pthread_mutex_lock(&w->mu);
	for (size_t i = from; i < w->n; i++) {
		if ((type < 0 || w->ev[i].type == type) && w->ev[i].path != NULL && strcmp(w->ev[i].path, path) == 0) {
			r = (long)i;
			break;
		}
	}
	pthread_mutex_unlock(&w->mu);
	return r;
}

static void watch_wait_for(struct watch *w, int type, const char *path)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (watch_find(w, 0, type, path) < 0) {
		CHECKF(!w->finished, "the watch ended (%s) before %s %s", it_errstr(&w->err), sbx_watch_type_name(type),
		       path);
		CHECKF(it_now_ms() < deadline, "no %s event for %s", sbx_watch_type_name(type), path);
		it_sleep_ms(5);
	}
}

/* Start watching path in a thread; return once events flow. The probe: a file
 * created and removed in probe_dir (its events name it as client_dir/...), or with
 * probe_dir NULL a chmod of path itself. The probe's events are cleared. */
static void watch_begin(struct watch *w, struct sbx_client *c, const struct sbx_call_opts *opts, const char *path,
			int flags)
{
	memset(w, 0, sizeof(*w));
	w->c = c;
	snprintf(w->path, sizeof(w->path), "%s", path);
	w->flags = flags;
	w->opts.struct_size = sizeof(w->opts);
	if (opts != NULL)
		w->opts = *opts;
	if (w->opts.timeout_ms == 0)
		w->opts.timeout_ms = -1;
	pthread_mutex_init(&w->mu, NULL);
	CHECK(pthread_create(&w->th, NULL, watch_thread, w) == 0);
}

/* false if the watch ended (failed) instead */
static bool watch_probe(struct watch *w, const char *probe_dir, const char *client_dir)
{
	char probe[600], seen[600];
	uint64_t deadline = it_now_ms() + 10000;
	for (unsigned i = 0;; i++) {
		int type;
		if (probe_dir != NULL) {
			snprintf(probe, sizeof(probe), "%s/.probe-%u", probe_dir, i);
			snprintf(seen, sizeof(seen), "%s/.probe-%u", client_dir ? client_dir : probe_dir, i);
			mkfile(probe, "");
			CHECK(unlink(probe) == 0);
			type = SBX_WATCH_DELETE;
		} else {
			CHECK(chmod(w->path, (i & 1) ? 0644 : 0600) == 0);
			snprintf(seen, sizeof(seen), "%s", w->path);
			type = SBX_WATCH_ATTRIB;
		}
		uint64_t until = it_now_ms() + 50;
		while (it_now_ms() < until && watch_find(w, 0, type, seen) < 0 && !w->finished)
			it_sleep_ms(2);
		if (watch_find(w, 0, type, seen) >= 0)
			break;
		if (w->finished)
			return false;
		CHECKF(it_now_ms() < deadline, "the watch of %s never reported anything", w->path);
	}
	watch_clear(w);
	return true;
}

static void watch_start(struct watch *w, struct sbx_client *c, const char *path, int flags, const char *probe_dir,
			const char *client_dir)
{
	watch_begin(w, c, NULL, path, flags);
	CHECKF(watch_probe(w, probe_dir, client_dir), "the watch of %s ended at once: %s", path, it_errstr(&w->err));
}

static void watch_set_stop(struct watch *w, const char *path)
{
	pthread_mutex_lock(&w->mu);
	snprintf(w->stop_path, sizeof(w->stop_path), "%s", path);
	pthread_mutex_unlock(&w->mu);
}

static void watch_join(struct watch *w)
{
	CHECK(pthread_join(w->th, NULL) == 0);
}

static void watch_free(struct watch *w)
{
	watch_clear(w);
	free(w->ev);
	pthread_mutex_destroy(&w->mu);
}

/* Join (within 10 s) and check how it ended. */
static void watch_end(struct watch *w, int rc, int kind, int code)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (!w->finished) {
		CHECKF(it_now_ms() < deadline, "the watch of %s did not end", w->path);
		it_sleep_ms(2);
	}
	watch_join(w);
	if (rc == 0)
		CHECKF(w->rc == 0, "the watch of %s failed: %s", w->path, it_errstr(&w->err));
	else
		CHECK_EQ(w->rc, -1);
	if (kind != SBX_ERR_NONE)
		CHECK_ERR(&w->err, kind, code);
}

/* The events so far as lines "type path [dir]" (paths relative to base when under
 * it), compared with want. */
static void watch_expect(struct watch *w, const char *base, const char *const *want)
{
	pthread_mutex_lock(&w->mu);
	size_t nw = 0;
	while (want[nw] != NULL)
		nw++;
	bool same = w->n == nw;
	char line[600];
	size_t bl = strlen(base);
	for (size_t i = 0; same && i < nw; i++) {
		const struct wev *e = &w->ev[i];
		const char *rel = e->path && strncmp(e->path, base, bl) == 0 ? e->path + bl : e->path;
		snprintf(line, sizeof(line), "%s %s%s", sbx_watch_type_name(e->type), rel ? rel : "-",
			 e->is_dir ? " dir" : "");
		same = strcmp(line, want[i]) == 0;
	}
	if (!same) {
		fprintf(stderr, "events under %s:\n", base);
		for (size_t i = 0; i < w->n; i++) {
			const struct wev *e = &w->ev[i];
			fprintf(stderr, "  got  %s %s%s cookie %u\n", sbx_watch_type_name(e->type),
				e->path ? e->path : "-", e->is_dir ? " dir" : "", e->cookie);
		}
		for (size_t i = 0; i < nw; i++)
			fprintf(stderr, "  want %s\n", want[i]);
	}
	pthread_mutex_unlock(&w->mu);
	CHECKF(same, "unexpected events");
}

static int case_watch_events(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *dir = it_path("w");
	mkdir_or_fail(dir);
	struct watch w;
	watch_start(&w, c, dir, 0, dir, NULL);

	char *f = pjoin(dir, "f"), *g = pjoin(dir, "g"), *sub = pjoin(dir, "sub"), *inner = pjoin(dir, "sub/x");
	char *odd = pjoin(dir, "odd \n\xff");
	char *end = pjoin(dir, "end");
	int fd = open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	CHECK(write(fd, "abc", 3) == 3);
	close(fd);
	CHECK(chmod(f, 0600) == 0);
	CHECK(rename(f, g) == 0);
	CHECK(unlink(g) == 0);
	mkdir_or_fail(sub);
	mkfile(inner, "not reported: the watch is not recursive");
	CHECK(unlink(inner) == 0);
	CHECK(rmdir(sub) == 0);
	mkfile(odd, "");
	CHECK(unlink(odd) == 0);
	watch_set_stop(&w, end);
	mkfile(end, "");
	watch_end(&w, 0, SBX_ERR_NONE, 0); /* the callback said stop: sbx_watch returns 0 */

	char base[300];
	snprintf(base, sizeof(base), "%s/", dir);
	static const char *const want[] = {"create f",          "modify f",          "attrib f",       "moved_from f",
					   "moved_to g",        "delete g",          "create sub dir", "delete sub dir",
					   "create odd \n\xff", "delete odd \n\xff", "create end",     NULL};
	watch_expect(&w, base, want);
	/* the move's two halves carry the same non-zero cookie; other events none */
	CHECK(w.ev[3].cookie != 0);
	CHECK_EQ(w.ev[3].cookie, w.ev[4].cookie);
	CHECK_EQ(w.ev[0].cookie, 0);
	watch_free(&w);
	wait_streams_idle(c);

	/* a watch on a file: its own changes under its own path, then its removal
	 * ends the watch */
	watch_start(&w, c, end, 0, NULL, NULL);
	fd = open(end, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(write(fd, "more", 4) == 4);
	close(fd);
	CHECK(chmod(end, 0640) == 0);
	CHECK(unlink(end) == 0);
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	char l1[300], l2[300], l3[300];
	snprintf(l1, sizeof(l1), "modify %s", end);
	snprintf(l2, sizeof(l2), "attrib %s", end);
	snprintf(l3, sizeof(l3), "delete_self %s", end);
	/* chmod; unlink reports the link count as ATTRIB on kernels before 5.17 */
	pthread_mutex_lock(&w.mu);
	bool two = w.n == 4 && w.ev[2].type == SBX_WATCH_ATTRIB;
	pthread_mutex_unlock(&w.mu);
	const char *const want_file[] = {l1, l2, l3, NULL}, *const want_file2[] = {l1, l2, l2, l3, NULL};
	watch_expect(&w, "", two ? want_file2 : want_file);
	watch_free(&w);
	wait_streams_idle(c);

	free(f);
	free(g);
	free(sub);
	free(inner);
	free(odd);
	free(end);
	sbx_client_close(c);
	return 0;
}

static bool any_event_under(struct watch *w, const char *needle)
{
	bool found = false;
	pthread_mutex_lock(&w->mu);
	for (size_t i = 0; i < w->n && !found; i++)
		found = w->ev[i].path != NULL && strstr(w->ev[i].path, needle) != NULL;
	pthread_mutex_unlock(&w->mu);
	return found;
}

static int case_watch_recursive(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *dir = it_path("w");
	const char *out = it_path("out");
	mkdir_or_fail(dir);
	mkdir_or_fail(out);
	char *a = pjoin(dir, "a"), *deep = pjoin(dir, "a/deep");
	mkdir_or_fail(a);
	mkdir_or_fail(deep);
	struct watch w;
	/* the probe goes two levels down: the first walk watched existing subdirectories */
	watch_start(&w, c, dir, SBX_WATCH_RECURSIVE, deep, NULL);

	char *f1 = pjoin(dir, "a/f1");
	mkfile(f1, "1");
	watch_wait_for(&w, SBX_WATCH_CREATE, f1);

	/* new directories, with files made in them at once: reported whether the file
	 * came before the daemon's new watch (its scan) or after (inotify) */
	char *nw = pjoin(dir, "new"), *f2 = pjoin(dir, "new/f2");
	char *n2 = pjoin(dir, "n2"), *n3 = pjoin(dir, "n2/n3"), *f3 = pjoin(dir, "n2/n3/f3");
	mkdir_or_fail(nw);
	mkfile(f2, "2");
	mkdir_or_fail(n2);
	mkdir_or_fail(n3);
	mkfile(f3, "3");
	watch_wait_for(&w, SBX_WATCH_CREATE, nw);
	watch_wait_for(&w, SBX_WATCH_CREATE, f2);
	watch_wait_for(&w, SBX_WATCH_CREATE, n3);
	watch_wait_for(&w, SBX_WATCH_CREATE, f3);
	/* and they are watched from now on */
	int fd = open(f3, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(write(fd, "x", 1) == 1);
	close(fd);
	watch_wait_for(&w, SBX_WATCH_MODIFY, f3);
	long ci = watch_find(&w, 0, SBX_WATCH_CREATE, nw);
	CHECK(w.ev[ci].is_dir);

	/* a directory renamed within the tree: events below it carry the new name */
	char *b = pjoin(dir, "b"), *f4 = pjoin(dir, "b/deep/f4");
	CHECK(rename(a, b) == 0);
	mkfile(f4, "4");
	watch_wait_for(&w, SBX_WATCH_CREATE, f4);
	long mf = watch_find(&w, 0, SBX_WATCH_MOVED_FROM, a), mt = watch_find(&w, 0, SBX_WATCH_MOVED_TO, b);
	CHECK(mf >= 0 && mt == mf + 1);
	CHECK(w.ev[mf].cookie != 0 && w.ev[mf].cookie == w.ev[mt].cookie);
	CHECK(w.ev[mf].is_dir && w.ev[mt].is_dir);

	/* moved out of the tree: no longer reported */
	char *bdeep = pjoin(dir, "b/deep"), *odeep = pjoin(out, "deep"), *f5 = pjoin(out, "deep/f5-outside");
	CHECK(rename(bdeep, odeep) == 0);
	watch_wait_for(&w, SBX_WATCH_MOVED_FROM, bdeep);
	mkfile(f5, "5");

	/* moved into the tree: watched (once the daemon has added it) */
	char *oin = pjoin(out, "in"), *win = pjoin(dir, "in");
	mkdir_or_fail(oin);
	CHECK(rename(oin, win) == 0);
	watch_wait_for(&w, SBX_WATCH_MOVED_TO, win);
	CHECK(watch_probe(&w, win, NULL));

	char *end = pjoin(dir, "end");
	watch_set_stop(&w, end);
	mkfile(end, "");
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	CHECK(!any_event_under(&w, "f5-outside"));
	CHECK(!any_event_under(&w, out));
	watch_free(&w);
	wait_streams_idle(c);

	char *ps[] = {a, deep, f1, nw, f2, n2, n3, f3, b, f4, bdeep, odeep, f5, oin, win, end};
	for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
		free(ps[i]);
	sbx_client_close(c);
	return 0;
}

static int case_watch_delete_self(void)
{
	struct sbx_client *c = start(NULL, NULL);
	const char *dir = it_path("w");
	mkdir_or_fail(dir);
	char *f = pjoin(dir, "f");
	mkfile(f, "");
	struct watch w;
	watch_start(&w, c, dir, 0, dir, NULL);
	CHECK(unlink(f) == 0);
	CHECK(rmdir(dir) == 0);
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	char base[300], self[300];
	snprintf(base, sizeof(base), "%s/", dir);
	snprintf(self, sizeof(self), "delete_self %s dir", dir);
	const char *const want[] = {"delete f", self, NULL};
	watch_expect(&w, base, want);
	watch_free(&w);

	/* recursive, removed as a tree; given with a trailing slash */
	mkdir_or_fail(dir);
	char *sub = pjoin(dir, "sub"), *sf = pjoin(dir, "sub/sf");
	mkdir_or_fail(sub);
	mkfile(sf, "");
	char slash[300];
	snprintf(slash, sizeof(slash), "%s/", dir);
	watch_start(&w, c, slash, SBX_WATCH_RECURSIVE, sub, NULL);
	CHECK(unlink(sf) == 0);
	CHECK(rmdir(sub) == 0);
	CHECK(rmdir(dir) == 0);
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	const char *const want2[] = {"delete sub/sf", "delete sub dir", self, NULL};
	watch_expect(&w, base, want2);
	watch_free(&w);
	wait_streams_idle(c);
	free(f);
	free(sub);
	free(sf);
	sbx_client_close(c);
	return 0;
}

static int case_watch_cancel(void)
{
	const char *dir = fast_dir("w");
	struct sbx_client *c = start(NULL, NULL);
	struct sbx_error err;
	/* a tree whose first walk takes a while: cancelled in the middle of it */
	char tree[300];
	snprintf(tree, sizeof(tree), "%s/tree", dir);
	mkdir_or_fail(tree);
	for (unsigned i = 0; i < 400; i++) {
		char p[400];
		snprintf(p, sizeof(p), "%s/d%03u", tree, i);
		mkdir_or_fail(p);
		snprintf(p, sizeof(p), "%s/d%03u/e", tree, i);
		mkdir_or_fail(p);
	}
	for (int i = 0; i < 10; i++) {
		struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 1 + i};
		memset(&err, 0, sizeof(err));
		CHECK(sbx_watch(c, &o, tree, SBX_WATCH_RECURSIVE, watch_cb, NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	}
	wait_streams_idle(c);

	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	struct watch w;
	watch_begin(&w, c, &opts, dir, SBX_WATCH_RECURSIVE);
	CHECK(watch_probe(&w, dir, NULL));
	uint64_t t0 = it_now_ms();
	sbx_cancel_fire(tok);
	watch_end(&w, -1, SBX_ERR_LOCAL, ECANCELED);
	uint64_t ms = it_now_ms() - t0;
	CHECKF(ms < 1000, "the cancelled watch returned after %llu ms", (unsigned long long)ms);
	watch_free(&w);
	sbx_cancel_free(tok);
	wait_streams_idle(c);

	/* a timeout ends a watch with ETIMEDOUT */
	struct sbx_call_opts to = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 300};
	watch_begin(&w, c, &to, dir, 0);
	t0 = it_now_ms();
	watch_end(&w, -1, SBX_ERR_LOCAL, ETIMEDOUT);
	ms = it_now_ms() - t0;
	CHECKF(ms < 2000, "a 300 ms watch took %llu ms", (unsigned long long)ms);
	watch_free(&w);
	wait_streams_idle(c);

	/* a client that goes away with a watch open */
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("s")), NULL);
	watch_begin(&w, c2, NULL, dir, SBX_WATCH_RECURSIVE);
	CHECK(watch_probe(&w, dir, NULL));
	/* shutting the socket down makes the blocked sbx_watch fail; then close */
	CHECK(shutdown(sbx_client_fd(c2), SHUT_RDWR) == 0);
	watch_end(&w, -1, SBX_ERR_NONE, 0);
	watch_free(&w);
	sbx_client_close(c2);
	wait_streams_idle(c);

	/* bad requests */
	memset(&err, 0, sizeof(err));
	char *missing = pjoin(dir, "missing");
	CHECK(sbx_watch(c, NULL, missing, 0, watch_cb, &w, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, missing) == 0);
	free(missing);
	memset(&err, 0, sizeof(err));
	CHECK(sbx_watch(c, NULL, "rel", 0, watch_cb, &w, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	memset(&err, 0, sizeof(err));
	CHECK(sbx_watch(c, NULL, dir, 0, NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	char *f = pjoin(dir, "file"), *below = pjoin(dir, "file/x");
	mkfile(f, "");
	memset(&err, 0, sizeof(err));
	CHECK(sbx_watch(c, NULL, below, 0, watch_cb, &w, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	free(f);
	free(below);
	wait_streams_idle(c);
	sbx_client_close(c);
	fast_done();
	return 0;
}

#define FLOOD_N 20000

static int case_watch_overflow(void)
{
	const char *dir = fast_dir("w");
	struct it_daemon *d;
	struct sbx_client *c = start(&d, NULL);
	struct watch w;
	watch_start(&w, c, dir, 0, dir, NULL);

	/* the callback stalls on the first event: the client stops reading */
	w.stall = 1;
	char *trigger = pjoin(dir, "trigger");
	mkfile(trigger, "");
	uint64_t deadline = it_now_ms() + 10000;
	while (!w.stalled) {
		CHECK(it_now_ms() < deadline);
		it_sleep_ms(2);
	}
	long rss0 = proc_kib(d->pid, "VmRSS");
	reset_hwm(d->pid);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);
	char name[256], pad[101];
	memset(pad, 'p', 100);
	pad[100] = '\0';
	for (unsigned i = 0; i < FLOOD_N; i++) {
		snprintf(name, sizeof(name), "flood-%05u-%s", i, pad);
		int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		CHECK(fd >= 0);
		close(fd);
		CHECK(unlinkat(dfd, name, 0) == 0);
	}
	close(dfd);
	it_sleep_ms(200); /* let the daemon read what the kernel queued */
	long grew = proc_kib(d->pid, "VmHWM") - rss0;
	printf("%u events while the client stalled: daemon RSS grew by %ld KiB%s\n", 2 * FLOOD_N, grew,
	       IT_ASAN ? " (ASan build: not checked)" : "");
	if (!IT_ASAN)
		CHECKF(grew < 16 * 1024, "daemon RSS grew by %ld KiB", grew);

	/* reading again: an OVERFLOW, then events flow again */
	w.stall = 0;
	char end[300];
	long ei = -1;
	deadline = it_now_ms() + 20000;
	for (unsigned i = 0; ei < 0; i++) {
		snprintf(end, sizeof(end), "%s/end-%u", dir, i);
		mkfile(end, "");
		uint64_t until = it_now_ms() + 100;
		while (it_now_ms() < until && (ei = watch_find(&w, 0, SBX_WATCH_CREATE, end)) < 0)
			it_sleep_ms(2);
		CHECKF(it_now_ms() < deadline, "no events after the stall");
	}
	watch_set_stop(&w, end);
	mkfile(end, "again"); /* a MODIFY for the stop path, to end the watch */
	{
		int fd = open(end, O_WRONLY | O_APPEND | O_CLOEXEC);
		CHECK(fd >= 0);
		CHECK(write(fd, "x", 1) == 1);
		close(fd);
	}
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	pthread_mutex_lock(&w.mu);
	size_t n = w.n, noverflow = 0, first_overflow = n;
	for (size_t i = 0; i < n; i++) {
		if (w.ev[i].type == SBX_WATCH_OVERFLOW) {
			CHECK(w.ev[i].path == NULL);
			if (noverflow++ == 0)
				first_overflow = i;
		}
	}
	pthread_mutex_unlock(&w.mu);
	printf("%zu events delivered, %zu OVERFLOW, the first at %zu\n", n, noverflow, first_overflow);
	CHECKF(noverflow >= 1, "no OVERFLOW event");
	CHECK(first_overflow < (size_t)ei);
	CHECK(n < 2 * FLOOD_N); /* events were dropped, not held */
	watch_free(&w);
	wait_streams_idle(c);
	free(trigger);
	sbx_client_close(c);
	fast_done();
	return 0;
}

/* Out of file descriptors (the same errno as out of inotify instances): EMFILE,
 * reported on that watch; the others go on, and the daemon recovers. */
static int case_watch_emfile(void)
{
	struct it_daemon *d;
	struct sbx_client *c = start(&d, NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	unsigned base = it_count_fds(d->pid);
	struct rlimit rl;
	CHECK(prlimit(d->pid, RLIMIT_NOFILE, NULL, &rl) == 0);
	struct rlimit low = {.rlim_cur = base + 4, .rlim_max = rl.rlim_max};
	CHECK(prlimit(d->pid, RLIMIT_NOFILE, &low, NULL) == 0);

	enum { MAXW = 16 };
	static struct watch ws[MAXW];
	struct sbx_cancel *toks[MAXW];
	unsigned n = 0;
	bool got_emfile = false;
	while (n < MAXW && !got_emfile) {
		char name[32];
		snprintf(name, sizeof(name), "w%u", n);
		const char *dir = it_path(name);
		mkdir_or_fail(dir);
		toks[n] = sbx_cancel_new();
		struct sbx_call_opts opts = {
			.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = toks[n]};
		watch_begin(&ws[n], c, &opts, dir, 0);
		if (!watch_probe(&ws[n], dir, NULL)) {
			watch_end(&ws[n], -1, SBX_ERR_REMOTE, EMFILE);
			printf("watch %u: %s\n", n, it_errstr(&ws[n].err));
			got_emfile = true;
		}
		n++;
	}
	CHECKF(got_emfile, "%u watches with a limit of %u fds", n, base + 4);
	CHECK(n >= 2);
	/* the watches before still work */
	CHECK(watch_probe(&ws[0], it_path("w0"), NULL));
	for (unsigned i = 0; i + 1 < n; i++) {
		sbx_cancel_fire(toks[i]);
		watch_end(&ws[i], -1, SBX_ERR_LOCAL, ECANCELED);
	}
	for (unsigned i = 0; i < n; i++) {
		watch_free(&ws[i]);
		sbx_cancel_free(toks[i]);
	}
	wait_streams_idle(c);
	/* their fds are back: a new watch works */
	struct watch w;
	watch_start(&w, c, it_path("w0"), 0, it_path("w0"), NULL);
	char *end = pjoin(it_path("w0"), "end");
	watch_set_stop(&w, end);
	mkfile(end, "");
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	watch_free(&w);
	free(end);
	CHECK(prlimit(d->pid, RLIMIT_NOFILE, &rl, NULL) == 0);
	wait_streams_idle(c);
	sbx_client_close(c);
	return 0;
}

/* --root: the watch is given and reports paths as the client sees them. */
static int case_watch_confined(void)
{
	const char *root = it_path("root");
	mkdir_or_fail(root);
	char *wd = pjoin(root, "w"), *sub = pjoin(root, "w/sub");
	mkdir_or_fail(wd);
	mkdir_or_fail(sub);
	char *esc = pjoin(root, "w/esc");
	symlink_or_fail("/", esc);
	struct sbx_client *c = start(NULL, root);
	struct watch w;
	watch_start(&w, c, "/w", SBX_WATCH_RECURSIVE, sub, "/w/sub");
	char *f = pjoin(root, "w/sub/f"), *end = pjoin(root, "w/end");
	mkfile(f, "");
	watch_set_stop(&w, "/w/end");
	mkfile(end, "");
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	static const char *const want[] = {"create /w/sub/f", "create /w/end", NULL};
	watch_expect(&w, "", want);
	watch_free(&w);
	/* a symlink out of the root resolves inside it: /w/esc is the root */
	watch_start(&w, c, "/w/esc/w", 0, wd, "/w/esc/w");
	char *end2 = pjoin(wd, "end2");
	watch_set_stop(&w, "/w/esc/w/end2");
	mkfile(end2, "");
	watch_end(&w, 0, SBX_ERR_NONE, 0);
	static const char *const want2[] = {"create /w/esc/w/end2", NULL};
	watch_expect(&w, "", want2);
	watch_free(&w);
	free(end2);
	free(wd);
	free(sub);
	free(esc);
	free(f);
	free(end);
	sbx_client_close(c);
	return 0;
}

struct slow_list {
	struct sbx_client *c;
	const char *dir;
	volatile int stall, stalled;
	unsigned n;
	int rc;
	struct sbx_error err;
};

static int slow_cb(void *ud, const struct sbx_dirent *de)
{
	(void)de;
	struct slow_list *s = ud;
	s->n++;
	while (s->stall) {
		s->stalled = 1;
		it_sleep_ms(2);
	}
	return 0;
}

static void *slow_thread(void *arg)
{
	struct slow_list *s = arg;
	struct sbx_call_opts o = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};
	s->rc = sbx_list(s->c, &o, s->dir, 0, 0, slow_cb, s, NULL, &s->err);
	return NULL;
}

/* SIGTERM while a watch and a listing are in flight: both end with an error, and
 * the daemon exits 0 (under the sanitizers: nothing leaked). */
static int case_shutdown_active(void)
{
	const char *dir = fast_dir("t");
	struct it_daemon *d;
	struct sbx_client *c = start(&d, NULL);
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("s")), NULL);
	char p[400];
	for (unsigned i = 0; i < 50; i++) {
		snprintf(p, sizeof(p), "%s/d%02u", dir, i);
		mkdir_or_fail(p);
		for (unsigned j = 0; j < 100; j++) {
			snprintf(p, sizeof(p), "%s/d%02u/file-with-a-name-of-some-length-%03u", dir, i, j);
			mkfile(p, "");
		}
	}
	struct watch w;
	watch_start(&w, c, dir, SBX_WATCH_RECURSIVE, dir, NULL);
	struct slow_list s = {.c = c2, .dir = dir, .stall = 1};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, slow_thread, &s) == 0);
	uint64_t deadline = it_now_ms() + 10000;
	while (!s.stalled) {
		CHECK(it_now_ms() < deadline);
		it_sleep_ms(2);
	}
	int st = it_daemon_stop(d);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status 0x%x after SIGTERM", st);
	watch_end(&w, -1, SBX_ERR_NONE, 0);
	CHECKF(w.err.code == ECANCELED || w.err.code == ECONNRESET, "watch ended with %s", it_errstr(&w.err));
	s.stall = 0;
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(s.rc, -1);
	CHECKF(s.err.code == ECANCELED || s.err.code == ECONNRESET, "listing ended with %s", it_errstr(&s.err));
	CHECK(s.n < 5050);
	watch_free(&w);
	sbx_client_close(c2);
	sbx_client_close(c);
	fast_done();
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"names", case_names},
		{"depth", case_depth},
		{"symlinks", case_symlinks},
		{"errors", case_errors},
		{"eacces", case_eacces},
		{"big", case_big},
		{"big_tree", case_big_tree},
		{"list_stop", case_list_stop},
		{"confined", case_confined},
		{"watch_events", case_watch_events},
		{"watch_recursive", case_watch_recursive},
		{"watch_delete_self", case_watch_delete_self},
		{"watch_cancel", case_watch_cancel},
		{"watch_overflow", case_watch_overflow},
		{"watch_emfile", case_watch_emfile},
		{"watch_confined", case_watch_confined},
		{"shutdown_active", case_shutdown_active},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
