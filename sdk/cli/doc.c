/* doc.c: sbx help, sbx(1) (sbx --dump-man) and the word lists of the bash completion, all made
 * from the command table, each command's own option table and main_docs (issue 18), so that none
 * of them can drift from the code. `sbx --check-docs` (test cli_doc) fails for a command without
 * help text or summary, and for an option its help text does not name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mangen.h"

/* The one-line summaries of `sbx help`, in its order; a NULL name starts a group. Every command
 * needs one (sbx --check-docs). */
static const struct summary {
	const char *name;
	const char *text;
} summaries[] = {
	{NULL, "Connection and diagnostics"},
	{"ping", "check that the shim answers; round-trip times"},
	{"info", "the shim's versions, features, identity, counters and limits"},
	{"echo", "measure the throughput through the shim's echo stream"},
	{"decode", "print the frames of a captured byte stream (no connection)"},
	{"help", "list the commands, or show one's usage and options"},
	{NULL, "Files"},
	{"cat", "write a file's bytes to stdout"},
	{"put", "write stdin to a file (atomically by default)"},
	{"stat", "show a file's type, size, mode, owner and times"},
	{"exists", "exit 0 if a path exists, 1 if not"},
	{"ls", "list a directory (or, recursively, a tree)"},
	{"mkdir", "create a directory"},
	{"rm", "remove a file, or with -r a tree"},
	{"mv", "rename a file or directory"},
	{"cp", "copy a file, or with -r a tree"},
	{"chmod", "set a file's permissions"},
	{"chown", "set a file's owner and group"},
	{"ln", "make a hard or a symbolic link"},
	{"readlink", "print a symlink's target"},
	{"truncate", "set a file's size"},
	{"touch", "set a file's times, creating it if missing"},
	{"realpath", "print a path with its symlinks resolved"},
	{"df", "show a filesystem's space and inodes"},
	{"watch", "print filesystem events until interrupted"},
	{NULL, "Commands and processes"},
	{"exec", "run a command, streaming its output; exit with its status"},
	{"sh", "run a shell command line (/bin/sh -c)"},
	{"eval", "run code through an interpreter (python3 -c by default)"},
	{"ps", "list the processes the shim started"},
	{"logs", "print, and follow, a background process's output"},
	{"kill", "send a signal to a process's group"},
	{"wait", "wait for a process to end; exit with its status"},
	{"rmproc", "forget an exited process"},
	{NULL, "Directory archives"},
	{"backup", "archive a directory as a tar stream"},
	{"restore", "restore a directory from a tar archive"},
	{NULL, "Tunnels"},
	{"forward", "relay a port of this host into the sandbox"},
	{"reverse", "relay a port in the sandbox to this host"},
	{"tunnels", "list, or close, the shim's tunnels"},
	{NULL, "S3 bucket mounts"},
	{"mount", "mount an S3 bucket (rclone) inside the sandbox"},
	{"mounts", "list the shim's mounts"},
	{"unmount", "unmount a bucket mount"},
	{NULL, "MicroVM snapshots"},
	{"snapshot-prepare", "sync, flush, freeze and stop before the host snapshots the VM"},
	{"resumed", "after a resume or fork: set the clock, add entropy, undo the prepare"},
};
#define NSUMMARIES (sizeof(summaries) / sizeof(summaries[0]))

static const struct summary *summary_of(const char *name)
{
	size_t i;

	for (i = 0; i < NSUMMARIES; i++)
		if (summaries[i].name && !strcmp(summaries[i].name, name))
			return &summaries[i];
	return NULL;
}

void cli_print_entry(FILE *f, const char *spec, const char *help)
{
	/* long-only options line up after the "-x, " of the others */
	int pad = spec[0] == '-' && spec[1] == '-' ? 4 : 0;
	const char *p, *eol;

	fprintf(f, "  %*s%-*s ", pad, "", 22 - pad, spec);
	for (p = help;; p = eol + 1) {
		eol = strchr(p, '\n');
		fprintf(f, "%.*s\n", eol ? (int)(eol - p) : (int)strlen(p), p);
		if (!eol)
			break;
		fprintf(f, "%25s", "");
	}
}

/* The first line of a command's help: the summary of a command summaries[] lacks. */
static void first_line(FILE *f, const char *help)
{
	fprintf(f, "%.*s", (int)strcspn(help, "\n"), help);
}

void cli_print_commands(FILE *f)
{
	const struct command *cmd;
	size_t i;
	int other = 0;

	for (i = 0; i < NSUMMARIES; i++) {
		if (!summaries[i].name)
			fprintf(f, "%s%s:\n", i ? "\n" : "", summaries[i].text);
		else if (cli_find_command(summaries[i].name))
			fprintf(f, "  %-9s %s\n", summaries[i].name, summaries[i].text);
	}
	for (i = 0; (cmd = cli_command(i)) != NULL; i++) {
		if (summary_of(cmd->name))
			continue;
		if (!other++)
			fprintf(f, "\nOther:\n");
		fprintf(f, "  %-9s ", cmd->name);
		first_line(f, cmd->help);
		fputc('\n', f);
	}
}

int cmd_help(struct ctx *ctx, int argc, char **argv)
{
	const struct command *cmd;
	int opt;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if (optind == argc)
		return cli_show_help(stdout);
	if (argc - optind > 1)
		return usage_error(ctx, "unexpected argument '%s'", argv[optind + 1]);
	if (!(cmd = cli_find_command(argv[optind])))
		return usage_error(ctx, "unknown command '%s' ('sbx help' lists them)", argv[optind]);
	return cli_show_cmd_help(cmd);
}

/* ---- the options of main and of each command ---- */

/* Whether the command's own table has the long option name. */
static int has_long(const struct option *longs, const char *name)
{
	size_t i;

	for (i = 0; longs[i].name; i++)
		if (!strcmp(longs[i].name, name))
			return 1;
	return 0;
}

/* The option words the bash completion offers (args_only: only those whose argument is the next
 * word), one a line: main's without cmd, else cmd's own and the global ones it takes after it. */
static int list_options(FILE *f, const struct command *cmd, int args_only)
{
	const struct option *longs = NULL, *g;
	const char *shorts = "", *p;
	size_t i;

	if (cmd && cli_probe(cmd, &shorts, &longs) < 0)
		return -1;
	if (cmd) {
		for (i = 0; longs[i].name; i++)
			if (!args_only || longs[i].has_arg == required_argument)
				fprintf(f, "--%s\n", longs[i].name);
		for (p = shorts; *p; p++)
			if (*p != '+' && *p != ':' && (!args_only || p[1] == ':'))
				fprintf(f, "-%c\n", *p);
	} else {
		fputs(args_only ? "" : "-h\n--help\n--version\n", f);
	}
	if (!cmd || !strchr(shorts, 't'))
		fputs("-t\n", f);
	for (i = 0; (g = cli_global(i)) != NULL; i++) {
		if (cmd && (has_long(longs, g->name) || !cli_global_allowed(cmd, g)))
			continue;
		if (!args_only || g->has_arg == required_argument)
			fprintf(f, "--%s\n", g->name);
	}
	return 0;
}

/* ---- sbx --check-docs ---- */

/* The usage and help texts of every command that parses with the option table longs (sh says
 * "as 'exec' does": the two share one table, so exec's text documents sh's options too). */
static char *doc_text(const struct option *longs)
{
	const struct option *l;
	const struct command *cmd;
	char *text = NULL;
	const char *s;
	size_t size = 0, i;
	FILE *f = open_memstream(&text, &size);

	if (!f)
		return NULL;
	for (i = 0; (cmd = cli_command(i)) != NULL; i++)
		if (cmd->help && cmd->usage && cli_probe(cmd, &s, &l) == 0 && l == longs)
			fprintf(f, "%s\n%s\n", cmd->usage, cmd->help);
	fclose(f);
	return text;
}

static int check_docs(void)
{
	const struct option *longs, *g;
	const struct command *cmd;
	const struct opt_doc *d;
	const char *shorts, *p;
	char name[64], *text, *specs = NULL;
	size_t i, j, size = 0;
	int bad = 0;
	FILE *f;

	if (!(f = open_memstream(&specs, &size)))
		return EXIT_FAIL;
	for (i = 0; (d = cli_main_doc(i)) != NULL; i++) {
		fprintf(f, "%s\n", d->spec);
		if (!d->help || !*d->help) {
			fprintf(stderr, "sbx: main option %s has no help text\n", d->spec);
			bad = 1;
		}
	}
	fclose(f);
	for (i = 0; (g = cli_global(i)) != NULL; i++) {
		snprintf(name, sizeof(name), "--%s", g->name);
		if (!man_mentions(specs, name)) {
			fprintf(stderr, "sbx: global option %s has no entry in main_docs[] (sbx.c)\n", name);
			bad = 1;
		}
	}
	free(specs);
	for (i = 0; (cmd = cli_command(i)) != NULL; i++) {
		if (!cmd->help || !*cmd->help || !cmd->usage) {
			fprintf(stderr, "sbx: command %s has no help text or usage\n", cmd->name);
			bad = 1;
			continue;
		}
		if (!summary_of(cmd->name)) {
			fprintf(stderr, "sbx: command %s has no summary in summaries[] (doc.c)\n", cmd->name);
			bad = 1;
		}
		if (cli_probe(cmd, &shorts, &longs) < 0) {
			fprintf(stderr, "sbx: command %s does not parse its options with cli_getopt\n", cmd->name);
			bad = 1;
			continue;
		}
		if (!(text = doc_text(longs)))
			return EXIT_FAIL;
		for (j = 0; longs[j].name; j++) {
			snprintf(name, sizeof(name), "--%s", longs[j].name);
			if (strcmp(longs[j].name, "help") != 0 && !man_mentions(text, name)) {
				fprintf(stderr, "sbx: %s: option %s is not in the command's usage or help text\n",
					cmd->name, name);
				bad = 1;
			}
		}
		for (p = shorts; *p; p++) {
			snprintf(name, sizeof(name), "-%c", *p);
			if (*p != '+' && *p != ':' && *p != 'h' && !man_mentions(text, name)) {
				fprintf(stderr, "sbx: %s: option %s is not in the command's usage or help text\n",
					cmd->name, name);
				bad = 1;
			}
		}
		free(text);
	}
	for (i = 0; i < NSUMMARIES; i++)
		if (summaries[i].name && !cli_find_command(summaries[i].name)) {
			fprintf(stderr, "sbx: summaries[] (doc.c) names %s, which is not a command\n",
				summaries[i].name);
			bad = 1;
		}
	return bad ? EXIT_FAIL : EXIT_OK;
}

/* ---- sbx --dump-man TEMPLATE: sbx(1) ---- */

static void man_lines(FILE *out, const char *s)
{
	const char *eol;

	for (;; s = eol + 1) {
		eol = strchr(s, '\n');
		man_escape(out, s, eol ? (size_t)(eol - s) : strlen(s));
		fputc('\n', out);
		if (!eol)
			break;
	}
}

static void man_command(FILE *out, const struct command *cmd)
{
	fputs(".PP\n\\fBsbx\\fR \\fB", out);
	man_escape(out, cmd->name, strlen(cmd->name));
	fputs("\\fR ", out);
	man_words(out, cmd->usage, strlen(cmd->usage), 0);
	fputs("\n.RS 4\n", out);
	man_text(out, cmd->help);
	fputs(".RE\n", out);
}

static int man_section(FILE *out, const char *marker, void *ud)
{
	const struct opt_doc *d;
	const struct command *cmd;
	const char *usage;
	size_t i;
	int other = 0;

	(void)ud;
	if (!strcmp(marker, "SYNOPSIS")) {
		usage = cli_global_usage();
		fputs(".B sbx\n", out);
		man_words(out, usage, strlen(usage), 0);
		fputs(" \\fICOMMAND\\fR [\\fIARGS\\fR]...\n.br\n.B sbx help\n[\\fICOMMAND\\fR]\n.br\n"
		      ".B sbx\n\\fICOMMAND\\fR \\fB\\-\\-help\\fR\n",
		      out);
		return 0;
	}
	if (!strcmp(marker, "OPTIONS")) {
		for (i = 0; (d = cli_main_doc(i)) != NULL; i++) {
			fputs(".TP\n", out);
			man_words(out, d->spec, strlen(d->spec), 1);
			fputc('\n', out);
			man_lines(out, d->help);
		}
		fputs(".PP\n", out);
		man_text(out, cli_main_notes());
		return 0;
	}
	if (!strcmp(marker, "COMMANDS")) {
		for (i = 0; i < NSUMMARIES; i++) {
			if (!summaries[i].name) {
				fputs(".SS \"", out);
				man_escape(out, summaries[i].text, strlen(summaries[i].text));
				fputs("\"\n", out);
			} else if ((cmd = cli_find_command(summaries[i].name)) != NULL) {
				man_command(out, cmd);
			}
		}
		for (i = 0; (cmd = cli_command(i)) != NULL; i++) {
			if (summary_of(cmd->name))
				continue;
			if (!other++)
				fputs(".SS Other\n", out);
			man_command(out, cmd);
		}
		return 0;
	}
	return -1;
}

/* ---- the hidden first arguments ---- */

int cli_is_doc_option(const char *arg)
{
	return !strcmp(arg, "--dump-man") || !strcmp(arg, "--check-docs") || !strcmp(arg, "--complete");
}

int cli_doc_main(int argc, char **argv)
{
	const struct command *cmd = NULL;
	size_t i;

	if (!strcmp(argv[1], "--check-docs") && argc == 2)
		return check_docs();
	if (!strcmp(argv[1], "--dump-man") && argc == 3)
		return man_template(stdout, argv[2], SBX_VERSION, man_section, NULL) < 0 ? EXIT_FAIL : EXIT_OK;
	if (!strcmp(argv[1], "--complete") && argc == 3 && !strcmp(argv[2], "commands")) {
		for (i = 0; (cmd = cli_command(i)) != NULL; i++)
			printf("%s\n", cmd->name);
		return EXIT_OK;
	}
	if (!strcmp(argv[1], "--complete") && (argc == 3 || argc == 4) &&
	    (!strcmp(argv[2], "options") || !strcmp(argv[2], "arg-options"))) {
		/* an unknown command: nothing to offer, and no complaint in the middle of a command line */
		if (argc == 4 && !(cmd = cli_find_command(argv[3])))
			return EXIT_OK;
		return list_options(stdout, cmd, argv[2][0] == 'a') < 0 ? EXIT_FAIL : EXIT_OK;
	}
	fprintf(stderr, "usage: sbx --dump-man TEMPLATE | --check-docs | --complete commands|options|arg-options "
			"[COMMAND]\n");
	return EXIT_USAGE;
}
