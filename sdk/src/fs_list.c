/* fs_list.c: directory listings and watches in the SDK. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The shim's DATA on a list or watch stream is one byte stream of protobuf messages,
 * each preceded by its length as a varint; a message may be split across frames.
 * We keep at most one unfinished message plus one frame, and refuse messages larger
 * than DELIM_MAX (a DirEntry is below 9 KiB; a WatchEvent holds one path). */
#define DELIM_MAX (1u << 20)

struct delim {
	uint8_t *buf;
	size_t len, pos, cap;
};

static int delim_feed(struct delim *d, const uint8_t *p, size_t n)
{
	if (n == 0)
		return 0;
	if (d->pos > 0) {
		memmove(d->buf, d->buf + d->pos, d->len - d->pos);
		d->len -= d->pos;
		d->pos = 0;
	}
	if (d->len + n > d->cap) {
		size_t cap = d->cap ? d->cap : 65536;
		while (cap < d->len + n)
			cap *= 2;
		uint8_t *b = realloc(d->buf, cap);
		if (b == NULL)
			return -1;
		d->buf = b;
		d->cap = cap;
	}
	memcpy(d->buf + d->len, p, n);
	d->len += n;
	return 0;
}

/* The next whole message: 1 (msg, len set), 0 (need more bytes), -1 (malformed). */
static int delim_next(struct delim *d, const uint8_t **msg, size_t *len)
{
	uint64_t v = 0;
	size_t i = d->pos;
	for (unsigned shift = 0;; shift += 7) {
		if (i >= d->len)
			return 0;
		if (shift > 28)
			return -1; /* longer than DELIM_MAX can need */
		uint8_t b = d->buf[i++];
		v |= (uint64_t)(b & 0x7f) << shift;
		if ((b & 0x80) == 0)
			break;
	}
	if (v > DELIM_MAX)
		return -1;
	if (d->len - i < v)
		return 0;
	*msg = d->buf + i;
	*len = (size_t)v;
	d->pos = i + (size_t)v;
	return 1;
}

/* Handle one message: 0 to go on, 1 to stop (the caller's callback asked), -1 with err. */
typedef int (*msg_fn)(void *ctx, const uint8_t *msg, size_t len, struct sbx_error *err);

/* A NUL-terminated copy of bytes in a buffer that grows as needed. */
static const char *cstr(char **buf, size_t *cap, const uint8_t *p, size_t len)
{
	if (len + 1 > *cap) {
		size_t n = *cap ? *cap : 256;
		while (n < len + 1)
			n *= 2;
		char *b = realloc(*buf, n);
		if (b == NULL)
			return NULL;
		*buf = b;
		*cap = n;
	}
	if (len > 0)
		memcpy(*buf, p, len);
	(*buf)[len] = '\0';
	return *buf;
}

/* Read the stream's DATA until END/ERROR, handing each message to fn and returning
 * credit as the bytes are consumed. Returns 0 at END (*stopped false) or when fn
 * asked to stop (*stopped true: the call is still open), -1 with err. */
static int read_messages(struct call *k, uint64_t deadline, struct sbx_cancel *tok, msg_fn fn, void *ctx, bool *stopped,
			 struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	struct delim d = {0};
	uint32_t threshold = c->my_window / 4 ? c->my_window / 4 : 1;
	uint32_t ungranted = 0;
	bool fin = false;
	int rc = 0;
	*stopped = false;
	for (;;) {
		if (sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, tok, err) < 0) {
			rc = -1;
			break;
		}
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL)
			break; /* END (or an ERROR: checked by the caller) */
		if (it->type != FRAME_DATA) {
			sbx__rx_free(it); /* EVENTs: none defined for these streams; ignore */
			continue;
		}
		if (fin && it->len > 0) {
			sbx__rx_free(it);
			rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "DATA after FIN from the shim");
			break;
		}
		if (it->flags & FRAME_FLAG_FIN)
			fin = true;
		else
			ungranted += it->len;
		if (delim_feed(&d, it->data, it->len) < 0) {
			sbx__rx_free(it);
			rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
			break;
		}
		sbx__rx_free(it);
		const uint8_t *msg;
		size_t len;
		int r;
		while ((r = delim_next(&d, &msg, &len)) == 1) {
			int s = fn(ctx, msg, len, err);
			if (s != 0) {
				rc = s < 0 ? -1 : 0;
				*stopped = s > 0;
				goto out;
			}
		}
		if (r < 0) {
			rc = sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "malformed message stream from the shim");
			break;
		}
		if (ungranted >= threshold) {
			if (sbx__call_grant(k, ungranted, deadline, err) < 0) {
				rc = -1;
				break;
			}
			ungranted = 0;
		}
	}
	if (rc == 0 && d.pos < d.len)
		rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim's stream ended inside a message");
out:
	free(d.buf);
	return rc;
}

/* ---- list ---- */

struct list_ctx {
	sbx_dirent_fn cb;
	void *ud;
	uint64_t count;
	int cb_code; /* what the callback returned to stop */
	char *name;
	size_t name_cap;
	struct sbx_stat st;
	char link_target[4097]; /* st's (a symlink's target is below PATH_MAX) */
};

static int list_msg(void *ctx, const uint8_t *msg, size_t len, struct sbx_error *err)
{
	struct list_ctx *x = ctx;
	Shim__V1__DirEntry *e = shim__v1__dir_entry__unpack(NULL, len, msg);
	if (e == NULL)
		return sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "undecodable DirEntry from the shim");
	const char *name = cstr(&x->name, &x->name_cap, e->name.data, e->name.len);
	if (name == NULL) {
		shim__v1__dir_entry__free_unpacked(e, NULL);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	x->st = (struct sbx_stat){.struct_size = sizeof(x->st),
				  .link_target = x->link_target,
				  .link_target_size = sizeof(x->link_target)};
	sbx__stat_from(&x->st, e->stat);
	struct sbx_dirent de = {.name = name, .name_len = e->name.len, .stat = &x->st};
	shim__v1__dir_entry__free_unpacked(e, NULL);
	x->count++;
	int r = x->cb(x->ud, &de);
	if (r != 0) {
		x->cb_code = r;
		return 1;
	}
	return 0;
}

SBX_API int sbx_list(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, unsigned depth,
		     int flags, sbx_dirent_fn cb, void *ud, uint64_t *count, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (cb == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "sbx_list needs a callback");
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	Shim__V1__ListRequest lr = SHIM__V1__LIST_REQUEST__INIT;
	lr.path.data = (uint8_t *)(uintptr_t)(path ? path : "");
	lr.path.len = path ? strlen(path) : 0;
	lr.has_depth = 1;
	lr.depth = depth;
	if (flags & SBX_LIST_FOLLOW)
		lr.has_follow_symlinks = lr.follow_symlinks = 1;
	if (flags & SBX_LIST_HIDDEN)
		lr.has_hidden = lr.hidden = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_LIST;
	req.list = &lr;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0)
		return -1;
	struct call *k = sbx__start_request(c, &req, deadline, err);
	if (k == NULL)
		return -1;
	struct list_ctx *x = calloc(1, sizeof(*x));
	if (x == NULL) {
		sbx__call_free(k);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	x->cb = cb;
	x->ud = ud;
	bool stopped;
	int rc = read_messages(k, deadline, tok, list_msg, x, &stopped, err);
	if (rc == 0 && stopped) {
		/* the callback said stop: sbx__call_free() sends CANCEL */
		rc = sbx__fail(err, SBX_ERR_LOCAL, x->cb_code, path, "listing stopped by the callback");
	} else if (rc == 0) {
		Shim__V1__Result *r = sbx__wait_result(k, deadline, tok, err);
		if (r == NULL) {
			rc = -1;
		} else {
			if (r->kind_case != SHIM__V1__RESULT__KIND_LIST)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL,
					       "the shim answered with another kind of result");
			else if (r->list->entries != x->count)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL,
					       "the shim counted %llu entries, %llu arrived",
					       (unsigned long long)r->list->entries, (unsigned long long)x->count);
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	if (count != NULL)
		*count = x->count;
	sbx__call_free(k);
	free(x->name);
	free(x);
	return rc;
}

/* ---- watch ---- */

SBX_API const char *sbx_watch_type_name(int type)
{
	static const char *const names[] = {
		[SBX_WATCH_CREATE] = "create",     [SBX_WATCH_MODIFY] = "modify",
		[SBX_WATCH_DELETE] = "delete",     [SBX_WATCH_MOVED_FROM] = "moved_from",
		[SBX_WATCH_MOVED_TO] = "moved_to", [SBX_WATCH_ATTRIB] = "attrib",
		[SBX_WATCH_OVERFLOW] = "overflow", [SBX_WATCH_DELETE_SELF] = "delete_self",
	};
	if (type <= 0 || type > SBX_WATCH_DELETE_SELF)
		return "unknown";
	return names[type];
}

struct watch_ctx {
	sbx_watch_fn cb;
	void *ud;
	char *path;
	size_t path_cap;
};

static int watch_msg(void *ctx, const uint8_t *msg, size_t len, struct sbx_error *err)
{
	struct watch_ctx *x = ctx;
	Shim__V1__WatchEvent *e = shim__v1__watch_event__unpack(NULL, len, msg);
	if (e == NULL)
		return sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "undecodable WatchEvent from the shim");
	struct sbx_watch_event ev = {.type = (int)e->type, .is_dir = e->has_is_dir && e->is_dir, .cookie = e->cookie};
	if (e->has_path) {
		ev.path = cstr(&x->path, &x->path_cap, e->path.data, e->path.len);
		if (ev.path == NULL) {
			shim__v1__watch_event__free_unpacked(e, NULL);
			return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		}
		ev.path_len = e->path.len;
	}
	shim__v1__watch_event__free_unpacked(e, NULL);
	return x->cb(x->ud, &ev) != 0 ? 1 : 0;
}

SBX_API int sbx_watch(struct sbx_client *c, const struct sbx_call_opts *opts, const char *path, int flags,
		      sbx_watch_fn cb, void *ud, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (cb == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, path, "sbx_watch needs a callback");
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	Shim__V1__WatchRequest wr = SHIM__V1__WATCH_REQUEST__INIT;
	wr.path.data = (uint8_t *)(uintptr_t)(path ? path : "");
	wr.path.len = path ? strlen(path) : 0;
	if (flags & SBX_WATCH_RECURSIVE)
		wr.has_recursive = wr.recursive = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WATCH;
	req.watch = &wr;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0)
		return -1;
	struct call *k = sbx__start_request(c, &req, deadline, err);
	if (k == NULL)
		return -1;
	struct watch_ctx x = {.cb = cb, .ud = ud};
	bool stopped;
	int rc = read_messages(k, deadline, tok, watch_msg, &x, &stopped, err);
	if (rc == 0 && !stopped) {
		/* the watched path went away: the shim ended the stream */
		Shim__V1__Result *r = sbx__wait_result(k, deadline, tok, err);
		if (r == NULL)
			rc = -1;
		else
			shim__v1__result__free_unpacked(r, NULL);
	}
	sbx__call_free(k); /* sends CANCEL if the stream is still open */
	free(x.path);
	return rc;
}
