/* bench_tunnel.c: TCP through a forward tunnel over a unix-socket channel against a direct loopback TCP
 * connection to the same server in the same run: one connection's throughput each way, and
 * connections per second. */
#include "bench_util.h"
#include "sbx.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_MIB 256
#define DEFAULT_CONNS 2000
#define TRIES 3
#define IO_CHUNK (64u << 10)

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static int tcp_connect(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket");
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect");
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* The server (a child process): per connection, the first byte says what to do:
 *   'U' read to EOF, answer the byte count (8 bytes)    (upload)
 *   'D' read an 8-byte count, send that many bytes       (download)
 *   'P' answer one byte and close                        (connection rate) */
static void serve(int lfd)
{
	static uint8_t buf[IO_CHUNK];
	memset(buf, 0x5a, sizeof(buf));
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			continue;
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		uint8_t kind;
		if (bench_read_all(fd, &kind, 1) < 0) {
			close(fd);
			continue;
		}
		if (kind == 'U') {
			uint64_t total = 0;
			ssize_t n;
			while ((n = read(fd, buf, sizeof(buf))) > 0)
				total += (uint64_t)n;
			bench_write_all(fd, &total, sizeof(total));
		} else if (kind == 'D') {
			uint64_t want;
			if (bench_read_all(fd, &want, sizeof(want)) == 0) {
				for (uint64_t off = 0; off < want;) {
					size_t n = want - off < sizeof(buf) ? (size_t)(want - off) : sizeof(buf);
					if (bench_write_all(fd, buf, n) < 0)
						break;
					off += n;
				}
			}
		} else {
			bench_write_all(fd, "p", 1);
		}
		close(fd);
	}
}

static double mb_per_s(size_t bytes, uint64_t ns)
{
	return (double)bytes / 1e6 / ((double)ns / 1e9);
}

static double upload(unsigned port, const uint8_t *data, size_t len)
{
	uint64_t t0 = bench_now_ns();
	int fd = tcp_connect(port);
	if (bench_write_all(fd, "U", 1) < 0)
		die("upload");
	for (size_t off = 0; off < len; off += IO_CHUNK)
		if (bench_write_all(fd, data + off, len - off < IO_CHUNK ? len - off : IO_CHUNK) < 0)
			die("upload");
	shutdown(fd, SHUT_WR);
	uint64_t got = 0;
	if (bench_read_all(fd, &got, sizeof(got)) < 0 || got != len) {
		fprintf(stderr, "bench_tunnel: upload: the server got %llu bytes of %zu\n", (unsigned long long)got,
			len);
		exit(1);
	}
	close(fd);
	return mb_per_s(len, bench_now_ns() - t0);
}

static double download(unsigned port, uint8_t *buf, size_t len)
{
	uint64_t t0 = bench_now_ns();
	int fd = tcp_connect(port);
	uint8_t req[9] = {'D'};
	uint64_t want = len;
	memcpy(req + 1, &want, sizeof(want));
	if (bench_write_all(fd, req, sizeof(req)) < 0)
		die("download");
	size_t got = 0;
	for (;;) {
		ssize_t n = read(fd, buf, IO_CHUNK);
		if (n < 0)
			die("download");
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (got != len) {
		fprintf(stderr, "bench_tunnel: download: got %zu bytes of %zu\n", got, len);
		exit(1);
	}
	return mb_per_s(len, bench_now_ns() - t0);
}

/* n sequential connections: connect, one byte each way, close. */
static double conn_rate(unsigned port, unsigned n)
{
	uint64_t t0 = bench_now_ns();
	for (unsigned i = 0; i < n; i++) {
		int fd = tcp_connect(port);
		char b;
		if (bench_write_all(fd, "P", 1) < 0 || bench_read_all(fd, &b, 1) < 0) {
			fprintf(stderr, "bench_tunnel: connection %u failed\n", i);
			exit(1);
		}
		close(fd);
	}
	return (double)n / ((double)(bench_now_ns() - t0) / 1e9);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const char *e = getenv("BENCH_TUNNEL_MIB");
	size_t mib = e != NULL && atoi(e) > 0 ? (size_t)atoi(e) : DEFAULT_MIB;
	e = getenv("BENCH_TUNNEL_CONNS");
	unsigned conns = e != NULL && atoi(e) > 0 ? (unsigned)atoi(e) : DEFAULT_CONNS;
	size_t len = mib << 20;
	uint8_t *data = malloc(len), *buf = malloc(IO_CHUNK);
	if (data == NULL || buf == NULL) {
		fprintf(stderr, "bench_tunnel: cannot allocate %zu MiB\n", mib);
		return 1;
	}
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(data + i, &x, len - i < 8 ? len - i : 8);
	}

	/* the server "inside" */
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 512) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &al) < 0)
		die("server socket");
	unsigned sport = ntohs(a.sin_port);
	pid_t server = fork();
	if (server < 0)
		die("fork");
	if (server == 0) {
		serve(lfd);
		_exit(0);
	}
	close(lfd);

	char dir[256], target[320], msg[1400];
	bench_tmpdir(dir, sizeof(dir));
	snprintf(target, sizeof(target), "unix:%s/s.sock", dir);
	pid_t shim = bench_start_shim(SHIM_BIN, dir);
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.client_name = "bench_tunnel";
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_tunnel *t;
	if (sbx_connect(target, &o, &c, &err) < 0 ||
	    sbx_forward_open(c, NULL, 0, "127.0.0.1", sport, NULL, &t, &err) < 0) {
		fprintf(stderr, "bench_tunnel: %s\n", sbx_error_format(&err, msg, sizeof(msg)));
		return 1;
	}
	unsigned tport = sbx_tunnel_port(t);

	/* warm-up, then alternating runs so that a change in load hits both alike */
	upload(tport, data, len);
	upload(sport, data, len);
	double up_t = 0, up_d = 0, down_t = 0, down_d = 0, cps_t = 0, cps_d = 0, r;
	for (int i = 0; i < TRIES; i++) {
		if ((r = upload(tport, data, len)) > up_t)
			up_t = r;
		if ((r = upload(sport, data, len)) > up_d)
			up_d = r;
		if ((r = download(tport, buf, len)) > down_t)
			down_t = r;
		if ((r = download(sport, buf, len)) > down_d)
			down_d = r;
	}
	conn_rate(tport, conns / 10);
	conn_rate(sport, conns / 10);
	for (int i = 0; i < TRIES; i++) {
		if ((r = conn_rate(tport, conns)) > cps_t)
			cps_t = r;
		if ((r = conn_rate(sport, conns)) > cps_d)
			cps_d = r;
	}
	sbx_tunnel_close(t);
	sbx_client_close(c);
	bench_stop(shim);
	bench_rmdir(dir);
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);

	printf("tunnel throughput host->sandbox: forward tunnel %.0f MB/s, direct loopback TCP %.0f MB/s, ratio %.2f "
	       "(%zu MiB, one connection, best of %d)\n",
	       up_t, up_d, up_t / up_d, mib, TRIES);
	printf("tunnel throughput sandbox->host: forward tunnel %.0f MB/s, direct loopback TCP %.0f MB/s, ratio %.2f "
	       "(%zu MiB, one connection, best of %d)\n",
	       down_t, down_d, down_t / down_d, mib, TRIES);
	printf("tunnel connections: forward tunnel %.0f conn/s, direct loopback TCP %.0f conn/s, ratio %.2f "
	       "(%u sequential connect + 1-byte round trip + close, best of %d)\n",
	       cps_t, cps_d, cps_t / cps_d, conns, TRIES);
	free(data);
	free(buf);
	return 0;
}
