/* fs.c: the SDK's file operations. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

SBX_API const char *sbx_file_type_name(int type)
{
	static const char *const names[] = {
		[SBX_FT_FILE] = "file",
		[SBX_FT_DIRECTORY] = "directory",
		[SBX_FT_SYMLINK] = "symlink",
		[SBX_FT_FIFO] = "fifo",
		[SBX_FT_SOCKET] = "socket",
		[SBX_FT_BLOCK_DEVICE] = "block_device",
		[SBX_FT_CHARACTER_DEVICE] = "character_device",
	};
	if (type <= 0 || type > SBX_FT_CHARACTER_DEVICE)
		return "unknown";
	return names[type];
}

/* A path argument as protobuf bytes; NULL or relative paths are left to the shim
 * to refuse (EINVAL, naming the path). */
static ProtobufCBinaryData pathb(const char *path)
{
	ProtobufCBinaryData b = {path ? strlen(path) : 0, (uint8_t *)(uintptr_t)(path ? path : "")};
	return b;
}

void sbx__stat_from(struct sbx_stat *caller, const Shim__V1__FileStat *f)
{
	struct sbx_stat st, *out = &st;
	sbx__struct_out_get(out, sizeof(*out), caller);
	out->type = f->type;
	out->size = f->size;
	out->mode = f->mode;
	out->uid = f->uid;
	out->gid = f->gid;
	out->nlink = f->nlink;
	out->inode = f->inode;
	out->device = f->device;
	out->rdev = f->rdev;
	out->blocks = f->blocks;
	if (f->atime != NULL)
		out->atime = (struct sbx_timespec){f->atime->sec, f->atime->nsec};
	if (f->mtime != NULL)
		out->mtime = (struct sbx_timespec){f->mtime->sec, f->mtime->nsec};
	if (f->ctime != NULL)
		out->ctime = (struct sbx_timespec){f->ctime->sec, f->ctime->nsec};
	out->link_target_len = f->has_link_target ? f->link_target.len : 0;
	if (out->link_target != NULL && out->link_target_size > 0) {
		size_t n = out->link_target_len < out->link_target_size - 1 ? out->link_target_len :
									      out->link_target_size - 1;
		if (n > 0)
			memcpy(out->link_target, f->link_target.data, n);
		out->link_target[n] = '\0';
	}
	sbx__struct_out_put(caller, out, sizeof(*out));
}

SBX_API int sbx_stat(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		     struct sbx_stat *out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(out, "sbx_stat", err) < 0)
		return -1;
	Shim__V1__StatRequest sr = SHIM__V1__STAT_REQUEST__INIT;
	sr.path = pathb(path);
	if (flags & SBX_STAT_FOLLOW) {
		sr.has_follow = 1;
		sr.follow = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_STAT;
	req.stat = &sr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_STAT, err);
	if (r == NULL)
		return -1;
	if (out != NULL)
		sbx__stat_from(out, r->stat);
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_exists(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_error e;
	if (sbx_stat(c, opts, path, 0, &st, &e) == 0)
		return 1;
	if (e.kind == SBX_ERR_REMOTE && (e.code == ENOENT || e.code == ENOTDIR))
		return 0;
	sbx__copy_error(err, &e);
	return -1;
}

/* ---- one-shot operations ---- */

/* Run req and expect Result.done. */
static int call_done(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
		     struct sbx_error *err)
{
	Shim__V1__Result *r = sbx__call_simple(c, opts, req, SHIM__V1__RESULT__KIND_DONE, err);
	if (r == NULL)
		return -1;
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_mkdir(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags, int mode,
		      struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__MkdirRequest m = SHIM__V1__MKDIR_REQUEST__INIT;
	m.path = pathb(path);
	if (flags & SBX_MKDIR_PARENTS) {
		m.has_parents = 1;
		m.parents = 1;
	}
	/* a negative mode: the shim's default (0755) */
	if (mode >= 0) {
		m.has_mode = 1;
		m.mode = (uint32_t)mode;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_MKDIR;
	req.mkdir = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_remove(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		       struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__RemoveRequest m = SHIM__V1__REMOVE_REQUEST__INIT;
	m.path = pathb(path);
	if (flags & SBX_REMOVE_RECURSIVE) {
		m.has_recursive = 1;
		m.recursive = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_REMOVE;
	req.remove = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_rename(struct sbx_client *c, const struct sbx_call_opts *opts, const char *src, const char *dst,
		       int flags, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__RenameRequest m = SHIM__V1__RENAME_REQUEST__INIT;
	m.src = pathb(src);
	m.dst = pathb(dst);
	if (flags & SBX_RENAME_NOREPLACE) {
		m.has_no_replace = 1;
		m.no_replace = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RENAME;
	req.rename = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_copy(struct sbx_client *c, const struct sbx_call_opts *opts, const char *src, const char *dst,
		     int flags, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__CopyRequest m = SHIM__V1__COPY_REQUEST__INIT;
	m.src = pathb(src);
	m.dst = pathb(dst);
	if (flags & SBX_COPY_RECURSIVE) {
		m.has_recursive = 1;
		m.recursive = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_COPY;
	req.copy = &m;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_COPY, err);
	if (r == NULL)
		return -1;
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_chmod(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, unsigned mode,
		      struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__ChmodRequest m = SHIM__V1__CHMOD_REQUEST__INIT;
	m.path = pathb(path);
	m.has_mode = 1;
	m.mode = mode;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_CHMOD;
	req.chmod = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_chown(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int64_t uid,
		      int64_t gid, int flags, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	/* (uid_t)-1 is "unchanged" to the kernel: never send it as an id */
	if (uid < -1 || uid >= (int64_t)UINT32_MAX)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "uid %lld out of range", (long long)uid);
	if (gid < -1 || gid >= (int64_t)UINT32_MAX)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "gid %lld out of range", (long long)gid);
	Shim__V1__ChownRequest m = SHIM__V1__CHOWN_REQUEST__INIT;
	m.path = pathb(path);
	if (uid >= 0) {
		m.has_uid = 1;
		m.uid = (uint32_t)uid;
	}
	if (gid >= 0) {
		m.has_gid = 1;
		m.gid = (uint32_t)gid;
	}
	if (flags & SBX_CHOWN_NOFOLLOW) {
		m.has_no_follow = 1;
		m.no_follow = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_CHOWN;
	req.chown = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_symlink(struct sbx_client *c, const struct sbx_call_opts *opts, const char *target, const char *link,
			struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__SymlinkRequest m = SHIM__V1__SYMLINK_REQUEST__INIT;
	m.target = pathb(target);
	m.link = pathb(link);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_SYMLINK;
	req.symlink = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_link(struct sbx_client *c, const struct sbx_call_opts *opts, const char *target, const char *link,
		     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__LinkRequest m = SHIM__V1__LINK_REQUEST__INIT;
	m.target = pathb(target);
	m.link = pathb(link);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_LINK;
	req.link = &m;
	return call_done(c, opts, &req, err);
}

/* A PathReply into buf, NUL-terminated: its length, or -1 (ENAMETOOLONG when it
 * does not fit, naming path). */
static long path_result(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
			const char *path, char *buf, size_t size, struct sbx_error *err)
{
	Shim__V1__Result *r = sbx__call_simple(c, opts, req, SHIM__V1__RESULT__KIND_PATH, err);
	if (r == NULL)
		return -1;
	size_t n = r->path->path.len;
	if (buf == NULL || n >= size) {
		shim__v1__result__free_unpacked(r, NULL);
		return sbx__fail(err, SBX_ERR_LOCAL, ENAMETOOLONG, path, "%zu bytes do not fit a buffer of %zu", n,
				 size);
	}
	if (n > 0)
		memcpy(buf, r->path->path.data, n);
	buf[n] = '\0';
	shim__v1__result__free_unpacked(r, NULL);
	return (long)n;
}

SBX_API long sbx_readlink(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, char *buf,
			  size_t size, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__ReadlinkRequest m = SHIM__V1__READLINK_REQUEST__INIT;
	m.path = pathb(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READLINK;
	req.readlink = &m;
	return path_result(c, opts, &req, path, buf, size, err);
}

SBX_API long sbx_realpath(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, char *buf,
			  size_t size, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__RealpathRequest m = SHIM__V1__REALPATH_REQUEST__INIT;
	m.path = pathb(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_REALPATH;
	req.realpath = &m;
	return path_result(c, opts, &req, path, buf, size, err);
}

SBX_API int sbx_truncate(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t size,
			 struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	return sbx_truncate_ex(c, opts, path, size, 0, err);
}

SBX_API int sbx_truncate_ex(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t size,
			    int flags, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if ((flags & ~SBX_TRUNCATE_ALLOW_SPECIAL) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "unknown truncate flags %#x", (unsigned)flags);
	Shim__V1__TruncateRequest m = SHIM__V1__TRUNCATE_REQUEST__INIT;
	m.path = pathb(path);
	m.has_size = 1;
	m.size = size;
	if (flags & SBX_TRUNCATE_ALLOW_SPECIAL)
		m.has_allow_special = m.allow_special = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TRUNCATE;
	req.truncate = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_set_times(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path,
			  const struct sbx_timespec *atime, const struct sbx_timespec *mtime, int flags,
			  struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__SetTimesRequest m = SHIM__V1__SET_TIMES_REQUEST__INIT;
	Shim__V1__Timestamp a = SHIM__V1__TIMESTAMP__INIT, b = SHIM__V1__TIMESTAMP__INIT;
	m.path = pathb(path);
	if (atime != NULL) {
		a.sec = atime->sec;
		a.nsec = atime->nsec;
		m.atime = &a;
	}
	if (mtime != NULL) {
		b.sec = mtime->sec;
		b.nsec = mtime->nsec;
		m.mtime = &b;
	}
	if (flags & SBX_TOUCH_NO_CREATE) {
		m.has_no_create = 1;
		m.no_create = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_SET_TIMES;
	req.set_times = &m;
	return call_done(c, opts, &req, err);
}

SBX_API int sbx_statfs(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, struct sbx_statfs *dst,
		       struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(dst, "sbx_statfs", err) < 0)
		return -1;
	struct sbx_statfs full = {.struct_size = sizeof(full)}, *out = &full;
	Shim__V1__StatfsRequest m = SHIM__V1__STATFS_REQUEST__INIT;
	m.path = pathb(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_STATFS;
	req.statfs = &m;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_STATFS, err);
	if (r == NULL)
		return -1;
	const Shim__V1__StatfsReply *s = r->statfs;
	out->block_size = s->block_size;
	out->blocks = s->blocks;
	out->blocks_free = s->blocks_free;
	out->blocks_available = s->blocks_available;
	out->files = s->files;
	out->files_free = s->files_free;
	out->fs_type = s->fs_type;
	out->flags = s->flags;
	out->name_max = s->name_max;
	shim__v1__result__free_unpacked(r, NULL);
	if (dst != NULL)
		sbx__struct_out_put(dst, out, sizeof(*out));
	return 0;
}
