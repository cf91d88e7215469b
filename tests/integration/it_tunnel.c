/* it_tunnel.c: TCP tunnels through libsbx against the real daemon: an HTTP server inside
 * fetched through a forward, a command inside reaching a host echo server through a
 * reverse, 100 concurrent 1 MiB connections each way, half-closes, closing with transfers
 * in flight (no fd left behind in the shim), ECONNREFUSED and EADDRINUSE, the exec:
 * (stdio) transport, a stalled reader that stalls only its own connection, and a client
 * that vanishes taking its tunnels with it. The "inside" servers are threads of this
 * test listening on 127.0.0.1: the shim runs on the same host. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB 1024u
#define MiB (1024u * 1024u)

extern char **environ;

static struct it_daemon *daemon_;

static struct sbx_client *start(void)
{
	const char *sp = it_path("s.sock");
	daemon_ = it_daemon_start("shim", "--listen", it_unix_target(sp), "--state-dir", it_path("state"), NULL);
	return it_connect(it_unix_target(sp), NULL);
}

/* ---- sockets ---- */

static int tcp_connect(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int tcp_listen(unsigned *port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 256) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	socklen_t l = sizeof(a);
	getsockname(fd, (struct sockaddr *)&a, &l);
	*port = ntohs(a.sin_port);
	return fd;
}

/* A port nothing listens on (bound and closed again). */
static unsigned free_port(void)
{
	unsigned p = 0;
	int fd = tcp_listen(&p);
	CHECK(fd >= 0);
	close(fd);
	return p;
}

static int port_accepts(unsigned port)
{
	int fd = tcp_connect(port);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

static void send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
		CHECKF(w > 0, "send: %s", strerror(errno));
		p += w;
		len -= (size_t)w;
	}
}

/* Read until EOF into buf (at most cap); returns the count, or -1 with errno. */
static long recv_all(int fd, void *buf, size_t cap)
{
	size_t got = 0;
	for (;;) {
		ssize_t n = recv(fd, (uint8_t *)buf + got, cap - got > 0 ? cap - got : 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return (long)got;
		CHECKF(got + (size_t)n <= cap, "more data than expected (%zu)", got + (size_t)n);
		got += (size_t)n;
	}
}

/* Send out (then shut the write side) and receive until EOF at the same time, in one
 * thread; sends of at most sizes[i] bytes in turn when sizes is given (nsizes of them),
 * else as much as the socket takes. Returns the bytes received into in (cap), or -1
 * with errno. */
static long duplex_sized(int fd, const uint8_t *out, size_t outlen, uint8_t *in, size_t cap, const size_t *sizes,
			 size_t nsizes)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	size_t sent = 0, got = 0, upto = 0, k = 0;
	bool shut = false;
	for (;;) {
		if (sent == upto)
			upto = sizes == NULL || outlen - sent < sizes[k % nsizes] ? outlen : sent + sizes[k++ % nsizes];
		if (sent == outlen && !shut) {
			shutdown(fd, SHUT_WR);
			shut = true;
		}
		struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
		int r = poll(&p, 1, 30000);
		CHECKF(r > 0, "duplex: stalled for 30 s (sent %zu of %zu, got %zu)", sent, outlen, got);
		if (!shut && (p.revents & (POLLOUT | POLLERR))) {
			ssize_t w = send(fd, out + sent, upto - sent, MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN)
				return -1;
			if (w > 0)
				sent += (size_t)w;
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = recv(fd, in + got, cap - got > 0 ? cap - got : 1, 0);
			if (n < 0 && errno != EAGAIN)
				return -1;
			if (n == 0)
				return (long)got;
			if (n > 0) {
				CHECKF(got + (size_t)n <= cap, "duplex: more data than expected");
				got += (size_t)n;
			}
		}
	}
}

static long duplex(int fd, const uint8_t *out, size_t outlen, uint8_t *in, size_t cap)
{
	return duplex_sized(fd, out, outlen, in, cap, NULL, 0);
}

/* A tunnel to port inside: kind 0 forward (host listener -> port), 1 reverse. */
static struct sbx_tunnel *open_kind(struct sbx_client *c, int kind, unsigned port)
{
	struct sbx_error err;
	struct sbx_tunnel *t;
	if (kind == 0)
		CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, port, NULL, &t, &err), &err);
	else
		CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, port, NULL, &t, &err), &err);
	return t;
}

/* ---- servers ("inside" or on the host: threads of this test) ---- */

struct srv;
typedef void (*srv_fn)(struct srv *s, int fd);

struct srv {
	int lfd;
	unsigned port;
	pthread_t th;
	srv_fn fn;
	atomic_int live;  /* handlers running */
	atomic_int ended; /* handlers finished */
	atomic_long sent; /* for the slow-reader case */
	atomic_int err;   /* last errno a handler saw */
};

struct srv_conn {
	struct srv *s;
	int fd;
};

static void *srv_conn_main(void *arg)
{
	struct srv_conn *sc = arg;
	sc->s->fn(sc->s, sc->fd);
	close(sc->fd);
	atomic_fetch_add(&sc->s->ended, 1);
	atomic_fetch_sub(&sc->s->live, 1);
	free(sc);
	return NULL;
}

static void *srv_main(void *arg)
{
	struct srv *s = arg;
	for (;;) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return NULL; /* shut down */
		}
		struct srv_conn *sc = malloc(sizeof(*sc));
		CHECK(sc != NULL);
		sc->s = s;
		sc->fd = fd;
		atomic_fetch_add(&s->live, 1);
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		CHECK(pthread_create(&th, &at, srv_conn_main, sc) == 0);
		pthread_attr_destroy(&at);
	}
}

static void srv_start(struct srv *s, srv_fn fn)
{
	memset(s, 0, sizeof(*s));
	s->fn = fn;
	s->lfd = tcp_listen(&s->port);
	CHECK(s->lfd >= 0);
	CHECK(pthread_create(&s->th, NULL, srv_main, s) == 0);
}

/* Stop accepting and wait (up to 10 s) for the handlers to finish. */
static void srv_stop(struct srv *s)
{
	shutdown(s->lfd, SHUT_RDWR);
	pthread_join(s->th, NULL);
	close(s->lfd);
	uint64_t until = it_now_ms() + 10000;
	while (atomic_load(&s->live) > 0 && it_now_ms() < until)
		it_sleep_ms(10);
	CHECKF(atomic_load(&s->live) == 0, "%d server handlers still running", atomic_load(&s->live));
}

/* Echo until EOF, then end our side too. */
static void echo_fn(struct srv *s, int fd)
{
	(void)s;
	uint8_t *buf = malloc(64 * KiB);
	CHECK(buf != NULL);
	for (;;) {
		ssize_t n = recv(fd, buf, 64 * KiB, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
			break;
	}
	shutdown(fd, SHUT_WR);
	free(buf);
}

/* ---- the tunnel's log ---- */

struct tlog {
	pthread_mutex_t mu;
	int open, close, fail;
	int fail_kind, fail_code;
	int close_err_code;
};

static void tlog_cb(void *ud, const struct sbx_tunnel *t, const struct sbx_tunnel_event *ev)
{
	(void)t;
	struct tlog *l = ud;
	pthread_mutex_lock(&l->mu);
	if (ev->type == SBX_TUNNEL_OPEN) {
		l->open++;
	} else if (ev->type == SBX_TUNNEL_CLOSE) {
		l->close++;
		if (ev->err != NULL)
			l->close_err_code = ev->err->code;
	} else {
		l->fail++;
		l->fail_kind = ev->err ? ev->err->kind : -1;
		l->fail_code = ev->err ? ev->err->code : -1;
	}
	pthread_mutex_unlock(&l->mu);
}

static int tlog_get(struct tlog *l, int *field)
{
	pthread_mutex_lock(&l->mu);
	int v = *field;
	pthread_mutex_unlock(&l->mu);
	return v;
}

static void tlog_wait(struct tlog *l, int *field, int want)
{
	uint64_t until = it_now_ms() + 10000;
	while (tlog_get(l, field) < want && it_now_ms() < until)
		it_sleep_ms(5);
	CHECKF(tlog_get(l, field) >= want, "tunnel log: want %d events, got %d", want, tlog_get(l, field));
}

/* ---- the shim's fds ---- */

static void wait_fds(pid_t pid, unsigned want)
{
	uint64_t until = it_now_ms() + 10000;
	while (it_count_fds(pid) != want && it_now_ms() < until)
		it_sleep_ms(10);
	CHECKF(it_count_fds(pid) == want, "the shim holds %u fds, %u before the tunnel", it_count_fds(pid), want);
}

static size_t list_count(struct sbx_client *c)
{
	struct sbx_tunnel_info **v;
	size_t n;
	struct sbx_error err;
	CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
	sbx_tunnels_free(v);
	return n;
}

/* The shim handles each connection's frames in its own order: a CANCEL sent on one
 * connection may be seen after a list asked on another. */
static void wait_list_count(struct sbx_client *c, size_t want)
{
	uint64_t until = it_now_ms() + 10000;
	while (list_count(c) != want && it_now_ms() < until)
		it_sleep_ms(10);
	CHECK_EQ(list_count(c), want);
}

static void wait_list_idle(struct sbx_client *c, const char *id)
{
	uint64_t until = it_now_ms() + 10000;
	for (;;) {
		struct sbx_tunnel_info **v;
		size_t n;
		struct sbx_error err;
		CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
		unsigned active = 0;
		for (size_t i = 0; i < n; i++)
			if (strcmp(v[i]->id, id) == 0)
				active = v[i]->active;
		sbx_tunnels_free(v);
		if (active == 0)
			return;
		CHECKF(it_now_ms() < until, "tunnel %s still has %u connections", id, active);
		it_sleep_ms(10);
	}
}

/* ---- one connection moving len bytes each way through an echo ---- */

struct mover {
	unsigned port;
	size_t len;
	uint64_t seed;
	pthread_t th;
	int ok;
};

static void *mover_main(void *arg)
{
	struct mover *m = arg;
	uint8_t *out = malloc(m->len), *in = malloc(m->len);
	CHECK(out != NULL && in != NULL);
	it_fill(out, m->len, m->seed);
	int fd = tcp_connect(m->port);
	CHECKF(fd >= 0, "connect to the tunnel: %s", strerror(errno));
	long got = duplex(fd, out, m->len, in, m->len);
	CHECKF(got == (long)m->len, "connection %" PRIu64 ": got %ld bytes back of %zu (%s)", m->seed, got, m->len,
	       got < 0 ? strerror(errno) : "early EOF");
	CHECKF(memcmp(out, in, m->len) == 0, "connection %" PRIu64 ": bytes differ", m->seed);
	close(fd);
	free(out);
	free(in);
	m->ok = 1;
	return NULL;
}

static void move_many(unsigned port, unsigned n, size_t len)
{
	struct mover *m = calloc(n, sizeof(*m));
	CHECK(m != NULL);
	for (unsigned i = 0; i < n; i++) {
		m[i].port = port;
		m[i].len = len;
		m[i].seed = 1000 + i;
		CHECK(pthread_create(&m[i].th, NULL, mover_main, &m[i]) == 0);
	}
	for (unsigned i = 0; i < n; i++) {
		pthread_join(m[i].th, NULL);
		CHECK(m[i].ok);
	}
	free(m);
}

/* ---- cases ---- */

/* python3 -m http.server inside, on a port the kernel chose, fetched through a forward. */
static int case_http(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/www", it_dir());
	CHECK(mkdir(dir, 0755) == 0);
	size_t blen = 300 * KiB + 7;
	uint8_t *blob = malloc(blen);
	CHECK(blob != NULL);
	it_fill(blob, blen, 42);
	char path[1100];
	snprintf(path, sizeof(path), "%s/blob.bin", dir);
	CHECK_SBX(sbx_write_file_buf(c, NULL, path, 0, 0644, blob, blen, NULL, &err), &err);

	const char *argv[] = {"python3", "-u",        "-m",          "http.server", "0",
			      "--bind",  "127.0.0.1", "--directory", dir,           NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_proc *p;
	if (sbx_exec_start(c, NULL, &eo, 0, &p, &err) < 0) {
		sbx_client_close(c);
		fprintf(stderr, "SKIP: cannot run python3: %s\n", it_errstr(&err));
		return IT_SKIP;
	}
	/* "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..." */
	char line[512] = "";
	size_t ll = 0;
	unsigned port = 0;
	while (port == 0) {
		int chan;
		char buf[256];
		long n = sbx_proc_read(p, &chan, buf, sizeof(buf), &err);
		CHECKF(n > 0, "python3 -m http.server printed no port (%s)", n < 0 ? it_errstr(&err) : "EOF");
		if (chan != SBX_STDOUT)
			continue;
		size_t take = (size_t)n < sizeof(line) - 1 - ll ? (size_t)n : sizeof(line) - 1 - ll;
		memcpy(line + ll, buf, take);
		ll += take;
		line[ll] = '\0';
		const char *pp = strstr(line, " port ");
		if (pp != NULL && strchr(pp, '(') != NULL)
			port = (unsigned)atoi(pp + 6);
	}

	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, "127.0.0.1", port, NULL, &t, &err), &err);
	CHECK(sbx_tunnel_port(t) > 0);
	for (int round = 0; round < 3; round++) {
		int fd = tcp_connect(sbx_tunnel_port(t));
		CHECK(fd >= 0);
		const char req[] = "GET /blob.bin HTTP/1.0\r\nHost: x\r\n\r\n";
		send_all(fd, req, sizeof(req) - 1);
		size_t cap = blen + 4096;
		char *resp = malloc(cap);
		long n = recv_all(fd, resp, cap);
		close(fd);
		CHECKF(n > 0, "no response: %s", strerror(errno));
		CHECKF(strncmp(resp, "HTTP/1.0 200", 12) == 0, "response: %.40s", resp);
		char *body = memmem(resp, (size_t)n, "\r\n\r\n", 4);
		CHECK(body != NULL);
		body += 4;
		CHECK_EQ((long)(resp + n - body), (long)blen);
		CHECK(memcmp(body, blob, blen) == 0);
		free(resp);
	}
	sbx_tunnel_close(t);
	CHECK_SBX(sbx_proc_signal(p, SIGTERM, &err), &err);
	sbx_proc_free(p);
	free(blob);
	sbx_client_close(c);
	return 0;
}

/* A command inside reaches a host echo server through a reverse tunnel, byte-exact. */
static int case_reverse_exec(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv s;
	srv_start(&s, echo_fn);
	struct tlog l = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	o.log = tlog_cb;
	o.log_ud = &l;
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, "127.0.0.1", s.port, &o, &t, &err), &err);
	unsigned gp = sbx_tunnel_port(t);
	CHECK(gp > 0);
	char portstr[16];
	snprintf(portstr, sizeof(portstr), "%u", gp);
	const char *code = "import socket, sys, threading\n"
			   "data = bytes(range(256)) * 4096 + b'tail'\n"
			   "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
			   "def w():\n"
			   "    s.sendall(data); s.shutdown(socket.SHUT_WR)\n"
			   "th = threading.Thread(target=w); th.start()\n"
			   "got = bytearray()\n"
			   "while True:\n"
			   "    b = s.recv(65536)\n"
			   "    if not b: break\n"
			   "    got += b\n"
			   "th.join()\n"
			   "print('OK' if bytes(got) == data else 'BAD', len(got))\n";
	const char *argv[] = {"python3", "-c", code, portstr, NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_output out = {0};
	struct sbx_exit ex = SBX_EXIT_INIT;
	if (sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0) {
		sbx_tunnel_close(t);
		srv_stop(&s);
		sbx_client_close(c);
		fprintf(stderr, "SKIP: cannot run python3: %s\n", it_errstr(&err));
		return IT_SKIP;
	}
	CHECKF(ex.exit_code == 0, "python exited %d: %.*s", ex.exit_code, (int)out.err_len, out.err);
	CHECKF(out.out_len == strlen("OK 1048580\n") && memcmp(out.out, "OK 1048580\n", out.out_len) == 0,
	       "python printed '%.*s'", (int)out.out_len, out.out);
	sbx_output_free(&out);
	tlog_wait(&l, &l.close, 1);
	CHECK_EQ(tlog_get(&l, &l.open), 1);
	CHECK_EQ(tlog_get(&l, &l.fail), 0);
	sbx_tunnel_close(t);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* 100 concurrent connections, each moving 1 MiB both ways, byte-exact: forward and reverse. */
static int case_many(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv s;
	srv_start(&s, echo_fn);
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	move_many(sbx_tunnel_port(t), 100, MiB);
	wait_list_idle(c, sbx_tunnel_id(t));
	struct sbx_tunnel_info **v;
	size_t n;
	CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK_EQ(v[0]->total, 100);
	CHECK_EQ(v[0]->bytes_in, 100ull * MiB);
	CHECK_EQ(v[0]->bytes_out, 100ull * MiB);
	sbx_tunnels_free(v);
	sbx_tunnel_close(t);

	/* reverse: the connections come from "inside" */
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	move_many(sbx_tunnel_port(t), 100, MiB);
	wait_list_idle(c, sbx_tunnel_id(t));
	CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK_EQ(v[0]->total, 100);
	CHECK_EQ(v[0]->bytes_in, 100ull * MiB);
	sbx_tunnels_free(v);
	sbx_tunnel_close(t);
	srv_stop(&s);
	CHECK_EQ(atomic_load(&s.ended), 200);
	sbx_client_close(c);
	return 0;
}

/* The client half-closes first; the server answers after its EOF. */
static void answer_after_eof_fn(struct srv *s, int fd)
{
	(void)s;
	uint8_t buf[64 * KiB];
	size_t total = 0;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
		total += (size_t)n;
	}
	char msg[64];
	int m = snprintf(msg, sizeof(msg), "got %zu bytes", total);
	send_all(fd, msg, (size_t)m);
}

/* The server half-closes first (after a greeting); the client still sends, and the
 * server reports what it got on a side channel (atomic). */
static atomic_long late_bytes;
static void greet_then_read_fn(struct srv *s, int fd)
{
	(void)s;
	send_all(fd, "hello", 5);
	shutdown(fd, SHUT_WR);
	uint8_t buf[64 * KiB];
	long total = 0;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
		total += n;
	}
	atomic_store(&late_bytes, total);
}

static void half_close_both(unsigned port_a, unsigned port_b)
{
	/* host -> sandbox direction ends first */
	int fd = tcp_connect(port_a);
	CHECK(fd >= 0);
	uint8_t *data = malloc(MiB);
	it_fill(data, MiB, 7);
	send_all(fd, data, MiB);
	shutdown(fd, SHUT_WR);
	char resp[64];
	long n = recv_all(fd, resp, sizeof(resp) - 1);
	CHECK(n > 0);
	resp[n] = '\0';
	CHECKF(strcmp(resp, "got 1048576 bytes") == 0, "server said '%s'", resp);
	close(fd);

	/* sandbox -> host direction ends first; the other keeps flowing */
	atomic_store(&late_bytes, -1);
	fd = tcp_connect(port_b);
	CHECK(fd >= 0);
	n = recv_all(fd, resp, sizeof(resp) - 1);
	CHECK_EQ(n, 5);
	CHECK(memcmp(resp, "hello", 5) == 0);
	send_all(fd, data, MiB); /* after EOF from the server */
	shutdown(fd, SHUT_WR);
	uint64_t until = it_now_ms() + 10000;
	while (atomic_load(&late_bytes) < 0 && it_now_ms() < until)
		it_sleep_ms(5);
	CHECK_EQ(atomic_load(&late_bytes), MiB);
	close(fd);
	free(data);
}

static int case_half_close(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv a, b;
	srv_start(&a, answer_after_eof_fn);
	srv_start(&b, greet_then_read_fn);
	struct sbx_tunnel *ta, *tb;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, a.port, NULL, &ta, &err), &err);
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, b.port, NULL, &tb, &err), &err);
	half_close_both(sbx_tunnel_port(ta), sbx_tunnel_port(tb));
	sbx_tunnel_close(ta);
	sbx_tunnel_close(tb);
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, a.port, NULL, &ta, &err), &err);
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, b.port, NULL, &tb, &err), &err);
	half_close_both(sbx_tunnel_port(ta), sbx_tunnel_port(tb));
	sbx_tunnel_close(ta);
	sbx_tunnel_close(tb);
	srv_stop(&a);
	srv_stop(&b);
	sbx_client_close(c);
	return 0;
}

/* A server that streams until its peer goes away. */
static void stream_forever_fn(struct srv *s, int fd)
{
	uint8_t buf[16 * KiB];
	memset(buf, 'x', sizeof(buf));
	for (;;) {
		ssize_t w = send(fd, buf, sizeof(buf), MSG_NOSIGNAL);
		if (w <= 0) {
			atomic_store(&s->err, errno);
			return;
		}
		atomic_fetch_add(&s->sent, w);
	}
}

struct reader {
	int fd;
	pthread_t th;
	atomic_int done;
	long bytes;
	int err; /* 0: EOF */
};

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	uint8_t buf[16 * KiB];
	for (;;) {
		ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r->err = n < 0 ? errno : 0;
			break;
		}
		r->bytes += n;
	}
	atomic_store(&r->done, 1);
	return NULL;
}

static void readers_start(struct reader *r, int n, unsigned port)
{
	for (int i = 0; i < n; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].fd = tcp_connect(port);
		CHECK(r[i].fd >= 0);
		CHECK(pthread_create(&r[i].th, NULL, reader_main, &r[i]) == 0);
	}
}

static void readers_wait_flowing(struct reader *r, int n)
{
	uint64_t until = it_now_ms() + 10000;
	for (int i = 0; i < n; i++) {
		while (__atomic_load_n(&r[i].bytes, __ATOMIC_RELAXED) < 256 * KiB && it_now_ms() < until)
			it_sleep_ms(5);
		CHECKF(!atomic_load(&r[i].done), "connection %d ended early", i);
	}
}

static void readers_wait_end(struct reader *r, int n)
{
	uint64_t until = it_now_ms() + 10000;
	for (int i = 0; i < n; i++) {
		while (!atomic_load(&r[i].done) && it_now_ms() < until)
			it_sleep_ms(5);
		CHECKF(atomic_load(&r[i].done), "connection %d did not end with its tunnel", i);
		pthread_join(r[i].th, NULL);
		close(r[i].fd);
	}
}

/* Closing a tunnel ends its connections at both ends and leaves no fd in the shim. */
static int case_close_inflight(void)
{
	struct sbx_client *c = start();
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("s.sock")), NULL);
	struct sbx_error err;
	pid_t pid = (pid_t)sbx_client_server(c)->pid;
	unsigned base = it_count_fds(pid);
	struct srv s;
	srv_start(&s, stream_forever_fn);
	struct reader r[5];

	/* forward, closed through its handle */
	struct tlog l = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	o.log = tlog_cb;
	o.log_ud = &l;
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, s.port, &o, &t, &err), &err);
	unsigned hp = sbx_tunnel_port(t);
	readers_start(r, 5, hp);
	readers_wait_flowing(r, 5);
	CHECK(it_count_fds(pid) >= base + 5);
	sbx_tunnel_close(t);
	readers_wait_end(r, 5);
	uint64_t until = it_now_ms() + 10000;
	while (atomic_load(&s.ended) < 5 && it_now_ms() < until)
		it_sleep_ms(5);
	CHECK_EQ(atomic_load(&s.ended), 5);
	CHECK_EQ(tlog_get(&l, &l.close), 5);
	CHECK(!port_accepts(hp));
	wait_fds(pid, base);
	wait_list_count(c2, 0);

	/* reverse, closed by id from another client: its handle sees the end */
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	unsigned gp = sbx_tunnel_port(t);
	readers_start(r, 5, gp);
	readers_wait_flowing(r, 5);
	CHECK_EQ(sbx_tunnel_wait(t, 0, &err), 1);
	CHECK_SBX(sbx_tunnel_close_id(c2, NULL, sbx_tunnel_id(t), &err), &err);
	CHECK_EQ(sbx_tunnel_wait(t, 10000, &err), 0);
	readers_wait_end(r, 5);
	until = it_now_ms() + 10000;
	while (atomic_load(&s.ended) < 10 && it_now_ms() < until)
		it_sleep_ms(5);
	CHECK_EQ(atomic_load(&s.ended), 10);
	CHECK(!port_accepts(gp));
	sbx_tunnel_close(t);
	wait_fds(pid, base);
	wait_list_count(c2, 0);
	srv_stop(&s);
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

/* Nothing listens: the connection fails with ECONNREFUSED, reported per connection. */
static int case_refused(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct tlog l = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	o.log = tlog_cb;
	o.log_ud = &l;
	struct sbx_tunnel *t;

	/* forward: the shim's connect inside is refused; the host client is reset */
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, free_port(), &o, &t, &err), &err);
	int fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	char b[16];
	ssize_t n = recv(fd, b, sizeof(b), 0);
	CHECKF(n < 0 && errno == ECONNRESET, "host client: recv %zd (%s), want ECONNRESET", n, strerror(errno));
	close(fd);
	tlog_wait(&l, &l.fail, 1);
	CHECK_EQ(tlog_get(&l, &l.fail_kind), SBX_ERR_REMOTE);
	CHECK_EQ(tlog_get(&l, &l.fail_code), ECONNREFUSED);
	CHECK_EQ(tlog_get(&l, &l.open), 0);
	/* the tunnel itself goes on */
	CHECK_EQ(sbx_tunnel_wait(t, 0, &err), 1);
	sbx_tunnel_close(t);

	/* reverse: this side's connect is refused; the program inside is reset */
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, free_port(), &o, &t, &err), &err);
	fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	n = recv(fd, b, sizeof(b), 0);
	CHECKF(n < 0 && errno == ECONNRESET, "inside client: recv %zd (%s), want ECONNRESET", n, strerror(errno));
	close(fd);
	tlog_wait(&l, &l.fail, 2);
	CHECK_EQ(tlog_get(&l, &l.fail_kind), SBX_ERR_LOCAL);
	CHECK_EQ(tlog_get(&l, &l.fail_code), ECONNREFUSED);
	sbx_tunnel_close(t);

	/* a connection outside any tunnel, straight through the protocol: ERROR ECONNREFUSED */
	CHECK_EQ(list_count(c), 0);
	sbx_client_close(c);
	return 0;
}

/* A port that is taken: EADDRINUSE, and nothing is left behind. */
static int case_addrinuse(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	unsigned port = 0;
	int lfd = tcp_listen(&port);
	CHECK(lfd >= 0);
	struct sbx_tunnel *t = NULL;
	/* inside (reverse) */
	CHECK(sbx_reverse_open(c, "127.0.0.1", port, NULL, 1, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EADDRINUSE);
	CHECK(t == NULL);
	/* on the host (forward) */
	CHECK(sbx_forward_open(c, "127.0.0.1", port, NULL, 80, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EADDRINUSE);
	CHECK_EQ(list_count(c), 0);
	close(lfd);
	/* a port one tunnel holds is taken for the next */
	struct sbx_tunnel *t1;
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, 1, NULL, &t1, &err), &err);
	CHECK(sbx_reverse_open(c, NULL, sbx_tunnel_port(t1), NULL, 1, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EADDRINUSE);
	CHECK_CONTAINS(err.path, "127.0.0.1:");
	CHECK_EQ(list_count(c), 1);
	/* and free again once it is closed */
	unsigned p1 = sbx_tunnel_port(t1);
	sbx_tunnel_close(t1);
	uint64_t until = it_now_ms() + 5000;
	int rc;
	while ((rc = sbx_reverse_open(c, NULL, p1, NULL, 1, NULL, &t, &err)) < 0 && it_now_ms() < until)
		it_sleep_ms(20);
	CHECK_SBX(rc, &err);
	CHECK_EQ(sbx_tunnel_port(t), p1);
	sbx_tunnel_close(t);
	sbx_client_close(c);
	return 0;
}

/* Over exec: (the shim on stdin/stdout). */
static int case_stdio(void)
{
	char target[1200];
	snprintf(target, sizeof(target), "exec:%s --stdio --state-dir %s", SHIM_BIN, it_path("state"));
	struct sbx_client *c = it_connect(target, NULL);
	struct sbx_error err;
	struct srv s;
	srv_start(&s, echo_fn);
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	move_many(sbx_tunnel_port(t), 8, MiB);
	sbx_tunnel_close(t);
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	move_many(sbx_tunnel_port(t), 8, MiB);
	sbx_tunnel_close(t);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* One connection whose reader stalls: the other keeps moving; the stalled one is held
 * back at its source and resumes intact. */
#define BLAST (64u * MiB)
/* A connection's first byte: 'E' echoes; anything else is sent total bytes (it_fill with
 * seed, in sends of at most step), s->sent counting them. False for an echo. */
static bool blast(struct srv *s, int fd, size_t total, size_t step, int seed)
{
	char kind;
	if (recv(fd, &kind, 1, MSG_WAITALL) != 1)
		return false;
	if (kind == 'E') {
		echo_fn(s, fd);
		return false;
	}
	uint8_t *buf = malloc(total);
	CHECK(buf != NULL);
	it_fill(buf, total, seed);
	size_t off = 0;
	while (off < total) {
		ssize_t w = send(fd, buf + off, total - off < step ? total - off : step, MSG_NOSIGNAL);
		if (w <= 0)
			break;
		off += (size_t)w;
		atomic_store(&s->sent, (long)off);
	}
	free(buf);
	return true;
}

static void blast_or_echo_fn(struct srv *s, int fd)
{
	if (blast(s, fd, BLAST, 64 * KiB, 99))
		shutdown(fd, SHUT_WR);
}

static int case_slow_reader(void)
{
	struct sbx_client *c = start();
	struct srv s;
	srv_start(&s, blast_or_echo_fn);
	for (int kind = 0; kind < 2; kind++) {
		struct sbx_tunnel *t = open_kind(c, kind, s.port);
		atomic_store(&s.sent, 0);
		int a = tcp_connect(sbx_tunnel_port(t));
		CHECK(a >= 0);
		send_all(a, "B", 1); /* and then do not read */
		uint64_t until = it_now_ms() + 10000;
		while (atomic_load(&s.sent) < (long)(2 * MiB) && it_now_ms() < until)
			it_sleep_ms(5);
		/* the other connection moves 16 MiB each way while the first is stalled */
		int b = tcp_connect(sbx_tunnel_port(t));
		CHECK(b >= 0);
		send_all(b, "E", 1);
		size_t len = 16 * MiB;
		uint8_t *out = malloc(len), *in = malloc(len);
		it_fill(out, len, 5);
		uint64_t t0 = it_now_ms();
		CHECK_EQ(duplex(b, out, len, in, len), (long)len);
		CHECK(memcmp(out, in, len) == 0);
		uint64_t took = it_now_ms() - t0;
		CHECKF(took < 60000, "the second connection took %" PRIu64 " ms", took);
		close(b);
		/* the stalled one is held back at its source (kernel buffers and one window): it
		 * comes to a stop (the kernel's buffers may still be growing into their autotuned
		 * size when the other connection ends, so wait for 300 ms without a byte) */
		long held = atomic_load(&s.sent);
		uint64_t stop_by = it_now_ms() + 10000;
		for (;;) {
			it_sleep_ms(300);
			long now = atomic_load(&s.sent);
			if (now == held || it_now_ms() > stop_by)
				break;
			held = now;
		}
		CHECK_EQ(atomic_load(&s.sent), held);
		CHECKF(held < (long)(48 * MiB), "the stalled connection's source sent %ld bytes", held);
		/* and it resumes intact */
		uint8_t *want = malloc(BLAST), *got = malloc(BLAST);
		it_fill(want, BLAST, 99);
		long n = recv_all(a, got, BLAST);
		CHECK_EQ(n, (long)BLAST);
		CHECK(memcmp(want, got, BLAST) == 0);
		close(a);
		free(want);
		free(got);
		free(out);
		free(in);
		sbx_tunnel_close(t);
	}
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* Echo, reading slowly (4 KiB at a time, a pause now and then: some 60 MB/s at most),
 * so that what the client sends piles up in the shim. */
static void slow_echo_fn(struct srv *s, int fd)
{
	(void)s;
	uint8_t buf[4096];
	for (unsigned i = 0;; i++) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
			break;
		if (i % 16 == 15)
			it_sleep_ms(1); /* a slow consumer, not a wait for anything */
	}
	shutdown(fd, SHUT_WR);
}

/* The client's big DATA goes from the shim's connection into a pipe and on into the
 * socket inside (conn.c's data_pipe), small DATA through a buffer behind it. With a
 * target that reads slowly, the pipe holds bytes while more come, some frames find it
 * full and are buffered instead, and the FIN waits for both: what the target echoes is
 * byte-exact, in order, then EOF; both kinds of tunnel. */
static int case_slow_target(void)
{
	struct sbx_client *c = start();
	struct srv s;
	srv_start(&s, slow_echo_fn);
	size_t len = 12 * MiB;
	uint8_t *out = malloc(len), *in = malloc(len);
	CHECK(out != NULL && in != NULL);
	for (int kind = 0; kind < 2; kind++) {
		struct sbx_tunnel *t = open_kind(c, kind, s.port);
		it_fill(out, len, 123 + (uint64_t)kind);
		int fd = tcp_connect(sbx_tunnel_port(t));
		CHECK(fd >= 0);
		/* writes of mixed sizes, reading back as we go, then EOF: the FIN went through
		 * after the last byte */
		static const size_t sizes[] = {700 * KiB, 1, 3 * KiB, 256 * KiB + 7, 17, 1 * MiB, 60 * KiB, 5};
		CHECK_EQ(duplex_sized(fd, out, len, in, len, sizes, sizeof(sizes) / sizeof(sizes[0])), (long)len);
		CHECK(memcmp(out, in, len) == 0);
		close(fd);
		wait_list_idle(c, sbx_tunnel_id(t));
		sbx_tunnel_close(t);
	}
	free(out);
	free(in);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* Sandbox -> host the other way round: the target sends BLAST bytes (seed 99, in pieces
 * of 1 MiB) and the host side reads slowly, so that the relay's pipe (reader.c: big DATA
 * spliced from the connection into it, then on into the local socket) fills, some frames
 * find it full and come as items behind it; what arrives is byte-exact and in order,
 * then EOF. Both kinds of tunnel. */
static void blast_big_fn(struct srv *s, int fd)
{
	if (blast(s, fd, BLAST, MiB, 99))
		shutdown(fd, SHUT_WR);
}

static int case_slow_host(void)
{
	struct sbx_client *c = start();
	struct srv s;
	srv_start(&s, blast_big_fn);
	uint8_t *want = malloc(BLAST), *got = malloc(BLAST);
	CHECK(want != NULL && got != NULL);
	it_fill(want, BLAST, 99);
	for (int kind = 0; kind < 2; kind++) {
		struct sbx_tunnel *t = open_kind(c, kind, s.port);
		int fd = tcp_connect(sbx_tunnel_port(t));
		CHECK(fd >= 0);
		send_all(fd, "B", 1);
		size_t n = 0;
		for (unsigned i = 0;; i++) {
			ssize_t r = recv(fd, got + n, n < BLAST ? (BLAST - n < 4096 ? BLAST - n : 4096) : 1, 0);
			CHECKF(r >= 0, "recv after %zu of %zu: %s", n, (size_t)BLAST, strerror(errno));
			if (r == 0)
				break;
			n += (size_t)r;
			CHECKF(n <= BLAST, "more than the %zu bytes sent", (size_t)BLAST);
			if (i % 16 == 15)
				it_sleep_ms(1); /* a slow reader, not a wait for anything */
		}
		CHECK_EQ(n, (size_t)BLAST);
		CHECK(memcmp(want, got, BLAST) == 0);
		close(fd);
		wait_list_idle(c, sbx_tunnel_id(t));
		sbx_tunnel_close(t);
	}
	free(want);
	free(got);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* Bulk reads are spliced (socket -> pipe -> connection) on both sides, small ones
 * copied; a connection switches between the two as its reads grow and shrink. Writes of
 * mixed sizes (1 byte to 1 MiB, each sent whole and echoed before the next) come back
 * byte-exact both ways through both kinds of tunnel, and so do bytes sent at once with
 * the connect, before the shim has connected inside (held by the shim), with the FIN
 * right behind them. */
static int case_splice_mixed(void)
{
	struct sbx_client *c = start();
	struct srv s;
	srv_start(&s, echo_fn);
	static const size_t sizes[] = {1, 300 * KiB + 5, 3, 64 * KiB, 2, MiB, 4 * KiB - 1, 700 * KiB, 1};
	size_t cap = MiB;
	uint8_t *out = malloc(cap), *in = malloc(cap);
	CHECK(out != NULL && in != NULL);
	for (int kind = 0; kind < 2; kind++) {
		struct sbx_tunnel *t = open_kind(c, kind, s.port);
		int fd = tcp_connect(sbx_tunnel_port(t));
		CHECK(fd >= 0);
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			it_fill(out, sizes[i], 70 + i);
			send_all(fd, out, sizes[i]);
			size_t got = 0;
			while (got < sizes[i]) {
				ssize_t n = recv(fd, in + got, sizes[i] - got, 0);
				CHECKF(n > 0, "write %zu (%zu bytes): got %zu: %s", i, sizes[i], got,
				       n < 0 ? strerror(errno) : "EOF");
				got += (size_t)n;
			}
			CHECKF(memcmp(out, in, sizes[i]) == 0, "write %zu (%zu bytes): bytes differ", i, sizes[i]);
		}
		shutdown(fd, SHUT_WR);
		CHECK_EQ(recv_all(fd, in, cap), 0);
		close(fd);

		/* at once with the connect: 1 byte and FIN; then 900 KiB (beyond the first
		 * credit) and FIN */
		for (int round = 0; round < 2; round++) {
			size_t len = round == 0 ? 1 : 900 * KiB;
			it_fill(out, len, 90 + (uint64_t)round);
			fd = tcp_connect(sbx_tunnel_port(t));
			CHECK(fd >= 0);
			CHECK_EQ(duplex(fd, out, len, in, cap), (long)len);
			CHECK(memcmp(out, in, len) == 0);
			close(fd);
		}
		wait_list_idle(c, sbx_tunnel_id(t));
		sbx_tunnel_close(t);
	}
	free(out);
	free(in);
	srv_stop(&s);
	CHECK_EQ(atomic_load(&s.ended), 6);
	sbx_client_close(c);
	return 0;
}

/* libsbx's credit on a relayed connection (PROTOCOL.md 12.5), seen in its frame trace:
 * a connection that carries a few bytes each way gets no WINDOW from it at all; a bulk
 * one gets WINDOWs of at least 64 KiB, the first with the extra 256 KiB on top. */
struct grants {
	pthread_mutex_t mu;
	unsigned conn[4]; /* streams of the tunnel_connect requests, in order */
	int nconn;
	unsigned win_stream[256], win[256]; /* WINDOWs sent */
	int nwin;
};

static void grants_trace(void *ud, const char *line)
{
	struct grants *g = ud;
	unsigned stream, n;
	pthread_mutex_lock(&g->mu);
	if (sscanf(line, "> REQUEST stream=%u", &stream) == 1 && strstr(line, "tunnel_connect") != NULL && g->nconn < 4)
		g->conn[g->nconn++] = stream;
	else if (sscanf(line, "> WINDOW stream=%u len=4 +%u", &stream, &n) == 2 && g->nwin < 256) {
		g->win_stream[g->nwin] = stream;
		g->win[g->nwin++] = n;
	}
	pthread_mutex_unlock(&g->mu);
}

/* The WINDOWs sent on stream, in order, into v (at most cap); their count. */
static int grants_on(struct grants *g, unsigned stream, unsigned *v, int cap)
{
	int n = 0;
	pthread_mutex_lock(&g->mu);
	for (int i = 0; i < g->nwin; i++)
		if (g->win_stream[i] == stream && n < cap)
			v[n++] = g->win[i];
	pthread_mutex_unlock(&g->mu);
	return n;
}

static int case_grants(void)
{
	const char *sp = it_path("s.sock");
	daemon_ = it_daemon_start("shim", "--listen", it_unix_target(sp), "--state-dir", it_path("state"), NULL);
	static struct grants g = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.trace = grants_trace;
	o.trace_ud = &g;
	struct sbx_client *c;
	struct sbx_error err;
	CHECK_SBX(sbx_connect(it_unix_target(sp), &o, &c, &err), &err);
	struct srv s;
	srv_start(&s, echo_fn);
	struct sbx_tunnel *t = open_kind(c, 0, s.port);
	size_t big = 2 * MiB;
	uint8_t *out = malloc(big), *in = malloc(big);
	CHECK(out != NULL && in != NULL);
	/* 3 bytes there and back before either side ends: the bytes were written to our
	 * socket, and still no credit went back for them */
	int fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	send_all(fd, "abc", 3);
	size_t got = 0;
	while (got < 3) {
		ssize_t n = recv(fd, in + got, 3 - got, 0);
		CHECKF(n > 0, "echo: %s", n < 0 ? strerror(errno) : "EOF");
		got += (size_t)n;
	}
	CHECK(memcmp(in, "abc", 3) == 0);
	shutdown(fd, SHUT_WR);
	CHECK_EQ(recv_all(fd, in, big), 0);
	close(fd);
	wait_list_idle(c, sbx_tunnel_id(t));

	it_fill(out, big, 41);
	fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	CHECK_EQ(duplex(fd, out, big, in, big), (long)big);
	CHECK(memcmp(out, in, big) == 0);
	close(fd);
	wait_list_idle(c, sbx_tunnel_id(t));
	pthread_mutex_lock(&g.mu);
	CHECK_EQ(g.nconn, 2);
	pthread_mutex_unlock(&g.mu);
	unsigned v[256];
	CHECK_EQ(grants_on(&g, g.conn[0], v, 256), 0);
	int n = grants_on(&g, g.conn[1], v, 256);
	CHECKF(n >= 2, "%d WINDOWs for 2 MiB", n);
	CHECKF(v[0] >= 64 * KiB + 256 * KiB, "first WINDOW +%u", v[0]);
	uint64_t sum = v[0];
	for (int i = 1; i < n; i++) {
		CHECKF(v[i] >= 64 * KiB, "WINDOW %d: +%u", i, v[i]);
		sum += v[i];
	}
	/* credit only for bytes written to the local socket, plus the extra window */
	CHECKF(sum <= big + 256 * KiB, "%llu bytes of credit for %zu", (unsigned long long)sum, big);
	free(out);
	free(in);
	sbx_tunnel_close(t);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* The server inside sends 8 MiB and then resets its connection (RST) before the client
 * reads a byte: the client gets an exact prefix of those bytes and then ECONNRESET, never
 * a clean EOF; the next connection through the same tunnel works. */
#define RESET_BLAST (8u * MiB)
static void blast_then_reset_fn(struct srv *s, int fd)
{
	if (!blast(s, fd, RESET_BLAST, RESET_BLAST, 33))
		return;
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	/* srv_conn_main closes: RST */
}

static int case_reset_midway(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv s;
	srv_start(&s, blast_then_reset_fn);
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	int fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	send_all(fd, "B", 1);
	uint8_t *want = malloc(RESET_BLAST), *got = malloc(RESET_BLAST);
	CHECK(want != NULL && got != NULL);
	it_fill(want, RESET_BLAST, 33);
	uint64_t until = it_now_ms() + 20000;
	while (atomic_load(&s.ended) < 1 && it_now_ms() < until)
		it_sleep_ms(5);
	CHECK_EQ(atomic_load(&s.ended), 1);
	size_t n = 0;
	ssize_t r;
	for (;;) {
		r = recv(fd, got + n, RESET_BLAST - n > 0 ? RESET_BLAST - n : 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	int en = errno;
	CHECKF(r < 0 && en == ECONNRESET, "after %zu bytes: %s", n, r == 0 ? "EOF" : strerror(en));
	CHECK(n <= RESET_BLAST);
	CHECKF(memcmp(want, got, n) == 0, "the %zu bytes before the reset differ", n);
	close(fd);
	/* the tunnel goes on */
	fd = tcp_connect(sbx_tunnel_port(t));
	CHECK(fd >= 0);
	size_t len = 2 * MiB;
	it_fill(want, len, 34);
	want[0] = 'E';
	/* (the server takes the 'E' and echoes the rest) */
	CHECK_EQ(duplex(fd, want, len, got, len), (long)(len - 1));
	CHECK(memcmp(want + 1, got, len - 1) == 0);
	close(fd);
	free(want);
	free(got);
	sbx_tunnel_close(t);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* A client that vanishes (sbx reverse killed with SIGKILL) takes its tunnels along:
 * the port inside is free again. */
static int case_disconnect(void)
{
	struct sbx_client *c = start();
	char log[1100];
	snprintf(log, sizeof(log), "%s/cli.log", it_dir());
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	char port[16];
	snprintf(port, sizeof(port), "%u", free_port());
	const char *argv[] = {SBX_BIN, "-t", it_unix_target(it_path("s.sock")), "reverse", "0", port, NULL};
	pid_t pid;
	CHECK(posix_spawn(&pid, SBX_BIN, &fa, NULL, (char *const *)argv, environ) == 0);
	posix_spawn_file_actions_destroy(&fa);
	unsigned gp = 0;
	uint64_t until = it_now_ms() + 10000;
	while (gp == 0 && it_now_ms() < until) {
		FILE *f = fopen(log, "r");
		char line[512];
		while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
			const char *p = strstr(line, "listening on localhost:");
			if (p != NULL)
				gp = (unsigned)atoi(p + strlen("listening on localhost:"));
		}
		if (f != NULL)
			fclose(f);
		it_sleep_ms(10);
	}
	CHECKF(gp > 0, "sbx reverse printed no port");
	CHECK(port_accepts(gp));
	CHECK_EQ(list_count(c), 1);
	kill(pid, SIGKILL);
	int st;
	waitpid(pid, &st, 0);
	until = it_now_ms() + 10000;
	while ((port_accepts(gp) || list_count(c) != 0) && it_now_ms() < until)
		it_sleep_ms(10);
	CHECK(!port_accepts(gp));
	CHECK_EQ(list_count(c), 0);
	unsigned p = gp;
	int fd = tcp_listen(&p);
	CHECKF(fd >= 0, "port %u not free again: %s", gp, strerror(errno));
	close(fd);
	sbx_client_close(c);
	return 0;
}

/* Listing, closing by id, bad arguments. */
static int case_list_close(void)
{
	struct sbx_client *c = start();
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("s.sock")), NULL);
	struct sbx_error err;
	struct sbx_tunnel *f, *r, *t = NULL;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, "127.0.0.1", 8080, NULL, &f, &err), &err);
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, "localhost", 3000, NULL, &r, &err), &err);
	CHECK(strcmp(sbx_tunnel_id(f), sbx_tunnel_id(r)) != 0);
	struct sbx_tunnel_info **v;
	size_t n;
	CHECK_SBX(sbx_tunnels_list(c2, NULL, &v, &n, &err), &err);
	CHECK_EQ(n, 2);
	CHECK(strcmp(v[0]->id, sbx_tunnel_id(f)) == 0);
	CHECK_EQ(v[0]->kind, SBX_TUNNEL_FORWARD);
	CHECK(strcmp(v[0]->host, "127.0.0.1") == 0);
	CHECK_EQ(v[0]->port, 8080);
	char want[64];
	snprintf(want, sizeof(want), "127.0.0.1:%u", sbx_tunnel_port(f));
	CHECK(strcmp(v[0]->remote, want) == 0);
	CHECK(strcmp(v[1]->id, sbx_tunnel_id(r)) == 0);
	CHECK_EQ(v[1]->kind, SBX_TUNNEL_REVERSE);
	CHECK_EQ(v[1]->port, sbx_tunnel_port(r));
	CHECK(strcmp(v[1]->remote, "127.0.0.1:3000") == 0);
	sbx_tunnels_free(v);

	CHECK(sbx_tunnel_close_id(c2, NULL, "t999999", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK_SBX(sbx_tunnel_close_id(c2, NULL, sbx_tunnel_id(r), &err), &err);
	CHECK_EQ(sbx_tunnel_wait(r, 10000, &err), 0);
	wait_list_count(c2, 1);
	sbx_tunnel_close(r);

	/* bad arguments: clear errors, nothing created */
	CHECK(sbx_forward_open(c, NULL, 0, NULL, 0, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_forward_open(c, NULL, 70000, NULL, 80, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_reverse_open(c, NULL, 0, NULL, 0, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(sbx_reverse_open(c, "sandbox.example", 0, NULL, 80, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK(sbx_forward_open(c, NULL, 0, "not-an-ip", 80, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK(sbx_reverse_open(c, "10.255.255.1", 0, NULL, 80, NULL, &t, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EADDRNOTAVAIL);
	CHECK(t == NULL);
	CHECK_EQ(list_count(c2), 1);
	sbx_tunnel_close(f);
	wait_list_count(c2, 0);
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

/* A tunnel closed from its own log callback (the thread frees the handle), and one
 * closed from another thread than the one that opened it. */
static atomic_int self_closed;
static void close_on_open_cb(void *ud, const struct sbx_tunnel *t, const struct sbx_tunnel_event *ev)
{
	(void)ud;
	if (ev->type == SBX_TUNNEL_OPEN && !atomic_exchange(&self_closed, 1))
		sbx_tunnel_close((struct sbx_tunnel *)(uintptr_t)t);
}

static void *closer_main(void *arg)
{
	sbx_tunnel_close(arg);
	return NULL;
}

static int case_threads(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv s;
	srv_start(&s, echo_fn);
	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	o.log = close_on_open_cb;
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, s.port, &o, &t, &err), &err);
	unsigned hp = sbx_tunnel_port(t);
	int fd = tcp_connect(hp);
	CHECK(fd >= 0);
	char b[8];
	ssize_t n = recv(fd, b, sizeof(b), 0); /* the connection ends with its tunnel */
	CHECK(n <= 0);
	close(fd);
	CHECK(atomic_load(&self_closed));
	wait_list_count(c, 0);
	uint64_t until = it_now_ms() + 5000;
	while (port_accepts(hp) && it_now_ms() < until)
		it_sleep_ms(10);
	CHECK(!port_accepts(hp));

	/* opened here, used by other threads, closed by yet another */
	CHECK_SBX(sbx_reverse_open(c, NULL, 0, NULL, s.port, NULL, &t, &err), &err);
	move_many(sbx_tunnel_port(t), 4, 256 * KiB);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, closer_main, t) == 0);
	/* meanwhile, other calls on the same client go on */
	uint64_t rtt;
	CHECK_SBX(sbx_ping(c, NULL, &rtt, &err), &err);
	pthread_join(th, NULL);
	wait_list_count(c, 0);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* IPv6 inside: [::1] and ::1 (skipped where the host has no IPv6 loopback). */
static int case_ipv6(void)
{
	int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	if (probe < 0 || bind(probe, (struct sockaddr *)&a6, sizeof(a6)) < 0) {
		if (probe >= 0)
			close(probe);
		fprintf(stderr, "SKIP: no IPv6 loopback\n");
		return IT_SKIP;
	}
	close(probe);
	struct sbx_client *c = start();
	struct sbx_error err;
	struct srv s;
	srv_start(&s, echo_fn);
	struct sbx_tunnel *t;
	CHECK_SBX(sbx_reverse_open(c, "[::1]", 0, NULL, s.port, NULL, &t, &err), &err);
	struct sbx_tunnel_info **v;
	size_t n;
	CHECK_SBX(sbx_tunnels_list(c, NULL, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK(strcmp(v[0]->host, "::1") == 0);
	sbx_tunnels_free(v);
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	a6.sin6_port = htons((uint16_t)sbx_tunnel_port(t));
	CHECK(connect(fd, (struct sockaddr *)&a6, sizeof(a6)) == 0);
	uint8_t out[4096], in[4096];
	it_fill(out, sizeof(out), 3);
	CHECK_EQ(duplex(fd, out, sizeof(out), in, sizeof(in)), (long)sizeof(in));
	CHECK(memcmp(out, in, sizeof(in)) == 0);
	close(fd);
	sbx_tunnel_close(t);
	srv_stop(&s);
	sbx_client_close(c);
	return 0;
}

/* ---- the protocol itself, with raw frames ---- */

static void raw_request(int fd, uint32_t stream, const Shim__V1__Request *req)
{
	uint8_t buf[512];
	size_t n = shim__v1__request__get_packed_size(req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

/* The next frame on stream (others, such as WINDOW, are skipped); its payload is
 * malloc'd. */
static uint8_t *raw_next(int fd, uint32_t stream, uint8_t want_type, size_t *len)
{
	for (;;) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF waiting for a frame on stream %u", stream);
		if (h.stream == stream && h.type == want_type) {
			*len = h.len;
			return p;
		}
		if (h.stream == stream && (h.type == FRAME_ERROR || h.type == FRAME_END) && want_type != h.type) {
			char msg[256] = "";
			if (h.type == FRAME_ERROR)
				raw_error_code(p, h.len, msg, sizeof(msg));
			it_fail(__FILE__, __LINE__, "stream %u ended with %s (%s), want %s", stream,
				frame_type_name(h.type), msg, frame_type_name(want_type));
		}
		free(p);
	}
}

static Shim__V1__Event *raw_event(int fd, uint32_t stream)
{
	size_t len;
	uint8_t *p = raw_next(fd, stream, FRAME_EVENT, &len);
	Shim__V1__Event *ev = shim__v1__event__unpack(NULL, len, p);
	free(p);
	CHECK(ev != NULL);
	return ev;
}

static int raw_error(int fd, uint32_t stream)
{
	size_t len;
	char msg[256];
	uint8_t *p = raw_next(fd, stream, FRAME_ERROR, &len);
	int code = raw_error_code(p, len, msg, sizeof(msg));
	free(p);
	return code;
}

static void raw_claim(int fd, uint32_t stream, const char *id, uint64_t conn, bool refuse)
{
	Shim__V1__TunnelAcceptRequest ar = SHIM__V1__TUNNEL_ACCEPT_REQUEST__INIT;
	ar.tunnel_id = (char *)(uintptr_t)id;
	ar.conn_id = conn;
	ar.has_refuse = refuse;
	ar.refuse = refuse;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_ACCEPT;
	req.tunnel_accept = &ar;
	raw_request(fd, stream, &req);
}

static uint64_t raw_incoming(int fd)
{
	Shim__V1__Event *ev = raw_event(fd, 1);
	CHECK(ev->kind_case == SHIM__V1__EVENT__KIND_TUNNEL_INCOMING);
	uint64_t id = ev->tunnel_incoming->conn_id;
	CHECK(ev->tunnel_incoming->peer != NULL && strncmp(ev->tunnel_incoming->peer, "127.0.0.1:", 10) == 0);
	shim__v1__event__free_unpacked(ev, NULL);
	return id;
}

/* Unclaimed connections expire (reset), claims of another client's tunnel or of an
 * expired connection fail with ENOENT, refuse resets, CANCEL ends the tunnel and its
 * connections. */
static int case_raw(void)
{
	struct sbx_client *c = start();
	const char *sp = it_path("s.sock");
	int fd = raw_connect_unix(sp);
	raw_hello(fd, NULL);
	Shim__V1__TunnelListenRequest lr = SHIM__V1__TUNNEL_LISTEN_REQUEST__INIT;
	lr.port = 0;
	lr.has_accept_timeout_ms = 1;
	lr.accept_timeout_ms = 300;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_LISTEN;
	req.tunnel_listen = &lr;
	raw_request(fd, 1, &req);
	Shim__V1__Event *ev = raw_event(fd, 1);
	CHECK(ev->kind_case == SHIM__V1__EVENT__KIND_TUNNEL_READY);
	char id[16];
	snprintf(id, sizeof(id), "%s", ev->tunnel_ready->tunnel_id);
	unsigned port = ev->tunnel_ready->port;
	/* no host: localhost, i.e. 127.0.0.1 and ::1 both (issue 17.7) */
	CHECK(strcmp(ev->tunnel_ready->host, "localhost") == 0);
	shim__v1__event__free_unpacked(ev, NULL);

	/* not claimed: reset after the accept timeout */
	int in1 = tcp_connect(port);
	CHECK(in1 >= 0);
	uint64_t c1 = raw_incoming(fd);
	CHECK_EQ(c1, 1);
	uint64_t t0 = it_now_ms();
	char b[8];
	ssize_t n = recv(in1, b, sizeof(b), 0);
	CHECKF(n < 0 && errno == ECONNRESET, "unclaimed connection: recv %zd (%s)", n, strerror(errno));
	CHECK(it_now_ms() - t0 >= 250);
	close(in1);
	raw_claim(fd, 3, id, c1, false);
	CHECK_EQ(raw_error(fd, 3), ENOENT);

	/* claimed: relayed both ways */
	int in2 = tcp_connect(port);
	uint64_t c2 = raw_incoming(fd);
	CHECK_EQ(c2, 2);
	raw_claim(fd, 5, id, c2, false);
	ev = raw_event(fd, 5);
	CHECK(ev->kind_case == SHIM__V1__EVENT__KIND_TUNNEL_CONNECTED);
	shim__v1__event__free_unpacked(ev, NULL);
	raw_send(fd, 5, FRAME_DATA, 0, "hi", 2);
	CHECK_EQ(recv(in2, b, 2, MSG_WAITALL), 2);
	CHECK(memcmp(b, "hi", 2) == 0);
	send_all(in2, "yo", 2);
	size_t len;
	uint8_t *p = raw_next(fd, 5, FRAME_DATA, &len);
	CHECK(len == 2 && memcmp(p, "yo", 2) == 0);
	free(p);

	/* refused: reset inside, the claim ends with done */
	int in3 = tcp_connect(port);
	uint64_t c3 = raw_incoming(fd);
	raw_claim(fd, 7, id, c3, true);
	p = raw_next(fd, 7, FRAME_END, &len);
	free(p);
	n = recv(in3, b, sizeof(b), 0);
	CHECKF(n < 0 && errno == ECONNRESET, "refused connection: recv %zd (%s)", n, strerror(errno));
	close(in3);

	/* a forward connection cannot join a reverse tunnel; another client cannot claim */
	Shim__V1__TunnelConnectRequest cr = SHIM__V1__TUNNEL_CONNECT_REQUEST__INIT;
	cr.tunnel_id = id;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_CONNECT;
	req.tunnel_connect = &cr;
	raw_request(fd, 9, &req);
	CHECK_EQ(raw_error(fd, 9), ENOENT);
	int fd2 = raw_connect_unix(sp);
	raw_hello(fd2, NULL);
	int in4 = tcp_connect(port);
	uint64_t c4 = raw_incoming(fd);
	raw_claim(fd2, 1, id, c4, false);
	CHECK_EQ(raw_error(fd2, 1), ENOENT);
	close(fd2);
	close(in4);

	/* CANCEL: the tunnel ends, and with it the relayed connection */
	raw_send(fd, 1, FRAME_CANCEL, 0, NULL, 0);
	int e1 = 0, e5 = 0;
	while (e1 == 0 || e5 == 0) {
		struct frame_hdr h;
		CHECK(raw_recv(fd, &h, &p, 10000) == 1);
		char msg[256];
		if (h.type == FRAME_ERROR && h.stream == 1)
			e1 = raw_error_code(p, h.len, msg, sizeof(msg));
		else if (h.type == FRAME_ERROR && h.stream == 5)
			e5 = raw_error_code(p, h.len, msg, sizeof(msg));
		free(p);
	}
	CHECK_EQ(e1, ECANCELED);
	CHECK_EQ(e5, ECONNABORTED);
	n = recv(in2, b, sizeof(b), 0);
	CHECK(n <= 0);
	close(in2);
	CHECK(!port_accepts(port));
	close(fd);
	wait_list_count(c, 0);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	static const struct it_case cases[] = {
		{"http", case_http},
		{"reverse_exec", case_reverse_exec},
		{"many", case_many},
		{"half_close", case_half_close},
		{"close_inflight", case_close_inflight},
		{"refused", case_refused},
		{"addrinuse", case_addrinuse},
		{"stdio", case_stdio},
		{"slow_reader", case_slow_reader},
		{"splice_mixed", case_splice_mixed},
		{"grants", case_grants},
		{"slow_target", case_slow_target},
		{"slow_host", case_slow_host},
		{"reset_midway", case_reset_midway},
		{"disconnect", case_disconnect},
		{"list_close", case_list_close},
		{"threads", case_threads},
		{"ipv6", case_ipv6},
		{"raw", case_raw},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
