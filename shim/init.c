/* init.c: PID-1 duties: subreaper set-up, the supervised workload, signal forwarding. */
#include "init.h"
#include "server.h"

#include <errno.h>
#include <sys/prctl.h>

int init_setup(struct server *s, struct shim_err *err)
{
	if (!s->pid1 && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		return err_set(err, errno, NULL, "prctl(PR_SET_CHILD_SUBREAPER)");
	return 0;
}

int init_start_workload(struct server *s, char *const argv[], struct shim_err *err)
{
	(void)s;
	(void)argv;
	return err_set(err, ENOSYS, NULL, "workloads are not supported yet");
}
