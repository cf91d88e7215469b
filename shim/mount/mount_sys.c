/* mount_sys.c: the blocking steps of S3 mounts (rclone's config and argv, mountinfo, liveness, flush, unmount, cleanup); worker threads only. */
#include "mount.h"
#include "fs.h"
#include "log.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

void mount_plan_free(struct mount_plan *pl)
{
	char **secrets[] = {&pl->secret, &pl->session_token, &pl->access_key};
	for (size_t i = 0; i < ARRAY_SIZE(secrets); i++) {
		if (*secrets[i] != NULL) {
			explicit_bzero(*secrets[i], strlen(*secrets[i]));
			free(*secrets[i]);
			*secrets[i] = NULL;
		}
	}
	free(pl->bucket);
	free(pl->prefix);
	free(pl->endpoint);
	free(pl->region);
	free(pl->provider);
	pl->bucket = pl->prefix = pl->endpoint = pl->region = pl->provider = NULL;
	for (size_t i = 0; i < pl->n_opts; i++) {
		free(pl->opt_name[i]);
		free(pl->opt_value[i]);
	}
	pl->n_opts = 0;
	for (size_t i = 0; i < ARRAY_SIZE(pl->argv) && pl->argv[i] != NULL; i++) {
		free(pl->argv[i]);
		pl->argv[i] = NULL;
	}
	for (size_t i = 0; i < ARRAY_SIZE(pl->pf_argv) && pl->pf_argv[i] != NULL; i++) {
		free(pl->pf_argv[i]);
		pl->pf_argv[i] = NULL;
	}
	for (size_t i = 0; i < ARRAY_SIZE(pl->envp) && pl->envp[i] != NULL; i++) {
		free(pl->envp[i]);
		pl->envp[i] = NULL;
	}
	if (pl->log_fd >= 0)
		close(pl->log_fd);
	pl->log_fd = -1;
	if (pl->lock_fd >= 0)
		close(pl->lock_fd);
	pl->lock_fd = -1;
	if (pl->mp_fd >= 0)
		close(pl->mp_fd);
	pl->mp_fd = -1;
}

/* ================================ prepare ================================ */

static const char *search_path(void)
{
	const char *p = getenv("PATH");
	return p != NULL && p[0] != '\0' ? p : DEFAULT_PATH;
}

/* name in the daemon's PATH, into out; false when not there (or not executable). */
static bool find_program(const char *name, char *out, size_t size)
{
	const char *p = search_path();
	while (*p != '\0') {
		size_t len = strcspn(p, ":");
		if (len > 0 && (size_t)snprintf(out, size, "%.*s/%s", (int)len, p, name) < size &&
		    access(out, X_OK) == 0) {
			struct stat st;
			if (stat(out, &st) == 0 && S_ISREG(st.st_mode))
				return true;
		}
		p += len;
		if (*p == ':')
			p++;
	}
	return false;
}

static char *xstrdup(const char *s)
{
	return strdup(s != NULL ? s : "");
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

static bool dir_empty(int dfd)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return true; /* unreadable: rclone decides */
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return true;
	}
	bool empty = true;
	struct dirent *e;
	while (empty && (e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			empty = false;
	closedir(d);
	return empty;
}

/* The config: a file that no one else can read at any moment (created 0600 with
 * O_EXCL in a 0700 directory that is ours), written in one go. */
static int write_config(struct mount_plan *pl, struct shim_err *err)
{
	char path[PATH_MAX + 32];
	snprintf(path, sizeof(path), "%s/rclone.conf", pl->rundir);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return err_set(err, errno, NULL, "cannot create the rclone config in the state dir");
	char *text = xprintf("[sbx]\n"
			     "type = s3\n"
			     "provider = %s\n"
			     "env_auth = false\n"
			     "access_key_id = %s\n"
			     "secret_access_key = %s\n"
			     "%s%s%s"
			     "endpoint = %s\n"
			     "%s%s%s"
			     "force_path_style = true\n",
			     pl->provider != NULL ? pl->provider : "Other", pl->access_key, pl->secret,
			     pl->session_token != NULL ? "session_token = " : "",
			     pl->session_token != NULL ? pl->session_token : "", pl->session_token != NULL ? "\n" : "",
			     pl->endpoint, pl->region != NULL ? "region = " : "", pl->region != NULL ? pl->region : "",
			     pl->region != NULL ? "\n" : "");
	if (text == NULL) {
		close(fd);
		unlink(path);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	size_t len = strlen(text), off = 0;
	int rc = 0;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = err_set(err, n < 0 ? errno : EIO, NULL, "cannot write the rclone config");
			break;
		}
		off += (size_t)n;
	}
	explicit_bzero(text, len);
	free(text);
	if (rc == 0 && fsync(fd) < 0)
		rc = err_set(err, errno, NULL, "cannot write the rclone config");
	close(fd);
	if (rc < 0)
		unlink(path);
	return rc;
}

static int build_argv(struct mount_plan *pl, unsigned timeout_ms, struct shim_err *err)
{
	/* preflight: one try, bounded by the mount's timeout */
	unsigned secs = (timeout_ms + 999) / 1000;
	size_t k = 0;
	char **f = pl->pf_argv;
	f[k++] = xstrdup("rclone");
	f[k++] = xstrdup("lsf");
	if (pl->prefix != NULL && pl->prefix[0] != '\0')
		f[k++] = xprintf("sbx:%s/%s", pl->bucket, pl->prefix);
	else
		f[k++] = xprintf("sbx:%s", pl->bucket);
	f[k++] = xprintf("--config=%s/rclone.conf", pl->rundir);
	f[k++] = xstrdup("--max-depth=1");
	f[k++] = xstrdup("--low-level-retries=1");
	f[k++] = xstrdup("--retries=1");
	f[k++] = xprintf("--contimeout=%us", secs);
	f[k++] = xprintf("--timeout=%us", secs);
	f[k] = NULL;
	for (size_t i = 0; i < k; i++)
		if (f[i] == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
	size_t n = 0;
	char **a = pl->argv;
	a[n++] = xstrdup("rclone");
	a[n++] = xstrdup("mount");
	if (pl->prefix != NULL && pl->prefix[0] != '\0')
		a[n++] = xprintf("sbx:%s/%s", pl->bucket, pl->prefix);
	else
		a[n++] = xprintf("sbx:%s", pl->bucket);
	/* the checked directory itself, not its path (which could be swapped since) */
	a[n++] = pl->mp_fd >= 0 ? xprintf("/proc/self/fd/%d/.", MOUNT_POINT_FD) : xstrdup(pl->real);
	a[n++] = xprintf("--config=%s/rclone.conf", pl->rundir);
	a[n++] = xprintf("--cache-dir=%s/cache", pl->rundir);
	/* defaults a client may override (later flags win) */
	a[n++] = xstrdup("--vfs-cache-mode=writes");
	/* upload as soon as a file is closed, so that unmount has little to wait for */
	a[n++] = xstrdup("--vfs-write-back=0s");
	/* objects put into the bucket from elsewhere show up within seconds */
	a[n++] = xstrdup("--dir-cache-time=10s");
	if (pl->read_only)
		a[n++] = xstrdup("--read-only");
	if (pl->allow_non_empty)
		a[n++] = xstrdup("--allow-non-empty");
	for (size_t i = 0; i < pl->n_opts; i++) {
		if (pl->opt_value[i] != NULL)
			a[n++] = xprintf("--%s=%s", pl->opt_name[i], pl->opt_value[i]);
		else
			a[n++] = xprintf("--%s", pl->opt_name[i]);
	}
	a[n] = NULL;
	/* a clean, explicit environment: nothing inherited (AWS_CA_BUNDLE and friends
	 * break rclone's S3 client, and credentials live only in the config) */
	size_t e = 0;
	pl->envp[e++] = xprintf("PATH=%s", search_path());
	pl->envp[e++] = xprintf("HOME=%s", pl->rundir);
	pl->envp[e++] = xprintf("TMPDIR=%s", pl->rundir);
	pl->envp[e++] = xstrdup("LANG=C.UTF-8");
	pl->envp[e] = NULL;
	for (size_t i = 0; i < n; i++)
		if (a[i] == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; i < e; i++)
		if (pl->envp[i] == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
	return 0;
}

static int resolve_path(struct mount_plan *pl, struct shim_err *err)
{
	struct fs_path p;
	ProtobufCBinaryData b = {strlen(pl->path), (uint8_t *)pl->path};
	if (fs_path_get(&b, &p, err) < 0)
		return -1;
	int fd = fs_open(&p, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, err);
	if (fd < 0 && err->code == ENOENT) {
		char name[NAME_MAX + 1];
		int dfd = fs_open_parent(&p, name, err);
		if (dfd < 0)
			return -1;
		if (mkdirat(dfd, name, 0755) < 0) {
			int e = errno;
			close(dfd);
			return err_set(err, e, pl->path, "cannot create the mount point");
		}
		pl->created_dir = true;
		close(dfd);
		fd = fs_open(&p, O_PATH | O_DIRECTORY | O_CLOEXEC, 0, err);
	}
	if (fd < 0)
		return -1;
	char link[64];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, pl->real, sizeof(pl->real) - 1);
	if (n <= 0) {
		close(fd);
		return err_set(err, errno ? errno : EIO, pl->path, "cannot tell the mount point's real path");
	}
	pl->real[n] = '\0';
	int rc = 0;
	char fstype[64];
	if (!pl->created_dir) {
		if (mount_info_find(pl->real, fstype, sizeof(fstype)) == 0 && fstype[0] != '\0')
			rc = err_set(err, EBUSY, pl->path, "already a mount point (%s)", fstype);
		else if (!pl->allow_non_empty && !dir_empty(fd))
			rc = err_set(err, ENOTEMPTY, pl->path,
				     "the mount point is not empty (ask for allow_non_empty to mount over it)");
	}
	if (rc == 0)
		pl->mp_fd = fd; /* for rclone: the directory checked here */
	else
		close(fd);
	return rc;
}

/* mount_prepare's steps on disk: the runtime dir (locked), the cache dir, rclone's
 * config, the mount point's record, rclone's log and argv. -1 with err; the caller
 * removes what was made. */
static int prepare_files(struct mount_plan *pl, unsigned timeout_ms, struct shim_err *err)
{
	if (resolve_path(pl, err) < 0)
		return -1;
	char dir[PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/mounts", pl->state_dir);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return err_set(err, errno, NULL, "cannot create %s", dir);
	if ((size_t)snprintf(pl->rundir, sizeof(pl->rundir), "%s/%s", dir, pl->id) >= sizeof(pl->rundir) ||
	    mkdir(pl->rundir, 0700) < 0) {
		err_set(err, errno, NULL, "cannot create the mount's runtime dir");
		pl->rundir[0] = '\0';
		return -1;
	}
	/* held for the mount's life: a daemon starting meanwhile with the same state dir
	 * leaves it alone (mount_sweep) */
	pl->lock_fd = open(pl->rundir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat lst;
	if (pl->lock_fd < 0 || flock(pl->lock_fd, LOCK_EX | LOCK_NB) < 0 || fstat(pl->lock_fd, &lst) < 0)
		return err_set(err, errno, NULL, "cannot lock the mount's runtime dir");
	if (lst.st_nlink == 0) {
		/* another daemon's start-up sweep took it between mkdir and flock */
		err_set(err, EAGAIN, NULL, "the mount's runtime dir was removed by another daemon's sweep: try again");
		pl->rundir[0] = '\0';
		return -1;
	}
	char cache[PATH_MAX + 16];
	snprintf(cache, sizeof(cache), "%s/cache", pl->rundir);
	if (mkdir(cache, 0700) < 0)
		return err_set(err, errno, NULL, "cannot create the mount's cache dir");
	if (write_config(pl, err) < 0)
		return -1;
	/* where it is mounted, for the sweep after a crash (a dead FUSE mount is detached) */
	char mpp[PATH_MAX + 16];
	snprintf(mpp, sizeof(mpp), "%s/mountpoint", pl->rundir);
	int mpf = open(mpp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	size_t rl = strlen(pl->real);
	if (mpf < 0 || write(mpf, pl->real, rl) != (ssize_t)rl) {
		err_set(err, errno ? errno : EIO, NULL, "cannot write the mount's runtime dir");
		if (mpf >= 0)
			close(mpf);
		return -1;
	}
	close(mpf);
	char logp[PATH_MAX + 16];
	snprintf(logp, sizeof(logp), "%s/rclone.log", pl->rundir);
	pl->log_fd = open(logp, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (pl->log_fd < 0)
		return err_set(err, errno, NULL, "cannot create rclone's log");
	if (build_argv(pl, timeout_ms, err) < 0)
		return -1;
	return 0;
}

int mount_prepare(struct mount_plan *pl, unsigned timeout_ms, struct shim_err *err)
{
	pl->log_fd = -1;
	if (!find_program("rclone", pl->rclone, sizeof(pl->rclone)))
		return err_set(err, ENOENT, "rclone",
			       "rclone not found in PATH: install it (Debian/Ubuntu: apt-get install rclone)");
	if (!find_program("fusermount3", pl->fusermount, sizeof(pl->fusermount)))
		return err_set(err, ENOENT, "fusermount3",
			       "fusermount3 not found in PATH: install FUSE 3 (Debian/Ubuntu: apt-get install fuse3)");
	if (access("/dev/fuse", R_OK | W_OK) < 0)
		return err_set(err, errno == ENOENT ? ENODEV : errno, "/dev/fuse",
			       "no usable /dev/fuse (a container needs --device /dev/fuse --cap-add SYS_ADMIN)");
	if (prepare_files(pl, timeout_ms, err) == 0)
		return 0;
	if (pl->log_fd >= 0)
		close(pl->log_fd);
	pl->log_fd = -1;
	mount_remove_files(pl->rundir, pl->real, pl->created_dir);
	if (pl->lock_fd >= 0)
		close(pl->lock_fd);
	pl->lock_fd = -1;
	pl->created_dir = false;
	return -1;
}

/* ================================ mountinfo ================================ */

/* mountinfo escapes space, tab, newline and backslash as \ooo */
static void unescape(char *s)
{
	char *o = s;
	for (; *s != '\0'; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' &&
		    s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = '\0';
}

int mount_info_find(const char *path, char *fstype, size_t size)
{
	fstype[0] = '\0';
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (f == NULL)
		return -1;
	char *line = NULL;
	size_t cap = 0;
	while (getline(&line, &cap, f) > 0) {
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER */
		char *save = NULL, *tok = strtok_r(line, " ", &save);
		char *mp = NULL;
		for (int i = 0; tok != NULL && i < 4; i++)
			tok = strtok_r(NULL, " ", &save);
		mp = tok;
		if (mp == NULL)
			continue;
		while ((tok = strtok_r(NULL, " ", &save)) != NULL && strcmp(tok, "-") != 0)
			;
		char *fs = strtok_r(NULL, " ", &save);
		if (fs == NULL)
			continue;
		unescape(mp);
		/* the last match is the topmost mount */
		if (strcmp(mp, path) == 0)
			snprintf(fstype, size, "%s", fs);
	}
	free(line);
	fclose(f);
	return 0;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool flag(const bool *b)
{
	return __atomic_load_n(b, __ATOMIC_ACQUIRE);
}

int mount_wait_live(const char *path, const bool *exited, const bool *abort, unsigned timeout_ms, struct shim_err *err)
{
	uint64_t end = now_ms() + timeout_ms;
	bool mounted = false;
	int last_errno = 0, failures = 0;
	for (;;) {
		if (flag(exited))
			return err_set(err, EIO, NULL, "rclone exited");
		if (flag(abort))
			return err_set(err, ECANCELED, NULL, "cancelled");
		char fstype[64];
		if (!mounted && mount_info_find(path, fstype, sizeof(fstype)) == 0 &&
		    strcmp(fstype, "fuse.rclone") == 0)
			mounted = true;
		if (mounted) {
			/* answering: a statfs and a listing of the bucket (a wrong key or a
			 * missing bucket fails here, with rclone's reason in its log) */
			struct statfs sf;
			DIR *d = NULL;
			if (statfs(path, &sf) == 0 && (d = opendir(path)) != NULL) {
				errno = 0;
				while (readdir(d) != NULL)
					;
				int e = errno;
				closedir(d);
				if (e == 0)
					return 0;
				last_errno = e;
			} else {
				last_errno = errno;
			}
			/* rclone has retried inside; a second failure is the answer */
			if (++failures >= 2)
				return err_set(err, last_errno, NULL, "the mount does not answer (%s)",
					       strerror(last_errno));
		}
		if (now_ms() >= end)
			break;
		sleep_ms(mounted ? 100 : 20);
	}
	if (!mounted)
		return err_set(err, ETIMEDOUT, NULL, "the mount did not appear within %u ms", timeout_ms);
	return err_set(err, last_errno ? last_errno : ETIMEDOUT, NULL, "the mount does not answer (%s) after %u ms",
		       strerror(last_errno ? last_errno : ETIMEDOUT), timeout_ms);
}

/* ================================ flush ================================ */

static unsigned dirty_in(int dfd, int depth)
{
	if (depth > 64)
		return 0;
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		return 0;
	}
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
		if (fd < 0)
			continue;
		struct stat st;
		if (fstat(fd, &st) < 0) {
			close(fd);
		} else if (S_ISDIR(st.st_mode)) {
			n += dirty_in(fd, depth + 1);
		} else {
			/* rclone's per-file metadata: a small JSON object */
			char buf[8192];
			ssize_t len = S_ISREG(st.st_mode) ? read(fd, buf, sizeof(buf) - 1) : -1;
			close(fd);
			if (len > 0) {
				buf[len] = '\0';
				if (strstr(buf, "\"Dirty\": true") != NULL || strstr(buf, "\"Dirty\":true") != NULL)
					n++;
			}
		}
	}
	closedir(d);
	return n;
}

/* rclone's open file descriptors into its cache's data files */
static unsigned open_cache_files(const char *rundir, pid_t pid)
{
	char dir[64], prefix[PATH_MAX + 32];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	int plen = snprintf(prefix, sizeof(prefix), "%s/cache/vfs/", rundir);
	DIR *d = opendir(dir);
	if (d == NULL)
		return 0;
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char target[PATH_MAX];
		ssize_t len = readlinkat(dirfd(d), e->d_name, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (plen > 0 && strncmp(target, prefix, (size_t)plen) == 0)
			n++;
	}
	closedir(d);
	return n;
}

unsigned mount_dirty_count(const char *rundir, pid_t pid)
{
	unsigned n = pid > 0 ? open_cache_files(rundir, pid) : 0;
	char p[PATH_MAX + 32];
	snprintf(p, sizeof(p), "%s/cache/vfsMeta", rundir);
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return n;
	return n + dirty_in(fd, 0);
}

/* ================================ unmount ================================ */

bool mount_is_fuse(const char *path)
{
	char fstype[64];
	return mount_info_find(path, fstype, sizeof(fstype)) == 0 && strncmp(fstype, "fuse", 4) == 0;
}

int mount_detach(const char *path)
{
	/* the kernel drops a detached mount when its last user goes */
	for (int i = 0; i < 4 && mount_is_fuse(path); i++)
		if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL)
			log_warn("mount %s: lazy unmount: %s", path, strerror(errno));
	return mount_is_fuse(path) ? -1 : 0;
}

#ifndef MOVE_MOUNT_BENEATH
#define MOVE_MOUNT_BENEATH 0x00000200 /* Linux 6.5 */
#endif

int mount_tombstone(const char *path)
{
	/* The path must go from the dead FUSE mount (ENOTCONN) to "read-only" with no
	 * moment as the bare directory underneath. With MOVE_MOUNT_BENEATH the tmpfs is
	 * slid under the FUSE mount and the FUSE mount then detached: an atomic swap.
	 * Older kernels: the tmpfs goes on top and the dead FUSE mount stays under it
	 * (unreachable) until the unmount. */
	const unsigned attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
	int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
	if (fs >= 0) {
		int mfd = -1;
		if (fsconfig(fs, FSCONFIG_SET_STRING, "source", "sbx-mount-failed", 0) == 0 &&
		    fsconfig(fs, FSCONFIG_SET_STRING, "size", "4k", 0) == 0 &&
		    fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0555", 0) == 0 &&
		    fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
			mfd = fsmount(fs, FSMOUNT_CLOEXEC, attrs);
		close(fs);
		if (mfd >= 0) {
			bool under =
				mount_is_fuse(path) &&
				move_mount(mfd, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_BENEATH) == 0;
			int rc = under ? 0 : move_mount(mfd, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH);
			int e = errno;
			close(mfd);
			if (under && umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
				log_warn("mount %s: detaching the dead FUSE mount: %s", path, strerror(errno));
			if (rc == 0)
				return 0;
			log_debug("mount %s: move_mount of the cover: %s", path, strerror(e));
		}
	}
	if (mount("sbx-mount-failed", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "size=4k,mode=0555") < 0) {
		log_warn("mount %s: cannot cover the dead mount (%s)", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* ================================ log and cleanup ================================ */

/* "2026/11/29 13:11:25 ERROR : text" -> "ERROR : text" */
static const char *drop_stamp(const char *s)
{
	if (strlen(s) > 20 && s[4] == '/' && s[7] == '/' && s[10] == ' ' && s[13] == ':' && s[16] == ':' &&
	    s[19] == ' ')
		return s + 20;
	return s;
}

void mount_log_tail(const char *rundir, char *out, size_t size)
{
	out[0] = '\0';
	char p[PATH_MAX + 32];
	snprintf(p, sizeof(p), "%s/rclone.log", rundir);
	int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return;
	char buf[4097];
	off_t end = lseek(fd, 0, SEEK_END);
	off_t start = end > 4096 ? end - 4096 : 0;
	ssize_t n = pread(fd, buf, 4096, start);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	/* the last ERROR/CRITICAL/Fatal line with its continuation lines (tab-indented),
	 * else the last non-empty line */
	char *lines[256];
	size_t nl = 0;
	char *save = NULL;
	for (char *l = strtok_r(buf, "\n", &save); l != NULL && nl < ARRAY_SIZE(lines); l = strtok_r(NULL, "\n", &save))
		lines[nl++] = l;
	if (nl == 0)
		return;
	size_t pick = nl - 1;
	for (size_t i = nl; i-- > 0;) {
		/* rclone's own goodbyes say nothing about why */
		if (strstr(lines[i], "Unmounted rclone mount") != NULL || strstr(lines[i], "Signal received") != NULL ||
		    strstr(lines[i], "Exiting") != NULL)
			continue;
		if (strstr(lines[i], "ERROR") != NULL || strstr(lines[i], "CRITICAL") != NULL ||
		    strstr(lines[i], "Fatal") != NULL || strstr(lines[i], "Failed") != NULL ||
		    strstr(lines[i], "NOTICE") != NULL) {
			pick = i;
			break;
		}
	}
	/* joined in a roomy buffer first, trimmed, then cut to size */
	char j[2048];
	size_t o = 0;
	for (size_t i = pick; i < nl && o + 1 < sizeof(j); i++) {
		/* continuation lines ("caused by: ...", tab-indented details) carry no stamp */
		if (i > pick && drop_stamp(lines[i]) != lines[i])
			break;
		const char *s = drop_stamp(lines[i]);
		while (*s == '\t' || *s == ' ')
			s++;
		int w = snprintf(j + o, sizeof(j) - o, "%s%s", o ? " " : "", s);
		if (w < 0)
			break;
		o += (size_t)w;
		if (o >= sizeof(j))
			o = sizeof(j) - 1;
	}
	j[o] = '\0';
	/* boilerplate out, so that the cause fits in an error message */
	char *f = strstr(j, "Failed to lsf with ");
	char *l = f != NULL ? strstr(f, "last error was: ") : NULL;
	if (f != NULL && l != NULL)
		memmove(f, l, strlen(l) + 1);
	static const char *const noise[] = {
		"last error was: ", "error in ListJSON: ", "error listing: ", "RequestError: send request failed ",
		"IO error: ",       "caused by: "};
	for (size_t i = 0; i < ARRAY_SIZE(noise); i++) {
		char *at = strstr(j, noise[i]);
		if (at != NULL)
			memmove(at, at + strlen(noise[i]), strlen(at + strlen(noise[i])) + 1);
	}
	/* 'Get "http://host/bucket?delimiter=...": dial tcp ...': the URL is noise here */
	char *get = strstr(j, "Get \"");
	char *endq = get != NULL ? strstr(get + 5, "\": ") : NULL;
	if (get != NULL && endq != NULL)
		memmove(get, endq + 3, strlen(endq + 3) + 1);
	char *rid = strstr(j, ", request id:");
	if (rid != NULL)
		*rid = '\0';
	/* one printable line */
	for (char *c = j; *c != '\0'; c++)
		if ((unsigned char)*c < 0x20)
			*c = ' ';
	snprintf(out, size, "%s", j);
}

/* The start time (clock ticks since boot) of pid, 0 if it is gone or a zombie. */
static unsigned long long start_time(pid_t pid)
{
	char p[64], buf[1024];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* after the ")" of the name: state is field 3, starttime field 22 */
	char *s = strrchr(buf, ')');
	if (s == NULL || s[1] != ' ' || s[2] == 'Z')
		return 0;
	unsigned long long v = 0;
	char *tok = s + 2;
	for (int field = 3; field < 22 && tok != NULL; field++) {
		tok = strchr(tok, ' ');
		if (tok != NULL)
			tok++;
	}
	if (tok == NULL || sscanf(tok, "%llu", &v) != 1)
		return 0;
	return v;
}

void mount_record_pid(const char *rundir, pid_t pid)
{
	unsigned long long st = start_time(pid);
	char p[PATH_MAX + 32], line[64];
	snprintf(p, sizeof(p), "%s/rclone.pid", rundir);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || st == 0) {
		if (fd >= 0)
			close(fd);
		return;
	}
	int n = snprintf(line, sizeof(line), "%d %llu\n", (int)pid, st);
	if (write(fd, line, (size_t)n) != n)
		log_debug("mount: cannot note rclone's pid in %s: %s", p, strerror(errno));
	close(fd);
}

/* Sweep: the rclone a runtime dir names is gone (waited for up to 3 s: it got its
 * parent-death signal with the daemon and may still be on its way out). False when
 * it lives on, or nothing says which it was. */
static bool rclone_gone(int rfd)
{
	int fd = openat(rfd, "rclone.pid", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return false;
	char buf[64];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	int pid;
	unsigned long long st;
	if (n <= 0)
		return false;
	buf[n] = '\0';
	if (sscanf(buf, "%d %llu", &pid, &st) != 2 || pid <= 0)
		return false;
	for (int i = 0; i < 150; i++) {
		if (start_time(pid) != st)
			return true; /* gone, a zombie, or the pid is another process's now */
		sleep_ms(20);
	}
	return false;
}

unsigned mount_sweep(const char *state_dir)
{
	char dir[PATH_MAX];
	if ((size_t)snprintf(dir, sizeof(dir), "%s/mounts", state_dir) >= sizeof(dir))
		return 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		return 0;
	}
	unsigned removed = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		int fd = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
			close(fd); /* a live daemon's mount */
			continue;
		}
		/* ours to remove: unlocked, or no directory at all. Its FUSE mount, if rclone
		 * went with the daemon and left it dead (ENOTCONN), is detached first; a live
		 * one (someone mounted there since) is left alone. */
		char mp[PATH_MAX];
		int mpf = fd >= 0 ? openat(fd, "mountpoint", O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
		ssize_t ml = mpf >= 0 ? read(mpf, mp, sizeof(mp) - 1) : -1;
		if (mpf >= 0)
			close(mpf);
		if (ml > 0 && mp[0] == '/') {
			mp[ml] = '\0';
			if (mount_is_fuse(mp) && rclone_gone(fd) && mount_detach(mp) == 0)
				log_warn("mount: detached the dead FUSE mount at %s, left by a daemon that is gone",
					 mp);
		}
		struct shim_err err;
		char what[PATH_MAX + 300];
		snprintf(what, sizeof(what), "%s/%s", dir, e->d_name);
		if (op_fs_remove_tree(dfd, e->d_name, false, what, &err) < 0 && err.code != ENOENT) {
			log_warn("mount: cannot remove %s: %s: %s", what, err.msg, strerror(err.code));
		} else {
			log_info("mount: removed %s, left by a mount of a daemon that is gone", what);
			removed++;
		}
		if (fd >= 0)
			close(fd);
	}
	closedir(d);
	return removed;
}

void mount_remove_files(const char *rundir, const char *real, bool created_dir)
{
	if (rundir != NULL && rundir[0] != '\0') {
		const char *slash = strrchr(rundir, '/');
		if (slash != NULL) {
			char parent[PATH_MAX];
			snprintf(parent, sizeof(parent), "%.*s", (int)(slash - rundir), rundir);
			int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (dfd >= 0) {
				struct shim_err e;
				if (op_fs_remove_tree(dfd, slash + 1, false, rundir, &e) < 0 && e.code != ENOENT)
					log_warn("mount: cannot remove %s: %s: %s", rundir, e.msg, strerror(e.code));
				close(dfd);
			}
		}
	}
	/* only an empty directory: whatever someone put there stays */
	if (created_dir && real != NULL && real[0] != '\0' && rmdir(real) < 0 && errno != ENOENT)
		log_warn("mount: cannot remove the mount point %s: %s", real, strerror(errno));
}

int mount_classify(const char *tail, int dflt)
{
	static const struct {
		const char *word;
		int code;
	} map[] = {
		{"InvalidAccessKeyId", EACCES}, {"SignatureDoesNotMatch", EACCES},
		{"AccessDenied", EACCES},       {"status code: 403", EACCES},
		{"Forbidden", EACCES},          {"NoSuchBucket", ENOENT},
		{"status code: 404", ENOENT},   {"connection refused", ECONNREFUSED},
		{"no such host", EHOSTUNREACH}, {"network is unreachable", ENETUNREACH},
		{"i/o timeout", ETIMEDOUT},     {"certificate", EPROTO},
	};
	for (size_t i = 0; i < ARRAY_SIZE(map); i++)
		if (strstr(tail, map[i].word) != NULL)
			return map[i].code;
	return dflt;
}
