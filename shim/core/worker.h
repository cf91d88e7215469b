/* worker.h: the thread pool that runs every blocking call off the event loop. */
#ifndef SHIM_WORKER_H
#define SHIM_WORKER_H

#include <stdbool.h>

struct ev_loop;
struct work;

typedef void (*work_fn)(struct work *w);

/* Embed in the job's owner and recover it with container_of. run() executes on a
 * pool thread; done() then runs on the loop thread. The owner must stay alive until
 * done() has run (a request's jobs are struct op_job, op.h: the op is kept until then). */
struct work {
	work_fn run;
	work_fn done;
	struct work *next;
	/* owned by the pool */
	int state; /* WORK_QUEUED, WORK_RUNNING, WORK_FINISHED */
	bool cancelled;
	unsigned long thread;
};

enum { WORK_QUEUED = 0, WORK_RUNNING = 1, WORK_FINISHED = 2 };

/* Start the pool: min_threads once the loop is first idle (or one at once for a job
 * submitted before then), growing to max_threads while every thread is busy (so a few
 * calls stuck on a hung mount cannot starve the rest). */
int worker_init(struct ev_loop *loop, unsigned min_threads, unsigned max_threads);
void worker_submit(struct work *w);
/* Run the job on a thread of its own, outside the pool: for a job that lives as long
 * as its stream and waits for the client meanwhile (a backup, a restore), which must
 * not hold one of the threads the pool keeps for blocking calls. Otherwise as
 * worker_submit (done() on the loop, worker_interrupt, worker_cancelled). -1 with
 * errno when no thread can be made (done() is then never called). Loop thread only. */
int worker_run_own(struct work *w);
/* Threads of worker_run_own() running now. */
unsigned worker_own_threads(void);
/* The job's result is no longer wanted: if it has not started, run() is skipped
 * (done() still runs); if it is running, its thread gets a signal so that a
 * blocking syscall returns EINTR (a FIFO open, a read on a pipe; not every wait in
 * the kernel can be interrupted). Loop thread only. */
void worker_interrupt(struct work *w);
/* From a pool job's run(): it has nothing left but to return (its reply is on its way
 * from this thread). A job submitted from now on is left for this thread, which takes
 * it in a moment, rather than starting another one: the client's next call, sent as
 * soon as that reply is in, would otherwise find the only thread still busy and start
 * one (on probation, gone again 30 ms later) nearly every time. */
void worker_job_ending(void);
/* The CPUs a cgroup quota gives this process (cgroup v2 cpu.max, or v1
 * cpu.cfs_quota_us / cpu.cfs_period_us, of the cgroup named in cgroup_file, a
 * /proc/self/cgroup, under cg_root, /sys/fs/cgroup): 0 without a quota or when it
 * cannot be read. The pool spins for the next job only with 2 or more. For tests. */
double worker_cgroup_cpus(const char *cgroup_file, const char *cg_root);
/* May the calling thread spin a moment for the next piece of work? Only where it may
 * run on two CPUs or more, no cgroup quota holds the process under two (false until a
 * pool thread has looked), and fewer threads spin than there are CPUs less one. True:
 * it is counted until worker_spin_end(). Any thread; no file is read. */
bool worker_spin_begin(void);
void worker_spin_end(void);
/* True once worker_interrupt() was called: run() may poll it between steps. */
bool worker_cancelled(const struct work *w);

/* A SIGURG (the pool's interrupt signal) that the shim did not send itself arrives:
 * fn(SIGURG) is called, possibly in a signal handler on any thread, so it must be
 * async-signal-safe. For the supervised workload's signal forwarding (init.c); NULL
 * (the default) drops such signals. */
void worker_on_foreign_signal(void (*fn)(int sig));

/* Threads running now, threads started ever, and jobs not finished (queued or running). */
unsigned worker_threads(void);
unsigned long worker_started(void);
unsigned worker_pending(void);
/* Stop idle threads; threads stuck in a call are left to die with the process. */
void worker_shutdown(void);

#endif
