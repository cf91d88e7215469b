/* cmd_fs.c: the sbx subcommands for files: cat, put, stat, ls, mkdir, ... watch. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* readlink/realpath results: PATH_MAX and its NUL. */
#define PATH_BUF 4097

/* ---- output ---- */

/* "2024-05-01T12:34:56.123456789Z", or without the fraction when nsec_digits is 0. */
static const char *fmt_time(const struct sbx_timespec *t, int nsec_digits, char *buf, size_t size)
{
	time_t sec = (time_t)t->sec;
	struct tm tm;

	if (!gmtime_r(&sec, &tm)) {
		snprintf(buf, size, "@%" PRId64, t->sec);
		return buf;
	}
	if (nsec_digits)
		snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%09" PRIu32 "Z", tm.tm_year + 1900, tm.tm_mon + 1,
			 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, t->nsec);
	else
		snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			 tm.tm_hour, tm.tm_min, tm.tm_sec);
	return buf;
}

/* A name as 'ls -b' prints it, but with spaces as they are: one name per line stays
 * one line whatever bytes it holds, and the escapes are unambiguous. */
static void put_escaped(const char *s, size_t len)
{
	static const char cesc[] = "\a\b\t\n\v\f\r";
	static const char cname[] = "abtnvfr";
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	const char *e;
	size_t n;

	while (p < end) {
		if (*p == '\\') {
			fputs("\\\\", stdout);
			p++;
		} else if (*p >= 0x20 && *p < 0x7f) {
			putchar(*p++);
		} else if (*p && (e = strchr(cesc, *p))) {
			putchar('\\');
			putchar(cname[e - cesc]);
			p++;
		} else if ((n = utf8_len(p, (size_t)(end - p))) > 0 && !(n == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
			/* valid UTF-8, but not a C1 control character (U+0080-U+009F) */
			fwrite(p, 1, n, stdout);
			p += n;
		} else {
			printf("\\%03o", *p++);
		}
	}
}

static void put_escaped_str(const char *s)
{
	put_escaped(s, strlen(s));
}

/* "drwxr-xr-x": the type letter and the permission bits, as ls -l shows them. */
static const char *mode_string(int type, unsigned mode, char buf[11])
{
	static const char types[] = "?-dlpsbc";
	static const char rwx[] = "rwxrwxrwx";
	int i;

	buf[0] = type >= 0 && type <= SBX_FT_CHARACTER_DEVICE ? types[type] : '?';
	for (i = 0; i < 9; i++)
		buf[1 + i] = mode & (0400u >> i) ? rwx[i] : '-';
	if (mode & 04000)
		buf[3] = mode & 0100 ? 's' : 'S';
	if (mode & 02000)
		buf[6] = mode & 010 ? 's' : 'S';
	if (mode & 01000)
		buf[9] = mode & 01 ? 't' : 'T';
	buf[10] = '\0';
	return buf;
}

static void json_time(const char *key, const struct sbx_timespec *t)
{
	char buf[64];

	printf(",\"%s\":\"%s\",\"%s_sec\":%" PRId64 ",\"%s_nsec\":%" PRIu32, key, fmt_time(t, 9, buf, sizeof(buf)), key,
	       t->sec, key, t->nsec);
}

/* The stat as one JSON object, its first member key (e.g. "path") holding name. No newline. */
/* The bytes of a symlink's target that its stat's buffer holds. */
static size_t link_len(const struct sbx_stat *st)
{
	if (st->link_target == NULL || st->link_target_size == 0)
		return 0;
	return st->link_target_len < st->link_target_size ? st->link_target_len : st->link_target_size - 1;
}

static void stat_json(const char *key, const char *name, size_t name_len, const struct sbx_stat *st)
{
	printf("{\"%s\":", key);
	json_strn(name, name_len);
	fputs(",\"type\":", stdout);
	json_str(sbx_file_type_name(st->type));
	printf(",\"size\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"mode\":%" PRIu32 ",\"mode_octal\":\"%04" PRIo32
	       "\",\"uid\":%" PRIu32 ",\"gid\":%" PRIu32 ",\"nlink\":%" PRIu64 ",\"inode\":%" PRIu64
	       ",\"device\":%" PRIu64 ",\"rdev\":%" PRIu64,
	       st->size, st->blocks, st->mode, st->mode, st->uid, st->gid, st->nlink, st->inode, st->device, st->rdev);
	json_time("atime", &st->atime);
	json_time("mtime", &st->mtime);
	json_time("ctime", &st->ctime);
	fputs(",\"link_target\":", stdout);
	if (st->type == SBX_FT_SYMLINK)
		json_strn(st->link_target, link_len(st));
	else
		fputs("null", stdout);
	putchar('}');
}

static void stat_text(const char *path, const struct sbx_stat *st)
{
	char buf[64], mbuf[11];

	fputs("path:          ", stdout);
	put_escaped_str(path);
	putchar('\n');
	kv("type", "%s", sbx_file_type_name(st->type));
	if (st->type == SBX_FT_SYMLINK) {
		fputs("link target:   ", stdout);
		put_escaped(st->link_target, link_len(st));
		putchar('\n');
	}
	kv("size", "%" PRIu64, st->size);
	kv("blocks", "%" PRIu64, st->blocks);
	kv("mode", "%04" PRIo32 " (%s)", st->mode, mode_string(st->type, st->mode, mbuf));
	kv("uid/gid", "%" PRIu32 "/%" PRIu32, st->uid, st->gid);
	kv("links", "%" PRIu64, st->nlink);
	kv("inode", "%" PRIu64, st->inode);
	kv("device", "%" PRIu64 " (%u:%u)", st->device, major(st->device), minor(st->device));
	if (st->type == SBX_FT_BLOCK_DEVICE || st->type == SBX_FT_CHARACTER_DEVICE)
		kv("device type", "%u:%u", major(st->rdev), minor(st->rdev));
	kv("access", "%s", fmt_time(&st->atime, 9, buf, sizeof(buf)));
	kv("modify", "%s", fmt_time(&st->mtime, 9, buf, sizeof(buf)));
	kv("change", "%s", fmt_time(&st->ctime, 9, buf, sizeof(buf)));
}

/* ---- helpers ---- */

/* Connect, run op(c, a, b, ...) through a small adapter and close: the shape of every
 * command that is one call and prints nothing. */
struct simple {
	const char *a, *b;
	int flags;
	int64_t n1, n2;
	uint64_t u;
	const struct sbx_timespec *t;
	const struct sbx_call_opts *o; /* --as, --no-follow, --no-symlinks (run_simple sets it) */
};
typedef int (*simple_fn)(struct sbx_client *c, const struct simple *s, struct sbx_error *err);

static int run_simple(const struct ctx *ctx, simple_fn fn, const struct simple *s)
{
	struct sbx_client *c;
	struct sbx_error err;
	int rc;

	struct simple with = *s;

	with.o = fs_opts(ctx);
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	rc = fn(c, &with, &err) < 0 ? fail(&err, NULL) : EXIT_OK;
	sbx_client_close(c);
	return rc;
}

/* 0, or the errno of a failed write. */
static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	ssize_t n;

	while (len > 0) {
		n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---- cat, put ---- */

static int cat_sink(void *ud, const void *buf, size_t len)
{
	(void)ud;
	/* Straight to the descriptor: no stdio buffer holds bytes back when a later read fails. */
	return write_all(STDOUT_FILENO, buf, len);
}

int cmd_cat(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"offset", required_argument, NULL, 'o'},
		{"length", required_argument, NULL, 'n'},
		{"special", no_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	uint64_t offset = 0, length = SBX_TO_END;
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc, flags = 0;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case 'o':
			if (parse_size(optarg, &offset) < 0)
				return usage_error(ctx, "bad --offset '%s': want BYTES[K|M|G]", optarg);
			break;
		case 'n':
			if (parse_size(optarg, &length) < 0 || length == SBX_TO_END)
				return usage_error(ctx, "bad --length '%s': want BYTES[K|M|G]", optarg);
			break;
		case 'S':
			flags |= SBX_READ_ALLOW_SPECIAL;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_read_file_ex(c, fs_opts(ctx), argv[optind], offset, length, flags, cat_sink, NULL, NULL, &err) < 0)
		rc = fail(&err, NULL);
	sbx_client_close(c);
	return rc;
}

static long stdin_source(void *ud, void *buf, size_t len)
{
	ssize_t n;

	(void)ud;
	do
		n = read(STDIN_FILENO, buf, len);
	while (n < 0 && errno == EINTR);
	return (long)n;
}

int cmd_put(struct ctx *ctx, int argc, char **argv)
{
	enum { OPT_APPEND = 256, OPT_EXCLUSIVE, OPT_PARENTS, OPT_NO_ATOMIC, OPT_SPECIAL };
	static const struct option longopts[] = {
		{"mode", required_argument, NULL, 'm'},
		{"append", no_argument, NULL, OPT_APPEND},
		{"exclusive", no_argument, NULL, OPT_EXCLUSIVE},
		{"parents", no_argument, NULL, OPT_PARENTS},
		{"no-atomic", no_argument, NULL, OPT_NO_ATOMIC},
		{"special", no_argument, NULL, OPT_SPECIAL},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int opt, rc, flags = 0, mode = SBX_MODE_KEEP;
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	unsigned m;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case 'm':
			if (parse_mode(optarg, &m) < 0)
				return usage_error(ctx, "bad --mode '%s': want an octal mode", optarg);
			mode = (int)m;
			break;
		case OPT_APPEND:
			flags |= SBX_WRITE_APPEND;
			break;
		case OPT_EXCLUSIVE:
			flags |= SBX_WRITE_EXCLUSIVE;
			break;
		case OPT_PARENTS:
			flags |= SBX_WRITE_PARENTS;
			break;
		case OPT_NO_ATOMIC:
			flags |= SBX_WRITE_NO_ATOMIC;
			break;
		case OPT_SPECIAL:
			flags |= SBX_WRITE_ALLOW_SPECIAL;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_write_file(c, fs_opts(ctx), argv[optind], flags, mode, stdin_source, NULL, &st, &err) < 0) {
		rc = fail(&err, NULL);
	} else if (ctx->json) {
		stat_json("path", argv[optind], strlen(argv[optind]), &st);
		putchar('\n');
	}
	sbx_client_close(c);
	return rc;
}

/* ---- stat, exists ---- */

int cmd_stat(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"dereference", no_argument, NULL, 'L'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_client *c;
	struct sbx_error err;
	char target[4097]; /* a symlink's target is below PATH_MAX */
	struct sbx_stat st = {.struct_size = sizeof(st), .link_target = target, .link_target_size = sizeof(target)};
	int opt, rc, flags = 0;

	while ((opt = cli_getopt(ctx, argc, argv, ":Lh", longopts)) != -1) {
		if (opt != 'L')
			return other_option(ctx, argv, opt);
		flags |= SBX_STAT_FOLLOW;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	rc = sbx_stat(c, fs_opts(ctx), argv[optind], flags, &st, &err) < 0 ? fail(&err, NULL) : EXIT_OK;
	sbx_client_close(c);
	if (rc != EXIT_OK)
		return rc;
	if (ctx->json) {
		stat_json("path", argv[optind], strlen(argv[optind]), &st);
		putchar('\n');
	} else {
		stat_text(argv[optind], &st);
	}
	return EXIT_OK;
}

int cmd_exists(struct ctx *ctx, int argc, char **argv)
{
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	switch (sbx_exists(c, fs_opts(ctx), argv[optind], &err)) {
	case 1:
		rc = EXIT_OK;
		break;
	case 0:
		rc = EXIT_FAIL;
		break;
	default:
		rc = fail(&err, NULL);
		break;
	}
	sbx_client_close(c);
	return rc;
}

/* ---- ls ---- */

struct ls_state {
	int json, long_fmt;
	int out_err; /* stdout failed: the listing was stopped for it */
};

static int ls_entry(void *ud, const struct sbx_dirent *e)
{
	struct ls_state *ls = ud;
	char tbuf[64], mbuf[11];

	if (ls->json && e->stat) {
		stat_json("name", e->name, e->name_len, e->stat);
		putchar('\n');
	} else if (ls->json) {
		fputs("{\"name\":", stdout);
		json_strn(e->name, e->name_len);
		fputs("}\n", stdout);
	} else {
		if (ls->long_fmt && e->stat)
			printf("%s %12" PRIu64 " %s ", mode_string(e->stat->type, e->stat->mode, mbuf), e->stat->size,
			       fmt_time(&e->stat->mtime, 0, tbuf, sizeof(tbuf)));
		put_escaped(e->name, e->name_len);
		if (ls->long_fmt && e->stat && e->stat->type == SBX_FT_SYMLINK) {
			fputs(" -> ", stdout);
			put_escaped(e->stat->link_target, link_len(e->stat));
		}
		putchar('\n');
	}
	/* A reader that went away ("| head") ends the listing; main() reports the error. */
	if (ferror(stdout)) {
		ls->out_err = 1;
		return EPIPE;
	}
	return 0;
}

int cmd_ls(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"depth", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct ls_state ls = {ctx->json, 0, 0};
	unsigned depth = 1;
	int opt, rc, flags = 0, recursive = 0, depth_given = 0;
	struct sbx_client *c;
	struct sbx_error err;
	int64_t v;

	while ((opt = cli_getopt(ctx, argc, argv, ":laRh", longopts)) != -1) {
		switch (opt) {
		case 'l':
			ls.long_fmt = 1;
			break;
		case 'a':
			flags |= SBX_LIST_HIDDEN;
			break;
		case 'R':
			recursive = 1;
			break;
		case 'd':
			if (parse_id(optarg, &v) < 0 || v < 1)
				return usage_error(ctx, "bad --depth '%s': want a number of levels, 1 or more", optarg);
			depth = (unsigned)v;
			depth_given = 1;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	ls.json = ctx->json; /* --json may follow the command */
	if (recursive && !depth_given)
		depth = 0; /* unlimited */
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_list(c, fs_opts(ctx), argv[optind], depth, flags, ls_entry, &ls, NULL, &err) < 0 && !ls.out_err)
		rc = fail(&err, NULL);
	sbx_client_close(c);
	return rc;
}

/* ---- one-call commands ---- */

static int do_mkdir(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_mkdir(c, s->o, s->a, s->flags, (int)s->n1, err);
}

int cmd_mkdir(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {.n1 = 0755};
	unsigned m;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":pm:h", help_only_opts)) != -1) {
		switch (opt) {
		case 'p':
			s.flags |= SBX_MKDIR_PARENTS;
			break;
		case 'm':
			if (parse_mode(optarg, &m) < 0)
				return usage_error(ctx, "bad mode '%s': want an octal mode", optarg);
			s.n1 = m;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	return run_simple(ctx, do_mkdir, &s);
}

static int do_rm(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_remove(c, s->o, s->a, s->flags, err);
}

int cmd_rm(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {0};
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":rh", help_only_opts)) != -1) {
		if (opt != 'r')
			return other_option(ctx, argv, opt);
		s.flags |= SBX_REMOVE_RECURSIVE;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	return run_simple(ctx, do_rm, &s);
}

static int do_mv(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_rename(c, s->o, s->a, s->b, 0, err);
}

int cmd_mv(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {0};
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	s.b = argv[optind + 1];
	return run_simple(ctx, do_mv, &s);
}

static int do_cp(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_copy(c, s->o, s->a, s->b, s->flags, err);
}

int cmd_cp(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {0};
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":rh", help_only_opts)) != -1) {
		if (opt != 'r')
			return other_option(ctx, argv, opt);
		s.flags |= SBX_COPY_RECURSIVE;
	}
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	s.b = argv[optind + 1];
	return run_simple(ctx, do_cp, &s);
}

static int do_chmod(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_chmod(c, s->o, s->a, (unsigned)s->n1, err);
}

int cmd_chmod(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {0};
	unsigned m;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	if (parse_mode(argv[optind], &m) < 0)
		return usage_error(ctx, "bad mode '%s': want an octal mode", argv[optind]);
	s.n1 = m;
	s.a = argv[optind + 1];
	return run_simple(ctx, do_chmod, &s);
}

static int do_chown(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_chown(c, s->o, s->a, s->n1, s->n2, 0, err);
}

int cmd_chown(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {.n1 = -1, .n2 = -1};
	char *spec, *colon;
	int opt, rc, ok;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	spec = argv[optind];
	colon = strchr(spec, ':');
	if (colon) {
		*colon = '\0';
		ok = (!*spec || parse_id(spec, &s.n1) == 0) && parse_id(colon + 1, &s.n2) == 0;
		*colon = ':';
	} else {
		ok = parse_id(spec, &s.n1) == 0;
	}
	if (!ok)
		return usage_error(ctx, "bad owner '%s': want UID, UID:GID or :GID (numbers)", spec);
	s.a = argv[optind + 1];
	return run_simple(ctx, do_chown, &s);
}

static int do_ln(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	if (s->flags)
		return sbx_symlink(c, s->o, s->a, s->b, err);
	return sbx_link(c, s->o, s->a, s->b, err);
}

int cmd_ln(struct ctx *ctx, int argc, char **argv)
{
	struct simple s = {0};
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":sh", help_only_opts)) != -1) {
		if (opt != 's')
			return other_option(ctx, argv, opt);
		s.flags = 1;
	}
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	s.b = argv[optind + 1];
	return run_simple(ctx, do_ln, &s);
}

static int do_truncate(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_truncate_ex(c, s->o, s->a, s->u, s->flags ? SBX_TRUNCATE_ALLOW_SPECIAL : 0, err);
}

int cmd_truncate(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"size", required_argument, NULL, 's'},
		{"special", no_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct simple s = {0};
	int opt, rc, have_size = 0;

	while ((opt = cli_getopt(ctx, argc, argv, ":s:h", longopts)) != -1) {
		if (opt == 'S') {
			s.flags = 1;
			continue;
		}
		if (opt != 's')
			return other_option(ctx, argv, opt);
		/* The file API takes sizes up to 2^63-1 (off_t). */
		if (parse_size(optarg, &s.u) < 0 || s.u > INT64_MAX)
			return usage_error(ctx, "bad size '%s': want BYTES[K|M|G|T]", optarg);
		have_size = 1;
	}
	if (!have_size)
		return usage_error(ctx, "-s SIZE is required");
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	return run_simple(ctx, do_truncate, &s);
}

static int do_touch(struct sbx_client *c, const struct simple *s, struct sbx_error *err)
{
	return sbx_set_times(c, s->o, s->a, s->t, s->t, 0, err);
}

int cmd_touch(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"date", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_timespec t;
	struct simple s = {0};
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":d:h", longopts)) != -1) {
		if (opt != 'd')
			return other_option(ctx, argv, opt);
		if (parse_time(optarg, &t) < 0)
			return usage_error(ctx, "bad time '%s': want RFC 3339, e.g. 2024-05-01T12:34:56.5Z", optarg);
		s.t = &t;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	s.a = argv[optind];
	return run_simple(ctx, do_touch, &s);
}

/* ---- readlink, realpath: one path out ---- */

static int path_out(struct ctx *ctx, int argc, char **argv, int realpath)
{
	struct sbx_client *c;
	struct sbx_error err;
	char *buf;
	long n;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if (!(buf = malloc(PATH_BUF))) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK) {
		free(buf);
		return rc;
	}
	n = realpath ? sbx_realpath(c, fs_opts(ctx), argv[optind], buf, PATH_BUF, &err) :
		       sbx_readlink(c, fs_opts(ctx), argv[optind], buf, PATH_BUF, &err);
	sbx_client_close(c);
	if (n < 0) {
		rc = fail(&err, NULL);
	} else if (ctx->json) {
		printf("{\"%s\":", realpath ? "path" : "target");
		json_strn(buf, (size_t)n);
		puts("}");
	} else {
		/* The bytes as they are, as readlink(1) prints them: $(sbx readlink L) must work. */
		fwrite(buf, 1, (size_t)n, stdout);
		putchar('\n');
	}
	free(buf);
	return rc;
}

int cmd_readlink(struct ctx *ctx, int argc, char **argv)
{
	return path_out(ctx, argc, argv, 0);
}

int cmd_realpath(struct ctx *ctx, int argc, char **argv)
{
	return path_out(ctx, argc, argv, 1);
}

/* ---- df ---- */

/* n blocks of bs bytes in 1024-byte units. */
static uint64_t kblocks(uint64_t n, uint64_t bs)
{
	if (bs % 1024 == 0)
		return n * (bs / 1024);
	return (uint64_t)((long double)n * (long double)bs / 1024.0L);
}

/* used as a percentage of used + avail, rounded up as df does; "-" if both are 0. */
static const char *pct(uint64_t used, uint64_t avail, char *buf, size_t size)
{
	long double total = (long double)used + (long double)avail;
	uint64_t p;

	if (total == 0) {
		snprintf(buf, size, "-");
		return buf;
	}
	p = (uint64_t)((long double)used * 100.0L / total);
	if ((long double)p * total < (long double)used * 100.0L)
		p++;
	snprintf(buf, size, "%" PRIu64 "%%", p);
	return buf;
}

int cmd_df(struct ctx *ctx, int argc, char **argv)
{
	uint64_t bs, size, used, avail, iused;
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_statfs fs = SBX_STATFS_INIT;
	char p1[16], p2[16];
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	rc = sbx_statfs(c, fs_opts(ctx), argv[optind], &fs, &err) < 0 ? fail(&err, NULL) : EXIT_OK;
	sbx_client_close(c);
	if (rc != EXIT_OK)
		return rc;
	bs = fs.block_size;
	used = fs.blocks >= fs.blocks_free ? fs.blocks - fs.blocks_free : 0;
	iused = fs.files >= fs.files_free ? fs.files - fs.files_free : 0;
	if (ctx->json) {
		fputs("{\"path\":", stdout);
		json_str(argv[optind]);
		printf(",\"block_size\":%" PRIu64 ",\"blocks\":%" PRIu64 ",\"blocks_free\":%" PRIu64
		       ",\"blocks_available\":%" PRIu64 ",\"files\":%" PRIu64 ",\"files_free\":%" PRIu64
		       ",\"fs_type\":%" PRIu64 ",\"flags\":%" PRIu64 ",\"name_max\":%" PRIu64 ",\"size_bytes\":%" PRIu64
		       ",\"used_bytes\":%" PRIu64 ",\"available_bytes\":%" PRIu64 "}\n",
		       bs, fs.blocks, fs.blocks_free, fs.blocks_available, fs.files, fs.files_free, fs.fs_type,
		       fs.flags, fs.name_max, fs.blocks * bs, used * bs, fs.blocks_available * bs);
		return EXIT_OK;
	}
	size = kblocks(fs.blocks, bs);
	avail = kblocks(fs.blocks_available, bs);
	printf("%12s %12s %12s %4s %10s %10s %10s %5s %s\n", "1K-blocks", "Used", "Available", "Use%", "Inodes",
	       "IUsed", "IFree", "IUse%", "Path");
	printf("%12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %4s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %5s ", size,
	       kblocks(used, bs), avail, pct(kblocks(used, bs), avail, p1, sizeof(p1)), fs.files, iused, fs.files_free,
	       pct(iused, fs.files_free, p2, sizeof(p2)));
	put_escaped_str(argv[optind]);
	putchar('\n');
	return EXIT_OK;
}

/* ---- watch ---- */

/* SIGINT and SIGTERM end a watch cleanly by firing its cancel token. sbx_cancel_fire
 * takes a mutex, so it cannot run in a signal handler: the signals stay blocked and a
 * thread takes them with sigwait(). A second signal while the first is being acted
 * upon exits at once. */
struct sigwatch {
	pthread_t thread;
	sigset_t set;
	struct sbx_cancel *tok;
	atomic_int stop;
	int fired;
};

static void *sigwatch_main(void *arg)
{
	struct sigwatch *w = arg;
	int sig;

	for (;;) {
		if (sigwait(&w->set, &sig) != 0)
			continue;
		if (atomic_load(&w->stop))
			return NULL;
		if (w->fired)
			_exit(128 + sig);
		w->fired = 1;
		sbx_cancel_fire(w->tok);
	}
}

struct watch_state {
	int json;
	int out_err;
};

static int watch_event(void *ud, const struct sbx_watch_event *ev)
{
	const char *type = sbx_watch_type_name(ev->type);
	struct watch_state *ws = ud;

	if (!type)
		type = "unknown";
	if (ws->json) {
		fputs("{\"type\":", stdout);
		json_str(type);
		fputs(",\"path\":", stdout);
		if (ev->path)
			json_strn(ev->path, ev->path_len);
		else
			fputs("null", stdout);
		printf(",\"is_dir\":%s,\"cookie\":%" PRIu32 "}\n", ev->is_dir ? "true" : "false", ev->cookie);
	} else {
		fputs(type, stdout);
		if (ev->path) {
			putchar(' ');
			put_escaped(ev->path, ev->path_len);
		}
		putchar('\n');
	}
	/* Each event as it happens, for whoever follows the output. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		ws->out_err = 1;
		return 1;
	}
	return 0;
}

int cmd_watch(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"recursive", no_argument, NULL, 'r'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sigwatch w = {.stop = 0};
	struct watch_state ws = {ctx->json, 0};
	/* A watch runs until it is stopped: --timeout is for connecting only. */
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc, flags = 0, e;

	while ((opt = cli_getopt(ctx, argc, argv, ":rh", longopts)) != -1) {
		if (opt != 'r')
			return other_option(ctx, argv, opt);
		flags |= SBX_WATCH_RECURSIVE;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	ws.json = ctx->json; /* --json may follow the command */
	if (!(w.tok = sbx_cancel_new())) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	/* Connect first: an exec: target's shim must not inherit the blocked signals. */
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK) {
		sbx_cancel_free(w.tok);
		return rc;
	}
	sigemptyset(&w.set);
	sigaddset(&w.set, SIGINT);
	sigaddset(&w.set, SIGTERM);
	if ((e = pthread_sigmask(SIG_BLOCK, &w.set, NULL)) != 0 ||
	    (e = pthread_create(&w.thread, NULL, sigwatch_main, &w)) != 0) {
		fprintf(stderr, "sbx: cannot start the signal thread: %s\n", strerror(e));
		sbx_client_close(c);
		sbx_cancel_free(w.tok);
		return EXIT_FAIL;
	}
	opts.cancel = w.tok;
	fs_opts_into(ctx, &opts);
	if (sbx_watch(c, &opts, argv[optind], flags, watch_event, &ws, &err) < 0 && !ws.out_err &&
	    !(err.code == ECANCELED && sbx_cancel_fired(w.tok)))
		rc = fail(&err, NULL);
	/* Wake the thread with a signal of its own set; stop tells it to return. */
	atomic_store(&w.stop, 1);
	pthread_kill(w.thread, SIGTERM);
	pthread_join(w.thread, NULL);
	sbx_client_close(c);
	sbx_cancel_free(w.tok);
	return rc;
}
