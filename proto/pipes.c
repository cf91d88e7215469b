/* pipes.c: see pipes.h. */
#include "pipes.h"

#include <fcntl.h>
#include <unistd.h>

size_t pipe_open(int fds[2], size_t want)
{
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		fds[0] = fds[1] = -1;
		return 0;
	}
	int sz = fcntl(fds[1], F_SETPIPE_SZ, want < (1u << 30) ? (int)want : 1 << 30);
	if (sz < 0) /* EPERM: over fs.pipe-max-size (1 MiB by default) without CAP_SYS_RESOURCE */
		sz = fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
	if (sz < 0)
		sz = fcntl(fds[1], F_GETPIPE_SZ);
	return sz > 0 ? (size_t)sz : 4096;
}
