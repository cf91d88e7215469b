/* transport.c: connecting to a target: unix, tcp, vsock, Firecracker hybrid vsock, exec. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

extern char **environ;

static bool is_not_there_yet(int e)
{
	/* what a shim that is still starting looks like from outside */
	return e == ECONNREFUSED || e == ENOENT || e == ECONNRESET || e == ETIMEDOUT || e == EAGAIN ||
	       e == ENETUNREACH || e == EHOSTUNREACH || e == ENODEV;
}

/* connect() with a timeout; fd is left non-blocking. */
static int connect_timeout(int fd, const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	if (connect(fd, sa, len) == 0)
		return 0;
	if (errno != EINPROGRESS && errno != EAGAIN)
		return -1;
	struct pollfd pf = {.fd = fd, .events = POLLOUT};
	int r;
	do {
		r = poll(&pf, 1, timeout_ms);
	} while (r < 0 && errno == EINTR);
	if (r == 0) {
		errno = ETIMEDOUT;
		return -1;
	}
	int soerr = 0;
	socklen_t sl = sizeof(soerr);
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
	if (soerr != 0) {
		errno = soerr;
		return -1;
	}
	return 0;
}

static int open_unix(const char *path, int timeout_ms, int *out, bool *retry, struct sbx_error *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return sbx__fail(err, SBX_ERR_CONNECT, ENAMETOOLONG, path, "unix socket path too long");
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sbx__fail(err, SBX_ERR_CONNECT, errno, path, "socket");
	if (connect_timeout(fd, (struct sockaddr *)&sa, sizeof(sa), timeout_ms) < 0) {
		int e = errno;
		close(fd);
		*retry = is_not_there_yet(e);
		return sbx__fail(err, SBX_ERR_CONNECT, e, path, "connect");
	}
	*out = fd;
	return 0;
}

static int split_port(const char *s, char *host, size_t host_size, const char **port, struct sbx_error *err)
{
	const char *h = s, *colon;
	size_t hlen;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (close == NULL || close[1] != ':')
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, s, "bad address (want [V6ADDR]:PORT)");
		h = s + 1;
		hlen = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL)
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, s, "bad address (want HOST:PORT)");
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= host_size || colon[1] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, s, "bad address (want HOST:PORT)");
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	*port = colon + 1;
	return 0;
}

static int open_tcp(const char *hostport, int timeout_ms, int *out, bool *retry, struct sbx_error *err)
{
	char host[256];
	const char *port = NULL;
	if (split_port(hostport, host, sizeof(host), &port, err) < 0)
		return -1;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
		return sbx__fail(err, SBX_ERR_CONNECT, rc == EAI_SYSTEM ? errno : EHOSTUNREACH, hostport, "resolve: %s",
				 gai_strerror(rc));
	int e = ECONNREFUSED;
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		if (connect_timeout(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms) == 0) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			freeaddrinfo(res);
			*out = fd;
			return 0;
		}
		e = errno;
		close(fd);
	}
	freeaddrinfo(res);
	*retry = is_not_there_yet(e);
	return sbx__fail(err, SBX_ERR_CONNECT, e, hostport, "connect");
}

static int parse_u32(const char *s, long long min, uint32_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int open_vsock(const char *cidport, int timeout_ms, int *out, bool *retry, struct sbx_error *err)
{
	char cidbuf[32];
	const char *colon = strchr(cidport, ':');
	uint32_t cid, port;
	if (colon == NULL || (size_t)(colon - cidport) >= sizeof(cidbuf))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, cidport, "bad vsock address (want CID:PORT)");
	memcpy(cidbuf, cidport, (size_t)(colon - cidport));
	cidbuf[colon - cidport] = '\0';
	if (parse_u32(cidbuf, 0, &cid) < 0 || parse_u32(colon + 1, 0, &port) < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, cidport, "bad vsock address (want CID:PORT)");
	struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port};
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sbx__fail(err, SBX_ERR_CONNECT, errno, cidport, "vsock socket");
	if (connect_timeout(fd, (struct sockaddr *)&sa, sizeof(sa), timeout_ms) < 0) {
		int e = errno;
		close(fd);
		*retry = is_not_there_yet(e);
		return sbx__fail(err, SBX_ERR_CONNECT, e, cidport, "connect");
	}
	*out = fd;
	return 0;
}

/* Firecracker's hybrid vsock: connect to the host-side unix socket, ask for a guest
 * port with "CONNECT <port>\n", and read "OK <host port>\n". Firecracker closes the
 * connection when nothing listens on that port in the guest. */
static int open_fc(const char *spec, int timeout_ms, int *out, bool *retry, struct sbx_error *err)
{
	const char *colon = strrchr(spec, ':');
	uint32_t port;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	if (colon == NULL || colon == spec || (size_t)(colon - spec) >= sizeof(path) ||
	    parse_u32(colon + 1, 0, &port) < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, spec, "bad fc address (want fc:UDS_PATH:PORT)");
	memcpy(path, spec, (size_t)(colon - spec));
	path[colon - spec] = '\0';
	uint64_t deadline = sbx__now_ns() + (uint64_t)timeout_ms * 1000000u;
	int fd;
	if (open_unix(path, timeout_ms, &fd, retry, err) < 0)
		return -1;
	char line[64];
	int n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	/* one write: the muxer reads the request as one line */
	if (send(fd, line, (size_t)n, MSG_NOSIGNAL) != n) {
		int e = errno;
		close(fd);
		*retry = true;
		return sbx__fail(err, SBX_ERR_CONNECT, e, spec, "hybrid vsock: sending CONNECT");
	}
	size_t got = 0;
	for (;;) {
		uint64_t now = sbx__now_ns();
		int ms = now >= deadline ? 0 : (int)((deadline - now) / 1000000u) + 1;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (ms == 0 || poll(&pf, 1, ms) == 0) {
			close(fd);
			*retry = true;
			return sbx__fail(err, SBX_ERR_CONNECT, ETIMEDOUT, spec,
					 "hybrid vsock: no answer to CONNECT %u within %d ms", port, timeout_ms);
		}
		/* byte by byte: nothing after the newline belongs to us */
		ssize_t r = read(fd, line + got, 1);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0) {
			close(fd);
			*retry = true;
			return sbx__fail(err, SBX_ERR_CONNECT, ECONNREFUSED, spec,
					 "hybrid vsock: nothing listens on port %u in the guest", port);
		}
		if (line[got] == '\n')
			break;
		if (++got >= sizeof(line) - 1) {
			close(fd);
			return sbx__fail(err, SBX_ERR_CONNECT, EPROTO, spec, "hybrid vsock: answer line too long");
		}
	}
	line[got] = '\0';
	if (strncmp(line, "OK ", 3) != 0) {
		close(fd);
		*retry = true;
		return sbx__fail(err, SBX_ERR_CONNECT, ECONNREFUSED, spec, "hybrid vsock: muxer answered '%.40s'",
				 line);
	}
	*out = fd;
	return 0;
}

/* The caller's environment without its token (SBX_TOKEN, SBX_TOKEN_FILE): the command
 * an exec: target runs is not the shim the token is for (ssh, podman exec, a shell). A
 * NULL-terminated array of environ's own strings (free the array only); NULL: ENOMEM. */
static char **env_without_token(void)
{
	size_t n = 0;
	while (environ != NULL && environ[n] != NULL)
		n++;
	char **v = calloc(n + 1, sizeof(char *));
	if (v == NULL)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "SBX_TOKEN=", 10) != 0 && strncmp(environ[i], "SBX_TOKEN_FILE=", 15) != 0)
			v[k++] = environ[i];
	v[k] = NULL;
	return v;
}

/* exec:COMMAND: run it with /bin/sh -c over a socketpair used as its stdin and
 * stdout; its stderr stays ours, so its complaints reach the user. It gets the
 * caller's environment without the token (env_without_token), and the HELLO it is
 * sent carries a token only when the caller gave one (sbx_connect). */
static int open_exec(const char *cmd, int *out, pid_t *child, struct sbx_error *err)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return sbx__fail(err, SBX_ERR_CONNECT, errno, NULL, "socketpair");
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, sv[1], STDIN_FILENO);
	posix_spawn_file_actions_adddup2(&fa, sv[1], STDOUT_FILENO);
	posix_spawnattr_t attr;
	posix_spawnattr_init(&attr);
	sigset_t none, dfl;
	sigemptyset(&none);
	sigemptyset(&dfl);
	sigaddset(&dfl, SIGPIPE);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &dfl);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	char *argv[] = {(char *)"sh", (char *)"-c", (char *)(uintptr_t)cmd, NULL};
	char **envp = env_without_token();
	pid_t pid;
	int rc = envp == NULL ? ENOMEM : posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, envp);
	free(envp);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	close(sv[1]);
	if (rc != 0) {
		close(sv[0]);
		return sbx__fail(err, SBX_ERR_CONNECT, rc, cmd, "spawn /bin/sh");
	}
	*out = sv[0];
	*child = pid;
	return 0;
}

int sbx__transport_open(const char *target, int timeout_ms, int *fd, pid_t *child, bool *retry, struct sbx_error *err)
{
	int rc;
	*fd = -1;
	*child = 0;
	if (strncmp(target, "unix:", 5) == 0)
		rc = open_unix(target + 5, timeout_ms, fd, retry, err);
	else if (strncmp(target, "tcp:", 4) == 0)
		rc = open_tcp(target + 4, timeout_ms, fd, retry, err);
	else if (strncmp(target, "vsock:", 6) == 0)
		rc = open_vsock(target + 6, timeout_ms, fd, retry, err);
	else if (strncmp(target, "fc:", 3) == 0)
		rc = open_fc(target + 3, timeout_ms, fd, retry, err);
	else if (strncmp(target, "exec:", 5) == 0 && target[5] != '\0')
		rc = open_exec(target + 5, fd, child, err);
	else
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, target,
				 "unknown target (want unix:PATH, tcp:HOST:PORT, vsock:CID:PORT, fc:UDS:PORT or "
				 "exec:COMMAND)");
	if (rc == 0)
		fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
	return rc;
}

void sbx__transport_reap(pid_t child)
{
	if (child <= 0)
		return;
	/* Its stdin is closed: a shim exits at once. Give a slow command 3 s. */
	for (int i = 0; i < 600; i++) {
		pid_t r = waitpid(child, NULL, WNOHANG);
		if (r == child || (r < 0 && errno != EINTR))
			return;
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
	kill(child, SIGKILL);
	while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
		;
}
