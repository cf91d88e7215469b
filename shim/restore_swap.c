/* restore_swap.c: a restore's target: the temp directory beside dir (journaled), the swap, the removal of the old tree. */
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

/* Set up the directory to extract into. */
int ex_prepare(struct ex *x)
{
	struct rs *r = x->r;
	struct shim_err *err = &r->j.err;
	x->member = NULL;
	if (r->merge) {
		x->base = fs_open(&r->dir, O_RDONLY | O_DIRECTORY, 0, err);
		if (x->base < 0 && err->code == ENOENT) {
			/* a new directory (its parent must exist) */
			int pdfd = fs_open_parent(&r->dir, x->name, err);
			if (pdfd < 0)
				goto fail;
			int rc = mkdirat(pdfd, x->name, 0755);
			close(pdfd);
			if (rc < 0 && errno != EEXIST) {
				err_set(err, errno, r->dir.abs, "restore: mkdir");
				goto fail;
			}
			x->base = fs_open(&r->dir, O_RDONLY | O_DIRECTORY, 0, err);
		}
		if (x->base < 0)
			goto fail;
		x->sgid_possible = true; /* directories that were there may be set-group-ID */
		return 0;
	}
	x->pdfd = fs_open_parent(&r->dir, x->name, err);
	if (x->pdfd < 0)
		goto fail;
	if (strcmp(x->name, ".") == 0) {
		err_set(err, EINVAL, r->dir.abs, "restore: replace needs a directory it can rename (not / or . or ..)");
		goto fail;
	}
	struct stat st;
	if (fstatat(x->pdfd, x->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (S_ISLNK(st.st_mode)) {
			/* a symlink to the directory: replace what it names (within the root) */
			int fd = fs_open(&r->dir, O_PATH | O_DIRECTORY, 0, err);
			if (fd < 0)
				goto fail;
			struct fs_path q;
			int rc = fs_fd_path(fd, q.abs, sizeof(q.abs), err);
			close(fd);
			if (rc < 0)
				goto fail;
			q.len = strlen(q.abs);
			close(x->pdfd);
			x->pdfd = fs_open_parent(&q, x->name, err);
			if (x->pdfd < 0)
				goto fail;
			if (strcmp(x->name, ".") == 0 || fstatat(x->pdfd, x->name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
				err_set(err, EINVAL, r->dir.abs,
					"restore: cannot replace the directory the symlink names");
				goto fail;
			}
		}
		if (!S_ISDIR(st.st_mode)) {
			err_set(err, ENOTDIR, r->dir.abs, "restore");
			goto fail;
		}
		x->existed = true;
		x->old = st;
		x->dirfd = openat(x->pdfd, x->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (x->dirfd < 0) {
			err_set(err, errno, r->dir.abs, "restore: open");
			goto fail;
		}
		struct stat pst;
		struct statx sx;
		/* a mount point cannot be renamed: extract inside it, swap the contents */
		x->inplace = (fstat(x->pdfd, &pst) == 0 && pst.st_dev != st.st_dev) ||
			     (statx(x->pdfd, x->name, AT_SYMLINK_NOFOLLOW, 0, &sx) == 0 &&
			      (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
			      (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT));
	} else if (errno != ENOENT) {
		err_set(err, errno, r->dir.abs, "restore: lstat");
		goto fail;
	}
	x->tmp_parent = x->inplace ? x->dirfd : x->pdfd;
	char path[PATH_MAX + NAME_MAX + 2];
	for (int tries = 0;; tries++) {
		journal_temp_name(x->name, x->tmp, sizeof(x->tmp));
		if (real_path_of(x->tmp_parent, x->tmp, path, sizeof(path)) < 0) {
			err_set(err, ENAMETOOLONG, r->dir.abs, "restore: the temp directory's path");
			goto fail;
		}
		/* in the journal before it exists: a crash from here on is cleaned up */
		x->jent = journal_add(path, err);
		if (x->jent == NULL)
			goto fail;
		if (mkdirat(x->tmp_parent, x->tmp, 0700) == 0)
			break;
		int e = errno;
		journal_remove(x->jent);
		x->jent = NULL;
		if (e != EEXIST || tries >= 10) {
			err_set(err, e, r->dir.abs, "restore: create the temp directory");
			goto fail;
		}
	}
	x->tmp_made = true;
	x->base = openat(x->tmp_parent, x->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (x->base < 0) {
		err_set(err, errno, r->dir.abs, "restore: open the temp directory");
		goto fail;
	}
	if (fstat(x->base, &st) == 0)
		x->sgid_possible = (st.st_mode & S_ISGID) != 0;
	return 0;
fail:
	x->err_set = true;
	return -1;
}

/* Remove the temp directory (a failed restore, or the old tree after the swap). */
void ex_drop_tmp(struct ex *x)
{
	if (!x->tmp_made)
		return;
	struct shim_err e;
	if (fs_remove_tree(x->tmp_parent, x->tmp, false, x->r->dir.abs, &e) < 0) {
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
static int each_entry(struct ex *x, int dfd, const char *skip, int (*fn)(struct ex *, int, const char *))
{
	struct fs_dirbuf *b = malloc(sizeof(*b));
	if (b == NULL)
		return ex_fail(x, ENOMEM, "out of memory");
	b->fd = -1;
	int rc = 0;
	for (int pass = 0; rc == 0 && pass < 1000; pass++) {
		struct fs_dirpos d = {.fd = dfd, .next = 0};
		if (fs_dir_rewind(b, &d) < 0) {
			rc = ex_fail(x, errno, "lseek");
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
			rc = ex_fail(x, errno, "read directory");
		if (!any)
			break;
	}
	fs_dir_forget(b, dfd);
	free(b);
	return rc;
}

static int remove_old(struct ex *x, int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : ex_fail(x, errno, "lstat %s", name);
	if (S_ISDIR(st.st_mode)) {
		struct shim_err e;
		if (fs_remove_tree(dfd, name, false, x->r->dir.abs, &e) < 0)
			return ex_fail(x, e.code, "remove the old %s: %s", name, e.msg);
		return 0;
	}
	if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
		return ex_fail(x, errno, "remove the old %s", name);
	return 0;
}

static int move_new(struct ex *x, int dfd, const char *name)
{
	if (renameat(dfd, name, x->dirfd, name) < 0)
		return ex_fail(x, errno, "move %s into place", name);
	return 0;
}

/* The swap when dir cannot be renamed: empty it, move the new entries in, give it
 * the new root's owner, mode, xattrs and times, remove the temp directory. */
static int swap_contents(struct ex *x)
{
	log_info("restore %s: swapping the contents (the directory cannot be renamed)", x->r->dir.abs);
	if (each_entry(x, x->dirfd, x->inplace ? x->tmp : NULL, remove_old) < 0)
		return -1;
	if (each_entry(x, x->base, NULL, move_new) < 0)
		return -1;
	struct stat st;
	if (fstat(x->base, &st) < 0)
		return ex_fail(x, errno, "stat");
	if (x->root && fchown(x->dirfd, st.st_uid, st.st_gid) < 0)
		ex_chown_failed(x, errno);
	char *list = malloc(XATTR_LIST_MAX), *val = malloc(XATTR_SIZE_MAX);
	ssize_t n = list != NULL && val != NULL ? flistxattr(x->base, list, XATTR_LIST_MAX) : -1;
	for (ssize_t off = 0; off < n;) {
		const char *key = list + off;
		off += (ssize_t)strlen(key) + 1;
		ssize_t v = fgetxattr(x->base, key, val, XATTR_SIZE_MAX);
		if (v >= 0 && fsetxattr(x->dirfd, key, val, (size_t)v, 0) < 0 && !ex_xattr_skippable(errno))
			log_warn("restore %s: xattr %s: %s", x->r->dir.abs, key, strerror(errno));
	}
	free(list);
	free(val);
	if (fchmod(x->dirfd, st.st_mode & 07777) < 0)
		return ex_fail(x, errno, "chmod");
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	if (futimens(x->dirfd, ts) < 0)
		return ex_fail(x, errno, "set times");
	return 0;
}

int ex_swap_in(struct ex *x)
{
	x->member = NULL;
	if (!x->inplace && x->existed) {
		if (renameat2(x->pdfd, x->tmp, x->pdfd, x->name, RENAME_EXCHANGE) == 0)
			return 0; /* the old tree is now at the temp name */
		if (errno != EXDEV && errno != EINVAL && errno != EBUSY && errno != ENOSYS && errno != ENOENT)
			return ex_fail(x, errno, "swap the directories");
		if (errno != ENOENT)
			return swap_contents(x);
		x->existed = false; /* gone meanwhile: a plain rename */
	}
	if (!x->existed) {
		int rc = renameat2(x->pdfd, x->tmp, x->pdfd, x->name, RENAME_NOREPLACE);
		if (rc < 0 && (errno == EINVAL || errno == ENOSYS))
			rc = renameat(x->pdfd, x->tmp, x->pdfd, x->name);
		if (rc < 0)
			return ex_fail(x, errno, "rename into place");
		x->tmp_made = false; /* nothing is left at the temp name */
		journal_remove(x->jent);
		x->jent = NULL;
		return 0;
	}
	return swap_contents(x);
}
