/* it_init.c: PID-1 duties against the real daemon: a workload after "--" (exit codes, stdio,
 * forwarded signals), the daemon as PID 1 of a fresh PID namespace (orphans reaped, SIGTERM
 * forwarded, graceful shutdown with a kill grace), and the subreaper when not PID 1. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef IT_SYS_BIN
#error "IT_SYS_BIN must name the it_sys helper"
#endif

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

/* ---- helpers ---- */

/* argv for the daemon, optionally as PID 1 of a new PID namespace, with a workload
 * (NULL-terminated, may be NULL). Points into static storage. */
static const char *const *daemon_argv(bool pid1, const char *target, const char *grace, const char *const *workload)
{
	static const char *argv[64];
	int n = 0;
	if (pid1) {
		argv[n++] = "unshare";
		argv[n++] = "--pid";
		argv[n++] = "--fork";
		argv[n++] = "--mount-proc";
		argv[n++] = "--kill-child"; /* the daemon dies with unshare (the harness kills by PID) */
	}
	argv[n++] = SHIM_BIN;
	argv[n++] = "--state-dir";
	argv[n++] = it_path("state");
	if (target != NULL) {
		argv[n++] = "--listen";
		argv[n++] = target;
	}
	if (grace != NULL) {
		argv[n++] = "--kill-grace";
		argv[n++] = grace;
	}
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	if (workload != NULL) {
		argv[n++] = "--";
		for (int i = 0; workload[i] != NULL && n < 63; i++)
			argv[n++] = workload[i];
	}
	argv[n] = NULL;
	return argv;
}

/* PID namespaces need CAP_SYS_ADMIN: skip the case where there is none. */
static bool can_unshare(void)
{
	int rc = system("unshare --pid --fork --mount-proc true >/dev/null 2>&1");
	if (rc != 0)
		fprintf(stderr, "(unshare --pid is not permitted here: skipping)\n");
	return rc == 0;
}

/* The daemon's own pid: d->pid, or its first child when it runs under unshare. */
static pid_t daemon_pid(const struct it_daemon *d, bool pid1)
{
	if (!pid1)
		return d->pid;
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)d->pid, (int)d->pid);
	FILE *f = fopen(path, "r");
	CHECKF(f != NULL, "%s: %s", path, strerror(errno));
	int pid = 0;
	CHECKF(fscanf(f, "%d", &pid) == 1, "unshare (pid %d) has no child", (int)d->pid);
	fclose(f);
	return (pid_t)pid;
}

static int exit_code(const struct it_daemon *d)
{
	CHECKF(WIFEXITED(d->status), "%s: status 0x%x (want an exit)", d->name, d->status);
	return WEXITSTATUS(d->status);
}

/* Run a shell command, collected into out (NUL-terminated); its status. */
static int run_sh(struct sbx_client *c, const char *cmd, char *out, size_t size)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_output o;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	eo.shell = cmd;
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &o, &ex, &err), &err);
	if (out != NULL)
		snprintf(out, size, "%s", o.out);
	sbx_output_free(&o);
	return sbx_exit_status(&ex);
}

static char *read_all(const char *path)
{
	static char buf[4096];
	buf[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return buf;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

/* Wait until the file holds want exactly. */
static void wait_file(const char *path, const char *want, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	for (;;) {
		const char *got = read_all(path);
		if (strcmp(got, want) == 0)
			return;
		CHECKF(it_now_ms() < end, "%s holds '%s', want '%s'", path, got, want);
		it_sleep_ms(10);
	}
}

static bool pid_gone(pid_t pid, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	do {
		if (kill(pid, 0) < 0 && errno == ESRCH)
			return true;
		it_sleep_ms(10);
	} while (it_now_ms() < end);
	return false;
}

/* A detached process that notes every SIGTERM in file and keeps running. */
static void spawn_stubborn(struct sbx_client *c, const char *name, const char *file)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "trap 'echo term >> %s' TERM; echo ready >> %s; while :; do sleep 0.05; done", file,
		 file);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	eo.name = name;
	struct sbx_process_info info = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, &no_timeout, &eo, &info, &err), &err);
	wait_file(file, "ready\n", 5000);
}

/* An orphan that left every group of ours (setsid) and notes SIGTERM in file. */
static void spawn_orphan(struct sbx_client *c, const char *file)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd),
		 "setsid sh -c \"trap 'echo orphan-term >> %s' TERM; echo ready >> %s; "
		 "while :; do sleep 0.05; done\" </dev/null >/dev/null 2>&1 &",
		 file, file);
	CHECK_EQ(run_sh(c, cmd, NULL, 0), 0);
	wait_file(file, "ready\n", 5000);
}

/* ---- a workload, not PID 1 ---- */

static int case_workload_exit(void)
{
	static const char *const w3[] = {"sh", "-c", "exit 3", NULL};
	static const char *const wkill[] = {"sh", "-c", "kill -KILL $$", NULL};
	static const char *const wterm[] = {"sh", "-c", "kill -TERM $$", NULL};
	static const char *const wnone[] = {"no-such-program-anywhere", NULL};
	it_write_file(it_path("noexec"), "#!/bin/sh\nexit 0\n"); /* mode 0600 */
	const char *const wnoexec[] = {it_path("noexec"), NULL};
	static const char *const wdir[] = {"/", NULL};
	struct {
		const char *const *argv;
		int code;
		const char *log;
	} cases[] = {
		{w3, 3, "workload (pid "},
		{wkill, 137, "killed by signal 9"},
		{wterm, 143, "killed by signal 15"},
		{wnone, 127, "cannot run the workload no-such-program-anywhere: No such file or directory"},
		{wnoexec, 126, "Permission denied"},
		{wdir, 126, "Permission denied"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char name[16];
		snprintf(name, sizeof(name), "w%zu", i);
		struct it_daemon *d = it_daemon_spawn_argv(name, daemon_argv(false, NULL, NULL, cases[i].argv));
		CHECKF(it_daemon_wait_exit(d, 10000), "%s did not exit", name);
		CHECKF(exit_code(d) == cases[i].code, "%s: exit %d, want %d", name, exit_code(d), cases[i].code);
		char *log = it_daemon_log(d);
		CHECK_CONTAINS(log, cases[i].log);
		free(log);
	}
	/* usage: nothing after "--", a command without "--" */
	static const char *const none[] = {NULL};
	struct it_daemon *d = it_daemon_spawn_argv("u1", daemon_argv(false, NULL, NULL, none));
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 2);
	const char *argv2[] = {SHIM_BIN, "--state-dir", it_path("state"), "true", NULL};
	d = it_daemon_spawn_argv("u2", argv2);
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 2);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "a workload goes after '--'");
	free(log);
	return 0;
}

static int case_workload_stdio(void)
{
	/* the container's stdio: stderr (the log here) is the workload's, and its own
	 * options after "--" are not the daemon's */
	static const char *const w[] = {"sh", "-c", "echo to-stderr --help >&2; exit 0", "--version", NULL};
	struct it_daemon *d = it_daemon_spawn_argv("w", daemon_argv(false, NULL, NULL, w));
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 0);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "to-stderr --help\n");
	free(log);

	/* with --stdio the channel has left fds 0 and 1: the workload finds /dev/null */
	const char *f = it_path("fds");
	char target[1024];
	snprintf(target, sizeof(target),
		 "exec:%s --stdio --state-dir %s -- sh -c 'x=$(readlink /proc/$$/fd/0 /proc/$$/fd/1); "
		 "echo \"$x\" > %s.tmp; mv %s.tmp %s; exec sleep 100'",
		 SHIM_BIN, it_path("state2"), f, f, f);
	struct sbx_client *c = it_connect(target, NULL);
	wait_file(f, "/dev/null\n/dev/null\n", 5000);
	/* the channel still works, and the daemon is the workload's parent */
	char out[64];
	CHECK_EQ(run_sh(c, "echo ok", out, sizeof(out)), 0);
	CHECK_CONTAINS(out, "ok");
	sbx_client_close(c); /* stdio closed: the daemon ends the workload and exits */
	return 0;
}

static int signals(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	const char *f = it_path("sig");
	const char *g = it_path("child");
	char script[1024];
	/* a child in the workload's group noting HUP: "do something" signals reach the
	 * workload only; SIGINT reaches the whole group (the child dies of it) */
	snprintf(script, sizeof(script),
		 "trap 'echo HUP >> %s' HUP; trap 'echo USR1 >> %s' USR1; trap 'echo USR2 >> %s' USR2;"
		 "trap 'exit 7' INT;"
		 "sh -c \"trap 'echo child-HUP >> %s' HUP; while :; do sleep 0.05; done\" &"
		 "echo ready >> %s; while :; do sleep 0.05; done",
		 f, f, f, g, f);
	const char *const w[] = {"sh", "-c", script, NULL};
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(pid1, t, NULL, w));
	pid_t shim = daemon_pid(d, pid1);
	wait_file(f, "ready\n", 5000);
	kill(shim, SIGHUP);
	wait_file(f, "ready\nHUP\n", 5000);
	kill(shim, SIGUSR1);
	wait_file(f, "ready\nHUP\nUSR1\n", 5000);
	kill(shim, SIGUSR2);
	wait_file(f, "ready\nHUP\nUSR1\nUSR2\n", 5000);
	it_sleep_ms(200);
	CHECKF(read_all(g)[0] == '\0', "the workload's child got HUP: %s", read_all(g));
	/* the daemon keeps serving meanwhile */
	struct sbx_client *c = it_connect(t, NULL);
	struct sbx_info info = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &info, &err), &err);
	CHECK_EQ(info.pid1, pid1);
	sbx_client_close(c);
	kill(shim, SIGINT);
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 7);
	return 0;
}

static int case_signals(void)
{
	return signals(false);
}

static int case_pid1_signals(void)
{
	return signals(true);
}

/* The workload exits while a detached process runs: that gets TERM, then KILL after
 * the grace; the daemon exits with the workload's code. */
static int case_workload_ends(void)
{
	const char *ready = it_path("ready");
	char script[256];
	snprintf(script, sizeof(script), "while [ ! -e %s ]; do sleep 0.02; done; exit 4", ready);
	const char *const w[] = {"sh", "-c", script, NULL};
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(false, t, "1", w));
	struct sbx_client *c = it_connect(t, NULL);
	const char *f = it_path("term");
	spawn_stubborn(c, "stubborn", f);
	uint64_t t0 = it_now_ms();
	it_write_file(ready, "");
	CHECK(it_daemon_wait_exit(d, 10000));
	uint64_t took = it_now_ms() - t0;
	CHECK_EQ(exit_code(d), 4);
	CHECKF(took >= 900 && took < 2500, "exit after %llu ms (grace 1 s)", (unsigned long long)took);
	CHECKF(strcmp(read_all(f), "ready\nterm\n") == 0, "%s: '%s'", f, read_all(f));
	sbx_client_close(c);
	return 0;
}

/* ---- PID 1 ---- */

static int case_pid1(void)
{
	if (!can_unshare())
		return IT_SKIP;
	static const char *const w[] = {"sh", "-c", "trap 'exit 3' TERM; sleep 1000 & wait", NULL};
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(true, t, NULL, w));
	struct sbx_client *c = it_connect(t, NULL);
	struct sbx_info info = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &info, &err), &err);
	CHECK_EQ(info.pid1, 1);
	CHECK_EQ(info.pid, 1);
	char out[256];
	CHECK_EQ(run_sh(c, "cat /proc/1/comm", out, sizeof(out)), 0);
	CHECKF(strcmp(out, "sandbox-shim\n") == 0, "/proc/1/comm: '%s'", out);

	/* orphans: reparented to PID 1 ... */
	CHECK_EQ(run_sh(c, "sleep 0.5 </dev/null >/dev/null 2>&1 & echo $!", out, sizeof(out)), 0);
	int opid = atoi(out);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "cut -d' ' -f4 /proc/%d/stat", opid);
	CHECK_EQ(run_sh(c, cmd, out, sizeof(out)), 0);
	CHECKF(strcmp(out, "1\n") == 0, "the orphan's parent: '%s' (want 1)", out);
	/* ... and reaped: many of them, some in sessions of their own */
	for (int i = 0; i < 30; i++)
		CHECK_EQ(run_sh(c,
				i % 2 ? "sleep 0.05 & sleep 0.02 & true" :
					"setsid sleep 0.05 </dev/null >/dev/null 2>&1 &",
				NULL, 0),
			 0);
	it_sleep_ms(600);
	char zcmd[300];
	snprintf(zcmd, sizeof(zcmd), "%s zombies", IT_SYS_BIN);
	CHECK_EQ(run_sh(c, zcmd, out, sizeof(out)), 0);
	CHECKF(strcmp(out, "zombies 0\n") == 0, "after the orphans: '%s'", out);
	sbx_client_close(c);

	/* SIGTERM to the daemon: the workload gets it, traps it (exit 3), the daemon exits 3 */
	pid_t shim = daemon_pid(d, true);
	kill(shim, SIGTERM);
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 3);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "shutting down (SIGTERM)");
	CHECK_CONTAINS(log, "exited with 3");
	free(log);
	return 0;
}

static int case_pid1_exit_codes(void)
{
	if (!can_unshare())
		return IT_SKIP;
	static const char *const wnone[] = {"no-such-program-anywhere", NULL};
	it_write_file(it_path("noexec"), "#!/bin/sh\nexit 0\n");
	const char *const wnoexec[] = {it_path("noexec"), NULL};
	static const char *const wkill[] = {"sh", "-c", "kill -KILL $$", NULL};
	static const char *const w5[] = {"sh", "-c", "exit 5", NULL};
	struct {
		const char *const *argv;
		int code;
	} cases[] = {{wnone, 127}, {wnoexec, 126}, {wkill, 137}, {w5, 5}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char name[16];
		snprintf(name, sizeof(name), "p%zu", i);
		struct it_daemon *d = it_daemon_spawn_argv(name, daemon_argv(true, NULL, NULL, cases[i].argv));
		CHECKF(it_daemon_wait_exit(d, 10000), "%s did not exit", name);
		CHECKF(exit_code(d) == cases[i].code, "%s: exit %d, want %d", name, exit_code(d), cases[i].code);
	}
	return 0;
}

/* SIGTERM with processes running: TERM to each (once), KILL after the grace, exit 0
 * within grace + 1 s. As PID 1 (no workload) and not. */
static int sigterm_grace(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(pid1, t, "1", NULL));
	struct sbx_client *c = it_connect(t, NULL);
	const char *f = it_path("term"), *g = it_path("orphan");
	spawn_stubborn(c, "stubborn", f);
	spawn_orphan(c, g);
	/* and a foreground command in flight: it gets the TERM too, and its stream ends
	 * with its real exit status (the connection stays open through the grace) */
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "sleep 100";
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	unsigned fg_pid = sbx_proc_pid(p);

	pid_t shim = daemon_pid(d, pid1);
	uint64_t t0 = it_now_ms();
	kill(shim, SIGTERM);
	CHECK(it_daemon_wait_exit(d, 10000));
	uint64_t took = it_now_ms() - t0;
	CHECK_EQ(exit_code(d), 0);
	/* the stubborn ones kept running after TERM: the KILL came at the grace's end */
	CHECKF(took >= 900 && took < 2000, "exit after %llu ms (grace 1 s)", (unsigned long long)took);
	CHECKF(strcmp(read_all(f), "ready\nterm\n") == 0, "%s: '%s'", f, read_all(f));
	CHECKF(strcmp(read_all(g), "ready\norphan-term\n") == 0, "%s: '%s'", g, read_all(g));
	if (!pid1)
		CHECK(pid_gone((pid_t)fg_pid, 2000));
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.signal, SIGTERM);
	sbx_proc_free(p);
	sbx_client_close(c);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "the grace period is over");
	free(log);
	return 0;
}

static int case_sigterm_grace(void)
{
	return sigterm_grace(false);
}

static int case_pid1_sigterm_grace(void)
{
	return sigterm_grace(true);
}

/* Not PID 1: a subreaper, so an orphaned grandchild's parent is the daemon; it is
 * reaped, and ended at shutdown (TERM: no wait for the grace). */
static int case_subreaper(void)
{
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(false, t, NULL, NULL));
	struct sbx_client *c = it_connect(t, NULL);
	char out[64], cmd[300];
	CHECK_EQ(run_sh(c, "sleep 30 </dev/null >/dev/null 2>&1 & echo $!", out, sizeof(out)), 0);
	pid_t orphan = (pid_t)atoi(out);
	CHECK(orphan > 0);
	snprintf(cmd, sizeof(cmd), "/proc/%d/stat", (int)orphan);
	FILE *fp = fopen(cmd, "r");
	CHECK(fp != NULL);
	int ppid = 0;
	CHECK(fscanf(fp, "%*d %*s %*c %d", &ppid) == 1);
	fclose(fp);
	CHECK_EQ(ppid, d->pid);
	/* short-lived orphans are reaped: no zombie child of the daemon */
	for (int i = 0; i < 20; i++)
		CHECK_EQ(run_sh(c, "sleep 0.02 & true", NULL, 0), 0);
	it_sleep_ms(300);
	snprintf(cmd, sizeof(cmd),
		 "grep -l '^PPid:[[:space:]]*%d$' /proc/[0-9]*/status 2>/dev/null | "
		 "xargs -r grep -l '^State:[[:space:]]*Z' | wc -l",
		 (int)d->pid);
	CHECK_EQ(run_sh(c, cmd, out, sizeof(out)), 0);
	CHECKF(strcmp(out, "0\n") == 0, "zombie children of the daemon: %s", out);
	sbx_client_close(c);
	uint64_t t0 = it_now_ms();
	CHECK_EQ(it_daemon_stop(d), 0);
	CHECKF(it_now_ms() - t0 < 1500, "shutdown took %llu ms", (unsigned long long)(it_now_ms() - t0));
	CHECK(pid_gone(orphan, 2000));
	return 0;
}

/* ---- stress: 1,000 short commands, each leaving an orphan behind ---- */

#define STRESS_THREADS 4
#define STRESS_PER_THREAD 250

struct stress_arg {
	const char *target;
	int base;
	int bad; /* commands whose status was wrong */
	char what[256];
};

static void *stress_thread(void *ud)
{
	struct stress_arg *a = ud;
	struct sbx_client *c = it_connect(a->target, NULL);
	for (int i = 0; i < STRESS_PER_THREAD; i++) {
		int n = a->base + i;
		char cmd[128];
		/* the orphan outlives its parent a little (or not): both orders happen */
		snprintf(cmd, sizeof(cmd), "sleep 0.0%d </dev/null >/dev/null 2>&1 & exit %d", n % 4, n % 200);
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.shell = cmd;
		struct sbx_output o;
		struct sbx_exit ex = SBX_EXIT_INIT;
		struct sbx_error err;
		if (sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &o, &ex, &err) < 0) {
			snprintf(a->what, sizeof(a->what), "command %d: %s", n, it_errstr(&err));
			a->bad++;
			continue;
		}
		sbx_output_free(&o);
		if (ex.exit_code != n % 200 || ex.signal != 0) {
			snprintf(a->what, sizeof(a->what), "command %d: exit %d signal %d, want exit %d", n,
				 ex.exit_code, ex.signal, n % 200);
			a->bad++;
		}
	}
	sbx_client_close(c);
	return NULL;
}

/* Children of pid in state Z, seen from here (same PID namespace). */
static int zombie_children(pid_t pid)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd),
		 "grep -l '^PPid:[[:space:]]*%d$' /proc/[0-9]*/status 2>/dev/null | "
		 "xargs -r grep -l '^State:[[:space:]]*Z' 2>/dev/null | wc -l",
		 (int)pid);
	FILE *p = popen(cmd, "r");
	CHECK(p != NULL);
	int n = -1;
	CHECK(fscanf(p, "%d", &n) == 1);
	pclose(p);
	return n;
}

static int stress(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	const char *t = it_unix_target(it_path("s.sock"));
	struct it_daemon *d = it_daemon_start_argv("shim", daemon_argv(pid1, t, NULL, NULL));
	pthread_t th[STRESS_THREADS];
	struct stress_arg args[STRESS_THREADS];
	for (int i = 0; i < STRESS_THREADS; i++) {
		args[i] = (struct stress_arg){.target = t, .base = i * STRESS_PER_THREAD};
		CHECK(pthread_create(&th[i], NULL, stress_thread, &args[i]) == 0);
	}
	for (int i = 0; i < STRESS_THREADS; i++) {
		pthread_join(th[i], NULL);
		CHECKF(args[i].bad == 0, "%d wrong statuses, e.g. %s", args[i].bad, args[i].what);
	}
	/* every orphan has ended by now (the longest sleeps 30 ms) and been reaped */
	it_sleep_ms(300);
	struct sbx_client *c = it_connect(t, NULL);
	char out[64], zcmd[300];
	snprintf(zcmd, sizeof(zcmd), "%s zombies", IT_SYS_BIN);
	CHECK_EQ(run_sh(c, zcmd, out, sizeof(out)), 0);
	if (pid1)
		CHECKF(strcmp(out, "zombies 0\n") == 0, "in the namespace: '%s'", out);
	else
		CHECK_EQ(zombie_children(d->pid), 0);
	sbx_client_close(c);
	/* under unshare the daemon is unshare's child: SIGTERM goes to it */
	kill(daemon_pid(d, pid1), SIGTERM);
	CHECK(it_daemon_wait_exit(d, 10000));
	CHECK_EQ(exit_code(d), 0);
	return 0;
}

static int case_stress(void)
{
	return stress(false);
}

static int case_pid1_stress(void)
{
	return stress(true);
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"workload_exit", case_workload_exit},
		{"workload_stdio", case_workload_stdio},
		{"signals", case_signals},
		{"pid1_signals", case_pid1_signals},
		{"workload_ends", case_workload_ends},
		{"pid1", case_pid1},
		{"pid1_exit_codes", case_pid1_exit_codes},
		{"sigterm_grace", case_sigterm_grace},
		{"pid1_sigterm_grace", case_pid1_sigterm_grace},
		{"subreaper", case_subreaper},
		{"stress", case_stress},
		{"pid1_stress", case_pid1_stress},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
