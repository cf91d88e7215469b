/* bench_util.c: clocks, percentiles, and running the daemon for the benchmarks. */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

uint64_t bench_percentile(uint64_t *v, size_t n, double p)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	/* nearest rank */
	size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

void bench_tmpdir(char *buf, size_t size)
{
	const char *t = getenv("TMPDIR");
	snprintf(buf, size, "%s/shim-bench.XXXXXX", t != NULL && t[0] != '\0' ? t : "/tmp");
	if (mkdtemp(buf) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
}

void bench_rmdir(const char *dir)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/state", dir);
	rmdir(path);
	rmdir(dir);
}

static int try_connect(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	if (n >= sizeof(a.sun_path)) {
		fprintf(stderr, "bench: socket path too long: %s (set TMPDIR to a shorter directory)\n", path);
		exit(1);
	}
	memcpy(a.sun_path, path, n + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
	close(fd);
	return rc;
}

pid_t bench_start_shim(const char *bin, const char *dir)
{
	char sock_path[300], listen[320], state[300];
	snprintf(sock_path, sizeof(sock_path), "%s/s.sock", dir);
	snprintf(listen, sizeof(listen), "unix:%s", sock_path);
	snprintf(state, sizeof(state), "%s/state", dir);
	char *argv[] = {(char *)bin, "--listen", listen, "--state-dir", state, "--log-level", "warn", NULL};
	pid_t pid;
	int rc = posix_spawn(&pid, bin, NULL, NULL, argv, environ);
	if (rc != 0) {
		fprintf(stderr, "bench: cannot start %s: %s\n", bin, strerror(rc));
		exit(1);
	}
	uint64_t until = bench_now_ns() + 10000000000ull;
	while (try_connect(sock_path) < 0) {
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			fprintf(stderr, "bench: %s exited at start (status %#x)\n", bin, (unsigned)st);
			exit(1);
		}
		if (bench_now_ns() > until) {
			fprintf(stderr, "bench: %s: %s takes no connections after 10 s\n", bin, sock_path);
			kill(pid, SIGKILL);
			exit(1);
		}
		usleep(2000);
	}
	return pid;
}

int bench_stop(pid_t pid)
{
	int st = 0;
	kill(pid, SIGTERM);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return st;
}

long bench_vmrss_kb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -1;
	long kb = -1;
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, "VmRSS:", 6) == 0) {
			kb = strtol(line + 6, NULL, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

int bench_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int bench_read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len > 0) {
		ssize_t n = read(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}
