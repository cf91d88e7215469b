/* cmd_backup.c: the sbx subcommands for directory archives: backup and restore. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* ---- interrupts ----
 *
 * SIGINT, SIGTERM and SIGHUP cancel the call (a backup to -o FILE then removes its
 * temporary file, a restore leaves the directory as it was). sbx_cancel_fire takes a
 * mutex, so the signals stay blocked and a thread takes them with sigwait(); it also
 * writes to a pipe that our own blocking reads and writes (stdin, stdout) poll, so a
 * stalled pipe does not hold the cancel up. A second signal exits at once. */
struct intr {
	pthread_t thread;
	sigset_t set;
	struct sbx_cancel *tok;
	int pipe[2];
	atomic_int stop;
	atomic_int sig; /* the signal that cancelled, or 0 */
	int started;
};

static void *intr_main(void *arg)
{
	struct intr *in = arg;
	int sig;

	for (;;) {
		if (sigwait(&in->set, &sig) != 0)
			continue;
		if (atomic_load(&in->stop))
			return NULL;
		if (atomic_load(&in->sig))
			_exit(128 + sig);
		atomic_store(&in->sig, sig);
		sbx_cancel_fire(in->tok);
		if (write(in->pipe[1], "x", 1) < 0) {
			/* the pipe is empty: cannot fail */
		}
	}
}

/* Call after connecting: an exec: target's shim must not inherit blocked signals. */
static int intr_start(struct intr *in)
{
	int e;

	in->pipe[0] = in->pipe[1] = -1;
	if (!(in->tok = sbx_cancel_new()) || pipe(in->pipe) < 0) {
		fprintf(stderr, "sbx: cannot set up interrupts: %s\n", in->tok ? strerror(errno) : "out of memory");
		return -1;
	}
	sigemptyset(&in->set);
	sigaddset(&in->set, SIGINT);
	sigaddset(&in->set, SIGTERM);
	sigaddset(&in->set, SIGHUP);
	if ((e = pthread_sigmask(SIG_BLOCK, &in->set, NULL)) != 0 ||
	    (e = pthread_create(&in->thread, NULL, intr_main, in)) != 0) {
		fprintf(stderr, "sbx: cannot start the signal thread: %s\n", strerror(e));
		return -1;
	}
	in->started = 1;
	return 0;
}

static void intr_stop(struct intr *in)
{
	if (in->started) {
		/* wake the thread with a signal of its own set; stop tells it to return */
		atomic_store(&in->stop, 1);
		pthread_kill(in->thread, SIGTERM);
		pthread_join(in->thread, NULL);
	}
	if (in->pipe[0] >= 0) {
		close(in->pipe[0]);
		close(in->pipe[1]);
	}
	sbx_cancel_free(in->tok);
}

/* Wait until fd is ready for events, or the interrupt pipe is readable (ECANCELED). */
static int wait_fd(int fd, short events, int intr_fd)
{
	struct pollfd pf[2] = {{.fd = fd, .events = events}, {.fd = intr_fd, .events = POLLIN}};

	for (;;) {
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (pf[1].revents)
			return ECANCELED;
		if (pf[0].revents)
			return 0;
	}
}

/* ---- progress on a terminal ---- */

/* A single line on stderr, rewritten with \r at most 4 times a second and cleared at
 * the end; only when stderr is a terminal. */
struct progress {
	int on;
	const char *verb;
	uint64_t t0, last;
	uint64_t bytes, entries;
	int shown;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *human(double v, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned i = 0;

	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(buf, size, i ? "%.1f %s" : "%.0f %s", v, units[i]);
	return buf;
}

static void progress_init(struct progress *p, const char *verb)
{
	memset(p, 0, sizeof(*p));
	p->on = isatty(STDERR_FILENO);
	p->verb = verb;
	p->t0 = mono_ns();
}

static void progress_show(struct progress *p)
{
	uint64_t now = mono_ns();
	double secs = (double)(now - p->t0) / 1e9;
	char b1[32], b2[32], rate[48] = "";

	if (!p->on || (p->shown && now - p->last < 250000000u))
		return;
	p->last = now;
	if (secs >= 0.5)
		snprintf(rate, sizeof(rate), ", %s/s", human((double)p->bytes / secs, b2, sizeof(b2)));
	fprintf(stderr, "\r\033[K%s: %s, %" PRIu64 " files%s", p->verb, human((double)p->bytes, b1, sizeof(b1)),
		p->entries, rate);
	p->shown = 1;
}

static void progress_clear(struct progress *p)
{
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = 0;
}

/* EVENT progress from the shim: bytes of archive and entries so far. */
static void progress_cb(void *ud, uint64_t bytes, uint64_t entries)
{
	struct progress *p = ud;

	if (bytes > p->bytes)
		p->bytes = bytes;
	if (entries > p->entries)
		p->entries = entries;
	progress_show(p);
}

/* ---- backup ---- */

struct out_sink {
	struct progress *prog;
	int intr_fd;
	uint64_t bytes;
};

/* The archive to stdout: straight to the descriptor, nothing held in a stdio buffer. */
static int stdout_sink(void *ud, const void *buf, size_t len)
{
	struct out_sink *s = ud;
	const char *p = buf;
	ssize_t n;
	int e;

	s->bytes += len;
	while (len > 0) {
		if ((e = wait_fd(STDOUT_FILENO, POLLOUT, s->intr_fd)) != 0)
			return e;
		n = write(STDOUT_FILENO, p, len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return errno;
		p += n;
		len -= (size_t)n;
	}
	if (s->bytes > s->prog->bytes)
		s->prog->bytes = s->bytes;
	progress_show(s->prog);
	return 0;
}

static int parse_level(const char *s, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < -1000 || v > 1000)
		return -1;
	*out = (int)v;
	return 0;
}

int cmd_backup(struct ctx *ctx, int argc, char **argv)
{
	enum { OPT_EXCLUDE = 256, OPT_COMPRESS, OPT_LEVEL, OPT_SKIP, OPT_TO, OPT_ONE_FS };
	static const struct option longopts[] = {
		{"output", required_argument, NULL, 'o'},
		{"exclude", required_argument, NULL, OPT_EXCLUDE},
		{"compress", required_argument, NULL, OPT_COMPRESS},
		{"level", required_argument, NULL, OPT_LEVEL},
		{"skip-unreadable", no_argument, NULL, OPT_SKIP},
		{"one-file-system", no_argument, NULL, OPT_ONE_FS},
		{"to", required_argument, NULL, OPT_TO},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 0};
	struct intr in = {.pipe = {-1, -1}};
	struct progress prog;
	struct out_sink sink;
	struct sbx_client *c;
	struct sbx_error err;
	const char *output = NULL, **excludes;
	int opt, rc, nex = 0, level_given = 0, r;
	char *json;

	/* at most one pattern per argument */
	if (!(excludes = calloc((size_t)argc + 1, sizeof(*excludes)))) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	while ((opt = cli_getopt(ctx, argc, argv, ":o:h", longopts)) != -1) {
		switch (opt) {
		case 'o':
			output = optarg;
			break;
		case OPT_EXCLUDE:
			excludes[nex++] = optarg;
			break;
		case OPT_COMPRESS:
			if (!strcmp(optarg, "none"))
				bo.compression = SBX_COMPRESS_NONE;
			else if (!strcmp(optarg, "gzip"))
				bo.compression = SBX_COMPRESS_GZIP;
			else if (!strcmp(optarg, "zstd"))
				bo.compression = SBX_COMPRESS_ZSTD;
			else {
				free(excludes);
				return usage_error(ctx, "bad --compress '%s': want zstd, gzip or none", optarg);
			}
			break;
		case OPT_LEVEL:
			if (parse_level(optarg, &bo.level) < 0) {
				free(excludes);
				return usage_error(ctx, "bad --level '%s': want a number", optarg);
			}
			level_given = 1;
			break;
		case OPT_SKIP:
			bo.skip_unreadable = 1;
			break;
		case OPT_ONE_FS:
			bo.one_file_system = 1;
			break;
		case OPT_TO:
			bo.to_path = optarg;
			break;
		default:
			free(excludes);
			return other_option(ctx, argv, opt);
		}
	}
	bo.excludes = nex ? excludes : NULL;
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		goto out_free;
	if (output && !*output)
		rc = usage_error(ctx, "bad -o '': want a file name or -");
	else if (output && bo.to_path)
		rc = usage_error(ctx, "-o and --to are exclusive");
	else if (level_given && bo.compression == SBX_COMPRESS_NONE)
		rc = usage_error(ctx, "--level needs --compress gzip or zstd");
	else if (output && !strcmp(output, "-"))
		output = NULL;
	if (rc != EXIT_OK)
		goto out_free;
	if (!output && !bo.to_path) {
		if (ctx->json) {
			rc = usage_error(ctx, "--json prints the record on stdout, which carries the archive: "
					      "give -o FILE or --to PATH");
			goto out_free;
		}
		if (isatty(STDOUT_FILENO)) {
			fprintf(stderr, "sbx: backup: refusing to write an archive to a terminal; "
					"redirect stdout or give -o FILE\n");
			rc = EXIT_USAGE;
			goto out_free;
		}
	}
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		goto out_free;
	if (intr_start(&in) < 0) {
		rc = EXIT_FAIL;
		goto out;
	}
	opts.cancel = in.tok;
	fs_opts_into(ctx, &opts);
	progress_init(&prog, "backup");
	bo.progress = progress_cb;
	bo.progress_ud = &prog;
	sink.prog = &prog;
	sink.intr_fd = in.pipe[0];
	sink.bytes = 0;
	if (output)
		r = sbx_backup_to_file(c, &opts, argv[optind], &bo, output, &rec, &err);
	else
		r = sbx_backup(c, &opts, argv[optind], &bo, bo.to_path ? NULL : stdout_sink, &sink, &rec, &err);
	progress_clear(&prog);
	if (r < 0) {
		if (err.code == ECANCELED && atomic_load(&in.sig)) {
			fprintf(stderr, "sbx: backup: interrupted%s\n", output ? "; nothing written" : "");
			rc = EXIT_FAIL;
		} else {
			rc = fail(&err, NULL);
		}
		goto out;
	}
	if (!(json = sbx_backup_record_json(&rec))) {
		fprintf(stderr, "sbx: out of memory\n");
		rc = EXIT_FAIL;
	} else {
		fprintf(ctx->json ? stdout : stderr, "%s\n", json);
		free(json);
	}
	sbx_backup_record_free(&rec);
out:
	intr_stop(&in);
	sbx_client_close(c);
out_free:
	free(excludes);
	return rc;
}

/* ---- restore ---- */

struct in_source {
	struct progress *prog;
	int fd;
	int intr_fd;
	uint64_t bytes;
};

static long fd_source(void *ud, void *buf, size_t len)
{
	struct in_source *s = ud;
	ssize_t n;
	int e;

	for (;;) {
		if ((e = wait_fd(s->fd, POLLIN, s->intr_fd)) != 0) {
			errno = e;
			return -1;
		}
		n = read(s->fd, buf, len);
		if (n >= 0 || (errno != EINTR && errno != EAGAIN))
			break;
	}
	if (n > 0) {
		s->bytes += (uint64_t)n;
		if (s->bytes > s->prog->bytes)
			s->prog->bytes = s->bytes;
		progress_show(s->prog);
	}
	return (long)n;
}

/* 64 hexadecimal digits. */
static int is_sha256(const char *s)
{
	return strlen(s) == 64 && strspn(s, "0123456789abcdefABCDEF") == 64;
}

int cmd_restore(struct ctx *ctx, int argc, char **argv)
{
	enum { OPT_MERGE = 256, OPT_SHA256, OPT_FROM, OPT_ALLOW_DEVICES, OPT_ALLOW_EMPTY };
	static const struct option longopts[] = {
		{"input", required_argument, NULL, 'i'},
		{"merge", no_argument, NULL, OPT_MERGE},
		{"sha256", required_argument, NULL, OPT_SHA256},
		{"from", required_argument, NULL, OPT_FROM},
		{"allow-devices", no_argument, NULL, OPT_ALLOW_DEVICES},
		{"allow-empty", no_argument, NULL, OPT_ALLOW_EMPTY},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 0};
	struct intr in = {.pipe = {-1, -1}};
	struct progress prog;
	struct in_source src;
	struct sbx_client *c;
	struct sbx_error err;
	const char *input = NULL;
	int opt, rc, fd = -1;

	while ((opt = cli_getopt(ctx, argc, argv, ":i:h", longopts)) != -1) {
		switch (opt) {
		case 'i':
			input = optarg;
			break;
		case OPT_MERGE:
			ro.merge = 1;
			break;
		case OPT_SHA256:
			if (!is_sha256(optarg))
				return usage_error(ctx, "bad --sha256 '%s': want 64 hexadecimal digits", optarg);
			ro.sha256 = optarg;
			break;
		case OPT_FROM:
			ro.from_path = optarg;
			break;
		case OPT_ALLOW_DEVICES:
			ro.allow_devices = 1;
			break;
		case OPT_ALLOW_EMPTY:
			ro.allow_empty = 1;
			break;
		default:
			return other_option(ctx, argv, opt);
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if (input && !*input)
		return usage_error(ctx, "bad -i '': want a file name or -");
	if (input && ro.from_path)
		return usage_error(ctx, "-i and --from are exclusive");
	if (input && !strcmp(input, "-"))
		input = NULL;
	if (!ro.from_path) {
		if (input) {
			/* open it before connecting: a missing file is our error, not the shim's */
			if ((fd = open(input, O_RDONLY | O_CLOEXEC)) < 0) {
				fprintf(stderr, "sbx: %s: %s\n", input, strerror(errno));
				return EXIT_FAIL;
			}
		} else if (isatty(STDIN_FILENO)) {
			fprintf(stderr, "sbx: restore: refusing to read an archive from a terminal; "
					"redirect stdin or give -i FILE\n");
			return EXIT_USAGE;
		} else {
			fd = STDIN_FILENO;
		}
	}
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		goto out_close;
	if (intr_start(&in) < 0) {
		rc = EXIT_FAIL;
		goto out;
	}
	opts.cancel = in.tok;
	fs_opts_into(ctx, &opts);
	progress_init(&prog, "restore");
	ro.progress = progress_cb;
	ro.progress_ud = &prog;
	src.prog = &prog;
	src.fd = fd;
	src.intr_fd = in.pipe[0];
	src.bytes = 0;
	if (sbx_restore(c, &opts, argv[optind], &ro, ro.from_path ? NULL : fd_source, &src, &res, &err) < 0) {
		progress_clear(&prog);
		if (err.code == ECANCELED && atomic_load(&in.sig)) {
			fprintf(stderr, "sbx: restore: interrupted; %s left as it was\n",
				ro.merge ? "entries extracted so far are" : "the directory is");
			rc = EXIT_FAIL;
		} else {
			rc = fail(&err, NULL);
		}
		goto out;
	}
	progress_clear(&prog);
	if (ctx->json) {
		printf("{\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 ",\"sha256\":", res.bytes, res.entries);
		json_str(res.sha256);
		fputs("}\n", stdout);
	}
out:
	intr_stop(&in);
	sbx_client_close(c);
out_close:
	if (fd > STDIN_FILENO)
		close(fd);
	return rc;
}
