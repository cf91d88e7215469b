/* op_fs_watch.c: inotify watches streamed as delimited WatchEvent messages. */
#include "conn.h"
#include "fs.h"
#include "ops.h"

#include <errno.h>

int op_fs_watch(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)st;
	(void)req;
	return err_set(err, ENOSYS, NULL, "watch: not implemented yet");
}
