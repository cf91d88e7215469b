/* cmd_exec.c: the sbx subcommands for commands and processes: exec, sh, eval, ps, logs, kill, wait, rmproc. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* What `timeout` and most shells report for a command that timed out. */
#define EXIT_TIMED_OUT 124
#define IO_BUF (64u << 10)

/* ---- signals by name (Linux numbers: the shim runs on Linux) ---- */

static const char *const signames[] = {
	[1] = "HUP",   [2] = "INT",     [3] = "QUIT",  [4] = "ILL",   [5] = "TRAP",    [6] = "ABRT",  [7] = "BUS",
	[8] = "FPE",   [9] = "KILL",    [10] = "USR1", [11] = "SEGV", [12] = "USR2",   [13] = "PIPE", [14] = "ALRM",
	[15] = "TERM", [16] = "STKFLT", [17] = "CHLD", [18] = "CONT", [19] = "STOP",   [20] = "TSTP", [21] = "TTIN",
	[22] = "TTOU", [23] = "URG",    [24] = "XCPU", [25] = "XFSZ", [26] = "VTALRM", [27] = "PROF", [28] = "WINCH",
	[29] = "IO",   [30] = "PWR",    [31] = "SYS",
};
#define SIG_MAX 64

/* "TERM", "SIGTERM", "term" or "15" (1..64); 0, or -1 if unknown. */
static int parse_signal(const char *s, int *out)
{
	char *end;
	long v;
	int i;

	if (*s >= '0' && *s <= '9') {
		v = strtol(s, &end, 10);
		if (*end || v < 1 || v > SIG_MAX)
			return -1;
		*out = (int)v;
		return 0;
	}
	if (!strncasecmp(s, "SIG", 3))
		s += 3;
	for (i = 1; i < (int)(sizeof(signames) / sizeof(signames[0])); i++) {
		if (signames[i] && !strcasecmp(s, signames[i])) {
			*out = i;
			return 0;
		}
	}
	if (!strcasecmp(s, "POLL"))
		return *out = 29, 0;
	if (!strcasecmp(s, "IOT"))
		return *out = 6, 0;
	return -1;
}

/* "SIGKILL", or "SIG38" for a number without a name. */
static const char *signal_name(int sig, char *buf, size_t size)
{
	if (sig > 0 && sig < (int)(sizeof(signames) / sizeof(signames[0])) && signames[sig])
		snprintf(buf, size, "SIG%s", signames[sig]);
	else
		snprintf(buf, size, "SIG%d", sig);
	return buf;
}

/* ---- small helpers ---- */

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

/* The exit status sbx passes on for a command's end: 124 when it timed out, else the
 * shell's ($? of a command killed by signal N is 128+N). */
static int exit_status_of(const struct sbx_exit *ex)
{
	int st;

	if (ex->timed_out)
		return EXIT_TIMED_OUT;
	st = sbx_exit_status(ex);
	return st < 0 ? EXIT_FAIL : st > 255 ? 255 : st;
}

static const char *fmt_utc(const struct sbx_timespec *t, char *buf, size_t size)
{
	time_t sec = (time_t)t->sec;
	struct tm tm;

	if (!gmtime_r(&sec, &tm))
		snprintf(buf, size, "@%" PRId64, t->sec);
	else
		snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			 tm.tm_hour, tm.tm_min, tm.tm_sec);
	return buf;
}

/* A command line on one line of a table: control bytes as \ooo. */
static void put_cmdline(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	for (; *p; p++) {
		if (*p < 0x20 || *p == 0x7f || *p == '\\')
			printf("\\%03o", *p);
		else
			putchar(*p);
	}
}

/* ---- exec and sh: options ---- */

struct exec_args {
	struct sbx_exec_opts eo;
	const char **env;
	size_t nenv;
	const char **keep;
	struct sbx_rlimit *rl;
	char *user; /* the --user argument, split at ':' into eo.user and eo.group */
	char *caps; /* the --drop-caps list, split at ',' into keep */
	int interactive, tty, detach;
	const char *shell; /* sh: the command string */
};

static void exec_args_free(struct exec_args *a)
{
	free(a->env);
	free(a->keep);
	free(a->rl);
	free(a->user);
	free(a->caps);
}

static int parse_limit_value(const char *s, uint64_t *out)
{
	if (!strcmp(s, "unlimited") || !strcmp(s, "infinity")) {
		*out = UINT64_MAX;
		return 0;
	}
	return parse_size(s, out);
}

/* NAME=SOFT[:HARD], values decimal (K/M/G suffixes) or "unlimited". */
static int add_rlimit(struct exec_args *a, char *arg)
{
	char *eq = strchr(arg, '='), *colon;
	struct sbx_rlimit r = {0};
	struct sbx_rlimit *n;

	if (!eq || eq == arg)
		return -1;
	*eq = '\0';
	r.name = arg;
	colon = strchr(eq + 1, ':');
	if (colon)
		*colon = '\0';
	if (parse_limit_value(eq + 1, &r.soft) < 0 || (colon && parse_limit_value(colon + 1, &r.hard) < 0))
		return -1;
	/* the SDK reads hard 0 as "same as soft" */
	if (colon && r.hard == 0 && r.soft != 0)
		return -1;
	if (!(n = realloc(a->rl, (a->eo.n_rlimits + 1) * sizeof(*n))))
		return -1;
	a->rl = n;
	a->rl[a->eo.n_rlimits++] = r;
	a->eo.rlimits = a->rl;
	return 0;
}

static int parse_int_arg(const char *s, long min, long max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < min || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

/* Parse the options of exec and sh into a. Returns EXIT_OK to go on, -1 after
 * printing help, or the exit status of a usage error (printed). */
static int parse_exec_args(struct ctx *ctx, int argc, char **argv, int shell, struct exec_args *a)
{
	enum {
		OPT_CWD = 256,
		OPT_ENV,
		OPT_CLEAR_ENV,
		OPT_USER,
		OPT_TIMEOUT,
		OPT_KILL_GRACE,
		OPT_DETACH,
		OPT_NAME,
		OPT_NNP,
		OPT_DROP_CAPS,
		OPT_SECCOMP,
		OPT_RLIMIT,
		OPT_NICE,
		OPT_OOM,
	};
	static const struct option longopts[] = {
		{"cwd", required_argument, NULL, OPT_CWD},
		{"env", required_argument, NULL, OPT_ENV},
		{"clear-env", no_argument, NULL, OPT_CLEAR_ENV},
		{"user", required_argument, NULL, OPT_USER},
		{"timeout", required_argument, NULL, OPT_TIMEOUT},
		{"kill-grace", required_argument, NULL, OPT_KILL_GRACE},
		{"interactive", no_argument, NULL, 'i'},
		{"tty", no_argument, NULL, 't'},
		{"detach", no_argument, NULL, OPT_DETACH},
		{"name", required_argument, NULL, OPT_NAME},
		{"no-new-privs", no_argument, NULL, OPT_NNP},
		{"drop-caps", optional_argument, NULL, OPT_DROP_CAPS},
		{"seccomp", required_argument, NULL, OPT_SECCOMP},
		{"rlimit", required_argument, NULL, OPT_RLIMIT},
		{"nice", required_argument, NULL, OPT_NICE},
		{"oom-score-adj", required_argument, NULL, OPT_OOM},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_exec_opts init = SBX_EXEC_OPTS_INIT;
	const char **v;
	char *p, *tok, *save;
	size_t n;
	int opt, ms;

	memset(a, 0, sizeof(*a));
	a->eo = init;
	/* '+': the command's own options are not ours */
	while ((opt = cli_getopt(ctx, argc, argv, "+:ith", longopts)) != -1) {
		switch (opt) {
		case OPT_CWD:
			a->eo.cwd = optarg;
			break;
		case OPT_ENV:
			if (!strchr(optarg, '=') || optarg[0] == '=')
				return usage_error(ctx, "bad --env '%s': want NAME=VALUE", optarg);
			if (!(v = realloc(a->env, (a->nenv + 2) * sizeof(*v))))
				return usage_error(ctx, "out of memory");
			a->env = v;
			a->env[a->nenv++] = optarg;
			a->env[a->nenv] = NULL;
			a->eo.env = a->env;
			break;
		case OPT_CLEAR_ENV:
			a->eo.clear_env = 1;
			break;
		case OPT_USER:
			free(a->user);
			if (!(a->user = strdup(optarg)))
				return usage_error(ctx, "out of memory");
			if ((p = strchr(a->user, ':'))) {
				*p++ = '\0';
				if (!*p)
					return usage_error(ctx, "bad --user '%s': want USER[:GROUP]", optarg);
				a->eo.group = p;
			} else {
				a->eo.group = NULL;
			}
			a->eo.user = *a->user ? a->user : NULL;
			break;
		case OPT_TIMEOUT:
			if (parse_seconds(optarg, &ms) < 0)
				return usage_error(ctx, "bad --timeout '%s': want seconds", optarg);
			a->eo.timeout_ms = ms;
			break;
		case OPT_KILL_GRACE:
			if (parse_seconds(optarg, &ms) < 0 || ms == 0)
				return usage_error(ctx, "bad --kill-grace '%s': want seconds > 0", optarg);
			a->eo.kill_grace_ms = ms;
			break;
		case 'i':
			a->interactive = 1;
			break;
		case 't':
			a->tty = 1;
			break;
		case OPT_DETACH:
			a->detach = 1;
			break;
		case OPT_NAME:
			if (!*optarg || strlen(optarg) > 63)
				return usage_error(ctx, "bad --name '%s': want 1 to 63 characters", optarg);
			a->eo.name = optarg;
			break;
		case OPT_NNP:
			a->eo.no_new_privs = 1;
			break;
		case OPT_DROP_CAPS:
			a->eo.drop_caps = 1;
			free(a->caps);
			free(a->keep);
			a->caps = NULL;
			a->keep = NULL;
			a->eo.keep_caps = NULL;
			if (!optarg || !*optarg)
				break;
			if (!(a->caps = strdup(optarg)) || !(a->keep = calloc(strlen(optarg) + 2, sizeof(*a->keep))))
				return usage_error(ctx, "out of memory");
			n = 0;
			for (tok = strtok_r(a->caps, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
				a->keep[n++] = tok;
			a->keep[n] = NULL;
			a->eo.keep_caps = a->keep;
			break;
		case OPT_SECCOMP:
			if (!*optarg)
				return usage_error(ctx, "bad --seccomp '': want default, none or a policy file");
			a->eo.seccomp = optarg;
			break;
		case OPT_RLIMIT:
			if (add_rlimit(a, optarg) < 0)
				return usage_error(ctx, "bad --rlimit: want NAME=SOFT[:HARD] (numbers or 'unlimited')");
			break;
		case OPT_NICE:
			if (parse_int_arg(optarg, -20, 19, &a->eo.nice) < 0)
				return usage_error(ctx, "bad --nice '%s': want -20..19", optarg);
			break;
		case OPT_OOM:
			if (parse_int_arg(optarg, -1000, 1000, &a->eo.oom_score_adj) < 0)
				return usage_error(ctx, "bad --oom-score-adj '%s': want -1000..1000", optarg);
			break;
		default:
			/* help (EXIT_OK) ends the command as much as an error does */
			opt = other_option(ctx, argv, opt);
			return opt == EXIT_OK ? -1 : opt;
		}
	}
	if (shell) {
		if (optind >= argc)
			return usage_error(ctx, "no command string given");
		if (argc - optind > 1)
			return usage_error(ctx, "unexpected argument '%s' (quote the command string)",
					   argv[optind + 1]);
		a->shell = argv[optind];
		a->eo.shell = a->shell;
	} else {
		if (optind >= argc)
			return usage_error(ctx, "no command given");
		/* argv[argc] is NULL: the operands are a NULL-terminated argv as they are */
		a->eo.argv = (const char *const *)(argv + optind);
	}
	if (a->detach && a->interactive)
		return usage_error(ctx, "-i cannot be used with --detach (attach with 'sbx logs -f')");
	if (a->eo.name && !a->detach)
		return usage_error(ctx, "--name needs --detach");
	return EXIT_OK;
}

/* ---- exec and sh: running ---- */

/* The local terminal's settings while it is raw, restored at any exit. */
static struct termios saved_tty;
static int tty_raw_fd = -1;

static void tty_restore(void)
{
	if (tty_raw_fd >= 0) {
		tcsetattr(tty_raw_fd, TCSADRAIN, &saved_tty);
		tty_raw_fd = -1;
	}
}

static int tty_make_raw(int fd)
{
	struct termios t;

	if (tcgetattr(fd, &saved_tty) < 0)
		return -1;
	t = saved_tty;
	cfmakeraw(&t);
	if (tcsetattr(fd, TCSADRAIN, &t) < 0)
		return -1;
	tty_raw_fd = fd;
	atexit(tty_restore);
	return 0;
}

static void term_size(unsigned *rows, unsigned *cols)
{
	struct winsize ws;

	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	} else {
		*rows = 24;
		*cols = 80;
	}
}

/* One foreground command: the main thread copies its output, a thread feeds it
 * stdin (-i), a thread takes the signals (SIGINT/SIGTERM/SIGHUP/SIGQUIT are passed
 * on to the command, SIGWINCH becomes a resize). */
struct fg {
	struct sbx_client *c;
	struct sbx_cancel *tok;
	_Atomic(struct sbx_proc *) proc;
	int pty;
	/* signal thread */
	pthread_t sig_thread;
	sigset_t set;
	atomic_int stop;
	atomic_int gave_up; /* the signal that made us cancel the command */
	int forwarded;
	/* stdin thread */
	pthread_t in_thread;
	int stop_pipe[2];
	atomic_int in_err; /* errno of a failed local read */
};

/* A third interrupt means "stop now": the command is cancelled (its process group
 * killed) rather than asked once more. */
#define SIG_FORWARD_MAX 2

static void *sig_main(void *arg)
{
	struct fg *f = arg;
	struct sbx_proc *p;
	struct sbx_error err;
	unsigned rows, cols;
	int sig;

	for (;;) {
		if (sigwait(&f->set, &sig) != 0)
			continue;
		if (atomic_load(&f->stop))
			return NULL;
		p = atomic_load(&f->proc);
		if (sig == SIGWINCH) {
			if (p && f->pty) {
				term_size(&rows, &cols);
				sbx_proc_resize(p, rows, cols, &err);
			}
			continue;
		}
		if (p && f->forwarded < SIG_FORWARD_MAX) {
			f->forwarded++;
			if (sbx_proc_signal(p, sig, &err) == 0)
				continue;
		}
		atomic_store(&f->gave_up, sig);
		sbx_cancel_fire(f->tok);
	}
}

static void *stdin_main(void *arg)
{
	struct fg *f = arg;
	struct sbx_proc *p = atomic_load(&f->proc);
	struct pollfd pf[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = f->stop_pipe[0], .events = POLLIN}};
	struct sbx_error err;
	char *buf = malloc(IO_BUF);
	ssize_t n;

	if (!buf) {
		atomic_store(&f->in_err, ENOMEM);
		return NULL;
	}
	for (;;) {
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			atomic_store(&f->in_err, errno);
			break;
		}
		if (pf[1].revents)
			break;
		n = read(STDIN_FILENO, buf, IO_BUF);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			atomic_store(&f->in_err, errno);
		if (n <= 0) {
			/* end of our stdin: the command's stdin ends too */
			sbx_proc_close_stdin(p, &err);
			break;
		}
		/* fails only once the command has ended: nothing more to feed it */
		if (sbx_proc_write(p, buf, (size_t)n, &err) < 0)
			break;
	}
	free(buf);
	return NULL;
}

static int run_foreground(struct ctx *ctx, struct exec_args *a, struct sbx_client *c)
{
	struct fg f = {.c = c, .stop_pipe = {-1, -1}};
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};
	struct sbx_proc *p = NULL;
	struct sbx_error err;
	struct sbx_exit ex = SBX_EXIT_INIT;
	int rc = EXIT_OK, e, chan, sig_started = 0, in_started = 0, werr = 0;
	char *buf = NULL;
	long n;

	(void)ctx;
	f.pty = a->tty;
	if (!(f.tok = sbx_cancel_new()) || !(buf = malloc(IO_BUF))) {
		fprintf(stderr, "sbx: out of memory\n");
		rc = EXIT_FAIL;
		goto out;
	}
	opts.cancel = f.tok;
	sigemptyset(&f.set);
	sigaddset(&f.set, SIGINT);
	sigaddset(&f.set, SIGTERM);
	sigaddset(&f.set, SIGHUP);
	sigaddset(&f.set, SIGQUIT);
	if (a->tty)
		sigaddset(&f.set, SIGWINCH);
	if ((e = pthread_sigmask(SIG_BLOCK, &f.set, NULL)) != 0 ||
	    (e = pthread_create(&f.sig_thread, NULL, sig_main, &f)) != 0) {
		fprintf(stderr, "sbx: cannot start the signal thread: %s\n", strerror(e));
		rc = EXIT_FAIL;
		goto out;
	}
	sig_started = 1;
	if (sbx_exec_start(c, &opts, &a->eo, a->interactive ? SBX_PROC_STDIN : 0, &p, &err) < 0) {
		if (err.code == ECANCELED && atomic_load(&f.gave_up))
			rc = 128 + atomic_load(&f.gave_up);
		else
			rc = fail(&err, NULL);
		goto out;
	}
	atomic_store(&f.proc, p);
	if (a->interactive) {
		if (a->tty && isatty(STDIN_FILENO) && tty_make_raw(STDIN_FILENO) < 0)
			fprintf(stderr, "sbx: cannot put the terminal in raw mode: %s\n", strerror(errno));
		if (pipe(f.stop_pipe) < 0 || (e = pthread_create(&f.in_thread, NULL, stdin_main, &f)) != 0) {
			fprintf(stderr, "sbx: cannot start the stdin thread: %s\n", strerror(errno));
			rc = EXIT_FAIL;
			goto out;
		}
		in_started = 1;
	}
	/* Output as it comes, each stream to its own descriptor, nothing buffered. */
	while ((n = sbx_proc_read(p, &chan, buf, IO_BUF, &err)) > 0) {
		if (werr)
			continue; /* read on, so that the command is not blocked by a dead stdout */
		werr = write_all(chan == SBX_STDERR ? STDERR_FILENO : STDOUT_FILENO, buf, (size_t)n);
		if (werr == EPIPE) {
			/* like a local pipeline: the writer dies of SIGPIPE */
			rc = 128 + SIGPIPE;
			goto out;
		}
		if (werr)
			fprintf(stderr, "sbx: write error: %s\n", strerror(werr));
	}
	if (n == 0 && sbx_proc_wait(p, &ex, &err) == 0) {
		rc = werr ? EXIT_FAIL : exit_status_of(&ex);
	} else if (err.code == ECANCELED && atomic_load(&f.gave_up)) {
		rc = 128 + atomic_load(&f.gave_up);
	} else {
		tty_restore();
		rc = fail(&err, NULL);
	}
	if (rc != EXIT_FAIL && (e = atomic_load(&f.in_err)) != 0) {
		tty_restore();
		fprintf(stderr, "sbx: reading stdin: %s\n", strerror(e));
	}
out:
	if (in_started) {
		if (write(f.stop_pipe[1], "x", 1) < 0) {
			/* cannot happen with an empty pipe */
		}
		/* a write waiting for the command to take more stdin gives up too (the
		 * command has ended, or is being killed for an error on our side) */
		sbx_cancel_fire(f.tok);
		pthread_join(f.in_thread, NULL);
	}
	if (f.stop_pipe[0] >= 0) {
		close(f.stop_pipe[0]);
		close(f.stop_pipe[1]);
	}
	if (sig_started) {
		/* wake the thread with a signal of its own set; stop tells it to return */
		atomic_store(&f.stop, 1);
		pthread_kill(f.sig_thread, SIGTERM);
		pthread_join(f.sig_thread, NULL);
	}
	tty_restore();
	/* a command still running (an error on our side) is killed with its group */
	sbx_proc_free(p);
	sbx_cancel_free(f.tok);
	free(buf);
	return rc;
}

static int run_exec(struct ctx *ctx, int argc, char **argv, int shell)
{
	struct sbx_process_info info = SBX_PROCESS_INFO_INIT;
	struct exec_args a;
	struct sbx_client *c = NULL;
	struct sbx_error err;
	int rc;

	if ((rc = parse_exec_args(ctx, argc, argv, shell, &a)) != EXIT_OK) {
		if (rc < 0)
			rc = EXIT_OK;
		goto out;
	}
	if (a.tty) {
		a.eo.pty = 1;
		term_size(&a.eo.rows, &a.eo.cols);
	}
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		goto out;
	if (a.detach) {
		if (sbx_spawn(c, NULL, &a.eo, &info, &err) < 0) {
			rc = fail(&err, NULL);
		} else if (ctx->json) {
			fputs("{\"id\":", stdout);
			json_str(info.id);
			printf(",\"pid\":%u}\n", info.pid);
		} else {
			printf("%s\n", info.id);
		}
	} else {
		rc = run_foreground(ctx, &a, c);
	}
	sbx_client_close(c);
out:
	exec_args_free(&a);
	return rc;
}

int cmd_exec(struct ctx *ctx, int argc, char **argv)
{
	return run_exec(ctx, argc, argv, 0);
}

int cmd_sh(struct ctx *ctx, int argc, char **argv)
{
	return run_exec(ctx, argc, argv, 1);
}

/* ---- eval ---- */

int cmd_eval(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"interp", required_argument, NULL, 'I'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char **interp = NULL;
	struct sbx_output out = {0};
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char *words = NULL, *tok, *save;
	size_t n = 0;
	int opt, rc;

	while ((opt = cli_getopt(ctx, argc, argv, "+:h", longopts)) != -1) {
		if (opt != 'I') {
			rc = other_option(ctx, argv, opt);
			goto out;
		}
		free(words);
		free(interp);
		interp = NULL;
		n = 0;
		if (!(words = strdup(optarg)) || !(interp = calloc(strlen(optarg) / 2 + 2, sizeof(*interp)))) {
			fprintf(stderr, "sbx: out of memory\n");
			rc = EXIT_FAIL;
			goto out;
		}
		for (tok = strtok_r(words, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
			interp[n++] = tok;
		if (n == 0) {
			rc = usage_error(ctx, "empty --interp");
			goto out;
		}
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		goto out;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		goto out;
	if (sbx_eval(c, NULL, interp, argv[optind], &out, &ex, &err) < 0 && err.kind != SBX_ERR_EXIT) {
		rc = fail(&err, NULL);
	} else {
		/* what the snippet printed, as it printed it; its status is ours */
		if (write_all(STDOUT_FILENO, out.out, out.out_len) != 0 ||
		    write_all(STDERR_FILENO, out.err, out.err_len) != 0)
			rc = EXIT_FAIL;
		if (ex.stdout_truncated || ex.stderr_truncated)
			fprintf(stderr, "sbx: eval: output truncated\n");
		if (rc == EXIT_OK)
			rc = exit_status_of(&ex);
	}
	sbx_client_close(c);
out:
	sbx_output_free(&out);
	free(words);
	free(interp);
	return rc;
}

/* ---- ps ---- */

struct ps_list {
	struct sbx_process_info *v;
	size_t n, cap;
};

static int ps_collect(void *ud, const struct sbx_process_info *pi)
{
	struct ps_list *l = ud;
	struct sbx_process_info *nv;

	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 32;
		if (!(nv = realloc(l->v, l->cap * sizeof(*nv))))
			return ENOMEM;
		l->v = nv;
	}
	l->v[l->n++] = *pi;
	return 0;
}

static const char *exit_column(const struct sbx_process_info *pi, char *buf, size_t size)
{
	if (pi->running)
		return "-";
	if (pi->timed_out)
		return "timeout";
	if (pi->signal > 0)
		return signal_name(pi->signal, buf, size);
	snprintf(buf, size, "%d", pi->exit_code);
	return buf;
}

static void ps_json(const struct ps_list *l)
{
	const struct sbx_process_info *pi;
	char tbuf[64];
	size_t i;

	putchar('[');
	for (i = 0; i < l->n; i++) {
		pi = &l->v[i];
		fputs(i ? ",{\"id\":" : "{\"id\":", stdout);
		json_str(pi->id);
		printf(",\"pid\":%u,\"state\":\"%s\",\"detached\":%s,\"pty\":%s,\"started_at\":\"%s\","
		       "\"started_at_sec\":%" PRId64 ",\"started_at_nsec\":%" PRIu32 ",\"command\":",
		       pi->pid, pi->running ? "running" : "exited", pi->detached ? "true" : "false",
		       pi->pty ? "true" : "false", fmt_utc(&pi->started_at, tbuf, sizeof(tbuf)), pi->started_at.sec,
		       pi->started_at.nsec);
		json_str(pi->argv);
		if (pi->running) {
			fputs(",\"exit\":null}", stdout);
			continue;
		}
		printf(",\"exit\":{\"status\":%d,\"exit_code\":%d,\"signal\":%d,\"core_dumped\":%s,"
		       "\"timed_out\":%s,\"duration_ns\":%" PRIu64 "}}",
		       pi->signal > 0 ? 128 + pi->signal : pi->exit_code, pi->exit_code, pi->signal,
		       pi->core_dumped ? "true" : "false", pi->timed_out ? "true" : "false", pi->duration_ns);
	}
	fputs("]\n", stdout);
}

static void ps_table(const struct ps_list *l)
{
	const struct sbx_process_info *pi;
	char tbuf[64], ebuf[32];
	int wid = 2, wpid = 3, w;
	size_t i;

	for (i = 0; i < l->n; i++) {
		if ((w = (int)strlen(l->v[i].id)) > wid)
			wid = w;
		if ((w = snprintf(NULL, 0, "%u", l->v[i].pid)) > wpid)
			wpid = w;
	}
	printf("%-*s %*s %-7s %-7s %-20s %s\n", wid, "ID", wpid, "PID", "STATE", "EXIT", "STARTED", "COMMAND");
	for (i = 0; i < l->n; i++) {
		pi = &l->v[i];
		printf("%-*s %*u %-7s %-7s %-20s ", wid, pi->id, wpid, pi->pid, pi->running ? "running" : "exited",
		       exit_column(pi, ebuf, sizeof(ebuf)), fmt_utc(&pi->started_at, tbuf, sizeof(tbuf)));
		put_cmdline(pi->argv);
		putchar('\n');
	}
}

int cmd_ps(struct ctx *ctx, int argc, char **argv)
{
	struct ps_list l = {0};
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = no_more_args(ctx, argc, argv)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_ps(c, NULL, ps_collect, &l, &err) < 0)
		rc = fail(&err, NULL);
	else if (ctx->json)
		ps_json(&l);
	else
		ps_table(&l);
	sbx_client_close(c);
	free(l.v);
	return rc;
}

/* ---- logs, kill, wait, rmproc ---- */

int cmd_logs(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"follow", no_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	/* following runs until the process ends: --timeout is for connecting only */
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 0};
	struct sbx_client *c;
	struct sbx_proc *p;
	struct sbx_error err;
	int opt, rc, flags = 0, chan, werr;
	char *buf;
	long n;

	while ((opt = cli_getopt(ctx, argc, argv, ":fh", longopts)) != -1) {
		if (opt != 'f')
			return other_option(ctx, argv, opt);
		flags |= SBX_ATTACH_FOLLOW;
		opts.timeout_ms = -1;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if (!(buf = malloc(IO_BUF))) {
		fprintf(stderr, "sbx: out of memory\n");
		return EXIT_FAIL;
	}
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK) {
		free(buf);
		return rc;
	}
	if (sbx_attach(c, &opts, argv[optind], flags, &p, &err) < 0) {
		rc = fail(&err, NULL);
	} else {
		while ((n = sbx_proc_read(p, &chan, buf, IO_BUF, &err)) > 0) {
			if ((werr = write_all(chan == SBX_STDERR ? STDERR_FILENO : STDOUT_FILENO, buf, (size_t)n))) {
				if (werr != EPIPE)
					fprintf(stderr, "sbx: write error: %s\n", strerror(werr));
				rc = EXIT_FAIL;
				break;
			}
		}
		if (n < 0)
			rc = fail(&err, NULL);
		/* detaches: the process goes on */
		sbx_proc_free(p);
	}
	sbx_client_close(c);
	free(buf);
	return rc;
}

int cmd_kill(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"signal", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc, sig = SIGTERM;

	while ((opt = cli_getopt(ctx, argc, argv, ":s:h", longopts)) != -1) {
		if (opt != 's')
			return other_option(ctx, argv, opt);
		if (parse_signal(optarg, &sig) < 0)
			return usage_error(ctx, "bad signal '%s': want a name (TERM, SIGKILL...) or 1..%d", optarg,
					   SIG_MAX);
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_kill(c, NULL, argv[optind], sig, &err) < 0)
		rc = fail(&err, NULL);
	sbx_client_close(c);
	return rc;
}

int cmd_wait(struct ctx *ctx, int argc, char **argv)
{
	struct sbx_client *c;
	struct sbx_error err;
	struct sbx_exit ex = SBX_EXIT_INIT;
	int opt, rc;

	if ((opt = cli_getopt(ctx, argc, argv, ":h", help_only_opts)) != -1)
		return other_option(ctx, argv, opt);
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_wait(c, NULL, argv[optind], &ex, &err) < 0)
		rc = fail(&err, NULL);
	else
		rc = exit_status_of(&ex);
	sbx_client_close(c);
	return rc;
}

int cmd_rmproc(struct ctx *ctx, int argc, char **argv)
{
	static const struct option longopts[] = {
		{"kill", no_argument, NULL, 'k'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sbx_client *c;
	struct sbx_error err;
	int opt, rc, kill_first = 0;

	while ((opt = cli_getopt(ctx, argc, argv, ":kh", longopts)) != -1) {
		if (opt != 'k')
			return other_option(ctx, argv, opt);
		kill_first = 1;
	}
	if ((rc = want_operands(ctx, argc, argv, 1)) != EXIT_OK)
		return rc;
	if ((rc = open_client(ctx, 0, &c)) != EXIT_OK)
		return rc;
	if (sbx_rmproc(c, NULL, argv[optind], kill_first, &err) < 0)
		rc = fail(&err, NULL);
	sbx_client_close(c);
	return rc;
}
