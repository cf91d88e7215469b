/* tunnel.c: TCP tunnels: a host listener (forward) or the shim's listener (reverse), relayed by one thread per tunnel.
 *
 * Each tunnel handle has a background thread that polls its own sockets and, when no
 * other thread is reading the client connection, the connection too (sbx__pump); a
 * thread that does read wakes it through its eventfd when frames for it were routed.
 * Per connection: DATA from the shim is written to the local socket and its credit
 * handed back only once written; the local socket is read only while the shim has
 * granted credit. So a slow reader at either end stalls only its own connection.
 * Bulk local reads go to the shim by splice (socket -> pipe -> connection, no copy in
 * user space); DATA from the shim goes out several frames per sendmsg. Bytes the local
 * peer sends with its connect go at once, before the shim's "connected". */
#include "internal.h"
#include "netaddr.h"
#include "shim.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define TUN_SEND_MS 30000    /* one frame to the shim may take this long */
#define TUN_MAX_CONNS 1024   /* per tunnel; more wait in the listen backlog */
#define TUN_ACCEPT_ROUNDS 16 /* accepts per round */
#define TUN_READ_MAX FRAME_DATA_CHUNK
#define TUN_EXTRA_WINDOW (256u << 10) /* extra credit the shim gets on a connection */
#define TUN_WRITE_ITEMS 16            /* DATA frames written to a local socket in one sendmsg */
#define TUN_GRANT_MIN (64u << 10)     /* credit goes back in WINDOWs of this much at least */
#define TUN_PIPE_SIZE (256u << 10)    /* the splice pipe: the most one spliced DATA frame carries */
/* A read of TUN_BULK_MIN makes a connection "bulk" (spliced), a splice below
 * TUN_BULK_END ends it: a splice costs a syscall more than a copy, which only pays off
 * for big reads. */
#define TUN_BULK_MIN (32u << 10)
#define TUN_BULK_END (4u << 10)
_Static_assert(FRAME_DEFAULT_WINDOW >= 4 * TUN_GRANT_MIN, "the shim's credit outlasts what is held back");

enum tc_state {
	TC_LOCAL_CONNECTING, /* reverse: connecting to the host address */
	TC_WAIT_CONNECTED,   /* request sent, waiting for the shim's "connected" */
	TC_RELAY,
};

struct tc {
	struct tc *next;
	uint64_t no;
	uint64_t shim_conn; /* reverse: the shim's id of the accepted connection */
	int fd;
	struct call *k;
	enum tc_state state;
	uint64_t connect_deadline;
	bool local_eof;                      /* read EOF locally; FIN sent */
	bool shut_wr;                        /* the shim's FIN passed on with shutdown(SHUT_WR) */
	bool gone;                           /* to be freed */
	struct rx_item *wr[TUN_WRITE_ITEMS]; /* DATA being written to the local socket */
	unsigned nwr;
	size_t wr_off;   /* of wr[0] */
	uint32_t grant;  /* bytes written, credit not yet handed back */
	bool extra_sent; /* TUN_EXTRA_WINDOW granted (with the first grant) */
	bool bulk;       /* local reads come big: splice them (small ones are cheaper copied) */
	uint64_t bytes_in, bytes_out;
	char from[80], to[80];
	int pidx; /* index in the poll array, -1 if not polled */
};

struct sbx_tunnel {
	struct sbx_client *c;
	int kind;
	char id[16];
	unsigned port;
	struct call *tk;               /* the tunnel's own stream */
	int lfd;                       /* forward: the host listener */
	struct sockaddr_storage local; /* reverse: where connections go on this host */
	socklen_t local_len;
	char local_str[80];
	char guest[80];
	int evfd;
	struct sbx_tunnel_opts o;
	pthread_t thread;
	bool started;
	int stop;           /* atomic: close asked */
	int self_close;     /* atomic: closed from the log callback: the thread frees the handle */
	pthread_mutex_t mu; /* ended, end_rc, end_err, active */
	pthread_cond_t cv;
	bool ended;
	int end_rc;
	struct sbx_error end_err;
	unsigned active;
	struct tc *conns;
	unsigned nconns;
	uint64_t next_no;
	uint64_t accept_pause_until; /* forward: accept() ran out of fds; retry then */
	uint8_t *buf;
	struct pollfd *pfd;
	unsigned pfd_cap;
	/* local socket -> shim without copies: splice(socket -> pipe), the header, then
	 * splice(pipe -> connection); made at the first use, -1 until then */
	int pipefd[2];
	size_t pipe_size;
	bool no_splice; /* this kernel or these fds cannot: copy */
};

static uint64_t ms_from_now(int ms)
{
	return sbx__now_ns() + (uint64_t)ms * 1000000u;
}

/* host (NULL: 127.0.0.1; [v6] allowed) and port to one address. */
static int resolve(const char *host, unsigned port, bool passive, struct sockaddr_storage *ss, socklen_t *len,
		   struct sbx_error *err)
{
	char h[256];
	if (host == NULL || host[0] == '\0')
		host = "127.0.0.1";
	if (netaddr_unbracket(host, h, sizeof(h)) < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, host, "host name too long");
	char ps[16];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(h, ps, &hints, &ai);
	if (rc != 0 || ai == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, rc == EAI_SYSTEM ? errno : EADDRNOTAVAIL, host,
				 "cannot resolve %s: %s", host, gai_strerror(rc));
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

static void set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Close so that the other end sees a reset, not a clean end: the connection failed. */
static void close_reset(int fd)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void log_event(struct sbx_tunnel *t, int type, const struct tc *tc, const struct sbx_error *e)
{
	if (t->o.log == NULL)
		return;
	struct sbx_tunnel_event ev = {.type = type,
				      .conn = tc->no,
				      .from = tc->from,
				      .to = tc->to,
				      .bytes_in = tc->bytes_in,
				      .bytes_out = tc->bytes_out,
				      .err = e};
	t->o.log(t->o.log_ud, t, &ev);
}

static void set_active(struct sbx_tunnel *t, int delta)
{
	pthread_mutex_lock(&t->mu);
	t->active = (unsigned)((int)t->active + delta);
	pthread_mutex_unlock(&t->mu);
}

/* Drop a connection: the local socket is reset (err) or closed, the stream cancelled
 * if still open. */
static void tc_end(struct sbx_tunnel *t, struct tc *tc, int type, const struct sbx_error *e)
{
	if (tc->gone)
		return;
	if (tc->fd >= 0) {
		if (e != NULL)
			close_reset(tc->fd);
		else
			close(tc->fd);
		tc->fd = -1;
	}
	for (unsigned i = 0; i < tc->nwr; i++)
		sbx__rx_free(tc->wr[i]);
	tc->nwr = 0;
	if (tc->k != NULL) {
		sbx__call_free(tc->k);
		tc->k = NULL;
	}
	if (type == SBX_TUNNEL_CLOSE)
		set_active(t, -1);
	log_event(t, type, tc, e);
	tc->gone = true;
}

static int start_request(struct sbx_tunnel *t, struct tc *tc, const Shim__V1__Request *req, struct sbx_error *err)
{
	uint8_t buf[512];
	size_t n = shim__v1__request__get_packed_size(req);
	if (n > sizeof(buf))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "request too large");
	shim__v1__request__pack(req, buf);
	tc->k = sbx__call_new(t->c, true);
	if (tc->k == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	/* big DATA for the local socket may come through a pipe (reader.c): spliced on */
	pthread_mutex_lock(&t->c->mu);
	tc->k->rx_pipe_ok = true;
	pthread_mutex_unlock(&t->c->mu);
	return sbx__send_request(tc->k, buf, n, ms_from_now(TUN_SEND_MS), err);
}

static struct tc *tc_add(struct sbx_tunnel *t, int fd)
{
	struct tc *tc = calloc(1, sizeof(*tc));
	if (tc == NULL)
		return NULL;
	tc->fd = fd;
	tc->no = ++t->next_no;
	tc->pidx = -1;
	tc->next = t->conns;
	t->conns = tc;
	t->nconns++;
	return tc;
}

/* A connection lost while reading its local socket: closed if it was open, else failed. */
static void tc_lost(struct sbx_tunnel *t, struct tc *tc, const struct sbx_error *e)
{
	tc_end(t, tc, tc->state == TC_RELAY ? SBX_TUNNEL_CLOSE : SBX_TUNNEL_FAIL, e);
}

static void tc_read_local(struct sbx_tunnel *t, struct tc *tc);

/* ---- forward: accept here, connect inside ---- */

static void forward_accept(struct sbx_tunnel *t)
{
	for (int i = 0; i < TUN_ACCEPT_ROUNDS && t->nconns < TUN_MAX_CONNS; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(t->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			/* out of fds or memory: the listener stays readable, so look away for
			 * a moment rather than spin (the connections wait in the backlog) */
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				t->accept_pause_until = ms_from_now(100);
			return;
		}
		set_nodelay(fd);
		struct tc *tc = tc_add(t, fd);
		if (tc == NULL) {
			close_reset(fd);
			return;
		}
		netaddr_format(&ss, tc->from, sizeof(tc->from));
		snprintf(tc->to, sizeof(tc->to), "%s", t->guest);
		tc->state = TC_WAIT_CONNECTED;
		Shim__V1__TunnelConnectRequest cr = SHIM__V1__TUNNEL_CONNECT_REQUEST__INIT;
		cr.tunnel_id = t->id;
		if (t->o.connect_timeout_ms > 0) {
			cr.has_timeout_ms = 1;
			cr.timeout_ms = (uint32_t)t->o.connect_timeout_ms;
		}
		Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
		req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_CONNECT;
		req.tunnel_connect = &cr;
		struct sbx_error e;
		if (start_request(t, tc, &req, &e) < 0) {
			tc_end(t, tc, SBX_TUNNEL_FAIL, &e);
			continue;
		}
		/* what the client sent with its connect goes at once, within the stream's
		 * first credit: the shim holds it until its connect completes (PROTOCOL.md 12.5) */
		tc_read_local(t, tc);
	}
}

/* ---- reverse: the shim accepted inside, connect here ---- */

static void reverse_claim(struct sbx_tunnel *t, struct tc *tc, bool refuse)
{
	Shim__V1__TunnelAcceptRequest ar = SHIM__V1__TUNNEL_ACCEPT_REQUEST__INIT;
	ar.tunnel_id = t->id;
	ar.conn_id = tc->shim_conn;
	ar.has_refuse = refuse;
	ar.refuse = refuse;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_ACCEPT;
	req.tunnel_accept = &ar;
	struct sbx_error e;
	if (start_request(t, tc, &req, &e) < 0) {
		tc_end(t, tc, SBX_TUNNEL_FAIL, &e);
		return;
	}
	if (refuse) {
		/* nothing to wait for: the shim resets the connection inside */
		sbx__call_free(tc->k);
		tc->k = NULL;
		return;
	}
	tc->state = TC_WAIT_CONNECTED;
}

static void reverse_fail_local(struct sbx_tunnel *t, struct tc *tc, int code, const char *what)
{
	struct sbx_error e;
	sbx__fail(&e, SBX_ERR_LOCAL, code, tc->to, "%s", what);
	if (tc->fd >= 0)
		close(tc->fd);
	tc->fd = -1;
	reverse_claim(t, tc, true);
	tc_end(t, tc, SBX_TUNNEL_FAIL, &e);
}

static void reverse_incoming(struct sbx_tunnel *t, const Shim__V1__TunnelIncoming *in)
{
	struct tc *tc = tc_add(t, -1);
	if (tc == NULL)
		return; /* the shim closes it when it is not claimed */
	tc->shim_conn = in->conn_id;
	snprintf(tc->from, sizeof(tc->from), "%s", in->peer ? in->peer : "?");
	snprintf(tc->to, sizeof(tc->to), "%s", t->local_str);
	tc->state = TC_LOCAL_CONNECTING;
	int fd = socket(t->local.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		reverse_fail_local(t, tc, errno, "socket");
		return;
	}
	tc->fd = fd;
	set_nodelay(fd);
	if (connect(fd, (struct sockaddr *)&t->local, t->local_len) < 0 && errno != EINPROGRESS) {
		reverse_fail_local(t, tc, errno, "connect");
		return;
	}
	int ms = t->o.connect_timeout_ms > 0 ? t->o.connect_timeout_ms : 10000;
	tc->connect_deadline = ms_from_now(ms);
}

static void reverse_connected(struct sbx_tunnel *t, struct tc *tc)
{
	int soerr = 0;
	socklen_t sl = sizeof(soerr);
	if (getsockopt(tc->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
		soerr = errno;
	if (soerr != 0) {
		reverse_fail_local(t, tc, soerr, "connect");
		return;
	}
	reverse_claim(t, tc, false);
}

/* ---- relaying ---- */

static int64_t take_credit(struct sbx_client *c, struct call *k, size_t want)
{
	pthread_mutex_lock(&c->mu);
	int64_t n = k->send_credit;
	if (n > 0 && (uint64_t)n > want)
		n = (int64_t)want;
	if (n > 0)
		k->send_credit -= n;
	pthread_mutex_unlock(&c->mu);
	return n;
}

static void give_back_credit(struct sbx_client *c, struct call *k, int64_t n)
{
	pthread_mutex_lock(&c->mu);
	k->send_credit += n;
	pthread_mutex_unlock(&c->mu);
}

static bool has_credit(struct sbx_client *c, struct call *k)
{
	pthread_mutex_lock(&c->mu);
	bool yes = k->send_credit > 0;
	pthread_mutex_unlock(&c->mu);
	return yes;
}

/* Throw away what a failed frame left in the pipe. */
static void pipe_drain(struct sbx_tunnel *t)
{
	while (read(t->pipefd[0], t->buf, TUN_READ_MAX) > 0)
		;
}

static int splice_setup(struct sbx_tunnel *t)
{
	if (t->pipefd[0] >= 0)
		return 0;
	if (pipe2(t->pipefd, O_CLOEXEC | O_NONBLOCK) < 0) {
		t->no_splice = true;
		return -1;
	}
	int sz = fcntl(t->pipefd[1], F_SETPIPE_SZ, (int)TUN_PIPE_SIZE);
	if (sz < 0)
		sz = fcntl(t->pipefd[1], F_GETPIPE_SZ);
	t->pipe_size = sz > 0 ? (size_t)sz : 4096;
	return 0;
}

/* The n bytes in the pipe as one DATA frame of stream id (sbx__send_pipe: a frame once
 * begun is finished or the connection is broken). 0, or -1 with err. */
static int send_spliced(struct sbx_tunnel *t, uint32_t id, size_t n, struct sbx_error *err)
{
	if (sbx__send_pipe(t->c, id, t->pipefd[0], n, ms_from_now(TUN_SEND_MS), err) < 0) {
		pipe_drain(t); /* what a frame never begun left there */
		return -1;
	}
	if (__atomic_load_n(&t->c->no_splice_out, __ATOMIC_RELAXED))
		t->no_splice = true; /* the connection takes no splice: copy */
	return 0;
}

/* Local socket -> shim by splice, within credit: 1 done, may be more (or the connection
 * ended), 0 nothing more to read now, -1 splice cannot be used here (copy instead). */
static int tc_splice_local(struct sbx_tunnel *t, struct tc *tc)
{
	struct sbx_client *c = t->c;
	size_t chunk = c->max_frame < t->pipe_size ? c->max_frame : t->pipe_size;
	int64_t credit = take_credit(c, tc->k, chunk);
	if (credit <= 0)
		return 0;
	ssize_t n;
	do
		n = splice(tc->fd, NULL, t->pipefd[1], NULL, (size_t)credit, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	while (n < 0 && errno == EINTR);
	if (n == 0) {
		/* EOF: FIN */
		give_back_credit(c, tc->k, credit);
		struct sbx_error e;
		if (sbx__send(c, tc->k->id, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0, ms_from_now(TUN_SEND_MS), &e) < 0)
			tc_lost(t, tc, &e);
		else
			tc->local_eof = true;
		return 1;
	}
	if (n < 0) {
		give_back_credit(c, tc->k, credit);
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		if (errno == EINVAL || errno == ENOSYS) {
			t->no_splice = true;
			return -1;
		}
		struct sbx_error e;
		sbx__fail(&e, SBX_ERR_LOCAL, errno, tc->from, "recv");
		tc_lost(t, tc, &e);
		return 1;
	}
	if (n < credit)
		give_back_credit(c, tc->k, credit - n);
	struct sbx_error e;
	if (send_spliced(t, tc->k->id, (size_t)n, &e) < 0) {
		tc_lost(t, tc, &e);
		return 1;
	}
	tc->bytes_in += (uint64_t)n;
	if ((size_t)n < TUN_BULK_END)
		tc->bulk = false;
	/* less than asked: the socket is empty now (poll says when it is not) */
	return n < credit ? 0 : 1;
}

/* Local socket -> shim, within credit. */
static void tc_read_local(struct sbx_tunnel *t, struct tc *tc)
{
	struct sbx_client *c = t->c;
	size_t chunk = c->max_frame < TUN_READ_MAX ? c->max_frame : TUN_READ_MAX;
	for (int round = 0; round < 4 && !tc->local_eof; round++) {
		if (tc->bulk && !t->no_splice && c->trace == NULL && splice_setup(t) == 0) {
			int r = tc_splice_local(t, tc);
			if (r == 0 || tc->gone)
				return;
			if (r > 0)
				continue;
		}
		int64_t credit = take_credit(c, tc->k, chunk);
		if (credit <= 0)
			return;
		ssize_t n = recv(tc->fd, t->buf, (size_t)credit, MSG_DONTWAIT);
		if (n < 0) {
			give_back_credit(c, tc->k, credit);
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			struct sbx_error e;
			sbx__fail(&e, SBX_ERR_LOCAL, errno, tc->from, "recv");
			tc_lost(t, tc, &e);
			return;
		}
		if (n < credit)
			give_back_credit(c, tc->k, credit - n);
		struct sbx_error e;
		int rc = sbx__send(c, tc->k->id, FRAME_DATA, n == 0 ? FRAME_FLAG_FIN : 0, t->buf, (size_t)n,
				   ms_from_now(TUN_SEND_MS), &e);
		if (rc < 0) {
			tc_lost(t, tc, &e);
			return;
		}
		if (n == 0)
			tc->local_eof = true;
		else
			tc->bytes_in += (uint64_t)n;
		if ((size_t)n >= TUN_BULK_MIN)
			tc->bulk = true;
		if (n < credit)
			return; /* the socket is empty now */
	}
}

/* The first of the frames being written is done: its credit is owed, FIN passed on. */
static void tc_wr_shift(struct tc *tc)
{
	struct rx_item *it = tc->wr[0];
	bool fin = (it->flags & FRAME_FLAG_FIN) != 0;
	tc->grant += it->len;
	sbx__rx_free(it);
	memmove(tc->wr, tc->wr + 1, (tc->nwr - 1) * sizeof(tc->wr[0]));
	tc->nwr--;
	tc->wr_off = 0;
	if (fin && !tc->shut_wr) {
		shutdown(tc->fd, SHUT_WR);
		tc->shut_wr = true;
	}
}

/* A piped item first in wr: its bytes from the call's pipe into the socket. false: the
 * socket is full (POLLOUT) or the connection ended. */
static bool tc_splice_piped(struct sbx_tunnel *t, struct tc *tc)
{
	struct rx_item *it = tc->wr[0];
	struct rx_pipe *p = tc->k->rx_pipe; /* set before the item was queued, kept with k */
	while (tc->wr_off < it->len) {
		ssize_t w =
			splice(p->fd[0], NULL, tc->fd, NULL, it->len - tc->wr_off, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return false; /* POLLOUT */
		if (w <= 0) {
			struct sbx_error e;
			sbx__fail(&e, SBX_ERR_LOCAL, w < 0 ? errno : EPIPE, tc->from, "send");
			tc_end(t, tc, SBX_TUNNEL_CLOSE, &e);
			return false;
		}
		tc->wr_off += (size_t)w;
		tc->bytes_out += (uint64_t)w;
		pthread_mutex_lock(&t->c->mu);
		p->queued -= (size_t)w;
		pthread_mutex_unlock(&t->c->mu);
	}
	tc_wr_shift(tc);
	return true;
}

/* Shim -> local socket: what is queued for the stream, as far as the socket takes it,
 * several frames per sendmsg (a piped one alone, spliced). */
static void tc_write_frames(struct sbx_tunnel *t, struct tc *tc)
{
	while (!tc->gone) {
		/* take frames up to one with FIN (nothing may follow it) */
		while (tc->nwr < TUN_WRITE_ITEMS &&
		       (tc->nwr == 0 || (tc->wr[tc->nwr - 1]->flags & FRAME_FLAG_FIN) == 0)) {
			struct rx_item *it = sbx__call_pop(tc->k);
			if (it == NULL)
				break;
			if (it->type != FRAME_DATA) {
				sbx__rx_free(it);
				continue;
			}
			tc->wr[tc->nwr++] = it;
		}
		if (tc->nwr == 0)
			return;
		if (tc->wr[0]->piped) {
			/* its bytes wait in the call's pipe: spliced on, alone */
			if (!tc_splice_piped(t, tc))
				return;
			continue;
		}
		struct iovec iov[TUN_WRITE_ITEMS];
		int niov = 0;
		size_t total = 0;
		for (unsigned i = 0; i < tc->nwr && !tc->wr[i]->piped; i++) {
			size_t off = i == 0 ? tc->wr_off : 0;
			if (tc->wr[i]->len > off) {
				iov[niov++] = (struct iovec){tc->wr[i]->data + off, tc->wr[i]->len - off};
				total += tc->wr[i]->len - off;
			}
		}
		size_t w = 0;
		if (total > 0) {
			struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
			ssize_t r = sendmsg(tc->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK)
					return; /* POLLOUT */
				struct sbx_error e;
				sbx__fail(&e, SBX_ERR_LOCAL, errno, tc->from, "send");
				tc_end(t, tc, SBX_TUNNEL_CLOSE, &e);
				return;
			}
			w = (size_t)r;
			tc->bytes_out += (uint64_t)w;
		}
		/* the frames written whole go (empty ones too), a partial one stays first */
		while (tc->nwr > 0 && !tc->wr[0]->piped) {
			size_t rest = tc->wr[0]->len - tc->wr_off;
			if (w < rest) {
				tc->wr_off += w;
				break;
			}
			w -= rest;
			tc_wr_shift(tc);
		}
		if (tc->nwr > 0 && total > 0 && tc->wr_off < tc->wr[0]->len)
			return; /* the socket is full: POLLOUT */
	}
}

/* ... and the credit for what was written goes back in one WINDOW per round. */
static void tc_write_local(struct sbx_tunnel *t, struct tc *tc)
{
	tc_write_frames(t, tc);
	/* after the shim's FIN no DATA comes: credit would be wasted on it. Small amounts
	 * wait: the shim's credit is far larger than what is held back (the initial window,
	 * at least 4 * TUN_GRANT_MIN, then the extra window too), and a connection that
	 * carries a few bytes costs no WINDOW, nor the shim a wake-up for it. */
	if (tc->gone || tc->shut_wr || tc->grant < TUN_GRANT_MIN)
		return;
	struct sbx_error e;
	uint32_t n = tc->grant;
	if (!tc->extra_sent) {
		/* the deeper pipe (PROTOCOL.md 12.5) goes with the first credit handed back:
		 * a connection that carries a few bytes needs no frame of its own for it */
		n += TUN_EXTRA_WINDOW;
		tc->extra_sent = true;
	}
	tc->grant = 0;
	if (sbx__call_grant(tc->k, n, ms_from_now(TUN_SEND_MS), &e) < 0)
		tc_end(t, tc, SBX_TUNNEL_CLOSE, &e);
}

/* Look at a connection's stream: "connected", data to write, its end. */
static void tc_service(struct sbx_tunnel *t, struct tc *tc)
{
	if (tc->gone || tc->k == NULL)
		return;
	if (tc->state == TC_WAIT_CONNECTED) {
		struct rx_item *it = sbx__call_pop(tc->k);
		if (it == NULL) {
			if (sbx__call_done(tc->k)) {
				struct sbx_error e = tc->k->err;
				if (e.kind == SBX_ERR_NONE)
					sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL,
						  "the shim ended the connection early");
				tc_end(t, tc, SBX_TUNNEL_FAIL, &e);
			}
			return;
		}
		bool ok = false;
		if (it->type == FRAME_EVENT) {
			Shim__V1__Event *ev = shim__v1__event__unpack(NULL, it->len, it->data);
			ok = ev != NULL && ev->kind_case == SHIM__V1__EVENT__KIND_TUNNEL_CONNECTED;
			if (ok && t->kind == SBX_TUNNEL_FORWARD && ev->tunnel_connected->peer != NULL)
				snprintf(tc->to, sizeof(tc->to), "%s", ev->tunnel_connected->peer);
			if (ev != NULL)
				shim__v1__event__free_unpacked(ev, NULL);
		}
		sbx__rx_free(it);
		if (!ok) {
			struct sbx_error e;
			sbx__fail(&e, SBX_ERR_PROTOCOL, EPROTO, NULL, "expected the tunnel_connected event");
			tc_end(t, tc, SBX_TUNNEL_FAIL, &e);
			return;
		}
		tc->state = TC_RELAY;
		set_active(t, +1);
		log_event(t, SBX_TUNNEL_OPEN, tc, NULL);
	}
	if (tc->state != TC_RELAY)
		return;
	tc_write_local(t, tc);
	if (tc->gone)
		return;
	if (tc->nwr == 0 && sbx__call_done(tc->k)) {
		struct sbx_error e = tc->k->err;
		tc_end(t, tc, SBX_TUNNEL_CLOSE, e.kind != SBX_ERR_NONE ? &e : NULL);
	}
}

/* The tunnel's own stream: incoming connections (reverse), or its end. 1: ended. */
static int tunnel_service(struct sbx_tunnel *t)
{
	for (;;) {
		struct rx_item *it = sbx__call_pop(t->tk);
		if (it == NULL)
			break;
		if (it->type == FRAME_EVENT && t->kind == SBX_TUNNEL_REVERSE) {
			Shim__V1__Event *ev = shim__v1__event__unpack(NULL, it->len, it->data);
			if (ev != NULL && ev->kind_case == SHIM__V1__EVENT__KIND_TUNNEL_INCOMING)
				reverse_incoming(t, ev->tunnel_incoming);
			if (ev != NULL)
				shim__v1__event__free_unpacked(ev, NULL);
		}
		sbx__rx_free(it);
	}
	if (!sbx__call_done(t->tk))
		return 0;
	pthread_mutex_lock(&t->mu);
	if (t->tk->err.kind != SBX_ERR_NONE) {
		t->end_err = t->tk->err;
		t->end_rc = -1;
	}
	pthread_mutex_unlock(&t->mu);
	return 1;
}

static void reap_gone(struct sbx_tunnel *t)
{
	for (struct tc **pp = &t->conns; *pp != NULL;) {
		struct tc *tc = *pp;
		if (tc->gone) {
			*pp = tc->next;
			t->nconns--;
			free(tc);
		} else {
			pp = &tc->next;
		}
	}
}

static struct pollfd *pfd_room(struct sbx_tunnel *t, unsigned n)
{
	if (n > t->pfd_cap) {
		unsigned cap = n * 2;
		struct pollfd *p = realloc(t->pfd, cap * sizeof(*p));
		if (p == NULL)
			return NULL;
		t->pfd = p;
		t->pfd_cap = cap;
	}
	return t->pfd;
}

static void pipe_close(struct sbx_tunnel *t)
{
	for (int i = 0; i < 2; i++) {
		if (t->pipefd[i] >= 0)
			close(t->pipefd[i]);
		t->pipefd[i] = -1;
	}
}

static void *relay_main(void *arg)
{
	struct sbx_tunnel *t = arg;
	struct sbx_client *c = t->c;
	while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
		if (tunnel_service(t))
			break;
		for (struct tc *tc = t->conns; tc != NULL; tc = tc->next)
			tc_service(t, tc);
		reap_gone(t);

		/* [0] [1]: the connection (sbx__pump), [2] our eventfd, [3] the listener */
		unsigned n = 4;
		struct pollfd *p = pfd_room(t, 4 + t->nconns);
		if (p == NULL) {
			struct timespec ts = {0, 10000000};
			nanosleep(&ts, NULL);
			continue;
		}
		p[2] = (struct pollfd){.fd = t->evfd, .events = POLLIN};
		uint64_t now = sbx__now_ns();
		int timeout = 1000;
		bool accepting = t->lfd >= 0 && t->nconns < TUN_MAX_CONNS;
		if (accepting && now < t->accept_pause_until) {
			accepting = false;
			timeout = (int)((t->accept_pause_until - now) / 1000000u) + 1;
		}
		p[3] = (struct pollfd){.fd = accepting ? t->lfd : -1, .events = POLLIN};
		for (struct tc *tc = t->conns; tc != NULL; tc = tc->next) {
			tc->pidx = -1;
			short ev = 0;
			if (tc->state == TC_LOCAL_CONNECTING) {
				if (now >= tc->connect_deadline) {
					reverse_fail_local(t, tc, ETIMEDOUT, "connect");
					continue;
				}
				uint64_t left = (tc->connect_deadline - now) / 1000000u + 1;
				if (left < (uint64_t)timeout)
					timeout = (int)left;
				ev = POLLOUT;
			} else if (tc->state == TC_RELAY && tc->fd >= 0) {
				if (tc->nwr > 0)
					ev |= POLLOUT;
				if (!tc->local_eof && has_credit(c, tc->k))
					ev |= POLLIN;
			} else if (tc->state == TC_WAIT_CONNECTED && tc->fd >= 0 && tc->k != NULL) {
				/* bytes sent before "connected" are held by the shim */
				if (!tc->local_eof && has_credit(c, tc->k))
					ev |= POLLIN;
			}
			if (ev == 0)
				continue;
			tc->pidx = (int)n;
			p[n++] = (struct pollfd){.fd = tc->fd, .events = ev};
		}
		struct sbx_error e;
		int r = sbx__pump(c, t->evfd, p, n, timeout, &e);
		if (r < 0) {
			pthread_mutex_lock(&t->mu);
			t->end_err = e;
			t->end_rc = -1;
			pthread_mutex_unlock(&t->mu);
			break;
		}
		if (p[2].revents & POLLIN) {
			uint64_t v;
			ssize_t rd = read(t->evfd, &v, sizeof(v));
			(void)rd;
		}
		if (r == 0)
			continue;
		if (p[3].fd >= 0 && (p[3].revents & POLLIN))
			forward_accept(t);
		for (struct tc *tc = t->conns; tc != NULL; tc = tc->next) {
			if (tc->pidx < 0 || tc->gone)
				continue;
			short re = p[tc->pidx].revents;
			if (re == 0)
				continue;
			if (tc->state == TC_LOCAL_CONNECTING) {
				reverse_connected(t, tc);
				continue;
			}
			if (tc->state == TC_WAIT_CONNECTED) {
				if (re & (POLLIN | POLLHUP | POLLERR))
					tc_read_local(t, tc);
				continue;
			}
			if (re & (POLLOUT | POLLERR | POLLHUP))
				tc_write_local(t, tc);
			if (!tc->gone && (re & (POLLIN | POLLHUP | POLLERR)))
				tc_read_local(t, tc);
		}
	}

	/* the end: every connection goes (CANCEL to the shim for those still open), then
	 * the tunnel's stream, which makes the shim close its listener */
	for (struct tc *tc = t->conns; tc != NULL; tc = tc->next) {
		if (tc->gone)
			continue;
		struct sbx_error e;
		sbx__fail(&e, SBX_ERR_LOCAL, ECONNABORTED, NULL, "tunnel %s closed", t->id);
		tc_end(t, tc, tc->state == TC_RELAY ? SBX_TUNNEL_CLOSE : SBX_TUNNEL_FAIL, &e);
	}
	reap_gone(t);
	if (t->lfd >= 0) {
		close(t->lfd);
		t->lfd = -1;
	}
	sbx__call_free(t->tk);
	t->tk = NULL;
	sbx__client_del_waker(c, t->evfd);
	pthread_mutex_lock(&t->mu);
	t->ended = true;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	if (__atomic_load_n(&t->self_close, __ATOMIC_ACQUIRE)) {
		/* closed from the log callback: nobody joins; the handle is ours to free */
		pthread_detach(pthread_self());
		close(t->evfd);
		pipe_close(t);
		pthread_mutex_destroy(&t->mu);
		pthread_cond_destroy(&t->cv);
		free(t->buf);
		free(t->pfd);
		free(t);
	}
	return NULL;
}

/* ---- opening ---- */

static struct sbx_tunnel *tunnel_alloc(struct sbx_client *c, int kind, const struct sbx_tunnel_opts *opts,
				       struct sbx_error *err)
{
	struct sbx_tunnel *t = calloc(1, sizeof(*t));
	if (t == NULL) {
		sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	struct sbx_tunnel_opts o = SBX_TUNNEL_OPTS_INIT;
	if (opts != NULL && sbx__struct_in(&o, sizeof(o), opts, "sbx_tunnel_opts", err) < 0) {
		free(t);
		return NULL;
	}
	t->o = o;
	t->c = c;
	t->kind = kind;
	t->lfd = -1;
	t->evfd = -1;
	t->pipefd[0] = t->pipefd[1] = -1;
	pthread_mutex_init(&t->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->cv, &ca);
	pthread_condattr_destroy(&ca);
	t->buf = malloc(TUN_READ_MAX);
	if (t->buf == NULL) {
		sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		free(t);
		return NULL;
	}
	return t;
}

static void tunnel_free(struct sbx_tunnel *t)
{
	if (t->tk != NULL)
		sbx__call_free(t->tk);
	if (t->lfd >= 0)
		close(t->lfd);
	if (t->evfd >= 0)
		close(t->evfd);
	pipe_close(t);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t->buf);
	free(t->pfd);
	free(t);
}

/* Send the tunnel's request and wait for its tunnel_ready event; start the thread. */
static int tunnel_start(struct sbx_tunnel *t, const Shim__V1__Request *req, struct sbx_error *err)
{
	struct sbx_client *c = t->c;
	if (!sbx_client_has_feature(c, "tunnel"))
		return sbx__fail(err, SBX_ERR_REMOTE, ENOSYS, NULL, "this shim has no tunnels (feature \"tunnel\")");
	uint64_t deadline = ms_from_now(TUN_SEND_MS);
	t->tk = sbx__start_request(c, req, deadline, err);
	if (t->tk == NULL)
		return -1;
	if (sbx__call_wait_for(t->tk, SBX__WAIT_NEXT, deadline, NULL, err) < 0)
		return -1;
	struct rx_item *it = sbx__call_pop(t->tk);
	if (it == NULL) {
		if (t->tk->err.kind != SBX_ERR_NONE) {
			sbx__copy_error(err, &t->tk->err);
			return -1;
		}
		return sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim ended the tunnel at once");
	}
	Shim__V1__Event *ev = it->type == FRAME_EVENT ? shim__v1__event__unpack(NULL, it->len, it->data) : NULL;
	sbx__rx_free(it);
	if (ev == NULL || ev->kind_case != SHIM__V1__EVENT__KIND_TUNNEL_READY) {
		if (ev != NULL)
			shim__v1__event__free_unpacked(ev, NULL);
		return sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "expected the tunnel_ready event");
	}
	snprintf(t->id, sizeof(t->id), "%s", ev->tunnel_ready->tunnel_id);
	if (t->kind == SBX_TUNNEL_REVERSE)
		t->port = ev->tunnel_ready->port;
	snprintf(t->guest, sizeof(t->guest), "%s%s%s:%u", strchr(ev->tunnel_ready->host, ':') ? "[" : "",
		 ev->tunnel_ready->host, strchr(ev->tunnel_ready->host, ':') ? "]" : "", ev->tunnel_ready->port);
	shim__v1__event__free_unpacked(ev, NULL);

	t->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->evfd < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, errno, NULL, "eventfd: %s", sbx_strerror(errno));
	if (sbx__client_add_waker(c, t->evfd, err) < 0)
		return -1;
	int rc = pthread_create(&t->thread, NULL, relay_main, t);
	if (rc != 0) {
		sbx__client_del_waker(c, t->evfd);
		return sbx__fail(err, SBX_ERR_LOCAL, rc, NULL, "pthread_create: %s", sbx_strerror(rc));
	}
	t->started = true;
	return 0;
}

/* tunnel_start(), then hand t over in *out; t is freed when it fails. */
static int tunnel_open(struct sbx_tunnel *t, const Shim__V1__Request *req, struct sbx_tunnel **out,
		       struct sbx_error *err)
{
	if (tunnel_start(t, req, err) < 0) {
		tunnel_free(t);
		return -1;
	}
	*out = t;
	return 0;
}

SBX_API int sbx_forward_open(struct sbx_client *c, const char *bind_host, unsigned bind_port, const char *guest_host,
			     unsigned guest_port, const struct sbx_tunnel_opts *opts, struct sbx_tunnel **out,
			     struct sbx_error *err)
{
	if (c == NULL || out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no client or no handle pointer given");
	if (bind_port > 65535 || guest_port == 0 || guest_port > 65535)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "port out of range");
	struct sockaddr_storage ss;
	socklen_t sl;
	if (resolve(bind_host, bind_port, true, &ss, &sl, err) < 0)
		return -1;
	struct sbx_tunnel *t = tunnel_alloc(c, SBX_TUNNEL_FORWARD, opts, err);
	if (t == NULL)
		return -1;
	char where[80];
	netaddr_format(&ss, where, sizeof(where));
	t->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (t->lfd < 0 || setsockopt(t->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(t->lfd, (struct sockaddr *)&ss, sl) < 0 || listen(t->lfd, t->o.backlog > 0 ? t->o.backlog : 128) < 0) {
		int en = errno;
		sbx__fail(err, SBX_ERR_LOCAL, en, where, "listen");
		tunnel_free(t);
		return -1;
	}
	struct sockaddr_storage bound;
	socklen_t bl = sizeof(bound);
	getsockname(t->lfd, (struct sockaddr *)&bound, &bl);
	char bstr[80];
	netaddr_format(&bound, bstr, sizeof(bstr));
	t->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port :
						      ((struct sockaddr_in *)&bound)->sin_port);

	Shim__V1__TunnelForwardRequest fr = SHIM__V1__TUNNEL_FORWARD_REQUEST__INIT;
	fr.host = (char *)(uintptr_t)guest_host;
	fr.port = guest_port;
	fr.remote = bstr;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_FORWARD;
	req.tunnel_forward = &fr;
	return tunnel_open(t, &req, out, err);
}

SBX_API int sbx_reverse_open(struct sbx_client *c, const char *guest_host, unsigned guest_port, const char *local_host,
			     unsigned local_port, const struct sbx_tunnel_opts *opts, struct sbx_tunnel **out,
			     struct sbx_error *err)
{
	if (c == NULL || out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no client or no handle pointer given");
	if (guest_port > 65535 || local_port == 0 || local_port > 65535)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "port out of range");
	struct sbx_tunnel *t = tunnel_alloc(c, SBX_TUNNEL_REVERSE, opts, err);
	if (t == NULL)
		return -1;
	if (resolve(local_host, local_port, false, &t->local, &t->local_len, err) < 0) {
		tunnel_free(t);
		return -1;
	}
	netaddr_format(&t->local, t->local_str, sizeof(t->local_str));
	Shim__V1__TunnelListenRequest lr = SHIM__V1__TUNNEL_LISTEN_REQUEST__INIT;
	lr.host = (char *)(uintptr_t)guest_host;
	lr.has_port = 1;
	lr.port = guest_port;
	lr.remote = t->local_str;
	if (t->o.backlog > 0) {
		lr.has_backlog = 1;
		lr.backlog = (uint32_t)t->o.backlog;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_LISTEN;
	req.tunnel_listen = &lr;
	return tunnel_open(t, &req, out, err);
}

SBX_API const char *sbx_tunnel_id(const struct sbx_tunnel *t)
{
	return t->id;
}

SBX_API unsigned sbx_tunnel_port(const struct sbx_tunnel *t)
{
	return t->port;
}

SBX_API unsigned sbx_tunnel_active(struct sbx_tunnel *t)
{
	pthread_mutex_lock(&t->mu);
	unsigned n = t->active;
	pthread_mutex_unlock(&t->mu);
	return n;
}

SBX_API int sbx_tunnel_wait(struct sbx_tunnel *t, int timeout_ms, struct sbx_error *err)
{
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : ms_from_now(timeout_ms);
	pthread_mutex_lock(&t->mu);
	while (!t->ended) {
		uint64_t now = sbx__now_ns();
		if (now >= deadline)
			break;
		uint64_t until = deadline - now > 1000000000u ? now + 1000000000u : deadline;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u), .tv_nsec = (long)(until % 1000000000u)};
		pthread_cond_timedwait(&t->cv, &t->mu, &ts);
	}
	int rc = !t->ended ? 1 : t->end_rc < 0 ? -1 : 0;
	if (rc < 0)
		sbx__copy_error(err, &t->end_err);
	pthread_mutex_unlock(&t->mu);
	return rc;
}

SBX_API void sbx_tunnel_close(struct sbx_tunnel *t)
{
	if (t == NULL)
		return;
	if (!t->started) {
		tunnel_free(t);
		return;
	}
	if (pthread_equal(pthread_self(), t->thread)) {
		__atomic_store_n(&t->self_close, 1, __ATOMIC_RELEASE);
		__atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
		return;
	}
	__atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
	uint64_t one = 1;
	ssize_t w = write(t->evfd, &one, sizeof(one));
	(void)w;
	pthread_join(t->thread, NULL);
	close(t->evfd);
	t->evfd = -1;
	tunnel_free(t);
}

/* ---- listing and closing by id ---- */

static void copy_str(char *dst, size_t size, const char *src)
{
	snprintf(dst, size, "%s", src != NULL ? src : "");
}

SBX_API int sbx_tunnels_list(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_tunnel_info ***out,
			     size_t *n, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (c == NULL || out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no client or no output given");
	*out = NULL;
	if (n != NULL)
		*n = 0;
	Shim__V1__TunnelListRequest lr = SHIM__V1__TUNNEL_LIST_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNELS;
	req.tunnels = &lr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_TUNNELS, err);
	if (r == NULL)
		return -1;
	size_t cnt = r->tunnels != NULL ? r->tunnels->n_tunnels : 0;
	struct sbx_tunnel_info **v = calloc(cnt + 1, sizeof(*v));
	for (size_t i = 0; v != NULL && i < cnt; i++) {
		struct sbx_tunnel_info *t = calloc(1, sizeof(*t));
		if (t == NULL) {
			sbx_tunnels_free(v);
			v = NULL;
			break;
		}
		v[i] = t;
		const Shim__V1__TunnelInfo *ti = r->tunnels->tunnels[i];
		t->struct_size = sizeof(*t);
		copy_str(t->id, sizeof(t->id), ti->tunnel_id);
		t->kind = ti->kind == SHIM__V1__TUNNEL_KIND__TUNNEL_KIND_FORWARD ? SBX_TUNNEL_FORWARD :
										   SBX_TUNNEL_REVERSE;
		copy_str(t->host, sizeof(t->host), ti->host);
		t->port = ti->port;
		copy_str(t->remote, sizeof(t->remote), ti->remote);
		copy_str(t->client, sizeof(t->client), ti->client);
		t->active = ti->active;
		t->total = ti->total;
		t->bytes_in = ti->bytes_in;
		t->bytes_out = ti->bytes_out;
	}
	shim__v1__result__free_unpacked(r, NULL);
	if (v == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	*out = v;
	if (n != NULL)
		*n = cnt;
	return 0;
}

SBX_API void sbx_tunnels_free(struct sbx_tunnel_info **list)
{
	if (list == NULL)
		return;
	for (size_t i = 0; list[i] != NULL; i++)
		free(list[i]);
	free(list);
}

SBX_API int sbx_tunnel_close_id(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id,
				struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (c == NULL || id == NULL || id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no client or no tunnel id given");
	Shim__V1__TunnelCloseRequest cr = SHIM__V1__TUNNEL_CLOSE_REQUEST__INIT;
	cr.tunnel_id = (char *)(uintptr_t)id;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_TUNNEL_CLOSE;
	req.tunnel_close = &cr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_DONE, err);
	if (r == NULL)
		return -1;
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}
