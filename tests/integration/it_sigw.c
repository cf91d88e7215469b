/* it_sigw.c: the workload the PID-1 tests run under an init (the shim, tini, dumb-init): notes every signal it gets.
 *
 *   it_sigw [OPTION]...
 *
 * Every signal is blocked and taken with sigtimedwait(): each catchable one but SIGCHLD
 * appends its name ("TERM", "RTMIN+3") and a newline to the --log file, so a line per
 * delivery (the kernel queues each real-time signal, and coalesces a standard one that
 * is already pending). SIGTERM ends it with --code unless --deaf. It dies with its
 * parent (the init), and gives up after 60 s whatever happens (exit 99), so that a
 * failed test leaves nothing running. Options, applied in this order:
 *   --log FILE        where the lines go (default: nowhere)
 *   --raise N         die of signal N at once (its default action; no core file)
 *   --exit N          exit N at once
 *   --child FILE      fork a child in our process group noting its signals in FILE; it
 *                     exits 0 on SIGTERM (with --deaf it does not: it is then left for
 *                     the init to end, or for the 60 s)
 *   --orphans N       make N orphans (grandchildren whose parent has exited) that exit
 *                     after 0 to 30 ms, then write "spawned\n" to the --log file
 *   --ready FILE      FILE is made (renamed into place) holding our pid as we see it,
 *                     and the --child's on a second line
 *   --stop            raise SIGSTOP
 *   --wait FILE       exit with --code once FILE exists (or on SIGTERM, unless --deaf)
 *   --code N          the exit status for --wait and SIGTERM (default 0)
 *   --drain MS        after SIGTERM go on for MS milliseconds (noting signals), then exit
 *   --deaf            no signal ends it: only SIGKILL (or the 60 s) */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_MS 60000

static int log_fd = -1;
static sigset_t all;

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void note(int sig)
{
	char line[24];
	if (sig < SIGRTMIN)
		snprintf(line, sizeof(line), "%s\n", sigabbrev_np(sig));
	else
		snprintf(line, sizeof(line), "RTMIN+%d\n", sig - SIGRTMIN);
	if (log_fd >= 0 && write(log_fd, line, strlen(line)) < 0)
		exit(123);
}

enum served { SERVED_TERM, SERVED_FILE, SERVED_DEADLINE };

/* Take signals, noting each, until SIGTERM (unless deaf), wait_path exists, or until. */
static enum served serve(bool deaf, const char *wait_path, long until)
{
	for (;;) {
		struct stat st;
		if (wait_path != NULL && stat(wait_path, &st) == 0)
			return SERVED_FILE;
		long left = until - now_ms();
		if (left <= 0)
			return SERVED_DEADLINE;
		if (wait_path != NULL && left > 2)
			left = 2;
		struct timespec ts = {left / 1000, (left % 1000) * 1000000L};
		siginfo_t si;
		int sig = sigtimedwait(&all, &si, &ts);
		if (sig <= 0 || sig == SIGCHLD)
			continue;
		note(sig);
		if (sig == SIGTERM && !deaf)
			return SERVED_TERM;
	}
}

static void write_file(const char *path, const char *text)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || close(fd) < 0 ||
	    rename(tmp, path) < 0) {
		perror(path);
		exit(120);
	}
}

static void make_orphans(int n)
{
	for (int i = 0; i < n; i++) {
		pid_t c = fork();
		if (c < 0) {
			perror("fork");
			exit(121);
		}
		if (c == 0) {
			if (fork() == 0) {
				sleep_ms(i % 31);
				_exit(0);
			}
			_exit(0);
		}
		while (waitpid(c, NULL, 0) < 0 && errno == EINTR)
			;
	}
}

int main(int argc, char **argv)
{
	/* first of all: nothing may act by default from here on */
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	long deadline = now_ms() + DEADLINE_MS;
	const char *ready = NULL, *child_log = NULL, *wait_path = NULL;
	int orphans = 0, exit_now = -1, raise_now = 0, code = 0;
	long drain = 0;
	bool stop = false, deaf = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--stop") == 0) {
			stop = true;
			continue;
		}
		if (strcmp(a, "--deaf") == 0) {
			deaf = true;
			continue;
		}
		const char *v = argv[++i];
		if (v == NULL) {
			fprintf(stderr, "it_sigw: %s wants a value\n", a);
			return 2;
		}
		if (strcmp(a, "--log") == 0)
			log_fd = open(v, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		else if (strcmp(a, "--ready") == 0)
			ready = v;
		else if (strcmp(a, "--child") == 0)
			child_log = v;
		else if (strcmp(a, "--orphans") == 0)
			orphans = atoi(v);
		else if (strcmp(a, "--exit") == 0)
			exit_now = atoi(v);
		else if (strcmp(a, "--raise") == 0)
			raise_now = atoi(v);
		else if (strcmp(a, "--wait") == 0)
			wait_path = v;
		else if (strcmp(a, "--code") == 0)
			code = atoi(v);
		else if (strcmp(a, "--drain") == 0)
			drain = atol(v);
		else {
			fprintf(stderr, "it_sigw: bad argument '%s'\n", a);
			return 2;
		}
	}
	if (raise_now > 0) {
		/* as the program would die without any handler: the default action */
		struct rlimit no_core = {0, 0};
		setrlimit(RLIMIT_CORE, &no_core);
		signal(raise_now, SIG_DFL);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		kill(getpid(), raise_now);
		return 125; /* not a killing signal */
	}
	if (exit_now >= 0)
		return exit_now;
	pid_t parent = getppid();
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		return 124;
	char text[64];
	int len = snprintf(text, sizeof(text), "%d\n", (int)getpid());
	if (child_log != NULL) {
		pid_t c = fork();
		if (c < 0) {
			perror("fork");
			return 121;
		}
		if (c == 0) {
			/* (fork cleared the parent-death signal: when deaf it outlives us,
			 * "what is left" of a workload) */
			close(log_fd);
			log_fd = open(child_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
			serve(deaf, NULL, deadline);
			_exit(0);
		}
		snprintf(text + len, sizeof(text) - (size_t)len, "%d\n", (int)c);
	}
	if (orphans > 0) {
		make_orphans(orphans);
		if (log_fd >= 0 && write(log_fd, "spawned\n", 8) != 8)
			return 122;
	}
	if (ready != NULL)
		write_file(ready, text);
	if (stop)
		raise(SIGSTOP);
	enum served how = serve(deaf, wait_path, deadline);
	/* a server finishing its requests, still noting signals */
	if (how == SERVED_TERM && drain > 0)
		serve(true, NULL, now_ms() + drain);
	if (how == SERVED_DEADLINE) {
		fprintf(stderr, "it_sigw: nothing ended it within %d s\n", DEADLINE_MS / 1000);
		return 99;
	}
	return code;
}
