/* it_raw.c: clients that vanish mid-stream, and SIGTERM with streams in flight, watched at the frame level. */
#include "harness.h"
#include "rawclient.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sbx_info info_of(struct sbx_client *c)
{
	struct sbx_info in;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	return in;
}

/* Wait until the daemon counts these connections and streams (an info call is one
 * of the streams). */
static void wait_counts(struct sbx_client *c, unsigned conns, unsigned streams)
{
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		struct sbx_info in = info_of(c);
		if (in.connections == conns && in.streams == streams)
			return;
		CHECKF(it_now_ms() < deadline, "daemon counts %u connections and %u streams, want %u and %u",
		       in.connections, in.streams, conns, streams);
		it_sleep_ms(5);
	}
}

/* Read the echo of n bytes on stream id: the DATA coming back, and the WINDOWs that
 * give back exactly the credit those bytes used. */
static void read_echo(int fd, uint32_t id, const uint8_t *want, size_t n)
{
	size_t got = 0, granted = 0;
	while (got < n || granted < n) {
		struct frame_hdr h;
		uint8_t *p;
		CHECKF(raw_recv(fd, &h, &p, 5000) == 1, "EOF while reading the echo");
		CHECK_EQ(h.stream, id);
		if (h.type == FRAME_DATA) {
			CHECK(got + h.len <= n);
			CHECK(memcmp(p, want + got, h.len) == 0);
			got += h.len;
		} else {
			CHECKF(h.type == FRAME_WINDOW && h.len == 4, "unexpected %s frame", frame_type_name(h.type));
			granted += frame_get_u32(p);
			CHECK(granted <= got);
		}
		free(p);
	}
}

static int case_vanish(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	wait_counts(c, 1, 1);

	uint8_t buf[100000];
	it_fill(buf, sizeof(buf), 3);

	/* 1: vanishes between frames, with an echo stream open and its echo unread */
	int r1 = raw_connect_unix(sock);
	raw_hello(r1, NULL);
	raw_request_echo(r1, 1);
	raw_send(r1, 1, FRAME_DATA, 0, buf, sizeof(buf));
	/* 2: vanishes in the middle of a DATA frame on its open echo stream */
	int r2 = raw_connect_unix(sock);
	raw_hello(r2, NULL);
	raw_request_echo(r2, 1);
	raw_send(r2, 1, FRAME_DATA, 0, buf, 5000);
	read_echo(r2, 1, buf, 5000);
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = 4000, .stream = 1, .type = FRAME_DATA};
	frame_put_hdr(hdr, &h);
	CHECK(write(r2, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr));
	CHECK(write(r2, buf, 1000) == 1000);
	/* 3: vanishes right after its HELLO */
	int r3 = raw_connect_unix(sock);
	raw_hello(r3, NULL);

	wait_counts(c, 4, 3);
	close(r1);
	close(r2);
	close(r3);

	/* the daemon keeps serving, and is back to its baseline */
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	wait_counts(c, 1, 1);
	struct sbx_client *c2 = it_connect(it_unix_target(sock), NULL);
	uint8_t back[sizeof(buf)];
	CHECK_SBX(sbx_echo(c2, NULL, buf, sizeof(buf), back, &err), &err);
	CHECK(memcmp(buf, back, sizeof(buf)) == 0);
	sbx_client_close(c2);
	wait_counts(c, 1, 1);
	it_daemon_wait_log(d, "connection closed in the middle of a frame", 2000);
	sbx_client_close(c);
	return 0;
}

static int case_sigterm(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *a = it_connect(it_unix_target(sock), NULL);
	struct sbx_client *b = it_connect(it_unix_target(sock), NULL);
	int r = raw_connect_unix(sock);
	raw_hello(r, NULL);
	raw_request_echo(r, 1);
	uint8_t buf[1000];
	it_fill(buf, sizeof(buf), 9);
	raw_send(r, 1, FRAME_DATA, 0, buf, sizeof(buf));
	read_echo(r, 1, buf, sizeof(buf));
	wait_counts(a, 3, 2);

	uint64_t t0 = it_now_ms();
	CHECK(kill(d->pid, SIGTERM) == 0);

	/* the stream in flight ends with ERROR ECANCELED, then the connection closes */
	struct frame_hdr h;
	uint8_t *p;
	for (;;) {
		CHECKF(raw_recv(r, &h, &p, 5000) == 1, "EOF without an ERROR for the stream in flight");
		if (h.type != FRAME_WINDOW)
			break;
		free(p);
	}
	CHECKF(h.type == FRAME_ERROR && h.stream == 1, "got %s on stream %u, want ERROR on stream 1",
	       frame_type_name(h.type), h.stream);
	char msg[256];
	CHECK_EQ(raw_error_code(p, h.len, msg, sizeof(msg)), ECANCELED);
	CHECK_CONTAINS(msg, "shutting down");
	free(p);
	CHECKF(raw_recv(r, &h, &p, 5000) == 0, "got %s after the ERROR, want EOF", frame_type_name(h.type));
	close(r);

	/* the daemon exits 0 within 2 s and removes its socket */
	CHECKF(it_daemon_wait_exit(d, 2000), "the daemon still runs 2 s after SIGTERM");
	uint64_t ms = it_now_ms() - t0;
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 0, "exit status 0x%x, want 0", d->status);
	printf("daemon exited %llu ms after SIGTERM\n", (unsigned long long)ms);
	struct stat st;
	CHECKF(lstat(sock, &st) < 0 && errno == ENOENT, "the socket file is still there");

	/* the idle clients see their connections closed: on a call, and from the event loop */
	struct sbx_error err;
	CHECK(sbx_ping(a, NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNRESET);
	struct pollfd pf = {.fd = sbx_client_fd(b), .events = POLLIN};
	CHECK(poll(&pf, 1, 2000) == 1);
	CHECK(sbx_client_process(b, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNRESET);
	sbx_client_close(a);
	sbx_client_close(b);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"vanish", case_vanish},
		{"sigterm", case_sigterm},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
