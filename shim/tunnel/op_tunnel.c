/* op_tunnel.c: TCP tunnels: reverse listeners and forward connections inside the sandbox, relayed over streams.
 *
 * A tunnel is one long-lived stream (tunnel_listen or tunnel_forward) that owns its
 * connections; every connection is a stream of its own (tunnel_connect, tunnel_accept)
 * carrying the bytes as DATA with the usual per-stream credit. All sockets are
 * non-blocking and watched by the loop; addresses are numeric, so nothing here can
 * stall the loop on a name lookup. A connection's bulk reads are spliced to the client
 * (socket -> pipe -> connection: stream_send_pipe), small ones copied; the client's big
 * DATA comes the other way the same (connection -> pipe -> socket: conn.c's data_pipe). */
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "log.h"
#include "netaddr.h"
#include "op.h"
#include "ops.h"
#include "pipes.h"
#include "server.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TUN_MAX 256        /* tunnels in the whole daemon */
#define TUN_PENDING_MAX 64 /* accepted connections not yet claimed, per tunnel */
#define TUN_ACCEPT_TIMEOUT_MS 10000u
#define TUN_CONNECT_TIMEOUT_MS 10000u
#define TUN_ACCEPT_ROUNDS 16 /* accept() calls per wake-up, so one busy listener cannot hog the loop */
#define TUN_READ_ROUNDS 4    /* reads per wake-up and connection, for the same reason */
/* Extra DATA credit each way on a relayed connection (one WINDOW at the start): a deeper
 * pipe for one fast connection; it is also what the shim may buffer for a slow socket. */
#define TUN_EXTRA_WINDOW (256u << 10)
#define TUN_OWNER_OUT_MAX (4u << 20) /* accepting pauses while the owner's output is this big */
#define TUN_GRANT_MIN (64u << 10)    /* credit goes back in WINDOWs of this much at least */

enum tun_kind { TUN_FORWARD = 1, TUN_REVERSE = 2 };

struct tpending {
	struct tpending *next;
	uint64_t id;
	int fd;
	double at; /* mono_s */
};

struct tconn;

struct tunnel {
	struct tunnel *next;
	char id[16];
	enum tun_kind kind;
	struct op *op; /* the tunnel's own request (its stream: op->st); the tunnel is its op->data */
	char host[64]; /* inside: listened on (reverse) or connected to (forward) */
	uint32_t port;
	char remote[128];
	int lfd; /* reverse: the listening socket */
	ev_io lio;
	int lfd6; /* reverse on a loopback name: the [::1] one beside lfd's 127.0.0.1 (-1: none) */
	ev_io lio6;
	ev_timer ptimer; /* expires unclaimed connections; retries accept after EMFILE */
	struct tpending *pending;
	unsigned npending;
	double accept_timeout;
	uint64_t next_conn;
	struct tconn *conns;
	unsigned active;
	uint64_t total, bytes_in, bytes_out;
};

struct tconn {
	struct tconn *next, *prev;
	struct tunnel *t; /* NULL: a connection outside any tunnel (or out of it: tc_detach) */
	struct op *op;    /* its request (connect or accept); the tconn is its op->data */
	int fd;
	ev_io rio, wio;
	ev_timer ctimer;
	bool connecting;
	bool eof_sent;   /* the socket reached EOF and DATA FIN went to the client */
	bool client_fin; /* the client's FIN arrived */
	bool shut_wr;    /* ... and was passed on with shutdown(SHUT_WR) */
	bool bulk;       /* reads come big: splice them (small ones are cheaper copied) */
	uint32_t owed;   /* client bytes written to the socket, credit not handed back yet */
	uint8_t *wbuf;   /* client bytes the socket did not take yet; at most the credit granted */
	size_t woff, wlen, wcap;
	/* Big DATA from the client comes spliced into this pipe (conn.c's data_pipe) and
	 * goes on spliced into the socket: rpiped bytes in it, older than wbuf's. */
	int rpipe[2];
	size_t rpiped, rpipe_size;
	uint64_t bytes_in, bytes_out;
	char target[80];
};

static struct tunnel *tunnels;
static unsigned ntunnels;
static uint64_t next_tunnel = 1;
/* One socket read's worth: up to this much goes out per read, several DATA frames in one
 * writev when the connection's output is empty (stream_send_direct). */
#define TUN_RBUF (256u << 10)
/* A read of TUN_BULK_MIN makes a connection "bulk" (spliced), a splice below
 * TUN_BULK_END ends it: a splice costs a syscall more than a copy, which only pays off
 * for big reads. */
#define TUN_BULK_MIN (32u << 10)
#define TUN_BULK_END (4u << 10)
static uint8_t rbuf[TUN_RBUF];
/* Socket -> connection without copies: splice(socket -> pipe), then stream_send_pipe()
 * (header written, payload spliced on). One pipe serves every connection: it is empty
 * again when stream_send_pipe() returns. Made at the first use. */
static int spipe[2] = {-1, -1};
static size_t spipe_size;
static bool no_splice;   /* this kernel cannot: copy */
static unsigned ntconns; /* relayed connections alive: the pipe goes with the last one and tunnel */

static void splice_idle(void)
{
	if (ntconns > 0 || ntunnels > 0 || spipe[0] < 0)
		return;
	close(spipe[0]);
	close(spipe[1]);
	spipe[0] = spipe[1] = -1;
}

/* ---- addresses ---- */

static int parse_addr(const char *host, uint32_t port, struct sockaddr_storage *ss, socklen_t *len, char *norm,
		      size_t normsz, struct shim_err *err)
{
	if (host == NULL || host[0] == '\0' || strcmp(host, "localhost") == 0)
		host = "127.0.0.1";
	if (port > 65535)
		return err_set(err, EINVAL, host, "port %u out of range", port);
	char h[64];
	if (netaddr_unbracket(host, h, sizeof(h)) < 0)
		return err_set(err, EINVAL, host, "address too long");
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, h, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		*len = sizeof(*in4);
	} else if (inet_pton(AF_INET6, h, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
	} else {
		return err_set(err, EINVAL, host, "not a numeric IP address (the shim does not resolve host names)");
	}
	snprintf(norm, normsz, "%s", h);
	return 0;
}

static void fd_addr(int fd, bool peer, char *out, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len) : getsockname(fd, (struct sockaddr *)&ss, &len);
	if (rc < 0)
		snprintf(out, size, "?");
	else
		netaddr_format(&ss, out, size);
}

static void send_event(struct stream *st, const Shim__V1__Event *ev)
{
	uint8_t buf[512];
	size_t n = shim__v1__event__get_packed_size(ev);
	if (n > sizeof(buf))
		return; /* cannot happen: every string in these events is bounded */
	shim__v1__event__pack(ev, buf);
	conn_send(st->conn, st->id, FRAME_EVENT, 0, buf, n);
}

static struct tunnel *tunnel_find(const char *id)
{
	for (struct tunnel *t = tunnels; t != NULL; t = t->next)
		if (id != NULL && strcmp(t->id, id) == 0)
			return t;
	return NULL;
}

/* ---- one relayed connection ---- */

static void tc_read(struct tconn *tc);
static void tc_flush(struct tconn *tc);

/* Off the loop and out of its tunnel, as its stream ends: a tunnel's teardown ends
 * the streams of the connections it still lists, so a connection leaves the list when
 * its stream goes, not when its op is freed. Idempotent. */
static void tc_detach(struct tconn *tc)
{
	struct ev_loop *loop = srv->loop;
	ev_io_stop(loop, &tc->rio);
	ev_io_stop(loop, &tc->wio);
	ev_timer_stop(loop, &tc->ctimer);
	struct tunnel *t = tc->t;
	if (t == NULL)
		return;
	if (tc->prev != NULL)
		tc->prev->next = tc->next;
	else
		t->conns = tc->next;
	if (tc->next != NULL)
		tc->next->prev = tc->prev;
	t->active--;
	tc->t = NULL;
}

static void tc_cancel(struct op *op)
{
	tc_detach(op->data);
}

static void tc_release(struct op *op)
{
	struct tconn *tc = op->data;
	if (tc == NULL)
		return;
	tc_detach(tc);
	if (tc->fd >= 0)
		close(tc->fd);
	if (tc->wbuf != NULL) {
		budget_free(tc->wbuf, tc->wcap);
		budget_give(tc->wcap);
	}
	if (tc->rpipe[0] >= 0) {
		close(tc->rpipe[0]);
		close(tc->rpipe[1]);
	}
	free(tc);
	ntconns--;
	splice_idle();
}

/* End the stream with ERROR; tc goes with its op. */
static void tc_fail(struct tconn *tc, int code, const char *what)
{
	struct op *op = tc->op;
	struct shim_err e;
	err_set(&e, code, tc->target, "%s", what);
	log_debug("tunnel conn %s: %s: %s", tc->target, what, strerror(code));
	tc_detach(tc);
	op_fail(op, &e);
}

/* Both directions are finished: END with the byte counts. */
static void tc_check_done(struct tconn *tc)
{
	if (!tc->eof_sent || !tc->shut_wr)
		return;
	Shim__V1__TunnelConnEnd ce = SHIM__V1__TUNNEL_CONN_END__INIT;
	ce.bytes_in = tc->bytes_in;
	ce.bytes_out = tc->bytes_out;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_TUNNEL_CONN;
	res.tunnel_conn = &ce;
	struct op *op = tc->op;
	tc_detach(tc);
	op_end(op, &res);
}

/* Credit for n bytes written to the socket goes back in WINDOWs of TUN_GRANT_MIN at least:
 * a frame per small write would cost the client a wake-up for nothing (its credit, the
 * initial window plus TUN_EXTRA_WINDOW, is far larger than what is held back). */
static void tc_grant(struct tconn *tc, uint32_t n)
{
	tc->owed += n;
	if (tc->owed < TUN_GRANT_MIN)
		return;
	stream_grant(tc->op->st, tc->owed);
	tc->owed = 0;
}

/* n of the client's bytes went into the socket: counted, and their credit on its way back. */
static void tc_wrote(struct tconn *tc, size_t n)
{
	tc->bytes_in += (uint64_t)n;
	if (tc->t != NULL)
		tc->t->bytes_in += (uint64_t)n;
	tc_grant(tc, (uint32_t)n);
}

static void tc_writable(struct op *op)
{
	tc_read(op->data);
}

/* DATA from the client: straight into the socket if it takes it, else buffered (never
 * more than the credit we granted); credit goes back as the socket takes the bytes,
 * so a slow reader inside stops only this connection's sender. */
static int tc_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct tconn *tc = op->data;
	struct stream *st = op->st;
	if (len > 0 && tc->wlen == 0 && tc->rpiped == 0 && !tc->connecting) {
		ssize_t w = send(tc->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return err_set(err, errno, tc->target, "send");
		if (w > 0) {
			buf += w;
			len -= (size_t)w;
			tc_wrote(tc, (size_t)w);
		}
	}
	if (len > 0) {
		if (tc->wbuf == NULL) {
			/* counted in the daemon's budget (the client has the credit for it
			 * already, so it is not refused: the others then wait for room) */
			tc->wcap = st->conn->srv->cfg.initial_window + TUN_EXTRA_WINDOW;
			tc->wbuf = budget_alloc(tc->wcap);
			if (tc->wbuf == NULL)
				return err_set(err, ENOMEM, NULL, "out of memory");
			budget_take(tc->wcap);
		}
		if (tc->woff > 0 && tc->woff + tc->wlen + len > tc->wcap) {
			memmove(tc->wbuf, tc->wbuf + tc->woff, tc->wlen);
			tc->woff = 0;
		}
		if (tc->woff + tc->wlen + len > tc->wcap)
			return err_set(err, ENOBUFS, NULL, "tunnel buffer full"); /* a client beyond its credit */
		memcpy(tc->wbuf + tc->woff + tc->wlen, buf, len);
		tc->wlen += len;
		if (!tc->connecting)
			ev_io_start(srv->loop, &tc->wio);
	}
	if (fin) {
		tc->client_fin = true;
		if (tc->wlen == 0 && tc->rpiped == 0 && !tc->connecting) {
			shutdown(tc->fd, SHUT_WR);
			tc->shut_wr = true;
			tc_check_done(tc);
		}
	}
	return 0;
}

/* The pipe for n more bytes of the client's: only while nothing of theirs is buffered
 * in wbuf (they would overtake it) and the socket is connected. Made at the first big
 * DATA, twice the credit the client may have out (a pipe counts slots, not bytes, and a
 * splice from a socket may fill one with less than a page). */
static int tc_data_pipe(struct op *op, size_t n)
{
	struct tconn *tc = op->data;
	if (tc->connecting || tc->wlen > 0 || tc->client_fin || no_splice)
		return -1;
	if (tc->rpipe[0] < 0 &&
	    (tc->rpipe_size = pipe_open(tc->rpipe, 2 * ((size_t)srv->cfg.initial_window + TUN_EXTRA_WINDOW))) == 0)
		return -1;
	return tc->rpiped + n <= tc->rpipe_size ? tc->rpipe[1] : -1;
}

static int tc_data_piped(struct op *op, size_t n, bool fin, struct shim_err *err)
{
	(void)err;
	struct tconn *tc = op->data;
	tc->rpiped += n;
	if (fin)
		tc->client_fin = true;
	tc_flush(tc);
	return 0;
}

static bool splice_ready(void)
{
	if (no_splice)
		return false;
	if (spipe[0] >= 0)
		return true;
	if (pipe2(spipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		no_splice = true;
		return false;
	}
	int sz = fcntl(spipe[1], F_SETPIPE_SZ, (int)TUN_RBUF);
	if (sz < 0)
		sz = fcntl(spipe[1], F_GETPIPE_SZ);
	spipe_size = sz > 0 ? (size_t)sz : 4096;
	return true;
}

/* EOF on the socket: DATA FIN. */
static void tc_eof(struct tconn *tc)
{
	ev_io_stop(srv->loop, &tc->rio);
	tc->eof_sent = true;
	stream_send_data(tc->op->st, NULL, 0, true);
	tc_check_done(tc);
}

/* Socket -> client, as far as credit and the connection's output room allow. */
static void tc_read(struct tconn *tc)
{
	struct stream *st = tc->op->st;
	if (tc->eof_sent || tc->connecting)
		return;
	for (int round = 0; round < TUN_READ_ROUNDS; round++) {
		/* nothing queued on the connection: read as much as the credit allows and
		 * write it straight out (no copy into the output queue) */
		bool direct = st->conn->outlen == 0 && st->send_credit > 0 && conn_room(st->conn) > 0;
		if (st->conn->outlen > 0 && st->conn->direct_rest_id == st->id) {
			/* only our last frame's rest is queued: the peer is slow; wait for it
			 * rather than copy more behind it (the bytes stay in the kernel) */
			ev_io_stop(srv->loop, &tc->rio);
			stream_wait_writable(st);
			return;
		}
		size_t room = direct ? (size_t)st->send_credit : stream_can_send(st);
		if (room == 0) {
			/* out of credit or output room: leave the bytes in the kernel (TCP
			 * pushes back on the sender inside) until writable() */
			ev_io_stop(srv->loop, &tc->rio);
			stream_wait_writable(st);
			return;
		}
		if (direct && tc->bulk && splice_ready()) {
			size_t want = room < spipe_size ? room : spipe_size;
			if (want > st->conn->max_frame)
				want = st->conn->max_frame;
			ssize_t n = splice(tc->fd, NULL, spipe[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
			if (n > 0) {
				stream_send_pipe(st, spipe[0], (size_t)n);
				tc->bytes_out += (uint64_t)n;
				if (tc->t != NULL)
					tc->t->bytes_out += (uint64_t)n;
				if ((size_t)n < TUN_BULK_END)
					tc->bulk = false;
				continue;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n < 0 && errno != EINVAL && errno != ENOSYS) {
				tc_fail(tc, errno, "recv");
				return;
			}
			if (n == 0) {
				tc_eof(tc);
				return;
			}
			no_splice = true; /* EINVAL: copy from now on */
		}
		if (room > sizeof(rbuf))
			room = sizeof(rbuf);
		ssize_t n = recv(tc->fd, rbuf, room, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			tc_fail(tc, errno, "recv");
			return;
		}
		if (n == 0) {
			tc_eof(tc);
			return;
		}
		size_t done = 0;
		if (direct) {
			bool busy;
			done = stream_send_direct(st, rbuf, (size_t)n, &busy);
		}
		/* the rest (all of it when not direct) is queued: within the credit */
		if (done < (size_t)n)
			stream_send_data(st, rbuf + done, (size_t)n - done, false);
		tc->bytes_out += (uint64_t)n;
		if (tc->t != NULL)
			tc->t->bytes_out += (uint64_t)n;
		if ((size_t)n >= TUN_BULK_MIN)
			tc->bulk = true;
	}
	ev_io_start(srv->loop, &tc->rio);
}

static void tc_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	tc_read(container_of(w, struct tconn, rio));
}

/* peer: the socket's peer address when the caller has it already (else NULL) */
static void tc_start_relay(struct tconn *tc, const struct sockaddr_storage *peer_ss)
{
	int one = 1;
	setsockopt(tc->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	char local[80], peer[80];
	fd_addr(tc->fd, false, local, sizeof(local));
	if (peer_ss != NULL)
		netaddr_format(peer_ss, peer, sizeof(peer));
	else
		fd_addr(tc->fd, true, peer, sizeof(peer));
	Shim__V1__TunnelConnected tcd = SHIM__V1__TUNNEL_CONNECTED__INIT;
	tcd.local = local;
	tcd.peer = peer;
	Shim__V1__Event ev = SHIM__V1__EVENT__INIT;
	ev.kind_case = SHIM__V1__EVENT__KIND_TUNNEL_CONNECTED;
	ev.tunnel_connected = &tcd;
	send_event(tc->op->st, &ev);
	stream_grant(tc->op->st, TUN_EXTRA_WINDOW);
	/* client bytes (or its FIN) that came while connecting go out when writable */
	if (tc->wlen > 0 || tc->client_fin)
		ev_io_start(srv->loop, &tc->wio);
	/* bytes the socket has already are seen by the watcher (no read to find none) */
	ev_io_start(srv->loop, &tc->rio);
}

/* Client bytes in the pipe -> socket (spliced). false: the socket is full (or the
 * connection failed). */
static bool tc_flush_pipe(struct tconn *tc)
{
	while (tc->rpiped > 0) {
		ssize_t w = splice(tc->rpipe[0], NULL, tc->fd, NULL, tc->rpiped, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				ev_io_start(srv->loop, &tc->wio);
				return false;
			}
			tc_fail(tc, errno, "send");
			return false;
		}
		if (w == 0) {
			tc_fail(tc, EPIPE, "send");
			return false;
		}
		tc->rpiped -= (size_t)w;
		tc_wrote(tc, (size_t)w);
	}
	return true;
}

/* Client bytes buffered earlier (in the pipe first, then wbuf) -> socket. */
static void tc_flush(struct tconn *tc)
{
	if (!tc_flush_pipe(tc))
		return;
	while (tc->wlen > 0) {
		ssize_t w = send(tc->fd, tc->wbuf + tc->woff, tc->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				ev_io_start(srv->loop, &tc->wio);
				return;
			}
			tc_fail(tc, errno, "send");
			return;
		}
		tc->woff += (size_t)w;
		tc->wlen -= (size_t)w;
		tc_wrote(tc, (size_t)w);
	}
	tc->woff = 0;
	ev_io_stop(srv->loop, &tc->wio);
	if (tc->client_fin && !tc->shut_wr) {
		shutdown(tc->fd, SHUT_WR);
		tc->shut_wr = true;
		tc_check_done(tc);
	}
}

static void tc_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	struct tconn *tc = container_of(w, struct tconn, wio);
	if (tc->connecting) {
		int soerr = 0;
		socklen_t sl = sizeof(soerr);
		if (getsockopt(tc->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
			soerr = errno;
		if (soerr == EINPROGRESS || soerr == EALREADY)
			return;
		ev_timer_stop(loop, &tc->ctimer);
		ev_io_stop(loop, &tc->wio);
		if (soerr != 0) {
			tc_fail(tc, soerr, "connect");
			return;
		}
		tc->connecting = false;
		tc_start_relay(tc, NULL);
		/* the stream may have ended in there (EOF with the client's FIN already in) */
		return;
	}
	tc_flush(tc);
}

static void tc_connect_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	tc_fail(container_of(w, struct tconn, ctimer), ETIMEDOUT, "connect");
}

static struct tconn *tc_new(struct op *op, struct tunnel *t, int fd, const char *target)
{
	struct tconn *tc = calloc(1, sizeof(*tc));
	if (tc == NULL)
		return NULL;
	tc->op = op;
	tc->fd = fd;
	tc->rpipe[0] = tc->rpipe[1] = -1;
	ntconns++;
	snprintf(tc->target, sizeof(tc->target), "%s", target);
	ev_io_init(&tc->rio, tc_read_cb, fd, EV_READ);
	ev_io_init(&tc->wio, tc_write_cb, fd, EV_WRITE);
	ev_init(&tc->ctimer, tc_connect_timeout_cb);
	if (t != NULL) {
		tc->t = t;
		tc->next = t->conns;
		if (t->conns != NULL)
			t->conns->prev = tc;
		t->conns = tc;
		t->active++;
		t->total++;
	}
	op->data = tc;
	return tc;
}

/* ---- tunnels ---- */

static void pending_close(struct tpending *p, bool reset)
{
	if (reset) {
		/* an RST tells the program inside at once that nobody will answer */
		struct linger lg = {.l_onoff = 1, .l_linger = 0};
		setsockopt(p->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	close(p->fd);
	free(p);
}

/* Close the listener, drop pending connections and end every connection stream
 * with ECONNABORTED; unlink the tunnel. Its own stream is the caller's to end. */
static void tunnel_teardown(struct tunnel *t)
{
	struct ev_loop *loop = srv->loop;
	ev_io_stop(loop, &t->lio);
	ev_io_stop(loop, &t->lio6);
	ev_timer_stop(loop, &t->ptimer);
	if (t->lfd >= 0)
		close(t->lfd);
	t->lfd = -1;
	if (t->lfd6 >= 0)
		close(t->lfd6);
	t->lfd6 = -1;
	while (t->pending != NULL) {
		struct tpending *p = t->pending;
		t->pending = p->next;
		pending_close(p, true);
	}
	while (t->conns != NULL) {
		struct tconn *tc = t->conns;
		struct shim_err e;
		err_set(&e, ECONNABORTED, tc->target, "tunnel %s closed", t->id);
		tc_detach(tc);
		op_fail(tc->op, &e);
	}
	for (struct tunnel **pp = &tunnels; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == t) {
			*pp = t->next;
			ntunnels--;
			break;
		}
	}
	log_info("tunnel %s closed (%" PRIu64 " connections)", t->id, t->total);
	splice_idle();
}

static void tunnel_info(const struct tunnel *t, Shim__V1__TunnelInfo *ti)
{
	shim__v1__tunnel_info__init(ti);
	ti->tunnel_id = (char *)t->id;
	ti->kind = t->kind == TUN_FORWARD ? SHIM__V1__TUNNEL_KIND__TUNNEL_KIND_FORWARD :
					    SHIM__V1__TUNNEL_KIND__TUNNEL_KIND_REVERSE;
	ti->host = (char *)t->host;
	ti->port = t->port;
	ti->remote = (char *)t->remote;
	ti->client = (char *)t->op->st->conn->peer;
	ti->has_active = ti->has_total = ti->has_bytes_in = ti->has_bytes_out = 1;
	ti->active = t->active;
	ti->total = t->total;
	ti->bytes_in = t->bytes_in;
	ti->bytes_out = t->bytes_out;
}

static void tunnel_cancel(struct op *op)
{
	tunnel_teardown(op->data);
}

static void ptimer_arm(struct tunnel *t)
{
	if (!ev_is_active(&t->ptimer)) {
		t->ptimer.repeat = 0.5;
		ev_timer_again(srv->loop, &t->ptimer);
	}
}

/* The listening sockets' watchers (one, or two on a loopback name). */
static void listen_stop(struct tunnel *t)
{
	ev_io_stop(srv->loop, &t->lio);
	ev_io_stop(srv->loop, &t->lio6);
}

static void listen_start(struct tunnel *t)
{
	if (t->lfd >= 0)
		ev_io_start(srv->loop, &t->lio);
	if (t->lfd6 >= 0)
		ev_io_start(srv->loop, &t->lio6);
}

static void listen_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct tunnel *t = w->data;
	for (int round = 0; round < TUN_ACCEPT_ROUNDS; round++) {
		/* the owner is not reading its connection: do not queue announcements it
		 * does not take (retried by the timer) */
		if (t->npending >= TUN_PENDING_MAX || t->op->st->conn->outlen > TUN_OWNER_OUT_MAX) {
			/* the client is not claiming them: let the kernel's backlog hold the
			 * rest (resumed as pending ones are claimed or expire) */
			listen_stop(t);
			ptimer_arm(t);
			return;
		}
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(w->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				log_warn("tunnel %s: accept: %s", t->id, strerror(errno));
				listen_stop(t);
				ptimer_arm(t);
			}
			return;
		}
		struct tpending *p = calloc(1, sizeof(*p));
		if (p == NULL) {
			close(fd);
			return;
		}
		p->id = ++t->next_conn;
		p->fd = fd;
		p->at = mono_s();
		p->next = t->pending;
		t->pending = p;
		t->npending++;
		char peer[80];
		netaddr_format(&ss, peer, sizeof(peer));
		Shim__V1__TunnelIncoming in = SHIM__V1__TUNNEL_INCOMING__INIT;
		in.conn_id = p->id;
		in.peer = peer;
		Shim__V1__Event ev = SHIM__V1__EVENT__INIT;
		ev.kind_case = SHIM__V1__EVENT__KIND_TUNNEL_INCOMING;
		ev.tunnel_incoming = &in;
		send_event(t->op->st, &ev);
		ptimer_arm(t);
	}
}

static void ptimer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	struct tunnel *t = container_of(w, struct tunnel, ptimer);
	double now = mono_s();
	for (struct tpending **pp = &t->pending; *pp != NULL;) {
		struct tpending *p = *pp;
		if (now - p->at >= t->accept_timeout) {
			*pp = p->next;
			t->npending--;
			log_info("tunnel %s: connection %" PRIu64 " not claimed in time: closed", t->id, p->id);
			pending_close(p, true);
		} else {
			pp = &p->next;
		}
	}
	if (t->npending < TUN_PENDING_MAX)
		listen_start(t);
	if (t->pending == NULL && (ev_is_active(&t->lio) || ev_is_active(&t->lio6)))
		ev_timer_stop(loop, w);
}

static struct tunnel *tunnel_new(struct op *op, enum tun_kind kind, const char *remote, struct shim_err *err)
{
	if (ntunnels >= TUN_MAX) {
		err_set(err, EAGAIN, NULL, "too many tunnels (limit %u)", TUN_MAX);
		return NULL;
	}
	struct tunnel *t = calloc(1, sizeof(*t));
	if (t == NULL) {
		err_set(err, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	snprintf(t->id, sizeof(t->id), "t%" PRIu64, next_tunnel++);
	t->kind = kind;
	t->op = op;
	t->lfd = -1;
	t->lfd6 = -1;
	snprintf(t->remote, sizeof(t->remote), "%s", remote != NULL ? remote : "");
	ev_init(&t->lio, listen_cb);
	ev_init(&t->lio6, listen_cb);
	t->lio.data = t->lio6.data = t;
	ev_init(&t->ptimer, ptimer_cb);
	return t;
}

static void tunnel_publish(struct tunnel *t)
{
	t->next = tunnels;
	tunnels = t;
	ntunnels++;
	t->op->data = t;
	Shim__V1__TunnelReady r = SHIM__V1__TUNNEL_READY__INIT;
	r.tunnel_id = t->id;
	r.host = t->host;
	r.port = t->port;
	Shim__V1__Event ev = SHIM__V1__EVENT__INIT;
	ev.kind_case = SHIM__V1__EVENT__KIND_TUNNEL_READY;
	ev.tunnel_ready = &r;
	send_event(t->op->st, &ev);
	log_info("tunnel %s: %s %s:%u (%s) for %s", t->id, t->kind == TUN_FORWARD ? "forward to" : "listening on",
		 t->host, t->port, t->remote[0] ? t->remote : "-", t->op->st->conn->peer);
}

/* A listening socket on ss: SO_REUSEADDR (a port in TIME_WAIT is reused; one
 * somebody listens on is still EADDRINUSE), never SO_REUSEPORT (nobody may share it).
 * The fd, or -1 with err naming the address. */
static int listen_on(const struct sockaddr_storage *ss, socklen_t sl, int backlog, struct shim_err *err)
{
	char where[80];
	netaddr_format(ss, where, sizeof(where));
	cleanup_close int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return err_set(err, errno, where, "socket");
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss->ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)ss, sl) < 0)
		return err_set(err, errno, where, "bind");
	if (listen(fd, backlog) < 0)
		return err_set(err, errno, where, "listen");
	return steal_fd(fd);
}

static uint16_t sa_port(const struct sockaddr_storage *ss)
{
	return ntohs(ss->ss_family == AF_INET ? ((const struct sockaddr_in *)ss)->sin_port :
						((const struct sockaddr_in6 *)ss)->sin6_port);
}

/* A loopback name: "localhost" (and no host at all) is 127.0.0.1 and ::1, as
 * /etc/hosts has it; "ip6-localhost" and "ip6-loopback" are ::1. No lookup. */
enum { LOOP_NONE, LOOP_BOTH, LOOP_V6 };
static int loopback_name(const char *host)
{
	if (host == NULL || host[0] == '\0' || strcmp(host, "localhost") == 0)
		return LOOP_BOTH;
	if (strcmp(host, "ip6-localhost") == 0 || strcmp(host, "ip6-loopback") == 0)
		return LOOP_V6;
	return LOOP_NONE;
}

/* Listen on 127.0.0.1:port and [::1]:port together (port 0: one kernel-chosen port
 * free on both, a few tries). Either taken: EADDRINUSE naming it, nothing kept bound.
 * A machine without IPv6 loopback (no AF_INET6, or ::1 not configured) gets the IPv4
 * one only. 0 with *fd4 and *fd6 (-1: none), or -1 with err. */
static int listen_loopback(uint32_t port, int backlog, int *fd4, int *fd6, struct shim_err *err)
{
	for (int attempt = 0;; attempt++) {
		struct sockaddr_storage ss4, ss6;
		socklen_t l4, l6;
		char norm[64];
		if (parse_addr("127.0.0.1", port, &ss4, &l4, norm, sizeof(norm), err) < 0)
			return -1;
		int a = listen_on(&ss4, l4, backlog, err);
		if (a < 0)
			return -1;
		struct sockaddr_storage bound;
		socklen_t bl = sizeof(bound);
		if (getsockname(a, (struct sockaddr *)&bound, &bl) < 0) {
			int e = errno;
			close(a);
			return err_set(err, e, "127.0.0.1", "getsockname");
		}
		if (parse_addr("::1", sa_port(&bound), &ss6, &l6, norm, sizeof(norm), err) < 0) {
			close(a);
			return -1;
		}
		int b = listen_on(&ss6, l6, backlog, err);
		if (b >= 0) {
			*fd4 = a;
			*fd6 = b;
			return 0;
		}
		close(a);
		if (err->code == EAFNOSUPPORT || err->code == EADDRNOTAVAIL) {
			/* no IPv6 loopback here: nobody can listen on ::1 either */
			log_debug("tunnel: no IPv6 loopback (%s): listening on 127.0.0.1 only", strerror(err->code));
			if (parse_addr("127.0.0.1", port, &ss4, &l4, norm, sizeof(norm), err) < 0)
				return -1;
			if ((*fd4 = listen_on(&ss4, l4, backlog, err)) < 0)
				return -1;
			*fd6 = -1;
			return 0;
		}
		/* a kernel-chosen port that is taken on ::1: choose again */
		if (port == 0 && err->code == EADDRINUSE && attempt < 16)
			continue;
		return -1;
	}
}

static int tunnel_listen_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__TunnelListenRequest *r = op->req->tunnel_listen;
	struct sockaddr_storage ss;
	socklen_t sl;
	char host[64];
	int backlog = r->has_backlog && r->backlog > 0 ? (int)(r->backlog > 4096 ? 4096 : r->backlog) : 128;
	int loop = loopback_name(r->host);
	int cleanup_close fd = -1;
	int cleanup_close fd6 = -1;
	if (loop == LOOP_BOTH) {
		if (r->port > 65535)
			return err_set(err, EINVAL, r->host, "port %u out of range", r->port);
		if (listen_loopback(r->port, backlog, &fd, &fd6, err) < 0)
			return -1;
		snprintf(host, sizeof(host), "localhost");
	} else {
		if (parse_addr(loop == LOOP_V6 ? "::1" : r->host, r->port, &ss, &sl, host, sizeof(host), err) < 0)
			return -1;
		if ((fd = listen_on(&ss, sl, backlog, err)) < 0)
			return -1;
		if (loop == LOOP_V6)
			snprintf(host, sizeof(host), "%s", r->host);
	}
	struct sockaddr_storage bound;
	socklen_t bl = sizeof(bound);
	if (getsockname(fd, (struct sockaddr *)&bound, &bl) < 0)
		return err_set(err, errno, host, "getsockname");
	struct tunnel *t = tunnel_new(op, TUN_REVERSE, r->remote, err);
	if (t == NULL)
		return -1;
	snprintf(t->host, sizeof(t->host), "%s", host);
	t->port = sa_port(&bound);
	t->accept_timeout =
		(r->has_accept_timeout_ms && r->accept_timeout_ms > 0 ? r->accept_timeout_ms : TUN_ACCEPT_TIMEOUT_MS) /
		1000.0;
	t->lfd = steal_fd(fd);
	ev_io_set(&t->lio, t->lfd, EV_READ);
	t->lfd6 = steal_fd(fd6);
	if (t->lfd6 >= 0)
		ev_io_set(&t->lio6, t->lfd6, EV_READ);
	tunnel_publish(t);
	listen_start(t);
	return 0;
}

static int tunnel_forward_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__TunnelForwardRequest *r = op->req->tunnel_forward;
	struct sockaddr_storage ss;
	socklen_t sl;
	char host[64];
	if (r->port == 0 || r->port > 65535)
		return err_set(err, EINVAL, NULL, "port %u out of range (1-65535)", r->port);
	if (parse_addr(r->host, r->port, &ss, &sl, host, sizeof(host), err) < 0)
		return -1;
	struct tunnel *t = tunnel_new(op, TUN_FORWARD, r->remote, err);
	if (t == NULL)
		return -1;
	snprintf(t->host, sizeof(t->host), "%s", host);
	t->port = r->port;
	tunnel_publish(t);
	return 0;
}

static int tunnel_connect_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__TunnelConnectRequest *r = op->req->tunnel_connect;
	struct tunnel *t = NULL;
	if (r->tunnel_id != NULL && r->tunnel_id[0] != '\0') {
		t = tunnel_find(r->tunnel_id);
		/* connections join only the caller's own tunnels */
		if (t == NULL || t->kind != TUN_FORWARD || t->op->st->conn != op->st->conn)
			return err_set(err, ENOENT, r->tunnel_id, "no such forward tunnel on this connection");
	}
	const char *host = r->host != NULL && r->host[0] != '\0' ? r->host : t != NULL ? t->host : NULL;
	uint32_t port = r->has_port ? r->port : t != NULL ? t->port : 0;
	if (port == 0 || port > 65535)
		return err_set(err, EINVAL, NULL, "port %u out of range (1-65535)", port);
	struct sockaddr_storage ss;
	socklen_t sl;
	char h[64], where[80];
	if (parse_addr(host, port, &ss, &sl, h, sizeof(h), err) < 0)
		return -1;
	netaddr_format(&ss, where, sizeof(where));
	cleanup_close int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return err_set(err, errno, where, "socket");
	bool inprogress = false;
	if (connect(fd, (struct sockaddr *)&ss, sl) < 0) {
		if (errno != EINPROGRESS)
			return err_set(err, errno, where, "connect");
		inprogress = true;
	}
	struct tconn *tc = tc_new(op, t, fd, where);
	if (tc == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	fd = -1;
	struct sockaddr_storage peer;
	socklen_t pl = sizeof(peer);
	/* a loopback handshake is mostly done by the time connect() returns: then relay at
	 * once rather than wait a loop round for writable */
	if (inprogress && getpeername(tc->fd, (struct sockaddr *)&peer, &pl) == 0)
		inprogress = false;
	else if (!inprogress && getpeername(tc->fd, (struct sockaddr *)&peer, &pl) < 0)
		pl = 0;
	if (inprogress) {
		tc->connecting = true;
		ev_io_start(srv->loop, &tc->wio);
		double to = (r->has_timeout_ms && r->timeout_ms > 0 ? r->timeout_ms : TUN_CONNECT_TIMEOUT_MS) / 1000.0;
		ev_timer_set(&tc->ctimer, to, 0.);
		ev_timer_start(srv->loop, &tc->ctimer);
	} else {
		tc_start_relay(tc, pl > 0 ? &peer : NULL);
	}
	return 0;
}

static int tunnel_accept_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__TunnelAcceptRequest *r = op->req->tunnel_accept;
	struct tunnel *t = tunnel_find(r->tunnel_id);
	if (t == NULL || t->kind != TUN_REVERSE || t->op->st->conn != op->st->conn)
		return err_set(err, ENOENT, r->tunnel_id, "no such reverse tunnel on this connection");
	struct tpending *p = NULL;
	for (struct tpending **pp = &t->pending; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->id == r->conn_id) {
			p = *pp;
			*pp = p->next;
			t->npending--;
			break;
		}
	}
	if (p == NULL)
		return err_set(err, ENOENT, r->tunnel_id, "connection %" PRIu64 " is not waiting (claimed or expired)",
			       r->conn_id);
	if (t->npending < TUN_PENDING_MAX)
		listen_start(t);
	if (r->has_refuse && r->refuse) {
		pending_close(p, true);
		op_end_done(op);
		return 0;
	}
	char peer[80];
	fd_addr(p->fd, true, peer, sizeof(peer));
	struct tconn *tc = tc_new(op, t, p->fd, peer);
	if (tc == NULL) {
		pending_close(p, true);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	free(p);
	tc_start_relay(tc, NULL);
	return 0;
}

static int tunnels_start(struct op *op, struct shim_err *err)
{
	Shim__V1__TunnelInfo cleanup_free *infos = calloc(ntunnels ? ntunnels : 1, sizeof(*infos));
	Shim__V1__TunnelInfo cleanup_free **ptrs = calloc(ntunnels ? ntunnels : 1, sizeof(*ptrs));
	if (infos == NULL || ptrs == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	size_t n = 0;
	/* oldest first: the list is kept newest first */
	for (struct tunnel *t = tunnels; t != NULL; t = t->next)
		n++;
	size_t i = n;
	for (struct tunnel *t = tunnels; t != NULL; t = t->next) {
		i--;
		tunnel_info(t, &infos[i]);
		ptrs[i] = &infos[i];
	}
	Shim__V1__TunnelList tl = SHIM__V1__TUNNEL_LIST__INIT;
	tl.n_tunnels = n;
	tl.tunnels = ptrs;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_TUNNELS;
	res.tunnels = &tl;
	op_end(op, &res);
	return 0;
}

static int tunnel_close_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__TunnelCloseRequest *r = op->req->tunnel_close;
	struct tunnel *t = tunnel_find(r->tunnel_id);
	if (t == NULL)
		return err_set(err, ENOENT, r->tunnel_id, "no such tunnel");
	tunnel_teardown(t);
	/* the owner's stream ends with the final figures (and t with its op) */
	Shim__V1__TunnelInfo ti;
	tunnel_info(t, &ti);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_TUNNEL;
	res.tunnel = &ti;
	op_end(t->op, &res);
	op_end_done(op);
	return 0;
}

/* A tunnel's own request lives as long as the tunnel (its op->data): cancel tears the
 * tunnel down, release frees it. A connection's request carries its bytes both ways. */
const struct op_kind op_tunnel_listen_kind = {SHIM__V1__REQUEST__KIND_TUNNEL_LISTEN, "tunnel_listen", 0,
					      .start = tunnel_listen_start, .cancel = tunnel_cancel};
const struct op_kind op_tunnel_forward_kind = {SHIM__V1__REQUEST__KIND_TUNNEL_FORWARD, "tunnel_forward", 0,
					       .start = tunnel_forward_start, .cancel = tunnel_cancel};
const struct op_kind op_tunnel_connect_kind = {SHIM__V1__REQUEST__KIND_TUNNEL_CONNECT,
					       "tunnel_connect",
					       OP_TAKES_DATA,
					       .start = tunnel_connect_start,
					       .data = tc_data,
					       .data_pipe = tc_data_pipe,
					       .data_piped = tc_data_piped,
					       .writable = tc_writable,
					       .cancel = tc_cancel,
					       .release = tc_release};
const struct op_kind op_tunnel_accept_kind = {SHIM__V1__REQUEST__KIND_TUNNEL_ACCEPT,
					      "tunnel_accept",
					      OP_TAKES_DATA,
					      .start = tunnel_accept_start,
					      .data = tc_data,
					      .data_pipe = tc_data_pipe,
					      .data_piped = tc_data_piped,
					      .writable = tc_writable,
					      .cancel = tc_cancel,
					      .release = tc_release};
const struct op_kind op_tunnel_list_kind = {SHIM__V1__REQUEST__KIND_TUNNELS, "tunnels", 0, .start = tunnels_start};
const struct op_kind op_tunnel_close_kind = {SHIM__V1__REQUEST__KIND_TUNNEL_CLOSE, "tunnel_close", 0,
					     .start = tunnel_close_start};
