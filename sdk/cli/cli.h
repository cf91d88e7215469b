/* cli.h: what the files of the sbx command-line client share: context, command table, errors, parsing, output. */
#ifndef SBX_CLI_H
#define SBX_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sbx.h"

enum {
	EXIT_OK = 0,
	EXIT_FAIL = 1,    /* the operation failed */
	EXIT_USAGE = 2,   /* bad command line */
	EXIT_CONNECT = 3, /* cannot connect, handshake refused, protocol error */
};

struct command;

/* What the global options said, and the subcommand being run. */
struct ctx {
	const char *target;
	const char *token_file;
	int timeout_ms; /* 0: the library's defaults */
	int json;
	int trace;
	/* --as, --no-follow, --no-symlinks: the file commands' sbx_call_opts (fs_opts) */
	const char *as_user, *as_group;
	unsigned resolve;          /* SBX_RESOLVE_* */
	unsigned before;           /* GLOBAL_* bits: the global options given before the command */
	const struct command *cmd; /* the subcommand being run; NULL while in main */
};

/* The global options, as bits of ctx.before. */
enum {
	GLOBAL_TARGET = 1u << 0,
	GLOBAL_TOKEN_FILE = 1u << 1,
	GLOBAL_TIMEOUT = 1u << 2,
	GLOBAL_JSON = 1u << 3,
	GLOBAL_TRACE = 1u << 4,
	GLOBAL_AS = 1u << 5,
	GLOBAL_NO_FOLLOW = 1u << 6,
	GLOBAL_NO_SYMLINKS = 1u << 7,
};

/* The call options of a file command's calls: --as's user and group and the resolve
 * flags; NULL when none was given (the request then has no fs field). fs_opts_into
 * adds them to opts a command fills itself (timeout, cancel). */
const struct sbx_call_opts *fs_opts(const struct ctx *ctx);
void fs_opts_into(const struct ctx *ctx, struct sbx_call_opts *opts);

/* struct command flags */
enum {
	CMD_JSON = 1u << 0, /* has JSON output: --json is accepted */
};

/* One subcommand: fn gets argv starting at the command's name, with optind reset,
 * and returns the exit status. */
struct command {
	const char *name;
	int (*fn)(struct ctx *ctx, int argc, char **argv);
	const char *usage;
	const char *help;
	unsigned flags; /* CMD_* */
};

/* Long options of a command that has none but --help. */
extern const struct option help_only_opts[];

/* ---- options (sbx.c) ---- */

/* getopt_long() for a command's options that also takes the global options (-t/--target,
 * --token-file, --timeout, --json, --trace) among them, as git and kubectl do, and stores
 * them in ctx. An option the command defines itself keeps the command's meaning (exec's
 * -t is --tty, its --timeout the command's). A global option also given before the
 * command, --json on a command without JSON output, or a bad global value: the usage error
 * is printed and CLI_OPT_FAILED returned, which other_option() turns into EXIT_USAGE. */
int cli_getopt(struct ctx *ctx, int argc, char **argv, const char *shortopts, const struct option *longopts);
#define CLI_OPT_FAILED 0x7ffe

/* ---- errors and usage (sbx.c) ---- */

/* Print err on stderr ("sbx: ENOENT: /nope: No such file or directory") and return
 * the exit status it calls for: EXIT_CONNECT for connect and protocol errors, else
 * EXIT_FAIL. target is set when the failure happened while connecting. */
int fail(const struct sbx_error *err, const char *target);
/* Print "sbx: CMD: message", the command's usage and a hint; returns EXIT_USAGE. */
__attribute__((format(printf, 2, 3))) int usage_error(const struct ctx *ctx, const char *fmt, ...);
/* What cli_getopt returned that the command does not handle itself (-h, ':', '?',
 * CLI_OPT_FAILED): prints help or a usage error and returns the exit status. */
int other_option(const struct ctx *ctx, char **argv, int opt);
/* EXIT_OK if no argument is left after the options, else a usage error. */
int no_more_args(const struct ctx *ctx, int argc, char **argv);
/* EXIT_OK if exactly n operands are left after the options, else a usage error. */
int want_operands(const struct ctx *ctx, int argc, char **argv, int n);

/* ---- connecting (sbx.c) ---- */

/* Connect as the global options say, retrying for wait_ms while the shim is not up.
 * Returns EXIT_OK with *out set (close it with sbx_client_close()), or an exit status
 * after printing why. */
int open_client(const struct ctx *ctx, int wait_ms, struct sbx_client **out);

/* ---- parsing (sbx.c); each returns 0, or -1 if s is malformed or out of range ---- */

/* Seconds, possibly fractional, to milliseconds (rounded up). */
int parse_seconds(const char *s, int *ms);
/* Decimal bytes with an optional binary suffix: 4096, 64K, 1M, 2G, 1T (also 64KiB, 1MB). */
int parse_size(const char *s, uint64_t *out);
/* An octal mode, 0 to 07777 ("644", "0644", "4755"). */
int parse_mode(const char *s, unsigned *out);
/* A decimal number 0 to 4294967294: a uid or gid for chown ((uid_t)-1 means "unchanged"
 * to chown(2)), a depth. */
int parse_id(const char *s, int64_t *out);
/* An RFC 3339 time: 2024-05-01T12:34:56Z, 2024-05-01T12:34:56.123456789+02:00 (T may be
 * t or a space, Z may be z; years 0000-9999; seconds 00-59; fractions past 9 digits are
 * cut off). */
int parse_time(const char *s, struct sbx_timespec *out);

/* ---- output (sbx.c) ---- */

/* Length of the valid UTF-8 sequence of at most len bytes at p (2-4 bytes), else 0
 * (also for ASCII). */
size_t utf8_len(const unsigned char *p, size_t len);
/* len bytes of s as a JSON string on stdout: the short escapes (\n, \t, \r, \b, \f, \",
 * \\), other control characters and bytes that are not valid UTF-8 as \u00XX (so a name
 * that is not UTF-8 cannot be told from its Latin-1 reading). */
void json_strn(const char *s, size_t len);
void json_str(const char *s);
/* One aligned "key:   value" line on stdout. */
__attribute__((format(printf, 2, 3))) void kv(const char *key, const char *fmt, ...);

/* ---- file commands (cmd_fs.c) ---- */

int cmd_cat(struct ctx *ctx, int argc, char **argv);
int cmd_put(struct ctx *ctx, int argc, char **argv);
int cmd_stat(struct ctx *ctx, int argc, char **argv);
int cmd_exists(struct ctx *ctx, int argc, char **argv);
int cmd_ls(struct ctx *ctx, int argc, char **argv);
int cmd_mkdir(struct ctx *ctx, int argc, char **argv);
int cmd_rm(struct ctx *ctx, int argc, char **argv);
int cmd_mv(struct ctx *ctx, int argc, char **argv);
int cmd_cp(struct ctx *ctx, int argc, char **argv);
int cmd_chmod(struct ctx *ctx, int argc, char **argv);
int cmd_chown(struct ctx *ctx, int argc, char **argv);
int cmd_ln(struct ctx *ctx, int argc, char **argv);
int cmd_readlink(struct ctx *ctx, int argc, char **argv);
int cmd_truncate(struct ctx *ctx, int argc, char **argv);
int cmd_touch(struct ctx *ctx, int argc, char **argv);
int cmd_realpath(struct ctx *ctx, int argc, char **argv);
int cmd_df(struct ctx *ctx, int argc, char **argv);
int cmd_watch(struct ctx *ctx, int argc, char **argv);

/* ---- commands and processes (cmd_exec.c) ---- */

int cmd_exec(struct ctx *ctx, int argc, char **argv);
int cmd_sh(struct ctx *ctx, int argc, char **argv);
int cmd_eval(struct ctx *ctx, int argc, char **argv);
int cmd_ps(struct ctx *ctx, int argc, char **argv);
int cmd_logs(struct ctx *ctx, int argc, char **argv);
int cmd_kill(struct ctx *ctx, int argc, char **argv);
int cmd_wait(struct ctx *ctx, int argc, char **argv);
int cmd_rmproc(struct ctx *ctx, int argc, char **argv);

/* ---- directory archives (cmd_backup.c) ---- */

int cmd_backup(struct ctx *ctx, int argc, char **argv);
int cmd_restore(struct ctx *ctx, int argc, char **argv);

/* ---- tunnels (cmd_tunnel.c) ---- */

int cmd_forward(struct ctx *ctx, int argc, char **argv);
int cmd_reverse(struct ctx *ctx, int argc, char **argv);
int cmd_tunnels(struct ctx *ctx, int argc, char **argv);

/* ---- S3 bucket mounts (cmd_mount.c) ---- */
int cmd_mount(struct ctx *ctx, int argc, char **argv);
int cmd_mounts(struct ctx *ctx, int argc, char **argv);
int cmd_unmount(struct ctx *ctx, int argc, char **argv);

/* ---- microVM snapshots (cmd_snapshot.c) ---- */
int cmd_snapshot_prepare(struct ctx *ctx, int argc, char **argv);
int cmd_resumed(struct ctx *ctx, int argc, char **argv);

/* ---- the tables, for the documentation (sbx.c) ---- */

/* One of main's options as --help and sbx(1) show it. */
struct opt_doc {
	const char *spec; /* "-t, --target TARGET" */
	const char *help; /* lines after the first continue the entry */
};

/* The i-th entry of the command table, of the global options' getopt table, of main_docs;
 * NULL past the end. */
const struct command *cli_command(size_t i);
const struct option *cli_global(size_t i);
const struct opt_doc *cli_main_doc(size_t i);
const struct command *cli_find_command(const char *name);
/* Whether cmd takes the global option g at all (--json only with JSON output, the file options
 * only on file commands), for the completion. */
int cli_global_allowed(const struct command *cmd, const struct option *g);
/* What --help says after the options; GLOBAL_USAGE. */
const char *cli_main_notes(void);
const char *cli_global_usage(void);
/* sbx --help, and sbx COMMAND --help (on stdout); return EXIT_OK. */
int cli_show_help(FILE *f);
int cli_show_cmd_help(const struct command *cmd);
/* The command's own options as it hands them to cli_getopt (run with nothing to parse: it stops
 * at its first cli_getopt, as after a usage error, without printing). 0, or -1 if it never
 * called cli_getopt. */
int cli_probe(const struct command *cmd, const char **shorts, const struct option **longs);

/* ---- help, sbx(1), completion (doc.c) ---- */

int cmd_help(struct ctx *ctx, int argc, char **argv);
/* "  SPEC  HELP" aligned as in --help (continuation lines of HELP indented). */
void cli_print_entry(FILE *f, const char *spec, const char *help);
/* The commands grouped, "  NAME  SUMMARY" a line. */
void cli_print_commands(FILE *f);
/* Whether arg is one of the hidden first arguments: --dump-man TEMPLATE (sbx(1) on stdout),
 * --check-docs (every command, option and global option documented: exit 0, else each gap on
 * stderr and exit 1), --complete KIND [COMMAND] (the bash completion's word lists). */
int cli_is_doc_option(const char *arg);
int cli_doc_main(int argc, char **argv);

#endif
