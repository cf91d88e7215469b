/* op_fs_io.c: streamed file reads and atomic writes, with bounded memory and all I/O on workers. */
#include "conn.h"
#include "fs.h"
#include "ops.h"

#include <errno.h>

int op_fs_read(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "read: not implemented yet");
}

int op_fs_write(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "write: not implemented yet");
}
