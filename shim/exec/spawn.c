/* spawn.c: starting a command: argv, environment, cwd, pipes or pty built on a worker, and
 * fork/exec there right after (the loop adopts the pid when the job is done).
 *
 * The rule from crun and tini: the child allocates nothing and calls only
 * async-signal-safe functions. Everything it needs (argv, envp, the program path,
 * the cwd fd, the pipes, the policy with its compiled BPF) exists before fork();
 * a failure in the child is reported as {stage, errno} through a CLOEXEC pipe,
 * then _exit(127). The parent learns "exec succeeded" from that pipe's EOF.
 * A vfork child (below) writes the record into the plan instead, in the memory
 * it shares with us: clone() returns only once it has exec'd or exited, so the
 * answer is there when it does, without a pipe or a wait for its EOF.
 *
 * fork or vfork. fork() copies the shim's page tables and makes every page
 * copy-on-write for both sides until the child execs: measured here, it made the
 * /bin/true round trip about 2.1x a bare posix_spawn+waitpid (1.2-1.5x without).
 * So, like posix_spawn(), the child is made with clone(CLONE_VM|CLONE_VFORK) on a
 * stack of its own when that is safe:
 *  - the child shares our memory while it runs, so it may only make syscalls
 *    through thin wrappers. glibc's setresuid/setresgid/setgroups are not thin:
 *    they signal every thread of the (shared-memory) process to change its ids
 *    too. policy_apply_child() calls them only for a user or a group (and
 *    otherwise only setrlimit, setpriority, open/write, prctl and capset), so a
 *    request with either gets fork(). Signal handlers are not shared (no
 *    CLONE_SIGHAND), so resetting them in the child is safe; errno is (the forking
 *    thread's TLS), so it is saved around clone();
 *  - the worker thread that forks is suspended until the child has exec'd, and
 *    execve() opens and reads the program (and a "#!" interpreter) before it lets
 *    the parent go: a program on a network or FUSE filesystem that hangs would hold
 *    that worker for good. The prepare checks that the program is an ELF file (no
 *    "#!" interpreter to look up) on a local filesystem (a fixed list of types);
 *    anything else gets fork();
 *  - on an overloaded machine the child may wait for a CPU before it gets to
 *    execve(), and the forking thread waits with it (measured when the loop forked:
 *    5-25 ms at a load of 4 per core, where a burst of execs in one loop iteration
 *    then added up past 100 ms). When vfork gets slow, fork() takes over for
 *    VFORK_BACKOFF_NS: fork() costs a fixed ~0.2 ms, never a wait on the child.
 *    "Slow" is a moving average (1/8 per spawn) above VFORK_SLOW_NS, not one slow
 *    spawn: on a machine with a load of about 1 per core, one vfork in a few hundred
 *    takes over 2 ms, and switching on each of those kept fork() on most of the time
 *    (measured: the /bin/true round trip 1.8-2.0x a bare posix_spawn+waitpid
 *    instead of 1.35-1.45x). A single vfork of 8 x VFORK_SLOW_NS still switches
 *    at once, a run of 5 ms ones after two or three.
 *
 * The fork happens on the worker, right after the prepare: handing the plan back to
 * the loop to fork there cost a wake-up of the loop per command and held the loop
 * while the child got to execve(). The loop adopts the pid when the job is done; the
 * child may have exited and been reaped by then, which reaper_watch_since() covers. */
#include "spawn.h"
#include "fs.h"
#include "log.h"
#include "policy.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char **environ;

static const char default_path[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
static const char user_path[] = "PATH=/usr/local/bin:/usr/bin:/bin"; /* login.defs' ENV_PATH */

void spawn_plan_init(struct spawn_plan *pl)
{
	memset(pl, 0, sizeof(*pl));
	pl->cwd_fd = -1;
	for (int i = 0; i < 3; i++)
		pl->child_fd[i] = -1;
	pl->in_fd = pl->out_fd = pl->err_fd = -1;
	pl->errp_r = pl->errp_w = -1;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void free_vec(char **v, size_t n)
{
	if (v == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void spawn_plan_free(struct spawn_plan *pl)
{
	free_vec(pl->argv, pl->argc);
	free_vec(pl->envp, pl->envc);
	free(pl->path);
	free(pl->cwd);
	pl->argv = pl->envp = NULL;
	pl->path = pl->cwd = NULL;
	if (pl->pol != NULL)
		policy_free(pl->pol);
	pl->pol = NULL;
	close_fd(&pl->cwd_fd);
	/* a pty slave is the same fd three times */
	if (pl->child_fd[1] == pl->child_fd[0])
		pl->child_fd[1] = -1;
	if (pl->child_fd[2] == pl->child_fd[0])
		pl->child_fd[2] = -1;
	for (int i = 0; i < 3; i++)
		close_fd(&pl->child_fd[i]);
	close_fd(&pl->in_fd);
	close_fd(&pl->out_fd);
	close_fd(&pl->err_fd);
	close_fd(&pl->errp_r);
	close_fd(&pl->errp_w);
}

/* A copy of b as a C string; EINVAL (naming what) if it holds a NUL byte. */
static char *cstr(const ProtobufCBinaryData *b, const char *what, struct shim_err *err)
{
	if (memchr(b->data, '\0', b->len) != NULL) {
		err_setn(err, EINVAL, b->data, b->len, "%s holds a NUL byte", what);
		return NULL;
	}
	char *s = malloc(b->len + 1);
	if (s == NULL) {
		err_set(err, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	memcpy(s, b->data, b->len);
	s[b->len] = '\0';
	return s;
}

static int build_argv(const Shim__V1__ExecRequest *req, struct spawn_plan *pl, struct shim_err *err)
{
	if (req->n_argv > 0 && req->has_shell)
		return err_set(err, EINVAL, NULL, "give argv or shell, not both");
	if (req->n_argv == 0 && !req->has_shell)
		return err_set(err, EINVAL, NULL, "no command: argv and shell are both empty");
	size_t n = req->has_shell ? 3 : req->n_argv;
	pl->argv = calloc(n + 1, sizeof(char *));
	if (pl->argv == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (req->has_shell) {
		pl->argv[0] = strdup("/bin/sh");
		pl->argv[1] = strdup("-c");
		pl->argc = 2;
		if (pl->argv[0] == NULL || pl->argv[1] == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
		if ((pl->argv[2] = cstr(&req->shell, "shell", err)) == NULL)
			return -1;
		pl->argc = 3;
		return 0;
	}
	if (req->argv[0].len == 0)
		return err_set(err, EINVAL, NULL, "argv[0] is empty");
	for (size_t i = 0; i < n; i++) {
		if ((pl->argv[i] = cstr(&req->argv[i], "argv", err)) == NULL)
			return -1;
		pl->argc = i + 1;
	}
	return 0;
}

static size_t key_len(const char *kv)
{
	const char *eq = strchr(kv, '=');
	return eq ? (size_t)(eq - kv) : strlen(kv);
}

/* Index of the entry with kv's key in v, or n. */
static size_t env_find(char **v, size_t n, const char *kv, size_t klen)
{
	for (size_t i = 0; i < n; i++)
		if (strncmp(v[i], kv, klen) == 0 && v[i][klen] == '=')
			return i;
	return n;
}

/* Set kv (owned by the caller until it is placed) in the vector, replacing the same key. */
static int env_put(struct spawn_plan *pl, size_t cap, char *kv, bool replace)
{
	size_t k = key_len(kv);
	size_t i = env_find(pl->envp, pl->envc, kv, k);
	if (i < pl->envc) {
		if (!replace) {
			free(kv);
			return 0;
		}
		free(pl->envp[i]);
		pl->envp[i] = kv;
		return 0;
	}
	if (pl->envc + 1 >= cap) {
		free(kv);
		errno = ENOMEM;
		return -1;
	}
	pl->envp[pl->envc++] = kv;
	pl->envp[pl->envc] = NULL;
	return 0;
}

static char *join_kv(const char *k, const char *v)
{
	size_t kl = strlen(k), vl = strlen(v);
	char *s = malloc(kl + vl + 2);
	if (s != NULL) {
		memcpy(s, k, kl);
		s[kl] = '=';
		memcpy(s + kl + 1, v, vl + 1);
	}
	return s;
}

/* ---- the shim's start: its own variables out, its limits saved ---- */

struct spawn_start_limits spawn_start_limits;

/* The shim's own variables: the SDK's (SBX_TOKEN, SBX_TARGET, ...) and its own
 * configuration (SANDBOX_SHIM_LISTEN, SANDBOX_SHIM_TOKEN_FILE, ...). */
static bool shim_var(const char *kv)
{
	return strncmp(kv, "SBX_", 4) == 0 || strncmp(kv, "SANDBOX_SHIM_", 13) == 0;
}

void spawn_startup(void)
{
	spawn_start_limits.have_nofile = getrlimit(RLIMIT_NOFILE, &spawn_start_limits.nofile) == 0;
	spawn_start_limits.have_core = getrlimit(RLIMIT_CORE, &spawn_start_limits.core) == 0;
	/* unsetenv() shifts the array: look again from the start after each */
	for (bool again = true; again;) {
		again = false;
		for (size_t i = 0; environ != NULL && environ[i] != NULL; i++) {
			if (!shim_var(environ[i]))
				continue;
			char name[256];
			size_t k = key_len(environ[i]);
			if (k == 0 || k >= sizeof(name)) {
				environ[i][0] = '\0'; /* no name to unset by: make it no variable at all */
				continue;
			}
			memcpy(name, environ[i], k);
			name[k] = '\0';
			unsetenv(name);
			again = true;
			break;
		}
	}
	policy_startup();
}

/* ---- the environment ---- */

/* Does a variable's name look like it holds a credential? Commands of another user
 * do not get these from the shim's environment (a request may still pass any). */
static bool secret_name(const char *kv)
{
	char up[256];
	size_t k = key_len(kv);
	if (k >= sizeof(up))
		return true; /* no image sets such names for its users */
	for (size_t i = 0; i < k; i++)
		up[i] = (char)(kv[i] >= 'a' && kv[i] <= 'z' ? kv[i] - 32 : kv[i]);
	up[k] = '\0';
	static const char *const parts[] = {"TOKEN",  "SECRET",  "PASSWORD",   "PASSWD",    "CREDENTIAL", "PRIVATE",
					    "APIKEY", "API_KEY", "ACCESS_KEY", "ACCESSKEY", "SESSION",    "COOKIE"};
	for (size_t i = 0; i < ARRAY_SIZE(parts); i++)
		if (strstr(up, parts[i]) != NULL)
			return true;
	static const char *const prefixes[] = {"AWS_", "AZURE_", "GCP_", "GOOGLE_", "VAULT_"};
	for (size_t i = 0; i < ARRAY_SIZE(prefixes); i++)
		if (strncmp(up, prefixes[i], strlen(prefixes[i])) == 0)
			return true;
	/* a word of the name: KEY, KEYS, PASS, PW, AUTH (FOO_KEY, KEY_FILE, NPM_AUTH, ...) */
	static const char *const words[] = {"KEY", "KEYS", "PASS", "PW", "AUTH"};
	char *save = NULL;
	for (char *w = strtok_r(up, "_", &save); w != NULL; w = strtok_r(NULL, "_", &save))
		for (size_t i = 0; i < ARRAY_SIZE(words); i++)
			if (strcmp(w, words[i]) == 0)
				return true;
	return false;
}

/* Variables of the shim's own session that are not another user's: that user's
 * values come from the user database, or nothing. */
static bool own_session_var(const char *kv)
{
	static const char *const names[] = {"HOME",      "USER",     "LOGNAME",  "SHELL",
					    "MAIL",      "PWD",      "OLDPWD",   "XDG_RUNTIME_DIR",
					    "SUDO_USER", "SUDO_UID", "SUDO_GID", "SUDO_COMMAND"};
	size_t k = key_len(kv);
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (strlen(names[i]) == k && strncmp(kv, names[i], k) == 0)
			return true;
	return false;
}

/* The shim's environment as its commands get it, made at the first command (nothing
 * changes environ after spawn_startup(); not at start, whose every touched page of text
 * the idle daemon keeps resident): pointers into environ, in its order, without the empty
 * entries and the shim's own; a key given twice at its first place with its last value,
 * as env_put() would make it. "other" (a command of another user) also without what
 * looks like a credential and without the shim's session (secret_name, own_session_var).
 * Per command that was an O(n^2) search through the shim's variables and a filter of each. */
struct env_base {
	const char **v; /* NULL until made */
	size_t n;
};
static struct env_base env_same, env_other;
static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;

static int env_base_make(struct env_base *b, bool other)
{
	size_t n = 0;
	while (environ != NULL && environ[n] != NULL)
		n++;
	const char **v = calloc(n + 1, sizeof(*v));
	if (v == NULL)
		return -1;
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		const char *kv = environ[i];
		if (kv[0] == '\0' || shim_var(kv) || (other && (secret_name(kv) || own_session_var(kv))))
			continue;
		size_t j = env_find((char **)v, m, kv, key_len(kv));
		if (j < m)
			v[j] = kv;
		else
			v[m++] = kv;
	}
	b->n = m;
	b->v = v;
	return 0;
}

/* The base for a command of the shim's user or (other) another's; NULL: out of memory
 * (made again at the next command). Set once, never changed after. */
static const struct env_base *env_base(bool other)
{
	struct env_base *b = other ? &env_other : &env_same;
	pthread_mutex_lock(&env_mu);
	int rc = b->v != NULL ? 0 : env_base_make(b, other);
	pthread_mutex_unlock(&env_mu);
	return rc == 0 ? b : NULL;
}

static bool req_gives(const Shim__V1__ExecRequest *req, const char *key)
{
	size_t k = strlen(key);
	for (size_t i = 0; i < req->n_env; i++) {
		const ProtobufCBinaryData *b = &req->env[i];
		if (b->len > k && memcmp(b->data, key, k) == 0 && b->data[k] == '=')
			return true;
	}
	return false;
}

/* The command's environment, in this order (a later step replaces an earlier one's
 * variable unless said otherwise):
 *  1. the base: nothing with clear_env; else, for a command of the shim's own uid,
 *     the shim's environment (the image's ENV as the shim received it, less the
 *     shim's own variables, removed at start); for another user, the same without
 *     names that look like credentials (secret_name) and without the shim's session
 *     variables (own_session_var);
 *  2. the request's env entries;
 *  3. PATH, when none is set yet: login's for the uid (root: with the sbin
 *     directories; others /usr/local/bin:/usr/bin:/bin);
 *  4. for a user in the user database: HOME, USER, LOGNAME and SHELL from it (login
 *     shell /bin/sh when the entry has none), unless the request gave them. */
static int build_env(const Shim__V1__ExecRequest *req, struct spawn_plan *pl, struct shim_err *err)
{
	if (req->n_env > SPAWN_MAX_ENV)
		return err_set(err, EINVAL, NULL, "%zu environment entries (limit %d)", req->n_env, SPAWN_MAX_ENV);
	for (size_t i = 0; i < req->n_env; i++) {
		const ProtobufCBinaryData *b = &req->env[i];
		const uint8_t *eq = memchr(b->data, '=', b->len);
		if (eq == NULL || eq == b->data)
			return err_setn(err, EINVAL, b->data, b->len, "environment entry is not K=V");
	}
	bool other = policy_uid(pl->pol) != geteuid();
	const struct env_base *eb = NULL;
	if (!req->clear_env && (eb = env_base(other)) == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	size_t base = eb != NULL ? eb->n : 0;
	size_t cap = base + req->n_env + 8;
	pl->envp = calloc(cap, sizeof(char *));
	if (pl->envp == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	/* filtered and of distinct keys already: nothing to look up */
	for (; pl->envc < base; pl->envc++)
		if ((pl->envp[pl->envc] = strdup(eb->v[pl->envc])) == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < req->n_env; i++) {
		char *s = cstr(&req->env[i], "environment entry", err);
		if (s == NULL)
			return -1;
		if (env_put(pl, cap, s, true) < 0)
			return err_set(err, ENOMEM, NULL, "out of memory");
	}
	/* sane defaults, never overriding what was given: login's PATH for the user */
	char *s = strdup(policy_uid(pl->pol) == 0 ? default_path : user_path);
	if (s == NULL || env_put(pl, cap, s, false) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	const char *home = policy_home(pl->pol), *user = policy_user(pl->pol);
	if (user == NULL)
		return 0;
	/* a user in the database was asked for: its login variables, not the shim's */
	char shell[PATH_MAX] = "/bin/sh";
	struct passwd pw, *pwp = NULL;
	char buf[4096];
	if (getpwuid_r(policy_uid(pl->pol), &pw, buf, sizeof(buf), &pwp) == 0 && pwp != NULL && pw.pw_shell != NULL &&
	    pw.pw_shell[0] != '\0')
		snprintf(shell, sizeof(shell), "%s", pw.pw_shell);
	const char *vals[][2] = {{"HOME", home}, {"USER", user}, {"LOGNAME", user}, {"SHELL", shell}};
	for (size_t i = 0; i < ARRAY_SIZE(vals); i++) {
		if (vals[i][1] == NULL || req_gives(req, vals[i][0]))
			continue;
		if ((s = join_kv(vals[i][0], vals[i][1])) == NULL || env_put(pl, cap, s, true) < 0)
			return err_set(err, ENOMEM, NULL, "out of memory");
	}
	return 0;
}

static const char *env_get(const struct spawn_plan *pl, const char *key)
{
	size_t k = strlen(key);
	for (size_t i = 0; i < pl->envc; i++)
		if (strncmp(pl->envp[i], key, k) == 0 && pl->envp[i][k] == '=')
			return pl->envp[i] + k + 1;
	return NULL;
}

/* execvp()'s search, done here (it stat()s: a worker's job) with the command's own
 * PATH: the first regular file with an execute bit wins. Relative PATH entries
 * ("" is ".") are relative to the command's cwd. */
static int path_search(struct spawn_plan *pl, struct shim_err *err)
{
	const char *name = pl->argv[0];
	if (strchr(name, '/') != NULL) {
		/* used as given; execve() in the child reports ENOENT or EACCES */
		pl->path = strdup(name);
		return pl->path ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
	}
	size_t nlen = strlen(name);
	if (nlen > NAME_MAX)
		return err_set(err, ENAMETOOLONG, name, "program name longer than %d bytes", NAME_MAX);
	const char *path = env_get(pl, "PATH");
	if (path == NULL)
		path = default_path + 5;
	bool seen_noexec = false;
	char cand[PATH_MAX];
	for (const char *p = path;; p++) {
		const char *end = strchr(p, ':');
		size_t dlen = end ? (size_t)(end - p) : strlen(p);
		if (dlen == 0) {
			snprintf(cand, sizeof(cand), "./%s", name);
		} else if (dlen + 1 + nlen < sizeof(cand)) {
			memcpy(cand, p, dlen);
			cand[dlen] = '/';
			memcpy(cand + dlen + 1, name, nlen + 1);
		} else {
			cand[0] = '\0';
		}
		struct stat st;
		if (cand[0] != '\0' && fstatat(cand[0] == '/' ? AT_FDCWD : pl->cwd_fd, cand, &st, 0) == 0 &&
		    S_ISREG(st.st_mode)) {
			if (st.st_mode & 0111) {
				pl->path = strdup(cand);
				return pl->path ? 0 : err_set(err, ENOMEM, NULL, "out of memory");
			}
			seen_noexec = true;
		}
		if (end == NULL)
			break;
		p = end;
	}
	if (seen_noexec)
		return err_set(err, EACCES, name, "found in PATH but not executable");
	return err_set(err, ENOENT, name, "not found in PATH");
}

/* For an fd just made here (a pipe end, the pty master): none of F_SETFL's other
 * flags (O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME) is set, so no F_GETFL first. */
static int nonblock(int fd)
{
	return fcntl(fd, F_SETFL, O_NONBLOCK);
}

static int make_errpipe(struct spawn_plan *pl, struct shim_err *err)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return err_set(err, errno, NULL, "pipe2");
	pl->errp_r = p[0];
	pl->errp_w = p[1];
	if (nonblock(pl->errp_r) < 0)
		return err_set(err, errno, NULL, "fcntl(O_NONBLOCK)");
	return 0;
}

/* pipe2 with O_CLOEXEC; our end (ours: 0 read, 1 write) made non-blocking. The
 * child's end stays blocking: a command does not expect EAGAIN on its stdio. */
static int make_pipe(int *child, int *parent, int ours, struct shim_err *err)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return err_set(err, errno, NULL, "pipe2");
	*parent = p[ours];
	*child = p[1 - ours];
	if (nonblock(*parent) < 0)
		return err_set(err, errno, NULL, "fcntl(O_NONBLOCK)");
	return 0;
}

static int make_pty(const Shim__V1__ExecRequest *req, struct spawn_plan *pl, struct shim_err *err)
{
	int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (m < 0)
		return err_set(err, errno, "/dev/ptmx", "posix_openpt");
	pl->out_fd = m;
	if (grantpt(m) < 0 || unlockpt(m) < 0)
		return err_set(err, errno, "/dev/ptmx", "unlockpt");
	/* TIOCGPTPEER opens the slave from the master itself, no path lookup (4.13) */
	int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (s < 0) {
		char name[64];
		if (ptsname_r(m, name, sizeof(name)) != 0)
			return err_set(err, errno, NULL, "ptsname");
		s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (s < 0)
			return err_set(err, errno, name, "open");
	}
	pl->child_fd[0] = pl->child_fd[1] = pl->child_fd[2] = s;
	if (req->has_rows || req->has_cols) {
		struct winsize ws = {.ws_row = (unsigned short)req->rows, .ws_col = (unsigned short)req->cols};
		if (req->rows > 0xffff || req->cols > 0xffff)
			return err_set(err, EINVAL, NULL, "terminal size %ux%u out of range", req->rows, req->cols);
		if (ioctl(m, TIOCSWINSZ, &ws) < 0)
			return err_set(err, errno, NULL, "ioctl(TIOCSWINSZ)");
	}
	struct termios t;
	pl->veof = tcgetattr(s, &t) == 0 && t.c_cc[VEOF] != 0 ? t.c_cc[VEOF] : 4;
	/* stdin is written through a second fd, so that it has its own watcher */
	pl->in_fd = fcntl(m, F_DUPFD_CLOEXEC, 3);
	if (pl->in_fd < 0)
		return err_set(err, errno, NULL, "fcntl(F_DUPFD)");
	if (nonblock(m) < 0)
		return err_set(err, errno, NULL, "fcntl(O_NONBLOCK)");
	pl->pty = true;
	return 0;
}

/* Filesystems whose files exec() reads without waiting on a network or a FUSE
 * daemon: ext2-4, xfs, btrfs, tmpfs, ramfs, overlayfs, squashfs, erofs, f2fs. */
static bool local_fs(unsigned long type)
{
	static const unsigned long types[] = {0xEF53,     0x58465342, 0x9123683E, 0x01021994, 0x858458F6,
					      0x794C7630, 0x73717368, 0xE0F5E1E2, 0xF2F52010};
	for (size_t i = 0; i < ARRAY_SIZE(types); i++)
		if (type == types[i])
			return true;
	return false;
}

/* May the child be made with CLONE_VM|CLONE_VFORK? See the top of this file. */
static bool vfork_safe(const Shim__V1__ExecRequest *req, const struct spawn_plan *pl)
{
	if ((req->user != NULL && req->user[0] != '\0') || (req->group != NULL && req->group[0] != '\0'))
		return false;
	int fd = openat(pl->path[0] == '/' ? AT_FDCWD : pl->cwd_fd, pl->path,
			O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return false; /* execve() will say why, or manage without read access */
	struct stat st;
	struct statfs sf;
	unsigned char hdr[4];
	bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && fstatfs(fd, &sf) == 0 &&
		  local_fs((unsigned long)sf.f_type) && pread(fd, hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr) &&
		  memcmp(hdr, "\177ELF", 4) == 0;
	close(fd);
	return ok;
}

int spawn_prepare(const Shim__V1__ExecRequest *req, struct spawn_plan *pl, struct shim_err *err)
{
	if (build_argv(req, pl, err) < 0)
		return -1;
	/* the user first: HOME and USER come from it */
	if (policy_prepare(req, &pl->pol, err) < 0) {
		pl->pol = NULL;
		return -1;
	}
	if (build_env(req, pl, err) < 0)
		return -1;

	/* cwd: resolved beneath --root like every other path the client names */
	struct fs_path cwd;
	if (req->has_cwd) {
		if (fs_path_get(&req->cwd, &cwd, err) < 0)
			return -1;
	} else {
		strcpy(cwd.abs, "/");
		cwd.len = 1;
	}
	if ((pl->cwd = strdup(cwd.abs)) == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	pl->cwd_fd = fs_open(&cwd, O_PATH | O_DIRECTORY, 0, err);
	if (pl->cwd_fd < 0)
		return err_set(err, err->code, cwd.abs, "chdir");

	if (path_search(pl, err) < 0)
		return -1;
	pl->vfork = vfork_safe(req, pl);
	/* a vfork child reports a failure in our memory: no error pipe (spawn_fork
	 * makes one if it forks after all) */
	if (!pl->vfork && make_errpipe(pl, err) < 0)
		return -1;

	if (req->pty)
		return make_pty(req, pl, err);
	if (req->stdin) {
		if (make_pipe(&pl->child_fd[0], &pl->in_fd, 1, err) < 0)
			return -1;
	} else {
		pl->child_fd[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (pl->child_fd[0] < 0)
			return err_set(err, errno, "/dev/null", "open");
	}
	if (make_pipe(&pl->child_fd[1], &pl->out_fd, 0, err) < 0)
		return -1;
	return make_pipe(&pl->child_fd[2], &pl->err_fd, 0, err);
}

/* ---- the child: async-signal-safe calls only, nothing allocated ---- */

/* Under ASan the child's own code is left uninstrumented: in a CLONE_VM child on a
 * stack ASan does not know, its no-return bookkeeping would misfire. */
#ifdef __SANITIZE_ADDRESS__
#define CHILD_CODE __attribute__((no_sanitize_address))
#else
#define CHILD_CODE
#endif

CHILD_CODE static void copy_stage(char *dst, size_t size, const char *src)
{
	size_t i = 0;
	for (; src != NULL && src[i] != '\0' && i + 1 < size; i++)
		dst[i] = src[i];
	dst[i] = '\0';
}

/* fd -1 (a vfork child): into pl, which the parent reads once clone() returns */
CHILD_CODE __attribute__((noreturn)) static void child_fail(struct spawn_plan *pl, int fd, int e, int what,
							    const char *stage)
{
	struct spawn_failure *f = &pl->vfail, own;
	if (fd >= 0)
		f = &own;
	memset(f, 0, sizeof(*f));
	f->err = e;
	f->what = what;
	copy_stage(f->stage, sizeof(f->stage), stage);
	if (fd < 0) {
		pl->vfailed = true;
		_exit(127);
	}
	/* fewer than PIPE_BUF bytes: written whole or not at all */
	ssize_t w;
	do {
		w = write(fd, f, sizeof(*f));
	} while (w < 0 && errno == EINTR);
	_exit(127);
}

CHILD_CODE __attribute__((noreturn)) static void child_main(struct spawn_plan *pl)
{
	int efd = pl->errp_w;
	/* Dispositions back to default (an ignored SIGPIPE would survive exec and
	 * change how pipelines end), then the mask the parent blocked around fork.
	 * Signals sent to us meanwhile stay pending and act by default. */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, &dfl, NULL); /* glibc's internal signals fail: fine */
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/* its own session and process group: timeout, cancel and kill reach the group */
	if (setsid() < 0)
		child_fail(pl, efd, errno, SPAWN_WHAT_NONE, "setsid");
	if (pl->pty && ioctl(pl->child_fd[0], TIOCSCTTY, 0) < 0)
		child_fail(pl, efd, errno, SPAWN_WHAT_NONE, "ioctl(TIOCSCTTY)");

	/* Any fd we are about to place could itself be 0, 1 or 2 (the shim may run
	 * with those closed): lift them all above 2 first, then dup2 into place. */
	int src[3];
	if (efd >= 0 && efd < 3 && (efd = fcntl(efd, F_DUPFD_CLOEXEC, 3)) < 0)
		_exit(127);
	for (int i = 0; i < 3; i++) {
		src[i] = pl->child_fd[i];
		if (src[i] < 3 && (src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3)) < 0)
			child_fail(pl, efd, errno, SPAWN_WHAT_NONE, "fcntl(F_DUPFD)");
	}
	for (int i = 0; i < 3; i++)
		if (dup2(src[i], i) < 0) /* the new fd has no CLOEXEC */
			child_fail(pl, efd, errno, SPAWN_WHAT_NONE, "dup2");
	if (fchdir(pl->cwd_fd) < 0)
		child_fail(pl, efd, errno, SPAWN_WHAT_CWD, "chdir");
	/* the soft RLIMIT_NOFILE the shim started with, not the one it raised for itself
	 * (a request's rlimits come after and win) */
	if (spawn_start_limits.have_nofile)
		setrlimit(RLIMIT_NOFILE, &spawn_start_limits.nofile);
	/* and the RLIMIT_CORE it started with: the shim's own soft 0 is for itself */
	if (spawn_start_limits.have_core)
		setrlimit(RLIMIT_CORE, &spawn_start_limits.core);
	const char *stage = NULL;
	if (policy_apply_child(pl->pol, &stage) < 0)
		child_fail(pl, efd, errno, SPAWN_WHAT_NONE, stage ? stage : "policy");
	/* Whatever another thread opened without O_CLOEXEC must not leak into the
	 * command (5.11+; older kernels: every fd of ours is CLOEXEC anyway). */
	syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
	execve(pl->path, pl->argv, pl->envp);
	child_fail(pl, efd, errno, SPAWN_WHAT_PROGRAM, "execve");
}

CHILD_CODE static int child_entry(void *arg)
{
	child_main(arg);
}

/* The vfork children's stacks, each with a guard page below it: one per spawn in
 * progress (a worker waits while its child uses one), kept for the next. Bounded by
 * the number of workers. */
#define CHILD_STACK (256u << 10)
struct child_stack {
	struct child_stack *next;
};
static pthread_mutex_t stacks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct child_stack *stacks_free;

static char *stack_get(void)
{
	pthread_mutex_lock(&stacks_lock);
	struct child_stack *cs = stacks_free;
	if (cs != NULL)
		stacks_free = cs->next;
	pthread_mutex_unlock(&stacks_lock);
	if (cs != NULL)
		return (char *)cs;
	long page = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, CHILD_STACK + (size_t)page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	mprotect(m, (size_t)page, PROT_NONE);
	return m + page;
}

static void stack_put(char *stack)
{
	struct child_stack *cs = (struct child_stack *)stack;
	pthread_mutex_lock(&stacks_lock);
	cs->next = stacks_free;
	stacks_free = cs;
	pthread_mutex_unlock(&stacks_lock);
}

static pid_t clone_vfork(struct spawn_plan *pl)
{
	char *stack = stack_get();
	if (stack == NULL)
		return -1;
#ifdef __SANITIZE_ADDRESS__
	/* A child that exec'd never returned from its frames: their redzones are
	 * still poisoned in the (shared) shadow memory. */
	__asan_unpoison_memory_region(stack, CHILD_STACK);
#endif
	int saved = errno;
	pid_t pid = clone(child_entry, stack + CHILD_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, pl);
	if (pid >= 0)
		errno = saved; /* the child wrote to our errno */
	stack_put(stack);
	return pid;
}

#define VFORK_SLOW_NS 2000000u         /* 2 ms */
#define VFORK_BACKOFF_NS 1000000000ull /* 1 s */
/* shared by the workers; an update lost to a race only blurs the average */
static _Atomic uint64_t vfork_off_until;
static _Atomic uint64_t vfork_avg_ns; /* moving average of the vfork times, 1/8 per spawn */

pid_t spawn_fork(struct spawn_plan *pl, struct shim_err *err)
{
	bool use_vfork = pl->vfork && mono_ns() >= atomic_load_explicit(&vfork_off_until, memory_order_relaxed);
	if (!use_vfork && pl->errp_w < 0 && make_errpipe(pl, err) < 0)
		return -1;
	/* Block every signal around fork: the child must not run the shim's handlers
	 * (libev's would write to the loop's wakeup fd, and in a CLONE_VM child mark
	 * the signal pending in our memory) before it resets them. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t pid;
	if (use_vfork) {
		uint64_t t0 = mono_ns();
		pid = clone_vfork(pl);
		uint64_t t1 = mono_ns();
		uint64_t avg = atomic_load_explicit(&vfork_avg_ns, memory_order_relaxed);
		avg = avg - avg / 8 + (t1 - t0) / 8;
		if (avg > VFORK_SLOW_NS) {
			atomic_store_explicit(&vfork_off_until, t1 + VFORK_BACKOFF_NS, memory_order_relaxed);
			log_debug("vfork took %llu us (%llu us on average): fork() for a while",
				  (unsigned long long)(t1 - t0) / 1000, (unsigned long long)avg / 1000);
			avg = 0; /* a fresh start when vfork is tried again */
		}
		atomic_store_explicit(&vfork_avg_ns, avg, memory_order_relaxed);
	} else {
		pid = fork();
		if (pid == 0)
			child_main(pl);
	}
	int e = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pl->vfork = use_vfork; /* from now on: how it was made */
	if (pid < 0)
		return err_set(err, e, NULL, use_vfork ? "clone" : "fork");
	if (pl->child_fd[1] == pl->child_fd[0])
		pl->child_fd[1] = -1;
	if (pl->child_fd[2] == pl->child_fd[0])
		pl->child_fd[2] = -1;
	for (int i = 0; i < 3; i++)
		close_fd(&pl->child_fd[i]);
	close_fd(&pl->errp_w);
	close_fd(&pl->cwd_fd);
	return pid;
}

void spawn_failure_err(const struct spawn_failure *f, const char *path, const char *cwd, struct shim_err *err)
{
	char stage[sizeof(f->stage) + 1];
	memcpy(stage, f->stage, sizeof(f->stage));
	stage[sizeof(f->stage)] = '\0';
	const char *p = f->what == SPAWN_WHAT_CWD ? cwd : f->what == SPAWN_WHAT_PROGRAM ? path : NULL;
	int code = f->err > 0 ? f->err : EIO;
	err_set(err, code, p, "%s", stage[0] ? stage : "exec");
}
