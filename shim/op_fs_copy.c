/* op_fs_copy.c: copying a file or a tree (copy_file_range), also behind rename across filesystems. */
#include "fs.h"
#include "ops.h"

#include <errno.h>

int op_fs_copy(const Shim__V1__Request *req, struct op_reply *reply, struct shim_err *err)
{
	(void)req;
	(void)reply;
	return err_set(err, ENOSYS, NULL, "copy: not implemented yet");
}
