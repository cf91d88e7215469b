/* it_limits.c: --max-connections: the connection over the limit is refused with EAGAIN, and room comes back. */
#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static unsigned connections(struct sbx_client *c)
{
	struct sbx_info in;
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

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"max_connections", case_max_connections},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
