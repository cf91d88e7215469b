/* op.c: the life of one request — made and started by the dispatcher, its jobs on
 * workers, its stream's hooks, and the one place that frees it. */
#include "op.h"
#include "conn.h"
#include "dispatch.h"
#include "frame.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void op_free(struct op *op)
{
	if (op->kind->release != NULL)
		op->kind->release(op);
	else
		free(op->data);
	free(op->reply.buf);
	shim__v1__request__free_unpacked(op->req, NULL);
	if (op->wire != NULL)
		conn_wire_put(op->wire);
	free(op);
}

static void job_link(struct op *op, struct op_job *job);

/* The one place an op goes: its stream gone, no job in flight, nobody holding it, and
 * no hook of it on the stack — after its last job, if it has one. */
static void op_maybe_free(struct op *op)
{
	if (op->st != NULL || op->jobs != NULL || op->refs != 0 || op->depth != 0)
		return;
	struct op_job *last = op->at_end;
	if (last != NULL) {
		op->at_end = NULL;
		job_link(op, last);
		last->last = true;
		worker_submit(&last->work);
		return;
	}
	op_free(op);
}

/* ---- the stream's hooks ---- */

static int op_stream_data(struct stream *st, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct op *op = st->op_data;
	if (!(op->kind->flags & OP_TAKES_DATA) || op->kind->data == NULL)
		return err_set(err, EINVAL, NULL, "this request takes no data");
	op->depth++;
	int rc = op->kind->data(op, buf, len, fin, err);
	op->depth--;
	/* rc -1: the caller aborts the stream, which ends in op_stream_cancel */
	if (rc == 0)
		op_maybe_free(op);
	return rc;
}

static int op_stream_data_pipe(struct stream *st, size_t n)
{
	struct op *op = st->op_data;
	if (!(op->kind->flags & OP_TAKES_DATA) || op->kind->data_pipe == NULL)
		return -1;
	return op->kind->data_pipe(op, n);
}

static int op_stream_data_piped(struct stream *st, size_t n, bool fin, struct shim_err *err)
{
	struct op *op = st->op_data;
	op->depth++;
	int rc = op->kind->data_piped(op, n, fin, err);
	op->depth--;
	if (rc == 0)
		op_maybe_free(op);
	return rc;
}

static void op_stream_writable(struct stream *st)
{
	struct op *op = st->op_data;
	if (op->kind->writable == NULL)
		return;
	op->depth++;
	op->kind->writable(op);
	op->depth--;
	op_maybe_free(op);
}

static void op_stream_cancel(struct stream *st)
{
	struct op *op = st->op_data;
	op->depth++;
	if (op->kind->cancel != NULL)
		op->kind->cancel(op);
	op->st = NULL;
	op_interrupt(op);
	op->depth--;
	op_maybe_free(op);
}

/* Has the worker sent the one-shot's reply? Then the stream goes as after it. */
static bool op_stream_ended(struct stream *st)
{
	struct op *op = st->op_data;
	return op->wire != NULL && conn_wire_settle(op->wire, &op->wire_claim);
}

/* The op ended its stream itself (END or ERROR). */
static void op_stream_gone(struct stream *st)
{
	struct op *op = st->op_data;
	op->st = NULL;
	op_maybe_free(op);
}

static const struct stream_ops op_stream_ops = {
	.data = op_stream_data,
	.data_pipe = op_stream_data_pipe,
	.data_piped = op_stream_data_piped,
	.writable = op_stream_writable,
	.cancel = op_stream_cancel,
	.gone = op_stream_gone,
	.ended = op_stream_ended,
};

/* ---- jobs ---- */

static void job_unlink(struct op *op, struct op_job *job)
{
	struct op_job **pp = &op->jobs;
	while (*pp != job)
		pp = &(*pp)->next;
	*pp = job->next;
	job->next = NULL;
}

static void job_run(struct work *w)
{
	struct op_job *job = container_of(w, struct op_job, work);
	struct op *op = job->op;
	job->rc = 0;
	/* the request's identity and resolve flags for every syscall of the job; the last
	 * job tidies up all the same, as the shim, when the identity does not take */
	if ((op->kind->flags & OP_FS) && fs_ctx_begin(&op->fsx, &job->err) < 0) {
		job->rc = -1;
		fs_ctx_leave();
		if (!job->last)
			return;
	}
	job->run(job);
	if (op->kind->flags & OP_FS)
		fs_ctx_leave();
}

static void job_done(struct work *w)
{
	struct op_job *job = container_of(w, struct op_job, work);
	struct op *op = job->op;
	job_unlink(op, job);
	if ((op->st != NULL || job->last) && job->done != NULL) {
		op->depth++;
		job->done(job);
		op->depth--;
	}
	op_maybe_free(op);
}

static void job_link(struct op *op, struct op_job *job)
{
	job->op = op;
	job->rc = 0;
	job->last = false;
	job->work.run = job_run;
	job->work.done = job_done;
	job->next = op->jobs;
	op->jobs = job;
}

void op_submit(struct op *op, struct op_job *job)
{
	job_link(op, job);
	worker_submit(&job->work);
}

int op_submit_own(struct op *op, struct op_job *job)
{
	job_link(op, job);
	if (worker_run_own(&job->work) < 0) {
		int saved = errno;
		job_unlink(op, job);
		errno = saved;
		return -1;
	}
	return 0;
}

void op_interrupt(struct op *op)
{
	for (struct op_job *j = op->jobs; j != NULL; j = j->next)
		if (!j->last)
			worker_interrupt(&j->work);
}

void op_at_end(struct op *op, struct op_job *job)
{
	op->at_end = job;
}

/* the main job: kind->job, its rc and err kept in the op */
static void main_run(struct op_job *job)
{
	struct op *op = job->op;
	job->rc = op->kind->job(op, &job->err);
	if (op->wire == NULL || worker_cancelled(&job->work))
		return;
	/* the reply from here, without the loop's wake-up on its way, when the socket
	 * is free for it (else main_done sends it as always); the client's next call may
	 * come before this thread is idle again */
	worker_job_ending();
	if (job->rc == 0) {
		conn_wire_send(op->wire, &op->wire_claim, op->wire_id, FRAME_END, op->reply.buf, op->reply.len);
	} else {
		uint8_t buf[1600];
		size_t n = disp_pack_error(&job->err, buf, sizeof(buf));
		conn_wire_send(op->wire, &op->wire_claim, op->wire_id, FRAME_ERROR, buf, n);
	}
}

static void main_done(struct op_job *job)
{
	struct op *op = job->op;
	if (op->wire_claim == 1) {
		if (job->rc < 0)
			log_debug("conn %s: stream %u: %s: %s", op->st->conn->peer, op->st->id, job->err.msg,
				  strerror(job->err.code));
		stream_wire_ended(op->st);
	} else if (op->kind->job_done != NULL) {
		op->kind->job_done(op, job->rc, &job->err);
	} else if (job->rc == 0) {
		stream_end(op->st, op->reply.buf, op->reply.len);
	} else {
		stream_fail(op->st, &job->err);
	}
}

void op_wire_open(struct op *op)
{
	if (op->wire == NULL && op->st != NULL && conn_wire_take(op->st->conn)) {
		op->wire = op->st->conn;
		op->wire_id = op->st->id;
	}
}

bool op_wire_end(struct op *op, struct op_job *job, const Shim__V1__Result *res)
{
	if (op->wire == NULL || worker_cancelled(&job->work))
		return false;
	uint8_t small[1024];
	size_t n = shim__v1__result__get_packed_size(res);
	if (n > sizeof(small))
		return false; /* (the loop's path packs it) */
	shim__v1__result__pack(res, small);
	worker_job_ending();
	return conn_wire_send(op->wire, &op->wire_claim, op->wire_id, FRAME_END, small, n);
}

bool op_wire_ended(struct op *op)
{
	if (op->wire_claim != 1)
		return false;
	stream_wire_ended(op->st);
	return true;
}

void op_run_job(struct op *op)
{
	op->job.run = main_run;
	op->job.done = main_done;
	op_submit(op, &op->job);
}

/* ---- the op ---- */

void op_hold(struct op *op)
{
	op->refs++;
}

void op_put(struct op *op)
{
	op->refs--;
	op_maybe_free(op);
}

int op_begin(struct stream *st, const struct op_kind *kind, Shim__V1__Request *req, struct shim_err *err)
{
	struct op *op = calloc(1, sizeof(*op));
	if (op == NULL) {
		shim__v1__request__free_unpacked(req, NULL);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	op->kind = kind;
	op->req = req;
	/* names copied now, looked up on the worker (a user database read may block) */
	if ((kind->flags & OP_FS) && fs_ctx_defer(req->fs, &op->fsx, err) < 0) {
		op_free(op);
		return -1;
	}
	op->st = st;
	st->ops = &op_stream_ops;
	st->op_data = op;
	if (kind->start == NULL) {
		if (kind->job_done == NULL && conn_wire_take(st->conn)) {
			op->wire = st->conn;
			op->wire_id = st->id;
		}
		op_run_job(op);
		return 0;
	}
	op->depth++;
	int rc = kind->start(op, err);
	op->depth--;
	if (rc < 0) {
		/* the caller fails the stream: no hook of ours runs for it, so the op goes now,
		 * after what start submitted (none, by the contract: it failed) */
		st->ops = NULL;
		st->op_data = NULL;
		op->st = NULL;
		op_interrupt(op);
	}
	op_maybe_free(op);
	return rc;
}

void op_fail(struct op *op, const struct shim_err *err)
{
	stream_fail(op->st, err);
}

int op_reply_pack(struct op_reply *reply, const Shim__V1__Result *res, struct shim_err *err)
{
	size_t n = shim__v1__result__get_packed_size(res);
	reply->buf = malloc(n ? n : 1);
	if (reply->buf == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	reply->len = shim__v1__result__pack(res, reply->buf);
	return 0;
}

int op_reply_done(struct op_reply *reply, struct shim_err *err)
{
	Shim__V1__Done d = SHIM__V1__DONE__INIT;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_DONE;
	res.done = &d;
	return op_reply_pack(reply, &res, err);
}

void op_end(struct op *op, const Shim__V1__Result *result)
{
	struct stream *st = op->st;
	uint8_t small[1024];
	size_t n = shim__v1__result__get_packed_size(result);
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (buf == NULL) {
		struct shim_err e;
		err_set(&e, ENOMEM, NULL, "out of memory");
		stream_fail(st, &e);
		return;
	}
	shim__v1__result__pack(result, buf);
	stream_end(st, buf, n);
	if (buf != small)
		free(buf);
}

void op_end_done(struct op *op)
{
	Shim__V1__Done d = SHIM__V1__DONE__INIT;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_DONE;
	res.done = &d;
	op_end(op, &res);
}
