/* fs.h: path checks and confined resolution (--root) shared by the file operations, and the
 * tree removal and copy that remove, copy and rename share (op_fs.c, op_fs_copy.c). */
#ifndef SHIM_FS_H
#define SHIM_FS_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "err.h"
#include "shim.pb-c.h"

/* A path from a request, checked and NUL-terminated. */
struct fs_path {
	char abs[PATH_MAX]; /* as the client gave it (for errors) */
	size_t len;
};

/* Resolve every path beneath root ("/" or NULL: no confinement). Start-up only. */
int fs_init(const char *root, struct shim_err *err);
/* The root given to fs_init, or NULL. */
const char *fs_root(void);

/* stat of the root ("/", or --root): -1 with errno. */
int fs_root_stat(struct stat *st);

/* Check a request's path: absolute, no NUL byte, shorter than PATH_MAX. EINVAL or
 * ENAMETOOLONG otherwise (the error names the path). */
int fs_path_get(const ProtobufCBinaryData *in, struct fs_path *out, struct shim_err *err);

/* open() path (following symlinks, but never out of the root) with flags and mode.
 * Returns an fd or -1 with err naming the path. A symlink, in the last component or
 * on the way, is followed only when its owner is the acting user (fs_ctx_uid()), the
 * shim's own or the owner of what it points to (to create through a dangling one:
 * only the first two), else EACCES naming the link; the calling thread's
 * FS_NO_FOLLOW / FS_NO_SYMLINKS (fsctx.h) refuse links with ELOOP. Nothing is
 * created or truncated before the links are checked. */
int fs_open(const struct fs_path *p, int flags, mode_t mode, struct shim_err *err);

/* Open the directory holding path's last component (confined and checked like
 * fs_open; FS_NO_FOLLOW does not apply to it, FS_NO_SYMLINKS does) and
 * point *name at that component inside name_buf. For "/" the directory is the root
 * itself and the name ".". Trailing slashes are ignored. */
int fs_open_parent(const struct fs_path *p, char name_buf[NAME_MAX + 1], struct shim_err *err);

/* A path of a two-path request (rename, link, copy) and its parent, open. */
struct fs_parent {
	struct fs_path p;
	char name[NAME_MAX + 1];
	int dfd; /* -1 until opened */
};
static inline void fs_parent_closep(struct fs_parent *x)
{
	if (x->dfd >= 0)
		close(x->dfd);
}
#define cleanup_parent __attribute__((cleanup(fs_parent_closep)))
/* Both paths checked, then both parents opened (fs_path_get, fs_open_parent; the first
 * error is the one reported). -1 with err; what was opened the caller closes
 * (cleanup_parent). */
int fs_open_parents(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b, struct fs_parent *pa,
		    struct fs_parent *pb, struct shim_err *err);

/* stat (follow) or lstat path, confined. */
int fs_stat(const struct fs_path *p, bool follow, struct stat *st, struct shim_err *err);

/* Fill a FileStat (and its three Timestamps, which it points to) from st. For a
 * symlink, target (len bytes) becomes link_target when not NULL. */
void fs_fill_stat(Shim__V1__FileStat *out, Shim__V1__Timestamp ts[3], const struct stat *st, const char *target,
		  size_t target_len);

/* The path of an open fd as the client sees it (the root prefix removed). */
int fs_fd_path(int fd, char *buf, size_t size, struct shim_err *err);

/* chmod and utimensat (ts as for futimens) of an fd that may be O_PATH; -1 with
 * errno. The fd's inode is changed, never a path looked up again. */
int fs_fd_chmod(int fd, mode_t mode);
int fs_fd_utimens(int fd, const struct timespec ts[2]);

/* ---- reading directories by fd (under fs_walk.h's walker; restore_swap.c) ----
 * One entry buffer is shared by every level of a walk, so memory does not grow
 * with the depth; a level keeps only its fd and the getdents position of its next
 * entry, and is read on from there when the walk comes back up to it. */
struct fs_dirbuf {
	int fd; /* the directory whose entries are in buf; -1 for none */
	size_t pos, len;
	char buf[32768] __attribute__((aligned(8))); /* holds struct linux_dirent64 records */
};
struct fs_dirpos {
	int fd;     /* an O_RDONLY|O_DIRECTORY fd of the directory */
	off_t next; /* getdents position of the next entry */
};
/* The next entry of d ("." and ".." skipped): 1 with *name (valid until the next
 * call) and *type (a DT_ value, maybe DT_UNKNOWN), 0 at the end, -1 with errno. */
int fs_dir_next(struct fs_dirbuf *b, struct fs_dirpos *d, const char **name, unsigned char *type);
/* Read d again from its first entry. -1 with errno. */
int fs_dir_rewind(struct fs_dirbuf *b, struct fs_dirpos *d);
/* Call before closing a directory fd that was read through b. */
void fs_dir_forget(struct fs_dirbuf *b, int fd);
/* A walk keeps the fds of its deepest FS_WALK_OPEN levels open and closes those
 * above, so a deep tree cannot run the daemon out of fds; a closed level is opened
 * again on the way back up as the ".." of the level below it, and must still be
 * the same directory (dev, ino), else EAGAIN: the tree was moved meanwhile. */
#define FS_WALK_OPEN 32
/* That reopening: an O_RDONLY|O_DIRECTORY fd of child's "..", or -1 with errno. */
int fs_dir_reopen_parent(int child, dev_t dev, ino_t ino);

/* ---- cancelling long walks ----
 * dispatch cancels a blocking op with worker_interrupt(): a signal to the worker
 * thread, so that a blocking syscall returns EINTR. A copy or a recursive remove
 * makes many short syscalls instead, and would miss it: it blocks the signal while
 * it runs and polls for it between steps. */
#define FS_CANCEL_SIGNAL SIGURG /* worker.c's INTERRUPT_SIGNAL: keep them the same */
/* Block the signal on this thread (the old mask into *old), and restore it (a
 * signal pending meanwhile then reaches worker.c's empty handler). */
void fs_cancel_block(sigset_t *old);
void fs_cancel_restore(const sigset_t *old);
/* True once the operation was cancelled (the signal is pending). */
bool fs_cancel_pending(void);

/* ---- trees (op_fs.c, op_fs_copy.c): shared by remove, copy and rename ---- */

/* op_fs.c: remove the directory dfd/name and everything below it, never following a
 * symlink and never leaving the directory's mount (a mount point below it fails
 * with EBUSY). With cancellable, stops with ECANCELED once fs_cancel_pending()
 * (not when cleaning up). Errors carry errpath (the client's path). */
int op_fs_remove_tree(int dfd, const char *name, bool cancellable, const char *errpath, struct shim_err *err);

struct fs_copy_stats {
	uint64_t bytes;   /* file content copied */
	uint64_t entries; /* files, directories, links and nodes created */
};
/* op_fs_copy.c: copy the entry sdfd/sname (its lstat in *st; a symlink is copied as a
 * symlink, a directory with everything below it) to ddfd/dname, keeping mode, times
 * and (when root) owners. sfd is -1, or the caller's O_RDONLY fd of a regular file
 * to copy instead of opening sdfd/sname (a source reached through a symlink); *st
 * is then its fstat, and the copy gets no set-id bits (S_ISUID, S_ISGID). The copy is built under a temporary name in ddfd, synced, and
 * renamed to dname with renameat2(rename_flags): dname appears complete or not at
 * all, and nothing is left behind on failure. A directory may not be copied into
 * itself or below itself (EINVAL). Stops with ECANCELED once fs_cancel_pending().
 * Counts into *stats; errors name spath (reading) or dpath (writing). */
int op_fs_copy_entry(int sdfd, const char *sname, int sfd, const struct stat *st, int ddfd, const char *dname,
		     unsigned rename_flags, struct fs_copy_stats *stats, const char *spath, const char *dpath,
		     struct shim_err *err);

#endif
