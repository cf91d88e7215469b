/* tr_unix.c: unix-socket listener: made in a private directory, 0600, renamed onto its path; peers checked by uid. */
#include "listen.h"
#include "log.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int fill_addr(const char *path, struct sockaddr_un *sa, struct shim_err *err)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (path[0] != '/')
		return err_set(err, EINVAL, path, "unix socket path must be absolute");
	if (strlen(path) >= sizeof(sa->sun_path))
		return err_set(err, ENAMETOOLONG, path, "unix socket path longer than %zu bytes",
			       sizeof(sa->sun_path) - 1);
	memcpy(sa->sun_path, path, strlen(path) + 1);
	return 0;
}

/* Is something alive behind the socket file at path? */
static bool socket_is_live(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	int rc = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	int e = errno;
	close(fd);
	/* anything but "refused" means a listener is (or may be) there: never steal it */
	return rc == 0 || e != ECONNREFUSED;
}

/* The socket's directory must not let others swap names in it: writable only by its
 * owner, or sticky and root-owned (as /tmp), where no one renames or removes another's
 * entries. */
static int check_socket_dir(int pfd, const char *dir, const char *path, struct shim_err *err)
{
	struct stat st;
	if (fstat(pfd, &st) < 0)
		return err_set(err, errno, path, "stat the socket directory %s", dir);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || ((st.st_mode & S_ISVTX) && st.st_uid == 0))
		return 0;
	return err_set(err, EPERM, path,
		       "the socket directory %s is writable by others (mode %04o, owner uid %u): use a directory "
		       "that only its owner can write, or a sticky root-owned one",
		       dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
}

/* A fresh directory beside the socket, 0700 and ours, named .BASE.RANDOM: nobody else
 * can put or swap anything in it. Its name into name; its O_PATH fd, or -1 with err. */
static int make_private_dir(int pfd, const char *base, const char *path, char *name, size_t size, struct shim_err *err)
{
	static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	for (int tries = 0; tries < 16; tries++) {
		uint8_t r[8];
		if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
			uint64_t x = mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)tries;
			memcpy(r, &x, sizeof(r));
		}
		char rs[sizeof(r) + 1];
		for (size_t i = 0; i < sizeof(r); i++)
			rs[i] = alnum[r[i] % (sizeof(alnum) - 1)];
		rs[sizeof(r)] = '\0';
		int n = snprintf(name, size, ".%.200s.%s", base, rs);
		if (n < 0 || (size_t)n >= size)
			return err_set(err, ENAMETOOLONG, path, "socket name too long");
		if (mkdirat(pfd, name, 0700) < 0) {
			if (errno == EEXIST)
				continue;
			return err_set(err, errno, path, "create a private directory beside the socket");
		}
		int fd = openat(pfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
			int e = fd < 0 ? errno : EPERM;
			if (fd >= 0)
				close(fd);
			return err_set(err, e, path, "the private directory %s beside the socket is not ours", name);
		}
		return fd;
	}
	return err_set(err, EEXIST, path, "cannot find a free name for a private directory beside the socket");
}

/* The socket bound as tfd/s (the private directory tname inside pfd), its mode and group
 * set there, listening, then renamed onto base: the listening fd, or -1 with err. The
 * caller removes the private directory whatever happened. */
static int bind_and_publish(struct server *s, int pfd, int tfd, const char *dir, const char *tname, const char *base,
			    const char *path, ino_t *ino, struct shim_err *err)
{
	/* bound through /proc/self/fd (short, whatever the path's length), else by name */
	struct sockaddr_un tmp;
	char bpath[sizeof(tmp.sun_path) + 300];
	snprintf(bpath, sizeof(bpath), "/proc/self/fd/%d/s", tfd);
	struct shim_err e2;
	if (fill_addr(bpath, &tmp, &e2) < 0)
		return err_set(err, e2.code, path, "%s", e2.msg);
	int cleanup_close fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return err_set(err, errno, path, "socket");
	if (bind(fd, (struct sockaddr *)&tmp, sizeof(tmp)) < 0) {
		int e = errno;
		snprintf(bpath, sizeof(bpath), "%s/%s/s", dir, tname);
		if (e != ENOENT || fill_addr(bpath, &tmp, &e2) < 0 ||
		    bind(fd, (struct sockaddr *)&tmp, sizeof(tmp)) < 0)
			return err_set(err, e != ENOENT ? e : errno, path, "bind");
	}
	mode_t mode = s->cfg.socket_mode != 0 ? s->cfg.socket_mode : 0600;
	if (fchmodat(tfd, "s", mode, 0) < 0)
		return err_set(err, errno, path, "chmod");
	if (s->cfg.socket_gid != (gid_t)-1 && fchownat(tfd, "s", (uid_t)-1, s->cfg.socket_gid, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, path, "chown to group %u", (unsigned)s->cfg.socket_gid);
	struct stat st;
	if (fstatat(tfd, "s", &st, AT_SYMLINK_NOFOLLOW) < 0)
		return err_set(err, errno, path, "stat the new socket");
	*ino = st.st_ino;
	if (listen(fd, 512) < 0)
		return err_set(err, errno, path, "listen");
	if (renameat(tfd, "s", pfd, base) < 0)
		return err_set(err, errno, path, "rename the new socket onto the path");
	return steal_fd(fd);
}

int tr_unix_listen(struct server *s, const char *path, ino_t *ino, struct shim_err *err)
{
	struct sockaddr_un sa;
	if (fill_addr(path, &sa, err) < 0)
		return -1;
	const char *slash = strrchr(path, '/');
	const char *base = slash + 1;
	if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return err_set(err, EINVAL, path, "unix socket path must end in a file name");
	char dir[sizeof(sa.sun_path)];
	snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	int cleanup_close pfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0)
		return err_set(err, errno, path, "the socket directory %s", dir);
	if (check_socket_dir(pfd, dir, path, err) < 0)
		return -1;

	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return err_set(err, EEXIST, path, "exists and is not a socket");
		if (socket_is_live(&sa))
			return err_set(err, EADDRINUSE, path, "another process is listening on this socket");
	} else if (errno != ENOENT) {
		return err_set(err, errno, path, "stat");
	}

	/* Bind in a private directory made for it, set the mode and group there (no one
	 * else can reach the name), then rename it over the path: a stale socket is
	 * replaced in one atomic step, and the name others see is the finished socket. */
	char tname[256];
	int cleanup_close tfd = make_private_dir(pfd, base, path, tname, sizeof(tname), err);
	if (tfd < 0)
		return -1;
	int fd = bind_and_publish(s, pfd, tfd, dir, tname, base, path, ino, err);
	unlinkat(tfd, "s", 0);
	if (unlinkat(pfd, tname, AT_REMOVEDIR) < 0 && fd >= 0)
		log_warn("%s: cannot remove the private directory %s: %s", path, tname, strerror(errno));
	return fd;
}

int tr_unix_check_peer(struct server *s, int fd, char *peer, size_t peer_size, struct shim_err *err)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		snprintf(peer, peer_size, "unix peer ?");
		return err_set(err, errno, NULL, "SO_PEERCRED");
	}
	snprintf(peer, peer_size, "unix pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
	if (s->cfg.n_allow_uids == 0)
		return 0;
	for (unsigned i = 0; i < s->cfg.n_allow_uids; i++)
		if (s->cfg.allow_uids[i] == cred.uid)
			return 0;
	return err_set(err, EACCES, NULL, "peer uid %u not allowed", (unsigned)cred.uid);
}
