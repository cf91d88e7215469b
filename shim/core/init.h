/* init.h: PID-1 duties: reaping orphans, supervising a workload, forwarding signals, ending children at shutdown. */
#ifndef SHIM_INIT_H
#define SHIM_INIT_H

#include <stdbool.h>

#include "err.h"

struct server;

/* At start-up: as PID 1 take the init role; otherwise become a child subreaper so
 * that what commands leave behind is still reaped here (by the reaper). */
int init_setup(struct server *s, struct shim_err *err);

/* With a workload to start: call first thing, before the loop and its threads exist.
 * Blocks every signal the workload will be given (init.c says which), so that one
 * arriving during start-up neither acts by default nor is lost: it waits for the
 * workload. */
void init_hold_signals(void);

/* Start the workload given after "--" (start-up only: call it after the transports
 * are set up, so that with --stdio the workload finds /dev/null on fds 0 and 1, not
 * the protocol channel). It runs in its own process group with the shim's stdio,
 * environment and cwd, in the terminal's foreground when the shim had it there. From
 * here on the shim passes every signal it receives on to it (init.c says which and
 * where to; SIGTERM starts the shutdown, SIGINT does not); the daemon shuts down
 * when it exits and exits with its status (128+signal when signalled). Returns 0; -1
 * with err when it could not be started; or 127 (not found) / 126 (not executable,
 * or another exec error) with err when its execve failed: the daemon's exit status
 * then. */
int init_start_workload(struct server *s, char *const argv[], struct shim_err *err);

/* Shutdown, step 1, from server_shutdown(): with a workload running, SIGTERM to its
 * process group (SIGCONT too when it is stopped) and to the shim's own commands
 * (SIGKILL to those after cfg.kill_grace); then(s) runs once the workload has exited,
 * however long that takes. Without a running workload then(s) runs at once. */
void init_shutdown_workload(struct server *s, void (*then)(struct server *s));
/* Shutdown, step 2: SIGTERM to every process the shim started that has not had one
 * from step 1 (as PID 1: every process in its PID namespace; otherwise the process
 * groups of its children: commands, adopted orphans, what the workload left), then
 * SIGKILL when cfg.kill_grace passes, then one more second before giving up on
 * processes that do not die (stuck in the kernel). */
void init_shutdown_begin(struct server *s);
/* True once the workload and every child are gone (or the wait was given up): the
 * loop may end. */
bool init_shutdown_done(struct server *s);

/* Shutdown hooks run after the loop has ended and every child is gone, in reverse
 * order of registration: the place for unmounting what the shim mounted (FUSE
 * mounts: the mounts code registers its unmount-all here). At most 16. */
int init_at_shutdown(void (*fn)(void *ud), void *ud);
void init_shutdown_hooks(void);

#endif
