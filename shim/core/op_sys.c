/* op_sys.c: system requests: info (what the daemon holds) and echo (a channel check). */
#include "conn.h"
#include "log.h"
#include "mount.h"
#include "op.h"
#include "ops.h"
#include "pipes.h"
#include "proc.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- info ---- */

/* What the worker read from /proc. */
struct info_sample {
	uint64_t rss;
	double load[3];
	bool have_load;
};

static int info_start(struct op *op, struct shim_err *err)
{
	op->data = calloc(1, sizeof(struct info_sample));
	if (op->data == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op_run_job(op);
	return 0;
}

/* On a worker: /proc reads are cheap, but the loop thread does no file I/O at all. */
static int info_job(struct op *op, struct shim_err *err)
{
	(void)err;
	struct info_sample *j = op->data;
	FILE *f = fopen("/proc/self/statm", "re");
	if (f != NULL) {
		unsigned long size, resident;
		if (fscanf(f, "%lu %lu", &size, &resident) == 2)
			j->rss = (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
		fclose(f);
	}
	f = fopen("/proc/loadavg", "re");
	if (f != NULL) {
		j->have_load = fscanf(f, "%lf %lf %lf", &j->load[0], &j->load[1], &j->load[2]) == 3;
		fclose(f);
	}
	return 0;
}

static void info_done(struct op *op, int rc, const struct shim_err *err)
{
	(void)rc;
	(void)err;
	const struct info_sample *j = op->data;
	struct server *s = op->st->conn->srv;
	Shim__V1__InfoReply r = SHIM__V1__INFO_REPLY__INIT;
	r.shim_version = (char *)SHIM_VERSION;
	r.protocol_version = 1;
	size_t nf = 0;
	while (server_features[nf] != NULL)
		nf++;
	r.n_features = nf;
	r.features = (char **)server_features;
	r.uptime_ms = (mono_ns() - s->start_ns) / 1000000u;
	r.pid = (uint32_t)s->pid;
	r.pid1 = s->pid1;
	r.uid = (uint32_t)getuid();
	r.gid = (uint32_t)getgid();
	r.hostname = s->hostname;
	r.boot_id = s->boot_id;
	r.has_connections = r.has_streams = r.has_processes = r.has_mounts = 1;
	r.connections = s->n_conns;
	r.streams = s->n_streams;
	r.processes = proc_running();
	r.mounts = op_mount_count();
	r.has_rss_bytes = j->rss != 0;
	r.rss_bytes = j->rss;
	r.has_load1 = r.has_load5 = r.has_load15 = j->have_load;
	r.load1 = j->load[0];
	r.load5 = j->load[1];
	r.load15 = j->load[2];
	r.has_max_connections = r.has_max_streams = r.has_workers = 1;
	r.max_connections = s->cfg.max_connections;
	r.max_streams = s->cfg.max_streams;
	r.workers = worker_threads();
	r.has_generation = 1;
	r.generation = op_snapshot_generation();
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_INFO;
	res.info = &r;
	op_end(op, &res);
}

const struct op_kind op_sys_info_kind = {
	SHIM__V1__REQUEST__KIND_INFO, "info", 0, .start = info_start, .job = info_job, .job_done = info_done,
};

/* ---- echo ---- */

/* What the client sent and we have not yet been able to send back. Never more than
 * the credit we granted (the initial window), so memory stays bounded. Big DATA comes
 * spliced into a pipe (conn.c's data_pipe) and goes back spliced from it
 * (stream_send_pipe): the bytes in the pipe (piped) are older than those in buf. */
struct echo {
	uint64_t total;
	size_t len, cap;
	size_t piped;   /* bytes in the pipe */
	size_t pipe_sz; /* its capacity (0: no pipe yet) */
	int pfd[2];
	bool fin;
	uint8_t buf[];
};

/* Echo what is in the pipe, as far as the credit and the connection's room go. */
static void echo_pump_pipe(struct op *op)
{
	struct echo *e = op->data;
	struct stream *st = op->st;
	while (e->piped > 0) {
		size_t n = stream_can_send(st); /* within the credit and the frame size */
		if (n > e->piped)
			n = e->piped;
		if (n == 0)
			return;
		stream_send_pipe(st, e->pfd[0], n);
		e->piped -= n;
		e->total += n;
		stream_grant(st, (uint32_t)n);
	}
}

static void echo_pump(struct op *op)
{
	struct echo *e = op->data;
	struct stream *st = op->st;
	echo_pump_pipe(op);
	if (e->piped > 0) {
		stream_wait_writable(st);
		return;
	}
	size_t sent = 0;
	while (sent < e->len) {
		size_t n = stream_can_send(st);
		if (n == 0)
			break;
		if (n > e->len - sent)
			n = e->len - sent;
		stream_send_data(st, e->buf + sent, n, false);
		sent += n;
	}
	if (sent > 0) {
		memmove(e->buf, e->buf + sent, e->len - sent);
		e->len -= sent;
		e->total += sent;
		/* hand the client back exactly the credit we have drained */
		stream_grant(st, (uint32_t)sent);
	}
	if (e->len > 0) {
		stream_wait_writable(st);
		return;
	}
	if (e->fin) {
		stream_send_data(st, NULL, 0, true);
		Shim__V1__EchoReply r = SHIM__V1__ECHO_REPLY__INIT;
		r.bytes = e->total;
		Shim__V1__Result res = SHIM__V1__RESULT__INIT;
		res.kind_case = SHIM__V1__RESULT__KIND_ECHO;
		res.echo = &r;
		op_end(op, &res);
	}
}

static int echo_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct echo *e = op->data;
	if (e->len == 0 && e->piped == 0 && len > 0) {
		/* Nothing of ours waits: the bytes go back from the input buffer. When the
		 * output is empty they are written straight to the client with the WINDOW
		 * that gives their credit back (no copy at all), else queued from here (one
		 * copy, none into e->buf); only what finds no room is kept. */
		struct stream *st = op->st;
		bool busy;
		size_t n = stream_send_direct_grant(st, buf, len, &busy), q = 0;
		while (n + q < len) {
			size_t m = stream_can_send(st);
			if (m == 0)
				break;
			if (m > len - n - q)
				m = len - n - q;
			stream_send_data(st, buf + n + q, m, false);
			q += m;
		}
		if (q > 0)
			stream_grant(st, (uint32_t)q);
		e->total += n + q;
		buf += n + q;
		len -= n + q;
	}
	if (e->len + len > e->cap) {
		/* cannot happen with a client that keeps to its credit (checked by conn) */
		return err_set(err, ENOBUFS, NULL, "echo buffer full");
	}
	memcpy(e->buf + e->len, buf, len);
	e->len += len;
	e->fin = fin;
	echo_pump(op);
	return 0;
}

size_t op_echo_pipe_real_size;

/* The pipe for n more bytes: only with nothing in buf (they would overtake it), and
 * room for them. Made at the first big DATA, twice the stream's window: a pipe counts
 * slots, not bytes, and a splice from a socket may fill a slot with less than a page
 * (its pages come only as they are used). */
static int echo_data_pipe(struct op *op, size_t n)
{
	struct echo *e = op->data;
	if (e->len > 0 || e->fin)
		return -1;
	if (e->pipe_sz == 0) {
		e->pipe_sz = pipe_open(e->pfd, 2 * e->cap > (64u << 10) ? 2 * e->cap : (64u << 10));
		if (e->pipe_sz == 0)
			return -1;
		if (op_echo_pipe_real_size > 0) /* tests: the pipe's slots run out before its bytes */
			fcntl(e->pfd[1], F_SETPIPE_SZ, (int)op_echo_pipe_real_size);
	}
	return e->piped + n <= e->pipe_sz ? e->pfd[1] : -1;
}

static int echo_data_piped(struct op *op, size_t n, bool fin, struct shim_err *err)
{
	(void)err;
	struct echo *e = op->data;
	e->piped += n;
	e->fin = fin;
	echo_pump(op);
	return 0;
}

static int echo_start(struct op *op, struct shim_err *err)
{
	size_t cap = op->st->recv_left;
	struct echo *e = malloc(sizeof(*e) + (cap ? cap : 1));
	if (e == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	memset(e, 0, sizeof(*e));
	e->cap = cap;
	e->pfd[0] = e->pfd[1] = -1;
	op->data = e;
	return 0;
}

static void echo_release(struct op *op)
{
	struct echo *e = op->data;
	if (e == NULL)
		return;
	if (e->pfd[0] >= 0) {
		close(e->pfd[0]);
		close(e->pfd[1]);
	}
	free(e);
}

const struct op_kind op_sys_echo_kind = {
	SHIM__V1__REQUEST__KIND_ECHO,
	"echo",
	OP_TAKES_DATA,
	.start = echo_start,
	.data = echo_data,
	.data_pipe = echo_data_pipe,
	.data_piped = echo_data_piped,
	.writable = echo_pump,
	.release = echo_release,
};
