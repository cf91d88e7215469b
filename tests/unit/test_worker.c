/* test_worker.c: unit tests for the worker pool: jobs run off the loop, done() on it, and the pool grows past a stuck job. */
#include <check.h>
#include <ev.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"
#include "worker.h"

#define WAIT_MS 2000

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
	j->runs++;
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

START_TEST(test_min_threads_started)
{
	ck_assert_int_eq(worker_init(L, 3, 8), 0);
	ck_assert_uint_eq(worker_threads(), 3);
	ck_assert_uint_eq(worker_pending(), 0);
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

static Suite *worker_suite(void)
{
	Suite *s = suite_create("worker");
	TCase *tc = tcase_create("pool");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_many_jobs);
	tcase_add_test(tc, test_min_threads_started);
	tcase_add_test(tc, test_blocked_job_then_quick_ones);
	tcase_add_test(tc, test_blocked_job_burst);
	tcase_add_test(tc, test_max_threads_bound);
	suite_add_tcase(s, tc);
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
