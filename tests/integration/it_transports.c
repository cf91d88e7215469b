/* it_transports.c: every way to reach the daemon (exec/stdio, unix, tcp, vsock), each listener's guards, and
 * the listeners and token file given by the environment (SANDBOX_SHIM_LISTEN, SANDBOX_SHIM_TOKEN_FILE). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

/* ping, info and echo (several sizes, bytes compared) on one client. */
static void exercise(struct sbx_client *c, unsigned want_pid)
{
	struct sbx_error err;
	uint64_t rtt = 0;
	CHECK_SBX(sbx_ping(c, NULL, &rtt, &err), &err);
	CHECK(rtt > 0);

	const struct sbx_server_info *si = sbx_client_server(c);
	CHECK_EQ(si->protocol_version, 1);
	CHECK(sbx_client_has_feature(c, "info"));
	CHECK(sbx_client_has_feature(c, "echo"));
	CHECK(!sbx_client_has_feature(c, "ech"));

	struct sbx_info in;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.protocol_version, 1);
	CHECK_EQ(in.pid, si->pid);
	if (want_pid != 0)
		CHECK_EQ(in.pid, want_pid);
	CHECK_EQ(in.uid, getuid());
	CHECK_EQ(in.gid, getgid());
	CHECK_CONTAINS(in.features, "echo");
	CHECK(in.connections >= 1);

	static const size_t sizes[] = {0, 1, 4096, 300000, 3u << 20};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		uint8_t *data = malloc(n + 1), *back = malloc(n + 1);
		CHECK(data != NULL && back != NULL);
		it_fill(data, n, i + 7);
		memset(back, 0xee, n);
		CHECK_SBX(sbx_echo(c, NULL, data, n, back, &err), &err);
		CHECKF(memcmp(data, back, n) == 0, "echo of %zu bytes came back different", n);
		free(data);
		free(back);
	}
}

static int try_connect(const char *target, const char *token, struct sbx_error *err)
{
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	struct sbx_client *c = NULL;
	o.token = token;
	o.connect_timeout_ms = 5000;
	memset(err, 0, sizeof(*err));
	int rc = sbx_connect(target, &o, &c, err);
	if (rc == 0)
		sbx_client_close(c);
	return rc;
}

static void ping_once(const char *target, const char *token)
{
	struct sbx_client *c = it_connect(target, token);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
}

/* Wait for a daemon that must refuse to start: exit status 1 and why in its log. */
static void expect_start_failure(struct it_daemon *d, const char *why)
{
	CHECKF(it_daemon_wait_exit(d, 10000), "%s did not exit", d->name);
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 1, "%s: status 0x%x, want exit 1", d->name, d->status);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, why);
	free(log);
}

static int case_exec(void)
{
	char target[512];
	snprintf(target, sizeof(target), "exec:'%s' --stdio --log-level warn", SHIM_BIN);
	struct sbx_client *c = it_connect(target, NULL);
	exercise(c, 0);
	/* stdio never needs a token, even when a token file is configured */
	sbx_client_close(c);
	it_write_file(it_path("token"), "abc\n");
	snprintf(target, sizeof(target), "exec:'%s' --stdio --log-level warn --token-file '%s'", SHIM_BIN,
		 it_path("token"));
	c = it_connect(target, NULL);
	exercise(c, 0);
	sbx_client_close(c);
	return 0;
}

static int case_unix(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	exercise(c, (unsigned)d->pid);
	sbx_client_close(c);
	return 0;
}

static int case_tcp_token(void)
{
	const char *sock = it_path("s");
	it_write_file(it_path("token"), "s3cret-token\n");
	struct it_daemon *d = it_daemon_start("shim", "--listen", "tcp:127.0.0.1:0", "--listen", it_unix_target(sock),
					      "--token-file", it_path("token"), NULL);
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));

	/* the right token (the file's trailing newline is not part of it) */
	struct sbx_client *c = it_connect(tcp, "s3cret-token");
	exercise(c, (unsigned)d->pid);
	sbx_client_close(c);

	struct sbx_error err;
	CHECK(try_connect(tcp, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "token required");

	CHECK(try_connect(tcp, "s3cret-tokex", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "bad token");
	CHECK(try_connect(tcp, "s3cret-token\n", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK(try_connect(tcp, "s3cret", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);

	/* with --token-file the unix listener wants the token too */
	CHECK(try_connect(it_unix_target(sock), NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	ping_once(it_unix_target(sock), "s3cret-token");

	/* refused handshakes leave nothing behind */
	c = it_connect(tcp, "s3cret-token");
	struct sbx_info in;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.connections, 1);
	sbx_client_close(c);
	return 0;
}

static int case_tcp_needs_token(void)
{
	struct it_daemon *d = it_daemon_spawn("refused", "--listen", "tcp:127.0.0.1:0", NULL);
	expect_start_failure(d, "a tcp listener needs --token-file");

	d = it_daemon_start("insecure", "--listen", "tcp:127.0.0.1:0", "--insecure-no-token", NULL);
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	struct sbx_client *c = it_connect(tcp, NULL);
	exercise(c, (unsigned)d->pid);
	sbx_client_close(c);
	/* a token nobody asked for is ignored */
	ping_once(tcp, "whatever");
	return 0;
}

static mode_t sock_mode(const char *path)
{
	struct stat st;
	CHECKF(lstat(path, &st) == 0, "lstat %s: %s", path, strerror(errno));
	CHECKF(S_ISSOCK(st.st_mode), "%s is not a socket", path);
	return st.st_mode & 07777;
}

static int case_socket_mode(void)
{
	const char *a = it_path("a"), *b = it_path("b");
	/* a permissive umask in the caller must not widen the default */
	mode_t old = umask(0);
	it_daemon_start("default", "--listen", it_unix_target(a), NULL);
	it_daemon_start("wide", "--listen", it_unix_target(b), "--socket-mode", "0660", NULL);
	umask(old);
	CHECK_EQ(sock_mode(a), 0600);
	CHECK_EQ(sock_mode(b), 0660);
	ping_once(it_unix_target(a), NULL);
	ping_once(it_unix_target(b), NULL);
	return 0;
}

/* A socket file nobody listens on: bind a socket to path, then close it. */
static void make_stale_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(fd, 1) == 0);
	close(fd);
	struct stat st;
	CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
}

/* Leftover temporary socket names ("PATH.PID.tmp") in dir. */
static int count_tmp_names(const char *dir)
{
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t len = strlen(e->d_name);
		if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0)
			n++;
	}
	closedir(d);
	return n;
}

static int case_stale_socket(void)
{
	const char *sock = it_path("s");
	make_stale_socket(sock);
	struct sbx_error err;
	CHECK(try_connect(it_unix_target(sock), NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, ECONNREFUSED);

	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	CHECK_EQ(sbx_client_server(c)->pid, d->pid);
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	CHECK_EQ(sock_mode(sock), 0600);
	/* the temporary name used for the atomic replacement is gone */
	CHECK_EQ(count_tmp_names(it_dir()), 0);
	return 0;
}

static int case_live_socket(void)
{
	const char *sock = it_path("s");
	struct it_daemon *first = it_daemon_start("first", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct stat before, after;
	CHECK(lstat(sock, &before) == 0);

	struct it_daemon *second = it_daemon_spawn("second", "--listen", it_unix_target(sock), NULL);
	expect_start_failure(second, "another process is listening on this socket");

	/* the first daemon is unaffected: same file, same process, old and new clients work */
	CHECK(lstat(sock, &after) == 0);
	CHECK_EQ(after.st_ino, before.st_ino);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
	c = it_connect(it_unix_target(sock), NULL);
	CHECK_EQ(sbx_client_server(c)->pid, first->pid);
	sbx_client_close(c);
	CHECK_EQ(count_tmp_names(it_dir()), 0);
	return 0;
}

static int case_not_a_socket(void)
{
	const char *path = it_path("file");
	it_write_file(path, "precious data\n");
	struct it_daemon *d = it_daemon_spawn("shim", "--listen", it_unix_target(path), NULL);
	expect_start_failure(d, "exists and is not a socket");
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	char buf[64] = "";
	CHECK(fgets(buf, sizeof(buf), f) != NULL);
	fclose(f);
	CHECK(strcmp(buf, "precious data\n") == 0);
	return 0;
}

static int case_allow_uid(void)
{
	char other[16], mine[16];
	snprintf(other, sizeof(other), "%u", (unsigned)getuid() + 12345u);
	snprintf(mine, sizeof(mine), "%u", (unsigned)getuid());
	const char *a = it_path("a"), *b = it_path("b");
	it_daemon_start("others", "--listen", it_unix_target(a), "--allow-uid", other, NULL);
	it_daemon_start("mine", "--listen", it_unix_target(b), "--allow-uid", other, "--allow-uid", mine, NULL);

	struct sbx_error err;
	for (int i = 0; i < 20; i++) {
		CHECK(try_connect(it_unix_target(a), NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
		CHECK_CONTAINS(err.message, "not allowed");
		CHECK_CONTAINS(err.message, mine);
	}
	struct sbx_client *c = it_connect(it_unix_target(b), NULL);
	exercise(c, 0);
	sbx_client_close(c);
	return 0;
}

static int case_multi_listen(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--listen", "tcp:127.0.0.1:0",
					      "--insecure-no-token", NULL);
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	it_daemon_wait_log(d, "listening on unix:", 1000);
	struct sbx_client *u = it_connect(it_unix_target(sock), NULL);
	struct sbx_client *t = it_connect(tcp, NULL);
	exercise(u, (unsigned)d->pid);
	exercise(t, (unsigned)d->pid);
	struct sbx_error err;
	struct sbx_info in;
	CHECK_SBX(sbx_info(u, NULL, &in, &err), &err);
	CHECK_EQ(in.connections, 2);
	sbx_client_close(u);
	sbx_client_close(t);
	return 0;
}

static int case_vsock(void)
{
	/* The loopback transport may be a module; without it bind/listen still work
	 * here when AF_VSOCK itself exists. Failures are fine. */
	int rc = system("modprobe vsock_loopback >/dev/null 2>&1 || modprobe vhost_vsock >/dev/null 2>&1");
	(void)rc;
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 && (errno == EAFNOSUPPORT || errno == EPROTONOSUPPORT)) {
		printf("SKIP: AF_VSOCK is not available here (socket: %s)\n", strerror(errno));
		return IT_SKIP;
	}
	CHECKF(fd >= 0, "socket(AF_VSOCK): %s", strerror(errno));
	close(fd);

	srand((unsigned)getpid() ^ (unsigned)it_now_ms());
	for (int attempt = 0; attempt < 5; attempt++) {
		unsigned port = 20000u + (unsigned)rand() % 40000u;
		char spec[64], logged[80];
		snprintf(spec, sizeof(spec), "vsock:-1:%u", port);
		snprintf(logged, sizeof(logged), "listening on vsock:-1:%u\n", port);
		char name[16];
		snprintf(name, sizeof(name), "shim%d", attempt);
		struct it_daemon *d = it_daemon_spawn(name, "--listen", spec, NULL);
		/* either it starts, or it says why (a port in use: try another) */
		uint64_t deadline = it_now_ms() + 10000;
		for (;;) {
			char *log = it_daemon_log(d);
			bool up = log != NULL && strstr(log, " ready (pid ") != NULL;
			bool inuse = log != NULL && strstr(log, "Address already in use") != NULL;
			free(log);
			if (up)
				break;
			if (it_daemon_wait_exit(d, 0)) {
				CHECKF(inuse, "%s failed to listen on %s", d->name, spec);
				break;
			}
			CHECKF(it_now_ms() < deadline, "%s did not start", d->name);
			it_sleep_ms(5);
		}
		if (d->exited)
			continue;
		it_daemon_wait_log(d, logged, 1000);
		/* the daemon really holds the port */
		fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
		CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE);
		close(fd);
		CHECK_EQ(it_daemon_stop(d), 0);
		return 0;
	}
	it_fail(__FILE__, __LINE__, "no free vsock port in 5 attempts");
}

/* ---- the environment's options (SANDBOX_SHIM_LISTEN, SANDBOX_SHIM_TOKEN_FILE) ---- */

/* The daemon run as `env VARS... SHIM_BIN ARGS...` (env execs it: the PID is the daemon's);
 * both lists NULL-terminated. Waits for "ready" when ready is set. */
static struct it_daemon *env_daemon(const char *name, bool ready, const char *const vars[], const char *const args[])
{
	const char *argv[48];
	int n = 0;
	argv[n++] = "env";
	for (int i = 0; vars[i] != NULL; i++) {
		CHECK(n < 40);
		argv[n++] = vars[i];
	}
	argv[n++] = SHIM_BIN;
	for (int i = 0; args[i] != NULL; i++) {
		CHECK(n < 46);
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	return ready ? it_daemon_start_argv(name, argv) : it_daemon_spawn_argv(name, argv);
}

#define VARS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_ARGS ((const char *const[]){NULL})

/* Like expect_start_failure() with another exit status. */
static void expect_exit(struct it_daemon *d, int status, const char *why)
{
	CHECKF(it_daemon_wait_exit(d, 10000), "%s did not exit", d->name);
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == status, "%s: status 0x%x, want exit %d", d->name,
	       d->status, status);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, why);
	free(log);
}

static bool log_has(const struct it_daemon *d, const char *what)
{
	char *log = it_daemon_log(d);
	bool found = log != NULL && strstr(log, what) != NULL;
	free(log);
	return found;
}

/* The variable's addresses (commas and whitespace between them) are served beside the
 * command line's --listen, with the token. */
static int case_env_listen(void)
{
	const char *a = it_path("a"), *b = it_path("b");
	it_write_file(it_path("token"), "env-token\n");
	char listen[600];
	snprintf(listen, sizeof(listen), "SANDBOX_SHIM_LISTEN= tcp:127.0.0.1:0,%s\t,\n", it_unix_target(a));
	struct it_daemon *d = env_daemon("shim", true, VARS(listen),
					 ARGS("--listen", it_unix_target(b), "--token-file", it_path("token")));
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	char logged[300];
	snprintf(logged, sizeof(logged), "listening on %s\n", it_unix_target(a));
	it_daemon_wait_log(d, logged, 1000);
	snprintf(logged, sizeof(logged), "listening on %s\n", it_unix_target(b));
	it_daemon_wait_log(d, logged, 1000);

	struct sbx_client *t = it_connect(tcp, "env-token");
	exercise(t, (unsigned)d->pid);
	struct sbx_client *ua = it_connect(it_unix_target(a), "env-token");
	struct sbx_client *ub = it_connect(it_unix_target(b), "env-token");
	struct sbx_error err;
	CHECK_SBX(sbx_ping(ua, NULL, NULL, &err), &err);
	CHECK_SBX(sbx_ping(ub, NULL, NULL, &err), &err);
	struct sbx_info in;
	CHECK_SBX(sbx_info(t, NULL, &in, &err), &err);
	CHECK_EQ(in.connections, 3);
	sbx_client_close(ua);
	sbx_client_close(ub);
	sbx_client_close(t);

	CHECK(try_connect(tcp, "env-tokex", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "bad token");
	CHECK(try_connect(it_unix_target(a), NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_EQ(it_daemon_stop(d), 0);
	CHECK_EQ(it_count_entries(it_dir()), 2); /* the token and the log: both sockets removed */

	/* an address given on the command line and in the variable is listened on once */
	snprintf(listen, sizeof(listen), "SANDBOX_SHIM_LISTEN=%s", it_unix_target(a));
	d = env_daemon("twice", true, VARS(listen), ARGS("--listen", it_unix_target(a)));
	it_daemon_wait_log(d, "is given twice: listening on it once", 1000);
	ping_once(it_unix_target(a), NULL);
	/* nothing but separators: no address (the command line's are served) */
	d = env_daemon("blank", true, VARS("SANDBOX_SHIM_LISTEN= ,\t, "), ARGS("--listen", it_unix_target(b)));
	ping_once(it_unix_target(b), NULL);
	return 0;
}

/* tcp from the variable without a token: the start fails and says which variable to set. */
static int case_env_needs_token(void)
{
	static const char want[] = "SANDBOX_SHIM_LISTEN: cannot listen on tcp:127.0.0.1:0: a tcp listener needs "
				   "a token: set SANDBOX_SHIM_TOKEN_FILE";
	struct it_daemon *d = env_daemon("refused", false, VARS("SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:0"), NO_ARGS);
	expect_start_failure(d, want);
	/* beside a command-line unix listener, and with an empty token file variable */
	d = env_daemon("refused2", false, VARS("SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:0", "SANDBOX_SHIM_TOKEN_FILE="),
		       ARGS("--listen", it_unix_target(it_path("s"))));
	expect_start_failure(d, want);
	CHECK_EQ(it_count_entries(it_dir()), 2); /* the two logs: no socket left behind */

	/* --insecure-no-token still allows it */
	d = env_daemon("insecure", true, VARS("SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:0"), ARGS("--insecure-no-token"));
	ping_once(it_tcp_target(it_daemon_tcp_port(d)), NULL);
	return 0;
}

/* A bad address in the variable fails the start, naming the variable. */
static int case_env_bad_addr(void)
{
	static const struct {
		const char *var, *why;
	} bad[] = {
		{"SANDBOX_SHIM_LISTEN=tcp:127.0.0.1", "SANDBOX_SHIM_LISTEN: cannot listen on tcp:127.0.0.1: "},
		{"SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:99999",
		 "SANDBOX_SHIM_LISTEN: cannot listen on tcp:127.0.0.1:99999: "},
		{"SANDBOX_SHIM_LISTEN=bogus:1",
		 "SANDBOX_SHIM_LISTEN: cannot listen on bogus:1: unknown listen address"},
		{"SANDBOX_SHIM_LISTEN=tcp:[::1:0", "SANDBOX_SHIM_LISTEN: cannot listen on tcp:[::1:0: "},
		{"SANDBOX_SHIM_LISTEN=unix:", "SANDBOX_SHIM_LISTEN: cannot listen on unix:: "},
	};
	const char *sock = it_path("s");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char name[16];
		snprintf(name, sizeof(name), "bad%zu", i);
		/* after a good command-line listener, which is removed again */
		struct it_daemon *d = env_daemon(name, false, VARS(bad[i].var),
						 ARGS("--listen", it_unix_target(sock), "--insecure-no-token"));
		expect_start_failure(d, bad[i].why);
		struct stat st;
		CHECKF(lstat(sock, &st) < 0 && errno == ENOENT, "%s left %s behind", name, sock);
	}
	/* more than 16 addresses in all */
	char many[1200] = "SANDBOX_SHIM_LISTEN=";
	for (int i = 0; i < 16; i++) {
		char one[64];
		snprintf(one, sizeof(one), "%sunix:%s/u%d", i ? "," : "", it_dir(), i);
		strcat(many, one);
	}
	struct it_daemon *d = env_daemon("many", false, VARS(many), ARGS("--listen", it_unix_target(sock)));
	expect_exit(d, 2, "SANDBOX_SHIM_LISTEN: too many listen addresses (at most 16");
	/* no address at all and nothing else to serve */
	d = env_daemon("blank", false, VARS("SANDBOX_SHIM_LISTEN=, "), NO_ARGS);
	expect_exit(d, 2, "nothing to serve");
	return 0;
}

/* SANDBOX_SHIM_TOKEN_FILE is the token file when the command line gives none. */
static int case_env_token_file(void)
{
	it_write_file(it_path("env-token"), "from-the-environment\n");
	it_write_file(it_path("cli-token"), "from-the-command-line\n");
	char var[300];
	snprintf(var, sizeof(var), "SANDBOX_SHIM_TOKEN_FILE=%s", it_path("env-token"));
	struct it_daemon *d = env_daemon("env", true, VARS(var), ARGS("--listen", "tcp:127.0.0.1:0"));
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	struct sbx_client *c = it_connect(tcp, "from-the-environment");
	exercise(c, (unsigned)d->pid);
	sbx_client_close(c);
	struct sbx_error err;
	CHECK(try_connect(tcp, "from-the-environmenT", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "bad token");
	CHECK(try_connect(tcp, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "token required");
	CHECK(!log_has(d, "from-the-environment")); /* the path is logged at most, never the token */

	/* with both, --token-file wins, and the log says so */
	d = env_daemon("both", true, VARS(var),
		       ARGS("--listen", "tcp:127.0.0.1:0", "--token-file", it_path("cli-token")));
	tcp = it_tcp_target(it_daemon_tcp_port(d));
	ping_once(tcp, "from-the-command-line");
	CHECK(try_connect(tcp, "from-the-environment", &err) < 0);
	CHECK_ERR(&err, SBX_ERR_CONNECT, EACCES);
	CHECK_CONTAINS(err.message, "bad token");
	char logged[600];
	snprintf(logged, sizeof(logged), "token from --token-file %s; SANDBOX_SHIM_TOKEN_FILE (%s) is not used",
		 it_path("cli-token"), it_path("env-token"));
	it_daemon_wait_log(d, logged, 1000);
	/* the same file in both: nothing to say */
	d = env_daemon("same", true, VARS(var),
		       ARGS("--listen", "tcp:127.0.0.1:0", "--token-file", it_path("env-token")));
	ping_once(it_tcp_target(it_daemon_tcp_port(d)), "from-the-environment");
	CHECK(!log_has(d, "is not used"));

	/* the variable's token file with the variable's address: the image's case */
	d = env_daemon("both_env", true, VARS(var, "SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:0"), NO_ARGS);
	ping_once(it_tcp_target(it_daemon_tcp_port(d)), "from-the-environment");

	/* a file that cannot be read: the error names the variable */
	snprintf(var, sizeof(var), "SANDBOX_SHIM_TOKEN_FILE=%s", it_path("missing"));
	d = env_daemon("missing", false, VARS(var), ARGS("--listen", "tcp:127.0.0.1:0"));
	snprintf(logged, sizeof(logged), "SANDBOX_SHIM_TOKEN_FILE: %s: No such file or directory", it_path("missing"));
	expect_start_failure(d, logged);
	return 0;
}

/* A --stdio shim ignores the variables: `podman exec -i CTR sandbox-shim --stdio` sees the
 * container's environment, and PID 1 already listens there. */
static int case_env_stdio(void)
{
	it_write_file(it_path("token"), "t0ken\n");
	char var[300];
	snprintf(var, sizeof(var), "SANDBOX_SHIM_TOKEN_FILE=%s", it_path("token"));
	struct it_daemon *d = env_daemon("pid1", true, VARS(var, "SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:0"), NO_ARGS);
	unsigned port = it_daemon_tcp_port(d);
	char target[800];
	snprintf(
		target, sizeof(target),
		"exec:env SANDBOX_SHIM_LISTEN=tcp:127.0.0.1:%u SANDBOX_SHIM_TOKEN_FILE='%s' '%s' --stdio --log-level warn",
		port, it_path("missing"), SHIM_BIN);
	struct sbx_client *c = it_connect(target, NULL);
	exercise(c, 0);
	CHECK(sbx_client_server(c)->pid != (unsigned)d->pid);
	sbx_client_close(c);
	ping_once(it_tcp_target(port), "t0ken");
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"exec", case_exec},
		{"unix", case_unix},
		{"tcp_token", case_tcp_token},
		{"tcp_needs_token", case_tcp_needs_token},
		{"socket_mode", case_socket_mode},
		{"stale_socket", case_stale_socket},
		{"live_socket", case_live_socket},
		{"not_a_socket", case_not_a_socket},
		{"allow_uid", case_allow_uid},
		{"multi_listen", case_multi_listen},
		{"vsock", case_vsock},
		{"env_listen", case_env_listen},
		{"env_needs_token", case_env_needs_token},
		{"env_bad_addr", case_env_bad_addr},
		{"env_token_file", case_env_token_file},
		{"env_stdio", case_env_stdio},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
