/* it_exec_env.c: what a command inherits from the shim (issue 17.3, 17.7): no secrets, the
 * limits the shim started with, signals at their defaults, and a setsid()ing command tree
 * still ends on timeout, kill and cancel. */
#include "harness.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *sock;

/* The daemon under `env VARS... SHIM_BIN --listen unix:... ARGS...`. */
static struct it_daemon *env_daemon(const char *const vars[], const char *const args[])
{
	const char *argv[48];
	int n = 0;
	argv[n++] = "env";
	for (int i = 0; vars[i] != NULL; i++)
		argv[n++] = vars[i];
	argv[n++] = SHIM_BIN;
	sock = it_path("shim.sock");
	argv[n++] = "--listen";
	argv[n++] = it_unix_target(sock);
	argv[n++] = "--state-dir";
	argv[n++] = it_path("state");
	argv[n++] = "--log-level";
	argv[n++] = "debug";
	for (int i = 0; args[i] != NULL; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	CHECK(n < 48);
	return it_daemon_start_argv("shim", argv);
}

#define VARS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_ARGS ((const char *const[]){NULL})

static char *run_env(struct sbx_client *c, const char *user, const char *const *env, int clear)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"/usr/bin/env", NULL};
	eo.argv = argv;
	eo.user = user;
	eo.env = env;
	eo.clear_env = clear;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	memset(&out, 0, sizeof(out));
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECKF(ex.exit_code == 0, "env as %s: exit %d, stderr %.*s", user ? user : "(shim)", ex.exit_code,
	       (int)out.err_len, out.err ? out.err : "");
	char *s = malloc(out.out_len + 2);
	CHECK(s != NULL);
	s[0] = '\n'; /* every line starts after a '\n': "\nNAME=" finds a whole name */
	memcpy(s + 1, out.out, out.out_len);
	s[out.out_len + 1] = '\0';
	sbx_output_free(&out);
	return s;
}

/* The line NAME=VALUE is in env's output exactly. */
static void check_var(const char *env, const char *name, const char *value)
{
	char want[600];
	snprintf(want, sizeof(want), "\n%s=%s\n", name, value);
	CHECKF(strstr(env, want) != NULL, "want %s=%s in the command's environment:%s", name, value, env);
}

static void check_no_var(const char *env, const char *name)
{
	char want[300];
	snprintf(want, sizeof(want), "\n%s=", name);
	CHECKF(strstr(env, want) == NULL, "%s is in the command's environment:%s", name, env);
}

static void check_absent(const char *env, const char *secret)
{
	CHECKF(strstr(env, secret) == NULL, "the secret '%s' is in the command's environment:%s", secret, env);
}

/* A --user nobody command sees no secret the shim was given (its token by SBX_TOKEN,
 * its token file's name and content, SBX_*, a cloud key), gets nobody's login variables,
 * and the image's other variables; a root command sees the image's ENV but not SBX_*. */
static int case_secrets(void)
{
	struct passwd *pw = getpwnam("nobody");
	if (pw == NULL) {
		printf("no user nobody here\n");
		return IT_SKIP;
	}
	char nobody_home[256], nobody_shell[256];
	snprintf(nobody_home, sizeof(nobody_home), "%s", pw->pw_dir);
	snprintf(nobody_shell, sizeof(nobody_shell), "%s", pw->pw_shell[0] ? pw->pw_shell : "/bin/sh");
	it_write_file(it_path("token"), "file-secret-4\n");
	char tf[400];
	snprintf(tf, sizeof(tf), "SANDBOX_SHIM_TOKEN_FILE=%s", it_path("token"));
	const char *secrets[] = {"tok-secret-1",   "foo-secret-2", "aws-secret-3", "file-secret-4",
				 it_path("token"), "gh-secret-5",  "pw-secret-6",  "api-secret-7"};
	struct it_daemon *d =
		env_daemon(VARS("PATH=/image/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", "TERM=xterm-test",
				"SBX_TOKEN=tok-secret-1", "SBX_FOO=foo-secret-2", "AWS_SECRET_ACCESS_KEY=aws-secret-3",
				tf, "GITHUB_TOKEN=gh-secret-5", "DB_PASSWORD=pw-secret-6",
				"OPENAI_API_KEY=api-secret-7", "IMAGE_VAR=image-value", "PYTHONUNBUFFERED=1"),
			   NO_ARGS);
	struct sbx_client *c = it_connect(it_unix_target(sock), "file-secret-4");

	char *e = run_env(c, "nobody", NULL, 0);
	for (size_t i = 0; i < ARRAY_LEN(secrets); i++)
		check_absent(e, secrets[i]);
	check_no_var(e, "SBX_TOKEN");
	check_no_var(e, "SANDBOX_SHIM_TOKEN_FILE");
	check_var(e, "HOME", nobody_home);
	check_var(e, "USER", "nobody");
	check_var(e, "LOGNAME", "nobody");
	check_var(e, "SHELL", nobody_shell);
	check_var(e, "PATH", "/image/bin:/usr/bin:/bin"); /* the image's, for every user */
	check_var(e, "LANG", "C.UTF-8");
	check_var(e, "TERM", "xterm-test");
	check_var(e, "IMAGE_VAR", "image-value");
	check_var(e, "PYTHONUNBUFFERED", "1");
	printf("as nobody:%s", e);
	free(e);

	/* what the request asks for, it gets: a token it passes, HOME it sets */
	const char *given[] = {"MY_TOKEN=passed-by-request", "HOME=/tmp", NULL};
	e = run_env(c, "nobody", given, 0);
	check_var(e, "MY_TOKEN", "passed-by-request");
	check_var(e, "HOME", "/tmp");
	check_var(e, "USER", "nobody");
	check_absent(e, "aws-secret-3");
	free(e);
	/* clear_env: the request's and the login variables only */
	const char *one[] = {"ONLY=this", NULL};
	e = run_env(c, "nobody", one, 1);
	check_var(e, "ONLY", "this");
	check_var(e, "USER", "nobody");
	check_var(e, "PATH", "/usr/local/bin:/usr/bin:/bin");
	check_no_var(e, "IMAGE_VAR");
	free(e);

	/* the shim's own user: the image's whole ENV but the shim's own variables */
	e = run_env(c, NULL, NULL, 0);
	check_var(e, "IMAGE_VAR", "image-value");
	check_var(e, "AWS_SECRET_ACCESS_KEY", "aws-secret-3"); /* root's own: documented */
	check_var(e, "HOME", "/root");
	check_var(e, "PATH", "/image/bin:/usr/bin:/bin");
	check_absent(e, "tok-secret-1");
	check_absent(e, "foo-secret-2");
	check_no_var(e, "SBX_TOKEN");
	check_no_var(e, "SBX_FOO");
	check_no_var(e, "SANDBOX_SHIM_TOKEN_FILE");
	free(e);

	/* as PID 1 of the daemon: the environment it was started with is still readable by
	 * root, but the shim's own copy has the variables out (what commands inherit) */
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* How many lines of env's output set NAME. */
static int count_var(const char *env, const char *name)
{
	char want[300];
	snprintf(want, sizeof(want), "\n%s=", name);
	int n = 0;
	for (const char *p = strstr(env, want); p != NULL; p = strstr(p + 1, want))
		n++;
	return n;
}

/* A variable the shim was started with twice (execve allows it; env(1) or a shell would
 * not pass it so), an empty entry and one of the shim's own: a command gets the variable
 * once, with its last value, where it first stood; the empty entry and SBX_* not at all;
 * a request's value replaces it. For the shim's own user and for another. */
static int case_duplicates(void)
{
	static char *dup_env[] = {"PATH=/usr/bin:/bin",      "DUP=first", "MIDDLE=m", "DUP=second", "",
				  "SBX_HIDDEN=hidden-value", "LAST=l",    NULL};
	extern char **environ;
	sock = it_path("shim.sock");
	const char *argv[] = {SHIM_BIN, "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL};
	char **saved = environ;
	environ = dup_env; /* what the daemon is started with; ours again right after */
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	environ = saved;
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	const char *users[] = {NULL, getpwnam("nobody") != NULL ? "nobody" : NULL};
	for (size_t u = 0; u < ARRAY_LEN(users); u++) {
		if (u > 0 && users[u] == NULL) {
			printf("no user nobody here: the shim's own user only\n");
			break;
		}
		char *e = run_env(c, users[u], NULL, 0);
		CHECKF(count_var(e, "DUP") == 1, "as %s, DUP %d times:%s", users[u] ? users[u] : "the shim's user",
		       count_var(e, "DUP"), e);
		check_var(e, "DUP", "second");
		CHECKF(strstr(e, "\nDUP=") < strstr(e, "\nMIDDLE="), "DUP is not where it first stood:%s", e);
		check_var(e, "MIDDLE", "m");
		check_var(e, "LAST", "l");
		check_no_var(e, "SBX_HIDDEN");
		check_absent(e, "hidden-value");
		CHECKF(strstr(e, "\n\n") == NULL, "an empty entry in the command's environment:%s", e);
		free(e);
		const char *given[] = {"DUP=from-request", NULL};
		e = run_env(c, users[u], given, 0);
		CHECK(count_var(e, "DUP") == 1);
		check_var(e, "DUP", "from-request");
		free(e);
	}
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* No PATH in the daemon's environment: each user gets login's. */
static int case_default_path(void)
{
	if (getpwnam("nobody") == NULL)
		return IT_SKIP;
	const char *argv[] = {"env",         "-u",
			      "PATH",        SHIM_BIN,
			      "--listen",    it_unix_target(it_path("shim.sock")),
			      "--state-dir", it_path("state"),
			      NULL};
	sock = it_path("shim.sock");
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	char *e = run_env(c, "nobody", NULL, 0);
	check_var(e, "PATH", "/usr/local/bin:/usr/bin:/bin");
	free(e);
	e = run_env(c, NULL, NULL, 0);
	check_var(e, "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
	free(e);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

static char *run_sh(struct sbx_client *c, const char *cmd, const struct sbx_rlimit *rl, size_t nrl)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	eo.rlimits = rl;
	eo.n_rlimits = nrl;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	memset(&out, 0, sizeof(out));
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECKF(ex.exit_code == 0, "%s: exit %d", cmd, ex.exit_code);
	char *s = strndup(out.out ? out.out : "", out.out_len);
	sbx_output_free(&out);
	return s;
}

/* The soft RLIMIT_NOFILE of the daemon's own process ("Max open files" of /proc/PID/limits). */
static unsigned long long daemon_nofile(pid_t pid)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	CHECK(it_read_text(path, buf, sizeof(buf)) > 0);
	char *l = strstr(buf, "Max open files");
	CHECK(l != NULL);
	return strtoull(l + strlen("Max open files"), NULL, 10);
}

/* Commands get the soft nofile limit the shim started with, not the one it raised. */
static int case_nofile(void)
{
	if (access("/usr/bin/prlimit", X_OK) < 0)
		return IT_SKIP;
	sock = it_path("shim.sock");
	const char *argv[] = {"prlimit",     "--nofile=512:4096", "--", SHIM_BIN, "--listen", it_unix_target(sock),
			      "--state-dir", it_path("state"),    NULL};
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	CHECK_EQ(daemon_nofile(d->pid), 4096); /* raised for itself */
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	char *s = run_sh(c, "ulimit -n; ulimit -Hn", NULL, 0);
	CHECKF(strcmp(s, "512\n4096\n") == 0, "ulimit -n; ulimit -Hn: '%s', want 512 and 4096", s);
	free(s);
	/* a request's rlimits still decide */
	struct sbx_rlimit rl = {"nofile", 100, 200};
	s = run_sh(c, "ulimit -n; ulimit -Hn", &rl, 1);
	CHECKF(strcmp(s, "100\n200\n") == 0, "with rlimits nofile 100:200: '%s'", s);
	free(s);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* The whole file, NUL-terminated (its length in *len). */
static char *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECKF(fd >= 0, "%s: %s", path, strerror(errno));
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap + 1);
	CHECK(b != NULL);
	for (;;) {
		ssize_t r = read(fd, b + n, cap - n);
		CHECK(r >= 0);
		if (r == 0)
			break;
		n += (size_t)r;
		CHECK(n < cap);
	}
	close(fd);
	b[n] = '\0';
	if (len != NULL)
		*len = n;
	return b;
}

static bool mem_has(const char *hay, size_t n, const char *needle)
{
	size_t k = strlen(needle);
	for (size_t i = 0; i + k <= n; i++)
		if (memcmp(hay + i, needle, k) == 0)
			return true;
	return false;
}

/* The hex mask of a "Sig...:" line of a /proc status text. */
static unsigned long long sig_line(const char *status, const char *name)
{
	char key[16];
	snprintf(key, sizeof(key), "\n%s:", name);
	const char *l = strstr(status, key);
	CHECKF(l != NULL, "no %s line in: %s", name, status);
	return strtoull(l + strlen(key), NULL, 16);
}

/* A command starts with every signal at its default disposition and none blocked,
 * whatever the shim catches or ignores: its own handlers (SIGTERM, SIGINT, SIGCHLD, the
 * workers' interrupt signal), its ignored SIGPIPE, and what it inherited as ignored (here
 * SIGHUP and SIGUSR1, as nohup or a shell's background job would leave them). Checked for
 * commands vforked and forked (spawn.c's child resets every signal before it unblocks them). */
static int case_signals(void)
{
	sock = it_path("shim.sock");
	const char *argv[] = {"sh",
			      "-c",
			      "trap '' HUP USR1; exec \"$@\"",
			      "sh",
			      SHIM_BIN,
			      "--listen",
			      it_unix_target(sock),
			      "--state-dir",
			      it_path("state"),
			      NULL};
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
	char *st = slurp(path, NULL);
	unsigned long long ign = sig_line(st, "SigIgn"), cgt = sig_line(st, "SigCgt");
	free(st);
	/* the shim really has them away from SIG_DFL, or the test shows nothing */
	CHECKF(ign & (1ull << (SIGHUP - 1)), "the shim does not ignore SIGHUP: SigIgn %llx", ign);
	CHECKF(ign & (1ull << (SIGUSR1 - 1)), "the shim does not ignore SIGUSR1: SigIgn %llx", ign);
	CHECKF(ign & (1ull << (SIGPIPE - 1)), "the shim does not ignore SIGPIPE: SigIgn %llx", ign);
	CHECKF(cgt & (1ull << (SIGTERM - 1)), "the shim does not catch SIGTERM: SigCgt %llx", cgt);
	CHECKF(cgt & (1ull << (SIGCHLD - 1)), "the shim does not catch SIGCHLD: SigCgt %llx", cgt);
	struct passwd *pw = getpwuid(geteuid());
	CHECK(pw != NULL);
	char me[64];
	snprintf(me, sizeof(me), "%s", pw->pw_name);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	for (int i = 0; i < 6; i++) {
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		/* cat installs no handler of its own. Odd rounds name a user (the shim's
		 * own): that is fork()ed, not vforked (spawn.c), the same child code. */
		const char *cat[] = {"/bin/cat", "/proc/self/status", NULL};
		eo.argv = cat;
		if (i % 2 == 1)
			eo.user = me;
		struct sbx_output out;
		struct sbx_exit ex = SBX_EXIT_INIT;
		struct sbx_error err;
		memset(&out, 0, sizeof(out));
		CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
		CHECK_EQ(ex.exit_code, 0);
		char *s = malloc(out.out_len + 2);
		CHECK(s != NULL);
		s[0] = '\n';
		memcpy(s + 1, out.out, out.out_len);
		s[out.out_len + 1] = '\0';
		sbx_output_free(&out);
		CHECKF(sig_line(s, "SigIgn") == 0, "round %d: the command has SigIgn %llx", i, sig_line(s, "SigIgn"));
		CHECKF(sig_line(s, "SigCgt") == 0, "round %d: the command has SigCgt %llx", i, sig_line(s, "SigCgt"));
		CHECKF(sig_line(s, "SigBlk") == 0, "round %d: the command has SigBlk %llx", i, sig_line(s, "SigBlk"));
		free(s);
	}
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* The SDK's exec: transport: the command it spawns gets no SBX_TOKEN nor SBX_TOKEN_FILE,
 * and the HELLO carries a token only when the caller gave one. The command records its
 * environment and (through tee) every byte the client sends it; the shim writes to a pipe
 * (cat passes it on), since it makes its stdout non-blocking, which would be tee's stdin too. */
static int case_exec_transport(void)
{
	setenv("SBX_TOKEN", "env-secret-token-1", 1);
	setenv("SBX_TOKEN_FILE", "/env/secret-token-file-2", 1);
	setenv("SBX_OTHER_SETTING", "kept", 1);
	char target[1024];
	snprintf(target, sizeof(target), "exec:env > '%s'; tee '%s' | '%s' --stdio --log-level warn | cat",
		 it_path("env"), it_path("hello"), SHIM_BIN);
	struct sbx_client *c = it_connect(target, NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c); /* reaps the command: both files are complete */
	size_t n;
	char *e = slurp(it_path("env"), &n);
	CHECKF(!mem_has(e, n, "env-secret-token-1") && !mem_has(e, n, "SBX_TOKEN"),
	       "the exec: command got the token:\n%s", e);
	CHECKF(!mem_has(e, n, "secret-token-file-2"), "the exec: command got SBX_TOKEN_FILE:\n%s", e);
	CHECKF(mem_has(e, n, "\nSBX_OTHER_SETTING=kept\n") || strncmp(e, "SBX_OTHER_SETTING=kept\n", 23) == 0,
	       "the rest of the environment is passed on:\n%s", e);
	free(e);
	char *h = slurp(it_path("hello"), &n);
	CHECK(n > 0);
	CHECKF(!mem_has(h, n, "env-secret-token-1"), "$SBX_TOKEN was sent in the HELLO to an exec: target");
	free(h);

	/* an explicit token is sent (the environment's still is not passed on) */
	c = it_connect(target, "explicit-token-3");
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	h = slurp(it_path("hello"), &n);
	CHECKF(mem_has(h, n, "explicit-token-3"), "the caller's own token was not sent");
	CHECK(!mem_has(h, n, "env-secret-token-1"));
	free(h);
	e = slurp(it_path("env"), &n);
	CHECK(!mem_has(e, n, "env-secret-token-1"));
	free(e);
	unsetenv("SBX_TOKEN");
	unsetenv("SBX_TOKEN_FILE");
	unsetenv("SBX_OTHER_SETTING");
	return 0;
}

/* ---- a command tree that setsid()s (issue 17.7) ---- */

/* The pid written to path, once it is there (0 if not within ms). */
static pid_t read_pid(const char *path, unsigned ms)
{
	uint64_t deadline = it_now_ms() + ms;
	for (;;) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			char b[32];
			ssize_t n = read(fd, b, sizeof(b) - 1);
			close(fd);
			if (n > 0 && b[n - 1] == '\n') {
				b[n] = '\0';
				return (pid_t)atoi(b);
			}
		}
		if (it_now_ms() >= deadline)
			return 0;
		it_sleep_ms(5);
	}
}

/* Gone: no such process, or a zombie (the shim reaps it). */
static bool pid_gone(pid_t pid)
{
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	const char *q = strrchr(buf, ')');
	return q != NULL && (q[2] == 'Z' || q[2] == 'X');
}

static void wait_gone(pid_t pid, const char *what)
{
	uint64_t t0 = it_now_ms();
	while (!pid_gone(pid)) {
		CHECKF(it_now_ms() - t0 < 10000, "%s: the setsid()'d pid %d still runs 10 s later", what, (int)pid);
		it_sleep_ms(5);
	}
	printf("%s: the setsid()'d process (pid %d) was gone %llu ms later\n", what, (int)pid,
	       (unsigned long long)(it_now_ms() - t0));
}

/* In another session, and not ours: the escape is real. */
static void check_escaped(pid_t pid, pid_t leader)
{
	CHECKF(getsid(pid) == pid, "pid %d is not a session leader (sid %d)", (int)pid, (int)getsid(pid));
	CHECK(getpgid(pid) != leader);
}

/* The command: a setsid()'d sleep (its pid in mark once the setsid is done), which
 * with ignore_term ignores SIGTERM; the leader waits. */
static void tree_cmd(char *buf, size_t size, const char *mark, bool ignore_term)
{
	snprintf(buf, size, "setsid sh -c '%s echo $$ > %s; exec sleep 1000' & wait",
		 ignore_term ? "trap \"\" TERM;" : "", mark);
}

static struct sbx_client *tree_daemon(void)
{
	sock = it_path("shim.sock");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), "--log-level",
			"debug", NULL);
	return it_connect(it_unix_target(sock), NULL);
}

/* --timeout: the setsid()'d sleep ends with the command; also when it ignores SIGTERM
 * (the grace's SIGKILL reaches it after the leader is gone). */
static int case_setsid_timeout(void)
{
	struct sbx_client *c = tree_daemon();
	for (int ignore = 0; ignore < 2; ignore++) {
		int timeout = 1000;
		for (int attempt = 0;; attempt++) {
			char mark[300], cmd[600];
			snprintf(mark, sizeof(mark), "%s", it_path(ignore ? "pid-ign" : "pid"));
			unlink(mark);
			tree_cmd(cmd, sizeof(cmd), mark, ignore);
			struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
			eo.shell = cmd;
			eo.timeout_ms = timeout;
			eo.kill_grace_ms = 500;
			struct sbx_output out;
			struct sbx_exit ex = SBX_EXIT_INIT;
			struct sbx_error err;
			memset(&out, 0, sizeof(out));
			CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
			sbx_output_free(&out);
			CHECK(ex.timed_out);
			pid_t pid = read_pid(mark, 0);
			if (pid == 0 && attempt < 3) {
				printf("the setsid()'d process had not started in %d ms: again\n", timeout);
				timeout *= 2;
				continue;
			}
			CHECKF(pid > 0, "no pid in %s", mark);
			wait_gone(pid, ignore ? "timeout, SIGTERM ignored" : "timeout");
			break;
		}
	}
	sbx_client_close(c);
	return 0;
}

/* sbx kill (a signal request by id) and the process handle's signal. */
static int case_setsid_kill(void)
{
	struct sbx_client *c = tree_daemon(), *c2 = it_connect(it_unix_target(sock), NULL);
	for (int how = 0; how < 2; how++) {
		char mark[300], cmd[600];
		snprintf(mark, sizeof(mark), "%s", it_path(how ? "pid-k2" : "pid-k1"));
		tree_cmd(cmd, sizeof(cmd), mark, false);
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.shell = cmd;
		struct sbx_proc *p;
		struct sbx_error err;
		CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
		pid_t pid = read_pid(mark, 10000);
		CHECKF(pid > 0, "no pid in %s", mark);
		check_escaped(pid, (pid_t)sbx_proc_pid(p));
		if (how == 0)
			CHECK_SBX(sbx_kill(c2, NULL, sbx_proc_id(p), SIGTERM, &err), &err);
		else
			CHECK_SBX(sbx_proc_signal(p, SIGKILL, &err), &err);
		struct sbx_exit ex = SBX_EXIT_INIT;
		CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
		CHECK_EQ(ex.signal, how == 0 ? SIGTERM : SIGKILL);
		wait_gone(pid, how == 0 ? "sbx kill TERM" : "signal KILL");
		sbx_proc_free(p);
	}
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

/* A cancelled foreground exec, and one whose connection goes away. */
static int case_setsid_cancel(void)
{
	struct sbx_client *c = tree_daemon();
	for (int how = 0; how < 2; how++) {
		struct sbx_client *cc = how == 0 ? c : it_connect(it_unix_target(sock), NULL);
		char mark[300], cmd[600];
		snprintf(mark, sizeof(mark), "%s", it_path(how ? "pid-c2" : "pid-c1"));
		tree_cmd(cmd, sizeof(cmd), mark, true);
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.shell = cmd;
		struct sbx_proc *p;
		struct sbx_error err;
		CHECK_SBX(sbx_exec_start(cc, NULL, &eo, 0, &p, &err), &err);
		pid_t pid = read_pid(mark, 10000);
		CHECKF(pid > 0, "no pid in %s", mark);
		pid_t leader = (pid_t)sbx_proc_pid(p);
		check_escaped(pid, leader);
		sbx_proc_free(p); /* CANCEL */
		if (how == 1)
			sbx_client_close(cc);
		wait_gone(pid, how == 0 ? "cancel" : "disconnect");
		wait_gone(leader, "the leader");
	}
	/* nothing is left stopped or running: the next command runs normally */
	char *s = run_sh(c, "echo fine", NULL, 0);
	CHECK(strcmp(s, "fine\n") == 0);
	free(s);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"secrets", case_secrets},
		{"duplicates", case_duplicates},
		{"default_path", case_default_path},
		{"nofile", case_nofile},
		{"signals", case_signals},
		{"exec_transport", case_exec_transport},
		{"setsid_timeout", case_setsid_timeout},
		{"setsid_kill", case_setsid_kill},
		{"setsid_cancel", case_setsid_cancel},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
