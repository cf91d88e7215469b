/* fs_io.c: streamed file reads and writes in the SDK. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Extra credit granted to the shim for a read, on top of our initial window: with
 * 4 MiB in flight a read is bound by bandwidth, not by round trips. */
#define READ_EXTRA_WINDOW (4u << 20)
/* A write of up to this many bytes from a buffer goes in one DATA frame with its FIN,
 * in the same write as the REQUEST (when it fits the initial window). */
#define SMALL_WRITE_MAX (64u << 10)

static ProtobufCBinaryData pathb(const char *path)
{
	ProtobufCBinaryData b = {path ? strlen(path) : 0, (uint8_t *)(uintptr_t)(path ? path : "")};
	return b;
}

SBX_API int sbx_read_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t offset,
			  uint64_t length, sbx_sink_fn sink, void *ud, uint64_t *bytes, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	return sbx_read_file_ex(c, opts, path, offset, length, 0, sink, ud, bytes, err);
}

SBX_API int sbx_read_file_ex(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, uint64_t offset,
			     uint64_t length, int flags, sbx_sink_fn sink, void *ud, uint64_t *bytes,
			     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sink == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "no sink given");
	if ((flags & ~SBX_READ_ALLOW_SPECIAL) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "unknown read flags %#x", (unsigned)flags);
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	Shim__V1__ReadRequest rr = SHIM__V1__READ_REQUEST__INIT;
	rr.path = pathb(path);
	if (offset != 0) {
		rr.has_offset = 1;
		rr.offset = offset;
	}
	if (length != SBX_TO_END) {
		rr.has_length = 1;
		rr.length = length;
	}
	if (flags & SBX_READ_ALLOW_SPECIAL)
		rr.has_allow_special = rr.allow_special = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READ;
	req.read = &rr;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0)
		return -1;
	struct call *k = sbx__start_request(c, &req, deadline, err);
	if (k == NULL)
		return -1;
	struct sbx__download d = {.sink = sink, .ud = ud};
	int rc = sbx__call_grant(k, READ_EXTRA_WINDOW, deadline, err);
	while (rc == 0) {
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL) {
			if (sbx__call_done(k))
				break;
			rc = sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, tok, err);
			continue;
		}
		if (it->type == FRAME_DATA)
			rc = sbx__download_data(k, &d, it, deadline, path, err);
		sbx__rx_free(it);
		if (rc == 0 && tok != NULL && sbx_cancel_fired(tok))
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, path, "cancelled");
	}
	if (rc == 0) {
		/* done: END (after our FIN) or ERROR, also after bytes were delivered */
		Shim__V1__Result *r = sbx__wait_result(k, deadline, tok, err);
		if (r == NULL) {
			rc = -1;
		} else {
			if (r->kind_case != SHIM__V1__RESULT__KIND_READ || !d.fin || r->read->bytes != d.got)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, path,
					       "read ended with %llu bytes delivered of %llu announced",
					       (unsigned long long)d.got,
					       (unsigned long long)(r->kind_case == SHIM__V1__RESULT__KIND_READ ?
									    r->read->bytes :
									    0));
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	sbx__call_free(k);
	if (bytes != NULL)
		*bytes = d.got;
	return rc;
}

struct alloc_sink {
	uint8_t *buf;
	size_t len, cap, max;
};

static int alloc_sink_fn(void *ud, const void *buf, size_t len)
{
	struct alloc_sink *s = ud;
	if (len > s->max - s->len)
		return EFBIG;
	if (s->len + len + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 64u << 10;
		while (cap < s->len + len + 1)
			cap *= 2;
		uint8_t *n = realloc(s->buf, cap);
		if (n == NULL)
			return ENOMEM;
		s->buf = n;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, buf, len);
	s->len += len;
	return 0;
}

SBX_API int sbx_read_file_alloc(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, size_t max,
				void **data, size_t *len, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (data == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "no place for the data");
	struct alloc_sink s = {.max = max};
	/* one byte more than allowed tells a file of exactly max bytes from a bigger one */
	uint64_t want = max < SIZE_MAX ? (uint64_t)max + 1 : SBX_TO_END;
	if (sbx_read_file(c, opts, path, 0, want, alloc_sink_fn, &s, NULL, err) < 0) {
		if (err != NULL && err->code == EFBIG && err->kind == SBX_ERR_LOCAL)
			sbx__fail(err, SBX_ERR_LOCAL, EFBIG, path, "file larger than %zu bytes", max);
		free(s.buf);
		return -1;
	}
	if (s.buf == NULL) {
		s.buf = malloc(1);
		if (s.buf == NULL)
			return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, path, "out of memory");
	}
	s.buf[s.len] = '\0'; /* a convenience for text; not counted in *len */
	*data = s.buf;
	if (len != NULL)
		*len = s.len;
	return 0;
}

/* The write call: bytes from source, or straight from data (len bytes) when source
 * is NULL, without a copy. */
static int write_stream(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags, int mode,
			sbx_source_fn source, void *ud, const uint8_t *data, size_t len, struct sbx_stat *out,
			struct sbx_error *err)
{
	if ((flags & ~(SBX_WRITE_APPEND | SBX_WRITE_EXCLUSIVE | SBX_WRITE_PARENTS | SBX_WRITE_NO_ATOMIC |
		       SBX_WRITE_ALLOW_SPECIAL)) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "unknown write flags %#x", (unsigned)flags);
	if (mode != SBX_MODE_KEEP && (mode < 0 || mode > 07777))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "bad mode %#o", (unsigned)mode);
	if (sbx__struct_out_check(out, "sbx_stat", err) < 0)
		return -1;
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	Shim__V1__WriteRequest wr = SHIM__V1__WRITE_REQUEST__INIT;
	wr.path = pathb(path);
	if (mode != SBX_MODE_KEEP) {
		wr.has_mode = 1;
		wr.mode = (uint32_t)mode;
	}
	wr.has_append = wr.append = (flags & SBX_WRITE_APPEND) != 0;
	wr.has_exclusive = wr.exclusive = (flags & SBX_WRITE_EXCLUSIVE) != 0;
	wr.has_parents = wr.parents = (flags & SBX_WRITE_PARENTS) != 0;
	wr.has_no_atomic = wr.no_atomic = (flags & SBX_WRITE_NO_ATOMIC) != 0;
	if (flags & SBX_WRITE_ALLOW_SPECIAL)
		wr.has_allow_special = wr.allow_special = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
	req.write = &wr;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0)
		return -1;

	size_t chunk_max = c->max_frame < FRAME_DATA_CHUNK ? c->max_frame : FRAME_DATA_CHUNK;
	uint8_t *buf = NULL;
	if (source != NULL && (buf = malloc(chunk_max)) == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, path, "out of memory");
	/* a small buffer goes out whole with the REQUEST: the shim gets both in one read */
	bool whole = source == NULL && len <= SMALL_WRITE_MAX && len <= chunk_max && (int64_t)len <= c->peer_window;
	if (whole && tok != NULL && sbx_cancel_fired(tok))
		return sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, path, "cancelled");
	struct call *k = whole ? sbx__start_request_data(c, &req, FRAME_FLAG_FIN, data, len, deadline, err) :
				 sbx__start_request(c, &req, deadline, err);
	if (k == NULL) {
		free(buf);
		return -1;
	}
	int rc = 0;
	size_t sent = 0;
	while (!whole) {
		/* the shim may have refused already (EEXIST, ENOSPC...): stop sending */
		if (sbx__call_done(k))
			break;
		if (sbx__call_wait_for(k, SBX__WAIT_CREDIT | SBX__WAIT_END_FAILS, deadline, tok, err) < 0) {
			rc = -1;
			break;
		}
		int64_t credit = sbx__call_credit(k);
		size_t n = (uint64_t)credit < chunk_max ? (size_t)credit : chunk_max;
		const uint8_t *p;
		bool fin;
		if (source == NULL) {
			if (n > len - sent)
				n = len - sent;
			p = data != NULL ? data + sent : NULL;
			fin = sent + n == len; /* the last bytes carry the FIN */
		} else {
			long got = source(ud, buf, n);
			if (got < 0 || (size_t)got > n) {
				int e = got < 0 ? errno : EINVAL;
				if (e == 0)
					e = EIO;
				/* CANCEL goes out from sbx__call_free(): the shim drops the temp file */
				rc = sbx__fail(err, SBX_ERR_LOCAL, e, path, "the source failed: %s", sbx_strerror(e));
				break;
			}
			n = (size_t)got;
			p = buf;
			fin = got == 0;
		}
		if (tok != NULL && sbx_cancel_fired(tok)) {
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, path, "cancelled");
			break;
		}
		pthread_mutex_lock(&c->mu);
		k->send_credit -= (int64_t)n;
		pthread_mutex_unlock(&c->mu);
		if (sbx__send(c, k->id, FRAME_DATA, fin ? FRAME_FLAG_FIN : 0, p, n, deadline, err) < 0) {
			rc = -1;
			break;
		}
		sent += n;
		if (fin)
			break;
	}
	free(buf);
	if (rc == 0) {
		Shim__V1__Result *r = sbx__wait_result(k, deadline, tok, err);
		if (r == NULL) {
			rc = -1;
		} else {
			if (r->kind_case != SHIM__V1__RESULT__KIND_WRITE)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, path,
					       "the shim answered with another kind of result");
			else if (out != NULL)
				sbx__stat_from(out, r->write->stat);
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	sbx__call_free(k);
	return rc;
}

SBX_API int sbx_write_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
			   int mode, sbx_source_fn source, void *ud, struct sbx_stat *out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (source == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "no source given");
	return write_stream(c, opts, path, flags, mode, source, ud, NULL, 0, out, err);
}

SBX_API int sbx_write_file_buf(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
			       int mode, const void *data, size_t len, struct sbx_stat *out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (data == NULL && len > 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "no data given");
	return write_stream(c, opts, path, flags, mode, NULL, NULL, data, len, out, err);
}
