/* it_fs_ops.c: the one-shot file operations (mkdir ... statfs, copy) through libsbx against the real daemon. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* An SDK call that must fail in the shim with code; the call names its error
 * struct err_. */
#define FAILS_WITH(code, call)                                                                             \
	do {                                                                                               \
		struct sbx_error err_;                                                                     \
		memset(&err_, 0, sizeof(err_));                                                            \
		if ((call) >= 0)                                                                           \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code)); \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                    \
	} while (0)

#define OK(call)                          \
	do {                              \
		struct sbx_error err_;    \
		CHECK_SBX((call), &err_); \
	} while (0)

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static struct sbx_client *client;
static struct sbx_statfs sf_dummy = SBX_STATFS_INIT;

/* A daemon (confined to root if not NULL) and a client for it. */
static struct sbx_client *start(const char *root)
{
	const char *sock = it_path("shim.sock");
	if (root != NULL)
		it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), "--root",
				root, NULL);
	else
		it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	client = it_connect(it_unix_target(sock), NULL);
	return client;
}

/* 1 or 0 as the daemon sees the path (lstat). */
static int rexists(const char *path)
{
	struct sbx_error e;
	int r = sbx_exists(client, NULL, path, &e);
	CHECKF(r >= 0, "exists %s: %s", path, it_errstr(&e));
	return r;
}

static void finish(void)
{
	sbx_client_close(client);
	client = NULL;
}

/* ---- local helpers ---- */

static struct stat lst(const char *path)
{
	struct stat st;
	CHECKF(lstat(path, &st) == 0, "lstat %s: %s", path, strerror(errno));
	return st;
}

static bool lexists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static void mk(const char *path, mode_t mode)
{
	CHECKF(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	CHECK(chmod(path, mode) == 0);
}

static void put(const char *path, const void *data, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, len) == (ssize_t)len);
	CHECK(fchmod(fd, mode) == 0);
	close(fd);
}

static void ln_s(const char *target, const char *link)
{
	CHECKF(symlink(target, link) == 0, "symlink %s: %s", link, strerror(errno));
}

static void set_time(const char *path, int64_t asec, long ansec, int64_t msec, long mnsec)
{
	struct timespec ts[2] = {{(time_t)asec, ansec}, {(time_t)msec, mnsec}};
	CHECKF(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) == 0, "utimensat %s: %s", path, strerror(errno));
}

/* The test's own reads must not move the atimes that copies are checked against:
 * O_NOATIME (the owner or root may use it). */
static int open_noatime(const char *path, int flags)
{
	int fd = open(path, flags | O_NOATIME | O_CLOEXEC);
	if (fd < 0 && errno == EPERM)
		fd = open(path, flags | O_CLOEXEC);
	return fd;
}

static DIR *opendir_noatime(const char *path)
{
	int fd = open_noatime(path, O_RDONLY | O_DIRECTORY);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (d == NULL && fd >= 0)
		close(fd);
	return d;
}

/* The whole file (caller frees); *len gets its size. */
static char *slurp(const char *path, size_t *len)
{
	int fd = open_noatime(path, O_RDONLY);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	struct stat st;
	CHECK(fstat(fd, &st) == 0);
	char *buf = malloc((size_t)st.st_size + 1);
	CHECK(buf != NULL);
	size_t off = 0;
	for (;;) {
		ssize_t n = read(fd, buf + off, (size_t)st.st_size + 1 - off);
		CHECK(n >= 0);
		if (n == 0)
			break;
		off += (size_t)n;
		CHECK(off <= (size_t)st.st_size);
	}
	close(fd);
	*len = off;
	return buf;
}

static bool same_content(const char *a, const char *b)
{
	size_t la, lb;
	char *x = slurp(a, &la), *y = slurp(b, &lb);
	bool same = la == lb && memcmp(x, y, la) == 0;
	free(x);
	free(y);
	return same;
}

/* Names in dir that start with prefix. */
static unsigned count_prefix(const char *dir, const char *prefix)
{
	DIR *d = opendir_noatime(dir);
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			n++;
	closedir(d);
	return n;
}

static unsigned count_entries(const char *dir)
{
	DIR *d = opendir_noatime(dir);
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

/* snprintf into an array that must not truncate. */
#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

/* "a/b" in a static buffer (8 call slots, so joins may nest). */
static const char *join(const char *a, const char *b)
{
	static char bufs[8][PATH_MAX];
	static unsigned next;
	char tmp[PATH_MAX];
	SPRINTF(tmp, "%s/%s", a, b);
	char *buf = bufs[next++ % 8];
	memcpy(buf, tmp, strlen(tmp) + 1);
	return buf;
}

/* ---- tree snapshots: what a copy must reproduce ---- */

struct snap_entry {
	char rel[128];
	struct stat st;
	char target[256]; /* symlinks */
};
struct snap {
	struct snap_entry e[64];
	unsigned n;
};

static void snap_walk(struct snap *s, const char *root, const char *rel)
{
	const char *path = rel[0] ? join(root, rel) : root;
	char pathbuf[PATH_MAX];
	SPRINTF(pathbuf, "%s", path);
	CHECK(s->n < 64);
	struct snap_entry *e = &s->e[s->n++];
	CHECK(snprintf(e->rel, sizeof(e->rel), "%s", rel) < (int)sizeof(e->rel));
	e->st = lst(pathbuf);
	e->target[0] = '\0';
	if (S_ISLNK(e->st.st_mode)) {
		ssize_t n = readlink(pathbuf, e->target, sizeof(e->target) - 1);
		CHECK(n >= 0);
		e->target[n] = '\0';
	}
	if (!S_ISDIR(e->st.st_mode))
		return;
	DIR *d = opendir_noatime(pathbuf);
	CHECK(d != NULL);
	struct dirent *de;
	char names[32][64];
	unsigned nn = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		CHECK(nn < 32);
		CHECK(snprintf(names[nn++], 64, "%s", de->d_name) < 64);
	}
	closedir(d);
	for (unsigned i = 0; i < nn; i++) {
		char sub[128];
		SPRINTF(sub, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
		snap_walk(s, root, sub);
	}
}

/* Take the snapshot of the tree at root (its times as they are before a copy
 * reads it: reading may move the source's atimes). */
static void snap_take(struct snap *s, const char *root)
{
	s->n = 0;
	snap_walk(s, root, "");
}

/* The tree at copy holds exactly the snapshot's entries: type, mode, owner, size,
 * atime and mtime to the nanosecond, link targets, contents (compared with the
 * file under orig, which must still hold the same bytes). */
static void snap_check(const struct snap *s, const char *orig, const char *copy)
{
	unsigned seen = 0;
	for (unsigned i = 0; i < s->n; i++) {
		const struct snap_entry *e = &s->e[i];
		char cp[PATH_MAX], op[PATH_MAX];
		SPRINTF(cp, "%s%s%s", copy, e->rel[0] ? "/" : "", e->rel);
		SPRINTF(op, "%s%s%s", orig, e->rel[0] ? "/" : "", e->rel);
		struct stat st;
		CHECKF(lstat(cp, &st) == 0, "copy lacks '%s': %s", e->rel, strerror(errno));
		CHECKF((st.st_mode & S_IFMT) == (e->st.st_mode & S_IFMT), "'%s': type %o, want %o", e->rel,
		       st.st_mode & S_IFMT, e->st.st_mode & S_IFMT);
		if (!S_ISLNK(st.st_mode))
			CHECKF((st.st_mode & 07777) == (e->st.st_mode & 07777), "'%s': mode %o, want %o", e->rel,
			       st.st_mode & 07777, e->st.st_mode & 07777);
		CHECKF(st.st_uid == e->st.st_uid && st.st_gid == e->st.st_gid, "'%s': owner %u:%u, want %u:%u", e->rel,
		       st.st_uid, st.st_gid, e->st.st_uid, e->st.st_gid);
		CHECKF(st.st_mtim.tv_sec == e->st.st_mtim.tv_sec && st.st_mtim.tv_nsec == e->st.st_mtim.tv_nsec,
		       "'%s': mtime %lld.%09ld, want %lld.%09ld", e->rel, (long long)st.st_mtim.tv_sec,
		       st.st_mtim.tv_nsec, (long long)e->st.st_mtim.tv_sec, e->st.st_mtim.tv_nsec);
		CHECKF(st.st_atim.tv_sec == e->st.st_atim.tv_sec && st.st_atim.tv_nsec == e->st.st_atim.tv_nsec,
		       "'%s': atime %lld.%09ld, want %lld.%09ld", e->rel, (long long)st.st_atim.tv_sec,
		       st.st_atim.tv_nsec, (long long)e->st.st_atim.tv_sec, e->st.st_atim.tv_nsec);
		if (S_ISREG(st.st_mode)) {
			CHECK_EQ(st.st_size, e->st.st_size);
			CHECKF(same_content(cp, op), "'%s': content differs", e->rel);
		}
		if (S_ISLNK(st.st_mode)) {
			char t[256];
			ssize_t n = readlink(cp, t, sizeof(t) - 1);
			CHECK(n >= 0);
			t[n] = '\0';
			CHECKF(strcmp(t, e->target) == 0, "'%s': target '%s', want '%s'", e->rel, t, e->target);
		}
		if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
			CHECK_EQ(st.st_rdev, e->st.st_rdev);
		if (S_ISDIR(st.st_mode)) {
			/* nothing more in the copy than in the source (no temp names) */
			unsigned want = 0;
			size_t rl = strlen(e->rel);
			for (unsigned j = 0; j < s->n; j++) {
				const char *r = s->e[j].rel;
				if (j == i || strncmp(r, e->rel, rl) != 0)
					continue;
				const char *rest = r + rl + (rl ? 1 : 0);
				if (rl && r[rl] != '/')
					continue;
				if (strchr(rest, '/') == NULL)
					want++;
			}
			CHECKF(count_entries(cp) == want, "'%s': %u entries, want %u", e->rel, count_entries(cp), want);
		}
		seen++;
	}
	CHECK_EQ(seen, s->n);
}

/* A tree with one of everything: nested files of several modes, a setuid file,
 * a file owned by 1234:5678 (when root), a relative and an absolute symlink, a
 * dangling one, a FIFO, an empty directory, a read-only directory, odd times. */
static void make_tree(const char *root)
{
	uint8_t data[300000];
	it_fill(data, sizeof(data), 42);
	mk(root, 0751);
	mk(join(root, "sub"), 0755);
	mk(join(root, "sub/deeper"), 0700);
	mk(join(root, "empty"), 0700);
	mk(join(root, "ro"), 0755);
	put(join(root, "big"), data, sizeof(data), 0644);
	put(join(root, "sub/small"), "hello\n", 6, 0600);
	put(join(root, "sub/deeper/suid"), "#!/bin/sh\n", 10, 04755);
	put(join(root, "sub/deeper/empty-file"), "", 0, 0444);
	put(join(root, "ro/inside"), "x", 1, 0640);
	CHECK(chmod(join(root, "ro"), 0555) == 0);
	put(join(root, "name with spaces\nand newline"), "odd", 3, 0666);
	ln_s("sub/small", join(root, "rel-link"));
	ln_s("/etc/hostname", join(root, "abs-link"));
	ln_s("nowhere/at/all", join(root, "dangling"));
	CHECK(mkfifo(join(root, "sub/fifo"), 0620) == 0);
	CHECK(chmod(join(root, "sub/fifo"), 0620) == 0);
	if (geteuid() == 0) {
		CHECK(lchown(join(root, "sub/small"), 1234, 5678) == 0);
		CHECK(lchown(join(root, "rel-link"), 4321, 8765) == 0);
		CHECK(chmod(join(root, "sub/small"), 0600) == 0);
		CHECK(mknod(join(root, "null-dev"), S_IFCHR | 0640, makedev(1, 3)) == 0);
	}
	/* times last, leaves first (a directory's mtime moves with its entries);
	 * atimes in the future, so that reading (readlink too) cannot move them
	 * under relatime and the copies can be checked against them */
	set_time(join(root, "big"), 2100000000, 111111111, 1400000000, 222222222);
	set_time(join(root, "sub/small"), 2100000000, 1, 1600000001, 999999999);
	set_time(join(root, "sub/deeper/suid"), 2100000000, 5, 1000000000, 6);
	set_time(join(root, "rel-link"), 2100000000, 7, 1200000000, 8);
	set_time(join(root, "sub/fifo"), 2100000000, 9, 1300000000, 10);
	set_time(join(root, "abs-link"), 2100000000, 21, 1200000000, 22);
	set_time(join(root, "dangling"), 2100000000, 23, 1200000000, 24);
	set_time(join(root, "name with spaces\nand newline"), 2100000000, 25, 1200000000, 26);
	set_time(join(root, "sub/deeper/empty-file"), 2100000000, 27, 1200000000, 28);
	set_time(join(root, "ro/inside"), 2100000000, 29, 1200000000, 30);
	if (geteuid() == 0)
		set_time(join(root, "null-dev"), 2100000000, 31, 1200000000, 32);
	set_time(join(root, "sub/deeper"), 2100000000, 11, 1100000000, 12);
	set_time(join(root, "sub"), 2100000000, 13, 1100000000, 14);
	set_time(join(root, "empty"), 2100000000, 15, 1100000000, 16);
	set_time(join(root, "ro"), 2100000000, 17, 1100000000, 18);
	set_time(root, 2100000000, 19, 1700000000, 20);
}

/* ---- mkdir ---- */

static int case_mkdir(void)
{
	/* the daemon inherits this umask: modes must come out exact anyway */
	mode_t old = umask(027);
	struct sbx_client *c = start(NULL);
	umask(old);
	OK(sbx_mkdir(c, NULL, it_path("d"), 0, -1, &err_));
	struct stat st = lst(it_path("d"));
	CHECK(S_ISDIR(st.st_mode));
	CHECK_EQ(st.st_mode & 07777, 0755);
	OK(sbx_mkdir(c, NULL, it_path("d700"), 0, 0700, &err_));
	CHECK_EQ(lst(it_path("d700")).st_mode & 07777, 0700);
	OK(sbx_mkdir(c, NULL, it_path("dsgid"), 0, 02777, &err_));
	CHECK_EQ(lst(it_path("dsgid")).st_mode & 07777, 02777);
	/* the stat the SDK reports agrees */
	struct sbx_stat s = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, it_path("dsgid"), 0, &s, &err_));
	CHECK_EQ(s.type, SBX_FT_DIRECTORY);
	CHECK_EQ(s.mode, 02777);

	/* parents: missing ones 0755, the last one the mode asked */
	OK(sbx_mkdir(c, NULL, it_path("p/q/r"), SBX_MKDIR_PARENTS, 0711, &err_));
	CHECK_EQ(lst(it_path("p")).st_mode & 07777, 0755);
	CHECK_EQ(lst(it_path("p/q")).st_mode & 07777, 0755);
	CHECK_EQ(lst(it_path("p/q/r")).st_mode & 07777, 0711);
	/* an existing directory is fine with parents, and left as it is */
	struct stat before = lst(it_path("p/q/r"));
	OK(sbx_mkdir(c, NULL, it_path("p/q/r"), SBX_MKDIR_PARENTS, 0700, &err_));
	struct stat after = lst(it_path("p/q/r"));
	CHECK_EQ(after.st_mode, before.st_mode);
	CHECK_EQ(after.st_ino, before.st_ino);
	OK(sbx_mkdir(c, NULL, it_path("p//q/./r/"), SBX_MKDIR_PARENTS, -1, &err_));
	/* through a symlink to a directory, as mkdir -p */
	ln_s("p/q", it_path("lq"));
	OK(sbx_mkdir(c, NULL, it_path("lq/new/x"), SBX_MKDIR_PARENTS, -1, &err_));
	CHECK(S_ISDIR(lst(it_path("p/q/new/x")).st_mode));

	/* errors */
	put(it_path("file"), "f", 1, 0644);
	FAILS_WITH(EEXIST, sbx_mkdir(c, NULL, it_path("d"), 0, -1, &err_));
	FAILS_WITH(EEXIST, sbx_mkdir(c, NULL, it_path("file"), 0, -1, &err_));
	FAILS_WITH(EEXIST, sbx_mkdir(c, NULL, it_path("file"), SBX_MKDIR_PARENTS, -1, &err_));
	FAILS_WITH(ENOTDIR, sbx_mkdir(c, NULL, it_path("file/sub"), SBX_MKDIR_PARENTS, -1, &err_));
	FAILS_WITH(ENOTDIR, sbx_mkdir(c, NULL, it_path("file/sub"), 0, -1, &err_));
	FAILS_WITH(ENOENT, sbx_mkdir(c, NULL, it_path("nope/sub"), 0, -1, &err_));
	CHECK(!lexists(it_path("nope")));
	FAILS_WITH(EEXIST, sbx_mkdir(c, NULL, it_path("lq"), 0, -1, &err_));
	FAILS_WITH(EINVAL, sbx_mkdir(c, NULL, "relative/dir", 0, -1, &err_));
	FAILS_WITH(EINVAL, sbx_mkdir(c, NULL, it_path("badmode"), 0, 010000, &err_));
	CHECK(!lexists(it_path("badmode")));
	/* the error names the path as given */
	struct sbx_error e;
	CHECK(sbx_mkdir(c, NULL, it_path("nope/sub"), 0, -1, &e) < 0);
	CHECK(strcmp(e.path, it_path("nope/sub")) == 0);
	CHECK(strcmp(sbx_errno_name(e.code), "ENOENT") == 0);
	finish();
	return 0;
}

/* ---- remove ---- */

/* depth levels of 40-byte names below dir, built with fds: the path is far longer
 * than PATH_MAX, so only an fd-based walk can remove it. */
static void make_deep(const char *dir, unsigned depth)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(fd >= 0);
	const char *name = "a-forty-byte-directory-name-0123456789ab";
	for (unsigned i = 0; i < depth; i++) {
		CHECK(mkdirat(fd, name, 0755) == 0);
		int f = openat(fd, "file", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		CHECK(f >= 0);
		close(f);
		int nfd = openat(fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		CHECK(nfd >= 0);
		close(fd);
		fd = nfd;
	}
	close(fd);
}

static int case_remove(void)
{
	struct sbx_client *c = start(NULL);
	/* a file */
	put(it_path("f"), "x", 1, 0644);
	OK(sbx_remove(c, NULL, it_path("f"), 0, &err_));
	CHECK(!lexists(it_path("f")));
	/* a symlink to a directory: the link goes, the directory and its files stay */
	mk(it_path("keep"), 0755);
	put(it_path("keep/inside"), "k", 1, 0644);
	ln_s(it_path("keep"), it_path("link"));
	OK(sbx_remove(c, NULL, it_path("link"), 0, &err_));
	CHECK(!lexists(it_path("link")));
	CHECK(lexists(it_path("keep/inside")));
	ln_s(it_path("keep"), it_path("link2"));
	OK(sbx_remove(c, NULL, it_path("link2"), SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(it_path("link2")));
	CHECK(lexists(it_path("keep/inside")));
	/* an empty directory */
	mk(it_path("empty"), 0755);
	OK(sbx_remove(c, NULL, it_path("empty"), 0, &err_));
	CHECK(!lexists(it_path("empty")));
	/* non-empty without recursive */
	FAILS_WITH(ENOTEMPTY, sbx_remove(c, NULL, it_path("keep"), 0, &err_));
	CHECK(lexists(it_path("keep/inside")));

	/* a tree with a symlink pointing out of it (never followed), a FIFO, a
	 * read-only directory and a dangling symlink */
	make_tree(it_path("tree"));
	ln_s(it_path("keep"), it_path("tree/sub/out"));
	OK(sbx_remove(c, NULL, it_path("tree"), SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(it_path("tree")));
	CHECK(lexists(it_path("keep/inside")));
	CHECK_EQ(count_entries(it_path("keep")), 1);

	/* many entries with subdirectories among them: the walk leaves a directory
	 * half read and comes back to it */
	mk(it_path("wide"), 0755);
	/* (more than one getdents buffer of entries) */
	int wfd = open(it_path("wide"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(wfd >= 0);
	for (unsigned i = 0; i < 1200; i++) {
		char name[64];
		SPRINTF(name, "entry-with-a-longish-name-%05u", i);
		if (i % 100 == 7) {
			CHECK(mkdirat(wfd, name, 0755) == 0);
			CHECK(mknodat(wfd, join(name, "f"), S_IFREG | 0644, 0) == 0);
		} else {
			CHECK(mknodat(wfd, name, S_IFREG | 0644, 0) == 0);
		}
	}
	close(wfd);
	OK(sbx_remove(c, NULL, it_path("wide"), SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(it_path("wide")));

	/* deeper than PATH_MAX and than the walk's window of open fds */
	mk(it_path("deep"), 0755);
	make_deep(it_path("deep"), 300);
	OK(sbx_remove(c, NULL, it_path("deep"), SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(it_path("deep")));

	/* errors */
	put(it_path("file"), "f", 1, 0644);
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, it_path("nope"), 0, &err_));
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, it_path("nope"), SBX_REMOVE_RECURSIVE, &err_));
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, it_path("nope/x"), 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_remove(c, NULL, it_path("file/x"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_remove(c, NULL, "relative", 0, &err_));
	FAILS_WITH(EINVAL, sbx_remove(c, NULL, it_path("keep/.."), SBX_REMOVE_RECURSIVE, &err_));
	FAILS_WITH(EINVAL, sbx_remove(c, NULL, it_path("keep/."), SBX_REMOVE_RECURSIVE, &err_));
	CHECK(lexists(it_path("keep/inside")));
	CHECK(lexists(it_path("file")));
	finish();
	return 0;
}

/* ---- rename ---- */

static int case_rename(void)
{
	struct sbx_client *c = start(NULL);
	put(it_path("a"), "content-a", 9, 0640);
	struct stat sa = lst(it_path("a"));
	OK(sbx_rename(c, NULL, it_path("a"), it_path("b"), 0, &err_));
	CHECK(!lexists(it_path("a")));
	struct stat sb = lst(it_path("b"));
	CHECK_EQ(sb.st_ino, sa.st_ino);
	CHECK_EQ(sb.st_mode & 07777, 0640);
	/* over an existing file */
	put(it_path("c"), "old", 3, 0644);
	OK(sbx_rename(c, NULL, it_path("b"), it_path("c"), 0, &err_));
	CHECK_EQ(lst(it_path("c")).st_ino, sa.st_ino);
	/* no_replace */
	put(it_path("d"), "d", 1, 0644);
	FAILS_WITH(EEXIST, sbx_rename(c, NULL, it_path("c"), it_path("d"), SBX_RENAME_NOREPLACE, &err_));
	CHECK_EQ(lst(it_path("c")).st_ino, sa.st_ino);
	OK(sbx_rename(c, NULL, it_path("c"), it_path("e"), SBX_RENAME_NOREPLACE, &err_));
	CHECK_EQ(lst(it_path("e")).st_ino, sa.st_ino);
	/* a directory with content; a symlink (moved itself, not its target) */
	make_tree(it_path("t"));
	struct snap s;
	snap_take(&s, it_path("t"));
	OK(sbx_rename(c, NULL, it_path("t"), it_path("t2"), 0, &err_));
	CHECK(!lexists(it_path("t")));
	CHECK_EQ(lst(it_path("t2")).st_ino, s.e[0].st.st_ino);
	ln_s("e", it_path("l"));
	OK(sbx_rename(c, NULL, it_path("l"), it_path("l2"), 0, &err_));
	CHECK(S_ISLNK(lst(it_path("l2")).st_mode));
	CHECK_EQ(lst(it_path("e")).st_ino, sa.st_ino);
	/* a directory over an empty one replaces it */
	mk(it_path("emptydst"), 0755);
	mk(it_path("srcdir"), 0700);
	OK(sbx_rename(c, NULL, it_path("srcdir"), it_path("emptydst"), 0, &err_));
	CHECK_EQ(lst(it_path("emptydst")).st_mode & 07777, 0700);

	/* errors */
	mk(it_path("full"), 0755);
	put(it_path("full/x"), "x", 1, 0644);
	mk(it_path("dir"), 0755);
	FAILS_WITH(ENOENT, sbx_rename(c, NULL, it_path("nope"), it_path("x"), 0, &err_));
	FAILS_WITH(ENOENT, sbx_rename(c, NULL, it_path("e"), it_path("nope/x"), 0, &err_));
	FAILS_WITH(ENOTEMPTY, sbx_rename(c, NULL, it_path("dir"), it_path("full"), 0, &err_));
	FAILS_WITH(EISDIR, sbx_rename(c, NULL, it_path("e"), it_path("dir"), 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_rename(c, NULL, it_path("dir"), it_path("e"), 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_rename(c, NULL, it_path("e/x"), it_path("y"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_rename(c, NULL, it_path("dir"), it_path("dir/sub"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_rename(c, NULL, "rel", it_path("y"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_rename(c, NULL, it_path("e"), "rel", 0, &err_));
	CHECK(lexists(it_path("e")) && lexists(it_path("full/x")) && lexists(it_path("dir")));
	finish();
	return 0;
}

/* ---- copy ---- */

static int case_copy_file(void)
{
	struct sbx_client *c = start(NULL);
	uint8_t data[1 << 20];
	it_fill(data, sizeof(data), 7);
	put(it_path("src"), data, sizeof(data), 04750);
	if (geteuid() == 0) {
		CHECK(chown(it_path("src"), 1234, 5678) == 0);
		CHECK(chmod(it_path("src"), 04750) == 0);
	}
	set_time(it_path("src"), 1234567890, 123456789, 987654321, 987654321);
	struct stat ss = lst(it_path("src"));
	OK(sbx_copy(c, NULL, it_path("src"), it_path("dst"), 0, &err_));
	struct stat ds = lst(it_path("dst"));
	CHECK(S_ISREG(ds.st_mode));
	CHECK(ds.st_ino != ss.st_ino);
	CHECK_EQ(ds.st_mode & 07777, 04750);
	CHECK_EQ(ds.st_size, sizeof(data));
	CHECK_EQ(ds.st_mtim.tv_sec, 987654321);
	CHECK_EQ(ds.st_mtim.tv_nsec, 987654321);
	CHECK_EQ(ds.st_atim.tv_sec, 1234567890);
	CHECK_EQ(ds.st_atim.tv_nsec, 123456789);
	if (geteuid() == 0) {
		CHECK_EQ(ds.st_uid, 1234);
		CHECK_EQ(ds.st_gid, 5678);
	}
	CHECK(same_content(it_path("src"), it_path("dst")));
	/* through the SDK's stat too */
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, it_path("dst"), 0, &st, &err_));
	CHECK_EQ(st.mode, 04750);
	CHECK_EQ(st.mtime.sec, 987654321);
	CHECK_EQ(st.mtime.nsec, 987654321);

	/* an existing file is replaced whole (a new inode renamed over it) */
	put(it_path("old"), "old content", 11, 0600);
	struct stat os = lst(it_path("old"));
	OK(sbx_copy(c, NULL, it_path("src"), it_path("old"), 0, &err_));
	CHECK(same_content(it_path("src"), it_path("old")));
	CHECK(lst(it_path("old")).st_ino != os.st_ino);
	CHECK_EQ(lst(it_path("old")).st_mode & 07777, 04750);
	/* an empty file */
	put(it_path("zero"), "", 0, 0604);
	OK(sbx_copy(c, NULL, it_path("zero"), it_path("zero2"), 0, &err_));
	CHECK_EQ(lst(it_path("zero2")).st_size, 0);
	CHECK_EQ(lst(it_path("zero2")).st_mode & 07777, 0604);

	/* a symlink as the source: followed without recursive (like cp), kept with it */
	ln_s("src", it_path("lnk"));
	OK(sbx_copy(c, NULL, it_path("lnk"), it_path("fromlink"), 0, &err_));
	CHECK(S_ISREG(lst(it_path("fromlink")).st_mode));
	CHECK(same_content(it_path("src"), it_path("fromlink")));
	OK(sbx_copy(c, NULL, it_path("lnk"), it_path("linkcopy"), SBX_COPY_RECURSIVE, &err_));
	CHECK(S_ISLNK(lst(it_path("linkcopy")).st_mode));
	char t[64];
	OK(sbx_readlink(c, NULL, it_path("linkcopy"), t, sizeof(t), &err_));
	CHECK(strcmp(t, "src") == 0);
	/* a FIFO is made anew, never opened */
	CHECK(mkfifo(it_path("fifo"), 0640) == 0);
	OK(sbx_copy(c, NULL, it_path("fifo"), it_path("fifo2"), 0, &err_));
	CHECK(S_ISFIFO(lst(it_path("fifo2")).st_mode));
	CHECK_EQ(lst(it_path("fifo2")).st_mode & 07777, 0640);

	/* a sparse file past 4 GiB stays sparse and byte-exact */
	int fd = open(it_path("sparse"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	const off_t far = (off_t)4608 << 20; /* 4.5 GiB */
	CHECK(pwrite(fd, data, 65536, 0) == 65536);
	CHECK(pwrite(fd, data + 65536, 65536, far) == 65536);
	CHECK(ftruncate(fd, far + (off_t)(1 << 20)) == 0);
	close(fd);
	OK(sbx_copy(c, NULL, it_path("sparse"), it_path("sparse2"), 0, &err_));
	struct stat sp = lst(it_path("sparse2"));
	CHECK_EQ(sp.st_size, far + (1 << 20));
	CHECKF(sp.st_blocks * 512 < (8 << 20), "the copy takes %lld bytes", (long long)sp.st_blocks * 512);
	fd = open(it_path("sparse2"), O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	uint8_t back[65536];
	CHECK(pread(fd, back, sizeof(back), 0) == 65536);
	CHECK(memcmp(back, data, 65536) == 0);
	CHECK(pread(fd, back, sizeof(back), far) == 65536);
	CHECK(memcmp(back, data + 65536, 65536) == 0);
	CHECK(pread(fd, back, sizeof(back), far / 2) == 65536);
	for (size_t i = 0; i < sizeof(back); i++)
		CHECK(back[i] == 0);
	close(fd);

	/* errors: nothing copied, nothing left behind */
	mk(it_path("dir"), 0755);
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, it_path("nope"), it_path("x"), 0, &err_));
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, it_path("src"), it_path("nope/x"), 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_copy(c, NULL, it_path("src/x"), it_path("x"), 0, &err_));
	FAILS_WITH(EISDIR, sbx_copy(c, NULL, it_path("src"), it_path("dir"), 0, &err_));
	FAILS_WITH(EISDIR, sbx_copy(c, NULL, it_path("dir"), it_path("x"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, "rel", it_path("x"), 0, &err_));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, it_path("src"), "rel", 0, &err_));
	CHECK(!lexists(it_path("x")));
	CHECK_EQ(count_entries(it_path("dir")), 0);
	CHECK_EQ(count_prefix(it_dir(), ".sbx-"), 0);
	finish();
	return 0;
}

static int case_copy_tree(void)
{
	struct sbx_client *c = start(NULL);
	make_tree(it_path("tree"));
	struct snap s;
	snap_take(&s, it_path("tree"));
	OK(sbx_copy(c, NULL, it_path("tree"), it_path("copy"), SBX_COPY_RECURSIVE, &err_));
	snap_check(&s, it_path("tree"), it_path("copy"));
	CHECK_EQ(count_prefix(it_dir(), ".sbx-"), 0);
	/* a copy of a copy, below another directory */
	mk(it_path("below"), 0755);
	OK(sbx_copy(c, NULL, it_path("copy"), it_path("below/again"), SBX_COPY_RECURSIVE, &err_));
	snap_check(&s, it_path("tree"), it_path("below/again"));

	/* deeper than the walk's window of open fds, and than PATH_MAX */
	mk(it_path("deep"), 0755);
	make_deep(it_path("deep"), 120);
	OK(sbx_copy(c, NULL, it_path("deep"), it_path("deep2"), SBX_COPY_RECURSIVE, &err_));
	OK(sbx_remove(c, NULL, it_path("deep"), SBX_REMOVE_RECURSIVE, &err_));
	OK(sbx_remove(c, NULL, it_path("deep2"), SBX_REMOVE_RECURSIVE, &err_));

	/* into itself or below itself: EINVAL; onto a directory: EEXIST */
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, it_path("tree"), it_path("tree/sub/x"), SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, it_path("tree"), it_path("tree/x"), SBX_COPY_RECURSIVE, &err_));
	ln_s("tree/sub", it_path("via-link"));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, it_path("tree"), it_path("via-link/x"), SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EEXIST, sbx_copy(c, NULL, it_path("tree"), it_path("tree"), SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EEXIST, sbx_copy(c, NULL, it_path("tree"), it_path("copy"), SBX_COPY_RECURSIVE, &err_));
	put(it_path("file"), "f", 1, 0644);
	FAILS_WITH(EEXIST, sbx_copy(c, NULL, it_path("tree"), it_path("file"), SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EISDIR, sbx_copy(c, NULL, it_path("tree"), it_path("nonrec"), 0, &err_));
	CHECK(!lexists(it_path("tree/sub/x")) && !lexists(it_path("tree/x")) && !lexists(it_path("nonrec")));
	CHECK_EQ(count_entries(it_path("tree")), count_entries(it_path("copy")));
	CHECK_EQ(count_entries(it_path("tree/sub")), count_entries(it_path("copy/sub")));
	CHECK_EQ(count_prefix(it_dir(), ".sbx-"), 0);
	CHECK_EQ(count_prefix(it_path("tree/sub"), ".sbx-"), 0);
	finish();
	return 0;
}

/* ---- chmod, chown ---- */

static int case_chmod_chown(void)
{
	struct sbx_client *c = start(NULL);
	put(it_path("f"), "f", 1, 0644);
	OK(sbx_chmod(c, NULL, it_path("f"), 04711, &err_));
	CHECK_EQ(lst(it_path("f")).st_mode & 07777, 04711);
	OK(sbx_chmod(c, NULL, it_path("f"), 0, &err_));
	CHECK_EQ(lst(it_path("f")).st_mode & 07777, 0);
	mk(it_path("d"), 0755);
	OK(sbx_chmod(c, NULL, it_path("d"), 01777, &err_));
	CHECK_EQ(lst(it_path("d")).st_mode & 07777, 01777);
	/* through a symlink: the target changes, the link does not */
	ln_s("f", it_path("l"));
	OK(sbx_chmod(c, NULL, it_path("l"), 0600, &err_));
	CHECK_EQ(lst(it_path("f")).st_mode & 07777, 0600);
	CHECK_EQ(lst(it_path("l")).st_mode & 07777, 0777);
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, it_path("nope"), 0644, &err_));
	FAILS_WITH(ENOTDIR, sbx_chmod(c, NULL, it_path("f/x"), 0644, &err_));
	FAILS_WITH(EINVAL, sbx_chmod(c, NULL, it_path("f"), 010000, &err_));
	FAILS_WITH(EINVAL, sbx_chmod(c, NULL, "f", 0644, &err_));
	ln_s("nowhere", it_path("dangling"));
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, it_path("dangling"), 0644, &err_));
	CHECK_EQ(lst(it_path("f")).st_mode & 07777, 0600);

	if (geteuid() != 0) {
		finish();
		return 0;
	}
	OK(sbx_chown(c, NULL, it_path("f"), 1234, 5678, 0, &err_));
	struct stat st = lst(it_path("f"));
	CHECK(st.st_uid == 1234 && st.st_gid == 5678);
	OK(sbx_chown(c, NULL, it_path("f"), 42, -1, 0, &err_));
	st = lst(it_path("f"));
	CHECK(st.st_uid == 42 && st.st_gid == 5678);
	OK(sbx_chown(c, NULL, it_path("f"), -1, 43, 0, &err_));
	st = lst(it_path("f"));
	CHECK(st.st_uid == 42 && st.st_gid == 43);
	/* follows a symlink by default; SBX_CHOWN_NOFOLLOW changes the link itself */
	OK(sbx_chown(c, NULL, it_path("l"), 7, 8, 0, &err_));
	CHECK(lst(it_path("f")).st_uid == 7 && lst(it_path("f")).st_gid == 8);
	CHECK(lst(it_path("l")).st_uid == 0);
	OK(sbx_chown(c, NULL, it_path("l"), 9, 10, SBX_CHOWN_NOFOLLOW, &err_));
	CHECK(lst(it_path("l")).st_uid == 9 && lst(it_path("l")).st_gid == 10);
	CHECK(lst(it_path("f")).st_uid == 7);
	OK(sbx_chown(c, NULL, it_path("dangling"), 11, 12, SBX_CHOWN_NOFOLLOW, &err_));
	CHECK(lst(it_path("dangling")).st_uid == 11);
	FAILS_WITH(ENOENT, sbx_chown(c, NULL, it_path("dangling"), 11, 12, 0, &err_));
	FAILS_WITH(ENOENT, sbx_chown(c, NULL, it_path("nope"), 1, 1, 0, &err_));
	FAILS_WITH(ENOENT, sbx_chown(c, NULL, it_path("nope"), 1, 1, SBX_CHOWN_NOFOLLOW, &err_));
	FAILS_WITH(EINVAL, sbx_chown(c, NULL, "rel", 1, 1, 0, &err_));
	/* ids that would mean "unchanged" to the kernel are refused before sending */
	struct sbx_error e;
	CHECK(sbx_chown(c, NULL, it_path("f"), (int64_t)UINT32_MAX, 1, 0, &e) < 0);
	CHECK_ERR(&e, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_chown(c, NULL, it_path("f"), 1, -2, 0, &e) < 0);
	CHECK_ERR(&e, SBX_ERR_LOCAL, EINVAL);
	finish();
	return 0;
}

/* ---- symlink, readlink, link ---- */

static int case_links(void)
{
	struct sbx_client *c = start(NULL);
	/* the target is stored byte for byte, relative, dangling, odd */
	const char *target = "../some dir/with\nnewline/ünïcode";
	OK(sbx_symlink(c, NULL, target, it_path("l"), &err_));
	char buf[PATH_MAX];
	ssize_t n = readlink(it_path("l"), buf, sizeof(buf));
	CHECK(n == (ssize_t)strlen(target) && memcmp(buf, target, (size_t)n) == 0);
	char out[128];
	struct sbx_error e;
	long len = sbx_readlink(c, NULL, it_path("l"), out, sizeof(out), &e);
	CHECKF(len == (long)strlen(target), "readlink: %ld: %s", len, it_errstr(&e));
	CHECK(strcmp(out, target) == 0);
	/* exactly enough room (the NUL included), and one byte short */
	len = sbx_readlink(c, NULL, it_path("l"), out, strlen(target) + 1, &e);
	CHECK_EQ(len, strlen(target));
	CHECK(sbx_readlink(c, NULL, it_path("l"), out, strlen(target), &e) < 0);
	CHECK_ERR(&e, SBX_ERR_LOCAL, ENAMETOOLONG);
	/* a link to a long target */
	char longt[4000];
	memset(longt, 'x', sizeof(longt) - 1);
	longt[sizeof(longt) - 1] = '\0';
	OK(sbx_symlink(c, NULL, longt, it_path("long"), &err_));
	len = sbx_readlink(c, NULL, it_path("long"), buf, sizeof(buf), &e);
	CHECK_EQ(len, sizeof(longt) - 1);
	CHECK(strcmp(buf, longt) == 0);

	put(it_path("f"), "f", 1, 0644);
	mk(it_path("d"), 0755);
	FAILS_WITH(EEXIST, sbx_symlink(c, NULL, "x", it_path("f"), &err_));
	FAILS_WITH(EEXIST, sbx_symlink(c, NULL, "x", it_path("l"), &err_));
	FAILS_WITH(ENOENT, sbx_symlink(c, NULL, "x", it_path("nope/l"), &err_));
	FAILS_WITH(ENOENT, sbx_symlink(c, NULL, "", it_path("empty-target"), &err_));
	FAILS_WITH(EINVAL, sbx_symlink(c, NULL, "x", "rel", &err_));
	FAILS_WITH(EINVAL, sbx_readlink(c, NULL, it_path("f"), out, sizeof(out), &err_));
	FAILS_WITH(EINVAL, sbx_readlink(c, NULL, it_path("d"), out, sizeof(out), &err_));
	FAILS_WITH(ENOENT, sbx_readlink(c, NULL, it_path("nope"), out, sizeof(out), &err_));
	FAILS_WITH(EINVAL, sbx_readlink(c, NULL, "rel", out, sizeof(out), &err_));

	/* hard links: the same inode, nlink counts */
	OK(sbx_link(c, NULL, it_path("f"), it_path("f2"), &err_));
	CHECK_EQ(lst(it_path("f2")).st_ino, lst(it_path("f")).st_ino);
	CHECK_EQ(lst(it_path("f")).st_nlink, 2);
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, it_path("f"), 0, &st, &err_));
	CHECK_EQ(st.nlink, 2);
	/* of a symlink: the link itself, not its target */
	OK(sbx_link(c, NULL, it_path("l"), it_path("l2"), &err_));
	CHECK(S_ISLNK(lst(it_path("l2")).st_mode));
	CHECK_EQ(lst(it_path("l2")).st_ino, lst(it_path("l")).st_ino);
	FAILS_WITH(EEXIST, sbx_link(c, NULL, it_path("f"), it_path("f2"), &err_));
	FAILS_WITH(EPERM, sbx_link(c, NULL, it_path("d"), it_path("d2"), &err_));
	FAILS_WITH(ENOENT, sbx_link(c, NULL, it_path("nope"), it_path("x"), &err_));
	FAILS_WITH(ENOENT, sbx_link(c, NULL, it_path("f"), it_path("nope/x"), &err_));
	FAILS_WITH(EINVAL, sbx_link(c, NULL, "rel", it_path("x"), &err_));
	CHECK(!lexists(it_path("x")) && !lexists(it_path("d2")));
	finish();
	return 0;
}

/* ---- truncate, set_times ---- */

static int case_truncate(void)
{
	struct sbx_client *c = start(NULL);
	put(it_path("f"), "0123456789", 10, 0640);
	OK(sbx_truncate(c, NULL, it_path("f"), 4, &err_));
	size_t len;
	char *d = slurp(it_path("f"), &len);
	CHECK(len == 4 && memcmp(d, "0123", 4) == 0);
	free(d);
	OK(sbx_truncate(c, NULL, it_path("f"), 8, &err_));
	d = slurp(it_path("f"), &len);
	CHECK(len == 8 && memcmp(d, "0123\0\0\0\0", 8) == 0);
	free(d);
	/* past 4 GiB: a hole, not written */
	OK(sbx_truncate(c, NULL, it_path("f"), 6ull << 30, &err_));
	struct stat st = lst(it_path("f"));
	CHECK_EQ(st.st_size, 6ll << 30);
	CHECK(st.st_blocks * 512 < (1 << 20));
	CHECK_EQ(st.st_mode & 07777, 0640);
	/* through a symlink */
	ln_s("f", it_path("l"));
	OK(sbx_truncate(c, NULL, it_path("l"), 0, &err_));
	CHECK_EQ(lst(it_path("f")).st_size, 0);
	CHECK(S_ISLNK(lst(it_path("l")).st_mode));

	mk(it_path("d"), 0755);
	FAILS_WITH(EISDIR, sbx_truncate(c, NULL, it_path("d"), 0, &err_));
	FAILS_WITH(ENOENT, sbx_truncate(c, NULL, it_path("nope"), 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_truncate(c, NULL, it_path("f/x"), 0, &err_));
	FAILS_WITH(EFBIG, sbx_truncate(c, NULL, it_path("f"), UINT64_MAX, &err_));
	FAILS_WITH(EINVAL, sbx_truncate(c, NULL, "rel", 0, &err_));
	CHECK(!lexists(it_path("nope")));
	finish();
	return 0;
}

static int case_times(void)
{
	mode_t old = umask(077);
	struct sbx_client *c = start(NULL);
	umask(old);
	put(it_path("f"), "f", 1, 0644);
	struct sbx_timespec a = {1234567890, 123456789}, m = {1000000000, 999999999};
	OK(sbx_set_times(c, NULL, it_path("f"), &a, &m, 0, &err_));
	struct stat st = lst(it_path("f"));
	CHECK(st.st_atim.tv_sec == 1234567890 && st.st_atim.tv_nsec == 123456789);
	CHECK(st.st_mtim.tv_sec == 1000000000 && st.st_mtim.tv_nsec == 999999999);
	struct sbx_stat ss = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, it_path("f"), 0, &ss, &err_));
	CHECK(ss.atime.sec == 1234567890 && ss.atime.nsec == 123456789);
	CHECK(ss.mtime.sec == 1000000000 && ss.mtime.nsec == 999999999);
	/* before the epoch */
	struct sbx_timespec neg = {-86400, 5};
	OK(sbx_set_times(c, NULL, it_path("f"), &neg, &neg, 0, &err_));
	CHECK(lst(it_path("f")).st_mtim.tv_sec == -86400 && lst(it_path("f")).st_mtim.tv_nsec == 5);
	/* only mtime given: atime becomes now */
	struct timespec t0, t1;
	clock_gettime(CLOCK_REALTIME, &t0);
	OK(sbx_set_times(c, NULL, it_path("f"), NULL, &m, 0, &err_));
	clock_gettime(CLOCK_REALTIME, &t1);
	st = lst(it_path("f"));
	CHECK(st.st_mtim.tv_sec == 1000000000 && st.st_mtim.tv_nsec == 999999999);
	CHECK(st.st_atim.tv_sec >= t0.tv_sec - 1 && st.st_atim.tv_sec <= t1.tv_sec + 1);
	/* both now */
	OK(sbx_set_times(c, NULL, it_path("f"), NULL, NULL, 0, &err_));
	st = lst(it_path("f"));
	CHECK(st.st_mtim.tv_sec >= t0.tv_sec - 1 && st.st_mtim.tv_sec <= t1.tv_sec + 1);
	/* a missing file is created empty, 0644 whatever the umask */
	OK(sbx_set_times(c, NULL, it_path("new"), &a, &m, 0, &err_));
	st = lst(it_path("new"));
	CHECK(S_ISREG(st.st_mode));
	CHECK_EQ(st.st_mode & 07777, 0644);
	CHECK_EQ(st.st_size, 0);
	CHECK(st.st_mtim.tv_sec == 1000000000 && st.st_mtim.tv_nsec == 999999999);
	/* ... unless asked not to */
	FAILS_WITH(ENOENT, sbx_set_times(c, NULL, it_path("new2"), NULL, NULL, SBX_TOUCH_NO_CREATE, &err_));
	CHECK(!lexists(it_path("new2")));
	/* through a symlink: the target's times */
	ln_s("f", it_path("l"));
	struct stat lb = lst(it_path("l"));
	OK(sbx_set_times(c, NULL, it_path("l"), &a, &a, 0, &err_));
	CHECK(lst(it_path("f")).st_mtim.tv_sec == 1234567890);
	CHECK_EQ(lst(it_path("l")).st_mtim.tv_sec, lb.st_mtim.tv_sec);
	/* a directory */
	mk(it_path("d"), 0755);
	OK(sbx_set_times(c, NULL, it_path("d"), &a, &m, 0, &err_));
	CHECK(lst(it_path("d")).st_mtim.tv_sec == 1000000000);

	struct sbx_timespec bad = {1, 1000000000};
	FAILS_WITH(EINVAL, sbx_set_times(c, NULL, it_path("f"), &bad, NULL, 0, &err_));
	FAILS_WITH(EINVAL, sbx_set_times(c, NULL, it_path("f"), NULL, &bad, 0, &err_));
	FAILS_WITH(ENOENT, sbx_set_times(c, NULL, it_path("nope/x"), NULL, NULL, 0, &err_));
	FAILS_WITH(ENOTDIR, sbx_set_times(c, NULL, it_path("f/x"), NULL, NULL, 0, &err_));
	FAILS_WITH(EINVAL, sbx_set_times(c, NULL, "rel", NULL, NULL, 0, &err_));
	CHECK(lst(it_path("f")).st_mtim.tv_sec == 1234567890);
	finish();
	return 0;
}

/* ---- realpath, statfs ---- */

static int case_realpath_statfs(void)
{
	struct sbx_client *c = start(NULL);
	mk(it_path("d"), 0755);
	mk(it_path("d/sub"), 0755);
	ln_s("d/sub", it_path("l"));
	char want[PATH_MAX], got[PATH_MAX];
	CHECK(realpath(it_path("d/sub"), want) != NULL);
	long n;
	OK(n = sbx_realpath(c, NULL, it_path("l/../sub/."), got, sizeof(got), &err_));
	CHECK_EQ(n, strlen(want));
	CHECKF(strcmp(got, want) == 0, "realpath %s, want %s", got, want);
	OK(sbx_realpath(c, NULL, "/", got, sizeof(got), &err_));
	CHECK(strcmp(got, "/") == 0);
	struct sbx_error e;
	CHECK(sbx_realpath(c, NULL, it_path("l"), got, 3, &e) < 0);
	CHECK_ERR(&e, SBX_ERR_LOCAL, ENAMETOOLONG);
	FAILS_WITH(ENOENT, sbx_realpath(c, NULL, it_path("nope"), got, sizeof(got), &err_));
	FAILS_WITH(EINVAL, sbx_realpath(c, NULL, "rel", got, sizeof(got), &err_));

	struct sbx_statfs sf = SBX_STATFS_INIT;
	OK(sbx_statfs(c, NULL, it_path("d"), &sf, &err_));
	struct statfs lf;
	CHECK(statfs(it_path("d"), &lf) == 0);
	CHECK_EQ(sf.fs_type, (uint64_t)lf.f_type);
	CHECK_EQ(sf.block_size, (uint64_t)lf.f_frsize);
	CHECK_EQ(sf.blocks, lf.f_blocks);
	CHECK_EQ(sf.files, lf.f_files);
	CHECK_EQ(sf.name_max, (uint64_t)lf.f_namelen);
	CHECK_EQ(sf.flags, (uint64_t)lf.f_flags & ~(uint64_t)0x20);
	CHECK(sf.blocks_available <= sf.blocks_free && sf.blocks_free <= sf.blocks);
	/* of a symlink: its target's filesystem; /proc is procfs */
	OK(sbx_statfs(c, NULL, "/proc/self", &sf, &err_));
	CHECK_EQ(sf.fs_type, 0x9fa0);
	FAILS_WITH(ENOENT, sbx_statfs(c, NULL, it_path("nope"), &sf, &err_));
	FAILS_WITH(EINVAL, sbx_statfs(c, NULL, "rel", &sf, &err_));
	finish();
	return 0;
}

/* ---- errors every operation shares ---- */

static int case_errors(void)
{
	struct sbx_client *c = start(NULL);
	/* a loop a -> b -> a */
	ln_s("b", it_path("a"));
	ln_s("a", it_path("b"));
	char buf[PATH_MAX], target[8];
	struct sbx_stat st = {.struct_size = sizeof(st), .link_target = target, .link_target_size = sizeof(target)};
	OK(sbx_stat(c, NULL, it_path("a"), 0, &st, &err_));
	CHECK_EQ(st.type, SBX_FT_SYMLINK);
	CHECK(strcmp(st.link_target, "b") == 0);
	CHECK_EQ(st.link_target_len, 1);
	FAILS_WITH(ELOOP, sbx_stat(c, NULL, it_path("a"), SBX_STAT_FOLLOW, &st, &err_));
	FAILS_WITH(ELOOP, sbx_stat(c, NULL, it_path("a/x"), 0, &st, &err_));
	FAILS_WITH(ELOOP, sbx_mkdir(c, NULL, it_path("a/x"), 0, -1, &err_));
	FAILS_WITH(ELOOP, sbx_mkdir(c, NULL, it_path("a/x"), SBX_MKDIR_PARENTS, -1, &err_));
	FAILS_WITH(ELOOP, sbx_chmod(c, NULL, it_path("a"), 0644, &err_));
	FAILS_WITH(ELOOP, sbx_chown(c, NULL, it_path("a"), 1, 1, 0, &err_));
	FAILS_WITH(ELOOP, sbx_truncate(c, NULL, it_path("a"), 0, &err_));
	FAILS_WITH(ELOOP, sbx_set_times(c, NULL, it_path("a"), NULL, NULL, 0, &err_));
	FAILS_WITH(ELOOP, sbx_realpath(c, NULL, it_path("a"), buf, sizeof(buf), &err_));
	FAILS_WITH(ELOOP, sbx_statfs(c, NULL, it_path("a"), &sf_dummy, &err_));
	FAILS_WITH(ELOOP, sbx_copy(c, NULL, it_path("a"), it_path("z"), 0, &err_));
	FAILS_WITH(ELOOP, sbx_remove(c, NULL, it_path("a/x"), 0, &err_));
	FAILS_WITH(ELOOP, sbx_rename(c, NULL, it_path("a/x"), it_path("z"), 0, &err_));
	/* the links themselves are fine to handle */
	long n;
	OK(n = sbx_readlink(c, NULL, it_path("a"), buf, sizeof(buf), &err_));
	CHECK(n == 1 && buf[0] == 'b');
	OK(sbx_copy(c, NULL, it_path("a"), it_path("a-copy"), SBX_COPY_RECURSIVE, &err_));
	CHECK(S_ISLNK(lst(it_path("a-copy")).st_mode));
	OK(sbx_remove(c, NULL, it_path("a-copy"), 0, &err_));
	CHECK(!lexists(it_path("z")));

	/* a 300-byte name component, last or in the middle */
	char name[301];
	memset(name, 'n', 300);
	name[300] = '\0';
	char lp[PATH_MAX], mp[PATH_MAX];
	SPRINTF(lp, "%s/%s", it_dir(), name);
	SPRINTF(mp, "%s/%s/x", it_dir(), name);
	put(it_path("f"), "f", 1, 0644);
	for (int i = 0; i < 2; i++) {
		const char *p = i ? mp : lp;
		FAILS_WITH(ENAMETOOLONG, sbx_stat(c, NULL, p, 0, &st, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_mkdir(c, NULL, p, 0, -1, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_mkdir(c, NULL, p, SBX_MKDIR_PARENTS, -1, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_remove(c, NULL, p, SBX_REMOVE_RECURSIVE, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_rename(c, NULL, p, it_path("z"), 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_rename(c, NULL, it_path("f"), p, 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_copy(c, NULL, p, it_path("z"), 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_copy(c, NULL, it_path("f"), p, 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_chmod(c, NULL, p, 0644, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_chown(c, NULL, p, 1, 1, SBX_CHOWN_NOFOLLOW, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_symlink(c, NULL, "t", p, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_link(c, NULL, it_path("f"), p, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_readlink(c, NULL, p, buf, sizeof(buf), &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_truncate(c, NULL, p, 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_set_times(c, NULL, p, NULL, NULL, 0, &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_realpath(c, NULL, p, buf, sizeof(buf), &err_));
		FAILS_WITH(ENAMETOOLONG, sbx_statfs(c, NULL, p, &sf_dummy, &err_));
	}
	/* a whole path over PATH_MAX */
	char *huge = malloc(6000);
	CHECK(huge != NULL);
	for (int i = 0; i < 5998; i += 2)
		memcpy(huge + i, "/d", 2);
	huge[5998] = '\0';
	FAILS_WITH(ENAMETOOLONG, sbx_mkdir(c, NULL, huge, SBX_MKDIR_PARENTS, -1, &err_));
	FAILS_WITH(ENAMETOOLONG, sbx_symlink(c, NULL, huge, it_path("hl"), &err_));
	free(huge);
	CHECK(!lexists(it_path("z")) && !lexists(it_path("hl")) && !lexists(it_path("d")));
	/* a relative path or an empty one, for each operation */
	const char *bad[] = {"rel", "", "./x"};
	for (size_t i = 0; i < 3; i++) {
		const char *p = bad[i];
		FAILS_WITH(EINVAL, sbx_mkdir(c, NULL, p, SBX_MKDIR_PARENTS, -1, &err_));
		FAILS_WITH(EINVAL, sbx_remove(c, NULL, p, 0, &err_));
		FAILS_WITH(EINVAL, sbx_rename(c, NULL, p, it_path("z"), 0, &err_));
		FAILS_WITH(EINVAL, sbx_copy(c, NULL, it_path("f"), p, 0, &err_));
		FAILS_WITH(EINVAL, sbx_chmod(c, NULL, p, 0644, &err_));
		FAILS_WITH(EINVAL, sbx_chown(c, NULL, p, 1, 1, 0, &err_));
		FAILS_WITH(EINVAL, sbx_symlink(c, NULL, "t", p, &err_));
		FAILS_WITH(EINVAL, sbx_link(c, NULL, p, it_path("z"), &err_));
		FAILS_WITH(EINVAL, sbx_readlink(c, NULL, p, buf, sizeof(buf), &err_));
		FAILS_WITH(EINVAL, sbx_truncate(c, NULL, p, 0, &err_));
		FAILS_WITH(EINVAL, sbx_set_times(c, NULL, p, NULL, NULL, 0, &err_));
		FAILS_WITH(EINVAL, sbx_realpath(c, NULL, p, buf, sizeof(buf), &err_));
		FAILS_WITH(EINVAL, sbx_statfs(c, NULL, p, &sf_dummy, &err_));
	}
	finish();
	return 0;
}

/* ---- across filesystems ---- */

static int case_xdev(void)
{
	if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
		printf("needs root and unshare(1)\n");
		return IT_SKIP;
	}
	/* The daemon runs in its own mount namespace with a 4 MiB tmpfs on t: only it
	 * sees the tmpfs, which goes away with it. */
	char t[PATH_MAX], sock[PATH_MAX]; /* it_path()'s buffers rotate */
	SPRINTF(t, "%s", it_path("t"));
	mk(t, 0755);
	SPRINTF(sock, "%s", it_path("shim.sock"));
	const char *argv[] = {"unshare",
			      "-m",
			      "--propagation",
			      "private",
			      "/bin/sh",
			      "-c",
			      "mount -t tmpfs -o size=4m tmpfs \"$0\" && exec \"$@\"",
			      t,
			      SHIM_BIN,
			      "--listen",
			      it_unix_target(sock),
			      "--state-dir",
			      it_path("state"),
			      NULL};
	it_daemon_start_argv("shim", argv);
	struct sbx_client *c = client = it_connect(it_unix_target(sock), NULL);
	struct sbx_statfs sf = SBX_STATFS_INIT;
	OK(sbx_statfs(c, NULL, t, &sf, &err_));
	CHECK_EQ(sf.fs_type, TMPFS_MAGIC);
	CHECK_EQ(sf.blocks * sf.block_size, 4 << 20);
	struct statfs lf;
	CHECK(statfs(t, &lf) == 0);
	CHECK((uint64_t)lf.f_type != TMPFS_MAGIC); /* not here: only in the daemon's namespace */

	make_tree(it_path("src"));
	struct snap s;
	snap_take(&s, it_path("src"));
	/* copy in (another filesystem: copy_file_range may refuse) and move back out */
	OK(sbx_copy(c, NULL, it_path("src"), join(t, "tree"), SBX_COPY_RECURSIVE, &err_));
	OK(sbx_rename(c, NULL, join(t, "tree"), it_path("moved"), 0, &err_));
	snap_check(&s, it_path("src"), it_path("moved"));
	CHECK_EQ(rexists(join(t, "tree")), 0);
	CHECK_EQ(count_prefix(it_dir(), ".sbx-"), 0);
	/* and the other way: the source here is removed */
	OK(sbx_rename(c, NULL, it_path("moved"), join(t, "back"), SBX_RENAME_NOREPLACE, &err_));
	CHECK(!lexists(it_path("moved")));
	OK(sbx_rename(c, NULL, join(t, "back"), it_path("moved2"), 0, &err_));
	snap_check(&s, it_path("src"), it_path("moved2"));

	/* one file, over an existing one; a symlink */
	OK(sbx_copy(c, NULL, it_path("src/big"), join(t, "f"), 0, &err_));
	put(it_path("existing"), "old", 3, 0600);
	OK(sbx_rename(c, NULL, join(t, "f"), it_path("existing"), 0, &err_));
	CHECK(same_content(it_path("src/big"), it_path("existing")));
	CHECK_EQ(lst(it_path("existing")).st_mtim.tv_nsec, 222222222);
	CHECK_EQ(rexists(join(t, "f")), 0);
	OK(sbx_symlink(c, NULL, "../x", join(t, "sl"), &err_));
	OK(sbx_rename(c, NULL, join(t, "sl"), it_path("sl"), 0, &err_));
	char buf[64];
	CHECK(readlink(it_path("sl"), buf, sizeof(buf)) == 4 && memcmp(buf, "../x", 4) == 0);

	/* failures leave both sides as they were */
	OK(sbx_copy(c, NULL, it_path("src/sub"), join(t, "sub"), SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EEXIST, sbx_rename(c, NULL, join(t, "sub"), it_path("existing"), SBX_RENAME_NOREPLACE, &err_));
	FAILS_WITH(ENOTDIR, sbx_rename(c, NULL, join(t, "sub"), it_path("existing"), 0, &err_));
	mk(it_path("full"), 0755);
	put(it_path("full/x"), "x", 1, 0644);
	FAILS_WITH(ENOTEMPTY, sbx_rename(c, NULL, join(t, "sub"), it_path("full"), 0, &err_));
	CHECK_EQ(count_entries(it_path("full")), 1);
	CHECK_EQ(count_prefix(it_dir(), ".sbx-"), 0);
	CHECK_EQ(rexists(join(t, "sub/deeper/suid")), 1);
	/* no room: the partial copy is removed (the tmpfs is as free as before) */
	struct sbx_statfs before = SBX_STATFS_INIT, after = SBX_STATFS_INIT;
	OK(sbx_statfs(c, NULL, t, &before, &err_));
	uint8_t *big = malloc(5 << 20);
	CHECK(big != NULL);
	it_fill(big, 5 << 20, 3);
	put(it_path("toobig"), big, 5 << 20, 0644);
	free(big);
	FAILS_WITH(ENOSPC, sbx_copy(c, NULL, it_path("toobig"), join(t, "toobig"), 0, &err_));
	FAILS_WITH(ENOSPC, sbx_rename(c, NULL, it_path("toobig"), join(t, "toobig"), 0, &err_));
	CHECK(lexists(it_path("toobig")));
	OK(sbx_statfs(c, NULL, t, &after, &err_));
	CHECK_EQ(after.blocks_free, before.blocks_free);
	CHECK_EQ(after.files_free, before.files_free);
	CHECK_EQ(rexists(join(t, "toobig")), 0);
	finish();
	return 0;
}

/* ---- --root confinement ---- */

struct outside {
	struct stat dir, victim, parent;
	char content[16];
};

static void outside_take(struct outside *o)
{
	o->dir = lst(it_dir());
	o->victim = lst(it_path("victim"));
	char parent[PATH_MAX];
	SPRINTF(parent, "%s/..", it_dir());
	o->parent = lst(parent);
	size_t len;
	char *d = slurp(it_path("victim"), &len);
	CHECK(len < sizeof(o->content));
	memcpy(o->content, d, len);
	o->content[len] = '\0';
	free(d);
}

static void same_stat(const struct stat *a, const struct stat *b, const char *what)
{
	CHECKF(a->st_ino == b->st_ino && a->st_mode == b->st_mode && a->st_uid == b->st_uid && a->st_gid == b->st_gid &&
		       a->st_size == b->st_size && a->st_nlink == b->st_nlink &&
		       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
		       a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec,
	       "%s changed", what);
}

static int case_root(void)
{
	/* R holds esc -> / and up -> ../..; outside R (in the case's dir) a victim
	 * file that nothing may touch */
	char R[PATH_MAX];
	SPRINTF(R, "%s", it_path("root"));
	mk(R, 0755);
	mk(join(R, "tmp"), 0755);
	ln_s("/", join(R, "esc"));
	ln_s("../..", join(R, "up"));
	put(it_path("victim"), "precious", 8, 0644);
	char unique[64];
	SPRINTF(unique, "sbx-it-esc-%d", (int)getpid());
	char host_tmp[PATH_MAX];
	SPRINTF(host_tmp, "/tmp/%s", unique);
	CHECK(!lexists(host_tmp));
	/* it_dir() as seen from inside R */
	char vin[PATH_MAX], din[PATH_MAX];
	SPRINTF(din, "/esc%s", it_dir());
	SPRINTF(vin, "/esc%s/victim", it_dir());

	struct sbx_client *c = start(R);
	struct outside o1, o2;
	outside_take(&o1);
	struct stat rst = lst(R);

	/* stat: the links resolve to R itself */
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, "/esc", 0, &st, &err_));
	CHECK_EQ(st.type, SBX_FT_SYMLINK);
	OK(sbx_stat(c, NULL, "/esc", SBX_STAT_FOLLOW, &st, &err_));
	CHECK_EQ(st.inode, rst.st_ino);
	OK(sbx_stat(c, NULL, "/up", SBX_STAT_FOLLOW, &st, &err_));
	CHECK_EQ(st.inode, rst.st_ino);
	OK(sbx_stat(c, NULL, "/..", 0, &st, &err_));
	CHECK_EQ(st.inode, rst.st_ino);
	OK(sbx_stat(c, NULL, "/tmp/../..", 0, &st, &err_));
	CHECK_EQ(st.inode, rst.st_ino);
	OK(sbx_stat(c, NULL, "/esc/up/esc/..", 0, &st, &err_));
	CHECK_EQ(st.inode, rst.st_ino);
	FAILS_WITH(ENOENT, sbx_stat(c, NULL, vin, 0, &st, &err_));
	FAILS_WITH(ENOENT, sbx_stat(c, NULL, "/up/victim", SBX_STAT_FOLLOW, &st, &err_));
	/* readlink gives the target as stored */
	char buf[PATH_MAX];
	OK(sbx_readlink(c, NULL, "/esc", buf, sizeof(buf), &err_));
	CHECK(strcmp(buf, "/") == 0);
	OK(sbx_readlink(c, NULL, "/up", buf, sizeof(buf), &err_));
	CHECK(strcmp(buf, "../..") == 0);
	/* realpath: as the client sees it */
	OK(sbx_realpath(c, NULL, "/esc/tmp", buf, sizeof(buf), &err_));
	CHECK(strcmp(buf, "/tmp") == 0);
	OK(sbx_realpath(c, NULL, "/up/up/..", buf, sizeof(buf), &err_));
	CHECK(strcmp(buf, "/") == 0);

	/* mkdir through the links lands in R */
	char p[PATH_MAX];
	SPRINTF(p, "/esc/tmp/%s", unique);
	OK(sbx_mkdir(c, NULL, p, 0, -1, &err_));
	CHECK(S_ISDIR(lst(join(join(R, "tmp"), unique)).st_mode));
	CHECK(!lexists(host_tmp));
	SPRINTF(p, "/up/up/tmp/%s/a/b", unique);
	OK(sbx_mkdir(c, NULL, p, SBX_MKDIR_PARENTS, -1, &err_));
	CHECK(lexists(join(join(join(R, "tmp"), unique), "a/b")));
	CHECK(!lexists(host_tmp));
	OK(sbx_mkdir(c, NULL, "/esc/made-here", 0, -1, &err_));
	CHECK(lexists(join(R, "made-here")));
	FAILS_WITH(EEXIST, sbx_mkdir(c, NULL, "/..", 0, -1, &err_));
	FAILS_WITH(ENOENT, sbx_mkdir(c, NULL, join(din, "newdir"), 0, -1, &err_));
	CHECK(!lexists(it_path("newdir")));

	/* symlink, link, touch, truncate, chmod, chown through the links */
	OK(sbx_symlink(c, NULL, "/etc/passwd", "/esc/tmp/sl", &err_));
	CHECK(S_ISLNK(lst(join(R, "tmp/sl")).st_mode));
	FAILS_WITH(ENOENT, sbx_symlink(c, NULL, "x", join(din, "sl"), &err_));
	FAILS_WITH(ENOENT, sbx_link(c, NULL, vin, "/hl", &err_));
	FAILS_WITH(ENOENT, sbx_link(c, NULL, "/up/victim", "/hl", &err_));
	OK(sbx_set_times(c, NULL, "/esc/touched", NULL, NULL, 0, &err_));
	CHECK(lexists(join(R, "touched")));
	CHECK(!lexists("/touched"));
	FAILS_WITH(ENOENT, sbx_set_times(c, NULL, vin, NULL, NULL, 0, &err_));
	FAILS_WITH(ENOENT, sbx_set_times(c, NULL, "/up/victim", NULL, NULL, SBX_TOUCH_NO_CREATE, &err_));
	FAILS_WITH(ENOENT, sbx_truncate(c, NULL, vin, 0, &err_));
	FAILS_WITH(ENOENT, sbx_truncate(c, NULL, "/up/victim", 0, &err_));
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, vin, 0777, &err_));
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, "/up/up/victim", 0777, &err_));
	FAILS_WITH(ENOENT, sbx_chown(c, NULL, vin, 4321, 4321, 0, &err_));
	FAILS_WITH(ENOENT, sbx_chown(c, NULL, vin, 4321, 4321, SBX_CHOWN_NOFOLLOW, &err_));
	/* a symlink inside R to an absolute path: chmod follows it within R */
	OK(sbx_symlink(c, NULL, it_dir(), "/abs", &err_));
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, "/abs/victim", 0777, &err_));
	FAILS_WITH(ENOENT, sbx_chmod(c, NULL, "/abs", 0777, &err_));
	/* "/.." is R itself, never its parent */
	struct sbx_timespec when = {1111111111, 1};
	OK(sbx_set_times(c, NULL, "/..", &when, &when, 0, &err_));
	CHECK_EQ(lst(R).st_mtim.tv_sec, 1111111111);
	if (geteuid() == 0) {
		OK(sbx_chown(c, NULL, "/..", 4321, 4321, SBX_CHOWN_NOFOLLOW, &err_));
		CHECK_EQ(lst(R).st_uid, 4321);
		OK(sbx_chown(c, NULL, "/tmp/../..", 0, 0, SBX_CHOWN_NOFOLLOW, &err_));
		CHECK_EQ(lst(R).st_uid, 0);
	}
	OK(sbx_chmod(c, NULL, "/esc/..", 0751, &err_));
	CHECK_EQ(lst(R).st_mode & 07777, 0751);

	/* copy and rename: reading or writing outside is impossible */
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, vin, "/stolen", 0, &err_));
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, "/up/victim", "/stolen", 0, &err_));
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, "/abs/victim", "/stolen", 0, &err_));
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, "/esc/etc/hostname", "/stolen", 0, &err_));
	CHECK(!lexists(join(R, "stolen")));
	put(join(R, "tmp/inside"), "inside", 6, 0644);
	OK(sbx_copy(c, NULL, "/up/tmp/inside", "/esc/esc/copied", 0, &err_));
	CHECK(same_content(join(R, "tmp/inside"), join(R, "copied")));
	FAILS_WITH(ENOENT, sbx_copy(c, NULL, "/tmp/inside", join(din, "planted"), 0, &err_));
	CHECK(!lexists(it_path("planted")));
	OK(sbx_copy(c, NULL, "/tmp", "/tmp2", SBX_COPY_RECURSIVE, &err_));
	CHECK(S_ISLNK(lst(join(R, "tmp2/sl")).st_mode));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, "/tmp", "/esc/tmp/x", SBX_COPY_RECURSIVE, &err_));
	FAILS_WITH(EINVAL, sbx_copy(c, NULL, "/", "/tmp/whole", SBX_COPY_RECURSIVE, &err_));
	/* the root's symlinks are copied as links (recursive), never followed out */
	OK(sbx_copy(c, NULL, "/esc", "/esc-copy", SBX_COPY_RECURSIVE, &err_));
	CHECK(S_ISLNK(lst(join(R, "esc-copy")).st_mode));
	FAILS_WITH(ENOENT, sbx_rename(c, NULL, vin, "/moved", 0, &err_));
	FAILS_WITH(ENOENT, sbx_rename(c, NULL, "/up/victim", "/moved", 0, &err_));
	FAILS_WITH(ENOENT, sbx_rename(c, NULL, "/tmp/inside", join(din, "moved"), 0, &err_));
	OK(sbx_rename(c, NULL, "/esc/tmp/inside", "/up/moved", 0, &err_));
	CHECK(lexists(join(R, "moved")));
	FAILS_WITH(EBUSY, sbx_rename(c, NULL, "/", "/x", 0, &err_));

	/* remove: never the root, never outside */
	FAILS_WITH(EBUSY, sbx_remove(c, NULL, "/", SBX_REMOVE_RECURSIVE, &err_));
	FAILS_WITH(EBUSY, sbx_remove(c, NULL, "/..", SBX_REMOVE_RECURSIVE, &err_));
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, vin, 0, &err_));
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, "/up/victim", 0, &err_));
	FAILS_WITH(ENOENT, sbx_remove(c, NULL, din, SBX_REMOVE_RECURSIVE, &err_));
	SPRINTF(p, "/esc/tmp/%s", unique);
	OK(sbx_remove(c, NULL, p, SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(join(join(R, "tmp"), unique)));
	/* a recursive remove of a tree holding the escaping links removes the links */
	OK(sbx_mkdir(c, NULL, "/t", 0, -1, &err_));
	OK(sbx_symlink(c, NULL, "/", "/t/esc", &err_));
	OK(sbx_symlink(c, NULL, "../../..", "/t/up", &err_));
	OK(sbx_remove(c, NULL, "/t", SBX_REMOVE_RECURSIVE, &err_));
	CHECK(!lexists(join(R, "t")));
	CHECK(lexists(join(R, "tmp2")) && lexists(join(R, "esc")));

	/* statfs through the link: R's filesystem */
	struct sbx_statfs sf = SBX_STATFS_INIT;
	OK(sbx_statfs(c, NULL, "/esc", &sf, &err_));
	struct statfs lf;
	CHECK(statfs(R, &lf) == 0);
	CHECK_EQ(sf.fs_type, (uint64_t)lf.f_type);

	/* nothing outside R changed */
	outside_take(&o2);
	same_stat(&o1.victim, &o2.victim, "the victim");
	CHECK(strcmp(o1.content, "precious") == 0 && strcmp(o2.content, "precious") == 0);
	/* the parent (shared with other tests): its owner and mode, and no names
	 * of ours at the real / */
	CHECK(o1.parent.st_ino == o2.parent.st_ino && o1.parent.st_mode == o2.parent.st_mode &&
	      o1.parent.st_uid == o2.parent.st_uid && o1.parent.st_gid == o2.parent.st_gid);
	const char *ours[] = {"made-here", "touched",  "stolen", "copied", "moved",
			      "tmp2",      "esc-copy", "abs",    "hl",     "t"};
	for (size_t i = 0; i < ARRAY_LEN(ours); i++) {
		char top[64];
		SPRINTF(top, "/%s", ours[i]);
		CHECKF(!lexists(top) || strcmp(ours[i], "t") == 0, "%s exists", top);
	}
	CHECK(!lexists(host_tmp));
	CHECK(!lexists(it_path("newdir")) && !lexists(it_path("planted")) && !lexists(it_path("moved")) &&
	      !lexists(it_path("sl")) && !lexists(it_path("tmp")));
	/* the case dir itself: only what the harness put there (socket, logs, state) */
	CHECK_EQ(o2.dir.st_ino, o1.dir.st_ino);
	CHECK_EQ(o2.dir.st_mode, o1.dir.st_mode);
	CHECK_EQ(o2.dir.st_uid, o1.dir.st_uid);
	CHECK(o2.dir.st_mtim.tv_sec == o1.dir.st_mtim.tv_sec && o2.dir.st_mtim.tv_nsec == o1.dir.st_mtim.tv_nsec);
	finish();
	return 0;
}

/* ---- cancel ---- */

struct canceller {
	struct sbx_cancel *tok;
	uint64_t fired_at;
};

/* Fire the token once the copy is under way: its temp file has appeared. */
static void *cancel_when_copying(void *arg)
{
	struct canceller *k = arg;
	uint64_t deadline = it_now_ms() + 20000;
	while (count_prefix(it_dir(), ".sbx-copy-") == 0 && it_now_ms() < deadline)
		it_sleep_ms(1);
	k->fired_at = it_now_ms();
	sbx_cancel_fire(k->tok);
	return NULL;
}

static int case_cancel(void)
{
	struct sbx_client *c = start(NULL);
	/* 2 GiB of allocated (not sparse) blocks: seconds of copying */
	int fd = open(it_path("big"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	if (fallocate(fd, 0, 0, (off_t)2 << 30) < 0) {
		printf("fallocate: %s\n", strerror(errno));
		close(fd);
		finish();
		return IT_SKIP;
	}
	close(fd);
	struct canceller k = {.tok = sbx_cancel_new()};
	CHECK(k.tok != NULL);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, cancel_when_copying, &k) == 0);
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = k.tok};
	struct sbx_error e;
	int rc = sbx_copy(c, &opts, it_path("big"), it_path("copy"), 0, &e);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(rc, -1);
	CHECK_ERR(&e, SBX_ERR_LOCAL, ECANCELED);
	/* the copy stops too, and takes its temp file with it: dst never appears */
	uint64_t t0 = it_now_ms();
	while (count_prefix(it_dir(), ".sbx-copy-") > 0) {
		CHECKF(it_now_ms() - t0 < 10000, "the cancelled copy goes on");
		it_sleep_ms(5);
	}
	printf("temp file gone %llu ms after the cancel\n", (unsigned long long)(it_now_ms() - k.fired_at));
	it_sleep_ms(200);
	CHECK(!lexists(it_path("copy")));
	CHECK_EQ(count_prefix(it_dir(), ".sbx-copy-"), 0);
	/* the client and the daemon go on */
	OK(sbx_copy(c, NULL, it_path("shim.log"), it_path("log-copy"), 0, &err_));
	sbx_cancel_free(k.tok);
	finish();
	return 0;
}

static const struct it_case cases[] = {
	{"mkdir", case_mkdir},         {"remove", case_remove},
	{"rename", case_rename},       {"copy_file", case_copy_file},
	{"copy_tree", case_copy_tree}, {"chmod_chown", case_chmod_chown},
	{"links", case_links},         {"truncate", case_truncate},
	{"times", case_times},         {"realpath_statfs", case_realpath_statfs},
	{"errors", case_errors},       {"xdev", case_xdev},
	{"root", case_root},           {"cancel", case_cancel},
};

int main(int argc, char **argv)
{
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
