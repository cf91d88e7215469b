/* dispatch.c: the handshake, the table of request kinds, blocking operations run on a worker, and
 * Error/Result encoding. */
#include "dispatch.h"
#include "conn.h"
#include "errnames.h"
#include "frame.h"
#include "fsctx.h"
#include "listen.h"
#include "log.h"
#include "ops.h"
#include "pbcheck.h"
#include "server.h"
#include "shim.pb-c.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct disp_entry {
	Shim__V1__Request__KindCase kind;
	const char *name;
	op_start_fn start;       /* operations that stream or keep state on the loop */
	op_blocking_fn blocking; /* one-shot operations run whole on a worker */
};

/* One row per request kind; generic checks (limits, decoding) happen once, before. */
static const struct disp_entry table[] = {
	{SHIM__V1__REQUEST__KIND_INFO, "info", op_sys_info, NULL},
	{SHIM__V1__REQUEST__KIND_ECHO, "echo", op_sys_echo, NULL},
	{SHIM__V1__REQUEST__KIND_STAT, "stat", NULL, op_fs_stat},
	{SHIM__V1__REQUEST__KIND_READ, "read", op_fs_read, NULL},
	{SHIM__V1__REQUEST__KIND_WRITE, "write", op_fs_write, NULL},
	{SHIM__V1__REQUEST__KIND_LIST, "list", op_fs_list, NULL},
	{SHIM__V1__REQUEST__KIND_MKDIR, "mkdir", NULL, op_fs_mkdir},
	{SHIM__V1__REQUEST__KIND_REMOVE, "remove", NULL, op_fs_remove},
	{SHIM__V1__REQUEST__KIND_RENAME, "rename", NULL, op_fs_rename},
	{SHIM__V1__REQUEST__KIND_COPY, "copy", NULL, op_fs_copy},
	{SHIM__V1__REQUEST__KIND_CHMOD, "chmod", NULL, op_fs_chmod},
	{SHIM__V1__REQUEST__KIND_CHOWN, "chown", NULL, op_fs_chown},
	{SHIM__V1__REQUEST__KIND_SYMLINK, "symlink", NULL, op_fs_symlink},
	{SHIM__V1__REQUEST__KIND_READLINK, "readlink", NULL, op_fs_readlink},
	{SHIM__V1__REQUEST__KIND_LINK, "link", NULL, op_fs_link},
	{SHIM__V1__REQUEST__KIND_TRUNCATE, "truncate", NULL, op_fs_truncate},
	{SHIM__V1__REQUEST__KIND_SET_TIMES, "set_times", NULL, op_fs_set_times},
	{SHIM__V1__REQUEST__KIND_REALPATH, "realpath", NULL, op_fs_realpath},
	{SHIM__V1__REQUEST__KIND_STATFS, "statfs", NULL, op_fs_statfs},
	{SHIM__V1__REQUEST__KIND_WATCH, "watch", op_fs_watch, NULL},
	{SHIM__V1__REQUEST__KIND_EXEC, "exec", op_exec, NULL},
	{SHIM__V1__REQUEST__KIND_SIGNAL, "signal", op_signal, NULL},
	{SHIM__V1__REQUEST__KIND_PS, "ps", op_ps, NULL},
	{SHIM__V1__REQUEST__KIND_ATTACH, "attach", op_attach, NULL},
	{SHIM__V1__REQUEST__KIND_WAIT, "wait", op_wait, NULL},
	{SHIM__V1__REQUEST__KIND_RMPROC, "rmproc", op_rmproc, NULL},
	{SHIM__V1__REQUEST__KIND_RESIZE, "resize", op_resize, NULL},
	{SHIM__V1__REQUEST__KIND_BACKUP, "backup", op_backup, NULL},
	{SHIM__V1__REQUEST__KIND_RESTORE, "restore", op_restore, NULL},
	/* mounts */
	{SHIM__V1__REQUEST__KIND_MOUNT, "mount", op_mount, NULL},
	{SHIM__V1__REQUEST__KIND_MOUNTS, "mounts", op_mounts, NULL},
	{SHIM__V1__REQUEST__KIND_UNMOUNT, "unmount", op_unmount, NULL},
	/* tunnels */
	{SHIM__V1__REQUEST__KIND_TUNNEL_LISTEN, "tunnel_listen", op_tunnel_listen, NULL},
	{SHIM__V1__REQUEST__KIND_TUNNEL_FORWARD, "tunnel_forward", op_tunnel_forward, NULL},
	{SHIM__V1__REQUEST__KIND_TUNNEL_CONNECT, "tunnel_connect", op_tunnel_connect, NULL},
	{SHIM__V1__REQUEST__KIND_TUNNEL_ACCEPT, "tunnel_accept", op_tunnel_accept, NULL},
	{SHIM__V1__REQUEST__KIND_TUNNELS, "tunnels", op_tunnel_list, NULL},
	{SHIM__V1__REQUEST__KIND_TUNNEL_CLOSE, "tunnel_close", op_tunnel_close, NULL},
};

/* ---- blocking operations ---- */

struct blocking_job {
	struct work work;
	struct stream *st; /* NULL once the stream has ended without us */
	op_blocking_fn fn;
	uint8_t *payload; /* the REQUEST, decoded again on the worker */
	size_t len;
	int rc;
	struct op_reply reply;
	struct shim_err err;
};

static void blocking_run(struct work *w)
{
	struct blocking_job *j = container_of(w, struct blocking_job, work);
	Shim__V1__Request *req = shim__v1__request__unpack(NULL, j->len, j->payload);
	if (req == NULL) {
		j->rc = err_set(&j->err, ENOMEM, NULL, "cannot decode the request again");
		return;
	}
	/* the request's identity and resolve flags for every syscall of the operation */
	struct fs_ctx ctx;
	if (fs_ctx_from_request(req->fs, &ctx, &j->err) < 0 || fs_ctx_enter(&ctx, &j->err) < 0)
		j->rc = -1;
	else
		j->rc = j->fn(req, &j->reply, &j->err);
	fs_ctx_leave();
	shim__v1__request__free_unpacked(req, NULL);
}

static void blocking_done(struct work *w)
{
	struct blocking_job *j = container_of(w, struct blocking_job, work);
	if (j->st != NULL) {
		if (j->rc == 0)
			stream_end(j->st, j->reply.buf, j->reply.len);
		else
			stream_fail(j->st, &j->err);
	}
	free(j->reply.buf);
	free(j->payload);
	free(j);
}

static void blocking_cancel(struct stream *st)
{
	struct blocking_job *j = st->op_data;
	j->st = NULL;
	worker_interrupt(&j->work);
}

static const struct stream_ops blocking_ops = {.cancel = blocking_cancel};

static int start_blocking(struct stream *st, op_blocking_fn fn, const uint8_t *payload, size_t len,
			  struct shim_err *err)
{
	struct blocking_job *j = calloc(1, sizeof(*j));
	if (j == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	j->payload = malloc(len ? len : 1);
	if (j->payload == NULL) {
		free(j);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	memcpy(j->payload, payload, len);
	j->len = len;
	j->fn = fn;
	j->st = st;
	j->work.run = blocking_run;
	j->work.done = blocking_done;
	st->ops = &blocking_ops;
	st->op_data = j;
	worker_submit(&j->work);
	return 0;
}

int op_reply_pack(struct op_reply *reply, const Shim__V1__Result *res, struct shim_err *err)
{
	size_t n = shim__v1__result__get_packed_size(res);
	reply->buf = malloc(n ? n : 1);
	if (reply->buf == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	reply->len = shim__v1__result__pack(res, reply->buf);
	return 0;
}

int op_reply_done(struct op_reply *reply, struct shim_err *err)
{
	Shim__V1__Done d = SHIM__V1__DONE__INIT;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_DONE;
	res.done = &d;
	return op_reply_pack(reply, &res, err);
}

/* Constant-time comparison: the time taken does not depend on where the first
 * difference is, so a network peer cannot guess the token byte by byte. */
static bool token_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	unsigned char diff = (unsigned char)(alen != blen);
	size_t n = alen < blen ? alen : blen;
	for (size_t i = 0; i < n; i++)
		diff |= a[i] ^ b[i];
	/* also walk the longer tail so lengths cost the same as contents */
	for (size_t i = n; i < blen; i++)
		diff |= b[i];
	return diff == 0;
}

static void hello_freep(Shim__V1__Hello **h)
{
	if (*h != NULL)
		shim__v1__hello__free_unpacked(*h, NULL);
}
#define cleanup_hello __attribute__((cleanup(hello_freep)))

int disp_hello(struct conn *c, const uint8_t *payload, size_t len, struct shim_err *err)
{
	struct server *s = c->srv;
	Shim__V1__Hello cleanup_hello *h = shim__v1__hello__unpack(NULL, len, payload);
	if (h == NULL) {
		char why[200];
		if (pb_explain(&shim__v1__hello__descriptor, payload, len, why, sizeof(why)) < 0)
			snprintf(why, sizeof(why), "malformed");
		return err_set(err, EBADMSG, NULL, "cannot decode Hello: %s", why);
	}
	if (h->protocol_version != SHIM_PROTOCOL_VERSION)
		return err_set(err, EPROTONOSUPPORT, NULL, "protocol version %u not supported (this shim speaks %u)",
			       h->protocol_version, SHIM_PROTOCOL_VERSION);
	if (c->need_token && s->cfg.token != NULL) {
		if (!h->has_token || h->token.len == 0)
			return err_set(err, EACCES, NULL, "token required");
		if (!token_equal(h->token.data, h->token.len, (const uint8_t *)s->cfg.token, s->cfg.token_len)) {
			/* logged with the refusal, rate-limited (conn_fail) */
			return err_set(err, EACCES, NULL, "bad token");
		}
	}
	uint32_t max = s->cfg.max_frame;
	if (h->has_max_frame && h->max_frame < max)
		max = h->max_frame < FRAME_MIN_MAX ? FRAME_MIN_MAX : h->max_frame;
	c->max_frame = max;
	c->peer_window = h->has_initial_window ? h->initial_window : FRAME_DEFAULT_WINDOW;
	if (c->peer_window > INT32_MAX)
		c->peer_window = INT32_MAX;
	/* a window of 0 would stall every stream that sends data: raise it (documented) */
	if (c->peer_window < FRAME_MIN_WINDOW)
		c->peer_window = FRAME_MIN_WINDOW;

	Shim__V1__HelloReply r = SHIM__V1__HELLO_REPLY__INIT;
	r.protocol_version = SHIM_PROTOCOL_VERSION;
	r.shim_version = (char *)SHIM_VERSION;
	size_t nf = 0;
	while (server_features[nf] != NULL)
		nf++;
	r.n_features = nf;
	r.features = (char **)server_features;
	r.max_frame = max;
	r.pid = (uint32_t)s->pid;
	r.pid1 = s->pid1;
	r.uid = (uint32_t)getuid();
	r.hostname = s->hostname;
	r.boot_id = s->boot_id;
	r.initial_window = s->cfg.initial_window;
	r.has_max_streams = 1;
	r.max_streams = s->cfg.max_streams;
	uint8_t buf[2048];
	size_t n = shim__v1__hello_reply__get_packed_size(&r);
	if (n > sizeof(buf))
		return err_set(err, EOVERFLOW, NULL, "HelloReply too large");
	shim__v1__hello_reply__pack(&r, buf);
	/* authenticated: it now takes one of the --max-connections (EAGAIN when none is left) */
	if (conn_admit(c, err) < 0)
		return -1;
	c->state = CONN_READY;
	conn_send(c, 0, FRAME_HELLO_OK, 0, buf, n);
	log_debug("conn %s: hello from %s, max frame %u", c->peer, h->client_name ? h->client_name : "?", max);
	return 0;
}

int disp_request(struct stream *st, const uint8_t *payload, size_t len, struct shim_err *err)
{
	/* The framing is intact, so a payload that does not decode is this stream's
	 * fault only: it ends with EBADMSG saying why, and the connection goes on. */
	Shim__V1__Request *req = shim__v1__request__unpack(NULL, len, payload);
	if (req == NULL) {
		char why[200];
		if (pb_explain(&shim__v1__request__descriptor, payload, len, why, sizeof(why)) < 0)
			snprintf(why, sizeof(why), "malformed");
		return err_set(err, EBADMSG, NULL, "cannot decode Request: %s", why);
	}
	const struct disp_entry *e = NULL;
	for (size_t i = 0; i < ARRAY_SIZE(table); i++)
		if (table[i].kind == req->kind_case)
			e = &table[i];
	int rc;
	char why[200];
	if (pb_check_enums(&req->base, why, sizeof(why)) < 0) {
		/* protobuf-c keeps any number: a value from a newer schema must not be
		 * taken for another (an unknown restore mode for a replace) */
		rc = err_set(err, EINVAL, NULL, "%s", why);
	} else if (e == NULL) {
		/* a kind this shim does not know (newer client): the field was skipped as
		 * unknown, so no oneof case is set */
		rc = err_set(err, ENOSYS, NULL, "unknown request kind");
	} else if (e->blocking != NULL) {
		log_debug("conn %s: stream %u: %s", st->conn->peer, st->id, e->name);
		rc = start_blocking(st, e->blocking, payload, len, err);
	} else {
		log_debug("conn %s: stream %u: %s", st->conn->peer, st->id, e->name);
		rc = e->start(st, req, err);
	}
	shim__v1__request__free_unpacked(req, NULL);
	return rc;
}

size_t disp_pack_error(const struct shim_err *err, uint8_t *buf, size_t size)
{
	Shim__V1__Error m = SHIM__V1__ERROR__INIT;
	m.errno_num = err->code;
	const char *name = errname_name(err->code);
	m.errno_name = (char *)(name ? name : "EUNKNOWN");
	m.message = (char *)err->msg;
	if (err->path_len > 0) {
		m.has_path = 1;
		m.path.data = (uint8_t *)err->path;
		m.path.len = err->path_len;
	}
	/* msg (256) + path (1024) + names fit well within the caller's buffer */
	size_t n = shim__v1__error__get_packed_size(&m);
	if (n > size) {
		m.has_path = 0;
		n = shim__v1__error__get_packed_size(&m);
	}
	return shim__v1__error__pack(&m, buf);
}

void op_end(struct stream *st, const Shim__V1__Result *result)
{
	uint8_t small[1024];
	size_t n = shim__v1__result__get_packed_size(result);
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (buf == NULL) {
		struct shim_err e;
		err_set(&e, ENOMEM, NULL, "out of memory");
		stream_fail(st, &e);
		return;
	}
	shim__v1__result__pack(result, buf);
	stream_end(st, buf, n);
	if (buf != small)
		free(buf);
}
