/* op_fs_copy.c: copying a file or a tree (copy_file_range), also behind rename across filesystems. */
#include "fs.h"
#include "fs_walk.h"
#include "fsctx.h"
#include "op.h"
#include "ops.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFR_CHUNK (64u << 20)    /* bytes asked of one copy_file_range: also how often a cancel is seen */
#define RW_BUF_SIZE (256u << 10) /* the read/write fallback's buffer */

struct copy_ctx {
	struct fs_copy_stats *stats;
	const char *spath, *dpath; /* the client's paths, for errors */
	struct shim_err *err;
	bool owners;    /* acting as root: keep uid/gid */
	bool via_link;  /* the source was reached through a symlink: no set-id bits */
	uint8_t *rwbuf; /* allocated on first need */
};

static bool same_inode(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* ---- file content ---- */

/* Copy [off, end) (end < 0: to the end of the file) from sfd to the same offsets
 * in dfd: copy_file_range while the kernel takes it (in-kernel, reflinks where
 * the filesystem can), else pread/pwrite. */
static int copy_range(struct copy_ctx *c, int sfd, int dfd, off_t off, off_t end, bool *use_cfr)
{
	while (end < 0 || off < end) {
		if (fs_cancel_pending())
			return err_set(c->err, ECANCELED, c->dpath, "cancelled");
		uint64_t want = CFR_CHUNK;
		if (end >= 0 && (uint64_t)(end - off) < want)
			want = (uint64_t)(end - off);
		ssize_t n = -1;
		if (*use_cfr) {
			off_t so = off, doff = off;
			n = copy_file_range(sfd, &so, dfd, &doff, (size_t)want, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
				/* another filesystem (older kernels), or one that cannot */
				*use_cfr = false;
				continue;
			}
			if (n < 0)
				return err_set(c->err, errno, c->spath, "copy_file_range");
			if (n == 0) {
				/* the end, or a file whose size the kernel does not know
				 * (procfs, sysfs: st_size 0): read() tells which */
				*use_cfr = false;
				continue;
			}
		} else {
			if (c->rwbuf == NULL && (c->rwbuf = malloc(RW_BUF_SIZE)) == NULL)
				return err_set(c->err, ENOMEM, c->spath, "out of memory");
			if (want > RW_BUF_SIZE)
				want = RW_BUF_SIZE;
			n = pread(sfd, c->rwbuf, (size_t)want, off);
			if (n < 0)
				return err_set(c->err, errno, c->spath, "read");
			if (n == 0)
				break;
			for (ssize_t w = 0; w < n;) {
				ssize_t m = pwrite(dfd, c->rwbuf + w, (size_t)(n - w), off + w);
				if (m < 0)
					return err_set(c->err, errno, c->dpath, "write");
				w += m;
			}
		}
		off += n;
		c->stats->bytes += (uint64_t)n;
	}
	return 0;
}

/* The content of sfd (fstat in *st) into the empty file dfd. A sparse file (fewer
 * blocks than its size) is copied extent by extent, so its holes stay holes. */
static int copy_data(struct copy_ctx *c, int sfd, int dfd, const struct stat *st)
{
	bool use_cfr = true;
	if (st->st_size > 0 && (uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size) {
		off_t off = 0;
		for (;;) {
			off_t data = lseek(sfd, off, SEEK_DATA);
			if (data < 0 && errno == ENXIO)
				break; /* no data past off */
			if (data < 0 && (errno == EINVAL || errno == EOPNOTSUPP))
				return copy_range(c, sfd, dfd, off, -1, &use_cfr);
			if (data < 0)
				return err_set(c->err, errno, c->spath, "lseek");
			off_t hole = lseek(sfd, data, SEEK_HOLE);
			if (hole < 0)
				return err_set(c->err, errno, c->spath, "lseek");
			if (copy_range(c, sfd, dfd, data, hole, &use_cfr) < 0)
				return -1;
			off = hole;
		}
		/* a hole at the end: give the copy its size */
		if (ftruncate(dfd, st->st_size) < 0)
			return err_set(c->err, errno, c->dpath, "truncate");
		return 0;
	}
	return copy_range(c, sfd, dfd, 0, -1, &use_cfr);
}

/* ---- metadata ---- */

/* Owner (when root), then mode (after the owner: chown clears setuid/setgid), then
 * times, on fd (it may be O_PATH). Not for symlinks. */
static int set_meta(struct copy_ctx *c, int fd, const struct stat *st)
{
	if (c->owners && fchownat(fd, "", st->st_uid, st->st_gid, AT_EMPTY_PATH) < 0)
		return err_set(c->err, errno, c->dpath, "chown");
	if (fs_fd_chmod(fd, st->st_mode & 07777) < 0)
		return err_set(c->err, errno, c->dpath, "chmod");
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	if (fs_fd_utimens(fd, ts) < 0)
		return err_set(c->err, errno, c->dpath, "utimensat");
	return 0;
}

/* ---- one entry that is not a directory ---- */

/* Regular file sfd (opened O_RDONLY) to ddir/dname, created here (O_EXCL). */
static int copy_file(struct copy_ctx *c, int sfd, int ddir, const char *dname, bool sync)
{
	struct stat st;
	if (fstat(sfd, &st) < 0)
		return err_set(c->err, errno, c->spath, "stat");
	if (!S_ISREG(st.st_mode))
		return err_set(c->err, EAGAIN, c->spath, "source changed type while being copied");
	if (c->via_link)
		st.st_mode &= (mode_t) ~(S_ISUID | S_ISGID);
	int cleanup_close dfd = openat(ddir, dname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (dfd < 0)
		return err_set(c->err, errno, c->dpath, "open");
	c->stats->entries++;
	if (copy_data(c, sfd, dfd, &st) < 0 || set_meta(c, dfd, &st) < 0)
		return -1;
	if (sync && fsync(dfd) < 0)
		return err_set(c->err, errno, c->dpath, "fsync");
	return 0;
}

/* A symlink, FIFO, socket or device node sdir/sname (lstat in *st), or a regular
 * file (opened here, never following a symlink), to ddir/dname. */
static int copy_node(struct copy_ctx *c, int sdir, const char *sname, const struct stat *st, int ddir,
		     const char *dname, bool sync)
{
	if (S_ISREG(st->st_mode)) {
		/* O_NONBLOCK: should it have become a FIFO meanwhile, open does not hang */
		int cleanup_close sfd = openat(sdir, sname, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
		if (sfd < 0)
			return err_set(c->err, errno, c->spath, "open");
		return copy_file(c, sfd, ddir, dname, sync);
	}
	if (S_ISLNK(st->st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlinkat(sdir, sname, target, sizeof(target) - 1);
		if (n < 0)
			return err_set(c->err, errno, c->spath, "readlink");
		target[n] = '\0';
		if (symlinkat(target, ddir, dname) < 0)
			return err_set(c->err, errno, c->dpath, "symlink");
		c->stats->entries++;
		if (c->owners && fchownat(ddir, dname, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(c->err, errno, c->dpath, "lchown");
		struct timespec ts[2] = {st->st_atim, st->st_mtim};
		if (utimensat(ddir, dname, ts, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(c->err, errno, c->dpath, "utimensat");
		return 0;
	}
	if (S_ISFIFO(st->st_mode) || S_ISSOCK(st->st_mode) || S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) {
		/* device nodes need CAP_MKNOD: EPERM otherwise, as for cp */
		if (mknodat(ddir, dname, (st->st_mode & S_IFMT) | 0600, st->st_rdev) < 0)
			return err_set(c->err, errno, c->dpath, "mknod");
		c->stats->entries++;
		/* O_PATH: the node is named, never opened (no FIFO wait, no device side effect) */
		int cleanup_close fd = openat(ddir, dname, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return err_set(c->err, errno, c->dpath, "open");
		return set_meta(c, fd, st);
	}
	return err_set(c->err, EINVAL, c->spath, "cannot copy a file of type %#o", (unsigned)(st->st_mode & S_IFMT));
}

/* ---- trees ---- */

/* Open sdir/sname and ddir/dname (just created) as directories, and make them
 * the walk's deepest level (source, paired with its copy); *st: the source's. */
static int cp_push(struct copy_ctx *c, struct fs_walk *w, int sdir, const char *sname, int ddir, const char *dname,
		   struct stat *st)
{
	int sfd = openat(sdir, sname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0)
		return err_set(c->err, errno, c->spath, "open");
	if (fstat(sfd, st) < 0) {
		err_set(c->err, errno, c->spath, "stat");
		close(sfd);
		return -1;
	}
	int dfd = openat(ddir, dname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		err_set(c->err, errno, c->dpath, "open");
		close(sfd);
		return -1;
	}
	if (fs_walk_push(w, sfd, st, dfd) < 0)
		return err_set(c->err, errno, w->fail == FS_WALK_FAIL_MEMORY ? c->spath : c->dpath,
			       w->fail == FS_WALK_FAIL_MEMORY ? "out of memory" : "open");
	return 0;
}

/* One step of copy_tree: 1 to go on, 0 at the end, -1 with err. */
static int cp_step(struct copy_ctx *c, struct fs_walk *w)
{
	int got = fs_walk_next(w);
	if (got == FS_WALK_END)
		return 0;
	if (got < 0) {
		if (w->fail == FS_WALK_FAIL_CANCEL)
			return err_set(c->err, ECANCELED, c->dpath, "cancelled");
		if (w->fail == FS_WALK_FAIL_PAIRED)
			return err_set(c->err, errno, c->dpath, "open ..");
		return err_set(c->err, errno, c->spath, "%s", w->fail == FS_WALK_FAIL_REOPEN ? "open .." : "getdents");
	}
	struct fs_walk_level *l = fs_walk_top(w);
	if (got == FS_WALK_POST) {
		/* complete: now its mode (maybe read-only) and times */
		if (set_meta(c, l->pfd, fs_walk_data(w, w->n - 1)) < 0)
			return -1;
		fs_walk_pop(w);
		return 1;
	}
	const char *name = w->name;
	struct stat st;
	if (fstatat(l->d.fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 1; /* gone meanwhile */
		return err_set(c->err, errno, c->spath, "lstat");
	}
	if (!S_ISDIR(st.st_mode))
		return copy_node(c, l->d.fd, name, &st, l->pfd, name, false) < 0 ? -1 : 1;
	/* 0700 while it fills, whatever the source's mode */
	if (mkdirat(l->pfd, name, 0700) < 0)
		return err_set(c->err, errno, c->dpath, "mkdir");
	c->stats->entries++;
	if (cp_push(c, w, l->d.fd, name, l->pfd, name, &st) < 0)
		return -1;
	*(struct stat *)fs_walk_data(w, w->n - 1) = st;
	return 1;
}

/* Everything below the source directory sdir/sname into the new, empty directory
 * ddir/dname, then its own metadata: on the walker, each level of the source
 * paired with its copy, the source's struct stat as the level's data. */
static int copy_tree(struct copy_ctx *c, int sdir, const char *sname, const struct stat *top, int ddir,
		     const char *dname)
{
	struct fs_walk w;
	if (fs_walk_init(&w, FS_WALK_CANCEL, sizeof(struct stat)) < 0)
		return err_set(c->err, ENOMEM, c->spath, "out of memory");
	struct stat st;
	int rc = cp_push(c, &w, sdir, sname, ddir, dname, &st);
	if (rc == 0) {
		*(struct stat *)fs_walk_data(&w, 0) = st;
		if (!same_inode(&st, top))
			rc = err_set(c->err, EAGAIN, c->spath, "source changed while being copied");
	}
	if (rc == 0)
		while ((rc = cp_step(c, &w)) > 0)
			;
	fs_walk_free(&w);
	return rc;
}

/* EINVAL if the directory *src is ddir or one of its ancestors: the copy would
 * land inside what it copies. Walks ".." up to the root (--root or "/"). */
static int check_not_below(struct copy_ctx *c, int ddir, const struct stat *src)
{
	struct stat rst, st, up;
	if (fs_root_stat(&rst) < 0)
		return err_set(c->err, errno, c->dpath, "stat of the root");
	int fd = openat(ddir, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(c->err, errno, c->dpath, "open");
	for (;;) {
		if (fstat(fd, &st) < 0) {
			close(fd);
			return err_set(c->err, errno, c->dpath, "stat");
		}
		if (same_inode(&st, src)) {
			close(fd);
			return err_set(c->err, EINVAL, c->dpath, "cannot copy a directory into itself");
		}
		if (same_inode(&st, &rst))
			break;
		int ufd = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (ufd < 0 || fstat(ufd, &up) < 0) {
			int e = errno;
			if (ufd >= 0)
				close(ufd);
			close(fd);
			return err_set(c->err, e, c->dpath, "open ..");
		}
		close(fd);
		fd = ufd;
		if (same_inode(&up, &st))
			break; /* the top of this process's tree */
	}
	close(fd);
	return 0;
}

/* A name for the copy while it is built: random, so neither a leftover nor
 * anyone else's file can be in the way. */
static void temp_name(char out[64])
{
	uint8_t r[12];
	if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		static unsigned long counter;
		uint64_t t = mono_ns() ^ ((uint64_t)getpid() << 32);
		unsigned long k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
		memcpy(r, &t, 8);
		memcpy(r + 8, &k, 4);
	}
	int o = snprintf(out, 64, ".sbx-copy-");
	for (size_t i = 0; i < sizeof(r); i++)
		o += snprintf(out + o, 64 - (size_t)o, "%02x", r[i]);
}

/* A copy being built under a temporary name in dfd: removed when it goes out of scope
 * unless it was published (leave nothing behind; the first error is the one reported). */
struct copy_temp {
	int dfd;
	bool dir, made, published;
	const char *dpath;
	char name[64];
};

static void copy_temp_drop(struct copy_temp *t)
{
	if (!t->made || t->published)
		return;
	if (t->dir) {
		struct shim_err ignored;
		op_fs_remove_tree(t->dfd, t->name, false, t->dpath, &ignored);
	} else {
		unlinkat(t->dfd, t->name, 0);
	}
}
#define cleanup_copy_temp __attribute__((cleanup(copy_temp_drop)))

static void copy_ctx_done(struct copy_ctx *c)
{
	free(c->rwbuf);
}
#define cleanup_copy_ctx __attribute__((cleanup(copy_ctx_done)))

/* t->name onto dname: 0 or an errno. A filesystem without RENAME_NOREPLACE: check, then
 * a plain rename. */
static int copy_publish(const struct copy_temp *t, const char *dname, unsigned flags)
{
	if (renameat2(t->dfd, t->name, t->dfd, dname, flags) == 0)
		return 0;
	if (errno != EINVAL || !(flags & RENAME_NOREPLACE))
		return errno;
	struct stat dst;
	if (fstatat(t->dfd, dname, &dst, AT_SYMLINK_NOFOLLOW) == 0)
		return EEXIST;
	return renameat(t->dfd, t->name, t->dfd, dname) == 0 ? 0 : errno;
}

int op_fs_copy_entry(int sdfd, const char *sname, int sfd, const struct stat *st, int ddfd, const char *dname,
		     unsigned rename_flags, struct fs_copy_stats *stats, const char *spath, const char *dpath,
		     struct shim_err *err)
{
	struct copy_ctx cleanup_copy_ctx c = {
		.stats = stats,
		.spath = spath,
		.dpath = dpath,
		.err = err,
		/* acting as root (the request's identity, fsctx.h): a user cannot give
		 * files away, so a copy made as a user is that user's */
		.owners = fs_ctx_uid() == 0,
		.via_link = sfd >= 0,
	};
	struct copy_temp cleanup_copy_temp t = {.dfd = ddfd, .dir = S_ISDIR(st->st_mode), .dpath = dpath};
	temp_name(t.name);
	if (t.dir) {
		if (check_not_below(&c, ddfd, st) < 0)
			return -1;
		if (mkdirat(ddfd, t.name, 0700) < 0)
			return err_set(err, errno, dpath, "mkdir");
		t.made = true;
		stats->entries++;
		if (copy_tree(&c, sdfd, sname, st, ddfd, t.name) < 0)
			return -1;
		/* the tree must be on disk before its name is (syncfs needs an fd
		 * that is not O_PATH: ddfd is) */
		int cleanup_close sync_fd = openat(ddfd, t.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sync_fd < 0 || syncfs(sync_fd) < 0)
			return err_set(err, errno, dpath, "syncfs");
	} else {
		t.made = true;
		if (sfd >= 0 ? copy_file(&c, sfd, ddfd, t.name, true) < 0 :
			       copy_node(&c, sdfd, sname, st, ddfd, t.name, true) < 0)
			return -1;
	}
	int e = copy_publish(&t, dname, rename_flags);
	if (e != 0)
		return err_set(err, e, dpath, "rename");
	t.published = true;
	return 0;
}

/* ---- the copy request ---- */

static int copy_job(struct op *op, struct shim_err *err)
{
	const Shim__V1__CopyRequest *r = op->req->copy;
	struct fs_parent cleanup_parent src, dst;
	if (fs_open_parents(&r->src, &r->dst, &src, &dst, err) < 0)
		return -1;
	bool recursive = r->has_recursive && r->recursive;
	struct stat st, dt;
	if (fstatat(src.dfd, src.name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, src.p.abs, "lstat");
	int cleanup_close sfd = -1;
	if (S_ISLNK(st.st_mode) && !recursive) {
		/* like cp without -R: a symlink named as the source is followed (within
		 * the root); with recursive it is copied as a symlink, like cp -R */
		int cleanup_close pfd = fs_open(&src.p, O_PATH, 0, err);
		if (pfd < 0 || fstat(pfd, &st) < 0)
			return pfd < 0 ? -1 : err_set(err, errno, src.p.abs, "stat");
		if (S_ISREG(st.st_mode)) {
			sfd = fs_open(&src.p, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0, err);
			if (sfd < 0)
				return -1;
			struct stat ost;
			if (fstat(sfd, &ost) < 0)
				return err_set(err, errno, src.p.abs, "stat");
			if (!same_inode(&ost, &st))
				return err_set(err, EAGAIN, src.p.abs, "source changed while being opened");
		}
	}
	if (S_ISDIR(st.st_mode) && !recursive)
		return err_set(err, EISDIR, src.p.abs, "a directory needs a recursive copy");
	/* dst is the exact destination: a file there is replaced (atomically), a
	 * directory never is */
	if (fstatat(dst.dfd, dst.name, &dt, AT_SYMLINK_NOFOLLOW) == 0) {
		if (S_ISDIR(st.st_mode))
			return err_set(err, EEXIST, dst.p.abs, "copy");
		if (S_ISDIR(dt.st_mode))
			return err_set(err, EISDIR, dst.p.abs, "copy");
	} else if (errno != ENOENT) {
		return err_set(err, errno, dst.p.abs, "lstat");
	}
	struct fs_copy_stats cs = {0, 0};
	unsigned flags = S_ISDIR(st.st_mode) ? RENAME_NOREPLACE : 0;
	sigset_t old;
	fs_cancel_block(&old);
	int rc =
		op_fs_copy_entry(src.dfd, src.name, sfd, &st, dst.dfd, dst.name, flags, &cs, src.p.abs, dst.p.abs, err);
	fs_cancel_restore(&old);
	if (rc < 0)
		return -1;
	Shim__V1__CopyReply cr = SHIM__V1__COPY_REPLY__INIT;
	cr.bytes = cs.bytes;
	cr.entries = cs.entries;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_COPY;
	res.copy = &cr;
	return op_reply_pack(&op->reply, &res, err);
}

const struct op_kind op_fs_copy_kind = {SHIM__V1__REQUEST__KIND_COPY, "copy", OP_FS, .job = copy_job};
