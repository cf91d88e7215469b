/* mount.h: S3 bucket mounts through rclone: the request checks, the blocking steps (worker side), the children and the daemon hooks. */
#ifndef SHIM_MOUNT_H
#define SHIM_MOUNT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "err.h"

struct server;

#define MOUNT_MAX 64                   /* mounts at once */
#define MOUNT_MAX_OPTIONS 32           /* allow-listed rclone options per request */
#define MOUNT_DEFAULT_TIMEOUT_MS 15000 /* until live */
#define MOUNT_MAX_TIMEOUT_MS 300000
#define MOUNT_DEFAULT_FLUSH_MS 60000 /* unmount: wait for pending uploads */
#define MOUNT_ARGV_MAX (24 + 2 * MOUNT_MAX_OPTIONS)
/* The fd number the checked mount point has in rclone mount, which (and the fusermount3
 * it runs) gets "/proc/self/fd/63/." as the mount point: the directory that was checked,
 * whatever is renamed or swapped on its path since. High enough to stay clear of the fds
 * Go hands fusermount3 (its socket is fd 3). */
#define MOUNT_POINT_FD 63

/* What the worker needs to prepare a mount: checked strings from the request. The
 * secret fields are wiped (explicit_bzero) when the plan is freed. */
struct mount_plan {
	/* in */
	char *bucket, *prefix, *endpoint, *region, *provider;
	char *access_key, *secret, *session_token;
	char path[PATH_MAX]; /* as the client gave it */
	bool read_only, allow_non_empty;
	char *opt_name[MOUNT_MAX_OPTIONS], *opt_value[MOUNT_MAX_OPTIONS];
	size_t n_opts;
	char state_dir[256];
	char id[40];
	/* out (mount_prepare) */
	char real[PATH_MAX];   /* the mount point in the shim's mount namespace */
	char rundir[PATH_MAX]; /* STATE/mounts/ID: rclone.conf, rclone.log, cache/ */
	bool created_dir;
	char rclone[PATH_MAX]; /* found in PATH */
	char fusermount[PATH_MAX];
	char *argv[MOUNT_ARGV_MAX];
	/* the preflight: rclone lsf of the bucket with few retries, so that a refused
	 * key or a dead server fails fast and with the server's words */
	char *pf_argv[16];
	char *envp[8];
	int log_fd;  /* rclone's stdout and stderr */
	int lock_fd; /* the runtime dir, flock()ed while the mount lives (mount_sweep) */
	int mp_fd;   /* the checked mount point (O_PATH): rclone gets it as MOUNT_POINT_FD */
};

void mount_plan_free(struct mount_plan *pl);

/* ---- checks on the request's strings (mount_req.c; pure: loop or worker). -1 with err. ---- */
int mount_check_bucket(const char *b, struct shim_err *err);
int mount_check_endpoint(const char *e, struct shim_err *err);
int mount_check_prefix(const char *p, struct shim_err *err);
/* region, provider, access key id, secrets: printable, no spaces or newlines */
int mount_check_word(const char *what, const char *v, size_t max, bool secret, struct shim_err *err);
int mount_check_option(const char *name, const char *value, struct shim_err *err);

/* ---- the request (mount_req.c; loop thread) ---- */

struct Shim__V1__MountRequest;
/* Every check on a mount request that needs no filesystem: its strings, options, path
 * and timeout. 0, or -1 with err. */
int mount_check_request(const struct Shim__V1__MountRequest *q, struct shim_err *err);
/* A new plan (caller frees it with mount_plan_free() and free()) with copies of a
 * checked request's strings, for the mount at path (trailing slashes gone) with this
 * id; the secrets are checked once more as C strings. NULL with err. */
struct mount_plan *mount_plan_new(const struct Shim__V1__MountRequest *q, const char *path, const char *id,
				  const char *state_dir, struct shim_err *err);
/* ---- children (mount_spawn.c; loop thread) ---- */

/* fork and exec path with argv and envp (all built before), stdin from /dev/null,
 * stdout and stderr to out_fd (-1: /dev/null), keep_fd (-1: none) as MOUNT_POINT_FD,
 * in cwd (NULL: unchanged) and its own
 * session, dying with the shim: on the loop thread, so that the caller registers the
 * pid with the reaper before returning to the loop and no one can collect its status
 * first. The pid, or -1 with err. */
pid_t mount_spawn(const char *path, char *const argv[], char *const envp[], int out_fd, int keep_fd, const char *cwd,
		  struct shim_err *err);

/* ---- worker side ---- */

/* Find rclone and fusermount3 (ENOENT with what to install), check /dev/fuse, resolve
 * or create the mount point (EBUSY already a mount point, ENOTEMPTY unless allowed,
 * ENOTDIR), create the runtime dir with the 0600 config (O_EXCL), the log and the
 * cache dir, and build rclone's argv and environment. On failure nothing is left. */
int mount_prepare(struct mount_plan *pl, unsigned timeout_ms, struct shim_err *err);

/* The fstype of the topmost mount at path in /proc/self/mountinfo into fstype (""
 * when path is not a mount point). -1 when mountinfo cannot be read. */
int mount_info_find(const char *path, char *fstype, size_t size);

/* Poll until path is an rclone FUSE mount answering statfs and a listing, *exited
 * turns true (rclone died), *abort turns true, or timeout_ms pass. 0 when live; -1
 * with err (ETIMEDOUT, or the listing's errno). */
int mount_wait_live(const char *path, const bool *exited, const bool *abort, unsigned timeout_ms, struct shim_err *err);

/* Number of files rclone's VFS cache still has to upload: those its metadata marks
 * "Dirty": true, plus cache files rclone (pid, 0: not checked) still holds open (a
 * file closed in the sandbox reaches rclone a moment later, and an upload reads from
 * its cache file). 0 when there is no cache. */
unsigned mount_dirty_count(const char *rundir, pid_t pid);

/* True when the topmost mount at path is a FUSE mount. */
bool mount_is_fuse(const char *path);

/* Lazy unmount (MNT_DETACH) of the FUSE mount at path, if there is one: for a busy
 * mount (open files) or one whose FUSE server is gone. 0 when path is no longer a
 * FUSE mount. (fusermount3 -u, the first try, is run from the loop: op_mount.c.) */
int mount_detach(const char *path);

/* Over a path whose rclone died: a read-only empty tmpfs, so that writes fail with
 * EROFS instead of landing in the directory underneath. */
int mount_tombstone(const char *path);

/* The last meaningful line(s) of rclone's log (timestamps dropped), at most size-1
 * bytes; "" when there is none. */
void mount_log_tail(const char *rundir, char *out, size_t size);

/* Worker: note rclone's pid (and start time) in the runtime dir, for mount_sweep(). */
void mount_record_pid(const char *rundir, pid_t pid);

/* Start-up: remove what mounts of a daemon that is gone left in STATE/mounts (the
 * rclone config with its credentials, the log, the cache): every runtime dir no live
 * daemon holds locked. Returns how many were removed. */
unsigned mount_sweep(const char *state_dir);

/* Remove the runtime dir (config, log, cache) and, when created, the mount point. */
void mount_remove_files(const char *rundir, const char *real, bool created_dir);

/* An errno for a failed mount from rclone's words (EACCES for 403, ...), else dflt. */
int mount_classify(const char *tail, int dflt);

/* ---- daemon hooks (op_mount.c, loop thread) ---- */

/* What the snapshot steps (op_snapshot.c) need of one mount: flush its uploads before
 * a snapshot (mount_dirty_count on a worker), check it after a resume. */
struct mount_snap {
	char id[40];
	char path[PATH_MAX];   /* as the client gave it */
	char real[PATH_MAX];   /* the mount point in the shim's namespace */
	char rundir[PATH_MAX]; /* rclone's cache is in it */
	pid_t pid;             /* rclone; 0 once it has exited */
	bool live;             /* MOUNT_LIVE (else starting, failed or unmounting) */
	char error[256];       /* failed: what happened */
};
/* Loop thread: the mounts in the table (at most max of them) into out; their number. */
unsigned op_mount_snapshot(struct mount_snap *out, unsigned max);

/* Number of mounts in the table (for InfoReply.mounts). */
unsigned op_mount_count(void);
/* At shutdown, before children are signalled: unmount every mount (flushing what
 * is pending, bounded); calls then(s) once done (or at once when there is nothing).
 * Returns true when it took over calling then. */
bool op_mount_shutdown_begin(struct server *s, void (*then)(struct server *s));

#endif
