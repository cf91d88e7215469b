/* test_worker.c: unit tests for the worker pool: jobs run off the loop, done() on it, the pool grows past a stuck job, idle threads expire on the monotonic clock. */
#include <check.h>
#include <ev.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "util.h"
#include "worker.h"

#define WAIT_MS 2000
#ifndef IDLE_EXIT_SECONDS
#error "build with worker.c and -DIDLE_EXIT_SECONDS=1 (tests/unit/CMakeLists.txt)"
#endif

struct job {
	struct work work;
	pthread_t run_thread, done_thread;
	int runs, dones;
	bool blocking;
};

static struct ev_loop *L;
static pthread_t loop_thread;
static int dones;

/* A blocking job waits here until the test releases it. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool released;
static int blocked_now;

/* The wall clock as this executable's own objects (worker.c among them) read it: the
 * real one plus wall_offset seconds. The link wraps clock_gettime (-Wl,--wrap), so only
 * calls compiled into the test are redirected; libc's and libev's are not. */
static time_t wall_offset;
int __real_clock_gettime(clockid_t id, struct timespec *ts);
int __wrap_clock_gettime(clockid_t id, struct timespec *ts);
int __wrap_clock_gettime(clockid_t id, struct timespec *ts)
{
	int rc = __real_clock_gettime(id, ts);
	if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
		ts->tv_sec += wall_offset;
	return rc;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void job_run(struct work *w)
{
	struct job *j = container_of(w, struct job, work);
	j->run_thread = pthread_self();
	__atomic_add_fetch(&j->runs, 1, __ATOMIC_RELEASE);
	if (!j->blocking)
		return;
	pthread_mutex_lock(&mu);
	blocked_now++;
	pthread_cond_broadcast(&cv);
	while (!released)
		pthread_cond_wait(&cv, &mu);
	blocked_now--;
	pthread_mutex_unlock(&mu);
}

static void job_done(struct work *w)
{
	struct job *j = container_of(w, struct job, work);
	j->done_thread = pthread_self();
	j->dones++;
	dones++;
}

static void job_init(struct job *j, bool blocking)
{
	memset(j, 0, sizeof(*j));
	j->work.run = job_run;
	j->work.done = job_done;
	j->blocking = blocking;
}

static void setup(void)
{
	L = ev_loop_new(EVFLAG_AUTO);
	ck_assert_ptr_nonnull(L);
	loop_thread = pthread_self();
	dones = 0;
	released = false;
	blocked_now = 0;
}

static void release_blocked(void)
{
	pthread_mutex_lock(&mu);
	released = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void teardown(void)
{
	release_blocked();
	worker_shutdown();
	ev_loop_destroy(L);
}

/* Run the loop until `dones` reaches n or the time is up. */
static void pump_until_dones(int n, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	while (dones < n && now_ms() < deadline) {
		ev_run(L, EVRUN_NOWAIT);
		poll(NULL, 0, 1);
	}
}

/* Wait (without running the loop) until n blocking jobs are stuck in run(). */
static void wait_blocked(int n)
{
	uint64_t deadline = now_ms() + WAIT_MS;
	pthread_mutex_lock(&mu);
	while (blocked_now < n && now_ms() < deadline) {
		pthread_mutex_unlock(&mu);
		poll(NULL, 0, 1);
		pthread_mutex_lock(&mu);
	}
	int got = blocked_now;
	pthread_mutex_unlock(&mu);
	ck_assert_int_eq(got, n);
}

START_TEST(test_many_jobs)
{
	enum { N = 300 };
	static struct job jobs[N];
	ck_assert_int_eq(worker_init(L, 1, 4), 0);
	for (int i = 0; i < N; i++) {
		job_init(&jobs[i], false);
		worker_submit(&jobs[i].work);
	}
	ck_assert_uint_eq(worker_pending(), N);
	/* done() runs only when the loop runs, never on a worker */
	poll(NULL, 0, 50);
	ck_assert_int_eq(dones, 0);
	ck_assert_uint_eq(worker_pending(), N);
	pump_until_dones(N, WAIT_MS);
	ck_assert_int_eq(dones, N);
	ck_assert_uint_eq(worker_pending(), 0);
	int bad = 0;
	for (int i = 0; i < N; i++) {
		/* plain checks in the loop: a passing ck_assert costs a message to the runner */
		if (jobs[i].runs != 1 || jobs[i].dones != 1 || !pthread_equal(jobs[i].done_thread, loop_thread) ||
		    pthread_equal(jobs[i].run_thread, loop_thread))
			bad++;
	}
	ck_assert_int_eq(bad, 0);
	unsigned t = worker_threads();
	ck_assert_uint_ge(t, 1);
	ck_assert_uint_le(t, 4);
}
END_TEST

/* The threads kept ready start once the loop has had nothing else to do, not in
 * worker_init (a daemon answers its first HELLO first). */
START_TEST(test_min_threads_started)
{
	ck_assert_int_eq(worker_init(L, 3, 8), 0);
	ck_assert_uint_eq(worker_threads(), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_uint_eq(worker_threads(), 3);
	ck_assert_uint_eq(worker_pending(), 0);
	/* and only once: they stay as many */
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_uint_eq(worker_threads(), 3);
}
END_TEST

/* A job submitted before the loop first runs does not wait for the threads kept
 * ready: it starts one itself, and the rest follow to make up min_threads. */
START_TEST(test_job_before_first_run)
{
	static struct job j;
	ck_assert_int_eq(worker_init(L, 2, 8), 0);
	job_init(&j, false);
	worker_submit(&j.work);
	ck_assert_uint_eq(worker_threads(), 1);
	pump_until_dones(1, WAIT_MS);
	ck_assert_int_eq(dones, 1);
	ck_assert_int_eq(j.runs, 1);
	/* the loop's next turn with nothing else to do starts the second */
	uint64_t deadline = now_ms() + WAIT_MS;
	while (worker_threads() < 2 && now_ms() < deadline)
		ev_run(L, EVRUN_NOWAIT);
	ck_assert_uint_eq(worker_threads(), 2);
}
END_TEST

START_TEST(test_blocked_job_then_quick_ones)
{
	/* the stuck job is running before the others come */
	static struct job block, quick[3];
	ck_assert_int_eq(worker_init(L, 1, 4), 0);
	job_init(&block, true);
	worker_submit(&block.work);
	wait_blocked(1);
	for (int i = 0; i < 3; i++) {
		job_init(&quick[i], false);
		worker_submit(&quick[i].work);
	}
	pump_until_dones(3, WAIT_MS);
	ck_assert_int_eq(dones, 3);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(quick[i].dones, 1);
	ck_assert_int_eq(block.dones, 0);
	ck_assert_uint_eq(worker_pending(), 1);
	ck_assert_uint_le(worker_threads(), 4);
	release_blocked();
	pump_until_dones(4, WAIT_MS);
	ck_assert_int_eq(block.dones, 1);
	ck_assert_uint_eq(worker_pending(), 0);
}
END_TEST

START_TEST(test_blocked_job_burst)
{
	/* the stuck job and the quick ones are submitted together while the only thread
	 * is idle: the pool must grow for the queued jobs, whichever one the first
	 * thread happens to take */
	static struct job block, quick[3];
	ck_assert_int_eq(worker_init(L, 1, 4), 0);
	ev_run(L, EVRUN_NOWAIT); /* the loop's first idle turn starts the thread kept ready */
	ck_assert_uint_eq(worker_threads(), 1);
	poll(NULL, 0, 50); /* let the thread reach its idle wait */
	job_init(&block, true);
	worker_submit(&block.work);
	for (int i = 0; i < 3; i++) {
		job_init(&quick[i], false);
		worker_submit(&quick[i].work);
	}
	pump_until_dones(3, WAIT_MS);
	ck_assert_msg(dones == 3, "only %d of 3 quick jobs done while one job is stuck (%u threads)", dones,
		      worker_threads());
	ck_assert_int_eq(block.dones, 0);
	ck_assert_uint_le(worker_threads(), 4);
	release_blocked();
	pump_until_dones(4, WAIT_MS);
	ck_assert_int_eq(block.dones, 1);
	ck_assert_uint_eq(worker_pending(), 0);
}
END_TEST

/* A job that works (CPU) rather than waits. */
static void busy_run(struct work *w)
{
	struct job *j = container_of(w, struct job, work);
	j->run_thread = pthread_self();
	j->runs++;
	volatile unsigned x = 0;
	for (unsigned i = 0; i < 20000; i++)
		x += i;
	(void)x;
}

START_TEST(test_burst_no_growth)
{
	/* a burst of quick jobs (a client's 256 reads opened at once) is done by the
	 * thread there is: the pool grows past blocked jobs, not past work */
	enum { N = 500 };
	static struct job jobs[N];
	ck_assert_int_eq(worker_init(L, 1, 8), 0);
	poll(NULL, 0, 20);
	for (int i = 0; i < N; i++) {
		job_init(&jobs[i], false);
		jobs[i].work.run = busy_run;
		worker_submit(&jobs[i].work);
	}
	pump_until_dones(N, WAIT_MS);
	ck_assert_int_eq(dones, N);
	/* a thread on probation leaves within a spell (30 ms) of the queue emptying */
	poll(NULL, 0, 100);
	ck_assert_uint_eq(worker_threads(), 1);
}
END_TEST

/* A job that says it is ending, then holds its thread until the test lets it go. */
static void ending_run(struct work *w)
{
	worker_job_ending();
	job_run(w);
}

START_TEST(test_job_ending_no_growth)
{
	/* a job submitted while the only thread's job is ending (its reply sent, the
	 * client's next call already in) waits for that thread: no thread is started
	 * for it, and it runs on the same thread once the first returns */
	static struct job first, next, later;
	ck_assert_int_eq(worker_init(L, 1, 8), 0);
	job_init(&first, true);
	first.work.run = ending_run;
	worker_submit(&first.work);
	wait_blocked(1);
	job_init(&next, false);
	worker_submit(&next.work);
	ck_assert_uint_eq(worker_threads(), 1);
	release_blocked();
	pump_until_dones(2, WAIT_MS);
	ck_assert_int_eq(dones, 2);
	ck_assert(pthread_equal(next.run_thread, first.run_thread));
	/* the thread is counted as ending no longer: a job that blocks without saying
	 * so still gets another thread for the one behind it */
	released = false;
	job_init(&first, true);
	worker_submit(&first.work);
	wait_blocked(1);
	job_init(&later, false);
	worker_submit(&later.work);
	ck_assert_uint_eq(worker_threads(), 2);
	pump_until_dones(3, WAIT_MS);
	ck_assert_int_eq(dones, 3);
	ck_assert(!pthread_equal(later.run_thread, first.run_thread));
}
END_TEST

/* A stream's jobs: each one's done() submits the next (a big write's or read's
 * pattern), on a loop that is busy, so done() runs the moment the job's thread has
 * signalled it, before that thread is back among the idle ones. */
#define CHAIN 3000
static struct job chain_job;
static int chain_left;

static void chain_done(struct work *w)
{
	job_done(w);
	if (--chain_left > 0) {
		chain_job.work.run = job_run;
		worker_submit(&chain_job.work);
	}
}

START_TEST(test_chain_no_growth)
{
	/* the thread that ran a job takes the next one its done() submits: no thread
	 * on probation is started for it (one was, now and then, clone3 and a 30 ms
	 * spell each time, some ten per GiB of upload) */
	static struct job first;
	ck_assert_int_eq(worker_init(L, 1, 8), 0);
	job_init(&first, false);
	worker_submit(&first.work); /* (the pool's first thread starts with it) */
	pump_until_dones(1, WAIT_MS);
	ck_assert_int_eq(dones, 1);
	job_init(&chain_job, false);
	chain_job.work.done = chain_done;
	chain_left = CHAIN;
	unsigned long started = worker_started();
	worker_submit(&chain_job.work);
	uint64_t deadline = now_ms() + 20 * WAIT_MS;
	while (dones < 1 + CHAIN && now_ms() < deadline)
		ev_run(L, EVRUN_NOWAIT); /* busy: done() at once */
	ck_assert_int_eq(dones, 1 + CHAIN);
	ck_assert_uint_eq(worker_started() - started, 0);
	ck_assert_uint_eq(worker_threads(), 1);
}
END_TEST

static void safety_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	*(bool *)w->data = true;
	ev_break(loop, EVBREAK_ONE);
}

START_TEST(test_ending_done_wakes_loop)
{
	/* A job whose reply went from its thread (worker_job_ending) does not wake the
	 * loop for its done() at once (the thread spins for the next call first), but
	 * the done() still comes to a loop that has nothing else to wake it: the loop
	 * blocks in ev_run until then, and a 2 s timer says it never did. Where the
	 * thread may not spin (one CPU, a quota), the loop is woken at once. */
	static struct job j[20];
	ck_assert_int_eq(worker_init(L, 1, 1), 0);
	bool fired = false;
	ev_timer safety;
	ev_timer_init(&safety, safety_cb, 2.0, 0);
	safety.data = &fired;
	for (int i = 0; i < 20; i++) {
		job_init(&j[i], false);
		j[i].work.run = ending_run;
		int before = dones;
		worker_submit(&j[i].work);
		ev_timer_start(L, &safety);
		while (dones == before && !fired)
			ev_run(L, EVRUN_ONCE);
		ev_timer_stop(L, &safety);
		ck_assert_msg(!fired, "job %d: its done() never came to the sleeping loop", i);
		ck_assert_int_eq(j[i].dones, 1);
		ck_assert(pthread_equal(j[i].done_thread, loop_thread));
	}
	ck_assert_uint_eq(worker_pending(), 0);

	/* the loop's next turn comes while the thread still spins (the done() runs in
	 * its prepare watcher): the loop must not then sleep as if nothing had happened
	 * (ev_run returns: one more turn without blocking) */
	for (int i = 0; i < 20; i++) {
		job_init(&j[i], false);
		j[i].work.run = ending_run;
		int before = dones;
		worker_submit(&j[i].work);
		while (__atomic_load_n(&j[i].runs, __ATOMIC_ACQUIRE) == 0)
			;
		/* into the thread's 40 us spin, past its done() being queued (a test that
		 * lands elsewhere only tests less) */
		uint64_t t = mono_ns() + 10000;
		while (mono_ns() < t)
			;
		ev_timer_start(L, &safety);
		while (dones == before && !fired)
			ev_run(L, EVRUN_ONCE);
		ev_timer_stop(L, &safety);
		ck_assert_msg(!fired, "job %d: the loop slept after running its done()", i);
	}

	/* such a job with the next one queued before its done() was: the loop is woken
	 * for the done() all the same, not left to wait for the next job's end */
	static struct job quick, slow;
	job_init(&quick, false);
	quick.work.run = ending_run;
	job_init(&slow, true);
	int before = dones;
	worker_submit(&quick.work);
	worker_submit(&slow.work); /* (one thread: it waits behind quick) */
	ev_timer_start(L, &safety);
	while (dones == before && !fired)
		ev_run(L, EVRUN_ONCE);
	ev_timer_stop(L, &safety);
	ck_assert_msg(!fired, "the done() waited for the job behind it");
	ck_assert_int_eq(quick.dones, 1);
	ck_assert_int_eq(slow.dones, 0);
	release_blocked();
	pump_until_dones(before + 2, WAIT_MS);
	ck_assert_int_eq(slow.dones, 1);
}
END_TEST

START_TEST(test_max_threads_bound)
{
	/* at max_threads, with every thread stuck, a new job waits (no unbounded growth) */
	static struct job block[2], quick;
	ck_assert_int_eq(worker_init(L, 1, 2), 0);
	job_init(&block[0], true);
	worker_submit(&block[0].work);
	wait_blocked(1);
	job_init(&block[1], true);
	worker_submit(&block[1].work);
	wait_blocked(2);
	ck_assert_uint_eq(worker_threads(), 2);
	job_init(&quick, false);
	worker_submit(&quick.work);
	pump_until_dones(1, 100);
	ck_assert_int_eq(dones, 0);
	ck_assert_uint_eq(worker_threads(), 2);
	ck_assert_uint_eq(worker_pending(), 3);
	release_blocked();
	pump_until_dones(3, WAIT_MS);
	ck_assert_int_eq(dones, 3);
	ck_assert_int_eq(quick.dones, 1);
	ck_assert_uint_eq(worker_pending(), 0);
}
END_TEST

START_TEST(test_idle_expiry)
{
	/* Threads added under load leave after IDLE_EXIT_SECONDS (1 s in this build) of
	 * quiet, on the monotonic clock: not earlier, not later, wherever the wall clock
	 * is. A wall clock an hour ahead of the kernel's, as read when the deadline is
	 * taken, is what a clock set back by an hour right then looks like to a timed wait
	 * on CLOCK_REALTIME: it would keep the threads for an hour; an hour behind, a clock
	 * set forward: it would end them at once. */
	static const time_t offsets[] = {0, 3600, -3600};
	wall_offset = offsets[_i];
	static struct job block[3], quick;
	ck_assert_int_eq(worker_init(L, 1, 4), 0);
	for (int i = 0; i < 3; i++) {
		job_init(&block[i], true);
		worker_submit(&block[i].work);
	}
	wait_blocked(3);
	/* The three threads running the jobs are the ones timed here: their idle waits
	 * start after t0. (The pool may hold one more, idle since before t0, or on
	 * probation and about to leave: it may go at any time.) */
	ck_assert_uint_ge(worker_threads(), 3);
	uint64_t t0 = now_ms();
	release_blocked();
	pump_until_dones(3, WAIT_MS);
	ck_assert_int_eq(dones, 3);
	uint64_t first_gone = 0, all_gone = 0, deadline = t0 + IDLE_EXIT_SECONDS * 1000u + 3000u;
	while (now_ms() < deadline) {
		unsigned n = worker_threads();
		uint64_t t = now_ms();
		if (n < 3 && first_gone == 0)
			first_gone = t;
		if (n == 1) {
			all_gone = t;
			break;
		}
		poll(NULL, 0, 2);
	}
	ck_assert_msg(first_gone != 0 && all_gone != 0,
		      "wall clock %+lds: %u threads, not 1, %u ms after the jobs ended (idle timeout %u s)",
		      (long)wall_offset, worker_threads(), (unsigned)(now_ms() - t0), IDLE_EXIT_SECONDS);
	/* ms truncation on both readings: a few ms of slack */
	ck_assert_msg(first_gone - t0 + 5 >= IDLE_EXIT_SECONDS * 1000u,
		      "wall clock %+lds: an idle thread left %u ms after the jobs ended, before the %u s timeout",
		      (long)wall_offset, (unsigned)(first_gone - t0), IDLE_EXIT_SECONDS);
	/* min_threads stay, and the pool still works */
	poll(NULL, 0, 50);
	ck_assert_uint_eq(worker_threads(), 1);
	job_init(&quick, false);
	worker_submit(&quick.work);
	pump_until_dones(4, WAIT_MS);
	ck_assert_int_eq(quick.dones, 1);
}
END_TEST

START_TEST(test_spinners_bounded)
{
	/* at most one spinner fewer than the CPUs this thread may use (none under a
	 * quota below 2), and a place given back is there again */
	static struct job j;
	ck_assert_int_eq(worker_init(L, 1, 2), 0);
	job_init(&j, false);
	worker_submit(&j.work); /* (a pool thread reads the quota first) */
	pump_until_dones(1, WAIT_MS);
	ck_assert_int_eq(dones, 1);
	cpu_set_t cpus;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
	double q = worker_cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
	int max = (q == 0 || q >= 2) ? CPU_COUNT(&cpus) - 1 : 0;
	/* (its job did not say it was ending: that thread does not spin) */
	int got = 0;
	while (got < 64 && worker_spin_begin())
		got++;
	ck_assert_int_eq(got, max);
	if (max > 0) {
		worker_spin_end();
		ck_assert(worker_spin_begin());
		ck_assert(!worker_spin_begin());
	}
	for (int i = 0; i < got; i++)
		worker_spin_end();
	/* one CPU: never */
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(one), &one), 0);
	ck_assert(!worker_spin_begin());
	ck_assert_int_eq(sched_setaffinity(0, sizeof(cpus), &cpus), 0);
}
END_TEST

/* ---- the cgroup CPU quota (whether the pool may spin) ---- */

static char cg_dir[256];

static void put(const char *rel, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", cg_dir, rel);
	/* the directories on the way */
	for (char *p = path + strlen(cg_dir) + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	FILE *f = fopen(path, "we");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static double cpus_for(const char *proc_cgroup)
{
	put("self-cgroup", proc_cgroup);
	char file[512], root[512];
	snprintf(file, sizeof(file), "%s/self-cgroup", cg_dir);
	snprintf(root, sizeof(root), "%s/fs", cg_dir);
	return worker_cgroup_cpus(file, root);
}

START_TEST(test_cgroup_cpus)
{
	snprintf(cg_dir, sizeof(cg_dir), "%s/test_worker.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(cg_dir));
	/* v2: cpu.max of the cgroup named */
	put("fs/a/b/cpu.max", "50000 100000\n");
	ck_assert(cpus_for("0::/a/b\n") == 0.5);
	put("fs/a/b/cpu.max", "250000 100000\n");
	ck_assert(cpus_for("0::/a/b\n") == 2.5);
	put("fs/a/b/cpu.max", "max 100000\n");
	ck_assert(cpus_for("0::/a/b\n") == 0);
	/* v2 at the root (a container's own namespace: "0::/") */
	put("fs/cpu.max", "100000 100000\n");
	ck_assert(cpus_for("0::/\n") == 1);
	/* a path that is not there (no cgroup namespace): the root's */
	ck_assert(cpus_for("0::/docker/0123abcd\n") == 1);
	/* v1: the hierarchy with the cpu controller, whatever else is listed */
	put("fs/cpu,cpuacct/x/cpu.cfs_quota_us", "200000\n");
	put("fs/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
	ck_assert(cpus_for("4:memory:/m\n3:cpu,cpuacct:/x\n") == 2);
	put("fs/cpu,cpuacct/x/cpu.cfs_quota_us", "-1\n");
	ck_assert(cpus_for("3:cpu,cpuacct:/x\n") == 0);
	/* "cpuset" is not "cpu" */
	ck_assert(cpus_for("2:cpuset:/x\n") == 0);
	/* bad input: no quota said, never a failure */
	put("fs/a/b/cpu.max", "garbage\n");
	ck_assert(cpus_for("0::/a/b\n") == 0);
	put("fs/a/b/cpu.max", "");
	ck_assert(cpus_for("0::/a/b\n") == 0);
	ck_assert(cpus_for("no colons here\n") == 0);
	ck_assert(cpus_for("") == 0);
	ck_assert(worker_cgroup_cpus("/nonexistent/cgroup", "/nonexistent") == 0);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cg_dir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *worker_suite(void)
{
	Suite *s = suite_create("worker");
	TCase *tc = tcase_create("pool");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_many_jobs);
	tcase_add_test(tc, test_min_threads_started);
	tcase_add_test(tc, test_job_before_first_run);
	tcase_add_test(tc, test_blocked_job_then_quick_ones);
	tcase_add_test(tc, test_blocked_job_burst);
	tcase_add_test(tc, test_max_threads_bound);
	tcase_add_test(tc, test_burst_no_growth);
	tcase_add_test(tc, test_job_ending_no_growth);
	tcase_add_test(tc, test_chain_no_growth);
	tcase_add_test(tc, test_ending_done_wakes_loop);
	tcase_add_test(tc, test_spinners_bounded);
	suite_add_tcase(s, tc);
	TCase *cg = tcase_create("cgroup");
	tcase_add_test(cg, test_cgroup_cpus);
	suite_add_tcase(s, cg);
	TCase *idle = tcase_create("idle");
	tcase_add_checked_fixture(idle, setup, teardown);
	tcase_set_timeout(idle, 30);
	tcase_add_loop_test(idle, test_idle_expiry, 0, 3);
	suite_add_tcase(s, idle);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(worker_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
