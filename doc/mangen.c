/* mangen.c: man pages and documentation checks from the programs' own tables and help texts (see mangen.h). */
#include "mangen.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void man_escape(FILE *out, const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	uint32_t cp;
	size_t n, i;

	if (p < end && (*p == '.' || *p == '\''))
		fputs("\\&", out);
	while (p < end) {
		if (*p == '\\') {
			fputs("\\e", out);
		} else if (*p == '-') {
			fputs("\\-", out);
		} else if (*p < 0x80) {
			fputc(*p, out);
		} else {
			/* UTF-8 as groff's \[uXXXX]: the page is read as Latin-1 otherwise */
			n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : 2;
			cp = *p & (0x7f >> n);
			for (i = 1; i < n && p + i < end; i++)
				cp = cp << 6 | (p[i] & 0x3f);
			fprintf(out, "\\[u%04X]", (unsigned)cp);
			p += i;
			continue;
		}
		p++;
	}
}

void man_words(FILE *out, const char *s, size_t len, int first)
{
	const char *end = s + len, *w;
	int n = 0;

	while (s < end && *s == ' ')
		s++;
	while (s < end) {
		for (w = s; w < end && *w != ' '; w++)
			;
		if (n++)
			fputc(' ', out);
		fputs(first || *s == '-' || *s == '[' ? "\\fB" : "\\fI", out);
		man_escape(out, s, (size_t)(w - s));
		fputs("\\fR", out);
		first = 0;
		for (s = w; s < end && *s == ' '; s++)
			;
	}
}

void man_text(FILE *out, const char *text)
{
	const char *p = text, *eol, *gap;
	int in_entry = 0, in_para = 0;
	size_t len, indent;

	while (*p) {
		eol = strchr(p, '\n');
		if (!eol)
			eol = p + strlen(p);
		len = (size_t)(eol - p);
		for (indent = 0; indent < len && p[indent] == ' '; indent++)
			;
		if (indent == len) {
			if (in_entry || in_para)
				fputs(".PP\n", out);
			in_entry = in_para = 0;
		} else if (indent == 2) {
			for (gap = p + 2; gap + 1 < eol && !(gap[0] == ' ' && gap[1] == ' '); gap++)
				;
			if (gap + 1 >= eol)
				gap = eol;
			fputs(".TP\n", out);
			man_words(out, p + 2, (size_t)(gap - p - 2), 1);
			fputc('\n', out);
			while (gap < eol && *gap == ' ')
				gap++;
			if (gap < eol) {
				man_escape(out, gap, (size_t)(eol - gap));
				fputc('\n', out);
			}
			in_entry = 1;
		} else if (indent > 2) {
			man_escape(out, p + indent, len - indent);
			fputc('\n', out);
		} else {
			if (in_entry)
				fputs(".PP\n", out);
			in_entry = 0;
			in_para = 1;
			man_escape(out, p + indent, len - indent);
			fputc('\n', out);
		}
		p = *eol ? eol + 1 : eol;
	}
}

static int opt_char(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '_';
}

int man_mentions(const char *text, const char *opt)
{
	size_t n = strlen(opt);
	const char *p;

	for (p = text; (p = strstr(p, opt)) != NULL; p++)
		if ((p == text || !opt_char(p[-1])) && !opt_char(p[n]))
			return 1;
	return 0;
}

int man_template(FILE *out, const char *path, const char *version, int (*section)(FILE *, const char *, void *),
		 void *ud)
{
	FILE *in = fopen(path, "r");
	char *line = NULL, *p, *at;
	size_t cap = 0, len;
	ssize_t got;
	int rc = 0;

	if (!in) {
		perror(path);
		return -1;
	}
	while (rc == 0 && (got = getline(&line, &cap, in)) >= 0) {
		len = (size_t)got;
		if (len > 0 && line[len - 1] == '\n')
			line[--len] = '\0';
		/* the template's own comments */
		if (line[0] == '@' && line[1] == '#')
			continue;
		if (len > 2 && line[0] == '@' && line[len - 1] == '@' && strcspn(line + 1, "@") == len - 2 &&
		    strcmp(line, "@VERSION@") != 0) {
			line[len - 1] = '\0';
			if (section(out, line + 1, ud) < 0) {
				fprintf(stderr, "%s: unknown marker @%s@\n", path, line + 1);
				rc = -1;
			}
			continue;
		}
		for (p = line; (at = strstr(p, "@VERSION@")) != NULL; p = at + 9) {
			fwrite(p, 1, (size_t)(at - p), out);
			fputs(version, out);
		}
		fprintf(out, "%s\n", p);
	}
	if (ferror(in)) {
		fprintf(stderr, "%s: read error\n", path);
		rc = -1;
	}
	free(line);
	fclose(in);
	return rc;
}

/* ---- sandbox-shim(8) ---- */

static const char *next_line(const char *p)
{
	const char *eol = strchr(p, '\n');

	return eol ? eol + 1 : p + strlen(p);
}

/* A heading: no indent, ends with ':'. */
static int is_heading(const char *p)
{
	const char *eol = strchr(p, '\n');
	size_t len = eol ? (size_t)(eol - p) : strlen(p);

	return len > 1 && p[0] != ' ' && p[len - 1] == ':';
}

static void daemon_groups(FILE *out, const char *text, int environment)
{
	const char *p = text, *q, *eol;
	char *body;
	size_t len;
	int is_env;

	while (*p && !is_heading(p))
		p = next_line(p);
	while (*p) {
		eol = strchr(p, '\n');
		len = eol ? (size_t)(eol - p) : strlen(p);
		is_env = strncmp(p, "environment", 11) == 0;
		for (q = next_line(p); *q && !is_heading(q); q = next_line(q))
			;
		if (is_env == environment) {
			if (!environment) {
				fputs(".SS \"", out);
				fputc(toupper((unsigned char)p[0]), out);
				man_escape(out, p + 1, len - 2);
				fputs("\"\n", out);
			} else {
				/* the heading's parenthesis, as a sentence */
				const char *open = memchr(p, '(', len), *close = open ? memchr(open, ')', len) : NULL;

				if (open && close && close > open + 1) {
					fputc(toupper((unsigned char)open[1]), out);
					man_escape(out, open + 2, (size_t)(close - open - 2));
					fputs(":\n", out);
				}
			}
			body = strndup(next_line(p), (size_t)(q - next_line(p)));
			if (body) {
				man_text(out, body);
				free(body);
			}
		}
		p = q;
	}
}

struct daemon_ud {
	const char *text;
};

static int daemon_section(FILE *out, const char *marker, void *ud)
{
	const char *text = ((struct daemon_ud *)ud)->text, *p, *start;
	char *intro;

	if (!strcmp(marker, "SYNOPSIS")) {
		/* "usage: sandbox-shim ARGS" */
		p = strchr(text, ':');
		p = p ? p + 1 : text;
		while (*p == ' ')
			p++;
		start = strchr(p, ' ');
		fputs(".B sandbox-shim\n", out);
		if (start) {
			start++;
			man_escape(out, start, (size_t)(next_line(start) - start - (strchr(start, '\n') ? 1 : 0)));
			fputc('\n', out);
		}
		return 0;
	}
	if (!strcmp(marker, "INTRO")) {
		start = next_line(text);
		for (p = start; *p && !is_heading(p); p = next_line(p))
			;
		if ((intro = strndup(start, (size_t)(p - start))) != NULL) {
			man_text(out, intro);
			free(intro);
		}
		return 0;
	}
	if (!strcmp(marker, "OPTIONS") || !strcmp(marker, "ENVIRONMENT")) {
		daemon_groups(out, text, marker[0] == 'E');
		return 0;
	}
	return -1;
}

/* The SPEC parts of usage()'s entries that have a description, one a line: where each option
 * must be. */
static char *daemon_specs(const char *text)
{
	const char *p, *eol, *gap;
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);

	if (!f)
		return NULL;
	for (p = text; *p; p = next_line(p)) {
		eol = strchr(p, '\n');
		if (!eol)
			eol = p + strlen(p);
		if (eol - p < 3 || p[0] != ' ' || p[1] != ' ' || p[2] == ' ')
			continue;
		for (gap = p + 2; gap + 1 < eol && !(gap[0] == ' ' && gap[1] == ' '); gap++)
			;
		if (gap + 1 >= eol)
			gap = eol;
		/* an entry without a description (none after the spec, no continuation line) is no help */
		if (gap == eol && !(eol[0] == '\n' && strncmp(eol + 1, "   ", 3) == 0))
			continue;
		fwrite(p + 2, 1, (size_t)(gap - p - 2), f);
		fputc('\n', f);
	}
	fclose(f);
	return buf;
}

int mangen_daemon(int argc, char **argv, void (*usage)(FILE *), const struct option *opts, const char *version)
{
	struct daemon_ud ud;
	char *text = NULL, *specs, name[128];
	size_t size = 0, i;
	FILE *f = open_memstream(&text, &size);
	int rc = 0;

	if (!f)
		return 1;
	usage(f);
	fclose(f);
	ud.text = text;
	if (!strcmp(argv[1], "--list-options")) {
		for (i = 0; opts[i].name; i++)
			printf("--%s\n", opts[i].name);
	} else if (!strcmp(argv[1], "--check-docs")) {
		if (!(specs = daemon_specs(text))) {
			free(text);
			return 1;
		}
		for (i = 0; opts[i].name; i++) {
			snprintf(name, sizeof(name), "--%s", opts[i].name);
			if (!man_mentions(specs, name)) {
				fprintf(stderr,
					"sandbox-shim: option %s has no entry with a description in the --help text (a line "
					"'  %s ...  what it does')\n",
					name, name);
				rc = 1;
			}
		}
		free(specs);
	} else if (!strcmp(argv[1], "--dump-man") && argc == 3) {
		rc = man_template(stdout, argv[2], version, daemon_section, &ud) < 0 ? 1 : 0;
	} else {
		fprintf(stderr, "usage: sandbox-shim --dump-man TEMPLATE | --check-docs | --list-options\n");
		rc = 2;
	}
	free(text);
	return rc;
}
