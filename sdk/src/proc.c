/* proc.c: running commands and background processes from the SDK. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sbx_run's default output cap per stream, and sbx_eval's. */
#define RUN_DEFAULT_CAP (16u << 20)
/* Credit goes back in batches of this much consumed output (fewer WINDOW frames);
 * well below the window, so a reader that keeps up never stalls the command. */
#define GRANT_BATCH (64u << 10)
/* A wait that several threads may share re-checks its cancel token this often. */
#define WAIT_SLICE_NS (250u * 1000000u)
/* sbx_eval: how much of the snippet's stderr goes into the error message. */
#define EVAL_MSG_BYTES 200

struct sbx_proc {
	struct sbx_client *client;
	struct call *k;
	struct sbx_call_opts opts; /* for every later wait on this process */
	char id[64];
	unsigned pid;
	bool attached;       /* sbx_attach: freeing detaches instead of killing */
	bool has_stdin;      /* the caller may write stdin */
	bool stdin_done;     /* FIN sent */
	bool eof;            /* the output ended: DATA FIN, or the stream itself */
	struct rx_item *cur; /* DATA being handed out by sbx_proc_read */
	size_t cur_off;
	uint32_t owed; /* output consumed and not yet granted back to the shim */
	bool have_exit;
	struct sbx_exit exit;
};

/* ---- building requests ---- */

static ProtobufCBinaryData bytes_of(const char *s)
{
	ProtobufCBinaryData b = {s ? strlen(s) : 0, (uint8_t *)(uintptr_t)(s ? s : "")};
	return b;
}

static size_t count_strv(const char *const *v)
{
	size_t n = 0;
	while (v != NULL && v[n] != NULL)
		n++;
	return n;
}

/* An ExecRequest and what it points to that had to be allocated. */
struct exec_msg {
	Shim__V1__ExecRequest er;
	Shim__V1__Request req;
	ProtobufCBinaryData *argv, *env;
	Shim__V1__Rlimit *rl;
	Shim__V1__Rlimit **rlp;
};

static void exec_msg_free(struct exec_msg *m)
{
	free(m->argv);
	free(m->env);
	free(m->rl);
	free(m->rlp);
}

/* Copy the caller's options (possibly an older, smaller struct) and check them. */
static int exec_opts_copy(const struct sbx_exec_opts *eo, struct sbx_exec_opts *o, struct sbx_error *err)
{
	struct sbx_exec_opts init = SBX_EXEC_OPTS_INIT;
	*o = init;
	if (eo == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no exec options (start from SBX_EXEC_OPTS_INIT)");
	if (sbx__struct_in(o, sizeof(*o), eo, "sbx_exec_opts", err) < 0)
		return -1;
	bool has_argv = o->argv != NULL && o->argv[0] != NULL;
	if (has_argv == (o->shell != NULL))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "give either argv (non-empty) or a shell string");
	if (o->timeout_ms < 0 || o->kill_grace_ms < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "negative timeout");
	if (o->n_rlimits > 0 && o->rlimits == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "n_rlimits without rlimits");
	for (size_t i = 0; i < o->n_rlimits; i++)
		if (o->rlimits[i].name == NULL)
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "rlimit without a name");
	return 0;
}

static int exec_msg_build(struct exec_msg *m, const struct sbx_exec_opts *o, bool want_stdin, uint64_t output_cap,
			  bool detach, struct sbx_error *err)
{
	Shim__V1__ExecRequest er = SHIM__V1__EXEC_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	memset(m, 0, sizeof(*m));
	m->er = er;
	m->req = req;
	Shim__V1__ExecRequest *e = &m->er;
	size_t na = count_strv(o->argv), ne = count_strv(o->env);
	m->argv = calloc(na ? na : 1, sizeof(*m->argv));
	m->env = calloc(ne ? ne : 1, sizeof(*m->env));
	m->rl = calloc(o->n_rlimits ? o->n_rlimits : 1, sizeof(*m->rl));
	m->rlp = calloc(o->n_rlimits ? o->n_rlimits : 1, sizeof(*m->rlp));
	if (m->argv == NULL || m->env == NULL || m->rl == NULL || m->rlp == NULL) {
		exec_msg_free(m);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	for (size_t i = 0; i < na; i++)
		m->argv[i] = bytes_of(o->argv[i]);
	e->n_argv = na;
	e->argv = m->argv;
	if (o->shell != NULL) {
		e->has_shell = 1;
		e->shell = bytes_of(o->shell);
	}
	for (size_t i = 0; i < ne; i++)
		m->env[i] = bytes_of(o->env[i]);
	e->n_env = ne;
	e->env = m->env;
	e->has_clear_env = e->clear_env = o->clear_env != 0;
	if (o->cwd != NULL) {
		e->has_cwd = 1;
		e->cwd = bytes_of(o->cwd);
	}
	e->user = (char *)(uintptr_t)o->user;
	e->group = (char *)(uintptr_t)o->group;
	if (o->timeout_ms > 0) {
		e->has_timeout_ms = 1;
		e->timeout_ms = (uint32_t)o->timeout_ms;
	}
	if (o->kill_grace_ms > 0) {
		e->has_kill_grace_ms = 1;
		e->kill_grace_ms = (uint32_t)o->kill_grace_ms;
	}
	e->has_stdin = e->stdin = want_stdin;
	if (o->pty) {
		e->has_pty = e->pty = 1;
		if (o->rows > 0) {
			e->has_rows = 1;
			e->rows = o->rows;
		}
		if (o->cols > 0) {
			e->has_cols = 1;
			e->cols = o->cols;
		}
	}
	if (detach) {
		e->has_detach = e->detach = 1;
		e->name = (char *)(uintptr_t)o->name;
		if (o->ring_bytes > 0) {
			e->has_ring_bytes = 1;
			e->ring_bytes = o->ring_bytes;
		}
	}
	if (output_cap > 0) {
		e->has_output_cap = 1;
		e->output_cap = output_cap;
	}
	e->has_no_new_privs = e->no_new_privs = o->no_new_privs != 0;
	if (o->drop_caps) {
		e->has_drop_caps = e->drop_caps = 1;
		e->n_keep_caps = count_strv(o->keep_caps);
		e->keep_caps = (char **)(uintptr_t)o->keep_caps;
	}
	e->seccomp = (char *)(uintptr_t)o->seccomp;
	for (size_t i = 0; i < o->n_rlimits; i++) {
		Shim__V1__Rlimit rl = SHIM__V1__RLIMIT__INIT;
		rl.name = (char *)(uintptr_t)o->rlimits[i].name;
		rl.has_soft = 1;
		rl.soft = o->rlimits[i].soft;
		if (o->rlimits[i].hard != 0) {
			rl.has_hard = 1;
			rl.hard = o->rlimits[i].hard;
		}
		m->rl[i] = rl;
		m->rlp[i] = &m->rl[i];
	}
	e->n_rlimits = o->n_rlimits;
	e->rlimits = m->rlp;
	if (o->nice != 0) {
		e->has_nice = 1;
		e->nice = o->nice;
	}
	if (o->oom_score_adj != 0) {
		e->has_oom_score_adj = 1;
		e->oom_score_adj = o->oom_score_adj;
	}
	m->req.kind_case = SHIM__V1__REQUEST__KIND_EXEC;
	m->req.exec = e;
	return 0;
}

/* Check the options, build the ExecRequest and open its stream. */
static struct call *start_exec(struct sbx_client *c, const struct sbx_exec_opts *eo, bool want_stdin,
			       uint64_t output_cap, bool detach, uint64_t deadline, struct sbx_error *err)
{
	struct sbx_exec_opts o;
	struct exec_msg m;
	if (exec_opts_copy(eo, &o, err) < 0 || exec_msg_build(&m, &o, want_stdin, output_cap, detach, err) < 0)
		return NULL;
	struct call *k = sbx__start_request(c, &m.req, deadline, err);
	exec_msg_free(&m);
	return k;
}

/* ---- decoding results ---- */

static void copy_id(char *dst, size_t size, const char *id)
{
	snprintf(dst, size, "%s", id != NULL ? id : "");
}

/* Into a full-size struct (the library's own, or one copied out with sbx__struct_out_put). */
static void exit_from(struct sbx_exit *ex, const Shim__V1__ExitStatus *s)
{
	*ex = (struct sbx_exit){.struct_size = sizeof(*ex)};
	copy_id(ex->id, sizeof(ex->id), s->id);
	ex->pid = s->pid;
	ex->exit_code = s->exit_code;
	ex->signal = s->signal;
	ex->core_dumped = s->core_dumped;
	ex->duration_ns = s->duration_ns;
	ex->timed_out = s->timed_out;
	ex->stdout_truncated = s->stdout_truncated;
	ex->stderr_truncated = s->stderr_truncated;
}

static void info_from(struct sbx_process_info *pi, const Shim__V1__ProcessInfo *p)
{
	*pi = (struct sbx_process_info){.struct_size = sizeof(*pi)};
	copy_id(pi->id, sizeof(pi->id), p->id);
	pi->pid = p->pid;
	pi->running = p->state == SHIM__V1__PROCESS_STATE__PROCESS_RUNNING;
	if (p->started_at != NULL)
		pi->started_at = (struct sbx_timespec){p->started_at->sec, p->started_at->nsec};
	pi->detached = p->detached;
	pi->pty = p->pty;
	size_t off = 0, cap = sizeof(pi->argv) - 1;
	bool cut = false;
	for (size_t i = 0; i < p->n_argv && !cut; i++) {
		if (i > 0) {
			if (off == cap) {
				cut = true;
				break;
			}
			pi->argv[off++] = ' ';
		}
		size_t n = p->argv[i].len;
		if (n > cap - off) {
			n = cap - off;
			cut = true;
		}
		memcpy(pi->argv + off, p->argv[i].data, n);
		off += n;
	}
	if (cut && off >= 3)
		memcpy(pi->argv + off - 3, "...", 3);
	pi->argv[off] = '\0';
	/* a NUL inside an argument would hide the rest of the line */
	for (size_t i = 0; i < off; i++)
		if (pi->argv[i] == '\0')
			pi->argv[i] = ' ';
	if (p->exit != NULL) {
		struct sbx_exit ex;
		exit_from(&ex, p->exit);
		pi->exit_code = ex.exit_code;
		pi->signal = ex.signal;
		pi->core_dumped = ex.core_dumped;
		pi->timed_out = ex.timed_out;
		pi->duration_ns = ex.duration_ns;
	}
}

/* The Result of a finished call, which must be of kind (0: any). NULL with err. */
static Shim__V1__Result *result_of(struct call *k, int kind, struct sbx_error *err)
{
	if (k->err.kind != SBX_ERR_NONE) {
		sbx__copy_error(err, &k->err);
		return NULL;
	}
	Shim__V1__Result *r = shim__v1__result__unpack(NULL, k->result_len, k->result);
	if (r == NULL) {
		sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, NULL, "undecodable Result from the shim");
		return NULL;
	}
	if (kind != 0 && (int)r->kind_case != kind) {
		shim__v1__result__free_unpacked(r, NULL);
		sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim answered with another kind of result");
		return NULL;
	}
	return r;
}

/* An EVENT frame's ProcessStarted, if it is one: 1 (id and pid set), else 0. */
static int started_from(const struct rx_item *it, char *id, size_t idsize, unsigned *pid)
{
	if (it->type != FRAME_EVENT)
		return 0;
	Shim__V1__Event *ev = shim__v1__event__unpack(NULL, it->len, it->data);
	if (ev == NULL)
		return 0;
	int ok = ev->kind_case == SHIM__V1__EVENT__KIND_STARTED && ev->started != NULL;
	if (ok) {
		copy_id(id, idsize, ev->started->id);
		*pid = ev->started->pid;
	}
	shim__v1__event__free_unpacked(ev, NULL);
	return ok;
}

/* A request whose answer carries nothing we need (signal, kill, rmproc, resize). */
static int simple_request(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
			  struct sbx_error *err)
{
	uint64_t deadline = sbx__deadline(c, opts);
	struct call *k = sbx__start_request(c, req, deadline, err);
	if (k == NULL)
		return -1;
	Shim__V1__Result *r = sbx__wait_result(k, deadline, opts ? opts->cancel : NULL, err);
	sbx__call_free(k);
	if (r == NULL)
		return -1;
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_exit_status(const struct sbx_exit *ex)
{
	if (ex->signal > 0)
		return 128 + ex->signal;
	return ex->exit_code;
}

SBX_API void sbx_output_free(struct sbx_output *o)
{
	if (o == NULL)
		return;
	free(o->out);
	free(o->err);
	memset(o, 0, sizeof(*o));
}

/* ---- sbx_run: collect mode ---- */

/* A growing buffer that never holds more than cap bytes (plus a NUL). */
struct collect {
	char *buf;
	size_t len, size, cap;
	bool truncated;
};

static int collect_add(struct collect *b, const uint8_t *p, size_t n)
{
	if (n > b->cap - b->len) {
		n = b->cap - b->len;
		b->truncated = true;
	}
	if (n == 0)
		return 0;
	if (b->len + n + 1 > b->size) {
		size_t size = b->size ? b->size : 4096;
		while (size < b->len + n + 1)
			size = size > SIZE_MAX / 2 ? b->len + n + 1 : size * 2;
		if (size > b->cap + 1)
			size = b->cap + 1;
		char *nb = realloc(b->buf, size);
		if (nb == NULL)
			return -1;
		b->buf = nb;
		b->size = size;
	}
	memcpy(b->buf + b->len, p, n);
	b->len += n;
	return 0;
}

/* Hand the buffer over NUL-terminated (never NULL). */
static char *collect_take(struct collect *b, size_t *len)
{
	char *p = b->buf != NULL ? b->buf : malloc(1);
	if (p != NULL)
		p[b->len] = '\0';
	*len = b->len;
	b->buf = NULL;
	return p;
}

SBX_API int sbx_run(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
		    const void *stdin_data, size_t stdin_len, size_t cap, struct sbx_output *out, struct sbx_exit *ex,
		    struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (out != NULL)
		memset(out, 0, sizeof(*out));
	if (sbx__struct_out_check(ex, "sbx_exit", err) < 0)
		return -1;
	if (stdin_data == NULL && stdin_len > 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "stdin_len without stdin_data");
	if (cap == 0)
		cap = RUN_DEFAULT_CAP;
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;
	struct call *k = start_exec(c, eo, stdin_data != NULL, cap, false, deadline, err);
	if (k == NULL)
		return -1;
	struct collect bo = {.cap = cap}, be = {.cap = cap};
	const uint8_t *src = stdin_data;
	size_t sent = 0;
	bool fin_sent = stdin_data == NULL, fin_got = false;
	uint32_t owed = 0;
	int rc = 0;
	size_t chunk_max = c->max_frame < FRAME_DATA_CHUNK ? c->max_frame : FRAME_DATA_CHUNK;
	/* Feed stdin while the shim grants credit, take in output otherwise: both
	 * directions are bounded by their windows, neither side buffers more. */
	while (rc == 0) {
		if (tok != NULL && sbx_cancel_fired(tok)) {
			/* sbx__call_free() sends CANCEL: the shim kills the process group */
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, NULL, "cancelled");
			break;
		}
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL) {
			if (sbx__call_done(k))
				break;
			if (!fin_sent) {
				pthread_mutex_lock(&c->mu);
				int64_t credit = k->send_credit;
				pthread_mutex_unlock(&c->mu);
				if (credit > 0 || sent == stdin_len) {
					size_t n = stdin_len - sent;
					if (n > (uint64_t)credit)
						n = (size_t)credit;
					if (n > chunk_max)
						n = chunk_max;
					bool fin = sent + n == stdin_len;
					pthread_mutex_lock(&c->mu);
					k->send_credit -= (int64_t)n;
					pthread_mutex_unlock(&c->mu);
					rc = sbx__send(c, k->id, FRAME_DATA, fin ? FRAME_FLAG_FIN : 0, src + sent, n,
						       deadline, err);
					sent += n;
					fin_sent = fin;
					continue;
				}
			}
			rc = sbx__call_wait_for(k, SBX__WAIT_FRAME | (fin_sent ? 0 : SBX__WAIT_CREDIT), deadline, tok,
						err);
			continue;
		}
		if (it->type == FRAME_DATA && !fin_got) {
			struct collect *b = it->flags & FRAME_FLAG_STDERR ? &be : &bo;
			if (collect_add(b, it->data, it->len) < 0)
				rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory for the output");
			if (it->flags & FRAME_FLAG_FIN) {
				fin_got = true;
			} else {
				owed += it->len;
				if (rc == 0 && owed >= GRANT_BATCH) {
					rc = sbx__call_grant(k, owed, deadline, err);
					owed = 0;
				}
			}
		}
		/* EVENT started: nothing to do for a collected run */
		sbx__rx_free(it);
	}
	Shim__V1__Result *r = NULL;
	if (rc == 0)
		r = result_of(k, SHIM__V1__RESULT__KIND_EXIT, err);
	if (r != NULL) {
		if (ex != NULL) {
			struct sbx_exit full;
			exit_from(&full, r->exit);
			full.stdout_truncated |= bo.truncated;
			full.stderr_truncated |= be.truncated;
			sbx__struct_out_put(ex, &full, sizeof(full));
		}
		shim__v1__result__free_unpacked(r, NULL);
		if (out != NULL) {
			out->out = collect_take(&bo, &out->out_len);
			out->err = collect_take(&be, &out->err_len);
			if (out->out == NULL || out->err == NULL) {
				sbx_output_free(out);
				rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory for the output");
			}
		}
	} else {
		rc = -1;
	}
	free(bo.buf);
	free(be.buf);
	sbx__call_free(k);
	return rc;
}

/* ---- streamed processes ----
 * A handle is used by one reader (sbx_proc_read, sbx_proc_wait) and at the same
 * time by one writer (sbx_proc_write, sbx_proc_close_stdin); sbx_proc_signal and
 * sbx_proc_resize are requests of their own and may come from any thread. Every
 * later wait uses the timeout and cancel token given when the handle was made (the
 * token must outlive the handle): a timeout fails that one call and leaves the
 * process running; a fired token cancels the stream (a foreground command is
 * killed with its process group). Output is granted back to the shim only as it is
 * read, so a caller that stops reading stops the command. */

static uint64_t proc_deadline(struct sbx_proc *p)
{
	return sbx__deadline(p->client, &p->opts);
}

/* Wait for output (or, want_credit, for stdin credit), the end of the stream, or
 * the proc's deadline; a timeout leaves the process running. The reader and the
 * stdin writer may wait at the same time: each looks at the cancel token at least
 * every WAIT_SLICE_NS, whichever of them the token wakes. */
static int proc_wait_io(struct sbx_proc *p, bool want_credit, uint64_t deadline, struct sbx_error *err)
{
	for (;;) {
		uint64_t slice = sbx__now_ns() + WAIT_SLICE_NS;
		if (slice > deadline)
			slice = deadline;
		struct sbx_error e;
		unsigned what = SBX__WAIT_SHARED | (want_credit ? SBX__WAIT_CREDIT : SBX__WAIT_FRAME);
		if (sbx__call_wait_for(p->k, what, slice, p->opts.cancel, &e) == 0)
			return 0;
		if (e.kind == SBX_ERR_LOCAL && e.code == ETIMEDOUT && slice < deadline)
			continue;
		if (e.kind == SBX_ERR_LOCAL && e.code == ETIMEDOUT)
			sbx__fail(&e, SBX_ERR_LOCAL, ETIMEDOUT, NULL, "timed out waiting for the process");
		sbx__copy_error(err, &e);
		return -1;
	}
}

static int proc_grant(struct sbx_proc *p, uint32_t n, bool force, uint64_t deadline, struct sbx_error *err)
{
	p->owed += n;
	if (p->owed == 0 || (!force && p->owed < GRANT_BATCH))
		return 0;
	uint32_t owed = p->owed;
	p->owed = 0;
	if (sbx__call_done(p->k))
		return 0; /* nobody is waiting for it any more */
	return sbx__call_grant(p->k, owed, deadline, err);
}

static struct sbx_proc *proc_new(struct sbx_client *c, struct call *k, const struct sbx_call_opts *opts)
{
	struct sbx_proc *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	p->client = c;
	p->k = k;
	p->opts.struct_size = sizeof(p->opts);
	p->exit.struct_size = sizeof(p->exit);
	if (opts != NULL)
		p->opts = *opts; /* the full-size copy sbx__call_opts() made */
	return p;
}

/* Wait for the first thing on a new exec or attach stream: EVENT started (consumed),
 * or output (kept for sbx_proc_read), or its end. -1 if it ended with an error. */
static int proc_first(struct sbx_proc *p, uint64_t deadline, struct sbx_error *err)
{
	for (;;) {
		struct rx_item *it = sbx__call_pop(p->k);
		if (it == NULL) {
			if (sbx__call_done(p->k)) {
				if (p->k->err.kind != SBX_ERR_NONE) {
					sbx__copy_error(err, &p->k->err);
					return -1;
				}
				return 0;
			}
			if (sbx__call_wait_for(p->k, SBX__WAIT_NEXT, deadline, p->opts.cancel, err) < 0)
				return -1;
			continue;
		}
		if (started_from(it, p->id, sizeof(p->id), &p->pid)) {
			sbx__rx_free(it);
			return 0;
		}
		if (it->type == FRAME_DATA) {
			p->cur = it;
			p->cur_off = 0;
			return 0;
		}
		sbx__rx_free(it);
	}
}

SBX_API int sbx_exec_start(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
			   int flags, struct sbx_proc **out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no place for the process handle");
	*out = NULL;
	if ((flags & ~SBX_PROC_STDIN) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "unknown exec flags %#x", (unsigned)flags);
	uint64_t deadline = sbx__deadline(c, opts);
	struct call *k = start_exec(c, eo, (flags & SBX_PROC_STDIN) != 0, 0, false, deadline, err);
	if (k == NULL)
		return -1;
	struct sbx_proc *p = proc_new(c, k, opts);
	if (p == NULL) {
		sbx__call_free(k);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	p->has_stdin = (flags & SBX_PROC_STDIN) != 0;
	if (proc_first(p, deadline, err) < 0) {
		sbx_proc_free(p);
		return -1;
	}
	*out = p;
	return 0;
}

SBX_API const char *sbx_proc_id(const struct sbx_proc *p)
{
	return p->id;
}

SBX_API unsigned sbx_proc_pid(const struct sbx_proc *p)
{
	return p->pid;
}

SBX_API int sbx_proc_write(struct sbx_proc *p, const void *buf, size_t len, struct sbx_error *err)
{
	if (!p->has_stdin)
		return sbx__fail(err, SBX_ERR_LOCAL, EBADF, NULL, "stdin was not asked for (SBX_PROC_STDIN)");
	if (p->stdin_done)
		return sbx__fail(err, SBX_ERR_LOCAL, EPIPE, NULL, "stdin is closed");
	if (buf == NULL && len > 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no data given");
	struct sbx_client *c = p->client;
	struct call *k = p->k;
	uint64_t deadline = proc_deadline(p);
	size_t chunk_max = c->max_frame < FRAME_DATA_CHUNK ? c->max_frame : FRAME_DATA_CHUNK;
	const uint8_t *src = buf;
	size_t sent = 0;
	while (sent < len) {
		pthread_mutex_lock(&c->mu);
		bool over = k->done || k->abandoned;
		int64_t credit = k->send_credit;
		if (!over && credit > 0) {
			size_t n = len - sent;
			if (n > (uint64_t)credit)
				n = (size_t)credit;
			if (n > chunk_max)
				n = chunk_max;
			k->send_credit -= (int64_t)n;
			credit = (int64_t)n;
		}
		pthread_mutex_unlock(&c->mu);
		if (over)
			return sbx__fail(err, SBX_ERR_LOCAL, EPIPE, NULL, "the process has ended");
		if (credit > 0) {
			if (sbx__send(c, k->id, FRAME_DATA, 0, src + sent, (size_t)credit, deadline, err) < 0)
				return -1;
			sent += (size_t)credit;
			continue;
		}
		if (proc_wait_io(p, true, deadline, err) < 0)
			return -1;
	}
	return 0;
}

SBX_API int sbx_proc_close_stdin(struct sbx_proc *p, struct sbx_error *err)
{
	if (!p->has_stdin)
		return sbx__fail(err, SBX_ERR_LOCAL, EBADF, NULL, "stdin was not asked for (SBX_PROC_STDIN)");
	if (p->stdin_done)
		return 0;
	p->stdin_done = true;
	if (sbx__call_done(p->k))
		return 0;
	return sbx__send(p->client, p->k->id, FRAME_DATA, FRAME_FLAG_FIN, NULL, 0, proc_deadline(p), err);
}

SBX_API long sbx_proc_read(struct sbx_proc *p, int *channel, void *buf, size_t size, struct sbx_error *err)
{
	if (buf == NULL || size == 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no buffer given");
	uint64_t deadline = proc_deadline(p);
	for (;;) {
		struct rx_item *it = p->cur;
		if (it != NULL) {
			size_t n = it->len - p->cur_off;
			if (n > size)
				n = size;
			memcpy(buf, it->data + p->cur_off, n);
			if (channel != NULL)
				*channel = it->flags & FRAME_FLAG_STDERR ? SBX_STDERR : SBX_STDOUT;
			p->cur_off += n;
			if (p->cur_off == it->len) {
				bool fin = (it->flags & FRAME_FLAG_FIN) != 0;
				p->cur = NULL;
				sbx__rx_free(it);
				/* the shim gets the credit back only now: a reader that does not
				 * read stops the command, not the shim */
				if (!fin && proc_grant(p, (uint32_t)p->cur_off, false, deadline, err) < 0)
					return -1;
			}
			return (long)n;
		}
		if (p->eof)
			return 0;
		it = sbx__call_pop(p->k);
		if (it == NULL) {
			if (sbx__call_done(p->k)) {
				if (p->k->err.kind != SBX_ERR_NONE) {
					sbx__copy_error(err, &p->k->err);
					return -1;
				}
				p->eof = true;
				return 0;
			}
			if (proc_wait_io(p, false, deadline, err) < 0)
				return -1;
			continue;
		}
		if (it->type != FRAME_DATA) {
			sbx__rx_free(it); /* EVENTs have no business here after started */
			continue;
		}
		if (it->flags & FRAME_FLAG_FIN)
			p->eof = true;
		if (it->len == 0) {
			sbx__rx_free(it);
			continue;
		}
		p->cur = it;
		p->cur_off = 0;
	}
}

SBX_API int sbx_proc_wait(struct sbx_proc *p, struct sbx_exit *ex, struct sbx_error *err)
{
	if (sbx__struct_out_check(ex, "sbx_exit", err) < 0)
		return -1;
	if (!p->have_exit) {
		uint64_t deadline = proc_deadline(p);
		/* output nobody will read: dropped, and its credit given back so that the
		 * command can go on writing to its end */
		if (p->cur != NULL) {
			bool fin = (p->cur->flags & FRAME_FLAG_FIN) != 0;
			uint32_t n = p->cur->len;
			free(p->cur);
			p->cur = NULL;
			if (!fin && proc_grant(p, n, false, deadline, err) < 0)
				return -1;
		}
		for (;;) {
			struct rx_item *it = sbx__call_pop(p->k);
			if (it == NULL) {
				if (sbx__call_done(p->k))
					break;
				if (proc_grant(p, 0, true, deadline, err) < 0 ||
				    proc_wait_io(p, false, deadline, err) < 0)
					return -1;
				continue;
			}
			int rc = 0;
			if (it->type == FRAME_DATA && !(it->flags & FRAME_FLAG_FIN))
				rc = proc_grant(p, it->len, false, deadline, err);
			if (it->type == FRAME_DATA && (it->flags & FRAME_FLAG_FIN))
				p->eof = true;
			sbx__rx_free(it);
			if (rc < 0)
				return -1;
		}
		p->eof = true;
		Shim__V1__Result *r = result_of(p->k, 0, err);
		if (r == NULL)
			return -1;
		if (r->kind_case == SHIM__V1__RESULT__KIND_EXIT) {
			exit_from(&p->exit, r->exit);
			shim__v1__result__free_unpacked(r, NULL);
		} else if (p->attached && r->kind_case == SHIM__V1__RESULT__KIND_DONE) {
			/* attached without SBX_ATTACH_FOLLOW to a process still running: the
			 * replay ended, the process did not; wait for it by id */
			shim__v1__result__free_unpacked(r, NULL);
			if (sbx_wait(p->client, &p->opts, p->id, &p->exit, err) < 0)
				return -1;
		} else {
			shim__v1__result__free_unpacked(r, NULL);
			return sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL,
					 "the shim answered with another kind of result");
		}
		p->have_exit = true;
	}
	if (ex != NULL)
		sbx__struct_out_put(ex, &p->exit, sizeof(p->exit));
	return 0;
}

SBX_API int sbx_proc_signal(struct sbx_proc *p, int sig, struct sbx_error *err)
{
	if (p->id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, ESRCH, NULL, "the process has no id");
	struct sbx_call_opts o = {.struct_size = sizeof(o), .timeout_ms = p->opts.timeout_ms};
	return sbx_kill(p->client, &o, p->id, sig, err);
}

SBX_API int sbx_proc_resize(struct sbx_proc *p, unsigned rows, unsigned cols, struct sbx_error *err)
{
	if (p->id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, ESRCH, NULL, "the process has no id");
	if (rows == 0 || cols == 0 || rows > 0xffff || cols > 0xffff)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "bad terminal size %ux%u", rows, cols);
	Shim__V1__ResizeRequest rr = SHIM__V1__RESIZE_REQUEST__INIT;
	rr.id = p->id;
	rr.has_rows = rr.has_cols = 1;
	rr.rows = rows;
	rr.cols = cols;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESIZE;
	req.resize = &rr;
	struct sbx_call_opts o = {.struct_size = sizeof(o), .timeout_ms = p->opts.timeout_ms};
	return simple_request(p->client, &o, &req, err);
}

SBX_API void sbx_proc_free(struct sbx_proc *p)
{
	if (p == NULL)
		return;
	free(p->cur);
	/* a stream still open gets CANCEL: the shim kills a foreground command's
	 * process group, or (attach) just stops sending */
	sbx__call_free(p->k);
	free(p);
}

/* ---- background processes ---- */

SBX_API int sbx_spawn(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_exec_opts *eo,
		      struct sbx_process_info *info, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(info, "sbx_process_info", err) < 0)
		return -1;
	uint64_t deadline = sbx__deadline(c, opts);
	struct call *k = start_exec(c, eo, false, 0, true, deadline, err);
	if (k == NULL)
		return -1;
	Shim__V1__Result *r = sbx__wait_result(k, deadline, opts ? opts->cancel : NULL, err);
	sbx__call_free(k);
	if (r == NULL)
		return -1;
	int rc = 0;
	if (r->kind_case != SHIM__V1__RESULT__KIND_PROCESS)
		rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, NULL, "the shim answered with another kind of result");
	else if (info != NULL) {
		struct sbx_process_info full;
		info_from(&full, r->process);
		sbx__struct_out_put(info, &full, sizeof(full));
	}
	shim__v1__result__free_unpacked(r, NULL);
	return rc;
}

SBX_API int sbx_ps(struct sbx_client *c, const struct sbx_call_opts *opts, sbx_process_fn cb, void *ud,
		   struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	Shim__V1__ProcessListRequest pr = SHIM__V1__PROCESS_LIST_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_PS;
	req.ps = &pr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_PS, err);
	if (r == NULL)
		return -1;
	int rc = 0;
	struct sbx_process_info *pi = malloc(sizeof(*pi));
	if (pi == NULL)
		rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; rc == 0 && cb != NULL && i < r->ps->n_processes; i++) {
		info_from(pi, r->ps->processes[i]);
		int e = cb(ud, pi);
		if (e != 0)
			rc = sbx__fail(err, SBX_ERR_LOCAL, e, NULL, "stopped by the callback: %s", sbx_strerror(e));
	}
	free(pi);
	shim__v1__result__free_unpacked(r, NULL);
	return rc;
}

SBX_API int sbx_attach(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int flags,
		       struct sbx_proc **out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no place for the process handle");
	*out = NULL;
	if (id == NULL || id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no process id given");
	if ((flags & ~(SBX_ATTACH_STDIN | SBX_ATTACH_NO_REPLAY | SBX_ATTACH_FOLLOW)) != 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "unknown attach flags %#x", (unsigned)flags);
	uint64_t deadline = sbx__deadline(c, opts);
	Shim__V1__AttachRequest ar = SHIM__V1__ATTACH_REQUEST__INIT;
	ar.id = (char *)(uintptr_t)id;
	ar.has_stdin = ar.stdin = (flags & SBX_ATTACH_STDIN) != 0;
	ar.has_no_replay = ar.no_replay = (flags & SBX_ATTACH_NO_REPLAY) != 0;
	ar.has_follow = ar.follow = (flags & SBX_ATTACH_FOLLOW) != 0;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_ATTACH;
	req.attach = &ar;
	struct call *k = sbx__start_request(c, &req, deadline, err);
	if (k == NULL)
		return -1;
	struct sbx_proc *p = proc_new(c, k, opts);
	if (p == NULL) {
		sbx__call_free(k);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	p->attached = true;
	p->has_stdin = (flags & SBX_ATTACH_STDIN) != 0;
	copy_id(p->id, sizeof(p->id), id);
	if (proc_first(p, deadline, err) < 0) {
		sbx_proc_free(p);
		return -1;
	}
	*out = p;
	return 0;
}

SBX_API int sbx_wait(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, struct sbx_exit *ex,
		     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (id == NULL || id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no process id given");
	if (sbx__struct_out_check(ex, "sbx_exit", err) < 0)
		return -1;
	Shim__V1__WaitRequest wr = SHIM__V1__WAIT_REQUEST__INIT;
	wr.id = (char *)(uintptr_t)id;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_WAIT;
	req.wait = &wr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_EXIT, err);
	if (r == NULL)
		return -1;
	if (ex != NULL) {
		struct sbx_exit full;
		exit_from(&full, r->exit);
		sbx__struct_out_put(ex, &full, sizeof(full));
	}
	shim__v1__result__free_unpacked(r, NULL);
	return 0;
}

SBX_API int sbx_kill(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int sig,
		     struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (id == NULL || id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no process id given");
	Shim__V1__SignalRequest sr = SHIM__V1__SIGNAL_REQUEST__INIT;
	sr.id = (char *)(uintptr_t)id;
	sr.has_signal = 1;
	sr.signal = sig;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_SIGNAL;
	req.signal = &sr;
	return simple_request(c, opts, &req, err);
}

SBX_API int sbx_rmproc(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id, int kill,
		       struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (id == NULL || id[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no process id given");
	Shim__V1__RemoveProcessRequest rr = SHIM__V1__REMOVE_PROCESS_REQUEST__INIT;
	rr.id = (char *)(uintptr_t)id;
	rr.has_kill = rr.kill = kill != 0;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RMPROC;
	req.rmproc = &rr;
	return simple_request(c, opts, &req, err);
}

/* ---- eval ---- */

SBX_API int sbx_eval(struct sbx_client *c, const struct sbx_call_opts *opts, const char *const *interp,
		     const char *code, struct sbx_output *out, struct sbx_exit *ex, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	static const char *const default_interp[] = {"python3", "-c", NULL};
	struct sbx_output mine;
	struct sbx_exit st = SBX_EXIT_INIT;
	if (out == NULL)
		out = &mine;
	memset(out, 0, sizeof(*out));
	if (sbx__struct_out_check(ex, "sbx_exit", err) < 0)
		return -1;
	if (code == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no code given");
	if (interp == NULL)
		interp = default_interp;
	size_t n = count_strv(interp);
	if (n == 0)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "empty interpreter argv");
	const char **argv = calloc(n + 2, sizeof(*argv));
	if (argv == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	memcpy(argv, interp, n * sizeof(*argv));
	argv[n] = code;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	int rc = sbx_run(c, opts, &eo, NULL, 0, RUN_DEFAULT_CAP, out, &st, err);
	free(argv);
	if (rc == 0 && ex != NULL)
		sbx__struct_out_put(ex, &st, sizeof(st));
	if (rc == 0 && sbx_exit_status(&st) != 0) {
		int status = sbx_exit_status(&st);
		/* the start of stderr, on one line: what a log line or an exception shows */
		char msg[EVAL_MSG_BYTES + 1];
		size_t m = out->err_len < EVAL_MSG_BYTES ? out->err_len : EVAL_MSG_BYTES;
		memcpy(msg, out->err, m);
		while (m > 0 && (msg[m - 1] == '\n' || msg[m - 1] == '\r' || msg[m - 1] == ' '))
			m--;
		for (size_t i = 0; i < m; i++)
			if (msg[i] == '\0' || msg[i] == '\n' || msg[i] == '\r' || msg[i] == '\t')
				msg[i] = ' ';
		msg[m] = '\0';
		if (st.timed_out)
			rc = sbx__fail(err, SBX_ERR_EXIT, status, NULL, "timed out%s%s", m ? ": " : "", msg);
		else if (st.signal > 0)
			rc = sbx__fail(err, SBX_ERR_EXIT, status, NULL, "killed by signal %d%s%s", st.signal,
				       m ? ": " : "", msg);
		else if (m > 0)
			rc = sbx__fail(err, SBX_ERR_EXIT, status, NULL, "%s", msg);
		else
			rc = sbx__fail(err, SBX_ERR_EXIT, status, NULL, "exited with status %d", status);
	}
	if (out == &mine)
		sbx_output_free(&mine);
	return rc;
}
