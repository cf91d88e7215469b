/* calls.c: the system calls of the SDK: ping (sync and async), info, echo. The generic
 * request path they use is in call.c. */
#include "internal.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int send_ping(struct call *k, uint64_t deadline, struct sbx_error *err)
{
	uint8_t p[8];
	frame_put_u32(p, (uint32_t)(k->ping_seq >> 32));
	frame_put_u32(p + 4, (uint32_t)k->ping_seq);
	return sbx__send(k->client, 0, FRAME_PING, 0, p, sizeof(p), deadline, err);
}

SBX_API int sbx_ping(struct sbx_client *c, const struct sbx_call_opts *opts, uint64_t *rtt_ns, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	uint64_t deadline = sbx__deadline(c, opts);
	struct call *k = sbx__call_new(c, false);
	if (k == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	int rc = send_ping(k, deadline, err);
	if (rc == 0)
		rc = sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, opts ? opts->cancel : NULL, err);
	if (rc == 0 && k->err.kind != SBX_ERR_NONE)
		rc = -1, sbx__copy_error(err, &k->err);
	if (rc == 0 && rtt_ns != NULL)
		*rtt_ns = sbx__now_ns() - k->start_ns;
	sbx__call_free(k);
	return rc;
}

static void ping_done(struct call *k)
{
	sbx_ping_cb cb = (sbx_ping_cb)(uintptr_t)k->fn;
	uint64_t rtt = sbx__now_ns() - k->start_ns;
	if (k->err.kind != SBX_ERR_NONE)
		cb(k->ud, -1, 0, &k->err);
	else
		cb(k->ud, 0, rtt, NULL);
	free(k->result);
	free(k);
}

SBX_API int sbx_ping_async(struct sbx_client *c, sbx_ping_cb cb, void *ud, struct sbx_error *err)
{
	struct call *k = sbx__call_new(c, false);
	if (k == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	k->fn = (void *)(uintptr_t)cb;
	k->ud = ud;
	/* set before sending: the PONG may be routed by another thread at once */
	pthread_mutex_lock(&c->mu);
	k->on_done = ping_done;
	bool dead = k->done;
	pthread_mutex_unlock(&c->mu);
	if (dead || send_ping(k, sbx__deadline(c, NULL), err) < 0) {
		if (dead)
			sbx__copy_error(err, &k->err);
		pthread_mutex_lock(&c->mu);
		/* still registered unless a dying connection already completed it */
		bool mine = false;
		for (struct call **pp = &c->calls; *pp != NULL; pp = &(*pp)->next) {
			if (*pp == k) {
				*pp = k->next;
				c->ncalls--;
				mine = true;
				break;
			}
		}
		pthread_mutex_unlock(&c->mu);
		if (mine)
			free(k);
		return -1;
	}
	return 0;
}

SBX_API int sbx_info(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_info *dst,
		     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(dst, "sbx_info", err) < 0)
		return -1;
	struct sbx_info full, *out = &full; /* filled, then copied up to dst's struct_size */
	Shim__V1__InfoRequest ir = SHIM__V1__INFO_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_INFO;
	req.info = &ir;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_INFO, err);
	if (r == NULL)
		return -1;
	const Shim__V1__InfoReply *i = r->info;
	memset(out, 0, sizeof(*out));
	snprintf(out->shim_version, sizeof(out->shim_version), "%s", i->shim_version);
	out->protocol_version = i->protocol_version;
	size_t off = 0;
	for (size_t f = 0; f < i->n_features; f++) {
		int n = snprintf(out->features + off, sizeof(out->features) - off, "%s%s", f ? " " : "",
				 i->features[f]);
		if (n < 0 || (size_t)n >= sizeof(out->features) - off)
			break;
		off += (size_t)n;
	}
	out->uptime_ms = i->uptime_ms;
	out->pid = i->pid;
	out->pid1 = i->pid1;
	out->uid = i->uid;
	out->gid = i->gid;
	snprintf(out->hostname, sizeof(out->hostname), "%s", i->hostname ? i->hostname : "");
	snprintf(out->boot_id, sizeof(out->boot_id), "%s", i->boot_id ? i->boot_id : "");
	out->connections = i->connections;
	out->streams = i->streams;
	out->processes = i->processes;
	out->mounts = i->mounts;
	out->rss_bytes = i->rss_bytes;
	out->load[0] = i->load1;
	out->load[1] = i->load5;
	out->load[2] = i->load15;
	out->max_connections = i->max_connections;
	out->max_streams = i->max_streams;
	out->workers = i->workers;
	out->generation = i->generation;
	shim__v1__result__free_unpacked(r, NULL);
	if (dst != NULL)
		sbx__struct_out_put(dst, out, sizeof(*out));
	return 0;
}

/* An echo of up to this many bytes is sent with its REQUEST in one write. */
#define ECHO_WHOLE_MAX (64u << 10)

SBX_API int sbx_echo(struct sbx_client *c, const struct sbx_call_opts *opts, const void *data, size_t len, void *out,
		     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	Shim__V1__EchoRequest er = SHIM__V1__ECHO_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_ECHO;
	req.echo = &er;
	uint32_t chunk_max = c->max_frame < FRAME_DATA_CHUNK ? c->max_frame : FRAME_DATA_CHUNK;
	/* a small one goes out whole with the REQUEST, in one write */
	bool whole = len <= ECHO_WHOLE_MAX && len <= chunk_max && (int64_t)len <= c->peer_window;
	struct call *k = whole ? sbx__start_request_data(c, &req, FRAME_FLAG_FIN, data, len, deadline, err) :
				 sbx__start_request(c, &req, deadline, err);
	if (k == NULL)
		return -1;
	const uint8_t *src = data;
	uint8_t *dst = out;
	/* what comes back is read straight into out, in big frames */
	sbx__call_sink(k, dst, len);
	size_t sent = whole ? len : 0, got = 0;
	uint32_t owed = 0; /* credit for the bytes that came back, not yet granted */
	bool fin_sent = whole, fin_got = false;
	int rc = 0;
	/* Send while we have credit, otherwise take in what came back: both directions
	 * are bounded by their windows, so neither side buffers more than that. */
	while (rc == 0 && (!fin_sent || !fin_got)) {
		if (!fin_sent) {
			pthread_mutex_lock(&c->mu);
			int64_t credit = k->send_credit;
			pthread_mutex_unlock(&c->mu);
			if (credit > 0 || sent == len) {
				size_t n = len - sent;
				if (n > (size_t)credit)
					n = (size_t)credit;
				if (n > chunk_max)
					n = chunk_max;
				bool fin = sent + n == len;
				pthread_mutex_lock(&c->mu);
				k->send_credit -= (int64_t)n;
				pthread_mutex_unlock(&c->mu);
				/* the credit owed for what came back goes out in the same write */
				rc = sbx__send_granting(k, owed, FRAME_DATA, fin ? FRAME_FLAG_FIN : 0, src + sent, n,
							deadline, err);
				owed = 0;
				sent += n;
				fin_sent = fin;
				continue;
			}
		}
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL) {
			if (sbx__call_done(k)) {
				if (k->err.kind != SBX_ERR_NONE)
					rc = -1, sbx__copy_error(err, &k->err);
				else
					rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "echo stream ended early");
				break;
			}
			/* before waiting, the shim gets the credit it may need to answer */
			rc = sbx__call_grant(k, owed, deadline, err);
			owed = 0;
			if (rc == 0)
				rc = sbx__call_wait_for(k, SBX__WAIT_FRAME | (fin_sent ? 0 : SBX__WAIT_CREDIT),
							deadline, tok, err);
			continue;
		}
		if (it->type == FRAME_DATA) {
			if (got + it->len > len) {
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "echo returned more than was sent");
			} else {
				if (it->ext != dst + got) /* read into its place: no copy */
					memcpy(dst + got, it->ext != NULL ? it->ext : it->data, it->len);
				got += it->len;
				if (it->flags & FRAME_FLAG_FIN)
					fin_got = true;
				else
					owed += it->len; /* granted with the next DATA, or before a wait */
			}
		}
		sbx__rx_free(it);
	}
	if (rc == 0) {
		Shim__V1__Result *r = sbx__wait_result(k, deadline, tok, err);
		if (r == NULL) {
			rc = -1;
		} else {
			if (r->kind_case != SHIM__V1__RESULT__KIND_ECHO || r->echo->bytes != len || got != len)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL,
					       "echo came back with %zu of %zu bytes", got, len);
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	sbx__call_free(k);
	return rc;
}
