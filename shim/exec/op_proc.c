/* op_proc.c: requests about processes by id: attach, wait, signal, ps, rmproc, resize.
 *
 * attach (detached processes only): EVENT started {id, pid}; then the replay of
 * the ring buffers unless no_replay: all of stdout's ring, then all of stderr's
 * (the interleaving of the two is not kept in the rings); then, with follow, live
 * output as it comes until the process has exited and its output is closed: DATA
 * FIN, END ExitStatus. Without follow: DATA FIN after the replay, then END
 * ExitStatus if the process has exited, else END Done. CANCEL only detaches.
 * Output is never held back for an attached client: the pipes are always drained
 * into the rings, and an attached client reads from the rings at its own pace; one
 * that falls more than a ring behind skips ahead (it misses the bytes the ring
 * dropped meanwhile). With stdin, the client's DATA goes to the process's stdin
 * (one such client at a time: EBUSY), and its FIN closes it (a pty gets VEOF). */
#include "conn.h"
#include "frame.h"
#include "log.h"
#include "op_exec.h"
#include "op.h"
#include "ops.h"
#include "proc.h"
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>

/* An attach's state (op->data); the op is the attachment's owner and, with stdin, the
 * stdin writer. */
struct attach {
	struct proc_attachment pa;
	struct proc *p;         /* a reference of the op's */
	uint64_t pos[2];        /* next byte to send, per channel (ring offsets) */
	uint64_t replay_end[2]; /* the heads when the attach began */
	int phase;              /* 0: replay stdout, 1: replay stderr, 2: live */
	int last;               /* live: the channel sent last (to alternate) */
	bool follow, writes_stdin;
};

/* A wait, or an rmproc with kill (op->data; the op is the attachment's owner). */
struct waiter {
	struct proc_attachment pa;
	struct proc *p; /* a reference of the op's */
	bool remove;    /* rmproc: remove once reaped, END Done; else wait: END ExitStatus */
};

static void exit_reply(struct op *op, const struct proc *p)
{
	Shim__V1__ExitStatus ex;
	op_exec_fill_exit(p, &ex);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_EXIT;
	res.exit = &ex;
	op_end(op, &res);
}

static struct proc *lookup(const char *id, struct shim_err *err)
{
	struct proc *p = id != NULL ? proc_lookup(id) : NULL;
	if (p == NULL)
		err_set(err, ENOENT, id != NULL ? id : "", "no such process");
	return p;
}

/* ---- attach ---- */

/* While the stream lives: stdin's credit goes back on it (attach_taken). */
static void attach_unlink(struct op *op)
{
	struct attach *a = op->data;
	proc_attach_remove(a->p, &a->pa);
	if (a->writes_stdin)
		proc_stdin_release(a->p, op);
}

static void attach_finish(struct op *op)
{
	struct attach *a = op->data;
	struct proc *p = a->p;
	attach_unlink(op);
	stream_send_data(op->st, NULL, 0, true);
	if (p->state == PROC_EXITED)
		exit_reply(op, p);
	else
		op_end_done(op);
}

/* Send what the client may take now; ends the stream when there is no more. */
static void attach_pump(struct op *op)
{
	struct attach *a = op->data;
	struct proc *p = a->p;
	for (;;) {
		int ch;
		uint64_t limit;
		if (a->phase < 2) {
			ch = a->phase;
			limit = a->replay_end[ch];
		} else {
			if (!a->follow) {
				attach_finish(op);
				return;
			}
			/* alternate between the channels that have bytes waiting */
			int first = 1 - a->last;
			ch = -1;
			for (int k = 0; k < 2; k++) {
				int c = (first + k) % 2;
				if (a->pos[c] < p->out[c].ring.head) {
					ch = c;
					break;
				}
			}
			if (ch < 0) {
				if (p->done)
					attach_finish(op);
				return; /* attach_changed() calls again */
			}
			limit = p->out[ch].ring.head;
		}
		const struct ring *r = &p->out[ch].ring;
		if (a->pos[ch] < ring_tail(r))
			a->pos[ch] = ring_tail(r); /* fell behind: the ring dropped those bytes */
		if (a->pos[ch] >= limit) {
			if (a->phase < 2)
				a->phase++;
			continue;
		}
		size_t room = stream_can_send(op->st);
		if (room == 0) {
			stream_wait_writable(op->st);
			return;
		}
		const uint8_t *d;
		size_t n = ring_peek(r, a->pos[ch], &d);
		if (n > limit - a->pos[ch])
			n = (size_t)(limit - a->pos[ch]);
		if (n > room)
			n = room;
		stream_send_flagged(op->st, d, n, ch == 1 ? FRAME_FLAG_STDERR : 0);
		a->pos[ch] += n;
		a->last = ch;
	}
}

/* New output in the rings, the exit, or the output closed. */
static void attach_changed(struct proc *p, void *owner)
{
	(void)p;
	attach_pump(owner);
}

/* Stdin bytes the process took (written, or dropped): the client's credit back. */
static void attach_taken(struct proc *p, void *owner, size_t n)
{
	(void)p;
	struct op *op = owner;
	stream_grant(op->st, (uint32_t)n);
}

static const struct proc_owner_ops attach_owner_ops = {.changed = attach_changed, .taken = attach_taken};

static int attach_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct attach *a = op->data;
	if (!a->writes_stdin) {
		if (len == 0)
			return 0;
		return err_set(err, EINVAL, NULL, "stdin was not requested for this attach");
	}
	if (a->p->in_owner != op) {
		stream_grant(op->st, (uint32_t)len); /* no longer the writer: dropped */
		return 0;
	}
	return proc_stdin_data(a->p, buf, len, fin, err);
}

static void attach_cancel(struct op *op)
{
	attach_unlink(op); /* the process goes on */
}

static int attach_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__AttachRequest *r = op->req->attach;
	struct proc *p = lookup(r->id, err);
	if (p == NULL)
		return -1;
	if (!p->detached)
		return err_set(err, EINVAL, p->id, "not a detached process (attach needs its ring buffers)");
	if (r->stdin) {
		if (!p->has_stdin)
			return err_set(err, EINVAL, p->id, "the process was started without stdin");
		if (p->in_owner != NULL)
			return err_set(err, EBUSY, p->id, "another client is writing its stdin");
	}
	struct attach *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op->data = a;
	proc_ref(p);
	a->p = p;
	a->follow = r->follow;
	a->last = 1;
	for (int i = 0; i < 2; i++) {
		a->replay_end[i] = p->out[i].ring.head;
		a->pos[i] = r->no_replay ? a->replay_end[i] : ring_tail(&p->out[i].ring);
	}
	if (r->stdin) {
		a->writes_stdin = true;
		proc_stdin_take(p, &attach_owner_ops, op);
	}
	a->pa.ops = &attach_owner_ops;
	a->pa.owner = op;
	proc_attach_add(p, &a->pa);
	op_exec_send_started(op->st, p);
	attach_pump(op);
	return 0;
}

/* attach, wait, rmproc: off the process (already, but for a cancelled wait), its
 * reference dropped */
static void attachment_release(struct op *op, struct proc_attachment *pa, struct proc *p)
{
	proc_attach_remove(p, pa);
	proc_unref(p);
	free(op->data);
}

static void attach_release(struct op *op)
{
	struct attach *a = op->data;
	if (a != NULL)
		attachment_release(op, &a->pa, a->p);
}

/* ---- wait, and rmproc with kill ---- */

/* Reaped (proc.c took the waiter off). */
static void waiter_exited(struct proc *p, void *owner)
{
	struct op *op = owner;
	struct waiter *w = op->data;
	if (w->remove) {
		proc_unlist(p);
		op_end_done(op);
	} else {
		exit_reply(op, p);
	}
}

static const struct proc_owner_ops waiter_owner_ops = {.exited = waiter_exited};

static int add_waiter(struct op *op, struct proc *p, bool remove, struct shim_err *err)
{
	struct waiter *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op->data = w;
	proc_ref(p);
	w->p = p;
	w->remove = remove;
	w->pa.ops = &waiter_owner_ops;
	w->pa.owner = op;
	proc_attach_add(p, &w->pa);
	return 0;
}

static void waiter_release(struct op *op)
{
	struct waiter *w = op->data;
	if (w != NULL)
		attachment_release(op, &w->pa, w->p);
}

static int wait_start(struct op *op, struct shim_err *err)
{
	struct proc *p = lookup(op->req->wait->id, err);
	if (p == NULL)
		return -1;
	if (p->state == PROC_EXITED) {
		exit_reply(op, p);
		return 0;
	}
	return add_waiter(op, p, false, err);
}

static int rmproc_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__RemoveProcessRequest *r = op->req->rmproc;
	struct proc *p = lookup(r->id, err);
	if (p == NULL)
		return -1;
	if (p->state == PROC_EXITED) {
		proc_unlist(p);
		op_end_done(op);
		return 0;
	}
	if (!r->kill)
		return err_set(err, EBUSY, p->id, "the process is running (kill it first, or set kill)");
	/* answered once it is reaped and removed */
	if (add_waiter(op, p, true, err) < 0)
		return -1;
	proc_kill(p, SIGKILL, false);
	return 0;
}

/* ---- signal, resize ---- */

static int signal_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__SignalRequest *r = op->req->signal;
	/* 0 checks that the process is there, as kill(2) does */
	if (r->signal < 0 || r->signal >= NSIG)
		return err_set(err, EINVAL, NULL, "bad signal %d", r->signal);
	struct proc *p = lookup(r->id, err);
	if (p == NULL)
		return -1;
	if (p->state == PROC_EXITED)
		return err_set(err, ESRCH, p->id, "the process has exited");
	if (proc_kill(p, r->signal, r->only_leader) < 0)
		return err_set(err, errno, p->id, "kill");
	op_end_done(op);
	return 0;
}

static int resize_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__ResizeRequest *r = op->req->resize;
	if (r->rows > 0xffff || r->cols > 0xffff)
		return err_set(err, EINVAL, NULL, "terminal size %ux%u out of range", r->rows, r->cols);
	struct proc *p = lookup(r->id, err);
	if (p == NULL)
		return -1;
	if (!p->pty)
		return err_set(err, ENOTTY, p->id, "the process has no terminal");
	int fd = p->in_fd >= 0 ? p->in_fd : p->out[0].fd;
	if (p->state == PROC_EXITED || fd < 0)
		return err_set(err, ESRCH, p->id, "the process has exited");
	struct winsize ws = {.ws_row = (unsigned short)r->rows, .ws_col = (unsigned short)r->cols};
	/* the kernel sends SIGWINCH to the terminal's foreground process group */
	if (ioctl(fd, TIOCSWINSZ, &ws) < 0)
		return err_set(err, errno, p->id, "ioctl(TIOCSWINSZ)");
	op_end_done(op);
	return 0;
}

/* ---- ps ---- */

static int ps_start(struct op *op, struct shim_err *err)
{
	size_t n = 0;
	for (struct proc *p = proc_first(); p != NULL; p = proc_next(p))
		if (p->state == PROC_RUNNING || p->state == PROC_EXITED)
			n++;
	struct exec_info_buf *bufs = calloc(n ? n : 1, sizeof(*bufs));
	Shim__V1__ProcessInfo **infos = calloc(n ? n : 1, sizeof(*infos));
	if (bufs == NULL || infos == NULL) {
		free(bufs);
		free(infos);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	Shim__V1__ProcessList list = SHIM__V1__PROCESS_LIST__INIT;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_PS;
	res.ps = &list;
	/* The answer must fit in one frame: argv is shortened, then left out, then
	 * the oldest entries are dropped. */
	static const size_t argv_steps[] = {PROC_ARGV_KEEP, 256, 0};
	size_t max = op->st->conn->max_frame;
	int rc = 0;
	for (size_t s = 0; s < ARRAY_SIZE(argv_steps); s++) {
		size_t i = 0;
		for (struct proc *p = proc_first(); p != NULL && i < n; p = proc_next(p)) {
			if (p->state != PROC_RUNNING && p->state != PROC_EXITED)
				continue;
			op_exec_info_buf_free(&bufs[i]);
			if (op_exec_fill_info(p, &bufs[i], argv_steps[s]) < 0)
				rc = -1;
			infos[i] = &bufs[i].info;
			i++;
		}
		list.n_processes = i;
		list.processes = infos;
		if (rc < 0 || shim__v1__result__get_packed_size(&res) <= max)
			break;
	}
	while (rc == 0 && list.n_processes > 0 && shim__v1__result__get_packed_size(&res) > max) {
		list.processes++;
		list.n_processes--;
	}
	if (rc == 0)
		op_end(op, &res);
	for (size_t i = 0; i < n; i++)
		op_exec_info_buf_free(&bufs[i]);
	free(bufs);
	free(infos);
	if (rc < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	return 0;
}

/* on the loop, as the process table is: each answers from start, but attach, wait and
 * rmproc with kill, which attach to the process and answer later */
const struct op_kind op_signal_kind = {SHIM__V1__REQUEST__KIND_SIGNAL, "signal", 0, .start = signal_start};
const struct op_kind op_ps_kind = {SHIM__V1__REQUEST__KIND_PS, "ps", 0, .start = ps_start};
const struct op_kind op_attach_kind = {
	SHIM__V1__REQUEST__KIND_ATTACH,
	"attach",
	OP_TAKES_DATA,
	.start = attach_start,
	.data = attach_data,
	.writable = attach_pump,
	.cancel = attach_cancel,
	.release = attach_release,
};
const struct op_kind op_wait_kind = {SHIM__V1__REQUEST__KIND_WAIT, "wait", 0, .start = wait_start,
				     .release = waiter_release};
const struct op_kind op_rmproc_kind = {SHIM__V1__REQUEST__KIND_RMPROC, "rmproc", 0, .start = rmproc_start,
				       .release = waiter_release};
const struct op_kind op_resize_kind = {SHIM__V1__REQUEST__KIND_RESIZE, "resize", 0, .start = resize_start};
