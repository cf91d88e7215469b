/* bench_ping.c: PING round trip through libsbx and the daemon over a unix socket, against a bare
 * unix-socket echo of the same 20 bytes (a PING frame: 12-byte header, 8-byte payload).
 *
 * Measured twice: as the scheduler places the processes, then with the bench, the daemon and
 * the echo child on one CPU. In a VM the first is bimodal on a quiet machine: a wake-up sent to
 * an idle vCPU costs some 50 us (measured here: either side's p50 at 10 or 55-80 us from one
 * run to the next), which is the hypervisor's, not the protocol's; the one-CPU figure has no
 * cross-CPU wake-up on either side and shows what the protocol costs. A third run puts the
 * daemon and the echo child on one CPU and the bench on the other: every round trip then pays
 * two cross-CPU wake-ups on both sides alike (as placed, the scheduler may keep the echo child
 * beside the bench and not the daemon, or the other way round).
 *
 * Each run also times sbx_stat of the bench's directory, interleaved with the pings: a
 * one-shot file call, the worker's hop on top of the ping's path (its reply written by
 * the worker itself); the ratio to sbx_ping is what the hop costs. */
#include "bench_util.h"
#include "sbx.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WARMUP 2000
#define ROUNDS 20000
/* The two run in alternating blocks, so that a change in the machine's load (other
 * processes, frequency) hits both alike. */
#define BLOCK 1000
#define MSG 20

static uint64_t lat_shim[ROUNDS], lat_bare[ROUNDS], lat_stat[ROUNDS];

static struct sbx_client *shim_connect(const char *sock)
{
	char target[320], msg[1400];
	snprintf(target, sizeof(target), "unix:%s", sock);
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.client_name = "bench_ping";
	struct sbx_client *c;
	struct sbx_error err;
	if (sbx_connect(target, &o, &c, &err) < 0) {
		fprintf(stderr, "bench_ping: connect: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
		exit(1);
	}
	return c;
}

static void shim_pings(struct sbx_client *c, uint64_t *lat, int n)
{
	struct sbx_error err;
	char msg[1400];
	for (int i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		if (sbx_ping(c, NULL, NULL, &err) < 0) {
			fprintf(stderr, "bench_ping: ping: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
			exit(1);
		}
		if (lat != NULL)
			lat[i] = bench_now_ns() - t0;
	}
}

static void shim_stats(struct sbx_client *c, const char *path, uint64_t *lat, int n)
{
	struct sbx_error err;
	char msg[1400];
	for (int i = 0; i < n; i++) {
		struct sbx_stat st = SBX_STAT_INIT;
		uint64_t t0 = bench_now_ns();
		if (sbx_stat(c, NULL, path, 0, &st, &err) < 0) {
			fprintf(stderr, "bench_ping: stat: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
			exit(1);
		}
		if (lat != NULL)
			lat[i] = bench_now_ns() - t0;
	}
}

/* The baseline: a child process that echoes 20-byte messages on a unix socket pair. */
static pid_t bare_start(int *fd)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		exit(1);
	}
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		char b[MSG];
		close(sv[0]);
		while (bench_read_all(sv[1], b, MSG) == 0 && bench_write_all(sv[1], b, MSG) == 0)
			;
		_exit(0);
	}
	close(sv[1]);
	*fd = sv[0];
	return pid;
}

static void bare_pings(int fd, uint64_t *lat, int n)
{
	char out[MSG] = "0123456789abcdefghi", in[MSG];
	for (int i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		if (bench_write_all(fd, out, MSG) < 0 || bench_read_all(fd, in, MSG) < 0) {
			fprintf(stderr, "bench_ping: baseline echo failed\n");
			exit(1);
		}
		if (lat != NULL)
			lat[i] = bench_now_ns() - t0;
	}
}

static void pin(int cpu)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one) < 0) {
		perror("bench_ping: sched_setaffinity");
		exit(1);
	}
}

/* server_cpu >= 0: the daemon and the echo child run there (they inherit the mask), the
 * bench on client_cpu. */
static void measure(const char *how, int server_cpu, int client_cpu)
{
	char dir[256], sock[300];
	bench_tmpdir(dir, sizeof(dir));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	if (server_cpu >= 0)
		pin(server_cpu);
	pid_t pid = bench_start_shim(SHIM_BIN, dir);
	int fd;
	pid_t echo = bare_start(&fd);
	if (server_cpu >= 0)
		pin(client_cpu);
	struct sbx_client *c = shim_connect(sock);

	shim_pings(c, NULL, WARMUP);
	bare_pings(fd, NULL, WARMUP);
	shim_stats(c, dir, NULL, WARMUP);
	for (int off = 0; off < ROUNDS; off += BLOCK) {
		shim_pings(c, lat_shim + off, BLOCK);
		bare_pings(fd, lat_bare + off, BLOCK);
		shim_stats(c, dir, lat_stat + off, BLOCK);
	}

	sbx_client_close(c);
	bench_stop(pid);
	bench_rmdir(dir);
	close(fd);
	waitpid(echo, NULL, 0);
	uint64_t s50 = bench_percentile(lat_shim, ROUNDS, 50), s99 = bench_percentile(lat_shim, ROUNDS, 99);
	uint64_t b50 = bench_percentile(lat_bare, ROUNDS, 50), b99 = bench_percentile(lat_bare, ROUNDS, 99);
	printf("ping rtt p50%s: sbx_ping %.1f us, bare unix echo %.1f us, ratio %.2f (%d pings)\n", how, s50 / 1e3,
	       b50 / 1e3, (double)s50 / (double)b50, ROUNDS);
	printf("ping rtt p99%s: sbx_ping %.1f us, bare unix echo %.1f us, ratio %.2f (%d pings)\n", how, s99 / 1e3,
	       b99 / 1e3, (double)s99 / (double)b99, ROUNDS);
	uint64_t t50 = bench_percentile(lat_stat, ROUNDS, 50);
	printf("stat rtt p50%s: sbx_stat %.1f us, sbx_ping %.1f us, ratio %.2f (%d stats, the worker's hop)\n", how,
	       t50 / 1e3, s50 / 1e3, (double)t50 / (double)s50, ROUNDS);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	cpu_set_t all;
	if (sched_getaffinity(0, sizeof(all), &all) < 0) {
		perror("bench_ping: sched_getaffinity");
		return 1;
	}
	measure("", -1, -1);
	/* two CPUs of those we may use: the daemon on the second, the bench on the first */
	int cpus[2], n = 0;
	for (int i = 0; i < CPU_SETSIZE && n < 2; i++)
		if (CPU_ISSET(i, &all))
			cpus[n++] = i;
	if (n == 2)
		measure(", daemon and echo on another CPU", cpus[1], cpus[0]);
	int cpu = sched_getcpu();
	measure(", one CPU", cpu < 0 ? cpus[0] : cpu, cpu < 0 ? cpus[0] : cpu);
	return 0;
}
