/* it_backup.c: directory backups and restores through the real daemon: round trips, GNU tar both ways,
 * malicious archives, excludes, mounts, permissions, cancels, disconnects and crashes. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024u
#define MiB (1024u * 1024u)
#define GiB (1024ull * MiB)

#define SPRINTF(buf, ...) CHECK(snprintf(buf, sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

static struct sbx_client *client;
static struct it_daemon *daemon1;
static char sock[PATH_MAX];
static char state[PATH_MAX];

/* A daemon with its state dir in the case's temp dir, and a client. */
static struct sbx_client *start(void)
{
	SPRINTF(sock, "%s", it_path("shim.sock"));
	SPRINTF(state, "%s", it_path("state"));
	daemon1 = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", state, NULL);
	client = it_connect(it_unix_target(sock), NULL);
	return client;
}

/* it_path() that stays valid for the whole case (it_path() rotates 8 buffers). */
static const char *kp(const char *name)
{
	static char ring[64][PATH_MAX];
	static unsigned next;
	char *b = ring[next++ % 64];
	snprintf(b, PATH_MAX, "%s", it_path(name));
	return b;
}

static char *pjoin(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = malloc(n);
	CHECK(p != NULL);
	snprintf(p, n, "%s/%s", a, b);
	return p;
}

/* ---- local files ---- */

static void mk(const char *path, mode_t mode)
{
	CHECKF(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	CHECK(chmod(path, mode) == 0);
}

static void put(const char *path, const void *data, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "create %s: %s", path, strerror(errno));
	CHECK(len == 0 || write(fd, data, len) == (ssize_t)len);
	CHECK(fchmod(fd, mode) == 0);
	close(fd);
}

static void set_times(const char *path, time_t asec, long ansec, time_t msec, long mnsec)
{
	struct timespec ts[2] = {{asec, ansec}, {msec, mnsec}};
	CHECKF(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) == 0, "utimensat %s: %s", path, strerror(errno));
}

static int lexists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

/* Run a shell command; returns its exit status (or -1). */
static int shell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int shell(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	CHECK(n > 0 && (size_t)n < sizeof(cmd));
	int st = system(cmd);
	return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool have(const char *prog)
{
	return shell("command -v %s >/dev/null 2>&1", prog) == 0;
}

static bool xattrs_work(const char *dir)
{
	char *p = pjoin(dir, ".xattr-probe");
	put(p, "", 0, 0644);
	bool ok = setxattr(p, "user.probe", "1", 1, 0) == 0;
	unlink(p);
	free(p);
	return ok;
}

/* Names in a directory that look like our temp files or directories. */
static int count_temps(const char *dir)
{
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strstr(e->d_name, ".sbx-") != NULL)
			n++;
	closedir(d);
	return n;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void wait_temps(const char *dir, int want, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	while (count_temps(dir) != want) {
		CHECKF(it_now_ms() < end, "%d temp entries in %s, want %d", count_temps(dir), dir, want);
		it_sleep_ms(5);
	}
}

/* The pending-writes journal empties (a job cleans up after its temp files go). No
 * journal directory at all (-1) is empty too: a restore cut off before its first file
 * never made one. */
static void wait_journal_empty(unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	while (it_journal_pending(it_path("state/pending-writes")) > 0) {
		CHECKF(it_now_ms() < end, "journal entries left in %s", it_path("state/pending-writes"));
		it_sleep_ms(5);
	}
}

/* sha256 of a local file with sha256sum(1), as 64 hex digits. */
static void file_sha(const char *path, char out[65])
{
	char cmd[PATH_MAX + 64];
	SPRINTF(cmd, "sha256sum < '%s'", path);
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL);
	CHECK(fscanf(f, "%64s", out) == 1);
	pclose(f);
}

/* ---- tree snapshots ---- */

struct node {
	char *rel; /* "" for the root */
	struct stat st;
	char *target;
	char *xattrs; /* "name=hex;..." sorted */
};

struct snap {
	char root[PATH_MAX];
	struct node *v;
	size_t n, cap;
};

static int node_cmp(const void *a, const void *b)
{
	return strcmp(((const struct node *)a)->rel, ((const struct node *)b)->rel);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *read_xattrs(const char *path)
{
	char list[4096];
	ssize_t n = llistxattr(path, list, sizeof(list));
	if (n <= 0)
		return strdup("");
	char *names[64];
	size_t k = 0;
	for (ssize_t off = 0; off < n && k < 64; off += (ssize_t)strlen(list + off) + 1)
		names[k++] = list + off;
	qsort(names, k, sizeof(names[0]), str_cmp);
	size_t cap = 32768, len = 0;
	char *out = malloc(cap);
	CHECK(out != NULL);
	out[0] = '\0';
	for (size_t i = 0; i < k; i++) {
		uint8_t val[4096];
		ssize_t v = lgetxattr(path, names[i], val, sizeof(val));
		CHECK(v >= 0);
		len += (size_t)snprintf(out + len, cap - len, "%s=", names[i]);
		for (ssize_t j = 0; j < v; j++)
			len += (size_t)snprintf(out + len, cap - len, "%02x", val[j]);
		len += (size_t)snprintf(out + len, cap - len, ";");
		CHECK(len < cap);
	}
	return out;
}

static void snap_add(struct snap *s, const char *rel)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 64;
		s->v = realloc(s->v, s->cap * sizeof(*s->v));
		CHECK(s->v != NULL);
	}
	char *path = rel[0] ? pjoin(s->root, rel) : strdup(s->root);
	struct node *nd = &s->v[s->n++];
	memset(nd, 0, sizeof(*nd));
	nd->rel = strdup(rel);
	CHECKF(lstat(path, &nd->st) == 0, "lstat %s: %s", path, strerror(errno));
	if (S_ISLNK(nd->st.st_mode)) {
		char t[PATH_MAX];
		ssize_t n = readlink(path, t, sizeof(t) - 1);
		CHECK(n >= 0);
		t[n] = '\0';
		nd->target = strdup(t);
	}
	nd->xattrs = read_xattrs(path);
	struct stat st = nd->st;
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		CHECKF(d != NULL, "opendir %s: %s", path, strerror(errno));
		struct dirent *e;
		while ((e = readdir(d)) != NULL) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			char *sub = rel[0] ? pjoin(rel, e->d_name) : strdup(e->d_name);
			snap_add(s, sub);
			free(sub);
		}
		closedir(d);
	}
	free(path);
}

/* Every entry below root (sockets left out: tar cannot hold them). */
static void snap_take(struct snap *s, const char *root)
{
	memset(s, 0, sizeof(*s));
	SPRINTF(s->root, "%s", root);
	snap_add(s, "");
	size_t k = 0;
	for (size_t i = 0; i < s->n; i++) {
		if (S_ISSOCK(s->v[i].st.st_mode)) {
			free(s->v[i].rel);
			free(s->v[i].target);
			free(s->v[i].xattrs);
			continue;
		}
		s->v[k++] = s->v[i];
	}
	s->n = k;
	qsort(s->v, s->n, sizeof(*s->v), node_cmp);
}

static void snap_free(struct snap *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->v[i].rel);
		free(s->v[i].target);
		free(s->v[i].xattrs);
	}
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* Data regions of a (sparse) file compared, and the copy no less sparse. */
static void same_content(const char *pa, const char *pb, const struct stat *st)
{
	/* O_NOATIME: comparing must not change what the next comparison sees */
	int a = open(pa, O_RDONLY | O_CLOEXEC | O_NOATIME), b = open(pb, O_RDONLY | O_CLOEXEC | O_NOATIME);
	if (a < 0)
		a = open(pa, O_RDONLY | O_CLOEXEC);
	if (b < 0)
		b = open(pb, O_RDONLY | O_CLOEXEC);
	CHECKF(a >= 0 && b >= 0, "open %s / %s", pa, pb);
	static uint8_t ba[1 << 20], bb[1 << 20];
	off_t pos = 0;
	bool sparse = (uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size;
	while (pos < st->st_size) {
		off_t d = pos, h = st->st_size;
		if (sparse) {
			d = lseek(a, pos, SEEK_DATA);
			if (d < 0)
				break;
			h = lseek(a, d, SEEK_HOLE);
		}
		for (off_t o = d; o < h;) {
			size_t want = (size_t)(h - o < (off_t)sizeof(ba) ? h - o : (off_t)sizeof(ba));
			CHECK(pread(a, ba, want, o) == (ssize_t)want);
			CHECKF(pread(b, bb, want, o) == (ssize_t)want, "short read of %s", pb);
			CHECKF(memcmp(ba, bb, want) == 0, "%s and %s differ near offset %lld", pa, pb, (long long)o);
			o += (off_t)want;
		}
		pos = h;
	}
	if (sparse) {
		struct stat sb;
		CHECK(fstat(b, &sb) == 0);
		CHECKF(sb.st_blocks <= st->st_blocks + 2048, "%s is not sparse any more (%lld blocks, was %lld)", pb,
		       (long long)sb.st_blocks, (long long)st->st_blocks);
	}
	close(a);
	close(b);
}

enum {
	CMP_NSEC = 1,     /* mtime with nanoseconds (else seconds) */
	CMP_ATIME = 2,    /* atime of regular files */
	CMP_OWNER = 4,    /* uid and gid */
	CMP_XATTR = 8,    /* extended attributes */
	CMP_DIRMODE = 16, /* the root directory's mode and mtime too */
	CMP_ALL = 31,
	/* a tree restored from an archive: atimes are not archived (as by GNU tar and
	 * bsdtar: each would cost every member a pax header) */
	CMP_RESTORED = CMP_ALL & ~CMP_ATIME,
};

/* The restored tree b is the tree a was: type, mode, owner, times, content, link
 * targets, xattrs and hard-link identity. */
static void snap_compare(const struct snap *a, const struct snap *b, unsigned flags)
{
	size_t i = 0, j = 0;
	while (i < a->n || j < b->n) {
		int c = i >= a->n ? 1 : j >= b->n ? -1 : strcmp(a->v[i].rel, b->v[j].rel);
		CHECKF(c >= 0, "'%s' missing from the restored tree", a->v[i].rel);
		CHECKF(c <= 0, "'%s' in the restored tree only", b->v[j].rel);
		const struct node *x = &a->v[i++], *y = &b->v[j++];
		const char *r = x->rel[0] ? x->rel : ".";
		bool root = x->rel[0] == '\0';
		CHECKF((x->st.st_mode & S_IFMT) == (y->st.st_mode & S_IFMT), "%s: type %o, was %o", r,
		       y->st.st_mode & S_IFMT, x->st.st_mode & S_IFMT);
		if (!root || (flags & CMP_DIRMODE)) {
			CHECKF((x->st.st_mode & 07777) == (y->st.st_mode & 07777), "%s: mode %o, was %o", r,
			       y->st.st_mode & 07777, x->st.st_mode & 07777);
			if (!S_ISLNK(x->st.st_mode)) {
				CHECKF(x->st.st_mtim.tv_sec == y->st.st_mtim.tv_sec, "%s: mtime %lld, was %lld", r,
				       (long long)y->st.st_mtim.tv_sec, (long long)x->st.st_mtim.tv_sec);
				if (flags & CMP_NSEC)
					CHECKF(x->st.st_mtim.tv_nsec == y->st.st_mtim.tv_nsec,
					       "%s: mtime ns %ld, was %ld", r, y->st.st_mtim.tv_nsec,
					       x->st.st_mtim.tv_nsec);
			}
		}
		if ((flags & CMP_ATIME) && S_ISREG(x->st.st_mode))
			CHECKF(x->st.st_atim.tv_sec == y->st.st_atim.tv_sec &&
				       x->st.st_atim.tv_nsec == y->st.st_atim.tv_nsec,
			       "%s in %s: atime %lld.%09ld, was %lld.%09ld", r, b->root,
			       (long long)y->st.st_atim.tv_sec, y->st.st_atim.tv_nsec, (long long)x->st.st_atim.tv_sec,
			       x->st.st_atim.tv_nsec);
		if ((flags & CMP_OWNER) && (!root || (flags & CMP_DIRMODE)))
			CHECKF(x->st.st_uid == y->st.st_uid && x->st.st_gid == y->st.st_gid,
			       "%s: owner %u:%u, was %u:%u", r, y->st.st_uid, y->st.st_gid, x->st.st_uid, x->st.st_gid);
		if (S_ISREG(x->st.st_mode)) {
			CHECKF(x->st.st_size == y->st.st_size, "%s: size %lld, was %lld", r, (long long)y->st.st_size,
			       (long long)x->st.st_size);
			CHECKF(x->st.st_nlink == y->st.st_nlink, "%s: %lu links, was %lu", r,
			       (unsigned long)y->st.st_nlink, (unsigned long)x->st.st_nlink);
		}
		if (S_ISLNK(x->st.st_mode))
			CHECKF(strcmp(x->target, y->target) == 0, "%s: target '%s', was '%s'", r, y->target, x->target);
		if (S_ISCHR(x->st.st_mode) || S_ISBLK(x->st.st_mode))
			CHECKF(x->st.st_rdev == y->st.st_rdev, "%s: rdev differs", r);
		if ((flags & CMP_XATTR) && !root)
			CHECKF(strcmp(x->xattrs, y->xattrs) == 0, "%s: xattrs '%s', were '%s'", r, y->xattrs,
			       x->xattrs);
	}
	/* hard links: the same inode in one tree if and only if in the other */
	for (i = 0; i < a->n; i++) {
		if (S_ISDIR(a->v[i].st.st_mode) || a->v[i].st.st_nlink < 2)
			continue;
		for (j = i + 1; j < a->n; j++) {
			bool sa = a->v[j].st.st_ino == a->v[i].st.st_ino && a->v[j].st.st_dev == a->v[i].st.st_dev;
			bool sb = b->v[j].st.st_ino == b->v[i].st.st_ino;
			CHECKF(sa == sb, "%s and %s: hard-linked %s", a->v[i].rel, a->v[j].rel,
			       sa ? "before, not after" : "after, not before");
		}
	}
	/* contents last: reading them changes atimes */
	for (i = 0; i < a->n; i++) {
		if (!S_ISREG(a->v[i].st.st_mode))
			continue;
		char *pa = pjoin(a->root, a->v[i].rel), *pb = pjoin(b->root, b->v[i].rel);
		same_content(pa, pb, &a->v[i].st);
		free(pa);
		free(pb);
	}
}

/* ---- the test tree ---- */

#define SPARSE_SIZE GiB
#define DEEP 40

/* Every kind of entry: files (empty, small, 1 GiB sparse, set-id), directories
 * (empty, sticky, set-gid, 40 levels deep), symlinks, hard links (also to a
 * symlink), a FIFO, devices (as root), a socket (left out), names with a newline,
 * UTF-8 and invalid UTF-8, xattrs, owners, times with nanoseconds. */
static void make_tree(const char *t, bool devices, bool xattrs, bool odd_names)
{
	mk(t, 0750);
	char *p;
#define P(name) (free(p), p = pjoin(t, name))
	p = NULL;
	P("empty");
	put(p, "", 0, 0640);
	P("small");
	put(p, "hello\n", 6, 0644);
	P("exec");
	put(p, "#!/bin/sh\necho hi\n", 18, 0755);
	P("setuid");
	put(p, "s", 1, 04755);
	P("setgid");
	put(p, "g", 1, 02711);
	P("nomode");
	put(p, "0", 1, 0);
	P("big");
	{
		size_t n = 3 * MiB + 123;
		uint8_t *buf = malloc(n);
		CHECK(buf != NULL);
		it_fill(buf, n, 42);
		put(p, buf, n, 0600);
		free(buf);
	}
	P("sparse");
	{
		int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		CHECK(fd >= 0);
		CHECK(ftruncate(fd, (off_t)SPARSE_SIZE) == 0);
		CHECK(pwrite(fd, "start", 5, 0) == 5);
		CHECK(pwrite(fd, "middle", 6, (off_t)(SPARSE_SIZE / 2)) == 6);
		CHECK(pwrite(fd, "end", 3, (off_t)SPARSE_SIZE - 3) == 3);
		close(fd);
	}
	P("holes_only");
	{
		int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		CHECK(fd >= 0 && ftruncate(fd, 64 * MiB) == 0);
		close(fd);
	}
	P("emptydir");
	mk(p, 0700);
	P("sticky");
	mk(p, 01777);
	P("sgid");
	mk(p, 02775);
	P("sub");
	mk(p, 0755);
	P("sub/file");
	put(p, "in sub", 6, 0644);
	{
		char *a = pjoin(t, "small"), *b = pjoin(t, "h2"), *c = pjoin(t, "sub/h3");
		CHECK(link(a, b) == 0 && link(a, c) == 0);
		free(a);
		free(b);
		free(c);
	}
	P("rel_link");
	CHECK(symlink("sub/file", p) == 0);
	P("abs_link");
	CHECK(symlink("/etc/passwd", p) == 0);
	P("dangling");
	CHECK(symlink("../nowhere/at all", p) == 0);
	P("dir_link");
	CHECK(symlink("sub", p) == 0);
	{
		/* a hard link to a symlink */
		char *a = pjoin(t, "rel_link"), *b = pjoin(t, "sub/link_to_link");
		CHECK(linkat(AT_FDCWD, a, AT_FDCWD, b, 0) == 0);
		free(a);
		free(b);
	}
	P("fifo");
	CHECK(mkfifo(p, 0620) == 0);
	if (devices) {
		P("null");
		CHECK(mknod(p, S_IFCHR | 0666, makedev(1, 3)) == 0);
		P("loopdev");
		CHECK(mknod(p, S_IFBLK | 0600, makedev(7, 200)) == 0);
	}
	P("sock");
	{
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		if (strlen(p) < sizeof(sa.sun_path)) {
			strcpy(sa.sun_path, p);
			CHECK(bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
		}
		close(s);
	}
	if (odd_names) {
		P("new\nline");
		put(p, "nl", 2, 0644);
		P("caf\xc3\xa9 \xe2\x82\xac");
		put(p, "utf8", 4, 0644);
		P("bad\xff\xfe name");
		put(p, "latin1", 6, 0644);
		P("dir\nwith\xff");
		mk(p, 0755);
		P("dir\nwith\xff/inner\x80");
		put(p, "inner", 5, 0644);
	}
	{
		char name[256];
		memset(name, 'L', 200);
		name[200] = '\0';
		P(name);
		put(p, "long", 4, 0644);
	}
	/* deeper than the walker keeps open: its levels are opened again on the way up */
	{
		char rel[DEEP * 4 + 16] = "";
		for (int i = 0; i < DEEP; i++) {
			char comp[8];
			snprintf(comp, sizeof(comp), "%sd%02d", i ? "/" : "", i);
			strcat(rel, comp);
			P(rel);
			mk(p, 0755);
			char f[DEEP * 4 + 32];
			snprintf(f, sizeof(f), "%s/f", rel);
			P(f);
			put(p, f, strlen(f), 0644);
		}
		P("d00/zz_after");
		put(p, "after", 5, 0644);
	}
	if (xattrs) {
		P("small");
		CHECK(setxattr(p, "user.text", "value", 5, 0) == 0);
		CHECK(setxattr(p, "user.bin", "\0\1\2\377", 4, 0) == 0);
		P("sub");
		CHECK(setxattr(p, "user.dir", "d", 1, 0) == 0);
		P("empty");
		CHECK(setxattr(p, "user.empty", "", 0, 0) == 0);
		/* over 1 KiB: a value, and a list of names (the walker asks small first) */
		char big[3000], key[160];
		for (size_t i = 0; i < sizeof(big); i++)
			big[i] = (char)('a' + i % 26);
		P("sub/file");
		CHECK(setxattr(p, "user.big", big, sizeof(big), 0) == 0);
		P("exec");
		for (int i = 0; i < 8; i++) {
			memset(key, 'k', sizeof(key));
			memcpy(key, "user.", 5);
			snprintf(key + 140, sizeof(key) - 140, "%d", i);
			CHECK(setxattr(p, key, "v", 1, 0) == 0);
		}
	}
	if (geteuid() == 0) {
		P("big");
		CHECK(chown(p, 1234, 5678) == 0);
		CHECK(chmod(p, 0640) == 0);
		P("abs_link");
		CHECK(lchown(p, 4321, 8765) == 0);
		P("sgid");
		CHECK(chown(p, 0, 4242) == 0);
		CHECK(chmod(p, 02775) == 0);
		P("setuid");
		CHECK(chown(p, 1000, 1000) == 0);
		CHECK(chmod(p, 04755) == 0);
	}
	/* times with nanoseconds; atime after mtime and recent, so reading keeps it */
	time_t now = time(NULL);
	static const char *const timed[] = {"small",    "big",      "empty", "sparse", "sub/file", "sub",
					    "emptydir", "rel_link", "fifo",  "exec",   "setuid",   "d00"};
	for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++) {
		P(timed[i]);
		set_times(p, now - 600, 123456789 + (long)i, 1500000000 + (time_t)i * 1000, 987654321 - (long)i);
	}
	P("sub");
	set_times(p, now - 300, 5, 1600000000, 111111111);
	free(p);
	set_times(t, now - 300, 7, 1650000000, 222222222);
#undef P
}

/* ---- backups and restores through the SDK ---- */

static void backup_file(const char *dir, const struct sbx_backup_opts *bo, const char *out,
			struct sbx_backup_record *rec)
{
	struct sbx_error err;
	CHECK_SBX(sbx_backup_to_file(client, NULL, dir, bo, out, rec, &err), &err);
}

static void restore_file(const char *dir, const struct sbx_restore_opts *ro, const char *in,
			 struct sbx_restore_result *res)
{
	struct sbx_error err;
	struct sbx_restore_result r = SBX_RESTORE_RESULT_INIT;
	CHECK_SBX(sbx_restore_from_file(client, NULL, dir, ro, in, res ? res : &r, &err), &err);
}

/* A restore that must fail with code; err.path must name member (if not NULL). */
static void restore_fails(const char *dir, const struct sbx_restore_opts *ro, const char *in, int code,
			  const char *member)
{
	struct sbx_error err;
	struct sbx_restore_result r = SBX_RESTORE_RESULT_INIT;
	memset(&err, 0, sizeof(err));
	CHECKF(sbx_restore_from_file(client, NULL, dir, ro, in, &r, &err) < 0, "restore of %s succeeded", in);
	CHECK_ERR(&err, SBX_ERR_REMOTE, code);
	if (member != NULL)
		CHECKF(strcmp(err.path, member) == 0, "error names '%s', want '%s' (%s)", err.path, member,
		       err.message);
}

static bool list_has(char *const *v, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

/* The pax extended headers ('x' members) of an uncompressed archive: how many, and
 * their records one after the other in recs. */
static unsigned pax_headers(const char *path, char *recs, size_t size)
{
	FILE *f = fopen(path, "rb");
	CHECKF(f != NULL, "open %s: %s", path, strerror(errno));
	unsigned n = 0;
	size_t used = 0;
	uint8_t h[512];
	recs[0] = '\0';
	while (fread(h, 1, sizeof(h), f) == sizeof(h) && h[0] != '\0') {
		char sz[13];
		memcpy(sz, h + 124, 12);
		sz[12] = '\0';
		long long len = strtoll(sz, NULL, 8);
		long long blocks = (len + 511) / 512;
		if (h[156] == 'x') {
			n++;
			CHECK(len < 4096);
			char d[4096];
			CHECK(fread(d, 1, (size_t)blocks * 512, f) == (size_t)blocks * 512);
			if (used + (size_t)len < size) {
				memcpy(recs + used, d, (size_t)len);
				used += (size_t)len;
				recs[used] = '\0';
			}
		} else {
			CHECK(fseeko(f, (off_t)blocks * 512, SEEK_CUR) == 0);
		}
	}
	fclose(f);
	return n;
}

/* ---- cases ---- */

static int case_roundtrip(void)
{
	start();
	bool root = geteuid() == 0;
	bool xa = xattrs_work(it_dir());
	if (!xa)
		printf("note: no user xattrs in %s: not checked\n", it_dir());
	const char *t = kp("t");
	make_tree(t, root, xa, true);
	struct snap before;
	snap_take(&before, t);

	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	char arch[PATH_MAX];
	SPRINTF(arch, "%s", it_path("t.tar"));
	backup_file(t, &bo, arch, &rec);
	/* the record */
	char sha[65];
	file_sha(arch, sha);
	CHECKF(strcmp(sha, rec.sha256) == 0, "record sha256 %s, file's %s", rec.sha256, sha);
	struct stat ast;
	CHECK(stat(arch, &ast) == 0);
	CHECK_EQ(rec.bytes, ast.st_size);
	CHECK_EQ(rec.bytes % 10240, 0);
	CHECK_EQ(rec.entries, before.n);
	CHECK(rec.source_bytes >= 3 * MiB && rec.source_bytes < 4 * MiB);
	CHECK_EQ(rec.compression, SBX_COMPRESS_NONE);
	CHECK_EQ(rec.n_skipped, 0);
	CHECK_EQ(rec.n_changed, 0);
	CHECK(strcmp(rec.dir, t) == 0);
	CHECKF(strlen(rec.id) == 36 && rec.id[14] == '4' && rec.id[8] == '-', "id %s", rec.id);
	CHECKF(strlen(rec.created_at) == 20 && rec.created_at[10] == 'T' && rec.created_at[19] == 'Z', "created_at %s",
	       rec.created_at);
	/* the 1 GiB sparse file stays small in the archive */
	CHECKF(ast.st_size < 8 * MiB, "archive of %lld bytes", (long long)ast.st_size);
	sbx_backup_record_free(&rec);

	/* into a new directory, and over an existing one with other content */
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.allow_devices = root;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	const char *r1 = kp("r1");
	restore_file(r1, &ro, arch, &res);
	CHECK_EQ(res.entries, before.n);
	CHECK_EQ(res.bytes, ast.st_size);
	CHECK(strcmp(res.sha256, sha) == 0);
	struct snap after;
	snap_take(&after, r1);
	snap_compare(&before, &after, CMP_RESTORED);
	snap_free(&after);

	const char *r2 = kp("r2");
	mk(r2, 0700);
	char *junk = pjoin(r2, "junk");
	put(junk, "old", 3, 0644);
	restore_file(r2, &ro, arch, NULL);
	CHECK(!lexists(junk));
	snap_take(&after, r2);
	snap_compare(&before, &after, CMP_RESTORED);
	snap_free(&after);
	free(junk);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 0);

	/* the same through the streaming calls, gzip and zstd */
	for (int comp = 1; comp <= 2; comp++) {
		bo.compression = comp;
		bo.level = comp == 1 ? 6 : 3;
		char out[PATH_MAX];
		SPRINTF(out, "%s/t.tar.%s", it_dir(), comp == 1 ? "gz" : "zst");
		backup_file(t, &bo, out, &rec);
		CHECK_EQ(rec.compression, comp);
		file_sha(out, sha);
		CHECK(strcmp(sha, rec.sha256) == 0);
		sbx_backup_record_free(&rec);
		/* the standard tools take it */
		CHECKF(shell("%s -t '%s' 2>/dev/null", comp == 1 ? "gzip" : "zstd -q", out) == 0, "%s -t %s",
		       comp == 1 ? "gzip" : "zstd", out);
		const char *r3 = kp(comp == 1 ? "r3" : "r4");
		ro.sha256 = sha;
		restore_file(r3, &ro, out, NULL);
		ro.sha256 = NULL;
		snap_take(&after, r3);
		snap_compare(&before, &after, CMP_RESTORED);
		snap_free(&after);
	}
	snap_free(&before);
	return 0;
}

/* Names hold exactly their bytes in the archive: python's tarfile reads them back. */
static int case_names(void)
{
	if (!have("python3")) {
		printf("needs python3\n");
		return IT_SKIP;
	}
	start();
	const char *t = kp("t");
	mk(t, 0755);
	char *p = pjoin(t, "a\xff\nb");
	put(p, "x", 1, 0644);
	free(p);
	p = pjoin(t, "\xc3\xa9t\xc3\xa9");
	put(p, "y", 1, 0644);
	free(p);
	p = pjoin(t, "link\xfe");
	CHECK(symlink("tar\xff\nget", p) == 0);
	free(p);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	backup_file(t, &bo, it_path("n.tar"), &rec);
	sbx_backup_record_free(&rec);
	char script[PATH_MAX];
	SPRINTF(script, "%s", it_path("names.py"));
	it_write_file(script, "import sys, tarfile\n"
			      "t = tarfile.open(sys.argv[1], encoding='utf-8', errors='surrogateescape')\n"
			      "got = sorted((m.name.encode('utf-8', 'surrogateescape'),\n"
			      "              m.linkname.encode('utf-8', 'surrogateescape')) for m in t)\n"
			      "want = sorted([(b'.', b''), (b'./a\\xff\\nb', b''), (b'./\\xc3\\xa9t\\xc3\\xa9', b''),\n"
			      "               (b'./link\\xfe', b'tar\\xff\\nget')])\n"
			      "sys.exit(0 if got == want else print(got) or 1)\n");
	CHECK_EQ(shell("python3 '%s' '%s'", script, it_path("n.tar")), 0);
	return 0;
}

/* GNU tar lists and extracts what we write, and what it writes we restore. */
static int case_gnu_tar(void)
{
	if (!have("tar") || shell("tar --version | grep -q 'GNU tar'") != 0) {
		printf("needs GNU tar\n");
		return IT_SKIP;
	}
	start();
	bool root = geteuid() == 0;
	bool xa = xattrs_work(it_dir());
	const char *t = kp("t");
	make_tree(t, root, xa, false);
	struct snap before;
	snap_take(&before, t);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	char arch[PATH_MAX];
	SPRINTF(arch, "%s", it_path("ours.tar"));
	backup_file(t, &bo, arch, &rec);
	sbx_backup_record_free(&rec);
	/* lists cleanly: exit 0, nothing on stderr */
	char errf[PATH_MAX];
	SPRINTF(errf, "%s", it_path("tar.err"));
	CHECK_EQ(shell("tar -tvf '%s' >/dev/null 2>'%s'", arch, errf), 0);
	struct stat st;
	CHECK(stat(errf, &st) == 0);
	CHECKF(st.st_size == 0, "tar -tvf wrote to stderr (see %s)", errf);
	/* and with bsdtar (libarchive-tools; bash tests/deps.sh installs it) */
	CHECKF(have("bsdtar"), "no bsdtar here: install libarchive-tools");
	CHECK_EQ(shell("bsdtar -tvf '%s' >/dev/null 2>'%s'", arch, errf), 0);
	CHECK(stat(errf, &st) == 0);
	CHECKF(st.st_size == 0, "bsdtar -tvf wrote to stderr (see %s)", errf);
	/* GNU tar extracts it to the same tree */
	const char *g = kp("g");
	mk(g, 0755);
	CHECK_EQ(shell("tar -xf '%s' -C '%s' --xattrs --xattrs-include='*' --same-permissions %s 2>'%s'", arch, g,
		       root ? "--same-owner --numeric-owner" : "", errf),
		 0);
	struct snap gx;
	snap_take(&gx, g);
	snap_compare(&before, &gx, CMP_ALL & ~CMP_ATIME);
	snap_free(&gx);

	/* and back: GNU tar's own formats */
	static const char *const fmts[] = {"gnu", "posix"};
	for (size_t i = 0; i < 2; i++) {
		char ga[PATH_MAX];
		SPRINTF(ga, "%s/gnu-%s.tar", it_dir(), fmts[i]);
		CHECK_EQ(shell("tar -cf '%s' --format=%s --sparse %s -C '%s' . 2>'%s'", ga, fmts[i],
			       i == 1 ? "--xattrs --xattrs-include='*'" : "", t, errf),
			 0);
		struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
		ro.allow_devices = root;
		const char *r = kp(i == 0 ? "rg" : "rp");
		restore_file(r, &ro, ga, NULL);
		struct snap after;
		snap_take(&after, r);
		/* the gnu format keeps whole seconds and no xattrs */
		snap_compare(&before, &after, i == 0 ? CMP_OWNER | CMP_DIRMODE : CMP_ALL & ~CMP_ATIME);
		snap_free(&after);
		/* compressed by the tools, restored by us */
		CHECK_EQ(shell("zstd -q -f '%s' -o '%s.zst' && gzip -k -f '%s'", ga, ga, ga), 0);
		char gz[PATH_MAX + 8];
		SPRINTF(gz, "%s.zst", ga);
		restore_file(r, &ro, gz, NULL);
		SPRINTF(gz, "%s.gz", ga);
		restore_file(r, &ro, gz, NULL);
		snap_take(&after, r);
		snap_compare(&before, &after, i == 0 ? CMP_OWNER | CMP_DIRMODE : CMP_ALL & ~CMP_ATIME);
		snap_free(&after);
	}
	/* bsdtar's archives too: its default (restricted pax) and full pax */
	static const char *const bfmts[] = {"", "--format pax"};
	for (size_t i = 0; i < 2; i++) {
		char ba[PATH_MAX];
		SPRINTF(ba, "%s/bsd-%zu.tar", it_dir(), i);
		CHECK_EQ(shell("bsdtar -cf '%s' %s -C '%s' . 2>'%s'", ba, bfmts[i], t, errf), 0);
		struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
		ro.allow_devices = root;
		const char *r = kp(i == 0 ? "rb" : "rbp");
		restore_file(r, &ro, ba, NULL);
		struct snap after;
		snap_take(&after, r);
		/* restricted pax keeps whole seconds unless a member needs a pax header */
		snap_compare(&before, &after, i == 0 ? CMP_ALL & ~CMP_ATIME & ~CMP_NSEC : CMP_ALL & ~CMP_ATIME);
		snap_free(&after);
	}
	snap_free(&before);

	/* Compact like GNU tar's: a member gets a pax extended header only when its
	 * ustar header cannot hold it all (here: mtime nanoseconds), never for atime */
	const char *c = kp("compact");
	mk(c, 0755);
	for (int i = 0; i < 20; i++) {
		char n[32];
		SPRINTF(n, "f%02d", i);
		char *p = pjoin(c, n);
		put(p, n, strlen(n), 0644);
		set_times(p, 1700000000 + i, 123456789, 1600000000 + i, i == 7 ? 5 : 0);
		free(p);
	}
	set_times(c, 1700000000, 1, 1600000000, 0);
	struct sbx_backup_opts co = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record crec = SBX_BACKUP_RECORD_INIT;
	const char *ca = kp("compact.tar");
	backup_file(c, &co, ca, &crec);
	sbx_backup_record_free(&crec);
	char recs[4096];
	CHECK_EQ(pax_headers(ca, recs, sizeof(recs)), 1);
	CHECKF(strstr(recs, " mtime=1600000007.000000005\n") != NULL && strstr(recs, "atime=") == NULL,
	       "pax records '%s'", recs);
	/* 21 headers, 20 data blocks, 1 pax header and its records, the end (22.5 KiB):
	 * three 10 KiB records (with a pax header for every member, five) */
	struct stat cs;
	CHECK(stat(ca, &cs) == 0);
	CHECK_EQ(cs.st_size, 3 * 10240);
	/* owners by name too: tar -tv shows our user and group names */
	struct passwd *pw = getpwuid(geteuid());
	struct group *gr = getgrgid(getegid());
	if (pw != NULL && gr != NULL) {
		char cmd[PATH_MAX + 64], want[600], line[1024] = "", owner[600] = "";
		SPRINTF(cmd, "tar -tvf '%s' ./f00", ca);
		FILE *tf = popen(cmd, "r");
		CHECK(tf != NULL);
		CHECK(fgets(line, sizeof(line), tf) != NULL);
		pclose(tf);
		CHECK(sscanf(line, "%*s %599s", owner) == 1);
		SPRINTF(want, "%s/%s", pw->pw_name, gr->gr_name);
		CHECKF(strcmp(owner, want) == 0, "tar -tv shows owner %s, want %s", owner, want);
	}
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	const char *cr = kp("compact-r");
	restore_file(cr, &ro, ca, NULL);
	for (int i = 0; i < 20; i++) {
		char n[32];
		SPRINTF(n, "f%02d", i);
		char *p = pjoin(cr, n);
		struct stat fs;
		CHECK(lstat(p, &fs) == 0);
		CHECK_EQ(fs.st_mtim.tv_sec, 1600000000 + i);
		CHECK_EQ(fs.st_mtim.tv_nsec, i == 7 ? 5 : 0);
		free(p);
	}
	return 0;
}

/* ---- malicious archives ---- */

static const char mal_py[] =
	"import io, sys, tarfile\n"
	"out = sys.argv[1]\n"
	"def add(t, name, data=b'x', **kw):\n"
	"    ti = tarfile.TarInfo(name)\n"
	"    for k, v in kw.items(): setattr(ti, k, v)\n"
	"    if ti.type == tarfile.REGTYPE:\n"
	"        ti.size = len(data); t.addfile(ti, io.BytesIO(data))\n"
	"    else:\n"
	"        t.addfile(ti)\n"
	"def mk(fn, members):\n"
	"    with tarfile.open(out + '/' + fn, 'w', format=tarfile.PAX_FORMAT) as t:\n"
	"        for m in members: add(t, *m[:2], **(m[2] if len(m) > 2 else {}))\n"
	"esc = sys.argv[2]\n"
	"mk('abs.tar', [('ok', b'ok'), (esc + '/ABS', b'bad')])\n"
	"mk('dotdot.tar', [('ok', b'ok'), ('a/../../DOTDOT', b'bad')])\n"
	"mk('symlink.tar', [('ok', b'ok'), ('link', b'', dict(type=tarfile.SYMTYPE, linkname=esc)),\n"
	"                   ('link/SYM', b'bad')])\n"
	"mk('symlink_dir.tar', [('d', b'', dict(type=tarfile.DIRTYPE)), ('d', b'', dict(type=tarfile.SYMTYPE,\n"
	"                   linkname=esc)), ('d/SYM2', b'bad')])\n"
	"mk('hardlink.tar', [('ok', b'ok'), ('hl', b'', dict(type=tarfile.LNKTYPE, linkname='../outside'))])\n"
	"mk('hardlink_abs.tar', [('ok', b'ok'), ('hl', b'', dict(type=tarfile.LNKTYPE, linkname=esc + '/outside'))])\n"
	"mk('hardlink_missing.tar', [('ok', b'ok'), ('hl', b'', dict(type=tarfile.LNKTYPE, linkname='nothere'))])\n"
	"mk('device.tar', [('ok', b'ok'), ('null', b'', dict(type=tarfile.CHRTYPE, devmajor=1, devminor=3))])\n"
	"mk('root_file.tar', [('ok', b'ok'), ('.', b'evil')])\n"
	"b = io.BytesIO()\n"
	"with tarfile.open(fileobj=b, mode='w', format=tarfile.PAX_FORMAT) as t:\n"
	"    add(t, 'ok', b'ok'); add(t, 'big', b'y' * 10000)\n"
	"raw = b.getvalue()\n"
	"i = raw.find(b'y' * 512)\n"
	"open(out + '/short.tar', 'wb').write(raw[:i + 600])\n"
	"j = raw.rfind(b'big')\n"
	"open(out + '/trunc.tar', 'wb').write(raw[:j + 100])\n"
	"open(out + '/noend.tar', 'wb').write(raw[:i + 10240])\n"
	"open(out + '/good.tar', 'wb').write(raw)\n";

/* A restore REQUEST by hand (sha256 and from_path may be NULL): the errno of the
 * ERROR that ends it. */
static int raw_restore_error(const char *dir, const char *sha, const char *from)
{
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	Shim__V1__RestoreRequest rr = SHIM__V1__RESTORE_REQUEST__INIT;
	rr.dir.data = (uint8_t *)dir;
	rr.dir.len = strlen(dir);
	rr.sha256 = (char *)sha;
	if (from != NULL) {
		rr.has_from_path = 1;
		rr.from_path.data = (uint8_t *)from;
		rr.from_path.len = strlen(from);
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESTORE;
	req.restore = &rr;
	uint8_t buf[4096];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, 1, FRAME_REQUEST, 0, buf, n);
	int code = -1;
	for (;;) {
		struct frame_hdr h;
		uint8_t *pl;
		CHECK(raw_recv(fd, &h, &pl, 10000) == 1);
		if (h.stream == 1 && h.type == FRAME_ERROR) {
			char msg[256];
			code = raw_error_code(pl, h.len, msg, sizeof(msg));
		}
		bool end = h.stream == 1 && (h.type == FRAME_ERROR || h.type == FRAME_END);
		free(pl);
		if (end)
			break;
	}
	close(fd);
	return code;
}

/* Each refused with the member named, nothing written outside, the old directory
 * as it was, nothing temporary left. */
static int case_malicious(void)
{
	if (!have("python3")) {
		printf("needs python3\n");
		return IT_SKIP;
	}
	start();
	const char *mal = kp("mal");
	mk(mal, 0755);
	const char *esc = kp("escape");
	mk(esc, 0755);
	char *outside = pjoin(it_dir(), "outside");
	put(outside, "secret", 6, 0600);
	char script[PATH_MAX];
	SPRINTF(script, "%s", it_path("mal.py"));
	it_write_file(script, mal_py);
	CHECK_EQ(shell("python3 '%s' '%s' '%s'", script, mal, esc), 0);

	const char *dir = kp("parent/dir");
	mk(it_path("parent"), 0755);
	make_tree(dir, false, false, false);
	struct snap old;
	snap_take(&old, dir);

	char abs_member[PATH_MAX];
	SPRINTF(abs_member, "%s/ABS", esc);
	static const struct {
		const char *file;
		int code;
		const char *member; /* NULL: the absolute one */
	} cases[] = {
		{"abs.tar", EPERM, NULL},
		{"dotdot.tar", EPERM, "a/../../DOTDOT"},
		{"symlink.tar", EPERM, "link/SYM"},
		{"symlink_dir.tar", EPERM, "d/SYM2"},
		{"hardlink.tar", EPERM, "hl"},
		{"hardlink_abs.tar", EPERM, "hl"},
		{"hardlink_missing.tar", ENOENT, "hl"},
		{"device.tar", EPERM, "null"},
		{"root_file.tar", EPERM, "."},
		{"short.tar", EBADMSG, "big"},
		{"trunc.tar", EBADMSG, "ok"},
		{"noend.tar", EBADMSG, "big"},
	};
	for (int merge = 0; merge <= 1; merge++) {
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			/* merge mode is not atomic: it runs on a scratch directory */
			const char *target = dir;
			if (merge) {
				target = kp("mergedir");
				shell("rm -rf '%s'", target);
				mk(target, 0755);
			}
			struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
			ro.merge = merge;
			char in[PATH_MAX];
			SPRINTF(in, "%s/%s", mal, cases[i].file);
			int code = cases[i].code;
			restore_fails(target, &ro, in, code, cases[i].member ? cases[i].member : abs_member);
			CHECKF(count_entries(esc) == 0, "%s: something was written in %s", cases[i].file, esc);
			struct stat st;
			CHECK(stat(outside, &st) == 0 && st.st_size == 6 && st.st_nlink == 1);
			CHECK(!lexists(it_path("parent/DOTDOT")) && !lexists(it_path("DOTDOT")));
			CHECK_EQ(count_temps(it_path("parent")), 0);
			struct snap now;
			snap_take(&now, dir);
			snap_compare(&old, &now, CMP_ALL);
			snap_free(&now);
		}
	}
	/* a wrong sha256: refused before the swap; the right one (any case) passes */
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	char good[PATH_MAX], sha[65];
	SPRINTF(good, "%s/good.tar", mal);
	file_sha(good, sha);
	char wrong[65];
	memcpy(wrong, sha, sizeof(wrong));
	wrong[10] = wrong[10] == '0' ? '1' : '0';
	ro.sha256 = wrong;
	restore_fails(dir, &ro, good, EBADMSG, dir);
	struct snap now;
	snap_take(&now, dir);
	snap_compare(&old, &now, CMP_ALL);
	snap_free(&now);
	/* a malformed one: refused by the SDK, and by the shim */
	ro.sha256 = "not hex";
	struct sbx_error err;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	CHECK(sbx_restore_from_file(client, NULL, dir, &ro, good, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_EQ(raw_restore_error(dir, "0123abcz", NULL), EINVAL);
	CHECK_EQ(raw_restore_error(dir, NULL, "relative/path"), EINVAL);
	CHECK_EQ(raw_restore_error(it_path("nothere/dir"), NULL, good), ENOENT);
	for (char *c = sha; *c; c++)
		if (*c >= 'a' && *c <= 'f')
			*c = (char)(*c - 'a' + 'A');
	ro.sha256 = sha;
	restore_file(dir, &ro, good, NULL);
	CHECK_EQ(count_entries(dir), 2);
	CHECK_EQ(count_temps(it_path("parent")), 0);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 0);
	snap_free(&old);
	free(outside);
	return 0;
}

/* Merge mode: files in the archive replace those in dir, the others stay. */
static int case_merge(void)
{
	start();
	const char *src = kp("src");
	mk(src, 0755);
	char *p = pjoin(src, "a");
	put(p, "new a", 5, 0644);
	free(p);
	p = pjoin(src, "d");
	mk(p, 0755);
	free(p);
	p = pjoin(src, "d/b");
	put(p, "new b", 5, 0644);
	free(p);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	backup_file(src, &bo, it_path("m.tar"), &rec);
	sbx_backup_record_free(&rec);
	const char *dst = kp("dst");
	mk(dst, 0700);
	p = pjoin(dst, "a");
	CHECK(symlink("/etc/passwd", p) == 0); /* replaced, never followed */
	free(p);
	p = pjoin(dst, "keep");
	put(p, "kept", 4, 0644);
	free(p);
	p = pjoin(dst, "d");
	mk(p, 0700);
	free(p);
	p = pjoin(dst, "d/other");
	put(p, "other", 5, 0644);
	free(p);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.merge = 1;
	restore_file(dst, &ro, it_path("m.tar"), NULL);
	struct stat st;
	CHECK(lstat(it_path("dst/a"), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 5);
	CHECK(lstat(it_path("dst/keep"), &st) == 0 && st.st_size == 4);
	CHECK(lstat(it_path("dst/d/other"), &st) == 0);
	CHECK(lstat(it_path("dst/d/b"), &st) == 0 && st.st_size == 5);
	CHECK(lstat(it_path("dst/d"), &st) == 0 && (st.st_mode & 07777) == 0755);
	CHECK(lstat(it_path("dst"), &st) == 0 && (st.st_mode & 07777) == 0755);
	/* into a directory that does not exist yet */
	restore_file(it_path("fresh"), &ro, it_path("m.tar"), NULL);
	CHECK(lstat(it_path("fresh/d/b"), &st) == 0);
	return 0;
}

/* Excludes mean what they mean to GNU tar: the same members are left out. */
static int case_excludes(void)
{
	if (!have("tar")) {
		printf("needs tar\n");
		return IT_SKIP;
	}
	start();
	const char *t = kp("t");
	mk(t, 0755);
	static const char *const dirs[] = {
		"a", "a/b", "x", "x/a", "x/a/b", "node_modules", "src", "src/node_modules", ".git", "src/.hidden"};
	static const char *const files[] = {"a/f.o",
					    "a/b/c",
					    "x/a/b/c",
					    "x/y.o",
					    "top.o",
					    "src/main.c",
					    "src/node_modules/m.js",
					    "node_modules/n.js",
					    ".git/HEAD",
					    "src/.hidden/h",
					    "b",
					    "x/b"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char *p = pjoin(t, dirs[i]);
		mk(p, 0755);
		free(p);
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char *p = pjoin(t, files[i]);
		put(p, "x", 1, 0644);
		free(p);
	}
	static const char *const sets[][4] = {
		{"*.o", NULL},   {"b", NULL},     {"a/b", NULL},        {"node_modules", ".git", NULL},
		{"src/*", NULL}, {"*/b/*", NULL}, {"?.o", "x/b", NULL}, {"[ab]", NULL},
		{".*", NULL},    {"?", NULL},     {"*a", NULL},
	};
	for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
		char args[1024] = "";
		for (size_t k = 0; sets[i][k] != NULL; k++) {
			char one[128];
			snprintf(one, sizeof(one), " --exclude='%s'", sets[i][k]);
			strcat(args, one);
		}
		char want[PATH_MAX], got[PATH_MAX], arch[PATH_MAX];
		SPRINTF(want, "%s/want.txt", it_dir());
		SPRINTF(got, "%s/got.txt", it_dir());
		SPRINTF(arch, "%s/ex.tar", it_dir());
		/* GNU tar given the names below t (without "./"): the same patterns match */
		CHECK_EQ(shell("cd '%s' && tar -cf - %s $(ls -A) | tar -tf - | sed 's,/$,,' | sort > '%s'", t, args,
			       want),
			 0);
		struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
		bo.excludes = sets[i];
		struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
		backup_file(t, &bo, arch, &rec);
		sbx_backup_record_free(&rec);
		CHECK_EQ(shell("tar -tf '%s' | grep -vx './' | sed 's,^\\./,,; s,/$,,' | sort > '%s'", arch, got), 0);
		CHECKF(shell("cmp -s '%s' '%s'", want, got) == 0, "excludes%s: members differ from GNU tar's:\n%s",
		       args, "(diff want.txt got.txt)");
	}
	/* a trailing slash: directories only (to GNU tar such a pattern matches nothing) */
	static const char *const slash[] = {"b/", NULL};
	struct sbx_backup_opts bs = SBX_BACKUP_OPTS_INIT;
	bs.excludes = slash;
	struct sbx_backup_record rs = SBX_BACKUP_RECORD_INIT;
	backup_file(t, &bs, it_path("slash.tar"), &rs);
	sbx_backup_record_free(&rs);
	CHECK_EQ(
		shell("tar -tf '%s' | grep -cF '/b/' | grep -x 0 >/dev/null && tar -tf '%s' | grep -x './b' >/dev/null && "
		      "tar -tf '%s' | grep -x './x/b' >/dev/null",
		      it_path("slash.tar"), it_path("slash.tar"), it_path("slash.tar")),
		0);
	/* anchored at DIR with "./" */
	static const char *const anch[] = {"./a", "./src/node_modules", NULL};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.excludes = anch;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	backup_file(t, &bo, it_path("anch.tar"), &rec);
	sbx_backup_record_free(&rec);
	CHECK_EQ(shell("tar -tf '%s' | grep -c '^\\./a/' | grep -x 0 >/dev/null && tar -tf '%s' | grep -x './x/a/b/c' "
		       ">/dev/null && tar -tf '%s' | grep -x './node_modules/n.js' >/dev/null && "
		       "tar -tf '%s' | grep -c 'src/node_modules' | grep -x 0 >/dev/null",
		       it_path("anch.tar"), it_path("anch.tar"), it_path("anch.tar"), it_path("anch.tar")),
		 0);
	return 0;
}

/* ---- mounts: one_file_system, and replacing a mount point ---- */

static int count_cb(void *ud, const struct sbx_dirent *e)
{
	(void)ud;
	CHECKF(strstr(e->name, ".sbx-") == NULL, "temp entry %s left", e->name);
	return 0;
}

static int case_mounts(void)
{
	if (geteuid() != 0 || !have("unshare")) {
		printf("needs root and unshare(1)\n");
		return IT_SKIP;
	}
	char t[PATH_MAX], mnt[PATH_MAX], vol[PATH_MAX];
	SPRINTF(t, "%s", it_path("t"));
	SPRINTF(mnt, "%s/mnt", t);
	SPRINTF(vol, "%s", it_path("vol"));
	mk(t, 0755);
	mk(mnt, 0755);
	mk(vol, 0755);
	char *p = pjoin(t, "here");
	put(p, "here", 4, 0644);
	free(p);
	p = pjoin(vol, "old");
	put(p, "old", 3, 0644);
	free(p);
	SPRINTF(sock, "%s", it_path("shim.sock"));
	SPRINTF(state, "%s", it_path("state"));
	/* only the daemon sees the tmpfs mounts: its own mount namespace */
	const char *argv[] = {"unshare",
			      "-m",
			      "--propagation",
			      "private",
			      "/bin/sh",
			      "-c",
			      "mount -t tmpfs -o size=8m tmpfs \"$0\" && echo there > \"$0/there\" && "
			      "mount -t tmpfs -o size=8m tmpfs \"$1\" && echo old > \"$1/old\" && shift && exec \"$@\"",
			      mnt,
			      vol,
			      SHIM_BIN,
			      "--listen",
			      it_unix_target(sock),
			      "--state-dir",
			      state,
			      NULL};
	daemon1 = it_daemon_start_argv("shim", argv);
	client = it_connect(it_unix_target(sock), NULL);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	char a1[PATH_MAX], a2[PATH_MAX], list[PATH_MAX];
	SPRINTF(a1, "%s", it_path("all.tar"));
	SPRINTF(a2, "%s", it_path("one.tar"));
	SPRINTF(list, "%s", it_path("list.txt"));
	backup_file(t, &bo, a1, &rec);
	CHECK_EQ(rec.entries, 4); /* ./ here mnt/ mnt/there */
	sbx_backup_record_free(&rec);
	bo.one_file_system = 1;
	backup_file(t, &bo, a2, &rec);
	CHECK_EQ(rec.entries, 3); /* the mount point, not what is on it */
	sbx_backup_record_free(&rec);
	CHECK_EQ(shell("tar -tf '%s' | sort > '%s' && printf './\\n./here\\n./mnt/\\n' | cmp -s - '%s'", a2, list,
		       list),
		 0);

	/* replace a mount point: it cannot be renamed, so its contents are swapped */
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	restore_file(vol, &ro, a2, NULL);
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_error err;
	char *q = pjoin(vol, "here");
	CHECK_SBX(sbx_stat(client, NULL, q, 0, &st, &err), &err);
	CHECK_EQ(st.size, 4);
	free(q);
	q = pjoin(vol, "old");
	CHECK_EQ(sbx_exists(client, NULL, q, &err), 0);
	free(q);
	q = pjoin(vol, "mnt");
	CHECK_EQ(sbx_exists(client, NULL, q, &err), 1);
	free(q);
	struct sbx_statfs sf = SBX_STATFS_INIT;
	CHECK_SBX(sbx_statfs(client, NULL, vol, &sf, &err), &err);
	CHECK_EQ(sf.fs_type, 0x01021994); /* still the tmpfs */
	/* nothing temporary left on it: here and mnt only */
	uint64_t n = 0;
	CHECK_SBX(sbx_list(client, NULL, vol, 1, SBX_LIST_HIDDEN, count_cb, NULL, &n, &err), &err);
	CHECK_EQ(n, 2);
	CHECK_EQ(count_temps(it_dir()), 0);
	return 0;
}

/* ---- permissions ---- */

static void drop_dac(void)
{
	if (geteuid() == 0) {
		/* the daemon we spawn must not have the DAC override capabilities (the
		 * bounding set survives execve) */
		CHECK(prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) == 0);
		CHECK(prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) == 0);
	}
}

static int unreadable_body(void)
{
	drop_dac();
	start();
	const char *t = kp("t");
	mk(t, 0755);
	char *p = pjoin(t, "ok");
	put(p, "ok", 2, 0644);
	free(p);
	char *secret = pjoin(t, "secret");
	put(secret, "secret", 6, 0000);
	char *locked = pjoin(t, "locked");
	mk(locked, 0755);
	p = pjoin(locked, "inside");
	put(p, "in", 2, 0644);
	free(p);
	CHECK(chmod(locked, 0000) == 0);
	char *empty = pjoin(t, "empty_secret");
	put(empty, "", 0, 0000);

	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup_to_file(client, NULL, t, &bo, it_path("u.tar"), &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECKF(strcmp(err.path, secret) == 0 || strcmp(err.path, locked) == 0, "error names %s", err.path);
	CHECK(!lexists(it_path("u.tar")));

	bo.skip_unreadable = 1;
	backup_file(t, &bo, it_path("u.tar"), &rec);
	CHECK_EQ(rec.n_skipped, 2);
	CHECK(list_has(rec.skipped, rec.n_skipped, secret));
	CHECK(list_has(rec.skipped, rec.n_skipped, locked));
	CHECK_EQ(rec.entries, 3); /* ./ ok empty_secret (an empty file is not opened) */
	sbx_backup_record_free(&rec);
	CHECK_EQ(shell("tar -tf '%s' | sort | tr '\\n' ' ' | grep -qx './ ./empty_secret ./ok '", it_path("u.tar")), 0);
	CHECK(chmod(locked, 0755) == 0);
	free(secret);
	free(locked);
	free(empty);
	sbx_client_close(client);
	client = NULL;
	return 0;
}

static int case_unreadable(void)
{
	/* in a child: the capability bounding set is dropped for good */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int rc = unreadable_body();
		it_daemon_stop(daemon1);
		_exit(rc);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the case failed in its child (status 0x%x)", st);
	return 0;
}

/* ---- a file changing while it is read ---- */

struct grower {
	const char *path;
	volatile int stop;
};

static void *grow_thread(void *arg)
{
	struct grower *g = arg;
	int fd = open(g->path, O_WRONLY | O_APPEND | O_CLOEXEC);
	CHECK(fd >= 0);
	while (!g->stop) {
		CHECK(write(fd, "+", 1) == 1);
		it_sleep_ms(1);
	}
	close(fd);
	return NULL;
}

struct slow_sink {
	uint64_t got;
	int fd;
};

static int slow_sink_fn(void *ud, const void *buf, size_t len)
{
	struct slow_sink *s = ud;
	if (s->got < 64 * MiB)
		it_sleep_ms(2); /* back-pressure: the walker waits on us */
	s->got += len;
	CHECK(write(s->fd, buf, len) == (ssize_t)len);
	return 0;
}

static int case_changed(void)
{
	start();
	const char *t = kp("t");
	mk(t, 0755);
	char *big = pjoin(t, "growing");
	{
		size_t n = 32 * MiB;
		uint8_t *buf = malloc(n);
		CHECK(buf != NULL);
		it_fill(buf, n, 7);
		put(big, buf, n, 0644);
		free(buf);
	}
	char *calm = pjoin(t, "calm");
	put(calm, "calm", 4, 0644);
	struct grower g = {.path = big};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, grow_thread, &g) == 0);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	struct slow_sink s = {.fd = open(it_path("c.tar"), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
	CHECK(s.fd >= 0);
	int rc = sbx_backup(client, NULL, t, &bo, slow_sink_fn, &s, &rec, &err);
	g.stop = 1;
	pthread_join(th, NULL);
	close(s.fd);
	CHECK_SBX(rc, &err);
	CHECK_EQ(rec.n_changed, 1);
	CHECK(strcmp(rec.changed[0], big) == 0);
	CHECK_EQ(rec.bytes, s.got);
	sbx_backup_record_free(&rec);
	/* the archive is whole: the file as big as when it was first seen */
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	restore_file(it_path("r"), &ro, it_path("c.tar"), NULL);
	struct stat st;
	CHECK(stat(it_path("r/growing"), &st) == 0 && st.st_size >= 32 * MiB);
	CHECK(stat(it_path("r/calm"), &st) == 0 && st.st_size == 4);
	free(big);
	free(calm);
	return 0;
}

/* ---- bulk: many files of every size through each restore path ---- */

/* Files from 0 bytes to 700 KiB (more than one write piece of the restore's file
 * writer), 60 MB in all: more than the stream's ring many times over, so restored
 * data is written from the ring while the client refills it. Restored from the
 * stream (written from the ring itself), compressed (copied out of libarchive) and
 * from_path (copied too): every byte compared. */
static int case_bulk(void)
{
	start();
	const char *t = kp("t");
	mk(t, 0755);
	size_t max = 700 * KiB;
	uint8_t *buf = malloc(max);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < 200; i++) {
		char name[48];
		snprintf(name, sizeof(name), "%s/d%u", t, i % 7);
		struct stat st;
		if (stat(name, &st) < 0)
			mk(name, 0755);
		size_t n = i % 10 == 0 ? i : (size_t)((i * 2654435761u) % max);
		snprintf(name, sizeof(name), "%s/d%u/f%03u", t, i % 7, i);
		it_fill(buf, n, i + 1);
		put(name, buf, n, 0640);
	}
	free(buf);
	struct snap before;
	snap_take(&before, t);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	backup_file(t, &bo, it_path("b.tar"), &rec);
	CHECK(rec.source_bytes > 50 * 1000 * 1000);
	sbx_backup_record_free(&rec);
	bo.compression = SBX_COMPRESS_GZIP;
	bo.level = 1;
	backup_file(t, &bo, it_path("b.tar.gz"), &rec);
	sbx_backup_record_free(&rec);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	const char *in[] = {"b.tar", "b.tar.gz"};
	for (unsigned k = 0; k < 3; k++) {
		char dir[32];
		snprintf(dir, sizeof(dir), "r%u", k);
		struct sbx_restore_opts o = ro;
		char from[PATH_MAX];
		SPRINTF(from, "%s", it_path("b.tar"));
		if (k == 2) {
			struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
			struct sbx_error err;
			o.from_path = from;
			CHECK_SBX(sbx_restore(client, NULL, kp(dir), &o, NULL, NULL, &res, &err), &err);
		} else {
			restore_file(kp(dir), &o, it_path(in[k]), NULL);
		}
		struct snap after;
		snap_take(&after, kp(dir));
		snap_compare(&before, &after, CMP_RESTORED);
		snap_free(&after);
	}
	snap_free(&before);
	return 0;
}

/* Several at once: the first job gets big buffers, the others small ones; the
 * archives are the same bytes and every restore is whole. */
struct job_arg {
	const char *dir, *file;
	bool restore;
	struct sbx_backup_record rec;
};

static void *job_thread(void *arg)
{
	struct job_arg *a = arg;
	if (a->restore) {
		struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
		restore_file(a->dir, &ro, a->file, NULL);
	} else {
		struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
		backup_file(a->dir, &bo, a->file, &a->rec);
	}
	return NULL;
}

static int case_concurrent(void)
{
	start();
	const char *t = kp("t");
	mk(t, 0755);
	uint8_t *buf = malloc(300 * KiB);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < 120; i++) {
		char name[48];
		snprintf(name, sizeof(name), "%s/f%03u", t, i);
		size_t n = (size_t)((i * 2654435761u) % (300 * KiB));
		it_fill(buf, n, i + 7);
		put(name, buf, n, 0644);
	}
	free(buf);
	struct snap before;
	snap_take(&before, t);
	enum { N = 3 };
	struct job_arg a[N];
	pthread_t th[N];
	char files[N][PATH_MAX], dirs[N][32];
	for (unsigned i = 0; i < N; i++) {
		SPRINTF(files[i], "%s/c%u.tar", it_dir(), i);
		a[i] = (struct job_arg){.dir = t, .file = files[i], .rec = SBX_BACKUP_RECORD_INIT};
		CHECK(pthread_create(&th[i], NULL, job_thread, &a[i]) == 0);
	}
	for (unsigned i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	for (unsigned i = 0; i < N; i++) {
		char sha[65];
		file_sha(files[i], sha);
		CHECK(strcmp(sha, a[i].rec.sha256) == 0);
		CHECK(strcmp(a[i].rec.sha256, a[0].rec.sha256) == 0);
		CHECK_EQ(a[i].rec.entries, before.n);
		sbx_backup_record_free(&a[i].rec);
	}
	for (unsigned i = 0; i < N; i++) {
		snprintf(dirs[i], sizeof(dirs[i]), "r%u", i);
		a[i] = (struct job_arg){
			.dir = kp(dirs[i]), .file = files[i], .restore = true, .rec = SBX_BACKUP_RECORD_INIT};
		CHECK(pthread_create(&th[i], NULL, job_thread, &a[i]) == 0);
	}
	for (unsigned i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	for (unsigned i = 0; i < N; i++) {
		struct snap after;
		snap_take(&after, a[i].dir);
		snap_compare(&before, &after, CMP_RESTORED);
		snap_free(&after);
	}
	snap_free(&before);
	return 0;
}

/* ---- to_path / from_path ---- */

static int case_to_from_path(void)
{
	start();
	const char *t = kp("t");
	make_tree(t, false, false, true);
	struct snap before;
	snap_take(&before, t);
	/* the archive inside the directory it backs up: left out of itself */
	char to[PATH_MAX];
	SPRINTF(to, "%s/backup.tar", t);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.to_path = to;
	bo.compression = SBX_COMPRESS_ZSTD;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_backup(client, NULL, t, &bo, NULL, NULL, &rec, &err), &err);
	char sha[65];
	file_sha(to, sha);
	CHECK(strcmp(sha, rec.sha256) == 0);
	CHECK(strcmp(rec.to_path, to) == 0);
	CHECK_EQ(rec.entries, before.n);
	struct stat st;
	CHECK(stat(to, &st) == 0 && (uint64_t)st.st_size == rec.bytes && (st.st_mode & 0777) == 0600);
	sbx_backup_record_free(&rec);
	CHECK_EQ(count_temps(t), 0);
	/* again over the old one: still left out */
	CHECK_SBX(sbx_backup(client, NULL, t, &bo, NULL, NULL, &rec, &err), &err);
	CHECK_EQ(rec.entries, before.n);
	file_sha(to, sha);
	CHECK(strcmp(sha, rec.sha256) == 0);
	sbx_backup_record_free(&rec);
	/* from_path */
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.from_path = to;
	ro.sha256 = sha;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	const char *r = kp("r");
	CHECK_SBX(sbx_restore(client, NULL, r, &ro, NULL, NULL, &res, &err), &err);
	CHECK(strcmp(res.sha256, sha) == 0);
	struct snap after;
	snap_take(&after, r);
	/* (not the root's mtime: writing the archive into it changed that) */
	snap_compare(&before, &after, CMP_RESTORED & ~CMP_DIRMODE);
	snap_free(&after);
	/* errors: a directory as to_path, a missing from_path, a bad level */
	bo.to_path = it_dir();
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup(client, NULL, t, &bo, NULL, NULL, &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EISDIR);
	ro.from_path = it_path("nothere.tar");
	ro.sha256 = NULL;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_restore(client, NULL, r, &ro, NULL, NULL, &res, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	bo.to_path = NULL;
	bo.compression = SBX_COMPRESS_NONE;
	bo.level = 5;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup_to_file(client, NULL, t, &bo, it_path("x.tar"), &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	bo.compression = SBX_COMPRESS_ZSTD;
	bo.level = 99;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup_to_file(client, NULL, t, &bo, it_path("x.tar"), &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	bo.level = 0;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup_to_file(client, NULL, it_path("nothere"), &bo, it_path("x.tar"), &rec, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 0);
	snap_free(&before);
	return 0;
}

/* ---- cancels, disconnects, crashes ---- */

/* A tree worth a few seconds of work. */
static void make_bulk(const char *t, unsigned files, size_t size)
{
	mk(t, 0755);
	uint8_t *buf = malloc(size);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < files; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%04u", i);
		char *p = pjoin(t, name);
		it_fill(buf, size, i);
		put(p, buf, size, 0644);
		free(p);
	}
	free(buf);
}

static int cancel_sink_fn(void *ud, const void *buf, size_t len)
{
	(void)buf;
	uint64_t *got = ud;
	*got += len;
	return *got > 2 * MiB ? ECANCELED : 0;
}

static void *fire_later(void *arg)
{
	it_sleep_ms(300);
	sbx_cancel_fire(arg);
	return NULL;
}

static void wait_idle(void)
{
	/* the daemon has dropped the stream: info sees only its own */
	uint64_t end = it_now_ms() + 10000;
	for (;;) {
		struct sbx_info info = SBX_INFO_INIT;
		struct sbx_error err;
		CHECK_SBX(sbx_info(client, NULL, &info, &err), &err);
		unsigned streams = info.streams;
		if (streams <= 1)
			return;
		CHECKF(it_now_ms() < end, "%u streams still open", streams);
		it_sleep_ms(10);
	}
}

static int case_cancel_backup(void)
{
	start();
	const char *t = kp("t");
	make_bulk(t, 64, 512 * KiB);
	/* the sink stops the stream after 2 MiB */
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	uint64_t got = 0;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup(client, NULL, t, &bo, cancel_sink_fn, &got, &rec, &err) < 0);
	CHECK_EQ(err.code, ECANCELED);
	wait_idle();
	/* to_path, slowly compressed: cancelled on the way, its temp file goes */
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts co = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 60000, .cancel = tok};
	bo.compression = SBX_COMPRESS_ZSTD;
	bo.level = 19;
	char to[PATH_MAX];
	SPRINTF(to, "%s", it_path("out.tar.zst"));
	bo.to_path = to;
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fire_later, tok) == 0);
	uint64_t t0 = it_now_ms();
	memset(&err, 0, sizeof(err));
	CHECK(sbx_backup(client, &co, t, &bo, NULL, NULL, &rec, &err) < 0);
	CHECK_EQ(err.code, ECANCELED);
	pthread_join(th, NULL);
	sbx_cancel_free(tok);
	CHECKF(it_now_ms() - t0 < 20000, "the cancel took %llu ms", (unsigned long long)(it_now_ms() - t0));
	wait_idle();
	wait_temps(it_dir(), 0, 10000);
	CHECK(!lexists(to));
	wait_journal_empty(10000);
	/* the daemon goes on */
	bo.to_path = NULL;
	bo.compression = SBX_COMPRESS_NONE;
	bo.level = 0;
	backup_file(t, &bo, it_path("ok.tar"), &rec);
	CHECK_EQ(rec.entries, 65);
	sbx_backup_record_free(&rec);
	return 0;
}

/* A source that gives the first part of an archive, then fails (cancel) or waits. */
struct part_source {
	int fd;
	uint64_t sent, limit;
	volatile int go;
	volatile int blocked;
	int fail_errno;
};

static long part_source_fn(void *ud, void *buf, size_t len)
{
	struct part_source *s = ud;
	if (s->sent >= s->limit) {
		if (s->fail_errno) {
			errno = s->fail_errno;
			return -1;
		}
		s->blocked = 1;
		while (!s->go)
			it_sleep_ms(2);
		errno = EIO;
		return -1;
	}
	if (len > s->limit - s->sent)
		len = (size_t)(s->limit - s->sent);
	ssize_t n = read(s->fd, buf, len);
	CHECK(n >= 0);
	s->sent += (uint64_t)n;
	return n;
}

/* An old directory and an archive of something else, for the interrupted restores. */
static void restore_setup(const char **dir, struct snap *old, const char **arch)
{
	*dir = kp("p/dir");
	mk(it_path("p"), 0755);
	make_tree(*dir, false, false, true);
	snap_take(old, *dir);
	const char *t = kp("bulk");
	make_bulk(t, 32, 256 * KiB);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	*arch = kp("bulk.tar");
	backup_file(t, &bo, *arch, &rec);
	sbx_backup_record_free(&rec);
}

static void check_old(const char *dir, const struct snap *old)
{
	struct snap now;
	snap_take(&now, dir);
	snap_compare(old, &now, CMP_ALL);
	snap_free(&now);
}

static int case_cancel_restore(void)
{
	start();
	const char *dir, *arch;
	struct snap old;
	restore_setup(&dir, &old, &arch);
	struct part_source src = {.fd = open(arch, O_RDONLY | O_CLOEXEC), .limit = 3 * MiB, .fail_errno = ECANCELED};
	CHECK(src.fd >= 0);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_error err;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_restore(client, NULL, dir, &ro, part_source_fn, &src, &res, &err) < 0);
	close(src.fd);
	wait_idle();
	wait_temps(it_path("p"), 0, 10000);
	wait_journal_empty(10000);
	check_old(dir, &old);
	snap_free(&old);
	return 0;
}

/* Raw frames: a restore REQUEST, then part of the archive, then what the case does. */
static int raw_restore_start(const char *dir, const char *arch, size_t part)
{
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	Shim__V1__RestoreRequest rr = SHIM__V1__RESTORE_REQUEST__INIT;
	rr.dir.data = (uint8_t *)dir;
	rr.dir.len = strlen(dir);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESTORE;
	req.restore = &rr;
	uint8_t buf[4096];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, 1, FRAME_REQUEST, 0, buf, n);
	int afd = open(arch, O_RDONLY | O_CLOEXEC);
	CHECK(afd >= 0);
	static uint8_t chunk[64 * KiB];
	/* within the default window of 256 KiB */
	for (size_t sent = 0; sent < part;) {
		size_t k = part - sent < sizeof(chunk) ? part - sent : sizeof(chunk);
		CHECK(read(afd, chunk, k) == (ssize_t)k);
		raw_send(fd, 1, FRAME_DATA, 0, chunk, k);
		sent += k;
	}
	close(afd);
	return fd;
}

static int case_disconnect_restore(void)
{
	start();
	const char *dir, *arch;
	struct snap old;
	restore_setup(&dir, &old, &arch);
	int fd = raw_restore_start(dir, arch, 200 * KiB);
	wait_temps(it_path("p"), 1, 10000);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 1);
	close(fd);
	wait_temps(it_path("p"), 0, 10000);
	wait_journal_empty(10000);
	check_old(dir, &old);
	/* a CANCEL frame does the same */
	fd = raw_restore_start(dir, arch, 200 * KiB);
	wait_temps(it_path("p"), 1, 10000);
	raw_send(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	for (;;) {
		struct frame_hdr h;
		uint8_t *pl;
		CHECK(raw_recv(fd, &h, &pl, 10000) == 1);
		bool end = h.stream == 1 && (h.type == FRAME_ERROR || h.type == FRAME_END);
		if (end) {
			CHECK_EQ(h.type, FRAME_ERROR);
			char msg[256];
			CHECK_EQ(raw_error_code(pl, h.len, msg, sizeof(msg)), ECANCELED);
		}
		free(pl);
		if (end)
			break;
	}
	close(fd);
	wait_temps(it_path("p"), 0, 10000);
	check_old(dir, &old);
	snap_free(&old);
	return 0;
}

static int case_sigkill_restore(void)
{
	start();
	const char *dir, *arch;
	struct snap old;
	restore_setup(&dir, &old, &arch);
	int fd = raw_restore_start(dir, arch, 200 * KiB);
	wait_temps(it_path("p"), 1, 10000);
	/* the temp directory has some of the archive in it */
	it_sleep_ms(100);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 1);
	CHECK(kill(daemon1->pid, SIGKILL) == 0);
	CHECK(it_daemon_wait_exit(daemon1, 5000));
	close(fd);
	sbx_client_close(client);
	client = NULL;
	CHECK_EQ(count_temps(it_path("p")), 1);
	check_old(dir, &old);
	/* the same state dir: the leftover goes before the daemon takes connections */
	char sock2[PATH_MAX];
	SPRINTF(sock2, "%s", it_path("shim2.sock"));
	struct it_daemon *d2 = it_daemon_start("shim2", "--listen", it_unix_target(sock2), "--state-dir", state, NULL);
	CHECK_EQ(count_temps(it_path("p")), 0);
	CHECK_EQ(it_journal_pending(it_path("state/pending-writes")), 0);
	check_old(dir, &old);
	char *log = it_daemon_log(d2);
	CHECK_CONTAINS(log, "removed");
	free(log);
	/* and the restore works there */
	client = it_connect(it_unix_target(sock2), NULL);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	restore_file(dir, &ro, arch, NULL);
	CHECK_EQ(count_entries(dir), 32);
	snap_free(&old);
	return 0;
}

/* Progress events come along the way, for both directions. */
static void progress_fn(void *ud, uint64_t bytes, uint64_t entries)
{
	uint64_t *v = ud;
	v[0]++;
	v[1] = bytes;
	v[2] = entries;
}

static int case_progress(void)
{
	start();
	const char *t = kp("t");
	make_bulk(t, 200, 256 * KiB);
	uint64_t pv[3] = {0};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.progress = progress_fn;
	bo.progress_ud = pv;
	struct slow_sink s = {.fd = open(it_path("p.tar"), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_backup(client, NULL, t, &bo, slow_sink_fn, &s, &rec, &err), &err);
	close(s.fd);
	CHECKF(pv[0] >= 2, "%llu progress events", (unsigned long long)pv[0]);
	CHECK(pv[1] > 0 && pv[1] <= rec.bytes && pv[2] > 0 && pv[2] <= rec.entries);
	sbx_backup_record_free(&rec);
	return 0;
}

/* With --root: every path of the requests (dir, to_path, from_path) is beneath it. */
static int case_confined(void)
{
	const char *root = kp("root");
	mk(root, 0755);
	SPRINTF(sock, "%s", it_path("shim.sock"));
	SPRINTF(state, "%s", it_path("state"));
	daemon1 = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", state, "--root", root, NULL);
	client = it_connect(it_unix_target(sock), NULL);
	const char *t = kp("root/t");
	make_bulk(t, 3, 1000);
	char *link = pjoin(root, "abs");
	CHECK(symlink("/t", link) == 0); /* resolved beneath the root */
	free(link);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.to_path = "/out.tar";
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_backup(client, NULL, "/abs", &bo, NULL, NULL, &rec, &err), &err);
	CHECK_EQ(rec.entries, 4);
	CHECK(strcmp(rec.to_path, "/out.tar") == 0);
	sbx_backup_record_free(&rec);
	CHECK(lexists(it_path("root/out.tar")));
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.from_path = "/out.tar";
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	CHECK_SBX(sbx_restore(client, NULL, "/r", &ro, NULL, NULL, &res, &err), &err);
	CHECK_EQ(res.entries, 4);
	CHECK(lexists(it_path("root/r/f0002")));
	/* and over the old one, through the symlink: what it names is replaced */
	CHECK_SBX(sbx_restore(client, NULL, "/abs", &ro, NULL, NULL, &res, &err), &err);
	struct stat st;
	CHECK(lstat(it_path("root/abs"), &st) == 0 && S_ISLNK(st.st_mode));
	CHECK(lstat(it_path("root/t/f0001"), &st) == 0 && st.st_size == 1000);
	CHECK_EQ(count_temps(root), 0);
	return 0;
}

/* ---- one whole archive or nothing (issue 16) ---- */

/* An archive built in memory. */
struct abuf {
	uint8_t *p;
	size_t n, cap;
};

/* n bytes of data (NULL: zeros). */
static void ab_add(struct abuf *b, const void *data, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 4096;
		b->p = realloc(b->p, b->cap);
		CHECK(b->p != NULL);
	}
	if (data != NULL)
		memcpy(b->p + b->n, data, n);
	else
		memset(b->p + b->n, 0, n);
	b->n += n;
}

/* A ustar header (GNU's magic for a volume header, type 'V'). size -1 is stored as GNU tar
 * stores a negative number (base-256: all bytes 0xff). */
static void ab_header(struct abuf *b, const char *name, char type, mode_t mode, long long size, const char *link)
{
	uint8_t h[512];
	memset(h, 0, sizeof(h));
	snprintf((char *)h, 100, "%s", name);
	snprintf((char *)h + 100, 8, "%07o", (unsigned)mode);
	memcpy(h + 108, "0000000", 8);
	memcpy(h + 116, "0000000", 8);
	if (size >= 0)
		snprintf((char *)h + 124, 12, "%011o", (unsigned)size); /* small members only */
	else
		memset(h + 124, 0xff, 12);
	snprintf((char *)h + 136, 12, "%011o", 1600000000u);
	h[156] = (uint8_t)type;
	if (link != NULL)
		snprintf((char *)h + 157, 100, "%s", link);
	memcpy(h + 257, type == 'V' ? "ustar  " : "ustar\00000", 8);
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (size_t i = 0; i < sizeof(h); i++)
		sum += h[i];
	snprintf((char *)h + 148, 7, "%06o", sum);
	ab_add(b, h, sizeof(h));
}

/* A regular file member: header, data, padding. */
static void ab_file(struct abuf *b, const char *name, const char *data)
{
	size_t n = strlen(data);
	ab_header(b, name, '0', 0644, (long long)n, NULL);
	ab_add(b, data, n);
	ab_add(b, NULL, (512 - n % 512) % 512);
}

static const char *ab_write(struct abuf *b, const char *name)
{
	const char *path = kp(name);
	put(path, b->p, b->n, 0644);
	free(b->p);
	memset(b, 0, sizeof(*b));
	return path;
}

/* Streams a file to the shim in small pieces (the tar reader's blocks are then small). */
struct chunk_source {
	int fd;
	size_t chunk;
};

static long chunk_source_fn(void *ud, void *buf, size_t len)
{
	struct chunk_source *s = ud;
	ssize_t n = read(s->fd, buf, len < s->chunk ? len : s->chunk);
	return (long)n;
}

enum { VIA_STREAM, VIA_FROM_PATH, VIA_CHUNKS };

/* Restore the archive in (a local file) into dir: streamed, read by the shim itself, or
 * streamed 97 bytes at a time. 0, or -1 with *err. */
static int restore_via(const char *dir, const char *in, int merge, int allow_empty, int via,
		       struct sbx_restore_result *res, struct sbx_error *err)
{
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.merge = merge;
	ro.allow_empty = allow_empty;
	memset(err, 0, sizeof(*err));
	if (via == VIA_FROM_PATH) {
		ro.from_path = in;
		return sbx_restore(client, NULL, dir, &ro, NULL, NULL, res, err);
	}
	if (via == VIA_CHUNKS) {
		struct chunk_source cs = {open(in, O_RDONLY | O_CLOEXEC), 97};
		CHECK(cs.fd >= 0);
		int rc = sbx_restore(client, NULL, dir, &ro, chunk_source_fn, &cs, res, err);
		close(cs.fd);
		return rc;
	}
	return sbx_restore_from_file(client, NULL, dir, &ro, in, res, err);
}

/* A restore that must be refused with EBADMSG and a message naming the offset (holding
 * want too, and the path the member, when they are not NULL), leaving dir exactly as old
 * (listing, contents, modes, owners, times), nothing left beside it or in the journal. */
static void refused_msg(const char *dir, const struct snap *old, const char *in, int merge, int allow_empty, int via,
			const char *member, const char *want, const char *what)
{
	struct sbx_error err;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	CHECKF(restore_via(dir, in, merge, allow_empty, via, &res, &err) < 0, "%s (%s): restored %llu entries", what,
	       merge ? "merge" : "replace", (unsigned long long)res.entries);
	CHECKF(err.kind == SBX_ERR_REMOTE && err.code == EBADMSG, "%s (%s): want EBADMSG, got %s", what,
	       merge ? "merge" : "replace", it_errstr(&err));
	CHECKF(strstr(err.message, "offset") != NULL, "%s: the error names no offset: %s", what, err.message);
	if (want != NULL)
		CHECKF(strstr(err.message, want) != NULL, "%s: '%s' does not say '%s'", what, err.message, want);
	if (member != NULL)
		CHECKF(strcmp(err.path, member) == 0, "%s: the error names '%s', want '%s' (%s)", what, err.path,
		       member, err.message);
	struct snap now;
	snap_take(&now, dir);
	snap_compare(old, &now, CMP_ALL);
	snap_free(&now);
	char parent[PATH_MAX];
	SPRINTF(parent, "%s", dir);
	*strrchr(parent, '/') = '\0';
	CHECKF(count_temps(parent) == 0, "%s: a temp directory left in %s", what, parent);
	/* (-1: no journal directory, the archive failed before any file was written) */
	CHECKF(it_journal_pending(it_path("state/pending-writes")) <= 0, "%s: a journal entry left", what);
}

static void refused(const char *dir, const struct snap *old, const char *in, int merge, int allow_empty, int via,
		    const char *member, const char *what)
{
	refused_msg(dir, old, in, merge, allow_empty, via, member, NULL, what);
}

/* The old directory the refusals must leave alone: every kind of entry. */
static const char *old_dir(struct snap *old)
{
	mk(it_path("p"), 0755);
	const char *dir = kp("p/dir");
	make_tree(dir, false, false, true);
	snap_take(old, dir);
	return dir;
}

/* Hand-made archives that are not one whole archive: refused in both modes, whatever
 * the input path; the end-of-archive blocks alone only with allow_empty. */
static int case_whole_archive(void)
{
	start();
	struct snap old;
	const char *dir = old_dir(&old);
	struct abuf b = {0};
	/* GNU tar: "Archive value -1 is out of off_t range"; libarchive skips the volume
	 * header and reports the end of the archive */
	ab_header(&b, "label", 'V', 0644, -1, NULL);
	const char *volneg = ab_write(&b, "volneg.tar");
	ab_add(&b, NULL, 512);
	const char *zero = ab_write(&b, "zero512.tar");
	ab_file(&b, "m", "member data\n");
	const char *noend = ab_write(&b, "noend.tar");
	ab_file(&b, "m", "member data\n");
	ab_add(&b, NULL, 512);
	const char *oneend = ab_write(&b, "oneend.tar");
	ab_add(&b, NULL, 512);
	ab_file(&b, "m", "member data\n");
	ab_add(&b, NULL, 1024);
	const char *lone = ab_write(&b, "lone.tar");
	ab_file(&b, "m", "member data\n");
	ab_add(&b, NULL, 1024);
	ab_add(&b, "garbage", 7);
	ab_add(&b, NULL, 10240 - b.n % 10240);
	const char *garbage = ab_write(&b, "garbage.tar");
	ab_add(&b, NULL, 1024);
	const char *endonly = ab_write(&b, "endonly.tar");
	ab_add(&b, NULL, 8 * KiB + 512);
	const char *zeros = ab_write(&b, "zeros.tar");
	const char *empty = ab_write(&b, "empty.tar");
	ab_file(&b, "m", "member data\n");
	ab_add(&b, NULL, 1024 + 4096);
	const char *good = ab_write(&b, "good.tar");

	const struct {
		const char *name;
		const char *file;
		const char *member; /* the path the error names: the last member, or dir */
		const char *msg;
		bool empty; /* an empty archive: taken with allow_empty */
	} kinds[] = {
		{"volume header of size -1, no end", volneg, NULL, "no member follows the header at offset 0", false},
		{"one zero block", zero, NULL, "one end-of-archive block at offset 0, not two", false},
		{"a member, no end", noend, "m", "it ends at offset 1024 after this member", false},
		{"a member, one end block", oneend, "m", "one end-of-archive block at offset 1024", false},
		{"a lone zero block before a member", lone, NULL, "a lone zero block at offset 0", false},
		{"data after the end", garbage, NULL, "data after the end of the archive at offset 2048", false},
		{"an empty stream", empty, NULL, "ends at offset 0", false},
		{"the end-of-archive blocks alone", endonly, NULL, "no members", true},
		{"8.5 KiB of zeros", zeros, NULL, "no members", true},
	};
	static const char *const vias[] = {"stream", "from_path", "97-byte pieces"};
	for (int via = VIA_STREAM; via <= VIA_CHUNKS; via++) {
		for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
			for (int merge = 0; merge <= 1; merge++) {
				char what[200];
				SPRINTF(what, "%s, %s", kinds[i].name, vias[via]);
				const char *member = kinds[i].member != NULL ? kinds[i].member : dir;
				refused_msg(dir, &old, kinds[i].file, merge, 0, via, member, kinds[i].msg, what);
				if (!kinds[i].empty)
					refused_msg(dir, &old, kinds[i].file, merge, 1, via, member, kinds[i].msg,
						    what);
			}
		}
		printf("%s: %zu kinds refused in both modes\n", vias[via], sizeof(kinds) / sizeof(kinds[0]));
	}

	/* allow_empty: an empty archive makes an empty directory (replace; the old one's mode
	 * kept, as without a "./" member), leaves dir as it was (merge) */
	struct sbx_error err;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	for (int k = 0; k < 2; k++) {
		const char *in = k == 0 ? endonly : zeros;
		const char *e = kp(k == 0 ? "e1" : "e2");
		mk(e, 0750);
		char *f = pjoin(e, "old");
		put(f, "old", 3, 0644);
		free(f);
		CHECK_SBX(restore_via(e, in, 0, 1, VIA_STREAM, &res, &err), &err);
		CHECK_EQ(res.entries, 0);
		struct stat st;
		CHECK(stat(e, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0750);
		CHECK_EQ(it_count_entries(e), 0);
		CHECK_EQ(count_temps(it_dir()), 0);
		CHECK_SBX(restore_via(dir, in, 1, 1, VIA_STREAM, &res, &err), &err);
		CHECK_EQ(res.entries, 0);
		check_old(dir, &old);
		CHECK_EQ(count_temps(it_path("p")), 0);
	}
	/* and into a directory that is not there yet */
	CHECK_SBX(restore_via(it_path("e3"), endonly, 1, 1, VIA_FROM_PATH, &res, &err), &err);
	CHECK_EQ(it_count_entries(it_path("e3")), 0);
	CHECK(lexists(it_path("e3")));
	/* a whole archive, with zeros after its end (any amount: the last record's padding) */
	for (int via = VIA_STREAM; via <= VIA_CHUNKS; via++) {
		for (int merge = 0; merge <= 1; merge++) {
			const char *t = kp(merge ? "gm" : "g");
			CHECK_SBX(restore_via(t, good, merge, 0, via, &res, &err), &err);
			CHECK_EQ(res.entries, 1);
			char *m = pjoin(t, "m");
			struct stat st;
			CHECK(lstat(m, &st) == 0 && st.st_size == 12);
			free(m);
		}
	}
	wait_journal_empty(5000);
	snap_free(&old);
	return 0;
}

/* The offset after the end-of-archive blocks of an uncompressed archive (ustar and pax
 * headers with octal sizes, as our backups write them). */
static size_t archive_end(const uint8_t *a, size_t n)
{
	static const uint8_t zero[512];
	size_t pos = 0;
	while (pos + 512 <= n && memcmp(a + pos, zero, 512) != 0) {
		char sz[13];
		memcpy(sz, a + pos + 124, 12);
		sz[12] = '\0';
		unsigned long long len = strtoull(sz, NULL, 8);
		pos += 512 + (size_t)((len + 511) / 512 * 512);
	}
	CHECKF(pos + 1024 <= n && memcmp(a + pos + 512, zero, 512) == 0, "no end-of-archive blocks at %zu", pos);
	return pos + 1024;
}

static uint8_t *slurp(const char *path, size_t *n)
{
	struct stat st;
	CHECK(stat(path, &st) == 0);
	uint8_t *p = malloc((size_t)st.st_size + 1);
	CHECK(p != NULL);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0 && read(fd, p, (size_t)st.st_size) == st.st_size);
	close(fd);
	*n = (size_t)st.st_size;
	return p;
}

/* A small tree for the truncations: a few files, a directory, links. */
static const char *small_tree(struct snap *s)
{
	const char *src = kp("small");
	mk(src, 0755);
	char *p = pjoin(src, "a");
	uint8_t data[5000];
	it_fill(data, sizeof(data), 7);
	put(p, data, 1000, 0644);
	free(p);
	p = pjoin(src, "b");
	put(p, data, sizeof(data), 0600);
	free(p);
	p = pjoin(src, "sub");
	mk(p, 0750);
	free(p);
	p = pjoin(src, "sub/c");
	put(p, "c\n", 2, 0644);
	free(p);
	p = pjoin(src, "sub/link");
	CHECK(symlink("../a", p) == 0);
	free(p);
	char *a = pjoin(src, "a"), *h = pjoin(src, "sub/hard");
	CHECK(link(a, h) == 0);
	free(a);
	free(h);
	p = pjoin(src, "sub/c");
	set_times(p, 1600000000, 0, 1600000000, 123456789);
	free(p);
	set_times(src, 1600000000, 0, 1600000000, 5);
	snap_take(s, src);
	return src;
}

/* An archive made by our own backup, cut at every 512-byte boundary (and a few others):
 * refused in both modes, dir as it was, until the cut leaves the end-of-archive blocks;
 * from there (the last record's padding) it restores the tree. */
static int case_truncated(void)
{
	start();
	struct snap src, old;
	const char *t = small_tree(&src);
	const char *dir = old_dir(&old);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	const char *arch = kp("small.tar");
	backup_file(t, &bo, arch, &rec);
	sbx_backup_record_free(&rec);
	size_t n;
	uint8_t *a = slurp(arch, &n);
	size_t end = archive_end(a, n);
	CHECKF(end < n, "the archive ends at %zu of %zu", end, n);
	/* every 512-byte boundary, and a few cuts inside a block */
	size_t ncuts = 0, *cuts = malloc((n / 512 + 8) * sizeof(*cuts));
	CHECK(cuts != NULL);
	for (size_t cut = 0; cut <= n; cut += 512)
		cuts[ncuts++] = cut;
	const size_t odd[] = {1, 100, 700, end - 1024 + 100, end - 300, end - 1};
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++)
		cuts[ncuts++] = odd[i];
	unsigned nref = 0, nok = 0;
	for (size_t k = 0; k < ncuts; k++) {
		size_t cut = cuts[k];
		const char *in = kp("cut.tar");
		put(in, a, cut, 0644);
		char what[64];
		SPRINTF(what, "cut at %zu of %zu (end at %zu)", cut, n, end);
		if (cut < end) {
			refused(dir, &old, in, 0, 0, VIA_STREAM, NULL, what);
			refused(dir, &old, in, 1, 0, VIA_STREAM, NULL, what);
			nref++;
			continue;
		}
		struct sbx_error err;
		struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
		for (int merge = 0; merge <= 1; merge++) {
			const char *r = kp("ok");
			shell("rm -rf '%s'", r);
			CHECK_SBX(restore_via(r, in, merge, 0, VIA_STREAM, &res, &err), &err);
			CHECK_EQ(res.entries, src.n);
			struct snap got;
			snap_take(&got, r);
			snap_compare(&src, &got, CMP_RESTORED);
			snap_free(&got);
		}
		nok++;
	}
	printf("%zu-byte archive, end-of-archive blocks end at %zu: %u cuts refused in both modes, %u restored\n", n,
	       end, nref, nok);
	CHECK(nref >= 10 && nok >= 1);
	free(cuts);
	free(a);
	snap_free(&src);
	snap_free(&old);
	return 0;
}

/* gzip and zstd: the compressed stream cut short, with bytes after it, or whole but
 * holding a cut archive: refused in both modes, dir as it was. */
static int case_truncated_compressed(void)
{
	start();
	struct snap src, old;
	const char *t = small_tree(&src);
	const char *dir = old_dir(&old);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	const char *plain = kp("small.tar");
	backup_file(t, &bo, plain, &rec);
	sbx_backup_record_free(&rec);
	size_t pn;
	uint8_t *pa = slurp(plain, &pn);
	size_t end = archive_end(pa, pn);
	for (int comp = SBX_COMPRESS_GZIP; comp <= SBX_COMPRESS_ZSTD; comp++) {
		const char *tool = comp == SBX_COMPRESS_GZIP ? "gzip" : "zstd";
		bo.compression = comp;
		const char *arch = kp(comp == SBX_COMPRESS_GZIP ? "small.tar.gz" : "small.tar.zst");
		backup_file(t, &bo, arch, &rec);
		sbx_backup_record_free(&rec);
		size_t n;
		uint8_t *a = slurp(arch, &n);
		/* the compressed stream cut: in its header, its data, its trailer (gzip: CRC and
		 * size, the last 8 bytes; zstd: the frame's checksum, the last 4) */
		const size_t cuts[] = {1, 10, n / 3, n / 2, n - 12, n - 8, n - 4, n - 1};
		for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
			const char *in = kp("cut");
			put(in, a, cuts[i], 0644);
			char what[64];
			SPRINTF(what, "%s stream cut at %zu of %zu", tool, cuts[i], n);
			refused(dir, &old, in, 0, 0, VIA_STREAM, NULL, what);
			refused(dir, &old, in, 1, 0, VIA_STREAM, NULL, what);
		}
		/* bytes after the compressed stream, even zeros */
		for (int z = 0; z < 2; z++) {
			uint8_t *b = malloc(n + 512);
			CHECK(b != NULL);
			memcpy(b, a, n);
			if (z)
				memset(b + n, 0, 512);
			else
				memcpy(b + n, "trailing garbage", 16);
			const char *in = kp("after");
			put(in, b, n + (z ? 512 : 16), 0644);
			free(b);
			char what[64];
			SPRINTF(what, "%s stream and %s after it", tool, z ? "zeros" : "garbage");
			refused(dir, &old, in, 0, 0, VIA_STREAM, NULL, what);
			refused(dir, &old, in, 1, 0, VIA_STREAM, NULL, what);
		}
		free(a);
		/* whole compressed streams of a cut archive (by the compressor itself) */
		if (!have(tool)) {
			printf("no %s: compressed cut archives not checked\n", tool);
			continue;
		}
		const size_t tcuts[] = {512, 1024, end - 1536, end - 1024, end - 512};
		for (size_t i = 0; i < sizeof(tcuts) / sizeof(tcuts[0]); i++) {
			const char *cut = kp("cut.tar");
			put(cut, pa, tcuts[i], 0644);
			const char *in = kp("cut.tar.c");
			CHECK_EQ(shell("%s -q -c < '%s' > '%s'", tool, cut, in), 0);
			char what[64];
			SPRINTF(what, "%s of the archive cut at %zu", tool, tcuts[i]);
			refused(dir, &old, in, 0, 0, VIA_STREAM, NULL, what);
			refused(dir, &old, in, 1, 0, VIA_STREAM, NULL, what);
		}
		/* the whole archive and data after it, compressed together: refused; zeros after it:
		 * taken */
		const char *in = kp("tail.tar");
		uint8_t *b = malloc(pn + 4096);
		CHECK(b != NULL);
		memcpy(b, pa, pn);
		memset(b + pn, 0, 4096);
		memcpy(b + pn + 1000, "x", 1);
		put(in, b, pn + 4096, 0644);
		const char *inc = kp("tail.tar.c");
		CHECK_EQ(shell("%s -q -c < '%s' > '%s'", tool, in, inc), 0);
		char what[64];
		SPRINTF(what, "%s of the archive and a byte after it", tool);
		refused(dir, &old, inc, 0, 0, VIA_STREAM, NULL, what);
		refused(dir, &old, inc, 1, 0, VIA_STREAM, NULL, what);
		memset(b + pn, 0, 4096);
		put(in, b, pn + 4096, 0644);
		free(b);
		CHECK_EQ(shell("%s -q -c < '%s' > '%s'", tool, in, inc), 0);
		struct sbx_error err;
		struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
		const char *r = kp(comp == SBX_COMPRESS_GZIP ? "okgz" : "okzst");
		CHECK_SBX(restore_via(r, inc, 0, 0, VIA_STREAM, &res, &err), &err);
		struct snap got;
		snap_take(&got, r);
		snap_compare(&src, &got, CMP_RESTORED);
		snap_free(&got);
		printf("%s: cut streams, bytes after the stream and cut archives refused in both modes\n", tool);
	}
	free(pa);
	snap_free(&src);
	snap_free(&old);
	return 0;
}

/* Merge mode extracts beside dir, then merges: a refused member leaves dir as it was too;
 * a merge still replaces files, keeps directories (giving them the archive's mode and
 * times), links to files that only dir has, and works on / itself. */
static int case_merge_staged(void)
{
	start();
	const char *d = kp("md");
	mk(d, 0755);
	char *p;
#define MD(name) (free(p), p = pjoin(d, name))
	p = NULL;
	MD("keep");
	put(p, "kept", 4, 0644);
	MD("f");
	put(p, "file", 4, 0644);
	MD("sub");
	mk(p, 0700);
	MD("sub/old");
	put(p, "old", 3, 0644);
	MD("full");
	mk(p, 0755);
	MD("full/x");
	put(p, "x", 1, 0644);
	MD("ln");
	CHECK(symlink(it_dir(), p) == 0);
	MD("sub");
	set_times(p, 1500000000, 0, 1500000000, 0);
	free(p);
	set_times(d, 1500000000, 0, 1500000000, 0);
#undef MD
	struct snap old;
	snap_take(&old, d);
	static const struct {
		const char *name;
		int code;
		const char *path;
	} bad[] = {
		{"through a symlink of dir", EPERM, "ln"},
		{"a file over a non-empty directory", EEXIST, "full"},
		{"below a file of dir", ENOTDIR, "f"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct abuf b = {0};
		ab_file(&b, "new", "new\n");
		ab_header(&b, "sub", '5', 0755, 0, NULL);
		ab_file(&b, "sub/new", "new\n");
		if (i == 0)
			ab_file(&b, "ln/evil", "evil\n");
		else if (i == 1)
			ab_file(&b, "full", "file\n");
		else
			ab_file(&b, "f/below", "below\n");
		ab_add(&b, NULL, 1024);
		const char *in = ab_write(&b, "bad.tar");
		struct sbx_error err;
		struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
		CHECKF(restore_via(d, in, 1, 0, VIA_STREAM, &res, &err) < 0, "%s: merged", bad[i].name);
		CHECKF(err.code == bad[i].code && strcmp(err.path, bad[i].path) == 0, "%s: %s (path %s)", bad[i].name,
		       it_errstr(&err), err.path);
		check_old(d, &old);
		CHECK_EQ(count_temps(it_dir()), 0);
		CHECK(count_entries(it_dir()) > 0 && !lexists(it_path("evil")));
	}
	snap_free(&old);
	/* a good one */
	struct abuf b = {0};
	ab_file(&b, "f", "new f\n");
	ab_header(&b, "sub", '5', 0750, 0, NULL);
	ab_file(&b, "sub/new", "new\n");
	ab_header(&b, "hl", '1', 0644, 0, "keep");
	ab_header(&b, "deep/er", '5', 0700, 0, NULL);
	ab_file(&b, "deep/er/z", "z\n");
	ab_add(&b, NULL, 1024);
	const char *in = ab_write(&b, "good.tar");
	struct sbx_error err;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	CHECK_SBX(restore_via(d, in, 1, 0, VIA_STREAM, &res, &err), &err);
	struct stat st, st2;
	CHECK(lstat(it_path("md/f"), &st) == 0 && st.st_size == 6);
	CHECK(lstat(it_path("md/sub/old"), &st) == 0);
	CHECK(lstat(it_path("md/sub/new"), &st) == 0);
	CHECK(lstat(it_path("md/sub"), &st) == 0 && (st.st_mode & 07777) == 0750 && st.st_mtim.tv_sec == 1600000000);
	CHECK(lstat(it_path("md/hl"), &st) == 0 && lstat(it_path("md/keep"), &st2) == 0 && st.st_ino == st2.st_ino);
	CHECK(lstat(it_path("md/deep/er/z"), &st) == 0);
	CHECK(lstat(it_path("md/deep/er"), &st) == 0 && (st.st_mode & 07777) == 0700);
	CHECK(lstat(it_path("md/full/x"), &st) == 0 && lstat(it_path("md/ln"), &st) == 0 && S_ISLNK(st.st_mode));
	CHECK_EQ(count_temps(it_dir()), 0);
	CHECK_EQ(count_temps(it_path("md")), 0);
	wait_journal_empty(5000);

	/* merging into / (of a daemon confined to a root): the temp directory goes inside */
	const char *root = kp("root");
	mk(root, 0755);
	char s2[PATH_MAX], st2dir[PATH_MAX];
	SPRINTF(s2, "%s", it_path("shim2.sock"));
	SPRINTF(st2dir, "%s", it_path("state2"));
	it_daemon_start("shim2", "--listen", it_unix_target(s2), "--state-dir", st2dir, "--root", root, NULL);
	struct sbx_client *c2 = it_connect(it_unix_target(s2), NULL);
	struct snap rold;
	snap_take(&rold, root);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.merge = 1;
	/* refused: the root as it was (its times too) */
	{
		struct abuf nb = {0};
		ab_file(&nb, "etc/conf", "conf\n");
		const char *noend = ab_write(&nb, "noend.tar");
		CHECK(sbx_restore_from_file(c2, NULL, "/", &ro, noend, &res, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_REMOTE, EBADMSG);
	}
	struct snap rnow;
	snap_take(&rnow, root);
	snap_compare(&rold, &rnow, CMP_ALL);
	snap_free(&rnow);
	snap_free(&rold);
	b = (struct abuf){0};
	ab_file(&b, "etc/conf", "conf\n");
	ab_add(&b, NULL, 1024);
	in = ab_write(&b, "conf.tar");
	CHECK_SBX(sbx_restore_from_file(c2, NULL, "/", &ro, in, &res, &err), &err);
	CHECK(lstat(it_path("root/etc/conf"), &st) == 0 && st.st_size == 5);
	CHECK_EQ(count_temps(root), 0);
	sbx_client_close(c2);
	return 0;
}

/* Each case ends by closing its client (the daemons are stopped by the harness). */
#define CASE(name)                                \
	static int case_##name##_(void)           \
	{                                         \
		int rc = case_##name();           \
		if (client != NULL)               \
			sbx_client_close(client); \
		client = NULL;                    \
		return rc;                        \
	}
CASE(roundtrip)
CASE(names)
CASE(gnu_tar)
CASE(malicious)
CASE(merge)
CASE(excludes)
CASE(mounts)
CASE(unreadable)
CASE(changed)
CASE(bulk)
CASE(concurrent)
CASE(to_from_path)
CASE(cancel_backup)
CASE(cancel_restore)
CASE(disconnect_restore)
CASE(sigkill_restore)
CASE(progress)
CASE(confined)
CASE(whole_archive)
CASE(truncated)
CASE(truncated_compressed)
CASE(merge_staged)

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"roundtrip", case_roundtrip_},
		{"names", case_names_},
		{"gnu_tar", case_gnu_tar_},
		{"malicious", case_malicious_},
		{"merge", case_merge_},
		{"excludes", case_excludes_},
		{"mounts", case_mounts_},
		{"unreadable", case_unreadable_},
		{"changed", case_changed_},
		{"bulk", case_bulk_},
		{"concurrent", case_concurrent_},
		{"to_from_path", case_to_from_path_},
		{"cancel_backup", case_cancel_backup_},
		{"cancel_restore", case_cancel_restore_},
		{"disconnect_restore", case_disconnect_restore_},
		{"sigkill_restore", case_sigkill_restore_},
		{"progress", case_progress_},
		{"confined", case_confined_},
		{"whole_archive", case_whole_archive_},
		{"truncated", case_truncated_},
		{"truncated_compressed", case_truncated_compressed_},
		{"merge_staged", case_merge_staged_},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
