/* fs_walk.c: the one directory walker (levels, fd budget, ".." reopened, mounts, getdents64). */
#include "fs_walk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_walk_mount_of(int fd, uint64_t *id)
{
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) == 0 &&
	    (sx.stx_mask & STATX_MNT_ID)) {
		*id = sx.stx_mnt_id;
		return 0;
	}
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -1;
	*id = (uint64_t)st.st_dev | (1ull << 63);
	return 0;
}

static int failed(struct fs_walk *w, enum fs_walk_fail what, int code)
{
	w->fail = what;
	errno = code;
	return -1;
}

static struct fs_dirbuf *dirbuf_new(void)
{
	struct fs_dirbuf *b = malloc(sizeof(*b));
	if (b != NULL)
		b->fd = -1;
	return b;
}

int fs_walk_init(struct fs_walk *w, unsigned flags, size_t data_size)
{
	memset(w, 0, sizeof(*w));
	w->flags = flags;
	w->data_size = data_size;
	if (!(flags & FS_WALK_LEVEL_BUFS) && (w->buf = dirbuf_new()) == NULL)
		return failed(w, FS_WALK_FAIL_MEMORY, ENOMEM);
	return 0;
}

static struct fs_dirbuf *buf_of(struct fs_walk *w, struct fs_walk_level *l)
{
	return l->buf != NULL ? l->buf : w->buf;
}

/* Give an open level its own buffer (FS_WALK_LEVEL_BUFS). -1 with ENOMEM. */
static int level_buf(struct fs_walk *w, struct fs_walk_level *l)
{
	if ((w->flags & FS_WALK_LEVEL_BUFS) && (l->buf = dirbuf_new()) == NULL)
		return failed(w, FS_WALK_FAIL_MEMORY, ENOMEM);
	return 0;
}

/* Close a level's fds and its own buffer (it stays on the stack, to be opened again). */
static void level_close(struct fs_walk *w, struct fs_walk_level *l)
{
	free(l->buf);
	l->buf = NULL;
	if (l->d.fd >= 0) {
		if (w->buf != NULL)
			fs_dir_forget(w->buf, l->d.fd);
		close(l->d.fd);
		l->d.fd = -1;
	}
	if (l->pfd >= 0) {
		close(l->pfd);
		l->pfd = -1;
	}
}

void fs_walk_free(struct fs_walk *w)
{
	while (w->n > 0)
		fs_walk_pop(w);
	free(w->lv);
	free(w->data);
	free(w->buf);
	w->lv = NULL;
	w->data = NULL;
	w->buf = NULL;
}

int fs_walk_push(struct fs_walk *w, int fd, const struct stat *fst, int pfd)
{
	struct stat st, pst;
	if (fst != NULL)
		st = *fst;
	if (w->n == w->cap) {
		size_t ncap = w->cap ? w->cap * 2 : 16;
		struct fs_walk_level *nl = realloc(w->lv, ncap * sizeof(*nl));
		if (nl != NULL)
			w->lv = nl;
		unsigned char *nd = nl == NULL || w->data_size == 0 ? NULL : realloc(w->data, ncap * w->data_size);
		if (nd != NULL)
			w->data = nd;
		if (nl == NULL || (w->data_size > 0 && nd == NULL)) {
			close(fd);
			if (pfd >= 0)
				close(pfd);
			return failed(w, FS_WALK_FAIL_MEMORY, ENOMEM);
		}
		w->cap = ncap;
	}
	if ((fst == NULL && fstat(fd, &st) < 0) || (pfd >= 0 && fstat(pfd, &pst) < 0) ||
	    (w->n == 0 && (w->flags & FS_WALK_XDEV) && fs_walk_mount_of(fd, &w->mnt) < 0)) {
		int e = errno;
		close(fd);
		if (pfd >= 0)
			close(pfd);
		return failed(w, FS_WALK_FAIL_STAT, e);
	}
	w->lv[w->n] = (struct fs_walk_level){.d = {.fd = fd, .next = 0},
					     .dev = st.st_dev,
					     .ino = st.st_ino,
					     .pfd = pfd,
					     .pdev = pfd >= 0 ? pst.st_dev : 0,
					     .pino = pfd >= 0 ? pst.st_ino : 0};
	if (w->data_size > 0)
		memset(fs_walk_data(w, w->n), 0, w->data_size);
	w->n++;
	if (level_buf(w, fs_walk_top(w)) < 0) {
		fs_walk_pop(w);
		return -1;
	}
	/* just opened: read from its start without an lseek (a shared buffer's
	 * entries of the level above are dropped: it seeks back when it reads on) */
	struct fs_dirbuf *b = buf_of(w, fs_walk_top(w));
	b->fd = fd;
	b->pos = b->len = 0;
	if (w->n > FS_WALK_OPEN && !w->lv[w->n - FS_WALK_OPEN].linked)
		level_close(w, &w->lv[w->n - 1 - FS_WALK_OPEN]);
	return 0;
}

/* Open the level above the deepest again, if it was closed. */
static int reopen_up(struct fs_walk *w)
{
	struct fs_walk_level *l = fs_walk_top(w), *up = fs_walk_up(w);
	if (up == NULL || up->d.fd >= 0)
		return 0;
	up->d.fd = fs_dir_reopen_parent(l->d.fd, up->dev, up->ino);
	if (up->d.fd < 0)
		return failed(w, FS_WALK_FAIL_REOPEN, errno);
	if (level_buf(w, up) < 0)
		return -1;
	if (l->pfd >= 0) {
		up->pfd = fs_dir_reopen_parent(l->pfd, up->pdev, up->pino);
		if (up->pfd < 0)
			return failed(w, FS_WALK_FAIL_PAIRED, errno);
	}
	return 0;
}

int fs_walk_next(struct fs_walk *w)
{
	for (;;) {
		if (w->n == 0)
			return FS_WALK_END;
		if ((w->flags & FS_WALK_CANCEL) && fs_cancel_pending())
			return failed(w, FS_WALK_FAIL_CANCEL, ECANCELED);
		struct fs_walk_level *l = fs_walk_top(w);
		int got = fs_dir_next(buf_of(w, l), &l->d, &w->name, &w->type);
		if (got > 0)
			return FS_WALK_ENTRY;
		if (got < 0 && errno == EINTR)
			continue; /* read on from the last position (cancelled: seen above) */
		if (got < 0)
			return failed(w, FS_WALK_FAIL_READ, errno);
		if (reopen_up(w) < 0)
			return -1;
		return FS_WALK_POST;
	}
}

void fs_walk_pop(struct fs_walk *w)
{
	level_close(w, fs_walk_top(w));
	w->n--;
}

int fs_walk_rewind(struct fs_walk *w)
{
	struct fs_walk_level *l = fs_walk_top(w);
	if (fs_dir_rewind(buf_of(w, l), &l->d) < 0)
		return failed(w, FS_WALK_FAIL_READ, errno);
	return 0;
}

int fs_walk_enter(struct fs_walk *w, const char *name, int flags)
{
	int fd = openat(fs_walk_top(w)->d.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | flags);
	if (fd < 0)
		return failed(w, FS_WALK_FAIL_OPEN, errno);
	if (w->flags & FS_WALK_XDEV) {
		uint64_t m = 0;
		int r = fs_walk_mount_of(fd, &m);
		if (r < 0 || m != w->mnt) {
			int e = r < 0 ? errno : EXDEV;
			close(fd);
			return failed(w, FS_WALK_FAIL_MOUNT, e);
		}
	}
	return fd;
}

bool fs_walk_on_path(const struct fs_walk *w, dev_t dev, ino_t ino)
{
	for (size_t i = 0; i < w->n; i++)
		if (w->lv[i].dev == dev && w->lv[i].ino == ino)
			return true;
	return false;
}
