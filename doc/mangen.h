/* mangen.h: man pages, checks and completion lists made from the programs' own option tables and help
 * texts (issue 18), so that sbx(1) and sandbox-shim(8) cannot drift from the code. Compiled into both
 * programs; reached only through their hidden first arguments (sbx --dump-man, sandbox-shim --dump-man). */
#ifndef SBX_MANGEN_H
#define SBX_MANGEN_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>

/* s as roff text: backslashes as \e, '-' as \-, a leading '.' or '\'' guarded. */
void man_escape(FILE *out, const char *s, size_t len);

/* Words of a usage or an entry's SPEC as roff: options ("-x", "--opt", "[-r]") bold, arguments
 * italic; with first set, the first word bold whatever it is (an option, a variable's name). */
void man_words(FILE *out, const char *s, size_t len, int first);

/* A help text as roff. Its layout, the one every usage text of ours follows:
 *   "  SPEC  DESCRIPTION"   an entry (SPEC: "--opt ARG", "-x, --opt", "NAME"; two or more spaces
 *                           before DESCRIPTION, which may be absent)
 *   "        more words"    (three or more spaces) continues the entry, or the paragraph
 *   "other text"            a paragraph; an empty line ends it
 * Entries become .TP items (the options bold, their arguments italic), the rest filled text. */
void man_text(FILE *out, const char *text);

/* Whether "--name" (or "-x" for a one-letter name) appears in text as a word of its own: not
 * inside a longer option, not part of a word. */
int man_mentions(const char *text, const char *opt);

/* Copy the template at path to out, with "@VERSION@" replaced by version everywhere and each line
 * that is only "@NAME@" replaced by what section(out, "NAME", ud) writes (it returns 0, or -1 for
 * a marker it does not know); lines that start with "@#" are the template's own comments, left
 * out. Returns 0, or -1 after printing why on stderr. */
int man_template(FILE *out, const char *path, const char *version, int (*section)(FILE *, const char *, void *),
		 void *ud);

/* sandbox-shim's hidden documentation entry points, given usage() and the option table:
 *   sandbox-shim --dump-man TEMPLATE   sandbox-shim(8) on stdout (TEMPLATE: doc/sandbox-shim.8.in;
 *                                      markers @INTRO@, @OPTIONS@, @ENVIRONMENT@)
 *   sandbox-shim --check-docs          every option of the table has its entry in usage(): exit 0,
 *                                      else each one missing named on stderr and exit 1
 *   sandbox-shim --list-options        the table's options, one "--name" a line
 * Returns the exit status. */
int mangen_daemon(int argc, char **argv, void (*usage)(FILE *), const struct option *opts, const char *version);

#endif
