/* call.c: one call on a connection: sending frames and REQUESTs, the calls in flight,
 * waiting for what a call needs (frames, credit, its end), cancel tokens, and the generic
 * request path the families build on (start, wait for the Result, file options). */
#include "internal.h"
#include "describe.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h> /* splice */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

uint64_t sbx__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t sbx__deadline_after(int ms)
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
	return sbx__deadline_after(ms);
}

/* Milliseconds until deadline for poll(), capped; 0 if passed. */
int sbx__poll_ms(uint64_t deadline)
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

/* ---- sending ---- */

/* How long a frame whose call timed out half-way through writing it may take to finish. */
#define FINISH_FRAME_MS 5000

/* The connection takes no more for now: wait until it does or the time is up. begun:
 * part of the frame is on the wire, and it is then finished past the deadline
 * (FINISH_FRAME_MS more at most): half a frame would break the stream of frames for
 * every call on this connection. 0: write again; -1 with *e (*broken: it is broken). */
static int out_wait(struct sbx_client *c, uint64_t *deadline, bool begun, bool *late, struct sbx_error *e, bool *broken)
{
	int ms = sbx__poll_ms(*deadline);
	if (ms == 0 && begun && !*late) {
		*late = true;
		*deadline = sbx__now_ns() + (uint64_t)FINISH_FRAME_MS * 1000000u;
		ms = sbx__poll_ms(*deadline);
	}
	if (ms > 0) {
		struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
		poll(&pf, 1, ms); /* ready, timed out or EINTR: look again */
		return 0;
	}
	if (*late) {
		sbx__fail(e, SBX_ERR_CONNECT, ETIMEDOUT, NULL, "the shim stopped reading in the middle of a frame");
		*broken = true;
	} else {
		sbx__fail(e, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out sending to the shim");
	}
	return -1;
}

/* A write failed with en: the connection is lost. */
static void out_lost(struct sbx_error *e, int en, bool *broken)
{
	sbx__fail(e, SBX_ERR_CONNECT, en == EPIPE ? ECONNRESET : en, NULL, "connection to the shim lost: %s",
		  strerror(en));
	*broken = true;
}

/* The end of a failed send: a broken connection fails every call on it. -1. */
static int out_failed(struct sbx_client *c, struct sbx_error *e, bool broken, struct sbx_error *err)
{
	if (broken) {
		pthread_mutex_lock(&c->mu);
		sbx__client_kill(c, e);
		pthread_mutex_unlock(&c->mu);
	}
	sbx__copy_error(err, e);
	return -1;
}

/* Write iov[0..3) from its byte sent on (sendmsg, or writev where the fd is no socket:
 * the exec transport's pipes); the result is the call's. */
static ssize_t out_writev(struct sbx_client *c, const struct iovec *iov, size_t sent)
{
	struct iovec v[3];
	int n = 0;
	for (int i = 0; i < 3; i++) {
		if (sent >= iov[i].iov_len) {
			sent -= iov[i].iov_len;
			continue;
		}
		v[n].iov_base = (uint8_t *)iov[i].iov_base + sent;
		v[n].iov_len = iov[i].iov_len - sent;
		sent = 0;
		n++;
	}
	struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n};
	ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
	if (w < 0 && errno == ENOTSOCK)
		w = writev(c->fd, v, n);
	return w;
}

/* The end of a send that wrote the whole frame: late (finished past the call's deadline),
 * the call still fails. 0 or -1. */
static int out_done(struct sbx_client *c, bool late, struct sbx_error *err)
{
	if (!late)
		return 0;
	struct sbx_error e;
	sbx__fail(&e, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out sending to the shim");
	return out_failed(c, &e, false, err);
}

/* Write one frame, behind the prelen bytes of whole frames at pre (none: 0) in the same
 * write; the caller holds wmu. */
static int send_locked(struct sbx_client *c, const uint8_t *pre, size_t prelen, uint32_t stream, uint8_t type,
		       uint8_t flags, const void *p, size_t len, uint64_t deadline, struct sbx_error *err)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(hdr, &h);
	struct iovec iov[3] = {{(void *)(uintptr_t)pre, prelen}, {hdr, sizeof(hdr)}, {(void *)(uintptr_t)p, len}};
	size_t total = prelen + sizeof(hdr) + len, sent = 0;
	struct sbx_error e;
	bool broken = false, late = false;

	sbx__trace_frame(c, ">", &h, p);
	while (sent < total) {
		ssize_t w = out_writev(c, iov, sent);
		if (w >= 0) {
			sent += (size_t)w;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN) {
			if (out_wait(c, &deadline, sent > 0, &late, &e, &broken) == 0)
				continue;
			return out_failed(c, &e, broken, err);
		}
		out_lost(&e, errno, &broken);
		return out_failed(c, &e, broken, err);
	}
	return out_done(c, late, err);
}

int sbx__send_pipe(struct sbx_client *c, uint32_t stream, int pfd, size_t n, uint64_t deadline, struct sbx_error *err)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)n, .stream = stream, .type = FRAME_DATA};
	frame_put_hdr(hdr, &h);
	struct iovec iov[3] = {{hdr, sizeof(hdr)}, {NULL, 0}, {NULL, 0}};
	size_t sent = 0, total = sizeof(hdr) + n;
	uint8_t *bounce = NULL; /* the payload's rest, read from the pipe, where the fd takes no splice */
	size_t bounce_at = 0;   /* the frame's byte where it begins */
	struct sbx_error e;
	bool broken = false, late = false;
	pthread_mutex_lock(&c->wmu);
	sbx__trace_frame(c, ">", &h, NULL);
	while (sent < total) {
		ssize_t w;
		if (sent < sizeof(hdr) || bounce != NULL) {
			w = out_writev(c, iov, sent - bounce_at);
		} else {
			w = splice(pfd, NULL, c->fd, NULL, total - sent, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
			if (w < 0 && errno == EINVAL) {
				/* this connection takes no splice (nor will it): the rest through
				 * memory, and the callers copy from now on */
				__atomic_store_n(&c->no_splice_out, true, __ATOMIC_RELAXED);
				size_t rest = total - sent, got = 0;
				if ((bounce = malloc(rest)) == NULL) {
					out_lost(&e, ENOMEM, &broken);
					break;
				}
				while (got < rest) {
					ssize_t r = read(pfd, bounce + got, rest - got);
					if (r < 0 && errno == EINTR)
						continue;
					if (r <= 0)
						break;
					got += (size_t)r;
				}
				if (got < rest) {
					out_lost(&e, EIO, &broken);
					break;
				}
				iov[0].iov_base = bounce;
				iov[0].iov_len = rest;
				bounce_at = sent;
				continue;
			}
			if (w == 0) /* the pipe held less than n: the caller's mistake, the frame cannot end */
				errno = EIO;
		}
		if (w > 0) {
			sent += (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			if (out_wait(c, &deadline, sent > 0, &late, &e, &broken) == 0)
				continue;
			break;
		}
		out_lost(&e, errno, &broken);
		break;
	}
	pthread_mutex_unlock(&c->wmu);
	free(bounce);
	if (sent < total)
		return out_failed(c, &e, broken, err);
	return out_done(c, late, err);
}

int sbx__send(struct sbx_client *c, uint32_t stream, uint8_t type, uint8_t flags, const void *p, size_t len,
	      uint64_t deadline, struct sbx_error *err)
{
	pthread_mutex_lock(&c->wmu);
	int rc = send_locked(c, NULL, 0, stream, type, flags, p, len, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

int sbx__send_granting(struct call *k, uint32_t grant, uint8_t type, uint8_t flags, const void *p, size_t len,
		       uint64_t deadline, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	uint8_t win[FRAME_HDR_LEN + 4];
	struct frame_hdr h = {.len = 4, .stream = k->id, .type = FRAME_WINDOW};
	if (grant > 0) {
		/* counted before it is sent: DATA using it cannot arrive earlier */
		pthread_mutex_lock(&c->mu);
		k->recv_credit += grant;
		pthread_mutex_unlock(&c->mu);
		frame_put_hdr(win, &h);
		frame_put_u32(win + FRAME_HDR_LEN, grant);
		sbx__trace_frame(c, ">", &h, win + FRAME_HDR_LEN);
	}
	pthread_mutex_lock(&c->wmu);
	int rc = send_locked(c, win, grant > 0 ? sizeof(win) : 0, k->id, type, flags, p, len, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

/* The id is taken and the REQUEST written under one lock (wmu, held by the caller):
 * ids must reach the shim in increasing order, whatever the threads do. */
static void take_id_locked(struct sbx_client *c, struct call *k)
{
	pthread_mutex_lock(&c->mu);
	k->id = c->next_id;
	c->next_id += 2;
	pthread_mutex_unlock(&c->mu);
}

int sbx__send_request(struct call *k, const void *p, size_t len, uint64_t deadline, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->wmu);
	take_id_locked(c, k);
	int rc = send_locked(c, NULL, 0, k->id, FRAME_REQUEST, 0, p, len, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

int sbx__send_request_data(struct call *k, uint8_t *req, size_t len, uint8_t flags, const void *p, size_t plen,
			   uint64_t deadline, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	pthread_mutex_lock(&c->wmu);
	take_id_locked(c, k);
	struct frame_hdr h = {.len = (uint32_t)len, .stream = k->id, .type = FRAME_REQUEST};
	frame_put_hdr(req, &h);
	sbx__trace_frame(c, ">", &h, req + FRAME_HDR_LEN);
	int rc = send_locked(c, req, FRAME_HDR_LEN + len, k->id, FRAME_DATA, flags, p, plen, deadline, err);
	pthread_mutex_unlock(&c->wmu);
	return rc;
}

void sbx__unlink_call(struct sbx_client *c, struct call *k)
{
	for (struct call **pp = &c->calls; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == k) {
			*pp = k->next;
			c->ncalls--;
			return;
		}
	}
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

void sbx__call_abandon_locked(struct call *k)
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

/* Whether what the caller waits for (a set of SBX__WAIT_ bits) is there. */
static bool wait_over(const struct call *k, unsigned what)
{
	return ((what & SBX__WAIT_FRAME) && k->rx_head != NULL) || ((what & SBX__WAIT_CREDIT) && k->send_credit > 0) ||
	       ((what & SBX__WAIT_SHARED) && k->abandoned);
}

/* Wait with mu held until wait_over(k, what): 0; 1 when the call ended (or the connection
 * died) first; ECANCELED or ETIMEDOUT. Takes the reader role when free. */
static int wait_until(struct call *k, unsigned what, uint64_t deadline, struct sbx_cancel *tok)
{
	struct sbx_client *c = k->client;
	while (!wait_over(k, what)) {
		if (k->done || c->dead)
			return 1;
		if (token_fired(tok))
			return ECANCELED;
		uint64_t now = sbx__now_ns();
		if (now >= deadline)
			return ETIMEDOUT;
		if (!c->reading) {
			sbx__reader_turn(c, sbx__poll_ms(deadline));
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

int sbx__call_wait_for(struct call *k, unsigned what, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err)
{
	struct sbx_client *c = k->client;
	bool shared = what & SBX__WAIT_SHARED;
	bool keep = false; /* a failed wait that leaves the call alive */
	int rc = 0;
	token_attach(tok, c);
	pthread_mutex_lock(&c->mu);
	switch (wait_until(k, what, deadline, tok)) {
	case 0:
		if (shared && k->abandoned) {
			/* another thread gave up on the call (cancel token, failed wait) */
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, NULL, "cancelled");
			keep = true;
		}
		break;
	case 1:
		if ((what & (SBX__WAIT_END_ERR | SBX__WAIT_END_FAILS)) && k->err.kind != SBX_ERR_NONE) {
			sbx__copy_error(err, &k->err);
			rc = -1;
		} else if (what & SBX__WAIT_END_FAILS) {
			/* the stream ended while we wanted to send */
			rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim ended the stream early");
		}
		break; /* else the caller sees the end through sbx__call_done() */
	case ECANCELED:
		rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, NULL, "cancelled");
		break;
	default:
		rc = sbx__fail(err, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out waiting for the shim");
		keep = shared; /* the caller may wait again */
		break;
	}
	/* a failed wait abandons the call (CANCEL goes out) */
	bool send_cancel = false;
	if (rc < 0 && !keep) {
		send_cancel = !k->done && k->id != 0 && !c->dead;
		sbx__call_abandon_locked(k);
	}
	pthread_mutex_unlock(&c->mu);
	if (send_cancel)
		sbx__send(c, k->id, FRAME_CANCEL, 0, NULL, 0, sbx__deadline_after(2000), NULL);
	token_attach(tok, NULL);
	return rc;
}

int64_t sbx__call_credit(struct call *k)
{
	pthread_mutex_lock(&k->client->mu);
	int64_t credit = k->send_credit;
	pthread_mutex_unlock(&k->client->mu);
	return credit;
}

bool sbx__call_done(struct call *k)
{
	pthread_mutex_lock(&k->client->mu);
	bool done = k->done && k->rx_head == NULL;
	pthread_mutex_unlock(&k->client->mu);
	return done;
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
	sbx__call_unsink(k);
	pthread_mutex_lock(&c->mu);
	bool send_cancel = !k->done && !k->abandoned && k->id != 0 && !c->dead;
	sbx__call_abandon_locked(k);
	sbx__unlink_call(c, k);
	sbx__rx_pipe_put(k->rx_pipe); /* the reader may still hold it: then it goes after */
	k->rx_pipe = NULL;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (send_cancel)
		sbx__send(c, k->id, FRAME_CANCEL, 0, NULL, 0, sbx__deadline_after(2000), NULL);
	free(k->result);
	free(k);
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

/* ---- the generic request path ---- */

/* Open a stream with a REQUEST carrying req, and with data the DATA frame (len bytes,
 * flags) that follows it in the same write. */
static struct call *start_request(struct sbx_client *c, const Shim__V1__Request *req, bool with_data, uint8_t flags,
				  const void *data, size_t len, uint64_t deadline, struct sbx_error *err)
{
	struct call *k = sbx__call_new(c, true);
	if (k == NULL) {
		sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	size_t n = shim__v1__request__get_packed_size(req);
	uint8_t small[512];
	uint8_t *buf = n + FRAME_HDR_LEN <= sizeof(small) ? small : malloc(n + FRAME_HDR_LEN);
	if (buf == NULL) {
		sbx__call_free(k);
		sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	shim__v1__request__pack(req, buf + FRAME_HDR_LEN);
	int rc;
	if (with_data) {
		/* counted before it is sent, as by any sender of DATA */
		pthread_mutex_lock(&c->mu);
		k->send_credit -= (int64_t)len;
		pthread_mutex_unlock(&c->mu);
		rc = sbx__send_request_data(k, buf, n, flags, data, len, deadline, err);
	} else {
		rc = sbx__send_request(k, buf + FRAME_HDR_LEN, n, deadline, err);
	}
	if (buf != small)
		free(buf);
	if (rc < 0) {
		sbx__call_free(k);
		return NULL;
	}
	return k;
}

struct call *sbx__start_request(struct sbx_client *c, const Shim__V1__Request *req, uint64_t deadline,
				struct sbx_error *err)
{
	return start_request(c, req, false, 0, NULL, 0, deadline, err);
}

struct call *sbx__start_request_data(struct sbx_client *c, const Shim__V1__Request *req, uint8_t flags,
				     const void *data, size_t len, uint64_t deadline, struct sbx_error *err)
{
	return start_request(c, req, true, flags, data, len, deadline, err);
}

/* Wait for the END of a call that sends nothing more, and decode its Result. */
Shim__V1__Result *sbx__wait_result(struct call *k, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err)
{
	for (;;) {
		if (sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, tok, err) < 0)
			return NULL;
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL)
			break;    /* done */
		sbx__rx_free(it); /* DATA or EVENT this caller does not want */
	}
	if (k->err.kind != SBX_ERR_NONE) {
		sbx__copy_error(err, &k->err);
		return NULL;
	}
	Shim__V1__Result *r = shim__v1__result__unpack(NULL, k->result_len, k->result);
	if (r == NULL)
		sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "undecodable Result from the shim");
	return r;
}

int sbx__fs_options(const struct sbx_call_opts *opts, Shim__V1__Request *req, Shim__V1__FsOptions *fs,
		    struct sbx_error *err)
{
	if (opts == NULL)
		return 0;
	if ((opts->resolve & ~(SBX_RESOLVE_NO_FOLLOW | SBX_RESOLVE_NO_SYMLINKS)) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "unknown resolve flags %#x", opts->resolve);
	bool user = opts->user != NULL && opts->user[0] != '\0';
	bool group = opts->group != NULL && opts->group[0] != '\0';
	if (!user && !group && opts->resolve == 0)
		return 0;
	shim__v1__fs_options__init(fs);
	fs->user = user ? (char *)opts->user : NULL;
	fs->group = group ? (char *)opts->group : NULL;
	if (opts->resolve & SBX_RESOLVE_NO_FOLLOW)
		fs->has_no_follow = fs->no_follow = 1;
	if (opts->resolve & SBX_RESOLVE_NO_SYMLINKS)
		fs->has_no_symlinks = fs->no_symlinks = 1;
	req->fs = fs;
	return 0;
}

/* The requests that take a path and so sbx_call_opts' file options. */
static bool is_file_request(int kind)
{
	switch (kind) {
	case SHIM__V1__REQUEST__KIND_STAT:
	case SHIM__V1__REQUEST__KIND_READ:
	case SHIM__V1__REQUEST__KIND_WRITE:
	case SHIM__V1__REQUEST__KIND_LIST:
	case SHIM__V1__REQUEST__KIND_MKDIR:
	case SHIM__V1__REQUEST__KIND_REMOVE:
	case SHIM__V1__REQUEST__KIND_RENAME:
	case SHIM__V1__REQUEST__KIND_COPY:
	case SHIM__V1__REQUEST__KIND_CHMOD:
	case SHIM__V1__REQUEST__KIND_CHOWN:
	case SHIM__V1__REQUEST__KIND_SYMLINK:
	case SHIM__V1__REQUEST__KIND_READLINK:
	case SHIM__V1__REQUEST__KIND_LINK:
	case SHIM__V1__REQUEST__KIND_TRUNCATE:
	case SHIM__V1__REQUEST__KIND_SET_TIMES:
	case SHIM__V1__REQUEST__KIND_REALPATH:
	case SHIM__V1__REQUEST__KIND_STATFS:
	case SHIM__V1__REQUEST__KIND_WATCH:
	case SHIM__V1__REQUEST__KIND_BACKUP:
	case SHIM__V1__REQUEST__KIND_RESTORE:
		return true;
	default:
		return false;
	}
}

Shim__V1__Result *sbx__call_simple(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
				   int kind, struct sbx_error *err)
{
	Shim__V1__Request with_fs;
	Shim__V1__FsOptions fs;
	if (opts != NULL && is_file_request((int)req->kind_case)) {
		with_fs = *req;
		if (sbx__fs_options(opts, &with_fs, &fs, err) < 0)
			return NULL;
		req = &with_fs;
	}
	uint64_t deadline = sbx__deadline(c, opts);
	struct call *k = sbx__start_request(c, req, deadline, err);
	if (k == NULL)
		return NULL;
	Shim__V1__Result *r = sbx__wait_result(k, deadline, opts ? opts->cancel : NULL, err);
	sbx__call_free(k);
	if (r != NULL && (int)r->kind_case != kind) {
		shim__v1__result__free_unpacked(r, NULL);
		sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim answered with another kind of result");
		return NULL;
	}
	return r;
}

int sbx__download_data(struct call *k, struct sbx__download *d, const struct rx_item *it, uint64_t deadline,
		       const char *path, struct sbx_error *err)
{
	if (d->fin)
		return sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, path, "DATA after FIN from the shim");
	if (it->len > 0) {
		int e = d->sink(d->ud, it->data, it->len);
		if (e != 0)
			return sbx__fail(err, SBX_ERR_LOCAL, e, path, "the sink refused the data: %s", sbx_strerror(e));
		d->got += it->len;
		d->owed += it->len;
	}
	if (it->flags & FRAME_FLAG_FIN) {
		d->fin = true;
		return 0;
	}
	if (d->owed < SBX__DOWNLOAD_GRANT_BATCH)
		return 0;
	uint32_t n = d->owed;
	d->owed = 0;
	return sbx__call_grant(k, n, deadline, err);
}
