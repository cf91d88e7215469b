/* cmd_tunnel.c: the sbx subcommands for TCP tunnels: forward, reverse and tunnels. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* "[HOST:]PORT" (HOST may be [v6]) into host (NULL when absent) and a port. */
static int parse_hostport(const char *s, char *host, size_t hsize, const char **hostp, unsigned *port, int allow_zero)
{
	const char *colon = strrchr(s, ':');
	const char *ps = s;
	*hostp = NULL;
	if (colon != NULL) {
		size_t hl = (size_t)(colon - s);
		if (hl == 0 || hl >= hsize)
			return -1;
		/* an IPv6 address needs brackets: "::1:80" is ambiguous */
		if (memchr(s, ':', hl) != NULL && !(s[0] == '[' && s[hl - 1] == ']'))
			return -1;
		memcpy(host, s, hl);
		host[hl] = '\0';
		*hostp = host;
		ps = colon + 1;
	}
	char *end;
	errno = 0;
	unsigned long v = strtoul(ps, &end, 10);
	if (ps[0] < '0' || ps[0] > '9' || *end != '\0' || errno != 0 || v > 65535 || (v == 0 && !allow_zero))
		return -1;
	*port = (unsigned)v;
	return 0;
}

static void log_cb(void *ud, const struct sbx_tunnel *t, const struct sbx_tunnel_event *ev)
{
	(void)ud;
	char buf[600];
	switch (ev->type) {
	case SBX_TUNNEL_OPEN:
		fprintf(stderr, "sbx: %s: connection %" PRIu64 " from %s to %s: open\n", sbx_tunnel_id(t), ev->conn,
			ev->from, ev->to);
		break;
	case SBX_TUNNEL_CLOSE:
		if (ev->err != NULL)
			fprintf(stderr,
				"sbx: %s: connection %" PRIu64 " from %s: closed after %" PRIu64 " bytes in, %" PRIu64
				" out: %s\n",
				sbx_tunnel_id(t), ev->conn, ev->from, ev->bytes_in, ev->bytes_out,
				sbx_error_format(ev->err, buf, sizeof(buf)));
		else
			fprintf(stderr,
				"sbx: %s: connection %" PRIu64 " from %s: closed after %" PRIu64 " bytes in, %" PRIu64
				" out\n",
				sbx_tunnel_id(t), ev->conn, ev->from, ev->bytes_in, ev->bytes_out);
		break;
	default:
		fprintf(stderr, "sbx: %s: connection %" PRIu64 " from %s to %s: failed: %s\n", sbx_tunnel_id(t),
			ev->conn, ev->from, ev->to, ev->err ? sbx_error_format(ev->err, buf, sizeof(buf)) : "?");
		break;
	}
}

/* Run until SIGINT, SIGTERM or SIGHUP, or until the tunnel ends by itself. The signals
 * are blocked before the tunnel's thread starts (it inherits the mask) and taken here
 * with sigtimedwait(). */
static int run_until_signal(struct sbx_tunnel *t, const sigset_t *set)
{
	struct sbx_error err;
	for (;;) {
		struct timespec ts = {0, 200000000};
		int sig = sigtimedwait(set, NULL, &ts);
		if (sig > 0) {
			fprintf(stderr, "sbx: %s: %s: closing\n", sbx_tunnel_id(t), strsignal(sig));
			sbx_tunnel_close(t);
			return EXIT_OK;
		}
		int w = sbx_tunnel_wait(t, 0, &err);
		if (w == 0) {
			fprintf(stderr, "sbx: %s: closed by the shim\n", sbx_tunnel_id(t));
			sbx_tunnel_close(t);
			return EXIT_OK;
		}
		if (w < 0) {
			sbx_tunnel_close(t);
			return fail(&err, NULL);
		}
	}
}

static int cmd_tunnel_open(struct ctx *ctx, int argc, char **argv, int forward)
{
	static const struct option longopts[] = {
		{"bind", required_argument, NULL, 'b'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	/* reverse has no --bind: the guest side's host is part of its first operand */
	const struct option *opts = forward ? longopts : help_only_opts;
	const char *bind_host = NULL;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, forward ? ":b:h" : ":h", opts)) != -1) {
		if (opt == 'b' && forward)
			bind_host = optarg;
		else
			return other_option(ctx, argv, opt);
	}
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	char h1[128], h2[128];
	const char *host1, *host2;
	unsigned port1, port2;
	/* forward: [--bind HOST:]LOCAL_PORT [GUEST_HOST:]GUEST_PORT
	 * reverse: [GUEST_HOST:]GUEST_PORT [LOCAL_HOST:]LOCAL_PORT */
	if (parse_hostport(argv[optind], h1, sizeof(h1), &host1, &port1, 1) < 0)
		return usage_error(ctx, "bad %s '%s' (want [HOST:]PORT, 0-65535)",
				   forward ? "local port" : "guest port", argv[optind]);
	if (parse_hostport(argv[optind + 1], h2, sizeof(h2), &host2, &port2, 0) < 0)
		return usage_error(ctx, "bad %s '%s' (want [HOST:]PORT, 1-65535)",
				   forward ? "guest port" : "local port", argv[optind + 1]);
	if (forward && host1 != NULL) {
		if (bind_host != NULL)
			return usage_error(ctx, "the bind address is given twice");
		bind_host = host1;
	}
	if (bind_host != NULL && bind_host[0] == '\0')
		return usage_error(ctx, "empty --bind address");

	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	o.log = log_cb;
	struct sbx_tunnel *t;
	struct sbx_error err;
	if (forward)
		rc = sbx_forward_open(c, bind_host, port1, host2, port2, &o, &t, &err);
	else
		rc = sbx_reverse_open(c, host1, port1, host2, port2, &o, &t, &err);
	if (rc < 0) {
		rc = fail(&err, NULL);
		sbx_client_close(c);
		return rc;
	}
	if (forward)
		fprintf(stderr, "sbx: %s: listening on %s:%u, forwarding to %s:%u in the sandbox\n", sbx_tunnel_id(t),
			bind_host ? bind_host : "127.0.0.1", sbx_tunnel_port(t), host2 ? host2 : "127.0.0.1", port2);
	else
		fprintf(stderr, "sbx: %s: listening on %s:%u in the sandbox, forwarding to %s:%u\n", sbx_tunnel_id(t),
			host1 ? host1 : "localhost", sbx_tunnel_port(t), host2 ? host2 : "127.0.0.1", port2);
	rc = run_until_signal(t, &set);
	sbx_client_close(c);
	return rc;
}

int cmd_forward(struct ctx *ctx, int argc, char **argv)
{
	return cmd_tunnel_open(ctx, argc, argv, 1);
}

int cmd_reverse(struct ctx *ctx, int argc, char **argv)
{
	return cmd_tunnel_open(ctx, argc, argv, 0);
}

int cmd_tunnels(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"close", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *close_id = NULL;
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		if (opt == 'c')
			close_id = optarg;
		else
			return other_option(ctx, argv, opt);
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (close_id != NULL) {
		if (sbx_tunnel_close_id(c, NULL, close_id, &err) < 0)
			rc = fail(&err, NULL);
		sbx_client_close(c);
		return rc;
	}
	struct sbx_tunnel_info **v;
	size_t n;
	if (sbx_tunnels_list(c, NULL, &v, &n, &err) < 0) {
		rc = fail(&err, NULL);
		sbx_client_close(c);
		return rc;
	}
	if (ctx->json) {
		printf("[");
		for (size_t i = 0; i < n; i++) {
			printf("%s{\"id\":", i ? "," : "");
			json_str(v[i]->id);
			printf(",\"kind\":\"%s\",\"host\":", v[i]->kind == SBX_TUNNEL_FORWARD ? "forward" : "reverse");
			json_str(v[i]->host);
			printf(",\"port\":%u,\"remote\":", v[i]->port);
			json_str(v[i]->remote);
			printf(",\"client\":");
			json_str(v[i]->client);
			printf(",\"active\":%u,\"total\":%" PRIu64 ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64
			       "}",
			       v[i]->active, v[i]->total, v[i]->bytes_in, v[i]->bytes_out);
		}
		printf("]\n");
	} else {
		printf("%-6s %-8s %-24s %-24s %6s %8s %12s %12s\n", "ID", "KIND", "SANDBOX", "HOST", "ACTIVE", "TOTAL",
		       "BYTES_IN", "BYTES_OUT");
		for (size_t i = 0; i < n; i++) {
			char inside[96];
			snprintf(inside, sizeof(inside), "%s%s%s:%u", strchr(v[i]->host, ':') ? "[" : "", v[i]->host,
				 strchr(v[i]->host, ':') ? "]" : "", v[i]->port);
			printf("%-6s %-8s %-24s %-24s %6u %8" PRIu64 " %12" PRIu64 " %12" PRIu64 "\n", v[i]->id,
			       v[i]->kind == SBX_TUNNEL_FORWARD ? "forward" : "reverse", inside,
			       v[i]->remote[0] ? v[i]->remote : "-", v[i]->active, v[i]->total, v[i]->bytes_in,
			       v[i]->bytes_out);
		}
	}
	sbx_tunnels_free(v);
	sbx_client_close(c);
	return EXIT_OK;
}
