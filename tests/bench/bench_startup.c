/* bench_startup.c: time from spawning `sandbox-shim --stdio` to its HELLO_OK, against spawning and
 * reaping /bin/true. */
#include "bench_util.h"
#include "frame.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WARMUP 10
#define RUNS 200

extern char **environ;

/* HELLO {protocol_version: 1, client_name: "bench"}, protobuf by hand. */
static size_t make_hello(uint8_t *buf)
{
	static const uint8_t msg[] = {0x08, 0x01, 0x12, 0x05, 'b', 'e', 'n', 'c', 'h'};
	frame_put_u32(buf, sizeof(msg));
	frame_put_u32(buf + 4, 0);
	buf[8] = FRAME_HELLO;
	buf[9] = 0;
	buf[10] = buf[11] = 0;
	memcpy(buf + FRAME_HDR_LEN, msg, sizeof(msg));
	return FRAME_HDR_LEN + sizeof(msg);
}

/* state: a --state-dir, so that runs leave nothing behind in /run or $XDG_RUNTIME_DIR */
static uint64_t one_start(const char *bin, char *state)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		exit(1);
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
	posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	char *argv[] = {(char *)bin, "--stdio", "--state-dir", state, NULL};
	uint8_t hello[64], hdr[FRAME_HDR_LEN], body[4096];
	size_t hlen = make_hello(hello);

	uint64_t t0 = bench_now_ns();
	pid_t pid;
	int rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
	if (rc != 0) {
		fprintf(stderr, "bench_startup: cannot start %s: %s\n", bin, strerror(rc));
		exit(1);
	}
	close(sv[1]);
	if (bench_write_all(sv[0], hello, hlen) < 0 || bench_read_all(sv[0], hdr, sizeof(hdr)) < 0) {
		fprintf(stderr, "bench_startup: no answer to HELLO\n");
		exit(1);
	}
	uint32_t len = frame_get_u32(hdr);
	if (hdr[8] != FRAME_HELLO_OK || len > sizeof(body) || bench_read_all(sv[0], body, len) < 0) {
		fprintf(stderr, "bench_startup: expected HELLO_OK, got frame type %u\n", hdr[8]);
		exit(1);
	}
	uint64_t dt = bench_now_ns() - t0;

	/* EOF on stdin: the daemon exits 0 */
	close(sv[0]);
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "bench_startup: sandbox-shim --stdio ended with status %#x\n", (unsigned)st);
		exit(1);
	}
	posix_spawn_file_actions_destroy(&fa);
	return dt;
}

static uint64_t one_true(void)
{
	char *argv[] = {"/bin/true", NULL};
	uint64_t t0 = bench_now_ns();
	pid_t pid;
	int rc = posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ);
	if (rc != 0) {
		fprintf(stderr, "bench_startup: cannot start /bin/true: %s\n", strerror(rc));
		exit(1);
	}
	waitpid(pid, NULL, 0);
	return bench_now_ns() - t0;
}

/* One daemon binary against /bin/true, alternating, so that a change in the
 * machine's load hits both alike. */
static void measure(const char *what, const char *bin, const char *state)
{
	static uint64_t shim[RUNS], bare[RUNS];
	char st[300];
	snprintf(st, sizeof(st), "%s", state);
	for (int i = 0; i < WARMUP + RUNS; i++) {
		uint64_t s = one_start(bin, st), b = one_true();
		if (i >= WARMUP) {
			shim[i - WARMUP] = s;
			bare[i - WARMUP] = b;
		}
	}
	uint64_t s50 = bench_percentile(shim, RUNS, 50), s99 = bench_percentile(shim, RUNS, 99);
	uint64_t t50 = bench_percentile(bare, RUNS, 50), t99 = bench_percentile(bare, RUNS, 99);
	printf("startup%s p50: spawn to HELLO_OK %.0f us, spawn+wait /bin/true %.0f us, ratio %.2f (%d runs)\n", what,
	       s50 / 1e3, t50 / 1e3, (double)s50 / (double)t50, RUNS);
	printf("startup%s p99: spawn to HELLO_OK %.0f us, spawn+wait /bin/true %.0f us, ratio %.2f (%d runs)\n", what,
	       s99 / 1e3, t99 / 1e3, (double)s99 / (double)t99, RUNS);
}

int main(void)
{
	char dir[256], state[300];
	signal(SIGPIPE, SIG_IGN);
	bench_tmpdir(dir, sizeof(dir));
	snprintf(state, sizeof(state), "%s/state", dir);
	measure("", SHIM_BIN, state);
	/* the build meant for images: no dynamic linking of its libraries at start */
	const char *st = getenv("SHIM_STATIC_BIN");
	if (st != NULL && access(st, X_OK) == 0)
		measure(" static", st, state);
	else
		printf("startup static: skipped (set SHIM_STATIC_BIN to a static sandbox-shim)\n");
	bench_rmdir(dir);
	return 0;
}
