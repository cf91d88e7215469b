/* it_transports.c: every way to reach the daemon (exec/stdio, unix, tcp, vsock), each listener's guards, and
 * the listeners and token file given by the environment (SANDBOX_SHIM_LISTEN, SANDBOX_SHIM_TOKEN_FILE). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <grp.h>
#include <poll.h>
#include <sys/inotify.h>
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

	struct sbx_info in = SBX_INFO_INIT;
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
	struct sbx_info in = SBX_INFO_INIT;
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

/* Leftover temporary socket names in dir: "PATH.PID.tmp" (once), ".NAME.RANDOM" (the
 * private directory the socket is bound in). */
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
		else if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
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

/* ---- the socket's creation against a racer (issue 17.5) ---- */

#define NOBODY 65534

/* The racer, run as nobody (setpriv): in DIR (sticky, world-writable), on every new
 * entry the shim makes, try to plant a symlink to STANDIN inside it, swap it for a
 * symlink, and put a symlink to STANDIN at the socket's own NAME; until STOP exists
 * or the test is gone. A file "sync-N" is answered with "racer-ack-N": every event
 * before it has been handled. */
static int racer_main(const char *dir, const char *name, const char *standin, const char *stop, pid_t test)
{
	int in = inotify_init1(IN_CLOEXEC);
	if (in < 0 || inotify_add_watch(in, dir, IN_CREATE | IN_MOVED_TO | IN_ATTRIB | IN_CLOSE_WRITE) < 0)
		return 3;
	if (chdir(dir) < 0)
		return 3;
	unsigned tries = 0;
	for (;;) {
		struct pollfd pfd = {.fd = in, .events = POLLIN};
		if (access(stop, F_OK) == 0 || (kill(test, 0) < 0 && errno == ESRCH))
			break;
		if (poll(&pfd, 1, 20) == 0)
			continue;
		char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
		ssize_t n = read(in, buf, sizeof(buf));
		if (n <= 0)
			return 5;
		for (char *p = buf; n > 0 && p < buf + n;) {
			struct inotify_event *ev = (struct inotify_event *)p;
			p += sizeof(*ev) + ev->len;
			if (ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_Q_OVERFLOW))
				return ev->mask & IN_Q_OVERFLOW ? 6 : 0;
			/* the racer's own renames arrive as IN_MOVED_TO: only what others make */
			if (ev->len == 0 || strncmp(ev->name, "racer-", 6) == 0 || (ev->mask & IN_MOVED_TO))
				continue;
			char path[600], mine[64];
			if (strncmp(ev->name, "sync-", 5) == 0) {
				snprintf(path, sizeof(path), "racer-ack-%s", ev->name + 5);
				close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
				continue;
			}
			if (strcmp(ev->name, name) == 0)
				continue; /* the shim's socket arriving: too late to swap */
			/* into the shim's new directory (or through a name it made) */
			snprintf(path, sizeof(path), "%s/s", ev->name);
			if (symlink(standin, path) == 0)
				tries += 1000;
			snprintf(path, sizeof(path), "%s/%s", ev->name, name);
			(void)!symlink(standin, path);
			/* the entry itself swapped for a symlink */
			snprintf(mine, sizeof(mine), "racer-%u", tries++);
			if (symlink(standin, mine) == 0 && rename(mine, ev->name) < 0)
				unlink(mine);
			/* and the socket's name */
			snprintf(mine, sizeof(mine), "racer-%u", tries++);
			if (symlink(standin, mine) == 0 && rename(mine, name) < 0)
				unlink(mine);
			(void)!chmod(ev->name, 0777);
		}
	}
	return 0;
}

static void check_standin(const char *standin)
{
	struct stat st;
	CHECK(lstat(standin, &st) == 0);
	CHECKF(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600 && st.st_uid == 0 && st.st_gid == 0,
	       "the stand-in is now mode %04o uid %u gid %u", (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
	       (unsigned)st.st_gid);
	FILE *f = fopen(standin, "r");
	CHECK(f != NULL);
	char buf[64] = "";
	CHECK(fgets(buf, sizeof(buf), f) != NULL);
	fclose(f);
	CHECKF(strcmp(buf, "root secret\n") == 0, "the stand-in now holds '%s'", buf);
}

/* A sticky world-writable socket directory (as /tmp) with nobody racing in it: the old
 * names ("PATH.PID.tmp") pre-planted as symlinks to a root 0600 stand-in for the next
 * few thousand pids, and an inotify racer swapping every name the shim makes; 10
 * starts. The stand-in stays byte-for-byte and mode-for-mode, the planted links are
 * untouched, and PATH is always the shim's own socket (0600, root, its pid answers). */
static int case_socket_racer(void)
{
	if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
		printf("needs root and setpriv(1): skipped\n");
		return 0;
	}
	/* nobody may pass through the test's directory (not list it) */
	CHECK(chmod(it_dir(), 0711) == 0);
	const char *dir = it_path("sticky");
	const char *standin = it_path("standin");
	const char *stop = it_path("stop");
	CHECK(mkdir(dir, 0700) == 0 && chmod(dir, 01777) == 0);
	it_write_file(standin, "root secret\n");
	char sock[300];
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);

	/* the old code's temporary names, as nobody's symlinks to the stand-in */
	unsigned last = 0;
	FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "r");
	CHECK(f != NULL && fscanf(f, "%u", &last) == 1);
	fclose(f);
	unsigned planted = 0;
	pid_t pl = fork();
	CHECK(pl >= 0);
	if (pl == 0) {
		if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
		    setresuid(NOBODY, NOBODY, NOBODY) < 0)
			_exit(3);
		for (unsigned p = last + 1; p < last + 3000; p++) {
			char name[400];
			snprintf(name, sizeof(name), "%s.%u.tmp", sock, p);
			if (symlink(standin, name) < 0)
				_exit(4);
		}
		_exit(0);
	}
	int st;
	CHECK(waitpid(pl, &st, 0) == pl && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	planted = 2999;

	/* the test's own binary, by its real path (nobody may not read our /proc) */
	char self[4096];
	ssize_t sn = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sn > 0);
	self[sn] = '\0';
	pid_t r = fork();
	CHECK(r >= 0);
	if (r == 0) {
		char test[16];
		snprintf(test, sizeof(test), "%d", (int)getppid());
		execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", self,
		      "--racer", dir, "s.sock", standin, stop, test, (char *)NULL);
		_exit(127);
	}
	unsigned started = 0;
	for (int i = 0; i < 10; i++) {
		/* the racer has handled every event so far (it is ready, or done with the last
		 * start): then what it put at the name since the last stop goes (the test's
		 * own clean-up, not the shim's) */
		char sync[320], ack[340];
		snprintf(sync, sizeof(sync), "%s/sync-%d", dir, i);
		snprintf(ack, sizeof(ack), "%s/racer-ack-%d", dir, i);
		uint64_t deadline = it_now_ms() + 10000;
		for (;;) {
			it_write_file(sync, "");
			if (access(ack, F_OK) == 0)
				break;
			CHECKF(it_now_ms() < deadline, "the racer does not answer");
			CHECKF(waitpid(r, &st, WNOHANG) == 0, "the racer exited (status 0x%x)", st);
			it_sleep_ms(20);
		}
		unlink(sync);
		unlink(ack);
		unlink(sock);
		char name[32];
		snprintf(name, sizeof(name), "shim%d", i);
		struct it_daemon *d = it_daemon_start(name, "--listen", it_unix_target(sock), NULL);
		struct stat ss;
		CHECK(lstat(sock, &ss) == 0);
		CHECKF(S_ISSOCK(ss.st_mode) && (ss.st_mode & 07777) == 0600 && ss.st_uid == 0,
		       "PATH is mode 0%o uid %u, not the shim's socket", (unsigned)ss.st_mode, (unsigned)ss.st_uid);
		struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
		CHECK_EQ(sbx_client_server(c)->pid, d->pid);
		struct sbx_error err;
		CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
		sbx_client_close(c);
		check_standin(standin);
		it_daemon_stop(d);
		started++;
	}
	it_write_file(stop, "");
	CHECK(waitpid(r, &st, 0) == r);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "racer status 0x%x", st);
	check_standin(standin);
	/* every planted link is still there, still a link (the old code unlinked its own
	 * name and bound a socket there) */
	unsigned links = 0;
	for (unsigned p = last + 1; p < last + 3000; p++) {
		char name[400];
		snprintf(name, sizeof(name), "%s.%u.tmp", sock, p);
		struct stat ls;
		if (lstat(name, &ls) == 0 && S_ISLNK(ls.st_mode) && ls.st_uid == NOBODY)
			links++;
	}
	CHECK_EQ(links, planted);
	/* and no private directory of the shim's is left behind */
	DIR *dd = opendir(dir);
	CHECK(dd != NULL);
	unsigned left = 0;
	for (struct dirent *e; (e = readdir(dd)) != NULL;) {
		struct stat ds;
		if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
		    fstatat(dirfd(dd), e->d_name, &ds, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(ds.st_mode))
			left++;
	}
	closedir(dd);
	CHECK_EQ(left, 0);
	printf("%u starts with a racer as nobody in a sticky dir: the stand-in unchanged, PATH the shim's socket each "
	       "time, %u planted PATH.PID.tmp links untouched\n",
	       started, planted);
	return 0;
}

/* A socket directory that others can write and that is not a sticky root-owned one is
 * refused, naming it; so is a group-writable one. A sticky one owned by another user
 * too (its owner could swap names). */
static int case_socket_dir_writable(void)
{
	static const struct {
		const char *name;
		mode_t mode;
		uid_t owner;
	} dirs[] = {{"ww", 0777, 0}, {"gw", 0770, 0}, {"sticky-nobody", 01777, NOBODY}};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		const char *dir = it_path(dirs[i].name);
		CHECK(mkdir(dir, 0700) == 0 && chmod(dir, dirs[i].mode) == 0);
		if (dirs[i].owner != 0 && (geteuid() != 0 || chown(dir, dirs[i].owner, (gid_t)-1) < 0))
			continue;
		char sock[300];
		snprintf(sock, sizeof(sock), "%s/s.sock", dir);
		struct it_daemon *d = it_daemon_spawn(dirs[i].name, "--listen", it_unix_target(sock), NULL);
		char why[600];
		snprintf(
			why, sizeof(why),
			"cannot listen on unix:%s: the socket directory %s is writable by others (mode %04o, owner uid "
			"%u): use a directory that only its owner can write, or a sticky root-owned one: Operation not "
			"permitted",
			sock, dir, (unsigned)dirs[i].mode, (unsigned)dirs[i].owner);
		expect_start_failure(d, why);
		struct stat st;
		CHECKF(lstat(sock, &st) < 0 && errno == ENOENT, "something was created at %s", sock);
		CHECK_EQ(it_count_entries(dir), 0);
		CHECK_EQ(count_tmp_names(dir), 0);
	}
	/* the same directory made 0755 (or sticky and root's): served */
	const char *ok = it_path("ww");
	CHECK(chmod(ok, 0755) == 0);
	char sock[300];
	snprintf(sock, sizeof(sock), "%s/s.sock", ok);
	it_daemon_start("ok", "--listen", it_unix_target(sock), NULL);
	ping_once(it_unix_target(sock), NULL);
	CHECK(chmod(ok, 01777) == 0);
	snprintf(sock, sizeof(sock), "%s/t.sock", ok);
	it_daemon_start("ok2", "--listen", it_unix_target(sock), NULL);
	ping_once(it_unix_target(sock), NULL);
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
	struct sbx_info in = SBX_INFO_INIT;
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
	struct sbx_info in = SBX_INFO_INIT;
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

/* The token file is checked as ssh checks a key: ours (or root's), no access for group
 * or others; else the shim refuses to start and says why. The same for the file the
 * environment names. */
static int case_token_file_mode(void)
{
	const char *tok = it_path("token");
	const char *sock = it_path("s");
	static const struct {
		mode_t mode;
		uid_t owner;
	} bad[] = {{0644, 0}, {0640, 0}, {0604, 0}, {0660, 0}, {0600, NOBODY}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		it_write_file(tok, "s3cret\n");
		CHECK(chmod(tok, bad[i].mode) == 0);
		if (bad[i].owner != geteuid() && (geteuid() != 0 || chown(tok, bad[i].owner, (gid_t)-1) < 0))
			continue;
		char why[600];
		snprintf(why, sizeof(why),
			 "sandbox-shim: %s: the token file must be a regular file owned by uid 0 and not accessible to "
			 "group or others (it is a file, owner uid %u, mode %04o): chmod 600 it",
			 tok, (unsigned)bad[i].owner, (unsigned)bad[i].mode);
		if (geteuid() != 0)
			continue; /* the message names the shim's uid "or root" then */
		struct it_daemon *d =
			it_daemon_spawn("bad", "--listen", it_unix_target(sock), "--token-file", tok, NULL);
		expect_start_failure(d, why);
		/* the environment's: the same check, named by the variable */
		char var[300], why_env[700];
		snprintf(var, sizeof(var), "SANDBOX_SHIM_TOKEN_FILE=%s", tok);
		snprintf(why_env, sizeof(why_env), "sandbox-shim: SANDBOX_SHIM_TOKEN_FILE: %s",
			 why + strlen("sandbox-shim: "));
		d = env_daemon("bad-env", false, VARS(var), ARGS("--listen", it_unix_target(sock)));
		expect_start_failure(d, why_env);
		struct stat st;
		CHECK(lstat(sock, &st) < 0 && errno == ENOENT);
		CHECK(unlink(tok) == 0);
	}
	/* not a regular file */
	const char *dir = it_path("tokdir");
	CHECK(mkdir(dir, 0700) == 0);
	struct it_daemon *d = it_daemon_spawn("dir", "--listen", it_unix_target(sock), "--token-file", dir, NULL);
	expect_start_failure(d, "the token file must be a regular file");
	/* 0600 and ours: served, with the token */
	it_write_file(tok, "s3cret\n");
	CHECK(chmod(tok, 0600) == 0);
	it_daemon_start("ok", "--listen", it_unix_target(sock), "--token-file", tok, NULL);
	ping_once(it_unix_target(sock), "s3cret");
	/* read-only for its owner is fine too */
	const char *sock2 = it_path("s2");
	CHECK(chmod(tok, 0400) == 0);
	it_daemon_start("ok-ro", "--listen", it_unix_target(sock2), "--token-file", tok, NULL);
	ping_once(it_unix_target(sock2), "s3cret");
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
		{"socket_racer", case_socket_racer},
		{"socket_dir_writable", case_socket_dir_writable},
		{"token_file_mode", case_token_file_mode},
	};
	/* the racer of socket_racer, run as nobody through setpriv */
	if (argc == 7 && strcmp(argv[1], "--racer") == 0)
		return racer_main(argv[2], argv[3], argv[4], argv[5], (pid_t)atoi(argv[6]));
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
