/* conn.h: one client connection: frames in and out, bounded buffers, its streams. */
#ifndef SHIM_CONN_H
#define SHIM_CONN_H

#include <ev.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

struct server;
struct stream;
struct listener;

/* What an operation provides for the life of its stream. Every hook is optional. */
struct stream_ops {
	/* DATA from the client; len may be 0 when fin is set. The op hands credit back
	 * with stream_grant() as it consumes the bytes. Return -1 with err to fail the
	 * stream (ERROR is sent and cancel() called). */
	int (*data)(struct stream *st, const uint8_t *buf, size_t len, bool fin, struct shim_err *err);
	/* More DATA may be sent now (credit arrived or the connection's output drained). */
	void (*writable)(struct stream *st);
	/* The stream is going away without END: client CANCEL, disconnect, shutdown or a
	 * failed hook. Release or orphan everything; do not touch st afterwards. */
	void (*cancel)(struct stream *st);
	/* The op ended the stream itself (stream_end, stream_fail): st is being freed. */
	void (*gone)(struct stream *st);
	/* Optional: asked before cancel() whether the stream's END or ERROR has gone out
	 * already, from a worker (conn_wire_send): true, and the stream goes as after
	 * stream_end (gone(), no cancel(), no ERROR). */
	bool (*ended)(struct stream *st);
	/* Optional, with data: DATA bytes not read yet may go from the socket straight
	 * into a pipe of the op's (spliced, never in the input buffer). Returns the pipe's
	 * write end when n more bytes fit in it and nothing of the stream waits before
	 * them (else -1: they come through data(), which must then queue them behind what
	 * is in the pipe). Asked again before every splice. */
	int (*data_pipe)(struct stream *st, size_t n);
	/* n more bytes are in that pipe (a whole payload, or what came of it before the
	 * rest goes through data()); fin: they end the client's data. As data(). */
	int (*data_piped)(struct stream *st, size_t n, bool fin, struct shim_err *err);
};

struct stream {
	struct conn *conn;
	uint32_t id;
	struct stream *hnext;
	struct stream *wnext; /* in conn->blocked while waiting to send */
	bool blocked;
	const struct stream_ops *ops;
	void *op_data;
	int64_t send_credit; /* DATA bytes we may still send */
	uint32_t recv_left;  /* DATA bytes the client may still send */
	bool client_fin;
	size_t held;     /* bytes its producer holds for it (stream_hold, stream_reserve) */
	size_t reserved; /* of which stream_reserve()'s */
};

#define CONN_BUCKETS 64

struct obuf_chunk {
	struct obuf_chunk *next;
	size_t len, off, cap;
	uint8_t data[];
};

enum conn_state { CONN_HELLO, CONN_READY, CONN_CLOSING, CONN_DEAD };

struct conn {
	struct server *srv;
	struct listener *lst; /* NULL for stdio */
	struct conn *prev, *next;
	enum conn_state state;
	int rfd, wfd;
	ev_io rio, wio;
	ev_timer keepalive, linger;
	ev_timer handshake; /* the HELLO must come within --handshake-timeout */
	double last_rx;     /* when input last arrived (any bytes; mono_s) */
	bool ping_out;
	const char *doomed; /* conn_send could not queue: closed from the loop next (why) */
	bool need_token;
	bool admitted; /* counted in srv->n_admitted (else in lst->n_pending) */
	bool want_flush;
	bool direct_wait;        /* a stream_send_direct() found the socket full: wio is ours too */
	uint32_t direct_rest_id; /* the stream whose frame rest is all the output queued (0: none) */
	char peer[96];

	uint8_t *in;
	size_t inlen, incap;
	size_t inoff; /* where the bytes not handled yet begin (process_input) */
	/* The payload of a DATA frame being received outside the input buffer: rx_left
	 * bytes of it still in the socket, for stream rx_stream, spliced into its op's pipe
	 * (stream_ops.data_pipe) or, once that cannot take them, read and given to data()
	 * (rx_copy). rx_fin: the frame carries FIN. */
	uint32_t rx_stream;
	size_t rx_left;
	size_t rx_piped; /* spliced into the pipe, the op not told yet (rx_piped_tell) */
	bool rx_fin, rx_copy;
	double rx_bulk_until; /* big DATA to a pipe came lately: reads end at a header (mono_s) */

	struct obuf_chunk *out_head, *out_tail;
	size_t outlen;
	size_t held;        /* bytes the producers of its streams hold (stream_hold, stream_reserve) */
	size_t reserved;    /* of which stream_reserve()'s */
	bool budget_parked; /* a stream waits for room in the daemon's --max-buffer */

	uint32_t max_frame;
	uint32_t peer_window; /* client's initial window */
	uint32_t last_stream;
	struct stream *buckets[CONN_BUCKETS];
	unsigned nstreams;
	struct stream *blocked, *blocked_tail; /* streams waiting for output room, FIFO */
	unsigned nblocked;

	/* The socket as a worker may write to it (conn_wire_*): every write to wfd, the
	 * loop's and a worker's, is made holding wmu, so that frames never interleave. */
	pthread_mutex_t wmu;
	bool wire_ok;   /* (wmu) a worker may write a whole frame: READY, and no frame part-written */
	uint8_t *wedge; /* (wmu) the rest of a worker's frame the socket took only part of */
	size_t wedge_len, wedge_off;
	unsigned wire_ended; /* (atomic) streams a worker ended that the loop has not freed yet */
	unsigned wire_refs;  /* ops that may reply from a worker: the memory stays while > 0 */
	bool reaped;         /* fds closed, in no list: freed by the last conn_wire_put() */
};

/* Take over fds (rfd may equal wfd) and start reading. need_token: the HELLO must
 * carry the configured token. */
struct conn *conn_new(struct server *s, int rfd, int wfd, struct listener *lst, bool need_token, const char *peer);
/* At an accepted HELLO, before HELLO_OK: the connection leaves its listener's
 * pre-HELLO budget for the admitted ones (--max-connections). 0, or -1 with EAGAIN in
 * err when the admitted budget is full (the stdio connection is never refused). */
int conn_admit(struct conn *c, struct shim_err *err);
/* Send ERROR on stream 0, stop reading, close once it is flushed. */
void conn_fail(struct conn *c, const struct shim_err *err);
/* Shutdown: end every stream with ERROR ECANCELED, flush, then close. */
void conn_shutdown(struct conn *c);
/* Cancel every stream and close now. */
void conn_close(struct conn *c, const char *why);
/* Append one frame to the output; payload may be NULL when len is 0. */
void conn_send(struct conn *c, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len);
/* Flush what can be written now (called before the loop sleeps). */
void conn_flush(struct conn *c);
/* Bytes of DATA the connection would take now without passing its soft limit or the
 * daemon's memory budget (budget.h). */
size_t conn_room(const struct conn *c);
/* For budget_init(): wake the connections whose streams wait for budget; drop the
 * spare output chunks. Loop thread. */
void conn_budget_wake(void);
void conn_budget_trim(void);
/* Free dead connections; only at a safe point (before the loop sleeps). */
void conn_reap_dead(struct server *s);
/* A one-shot's reply (END or ERROR) sent by the worker that made it, saving the loop's
 * wake-up on the way (op.c). Loop: may a job of c reply so? If so, c is kept (its memory,
 * not its fds) until conn_wire_put(). */
bool conn_wire_take(struct conn *c);
void conn_wire_put(struct conn *c);
/* Worker: send the frame now, whole, if nothing of the loop's is part-written and the
 * connection is READY. true: it is the connection's (sent, or its rest kept to go
 * first at the loop's next flush), *claim set to 1; false: nothing was written (the
 * socket is busy or full, or *claim is 2: the loop ended the stream). */
bool conn_wire_send(struct conn *c, int *claim, uint32_t stream, uint8_t type, const void *payload, size_t len);
/* Loop: the stream of *claim is going without its reply: true if a worker has sent
 * it (*claim 1); else *claim becomes 2 and no worker will. */
bool conn_wire_settle(struct conn *c, int *claim);
/* Loop: a stream whose END or ERROR a worker sent goes (as stream_end, without the frame). */
void stream_wire_ended(struct stream *st);

/* Process raw input bytes as if they had been read (used by the fuzz harness). */
void conn_feed(struct conn *c, const uint8_t *buf, size_t len);

/* Streams. */
struct stream *stream_lookup(struct conn *c, uint32_t id);
/* Start sending DATA: how much may go now (credit and connection room), at most
 * FRAME_DATA_CHUNK (_upto: most) and never beyond max_frame. */
size_t stream_can_send(const struct stream *st);
size_t stream_can_send_upto(const struct stream *st, size_t most);
/* Queue DATA: len within the stream's credit (and the connection's room:
 * stream_can_send()), split into frames of at most the frame size, fin on the last;
 * len 0 with fin is FIN alone. */
void stream_send_data(struct stream *st, const void *buf, size_t len, bool fin);
/* The same with DATA flags of the op's own (FRAME_FLAG_STDERR). */
void stream_send_flagged(struct stream *st, const void *buf, size_t len, uint8_t flags);
/* Zero-copy DATA for a producer whose buffer stays put until this returns: when
 * nothing is queued on the connection, frames of buf (up to len and the stream's
 * credit) are written straight to the peer, headers and payload in one writev; the
 * rest of a frame the peer took only part of is queued. Returns the payload bytes
 * consumed (count them as sent). 0: nothing went; *busy then says the socket is full
 * or the queue holds only the rest of this stream's last frame (the stream is
 * registered for writable(), as by stream_wait_writable), else use stream_can_send()
 * and stream_send_data() (other output queued: streams take turns; or no credit). */
size_t stream_send_direct(struct stream *st, const void *buf, size_t len, bool *busy);
/* The same, for a producer that hands the client back the credit of what it sends (an
 * echo): stream_grant() of the payload consumed, its WINDOW written behind the DATA in
 * the same writev (none once the client sent FIN). */
size_t stream_send_direct_grant(struct stream *st, const void *buf, size_t len, bool *busy);
/* Ask for a writable() call when room appears. */
void stream_wait_writable(struct stream *st);
/* Memory a producer fills before the bytes are DATA (a read's buffer): up to want
 * bytes of the connection's share (CONN_HOLD_MAX) and of the daemon's budget, at least
 * min, else 0 with the stream registered for writable() (called once there is room).
 * Credit is the producer's business: hold no more than it may send. The bytes are the
 * stream's until stream_unhold(); once the stream has ended (ended, failed or
 * cancelled) they are the producer's, who hands them back with budget_give(). */
size_t stream_hold(struct stream *st, size_t want, size_t min);
void stream_unhold(struct stream *st, size_t n);
/* Memory an operation keeps for the life of its stream (its state, fixed buffers),
 * counted against the daemon's budget from the start: 0, or -1 with EAGAIN in err when
 * the budget has no room for it (the request is refused, not queued). The operation
 * gives the bytes back with budget_give() when it frees them (the connection forgets
 * them when the stream ends). */
int stream_reserve(struct stream *st, size_t n, struct shim_err *err);
/* Give back n reserved bytes while the stream goes on (a buffer shrunk after a burst). */
void stream_unreserve(struct stream *st, size_t n);
/* Give the client n more bytes of DATA credit. */
void stream_grant(struct stream *st, uint32_t n);
/* End with END carrying the packed Result payload, or with ERROR; frees st. */
void stream_end(struct stream *st, const void *result, size_t len);
void stream_fail(struct stream *st, const struct shim_err *err);
/* DATA payload bytes spliced from connections into ops' pipes (stream_ops.data_pipe),
 * and those of such payloads that had to be read and given to data() instead (a pipe
 * out of room), for tests. */
extern uint64_t conn_rx_spliced, conn_rx_copied;
/* One DATA frame of the len bytes waiting in the pipe pfd (len within the stream's
 * credit and max_frame): when nothing is queued on the connection, the header is
 * written and the payload spliced from the pipe straight to the peer; what the peer
 * does not take now (all of it when output is queued) is read from the pipe into the
 * output queue, so the frame always goes whole. Returns len (counted as sent). */
size_t stream_send_pipe(struct stream *st, int pfd, size_t len);

#endif
