/* pipes.h: the pipes that splice() moves DATA through, shared by the shim and libsbx. */
#ifndef SHIM_PIPES_H
#define SHIM_PIPES_H

#include <stddef.h>

/* A non-blocking, close-on-exec pipe of want bytes if it may be (else 1 MiB, else the
 * default size): its capacity, or 0 (errno; fds -1) when no pipe could be made. */
size_t pipe_open(int fds[2], size_t want);

#endif
