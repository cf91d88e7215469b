/* dispatch.c: the handshake, the table of request kinds, and Error encoding. */
#include "dispatch.h"
#include "conn.h"
#include "errnames.h"
#include "frame.h"
#include "listen.h"
#include "log.h"
#include "op.h"
#include "ops.h"
#include "pbcheck.h"
#include "server.h"
#include "shim.pb-c.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One row per request kind (struct op_kind, in the file that serves it); the generic
 * checks (limits, decoding, enum values) happen once, before. */
static const struct op_kind *const table[] = {
	&op_sys_info_kind,
	&op_sys_echo_kind,
	/* files */
	&op_fs_stat_kind,
	&op_fs_read_kind,
	&op_fs_write_kind,
	&op_fs_list_kind,
	&op_fs_mkdir_kind,
	&op_fs_remove_kind,
	&op_fs_rename_kind,
	&op_fs_copy_kind,
	&op_fs_chmod_kind,
	&op_fs_chown_kind,
	&op_fs_symlink_kind,
	&op_fs_readlink_kind,
	&op_fs_link_kind,
	&op_fs_truncate_kind,
	&op_fs_set_times_kind,
	&op_fs_realpath_kind,
	&op_fs_statfs_kind,
	&op_fs_watch_kind,
	/* processes */
	&op_exec_kind,
	&op_signal_kind,
	&op_ps_kind,
	&op_attach_kind,
	&op_wait_kind,
	&op_rmproc_kind,
	&op_resize_kind,
	/* backups */
	&op_backup_kind,
	&op_restore_kind,
	/* mounts */
	&op_mount_kind,
	&op_mounts_kind,
	&op_unmount_kind,
	/* tunnels */
	&op_tunnel_listen_kind,
	&op_tunnel_forward_kind,
	&op_tunnel_connect_kind,
	&op_tunnel_accept_kind,
	&op_tunnel_list_kind,
	&op_tunnel_close_kind,
	/* microVM snapshots */
	&op_snapshot_prepare_kind,
	&op_snapshot_resumed_kind,
};

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
	r.has_generation = 1;
	r.generation = op_snapshot_generation();
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
	char why[200];
	if (pb_check_enums(&req->base, why, sizeof(why)) < 0) {
		/* protobuf-c keeps any number: a value from a newer schema must not be
		 * taken for another (an unknown restore mode for a replace) */
		shim__v1__request__free_unpacked(req, NULL);
		return err_set(err, EINVAL, NULL, "%s", why);
	}
	for (size_t i = 0; i < ARRAY_SIZE(table); i++) {
		if (table[i]->kind == req->kind_case) {
			log_debug("conn %s: stream %u: %s", st->conn->peer, st->id, table[i]->name);
			return op_begin(st, table[i], req, err); /* the op owns req now */
		}
	}
	/* a kind this shim does not know (newer client): the field was skipped as
	 * unknown, so no oneof case is set */
	shim__v1__request__free_unpacked(req, NULL);
	return err_set(err, ENOSYS, NULL, "unknown request kind");
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
