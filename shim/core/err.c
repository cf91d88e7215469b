/* err.c: filling the caller-owned error struct. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int err_vset(struct shim_err *err, int code, const void *path, size_t path_len, const char *fmt, va_list ap)
	__attribute__((format(printf, 5, 0)));
static int err_vset(struct shim_err *err, int code, const void *path, size_t path_len, const char *fmt, va_list ap)
{
	if (err == NULL)
		return -1;
	err->code = code;
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	if (path_len >= sizeof(err->path))
		path_len = sizeof(err->path) - 1;
	if (path != NULL)
		memcpy(err->path, path, path_len);
	else
		path_len = 0;
	err->path[path_len] = '\0';
	err->path_len = path_len;
	return -1;
}

int err_set(struct shim_err *err, int code, const char *path, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	err_vset(err, code, path, path ? strlen(path) : 0, fmt, ap);
	va_end(ap);
	return -1;
}

int err_setn(struct shim_err *err, int code, const void *path, size_t path_len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	err_vset(err, code, path, path_len, fmt, ap);
	va_end(ap);
	return -1;
}
