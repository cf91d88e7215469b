/* layout.c: prints the size and field offsets of sbx.h's structures as JSON, for
 * test_layout.py to compare with the ctypes declarations of sandbox_shim/_lib.py. */
#include <stddef.h>
#include <stdio.h>

#include "sbx.h"

static int first = 1;

static void start(const char *name, size_t size)
{
	printf("%s\"%s\": {\"__size__\": %zu", first ? "" : ",\n", name, size);
	first = 0;
}

#define S(T) start(#T, sizeof(struct T))
#define F(T, f) printf(", \"%s\": %zu", #f, offsetof(struct T, f))
#define E() printf("}")

int main(void)
{
	printf("{\n");
	S(sbx_error), F(sbx_error, code), F(sbx_error, message), F(sbx_error, path), E();
	S(sbx_call_opts), F(sbx_call_opts, cancel), E();
	S(sbx_connect_opts), F(sbx_connect_opts, token), F(sbx_connect_opts, wait_ms), F(sbx_connect_opts, trace_ud),
		E();
	S(sbx_server_info), F(sbx_server_info, features), F(sbx_server_info, pid1), F(sbx_server_info, boot_id), E();
	S(sbx_info), F(sbx_info, uptime_ms), F(sbx_info, hostname), F(sbx_info, rss_bytes), F(sbx_info, load),
		F(sbx_info, workers), E();
	S(sbx_timespec), F(sbx_timespec, nsec), E();
	S(sbx_stat), F(sbx_stat, size), F(sbx_stat, nlink), F(sbx_stat, atime), F(sbx_stat, ctime),
		F(sbx_stat, link_target_len), F(sbx_stat, link_target), E();
	S(sbx_dirent), F(sbx_dirent, name_len), F(sbx_dirent, stat), E();
	S(sbx_statfs), F(sbx_statfs, flags), F(sbx_statfs, name_max), E();
	S(sbx_watch_event), F(sbx_watch_event, path), F(sbx_watch_event, is_dir), F(sbx_watch_event, cookie), E();
	S(sbx_rlimit), F(sbx_rlimit, hard), E();
	S(sbx_exec_opts), F(sbx_exec_opts, argv), F(sbx_exec_opts, clear_env), F(sbx_exec_opts, timeout_ms),
		F(sbx_exec_opts, rows), F(sbx_exec_opts, keep_caps), F(sbx_exec_opts, n_rlimits),
		F(sbx_exec_opts, nice), F(sbx_exec_opts, name), F(sbx_exec_opts, ring_bytes), E();
	S(sbx_exit), F(sbx_exit, pid), F(sbx_exit, duration_ns), F(sbx_exit, stderr_truncated), E();
	S(sbx_output), F(sbx_output, out_len), E();
	S(sbx_process_info), F(sbx_process_info, started_at), F(sbx_process_info, argv), F(sbx_process_info, exit), E();
	S(sbx_backup_opts), F(sbx_backup_opts, excludes), F(sbx_backup_opts, to_path), F(sbx_backup_opts, progress_ud),
		E();
	S(sbx_backup_record), F(sbx_backup_record, bytes), F(sbx_backup_record, sha256), F(sbx_backup_record, entries),
		F(sbx_backup_record, created_at), F(sbx_backup_record, skipped), F(sbx_backup_record, to_path), E();
	S(sbx_restore_opts), F(sbx_restore_opts, sha256), F(sbx_restore_opts, progress_ud), E();
	S(sbx_restore_result), F(sbx_restore_result, sha256), E();
	S(sbx_tunnel_event), F(sbx_tunnel_event, conn), F(sbx_tunnel_event, from), F(sbx_tunnel_event, bytes_out),
		F(sbx_tunnel_event, err), E();
	S(sbx_tunnel_opts), F(sbx_tunnel_opts, log), F(sbx_tunnel_opts, connect_timeout_ms),
		F(sbx_tunnel_opts, backlog), E();
	S(sbx_tunnel_info), F(sbx_tunnel_info, kind), F(sbx_tunnel_info, port), F(sbx_tunnel_info, client),
		F(sbx_tunnel_info, total), F(sbx_tunnel_info, bytes_out), E();
	S(sbx_mount_opts), F(sbx_mount_opts, endpoint), F(sbx_mount_opts, provider), F(sbx_mount_opts, read_only),
		F(sbx_mount_opts, timeout_ms), F(sbx_mount_opts, options), E();
	S(sbx_mount_record), F(sbx_mount_record, bucket), F(sbx_mount_record, path), F(sbx_mount_record, state),
		F(sbx_mount_record, created_at), F(sbx_mount_record, endpoint), F(sbx_mount_record, error),
		F(sbx_mount_record, created_dir), E();
	S(sbx_unmount_opts), F(sbx_unmount_opts, force), E();
	printf("\n}\n");
	return 0;
}
