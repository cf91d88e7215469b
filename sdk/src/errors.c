/* errors.c: error structs, the fixed Linux errno table, the library's version. */
#include "internal.h"
#include "errnames.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

SBX_API const char *sbx_version(void)
{
	return SBX_VERSION;
}

SBX_API unsigned sbx_version_num(void)
{
	return SBX_VERSION_NUM;
}

SBX_API const char *sbx_errno_name(int code)
{
	return errname_name(code);
}

SBX_API int sbx_errno_from_name(const char *name)
{
	return errname_num(name);
}

SBX_API const char *sbx_strerror(int code)
{
	const char *t = errname_text(code);
	return t != NULL ? t : "Unknown error";
}

SBX_API char *sbx_error_format(const struct sbx_error *err, char *buf, size_t size)
{
	if (size == 0)
		return buf;
	/* sbx_eval's failure: code is the snippet's exit status, not an errno */
	if (err->kind == SBX_ERR_EXIT) {
		snprintf(buf, size, "exit status %d: %s", err->code, err->message);
		return buf;
	}
	const char *name = sbx_errno_name(err->code);
	char num[24];
	if (name == NULL) {
		snprintf(num, sizeof(num), "errno %d", err->code);
		name = num;
	}
	/* With a path: the errno text says why and the message what was being done
	 * ("ENOENT: /nope: No such file or directory (open)"). Without: the message is
	 * the more precise of the two ("EAGAIN: too many connections (limit 5)"). */
	const char *text = sbx_strerror(err->code);
	const char *msg = err->message;
	if (err->path[0] != '\0') {
		if (msg[0] != '\0' && strcmp(msg, text) != 0)
			snprintf(buf, size, "%s: %s: %s (%s)", name, err->path, text, msg);
		else
			snprintf(buf, size, "%s: %s: %s", name, err->path, text);
	} else {
		snprintf(buf, size, "%s: %s", name, msg[0] != '\0' ? msg : text);
	}
	return buf;
}

int sbx__fail(struct sbx_error *err, int kind, int code, const char *path, const char *fmt, ...)
{
	if (err == NULL)
		return -1;
	err->kind = kind;
	err->code = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	snprintf(err->path, sizeof(err->path), "%s", path != NULL ? path : "");
	return -1;
}

void sbx__copy_error(struct sbx_error *dst, const struct sbx_error *src)
{
	if (dst != NULL && dst != src)
		*dst = *src;
}

void sbx__decode_error(const uint8_t *p, size_t len, int kind, struct sbx_error *err)
{
	Shim__V1__Error *m = shim__v1__error__unpack(NULL, len, p);
	if (m == NULL) {
		sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "undecodable ERROR from the shim");
		return;
	}
	err->kind = kind;
	err->code = m->errno_num;
	/* trust the number, not the name: the name is for people reading traces */
	snprintf(err->message, sizeof(err->message), "%s", m->message ? m->message : "");
	size_t n = 0;
	if (m->has_path) {
		n = m->path.len < sizeof(err->path) - 1 ? m->path.len : sizeof(err->path) - 1;
		memcpy(err->path, m->path.data, n);
	}
	err->path[n] = '\0';
	shim__v1__error__free_unpacked(m, NULL);
}
