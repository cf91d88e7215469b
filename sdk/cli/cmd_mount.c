/* cmd_mount.c: the sbx subcommands for S3 bucket mounts: mount, mounts, unmount. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define MAX_OPTIONS 32

/* ---- credentials ----
 *
 * Never from the command line (other users would see them in ps). From a file in
 * the AWS credentials style:
 *
 *     # comment (also ; comment)
 *     [default]                      optional; keys of other [sections] are ignored
 *     aws_access_key_id = AKIA...
 *     aws_secret_access_key = ...
 *     aws_session_token = ...        optional
 *
 * (access_key_id, secret_access_key and session_token are accepted too), or else
 * from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN. */
struct creds {
	char key[512];
	char secret[1024];
	char token[8192];
};

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
		s[--n] = '\0';
	return s;
}

static int set_field(char *dst, size_t size, const char *v, const char *file, unsigned line)
{
	if (strlen(v) >= size) {
		fprintf(stderr, "sbx: %s:%u: value too long\n", file, line);
		return -1;
	}
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

static int read_creds_file(const char *file, struct creds *cr)
{
	FILE *f = fopen(file, "re");
	if (!f) {
		fprintf(stderr, "sbx: %s: %s\n", file, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
		fprintf(stderr, "sbx: warning: %s is readable by others (chmod 600 it)\n", file);
	char line[10240];
	unsigned ln = 0;
	int in_use = 1, rc = 0;
	while (rc == 0 && fgets(line, sizeof(line), f)) {
		ln++;
		char *s = trim(line);
		if (!*s || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (!end) {
				fprintf(stderr, "sbx: %s:%u: bad section header\n", file, ln);
				rc = -1;
				break;
			}
			*end = '\0';
			in_use = !strcmp(trim(s + 1), "default");
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) {
			fprintf(stderr, "sbx: %s:%u: want 'key = value'\n", file, ln);
			rc = -1;
			break;
		}
		*eq = '\0';
		char *k = trim(s), *v = trim(eq + 1);
		if (!in_use)
			continue;
		if (!strcmp(k, "aws_access_key_id") || !strcmp(k, "access_key_id"))
			rc = set_field(cr->key, sizeof(cr->key), v, file, ln);
		else if (!strcmp(k, "aws_secret_access_key") || !strcmp(k, "secret_access_key"))
			rc = set_field(cr->secret, sizeof(cr->secret), v, file, ln);
		else if (!strcmp(k, "aws_session_token") || !strcmp(k, "session_token"))
			rc = set_field(cr->token, sizeof(cr->token), v, file, ln);
		/* other keys (region, output, ...) are ignored */
	}
	explicit_bzero(line, sizeof(line));
	fclose(f);
	if (rc == 0 && (!cr->key[0] || !cr->secret[0])) {
		fprintf(stderr, "sbx: %s: needs aws_access_key_id and aws_secret_access_key\n", file);
		rc = -1;
	}
	return rc;
}

static int read_creds_env(struct creds *cr)
{
	const char *k = getenv("AWS_ACCESS_KEY_ID"), *s = getenv("AWS_SECRET_ACCESS_KEY"),
		   *t = getenv("AWS_SESSION_TOKEN");
	if (!k || !*k || !s || !*s) {
		fprintf(stderr, "sbx: mount: no credentials: give --credentials-file FILE, or set "
				"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY\n");
		return -1;
	}
	if (strlen(k) >= sizeof(cr->key) || strlen(s) >= sizeof(cr->secret) || (t && strlen(t) >= sizeof(cr->token))) {
		fprintf(stderr, "sbx: mount: credentials in the environment are too long\n");
		return -1;
	}
	strcpy(cr->key, k);
	strcpy(cr->secret, s);
	if (t)
		strcpy(cr->token, t);
	return 0;
}

/* ---- output ---- */

static void print_record(const struct ctx *ctx, const struct sbx_mount_record *r)
{
	if (ctx->json) {
		char *j = sbx_mount_record_json(r);
		if (j) {
			printf("%s\n", j);
			free(j);
		}
		return;
	}
	kv("id", "%s", r->id);
	kv("state", "%s", sbx_mount_state_name(r->state));
	kv("path", "%s", r->path);
	kv("bucket", "%s", r->bucket);
	if (r->prefix[0])
		kv("prefix", "%s", r->prefix);
	kv("endpoint", "%s", r->endpoint);
	kv("read_only", "%s", r->read_only ? "yes" : "no");
	kv("rclone_pid", "%u", r->rclone_pid);
	kv("created_at", "%s", r->created_at);
	if (r->error[0])
		kv("error", "%s", r->error);
}

/* ---- commands ---- */

enum {
	OPT_ENDPOINT = 256,
	OPT_PREFIX,
	OPT_REGION,
	OPT_PROVIDER,
	OPT_READ_ONLY,
	OPT_CREDS,
	OPT_NON_EMPTY,
	OPT_OPTION,
	OPT_WAIT,
	OPT_FORCE,
	OPT_FLUSH,
};

int cmd_mount(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"endpoint", required_argument, NULL, OPT_ENDPOINT},
		{"prefix", required_argument, NULL, OPT_PREFIX},
		{"region", required_argument, NULL, OPT_REGION},
		{"provider", required_argument, NULL, OPT_PROVIDER},
		{"read-only", no_argument, NULL, OPT_READ_ONLY},
		{"credentials-file", required_argument, NULL, OPT_CREDS},
		{"allow-non-empty", no_argument, NULL, OPT_NON_EMPTY},
		{"option", required_argument, NULL, OPT_OPTION},
		{"mount-timeout", required_argument, NULL, OPT_WAIT},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_mount_opts mo = SBX_MOUNT_OPTS_INIT;
	const char *options[MAX_OPTIONS + 1];
	size_t nopt = 0;
	const char *creds_file = NULL;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case OPT_ENDPOINT:
			mo.endpoint = optarg;
			break;
		case OPT_PREFIX:
			mo.prefix = optarg;
			break;
		case OPT_REGION:
			mo.region = optarg;
			break;
		case OPT_PROVIDER:
			mo.provider = optarg;
			break;
		case OPT_READ_ONLY:
			mo.read_only = 1;
			break;
		case OPT_CREDS:
			creds_file = optarg;
			break;
		case OPT_NON_EMPTY:
			mo.allow_non_empty = 1;
			break;
		case OPT_OPTION:
			if (nopt >= MAX_OPTIONS)
				return usage_error(ctx, "too many --option (at most %d)", MAX_OPTIONS);
			options[nopt++] = optarg;
			break;
		case OPT_WAIT:
			if (parse_seconds(optarg, &mo.timeout_ms) < 0 || mo.timeout_ms <= 0)
				return usage_error(ctx, "bad --mount-timeout '%s'", optarg);
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 2)) != EXIT_OK)
		return rc;
	if (!mo.endpoint)
		return usage_error(ctx, "--endpoint URL is required (it is never defaulted)");
	options[nopt] = NULL;
	mo.options = options;

	struct creds *cr = calloc(1, sizeof(*cr));
	if (!cr) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	if ((creds_file ? read_creds_file(creds_file, cr) : read_creds_env(cr)) < 0) {
		explicit_bzero(cr, sizeof(*cr));
		free(cr);
		return EXIT_FAIL;
	}
	mo.access_key_id = cr->key;
	mo.secret_access_key = cr->secret;
	mo.session_token = cr->token[0] ? cr->token : NULL;

	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) == EXIT_OK) {
		struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
		struct sbx_error err;
		if (sbx_mount(c, NULL, argv[optind], argv[optind + 1], &mo, &rec, &err) < 0)
			rc = fail(&err, NULL);
		else
			print_record(ctx, &rec);
		sbx_mount_record_free(&rec);
		sbx_client_close(c);
	}
	explicit_bzero(cr, sizeof(*cr));
	free(cr);
	return rc;
}

int cmd_mounts(struct ctx *ctx, int argc, char **argv)
{
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	struct sbx_mount_record **v = NULL;
	size_t n = 0;
	struct sbx_error err;
	if (sbx_mounts_list(c, NULL, &v, &n, &err) < 0) {
		rc = fail(&err, NULL);
	} else if (ctx->json) {
		printf("[");
		for (size_t i = 0; i < n; i++) {
			char *j = sbx_mount_record_json(v[i]);
			printf("%s%s", i ? "," : "", j ? j : "null");
			free(j);
		}
		printf("]\n");
	} else {
		printf("%-36s  %-10s  %-7s  %-24s  %s\n", "ID", "STATE", "PID", "PATH", "BUCKET");
		for (size_t i = 0; i < n; i++) {
			printf("%-36s  %-10s  %-7u  %-24s  %s%s%s%s\n", v[i]->id, sbx_mount_state_name(v[i]->state),
			       v[i]->rclone_pid, v[i]->path, v[i]->bucket, v[i]->prefix[0] ? "/" : "", v[i]->prefix,
			       v[i]->read_only ? " (read-only)" : "");
			if (v[i]->error[0])
				printf("  error: %s\n", v[i]->error);
		}
	}
	sbx_mounts_free(v);
	sbx_client_close(c);
	return rc;
}

int cmd_unmount(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"force", no_argument, NULL, OPT_FORCE},
		{"flush-timeout", required_argument, NULL, OPT_FLUSH},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_unmount_opts uo = SBX_UNMOUNT_OPTS_INIT;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, ":h", longopts)) != -1) {
		switch (opt) {
		case OPT_FORCE:
			uo.force = 1;
			break;
		case OPT_FLUSH:
			if (parse_seconds(optarg, &uo.flush_timeout_ms) < 0)
				return usage_error(ctx, "bad --flush-timeout '%s'", optarg);
			if (uo.flush_timeout_ms == 0)
				uo.flush_timeout_ms = -1; /* 0 s: do not wait */
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	struct sbx_client *c;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	if (sbx_unmount(c, NULL, argv[optind], &uo, &rec, &err) < 0)
		rc = fail(&err, NULL);
	else if (ctx->json)
		print_record(ctx, &rec);
	sbx_mount_record_free(&rec);
	sbx_client_close(c);
	return rc;
}
