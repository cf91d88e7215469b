/* op_fs.c: one-shot file operations (stat, mkdir, remove, rename, chmod, ...), each run on a worker. */
#include "fs.h"
#include "fs_walk.h"
#include "op.h"
#include "ops.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#ifndef ST_VALID
#define ST_VALID 0x0020 /* statfs f_flags: "the flags are valid", not a mount flag */
#endif

static int stat_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__StatRequest *r = op->req->stat;
	struct fs_path p;
	struct stat st;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	bool follow = r->has_follow && r->follow;
	char target[PATH_MAX];
	ssize_t tlen = -1;
	if (follow) {
		if (fs_stat(&p, true, &st, err) < 0)
			return -1;
	} else {
		char name[NAME_MAX + 1];
		int cleanup_close dfd = fs_open_parent(&p, name, err);
		if (dfd < 0)
			return -1;
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(err, errno, p.abs, "lstat");
		if (S_ISLNK(st.st_mode)) {
			tlen = readlinkat(dfd, name, target, sizeof(target));
			if (tlen < 0)
				return err_set(err, errno, p.abs, "readlink");
		}
	}
	Shim__V1__FileStat fst;
	Shim__V1__Timestamp ts[3];
	fs_fill_stat(&fst, ts, &st, tlen >= 0 ? target : NULL, tlen >= 0 ? (size_t)tlen : 0);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_STAT;
	res.stat = &fst;
	return op_reply_pack(&op->reply, &res, err);
}

/* Name the client's path in err (an inner step may have named a prefix of it). */
static int err_path(struct shim_err *err, const char *path)
{
	size_t n = strlen(path);
	if (n >= sizeof(err->path))
		n = sizeof(err->path) - 1;
	memcpy(err->path, path, n);
	err->path[n] = '\0';
	err->path_len = n;
	return -1;
}

static bool is_dot(const char *name)
{
	return name[0] == '.' && name[1] == '\0';
}

/* mkdirat, then make the mode exactly what was asked: mkdir(2) applies the
 * process umask and drops setuid/setgid. The mode is set on an O_NOFOLLOW fd of
 * the new directory, so a symlink swapped in meanwhile is never followed. -1 with
 * err filled (its code EEXIST when the name is taken). */
static int mkdir_exact(int dfd, const char *name, mode_t mode, const char *errpath, struct shim_err *err)
{
	if (mkdirat(dfd, name, mode) < 0)
		return err_set(err, errno, errpath, "mkdir");
	int cleanup_close fd = openat(dfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0)
		return err_set(err, errno, errpath, "open new directory");
	if ((st.st_mode & 07777) != mode && fs_fd_chmod(fd, mode) < 0)
		return err_set(err, errno, errpath, "chmod");
	return 0;
}

/* mkdir -p: create each missing component in turn (0755, the last one with mode).
 * Every prefix is resolved afresh through fs_open_parent, so symlinks among the
 * components are followed as mkdir -p does, but never out of --root. */
static int mkdir_parents(const struct fs_path *p, mode_t mode, struct shim_err *err)
{
	struct stat st;
	if (fs_stat(p, true, &st, NULL) == 0 && S_ISDIR(st.st_mode))
		return 0;
	struct fs_path q;
	size_t i = 1;
	while (i < p->len) {
		size_t j = i;
		while (j < p->len && p->abs[j] != '/')
			j++;
		size_t clen = j - i;
		size_t k = j;
		while (k < p->len && p->abs[k] == '/')
			k++;
		bool last = k == p->len;
		bool dots = (clen == 1 && p->abs[i] == '.') || (clen == 2 && p->abs[i] == '.' && p->abs[i + 1] == '.');
		if (clen == 0 || dots) {
			i = k > j ? k : j + 1;
			continue;
		}
		memcpy(q.abs, p->abs, j);
		q.abs[j] = '\0';
		q.len = j;
		char name[NAME_MAX + 1];
		int cleanup_close dfd = fs_open_parent(&q, name, err);
		if (dfd < 0)
			return err_path(err, p->abs);
		if (mkdir_exact(dfd, name, last ? mode : 0755, p->abs, err) < 0) {
			if (err->code != EEXIST)
				return -1;
			/* there already: fine if it is (or leads to) a directory; a
			 * dangling symlink is "exists", a loop ELOOP */
			if (fs_stat(&q, true, &st, err) < 0) {
				/* (fs_stat's message kept: a link refused says why) */
				if (err->code != ENOENT)
					return err_path(err, p->abs);
				return err_set(err, EEXIST, p->abs, "mkdir");
			}
			if (!S_ISDIR(st.st_mode))
				return err_set(err, last ? EEXIST : ENOTDIR, p->abs, "mkdir");
		}
		i = k;
	}
	return 0;
}

static int mkdir_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__MkdirRequest *r = op->req->mkdir;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	mode_t mode = r->has_mode ? r->mode : 0755;
	if (mode & ~07777u)
		return err_set(err, EINVAL, p.abs, "mode %#o out of range", (unsigned)mode);
	if (r->has_parents && r->parents) {
		if (mkdir_parents(&p, mode, err) < 0)
			return -1;
	} else {
		char name[NAME_MAX + 1];
		int cleanup_close dfd = fs_open_parent(&p, name, err);
		if (dfd < 0)
			return -1;
		if (mkdir_exact(dfd, name, mode, p.abs, err) < 0)
			return -1;
	}
	return op_reply_done(&op->reply, err);
}

/* ---- remove ---- */

/* Per level of a remove: how its last pass went. */
struct rm_level {
	unsigned passes;  /* times read to the end */
	uint64_t removed; /* entries removed in this pass */
	char *name;       /* in the level above (or the caller's dfd) */
};

static int rm_fail(struct fs_walk *w, const char *errpath, struct shim_err *err)
{
	enum fs_walk_fail f = w->fail;
	if (f == FS_WALK_FAIL_MEMORY)
		return err_set(err, ENOMEM, errpath, "out of memory");
	if (f == FS_WALK_FAIL_CANCEL)
		return err_set(err, ECANCELED, errpath, "cancelled");
	if (f == FS_WALK_FAIL_MOUNT)
		return err_set(err, EBUSY, errpath, "a mount point below the tree");
	return err_set(err, errno, errpath, "%s",
		       f == FS_WALK_FAIL_REOPEN ? "open .." :
		       f == FS_WALK_FAIL_STAT   ? "stat" :
		       f == FS_WALK_FAIL_OPEN   ? "open" :
						  "getdents");
}

/* Push the directory fd (named name in the level above) with its name. */
static int rm_push(struct fs_walk *w, int fd, const char *name, const char *errpath, struct shim_err *err)
{
	char *dup = strdup(name);
	if (dup == NULL) {
		close(fd);
		return err_set(err, ENOMEM, errpath, "out of memory");
	}
	if (fs_walk_push(w, fd, NULL, -1) < 0) {
		free(dup);
		return rm_fail(w, errpath, err);
	}
	((struct rm_level *)fs_walk_data(w, w->n - 1))->name = dup;
	return 0;
}

static void rm_pop(struct fs_walk *w)
{
	free(((struct rm_level *)fs_walk_data(w, w->n - 1))->name);
	fs_walk_pop(w);
}

/* One step of the walk: 1 to go on, 0 at the end, -1 with err. */
static int rm_step(struct fs_walk *w, int dfd, const char *errpath, struct shim_err *err)
{
	int got = fs_walk_next(w);
	if (got < 0)
		return rm_fail(w, errpath, err);
	if (got == FS_WALK_END)
		return 0;
	int lfd = fs_walk_top(w)->d.fd;
	struct rm_level *l = fs_walk_data(w, w->n - 1);
	struct rm_level *up = w->n > 1 ? fs_walk_data(w, w->n - 2) : NULL;
	if (got == FS_WALK_POST) {
		if (unlinkat(up != NULL ? fs_walk_up(w)->d.fd : dfd, l->name, AT_REMOVEDIR) < 0) {
			/* Entries left behind our position: created meanwhile, or skipped
			 * by a filesystem whose positions are ordinals that shift as
			 * entries go (tmpfs before Linux 6.6). Read it again while that
			 * still removes something. */
			if (errno == ENOTEMPTY && l->removed > 0 && l->passes < 1000) {
				l->passes++;
				l->removed = 0;
				return fs_walk_rewind(w) < 0 ? err_set(err, errno, errpath, "lseek") : 1;
			}
			return err_set(err, errno, errpath, "rmdir");
		}
		rm_pop(w);
		if (up != NULL)
			up->removed++;
		return 1;
	}
	const char *ename = w->name;
	unsigned char type = w->type;
	if (type == DT_UNKNOWN) {
		struct stat st;
		if (fstatat(lfd, ename, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return errno == ENOENT ? 1 : err_set(err, errno, errpath, "lstat");
		type = S_ISDIR(st.st_mode) ? DT_DIR : DT_REG;
	}
	if (type != DT_DIR) {
		if (unlinkat(lfd, ename, 0) < 0)
			return errno == ENOENT ? 1 : err_set(err, errno, errpath, "unlink");
		l->removed++;
		return 1;
	}
	int cfd = fs_walk_enter(w, ename, 0);
	if (cfd < 0)
		return errno == ENOENT && w->fail == FS_WALK_FAIL_OPEN ? 1 : rm_fail(w, errpath, err);
	return rm_push(w, cfd, ename, errpath, err) < 0 ? -1 : 1;
}

int op_fs_remove_tree(int dfd, const char *name, bool cancellable, const char *errpath, struct shim_err *err)
{
	/* on the walker: never following a symlink, never leaving the mount */
	struct fs_walk w;
	if (fs_walk_init(&w, FS_WALK_XDEV | (cancellable ? FS_WALK_CANCEL : 0), sizeof(struct rm_level)) < 0)
		return err_set(err, ENOMEM, errpath, "out of memory");
	int rc;
	int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cfd < 0)
		rc = err_set(err, errno, errpath, "open");
	else if (rm_push(&w, cfd, name, errpath, err) < 0)
		rc = -1;
	else
		while ((rc = rm_step(&w, dfd, errpath, err)) > 0)
			;
	while (w.n > 0)
		rm_pop(&w);
	fs_walk_free(&w);
	return rc;
}

static int remove_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__RemoveRequest *r = op->req->remove;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	char name[NAME_MAX + 1];
	int cleanup_close dfd = fs_open_parent(&p, name, err);
	if (dfd < 0)
		return -1;
	struct stat st, rst;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, p.abs, "lstat");
	if (S_ISDIR(st.st_mode)) {
		if (fs_root_stat(&rst) < 0)
			return err_set(err, errno, p.abs, "stat of the root");
		if (st.st_dev == rst.st_dev && st.st_ino == rst.st_ino)
			return err_set(err, EBUSY, p.abs, "refusing to remove the root");
		if (is_dot(name))
			return err_set(err, EINVAL, p.abs, "refusing to remove a path ending in . or ..");
		if (r->has_recursive && r->recursive) {
			sigset_t old;
			fs_cancel_block(&old);
			int rc = op_fs_remove_tree(dfd, name, true, p.abs, err);
			fs_cancel_restore(&old);
			if (rc < 0)
				return -1;
		} else if (unlinkat(dfd, name, AT_REMOVEDIR) < 0) {
			return err_set(err, errno, p.abs, "rmdir");
		}
	} else if (unlinkat(dfd, name, 0) < 0) {
		return err_set(err, errno, p.abs, "unlink");
	}
	return op_reply_done(&op->reply, err);
}

/* ---- rename ---- */

/* Can the entry st in directory dfd be removed by us? Checked before a move across
 * filesystems copies anything. 0, or -1 with the errno removing it would give. */
static int src_removable(int dfd, const struct stat *st, const char *path, struct shim_err *err)
{
	struct statvfs vfs;
	if (fstatvfs(dfd, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
		return err_set(err, EROFS, path, "rename");
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dfd);
	if (access(proc, W_OK | X_OK) < 0 && errno == EACCES)
		return err_set(err, EACCES, path, "rename");
	struct stat ds;
	if (fstat(dfd, &ds) == 0 && (ds.st_mode & S_ISVTX) && geteuid() != 0 && st->st_uid != geteuid() &&
	    ds.st_uid != geteuid())
		return err_set(err, EPERM, path, "rename");
	return 0;
}

static int rename_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__RenameRequest *r = op->req->rename;
	struct fs_parent cleanup_parent src, dst;
	if (fs_open_parents(&r->src, &r->dst, &src, &dst, err) < 0)
		return -1;
	unsigned flags = r->has_no_replace && r->no_replace ? RENAME_NOREPLACE : 0;
	if (renameat2(src.dfd, src.name, dst.dfd, dst.name, flags) == 0)
		return op_reply_done(&op->reply, err);
	if (errno != EXDEV) {
		/* name the side the error is about, where it is clear */
		bool about_dst = errno == EEXIST || errno == ENOTEMPTY || errno == EISDIR;
		return err_set(err, errno, about_dst ? dst.p.abs : src.p.abs, "rename");
	}

	/* Another filesystem (or another mount of the same one): copy, keeping
	 * everything, to a temporary name beside dst, rename that into place, then
	 * remove the source. */
	struct stat st, dt;
	if (fstatat(src.dfd, src.name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, src.p.abs, "lstat");
	if (fstatat(dst.dfd, dst.name, &dt, AT_SYMLINK_NOFOLLOW) == 0) {
		/* the errors rename(2) would give, before copying anything */
		if (flags & RENAME_NOREPLACE)
			return err_set(err, EEXIST, dst.p.abs, "rename");
		if (S_ISDIR(st.st_mode) && !S_ISDIR(dt.st_mode))
			return err_set(err, ENOTDIR, dst.p.abs, "rename");
		if (!S_ISDIR(st.st_mode) && S_ISDIR(dt.st_mode))
			return err_set(err, EISDIR, dst.p.abs, "rename");
	} else if (errno != ENOENT) {
		return err_set(err, errno, dst.p.abs, "lstat");
	}
	if (is_dot(src.name))
		return err_set(err, EBUSY, src.p.abs, "rename");
	bool dst_existed = fstatat(dst.dfd, dst.name, &dt, AT_SYMLINK_NOFOLLOW) == 0;
	/* The source must be removable once copied, or the "move" would leave the data
	 * in both places: check what can be checked before copying anything (a
	 * read-only mount, no write permission on its directory, a sticky directory). */
	if (src_removable(src.dfd, &st, src.p.abs, err) < 0)
		return -1;
	struct fs_copy_stats cs = {0, 0};
	sigset_t old;
	fs_cancel_block(&old);
	int rc = op_fs_copy_entry(src.dfd, src.name, -1, &st, dst.dfd, dst.name, flags, &cs, src.p.abs, dst.p.abs, err);
	/* once dst is in place the move is done but for removing the source: a
	 * cancel no longer stops it halfway */
	bool copied = rc == 0;
	if (rc == 0 && S_ISDIR(st.st_mode))
		rc = op_fs_remove_tree(src.dfd, src.name, false, src.p.abs, err);
	else if (rc == 0 && unlinkat(src.dfd, src.name, 0) < 0)
		rc = err_set(err, errno, src.p.abs, "unlink");
	if (rc < 0 && copied && !dst_existed) {
		/* the source could not go after all: take the copy back, so that a failed
		 * move leaves one copy of the data, not two */
		struct shim_err ignored;
		if (S_ISDIR(st.st_mode))
			op_fs_remove_tree(dst.dfd, dst.name, false, dst.p.abs, &ignored);
		else
			unlinkat(dst.dfd, dst.name, 0);
	}
	fs_cancel_restore(&old);
	if (rc < 0)
		return -1;
	return op_reply_done(&op->reply, err);
}

/* ---- metadata ---- */

static int chmod_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__ChmodRequest *r = op->req->chmod;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	if (r->mode & ~07777u)
		return err_set(err, EINVAL, p.abs, "mode %#o out of range", r->mode);
	/* like chmod(1), through symlinks (confined by fs_open) */
	int cleanup_close fd = fs_open(&p, O_PATH, 0, err);
	if (fd < 0)
		return -1;
	if (fs_fd_chmod(fd, r->mode) < 0)
		return err_set(err, errno, p.abs, "chmod");
	return op_reply_done(&op->reply, err);
}

static int chown_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__ChownRequest *r = op->req->chown;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	uid_t uid = r->has_uid ? (uid_t)r->uid : (uid_t)-1;
	gid_t gid = r->has_gid ? (gid_t)r->gid : (gid_t)-1;
	if (r->has_no_follow && r->no_follow) {
		char name[NAME_MAX + 1];
		int cleanup_close dfd = fs_open_parent(&p, name, err);
		if (dfd < 0)
			return -1;
		if (fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(err, errno, p.abs, "lchown");
	} else {
		int cleanup_close fd = fs_open(&p, O_PATH, 0, err);
		if (fd < 0)
			return -1;
		if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH) < 0)
			return err_set(err, errno, p.abs, "chown");
	}
	return op_reply_done(&op->reply, err);
}

/* ---- links ---- */

static int symlink_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__SymlinkRequest *r = op->req->symlink;
	struct fs_path link;
	if (fs_path_get(&r->link, &link, err) < 0)
		return -1;
	/* the target is stored as given, relative or not: only a C string */
	char target[PATH_MAX];
	/* (an empty target arrives as NULL data: symlinkat then says ENOENT) */
	if (r->target.len > 0 && memchr(r->target.data, '\0', r->target.len) != NULL)
		return err_setn(err, EINVAL, r->target.data, r->target.len, "target holds a NUL byte");
	if (r->target.len >= sizeof(target))
		return err_setn(err, ENAMETOOLONG, r->target.data, r->target.len, "target longer than %d bytes",
				PATH_MAX - 1);
	if (r->target.len > 0)
		memcpy(target, r->target.data, r->target.len);
	target[r->target.len] = '\0';
	char name[NAME_MAX + 1];
	int cleanup_close dfd = fs_open_parent(&link, name, err);
	if (dfd < 0)
		return -1;
	if (symlinkat(target, dfd, name) < 0)
		return err_set(err, errno, link.abs, "symlink");
	return op_reply_done(&op->reply, err);
}

static int reply_path(struct op_reply *reply, const char *path, size_t len, struct shim_err *err)
{
	Shim__V1__PathReply pr = SHIM__V1__PATH_REPLY__INIT;
	pr.path.data = (uint8_t *)(uintptr_t)path;
	pr.path.len = len;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_PATH;
	res.path = &pr;
	return op_reply_pack(reply, &res, err);
}

static int readlink_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__ReadlinkRequest *r = op->req->readlink;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	char name[NAME_MAX + 1];
	int cleanup_close dfd = fs_open_parent(&p, name, err);
	if (dfd < 0)
		return -1;
	char target[PATH_MAX];
	ssize_t n = readlinkat(dfd, name, target, sizeof(target));
	if (n < 0)
		return err_set(err, errno, p.abs, "readlink");
	return reply_path(&op->reply, target, (size_t)n, err);
}

static int link_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__LinkRequest *r = op->req->link;
	struct fs_parent cleanup_parent target, link;
	if (fs_open_parents(&r->target, &r->link, &target, &link, err) < 0)
		return -1;
	/* flags 0: a symlink target is linked itself, never followed (out of the root) */
	if (linkat(target.dfd, target.name, link.dfd, link.name, 0) < 0)
		return err_set(err, errno, link.p.abs, "link");
	return op_reply_done(&op->reply, err);
}

/* ---- size and times ---- */

static int truncate_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__TruncateRequest *r = op->req->truncate;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	if (r->size > INT64_MAX)
		return err_set(err, EFBIG, p.abs, "size %llu too large", (unsigned long long)r->size);
	/* a directory fails here with EISDIR. O_NONBLOCK: a FIFO without a reader fails at
	 * once (ENXIO) instead of waiting for one on a worker; what is not a regular file
	 * is refused unless the request allows it (op_fs_io.c) */
	bool allow = r->has_allow_special && r->allow_special;
	int cleanup_close fd = fs_open(&p, O_WRONLY | O_NOCTTY | O_NONBLOCK, 0, err);
	struct stat st;
	if (fd < 0 && err->code == ENXIO && !allow) {
		struct shim_err e;
		if (fs_stat(&p, true, &st, &e) == 0 && op_fs_io_special_kind(st.st_mode) != NULL)
			return op_fs_io_refuse_special(err, p.abs, st.st_mode, "truncate");
	}
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, p.abs, "stat");
	if (!S_ISREG(st.st_mode) && !allow)
		return op_fs_io_refuse_special(err, p.abs, st.st_mode, "truncate");
	if (ftruncate(fd, (off_t)r->size) < 0)
		return err_set(err, errno, p.abs, "truncate");
	return op_reply_done(&op->reply, err);
}

static int get_time(const Shim__V1__Timestamp *t, struct timespec *out, const char *path, struct shim_err *err)
{
	if (t == NULL) {
		*out = (struct timespec){0, UTIME_NOW};
		return 0;
	}
	/* nsec past 999999999 would be UTIME_NOW/UTIME_OMIT to the kernel */
	if (t->nsec >= 1000000000u)
		return err_set(err, EINVAL, path, "nanoseconds %u out of range", t->nsec);
	*out = (struct timespec){(time_t)t->sec, (long)t->nsec};
	return 0;
}

static int set_times_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__SetTimesRequest *r = op->req->set_times;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	struct timespec ts[2];
	if (get_time(r->atime, &ts[0], p.abs, err) < 0 || get_time(r->mtime, &ts[1], p.abs, err) < 0)
		return -1;
	bool create = !(r->has_no_create && r->no_create);
	/* through symlinks like touch(1), but only ever confined by fs_open: a plain
	 * utimensat(parent, name, 0) would follow "/esc -> /etc" from the real root */
	int cleanup_close fd = fs_open(&p, O_PATH, 0, err);
	if (fd < 0 && err->code == ENOENT && create) {
		fd = fs_open(&p, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY | O_NONBLOCK, 0644, err);
		if (fd >= 0) {
			/* ours: exactly 0644, whatever the umask */
			struct stat st;
			if (fstat(fd, &st) < 0)
				return err_set(err, errno, p.abs, "stat");
			if ((st.st_mode & 07777) != 0644 && fchmod(fd, 0644) < 0)
				return err_set(err, errno, p.abs, "chmod");
		} else if (err->code == EEXIST) {
			/* a dangling symlink (O_EXCL does not follow it): create its target,
			 * as touch(1) does, still beneath the root */
			fd = fs_open(&p, O_WRONLY | O_CREAT | O_NOCTTY | O_NONBLOCK, 0644, err);
		}
	}
	if (fd < 0)
		return -1;
	if (fs_fd_utimens(fd, ts) < 0)
		return err_set(err, errno, p.abs, "utimensat");
	return op_reply_done(&op->reply, err);
}

/* ---- where and how big ---- */

static int realpath_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__RealpathRequest *r = op->req->realpath;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	int cleanup_close fd = fs_open(&p, O_PATH, 0, err);
	if (fd < 0)
		return -1;
	char buf[PATH_MAX];
	if (fs_fd_path(fd, buf, sizeof(buf), err) < 0)
		return err_path(err, p.abs);
	return reply_path(&op->reply, buf, strlen(buf), err);
}

static int statfs_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__StatfsRequest *r = op->req->statfs;
	struct fs_path p;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	int cleanup_close fd = fs_open(&p, O_PATH, 0, err);
	if (fd < 0)
		return -1;
	struct statfs sf;
	if (fstatfs(fd, &sf) < 0)
		return err_set(err, errno, p.abs, "statfs");
	Shim__V1__StatfsReply sr = SHIM__V1__STATFS_REPLY__INIT;
	/* counts are in fragment-size units, as statvfs and df have them */
	sr.block_size = (uint64_t)(sf.f_frsize ? sf.f_frsize : sf.f_bsize);
	sr.blocks = sf.f_blocks;
	sr.blocks_free = sf.f_bfree;
	sr.blocks_available = sf.f_bavail;
	sr.files = sf.f_files;
	sr.files_free = sf.f_ffree;
	sr.fs_type = (uint64_t)(unsigned long)sf.f_type;
	sr.flags = (uint64_t)sf.f_flags & ~(uint64_t)ST_VALID;
	sr.name_max = (uint64_t)sf.f_namelen;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_STATFS;
	res.statfs = &sr;
	return op_reply_pack(&op->reply, &res, err);
}

/* one-shots: each runs whole on a worker, as the request's identity */
const struct op_kind op_fs_stat_kind = {SHIM__V1__REQUEST__KIND_STAT, "stat", OP_FS, .job = stat_job};
const struct op_kind op_fs_mkdir_kind = {SHIM__V1__REQUEST__KIND_MKDIR, "mkdir", OP_FS, .job = mkdir_job};
const struct op_kind op_fs_remove_kind = {SHIM__V1__REQUEST__KIND_REMOVE, "remove", OP_FS, .job = remove_job};
const struct op_kind op_fs_rename_kind = {SHIM__V1__REQUEST__KIND_RENAME, "rename", OP_FS, .job = rename_job};
const struct op_kind op_fs_chmod_kind = {SHIM__V1__REQUEST__KIND_CHMOD, "chmod", OP_FS, .job = chmod_job};
const struct op_kind op_fs_chown_kind = {SHIM__V1__REQUEST__KIND_CHOWN, "chown", OP_FS, .job = chown_job};
const struct op_kind op_fs_symlink_kind = {SHIM__V1__REQUEST__KIND_SYMLINK, "symlink", OP_FS, .job = symlink_job};
const struct op_kind op_fs_readlink_kind = {SHIM__V1__REQUEST__KIND_READLINK, "readlink", OP_FS, .job = readlink_job};
const struct op_kind op_fs_link_kind = {SHIM__V1__REQUEST__KIND_LINK, "link", OP_FS, .job = link_job};
const struct op_kind op_fs_truncate_kind = {SHIM__V1__REQUEST__KIND_TRUNCATE, "truncate", OP_FS, .job = truncate_job};
const struct op_kind op_fs_set_times_kind = {SHIM__V1__REQUEST__KIND_SET_TIMES, "set_times", OP_FS,
					     .job = set_times_job};
const struct op_kind op_fs_realpath_kind = {SHIM__V1__REQUEST__KIND_REALPATH, "realpath", OP_FS, .job = realpath_job};
const struct op_kind op_fs_statfs_kind = {SHIM__V1__REQUEST__KIND_STATFS, "statfs", OP_FS, .job = statfs_job};
