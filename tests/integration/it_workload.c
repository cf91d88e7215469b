/* it_workload.c: a supervised workload behaves as it would without an init (issue 15), the shim as PID 1 and not.
 *
 * Every case runs twice: "CASE" with the shim as a plain child (a subreaper), "pid1_CASE"
 * with the shim as PID 1 of a fresh PID namespace (unshare --pid --fork --mount-proc).
 * Where it makes sense the same checks run against tini and dumb-init from Debian, side
 * by side, as references: what passes with them must pass with the shim. The workload
 * is it_sigw (a line per signal it gets), a shell, or bash on a pseudo-terminal. The
 * test plays the runtime: it sends the signals, and the SIGKILL at the end. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#ifndef IT_SIGW_BIN
#error "IT_SIGW_BIN must name the it_sigw helper"
#endif

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

/* ---- the inits ---- */

enum kind { K_SHIM, K_TINI, K_DUMB, K_N };
static const char *const kind_name[K_N] = {"shim", "tini", "dumb-init"};

/* tini and dumb-init are references, not the subject: without them (tests/deps.sh
 * installs them) the shim's runs go on alone, and say so. */
static bool have(enum kind k)
{
	static int known[K_N] = {1, -1, -1};
	if (known[k] < 0) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", kind_name[k]);
		known[k] = system(cmd) == 0;
		if (!known[k])
			fprintf(stderr,
				"(%s is not installed, tests/deps.sh installs it: its reference run is left out)\n",
				kind_name[k]);
	}
	return known[k] == 1;
}

/* PID namespaces need CAP_SYS_ADMIN: skip the pid1 cases where there is none. */
static bool can_unshare(void)
{
	int rc = system("unshare --pid --fork --mount-proc true >/dev/null 2>&1");
	if (rc != 0)
		fprintf(stderr, "(unshare --pid is not permitted here: skipping)\n");
	return rc == 0;
}

/* Strings that must live as long as the case (argv): one copy of each. */
static const char *keep(const char *s)
{
	static char pool[512][300];
	static unsigned n;
	for (unsigned i = 0; i < n; i++)
		if (strcmp(pool[i], s) == 0)
			return pool[i];
	CHECKF(n < 512 && strlen(s) < sizeof(pool[0]), "keep(): out of room for '%s'", s);
	snprintf(pool[n], sizeof(pool[0]), "%s", s);
	return pool[n++];
}

/* A path in the case's temp dir, kept. */
static const char *path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *path(const char *fmt, ...)
{
	char rel[128], buf[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(buf, sizeof(buf), "%s/%s", it_dir(), rel);
	return keep(buf);
}

struct cmdline {
	const char *argv[96];
	int n;
};

static void push(struct cmdline *c, const char *a)
{
	CHECKF(c->n < 94, "command line too long");
	c->argv[c->n++] = a;
	c->argv[c->n] = NULL;
}

static void push_all(struct cmdline *c, const char *const *v)
{
	for (int i = 0; v != NULL && v[i] != NULL; i++)
		push(c, v[i]);
}

/* The init of kind k (under unshare for pid1) with its options, then the workload.
 * The shim gets a state dir of its own, named after tag. */
static void init_cmd(struct cmdline *c, enum kind k, bool pid1, const char *tag, const char *const *shim_opts,
		     const char *const *workload)
{
	c->n = 0;
	if (pid1) {
		static const char *const u[] = {"unshare", "--pid", "--fork", "--mount-proc", "--kill-child", NULL};
		push_all(c, u);
	}
	switch (k) {
	case K_SHIM:
		push(c, SHIM_BIN);
		push(c, "--state-dir");
		push(c, path("state-%s", tag));
		push_all(c, shim_opts);
		break;
	case K_TINI:
		push(c, "tini");
		if (!pid1)
			push(c, "-s"); /* a subreaper, as the shim is */
		break;
	case K_DUMB:
	case K_N:
		push(c, "dumb-init");
		break;
	}
	push(c, "--");
	push_all(c, workload);
}

/* The init's own pid: d's, or under unshare its child's (once it has one). */
static pid_t init_pid(const struct it_daemon *d, bool pid1)
{
	if (!pid1)
		return d->pid;
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/task/%d/children", (int)d->pid, (int)d->pid);
	uint64_t end = it_now_ms() + 10000;
	for (;;) {
		FILE *f = fopen(p, "r");
		int pid = 0;
		bool ok = f != NULL && fscanf(f, "%d", &pid) == 1;
		if (f != NULL)
			fclose(f);
		if (ok)
			return (pid_t)pid;
		CHECKF(it_now_ms() < end, "unshare (pid %d) has no child", (int)d->pid);
		it_sleep_ms(2);
	}
}

/* The children of pid (of all its threads), at most max; their number. */
static int children_of(pid_t pid, pid_t *out, int max)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
	DIR *d = opendir(p);
	if (d == NULL)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char cp[320];
		snprintf(cp, sizeof(cp), "/proc/%d/task/%s/children", (int)pid, e->d_name);
		FILE *f = fopen(cp, "r");
		if (f == NULL)
			continue;
		int c;
		while (n < max && fscanf(f, "%d", &c) == 1)
			out[n++] = (pid_t)c;
		fclose(f);
	}
	closedir(d);
	return n;
}

static char *slurp(const char *p)
{
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	CHECK(buf != NULL);
	for (;;) {
		if (len + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf != NULL);
		}
		ssize_t r = read(fd, buf + len, cap - len - 1);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	buf[len] = '\0';
	return buf;
}

/* Lines of the file equal to line. */
static int count_lines(const char *p, const char *line)
{
	char *s = slurp(p);
	int n = 0;
	size_t ll = strlen(line);
	for (char *q = s; q != NULL && *q != '\0';) {
		char *nl = strchr(q, '\n');
		size_t len = nl != NULL ? (size_t)(nl - q) : strlen(q);
		n += len == ll && memcmp(q, line, ll) == 0;
		q = nl != NULL ? nl + 1 : NULL;
	}
	free(s);
	return n;
}

static bool file_is(const char *p, const char *want)
{
	char *s = slurp(p);
	bool same = s != NULL && strcmp(s, want) == 0;
	free(s);
	return same;
}

/* Wait until the file holds want exactly. */
static void wait_content(const char *p, const char *want, unsigned ms, const char *what)
{
	uint64_t end = it_now_ms() + ms;
	while (!file_is(p, want)) {
		if (it_now_ms() >= end) {
			char *s = slurp(p);
			it_fail(__FILE__, __LINE__, "%s: %s holds '%s', want '%s'", what, p, s ? s : "(nothing)", want);
		}
		it_sleep_ms(2);
	}
}

/* Wait until the file has a line equal to line, n times. */
static void wait_line(const char *p, const char *line, int n, unsigned ms, const char *what)
{
	uint64_t end = it_now_ms() + ms;
	while (count_lines(p, line) < n) {
		if (it_now_ms() >= end) {
			char *s = slurp(p);
			it_fail(__FILE__, __LINE__, "%s: '%s' not %d times in %s: '%s'", what, line, n, p, s ? s : "");
		}
		it_sleep_ms(2);
	}
}

/* The child of parent that is pid ns in its own (innermost) PID namespace. */
static pid_t child_with_nspid(pid_t parent, int ns)
{
	pid_t kids[256];
	int n = children_of(parent, kids, 256);
	for (int i = 0; i < n; i++) {
		char sp[64];
		snprintf(sp, sizeof(sp), "/proc/%d/status", (int)kids[i]);
		char *status = slurp(sp);
		char *nsl = status != NULL ? strstr(status, "\nNSpid:") : NULL;
		int last = -1;
		if (nsl != NULL) {
			char *eol = strchr(nsl + 1, '\n');
			if (eol != NULL)
				*eol = '\0';
			char *tab = strrchr(nsl, '\t');
			if (tab != NULL)
				last = atoi(tab + 1);
		}
		free(status);
		if (last == ns)
			return kids[i];
	}
	it_fail(__FILE__, __LINE__, "no child of %d is pid %d of its namespace", (int)parent, ns);
}

/* The workload's pid as seen from here, from its ready file (its own view of its
 * pid; under a PID namespace matched through the NSpid lines of the init's children). */
static pid_t workload_pid(pid_t init, const char *ready, bool pid1, int line)
{
	uint64_t end = it_now_ms() + 30000;
	struct stat st;
	while (stat(ready, &st) < 0) {
		CHECKF(it_now_ms() < end, "the workload did not get ready (%s)", ready);
		it_sleep_ms(2);
	}
	char *s = slurp(ready);
	CHECK(s != NULL);
	int ns = 0;
	char *q = s;
	for (int i = 0; i < line && q != NULL; i++) {
		q = strchr(q, '\n');
		q = q != NULL ? q + 1 : NULL;
	}
	CHECKF(q != NULL && sscanf(q, "%d", &ns) == 1, "%s: '%s'", ready, s);
	free(s);
	if (!pid1)
		return (pid_t)ns;
	/* line 0: the workload, the init's child; line 1: the workload's child */
	return child_with_nspid(line == 1 ? workload_pid(init, ready, pid1, 0) : init, ns);
}

/* The process's state letter (R, S, T, Z...); 0 when it is gone. */
static char proc_state(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	char *s = slurp(p);
	char *rp = s != NULL ? strrchr(s, ')') : NULL;
	char c = rp != NULL && rp[1] == ' ' ? rp[2] : 0;
	free(s);
	return c;
}

static void wait_state(pid_t pid, bool stopped, unsigned ms, const char *what)
{
	uint64_t end = it_now_ms() + ms;
	while ((proc_state(pid) == 'T') != stopped) {
		CHECKF(it_now_ms() < end, "%s: pid %d is in state %c", what, (int)pid, proc_state(pid));
		it_sleep_ms(2);
	}
}

/* Children of pid in state Z. */
static int zombies_of(pid_t pid)
{
	pid_t kids[4096];
	int n = children_of(pid, kids, 4096), z = 0;
	for (int i = 0; i < n; i++)
		z += proc_state(kids[i]) == 'Z';
	return z;
}

/* Wait until pid has no zombie child: an init reaps each one soon after it dies (an
 * orphan may die just before this looks), none is left there. */
static bool reaps_all(pid_t pid, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	while (zombies_of(pid) != 0) {
		if (it_now_ms() >= end)
			return false;
		it_sleep_ms(2);
	}
	return true;
}

static bool gone(pid_t pid, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	for (;;) {
		char st = proc_state(pid);
		if (st == 0)
			return true;
		if (it_now_ms() >= end)
			return false;
		it_sleep_ms(2);
	}
}

static void want_exit(struct it_daemon *d, int code, unsigned ms)
{
	CHECKF(it_daemon_wait_exit(d, ms), "%s did not exit within %u ms", d->name, ms);
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == code, "%s: status 0x%x, want exit %d", d->name,
	       d->status, code);
}

static const char *signame(int sig)
{
	static char buf[8][16];
	static unsigned slot;
	char *b = buf[slot++ % 8];
	if (sig < SIGRTMIN)
		snprintf(b, 16, "%s", sigabbrev_np(sig));
	else
		snprintf(b, 16, "RTMIN+%d", sig - SIGRTMIN);
	return b;
}

/* One init running it_sigw, as a daemon of the harness. */
struct run {
	enum kind k;
	struct it_daemon *d;
	pid_t init;      /* its pid seen from here */
	pid_t workload;  /* likewise */
	const char *log; /* the workload's signals */
	const char *child_log;
	const char *ready;
};

/* Start kind k with it_sigw and the workload options given (NULL-terminated), and
 * wait until the workload is ready. */
static void start_run(struct run *r, enum kind k, bool pid1, const char *tag, const char *const *shim_opts,
		      const char *const *sigw_opts, bool child)
{
	memset(r, 0, sizeof(*r));
	r->k = k;
	r->log = path("%s.sig", tag);
	r->ready = path("%s.ready", tag);
	struct cmdline w = {.n = 0};
	push(&w, IT_SIGW_BIN);
	push(&w, "--log");
	push(&w, r->log);
	push(&w, "--ready");
	push(&w, r->ready);
	if (child) {
		r->child_log = path("%s.child", tag);
		push(&w, "--child");
		push(&w, r->child_log);
	}
	push_all(&w, sigw_opts);
	struct cmdline c;
	init_cmd(&c, k, pid1, tag, shim_opts, w.argv);
	r->d = it_daemon_spawn_argv(tag, c.argv);
	r->init = init_pid(r->d, pid1);
	r->workload = workload_pid(r->init, r->ready, pid1, 0);
}

static const char *const shim_debug[] = {"--log-level", "debug", NULL};

/* ---- exit codes: 0-255, and 128+N for every signal that kills by default ---- */

#define BATCH 8

struct job {
	pid_t pid;
	int want;
	char what[48];
};

/* Spawn argv quietly (output to logfd); its pid. */
static pid_t spawn_quiet(const char *const *argv, int logfd)
{
	int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(nullfd >= 0);
	pid_t parent = getpid();
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(nullfd, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(nullfd);
	return pid;
}

static bool kills_by_default(int sig)
{
	return sig != SIGCHLD && sig != SIGCONT && sig != SIGSTOP && sig != SIGTSTP && sig != SIGTTIN &&
	       sig != SIGTTOU && sig != SIGURG && sig != SIGWINCH && (sig < 32 || sig >= SIGRTMIN);
}

static int exit_codes(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	/* no core files from the signals that dump one */
	struct rlimit no_core = {0, 0};
	setrlimit(RLIMIT_CORE, &no_core);
	for (int k = 0; k < K_N; k++) {
		if (!have((enum kind)k))
			continue;
		int logfd = open(path("%s-codes.log", kind_name[k]), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		CHECK(logfd >= 0);
		struct job jobs[BATCH];
		int running = 0, next = 0, bad = 0, total = 256 + NSIG;
		uint64_t t0 = it_now_ms();
		while (next < total || running > 0) {
			while (running < BATCH && next < total) {
				int i = next++;
				char arg[16];
				struct job *j = &jobs[running];
				if (i < 256) {
					snprintf(arg, sizeof(arg), "%d", i);
					j->want = i;
					snprintf(j->what, sizeof(j->what), "exit %d", i);
				} else if (i - 256 > 0 && kills_by_default(i - 256)) {
					snprintf(arg, sizeof(arg), "%d", i - 256);
					j->want = 128 + i - 256;
					snprintf(j->what, sizeof(j->what), "SIG%s", signame(i - 256));
				} else {
					continue;
				}
				const char *w[] = {IT_SIGW_BIN, i < 256 ? "--exit" : "--raise", arg, NULL};
				char tag[32];
				snprintf(tag, sizeof(tag), "%s-slot%d", kind_name[k], running);
				struct cmdline c;
				init_cmd(&c, (enum kind)k, pid1, tag, NULL, w);
				j->pid = spawn_quiet(c.argv, logfd);
				running++;
			}
			if (running == 0)
				break;
			int st;
			pid_t p = waitpid(-1, &st, 0);
			if (p < 0 && errno == EINTR)
				continue;
			CHECKF(p > 0, "waitpid: %s", strerror(errno));
			int idx = -1;
			for (int i = 0; i < running; i++)
				if (jobs[i].pid == p)
					idx = i;
			if (idx < 0)
				continue;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != jobs[idx].want) {
				fprintf(stderr, "%s%s: %s: status 0x%x, want exit %d\n", pid1 ? "pid1 " : "",
					kind_name[k], jobs[idx].what, st, jobs[idx].want);
				bad++;
			}
			jobs[idx] = jobs[--running];
		}
		close(logfd);
		CHECKF(bad == 0, "%s: %d wrong exit statuses (log: %s)", kind_name[k], bad,
		       path("%s-codes.log", kind_name[k]));
		printf("  %s%s: 256 exit codes and 128+N for every killing signal, in %.1f s\n", pid1 ? "pid1 " : "",
		       kind_name[k], (double)(it_now_ms() - t0) / 1000);
	}
	return 0;
}

static int case_exit_codes(void)
{
	return exit_codes(false);
}

static int case_pid1_exit_codes(void)
{
	return exit_codes(true);
}

/* ---- each signal once, to the process or its group as documented ---- */

/* the nine, in this order; TERM comes last (it ends the workload) */
static const int nine[] = {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT, SIGALRM};
/* and every other signal the shim passes on (not the references: tini drops TTIN and
 * TTOU, dumb-init stops itself after passing TSTP, TTIN and TTOU on) */
static const int rest[] = {SIGPIPE,   SIGURG,  SIGIO,     SIGPWR,  SIGXCPU, SIGXFSZ,
			   SIGVTALRM, SIGPROF, SIGSTKFLT, SIGTSTP, SIGTTIN, SIGTTOU};

static void append(char *buf, size_t size, const char *line)
{
	size_t len = strlen(buf);
	snprintf(buf + len, size - len, "%s\n", line);
}

static int signals(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const sigw[] = {"--code", "3", NULL};
	for (int k = 0; k < K_N; k++) {
		if (!have((enum kind)k))
			continue;
		struct run r;
		/* the child: for the shim's targets (tini sends to the workload alone) */
		start_run(&r, (enum kind)k, pid1, kind_name[k], shim_debug, sigw, k == K_SHIM);
		static char want[4096], want_child[1024];
		want[0] = want_child[0] = '\0';
		int sigs[64], n = 0;
		for (size_t i = 0; i < ARRAY_LEN(nine); i++)
			sigs[n++] = nine[i];
		if (k == K_SHIM) {
			for (size_t i = 0; i < ARRAY_LEN(rest); i++)
				sigs[n++] = rest[i];
			for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
				sigs[n++] = s;
		}
		sigs[n++] = SIGTERM;
		for (int i = 0; i < n; i++) {
			/* faults are not passed on (PID 1 leaves them to the kernel, which drops
			 * them; not PID 1 they would end the shim, as any program): they must not
			 * show up before the SIGTERM */
			if (sigs[i] == SIGTERM && k == K_SHIM && pid1) {
				CHECK(kill(r.init, SIGTRAP) == 0);
				CHECK(kill(r.init, SIGSYS) == 0);
			}
			CHECKF(kill(r.init, sigs[i]) == 0, "kill %s: %s", signame(sigs[i]), strerror(errno));
			append(want, sizeof(want), signame(sigs[i]));
			char what[64];
			snprintf(what, sizeof(what), "%s: SIG%s", kind_name[k], signame(sigs[i]));
			wait_content(r.log, want, 5000, what);
			/* and the child, before the next one: several pending at once would be
			 * taken in the order of their numbers */
			if (k == K_SHIM &&
			    (sigs[i] == SIGTERM || sigs[i] == SIGINT || sigs[i] == SIGTSTP || sigs[i] == SIGCONT)) {
				append(want_child, sizeof(want_child), signame(sigs[i]));
				wait_content(r.child_log, want_child, 5000, "the workload's child");
			}
		}
		want_exit(r.d, 3, 10000);
		/* once each, nothing twice, nothing extra */
		CHECKF(file_is(r.log, want), "%s: the workload's signals: '%s'", kind_name[k], slurp(r.log));
		/* the shim's targets: the group for TERM, INT, TSTP, CONT; the workload
		 * alone for the rest (its child, in its group, sees no others) */
		if (k == K_SHIM) {
			wait_content(r.child_log, want_child, 5000, "the workload's child");
			char *log = it_daemon_log(r.d);
			CHECK_CONTAINS(log, "SIGQUIT to the workload (pid ");
			CHECK_CONTAINS(log, "SIGINT to the workload's process group ");
			free(log);
		}
		printf("  %s%s: %d signals, each seen once\n", pid1 ? "pid1 " : "", kind_name[k], n);
	}
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

/* ---- the terminal ---- */

struct tty {
	int master;
	pid_t pid;
	char out[65536];
	size_t len;
};

/* argv on a new pseudo-terminal, as its session leader with the terminal as its
 * controlling terminal (fds 0, 1 and 2), as a runtime's `run -it` starts the init. */
static void tty_spawn(struct tty *t, const char *const *argv)
{
	memset(t, 0, sizeof(*t));
	t->master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	CHECKF(t->master >= 0, "posix_openpt: %s", strerror(errno));
	CHECK(grantpt(t->master) == 0 && unlockpt(t->master) == 0);
	char slave[128];
	CHECK(ptsname_r(t->master, slave, sizeof(slave)) == 0);
	pid_t parent = getpid();
	t->pid = fork();
	CHECKF(t->pid >= 0, "fork: %s", strerror(errno));
	if (t->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		setsid();
		int fd = open(slave, O_RDWR); /* the first tty a session leader opens is its own */
		if (fd < 0)
			_exit(126);
		dup2(fd, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
}

static void tty_write(struct tty *t, const char *s)
{
	CHECK(write(t->master, s, strlen(s)) == (ssize_t)strlen(s));
}

/* Read what the terminal shows until it contains want (kept in t->out). */
static bool tty_expect(struct tty *t, const char *want, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	for (;;) {
		if (memmem(t->out, t->len, want, strlen(want)) != NULL)
			return true;
		uint64_t now = it_now_ms();
		if (now >= end)
			return false;
		struct pollfd p = {.fd = t->master, .events = POLLIN};
		if (poll(&p, 1, (int)(end - now)) <= 0)
			continue;
		if (t->len + 1 >= sizeof(t->out))
			t->len = 0; /* only the recent output matters */
		ssize_t n = read(t->master, t->out + t->len, sizeof(t->out) - t->len - 1);
		if (n <= 0)
			return memmem(t->out, t->len, want, strlen(want)) != NULL; /* EIO: nobody has it open */
		t->len += (size_t)n;
		t->out[t->len] = '\0';
	}
}

static int tty_wait(struct tty *t, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	for (;;) {
		int st;
		pid_t p = waitpid(t->pid, &st, WNOHANG);
		if (p == t->pid) {
			close(t->master);
			t->pid = 0;
			return st;
		}
		if (it_now_ms() >= end)
			return -1;
		/* drain the output so that nobody blocks on a full terminal */
		char buf[4096];
		struct pollfd pf = {.fd = t->master, .events = POLLIN};
		if (poll(&pf, 1, 5) > 0 && read(t->master, buf, sizeof(buf)) < 0)
			it_sleep_ms(2);
	}
}

static void tty_kill(struct tty *t)
{
	if (t->pid > 0) {
		kill(t->pid, SIGKILL);
		waitpid(t->pid, NULL, 0);
		close(t->master);
		t->pid = 0;
	}
}

/* The terminal's foreground process group, seen from the master side. */
static pid_t tty_fg(const struct tty *t)
{
	return tcgetpgrp(t->master);
}

static void tty_fail(struct tty *t, const char *what)
{
	char msg[512];
	size_t from = t->len > 400 ? t->len - 400 : 0;
	snprintf(msg, sizeof(msg), "%s; the terminal shows: '%s'", what, t->out + from);
	tty_kill(t);
	it_fail(__FILE__, __LINE__, "%s", msg);
}

/* 20 times in a row: the workload reads the terminal at once; were it not the
 * foreground group, SIGTTIN would stop it there. */
static int tty_handoff(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	for (int k = 0; k < K_N; k++) {
		/* dumb-init's child cannot take the terminal from unshare's session: not a
		 * fair reference under unshare */
		if (!have((enum kind)k) || (k == K_DUMB && pid1))
			continue;
		uint64_t t0 = it_now_ms();
		for (int i = 0; i < 20; i++) {
			static const char *const w[] = {"sh", "-c", "read line; echo \"got:$line\"; exit 7", NULL};
			const char *opts[] = {"--log-file", path("%s-tty.log", kind_name[k]), NULL};
			char tag[32];
			snprintf(tag, sizeof(tag), "%s-tty", kind_name[k]);
			struct cmdline c;
			init_cmd(&c, (enum kind)k, pid1, tag, opts, w);
			struct tty t;
			tty_spawn(&t, c.argv);
			char line[32], want[40], what[96];
			snprintf(line, sizeof(line), "hello-%d\n", i);
			snprintf(want, sizeof(want), "got:hello-%d", i);
			tty_write(&t, line);
			snprintf(what, sizeof(what), "%s, run %d: the workload did not read the terminal", kind_name[k],
				 i);
			if (!tty_expect(&t, want, 5000))
				tty_fail(&t, what);
			int st = tty_wait(&t, 5000);
			if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 7)) {
				snprintf(what, sizeof(what), "%s, run %d: status 0x%x, want exit 7", kind_name[k], i,
					 st);
				tty_fail(&t, what);
			}
		}
		printf("  %s%s: 20 of 20 read their terminal (%.2f s)\n", pid1 ? "pid1 " : "", kind_name[k],
		       (double)(it_now_ms() - t0) / 1000);
	}
	return 0;
}

static int case_tty(void)
{
	return tty_handoff(false);
}

static int case_pid1_tty(void)
{
	return tty_handoff(true);
}

/* The host pid of the init's first child (the workload). */
static pid_t first_child(pid_t init)
{
	uint64_t end = it_now_ms() + 5000;
	for (;;) {
		pid_t kids[8];
		if (children_of(init, kids, 8) > 0)
			return kids[0];
		CHECKF(it_now_ms() < end, "the init (pid %d) has no child", (int)init);
		it_sleep_ms(2);
	}
}

/* The init itself on the terminal: the session leader, or unshare's child. */
static pid_t tty_init(const struct tty *t, bool pid1)
{
	if (!pid1)
		return t->pid;
	return first_child(t->pid);
}

/* ^Z stops the workload (the terminal's foreground); SIGCONT to the init resumes it.
 * Then job control inside: an interactive bash, ^Z and fg and ^C on its job. */
static int tty_jobs(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	for (int k = 0; k < K_N; k++) {
		/* dumb-init 1.2.5 fails this: ^Z does not stop its child */
		if (!have((enum kind)k) || k == K_DUMB)
			continue;
		char tag[32], what[128];
		snprintf(tag, sizeof(tag), "%s-jobs", kind_name[k]);
		const char *opts[] = {"--log-file", path("%s-jobs.log", kind_name[k]), NULL};
		static const char *const w[] = {"sh", "-c", "echo up; read line; echo \"got:$line\"; exit 5", NULL};
		struct cmdline c;
		init_cmd(&c, (enum kind)k, pid1, tag, opts, w);
		struct tty t;
		tty_spawn(&t, c.argv);
		if (!tty_expect(&t, "up\r\n", 5000))
			tty_fail(&t, "the workload did not start");
		pid_t init = tty_init(&t, pid1);
		pid_t wl = first_child(init);
		tty_write(&t, "\x1a"); /* ^Z */
		snprintf(what, sizeof(what), "%s: ^Z", kind_name[k]);
		wait_state(wl, true, 5000, what);
		CHECK(kill(init, SIGCONT) == 0);
		snprintf(what, sizeof(what), "%s: SIGCONT to the init", kind_name[k]);
		wait_state(wl, false, 5000, what);
		tty_write(&t, "again\n");
		if (!tty_expect(&t, "got:again", 5000))
			tty_fail(&t, "the resumed workload did not read the terminal");
		int st = tty_wait(&t, 5000);
		if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 5))
			tty_fail(&t, "the workload's status was lost");

		/* bash, interactive: its job goes to the background on ^Z, back on fg */
		static const char *const b[] = {"bash", "--norc", "--noprofile", "-i", NULL};
		init_cmd(&c, (enum kind)k, pid1, tag, opts, b);
		tty_spawn(&t, c.argv);
		tty_write(&t, "PS1='ps''1> '\n"); /* its echo is not the prompt */
		if (!tty_expect(&t, "ps1> ", 5000))
			tty_fail(&t, "no prompt from bash");
		init = tty_init(&t, pid1);
		pid_t bash = first_child(init);
		if (tty_fg(&t) != bash)
			tty_fail(&t, "bash is not the terminal's foreground");
		tty_write(&t, "sleep 30\n");
		uint64_t end = it_now_ms() + 5000;
		while (tty_fg(&t) == bash && it_now_ms() < end)
			it_sleep_ms(2);
		if (tty_fg(&t) == bash)
			tty_fail(&t, "bash did not put its job in the foreground");
		/* and until the job runs sleep: before its exec the child of an interactive
		 * bash still ignores SIGTSTP as bash does */
		pid_t job = tty_fg(&t);
		char comm[64];
		snprintf(comm, sizeof(comm), "/proc/%d/comm", (int)job);
		end = it_now_ms() + 5000;
		while (!file_is(comm, "sleep\n") && it_now_ms() < end)
			it_sleep_ms(2);
		if (!file_is(comm, "sleep\n"))
			tty_fail(&t, "bash's job does not run sleep");
		tty_write(&t, "\x1a");
		if (!tty_expect(&t, "Stopped", 5000))
			tty_fail(&t, "^Z did not stop bash's job");
		wait_state(job, true, 5000, "the stopped job");
		tty_write(&t, "fg\n");
		wait_state(job, false, 5000, "the job after fg");
		end = it_now_ms() + 5000;
		while (tty_fg(&t) != job && it_now_ms() < end)
			it_sleep_ms(2);
		if (tty_fg(&t) != job)
			tty_fail(&t, "fg did not give the terminal to the job");
		tty_write(&t, "\x03"); /* ^C: the job, not the init, not bash */
		if (!gone(job, 5000))
			tty_fail(&t, "^C did not end the job");
		tty_write(&t, "echo jc-$((6*7))\n");
		if (!tty_expect(&t, "jc-42", 5000))
			tty_fail(&t, "bash does not answer after its job");
		tty_write(&t, "exit 4\n");
		st = tty_wait(&t, 5000);
		if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 4))
			tty_fail(&t, "bash's exit status was lost");
		printf("  %s%s: ^Z then SIGCONT; bash's ^Z, fg and ^C\n", pid1 ? "pid1 " : "", kind_name[k]);
	}
	return 0;
}

static int case_tty_jobs(void)
{
	return tty_jobs(false);
}

static int case_pid1_tty_jobs(void)
{
	return tty_jobs(true);
}

/* ---- shutdown on the workload's terms ---- */

/* A workload that takes 7 s to drain after SIGTERM exits 0, with the default kill
 * grace (5 s): the deadline is the runtime's, not the init's. The references run
 * at the same time. */
static int drain(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const sigw[] = {"--drain", "7000", NULL};
	struct run r[K_N];
	bool on[K_N] = {false};
	for (int k = 0; k < K_N; k++) {
		if (!have((enum kind)k))
			continue;
		start_run(&r[k], (enum kind)k, pid1, kind_name[k], shim_debug, sigw, false);
		on[k] = true;
	}
	uint64_t t0 = it_now_ms();
	for (int k = 0; k < K_N; k++)
		if (on[k])
			CHECK(kill(r[k].init, SIGTERM) == 0);
	for (int k = 0; k < K_N; k++) {
		if (!on[k])
			continue;
		want_exit(r[k].d, 0, 20000);
		uint64_t took = it_now_ms() - t0;
		CHECKF(took >= 6900, "%s exited after %llu ms: the drain was cut short", kind_name[k],
		       (unsigned long long)took);
		CHECKF(file_is(r[k].log, "TERM\n"), "%s: the workload's signals: '%s'", kind_name[k], slurp(r[k].log));
		printf("  %s%s: drained for 7 s, exit 0 after %.1f s\n", pid1 ? "pid1 " : "", kind_name[k],
		       (double)took / 1000);
	}
	char *log = it_daemon_log(r[K_SHIM].d);
	CHECK_CONTAINS(log, "waiting for it to exit, as long as it takes");
	CHECKF(strstr(log, "grace period") == NULL, "the shim sent a SIGKILL: %s", log);
	free(log);
	return 0;
}

static int case_drain(void)
{
	return drain(false);
}

static int case_pid1_drain(void)
{
	return drain(true);
}

/* A detached command of the shim's that notes each SIGTERM and ignores it; its pid
 * seen from here. */
static pid_t spawn_stubborn(struct sbx_client *c, const char *file, pid_t shim, bool pid1)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "trap 'echo term >> %s' TERM; echo ready >> %s; while :; do sleep 0.05; done", file,
		 file);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	eo.name = "stubborn";
	struct sbx_process_info info = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, &no_timeout, &eo, &info, &err), &err);
	wait_content(file, "ready\n", 5000, "the stubborn command");
	return pid1 ? child_with_nspid(shim, (int)info.pid) : (pid_t)info.pid;
}

/* A workload deaf to every signal: each one reaches it (and none kills the shim, not
 * even when it is not PID 1); after SIGTERM the shim's own command gets its kill grace
 * and SIGKILL, the workload does not, and the runtime's SIGKILL ends it. */
static int deaf(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const sigw[] = {"--deaf", NULL};
	const char *t = it_unix_target(path("%s.sock", "shim"));
	const char *opts[] = {"--listen", t, "--kill-grace", "1", "--log-level", "debug", NULL};
	struct run r[K_N];
	bool on[K_N] = {false};
	for (int k = 0; k < K_N; k++) {
		if (!have((enum kind)k))
			continue;
		start_run(&r[k], (enum kind)k, pid1, kind_name[k], opts, sigw, k == K_SHIM);
		on[k] = true;
	}
	struct sbx_client *c = it_connect(t, NULL);
	const char *f = path("%s.stubborn", "shim");
	pid_t cmd = spawn_stubborn(c, f, r[K_SHIM].init, pid1);
	/* every signal the shim passes on, to the shim only (dumb-init stops itself on
	 * TSTP, TTIN, TTOU; tini drops those two) */
	static char want[4096];
	want[0] = '\0';
	for (int s = 1; s < NSIG; s++) {
		if (s == SIGKILL || s == SIGSTOP || s == SIGCHLD || s == SIGTERM || s == SIGSEGV || s == SIGBUS ||
		    s == SIGFPE || s == SIGILL || s == SIGTRAP || s == SIGSYS || s == SIGABRT ||
		    (s >= 32 && s < SIGRTMIN))
			continue;
		CHECK(kill(r[K_SHIM].init, s) == 0);
		append(want, sizeof(want), signame(s));
		wait_content(r[K_SHIM].log, want, 5000, "the deaf workload");
	}
	for (int k = 0; k < K_N; k++)
		if (on[k])
			CHECK(kill(r[k].init, SIGTERM) == 0);
	append(want, sizeof(want), "TERM");
	wait_content(r[K_SHIM].log, want, 5000, "the deaf workload's SIGTERM");
	it_daemon_wait_log(r[K_SHIM].d, "the grace period of the commands is over", 5000);
	CHECKF(gone(cmd, 5000), "the stubborn command (pid %d) outlived its kill grace", (int)cmd);
	CHECKF(file_is(f, "ready\nterm\n"), "the command's SIGTERMs: '%s'", slurp(f));
	sbx_client_close(c);
	/* the grace is over; every init still waits for its workload */
	for (int k = 0; k < K_N; k++) {
		if (!on[k])
			continue;
		CHECKF(proc_state(r[k].workload) != 0 && proc_state(r[k].workload) != 'Z',
		       "%s: the workload was ended, not by the runtime", kind_name[k]);
		CHECKF(!it_daemon_wait_exit(r[k].d, 0), "%s exited before its workload", kind_name[k]);
		if (k != K_SHIM)
			wait_content(r[k].log, "TERM\n", 5000, kind_name[k]);
	}
	CHECKF(reaps_all(r[K_SHIM].init, 5000), "zombie children of the shim");
	/* the runtime's SIGKILL: to the whole namespace through PID 1; without one, to
	 * the container's processes (the workload and its child) */
	for (int k = 0; k < K_N; k++) {
		if (!on[k])
			continue;
		if (pid1) {
			CHECK(kill(r[k].init, SIGKILL) == 0);
			CHECK(it_daemon_wait_exit(r[k].d, 5000));
			CHECKF(gone(r[k].workload, 5000), "%s: the workload outlived its namespace", kind_name[k]);
		} else {
			pid_t child = k == K_SHIM ? workload_pid(r[k].init, r[k].ready, false, 1) : 0;
			if (child > 0)
				CHECK(kill(child, SIGKILL) == 0);
			CHECK(kill(r[k].workload, SIGKILL) == 0);
			want_exit(r[k].d, 137, 5000);
			CHECKF(child == 0 || gone(child, 5000), "%s: the workload's child was left", kind_name[k]);
		}
		printf("  %s%s: deaf workload waited for, ended by the runtime's SIGKILL\n", pid1 ? "pid1 " : "",
		       kind_name[k]);
	}
	return 0;
}

static int case_deaf(void)
{
	return deaf(false);
}

static int case_pid1_deaf(void)
{
	return deaf(true);
}

/* The workload exits while the shim is in the middle of its shutdown: what is left
 * (a child of the workload, the shim's command) gets no second SIGTERM, the KILL
 * after the grace, and the shim exits with the workload's status. Then 20 times a
 * workload that exits just as the SIGTERM comes. */
static int exit_mid_shutdown(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	const char *go = path("%s.go", "shim");
	const char *sigw[] = {"--wait", go, "--code", "5", "--deaf", NULL};
	const char *t = it_unix_target(path("%s.sock", "shim"));
	const char *opts[] = {"--listen", t, "--kill-grace", "1", "--log-level", "debug", NULL};
	struct run r;
	start_run(&r, K_SHIM, pid1, "shim", opts, sigw, true);
	pid_t child = workload_pid(r.init, r.ready, pid1, 1);
	struct sbx_client *c = it_connect(t, NULL);
	const char *f = path("%s.stubborn", "shim");
	pid_t cmd = spawn_stubborn(c, f, r.init, pid1);
	CHECK(kill(r.init, SIGTERM) == 0);
	wait_content(r.log, "TERM\n", 5000, "the workload");
	wait_content(r.child_log, "TERM\n", 5000, "the workload's child");
	wait_content(f, "ready\nterm\n", 5000, "the command");
	CHECKF(reaps_all(r.init, 5000), "zombie children of the shim in its shutdown");
	it_write_file(go, "");
	want_exit(r.d, 5, 10000);
	CHECKF(file_is(r.child_log, "TERM\n"), "the workload's child: '%s'", slurp(r.child_log));
	CHECKF(file_is(f, "ready\nterm\n"), "the command: '%s'", slurp(f));
	CHECK(gone(child, 2000));
	CHECK(gone(cmd, 2000));
	sbx_client_close(c);
	char *log = it_daemon_log(r.d);
	CHECK_CONTAINS(log, "exited with 5");
	CHECK_CONTAINS(log, "the grace period is over; SIGKILL to what is left");
	free(log);

	/* the workload's exit and the SIGTERM at the same moment, either order */
	for (int i = 0; i < 20; i++) {
		char tag[32];
		snprintf(tag, sizeof(tag), "race%d", i);
		const char *g = path("%s.go", tag);
		const char *w[] = {"--wait", g, "--code", "6", NULL};
		start_run(&r, K_SHIM, pid1, tag, shim_debug, w, false);
		it_write_file(g, "");
		kill(r.init, SIGTERM);
		want_exit(r.d, 6, 10000);
	}
	printf("  %s: exit during the shutdown, and 20 exits racing the SIGTERM: status kept\n",
	       pid1 ? "pid1" : "not PID 1");
	return 0;
}

static int case_exit_mid_shutdown(void)
{
	return exit_mid_shutdown(false);
}

static int case_pid1_exit_mid_shutdown(void)
{
	return exit_mid_shutdown(true);
}

/* A workload that stopped itself (SIGSTOP) before the shutdown: SIGTERM, and the
 * SIGCONT that lets it act on it; its status is the shim's. */
/* ---- limits: the workload gets the open-file and core limits the shim was given,
 * not the ones the shim raised (nofile) or lowered (core) for itself ---- */

static int limits(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	it_keep_core_limit();
	const char *out = path("limits-%d.out", pid1);
	char script[400];
	CHECK(snprintf(script, sizeof(script), "{ ulimit -n; ulimit -c; } > %s.tmp && mv %s.tmp %s", out, out, out) <
	      (int)sizeof(script));
	const char *const wl[] = {"sh", "-c", keep(script), NULL};
	struct cmdline c;
	init_cmd(&c, K_SHIM, pid1, pid1 ? "limits1" : "limits", shim_debug, wl);
	struct cmdline p = {.n = 0};
	static const char *const pl[] = {"prlimit", "--nofile=512:4096", "--core=unlimited", "--", NULL};
	push_all(&p, pl);
	push_all(&p, c.argv);
	struct it_daemon *d = it_daemon_spawn_argv(pid1 ? "limits1" : "limits", p.argv);
	want_exit(d, 0, 20000);
	CHECKF(file_is(out, "512\nunlimited\n"), "the workload's limits (nofile, core): '%s'", slurp(out));
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "RLIMIT_NOFILE raised from 512 to 4096");
	free(log);
	printf("  %s: the shim ran with 4096 fds and no core dumps; the workload got nofile 512, core unlimited\n",
	       pid1 ? "pid1" : "not PID 1");
	return 0;
}

static int case_limits(void)
{
	return limits(false);
}

static int case_pid1_limits(void)
{
	return limits(true);
}

static int stopped(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const sigw[] = {"--stop", "--code", "6", NULL};
	struct run r;
	start_run(&r, K_SHIM, pid1, "shim", shim_debug, sigw, false);
	wait_state(r.workload, true, 5000, "the workload's SIGSTOP");
	CHECK(kill(r.init, SIGTERM) == 0);
	want_exit(r.d, 6, 10000);
	CHECKF(count_lines(r.log, "TERM") == 1, "the workload's signals: '%s'", slurp(r.log));
	char *log = it_daemon_log(r.d);
	CHECK_CONTAINS(log, "the workload is stopped; SIGCONT to its group");
	free(log);
	printf("  %s: a stopped workload got SIGTERM and SIGCONT, exit 6\n", pid1 ? "pid1" : "not PID 1");
	return 0;
}

static int case_stopped(void)
{
	return stopped(false);
}

static int case_pid1_stopped(void)
{
	return stopped(true);
}

/* 10,000 SIGUSR1 and 1,000 real-time signals within a second: none kills the init or
 * hangs it, every real-time one arrives exactly once (the kernel queues them; the
 * standard one coalesces), no zombie, the exit status kept. */
static int storm(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const sigw[] = {"--code", "9", NULL};
	struct run r[K_N];
	bool on[K_N] = {false};
	for (int k = 0; k < K_N; k++) {
		if (!have((enum kind)k))
			continue;
		start_run(&r[k], (enum kind)k, pid1, kind_name[k], shim_debug, sigw, false);
		on[k] = true;
	}
	int rt = SIGRTMIN + 1;
	uint64_t t0 = it_now_ms();
	for (int round = 0; round < 10; round++) {
		for (int k = 0; k < K_N; k++) {
			if (!on[k])
				continue;
			for (int i = 0; i < 1000; i++)
				CHECK(kill(r[k].init, SIGUSR1) == 0);
			for (int i = 0; i < 100; i++)
				CHECKF(kill(r[k].init, rt) == 0, "kill: %s", strerror(errno));
		}
		/* paced over the second */
		uint64_t next = t0 + (uint64_t)(round + 1) * 100;
		if (it_now_ms() < next)
			it_sleep_ms((unsigned)(next - it_now_ms()));
	}
	char rtname[16];
	snprintf(rtname, sizeof(rtname), "RTMIN+1");
	for (int k = 0; k < K_N; k++) {
		if (!on[k])
			continue;
		wait_line(r[k].log, rtname, 1000, 10000, kind_name[k]);
		CHECKF(reaps_all(r[k].init, 5000), "%s: zombies", kind_name[k]);
		CHECK(kill(r[k].init, SIGTERM) == 0);
	}
	for (int k = 0; k < K_N; k++) {
		if (!on[k])
			continue;
		want_exit(r[k].d, 9, 10000);
		int usr1 = count_lines(r[k].log, "USR1"), n_rt = count_lines(r[k].log, rtname);
		CHECKF(usr1 >= 1 && usr1 <= 10000, "%s: %d SIGUSR1", kind_name[k], usr1);
		CHECKF(n_rt == 1000, "%s: %d SIGRTMIN+1, want 1000", kind_name[k], n_rt);
		CHECKF(count_lines(r[k].log, "TERM") == 1, "%s: SIGTERM not once", kind_name[k]);
		printf("  %s%s: 10,000 SIGUSR1 -> %d seen (coalesced), 1,000 SIGRTMIN+1 -> 1,000, exit 9\n",
		       pid1 ? "pid1 " : "", kind_name[k], usr1);
	}
	return 0;
}

static int case_storm(void)
{
	return storm(false);
}

static int case_pid1_storm(void)
{
	return storm(true);
}

/* 1,000 orphans of the workload: every one reaped, none left a zombie; then the
 * workload's own status. Then again with the workload exiting amid them. */
static int orphans(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	for (int k = 0; k < K_N; k++) {
		/* not PID 1, dumb-init is no subreaper: the orphans are not its own */
		if (!have((enum kind)k) || (k == K_DUMB && !pid1))
			continue;
		uint64_t t0 = it_now_ms();
		const char *go = path("%s.go", kind_name[k]);
		const char *sigw[] = {"--orphans", "1000", "--wait", go, "--code", "42", NULL};
		struct run r;
		start_run(&r, (enum kind)k, pid1, kind_name[k], shim_debug, sigw, false);
		wait_line(r.log, "spawned", 1, 30000, kind_name[k]);
		/* all reaped: the init has no child but the workload */
		uint64_t end = it_now_ms() + 10000;
		for (;;) {
			pid_t kids[4096];
			int n = children_of(r.init, kids, 4096);
			if (n == 1 && kids[0] == r.workload)
				break;
			CHECKF(it_now_ms() < end, "%s: %d children left (%d zombies)", kind_name[k], n,
			       zombies_of(r.init));
			it_sleep_ms(5);
		}
		it_write_file(go, "");
		want_exit(r.d, 42, 10000);

		/* the workload exits while its orphans are still exiting */
		char tag[32];
		snprintf(tag, sizeof(tag), "%s-amid", kind_name[k]);
		const char *go2 = path("%s.go", tag);
		it_write_file(go2, "");
		const char *sigw2[] = {"--orphans", "1000", "--wait", go2, "--code", "43", NULL};
		struct cmdline w = {.n = 0};
		push(&w, IT_SIGW_BIN);
		push_all(&w, sigw2);
		struct cmdline c;
		init_cmd(&c, (enum kind)k, pid1, tag, shim_debug, w.argv);
		struct it_daemon *d = it_daemon_spawn_argv(tag, c.argv);
		want_exit(d, 43, 30000);
		printf("  %s%s: 1,000 orphans reaped, exit 42; exit 43 amid 1,000 more (%.1f s)\n", pid1 ? "pid1 " : "",
		       kind_name[k], (double)(it_now_ms() - t0) / 1000);
	}
	return 0;
}

static int case_orphans(void)
{
	return orphans(false);
}

static int case_pid1_orphans(void)
{
	return orphans(true);
}

/* ---- the shim's own lines ---- */

/* As PID 1 with a workload the container's stderr is the workload's: the shim says
 * nothing there below a warning, unless --log-level asks; --log-file takes its lines
 * elsewhere. Not PID 1, the info lines stay. */
static int quiet(bool pid1)
{
	if (pid1 && !can_unshare())
		return IT_SKIP;
	static const char *const w[] = {"sh", "-c", "echo from-the-workload >&2", NULL};
	const char *t = it_unix_target(path("%s.sock", "quiet"));
	const char *plain[] = {"--listen", t, NULL};
	const char *info[] = {"--listen", t, "--log-level", "info", NULL};
	const char *lf = path("%s.log", "shim-file");
	const char *file[] = {"--listen", t, "--log-file", lf, NULL};
	const char *const *variants[] = {plain, info, file};
	for (int v = 0; v < 3; v++) {
		char tag[32];
		snprintf(tag, sizeof(tag), "quiet%d", v);
		struct cmdline c;
		init_cmd(&c, K_SHIM, pid1, tag, variants[v], w);
		struct it_daemon *d = it_daemon_spawn_argv(tag, c.argv);
		want_exit(d, 0, 10000);
		char *log = it_daemon_log(d);
		if (v == 0 && pid1)
			CHECKF(strcmp(log, "from-the-workload\n") == 0, "PID 1's stderr: '%s'", log);
		else if (v == 2)
			CHECKF(strcmp(log, "from-the-workload\n") == 0, "stderr with --log-file: '%s'", log);
		else
			CHECK_CONTAINS(log, pid1 ? " ready (pid 1, PID 1)" : " ready (pid ");
		CHECK_CONTAINS(log, "from-the-workload\n");
		free(log);
	}
	char *fl = slurp(lf);
	CHECK_CONTAINS(fl, "info: workload started: sh");
	CHECK_CONTAINS(fl, pid1 ? " ready (pid 1, PID 1)" : " ready (pid ");
	CHECK_CONTAINS(fl, "info: exit");
	free(fl);
	struct stat st;
	CHECK(stat(lf, &st) == 0 && (st.st_mode & 0777) == 0600);
	printf("  %s: stderr %s by default; --log-level info; --log-file\n", pid1 ? "pid1" : "not PID 1",
	       pid1 ? "quiet" : "with info lines");
	return 0;
}

static int case_quiet(void)
{
	return quiet(false);
}

static int case_pid1_quiet(void)
{
	return quiet(true);
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"exit_codes", case_exit_codes},
		{"pid1_exit_codes", case_pid1_exit_codes},
		{"signals", case_signals},
		{"pid1_signals", case_pid1_signals},
		{"tty", case_tty},
		{"pid1_tty", case_pid1_tty},
		{"tty_jobs", case_tty_jobs},
		{"pid1_tty_jobs", case_pid1_tty_jobs},
		{"limits", case_limits},
		{"pid1_limits", case_pid1_limits},
		{"drain", case_drain},
		{"pid1_drain", case_pid1_drain},
		{"deaf", case_deaf},
		{"pid1_deaf", case_pid1_deaf},
		{"exit_mid_shutdown", case_exit_mid_shutdown},
		{"pid1_exit_mid_shutdown", case_pid1_exit_mid_shutdown},
		{"stopped", case_stopped},
		{"pid1_stopped", case_pid1_stopped},
		{"storm", case_storm},
		{"pid1_storm", case_pid1_storm},
		{"orphans", case_orphans},
		{"pid1_orphans", case_pid1_orphans},
		{"quiet", case_quiet},
		{"pid1_quiet", case_pid1_quiet},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
