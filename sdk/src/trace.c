/* trace.c: decoding a captured byte stream into one line per frame (`sbx decode`). */
#include "internal.h"
#include "describe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sbx_decoder {
	sbx_trace_fn cb;
	void *ud;
	uint8_t *buf;
	size_t len, cap;
	uint64_t offset; /* of buf[0] in the whole stream */
	bool broken;
};

SBX_API struct sbx_decoder *sbx_decoder_new(sbx_trace_fn cb, void *ud)
{
	struct sbx_decoder *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return NULL;
	d->cb = cb;
	d->ud = ud;
	return d;
}

SBX_API int sbx_decoder_feed(struct sbx_decoder *d, const void *buf, size_t len)
{
	if (d->broken)
		return -1;
	if (d->len + len > d->cap) {
		size_t cap = d->cap ? d->cap : 4096;
		while (cap < d->len + len)
			cap *= 2;
		uint8_t *n = realloc(d->buf, cap);
		if (n == NULL)
			return -1;
		d->buf = n;
		d->cap = cap;
	}
	memcpy(d->buf + d->len, buf, len);
	d->len += len;
	size_t off = 0;
	char line[1400];
	for (;;) {
		struct frame_hdr h;
		enum frame_status fs = frame_check(d->buf + off, d->len - off, FRAME_ABS_MAX, &h);
		if (fs == FRAME_NEED_MORE)
			break;
		if (fs != FRAME_OK) {
			snprintf(line, sizeof(line), "@%llu: not a frame: %s (length %u, type %u, reserved %u)",
				 (unsigned long long)(d->offset + off),
				 fs == FRAME_TOO_BIG ? "length over 16 MiB" : "bad header", h.len, h.type, h.reserved);
			d->cb(d->ud, line);
			d->broken = true;
			return -1;
		}
		int n = snprintf(line, sizeof(line), "@%llu: ", (unsigned long long)(d->offset + off));
		frame_describe(&h, d->buf + off + FRAME_HDR_LEN, line + n, sizeof(line) - (size_t)n);
		d->cb(d->ud, line);
		off += FRAME_HDR_LEN + h.len;
	}
	memmove(d->buf, d->buf + off, d->len - off);
	d->len -= off;
	d->offset += off;
	return 0;
}

SBX_API void sbx_decoder_free(struct sbx_decoder *d)
{
	if (d == NULL)
		return;
	if (d->len > 0 && !d->broken) {
		char line[160];
		snprintf(line, sizeof(line), "@%llu: %zu trailing bytes: an unfinished frame",
			 (unsigned long long)d->offset, d->len);
		d->cb(d->ud, line);
	}
	free(d->buf);
	free(d);
}
