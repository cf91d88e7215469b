/* it_mount.c: S3 bucket mounts against a real S3 server (npm s3rver on loopback), checked with rclone
 * straight against the bucket: writes through the shim and through commands, reads of objects put
 * from outside, read-only and prefix mounts, refused keys, a missing bucket, a dead server, secrets
 * kept out of every argv and environment, rclone killed or stopped, unmount, shutdown, and every
 * validation error. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

/* ---- the S3 server ---- */

static char endpoint_[128];
static struct it_daemon *s3_;

static const char *npm_dir(void)
{
	static char buf[1024];
	const char *d = getenv("SBX_NPM_DIR");
	if (d != NULL && d[0] != '\0')
		snprintf(buf, sizeof(buf), "%s", d);
	else
		snprintf(buf, sizeof(buf), "%s/.cache/sandbox-shim/npm", getenv("HOME") ? getenv("HOME") : "/root");
	return buf;
}

/* Run a bash snippet with tests/lib/s3rver.sh sourced and S3_ENDPOINT set; stdout into
 * out (may be NULL). Returns the exit status. */
static int s3sh(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int s3sh(char *out, size_t size, const char *fmt, ...)
{
	char body[4096], cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "bash -c 'source %s && export S3_ENDPOINT=%s && %s' 2>%s", S3RVER_SH, endpoint_,
		 body, it_path("s3sh.err"));
	FILE *f = popen(cmd, "r");
	CHECKF(f != NULL, "popen: %s", strerror(errno));
	size_t n = 0;
	if (out != NULL && size > 0) {
		n = fread(out, 1, size - 1, f);
		out[n] = '\0';
	}
	char sink[4096];
	while (fread(sink, 1, sizeof(sink), f) > 0)
		;
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Start s3rver with bucket "bkt" (installed on the way if it is not there: the test
 * fails loudly when it cannot be had). */
static void s3_start(void)
{
	char bin[1200];
	snprintf(bin, sizeof(bin), "%s/node_modules/.bin/s3rver", npm_dir());
	if (access(bin, X_OK) != 0) {
		char cmd[2048];
		snprintf(cmd, sizeof(cmd), "bash -c 'source %s && s3rver_install' >&2", S3RVER_SH);
		CHECKF(system(cmd) == 0 && access(bin, X_OK) == 0,
		       "s3rver is not installed and could not be (run: source tests/lib/s3rver.sh; s3rver_install)");
	}
	CHECKF(system("command -v rclone >/dev/null && command -v fusermount3 >/dev/null") == 0,
	       "rclone and fusermount3 are needed (apt-get install rclone fuse3)");
	const char *data = it_path("s3data");
	CHECK(mkdir(data, 0700) == 0);
	const char *argv[] = {"sh",
			      "-c",
			      "exec \"$0\" -d \"$1\" -a 127.0.0.1 -p 0 --no-vhost-buckets --configure-bucket bkt "
			      "--configure-bucket other >&2",
			      bin,
			      data,
			      NULL};
	s3_ = it_daemon_spawn_argv("s3rver", argv);
	it_daemon_wait_log(s3_, "S3rver listening on", 30000);
	char *log = it_daemon_log(s3_);
	const char *p = strstr(log, "S3rver listening on 127.0.0.1:");
	CHECK(p != NULL);
	unsigned port = (unsigned)atoi(p + strlen("S3rver listening on 127.0.0.1:"));
	free(log);
	CHECK(port > 0);
	snprintf(endpoint_, sizeof(endpoint_), "http://127.0.0.1:%u", port);
	/* answering S3 requests */
	uint64_t end = it_now_ms() + 20000;
	while (s3sh(NULL, 0, "s3_rclone lsd s3:") != 0) {
		CHECKF(it_now_ms() < end, "s3rver does not answer on %s", endpoint_);
		it_sleep_ms(100);
	}
}

/* Object key's content through rclone, straight from the bucket (NULL: no such object). */
static char *s3_cat(const char *key)
{
	static char buf[4 << 20];
	int rc = s3sh(buf, sizeof(buf), "s3_rclone cat s3:bkt/%s", key);
	return rc == 0 ? buf : NULL;
}

/* Whether the bucket has an object with exactly this key. */
static bool s3_has(const char *key)
{
	static char buf[1 << 16];
	CHECK(s3sh(buf, sizeof(buf), "s3_rclone lsf -R --files-only s3:bkt") == 0);
	size_t kl = strlen(key);
	for (const char *l = buf; *l != '\0';) {
		const char *nl = strchr(l, '\n');
		size_t len = nl != NULL ? (size_t)(nl - l) : strlen(l);
		if (len == kl && memcmp(l, key, kl) == 0)
			return true;
		l += len + (nl != NULL);
	}
	return false;
}

static void s3_put(const char *key, const char *content)
{
	CHECKF(s3sh(NULL, 0, "printf %%s \"%s\" | s3_rclone rcat s3:bkt/%s", content, key) == 0, "rcat %s failed", key);
}

/* Wait for an object to hold want (uploads are asynchronous until unmount). */
static void s3_wait(const char *key, const char *want, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	for (;;) {
		const char *got = s3_cat(key);
		if (got != NULL && strcmp(got, want) == 0)
			return;
		CHECKF(it_now_ms() < end, "object %s holds '%s', want '%s'", key, got ? got : "(none)", want);
		it_sleep_ms(100);
	}
}

/* ---- the shim ---- */

static struct it_daemon *shim_;
static struct sbx_client *c_;

static struct sbx_client *start_shim(void)
{
	const char *sock = it_path("shim.sock");
	shim_ = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
				"--log-level", "debug", NULL);
	c_ = it_connect(it_unix_target(sock), NULL);
	return c_;
}

static void stop_all(void)
{
	if (c_ != NULL)
		sbx_client_close(c_);
	c_ = NULL;
	if (shim_ != NULL && !shim_->exited) {
		/* a clean exit: every mount undone, nothing leaked (under ASan) */
		int st = it_daemon_stop(shim_);
		CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the shim exited with status 0x%x", (unsigned)st);
	}
	if (s3_ != NULL && !s3_->exited)
		it_daemon_stop(s3_);
}

static struct sbx_mount_opts opts_(const char *key, const char *secret)
{
	struct sbx_mount_opts mo = SBX_MOUNT_OPTS_INIT;
	mo.endpoint = endpoint_;
	mo.access_key_id = key;
	mo.secret_access_key = secret;
	return mo;
}

static void keep(char buf[1024], const char *p)
{
	snprintf(buf, 1024, "%s", p);
}

/* The fstype of the topmost mount at path ("" when none). */
static const char *fstype_at(const char *path)
{
	static char type[64];
	type[0] = '\0';
	FILE *f = fopen("/proc/self/mountinfo", "r");
	CHECK(f != NULL);
	char line[8192];
	while (fgets(line, sizeof(line), f) != NULL) {
		char mp[4096], fs[64];
		const char *dash = strstr(line, " - ");
		if (dash == NULL || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 ||
		    sscanf(dash + 3, "%63s", fs) != 1)
			continue;
		if (strcmp(mp, path) == 0)
			snprintf(type, sizeof(type), "%s", fs);
	}
	fclose(f);
	return type;
}

/* Mounts of a FUSE filesystem at path, at any depth of the stack. */
static int fuse_mounts_at(const char *path)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	CHECK(f != NULL);
	char line[8192];
	int n = 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		char mp[4096], fs[64];
		const char *dash = strstr(line, " - ");
		if (dash != NULL && sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1 &&
		    sscanf(dash + 3, "%63s", fs) == 1 && strcmp(mp, path) == 0 && strncmp(fs, "fuse", 4) == 0)
			n++;
	}
	fclose(f);
	return n;
}

/* MOVE_MOUNT_BENEATH (Linux 6.5): the dead FUSE mount is swapped out, not just covered */
static bool kernel_at_least(int major, int minor)
{
	struct utsname u;
	int a = 0, b = 0;
	return uname(&u) == 0 && sscanf(u.release, "%d.%d", &a, &b) == 2 && (a > major || (a == major && b >= minor));
}

static bool alive(pid_t pid)
{
	if (kill(pid, 0) != 0)
		return false;
	/* a zombie is gone for our purposes */
	char p[64], buf[512];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return false;
	bool z = fgets(buf, sizeof(buf), f) != NULL && strstr(buf, ") Z ") != NULL;
	fclose(f);
	return !z;
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static int sh_status(struct sbx_client *c, const char *cmd, char *err_out, size_t size)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_output o;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	eo.shell = cmd;
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &o, &ex, &err), &err);
	if (err_out != NULL)
		snprintf(err_out, size, "%s", o.err != NULL ? o.err : "");
	sbx_output_free(&o);
	return sbx_exit_status(&ex);
}

static void write_str(struct sbx_client *c, const char *path, const char *s)
{
	struct sbx_error err;
	CHECK_SBX(sbx_write_file_buf(c, &no_timeout, path, 0, 0644, s, strlen(s), NULL, &err), &err);
}

static char *read_str(struct sbx_client *c, const char *path)
{
	static char buf[65536];
	void *data;
	size_t len;
	struct sbx_error err;
	CHECK_SBX(sbx_read_file_alloc(c, &no_timeout, path, sizeof(buf) - 1, &data, &len, &err), &err);
	memcpy(buf, data, len);
	buf[len] = '\0';
	free(data);
	return buf;
}

/* the mount's runtime dir in the shim's state dir */
static const char *rundir(const char *id)
{
	static char buf[2048];
	snprintf(buf, sizeof(buf), "%s/mounts/%s", it_path("state"), id);
	return buf;
}

/* ---- cases ---- */

/* mount, write through file ops and a command, read objects put from outside,
 * list, info, unmount right after a write, unmount again, unknown ids */
static int case_basic(void)
{
	s3_start();
	s3_put("from-outside.txt", "put directly");
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("mnt")); /* missing: created */
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	fprintf(stderr, "mount live after %llu ms\n", (unsigned long long)(it_now_ms() - t0));
	CHECK_EQ(rec.state, SBX_MOUNT_LIVE);
	CHECK(rec.rclone_pid > 0);
	CHECK(alive((pid_t)rec.rclone_pid));
	/* rclone was given the checked directory by fd (/proc/self/fd/63/.), not its path,
	 * which could have been swapped since the check (issue 17.7) */
	char link[64], target[1024];
	snprintf(link, sizeof(link), "/proc/%u/fd/63", rec.rclone_pid);
	ssize_t tl = readlink(link, target, sizeof(target) - 1);
	CHECKF(tl > 0, "%s: %s", link, strerror(errno));
	target[tl] = '\0';
	CHECKF(strcmp(target, mnt) == 0, "rclone's fd 63 is %s, not the mount point %s", target, mnt);
	snprintf(link, sizeof(link), "/proc/%u/cmdline", rec.rclone_pid);
	FILE *cf = fopen(link, "r");
	CHECK(cf != NULL);
	char argvs[8192];
	size_t cl = fread(argvs, 1, sizeof(argvs), cf);
	fclose(cf);
	static const char via_fd[] = "\0/proc/self/fd/63/.\0";
	CHECKF(memmem(argvs, cl, via_fd, sizeof(via_fd) - 1) != NULL, "rclone's mount point is not /proc/self/fd/63/.");
	CHECK(rec.created_dir);
	CHECK_EQ(strlen(rec.id), 36);
	CHECK(strcmp(rec.bucket, "bkt") == 0 && strcmp(rec.path, mnt) == 0 && !rec.read_only);
	CHECK(strcmp(rec.endpoint, endpoint_) == 0);
	CHECK_EQ(strlen(rec.created_at), 20);
	CHECK(strcmp(fstype_at(mnt), "fuse.rclone") == 0);

	/* an object put from outside reads back through the mount */
	char p[1200];
	snprintf(p, sizeof(p), "%s/from-outside.txt", mnt);
	CHECK(strcmp(read_str(c, p), "put directly") == 0);
	/* the shim's file write lands in the bucket */
	snprintf(p, sizeof(p), "%s/via-write.txt", mnt);
	write_str(c, p, "written by sbx_write_file");
	s3_wait("via-write.txt", "written by sbx_write_file", 20000);
	/* and a command's */
	char cmd[2200];
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/dir' && echo from-a-command > '%s/dir/cmd.txt'", mnt, mnt);
	CHECK_EQ(sh_status(c, cmd, NULL, 0), 0);
	s3_wait("dir/cmd.txt", "from-a-command\n", 20000);

	/* list and info */
	struct sbx_mount_record **v;
	size_t n;
	CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK(strcmp(v[0]->id, rec.id) == 0 && v[0]->state == SBX_MOUNT_LIVE);
	sbx_mounts_free(v);
	struct sbx_info info = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c, &no_timeout, &info, &err), &err);
	CHECK_EQ(info.mounts, 1);
	CHECK_CONTAINS(info.features, "mount");

	/* unmount right after a 2 MiB write: the object is complete in the bucket */
	static char big[2 << 20];
	it_fill(big, sizeof(big), 7);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)('a' + (unsigned char)big[i] % 26);
	big[sizeof(big) - 1] = '\0';
	snprintf(p, sizeof(p), "%s/big.txt", mnt);
	write_str(c, p, big);
	char conf[2100];
	snprintf(conf, sizeof(conf), "%s/rclone.conf", rundir(rec.id));
	CHECK(exists(conf));
	struct sbx_mount_record un = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, &un, &err), &err);
	CHECK_EQ(un.state, SBX_MOUNT_UNMOUNTED);
	CHECK(strcmp(un.id, rec.id) == 0);
	const char *got = s3_cat("big.txt");
	CHECKF(got != NULL && strcmp(got, big) == 0, "big.txt not complete in the bucket after unmount (%zu bytes)",
	       got ? strlen(got) : 0);
	/* everything gone: the mount, rclone, config and cache, the directory it made */
	CHECK(strcmp(fstype_at(mnt), "") == 0);
	CHECK(!exists(mnt));
	CHECK(!exists(rundir(rec.id)));
	uint64_t end = it_now_ms() + 2000;
	while (alive((pid_t)rec.rclone_pid) && it_now_ms() < end)
		it_sleep_ms(10);
	CHECK(!alive((pid_t)rec.rclone_pid));
	CHECK_SBX(sbx_info(c, &no_timeout, &info, &err), &err);
	CHECK_EQ(info.mounts, 0);
	CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
	CHECK_EQ(n, 0);
	CHECK(v != NULL && v[0] == NULL);
	sbx_mounts_free(v);

	/* idempotent: again by id and by path, the same record */
	sbx_mount_record_free(&un);
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, &un, &err), &err);
	CHECK_EQ(un.state, SBX_MOUNT_UNMOUNTED);
	sbx_mount_record_free(&un);
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, &un, &err), &err);
	CHECK(strcmp(un.id, rec.id) == 0);
	/* unknown id or path */
	CHECK(sbx_unmount(c, &no_timeout, "00000000-0000-4000-8000-000000000000", NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(sbx_unmount(c, &no_timeout, "/no/such/mount", NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	sbx_mount_record_free(&rec);
	sbx_mount_record_free(&un);
	stop_all();
	return 0;
}

static int case_read_only(void)
{
	s3_start();
	s3_put("ro.txt", "read me");
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("ro"));
	CHECK(mkdir(mnt, 0755) == 0); /* existing and empty: fine, and left in place */
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	mo.read_only = 1;
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	CHECK(rec.read_only && !rec.created_dir);
	char p[1200];
	snprintf(p, sizeof(p), "%s/ro.txt", mnt);
	CHECK(strcmp(read_str(c, p), "read me") == 0);
	snprintf(p, sizeof(p), "%s/new.txt", mnt);
	CHECK(sbx_write_file_buf(c, &no_timeout, p, 0, 0644, "x", 1, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EROFS);
	char cmd[1200], eout[1024];
	snprintf(cmd, sizeof(cmd), "echo x > '%s/cmd.txt'", mnt);
	CHECK(sh_status(c, cmd, eout, sizeof(eout)) != 0);
	CHECK_CONTAINS(eout, "Read-only file system");
	CHECK(s3_has("ro.txt") && !s3_has("new.txt") && !s3_has("cmd.txt"));
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, NULL, &err), &err);
	CHECK(exists(mnt)); /* not ours: stays */
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

struct unmount_arg {
	struct sbx_client *c;
	const char *id;
	int rc;
	struct sbx_error err;
};

static void *unmount_thread(void *arg)
{
	struct unmount_arg *a = arg;
	a->rc = sbx_unmount(a->c, &no_timeout, a->id, NULL, NULL, &a->err);
	return NULL;
}

static int case_prefix(void)
{
	s3_start();
	s3_put("inside/a.txt", "in");
	s3_put("outside/b.txt", "out");
	s3_put("top.txt", "top");
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("pfx"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	mo.prefix = "inside";
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	CHECK(strcmp(rec.prefix, "inside") == 0);
	CHECK_EQ(it_count_entries(mnt), 1);
	char p[1200];
	snprintf(p, sizeof(p), "%s/a.txt", mnt);
	CHECK(strcmp(read_str(c, p), "in") == 0);
	snprintf(p, sizeof(p), "%s/outside", mnt);
	CHECK(!exists(p));
	snprintf(p, sizeof(p), "%s/new.txt", mnt);
	write_str(c, p, "under the prefix");
	/* two unmounts at once (by id and by path): the second joins the first, both answer */
	struct unmount_arg ua = {c, rec.id, 0, {0}};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, unmount_thread, &ua) == 0);
	struct sbx_mount_record un = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, &un, &err), &err);
	pthread_join(th, NULL);
	CHECKF(ua.rc == 0, "the other unmount: %s", it_errstr(&ua.err));
	CHECK_EQ(un.state, SBX_MOUNT_UNMOUNTED);
	CHECK(strcmp(un.id, rec.id) == 0);
	CHECK(strcmp(s3_cat("inside/new.txt"), "under the prefix") == 0);
	CHECK(s3_has("inside/new.txt") && !s3_has("new.txt"));
	/* the struct_size rule (sdk/ABI.md) on the record, through a repeated unmount (the same
	 * record): an older, smaller struct gets its fields up to its size and not a byte more
	 * (the strings it has no room for are the library's to free) */
	union {
		struct sbx_mount_record rec;
		unsigned char raw[sizeof(struct sbx_mount_record) + 16];
	} old;
	memset(&old, 0xa5, sizeof(old));
	size_t cut = offsetof(struct sbx_mount_record, endpoint);
	old.rec.struct_size = cut;
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, &old.rec, &err), &err);
	CHECK(strcmp(old.rec.id, rec.id) == 0 && old.rec.state == SBX_MOUNT_UNMOUNTED);
	CHECK(strcmp(old.rec.prefix, "inside") == 0 && strcmp(old.rec.path, mnt) == 0);
	CHECK_EQ(old.rec.struct_size, cut);
	for (size_t i = cut; i < sizeof(old); i++)
		CHECKF(old.raw[i] == 0xa5, "byte %zu of a %zu-byte sbx_mount_record written", i, cut);
	sbx_mount_record_free(&old.rec);
	CHECK(old.rec.prefix == NULL && old.rec.path == NULL);
	for (size_t i = cut; i < sizeof(old); i++)
		CHECKF(old.raw[i] == 0xa5, "byte %zu written by sbx_mount_record_free", i);
	/* a newer header's larger struct: filled, its unknown tail zeroed */
	memset(&old, 0xa5, sizeof(old));
	old.rec.struct_size = sizeof(old);
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, &old.rec, &err), &err);
	CHECK(strcmp(old.rec.endpoint, rec.endpoint) == 0 && strcmp(old.rec.error, "") == 0);
	CHECK_EQ(old.rec.struct_size, sizeof(old));
	for (size_t i = sizeof(old.rec); i < sizeof(old); i++)
		CHECKF(old.raw[i] == 0, "byte %zu of the larger struct: 0x%02x, want 0", i, old.raw[i]);
	sbx_mount_record_free(&old.rec);
	CHECK(old.rec.endpoint == NULL && old.rec.error == NULL);
	sbx_mount_record_free(&rec);
	sbx_mount_record_free(&un);
	stop_all();
	return 0;
}

/* Nothing of a failed mount is left: no mount, no directory, no rclone, no files. */
static void check_nothing_left(struct sbx_client *c, const char *mnt)
{
	struct sbx_error err;
	CHECK(strcmp(fstype_at(mnt), "") == 0);
	CHECK(!exists(mnt));
	char d[1100];
	snprintf(d, sizeof(d), "%s/mounts", it_path("state"));
	CHECK_EQ(it_count_entries(d), 0);
	struct sbx_mount_record **v;
	size_t n;
	CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
	CHECK_EQ(n, 0);
	CHECK(v != NULL && v[0] == NULL);
	sbx_mounts_free(v);
	/* no rclone of ours: none has the mount point on its command line */
	char rd[1100];
	snprintf(rd, sizeof(rd), "%s/mounts/", it_path("state"));
	DIR *proc = opendir("/proc");
	CHECK(proc != NULL);
	struct dirent *e;
	while ((e = readdir(proc)) != NULL) {
		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		char p[300], buf[8192];
		snprintf(p, sizeof(p), "/proc/%s/cmdline", e->d_name);
		int fd = open(p, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		for (ssize_t i = 0; i < len; i++)
			if (buf[i] == '\0')
				buf[i] = ' ';
		buf[len] = '\0';
		/* rclone mount names the mount point; the preflight (rclone lsf) the state dir */
		CHECKF((strstr(buf, mnt) == NULL && strstr(buf, rd) == NULL) || !alive(atoi(e->d_name)),
		       "process %s still there: %s", e->d_name, buf);
	}
	closedir(proc);
}

static int case_bad_key(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("bad"));
	struct sbx_mount_opts mo = opts_("NOSUCHKEY", "whatever");
	struct sbx_error err;
	CHECK(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, NULL, &err) < 0);
	fprintf(stderr, "unknown key: %s\n", it_errstr(&err));
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECK_CONTAINS(err.message, "InvalidAccessKeyId");
	CHECK(strstr(err.message, "whatever") == NULL);
	check_nothing_left(c, mnt);
	stop_all();
	return 0;
}

/* A bucket that does not exist: rclone mount alone would start and show an empty
 * directory (and create the bucket on the first write); the preflight's listing gets
 * a 404, so the mount fails with ENOENT and leaves nothing, with or without a prefix.
 * A prefix with nothing under it in a bucket that exists is no error. */
static int case_no_bucket(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("nob"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_error err;
	for (int with_prefix = 0; with_prefix < 2; with_prefix++) {
		mo.prefix = with_prefix ? "some/prefix" : NULL;
		uint64_t t0 = it_now_ms();
		CHECKF(sbx_mount(c, &no_timeout, "nosuchbucket", mnt, &mo, NULL, &err) < 0,
		       "a mount of a bucket that does not exist succeeded%s", with_prefix ? " (with a prefix)" : "");
		fprintf(stderr, "no such bucket%s: after %llu ms: %s\n", with_prefix ? " (prefix)" : "",
			(unsigned long long)(it_now_ms() - t0), it_errstr(&err));
		CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
		CHECK_CONTAINS(err.message, "bucket nosuchbucket does not exist");
		CHECK_CONTAINS(err.message, "rclone: ");
		check_nothing_left(c, mnt);
	}
	/* not created on the way */
	char buckets[4096];
	CHECK(s3sh(buckets, sizeof(buckets), "s3_rclone lsd s3:") == 0);
	CHECK(strstr(buckets, "nosuchbucket") == NULL);
	CHECK(strstr(buckets, "bkt") != NULL);
	/* an empty prefix of a bucket that exists mounts, empty, and takes a file */
	mo.prefix = "fresh";
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	CHECK_EQ(rec.state, SBX_MOUNT_LIVE);
	CHECK_EQ(it_count_entries(mnt), 0);
	char p[1200];
	snprintf(p, sizeof(p), "%s/f.txt", mnt);
	write_str(c, p, "fresh");
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, NULL, &err), &err);
	CHECK(strcmp(s3_cat("fresh/f.txt"), "fresh") == 0);
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

static int case_server_down(void)
{
	/* a port that nothing listens on */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	CHECK(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(s, (struct sockaddr *)&a, &al) == 0);
	snprintf(endpoint_, sizeof(endpoint_), "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("down"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	mo.timeout_ms = 3000;
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	CHECK(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, NULL, &err) < 0);
	uint64_t took = it_now_ms() - t0;
	fprintf(stderr, "server down: after %llu ms: %s\n", (unsigned long long)took, it_errstr(&err));
	CHECKF(took < 3000 + 4000, "took %llu ms with a 3000 ms timeout", (unsigned long long)took);
	CHECK(err.kind == SBX_ERR_REMOTE && (err.code == ECONNREFUSED || err.code == ETIMEDOUT || err.code == EIO));
	CHECK_CONTAINS(err.message, "connection refused");
	close(s);
	check_nothing_left(c, mnt);
	stop_all();
	return 0;
}

/* A server that accepts connections and never answers: the mount times out within its
 * timeout, and a cancelled mount ends at once; nothing is left either way. */
static void *fire_later(void *arg);

static int case_blackhole(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	CHECK(bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(s, 64) == 0 &&
	      getsockname(s, (struct sockaddr *)&a, &al) == 0);
	snprintf(endpoint_, sizeof(endpoint_), "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("hole"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	mo.timeout_ms = 1500;
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	CHECK(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, NULL, &err) < 0);
	uint64_t took = it_now_ms() - t0;
	fprintf(stderr, "no answer: after %llu ms: %s\n", (unsigned long long)took, it_errstr(&err));
	CHECK_ERR(&err, SBX_ERR_REMOTE, ETIMEDOUT);
	CHECK(took >= 1400 && took < 4000);
	check_nothing_left(c, mnt);
	/* cancelled after 300 ms */
	mo.timeout_ms = 0;
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts copts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fire_later, tok) == 0);
	t0 = it_now_ms();
	CHECK(sbx_mount(c, &copts, "bkt", mnt, &mo, NULL, &err) < 0);
	took = it_now_ms() - t0;
	pthread_join(th, NULL);
	sbx_cancel_free(tok);
	CHECK_EQ(err.code, ECANCELED);
	CHECK(took < 1500);
	/* the shim undoes it in the background: soon nothing is left */
	uint64_t end = it_now_ms() + 5000;
	struct sbx_mount_record **v;
	size_t n = 1;
	while (n > 0 && it_now_ms() < end) {
		CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
		sbx_mounts_free(v);
		if (n > 0)
			it_sleep_ms(50);
	}
	check_nothing_left(c, mnt);
	close(s);
	stop_all();
	return 0;
}

/* the secret in no argv or environment (rclone's own included: it has a config file),
 * not in the daemon's log, hidden in traces; the config 0600 and root's */
static char trace_[1 << 16];
static size_t trace_len_;
static void trace_cb(void *ud, const char *line)
{
	(void)ud;
	size_t n = strlen(line);
	if (trace_len_ + n + 2 < sizeof(trace_)) {
		memcpy(trace_ + trace_len_, line, n);
		trace_len_ += n;
		trace_[trace_len_++] = '\n';
		trace_[trace_len_] = '\0';
	}
}

static bool file_has(const char *path, const char *needle)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return false;
	static char buf[1 << 20];
	ssize_t len = read(fd, buf, sizeof(buf));
	close(fd);
	size_t nl = strlen(needle);
	for (ssize_t i = 0; len > 0 && i + (ssize_t)nl <= len; i++)
		if (memcmp(buf + i, needle, nl) == 0)
			return true;
	return false;
}

static int case_secrets(void)
{
	s3_start();
	start_shim();
	sbx_client_close(c_);
	struct sbx_connect_opts co = SBX_CONNECT_OPTS_INIT;
	co.trace = trace_cb;
	struct sbx_error err;
	CHECK_SBX(sbx_connect(it_unix_target(it_path("shim.sock")), &co, &c_, &err), &err);
	struct sbx_client *c = c_;
	/* s3rver checks no signature: any secret works with its key id */
	char secret[64], token[64];
	snprintf(secret, sizeof(secret), "Sekr1t-%d-%llu", (int)getpid(), (unsigned long long)it_now_ms());
	snprintf(token, sizeof(token), "T0ken-%d-%llu", (int)getpid(), (unsigned long long)it_now_ms());
	struct sbx_mount_opts mo = opts_("S3RVER", secret);
	mo.session_token = token;
	char mnt[1024];
	keep(mnt, it_path("sec"));
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	/* every process's argv and environment */
	DIR *proc = opendir("/proc");
	CHECK(proc != NULL);
	struct dirent *e;
	unsigned scanned = 0;
	while ((e = readdir(proc)) != NULL) {
		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		static const char *const files[] = {"cmdline", "environ"};
		for (size_t i = 0; i < 2; i++) {
			char p[300];
			snprintf(p, sizeof(p), "/proc/%s/%s", e->d_name, files[i]);
			CHECKF(!file_has(p, secret) && !file_has(p, token), "the secret is in %s", p);
			scanned++;
		}
	}
	closedir(proc);
	CHECK(scanned > 4);
	/* rclone's own environment: explicit and clean */
	char p[300];
	snprintf(p, sizeof(p), "/proc/%u/environ", rec.rclone_pid);
	CHECK(!file_has(p, "AWS_"));
	CHECK(file_has(p, "PATH="));
	/* the config: 0600, root's, holding the secret; its directory 0700 */
	char conf[2100];
	snprintf(conf, sizeof(conf), "%s/rclone.conf", rundir(rec.id));
	struct stat st;
	CHECK(stat(conf, &st) == 0);
	CHECKF((st.st_mode & 07777) == 0600, "config mode %o", (unsigned)(st.st_mode & 07777));
	CHECK_EQ(st.st_uid, 0);
	CHECK(file_has(conf, secret) && file_has(conf, token));
	CHECK(stat(rundir(rec.id), &st) == 0 && (st.st_mode & 0777) == 0700);
	/* not in the daemon's log, shown by length only in traces */
	CHECK(!file_has(shim_->log, secret) && !file_has(shim_->log, token));
	CHECK(strstr(trace_, secret) == NULL && strstr(trace_, token) == NULL);
	CHECK_CONTAINS(trace_, "bytes hidden");
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, NULL, &err), &err);
	CHECK(!exists(conf));
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

/* Uploads that cannot finish (the server is stopped): unmount waits, then fails with
 * ETIMEDOUT and the mount stays; once the server is back it flushes and unmounts. */
static int case_flush_timeout(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("flush"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	it_stop_process(s3_->pid);
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "echo pending > '%s/pending.txt'", mnt);
	CHECK_EQ(sh_status(c, cmd, NULL, 0), 0);
	struct sbx_unmount_opts uo = SBX_UNMOUNT_OPTS_INIT;
	uo.flush_timeout_ms = 1000;
	uint64_t t0 = it_now_ms();
	CHECK(sbx_unmount(c, &no_timeout, rec.id, &uo, NULL, &err) < 0);
	fprintf(stderr, "unmount with the server stopped: %s after %llu ms\n", it_errstr(&err),
		(unsigned long long)(it_now_ms() - t0));
	CHECK_ERR(&err, SBX_ERR_REMOTE, ETIMEDOUT);
	CHECK_CONTAINS(err.message, "still uploading");
	/* still mounted and live */
	CHECK(strcmp(fstype_at(mnt), "fuse.rclone") == 0);
	struct sbx_mount_record **v;
	size_t n;
	CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
	CHECK(n == 1 && v[0]->state == SBX_MOUNT_LIVE);
	sbx_mounts_free(v);
	CHECK(kill(s3_->pid, SIGCONT) == 0);
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, NULL, &err), &err);
	CHECK(strcmp(s3_cat("pending.txt"), "pending\n") == 0);
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

/* rclone SIGKILLed: failed within a second, and the path refuses writes */
static int case_rclone_killed(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("killed"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	CHECK(kill((pid_t)rec.rclone_pid, SIGKILL) == 0);
	uint64_t t0 = it_now_ms();
	struct sbx_mount_record **v = NULL;
	size_t n = 0;
	for (;;) {
		CHECK_SBX(sbx_mounts_list(c, &no_timeout, &v, &n, &err), &err);
		CHECK_EQ(n, 1);
		if (v[0]->state == SBX_MOUNT_FAILED)
			break;
		sbx_mounts_free(v);
		CHECKF(it_now_ms() - t0 < 1000, "not reported failed within a second");
		it_sleep_ms(20);
	}
	fprintf(stderr, "reported failed after %llu ms: %s\n", (unsigned long long)(it_now_ms() - t0), v[0]->error);
	CHECK_CONTAINS(v[0]->error, "signal 9");
	CHECK_EQ(v[0]->rclone_pid, 0);
	sbx_mounts_free(v);
	/* the path: no dead FUSE mount, and not an empty directory that takes writes */
	uint64_t end = it_now_ms() + 2000;
	while (strncmp(fstype_at(mnt), "fuse", 4) == 0 && it_now_ms() < end)
		it_sleep_ms(20);
	CHECKF(strncmp(fstype_at(mnt), "fuse", 4) != 0, "still a FUSE mount: %s", fstype_at(mnt));
	CHECK(strcmp(fstype_at(mnt), "tmpfs") == 0);
	if (kernel_at_least(6, 5))
		CHECK_EQ(fuse_mounts_at(mnt), 0);
	char p[1200];
	snprintf(p, sizeof(p), "%s/lost.txt", mnt);
	int fd = open(p, O_WRONLY | O_CREAT, 0644);
	CHECKF(fd < 0 && errno == EROFS, "write into the dead mount's path: fd %d, %s", fd, strerror(errno));
	CHECK(sbx_write_file_buf(c, &no_timeout, p, 0, 0644, "x", 1, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EROFS);
	/* unmount cleans up the failed mount too */
	struct sbx_mount_record un = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, &un, &err), &err);
	CHECK_EQ(un.state, SBX_MOUNT_UNMOUNTED);
	CHECK(strcmp(fstype_at(mnt), "") == 0);
	CHECK(!exists(mnt));
	CHECK(!exists(rundir(rec.id)));
	sbx_mount_record_free(&rec);
	sbx_mount_record_free(&un);
	stop_all();
	return 0;
}

/* The shim dies with a live mount (SIGKILL): rclone goes with it (its parent-death
 * signal); the next shim with the same state dir removes the mount's runtime dir (the
 * rclone config with the keys, the log, the cache) and detaches what is left of the
 * FUSE mount (issue 17.7). */
static int case_crash_sweep(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("crash"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	char conf[2200];
	snprintf(conf, sizeof(conf), "%s/rclone.conf", rundir(rec.id));
	CHECK(exists(conf));
	CHECK(kill(shim_->pid, SIGKILL) == 0);
	CHECK(it_daemon_wait_exit(shim_, 5000));
	sbx_client_close(c);
	c_ = NULL;
	uint64_t end = it_now_ms() + 10000;
	while (alive((pid_t)rec.rclone_pid)) {
		CHECKF(it_now_ms() < end, "rclone %u outlived the shim", rec.rclone_pid);
		it_sleep_ms(20);
	}
	CHECKF(exists(conf), "the config went with the crash: nothing left to sweep");
	c = start_shim();
	CHECKF(!exists(rundir(rec.id)), "%s is still there after the restart", rundir(rec.id));
	CHECKF(strncmp(fstype_at(mnt), "fuse", 4) != 0, "still a FUSE mount at %s: %s", mnt, fstype_at(mnt));
	char *log = it_daemon_log(shim_);
	char want[2400];
	snprintf(want, sizeof(want), "mount: removed %s, left by a mount of a daemon that is gone", rundir(rec.id));
	CHECK_CONTAINS(log, want);
	snprintf(want, sizeof(want), "mount: detached the dead FUSE mount at %s, left by a daemon that is gone", mnt);
	CHECK_CONTAINS(log, want);
	printf("after a SIGKILL of the shim: rclone gone, its runtime dir swept and its dead FUSE mount detached at "
	       "the next start\n");
	free(log);
	struct sbx_info in = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c, &no_timeout, &in, &err), &err);
	CHECK_EQ(in.mounts, 0);
	/* the path can be mounted again */
	sbx_mount_record_free(&rec);
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	struct sbx_mount_record un = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_unmount(c, &no_timeout, mnt, NULL, &un, &err), &err);
	sbx_mount_record_free(&rec);
	sbx_mount_record_free(&un);
	stop_all();
	return 0;
}

static void *fire_later(void *arg)
{
	it_sleep_ms(300);
	sbx_cancel_fire(arg);
	return NULL;
}

/* rclone SIGSTOPped (a hung mount): the shim still answers; an operation on the hung
 * path can be cancelled */
static int case_hung(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("hung"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	it_stop_process((pid_t)rec.rclone_pid);
	/* a stat on the hung path: cancelled from another thread after 300 ms */
	struct sbx_cancel *tok = sbx_cancel_new();
	struct sbx_call_opts copts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	pthread_t th;
	CHECK(pthread_create(&th, NULL, fire_later, tok) == 0);
	char p[1200];
	snprintf(p, sizeof(p), "%s/nope-%d", mnt, (int)getpid());
	struct sbx_stat st = SBX_STAT_INIT;
	uint64_t t0 = it_now_ms();
	int rc = sbx_stat(c, &copts, p, 0, &st, &err);
	uint64_t took = it_now_ms() - t0;
	pthread_join(th, NULL);
	sbx_cancel_free(tok);
	CHECK(rc < 0);
	fprintf(stderr, "stat on the hung mount: %s after %llu ms\n", it_errstr(&err), (unsigned long long)took);
	CHECK_EQ(err.code, ECANCELED);
	CHECK(took >= 250 && took < 1500);
	/* meanwhile and afterwards the shim answers: ping, a stat elsewhere, the mount list */
	uint64_t rtt;
	struct sbx_call_opts quick = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 1000};
	CHECK_SBX(sbx_ping(c, &quick, &rtt, &err), &err);
	CHECK_SBX(sbx_stat(c, &quick, "/", 0, &st, &err), &err);
	struct sbx_mount_record **v;
	size_t n;
	CHECK_SBX(sbx_mounts_list(c, &quick, &v, &n, &err), &err);
	CHECK_EQ(n, 1);
	CHECK_EQ(v[0]->state, SBX_MOUNT_LIVE);
	sbx_mounts_free(v);
	/* a stat with a timeout ends too */
	struct sbx_call_opts tmo = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 500};
	t0 = it_now_ms();
	CHECK(sbx_stat(c, &tmo, p, 0, &st, &err) < 0);
	CHECK(it_now_ms() - t0 < 1500);
	CHECK(kill((pid_t)rec.rclone_pid, SIGCONT) == 0);
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, NULL, &err), &err);
	CHECK(!exists(mnt));
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

/* the daemon's SIGTERM unmounts: mountinfo, rclone, config, directory */
static int case_shutdown(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("sd"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	char p[1200];
	snprintf(p, sizeof(p), "%s/last-words.txt", mnt);
	write_str(c, p, "written just before SIGTERM");
	sbx_client_close(c);
	c_ = NULL;
	char conf[2100];
	snprintf(conf, sizeof(conf), "%s/rclone.conf", rundir(rec.id));
	CHECK(exists(conf));
	int status = it_daemon_stop(shim_);
	CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "daemon status 0x%x", status);
	CHECK(strcmp(fstype_at(mnt), "") == 0);
	CHECK(!alive((pid_t)rec.rclone_pid));
	CHECK(!exists(conf));
	CHECK(!exists(rundir(rec.id)));
	CHECK(!exists(mnt));
	CHECK(strcmp(s3_cat("last-words.txt"), "written just before SIGTERM") == 0);
	char *log = it_daemon_log(shim_);
	CHECK_CONTAINS(log, "unmounted");
	free(log);
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

/* the same with the daemon as PID 1 of a new PID namespace (same mount namespace) */
static int case_pid1_shutdown(void)
{
	if (system("unshare --pid --fork true >/dev/null 2>&1") != 0) {
		fprintf(stderr, "SKIP: unshare --pid not permitted\n");
		return IT_SKIP;
	}
	s3_start();
	const char *sock = it_path("shim.sock");
	const char *argv[] = {
		"unshare",     "--pid",          "--fork", "--kill-child", SHIM_BIN, "--listen", it_unix_target(sock),
		"--state-dir", it_path("state"), NULL};
	shim_ = it_daemon_start_argv("shim", argv);
	c_ = it_connect(it_unix_target(sock), NULL);
	struct sbx_info info = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c_, &no_timeout, &info, &err), &err);
	CHECK_EQ(info.pid1, 1);
	char mnt[1024];
	keep(mnt, it_path("pid1"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_mount(c_, &no_timeout, "bkt", mnt, &mo, &rec, &err), &err);
	CHECK(strcmp(fstype_at(mnt), "fuse.rclone") == 0);
	char p[1200];
	snprintf(p, sizeof(p), "%s/pid1.txt", mnt);
	write_str(c_, p, "as init");
	sbx_client_close(c_);
	c_ = NULL;
	/* SIGTERM to the daemon itself (PID 1 inside), not to unshare */
	char kids[64];
	snprintf(kids, sizeof(kids), "/proc/%d/task/%d/children", (int)shim_->pid, (int)shim_->pid);
	FILE *f = fopen(kids, "r");
	CHECK(f != NULL);
	int dpid = 0;
	CHECK(fscanf(f, "%d", &dpid) == 1);
	fclose(f);
	CHECK(kill(dpid, SIGTERM) == 0);
	CHECK(it_daemon_wait_exit(shim_, 30000));
	CHECK(strcmp(fstype_at(mnt), "") == 0);
	CHECK(!exists(rundir(rec.id)));
	CHECK(!exists(mnt));
	CHECK(strcmp(s3_cat("pid1.txt"), "as init") == 0);
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

static void want_err(struct sbx_client *c, const char *bucket, const char *path, const struct sbx_mount_opts *mo,
		     int kind, int code, const char *msg)
{
	struct sbx_error err;
	CHECKF(sbx_mount(c, &no_timeout, bucket, path, mo, NULL, &err) < 0, "mount of %s at %s succeeded", bucket,
	       path);
	CHECK_ERR(&err, kind, code);
	if (msg != NULL)
		CHECK_CONTAINS(err.message, msg);
}

static int case_validation(void)
{
	s3_start();
	struct sbx_client *c = start_shim();
	char mnt[1024];
	keep(mnt, it_path("v"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	static const char *const bad_buckets[] = {"ab",          "Bad_Bucket", "-abc",      "abc-", "a..b",
						  "192.168.1.1", "a.-b",       "has space", ""};
	for (size_t i = 0; i < sizeof(bad_buckets) / sizeof(bad_buckets[0]); i++)
		want_err(c, bad_buckets[i], mnt, &mo, SBX_ERR_REMOTE, EINVAL, "bucket");
	static const char *const bad_endpoints[] = {"ftp://127.0.0.1", "127.0.0.1:9000", "http://", "http:// x",
						    "https:///path"};
	for (size_t i = 0; i < sizeof(bad_endpoints) / sizeof(bad_endpoints[0]); i++) {
		struct sbx_mount_opts m2 = mo;
		m2.endpoint = bad_endpoints[i];
		want_err(c, "bkt", mnt, &m2, SBX_ERR_REMOTE, EINVAL, "endpoint");
	}
	struct sbx_mount_opts m3 = mo;
	m3.endpoint = NULL;
	want_err(c, "bkt", mnt, &m3, SBX_ERR_LOCAL, EINVAL, "endpoint");
	want_err(c, "bkt", "relative/path", &mo, SBX_ERR_REMOTE, EINVAL, "absolute");
	/* options: only the allow-list, with sane values */
	const char *bad_opt1[] = {"config=/etc/passwd", NULL};
	const char *bad_opt2[] = {"vfs-cache-mode=bogus", NULL};
	const char *bad_opt3[] = {"dir-cache-time=1s --rc", NULL};
	const char *const *bad_opts[] = {bad_opt1, bad_opt2, bad_opt3};
	for (size_t i = 0; i < 3; i++) {
		struct sbx_mount_opts m4 = mo;
		m4.options = bad_opts[i];
		want_err(c, "bkt", mnt, &m4, SBX_ERR_REMOTE, EINVAL, NULL);
	}
	struct sbx_mount_opts m5 = mo;
	m5.prefix = "../up";
	want_err(c, "bkt", mnt, &m5, SBX_ERR_REMOTE, EINVAL, "prefix");
	struct sbx_mount_opts m6 = mo;
	m6.secret_access_key = "with\nnewline";
	want_err(c, "bkt", mnt, &m6, SBX_ERR_REMOTE, EINVAL, "secret");
	/* already a mount point */
	char mp[1024];
	keep(mp, it_path("tmpfs"));
	CHECK(mkdir(mp, 0755) == 0);
	CHECK(mount("it-mount", mp, "tmpfs", 0, "size=64k") == 0);
	want_err(c, "bkt", mp, &mo, SBX_ERR_REMOTE, EBUSY, "mount point");
	CHECK(umount(mp) == 0);
	/* not a directory */
	char file[1024];
	keep(file, it_path("file"));
	it_write_file(file, "x");
	want_err(c, "bkt", file, &mo, SBX_ERR_REMOTE, ENOTDIR, NULL);
	/* missing parent */
	char deep[1100];
	snprintf(deep, sizeof(deep), "%s/no/such", mnt);
	want_err(c, "bkt", deep, &mo, SBX_ERR_REMOTE, ENOENT, NULL);
	/* not empty: refused unless asked for */
	char full[1024], inside[1100];
	keep(full, it_path("full"));
	CHECK(mkdir(full, 0755) == 0);
	snprintf(inside, sizeof(inside), "%s/keep.txt", full);
	it_write_file(inside, "mine");
	want_err(c, "bkt", full, &mo, SBX_ERR_REMOTE, ENOTEMPTY, "not empty");
	struct sbx_mount_opts m7 = mo;
	m7.allow_non_empty = 1;
	struct sbx_mount_record rec = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &no_timeout, "bkt", full, &m7, &rec, &err), &err);
	/* the same path twice */
	want_err(c, "bkt", full, &m7, SBX_ERR_REMOTE, EBUSY, NULL);
	CHECK_SBX(sbx_unmount(c, &no_timeout, rec.id, NULL, NULL, &err), &err);
	CHECK(exists(inside)); /* what was there is still there */
	/* nothing was left by any of the refusals */
	check_nothing_left(c, mnt);
	sbx_mount_record_free(&rec);
	stop_all();
	return 0;
}

/* rclone or fusermount3 not installed: ENOENT saying what to install */
static int case_missing_tools(void)
{
	s3_start();
	const char *old = getenv("PATH");
	char saved[4096];
	snprintf(saved, sizeof(saved), "%s", old ? old : "/usr/bin:/bin");
	/* a PATH with neither */
	char empty[1024];
	keep(empty, it_path("emptybin"));
	CHECK(mkdir(empty, 0755) == 0);
	setenv("PATH", empty, 1);
	const char *sock = it_path("a.sock");
	struct it_daemon *d =
		it_daemon_start("shim-a", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	setenv("PATH", saved, 1);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	char mnt[1024];
	keep(mnt, it_path("m"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	want_err(c, "bkt", mnt, &mo, SBX_ERR_REMOTE, ENOENT, "apt-get install rclone");
	CHECK(!exists(mnt));
	sbx_client_close(c);
	CHECK_EQ(it_daemon_stop(d), 0);
	/* rclone there, fusermount3 not */
	char onlyr[1024], link[1100];
	keep(onlyr, it_path("onlyrclone"));
	CHECK(mkdir(onlyr, 0755) == 0);
	snprintf(link, sizeof(link), "%s/rclone", onlyr);
	CHECK(symlink("/usr/bin/rclone", link) == 0);
	setenv("PATH", onlyr, 1);
	const char *sock2 = it_path("b.sock");
	d = it_daemon_start("shim-b", "--listen", it_unix_target(sock2), "--state-dir", it_path("state"), NULL);
	setenv("PATH", saved, 1);
	c = it_connect(it_unix_target(sock2), NULL);
	want_err(c, "bkt", mnt, &mo, SBX_ERR_REMOTE, ENOENT, "fuse3");
	CHECK(!exists(mnt));
	sbx_client_close(c);
	CHECK_EQ(it_daemon_stop(d), 0);
	stop_all();
	return 0;
}

static const struct sbx_snapshot_step *snap_step(const struct sbx_snapshot_result *r, const char *name,
						 const char *path)
{
	for (size_t i = 0; r->steps[i] != NULL; i++)
		if (strcmp(r->steps[i]->name, name) == 0 && (path == NULL || strcmp(r->steps[i]->path, path) == 0))
			return r->steps[i];
	return NULL;
}

/* microVM snapshots (PROTOCOL.md 12.6): snapshot_prepare flushes every mount's pending
 * uploads; resumed re-checks every mount and reports the one whose rclone was killed.
 * The clock goes through the shim's test seam, never to this machine's. */
static int case_snapshot(void)
{
	/* each call has a deadline well inside ctest's, so a hang names its step */
	static const struct sbx_call_opts timed = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 60000};
	s3_start();
	CHECK(setenv("SANDBOX_SHIM_TEST_CLOCK_FILE", it_path("clock-seam"), 1) == 0);
	struct sbx_client *c = start_shim();
	char m1[1024], m2[1024], f[1100];
	keep(m1, it_path("snap1"));
	keep(m2, it_path("snap2"));
	struct sbx_mount_opts mo = opts_("S3RVER", "S3RVER");
	struct sbx_mount_record r1 = SBX_MOUNT_RECORD_INIT, r2 = SBX_MOUNT_RECORD_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_mount(c, &timed, "bkt", m1, &mo, &r1, &err), &err);
	CHECK_SBX(sbx_mount(c, &timed, "other", m2, &mo, &r2, &err), &err);
	snprintf(f, sizeof(f), "%s/snap.txt", m1);
	CHECK_SBX(sbx_write_file_buf(c, &timed, f, SBX_WRITE_NO_ATOMIC, 0644, "before the snapshot", 19, NULL, &err),
		  &err);
	struct sbx_snapshot_result r = SBX_SNAPSHOT_RESULT_INIT;
	CHECK_SBX(sbx_snapshot_prepare(c, &timed, NULL, &r, &err), &err);
	const struct sbx_snapshot_step *s = snap_step(&r, "flush", NULL);
	CHECK(s != NULL);
	CHECKF(s->error == 0, "flush: %s: %s", sbx_errno_name(s->error), s->message);
	CHECK_EQ(s->count, 2);
	sbx_snapshot_result_free(&r);
	/* flushed: the object is in the bucket */
	const char *got = s3_cat("snap.txt");
	CHECKF(got != NULL && strcmp(got, "before the snapshot") == 0, "bkt/snap.txt: %s", got ? got : "(missing)");

	/* rclone of the second mount dies while the VM is "snapshotted" */
	CHECK(kill((pid_t)r2.rclone_pid, SIGKILL) == 0);
	uint64_t end = it_now_ms() + 5000;
	for (;;) {
		struct sbx_mount_record **v = NULL;
		size_t n = 0;
		CHECK_SBX(sbx_mounts_list(c, &timed, &v, &n, &err), &err);
		bool failed = false;
		for (size_t i = 0; i < n; i++)
			failed |= strcmp(v[i]->path, m2) == 0 && v[i]->state == SBX_MOUNT_FAILED;
		sbx_mounts_free(v);
		if (failed)
			break;
		CHECKF(it_now_ms() < end, "the killed mount is not reported failed");
		it_sleep_ms(20);
	}
	struct sbx_resumed_opts ro = SBX_RESUMED_OPTS_INIT; /* the host's time: now */
	CHECK_SBX(sbx_resumed(c, &timed, &ro, &r, &err), &err);
	s = snap_step(&r, "mount", m1);
	CHECKF(s != NULL && s->error == 0, "mount %s: %s", m1, s ? s->message : "no step");
	s = snap_step(&r, "mount", m2);
	CHECKF(s != NULL && s->error == EIO, "mount %s: %s", m2, s ? s->message : "no step");
	CHECK_CONTAINS(s->message, "signal 9");
	sbx_snapshot_result_free(&r);
	/* a hung rclone (stopped): its check does not answer, resumed still does, in time */
	it_stop_process((pid_t)r1.rclone_pid);
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_resumed(c, &timed, &ro, &r, &err), &err);
	CHECKF(it_now_ms() - t0 < 15000, "resumed took %llu ms", (unsigned long long)(it_now_ms() - t0));
	s = snap_step(&r, "mount", m1);
	CHECKF(s != NULL && s->error == ETIMEDOUT, "mount %s: %s", m1, s ? s->message : "no step");
	sbx_snapshot_result_free(&r);
	CHECK(kill((pid_t)r1.rclone_pid, SIGCONT) == 0);
	struct sbx_mount_record un = SBX_MOUNT_RECORD_INIT;
	CHECK_SBX(sbx_unmount(c, &timed, m1, NULL, &un, &err), &err);
	sbx_mount_record_free(&un);
	CHECK_SBX(sbx_unmount(c, &timed, m2, NULL, &un, &err), &err);
	sbx_mount_record_free(&un);
	sbx_mount_record_free(&r1);
	sbx_mount_record_free(&r2);
	stop_all();
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"basic", case_basic},
		{"read_only", case_read_only},
		{"prefix", case_prefix},
		{"bad_key", case_bad_key},
		{"no_bucket", case_no_bucket},
		{"server_down", case_server_down},
		{"blackhole", case_blackhole},
		{"secrets", case_secrets},
		{"flush_timeout", case_flush_timeout},
		{"rclone_killed", case_rclone_killed},
		{"snapshot", case_snapshot},
		{"crash_sweep", case_crash_sweep},
		{"hung", case_hung},
		{"shutdown", case_shutdown},
		{"pid1_shutdown", case_pid1_shutdown},
		{"validation", case_validation},
		{"missing_tools", case_missing_tools},
	};
	if (geteuid() != 0) {
		fprintf(stderr, "it_mount: FUSE mounts need root here\n");
		return 1;
	}
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
