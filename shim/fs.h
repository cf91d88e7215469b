/* fs.h: path checks and confined resolution (--root) shared by the file operations. */
#ifndef SHIM_FS_H
#define SHIM_FS_H

#include <limits.h>
#include <stdbool.h>
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

/* Check a request's path: absolute, no NUL byte, shorter than PATH_MAX. EINVAL or
 * ENAMETOOLONG otherwise (the error names the path). */
int fs_path_get(const ProtobufCBinaryData *in, struct fs_path *out, struct shim_err *err);

/* open() path (following symlinks, but never out of the root) with flags and mode.
 * Returns an fd or -1 with err naming the path. */
int fs_open(const struct fs_path *p, int flags, mode_t mode, struct shim_err *err);

/* Open the directory holding path's last component (confined like fs_open) and
 * point *name at that component inside name_buf. For "/" the directory is the root
 * itself and the name ".". Trailing slashes are ignored. */
int fs_open_parent(const struct fs_path *p, char name_buf[NAME_MAX + 1], struct shim_err *err);

/* stat (follow) or lstat path, confined. */
int fs_stat(const struct fs_path *p, bool follow, struct stat *st, struct shim_err *err);

/* Fill a FileStat (and its three Timestamps, which it points to) from st. For a
 * symlink, target (len bytes) becomes link_target when not NULL. */
void fs_fill_stat(Shim__V1__FileStat *out, Shim__V1__Timestamp ts[3], const struct stat *st, const char *target,
		  size_t target_len);

/* The path of an open fd as the client sees it (the root prefix removed). */
int fs_fd_path(int fd, char *buf, size_t size, struct shim_err *err);

#endif
