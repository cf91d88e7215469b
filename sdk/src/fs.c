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

void sbx__stat_from(struct sbx_stat *out, const Shim__V1__FileStat *f)
{
	memset(out, 0, offsetof(struct sbx_stat, link_target));
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
	size_t n = 0;
	if (f->has_link_target) {
		n = f->link_target.len < sizeof(out->link_target) - 1 ? f->link_target.len :
									sizeof(out->link_target) - 1;
		memcpy(out->link_target, f->link_target.data, n);
	}
	out->link_target[n] = '\0';
	out->link_target_len = n;
}

SBX_API int sbx_stat(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		     struct sbx_stat *out, struct sbx_error *err)
{
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
	sbx__stat_from(out, r->stat);
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_exists(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, struct sbx_error *err)
{
	struct sbx_stat st;
	struct sbx_error e;
	if (sbx_stat(c, opts, path, 0, &st, &e) == 0)
		return 1;
	if (e.kind == SBX_ERR_REMOTE && (e.code == ENOENT || e.code == ENOTDIR))
		return 0;
	sbx__copy_error(err, &e);
	return -1;
}
