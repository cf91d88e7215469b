/* fs.c: checking request paths and resolving them, confined beneath --root with openat2. */
#include "fs.h"
#include "fsctx.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452 /* Linux 6.6; the same number on every architecture */
#endif

static struct {
	int fd;     /* AT_FDCWD without confinement */
	char *path; /* NULL without confinement */
	size_t len;
} root = {.fd = AT_FDCWD};

int fs_init(const char *dir, struct shim_err *err)
{
	if (dir == NULL || strcmp(dir, "/") == 0)
		return 0;
	if (dir[0] != '/')
		return err_set(err, EINVAL, dir, "--root must be an absolute path");
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, dir, "open --root");
	/* Confinement needs openat2's RESOLVE_IN_ROOT (Linux 5.6): refuse to start
	 * rather than pretend. */
	struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT};
	int t = (int)syscall(SYS_openat2, fd, ".", &how, sizeof(how));
	if (t < 0) {
		int e = errno;
		close(fd);
		return err_set(err, e, dir, "openat2 (needed for --root)");
	}
	close(t);
	char real[PATH_MAX];
	if (realpath(dir, real) == NULL) {
		int e = errno;
		close(fd);
		return err_set(err, e, dir, "realpath");
	}
	root.fd = fd;
	root.path = strdup(real);
	root.len = strlen(real);
	return 0;
}

const char *fs_root(void)
{
	return root.path;
}

int fs_root_stat(struct stat *st)
{
	if (root.path == NULL)
		return stat("/", st);
	return fstat(root.fd, st);
}

int fs_path_get(const ProtobufCBinaryData *in, struct fs_path *out, struct shim_err *err)
{
	if (in->len == 0)
		return err_set(err, EINVAL, "", "empty path");
	if (memchr(in->data, '\0', in->len) != NULL)
		return err_setn(err, EINVAL, in->data, in->len, "path holds a NUL byte");
	if (in->data[0] != '/')
		return err_setn(err, EINVAL, in->data, in->len, "path must be absolute");
	if (in->len >= sizeof(out->abs))
		return err_setn(err, ENAMETOOLONG, in->data, in->len < 1000 ? in->len : 1000,
				"path longer than %d bytes", PATH_MAX - 1);
	memcpy(out->abs, in->data, in->len);
	out->abs[in->len] = '\0';
	out->len = in->len;
	return 0;
}

/* ---- resolution ----
 *
 * A path is resolved with the kernel's help in one openat2(RESOLVE_NO_SYMLINKS)
 * (beneath the root with --root): most paths hold no symlink and are done. On ELOOP
 * the path is walked here, one component at a time with O_PATH|O_NOFOLLOW fds, so
 * that every symlink on the way is looked at before it is followed:
 *  - a link is followed only when its owner is the acting user (fs_ctx_uid()), the
 *    shim's own (geteuid()) or the owner of what it points to (for a chain, each
 *    link against the final object; a dangling link, to create through it, only
 *    when it is the acting or own user's). Else EACCES naming the link: a user who
 *    owns a directory cannot point the names in it at other users' files;
 *  - FS_NO_SYMLINKS refuses any link (ELOOP), FS_NO_FOLLOW one in the last
 *    component;
 *  - under --root, an absolute target starts again at the root and ".." never
 *    climbs above it: ".." drops the last component of the physical path walked so
 *    far and reopens that path with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS);
 *  - the last component is checked before anything is done to it, then opened
 *    with O_NOFOLLOW and the same inode verified; O_TRUNC is applied (ftruncate)
 *    only after that. A race that changes a name meanwhile makes the walk start
 *    over, a bounded number of times (then EAGAIN). */

#define WALK_MAX_LINKS 40 /* the kernel's MAXSYMLINKS */
#define WALK_RETRIES 8
#define WALK_REST (2 * PATH_MAX + 2)
#define WALK_RETRY (-2)

static _Atomic bool have_openat2 = true; /* cleared on ENOSYS (never with --root: fs_init checked) */

struct walk_link {
	uid_t uid;
	size_t mark;    /* the rest's length when the link was met: once the rest is this */
			/* short again, its target is resolved */
	char path[160]; /* where the link is, for the error */
};

struct walk {
	const char *errpath, *what;
	struct shim_err *err;
	int flags;
	mode_t mode;
	unsigned rflags;
	int dfd;         /* the directory reached (O_PATH) */
	struct stat dst; /* its stat */
	size_t plen;     /* its physical path, as the client sees it ("" for the root) */
	char pre[PATH_MAX];
	size_t pos; /* what is left to resolve: rest[pos..WALK_REST) */
	char rest[WALK_REST];
	int followed;
	int npend; /* links whose target is not resolved yet */
	struct walk_link pend[WALK_MAX_LINKS];
};

#define WALK_LEFT(w) (WALK_REST - (w)->pos)

static int walk_fail(struct walk *w, int code)
{
	return err_set(w->err, code, w->errpath, "%s", w->what);
}

static bool link_ok(uid_t link_uid, const struct stat *to)
{
	return link_uid == fs_ctx_uid() || link_uid == geteuid() || (to != NULL && link_uid == to->st_uid);
}

/* Check the links whose targets end at the object just reached (st; NULL: a
 * dangling link's name, about to be created). */
static int walk_settle(struct walk *w, const struct stat *st)
{
	while (w->npend > 0 && w->pend[w->npend - 1].mark >= WALK_LEFT(w)) {
		const struct walk_link *l = &w->pend[w->npend - 1];
		if (!link_ok(l->uid, st)) {
			if (st == NULL)
				return err_set(
					w->err, EACCES, w->errpath,
					"not following the dangling symlink %s to create a file: its owner (uid %u) "
					"is not the acting user",
					l->path, (unsigned)l->uid);
			return err_set(
				w->err, EACCES, w->errpath,
				"not following the symlink %s: its owner (uid %u) is neither the acting user nor "
				"the owner (uid %u) of what it points to",
				l->path, (unsigned)l->uid, (unsigned)st->st_uid);
		}
		w->npend--;
	}
	return 0;
}

/* An O_PATH fd of the root, and the walk there. */
static int walk_to_root(struct walk *w)
{
	int fd = root.path != NULL ? fcntl(root.fd, F_DUPFD_CLOEXEC, 0) :
				     openat(AT_FDCWD, "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return walk_fail(w, errno);
	if (fstat(fd, &w->dst) < 0) {
		int e = errno;
		close(fd);
		return walk_fail(w, e);
	}
	if (w->dfd >= 0)
		close(w->dfd);
	w->dfd = fd;
	w->plen = 0;
	w->pre[0] = '\0';
	return 0;
}

/* "..": the parent of the physical path walked so far, reopened from the root
 * without following anything (never above the root). */
static int walk_up(struct walk *w)
{
	if (w->plen == 0)
		return 0; /* the root's ".." is the root */
	while (w->plen > 0 && w->pre[w->plen - 1] != '/')
		w->plen--;
	if (w->plen > 0)
		w->plen--; /* the slash */
	w->pre[w->plen] = '\0';
	if (w->plen == 0)
		return walk_to_root(w);
	int fd;
	if (have_openat2) {
		struct open_how how = {
			.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
			.resolve = RESOLVE_NO_SYMLINKS |
				   (root.path != NULL ? RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS : 0),
		};
		do {
			fd = (int)syscall(SYS_openat2, root.fd, root.path != NULL ? w->pre + 1 : w->pre, &how,
					  sizeof(how));
		} while (fd < 0 && errno == EAGAIN);
	} else {
		fd = openat(w->dfd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
	}
	if (fd < 0) {
		if (errno == ELOOP || errno == ENOENT || errno == ENOTDIR)
			return WALK_RETRY; /* changed meanwhile */
		return walk_fail(w, errno);
	}
	if (fstat(fd, &w->dst) < 0) {
		int e = errno;
		close(fd);
		return walk_fail(w, e);
	}
	close(w->dfd);
	w->dfd = fd;
	return 0;
}

/* "pre/name" into buf, cut to its size (it is only for messages). */
static void walk_where(const struct walk *w, const char *name, char *buf, size_t size)
{
	size_t n = 0;
	for (const char *s = w->pre; *s != '\0' && n + 1 < size; s++)
		buf[n++] = *s;
	if (n + 1 < size)
		buf[n++] = '/';
	for (const char *s = name; *s != '\0' && n + 1 < size; s++)
		buf[n++] = *s;
	buf[n] = '\0';
}

/* Follow the link lfd (its stat lst), met as name in the directory walked to. */
static int walk_link(struct walk *w, int lfd, const char *name, const struct stat *lst)
{
	char where[sizeof(w->pend[0].path)];
	walk_where(w, name, where, sizeof(where));
	if (w->rflags & FS_NO_SYMLINKS)
		return err_set(w->err, ELOOP, w->errpath, "%s is a symlink (no_symlinks)", where);
	if (++w->followed > WALK_MAX_LINKS || w->npend >= WALK_MAX_LINKS)
		return err_set(w->err, ELOOP, w->errpath, "too many levels of symlinks");
	char target[PATH_MAX];
	ssize_t n = readlinkat(lfd, "", target, sizeof(target));
	if (n < 0)
		return walk_fail(w, errno);
	if (n == 0)
		return walk_fail(w, ENOENT);
	if ((size_t)n >= sizeof(target))
		return walk_fail(w, ENAMETOOLONG);
	struct walk_link *l = &w->pend[w->npend++];
	l->uid = lst->st_uid;
	l->mark = WALK_LEFT(w);
	memcpy(l->path, where, sizeof(l->path));
	size_t need = (size_t)n + (WALK_LEFT(w) > 0 ? 1 : 0);
	if (need > w->pos)
		return walk_fail(w, ENAMETOOLONG);
	if (WALK_LEFT(w) > 0)
		w->rest[--w->pos] = '/';
	w->pos -= (size_t)n;
	memcpy(w->rest + w->pos, target, (size_t)n);
	return 0;
}

/* The last component: name in the directory walked to, opened with the caller's
 * flags. Returns an fd, -1, WALK_RETRY, or 1 when name was a link that the walk
 * goes on with. literal: name is the path's own last component (not the end of a
 * link's target), where O_NOFOLLOW and FS_NO_FOLLOW apply. */
static int walk_last(struct walk *w, const char *name, bool literal, int *out)
{
	bool nofollow = literal && ((w->flags & O_NOFOLLOW) || ((w->flags & O_CREAT) && (w->flags & O_EXCL)));
	struct stat st;
	bool exists = true;
	if (strcmp(name, ".") == 0) {
		st = w->dst;
	} else {
		int lfd = openat(w->dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (lfd < 0) {
			if (errno != ENOENT || !(w->flags & O_CREAT))
				return walk_fail(w, errno);
			exists = false;
		} else if (fstat(lfd, &st) < 0) {
			int e = errno;
			close(lfd);
			return walk_fail(w, e);
		}
		if (exists && S_ISLNK(st.st_mode) && !nofollow) {
			if (literal && (w->rflags & (FS_NO_FOLLOW | FS_NO_SYMLINKS))) {
				close(lfd);
				if (w->rflags & FS_NO_SYMLINKS)
					return err_set(w->err, ELOOP, w->errpath, "%s is a symlink (no_symlinks)",
						       w->errpath);
				return err_set(w->err, ELOOP, w->errpath, "%s is a symlink (no_follow)", w->errpath);
			}
			int rc = walk_link(w, lfd, name, &st);
			close(lfd);
			return rc < 0 ? rc : 1;
		}
		if (lfd >= 0)
			close(lfd);
	}
	/* what is there (or that nothing is) passes the links that led here, before
	 * anything is done to it */
	if (walk_settle(w, exists ? &st : NULL) < 0)
		return -1;
	int fd = openat(w->dfd, name, (w->flags & ~O_TRUNC) | O_NOFOLLOW | O_CLOEXEC, w->mode);
	if (fd < 0) {
		if (errno == ELOOP && !(exists && S_ISLNK(st.st_mode)))
			return WALK_RETRY; /* replaced by a link meanwhile */
		return walk_fail(w, errno);
	}
	struct stat fst;
	if (fstat(fd, &fst) < 0) {
		int e = errno;
		close(fd);
		return walk_fail(w, e);
	}
	if (exists && (fst.st_dev != st.st_dev || fst.st_ino != st.st_ino)) {
		close(fd);
		return WALK_RETRY;
	}
	if ((w->flags & O_TRUNC) && S_ISREG(fst.st_mode) && ftruncate(fd, 0) < 0) {
		int e = errno;
		close(fd);
		return walk_fail(w, e);
	}
	*out = fd;
	return 0;
}

static int walk_run(struct walk *w, const char *path)
{
	size_t len = strlen(path);
	bool slash_end = len > 1 && path[len - 1] == '/';
	w->dfd = -1;
	w->followed = w->npend = 0;
	if (path[0] != '/')
		return walk_fail(w, EINVAL);
	w->pos = WALK_REST - len - (slash_end ? 1 : 0);
	memcpy(w->rest + w->pos, path, len);
	if (slash_end)
		w->rest[WALK_REST - 1] = '.'; /* "dir/" is "dir/.": a directory, followed */
	int rc = 0;
	while (rc == 0) {
		if (WALK_LEFT(w) == 0) {
			rc = walk_fail(w, ENOENT); /* (cannot happen: every step leaves something) */
			break;
		}
		if (w->rest[w->pos] == '/') {
			while (w->pos < WALK_REST && w->rest[w->pos] == '/')
				w->pos++;
			if ((rc = walk_to_root(w)) < 0 || (rc = walk_settle(w, &w->dst)) < 0)
				break;
			if (WALK_LEFT(w) == 0) {
				/* the root itself */
				int fd = -1;
				rc = walk_last(w, ".", true, &fd);
				if (rc == 0)
					rc = fd;
				break;
			}
			continue;
		}
		const char *c = w->rest + w->pos;
		size_t clen = 0;
		while (w->pos + clen < WALK_REST && c[clen] != '/')
			clen++;
		if (clen > NAME_MAX) {
			rc = walk_fail(w, ENAMETOOLONG);
			break;
		}
		char name[NAME_MAX + 1];
		memcpy(name, c, clen);
		name[clen] = '\0';
		w->pos += clen;
		while (w->pos < WALK_REST && w->rest[w->pos] == '/')
			w->pos++;
		bool last = WALK_LEFT(w) == 0;
		/* the path's own last component, not the end of a link's target */
		bool literal = last && !(w->npend > 0 && w->pend[0].mark == 0);
		bool dot = strcmp(name, ".") == 0, dotdot = strcmp(name, "..") == 0;
		if (dotdot && (rc = walk_up(w)) != 0)
			break;
		if (last) {
			int fd = -1;
			rc = walk_last(w, dot || dotdot ? "." : name, literal, &fd);
			if (rc == 1) {
				rc = 0;
				continue;
			}
			if (rc == 0)
				rc = fd;
			break;
		}
		if (dot || dotdot) {
			rc = walk_settle(w, &w->dst);
			continue;
		}
		int fd = openat(w->dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0) {
			rc = walk_fail(w, errno);
			if (fd >= 0)
				close(fd);
			break;
		}
		if (S_ISLNK(st.st_mode)) {
			rc = walk_link(w, fd, name, &st);
			close(fd);
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			close(fd);
			rc = walk_fail(w, ENOTDIR);
			break;
		}
		if (w->plen + 1 + clen >= sizeof(w->pre)) {
			close(fd);
			rc = walk_fail(w, ENAMETOOLONG);
			break;
		}
		w->pre[w->plen++] = '/';
		memcpy(w->pre + w->plen, name, clen + 1);
		w->plen += clen;
		close(w->dfd);
		w->dfd = fd;
		w->dst = st;
		rc = walk_settle(w, &w->dst);
	}
	if (w->dfd >= 0)
		close(w->dfd);
	w->dfd = -1;
	return rc;
}

/* Open path (absolute, as the client gave it) beneath the root with flags and
 * mode, under the rules above (rflags: FS_NO_FOLLOW, FS_NO_SYMLINKS). An fd, or -1
 * with err naming errpath ("what" the message of a plain failure). */
static int resolve(const char *path, int flags, mode_t mode, unsigned rflags, const char *errpath, const char *what,
		   struct shim_err *err)
{
	flags |= O_CLOEXEC;
	if (!(flags & (O_CREAT | O_TMPFILE)))
		mode = 0;
	if (have_openat2) {
		const char *rel = path;
		if (root.path != NULL) {
			while (*rel == '/')
				rel++;
			if (*rel == '\0')
				rel = ".";
		}
		/* Magic links (/proc/self/fd/N) could jump anywhere: never followed by
		 * the kernel here (RESOLVE_NO_SYMLINKS implies RESOLVE_NO_MAGICLINKS). */
		struct open_how how = {
			.flags = (uint64_t)flags,
			.mode = mode,
			.resolve = RESOLVE_NO_SYMLINKS |
				   (root.path != NULL ? RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS : 0),
		};
		long fd;
		do {
			fd = syscall(SYS_openat2, root.fd, rel, &how, sizeof(how));
		} while (fd < 0 && errno == EAGAIN);
		if (fd >= 0)
			return (int)fd;
		if (errno == ENOSYS && root.path == NULL)
			have_openat2 = false;
		else if (errno != ELOOP)
			return err_set(err, errno, errpath, "%s", what);
	}
	struct walk *w = malloc(sizeof(*w));
	if (w == NULL)
		return err_set(err, ENOMEM, errpath, "%s", what);
	w->errpath = errpath;
	w->what = what;
	w->err = err;
	w->flags = flags & ~O_CLOEXEC;
	w->mode = mode;
	w->rflags = rflags;
	int rc = WALK_RETRY;
	for (int tries = 0; tries < WALK_RETRIES && rc == WALK_RETRY; tries++)
		rc = walk_run(w, path);
	free(w);
	if (rc == WALK_RETRY)
		return err_set(err, EAGAIN, errpath, "%s: the path kept changing while it was resolved", what);
	return rc;
}

int fs_open(const struct fs_path *p, int flags, mode_t mode, struct shim_err *err)
{
	return resolve(p->abs, flags, mode, fs_ctx_resolve(), p->abs, "open", err);
}

int fs_open_parent(const struct fs_path *p, char name_buf[NAME_MAX + 1], struct shim_err *err)
{
	char dir[PATH_MAX];
	size_t len = p->len;
	while (len > 1 && p->abs[len - 1] == '/')
		len--;
	if (len == 1) {
		/* "/" itself: its "parent" is the root, the name "." */
		strcpy(name_buf, ".");
		return resolve("/", O_PATH | O_DIRECTORY, 0, 0, p->abs, "open", err);
	}
	size_t slash = len - 1;
	while (slash > 0 && p->abs[slash] != '/')
		slash--;
	size_t nlen = len - slash - 1;
	if (nlen > NAME_MAX)
		return err_set(err, ENAMETOOLONG, p->abs, "file name longer than %d bytes", NAME_MAX);
	if ((nlen == 1 && p->abs[slash + 1] == '.') || (nlen == 2 && memcmp(p->abs + slash + 1, "..", 2) == 0)) {
		/* "." or "..": the entry is the directory the whole path names. Taking the
		 * name literally against the parent fd would step above --root ("/.." is
		 * the root's own parent to fstatat, fchownat, utimensat...), so resolve the
		 * whole path confined and hand back that directory as ".". */
		strcpy(name_buf, ".");
		return resolve(p->abs, O_PATH | O_DIRECTORY, 0, fs_ctx_resolve(), p->abs, "open", err);
	}
	memcpy(name_buf, p->abs + slash + 1, nlen);
	name_buf[nlen] = '\0';
	size_t dlen = slash == 0 ? 1 : slash;
	memcpy(dir, p->abs, dlen);
	dir[dlen] = '\0';
	/* the directory is followed whatever FS_NO_FOLLOW says (it is not the last
	 * component of the request's path); FS_NO_SYMLINKS holds for it too */
	return resolve(dir, O_PATH | O_DIRECTORY, 0, fs_ctx_resolve() & FS_NO_SYMLINKS, p->abs, "open parent directory",
		       err);
}

int fs_open_parents(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b, struct fs_parent *pa,
		    struct fs_parent *pb, struct shim_err *err)
{
	pa->dfd = pb->dfd = -1;
	if (fs_path_get(a, &pa->p, err) < 0 || fs_path_get(b, &pb->p, err) < 0)
		return -1;
	pa->dfd = fs_open_parent(&pa->p, pa->name, err);
	if (pa->dfd < 0)
		return -1;
	pb->dfd = fs_open_parent(&pb->p, pb->name, err);
	return pb->dfd < 0 ? -1 : 0;
}

int fs_stat(const struct fs_path *p, bool follow, struct stat *st, struct shim_err *err)
{
	if (follow) {
		int cleanup_close fd = fs_open(p, O_PATH, 0, err);
		if (fd < 0)
			return -1;
		if (fstat(fd, st) < 0)
			return err_set(err, errno, p->abs, "stat");
		return 0;
	}
	char name[NAME_MAX + 1];
	int cleanup_close dfd = fs_open_parent(p, name, err);
	if (dfd < 0)
		return -1;
	if (fstatat(dfd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, p->abs, "lstat");
	return 0;
}

static Shim__V1__FileType file_type(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFREG:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_FILE;
	case S_IFDIR:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	case S_IFLNK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_SYMLINK;
	case S_IFIFO:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_FIFO;
	case S_IFSOCK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_SOCKET;
	case S_IFBLK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_BLOCK_DEVICE;
	case S_IFCHR:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_CHARACTER_DEVICE;
	default:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_UNKNOWN;
	}
}

void fs_fill_stat(Shim__V1__FileStat *out, Shim__V1__Timestamp ts[3], const struct stat *st, const char *target,
		  size_t target_len)
{
	shim__v1__file_stat__init(out);
	for (int i = 0; i < 3; i++)
		shim__v1__timestamp__init(&ts[i]);
	out->type = file_type(st->st_mode);
	out->size = (uint64_t)st->st_size;
	out->mode = st->st_mode & 07777;
	out->uid = st->st_uid;
	out->gid = st->st_gid;
	out->nlink = st->st_nlink;
	out->inode = st->st_ino;
	out->device = st->st_dev;
	if (S_ISBLK(st->st_mode) || S_ISCHR(st->st_mode)) {
		out->has_rdev = 1;
		out->rdev = st->st_rdev;
	}
	out->has_blocks = 1;
	out->blocks = (uint64_t)st->st_blocks;
	ts[0].sec = st->st_atim.tv_sec;
	ts[0].nsec = (uint32_t)st->st_atim.tv_nsec;
	ts[1].sec = st->st_mtim.tv_sec;
	ts[1].nsec = (uint32_t)st->st_mtim.tv_nsec;
	ts[2].sec = st->st_ctim.tv_sec;
	ts[2].nsec = (uint32_t)st->st_ctim.tv_nsec;
	out->atime = &ts[0];
	out->mtime = &ts[1];
	out->ctime = &ts[2];
	if (target != NULL) {
		out->has_link_target = 1;
		out->link_target.data = (uint8_t *)(uintptr_t)target;
		out->link_target.len = target_len;
	}
}

int fs_fd_path(int fd, char *buf, size_t size, struct shim_err *err)
{
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(proc, buf, size - 1);
	if (n < 0)
		return err_set(err, errno, proc, "readlink");
	if ((size_t)n >= size - 1)
		return err_set(err, ENAMETOOLONG, NULL, "resolved path too long");
	buf[n] = '\0';
	if (root.path != NULL) {
		/* show the path as the client sees it: beneath the root, from "/" */
		if (strncmp(buf, root.path, root.len) != 0 || (buf[root.len] != '/' && buf[root.len] != '\0'))
			return err_set(err, EXDEV, buf, "resolved outside --root");
		if (buf[root.len] == '\0')
			strcpy(buf, "/");
		else
			memmove(buf, buf + root.len, (size_t)n - root.len + 1);
	}
	return 0;
}

/* An O_PATH fd cannot be given to fchmod/futimens: use the *at() call with
 * AT_EMPTY_PATH where the kernel has it, else the fd's /proc/self/fd link (which
 * names exactly this inode, whatever happens to its path meanwhile). */
static void proc_fd_path(int fd, char buf[32])
{
	snprintf(buf, 32, "/proc/self/fd/%d", fd);
}

int fs_fd_chmod(int fd, mode_t mode)
{
	if (syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH) == 0)
		return 0;
	if (errno != ENOSYS && errno != EINVAL)
		return -1;
	char proc[32];
	proc_fd_path(fd, proc);
	return fchmodat(AT_FDCWD, proc, mode, 0);
}

int fs_fd_utimens(int fd, const struct timespec ts[2])
{
	if (utimensat(fd, "", ts, AT_EMPTY_PATH) == 0)
		return 0;
	/* a kernel without AT_EMPTY_PATH here refuses the flag, or the empty name */
	if (errno != EINVAL && errno != ENOENT)
		return -1;
	char proc[32];
	proc_fd_path(fd, proc);
	return utimensat(AT_FDCWD, proc, ts, 0);
}

/* The kernel's record (getdents64 fills the buffer with these). */
struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

int fs_dir_next(struct fs_dirbuf *b, struct fs_dirpos *d, const char **name, unsigned char *type)
{
	if (b->fd != d->fd) {
		/* the buffer holds another level's entries: come back to where this
		 * directory was left (a getdents position cookie) */
		if (lseek(d->fd, d->next, SEEK_SET) < 0)
			return -1;
		b->fd = d->fd;
		b->pos = b->len = 0;
	}
	for (;;) {
		if (b->pos >= b->len) {
			long n = syscall(SYS_getdents64, d->fd, b->buf, sizeof(b->buf));
			if (n < 0) {
				b->fd = -1;
				return -1;
			}
			if (n == 0)
				return 0;
			b->pos = 0;
			b->len = (size_t)n;
		}
		const struct linux_dirent64 *e = (const struct linux_dirent64 *)(void *)(b->buf + b->pos);
		b->pos += e->d_reclen;
		d->next = e->d_off;
		if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0')))
			continue;
		*name = e->d_name;
		*type = e->d_type;
		return 1;
	}
}

int fs_dir_rewind(struct fs_dirbuf *b, struct fs_dirpos *d)
{
	if (b->fd == d->fd)
		b->fd = -1;
	d->next = 0;
	return (int)lseek(d->fd, 0, SEEK_SET);
}

void fs_dir_forget(struct fs_dirbuf *b, int fd)
{
	if (b->fd == fd)
		b->fd = -1;
}

int fs_dir_reopen_parent(int child, dev_t dev, ino_t ino)
{
	int fd = openat(child, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	if (st.st_dev != dev || st.st_ino != ino) {
		close(fd);
		errno = EAGAIN;
		return -1;
	}
	return fd;
}

void fs_cancel_block(sigset_t *old)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, FS_CANCEL_SIGNAL);
	pthread_sigmask(SIG_BLOCK, &set, old);
}

void fs_cancel_restore(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

bool fs_cancel_pending(void)
{
	sigset_t set;
	return sigpending(&set) == 0 && sigismember(&set, FS_CANCEL_SIGNAL) == 1;
}
