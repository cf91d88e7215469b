/* init.c: PID-1 duties: subreaper set-up, the supervised workload, signal forwarding, ending children at shutdown. */
#include "init.h"
#include "log.h"
#include "policy.h"
#include "proc.h"
#include "reaper.h"
#include "server.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_HOOKS 16
#define MAX_SCAN 4096 /* children looked at per signalling pass */
#define GIVE_UP_SECONDS 1.0
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

static const int forwarded[] = {SIGHUP, SIGUSR1, SIGUSR2};

static struct {
	struct server *s;
	pid_t workload; /* > 0 while it runs; it leads its own process group */
	bool has_workload;
	ev_signal fwd[ARRAY_SIZE(forwarded)];
	ev_timer grace;   /* TERM -> KILL */
	ev_timer give_up; /* KILL -> stop waiting */
	bool gave_up;
	struct {
		void (*fn)(void *ud);
		void *ud;
	} hooks[MAX_HOOKS];
	unsigned n_hooks;
	pid_t scan[MAX_SCAN], groups[MAX_SCAN];
} init;

/* ---- set-up ---- */

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void give_up_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* Also from init_shutdown_begin(): a server run without init_setup() (unit tests). */
static void init_watchers(struct server *s)
{
	if (init.s != NULL)
		return;
	init.s = s;
	ev_init(&init.grace, grace_cb);
	ev_init(&init.give_up, give_up_cb);
}

int init_setup(struct server *s, struct shim_err *err)
{
	init_watchers(s);
	/* as PID 1 every orphan of the namespace is ours already */
	if (!s->pid1 && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		return err_set(err, errno, NULL, "prctl(PR_SET_CHILD_SUBREAPER)");
	return 0;
}

/* ---- the workload ---- */

/* Where execvp would look for name: every PATH entry, resolved here because the
 * child may not allocate. One malloc'd block (pointers, then strings); NULL-terminated. */
static char **exec_candidates(const char *name, struct shim_err *err)
{
	const char *path = strchr(name, '/') != NULL || name[0] == '\0' ? NULL : getenv("PATH");
	if (path == NULL && strchr(name, '/') == NULL && name[0] != '\0')
		path = DEFAULT_PATH;
	size_t n = 1, bytes = strlen(name) + 1;
	if (path != NULL) {
		n = 1;
		for (const char *p = path; *p; p++)
			n += *p == ':';
		bytes = strlen(path) + n * (strlen(name) + 3); /* "dir" + '/' + name + NUL, "." for "" */
	}
	char **c = malloc((n + 1) * sizeof(char *) + bytes);
	if (c == NULL) {
		err_set(err, ENOMEM, name, "out of memory");
		return NULL;
	}
	char *out = (char *)(c + n + 1);
	if (path == NULL) {
		strcpy(out, name);
		c[0] = out;
		c[1] = NULL;
		return c;
	}
	size_t i = 0;
	for (const char *p = path;; i++) {
		const char *end = strchrnul(p, ':');
		size_t dlen = (size_t)(end - p);
		c[i] = out;
		if (dlen == 0) /* an empty entry is the current directory */
			out += sprintf(out, "./%s", name) + 1;
		else
			out += sprintf(out, "%.*s/%s", (int)dlen, p, name) + 1;
		if (*end == '\0')
			break;
		p = end + 1;
	}
	c[i + 1] = NULL;
	return c;
}

/* In the child: async-signal-safe calls only. */
static void __attribute__((noreturn)) workload_child(char *const cand[], char *const argv[], int errfd, bool reset_oom)
{
	pid_t fg = tcgetpgrp(STDIN_FILENO);
	pid_t ours = getpgrp();
	setpgid(0, 0);
	/* Hand it the terminal if the shim had it in the foreground (SIGTTOU is blocked
	 * here), so that ^C and job control reach the workload as they would without us. */
	if (fg >= 0 && fg == ours)
		tcsetpgrp(STDIN_FILENO, getpid());
	if (reset_oom) {
		/* the shim may run protected from the OOM killer; its workload must not */
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			ssize_t w = write(fd, "0\n", 2);
			(void)w;
			close(fd);
		}
	}
	/* none of the shim's signal set-up is inherited (it ignores SIGPIPE, SIGTTOU...) */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		sigaction(sig, &dfl, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* execvp's search, without its allocations */
	int e = ENOENT;
	bool eacces = false;
	for (size_t i = 0; cand[i] != NULL; i++) {
		execve(cand[i], argv, environ);
		e = errno;
		if (e == EACCES) {
			eacces = true;
			continue;
		}
		if (e == ENOENT || e == ENOTDIR || e == ESTALE || e == ENODEV || e == ETIMEDOUT)
			continue;
		break;
	}
	if (eacces && (e == ENOENT || e == ENOTDIR || e == ESTALE || e == ENODEV || e == ETIMEDOUT || e == EACCES))
		e = EACCES;
	ssize_t w = write(errfd, &e, sizeof(e));
	(void)w;
	_exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

static void forward_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	/* "do something" signals (reload, reopen logs) go to the workload itself: as a
	 * master process it knows what to tell its children */
	if (init.workload > 0) {
		log_debug("forwarding signal %d to the workload (pid %d)", w->signum, (int)init.workload);
		kill(init.workload, w->signum);
	}
}

static void workload_exited(void *ud, pid_t pid, int status)
{
	struct server *s = ud;
	init.workload = 0;
	if (WIFSIGNALED(status)) {
		s->exit_code = 128 + WTERMSIG(status);
		log_info("workload (pid %d) killed by signal %d", (int)pid, WTERMSIG(status));
	} else {
		s->exit_code = WEXITSTATUS(status);
		log_info("workload (pid %d) exited with %d", (int)pid, WEXITSTATUS(status));
	}
	/* the forwarders no longer keep the loop alive */
	for (size_t i = 0; i < ARRAY_SIZE(forwarded); i++)
		ev_unref(s->loop);
	server_shutdown(s, "workload exited");
}

int init_start_workload(struct server *s, char *const argv[], struct shim_err *err)
{
	cleanup_free char **cand = exec_candidates(argv[0], err);
	if (cand == NULL)
		return -1;
	bool reset_oom = policy_own_oom_score_adj() < 0;
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return err_set(err, errno, NULL, "pipe2");
	/* The shim gives the terminal away: it must not be stopped for writing its log
	 * to it (TOSTOP) or for reading it. */
	signal(SIGTTOU, SIG_IGN);
	signal(SIGTTIN, SIG_IGN);
	/* no signal handler of ours may run in the child before execve */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t pid = fork();
	if (pid == 0)
		workload_child(cand, argv, pfd[1], reset_oom);
	int fork_errno = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(pfd[1]);
	if (pid < 0) {
		close(pfd[0]);
		return err_set(err, fork_errno, argv[0], "fork");
	}
	/* also here, so that no signal can find the group missing (EACCES once the child
	 * has exec'd is fine: it did it itself) */
	setpgid(pid, pid);
	/* before the loop runs: the status cannot be missed */
	if (reaper_watch(pid, workload_exited, s) < 0) {
		kill(pid, SIGKILL);
		close(pfd[0]);
		return err_set(err, ENOMEM, argv[0], "out of memory");
	}
	int child_errno = 0;
	ssize_t n;
	do
		n = read(pfd[0], &child_errno, sizeof(child_errno));
	while (n < 0 && errno == EINTR);
	close(pfd[0]);
	if (n == (ssize_t)sizeof(child_errno)) {
		/* the child has _exit'ed; the daemon ends before its loop collects it */
		reaper_unwatch(pid);
		err_set(err, child_errno, argv[0], "cannot run the workload %s", argv[0]);
		return child_errno == ENOENT || child_errno == ENOTDIR ? 127 : 126;
	}
	init.workload = pid;
	init.has_workload = true;
	/* started, hence referenced: the loop lives as long as the workload */
	for (size_t i = 0; i < ARRAY_SIZE(forwarded); i++) {
		ev_signal_init(&init.fwd[i], forward_cb, forwarded[i]);
		ev_signal_start(s->loop, &init.fwd[i]);
	}
	log_info("workload started: %s (pid %d)", argv[0], (int)pid);
	return 0;
}

bool init_forward_sigint(struct server *s)
{
	(void)s;
	if (!init.has_workload)
		return false;
	/* "stop" signals reach the whole group, as a terminal's ^C does (a shell
	 * script's children included) */
	if (init.workload > 0) {
		log_debug("forwarding SIGINT to the workload's process group %d", (int)init.workload);
		kill(-init.workload, SIGINT);
	}
	return true;
}

/* ---- shutdown ---- */

/* Our children's pids (every thread's), at most max; -1 when /proc cannot tell. */
static long scan_children(pid_t *pids, size_t max)
{
	DIR *d = opendir("/proc/self/task");
	if (d == NULL)
		return -1;
	size_t n = 0;
	bool any = false;
	struct dirent *e;
	while ((e = readdir(d)) != NULL && n < max) {
		if (e->d_name[0] == '.')
			continue;
		char path[300];
		snprintf(path, sizeof(path), "/proc/self/task/%s/children", e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		any = true;
		char buf[4096];
		long cur = -1;
		ssize_t len;
		while ((len = read(fd, buf, sizeof(buf))) > 0 && n < max) {
			for (ssize_t i = 0; i < len && n < max; i++) {
				if (buf[i] >= '0' && buf[i] <= '9') {
					cur = (cur < 0 ? 0 : cur * 10) + (buf[i] - '0');
				} else if (cur >= 0) {
					pids[n++] = (pid_t)cur;
					cur = -1;
				}
			}
		}
		if (cur >= 0 && n < max)
			pids[n++] = (pid_t)cur;
		close(fd);
	}
	closedir(d);
	return any ? (long)n : -1;
}

/* sig to the process group of every child, once per group: commands (their own
 * sessions), the workload, and orphans adopted as subreaper with whatever group
 * they are in. False when /proc could not list the children. */
static bool signal_child_groups(int sig)
{
	long n = scan_children(init.scan, MAX_SCAN);
	if (n < 0)
		return false;
	pid_t own = getpgrp();
	size_t ng = 0;
	for (long i = 0; i < n; i++) {
		pid_t pid = init.scan[i];
		pid_t pg = getpgid(pid);
		if (pg < 0)
			continue; /* gone meanwhile */
		if (pg == own || pg <= 1) {
			/* never our own group (our parent's job may share it) */
			kill(pid, sig);
			continue;
		}
		bool seen = false;
		for (size_t j = 0; j < ng && !seen; j++)
			seen = init.groups[j] == pg;
		if (seen)
			continue;
		init.groups[ng++] = pg;
		kill(-pg, sig);
	}
	return true;
}

static void signal_everything(struct server *s, int sig)
{
	if (s->pid1) {
		/* init's duty: every process in the PID namespace but ourselves */
		kill(-1, sig);
		return;
	}
	/* Each group exactly once for TERM (a shell's trap must not run twice); the
	 * group scan covers what proc_signal_all() reaches and more (adopted orphans).
	 * KILL goes every way there is. */
	bool scanned = signal_child_groups(sig);
	if (!scanned || sig == SIGKILL) {
		proc_signal_all(sig);
		if (init.workload > 0)
			kill(-init.workload, sig);
	}
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)w;
	(void)revents;
	log_info("shutdown: the grace period is over; SIGKILL to what is left");
	signal_everything(init.s, SIGKILL);
	ev_timer_set(&init.give_up, GIVE_UP_SECONDS, 0);
	ev_timer_start(loop, &init.give_up);
}

static void give_up_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	/* e.g. stuck in the kernel on a dead FUSE mount: not worth hanging the exit for */
	log_warn("shutdown: children still there %.0f s after SIGKILL; not waiting any longer", GIVE_UP_SECONDS);
	init.gave_up = true;
}

void init_shutdown_begin(struct server *s)
{
	init_watchers(s);
	log_debug("shutdown: SIGTERM to every child; SIGKILL in %.1f s", s->cfg.kill_grace);
	signal_everything(s, SIGTERM);
	ev_timer_set(&init.grace, s->cfg.kill_grace, 0);
	ev_timer_start(s->loop, &init.grace);
}

bool init_shutdown_done(struct server *s)
{
	bool done = init.gave_up;
	if (!done) {
		/* A peek, not a reap (WNOWAIT): statuses stay for the reaper. ECHILD: no
		 * child at all, exited or not. */
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		done = waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD;
	}
	if (done) {
		ev_timer_stop(s->loop, &init.grace);
		ev_timer_stop(s->loop, &init.give_up);
	}
	return done;
}

int init_at_shutdown(void (*fn)(void *ud), void *ud)
{
	if (init.n_hooks >= MAX_HOOKS)
		return -1;
	init.hooks[init.n_hooks].fn = fn;
	init.hooks[init.n_hooks].ud = ud;
	init.n_hooks++;
	return 0;
}

void init_shutdown_hooks(void)
{
	/* ---- mounts: the FUSE mounts code registers its unmount-all here ---- */
	while (init.n_hooks > 0) {
		init.n_hooks--;
		init.hooks[init.n_hooks].fn(init.hooks[init.n_hooks].ud);
	}
}
