/* op_fs_io.c: streamed file reads and atomic writes, with bounded memory and all I/O on workers. */
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "fs.h"
#include "fsctx.h"
#include "journal.h"
#include "log.h"
#include "op.h"
#include "ops.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ================================ special files ================================ */

const char *op_fs_io_special_kind(unsigned m)
{
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	return NULL;
}

int op_fs_io_refuse_special(struct shim_err *err, const char *path, unsigned m, const char *verb)
{
	const char *kind = op_fs_io_special_kind(m);
	return err_set(err, EPERM, path, "%s: %s, not a regular file (allow_special to %s it)", verb,
		       kind != NULL ? kind : "not a regular file", verb);
}

/* ================================ read ================================ */

/*
 * A read follows the client's credit: a worker reads a chunk only when the client may
 * take it (credit, less what is read and not yet sent) and there is memory for it (the
 * connection's share and the daemon's budget: stream_hold), hands it to the loop and
 * is free again; the loop sends it, and asks for the next chunk as credit comes back.
 * A read without credit parks on the loop holding no thread and no buffer, whatever
 * the file: 256 reads at zero credit cost 256 small structs. Two buffers, so that a
 * worker fills one while the loop sends the other.
 *
 * The end of a regular file is seen without credit to spare: the chunk that reaches
 * the size found at the open asks for one byte more, and a short read is the end (a
 * client that granted exactly the file's size gets its END). A file that turns out to
 * have grown is read in whole chunks from then on, to a short read.
 *
 * A FIFO, a socket or a device is read only when the request allows special files
 * (allow_special; else 1 EPERM naming the type, found with fstat of the fd opened with
 * O_NONBLOCK, so that a planted FIFO never blocks the open). FIFOs, sockets and
 * character devices are read on the loop (non-blocking, like a command's output):
 * waiting for a writer, or for its bytes, is no work for a thread. (A device the
 * kernel cannot poll, /dev/zero, is always ready to libev.)
 */
#define READ_BUF BUDGET_POOLED
#define READ_NBUF 2
/* A chunk up to this size (a client that grants 4 KiB at a time) gets a buffer of its
 * own size; bigger ones a READ_BUF one (from the budget's pool). Under memory pressure
 * a chunk gets what there is, down to READ_SMALL. */
#define READ_SMALL (64u << 10)
#define SIZE_UNKNOWN UINT64_MAX

enum { RB_IDLE, RB_BUSY, RB_READY };

struct rd_buf {
	struct op_job job; /* fills it */
	uint8_t *data;     /* NULL when idle without memory */
	size_t cap;        /* bytes of data (held from the budget) */
	uint64_t off;      /* file offset of data[0] */
	size_t want;       /* bytes asked for */
	size_t len;        /* bytes read */
	size_t sent;       /* bytes of data already queued as DATA */
	int err;           /* errno of a failed read, or 0 */
	int state;
};

struct rd {
	struct op *op;
	struct fs_path p;
	struct op_job close; /* the op's last job: the fd closed on a worker */
	int fd;
	bool seekable;
	bool sized;   /* a regular file with a size at the open (not /proc's 0): the buffer jobs clip to its size */
	bool on_loop; /* a FIFO, a socket or a character device: read on the loop, non-blocking */
	bool sparse;  /* a regular file with fewer blocks than its size: look for holes */
	uint64_t next, end; /* next offset to ask for; where to stop (saturated) */
	uint64_t size;      /* a regular file's size at the open (SIZE_UNKNOWN: read to a short read) */
	uint64_t sent;
	unsigned nbuf, head; /* head: the buffer to send next (lowest offset) */
	struct rd_buf b[READ_NBUF];
	/* on the loop */
	ev_io io;
	bool pend_full; /* one byte read without credit, to see the end: pend */
	uint8_t pend;
	bool woke; /* the FIFO was readable once: a writer has come (before, read says EOF) */
};

static void rd_pump(struct rd *r);

/* The buffer's memory goes back: to the stream's hold while the stream lives. */
static void rd_buf_drop(struct rd *r, struct rd_buf *b)
{
	if (b->data == NULL)
		return;
	budget_free(b->data, b->cap);
	if (r->op->st != NULL)
		stream_unhold(r->op->st, b->cap);
	else
		budget_give(b->cap);
	b->data = NULL;
	b->cap = 0;
}

static void rd_free(struct rd *r)
{
	free(r);
	budget_give(sizeof(*r)); /* read_start's stream_reserve() */
}

/* The fd is closed on a worker like every other file call (a close on a hung FUSE
 * mount holds a thread, not the loop), once no buffer job uses it. */
static void rd_close_run(struct op_job *j)
{
	struct rd *r = container_of(j, struct rd, close);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

/* The op goes: its last job has closed the fd. */
static void read_release(struct op *op)
{
	struct rd *r = op->data;
	if (r == NULL)
		return;
	ev_io_stop(srv->loop, &r->io);
	for (unsigned i = 0; i < READ_NBUF; i++)
		rd_buf_drop(r, &r->b[i]);
	rd_free(r);
}

/* In a sparse file, the bytes of a hole: zeros written into the buffer cost far less
 * than pread, which has the kernel allocate and clear page-cache pages for them. 0 if
 * there is data at pos (or no way to tell), else the number of zero bytes put in. */
static size_t rd_hole(struct rd *r, struct rd_buf *b)
{
	uint64_t pos = b->off + b->len;
	size_t room = b->want - b->len;
	off_t d = lseek(r->fd, (off_t)pos, SEEK_DATA);
	uint64_t zeros;
	if (d >= 0) {
		if ((uint64_t)d <= pos)
			return 0;
		zeros = (uint64_t)d - pos;
	} else {
		struct stat st;
		/* ENXIO: no data from pos on, the rest of the file is a hole */
		if (errno != ENXIO || fstat(r->fd, &st) < 0 || (uint64_t)st.st_size <= pos)
			return 0;
		zeros = (uint64_t)st.st_size - pos;
	}
	size_t n = zeros < room ? (size_t)zeros : room;
	memset(b->data + b->len, 0, n);
	return n;
}

static void rd_buf_fill(struct rd *r, struct rd_buf *b, struct op_job *job);

/* A regular file cut while we read it: the part of the buffer beyond its end now is
 * dropped. The kernel may hand back zeros for pages a concurrent truncate took away
 * (tmpfs does, for the length the read started with), and those were never the file's. */
static void rd_buf_clip(struct rd *r, struct rd_buf *b)
{
	struct stat st;
	if (!r->sized || b->len == 0 || fstat(r->fd, &st) < 0)
		return;
	uint64_t end = st.st_size > 0 ? (uint64_t)st.st_size : 0;
	if (end < b->off + b->len)
		b->len = end > b->off ? (size_t)(end - b->off) : 0;
}

static void rd_buf_run(struct op_job *job)
{
	struct rd_buf *b = container_of(job, struct rd_buf, job);
	struct rd *r = job->op->data;
	rd_buf_fill(r, b, job);
	rd_buf_clip(r, b);
}

static void rd_buf_fill(struct rd *r, struct rd_buf *b, struct op_job *job)
{
	while (b->len < b->want) {
		if (r->sparse) {
			size_t z = rd_hole(r, b);
			if (z > 0) {
				b->len += z;
				continue;
			}
		}
		ssize_t n;
		if (r->seekable)
			n = pread(r->fd, b->data + b->len, b->want - b->len, (off_t)(b->off + b->len));
		else
			n = read(r->fd, b->data + b->len, b->want - b->len);
		if (n < 0) {
			if (errno == EINTR && !worker_cancelled(&job->work))
				continue;
			b->err = errno;
			return;
		}
		if (n == 0)
			return; /* end of file */
		b->len += (size_t)n;
		/* a device: hand on what came, rather than wait for a full buffer */
		if (!r->seekable)
			return;
	}
}

static void rd_buf_done(struct op_job *job)
{
	struct rd_buf *b = container_of(job, struct rd_buf, job);
	/* (the request's identity could not be entered: the read did not run) */
	if (job->rc < 0 && b->err == 0)
		b->err = job->err.code;
	b->state = RB_READY;
	rd_pump(job->op->data);
}

/* Bytes the client may still take beyond what is read (or being read) and not sent. */
static int64_t rd_credit_left(const struct rd *r)
{
	int64_t ahead = 0;
	for (unsigned i = 0; i < r->nbuf; i++) {
		const struct rd_buf *b = &r->b[i];
		if (b->state == RB_BUSY)
			ahead += (int64_t)b->want;
		else if (b->state == RB_READY)
			ahead += (int64_t)(b->len - b->sent);
	}
	return r->op->st->send_credit - ahead;
}

/* Ask a worker to fill b (idle, next in file order) with the next chunk. False when
 * nothing may be read now: no credit, no memory (the stream is then registered for
 * writable()), or everything asked for. */
static bool rd_fill(struct rd *r, struct rd_buf *b)
{
	struct stream *st = r->op->st;
	if (r->next >= r->end)
		return false;
	/* a regular file: nothing past the end the open saw but the probing byte, and
	 * nothing behind that byte until it is back */
	uint64_t left = r->end - r->next;
	if (r->size != SIZE_UNKNOWN) {
		for (unsigned i = 0; i < r->nbuf; i++)
			if (r->b[i].state != RB_IDLE && r->b[i].off + r->b[i].want > r->size)
				return false;
		uint64_t to_size = r->size > r->next ? r->size - r->next : 0;
		if (to_size < left)
			left = to_size;
	}
	int64_t credit = rd_credit_left(r);
	if (credit <= 0 && left > 0) {
		stream_wait_writable(st);
		return false;
	}
	size_t n = READ_BUF;
	if ((uint64_t)credit < n)
		n = (size_t)credit;
	if (left < n)
		n = (size_t)left;
	/* (a full-size buffer takes the probing byte in place of the file's last one) */
	size_t need = n < READ_BUF ? n + 1 : READ_BUF;
	if (b->data == NULL || b->cap < need) {
		rd_buf_drop(r, b);
		size_t cap = need > READ_SMALL ? READ_BUF : (need + 4095) & ~(size_t)4095;
		size_t got = stream_hold(st, cap, cap < READ_SMALL ? cap : READ_SMALL);
		if (got == 0)
			return false;
		b->data = budget_alloc(got);
		if (b->data == NULL) {
			stream_unhold(st, got);
			b->len = b->sent = 0;
			b->err = ENOMEM;
			b->state = RB_READY;
			return false;
		}
		b->cap = got;
	}
	if (n > b->cap)
		n = b->cap;
	/* the chunk that reaches the size: one byte more, so that a short read tells the
	 * end (room for that byte: one less of the file, fetched by the next chunk) */
	bool probe = r->size != SIZE_UNKNOWN && r->next + n >= r->size && r->next + n < r->end;
	if (probe && n == b->cap) {
		n--;
		probe = r->next + n >= r->size;
	}
	b->off = r->next;
	b->want = n + (probe ? 1 : 0);
	b->len = b->sent = 0;
	b->err = 0;
	b->state = RB_BUSY;
	/* a device returns what it has: its next offset is known only afterwards */
	if (r->seekable)
		r->next += b->want;
	op_submit(r->op, &b->job);
	return true;
}

/* The stream ends, the watcher first: the fd is closed after (rd_close_run). */
static void rd_end(struct rd *r, const Shim__V1__Result *res, const struct shim_err *err)
{
	ev_io_stop(srv->loop, &r->io);
	if (res != NULL)
		op_end(r->op, res);
	else
		op_fail(r->op, err);
}

static void rd_finish(struct rd *r)
{
	stream_send_data(r->op->st, NULL, 0, true);
	Shim__V1__ReadReply rr = SHIM__V1__READ_REPLY__INIT;
	rr.bytes = r->sent;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_READ;
	res.read = &rr;
	rd_end(r, &res, NULL);
}

/* Send what the buffers hold, in file order, as far as credit and the connection
 * allow; ask for the next chunks as far as credit and memory allow. */
static void rd_pump(struct rd *r)
{
	struct stream *st = r->op->st;
	bool stuck = false; /* bytes to send, and no room or credit for them */
	for (;;) {
		struct rd_buf *b = &r->b[r->head];
		if (b->state != RB_READY)
			break;
		while (b->sent < b->len) {
			size_t n = stream_can_send(st);
			if (n == 0)
				break;
			if (n > b->len - b->sent)
				n = b->len - b->sent;
			stream_send_data(st, b->data + b->sent, n, false);
			b->sent += n;
			r->sent += n;
		}
		if (b->sent < b->len) {
			stuck = true;
			break;
		}
		if (b->err != 0) {
			/* the bytes read before the error went out; the error ends the stream,
			 * also after bytes went out: the client must not take a short file for
			 * a whole one */
			struct shim_err e;
			err_set(&e, b->err, r->p.abs, b->err == ENOMEM ? "read: out of memory" : "read");
			rd_end(r, NULL, &e);
			return;
		}
		bool eof = r->seekable ? b->len < b->want : b->len == 0;
		if (!r->seekable)
			r->next = b->off + b->len;
		/* more than the size the open saw: the file grows, read it to a short read */
		if (r->size != SIZE_UNKNOWN && b->off + b->len > r->size)
			r->size = SIZE_UNKNOWN;
		b->state = RB_IDLE;
		r->head = (r->head + 1) % r->nbuf;
		if (eof) {
			/* the other buffer holds bytes past the end, if any: drop them */
			rd_finish(r);
			return;
		}
	}
	/* the next chunks, into the idle buffers after the busy and ready ones */
	bool filled = false;
	for (;;) {
		unsigned k = 0;
		while (k < r->nbuf && r->b[(r->head + k) % r->nbuf].state != RB_IDLE)
			k++;
		/* a device: one read at a time (where the next starts is known after it) */
		if (k == r->nbuf || (!r->seekable && k > 0))
			break;
		struct rd_buf *b = &r->b[(r->head + k) % r->nbuf];
		if (!rd_fill(r, b)) {
			if (b->state == RB_READY) /* out of memory: failed in order, from the head */
				filled = true;
			break;
		}
		filled = true;
	}
	if (r->b[r->head].state == RB_IDLE && !filled) {
		/* nothing read, nothing in flight: the end, or a wait (rd_fill registered it) */
		if (r->next >= r->end) {
			rd_finish(r);
			return;
		}
	}
	if (r->b[r->head].state == RB_READY && r->b[r->head].err == ENOMEM && r->b[r->head].len == 0) {
		rd_pump(r);
		return;
	}
	if (stuck)
		stream_wait_writable(st);
	/* waiting for credit or memory: the idle buffers' memory goes back meanwhile */
	if (!filled)
		for (unsigned i = 0; i < r->nbuf; i++)
			if (r->b[i].state == RB_IDLE)
				rd_buf_drop(r, &r->b[i]);
}

/* ---- FIFOs and sockets, on the loop ---- */

static uint8_t rd_loop_buf[FRAME_DATA_CHUNK];

/* Read what the FIFO has, as far as credit and the connection allow. Without credit, at
 * most one byte (kept in pend), so that a writer's end is still seen and reported. */
static void rd_loop_pump(struct rd *r, bool readable)
{
	struct stream *st = r->op->st;
	struct ev_loop *loop = srv->loop;
	if (readable)
		r->woke = true;
	if (!r->woke) {
		/* no writer yet: a non-blocking read would return 0, taken for the end */
		ev_io_start(loop, &r->io);
		return;
	}
	for (int round = 0; round < 16; round++) {
		size_t n = stream_can_send(st);
		if (n > 0 && r->pend_full) {
			stream_send_data(st, &r->pend, 1, false);
			r->pend_full = false;
			r->sent++;
			r->next++;
			continue;
		}
		if (r->next >= r->end) {
			rd_finish(r);
			return;
		}
		if (n == 0) {
			stream_wait_writable(st);
			/* no room while credit is left (output full), or a byte is kept: nothing to
			 * learn from the FIFO now */
			if (st->send_credit > 0 || r->pend_full) {
				ev_io_stop(loop, &r->io);
				return;
			}
			if (!readable) {
				ev_io_start(loop, &r->io);
				return;
			}
			n = 1;
		}
		bool probe = stream_can_send(st) == 0;
		if (r->end - r->next < n)
			n = (size_t)(r->end - r->next);
		ssize_t k = read(r->fd, probe ? &r->pend : rd_loop_buf, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				ev_io_start(loop, &r->io);
				return;
			}
			struct shim_err e;
			err_set(&e, errno, r->p.abs, "read");
			rd_end(r, NULL, &e);
			return;
		}
		if (k == 0) {
			rd_finish(r);
			return;
		}
		readable = false;
		if (probe) {
			r->pend_full = true;
			continue;
		}
		stream_send_data(st, rd_loop_buf, (size_t)k, false);
		r->sent += (uint64_t)k;
		r->next += (uint64_t)k;
	}
	/* more may be there: come back through the loop, after the others */
	ev_io_start(loop, &r->io);
}

static void rd_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct rd *r = container_of(w, struct rd, io);
	struct op *op = r->op;
	if (op->st == NULL)
		return;
	/* (the pump may end the stream: the op stays until it has returned) */
	op_hold(op);
	rd_loop_pump(r, true);
	op_put(op);
}

static void read_writable(struct op *op)
{
	struct rd *r = op->data;
	if (r->on_loop)
		rd_loop_pump(r, false);
	else
		rd_pump(r);
}

/* (a FIFO without a writer blocks in open or read: op.c interrupts it, EINTR) */
static void read_cancel(struct op *op)
{
	struct rd *r = op->data;
	ev_io_stop(srv->loop, &r->io);
}

/* The op's main job, as the request's identity (as are the reads of the open fd). */
static int read_open(struct op *op, struct shim_err *err)
{
	struct rd *r = op->data;
	const Shim__V1__ReadRequest *q = op->req->read;
	bool allow_special = q->has_allow_special && q->allow_special;
	uint64_t offset = r->next;
	struct stat st;
	if (offset > 0) {
		/* before the open, which for a FIFO waits for a writer */
		if (fs_stat(&r->p, true, &st, err) < 0)
			return -1;
		if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && !allow_special)
			return op_fs_io_refuse_special(err, r->p.abs, st.st_mode, "read");
		if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode) && !S_ISDIR(st.st_mode))
			return err_set(err, ESPIPE, r->p.abs, "read at an offset (not a seekable file)");
	}
	/* O_NONBLOCK: a FIFO opens at once, writer or not (the loop waits for one, see
	 * rd_loop_pump); for what is read on a worker it is taken off again below */
	int cleanup_close fd = fs_open(&r->p, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0, err);
	if (fd < 0) {
		/* a socket file (ENXIO) not allowed: name it rather than the open's errno */
		struct shim_err e;
		if (err->code == ENXIO && !allow_special && fs_stat(&r->p, true, &st, &e) == 0 &&
		    op_fs_io_special_kind(st.st_mode) != NULL)
			op_fs_io_refuse_special(err, r->p.abs, st.st_mode, "read");
		return -1;
	}
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, r->p.abs, "stat");
	if (S_ISDIR(st.st_mode))
		return err_set(err, EISDIR, r->p.abs, "read");
	if (!S_ISREG(st.st_mode) && !allow_special)
		return op_fs_io_refuse_special(err, r->p.abs, st.st_mode, "read");
	r->seekable = S_ISREG(st.st_mode) || S_ISBLK(st.st_mode);
	r->sized = S_ISREG(st.st_mode) && st.st_size > 0;
	r->on_loop = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISCHR(st.st_mode);
	if (!r->seekable && offset > 0)
		return err_set(err, ESPIPE, r->p.abs, "read at an offset (not a seekable file)");
	if (offset > (uint64_t)INT64_MAX)
		return err_set(err, EINVAL, r->p.abs, "offset beyond the largest file offset");
	if (!r->on_loop) {
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
			return err_set(err, errno, r->p.abs, "fcntl");
	}
	r->nbuf = r->seekable ? READ_NBUF : 1;
	r->size = SIZE_UNKNOWN;
	if (S_ISREG(st.st_mode)) {
		/* (a file of /proc says 0 whatever it holds: read it to a short read) */
		r->size = st.st_size > 0 ? (uint64_t)st.st_size : SIZE_UNKNOWN;
		/* (a file of /proc has size 0 and is never taken for sparse) */
		r->sparse = st.st_size > 0 && (uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size;
		posix_fadvise(fd, (off_t)offset, 0, POSIX_FADV_SEQUENTIAL);
	}
	r->fd = steal_fd(fd);
	return 0;
}

static void read_open_done(struct op *op, int rc, const struct shim_err *err)
{
	struct rd *r = op->data;
	if (rc < 0) {
		op_fail(op, err);
		return;
	}
	if (r->on_loop) {
		ev_io_set(&r->io, r->fd, EV_READ);
		rd_loop_pump(r, false);
		return;
	}
	rd_pump(r);
}

static int read_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__ReadRequest *q = op->req->read;
	/* the read's state is a few kB (paths, an error): 255 reads on each of many
	 * connections are what a hoarder holds besides the buffers */
	if (stream_reserve(op->st, sizeof(struct rd), err) < 0)
		return -1;
	struct rd *r = calloc(1, sizeof(*r));
	if (r == NULL) {
		budget_give(sizeof(*r));
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	r->op = op;
	r->fd = -1;
	ev_init(&r->io, rd_io_cb);
	r->nbuf = 1;
	for (unsigned i = 0; i < READ_NBUF; i++) {
		r->b[i].job.run = rd_buf_run;
		r->b[i].job.done = rd_buf_done;
	}
	op->data = r; /* (from here on read_release frees it) */
	r->close.run = rd_close_run;
	op_at_end(op, &r->close);
	if (fs_path_get(&q->path, &r->p, err) < 0)
		return -1;
	r->next = q->has_offset ? q->offset : 0;
	r->end = UINT64_MAX;
	if (q->has_length && q->length < UINT64_MAX - r->next)
		r->end = r->next + q->length;
	op_run_job(op);
	return 0;
}

const struct op_kind op_fs_read_kind = {
	SHIM__V1__REQUEST__KIND_READ,
	"read",
	OP_FS,
	.start = read_start,
	.job = read_open,
	.job_done = read_open_done,
	.writable = read_writable,
	.cancel = read_cancel,
	.release = read_release,
};

/* ================================ write ================================ */

/* An upload: received bytes wait in a ring as large as the credit the client has,
 * since credit goes back only for bytes written; each write job takes all that is
 * there. The ring starts as large as the initial window (256 KiB, a pooled buffer: a
 * small write allocates nothing). A write whose client has sent all that first credit
 * and goes on is a big one: its ring grows once to WR_RING, and the client gets the
 * difference as credit with the next WINDOW. With 256 KiB in flight the client, the
 * loop and the worker took turns (half the CPUs idle); with 2 MiB they overlap.
 * Measured here, 1 GiB into ext4, interleaved daemons, MB/s: a ring of 256 KiB
 * 843-1272; 1 MiB 1210-2769 (median 1676); 2 MiB 2491-3088 (2707); 4 MiB 2241-3018
 * (2887); 8 MiB 2155-2966 (2555). Short of budget for it, a write keeps the small
 * ring. What also keeps an upload as fast as the disk is starting writeback as the
 * bytes come (sync_file_range every WRITEBACK_STEP bytes), instead of leaving the
 * whole file to the final fsync. */
#define WR_RING (2u << 20)
#define WRITEBACK_STEP (8u << 20)

/* WJ_WRITE_COMMIT: the last bytes and the commit in one job (one hand-off less for
 * a big file's end). A small file's bytes and FIN usually come in the same read as the
 * request: the open waits for the end of the loop iteration (an ev_prepare), and the
 * WJ_OPEN job then writes the bytes that came meanwhile and, given the FIN, commits
 * too: one job, one worker wake-up and one loop wake-up per small write. */
enum wr_step { WJ_OPEN, WJ_WRITE, WJ_WRITE_COMMIT, WJ_COMMIT };

struct wr {
	struct op *op;
	struct op_job job; /* one at a time; its rc and err: the outcome of the step */
	enum wr_step step;
	bool busy;
	bool opened;
	/* WJ_OPEN: then write job_len bytes (open_write) and commit (open_commit), unless
	 * the file is to be written on the loop; open_wrote: that was done */
	bool open_write, open_commit, open_wrote;
	ev_prepare start; /* the first WJ_OPEN, once the loop iteration is over */
	/* what a write cut off midway leaves (fd, temp file, journal entry) is undone
	 * by the op's last job, on a worker, as the request's identity */
	struct op_job undo;

	struct fs_path p;
	bool append, exclusive, parents, in_place, has_mode, allow_special;
	mode_t mode;

	int fd;
	bool positional; /* pwrite at off (a regular file, not O_APPEND) */
	/* an allowed FIFO, socket or character device: written on the loop, non-blocking
	 * (a reader that does not read holds no thread) */
	bool on_loop;
	ev_io io;
	/* an allowed FIFO without a reader: the open is tried again from a timer (no
	 * thread waits for the reader) */
	bool wait_reader;
	ev_timer retry;
	double retry_s;
	bool created; /* in place: we created the file */
	/* atomic: the parent directory (O_PATH), the final name, the temp file */
	int dfd;
	char name[NAME_MAX + 1];
	char tmp[NAME_MAX + 1];
	bool tmp_made;
	struct journal_entry *jent;
	bool existed;
	bool via_link; /* the target was reached through a symlink: its set-id bits are not kept */
	struct stat old;

	/* Bytes received and not yet written: a ring no larger than the credit we
	 * grant, since credit goes back only for bytes written. */
	uint8_t *ring;
	size_t cap, head, len;
	size_t job_len; /* bytes the write job in flight takes from head */
	bool grown;     /* wr_grow() has tried */
	uint64_t off, total;
	uint64_t flushed; /* positional: writeback started for the bytes before this offset */
	bool fin;
	struct stat done_st;
};

static void wr_submit(struct wr *w, enum wr_step step);

static void wr_free(struct wr *w)
{
	size_t held = sizeof(*w) + w->cap; /* write_start's stream_reserve() */
	budget_free(w->ring, w->cap);
	free(w);
	budget_give(held);
}

/* Worker side: drop the temp file, the journal entry and the fds. Idempotent. */
static void wr_release(struct wr *w)
{
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	if (w->tmp_made && unlinkat(w->dfd, w->tmp, 0) < 0 && errno != ENOENT)
		log_warn("write %s: cannot remove the temp file %s: %s", w->p.abs, w->tmp, strerror(errno));
	w->tmp_made = false;
	journal_remove(w->jent);
	w->jent = NULL;
	if (w->dfd >= 0)
		close(w->dfd);
	w->dfd = -1;
}

static int wr_fail(struct wr *w, int code, const char *what)
{
	err_set(&w->job.err, code, w->p.abs, "%s", what);
	wr_release(w);
	return -1;
}

/* The same with the error as fs_open or fs_open_parent left it (their message says which
 * symlink was not followed, and why). */
static int wr_fail_kept(struct wr *w)
{
	wr_release(w);
	return -1;
}

/* mkdir -p of the parent of p, confined like every other path. */
static int mkdir_parents(const struct fs_path *p, struct shim_err *err)
{
	char name[NAME_MAX + 1];
	struct shim_err e;
	int fd = fs_open_parent(p, name, &e);
	if (fd >= 0) {
		close(fd);
		return 0;
	}
	if (e.code != ENOENT) {
		*err = e;
		return -1;
	}
	size_t len = p->len;
	while (len > 1 && p->abs[len - 1] == '/')
		len--;
	/* each prefix ending before a '/', down to the parent itself */
	for (size_t k = 1; k < len; k++) {
		if (p->abs[k] != '/' || p->abs[k - 1] == '/')
			continue;
		struct fs_path q;
		memcpy(q.abs, p->abs, k);
		q.abs[k] = '\0';
		q.len = k;
		int dfd = fs_open_parent(&q, name, &e);
		if (dfd < 0)
			return err_set(err, e.code, p->abs, "create parent directories: %s", e.msg);
		int rc = mkdirat(dfd, name, 0755);
		int en = errno;
		close(dfd);
		if (rc < 0 && en != EEXIST)
			return err_set(err, en, p->abs, "create parent directory %s", q.abs);
	}
	return 0;
}

/* append / no_atomic, and files that cannot be replaced (devices, FIFOs): open the
 * file itself. O_NONBLOCK: a FIFO without a reader fails the open at once (ENXIO)
 * instead of holding the thread; what is not a regular file is refused unless the
 * request allows special files. */
static int wr_open_in_place(struct wr *w, bool append, bool trunc)
{
	int flags = O_WRONLY | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : 0) | (trunc ? O_TRUNC : 0);
	/* Try to create first, so that we know whether the file is new (it then gets
	 * the requested mode or 0644, whatever the umask). */
	for (int tries = 0; tries < 3; tries++) {
		w->fd = fs_open(&w->p, flags | O_CREAT | O_EXCL, 0600, &w->job.err);
		if (w->fd >= 0) {
			w->created = true;
			break;
		}
		if (w->job.err.code != EEXIST || w->exclusive)
			return wr_fail_kept(w);
		w->fd = fs_open(&w->p, flags, 0, &w->job.err);
		if (w->fd >= 0 || w->job.err.code != ENOENT)
			break;
		/* removed in between (or a dangling symlink): try again */
	}
	struct stat st;
	if (w->fd < 0 && w->job.err.code == ENXIO) {
		/* a FIFO without a reader (or a socket file): name it */
		struct shim_err e;
		if (fs_stat(&w->p, true, &st, &e) == 0 && op_fs_io_special_kind(st.st_mode) != NULL) {
			if (!w->allow_special) {
				op_fs_io_refuse_special(&w->job.err, w->p.abs, st.st_mode, "write");
				wr_release(w);
				return -1;
			}
			if (S_ISFIFO(st.st_mode)) {
				/* no reader yet: the loop tries again in a while */
				w->wait_reader = true;
				wr_release(w);
				return 0;
			}
		}
	}
	if (w->fd < 0)
		return wr_fail_kept(w);
	if (fstat(w->fd, &st) < 0)
		return wr_fail(w, errno, "stat");
	if (!S_ISREG(st.st_mode) && !w->allow_special) {
		op_fs_io_refuse_special(&w->job.err, w->p.abs, st.st_mode, "write");
		wr_release(w);
		return -1;
	}
	w->on_loop = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISCHR(st.st_mode);
	if (!w->on_loop) {
		int fl = fcntl(w->fd, F_GETFL);
		if (fl < 0 || fcntl(w->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
			return wr_fail(w, errno, "fcntl");
	}
	/* Positional writes only where the kernel takes them: a proc file (and other
	 * seq_file ones) is S_ISREG but refuses pwrite with ESPIPE, so it is written
	 * sequentially from where the open left it, as a FIFO or a device is. A pwritev
	 * of no bytes asks without side effects: the kernel checks FMODE_PWRITE first and
	 * returns before calling the file's write handler for an empty vector. */
	struct iovec none = {0};
	w->positional = S_ISREG(st.st_mode) && !append && pwritev(w->fd, &none, 0, 0) == 0;
	return 0;
}

/* The real path of the temp file, for the journal: the directory as the kernel
 * sees it (outside any --root), so that a sweep finds it whatever the root. */
static int temp_real_path(struct wr *w, char *buf, size_t size)
{
	char proc[64], dir[PATH_MAX];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", w->dfd);
	ssize_t n = readlink(proc, dir, sizeof(dir) - 1);
	if (n > 0) {
		dir[n] = '\0';
	} else {
		/* no /proc: the path as given, beneath the root */
		const char *root = fs_root() ? fs_root() : "";
		const char *slash = strrchr(w->p.abs, '/');
		snprintf(dir, sizeof(dir), "%s%.*s", root, (int)(slash - w->p.abs), w->p.abs);
	}
	int m = snprintf(buf, size, "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", w->tmp);
	if (m < 0 || (size_t)m >= size)
		return err_set(&w->job.err, ENAMETOOLONG, w->p.abs, "temp file path too long");
	return 0;
}

/* Look at what is at the final name: refuse a directory, follow a symlink to the
 * file it names (within the root), note the mode and owner to keep. Returns 1 when
 * the file cannot be replaced and must be written in place. */
static int wr_check_target(struct wr *w)
{
	struct stat st;
	if (fstatat(w->dfd, w->name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		return wr_fail(w, errno, "stat");
	}
	if (w->exclusive)
		return wr_fail(w, EEXIST, "exclusive write");
	if (S_ISLNK(st.st_mode)) {
		/* write the file the link names (resolved beneath the root); a dangling
		 * link is replaced by the new file */
		struct shim_err e;
		int cleanup_close tfd = fs_open(&w->p, O_PATH, 0, &e);
		if (tfd < 0) {
			if (e.code == ENOENT)
				return 0;
			/* (fs_open's message: a link not followed says which and why) */
			w->job.err = e;
			wr_release(w);
			return -1;
		}
		struct stat tst;
		struct fs_path q;
		if (fstat(tfd, &tst) < 0)
			return wr_fail(w, errno, "stat");
		if (fs_fd_path(tfd, q.abs, sizeof(q.abs), &e) < 0)
			return wr_fail(w, e.code, "resolve the symlink");
		q.len = strlen(q.abs);
		close(w->dfd);
		w->dfd = fs_open_parent(&q, w->name, &e);
		if (w->dfd < 0) {
			err_set(&w->job.err, e.code, w->p.abs, "%s", e.msg);
			return wr_fail_kept(w);
		}
		if (fstatat(w->dfd, w->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return wr_fail(w, errno, "stat");
		/* the file the link's owner was checked against (fs_open), not another
		 * one put there since */
		if (st.st_dev != tst.st_dev || st.st_ino != tst.st_ino)
			return wr_fail(w, EAGAIN, "the symlink's target changed while being resolved");
		w->via_link = true;
	}
	if (S_ISDIR(st.st_mode))
		return wr_fail(w, EISDIR, "write");
	if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
		/* replacing /dev/null with a file would be a surprise: in place, if allowed */
		if (!w->allow_special) {
			op_fs_io_refuse_special(&w->job.err, w->p.abs, st.st_mode, "write");
			wr_release(w);
			return -1;
		}
		return 1;
	}
	/* A file bind-mounted over the name (a container's /etc/hosts) cannot be
	 * renamed over (EBUSY): it can only be written in place. (Kernels before 5.8
	 * do not tell: the rename then fails with EBUSY.) */
	struct statx sx;
	if (statx(w->dfd, w->name, AT_SYMLINK_NOFOLLOW, 0, &sx) == 0 &&
	    (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT))
		return 1;
	w->existed = S_ISREG(st.st_mode);
	w->old = st;
	if (w->via_link)
		w->old.st_mode &= (mode_t) ~(S_ISUID | S_ISGID);
	return 0;
}

static int wr_open_atomic(struct wr *w)
{
	w->dfd = fs_open_parent(&w->p, w->name, &w->job.err);
	if (w->dfd < 0)
		return wr_fail_kept(w);
	if (strcmp(w->name, ".") == 0 || strcmp(w->name, "..") == 0 || w->p.abs[w->p.len - 1] == '/')
		return wr_fail(w, EISDIR, "write");
	int rc = wr_check_target(w);
	if (rc < 0)
		return -1;
	if (rc == 1) {
		close(w->dfd);
		w->dfd = -1;
		return wr_open_in_place(w, false, true);
	}
	char path[PATH_MAX + NAME_MAX + 2];
	for (int tries = 0;; tries++) {
		journal_temp_name(w->name, w->tmp, sizeof(w->tmp));
		if (temp_real_path(w, path, sizeof(path)) < 0) {
			wr_release(w);
			return -1;
		}
		/* in the journal before it exists: a crash from here on is cleaned up */
		struct shim_err je;
		w->jent = journal_add(path, &je);
		if (w->jent == NULL)
			return wr_fail(w, je.code, je.msg);
		w->fd = openat(w->dfd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600);
		if (w->fd >= 0)
			break;
		int en = errno;
		journal_remove(w->jent);
		w->jent = NULL;
		if (en != EEXIST || tries >= 10)
			return wr_fail(w, en, "create temp file");
	}
	w->tmp_made = true;
	w->positional = true;
	return 0;
}

static void wr_open_run(struct wr *w)
{
	w->job.rc = -1;
	if (w->parents && mkdir_parents(&w->p, &w->job.err) < 0) {
		wr_release(w);
		return;
	}
	int rc = w->in_place ? wr_open_in_place(w, w->append, !w->append) : wr_open_atomic(w);
	if (rc == 0)
		w->job.rc = 0;
}

static void wr_write_run(struct wr *w)
{
	w->job.rc = -1;
	size_t done = 0;
	while (done < w->job_len) {
		/* the bytes from head, in at most two pieces (the ring wraps) */
		size_t start = (w->head + done) % w->cap;
		size_t left = w->job_len - done;
		struct iovec iov[2];
		int n = 1;
		iov[0].iov_base = w->ring + start;
		iov[0].iov_len = left < w->cap - start ? left : w->cap - start;
		if (iov[0].iov_len < left) {
			iov[1].iov_base = w->ring;
			iov[1].iov_len = left - iov[0].iov_len;
			n = 2;
		}
		ssize_t k = w->positional ? pwritev(w->fd, iov, n, (off_t)w->off) : writev(w->fd, iov, n);
		if (k < 0) {
			if (errno == EINTR && !worker_cancelled(&w->job.work))
				continue;
			wr_fail(w, errno, "write");
			return;
		}
		if (k == 0) {
			wr_fail(w, ENOSPC, "write");
			return;
		}
		done += (size_t)k;
		w->off += (uint64_t)k;
	}
	if (w->positional && w->off - w->flushed >= WRITEBACK_STEP) {
		/* Start writing back what has piled up, without waiting for it: the disk
		 * works while the next bytes arrive, and the final fsync has little left
		 * to do (instead of the whole file, all at once, at the end). */
		sync_file_range(w->fd, (off_t)w->flushed, (off_t)(w->off - w->flushed), SYNC_FILE_RANGE_WRITE);
		w->flushed = w->off;
	}
	w->job.rc = 0;
}

/* The message of a write whose directory fsync failed after the rename. */
#define DIR_SYNC_FAILED "fsync of the directory after the rename: the new file is in place but may not survive a crash"

/* Make the bytes durable and, in atomic mode, put them in place. */
static void wr_commit_run(struct wr *w)
{
	w->job.rc = -1;
	if (w->tmp_made) {
		/* owner before mode: chown clears set-id bits */
		/* the old file's owner, when the operation acts as root (a user cannot
		 * give a file away: the new file is then the acting user's, as it would
		 * be for that user's own editor) */
		if (w->existed && fs_ctx_uid() == 0 && fchown(w->fd, w->old.st_uid, w->old.st_gid) < 0 &&
		    errno != EPERM && errno != EINVAL) {
			wr_fail(w, errno, "chown temp file");
			return;
		}
		mode_t m = w->has_mode ? w->mode : w->existed ? (w->old.st_mode & 07777) : 0644;
		if (fchmod(w->fd, m) < 0) {
			wr_fail(w, errno, "chmod temp file");
			return;
		}
		if (fsync(w->fd) < 0) {
			wr_fail(w, errno, "fsync");
			return;
		}
		if (worker_cancelled(&w->job.work)) {
			wr_fail(w, ECANCELED, "cancelled");
			return;
		}
		int rc;
		if (w->exclusive) {
			rc = renameat2(w->dfd, w->tmp, w->dfd, w->name, RENAME_NOREPLACE);
			if (rc < 0 && (errno == EINVAL || errno == ENOSYS)) {
				/* a filesystem without RENAME_NOREPLACE: link refuses to replace too */
				rc = linkat(w->dfd, w->tmp, w->dfd, w->name, 0);
				if (rc == 0)
					unlinkat(w->dfd, w->tmp, 0);
			}
		} else {
			rc = renameat(w->dfd, w->tmp, w->dfd, w->name);
		}
		if (rc < 0) {
			wr_fail(w, errno, "rename into place");
			return;
		}
		w->tmp_made = false;
		/* The rename itself must survive a crash. If that cannot be made sure of,
		 * the write fails although the new file is in place (PROTOCOL.md 12.1):
		 * an END would promise durability, and the old file is gone already, so
		 * the error says so. EINVAL: a filesystem that cannot sync a directory.
		 * A directory the shim may write but not read cannot be opened for the
		 * fsync at all: that is only logged. */
		int dirfd = openat(w->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dirfd < 0) {
			log_warn("write %s: cannot open the directory to fsync it: %s", w->p.abs, strerror(errno));
		} else {
			rc = fsync(dirfd);
			int en = errno;
			close(dirfd);
			if (rc < 0 && en != EINVAL) {
				wr_fail(w, en, DIR_SYNC_FAILED);
				return;
			}
		}
	} else {
		if ((w->has_mode || w->created) && fchmod(w->fd, w->has_mode ? w->mode : 0644) < 0) {
			wr_fail(w, errno, "chmod");
			return;
		}
		/* EINVAL: a FIFO or a device that cannot be synced */
		if (fsync(w->fd) < 0 && errno != EINVAL && errno != EROFS) {
			wr_fail(w, errno, "fsync");
			return;
		}
	}
	if (fstat(w->fd, &w->done_st) < 0) {
		wr_fail(w, errno, "stat");
		return;
	}
	wr_release(w);
	w->job.rc = 0;
}

/* The write's END, with bytes written and the file's stat after the commit: sent from
 * the job (from_worker: true if it went, see op_wire_end) or by the loop. */
static bool wr_reply(struct wr *w, uint64_t bytes, bool from_worker)
{
	Shim__V1__FileStat fst;
	Shim__V1__Timestamp ts[3];
	fs_fill_stat(&fst, ts, &w->done_st, NULL, 0);
	Shim__V1__WriteReply wr = SHIM__V1__WRITE_REPLY__INIT;
	wr.bytes = bytes;
	wr.stat = &fst;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_WRITE;
	res.write = &wr;
	if (from_worker)
		return op_wire_end(w->op, &w->job, &res);
	op_end(w->op, &res);
	return true;
}

/* Every step as the request's identity (OP_FS): the temp file is created as it (and
 * so owned by it, no chown after), renamed and removed as it. */
static void wr_run(struct op_job *job)
{
	struct wr *w = container_of(job, struct wr, job);
	switch (w->step) {
	case WJ_OPEN:
		wr_open_run(w);
		w->open_wrote = false;
		if (w->job.rc == 0 && w->open_write && !w->on_loop && !w->wait_reader) {
			wr_write_run(w);
			w->open_wrote = w->job.rc == 0;
			if (w->job.rc == 0 && w->open_commit) {
				wr_commit_run(w);
				/* A small write, whole in one job: nothing of its stream has been
				 * sent (no WINDOW yet), so its END may go from here, without waking
				 * the loop for it (wr_done then only tidies up). */
				if (w->job.rc == 0)
					wr_reply(w, w->total + w->job_len, true);
			}
		}
		break;
	case WJ_WRITE:
		wr_write_run(w);
		break;
	case WJ_WRITE_COMMIT:
		wr_write_run(w);
		if (w->job.rc == 0)
			wr_commit_run(w);
		break;
	case WJ_COMMIT:
		wr_commit_run(w);
		break;
	}
}

static void wr_loop_write(struct wr *w);

static void wr_pump(struct wr *w)
{
	if (w->busy || !w->opened)
		return;
	if (w->on_loop) {
		wr_loop_write(w);
		return;
	}
	if (w->len > 0) {
		w->job_len = w->len;
		wr_submit(w, w->fin ? WJ_WRITE_COMMIT : WJ_WRITE);
	} else if (w->fin) {
		wr_submit(w, WJ_COMMIT);
	}
}

static void wr_undo_run(struct op_job *j);

/* End the stream with err, and undo on a worker what the write still holds (the fd,
 * the temp file, the journal entry). */
static void wr_fail_undo(struct wr *w, const struct shim_err *err)
{
	w->undo.run = wr_undo_run;
	op_at_end(w->op, &w->undo);
	op_fail(w->op, err);
}

/* After a job that wrote bytes of a write that goes on: once the client has sent a
 * whole ring's worth (all its first credit), the ring grows to WR_RING, if the budget
 * has room (tried once; on the loop, with no job in flight: the bytes that wait are
 * moved to the new ring's start). Returns the credit that adds. */
static size_t wr_grow(struct wr *w)
{
	struct stream *st = w->op->st;
	if (w->grown || w->fin || w->on_loop || w->cap >= WR_RING || st == NULL || w->total + w->len < w->cap)
		return 0;
	w->grown = true;
	size_t more = WR_RING - w->cap;
	struct shim_err e;
	if (stream_reserve(st, more, &e) < 0)
		return 0; /* short of budget: the small ring it stays */
	uint8_t *ring = budget_alloc(WR_RING);
	if (ring == NULL) {
		stream_unreserve(st, more);
		return 0;
	}
	size_t first = w->len < w->cap - w->head ? w->len : w->cap - w->head;
	memcpy(ring, w->ring + w->head, first);
	memcpy(ring + first, w->ring, w->len - first);
	budget_free(w->ring, w->cap);
	w->ring = ring;
	w->cap = WR_RING;
	w->head = 0;
	return more;
}

static void wr_done(struct op_job *job)
{
	struct wr *w = container_of(job, struct wr, job);
	w->busy = false;
	if (op_wire_ended(w->op))
		return; /* (its END went from the job) */
	if (job->rc < 0) {
		/* the job has already dropped the temp file and the journal entry (one
		 * that could not enter the request's identity left them to the undo) */
		wr_fail_undo(w, &job->err);
		return;
	}
	switch (w->step) {
	case WJ_OPEN:
		if (w->wait_reader) {
			/* a FIFO without a reader: again soon, less often as the wait goes on */
			w->wait_reader = false;
			w->retry_s = w->retry_s <= 0 ? 0.005 : w->retry_s * 2 > 0.1 ? 0.1 : w->retry_s * 2;
			ev_timer_set(&w->retry, w->retry_s, 0);
			ev_timer_start(srv->loop, &w->retry);
			return;
		}
		w->opened = true;
		if (w->on_loop)
			ev_io_set(&w->io, w->fd, EV_WRITE);
		if (w->open_wrote && w->open_commit) {
			w->total += w->job_len;
			wr_reply(w, w->total, false);
			return;
		}
		if (w->open_wrote) {
			w->head = (w->head + w->job_len) % w->cap;
			w->len -= w->job_len;
			w->total += w->job_len;
			stream_grant(w->op->st, (uint32_t)(w->job_len + wr_grow(w)));
		}
		break;
	case WJ_WRITE:
		w->head = (w->head + w->job_len) % w->cap;
		w->len -= w->job_len;
		w->total += w->job_len;
		/* credit back only now: a slow disk slows this stream and no other */
		stream_grant(w->op->st, (uint32_t)(w->job_len + wr_grow(w)));
		break;
	case WJ_WRITE_COMMIT:
		w->total += w->job_len;
		wr_reply(w, w->total, false);
		return;
	case WJ_COMMIT:
		wr_reply(w, w->total, false);
		return;
	}
	wr_pump(w);
}

static void wr_submit(struct wr *w, enum wr_step step)
{
	w->step = step;
	w->busy = true;
	op_submit(w->op, &w->job);
}

/* The open, with the bytes (and the FIN) that have come so far. */
static void wr_submit_open(struct wr *w)
{
	w->job_len = w->len;
	w->open_commit = w->fin;
	w->open_write = w->len > 0 || w->fin;
	wr_submit(w, WJ_OPEN);
}

static void wr_start_cb(struct ev_loop *loop, ev_prepare *p, int revents)
{
	(void)revents;
	struct wr *w = container_of(p, struct wr, start);
	ev_prepare_stop(loop, p);
	if (w->op->st != NULL && !w->busy)
		wr_submit_open(w);
}

/* ---- FIFOs, sockets and character devices, on the loop ---- */

/* Write what the ring holds, non-blocking; on EAGAIN wait for the fd to be writable.
 * The commit (fsync, which such a file mostly refuses) goes to a worker at the end. */
static void wr_loop_write(struct wr *w)
{
	while (w->len > 0) {
		struct iovec iov[2];
		int n = 1;
		iov[0].iov_base = w->ring + w->head;
		iov[0].iov_len = w->len < w->cap - w->head ? w->len : w->cap - w->head;
		if (iov[0].iov_len < w->len) {
			iov[1].iov_base = w->ring;
			iov[1].iov_len = w->len - iov[0].iov_len;
			n = 2;
		}
		ssize_t k = writev(w->fd, iov, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				ev_io_start(srv->loop, &w->io);
				return;
			}
			struct shim_err e;
			err_set(&e, errno, w->p.abs, "write");
			ev_io_stop(srv->loop, &w->io);
			wr_fail_undo(w, &e);
			return;
		}
		w->head = (w->head + (size_t)k) % w->cap;
		w->len -= (size_t)k;
		w->total += (uint64_t)k;
		stream_grant(w->op->st, (uint32_t)k);
	}
	ev_io_stop(srv->loop, &w->io);
	if (w->fin)
		wr_submit(w, WJ_COMMIT);
}

static void wr_retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	struct wr *w = container_of(t, struct wr, retry);
	if (w->op->st != NULL && !w->busy)
		wr_submit_open(w);
}

static void wr_io_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	struct wr *w = container_of(io, struct wr, io);
	struct op *op = w->op;
	if (op->st == NULL || w->busy)
		return;
	/* (a failed write ends the stream: the op stays until it has returned) */
	op_hold(op);
	wr_loop_write(w);
	op_put(op);
}

static int write_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct wr *w = op->data;
	if (len > w->cap - w->len)
		return err_set(err, ENOBUFS, w->p.abs, "write buffer full"); /* conn checks credit first */
	size_t tail = (w->head + w->len) % w->cap;
	size_t first = len < w->cap - tail ? len : w->cap - tail;
	memcpy(w->ring + tail, buf, first);
	memcpy(w->ring, buf + first, len - first);
	w->len += len;
	if (fin)
		w->fin = true;
	wr_pump(w);
	return 0;
}

/* On a worker, once the step in flight has returned: the temp file removed, its
 * journal entry cleared, the fds closed (unlink and close may block on a hung mount),
 * as the identity that made the temp file — or the shim's should that not take: they go
 * all the same. The old file is left as it was. */
static void wr_undo_run(struct op_job *j)
{
	wr_release(container_of(j, struct wr, undo));
}

/* Cut off midway (a write that ended with END or ERROR has dropped its files already):
 * a job in flight is interrupted by op.c (an open of a FIFO returns now), then undone. */
static void write_cancel(struct op *op)
{
	struct wr *w = op->data;
	ev_io_stop(srv->loop, &w->io);
	ev_timer_stop(srv->loop, &w->retry);
	ev_prepare_stop(srv->loop, &w->start);
	w->undo.run = wr_undo_run;
	op_at_end(op, &w->undo);
}

static void write_release(struct op *op)
{
	struct wr *w = op->data;
	if (w == NULL)
		return;
	ev_io_stop(srv->loop, &w->io);
	ev_timer_stop(srv->loop, &w->retry);
	ev_prepare_stop(srv->loop, &w->start);
	wr_free(w);
}

static int write_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__WriteRequest *q = op->req->write;
	struct fs_path p;
	if (fs_path_get(&q->path, &p, err) < 0)
		return -1;
	if (q->has_mode && (q->mode & ~07777u) != 0)
		return err_set(err, EINVAL, p.abs, "mode %#o has bits beyond 07777", q->mode);
	/* The ring is as large as the credit the client has from the start: counted in
	 * the daemon's budget with the state, or the write is refused with EAGAIN (a
	 * client's 255 writes into a FIFO nobody reads would hold 64 MiB otherwise). */
	size_t cap = op->st->recv_left > 0 ? op->st->recv_left : 1;
	if (stream_reserve(op->st, sizeof(struct wr) + cap, err) < 0)
		return -1;
	struct wr *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		budget_give(sizeof(struct wr) + cap);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	w->op = op;
	w->cap = cap;
	w->fd = w->dfd = -1;
	ev_init(&w->io, wr_io_cb);
	ev_init(&w->retry, wr_retry_cb);
	ev_prepare_init(&w->start, wr_start_cb);
	w->job.run = wr_run;
	w->job.done = wr_done;
	op->data = w; /* (from here on write_release frees it) */
	w->ring = budget_alloc(w->cap);
	if (w->ring == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	w->p = p;
	w->append = q->has_append && q->append;
	w->exclusive = q->has_exclusive && q->exclusive;
	w->parents = q->has_parents && q->parents;
	w->in_place = w->append || (q->has_no_atomic && q->no_atomic);
	w->has_mode = q->has_mode;
	w->mode = (mode_t)q->mode;
	w->allow_special = q->has_allow_special && q->allow_special;
	/* the data frames read with the request come first (wr_start_cb) */
	ev_prepare_start(srv->loop, &w->start);
	op_wire_open(op);
	return 0;
}

const struct op_kind op_fs_write_kind = {
	SHIM__V1__REQUEST__KIND_WRITE,
	"write",
	OP_FS | OP_TAKES_DATA,
	.start = write_start,
	.data = write_data,
	.cancel = write_cancel,
	.release = write_release,
};
