/* it_fs_user.c: file operations that name a user (Request.fs, sbx_call_opts.user; PROTOCOL.md
 * 12.1.1) against a root daemon: the kernel's permission checks are that user's (EACCES, EPERM),
 * files it creates are its own, the daemon's --fs-user is the default a request may override,
 * and the identity is per thread: root requests beside nobody ones keep root's rights, and a
 * worker that served nobody serves the next request as the shim again. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOBODY 65534
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

static const struct sbx_call_opts as_nobody = {
	.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "nobody"};
static const struct sbx_call_opts as_root = {
	.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "root"};

/* An SDK call that must fail in the shim with code (its error struct is err_). */
#define FAILS_WITH(code, call)                                                                             \
	do {                                                                                               \
		struct sbx_error err_;                                                                     \
		memset(&err_, 0, sizeof(err_));                                                            \
		if ((call) >= 0)                                                                           \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code)); \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                    \
	} while (0)

#define OK(call)                          \
	do {                              \
		struct sbx_error err_;    \
		CHECK_SBX((call), &err_); \
	} while (0)

/* ---- local helpers ---- */

static void mk(const char *path, mode_t mode, uid_t owner)
{
	CHECKF(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	CHECK(chown(path, owner, owner) == 0);
	CHECK(chmod(path, mode) == 0);
}

static void put(const char *path, const char *data, mode_t mode, uid_t owner)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, strlen(data)) == (ssize_t)strlen(data));
	CHECK(fchown(fd, owner, owner) == 0);
	CHECK(fchmod(fd, mode) == 0);
	close(fd);
}

static struct stat lst(const char *path)
{
	struct stat st;
	CHECKF(lstat(path, &st) == 0, "lstat %s: %s", path, strerror(errno));
	return st;
}

/* path holds exactly want, with this mode and owner. */
static void check_file(const char *path, const char *want, mode_t mode, uid_t owner)
{
	char buf[4096];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	ssize_t n = read(fd, buf, sizeof(buf));
	close(fd);
	CHECKF(n == (ssize_t)strlen(want) && memcmp(buf, want, (size_t)n) == 0, "%s: its bytes changed", path);
	struct stat st = lst(path);
	CHECKF((st.st_mode & 07777) == mode, "%s: mode %o, want %o", path, st.st_mode & 07777, mode);
	CHECKF(st.st_uid == owner && st.st_gid == owner, "%s: owner %u:%u, want %u", path, st.st_uid, st.st_gid, owner);
}

/* Entries of dir but . and .. (hidden ones too: a temp file left behind counts). */
static int entries(const char *dir)
{
	DIR *d = opendir(dir);
	CHECKF(d != NULL, "opendir %s: %s", dir, strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

static int discard(void *ud, const void *buf, size_t len)
{
	(void)ud;
	(void)buf;
	(void)len;
	return 0;
}

static int count_entry(void *ud, const struct sbx_dirent *e)
{
	(void)ud;
	(void)e;
	return 0;
}

static int no_event(void *ud, const struct sbx_watch_event *ev)
{
	(void)ud;
	(void)ev;
	return 0;
}

/* A sink that keeps everything (archives of a few files). */
struct grab {
	char *buf;
	size_t len;
};

static int grab_sink(void *ud, const void *buf, size_t len)
{
	struct grab *g = ud;
	char *nb = realloc(g->buf, g->len + len);
	if (nb == NULL)
		return ENOMEM;
	memcpy(nb + g->len, buf, len);
	g->buf = nb;
	g->len += len;
	return 0;
}

/* The world of every case: a root daemon's files in the (0711) temp dir. */
struct world {
	char state[PATH_MAX], target[PATH_MAX + 8];
	char rootdir[PATH_MAX]; /* root's, 0755 */
	char secret[PATH_MAX];  /* root's, 0600 */
	char pub[PATH_MAX];     /* root's, 0644 */
	char mine[PATH_MAX];    /* nobody's, 0755 */
};

static const char SECRET[] = "top secret\n";
static const char PUB[] = "public\n";

static void world_init(struct world *w)
{
	CHECK(chmod(it_dir(), 0711) == 0); /* nobody must get through the temp dir */
	/* the daemon's socket and state in a directory of root's only */
	mk(it_path("priv"), 0700, 0);
	SPRINTF(w->state, "%s/state", it_path("priv"));
	mk(w->state, 0700, 0);
	SPRINTF(w->target, "unix:%s/s.sock", it_path("priv"));
	SPRINTF(w->rootdir, "%s", it_path("rootdir"));
	mk(w->rootdir, 0755, 0);
	SPRINTF(w->secret, "%s/secret", w->rootdir);
	put(w->secret, SECRET, 0600, 0);
	SPRINTF(w->pub, "%s/pub", w->rootdir);
	put(w->pub, PUB, 0644, 0);
	SPRINTF(w->mine, "%s", it_path("mine"));
	mk(w->mine, 0755, NOBODY);
}

/* The root files are as they were, and nothing was added beside them. */
static void world_unchanged(const struct world *w)
{
	check_file(w->secret, SECRET, 0600, 0);
	check_file(w->pub, PUB, 0644, 0);
	CHECK_EQ(entries(w->rootdir), 2);
	struct stat st = lst(w->rootdir);
	CHECK_EQ(st.st_mode & 07777, 0755);
	CHECK_EQ(st.st_uid, 0);
	char j[PATH_MAX + 32];
	SPRINTF(j, "%s/pending-writes", w->state);
	struct stat js;
	if (lstat(j, &js) == 0)
		CHECKF(it_journal_pending(j) == 0, "journal entries left in %s", j);
}

static bool is_root(void)
{
	if (geteuid() != 0) {
		printf("needs root: skipped\n");
		return false;
	}
	return true;
}

static struct it_daemon *start(struct world *w, const char *fs_user, const char *workers)
{
	const char *argv[12];
	size_t n = 0;
	argv[n++] = SHIM_BIN;
	argv[n++] = "--listen";
	argv[n++] = w->target;
	argv[n++] = "--state-dir";
	argv[n++] = w->state;
	if (fs_user != NULL) {
		argv[n++] = "--fs-user";
		argv[n++] = fs_user;
	}
	if (workers != NULL) {
		argv[n++] = "--workers";
		argv[n++] = workers;
	}
	argv[n] = NULL;
	return it_daemon_start_argv("shim", argv);
}

/* ---- cases ---- */

/* As nobody: what root's modes keep from others is refused with the kernel's own errno, and
 * nothing changes; the same calls without a user (the shim: root) still may. */
static int case_refused(void)
{
	if (!is_root())
		return IT_SKIP;
	struct world w;
	world_init(&w);
	struct it_daemon *d = start(&w, NULL, NULL);
	(void)d;
	struct sbx_client *c = it_connect(w.target, NULL);
	char p[PATH_MAX + 32], q[PATH_MAX + 32];
	void *data = NULL;
	size_t len = 0;

	/* reads */
	FAILS_WITH(EACCES, sbx_read_file_alloc(c, &as_nobody, w.secret, 1 << 20, &data, &len, &err_));
	OK(sbx_read_file_alloc(c, &as_nobody, w.pub, 1 << 20, &data, &len, &err_));
	CHECK(len == strlen(PUB) && memcmp(data, PUB, len) == 0);
	free(data);
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, &as_nobody, w.secret, 0, &st, &err_)); /* the directory is 0755: stat may */
	CHECK_EQ(st.uid, 0);
	/* a number works as well as the name, also one the user database does not know */
	struct sbx_call_opts by_number = {
		.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "65534"};
	FAILS_WITH(EACCES, sbx_read_file_alloc(c, &by_number, w.secret, 1 << 20, &data, &len, &err_));
	struct sbx_call_opts stranger = {
		.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "54321"};
	FAILS_WITH(EACCES, sbx_read_file_alloc(c, &stranger, w.secret, 1 << 20, &data, &len, &err_));
	OK(sbx_read_file_alloc(c, &stranger, w.pub, 1 << 20, &data, &len, &err_));
	free(data);

	/* a directory of root's that others may not read: no listing, no watch as nobody */
	char closed[PATH_MAX];
	SPRINTF(closed, "%s", it_path("closed"));
	mk(closed, 0700, 0);
	FAILS_WITH(EACCES, sbx_list(c, &as_nobody, closed, 1, 0, count_entry, NULL, NULL, &err_));
	OK(sbx_list(c, NULL, closed, 1, 0, count_entry, NULL, NULL, &err_));
	struct sbx_call_opts watch_nobody = {
		.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 10000, .user = "nobody"};
	FAILS_WITH(EACCES, sbx_watch(c, &watch_nobody, closed, 0, no_event, NULL, &err_));

	/* writes into root's directory: refused, nothing created (no temp file either) */
	SPRINTF(p, "%s/new", w.rootdir);
	FAILS_WITH(EACCES, sbx_write_file_buf(c, &as_nobody, p, 0, SBX_MODE_KEEP, "x", 1, NULL, &err_));
	FAILS_WITH(EACCES, sbx_write_file_buf(c, &as_nobody, w.pub, 0, SBX_MODE_KEEP, "x", 1, NULL, &err_));
	FAILS_WITH(EACCES,
		   sbx_write_file_buf(c, &as_nobody, w.pub, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "x", 1, NULL, &err_));
	FAILS_WITH(EACCES,
		   sbx_write_file_buf(c, &as_nobody, w.pub, SBX_WRITE_APPEND, SBX_MODE_KEEP, "x", 1, NULL, &err_));
	SPRINTF(p, "%s/d", w.rootdir);
	FAILS_WITH(EACCES, sbx_mkdir(c, &as_nobody, p, 0, 0755, &err_));
	SPRINTF(p, "%s/l", w.rootdir);
	FAILS_WITH(EACCES, sbx_symlink(c, &as_nobody, "/etc/passwd", p, &err_));
	/* a hard link to root's file: fs.protected_hardlinks (when on) refuses it first, as
	 * nobody is not its owner; else the directory's mode does */
	FILE *ph = fopen("/proc/sys/fs/protected_hardlinks", "re");
	int protected_hl = 0;
	if (ph != NULL) {
		if (fscanf(ph, "%d", &protected_hl) != 1)
			protected_hl = 0;
		fclose(ph);
	}
	FAILS_WITH(protected_hl ? EPERM : EACCES, sbx_link(c, &as_nobody, w.pub, p, &err_));
	SPRINTF(q, "%s/copy", w.rootdir);
	FAILS_WITH(EACCES, sbx_copy(c, &as_nobody, w.pub, q, 0, &err_));
	/* a copy of the secret out into nobody's own directory: the read is refused */
	SPRINTF(q, "%s/stolen", w.mine);
	FAILS_WITH(EACCES, sbx_copy(c, &as_nobody, w.secret, q, 0, &err_));
	CHECK_EQ(entries(w.mine), 0);

	/* changes to root's files */
	FAILS_WITH(EPERM, sbx_chmod(c, &as_nobody, w.secret, 0777, &err_));
	FAILS_WITH(EPERM, sbx_chmod(c, &as_nobody, w.pub, 0666, &err_));
	FAILS_WITH(EPERM, sbx_chown(c, &as_nobody, w.secret, NOBODY, NOBODY, 0, &err_));
	FAILS_WITH(EPERM, sbx_chown(c, &as_nobody, w.pub, -1, NOBODY, 0, &err_));
	FAILS_WITH(EACCES, sbx_truncate(c, &as_nobody, w.pub, 0, &err_));
	FAILS_WITH(EACCES, sbx_truncate(c, &as_nobody, w.secret, 0, &err_));
	FAILS_WITH(EACCES, sbx_remove(c, &as_nobody, w.pub, 0, &err_));
	FAILS_WITH(EACCES, sbx_remove(c, &as_nobody, w.rootdir, SBX_REMOVE_RECURSIVE, &err_));
	SPRINTF(q, "%s/moved", w.mine);
	FAILS_WITH(EACCES, sbx_rename(c, &as_nobody, w.pub, q, 0, &err_));
	struct sbx_timespec t = {1000000, 0};
	FAILS_WITH(EPERM, sbx_set_times(c, &as_nobody, w.pub, &t, &t, SBX_TOUCH_NO_CREATE, &err_));

	/* a backup, and a restore over root's directory */
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	FAILS_WITH(EACCES, sbx_backup(c, &as_nobody, w.rootdir, &bo, discard, NULL, &rec, &err_));
	sbx_backup_record_free(&rec);
	/* with skip_unreadable: the secret is listed as skipped, and its bytes are not in the archive */
	bo.skip_unreadable = 1;
	bo.compression = SBX_COMPRESS_NONE;
	struct grab g = {0};
	rec = (struct sbx_backup_record)SBX_BACKUP_RECORD_INIT;
	OK(sbx_backup(c, &as_nobody, w.rootdir, &bo, grab_sink, &g, &rec, &err_));
	CHECKF(rec.n_skipped == 1 && strstr(rec.skipped[0], "secret") != NULL, "skipped: %zu (%s)", rec.n_skipped,
	       rec.n_skipped ? rec.skipped[0] : "");
	CHECK(g.len > 0 && memmem(g.buf, g.len, PUB, strlen(PUB)) != NULL);
	CHECK(memmem(g.buf, g.len, SECRET, strlen(SECRET)) == NULL);
	free(g.buf);
	sbx_backup_record_free(&rec);
	bo.skip_unreadable = 0;
	bo.compression = 0;
	/* the backup as root, into nobody's directory, then restored over rootdir as nobody */
	SPRINTF(q, "%s/root.tar.zst", w.mine);
	bo.to_path = q;
	rec = (struct sbx_backup_record)SBX_BACKUP_RECORD_INIT;
	OK(sbx_backup(c, NULL, w.rootdir, &bo, NULL, NULL, &rec, &err_));
	sbx_backup_record_free(&rec);
	struct stat ast = lst(q);
	CHECK_EQ(ast.st_uid, 0); /* made as the shim, root */
	CHECK(chown(q, NOBODY, NOBODY) == 0);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.from_path = q;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	FAILS_WITH(EACCES, sbx_restore(c, &as_nobody, w.rootdir, &ro, NULL, NULL, &res, &err_));
	CHECK(unlink(q) == 0);
	CHECK_EQ(entries(w.mine), 0);

	world_unchanged(&w);

	/* and the shim itself (no user) still may: root reads the secret */
	OK(sbx_read_file_alloc(c, NULL, w.secret, 1 << 20, &data, &len, &err_));
	CHECK(len == strlen(SECRET) && memcmp(data, SECRET, len) == 0);
	free(data);
	OK(sbx_read_file_alloc(c, &as_root, w.secret, 1 << 20, &data, &len, &err_));
	free(data);
	sbx_client_close(c);
	return 0;
}

/* What nobody creates is nobody's, without a chown after: a write (atomic and not), a
 * directory, a copy, a symlink, a restore (whose archive says root). */
static int case_owner(void)
{
	if (!is_root())
		return IT_SKIP;
	struct world w;
	world_init(&w);
	start(&w, NULL, NULL);
	struct sbx_client *c = it_connect(w.target, NULL);
	char p[PATH_MAX + 32];
	struct sbx_stat st = SBX_STAT_INIT;

	SPRINTF(p, "%s/f", w.mine);
	OK(sbx_write_file_buf(c, &as_nobody, p, 0, SBX_MODE_KEEP, "hello\n", 6, &st, &err_));
	CHECK_EQ(st.uid, NOBODY);
	check_file(p, "hello\n", 0644, NOBODY);
	/* replaced atomically: still nobody's */
	OK(sbx_write_file_buf(c, &as_nobody, p, 0, 0600, "again\n", 6, &st, &err_));
	check_file(p, "again\n", 0600, NOBODY);
	SPRINTF(p, "%s/inplace", w.mine);
	OK(sbx_write_file_buf(c, &as_nobody, p, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "x\n", 2, NULL, &err_));
	check_file(p, "x\n", 0644, NOBODY);
	SPRINTF(p, "%s/sub/deep", w.mine);
	OK(sbx_mkdir(c, &as_nobody, p, SBX_MKDIR_PARENTS, 0750, &err_));
	struct stat ls = lst(p);
	CHECK_EQ(ls.st_uid, NOBODY);
	CHECK_EQ(ls.st_gid, NOBODY);
	SPRINTF(p, "%s/sub", w.mine);
	ls = lst(p);
	CHECK_EQ(ls.st_uid, NOBODY);
	SPRINTF(p, "%s/copy", w.mine);
	OK(sbx_copy(c, &as_nobody, w.pub, p, 0, &err_));
	check_file(p, PUB, 0644, NOBODY); /* root's file, nobody's copy */
	SPRINTF(p, "%s/link", w.mine);
	OK(sbx_symlink(c, &as_nobody, "f", p, &err_));
	ls = lst(p);
	CHECK_EQ(ls.st_uid, NOBODY);

	/* a restore as nobody of an archive of root's files: nobody's files */
	char arc[PATH_MAX + 32], dst[PATH_MAX + 32], f[PATH_MAX + 64];
	SPRINTF(arc, "%s/pub.tar", it_path("arc"));
	mk(it_path("arc"), 0755, 0);
	SPRINTF(p, "%s", it_path("src"));
	mk(p, 0755, 0);
	SPRINTF(f, "%s/a", p);
	put(f, "aaa\n", 0640, 0);
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.to_path = arc;
	bo.compression = SBX_COMPRESS_NONE;
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	OK(sbx_backup(c, NULL, p, &bo, NULL, NULL, &rec, &err_));
	sbx_backup_record_free(&rec);
	CHECK(chmod(arc, 0644) == 0);
	SPRINTF(dst, "%s/restored", w.mine);
	struct sbx_restore_opts ro = SBX_RESTORE_OPTS_INIT;
	ro.from_path = arc;
	struct sbx_restore_result res = SBX_RESTORE_RESULT_INIT;
	OK(sbx_restore(c, &as_nobody, dst, &ro, NULL, NULL, &res, &err_));
	SPRINTF(f, "%s/a", dst);
	check_file(f, "aaa\n", 0640, NOBODY);
	ls = lst(dst);
	CHECK_EQ(ls.st_uid, NOBODY);
	/* the same as root keeps the archive's owners */
	SPRINTF(dst, "%s", it_path("restored_root"));
	OK(sbx_restore(c, NULL, dst, &ro, NULL, NULL, &res, &err_));
	SPRINTF(f, "%s/a", dst);
	check_file(f, "aaa\n", 0640, 0);
	world_unchanged(&w);
	sbx_client_close(c);
	return 0;
}

/* --fs-user nobody: requests without a user act as nobody; one naming root acts as root. */
static int case_default(void)
{
	if (!is_root())
		return IT_SKIP;
	struct world w;
	world_init(&w);
	start(&w, "nobody", NULL);
	struct sbx_client *c = it_connect(w.target, NULL);
	void *data = NULL;
	size_t len = 0;
	char p[PATH_MAX + 32];

	FAILS_WITH(EACCES, sbx_read_file_alloc(c, NULL, w.secret, 1 << 20, &data, &len, &err_));
	SPRINTF(p, "%s/new", w.rootdir);
	FAILS_WITH(EACCES, sbx_write_file_buf(c, NULL, p, 0, SBX_MODE_KEEP, "x", 1, NULL, &err_));
	FAILS_WITH(EPERM, sbx_chmod(c, NULL, w.secret, 0644, &err_));
	world_unchanged(&w);
	OK(sbx_read_file_alloc(c, &as_root, w.secret, 1 << 20, &data, &len, &err_));
	CHECK(len == strlen(SECRET) && memcmp(data, SECRET, len) == 0);
	free(data);
	struct sbx_call_opts uid0 = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "0"};
	OK(sbx_read_file_alloc(c, &uid0, w.secret, 1 << 20, &data, &len, &err_));
	free(data);
	/* a group alone is for the default user: nobody with group root still may not
	 * read a 0600 file of root's */
	struct sbx_call_opts grp = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .group = "root"};
	FAILS_WITH(EACCES, sbx_read_file_alloc(c, &grp, w.secret, 1 << 20, &data, &len, &err_));
	/* a file of the default's is nobody's */
	SPRINTF(p, "%s/f", w.mine);
	OK(sbx_write_file_buf(c, NULL, p, 0, SBX_MODE_KEEP, "hi\n", 3, NULL, &err_));
	check_file(p, "hi\n", 0644, NOBODY);
	SPRINTF(p, "%s/g", w.mine);
	OK(sbx_write_file_buf(c, &as_root, p, 0, SBX_MODE_KEEP, "hi\n", 3, NULL, &err_));
	check_file(p, "hi\n", 0644, 0);
	/* after every refusal above, root's requests on the same workers still work */
	OK(sbx_read_file_alloc(c, &as_root, w.secret, 1 << 20, &data, &len, &err_));
	free(data);
	sbx_client_close(c);
	return 0;
}

/* A bad --fs-user stops the daemon at start (exit 2, naming it). */
static int case_bad_default(void)
{
	struct world w;
	SPRINTF(w.target, "unix:%s", it_path("s.sock"));
	SPRINTF(w.state, "%s", it_path("state"));
	static const char *const specs[] = {"nosuchuser_h2x", "nobody:nosuchgroup_h2x", "nobody:", ":root", ""};
	static const char *const says[] = {"unknown user nosuchuser_h2x", "unknown group nosuchgroup_h2x",
					   "want USER or USER:GROUP", "want USER or USER:GROUP",
					   "want USER or USER:GROUP"};
	for (size_t i = 0; i < ARRAY_LEN(specs); i++) {
		const char *argv[] = {SHIM_BIN, "--listen",  w.target, "--state-dir",
				      w.state,  "--fs-user", specs[i], NULL};
		struct it_daemon *d = it_daemon_spawn_argv("bad", argv);
		CHECK(it_daemon_wait_exit(d, 20000));
		CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 2, "--fs-user '%s': status %#x", specs[i],
		       d->status);
		char *log = it_daemon_log(d);
		CHECK_CONTAINS(log, says[i]);
		free(log);
	}
	/* a shim that may not switch: refused at start, not at every request */
	if (geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0) {
		const char *argv[] = {"setpriv",
				      "--reuid=65534",
				      "--regid=65534",
				      "--clear-groups",
				      "--inh-caps=-all",
				      "--bounding-set=-all",
				      SHIM_BIN,
				      "--listen",
				      w.target,
				      "--state-dir",
				      w.state,
				      "--fs-user",
				      "root",
				      NULL};
		struct it_daemon *d = it_daemon_spawn_argv("nonroot", argv);
		CHECK(it_daemon_wait_exit(d, 20000));
		CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 2, "status %#x", d->status);
		char *log = it_daemon_log(d);
		CHECK_CONTAINS(log, "--fs-user root: cannot act as user root");
		free(log);
	}
	return 0;
}

/* Unknown names are EINVAL naming them; unknown resolve bits are refused by libsbx. */
static int case_unknown(void)
{
	if (!is_root())
		return IT_SKIP;
	struct world w;
	world_init(&w);
	start(&w, NULL, NULL);
	struct sbx_client *c = it_connect(w.target, NULL);
	struct sbx_error err;
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_call_opts o = {
		.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = "nosuchuser_h2x"};
	CHECK(sbx_stat(c, &o, w.pub, 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err.message, "unknown user nosuchuser_h2x");
	CHECK(strcmp(err.path, "nosuchuser_h2x") == 0);
	void *data = NULL;
	size_t len = 0;
	CHECK(sbx_read_file_alloc(c, &o, w.pub, 1 << 20, &data, &len, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err.message, "unknown user nosuchuser_h2x");
	char p[PATH_MAX + 32];
	SPRINTF(p, "%s/x", w.mine);
	CHECK(sbx_write_file_buf(c, &o, p, 0, SBX_MODE_KEEP, "x", 1, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_EQ(entries(w.mine), 0);
	struct sbx_call_opts g = {.struct_size = sizeof(struct sbx_call_opts),
				  .timeout_ms = -1,
				  .user = "nobody",
				  .group = "nosuchgroup_h2x"};
	CHECK(sbx_stat(c, &g, w.pub, 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err.message, "unknown group nosuchgroup_h2x");
	/* a name longer than the shim takes */
	char longname[200];
	memset(longname, 'u', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	struct sbx_call_opts lo = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .user = longname};
	CHECK(sbx_read_file_alloc(c, &lo, w.pub, 1 << 20, &data, &len, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err.message, "name too long");
	struct sbx_call_opts bad = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .resolve = 0x4};
	CHECK(sbx_stat(c, &bad, w.pub, 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "unknown resolve flags");
	/* the connection is fine after all that */
	OK(sbx_stat(c, NULL, w.pub, 0, &st, &err_));
	sbx_client_close(c);
	return 0;
}

/* ---- the identity is per thread ---- */

struct racer {
	const struct world *w;
	int nobody; /* act as nobody (else as the shim) */
	int rounds;
	int idx;
	int failures;
	char why[256];
};

static void *race(void *arg)
{
	struct racer *r = arg;
	struct sbx_client *c = it_connect(r->w->target, NULL);
	const struct sbx_call_opts *o = r->nobody ? &as_nobody : NULL;
	char p[PATH_MAX + 64];
	for (int i = 0; i < r->rounds && r->failures == 0; i++) {
		struct sbx_error err;
		void *data = NULL;
		size_t len = 0;
		int rc = sbx_read_file_alloc(c, o, r->w->secret, 1 << 20, &data, &len, &err);
		free(data);
		if (r->nobody ? (rc >= 0 || err.code != EACCES) : rc < 0) {
			snprintf(r->why, sizeof(r->why), "%s read of the secret, round %d: %s",
				 r->nobody ? "nobody's" : "root's", i, rc < 0 ? it_errstr(&err) : "succeeded");
			r->failures++;
			break;
		}
		/* a one-shot operation too, and a write whose file must be its writer's */
		struct sbx_stat st = SBX_STAT_INIT;
		rc = sbx_chmod(c, o, r->w->pub, 0644, &err);
		if (r->nobody ? (rc >= 0 || err.code != EPERM) : rc < 0) {
			snprintf(r->why, sizeof(r->why), "chmod round %d: %s", i,
				 rc < 0 ? it_errstr(&err) : "succeeded");
			r->failures++;
			break;
		}
		snprintf(p, sizeof(p), "%s/t%d-%d", r->w->mine, r->idx, i % 4);
		if (sbx_write_file_buf(c, o, p, 0, SBX_MODE_KEEP, "w", 1, &st, &err) < 0 ||
		    st.uid != (r->nobody ? NOBODY : 0u)) {
			snprintf(r->why, sizeof(r->why), "write round %d: %s (uid %u)", i, it_errstr(&err), st.uid);
			r->failures++;
			break;
		}
	}
	sbx_client_close(c);
	return NULL;
}

static int case_threads(void)
{
	if (!is_root())
		return IT_SKIP;
	struct world w;
	world_init(&w);
	/* several workers, so that nobody's and root's jobs run at the same time */
	start(&w, NULL, "4");
	enum { NR = 6, ROUNDS = 60 };
	struct racer r[NR];
	pthread_t th[NR];
	for (int i = 0; i < NR; i++) {
		r[i] = (struct racer){.w = &w, .nobody = i % 2, .rounds = ROUNDS, .idx = i};
		CHECK(pthread_create(&th[i], NULL, race, &r[i]) == 0);
	}
	for (int i = 0; i < NR; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	for (int i = 0; i < NR; i++)
		CHECKF(r[i].failures == 0, "racer %d (%s): %s", i, r[i].nobody ? "nobody" : "root", r[i].why);

	/* and one after the other on one connection: every worker that served nobody
	 * serves the next request as the shim */
	struct sbx_client *c = it_connect(w.target, NULL);
	for (int i = 0; i < 40; i++) {
		void *data = NULL;
		size_t len = 0;
		FAILS_WITH(EACCES, sbx_read_file_alloc(c, &as_nobody, w.secret, 1 << 20, &data, &len, &err_));
		FAILS_WITH(EPERM, sbx_chmod(c, &as_nobody, w.secret, 0644, &err_));
		OK(sbx_read_file_alloc(c, NULL, w.secret, 1 << 20, &data, &len, &err_));
		CHECK(len == strlen(SECRET) && memcmp(data, SECRET, len) == 0);
		free(data);
		struct sbx_stat st = SBX_STAT_INIT;
		char p[PATH_MAX + 32];
		SPRINTF(p, "%s/after%d", w.rootdir, i % 2);
		OK(sbx_write_file_buf(c, NULL, p, 0, SBX_MODE_KEEP, "r", 1, &st, &err_));
		CHECK_EQ(st.uid, 0);
	}
	SPRINTF(w.pub, "%s/after0", w.rootdir);
	CHECK(unlink(w.pub) == 0);
	SPRINTF(w.pub, "%s/after1", w.rootdir);
	CHECK(unlink(w.pub) == 0);
	SPRINTF(w.pub, "%s/pub", w.rootdir);
	world_unchanged(&w);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"refused", case_refused},         {"owner", case_owner},     {"default", case_default},
		{"bad_default", case_bad_default}, {"unknown", case_unknown}, {"threads", case_threads},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
