/* netaddr.h: IP address text helpers shared by the shim's and libsbx's tunnels. */
#ifndef SHIM_NETADDR_H
#define SHIM_NETADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* Copy host into out (size bytes) without the brackets of an IPv6 literal written "[::1]".
 * Returns 0, or -1 (out untouched) when host does not fit. */
int netaddr_unbracket(const char *host, char *out, size_t size);
/* "127.0.0.1:80", "[::1]:80" or "?" (another family) into out, always terminated. */
void netaddr_format(const struct sockaddr_storage *ss, char *out, size_t size);

#endif
