/* op_fs_list.c: streamed directory listings (delimited DirEntry messages in DATA frames). */
#include "conn.h"
#include "fs.h"
#include "ops.h"

#include <errno.h>

int op_fs_list(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "list: not implemented yet");
}
