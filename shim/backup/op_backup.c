/* op_backup.c: directory backups and restores on the loop side: requests, the handoff with the worker, progress, results. */
#include "backup.h"
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "log.h"
#include "op.h"
#include "ops.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Each backup or restore is ONE job for its whole life, on a thread of its own
 * (op_submit_own: not a pool worker, so a job stalled on credit holds none; at most
 * --max-jobs run, later ones wait queued on the loop): libarchive is synchronous, so
 * the archive writer (or the archive reader and the extractor) runs on that thread
 * from start to end, with one helper thread of the job's own: a
 * backup's walker (backup_walk.c), which makes the walk's syscalls ahead of it, or a
 * restore's file writer (restore_files.c), which writes the files it created. The
 * job and the loop meet in a small handoff under a mutex:
 *
 *  - backup: the worker fills BK_NBUF buffers of BK_BUF bytes in turn; a full one
 *    is marked ready and the loop is woken (ev_async); the worker waits (condvar)
 *    while the loop still holds the next buffer. The loop sends a ready buffer as
 *    DATA within the client's credit and frees it. So at most BK_NBUF * BK_BUF bytes
 *    of archive wait in the daemon, and a slow reader slows the walk.
 *  - restore: DATA from the client is copied into a ring as large as the credit we
 *    gave; libarchive's read callback takes one contiguous piece at a time and
 *    releases it at its next call, and only then does the loop give that credit back
 *    (in batches). File data the file writer writes straight from the ring is pinned
 *    there until it is written (op_backup_restore_pin): the release stops at the first such byte.
 *
 * The sha256 of the stream is computed by whichever thread has time, in stream
 * order, one at a time: for a backup (bk_hash_step) the loop once it has sent what
 * is ready, the worker instead of waiting for a free buffer, the walker instead of
 * waiting for room in its queue; for a restore (rs_hash_step) the worker instead of
 * waiting for data, the loop only when far behind. With to_path / from_path the
 * worker hashes as it writes or reads the file. Two CPUs are then both busy: the
 * walk is slow in a region of small files, sending and the client are behind in one
 * of big files, and the hashing goes to whoever is idle.
 *
 * Cancel, disconnect and shutdown set a flag under the mutex and wake the worker
 * (and op.c interrupts its syscall); it notices in its next callback or between
 * entries, cleans up (temp files, temp directories) and returns; the op is freed
 * then (release). Progress events go out from a timer, at most PROGRESS_INTERVAL
 * apart, when the counts have moved.
 */

#define PROGRESS_INTERVAL 0.25
/* backups and restores under way (loop thread only): the first gets big buffers */
static unsigned jobs_running;
/* restore: the stream's ring, and the most credit the client has at once */
#define RS_RING (16u << 20)
#define RS_RING_MIN (4u << 20) /* when other jobs run */
#define RS_GRANT_BATCH (256u << 10)
#define RS_HASH_STEP (256u << 10) /* hashed at a time, between looks for other work */

static pthread_once_t locale_once = PTHREAD_ONCE_INIT;
static locale_t utf8_locale;

static void locale_init(void)
{
	static const char *const names[] = {"C.UTF-8", "C.utf8", "en_US.UTF-8"};
	for (size_t i = 0; i < ARRAY_SIZE(names) && utf8_locale == (locale_t)0; i++)
		utf8_locale = newlocale(LC_CTYPE_MASK, names[i], (locale_t)0);
}

locale_t op_backup_utf8_locale(void)
{
	pthread_once(&locale_once, locale_init);
	return utf8_locale;
}

bool op_backup_job_cancelled(struct backup_job *j)
{
	return __atomic_load_n(&j->cancelled, __ATOMIC_ACQUIRE);
}

void op_backup_sha_hex(struct sha256_ctx *ctx, char out[65])
{
	uint8_t d[SHA256_DIGEST_SIZE];
	sha256_digest(ctx, sizeof(d), d);
	static const char hex[] = "0123456789abcdef";
	for (size_t i = 0; i < sizeof(d); i++) {
		out[2 * i] = hex[d[i] >> 4];
		out[2 * i + 1] = hex[d[i] & 15];
	}
	out[64] = '\0';
}

static void progress_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct backup_job *j = container_of(w, struct backup_job, timer);
	struct stream *st = j->job.op->st;
	uint64_t items = __atomic_load_n(&j->items, __ATOMIC_RELAXED);
	uint64_t bytes = __atomic_load_n(&j->bytes, __ATOMIC_RELAXED);
	if (st == NULL || (items == j->sent_items && bytes == j->sent_bytes))
		return;
	j->sent_items = items;
	j->sent_bytes = bytes;
	Shim__V1__Progress p = SHIM__V1__PROGRESS__INIT;
	p.has_bytes = p.has_items = 1;
	p.bytes = bytes;
	p.items = items;
	Shim__V1__Event ev = SHIM__V1__EVENT__INIT;
	ev.kind_case = SHIM__V1__EVENT__KIND_PROGRESS;
	ev.progress = &p;
	uint8_t buf[64];
	size_t n = shim__v1__event__pack(&ev, buf); /* two varints: well below 64 bytes */
	conn_send(st->conn, st->id, FRAME_EVENT, 0, buf, n);
}

/* Jobs on their threads, and the queue of those waiting for one of --max-jobs. */
static unsigned jobs_threads;
static struct backup_job *queue_head, **queue_tail = &queue_head;

static unsigned max_jobs(void)
{
	return srv != NULL && srv->cfg.max_jobs > 0 ? srv->cfg.max_jobs : BACKUP_JOB_DEFAULT_MAX;
}

/* Start j on a thread of its own: 0, or -1 with err set (EAGAIN). */
static int bjob_launch(struct backup_job *j, struct shim_err *err)
{
	if (op_submit_own(j->job.op, &j->job) < 0)
		return err_set(err, EAGAIN, NULL, "cannot start a thread for the job: %s", strerror(errno));
	j->running = true;
	jobs_threads++;
	return 0;
}

/* A job's thread is done (or it never got one): start the next ones waiting. */
static void bjob_release(struct backup_job *j)
{
	if (j->running) {
		j->running = false;
		jobs_threads--;
	}
	while (queue_head != NULL && jobs_threads < max_jobs()) {
		struct backup_job *n = queue_head;
		queue_head = n->qnext;
		if (queue_head == NULL)
			queue_tail = &queue_head;
		n->queued = false;
		if (bjob_launch(n, &n->job.err) < 0) {
			/* its done() fails the stream: the op goes at op_put() */
			struct op *op = n->job.op;
			op_hold(op);
			n->job.rc = -1;
			n->job.done(&n->job);
			op_put(op);
		}
	}
}

static int bjob_start(struct op *op, struct backup_job *j, void (*async_cb)(struct ev_loop *, ev_async *, int),
		      void (*run)(struct op_job *), void (*done)(struct op_job *), struct shim_err *err)
{
	j->job.op = op; /* (op_submit_own sets it too) for the queue and the watchers */
	j->loop = op->st->conn->srv->loop;
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	ev_async_init(&j->async, async_cb);
	ev_async_start(j->loop, &j->async);
	ev_timer_init(&j->timer, progress_cb, PROGRESS_INTERVAL, PROGRESS_INTERVAL);
	ev_timer_start(j->loop, &j->timer);
	j->job.run = run;
	j->job.done = done;
	if (jobs_threads < max_jobs() && queue_head == NULL)
		return bjob_launch(j, err);
	/* every slot taken: wait on the loop, holding no thread */
	j->queued = true;
	j->qnext = NULL;
	*queue_tail = j;
	queue_tail = &j->qnext;
	return 0;
}

/* The stream is going away: tell the job's threads, which clean up and return (op.c
 * interrupts the job too: a read stuck on a hung filesystem gets EINTR). */
static void bjob_cancel(struct backup_job *j)
{
	ev_timer_stop(j->loop, &j->timer);
	pthread_mutex_lock(&j->mu);
	__atomic_store_n(&j->cancelled, true, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (j->queued) {
		/* never started: out of the queue, and nothing to wait for */
		struct backup_job **pp = &queue_head;
		while (*pp != j)
			pp = &(*pp)->qnext;
		*pp = j->qnext;
		if (queue_tail == &j->qnext)
			queue_tail = pp;
		j->queued = false;
	}
}

/* The op is going: its job's thread has returned (or it never had one). */
static void bjob_end(struct backup_job *j)
{
	if (j->loop == NULL)
		return; /* the request failed before bjob_start */
	ev_async_stop(j->loop, &j->async);
	ev_timer_stop(j->loop, &j->timer);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	bjob_release(j);
}

/* ================================ backup ================================ */

static void bk_free(struct backup *b)
{
	if (b->counted)
		jobs_running--;
	for (unsigned i = 0; i < b->nbuf; i++)
		budget_free(b->buf[i].data, BK_BUF);
	budget_give(b->held);
	for (size_t i = 0; i < b->n_excludes; i++)
		free(b->excludes[i]);
	free(b->excludes);
	op_backup_list_free(&b->skipped);
	op_backup_list_free(&b->changed);
	free(b);
}

void op_backup_list_free(struct backup_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof(*l));
}

/* With mu held: a ready buffer is free again once it is both sent and hashed. */
static void bk_buf_release(struct backup *b, struct backup_buf *x)
{
	x->state = BKB_FREE;
	x->len = x->sent = x->hashed = 0;
	x->sent_all = false;
	pthread_cond_signal(&b->j.cv);
}

/* Hash this much at a time: the loop looks for output to send in between. */
#define BK_HASH_STEP (256u << 10)

/* With mu held (dropped while hashing): put the next BK_HASH_STEP bytes of the
 * stream into its sha256, if they are ready and no other thread is hashing. Either
 * thread calls it: so the sha256 (a third of the CPU a backup costs beyond reading
 * the files) is done by whichever is free. True when it hashed something. */
static bool bk_hash_step(struct backup *b, bool sent_only)
{
	struct backup_buf *x = &b->buf[b->hash_head];
	if (b->hashing || x->state != BKB_READY || x->hashed == x->len || (sent_only && !x->sent_all))
		return false;
	size_t n = x->len - x->hashed < BK_HASH_STEP ? x->len - x->hashed : BK_HASH_STEP;
	const uint8_t *p = x->data + x->hashed;
	b->hashing = true;
	pthread_mutex_unlock(&b->j.mu);
	sha256_update(&b->sha, n, p); /* the buffer stays ready: nobody writes to it */
	pthread_mutex_lock(&b->j.mu);
	b->hashing = false;
	x->hashed += n;
	if (x->hashed == x->len) {
		b->hash_head = (b->hash_head + 1) % b->nbuf;
		if (x->sent_all)
			bk_buf_release(b, x);
	}
	pthread_cond_signal(&b->j.cv); /* the worker may be waiting to hash the next */
	return true;
}

bool op_backup_hash_idle(void *arg)
{
	struct backup *b = arg;
	pthread_mutex_lock(&b->j.mu);
	bool did = bk_hash_step(b, true);
	pthread_mutex_unlock(&b->j.mu);
	return did;
}

/* Worker: the buffer being filled is complete; hand it over and wait for the next
 * (hashing what is ready meanwhile). */
static int bk_hand_over(struct backup *b, bool wait_next)
{
	struct backup_job *j = &b->j;
	pthread_mutex_lock(&j->mu);
	b->buf[b->fill].state = BKB_READY;
	ev_async_send(j->loop, &j->async);
	if (!wait_next) {
		pthread_mutex_unlock(&j->mu);
		return 0;
	}
	unsigned next = (b->fill + 1) % b->nbuf;
	while (b->buf[next].state != BKB_FREE && !j->cancelled) {
		if (!bk_hash_step(b, true)) /* the loop is behind with hashing, not sending */
			pthread_cond_wait(&j->cv, &j->mu);
	}
	bool cancelled = j->cancelled;
	if (!cancelled) {
		b->buf[next].state = BKB_FILLING;
		b->buf[next].len = 0;
		b->fill = next;
	}
	pthread_mutex_unlock(&j->mu);
	return cancelled ? -1 : 0;
}

int op_backup_output(struct backup *b, const void *data, size_t len)
{
	const uint8_t *p = data;
	while (len > 0) {
		struct backup_buf *x = &b->buf[b->fill];
		size_t n = BK_BUF - x->len;
		if (n > len)
			n = len;
		if (p != x->data + x->len) /* else the walker read the file there (out_area) */
			memcpy(x->data + x->len, p, n);
		x->len += n;
		p += n;
		len -= n;
		if (x->len == BK_BUF && bk_hand_over(b, true) < 0)
			return -1;
	}
	return 0;
}

int op_backup_output_flush(struct backup *b)
{
	if (b->buf[b->fill].len == 0)
		return 0;
	return bk_hand_over(b, false);
}

static void bk_pump(struct op *op);

/* On the job's thread, as the request's identity (OP_FS) */
static void bk_run(struct op_job *job)
{
	struct backup *b = job->op->data;
	job->rc = backup_write_run(b);
	if (job->rc < 0)
		job->err = b->j.err;
}

/* Pack the record into a Result that fits in one frame of the connection: the lists
 * of paths are cut short if need be (their totals say how many there were). */
static void bk_reply(struct op *op)
{
	struct backup *b = op->data;
	Shim__V1__BackupRecord r = SHIM__V1__BACKUP_RECORD__INIT;
	r.id = b->id;
	r.dir.data = (uint8_t *)b->dir.abs;
	r.dir.len = b->dir.len;
	r.bytes = b->archive_bytes;
	r.sha256 = b->sha_hex;
	r.entries = b->entries;
	r.source_bytes = b->source_bytes;
	r.compression = (Shim__V1__Compression)b->compression;
	r.created_at = b->created_at;
	if (b->has_to) {
		r.has_to_path = 1;
		r.to_path.data = (uint8_t *)b->to.abs;
		r.to_path.len = b->to.len;
	}
	r.has_skipped_count = r.has_changed_count = 1;
	r.skipped_count = b->skipped.total;
	r.changed_count = b->changed.total;
	size_t nsk = b->skipped.n, nch = b->changed.n;
	ProtobufCBinaryData *sk = calloc(nsk + nch + 1, sizeof(*sk));
	if (sk == NULL)
		nsk = nch = 0;
	ProtobufCBinaryData *ch = sk + nsk;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_BACKUP;
	res.backup = &r;
	size_t budget = op->st->conn->max_frame;
	size_t used = shim__v1__result__get_packed_size(&res) + 32;
	for (size_t i = 0; i < nsk; i++) {
		size_t len = strlen(b->skipped.v[i]);
		if (used + len + 8 > budget)
			break;
		used += len + 8;
		sk[r.n_skipped++] = (ProtobufCBinaryData){len, (uint8_t *)b->skipped.v[i]};
	}
	for (size_t i = 0; i < nch; i++) {
		size_t len = strlen(b->changed.v[i]);
		if (used + len + 8 > budget)
			break;
		used += len + 8;
		ch[r.n_changed++] = (ProtobufCBinaryData){len, (uint8_t *)b->changed.v[i]};
	}
	r.skipped = sk;
	r.changed = ch;
	op_end(op, &res);
	free(sk);
}

/* Loop: the job is over and every byte it produced has been sent. */
static void bk_finish(struct op *op)
{
	struct backup *b = op->data;
	if (b->j.job.rc < 0) {
		op_fail(op, &b->j.job.err);
		return;
	}
	if (!b->has_to) {
		op_backup_sha_hex(&b->sha, b->sha_hex);
		stream_send_data(op->st, NULL, 0, true);
	}
	bk_reply(op);
}

static void bk_done(struct op_job *job)
{
	struct backup *b = job->op->data;
	b->j.finished = true;
	bjob_release(&b->j);
	if (job->rc < 0) {
		/* what is still queued would only be a partial archive */
		bk_finish(job->op);
		return;
	}
	bk_pump(job->op);
}

/* Loop: send the ready buffers in order, within credit. False when the connection
 * cannot take more now (writable() calls again). */
static bool bk_send_ready(struct stream *st, struct backup *b)
{
	struct backup_job *j = &b->j;
	for (;;) {
		struct backup_buf *x = &b->buf[b->head];
		pthread_mutex_lock(&j->mu);
		bool ready = x->state == BKB_READY && !x->sent_all; /* (sent, waiting to be hashed) */
		pthread_mutex_unlock(&j->mu);
		if (!ready)
			return true;
		/* a ready buffer is the loop's until it is marked free again: it is
		 * written to the socket from where it is, and copied into the output
		 * queue only behind other output there (streams take turns) */
		while (x->sent < x->len) {
			bool busy;
			size_t n = stream_send_direct(st, x->data + x->sent, x->len - x->sent, &busy);
			if (n == 0) {
				if (busy)
					return false;
				n = stream_can_send(st);
				if (n == 0) {
					stream_wait_writable(st);
					return false;
				}
				if (n > x->len - x->sent)
					n = x->len - x->sent;
				stream_send_data(st, x->data + x->sent, n, false);
			}
			x->sent += n;
		}
		pthread_mutex_lock(&j->mu);
		x->sent_all = true;
		if (x->hashed == x->len)
			bk_buf_release(b, x);
		pthread_mutex_unlock(&j->mu);
		b->head = (b->head + 1) % b->nbuf;
	}
}

/* Loop: send what is ready; with nothing (more) to send, hash what is ready, a step
 * at a time with a look for more output in between. */
static void bk_pump(struct op *op)
{
	struct backup *b = op->data;
	struct backup_job *j = &b->j;
	for (;;) {
		if (!bk_send_ready(op->st, b))
			return;
		pthread_mutex_lock(&j->mu);
		bool hashed = bk_hash_step(b, false);
		pthread_mutex_unlock(&j->mu);
		if (!hashed)
			break;
	}
	/* once run() has returned nobody else hashes: all of it is sent and hashed now */
	if (j->finished)
		bk_finish(op);
}

static void bk_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	(void)loop;
	(void)revents;
	struct backup *b = container_of(w, struct backup, j.async);
	struct op *op = b->j.job.op;
	if (op->st == NULL)
		return;
	op_hold(op); /* (not a hook of it) kept until bk_pump has returned */
	bk_pump(op);
	op_put(op);
}

static void backup_cancel(struct op *op)
{
	struct backup *b = op->data;
	bjob_cancel(&b->j);
}

static void backup_release(struct op *op)
{
	struct backup *b = op->data;
	if (b == NULL)
		return;
	bjob_end(&b->j);
	bk_free(b);
}

static int backup_start(struct op *op, struct shim_err *err)
{
	struct stream *st = op->st;
	const Shim__V1__BackupRequest *q = op->req->backup;
	struct backup *b = calloc(1, sizeof(*b));
	if (b == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op->data = b; /* from here on freed by backup_release */
	if (fs_path_get(&q->dir, &b->dir, err) < 0)
		return -1;
	b->dir_len = b->dir.len;
	while (b->dir_len > 0 && b->dir.abs[b->dir_len - 1] == '/')
		b->dir_len--;
	b->compression = q->has_compression ? (int)q->compression : SHIM__V1__COMPRESSION__COMPRESSION_NONE;
	switch (b->compression) {
	case SHIM__V1__COMPRESSION__COMPRESSION_NONE:
		if (q->has_level)
			return err_set(err, EINVAL, b->dir.abs, "a compression level without compression");
		break;
	case SHIM__V1__COMPRESSION__COMPRESSION_GZIP:
		if (q->has_level && (q->level < 0 || q->level > 9))
			return err_set(err, EINVAL, b->dir.abs, "gzip level %d out of range (0..9)", q->level);
		break;
	case SHIM__V1__COMPRESSION__COMPRESSION_ZSTD:
		if (q->has_level && (q->level < -7 || q->level > 22))
			return err_set(err, EINVAL, b->dir.abs, "zstd level %d out of range (-7..22)", q->level);
		break;
	default:
		return err_set(err, EINVAL, b->dir.abs, "unknown compression %d", b->compression);
	}
	b->has_level = q->has_level && q->level != 0;
	b->level = q->level;
	b->skip_unreadable = q->has_skip_unreadable && q->skip_unreadable;
	b->one_file_system = q->has_one_file_system && q->one_file_system;
	if (q->has_to_path) {
		if (fs_path_get(&q->to_path, &b->to, err) < 0)
			return -1;
		b->has_to = true;
	}
	if (q->n_excludes > 0) {
		b->excludes = calloc(q->n_excludes, sizeof(*b->excludes));
		if (b->excludes == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
		for (size_t i = 0; i < q->n_excludes; i++) {
			const ProtobufCBinaryData *p = &q->excludes[i];
			if (p->len == 0 || p->len >= PATH_MAX || memchr(p->data, '\0', p->len) != NULL)
				return err_setn(err, EINVAL, p->data, p->len < 1000 ? p->len : 1000,
						"exclude pattern empty, too long or holding a NUL byte");
			b->excludes[i] = strndup((const char *)p->data, p->len);
			if (b->excludes[i] == NULL)
				return err_set(err, ENOMEM, NULL, "out of memory");
			b->n_excludes = i + 1;
		}
	}
	/* the handoff buffers (with to_path, the first one buffers the file writes) */
	/* the full set of buffers for the one job running; a few each when several
	 * share the CPUs anyway (memory stays a few MiB per job) */
	unsigned nbuf = b->has_to ? 1u : jobs_running > 0 ? BK_NBUF_MIN : BK_NBUF;
	/* They come out of the daemon's memory budget: fewer when it is short (the archive
	 * then waits for the client in smaller steps), and with not even one the request
	 * is refused with EAGAIN. */
	for (; nbuf > 0; nbuf--) {
		struct shim_err e;
		if (stream_reserve(st, nbuf * BK_BUF, nbuf == 1 ? err : &e) == 0)
			break;
	}
	if (nbuf == 0)
		return -1;
	b->held = nbuf * BK_BUF;
	b->nbuf = nbuf;
	for (unsigned i = 0; i < b->nbuf; i++) {
		b->buf[i].data = budget_alloc(BK_BUF);
		if (b->buf[i].data == NULL)
			return err_set(err, ENOMEM, NULL, "out of memory");
	}
	b->buf[0].state = BKB_FILLING;
	sha256_init(&b->sha);
	b->counted = true;
	jobs_running++;
	return bjob_start(op, &b->j, bk_async_cb, bk_run, bk_done, err);
}

/* ================================ restore ================================ */

static void rs_free(struct restore_job *r)
{
	if (r->counted)
		jobs_running--;
	if (r->ring != NULL) {
		budget_free(r->ring, r->cap);
		budget_give(r->cap); /* restore_start's stream_reserve() */
	}
	free(r);
}

/* With mu held: give back the ring's bytes libarchive is done with, up to the
 * oldest one the file writer still has to write. */
static void rs_release(struct restore_job *r)
{
	size_t n = r->done;
	if (r->hash_off - r->head_off < n)
		n = (size_t)(r->hash_off - r->head_off); /* not hashed yet */
	uint64_t done_end = __atomic_load_n(&r->done_end, __ATOMIC_ACQUIRE);
	if (done_end < __atomic_load_n(&r->pin_end, __ATOMIC_ACQUIRE)) {
		/* a piece is pinned: nothing from the first one not yet written */
		uint64_t keep = done_end > r->head_off ? done_end - r->head_off : 0;
		if (keep < n)
			n = (size_t)keep;
	}
	if (n == 0)
		return;
	r->head = (r->head + n) % r->cap;
	r->head_off += n;
	r->len -= n;
	r->given -= n;
	r->done -= n;
	r->to_grant += n;
	/* credit goes back in batches (a wakeup of the loop each), or at once when the
	 * worker is about to wait for more */
	if (r->to_grant >= RS_GRANT_BATCH || r->worker_waits)
		ev_async_send(r->j.loop, &r->j.async);
}

/* With mu held (dropped while hashing): put the next bytes of the ring, at most max,
 * into the stream's sha256, if there are any and no other thread is hashing. Either
 * the loop (when it is far behind) or the worker (instead of waiting for data) does
 * it, in stream order: the sha256 is a third of what a restore costs the daemon
 * beyond extracting, and the loop has the rest of the stream to take in. */
static bool rs_hash_step(struct restore_job *r, size_t max)
{
	uint64_t end = r->head_off + r->len;
	if (r->hashing || r->hash_off == end)
		return false;
	size_t at = (r->head + (size_t)(r->hash_off - r->head_off)) % r->cap;
	size_t k = (size_t)(end - r->hash_off);
	if (k > r->cap - at)
		k = r->cap - at;
	if (k > max)
		k = max;
	r->hashing = true;
	pthread_mutex_unlock(&r->j.mu);
	sha256_update(&r->sha, k, r->ring + at); /* not released before it is hashed */
	pthread_mutex_lock(&r->j.mu);
	r->hashing = false;
	r->hash_off += k;
	if (r->worker_waits)
		pthread_cond_signal(&r->j.cv); /* it may be waiting to hash the rest */
	return true;
}

ssize_t op_backup_restore_input(struct restore_job *r, const void **buf)
{
	struct backup_job *j = &r->j;
	pthread_mutex_lock(&j->mu);
	/* libarchive is done with the last piece: its credit can go back */
	r->done = r->given;
	rs_release(r);
	if (r->len == r->given && !j->cancelled && (!r->fin || r->hash_off < r->head_off + r->len || r->hashing)) {
		__atomic_store_n(&r->worker_waits, true, __ATOMIC_RELEASE);
		for (;;) {
			rs_release(r); /* (what the file writer or the hashing freed meanwhile) */
			if (r->to_grant > 0)
				ev_async_send(j->loop, &j->async);
			if (r->len != r->given || j->cancelled)
				break;
			/* nothing to extract: hash instead of waiting */
			if (rs_hash_step(r, RS_HASH_STEP))
				continue;
			if (r->fin && !r->hashing && r->hash_off == r->head_off + r->len)
				break;
			pthread_cond_wait(&j->cv, &j->mu);
		}
		__atomic_store_n(&r->worker_waits, false, __ATOMIC_RELEASE);
	}
	ssize_t n;
	if (j->cancelled) {
		n = -1;
	} else if (r->len == r->given) {
		n = 0; /* FIN: the end of the stream, all of it hashed */
		if (r->sha_hex[0] == '\0')
			op_backup_sha_hex(&r->sha, r->sha_hex);
	} else {
		size_t at = (r->head + r->given) % r->cap;
		size_t k = r->len - r->given < r->cap - at ? r->len - r->given : r->cap - at;
		*buf = r->ring + at;
		r->piece = r->ring + at;
		r->piece_len = k;
		r->piece_off = r->head_off + r->given;
		r->given += k;
		n = (ssize_t)k;
	}
	pthread_mutex_unlock(&j->mu);
	return n;
}

uint64_t op_backup_restore_ring_offset(struct restore_job *r, const void *p)
{
	/* the last piece handed out: fields of this thread only, no lock */
	const uint8_t *b = p;
	if (r->piece == NULL || b < r->piece || b >= r->piece + r->piece_len)
		return UINT64_MAX;
	return r->piece_off + (uint64_t)(b - r->piece);
}

void op_backup_restore_pin(struct restore_job *r, uint64_t end)
{
	/* seen by the file writer's release only after the next op_backup_restore_input (mu), which
	 * is also what makes these bytes releasable at all */
	__atomic_store_n(&r->pin_end, end, __ATOMIC_RELEASE);
}

void op_backup_restore_unpin(struct restore_job *r, uint64_t end)
{
	__atomic_store_n(&r->done_end, end, __ATOMIC_RELEASE);
	/* released by the worker at its next read; by us only when it is waiting for
	 * data the client cannot send for want of credit */
	if (__atomic_load_n(&r->worker_waits, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&r->j.mu);
		rs_release(r);
		pthread_mutex_unlock(&r->j.mu);
	}
}

static int restore_data(struct op *op, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	struct restore_job *r = op->data;
	struct backup_job *j = &r->j;
	if (r->has_from) /* the archive is read from the file */
		return err_set(err, EINVAL, NULL, "this request takes no data");
	pthread_mutex_lock(&j->mu);
	/* the connection checks the credit, and the ring is as large as all credit */
	size_t room = r->cap - r->len, tail = (r->head + r->len) % r->cap;
	pthread_mutex_unlock(&j->mu);
	if (len > room)
		return err_set(err, ENOBUFS, r->dir.abs, "restore buffer full");
	/* outside the lock: the bytes after len are only ever written here, and the
	 * worker sees them once len says so */
	size_t first = len < r->cap - tail ? len : r->cap - tail;
	memcpy(r->ring + tail, buf, first);
	memcpy(r->ring, buf + first, len - first);
	pthread_mutex_lock(&j->mu);
	r->len += len;
	if (fin)
		r->fin = true;
	if (r->worker_waits)
		pthread_cond_signal(&j->cv);
	/* far behind with the hashing, a quarter of the ring (the worker is busy
	 * extracting): catch up */
	while (r->head_off + r->len - r->hash_off >= r->cap / 4 && rs_hash_step(r, RS_HASH_STEP))
		;
	pthread_mutex_unlock(&j->mu);
	return 0;
}

static void rs_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	(void)loop;
	(void)revents;
	struct restore_job *r = container_of(w, struct restore_job, j.async);
	pthread_mutex_lock(&r->j.mu);
	size_t g = r->to_grant;
	r->to_grant = 0;
	pthread_mutex_unlock(&r->j.mu);
	struct stream *st = r->j.job.op->st;
	if (st != NULL && g > 0)
		stream_grant(st, (uint32_t)g);
}

/* On the job's thread, as the request's identity (OP_FS) */
static void rs_run(struct op_job *job)
{
	struct restore_job *r = job->op->data;
	job->rc = restore_run(r);
	if (job->rc < 0)
		job->err = r->j.err;
}

static void rs_done(struct op_job *job)
{
	struct op *op = job->op;
	struct restore_job *r = op->data;
	r->j.finished = true;
	bjob_release(&r->j);
	if (job->rc < 0) {
		op_fail(op, &job->err);
		return;
	}
	Shim__V1__RestoreReply rr = SHIM__V1__RESTORE_REPLY__INIT;
	rr.bytes = r->stream_bytes;
	rr.entries = r->entries;
	rr.sha256 = r->sha_hex;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_RESTORE;
	res.restore = &rr;
	op_end(op, &res);
}

static void restore_cancel(struct op *op)
{
	struct restore_job *r = op->data;
	bjob_cancel(&r->j);
}

static void restore_release(struct op *op)
{
	struct restore_job *r = op->data;
	if (r == NULL)
		return;
	bjob_end(&r->j);
	rs_free(r);
}

static int restore_start(struct op *op, struct shim_err *err)
{
	struct stream *st = op->st;
	const Shim__V1__RestoreRequest *q = op->req->restore;
	struct restore_job *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op->data = r; /* from here on freed by restore_release */
	if (fs_path_get(&q->dir, &r->dir, err) < 0)
		return -1;
	if (q->has_mode && q->mode != SHIM__V1__RESTORE_MODE__RESTORE_REPLACE &&
	    q->mode != SHIM__V1__RESTORE_MODE__RESTORE_MERGE)
		return err_set(err, EINVAL, r->dir.abs, "unknown restore mode %d", (int)q->mode);
	r->merge = q->has_mode && q->mode == SHIM__V1__RESTORE_MODE__RESTORE_MERGE;
	r->allow_devices = q->has_allow_devices && q->allow_devices;
	r->allow_empty = q->has_allow_empty && q->allow_empty;
	if (q->sha256 != NULL && q->sha256[0] != '\0') {
		size_t n = strlen(q->sha256);
		bool ok = n == 64;
		for (size_t i = 0; ok && i < n; i++) {
			char c = q->sha256[i];
			ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
			r->want_sha[i] = (char)(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
		}
		if (!ok)
			return err_set(err, EINVAL, r->dir.abs, "sha256 must be 64 hex digits");
		r->want_sha[64] = '\0';
		r->has_sha = true;
	}
	if (q->has_from_path) {
		if (fs_path_get(&q->from_path, &r->from, err) < 0)
			return -1;
		r->has_from = true;
	} else {
		/* As large as the credit the client may have, so every byte it sends fits:
		 * the initial window, raised to RS_RING at once. A window of 256 KiB would
		 * make the client wait for credit every few hundred microseconds. */
		size_t ring = jobs_running > 0 ? RS_RING_MIN : RS_RING;
		/* Counted in the daemon's budget: smaller when it is short (down to the
		 * credit the client has already), and with not even that, refused (EAGAIN). */
		size_t cap = st->recv_left > ring ? st->recv_left : ring;
		for (;;) {
			struct shim_err e;
			if (stream_reserve(st, cap, cap <= st->recv_left ? err : &e) == 0)
				break;
			if (cap <= st->recv_left)
				return -1;
			cap = cap / 4 > st->recv_left ? cap / 4 : st->recv_left;
		}
		r->ring = budget_alloc(cap);
		if (r->ring == NULL) {
			budget_give(cap);
			return err_set(err, ENOMEM, NULL, "out of memory");
		}
		r->cap = cap;
		if (r->cap > st->recv_left)
			stream_grant(st, (uint32_t)(r->cap - st->recv_left));
	}
	sha256_init(&r->sha);
	r->counted = true;
	jobs_running++;
	return bjob_start(op, &r->j, rs_async_cb, rs_run, rs_done, err);
}

const struct op_kind op_backup_kind = {
	SHIM__V1__REQUEST__KIND_BACKUP,
	"backup",
	OP_FS,
	.start = backup_start,
	.writable = bk_pump,
	.cancel = backup_cancel,
	.release = backup_release,
};
const struct op_kind op_restore_kind = {
	SHIM__V1__REQUEST__KIND_RESTORE,
	"restore",
	OP_FS | OP_TAKES_DATA,
	.start = restore_start,
	.data = restore_data,
	.cancel = restore_cancel,
	.release = restore_release,
};
