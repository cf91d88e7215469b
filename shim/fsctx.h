/* fsctx.h: as whom a file operation acts and how it resolves paths, per thread.
 *
 * A request's FsOptions (or the daemon's --fs-user) become a struct fs_ctx, which
 * the thread doing the file syscalls enters before them and leaves after. The
 * resolver (fs.c) reads the calling thread's flags and identity; the identity is the
 * thread's own fsuid, fsgid and groups (raw syscalls: per thread, unlike the libc
 * wrappers that change every thread of the process), so the kernel's permission
 * checks apply to what the operation touches. */
#ifndef SHIM_FSCTX_H
#define SHIM_FSCTX_H

#include <stdbool.h>
#include <sys/types.h>

#include "err.h"
#include "shim.pb-c.h"

#define FS_NO_FOLLOW 0x1u   /* the last component may not be a symlink: ELOOP */
#define FS_NO_SYMLINKS 0x2u /* no component may be a symlink: ELOOP */

#define FS_CTX_MAX_GROUPS 64

struct fs_ctx {
	unsigned resolve; /* FS_NO_FOLLOW | FS_NO_SYMLINKS */
	bool as_user;     /* uid, gid and groups are set for the operation */
	uid_t uid;
	gid_t gid;
	unsigned ngroups;
	gid_t groups[FS_CTX_MAX_GROUPS];
};

/* The calling thread's resolve flags (0 outside an operation). */
unsigned fs_ctx_resolve(void);
/* The uid the calling thread acts as now (its fsuid; the shim's euid by default). */
uid_t fs_ctx_uid(void);

/* Make ctx the calling thread's for one operation. With as_user, sets the thread's
 * fsuid, fsgid and groups and checks they took (a shim that may not: EPERM).
 * -1 with err; the thread is then unchanged. */
int fs_ctx_enter(const struct fs_ctx *ctx, struct shim_err *err);
/* Back to the shim's own identity and no flags. Idempotent; cheap when nothing was
 * entered. */
void fs_ctx_leave(void);

#endif
