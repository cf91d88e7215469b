/* reader.c: the reader role: read what the shim sends, cut it into frames, route each
 * to its call (queued DATA and EVENT, credit, END, ERROR), answer PINGs, and share the
 * role between waiting threads and background relays. */
#include "internal.h"
#include "pipes.h"

#include <errno.h>
#include <fcntl.h> /* splice */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#define IN_MAX (1u << 20)

/* ---- background relays ---- */

/* With mu held: tell every relay to look again (frames for it, or the reader role). */
void sbx__wake_relays(struct sbx_client *c)
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
void sbx__client_kill(struct sbx_client *c, const struct sbx_error *err)
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
	sbx__wake_relays(c);
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

/* Taken from rx_alloc() or the spare list: not a piped item (whatever it was before). */
static struct rx_item *rx_alloc_data(uint32_t len)
{
	struct rx_item *it = rx_alloc(len);
	if (it != NULL) {
		it->piped = false;
		it->ext = NULL;
	}
	return it;
}

/* ---- DATA read straight into a call's sink ----
 *
 * A call that set a sink (sbx__call_sink) has its big DATA payloads read into the
 * caller's memory, at the place they belong: the part's item (below) becomes an item
 * without room (cap 0) whose ext points into the sink. As such frames come in any size
 * (an echo's are what the shim's pipe held), the reads go frame by frame rather than
 * by guesses: the part's rest and little more than the next header (rx_plan). A frame
 * that is not at its place when it is routed (the sink ended, or more came than it
 * holds) is copied into an item of its own (route_stream). */

/* An item for a payload at ext. */
static struct rx_item *rx_alloc_ext(uint8_t *ext)
{
	struct rx_item *it = malloc(sizeof(*it));
	if (it != NULL) {
		it->piped = false;
		it->ext = ext;
		it->cap = 0;
	}
	return it;
}

static uint8_t *rx_payload(struct rx_item *it)
{
	return it->ext != NULL ? it->ext : it->data;
}

/* With mu held: the item for a sunk payload of which have bytes are in, with its bytes
 * in an item of its own (the sink is not the place for them). NULL when memory is short
 * (it is then freed). */
static struct rx_item *rx_own(struct rx_item *it, uint32_t have)
{
	struct rx_item *n = rx_alloc_data(it->len);
	if (n != NULL) {
		n->type = it->type;
		n->flags = it->flags;
		n->len = it->len;
		n->next = NULL;
		memcpy(n->data, it->ext, have);
	}
	sbx__rx_free(it);
	return n;
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
	struct rx_item *it = rx_alloc_data(h->len);
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

/* With mu held: a frame on stream 0. The ping call a PONG completed, or NULL. */
static struct call *route_conn(struct sbx_client *c, const struct frame_hdr *h, const uint8_t *p,
			       struct pending_pong *pongs, unsigned *npongs)
{
	struct sbx_error e;
	struct call *k;
	switch (h->type) {
	case FRAME_PING:
		if (h->len <= FRAME_PING_MAX && *npongs < 16) {
			pongs[*npongs].len = h->len;
			memcpy(pongs[*npongs].data, p, h->len);
			(*npongs)++;
		}
		return NULL;
	case FRAME_PONG:
		if (h->len != 8)
			return NULL;
		k = find_call(c, 0, (uint64_t)frame_get_u32(p) << 32 | frame_get_u32(p + 4));
		if (k != NULL)
			k->done = true;
		return k;
	case FRAME_ERROR:
		sbx__decode_error(p, h->len, SBX_ERR_PROTOCOL, &e);
		sbx__client_kill(c, &e);
		return NULL;
	default:
		sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "unexpected %s frame on stream 0 from the shim",
			  frame_type_name(h->type));
		sbx__client_kill(c, &e);
		return NULL;
	}
}

/* With mu held: a frame on a call's stream (it as for route()). The call, or NULL when
 * the frame was dropped or killed the connection. */
static struct call *route_stream(struct sbx_client *c, const struct frame_hdr *h, const uint8_t *p, struct rx_item *it)
{
	struct sbx_error e;
	struct call *k = find_call(c, h->stream, 0);
	if (k == NULL || k->abandoned) {
		sbx__rx_free(it);
		return NULL; /* a call we gave up on: late frames are expected */
	}
	if (k->ended) {
		sbx__rx_free(it);
		sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "%s on stream %u, which has ended",
			  frame_type_name(h->type), h->stream);
		sbx__client_kill(c, &e);
		return NULL;
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
			sbx__client_kill(c, &e);
			return NULL;
		}
		k->recv_credit -= h->len;
		if (it != NULL && it->ext != NULL &&
		    !(k->sink != NULL && it->ext == k->sink + k->sink_off && h->len <= k->sink_cap - k->sink_off)) {
			/* not its place: copied out of there, below */
			sbx__rx_free(it);
			it = NULL;
		}
		if (k->sink != NULL) {
			k->sink_off += h->len;
			c->rx_sink_stream = k->id; /* its next frame is read so (rx_plan) */
		}
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
		sbx__client_kill(c, &e);
		return NULL;
	}
	return k;
}

/* With mu held: deliver one frame. Async calls that completed are moved to *done_list.
 * it: NULL, or (a DATA frame on a stream, read straight into its item) the item holding
 * the payload p, which is then queued as it is or freed. */
static void route(struct sbx_client *c, const struct frame_hdr *h, const uint8_t *p, struct rx_item *it,
		  struct pending_pong *pongs, unsigned *npongs, struct call **done_list)
{
	struct call *k = h->stream == 0 ? route_conn(c, h, p, pongs, npongs) : route_stream(c, h, p, it);
	if (k != NULL && k->done && k->on_done != NULL) {
		sbx__unlink_call(c, k);
		k->next = *done_list;
		*done_list = k;
	}
}

void sbx__run_done(struct call *list)
{
	while (list != NULL) {
		struct call *next = list->next;
		list->on_done(list);
		list = next;
	}
}

/* Async calls still registered when the connection died: finish them too. */
struct call *sbx__take_dead_async(struct sbx_client *c)
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

void sbx__call_sink(struct call *k, void *buf, size_t cap)
{
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->mu);
	k->sink = buf;
	k->sink_cap = cap;
	k->sink_off = k->rx_bytes; /* the queued DATA comes first */
	pthread_mutex_unlock(&c->mu);
}

void sbx__call_unsink(struct call *k)
{
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->mu);
	if (k->sink == NULL) {
		pthread_mutex_unlock(&c->mu);
		return;
	}
	k->sink = NULL; /* what lands there from now on is copied out (route_stream) */
	if (c->rx_sink_stream == k->id)
		c->rx_sink_stream = 0;
	while (c->rx_sink_busy == k) {
		/* a read into the sink may wait in poll(): it gives up at a wake-up */
		uint64_t one = 1;
		ssize_t w = write(c->wakefd, &one, sizeof(one));
		(void)w;
		pthread_cond_wait(&c->cv, &c->mu);
	}
	/* no read in flight, none begins without mu: a part begun in the sink moves out */
	if (c->part != NULL && c->part->ext != NULL && c->part_stream == k->id) {
		c->part = rx_own(c->part, c->part_got);
		if (c->part == NULL) {
			struct sbx_error e;
			sbx__fail(&e, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
			sbx__client_kill(c, &e);
		}
	}
	pthread_mutex_unlock(&c->mu);
}

/* DATA payloads at least this big go into a call's pipe when it takes them so (below). */
#define RX_PIPE_MIN (16u << 10)
static bool pipe_part_start(struct sbx_client *c, struct call *k, const struct frame_hdr *h, struct rx_bytes *b);

/* With mu held, by the reader: the frame with header h, whose header was taken from b
 * and whose payload is not all in b, becomes c->part, with all of b. False (b left
 * alone) if it is not worth it or memory is short (the buffered way then fails the
 * call, as for any frame). */
static bool part_start(struct sbx_client *c, const struct frame_hdr *h, struct rx_bytes *b)
{
	if (!rx_direct_worth(c, h))
		return false;
	struct call *k = find_call(c, h->stream, 0);
	if (k->rx_pipe_ok && h->len >= RX_PIPE_MIN && pipe_part_start(c, k, h, b))
		return true;
	bool sink = k->sink != NULL && h->len <= k->sink_cap - k->sink_off;
	struct rx_item *it = sink ? rx_alloc_ext(k->sink + k->sink_off) : rx_alloc_data(h->len);
	if (it == NULL)
		return false;
	it->next = NULL;
	it->type = h->type;
	it->flags = h->flags;
	it->len = h->len;
	c->part = it;
	c->part_stream = h->stream;
	c->part_got = (uint32_t)b->len;
	rx_take(b, rx_payload(it), b->len);
	return true;
}

/* ---- big DATA into a pipe (a tunnel connection's) ----
 *
 * A DATA payload of at least RX_PIPE_MIN bytes for a call that takes them piped
 * (rx_pipe_ok) goes from the socket into the call's pipe with splice(): the item queued
 * for it (piped) holds no bytes, its consumer splices them on from the pipe. What was
 * read of the payload already is written into the pipe first. A pipe out of room (it
 * counts slots, not bytes), or a splice the fd refuses, ends the piped item where it is
 * and takes the rest of the payload the usual way, as a part. */
void sbx__rx_pipe_put(struct rx_pipe *p)
{
	if (p == NULL || --p->refs > 0)
		return;
	close(p->fd[0]);
	close(p->fd[1]);
	free(p);
}

/* With mu held: the call's pipe, made if need be, when n more bytes fit. */
static struct rx_pipe *pipe_room(struct call *k, size_t n)
{
	struct rx_pipe *p = k->rx_pipe;
	if (p == NULL) {
		p = calloc(1, sizeof(*p));
		if (p == NULL)
			return NULL;
		/* twice the credit the shim may have out (the tunnel's extra window too) */
		size_t want = 4 * (size_t)k->client->my_window;
		if ((p->cap = pipe_open(p->fd, want > (1u << 20) ? want : 1u << 20)) == 0) {
			free(p);
			return NULL;
		}
		p->refs = 1;
		k->rx_pipe = p;
	}
	return p->queued + n <= p->cap ? p : NULL;
}

static struct rx_item *rx_marker(const struct frame_hdr *h)
{
	struct rx_item *it = malloc(sizeof(*it));
	if (it == NULL)
		return NULL;
	it->next = NULL;
	it->type = FRAME_DATA;
	it->flags = h->flags;
	it->piped = true;
	it->len = 0;
	it->cap = 0;
	return it;
}

/* With mu held, by the reader: the piped item ends where it is (queued for its call if
 * it holds any bytes, without the frame's FIN), and the rest of the payload
 * (part_pipe_left bytes) becomes an ordinary part, its credit counted again at its end. */
static void pipe_part_fallback(struct sbx_client *c)
{
	struct rx_pipe *p = c->part_pipe;
	struct rx_item *m = c->part_marker;
	uint32_t left = c->part_pipe_left;
	uint8_t flags = m->flags;
	p->queued -= left;
	struct call *k = find_call(c, c->part_stream, 0);
	m->flags &= (uint8_t)~FRAME_FLAG_FIN;
	if (k != NULL && !k->abandoned && k->rx_pipe == p) {
		k->recv_credit += left;
		if (m->len > 0)
			link_rx(k, m);
		else
			sbx__rx_free(m);
	} else {
		sbx__rx_free(m);
	}
	c->part_pipe = NULL;
	c->part_marker = NULL;
	c->part_pipe_left = 0;
	sbx__rx_pipe_put(p);
	struct rx_item *it = rx_alloc_data(left);
	if (it == NULL) {
		struct sbx_error e;
		sbx__fail(&e, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		sbx__client_kill(c, &e);
		return;
	}
	it->next = NULL;
	it->type = FRAME_DATA;
	it->flags = flags;
	it->len = left;
	c->part = it;
	c->part_got = 0;
}

/* With mu held, by the reader: the piped payload is all in: its item goes to its call
 * (or away, the call given up on), and the next read takes a header alone. */
static void pipe_part_done(struct sbx_client *c)
{
	struct rx_pipe *p = c->part_pipe;
	struct rx_item *m = c->part_marker;
	struct call *k = find_call(c, c->part_stream, 0);
	struct frame_hdr h = {.len = m->len, .stream = c->part_stream, .type = FRAME_DATA, .flags = m->flags};
	sbx__trace_frame(c, "<", &h, NULL);
	if (k != NULL && !k->abandoned && !k->ended && k->rx_pipe == p)
		link_rx(k, m);
	else
		sbx__rx_free(m);
	c->part_pipe = NULL;
	c->part_marker = NULL;
	sbx__rx_pipe_put(p);
	c->rx_hdr_only = true;
	c->rx_bulk = true;
}

/* With mu held, by the reader: as part_start(), into k's pipe. The frame's credit is
 * counted now, as route_stream() would at its end. */
static bool pipe_part_start(struct sbx_client *c, struct call *k, const struct frame_hdr *h, struct rx_bytes *b)
{
	if (k->ended || (int64_t)h->len > k->recv_credit)
		return false; /* route_stream() says what is wrong */
	struct rx_pipe *p = pipe_room(k, h->len);
	if (p == NULL)
		return false;
	struct rx_item *m = rx_marker(h);
	if (m == NULL)
		return false;
	/* what was read of the payload: into the pipe (a write of user memory fills whole
	 * pages, within the room counted) */
	size_t put = 0;
	while (put < b->len) {
		const uint8_t *q = (const uint8_t *)b->iov[b->i].iov_base + b->off;
		size_t piece = b->iov[b->i].iov_len - b->off;
		if (piece > b->len)
			piece = b->len;
		ssize_t w = write(p->fd[1], q, piece);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		rx_take(b, NULL, (size_t)w);
		put += (size_t)w;
	}
	k->recv_credit -= h->len;
	p->queued += h->len;
	p->refs++;
	m->len = (uint32_t)put;
	c->part_pipe = p;
	c->part_marker = m;
	c->part_pipe_left = h->len - (uint32_t)put;
	c->part_stream = h->stream;
	if (b->len > 0) {
		/* the pipe took less than that: the rest the usual way */
		pipe_part_fallback(c);
		if (c->part != NULL) {
			c->part_got = (uint32_t)b->len;
			rx_take(b, c->part->data, b->len);
		}
	} else if (c->part_pipe_left == 0) {
		pipe_part_done(c);
	}
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

/* What a read takes beyond a payload going into a sink: a header and small frames. */
#define RX_SINK_PEEK (FRAME_HDR_LEN + 64u)

/* Where such a read puts its bytes: [the part's rest, or nothing], then up to
 * RX_SPEC_MAX times [header][spare payload room], then [header]. */
struct rx_read {
	struct iovec iov[2 + 2 * RX_SPEC_MAX];
	int niov;
	uint8_t hdrs[RX_SPEC_MAX + 1][FRAME_HDR_LEN];
	struct rx_item *spare[RX_SPEC_MAX];
	unsigned nspare;
	uint32_t guess;             /* the payload room of each spare */
	struct call *sink_of;       /* the part's rest goes into this call's sink, or NULL */
	uint8_t tail[RX_SINK_PEEK]; /* then the next header and a little, when it does */
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
		if (p == NULL && h.type == FRAME_DATA && h.stream != 0 && (it = rx_alloc_data(h.len)) != NULL) {
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

/* With mu held, by the reader: lay out the next read in r: into the buffer's free room,
 * or, when the buffer is empty because a part began at the end of what was read or the
 * last read brought big DATA and ended with a whole frame, the part's rest (if any) and
 * the guessed frames; for DATA into a sink, frame by frame. */
static void rx_plan(struct sbx_client *c, struct rx_read *r)
{
	r->niov = 0;
	r->nspare = 0;
	r->guess = 0;
	r->sink_of = NULL;
	if (c->rx_hdr_only && c->part == NULL && c->inlen == 0) {
		/* the next payload may be piped too: leave it in the socket */
		c->rx_hdr_only = false;
		r->iov[r->niov++] = (struct iovec){c->in, FRAME_HDR_LEN};
		return;
	}
	if (c->part != NULL && c->part->ext != NULL) {
		/* the part goes into a sink (it belongs to the sink's call: sbx__call_unsink()
		 * takes it out of the sink it ends), then little more than the next header:
		 * frames come in any size, and the next payload goes where its header says (a
		 * WINDOW before it fits in the room) */
		r->sink_of = find_call(c, c->part_stream, 0);
		r->iov[r->niov++] = (struct iovec){c->part->ext + c->part_got, c->part->len - c->part_got};
		r->iov[r->niov++] = (struct iovec){r->tail, sizeof(r->tail)};
		return;
	}
	if (c->part == NULL && c->inlen < RX_SINK_PEEK && c->rx_sink_stream != 0) {
		/* the stream whose DATA came last into its sink may well send the next frame:
		 * little more than a header, which makes the frame a part (route_buffer) */
		struct call *k = find_call(c, c->rx_sink_stream, 0);
		if (k != NULL && k->sink != NULL) {
			r->iov[r->niov++] = (struct iovec){c->in + c->inlen, RX_SINK_PEEK - c->inlen};
			return;
		}
	}
	if (c->part == NULL && !(c->rx_bulk && c->inlen == 0)) {
		r->iov[r->niov++] = (struct iovec){c->in + c->inlen, c->incap - c->inlen};
		return;
	}
	if (c->part != NULL)
		r->iov[r->niov++] = (struct iovec){c->part->data + c->part_got, c->part->len - c->part_got};
	else
		r->iov[r->niov++] = (struct iovec){NULL, 0};
	r->guess = c->part != NULL && c->part->len > FRAME_DATA_CHUNK ? c->part->len : FRAME_DATA_CHUNK;
	if (r->guess <= RX_STD) {
		/* what the guesses read may have to go into the buffer */
		size_t need = RX_SPEC_MAX * (FRAME_HDR_LEN + (size_t)r->guess) + FRAME_HDR_LEN;
		if (need > c->incap) {
			uint8_t *nb = realloc(c->in, need);
			if (nb != NULL) {
				c->in = nb;
				c->incap = need;
			}
		}
		while (r->nspare < RX_SPEC_MAX &&
		       (r->nspare + 1) * (FRAME_HDR_LEN + (size_t)r->guess) + FRAME_HDR_LEN <= c->incap) {
			struct rx_item *it = rx_alloc_data(r->guess);
			if (it == NULL)
				break;
			r->spare[r->nspare] = it;
			r->iov[r->niov++] = (struct iovec){r->hdrs[r->nspare], FRAME_HDR_LEN};
			r->iov[r->niov++] = (struct iovec){it->data, r->guess};
			r->nspare++;
		}
	}
	r->iov[r->niov++] = (struct iovec){r->hdrs[r->nspare], FRAME_HDR_LEN};
}

/* A read of the room r lays out, noting whether it emptied the socket (it took less
 * than that room, or found nothing). */
static ssize_t rx_read_noted(struct sbx_client *c, const struct rx_read *r)
{
	size_t room = 0;
	for (int i = 0; i < r->niov; i++)
		room += r->iov[i].iov_len;
	ssize_t n = read_iov(c, r->iov, r->niov);
	if (n >= 0 || errno == EAGAIN)
		c->rx_drained = n < 0 || (size_t)n < room;
	return n;
}

/* Wait up to timeout_ms for the socket to be readable (a wake-up through the eventfd is
 * drained on the way). */
static bool rx_wait_input(struct sbx_client *c, int timeout_ms)
{
	struct pollfd pf[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wakefd, .events = POLLIN}};
	int pr = poll(pf, 2, timeout_ms);
	if (pr > 0 && (pf[1].revents & POLLIN)) {
		uint64_t v;
		ssize_t w = read(c->wakefd, &v, sizeof(v));
		(void)w;
	}
	return pr > 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

/* Read as r lays out, waiting up to timeout_ms if nothing is there: bytes read, 0 at
 * end of file, -1 with errno (EAGAIN: nothing was read). While data streams in, it
 * reads first and polls only when nothing is there, which saves a poll() per read. When
 * the last read emptied the socket and no big DATA streams in (a call waiting for its
 * answer: a ping, a stat), it polls first, as the read would only say EAGAIN: one
 * syscall less per call. (A cancel still wakes us: the waiters check their token every
 * round, and the eventfd is drained by the next poll.) */
static ssize_t rx_read_some(struct sbx_client *c, const struct rx_read *r, int timeout_ms)
{
	if (!(c->rx_drained && !c->rx_bulk && timeout_ms != 0)) {
		ssize_t n = rx_read_noted(c, r);
		if (n >= 0 || errno != EAGAIN)
			return n;
	}
	if (!rx_wait_input(c, timeout_ms)) {
		errno = EAGAIN;
		return -1;
	}
	return rx_read_noted(c, r);
}

/* After a read of n > 0 bytes laid out by r: a read into the part's rest either goes on
 * (the part still short) or completes it (returned, and past then holds the bytes read
 * after it); a read that filled the buffer grows it for next time (an idle client keeps
 * the small buffer). */
static struct rx_item *rx_account(struct sbx_client *c, const struct rx_read *r, size_t n, struct rx_bytes *past)
{
	if (r->niov > 1) {
		size_t rest = r->iov[0].iov_len;
		if (n < rest) {
			c->part_got += (uint32_t)n;
			return NULL;
		}
		struct rx_item *whole = c->part;
		c->part = NULL;
		past->len = n - rest;
		return whole;
	}
	if (n == r->iov[0].iov_len && c->incap < IN_MAX) {
		size_t cap = c->incap * 2 > IN_MAX ? IN_MAX : c->incap * 2;
		uint8_t *nb = realloc(c->in, cap);
		if (nb != NULL) {
			c->in = nb;
			c->incap = cap;
		}
	}
	return NULL;
}

/* With mu held, by the reader: route the whole frames in the buffer and move what is left
 * (a frame not all in) to its front, making room for that frame or starting it as the
 * part. A bad frame kills the connection. */
static void route_buffer(struct sbx_client *c, struct pending_pong *pongs, unsigned *npongs, struct call **done_list)
{
	struct sbx_error e;
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
					sbx__client_kill(c, &e);
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
			sbx__client_kill(c, &e);
			break;
		}
		sbx__trace_frame(c, "<", &h, c->in + off + FRAME_HDR_LEN);
		route(c, &h, c->in + off + FRAME_HDR_LEN, NULL, pongs, npongs, done_list);
		off += FRAME_HDR_LEN + h.len;
	}
	memmove(c->in, c->in + off, c->inlen - off);
	c->inlen -= off;
}

/* With mu held, by the reader: route what a read of n > 0 bytes laid out by r brought:
 * the part it completed (whole), the frames read past it, then the buffer's. */
static void route_read_all(struct sbx_client *c, struct rx_read *r, size_t n, struct rx_item *whole,
			   struct rx_bytes *past, struct pending_pong *pongs, unsigned *npongs, struct call **done_list)
{
	bool bulk = c->part != NULL; /* still reading straight into an item */
	if (r->niov == 1) {
		c->inlen += n;
	} else {
		if (whole != NULL) {
			struct frame_hdr h = {.len = whole->len,
					      .stream = c->part_stream,
					      .type = whole->type,
					      .flags = whole->flags};
			sbx__trace_frame(c, "<", &h, rx_payload(whole));
			route(c, &h, rx_payload(whole), whole, pongs, npongs, done_list);
			bulk = true;
		}
		unsigned unused = 0;
		route_read(c, r, past, pongs, npongs, done_list);
		for (unsigned i = 0; i < r->nspare; i++)
			unused += r->spare[i] != NULL;
		bulk = bulk || unused < r->nspare;
	}
	route_buffer(c, pongs, npongs, done_list);
	c->rx_bulk = bulk || c->part != NULL;
}

/* With mu held, on a dead connection: a frame cut short stays so (its call has ended
 * with the connection); the async calls still registered join *done_list. */
static void reader_bury(struct sbx_client *c, struct call **done_list)
{
	sbx__rx_free(c->part);
	c->part = NULL;
	sbx__rx_free(c->part_marker);
	c->part_marker = NULL;
	sbx__rx_pipe_put(c->part_pipe);
	c->part_pipe = NULL;
	struct call *more = sbx__take_dead_async(c);
	while (more != NULL) {
		struct call *next = more->next;
		more->next = *done_list;
		*done_list = more;
		more = next;
	}
}

/* The reader role with a piped payload coming in: splice what is there into the pipe,
 * waiting up to timeout_ms if nothing is. */
static void reader_splice(struct sbx_client *c, int timeout_ms)
{
	int fd1 = c->part_pipe->fd[1];
	ssize_t n = -1;
	int e = 0;
	bool fallback = false;
	for (int tries = 0; tries < 2; tries++) {
		n = splice(c->fd, NULL, fd1, NULL, c->part_pipe_left, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		e = errno;
		if (n >= 0 || e != EAGAIN)
			break;
		/* the socket is empty, or the pipe is full (then the rest is read) */
		int avail = 0;
		if (ioctl(c->fd, FIONREAD, &avail) == 0 && avail > 0) {
			fallback = true;
			break;
		}
		if (tries == 1 || !rx_wait_input(c, timeout_ms))
			return;
	}
	if (n < 0 && e == EINTR)
		return;
	if (n < 0 && !fallback && (e == EINVAL || e == ENOSYS))
		fallback = true; /* no splice from this fd: read it */
	struct call *done_list = NULL;
	pthread_mutex_lock(&c->mu);
	if (n > 0) {
		c->part_marker->len += (uint32_t)n;
		c->part_pipe_left -= (uint32_t)n;
		if (c->part_pipe_left == 0)
			pipe_part_done(c);
	} else if (fallback) {
		pipe_part_fallback(c);
	} else {
		struct sbx_error err;
		if (n == 0)
			sbx__fail(&err, SBX_ERR_CONNECT, ECONNRESET, NULL, "connection closed by the shim");
		else
			sbx__fail(&err, SBX_ERR_CONNECT, e, NULL, "reading from the shim: %s", strerror(e));
		sbx__client_kill(c, &err);
	}
	if (c->dead)
		reader_bury(c, &done_list);
	pthread_cond_broadcast(&c->cv);
	sbx__wake_relays(c);
	pthread_mutex_unlock(&c->mu);
	sbx__run_done(done_list);
}

/* The reader role: read what arrives within timeout_ms, route whole frames. Called
 * without mu, by the one thread holding c->reading. */
static void reader_run(struct sbx_client *c, int timeout_ms)
{
	if (c->part_pipe != NULL) {
		reader_splice(c, timeout_ms);
		return;
	}
	struct rx_read r;
	pthread_mutex_lock(&c->mu);
	rx_plan(c, &r);
	/* a part in a sink: its call does not end the sink until this read is routed */
	c->rx_sink_busy = r.sink_of;
	pthread_mutex_unlock(&c->mu);
	ssize_t n = rx_read_some(c, &r, timeout_ms);
	if (n < 0 && errno == EAGAIN) {
		/* nothing was read */
		if (c->rx_sink_busy != NULL) {
			pthread_mutex_lock(&c->mu);
			c->rx_sink_busy = NULL;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
		}
		for (unsigned i = 0; i < r.nspare; i++)
			sbx__rx_free(r.spare[i]);
		return;
	}
	int read_errno = errno;
	struct rx_item *whole = NULL; /* the part, now complete */
	struct rx_bytes past = {.iov = r.iov, .i = 1, .off = 0, .len = 0};
	if (n > 0)
		whole = rx_account(c, &r, (size_t)n, &past);

	struct pending_pong pongs[16];
	unsigned npongs = 0;
	struct call *done_list = NULL;
	pthread_mutex_lock(&c->mu);
	if (n <= 0) {
		struct sbx_error e;
		if (n == 0)
			sbx__fail(&e, SBX_ERR_CONNECT, ECONNRESET, NULL, "connection closed by the shim");
		else
			sbx__fail(&e, SBX_ERR_CONNECT, read_errno, NULL, "reading from the shim: %s",
				  strerror(read_errno));
		sbx__client_kill(c, &e);
	} else {
		route_read_all(c, &r, (size_t)n, whole, &past, pongs, &npongs, &done_list);
	}
	if (c->dead)
		reader_bury(c, &done_list);
	c->rx_sink_busy = NULL;
	pthread_cond_broadcast(&c->cv);
	if (n > 0)
		sbx__wake_relays(c);
	bool dead = c->dead;
	pthread_mutex_unlock(&c->mu);
	for (unsigned i = 0; i < r.nspare; i++)
		sbx__rx_free(r.spare[i]); /* the guesses not taken (NULL: taken) */
	for (unsigned i = 0; i < npongs && !dead; i++)
		sbx__send(c, 0, FRAME_PONG, 0, pongs[i].data, pongs[i].len, sbx__deadline_after(5000), NULL);
	sbx__run_done(done_list);
}

void sbx__reader_turn(struct sbx_client *c, int timeout_ms)
{
	c->reading = true;
	pthread_mutex_unlock(&c->mu);
	reader_run(c, timeout_ms);
	pthread_mutex_lock(&c->mu);
	c->reading = false;
	pthread_cond_broadcast(&c->cv);
	if (c->role_waiters > 0)
		sbx__wake_relays(c);
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
	sbx__reader_turn(c, 0);
	int rc = 0;
	if (c->dead) {
		sbx__copy_error(err, &c->dead_err);
		rc = -1;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
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
	sbx__wake_relays(c);
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
