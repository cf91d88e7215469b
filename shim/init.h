/* init.h: PID-1 duties: reaping orphans, supervising a workload, forwarding signals. */
#ifndef SHIM_INIT_H
#define SHIM_INIT_H

#include "err.h"

struct server;

/* At start-up: as PID 1 take the init role; otherwise become a child subreaper so
 * that what commands leave behind is still reaped here. */
int init_setup(struct server *s, struct shim_err *err);

/* Start the workload given after "--"; the daemon then exits with its status
 * (128+signal when signalled, 127/126 when it cannot be started). */
int init_start_workload(struct server *s, char *const argv[], struct shim_err *err);

#endif
