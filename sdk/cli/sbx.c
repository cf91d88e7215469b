/* sbx.c: the sbx command-line client, a thin shell over the public SDK in sbx.h. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Codes of main's own options and of the global ones (above any command's own codes,
 * which start at 256, so that cli_getopt can mix both in one table). */
enum {
	OPT_VERSION = 256,
	GOPT_TARGET = 0x7f00,
	GOPT_TOKEN_FILE,
	GOPT_TIMEOUT,
	GOPT_JSON,
	GOPT_TRACE,
	GOPT_AS,
	GOPT_NO_FOLLOW,
	GOPT_NO_SYMLINKS
};

#define GLOBAL_USAGE                                                                                             \
	"[-t TARGET] [--token-file F] [--timeout SECONDS] [--json] [--trace] [--as USER[:GROUP]] [--no-follow] " \
	"[--no-symlinks]"
#define PING_COUNT_MAX 100000

const struct option help_only_opts[] = {
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* ---- global options, before or after the command ---- */

static const struct global_opt {
	struct option opt;
	unsigned bit;      /* GLOBAL_* */
	const char *shown; /* in messages */
} globals[] = {
	{{"target", required_argument, NULL, GOPT_TARGET}, GLOBAL_TARGET, "-t/--target"},
	{{"token-file", required_argument, NULL, GOPT_TOKEN_FILE}, GLOBAL_TOKEN_FILE, "--token-file"},
	{{"timeout", required_argument, NULL, GOPT_TIMEOUT}, GLOBAL_TIMEOUT, "--timeout"},
	{{"json", no_argument, NULL, GOPT_JSON}, GLOBAL_JSON, "--json"},
	{{"trace", no_argument, NULL, GOPT_TRACE}, GLOBAL_TRACE, "--trace"},
	{{"as", required_argument, NULL, GOPT_AS}, GLOBAL_AS, "--as"},
	{{"no-follow", no_argument, NULL, GOPT_NO_FOLLOW}, GLOBAL_NO_FOLLOW, "--no-follow"},
	{{"no-symlinks", no_argument, NULL, GOPT_NO_SYMLINKS}, GLOBAL_NO_SYMLINKS, "--no-symlinks"},
};
#define NGLOBALS (sizeof(globals) / sizeof(globals[0]))

/* What --help, sbx(1) and the bash completion say of main's options: every option of globals[]
 * needs its entry here ("--name" in a spec), which `sbx --check-docs` (test cli_doc) checks. */
static const struct opt_doc main_docs[] = {
	{"-t, --target TARGET", "the shim to talk to (default $SBX_TARGET): unix:PATH,\n"
				"tcp:HOST:PORT, vsock:CID:PORT, fc:UDS_PATH:PORT, exec:COMMAND"},
	{"--token-file FILE", "read the token from FILE (default $SBX_TOKEN)"},
	{"--timeout SECONDS", "timeout for connecting and for each call"},
	{"--json", "print results as JSON"},
	{"--trace", "print every frame sent and received on stderr"},
	{"--as USER[:GROUP]", "file commands act as USER (name or number; its groups, GROUP as\n"
			      "the primary one): the shim's permission checks are that user's"},
	{"--no-follow", "file commands: the path's last component may not be a symlink (ELOOP)"},
	{"--no-symlinks", "file commands: no component of the path may be a symlink (ELOOP)"},
	{"-h, --help", "show this help"},
	{"--version", "show the versions of sbx and libsbx"},
};

/* What follows the options in --help and sbx(1). */
static const char main_notes[] =
	"-t, --token-file, --timeout, --json and --trace may also follow the command\n"
	"(sbx stat --json PATH), except where the command has an option of that name\n"
	"(exec and sh: -t is --tty, --timeout the command's); each at most on one side.\n"
	"--json is refused by commands without JSON output; --as, --no-follow and --no-symlinks\n"
	"by commands that do no file operations (all but cat, put, stat, exists, ls, mkdir, rm,\n"
	"mv, cp, chmod, chown, ln, readlink, truncate, touch, realpath, df, watch, backup and\n"
	"restore).";
/* room for the longest command table plus the globals */
#define MERGED_MAX 48

/* ---- --as, --no-follow, --no-symlinks: the file commands' identity and resolve flags ---- */

/* The commands whose calls are file operations (sbx_call_opts' user, group, resolve). */
static const char *const fs_commands[] = {
	"cat",   "put", "stat",     "exists",   "ls",    "mkdir",    "rm", "mv",    "cp",     "chmod",
	"chown", "ln",  "readlink", "truncate", "touch", "realpath", "df", "watch", "backup", "restore",
};

static int is_fs_command(const struct command *cmd)
{
	size_t i;

	for (i = 0; i < sizeof(fs_commands) / sizeof(fs_commands[0]); i++)
		if (!strcmp(cmd->name, fs_commands[i]))
			return 1;
	return 0;
}

/* A file option on a command that would ignore it: refused, rather than a command
 * silently running as the shim (sbx --as nobody exec ...: exec has its own --user).
 * Returns 1 after printing why. */
static int fs_global_misused(const struct ctx *ctx)
{
	const char *which = ctx->as_user                         ? "--as" :
			    ctx->resolve & SBX_RESOLVE_NO_FOLLOW ? "--no-follow" :
			    ctx->resolve                         ? "--no-symlinks" :
								   NULL;

	if (!which || !ctx->cmd || is_fs_command(ctx->cmd))
		return 0;
	usage_error(ctx, "%s: '%s' does no file operations", which, ctx->cmd->name);
	return 1;
}

void fs_opts_into(const struct ctx *ctx, struct sbx_call_opts *opts)
{
	opts->struct_size = sizeof(*opts);
	opts->user = ctx->as_user;
	opts->group = ctx->as_group;
	opts->resolve = ctx->resolve;
}

const struct sbx_call_opts *fs_opts(const struct ctx *ctx)
{
	static struct sbx_call_opts o;

	if (!ctx->as_user && !ctx->resolve)
		return NULL;
	fs_opts_into(ctx, &o);
	return &o;
}

static const struct global_opt *find_global(int code)
{
	size_t i;

	for (i = 0; i < NGLOBALS; i++)
		if (globals[i].opt.val == code)
			return &globals[i];
	return NULL;
}

/* Store a global option in ctx. Given both before and after the command it is refused
 * rather than one silently winning (repeated on one side, the last wins, as it always
 * did). Returns 0, or EXIT_USAGE after printing why. */
static int set_global(struct ctx *ctx, const struct global_opt *g, const char *arg, int after)
{
	if (after && (ctx->before & g->bit))
		return usage_error(ctx, "option '%s' given both before and after the command", g->shown);
	if (!after)
		ctx->before |= g->bit;
	switch (g->opt.val) {
	case GOPT_TARGET:
		ctx->target = arg;
		break;
	case GOPT_TOKEN_FILE:
		ctx->token_file = arg;
		break;
	case GOPT_TIMEOUT:
		if (parse_seconds(arg, &ctx->timeout_ms) < 0 || ctx->timeout_ms == 0)
			return usage_error(ctx, "bad --timeout '%s': want seconds > 0", arg);
		break;
	case GOPT_JSON:
		if (ctx->cmd && !(ctx->cmd->flags & CMD_JSON))
			return usage_error(ctx, "--json: this command has no JSON output");
		ctx->json = 1;
		break;
	case GOPT_TRACE:
		ctx->trace = 1;
		break;
	case GOPT_AS: {
		static char as_user[256]; /* the user part (arg stays as given: messages quote it) */
		const char *colon = strchr(arg, ':');
		size_t ulen = colon ? (size_t)(colon - arg) : strlen(arg);

		if (ulen == 0 || (colon && (colon[1] == '\0' || strchr(colon + 1, ':'))))
			return usage_error(ctx, "bad --as '%s': want USER or USER:GROUP (names or numbers)", arg);
		if (ulen >= sizeof(as_user))
			return usage_error(ctx, "bad --as '%.40s...': the user is longer than %zu bytes", arg,
					   sizeof(as_user) - 1);
		memcpy(as_user, arg, ulen);
		as_user[ulen] = '\0';
		ctx->as_user = as_user;
		ctx->as_group = colon ? colon + 1 : NULL;
		break;
	}
	case GOPT_NO_FOLLOW:
		ctx->resolve |= SBX_RESOLVE_NO_FOLLOW;
		break;
	case GOPT_NO_SYMLINKS:
		ctx->resolve |= SBX_RESOLVE_NO_SYMLINKS;
		break;
	default:
		break;
	}
	if (after && fs_global_misused(ctx))
		return EXIT_USAGE;
	return 0;
}

/* Which of "unknown", "ambiguous" or "takes no argument" a long option getopt refused is. */
static int bad_long_option(const struct ctx *ctx, const struct option *opts, const char *arg)
{
	size_t len = strcspn(arg + 2, "="), i, prefix = 0;
	const char *name = NULL;

	for (i = 0; opts[i].name; i++) {
		if (strncmp(opts[i].name, arg + 2, len) != 0)
			continue;
		name = opts[i].name;
		if (name[len] == '\0') {
			prefix = 1;
			break;
		}
		prefix++;
	}
	if (prefix > 1)
		return usage_error(ctx, "ambiguous option '%.*s'", (int)len + 2, arg);
	if (prefix == 1 && arg[2 + len] == '=')
		return usage_error(ctx, "option '--%s' takes no argument", name);
	return usage_error(ctx, "unknown option '%.*s'", (int)len + 2, arg);
}

/* cli_probe()'s state: while on, cli_getopt records its tables instead of parsing. */
static struct {
	int on;
	const char *shorts;
	const struct option *longs;
} probe;

int cli_getopt(struct ctx *ctx, int argc, char **argv, const char *shortopts, const struct option *longopts)
{
	/* Rebuilt on each call (the same each time for one command): getopt_long keeps no
	 * pointer into either between calls. */
	static struct option merged[MERGED_MAX];
	static char shorts[64];
	const struct global_opt *g;
	size_t n, i, j;
	int opt, own_t;

	if (probe.on) {
		/* cli_probe(): record the command's options and make it stop (as after a usage error) */
		if (!probe.longs) {
			probe.shorts = shortopts;
			probe.longs = longopts;
			return CLI_OPT_FAILED;
		}
		return -1;
	}
	for (n = 0; longopts[n].name; n++)
		;
	/* A command table this big is a bug in sbx, not a user's error. */
	if (n + NGLOBALS >= MERGED_MAX || strlen(shortopts) + 3 > sizeof(shorts))
		abort();
	memcpy(merged, longopts, n * sizeof(*merged));
	for (i = 0; i < NGLOBALS; i++) {
		for (j = 0; longopts[j].name && strcmp(longopts[j].name, globals[i].opt.name) != 0; j++)
			;
		if (!longopts[j].name)
			merged[n++] = globals[i].opt;
	}
	memset(&merged[n], 0, sizeof(merged[n]));
	own_t = strchr(shortopts, 't') != NULL;
	snprintf(shorts, sizeof(shorts), "%s%s", shortopts, own_t ? "" : "t:");
	for (;;) {
		opt = getopt_long(argc, argv, shorts, merged, NULL);
		if (opt == '?' && optind > 0 && !strncmp(argv[optind - 1], "--", 2) && argv[optind - 1][2]) {
			bad_long_option(ctx, merged, argv[optind - 1]);
			return CLI_OPT_FAILED;
		}
		g = opt == 't' && !own_t ? &globals[0] : find_global(opt);
		if (!g)
			return opt;
		if (set_global(ctx, g, optarg, 1) != 0)
			return CLI_OPT_FAILED;
	}
}

/* ---- errors and usage ---- */

/* A failure while connecting is always "cannot connect". */
int fail(const struct sbx_error *err, const char *target)
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

static void print_cmd_usage(FILE *f, const struct command *cmd)
{
	fprintf(f, "usage: sbx [OPTIONS] %s%s%s\n", cmd->name, *cmd->usage ? " " : "", cmd->usage);
}

int usage_error(const struct ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "sbx: %s%s", ctx->cmd ? ctx->cmd->name : "", ctx->cmd ? ": " : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (ctx->cmd) {
		fputc('\n', stderr);
		print_cmd_usage(stderr, ctx->cmd);
		fprintf(stderr, "Try 'sbx %s --help' for more information.\n", ctx->cmd->name);
	} else {
		fprintf(stderr, "\nusage: sbx " GLOBAL_USAGE " COMMAND [ARGS]...\n");
		fprintf(stderr, "Try 'sbx --help' for more information.\n");
	}
	return EXIT_USAGE;
}

static int show_cmd_help(const struct command *cmd)
{
	print_cmd_usage(stdout, cmd);
	printf("\n%s\n", cmd->help);
	return EXIT_OK;
}

int other_option(const struct ctx *ctx, char **argv, int opt)
{
	const char *arg = optind > 0 ? argv[optind - 1] : "";

	if (opt == CLI_OPT_FAILED)
		return EXIT_USAGE;
	if (opt == 'h')
		return show_cmd_help(ctx->cmd);
	if (opt == ':')
		return usage_error(ctx, "option '%s' needs an argument", arg);
	if (optopt && strncmp(arg, "--", 2) != 0)
		return usage_error(ctx, "unknown option '-%c'", optopt);
	return usage_error(ctx, "unknown or malformed option '%s'", arg);
}

int no_more_args(const struct ctx *ctx, int argc, char **argv)
{
	if (optind < argc)
		return usage_error(ctx, "unexpected argument '%s'", argv[optind]);
	return EXIT_OK;
}

int want_operands(const struct ctx *ctx, int argc, char **argv, int n)
{
	if (argc - optind < n && optind < argc)
		return usage_error(ctx, "missing operand after '%s'", argv[argc - 1]);
	if (argc - optind < n)
		return usage_error(ctx, "missing operand");
	if (argc - optind > n)
		return usage_error(ctx, "unexpected argument '%s'", argv[optind + n]);
	return EXIT_OK;
}

/* ---- parsing ---- */

/* Rounded up so that 0.0001 is not "none". */
int parse_seconds(const char *s, int *ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	/* Written so that NaN fails too. */
	if (end == s || *end || errno || !(v >= 0 && v <= 2000000.0))
		return -1;
	*ms = (int)(v * 1000.0);
	if (*ms < v * 1000.0)
		(*ms)++;
	return 0;
}

/* Only digits: strtoull alone would take " 12", "+12" and "-12" (as a huge number). */
static int parse_u64(const char *s, int base, char **end, uint64_t *out)
{
	const char *digits = base == 8 ? "01234567" : "0123456789";

	if (!*s || !strchr(digits, *s))
		return -1;
	errno = 0;
	*out = strtoull(s, end, base);
	return errno ? -1 : 0;
}

int parse_size(const char *s, uint64_t *out)
{
	const char *suffixes = "KMGT", *p;
	uint64_t v, mul = 1;
	char *end;

	if (parse_u64(s, 10, &end, &v) < 0)
		return -1;
	if (*end && (p = strchr(suffixes, toupper((unsigned char)*end)))) {
		mul = 1ULL << (10 * (p - suffixes + 1));
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
	}
	if (*end || v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

int parse_mode(const char *s, unsigned *out)
{
	uint64_t v;
	char *end;

	if (parse_u64(s, 8, &end, &v) < 0 || *end || v > 07777)
		return -1;
	*out = (unsigned)v;
	return 0;
}

int parse_id(const char *s, int64_t *out)
{
	uint64_t v;
	char *end;

	if (parse_u64(s, 10, &end, &v) < 0 || *end || v >= UINT32_MAX)
		return -1;
	*out = (int64_t)v;
	return 0;
}

/* n decimal digits at *p, advancing it. */
static int fixed_digits(const char **p, int n, int *out)
{
	int v = 0;

	for (; n > 0; n--, (*p)++) {
		if (**p < '0' || **p > '9')
			return -1;
		v = v * 10 + (**p - '0');
	}
	*out = v;
	return 0;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (H. Hinnant's
 * days_from_civil): no timegm(), which would read the time zone database. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	int64_t era, yoe, doy;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
	return era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
}

int parse_time(const char *s, struct sbx_timespec *out)
{
	static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	int y, mo, d, h, mi, sec, oh = 0, om = 0, sign = 0, leap;
	uint32_t nsec = 0, scale = 100000000;
	const char *p = s;

	if (fixed_digits(&p, 4, &y) || *p++ != '-' || fixed_digits(&p, 2, &mo) || *p++ != '-' ||
	    fixed_digits(&p, 2, &d))
		return -1;
	if (*p != 'T' && *p != 't' && *p != ' ')
		return -1;
	p++;
	if (fixed_digits(&p, 2, &h) || *p++ != ':' || fixed_digits(&p, 2, &mi) || *p++ != ':' ||
	    fixed_digits(&p, 2, &sec))
		return -1;
	if (*p == '.') {
		if (*++p < '0' || *p > '9')
			return -1;
		for (; *p >= '0' && *p <= '9'; p++, scale /= 10)
			nsec += (uint32_t)(*p - '0') * scale;
	}
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		sign = *p++ == '-' ? -1 : 1;
		if (fixed_digits(&p, 2, &oh) || *p++ != ':' || fixed_digits(&p, 2, &om) || oh > 23 || om > 59)
			return -1;
	} else {
		return -1;
	}
	leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	if (*p || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap) || h > 23 ||
	    mi > 59 || sec > 59)
		return -1;
	/* Local time minus its offset from UTC is UTC. */
	out->sec = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - sign * (oh * 3600 + om * 60);
	out->nsec = nsec;
	return 0;
}

/* ---- output ---- */

/* Length of the valid UTF-8 sequence of at most len bytes at p (2-4), else 0. */
size_t utf8_len(const unsigned char *p, size_t len)
{
	size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2, i;
	uint32_t cp = p[0] & (0x7f >> n);

	if (p[0] < 0xc2 || p[0] > 0xf4 || n > len)
		return 0;
	for (i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* The letter of c's JSON short escape (\n, \t, \r, \b, \f, \", \\), or 0. */
static char json_short_escape(unsigned char c)
{
	switch (c) {
	case '"':
	case '\\':
		return (char)c;
	case '\n':
		return 'n';
	case '\t':
		return 't';
	case '\r':
		return 'r';
	case '\b':
		return 'b';
	case '\f':
		return 'f';
	default:
		return 0;
	}
}

/* len bytes of s as a JSON string: the short escapes; other control characters (DEL too,
 * invisible on a terminal) and bytes that are not UTF-8 as \u00XX. */
void json_strn(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	size_t n;
	char e;

	putchar('"');
	while (p < end) {
		if ((e = json_short_escape(*p)) != 0) {
			putchar('\\');
			putchar(e);
			p++;
		} else if (*p >= 0x20 && *p < 0x7f) {
			putchar(*p++);
		} else if ((n = utf8_len(p, (size_t)(end - p))) > 0) {
			fwrite(p, 1, n, stdout);
			p += n;
		} else {
			printf("\\u%04x", *p++);
		}
	}
	putchar('"');
}

void json_str(const char *s)
{
	json_strn(s ? s : "", s ? strlen(s) : 0);
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
	snprintf(buf, size, i ? "%.1f %s" : "%.0f %s", v, units[i]);
	return buf;
}

/* One aligned "key: value" line. */
void kv(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s:%*s", key, (int)(14 - strlen(key)), "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static void trace_cb(void *ud, const char *line)
{
	(void)ud;
	fprintf(stderr, "sbx: trace: %s\n", line);
}

static void decode_cb(void *ud, const char *line)
{
	(void)ud;
	puts(line);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- connecting ---- */

/* Read the token, without the trailing newline/whitespace editors and echo leave. */
static int read_token(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	const char *why;
	size_t n;

	if (!f) {
		fprintf(stderr, "sbx: %s: %s\n", path, strerror(errno));
		return -1;
	}
	n = fread(buf, 1, size - 1, f);
	why = ferror(f) ? "read error" : !feof(f) ? "token file too large" : NULL;
	fclose(f);
	while (n > 0 && strchr(" \t\r\n", buf[n - 1]))
		n--;
	buf[n] = '\0';
	if (!why && (n == 0 || strlen(buf) != n))
		why = n ? "token contains a NUL byte" : "empty token";
	if (why)
		fprintf(stderr, "sbx: %s: %s\n", path, why);
	return why ? -1 : 0;
}

int open_client(const struct ctx *ctx, int wait_ms, struct sbx_client **out)
{
	struct sbx_connect_opts opts = SBX_CONNECT_OPTS_INIT;
	struct sbx_error err;
	char token[4096];
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
	/* Keep the secret out of a later core dump. */
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
	uint64_t *rtt = NULL, ns;
	long count = 1, i;
	char *end;
	int opt, wait_ms = 0, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":w:c:h", longopts)) != -1) {
		switch (opt) {
		case 'w':
			if (parse_seconds(optarg, &wait_ms) < 0)
				return usage_error(ctx, "bad --wait '%s': want seconds", optarg);
			break;
		case 'c':
			count = strtol(optarg, &end, 10);
			if (end == optarg || *end || count < 1 || count > PING_COUNT_MAX)
				return usage_error(ctx, "bad count '%s': want 1..%d", optarg, PING_COUNT_MAX);
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if (ctx->json && !(rtt = calloc((size_t)count, sizeof(*rtt)))) {
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
		json_str(si->shim_version);
		printf(",\"protocol_version\":%u,\"pid\":%u,\"pid1\":%s,\"uid\":%u,\"hostname\":", si->protocol_version,
		       si->pid, si->pid1 ? "true" : "false", si->uid);
		json_str(si->hostname);
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
	uint64_t s = in->uptime_ms / 1000;
	char buf[32];

	kv("shim version", "%s", in->shim_version);
	kv("protocol", "%u", in->protocol_version);
	kv("features", "%s", in->features);
	if (s >= 86400)
		kv("uptime", "%" PRIu64 "d %02u:%02u:%02u", s / 86400, (unsigned)(s / 3600 % 24),
		   (unsigned)(s / 60 % 60), (unsigned)(s % 60));
	else
		kv("uptime", "%02u:%02u:%02u", (unsigned)(s / 3600), (unsigned)(s / 60 % 60), (unsigned)(s % 60));
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
	kv("generation", "%" PRIu64, in->generation);
}

static void info_json(const struct sbx_info *in)
{
	const char *p = in->features, *sep = "";
	size_t n;
	int i;

	fputs("{\"shim_version\":", stdout);
	json_str(in->shim_version);
	printf(",\"protocol_version\":%u,\"features\":[", in->protocol_version);
	for (p += strspn(p, " "); *p; p += n, p += strspn(p, " ")) {
		n = strcspn(p, " ");
		fputs(sep, stdout);
		json_strn(p, n);
		sep = ",";
	}
	printf("],\"uptime_ms\":%" PRIu64 ",\"pid\":%u,\"pid1\":%s,\"uid\":%u,\"gid\":%u,\"hostname\":", in->uptime_ms,
	       in->pid, in->pid1 ? "true" : "false", in->uid, in->gid);
	json_str(in->hostname);
	fputs(",\"boot_id\":", stdout);
	json_str(in->boot_id);
	printf(",\"connections\":%u,\"streams\":%u,\"processes\":%u,\"mounts\":%u,\"rss_bytes\":%" PRIu64 ",\"load\":[",
	       in->connections, in->streams, in->processes, in->mounts, in->rss_bytes);
	/* JSON has no NaN or infinity. */
	for (i = 0; i < 3; i++)
		printf(isfinite(in->load[i]) ? "%s%.2f" : "%snull", i ? "," : "", in->load[i]);
	printf("],\"max_connections\":%u,\"max_streams\":%u,\"workers\":%u,\"generation\":%" PRIu64 "}\n",
	       in->max_connections, in->max_streams, in->workers, in->generation);
}

static int cmd_info(struct ctx *ctx, int argc, char **argv)
{
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_info in = SBX_INFO_INIT;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
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
	struct sbx_decoder *d;
	const char *path = "-";
	unsigned char buf[65536];
	FILE *f = stdin;
	int opt, rc;
	size_t n;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
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
	/* Stop once stdout is gone (SIGPIPE is ignored), or "| head" on a pipe never ends. */
	while (!ferror(stdout) && (n = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (sbx_decoder_feed(d, buf, n) < 0) {
			fprintf(stderr, "sbx: %s: not a valid frame stream\n", path);
			rc = EXIT_FAIL;
			break;
		}
	}
	if (ferror(f)) {
		fprintf(stderr, "sbx: %s: read error\n", path);
		rc = EXIT_FAIL;
	}
	/* A capture cut off mid-frame is normal: the decoder just reports the leftover. */
	sbx_decoder_free(d);
out:
	if (f != stdin)
		fclose(f);
	return rc;
}

/* Cheap pseudo-random bytes (xorshift64*), so that a compressing transport cannot flatter. */
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
	unsigned char *data = NULL, *back = NULL;
	struct sbx_client *c;
	struct sbx_error err;
	size_t size = 1 << 20, i;
	uint64_t t0, t1, v;
	double secs, mbps;
	char buf[32];
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":s:h", longopts)) != -1) {
		if (opt != 's')
			return other_option(ctx, argv, opt);
		if (parse_size(optarg, &v) < 0 || v > SIZE_MAX)
			return usage_error(ctx, "bad --size '%s': want BYTES[K|M|G]", optarg);
		size = (size_t)v;
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
		printf("echoed %zu bytes (%s) in %.3f s: %.2f MB/s\n", size, fmt_bytes(size, buf, sizeof(buf)), secs,
		       mbps);
out:
	sbx_client_close(c);
	free(data);
	free(back);
	return rc;
}

static const struct command commands[] = {
	{"ping", cmd_ping, "[-w SECONDS] [-c COUNT]",
	 "Connect, retrying for up to --wait seconds while the shim is not up yet (a readiness\n"
	 "check), then send COUNT pings (default 1) and print each round trip.\n"
	 "  -w, --wait SECONDS  keep trying to connect for this long (default: one try)\n"
	 "  -c, --count COUNT   send COUNT pings, 1 to 100000",
	 CMD_JSON},
	{"info", cmd_info, "", "Show the shim's versions, features, identity, load, counters and limits.", CMD_JSON},
	{"decode", cmd_decode, "[FILE]",
	 "Print one line per frame of a captured raw byte stream (FILE or stdin, e.g. what\n"
	 "'socat -r FILE' recorded). Does not connect. Exits 1 if the stream is malformed.",
	 0},
	{"echo", cmd_echo, "[-s|--size BYTES[K|M|G]]",
	 "Send BYTES (default 1M) of pseudo-random data through the shim's echo stream, check\n"
	 "that it comes back unchanged, and print the throughput.",
	 CMD_JSON},
	{"help", cmd_help, "[COMMAND]",
	 "List the commands, grouped, with a line on each; with COMMAND, print its usage and\n"
	 "options (what 'sbx COMMAND --help' prints).",
	 0},
	/* files: paths are absolute, as the shim sees them (beneath its --root, if any) */
	{"cat", cmd_cat, "PATH [--offset N] [--length N] [--special]",
	 "Write the file's bytes (--length N of them, from byte --offset N; N may have a K/M/G\n"
	 "suffix) to stdout, streamed. If the read fails part way, stdout has exactly the bytes\n"
	 "read before the error and the exit status is 1. A FIFO, socket or device is read only\n"
	 "with --special (else EPERM naming its type).",
	 0},
	{"put", cmd_put, "PATH [--mode 0644] [--append] [--exclusive] [--parents] [--no-atomic] [--special]",
	 "Write stdin to the file. By default atomically: the bytes go to a temporary file that\n"
	 "replaces PATH only when all arrived, so a failure or an interrupt leaves the old file.\n"
	 "  --mode MODE   octal permissions (default: keep the old file's, 0644 for a new one)\n"
	 "  --append      append in place\n"
	 "  --exclusive   fail with EEXIST if PATH exists\n"
	 "  --parents     create missing parent directories\n"
	 "  --no-atomic   truncate and write in place\n"
	 "  --special     write into a FIFO, socket or device (else EPERM naming its type)\n"
	 "Prints nothing; with --json, the stat of the file written (as 'stat' prints it).",
	 CMD_JSON},
	{"stat", cmd_stat, "[-L] PATH",
	 "Show type, size, mode, owner, links, inode, device, times (RFC 3339, UTC, with\n"
	 "nanoseconds) and, for a symlink, its target. -L, --dereference: the file a symlink points to.\n"
	 "With --json, one object: times as RFC 3339 strings and as *_sec/*_nsec numbers,\n"
	 "mode as a number and as an octal string, link_target null unless a symlink.",
	 CMD_JSON},
	{"exists", cmd_exists, "PATH",
	 "Print nothing; exit 0 if PATH exists (a dangling symlink does), 1 if not, 3 if the\n"
	 "shim cannot be reached. Other errors (EACCES...) are printed and exit 1.",
	 0},
	{"ls", cmd_ls, "[-l] [-a] [-R] [--depth N] PATH",
	 "List a directory, one name per line, in the order the shim reads them.\n"
	 "  -l          also type and mode, size and mtime (UTC)\n"
	 "  -a          include names starting with '.'\n"
	 "  -R          recurse without limit (names relative to PATH: sub/name)\n"
	 "  --depth N   recurse N levels (1: PATH's own entries, the default)\n"
	 "Names are printed escaped like 'ls -b' does, except that spaces are left as they are:\n"
	 "\\\\ for a backslash, \\n \\t ... for control characters, \\ooo (octal) for other bytes\n"
	 "that are not printable or not valid UTF-8. With --json, one JSON object per line\n"
	 "(NDJSON, so a huge listing streams): the name exact, the stat as 'stat --json' gives\n"
	 "it; bytes that are not valid UTF-8 appear as \\u00XX (the byte's value).",
	 CMD_JSON},
	{"mkdir", cmd_mkdir, "[-p] [-m MODE] PATH",
	 "Create a directory (mode 0755 unless -m gives octal MODE). -p: create missing parents\n"
	 "too, and do not fail if PATH is already a directory.",
	 0},
	{"rm", cmd_rm, "[-r] PATH", "Remove a file, symlink or empty directory; -r: a directory and all in it.", 0},
	{"mv", cmd_mv, "SRC DST", "Rename SRC to DST (copy, then remove, across filesystems).", 0},
	{"cp", cmd_cp, "[-r] SRC DST",
	 "Copy a file, or with -r a tree, keeping modes, times and symlinks (owners as root).", 0},
	{"chmod", cmd_chmod, "MODE PATH", "Set PATH's permissions to octal MODE (e.g. 0640, 4755).", 0},
	{"chown", cmd_chown, "UID[:GID] PATH",
	 "Set PATH's owner, and group if :GID is given; ':GID' alone sets only the group.\n"
	 "Numbers only. Follows a symlink.",
	 0},
	{"ln", cmd_ln, "[-s] TARGET LINK",
	 "Make LINK a hard link to TARGET; -s: a symlink holding TARGET as given (may be relative).", 0},
	{"readlink", cmd_readlink, "PATH",
	 "Print a symlink's target (the bytes as they are). With --json: {\"target\": ...}.", CMD_JSON},
	{"truncate", cmd_truncate, "-s|--size SIZE [--special] PATH",
	 "Set the file's size to SIZE bytes (a K/M/G/T suffix multiplies by 1024^n). A FIFO or a\n"
	 "device only with --special (else EPERM naming its type).",
	 0},
	{"touch", cmd_touch, "[-d|--date RFC3339] PATH",
	 "Set PATH's access and modification times to now, or to the time -d gives (e.g.\n"
	 "2024-05-01T12:34:56.123456789Z or 2024-05-01T14:34:56+02:00). Creates an empty file\n"
	 "if PATH does not exist.",
	 0},
	{"realpath", cmd_realpath, "PATH",
	 "Print PATH with symlinks, '.' and '..' resolved. With --json: {\"path\": ...}.", CMD_JSON},
	{"df", cmd_df, "PATH",
	 "Show the size, use and free space (in 1K blocks) and inodes of PATH's filesystem.\n"
	 "With --json, one object with the statfs fields and the sizes in bytes.",
	 CMD_JSON},
	{"watch", cmd_watch, "[-r] PATH",
	 "Print filesystem events on PATH (and, with -r or --recursive, every directory below it, including new\n"
	 "ones) until interrupted (SIGINT or SIGTERM: exit 0) or PATH is deleted. One line per\n"
	 "event: 'create /path' (types: create, modify, delete, moved_from, moved_to, attrib,\n"
	 "delete_self, overflow), the path escaped as 'ls' does. With --json, one JSON object\n"
	 "per line: {\"type\", \"path\", \"is_dir\", \"cookie\"}. --timeout does not end a watch.",
	 CMD_JSON},
	/* commands and processes */
	{"exec", cmd_exec,
	 "[--cwd DIR] [--env K=V]... [--user U[:G]] [--timeout SECONDS] [-i] [-t] [--detach] [OPTIONS] -- ARGV...",
	 "Run ARGV (no shell; ARGV[0] is looked up in the shim's PATH) and stream its stdout and\n"
	 "stderr to ours, byte-exact. Exits with the command's status: its exit code, 128+N when\n"
	 "killed by signal N, 124 when it timed out; 1 (with the error on stderr) when it cannot\n"
	 "be started (ENOENT, EACCES, EINVAL for an unknown user...).\n"
	 "  --cwd DIR               working directory (default /)\n"
	 "  --env K=V               add to (or replace in) the environment; repeatable\n"
	 "  --clear-env             start from an empty environment\n"
	 "  --user U[:G]            run as user U (name or number), group G\n"
	 "  --timeout SECONDS       then SIGTERM to its process group, --kill-grace (5 s), SIGKILL\n"
	 "  --kill-grace SECONDS    the grace period after the timeout's SIGTERM\n"
	 "  -i, --interactive       stream our stdin to the command (closed at EOF); else /dev/null\n"
	 "  -t, --tty               run on a pseudo-terminal of our terminal's size; with -i on a\n"
	 "                          terminal, ours is raw while it runs and resizes follow\n"
	 "  --detach                start it in the background (it outlives us) and print its id\n"
	 "  --name NAME             the id of a detached process (default: generated)\n"
	 "  --no-new-privs          set no_new_privs\n"
	 "  --drop-caps[=KEEP,...]  drop every capability (bounding set too) but those listed\n"
	 "  --seccomp POLICY        default (the deny-list), none, or a policy file in the sandbox\n"
	 "  --rlimit NAME=SOFT[:HARD]  nofile, nproc, as, cpu, fsize, core, stack, memlock;\n"
	 "                          numbers (K/M/G suffixes) or 'unlimited'; repeatable\n"
	 "  --nice N, --oom-score-adj N\n"
	 "SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the command (twice); a third\n"
	 "kills its process group. The global --timeout (given before 'exec') is for connecting only.",
	 CMD_JSON},
	{"sh", cmd_sh, "[EXEC OPTIONS] 'COMMAND'",
	 "Run COMMAND with /bin/sh -c, as 'exec' does (same options and exit statuses).", CMD_JSON},
	{"eval", cmd_eval, "[--interp ARGV] CODE",
	 "Run CODE through an interpreter (--interp: a space-separated argv, default 'python3 -c';\n"
	 "CODE is its last argument) and print what it printed. Exits with its status; when that\n"
	 "is not 0, its stderr (printed as well) says why.",
	 0},
	{"ps", cmd_ps, "[--json]",
	 "List the processes the shim started: ID PID STATE EXIT STARTED COMMAND. EXIT is the\n"
	 "exit code, the signal that killed it, or 'timeout'. With --json, one array of objects.",
	 CMD_JSON},
	{"logs", cmd_logs, "[-f|--follow] ID",
	 "Print what a background process wrote (the last 1 MiB of each stream, as buffered by\n"
	 "the shim), stdout to stdout and stderr to stderr; -f: then follow until it exits.",
	 0},
	{"kill", cmd_kill, "[-s|--signal SIGNAL] ID",
	 "Send SIGNAL (TERM, SIGKILL, 9...; default TERM) to the process's whole process group.", 0},
	{"wait", cmd_wait, "ID", "Wait for the process to end; exit with its status as 'exec' does.", 0},
	{"rmproc", cmd_rmproc, "[-k] ID", "Forget an exited process (EBUSY while it runs; -k, --kill: kill it first).",
	 0},
	/* directory archives */
	{"backup", cmd_backup,
	 "DIR [-o FILE|-] [--exclude PATTERN]... [--compress zstd|gzip|none] [--level N] [--skip-unreadable] "
	 "[--one-file-system] [--to PATH] [--json]",
	 "Archive the directory DIR in the sandbox as a pax tar stream, written as it is made.\n"
	 "  -o, --output FILE  to a local FILE, atomically (a temporary file beside it, renamed\n"
	 "                     when complete; removed on failure); -o - or no -o: to stdout,\n"
	 "                     which must not be a terminal\n"
	 "  --to PATH          to the file PATH inside the sandbox instead (written atomically)\n"
	 "  --exclude PATTERN  leave out what matches the glob (tar's meaning); repeatable\n"
	 "  --compress ALGO    zstd, gzip or none (the default)\n"
	 "  --level N          the compression level (default: the compressor's own)\n"
	 "  --skip-unreadable  list unreadable files in the record instead of failing\n"
	 "  --one-file-system  leave out mount points below DIR\n"
	 "Prints the record {id, dir, bytes, sha256, entries, source_bytes, compression, skipped,\n"
	 "changed, created_at, to_path} as one JSON line on stderr; with --json on stdout (only\n"
	 "when the archive goes to a file: -o FILE or --to). Names that are not valid UTF-8 show\n"
	 "their bytes as \\u00XX. On a terminal, progress (bytes, files, rate) is shown on stderr.\n"
	 "SIGINT/SIGTERM/SIGHUP cancel the backup (a second one exits at once).",
	 CMD_JSON},
	{"restore", cmd_restore,
	 "DIR [-i FILE|-] [--merge] [--sha256 HEX] [--from PATH] [--allow-devices] [--allow-empty] [--json]",
	 "Restore the directory DIR in the sandbox from a tar archive (compressed or not) read\n"
	 "from stdin (not a terminal), or from a local FILE with -i (--input).\n"
	 "  --from PATH      read the archive from the file PATH inside the sandbox instead\n"
	 "  --merge          extract into DIR as it is; by default DIR is replaced atomically\n"
	 "                   by the archive's content (extracted beside it, then swapped in)\n"
	 "  --sha256 HEX     fail unless the archive's sha256 is HEX (checked before the swap)\n"
	 "  --allow-devices  extract device nodes (refused by default)\n"
	 "  --allow-empty    accept an archive without members (DIR becomes empty); refused\n"
	 "                   by default, as is any archive that is not whole (EBADMSG)\n"
	 "Refuses absolute names, '..', writing through symlinks and links leading out of DIR.\n"
	 "A failed, refused or interrupted restore leaves DIR as it was (with --merge: unless\n"
	 "it fails while moving the verified entries in).\n"
	 "Prints nothing; with --json, {bytes, entries, sha256} on stdout. On a terminal,\n"
	 "progress is shown on stderr.",
	 CMD_JSON},
	/* tunnels */
	{"forward", cmd_forward, "[-b|--bind HOST] [HOST:]LOCAL_PORT [GUEST_HOST:]GUEST_PORT",
	 "Listen on LOCAL_PORT of this host (on 127.0.0.1 unless --bind HOST, or HOST:LOCAL_PORT)\n"
	 "and relay each connection to GUEST_HOST:GUEST_PORT inside the sandbox (GUEST_HOST: a\n"
	 "numeric address, default 127.0.0.1), over the shim connection. LOCAL_PORT 0: the\n"
	 "kernel chooses (printed). Runs until SIGINT/SIGTERM/SIGHUP; logs each connection on\n"
	 "stderr (a connection the sandbox refuses is reset here and logged with its errno).",
	 0},
	{"reverse", cmd_reverse, "[GUEST_HOST:]GUEST_PORT [LOCAL_HOST:]LOCAL_PORT",
	 "Have the shim listen on GUEST_HOST:GUEST_PORT inside the sandbox (default 127.0.0.1;\n"
	 "port 0: kernel-chosen, printed) and relay each connection to LOCAL_HOST:LOCAL_PORT on\n"
	 "this host (default 127.0.0.1). Runs until SIGINT/SIGTERM/SIGHUP; logs each connection\n"
	 "on stderr.",
	 0},
	{"tunnels", cmd_tunnels, "[--json] [--close ID]",
	 "List the shim's tunnels (every client's): ID KIND SANDBOX HOST ACTIVE TOTAL BYTES_IN\n"
	 "BYTES_OUT. With --json, one array of objects. --close ID: close that tunnel and every\n"
	 "connection it carries instead.",
	 CMD_JSON},
	/* S3 bucket mounts */
	{"mount", cmd_mount,
	 "BUCKET PATH --endpoint URL [--prefix P] [--region R] [--provider NAME] [--read-only] "
	 "[--credentials-file FILE] [--allow-non-empty] [--option NAME[=VALUE]]... [--mount-timeout SECONDS] [--json]",
	 "Mount the S3 bucket BUCKET (or only its keys under --prefix) at PATH inside the\n"
	 "sandbox, through rclone (FUSE). PATH is created when missing (and removed again at\n"
	 "unmount); an existing mount point is EBUSY, a non-empty directory ENOTEMPTY unless\n"
	 "--allow-non-empty. Returns once the mount answers (default within 15 s, see\n"
	 "--mount-timeout), else fails with rclone's own error.\n"
	 "  --endpoint URL           the S3 endpoint, http:// or https:// (required)\n"
	 "  --provider NAME          rclone's s3 provider: AWS, Minio, Ceph, ... (default Other)\n"
	 "  --option NAME[=VALUE]    an allow-listed rclone option, e.g. vfs-cache-mode=full,\n"
	 "                           dir-cache-time=1m, allow-other; repeatable\n"
	 "Keys are never taken from the command line: from --credentials-file FILE (AWS style:\n"
	 "'aws_access_key_id = ...', 'aws_secret_access_key = ...', optional\n"
	 "'aws_session_token = ...'; '#' comments; only the [default] section if there are\n"
	 "sections), else from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN.\n"
	 "Prints the record (with --json as one object).",
	 CMD_JSON},
	{"mounts", cmd_mounts, "[--json]",
	 "List the shim's mounts: ID STATE PID PATH BUCKET[/PREFIX]. STATE is live, failed\n"
	 "(rclone died: the path refuses writes until unmounted; the error line says why),\n"
	 "starting or unmounting. With --json, one array of objects.",
	 CMD_JSON},
	{"unmount", cmd_unmount, "[--flush-timeout SECONDS] [--force] [--json] ID|PATH",
	 "Unmount a mount by id or path: wait for pending uploads (--flush-timeout, default\n"
	 "60 s; then it fails with ETIMEDOUT and stays mounted, unless --force), unmount, stop\n"
	 "rclone, remove its config and cache (and PATH if the shim created it). Unmounting\n"
	 "again succeeds; an unknown id or path is ENOENT. With --json, prints the record.",
	 CMD_JSON},
	/* microVM snapshots */
	{"snapshot-prepare", cmd_snapshot_prepare,
	 "[--freeze PATH]... [--thaw-after SECONDS] [--stop-background] [--flush-timeout SECONDS] [--json]",
	 "Prepare the sandbox for a snapshot of its VM: sync, flush the mounts' pending uploads\n"
	 "(--flush-timeout, default 60 s), then optionally freeze filesystems and stop the\n"
	 "background processes, until 'sbx resumed' (or --thaw-after, default 30 s, after which\n"
	 "the shim thaws and continues everything itself). Prints each step and its duration.\n"
	 "  --freeze PATH            FIFREEZE the filesystem mounted at PATH (a mount point, not\n"
	 "                           / or one holding the shim's state or log); repeatable, up to 16\n"
	 "  --stop-background        SIGSTOP the process group of every detached command\n"
	 "A second prepare before 'sbx resumed' fails with EBUSY; so does a filesystem the shim\n"
	 "needs. After any failure nothing is frozen or stopped.",
	 CMD_JSON},
	{"resumed", cmd_resumed, "[--time RFC3339] [--entropy-file FILE] [--fork] [--json]",
	 "Tell the shim the VM was resumed from a snapshot (or is a fork of one): it sets its\n"
	 "clock to --time (default: this host's clock now; needs CAP_SYS_TIME, else the clock\n"
	 "step says EPERM), credits the entropy (32 to 512 bytes of --entropy-file FILE, '-' for\n"
	 "stdin; default 64 random bytes; credited only as root), bumps the generation that\n"
	 "'sbx info' shows, thaws what snapshot-prepare froze and continues what it stopped.\n"
	 "  --fork                   this VM is one of several resumed from one snapshot\n"
	 "Works without a prepare before it (nothing to undo). Prints each step.",
	 CMD_JSON},
};

static const struct command *find_command(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

/* sbx --help and sbx help: the options from main_docs, the commands grouped with their summaries
 * (doc.c). */
static void print_help(FILE *f)
{
	size_t i;

	fprintf(f, "usage: sbx " GLOBAL_USAGE " COMMAND [ARGS]...\n\n"
		   "Talk to a sandbox-shim.\n\n"
		   "Options:\n");
	for (i = 0; i < sizeof(main_docs) / sizeof(main_docs[0]); i++)
		cli_print_entry(f, main_docs[i].spec, main_docs[i].help);
	fprintf(f, "%s\n\n", main_notes);
	cli_print_commands(f);
	fprintf(f, "\nExit status: 0 success, 1 the operation failed, 2 usage error,\n"
		   "3 cannot connect, handshake refused or protocol error.\n"
		   "'sbx help COMMAND' or 'sbx COMMAND --help' shows a command's usage and options.\n");
}

/* ---- what doc.c reads: the tables ---- */

const struct command *cli_command(size_t i)
{
	return i < sizeof(commands) / sizeof(commands[0]) ? &commands[i] : NULL;
}

const struct command *cli_find_command(const char *name)
{
	return find_command(name);
}

const struct option *cli_global(size_t i)
{
	return i < NGLOBALS ? &globals[i].opt : NULL;
}

int cli_global_allowed(const struct command *cmd, const struct option *g)
{
	if (g->val == GOPT_JSON)
		return (cmd->flags & CMD_JSON) != 0;
	if (g->val == GOPT_AS || g->val == GOPT_NO_FOLLOW || g->val == GOPT_NO_SYMLINKS)
		return is_fs_command(cmd);
	return 1;
}

const struct opt_doc *cli_main_doc(size_t i)
{
	return i < sizeof(main_docs) / sizeof(main_docs[0]) ? &main_docs[i] : NULL;
}

const char *cli_main_notes(void)
{
	return main_notes;
}

const char *cli_global_usage(void)
{
	return GLOBAL_USAGE;
}

int cli_show_help(FILE *f)
{
	print_help(f);
	return EXIT_OK;
}

int cli_show_cmd_help(const struct command *cmd)
{
	return show_cmd_help(cmd);
}

int cli_probe(const struct command *cmd, const char **shorts, const struct option **longs)
{
	char *argv[] = {(char *)cmd->name, NULL};
	struct ctx ctx = {0};

	ctx.cmd = cmd;
	probe.on = 1;
	probe.shorts = NULL;
	probe.longs = NULL;
	optind = 0;
	cmd->fn(&ctx, 1, argv);
	probe.on = 0;
	*shorts = probe.shorts;
	*longs = probe.longs;
	return probe.longs ? 0 : -1;
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
		{"target", required_argument, NULL, GOPT_TARGET},
		{"token-file", required_argument, NULL, GOPT_TOKEN_FILE},
		{"timeout", required_argument, NULL, GOPT_TIMEOUT},
		{"json", no_argument, NULL, GOPT_JSON},
		{"trace", no_argument, NULL, GOPT_TRACE},
		{"as", required_argument, NULL, GOPT_AS},
		{"no-follow", no_argument, NULL, GOPT_NO_FOLLOW},
		{"no-symlinks", no_argument, NULL, GOPT_NO_SYMLINKS},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, OPT_VERSION},
		{NULL, 0, NULL, 0},
	};
	struct ctx ctx = {0};
	const struct global_opt *g;
	const struct command *cmd;
	int opt;

	/* A shim behind exec: that dies would otherwise kill us silently on our next
	 * write to it; as EPIPE it becomes an ordinary error with its exit status. */
	signal(SIGPIPE, SIG_IGN);
	/* hidden (issue 18): sbx(1), its checks and the bash completion's lists (doc.c) */
	if (argc >= 2 && cli_is_doc_option(argv[1]))
		return finish(cli_doc_main(argc, argv));
	ctx.target = getenv("SBX_TARGET");
	while ((opt = getopt_long(argc, argv, "+:t:h", longopts, NULL)) != -1) {
		if ((g = opt == 't' ? &globals[0] : find_global(opt))) {
			if (set_global(&ctx, g, optarg, 0) != 0)
				return EXIT_USAGE;
			continue;
		}
		switch (opt) {
		case 'h':
			print_help(stdout);
			return finish(EXIT_OK);
		case OPT_VERSION:
			printf("sbx %s (libsbx %s, protocol %d)\n", SBX_VERSION, sbx_version(), SBX_PROTOCOL_VERSION);
			return finish(EXIT_OK);
		default:
			return other_option(&ctx, argv, opt);
		}
	}
	if (optind >= argc)
		return usage_error(&ctx, "no command given");
	if (!(cmd = find_command(argv[optind])))
		return usage_error(&ctx, "unknown command '%s'", argv[optind]);
	ctx.cmd = cmd;
	if (ctx.json && !(cmd->flags & CMD_JSON))
		return usage_error(&ctx, "--json: this command has no JSON output");
	if (fs_global_misused(&ctx))
		return EXIT_USAGE;
	argc -= optind;
	argv += optind;
	/* 0, not 1: glibc then also forgets its position inside the old argv. */
	optind = 0;
	return finish(cmd->fn(&ctx, argc, argv));
}
