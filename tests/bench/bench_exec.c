/* bench_exec.c: commands through libsbx and the daemon over a unix socket: exec of /bin/true round
 * trip against a bare posix_spawn+waitpid in the same run, 10 MiB of stdout throughput against a
 * bare pipe read of the same command, 256 MiB of stdin against a bare pipe into the same command, and 200
 * concurrent `sleep 1` with the daemon's RSS. */
#include "bench_util.h"
#include "sbx.h"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WARMUP 200
#define ROUNDS 2000
/* alternating blocks, so that a change in the machine's load hits both alike */
#define BLOCK 100
#define TRIES 5
#define CONCURRENT 200

extern char **environ;

static uint64_t lat_shim[ROUNDS], lat_bare[ROUNDS];

static void die_sbx(const char *what, const struct sbx_error *err)
{
	char msg[1400];
	fprintf(stderr, "bench_exec: %s: %s\n", what, sbx_error_format(err, msg, sizeof(msg)));
	exit(1);
}

static struct sbx_client *shim_connect(const char *sock)
{
	char target[320];
	snprintf(target, sizeof(target), "unix:%s", sock);
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.client_name = "bench_exec";
	struct sbx_client *c;
	struct sbx_error err;
	if (sbx_connect(target, &o, &c, &err) < 0)
		die_sbx("connect", &err);
	return c;
}

static void shim_true(struct sbx_client *c, uint64_t *lat, int n)
{
	static const char *const argv[] = {"/bin/true", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	for (int i = 0; i < n; i++) {
		struct sbx_output out;
		struct sbx_exit ex = SBX_EXIT_INIT;
		struct sbx_error err;
		uint64_t t0 = bench_now_ns();
		if (sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0)
			die_sbx("sbx_run /bin/true", &err);
		if (lat != NULL)
			lat[i] = bench_now_ns() - t0;
		sbx_output_free(&out);
		if (ex.exit_code != 0) {
			fprintf(stderr, "bench_exec: /bin/true exited %d\n", ex.exit_code);
			exit(1);
		}
	}
}

static void bare_true(uint64_t *lat, int n)
{
	char *argv[] = {"/bin/true", NULL};
	for (int i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		pid_t pid;
		int st;
		if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0 || waitpid(pid, &st, 0) != pid) {
			perror("bench_exec: posix_spawn");
			exit(1);
		}
		if (lat != NULL)
			lat[i] = bench_now_ns() - t0;
	}
}

static double mb_per_s(size_t bytes, uint64_t ns)
{
	return (double)bytes / 1e6 / ((double)ns / 1e9);
}

/* 10 MiB of stdout through the daemon, read with sbx_proc_read. */
static double shim_stdout(struct sbx_client *c, size_t len)
{
	static char buf[256 << 10];
	char cmd[64];
	snprintf(cmd, sizeof(cmd), "head -c %zu /dev/zero", len);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	struct sbx_error err;
	struct sbx_proc *p;
	uint64_t t0 = bench_now_ns();
	if (sbx_exec_start(c, NULL, &eo, 0, &p, &err) < 0)
		die_sbx("sbx_exec_start", &err);
	size_t total = 0;
	for (;;) {
		int ch;
		long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
		if (n < 0)
			die_sbx("sbx_proc_read", &err);
		if (n == 0)
			break;
		total += (size_t)n;
	}
	struct sbx_exit ex = SBX_EXIT_INIT;
	if (sbx_proc_wait(p, &ex, &err) < 0)
		die_sbx("sbx_proc_wait", &err);
	uint64_t dt = bench_now_ns() - t0;
	sbx_proc_free(p);
	if (total != len) {
		fprintf(stderr, "bench_exec: got %zu bytes of %zu\n", total, len);
		exit(1);
	}
	return mb_per_s(len, dt);
}

/* The same command spawned here, its stdout read from a pipe. */
static double bare_stdout(size_t len)
{
	static char buf[256 << 10];
	char cmd[64];
	snprintf(cmd, sizeof(cmd), "head -c %zu /dev/zero", len);
	char *argv[] = {"/bin/sh", "-c", cmd, NULL};
	int p[2];
	if (pipe(p) < 0) {
		perror("pipe");
		exit(1);
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_addclose(&fa, p[0]);
	uint64_t t0 = bench_now_ns();
	pid_t pid;
	if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
		perror("posix_spawn");
		exit(1);
	}
	close(p[1]);
	size_t total = 0;
	ssize_t n;
	while ((n = read(p[0], buf, sizeof(buf))) > 0)
		total += (size_t)n;
	int st;
	waitpid(pid, &st, 0);
	uint64_t dt = bench_now_ns() - t0;
	close(p[0]);
	posix_spawn_file_actions_destroy(&fa);
	if (total != len) {
		fprintf(stderr, "bench_exec: bare read %zu of %zu\n", total, len);
		exit(1);
	}
	return mb_per_s(len, dt);
}

/* len bytes into `cat > /dev/null` through the daemon, written with sbx_proc_write in
 * pieces of 256 KiB. */
#define STDIN_PIECE (256u << 10)
static const char STDIN_CMD[] = "cat > /dev/null";

static double shim_stdin(struct sbx_client *c, size_t len)
{
	static char buf[STDIN_PIECE];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = STDIN_CMD;
	struct sbx_error err;
	struct sbx_proc *p;
	uint64_t t0 = bench_now_ns();
	if (sbx_exec_start(c, NULL, &eo, SBX_PROC_STDIN, &p, &err) < 0)
		die_sbx("sbx_exec_start", &err);
	for (size_t off = 0; off < len; off += sizeof(buf))
		if (sbx_proc_write(p, buf, len - off < sizeof(buf) ? len - off : sizeof(buf), &err) < 0)
			die_sbx("sbx_proc_write", &err);
	struct sbx_exit ex = SBX_EXIT_INIT;
	if (sbx_proc_close_stdin(p, &err) < 0 || sbx_proc_wait(p, &ex, &err) < 0)
		die_sbx("sbx_proc_wait", &err);
	uint64_t dt = bench_now_ns() - t0;
	sbx_proc_free(p);
	if (ex.exit_code != 0) {
		fprintf(stderr, "bench_exec: %s exited %d\n", STDIN_CMD, ex.exit_code);
		exit(1);
	}
	return mb_per_s(len, dt);
}

/* The same command spawned here, fed through a pipe of the default size. */
static double bare_stdin(size_t len)
{
	static char buf[STDIN_PIECE];
	char *argv[] = {"/bin/sh", "-c", (char *)STDIN_CMD, NULL};
	int p[2];
	if (pipe(p) < 0) {
		perror("pipe");
		exit(1);
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[0], 0);
	posix_spawn_file_actions_addclose(&fa, p[1]);
	uint64_t t0 = bench_now_ns();
	pid_t pid;
	if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
		perror("posix_spawn");
		exit(1);
	}
	close(p[0]);
	for (size_t off = 0; off < len; off += sizeof(buf))
		if (bench_write_all(p[1], buf, len - off < sizeof(buf) ? len - off : sizeof(buf)) < 0) {
			perror("bench_exec: write");
			exit(1);
		}
	close(p[1]);
	int st;
	waitpid(pid, &st, 0);
	uint64_t dt = bench_now_ns() - t0;
	posix_spawn_file_actions_destroy(&fa);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "bench_exec: bare %s failed\n", STDIN_CMD);
		exit(1);
	}
	return mb_per_s(len, dt);
}

struct sleeper {
	struct sbx_client *c;
	int rc;
	struct sbx_error err;
};

static void *run_sleep(void *arg)
{
	struct sleeper *s = arg;
	static const char *const argv[] = {"sleep", "1", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	s->rc = sbx_run(s->c, NULL, &eo, NULL, 0, 0, &out, &ex, &s->err);
	if (s->rc == 0) {
		sbx_output_free(&out);
		if (ex.exit_code != 0)
			s->rc = -1;
	}
	return NULL;
}

struct rss_watch {
	pid_t pid;
	volatile int stop;
	long max_kb;
};

static void *watch_rss(void *arg)
{
	struct rss_watch *w = arg;
	while (!w->stop) {
		long kb = bench_vmrss_kb(w->pid);
		if (kb > w->max_kb)
			w->max_kb = kb;
		usleep(10000);
	}
	return NULL;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	char dir[256], sock[300];
	bench_tmpdir(dir, sizeof(dir));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	pid_t pid = bench_start_shim(SHIM_BIN, dir);
	struct sbx_client *c = shim_connect(sock);

	/* ---- /bin/true round trip ---- */
	shim_true(c, NULL, WARMUP);
	bare_true(NULL, WARMUP);
	for (int off = 0; off < ROUNDS; off += BLOCK) {
		shim_true(c, lat_shim + off, BLOCK);
		bare_true(lat_bare + off, BLOCK);
	}
	uint64_t s50 = bench_percentile(lat_shim, ROUNDS, 50), s99 = bench_percentile(lat_shim, ROUNDS, 99);
	uint64_t b50 = bench_percentile(lat_bare, ROUNDS, 50), b99 = bench_percentile(lat_bare, ROUNDS, 99);
	printf("exec /bin/true round trip: sbx_run p50 %.0f us p99 %.0f us, bare posix_spawn+waitpid p50 %.0f us "
	       "p99 %.0f us, p50 ratio %.2f (%d rounds)\n",
	       s50 / 1e3, s99 / 1e3, b50 / 1e3, b99 / 1e3, (double)s50 / (double)b50, ROUNDS);

	/* ---- 10 MiB of stdout ---- */
	size_t len = 10u << 20;
	shim_stdout(c, len);
	bare_stdout(len);
	double shim = 0, bare = 0;
	for (int t = 0; t < TRIES; t++) {
		double r = shim_stdout(c, len);
		if (r > shim)
			shim = r;
		r = bare_stdout(len);
		if (r > bare)
			bare = r;
	}
	printf("stdout throughput (10 MiB of head -c): through the shim %.0f MB/s, bare pipe %.0f MB/s, ratio %.2f "
	       "(best of %d)\n",
	       shim, bare, shim / bare, TRIES);

	/* ---- 256 MiB of stdin ---- */
	len = 256u << 20;
	shim_stdin(c, len);
	bare_stdin(len);
	shim = bare = 0;
	for (int t = 0; t < TRIES; t++) {
		double r = shim_stdin(c, len);
		if (r > shim)
			shim = r;
		r = bare_stdin(len);
		if (r > bare)
			bare = r;
	}
	printf("stdin throughput (256 MiB into %s, written in 256 KiB pieces): through the shim %.0f MB/s, bare "
	       "pipe %.0f MB/s, ratio %.2f (best of %d)\n",
	       STDIN_CMD, shim, bare, shim / bare, TRIES);

	/* ---- 200 concurrent sleep 1 on one connection ---- */
	static struct sleeper sl[CONCURRENT];
	static pthread_t th[CONCURRENT];
	struct rss_watch rw = {.pid = pid, .max_kb = bench_vmrss_kb(pid)};
	long rss0 = rw.max_kb;
	pthread_t wt;
	pthread_create(&wt, NULL, watch_rss, &rw);
	uint64_t t0 = bench_now_ns();
	for (int i = 0; i < CONCURRENT; i++) {
		sl[i].c = c;
		if (pthread_create(&th[i], NULL, run_sleep, &sl[i]) != 0) {
			fprintf(stderr, "bench_exec: pthread_create failed\n");
			return 1;
		}
	}
	int failed = 0;
	for (int i = 0; i < CONCURRENT; i++) {
		pthread_join(th[i], NULL);
		if (sl[i].rc < 0)
			failed++;
	}
	uint64_t wall = bench_now_ns() - t0;
	rw.stop = 1;
	pthread_join(wt, NULL);
	printf("%d concurrent `sleep 1` on one connection: wall %.2f s, %d failed; daemon RSS %ld kB idle, %ld kB peak\n",
	       CONCURRENT, wall / 1e9, failed, rss0, rw.max_kb);

	sbx_client_close(c);
	bench_stop(pid);
	bench_rmdir(dir);
	return failed ? 1 : 0;
}
