/* bench_tunnel.c: TCP through a forward tunnel over a unix-socket channel against a direct loopback TCP
 * connection to the same server in the same run: one connection's throughput each way, and
 * connections per second. A third figure, the floor of any tunnel that ends the client's TCP
 * connection and opens another to the server: the same runs through a bare relay (one process,
 * epoll, read/write), which pays the second connection and the extra copies but no framing, no
 * second hop and no protocol. */
#include "bench_util.h"
#include "sbx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
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

/* The bare relay (a child process): accept, connect to the server, copy both ways. Its
 * sockets block: a readable one's read does not wait, and a write that waits for a slow
 * reader is what a relay must do anyway; the runs here move bulk one way at a time, so
 * two blocked writes cannot meet. */
#define RELAY_MAX_FD 4096
static void relay(int lfd, unsigned sport)
{
	static uint8_t buf[IO_CHUNK];
	static int peer[RELAY_MAX_FD]; /* fd -> the other side's fd */
	static bool eof[RELAY_MAX_FD]; /* read EOF there (and shut the other side's writing) */
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event lev = {.events = EPOLLIN, .data.fd = lfd};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev) < 0)
		_exit(1);
	for (;;) {
		struct epoll_event evs[64];
		int n = epoll_wait(ep, evs, 64, -1);
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == lfd) {
				int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
				if (c < 0)
					continue;
				int one = 1;
				setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
				int s = tcp_connect(sport);
				if (c >= RELAY_MAX_FD || s >= RELAY_MAX_FD)
					_exit(1);
				peer[c] = s;
				peer[s] = c;
				eof[c] = eof[s] = false;
				struct epoll_event e1 = {.events = EPOLLIN, .data.fd = c},
						   e2 = {.events = EPOLLIN, .data.fd = s};
				epoll_ctl(ep, EPOLL_CTL_ADD, c, &e1);
				epoll_ctl(ep, EPOLL_CTL_ADD, s, &e2);
				continue;
			}
			int p = peer[fd];
			ssize_t r = read(fd, buf, sizeof(buf));
			if (r > 0) {
				if (bench_write_all(p, buf, (size_t)r) == 0)
					continue;
			}
			if (r < 0 && errno == EINTR)
				continue;
			/* EOF (or an error): pass it on; both sides done, both go */
			epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
			shutdown(p, SHUT_WR);
			eof[fd] = true;
			if (eof[p]) {
				close(fd);
				close(p);
			}
		}
	}
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

	/* the bare relay, to the same server */
	int rfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	a.sin_port = 0;
	al = sizeof(a);
	if (rfd < 0 || bind(rfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(rfd, 512) < 0 ||
	    getsockname(rfd, (struct sockaddr *)&a, &al) < 0)
		die("relay socket");
	unsigned rport = ntohs(a.sin_port);
	pid_t relay_pid = fork();
	if (relay_pid < 0)
		die("fork");
	if (relay_pid == 0) {
		relay(rfd, sport);
		_exit(0);
	}
	close(rfd);

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

	/* warm-up, then alternating runs so that a change in load hits all alike */
	unsigned ports[3] = {tport, sport, rport}; /* tunnel, direct, bare relay */
	for (int w = 0; w < 3; w++)
		upload(ports[w], data, len);
	double up[3] = {0}, down[3] = {0}, cps[3] = {0}, r;
	for (int i = 0; i < TRIES; i++) {
		for (int w = 0; w < 3; w++)
			if ((r = upload(ports[w], data, len)) > up[w])
				up[w] = r;
		for (int w = 0; w < 3; w++)
			if ((r = download(ports[w], buf, len)) > down[w])
				down[w] = r;
	}
	for (int w = 0; w < 3; w++)
		conn_rate(ports[w], conns / 10);
	for (int i = 0; i < TRIES; i++)
		for (int w = 0; w < 3; w++)
			if ((r = conn_rate(ports[w], conns)) > cps[w])
				cps[w] = r;
	sbx_tunnel_close(t);
	sbx_client_close(c);
	bench_stop(shim);
	bench_rmdir(dir);
	kill(server, SIGKILL);
	waitpid(server, NULL, 0);
	kill(relay_pid, SIGKILL);
	waitpid(relay_pid, NULL, 0);

	printf("tunnel throughput host->sandbox: forward tunnel %.0f MB/s, direct loopback TCP %.0f MB/s, ratio %.2f "
	       "(%zu MiB, one connection, best of %d); bare relay %.0f MB/s, ratio %.2f\n",
	       up[0], up[1], up[0] / up[1], mib, TRIES, up[2], up[2] / up[1]);
	printf("tunnel throughput sandbox->host: forward tunnel %.0f MB/s, direct loopback TCP %.0f MB/s, ratio %.2f "
	       "(%zu MiB, one connection, best of %d); bare relay %.0f MB/s, ratio %.2f\n",
	       down[0], down[1], down[0] / down[1], mib, TRIES, down[2], down[2] / down[1]);
	printf("tunnel connections: forward tunnel %.0f conn/s, direct loopback TCP %.0f conn/s, ratio %.2f "
	       "(%u sequential connect + 1-byte round trip + close, best of %d); bare relay %.0f conn/s, ratio %.2f\n",
	       cps[0], cps[1], cps[0] / cps[1], conns, TRIES, cps[2], cps[2] / cps[1]);
	free(data);
	free(buf);
	return 0;
}
