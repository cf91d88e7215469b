/* harness.c: checks, the per-case temp dir, the watchdog, and daemons started and stopped by PID. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHIM_BIN
#error "SHIM_BIN must name the sandbox-shim binary"
#endif

#define MAX_DAEMONS 32
#define WATCHDOG_SECONDS 100

static char tmpdir[128];
static struct it_daemon daemons[MAX_DAEMONS];
static unsigned n_daemons;
static const char *case_name = "?";
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

/* The entries of journal whose first line is empty (spares: true) or not. */
static int journal_count(const char *journal, bool spares)
{
	int dfd = open(journal, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -1;
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		return -1;
	}
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		char c = 0;
		/* (an entry gone meanwhile counts as neither; one being made, still empty,
		 * as pending: its write is under way) */
		if (fd < 0)
			continue;
		bool spare = read(fd, &c, 1) == 1 && c == '\n';
		close(fd);
		n += spare == spares;
	}
	closedir(d);
	return n;
}

int it_journal_pending(const char *journal)
{
	return journal_count(journal, false);
}

int it_journal_spares(const char *journal)
{
	return journal_count(journal, true);
}

uint64_t it_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void it_keep_core_limit(void)
{
	const char *old = getenv("ASAN_OPTIONS");
	char buf[1024];
	snprintf(buf, sizeof(buf), "%s%sdisable_coredump=0", old ? old : "", old && *old ? ":" : "");
	setenv("ASAN_OPTIONS", buf, 1);
}

void it_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

const char *it_errstr(const struct sbx_error *err)
{
	static __thread char buf[1600];
	char line[1500];
	snprintf(buf, sizeof(buf), "kind %d %s", err->kind, sbx_error_format(err, line, sizeof(line)));
	return buf;
}

/* ---- cleanup ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Kill what is still running (only our own PIDs) and remove the temp dir. */
static void cleanup(void)
{
	for (unsigned i = 0; i < n_daemons; i++) {
		struct it_daemon *d = &daemons[i];
		if (d->pid > 0 && !d->exited) {
			kill(d->pid, SIGKILL);
			while (waitpid(d->pid, &d->status, 0) < 0 && errno == EINTR)
				;
			d->exited = true;
		}
	}
	n_daemons = 0;
	if (tmpdir[0] != '\0') {
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		tmpdir[0] = '\0';
	}
}

static void print_log_tail(const struct it_daemon *d)
{
	char *log = it_daemon_log(d);
	if (log == NULL)
		return;
	size_t len = strlen(log);
	const char *p = log + len;
	for (int lines = 0; p > log && lines < 25; p--)
		if (p[-1] == '\n' && p != log + len)
			lines++;
	fprintf(stderr, "---- %s (pid %d) log, last lines ----\n%s", d->name, (int)d->pid, p);
	if (len > 0 && log[len - 1] != '\n')
		fputc('\n', stderr);
	free(log);
}

void it_fail(const char *file, int line, const char *fmt, ...)
{
	pthread_mutex_lock(&fail_mu);
	va_list ap;
	fprintf(stderr, "%s:%d: [%s] ", file, line, case_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	for (unsigned i = 0; i < n_daemons; i++)
		print_log_tail(&daemons[i]);
	fprintf(stderr, "FAIL: %s\n", case_name);
	fflush(stderr);
	cleanup();
	_exit(1);
}

/* The watchdog: a hung case must not leave daemons behind. Only async-signal-safe calls. */
static void watchdog(int sig)
{
	(void)sig;
	static const char msg[] = "watchdog: the case took too long; killing its daemons\n";
	ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
	(void)w;
	for (unsigned i = 0; i < n_daemons; i++)
		if (daemons[i].pid > 0 && !daemons[i].exited)
			kill(daemons[i].pid, SIGKILL);
	_exit(1);
}

/* ---- paths ---- */

const char *it_dir(void)
{
	return tmpdir;
}

const char *it_path(const char *name)
{
	static char bufs[8][256];
	static unsigned next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
	return b;
}

const char *it_unix_target(const char *path)
{
	static char bufs[8][256];
	static unsigned next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof(bufs[0]), "unix:%s", path);
	return b;
}

const char *it_tcp_target(unsigned port)
{
	static char bufs[8][64];
	static unsigned next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof(bufs[0]), "tcp:127.0.0.1:%u", port);
	return b;
}

void it_write_file(const char *path, const char *content)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	size_t len = strlen(content);
	CHECK(write(fd, content, len) == (ssize_t)len);
	close(fd);
}

unsigned it_count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL && errno == ENOENT)
		return 0;
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

unsigned it_count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	return it_count_entries(path);
}

uint8_t *it_slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	CHECKF(fstat(fd, &st) == 0, "%s: %s", path, strerror(errno));
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	CHECK(buf != NULL);
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		CHECKF(n > 0, "%s: %s", path, n < 0 ? strerror(errno) : "shorter than its size");
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return buf;
}

ssize_t it_read_text(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size - 1);
	int e = errno;
	close(fd);
	if (n < 0) {
		errno = e;
		return -1;
	}
	buf[n] = '\0';
	return n;
}

/* Every thread of pid stopped ('T' or 't' in /proc/PID/task/TID/stat); false while one
 * still runs (kill(SIGSTOP) returns before the other threads have taken the stop). */
static bool all_threads_stopped(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	CHECKF(d != NULL, "%s: %s", path, strerror(errno));
	bool stopped = true;
	struct dirent *e;
	while (stopped && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char sp[400], buf[512];
		snprintf(sp, sizeof(sp), "%s/%s/stat", path, e->d_name);
		if (it_read_text(sp, buf, sizeof(buf)) <= 0)
			continue;                   /* a thread that just exited */
		const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parens */
		stopped = rp != NULL && (rp[2] == 'T' || rp[2] == 't');
	}
	closedir(d);
	return stopped;
}

void it_stop_process(pid_t pid)
{
	CHECKF(kill(pid, SIGSTOP) == 0, "kill(%d, SIGSTOP): %s", (int)pid, strerror(errno));
	uint64_t until = it_now_ms() + 10000;
	while (!all_threads_stopped(pid)) {
		CHECKF(it_now_ms() < until, "process %d: not all its threads stopped", (int)pid);
		it_sleep_ms(1);
	}
}

void it_fill(void *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	uint8_t *p = buf;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		uint64_t v = x * 0x2545f4914f6cdd1dull;
		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

/* ---- daemons ---- */

static struct it_daemon *spawn(const char *name, va_list ap)
{
	CHECKF(n_daemons < MAX_DAEMONS, "too many daemons");
	struct it_daemon *d = &daemons[n_daemons];
	memset(d, 0, sizeof(*d));
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->log, sizeof(d->log), "%s/%s.log", tmpdir, name);

	const char *argv[40];
	int argc = 0;
	argv[argc++] = SHIM_BIN;
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL) {
		CHECKF(argc < 39, "too many daemon arguments");
		argv[argc++] = a;
	}
	argv[argc] = NULL;

	int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(logfd >= 0, "open %s: %s", d->log, strerror(errno));
	int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(nullfd >= 0);
	pid_t parent = getpid();
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* if the test dies (even by SIGKILL), so does its daemon */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(nullfd, STDIN_FILENO);
		dup2(logfd, STDERR_FILENO);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	close(nullfd);
	d->pid = pid;
	n_daemons++;
	return d;
}

struct it_daemon *it_daemon_spawn(const char *name, ...)
{
	va_list ap;
	va_start(ap, name);
	struct it_daemon *d = spawn(name, ap);
	va_end(ap);
	return d;
}

struct it_daemon *it_daemon_start(const char *name, ...)
{
	va_list ap;
	va_start(ap, name);
	struct it_daemon *d = spawn(name, ap);
	va_end(ap);
	it_daemon_wait_log(d, " ready (pid ", 20000);
	return d;
}

char *it_daemon_log(const struct it_daemon *d)
{
	int fd = open(d->log, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (len + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
		}
		CHECK(buf != NULL);
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return buf;
}

bool it_daemon_wait_exit(struct it_daemon *d, unsigned timeout_ms)
{
	uint64_t deadline = it_now_ms() + timeout_ms;
	while (!d->exited) {
		pid_t r = waitpid(d->pid, &d->status, WNOHANG);
		if (r == d->pid) {
			d->exited = true;
			break;
		}
		CHECKF(r == 0, "waitpid %d: %s", (int)d->pid, strerror(errno));
		if (it_now_ms() >= deadline)
			return false;
		it_sleep_ms(5);
	}
	return true;
}

void it_daemon_wait_log(struct it_daemon *d, const char *what, unsigned timeout_ms)
{
	uint64_t deadline = it_now_ms() + timeout_ms;
	for (;;) {
		char *log = it_daemon_log(d);
		bool found = log != NULL && strstr(log, what) != NULL;
		free(log);
		if (found)
			return;
		if (it_daemon_wait_exit(d, 0))
			it_fail(__FILE__, __LINE__, "%s exited (status 0x%x) before logging '%s'", d->name, d->status,
				what);
		if (it_now_ms() >= deadline)
			it_fail(__FILE__, __LINE__, "%s did not log '%s' within %u ms", d->name, what, timeout_ms);
		it_sleep_ms(5);
	}
}

unsigned it_daemon_tcp_port(struct it_daemon *d)
{
	static const char key[] = "listening on tcp:127.0.0.1:";
	it_daemon_wait_log(d, key, 10000);
	char *log = it_daemon_log(d);
	CHECK(log != NULL);
	unsigned port = (unsigned)strtoul(strstr(log, key) + strlen(key), NULL, 10);
	free(log);
	CHECKF(port > 0 && port < 65536, "bad port in %s's log", d->name);
	return port;
}

int it_daemon_stop(struct it_daemon *d)
{
	if (!d->exited) {
		kill(d->pid, SIGTERM);
		if (!it_daemon_wait_exit(d, 5000)) {
			kill(d->pid, SIGKILL);
			it_daemon_wait_exit(d, 5000);
			it_fail(__FILE__, __LINE__, "%s did not exit within 5 s of SIGTERM", d->name);
		}
	}
	return d->status;
}

/* ---- clients ---- */

struct sbx_client *it_connect(const char *target, const char *token)
{
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	struct sbx_client *c = NULL;
	struct sbx_error err;
	o.token = token;
	o.connect_timeout_ms = 10000;
	o.default_timeout_ms = 30000;
	if (sbx_connect(target, &o, &c, &err) < 0)
		it_fail(__FILE__, __LINE__, "connect %s: %s", target, it_errstr(&err));
	return c;
}

/* ---- main ---- */

static int run_case(const struct it_case *c)
{
	const char *base = getenv("TMPDIR");
	if (base == NULL || base[0] != '/' || strlen(base) > 60)
		base = "/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "%s/sbx-it.XXXXXX", base);
	if (mkdtemp(tmpdir) == NULL) {
		fprintf(stderr, "mkdtemp %s: %s\n", tmpdir, strerror(errno));
		tmpdir[0] = '\0';
		return 1;
	}
	case_name = c->name;
	alarm(WATCHDOG_SECONDS);
	uint64_t t0 = it_now_ms();
	int rc = c->run();
	/* Every daemon still running must shut down cleanly: status 0 (under the
	 * sanitizers that also means no leak and no error report at exit). */
	for (unsigned i = 0; i < n_daemons; i++) {
		struct it_daemon *d = &daemons[i];
		if (d->exited)
			continue;
		int st = it_daemon_stop(d);
		CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status 0x%x after SIGTERM (want 0)", d->name,
		       st);
	}
	alarm(0);
	cleanup();
	printf("%s: %s (%.2f s)\n", c->name, rc == IT_SKIP ? "SKIPPED" : "ok", (double)(it_now_ms() - t0) / 1000);
	fflush(stdout);
	return rc;
}

int it_main(int argc, char **argv, const struct it_case *cases, size_t ncases)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, watchdog);
	/* the tests choose their tokens; never one from the environment */
	unsetenv("SBX_TOKEN");
	unsetenv("SBX_TARGET");
	/* nor the daemon's listeners and token file (tests set them per daemon) */
	unsetenv("SANDBOX_SHIM_LISTEN");
	unsetenv("SANDBOX_SHIM_TOKEN_FILE");
	atexit(cleanup);
	if (argc > 2) {
		fprintf(stderr, "usage: %s [CASE]\n", argv[0]);
		return 2;
	}
	int rc = 0;
	bool found = false;
	for (size_t i = 0; i < ncases; i++) {
		if (argc == 2 && strcmp(argv[1], cases[i].name) != 0)
			continue;
		found = true;
		int r = run_case(&cases[i]);
		if (r != 0 && rc == 0)
			rc = r;
	}
	if (!found) {
		fprintf(stderr, "%s: no case named '%s'; cases:", argv[0], argv[1]);
		for (size_t i = 0; i < ncases; i++)
			fprintf(stderr, " %s", cases[i].name);
		fputc('\n', stderr);
		return 2;
	}
	return rc;
}

/* ---- daemons started through another program (added for the file and init tests) ---- */

/* fork and exec argv (looked up in PATH) as daemon NAME, stderr to its log; no wait for "ready" */
static struct it_daemon *spawn_argv(const char *name, const char *const argv[])
{
	CHECKF(n_daemons < MAX_DAEMONS, "too many daemons");
	struct it_daemon *d = &daemons[n_daemons];
	memset(d, 0, sizeof(*d));
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->log, sizeof(d->log), "%s/%s.log", tmpdir, name);
	int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(logfd >= 0, "open %s: %s", d->log, strerror(errno));
	int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(nullfd >= 0);
	pid_t parent = getpid();
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(nullfd, STDIN_FILENO);
		dup2(logfd, STDERR_FILENO);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	close(nullfd);
	d->pid = pid;
	n_daemons++;
	return d;
}

struct it_daemon *it_daemon_start_argv(const char *name, const char *const argv[])
{
	struct it_daemon *d = spawn_argv(name, argv);
	it_daemon_wait_log(d, " ready (pid ", 20000);
	return d;
}

struct it_daemon *it_daemon_spawn_argv(const char *name, const char *const argv[])
{
	return spawn_argv(name, argv);
}
