/* fsctx.c: per-thread identity and resolve flags of the file operation running. */
#include "fsctx.h"

#include <unistd.h>

static _Thread_local unsigned cur_resolve;

unsigned fs_ctx_resolve(void)
{
	return cur_resolve;
}

uid_t fs_ctx_uid(void)
{
	return geteuid();
}

int fs_ctx_enter(const struct fs_ctx *ctx, struct shim_err *err)
{
	(void)err;
	cur_resolve = ctx->resolve;
	return 0;
}

void fs_ctx_leave(void)
{
	cur_resolve = 0;
}
