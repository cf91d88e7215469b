/* it_snapshot.c: snapshot_prepare and resumed (PROTOCOL.md 12.6): the generation in
 * HELLO_OK and info, bad input, stopping background commands, the clock (through the
 * test seam: no case ever sets this machine's clock), entropy, and FIFREEZE of an ext4
 * image loop-mounted in the daemon's private mount namespace. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SPRINTF(buf, ...) CHECK(snprintf(buf, sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))
#define OK(call) CHECK_SBX(call, &err_)

static struct sbx_error err_;
static char seam[PATH_MAX];

/* Every daemon of this program "sets" the clock into a file of the case's temp dir
 * (the seam), never for real. */
static void seam_set(void)
{
	snprintf(seam, sizeof(seam), "%s", it_path("clock-seam"));
	CHECK(setenv("SANDBOX_SHIM_TEST_CLOCK_FILE", seam, 1) == 0);
}

static struct sbx_client *start(void)
{
	seam_set();
	const char *sock = it_path("shim.sock");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	return it_connect(it_unix_target(sock), NULL);
}

static const struct sbx_snapshot_step *find_step(const struct sbx_snapshot_result *r, const char *name)
{
	for (size_t i = 0; r->steps[i] != NULL; i++)
		if (strcmp(r->steps[i]->name, name) == 0)
			return r->steps[i];
	return NULL;
}

static int resumed(struct sbx_client *c, int64_t sec, uint32_t nsec, size_t entropy_len, struct sbx_snapshot_result *r)
{
	static unsigned char e[1024];
	it_fill(e, sizeof(e), 7);
	struct sbx_resumed_opts ro = SBX_RESUMED_OPTS_INIT;
	ro.time_sec = sec;
	ro.time_nsec = nsec;
	ro.entropy = e;
	ro.entropy_len = entropy_len;
	return sbx_resumed(c, NULL, &ro, r, &err_);
}

static time_t now_s(void)
{
	return time(NULL);
}

/* The state letter of /proc/PID/stat ('R', 'S', 'D', 'T', ...), 0 when gone. */
static char proc_state(unsigned pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	return p != NULL && p[1] == ' ' ? p[2] : 0;
}

static void wait_state(unsigned pid, char want, unsigned timeout_ms)
{
	uint64_t end = it_now_ms() + timeout_ms;
	char s;
	while ((s = proc_state(pid)) != want) {
		CHECKF(it_now_ms() < end, "process %u: state %c, want %c", pid, s ? s : '-', want);
		it_sleep_ms(10);
	}
}

static int case_generation(void)
{
	struct sbx_client *c = start();
	CHECK_EQ(sbx_client_server(c)->generation, 0);
	struct sbx_info in = SBX_INFO_INIT;
	OK(sbx_info(c, NULL, &in, &err_));
	CHECK_EQ(in.generation, 0);
	CHECK(sbx_client_has_feature(c, "snapshot"));

	/* resumed without a prepare: works, nothing to undo */
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(resumed(c, 0, 0, 64, &r));
	CHECK_EQ(r.generation, 1);
	CHECK_EQ(r.prepared, 0);
	CHECK(find_step(&r, "thaw") == NULL);
	sbx_snapshot_result_free(&r);
	sbx_snapshot_result_free(&r); /* safe twice */

	/* prepare, a second prepare (EBUSY), resumed undoes it */
	OK(sbx_snapshot_prepare(c, NULL, NULL, &r, &err_));
	CHECK_EQ(r.generation, 1);
	CHECK_EQ(r.thaw_after_ms, 30000);
	CHECK(find_step(&r, "sync") != NULL);
	CHECK(r.frozen != NULL && r.frozen[0] == NULL);
	sbx_snapshot_result_free(&r);
	CHECK(sbx_snapshot_prepare(c, NULL, NULL, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EBUSY);
	OK(resumed(c, 0, 0, 32, &r));
	CHECK_EQ(r.generation, 2);
	CHECK_EQ(r.prepared, 1);
	sbx_snapshot_result_free(&r);

	/* a new connection's HELLO_OK, and info, tell the generation */
	struct sbx_client *c2 = it_connect(it_unix_target(it_path("shim.sock")), NULL);
	CHECK_EQ(sbx_client_server(c2)->generation, 2);
	OK(sbx_info(c2, NULL, &in, &err_));
	CHECK_EQ(in.generation, 2);
	/* a fork is a resume too */
	struct sbx_resumed_opts ro = SBX_RESUMED_OPTS_INIT;
	ro.fork = 1;
	OK(sbx_resumed(c2, NULL, &ro, &r, &err_));
	CHECK_EQ(r.generation, 3);
	sbx_snapshot_result_free(&r);
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

static void expect_einval(struct sbx_client *c, int64_t sec, uint32_t nsec, size_t elen, const char *msg)
{
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	CHECKF(resumed(c, sec, nsec, elen, &r) < 0, "resumed(%lld, %u, %zu) succeeded", (long long)sec, nsec, elen);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err_.message, msg);
	sbx_snapshot_result_free(&r);
}

static int case_bad_input(void)
{
	struct sbx_client *c = start();
	time_t now = now_s();
	expect_einval(c, -1, 0, 64, "before 1970");
	expect_einval(c, now, 1000000000u, 64, "nsec");
	expect_einval(c, now + 11LL * 366 * 86400, 0, 64, "10 years ahead");
	expect_einval(c, now, 1, 0, "entropy: 0 bytes");
	expect_einval(c, now, 1, 31, "entropy: 31 bytes");
	expect_einval(c, now, 1, 513, "entropy: 513 bytes");
	/* nothing of that counted */
	struct sbx_info in = SBX_INFO_INIT;
	OK(sbx_info(c, NULL, &in, &err_));
	CHECK_EQ(in.generation, 0);
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(resumed(c, 0, 0, 512, &r));
	CHECK_EQ(r.generation, 1);
	sbx_snapshot_result_free(&r);

	/* prepare: options out of range, a path that is no mount point, and / */
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	so.thaw_after_ms = 50;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err_.message, "thaw_after_ms");
	so.thaw_after_ms = 0;
	so.flush_timeout_ms = 600001;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EINVAL);
	so.flush_timeout_ms = 0;
	const char *notmp[] = {it_dir(), NULL};
	so.freeze = notmp;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err_.message, "not a mount point");
	CHECK_EQ(strcmp(err_.path, it_dir()), 0);
	const char *root[] = {"/", NULL};
	so.freeze = root;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EBUSY);
	CHECK_CONTAINS(err_.message, "root filesystem");
	const char *missing[] = {it_path("nope"), NULL};
	so.freeze = missing;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, ENOENT);
	/* the struct_size rule (sdk/ABI.md): refused before anything is sent */
	struct sbx_snapshot_opts bad = SBX_SNAPSHOT_OPTS_INIT;
	bad.struct_size = 0;
	CHECK(sbx_snapshot_prepare(c, NULL, &bad, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_LOCAL, EINVAL);
	struct sbx_snapshot_result bad_r = SBX_SNAPSHOT_RESULT_INIT;
	bad_r.struct_size = 0;
	CHECK(sbx_snapshot_prepare(c, NULL, NULL, &bad_r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_LOCAL, EINVAL);
	struct sbx_resumed_opts bad_ro = SBX_RESUMED_OPTS_INIT;
	bad_ro.struct_size = 1;
	CHECK(sbx_resumed(c, NULL, &bad_ro, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_LOCAL, EINVAL);
	/* after every refusal nothing is held: a prepare goes through */
	OK(sbx_snapshot_prepare(c, NULL, NULL, &r, &err_));
	sbx_snapshot_result_free(&r);
	OK(resumed(c, 0, 0, 64, &r));
	CHECK_EQ(r.prepared, 1);
	sbx_snapshot_result_free(&r);
	sbx_client_close(c);
	return 0;
}

static int case_stop(void)
{
	struct sbx_client *c = start();
	const char *argv[] = {"sleep", "1000", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	eo.name = "bg";
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	OK(sbx_spawn(c, NULL, &eo, &pi, &err_));
	wait_state(pi.pid, 'S', 10000);
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	so.stop_background = 1;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_));
	const struct sbx_snapshot_step *s = find_step(&r, "stop");
	CHECK(s != NULL);
	CHECK_EQ(s->count, 1);
	CHECK(r.stopped[0] != NULL && strcmp(r.stopped[0], "bg") == 0 && r.stopped[1] == NULL);
	sbx_snapshot_result_free(&r);
	wait_state(pi.pid, 'T', 10000);
	OK(resumed(c, 0, 0, 64, &r));
	s = find_step(&r, "continue");
	CHECK(s != NULL);
	CHECK_EQ(s->count, 1);
	sbx_snapshot_result_free(&r);
	wait_state(pi.pid, 'S', 10000);
	OK(sbx_kill(c, NULL, "bg", SIGKILL, &err_));
	sbx_client_close(c);
	return 0;
}

static bool root_only(void)
{
	if (geteuid() != 0) {
		printf("needs root: skipped\n");
		return false;
	}
	return true;
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return NULL;
	static char buf[4096];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* The clock path as root (CAP_SYS_TIME): through the seam, never clock_settime. */
static int case_clock_seam(void)
{
	if (!root_only())
		return IT_SKIP;
	struct sbx_client *c = start();
	/* first with this host's time, now (0, 0): should the seam not be in place, that
	 * would set the clock to what it is; only then a time that is off */
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(resumed(c, 0, 0, 64, &r));
	const struct sbx_snapshot_step *s = find_step(&r, "clock");
	CHECK(s != NULL);
	CHECKF(s->error == 0 && strstr(s->message, "test seam") != NULL, "clock: %s: %s", sbx_errno_name(s->error),
	       s->message);
	sbx_snapshot_result_free(&r);
	CHECK(unlink(seam) == 0);
	time_t before = now_s();
	int64_t want = (int64_t)before + 86400;
	OK(resumed(c, want, 123, 64, &r));
	s = find_step(&r, "clock");
	CHECK(s != NULL);
	CHECKF(s->error == 0, "clock: %s: %s", sbx_errno_name(s->error), s->message);
	CHECK_CONTAINS(s->message, "test seam");
	/* the host's time is a day ahead of the guest's */
	CHECKF(r.clock_delta_ns > 86000LL * 1000000000 && r.clock_delta_ns < 86401LL * 1000000000, "delta %lld",
	       (long long)r.clock_delta_ns);
	sbx_snapshot_result_free(&r);
	char line[64];
	snprintf(line, sizeof(line), "%lld 123\n", (long long)want);
	const char *got = read_all(seam);
	CHECKF(got != NULL && strcmp(got, line) == 0, "seam file: %s", got ? got : "(missing)");
	/* and this machine's clock did not move */
	CHECK(llabs((long long)(now_s() - before)) < 600);
	sbx_client_close(c);
	return 0;
}

/* As nobody without capabilities: EPERM in the result, the request succeeds. */
static int case_clock_eperm(void)
{
	if (!root_only() || access("/usr/bin/setpriv", X_OK) != 0)
		return IT_SKIP;
	seam_set();
	CHECK(chmod(it_dir(), 0711) == 0);
	char home[PATH_MAX], state[PATH_MAX], sock[PATH_MAX], target[PATH_MAX + 8];
	SPRINTF(home, "%s", it_path("nobody"));
	CHECK(mkdir(home, 0700) == 0 && chown(home, 65534, 65534) == 0);
	SPRINTF(state, "%s/state", home);
	SPRINTF(sock, "%s/s.sock", home);
	SPRINTF(target, "unix:%s", sock);
	const char *argv[] = {"setpriv",
			      "--reuid=65534",
			      "--regid=65534",
			      "--clear-groups",
			      "--inh-caps=-all",
			      "--bounding-set=-all",
			      SHIM_BIN,
			      "--listen",
			      target,
			      "--state-dir",
			      state,
			      NULL};
	it_daemon_start_argv("shim", argv);
	struct sbx_client *c = it_connect(target, NULL);
	/* first with this host's time, now: EPERM there before any time that is off */
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(resumed(c, 0, 0, 64, &r));
	const struct sbx_snapshot_step *s = find_step(&r, "clock");
	CHECK(s != NULL);
	CHECK_EQ(s->error, EPERM);
	sbx_snapshot_result_free(&r);
	OK(resumed(c, now_s() + 3600, 0, 64, &r));
	s = find_step(&r, "clock");
	CHECK(s != NULL);
	CHECK_EQ(s->error, EPERM);
	CHECK_CONTAINS(s->message, "CAP_SYS_TIME");
	s = find_step(&r, "entropy");
	CHECK(s != NULL);
	CHECK_EQ(s->error, EPERM);
	CHECK_EQ(s->count, 0);
	CHECK_EQ(r.generation, 2);
	sbx_snapshot_result_free(&r);
	/* the seam was never reached */
	CHECK(access(seam, F_OK) != 0);
	sbx_client_close(c);
	return 0;
}

static int case_entropy(void)
{
	if (!root_only())
		return IT_SKIP;
	struct sbx_client *c = start();
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(resumed(c, 0, 0, 256, &r));
	const struct sbx_snapshot_step *s = find_step(&r, "entropy");
	CHECK(s != NULL);
	CHECKF(s->error == 0, "entropy: %s: %s", sbx_errno_name(s->error), s->message);
	CHECK_EQ(s->count, 256 * 8);
	sbx_snapshot_result_free(&r);
	/* the kernel's pool is there and full (kernels since 5.18 always say 256) */
	const char *avail = read_all("/proc/sys/kernel/random/entropy_avail");
	CHECK(avail != NULL && atoi(avail) > 0);
	sbx_client_close(c);
	return 0;
}

/* ---- FIFREEZE: an ext4 image, loop-mounted in the daemon's own mount namespace ---- */

static char mnt[PATH_MAX], mnt2[PATH_MAX];
static struct it_daemon *frozen_daemon;

static int shell(const char *cmd)
{
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Start the daemon with the image at mnt and a tmpfs at mnt2; state_in_mnt: its
 * state directory on the image. Skips when loop mounts are impossible here. */
static struct sbx_client *start_frozen_world(bool state_in_mnt, bool log_in_mnt, bool *skip)
{
	*skip = false;
	seam_set();
	if (!root_only() || access("/usr/bin/unshare", X_OK) != 0) {
		*skip = true;
		return NULL;
	}
	char img[PATH_MAX], cmd[PATH_MAX * 3], state[PATH_MAX];
	SPRINTF(img, "%s", it_path("ext4.img"));
	SPRINTF(mnt, "%s", it_path("mnt"));
	SPRINTF(mnt2, "%s", it_path("mnt2"));
	CHECK(mkdir(mnt, 0755) == 0 && mkdir(mnt2, 0755) == 0);
	SPRINTF(cmd, "truncate -s 32M '%s' && mkfs.ext4 -q -F '%s' >/dev/null 2>&1", img, img);
	if (shell(cmd) != 0) {
		printf("mkfs.ext4 failed: skipped\n");
		*skip = true;
		return NULL;
	}
	SPRINTF(cmd, "unshare -m --propagation private sh -c 'mount -o loop \"$0\" \"$1\"' '%s' '%s' 2>/dev/null", img,
		mnt);
	if (shell(cmd) != 0) {
		printf("cannot loop-mount an ext4 image in a private mount namespace: skipped\n");
		*skip = true;
		return NULL;
	}
	if (state_in_mnt)
		SPRINTF(state, "%s/state", mnt);
	else
		SPRINTF(state, "%s", it_path("state"));
	const char *sock = it_path("shim.sock");
	char log[PATH_MAX];
	SPRINTF(log, "%s/shim.log", mnt);
	const char *argv[] = {
		"unshare",
		"-m",
		"--propagation",
		"private",
		"/bin/sh",
		"-c",
		"mount -o loop \"$0\" \"$1\" && mkdir -p \"$1/sub\" && mount -t tmpfs -o size=1m tmpfs \"$2\" "
		"&& shift 2 && exec \"$@\"",
		img,
		mnt,
		mnt2,
		SHIM_BIN,
		"--listen",
		it_unix_target(sock),
		"--state-dir",
		state,
		log_in_mnt ? "--log-file" : NULL,
		log,
		NULL};
	if (!log_in_mnt) {
		frozen_daemon = it_daemon_start_argv("shim", argv);
		return it_connect(it_unix_target(sock), NULL);
	}
	/* its log is not on stderr: ready once the socket is there */
	frozen_daemon = it_daemon_spawn_argv("shim", argv);
	uint64_t end = it_now_ms() + 10000;
	struct stat st;
	while (stat(sock, &st) != 0) {
		CHECKF(it_now_ms() < end, "no socket %s", sock);
		it_sleep_ms(10);
	}
	return it_connect(it_unix_target(sock), NULL);
}

/* A detached writer of FILE on the image; its pid. */
static unsigned start_writer(struct sbx_client *c, const char *name, const char *file)
{
	char script[PATH_MAX + 64];
	SPRINTF(script, "echo hello > '%s'", file);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = script;
	eo.name = name;
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	OK(sbx_spawn(c, NULL, &eo, &pi, &err_));
	return pi.pid;
}

static void expect_written(struct sbx_client *c, const char *id, const char *file)
{
	struct sbx_exit ex = SBX_EXIT_INIT;
	OK(sbx_wait(c, NULL, id, &ex, &err_));
	CHECK_EQ(ex.exit_code, 0);
	char *data = NULL;
	size_t len = 0;
	OK(sbx_read_file_alloc(c, NULL, file, 64, (void **)&data, &len, &err_));
	CHECK(len == 6 && memcmp(data, "hello\n", 6) == 0);
	free(data);
}

static int case_freeze(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(false, false, &skip);
	if (skip)
		return IT_SKIP;
	char file[PATH_MAX];
	SPRINTF(file, "%s/f", mnt);
	const char *fz[] = {mnt, mnt, NULL}; /* the same filesystem twice: frozen once */
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	so.freeze = fz;
	so.thaw_after_ms = 600000;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_));
	CHECK(r.frozen[0] != NULL && strcmp(r.frozen[0], mnt) == 0 && r.frozen[1] == NULL);
	const struct sbx_snapshot_step *s = find_step(&r, "freeze");
	CHECK(s != NULL && strcmp(s->path, mnt) == 0 && s->error == 0);
	sbx_snapshot_result_free(&r);
	/* a write blocks while frozen */
	unsigned pid = start_writer(c, "w", file);
	wait_state(pid, 'D', 10000);
	/* resumed thaws: the write completes */
	OK(resumed(c, 0, 0, 64, &r));
	CHECK_EQ(r.prepared, 1);
	s = find_step(&r, "thaw");
	CHECKF(s != NULL && s->error == 0 && strcmp(s->path, mnt) == 0, "thaw: %s", s ? s->message : "missing");
	sbx_snapshot_result_free(&r);
	expect_written(c, "w", file);
	sbx_client_close(c);
	return 0;
}

static int case_auto_thaw(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(false, false, &skip);
	if (skip)
		return IT_SKIP;
	char file[PATH_MAX];
	SPRINTF(file, "%s/g", mnt);
	const char *fz[] = {mnt, NULL};
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	so.freeze = fz;
	so.thaw_after_ms = 1500;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_));
	CHECK_EQ(r.thaw_after_ms, 1500);
	sbx_snapshot_result_free(&r);
	unsigned pid = start_writer(c, "w", file);
	wait_state(pid, 'D', 10000);
	/* no resumed: the automatic thaw lets the write finish */
	expect_written(c, "w", file);
	/* and the prepare is over: a resumed has nothing to undo, a prepare goes through */
	OK(resumed(c, 0, 0, 64, &r));
	CHECK_EQ(r.prepared, 0);
	CHECK(find_step(&r, "thaw") == NULL);
	sbx_snapshot_result_free(&r);
	OK(sbx_snapshot_prepare(c, NULL, NULL, &r, &err_));
	sbx_snapshot_result_free(&r);
	OK(resumed(c, 0, 0, 64, &r));
	sbx_snapshot_result_free(&r);
	sbx_client_close(c);
	return 0;
}

/* Refusals leave nothing frozen: not a mount point, a filesystem that cannot be frozen
 * after one that was (thawed again), the state directory's filesystem. */
static int case_freeze_refused(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(false, false, &skip);
	if (skip)
		return IT_SKIP;
	char sub[PATH_MAX], file[PATH_MAX];
	SPRINTF(sub, "%s/sub", mnt);
	SPRINTF(file, "%s/h", mnt);
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	const char *a[] = {mnt, sub, NULL};
	so.freeze = a;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err_.message, "not a mount point");
	const char *b[] = {mnt, mnt2, NULL}; /* ext4 frozen first, then tmpfs refuses */
	so.freeze = b;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EOPNOTSUPP);
	CHECK_EQ(strcmp(err_.path, mnt2), 0);
	/* nothing is frozen: a write goes through at once */
	OK(sbx_write_file_buf(c, NULL, file, 0, 0644, "hello\n", 6, NULL, &err_));
	sbx_client_close(c);
	return 0;
}

static int case_freeze_state(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(true, false, &skip);
	if (skip)
		return IT_SKIP;
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	const char *a[] = {mnt, NULL};
	so.freeze = a;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EBUSY);
	CHECK_CONTAINS(err_.message, "state directory");
	char file[PATH_MAX];
	SPRINTF(file, "%s/i", mnt);
	OK(sbx_write_file_buf(c, NULL, file, 0, 0644, "hello\n", 6, NULL, &err_));
	sbx_client_close(c);
	return 0;
}

/* SIGTERM while frozen: the shim thaws first, so a blocked writer finishes and the
 * daemon exits 0 (the sandbox is never left frozen). */
static int case_shutdown_thaw(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(false, false, &skip);
	if (skip)
		return IT_SKIP;
	char file[PATH_MAX];
	SPRINTF(file, "%s/s", mnt);
	const char *fz[] = {mnt, NULL};
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	so.freeze = fz;
	so.thaw_after_ms = 600000;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	OK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_));
	sbx_snapshot_result_free(&r);
	unsigned pid = start_writer(c, "w", file);
	wait_state(pid, 'D', 10000);
	sbx_client_close(c);
	struct it_daemon *d = frozen_daemon;
	int st = it_daemon_stop(d);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	char *log = it_daemon_log(d);
	CHECK_CONTAINS(log, "snapshot: shutdown: thawing 1 filesystem(s)");
	CHECK_CONTAINS(log, "snapshot: thawed ");
	free(log);
	return 0;
}

/* Every connection reset at once, as a microVM snapshot does to vsock: the listeners
 * (unix and tcp here) stay and serve new clients. */
static int case_reset_all(void)
{
	seam_set();
	const char *sock = it_path("shim.sock");
	it_write_file(it_path("token"), "tok\n");
	struct it_daemon *d = it_daemon_start("shim", "--listen", "tcp:127.0.0.1:0", "--listen", it_unix_target(sock),
					      "--token-file", it_path("token"), NULL);
	const char *tcp = it_tcp_target(it_daemon_tcp_port(d));
	const char *unix_t = it_unix_target(sock);
	enum { N = 8 };
	struct sbx_client *cs[2 * N];
	struct sbx_proc *ps[2 * N];
	for (int i = 0; i < 2 * N; i++) {
		cs[i] = it_connect(i % 2 ? tcp : unix_t, "tok");
		/* each with a stream in flight */
		const char *argv[] = {"sleep", "1000", NULL};
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.argv = argv;
		OK(sbx_exec_start(cs[i], NULL, &eo, 0, &ps[i], &err_));
	}
	struct sbx_client *obs = it_connect(unix_t, "tok");
	struct sbx_info in = SBX_INFO_INIT;
	OK(sbx_info(obs, NULL, &in, &err_));
	CHECK_EQ(in.connections, 2 * N + 1);
	/* a reset, not a close: SO_LINGER 0 makes the kernel send RST on tcp */
	for (int i = 0; i < 2 * N; i++) {
		struct linger lg = {1, 0};
		setsockopt(sbx_client_fd(cs[i]), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		shutdown(sbx_client_fd(cs[i]), SHUT_RDWR);
	}
	for (int i = 0; i < 2 * N; i++) {
		sbx_proc_free(ps[i]);
		sbx_client_close(cs[i]);
	}
	uint64_t end = it_now_ms() + 10000;
	for (;;) {
		OK(sbx_info(obs, NULL, &in, &err_));
		if (in.connections == 1 && in.processes == 0)
			break;
		CHECKF(it_now_ms() < end, "%u connections, %u processes left", in.connections, in.processes);
		it_sleep_ms(20);
	}
	sbx_client_close(obs);
	/* new clients on both listeners, and a resumed on one of them */
	for (int i = 0; i < 2; i++) {
		struct sbx_client *c = it_connect(i ? tcp : unix_t, "tok");
		struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
		OK(resumed(c, 0, 0, 64, &r));
		CHECK_EQ(r.generation, (unsigned)i + 1);
		sbx_snapshot_result_free(&r);
		CHECK_EQ(sbx_client_server(c)->generation, (unsigned)i);
		sbx_client_close(c);
	}
	return 0;
}

/* Nor the filesystem of its --log-file: the event loop writes the log. */
static int case_freeze_log(void)
{
	bool skip;
	struct sbx_client *c = start_frozen_world(false, true, &skip);
	if (skip)
		return IT_SKIP;
	struct sbx_snapshot_opts so = SBX_SNAPSHOT_OPTS_INIT;
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	const char *a[] = {mnt, NULL};
	so.freeze = a;
	CHECK(sbx_snapshot_prepare(c, NULL, &so, &r, &err_) < 0);
	CHECK_ERR(&err_, SBX_ERR_REMOTE, EBUSY);
	CHECK_CONTAINS(err_.message, "shim's log");
	char file[PATH_MAX];
	SPRINTF(file, "%s/j", mnt);
	OK(sbx_write_file_buf(c, NULL, file, 0, 0644, "hello\n", 6, NULL, &err_));
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"generation", case_generation},
		{"bad_input", case_bad_input},
		{"stop", case_stop},
		{"clock_seam", case_clock_seam},
		{"clock_eperm", case_clock_eperm},
		{"entropy", case_entropy},
		{"freeze", case_freeze},
		{"auto_thaw", case_auto_thaw},
		{"freeze_refused", case_freeze_refused},
		{"freeze_state", case_freeze_state},
		{"freeze_log", case_freeze_log},
		{"shutdown_thaw", case_shutdown_thaw},
		{"reset_all", case_reset_all},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
