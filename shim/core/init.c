/* init.c: PID-1 duties: subreaper set-up, the supervised workload, signal forwarding, ending children at shutdown.
 *
 * With a workload the shim takes tini's stance on signals: every one it may receive is
 * blocked in every thread and read from a signalfd on the loop (the kernel queues a
 * blocked signal even for a PID 1 without a handler, and treats a blocked SIGTTOU or
 * SIGTTIN as ignored, so the shim is never stopped for touching the terminal), then
 * passed on to the workload, once per signal received. Left out: SIGCHLD (the reaper's),
 * SIGKILL and SIGSTOP (not catchable), the synchronous faults (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGSYS, SIGABRT: the shim's own crash, never "forwarded"), and SIGURG,
 * which the worker pool uses to interrupt its threads: a SIGURG the shim did not send
 * itself reaches us through worker_on_foreign_signal() instead. */
#include "init.h"
#include "log.h"
#include "policy.h"
#include "proc.h"
#include "reaper.h"
#include "server.h"
#include "spawn.h"
#include "util.h"
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_HOOKS 16
#define MAX_SCAN 4096 /* children looked at per signalling pass */
#define GIVE_UP_SECONDS 1.0
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

static struct {
	struct server *s;
	pid_t workload; /* > 0 while it runs; it leads its own process group */
	/* signals, with a workload */
	int sigfd;
	ev_io sigfd_w;
	ev_async urg_w; /* a foreign SIGURG, from worker_on_foreign_signal() */
	int urg_pending;
	/* shutdown, step 1: waiting for the workload */
	void (*then)(struct server *s);
	ev_timer cmd_grace; /* the commands: TERM -> KILL */
	/* groups that had their SIGTERM in step 1 (the workload's, the commands'):
	 * step 2 does not send them another */
	pid_t termed[MAX_SCAN];
	unsigned n_termed;
	/* shutdown, step 2: what is left */
	ev_timer grace;   /* TERM -> KILL */
	ev_timer give_up; /* KILL -> stop waiting */
	bool gave_up;
	struct {
		void (*fn)(void *ud);
		void *ud;
	} hooks[MAX_HOOKS];
	unsigned n_hooks;
	pid_t scan[MAX_SCAN], groups[MAX_SCAN];
} init = {.sigfd = -1};

/* ---- set-up ---- */

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void give_up_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void cmd_grace_cb(struct ev_loop *loop, ev_timer *w, int revents);

/* Also from init_shutdown_begin(): a server run without init_setup() (unit tests). */
static void init_watchers(struct server *s)
{
	if (init.s != NULL)
		return;
	init.s = s;
	ev_init(&init.grace, grace_cb);
	ev_init(&init.give_up, give_up_cb);
	ev_init(&init.cmd_grace, cmd_grace_cb);
}

int init_setup(struct server *s, struct shim_err *err)
{
	init_watchers(s);
	/* as PID 1 every orphan of the namespace is ours already */
	if (!s->pid1 && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		return err_set(err, errno, NULL, "prctl(PR_SET_CHILD_SUBREAPER)");
	return 0;
}

/* ---- signals: which, and where to ---- */

static bool is_fault(int sig)
{
	return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS ||
	       sig == SIGABRT;
}

/* Every signal the shim takes for the workload: all catchable ones but SIGCHLD, the
 * faults and SIGURG (see the top of the file). */
static void forwarded_set(sigset_t *set)
{
	sigemptyset(set);
	for (int sig = 1; sig <= SIGSYS; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD || sig == SIGURG || is_fault(sig))
			continue;
		sigaddset(set, sig);
	}
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		sigaddset(set, sig);
}

/* To the workload's process group: SIGTERM and SIGINT, so that a shell script's
 * children stop too (as a terminal's ^C reaches them all), and SIGTSTP and SIGCONT,
 * which stop and resume a job as a whole. Every other signal to the workload alone,
 * as a runtime's kill would reach it without an init: reload-type signals are for a
 * master process to pass on, and SIGQUIT (nginx's graceful stop) would make every
 * child that does not expect it dump core. */
static bool to_group(int sig)
{
	return sig == SIGTERM || sig == SIGINT || sig == SIGTSTP || sig == SIGCONT;
}

static const char *sig_name(int sig, char *buf, size_t size)
{
	const char *abbrev = sig < SIGRTMIN ? sigabbrev_np(sig) : NULL;
	if (abbrev != NULL)
		snprintf(buf, size, "SIG%s", abbrev);
	else
		snprintf(buf, size, "SIGRTMIN+%d", sig - SIGRTMIN);
	return buf;
}

/* sig to the workload, or its group (see to_group()), exactly once. */
static void forward(int sig)
{
	char name[24];
	pid_t w = init.workload;
	if (w <= 0) {
		log_debug("%s: no workload any more to pass it to", sig_name(sig, name, sizeof(name)));
		return;
	}
	/* the group only while the workload still leads it: one that moved to another
	 * group (or made its own session) is signalled alone */
	if (to_group(sig) && getpgid(w) == w && kill(-w, sig) == 0) {
		log_debug("%s to the workload's process group %d", sig_name(sig, name, sizeof(name)), (int)w);
		return;
	}
	log_debug("%s to the workload (pid %d)", sig_name(sig, name, sizeof(name)), (int)w);
	kill(w, sig);
}

static void on_signal(struct server *s, int sig)
{
	if (sig != SIGTERM) {
		/* SIGINT included: with a workload it is the workload's, not a shutdown */
		forward(sig);
		return;
	}
	/* The first SIGTERM starts the shutdown, whose first step passes it on; any
	 * later one is passed on as it comes (the runtime insisting). */
	if (!s->shutting_down)
		server_shutdown(s, "SIGTERM");
	else
		forward(sig);
}

static void sigfd_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	struct signalfd_siginfo si[16];
	for (;;) {
		ssize_t n = read(init.sigfd, si, sizeof(si));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* EAGAIN: all read */
		for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++) {
			int sig = (int)si[i].ssi_signo;
			/* Raised for the shim's own doing, not sent to it: SIGPIPE and SIGXFSZ
			 * of its writes (in its own name), SIGXCPU of its own rlimit, SIGHUP
			 * when its terminal hangs up (the kernel). The terminal's foreground,
			 * the workload, gets its own SIGHUP from the kernel. */
			int code = si[i].ssi_code;
			if (code == SI_KERNEL ||
			    ((code == SI_USER || code == SI_TKILL) && (pid_t)si[i].ssi_pid == init.s->pid)) {
				char name[24];
				log_debug("%s raised by the shim's own doing: not passed on",
					  sig_name(sig, name, sizeof(name)));
				continue;
			}
			on_signal(init.s, sig);
		}
		if ((size_t)n < sizeof(si))
			return;
	}
}

/* In a signal handler, any thread (worker_on_foreign_signal()). */
static void foreign_urg(int sig)
{
	(void)sig;
	__atomic_store_n(&init.urg_pending, 1, __ATOMIC_RELEASE);
	ev_async_send(init.s->loop, &init.urg_w);
}

static void urg_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	/* coalesced, as the kernel does with a standard signal */
	if (__atomic_exchange_n(&init.urg_pending, 0, __ATOMIC_ACQ_REL))
		on_signal(init.s, SIGURG);
}

void init_hold_signals(void)
{
	sigset_t set;
	forwarded_set(&set);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* Before the workload's fork: from now on every signal in forwarded_set() waits in
 * the signalfd for the loop, none can be missed or act by default. The server's own
 * SIGTERM/SIGINT watchers step aside (the signals are read here now; one that came
 * during start-up waits in the signalfd too when init_hold_signals() ran first). */
static int take_signals(struct server *s, struct shim_err *err)
{
	sigset_t set;
	forwarded_set(&set);
	/* the worker threads block every signal but SIGURG already (worker.c) */
	if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
		return err_set(err, EINVAL, NULL, "pthread_sigmask");
	init.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (init.sigfd < 0)
		return err_set(err, errno, NULL, "signalfd");
	/* unref'd by server_init(): balance before stopping */
	ev_ref(s->loop);
	ev_signal_stop(s->loop, &s->sig_term);
	ev_ref(s->loop);
	ev_signal_stop(s->loop, &s->sig_int);
	/* libev's stop reset them to SIG_DFL: blocked, they are queued all the same. The
	 * shim gives the terminal away: with SIGTTOU and SIGTTIN ignored as well as
	 * blocked, nothing can stop it for writing its log to the terminal (TOSTOP). */
	signal(SIGTTOU, SIG_IGN);
	signal(SIGTTIN, SIG_IGN);
	/* referenced: the loop lives as long as the workload (workload_exited() unrefs) */
	ev_io_init(&init.sigfd_w, sigfd_cb, init.sigfd, EV_READ);
	ev_io_start(s->loop, &init.sigfd_w);
	ev_async_init(&init.urg_w, urg_cb);
	ev_async_start(s->loop, &init.urg_w);
	ev_unref(s->loop);
	worker_on_foreign_signal(foreign_urg);
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

/* In the child: async-signal-safe calls only. Every signal is blocked here (the
 * parent blocked them around fork), SIGTTOU included, so tcsetpgrp() from what is now
 * a background group succeeds instead of stopping us. */
static void __attribute__((noreturn))
workload_child(char *const cand[], char *const argv[], int errfd, bool reset_oom, bool take_tty)
{
	setpgid(0, 0);
	/* decided by the parent before the fork (see init_start_workload()) */
	if (take_tty)
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
	/* nor its raised open-file limit: the workload gets the one the shim was given */
	if (spawn_start_limits.have_nofile)
		setrlimit(RLIMIT_NOFILE, &spawn_start_limits.nofile);
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

static void workload_exited(void *ud, pid_t pid, int status)
{
	struct server *s = ud;
	init.workload = 0;
	/* signals alone no longer keep the loop running */
	ev_unref(s->loop);
	if (WIFSIGNALED(status)) {
		s->exit_code = 128 + WTERMSIG(status);
		log_info("workload (pid %d) killed by signal %d", (int)pid, WTERMSIG(status));
	} else {
		s->exit_code = WEXITSTATUS(status);
		log_info("workload (pid %d) exited with %d", (int)pid, WEXITSTATUS(status));
	}
	/* in the middle of a shutdown: on to its next step (what is left); otherwise
	 * this is the start of one */
	void (*then)(struct server *) = init.then;
	init.then = NULL;
	if (then != NULL)
		then(s);
	else
		server_shutdown(s, "workload exited");
}

/* Whether stdin is our controlling terminal with our process group in its foreground.
 * Call with SIGTTIN blocked (take_signals()). */
static bool in_foreground(void)
{
	pid_t fg = tcgetpgrp(STDIN_FILENO);
	if (fg < 0)
		return false; /* no terminal, or not ours */
	pid_t own = getpgrp();
	if (fg > 0 || own > 0)
		return fg == own;
	/* Both groups are outside our PID namespace (unshare --pid --fork leaves its child
	 * in its own session and group), so their ids read 0: ask the terminal instead. A
	 * read of nothing is refused (EIO) to a background process that blocks SIGTTIN,
	 * before anything else is done; a foreground one gets 0, or EAGAIN when another
	 * reader holds the terminal (a fresh open file, O_NONBLOCK: never waits). */
	int fd = open("/proc/self/fd/0", O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return true; /* cannot tell: hand it over, as tini always does */
	char c;
	ssize_t n = read(fd, &c, 0);
	bool fg_ours = n == 0 || (n < 0 && errno == EAGAIN);
	close(fd);
	return fg_ours;
}

int init_start_workload(struct server *s, char *const argv[], struct shim_err *err)
{
	init_watchers(s);
	cleanup_free char **cand = exec_candidates(argv[0], err);
	if (cand == NULL)
		return -1;
	bool reset_oom = policy_own_oom_score_adj() < 0;
	if (take_signals(s, err) < 0)
		return -1;
	/* The terminal goes to the workload when the shim has it in the foreground (as a
	 * container's init does): decided here, once, so that the child need not compare
	 * groups while our setpgid() below may or may not have run yet. A shim started in
	 * the background of someone's shell leaves their terminal alone. */
	bool take_tty = in_foreground();
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return err_set(err, errno, NULL, "pipe2");
	/* no signal handler of ours may run in the child before execve */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t pid = fork();
	if (pid == 0)
		workload_child(cand, argv, pfd[1], reset_oom, take_tty);
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
	log_info("workload started: %s (pid %d%s)", argv[0], (int)pid,
		 take_tty ? ", in the terminal's foreground" : "");
	return 0;
}

/* ---- shutdown, step 1: the workload's terms ---- */

static bool termed(pid_t pg)
{
	for (unsigned i = 0; i < init.n_termed; i++)
		if (init.termed[i] == pg)
			return true;
	return false;
}

static void cmd_grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	if (proc_running() == 0)
		return;
	log_info("shutdown: the grace period of the commands is over; SIGKILL to them");
	proc_signal_all(SIGKILL);
}

void init_shutdown_workload(struct server *s, void (*then)(struct server *s))
{
	init_watchers(s);
	if (init.workload <= 0) {
		then(s);
		return;
	}
	init.then = then;
	log_info("shutdown: SIGTERM to the workload (pid %d); waiting for it to exit, as long as it takes",
		 (int)init.workload);
	init.termed[init.n_termed++] = init.workload; /* its group */
	forward(SIGTERM);
	/* A stopped workload would keep its SIGTERM pending for ever: let it act on it
	 * (systemd does the same). A peek (WNOWAIT): no status is taken from the reaper. */
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	if (waitid(P_PID, (id_t)init.workload, &si, WSTOPPED | WNOHANG | WNOWAIT) == 0 && si.si_pid == init.workload &&
	    si.si_code == CLD_STOPPED) {
		log_info("shutdown: the workload is stopped; SIGCONT to its group");
		if (kill(-init.workload, SIGCONT) < 0)
			kill(init.workload, SIGCONT);
	}
	/* the shim's own commands end now, on the kill grace: they are not the workload */
	unsigned n = proc_groups(init.termed + init.n_termed, MAX_SCAN - init.n_termed);
	if (n > 0) {
		init.n_termed += n;
		log_info("shutdown: SIGTERM to %u command(s); SIGKILL in %.1f s", n, s->cfg.kill_grace);
		proc_signal_all(SIGTERM);
		ev_timer_set(&init.cmd_grace, s->cfg.kill_grace, 0);
		ev_timer_start(s->loop, &init.cmd_grace);
	}
}

/* ---- shutdown, step 2: what is left ---- */

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
 * they are in; not to the groups that had a SIGTERM already (skip). False when /proc
 * could not list the children. */
static bool signal_child_groups(int sig, bool skip)
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
		if (skip && termed(pg))
			continue;
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

/* As PID 1: sig to every process of the namespace but ourselves and the groups that
 * had their SIGTERM already. False when /proc cannot be read. */
static bool signal_namespace_but_termed(int sig)
{
	DIR *d = opendir("/proc");
	if (d == NULL)
		return false;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end != '\0' || pid <= 1)
			continue;
		pid_t pg = getpgid((pid_t)pid);
		if (pg >= 0 && !termed(pg))
			kill((pid_t)pid, sig);
	}
	closedir(d);
	return true;
}

static void signal_everything(struct server *s, int sig)
{
	/* each process at most one SIGTERM from the shutdown (a shell's trap must not
	 * run twice, a draining server must not take a second one for "hurry") */
	bool skip = sig == SIGTERM && init.n_termed > 0;
	if (s->pid1) {
		/* init's duty: every process in the PID namespace but ourselves */
		if (!skip || !signal_namespace_but_termed(sig))
			kill(-1, sig);
		return;
	}
	/* Each group exactly once for TERM; the group scan covers what proc_signal_all()
	 * reaches and more (adopted orphans). KILL goes every way there is. */
	bool scanned = signal_child_groups(sig, skip);
	if (!scanned || sig == SIGKILL) {
		proc_signal_all(sig);
		/* (not once it is reaped: a free group id may be someone else's by now) */
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
	log_debug("shutdown: SIGTERM to every child%s; SIGKILL in %.1f s",
		  init.n_termed > 0 ? " that has had none yet" : "", s->cfg.kill_grace);
	signal_everything(s, SIGTERM);
	ev_timer_set(&init.grace, s->cfg.kill_grace, 0);
	ev_timer_start(s->loop, &init.grace);
}

bool init_shutdown_done(struct server *s)
{
	/* the workload is waited for as long as it takes: the runtime owns that deadline */
	if (init.workload > 0)
		return false;
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
		ev_timer_stop(s->loop, &init.cmd_grace);
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
