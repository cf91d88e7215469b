/* op_snapshot.c: microVM snapshots. snapshot_prepare (sync, flush the mounts, freeze
 * filesystems, stop background processes) before the host snapshots the VM, and resumed
 * (the host's clock and entropy, a new generation, undo what prepare did) after a resume
 * or in a fork. What a prepare holds is the daemon's, not a connection's: a snapshot
 * resets every vsock connection, so resumed comes on a new one. It is released by
 * resumed, by the automatic thaw after thaw_after_ms, or at shutdown (and at exit). */
#include "conn.h"
#include "fs.h"
#include "log.h"
#include "mount.h"
#include "op.h"
#include "ops.h"
#include "proc.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SNAP_MAX_FREEZE 16
#define SNAP_MAX_STEPS (2 * SNAP_MAX_FREEZE + 8 + MOUNT_MAX)
/* resumed: how long a mount has to answer its check */
#define SNAP_MOUNT_CHECK_MS 5000
#define SNAP_THAW_DEFAULT_MS 30000u
#define SNAP_THAW_MIN_MS 100u
#define SNAP_THAW_MAX_MS 3600000u
#define SNAP_FLUSH_DEFAULT_MS 60000u
#define SNAP_FLUSH_MAX_MS 600000u
#define SNAP_ENTROPY_MIN 32
#define SNAP_ENTROPY_MAX 512
/* resumed: a host time this far ahead of the guest's clock is taken for a mistake */
#define SNAP_AHEAD_MAX_S (3653LL * 86400)
/* For tests only: the clock is "set" by appending "SEC NSEC\n" to this file, never
 * with clock_settime (PROTOCOL.md 12.6), so that no test changes the machine's clock. */
#define SNAP_ENV_TEST_CLOCK "SANDBOX_SHIM_TEST_CLOCK_FILE"

/* A frozen filesystem: the fd of its mount point, kept open so that the thaw needs no
 * path lookup (which could block on it). */
struct snap_fs {
	int fd;
	char *path; /* as the client gave it */
	size_t path_len;
};

/* One step for the reply. */
struct snap_step {
	const char *name;
	uint64_t us;
	int code;
	char msg[256];
	const char *path; /* borrowed from the request or a snap_fs */
	size_t path_len;
	uint32_t count;
	bool has_count;
};

enum snap_state { SNAP_IDLE, SNAP_PREPARING, SNAP_PREPARED };

/* What the daemon holds between a prepare and its release (loop thread only, but the
 * generation, read anywhere). */
static struct {
	enum snap_state state;
	struct op *preparing; /* SNAP_PREPARING: the prepare that runs */
	struct snap_fs fs[SNAP_MAX_FREEZE];
	unsigned nfs;
	struct proc **stopped; /* referenced (proc_ref) */
	unsigned nstopped;
	ev_timer thaw_timer;
	bool timer_ready;
	uint64_t generation;
} snap;

/* The test seam's file, read before main() (which takes the SANDBOX_SHIM_* variables
 * out of the environment: spawn_startup); NULL in production. */
static char *test_clock_file;

__attribute__((constructor)) static void snap_seam_init(void)
{
	const char *v = getenv(SNAP_ENV_TEST_CLOCK);
	if (v != NULL && v[0] != '\0')
		test_clock_file = strdup(v);
}

/* Every frozen fd, whoever holds it now: thawed at exit if nothing else did. */
static pthread_mutex_t frozen_mu = PTHREAD_MUTEX_INITIALIZER;
static int frozen[SNAP_MAX_FREEZE * 2];
static unsigned nfrozen;
static bool atexit_done;

uint64_t op_snapshot_generation(void)
{
	return __atomic_load_n(&snap.generation, __ATOMIC_RELAXED);
}

static uint64_t since_us(uint64_t t0)
{
	return (mono_ns() - t0) / 1000u;
}

static struct snap_step *step_add(struct snap_step *steps, unsigned *n, const char *name, uint64_t t0)
{
	if (*n >= SNAP_MAX_STEPS)
		return NULL;
	struct snap_step *s = &steps[(*n)++];
	memset(s, 0, sizeof(*s));
	s->name = name;
	s->us = since_us(t0);
	return s;
}

/* ---- the frozen set ---- */

static void frozen_at_exit(void)
{
	pthread_mutex_lock(&frozen_mu);
	for (unsigned i = 0; i < nfrozen; i++)
		ioctl(frozen[i], FITHAW, 0);
	nfrozen = 0;
	pthread_mutex_unlock(&frozen_mu);
}

static void frozen_add(int fd)
{
	pthread_mutex_lock(&frozen_mu);
	if (!atexit_done) {
		atexit(frozen_at_exit);
		atexit_done = true;
	}
	if (nfrozen < ARRAY_SIZE(frozen))
		frozen[nfrozen++] = fd;
	pthread_mutex_unlock(&frozen_mu);
}

static void frozen_del(int fd)
{
	pthread_mutex_lock(&frozen_mu);
	for (unsigned i = 0; i < nfrozen; i++) {
		if (frozen[i] == fd) {
			frozen[i] = frozen[--nfrozen];
			break;
		}
	}
	pthread_mutex_unlock(&frozen_mu);
}

/* On a worker: thaw and close. 0, or -1 with errno. */
static int fs_thaw(struct snap_fs *f)
{
	int rc = ioctl(f->fd, FITHAW, 0);
	int saved = errno;
	/* EINVAL: no longer frozen (someone thawed it): nothing is left frozen either way */
	if (rc == 0 || saved == EINVAL) {
		frozen_del(f->fd);
		close(f->fd);
		f->fd = -1;
	}
	errno = saved;
	return rc;
}

static void fs_free(struct snap_fs *f)
{
	free(f->path);
	f->path = NULL;
}

/* A thaw with nobody waiting for it (the automatic thaw, a prepare whose client went,
 * shutdown): on a worker, logged. */
struct thaw_batch {
	struct work work;
	struct snap_fs fs[SNAP_MAX_FREEZE];
	unsigned nfs;
};

static void batch_run(struct work *w)
{
	struct thaw_batch *b = container_of(w, struct thaw_batch, work);
	for (unsigned i = 0; i < b->nfs; i++) {
		if (fs_thaw(&b->fs[i]) < 0)
			log_warn("snapshot: cannot thaw %s: %s", b->fs[i].path, strerror(errno));
		else
			log_info("snapshot: thawed %s", b->fs[i].path);
	}
}

/* Thaw batches on a worker (loop thread): the daemon does not exit before they are
 * done (op_snapshot_thawing). */
static unsigned batches_running;

static void batch_done(struct work *w)
{
	struct thaw_batch *b = container_of(w, struct thaw_batch, work);
	batches_running--;
	for (unsigned i = 0; i < b->nfs; i++)
		fs_free(&b->fs[i]);
	free(b);
}

/* Take fs[0..n) over (the array is left empty) and thaw them on a worker. */
static void thaw_detached(struct snap_fs *fs, unsigned *n)
{
	if (*n == 0)
		return;
	struct thaw_batch *b = calloc(1, sizeof(*b));
	if (b == NULL) {
		/* no memory for the batch: thaw here rather than leave the sandbox frozen */
		for (unsigned i = 0; i < *n; i++) {
			fs_thaw(&fs[i]);
			fs_free(&fs[i]);
		}
		*n = 0;
		return;
	}
	memcpy(b->fs, fs, *n * sizeof(*fs));
	b->nfs = *n;
	*n = 0;
	b->work.run = batch_run;
	b->work.done = batch_done;
	batches_running++;
	worker_submit(&b->work);
}

unsigned op_snapshot_thawing(void)
{
	return batches_running;
}

/* SIGCONT the stopped groups (loop thread) and drop them; their number. */
static unsigned continue_stopped(struct proc **ps, unsigned n)
{
	unsigned done = 0;
	for (unsigned i = 0; i < n; i++) {
		if (ps[i]->live && proc_kill(ps[i], SIGCONT, false) == 0)
			done++;
		proc_unref(ps[i]);
	}
	free(ps);
	return done;
}

/* Give up what a prepare holds, without a resumed (the automatic thaw, shutdown). */
static void snap_release_all(const char *why)
{
	if (snap.timer_ready)
		ev_timer_stop(srv->loop, &snap.thaw_timer);
	if (snap.state != SNAP_PREPARED)
		return;
	log_warn("snapshot: %s: thawing %u filesystem(s), continuing %u process group(s)", why, snap.nfs,
		 snap.nstopped);
	thaw_detached(snap.fs, &snap.nfs);
	continue_stopped(snap.stopped, snap.nstopped);
	snap.stopped = NULL;
	snap.nstopped = 0;
	snap.state = SNAP_IDLE;
}

static void thaw_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	snap_release_all("no resumed within thaw_after_ms");
}

void op_snapshot_shutdown(void)
{
	snap_release_all("shutdown");
}

/* ---- snapshot_prepare ---- */

struct prep {
	struct snap_step steps[SNAP_MAX_STEPS];
	unsigned nsteps;
	struct snap_fs fs[SNAP_MAX_FREEZE]; /* frozen by the job */
	unsigned nfs;
	struct proc **stopped;
	unsigned nstopped;
	uint32_t thaw_ms, flush_ms;
	bool handed;               /* what it holds is the daemon's now (snap) */
	struct mount_snap *mounts; /* the table at the start, for the flush */
	unsigned nmounts;
};

static int prepare_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__SnapshotPrepareRequest *r = op->req->snapshot_prepare;
	if (snap.state == SNAP_PREPARING)
		return err_set(err, EBUSY, NULL, "a snapshot_prepare is running");
	if (snap.state == SNAP_PREPARED)
		return err_set(err, EBUSY, NULL, "a snapshot_prepare is held already (send resumed first)");
	if (r->n_freeze > SNAP_MAX_FREEZE)
		return err_set(err, EINVAL, NULL, "freeze: %zu filesystems (at most %d)", r->n_freeze, SNAP_MAX_FREEZE);
	uint32_t thaw = r->has_thaw_after_ms && r->thaw_after_ms ? r->thaw_after_ms : SNAP_THAW_DEFAULT_MS;
	if (thaw < SNAP_THAW_MIN_MS || thaw > SNAP_THAW_MAX_MS)
		return err_set(err, EINVAL, NULL, "thaw_after_ms %u out of range (%u..%u)", thaw, SNAP_THAW_MIN_MS,
			       SNAP_THAW_MAX_MS);
	uint32_t flush = r->has_flush_timeout_ms && r->flush_timeout_ms ? r->flush_timeout_ms : SNAP_FLUSH_DEFAULT_MS;
	if (flush > SNAP_FLUSH_MAX_MS)
		return err_set(err, EINVAL, NULL, "flush_timeout_ms %u out of range (at most %u)", flush,
			       SNAP_FLUSH_MAX_MS);
	struct prep *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	p->thaw_ms = thaw;
	p->flush_ms = flush;
	op->data = p;
	p->mounts = calloc(MOUNT_MAX, sizeof(*p->mounts));
	if (p->mounts == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	p->nmounts = op_mount_snapshot(p->mounts, MOUNT_MAX);
	snap.state = SNAP_PREPARING;
	snap.preparing = op;
	op_run_job(op);
	return 0;
}

/* On a worker: is the directory open at fd the root of a mount? */
static bool is_mount_root(int fd)
{
#ifdef STATX_ATTR_MOUNT_ROOT
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx) == 0 &&
	    (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
		return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
#endif
	/* an older kernel: another device than the parent's, or the root itself */
	struct stat st, up;
	if (fstat(fd, &st) < 0 || fstatat(fd, "..", &up, 0) < 0)
		return false;
	return st.st_dev != up.st_dev || st.st_ino == up.st_ino;
}

/* On a worker: open and check every path, then freeze them; on any failure nothing
 * is left frozen. */
static int freeze_all(struct op *op, struct prep *p, struct shim_err *err)
{
	const Shim__V1__SnapshotPrepareRequest *r = op->req->snapshot_prepare;
	struct snap_fs fs[SNAP_MAX_FREEZE];
	dev_t devs[SNAP_MAX_FREEZE];
	unsigned n = 0;
	struct stat root_st, state_st;
	bool have_root = stat("/", &root_st) == 0;
	const char *state_dir = srv->cfg.state_dir;
	bool have_state = state_dir[0] != '\0' && stat(state_dir, &state_st) == 0;
	/* the loop writes its log: on a frozen filesystem it would stop, automatic thaw included */
	struct stat log_st, err_st;
	bool have_log = fstat(log_fd_get(), &log_st) == 0, have_err = fstat(STDERR_FILENO, &err_st) == 0;
	int rc = 0;
	for (size_t i = 0; i < r->n_freeze && rc == 0; i++) {
		const ProtobufCBinaryData *in = &r->freeze[i];
		struct fs_path fp;
		if (fs_path_get(in, &fp, err) < 0) {
			rc = -1;
			break;
		}
		int fd = fs_open(&fp, O_RDONLY | O_DIRECTORY, 0, err);
		if (fd < 0) {
			rc = -1;
			break;
		}
		struct stat st;
		if (fstat(fd, &st) < 0) {
			rc = err_set(err, errno, fp.abs, "freeze: stat");
		} else if (!is_mount_root(fd)) {
			rc = err_set(err, EINVAL, fp.abs, "freeze: not a mount point");
		} else if (have_root && st.st_dev == root_st.st_dev) {
			rc = err_set(err, EBUSY, fp.abs,
				     "freeze: the root filesystem, which the shim needs, is never frozen");
		} else if (have_state && st.st_dev == state_st.st_dev) {
			rc = err_set(err, EBUSY, fp.abs,
				     "freeze: the filesystem of the shim's state directory %s is never frozen",
				     state_dir);
		} else if ((have_log && st.st_dev == log_st.st_dev) || (have_err && st.st_dev == err_st.st_dev)) {
			rc = err_set(err, EBUSY, fp.abs, "freeze: the filesystem of the shim's log is never frozen");
		}
		if (rc < 0) {
			close(fd);
			break;
		}
		bool dup = false;
		for (unsigned k = 0; k < n; k++)
			dup |= devs[k] == st.st_dev;
		if (dup) {
			/* the same filesystem twice (a bind mount): frozen once */
			close(fd);
			continue;
		}
		fs[n].fd = fd;
		fs[n].path = malloc(in->len + 1);
		if (fs[n].path == NULL) {
			close(fd);
			rc = err_set(err, ENOMEM, NULL, "out of memory");
			break;
		}
		memcpy(fs[n].path, in->data, in->len);
		fs[n].path[in->len] = '\0';
		fs[n].path_len = in->len;
		devs[n] = st.st_dev;
		n++;
	}
	unsigned frozen_n = 0;
	for (; rc == 0 && frozen_n < n; frozen_n++) {
		uint64_t t0 = mono_ns();
		if (ioctl(fs[frozen_n].fd, FIFREEZE, 0) < 0) {
			int e = errno;
			rc = err_setn(err, e, fs[frozen_n].path, fs[frozen_n].path_len, "freeze%s",
				      e == EOPNOTSUPP ? ": this filesystem cannot be frozen" : "");
			break;
		}
		frozen_add(fs[frozen_n].fd);
		struct snap_step *s = step_add(p->steps, &p->nsteps, "freeze", t0);
		if (s != NULL) {
			s->path = fs[frozen_n].path;
			s->path_len = fs[frozen_n].path_len;
		}
	}
	if (rc < 0) {
		for (unsigned k = 0; k < frozen_n; k++)
			if (fs_thaw(&fs[k]) < 0)
				log_error("snapshot: cannot thaw %s: %s", fs[k].path, strerror(errno));
		for (unsigned k = 0; k < n; k++) {
			if (fs[k].fd >= 0)
				close(fs[k].fd);
			fs_free(&fs[k]);
		}
		return -1;
	}
	memcpy(p->fs, fs, n * sizeof(fs[0]));
	p->nfs = n;
	return 0;
}

/* On a worker: wait until no live mount has uploads pending in rclone's cache (as an
 * unmount does, without unmounting), at most flush_ms. A timeout is reported in the
 * step, not a failure: the host decides whether to snapshot anyway. */
static void flush_mounts(struct op *op, struct prep *p)
{
	uint64_t t0 = mono_ns(), end = t0 + (uint64_t)p->flush_ms * 1000000u;
	unsigned live = 0, pending = 0;
	int code = 0;
	for (unsigned i = 0; i < p->nmounts; i++)
		live += p->mounts[i].live && p->mounts[i].pid > 0;
	while (live > 0) {
		pending = 0;
		for (unsigned i = 0; i < p->nmounts; i++)
			if (p->mounts[i].live && p->mounts[i].pid > 0)
				pending += mount_dirty_count(p->mounts[i].rundir, p->mounts[i].pid);
		if (pending == 0)
			break;
		if (worker_cancelled(&op->job.work)) {
			code = ECANCELED;
			break;
		}
		if (mono_ns() >= end) {
			code = ETIMEDOUT;
			break;
		}
		struct timespec ts = {0, 50 * 1000000};
		nanosleep(&ts, NULL);
	}
	struct snap_step *s = step_add(p->steps, &p->nsteps, "flush", t0);
	if (s == NULL)
		return;
	s->has_count = true;
	s->count = live;
	s->code = code;
	if (code == ETIMEDOUT)
		snprintf(s->msg, sizeof(s->msg), "%u upload(s) still pending after %u ms", pending, p->flush_ms);
	else if (live == 0)
		snprintf(s->msg, sizeof(s->msg), "no live mounts");
}

static int prepare_job(struct op *op, struct shim_err *err)
{
	struct prep *p = op->data;
	uint64_t t0 = mono_ns();
	sync();
	step_add(p->steps, &p->nsteps, "sync", t0);
	flush_mounts(op, p);
	return freeze_all(op, p, err);
}

/* Stop the process groups of the detached commands (loop thread). */
static void stop_background(struct prep *p)
{
	uint64_t t0 = mono_ns();
	unsigned cap = 0;
	for (struct proc *q = proc_first(); q != NULL; q = proc_next(q))
		cap++;
	p->stopped = calloc(cap ? cap : 1, sizeof(*p->stopped));
	struct snap_step *s = NULL;
	if (p->stopped != NULL) {
		for (struct proc *q = proc_first(); q != NULL; q = proc_next(q)) {
			if (!q->detached || q->state != PROC_RUNNING || !q->live)
				continue;
			if (proc_kill(q, SIGSTOP, false) < 0) {
				log_warn("snapshot: cannot stop %s: %s", q->id, strerror(errno));
				continue;
			}
			proc_ref(q);
			p->stopped[p->nstopped++] = q;
		}
	}
	s = step_add(p->steps, &p->nsteps, "stop", t0);
	if (s != NULL) {
		s->has_count = true;
		s->count = p->nstopped;
		if (p->stopped == NULL) {
			s->code = ENOMEM;
			snprintf(s->msg, sizeof(s->msg), "out of memory: nothing stopped");
		}
	}
}

static void steps_to_pb(struct snap_step *steps, unsigned n, Shim__V1__SnapshotStep *pb, Shim__V1__SnapshotStep **pp)
{
	for (unsigned i = 0; i < n; i++) {
		Shim__V1__SnapshotStep *m = &pb[i];
		shim__v1__snapshot_step__init(m);
		m->name = (char *)steps[i].name;
		m->duration_us = steps[i].us;
		if (steps[i].code != 0) {
			m->has_errno_num = 1;
			m->errno_num = steps[i].code;
		}
		if (steps[i].msg[0] != '\0')
			m->message = steps[i].msg;
		if (steps[i].path != NULL) {
			m->has_path = 1;
			m->path.data = (uint8_t *)steps[i].path;
			m->path.len = steps[i].path_len;
		}
		if (steps[i].has_count) {
			m->has_count = 1;
			m->count = steps[i].count;
		}
		pp[i] = m;
	}
}

static void prepare_done(struct op *op, int rc, const struct shim_err *err)
{
	struct prep *p = op->data;
	snap.preparing = NULL;
	if (rc < 0) {
		snap.state = SNAP_IDLE;
		op_fail(op, err);
		return;
	}
	if (op->req->snapshot_prepare->has_stop_background && op->req->snapshot_prepare->stop_background)
		stop_background(p);
	/* hand over what is held, and arm the automatic release */
	memcpy(snap.fs, p->fs, p->nfs * sizeof(p->fs[0]));
	snap.nfs = p->nfs;
	snap.stopped = p->stopped;
	snap.nstopped = p->nstopped;
	p->stopped = NULL;
	p->handed = true;
	snap.state = SNAP_PREPARED;
	if (!snap.timer_ready) {
		ev_init(&snap.thaw_timer, thaw_timer_cb);
		snap.timer_ready = true;
	}
	snap.thaw_timer.repeat = p->thaw_ms / 1000.0;
	ev_timer_again(srv->loop, &snap.thaw_timer);
	log_info("snapshot: prepared (%u filesystem(s) frozen, %u process group(s) stopped, thaw after %u ms)", p->nfs,
		 p->nstopped, p->thaw_ms);

	Shim__V1__SnapshotStep pb[SNAP_MAX_STEPS], *pp[SNAP_MAX_STEPS];
	steps_to_pb(p->steps, p->nsteps, pb, pp);
	ProtobufCBinaryData frozen_pb[SNAP_MAX_FREEZE];
	for (unsigned i = 0; i < p->nfs; i++) {
		frozen_pb[i].data = (uint8_t *)p->fs[i].path;
		frozen_pb[i].len = p->fs[i].path_len;
	}
	char **ids = calloc(snap.nstopped ? snap.nstopped : 1, sizeof(*ids));
	Shim__V1__SnapshotPrepareReply r = SHIM__V1__SNAPSHOT_PREPARE_REPLY__INIT;
	r.n_steps = p->nsteps;
	r.steps = pp;
	r.n_frozen = p->nfs;
	r.frozen = frozen_pb;
	if (ids != NULL) {
		for (unsigned i = 0; i < snap.nstopped; i++)
			ids[i] = snap.stopped[i]->id;
		r.n_stopped = snap.nstopped;
		r.stopped = ids;
	}
	r.thaw_after_ms = p->thaw_ms;
	r.generation = op_snapshot_generation();
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_SNAPSHOT_PREPARE;
	res.snapshot_prepare = &r;
	op_end(op, &res);
	free(ids);
}

static void prepare_release(struct op *op)
{
	struct prep *p = op->data;
	if (p == NULL)
		return;
	if (!p->handed) {
		/* the client went before the reply: nothing stays frozen or stopped */
		if (p->nfs > 0)
			log_warn("snapshot: the prepare's client went away: thawing");
		thaw_detached(p->fs, &p->nfs);
		if (p->stopped != NULL)
			continue_stopped(p->stopped, p->nstopped);
		if (snap.state == SNAP_PREPARING && snap.preparing == op) {
			snap.state = SNAP_IDLE;
			snap.preparing = NULL;
		}
	}
	/* handed: snap.fs holds copies of the fds and path pointers: nothing to free here */
	free(p->mounts);
	free(p);
}

const struct op_kind op_snapshot_prepare_kind = {
	SHIM__V1__REQUEST__KIND_SNAPSHOT_PREPARE,
	"snapshot_prepare",
	0,
	.start = prepare_start,
	.job = prepare_job,
	.job_done = prepare_done,
	.release = prepare_release,
};

/* ---- resumed ---- */

struct resumed {
	struct snap_step steps[SNAP_MAX_STEPS];
	unsigned nsteps;
	struct snap_fs fs[SNAP_MAX_FREEZE]; /* taken over from snap */
	unsigned nfs;
	struct proc **stopped;
	unsigned nstopped;
	bool prepared, continued;
	const char *clock_file; /* the test seam, or NULL */
	int64_t delta_ns;
	uint64_t generation;
	/* the mounts' check, after the job: one job each, bounded by a timer */
	struct mount_snap *mounts;
	struct mount_check *checks;
	unsigned nmounts, checking;
	ev_timer check_timer;
	bool timer_on, replied;
	struct op *op; /* for the timer */
};

/* The check of one live mount, on a worker: rclone there, the FUSE mount answering. */
struct mount_check {
	struct op_job job;
	unsigned idx;
	uint64_t t0;
	bool done;
	struct snap_step *step;
};

static int resumed_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__ResumedRequest *r = op->req->resumed;
	const Shim__V1__Timestamp *t = r->time;
	if (t->sec < 0)
		return err_set(err, EINVAL, NULL, "time: %lld is before 1970", (long long)t->sec);
	if (t->nsec >= 1000000000u)
		return err_set(err, EINVAL, NULL, "time: nsec %u out of range", t->nsec);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	if (t->sec > (int64_t)now.tv_sec + SNAP_AHEAD_MAX_S)
		return err_set(err, EINVAL, NULL, "time: %lld is more than 10 years ahead of the guest's clock (%lld)",
			       (long long)t->sec, (long long)now.tv_sec);
	if (r->entropy.len < SNAP_ENTROPY_MIN || r->entropy.len > SNAP_ENTROPY_MAX)
		return err_set(err, EINVAL, NULL, "entropy: %zu bytes (%d..%d)", r->entropy.len, SNAP_ENTROPY_MIN,
			       SNAP_ENTROPY_MAX);
	if (snap.state == SNAP_PREPARING)
		return err_set(err, EBUSY, NULL, "a snapshot_prepare is still running");
	struct resumed *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	/* take over what the prepare holds: undone by this op whatever happens to it */
	m->prepared = snap.state == SNAP_PREPARED;
	if (snap.timer_ready)
		ev_timer_stop(srv->loop, &snap.thaw_timer);
	memcpy(m->fs, snap.fs, snap.nfs * sizeof(snap.fs[0]));
	m->nfs = snap.nfs;
	snap.nfs = 0;
	m->stopped = snap.stopped;
	m->nstopped = snap.nstopped;
	snap.stopped = NULL;
	snap.nstopped = 0;
	snap.state = SNAP_IDLE;
	m->clock_file = test_clock_file;
	op->data = m;
	op_run_job(op);
	return 0;
}

static bool have_cap(int cap)
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	memset(d, 0, sizeof(d));
	if (syscall(SYS_capget, &h, d) < 0)
		return false;
	return (d[cap / 32].effective & (1u << (cap % 32))) != 0;
}

/* The fake setter of the test seam. */
static int clock_set_fake(const char *file, const struct timespec *ts)
{
	int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	char line[64];
	int n = snprintf(line, sizeof(line), "%lld %ld\n", (long long)ts->tv_sec, ts->tv_nsec);
	ssize_t w = write(fd, line, (size_t)n);
	int saved = errno;
	close(fd);
	errno = saved;
	return w == n ? 0 : -1;
}

static void resumed_clock(struct resumed *m, const Shim__V1__Timestamp *t)
{
	uint64_t t0 = mono_ns();
	struct timespec want = {.tv_sec = (time_t)t->sec, .tv_nsec = (long)t->nsec}, before;
	clock_gettime(CLOCK_REALTIME, &before);
	m->delta_ns = (int64_t)(want.tv_sec - before.tv_sec) * 1000000000 + (want.tv_nsec - before.tv_nsec);
	int code = 0;
	char msg[160] = "";
	if (!have_cap(CAP_SYS_TIME)) {
		code = EPERM;
		snprintf(msg, sizeof(msg), "the shim has no CAP_SYS_TIME: the clock was not set");
	} else if (m->clock_file != NULL) {
		if (clock_set_fake(m->clock_file, &want) < 0)
			code = errno;
		snprintf(msg, sizeof(msg), "test seam: written to %s%s%s", m->clock_file, code ? ": " : "",
			 code ? strerror(code) : "");
	} else if (clock_settime(CLOCK_REALTIME, &want) < 0) {
		code = errno;
		snprintf(msg, sizeof(msg), "clock_settime: %s", strerror(code));
	}
	struct snap_step *s = step_add(m->steps, &m->nsteps, "clock", t0);
	if (s != NULL) {
		s->code = code;
		snprintf(s->msg, sizeof(s->msg), "%s", msg);
	}
	if (code == 0)
		log_info("snapshot: clock set (moved %+lld ms)", (long long)(m->delta_ns / 1000000));
}

static void resumed_entropy(struct resumed *m, const ProtobufCBinaryData *e)
{
	uint64_t t0 = mono_ns();
	int code = 0;
	uint32_t bits = 0;
	char msg[160] = "";
	int fd = open("/dev/random", O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		code = errno;
		snprintf(msg, sizeof(msg), "/dev/random: %s", strerror(code));
	} else {
		struct rand_pool_info *rp = calloc(1, sizeof(*rp) + SNAP_ENTROPY_MAX + 4);
		if (rp == NULL) {
			code = ENOMEM;
		} else {
			rp->entropy_count = (int)(e->len * 8);
			rp->buf_size = (int)e->len;
			memcpy(rp->buf, e->data, e->len);
			if (ioctl(fd, RNDADDENTROPY, rp) == 0) {
				bits = (uint32_t)(e->len * 8);
			} else {
				code = errno;
				/* without CAP_SYS_ADMIN the bytes are still mixed in, uncredited */
				bool mixed = write(fd, e->data, e->len) == (ssize_t)e->len;
				snprintf(msg, sizeof(msg), "RNDADDENTROPY: %s%s", strerror(code),
					 mixed ? " (mixed into the pool without credit)" : "");
			}
			explicit_bzero(rp->buf, e->len);
			free(rp);
		}
		close(fd);
	}
	struct snap_step *s = step_add(m->steps, &m->nsteps, "entropy", t0);
	if (s != NULL) {
		s->code = code;
		s->has_count = true;
		s->count = bits;
		if (msg[0] == '\0')
			snprintf(msg, sizeof(msg), "credited; the shim's ids come from getrandom(), reseeded with it");
		snprintf(s->msg, sizeof(s->msg), "%s", msg);
	}
}

static int resumed_job(struct op *op, struct shim_err *err)
{
	(void)err;
	struct resumed *m = op->data;
	const Shim__V1__ResumedRequest *r = op->req->resumed;
	resumed_clock(m, r->time);
	resumed_entropy(m, &r->entropy);
	for (unsigned i = 0; i < m->nfs; i++) {
		uint64_t t0 = mono_ns();
		int code = fs_thaw(&m->fs[i]) < 0 ? errno : 0;
		struct snap_step *s = step_add(m->steps, &m->nsteps, "thaw", t0);
		if (s != NULL) {
			s->code = code;
			s->path = m->fs[i].path;
			s->path_len = m->fs[i].path_len;
			if (code != 0)
				snprintf(s->msg, sizeof(s->msg), "FITHAW: %s", strerror(code));
		}
	}
	m->generation = __atomic_add_fetch(&snap.generation, 1, __ATOMIC_RELAXED);
	log_info("snapshot: resumed%s, generation %llu", r->has_fork && r->fork ? " (a fork)" : "",
		 (unsigned long long)m->generation);
	return 0;
}

/* The clock may have jumped: libev's idea of now, and every connection's keepalive,
 * start again from here, so that no connection is judged silent (or given a reprieve)
 * because of the jump. */
static void timers_reset(void)
{
	struct ev_loop *loop = srv->loop;
	ev_now_update(loop);
	for (struct conn *c = srv->conns; c != NULL; c = c->next) {
		if (c->state != CONN_READY)
			continue;
		c->last_rx = mono_s();
		c->ping_out = false;
		if (srv->cfg.keepalive > 0) {
			c->keepalive.repeat = srv->cfg.keepalive;
			ev_timer_again(loop, &c->keepalive);
		}
	}
}

static void resumed_continue(struct resumed *m)
{
	if (m->continued)
		return;
	m->continued = true;
	uint64_t t0 = mono_ns();
	unsigned n = m->nstopped;
	unsigned done = m->stopped != NULL ? continue_stopped(m->stopped, m->nstopped) : 0;
	m->stopped = NULL;
	m->nstopped = 0;
	if (n > 0 || m->prepared) {
		struct snap_step *s = step_add(m->steps, &m->nsteps, "continue", t0);
		if (s != NULL) {
			s->has_count = true;
			s->count = done;
		}
	}
}

static void resumed_reply(struct op *op)
{
	struct resumed *m = op->data;
	m->replied = true;
	if (m->timer_on) {
		ev_timer_stop(srv->loop, &m->check_timer);
		m->timer_on = false;
	}
	/* a check still running (a hung FUSE mount) did not answer in time */
	for (unsigned i = 0; i < m->nmounts; i++) {
		struct mount_check *c = &m->checks[i];
		if (c->step != NULL && !c->done) {
			c->step->code = ETIMEDOUT;
			c->step->us = since_us(c->t0);
			snprintf(c->step->msg, sizeof(c->step->msg), "the mount does not answer within %d ms",
				 SNAP_MOUNT_CHECK_MS);
		}
	}
	Shim__V1__SnapshotStep pb[SNAP_MAX_STEPS], *pp[SNAP_MAX_STEPS];
	steps_to_pb(m->steps, m->nsteps, pb, pp);
	Shim__V1__ResumedReply r = SHIM__V1__RESUMED_REPLY__INIT;
	r.n_steps = m->nsteps;
	r.steps = pp;
	r.generation = m->generation;
	r.prepared = m->prepared;
	r.has_clock_delta_ns = 1;
	r.clock_delta_ns = m->delta_ns;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_RESUMED;
	res.resumed = &r;
	op_end(op, &res);
}

static void check_run(struct op_job *job)
{
	struct mount_check *c = container_of(job, struct mount_check, job);
	struct resumed *m = job->op->data;
	const struct mount_snap *ms = &m->mounts[c->idx];
	job->rc = 0;
	if (kill(ms->pid, 0) < 0) {
		job->rc = err_set(&job->err, ESRCH, NULL, "rclone (pid %d) is gone", (int)ms->pid);
		return;
	}
	/* what the mount's own liveness check does: a statfs and a listing of its root
	 * (rclone's connections to the server are its own: it reconnects) */
	static const bool no = false;
	mount_wait_live(ms->real, &no, &no, 0, &job->err) < 0 ? (void)(job->rc = -1) : (void)0;
}

static void check_done(struct op_job *job)
{
	struct mount_check *c = container_of(job, struct mount_check, job);
	struct op *op = job->op;
	struct resumed *m = op->data;
	c->done = true;
	if (m->replied)
		return;
	c->step->us = since_us(c->t0);
	if (job->rc < 0) {
		c->step->code = job->err.code;
		snprintf(c->step->msg, sizeof(c->step->msg), "%s", job->err.msg);
	}
	if (--m->checking == 0)
		resumed_reply(op);
}

static void check_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct resumed *m = container_of(w, struct resumed, check_timer);
	m->timer_on = false;
	resumed_reply(m->op);
}

/* Re-check every mount (loop thread): a failed one is reported as it is (unmount it,
 * then mount again), a live one checked on a worker. */
static void mounts_check(struct op *op)
{
	struct resumed *m = op->data;
	m->mounts = calloc(MOUNT_MAX, sizeof(*m->mounts));
	m->checks = calloc(MOUNT_MAX, sizeof(*m->checks));
	if (m->mounts == NULL || m->checks == NULL)
		return;
	m->nmounts = op_mount_snapshot(m->mounts, MOUNT_MAX);
	for (unsigned i = 0; i < m->nmounts; i++) {
		const struct mount_snap *ms = &m->mounts[i];
		struct snap_step *s = step_add(m->steps, &m->nsteps, "mount", mono_ns());
		if (s == NULL)
			break;
		s->path = ms->path;
		s->path_len = strlen(ms->path);
		if (!ms->live || ms->pid <= 0) {
			s->code = ms->pid <= 0 ? EIO : EAGAIN;
			snprintf(s->msg, sizeof(s->msg), "%s",
				 ms->pid <= 0 ? (ms->error[0] ? ms->error : "rclone exited") :
						"not live (starting or unmounting)");
			continue;
		}
		struct mount_check *c = &m->checks[i];
		c->idx = i;
		c->t0 = mono_ns();
		c->step = s;
		c->job.run = check_run;
		c->job.done = check_done;
		m->checking++;
		op_submit(op, &c->job);
	}
	if (m->checking > 0) {
		m->op = op;
		ev_timer_init(&m->check_timer, check_timer_cb, SNAP_MOUNT_CHECK_MS / 1000.0, 0);
		ev_timer_start(srv->loop, &m->check_timer);
		m->timer_on = true;
	}
}

static void resumed_done(struct op *op, int rc, const struct shim_err *err)
{
	(void)rc;
	(void)err;
	struct resumed *m = op->data;
	resumed_continue(m);
	timers_reset();
	mounts_check(op);
	if (m->checking == 0)
		resumed_reply(op);
}

static void resumed_cancel(struct op *op)
{
	struct resumed *m = op->data;
	m->replied = true;
	if (m->timer_on) {
		ev_timer_stop(srv->loop, &m->check_timer);
		m->timer_on = false;
	}
}

static void resumed_release(struct op *op)
{
	struct resumed *m = op->data;
	if (m == NULL)
		return;
	/* the client went before the job ended, or the job was skipped */
	resumed_continue(m);
	unsigned left = 0;
	for (unsigned i = 0; i < m->nfs; i++) {
		if (m->fs[i].fd >= 0)
			m->fs[left++] = m->fs[i];
		else
			fs_free(&m->fs[i]);
	}
	m->nfs = left;
	thaw_detached(m->fs, &m->nfs);
	if (m->timer_on)
		ev_timer_stop(srv->loop, &m->check_timer);
	free(m->mounts);
	free(m->checks);
	free(m);
}

const struct op_kind op_snapshot_resumed_kind = {
	SHIM__V1__REQUEST__KIND_RESUMED,
	"resumed",
	0,
	.start = resumed_start,
	.job = resumed_job,
	.job_done = resumed_done,
	.cancel = resumed_cancel,
	.release = resumed_release,
};
