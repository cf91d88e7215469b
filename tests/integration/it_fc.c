/* it_fc.c: Firecracker hybrid vsock (fc:UDS:PORT) through a fake muxer thread in front of a real daemon. */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum mux_mode {
	MUX_RELAY,  /* answer OK, then splice the connection to the daemon's unix socket */
	MUX_CLOSE,  /* close without answering: nothing listens on that port in the guest */
	MUX_SILENT, /* never answer */
	MUX_GARBAGE /* answer something that is not OK */
};

/* The host side of Firecracker's vsock device, for one connection. */
struct muxer {
	enum mux_mode mode;
	const char *upstream; /* the daemon's socket (MUX_RELAY) */
	int lfd;
	int stopfd; /* eventfd: the test is done with this muxer */
	pthread_t thread;
	/* what the client sent before any answer, in its first read */
	char first[128];
	ssize_t first_len;
	bool extra_before_answer; /* more bytes came before we answered */
	uint64_t relayed;         /* bytes relayed in both directions */
};

static int unix_listen(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	CHECKF(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %s: %s", path, strerror(errno));
	CHECK(listen(fd, 8) == 0);
	return fd;
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", path, strerror(errno));
	return fd;
}

/* Wait for fd readable or the stop signal: true if fd is readable. */
static bool wait_readable(struct muxer *m, int fd, int timeout_ms)
{
	struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = m->stopfd, .events = POLLIN}};
	int r;
	do {
		r = poll(pf, 2, timeout_ms);
	} while (r < 0 && errno == EINTR);
	return r > 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) && !(pf[1].revents & POLLIN);
}

static void write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* the other side is gone: the relay loop notices */
		p += w;
		len -= (size_t)w;
	}
}

static void relay(struct muxer *m, int a, int b)
{
	char buf[65536];
	for (;;) {
		struct pollfd pf[3] = {
			{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}, {.fd = m->stopfd, .events = POLLIN}};
		int r = poll(pf, 3, -1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 || (pf[2].revents & POLLIN))
			return;
		for (int i = 0; i < 2; i++) {
			if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t n = read(pf[i].fd, buf, sizeof(buf));
			if (n <= 0)
				return;
			write_all(i == 0 ? b : a, buf, (size_t)n);
			m->relayed += (uint64_t)n;
		}
	}
}

static void *muxer_main(void *arg)
{
	struct muxer *m = arg;
	if (!wait_readable(m, m->lfd, -1))
		return NULL;
	int fd = accept4(m->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return NULL;
	/* one read: the request must arrive as one line in one write */
	if (wait_readable(m, fd, 5000))
		m->first_len = read(fd, m->first, sizeof(m->first) - 1);
	if (m->first_len > 0)
		m->first[m->first_len] = '\0';
	/* the client now waits for our answer and must send nothing more */
	m->extra_before_answer = wait_readable(m, fd, 50);
	switch (m->mode) {
	case MUX_RELAY: {
		static const char ok[] = "OK 1073741824\n";
		write_all(fd, ok, sizeof(ok) - 1);
		int up = unix_connect(m->upstream);
		relay(m, fd, up);
		close(up);
		break;
	}
	case MUX_CLOSE:
		break;
	case MUX_SILENT:
		wait_readable(m, m->stopfd, -1);
		break;
	case MUX_GARBAGE: {
		static const char no[] = "NOPE\n";
		write_all(fd, no, sizeof(no) - 1);
		break;
	}
	}
	close(fd);
	return NULL;
}

static void muxer_start(struct muxer *m, enum mux_mode mode, const char *path, const char *upstream)
{
	memset(m, 0, sizeof(*m));
	m->mode = mode;
	m->upstream = upstream;
	m->lfd = unix_listen(path);
	m->stopfd = eventfd(0, EFD_CLOEXEC);
	CHECK(m->stopfd >= 0);
	CHECK(pthread_create(&m->thread, NULL, muxer_main, m) == 0);
}

static void muxer_stop(struct muxer *m)
{
	uint64_t one = 1;
	CHECK(write(m->stopfd, &one, sizeof(one)) == sizeof(one));
	CHECK(pthread_join(m->thread, NULL) == 0);
	close(m->lfd);
	close(m->stopfd);
}

static void check_connect_line(const struct muxer *m, unsigned port)
{
	char want[64];
	snprintf(want, sizeof(want), "CONNECT %u\n", port);
	CHECKF(m->first_len == (ssize_t)strlen(want) && strcmp(m->first, want) == 0,
	       "muxer's first read got %zd bytes '%s', want '%s'", m->first_len, m->first_len > 0 ? m->first : "",
	       want);
	CHECKF(!m->extra_before_answer, "the client sent more than the CONNECT line before the answer");
}

static int case_relay(void)
{
	const char *sock = it_path("shim.sock"), *mux = it_path("v.sock");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct muxer m;
	muxer_start(&m, MUX_RELAY, mux, sock);

	char target[256];
	snprintf(target, sizeof(target), "fc:%s:5000", mux);
	struct sbx_client *c = it_connect(target, NULL);
	check_connect_line(&m, 5000);
	struct sbx_error err;
	uint64_t rtt;
	for (int i = 0; i < 10; i++)
		CHECK_SBX(sbx_ping(c, NULL, &rtt, &err), &err);
	CHECK_EQ(sbx_client_server(c)->pid, d->pid);
	struct sbx_info in = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.pid, d->pid);
	size_t n = 1u << 20;
	uint8_t *data = malloc(n), *back = malloc(n);
	CHECK(data != NULL && back != NULL);
	it_fill(data, n, 42);
	CHECK_SBX(sbx_echo(c, NULL, data, n, back, &err), &err);
	CHECK(memcmp(data, back, n) == 0);
	free(data);
	free(back);
	sbx_client_close(c);
	muxer_stop(&m);
	CHECK(m.relayed > 2 * n);
	return 0;
}

static int try_fc(const char *mux, unsigned port, int timeout_ms, struct sbx_error *err, uint64_t *elapsed_ms)
{
	char target[256];
	snprintf(target, sizeof(target), "fc:%s:%u", mux, port);
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.connect_timeout_ms = timeout_ms;
	struct sbx_client *c = NULL;
	memset(err, 0, sizeof(*err));
	uint64_t t0 = it_now_ms();
	int rc = sbx_connect(target, &o, &c, err);
	*elapsed_ms = it_now_ms() - t0;
	if (rc == 0)
		sbx_client_close(c);
	return rc;
}

static int case_refused(void)
{
	const char *mux = it_path("v.sock");
	struct muxer m;
	struct sbx_error err;
	uint64_t ms;

	muxer_start(&m, MUX_CLOSE, mux, NULL);
	CHECK(try_fc(mux, 5123, 5000, &err, &ms) < 0);
	muxer_stop(&m);
	check_connect_line(&m, 5123);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNREFUSED);
	CHECK_CONTAINS(err.message, "5123");
	CHECK_CONTAINS(err.message, "nothing listens on port 5123");

	unlink(mux);
	muxer_start(&m, MUX_GARBAGE, mux, NULL);
	CHECK(try_fc(mux, 77, 5000, &err, &ms) < 0);
	muxer_stop(&m);
	check_connect_line(&m, 77);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNREFUSED);
	CHECK_CONTAINS(err.message, "NOPE");

	/* no muxer at all */
	unlink(mux);
	CHECK(try_fc(mux, 5123, 5000, &err, &ms) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ENOENT);
	return 0;
}

static int case_timeout(void)
{
	const char *mux = it_path("v.sock");
	struct muxer m;
	struct sbx_error err;
	uint64_t ms;
	muxer_start(&m, MUX_SILENT, mux, NULL);
	CHECK(try_fc(mux, 5124, 300, &err, &ms) < 0);
	muxer_stop(&m);
	check_connect_line(&m, 5124);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ETIMEDOUT);
	CHECK_CONTAINS(err.message, "CONNECT 5124");
	printf("fc timeout after %llu ms (connect_timeout_ms 300)\n", (unsigned long long)ms);
	CHECKF(ms >= 290 && ms < 1000, "gave up after %llu ms, want about 300", (unsigned long long)ms);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"relay", case_relay},
		{"refused", case_refused},
		{"timeout", case_timeout},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
