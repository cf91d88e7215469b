/* op_fs.c: one-shot file operations (stat, mkdir, remove, rename, chmod, ...), each run on a worker. */
#include "fs.h"
#include "ops.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int op_fs_stat(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	const Shim__V1__StatRequest *r = req->stat;
	struct fs_path p;
	struct stat st;
	if (fs_path_get(&r->path, &p, err) < 0)
		return -1;
	bool follow = r->has_follow && r->follow;
	char target[PATH_MAX];
	ssize_t tlen = -1;
	if (follow) {
		if (fs_stat(&p, true, &st, err) < 0)
			return -1;
	} else {
		char name[NAME_MAX + 1];
		int cleanup_close dfd = fs_open_parent(&p, name, err);
		if (dfd < 0)
			return -1;
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return err_set(err, errno, p.abs, "lstat");
		if (S_ISLNK(st.st_mode)) {
			tlen = readlinkat(dfd, name, target, sizeof(target));
			if (tlen < 0)
				return err_set(err, errno, p.abs, "readlink");
		}
	}
	Shim__V1__FileStat fst;
	Shim__V1__Timestamp ts[3];
	fs_fill_stat(&fst, ts, &st, tlen >= 0 ? target : NULL, tlen >= 0 ? (size_t)tlen : 0);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_STAT;
	res.stat = &fst;
	return op_reply_pack(reply, &res, err);
}

int op_fs_mkdir(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "mkdir: not implemented yet");
}

int op_fs_remove(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "remove: not implemented yet");
}

int op_fs_rename(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "rename: not implemented yet");
}

int op_fs_chmod(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "chmod: not implemented yet");
}

int op_fs_chown(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "chown: not implemented yet");
}

int op_fs_symlink(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "symlink: not implemented yet");
}

int op_fs_readlink(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "readlink: not implemented yet");
}

int op_fs_link(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "link: not implemented yet");
}

int op_fs_truncate(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "truncate: not implemented yet");
}

int op_fs_set_times(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "set_times: not implemented yet");
}

int op_fs_realpath(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "realpath: not implemented yet");
}

int op_fs_statfs(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "statfs: not implemented yet");
}
