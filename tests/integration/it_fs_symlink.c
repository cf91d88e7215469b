/* it_fs_symlink.c: symlinks planted by an untrusted user (nobody) in a directory it owns, pointing at
 * root's files, against a root daemon driven through libsbx, the sbx CLI and raw requests (issue 17.2).
 * The daemon follows a link only when its owner is the acting user, the shim's own, or the owner of
 * what it points to: everything else fails with EACCES naming the link, and root's stand-in files are
 * left byte-for-byte, mode-for-mode and owner-for-owner as they were. The per-request flags no_follow
 * (ELOOP for a link in the last component) and no_symlinks (ELOOP for a link anywhere), sent raw. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SBX_BIN
#error "SBX_BIN must name the sbx CLI"
#endif

#define NOBODY 65534
#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* An SDK call that must fail in the shim with code, naming want_path, its message containing
 * want_msg; the call names its error struct err_. */
#define FAILS(code, want_path, want_msg, call)                                                                       \
	do {                                                                                                         \
		struct sbx_error err_;                                                                               \
		memset(&err_, 0, sizeof(err_));                                                                      \
		if ((call) >= 0)                                                                                     \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code));           \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                              \
		CHECKF(strcmp(err_.path, (want_path)) == 0, "%s: the error names '%s', want '%s'", #call, err_.path, \
		       (want_path));                                                                                 \
		CHECKF(strstr(err_.message, (want_msg)) != NULL, "%s: message '%s' lacks '%s'", #call, err_.message, \
		       (want_msg));                                                                                  \
		last_err = err_;                                                                                     \
	} while (0)

static struct sbx_error last_err; /* of the last FAILS */

#define OK(call)                          \
	do {                              \
		struct sbx_error err_;    \
		CHECK_SBX((call), &err_); \
	} while (0)

/* ---- local helpers ---- */

static const char *join(const char *a, const char *b)
{
	static _Thread_local char buf[8][PATH_MAX];
	static _Thread_local unsigned slot;
	char *out = buf[slot++ % 8];
	CHECK(snprintf(out, PATH_MAX, "%s/%s", a, b) < PATH_MAX);
	return out;
}

static void mk(const char *path, mode_t mode, uid_t owner)
{
	CHECKF(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	CHECK(chown(path, owner, owner) == 0);
	CHECK(chmod(path, mode) == 0);
}

static void put(const char *path, const char *data, mode_t mode, uid_t owner)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	size_t len = strlen(data);
	CHECK(write(fd, data, len) == (ssize_t)len);
	CHECK(fchown(fd, owner, owner) == 0);
	CHECK(fchmod(fd, mode) == 0); /* after chown, which clears set-id bits */
	close(fd);
}

static bool lexists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static struct stat lst(const char *path)
{
	struct stat st;
	CHECKF(lstat(path, &st) == 0, "lstat %s: %s", path, strerror(errno));
	return st;
}

static int count_entries(const char *dir)
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

/* The file's bytes (at most size-1, NUL-terminated); fails the test if it cannot be read. */
static void slurp(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	ssize_t n = read(fd, buf, size - 1);
	CHECK(n >= 0);
	buf[n] = '\0';
	close(fd);
}

/* Run argv as nobody (setpriv), wait, return its exit status. */
static int as_nobody(const char *const argv[])
{
	const char *full[32] = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
	int n = 4;
	for (int i = 0; argv[i] != NULL; i++) {
		CHECK(n < 31);
		full[n++] = argv[i];
	}
	full[n] = NULL;
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execv(full[0], (char *const *)full);
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		CHECK(errno == EINTR);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* nobody, in dir: `ln -s TARGET LINK` for each pair (NULL-terminated list of pairs). */
static void nobody_links(const char *dir, ...) __attribute__((sentinel));
static void nobody_links(const char *dir, ...)
{
	const char *argv[32] = {"/bin/sh", "-c",
				"cd \"$1\" && shift && while [ $# -gt 1 ]; do ln -s \"$1\" \"$2\" || exit 1; shift 2; "
				"done",
				"sh", dir};
	int n = 5;
	va_list ap;
	va_start(ap, dir);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL) {
		CHECK(n < 31);
		argv[n++] = a;
	}
	va_end(ap);
	argv[n] = NULL;
	CHECKF(as_nobody(argv) == 0, "nobody could not make its links in %s", dir);
}

/* ---- root's stand-ins: what nothing may change ---- */

struct standin {
	char path[PATH_MAX];
	char content[256];
	struct stat st;
};

struct standins {
	char dir[PATH_MAX];  /* root's, 0755 */
	char rdir[PATH_MAX]; /* root's directory with content */
	struct standin f[4]; /* suid, passwd, shadow, rdir/keep */
	int ndir, nrdir;     /* their entry counts */
};

enum { S_SUID, S_PASSWD, S_SHADOW, S_KEEP };

static void standins_make(struct standins *s, const char *dir)
{
	SPRINTF(s->dir, "%s", dir);
	mk(s->dir, 0755, 0);
	SPRINTF(s->rdir, "%s/rdir", dir);
	mk(s->rdir, 0755, 0);
	mk(join(s->rdir, "sub"), 0755, 0);
	put(join(s->rdir, "sub/inner"), "inner\n", 0644, 0);
	static const struct {
		const char *name, *content;
		mode_t mode;
	} files[] = {
		{"suid", "#!/bin/sh\necho root binary\n", 04755},
		{"passwd", "root:x:0:0:root:/root:/bin/bash\n", 0644},
		{"shadow", "root:$6$secret:19000:0:99999:7:::\n", 0600},
		{"rdir/keep", "kept\n", 0644},
	};
	for (size_t i = 0; i < ARRAY_LEN(files); i++) {
		SPRINTF(s->f[i].path, "%s/%s", dir, files[i].name);
		put(s->f[i].path, files[i].content, files[i].mode, 0);
	}
	for (size_t i = 0; i < ARRAY_LEN(s->f); i++) {
		slurp(s->f[i].path, s->f[i].content, sizeof(s->f[i].content));
		s->f[i].st = lst(s->f[i].path);
	}
	CHECK_EQ(s->f[S_SUID].st.st_mode & 07777, 04755);
	s->ndir = count_entries(s->dir);
	s->nrdir = count_entries(s->rdir);
}

/* Every stand-in byte-for-byte, mode-for-mode, owner-for-owner as made; nothing created. */
static void standins_check(const struct standins *s, const char *after)
{
	for (size_t i = 0; i < ARRAY_LEN(s->f); i++) {
		const struct standin *f = &s->f[i];
		struct stat st = lst(f->path);
		char now[256];
		slurp(f->path, now, sizeof(now));
		CHECKF(strcmp(now, f->content) == 0, "after %s: %s holds '%s', not '%s'", after, f->path, now,
		       f->content);
		CHECKF(st.st_mode == f->st.st_mode && st.st_uid == f->st.st_uid && st.st_gid == f->st.st_gid &&
			       st.st_ino == f->st.st_ino && st.st_size == f->st.st_size,
		       "after %s: %s is %o %u:%u ino %lu, was %o %u:%u ino %lu", after, f->path, (unsigned)st.st_mode,
		       (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned long)st.st_ino, (unsigned)f->st.st_mode,
		       (unsigned)f->st.st_uid, (unsigned)f->st.st_gid, (unsigned long)f->st.st_ino);
		CHECKF(st.st_mtim.tv_sec == f->st.st_mtim.tv_sec && st.st_mtim.tv_nsec == f->st.st_mtim.tv_nsec,
		       "after %s: %s has a new mtime", after, f->path);
	}
	CHECKF(count_entries(s->dir) == s->ndir, "after %s: %d entries in %s, was %d", after, count_entries(s->dir),
	       s->dir, s->ndir);
	CHECKF(count_entries(s->rdir) == s->nrdir, "after %s: %d entries in %s, was %d", after, count_entries(s->rdir),
	       s->rdir, s->nrdir);
	CHECKF(lexists(join(s->rdir, "sub/inner")), "after %s: %s/sub/inner is gone", after, s->rdir);
}

static int count_cb(void *ud, const struct sbx_dirent *e)
{
	(void)e;
	(*(int *)ud)++;
	return 0;
}

/* ---- the sbx CLI ---- */

static void read_text(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	ssize_t n = read(fd, buf, size - 1);
	CHECK(n >= 0);
	buf[n] = '\0';
	close(fd);
}

/* Run the CLI against target (stdin from in, or /dev/null); stderr into errbuf. Its exit status. */
static int cli(const char *target, const char *in, char *errbuf, size_t err_size, ...) __attribute__((sentinel));
static int cli(const char *target, const char *in, char *errbuf, size_t err_size, ...)
{
	const char *argv[32] = {SBX_BIN, "-t", target, "--timeout", "30"};
	int argc = 5;
	va_list ap;
	va_start(ap, err_size);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL) {
		CHECK(argc < 31);
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;
	char opath[PATH_MAX], epath[PATH_MAX];
	SPRINTF(opath, "%s", it_path("cli.out"));
	SPRINTF(epath, "%s", it_path("cli.err"));
	int ifd = open(in != NULL ? in : "/dev/null", O_RDONLY | O_CLOEXEC);
	int ofd = open(opath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int efd = open(epath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(ifd >= 0 && ofd >= 0 && efd >= 0);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		dup2(ifd, STDIN_FILENO);
		dup2(ofd, STDOUT_FILENO);
		dup2(efd, STDERR_FILENO);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(ifd);
	close(ofd);
	close(efd);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		CHECK(errno == EINTR);
	read_text(epath, errbuf, err_size);
	char out[256];
	read_text(opath, out, sizeof(out));
	CHECKF(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || out[0] == '\0'), "sbx %s printed '%s' and failed", argv[5],
	       out);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The CLI command must fail with EACCES naming path (and a symlink in its text). */
static void cli_refused(const char *target, const char *in, const char *path, const char *cmd, const char *arg1,
			const char *arg2, const char *arg3)
{
	char errtext[2048], want[PATH_MAX + 32];
	int rc = cli(target, in, errtext, sizeof(errtext), cmd, arg1, arg2, arg3, NULL);
	SPRINTF(want, "sbx: EACCES: %s:", path);
	CHECKF(rc == 1 && strncmp(errtext, want, strlen(want)) == 0, "sbx %s %s: exit %d, stderr '%s', want '%s...'",
	       cmd, arg1, rc, errtext, want);
	CHECK_CONTAINS(errtext, "symlink");
}

/* ---- the daemon ---- */

struct daemon {
	char sock[PATH_MAX], target[PATH_MAX + 8];
	struct it_daemon *d;
	struct sbx_client *c;
};

static void daemon_start(struct daemon *dm, const char *root)
{
	/* (the socket in a directory of its own: not beside the state dir) */
	if (!lexists(it_path("run")))
		CHECK(mkdir(it_path("run"), 0700) == 0);
	SPRINTF(dm->sock, "%s/shim.sock", it_path("run"));
	SPRINTF(dm->target, "unix:%s", dm->sock);
	if (root != NULL)
		dm->d = it_daemon_start("shim", "--listen", dm->target, "--state-dir", it_path("state"), "--root", root,
					NULL);
	else
		dm->d = it_daemon_start("shim", "--listen", dm->target, "--state-dir", it_path("state"), NULL);
	dm->c = it_connect(dm->target, NULL);
}

static void daemon_stop(struct daemon *dm)
{
	sbx_client_close(dm->c);
	int ds = it_daemon_stop(dm->d);
	CHECKF(WIFEXITED(ds) && WEXITSTATUS(ds) == 0, "exit status 0x%x after SIGTERM (want 0)", ds);
}

static bool skip_unless_root(void)
{
	if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
		printf("needs root and setpriv(1): skipped\n");
		return true;
	}
	/* nobody must get through the temp dir (mkdtemp made it 0700) */
	CHECK(chmod(it_dir(), 0711) == 0);
	return false;
}

/* ---- the attack: nobody's links at root's files, every operation ----
 * base: the directory holding home/ and files/ on the host; pfx: the same as the
 * daemon sees it ("" without --root, "" too with --root base). */

static void attack(struct daemon *dm, const struct standins *s, const char *home, const char *lhome)
{
	struct sbx_client *c = dm->c;
	char p_suid[PATH_MAX], p_passwd[PATH_MAX], p_shadow[PATH_MAX], p_dangling[PATH_MAX], p_parent[PATH_MAX],
		p_chain[PATH_MAX], p_own[PATH_MAX];
	SPRINTF(p_suid, "%s/suid", lhome);
	SPRINTF(p_passwd, "%s/passwd", lhome);
	SPRINTF(p_shadow, "%s/shadow", lhome);
	SPRINTF(p_dangling, "%s/dangling", lhome);
	SPRINTF(p_parent, "%s/parent", lhome);
	SPRINTF(p_chain, "%s/chain", lhome);
	SPRINTF(p_own, "%s/own", lhome);
	const char *NOT = "not following the symlink";
	char in_parent[PATH_MAX], in_parent_sub[PATH_MAX], in_parent_keep[PATH_MAX];
	SPRINTF(in_parent, "%s/parent", lhome);
	SPRINTF(in_parent_sub, "%s/parent/sub", lhome);
	SPRINTF(in_parent_keep, "%s/parent/keep", lhome);

	static const char data[] = "owned by nobody\n";
	struct sbx_stat st = SBX_STAT_INIT;
	/* put: replace the set-uid binary's content */
	FAILS(EACCES, p_suid, NOT,
	      sbx_write_file_buf(c, NULL, p_suid, 0, SBX_MODE_KEEP, data, sizeof(data) - 1, &st, &err_));
	CHECK_CONTAINS(last_err.message, p_suid);
	CHECK_CONTAINS(last_err.message, "uid 65534");
	CHECK_CONTAINS(last_err.message, "(uid 0)");
	FAILS(EACCES, p_suid, NOT,
	      sbx_write_file_buf(c, NULL, p_suid, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, data, sizeof(data) - 1, &st,
				 &err_));
	/* put --append: a line added to passwd */
	FAILS(EACCES, p_passwd, NOT,
	      sbx_write_file_buf(c, NULL, p_passwd, SBX_WRITE_APPEND, SBX_MODE_KEEP, data, sizeof(data) - 1, &st,
				 &err_));
	/* chmod, chown: shadow made 0666 and nobody's */
	FAILS(EACCES, p_shadow, NOT, sbx_chmod(c, NULL, p_shadow, 0666, &err_));
	FAILS(EACCES, p_shadow, NOT, sbx_chown(c, NULL, p_shadow, NOBODY, NOBODY, 0, &err_));
	/* cat, stat -L, cp: the secret sent to the host, copied out */
	void *got = NULL;
	size_t glen = 0;
	FAILS(EACCES, p_shadow, NOT, sbx_read_file_alloc(c, NULL, p_shadow, 1 << 20, &got, &glen, &err_));
	FAILS(EACCES, p_shadow, NOT, sbx_stat(c, NULL, p_shadow, SBX_STAT_FOLLOW, &st, &err_));
	FAILS(EACCES, p_shadow, NOT, sbx_copy(c, NULL, p_shadow, join(lhome, "copied"), 0, &err_));
	CHECK(!lexists(join(home, "copied")));
	/* truncate, touch */
	FAILS(EACCES, p_passwd, NOT, sbx_truncate(c, NULL, p_passwd, 0, &err_));
	FAILS(EACCES, p_passwd, NOT, sbx_set_times(c, NULL, p_passwd, NULL, NULL, SBX_TOUCH_NO_CREATE, &err_));
	/* touch through a dangling link: a root file created where it points */
	FAILS(EACCES, p_dangling, "dangling symlink", sbx_set_times(c, NULL, p_dangling, NULL, NULL, 0, &err_));
	CHECK_CONTAINS(last_err.message, "(uid 65534) is not the acting user");
	/* (an append never creates through a dangling link: ENOENT, as before) */
	FAILS(ENOENT, p_dangling, "open",
	      sbx_write_file_buf(c, NULL, p_dangling, SBX_WRITE_APPEND, SBX_MODE_KEEP, data, sizeof(data) - 1, &st,
				 &err_));
	/* a chain: nobody's link to nobody's link to root's binary; each link against the final file */
	FAILS(EACCES, p_chain, NOT,
	      sbx_write_file_buf(c, NULL, p_chain, 0, SBX_MODE_KEEP, data, sizeof(data) - 1, &st, &err_));
	FAILS(EACCES, p_chain, NOT, sbx_chmod(c, NULL, p_chain, 0777, &err_));
	/* a symlinked parent: rm -r, mkdir, rename, write, copy into, list through it */
	FAILS(EACCES, in_parent_sub, NOT, sbx_remove(c, NULL, in_parent_sub, SBX_REMOVE_RECURSIVE, &err_));
	FAILS(EACCES, in_parent_keep, NOT, sbx_remove(c, NULL, in_parent_keep, 0, &err_));
	FAILS(EACCES, in_parent_sub, NOT, sbx_mkdir(c, NULL, in_parent_sub, 0, 0755, &err_));
	FAILS(EACCES, join(in_parent_sub, "new"), NOT,
	      sbx_mkdir(c, NULL, join(in_parent_sub, "new"), SBX_MKDIR_PARENTS, 0755, &err_));
	FAILS(EACCES, in_parent_keep, NOT, sbx_rename(c, NULL, in_parent_keep, join(lhome, "stolen"), 0, &err_));
	FAILS(EACCES, join(in_parent, "new"), NOT,
	      sbx_write_file_buf(c, NULL, join(in_parent, "new"), 0, SBX_MODE_KEEP, data, sizeof(data) - 1, &st,
				 &err_));
	FAILS(EACCES, join(in_parent, "new"), NOT, sbx_copy(c, NULL, p_own, join(in_parent, "new"), 0, &err_));
	FAILS(EACCES, in_parent_keep, NOT, sbx_chmod(c, NULL, in_parent_keep, 0666, &err_));
	FAILS(EACCES, in_parent_keep, NOT,
	      sbx_chown(c, NULL, in_parent_keep, NOBODY, NOBODY, SBX_CHOWN_NOFOLLOW, &err_));
	FAILS(EACCES, in_parent_keep, NOT, sbx_stat(c, NULL, in_parent_keep, 0, &st, &err_));
	uint64_t n = 0;
	int seen = 0;
	FAILS(EACCES, in_parent, NOT, sbx_list(c, NULL, in_parent, 1, 0, count_cb, &seen, &n, &err_));
	CHECK_EQ(seen, 0);
	CHECK(!lexists(join(home, "stolen")));
	standins_check(s, "the SDK calls");

	/* the same through the sbx CLI */
	char in[PATH_MAX];
	SPRINTF(in, "%s", it_path("cli.in"));
	it_write_file(in, "owned by nobody\n");
	cli_refused(dm->target, in, p_suid, "put", p_suid, NULL, NULL);
	cli_refused(dm->target, in, p_passwd, "put", "--append", p_passwd, NULL);
	cli_refused(dm->target, NULL, p_shadow, "chmod", "0666", p_shadow, NULL);
	cli_refused(dm->target, NULL, p_shadow, "chown", "65534:65534", p_shadow, NULL);
	cli_refused(dm->target, NULL, p_shadow, "cat", p_shadow, NULL, NULL);
	cli_refused(dm->target, NULL, p_passwd, "truncate", "-s", "0", p_passwd);
	cli_refused(dm->target, NULL, p_dangling, "touch", p_dangling, NULL, NULL);
	cli_refused(dm->target, NULL, in_parent_sub, "rm", "-r", in_parent_sub, NULL);
	cli_refused(dm->target, NULL, p_shadow, "cp", p_shadow, join(lhome, "copied"), NULL);
	CHECK(!lexists(join(home, "copied")));
	standins_check(s, "the CLI commands");

	/* nobody's links stay links, nobody's own file as it was */
	CHECK(S_ISLNK(lst(join(home, "suid")).st_mode));
	CHECK(S_ISLNK(lst(join(home, "dangling")).st_mode));
	CHECK(S_ISLNK(lst(join(home, "parent")).st_mode));
}

/* Links that are followed: root's own, nobody's to nobody's file; set-id bits are not carried
 * over through a link. */
static void allowed(struct daemon *dm, const struct standins *s, const char *home, const char *lhome,
		    const char *lfiles)
{
	struct sbx_client *c = dm->c;
	struct sbx_stat st = SBX_STAT_INIT;
	/* root's link to root's passwd: followed for reading */
	char t[PATH_MAX];
	SPRINTF(t, "%s/passwd", lfiles);
	CHECK(symlink(t, join(home, "rootlink")) == 0);
	void *got = NULL;
	size_t glen = 0;
	OK(sbx_read_file_alloc(c, NULL, join(lhome, "rootlink"), 1 << 20, &got, &glen, &err_));
	CHECK(glen == strlen(s->f[S_PASSWD].content) && memcmp(got, s->f[S_PASSWD].content, glen) == 0);
	free(got);
	OK(sbx_stat(c, NULL, join(lhome, "rootlink"), SBX_STAT_FOLLOW, &st, &err_));
	CHECK_EQ(st.inode, s->f[S_PASSWD].st.st_ino);
	/* nobody's link to nobody's set-uid file: followed; the new content replaces it, nobody's still,
	 * without the set-uid bit */
	OK(sbx_read_file_alloc(c, NULL, join(lhome, "tomine"), 1 << 20, &got, &glen, &err_));
	CHECK(glen == 5 && memcmp(got, "mine\n", 5) == 0);
	free(got);
	CHECK_EQ(lst(join(home, "mine")).st_mode & 07777, 04755);
	OK(sbx_write_file_buf(c, NULL, join(lhome, "tomine"), 0, SBX_MODE_KEEP, "new\n", 4, &st, &err_));
	struct stat m = lst(join(home, "mine"));
	char now[64];
	slurp(join(home, "mine"), now, sizeof(now));
	CHECKF(strcmp(now, "new\n") == 0, "mine holds '%s'", now);
	CHECKF((m.st_mode & 07777) == 0755 && m.st_uid == NOBODY && m.st_gid == NOBODY,
	       "mine written through a link: %o %u:%u, want 0755 65534:65534", (unsigned)(m.st_mode & 07777),
	       (unsigned)m.st_uid, (unsigned)m.st_gid);
	CHECK(S_ISLNK(lst(join(home, "tomine")).st_mode));
	/* without a link, the set-uid bit of the file written is kept (the old rule) */
	CHECK(chmod(join(home, "mine"), 04755) == 0);
	OK(sbx_write_file_buf(c, NULL, join(lhome, "mine"), 0, SBX_MODE_KEEP, "newer\n", 6, &st, &err_));
	CHECK_EQ(lst(join(home, "mine")).st_mode & 07777, 04755);
	CHECK_EQ(st.mode, 04755);
	/* chmod through nobody's link to nobody's file */
	OK(sbx_chmod(c, NULL, join(lhome, "tomine"), 0640, &err_));
	CHECK_EQ(lst(join(home, "mine")).st_mode & 07777, 0640);
	/* a copy of root's set-uid binary through root's link drops the set-uid bit */
	SPRINTF(t, "%s/suid", lfiles);
	CHECK(symlink(t, join(home, "rootsuid")) == 0);
	OK(sbx_copy(c, NULL, join(lhome, "rootsuid"), join(lhome, "suidcopy"), 0, &err_));
	CHECK_EQ(lst(join(home, "suidcopy")).st_mode & 07777, 0755);
	/* and root's link to the set-uid binary, written: the binary keeps owner, loses set-uid */
	/* (not done to the stand-in: a copy of it) */
	put(join(s->dir, "suid2"), "#!/bin/sh\n", 04755, 0);
	SPRINTF(t, "%s/suid2", lfiles);
	CHECK(symlink(t, join(home, "rootsuid2")) == 0);
	OK(sbx_write_file_buf(c, NULL, join(lhome, "rootsuid2"), 0, SBX_MODE_KEEP, "x\n", 2, &st, &err_));
	m = lst(join(s->dir, "suid2"));
	CHECKF((m.st_mode & 07777) == 0755 && m.st_uid == 0, "suid2 written through root's link: %o uid %u",
	       (unsigned)(m.st_mode & 07777), (unsigned)m.st_uid);
	CHECK(unlink(join(s->dir, "suid2")) == 0);
	/* symlink-free paths: as ever */
	OK(sbx_write_file_buf(c, NULL, join(lhome, "plain"), 0, 0600, "plain\n", 6, &st, &err_));
	OK(sbx_stat(c, NULL, join(lhome, "plain"), SBX_STAT_FOLLOW, &st, &err_));
	CHECK_EQ(st.size, 6);
	OK(sbx_chmod(c, NULL, join(lhome, "plain"), 0644, &err_));
	OK(sbx_remove(c, NULL, join(lhome, "plain"), 0, &err_));
	standins_check(s, "the allowed calls");
}

/* home (nobody's) and files (root's stand-ins) in base; links with targets as the daemon sees them
 * (lfiles, lhome). */
static void setup(const char *base, const char *lfiles, const char *lhome, struct standins *s, char *home,
		  size_t home_size)
{
	standins_make(s, join(base, "files"));
	CHECK(snprintf(home, home_size, "%s/home", base) < (int)home_size);
	mk(home, 0755, NOBODY);
	char t_suid[PATH_MAX], t_passwd[PATH_MAX], t_shadow[PATH_MAX], t_new[PATH_MAX], t_rdir[PATH_MAX],
		t_chain[PATH_MAX];
	SPRINTF(t_suid, "%s/suid", lfiles);
	SPRINTF(t_passwd, "%s/passwd", lfiles);
	SPRINTF(t_shadow, "%s/shadow", lfiles);
	SPRINTF(t_new, "%s/new", lfiles);
	SPRINTF(t_rdir, "%s/rdir", lfiles);
	SPRINTF(t_chain, "%s/suid", lhome);
	const char *mkmine[] = {"/bin/sh",
				"-c",
				"cd \"$1\" && printf 'mine\\n' > mine && chmod 4755 mine && "
				"printf 'own\\n' > own",
				"sh",
				home,
				NULL};
	CHECKF(as_nobody(mkmine) == 0, "nobody could not make its files");
	nobody_links(home, t_suid, "suid", t_passwd, "passwd", t_shadow, "shadow", t_new, "dangling", t_rdir, "parent",
		     t_chain, "chain", "mine", "tomine", NULL);
	CHECK_EQ(lst(join(home, "suid")).st_uid, NOBODY);
}

static int case_escape(void)
{
	if (skip_unless_root())
		return IT_SKIP;
	struct standins s;
	char home[PATH_MAX], files[PATH_MAX];
	SPRINTF(files, "%s", it_path("files"));
	setup(it_dir(), files, it_path("home"), &s, home, sizeof(home));
	struct daemon dm;
	daemon_start(&dm, NULL);
	attack(&dm, &s, home, home);
	allowed(&dm, &s, home, home, files);
	daemon_stop(&dm);
	standins_check(&s, "the daemon stopped");
	return 0;
}

/* The same inside --root R: the rule holds beneath the root too, and the root still confines
 * (a link's "..", absolute targets). */
static int case_confined(void)
{
	if (skip_unless_root())
		return IT_SKIP;
	char R[PATH_MAX];
	SPRINTF(R, "%s", it_path("root"));
	mk(R, 0755, 0);
	struct standins s;
	char home[PATH_MAX];
	setup(R, "/files", "/home", &s, home, sizeof(home));
	/* outside the root, a file of root's that root's own links inside must not reach */
	char outside[PATH_MAX];
	SPRINTF(outside, "%s", it_path("outside"));
	put(outside, "outside\n", 0644, 0);
	CHECK(symlink("/../outside", join(R, "up_abs")) == 0);
	CHECK(symlink("../../outside", join(home, "up_rel")) == 0); /* root's link in nobody's dir */
	struct daemon dm;
	daemon_start(&dm, R);
	attack(&dm, &s, home, "/home");
	allowed(&dm, &s, home, "/home", "/files");
	/* root's links: followed, but never out of R: the outside file is not found... */
	struct sbx_stat st = SBX_STAT_INIT;
	FAILS(ENOENT, "/up_abs", "open", sbx_stat(dm.c, NULL, "/up_abs", SBX_STAT_FOLLOW, &st, &err_));
	FAILS(ENOENT, "/home/up_rel", "open", sbx_stat(dm.c, NULL, "/home/up_rel", SBX_STAT_FOLLOW, &st, &err_));
	/* ...and touch through them creates R/outside, not the one outside R; then an append */
	OK(sbx_set_times(dm.c, NULL, "/up_abs", NULL, NULL, 0, &err_));
	CHECK_EQ(lst(join(R, "outside")).st_size, 0);
	OK(sbx_write_file_buf(dm.c, NULL, "/home/up_rel", SBX_WRITE_APPEND, 0600, "in\n", 3, &st, &err_));
	char now[64];
	slurp(join(R, "outside"), now, sizeof(now));
	CHECK(strcmp(now, "in\n") == 0);
	slurp(outside, now, sizeof(now));
	CHECK(strcmp(now, "outside\n") == 0);
	daemon_stop(&dm);
	standins_check(&s, "the daemon stopped");
	return 0;
}

/* ---- no_follow and no_symlinks, as raw requests ---- */

struct raw {
	int fd;
	uint32_t stream;
};

/* Send req with the FsOptions flags; for a write, then data and FIN. Returns 0 on END (its
 * Result into *res if not NULL, caller frees), else the errno of the ERROR (message into msg). */
static const char *raw_user; /* FsOptions.user of the raw requests (NULL: none) */

static int raw_call(struct raw *r, Shim__V1__Request *req, bool no_follow, bool no_symlinks, const char *data,
		    char *msg, size_t msg_size, Shim__V1__Result **res)
{
	Shim__V1__FsOptions fo = SHIM__V1__FS_OPTIONS__INIT;
	fo.user = (char *)(uintptr_t)raw_user;
	if (no_follow) {
		fo.has_no_follow = 1;
		fo.no_follow = 1;
	}
	if (no_symlinks) {
		fo.has_no_symlinks = 1;
		fo.no_symlinks = 1;
	}
	req->fs = &fo;
	uint32_t id = r->stream;
	r->stream += 2;
	size_t n = shim__v1__request__get_packed_size(req);
	uint8_t *buf = malloc(n + 1);
	CHECK(buf != NULL);
	shim__v1__request__pack(req, buf);
	raw_send(r->fd, id, FRAME_REQUEST, 0, buf, n);
	free(buf);
	if (data != NULL)
		raw_send(r->fd, id, FRAME_DATA, FRAME_FLAG_FIN, data, strlen(data));
	uint64_t deadline = it_now_ms() + 20000;
	for (;;) {
		struct frame_hdr h;
		uint8_t *p = NULL;
		uint64_t now = it_now_ms();
		CHECKF(now < deadline, "no END or ERROR on stream %u", id);
		CHECKF(raw_recv(r->fd, &h, &p, (unsigned)(deadline - now)) == 1, "EOF on stream %u", id);
		if (h.type == FRAME_PING)
			raw_send(r->fd, 0, FRAME_PONG, 0, p, h.len);
		if (h.stream == id && h.type == FRAME_END) {
			if (res != NULL) {
				*res = shim__v1__result__unpack(NULL, h.len, p);
				CHECK(*res != NULL);
			}
			free(p);
			return 0;
		}
		if ((h.stream == id || h.stream == 0) && h.type == FRAME_ERROR) {
			CHECKF(h.stream == id, "connection-level ERROR");
			int code = raw_error_code(p, h.len, msg, msg_size);
			free(p);
			CHECK(code != 0);
			return code;
		}
		free(p);
	}
}

static ProtobufCBinaryData bin(const char *s)
{
	return (ProtobufCBinaryData){.len = strlen(s), .data = (uint8_t *)(uintptr_t)s};
}

static int raw_stat(struct raw *r, const char *path, bool follow, bool nf, bool ns, char *msg, size_t ms, uint64_t *ino)
{
	Shim__V1__StatRequest q = SHIM__V1__STAT_REQUEST__INIT;
	q.path = bin(path);
	q.has_follow = 1;
	q.follow = follow;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_STAT;
	req.stat = &q;
	Shim__V1__Result *res = NULL;
	int rc = raw_call(r, &req, nf, ns, NULL, msg, ms, &res);
	if (rc == 0) {
		CHECK(res->kind_case == SHIM__V1__RESULT__KIND_STAT);
		if (ino != NULL)
			*ino = res->stat->inode;
		shim__v1__result__free_unpacked(res, NULL);
	}
	return rc;
}

static int raw_chmod(struct raw *r, const char *path, unsigned mode, bool nf, bool ns, char *msg, size_t ms)
{
	Shim__V1__ChmodRequest q = SHIM__V1__CHMOD_REQUEST__INIT;
	q.path = bin(path);
	q.has_mode = 1;
	q.mode = mode;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_CHMOD;
	req.chmod = &q;
	return raw_call(r, &req, nf, ns, NULL, msg, ms, NULL);
}

static int raw_chown_nofollow(struct raw *r, const char *path, bool nf, bool ns, char *msg, size_t ms)
{
	Shim__V1__ChownRequest q = SHIM__V1__CHOWN_REQUEST__INIT;
	q.path = bin(path);
	q.has_uid = 1;
	q.uid = 0;
	q.has_no_follow = 1;
	q.no_follow = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_CHOWN;
	req.chown = &q;
	return raw_call(r, &req, nf, ns, NULL, msg, ms, NULL);
}

static int raw_write(struct raw *r, const char *path, const char *data, bool append, bool nf, bool ns, char *msg,
		     size_t ms)
{
	Shim__V1__WriteRequest q = SHIM__V1__WRITE_REQUEST__INIT;
	q.path = bin(path);
	if (append) {
		q.has_append = 1;
		q.append = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
	req.write = &q;
	return raw_call(r, &req, nf, ns, data, msg, ms, NULL);
}

static int raw_read(struct raw *r, const char *path, bool nf, bool ns, char *msg, size_t ms)
{
	Shim__V1__ReadRequest q = SHIM__V1__READ_REQUEST__INIT;
	q.path = bin(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READ;
	req.read = &q;
	return raw_call(r, &req, nf, ns, NULL, msg, ms, NULL);
}

#define WANT(code, call, text)                                                                                        \
	do {                                                                                                          \
		char m_[256] = "";                                                                                    \
		int rc_ = (call);                                                                                     \
		CHECKF(rc_ == (code), "%s: %s (%s), want %s", #call, rc_ ? sbx_errno_name(rc_) : "success", m_,       \
		       (code) ? sbx_errno_name(code) : "success");                                                    \
		const char *t_ = (text);                                                                              \
		CHECKF(t_ == NULL || strstr(m_, t_) != NULL, "%s: message '%s' lacks '%s'", #call, m_, t_ ? t_ : ""); \
	} while (0)
#define M m_, sizeof(m_)

static int case_flags(void)
{
	/* root's files and root's links (the owner rule lets them through): only the flags refuse */
	char dir[PATH_MAX], file[PATH_MAX], link[PATH_MAX], dlink[PATH_MAX], via[PATH_MAX], dangling[PATH_MAX];
	SPRINTF(dir, "%s", it_path("d"));
	CHECK(mkdir(dir, 0755) == 0);
	SPRINTF(file, "%s/file", dir);
	put(file, "original\n", 0644, 0);
	SPRINTF(link, "%s", it_path("link"));
	CHECK(symlink(file, link) == 0);
	SPRINTF(dlink, "%s", it_path("dlink"));
	CHECK(symlink(dir, dlink) == 0);
	SPRINTF(via, "%s/file", dlink); /* a link mid-path */
	SPRINTF(dangling, "%s", it_path("dangling"));
	CHECK(symlink(it_path("nothing"), dangling) == 0);
	struct stat before = lst(file);

	struct daemon dm;
	daemon_start(&dm, NULL);
	struct raw r = {.fd = raw_connect_unix(dm.sock), .stream = 1};
	raw_hello(r.fd, NULL);
	uint64_t ino = 0;

	/* no flags: followed */
	WANT(0, raw_stat(&r, link, true, false, false, M, &ino), NULL);
	CHECK_EQ(ino, before.st_ino);
	WANT(0, raw_stat(&r, via, true, false, false, M, &ino), NULL);
	/* no_follow: the last component may not be a link */
	WANT(ELOOP, raw_stat(&r, link, true, true, false, M, NULL), "no_follow");
	WANT(0, raw_stat(&r, link, false, true, false, M, &ino), NULL); /* lstat: the link itself */
	CHECK_EQ(ino, lst(link).st_ino);
	WANT(ELOOP, raw_chmod(&r, link, 0600, true, false, M), "no_follow");
	WANT(ELOOP, raw_write(&r, link, "replaced\n", false, true, false, M), NULL);
	WANT(ELOOP, raw_write(&r, link, "appended\n", true, true, false, M), NULL);
	WANT(ELOOP, raw_read(&r, link, true, false, M), NULL);
	WANT(ELOOP, raw_write(&r, dangling, "created\n", true, true, false, M), NULL);
	CHECK(!lexists(it_path("nothing")));
	/* ...but a link on the way is followed */
	WANT(0, raw_stat(&r, via, true, true, false, M, &ino), NULL);
	CHECK_EQ(ino, before.st_ino);
	WANT(0, raw_read(&r, via, true, false, M), NULL);
	/* no_symlinks: no link anywhere */
	WANT(ELOOP, raw_stat(&r, via, true, false, true, M, NULL), dlink);
	WANT(ELOOP, raw_stat(&r, via, false, false, true, M, NULL), dlink);
	WANT(ELOOP, raw_chmod(&r, via, 0600, false, true, M), "no_symlinks");
	WANT(ELOOP, raw_chown_nofollow(&r, via, false, true, M), "no_symlinks");
	WANT(ELOOP, raw_write(&r, via, "replaced\n", false, false, true, M), "no_symlinks");
	WANT(ELOOP, raw_read(&r, via, false, true, M), "no_symlinks");
	WANT(ELOOP, raw_stat(&r, link, true, false, true, M, NULL), "no_symlinks");
	WANT(0, raw_stat(&r, link, false, false, true, M, NULL), NULL); /* the link itself, not followed */
	/* symlink-free paths: as ever, with both flags */
	WANT(0, raw_stat(&r, file, true, true, true, M, &ino), NULL);
	CHECK_EQ(ino, before.st_ino);
	WANT(0, raw_read(&r, file, true, true, M), NULL);
	struct stat after = lst(file);
	char now[64];
	slurp(file, now, sizeof(now));
	CHECK(strcmp(now, "original\n") == 0);
	CHECK(after.st_mode == before.st_mode && after.st_uid == before.st_uid && after.st_ino == before.st_ino);
	CHECK(S_ISLNK(lst(link).st_mode) && S_ISLNK(lst(dangling).st_mode));
	/* the flags hold for that request only: the next one follows again */
	WANT(0, raw_chmod(&r, link, 0640, false, false, M), NULL);
	CHECK_EQ(lst(file).st_mode & 07777, 0640);
	WANT(0, raw_write(&r, via, "written\n", false, true, false, M), NULL);
	slurp(file, now, sizeof(now));
	CHECK(strcmp(now, "written\n") == 0);
	close(r.fd);
	daemon_stop(&dm);
	return 0;
}

/* Acting as nobody (FsOptions.user): nobody's own links are followed (the link is the acting
 * user's), root's too (the shim's own user); the kernel's permission checks still apply. */
static int case_acting(void)
{
	if (skip_unless_root())
		return IT_SKIP;
	struct standins s;
	char home[PATH_MAX], files[PATH_MAX];
	SPRINTF(files, "%s", it_path("files"));
	setup(it_dir(), files, it_path("home"), &s, home, sizeof(home));
	char rootlink[PATH_MAX];
	SPRINTF(rootlink, "%s/rootlink", home);
	CHECK(symlink(s.f[S_PASSWD].path, rootlink) == 0);
	struct daemon dm;
	daemon_start(&dm, NULL);
	struct raw r = {.fd = raw_connect_unix(dm.sock), .stream = 1};
	raw_hello(r.fd, NULL);
	raw_user = "65534";
	uint64_t ino = 0;
	WANT(0, raw_stat(&r, join(home, "passwd"), true, false, false, M, &ino), NULL);
	CHECK_EQ(ino, s.f[S_PASSWD].st.st_ino);
	WANT(0, raw_read(&r, join(home, "passwd"), false, false, M), NULL);
	WANT(0, raw_read(&r, rootlink, false, false, M), NULL);
	/* followed, and then the kernel says no: nobody may not read shadow nor write passwd */
	WANT(EACCES, raw_read(&r, join(home, "shadow"), false, false, M), "open");
	WANT(EACCES, raw_write(&r, join(home, "passwd"), "x\n", true, false, false, M), NULL);
	WANT(EPERM, raw_chmod(&r, join(home, "passwd"), 0666, false, false, M), NULL);
	/* and the flags still hold */
	WANT(ELOOP, raw_stat(&r, join(home, "passwd"), true, true, false, M, NULL), "no_follow");
	raw_user = NULL;
	/* as root again: nobody's links are refused */
	WANT(EACCES, raw_read(&r, join(home, "passwd"), false, false, M), "not following the symlink");
	close(r.fd);
	daemon_stop(&dm);
	standins_check(&s, "acting as nobody");
	return 0;
}

/* A loop of links and a chain longer than 40: ELOOP, as the kernel says. */
static int case_loops(void)
{
	char a[PATH_MAX], b[PATH_MAX];
	SPRINTF(a, "%s", it_path("a"));
	SPRINTF(b, "%s", it_path("b"));
	CHECK(symlink(b, a) == 0);
	CHECK(symlink(a, b) == 0);
	put(it_path("end"), "end\n", 0644, 0);
	char prev[PATH_MAX], name[64];
	SPRINTF(prev, "%s", it_path("end"));
	for (int i = 0; i < 41; i++) {
		SPRINTF(name, "l%02d", i);
		CHECK(symlink(prev, it_path(name)) == 0);
		SPRINTF(prev, "%s", it_path(name));
	}
	struct daemon dm;
	daemon_start(&dm, NULL);
	struct sbx_stat st = SBX_STAT_INIT;
	FAILS(ELOOP, a, "too many levels", sbx_stat(dm.c, NULL, a, SBX_STAT_FOLLOW, &st, &err_));
	FAILS(ELOOP, prev, "too many levels", sbx_stat(dm.c, NULL, prev, SBX_STAT_FOLLOW, &st, &err_));
	OK(sbx_stat(dm.c, NULL, it_path("l39"), SBX_STAT_FOLLOW, &st, &err_)); /* 40 links: fine */
	CHECK_EQ(st.size, 4);
	daemon_stop(&dm);
	return 0;
}

/* ---- a race: nobody swaps a name between its own file and a link to root's, as fast as it can,
 * while the daemon writes, truncates, chmods and chowns that name ---- */

/* The swapper (run as nobody through setpriv: this program with "--swap DIR TARGET"): until
 * killed, "name" in DIR is in turn a file of nobody's and a symlink to TARGET. */
static int swapper(const char *dir, const char *target)
{
	if (chdir(dir) < 0)
		return 1;
	for (;;) {
		unlink("t.l");
		if (symlink(target, "t.l") < 0 || rename("t.l", "name") < 0)
			return 1;
		int fd = open("t.f", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, "mine\n", 5) != 5 || close(fd) < 0 || rename("t.f", "name") < 0)
			return 1;
	}
}

static int case_race(void)
{
	if (skip_unless_root())
		return IT_SKIP;
	struct standins s;
	char home[PATH_MAX], files[PATH_MAX];
	SPRINTF(files, "%s", it_path("files"));
	setup(it_dir(), files, it_path("home"), &s, home, sizeof(home));
	char race[PATH_MAX], name[PATH_MAX], self[PATH_MAX];
	SPRINTF(race, "%s/race", home);
	const char *mkd[] = {"/bin/mkdir", race, NULL};
	CHECK(as_nobody(mkd) == 0);
	SPRINTF(name, "%s/name", race);
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(n > 0);
	self[n] = '\0';
	struct daemon dm;
	daemon_start(&dm, NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", self, "--swap",
		      race, s.f[S_SUID].path, (char *)NULL);
		_exit(127);
	}
	/* wait until it swaps */
	uint64_t deadline = it_now_ms() + 20000;
	while (!lexists(name)) {
		CHECKF(it_now_ms() < deadline, "the swapper never made %s", name);
		int ws = 0;
		pid_t w = waitpid(pid, &ws, WNOHANG);
		if (w == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 127) {
			printf("nobody cannot run %s (a build directory others may not enter?): skipped\n", self);
			daemon_stop(&dm);
			return IT_SKIP;
		}
		CHECKF(w == 0, "the swapper exited (status 0x%x)", ws);
		it_sleep_ms(1);
	}
	unsigned ok = 0, refused = 0, other = 0;
	for (int i = 0; i < 150; i++) {
		struct sbx_error err;
		struct sbx_stat st = SBX_STAT_INIT;
		int rc;
		switch (i % 6) {
		case 0:
			rc = sbx_write_file_buf(dm.c, NULL, name, 0, SBX_MODE_KEEP, "racer\n", 6, &st, &err);
			break;
		case 1:
			rc = sbx_write_file_buf(dm.c, NULL, name, SBX_WRITE_NO_ATOMIC, SBX_MODE_KEEP, "racer\n", 6, &st,
						&err);
			break;
		case 2:
			rc = sbx_write_file_buf(dm.c, NULL, name, SBX_WRITE_APPEND, SBX_MODE_KEEP, "racer\n", 6, &st,
						&err);
			break;
		case 3:
			rc = sbx_chmod(dm.c, NULL, name, 0777, &err);
			break;
		case 4:
			rc = sbx_chown(dm.c, NULL, name, NOBODY, NOBODY, 0, &err);
			break;
		default:
			rc = sbx_truncate(dm.c, NULL, name, 0, &err);
			break;
		}
		if (rc == 0)
			ok++;
		else if (err.kind == SBX_ERR_REMOTE && err.code == EACCES)
			refused++;
		else
			other++; /* e.g. ENOENT, in the moment between the renames */
		CHECKF(waitpid(pid, NULL, WNOHANG) == 0, "the swapper exited");
	}
	CHECK(kill(pid, SIGKILL) == 0);
	CHECK(waitpid(pid, NULL, 0) == pid);
	printf("race: %u done on nobody's file, %u refused (EACCES), %u other errors\n", ok, refused, other);
	CHECK(ok + refused + other == 150);
	daemon_stop(&dm);
	standins_check(&s, "the race");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "--swap") == 0)
		return swapper(argv[2], argv[3]);
	static const struct it_case cases[] = {
		{"escape", case_escape}, {"confined", case_confined}, {"flags", case_flags},
		{"acting", case_acting}, {"loops", case_loops},       {"race", case_race},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
