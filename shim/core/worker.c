/* worker.c: a growing thread pool; results are handed back to the libev loop through ev_async. */
#include "worker.h"
#include "fsctx.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <sched.h>
#include <ev.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef IDLE_EXIT_SECONDS /* the unit test builds the pool with a shorter one */
#define IDLE_EXIT_SECONDS 30
#endif
/* A thread is added when jobs wait and every thread is busy, but on probation: it joins
 * the pool only if jobs still wait PROBATION_MS later while a busy thread sleeps in the
 * kernel (a hung mount, a FIFO, a disk: its job used next to no CPU meanwhile) and none
 * finished, or a queue that has not emptied for a few spells still waits on such a
 * thread (I/O-bound calls), or after PROBATION_ROUNDS spells whatever the threads do
 * (slow calls). A burst of quick jobs (a client's 256 reads opened at once) is done by
 * the threads there are, also when they wait for a CPU on a loaded machine, and the
 * pool keeps its size: it grows past blocked calls, not past work. One thread is on
 * probation at a time. */
#define PROBATION_MS 30
#define PROBATION_IO_ROUNDS 2
#define PROBATION_ROUNDS 10
/* CPU time under which a job that ran through a whole spell was asleep, not at work: a
 * tenth of the spell. A thread that is runnable gets more even on a loaded machine (at
 * a load of 7 on 2 CPUs, a quarter of the spell); the spell is long enough for that. */
#define SLEEP_CPU_NS (PROBATION_MS * 100000L)
/* After a job whose reply went from its thread (worker_job_ending: a stat, a small
 * write), the thread looks for the next job this long before it sleeps: a client
 * calling in a row sends it about one round trip later, and a sleeping thread's
 * wake-up on another CPU is most of a small call's cost (a halted vCPU). Not after
 * other jobs: spinning beside a command being started takes a CPU from it. */
#define SPIN_NS 40000u

/* A pool thread (on its own stack), linked in pool.wthreads while it lives. */
struct wthread {
	struct wthread *next;
	pthread_t self;
	bool busy;            /* running a job */
	bool ending;          /* its job said it is about to return (worker_job_ending), or has
			       * returned, and it has not yet gone back for the next one */
	bool spin;            /* then: look for the next job for SPIN_NS before sleeping */
	bool lazy;            /* and the loop was not woken for its job's done() (worker_main) */
	unsigned long jobs;   /* jobs taken */
	unsigned long mark;   /* jobs when the spell began (ULONG_MAX: not busy then) */
	uint64_t mark_cpu_ns; /* its CPU time then */
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct work *queue, **queue_tail;
	struct work *done, **done_tail;
	unsigned threads, idle, min_threads, max_threads, pending;
	unsigned queued; /* jobs in the queue, not yet taken by a thread */
	unsigned ending; /* threads that will take a queued job in a moment (wthread.ending) */
	bool stopping;
	bool probing;           /* a thread on probation is waiting to see (probe_cv) */
	unsigned long finished; /* jobs run, ever: the sign of progress */
	unsigned long started;  /* threads started, ever */
	pthread_cond_t probe_cv;
	struct wthread *wthreads;
	struct ev_loop *loop;
	ev_async async;
	ev_prepare prep; /* runs the done() of jobs the loop was not woken for (lazy) */
	ev_idle again;   /* then one more turn of the loop before it sleeps (again_cb) */
	unsigned lazy;   /* such done()s waiting: written under mu, read by prep without it */
	ev_idle warm;    /* starts the min_threads (warm_cb) */
	unsigned own;    /* threads of worker_run_own() running now */
} pool = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.cv = PTHREAD_COND_INITIALIZER,
};

#define INTERRUPT_SIGNAL SIGURG
static sigset_t interrupt_set;
static void (*foreign_fn)(int sig);

/* Ours: worker_interrupt()'s (or a helper thread's) pthread_kill, a tgkill from this
 * process. Anything else is a SIGURG sent to the process (kill -URG), which lands in
 * whichever thread lets it in: not an interrupt, and not to be lost. */
static bool foreign(const siginfo_t *si)
{
	return !(si->si_code == SI_TKILL && si->si_pid == getpid()) && si->si_code != SI_KERNEL;
}

static void interrupt_handler(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	/* ours: nothing to do, being delivered without SA_RESTART is what makes the
	 * syscall return (a foreign one does that too: the jobs retry on EINTR unless
	 * they were cancelled) */
	int e = errno;
	void (*fn)(int) = __atomic_load_n(&foreign_fn, __ATOMIC_ACQUIRE);
	if (fn != NULL && foreign(si))
		fn(sig);
	errno = e;
}

void worker_on_foreign_signal(void (*fn)(int sig))
{
	__atomic_store_n(&foreign_fn, fn, __ATOMIC_RELEASE);
}

static int spawn_thread(bool probation);

/* A spinning thread's pause: less power, and the other hyperthread gets the core. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* The quota of the cgroup directory dir as CPUs (v2: cpu.max "QUOTA PERIOD"; v1:
 * cpu.cfs_quota_us and cpu.cfs_period_us; "max" or -1: none): 0 if none, -1 if the
 * directory has no such file. */
static double quota_in(const char *dir, bool v2)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -1;
	char q[32] = "";
	long period = 0;
	int n = v2 ? fscanf(f, "%31s %ld", q, &period) : fscanf(f, "%31s", q);
	fclose(f);
	if (n < 1 || strcmp(q, "max") == 0 || q[0] == '-')
		return 0;
	long quota = strtol(q, NULL, 10);
	if (!v2) {
		snprintf(path, sizeof(path), "%s/cpu.cfs_period_us", dir);
		f = fopen(path, "re");
		if (f == NULL)
			return 0;
		n = fscanf(f, "%ld", &period);
		fclose(f);
		if (n != 1)
			return 0;
	}
	return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

double worker_cgroup_cpus(const char *cgroup_file, const char *cg_root)
{
	FILE *f = fopen(cgroup_file, "re");
	if (f == NULL)
		return 0;
	char line[1024], dir[PATH_MAX], top[PATH_MAX];
	double cpus = 0;
	while (cpus <= 0 && fgets(line, sizeof(line), f) != NULL) {
		line[strcspn(line, "\n")] = '\0';
		/* "ID:CONTROLLERS:PATH"; v2's is "0::PATH" */
		char *c1 = strchr(line, ':');
		char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
		if (c2 == NULL)
			continue;
		*c2 = '\0';
		const char *ctl = c1 + 1, *cg = c2 + 1;
		if (strcmp(cg, "/") == 0)
			cg = "";
		bool v2 = ctl[0] == '\0';
		if (!v2) {
			/* v1: the hierarchy with the cpu controller ("cpu" or "cpu,cpuacct") */
			bool has_cpu = false;
			for (const char *t = ctl; *t != '\0';) {
				size_t k = strcspn(t, ",");
				has_cpu |= k == 3 && strncmp(t, "cpu", 3) == 0;
				t += k + (t[k] == ',');
			}
			if (!has_cpu)
				continue;
		}
		snprintf(top, sizeof(top), "%s%s%s", cg_root, v2 ? "" : "/", v2 ? "" : ctl);
		snprintf(dir, sizeof(dir), "%s%s", top, cg);
		cpus = quota_in(dir, v2);
		/* a container without its own cgroup namespace sees the host's path for a
		 * cgroup that is mounted as the root of its own tree: the root's, then */
		if (cpus < 0)
			cpus = quota_in(top, v2);
	}
	fclose(f);
	return cpus > 0 ? cpus : 0;
}

/* Whether spinning for the next job may pay: not under a CPU quota of less than two
 * CPUs (the spin would spend the quota the loop and the commands need). Read once, by
 * the first pool thread (files: never on the loop): 0 not known yet, 1 no, 2 yes. */
static int spin_quota;
static pthread_once_t spin_once = PTHREAD_ONCE_INIT;

static void spin_check(void)
{
	double q = worker_cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
	__atomic_store_n(&spin_quota, q == 0 || q >= 2 ? 2 : 1, __ATOMIC_RELEASE);
}

/* Threads spinning now (worker_spin_begin): at most one CPU fewer than there
 * are, so that the client's side and the rest of the shim always find one. */
static unsigned spinners;

bool worker_spin_begin(void)
{
	if (__atomic_load_n(&spin_quota, __ATOMIC_ACQUIRE) != 2)
		return false;
	cpu_set_t cpus;
	if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0)
		return false;
	unsigned max = (unsigned)CPU_COUNT(&cpus) - 1, n = __atomic_load_n(&spinners, __ATOMIC_RELAXED);
	do {
		if (n >= max)
			return false;
	} while (!__atomic_compare_exchange_n(&spinners, &n, n + 1, true, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
	return true;
}

void worker_spin_end(void)
{
	__atomic_sub_fetch(&spinners, 1, __ATOMIC_ACQ_REL);
}

/* The pool thread this is (NULL on any other thread). */
static __thread struct wthread *cur_thread;

/* A thread's CPU time: no fd needed (a /proc file would take one, maybe the last). */
static uint64_t cpu_ns(pthread_t t)
{
	clockid_t id;
	struct timespec ts;
	if (pthread_getcpuclockid(t, &id) != 0 || clock_gettime(id, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* With pool.mu held: the start of a spell of probation. */
static void mark_workers(void)
{
	for (struct wthread *t = pool.wthreads; t != NULL; t = t->next) {
		t->mark = t->busy ? t->jobs : ULONG_MAX;
		if (t->busy)
			t->mark_cpu_ns = cpu_ns(t->self);
	}
}

/* With pool.mu held, at the end of a spell: whether a thread has been in the same job
 * all along and asleep in the kernel (next to no CPU), rather than running or waiting
 * for a CPU: only then is another thread of use. */
static bool a_worker_sleeps(void)
{
	for (struct wthread *t = pool.wthreads; t != NULL; t = t->next)
		if (t->busy && t->mark == t->jobs && cpu_ns(t->self) - t->mark_cpu_ns < (uint64_t)SLEEP_CPU_NS)
			return true;
	return false;
}

/* With pool.mu held, on a thread started on probation: true to join the pool, false
 * to leave at once (the jobs were taken, or are being done). */
static bool probation(void)
{
	bool join = false;
	for (unsigned round = 0; !pool.stopping && !join; round++) {
		unsigned long seen = pool.finished;
		mark_workers();
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += PROBATION_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		while (!pool.stopping && pthread_cond_timedwait(&pool.probe_cv, &pool.mu, &ts) != ETIMEDOUT)
			;
		/* the idle threads take what is queued, or nothing is */
		if (pool.queued <= pool.idle)
			break;
		bool progress = pool.finished != seen;
		join = ((!progress || round + 1 >= PROBATION_IO_ROUNDS) && a_worker_sleeps()) ||
		       round + 1 >= PROBATION_ROUNDS;
	}
	pool.probing = false;
	/* more waiting than this thread is about to take: the next one on probation */
	if (join && !pool.stopping && pool.queued > pool.idle + 1 && pool.threads < pool.max_threads &&
	    spawn_thread(true) < 0)
		log_warn("worker: cannot start a thread: %s", strerror(errno));
	return join && !pool.stopping;
}

/* Run w with the interrupt signal let in only meanwhile: one that arrives late stays
 * pending and cannot hit the next job. A job that entered a file operation's
 * identity and did not leave it: the next one starts as the shim again. */
static void run_one(struct work *w)
{
	pthread_sigmask(SIG_UNBLOCK, &interrupt_set, NULL);
	w->run(w);
	fs_ctx_leave();
	pthread_sigmask(SIG_BLOCK, &interrupt_set, NULL);
}

static void *worker_main(void *arg)
{
	struct wthread self = {.self = pthread_self(), .mark = ULONG_MAX};
	cur_thread = &self;
	pthread_once(&spin_once, spin_check);
	pthread_mutex_lock(&pool.mu);
	if (arg != NULL && !probation()) {
		pool.threads--;
		pthread_mutex_unlock(&pool.mu);
		return NULL;
	}
	self.next = pool.wthreads;
	pool.wthreads = &self;
	for (;;) {
		bool expired = false, caught = false;
		if (self.spin && pool.queue == NULL && !pool.stopping) {
			/* counted as idle: a job submitted now is for it (worker_submit) */
			pool.idle++;
			pthread_mutex_unlock(&pool.mu);
			uint64_t end = mono_ns() + SPIN_NS;
			while (__atomic_load_n(&pool.queued, __ATOMIC_RELAXED) == 0 &&
			       !__atomic_load_n(&pool.stopping, __ATOMIC_RELAXED) && mono_ns() < end)
				cpu_relax();
			worker_spin_end();
			pthread_mutex_lock(&pool.mu);
			pool.idle--;
			caught = pool.queue != NULL; /* submitted after its done() was queued */
		} else if (self.spin) {
			worker_spin_end(); /* (a job was there already, or the pool stops) */
		}
		self.spin = false;
		if (self.lazy) {
			/* A job submitted during the spin came from a loop awake after the
			 * done() was queued, which runs it before it sleeps again (prep_cb);
			 * otherwise (no job, or one queued before that) the loop is woken for
			 * it now. */
			self.lazy = false;
			if (!caught && __atomic_load_n(&pool.lazy, __ATOMIC_RELAXED) > 0) {
				pthread_mutex_unlock(&pool.mu);
				ev_async_send(pool.loop, &pool.async);
				pthread_mutex_lock(&pool.mu);
			}
		}
		while (pool.queue == NULL && !pool.stopping && !expired) {
			pool.idle++;
			if (pool.threads > pool.min_threads) {
				/* a thread added under load goes away after a quiet spell */
				struct timespec ts;
				clock_gettime(CLOCK_MONOTONIC, &ts);
				ts.tv_sec += IDLE_EXIT_SECONDS;
				expired = pthread_cond_timedwait(&pool.cv, &pool.mu, &ts) == ETIMEDOUT &&
					  pool.queue == NULL && pool.threads > pool.min_threads;
			} else {
				pthread_cond_wait(&pool.cv, &pool.mu);
			}
			pool.idle--;
		}
		if (pool.queue == NULL)
			break;
		struct work *w = pool.queue;
		pool.queue = w->next;
		if (pool.queue == NULL)
			pool.queue_tail = &pool.queue;
		__atomic_sub_fetch(&pool.queued, 1, __ATOMIC_RELAXED); /* (a spinner reads it unlocked) */
		bool skip = __atomic_load_n(&w->cancelled, __ATOMIC_ACQUIRE);
		w->state = WORK_RUNNING;
		w->thread = (unsigned long)pthread_self();
		self.busy = true;
		self.jobs++;
		pthread_mutex_unlock(&pool.mu);

		if (!skip)
			run_one(w); /* a late interrupt is swallowed below */

		pthread_mutex_lock(&pool.mu);
		w->state = WORK_FINISHED;
		pool.finished++;
		self.busy = false;
		struct timespec zero = {0, 0};
		siginfo_t si;
		void (*fn)(int) = __atomic_load_n(&foreign_fn, __ATOMIC_ACQUIRE);
		while (sigtimedwait(&interrupt_set, &si, &zero) > 0)
			if (fn != NULL && foreign(&si))
				fn(si.si_signo);
		w->next = NULL;
		*pool.done_tail = w;
		pool.done_tail = &w->next;
		/* From here this thread takes the next job: one that done() submits (a
		 * stream's next step) must not start a thread on probation because this one
		 * is not back among the idle yet (it did, some ten times per GiB uploaded). */
		if (!self.ending) {
			self.ending = true;
			pool.ending++;
		}
		/* A job whose reply went from here, on a thread about to spin for the next
		 * call: the loop is not woken for its done() (on the client's CPU, at the
		 * moment the reply wakes the client, it ran first: some 12 us of the
		 * client's). The loop runs it before it next sleeps (prep_cb), after the next
		 * call it is woken for; or it is woken when the spin ends without one. */
		bool lazy = self.spin && !pool.stopping;
		if (lazy) {
			self.lazy = true;
			__atomic_add_fetch(&pool.lazy, 1, __ATOMIC_RELAXED);
		}
		/* after the unlock: the loop's done_cb takes the lock, and woken while we
		 * hold it, would only sleep again on it */
		pthread_mutex_unlock(&pool.mu);
		if (!lazy)
			ev_async_send(pool.loop, &pool.async);
		pthread_mutex_lock(&pool.mu);
		/* ending until now: from here it takes a job or is idle, under this lock */
		if (self.ending) {
			self.ending = false;
			pool.ending--;
		}
	}
	for (struct wthread **pp = &pool.wthreads; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == &self) {
			*pp = self.next;
			break;
		}
	}
	pool.threads--;
	pthread_mutex_unlock(&pool.mu);
	return NULL;
}

/* Called with pool.mu held. */
static int spawn_thread(bool probation)
{
	pthread_t t;
	pthread_attr_t attr;
	sigset_t all, old;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 << 10);
	/* Workers never take signals: the loop thread handles them all. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&t, &attr, worker_main, probation ? (void *)1 : NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	pool.threads++;
	pool.started++;
	if (probation)
		pool.probing = true;
	return 0;
}

static void done_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	pthread_mutex_lock(&pool.mu);
	struct work *list = pool.done;
	pool.done = NULL;
	pool.done_tail = &pool.done;
	__atomic_store_n(&pool.lazy, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&pool.mu);
	while (list != NULL) {
		struct work *next = list->next;
		pool.pending--;
		list->done(list);
		list = next;
	}
}

static void again_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	ev_idle_stop(loop, w);
}

/* The done()s run here come after the loop's other prepare watchers may have looked
 * (the server's, which ends the loop once the last connection is gone) and just
 * before it would block: an idle watcher makes that poll return at once, so the loop
 * turns once more, as it would have for the ev_async, only without the wake-up. */
static void prep_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)w;
	if (__atomic_load_n(&pool.lazy, __ATOMIC_RELAXED) == 0)
		return;
	done_cb(loop, &pool.async, revents);
	if (!ev_is_active(&pool.again))
		ev_idle_start(loop, &pool.again);
}

static void warm_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	ev_ref(loop);
	ev_idle_stop(loop, w);
	pthread_mutex_lock(&pool.mu);
	while (pool.threads < pool.min_threads && !pool.stopping) {
		if (spawn_thread(false) < 0) {
			log_warn("worker: cannot start a thread: %s", strerror(errno));
			break;
		}
	}
	pthread_mutex_unlock(&pool.mu);
}

int worker_init(struct ev_loop *loop, unsigned min_threads, unsigned max_threads)
{
	sigemptyset(&interrupt_set);
	sigaddset(&interrupt_set, INTERRUPT_SIGNAL);
	struct sigaction sa = {.sa_sigaction = interrupt_handler, .sa_flags = SA_SIGINFO};
	sigemptyset(&sa.sa_mask);
	sigaction(INTERRUPT_SIGNAL, &sa, NULL);
	/* The idle timeout counts on the monotonic clock: with the realtime one, setting
	 * the wall clock back (a guest resumed from a snapshot, NTP's first step) would keep
	 * idle threads for as long, and setting it forward would end them at once. */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pool.cv, &ca);
	pthread_cond_init(&pool.probe_cv, &ca);
	pthread_condattr_destroy(&ca);
	pool.loop = loop;
	pool.queue_tail = &pool.queue;
	pool.done_tail = &pool.done;
	pool.min_threads = min_threads;
	pool.max_threads = max_threads < min_threads ? min_threads : max_threads;
	ev_async_init(&pool.async, done_cb);
	ev_async_start(loop, &pool.async);
	ev_prepare_init(&pool.prep, prep_cb);
	ev_idle_init(&pool.again, again_cb);
	ev_prepare_start(loop, &pool.prep);
	/* the async and prepare watchers must not keep the loop alive on their own */
	ev_unref(loop);
	ev_unref(loop);
	/* The threads kept ready are started once the loop has nothing else to do: after
	 * the first client's HELLO has been answered, not before it (a thread's start is
	 * a tenth of a static daemon's way to HELLO_OK). A job submitted before then
	 * starts one itself. */
	ev_idle_init(&pool.warm, warm_cb);
	ev_idle_start(loop, &pool.warm);
	ev_unref(loop);
	return 0;
}

void worker_submit(struct work *w)
{
	w->next = NULL;
	w->state = WORK_QUEUED;
	w->cancelled = false;
	pool.pending++;
	pthread_mutex_lock(&pool.mu);
	*pool.queue_tail = w;
	pool.queue_tail = &w->next;
	__atomic_add_fetch(&pool.queued, 1, __ATOMIC_RELAXED); /* (a spinner reads it unlocked) */
	/* Grow (on probation) while there are more queued jobs than idle threads to take
	 * them. A thread that was signalled but has not woken up yet still counts as idle,
	 * so testing idle == 0 alone would queue a burst behind one thread (and behind a
	 * stuck job). Without any thread, one at once. */
	if (pool.queued > pool.idle + pool.ending && pool.threads < pool.max_threads &&
	    (pool.threads == 0 || !pool.probing) && spawn_thread(pool.threads > 0) < 0)
		log_warn("worker: cannot start a thread: %s", strerror(errno));
	pthread_mutex_unlock(&pool.mu);
	/* after the unlock: a thread woken while we hold the lock would only sleep again
	 * on it (a second wake-up per job) */
	pthread_cond_signal(&pool.cv);
}

void worker_job_ending(void)
{
	struct wthread *t = cur_thread;
	if (t == NULL || t->ending)
		return; /* (a job on a thread of its own, or said already) */
	/* only where another CPU runs the loop meanwhile: on one CPU the spin would
	 * hold off the very threads that bring the next job */
	bool spin = worker_spin_begin();
	pthread_mutex_lock(&pool.mu);
	t->ending = true;
	t->spin = spin;
	pool.ending++;
	pthread_mutex_unlock(&pool.mu);
}

/* A job on a thread of its own (worker_run_own): the pool's rules for signals and
 * for done(), without a pool thread. */
static void *own_main(void *arg)
{
	struct work *w = arg;
	pthread_setname_np(pthread_self(), "shim-job"); /* top -H; the tests count them */
	pthread_mutex_lock(&pool.mu);
	bool skip = __atomic_load_n(&w->cancelled, __ATOMIC_ACQUIRE);
	w->state = WORK_RUNNING;
	w->thread = (unsigned long)pthread_self();
	pthread_mutex_unlock(&pool.mu);
	if (!skip)
		run_one(w);
	pthread_mutex_lock(&pool.mu);
	w->state = WORK_FINISHED;
	pool.own--;
	/* (an interrupt that came late stays pending and dies with the thread) */
	w->next = NULL;
	*pool.done_tail = w;
	pool.done_tail = &w->next;
	ev_async_send(pool.loop, &pool.async);
	pthread_mutex_unlock(&pool.mu);
	return NULL;
}

int worker_run_own(struct work *w)
{
	w->next = NULL;
	w->state = WORK_QUEUED;
	w->cancelled = false;
	pthread_t t;
	pthread_attr_t attr;
	sigset_t all, old;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 << 10);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_mutex_lock(&pool.mu);
	int rc = pthread_create(&t, &attr, own_main, w);
	if (rc == 0) {
		pool.own++;
		pool.pending++;
	}
	pthread_mutex_unlock(&pool.mu);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	return 0;
}

unsigned worker_own_threads(void)
{
	pthread_mutex_lock(&pool.mu);
	unsigned n = pool.own;
	pthread_mutex_unlock(&pool.mu);
	return n;
}

void worker_interrupt(struct work *w)
{
	pthread_mutex_lock(&pool.mu);
	__atomic_store_n(&w->cancelled, true, __ATOMIC_RELEASE);
	if (w->state == WORK_RUNNING)
		pthread_kill((pthread_t)w->thread, INTERRUPT_SIGNAL);
	pthread_mutex_unlock(&pool.mu);
}

bool worker_cancelled(const struct work *w)
{
	return __atomic_load_n(&w->cancelled, __ATOMIC_ACQUIRE);
}

unsigned worker_threads(void)
{
	pthread_mutex_lock(&pool.mu);
	unsigned n = pool.threads;
	pthread_mutex_unlock(&pool.mu);
	return n;
}

unsigned long worker_started(void)
{
	pthread_mutex_lock(&pool.mu);
	unsigned long n = pool.started;
	pthread_mutex_unlock(&pool.mu);
	return n;
}

unsigned worker_pending(void)
{
	return pool.pending;
}

void worker_shutdown(void)
{
	pthread_mutex_lock(&pool.mu);
	__atomic_store_n(&pool.stopping, true, __ATOMIC_RELAXED); /* (a spinner reads it unlocked) */
	pthread_cond_broadcast(&pool.cv);
	pthread_cond_broadcast(&pool.probe_cv);
	pthread_mutex_unlock(&pool.mu);
	if (pool.loop != NULL) {
		ev_ref(pool.loop);
		ev_async_stop(pool.loop, &pool.async);
		ev_ref(pool.loop);
		ev_prepare_stop(pool.loop, &pool.prep);
		ev_idle_stop(pool.loop, &pool.again);
		if (ev_is_active(&pool.warm)) {
			ev_ref(pool.loop);
			ev_idle_stop(pool.loop, &pool.warm);
		}
	}
}
