/* backup_queue.c: the ring of records from one thread of a backup or restore job to the other. */
#include "backup_queue.h"
#include "backup.h"
#include "fs.h"
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/*
 * One ring of BQ_RING bytes: records are laid out one after the other, each 16-byte
 * aligned, a record header then its payload. One that does not fit before the end
 * of the ring starts again at 0, and a header-sized 0 left at the old tail tells the
 * writer to do the same (the bytes skipped count as used until then). A payload
 * bigger than a quarter of the ring (an entry with huge xattrs) is malloc'd instead.
 *
 * Each side waits on cv, and only for the other: the walker for room (or for the
 * count of open fds to drop), the writer for records. A waiting side is woken for
 * a batch (half the ring free; BQ_BATCH records or an eighth of the ring there),
 * not for each record: one wakeup per entry would cost a context switch each. The
 * waits are timed, so a side also finds what is there (or a cancel) on its own:
 * at worst POLL_NS later, e.g. while the other is stuck in a syscall on a hung
 * filesystem (backup_queue_join then interrupts it).
 */

#define ALIGN16(n) (((n) + 15) & ~(size_t)15)
#define HDR ALIGN16(sizeof(struct backup_queue_rec))
#define HEAP_OVER (BQ_RING / 4)
#define POLL_NS 20000000ull /* how often a waiting side looks for itself */
#define BQ_BATCH 64

int backup_queue_init(struct backup_queue *q, struct backup_job *j)
{
	memset(q, 0, sizeof(*q));
	q->j = j;
	/* a share of what the daemon may open: other jobs and connections need theirs */
	struct rlimit rl;
	rlim_t soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
	q->max_fds = soft / 16 < 16 ? 16 : soft / 16 > BQ_FDS_MAX ? BQ_FDS_MAX : (unsigned)(soft / 16);
	q->ring = malloc(BQ_RING);
	if (q->ring == NULL)
		return -1;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&q->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* short critical sections, taken by two busy threads: spin a little before
	 * sleeping (a futex wait and wake costs more than the section) */
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
	pthread_mutex_init(&q->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	return 0;
}

/* The record at head, past a wrap marker; with mu held and used > 0. */
static struct backup_queue_rec *at_head(struct backup_queue *q)
{
	struct backup_queue_rec *r = (struct backup_queue_rec *)(void *)(q->ring + q->head);
	if (r->size == 0) {
		q->used -= BQ_RING - q->head;
		q->head = 0;
		r = (struct backup_queue_rec *)(void *)q->ring;
	}
	return r;
}

void backup_queue_free(struct backup_queue *q)
{
	if (q->ring == NULL)
		return;
	while (q->used > 0) {
		struct backup_queue_rec *r = at_head(q);
		if ((r->flags & BQF_FD) && r->fd >= 0)
			close(r->fd);
		if (r->heap)
			free(r->payload);
		q->used -= r->size;
		q->head = (q->head + r->size) % BQ_RING;
	}
	free(q->ring);
	q->ring = NULL;
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
}

/* With mu held: wait on cv at most ns (*flag set meanwhile, if not NULL). */
static void timed_wait(struct backup_queue *q, bool *flag, uint64_t ns)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ns += (uint64_t)ts.tv_nsec;
	ts.tv_sec += (time_t)(ns / 1000000000ull);
	ts.tv_nsec = (long)(ns % 1000000000ull);
	if (flag != NULL)
		*flag = true;
	pthread_cond_timedwait(&q->cv, &q->mu, &ts);
	if (flag != NULL)
		*flag = false;
}

/* With mu held: wake whoever waits, now. */
static void wake_all(struct backup_queue *q)
{
	if (q->producer_waits || q->consumer_waits)
		pthread_cond_broadcast(&q->cv);
}

struct backup_queue_rec *backup_queue_reserve(struct backup_queue *q, size_t payload, bool with_fd)
{
	bool heap = payload > HEAP_OVER;
	size_t need = HDR + (heap ? 0 : ALIGN16(payload));
	uint8_t *hp = NULL;
	if (heap && (hp = malloc(payload ? payload : 1)) == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&q->mu);
	struct backup_queue_rec *r = NULL;
	for (;;) {
		if (q->stop || op_backup_job_cancelled(q->j)) {
			errno = ECANCELED;
			break;
		}
		size_t waste = q->tail + need > BQ_RING ? BQ_RING - q->tail : 0;
		if (q->used + waste + need <= BQ_RING && (!with_fd || q->fds < q->max_fds)) {
			size_t pos = waste ? 0 : q->tail;
			r = (struct backup_queue_rec *)(void *)(q->ring + pos);
			break;
		}
		if (q->idle_fn != NULL) {
			/* something else useful while the consumer catches up */
			pthread_mutex_unlock(&q->mu);
			bool did = q->idle_fn(q->idle_arg);
			pthread_mutex_lock(&q->mu);
			if (did)
				continue;
		}
		timed_wait(q, &q->producer_waits, POLL_NS);
	}
	pthread_mutex_unlock(&q->mu);
	if (r == NULL) {
		free(hp);
		return NULL;
	}
	memset(r, 0, sizeof(*r));
	r->size = (uint32_t)need;
	r->fd = -1;
	r->heap = heap;
	r->payload = heap ? hp : (uint8_t *)r + HDR;
	return r;
}

void backup_queue_commit(struct backup_queue *q, struct backup_queue_rec *r)
{
	size_t pos = (size_t)((uint8_t *)r - q->ring);
	pthread_mutex_lock(&q->mu);
	if (pos != q->tail) {
		/* it went to the start: mark the rest of the ring as skipped */
		((struct backup_queue_rec *)(void *)(q->ring + q->tail))->size = 0;
		q->used += BQ_RING - q->tail;
	}
	q->used += r->size;
	q->tail = (pos + r->size) % BQ_RING;
	if (r->flags & BQF_FD)
		q->fds++;
	q->nrec++;
	if (q->consumer_waits && (q->nrec >= BQ_BATCH || q->used >= BQ_RING / 8 || q->fds >= q->max_fds / 2))
		pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

void backup_queue_abandon(struct backup_queue *q, struct backup_queue_rec *r)
{
	(void)q;
	if (r->heap)
		free(r->payload);
}

void backup_queue_finish(struct backup_queue *q, int rc, const struct shim_err *err)
{
	pthread_mutex_lock(&q->mu);
	q->done = true;
	q->rc = rc;
	if (rc < 0 && err != NULL)
		q->err = *err;
	wake_all(q);
	pthread_mutex_unlock(&q->mu);
}

/* With mu held: r is done with. */
static void release_locked(struct backup_queue *q, struct backup_queue_rec *r)
{
	q->used -= r->size;
	q->head = (q->head + r->size) % BQ_RING;
	if (r->flags & BQF_FD)
		q->fds--;
	q->nrec--;
	if (q->producer_waits && q->used <= BQ_RING / 2 && q->fds <= q->max_fds / 2)
		pthread_cond_broadcast(&q->cv);
}

struct backup_queue_rec *backup_queue_next(struct backup_queue *q, struct backup_queue_rec *done)
{
	if (done != NULL && done->heap)
		free(done->payload);
	pthread_mutex_lock(&q->mu);
	if (done != NULL)
		release_locked(q, done);
	struct backup_queue_rec *r = NULL;
	while (q->used == 0 && !q->done && !op_backup_job_cancelled(q->j))
		timed_wait(q, &q->consumer_waits, POLL_NS);
	if (q->used > 0 && !op_backup_job_cancelled(q->j))
		r = at_head(q);
	pthread_mutex_unlock(&q->mu);
	return r;
}

void backup_queue_release(struct backup_queue *q, struct backup_queue_rec *r)
{
	if (r->heap)
		free(r->payload);
	pthread_mutex_lock(&q->mu);
	release_locked(q, r);
	pthread_mutex_unlock(&q->mu);
}

void backup_queue_stop(struct backup_queue *q)
{
	pthread_mutex_lock(&q->mu);
	__atomic_store_n(&q->stop, true, __ATOMIC_RELEASE);
	wake_all(q);
	pthread_mutex_unlock(&q->mu);
}

int backup_queue_spawn(struct backup_queue *q, void *(*fn)(void *), void *arg)
{
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 << 10);
	int rc = pthread_create(&q->helper, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	q->helper_started = rc == 0;
	return rc;
}

void backup_queue_helper_exit(struct backup_queue *q)
{
	pthread_mutex_lock(&q->mu);
	q->exited = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

void backup_queue_join(struct backup_queue *q)
{
	if (!q->helper_started)
		return;
	pthread_mutex_lock(&q->mu);
	while (!q->exited) {
		if (q->stop || op_backup_job_cancelled(q->j))
			pthread_kill(q->helper, FS_CANCEL_SIGNAL);
		timed_wait(q, NULL, 100000000ull);
	}
	pthread_mutex_unlock(&q->mu);
	pthread_join(q->helper, NULL);
	q->helper_started = false;
}
