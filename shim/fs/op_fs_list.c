/* op_fs_list.c: streamed directory listings (delimited DirEntry messages in DATA frames). */
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "fs.h"
#include "fs_walk.h"
#include "op.h"
#include "ops.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * Wire format: the DATA bytes are one byte stream of DirEntry messages, each preceded
 * by its length as a protobuf varint. Entries MAY be split across DATA frames (a
 * frame is cut wherever credit or the frame limit says); the reader reassembles.
 *
 * Memory: the walk runs on a worker in batches of about LIST_BATCH bytes of encoded
 * entries. The loop sends a batch as credit allows and submits the next batch job
 * only once the previous one is queued on the connection, so at most one batch (plus
 * the walk's one getdents buffer) is held, whatever the directory's size.
 *
 * Recursion is depth-first (an entry, then what is below it, then its next sibling),
 * on the walker (fs_walk.h), at most LIST_MAX_LEVELS levels. A tree deeper than
 * that fails with ELOOP rather than being silently cut short. Symlinks
 * are reported as symlinks (lstat, with their target); with follow_symlinks, a
 * symlink to a directory is also descended into, except when that directory is
 * already on the current path (device and inode), which stops loops such as a -> ..
 *
 * Errors: the listed path itself: its open's errno (ENOENT, ENOTDIR, EACCES...).
 * During a recursive walk, a subdirectory that cannot be opened or read (EACCES,
 * EIO, ...) fails the whole stream with that errno and the subdirectory's path: an
 * error is never turned into a shorter listing. Entries that vanish between readdir
 * and lstat (ENOENT) are skipped: the directory changed while we read it.
 */

#define LIST_BATCH (64u << 10)
/* the largest encoded entry: a name up to PATH_MAX, a link target up to PATH_MAX,
 * the FileStat and the framing */
#define LIST_ENTRY_MAX (2u * PATH_MAX + 512u)
#define LIST_MAX_LEVELS 256
#define LIST_OUT (LIST_BATCH + LIST_ENTRY_MAX)

/* A level's data on the walker: bytes of lister.rel that prefix its entries ("a/b/"). */
struct level {
	size_t rel_len;
};

struct lister {
	struct op *op;
	bool opened;   /* the listed directory is open (first batch done) */
	bool finished; /* the walk is complete: send FIN and END after this batch */
	struct fs_path path;
	size_t base_len; /* path.abs without trailing slashes ("/" -> 0) */
	unsigned depth;  /* 0: unlimited */
	bool follow, hidden;
	struct fs_walk walk; /* levels of struct level */
	char rel[PATH_MAX];
	uint8_t *out; /* the batch: LIST_BATCH + LIST_ENTRY_MAX bytes */
	size_t out_len, out_sent;
	uint64_t entries;
	struct op_job closer; /* the op's last job when it ends early: closes the directories */
};

/* What a listing holds from its start, counted in the daemon's budget: its state,
 * its batch buffer, the walk's getdents buffer and (at their largest) its levels. */
#define LIST_HELD                                                                          \
	(sizeof(struct op) + sizeof(struct lister) + LIST_OUT + sizeof(struct fs_dirbuf) + \
	 LIST_MAX_LEVELS * (sizeof(struct fs_walk_level) + sizeof(struct level)))

static struct level *top_of(struct lister *l)
{
	return fs_walk_data(&l->walk, l->walk.n - 1);
}

/* The absolute path (as the client sees it) of entry name at the top level, or of
 * that level's directory itself when name is NULL. For error messages. */
static const char *abs_of(struct lister *l, const char *name, char *buf, size_t size)
{
	size_t rl = top_of(l)->rel_len;
	if (name == NULL && rl > 0)
		rl--; /* "a/b/" -> "a/b" */
	if (name == NULL && rl == 0)
		snprintf(buf, size, "%s", l->path.abs);
	else
		snprintf(buf, size, "%.*s/%.*s%s", (int)l->base_len, l->path.abs, (int)rl, l->rel, name ? name : "");
	return buf;
}

static int fail_at(struct lister *l, struct shim_err *err, int code, const char *name, const char *what)
{
	char p[PATH_MAX + 256];
	return err_set(err, code, abs_of(l, name, p, sizeof(p)), "%s", what);
}

/* Make fd the deepest level; linked: entered through a symlink (its ".." is not
 * the level above, which must then stay open). */
static int push_level(struct lister *l, int fd, const struct stat *st, size_t rel_len, bool linked,
		      struct shim_err *err)
{
	if (fs_walk_push(&l->walk, fd, st, -1) < 0)
		return err_set(err, errno, NULL, "%s", errno == ENOMEM ? "out of memory" : "stat");
	fs_walk_top(&l->walk)->linked = linked;
	top_of(l)->rel_len = rel_len;
	return 0;
}

/* Should we descend into the entry just listed, and if so, open it. Returns an fd,
 * -2 for "no", or -1 with err set. */
static int open_child(struct lister *l, const char *name, size_t name_len, const struct stat *st, struct stat *dst,
		      struct shim_err *err)
{
	struct level *top = top_of(l);
	if (l->depth != 0 && l->walk.n >= l->depth)
		return -2;
	bool is_link = S_ISLNK(st->st_mode);
	if (!S_ISDIR(st->st_mode) && !(is_link && l->follow))
		return -2;
	int fd;
	if (!is_link) {
		/* one component, no symlink followed: cannot leave the tree (nor --root) */
		fd = fs_walk_enter(&l->walk, name, 0);
	} else {
		/* Follow through the confined resolver: the link may point anywhere, and
		 * with --root "anywhere" must still be beneath the root. */
		struct fs_path p;
		int n = snprintf(p.abs, sizeof(p.abs), "%.*s/%.*s%.*s", (int)l->base_len, l->path.abs,
				 (int)top->rel_len, l->rel, (int)name_len, name);
		if (n < 0 || (size_t)n >= sizeof(p.abs))
			return fail_at(l, err, ENAMETOOLONG, name, "path too long to follow");
		p.len = (size_t)n;
		struct shim_err e;
		fd = fs_open(&p, O_RDONLY | O_DIRECTORY, 0, &e);
		if (fd < 0)
			errno = e.code;
	}
	if (fd < 0) {
		/* changed under us, or a symlink to a non-directory or to nothing */
		if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || (is_link && errno == EXDEV))
			return -2;
		return fail_at(l, err, errno, name, "open directory");
	}
	if (fstat(fd, dst) < 0) {
		int e = errno;
		close(fd);
		return fail_at(l, err, e, name, "stat");
	}
	/* a directory already on the path (a symlink loop, or a bind mount of an
	 * ancestor): listed, not entered */
	if (fs_walk_on_path(&l->walk, dst->st_dev, dst->st_ino)) {
		close(fd);
		return -2;
	}
	if (l->walk.n >= LIST_MAX_LEVELS) {
		close(fd);
		return fail_at(l, err, ELOOP, name, "directory tree deeper than 256 levels");
	}
	return fd;
}

/* One entry of the top level: lstat it, encode it, maybe descend. 0, or -1 with err. */
static int list_entry(struct lister *l, const char *name, struct shim_err *err)
{
	struct level *top = top_of(l);
	int tfd = fs_walk_top(&l->walk)->d.fd;
	size_t name_len = strlen(name);
	if (top->rel_len + name_len + 1 >= sizeof(l->rel))
		return fail_at(l, err, ENAMETOOLONG, name, "path too long");
	struct stat st;
	if (fstatat(tfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0; /* removed since readdir */
		return fail_at(l, err, errno, name, "lstat");
	}
	char target[PATH_MAX + 1];
	ssize_t tlen = -1;
	if (S_ISLNK(st.st_mode)) {
		tlen = readlinkat(tfd, name, target, sizeof(target));
		if (tlen < 0) {
			if (errno == ENOENT)
				return 0;
			return fail_at(l, err, errno, name, "readlink");
		}
		if ((size_t)tlen >= sizeof(target))
			tlen = (ssize_t)sizeof(target) - 1;
	}
	memcpy(l->rel + top->rel_len, name, name_len);

	Shim__V1__FileStat fst;
	Shim__V1__Timestamp ts[3];
	fs_fill_stat(&fst, ts, &st, tlen >= 0 ? target : NULL, tlen >= 0 ? (size_t)tlen : 0);
	Shim__V1__DirEntry de = SHIM__V1__DIR_ENTRY__INIT;
	de.name.data = (uint8_t *)l->rel;
	de.name.len = top->rel_len + name_len;
	de.stat = &fst;
	size_t n = shim__v1__dir_entry__get_packed_size(&de);
	/* the caller keeps out_len below LIST_BATCH; an entry is below LIST_ENTRY_MAX */
	l->out_len += frame_put_varint(l->out + l->out_len, n);
	l->out_len += shim__v1__dir_entry__pack(&de, l->out + l->out_len);
	l->entries++;

	struct stat dst;
	int fd = open_child(l, name, name_len, &st, &dst, err);
	if (fd == -1)
		return -1;
	if (fd >= 0) {
		size_t rel_len = top->rel_len + name_len + 1;
		l->rel[rel_len - 1] = '/';
		if (push_level(l, fd, &dst, rel_len, S_ISLNK(st.st_mode), err) < 0)
			return -1;
	}
	return 0;
}

/* On a worker: fill one batch (the first opens the listed directory). -1 on failure
 * (err set); the caller closes. */
static int list_batch(struct lister *l, struct shim_err *err)
{
	if (!l->opened) {
		int fd = fs_open(&l->path, O_RDONLY | O_DIRECTORY, 0, err);
		if (fd < 0 || push_level(l, fd, NULL, 0, false, err) < 0)
			return -1;
		l->opened = true;
	}
	while (l->out_len < LIST_BATCH) {
		if (worker_cancelled(&l->op->job.work))
			return -1; /* nobody reads the result */
		int got = fs_walk_next(&l->walk);
		if (got == FS_WALK_END) {
			l->finished = true;
			return 0;
		}
		if (got < 0)
			return fail_at(l, err, errno, NULL,
				       l->walk.fail == FS_WALK_FAIL_REOPEN ? "open the directory again" :
									     "read directory");
		if (got == FS_WALK_POST) {
			fs_walk_pop(&l->walk);
			continue;
		}
		const char *name = l->walk.name;
		if (name[0] == '.' && !l->hidden)
			continue;
		if (list_entry(l, name, err) < 0)
			return -1;
	}
	return 0;
}

/* Close every directory of the walk: on a worker (close(2) is a filesystem call too:
 * a FUSE release, an NFS flush). */
static void close_levels(struct lister *l)
{
	while (l->walk.n > 0)
		fs_walk_pop(&l->walk);
}

/* On a worker, as the request's identity (OP_FS): one batch. Failed or no longer
 * wanted, the walk is closed here. */
static int list_job(struct op *op, struct shim_err *err)
{
	struct lister *l = op->data;
	int rc = list_batch(l, err);
	if (rc < 0 || worker_cancelled(&op->job.work))
		close_levels(l);
	return rc;
}

/* On the loop: send the batch within credit; then the next batch, or the end. */
static void list_pump(struct op *op)
{
	struct lister *l = op->data;
	struct stream *st = op->st;
	if (op->jobs != NULL)
		return; /* the batch is being filled */
	while (l->out_sent < l->out_len) {
		size_t n = stream_can_send(st);
		if (n == 0)
			break;
		if (n > l->out_len - l->out_sent)
			n = l->out_len - l->out_sent;
		stream_send_data(st, l->out + l->out_sent, n, false);
		l->out_sent += n;
	}
	if (l->out_sent < l->out_len) {
		stream_wait_writable(st);
		return;
	}
	l->out_len = l->out_sent = 0;
	if (l->finished) {
		stream_send_data(st, NULL, 0, true);
		Shim__V1__ListReply r = SHIM__V1__LIST_REPLY__INIT;
		r.entries = l->entries;
		Shim__V1__Result res = SHIM__V1__RESULT__INIT;
		res.kind_case = SHIM__V1__RESULT__KIND_LIST;
		res.list = &r;
		op_end(op, &res);
		return;
	}
	op_run_job(op);
}

static void close_at_end(struct op *op);

static void list_job_done(struct op *op, int rc, const struct shim_err *err)
{
	if (rc < 0) {
		close_at_end(op); /* (a batch whose identity did not take never ran) */
		op_fail(op, err);
		return;
	}
	((struct lister *)op->data)->out_sent = 0;
	list_pump(op);
}

static void closer_run(struct op_job *j)
{
	close_levels(container_of(j, struct lister, closer));
}

/* The directories still open are closed on a worker by the op's last job, after a
 * batch in flight (interrupted) has returned. */
static void close_at_end(struct op *op)
{
	struct lister *l = op->data;
	l->closer.run = closer_run;
	op_at_end(op, &l->closer);
}

static void list_release(struct op *op)
{
	struct lister *l = op->data;
	if (l == NULL)
		return;
	fs_walk_free(&l->walk);
	budget_free(l->out, LIST_OUT);
	free(l);
	budget_give(LIST_HELD);
}

static int list_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__ListRequest *r = op->req->list;
	if (stream_reserve(op->st, LIST_HELD, err) < 0)
		return -1;
	struct lister *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		budget_give(LIST_HELD);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	op->data = l; /* from here on, list_release gives LIST_HELD back */
	l->op = op;
	if (fs_path_get(&r->path, &l->path, err) < 0)
		return -1;
	l->out = budget_alloc(LIST_OUT);
	if (l->out == NULL || fs_walk_init(&l->walk, 0, sizeof(struct level)) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	l->base_len = l->path.len;
	while (l->base_len > 0 && l->path.abs[l->base_len - 1] == '/')
		l->base_len--;
	l->depth = r->has_depth ? r->depth : 1;
	l->follow = r->has_follow_symlinks && r->follow_symlinks;
	l->hidden = r->has_hidden && r->hidden;
	op_run_job(op);
	return 0;
}

const struct op_kind op_fs_list_kind = {
	SHIM__V1__REQUEST__KIND_LIST,
	"list",
	OP_FS,
	.start = list_start,
	.job = list_job,
	.job_done = list_job_done,
	.writable = list_pump,
	.cancel = close_at_end,
	.release = list_release,
};
