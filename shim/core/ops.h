/* ops.h: the request kinds the operation families serve, as the dispatch table sees them. */
#ifndef SHIM_OPS_H
#define SHIM_OPS_H

#include "err.h"
#include "shim.pb-c.h"

struct stream;
struct op_kind;

/* The request kinds, one struct op_kind each (op.h), in the files that serve them;
 * dispatch.c's table lists them all. */

/* op_sys.c */
extern const struct op_kind op_sys_info_kind, op_sys_echo_kind;
/* Tests only (0: off): the real size of an echo's pipe, below the room it counts, as when
 * a splice fills its slots with less than a page each: conn.c's fallback to data(). */
extern size_t op_echo_pipe_real_size;
/* op_fs.c: one-shot file operations (on workers); op_fs_copy.c */
extern const struct op_kind op_fs_stat_kind, op_fs_mkdir_kind, op_fs_remove_kind, op_fs_rename_kind, op_fs_chmod_kind,
	op_fs_chown_kind, op_fs_symlink_kind, op_fs_readlink_kind, op_fs_link_kind, op_fs_truncate_kind,
	op_fs_set_times_kind, op_fs_realpath_kind, op_fs_statfs_kind, op_fs_copy_kind;
/* op_fs_io.c, op_fs_list.c, op_fs_watch.c: streamed read and write, listings, watches */
extern const struct op_kind op_fs_read_kind, op_fs_write_kind, op_fs_list_kind, op_fs_watch_kind;
/* op_exec.c: commands (prepared on a worker; fork, pipes and the reaper on the loop);
 * op_proc.c: requests about processes by id (on the loop) */
extern const struct op_kind op_exec_kind, op_signal_kind, op_ps_kind, op_attach_kind, op_wait_kind, op_rmproc_kind,
	op_resize_kind;
/* op_backup.c: tar backups and restores (libarchive, on job threads) */
extern const struct op_kind op_backup_kind, op_restore_kind;
/* op_mount.c: S3 bucket mounts through rclone (the loop side; blocking steps on workers) */
extern const struct op_kind op_mount_kind, op_mounts_kind, op_unmount_kind;
/* op_tunnel.c: TCP tunnels (non-blocking sockets on the loop) */
extern const struct op_kind op_tunnel_listen_kind, op_tunnel_forward_kind, op_tunnel_connect_kind,
	op_tunnel_accept_kind, op_tunnel_list_kind, op_tunnel_close_kind;
/* op_snapshot.c: microVM snapshots (blocking steps on workers); what a prepare holds is
 * the daemon's until resumed, the automatic thaw or shutdown */
extern const struct op_kind op_snapshot_prepare_kind, op_snapshot_resumed_kind;
/* The generation HELLO_OK and info report: 0 at start, bumped by every resumed. */
uint64_t op_snapshot_generation(void);
/* Shutdown: thaw and continue what a prepare holds. */
void op_snapshot_shutdown(void);
/* Thaws under way on workers (that of the shutdown among them): the loop does not end
 * before they are done, unless the shutdown timeout has passed. */
unsigned op_snapshot_thawing(void);

/* op_fs_io.c, for truncate too: special files: "a FIFO", "a socket", "a character
 * device", "a block device", or NULL for anything else; and the refusal of one a request
 * did not allow (1 EPERM, "VERB: a FIFO, not a regular file (allow_special to VERB it)"). */
const char *op_fs_io_special_kind(unsigned mode);
int op_fs_io_refuse_special(struct shim_err *err, const char *path, unsigned mode, const char *verb);

#endif
