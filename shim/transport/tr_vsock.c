/* tr_vsock.c: AF_VSOCK listener for microVM guests (CID -1 listens on any CID). */
#include "listen.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

int tr_vsock_listen(const char *cidport, struct shim_err *err)
{
	const char *colon = strrchr(cidport, ':');
	if (colon == NULL)
		return err_set(err, EINVAL, cidport, "bad vsock address (want CID:PORT, CID -1 for any)");
	char *end;
	long long cid = strtoll(cidport, &end, 10);
	if (end != colon || cid < -1 || cid > UINT32_MAX)
		return err_set(err, EINVAL, cidport, "bad vsock CID");
	long long port = strtoll(colon + 1, &end, 10);
	if (*end != '\0' || colon[1] == '\0' || port < 0 || port > UINT32_MAX)
		return err_set(err, EINVAL, cidport, "bad vsock port");
	struct sockaddr_vm sa = {
		.svm_family = AF_VSOCK,
		.svm_cid = cid == -1 ? VMADDR_CID_ANY : (unsigned)cid,
		.svm_port = (unsigned)port,
	};
	int cleanup_close fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return err_set(err, errno, cidport, "vsock socket (is the vsock module loaded?)");
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return err_set(err, errno, cidport, "bind");
	if (listen(fd, 512) < 0)
		return err_set(err, errno, cidport, "listen");
	return steal_fd(fd);
}

void tr_vsock_describe_peer(int fd, char *peer, size_t peer_size)
{
	struct sockaddr_vm sa;
	socklen_t len = sizeof(sa);
	if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0)
		snprintf(peer, peer_size, "vsock %u:%u", sa.svm_cid, sa.svm_port);
	else
		snprintf(peer, peer_size, "vsock ?");
}
