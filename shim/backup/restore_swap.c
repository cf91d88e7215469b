/* restore_swap.c: a restore's target: the temp directory beside dir (journaled), the swap or the merge into dir, the removal of the old tree. */
#include "backup.h"
#include "journal.h"
#include "log.h"
#include "restore.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static int real_path_of(int dfd, const char *name, char *buf, size_t size)
{
	char proc[64], dir[PATH_MAX];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dfd);
	ssize_t n = readlink(proc, dir, sizeof(dir) - 1);
	if (n <= 0)
		return -1;
	dir[n] = '\0';
	int m = snprintf(buf, size, "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", name);
	return m < 0 || (size_t)m >= size ? -1 : 0;
}

/* The directory to restore: its parent (x->pdfd, a symlink to it followed within the
 * root), whether it exists (x->old, x->dirfd), whether it is a mount point or "/" that
 * cannot be renamed (x->inplace); *noname for "/" and the like. */
static int target_open(struct restore *x, bool *noname_out)
{
	struct restore_job *r = x->r;
	struct shim_err *err = &r->j.err;
	x->pdfd = fs_open_parent(&r->dir, x->name, err);
	if (x->pdfd < 0)
		return -1;
	/* "/" (or a path ending in "." or ".."): it has no name to rename; merging,
	 * the temp directory goes inside it */
	bool noname = strcmp(x->name, ".") == 0;
	if (noname && !r->merge)
		return err_set(err, EINVAL, r->dir.abs,
			       "restore: replace needs a directory it can rename (not / or . or ..)");
	struct stat st;
	if (noname || fstatat(x->pdfd, x->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (noname || S_ISLNK(st.st_mode)) {
			/* a symlink to the directory: restore what it names (within the root) */
			int fd = fs_open(&r->dir, O_PATH | O_DIRECTORY, 0, err);
			if (fd < 0)
				return -1;
			struct fs_path q;
			int rc = fs_fd_path(fd, q.abs, sizeof(q.abs), err);
			close(fd);
			if (rc < 0)
				return -1;
			q.len = strlen(q.abs);
			close(x->pdfd);
			x->pdfd = fs_open_parent(&q, x->name, err);
			if (x->pdfd < 0)
				return -1;
			noname = strcmp(x->name, ".") == 0;
			if ((noname && !r->merge) || fstatat(x->pdfd, x->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
				return err_set(err, EINVAL, r->dir.abs,
					       "restore: cannot replace the directory the symlink names");
		}
		if (!S_ISDIR(st.st_mode))
			return err_set(err, ENOTDIR, r->dir.abs, "restore");
		x->existed = true;
		x->old = st;
		x->dirfd = openat(x->pdfd, x->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (x->dirfd < 0)
			return err_set(err, errno, r->dir.abs, "restore: open");
		struct stat pst;
		struct statx sx;
		/* a mount point cannot be renamed: extract inside it, swap the contents */
		x->inplace = noname || (fstat(x->pdfd, &pst) == 0 && pst.st_dev != st.st_dev) ||
			     (statx(x->pdfd, x->name, AT_SYMLINK_NOFOLLOW, 0, &sx) == 0 &&
			      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
			      (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT));
	} else if (errno != ENOENT) {
		return err_set(err, errno, r->dir.abs, "restore: lstat");
	}
	*noname_out = noname;
	return 0;
}

/* The temp directory to extract into, beside dir (or inside it), in the journal before
 * it exists; x->base open on it. */
static int temp_dir_make(struct restore *x, bool noname)
{
	struct restore_job *r = x->r;
	struct shim_err *err = &r->j.err;
	struct stat st;
	/* merging into a directory that exists; into a new one it is a replace */
	x->merge_in = r->merge && x->existed;
	x->tmp_parent = x->inplace ? x->dirfd : x->pdfd;
	char path[PATH_MAX + NAME_MAX + 2];
	for (int tries = 0;; tries++) {
		journal_temp_name(noname ? "restore" : x->name, x->tmp, sizeof(x->tmp));
		if (real_path_of(x->tmp_parent, x->tmp, path, sizeof(path)) < 0)
			return err_set(err, ENAMETOOLONG, r->dir.abs, "restore: the temp directory's path");
		/* in the journal before it exists: a crash from here on is cleaned up */
		x->jent = journal_add(path, err);
		if (x->jent == NULL)
			return -1;
		if (mkdirat(x->tmp_parent, x->tmp, 0700) == 0)
			break;
		int e = errno;
		journal_remove(x->jent);
		x->jent = NULL;
		if ((e == EACCES || e == EPERM) && x->merge_in && x->tmp_parent != x->dirfd) {
			/* merging into a directory of ours in one that is not: inside it */
			x->tmp_parent = x->dirfd;
			tries = -1;
			continue;
		}
		if (e != EEXIST || tries >= 10)
			return err_set(err, e, r->dir.abs, "restore: create the temp directory");
	}
	x->tmp_made = true;
	x->base = openat(x->tmp_parent, x->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (x->base < 0)
		return err_set(err, errno, r->dir.abs, "restore: open the temp directory");
	if (x->merge_in)
		x->sgid_possible = true; /* directories that are there may be set-group-ID */
	else if (fstat(x->base, &st) == 0)
		x->sgid_possible = (st.st_mode & S_ISGID) != 0;
	return 0;
}

/* Set up the directory to extract into (target_open, temp_dir_make). */
int restore_swap_prepare(struct restore *x)
{
	x->member = NULL;
	bool noname;
	if (target_open(x, &noname) < 0 || temp_dir_make(x, noname) < 0) {
		x->err_set = true;
		return -1;
	}
	return 0;
}

/* Remove the temp directory (a failed restore, or the old tree after the swap). */
void restore_swap_drop_tmp(struct restore *x)
{
	if (!x->tmp_made)
		return;
	struct shim_err e;
	if (op_fs_remove_tree(x->tmp_parent, x->tmp, false, x->r->dir.abs, &e) < 0) {
		/* left in the journal: the next start (or our exit) removes it */
		log_warn("restore %s: cannot remove %s: %s: %s", x->r->dir.abs, x->tmp, e.msg, strerror(e.code));
		x->tmp_made = false;
		return;
	}
	x->tmp_made = false;
	journal_remove(x->jent);
	x->jent = NULL;
}

/* Every entry of dfd but skip, one at a time, to fn; until none is left. */
static int each_entry(struct restore *x, int dfd, const char *skip, int (*fn)(struct restore *, int, const char *))
{
	struct fs_dirbuf *b = malloc(sizeof(*b));
	if (b == NULL)
		return restore_fail(x, ENOMEM, "out of memory");
	b->fd = -1;
	int rc = 0;
	for (int pass = 0; rc == 0 && pass < 1000; pass++) {
		struct fs_dirpos d = {.fd = dfd, .next = 0};
		if (fs_dir_rewind(b, &d) < 0) {
			rc = restore_fail(x, errno, "lseek");
			break;
		}
		bool any = false;
		const char *name;
		unsigned char type;
		int got;
		while (rc == 0 && (got = fs_dir_next(b, &d, &name, &type)) > 0) {
			if (skip != NULL && strcmp(name, skip) == 0)
				continue;
			char copy[NAME_MAX + 1];
			snprintf(copy, sizeof(copy), "%s", name);
			rc = fn(x, dfd, copy);
			any = true;
		}
		if (rc == 0 && got < 0)
			rc = restore_fail(x, errno, "read directory");
		if (!any)
			break;
	}
	fs_dir_forget(b, dfd);
	free(b);
	return rc;
}

static int remove_old(struct restore *x, int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : restore_fail(x, errno, "lstat %s", name);
	if (S_ISDIR(st.st_mode)) {
		struct shim_err e;
		if (op_fs_remove_tree(dfd, name, false, x->r->dir.abs, &e) < 0)
			return restore_fail(x, e.code, "remove the old %s: %s", name, e.msg);
		return 0;
	}
	if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
		return restore_fail(x, errno, "remove the old %s", name);
	return 0;
}

static int move_new(struct restore *x, int dfd, const char *name)
{
	if (renameat(dfd, name, x->dirfd, name) < 0)
		return restore_fail(x, errno, "move %s into place", name);
	return 0;
}

/* Give the directory to the owner and xattrs of from (the owner as root only). */
static void copy_owner_xattrs(struct restore *x, int from, int to)
{
	struct stat st, tst;
	if (x->root && fstat(from, &st) == 0 && fstat(to, &tst) == 0 &&
	    (st.st_uid != tst.st_uid || st.st_gid != tst.st_gid) && fchown(to, st.st_uid, st.st_gid) < 0)
		restore_chown_failed(x, errno);
	if (flistxattr(from, NULL, 0) <= 0)
		return;
	char *list = malloc(XATTR_LIST_MAX), *val = malloc(XATTR_SIZE_MAX);
	ssize_t n = list != NULL && val != NULL ? flistxattr(from, list, XATTR_LIST_MAX) : -1;
	for (ssize_t off = 0; off < n;) {
		const char *key = list + off;
		off += (ssize_t)strlen(key) + 1;
		ssize_t v = fgetxattr(from, key, val, XATTR_SIZE_MAX);
		if (v >= 0 && fsetxattr(to, key, val, (size_t)v, 0) < 0 && !restore_xattr_skippable(errno))
			log_warn("restore %s: xattr %s: %s", x->r->dir.abs, key, strerror(errno));
	}
	free(list);
	free(val);
}

/* The swap when dir cannot be renamed: empty it, move the new entries in, give it
 * the new root's owner, mode, xattrs and times, remove the temp directory. */
static int swap_contents(struct restore *x)
{
	log_info("restore %s: swapping the contents (the directory cannot be renamed)", x->r->dir.abs);
	x->touched = true;
	if (each_entry(x, x->dirfd, x->inplace ? x->tmp : NULL, remove_old) < 0)
		return -1;
	if (each_entry(x, x->base, NULL, move_new) < 0)
		return -1;
	struct stat st;
	if (fstat(x->base, &st) < 0)
		return restore_fail(x, errno, "stat");
	copy_owner_xattrs(x, x->base, x->dirfd);
	if (fchmod(x->dirfd, st.st_mode & 07777) < 0)
		return restore_fail(x, errno, "chmod");
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	if (futimens(x->dirfd, ts) < 0)
		return restore_fail(x, errno, "set times");
	return 0;
}

int restore_swap_in(struct restore *x)
{
	x->member = NULL;
	if (!x->inplace && x->existed) {
		if (renameat2(x->pdfd, x->tmp, x->pdfd, x->name, RENAME_EXCHANGE) == 0)
			return 0; /* the old tree is now at the temp name */
		if (errno != EXDEV && errno != EINVAL && errno != EBUSY && errno != ENOSYS && errno != ENOENT)
			return restore_fail(x, errno, "swap the directories");
		if (errno != ENOENT)
			return swap_contents(x);
		x->existed = false; /* gone meanwhile: a plain rename */
	}
	if (!x->existed) {
		int rc = renameat2(x->pdfd, x->tmp, x->pdfd, x->name, RENAME_NOREPLACE);
		if (rc < 0 && (errno == EINVAL || errno == ENOSYS))
			rc = renameat(x->pdfd, x->tmp, x->pdfd, x->name);
		if (rc < 0)
			return restore_fail(x, errno, "rename into place");
		x->tmp_made = false; /* nothing is left at the temp name */
		journal_remove(x->jent);
		x->jent = NULL;
		return 0;
	}
	return swap_contents(x);
}

/* ---- merge ---- */

/*
 * The temp directory holds what the archive makes, dir what is there. Each entry of
 * the temp directory is renamed into dir over what has its name there (a file, a
 * symlink, an empty directory; a directory over a non-directory only if the archive
 * has that directory as a member: one it only has names below is on their path, and
 * dir's symlink or file there refuses them, EPERM or ENOTDIR, as extracting into dir
 * would). A directory both have is entered and merged the same way, then the temp
 * one removed. A first walk changes nothing and fails where the second would, so a
 * refusal leaves dir as it was; the second moves (what lands on another filesystem
 * mounted in dir is copied). Both walks keep one level per directory both have, at
 * most EX_STACK deep, each with its two fds.
 */

struct mlevel {
	struct fs_dirpos d; /* the temp directory's level */
	int tfd;            /* the same directory in dir (O_RDONLY) */
	size_t plen;        /* x->path's length at this level: the path of the directory */
	bool moved;         /* an entry went in this reading */
	int passes;
};

static int path_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The archive has a directory member at x->path (not only names below it). */
static bool explicit_dir(const struct restore *x)
{
	const char *key = x->path;
	return x->fixidx != NULL && bsearch(&key, x->fixidx, x->nfix, sizeof(*x->fixidx), path_cmp) != NULL;
}

/* x->path: the level's path (len) and name. */
static int path_set(struct restore *x, size_t len, const char *name)
{
	size_t n = strlen(name), o = len + (len > 0);
	if (o + n > EX_NAME_MAX)
		return restore_fail(x, ENAMETOOLONG, "path too long");
	if (len > 0)
		x->path[len] = '/';
	memcpy(x->path + o, name, n + 1);
	x->plen = o + n;
	x->member = x->path;
	return 0;
}

static void path_cut(struct restore *x, size_t len)
{
	x->path[len] = '\0';
	x->plen = len;
	x->member = x->path;
}

/* EEXIST unless tfd/name is an empty directory. */
static int empty_dir(struct restore *x, int tfd, const char *name)
{
	int fd = openat(tfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return restore_fail(x, errno, "open directory");
	struct fs_dirpos d = {.fd = fd, .next = 0};
	const char *n;
	unsigned char type;
	int got = fs_dir_next(x->mbuf, &d, &n, &type);
	int e = errno;
	fs_dir_forget(x->mbuf, fd);
	close(fd);
	if (got < 0)
		return restore_fail(x, e, "read directory");
	if (got > 0)
		return restore_fail(x, EEXIST, "a non-empty directory is in the way");
	return 0;
}

/* Move l's entry name (in x->path) into dir; s is its lstat. */
static int move_in(struct restore *x, struct mlevel *l, const char *name, const struct stat *s)
{
	if (renameat(l->d.fd, name, l->tfd, name) == 0) {
		l->moved = true;
		return 0;
	}
	if (errno != EXDEV)
		return restore_fail(x, errno, "move into place");
	/* a filesystem mounted in dir: a copy (built beside, renamed in), then ours goes */
	struct shim_err e;
	struct fs_copy_stats stats = {0, 0};
	if (op_fs_copy_entry(l->d.fd, name, -1, s, l->tfd, name, 0, &stats, x->path, x->path, &e) < 0)
		return restore_fail(x, e.code, "copy onto another filesystem: %s", e.msg);
	int rc = S_ISDIR(s->st_mode) ? op_fs_remove_tree(l->d.fd, name, false, x->r->dir.abs, &e) :
				       unlinkat(l->d.fd, name, 0);
	if (rc < 0)
		return restore_fail(x, S_ISDIR(s->st_mode) ? e.code : errno, "remove the copied temp entry");
	l->moved = true;
	return 0;
}

/* One entry of level l (its name last in x->path): checked (dry), or merged. 1 when
 * it is a directory both have: *child is its level, to walk. */
static int merge_entry(struct restore *x, struct mlevel *l, const char *name, bool dry, size_t depth,
		       struct mlevel *child)
{
	struct stat s, t;
	if (fstatat(l->d.fd, name, &s, AT_SYMLINK_NOFOLLOW) < 0)
		return restore_fail(x, errno, "lstat");
	bool has_t = fstatat(l->tfd, name, &t, AT_SYMLINK_NOFOLLOW) == 0;
	if (!has_t && errno != ENOENT)
		return restore_fail(x, errno, "lstat");
	if (has_t && depth == 1 && x->tmp_parent == x->dirfd && strcmp(name, x->tmp) == 0)
		return restore_fail(x, EEXIST, "a member has the temp directory's name");
	bool sdir = S_ISDIR(s.st_mode), tdir = has_t && S_ISDIR(t.st_mode);
	if (sdir && tdir) {
		if (depth >= EX_STACK)
			return restore_fail(x, ENAMETOOLONG,
					    "directories nested over %d deep both in dir and the archive", EX_STACK);
		int cs = openat(l->d.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cs < 0)
			return restore_fail(x, errno, "open the temp directory");
		int ct = openat(l->tfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (ct < 0) {
			int e = errno;
			close(cs);
			return restore_fail(x, e, "open directory");
		}
		*child = (struct mlevel){.d = {.fd = cs, .next = 0}, .tfd = ct, .plen = x->plen};
		return 1;
	}
	if (sdir && has_t && !explicit_dir(x)) {
		if (S_ISLNK(t.st_mode))
			return restore_fail(x, EPERM, "the path goes through the symlink %s: refused", name);
		return restore_fail(x, ENOTDIR, "%s on the path is not a directory", name);
	}
	if (tdir && dry)
		return empty_dir(x, l->tfd, name);
	if (dry)
		return 0;
	x->touched = true;
	if (tdir && unlinkat(l->tfd, name, AT_REMOVEDIR) < 0) {
		if (errno == ENOTEMPTY || errno == EEXIST)
			return restore_fail(x, EEXIST, "a non-empty directory is in the way");
		return restore_fail(x, errno, "remove what is in the way");
	}
	/* rename(2) puts a directory over a directory only */
	if (sdir && has_t && unlinkat(l->tfd, name, 0) < 0 && errno != ENOENT)
		return restore_fail(x, errno, "remove what is in the way");
	return move_in(x, l, name, &s);
}

static int merge_walk(struct restore *x, bool dry)
{
	struct mlevel lv[EX_STACK + 1];
	size_t n = 0;
	int rootfd = openat(x->base, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return restore_fail(x, errno, "open the temp directory");
	lv[n++] = (struct mlevel){.d = {.fd = rootfd, .next = 0}, .tfd = x->dirfd, .plen = 0};
	path_cut(x, 0);
	int rc = 0;
	while (n > 0) {
		struct mlevel *l = &lv[n - 1];
		const char *name;
		unsigned char type;
		int got = fs_dir_next(x->mbuf, &l->d, &name, &type);
		if (got < 0) {
			rc = restore_fail(x, errno, "read the temp directory");
			break;
		}
		if (got > 0) {
			/* the name is copied into x->path: the buffer serves every level */
			if (path_set(x, l->plen, name) < 0) {
				rc = -1;
				break;
			}
			struct mlevel child;
			int r = merge_entry(x, l, x->path + l->plen + (l->plen > 0), dry, n, &child);
			if (r < 0) {
				rc = -1;
				break;
			}
			if (r == 1)
				lv[n++] = child;
			else
				path_cut(x, l->plen);
			continue;
		}
		/* read again while that moves something: positions may shift as entries go
		 * (tmpfs before Linux 6.6), so some may have been passed over */
		if (l->moved && l->passes < 1000) {
			l->moved = false;
			l->passes++;
			if (fs_dir_rewind(x->mbuf, &l->d) < 0) {
				rc = restore_fail(x, errno, "lseek");
				break;
			}
			continue;
		}
		if (n == 1)
			break;
		/* a directory both have, merged: the archive's owner and xattrs for it
		 * (its mode and times come after), and the temp one goes */
		path_cut(x, l->plen);
		if (!dry && explicit_dir(x))
			copy_owner_xattrs(x, l->d.fd, l->tfd);
		fs_dir_forget(x->mbuf, l->d.fd);
		close(l->d.fd);
		close(l->tfd);
		n--;
		struct mlevel *up = &lv[n - 1];
		if (!dry) {
			if (unlinkat(up->d.fd, x->path + up->plen + (up->plen > 0), AT_REMOVEDIR) < 0) {
				rc = restore_fail(x, errno, "remove the merged temp directory");
				break;
			}
			up->moved = true;
		}
		path_cut(x, up->plen);
	}
	for (; n > 0; n--) {
		fs_dir_forget(x->mbuf, lv[n - 1].d.fd);
		close(lv[n - 1].d.fd);
		if (n > 1)
			close(lv[n - 1].tfd);
	}
	return rc;
}

int restore_swap_merge_in(struct restore *x)
{
	x->mbuf = malloc(sizeof(*x->mbuf));
	if (x->mbuf == NULL)
		return restore_fail(x, ENOMEM, "out of memory");
	x->mbuf->fd = -1;
	if (x->nfix > 0) {
		x->fixidx = malloc(x->nfix * sizeof(*x->fixidx));
		if (x->fixidx == NULL)
			return restore_fail(x, ENOMEM, "out of memory");
		for (size_t i = 0; i < x->nfix; i++)
			x->fixidx[i] = x->fix[i].path;
		qsort(x->fixidx, x->nfix, sizeof(*x->fixidx), path_cmp);
	}
	if (merge_walk(x, true) < 0 || merge_walk(x, false) < 0)
		return -1;
	x->member = NULL;
	if (x->root_seen)
		copy_owner_xattrs(x, x->base, x->dirfd);
	return 0;
}
