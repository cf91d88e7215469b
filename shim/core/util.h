/* util.h: small helpers shared by the daemon's files: container_of, cleanup attributes, clocks, uuid4. */
#ifndef SHIM_UTIL_H
#define SHIM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static inline void cleanup_freep(void *p)
{
	free(*(void **)p);
}

static inline void cleanup_closep(int *fd)
{
	if (*fd >= 0)
		close(*fd);
}

#define cleanup_free __attribute__((cleanup(cleanup_freep)))
#define cleanup_close __attribute__((cleanup(cleanup_closep)))

/* Hand ownership on: return the value and disarm the cleanup of the variable. */
#define steal_ptr(p)                            \
	({                                      \
		__typeof__(p) steal_tmp_ = (p); \
		(p) = NULL;                     \
		steal_tmp_;                     \
	})
#define steal_fd(fd)                   \
	({                             \
		int steal_tmp_ = (fd); \
		(fd) = -1;             \
		steal_tmp_;            \
	})

/* A random (version 4) UUID, lowercase, NUL-terminated: 36 characters. */
void uuid4(char out[37]);

static inline uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The same in seconds. For the intervals the shim measures itself (a connection's idle
 * time, an unclaimed tunnel connection's age): libev's ev_now() is the wall clock, which
 * a snapshot's resume or an admin can move by days. */
static inline double mono_s(void)
{
	return (double)mono_ns() / 1e9;
}

#endif
