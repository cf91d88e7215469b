/* op.h: one request's life in the shim. The dispatcher makes a struct op for every
 * REQUEST, decodes the Request into it once, and frees it in one place: when its stream
 * is gone (END, ERROR, CANCEL or a lost connection) and no job of it runs.
 *
 * A request kind is one row, struct op_kind: what runs on the loop (start, data,
 * writable, cancel), what runs on a worker (job) and back on the loop after it
 * (job_done), and release. A kind with no start is a one-shot: dispatch runs its job at
 * once and ends the stream with the reply it packed. */
#ifndef SHIM_OP_H
#define SHIM_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "fsctx.h"
#include "shim.pb-c.h"
#include "worker.h"

struct conn;
struct stream;
struct op;

/* A packed Result made on a worker thread, handed to the loop to send. */
struct op_reply {
	uint8_t *buf;
	size_t len;
};

/* A job of an op: embedded in the op's state (the op has one, op->job; a family with
 * several jobs at once embeds more). run() executes on a worker (with the request's
 * file identity entered when the kind has OP_FS), done() back on the loop — only while
 * the stream lives: once it is gone the job's result is dropped and release() tidies.
 * The op is not freed while a job is submitted, and every job of an op whose stream
 * goes is interrupted (worker_interrupt). An op's first job runs alone: it settles the
 * identity (fs_ctx_settle) for the jobs after it. */
struct op_job {
	struct work work;
	struct op *op;
	void (*run)(struct op_job *job);
	void (*done)(struct op_job *job);
	int rc;              /* run()'s outcome for done(): 0, or -1 with err */
	struct shim_err err; /* (also when the identity could not be entered: run skipped) */
	struct op_job *next; /* the op's jobs in flight */
	bool last;           /* op_at_end()'s */
};

enum op_flags {
	OP_FS = 1 << 0,         /* acts on files: Request.fs applies to its jobs (fsctx.h) */
	OP_TAKES_DATA = 1 << 1, /* the client may send DATA on its stream */
};

struct op_kind {
	Shim__V1__Request__KindCase kind;
	const char *name;
	unsigned flags; /* enum op_flags */
	/* On the loop: set the op up. 0 when the op has taken over (it ends the stream
	 * now or later), -1 with err to fail it at once. NULL: run the job at once. */
	int (*start)(struct op *op, struct shim_err *err);
	/* On a worker, the op's main job (op_run_job): 0 or -1 with err. A one-shot packs
	 * its Result into op->reply. */
	int (*job)(struct op *op, struct shim_err *err);
	/* On the loop after job (rc its return, err its error); NULL: end the stream with
	 * op->reply, or fail it with err. Only while the stream lives. */
	void (*job_done)(struct op *op, int rc, const struct shim_err *err);
	/* DATA from the client (OP_TAKES_DATA); as stream_ops.data. */
	int (*data)(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err);
	/* Optional (OP_TAKES_DATA): DATA straight into a pipe of the op's, as
	 * stream_ops.data_pipe and data_piped. */
	int (*data_pipe)(struct op *op, size_t n);
	int (*data_piped)(struct op *op, size_t n, bool fin, struct shim_err *err);
	/* More DATA may be sent (stream_wait_writable). */
	void (*writable)(struct op *op);
	/* The stream is going away without END (CANCEL, disconnect, shutdown, a failed
	 * hook): stop what runs on the loop. op->st is still valid inside and NULL after;
	 * the op's jobs are interrupted after it. */
	void (*cancel)(struct op *op);
	/* The op is being freed: release what hangs off op->data. NULL: free(op->data). */
	void (*release)(struct op *op);
};

struct op {
	const struct op_kind *kind;
	struct stream *st;      /* NULL once the stream is gone */
	Shim__V1__Request *req; /* decoded once, for the op's life */
	struct fs_ctx fsx;      /* OP_FS: the identity its jobs act as */
	void *data;             /* the family's state */
	struct op_job job;      /* the main job (kind->job) */
	struct op_reply reply;  /* a one-shot's Result */
	struct op_job *jobs;    /* in flight */
	struct op_job *at_end;  /* op_at_end()'s, not submitted yet */
	unsigned refs;          /* op_hold() */
	unsigned depth;         /* inside a hook: not freed until it returns */
	/* A one-shot's reply goes from its worker when the connection lets it
	 * (conn_wire_send): the connection, the stream's id, and who ended the stream
	 * (0 nobody yet, 1 the worker, 2 the loop), under the connection's wmu. */
	struct conn *wire;
	uint32_t wire_id;
	int wire_claim;
};

/* Make the op for the REQUEST on st (req taken over) and start it. -1 with err: the
 * caller fails the stream (the op is gone then). */
int op_begin(struct stream *st, const struct op_kind *kind, Shim__V1__Request *req, struct shim_err *err);

/* Submit the main job (kind->job, then kind->job_done on the loop). */
void op_run_job(struct op *op);
/* Submit a job of the family's own to the pool, or to a thread of its own
 * (worker_run_own: -1 with errno when no thread can be made, job not submitted). */
void op_submit(struct op *op, struct op_job *job);
int op_submit_own(struct op *op, struct op_job *job);
/* Interrupt every job of the op in flight (worker_interrupt). */
void op_interrupt(struct op *op);
/* The op's last job, for what must happen off the loop however the op ends (a file
 * closed on what may be a hung mount, a cancelled write's temp file removed): run on a
 * worker once the stream is gone and no other job of the op is in flight, as the
 * request's identity with OP_FS (the shim's, should that not take), never interrupted;
 * its done() always runs, then
 * release(). One per op: a later call replaces one not started yet. */
void op_at_end(struct op *op, struct op_job *job);

/* Something outside the op's stream and jobs keeps it (a process's owner pointer, a
 * timer): the op lives until op_put(). */
void op_hold(struct op *op);
void op_put(struct op *op);

/* End the op's stream with END carrying result (packed here), or with ERROR. */
void op_end(struct op *op, const Shim__V1__Result *result);
void op_fail(struct op *op, const struct shim_err *err);
/* op_end with Result.done. */
void op_end_done(struct op *op);

/* An op with a start hook whose END may go from the worker that makes it, as a
 * one-shot's does (conn_wire_send): asked for in start (op_wire_open). Only for an END
 * after which nothing of the stream's is queued on the loop (no DATA, no WINDOW sent
 * for it yet), since the worker's frame may go before those. op_wire_end, from the
 * job: pack res and send it now if the connection lets it; true if it went. Then, in
 * the job's done(), op_wire_ended is true and has ended the stream (as op_end would;
 * the op goes after its hooks as always); false: end it as usual. */
void op_wire_open(struct op *op);
bool op_wire_end(struct op *op, struct op_job *job, const Shim__V1__Result *res);
bool op_wire_ended(struct op *op);

/* Pack res into reply (on the worker). -1 with err (ENOMEM). */
int op_reply_pack(struct op_reply *reply, const Shim__V1__Result *res, struct shim_err *err);
/* Reply with Result.done. */
int op_reply_done(struct op_reply *reply, struct shim_err *err);

#endif
