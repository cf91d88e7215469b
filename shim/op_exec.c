/* op_exec.c: exec (foreground and detached), signal, ps, attach, wait, rmproc, resize. */
#include "conn.h"
#include "ops.h"
#include "proc.h"

#include <errno.h>

int op_exec(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "exec: not implemented yet");
}

int op_signal(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "signal: not implemented yet");
}

int op_ps(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "ps: not implemented yet");
}

int op_attach(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "attach: not implemented yet");
}

int op_wait(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "wait: not implemented yet");
}

int op_rmproc(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "rmproc: not implemented yet");
}

int op_resize(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "resize: not implemented yet");
}
