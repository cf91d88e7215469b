/* op_exec.c: the exec request (foreground and detached): prepare on a worker, fork on the loop, stream the I/O.
 *
 * A foreground exec stream carries: EVENT started {id, pid} once execve() has
 * succeeded (or ERROR with the real errno if the command cannot be started: never
 * an exit code), then the output as DATA (stderr flagged STDERR; with a pty
 * everything is stdout), then one empty DATA FIN once both pipes are closed, then
 * END ExitStatus. Client DATA is the command's stdin; the client's FIN closes it
 * (with a pty: the terminal's EOF character is written instead). CANCEL or a lost
 * connection SIGKILLs the whole process group.
 *
 * A detached exec ends with END ProcessInfo as soon as execve() has succeeded; the
 * process then outlives the connection, its output goes into ring buffers (see
 * op_proc.c for attach, wait, signal, ps, rmproc and resize). */
#include "conn.h"
#include "frame.h"
#include "log.h"
#include "op_exec.h"
#include "op.h"
#include "ops.h"
#include "proc.h"
#include "server.h"
#include "spawn.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* An exec's state (op->data). The op is the process's owner until the stream ends
 * (take_fg) or is cancelled; the request is read where it lies, op->req->exec. */
struct exec {
	struct proc *p;         /* a reference of the op's */
	struct spawn_plan plan; /* made and forked on a worker */
	pid_t pid;              /* forked on the worker (0: not, or adopted by the proc) */
	uint64_t forked_at;     /* mono_ns() before the fork, for reaper_watch_since() */
	struct shim_err fork_err;
};

/* ---- messages ---- */

void op_exec_fill_exit(const struct proc *p, Shim__V1__ExitStatus *ex)
{
	shim__v1__exit_status__init(ex);
	ex->id = (char *)p->id;
	ex->pid = (uint32_t)p->pid;
	int st = p->status;
	ex->has_signal = ex->has_core_dumped = ex->has_timed_out = 1;
	if (WIFSIGNALED(st)) {
		ex->exit_code = -1;
		ex->signal = WTERMSIG(st);
		ex->core_dumped = WCOREDUMP(st) != 0;
	} else {
		ex->exit_code = WEXITSTATUS(st);
	}
	ex->duration_ns = p->end_ns > p->start_ns ? p->end_ns - p->start_ns : 0;
	ex->timed_out = p->timed_out;
	ex->has_stdout_truncated = ex->has_stderr_truncated = 1;
	ex->stdout_truncated = p->out[0].truncated;
	ex->stderr_truncated = p->out[1].truncated;
}

int op_exec_fill_info(const struct proc *p, struct exec_info_buf *b, size_t argv_max)
{
	shim__v1__process_info__init(&b->info);
	shim__v1__timestamp__init(&b->started_at);
	b->argv = NULL;
	b->info.id = (char *)p->id;
	b->info.pid = (uint32_t)p->pid;
	b->info.state = p->state == PROC_EXITED ? SHIM__V1__PROCESS_STATE__PROCESS_EXITED :
						  SHIM__V1__PROCESS_STATE__PROCESS_RUNNING;
	b->started_at.sec = p->started_at.tv_sec;
	b->started_at.nsec = (uint32_t)p->started_at.tv_nsec;
	b->info.started_at = &b->started_at;
	b->info.has_detached = b->info.has_pty = 1;
	b->info.detached = p->detached;
	b->info.pty = p->pty;
	if (p->state == PROC_EXITED) {
		op_exec_fill_exit(p, &b->exit);
		b->info.exit = &b->exit;
	}
	if (p->argc > 0 && argv_max > 0 && p->argv != NULL) {
		b->argv = calloc(p->argc, sizeof(*b->argv));
		if (b->argv == NULL)
			return -1;
		size_t off = 0, used = 0, n = 0;
		for (unsigned i = 0; i < p->argc && off < p->argv_len && used < argv_max; i++) {
			size_t l = strlen(p->argv + off);
			size_t take = l < argv_max - used ? l : argv_max - used;
			b->argv[n].data = (uint8_t *)p->argv + off;
			b->argv[n].len = take;
			n++;
			used += take;
			off += l + 1;
		}
		b->info.n_argv = n;
		b->info.argv = b->argv;
	}
	return 0;
}

void op_exec_info_buf_free(struct exec_info_buf *b)
{
	free(b->argv);
	b->argv = NULL;
}

void op_exec_send_started(struct stream *st, const struct proc *p)
{
	Shim__V1__ProcessStarted ps = SHIM__V1__PROCESS_STARTED__INIT;
	ps.id = (char *)p->id;
	ps.pid = (uint32_t)p->pid;
	Shim__V1__Event ev = SHIM__V1__EVENT__INIT;
	ev.kind_case = SHIM__V1__EVENT__KIND_STARTED;
	ev.started = &ps;
	uint8_t buf[128];
	size_t n = shim__v1__event__get_packed_size(&ev);
	if (n > sizeof(buf))
		return; /* cannot happen: id <= 63 bytes */
	shim__v1__event__pack(&ev, buf);
	conn_send(st->conn, st->id, FRAME_EVENT, 0, buf, n);
}

/* ---- what proc.c reports to the exec op ---- */

/* The exec op leaves the process: it is no longer its owner nor writes its stdin. */
static void take_fg(struct op *op)
{
	struct exec *ex = op->data;
	proc_set_owner(ex->p, NULL, NULL);
	proc_stdin_release(ex->p, op);
}

static void exec_started(struct proc *p, void *owner)
{
	struct op *op = owner;
	log_debug("process %s: pid %d runs %s", p->id, (int)p->pid, p->exec_path);
	if (!p->detached) {
		op_exec_send_started(op->st, p);
		return;
	}
	take_fg(op);
	struct exec_info_buf b;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_PROCESS;
	if (op_exec_fill_info(p, &b, PROC_ARGV_KEEP) < 0) {
		struct shim_err e;
		err_set(&e, ENOMEM, NULL, "out of memory");
		op_fail(op, &e);
	} else {
		res.process = &b.info;
		op_end(op, &res);
	}
	op_exec_info_buf_free(&b);
}

static void exec_failed(struct proc *p, void *owner, const struct shim_err *err)
{
	(void)p;
	struct op *op = owner;
	take_fg(op);
	op_fail(op, err);
}

/* Foreground output: as much as the stream's credit and queue allow, up to a pipe's
 * worth (what proc.c reads, or splices as one frame, at a time). */
static size_t exec_room(struct proc *p, void *owner)
{
	(void)p;
	struct op *op = owner;
	size_t n = stream_can_send_upto(op->st, PROC_READ_MAX);
	if (n == 0)
		stream_wait_writable(op->st); /* then exec_writable() */
	return n;
}

/* len is within exec_room(). Stdout goes straight from proc.c's read buffer to the
 * client when nothing is queued on the connection (stream_send_direct: no copy into
 * the connection's output); what the socket does not take, and stderr (its frames
 * carry a flag), is queued behind, in order. */
static void exec_output(struct proc *p, void *owner, int chan, const uint8_t *buf, size_t len)
{
	(void)p;
	struct op *op = owner;
	if (chan == 0) {
		bool busy;
		size_t n = stream_send_direct(op->st, buf, len, &busy);
		buf += n;
		len -= n;
		if (len == 0)
			return;
	}
	stream_send_flagged(op->st, buf, len, chan == 1 ? FRAME_FLAG_STDERR : 0);
}

/* Bulk stdout, len bytes of it in the pipe fd (within exec_room()): its header, then its
 * pages spliced from the command's pipe into the socket; what the socket does not take is
 * read from the pipe into the connection's output, in order behind what is queued. */
static void exec_output_pipe(struct proc *p, void *owner, int fd, size_t len)
{
	(void)p;
	struct op *op = owner;
	stream_send_pipe(op->st, fd, len);
}

static void exec_finished(struct proc *p, void *owner)
{
	struct op *op = owner;
	take_fg(op);
	stream_send_data(op->st, NULL, 0, true);
	Shim__V1__ExitStatus ex;
	op_exec_fill_exit(p, &ex);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_EXIT;
	res.exit = &ex;
	op_end(op, &res);
}

/* Stdin bytes the process took (written, or dropped): the client's credit back. */
static void exec_taken(struct proc *p, void *owner, size_t n)
{
	(void)p;
	struct op *op = owner;
	stream_grant(op->st, (uint32_t)n);
}

static const struct proc_owner_ops exec_owner_ops = {
	.started = exec_started,
	.failed = exec_failed,
	.room = exec_room,
	.output = exec_output,
	.output_pipe = exec_output_pipe,
	.finished = exec_finished,
	.taken = exec_taken,
};

/* ---- the exec stream ---- */

static int exec_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct exec *ex = op->data;
	struct proc *p = ex->p;
	if (p->detached || !p->has_stdin) {
		if (len == 0)
			return 0; /* a bare FIN: nothing to close */
		return err_set(err, EINVAL, NULL, "stdin was not requested for this command");
	}
	if (p->in_owner != op) {
		stream_grant(op->st, (uint32_t)len); /* no longer the writer: dropped */
		return 0;
	}
	return proc_stdin_data(p, buf, len, fin, err);
}

/* Big stdin DATA goes from the socket straight into the command's stdin pipe
 * (conn.c's splice), when nothing of it waits in proc.c's buffer. */
static int exec_data_pipe(struct op *op, size_t n)
{
	struct exec *ex = op->data;
	if (ex->p == NULL || ex->p->detached || !ex->p->has_stdin)
		return -1;
	return proc_stdin_pipe(ex->p, op, n);
}

static int exec_data_piped(struct op *op, size_t n, bool fin, struct shim_err *err)
{
	(void)err;
	struct exec *ex = op->data;
	proc_stdin_piped(ex->p, n, fin);
	return 0;
}

static void exec_writable(struct op *op)
{
	struct exec *ex = op->data;
	proc_owner_writable(ex->p);
}

static void exec_cancel(struct op *op)
{
	struct exec *ex = op->data;
	struct proc *p = ex->p;
	if (p->owner != op)
		return;
	log_debug("process %s: exec stream cancelled: SIGKILL to the group", p->id);
	proc_stdin_release(p, op);
	proc_abandon(p);
}

/* ---- preparing and forking (worker), adopting the pid (loop) ---- */

/* rc -1: not prepared (err). rc 0: forked (ex->pid), or the fork failed (ex->fork_err). */
static int exec_prepare(struct op *op, struct shim_err *err)
{
	struct exec *ex = op->data;
	if (spawn_prepare(op->req->exec, &ex->plan, err) < 0)
		return -1;
	ex->forked_at = mono_ns();
	pid_t pid = spawn_fork(&ex->plan, &ex->fork_err);
	ex->pid = pid > 0 ? pid : -1;
	return 0;
}

/* It will not run: the error to the client, the process out of the table. */
static void exec_not_started(struct op *op, const struct shim_err *err)
{
	struct exec *ex = op->data;
	take_fg(op);
	op_fail(op, err);
	proc_start_failed(ex->p);
}

static void exec_fork(struct op *op, int rc, const struct shim_err *err)
{
	struct exec *ex = op->data;
	if (rc < 0) {
		exec_not_started(op, err);
		return;
	}
	pid_t pid = ex->pid;
	ex->pid = 0;
	if (pid < 0)
		exec_not_started(op, &ex->fork_err);
	else
		proc_spawned(ex->p, pid, &ex->plan, ex->forked_at);
	/* what proc_spawned did not take (the child's ends, the cwd, argv) goes now, not
	 * with the op at the command's end */
	spawn_plan_free(&ex->plan);
}

static int exec_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__ExecRequest *er = op->req->exec;
	if (er->n_argv > 0 && er->has_shell)
		return err_set(err, EINVAL, NULL, "give argv or shell, not both");
	if (er->n_argv == 0 && !er->has_shell)
		return err_set(err, EINVAL, NULL, "no command: argv and shell are both empty");
	if (er->has_ring_bytes && er->ring_bytes > PROC_RING_MAX)
		return err_set(err, EINVAL, NULL, "ring_bytes %llu over the limit of %u",
			       (unsigned long long)er->ring_bytes, PROC_RING_MAX);
	const char *name = er->name != NULL && er->name[0] != '\0' ? er->name : NULL;
	struct exec *ex = malloc(sizeof(*ex));
	if (ex == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	spawn_plan_init(&ex->plan);
	ex->p = NULL;
	ex->pid = 0;
	op->data = ex;
	struct proc *p = proc_create(name, er->detach, err);
	if (p == NULL)
		return -1;
	p->output_cap = er->detach ? 0 : er->output_cap;
	p->timeout_ms = er->timeout_ms;
	p->grace_ms = er->has_kill_grace_ms ? er->kill_grace_ms : PROC_GRACE_DEFAULT_MS;
	p->ring_bytes = er->has_ring_bytes && er->ring_bytes > 0 ? (size_t)er->ring_bytes : PROC_RING_DEFAULT;
	p->has_stdin = er->stdin || er->pty;
	proc_ref(p);
	ex->p = p;
	proc_set_owner(p, &exec_owner_ops, op);
	if (!er->detach && p->has_stdin)
		proc_stdin_take(p, &exec_owner_ops, op);
	op_run_job(op);
	return 0;
}

static void exec_release(struct op *op)
{
	struct exec *ex = op->data;
	if (ex == NULL)
		return;
	if (ex->pid > 0 && ex->p != NULL) {
		/* The stream went while the worker prepared and forked: the client never
		 * learned of the command. Adopted all the same, so that it is killed (its
		 * group, as exec_cancel does) and reaped like any other. */
		proc_spawned(ex->p, ex->pid, &ex->plan, ex->forked_at);
		proc_abandon(ex->p);
	}
	spawn_plan_free(&ex->plan);
	if (ex->p != NULL) {
		/* the stream went while the plan was made (pid 0: not forked, and now
		 * never will be) */
		if (ex->p->state == PROC_STARTING && ex->p->pid == 0)
			proc_start_failed(ex->p);
		proc_unref(ex->p);
	}
	free(ex);
}

const struct op_kind op_exec_kind = {
	SHIM__V1__REQUEST__KIND_EXEC,
	"exec",
	OP_TAKES_DATA,
	.start = exec_start,
	.job = exec_prepare,
	.job_done = exec_fork,
	.data = exec_data,
	.data_pipe = exec_data_pipe,
	.data_piped = exec_data_piped,
	.writable = exec_writable,
	.cancel = exec_cancel,
	.release = exec_release,
};
