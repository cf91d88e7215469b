/* it_fs_perm.c: file operations that permissions refuse, through libsbx and the sbx CLI against the real
 * daemon: a daemon run as nobody without capabilities (EACCES, EPERM), and a daemon whose mount namespace
 * has a read-only bind mount (EROFS). Every failure must carry the real errno and the path, and leave the
 * files as they were, with no temp file behind. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#define ST_RDONLY_FLAG 1u /* statfs flags: ST_RDONLY */

/* snprintf into an array that must not truncate. */
#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

/* An SDK call that must fail in the shim with code; the call names its error struct err_. */
#define FAILS_WITH(code, call)                                                                             \
	do {                                                                                               \
		struct sbx_error err_;                                                                     \
		memset(&err_, 0, sizeof(err_));                                                            \
		if ((call) >= 0)                                                                           \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code)); \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                    \
	} while (0)

/* The same, and the error names path. */
#define FAILS_AT(code, want_path, call)                                                                              \
	do {                                                                                                         \
		struct sbx_error err_;                                                                               \
		memset(&err_, 0, sizeof(err_));                                                                      \
		if ((call) >= 0)                                                                                     \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code));           \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                              \
		CHECKF(strcmp(err_.path, (want_path)) == 0, "%s: the error names '%s', want '%s'", #call, err_.path, \
		       (want_path));                                                                                 \
	} while (0)

#define OK(call)                          \
	do {                              \
		struct sbx_error err_;    \
		CHECK_SBX((call), &err_); \
	} while (0)

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- local helpers ---- */

static void mk(const char *path, mode_t mode, uid_t owner)
{
	CHECKF(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	CHECK(chown(path, owner, owner) == 0);
	CHECK(chmod(path, mode) == 0); /* after chown, which may clear bits; and whatever the umask */
}

static void put(const char *path, const void *data, size_t len, mode_t mode, uid_t owner)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, len) == (ssize_t)len);
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

static bool lexists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

/* The whole local file (NULL if it cannot be opened); *len gets its size. */
static uint8_t *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, got = 0;
	uint8_t *buf = malloc(cap);
	CHECK(buf != NULL);
	for (;;) {
		if (got == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf != NULL);
		}
		ssize_t n = read(fd, buf + got, cap - got);
		CHECK(n >= 0);
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*len = got;
	return buf;
}

static void check_local(const char *path, const void *want, size_t want_len)
{
	size_t len = 0;
	uint8_t *got = slurp(path, &len);
	CHECKF(got != NULL, "%s: %s", path, strerror(errno));
	CHECKF(len == want_len && memcmp(got, want, len) == 0, "%s: %zu bytes, not the %zu expected (or other bytes)",
	       path, len, want_len);
	free(got);
}

/* Read the whole file through the SDK and compare. */
static void check_remote(struct sbx_client *c, const char *path, const void *want, size_t want_len)
{
	void *data = NULL;
	size_t len = 0;
	struct sbx_error err;
	CHECK_SBX(sbx_read_file_alloc(c, NULL, path, 16u << 20, &data, &len, &err), &err);
	CHECKF(len == want_len && memcmp(data, want, len) == 0, "%s read back %zu bytes, not the %zu expected", path,
	       len, want_len);
	free(data);
}

/* Entries in dir other than . and .. (-1 if it cannot be opened). */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n;
}

/* The unfinished-write journal in a state dir: no entry may be left behind. */
static void check_journal_empty(const char *state)
{
	char j[PATH_MAX];
	SPRINTF(j, "%s/pending-writes", state);
	int n = it_journal_pending(j);
	CHECKF(n <= 0, "%d entries left in %s", n, j);
}

static void read_text(const char *path, char *buf, size_t size)
{
	size_t len = 0;
	uint8_t *data = slurp(path, &len);
	CHECKF(data != NULL, "%s: %s", path, strerror(errno));
	if (len >= size)
		len = size - 1;
	memcpy(buf, data, len);
	buf[len] = '\0';
	free(data);
}

/* The value of a "Name:\tvalue" line of /proc/PID/status. */
static void proc_status(pid_t pid, const char *name, char *out, size_t size)
{
	char path[64], text[8192];
	SPRINTF(path, "/proc/%d/status", (int)pid);
	read_text(path, text, sizeof(text));
	size_t nlen = strlen(name);
	for (const char *l = text; *l != '\0';) {
		const char *eol = strchr(l, '\n');
		size_t llen = eol ? (size_t)(eol - l) : strlen(l);
		if (llen > nlen && memcmp(l, name, nlen) == 0 && l[nlen] == ':') {
			const char *v = l + nlen + 1;
			while (*v == '\t' || *v == ' ')
				v++;
			size_t vlen = llen - (size_t)(v - l);
			CHECK(vlen < size);
			memcpy(out, v, vlen);
			out[vlen] = '\0';
			return;
		}
		l += llen + (eol ? 1 : 0);
	}
	it_fail(__FILE__, __LINE__, "no %s in %s", name, path);
}

/* 1 if the mountinfo file lists a mount on dir (its fifth field); *opts gets that
 * mount's options (the sixth field). */
static bool mountinfo_has(const char *mountinfo, const char *dir, char *opts, size_t opts_size)
{
	FILE *f = fopen(mountinfo, "re");
	CHECKF(f != NULL, "%s: %s", mountinfo, strerror(errno));
	char line[8192];
	bool found = false;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *save = NULL, *fields[6];
		int n = 0;
		for (char *t = strtok_r(line, " \n", &save); t != NULL && n < 6; t = strtok_r(NULL, " \n", &save))
			fields[n++] = t;
		if (n == 6 && strcmp(fields[4], dir) == 0) {
			found = true;
			if (opts != NULL)
				snprintf(opts, opts_size, "%s", fields[5]);
		}
	}
	fclose(f);
	return found;
}

/* Run `sbx -t TARGET --timeout 30 ARGS...` (NULL-terminated) with stdin from in
 * (NULL: /dev/null); its stdout and stderr go to out and errbuf (NUL-terminated,
 * cut to their sizes). Returns its exit status (128+signal if killed). */
static int cli(const char *target, const char *in, char *out, size_t out_size, char *errbuf, size_t err_size, ...)
	__attribute__((sentinel));
static int cli(const char *target, const char *in, char *out, size_t out_size, char *errbuf, size_t err_size, ...)
{
	const char *argv[32];
	int argc = 0;
	argv[argc++] = SBX_BIN;
	argv[argc++] = "-t";
	argv[argc++] = target;
	argv[argc++] = "--timeout";
	argv[argc++] = "30";
	va_list ap;
	va_start(ap, err_size);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL) {
		CHECKF(argc < 31, "too many sbx arguments");
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;

	char opath[PATH_MAX], epath[PATH_MAX];
	SPRINTF(opath, "%s", it_path("cli.out"));
	SPRINTF(epath, "%s", it_path("cli.err"));
	int ifd = open(in != NULL ? in : "/dev/null", O_RDONLY | O_CLOEXEC);
	CHECKF(ifd >= 0, "open %s: %s", in != NULL ? in : "/dev/null", strerror(errno));
	int ofd = open(opath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int efd = open(epath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(ofd >= 0 && efd >= 0);
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
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
	read_text(opath, out, out_size);
	read_text(epath, errbuf, err_size);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int count_cb(void *ud, const struct sbx_dirent *e)
{
	(void)e;
	(*(int *)ud)++;
	return 0;
}

/* Entries of dir as the daemon lists them. */
static int list_count(struct sbx_client *c, const char *dir)
{
	uint64_t n = 0;
	int seen = 0;
	struct sbx_error err;
	CHECK_SBX(sbx_list(c, NULL, dir, 1, SBX_LIST_HIDDEN, count_cb, &seen, &n, &err), &err);
	CHECK_EQ(seen, n);
	return (int)n;
}

/* ---- a daemon that is not root: EACCES and EPERM ---- */

static int case_nonroot(void)
{
	if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
		printf("needs root and setpriv(1): skipped\n");
		return IT_SKIP;
	}
	/* nobody must get through the temp dir (mkdtemp made it 0700) */
	CHECK(chmod(it_dir(), 0711) == 0);
	char home[PATH_MAX], state[PATH_MAX], sock[PATH_MAX], target[PATH_MAX];
	SPRINTF(home, "%s", it_path("nobody"));
	mk(home, 0700, NOBODY);
	SPRINTF(state, "%s/state", home);
	mk(state, 0700, NOBODY);
	SPRINTF(sock, "%s/s.sock", home);
	SPRINTF(target, "unix:%s", sock);

	/* root's: a directory others may only read, a secret in it, a public file; a
	 * sticky world-writable directory holding a file of root's */
	char rootdir[PATH_MAX], secret[PATH_MAX], pub[PATH_MAX], sticky[PATH_MAX], sticky_root[PATH_MAX];
	SPRINTF(rootdir, "%s", it_path("rootdir"));
	mk(rootdir, 0755, 0);
	SPRINTF(secret, "%s/secret", rootdir);
	put(secret, "top secret\n", 11, 0600, 0);
	SPRINTF(pub, "%s/pub", rootdir);
	put(pub, "public\n", 7, 0644, 0);
	SPRINTF(sticky, "%s", it_path("sticky"));
	mk(sticky, 01777, 0);
	SPRINTF(sticky_root, "%s/rootfile", sticky);
	put(sticky_root, "root's\n", 7, 0644, 0);
	/* the daemon's own directory */
	char mine[PATH_MAX], own[PATH_MAX];
	SPRINTF(mine, "%s", it_path("mine"));
	mk(mine, 0755, NOBODY);
	SPRINTF(own, "%s/own", mine);

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
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	struct sbx_client *c = it_connect(target, NULL);

	/* it is who it should be: nobody, no capability at all */
	struct sbx_info info = SBX_INFO_INIT;
	OK(sbx_info(c, NULL, &info, &err_));
	CHECK_EQ(info.uid, NOBODY);
	CHECK_EQ(info.gid, NOBODY);
	char v[128];
	proc_status(d->pid, "Uid", v, sizeof(v));
	CHECKF(strcmp(v, "65534\t65534\t65534\t65534") == 0, "Uid: %s", v);
	static const char *const caps[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
	for (size_t i = 0; i < ARRAY_LEN(caps); i++) {
		proc_status(d->pid, caps[i], v, sizeof(v));
		CHECKF(strcmp(v, "0000000000000000") == 0, "%s: %s", caps[i], v);
	}

	/* stat and listing need no more than the directory's x and r bits */
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, secret, 0, &st, &err_));
	CHECK_EQ(st.type, SBX_FT_FILE);
	CHECK_EQ(st.uid, 0);
	CHECK_EQ(st.mode, 0600);
	CHECK_EQ(st.size, 11);
	CHECK_EQ(list_count(c, rootdir), 2);
	CHECK_EQ(sbx_exists(c, NULL, secret, NULL), 1);
	check_remote(c, pub, "public\n", 7);

	/* below root's 0700 directory: EACCES, not "does not exist" */
	char priv[PATH_MAX], hidden[PATH_MAX];
	SPRINTF(priv, "%s", it_path("private"));
	mk(priv, 0700, 0);
	SPRINTF(hidden, "%s/hidden", priv);
	put(hidden, "h", 1, 0644, 0);
	FAILS_AT(EACCES, hidden, sbx_stat(c, NULL, hidden, 0, &st, &err_));
	FAILS_AT(EACCES, hidden, sbx_exists(c, NULL, hidden, &err_));
	FAILS_AT(EACCES, priv, sbx_list(c, NULL, priv, 1, 0, count_cb, &(int){0}, NULL, &err_));
	FAILS_AT(EACCES, hidden, sbx_read_file_alloc(c, NULL, hidden, 1 << 20, &(void *){NULL}, &(size_t){0}, &err_));

	/* reading root's 0600 file: EACCES, naming it; nothing reaches the sink */
	struct sbx_error err;
	void *data = NULL;
	size_t len = 0;
	memset(&err, 0, sizeof(err));
	CHECK(sbx_read_file_alloc(c, NULL, secret, 1 << 20, &data, &len, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECKF(strcmp(err.path, secret) == 0, "error path '%s'", err.path);
	CHECK(data == NULL);
	char buf[64];
	CHECK(sbx_error_format(&err, buf, sizeof(buf)) == buf);
	CHECK(starts_with(buf, "EACCES: "));

	/* writing into root's 0755 directory: EACCES in every mode, nothing created */
	char newf[PATH_MAX], deep[PATH_MAX];
	SPRINTF(newf, "%s/new", rootdir);
	SPRINTF(deep, "%s/sub/new", rootdir);
	static const int wmodes[] = {0, SBX_WRITE_NO_ATOMIC, SBX_WRITE_APPEND, SBX_WRITE_EXCLUSIVE, SBX_WRITE_PARENTS};
	for (size_t i = 0; i < ARRAY_LEN(wmodes); i++) {
		FAILS_AT(EACCES, newf,
			 sbx_write_file_buf(c, NULL, newf, wmodes[i], SBX_MODE_KEEP, "x", 1, NULL, &err_));
		CHECK_EQ(count_entries(rootdir), 2);
		/* replacing (or writing in place) root's 0644 file: EACCES too, the file as it was */
		if (wmodes[i] != SBX_WRITE_EXCLUSIVE)
			FAILS_AT(EACCES, pub,
				 sbx_write_file_buf(c, NULL, pub, wmodes[i], SBX_MODE_KEEP, "changed\n", 8, NULL,
						    &err_));
		check_local(pub, "public\n", 7);
		CHECK_EQ(lst(pub).st_mode & 07777, 0644);
		CHECK_EQ(count_entries(rootdir), 2);
	}
	FAILS_AT(EACCES, deep, sbx_write_file_buf(c, NULL, deep, SBX_WRITE_PARENTS, 0600, "x", 1, NULL, &err_));
	CHECK(!lexists(deep) && !lexists(newf));
	CHECK_EQ(count_entries(rootdir), 2);
	check_journal_empty(state);

	/* the other operations that need write permission on root's directory or file */
	char sub[PATH_MAX];
	SPRINTF(sub, "%s/sub", rootdir);
	FAILS_AT(EACCES, sub, sbx_mkdir(c, NULL, sub, 0, 0755, &err_));
	FAILS_WITH(EACCES, sbx_mkdir(c, NULL, deep, SBX_MKDIR_PARENTS, 0755, &err_));
	FAILS_AT(EACCES, pub, sbx_remove(c, NULL, pub, 0, &err_));
	FAILS_WITH(EACCES, sbx_rename(c, NULL, pub, newf, 0, &err_));
	FAILS_AT(EACCES, pub, sbx_truncate(c, NULL, pub, 0, &err_));
	FAILS_AT(EACCES, newf, sbx_symlink(c, NULL, "pub", newf, &err_));
	/* "now" needs write permission; explicit times need ownership */
	FAILS_AT(EACCES, pub, sbx_set_times(c, NULL, pub, NULL, NULL, 0, &err_));
	struct sbx_timespec t1 = {1000000000, 5};
	FAILS_AT(EPERM, pub, sbx_set_times(c, NULL, pub, &t1, &t1, 0, &err_));
	FAILS_AT(EACCES, newf, sbx_set_times(c, NULL, newf, NULL, NULL, 0, &err_));
	/* changing root's file's mode or owner: EPERM */
	FAILS_AT(EPERM, pub, sbx_chmod(c, NULL, pub, 0666, &err_));
	FAILS_AT(EPERM, secret, sbx_chmod(c, NULL, secret, 0644, &err_));
	FAILS_AT(EPERM, pub, sbx_chown(c, NULL, pub, NOBODY, NOBODY, 0, &err_));
	CHECK_EQ(lst(pub).st_mode & 07777, 0644);
	CHECK_EQ(lst(secret).st_mode & 07777, 0600);
	CHECK_EQ(lst(pub).st_uid, 0);
	check_local(pub, "public\n", 7);
	CHECK_EQ(count_entries(rootdir), 2);

	/* the daemon's own files: a round trip of exact bytes */
	uint8_t blob[100000];
	it_fill(blob, sizeof(blob), 7);
	OK(sbx_write_file_buf(c, NULL, own, 0, SBX_MODE_KEEP, blob, sizeof(blob), &st, &err_));
	CHECK_EQ(st.uid, NOBODY);
	CHECK_EQ(st.gid, NOBODY);
	CHECK_EQ(st.mode, 0644);
	check_remote(c, own, blob, sizeof(blob));
	check_local(own, blob, sizeof(blob));
	CHECK_EQ(lst(own).st_uid, NOBODY);
	OK(sbx_write_file_buf(c, NULL, own, SBX_WRITE_APPEND, SBX_MODE_KEEP, "tail", 4, NULL, &err_));
	OK(sbx_truncate(c, NULL, own, sizeof(blob), &err_));
	OK(sbx_chmod(c, NULL, own, 0600, &err_));
	OK(sbx_set_times(c, NULL, own, &t1, &t1, 0, &err_));
	CHECK_EQ(lst(own).st_mtim.tv_sec, 1000000000);
	/* atomic again: the mode it has now is kept */
	OK(sbx_write_file_buf(c, NULL, own, 0, SBX_MODE_KEEP, blob, sizeof(blob), &st, &err_));
	CHECK_EQ(st.mode, 0600);
	check_local(own, blob, sizeof(blob));
	/* giving it away, to root or to root's group: EPERM; to itself is allowed */
	FAILS_AT(EPERM, own, sbx_chown(c, NULL, own, 0, -1, 0, &err_));
	FAILS_AT(EPERM, own, sbx_chown(c, NULL, own, -1, 0, 0, &err_));
	OK(sbx_chown(c, NULL, own, NOBODY, NOBODY, 0, &err_));
	CHECK_EQ(lst(own).st_uid, NOBODY);
	CHECK_EQ(lst(own).st_gid, NOBODY);
	/* its files out of root's directory and in: EACCES */
	FAILS_WITH(EACCES, sbx_rename(c, NULL, own, newf, 0, &err_));
	CHECK(lexists(own));
	/* a copy of what it cannot read fails and leaves nothing */
	char copy[PATH_MAX];
	SPRINTF(copy, "%s/copy", mine);
	FAILS_AT(EACCES, secret, sbx_copy(c, NULL, secret, copy, 0, &err_));
	FAILS_WITH(EACCES, sbx_copy(c, NULL, own, newf, 0, &err_));
	CHECK_EQ(count_entries(mine), 1);
	CHECK_EQ(count_entries(rootdir), 2);
	/* linking root's file: refused where protected_hardlinks is on */
	char hl[PATH_MAX], prot[8];
	SPRINTF(hl, "%s/hl", mine);
	read_text("/proc/sys/fs/protected_hardlinks", prot, sizeof(prot));
	if (prot[0] == '1')
		FAILS_AT(EPERM, hl, sbx_link(c, NULL, secret, hl, &err_));
	FAILS_AT(EACCES, newf, sbx_link(c, NULL, own, newf, &err_));

	/* a sticky directory: root's file there can be neither removed nor renamed,
	 * the daemon's own can */
	char sticky_own[PATH_MAX], sticky_x[PATH_MAX];
	SPRINTF(sticky_own, "%s/own", sticky);
	SPRINTF(sticky_x, "%s/x", sticky);
	FAILS_AT(EPERM, sticky_root, sbx_remove(c, NULL, sticky_root, 0, &err_));
	FAILS_WITH(EPERM, sbx_rename(c, NULL, sticky_root, sticky_x, 0, &err_));
	check_local(sticky_root, "root's\n", 7);
	OK(sbx_write_file_buf(c, NULL, sticky_own, 0, SBX_MODE_KEEP, "mine", 4, NULL, &err_));
	OK(sbx_rename(c, NULL, sticky_own, sticky_x, 0, &err_));
	OK(sbx_remove(c, NULL, sticky_x, 0, &err_));
	CHECK_EQ(count_entries(sticky), 1);
	check_journal_empty(state);

	/* the CLI: the error line and exit status 1 */
	char out[4096], errtext[4096], want[PATH_MAX + 64];
	int rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "cat", secret, NULL);
	CHECKF(rc == 1, "sbx cat %s: exit %d, stderr '%s'", secret, rc, errtext);
	SPRINTF(want, "sbx: EACCES: %s: Permission denied", secret);
	CHECKF(starts_with(errtext, want), "sbx cat: stderr '%s', want '%s...'", errtext, want);
	CHECKF(out[0] == '\0', "sbx cat: stdout '%s'", out);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "chown", "0", own, NULL);
	CHECKF(rc == 1, "sbx chown: exit %d, stderr '%s'", rc, errtext);
	CHECKF(starts_with(errtext, "sbx: EPERM:"), "sbx chown: stderr '%s'", errtext);
	CHECK_EQ(lst(own).st_uid, NOBODY);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "chmod", "0777", pub, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EPERM:"), "sbx chmod: exit %d, stderr '%s'", rc, errtext);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "put", newf, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EACCES:"), "sbx put: exit %d, stderr '%s'", rc, errtext);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "mkdir", sub, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EACCES:"), "sbx mkdir: exit %d, stderr '%s'", rc, errtext);
	CHECK_EQ(count_entries(rootdir), 2);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "cat", pub, NULL);
	CHECKF(rc == 0 && strcmp(out, "public\n") == 0, "sbx cat %s: exit %d, stdout '%s', stderr '%s'", pub, rc, out,
	       errtext);
	sbx_client_close(c);
	return 0;
}

/* ---- a read-only bind mount: EROFS ---- */

static int case_erofs(void)
{
	if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
		printf("needs root and unshare(1): skipped\n");
		return IT_SKIP;
	}
	/* canonical paths: mountinfo has them so */
	char dir[PATH_MAX];
	CHECK(realpath(it_dir(), dir) != NULL);
	char ro[PATH_MAX], f[PATH_MAX], dsub[PATH_MAX], dx[PATH_MAX], sl[PATH_MAX];
	SPRINTF(ro, "%s/ro", dir);
	mk(ro, 0755, 0);
	uint8_t content[70000];
	it_fill(content, sizeof(content), 11);
	SPRINTF(f, "%s/f", ro);
	put(f, content, sizeof(content), 0644, 0);
	SPRINTF(dsub, "%s/d", ro);
	mk(dsub, 0755, 0);
	SPRINTF(dx, "%s/x", dsub);
	put(dx, "x\n", 2, 0644, 0);
	SPRINTF(sl, "%s/sl", ro);
	CHECK(symlink("f", sl) == 0);
	struct timespec old_times[2] = {{1200000000, 1}, {1300000000, 2}};
	CHECK(utimensat(AT_FDCWD, f, old_times, 0) == 0);
	const struct stat before = lst(f);
	/* a writable directory beside it (the same filesystem, another mount) */
	char out_dir[PATH_MAX], g[PATH_MAX];
	SPRINTF(out_dir, "%s/out", dir);
	mk(out_dir, 0755, 0);
	SPRINTF(g, "%s/g", out_dir);
	put(g, "outside\n", 8, 0644, 0);

	static const char script_probe[] = "mount --bind \"$0\" \"$0\" && mount -o remount,bind,ro \"$0\"";
	char probe[PATH_MAX + 200];
	SPRINTF(probe, "unshare -m --propagation private sh -c '%s' %s 2>/dev/null", script_probe, ro);
	if (system(probe) != 0) {
		printf("cannot make a read-only bind mount in a private mount namespace: skipped\n");
		return IT_SKIP;
	}
	char sock[PATH_MAX], target[PATH_MAX + 8], state[PATH_MAX];
	SPRINTF(sock, "%s/s.sock", dir);
	SPRINTF(target, "unix:%s", sock);
	SPRINTF(state, "%s/state", dir);
	const char *argv[] = {"unshare",
			      "-m",
			      "--propagation",
			      "private",
			      "sh",
			      "-c",
			      "mount --bind \"$0\" \"$0\" && mount -o remount,bind,ro \"$0\" && exec \"$@\"",
			      ro,
			      SHIM_BIN,
			      "--listen",
			      target,
			      "--state-dir",
			      state,
			      NULL};
	struct it_daemon *d = it_daemon_start_argv("shim", argv);
	struct sbx_client *c = it_connect(target, NULL);

	/* the mount is the daemon's alone */
	char opts[256], mi[64];
	SPRINTF(mi, "/proc/%d/mountinfo", (int)d->pid);
	CHECKF(mountinfo_has(mi, ro, opts, sizeof(opts)), "%s does not list %s", mi, ro);
	CHECKF(starts_with(opts, "ro"), "the daemon's mount on %s has options %s", ro, opts);
	CHECKF(!mountinfo_has("/proc/self/mountinfo", ro, NULL, 0), "the read-only mount on %s leaked out", ro);
	struct sbx_statfs sf = SBX_STATFS_INIT;
	OK(sbx_statfs(c, NULL, ro, &sf, &err_));
	CHECK(sf.flags & ST_RDONLY_FLAG);
	OK(sbx_statfs(c, NULL, out_dir, &sf, &err_));
	CHECK(!(sf.flags & ST_RDONLY_FLAG));
	char inside[PATH_MAX + 64];
	SPRINTF(inside, "/proc/%d/root%s", (int)d->pid, ro);

	/* reads work */
	check_remote(c, f, content, sizeof(content));
	struct sbx_stat st = SBX_STAT_INIT;
	OK(sbx_stat(c, NULL, f, 0, &st, &err_));
	CHECK_EQ(st.size, sizeof(content));
	CHECK_EQ(st.mtime.sec, 1300000000);
	char lbuf[PATH_MAX];
	struct sbx_error err;
	CHECK_EQ(sbx_readlink(c, NULL, sl, lbuf, sizeof(lbuf), &err), 1);
	CHECK(strcmp(lbuf, "f") == 0);
	CHECK(sbx_realpath(c, NULL, sl, lbuf, sizeof(lbuf), &err) > 0);
	CHECK(strcmp(lbuf, f) == 0);
	CHECK_EQ(list_count(c, ro), 3);

	/* writes: EROFS in every mode, for the existing file and a new one; the file
	 * byte-identical on both sides of the mount, no temp file, no journal entry */
	char newf[PATH_MAX], deep[PATH_MAX];
	SPRINTF(newf, "%s/new", ro);
	SPRINTF(deep, "%s/n1/n2/new", ro);
	static const int wmodes[] = {0, SBX_WRITE_NO_ATOMIC, SBX_WRITE_APPEND, SBX_WRITE_PARENTS,
				     SBX_WRITE_NO_ATOMIC | SBX_WRITE_PARENTS};
	uint8_t other[5000];
	it_fill(other, sizeof(other), 12);
	for (size_t i = 0; i < ARRAY_LEN(wmodes); i++) {
		FAILS_AT(EROFS, f,
			 sbx_write_file_buf(c, NULL, f, wmodes[i], SBX_MODE_KEEP, other, sizeof(other), NULL, &err_));
		FAILS_AT(EROFS, f, sbx_write_file_buf(c, NULL, f, wmodes[i], 0600, other, 0, NULL, &err_));
		FAILS_AT(EROFS, newf,
			 sbx_write_file_buf(c, NULL, newf, wmodes[i], SBX_MODE_KEEP, other, sizeof(other), NULL,
					    &err_));
		check_local(f, content, sizeof(content));
		check_remote(c, f, content, sizeof(content));
		CHECK_EQ(count_entries(ro), 3);
		CHECK_EQ(count_entries(inside), 3);
	}
	FAILS_AT(EROFS, newf,
		 sbx_write_file_buf(c, NULL, newf, SBX_WRITE_EXCLUSIVE, SBX_MODE_KEEP, other, 1, NULL, &err_));
	FAILS_AT(EROFS, deep,
		 sbx_write_file_buf(c, NULL, deep, SBX_WRITE_PARENTS, SBX_MODE_KEEP, other, 1, NULL, &err_));
	check_journal_empty(state);

	/* everything else that would change it */
	char nd[PATH_MAX], g2[PATH_MAX], hl[PATH_MAX];
	SPRINTF(nd, "%s/nd", ro);
	SPRINTF(g2, "%s/g", ro);
	SPRINTF(hl, "%s/hl", ro);
	FAILS_AT(EROFS, nd, sbx_mkdir(c, NULL, nd, 0, 0755, &err_));
	FAILS_WITH(EROFS, sbx_mkdir(c, NULL, deep, SBX_MKDIR_PARENTS, 0755, &err_));
	FAILS_AT(EROFS, f, sbx_remove(c, NULL, f, 0, &err_));
	FAILS_AT(EROFS, sl, sbx_remove(c, NULL, sl, 0, &err_));
	FAILS_AT(EROFS, dsub, sbx_remove(c, NULL, dsub, 0, &err_));
	FAILS_AT(EROFS, dsub, sbx_remove(c, NULL, dsub, SBX_REMOVE_RECURSIVE, &err_));
	FAILS_WITH(EROFS, sbx_rename(c, NULL, f, g2, 0, &err_));
	FAILS_WITH(EROFS, sbx_rename(c, NULL, dsub, nd, SBX_RENAME_NOREPLACE, &err_));
	/* into it from outside (another mount: the copy fallback) */
	FAILS_WITH(EROFS, sbx_rename(c, NULL, g, g2, 0, &err_));
	check_local(g, "outside\n", 8);
	FAILS_AT(EROFS, f, sbx_chmod(c, NULL, f, 0600, &err_));
	FAILS_AT(EROFS, f, sbx_chown(c, NULL, f, NOBODY, NOBODY, 0, &err_));
	FAILS_AT(EROFS, sl, sbx_chown(c, NULL, sl, NOBODY, -1, SBX_CHOWN_NOFOLLOW, &err_));
	FAILS_AT(EROFS, f, sbx_truncate(c, NULL, f, 0, &err_));
	struct sbx_timespec t1 = {1000000000, 5};
	FAILS_AT(EROFS, f, sbx_set_times(c, NULL, f, &t1, &t1, 0, &err_));
	FAILS_AT(EROFS, f, sbx_set_times(c, NULL, f, NULL, NULL, 0, &err_));
	FAILS_AT(EROFS, newf, sbx_set_times(c, NULL, newf, NULL, NULL, 0, &err_));
	FAILS_AT(EROFS, newf, sbx_symlink(c, NULL, "f", newf, &err_));
	FAILS_AT(EROFS, hl, sbx_link(c, NULL, f, hl, &err_));
	FAILS_WITH(EROFS, sbx_copy(c, NULL, f, newf, 0, &err_));
	FAILS_WITH(EROFS, sbx_copy(c, NULL, g, newf, 0, &err_));
	FAILS_WITH(EROFS, sbx_copy(c, NULL, dsub, nd, SBX_COPY_RECURSIVE, &err_));
	/* nothing changed: content, metadata, entries */
	check_local(f, content, sizeof(content));
	struct stat after = lst(f);
	CHECK_EQ(after.st_mode, before.st_mode);
	CHECK_EQ(after.st_uid, before.st_uid);
	CHECK_EQ(after.st_gid, before.st_gid);
	CHECK_EQ(after.st_size, before.st_size);
	CHECK_EQ(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
	CHECK_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
	CHECK_EQ(after.st_ctim.tv_sec, before.st_ctim.tv_sec);
	CHECK_EQ(after.st_ctim.tv_nsec, before.st_ctim.tv_nsec);
	CHECK_EQ(lst(sl).st_uid, 0);
	check_local(dx, "x\n", 2);
	CHECK_EQ(count_entries(ro), 3);
	CHECK_EQ(count_entries(inside), 3);
	CHECK_EQ(count_entries(dsub), 1);
	CHECK_EQ(count_entries(out_dir), 1);
	check_journal_empty(state);
	/* and out of it, a copy works */
	char cp[PATH_MAX];
	SPRINTF(cp, "%s/copy", out_dir);
	OK(sbx_copy(c, NULL, f, cp, 0, &err_));
	check_local(cp, content, sizeof(content));
	/* a move out of it (another mount: copy, then remove the source) fails on the
	 * removal; the source stays whole */
	char moved[PATH_MAX], moved_dir[PATH_MAX];
	SPRINTF(moved, "%s/moved", out_dir);
	SPRINTF(moved_dir, "%s/moved_dir", out_dir);
	FAILS_AT(EROFS, f, sbx_rename(c, NULL, f, moved, 0, &err_));
	FAILS_AT(EROFS, dsub, sbx_rename(c, NULL, dsub, moved_dir, 0, &err_));
	check_local(f, content, sizeof(content));
	check_local(dx, "x\n", 2);
	CHECK_EQ(count_entries(ro), 3);
	/* (what is left at the destination is not checked: the copy stays, as with mv(1)) */
	if (lexists(moved) || lexists(moved_dir))
		printf("note: the failed moves left their copies at %s and %s\n", moved, moved_dir);

	/* the CLI */
	char data[PATH_MAX], out[4096], errtext[4096];
	SPRINTF(data, "%s/data", dir);
	put(data, other, sizeof(other), 0644, 0);
	int rc = cli(target, data, out, sizeof(out), errtext, sizeof(errtext), "put", f, NULL);
	CHECKF(rc == 1, "sbx put %s: exit %d, stderr '%s'", f, rc, errtext);
	CHECKF(starts_with(errtext, "sbx: EROFS:"), "sbx put: stderr '%s'", errtext);
	CHECK_CONTAINS(errtext, f);
	rc = cli(target, data, out, sizeof(out), errtext, sizeof(errtext), "put", "--no-atomic", f, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EROFS:"), "sbx put --no-atomic: exit %d, stderr '%s'", rc,
	       errtext);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "rm", f, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EROFS:"), "sbx rm: exit %d, stderr '%s'", rc, errtext);
	rc = cli(target, NULL, out, sizeof(out), errtext, sizeof(errtext), "touch", newf, NULL);
	CHECKF(rc == 1 && starts_with(errtext, "sbx: EROFS:"), "sbx touch: exit %d, stderr '%s'", rc, errtext);
	check_local(f, content, sizeof(content));
	check_remote(c, f, content, sizeof(content));
	CHECK_EQ(count_entries(ro), 3);
	CHECK_EQ(count_entries(inside), 3);
	check_journal_empty(state);
	sbx_client_close(c);

	/* gone with the daemon, never here */
	int ds = it_daemon_stop(d);
	CHECKF(WIFEXITED(ds) && WEXITSTATUS(ds) == 0, "exit status 0x%x after SIGTERM (want 0)", ds);
	CHECK(!mountinfo_has("/proc/self/mountinfo", ro, NULL, 0));
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"nonroot", case_nonroot},
		{"erofs", case_erofs},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
