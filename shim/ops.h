/* ops.h: the operation families' entry points, as the dispatch table sees them, and the
 * reply helpers they share (dispatch.c). */
#ifndef SHIM_OPS_H
#define SHIM_OPS_H

#include "err.h"
#include "shim.pb-c.h"

struct stream;

/* A packed Result made on a worker thread, handed to the loop to send. */
struct op_reply {
	uint8_t *buf;
	size_t len;
};
/* dispatch.c: pack res into reply (on the worker). -1 with err (ENOMEM). */
int op_reply_pack(struct op_reply *reply, const Shim__V1__Result *res, struct shim_err *err);
/* Reply with Result.done. */
int op_reply_done(struct op_reply *reply, struct shim_err *err);

/* A blocking operation: runs whole on a worker thread, never on the loop. Returns 0
 * with reply packed, or -1 with err. If the client cancels meanwhile, the stream ends
 * with ECANCELED at once and the worker is interrupted (a blocking syscall gets
 * EINTR where the kernel allows it); the reply is then dropped. */
typedef int (*op_blocking_fn)(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);

/* Start the operation on st. Return 0 when the op has taken over the stream (it ends
 * it with stream_end/stream_fail, now or later), or -1 with err to fail it at once. */
typedef int (*op_start_fn)(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_sys.c */
int op_sys_info(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_sys_echo(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_fs.c: one-shot file operations (blocking, on workers) */
int op_fs_stat(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_mkdir(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_remove(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_rename(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_chmod(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_chown(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_symlink(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_readlink(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_link(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_truncate(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_set_times(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_realpath(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
int op_fs_statfs(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);
/* op_fs_copy.c */
int op_fs_copy(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err);

/* op_fs_io.c: streamed read and write */
/* Special files (op_fs_io.c): "a FIFO", "a socket", "a character device", "a block
 * device", or NULL for anything else; and the refusal of one a request did not allow
 * (1 EPERM, "VERB: a FIFO, not a regular file (allow_special to VERB it)"). */
const char *op_fs_io_special_kind(unsigned mode);
int op_fs_io_refuse_special(struct shim_err *err, const char *path, unsigned mode, const char *verb);
int op_fs_read(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_fs_write(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
/* op_fs_list.c */
int op_fs_list(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
/* op_fs_watch.c */
int op_fs_watch(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_exec.c: commands (prepared on a worker; fork, pipes and the reaper on the loop) */
int op_exec(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
/* op_proc.c: requests about processes by id (on the loop) */
int op_signal(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_ps(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_attach(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_wait(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_rmproc(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_resize(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_backup.c: tar backups and restores (libarchive, on workers) */
int op_backup(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_restore(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_tunnel.c: TCP tunnels (non-blocking sockets on the loop) */
int op_tunnel_listen(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_tunnel_forward(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_tunnel_connect(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_tunnel_accept(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_tunnel_list(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_tunnel_close(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_mount.c: S3 bucket mounts through rclone (the loop side; blocking steps on workers) */
int op_mount(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_mounts(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_unmount(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* dispatch.c: end st with END carrying result (packed there). */
void op_end(struct stream *st, const Shim__V1__Result *result);

#endif
