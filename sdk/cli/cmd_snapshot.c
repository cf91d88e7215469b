/* cmd_snapshot.c: the sbx subcommands for microVM snapshots: snapshot-prepare, resumed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_FREEZE 16

enum {
	OPT_FREEZE = 0x100,
	OPT_THAW_AFTER,
	OPT_STOP_BACKGROUND,
	OPT_FLUSH_TIMEOUT,
	OPT_TIME,
	OPT_ENTROPY_FILE,
	OPT_FORK,
};

static void print_strv(const char *key, char **v)
{
	printf(",\"%s\":[", key);
	for (size_t i = 0; v != NULL && v[i] != NULL; i++) {
		fputs(i ? "," : "", stdout);
		json_str(v[i]);
	}
	printf("]");
}

static void print_result(const struct ctx *ctx, const struct sbx_snapshot_result *r, int resumed)
{
	if (ctx->json) {
		printf("{\"generation\":%" PRIu64, r->generation);
		if (resumed)
			printf(",\"prepared\":%s,\"clock_delta_ns\":%" PRId64, r->prepared ? "true" : "false",
			       r->clock_delta_ns);
		else
			printf(",\"thaw_after_ms\":%u", r->thaw_after_ms);
		printf(",\"steps\":[");
		for (size_t i = 0; r->steps != NULL && r->steps[i] != NULL; i++) {
			const struct sbx_snapshot_step *s = r->steps[i];
			printf("%s{\"name\":", i ? "," : "");
			json_str(s->name);
			printf(",\"duration_us\":%" PRIu64 ",\"error\":", s->duration_us);
			if (s->error)
				json_str(sbx_errno_name(s->error));
			else
				fputs("null", stdout);
			printf(",\"message\":");
			json_str(s->message);
			printf(",\"path\":");
			json_str(s->path);
			printf(",\"count\":%u}", s->count);
		}
		printf("]");
		if (!resumed) {
			print_strv("frozen", r->frozen);
			print_strv("stopped", r->stopped);
		}
		printf("}\n");
		return;
	}
	for (size_t i = 0; r->steps != NULL && r->steps[i] != NULL; i++) {
		const struct sbx_snapshot_step *s = r->steps[i];
		printf("%-9s %9.3f ms  %s", s->name, s->duration_us / 1000.0,
		       s->error ? sbx_errno_name(s->error) : "ok");
		if (s->path[0])
			printf("  %s", s->path);
		if (s->message[0])
			printf("  (%s)", s->message);
		printf("\n");
	}
	kv("generation", "%" PRIu64, r->generation);
	if (resumed) {
		kv("prepared", "%s", r->prepared ? "yes" : "no");
		kv("clock delta", "%+.3f s", r->clock_delta_ns / 1e9);
	} else {
		kv("thaw after", "%u ms", r->thaw_after_ms);
	}
}

int cmd_snapshot_prepare(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"freeze", required_argument, NULL, OPT_FREEZE},
		{"thaw-after", required_argument, NULL, OPT_THAW_AFTER},
		{"stop-background", no_argument, NULL, OPT_STOP_BACKGROUND},
		{"flush-timeout", required_argument, NULL, OPT_FLUSH_TIMEOUT},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *freeze[MAX_FREEZE + 1];
	size_t nfreeze = 0;
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	int opt, rc, ms;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case OPT_FREEZE:
			if (nfreeze == MAX_FREEZE)
				return usage_error(ctx, "at most %d --freeze", MAX_FREEZE);
			freeze[nfreeze++] = optarg;
			break;
		case OPT_THAW_AFTER:
			if (parse_seconds(optarg, &ms) < 0 || ms <= 0)
				return usage_error(ctx, "bad --thaw-after '%s'", optarg);
			so.thaw_after_ms = (unsigned)ms;
			break;
		case OPT_STOP_BACKGROUND:
			so.stop_background = 1;
			break;
		case OPT_FLUSH_TIMEOUT:
			if (parse_seconds(optarg, &ms) < 0 || ms <= 0)
				return usage_error(ctx, "bad --flush-timeout '%s'", optarg);
			so.flush_timeout_ms = (unsigned)ms;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	freeze[nfreeze] = NULL;
	so.freeze = nfreeze ? freeze : NULL;
	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	struct sbx_error err;
	if (sbx_snapshot_prepare(c, NULL, &so, &r, &err) < 0)
		rc = fail(&err, NULL);
	else
		print_result(ctx, &r, 0);
	sbx_snapshot_result_free(&r);
	sbx_client_close(c);
	return rc;
}

/* Up to 512 bytes of FILE ("-": stdin). */
static int read_entropy(const char *file, unsigned char *buf, size_t size, size_t *len)
{
	int fd = strcmp(file, "-") ? open(file, O_RDONLY | O_CLOEXEC) : 0;
	if (fd < 0) {
		fprintf(stderr, "sbx: %s: %s\n", file, strerror(errno));
		return -1;
	}
	size_t n = 0;
	while (n < size) {
		ssize_t k = read(fd, buf + n, size - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			fprintf(stderr, "sbx: %s: %s\n", file, strerror(errno));
			if (fd)
				close(fd);
			return -1;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	if (fd)
		close(fd);
	*len = n;
	return 0;
}

int cmd_resumed(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"time", required_argument, NULL, OPT_TIME},
		{"entropy-file", required_argument, NULL, OPT_ENTROPY_FILE},
		{"fork", no_argument, NULL, OPT_FORK},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_resumed_opts ro = SBX_RESUMED_OPTS_INIT;
	/* one byte more than the shim takes, so that an oversize file reaches it whole */
	unsigned char entropy[513];
	const char *entropy_file = NULL;
	struct sbx_timespec t;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case OPT_TIME:
			if (parse_time(optarg, &t) < 0)
				return usage_error(ctx, "bad --time '%s' (want RFC 3339, e.g. 2026-01-02T03:04:05Z)",
						   optarg);
			ro.time_sec = t.sec;
			ro.time_nsec = t.nsec;
			break;
		case OPT_ENTROPY_FILE:
			entropy_file = optarg;
			break;
		case OPT_FORK:
			ro.fork = 1;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if (entropy_file != NULL) {
		if (read_entropy(entropy_file, entropy, sizeof(entropy), &ro.entropy_len) < 0)
			return EXIT_FAIL;
		ro.entropy = entropy;
	}
	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	struct sbx_error err;
	if (sbx_resumed(c, NULL, &ro, &r, &err) < 0)
		rc = fail(&err, NULL);
	else
		print_result(ctx, &r, 1);
	explicit_bzero(entropy, sizeof(entropy));
	sbx_snapshot_result_free(&r);
	sbx_client_close(c);
	return rc;
}
