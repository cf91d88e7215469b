/* client.c: a connection to a shim: handshake, the reader role, routing frames to calls. */
#include "internal.h"
#include "describe.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define IN_START (64u << 10)
#define IN_MAX (1u << 20)

uint64_t sbx__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_after(int ms)
{
	if (ms < 0)
		return UINT64_MAX;
	return sbx__now_ns() + (uint64_t)ms * 1000000u;
}

uint64_t sbx__deadline(struct sbx_client *c, const struct sbx_call_opts *opts)
{
	int ms = opts != NULL ? opts->timeout_ms : 0;
	if (ms == 0)
		ms = c->default_timeout_ms > 0 ? c->default_timeout_ms : -1;
	return deadline_after(ms);
}

/* Milliseconds until deadline for poll(), capped; 0 if passed. */
static int poll_ms(uint64_t deadline)
{
	if (deadline == UINT64_MAX)
		return 60000;
	uint64_t now = sbx__now_ns();
	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now + 999999u) / 1000000u;
	return ms > 60000 ? 60000 : (int)ms;
}

void sbx__trace_frame(struct sbx_client *c, const char *dir, const struct frame_hdr *h, const uint8_t *p)
{
	if (c->trace == NULL)
		return;
	char line[1200];
	int n = snprintf(line, sizeof(line), "%s ", dir);
	frame_describe(h, p, line + n, sizeof(line) - (size_t)n);
	c->trace(c->trace_ud, line);
}

/* ---- background relays ---- */

/* With mu held: tell every relay to look again (frames for it, or the reader role). */
static void wake_relays(struct sbx_client *c)
{
	uint64_t one = 1;
	for (unsigned i = 0; i < c->nwakers; i++) {
		if (c->wakers[i] == c->pump_fd)
			continue; /* routing for itself: it looks at its calls next anyway */
		ssize_t w = write(c->wakers[i], &one, sizeof(one));
		(void)w;
	}
}

/* ---- the connection dies ---- */

/* With mu held: every call ends with err; the reader stops. */
static void client_kill(struct sbx_client *c, const struct sbx_error *err)
{
	if (c->dead)
		return;
	c->dead = true;
	c->dead_err = *err;
	for (struct call *k = c->calls; k != NULL; k = k->next) {
		if (!k->done) {
			k->done = true;
			k->err = *err;
		}
	}
	pthread_cond_broadcast(&c->cv);
	wake_relays(c);
}

/* ---- sending ---- */

/* How long a frame whose call timed out half-way through writing it may take to finish. */
#define FINISH_FRAME_MS 5000

/* Write one frame; the caller holds wmu. */
static int send_locked(struct sbx_client *c, uint32_t stream, uint8_t type, uint8_t flags, const void *p, size_t len,
		       uint64_t deadline, struct sbx_error *err)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(hdr, &h);
	struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)(uintptr_t)p, len}};
	size_t total = sizeof(hdr) + len, sent = 0;
	struct sbx_error e;
	bool broken = false, late = false;

	sbx__trace_frame(c, ">", &h, p);
	while (sent < total) {
		struct iovec v[2];
		int n = 0;
		size_t skip = sent;
		for (int i = 0; i < 2; i++) {
			if (skip >= iov[i].iov_len) {
				skip -= iov[i].iov_len;
				continue;
			}
			v[n].iov_base = (uint8_t *)iov[i].iov_base + skip;
			v[n].iov_len = iov[i].iov_len - skip;
			skip = 0;
			n++;
		}
		struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n};
		ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && errno == ENOTSOCK)
			w = writev(c->fd, v, n);
		if (w >= 0) {
			sent += (size_t)w;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN) {
			int ms = poll_ms(deadline);
			if (ms == 0 && sent > 0 && !late) {
				/* Half a frame on the wire would break the stream of frames for
				 * every call on this connection: a frame once started is finished,
				 * past this call's deadline if need be; the call still fails. */
				late = true;
				deadline = sbx__now_ns() + (uint64_t)FINISH_FRAME_MS * 1000000u;
				ms = poll_ms(deadline);
			}
			if (ms > 0) {
				struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
				poll(&pf, 1, ms); /* ready, timed out or EINTR: look again */
				continue;
			}
			if (late) {
				sbx__fail(&e, SBX_ERR_CONNECT, ETIMEDOUT, NULL,
					  "the shim stopped reading in the middle of a frame");
				broken = true;
			} else {
				sbx__fail(&e, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out sending to the shim");
			}
			goto fail;
		}
		int en = errno;
		sbx__fail(&e, SBX_ERR_CONNECT, en == EPIPE ? ECONNRESET : en, NULL, "connection to the shim lost: %s",
			  strerror(en));
		broken = true;
		goto fail;
	}
	if (late) {
		sbx__fail(&e, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out sending to the shim");
		goto fail;
	}
	return 0;
fail:
	if (broken) {
		pthread_mutex_lock(&c->mu);
		client_kill(c, &e);
		pthread_mutex_unlock(&c->mu);
	}
	sbx__copy_error(err, &e);
	return -1;
}

int sbx__send(struct sbx_client *c, uint32_t stream, uint8_t type, uint8_t flags, const void *p, size_t len,
	      uint64_t deadline, struct sbx_error *err)
{
	pthread_mutex_lock(&c->wmu);
	int rc = send_locked(c, stream, type, flags, p, len, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

int sbx__send_request(struct call *k, const void *p, size_t len, uint64_t deadline, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	/* The id is taken and the REQUEST written under one lock: ids must reach the
	 * shim in increasing order, whatever the threads do. */
	pthread_mutex_lock(&c->wmu);
	pthread_mutex_lock(&c->mu);
	k->id = c->next_id;
	c->next_id += 2;
	pthread_mutex_unlock(&c->mu);
	int rc = send_locked(c, k->id, FRAME_REQUEST, 0, p, len, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

/* ---- receiving ---- */

struct pending_pong {
	uint32_t len;
	uint8_t data[FRAME_PING_MAX];
};

static struct call *find_call(struct sbx_client *c, uint32_t id, uint64_t seq)
{
	for (struct call *k = c->calls; k != NULL; k = k->next)
		if (k->id == id && (id != 0 || (!k->is_stream && k->ping_seq == seq)))
			return k;
	return NULL;
}

static void unlink_call(struct sbx_client *c, struct call *k)
{
	for (struct call **pp = &c->calls; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == k) {
			*pp = k->next;
			c->ncalls--;
			return;
		}
	}
}

/* Received frames are copied out of the input buffer for their call. DATA comes in
 * frames of at most FRAME_DATA_CHUNK bytes: keep a few such buffers for reuse, so a
 * stream does not make malloc grow and trim the heap (and fault in fresh pages) for
 * every frame. Shared by all clients; frames are freed on any thread. */
#define RX_STD (FRAME_DATA_CHUNK + 64u)
#define RX_SPARE_MAX 64
static pthread_mutex_t rx_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rx_item *rx_spare;
static unsigned rx_nspare;

static struct rx_item *rx_alloc(uint32_t len)
{
	struct rx_item *it = NULL;
	if (len <= RX_STD) {
		pthread_mutex_lock(&rx_mu);
		it = rx_spare;
		if (it != NULL) {
			rx_spare = it->next;
			rx_nspare--;
		}
		pthread_mutex_unlock(&rx_mu);
		if (it != NULL)
			return it;
	}
	uint32_t cap = len <= RX_STD ? RX_STD : len;
	it = malloc(sizeof(*it) + cap);
	if (it != NULL)
		it->cap = cap;
	return it;
}

void sbx__rx_free(struct rx_item *it)
{
	if (it == NULL)
		return;
	if (it->cap == RX_STD) {
		pthread_mutex_lock(&rx_mu);
		if (rx_nspare < RX_SPARE_MAX) {
			it->next = rx_spare;
			rx_spare = it;
			rx_nspare++;
			it = NULL;
		}
		pthread_mutex_unlock(&rx_mu);
	}
	free(it);
}

/* With mu held: append a filled item to the call's queue. */
static void link_rx(struct call *k, struct rx_item *it)
{
	it->next = NULL;
	if (k->rx_tail != NULL)
		k->rx_tail->next = it;
	else
		k->rx_head = it;
	k->rx_tail = it;
	if (it->type == FRAME_DATA)
		k->rx_bytes += it->len;
}

static void queue_rx(struct call *k, const struct frame_hdr *h, const uint8_t *p)
{
	struct rx_item *it = rx_alloc(h->len);
	if (it == NULL) {
		k->done = true;
		sbx__fail(&k->err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		return;
	}
	it->type = h->type;
	it->flags = h->flags;
	it->len = h->len;
	memcpy(it->data, p, h->len);
	link_rx(k, it);
}

/* With mu held: deliver one frame. Async calls that completed are moved to *done_list.
 * it: NULL, or (a DATA frame on a stream, read straight into its item) the item holding
 * the payload p, which is then queued as it is or freed. */
static void route(struct sbx_client *c, const struct frame_hdr *h, const uint8_t *p, struct rx_item *it,
		  struct pending_pong *pongs, unsigned *npongs, struct call **done_list)
{
	struct sbx_error e;
	struct call *k;
	if (h->stream == 0) {
		switch (h->type) {
		case FRAME_PING:
			if (h->len <= FRAME_PING_MAX && *npongs < 16) {
				pongs[*npongs].len = h->len;
				memcpy(pongs[*npongs].data, p, h->len);
				(*npongs)++;
			}
			return;
		case FRAME_PONG:
			if (h->len != 8)
				return;
			k = find_call(c, 0, (uint64_t)frame_get_u32(p) << 32 | frame_get_u32(p + 4));
			if (k != NULL)
				k->done = true;
			break;
		case FRAME_ERROR:
			sbx__decode_error(p, h->len, SBX_ERR_PROTOCOL, &e);
			client_kill(c, &e);
			return;
		default:
			sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "unexpected %s frame on stream 0 from the shim",
				  frame_type_name(h->type));
			client_kill(c, &e);
			return;
		}
	} else {
		k = find_call(c, h->stream, 0);
		if (k == NULL || k->abandoned) {
			sbx__rx_free(it);
			return; /* a call we gave up on: late frames are expected */
		}
		if (k->ended) {
			sbx__rx_free(it);
			sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "%s on stream %u, which has ended",
				  frame_type_name(h->type), h->stream);
			client_kill(c, &e);
			return;
		}
		switch (h->type) {
		case FRAME_DATA:
			/* PROTOCOL.md 8: DATA beyond the credit we granted is a connection error,
			 * however much room there is to queue it */
			if ((int64_t)h->len > k->recv_credit) {
				sbx__rx_free(it);
				sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL,
					  "flow control violated on stream %u (DATA of %u bytes, %lld of credit left)",
					  h->stream, h->len, (long long)k->recv_credit);
				client_kill(c, &e);
				return;
			}
			k->recv_credit -= h->len;
			/* fall through */
		case FRAME_EVENT:
			if (it != NULL)
				link_rx(k, it);
			else
				queue_rx(k, h, p);
			break;
		case FRAME_WINDOW:
			if (h->len == 4)
				k->send_credit += frame_get_u32(p);
			break;
		case FRAME_END:
			k->result = malloc(h->len ? h->len : 1);
			if (k->result == NULL) {
				sbx__fail(&k->err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
			} else {
				memcpy(k->result, p, h->len);
				k->result_len = h->len;
			}
			k->done = k->ended = true;
			break;
		case FRAME_ERROR:
			sbx__decode_error(p, h->len, SBX_ERR_REMOTE, &k->err);
			k->done = k->ended = true;
			break;
		default:
			sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "unexpected %s frame on stream %u from the shim",
				  frame_type_name(h->type), h->stream);
			client_kill(c, &e);
			return;
		}
	}
	if (k != NULL && k->done && k->on_done != NULL) {
		unlink_call(c, k);
		k->next = *done_list;
		*done_list = k;
	}
}

static void run_done(struct call *list)
{
	while (list != NULL) {
		struct call *next = list->next;
		list->on_done(list);
		list = next;
	}
}

/* Async calls still registered when the connection died: finish them too. */
static struct call *take_dead_async(struct sbx_client *c)
{
	struct call *out = NULL;
	for (struct call **pp = &c->calls; *pp != NULL;) {
		struct call *k = *pp;
		if (k->on_done != NULL && k->done) {
			*pp = k->next;
			c->ncalls--;
			k->next = out;
			out = k;
		} else {
			pp = &k->next;
		}
	}
	return out;
}

/* Big DATA payloads are read straight into their items rather than into the input
 * buffer: copying them out of the buffer, and moving a frame begun at its end to its
 * front, would touch every byte of a download twice more after the kernel's copy.
 *
 * Once the bytes read hold the header of a DATA frame for a live call (of at least
 * RX_DIRECT_MIN bytes) but not its whole payload, that frame becomes c->part: its item
 * is allocated and given what was read of the payload, and the next read goes on into
 * it. As one read() per frame would cost more than the copies it saves, that read also
 * guesses that the frames that follow are DATA frames of up to FRAME_DATA_CHUNK bytes,
 * as the frames of a download are: one readv() takes the rest of the part, then
 * RX_SPEC_MAX times a header and a spare item's payload room, then one more header.
 * Each frame whose header landed in a header's place and that is DATA of at most that
 * size (for any call) gets the spare item its payload went to. From a frame shorter
 * than that on, the frames are no longer where the guess put them: they are taken from
 * wherever they are, each copied once (into its own item, or by route() for the
 * others), and spare items not used go back to the pool. A read that brought such
 * frames and ended with a whole one leaves no part: the next read is laid out the same
 * way, without the part's rest. Frames smaller than RX_DIRECT_MIN come the buffered
 * way: the copies cost less than more reads. */
#define RX_DIRECT_MIN (4u << 10)
#define RX_SPEC_MAX 4

/* Bytes a read put in a row of iovecs: len of them, from iov[i] at offset off. */
struct rx_bytes {
	const struct iovec *iov;
	int i;
	size_t off, len;
};

/* Take n of the bytes (n <= b->len), copying them to dst unless it is NULL. */
static void rx_take(struct rx_bytes *b, uint8_t *dst, size_t n)
{
	b->len -= n;
	while (n > 0) {
		size_t k = b->iov[b->i].iov_len - b->off;
		if (k > n)
			k = n;
		if (dst != NULL) {
			memcpy(dst, (const uint8_t *)b->iov[b->i].iov_base + b->off, k);
			dst += k;
		}
		n -= k;
		b->off += k;
		if (b->off == b->iov[b->i].iov_len) {
			b->i++;
			b->off = 0;
		}
	}
}

/* The next n bytes if they lie in one piece (n <= b->len), else NULL. */
static const uint8_t *rx_peek(const struct rx_bytes *b, size_t n)
{
	if (n == 0 || b->iov[b->i].iov_len - b->off < n)
		return n == 0 ? (const uint8_t *)"" : NULL;
	return (const uint8_t *)b->iov[b->i].iov_base + b->off;
}

/* With mu held, by the reader: is the frame with header h a DATA frame worth an item of
 * its own before its payload is all in? */
static bool rx_direct_worth(struct sbx_client *c, const struct frame_hdr *h)
{
	if (h->type != FRAME_DATA || h->stream == 0 || h->len < RX_DIRECT_MIN)
		return false;
	struct call *k = find_call(c, h->stream, 0);
	return k != NULL && !k->abandoned; /* else it is dropped: not worth an item */
}

/* With mu held: would route() drop DATA on this stream (a call given up on)? */
static bool rx_dropped(struct sbx_client *c, uint32_t stream)
{
	struct call *k = find_call(c, stream, 0);
	return k == NULL || k->abandoned;
}

/* With mu held, by the reader: the frame with header h, whose header was taken from b
 * and whose payload is not all in b, becomes c->part, with all of b. False (b left
 * alone) if it is not worth it or memory is short (the buffered way then fails the
 * call, as for any frame). */
static bool part_start(struct sbx_client *c, const struct frame_hdr *h, struct rx_bytes *b)
{
	if (!rx_direct_worth(c, h))
		return false;
	struct rx_item *it = rx_alloc(h->len);
	if (it == NULL)
		return false;
	it->next = NULL;
	it->type = h->type;
	it->flags = h->flags;
	it->len = h->len;
	c->part = it;
	c->part_stream = h->stream;
	c->part_got = (uint32_t)b->len;
	rx_take(b, it->data, b->len);
	return true;
}

static ssize_t read_iov(struct sbx_client *c, const struct iovec *iov, int niov)
{
	ssize_t n;
	do {
		n = niov == 1 ? read(c->fd, iov[0].iov_base, iov[0].iov_len) : readv(c->fd, iov, niov);
	} while (n < 0 && errno == EINTR);
	return n;
}

/* Where such a read puts its bytes: [the part's rest, or nothing], then up to
 * RX_SPEC_MAX times [header][spare payload room], then [header]. */
struct rx_read {
	struct iovec iov[2 + 2 * RX_SPEC_MAX];
	int niov;
	uint8_t hdrs[RX_SPEC_MAX + 1][FRAME_HDR_LEN];
	struct rx_item *spare[RX_SPEC_MAX];
	unsigned nspare;
	uint32_t guess; /* the payload room of each spare */
};

/* With mu held, by the reader: route in order the frames such a read brought past the
 * part's rest (b); what is left (a frame not all in, or one to refuse) goes to the
 * buffer, which is empty. */
static void route_read(struct sbx_client *c, struct rx_read *r, struct rx_bytes *b, struct pending_pong *pongs,
		       unsigned *npongs, struct call **done_list)
{
	while (b->len >= FRAME_HDR_LEN && !c->dead) {
		struct rx_bytes at = *b;
		uint8_t hb[FRAME_HDR_LEN];
		struct frame_hdr h;
		rx_take(&at, hb, FRAME_HDR_LEN);
		enum frame_status fs = frame_check(hb, FRAME_HDR_LEN, c->max_frame, &h);
		if (fs != FRAME_OK && fs != FRAME_NEED_MORE)
			break; /* for the buffer's loop to refuse */
		/* after a header in its place, a spare's room: the guess held */
		unsigned s = (unsigned)(at.i - 2) / 2;
		if (at.off == 0 && at.i >= 2 && at.i % 2 == 0 && s < r->nspare && h.type == FRAME_DATA &&
		    h.stream != 0 && h.len > 0 && h.len <= r->guess) {
			struct rx_item *it = r->spare[s];
			r->spare[s] = NULL;
			it->next = NULL;
			it->type = h.type;
			it->flags = h.flags;
			it->len = h.len;
			if (at.len < h.len) {
				c->part = it;
				c->part_stream = h.stream;
				c->part_got = (uint32_t)at.len;
				rx_take(&at, NULL, at.len);
				*b = at;
				break;
			}
			rx_take(&at, NULL, h.len);
			*b = at;
			sbx__trace_frame(c, "<", &h, it->data);
			if (h.len < r->guess && at.len > 0 && rx_dropped(c, h.stream)) {
				/* the next frames are in its room: route() would free it now */
				r->spare[s] = it;
				continue;
			}
			/* queued, it is still read from (its room's tail) until the end: no
			 * one frees it meanwhile, as taking it off the queue needs mu */
			route(c, &h, it->data, it, pongs, npongs, done_list);
			continue;
		}
		if (at.len < h.len) {
			if (part_start(c, &h, &at))
				*b = at;
			break;
		}
		/* a whole frame elsewhere: copied once, into its item or by route() */
		const uint8_t *p = rx_peek(&at, h.len);
		struct rx_item *it = NULL;
		if (p == NULL && h.type == FRAME_DATA && h.stream != 0 && (it = rx_alloc(h.len)) != NULL) {
			it->next = NULL;
			it->type = h.type;
			it->flags = h.flags;
			it->len = h.len;
			rx_take(&at, it->data, h.len);
			p = it->data;
		} else if (p == NULL) {
			/* another frame across two pieces: put together in the buffer, free
			 * until the end */
			rx_take(&at, c->in, h.len);
			p = c->in;
		} else {
			rx_take(&at, NULL, h.len);
		}
		*b = at;
		sbx__trace_frame(c, "<", &h, p);
		route(c, &h, p, it, pongs, npongs, done_list);
	}
	if (!c->dead) {
		c->inlen = b->len;
		rx_take(b, c->in, b->len);
	}
}

/* The reader role: read what arrives within timeout_ms, route whole frames. Called
 * without mu, by the one thread holding c->reading. */
static void reader_run(struct sbx_client *c, int timeout_ms)
{
	struct sbx_error e;
	ssize_t n;
	struct rx_read r;
	r.niov = 0;
	r.nspare = 0;
	r.guess = 0;
	size_t room = c->incap - c->inlen;
	if (c->part != NULL || (c->rx_bulk && c->inlen == 0)) {
		/* the buffer is empty: a part began at the end of what was read, or the
		 * last read brought big DATA and ended with a whole frame */
		if (c->part != NULL)
			r.iov[r.niov++] = (struct iovec){c->part->data + c->part_got, c->part->len - c->part_got};
		else
			r.iov[r.niov++] = (struct iovec){NULL, 0};
		r.guess = c->part != NULL && c->part->len > FRAME_DATA_CHUNK ? c->part->len : FRAME_DATA_CHUNK;
		if (r.guess <= RX_STD) {
			/* what the guesses read may have to go into the buffer */
			size_t need = RX_SPEC_MAX * (FRAME_HDR_LEN + (size_t)r.guess) + FRAME_HDR_LEN;
			if (need > c->incap) {
				uint8_t *nb = realloc(c->in, need);
				if (nb != NULL) {
					c->in = nb;
					c->incap = need;
				}
			}
			while (r.nspare < RX_SPEC_MAX &&
			       (r.nspare + 1) * (FRAME_HDR_LEN + (size_t)r.guess) + FRAME_HDR_LEN <= c->incap) {
				struct rx_item *it = rx_alloc(r.guess);
				if (it == NULL)
					break;
				r.spare[r.nspare] = it;
				r.iov[r.niov++] = (struct iovec){r.hdrs[r.nspare], FRAME_HDR_LEN};
				r.iov[r.niov++] = (struct iovec){it->data, r.guess};
				r.nspare++;
			}
		}
		r.iov[r.niov++] = (struct iovec){r.hdrs[r.nspare], FRAME_HDR_LEN};
	} else {
		r.iov[r.niov++] = (struct iovec){c->in + c->inlen, room};
	}
	/* Read first, poll only when nothing is there: while data streams in this saves
	 * a poll() per read (a cancel still wakes us: the waiters check their token
	 * every round, and the eventfd is drained by the next poll). */
	n = read_iov(c, r.iov, r.niov);
	if (n < 0 && errno == EAGAIN) {
		struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wakefd, .events = POLLIN}};
		int pr = poll(pf, 2, timeout_ms);
		if (pr <= 0)
			goto out;
		if (pf[1].revents & POLLIN) {
			uint64_t v;
			ssize_t w = read(c->wakefd, &v, sizeof(v));
			(void)w;
		}
		if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0)
			goto out;
		n = read_iov(c, r.iov, r.niov);
		if (n < 0 && errno == EAGAIN)
			goto out;
	}
	struct rx_item *whole = NULL; /* the part, now complete */
	struct rx_bytes past = {.iov = r.iov, .i = 1, .off = 0, .len = 0};
	if (r.niov > 1 && n > 0) {
		size_t rest = r.iov[0].iov_len;
		if ((size_t)n < rest) {
			c->part_got += (uint32_t)n;
		} else {
			whole = c->part;
			c->part = NULL;
			past.len = (size_t)n - rest;
		}
	} else if (n > 0 && (size_t)n == room && c->incap < IN_MAX) {
		/* the socket had more than the buffer holds: read bigger next time (an
		 * idle client keeps the small buffer) */
		size_t cap = c->incap * 2 > IN_MAX ? IN_MAX : c->incap * 2;
		uint8_t *nb = realloc(c->in, cap);
		if (nb != NULL) {
			c->in = nb;
			c->incap = cap;
		}
	}

	struct pending_pong pongs[16];
	unsigned npongs = 0;
	struct call *done_list = NULL;
	pthread_mutex_lock(&c->mu);
	if (n <= 0) {
		if (n == 0)
			sbx__fail(&e, SBX_ERR_CONNECT, ECONNRESET, NULL, "connection closed by the shim");
		else
			sbx__fail(&e, SBX_ERR_CONNECT, errno, NULL, "reading from the shim: %s", strerror(errno));
		client_kill(c, &e);
	} else {
		bool bulk = c->part != NULL; /* still reading straight into an item */
		if (r.niov == 1) {
			c->inlen += (size_t)n;
		} else {
			if (whole != NULL) {
				struct frame_hdr h = {.len = whole->len,
						      .stream = c->part_stream,
						      .type = whole->type,
						      .flags = whole->flags};
				sbx__trace_frame(c, "<", &h, whole->data);
				route(c, &h, whole->data, whole, pongs, &npongs, &done_list);
				bulk = true;
			}
			unsigned unused = 0;
			route_read(c, &r, &past, pongs, &npongs, &done_list);
			for (unsigned i = 0; i < r.nspare; i++)
				unused += r.spare[i] != NULL;
			bulk = bulk || unused < r.nspare;
		}
		size_t off = 0;
		while (!c->dead) {
			struct frame_hdr h;
			enum frame_status fs = frame_check(c->in + off, c->inlen - off, c->max_frame, &h);
			if (fs == FRAME_NEED_MORE) {
				if (c->inlen - off < FRAME_HDR_LEN)
					break;
				struct iovec v = {c->in + off + FRAME_HDR_LEN, c->inlen - off - FRAME_HDR_LEN};
				struct rx_bytes b = {.iov = &v, .i = 0, .off = 0, .len = v.iov_len};
				if (c->part == NULL && part_start(c, &h, &b)) {
					off = c->inlen;
					break;
				}
				size_t need = FRAME_HDR_LEN + (size_t)h.len;
				if (need > c->incap) {
					memmove(c->in, c->in + off, c->inlen - off);
					c->inlen -= off;
					off = 0;
					uint8_t *nb = realloc(c->in, need);
					if (nb == NULL) {
						sbx__fail(&e, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
						client_kill(c, &e);
						break;
					}
					c->in = nb;
					c->incap = need;
				}
				break;
			}
			if (fs != FRAME_OK) {
				sbx__fail(&e, SBX_ERR_PROTOCOL, fs == FRAME_TOO_BIG ? EMSGSIZE : EPROTO, NULL,
					  "bad frame from the shim (%s, %u bytes)", frame_type_name(h.type), h.len);
				client_kill(c, &e);
				break;
			}
			sbx__trace_frame(c, "<", &h, c->in + off + FRAME_HDR_LEN);
			route(c, &h, c->in + off + FRAME_HDR_LEN, NULL, pongs, &npongs, &done_list);
			off += FRAME_HDR_LEN + h.len;
		}
		memmove(c->in, c->in + off, c->inlen - off);
		c->inlen -= off;
		c->rx_bulk = bulk || c->part != NULL;
	}
	if (c->dead) {
		/* a frame cut short stays so: its call has ended with the connection */
		sbx__rx_free(c->part);
		c->part = NULL;
		struct call *more = take_dead_async(c);
		while (more != NULL) {
			struct call *next = more->next;
			more->next = done_list;
			done_list = more;
			more = next;
		}
	}
	pthread_cond_broadcast(&c->cv);
	if (n > 0)
		wake_relays(c);
	bool dead = c->dead;
	pthread_mutex_unlock(&c->mu);
	for (unsigned i = 0; i < r.nspare; i++)
		sbx__rx_free(r.spare[i]); /* the guesses not taken (NULL: taken) */
	for (unsigned i = 0; i < npongs && !dead; i++)
		sbx__send(c, 0, FRAME_PONG, 0, pongs[i].data, pongs[i].len, deadline_after(5000), NULL);
	run_done(done_list);
	return;
out:
	/* nothing was read */
	for (unsigned i = 0; i < r.nspare; i++)
		sbx__rx_free(r.spare[i]);
}

/* ---- calls ---- */

struct call *sbx__call_new(struct sbx_client *c, bool stream)
{
	struct call *k = calloc(1, sizeof(*k));
	if (k == NULL)
		return NULL;
	k->client = c;
	k->start_ns = sbx__now_ns();
	pthread_mutex_lock(&c->mu);
	if (stream) {
		k->is_stream = true; /* the id comes with sbx__send_request() */
		k->send_credit = c->peer_window;
		k->recv_credit = c->my_window;
	} else {
		k->ping_seq = ++c->next_ping;
	}
	k->next = c->calls;
	c->calls = k;
	c->ncalls++;
	if (c->dead) {
		k->done = true;
		k->err = c->dead_err;
	}
	pthread_mutex_unlock(&c->mu);
	return k;
}

static void call_abandon_locked(struct call *k)
{
	k->abandoned = true;
	struct rx_item *it = k->rx_head;
	while (it != NULL) {
		struct rx_item *next = it->next;
		sbx__rx_free(it);
		it = next;
	}
	k->rx_head = k->rx_tail = NULL;
	k->rx_bytes = 0;
}

static bool token_fired(const struct sbx_cancel *tok)
{
	return tok != NULL && __atomic_load_n(&tok->fired, __ATOMIC_ACQUIRE);
}

static void token_attach(struct sbx_cancel *tok, struct sbx_client *c)
{
	if (tok == NULL)
		return;
	pthread_mutex_lock(&tok->mu);
	tok->client = c;
	pthread_mutex_unlock(&tok->mu);
}

/* Wait with mu held until cond(k) or failure. Takes the reader role when free. */
static int wait_until(struct call *k, bool (*cond)(const struct call *), uint64_t deadline, struct sbx_cancel *tok,
		      struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	while (!cond(k)) {
		if (k->done || c->dead)
			return 1; /* caller inspects k->err */
		if (token_fired(tok))
			return sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, NULL, "cancelled");
		uint64_t now = sbx__now_ns();
		if (now >= deadline)
			return sbx__fail(err, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out waiting for the shim");
		if (!c->reading) {
			c->reading = true;
			pthread_mutex_unlock(&c->mu);
			reader_run(c, poll_ms(deadline));
			pthread_mutex_lock(&c->mu);
			c->reading = false;
			pthread_cond_broadcast(&c->cv);
			if (c->role_waiters > 0)
				wake_relays(c);
		} else {
			struct timespec ts;
			uint64_t until = deadline;
			if (until - now > 1000000000u)
				until = now + 1000000000u;
			ts.tv_sec = (time_t)(until / 1000000000u);
			ts.tv_nsec = (long)(until % 1000000000u);
			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		}
	}
	return 0;
}

static bool has_rx(const struct call *k)
{
	return k->rx_head != NULL;
}

static bool has_credit(const struct call *k)
{
	return k->send_credit > 0;
}

/* Common tail of the waits: a failed wait abandons the call (CANCEL goes out). */
static int finish_wait(struct call *k, int rc)
{
	struct sbx_client *c = k->client;
	if (rc < 0) {
		bool send_cancel = !k->done && k->id != 0 && !c->dead;
		call_abandon_locked(k);
		pthread_mutex_unlock(&c->mu);
		if (send_cancel)
			sbx__send(c, k->id, FRAME_CANCEL, 0, NULL, 0, deadline_after(2000), NULL);
		return -1;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

int sbx__call_wait(struct call *k, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	token_attach(tok, c);
	pthread_mutex_lock(&c->mu);
	int rc = wait_until(k, has_rx, deadline, tok, err);
	if (rc == 1) {
		rc = 0;
		if (k->rx_head == NULL && k->err.kind != SBX_ERR_NONE) {
			sbx__copy_error(err, &k->err);
			rc = -1;
		}
	}
	rc = finish_wait(k, rc);
	token_attach(tok, NULL);
	return rc;
}

static bool has_rx_or_credit(const struct call *k)
{
	return k->rx_head != NULL || k->send_credit > 0;
}

int sbx__call_wait_io(struct call *k, bool want_credit, uint64_t deadline, struct sbx_cancel *tok,
		      struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	token_attach(tok, c);
	pthread_mutex_lock(&c->mu);
	int rc = wait_until(k, want_credit ? has_rx_or_credit : has_rx, deadline, tok, err);
	if (rc == 1)
		rc = 0; /* done: the caller sees it through sbx__call_done() */
	rc = finish_wait(k, rc);
	token_attach(tok, NULL);
	return rc;
}

static bool has_rx_or_gone(const struct call *k)
{
	return k->rx_head != NULL || k->abandoned;
}

static bool has_credit_or_gone(const struct call *k)
{
	return k->send_credit > 0 || k->abandoned;
}

int sbx__call_wait_keep(struct call *k, bool want_credit, uint64_t deadline, struct sbx_cancel *tok,
			struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	struct sbx_error e;
	token_attach(tok, c);
	pthread_mutex_lock(&c->mu);
	int rc = wait_until(k, want_credit ? has_credit_or_gone : has_rx_or_gone, deadline, tok, &e);
	if (rc == 1)
		rc = 0; /* done: the caller sees it through sbx__call_done() */
	if (rc == 0 && k->abandoned) {
		/* another thread gave up on the call (cancel token, failed wait) */
		pthread_mutex_unlock(&c->mu);
		rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, NULL, "cancelled");
	} else if (rc < 0 && e.code == ETIMEDOUT) {
		/* the call stays alive: the caller may wait again */
		pthread_mutex_unlock(&c->mu);
		sbx__copy_error(err, &e);
	} else {
		if (rc < 0)
			sbx__copy_error(err, &e);
		rc = finish_wait(k, rc);
	}
	token_attach(tok, NULL);
	return rc;
}

bool sbx__call_done(struct call *k)
{
	pthread_mutex_lock(&k->client->mu);
	bool done = k->done && k->rx_head == NULL;
	pthread_mutex_unlock(&k->client->mu);
	return done;
}

int64_t sbx__call_wait_credit(struct call *k, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	token_attach(tok, c);
	pthread_mutex_lock(&c->mu);
	int rc = wait_until(k, has_credit, deadline, tok, err);
	if (rc == 1) {
		/* the stream ended while we wanted to send */
		if (k->err.kind != SBX_ERR_NONE) {
			sbx__copy_error(err, &k->err);
			rc = -1;
		} else {
			rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim ended the stream early");
		}
	}
	int64_t credit = k->send_credit;
	rc = finish_wait(k, rc);
	token_attach(tok, NULL);
	return rc < 0 ? -1 : credit;
}

struct rx_item *sbx__call_pop(struct call *k)
{
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->mu);
	struct rx_item *it = k->rx_head;
	if (it != NULL) {
		k->rx_head = it->next;
		if (k->rx_head == NULL)
			k->rx_tail = NULL;
		if (it->type == FRAME_DATA)
			k->rx_bytes -= it->len;
	}
	pthread_mutex_unlock(&c->mu);
	return it;
}

int sbx__call_grant(struct call *k, uint32_t n, uint64_t deadline, struct sbx_error *err)
{
	uint8_t p[4];
	if (n == 0)
		return 0;
	/* counted before it is sent: DATA using it cannot arrive earlier */
	pthread_mutex_lock(&k->client->mu);
	k->recv_credit += n;
	pthread_mutex_unlock(&k->client->mu);
	frame_put_u32(p, n);
	return sbx__send(k->client, k->id, FRAME_WINDOW, 0, p, sizeof(p), deadline, err);
}

void sbx__call_free(struct call *k)
{
	if (k == NULL)
		return;
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->mu);
	bool send_cancel = !k->done && !k->abandoned && k->id != 0 && !c->dead;
	call_abandon_locked(k);
	unlink_call(c, k);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (send_cancel)
		sbx__send(c, k->id, FRAME_CANCEL, 0, NULL, 0, deadline_after(2000), NULL);
	free(k->result);
	free(k);
}

/* ---- connecting ---- */

static int client_init(struct sbx_client *c, int fd, pid_t child, const struct sbx_connect_opts *o,
		       struct sbx_error *err)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	c->fd = fd;
	c->child = child;
	c->pump_fd = -1;
	c->next_id = 1;
	c->max_frame = FRAME_HELLO_MAX;
	c->my_window = FRAME_DEFAULT_WINDOW;
	c->default_timeout_ms = o->default_timeout_ms;
	c->trace = o->trace;
	c->trace_ud = o->trace_ud;
	c->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->in = malloc(IN_START);
	c->incap = IN_START;
	if (c->wakefd < 0 || c->in == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, c->wakefd < 0 ? errno : ENOMEM, NULL, "client set-up");
	return 0;
}

static void client_destroy(struct sbx_client *c)
{
	while (c->calls != NULL) {
		struct call *k = c->calls;
		c->calls = k->next;
		call_abandon_locked(k);
		free(k->result);
		free(k);
	}
	if (c->fd >= 0)
		close(c->fd);
	if (c->wakefd >= 0)
		close(c->wakefd);
	if (c->child > 0)
		sbx__transport_reap(c->child);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->wmu);
	pthread_cond_destroy(&c->cv);
	sbx__rx_free(c->part);
	free(c->in);
	free(c->strings);
	free(c);
}

/* Keep HelloReply's strings in one block owned by the client. */
static int keep_info(struct sbx_client *c, const Shim__V1__HelloReply *r)
{
	size_t flen = 1;
	for (size_t i = 0; i < r->n_features; i++)
		flen += strlen(r->features[i]) + 1;
	const char *host = r->hostname ? r->hostname : "";
	const char *boot = r->boot_id ? r->boot_id : "";
	size_t total = strlen(r->shim_version) + 1 + flen + strlen(host) + 1 + strlen(boot) + 1;
	char *s = malloc(total);
	if (s == NULL)
		return -1;
	c->strings = s;
	c->info.shim_version = s;
	s = stpcpy(s, r->shim_version) + 1;
	c->info.features = s;
	*s = '\0';
	for (size_t i = 0; i < r->n_features; i++) {
		if (i > 0)
			s = stpcpy(s, " ");
		s = stpcpy(s, r->features[i]);
	}
	s++;
	c->info.hostname = s;
	s = stpcpy(s, host) + 1;
	c->info.boot_id = s;
	stpcpy(s, boot);
	c->info.protocol_version = r->protocol_version;
	c->info.max_frame = r->max_frame;
	c->info.pid = r->pid;
	c->info.pid1 = r->pid1;
	c->info.uid = r->uid;
	return 0;
}

/* A shim that refuses a connection (connection limit, peer uid) sends ERROR and
 * closes at once, possibly before our HELLO arrives: sending HELLO then fails with
 * EPIPE, but the ERROR saying why is already waiting to be read. If it is, put it in
 * err and return true. */
static bool refusal_pending(struct sbx_client *c, struct sbx_error *err)
{
	while (c->inlen < c->incap) {
		ssize_t r = read(c->fd, c->in + c->inlen, c->incap - c->inlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		c->inlen += (size_t)r;
	}
	struct frame_hdr fh;
	if (frame_check(c->in, c->inlen, FRAME_HELLO_MAX, &fh) != FRAME_OK || fh.type != FRAME_ERROR || fh.stream != 0)
		return false;
	sbx__trace_frame(c, "<", &fh, c->in + FRAME_HDR_LEN);
	sbx__decode_error(c->in + FRAME_HDR_LEN, fh.len, SBX_ERR_CONNECT, err);
	return true;
}

/* Send HELLO and read frames until HELLO_OK or ERROR. *retry: the peer went away
 * before answering (a shim still starting, or an exec: child that exited). */
static int handshake(struct sbx_client *c, const char *token, const char *name, uint64_t deadline, bool *retry,
		     struct sbx_error *err)
{
	Shim__V1__Hello h = SHIM__V1__HELLO__INIT;
	h.protocol_version = SBX_PROTOCOL_VERSION;
	h.client_name = (char *)(uintptr_t)name;
	if (token != NULL && token[0] != '\0') {
		h.has_token = 1;
		h.token.data = (uint8_t *)(uintptr_t)token;
		h.token.len = strlen(token);
	}
	h.has_max_frame = h.has_initial_window = 1;
	h.max_frame = FRAME_DEFAULT_MAX;
	h.initial_window = c->my_window;
	uint8_t buf[8192];
	size_t n = shim__v1__hello__get_packed_size(&h);
	if (n > sizeof(buf))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "token too long");
	shim__v1__hello__pack(&h, buf);
	if (sbx__send(c, 0, FRAME_HELLO, 0, buf, n, deadline, err) < 0) {
		if (refusal_pending(c, err))
			return -1;
		*retry = true;
		err->kind = SBX_ERR_CONNECT;
		return -1;
	}
	for (;;) {
		struct frame_hdr fh;
		enum frame_status fs = frame_check(c->in, c->inlen, FRAME_HELLO_MAX, &fh);
		if (fs == FRAME_OK)
			break;
		if (fs != FRAME_NEED_MORE)
			return sbx__fail(err, SBX_ERR_CONNECT, EPROTO, NULL,
					 "the peer does not speak shim protocol v1 (bad frame header)");
		int ms = poll_ms(deadline);
		struct pollfd pf = {.fd = c->fd, .events = POLLIN};
		if (ms == 0 || poll(&pf, 1, ms) == 0)
			return sbx__fail(err, SBX_ERR_CONNECT, ETIMEDOUT, NULL, "timed out waiting for the handshake");
		ssize_t r = read(c->fd, c->in + c->inlen, c->incap - c->inlen);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0) {
			*retry = true;
			return sbx__fail(err, SBX_ERR_CONNECT, r == 0 ? ECONNRESET : errno, NULL,
					 "connection closed before the handshake completed");
		}
		c->inlen += (size_t)r;
	}
	struct frame_hdr fh;
	frame_get_hdr(c->in, &fh);
	const uint8_t *p = c->in + FRAME_HDR_LEN;
	sbx__trace_frame(c, "<", &fh, p);
	int rc = 0;
	if (fh.type == FRAME_ERROR) {
		sbx__decode_error(p, fh.len, SBX_ERR_CONNECT, err);
		rc = -1;
	} else if (fh.type != FRAME_HELLO_OK || fh.stream != 0) {
		rc = sbx__fail(err, SBX_ERR_CONNECT, EPROTO, NULL, "expected HELLO_OK, got %s",
			       frame_type_name(fh.type));
	} else {
		Shim__V1__HelloReply *r = shim__v1__hello_reply__unpack(NULL, fh.len, p);
		if (r == NULL) {
			rc = sbx__fail(err, SBX_ERR_CONNECT, EBADMSG, NULL, "cannot decode HelloReply");
		} else if (r->protocol_version != SBX_PROTOCOL_VERSION) {
			rc = sbx__fail(err, SBX_ERR_CONNECT, EPROTONOSUPPORT, NULL,
				       "the shim speaks protocol %u, this library %d", r->protocol_version,
				       SBX_PROTOCOL_VERSION);
		} else if (keep_info(c, r) < 0) {
			rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		} else {
			uint32_t mf = r->max_frame;
			c->max_frame = mf < FRAME_MIN_MAX ? FRAME_MIN_MAX : mf > FRAME_ABS_MAX ? FRAME_ABS_MAX : mf;
			c->peer_window = r->initial_window > INT32_MAX ? INT32_MAX : r->initial_window;
		}
		if (r != NULL)
			shim__v1__hello_reply__free_unpacked(r, NULL);
	}
	size_t used = FRAME_HDR_LEN + fh.len;
	memmove(c->in, c->in + used, c->inlen - used);
	c->inlen -= used;
	return rc;
}

/* A client on fd (and child), which it owns from here on, also on failure: set up,
 * then the handshake. */
static int client_start(int fd, pid_t child, const struct sbx_connect_opts *o, const char *token, uint64_t deadline,
			struct sbx_client **out, bool *retry, struct sbx_error *err)
{
	struct sbx_client *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		close(fd);
		sbx__transport_reap(child);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	c->wakefd = -1;
	if (client_init(c, fd, child, o, err) < 0) {
		client_destroy(c);
		return -1;
	}
	char name[64];
	snprintf(name, sizeof(name), "libsbx/%s", SBX_VERSION);
	if (handshake(c, token, o->client_name ? o->client_name : name, deadline, retry, err) < 0) {
		client_destroy(c);
		return -1;
	}
	*out = c;
	return 0;
}

static int connect_once(const char *target, const struct sbx_connect_opts *o, const char *token,
			struct sbx_client **out, bool *retry, struct sbx_error *err)
{
	int timeout = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000;
	uint64_t deadline = deadline_after(timeout);
	int fd;
	pid_t child = 0;
	*retry = false;
	if (sbx__transport_open(target, timeout, &fd, &child, retry, err) < 0)
		return -1;
	return client_start(fd, child, o, token, deadline, out, retry, err);
}

int sbx__client_adopt(int fd, const struct sbx_connect_opts *opts, struct sbx_client **out, struct sbx_error *err)
{
	/* opts is the caller's own: this library's struct, whole */
	int timeout = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
	bool retry = false;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return client_start(fd, 0, opts, opts->token, deadline_after(timeout), out, &retry, err);
}

SBX_API int sbx_connect(const char *target, const struct sbx_connect_opts *opts, struct sbx_client **out,
			struct sbx_error *err)
{
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	if (opts != NULL && sbx__struct_in(&o, sizeof(o), opts, "sbx_connect_opts", err) < 0)
		return -1;
	if (target == NULL)
		target = getenv("SBX_TARGET");
	if (target == NULL || target[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no target given and SBX_TARGET is not set");
	/* $SBX_TOKEN is for the shims one connects to; an exec: target's command is
	 * spawned by us and gets a token only when the caller gives one (issue 17.7) */
	const char *token = o.token != NULL ? o.token : strncmp(target, "exec:", 5) == 0 ? NULL : getenv("SBX_TOKEN");
	uint64_t wait_until_ns = o.wait_ms > 0 ? deadline_after(o.wait_ms) : 0;
	unsigned backoff_ms = 10;
	for (;;) {
		bool retry;
		struct sbx_error e;
		if (connect_once(target, &o, token, out, &retry, &e) == 0)
			return 0;
		uint64_t now = sbx__now_ns();
		if (!retry || now >= wait_until_ns) {
			sbx__copy_error(err, &e);
			return -1;
		}
		/* the last sleep is cut short so that one more attempt falls on the deadline */
		uint64_t left_ms = (wait_until_ns - now + 999999u) / 1000000u;
		unsigned ms = backoff_ms < left_ms ? backoff_ms : (unsigned)left_ms;
		struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
		nanosleep(&ts, NULL);
		backoff_ms = backoff_ms * 2 > 500 ? 500 : backoff_ms * 2;
	}
}

SBX_API void sbx_client_close(struct sbx_client *c)
{
	if (c == NULL)
		return;
	struct sbx_error e;
	sbx__fail(&e, SBX_ERR_LOCAL, ECONNABORTED, NULL, "client closed");
	pthread_mutex_lock(&c->mu);
	client_kill(c, &e);
	struct call *done_list = take_dead_async(c);
	pthread_mutex_unlock(&c->mu);
	run_done(done_list);
	/* wake a reader in poll; it finds the client dead and returns */
	uint64_t one = 1;
	ssize_t w = write(c->wakefd, &one, sizeof(one));
	(void)w;
	pthread_mutex_lock(&c->mu);
	while (c->reading)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	client_destroy(c);
}

SBX_API const struct sbx_server_info *sbx_client_server(const struct sbx_client *c)
{
	return &c->info;
}

SBX_API int sbx_client_has_feature(const struct sbx_client *c, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = c->info.features; p != NULL && *p != '\0';) {
		const char *sp = strchr(p, ' ');
		size_t len = sp ? (size_t)(sp - p) : strlen(p);
		if (len == n && memcmp(p, name, n) == 0)
			return 1;
		p = sp ? sp + 1 : NULL;
	}
	return 0;
}

SBX_API int sbx_client_fd(const struct sbx_client *c)
{
	return c->fd;
}

SBX_API int sbx_client_process(struct sbx_client *c, struct sbx_error *err)
{
	pthread_mutex_lock(&c->mu);
	if (c->dead) {
		sbx__copy_error(err, &c->dead_err);
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	if (c->reading) {
		/* another thread is reading and will route what arrives */
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	c->reading = true;
	pthread_mutex_unlock(&c->mu);
	reader_run(c, 0);
	pthread_mutex_lock(&c->mu);
	c->reading = false;
	pthread_cond_broadcast(&c->cv);
	if (c->role_waiters > 0)
		wake_relays(c);
	int rc = 0;
	if (c->dead) {
		sbx__copy_error(err, &c->dead_err);
		rc = -1;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

SBX_API unsigned sbx_client_pending(struct sbx_client *c)
{
	pthread_mutex_lock(&c->mu);
	unsigned n = c->ncalls;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* ---- cancel tokens ---- */

SBX_API struct sbx_cancel *sbx_cancel_new(void)
{
	struct sbx_cancel *t = calloc(1, sizeof(*t));
	if (t != NULL)
		pthread_mutex_init(&t->mu, NULL);
	return t;
}

SBX_API void sbx_cancel_fire(struct sbx_cancel *t)
{
	if (t == NULL)
		return;
	pthread_mutex_lock(&t->mu);
	__atomic_store_n(&t->fired, true, __ATOMIC_RELEASE);
	struct sbx_client *c = t->client;
	if (c != NULL) {
		/* wake both kinds of waiter: a reader in poll and threads on the condvar */
		uint64_t one = 1;
		ssize_t w = write(c->wakefd, &one, sizeof(one));
		(void)w;
		pthread_mutex_lock(&c->mu);
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
	pthread_mutex_unlock(&t->mu);
}

SBX_API void sbx_cancel_reset(struct sbx_cancel *t)
{
	if (t != NULL)
		__atomic_store_n(&t->fired, false, __ATOMIC_RELEASE);
}

SBX_API int sbx_cancel_fired(const struct sbx_cancel *t)
{
	return token_fired(t);
}

SBX_API void sbx_cancel_free(struct sbx_cancel *t)
{
	if (t == NULL)
		return;
	pthread_mutex_destroy(&t->mu);
	free(t);
}

/* ---- background relays (tunnel.c) ---- */

int sbx__client_add_waker(struct sbx_client *c, int fd, struct sbx_error *err)
{
	pthread_mutex_lock(&c->mu);
	if (c->nwakers >= SBX_MAX_WAKERS) {
		pthread_mutex_unlock(&c->mu);
		return sbx__fail(err, SBX_ERR_LOCAL, EMFILE, NULL, "too many tunnels on one client (limit %d)",
				 SBX_MAX_WAKERS);
	}
	c->wakers[c->nwakers++] = fd;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

void sbx__client_del_waker(struct sbx_client *c, int fd)
{
	pthread_mutex_lock(&c->mu);
	for (unsigned i = 0; i < c->nwakers; i++) {
		if (c->wakers[i] == fd) {
			c->wakers[i] = c->wakers[--c->nwakers];
			break;
		}
	}
	/* another relay may be waiting for the reader role this one held */
	wake_relays(c);
	pthread_mutex_unlock(&c->mu);
}

int sbx__pump(struct sbx_client *c, int self_fd, struct pollfd *fds, unsigned nfds, int timeout_ms,
	      struct sbx_error *err)
{
	pthread_mutex_lock(&c->mu);
	if (c->dead) {
		sbx__copy_error(err, &c->dead_err);
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	bool mine = !c->reading;
	if (mine) {
		c->reading = true;
		c->pump_fd = self_fd;
	} else {
		c->role_waiters++;
	}
	pthread_mutex_unlock(&c->mu);
	fds[0].fd = mine ? c->fd : -1;
	fds[0].events = POLLIN;
	fds[1].fd = mine ? c->wakefd : -1;
	fds[1].events = POLLIN;
	fds[0].revents = fds[1].revents = 0;
	int r = poll(fds, nfds, timeout_ms);
	if (r < 0)
		r = 0; /* EINTR: just another round */
	if (mine) {
		if (fds[1].revents & POLLIN) {
			uint64_t v;
			ssize_t w = read(c->wakefd, &v, sizeof(v));
			(void)w;
		}
		if (fds[0].revents & (POLLIN | POLLHUP | POLLERR))
			reader_run(c, 0);
	}
	pthread_mutex_lock(&c->mu);
	if (mine) {
		c->reading = false;
		c->pump_fd = -1;
		pthread_cond_broadcast(&c->cv);
	} else {
		c->role_waiters--;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}
