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
#define FS_CTX_NAME 64 /* a user or group spec, NUL included */

struct fs_ctx {
	unsigned resolve; /* FS_NO_FOLLOW | FS_NO_SYMLINKS */
	bool as_user;     /* uid, gid and groups are set for the operation */
	bool set_groups;  /* with as_user: groups[] too (else the shim's are kept) */
	bool pending;     /* user/group copied on the loop, not looked up yet (fs_ctx_settle) */
	uid_t uid;
	gid_t gid;
	unsigned ngroups;
	gid_t groups[FS_CTX_MAX_GROUPS];
	char user[FS_CTX_NAME]; /* as asked ("" for none): for errors, and for a pending lookup */
	char group[FS_CTX_NAME];
};

/* The calling thread's resolve flags (0 outside an operation). */
unsigned fs_ctx_resolve(void);
/* The uid the calling thread acts as now (its fsuid; the shim's euid by default). */
uid_t fs_ctx_uid(void);
/* And the gid (its fsgid; the shim's egid by default). */
gid_t fs_ctx_gid(void);

/* Make ctx the calling thread's for one operation. With as_user, sets the thread's
 * fsuid, fsgid and groups and checks they took (a shim that may not: EPERM).
 * -1 with err; the thread is then unchanged. */
int fs_ctx_enter(const struct fs_ctx *ctx, struct shim_err *err);
/* Worker side (reads the user database): opt (NULL: none) as a struct fs_ctx. A user
 * or group not named takes the daemon's --fs-user (fs_ctx_set_default) instead, a
 * group named alone applies to that user. user: a name or a number (a number not in
 * the user database: its own number as the group, no supplementary groups); sets the
 * primary group and the user's groups (getgrouplist); group: a name or number,
 * overrides the primary group only (policy_prepare's rules, policy_lookup_ids).
 * Unknown name: EINVAL naming it; more than FS_CTX_MAX_GROUPS groups: E2BIG. A uid
 * and gid equal to the shim's own need no switch (as_user false: the shim's groups). */
int fs_ctx_from_request(const Shim__V1__FsOptions *opt, struct fs_ctx *out, struct shim_err *err);
/* Loop side (no lookups): opt copied into *out for a job that resolves it on its
 * worker; pending when names are to be looked up (EINVAL: a name too long). */
int fs_ctx_defer(const Shim__V1__FsOptions *opt, struct fs_ctx *out, struct shim_err *err);
/* Worker side: look up a pending ctx in place (no-op otherwise). Call it in a job's
 * first work item, before any other can run; fs_ctx_enter of a still pending ctx
 * looks it up each time (correct, slower). */
int fs_ctx_settle(struct fs_ctx *ctx, struct shim_err *err);
/* A job's work item: fs_ctx_settle, then fs_ctx_enter. */
int fs_ctx_begin(struct fs_ctx *ctx, struct shim_err *err);
/* Start-up: --fs-user USER[:GROUP], the identity of requests that name none; tried
 * once on the calling thread (and undone). -1 with err (EINVAL: bad spec or unknown
 * name; EPERM: a shim that may not switch to it). */
int fs_ctx_set_default(const char *spec, struct shim_err *err);

/* Back to the shim's own identity and no flags. Idempotent; cheap when nothing was
 * entered. */
void fs_ctx_leave(void);

/* The shim's own business in the middle of an operation (its journal in the state
 * dir): back to the shim's identity for a moment. fs_ctx_pause returns whether there
 * was an identity to put back; fs_ctx_resume(that) puts it back. */
bool fs_ctx_pause(void);
void fs_ctx_resume(bool paused);

#endif
