/* main.c: sandbox-shim's entry point: options, listeners, the event loop. */
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "fs.h"
#include "fsctx.h"
#include "init.h"
#include "journal.h"
#include "listen.h"
#include "log.h"
#include "mount.h"
#include "mangen.h"
#include "server.h"
#include "spawn.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: sandbox-shim [--stdio] [--listen ADDR]... [options] [-- CMD [ARG]...]\n"
		   "\n"
		   "Serves shim protocol v1 inside a sandbox. With -- CMD it also supervises CMD as\n"
		   "its workload, as an init does: every signal passed on, the terminal handed over,\n"
		   "orphans reaped, and the daemon exits with CMD's status when it ends (128+N for\n"
		   "signal N; 127 not found, 126 not executable). Transports are optional then.\n"
		   "\n"
		   "transports:\n"
		   "  --stdio                  one client on stdin/stdout; exit when it closes\n"
		   "  --listen unix:PATH       unix socket, created 0600\n"
		   "  --listen tcp:HOST:PORT   TCP (needs --token-file or --insecure-no-token)\n"
		   "  --listen vsock:CID:PORT  AF_VSOCK; CID -1 listens on any CID\n"
		   "  --listen-optional ADDR   like --listen, but skipped (logged) where the transport\n"
		   "                           is absent: vsock without /dev/vsock or AF_VSOCK\n"
		   "\n"
		   "security:\n"
		   "  --token-file FILE        clients must present this token (tcp, unix, vsock); FILE\n"
		   "                           must be ours (or root's) and 0600 or 0400\n"
		   "  --insecure-no-token      allow tcp without a token\n"
		   "  --socket-mode OCTAL      mode of unix sockets (default 0600)\n"
		   "  --socket-group GROUP     group of unix sockets (name or number)\n"
		   "  --allow-uid UID          admit only unix peers with this uid (repeatable)\n"
		   "\n"
		   "limits:\n"
		   "  --max-connections N      clients past HELLO, every listener together (default 1024;\n"
		   "                           lowered to what RLIMIT_NOFILE allows, 8 fds per connection,\n"
		   "                           the soft limit first raised to the hard); one more is\n"
		   "                           refused at its HELLO with EAGAIN\n"
		   "  --max-pending N          connections per TCP or vsock listener that have not\n"
		   "                           completed HELLO (default 32; a unix socket's peers passed\n"
		   "                           its mode: as many as --max-connections); one more is\n"
		   "                           refused at accept with EAGAIN\n"
		   "  --max-streams N          streams in flight per connection (default 256)\n"
		   "  --max-frame BYTES        largest frame payload (default 1048576)\n"
		   "  --workers N              worker threads kept ready (default 1; grows to 64 when\n"
		   "                           jobs wait behind blocked ones)\n"
		   "  --max-buffer BYTES       bytes buffered for all clients together (output, read-ahead,\n"
		   "                           archive buffers; default 67108864); streams over it wait\n"
		   "  --max-jobs N             backups and restores running at once, each on a thread of\n"
		   "                           its own (default 16); the next ones wait queued\n"
		   "  --max-watches N          inotify watches of one recursive watch (default 8192; a\n"
		   "                           request may ask for fewer); reached: OVERFLOW, no more added\n"
		   "  --max-watches-total N    inotify watches of every watch together (default 65536)\n"
		   "  --keepalive SECONDS      ping silent clients after this long; 0 = off (default 60)\n"
		   "  --handshake-timeout SECONDS  a client's HELLO must be accepted within this time\n"
		   "                           of its connect; 0 = no limit (default 10)\n"
		   "  --shutdown-timeout SECONDS  time to finish work on SIGTERM (default 10)\n"
		   "  --kill-grace SECONDS     shutdown: SIGTERM to every child, SIGKILL after this (default 5);\n"
		   "                           a workload is waited for as long as it takes, the grace is\n"
		   "                           for what it leaves and for commands\n"
		   "\n"
		   "files:\n"
		   "  --root DIR               every file path resolves beneath DIR (symlinks and ..\n"
		   "                           cannot leave it)\n"
		   "  --fs-user USER[:GROUP]   file operations that name no user act as USER (name or\n"
		   "                           number; its groups, GROUP as the primary one): its fsuid,\n"
		   "                           so the kernel's permission checks apply; a request's\n"
		   "                           user overrides it (default: the shim's own identity)\n"
		   "  --state-dir DIR          private state: pending-writes journal, mount configs and\n"
		   "                           caches; made 0700, must be ours and not in a socket's\n"
		   "                           directory (default /run/sandbox-shim-state as root, else\n"
		   "                           $XDG_RUNTIME_DIR/sandbox-shim or /tmp/sandbox-shim-UID; a\n"
		   "                           default taken by another user: a unique one beside it)\n"
		   "\n"
		   "logging and information:\n"
		   "  --log-level LEVEL        error, warn, info (default) or debug; as PID 1 with a\n"
		   "                           workload the default is warn (its stderr is the workload's)\n"
		   "  --log-file FILE          the log goes to FILE (appended) instead of stderr\n"
		   "  --version, --help        print the version, or this help, and exit\n"
		   "\n"
		   "environment (for platforms that set a container's environment, not its command):\n"
		   "  SANDBOX_SHIM_LISTEN      more listen addresses, as --listen, separated by commas\n"
		   "                           or spaces (e.g. tcp:0.0.0.0:7070); ignored with --stdio\n"
		   "  SANDBOX_SHIM_TOKEN_FILE  the --token-file when none is given (read only when\n"
		   "                           there is a listener)\n");
}

enum {
	OPT_STDIO = 256,
	OPT_LISTEN,
	OPT_TOKEN_FILE,
	OPT_INSECURE,
	OPT_SOCKET_MODE,
	OPT_SOCKET_GROUP,
	OPT_ALLOW_UID,
	OPT_MAX_CONN,
	OPT_MAX_STREAMS,
	OPT_MAX_FRAME,
	OPT_WORKERS,
	OPT_KEEPALIVE,
	OPT_SHUTDOWN_TIMEOUT,
	OPT_LOG_LEVEL,
	OPT_VERSION,
	OPT_ROOT,
	OPT_FS_USER,
	OPT_STATE_DIR,
	OPT_KILL_GRACE,
	OPT_LISTEN_OPTIONAL,
	OPT_LOG_FILE,
	OPT_HANDSHAKE_TIMEOUT,
	OPT_MAX_BUFFER,
	OPT_MAX_PENDING,
	OPT_MAX_JOBS,
	OPT_MAX_WATCHES,
	OPT_MAX_WATCHES_TOTAL,
};

static const struct option options[] = {
	{"stdio", no_argument, NULL, OPT_STDIO},
	{"listen", required_argument, NULL, OPT_LISTEN},
	{"listen-optional", required_argument, NULL, OPT_LISTEN_OPTIONAL},
	{"token-file", required_argument, NULL, OPT_TOKEN_FILE},
	{"insecure-no-token", no_argument, NULL, OPT_INSECURE},
	{"socket-mode", required_argument, NULL, OPT_SOCKET_MODE},
	{"socket-group", required_argument, NULL, OPT_SOCKET_GROUP},
	{"allow-uid", required_argument, NULL, OPT_ALLOW_UID},
	{"max-connections", required_argument, NULL, OPT_MAX_CONN},
	{"max-pending", required_argument, NULL, OPT_MAX_PENDING},
	{"max-streams", required_argument, NULL, OPT_MAX_STREAMS},
	{"max-frame", required_argument, NULL, OPT_MAX_FRAME},
	{"workers", required_argument, NULL, OPT_WORKERS},
	{"max-buffer", required_argument, NULL, OPT_MAX_BUFFER},
	{"max-jobs", required_argument, NULL, OPT_MAX_JOBS},
	{"max-watches", required_argument, NULL, OPT_MAX_WATCHES},
	{"max-watches-total", required_argument, NULL, OPT_MAX_WATCHES_TOTAL},
	{"keepalive", required_argument, NULL, OPT_KEEPALIVE},
	{"handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT},
	{"shutdown-timeout", required_argument, NULL, OPT_SHUTDOWN_TIMEOUT},
	{"kill-grace", required_argument, NULL, OPT_KILL_GRACE},
	{"log-level", required_argument, NULL, OPT_LOG_LEVEL},
	{"log-file", required_argument, NULL, OPT_LOG_FILE},
	{"root", required_argument, NULL, OPT_ROOT},
	{"fs-user", required_argument, NULL, OPT_FS_USER},
	{"state-dir", required_argument, NULL, OPT_STATE_DIR},
	{"version", no_argument, NULL, OPT_VERSION},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "sandbox-shim: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'sandbox-shim --help'.\n");
	exit(2);
}

static unsigned long parse_num(const char *arg, const char *what, unsigned long min, unsigned long max)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(arg, &end, 10);
	if (errno != 0 || *end != '\0' || arg[0] == '\0' || arg[0] == '-' || v < min || v > max) {
		fprintf(stderr, "sandbox-shim: bad %s '%s' (want %lu..%lu)\n", what, arg, min, max);
		exit(2);
	}
	return v;
}

static double parse_seconds(const char *arg, const char *what)
{
	char *end;
	double v = strtod(arg, &end);
	if (*end != '\0' || arg[0] == '\0' || !(v >= 0) || v > 86400 * 365)
		die_usage("bad %s '%s' (want seconds)", what, arg);
	return v;
}

/* The environment's options: container platforms let you set a container's environment,
 * not its entrypoint's flags. */
#define ENV_LISTEN "SANDBOX_SHIM_LISTEN"
#define ENV_TOKEN_FILE "SANDBOX_SHIM_TOKEN_FILE"

/* SANDBOX_SHIM_LISTEN's copy, split in place: listens[] point into it (static, so that it
 * is still reachable at any exit) */
static char *env_listen_copy;

/* Read the token: the whole file, trailing whitespace removed. origin is "" or the name of
 * the variable that gave path, for the errors. Start-up only. */
static int read_token(const char *path, const char *origin, struct server_config *cfg)
{
	const char *sep = origin[0] != '\0' ? ": " : "";
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "sandbox-shim: %s%s%s: %s\n", origin, sep, path, strerror(errno));
		return -1;
	}
	/* as ssh checks a key: a regular file of ours (or root's) that no one else may read
	 * or write, since whoever reads it is let in */
	struct stat st = {0};
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) ||
	    (st.st_mode & 077) != 0) {
		fprintf(stderr,
			"sandbox-shim: %s%s%s: the token file must be a regular file owned by uid %u%s and not "
			"accessible to group or others (it is %s, owner uid %u, mode %04o): chmod 600 it\n",
			origin, sep, path, (unsigned)geteuid(), geteuid() == 0 ? "" : " or root",
			S_ISREG(st.st_mode) ? "a file" : "not a regular file", (unsigned)st.st_uid,
			(unsigned)(st.st_mode & 07777));
		close(fd);
		return -1;
	}
	char buf[4096];
	ssize_t n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 0) {
		fprintf(stderr, "sandbox-shim: %s%s%s: %s\n", origin, sep, path, strerror(errno));
		return -1;
	}
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	if (n == 0 || n == (ssize_t)sizeof(buf)) {
		explicit_bzero(buf, sizeof(buf));
		fprintf(stderr, "sandbox-shim: %s%s%s: the token must be 1 to 4095 bytes\n", origin, sep, path);
		return -1;
	}
	cfg->token = malloc((size_t)n + 1);
	if (cfg->token == NULL)
		return -1;
	memcpy(cfg->token, buf, (size_t)n);
	cfg->token[n] = '\0';
	cfg->token_len = (size_t)n;
	explicit_bzero(buf, sizeof(buf));
	return 0;
}

/* The soft RLIMIT_NOFILE up to the hard one: PID 1 starts with 1024 of 4096 (the
 * kernel's), and every connection and request costs fds. Commands and the workload
 * get back the limit the shim was given (spawn_start_limits). Start-up only. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rlim_t was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
		log_warn("cannot raise RLIMIT_NOFILE from %llu to %llu: %s", (unsigned long long)was,
			 (unsigned long long)rl.rlim_max, strerror(errno));
		return;
	}
	log_debug("RLIMIT_NOFILE raised from %llu to %llu", (unsigned long long)was, (unsigned long long)rl.rlim_max);
}

/* dir is (made if absent) a directory of ours, mode 0700; else why not into why. */
static int state_dir_make(const char *dir, char *why, size_t size)
{
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(why, size, "%s", strerror(errno));
		return -1;
	}
	int cleanup_close fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		snprintf(why, size, "%s", errno == ELOOP ? "a symlink" : strerror(errno));
		return -1;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
		/* someone else's, or open to others: credentials and journals go here */
		snprintf(why, size, "owner uid %u, mode %04o; must be a directory of ours with mode 0700",
			 (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}

/* The private state directory (0700, ours: the pending-writes journal, mount configs
 * and caches), created if needed. A non-root shim whose default is taken (another
 * user made it first in a shared /tmp) makes a private one with a unique name beside
 * it instead. Start-up only. */
static void state_dir_default(struct server_config *cfg)
{
	if (cfg->state_dir[0] == '\0') {
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		if (geteuid() == 0)
			snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", SHIM_STATE_DIR_ROOT);
		else if (xdg != NULL && xdg[0] == '/' && strlen(xdg) < sizeof(cfg->state_dir) - 32)
			snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s/sandbox-shim", xdg);
		else
			snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/tmp/sandbox-shim-%u", (unsigned)geteuid());
	}
}

static int state_dir_init(struct server_config *cfg, bool dflt)
{
	char why[160];
	if (state_dir_make(cfg->state_dir, why, sizeof(why)) == 0)
		return 0;
	if (!dflt || geteuid() == 0) {
		fprintf(stderr, "sandbox-shim: state dir %s: %s\n", cfg->state_dir, why);
		return -1;
	}
	char tmpl[sizeof(cfg->state_dir) + 8];
	snprintf(tmpl, sizeof(tmpl), "%.*s.XXXXXX", (int)sizeof(cfg->state_dir) - 8, cfg->state_dir);
	char why2[160];
	if (mkdtemp(tmpl) == NULL) {
		fprintf(stderr, "sandbox-shim: state dir %s: %s; and %s: %s\n", cfg->state_dir, why, tmpl,
			strerror(errno));
		return -1;
	}
	if (state_dir_make(tmpl, why2, sizeof(why2)) < 0) {
		fprintf(stderr, "sandbox-shim: state dir %s: %s; and %s: %s\n", cfg->state_dir, why, tmpl, why2);
		return -1;
	}
	log_warn("state dir %s is not ours (%s): using %s instead", cfg->state_dir, why, tmpl);
	snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%.*s", (int)sizeof(cfg->state_dir) - 1, tmpl);
	return 0;
}

/* The state must never sit in a unix socket's directory that is someone else's or that
 * others can write: that one is meant to be shared with the host (a bind mount of a
 * host user's directory), whose owner could swap the state dir for one of theirs and
 * receive the credentials. (A socket directory of the shim's own user that no one else
 * can write, as a test's, may hold it.) Start-up only. */
static int state_dir_apart(const struct server_config *cfg, const char *const *listens, unsigned n)
{
	/* the path as it would resolve (it may not exist yet) */
	char state[PATH_MAX], parent[PATH_MAX];
	if (realpath(cfg->state_dir, state) == NULL) {
		snprintf(parent, sizeof(parent), "%s", cfg->state_dir);
		char *sl = strrchr(parent, '/');
		if (sl == NULL || sl == parent)
			return 0;
		*sl = '\0';
		char rp[PATH_MAX];
		if (realpath(parent, rp) == NULL)
			return 0;
		if ((size_t)snprintf(state, sizeof(state), "%s/%s", rp, sl + 1) >= sizeof(state))
			return 0;
	}
	for (unsigned i = 0; i < n; i++) {
		if (strncmp(listens[i], "unix:", 5) != 0)
			continue;
		char dir[PATH_MAX], real[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s", listens[i] + 5);
		char *slash = strrchr(dir, '/');
		if (slash == NULL)
			continue;
		*(slash == dir ? slash + 1 : slash) = '\0';
		struct stat st;
		if (realpath(dir, real) == NULL || stat(real, &st) < 0 ||
		    (st.st_uid == geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0))
			continue;
		size_t len = strlen(real);
		if (strcmp(real, "/") == 0 ||
		    (strncmp(state, real, len) == 0 && (state[len] == '\0' || state[len] == '/'))) {
			fprintf(stderr,
				"sandbox-shim: state dir %s is in the directory of the socket %s (%s, owner uid %u, "
				"mode %04o), which is shared: give --state-dir elsewhere\n",
				cfg->state_dir, listens[i] + 5, real, (unsigned)st.st_uid,
				(unsigned)(st.st_mode & 07777));
			return -1;
		}
	}
	return 0;
}

/* --listen-optional: false (and logged) when ADDR's transport is absent here. vsock
 * needs /dev/vsock: container runtimes leave it out unless they provide vsock (in a
 * plain container AF_VSOCK would be the host's, shared by every container). */
static bool listen_available(const char *spec)
{
	if (strncmp(spec, "vsock:", 6) == 0 && access("/dev/vsock", F_OK) < 0) {
		log_info("not listening on %s: no /dev/vsock here", spec);
		return false;
	}
	return true;
}

/* SANDBOX_SHIM_LISTEN: its addresses after the command line's listens[0..n) (one already
 * there is listened on once). Returns the new count. Start-up only. */
static unsigned env_listens(const char **listens, bool *optional, bool *from_env, unsigned n)
{
	const char *v = getenv(ENV_LISTEN);
	if (v == NULL)
		return n;
	env_listen_copy = strdup(v);
	if (env_listen_copy == NULL) {
		fprintf(stderr, "sandbox-shim: out of memory\n");
		exit(1);
	}
	static const char seps[] = ", \t\r\n";
	char *save = NULL;
	for (char *a = strtok_r(env_listen_copy, seps, &save); a != NULL; a = strtok_r(NULL, seps, &save)) {
		unsigned i = 0;
		while (i < n && strcmp(listens[i], a) != 0)
			i++;
		if (i < n) {
			log_info(ENV_LISTEN ": %s is given twice: listening on it once", a);
			optional[i] = false;
			continue;
		}
		if (n >= SHIM_MAX_LISTENERS)
			die_usage(ENV_LISTEN ": too many listen addresses (at most %d, --listen's included)",
				  SHIM_MAX_LISTENERS);
		optional[n] = false;
		from_env[n] = true;
		listens[n++] = a;
	}
	return n;
}

/* What the command line says beyond the server's config, and what start-up derives from it. */
struct start_opts {
	const char *listens[SHIM_MAX_LISTENERS];
	bool listen_optional[SHIM_MAX_LISTENERS];
	bool listen_from_env[SHIM_MAX_LISTENERS];
	unsigned n_listens;
	bool use_stdio;
	const char *token_file;
	const char *log_file;
	const char *fs_user;
	bool log_level_given;
	bool max_conn_given;
	bool max_pending_given;
	char **workload; /* argv after "--", or NULL */
};

/* The command line into cfg and o. Returns -1 to go on, or the exit status (--version,
 * --help, an unknown option). A bad value ends the process (die_usage). */
static int parse_options(int argc, char **argv, struct server_config *cfg, struct start_opts *o)
{
	int opt;
	/* '+': options end at the first non-option, so a workload's own options after
	 * "--" are never taken for ours (and "CMD" without "--" is an error) */
	while ((opt = getopt_long(argc, argv, "+h", options, NULL)) != -1) {
		switch (opt) {
		case OPT_STDIO:
			o->use_stdio = true;
			break;
		case OPT_LISTEN:
		case OPT_LISTEN_OPTIONAL:
			if (o->n_listens >= SHIM_MAX_LISTENERS)
				die_usage("too many --listen (at most 16)");
			o->listen_optional[o->n_listens] = opt == OPT_LISTEN_OPTIONAL;
			o->listens[o->n_listens++] = optarg;
			break;
		case OPT_TOKEN_FILE:
			o->token_file = optarg;
			break;
		case OPT_INSECURE:
			cfg->insecure_no_token = true;
			break;
		case OPT_SOCKET_MODE: {
			char *end;
			long m = strtol(optarg, &end, 8);
			if (*end != '\0' || optarg[0] == '\0' || m < 0 || m > 0777)
				die_usage("bad --socket-mode '%s' (want octal, e.g. 0660)", optarg);
			cfg->socket_mode = (mode_t)m;
			break;
		}
		case OPT_SOCKET_GROUP: {
			struct group *g = getgrnam(optarg);
			if (g != NULL)
				cfg->socket_gid = g->gr_gid;
			else
				cfg->socket_gid = (gid_t)parse_num(optarg, "--socket-group", 0, 0xfffffffe);
			break;
		}
		case OPT_ALLOW_UID:
			if (cfg->n_allow_uids >= SHIM_MAX_ALLOW_UIDS)
				die_usage("too many --allow-uid (at most 16)");
			cfg->allow_uids[cfg->n_allow_uids++] = (uid_t)parse_num(optarg, "--allow-uid", 0, 0xfffffffe);
			break;
		case OPT_MAX_CONN:
			cfg->max_connections = (unsigned)parse_num(optarg, "--max-connections", 1, 1000000);
			o->max_conn_given = true;
			break;
		case OPT_MAX_PENDING:
			cfg->max_pending = (unsigned)parse_num(optarg, "--max-pending", 1, 1000000);
			o->max_pending_given = true;
			break;
		case OPT_MAX_STREAMS:
			cfg->max_streams = (unsigned)parse_num(optarg, "--max-streams", 1, 1000000);
			break;
		case OPT_MAX_FRAME:
			cfg->max_frame = (uint32_t)parse_num(optarg, "--max-frame", FRAME_MIN_MAX, FRAME_ABS_MAX);
			break;
		case OPT_WORKERS:
			cfg->workers = (unsigned)parse_num(optarg, "--workers", 1, 256);
			if (cfg->max_workers < cfg->workers)
				cfg->max_workers = cfg->workers;
			break;
		case OPT_MAX_BUFFER:
			cfg->max_buffer = parse_num(optarg, "--max-buffer", BUDGET_MIN, 1ul << 40);
			break;
		case OPT_MAX_WATCHES:
			cfg->max_watches = (unsigned)parse_num(optarg, "--max-watches", 1, 1u << 24);
			break;
		case OPT_MAX_WATCHES_TOTAL:
			cfg->max_watches_total = (unsigned)parse_num(optarg, "--max-watches-total", 1, 1u << 24);
			break;
		case OPT_MAX_JOBS:
			cfg->max_jobs = (unsigned)parse_num(optarg, "--max-jobs", 1, 1024);
			break;
		case OPT_KEEPALIVE:
			cfg->keepalive = parse_seconds(optarg, "--keepalive");
			break;
		case OPT_HANDSHAKE_TIMEOUT:
			cfg->handshake_timeout = parse_seconds(optarg, "--handshake-timeout");
			break;
		case OPT_SHUTDOWN_TIMEOUT:
			cfg->shutdown_timeout = parse_seconds(optarg, "--shutdown-timeout");
			break;
		case OPT_KILL_GRACE:
			cfg->kill_grace = parse_seconds(optarg, "--kill-grace");
			break;
		case OPT_LOG_LEVEL: {
			int l = log_parse_level(optarg);
			if (l < 0)
				die_usage("bad --log-level '%s' (want error, warn, info or debug)", optarg);
			log_max_level = (enum log_level)l;
			o->log_level_given = true;
			break;
		}
		case OPT_LOG_FILE:
			o->log_file = optarg;
			break;
		case OPT_FS_USER:
			if (o->fs_user != NULL)
				die_usage("--fs-user given twice ('%s', then '%s')", o->fs_user, optarg);
			o->fs_user = optarg;
			break;
		case OPT_ROOT:
			cfg->root = optarg;
			break;
		case OPT_STATE_DIR:
			if (optarg[0] != '/' || strlen(optarg) >= sizeof(cfg->state_dir))
				die_usage("bad --state-dir '%s' (want an absolute path)", optarg);
			snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s", optarg);
			break;
		case OPT_VERSION:
			printf("sandbox-shim %s (shim protocol %u)\n", SHIM_VERSION, SHIM_PROTOCOL_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	return -1;
}

/* The process's protection and its log, first of all. 0, or the exit status. */
static int start_process_log(int argc, char **argv, const struct start_opts *o)
{
	/* the token and mount keys live in this process: no ptrace or /proc/PID/mem by
	 * its own uid (a command that dropped to it, say), and no core dump (commands get
	 * the RLIMIT_CORE back: spawn.c) */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		log_warn("cannot make the shim non-dumpable: %s", strerror(errno));
	if (o->log_file != NULL && log_open_file(o->log_file) < 0) {
		fprintf(stderr, "sandbox-shim: --log-file %s: %s\n", o->log_file, strerror(errno));
		return 1;
	}
	/* PID 1 with a workload: the container's stderr (and terminal) are the workload's,
	 * so the shim's own lines there are warnings and errors only, unless asked */
	if (!o->log_level_given && o->log_file == NULL && getpid() == 1 && optind > 1 && optind < argc &&
	    strcmp(argv[optind - 1], "--") == 0)
		log_max_level = LOG_WARN;
	return 0;
}

/* What to serve: the listeners (the command line's, then the environment's) and the
 * workload after "--". Nothing to serve is a usage error (die_usage). */
static void choose_what_to_serve(int argc, char **argv, struct start_opts *o)
{
	/* a --stdio shim serves its one client: `podman exec -i CTR sandbox-shim --stdio` gets
	 * the container's environment too, and must not listen where PID 1 already does */
	if (!o->use_stdio)
		o->n_listens = env_listens(o->listens, o->listen_optional, o->listen_from_env, o->n_listens);
	else if (getenv(ENV_LISTEN) != NULL)
		log_debug("--stdio: " ENV_LISTEN " is not used");
	if (optind > 1 && strcmp(argv[optind - 1], "--") == 0) {
		/* "--" with nothing after it is no workload, so an image's ENTRYPOINT can
		 * end in "--" and leave the workload to an optional CMD */
		if (optind == argc && !o->use_stdio && o->n_listens == 0)
			die_usage("nothing after '--': give the workload's command");
		if (optind < argc)
			o->workload = &argv[optind];
	} else if (optind < argc) {
		die_usage("unexpected argument '%s' (a workload goes after '--')", argv[optind]);
	}
	if (o->workload != NULL)
		init_hold_signals();
	if (!o->use_stdio && o->n_listens == 0 && o->workload == NULL)
		die_usage("nothing to serve: give --stdio or --listen ADDR (or a workload after '--')");
}

/* The token (--token-file, or the environment's) into cfg, and the tcp-needs-a-token
 * rule for the environment's addresses. 0, or the exit status. */
static int load_token(struct server_config *cfg, struct start_opts *o)
{
	/* the environment's token file, where a listener may need it (--stdio never does) */
	const char *token_origin = "";
	const char *env_token_file = getenv(ENV_TOKEN_FILE);
	if (env_token_file != NULL && env_token_file[0] != '\0' && o->n_listens > 0) {
		if (o->token_file == NULL) {
			o->token_file = env_token_file;
			token_origin = ENV_TOKEN_FILE;
			log_debug("token from %s (" ENV_TOKEN_FILE ")", o->token_file);
		} else if (strcmp(o->token_file, env_token_file) != 0) {
			log_info("token from --token-file %s; " ENV_TOKEN_FILE " (%s) is not used", o->token_file,
				 env_token_file);
		}
	}
	if (o->token_file != NULL && read_token(o->token_file, token_origin, cfg) < 0)
		return 1;
	/* the tcp-needs-a-token rule, said in the environment's terms for its addresses */
	for (unsigned i = 0; i < o->n_listens; i++) {
		if (o->listen_from_env[i] && strncmp(o->listens[i], "tcp:", 4) == 0 && cfg->token == NULL &&
		    !cfg->insecure_no_token) {
			fprintf(stderr,
				"sandbox-shim: " ENV_LISTEN
				": cannot listen on %s: a tcp listener needs a token: set " ENV_TOKEN_FILE
				" (or give --token-file; --insecure-no-token accepts anyone)\n",
				o->listens[i]);
			return 1;
		}
	}
	return 0;
}

/* The files the daemon works in: the --fs-user default, --root, the state dir, the
 * pending-writes journal, and a crashed daemon's mount files swept. 0, or the exit status. */
static int prepare_files(struct server_config *cfg, const struct start_opts *o)
{
	struct shim_err serr;
	/* the user database once, now: an unknown user is a bad option, not a request's error */
	if (o->fs_user != NULL && fs_ctx_set_default(o->fs_user, &serr) < 0)
		die_usage("--fs-user %s: %s", o->fs_user, serr.msg);
	if (fs_init(cfg->root, &serr) < 0) {
		fprintf(stderr, "sandbox-shim: --root %s: %s: %s\n", cfg->root, serr.msg, strerror(serr.code));
		return 1;
	}
	bool state_dflt = cfg->state_dir[0] == '\0';
	state_dir_default(cfg);
	if (state_dir_apart(cfg, o->listens, o->n_listens) < 0 || state_dir_init(cfg, state_dflt) < 0)
		return 1;
	log_debug("state dir %s", cfg->state_dir);
	if (journal_init(cfg->state_dir) < 0)
		return 1;
	/* a crashed daemon's mounts left their rclone configs (with the keys) here */
	unsigned swept = mount_sweep(cfg->state_dir);
	if (swept > 0)
		log_warn("removed the files of %u mount%s left by a daemon that is gone", swept, swept == 1 ? "" : "s");
	return 0;
}

/* The event loop, the server on it, and the PID-1 set-up. NULL when one fails (the
 * server freed). */
static struct ev_loop *start_server(struct server *s)
{
	struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO | EVFLAG_NOENV);
	if (loop == NULL) {
		fprintf(stderr, "sandbox-shim: cannot start the event loop\n");
		return NULL;
	}
	if (server_init(s, loop) < 0)
		return NULL;
	struct shim_err ierr;
	if (init_setup(s, &ierr) < 0) {
		fprintf(stderr, "sandbox-shim: %s: %s\n", ierr.msg, strerror(ierr.code));
		server_free(s);
		return NULL;
	}
	return loop;
}

/* Listen on every address (an optional one that cannot be had is skipped), then --stdio's
 * channel. 0, or -1 (the server freed). */
static int start_transports(struct server *s, const struct start_opts *o)
{
	unsigned n_listening = 0;
	for (unsigned i = 0; i < o->n_listens; i++) {
		struct shim_err err;
		if (o->listen_optional[i] && !listen_available(o->listens[i]))
			continue;
		struct listener *l = listener_open(s, o->listens[i], &err);
		if (l == NULL && o->listen_optional[i] && err.code == EAFNOSUPPORT) {
			log_info("not listening on %s: %s: %s", o->listens[i], err.msg, strerror(err.code));
			continue;
		}
		if (l == NULL) {
			fprintf(stderr, "sandbox-shim: %scannot listen on %s: %s: %s\n",
				o->listen_from_env[i] ? ENV_LISTEN ": " : "", o->listens[i], err.msg,
				strerror(err.code));
			server_free(s);
			return -1;
		}
		server_add_listener(s, l);
		n_listening++;
	}
	if (n_listening == 0 && !o->use_stdio && o->workload == NULL) {
		fprintf(stderr, "sandbox-shim: nothing to serve here: every --listen-optional was skipped\n");
		server_free(s);
		return -1;
	}
	if (o->use_stdio) {
		struct shim_err err;
		if (tr_stdio_start(s, &err) < 0) {
			fprintf(stderr, "sandbox-shim: --stdio: %s: %s\n", err.msg, strerror(err.code));
			server_free(s);
			return -1;
		}
	}
	return 0;
}

/* Start the workload, if any. 0, or the exit status (the server freed). */
static int start_workload(struct server *s, char **workload)
{
	if (workload == NULL)
		return 0;
	struct shim_err ierr;
	/* after the transports: with --stdio the channel has left fds 0 and 1 */
	int rc = init_start_workload(s, workload, &ierr);
	if (rc != 0) {
		fprintf(stderr, "sandbox-shim: %s: %s\n", ierr.msg, strerror(ierr.code));
		server_free(s);
		return rc < 0 ? 1 : rc;
	}
	return 0;
}

/* No core dumps of the shim (the soft limit only, so a command can have it back). */
static void drop_core_limit(void)
{
	struct rlimit core;
	if (getrlimit(RLIMIT_CORE, &core) == 0 && core.rlim_cur != 0) {
		core.rlim_cur = 0;
		if (setrlimit(RLIMIT_CORE, &core) < 0)
			log_warn("cannot set RLIMIT_CORE to 0: %s", strerror(errno));
	}
}

/* Serve until shutdown, then clean up. Returns the exit status. */
static int run(struct server *s, struct ev_loop *loop, const struct start_opts *o)
{
	/* what is open now is the daemon's own: the rest of the fds are the connections' */
	listen_fd_budget(s, o->max_conn_given, o->max_pending_given);
	log_info("sandbox-shim %s ready (pid %d%s)", SHIM_VERSION, (int)s->pid, s->pid1 ? ", PID 1" : "");
	ev_run(loop, 0);
	/* every child is gone now: unmount what was mounted, and such */
	init_shutdown_hooks();
	server_free(s);
	free(env_listen_copy);
	env_listen_copy = NULL;
	log_info("exit");
	return s->exit_code;
}

int main(int argc, char **argv)
{
	static struct server s;
	static struct start_opts o;
	server_config_defaults(&s.cfg);

	/* hidden: sandbox-shim(8) and its checks, made from usage() and options[] */
	if (argc >= 2 &&
	    (!strcmp(argv[1], "--dump-man") || !strcmp(argv[1], "--check-docs") || !strcmp(argv[1], "--list-options")))
		return mangen_daemon(argc, argv, usage, options, SHIM_VERSION);
	int rc = parse_options(argc, argv, &s.cfg, &o);
	if (rc >= 0)
		return rc;
	if ((rc = start_process_log(argc, argv, &o)) != 0)
		return rc;
	choose_what_to_serve(argc, argv, &o);
	if ((rc = load_token(&s.cfg, &o)) != 0)
		return rc;
	spawn_startup(); /* before raise_nofile(): commands get the limits the shim started with */
	raise_nofile();
	if ((rc = prepare_files(&s.cfg, &o)) != 0)
		return rc;

	struct ev_loop *loop = start_server(&s);
	if (loop == NULL)
		return 1;
	if (start_transports(&s, &o) < 0)
		return 1;
	if ((rc = start_workload(&s, o.workload)) != 0)
		return rc;
	/* after the workload started (it keeps the limit the shim was given) */
	drop_core_limit();
	return run(&s, loop, &o);
}
