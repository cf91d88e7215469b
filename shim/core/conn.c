/* conn.c: a client connection: reading and checking frames, bounded output, stream bookkeeping. */
#include "conn.h"
#include "budget.h"
#include "dispatch.h"
#include "errnames.h"
#include "frame.h"
#include "listen.h"
#include "log.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Output limits. Producers of DATA stop at the soft limit; past twice that we stop
 * reading the client's input (a client that sends and never reads stalls only its
 * own connection); the hard limit closes a connection whose control output alone
 * keeps growing. */
#define OUT_SOFT (1u << 20)
#define OUT_STOP_READ (2u * OUT_SOFT)
#define OUT_HARD (32u << 20)
/* What the producers of one connection's streams may hold besides its output (read
 * buffers): enough for a few streams at full speed, and a client with 255 streams
 * that it grants credit and never reads costs this, not 255 buffers. */
#define CONN_HOLD_MAX (2u * OUT_SOFT)
/* Under the daemon's budget, DATA is not queued in slivers: this much or nothing. */
#define ROOM_MIN (4u << 10)
#define CHUNK_MIN (FRAME_DATA_CHUNK + 2 * FRAME_HDR_LEN)
#define IN_START (16u << 10)
#define LINGER_SECONDS 5.0

static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents);
static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents);
static void keepalive_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void handshake_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void linger_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void stream_abort(struct stream *st, const struct shim_err *err);

struct conn *conn_new(struct server *s, int rfd, int wfd, struct listener *lst, bool need_token, const char *peer)
{
	struct conn *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->in = malloc(IN_START);
	if (c->in == NULL) {
		free(c);
		return NULL;
	}
	c->incap = IN_START;
	pthread_mutex_init(&c->wmu, NULL);
	c->srv = s;
	c->lst = lst;
	c->rfd = rfd;
	c->wfd = wfd;
	c->need_token = need_token;
	c->state = CONN_HELLO;
	c->max_frame = FRAME_HELLO_MAX;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	fcntl(rfd, F_SETFL, fcntl(rfd, F_GETFL) | O_NONBLOCK);
	if (wfd != rfd)
		fcntl(wfd, F_SETFL, fcntl(wfd, F_GETFL) | O_NONBLOCK);

	ev_io_init(&c->rio, conn_read_cb, rfd, EV_READ);
	ev_io_init(&c->wio, conn_write_cb, wfd, EV_WRITE);
	ev_io_start(s->loop, &c->rio);
	c->last_rx = mono_s();
	/* Keepalive starts with HELLO_OK (no PING before it); until then the handshake
	 * deadline, whatever --keepalive says, bounds a client that never speaks. */
	ev_init(&c->keepalive, keepalive_cb);
	ev_init(&c->handshake, handshake_cb);
	if (s->cfg.handshake_timeout > 0) {
		c->handshake.repeat = s->cfg.handshake_timeout;
		ev_timer_again(s->loop, &c->handshake);
	}
	ev_init(&c->linger, linger_cb);

	c->next = s->conns;
	if (s->conns != NULL)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	if (lst != NULL)
		lst->n_pending++;
	log_debug("conn %s: connected", c->peer);
	return c;
}

int conn_admit(struct conn *c, struct shim_err *err)
{
	struct server *s = c->srv;
	if (c->admitted)
		return 0;
	if (c->lst != NULL && s->n_admitted >= s->cfg.max_connections)
		return err_set(err, EAGAIN, NULL, "too many connections (limit %u)", s->cfg.max_connections);
	if (c->lst != NULL)
		c->lst->n_pending--;
	c->admitted = true;
	s->n_admitted++;
	return 0;
}

/* ---- output ---- */

/* Spare output chunks of the standard size, shared by all connections: a busy stream
 * reuses the same few buffers instead of making malloc grow and trim the heap (and
 * fault in fresh pages) for every frame. */
#define SPARE_MAX 32
static struct obuf_chunk *spare;
static unsigned nspare;

static struct obuf_chunk *chunk_get(size_t need)
{
	if (need <= CHUNK_MIN && spare != NULL) {
		struct obuf_chunk *k = spare;
		spare = k->next;
		nspare--;
		return k;
	}
	size_t cap = need > CHUNK_MIN ? need : CHUNK_MIN;
	struct obuf_chunk *k = malloc(sizeof(*k) + cap);
	if (k != NULL)
		k->cap = cap;
	return k;
}

static void chunk_put(struct obuf_chunk *k)
{
	if (k->cap == CHUNK_MIN && nspare < SPARE_MAX) {
		k->next = spare;
		spare = k;
		nspare++;
		return;
	}
	free(k);
}

void conn_budget_trim(void)
{
	while (spare != NULL) {
		struct obuf_chunk *k = spare;
		spare = k->next;
		free(k);
	}
	nspare = 0;
}

static int out_reserve(struct conn *c, size_t need)
{
	struct obuf_chunk *t = c->out_tail;
	if (t != NULL && t->cap - t->len >= need)
		return 0;
	struct obuf_chunk *n = chunk_get(need);
	if (n == NULL)
		return -1;
	n->next = NULL;
	n->len = n->off = 0;
	if (t != NULL)
		t->next = n;
	else
		c->out_head = n;
	c->out_tail = n;
	return 0;
}

/* conn_send is called from inside an op's hooks, so it cannot close the connection
 * there and then: that would free the streams, the sender's among them, under the
 * caller. It stops the connection's input and output and has the loop close it next. */
static void conn_doom(struct conn *c, const char *why)
{
	c->doomed = why;
	ev_io_stop(c->srv->loop, &c->rio);
	ev_timer_stop(c->srv->loop, &c->linger);
	ev_timer_set(&c->linger, 0., 0.);
	ev_timer_start(c->srv->loop, &c->linger);
}

void conn_send(struct conn *c, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len)
{
	if (c->state == CONN_DEAD || c->doomed != NULL)
		return;
	if (c->outlen + len > OUT_HARD) {
		/* Only control frames can get here (DATA stops at the soft limit): the
		 * client has stopped reading while still asking for answers. */
		conn_doom(c, "output over the hard limit (client not reading)");
		return;
	}
	if (out_reserve(c, FRAME_HDR_LEN + len) < 0) {
		conn_doom(c, "out of memory");
		return;
	}
	struct obuf_chunk *t = c->out_tail;
	c->direct_rest_id = 0;
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(t->data + t->len, &h);
	if (len > 0)
		memcpy(t->data + t->len + FRAME_HDR_LEN, payload, len);
	t->len += FRAME_HDR_LEN + len;
	c->outlen += FRAME_HDR_LEN + len;
	budget_take(FRAME_HDR_LEN + len);
	c->want_flush = true;
}

size_t conn_room(const struct conn *c)
{
	if (c->state != CONN_READY || c->doomed != NULL || c->outlen >= OUT_SOFT)
		return 0;
	/* (its output only: a stream's buffer waiting to go out must not take the room it
	 * is to go into) */
	return budget_room(c->outlen, OUT_SOFT - c->outlen, ROOM_MIN, c->srv->n_conns);
}

/* A stream of c waits for room: if the daemon's budget is what it lacks (not its
 * connection's output room), have conn_budget_wake() come back for it. */
static void note_budget(struct conn *c)
{
	if (c->state == CONN_READY && c->outlen < OUT_SOFT && conn_room(c) == 0) {
		c->budget_parked = true;
		budget_wait();
	}
}

/* The blocked list is a FIFO so that streams take turns at the output room. */
static void blocked_remove(struct conn *c, struct stream *st)
{
	struct stream **bp = &c->blocked;
	struct stream *prev = NULL;
	while (*bp != NULL && *bp != st) {
		prev = *bp;
		bp = &(*bp)->wnext;
	}
	if (*bp == NULL)
		return;
	*bp = st->wnext;
	if (c->blocked_tail == st)
		c->blocked_tail = prev;
	st->wnext = NULL;
	st->blocked = false;
	c->nblocked--;
}

static void conn_unblock_streams(struct conn *c)
{
	/* Visit each stream blocked now once; one that blocks again goes to the tail and
	 * waits for the next round. A hook may end its stream or even close the
	 * connection, so the list is re-read from the connection every time. */
	for (unsigned n = c->nblocked; n > 0 && c->blocked != NULL && c->state == CONN_READY; n--) {
		struct stream *st = c->blocked;
		blocked_remove(c, st);
		if (st->ops != NULL && st->ops->writable != NULL)
			st->ops->writable(st);
		if (conn_room(c) == 0) {
			note_budget(c);
			break;
		}
	}
}

void conn_budget_wake(void)
{
	for (struct conn *c = srv != NULL ? srv->conns : NULL, *next; c != NULL; c = next) {
		next = c->next;
		if (!c->budget_parked)
			continue;
		/* set again by whoever is turned away once more */
		c->budget_parked = false;
		if (c->state == CONN_READY && c->blocked != NULL)
			conn_unblock_streams(c);
	}
}

static void conn_finish_close(struct conn *c);

/* With wmu held, after a write of the loop's: may a worker write a frame of its own?
 * Only at a frame boundary (nothing of a frame left queued, no wedge) and while the
 * connection is READY. Frames queued since are whole, so that the worker's goes
 * before them is fine (ordering across streams is not kept anyway). */
static void wire_update(struct conn *c)
{
	c->wire_ok = c->state == CONN_READY && c->doomed == NULL && c->outlen == 0 && c->wedge == NULL;
}

static void wire_off(struct conn *c)
{
	pthread_mutex_lock(&c->wmu);
	c->wire_ok = false;
	pthread_mutex_unlock(&c->wmu);
}

/* The rest of a worker's frame, before anything else. With wmu held: 0 written, 1 the
 * socket is full, -1 failed (errno). */
static int wedge_flush(struct conn *c)
{
	while (c->wedge != NULL) {
		ssize_t w = write(c->wfd, c->wedge + c->wedge_off, c->wedge_len - c->wedge_off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -1;
		c->wedge_off += (size_t)w;
		if (c->wedge_off == c->wedge_len) {
			free(c->wedge);
			c->wedge = NULL;
		}
	}
	return 0;
}

/* The queued output, as far as the socket takes it. With wmu held: as wedge_flush. */
static int out_flush(struct conn *c)
{
	int rc = wedge_flush(c);
	if (rc != 0)
		return rc;
	while (c->out_head != NULL) {
		struct iovec iov[32];
		int n = 0;
		for (struct obuf_chunk *k = c->out_head; k != NULL && n < 32; k = k->next) {
			if (k->len == k->off)
				continue;
			iov[n].iov_base = k->data + k->off;
			iov[n].iov_len = k->len - k->off;
			n++;
		}
		if (n == 0)
			break;
		ssize_t w = writev(c->wfd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -1;
		}
		c->outlen -= (size_t)w;
		budget_give((size_t)w);
		size_t left = (size_t)w;
		while (left > 0 || (c->out_head != NULL && c->out_head->off == c->out_head->len)) {
			struct obuf_chunk *k = c->out_head;
			if (k == NULL)
				break;
			size_t avail = k->len - k->off;
			size_t take = left < avail ? left : avail;
			k->off += take;
			left -= take;
			if (k->off == k->len) {
				c->out_head = k->next;
				if (c->out_head == NULL)
					c->out_tail = NULL;
				chunk_put(k);
			}
		}
	}
	return 0;
}

void conn_flush(struct conn *c)
{
	c->want_flush = false;
	c->direct_wait = false;
	pthread_mutex_lock(&c->wmu);
	int rc = out_flush(c);
	int e = errno;
	wire_update(c);
	pthread_mutex_unlock(&c->wmu);
	if (rc > 0) {
		ev_io_start(c->srv->loop, &c->wio);
		return;
	}
	if (rc < 0) {
		conn_close(c, strerror(e));
		return;
	}
	if (c->state == CONN_CLOSING) {
		conn_finish_close(c);
		return;
	}
	if ((c->state != CONN_READY && c->state != CONN_HELLO) || c->doomed != NULL)
		return;
	if (!ev_is_active(&c->rio))
		ev_io_start(c->srv->loop, &c->rio);
	if (c->blocked != NULL)
		conn_unblock_streams(c);
	/* What the streams queued just now goes out when the socket says it is writable,
	 * which is at once unless the peer is slow: no busy loop, no stall. */
	if (c->state == CONN_DEAD)
		return;
	if (c->outlen > 0 || c->direct_wait)
		ev_io_start(c->srv->loop, &c->wio);
	else
		ev_io_stop(c->srv->loop, &c->wio);
}

static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct conn *c = container_of(w, struct conn, wio);
	conn_flush(c);
}

/* ---- closing ---- */

static void conn_unlink(struct conn *c)
{
	struct server *s = c->srv;
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	c->prev = NULL;
	c->next = s->dead;
	s->dead = c;
	s->n_conns--;
	if (c->admitted)
		s->n_admitted--;
	else if (c->lst != NULL)
		c->lst->n_pending--;
}

static void conn_drop_streams(struct conn *c)
{
	for (unsigned b = 0; b < CONN_BUCKETS; b++) {
		while (c->buckets[b] != NULL)
			stream_abort(c->buckets[b], NULL);
	}
}

static void conn_stop_io(struct conn *c)
{
	struct ev_loop *loop = c->srv->loop;
	ev_io_stop(loop, &c->rio);
	ev_io_stop(loop, &c->wio);
	ev_timer_stop(loop, &c->keepalive);
	ev_timer_stop(loop, &c->handshake);
	ev_timer_stop(loop, &c->linger);
}

static void conn_finish_close(struct conn *c)
{
	if (c->state == CONN_DEAD)
		return;
	wire_off(c);
	conn_drop_streams(c);
	conn_stop_io(c);
	c->state = CONN_DEAD;
	conn_unlink(c);
	if (c->srv->stdio_mode && c->lst == NULL)
		server_shutdown(c->srv, "stdio closed");
}

void conn_close(struct conn *c, const char *why)
{
	if (c->state == CONN_DEAD)
		return;
	log_info("conn %s: closed (%s)", c->peer, why);
	conn_finish_close(c);
}

static void linger_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct conn *c = container_of(w, struct conn, linger);
	conn_close(c, c->doomed != NULL ? c->doomed : "peer did not read its last frames");
}

/* Send what is queued and close, cancelling the streams first (their ERRORs go out
 * before the connection closes). */
static void conn_begin_closing(struct conn *c)
{
	if (c->state == CONN_CLOSING || c->state == CONN_DEAD)
		return;
	c->state = CONN_CLOSING;
	wire_off(c); /* the connection's last frames are the loop's */
	ev_io_stop(c->srv->loop, &c->rio);
	ev_timer_stop(c->srv->loop, &c->keepalive);
	ev_timer_stop(c->srv->loop, &c->handshake);
	c->linger.repeat = LINGER_SECONDS;
	ev_timer_again(c->srv->loop, &c->linger);
	c->want_flush = true;
}

void conn_fail(struct conn *c, const struct shim_err *err)
{
	if (c->state == CONN_CLOSING || c->state == CONN_DEAD)
		return;
	/* a refusal before HELLO_OK is one of possibly many (a flood, a scan): at most
	 * one line a second; a client that was let in is logged in full */
	if (c->state == CONN_HELLO)
		listen_log_refusal(c->srv, "conn %s: refused: %s (%s)", c->peer, err->msg, errname_name(err->code));
	else
		log_warn("conn %s: protocol error: %s (errno %d)", c->peer, err->msg, err->code);
	uint8_t buf[1600];
	size_t n = disp_pack_error(err, buf, sizeof(buf));
	/* streams die silently: the connection-level ERROR says why */
	conn_drop_streams(c);
	conn_send(c, 0, FRAME_ERROR, 0, buf, n);
	conn_begin_closing(c);
}

void conn_shutdown(struct conn *c)
{
	if (c->state == CONN_CLOSING || c->state == CONN_DEAD)
		return;
	struct shim_err e;
	err_set(&e, ECANCELED, NULL, "shim shutting down");
	for (unsigned b = 0; b < CONN_BUCKETS; b++) {
		while (c->buckets[b] != NULL)
			stream_abort(c->buckets[b], &e);
	}
	conn_begin_closing(c);
}

static void conn_destroy(struct conn *c)
{
	pthread_mutex_destroy(&c->wmu);
	free(c);
}

void conn_reap_dead(struct server *s)
{
	while (s->dead != NULL) {
		struct conn *c = s->dead;
		s->dead = c->next;
		budget_give(c->outlen);
		c->outlen = 0;
		while (c->out_head != NULL) {
			struct obuf_chunk *k = c->out_head;
			c->out_head = k->next;
			chunk_put(k);
		}
		/* (under wmu: a worker checks wire_ok, false since the close, before it writes) */
		pthread_mutex_lock(&c->wmu);
		if (c->wfd != c->rfd && c->wfd >= 0)
			close(c->wfd);
		if (c->rfd >= 0)
			close(c->rfd);
		c->wfd = c->rfd = -1;
		free(c->wedge);
		c->wedge = NULL;
		pthread_mutex_unlock(&c->wmu);
		free(c->in);
		c->in = NULL;
		c->reaped = true;
		if (c->wire_refs == 0)
			conn_destroy(c);
	}
}

/* What is left of a frame (its header, then len bytes of payload) once off bytes of it
 * are written, copied to dst: the bytes copied. */
static size_t frame_rest(uint8_t *dst, const uint8_t *hdr, const void *payload, size_t len, size_t off)
{
	size_t n = 0;
	if (off < FRAME_HDR_LEN) {
		n = FRAME_HDR_LEN - off;
		memcpy(dst, hdr + off, n);
		off = FRAME_HDR_LEN;
	}
	size_t skip = off - FRAME_HDR_LEN;
	memcpy(dst + n, (const uint8_t *)payload + skip, len - skip);
	return n + len - skip;
}

/* ---- replies from workers ---- */

bool conn_wire_take(struct conn *c)
{
	if (c->state != CONN_READY || c->doomed != NULL)
		return false;
	c->wire_refs++;
	return true;
}

void conn_wire_put(struct conn *c)
{
	if (--c->wire_refs == 0 && c->reaped)
		conn_destroy(c);
}

bool conn_wire_send(struct conn *c, int *claim, uint32_t stream, uint8_t type, const void *payload, size_t len)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type};
	frame_put_hdr(hdr, &h);
	size_t total = FRAME_HDR_LEN + len;
	/* room for a rest before writing: once part of the frame is out, the rest must go */
	uint8_t *rest = malloc(total);
	if (rest == NULL)
		return false;
	bool sent = false;
	pthread_mutex_lock(&c->wmu);
	if (c->wire_ok && *claim == 0) {
		struct iovec iov[2] = {{hdr, FRAME_HDR_LEN}, {(void *)payload, len}};
		/* counted out of flight before the client can see the END and send the
		 * next request, which the loop may read before this thread runs again */
		__atomic_add_fetch(&c->wire_ended, 1, __ATOMIC_SEQ_CST);
		ssize_t w;
		do
			w = writev(c->wfd, iov, len > 0 ? 2 : 1);
		while (w < 0 && errno == EINTR);
		if (w <= 0) {
			/* full, or failed: the loop's own path sends it, or meets the error */
			__atomic_sub_fetch(&c->wire_ended, 1, __ATOMIC_SEQ_CST);
		} else {
			sent = true;
			*claim = 1;
			if ((size_t)w < total) {
				c->wedge = rest;
				c->wedge_len = frame_rest(rest, hdr, payload, len, (size_t)w);
				c->wedge_off = 0;
				c->wire_ok = false;
				rest = NULL;
			}
		}
	}
	pthread_mutex_unlock(&c->wmu);
	free(rest);
	return sent;
}

bool conn_wire_settle(struct conn *c, int *claim)
{
	pthread_mutex_lock(&c->wmu);
	bool sent = *claim == 1;
	if (!sent)
		*claim = 2;
	pthread_mutex_unlock(&c->wmu);
	return sent;
}

/* ---- streams ---- */

struct stream *stream_lookup(struct conn *c, uint32_t id)
{
	for (struct stream *st = c->buckets[id % CONN_BUCKETS]; st != NULL; st = st->hnext)
		if (st->id == id)
			return st;
	return NULL;
}

static struct stream *stream_new(struct conn *c, uint32_t id)
{
	struct stream *st = calloc(1, sizeof(*st));
	if (st == NULL)
		return NULL;
	st->conn = c;
	st->id = id;
	st->send_credit = c->peer_window;
	st->recv_left = c->srv->cfg.initial_window;
	st->hnext = c->buckets[id % CONN_BUCKETS];
	c->buckets[id % CONN_BUCKETS] = st;
	c->nstreams++;
	c->srv->n_streams++;
	return st;
}

static void stream_free(struct stream *st)
{
	struct conn *c = st->conn;
	/* (stream_abort clears ops first: its op heard of it through cancel) */
	if (st->ops != NULL && st->ops->gone != NULL)
		st->ops->gone(st);
	struct stream **pp = &c->buckets[st->id % CONN_BUCKETS];
	while (*pp != st)
		pp = &(*pp)->hnext;
	*pp = st->hnext;
	if (st->blocked)
		blocked_remove(c, st);
	/* what its producer still holds is the producer's now (budget_give() when it
	 * frees it): the connection's share is free for its other streams */
	c->held -= st->held;
	c->reserved -= st->reserved;
	if (st->held > 0 && c->budget_parked)
		budget_wake_soon();
	c->nstreams--;
	c->srv->n_streams--;
	free(st);
}

size_t stream_can_send_upto(const struct stream *st, size_t most)
{
	size_t room = conn_room(st->conn);
	if (st->send_credit <= 0)
		return 0;
	if ((uint64_t)st->send_credit < room)
		room = (size_t)st->send_credit;
	if (room > most)
		room = most;
	if (room > st->conn->max_frame)
		room = st->conn->max_frame;
	return room;
}

size_t stream_can_send(const struct stream *st)
{
	return stream_can_send_upto(st, FRAME_DATA_CHUNK);
}

void stream_send_data(struct stream *st, const void *buf, size_t len, bool fin)
{
	stream_send_flagged(st, buf, len, fin ? FRAME_FLAG_FIN : 0);
}

/* The most payload one DATA frame of c carries. */
static size_t data_chunk(const struct conn *c)
{
	return FRAME_DATA_CHUNK < c->max_frame ? FRAME_DATA_CHUNK : c->max_frame;
}

void stream_send_flagged(struct stream *st, const void *buf, size_t len, uint8_t flags)
{
	size_t chunk = data_chunk(st->conn);
	const uint8_t *p = buf;
	st->send_credit -= (int64_t)len;
	for (; len > chunk; p += chunk, len -= chunk)
		conn_send(st->conn, st->id, FRAME_DATA, flags & ~FRAME_FLAG_FIN, p, chunk);
	conn_send(st->conn, st->id, FRAME_DATA, flags, p, len);
}

/* Drop emptied chunks from the head of the output (a reservation that was not used). */
static void out_trim(struct conn *c)
{
	while (c->out_head != NULL && c->out_head->off == c->out_head->len) {
		struct obuf_chunk *k = c->out_head;
		c->out_head = k->next;
		if (c->out_head == NULL)
			c->out_tail = NULL;
		chunk_put(k);
	}
}

#define DIRECT_FRAMES 16

/* stream_send_direct(), and with grant a WINDOW handing back the credit of the payload
 * consumed, written behind the DATA in the same writev (queued when the socket takes
 * less). */
static size_t send_direct_locked(struct stream *st, const void *buf, size_t len, bool grant, bool *busy)
{
	struct conn *c = st->conn;
	if (c->wedge != NULL)
		return 0; /* a worker's frame is part-written: behind it, through the queue */
	if (c->outlen > 0) {
		if (c->direct_rest_id != st->id)
			return 0;
		/* only our own frame's rest is queued: wait for it rather than copy
		 * behind it (writable() comes once the queue is empty) */
		*busy = true;
		stream_wait_writable(st);
		return 0;
	}
	size_t chunk = data_chunk(c);
	if ((uint64_t)st->send_credit < len)
		len = (size_t)st->send_credit;
	/* room for the rest of a frame the socket takes only part of, reserved before
	 * writing: after a partial frame the connection must get the rest */
	out_trim(c);
	if (out_reserve(c, FRAME_HDR_LEN + chunk) < 0)
		return 0;
	uint8_t hdr[DIRECT_FRAMES + 1][FRAME_HDR_LEN];
	struct iovec iov[2 * (DIRECT_FRAMES + 1)];
	size_t flen[DIRECT_FRAMES + 1];
	int nf = 0;
	const uint8_t *p = buf;
	size_t planned = 0;
	for (size_t off = 0; off < len && nf < DIRECT_FRAMES; nf++) {
		size_t n = len - off < chunk ? len - off : chunk;
		struct frame_hdr h = {.len = (uint32_t)n, .stream = st->id, .type = FRAME_DATA};
		frame_put_hdr(hdr[nf], &h);
		iov[2 * nf] = (struct iovec){hdr[nf], FRAME_HDR_LEN};
		iov[2 * nf + 1] = (struct iovec){(void *)(p + off), n};
		flen[nf] = n;
		off += n;
		planned = off;
	}
	/* the WINDOW, if any, is the last "frame": its payload is not DATA */
	int ndata = nf;
	uint8_t win[4];
	grant = grant && !st->client_fin;
	if (grant) {
		struct frame_hdr h = {.len = sizeof(win), .stream = st->id, .type = FRAME_WINDOW};
		frame_put_hdr(hdr[nf], &h);
		frame_put_u32(win, (uint32_t)planned);
		iov[2 * nf] = (struct iovec){hdr[nf], FRAME_HDR_LEN};
		iov[2 * nf + 1] = (struct iovec){win, sizeof(win)};
		flen[nf] = sizeof(win);
		nf++;
	}
	ssize_t w;
	do
		w = writev(c->wfd, iov, 2 * nf);
	while (w < 0 && errno == EINTR);
	if (w <= 0) {
		out_trim(c);
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			*busy = true;
			c->direct_wait = true;
			ev_io_start(c->srv->loop, &c->wio);
			stream_wait_writable(st);
		}
		/* other errors: the queued path meets them again and closes */
		return 0;
	}
	size_t used = 0, left = (size_t)w;
	bool granted = false;
	for (int i = 0; i < nf && left > 0; i++) {
		size_t fl = FRAME_HDR_LEN + flen[i];
		if (i < ndata)
			used += flen[i];
		else
			granted = true; /* begun: it is finished from the queue */
		if (left >= fl) {
			left -= fl;
			continue;
		}
		/* the socket took `left` bytes of this frame: the rest goes into the
		 * reserved room (a header part, then the payload) */
		struct obuf_chunk *t = c->out_tail;
		t->len += frame_rest(t->data + t->len, hdr[i], iov[2 * i + 1].iov_base, flen[i], left);
		c->outlen += fl - left;
		budget_take(fl - left);
		c->direct_rest_id = st->id;
		c->want_flush = true;
		break;
	}
	out_trim(c);
	st->send_credit -= (int64_t)used;
	if (grant) {
		if (granted)
			st->recv_left += (uint32_t)used;
		else
			stream_grant(st, (uint32_t)used); /* the socket stopped in the DATA */
	}
	return used;
}

static size_t send_direct(struct stream *st, const void *buf, size_t len, bool grant, bool *busy)
{
	struct conn *c = st->conn;
	*busy = false;
	if (c->state != CONN_READY || c->doomed != NULL || st->send_credit <= 0 || len == 0)
		return 0;
	pthread_mutex_lock(&c->wmu);
	size_t n = send_direct_locked(st, buf, len, grant, busy);
	wire_update(c);
	pthread_mutex_unlock(&c->wmu);
	return n;
}

size_t stream_send_direct(struct stream *st, const void *buf, size_t len, bool *busy)
{
	return send_direct(st, buf, len, false, busy);
}

size_t stream_send_direct_grant(struct stream *st, const void *buf, size_t len, bool *busy)
{
	return send_direct(st, buf, len, true, busy);
}

void stream_wait_writable(struct stream *st)
{
	struct conn *c = st->conn;
	note_budget(c);
	if (st->blocked)
		return;
	st->blocked = true;
	st->wnext = NULL;
	if (c->blocked_tail != NULL)
		c->blocked_tail->wnext = st;
	else
		c->blocked = st;
	c->blocked_tail = st;
	c->nblocked++;
}

size_t stream_hold(struct stream *st, size_t want, size_t min)
{
	struct conn *c = st->conn;
	if (c->state != CONN_READY)
		return 0; /* its streams are about to be cancelled */
	if (min > want)
		min = want;
	size_t bufs = c->held - c->reserved;
	size_t n = bufs < CONN_HOLD_MAX ? CONN_HOLD_MAX - bufs : 0;
	if (n > want)
		n = want;
	size_t got = n >= min ? budget_room(bufs, n, min, c->srv->n_conns) : 0;
	if (got == 0) {
		/* woken by stream_unhold() on this connection, or by the budget */
		c->budget_parked = true;
		if (n >= min)
			budget_wait();
		stream_wait_writable(st);
		return 0;
	}
	st->held += got;
	c->held += got;
	budget_take(got);
	return got;
}

int stream_reserve(struct stream *st, size_t n, struct shim_err *err)
{
	struct conn *c = st->conn;
	if (budget_room(c->reserved, n, n, c->srv->n_conns) < n)
		return err_set(err, EAGAIN, NULL,
			       "memory budget exhausted (%zu of --max-buffer %zu bytes held): try again", budget_used(),
			       budget_max());
	st->held += n;
	st->reserved += n;
	c->held += n;
	c->reserved += n;
	budget_take(n);
	return 0;
}

void stream_unreserve(struct stream *st, size_t n)
{
	struct conn *c = st->conn;
	st->reserved -= n;
	c->reserved -= n;
	stream_unhold(st, n);
}

void stream_unhold(struct stream *st, size_t n)
{
	struct conn *c = st->conn;
	st->held -= n;
	c->held -= n;
	budget_give(n);
	if (c->budget_parked)
		budget_wake_soon();
}

void stream_grant(struct stream *st, uint32_t n)
{
	if (n == 0 || st->client_fin)
		return;
	st->recv_left += n;
	uint8_t p[4];
	frame_put_u32(p, n);
	conn_send(st->conn, st->id, FRAME_WINDOW, 0, p, sizeof(p));
}

void stream_end(struct stream *st, const void *result, size_t len)
{
	conn_send(st->conn, st->id, FRAME_END, 0, result, len);
	stream_free(st);
}

void stream_fail(struct stream *st, const struct shim_err *err)
{
	uint8_t buf[1600];
	size_t n = disp_pack_error(err, buf, sizeof(buf));
	log_debug("conn %s: stream %u: %s: %s", st->conn->peer, st->id, err->msg, strerror(err->code));
	conn_send(st->conn, st->id, FRAME_ERROR, 0, buf, n);
	stream_free(st);
}

void stream_wire_ended(struct stream *st)
{
	struct conn *c = st->conn;
	__atomic_sub_fetch(&c->wire_ended, 1, __ATOMIC_SEQ_CST);
	c->want_flush = true; /* a rest of the frame may wait (wedge) */
	stream_free(st);
}

/* Ended from outside the op (cancel, disconnect, shutdown): tell the op, then send
 * ERROR if there is still someone to send it to (err NULL: nobody). A stream whose
 * END or ERROR a worker has sent goes as it would after them. */
static void stream_abort(struct stream *st, const struct shim_err *err)
{
	const struct stream_ops *ops = st->ops;
	if (ops != NULL && ops->ended != NULL && ops->ended(st)) {
		stream_wire_ended(st);
		return;
	}
	st->ops = NULL;
	if (ops != NULL && ops->cancel != NULL)
		ops->cancel(st);
	if (err != NULL)
		stream_fail(st, err);
	else
		stream_free(st);
}

/* ---- input ---- */

static int proto_error(struct conn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int proto_error(struct conn *c, int code, const char *fmt, ...)
{
	struct shim_err e;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
	va_end(ap);
	e.code = code;
	e.path[0] = '\0';
	e.path_len = 0;
	conn_fail(c, &e);
	return -1;
}

/* A frame for stream id that has no live stream: fine if the stream existed and has
 * ended (a race with END), a protocol error if it never existed. */
static int no_such_stream(struct conn *c, const struct frame_hdr *h)
{
	if (h->stream != 0 && (h->stream & 1) && h->stream <= c->last_stream)
		return 0;
	return proto_error(c, EPROTO, "%s for unknown stream %u", frame_type_name(h->type), h->stream);
}

static int handle_request(struct conn *c, const struct frame_hdr *h, const uint8_t *p)
{
	if (h->stream == 0 || (h->stream & 1) == 0)
		return proto_error(c, EPROTO, "even stream id %u", h->stream);
	if (h->stream <= c->last_stream)
		return proto_error(c, EPROTO, "stream id %u reused", h->stream);
	c->last_stream = h->stream;
	struct shim_err e;
	/* (streams a worker has ended are not in flight for the client any more) */
	unsigned inflight = c->nstreams - __atomic_load_n(&c->wire_ended, __ATOMIC_SEQ_CST);
	if (c->srv->shutting_down || inflight >= c->srv->cfg.max_streams) {
		if (c->srv->shutting_down)
			err_set(&e, ECANCELED, NULL, "shim shutting down");
		else
			err_set(&e, EAGAIN, NULL, "too many streams in flight (limit %u)", c->srv->cfg.max_streams);
		uint8_t buf[1600];
		size_t n = disp_pack_error(&e, buf, sizeof(buf));
		conn_send(c, h->stream, FRAME_ERROR, 0, buf, n);
		return 0;
	}
	struct stream *st = stream_new(c, h->stream);
	if (st == NULL) {
		err_set(&e, ENOMEM, NULL, "out of memory");
		conn_fail(c, &e);
		return -1;
	}
	if (disp_request(st, p, h->len, &e) < 0)
		stream_fail(st, &e);
	return 0;
}

static int handle_data(struct conn *c, const struct frame_hdr *h, const uint8_t *p)
{
	struct stream *st = stream_lookup(c, h->stream);
	if (st == NULL)
		return no_such_stream(c, h);
	if (st->client_fin)
		return proto_error(c, EPROTO, "DATA after FIN on stream %u", h->stream);
	if (h->len > st->recv_left)
		return proto_error(c, EPROTO, "flow control violated on stream %u", h->stream);
	st->recv_left -= h->len;
	bool fin = (h->flags & FRAME_FLAG_FIN) != 0;
	if (fin)
		st->client_fin = true;
	struct shim_err e;
	if (st->ops == NULL || st->ops->data == NULL) {
		err_set(&e, EINVAL, NULL, "this request takes no data");
		stream_abort(st, &e);
		return 0;
	}
	if (st->ops->data(st, p, h->len, fin, &e) < 0)
		stream_abort(st, &e);
	return 0;
}

static int handle_window(struct conn *c, const struct frame_hdr *h, const uint8_t *p)
{
	if (h->len != 4)
		return proto_error(c, EPROTO, "WINDOW payload of %u bytes (must be 4)", h->len);
	uint32_t inc = frame_get_u32(p);
	if (inc == 0)
		return proto_error(c, EPROTO, "WINDOW of 0 on stream %u", h->stream);
	struct stream *st = stream_lookup(c, h->stream);
	if (st == NULL)
		return no_such_stream(c, h);
	if (st->send_credit + (int64_t)inc > INT32_MAX)
		return proto_error(c, EPROTO, "WINDOW overflows the credit of stream %u", h->stream);
	st->send_credit += inc;
	if (st->blocked && conn_room(c) > 0) {
		blocked_remove(c, st);
		if (st->ops != NULL && st->ops->writable != NULL)
			st->ops->writable(st);
	} else if (st->blocked) {
		note_budget(c);
	}
	return 0;
}

/* Flags a client may set: FIN on DATA, nothing else (STDERR is the shim's). Other bits
 * are reserved for a later protocol version, which would be negotiated: a v1 peer
 * that sets them is refused, never silently half-understood. */
static int check_flags(struct conn *c, const struct frame_hdr *h)
{
	uint8_t allowed = h->type == FRAME_DATA ? FRAME_FLAG_FIN : 0;
	if ((h->flags & ~allowed) == 0)
		return 0;
	return proto_error(c, EPROTO, "reserved flags 0x%02x on a %s frame", h->flags & ~allowed,
			   frame_type_name(h->type));
}

static int handle_frame(struct conn *c, const struct frame_hdr *h, const uint8_t *p)
{
	struct shim_err e;
	if (c->state == CONN_HELLO) {
		if (h->type != FRAME_HELLO)
			return proto_error(c, EPROTO, "expected HELLO, got %s", frame_type_name(h->type));
		if (h->stream != 0)
			return proto_error(c, EPROTO, "HELLO on stream %u (must be 0)", h->stream);
		if (check_flags(c, h) < 0)
			return -1;
		if (disp_hello(c, p, h->len, &e) < 0) {
			conn_fail(c, &e);
			return -1;
		}
		/* HELLO_OK is queued: from now on the keepalive watches the connection.
		 * Frames the client sent behind its HELLO are handled next, in order. */
		ev_timer_stop(c->srv->loop, &c->handshake);
		if (c->srv->cfg.keepalive > 0) {
			c->keepalive.repeat = c->srv->cfg.keepalive;
			ev_timer_again(c->srv->loop, &c->keepalive);
		}
		return 0;
	}
	switch ((enum frame_type)h->type) {
	case FRAME_HELLO:
		return proto_error(c, EPROTO, "HELLO sent twice");
	case FRAME_HELLO_OK:
	case FRAME_EVENT:
	case FRAME_END:
	case FRAME_ERROR:
		return proto_error(c, EPROTO, "frame type %s may not be sent by a client", frame_type_name(h->type));
	case FRAME_REQUEST:
	case FRAME_DATA:
	case FRAME_WINDOW:
	case FRAME_CANCEL:
	case FRAME_PING:
	case FRAME_PONG:
		break;
	}
	if (check_flags(c, h) < 0)
		return -1;
	switch ((enum frame_type)h->type) {
	case FRAME_REQUEST:
		return handle_request(c, h, p);
	case FRAME_DATA:
		return handle_data(c, h, p);
	case FRAME_WINDOW:
		return handle_window(c, h, p);
	case FRAME_CANCEL: {
		if (h->len != 0)
			return proto_error(c, EPROTO, "CANCEL payload of %u bytes (must be empty)", h->len);
		struct stream *st = stream_lookup(c, h->stream);
		if (st == NULL)
			return no_such_stream(c, h);
		err_set(&e, ECANCELED, NULL, "cancelled");
		stream_abort(st, &e);
		return 0;
	}
	case FRAME_PING:
	case FRAME_PONG:
		if (h->stream != 0)
			return proto_error(c, EPROTO, "%s on stream %u (must be 0)", frame_type_name(h->type),
					   h->stream);
		if (h->len > FRAME_PING_MAX)
			return proto_error(c, EPROTO, "%s payload of %u bytes (limit 64)", frame_type_name(h->type),
					   h->len);
		/* a PONG needs no answer: it counted as input (the keepalive's) */
		if (h->type == FRAME_PING)
			conn_send(c, 0, FRAME_PONG, 0, p, h->len);
		return 0;
	case FRAME_HELLO:
	case FRAME_HELLO_OK:
	case FRAME_EVENT:
	case FRAME_END:
	case FRAME_ERROR:
		break;
	}
	return 0;
}

/* An unfinished frame at least this big is left where it is, when it fits there, rather
 * than moved to the front of the buffer (a DATA frame read across two reads would be
 * copied once more in the daemon). */
#define IN_KEEP_MIN (4u << 10)
/* A buffer grown for a big frame takes room for two such frames (up to this size), so
 * that the next one read behind it mostly fits in place too. */
#define IN_PAIR_MAX (2u * CHUNK_MIN)

/* After process_input() handled the frames before off: keep the rest, an unfinished
 * frame of want bytes in all (0: not known yet), in place or at the front. */
static void in_keep(struct conn *c, size_t off, size_t want)
{
	size_t rest = c->inlen - off;
	if (rest == 0) {
		c->inlen = c->inoff = 0;
		return;
	}
	if (want != 0 && rest >= IN_KEEP_MIN && off + want <= c->incap) {
		c->inoff = off;
		return;
	}
	if (off > 0)
		memmove(c->in, c->in + off, rest);
	c->inlen = rest;
	c->inoff = 0;
}

/* ---- DATA received outside the input buffer ---- */

/* A DATA payload at least this big, whose header ends the bytes read so far, goes from
 * the socket into its op's pipe (stream_ops.data_pipe) when the op has one: splice()
 * moves the socket's pages, where read() and the op's write() would copy them twice. */
#define RX_SPLICE_MIN (16u << 10)
/* After such a payload, reads end at the next frame header for this long, so that the
 * next payload is not read into the buffer along with its header. */
#define RX_BULK_S 1.0

uint64_t conn_rx_spliced, conn_rx_copied;
static bool feeding; /* conn_feed(): the bytes come from its caller, not the socket */

/* The op learns of the bytes spliced into its pipe so far (once the payload is all
 * in, or before the first of its bytes that come through data()). */
static void rx_piped_tell(struct conn *c)
{
	size_t n = c->rx_piped;
	if (n == 0)
		return;
	c->rx_piped = 0;
	struct stream *st = stream_lookup(c, c->rx_stream);
	if (st == NULL || st->ops == NULL)
		return; /* its stream went: its op drops its pipe */
	struct shim_err e;
	if (st->ops->data_piped(st, n, c->rx_fin && c->rx_left == 0, &e) < 0)
		stream_abort(st, &e);
}

/* The rest of the payload is read and given to data(), behind what is in the pipe. */
static void rx_copy_start(struct conn *c)
{
	c->rx_copy = true;
	rx_piped_tell(c);
}

/* The frame's checks (as handle_frame and handle_data make them) pass and its stream's
 * op takes DATA through a pipe: the payload is received by rx_continue(). k of its bytes
 * are in the buffer already (behind the header at c->in + off). */
static bool rx_begin(struct conn *c, const struct frame_hdr *h, size_t off, size_t k)
{
	if (feeding || (h->flags & ~FRAME_FLAG_FIN) != 0)
		return false; /* handle_frame says what is wrong */
	struct stream *st = stream_lookup(c, h->stream);
	if (st == NULL || st->client_fin || h->len > st->recv_left || st->ops == NULL || st->ops->data_pipe == NULL ||
	    st->ops->data_piped == NULL)
		return false;
	int pfd = st->ops->data_pipe(st, h->len);
	if (pfd < 0)
		return false;
	c->rx_bulk_until = mono_s() + RX_BULK_S;
	/* what was read of the payload already goes into the pipe first (a copy of k
	 * bytes, in order); a pipe that does not take it all: the buffered path */
	const uint8_t *p = c->in + off + FRAME_HDR_LEN;
	size_t put = 0;
	while (put < k) {
		ssize_t w = write(pfd, p + put, k - put);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		put += (size_t)w;
	}
	st->recv_left -= h->len;
	bool fin = (h->flags & FRAME_FLAG_FIN) != 0;
	if (fin)
		st->client_fin = true;
	c->rx_stream = h->stream;
	c->rx_left = h->len - put;
	c->rx_piped = put;
	c->rx_fin = fin;
	c->rx_copy = false;
	c->last_rx = mono_s();
	c->ping_out = false;
	if (put < k) {
		/* the rest of what is buffered comes through data(), then the socket's */
		rx_copy_start(c);
		st = stream_lookup(c, c->rx_stream);
		struct shim_err e;
		if (st != NULL && st->ops != NULL && st->ops->data != NULL &&
		    st->ops->data(st, p + put, k - put, fin && c->rx_left == k - put, &e) < 0)
			stream_abort(st, &e);
		c->rx_left -= k - put;
	} else if (c->rx_left == 0) {
		rx_piped_tell(c);
	}
	return true;
}

/* The rest of the payload rx_begin() took on: spliced into the op's pipe while it takes
 * it, else read into the buffer and given to data() (in order: the op queues those
 * behind its pipe). Bytes for a stream gone meanwhile are read and dropped. 1: the
 * payload is all in, 0: wait for the socket, -1: the connection failed. */
static int rx_continue(struct conn *c)
{
	while (c->rx_left > 0) {
		struct stream *st = stream_lookup(c, c->rx_stream);
		int pfd = -1;
		if (!c->rx_copy && st != NULL && st->ops != NULL && st->ops->data_pipe != NULL &&
		    (pfd = st->ops->data_pipe(st, c->rx_piped + c->rx_left)) < 0) {
			rx_copy_start(c);
			continue;
		}
		ssize_t n;
		if (pfd >= 0) {
			n = splice(c->rfd, NULL, pfd, NULL, c->rx_left, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
			if (n < 0 && errno == EAGAIN) {
				/* the socket is empty, or the pipe is full (its slots, not its
				 * bytes, ran out): then the rest is read */
				int avail = 0;
				if (ioctl(c->rfd, FIONREAD, &avail) < 0 || avail == 0)
					return 0;
				rx_copy_start(c);
				continue;
			}
			if (n < 0 && errno != EINTR) {
				/* EINVAL: this fd cannot be spliced from (a tty, say): read it */
				rx_copy_start(c);
				continue;
			}
		} else {
			size_t room = c->rx_left < c->incap ? c->rx_left : c->incap;
			n = read(c->rfd, c->in, room);
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return 0;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			conn_close(c, strerror(errno));
			return -1;
		}
		if (n == 0) {
			struct shim_err e;
			err_set(&e, EPROTO, NULL, "connection closed in the middle of a frame");
			conn_fail(c, &e);
			return -1;
		}
		c->rx_left -= (size_t)n;
		c->last_rx = mono_s();
		c->ping_out = false;
		if (pfd >= 0) {
			conn_rx_spliced += (uint64_t)n;
			c->rx_piped += (size_t)n;
			if (c->rx_left == 0)
				rx_piped_tell(c);
		} else if (st != NULL && st->ops != NULL && st->ops->data != NULL) {
			/* (a stream gone meanwhile: its bytes are dropped) */
			conn_rx_copied += (uint64_t)n;
			struct shim_err e;
			if (st->ops->data(st, c->in, (size_t)n, c->rx_fin && c->rx_left == 0, &e) < 0)
				stream_abort(st, &e);
		}
		if (c->state != CONN_READY || c->doomed != NULL)
			return -1;
	}
	return 1;
}

/* Parse and handle every whole frame in c->in; keep the unfinished tail. */
static void process_input(struct conn *c)
{
	size_t off = c->inoff, want = 0;
	while ((c->state == CONN_HELLO || c->state == CONN_READY) && c->doomed == NULL) {
		struct frame_hdr h;
		enum frame_status fs = frame_check(c->in + off, c->inlen - off, c->max_frame, &h);
		/* PROTOCOL.md 2: an unknown type is refused from its header, before the
		 * payload is waited for (after the length and the malformed checks) */
		if ((fs == FRAME_NEED_MORE || fs == FRAME_OK) && c->inlen - off >= FRAME_HDR_LEN &&
		    h.type > FRAME_TYPE_MAX) {
			proto_error(c, EPROTO, "unknown frame type %u", h.type);
			return;
		}
		if (fs == FRAME_NEED_MORE && c->state == CONN_READY && c->inlen - off >= FRAME_HDR_LEN &&
		    h.type == FRAME_DATA && h.len >= RX_SPLICE_MIN &&
		    rx_begin(c, &h, off, c->inlen - off - FRAME_HDR_LEN)) {
			/* the header and what was read of the payload are taken: the rest
			 * comes from the socket (rx_continue) */
			off = c->inlen;
			break;
		}
		if (fs == FRAME_NEED_MORE) {
			/* make room for the whole frame (its length is already checked) */
			if (c->inlen - off >= FRAME_HDR_LEN)
				want = FRAME_HDR_LEN + (size_t)h.len;
			if (want > c->incap) {
				size_t cap = want <= IN_PAIR_MAX / 2 ? 2 * want : want;
				memmove(c->in, c->in + off, c->inlen - off);
				c->inlen -= off;
				c->inoff = off = 0;
				uint8_t *n = realloc(c->in, cap);
				if (n == NULL) {
					conn_close(c, "out of memory");
					return;
				}
				c->in = n;
				c->incap = cap;
			}
			break;
		}
		if (fs == FRAME_TOO_BIG) {
			struct shim_err e;
			err_set(&e, EMSGSIZE, NULL, "frame of %u bytes exceeds the limit of %u", h.len, c->max_frame);
			conn_fail(c, &e);
			return;
		}
		if (fs == FRAME_BAD) {
			proto_error(c, EPROTO, "malformed frame header (type %u, reserved %u)", h.type, h.reserved);
			return;
		}
		c->last_rx = mono_s();
		c->ping_out = false;
		if (handle_frame(c, &h, c->in + off + FRAME_HDR_LEN) < 0)
			return;
		off += FRAME_HDR_LEN + h.len;
	}
	in_keep(c, off, want);
}

void conn_feed(struct conn *c, const uint8_t *buf, size_t len)
{
	feeding = true;
	while (len > 0 && (c->state == CONN_HELLO || c->state == CONN_READY) && c->doomed == NULL) {
		size_t n = c->incap - c->inlen;
		if (n > len)
			n = len;
		memcpy(c->in + c->inlen, buf, n);
		c->inlen += n;
		buf += n;
		len -= n;
		process_input(c);
	}
	feeding = false;
}

/* Read what the peer has sent (up to 8 reads) and handle the whole frames. A read that
 * took less than the room it had emptied the socket: the next one would only say
 * EAGAIN, so it is left to the loop (its epoll is level-triggered: bytes that come
 * meanwhile wake it at once). A ping costs one read, not two. */
static void conn_read_input(struct conn *c)
{
	for (int rounds = 0; rounds < 8; rounds++) {
		if ((c->state != CONN_HELLO && c->state != CONN_READY) || c->doomed != NULL)
			return;
		if (c->outlen > OUT_STOP_READ) {
			/* resumed by conn_flush once the client reads */
			ev_io_stop(c->srv->loop, &c->rio);
			return;
		}
		if (c->rx_left > 0) {
			int rc = rx_continue(c);
			if (rc <= 0)
				return;
			continue;
		}
		size_t room = c->incap - c->inlen;
		/* a big unfinished frame: read up to its end, so that the buffer is empty
		 * once it is handled and no part of the next frame has to be moved */
		size_t pend = c->inlen - c->inoff;
		bool bulk = c->rx_bulk_until > 0 && mono_s() < c->rx_bulk_until;
		if (pend >= FRAME_HDR_LEN) {
			struct frame_hdr h;
			size_t want = 0;
			if (frame_check(c->in + c->inoff, pend, c->max_frame, &h) == FRAME_NEED_MORE)
				want = FRAME_HDR_LEN + (size_t)h.len;
			if (bulk && want > 0 && want - pend + FRAME_HDR_LEN < room)
				room = want - pend + FRAME_HDR_LEN; /* to the end of the next header */
			else if (want >= IN_KEEP_MIN && want - pend < room)
				room = want - pend;
		} else if (bulk && FRAME_HDR_LEN - pend < room) {
			room = FRAME_HDR_LEN - pend; /* a header alone: its payload may be spliced */
		}
		ssize_t n = read(c->rfd, c->in + c->inlen, room);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			conn_close(c, strerror(errno));
			return;
		}
		if (n == 0) {
			if (c->inlen > c->inoff) {
				/* best effort: the peer may still read after closing its write side */
				struct shim_err e;
				err_set(&e, EPROTO, NULL, "connection closed in the middle of a frame");
				conn_fail(c, &e);
				return;
			}
			/* The client's streams are cancelled, but what is already queued for
			 * it (HELLO_OK, PONG, END...) still goes out: a client that only shut
			 * its write side, or a pipe into --stdio, reads the answers. */
			log_debug("conn %s: peer closed", c->peer);
			conn_drop_streams(c);
			conn_begin_closing(c);
			return;
		}
		/* any byte is a sign of life, also the start of a frame still coming in */
		c->last_rx = mono_s();
		c->ping_out = false;
		c->inlen += (size_t)n;
		process_input(c);
		if ((size_t)n < room)
			return;
	}
}

static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	conn_read_input(container_of(w, struct conn, rio));
}

/* Input first, verdict second: before a timer judges the peer silent, take what the
 * kernel already holds for us. After a pause of the whole daemon (SIGSTOP, a VM
 * paused or snapshotted) an expired timer and the readable socket come due in the
 * same loop iteration, and libev runs the timer first: the PONG the client sent at
 * once would sit unread while the connection is closed for not answering. */
static void conn_take_input(struct conn *c)
{
	if (ev_is_active(&c->rio)) {
		conn_read_input(c);
		return;
	}
	/* reading is paused (the client does not take its output): what waits in the
	 * socket still shows that the peer is there */
	int n = 0;
	if (ioctl(c->rfd, FIONREAD, &n) == 0 && n > 0) {
		c->last_rx = mono_s();
		c->ping_out = false;
	}
}

static void keepalive_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	struct conn *c = container_of(w, struct conn, keepalive);
	conn_take_input(c);
	if (c->state != CONN_READY)
		return;
	double ka = c->srv->cfg.keepalive;
	double idle = mono_s() - c->last_rx;
	if (idle < ka) {
		w->repeat = ka - idle;
		ev_timer_again(loop, w);
		return;
	}
	if (c->ping_out) {
		conn_close(c, "no answer to keepalive PING");
		return;
	}
	if (c->inlen == 0 && c->incap > IN_START) {
		/* an idle connection gives back the room a big frame made it take */
		uint8_t *n = realloc(c->in, IN_START);
		if (n != NULL) {
			c->in = n;
			c->incap = IN_START;
		}
	}
	static const char payload[] = "keepalive";
	conn_send(c, 0, FRAME_PING, 0, payload, sizeof(payload) - 1);
	c->ping_out = true;
	c->last_rx = mono_s();
	w->repeat = ka;
	ev_timer_again(loop, w);
}

/* --handshake-timeout passed without a HELLO accepted (one that came meanwhile is
 * read first): refuse and close. The deadline counts from the accept, not from the
 * last byte, so a client sending its HELLO a byte at a time gains nothing. */
static void handshake_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct conn *c = container_of(w, struct conn, handshake);
	conn_take_input(c);
	if (c->state != CONN_HELLO)
		return;
	struct shim_err e;
	err_set(&e, ETIMEDOUT, NULL, "no HELLO within %g s", c->srv->cfg.handshake_timeout);
	conn_fail(c, &e);
}

/* ---- DATA spliced from a pipe (tunnels, a command's stdout) ---- */

/* Write the frame's header, then splice its payload from the pipe, as far as the
 * socket takes them now. Returns the bytes of the frame (header included) sent. */
static size_t pipe_send_now(struct conn *c, const uint8_t *hdr, int pfd, size_t total)
{
	out_trim(c);
	size_t sent = 0;
	ssize_t w;
	do
		w = write(c->wfd, hdr, FRAME_HDR_LEN);
	while (w < 0 && errno == EINTR);
	if (w > 0)
		sent = (size_t)w;
	while (sent >= FRAME_HDR_LEN && sent < total) {
		w = splice(pfd, NULL, c->wfd, NULL, total - sent, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		if (w > 0)
			sent += (size_t)w;
		else if (w < 0 && errno == EINTR)
			continue;
		else
			break; /* full (EAGAIN), or no splice into this fd: the rest is queued */
	}
	return sent;
}

/* Queue the rest of the frame, sent bytes of it already gone: what is left of the
 * header, then the payload read out of the pipe in pieces of the standard chunk size
 * (reused, no fresh pages for every frame). -1: out of memory, or the pipe short (the
 * connection is doomed). */
static int pipe_queue_rest(struct conn *c, uint32_t id, const uint8_t *hdr, int pfd, size_t total, size_t sent)
{
	if (sent < FRAME_HDR_LEN) {
		if (out_reserve(c, FRAME_HDR_LEN - sent) < 0) {
			conn_doom(c, "out of memory");
			return -1;
		}
		struct obuf_chunk *t = c->out_tail;
		memcpy(t->data + t->len, hdr + sent, FRAME_HDR_LEN - sent);
		t->len += FRAME_HDR_LEN - sent;
	}
	size_t want = total - (sent > FRAME_HDR_LEN ? sent : FRAME_HDR_LEN);
	while (want > 0) {
		struct obuf_chunk *t = c->out_tail;
		if (t == NULL || t->cap == t->len) {
			if (out_reserve(c, want < CHUNK_MIN ? want : CHUNK_MIN) < 0) {
				conn_doom(c, "out of memory");
				return -1;
			}
			t = c->out_tail;
		}
		size_t room = t->cap - t->len;
		ssize_t r = read(pfd, t->data + t->len, want < room ? want : room);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			/* the bytes said to be in the pipe are not there: the frame cannot be finished */
			conn_doom(c, "pipe short");
			return -1;
		}
		t->len += (size_t)r;
		want -= (size_t)r;
	}
	size_t rest = total - sent;
	c->outlen += rest;
	budget_take(rest);
	/* nothing else was queued: the output is this frame's rest only */
	c->direct_rest_id = rest == c->outlen ? id : 0;
	c->want_flush = true;
	return 0;
}

static void pipe_drain(int pfd)
{
	uint8_t sink[4096];
	while (read(pfd, sink, sizeof(sink)) > 0)
		; /* the pipe is left empty for the next frame */
}

size_t stream_send_pipe(struct stream *st, int pfd, size_t len)
{
	struct conn *c = st->conn;
	if (c->state == CONN_DEAD || c->doomed != NULL) {
		pipe_drain(pfd);
		return len;
	}
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = st->id, .type = FRAME_DATA};
	frame_put_hdr(hdr, &h);
	size_t total = FRAME_HDR_LEN + len, sent = 0;
	pthread_mutex_lock(&c->wmu);
	if (c->state == CONN_READY && c->outlen == 0 && c->wedge == NULL)
		sent = pipe_send_now(c, hdr, pfd, total);
	st->send_credit -= (int64_t)len;
	int rc = sent < total ? pipe_queue_rest(c, st->id, hdr, pfd, total, sent) : 0;
	wire_update(c);
	pthread_mutex_unlock(&c->wmu);
	if (rc < 0)
		pipe_drain(pfd);
	return len;
}
