/* sbx.c: the sbx command-line client, a thin shell over the public SDK in sbx.h. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sbx.h"

enum {
	EXIT_OK = 0,
	EXIT_FAIL = 1,    /* the operation failed */
	EXIT_USAGE = 2,   /* bad command line */
	EXIT_CONNECT = 3, /* cannot connect, handshake refused, protocol error */
};

enum {
	OPT_TOKEN_FILE = 256,
	OPT_TIMEOUT,
	OPT_JSON,
	OPT_TRACE,
	OPT_VERSION,
};

#define GLOBAL_USAGE "[-t TARGET] [--token-file F] [--timeout SECONDS] [--json] [--trace]"
#define TOKEN_MAX 4096
#define PING_COUNT_MAX 100000

struct command;

struct ctx {
	const char *target;
	const char *token_file;
	int timeout_ms; /* 0: the library's defaults */
	int json;
	int trace;
	const struct command *cmd; /* the subcommand being run, NULL while in main */
};

struct command {
	const char *name;
	int (*fn)(struct ctx *ctx, int argc, char **argv);
	const char *usage;
	const char *help;
};

static const struct command *find_command(const char *name);
static void print_help(FILE *f);

/* ---- errors and usage ---- */

/* Print err on stderr and return the exit status it calls for. target is set when
 * the failure happened while connecting: that is always "cannot connect". */
static int fail(const struct sbx_error *err, const char *target)
{
	char buf[1536];

	sbx_error_format(err, buf, sizeof(buf));
	if (target) {
		fprintf(stderr, "sbx: cannot connect to %s: %s\n", target, buf);
		return EXIT_CONNECT;
	}
	fprintf(stderr, "sbx: %s\n", buf);
	switch ((enum sbx_error_kind)err->kind) {
	case SBX_ERR_CONNECT:
	case SBX_ERR_PROTOCOL:
		return EXIT_CONNECT;
	case SBX_ERR_NONE:
	case SBX_ERR_REMOTE:
	case SBX_ERR_LOCAL:
	case SBX_ERR_EXIT:
		break;
	}
	return EXIT_FAIL;
}

static void short_usage(const struct ctx *ctx)
{
	if (ctx->cmd) {
		fprintf(stderr, "usage: sbx [OPTIONS] %s %s\n", ctx->cmd->name, ctx->cmd->usage);
		fprintf(stderr, "Try 'sbx %s --help' for more information.\n", ctx->cmd->name);
	} else {
		fprintf(stderr, "usage: sbx " GLOBAL_USAGE " COMMAND [ARGS]...\n");
		fprintf(stderr, "Try 'sbx --help' for more information.\n");
	}
}

__attribute__((format(printf, 2, 3))) static int usage_error(const struct ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	fputs("sbx: ", stderr);
	if (ctx->cmd)
		fprintf(stderr, "%s: ", ctx->cmd->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	short_usage(ctx);
	return EXIT_USAGE;
}

/* Turn getopt_long's ':' (missing argument) or '?' (unknown option) into a usage error. */
static int bad_option(const struct ctx *ctx, char **argv, int opt)
{
	const char *arg = optind > 0 ? argv[optind - 1] : "";

	if (opt == ':')
		return usage_error(ctx, "option '%s' needs an argument", arg);
	if (optopt && strncmp(arg, "--", 2) != 0)
		return usage_error(ctx, "unknown option '-%c'", optopt);
	return usage_error(ctx, "unknown or malformed option '%s'", arg);
}

static int no_more_args(const struct ctx *ctx, int argc, char **argv)
{
	if (optind < argc)
		return usage_error(ctx, "unexpected argument '%s'", argv[optind]);
	return EXIT_OK;
}

static int show_cmd_help(const struct command *cmd)
{
	printf("usage: sbx [OPTIONS] %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->help);
	return EXIT_OK;
}

/* ---- parsing ---- */

/* Seconds, possibly fractional, to milliseconds (rounded up so 0.0001 is not "none"). */
static int parse_seconds(const char *s, int *ms)
{
	char *end;
	double v, x;

	errno = 0;
	v = strtod(s, &end);
	/* The negated comparison also rejects NaN. */
	if (end == s || *end || errno || !(v >= 0 && v <= 2000000.0))
		return -1;
	x = v * 1000.0;
	*ms = (int)x;
	if (*ms < x)
		(*ms)++;
	return 0;
}

static int parse_count(const char *s, unsigned long max, unsigned long *out)
{
	char *end;
	unsigned long v;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (*end || errno || v == 0 || v > max)
		return -1;
	*out = v;
	return 0;
}

/* BYTES with an optional binary suffix: 4096, 64K, 1M, 2G (also "KiB", "MB"...). */
static int parse_size(const char *s, size_t *out)
{
	char *end;
	uint64_t v, mul = 1;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ULL << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mul = 1ULL << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mul = 1ULL << 30;
		end++;
		break;
	default:
		break;
	}
	if (mul > 1 && (!strcmp(end, "iB") || !strcmp(end, "B")))
		end += strlen(end);
	if (*end || v > SIZE_MAX / mul)
		return -1;
	*out = (size_t)(v * mul);
	return 0;
}

/* ---- output helpers ---- */

/* Length of the valid UTF-8 sequence at p (2-4), or 0 if it is not one. */
static size_t utf8_len(const unsigned char *p)
{
	size_t n, i;
	uint32_t cp;

	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		n = 2;
		cp = p[0] & 0x1f;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		n = 3;
		cp = p[0] & 0x0f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		n = 4;
		cp = p[0] & 0x07;
	} else {
		return 0;
	}
	/* A NUL stops this loop too, so it never reads past the string. */
	for (i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* A JSON string; bytes that are not UTF-8 come out as \u00XX of the byte. */
static void json_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n;

	putc('"', f);
	while (*p) {
		if (*p == '"' || *p == '\\') {
			putc('\\', f);
			putc(*p++, f);
		} else if (*p < 0x20) {
			fprintf(f, "\\u%04x", *p++);
		} else if (*p < 0x80) {
			putc(*p++, f);
		} else if ((n = utf8_len(p)) > 0) {
			fwrite(p, 1, n, f);
			p += n;
		} else {
			fprintf(f, "\\u%04x", *p++);
		}
	}
	putc('"', f);
}

/* JSON has no NaN or infinity. */
static void json_num(FILE *f, double v, int prec)
{
	if (isfinite(v))
		fprintf(f, "%.*f", prec, v);
	else
		fputs("null", f);
}

static const char *fmt_bytes(uint64_t n, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	unsigned i = 0;

	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, size, "%" PRIu64 " B", n);
	else
		snprintf(buf, size, "%.1f %s", v, units[i]);
	return buf;
}

static const char *fmt_uptime(uint64_t ms, char *buf, size_t size)
{
	uint64_t s = ms / 1000;
	unsigned h = (unsigned)(s / 3600 % 24), m = (unsigned)(s / 60 % 60), sec = (unsigned)(s % 60);

	if (s >= 86400)
		snprintf(buf, size, "%" PRIu64 "d %02u:%02u:%02u", s / 86400, h, m, sec);
	else
		snprintf(buf, size, "%02u:%02u:%02u", h, m, sec);
	return buf;
}

/* One aligned "key: value" line. */
__attribute__((format(printf, 2, 3))) static void kv(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s:%*s", key, (int)(14 - strlen(key)), "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static void put_line(FILE *f, const char *prefix, const char *line)
{
	size_t n = strlen(line);

	if (n && line[n - 1] == '\n')
		n--;
	fprintf(f, "%s%.*s\n", prefix, (int)n, line);
}

static void trace_cb(void *ud, const char *line)
{
	(void)ud;
	put_line(stderr, "sbx: trace: ", line);
}

static void decode_cb(void *ud, const char *line)
{
	(void)ud;
	put_line(stdout, "", line);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- connecting ---- */

/* Read the token, dropping the trailing newline/whitespace editors and echo leave. */
static int read_token(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	size_t n;
	int ok;

	if (!f) {
		fprintf(stderr, "sbx: %s: %s\n", path, strerror(errno));
		return -1;
	}
	n = fread(buf, 1, size - 1, f);
	ok = !ferror(f) && feof(f);
	fclose(f);
	if (!ok) {
		fprintf(stderr, "sbx: %s: %s\n", path, n == size - 1 ? "token file too large" : "read error");
		return -1;
	}
	while (n > 0 && strchr(" \t\r\n", buf[n - 1]))
		n--;
	buf[n] = '\0';
	if (n == 0 || memchr(buf, '\0', n)) {
		fprintf(stderr, "sbx: %s: %s\n", path, n ? "token contains a NUL byte" : "empty token");
		return -1;
	}
	return 0;
}

/* Connect as the global options say. Returns EXIT_OK with *out set, or an exit status
 * after printing why. */
static int open_client(const struct ctx *ctx, int wait_ms, struct sbx_client **out)
{
	struct sbx_connect_opts opts = SBX_CONNECT_OPTS_INIT;
	struct sbx_error err;
	char token[TOKEN_MAX];
	int rc;

	if (!ctx->target || !*ctx->target)
		return usage_error(ctx, "no target: give -t TARGET or set SBX_TARGET");
	if (ctx->token_file) {
		if (read_token(ctx->token_file, token, sizeof(token)) < 0)
			return EXIT_FAIL;
		opts.token = token;
	}
	opts.client_name = "sbx/" SBX_VERSION;
	opts.connect_timeout_ms = ctx->timeout_ms;
	opts.default_timeout_ms = ctx->timeout_ms;
	opts.wait_ms = wait_ms;
	if (ctx->trace)
		opts.trace = trace_cb;
	rc = sbx_connect(ctx->target, &opts, out, &err) < 0 ? fail(&err, ctx->target) : EXIT_OK;
	/* Keep the secret out of any later core dump. */
	explicit_bzero(token, sizeof(token));
	return rc;
}

/* ---- subcommands ---- */

static int cmd_ping(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"wait", required_argument, NULL, 'w'},
		{"count", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const struct sbx_server_info *si;
	struct sbx_client *c;
	struct sbx_error err;
	unsigned long count = 1, i;
	uint64_t *rtt = NULL, ns;
	int opt, wait_ms = 0, rc;

	while ((opt = getopt_long(argc, argv, ":w:c:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'w':
			if (parse_seconds(optarg, &wait_ms) < 0)
				return usage_error(ctx, "bad --wait '%s': want seconds", optarg);
			break;
		case 'c':
			if (parse_count(optarg, PING_COUNT_MAX, &count) < 0)
				return usage_error(ctx, "bad count '%s': want 1..%d", optarg, PING_COUNT_MAX);
			break;
		case 'h':
			return show_cmd_help(ctx->cmd);
		default:
			return bad_option(ctx, argv, opt);
		}
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if (ctx->json && !(rtt = calloc(count, sizeof(*rtt)))) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	if ((rc = open_client(ctx, wait_ms, &c)) != EXIT_OK) {
		free(rtt);
		return rc;
	}
	si = sbx_client_server(c);
	for (i = 0; i < count; i++) {
		if (sbx_ping(c, NULL, &ns, &err) < 0) {
			rc = fail(&err, NULL);
			break;
		}
		if (rtt)
			rtt[i] = ns;
		else
			printf("pong from sandbox-shim %s (protocol %u) pid %u pid1=%s: time=%.3f ms\n",
			       si->shim_version ? si->shim_version : "?", si->protocol_version, si->pid,
			       si->pid1 ? "yes" : "no", (double)ns / 1e6);
	}
	if (rc == EXIT_OK && rtt) {
		fputs("{\"shim_version\":", stdout);
		json_str(stdout, si->shim_version);
		printf(",\"protocol_version\":%u,\"pid\":%u,\"pid1\":%s,\"uid\":%u,\"hostname\":", si->protocol_version,
		       si->pid, si->pid1 ? "true" : "false", si->uid);
		json_str(stdout, si->hostname);
		fputs(",\"rtt_ms\":[", stdout);
		for (i = 0; i < count; i++)
			printf("%s%.3f", i ? "," : "", (double)rtt[i] / 1e6);
		fputs("]}\n", stdout);
	}
	sbx_client_close(c);
	free(rtt);
	return rc;
}

static void info_text(const struct sbx_info *in)
{
	char buf[64];

	kv("shim version", "%s", in->shim_version);
	kv("protocol", "%u", in->protocol_version);
	kv("features", "%s", in->features);
	kv("uptime", "%s", fmt_uptime(in->uptime_ms, buf, sizeof(buf)));
	kv("pid", "%u", in->pid);
	kv("pid1", "%s", in->pid1 ? "yes" : "no");
	kv("uid/gid", "%u/%u", in->uid, in->gid);
	kv("hostname", "%s", in->hostname);
	kv("boot id", "%s", in->boot_id);
	kv("connections", "%u", in->connections);
	kv("streams", "%u", in->streams);
	kv("processes", "%u", in->processes);
	kv("mounts", "%u", in->mounts);
	kv("rss", "%s", fmt_bytes(in->rss_bytes, buf, sizeof(buf)));
	kv("load", "%.2f %.2f %.2f", in->load[0], in->load[1], in->load[2]);
	kv("limits", "%u connections, %u streams", in->max_connections, in->max_streams);
	kv("workers", "%u", in->workers);
}

static void info_json(const struct sbx_info *in)
{
	const char *p = in->features, *end;
	int first = 1, i;

	fputs("{\"shim_version\":", stdout);
	json_str(stdout, in->shim_version);
	printf(",\"protocol_version\":%u,\"features\":[", in->protocol_version);
	for (; *p; p = end) {
		while (*p == ' ')
			p++;
		end = p + strcspn(p, " ");
		if (end > p) {
			char word[sizeof(in->features)];

			snprintf(word, sizeof(word), "%.*s", (int)(end - p), p);
			fputs(first ? "" : ",", stdout);
			json_str(stdout, word);
			first = 0;
		}
	}
	printf("],\"uptime_ms\":%" PRIu64 ",\"pid\":%u,\"pid1\":%s,\"uid\":%u,\"gid\":%u,\"hostname\":", in->uptime_ms,
	       in->pid, in->pid1 ? "true" : "false", in->uid, in->gid);
	json_str(stdout, in->hostname);
	fputs(",\"boot_id\":", stdout);
	json_str(stdout, in->boot_id);
	printf(",\"connections\":%u,\"streams\":%u,\"processes\":%u,\"mounts\":%u,\"rss_bytes\":%" PRIu64 ",\"load\":[",
	       in->connections, in->streams, in->processes, in->mounts, in->rss_bytes);
	for (i = 0; i < 3; i++) {
		fputs(i ? "," : "", stdout);
		json_num(stdout, in->load[i], 2);
	}
	printf("],\"max_connections\":%u,\"max_streams\":%u,\"workers\":%u}\n", in->max_connections, in->max_streams,
	       in->workers);
}

static int cmd_info(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_info in;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if (opt == 'h')
			return show_cmd_help(ctx->cmd);
		return bad_option(ctx, argv, opt);
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	memset(&in, 0, sizeof(in));
	rc = sbx_info(c, NULL, &in, &err) < 0 ? fail(&err, NULL) : EXIT_OK;
	sbx_client_close(c);
	if (rc != EXIT_OK)
		return rc;
	/* Print nothing unterminated, whatever the library left in the arrays. */
	in.shim_version[sizeof(in.shim_version) - 1] = '\0';
	in.features[sizeof(in.features) - 1] = '\0';
	in.hostname[sizeof(in.hostname) - 1] = '\0';
	in.boot_id[sizeof(in.boot_id) - 1] = '\0';
	if (ctx->json)
		info_json(&in);
	else
		info_text(&in);
	return EXIT_OK;
}

static int cmd_decode(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_decoder *d;
	const char *path = "-";
	unsigned char buf[65536];
	FILE *f = stdin;
	int opt, rc = EXIT_OK;
	size_t n;

	while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if (opt == 'h')
			return show_cmd_help(ctx->cmd);
		return bad_option(ctx, argv, opt);
	}
	if (optind < argc)
		path = argv[optind++];
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if (strcmp(path, "-") != 0 && !(f = fopen(path, "rb"))) {
		fprintf(stderr, "sbx: %s: %s\n", path, strerror(errno));
		return EXIT_FAIL;
	}
	if (!(d = sbx_decoder_new(decode_cb, NULL))) {
		fprintf(stderr, "sbx: out of memory\n");
		rc = EXIT_FAIL;
		goto out;
	}
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (sbx_decoder_feed(d, buf, n) < 0) {
			fprintf(stderr, "sbx: %s: not a valid frame stream\n", path);
			rc = EXIT_FAIL;
			break;
		}
	}
	if (rc == EXIT_OK && ferror(f)) {
		fprintf(stderr, "sbx: %s: read error\n", path);
		rc = EXIT_FAIL;
	}
	/* A capture cut off mid-frame is normal; the decoder just reports the leftover. */
	sbx_decoder_free(d);
out:
	if (f != stdin)
		fclose(f);
	return rc;
}

/* Cheap pseudo-random bytes (xorshift64*), so compressing transports cannot cheat. */
static void fill_random(unsigned char *p, size_t len)
{
	uint64_t x = (now_ns() ^ ((uint64_t)getpid() << 32)) | 1, v;
	size_t i;

	for (i = 0; i < len; i += sizeof(v)) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		v = x * 0x2545f4914f6cdd1dULL;
		memcpy(p + i, &v, len - i < sizeof(v) ? len - i : sizeof(v));
	}
}

static int cmd_echo(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"size", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_client *c;
	struct sbx_error err;
	unsigned char *data = NULL, *back = NULL;
	size_t size = 1 << 20, i;
	uint64_t t0, t1;
	double secs, mbps;
	char hb[32];
	int opt, rc;

	while ((opt = getopt_long(argc, argv, ":s:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			if (parse_size(optarg, &size) < 0)
				return usage_error(ctx, "bad --size '%s': want BYTES[K|M|G]", optarg);
			break;
		case 'h':
			return show_cmd_help(ctx->cmd);
		default:
			return bad_option(ctx, argv, opt);
		}
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (!sbx_client_has_feature(c, "echo")) {
		fprintf(stderr, "sbx: %s: the shim does not support echo\n", ctx->target);
		rc = EXIT_FAIL;
		goto out;
	}
	data = malloc(size ? size : 1);
	back = malloc(size ? size : 1);
	if (!data || !back) {
		fprintf(stderr, "sbx: out of memory for %zu bytes\n", size);
		rc = EXIT_FAIL;
		goto out;
	}
	fill_random(data, size);
	t0 = now_ns();
	if (sbx_echo(c, NULL, data, size, back, &err) < 0) {
		rc = fail(&err, NULL);
		goto out;
	}
	t1 = now_ns();
	if (memcmp(data, back, size) != 0) {
		for (i = 0; data[i] == back[i]; i++)
			;
		fprintf(stderr, "sbx: echo: data differs at byte %zu of %zu\n", i, size);
		rc = EXIT_FAIL;
		goto out;
	}
	secs = (double)(t1 - t0) / 1e9;
	mbps = secs > 0 ? (double)size / 1e6 / secs : 0;
	if (ctx->json)
		printf("{\"bytes\":%zu,\"seconds\":%.6f,\"mb_per_s\":%.2f}\n", size, secs, mbps);
	else
		printf("echoed %zu bytes (%s) in %.3f s: %.2f MB/s\n", size, fmt_bytes(size, hb, sizeof(hb)), secs,
		       mbps);
out:
	sbx_client_close(c);
	free(data);
	free(back);
	return rc;
}

static int cmd_help(struct ctx *ctx, int argc, char **argv)
{
	const struct command *cmd;

	if (argc > 2)
		return usage_error(ctx, "unexpected argument '%s'", argv[2]);
	if (argc < 2) {
		print_help(stdout);
		return EXIT_OK;
	}
	if (!(cmd = find_command(argv[1])))
		return usage_error(ctx, "unknown command '%s'", argv[1]);
	return show_cmd_help(cmd);
}

static const struct command commands[] = {
	{"ping", cmd_ping, "[--wait SECONDS] [-c COUNT]",
	 "Connect (retrying for up to --wait seconds while the shim is not up yet: a readiness\n"
	 "check) and send COUNT pings (default 1), printing each round trip."},
	{"info", cmd_info, "", "Show the shim's versions, features, identity, load, counters and limits."},
	{"decode", cmd_decode, "[FILE]",
	 "Print one line per frame of a captured raw byte stream (FILE or stdin, e.g. what\n"
	 "'socat -r FILE' recorded). Does not connect. Exits 1 if the stream is malformed."},
	{"echo", cmd_echo, "[--size BYTES[K|M|G]]",
	 "Send BYTES (default 1M) of pseudo-random data through the shim's echo stream,\n"
	 "check it comes back unchanged, and print the throughput."},
	{"help", cmd_help, "[COMMAND]", "Show help for sbx or for COMMAND."},
};

static const struct command *find_command(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

static void print_help(FILE *f)
{
	size_t i;

	fprintf(f, "usage: sbx " GLOBAL_USAGE " COMMAND [ARGS]...\n\n"
		   "Talk to a sandbox-shim.\n\n"
		   "Options:\n"
		   "  -t, --target TARGET    the shim to talk to (default $SBX_TARGET): unix:PATH,\n"
		   "                         tcp:HOST:PORT, vsock:CID:PORT, fc:UDS_PATH:PORT, exec:COMMAND\n"
		   "      --token-file FILE  read the token from FILE (default $SBX_TOKEN)\n"
		   "      --timeout SECONDS  timeout for connecting and for each call\n"
		   "      --json             print results as JSON\n"
		   "      --trace            print every frame sent and received on stderr\n"
		   "  -h, --help             show this help\n"
		   "      --version          show the versions of sbx and libsbx\n\n"
		   "Commands:\n");
	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-7s %s\n", commands[i].name, commands[i].usage);
	fprintf(f, "\nExit status: 0 success, 1 the operation failed, 2 usage error,\n"
		   "3 cannot connect, handshake refused or protocol error.\n");
}

/* Output lost to a full disk or a closed pipe is a failure too. */
static int finish(int rc)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "sbx: write error: %s\n", strerror(errno));
		return rc == EXIT_OK ? EXIT_FAIL : rc;
	}
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"target", required_argument, NULL, 't'},
		{"token-file", required_argument, NULL, OPT_TOKEN_FILE},
		{"timeout", required_argument, NULL, OPT_TIMEOUT},
		{"json", no_argument, NULL, OPT_JSON},
		{"trace", no_argument, NULL, OPT_TRACE},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, OPT_VERSION},
		{NULL, 0, NULL, 0},
	};
	struct ctx ctx = {0};
	const struct command *cmd;
	int opt;

	/* A shim behind exec: that dies would otherwise kill us silently on the next
	 * write; as EPIPE it becomes an ordinary error with exit status 3. */
	signal(SIGPIPE, SIG_IGN);
	ctx.target = getenv("SBX_TARGET");
	while ((opt = getopt_long(argc, argv, "+:t:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 't':
			ctx.target = optarg;
			break;
		case OPT_TOKEN_FILE:
			ctx.token_file = optarg;
			break;
		case OPT_TIMEOUT:
			if (parse_seconds(optarg, &ctx.timeout_ms) < 0 || ctx.timeout_ms == 0)
				return usage_error(&ctx, "bad --timeout '%s': want seconds > 0", optarg);
			break;
		case OPT_JSON:
			ctx.json = 1;
			break;
		case OPT_TRACE:
			ctx.trace = 1;
			break;
		case 'h':
			print_help(stdout);
			return finish(EXIT_OK);
		case OPT_VERSION:
			printf("sbx %s (libsbx %s, protocol %d)\n", SBX_VERSION, sbx_version(), SBX_PROTOCOL_VERSION);
			return finish(EXIT_OK);
		default:
			return bad_option(&ctx, argv, opt);
		}
	}
	if (optind >= argc)
		return usage_error(&ctx, "no command given");
	if (!(cmd = find_command(argv[optind])))
		return usage_error(&ctx, "unknown command '%s'", argv[optind]);
	ctx.cmd = cmd;
	argc -= optind;
	argv += optind;
	/* 0, not 1: glibc then also forgets its position inside the old argv. */
	optind = 0;
	return finish(cmd->fn(&ctx, argc, argv));
}
