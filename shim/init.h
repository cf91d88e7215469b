/* init.h: PID-1 duties: reaping orphans, supervising a workload, forwarding signals, ending children at shutdown. */
#ifndef SHIM_INIT_H
#define SHIM_INIT_H

#include <stdbool.h>

#include "err.h"

struct server;

/* At start-up: as PID 1 take the init role; otherwise become a child subreaper so
 * that what commands leave behind is still reaped here (by the reaper). */
int init_setup(struct server *s, struct shim_err *err);

/* Start the workload given after "--" (start-up only: call it after the transports
 * are set up, so that with --stdio the workload finds /dev/null on fds 0 and 1, not
 * the protocol channel). It runs in its own process group with the shim's stdio,
 * environment and cwd; the daemon shuts down when it exits and exits with its
 * status (128+signal when signalled). Returns 0; -1 with err when it could not be
 * started; or 127 (not found) / 126 (not executable, or another exec error) with
 * err when its execve failed: the daemon's exit status then. */
int init_start_workload(struct server *s, char *const argv[], struct shim_err *err);

/* A SIGINT arrived: with a workload it is forwarded to the workload's process group
 * (true); without one it means shutdown (false). */
bool init_forward_sigint(struct server *s);

/* Graceful shutdown, from server_shutdown(): SIGTERM to every process the shim
 * started (as PID 1: every process in its PID namespace; otherwise the process
 * groups of its children: commands, the workload, adopted orphans), then SIGKILL
 * when cfg.kill_grace passes, then one more second before giving up on processes
 * that do not die (stuck in the kernel). */
void init_shutdown_begin(struct server *s);
/* True once no child is left (or the wait was given up): the loop may end. */
bool init_shutdown_done(struct server *s);

/* Shutdown hooks run after the loop has ended and every child is gone, in reverse
 * order of registration: the place for unmounting what the shim mounted (FUSE
 * mounts: the mounts code registers its unmount-all here). At most 16. */
int init_at_shutdown(void (*fn)(void *ud), void *ud);
void init_shutdown_hooks(void);

#endif
