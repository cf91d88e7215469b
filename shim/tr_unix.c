/* tr_unix.c: unix-socket listener: created 0600, stale files replaced safely, peers checked by uid. */
#include "listen.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int tr_unix_listen(struct server *s, const char *path, struct shim_err *err)
{
	struct sockaddr_un sa, tmp;
	if (fill_addr(path, &sa, err) < 0)
		return -1;

	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return err_set(err, EEXIST, path, "exists and is not a socket");
		if (socket_is_live(&sa))
			return err_set(err, EADDRINUSE, path, "another process is listening on this socket");
	} else if (errno != ENOENT) {
		return err_set(err, errno, path, "stat");
	}

	/* Bind under a temporary name in the same directory, then rename over the path:
	 * a stale file is replaced in one atomic step, and the socket is 0600 from its
	 * first instant (umask at bind time), widened only afterwards if asked. */
	char tmppath[sizeof(sa.sun_path) + 32];
	int n = snprintf(tmppath, sizeof(tmppath), "%s.%d.tmp", path, (int)getpid());
	if (n < 0 || (size_t)n >= sizeof(tmp.sun_path))
		return err_set(err, ENAMETOOLONG, path, "unix socket path too long for its temporary name");
	if (fill_addr(tmppath, &tmp, err) < 0)
		return -1;
	unlink(tmppath);

	int cleanup_close fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return err_set(err, errno, path, "socket");
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *)&tmp, sizeof(tmp));
	int e = errno;
	umask(old);
	if (rc < 0)
		return err_set(err, e, path, "bind");
	if (s->cfg.socket_mode != 0 && chmod(tmppath, s->cfg.socket_mode) < 0) {
		e = errno;
		unlink(tmppath);
		return err_set(err, e, path, "chmod");
	}
	if (s->cfg.socket_gid != (gid_t)-1 && chown(tmppath, (uid_t)-1, s->cfg.socket_gid) < 0) {
		e = errno;
		unlink(tmppath);
		return err_set(err, e, path, "chown to group %u", (unsigned)s->cfg.socket_gid);
	}
	if (listen(fd, 512) < 0 || rename(tmppath, path) < 0) {
		e = errno;
		unlink(tmppath);
		return err_set(err, e, path, "listen");
	}
	return steal_fd(fd);
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
