/* reaper.h: the one place that reaps children and routes their exit statuses. */
#ifndef SHIM_REAPER_H
#define SHIM_REAPER_H

#include <stdint.h>
#include <sys/types.h>

struct ev_loop;

/* Called on the loop thread with the raw wait status. */
typedef void (*reaper_fn)(void *ud, pid_t pid, int status);

/* Install the SIGCHLD handling. Every child (and, as PID 1 or subreaper, every
 * orphan) is reaped here; statuses of pids nobody watches are kept a while (bounded)
 * for reaper_watch_since(), then dropped. */
int reaper_init(struct ev_loop *loop);
/* Route pid's exit status to fn. For a child forked on the loop thread, registered
 * right after fork, before returning to the loop (the status cannot be lost: it is only
 * collected from the loop). -1 (ENOMEM). */
int reaper_watch(pid_t pid, reaper_fn fn, void *ud);
/* The same for a child forked on another thread at mono_ns() time since or later: if it
 * was reaped already, fn gets its status from the loop soon after (never from inside
 * this call). */
int reaper_watch_since(pid_t pid, reaper_fn fn, void *ud, uint64_t since);
void reaper_unwatch(pid_t pid);
/* Reap now what has exited (normally done on SIGCHLD). */
void reaper_poll(void);

#endif
