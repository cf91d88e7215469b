/* netaddr.c: IP address text helpers shared by the shim's and libsbx's tunnels. */
#include "netaddr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

int netaddr_unbracket(const char *host, char *out, size_t size)
{
	size_t hl = strlen(host);
	if (hl >= size)
		return -1;
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memcpy(out, host + 1, hl - 2);
		out[hl - 2] = '\0';
	} else {
		memcpy(out, host, hl + 1);
	}
	return 0;
}

void netaddr_format(const struct sockaddr_storage *ss, char *out, size_t size)
{
	char h[INET6_ADDRSTRLEN];
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
		snprintf(out, size, "%s:%u", h, ntohs(a->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
		snprintf(out, size, "[%s]:%u", h, ntohs(a->sin6_port));
	} else {
		snprintf(out, size, "?");
	}
}
