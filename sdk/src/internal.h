/* internal.h: libsbx's private structures: the client, its calls, transports. */
#ifndef SBX_INTERNAL_H
#define SBX_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "sbx.h"
#include "shim.pb-c.h"

/* A frame received for a call and not yet consumed. */
struct rx_item {
	struct rx_item *next;
	uint8_t type;
	uint8_t flags;
	bool piped; /* DATA whose len bytes wait in its call's rx_pipe, not in data */
	/* DATA read straight into its call's sink (sbx__call_sink): the len bytes are at ext,
	 * not in data (the item has no room: cap 0) */
	uint8_t *ext;
	uint32_t len;
	uint32_t cap;
	uint8_t data[];
};

/* A pipe DATA of a call is spliced into from the connection (reader.c), for its consumer
 * to splice on (a tunnel connection's socket: tunnel.c), so the payload is never copied
 * into user memory. queued: bytes in it or promised to it. refs (with the client's mu):
 * the call's, and the reader's while a payload goes in. */
struct rx_pipe {
	int fd[2];
	size_t cap, queued;
	unsigned refs;
};
/* With the client's mu: drop a reference; the last closes the pipe. */
void sbx__rx_pipe_put(struct rx_pipe *p);
/* Free a frame taken with sbx__call_pop(): standard-size ones are kept for reuse. */
void sbx__rx_free(struct rx_item *it);

struct call;
/* Async completion: runs without the client lock, on whatever thread routed the
 * final frame. */
typedef void (*call_done_fn)(struct call *k);

struct call {
	struct sbx_client *client;
	struct call *next; /* in client->calls */
	uint32_t id;       /* stream id; 0 for a ping (and a stream before its REQUEST) */
	bool is_stream;
	uint64_t ping_seq;
	uint64_t start_ns;
	struct rx_item *rx_head, *rx_tail;
	size_t rx_bytes; /* DATA queued, bounded by the window we granted */
	/* DATA the shim may still send on the stream: our initial window plus every WINDOW
	 * granted (sbx__call_grant), less the DATA that came; more is a protocol error */
	int64_t recv_credit;
	bool done;      /* END or ERROR arrived (or the connection died) */
	bool ended;     /* END or ERROR arrived: the shim sends nothing more on the stream */
	bool abandoned; /* the caller gave up: frames for it are dropped */
	int64_t send_credit;
	struct sbx_error err; /* when done with an error */
	uint8_t *result;      /* END payload */
	size_t result_len;
	/* async calls */
	call_done_fn on_done;
	void *ud;
	void *fn;
	/* cancel token attached while a blocking call waits */
	struct sbx_cancel *cancel;
	/* big DATA may come through a pipe (piped items): set by its consumer, which
	 * splices the bytes out (tunnel.c); the pipe is made by the reader when needed */
	bool rx_pipe_ok;
	struct rx_pipe *rx_pipe;
	/* DATA may be read straight into the caller's memory (sbx__call_sink): the stream's
	 * next DATA byte belongs at sink + sink_off (every DATA routed moves it on) */
	uint8_t *sink;
	size_t sink_cap, sink_off;
};

struct sbx_cancel {
	pthread_mutex_t mu;
	bool fired;
	struct sbx_client *client; /* attached while a call waits on it */
};

#define SBX_MAX_WAKERS 64

struct sbx_client {
	pthread_mutex_t mu;  /* calls, rx queues, reader role, state */
	pthread_cond_t cv;   /* broadcast when frames were routed or the reader role freed */
	pthread_mutex_t wmu; /* one frame written at a time; never taken before mu */
	int fd;
	bool no_splice_out; /* fd refused a splice into it (sbx__send_pipe; atomic) */
	int wakefd;         /* eventfd: wakes a reader in poll (cancel, close) */
	pid_t child;        /* exec: transport */
	bool reading;
	bool dead;
	struct sbx_error dead_err;
	uint8_t *in;
	size_t inlen, incap;
	/* A big DATA frame whose payload is being read straight into its item (reader.c);
	 * touched only by the thread holding the reader role, and by client_destroy(). */
	struct rx_item *part;
	uint32_t part_stream;
	uint32_t part_got; /* payload bytes in part->data so far */
	bool rx_bulk;      /* the last read brought such frames: read the next one so too */
	/* A big DATA frame whose payload is being spliced into its call's pipe instead:
	 * part_pipe_left bytes of it still in the socket; part_marker is its piped item
	 * (len: the bytes in the pipe so far). Reader role only, like part. */
	struct rx_pipe *part_pipe;
	struct rx_item *part_marker;
	uint32_t part_pipe_left;
	bool rx_hdr_only; /* a payload was piped: the next read takes a header alone */
	bool rx_drained;  /* the last read emptied the socket: wait before the next one */
	/* the call into whose sink the read in flight puts bytes (reader.c), or NULL:
	 * sbx__call_unsink() waits for it to land */
	struct call *rx_sink_busy;
	uint32_t rx_sink_stream; /* the last stream whose DATA went into its sink, or 0 */
	uint32_t next_id;
	uint64_t next_ping;
	struct call *calls;
	unsigned ncalls;
	uint32_t max_frame;
	uint32_t peer_window; /* DATA credit the shim grants per stream */
	uint32_t my_window;   /* DATA credit we grant per stream */
	int default_timeout_ms;
	sbx_trace_fn trace;
	void *trace_ud;
	struct sbx_server_info info;
	char *strings; /* storage for info's strings */
	/* background relays (tunnel.c): eventfds written when frames were routed or the
	 * reader role came free while a relay waited for it */
	int wakers[SBX_MAX_WAKERS];
	unsigned nwakers;
	unsigned role_waiters;
	int pump_fd; /* the waker of the relay reading in sbx__pump() (it needs no wake-up), or -1 */
};

/* errors.c */
int sbx__fail(struct sbx_error *err, int kind, int code, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
void sbx__copy_error(struct sbx_error *dst, const struct sbx_error *src);

/* abi.c: the struct_size rule (sbx.h's conventions). what names the struct ("sbx_stat").
 * An input: copy the caller's struct_size bytes of in over a zeroed full; EINVAL for a
 * struct_size below the field's own, E2BIG for a larger struct with a non-zero tail.
 * full->struct_size is full_size afterwards. */
int sbx__struct_in(void *full, size_t full_size, const void *in, const char *what, struct sbx_error *err);
/* An output (NULL: none): EINVAL for a bad struct_size, checked before the call acts. */
int sbx__struct_out_check(const void *out, const char *what, struct sbx_error *err);
/* Fill an output in a full-size copy: _get starts it from the caller's fields (its
 * buffers), _put copies it back up to the caller's struct_size (a larger caller's
 * unknown tail zeroed; its struct_size kept). Only after sbx__struct_out_check. */
void sbx__struct_out_get(void *full, size_t full_size, const void *out);
void sbx__struct_out_put(void *out, const void *full, size_t full_size);
/* A public call's opts (NULL stays NULL) read through the rule: *opts points at *full
 * afterwards. Every public function taking a struct sbx_call_opts calls it first. */
int sbx__call_opts(const struct sbx_call_opts **opts, struct sbx_call_opts *full, struct sbx_error *err);

/* transport.c: connect to target, returning a blocking-mode fd (and the child for
 * exec:). -1 with err; *retry set when waiting may help (nothing listening yet). */
int sbx__transport_open(const char *target, int timeout_ms, int *fd, pid_t *child, bool *retry, struct sbx_error *err);
void sbx__transport_reap(pid_t child);

/* connect.c: targets and transports to a connected client (HELLO); closing it. */

/* reader.c: the reader role. With mu held, by any thread: */
/* the connection dies: every call ends with err, the reader stops, relays wake */
void sbx__client_kill(struct sbx_client *c, const struct sbx_error *err);
/* tell every relay to look again (frames for it, or the reader role is free) */
void sbx__wake_relays(struct sbx_client *c);
/* take the free reader role, read and route once (within timeout_ms; mu is dropped
 * meanwhile), give the role back */
void sbx__reader_turn(struct sbx_client *c, int timeout_ms);
/* async calls completed on a dead connection, taken off its list; then run their
 * on_done (without mu) */
struct call *sbx__take_dead_async(struct sbx_client *c);
void sbx__run_done(struct call *list);

/* call.c: calls in flight, sending, waiting; cancel tokens; the generic request path. */
uint64_t sbx__now_ns(void);
/* now + ms; UINT64_MAX for ms < 0 */
uint64_t sbx__deadline_after(int ms);
/* milliseconds until deadline for poll(), capped at 60 s; 0 if passed */
int sbx__poll_ms(uint64_t deadline);
/* with mu held */
void sbx__unlink_call(struct sbx_client *c, struct call *k);
/* with mu held: give up on the call, dropping its queued frames */
void sbx__call_abandon_locked(struct call *k);
/* Absolute deadline for a call; UINT64_MAX for none. */
uint64_t sbx__deadline(struct sbx_client *c, const struct sbx_call_opts *opts);
struct call *sbx__call_new(struct sbx_client *c, bool stream);
/* Send one frame (header + payload) under the write lock; -1 with err. */
int sbx__send(struct sbx_client *c, uint32_t stream, uint8_t type, uint8_t flags, const void *p, size_t len,
	      uint64_t deadline, struct sbx_error *err);
/* One DATA frame of stream whose n payload bytes wait in the pipe pfd (put there by
 * splice from a file or socket, all of them): the header, then the payload spliced on
 * into the connection, under the write lock. A connection whose fd takes no splice
 * gets this frame through memory and sets no_splice_out for the callers. A frame once
 * begun is finished or the connection is broken. 0, or -1 with err. */
int sbx__send_pipe(struct sbx_client *c, uint32_t stream, int pfd, size_t n, uint64_t deadline, struct sbx_error *err);
/* A frame on k's stream with, when grant > 0, a WINDOW of grant written before it in the
 * same write (the credit is counted first, as by sbx__call_grant()). */
int sbx__send_granting(struct call *k, uint32_t grant, uint8_t type, uint8_t flags, const void *p, size_t len,
		       uint64_t deadline, struct sbx_error *err);
/* Take the call's stream id and send its REQUEST, atomically. */
int sbx__send_request(struct call *k, const void *p, size_t len, uint64_t deadline, struct sbx_error *err);
/* The same, with one DATA frame (plen bytes at p, flags) behind the REQUEST in the same
 * write: req holds FRAME_HDR_LEN bytes of room for the REQUEST's header, then its len
 * bytes of payload. The caller took the DATA's credit already. */
int sbx__send_request_data(struct call *k, uint8_t *req, size_t len, uint8_t flags, const void *p, size_t plen,
			   uint64_t deadline, struct sbx_error *err);
/* What sbx__call_wait_for() waits for. The call's end (END or ERROR, or the connection
 * died) always ends the wait too: it returns 0 then (the caller sees the end through
 * sbx__call_done()) unless END_ERR or END_FAILS say otherwise. */
enum {
	SBX__WAIT_FRAME = 1u << 0,  /* a frame is queued for the call */
	SBX__WAIT_CREDIT = 1u << 1, /* the shim granted credit to send DATA */
	/* an end with an error fails the wait with the call's error */
	SBX__WAIT_END_ERR = 1u << 2,
	/* any end fails the wait: the call's error, else EPROTO "the shim ended the stream early" */
	SBX__WAIT_END_FAILS = 1u << 3,
	/* for calls that several threads may wait on at once (a process's stdin writer and
	 * its output reader): a timeout fails only this wait and leaves the call alive, and
	 * a call that another thread abandoned fails the wait with ECANCELED */
	SBX__WAIT_SHARED = 1u << 4,
	/* the next frame, or the end: failing with its error if it has one */
	SBX__WAIT_NEXT = SBX__WAIT_FRAME | SBX__WAIT_END_ERR,
};
/* Wait until what (SBX__WAIT_ bits) is there or the call ends. Returns 0, or -1 with err
 * on timeout (ETIMEDOUT), a fired token (ECANCELED) or an end the bits make a failure (a
 * dead connection ends every call with its error); the call is then abandoned and CANCEL
 * sent, except when a SHARED wait timed out or found the call abandoned. */
int sbx__call_wait_for(struct call *k, unsigned what, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err);
/* The call's credit to send DATA (after a wait for SBX__WAIT_CREDIT: above 0). */
int64_t sbx__call_credit(struct call *k);
/* Ended (END or ERROR, or the connection died) with nothing left queued. */
bool sbx__call_done(struct call *k);
/* Take the next queued frame (caller frees it); NULL if none. */
struct rx_item *sbx__call_pop(struct call *k);
/* Give the shim credit for n more bytes of DATA on the call's stream. Every WINDOW libsbx
 * sends goes through here: the credit is counted before it goes out, and DATA beyond what
 * was counted fails the connection (EPROTO "flow control violated on stream N"). */
int sbx__call_grant(struct call *k, uint32_t n, uint64_t deadline, struct sbx_error *err);
/* Receiving a stream of DATA from the shim (reads, backups): the bytes go to a sink, and
 * credit goes back in batches as they are consumed. */
struct sbx__download {
	sbx_sink_fn sink;
	void *ud;
	uint64_t got;  /* bytes handed to the sink */
	uint32_t owed; /* consumed, not yet granted back */
	bool fin;      /* the shim's FIN arrived */
};
#define SBX__DOWNLOAD_GRANT_BATCH (256u << 10)
/* Take one DATA item of such a stream: refuses DATA after FIN, hands the bytes to the sink
 * (its errno fails the call; freeing the call then sends CANCEL), notes FIN and grants
 * credit back. 0, or -1 with err set (path names what is read). */
int sbx__download_data(struct call *k, struct sbx__download *d, const struct rx_item *it, uint64_t deadline,
		       const char *path, struct sbx_error *err);
/* The DATA the shim sends on k's stream from now on, until sbx__call_unsink(), may be
 * read straight into buf (cap bytes; the position of the first byte not yet taken off
 * the queue): popped items with ext set hold their bytes there, at the place they
 * belong, and need no copy. Not for calls that take DATA piped (rx_pipe_ok). */
void sbx__call_sink(struct call *k, void *buf, size_t cap);
/* No more bytes go into the sink; returns once none is being read into it. Frames
 * queued before keep pointing into it. sbx__call_free() calls it. */
void sbx__call_unsink(struct call *k);
/* Forget the call; sends CANCEL first if it is not done. */
void sbx__call_free(struct call *k);
/* Background relays (tunnel.c). A relay registers an eventfd that is written whenever
 * frames were routed (by whichever thread reads) or the reader role came free; -1
 * with err when SBX_MAX_WAKERS are registered. */
int sbx__client_add_waker(struct sbx_client *c, int fd, struct sbx_error *err);
void sbx__client_del_waker(struct sbx_client *c, int fd);
/* One round of the relay whose waker is self_fd: poll fds[0..nfds) where fds[0] and fds[1] are filled here
 * (the connection and its wake fd, when the reader role is free and taken for the
 * round; else ignored) and route whatever the connection delivered. Returns poll's
 * result (0 on timeout), or -1 with err when the connection is dead. */
int sbx__pump(struct sbx_client *c, int self_fd, struct pollfd *fds, unsigned nfds, int timeout_ms,
	      struct sbx_error *err);
/* A client on fd, a stream already connected to a shim (made non-blocking here): the
 * handshake as sbx_connect() does it once its transport is open (opts->token is the
 * token; no $SBX_TOKEN, no retries). The client owns fd from the call on, also when it
 * fails (-1 with err). For tests/fuzz/fuzz_rx.c, which plays the shim on a socketpair. */
int sbx__client_adopt(int fd, const struct sbx_connect_opts *opts, struct sbx_client **out, struct sbx_error *err);
/* Turn an ERROR payload into err (kind REMOTE). */
void sbx__decode_error(const uint8_t *p, size_t len, int kind, struct sbx_error *err);
void sbx__trace_frame(struct sbx_client *c, const char *dir, const struct frame_hdr *h, const uint8_t *p);

/* fs.c */
void sbx__stat_from(struct sbx_stat *out, const Shim__V1__FileStat *f);

/* call.c: open a stream with a REQUEST; wait for its END and decode the Result
 * (DATA and EVENTs are discarded). */
struct call *sbx__start_request(struct sbx_client *c, const Shim__V1__Request *req, uint64_t deadline,
				struct sbx_error *err);
/* The same with the stream's only DATA (len bytes at data, flags: FIN) in the same write,
 * its credit taken (len must fit the initial window): REQUEST and DATA reach the shim
 * together. */
struct call *sbx__start_request_data(struct sbx_client *c, const Shim__V1__Request *req, uint8_t flags,
				     const void *data, size_t len, uint64_t deadline, struct sbx_error *err);
Shim__V1__Result *sbx__wait_result(struct call *k, uint64_t deadline, struct sbx_cancel *tok, struct sbx_error *err);
/* A file operation's user, group and resolve flags from opts into req->fs (pointing at
 * *fs); nothing (no fs field: the request as before) when opts names none. -1 with
 * err: unknown resolve bits. sbx__call_simple applies it to file requests itself; the
 * stream openers (read, write, list, watch, backup, restore) call it. */
int sbx__fs_options(const struct sbx_call_opts *opts, Shim__V1__Request *req, Shim__V1__FsOptions *fs,
		    struct sbx_error *err);
/* Request, wait, check the Result's kind (a Shim__V1__Result__KindCase). Free the
 * result with shim__v1__result__free_unpacked(). NULL with err on failure. */
Shim__V1__Result *sbx__call_simple(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
				   int kind, struct sbx_error *err);

/* The JSON short escape for byte c (the letter after the backslash: '"', '\\', 'n', 't', 'r',
 * 'b', 'f'), or 0 if c has none. The record writers (backup.c, mount.c) use it, and write the
 * other control characters (below 0x20, and DEL) as \u00XX; sbx's own writer does the same. */
static inline char sbx__json_escape(unsigned char c)
{
	switch (c) {
	case '"':
	case '\\':
		return (char)c;
	case '\n':
		return 'n';
	case '\t':
		return 't';
	case '\r':
		return 'r';
	case '\b':
		return 'b';
	case '\f':
		return 'f';
	default:
		return 0;
	}
}

#endif
