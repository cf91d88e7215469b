/* sbx.h: the host SDK for sandbox-shim (shim protocol v1). The only public header.
 *
 * Conventions
 * - Every call returns 0 on success and -1 on failure, filling the caller's
 *   struct sbx_error (which may be NULL) and leaving it untouched on success.
 * - Error codes are Linux errno values (ENOENT is 2 on every host), named by
 *   sbx_errno_name() from a fixed table.
 * - A client is thread-safe: any number of threads may run calls on one client at
 *   once; each call is its own stream. Blocking calls run on the caller's thread
 *   (no thread is created per client). A call's timeout and cancel token come in
 *   struct sbx_call_opts; a cancelled call returns -1 with code ECANCELED.
 * - A client can also be driven from the caller's event loop: watch sbx_client_fd()
 *   for readability and call sbx_client_process(); *_async calls report through
 *   callbacks that run on whichever thread routes their last frame: the one in
 *   sbx_client_process(), another call waiting on the same client, or a tunnel's
 *   relay thread. Keep them short and do not block in them.
 * - Every struct passed in or filled in by the library starts with size_t struct_size,
 *   which the caller sets to the sizeof it was compiled with: use the SBX_*_INIT
 *   macros (SBX_CALL_OPTS_INIT, SBX_STAT_INIT, ...), which set it and zero the rest.
 *   The library reads only the caller's struct_size bytes of an input (a field beyond
 *   them reads as zero) and writes only struct_size bytes of an output. struct_size 0
 *   (or smaller than the field itself) is EINVAL; a struct larger than this library
 *   knows is accepted when its unknown tail is all zeros (else E2BIG), and an output's
 *   unknown tail is zeroed. sdk/ABI.md has the rules for growing the ABI.
 */
#ifndef SBX_H
#define SBX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SBX_BUILDING)
#define SBX_API __attribute__((visibility("default")))
#else
#define SBX_API
#endif

#define SBX_VERSION_MAJOR 0
#define SBX_VERSION_MINOR 1
#define SBX_VERSION_PATCH 0
#define SBX_VERSION "0.1.0"
#define SBX_VERSION_NUM ((SBX_VERSION_MAJOR << 16) | (SBX_VERSION_MINOR << 8) | SBX_VERSION_PATCH)
#define SBX_PROTOCOL_VERSION 1

/* The library's version at run time ("0.1.0") and as SBX_VERSION_NUM. */
SBX_API const char *sbx_version(void);
SBX_API unsigned sbx_version_num(void);

/* ---- errors ---- */

enum sbx_error_kind {
	SBX_ERR_NONE = 0,
	SBX_ERR_REMOTE = 1,   /* the operation failed in the shim (code is the shim's errno) */
	SBX_ERR_LOCAL = 2,    /* failed on this side: bad argument, timeout, cancel, local I/O */
	SBX_ERR_CONNECT = 3,  /* could not connect, or the handshake was refused */
	SBX_ERR_PROTOCOL = 4, /* the peer broke the protocol; the client is no longer usable */
	SBX_ERR_EXIT = 5,     /* sbx_eval: the snippet exited non-zero; code is its shell-style status */
};

struct sbx_error {
	int kind;          /* enum sbx_error_kind */
	int code;          /* Linux errno value */
	char message[256]; /* human-readable text, NUL-terminated */
	char path[1024];   /* path or argument concerned ("" if none), NUL-terminated */
};

/* "ENOENT" for 2; NULL for a value Linux does not define. */
SBX_API const char *sbx_errno_name(int code);
/* 2 for "ENOENT"; -1 for an unknown name. */
SBX_API int sbx_errno_from_name(const char *name);
/* Linux's text for a code ("No such file or directory"); "Unknown error" if unknown. */
SBX_API const char *sbx_strerror(int code);
/* One line for an error: "ENOENT: /nope: No such file or directory". Returns buf. */
SBX_API char *sbx_error_format(const struct sbx_error *err, char *buf, size_t size);

/* ---- cancellation ---- */

/* A cancel token: fire it from any thread to cancel the call it was passed to.
 * A fired token stays fired until sbx_cancel_reset(). */
struct sbx_cancel;
SBX_API struct sbx_cancel *sbx_cancel_new(void);
SBX_API void sbx_cancel_fire(struct sbx_cancel *tok);
SBX_API void sbx_cancel_reset(struct sbx_cancel *tok);
SBX_API int sbx_cancel_fired(const struct sbx_cancel *tok);
SBX_API void sbx_cancel_free(struct sbx_cancel *tok);

/* Per-call options; NULL means "the client's default timeout, no cancel token". */
struct sbx_call_opts {
	size_t struct_size;        /* set by SBX_CALL_OPTS_INIT */
	int timeout_ms;            /* 0: the client's default; -1: no timeout */
	struct sbx_cancel *cancel; /* may be NULL */
	/* File operations only (stat, read, write, list, watch, mkdir, remove, rename,
	 * copy, chmod, chown, symlink, readlink, link, truncate, set_times, realpath,
	 * statfs, backup, restore; PROTOCOL.md 12.1.1); other calls ignore them. */
	const char *user;  /* act as this user (name or number): its fsuid, fsgid and groups,
	                      so the kernel's permission checks apply (EACCES, EPERM); NULL:
	                      the shim's --fs-user, or the shim's own identity */
	const char *group; /* name or number: the primary group instead of the user's */
	unsigned resolve;  /* SBX_RESOLVE_* */
};
/* (clang-format 14 would lay out a macro body that starts with { as a block) */
/* clang-format off */
#define SBX_CALL_OPTS_INIT {.struct_size = sizeof(struct sbx_call_opts)}
/* clang-format on */
#define SBX_RESOLVE_NO_FOLLOW 0x1u   /* the path's last component may not be a symlink: ELOOP */
#define SBX_RESOLVE_NO_SYMLINKS 0x2u /* no component of the path may be a symlink: ELOOP */

/* ---- connecting ---- */

/* Called with one line per frame sent ("> ") or received ("< "), decoded. */
typedef void (*sbx_trace_fn)(void *ud, const char *line);

struct sbx_connect_opts {
	size_t struct_size;      /* sizeof(struct sbx_connect_opts): set by SBX_CONNECT_OPTS_INIT */
	const char *token;       /* NULL: $SBX_TOKEN, if set (never for exec: targets) */
	const char *client_name; /* for the shim's logs; NULL: "libsbx/VERSION" */
	int connect_timeout_ms;  /* one connect + handshake attempt; 0: 10000 */
	int wait_ms;             /* keep retrying with backoff for this long while the shim is
	                            not there yet (refused, missing socket, child exited); 0: once */
	int default_timeout_ms;  /* calls' timeout when sbx_call_opts says 0; 0: none */
	sbx_trace_fn trace;      /* NULL: no tracing */
	void *trace_ud;
};
/* clang-format off */
#define SBX_CONNECT_OPTS_INIT {.struct_size = sizeof(struct sbx_connect_opts)}
/* clang-format on */

struct sbx_client;

/* Connect to target and complete the handshake. target (NULL: $SBX_TARGET) is one of
 *   unix:PATH            a unix stream socket
 *   tcp:HOST:PORT        TCP; HOST may be [v6addr]; needs a token
 *   vsock:CID:PORT       AF_VSOCK
 *   fc:UDS_PATH:PORT     Firecracker hybrid vsock ("CONNECT PORT\n", then "OK n\n")
 *   exec:COMMAND...      run COMMAND with /bin/sh -c; talk over its stdin/stdout;
 *                        it is reaped by sbx_client_close(); it gets our environment
 *                        without SBX_TOKEN and SBX_TOKEN_FILE, and a token only from
 *                        opts->token
 * On success *out owns the connection; free it with sbx_client_close(). */
SBX_API int sbx_connect(const char *target, const struct sbx_connect_opts *opts, struct sbx_client **out,
			struct sbx_error *err);

/* Close the connection; in-flight calls on other threads fail with ECONNABORTED.
 * No call may be running on the client once this returns; it must not be used after. */
SBX_API void sbx_client_close(struct sbx_client *c);

/* What the shim said about itself in the handshake. Strings live as long as the client. */
struct sbx_server_info {
	unsigned protocol_version;
	const char *shim_version;
	const char *features; /* space-separated */
	unsigned max_frame;
	unsigned pid;
	int pid1;
	unsigned uid;
	const char *hostname;
	const char *boot_id;
	uint64_t generation; /* bumped by every sbx_resumed(); 0 from a shim without snapshots */
};
SBX_API const struct sbx_server_info *sbx_client_server(const struct sbx_client *c);
/* 1 if the shim announced feature name (e.g. "echo"). */
SBX_API int sbx_client_has_feature(const struct sbx_client *c, const char *name);

/* The file descriptor to watch for readability when driving the client from an
 * event loop, and the call to make when it is readable: reads what is there without
 * blocking, completes calls, runs async callbacks. Returns 0, or -1 when the
 * connection is dead (err says why). */
SBX_API int sbx_client_fd(const struct sbx_client *c);
SBX_API int sbx_client_process(struct sbx_client *c, struct sbx_error *err);
/* Number of calls (sync and async) still in flight. */
SBX_API unsigned sbx_client_pending(struct sbx_client *c);

/* ---- system calls ---- */

/* Send a PING and wait for its PONG; *rtt_ns (may be NULL) gets the round trip. */
SBX_API int sbx_ping(struct sbx_client *c, const struct sbx_call_opts *opts, uint64_t *rtt_ns, struct sbx_error *err);

/* Asynchronous ping: cb runs from sbx_client_process() (or from whatever call is
 * reading on another thread) with status 0 or -1 and err set on failure. */
typedef void (*sbx_ping_cb)(void *ud, int status, uint64_t rtt_ns, const struct sbx_error *err);
SBX_API int sbx_ping_async(struct sbx_client *c, sbx_ping_cb cb, void *ud, struct sbx_error *err);

struct sbx_info {
	size_t struct_size; /* set by SBX_INFO_INIT */
	char shim_version[32];
	unsigned protocol_version;
	char features[256];
	uint64_t uptime_ms;
	unsigned pid;
	int pid1;
	unsigned uid;
	unsigned gid;
	char hostname[256];
	char boot_id[40];
	unsigned connections;
	unsigned streams;
	unsigned processes;
	unsigned mounts;
	uint64_t rss_bytes;
	double load[3];
	unsigned max_connections;
	unsigned max_streams;
	unsigned workers;
	uint64_t generation; /* as sbx_server_info.generation */
};
/* clang-format off */
#define SBX_INFO_INIT {.struct_size = sizeof(struct sbx_info)}
/* clang-format on */
SBX_API int sbx_info(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_info *out,
		     struct sbx_error *err);

/* Send len bytes through the shim's echo stream and receive them back into out
 * (len bytes). Checks a channel's integrity and measures its throughput; the bytes
 * are streamed in frames with flow control, so len may be any size. */
SBX_API int sbx_echo(struct sbx_client *c, const struct sbx_call_opts *opts, const void *data, size_t len, void *out,
		     struct sbx_error *err);

/* ---- files ----
 * Paths are absolute and NUL-terminated; with the shim's --root they resolve beneath
 * that directory. Failures carry the shim's errno and the path concerned. */

enum sbx_file_type {
	SBX_FT_UNKNOWN = 0,
	SBX_FT_FILE = 1,
	SBX_FT_DIRECTORY = 2,
	SBX_FT_SYMLINK = 3,
	SBX_FT_FIFO = 4,
	SBX_FT_SOCKET = 5,
	SBX_FT_BLOCK_DEVICE = 6,
	SBX_FT_CHARACTER_DEVICE = 7,
};
/* "file", "directory", "symlink", "fifo", "socket", "block_device", "character_device"
 * ("unknown" otherwise). */
SBX_API const char *sbx_file_type_name(int type);

struct sbx_timespec {
	int64_t sec;
	uint32_t nsec;
};

struct sbx_stat {
	size_t struct_size; /* set by SBX_STAT_INIT */
	int type;           /* enum sbx_file_type */
	uint64_t size;
	uint32_t mode; /* permission bits with setuid/setgid/sticky (st_mode & 07777) */
	uint32_t uid;
	uint32_t gid;
	uint64_t nlink;
	uint64_t inode;
	uint64_t device;
	uint64_t rdev;
	uint64_t blocks; /* 512-byte blocks allocated */
	struct sbx_timespec atime, mtime, ctime;
	/* A symlink's target (any bytes). In: link_target, a buffer of link_target_size
	 * bytes owned by the caller, or NULL if the target is not wanted. Out:
	 * link_target_len, the target's full length (0 if not a symlink), and the buffer
	 * holds the target NUL-terminated, cut to link_target_size - 1 bytes if longer.
	 * In a struct sbx_dirent the library owns the buffer: valid during the callback. */
	char *link_target;
	size_t link_target_size;
	size_t link_target_len;
};
/* clang-format off */
#define SBX_STAT_INIT {.struct_size = sizeof(struct sbx_stat)}
/* clang-format on */

#define SBX_STAT_FOLLOW 0x1 /* stat the target of a symlink rather than the link */
SBX_API int sbx_stat(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		     struct sbx_stat *out, struct sbx_error *err);
/* 1 if path exists (as lstat sees it), 0 if not (ENOENT or ENOTDIR), -1 on error. */
SBX_API int sbx_exists(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, struct sbx_error *err);

/* A sink for bytes read: return 0 to go on, or an errno value to stop; the call then
 * fails with that code (kind SBX_ERR_LOCAL) after cancelling the read in the shim. */
typedef int (*sbx_sink_fn)(void *ud, const void *buf, size_t len);
/* A source of bytes to write: fill buf with up to len bytes and return how many
 * (0 at the end), or -1 with errno set to abort the write (the old file is kept). */
typedef long (*sbx_source_fn)(void *ud, void *buf, size_t len);

#define SBX_TO_END UINT64_MAX
/* Stream length bytes (SBX_TO_END: all) from offset to sink, with bounded memory.
 * An error after the first byte fails the call: never a short success. *bytes (may
 * be NULL) gets the count delivered. */
SBX_API int sbx_read_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t offset,
			  uint64_t length, sbx_sink_fn sink, void *ud, uint64_t *bytes, struct sbx_error *err);
/* Read a FIFO, a socket or a device too (else such a file fails with EPERM naming its
 * type; a FIFO without a writer, a terminal waits in the shim without holding a thread). */
#define SBX_READ_ALLOW_SPECIAL 0x1
/* sbx_read_file with flags (SBX_READ_*). */
SBX_API int sbx_read_file_ex(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t offset,
			     uint64_t length, int flags, sbx_sink_fn sink, void *ud, uint64_t *bytes,
			     struct sbx_error *err);
/* Read a whole file into a malloc'd buffer (free it with free()); files larger than
 * max bytes fail with EFBIG. */
SBX_API int sbx_read_file_alloc(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, size_t max,
				void **data, size_t *len, struct sbx_error *err);

#define SBX_WRITE_APPEND 0x1         /* append in place */
#define SBX_WRITE_EXCLUSIVE 0x2      /* fail with EEXIST if the path exists */
#define SBX_WRITE_PARENTS 0x4        /* create missing parent directories */
#define SBX_WRITE_NO_ATOMIC 0x8      /* truncate and write in place instead of temp file + rename */
#define SBX_WRITE_ALLOW_SPECIAL 0x10 /* write into a FIFO, socket or device (else EPERM naming its type) */
#define SBX_MODE_KEEP (-1)           /* keep an existing file's mode (0644 for a new file) */
/* Write what source produces to path. By default atomically: the bytes go to a temp
 * file beside path, which is fsync'd and renamed over path only when all arrived;
 * a failure, a cancel or a lost connection leaves the old file as it was. *out (may
 * be NULL) gets the stat of the file written. */
SBX_API int sbx_write_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
			   int mode, sbx_source_fn source, void *ud, struct sbx_stat *out, struct sbx_error *err);
SBX_API int sbx_write_file_buf(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
			       int mode, const void *data, size_t len, struct sbx_stat *out, struct sbx_error *err);

struct sbx_dirent {
	const char *name; /* relative to the listed directory ("sub/file" below depth 1) */
	size_t name_len;  /* names may hold any byte but NUL and '/' per component */
	const struct sbx_stat *stat;
};
/* Return 0 to go on, or an errno value to stop (the call fails with it). */
typedef int (*sbx_dirent_fn)(void *ud, const struct sbx_dirent *e);
#define SBX_LIST_HIDDEN 0x1 /* include names starting with '.' */
#define SBX_LIST_FOLLOW 0x2 /* descend into symlinked directories */
/* Stream the entries of a directory to cb, depth levels deep (1: its own entries;
 * 0: unlimited), without either side holding the whole list. */
SBX_API int sbx_list(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, unsigned depth,
		     int flags, sbx_dirent_fn cb, void *ud, uint64_t *count, struct sbx_error *err);

#define SBX_MKDIR_PARENTS 0x1
SBX_API int sbx_mkdir(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags, int mode,
		      struct sbx_error *err);
#define SBX_REMOVE_RECURSIVE 0x1
SBX_API int sbx_remove(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		       struct sbx_error *err);
#define SBX_RENAME_NOREPLACE 0x1
SBX_API int sbx_rename(struct sbx_client *c, const struct sbx_call_opts *opts, const char *src, const char *dst,
		       int flags, struct sbx_error *err);
#define SBX_COPY_RECURSIVE 0x1
SBX_API int sbx_copy(struct sbx_client *c, const struct sbx_call_opts *opts, const char *src, const char *dst,
		     int flags, struct sbx_error *err);
SBX_API int sbx_chmod(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, unsigned mode,
		      struct sbx_error *err);
#define SBX_CHOWN_NOFOLLOW 0x1
/* uid or gid -1: leave unchanged. */
SBX_API int sbx_chown(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int64_t uid,
		      int64_t gid, int flags, struct sbx_error *err);
SBX_API int sbx_symlink(struct sbx_client *c, const struct sbx_call_opts *opts, const char *target, const char *link,
			struct sbx_error *err);
SBX_API int sbx_link(struct sbx_client *c, const struct sbx_call_opts *opts, const char *target, const char *link,
		     struct sbx_error *err);
/* The target into buf (NUL-terminated); ENAMETOOLONG if it does not fit. Returns the
 * length, or -1. */
SBX_API long sbx_readlink(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, char *buf,
			  size_t size, struct sbx_error *err);
SBX_API long sbx_realpath(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, char *buf,
			  size_t size, struct sbx_error *err);
SBX_API int sbx_truncate(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t size,
			 struct sbx_error *err);
#define SBX_TRUNCATE_ALLOW_SPECIAL 0x1 /* open a FIFO or device too (else EPERM naming its type) */
SBX_API int sbx_truncate_ex(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t size,
			    int flags, struct sbx_error *err);
#define SBX_TOUCH_NO_CREATE 0x1
/* atime/mtime NULL: now. Creates an empty file unless SBX_TOUCH_NO_CREATE. */
SBX_API int sbx_set_times(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path,
			  const struct sbx_timespec *atime, const struct sbx_timespec *mtime, int flags,
			  struct sbx_error *err);

struct sbx_statfs {
	size_t struct_size; /* set by SBX_STATFS_INIT */
	uint64_t block_size;
	uint64_t blocks, blocks_free, blocks_available;
	uint64_t files, files_free;
	uint64_t fs_type; /* f_type magic */
	uint64_t flags;   /* ST_RDONLY (1), ST_NOSUID (2), ... */
	uint64_t name_max;
};
/* clang-format off */
#define SBX_STATFS_INIT {.struct_size = sizeof(struct sbx_statfs)}
/* clang-format on */
SBX_API int sbx_statfs(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, struct sbx_statfs *out,
		       struct sbx_error *err);

enum sbx_watch_type {
	SBX_WATCH_CREATE = 1,
	SBX_WATCH_MODIFY = 2,
	SBX_WATCH_DELETE = 3,
	SBX_WATCH_MOVED_FROM = 4,
	SBX_WATCH_MOVED_TO = 5,
	SBX_WATCH_ATTRIB = 6,
	SBX_WATCH_OVERFLOW = 7,    /* events were dropped: the queue was full */
	SBX_WATCH_DELETE_SELF = 8, /* the watched path went away; the watch ends */
};
/* "create", "modify", "delete", "moved_from", "moved_to", "attrib", "overflow", "delete_self". */
SBX_API const char *sbx_watch_type_name(int type);
struct sbx_watch_event {
	int type;
	const char *path; /* absolute; NULL for overflow */
	size_t path_len;
	int is_dir;
	uint32_t cookie; /* pairs moved_from with moved_to */
};
/* Return 0 to go on, non-zero to end the watch (sbx_watch then returns 0). */
typedef int (*sbx_watch_fn)(void *ud, const struct sbx_watch_event *ev);
#define SBX_WATCH_RECURSIVE 0x1
/* Stream events on path to cb until cb asks to stop, the cancel token fires
 * (ECANCELED), the timeout passes (ETIMEDOUT) or the path is deleted (returns 0). */
SBX_API int sbx_watch(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		      sbx_watch_fn cb, void *ud, struct sbx_error *err);

/* ---- commands and processes ---- */

struct sbx_rlimit {
	const char *name; /* "nofile", "nproc", "as", "cpu", "fsize", "core", "stack", "memlock" */
	uint64_t soft;    /* UINT64_MAX: unlimited */
	uint64_t hard;    /* 0: same as soft */
};

struct sbx_exec_opts {
	size_t struct_size;      /* sizeof(struct sbx_exec_opts): set by SBX_EXEC_OPTS_INIT */
	const char *const *argv; /* NULL-terminated; argv[0] searched in PATH without '/' */
	const char *shell;       /* or a /bin/sh -c string (argv NULL) */
	const char *const *env;  /* NULL-terminated "K=V" entries added to the environment */
	int clear_env;           /* start from an empty environment */
	const char *cwd;         /* NULL: "/" */
	const char *user;        /* NULL: the shim's; name or number */
	const char *group;       /* NULL: the user's primary group */
	int timeout_ms;          /* 0: none; then SIGTERM to the process group, grace, SIGKILL */
	int kill_grace_ms;       /* 0: 5000 */
	int pty;                 /* run on a pseudo-terminal of rows x cols */
	unsigned rows, cols;
	int no_new_privs;
	int drop_caps;                /* drop every capability (bounding set too) but keep_caps */
	const char *const *keep_caps; /* NULL-terminated, e.g. "cap_net_bind_service" */
	const char *seccomp;          /* NULL or "none": no filter; "default": the deny-list; or a policy file */
	const struct sbx_rlimit *rlimits;
	size_t n_rlimits;
	int nice;
	int oom_score_adj;
	const char *name;    /* detached processes: the id to use (default: generated) */
	uint64_t ring_bytes; /* detached: ring buffer per stream (0: 1 MiB) */
};
/* clang-format off */
#define SBX_EXEC_OPTS_INIT {.struct_size = sizeof(struct sbx_exec_opts)}
/* clang-format on */

struct sbx_exit {
	size_t struct_size; /* set by SBX_EXIT_INIT */
	char id[64];
	unsigned pid;
	int exit_code; /* -1 when killed by a signal */
	int signal;    /* terminating signal, 0 if none */
	int core_dumped;
	uint64_t duration_ns;
	int timed_out;
	int stdout_truncated, stderr_truncated;
};
/* clang-format off */
#define SBX_EXIT_INIT {.struct_size = sizeof(struct sbx_exit)}
/* clang-format on */
/* The shell-style status: exit_code, or 128+signal. */
SBX_API int sbx_exit_status(const struct sbx_exit *ex);

/* Collected output of sbx_run(): malloc'd buffers (free with sbx_output_free). */
struct sbx_output {
	char *out, *err;
	size_t out_len, err_len;
};
SBX_API void sbx_output_free(struct sbx_output *o);

/* Run a command to completion: stdin from stdin_data (NULL: /dev/null), stdout and
 * stderr collected into *out, at most cap bytes each (0: 16 MiB); beyond that they
 * are drained and dropped, and ex->*_truncated is set. A non-zero exit is not an
 * error: -1 means the command could not be run (ENOENT, EACCES, EINVAL for an
 * unknown user...) or the call failed (timeout of the call itself, cancel). */
SBX_API int sbx_run(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
		    const void *stdin_data, size_t stdin_len, size_t cap, struct sbx_output *out, struct sbx_exit *ex,
		    struct sbx_error *err);

/* A running command with streamed I/O. */
struct sbx_proc;
#define SBX_PROC_STDIN 0x1 /* the caller will write stdin (else /dev/null) */
/* Start a command and return once it runs (or failed to start). Output is streamed
 * with flow control: a caller that does not read blocks the command, not the shim. */
SBX_API int sbx_exec_start(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
			   int flags, struct sbx_proc **out, struct sbx_error *err);
SBX_API const char *sbx_proc_id(const struct sbx_proc *p);
SBX_API unsigned sbx_proc_pid(const struct sbx_proc *p);
SBX_API int sbx_proc_write(struct sbx_proc *p, const void *buf, size_t len, struct sbx_error *err);
SBX_API int sbx_proc_close_stdin(struct sbx_proc *p, struct sbx_error *err);
#define SBX_STDOUT 1
#define SBX_STDERR 2
/* Read output: returns bytes (>0) with *channel SBX_STDOUT or SBX_STDERR, 0 when both
 * are closed, -1 on error. Waits up to the proc's call timeout. */
SBX_API long sbx_proc_read(struct sbx_proc *p, int *channel, void *buf, size_t size, struct sbx_error *err);
/* Wait for the exit (output not yet read is discarded). */
SBX_API int sbx_proc_wait(struct sbx_proc *p, struct sbx_exit *ex, struct sbx_error *err);
SBX_API int sbx_proc_signal(struct sbx_proc *p, int sig, struct sbx_error *err);
SBX_API int sbx_proc_resize(struct sbx_proc *p, unsigned rows, unsigned cols, struct sbx_error *err);
/* Free the handle; a command still running is killed (its whole process group),
 * unless it was attached to a detached process (then it just detaches). */
SBX_API void sbx_proc_free(struct sbx_proc *p);

/* Background processes: they outlive the connection. */
struct sbx_process_info {
	size_t struct_size; /* set by SBX_PROCESS_INFO_INIT */
	char id[64];
	unsigned pid;
	int running;
	struct sbx_timespec started_at;
	int detached, pty;
	char argv[512]; /* the command line, space-joined, for display */
	/* when !running, as in struct sbx_exit (not embedded, so that either can grow) */
	int exit_code; /* -1 when killed by a signal */
	int signal;    /* terminating signal, 0 if none */
	int core_dumped;
	int timed_out;
	uint64_t duration_ns;
};
/* clang-format off */
#define SBX_PROCESS_INFO_INIT {.struct_size = sizeof(struct sbx_process_info)}
/* clang-format on */
SBX_API int sbx_spawn(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
		      struct sbx_process_info *info, struct sbx_error *err);
typedef int (*sbx_process_fn)(void *ud, const struct sbx_process_info *p);
SBX_API int sbx_ps(struct sbx_client *c, const struct sbx_call_opts *opts, sbx_process_fn cb, void *ud,
		   struct sbx_error *err);
#define SBX_ATTACH_STDIN 0x1
#define SBX_ATTACH_NO_REPLAY 0x2 /* only live output, not the ring buffers' contents */
#define SBX_ATTACH_FOLLOW 0x4    /* keep streaming until the process exits */
/* Attach to a process's output (a replay of its ring buffers, then live output with
 * SBX_ATTACH_FOLLOW); read it with sbx_proc_read(). Freeing the handle detaches. */
SBX_API int sbx_attach(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int flags,
		       struct sbx_proc **out, struct sbx_error *err);
SBX_API int sbx_wait(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, struct sbx_exit *ex,
		     struct sbx_error *err);
/* Signal a process's whole process group. */
SBX_API int sbx_kill(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int sig,
		     struct sbx_error *err);
/* Forget an exited process (EBUSY if it runs, unless kill is set: then it is killed first). */
SBX_API int sbx_rmproc(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int kill,
		       struct sbx_error *err);

/* Run code through an interpreter (interp NULL: {"python3", "-c", NULL}; the code is
 * appended as the last argument) and collect what it printed into *out. A non-zero
 * exit fails with kind SBX_ERR_EXIT, code the shell-style status (exit code, or
 * 128+signal) and a message holding the start of the snippet's stderr; out->err
 * holds all of it (up to 16 MiB) and *ex (may be NULL) the exit status. */
SBX_API int sbx_eval(struct sbx_client *c, const struct sbx_call_opts *opts, const char *const *interp,
		     const char *code, struct sbx_output *out, struct sbx_exit *ex, struct sbx_error *err);

/* ---- backups ---- */

enum sbx_compression { SBX_COMPRESS_NONE = 0, SBX_COMPRESS_GZIP = 1, SBX_COMPRESS_ZSTD = 2 };

/* Progress reports along a backup or restore (bytes of archive, entries). */
typedef void (*sbx_progress_fn)(void *ud, uint64_t bytes, uint64_t entries);

struct sbx_backup_opts {
	size_t struct_size;          /* set by SBX_BACKUP_OPTS_INIT */
	const char *const *excludes; /* NULL-terminated glob patterns (tar's meaning) */
	int compression;             /* enum sbx_compression */
	int level;                   /* 0: the default level */
	int skip_unreadable;         /* list unreadable files in the record instead of failing */
	int one_file_system;         /* leave out mount points below the directory */
	const char *to_path;         /* write the archive to this file in the sandbox (sink unused) */
	sbx_progress_fn progress;
	void *progress_ud;
};
/* clang-format off */
#define SBX_BACKUP_OPTS_INIT {.struct_size = sizeof(struct sbx_backup_opts)}
/* clang-format on */

/* The strings and lists are malloc'd by the library: free them with
 * sbx_backup_record_free() after every call that filled the record, also a failed one
 * (it leaves nothing allocated, so freeing is always safe on a record that started
 * from SBX_BACKUP_RECORD_INIT). */
struct sbx_backup_record {
	size_t struct_size; /* set by SBX_BACKUP_RECORD_INIT */
	char id[40];
	char *dir;
	uint64_t bytes;
	char sha256[65];
	uint64_t entries;
	uint64_t source_bytes;
	int compression;
	char created_at[40]; /* RFC 3339, UTC */
	char **skipped;      /* n_skipped paths (malloc'd; sbx_backup_record_free) */
	size_t n_skipped;
	char **changed; /* files that changed while being read */
	size_t n_changed;
	char *to_path; /* NULL unless the archive went to a file in the sandbox */
};
/* clang-format off */
#define SBX_BACKUP_RECORD_INIT {.struct_size = sizeof(struct sbx_backup_record)}
/* clang-format on */
/* Free dir, to_path and the lists, setting them NULL (and the counts 0); the other
 * fields stay. Safe on a record from SBX_BACKUP_RECORD_INIT and twice. */
SBX_API void sbx_backup_record_free(struct sbx_backup_record *rec);
/* The record as one JSON object (malloc'd; free(); NULL when out of memory): id, dir,
 * bytes, sha256, entries, source_bytes, compression ("none", "gzip", "zstd"), skipped,
 * changed, created_at, and to_path when set. Paths are JSON strings with the short
 * escapes (\n, \t, \r, \b, \f, \", \\); other control characters and bytes that are not
 * valid UTF-8 appear as \u00XX (the byte's value). */
SBX_API char *sbx_backup_record_json(const struct sbx_backup_record *rec);

/* Back up dir: the archive is handed to sink chunk by chunk as the shim writes it
 * (unless bo->to_path), and *rec (may be NULL) gets the record. */
SBX_API int sbx_backup(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
		       const struct sbx_backup_opts *bo, sbx_sink_fn sink, void *ud, struct sbx_backup_record *rec,
		       struct sbx_error *err);
/* The same into a local file, written atomically (temp + rename). */
SBX_API int sbx_backup_to_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
			       const struct sbx_backup_opts *bo, const char *local_path, struct sbx_backup_record *rec,
			       struct sbx_error *err);

struct sbx_restore_opts {
	size_t struct_size;    /* set by SBX_RESTORE_OPTS_INIT */
	int merge;             /* extract into the directory as it is, instead of replacing it */
	const char *sha256;    /* expected sha256 of the archive (hex), checked before the swap */
	const char *from_path; /* read the archive from this file in the sandbox (source unused) */
	int allow_devices;
	sbx_progress_fn progress;
	void *progress_ud;
	/* an archive without members (only the end-of-archive blocks, or a zero-filled
	 * stream) is refused with EBADMSG unless this is set: then dir becomes an empty
	 * directory (merge: it stays as it is). A caller built with an older header,
	 * without the field, gets 0 (struct_size). */
	int allow_empty;
};
/* clang-format off */
#define SBX_RESTORE_OPTS_INIT {.struct_size = sizeof(struct sbx_restore_opts)}
/* clang-format on */

struct sbx_restore_result {
	size_t struct_size; /* set by SBX_RESTORE_RESULT_INIT */
	uint64_t bytes;
	uint64_t entries;
	char sha256[65];
};
/* clang-format off */
#define SBX_RESTORE_RESULT_INIT {.struct_size = sizeof(struct sbx_restore_result)}
/* clang-format on */
/* Restore dir from the archive source produces. Only one whole archive is taken:
 * a stream cut short anywhere, without its end-of-archive blocks, or with data
 * after them fails with EBADMSG. Replace mode is atomic: on any failure (a bad
 * archive, a refused member, a wrong sha256, a cancel) dir is left as it was; merge
 * mode changes nothing either until the archive is complete and verified. */
SBX_API int sbx_restore(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
			const struct sbx_restore_opts *ro, sbx_source_fn source, void *ud,
			struct sbx_restore_result *res, struct sbx_error *err);
/* sbx_restore() from the local file local_path. Its bytes go into the connection by
 * splice() (file -> pipe -> socket: not copied through this process's memory), or are
 * read where the file or the connection takes no splice. */
SBX_API int sbx_restore_from_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
				  const struct sbx_restore_opts *ro, const char *local_path,
				  struct sbx_restore_result *res, struct sbx_error *err);

/* ---- tunnels ----
 * TCP relayed over the shim connection (any transport). A forward tunnel listens on
 * the host and connects each accepted connection to an address inside the sandbox;
 * a reverse tunnel has the shim listen inside and connects each connection accepted
 * there to an address on the host. Every connection is its own stream with its own
 * flow control (a slow reader stalls only its connection), and half-closes are
 * passed on. A tunnel handle runs one background thread; it is usable from any
 * thread. Close every tunnel before sbx_client_close(). Addresses inside the sandbox
 * are numeric (the shim resolves no names); host-side ones may be names. The tunnel's
 * thread reads the connection when no other thread does, so *_async callbacks may
 * also run on it. */

struct sbx_tunnel;

enum sbx_tunnel_kind { SBX_TUNNEL_FORWARD = 1, SBX_TUNNEL_REVERSE = 2 };
enum sbx_tunnel_event_type {
	SBX_TUNNEL_OPEN = 1,  /* a connection is relayed */
	SBX_TUNNEL_CLOSE = 2, /* it ended (err set if it ended on an error) */
	SBX_TUNNEL_FAIL = 3,  /* it could not be made: err says why (ECONNREFUSED...) */
};
struct sbx_tunnel_event {
	int type;                    /* enum sbx_tunnel_event_type */
	uint64_t conn;               /* 1, 2, ... within the tunnel */
	const char *from;            /* the side that connected ("127.0.0.1:51234") */
	const char *to;              /* where it was relayed to */
	uint64_t bytes_in;           /* CLOSE: bytes host -> sandbox */
	uint64_t bytes_out;          /* CLOSE: bytes sandbox -> host */
	const struct sbx_error *err; /* FAIL, and CLOSE after an error; else NULL */
};
/* Called on the tunnel's thread; must not call sbx_tunnel_close() on a tunnel other
 * than its own (closing its own from here is allowed). */
typedef void (*sbx_tunnel_log_fn)(void *ud, const struct sbx_tunnel *t, const struct sbx_tunnel_event *ev);

struct sbx_tunnel_opts {
	size_t struct_size;    /* set by SBX_TUNNEL_OPTS_INIT */
	sbx_tunnel_log_fn log; /* NULL: no per-connection log */
	void *log_ud;
	int connect_timeout_ms; /* per connection, either end; 0: 10000 */
	int backlog;            /* listen() backlog; 0: 128 */
};
/* clang-format off */
#define SBX_TUNNEL_OPTS_INIT {.struct_size = sizeof(struct sbx_tunnel_opts)}
/* clang-format on */

/* Forward: listen on bind_host:bind_port on this host (NULL: 127.0.0.1; port 0: the
 * kernel chooses, see sbx_tunnel_port()) and relay each connection to
 * guest_host:guest_port inside (NULL: 127.0.0.1). Fails with EADDRINUSE (kind LOCAL)
 * when the host port is taken. A connection the shim cannot make (ECONNREFUSED...)
 * is reset on the host side and reported to opts->log as SBX_TUNNEL_FAIL. */
SBX_API int sbx_forward_open(struct sbx_client *c, const char *bind_host, unsigned bind_port, const char *guest_host,
			     unsigned guest_port, const struct sbx_tunnel_opts *opts, struct sbx_tunnel **out,
			     struct sbx_error *err);
/* Reverse: the shim listens on guest_host:guest_port inside (NULL or "localhost":
 * 127.0.0.1 and ::1 both, refused if either is taken; port 0:
 * kernel-chosen) and each connection is relayed to local_host:local_port here (NULL:
 * 127.0.0.1). Fails with EADDRINUSE (kind REMOTE) when the port inside is taken. A
 * connection this side cannot make is reset inside and reported as SBX_TUNNEL_FAIL. */
SBX_API int sbx_reverse_open(struct sbx_client *c, const char *guest_host, unsigned guest_port, const char *local_host,
			     unsigned local_port, const struct sbx_tunnel_opts *opts, struct sbx_tunnel **out,
			     struct sbx_error *err);
/* The shim's id for the tunnel ("t3"). */
SBX_API const char *sbx_tunnel_id(const struct sbx_tunnel *t);
/* The port actually listened on: on the host (forward) or inside (reverse). */
SBX_API unsigned sbx_tunnel_port(const struct sbx_tunnel *t);
/* Connections open now. */
SBX_API unsigned sbx_tunnel_active(struct sbx_tunnel *t);
/* Wait up to timeout_ms (-1: forever) for the tunnel to end by itself (closed by id
 * from elsewhere, the shim shutting down, the connection lost). Returns 1 if it still
 * runs, 0 if it was closed, -1 with err if it ended on an error. */
SBX_API int sbx_tunnel_wait(struct sbx_tunnel *t, int timeout_ms, struct sbx_error *err);
/* Close the tunnel and every connection it carries (both ends see them end), and free
 * the handle. Safe from any thread, once per handle. */
SBX_API void sbx_tunnel_close(struct sbx_tunnel *t);

/* A tunnel as sbx_tunnels_list() reports it: the library's (struct_size is the
 * library's sizeof; read only the fields your header has), freed by sbx_tunnels_free(). */
struct sbx_tunnel_info {
	size_t struct_size; /* the library's sizeof(struct sbx_tunnel_info) */
	char id[16];
	int kind;      /* enum sbx_tunnel_kind */
	char host[64]; /* inside: listened on (reverse) or connected to (forward) */
	unsigned port;
	char remote[128];  /* the host side, as its client described it */
	char client[96];   /* the shim connection that owns it */
	unsigned active;   /* connections open now */
	uint64_t total;    /* connections so far */
	uint64_t bytes_in; /* host -> sandbox */
	uint64_t bytes_out;
};
/* Every tunnel of the shim (all clients'), oldest first: *out is a NULL-terminated
 * array of *n (n may be NULL) pointers to library-allocated records, never NULL on
 * success (an empty list is {NULL}); free it with sbx_tunnels_free(). *out is NULL
 * after a failure. */
SBX_API int sbx_tunnels_list(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_tunnel_info ***out,
			     size_t *n, struct sbx_error *err);
/* Free a list from sbx_tunnels_list() and its records (NULL: nothing). */
SBX_API void sbx_tunnels_free(struct sbx_tunnel_info **list);
/* Close a tunnel by id, whichever client owns it (ENOENT if there is none). */
SBX_API int sbx_tunnel_close_id(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id,
				struct sbx_error *err);

/* ---- mounts (S3 buckets through rclone inside the sandbox) ----
 * The shim writes the credentials into a 0600 rclone config in its private state
 * dir (never on a command line or in another process's environment), starts
 * rclone mount, and answers only when the mount is live (listed as an rclone FUSE
 * mount and answering a statfs and a listing). A mount whose rclone dies is
 * reported SBX_MOUNT_FAILED and its path refuses writes (EROFS) until unmounted. */

enum sbx_mount_state {
	SBX_MOUNT_STARTING = 0,
	SBX_MOUNT_LIVE = 1,
	SBX_MOUNT_FAILED = 2,
	SBX_MOUNT_UNMOUNTING = 3,
	SBX_MOUNT_UNMOUNTED = 4,
};
/* "starting", "live", "failed", "unmounting", "unmounted" ("unknown" otherwise). */
SBX_API const char *sbx_mount_state_name(int state);

struct sbx_mount_opts {
	size_t struct_size;            /* set by SBX_MOUNT_OPTS_INIT */
	const char *endpoint;          /* required: http:// or https:// URL (never defaulted) */
	const char *access_key_id;     /* required */
	const char *secret_access_key; /* required */
	const char *session_token;     /* NULL: none */
	const char *prefix;            /* a key prefix inside the bucket ("dir/sub"); NULL: all */
	const char *region;            /* NULL: rclone's default */
	const char *provider;          /* rclone's s3 provider (AWS, Minio, Ceph, ...); NULL: Other */
	int read_only;
	int allow_non_empty; /* mount over a directory that has entries */
	int timeout_ms;      /* until live; 0: 15000 (the call's own timeout must be longer) */
	/* NULL-terminated allow-listed rclone options, "name=value" or "name" for flags:
	 * "vfs-cache-mode=full", "allow-other", ... (PROTOCOL.md 12.4 has the list) */
	const char *const *options;
};
/* clang-format off */
#define SBX_MOUNT_OPTS_INIT {.struct_size = sizeof(struct sbx_mount_opts)}
/* clang-format on */

/* The strings are malloc'd by the library and never NULL in a filled record ("" when
 * empty). A record sbx_mount() or sbx_unmount() filled is the caller's: free its strings
 * with sbx_mount_record_free() (also after a failed call; safe on a record from
 * SBX_MOUNT_RECORD_INIT and twice). The records of sbx_mounts_list() are the
 * library's (struct_size is the library's sizeof) and sbx_mounts_free() frees them. */
struct sbx_mount_record {
	size_t struct_size; /* set by SBX_MOUNT_RECORD_INIT */
	char id[40];
	char bucket[64];
	char *prefix; /* "" for the whole bucket */
	char *path;
	int read_only;
	int state;           /* enum sbx_mount_state */
	unsigned rclone_pid; /* 0 once rclone has exited */
	char created_at[40]; /* RFC 3339, UTC */
	char *endpoint;
	char *error;     /* failed: what happened, with rclone's last log line; else "" */
	int created_dir; /* the shim created path and removes it at unmount */
};
/* clang-format off */
#define SBX_MOUNT_RECORD_INIT {.struct_size = sizeof(struct sbx_mount_record)}
/* clang-format on */
/* Free the strings of a record sbx_mount() or sbx_unmount() filled, setting them NULL;
 * the other fields stay. */
SBX_API void sbx_mount_record_free(struct sbx_mount_record *rec);
/* The record as one JSON object (malloc'd; free(); NULL when out of memory); strings
 * escaped as sbx_backup_record_json() does (a NULL string as ""). */
SBX_API char *sbx_mount_record_json(const struct sbx_mount_record *rec);

/* Mount bucket at path (absolute, inside the sandbox; created when missing). *rec
 * (may be NULL; start it from SBX_MOUNT_RECORD_INIT, free it with sbx_mount_record_free())
 * gets the record. Errors: EINVAL (bad bucket name, endpoint, path, option), EBUSY
 * (already a mount point), ENOTEMPTY, ENOENT (rclone or fusermount3 not installed:
 * the message says what to install), EACCES (the server refused the keys),
 * ECONNREFUSED, ETIMEDOUT, ...; the message carries rclone's own words. */
SBX_API int sbx_mount(struct sbx_client *c, const struct sbx_call_opts *opts, const char *bucket, const char *path,
		      const struct sbx_mount_opts *mo, struct sbx_mount_record *rec, struct sbx_error *err);

/* Every mount the shim has (live, failed, or on the way): *out is a NULL-terminated
 * array of *n (n may be NULL) pointers to library-allocated records, never NULL on
 * success (an empty list is {NULL}); free it with sbx_mounts_free(). *out is NULL
 * after a failure. */
SBX_API int sbx_mounts_list(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_mount_record ***out,
			    size_t *n, struct sbx_error *err);
/* Free a list from sbx_mounts_list() and its records (NULL: nothing). */
SBX_API void sbx_mounts_free(struct sbx_mount_record **list);

struct sbx_unmount_opts {
	size_t struct_size;   /* set by SBX_UNMOUNT_OPTS_INIT */
	int flush_timeout_ms; /* wait for pending uploads; 0: 60000, -1: do not wait */
	int force;            /* unmount even when uploads are still pending (they are lost) */
};
/* clang-format off */
#define SBX_UNMOUNT_OPTS_INIT {.struct_size = sizeof(struct sbx_unmount_opts)}
/* clang-format on */

/* Unmount by id or by path (an argument starting with '/' is a path): pending
 * uploads are flushed first (ETIMEDOUT, mount left as it was, when they do not finish
 * in time and force is not set), then rclone stops and its config, cache and log
 * are removed, and the directory if the shim created it. Unmounting again returns
 * the same record (state SBX_MOUNT_UNMOUNTED); an unknown id or path is ENOENT. uo
 * and rec may be NULL (rec as in sbx_mount()). */
SBX_API int sbx_unmount(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id_or_path,
			const struct sbx_unmount_opts *uo, struct sbx_mount_record *rec, struct sbx_error *err);

/* ---- microVM snapshots (PROTOCOL.md 12.6) ----
 * sbx_snapshot_prepare() before the host snapshots the VM: the shim syncs, flushes the
 * mounts' pending uploads, and optionally freezes filesystems and stops the detached
 * commands, until sbx_resumed() (on a new connection: a snapshot resets vsock) or the
 * automatic thaw. sbx_resumed() after a resume or in a fork: the host's clock and
 * entropy, a new generation, and everything prepare did undone. */

struct sbx_snapshot_opts {
	size_t struct_size;        /* set by SBX_SNAPSHOT_OPTS_INIT */
	const char *const *freeze; /* NULL-terminated mount points to freeze (FIFREEZE); NULL: none */
	unsigned thaw_after_ms;    /* thaw and continue anyway after this long; 0: 30000 */
	int stop_background;       /* SIGSTOP the process groups of the detached commands */
	unsigned flush_timeout_ms; /* for the mounts' pending uploads; 0: 60000 */
};
/* clang-format off */
#define SBX_SNAPSHOT_OPTS_INIT {.struct_size = sizeof(struct sbx_snapshot_opts)}
/* clang-format on */

struct sbx_resumed_opts {
	size_t struct_size; /* set by SBX_RESUMED_OPTS_INIT */
	int64_t time_sec;   /* the host's wall clock; 0 and 0: the caller's CLOCK_REALTIME now */
	uint32_t time_nsec;
	const void *entropy; /* 32..512 random bytes; NULL: 64 bytes from getrandom() */
	size_t entropy_len;
	int fork; /* this VM is one of several resumed from one snapshot */
};
/* clang-format off */
#define SBX_RESUMED_OPTS_INIT {.struct_size = sizeof(struct sbx_resumed_opts)}
/* clang-format on */

/* One step the shim took, in order. The library's (struct_size its sizeof). */
struct sbx_snapshot_step {
	size_t struct_size;
	const char *name; /* "sync", "flush", "freeze", "stop", "clock", "entropy", "thaw", "continue", "mount" */
	uint64_t duration_us;
	int error;           /* 0: done; else an errno saying why not (EPERM: not allowed) */
	const char *message; /* "" when none */
	const char *path;    /* freeze, thaw: the mount point; "" otherwise */
	unsigned count;      /* stop, continue: process groups; entropy: bits credited; flush: live mounts */
};

/* What sbx_snapshot_prepare() or sbx_resumed() did. Start it from
 * SBX_SNAPSHOT_RESULT_INIT; free it with sbx_snapshot_result_free() (also after a
 * failed call; safe twice). The lists are NULL-terminated, never NULL after success. */
struct sbx_snapshot_result {
	size_t struct_size; /* set by SBX_SNAPSHOT_RESULT_INIT */
	uint64_t generation;
	struct sbx_snapshot_step **steps;
	char **frozen;          /* prepare: the filesystems now frozen */
	char **stopped;         /* prepare: ids of the commands whose groups are stopped */
	unsigned thaw_after_ms; /* prepare: the automatic thaw armed */
	int prepared;           /* resumed: a prepare was held, and is undone */
	int64_t clock_delta_ns; /* resumed: the host's time minus the guest's, before it was set */
};
/* clang-format off */
#define SBX_SNAPSHOT_RESULT_INIT {.struct_size = sizeof(struct sbx_snapshot_result)}
/* clang-format on */
SBX_API void sbx_snapshot_result_free(struct sbx_snapshot_result *r);

/* Errors: EBUSY (a prepare is held already or running; a filesystem the shim needs:
 * "/", its state directory's or its log's), EINVAL (not a mount point, a bad option), EPERM
 * (freezing needs CAP_SYS_ADMIN), EOPNOTSUPP (a filesystem that cannot be frozen);
 * after any of them nothing is frozen or stopped. so and out may be NULL. */
SBX_API int sbx_snapshot_prepare(struct sbx_client *c, const struct sbx_call_opts *opts,
				 const struct sbx_snapshot_opts *so, struct sbx_snapshot_result *out,
				 struct sbx_error *err);
/* Errors: EINVAL (a time before 1970 or more than 10 years ahead of the guest's clock,
 * entropy outside 32..512 bytes). A clock the shim may not set (no CAP_SYS_TIME) or
 * entropy it may not credit (not root) is no failure: the step's error says EPERM.
 * Without a prepare before it, it works and has nothing to undo. ro may be NULL. */
SBX_API int sbx_resumed(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_resumed_opts *ro,
			struct sbx_snapshot_result *out, struct sbx_error *err);

/* ---- frame decoding for debugging ---- */

/* Decoder for a captured raw byte stream (either direction): feed bytes, get one
 * line per frame through cb. */
struct sbx_decoder;
SBX_API struct sbx_decoder *sbx_decoder_new(sbx_trace_fn cb, void *ud);
/* Returns 0, or -1 when the stream cannot be a frame sequence (the line says why). */
SBX_API int sbx_decoder_feed(struct sbx_decoder *d, const void *buf, size_t len);
/* Reports leftover bytes of an unfinished frame, if any; then frees. */
SBX_API void sbx_decoder_free(struct sbx_decoder *d);

#ifdef __cplusplus
}
#endif
#endif
