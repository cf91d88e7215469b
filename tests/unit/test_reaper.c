/* test_reaper.c: unit tests for the reaper's kept statuses: a child reaped before anyone
 * watched it (exec forks on a worker, the loop learns the pid later) still has its exact
 * status delivered, from the loop and never from inside reaper_watch_since(); a status
 * collected before the watcher's fork time is not (an earlier process of that pid number);
 * the table of unwatched statuses holds REAPER_KEEP at most, the oldest going first. */
#include <check.h>
#include <errno.h>
#include <ev.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reaper.h"
#include "util.h"

#ifndef REAPER_KEEP
#error "build with reaper.c and -DREAPER_KEEP=4 (tests/unit/CMakeLists.txt)"
#endif

#define MAX_GOT 16

static struct ev_loop *L;
static struct {
	pid_t pid;
	int status;
} got[MAX_GOT];
static int n_got;

static void on_exit_cb(void *ud, pid_t pid, int status)
{
	(void)ud;
	ck_assert_int_lt(n_got, MAX_GOT);
	got[n_got].pid = pid;
	got[n_got].status = status;
	n_got++;
}

static void setup(void)
{
	L = ev_default_loop(0);
	n_got = 0;
	ck_assert_int_eq(reaper_init(L), 0);
	/* reaper_init sends itself a first wake-up (children from before it): let it pass */
	ev_run(L, EVRUN_NOWAIT);
}

/* A child that exits with code, left a zombie (waitid WNOWAIT: exited, not reaped), then
 * collected by the reaper with nobody watching it. */
static pid_t exited_unwatched(int code)
{
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(code);
	siginfo_t si;
	int rc;
	do
		rc = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT);
	while (rc < 0 && errno == EINTR);
	ck_assert_int_eq(rc, 0);
	reaper_poll();
	/* reaped: no zombie of it is left */
	ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), -1);
	ck_assert_int_eq(errno, ECHILD);
	return pid;
}

/* Run the loop until n statuses came or a 10 s deadline passed (a wait, not a pace). */
static void pump_until(int n)
{
	uint64_t end = mono_ns() + 10ull * 1000000000ull;
	while (n_got < n && mono_ns() < end)
		ev_run(L, EVRUN_ONCE | EVRUN_NOWAIT);
}

START_TEST(test_reaped_before_watch)
{
	uint64_t since = mono_ns();
	pid_t pid = exited_unwatched(7);
	ck_assert_int_eq(reaper_watch_since(pid, on_exit_cb, NULL, since), 0);
	ck_assert_int_eq(n_got, 0); /* not from inside the call */
	pump_until(1);
	ck_assert_int_eq(n_got, 1);
	ck_assert_int_eq(got[0].pid, pid);
	ck_assert(WIFEXITED(got[0].status));
	ck_assert_int_eq(WEXITSTATUS(got[0].status), 7);
	/* taken: a second watch of that pid gets nothing */
	ck_assert_int_eq(reaper_watch_since(pid, on_exit_cb, NULL, since), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(n_got, 1);
	reaper_unwatch(pid);
}
END_TEST

START_TEST(test_killed_status_exact)
{
	uint64_t since = mono_ns();
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		pause();
		_exit(0);
	}
	/* SIGKILL: a handler inherited from Check cannot catch it */
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	siginfo_t si;
	while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
		;
	reaper_poll();
	ck_assert_int_eq(reaper_watch_since(pid, on_exit_cb, NULL, since), 0);
	pump_until(1);
	ck_assert_int_eq(n_got, 1);
	ck_assert(WIFSIGNALED(got[0].status));
	ck_assert_int_eq(WTERMSIG(got[0].status), SIGKILL);
}
END_TEST

START_TEST(test_status_older_than_fork_not_delivered)
{
	pid_t pid = exited_unwatched(3);
	/* a watcher whose child was forked after that reap: the kept status is another
	 * process's, and goes */
	ck_assert_int_eq(reaper_watch_since(pid, on_exit_cb, NULL, mono_ns()), 0);
	ev_run(L, EVRUN_NOWAIT);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(n_got, 0);
	reaper_unwatch(pid);
	/* and it was dropped, not kept for a later watch */
	ck_assert_int_eq(reaper_watch_since(pid, on_exit_cb, NULL, 0), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(n_got, 0);
	reaper_unwatch(pid);
}
END_TEST

START_TEST(test_plain_watch_drops_kept)
{
	/* reaper_watch() is for a child forked just now on the loop: anything kept of its
	 * pid number is from before */
	pid_t pid = exited_unwatched(5);
	ck_assert_int_eq(reaper_watch(pid, on_exit_cb, NULL), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(n_got, 0);
	reaper_unwatch(pid);
}
END_TEST

START_TEST(test_keep_bound)
{
	uint64_t since = mono_ns();
	pid_t pids[REAPER_KEEP + 2];
	for (int i = 0; i < REAPER_KEEP + 2; i++)
		pids[i] = exited_unwatched(10 + i);
	/* the two oldest went to make room */
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(reaper_watch_since(pids[i], on_exit_cb, NULL, since), 0);
	ev_run(L, EVRUN_NOWAIT);
	ck_assert_int_eq(n_got, 0);
	for (int i = 0; i < 2; i++)
		reaper_unwatch(pids[i]);
	for (int i = 2; i < REAPER_KEEP + 2; i++)
		ck_assert_int_eq(reaper_watch_since(pids[i], on_exit_cb, NULL, since), 0);
	pump_until(REAPER_KEEP);
	ck_assert_int_eq(n_got, REAPER_KEEP);
	for (int i = 2; i < REAPER_KEEP + 2; i++) {
		bool found = false;
		for (int j = 0; j < n_got; j++)
			if (got[j].pid == pids[i]) {
				ck_assert_int_eq(WEXITSTATUS(got[j].status), 10 + i);
				found = true;
			}
		ck_assert_msg(found, "pid %d (the %d-th reaped) not delivered", (int)pids[i], i);
	}
}
END_TEST

START_TEST(test_watched_child_delivered)
{
	/* the ordinary path still works: watched first, then reaped */
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(42);
	ck_assert_int_eq(reaper_watch(pid, on_exit_cb, NULL), 0);
	siginfo_t si;
	while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
		;
	reaper_poll();
	ck_assert_int_eq(n_got, 1);
	ck_assert_int_eq(got[0].pid, pid);
	ck_assert_int_eq(WEXITSTATUS(got[0].status), 42);
}
END_TEST

static Suite *reaper_suite(void)
{
	Suite *s = suite_create("reaper");
	TCase *tc = tcase_create("kept");
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test_reaped_before_watch);
	tcase_add_test(tc, test_killed_status_exact);
	tcase_add_test(tc, test_status_older_than_fork_not_delivered);
	tcase_add_test(tc, test_plain_watch_drops_kept);
	tcase_add_test(tc, test_keep_bound);
	tcase_add_test(tc, test_watched_child_delivered);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(reaper_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
