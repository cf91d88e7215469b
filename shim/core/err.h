/* err.h: the caller-owned error every fallible daemon function fills: errno, message, path. */
#ifndef SHIM_ERR_H
#define SHIM_ERR_H

#include <stddef.h>

struct shim_err {
	int code;        /* Linux errno */
	char msg[256];   /* what failed, e.g. "open" or "frame of 9 bytes exceeds the limit" */
	char path[1024]; /* path or argument concerned; "" if none */
	size_t path_len; /* paths may hold any bytes, NUL included */
};

/* Fill err (if not NULL) and return -1, so that error paths read
 * `return err_set(err, errno, path, "open");`. path may be NULL. */
int err_set(struct shim_err *err, int code, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Same with a path given as bytes and a length. */
int err_setn(struct shim_err *err, int code, const void *path, size_t path_len, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

#endif
