/* fs_walk.h: the one directory walker of remove, copy, list, backup and watch. */
#ifndef SHIM_FS_WALK_H
#define SHIM_FS_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fs.h"

/*
 * A depth-first walk with an explicit stack of levels (no recursion), driven by its
 * caller: fs_walk_next hands out the entries of the deepest level one by one, the
 * caller decides what an entry is and may descend into it (fs_walk_enter, then
 * fs_walk_push); once a level is read to its end, fs_walk_next reports it
 * (FS_WALK_POST) with its parent open again, and the caller pops it (fs_walk_pop),
 * or reads it again (fs_walk_rewind). What the walker guarantees, for every caller:
 *
 * - one entry buffer (struct fs_dirbuf) for the whole walk: memory does not grow
 *   with the depth; a level keeps its fd and the getdents position of its next
 *   entry, and is read on from there (lseek) when the walk comes back up to it
 *   (or one buffer per open level: FS_WALK_LEVEL_BUFS). An entry's name is valid
 *   until the next fs_walk_next, fs_walk_push or fs_walk_pop;
 * - the fd budget: only the deepest FS_WALK_OPEN levels keep their fds; a level
 *   above is opened again on the way back up as the ".." of the level below, and
 *   must still be the same directory (dev, ino), else EAGAIN: the tree was moved;
 * - symlinks inside the tree are never followed (fs_walk_enter uses O_NOFOLLOW; a
 *   caller that follows one on purpose, list, opens it itself and marks the level
 *   linked);
 * - mount crossing: with FS_WALK_XDEV, fs_walk_enter refuses (EXDEV) a directory
 *   on another mount than the walk's top (the mount id where statx has it, so a
 *   bind mount of the same filesystem counts as another mount; else the device);
 * - with FS_WALK_CANCEL, fs_walk_next fails with ECANCELED once fs_cancel_pending().
 *
 * A level may carry a paired fd, walked in step (copy: the copy of the directory),
 * closed and opened again with it (".." of the paired fd below, checked likewise),
 * and caller data of the size given to fs_walk_init (fs_walk_data).
 */

#define FS_WALK_XDEV 1u   /* stay on the top directory's mount */
#define FS_WALK_CANCEL 2u /* poll fs_cancel_pending() */
/* An entry buffer for each open level instead of one for the walk: more memory
 * (up to FS_WALK_OPEN buffers), but coming back up to a level reads on from its
 * buffer rather than seeking and reading its entries again (backup: its walk makes
 * no syscall that GNU tar's does not; with one buffer, one lseek per directory more,
 * and measurably more system time on /usr/share). */
#define FS_WALK_LEVEL_BUFS 4u

enum fs_walk_got {
	FS_WALK_END = 0,   /* no level left */
	FS_WALK_ENTRY = 1, /* w->name, w->type: an entry of the deepest level */
	FS_WALK_POST = 2,  /* the deepest level is read to its end; its parent is open */
};

/* What failed, when a call returns -1 (errno set). */
enum fs_walk_fail {
	FS_WALK_FAIL_NONE,
	FS_WALK_FAIL_MEMORY, /* ENOMEM */
	FS_WALK_FAIL_READ,   /* getdents64 or lseek of the deepest level */
	FS_WALK_FAIL_REOPEN, /* opening a level again as ".." (EAGAIN: moved) */
	FS_WALK_FAIL_PAIRED, /* the same, for the paired fd */
	FS_WALK_FAIL_CANCEL, /* ECANCELED */
	FS_WALK_FAIL_OPEN,   /* fs_walk_enter: openat */
	FS_WALK_FAIL_MOUNT,  /* fs_walk_enter: another mount (EXDEV), or its statx */
	FS_WALK_FAIL_STAT,   /* fs_walk_push: fstat */
};

struct fs_walk_level {
	struct fs_dirpos d; /* d.fd -1 while closed (far above the deepest level) */
	dev_t dev;
	ino_t ino;
	int pfd; /* the paired fd, or -1 */
	dev_t pdev;
	ino_t pino;
	bool linked;           /* entered through a symlink (list): its ".." is not the level
		      * above, which then keeps its fd, whatever the depth */
	struct fs_dirbuf *buf; /* its own (FS_WALK_LEVEL_BUFS) while open, else NULL */
};

struct fs_walk {
	unsigned flags;
	struct fs_dirbuf *buf;
	struct fs_walk_level *lv;
	unsigned char *data; /* data_size bytes per level */
	size_t data_size;
	size_t n, cap;
	uint64_t mnt;       /* the top's mount (FS_WALK_XDEV) */
	const char *name;   /* the entry in hand (FS_WALK_ENTRY) */
	unsigned char type; /* its DT_ value, maybe DT_UNKNOWN */
	enum fs_walk_fail fail;
};

/* 0, or -1 with errno (ENOMEM). */
int fs_walk_init(struct fs_walk *w, unsigned flags, size_t data_size);
/* Close every level and free the walk (its caller data is the caller's to free first). */
void fs_walk_free(struct fs_walk *w);

/* Make fd (an O_RDONLY|O_DIRECTORY fd just opened; st its fstat, or NULL to make
 * one) the deepest level, with pfd (or -1) paired; takes both fds, even on
 * failure. The first level sets the walk's mount. 0, or -1. */
int fs_walk_push(struct fs_walk *w, int fd, const struct stat *st, int pfd);
/* FS_WALK_ENTRY, FS_WALK_POST, FS_WALK_END, or -1 (w->fail, errno). */
int fs_walk_next(struct fs_walk *w);
/* Drop the deepest level (after FS_WALK_POST, or to stop early). */
void fs_walk_pop(struct fs_walk *w);
/* Read the deepest level again from its first entry. 0, or -1. */
int fs_walk_rewind(struct fs_walk *w);
/* Open name of the deepest level as a directory (O_NOFOLLOW), within the mount
 * policy: an fd to push, or -1 (w->fail, errno; ENOENT, ENOTDIR, ELOOP when it
 * changed meanwhile). flags: extra open flags (O_NOATIME). */
int fs_walk_enter(struct fs_walk *w, const char *name, int flags);

/* The deepest level, the one above it (NULL at the top), and a level's data. */
static inline struct fs_walk_level *fs_walk_top(struct fs_walk *w)
{
	return &w->lv[w->n - 1];
}
static inline struct fs_walk_level *fs_walk_up(struct fs_walk *w)
{
	return w->n > 1 ? &w->lv[w->n - 2] : NULL;
}
static inline void *fs_walk_data(struct fs_walk *w, size_t i)
{
	return w->data + i * w->data_size;
}
/* Is (dev, ino) one of the levels (a directory already on the path)? */
bool fs_walk_on_path(const struct fs_walk *w, dev_t dev, ino_t ino);
/* The mount fd is on (see FS_WALK_XDEV). -1 with errno. */
int fs_walk_mount_of(int fd, uint64_t *id);

#endif
