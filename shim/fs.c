/* fs.c: checking request paths and resolving them, confined beneath --root with openat2. */
#include "fs.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452 /* Linux 6.6; the same number on every architecture */
#endif

static struct {
	int fd;     /* AT_FDCWD without confinement */
	char *path; /* NULL without confinement */
	size_t len;
} root = {.fd = AT_FDCWD};

int fs_init(const char *dir, struct shim_err *err)
{
	if (dir == NULL || strcmp(dir, "/") == 0)
		return 0;
	if (dir[0] != '/')
		return err_set(err, EINVAL, dir, "--root must be an absolute path");
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, dir, "open --root");
	/* Confinement needs openat2's RESOLVE_IN_ROOT (Linux 5.6): refuse to start
	 * rather than pretend. */
	struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT};
	int t = (int)syscall(SYS_openat2, fd, ".", &how, sizeof(how));
	if (t < 0) {
		int e = errno;
		close(fd);
		return err_set(err, e, dir, "openat2 (needed for --root)");
	}
	close(t);
	char real[PATH_MAX];
	if (realpath(dir, real) == NULL) {
		int e = errno;
		close(fd);
		return err_set(err, e, dir, "realpath");
	}
	root.fd = fd;
	root.path = strdup(real);
	root.len = strlen(real);
	return 0;
}

const char *fs_root(void)
{
	return root.path;
}

int fs_root_stat(struct stat *st)
{
	if (root.path == NULL)
		return stat("/", st);
	return fstat(root.fd, st);
}

int fs_path_get(const ProtobufCBinaryData *in, struct fs_path *out, struct shim_err *err)
{
	if (in->len == 0)
		return err_set(err, EINVAL, "", "empty path");
	if (memchr(in->data, '\0', in->len) != NULL)
		return err_setn(err, EINVAL, in->data, in->len, "path holds a NUL byte");
	if (in->data[0] != '/')
		return err_setn(err, EINVAL, in->data, in->len, "path must be absolute");
	if (in->len >= sizeof(out->abs))
		return err_setn(err, ENAMETOOLONG, in->data, in->len < 1000 ? in->len : 1000,
				"path longer than %d bytes", PATH_MAX - 1);
	memcpy(out->abs, in->data, in->len);
	out->abs[in->len] = '\0';
	out->len = in->len;
	return 0;
}

/* openat2 beneath the root; without confinement a plain openat of the absolute path. */
static int open_in_root(const char *path, int flags, mode_t mode)
{
	if (root.path == NULL)
		return openat(AT_FDCWD, path, flags | O_CLOEXEC, mode);
	while (*path == '/')
		path++;
	if (*path == '\0')
		path = ".";
	/* RESOLVE_IN_ROOT: "..", absolute symlinks and the like all stay beneath the
	 * root, as if it were "/" for this lookup. Magic links (/proc/self/fd/N) could
	 * jump anywhere: refused. */
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0,
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
	};
	long fd;
	do {
		fd = syscall(SYS_openat2, root.fd, path, &how, sizeof(how));
	} while (fd < 0 && errno == EAGAIN);
	return (int)fd;
}

int fs_open(const struct fs_path *p, int flags, mode_t mode, struct shim_err *err)
{
	int fd = open_in_root(p->abs, flags, mode);
	if (fd < 0)
		return err_set(err, errno, p->abs, "open");
	return fd;
}

int fs_open_parent(const struct fs_path *p, char name_buf[NAME_MAX + 1], struct shim_err *err)
{
	char dir[PATH_MAX];
	size_t len = p->len;
	while (len > 1 && p->abs[len - 1] == '/')
		len--;
	if (len == 1) {
		/* "/" itself: its "parent" is the root, the name "." */
		strcpy(name_buf, ".");
		int fd = open_in_root("/", O_PATH | O_DIRECTORY, 0);
		if (fd < 0)
			return err_set(err, errno, p->abs, "open");
		return fd;
	}
	size_t slash = len - 1;
	while (slash > 0 && p->abs[slash] != '/')
		slash--;
	size_t nlen = len - slash - 1;
	if (nlen > NAME_MAX)
		return err_set(err, ENAMETOOLONG, p->abs, "file name longer than %d bytes", NAME_MAX);
	if ((nlen == 1 && p->abs[slash + 1] == '.') || (nlen == 2 && memcmp(p->abs + slash + 1, "..", 2) == 0)) {
		/* "." or "..": the entry is the directory the whole path names. Taking the
		 * name literally against the parent fd would step above --root ("/.." is
		 * the root's own parent to fstatat, fchownat, utimensat...), so resolve the
		 * whole path confined and hand back that directory as ".". */
		strcpy(name_buf, ".");
		int fd = open_in_root(p->abs, O_PATH | O_DIRECTORY, 0);
		if (fd < 0)
			return err_set(err, errno, p->abs, "open");
		return fd;
	}
	memcpy(name_buf, p->abs + slash + 1, nlen);
	name_buf[nlen] = '\0';
	size_t dlen = slash == 0 ? 1 : slash;
	memcpy(dir, p->abs, dlen);
	dir[dlen] = '\0';
	int fd = open_in_root(dir, O_PATH | O_DIRECTORY, 0);
	if (fd < 0)
		return err_set(err, errno, p->abs, "open parent directory");
	return fd;
}

int fs_stat(const struct fs_path *p, bool follow, struct stat *st, struct shim_err *err)
{
	if (follow) {
		int cleanup_close fd = fs_open(p, O_PATH, 0, err);
		if (fd < 0)
			return -1;
		if (fstat(fd, st) < 0)
			return err_set(err, errno, p->abs, "stat");
		return 0;
	}
	char name[NAME_MAX + 1];
	int cleanup_close dfd = fs_open_parent(p, name, err);
	if (dfd < 0)
		return -1;
	if (fstatat(dfd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, p->abs, "lstat");
	return 0;
}

static Shim__V1__FileType file_type(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFREG:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_FILE;
	case S_IFDIR:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	case S_IFLNK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_SYMLINK;
	case S_IFIFO:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_FIFO;
	case S_IFSOCK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_SOCKET;
	case S_IFBLK:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_BLOCK_DEVICE;
	case S_IFCHR:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_CHARACTER_DEVICE;
	default:
		return SHIM__V1__FILE_TYPE__FILE_TYPE_UNKNOWN;
	}
}

void fs_fill_stat(Shim__V1__FileStat *out, Shim__V1__Timestamp ts[3], const struct stat *st, const char *target,
		  size_t target_len)
{
	shim__v1__file_stat__init(out);
	for (int i = 0; i < 3; i++)
		shim__v1__timestamp__init(&ts[i]);
	out->type = file_type(st->st_mode);
	out->size = (uint64_t)st->st_size;
	out->mode = st->st_mode & 07777;
	out->uid = st->st_uid;
	out->gid = st->st_gid;
	out->nlink = st->st_nlink;
	out->inode = st->st_ino;
	out->device = st->st_dev;
	if (S_ISBLK(st->st_mode) || S_ISCHR(st->st_mode)) {
		out->has_rdev = 1;
		out->rdev = st->st_rdev;
	}
	out->has_blocks = 1;
	out->blocks = (uint64_t)st->st_blocks;
	ts[0].sec = st->st_atim.tv_sec;
	ts[0].nsec = (uint32_t)st->st_atim.tv_nsec;
	ts[1].sec = st->st_mtim.tv_sec;
	ts[1].nsec = (uint32_t)st->st_mtim.tv_nsec;
	ts[2].sec = st->st_ctim.tv_sec;
	ts[2].nsec = (uint32_t)st->st_ctim.tv_nsec;
	out->atime = &ts[0];
	out->mtime = &ts[1];
	out->ctime = &ts[2];
	if (target != NULL) {
		out->has_link_target = 1;
		out->link_target.data = (uint8_t *)(uintptr_t)target;
		out->link_target.len = target_len;
	}
}

int fs_fd_path(int fd, char *buf, size_t size, struct shim_err *err)
{
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(proc, buf, size - 1);
	if (n < 0)
		return err_set(err, errno, proc, "readlink");
	if ((size_t)n >= size - 1)
		return err_set(err, ENAMETOOLONG, NULL, "resolved path too long");
	buf[n] = '\0';
	if (root.path != NULL) {
		/* show the path as the client sees it: beneath the root, from "/" */
		if (strncmp(buf, root.path, root.len) != 0 || (buf[root.len] != '/' && buf[root.len] != '\0'))
			return err_set(err, EXDEV, buf, "resolved outside --root");
		if (buf[root.len] == '\0')
			strcpy(buf, "/");
		else
			memmove(buf, buf + root.len, (size_t)n - root.len + 1);
	}
	return 0;
}

/* An O_PATH fd cannot be given to fchmod/futimens: use the *at() call with
 * AT_EMPTY_PATH where the kernel has it, else the fd's /proc/self/fd link (which
 * names exactly this inode, whatever happens to its path meanwhile). */
static void proc_fd_path(int fd, char buf[32])
{
	snprintf(buf, 32, "/proc/self/fd/%d", fd);
}

int fs_fd_chmod(int fd, mode_t mode)
{
	if (syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH) == 0)
		return 0;
	if (errno != ENOSYS && errno != EINVAL)
		return -1;
	char proc[32];
	proc_fd_path(fd, proc);
	return fchmodat(AT_FDCWD, proc, mode, 0);
}

int fs_fd_utimens(int fd, const struct timespec ts[2])
{
	if (utimensat(fd, "", ts, AT_EMPTY_PATH) == 0)
		return 0;
	/* a kernel without AT_EMPTY_PATH here refuses the flag, or the empty name */
	if (errno != EINVAL && errno != ENOENT)
		return -1;
	char proc[32];
	proc_fd_path(fd, proc);
	return utimensat(AT_FDCWD, proc, ts, 0);
}

/* The kernel's record (getdents64 fills the buffer with these). */
struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

int fs_dir_next(struct fs_dirbuf *b, struct fs_dirpos *d, const char **name, unsigned char *type)
{
	if (b->fd != d->fd) {
		/* the buffer holds another level's entries: come back to where this
		 * directory was left (a getdents position cookie) */
		if (lseek(d->fd, d->next, SEEK_SET) < 0)
			return -1;
		b->fd = d->fd;
		b->pos = b->len = 0;
	}
	for (;;) {
		if (b->pos >= b->len) {
			long n = syscall(SYS_getdents64, d->fd, b->buf, sizeof(b->buf));
			if (n < 0) {
				b->fd = -1;
				return -1;
			}
			if (n == 0)
				return 0;
			b->pos = 0;
			b->len = (size_t)n;
		}
		const struct linux_dirent64 *e = (const struct linux_dirent64 *)(void *)(b->buf + b->pos);
		b->pos += e->d_reclen;
		d->next = e->d_off;
		if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0')))
			continue;
		*name = e->d_name;
		*type = e->d_type;
		return 1;
	}
}

int fs_dir_rewind(struct fs_dirbuf *b, struct fs_dirpos *d)
{
	if (b->fd == d->fd)
		b->fd = -1;
	d->next = 0;
	return (int)lseek(d->fd, 0, SEEK_SET);
}

void fs_dir_forget(struct fs_dirbuf *b, int fd)
{
	if (b->fd == fd)
		b->fd = -1;
}

int fs_dir_reopen_parent(int child, dev_t dev, ino_t ino)
{
	int fd = openat(child, "..", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	if (st.st_dev != dev || st.st_ino != ino) {
		close(fd);
		errno = EAGAIN;
		return -1;
	}
	return fd;
}

void fs_cancel_block(sigset_t *old)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, FS_CANCEL_SIGNAL);
	pthread_sigmask(SIG_BLOCK, &set, old);
}

void fs_cancel_restore(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

bool fs_cancel_pending(void)
{
	sigset_t set;
	return sigpending(&set) == 0 && sigismember(&set, FS_CANCEL_SIGNAL) == 1;
}
