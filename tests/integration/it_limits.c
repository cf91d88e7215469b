/* it_limits.c: --max-connections: the connection over the limit is refused with EAGAIN at HELLO, and room comes back;
 * --max-pending: strangers before HELLO take their listener's budget only, and the HELLO deadline;
 * the fd budget under a small RLIMIT_NOFILE; refusals logged at most once a second. */
#include "harness.h"
#include "rawclient.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned connections(struct sbx_client *c)
{
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	return in.connections;
}

static int case_max_connections(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--listen", "tcp:127.0.0.1:0",
					      "--insecure-no-token", "--max-connections", "2", NULL);
	const char *target = it_unix_target(sock);
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	struct sbx_client *a = it_connect(target, NULL);
	struct sbx_client *b = it_connect(target, NULL);

	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.connect_timeout_ms = 5000;
	struct sbx_error err;
	for (int i = 0; i < 40; i++) {
		struct sbx_client *c = NULL;
		memset(&err, 0, sizeof(err));
		/* the limit is the daemon's, whatever the listener */
		CHECK(sbx_connect(i % 2 ? tcp : target, &o, &c, &err) < 0);
		CHECK(c == NULL);
		CHECK_ERR(&err, SBX_ERR_CONNECT, EAGAIN);
		CHECK_CONTAINS(err.message, "too many connections (limit 2)");
	}
	/* a refused connection is not counted, and the two admitted still work */
	CHECK_EQ(connections(b), 2);
	CHECK_SBX(sbx_ping(a, NULL, NULL, &err), &err);

	/* close one; once the daemon has seen it go, a new connection is admitted */
	sbx_client_close(a);
	uint64_t deadline = it_now_ms() + 5000;
	while (connections(b) != 1) {
		CHECKF(it_now_ms() < deadline, "the daemon still counts 2 connections after one closed");
		it_sleep_ms(5);
	}
	struct sbx_client *c = it_connect(target, NULL);
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	CHECK_EQ(connections(c), 2);

	/* full again */
	CHECK(sbx_connect(target, &o, &a, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EAGAIN);
	sbx_client_close(b);
	sbx_client_close(c);
	return 0;
}

/* ---- the fd budget (issue 16) ---- */

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The N of the daemon's "--max-connections 1024 lowered to N" (0: none logged). */
static unsigned lowered_to(struct it_daemon *d)
{
	char *log = it_daemon_log(d);
	const char *p = strstr(log, "--max-connections 1024 lowered to ");
	unsigned n = 0;
	if (p != NULL)
		sscanf(p + strlen("--max-connections 1024 lowered to "), "%u", &n);
	free(log);
	return n;
}

/* The soft and hard "Max open files" of pid. */
static void nofile_of(pid_t pid, unsigned long *soft, unsigned long *hard)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	char line[256];
	*soft = *hard = 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Max open files", 14) == 0)
			sscanf(line + 14, "%lu %lu", soft, hard);
	fclose(f);
}

/* A daemon run under prlimit --nofile=SPEC (soft[:hard]), with more options after its --listen. */
static struct it_daemon *start_limited(const char *spec, const char *sock, const char *const *extra)
{
	static char arg[64];
	snprintf(arg, sizeof(arg), "--nofile=%s", spec);
	const char *argv[16] = {"prlimit", arg, SHIM_BIN, "--listen", it_unix_target(sock)};
	unsigned n = 5;
	for (; extra != NULL && *extra != NULL && n < 15; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	return it_daemon_start_argv("shim", argv);
}

/* A raw connection beyond the limit: the ERROR its HELLO gets (the admitted budget is
 * checked at HELLO), and how long it took from connect() (microseconds). */
static double refused_in(const char *sock, int want_code, const char *want_msg)
{
	double t0 = now_us();
	int fd = raw_connect_unix(sock);
	raw_send(fd, 0, FRAME_HELLO, 0, (const uint8_t[]){0x08, 0x01}, 2);
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 5000) == 1, "EOF instead of a refusal");
	double us = now_us() - t0;
	CHECKF(h.type == FRAME_ERROR && h.stream == 0, "got %s on stream %u, want a refusal", frame_type_name(h.type),
	       h.stream);
	char msg[256];
	int code = raw_error_code(p, h.len, msg, sizeof(msg));
	free(p);
	CHECKF(code == want_code && strcmp(msg, want_msg) == 0, "refused with %d '%s', want %d '%s'", code, msg,
	       want_code, want_msg);
	CHECKF(raw_recv(fd, &h, &p, 5000) == 0, "a frame after the refusal");
	close(fd);
	return us;
}

/* Under RLIMIT_NOFILE `nofile`: the connection limit is lowered to what the fds
 * allow; that many clients are served (each reading a file), the next ones refused at
 * once with EAGAIN, logged at most once a second. */
static void budget_case(unsigned nofile)
{
	char spec[16];
	snprintf(spec, sizeof(spec), "%u", nofile);
	const char *sock = it_path("s");
	struct it_daemon *d = start_limited(spec, sock, NULL);
	unsigned limit = lowered_to(d);
	CHECKF(limit > 0, "no 'lowered to' line in the log under --nofile=%u", nofile);
	CHECK(limit * 8 < nofile);
	const char *file = it_path("f");
	it_write_file(file, "some bytes");

	struct sbx_client *cl[256];
	CHECK(limit <= 256);
	for (unsigned i = 0; i < limit; i++)
		cl[i] = it_connect(it_unix_target(sock), NULL);
	char want[64];
	snprintf(want, sizeof(want), "too many connections (limit %u)", limit);
	double worst = 0, total = 0;
	const int tries = 50;
	for (int i = 0; i < tries; i++) {
		double us = refused_in(sock, EAGAIN, want);
		total += us;
		if (us > worst)
			worst = us;
	}
	/* the refused did not disturb the admitted: each reads a file (an fd of its own) */
	struct sbx_error err;
	for (unsigned i = 0; i < limit; i++) {
		void *data;
		size_t len;
		CHECK_SBX(sbx_read_file_alloc(cl[i], NULL, file, 1 << 20, &data, &len, &err), &err);
		CHECK(len == 10 && memcmp(data, "some bytes", 10) == 0);
		free(data);
	}
	/* 50 refusals in well under a second: one line, then one with the count */
	it_daemon_wait_log(d, "more connections refused in the last second", 3000);
	char *log = it_daemon_log(d);
	unsigned lines = 0;
	for (const char *p = log; (p = strstr(p, "refusing a connection on")) != NULL; p++)
		lines++;
	free(log);
	CHECKF(lines <= 3, "%u refusal lines for %d refusals", lines, tries);
	printf("--nofile=%u: --max-connections lowered to %u; %d clients beyond it got EAGAIN '%s' in %.0f us on "
	       "average, %.0f us at most; %u log lines for them\n",
	       nofile, limit, tries, want, total / tries, worst, lines);
	for (unsigned i = 0; i < limit; i++)
		sbx_client_close(cl[i]);
	/* room comes back */
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		struct sbx_client *c = NULL;
		struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
		if (sbx_connect(it_unix_target(sock), &o, &c, &err) == 0) {
			sbx_client_close(c);
			break;
		}
		CHECKF(it_now_ms() < deadline, "no connection admitted after the others closed: %s", it_errstr(&err));
		it_sleep_ms(10);
	}
}

static int case_nofile_64(void)
{
	budget_case(64);
	return 0;
}

static int case_nofile_128(void)
{
	budget_case(128);
	return 0;
}

/* The soft limit is raised to the hard one at start, and the budget follows it. */
static int case_nofile_raise(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_limited("64:256", sock, NULL);
	unsigned long soft, hard;
	nofile_of(d->pid, &soft, &hard);
	CHECK_EQ(soft, 256);
	CHECK_EQ(hard, 256);
	unsigned limit = lowered_to(d);
	CHECKF(limit > 8 && limit < 32, "limit %u for 256 fds", limit);
	/* and an explicit --max-connections over the budget is a warning */
	const char *s2 = it_path("s2");
	static const char *const extra[] = {"--max-connections", "1000", NULL};
	struct it_daemon *d2 = start_limited("64", s2, extra);
	it_daemon_wait_log(d2, "warn: --max-connections 1000 lowered to", 2000);
	return 0;
}

/* The fds run out below the connection limit (detached processes hold them): a new
 * client is still refused clearly, with the spare fd, and admitted again once fds are
 * free. */
static int case_emfile(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = start_limited("128", sock, NULL);
	unsigned limit = lowered_to(d);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_error err;
	char ids[128][64];
	unsigned n = 0;
	for (; n < 128; n++) {
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		static const char *const argv[] = {"sleep", "100", NULL};
		eo.argv = argv;
		eo.ring_bytes = 4096;
		struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
		if (sbx_spawn(c, NULL, &eo, &pi, &err) < 0) {
			CHECKF(err.code == EMFILE, "spawn failed with %s, want EMFILE", it_errstr(&err));
			break;
		}
		snprintf(ids[n], sizeof(ids[n]), "%s", pi.id);
	}
	CHECK(n > 0 && n < 128);
	/* what fds are left go to connections; then the refusal comes from the spare */
	int fds[64];
	unsigned nfd = 0;
	double us = 0;
	for (;;) {
		CHECKF(nfd + 1 < limit, "admitted %u connections with the fds taken", nfd);
		double t0 = now_us();
		int fd = raw_connect_unix(sock);
		struct frame_hdr h;
		uint8_t *p;
		/* an admitted connection is silent until its HELLO: send one (a refused one may
		 * be closed already, its refusal waiting to be read) */
		raw_try_send(fd, 0, FRAME_HELLO, 0, (const uint8_t[]){0x08, 0x01}, 2);
		CHECKF(raw_recv(fd, &h, &p, 5000) == 1, "EOF instead of HELLO_OK or a refusal");
		if (h.type == FRAME_HELLO_OK) {
			free(p);
			fds[nfd++] = fd;
			continue;
		}
		us = now_us() - t0;
		char msg[256];
		int code = raw_error_code(p, h.len, msg, sizeof(msg));
		free(p);
		CHECKF(code == EAGAIN && strcmp(msg, "too many connections: the shim is out of file descriptors") == 0,
		       "refused with %d '%s'", code, msg);
		close(fd);
		break;
	}
	it_daemon_wait_log(d, "refusing a connection on", 2000);
	char *log = it_daemon_log(d);
	CHECKF(strstr(log, "pausing for 100 ms") == NULL, "accepting paused: the spare fd was not there");
	free(log);
	printf("--nofile=128: %u detached processes and %u more connections took the fds; the next client got EAGAIN "
	       "'out of file descriptors' in %.0f us (connection limit %u)\n",
	       n, nfd, us, limit);
	/* the admitted are still served */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	for (unsigned i = 0; i < n; i++)
		CHECK_SBX(sbx_rmproc(c, NULL, ids[i], 1, &err), &err);
	for (unsigned i = 0; i < nfd; i++)
		close(fds[i]);
	/* fds free again: admitted, and the spare is back (a second exhaustion would be
	 * refused as clearly: it is the same path) */
	struct sbx_client *c2 = it_connect(it_unix_target(sock), NULL);
	CHECK_SBX(sbx_ping(c2, NULL, NULL, &err), &err);
	sbx_client_close(c2);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* ---- strangers before HELLO (issue 17.4) ---- */

/* A blocking TCP connection to 127.0.0.1:port that says nothing. */
static int tcp_connect_raw(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s", strerror(errno));
	return fd;
}

/* The first frame on fd within timeout_ms is an ERROR on stream 0 with want_code and
 * want_msg, then EOF; returns the microseconds from t0. */
static double expect_refusal(int fd, double t0, int want_code, const char *want_msg, unsigned timeout_ms)
{
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, timeout_ms) == 1, "EOF instead of a refusal");
	double us = now_us() - t0;
	CHECKF(h.type == FRAME_ERROR && h.stream == 0, "got %s on stream %u, want a refusal", frame_type_name(h.type),
	       h.stream);
	char msg[256];
	int code = raw_error_code(p, h.len, msg, sizeof(msg));
	free(p);
	CHECKF(code == want_code && strcmp(msg, want_msg) == 0, "refused with %d '%s', want %d '%s'", code, msg,
	       want_code, want_msg);
	CHECKF(raw_recv(fd, &h, &p, 5000) == 0, "a frame after the refusal");
	close(fd);
	return us;
}

static void wait_connections(struct sbx_client *c, unsigned n)
{
	uint64_t deadline = it_now_ms() + 10000;
	unsigned got;
	while ((got = connections(c)) != n) {
		CHECKF(it_now_ms() < deadline, "the daemon counts %u connections, want %u", got, n);
		it_sleep_ms(5);
	}
}

/* A silent unix connection to path. */
static int unix_connect_raw(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	CHECK(strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s", strerror(errno));
	return fd;
}

/* A unix socket's peers passed its mode and the credential check: a host's burst of
 * them before HELLO may be as large as --max-connections, whatever --max-pending
 * (which is for strangers on TCP and vsock) says. */
static int case_unix_burst(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--max-pending", "2",
					      "--max-connections", "16", NULL);
	int fds[10];
	for (int i = 0; i < 10; i++)
		fds[i] = unix_connect_raw(sock);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	wait_connections(c, 11);
	for (int i = 0; i < 10; i++) {
		struct pollfd p = {.fd = fds[i], .events = POLLIN};
		CHECKF(poll(&p, 1, 0) == 0, "silent unix connection %d was refused", i);
	}
	/* and each of them can still complete its HELLO */
	for (int i = 0; i < 10; i++)
		close(fds[i]);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	it_daemon_stop(d);
	printf("  10 silent unix peers with --max-pending 2: none refused, the 11th admitted\n");
	return 0;
}

/* Eight silent TCP peers and --max-connections 8: the unix socket's clients are still
 * admitted (strangers take their listener's pre-HELLO budget, not the admitted one);
 * the ninth stranger on TCP is refused at accept; the admitted budget is checked at
 * HELLO, after the token. */
static int case_strangers(void)
{
	const char *sock = it_path("s");
	const char *tok = it_path("token");
	it_write_file(tok, "t0ken\n");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--listen", "tcp:127.0.0.1:0",
					      "--token-file", tok, "--max-connections", "8", "--max-pending", "8",
					      "--handshake-timeout", "60", NULL);
	unsigned port = it_daemon_tcp_port(d);
	int silent[8];
	for (int i = 0; i < 8; i++)
		silent[i] = tcp_connect_raw(port);
	struct sbx_client *c[8];
	c[0] = it_connect(it_unix_target(sock), "t0ken");
	/* every stranger is in: 8 of them and this client */
	wait_connections(c[0], 9);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c[0], NULL, NULL, &err), &err);

	/* the ninth stranger on TCP: refused at once, without waiting for its HELLO */
	double worst = 0;
	for (int i = 0; i < 20; i++) {
		double t0 = now_us();
		int fd = tcp_connect_raw(port);
		double us = expect_refusal(fd, t0, EAGAIN,
					   "too many connections before HELLO on this listener (limit 8)", 5000);
		if (us > worst)
			worst = us;
	}
	/* an SDK client there sees the same */
	struct sbx_client *x = NULL;
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.token = "t0ken";
	o.connect_timeout_ms = 5000;
	CHECK(sbx_connect(it_tcp_target(port), &o, &x, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EAGAIN);
	CHECK_CONTAINS(err.message, "too many connections before HELLO on this listener (limit 8)");

	/* the unix socket fills the admitted budget, whatever waits on TCP */
	for (int i = 1; i < 8; i++) {
		c[i] = it_connect(it_unix_target(sock), "t0ken");
		CHECK_SBX(sbx_ping(c[i], NULL, NULL, &err), &err);
	}
	wait_connections(c[0], 16);
	/* one more with the right token: refused at HELLO (EAGAIN); a wrong token is still
	 * told so, not that the daemon is full */
	double t0 = now_us();
	CHECK(sbx_connect(it_unix_target(sock), &o, &x, &err) < 0);
	double full_us = now_us() - t0;
	CHECK_ERR(&err, SBX_ERR_CONNECT, EAGAIN);
	CHECK_CONTAINS(err.message, "too many connections (limit 8)");
	o.token = "wrong";
	CHECK(sbx_connect(it_unix_target(sock), &o, &x, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "bad token");
	o.token = "t0ken";
	/* the strangers never got a slot: they are still waiting, unanswered */
	for (int i = 0; i < 8; i++) {
		struct pollfd pfd = {.fd = silent[i], .events = POLLIN};
		CHECKF(poll(&pfd, 1, 0) == 0, "stranger %d was answered", i);
	}
	printf("8 silent TCP peers, --max-connections 8: 8 unix clients admitted; the 9th TCP peer got EAGAIN 'too "
	       "many connections before HELLO on this listener (limit 8)' in %.0f us at most (20 tries); the 9th "
	       "unix client got EAGAIN 'too many connections (limit 8)' at its HELLO in %.0f us\n",
	       worst, full_us);

	/* room comes back: an admitted one leaves, a TCP client with the token is admitted
	 * once a stranger leaves too */
	sbx_client_close(c[7]);
	close(silent[0]);
	wait_connections(c[0], 14);
	struct sbx_client *t = it_connect(it_tcp_target(port), "t0ken");
	CHECK_SBX(sbx_ping(t, NULL, NULL, &err), &err);
	sbx_client_close(t);
	for (int i = 1; i < 8; i++)
		close(silent[i]);
	for (int i = 0; i < 7; i++)
		sbx_client_close(c[i]);
	it_daemon_stop(d);
	return 0;
}

/* The HELLO deadline holds on TCP: a silent peer is refused with ETIMEDOUT after
 * --handshake-timeout, and its pre-HELLO slot is free again. */
static int case_handshake_tcp(void)
{
	const char *tok = it_path("token");
	it_write_file(tok, "t0ken\n");
	struct it_daemon *d = it_daemon_start("shim", "--listen", "tcp:127.0.0.1:0", "--token-file", tok,
					      "--max-pending", "2", "--handshake-timeout", "1", NULL);
	unsigned port = it_daemon_tcp_port(d);
	double t0 = now_us();
	int a = tcp_connect_raw(port);
	int b = tcp_connect_raw(port);
	/* full: the third is refused at once */
	double t1 = now_us();
	expect_refusal(tcp_connect_raw(port), t1, EAGAIN,
		       "too many connections before HELLO on this listener (limit 2)", 5000);
	double us_a = expect_refusal(a, t0, ETIMEDOUT, "no HELLO within 1 s", 10000);
	expect_refusal(b, t0, ETIMEDOUT, "no HELLO within 1 s", 10000);
	CHECKF(us_a >= 900000, "refused after %.0f us, before the 1 s deadline", us_a);
	/* the slots are free again */
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		struct sbx_client *c = NULL;
		struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
		struct sbx_error err;
		o.token = "t0ken";
		if (sbx_connect(it_tcp_target(port), &o, &c, &err) == 0) {
			CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
			sbx_client_close(c);
			break;
		}
		CHECKF(it_now_ms() < deadline, "not admitted after the strangers timed out: %s", it_errstr(&err));
		it_sleep_ms(10);
	}
	printf("a silent TCP peer got ETIMEDOUT 'no HELLO within 1 s' %.0f ms after its connect\n", us_a / 1000);
	it_daemon_stop(d);
	return 0;
}

/* Bad numbers for the daemon's count options are refused at start, each with its own
 * range in the message and exit status 2; a value at the top of the range starts. */
static int case_numbers_bad(void)
{
	static const struct {
		const char *opt, *range, *above;
	} opts[] = {
		{"--max-pending", "1..1000000", "1000001"}, {"--max-connections", "1..1000000", "1000001"},
		{"--max-streams", "1..1000000", "1000001"}, {"--workers", "1..256", "257"},
		{"--max-jobs", "1..1024", "1025"},
	};
	for (size_t o = 0; o < sizeof(opts) / sizeof(opts[0]); o++) {
		/* (the harness keeps 32 daemons a case: "" and "1x" for one option) */
		const char *bad[] = {"0", "-1", "x", opts[o].above, o == 4 ? "" : NULL, o == 4 ? "1x" : NULL};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) && bad[i] != NULL; i++) {
			const char *argv[] = {SHIM_BIN,    "--listen", it_unix_target(it_path("s")),
					      opts[o].opt, bad[i],     NULL};
			struct it_daemon *d = it_daemon_spawn_argv("bad", argv);
			CHECK(it_daemon_wait_exit(d, 5000));
			CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 2, "%s '%s': status %d", opts[o].opt,
			       bad[i], d->status);
			char want[96];
			snprintf(want, sizeof(want), "bad %s '%s' (want %s)", opts[o].opt, bad[i], opts[o].range);
			char *log = it_daemon_log(d);
			CHECKF(strstr(log, want) != NULL, "log: %s", log);
			free(log);
		}
		/* the top of the range is taken */
		const char *top = strstr(opts[o].range, "..") + 2;
		struct it_daemon *d =
			it_daemon_start("top", "--listen", it_unix_target(it_path("top")), opts[o].opt, top, NULL);
		struct sbx_client *c = it_connect(it_unix_target(it_path("top")), NULL);
		struct sbx_error err;
		CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
		sbx_client_close(c);
		it_daemon_stop(d);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"max_connections", case_max_connections},
		{"nofile_64", case_nofile_64},
		{"nofile_128", case_nofile_128},
		{"nofile_raise", case_nofile_raise},
		{"emfile", case_emfile},
		{"strangers", case_strangers},
		{"unix_burst", case_unix_burst},
		{"handshake_tcp", case_handshake_tcp},
		{"numbers_bad", case_numbers_bad},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
