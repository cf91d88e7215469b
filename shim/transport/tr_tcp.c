/* tr_tcp.c: TCP listener (loopback unless told otherwise); the token check lives in the handshake. */
#include "listen.h"
#include "util.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* "HOST:PORT" or "[V6]:PORT" -> host, port. */
static int split_hostport(const char *hp, char *host, size_t host_size, char *port, size_t port_size,
			  struct shim_err *err)
{
	const char *colon;
	const char *h = hp;
	size_t hlen;
	if (hp[0] == '[') {
		const char *close = strchr(hp, ']');
		if (close == NULL || close[1] != ':')
			return err_set(err, EINVAL, hp, "bad address (want [V6ADDR]:PORT)");
		h = hp + 1;
		hlen = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(hp, ':');
		if (colon == NULL)
			return err_set(err, EINVAL, hp, "bad address (want HOST:PORT)");
		hlen = (size_t)(colon - hp);
	}
	if (hlen == 0 || hlen >= host_size || strlen(colon + 1) == 0 || strlen(colon + 1) >= port_size)
		return err_set(err, EINVAL, hp, "bad address (want HOST:PORT)");
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	strcpy(port, colon + 1);
	char *end;
	long p = strtol(port, &end, 10);
	if (*end != '\0' || p < 0 || p > 65535)
		return err_set(err, EINVAL, hp, "bad port");
	return 0;
}

static void format_addr(const struct sockaddr *sa, socklen_t len, char *out, size_t size)
{
	char host[NI_MAXHOST], serv[NI_MAXSERV];
	if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
		snprintf(out, size, "?");
		return;
	}
	if (sa->sa_family == AF_INET6)
		snprintf(out, size, "[%s]:%s", host, serv);
	else
		snprintf(out, size, "%s:%s", host, serv);
}

int tr_tcp_listen(const char *hostport, char *bound, size_t bound_size, struct shim_err *err)
{
	char host[256], port[16];
	if (split_hostport(hostport, host, sizeof(host), port, sizeof(port), err) < 0)
		return -1;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
		return err_set(err, rc == EAI_SYSTEM ? errno : EADDRNOTAVAIL, hostport, "resolve: %s",
			       gai_strerror(rc));
	int fd = -1, e = 0;
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 512) == 0)
			break;
		e = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return err_set(err, e, hostport, "bind");
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &len);
	format_addr((struct sockaddr *)&ss, len, bound, bound_size);
	return fd;
}

void tr_tcp_describe_peer(int fd, char *peer, size_t peer_size)
{
	/* frames are small and latency matters more than packet count */
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char addr[128];
	if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
		format_addr((struct sockaddr *)&ss, len, addr, sizeof(addr));
	else
		snprintf(addr, sizeof(addr), "?");
	snprintf(peer, peer_size, "tcp %s", addr);
}
