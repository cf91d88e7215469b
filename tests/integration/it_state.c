/* it_state.c: the private state directory apart from a shared socket directory, a non-root shim's
 * taken default, the start-up sweep of a dead daemon's mount files, no core dumps or /proc of the shim
 * for its own uid (issues 17.7 and 18.3). */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOBODY 65534

static bool have_setpriv(void)
{
	if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
		printf("needs root and setpriv(1): skipped\n");
		return false;
	}
	return true;
}

static void expect_exit1(struct it_daemon *d, const char *why)
{
	CHECKF(it_daemon_wait_exit(d, 10000), "%s did not exit", d->name);
	CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 1, "%s: status 0x%x, want exit 1", d->name, d->status);
	char *log = it_daemon_log(d);
	CHECKF(strstr(log, why) != NULL, "log has not '%s':\n%s", why, log);
	free(log);
}

static void ping(const char *sock)
{
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_error err;
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	sbx_client_close(c);
}

/* A socket directory of any mode the user gives it (here 0755 and a host user's, as a
 * host directory bind-mounted into a container) is served; the state cannot be put in
 * it. */
static int case_shared_socket_dir(void)
{
	const char *shared = it_path("shared");
	CHECK(mkdir(shared, 0700) == 0 && chmod(shared, 0755) == 0);
	uid_t owner = geteuid() == 0 ? 1000 : geteuid();
	if (geteuid() == 0)
		CHECK(chown(shared, owner, (gid_t)-1) == 0);
	char sock[300], inside[300];
	snprintf(sock, sizeof(sock), "%s/shim.sock", shared);
	snprintf(inside, sizeof(inside), "%s/state", shared);
	const char *state = it_path("state");

	char why[900];
	snprintf(why, sizeof(why),
		 "sandbox-shim: state dir %s is in the directory of the socket %s (%s, owner uid %u, mode 0755), which "
		 "is shared: give --state-dir elsewhere",
		 inside, sock, shared, (unsigned)owner);
	struct it_daemon *d = it_daemon_spawn("inside", "--listen", it_unix_target(sock), "--state-dir", inside, NULL);
	if (geteuid() != 0) {
		printf("needs root to give the directory to another user: the refusal is not checked\n");
		it_daemon_stop(d);
		return 0;
	}
	expect_exit1(d, why);
	struct stat st;
	CHECKF(lstat(inside, &st) < 0 && errno == ENOENT, "the refused state dir was created");
	CHECK_EQ(it_count_entries(shared), 0);

	/* the state elsewhere: served; the directory keeps its mode, the socket is 0600 */
	it_daemon_start("apart", "--listen", it_unix_target(sock), "--state-dir", state, NULL);
	ping(sock);
	CHECK(stat(shared, &st) == 0 && (st.st_mode & 07777) == 0755);
	CHECK(lstat(sock, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0600);
	CHECK(stat(state, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
	return 0;
}

/* A state dir that is not ours or open to others is refused when given; a non-root
 * shim's default taken by another user is replaced by a private one beside it. */
static int case_taken_default(void)
{
	const char *bad = it_path("bad-state");
	CHECK(mkdir(bad, 0700) == 0 && chmod(bad, 0755) == 0);
	const char *sock = it_path("s");
	char why[600];
	snprintf(why, sizeof(why),
		 "sandbox-shim: state dir %s: owner uid %u, mode 0755; must be a directory of ours with mode 0700", bad,
		 (unsigned)geteuid());
	expect_exit1(it_daemon_spawn("bad", "--listen", it_unix_target(sock), "--state-dir", bad, NULL), why);

	if (!have_setpriv())
		return 0;
	/* nobody's XDG_RUNTIME_DIR, where root made sandbox-shim first */
	CHECK(chmod(it_dir(), 0711) == 0);
	const char *xdg = it_path("xdg");
	CHECK(mkdir(xdg, 0700) == 0 && chown(xdg, NOBODY, NOBODY) == 0);
	char taken[300], nsock[300];
	snprintf(taken, sizeof(taken), "%s/sandbox-shim", xdg);
	snprintf(nsock, sizeof(nsock), "%s/s.sock", xdg);
	CHECK(mkdir(taken, 0700) == 0);
	CHECK(setenv("XDG_RUNTIME_DIR", xdg, 1) == 0);
	const char *argv[] = {"setpriv", "--reuid=65534", "--regid=65534",       "--clear-groups",
			      SHIM_BIN,  "--listen",      it_unix_target(nsock), NULL};
	struct it_daemon *d = it_daemon_start_argv("nobody", argv);
	unsetenv("XDG_RUNTIME_DIR");
	char *log = it_daemon_log(d);
	char want[1000];
	/* root's 0700 directory: nobody cannot even open it */
	snprintf(want, sizeof(want), "warn: state dir %s is not ours (Permission denied): using %s.", taken, taken);
	const char *p = strstr(log, want);
	CHECKF(p != NULL, "log has not '%s':\n%s", want, log);
	char made[300];
	CHECK(sscanf(p + strlen(want) - strlen(taken) - 1, "%299s", made) == 1);
	free(log);
	struct stat st;
	CHECKF(stat(made, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == NOBODY && (st.st_mode & 07777) == 0700,
	       "%s is not nobody's 0700 directory", made);
	/* root's directory is left as it was */
	CHECK(stat(taken, &st) == 0 && st.st_uid == 0 && (st.st_mode & 07777) == 0700);
	CHECK_EQ(it_count_entries(taken), 0);
	ping(nsock);
	it_daemon_stop(d);
	printf("a non-root shim whose default state dir was taken used %s\n", made);
	return 0;
}

/* A crashed daemon's mount files (the rclone config with its keys, the log, the cache)
 * are removed at start; a live daemon's (its runtime dir flock()ed) are left. */
static int case_mount_sweep(void)
{
	const char *state = it_path("state");
	char mounts[300], dead[340], held[340], p[400];
	snprintf(mounts, sizeof(mounts), "%s/mounts", state);
	snprintf(dead, sizeof(dead), "%s/0b9e-dead", mounts);
	snprintf(held, sizeof(held), "%s/0b9e-held", mounts);
	CHECK(mkdir(state, 0700) == 0 && mkdir(mounts, 0700) == 0 && mkdir(dead, 0700) == 0 && mkdir(held, 0700) == 0);
	const char *names[] = {"rclone.conf", "rclone.log", "cache"};
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", dead, names[i]);
		if (i < 2) {
			it_write_file(p, "secret_access_key = s3cr3t\n");
		} else {
			CHECK(mkdir(p, 0700) == 0);
			snprintf(p, sizeof(p), "%s/cache/vfs-file", dead);
			it_write_file(p, "cached bytes");
		}
		snprintf(p, sizeof(p), "%s/%s", held, names[i]);
		it_write_file(p, "secret_access_key = live\n");
	}
	int lock = open(held, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0);
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", state, NULL);
	struct stat st;
	CHECKF(lstat(dead, &st) < 0 && errno == ENOENT, "%s is still there", dead);
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", held, names[i]);
		CHECKF(lstat(p, &st) == 0, "%s of a live mount was removed", p);
	}
	char *log = it_daemon_log(d);
	char want[600];
	snprintf(want, sizeof(want), "mount: removed %s, left by a mount of a daemon that is gone", dead);
	CHECK_CONTAINS(log, want);
	CHECK_CONTAINS(log, "warn: removed the files of 1 mount left by a daemon that is gone");
	free(log);
	ping(sock);
	close(lock);
	return 0;
}

/* The value of the "Max core file size" line of /proc/PID/limits: soft and hard. */
static void core_limit(pid_t pid, char *soft, char *hard)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	soft[0] = hard[0] = '\0';
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Max core file size", 18) == 0)
			CHECK(sscanf(line + 18, "%31s %31s", soft, hard) == 2);
	fclose(f);
}

/* No core dumps of the shim (soft RLIMIT_CORE 0), but a command gets the limit the
 * shim was started with; the shim is not dumpable: its /proc files are root's, and
 * nobody, the shim's own uid, cannot read its environment. */
static int case_no_dumps(void)
{
	if (!have_setpriv())
		return 0;
	CHECK(chmod(it_dir(), 0711) == 0);
	it_keep_core_limit();
	const char *sock = it_path("s");
	const char *argv[] = {"prlimit", "--core=12345:unlimited", SHIM_BIN, "--listen", it_unix_target(sock), NULL};
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	char soft[32], hard[32];
	core_limit(d->pid, soft, hard);
	CHECKF(strcmp(soft, "0") == 0 && strcmp(hard, "unlimited") == 0, "the shim's core limit is %s %s", soft, hard);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	static const char *const sleep_argv[] = {"sleep", "100", NULL};
	eo.argv = sleep_argv;
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	core_limit((pid_t)pi.pid, soft, hard);
	CHECKF(strcmp(soft, "12345") == 0 && strcmp(hard, "unlimited") == 0, "a command's core limit is %s %s", soft,
	       hard);
	CHECK_SBX(sbx_rmproc(c, NULL, pi.id, 1, &err), &err);
	sbx_client_close(c);
	it_daemon_stop(d);

	/* run as nobody: its /proc/PID/environ is root's, and nobody cannot read it */
	const char *nsock = it_path("n.sock");
	CHECK(chown(it_dir(), 0, 0) == 0);
	const char *ndir = it_path("ndir");
	CHECK(mkdir(ndir, 0700) == 0 && chown(ndir, NOBODY, NOBODY) == 0);
	char sockpath[300], statedir[300];
	snprintf(sockpath, sizeof(sockpath), "%s/s.sock", ndir);
	snprintf(statedir, sizeof(statedir), "%s/state", ndir);
	(void)nsock;
	const char *nargv[] = {"setpriv",  "--reuid=65534",          "--regid=65534", "--clear-groups", SHIM_BIN,
			       "--listen", it_unix_target(sockpath), "--state-dir",   statedir,         NULL};
	struct it_daemon *n = it_daemon_start_argv("nobody", nargv);
	char env[64];
	snprintf(env, sizeof(env), "/proc/%d/environ", (int)n->pid);
	struct stat st;
	CHECK(stat(env, &st) == 0);
	CHECKF(st.st_uid == 0, "/proc/PID/environ of the nobody shim belongs to uid %u", (unsigned)st.st_uid);
	pid_t r = fork();
	CHECK(r >= 0);
	if (r == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		dup2(null, 2);
		execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", env,
		      (char *)NULL);
		_exit(127);
	}
	int ws;
	CHECK(waitpid(r, &ws, 0) == r);
	CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "nobody's cat of the shim's environ: status 0x%x", ws);
	ping(sockpath);
	it_daemon_stop(n);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"shared_socket_dir", case_shared_socket_dir},
		{"taken_default", case_taken_default},
		{"mount_sweep", case_mount_sweep},
		{"no_dumps", case_no_dumps},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
