/* bench_echo.c: echo throughput, sbx_echo through the daemon over a unix socket against the same
 * bytes copied through a bare unix socket pair and back by a child process. */
#include "bench_util.h"
#include "sbx.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_MIB 256
#define TRIES 3
/* The size of the DATA frames libsbx and the daemon produce (FRAME_DATA_CHUNK). */
#define IO_CHUNK (64u << 10)

static double mb_per_s(size_t bytes, uint64_t ns)
{
	return (double)bytes / 1e6 / ((double)ns / 1e9);
}

static struct sbx_client *shim_connect(const char *sock)
{
	char target[320], msg[1400];
	snprintf(target, sizeof(target), "unix:%s", sock);
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.client_name = "bench_echo";
	struct sbx_client *c;
	struct sbx_error err;
	if (sbx_connect(target, &o, &c, &err) < 0) {
		fprintf(stderr, "bench_echo: connect: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
		exit(1);
	}
	return c;
}

static double shim_echo(struct sbx_client *c, const uint8_t *in, uint8_t *out, size_t len)
{
	struct sbx_error err;
	char msg[1400];
	memset(out, 0, len);
	uint64_t t0 = bench_now_ns();
	if (sbx_echo(c, NULL, in, len, out, &err) < 0) {
		fprintf(stderr, "bench_echo: sbx_echo: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
		exit(1);
	}
	double r = mb_per_s(len, bench_now_ns() - t0);
	if (memcmp(in, out, len) != 0) {
		fprintf(stderr, "bench_echo: sbx_echo returned different bytes\n");
		exit(1);
	}
	return r;
}

struct writer {
	int fd;
	const uint8_t *buf;
	size_t len;
	int rc;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	w->rc = 0;
	for (size_t off = 0; off < w->len && w->rc == 0; off += IO_CHUNK) {
		size_t n = w->len - off < IO_CHUNK ? w->len - off : IO_CHUNK;
		w->rc = bench_write_all(w->fd, w->buf + off, n);
	}
	shutdown(w->fd, SHUT_WR);
	return NULL;
}

/* One baseline run: a thread writes, a child echoes, this thread reads back. */
static double bare_echo(const uint8_t *in, uint8_t *out, size_t len)
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
		static uint8_t b[IO_CHUNK];
		close(sv[0]);
		for (;;) {
			ssize_t n = read(sv[1], b, sizeof(b));
			if (n <= 0 || bench_write_all(sv[1], b, (size_t)n) < 0)
				break;
		}
		_exit(0);
	}
	close(sv[1]);
	memset(out, 0, len);
	uint64_t t0 = bench_now_ns();
	struct writer w = {.fd = sv[0], .buf = in, .len = len};
	pthread_t th;
	if (pthread_create(&th, NULL, writer_main, &w) != 0) {
		fprintf(stderr, "bench_echo: pthread_create failed\n");
		exit(1);
	}
	int rc = 0;
	for (size_t off = 0; off < len && rc == 0; off += IO_CHUNK) {
		size_t n = len - off < IO_CHUNK ? len - off : IO_CHUNK;
		rc = bench_read_all(sv[0], out + off, n);
	}
	uint64_t dt = bench_now_ns() - t0;
	pthread_join(th, NULL);
	close(sv[0]);
	waitpid(pid, NULL, 0);
	if (rc < 0 || w.rc < 0 || memcmp(in, out, len) != 0) {
		fprintf(stderr, "bench_echo: baseline copy failed\n");
		exit(1);
	}
	return mb_per_s(len, dt);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	/* BENCH_ECHO_MIB: a smaller run on a small machine */
	const char *e = getenv("BENCH_ECHO_MIB");
	size_t mib = e != NULL && atoi(e) > 0 ? (size_t)atoi(e) : DEFAULT_MIB;
	size_t len = mib << 20;
	uint8_t *in = malloc(len), *out = malloc(len);
	if (in == NULL || out == NULL) {
		fprintf(stderr, "bench_echo: cannot allocate 2 x %zu MiB\n", mib);
		return 1;
	}
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < len; i += 8) {
		/* xorshift64: bytes no layer could compress or special-case */
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(in + i, &x, len - i < 8 ? len - i : 8);
	}

	char dir[256], sock[300];
	bench_tmpdir(dir, sizeof(dir));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	pid_t pid = bench_start_shim(SHIM_BIN, dir);
	struct sbx_client *c = shim_connect(sock);

	/* warm-up (pages in both buffers), then alternating runs, so that a change in
	 * the machine's load hits both alike */
	shim_echo(c, in, out, len);
	bare_echo(in, out, len);
	double shim = 0, bare = 0;
	for (int t = 0; t < TRIES; t++) {
		double r = shim_echo(c, in, out, len);
		if (r > shim)
			shim = r;
		r = bare_echo(in, out, len);
		if (r > bare)
			bare = r;
	}
	sbx_client_close(c);
	bench_stop(pid);
	bench_rmdir(dir);
	printf("echo throughput: sbx_echo %.0f MB/s, bare socketpair copy %.0f MB/s, ratio %.2f (%zu MiB, best of %d)\n",
	       shim, bare, shim / bare, mib, TRIES);
	free(in);
	free(out);
	return 0;
}
