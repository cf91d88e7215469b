/* abi.c: the struct_size rule of every public struct (sbx.h's conventions, sdk/ABI.md).
 *
 * The library never reads or writes a caller's struct past the struct_size the caller
 * set: inputs are copied into a zeroed struct of the size this library knows (fields
 * the caller's older header lacked read as zero), outputs are filled in such a struct
 * and copied back up to the caller's size. */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

static size_t struct_size_of(const void *s)
{
	size_t n;
	memcpy(&n, s, sizeof(n));
	return n;
}

/* "sbx_stat" -> "SBX_STAT_INIT", for the message. */
static void init_name(const char *what, char *buf, size_t size)
{
	size_t i = 0;
	for (; what[i] != '\0' && i + sizeof("_INIT") < size; i++)
		buf[i] = (char)toupper((unsigned char)what[i]);
	memcpy(buf + i, "_INIT", sizeof("_INIT"));
}

static int check_size(size_t n, const char *what, struct sbx_error *err)
{
	char init[64];
	if (n < sizeof(size_t)) {
		init_name(what, init, sizeof(init));
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL,
				 "struct %s with struct_size %zu (start from %s, which sets it)", what, n, init);
	}
	return 0;
}

int sbx__struct_in(void *full, size_t full_size, const void *in, const char *what, struct sbx_error *err)
{
	size_t n = struct_size_of(in);
	if (check_size(n, what, err) < 0)
		return -1;
	if (n > full_size) {
		/* a newer header's struct: fine while the fields this library lacks are unset */
		const unsigned char *tail = (const unsigned char *)in + full_size;
		for (size_t i = 0; i < n - full_size; i++)
			if (tail[i] != 0)
				return sbx__fail(err, SBX_ERR_LOCAL, E2BIG, NULL,
						 "struct %s of %zu bytes sets a field beyond the %zu this "
						 "libsbx knows (byte %zu)",
						 what, n, full_size, full_size + i);
		n = full_size;
	}
	memset(full, 0, full_size);
	memcpy(full, in, n);
	memcpy(full, &full_size, sizeof(full_size));
	return 0;
}

int sbx__struct_out_check(const void *out, const char *what, struct sbx_error *err)
{
	return out == NULL ? 0 : check_size(struct_size_of(out), what, err);
}

void sbx__struct_out_get(void *full, size_t full_size, const void *out)
{
	size_t n = struct_size_of(out);
	memset(full, 0, full_size);
	memcpy(full, out, n < full_size ? n : full_size);
	memcpy(full, &full_size, sizeof(full_size));
}

void sbx__struct_out_put(void *out, const void *full, size_t full_size)
{
	size_t n = struct_size_of(out);
	size_t m = n < full_size ? n : full_size;
	memcpy((char *)out + sizeof(size_t), (const char *)full + sizeof(size_t), m - sizeof(size_t));
	if (n > full_size)
		memset((char *)out + full_size, 0, n - full_size);
}

int sbx__call_opts(const struct sbx_call_opts **opts, struct sbx_call_opts *full, struct sbx_error *err)
{
	if (*opts == NULL)
		return 0;
	if (sbx__struct_in(full, sizeof(*full), *opts, "sbx_call_opts", err) < 0)
		return -1;
	*opts = full;
	return 0;
}
