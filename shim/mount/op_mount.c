/* op_mount.c: S3 bucket mounts on the loop side: requests, the mount table, rclone's life and death, unmount, shutdown. */
#include "conn.h"
#include "init.h"
#include "log.h"
#include "mount.h"
#include "op.h"
#include "ops.h"
#include "reaper.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/*
 * A mount's life, all of it decided here on the loop thread; every step that
 * touches the filesystem or waits runs as a worker job (one at a time per mount),
 * and every child (rclone lsf, rclone mount, fusermount3) is forked here, so that
 * the one reaper knows its pid before it can exit:
 *
 *   request -> PREPARE job (checks, runtime dir, 0600 config, argv) -> preflight
 *   child (rclone lsf, one try: a refused key, a dead server or a missing bucket
 *   fails fast, in the server's words) -> rclone mount -> WAIT job (mountinfo, statfs, listing) ->
 *   LIVE, answered with the record. The deadline timer bounds it all: it kills a
 *   preflight that hangs, and rclone when the WAIT job is stuck in the kernel.
 *   Any failure or a cancel: TERM to rclone (KILL later), and once the reaper has
 *   its status: CLEANUP job -> ERROR with rclone's last words.
 *
 *   rclone dies while LIVE: the reaper calls rclone_exited() -> FAILED at once ->
 *   DEAD job: the dead FUSE mount swapped for a read-only empty tmpfs, so that
 *   writes fail with EROFS instead of landing in the bare directory.
 *
 *   unmount: FLUSH job (until the VFS cache has nothing left to upload) ->
 *   fusermount3 -u child (killed after FUSERMOUNT_WAIT) -> DETACH job (lazy
 *   fallback, the cover of a failed mount) -> rclone exits by itself (TERM, then
 *   KILL if it does not) -> CLEANUP job (config, log, cache, the directory if we
 *   made it) -> the record, state UNMOUNTED, to every request waiting for it.
 *   Unmounted records are kept a while: unmounting again answers the same.
 *
 * Who owns what: the mount request's op (struct mount_start, op->data) owns the
 * start — the plan with the secrets, PREPARE (its main job), the preflight, WAIT
 * (a job of its own), the deadline — until the mount is live or has failed. A
 * request that goes away first abandons its mount (mount_release): the abort goes
 * on without it. What comes after belongs to no request, so it is the mount's own
 * job (struct mount_job, a plain worker job): DEAD, the CLEANUP of an abort, and
 * the unmount, which several requests may wait for (struct waiter, an unmount op's
 * data), which goes on when they are cancelled and which shutdown runs with none.
 */

/* the mount's own jobs */
enum phase { PH_NONE, PH_DEAD, PH_FLUSH, PH_DETACH, PH_CLEANUP };
/* internal states beyond the protocol's */
#define ST_ABORTING 100

#define STOP_WAIT 3.0       /* after the unmount: time for rclone to exit by itself, then TERM, then KILL */
#define GONE_KEEP 32        /* unmounted records kept for idempotent unmounts */
#define FUSERMOUNT_WAIT 5.0 /* fusermount3 -u: then it is killed and the mount detached lazily */

struct mount;

/* The mount's one job (no request drives it). */
struct mount_job {
	struct work work;
	enum phase phase;
	bool busy;
	int rc;
	struct shim_err err;
	char tail[160]; /* + 80 + 10 fits an error message */
	pid_t pid;      /* rclone's pid as the job starts */
};

/* A mount request (op->data) until its mount is live or has failed. */
struct mount_start {
	struct op *op;
	struct mount *m;         /* its table entry; NULL once the request is done with it */
	struct mount_plan *plan; /* until rclone is started: it holds the secrets */
	bool prepared;           /* PREPARE succeeded: its results (dirs, lock) are in plan */
	bool abort;              /* atomic: cancelled or shutdown; read by the WAIT job */
	unsigned timeout_ms;
	uint64_t deadline_ns;
	struct shim_err fail;
	/* the preflight (rclone lsf): the reaper holds the op while it runs */
	pid_t pf_pid;
	bool pf_timed_out;
	/* the liveness check; PREPARE is the op's main job */
	struct op_job wait;
	bool waiting;
	pid_t wait_pid;      /* rclone, for mount_record_pid */
	ev_timer wait_timer; /* the deadline of the whole start */
};

/* An unmount request (op->data) waiting for its mount's unmount. */
struct waiter {
	struct waiter *next;
	struct op *op;
	struct mount *m; /* NULL once answered */
};

struct mount {
	struct mount *next;
	char id[40];
	char created_at[32];
	char *bucket, *prefix, *endpoint;
	char path[PATH_MAX];   /* as the client gave it */
	char real[PATH_MAX];   /* the mount point in our namespace */
	char rundir[PATH_MAX]; /* config, log, cache */
	char fusermount[PATH_MAX];
	bool read_only, created_dir, tombstone;
	int state; /* SHIM__V1__MOUNT_STATE__* or ST_ABORTING */
	pid_t pid; /* rclone; 0 once reaped */
	int status;
	bool exited; /* atomic: read by the WAIT and FLUSH jobs */
	char error[256];
	int lock_fd;               /* the runtime dir's flock (mount_sweep), until CLEANUP removed it */
	struct mount_start *start; /* the mount request, while it is starting */
	struct mount_job job;
	/* stopping rclone */
	int kill_stage;
	ev_timer timer;
	/* unmount */
	struct waiter *waiters;
	bool unmount_wanted, force;
	unsigned flush_ms;
	pid_t fm_pid; /* fusermount3 -u, while it runs */
	int fm_log;   /* its stderr: rclone's log */
	ev_timer fm_timer;
	bool detached; /* unmount: the mount is off the path; rclone may go */
};

static struct {
	struct mount *list;
	unsigned n;
	struct mount *gone; /* unmounted, newest first */
	unsigned n_gone;
	bool hook;
	/* shutdown */
	void (*then)(struct server *s);
	struct server *srv;
	ev_timer shutdown_timer;
} mt;

static void mjob_submit(struct mount *m, enum phase ph);
static void start_unmount(struct mount *m);
static void abort_start(struct mount *m);
static void rclone_exited(void *ud, pid_t pid, int status);

unsigned op_mount_count(void)
{
	return mt.n;
}

unsigned op_mount_snapshot(struct mount_snap *out, unsigned max)
{
	unsigned n = 0;
	for (struct mount *m = mt.list; m != NULL && n < max; m = m->next) {
		struct mount_snap *s = &out[n++];
		snprintf(s->id, sizeof(s->id), "%s", m->id);
		snprintf(s->path, sizeof(s->path), "%s", m->path);
		snprintf(s->real, sizeof(s->real), "%s", m->real);
		snprintf(s->rundir, sizeof(s->rundir), "%s", m->rundir);
		snprintf(s->error, sizeof(s->error), "%s", m->error);
		s->pid = m->pid;
		s->live = m->state == SHIM__V1__MOUNT_STATE__MOUNT_LIVE;
	}
	return n;
}

/* ================================ records ================================ */

static int proto_state(const struct mount *m)
{
	return m->state == ST_ABORTING ? SHIM__V1__MOUNT_STATE__MOUNT_STARTING : m->state;
}

static void fill_record(Shim__V1__MountRecord *r, const struct mount *m)
{
	shim__v1__mount_record__init(r);
	r->id = (char *)m->id;
	r->bucket = m->bucket;
	r->prefix = m->prefix;
	r->path.data = (uint8_t *)m->path;
	r->path.len = strlen(m->path);
	r->read_only = m->read_only;
	r->state = (Shim__V1__MountState)proto_state(m);
	r->rclone_pid = m->pid > 0 ? (uint32_t)m->pid : 0;
	r->created_at = (char *)m->created_at;
	r->endpoint = m->endpoint;
	if (m->error[0] != '\0')
		r->error = (char *)m->error;
	r->has_created_dir = 1;
	r->created_dir = m->created_dir;
}

static void reply_record(struct op *op, const struct mount *m)
{
	Shim__V1__MountRecord r;
	fill_record(&r, m);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_MOUNT;
	res.mount = &r;
	op_end(op, &res);
}

/* ================================ table ================================ */

static void mount_free(struct mount *m)
{
	ev_timer_stop(srv->loop, &m->timer);
	ev_timer_stop(srv->loop, &m->fm_timer);
	if (m->fm_log >= 0)
		close(m->fm_log);
	if (m->lock_fd >= 0)
		close(m->lock_fd);
	free(m->bucket);
	free(m->prefix);
	free(m->endpoint);
	free(m);
}

static void unlink_mount(struct mount *m)
{
	for (struct mount **p = &mt.list; *p != NULL; p = &(*p)->next) {
		if (*p == m) {
			*p = m->next;
			mt.n--;
			break;
		}
	}
	m->next = NULL;
	if (mt.then != NULL && mt.n == 0) {
		/* shutdown: every mount is gone; on to the children */
		void (*then)(struct server *) = mt.then;
		mt.then = NULL;
		ev_timer_stop(srv->loop, &mt.shutdown_timer);
		then(mt.srv);
	}
}

/* Unmounted: keep the record (bounded) for unmounts of the same id or path. */
static void retire(struct mount *m)
{
	unlink_mount(m);
	m->next = mt.gone;
	mt.gone = m;
	mt.n_gone++;
	if (mt.n_gone > GONE_KEEP) {
		struct mount **p = &mt.gone;
		for (unsigned i = 0; i < GONE_KEEP; i++)
			p = &(*p)->next;
		struct mount *old = *p;
		*p = NULL;
		while (old != NULL) {
			struct mount *n = old->next;
			mount_free(old);
			mt.n_gone--;
			old = n;
		}
	}
}

static bool same_path(const struct mount *m, const char *path)
{
	return strcmp(m->path, path) == 0 || (m->real[0] != '\0' && strcmp(m->real, path) == 0);
}

static struct mount *find(struct mount *list, const char *id, const char *path)
{
	for (struct mount *m = list; m != NULL; m = m->next) {
		if (id != NULL && strcmp(m->id, id) == 0)
			return m;
		if (path != NULL && same_path(m, path))
			return m;
	}
	return NULL;
}

/* ================================ rclone ================================ */

static void describe_exit(char *buf, size_t size, int status)
{
	if (WIFSIGNALED(status))
		snprintf(buf, size, "rclone was killed by signal %d", WTERMSIG(status));
	else
		snprintf(buf, size, "rclone exited with status %d", WEXITSTATUS(status));
}

static void stop_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct mount *m = container_of(w, struct mount, timer);
	if (m->pid <= 0)
		return;
	if (m->kill_stage == 0) {
		log_debug("mount %s: rclone %d still there; SIGTERM", m->id, (int)m->pid);
		kill(-m->pid, SIGTERM);
		kill(m->pid, SIGTERM);
	} else if (m->kill_stage == 1) {
		log_warn("mount %s: rclone %d ignores SIGTERM; SIGKILL", m->id, (int)m->pid);
		kill(-m->pid, SIGKILL);
		kill(m->pid, SIGKILL);
	} else {
		/* stuck in the kernel: clean up without it; its status goes unwatched */
		log_warn("mount %s: rclone %d does not die; cleaning up anyway", m->id, (int)m->pid);
		reaper_unwatch(m->pid);
		m->pid = 0;
		__atomic_store_n(&m->exited, true, __ATOMIC_RELEASE);
		if (!m->job.busy)
			mjob_submit(m, PH_CLEANUP);
		return;
	}
	m->kill_stage++;
	ev_timer_set(&m->timer, STOP_WAIT, 0);
	ev_timer_start(srv->loop, &m->timer);
}

/* rclone should go now (it was unmounted, or the mount failed): give it STOP_WAIT
 * to exit by itself (stage 0) or send TERM at once (stage 1). */
static void stop_rclone(struct mount *m, bool term_now)
{
	if (m->pid <= 0)
		return;
	m->kill_stage = 0;
	if (term_now) {
		kill(-m->pid, SIGTERM);
		kill(m->pid, SIGTERM);
		m->kill_stage = 1;
	}
	ev_timer_set(&m->timer, STOP_WAIT, 0);
	ev_timer_start(srv->loop, &m->timer);
}

static void rclone_exited(void *ud, pid_t pid, int status)
{
	struct mount *m = ud;
	(void)pid;
	m->pid = 0;
	m->status = status;
	__atomic_store_n(&m->exited, true, __ATOMIC_RELEASE);
	ev_timer_stop(srv->loop, &m->timer);
	switch (m->state) {
	case SHIM__V1__MOUNT_STATE__MOUNT_LIVE:
		/* reported failed from now on; the job makes the path refuse writes */
		m->state = SHIM__V1__MOUNT_STATE__MOUNT_FAILED;
		describe_exit(m->error, sizeof(m->error), status);
		log_warn("mount %s at %s: %s", m->id, m->path, m->error);
		if (!m->job.busy)
			mjob_submit(m, PH_DEAD);
		break;
	case ST_ABORTING:
		if (!m->job.busy)
			mjob_submit(m, PH_CLEANUP);
		break;
	case SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING:
		/* before the mount is off the path, the unmount steps go on; they end in
		 * CLEANUP themselves */
		if (m->detached && !m->job.busy)
			mjob_submit(m, PH_CLEANUP);
		break;
	case SHIM__V1__MOUNT_STATE__MOUNT_STARTING: /* the WAIT job notices */
	case SHIM__V1__MOUNT_STATE__MOUNT_FAILED:
	case SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTED:
	default:
		break;
	}
}

/* ---- fusermount3 -u: a child of the loop like rclone, so that the one reaper gets
 * its status; it may hang on a stuck FUSE server, so it has a deadline ---- */

static void fm_done(struct mount *m)
{
	ev_timer_stop(srv->loop, &m->fm_timer);
	if (m->fm_log >= 0)
		close(m->fm_log);
	m->fm_log = -1;
	m->fm_pid = 0;
	mjob_submit(m, PH_DETACH); /* does nothing if fusermount3 has unmounted it */
}

static void fm_exited(void *ud, pid_t pid, int status)
{
	struct mount *m = ud;
	(void)pid;
	if (status != 0)
		log_info("mount %s: fusermount3 -u %s failed (status 0x%x); detaching lazily", m->id, m->real,
			 (unsigned)status);
	fm_done(m);
}

static void fm_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct mount *m = container_of(w, struct mount, fm_timer);
	if (m->fm_pid <= 0)
		return;
	log_warn("mount %s: fusermount3 -u hangs; killing it, detaching lazily", m->id);
	kill(m->fm_pid, SIGKILL);
	reaper_unwatch(m->fm_pid);
	fm_done(m);
}

static void start_fusermount(struct mount *m)
{
	char *argv[] = {"fusermount3", "-u", m->real, NULL};
	static char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
	struct shim_err e;
	pid_t pid = m->fusermount[0] != '\0' ? mount_spawn(m->fusermount, argv, envp, m->fm_log, -1, "/", &e) : -1;
	if (pid > 0 && reaper_watch(pid, fm_exited, m) < 0) {
		kill(pid, SIGKILL);
		pid = -1;
	}
	if (pid <= 0) {
		fm_done(m);
		return;
	}
	m->fm_pid = pid;
	ev_timer_set(&m->fm_timer, FUSERMOUNT_WAIT, 0);
	ev_timer_start(srv->loop, &m->fm_timer);
}

/* ================================ the mount's own jobs ================================ */

static void mjob_run(struct work *w)
{
	struct mount *m = container_of(w, struct mount, job.work);
	struct mount_job *j = &m->job;
	j->rc = 0;
	switch (j->phase) {
	case PH_DEAD:
		/* the FUSE connection is gone: cover the path (read-only), detach it */
		if (mount_tombstone(m->real) == 0)
			j->rc = 1;
		else
			mount_detach(m->real);
		mount_log_tail(m->rundir, j->tail, sizeof(j->tail));
		break;
	case PH_FLUSH: {
		if (!m->tombstone && m->flush_ms > 0) {
			/* pending uploads first: after the unmount rclone would drop them */
			uint64_t end = mono_ns() + (uint64_t)m->flush_ms * 1000000u;
			unsigned dirty, clean_scans = 0;
			/* two clean looks 50 ms apart: a close that is still on its way to
			 * rclone shows up in between */
			for (;;) {
				dirty = mount_dirty_count(m->rundir, j->pid);
				clean_scans = dirty == 0 ? clean_scans + 1 : 0;
				if (clean_scans >= 2 || mono_ns() >= end ||
				    __atomic_load_n(&m->exited, __ATOMIC_ACQUIRE))
					break;
				struct timespec ts = {0, 50 * 1000000L};
				nanosleep(&ts, NULL);
			}
			if (dirty > 0 && !m->force && !__atomic_load_n(&m->exited, __ATOMIC_ACQUIRE)) {
				j->rc = err_set(
					&j->err, ETIMEDOUT, m->path,
					"%u file(s) still uploading after %u ms; unmount again later, or with force",
					dirty, m->flush_ms);
				break;
			}
			if (dirty > 0)
				log_warn("mount %s: unmounting with %u file(s) not uploaded", m->id, dirty);
		}
		if (!m->tombstone && mount_is_fuse(m->real)) {
			j->rc = 1; /* fusermount3 -u next, from the loop */
			char logp[PATH_MAX + 16];
			snprintf(logp, sizeof(logp), "%s/rclone.log", m->rundir);
			m->fm_log = open(logp, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
		}
		break;
	}
	case PH_DETACH:
		/* the cover of a failed mount first; then what fusermount3 left (busy, or
		 * the FUSE server is gone): lazily */
		if (m->tombstone && umount2(m->real, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
			m->tombstone = false;
		if (mount_detach(m->real) < 0)
			log_warn("mount %s: %s is still mounted", m->id, m->real);
		break;
	case PH_CLEANUP:
		if (m->state == ST_ABORTING && m->rundir[0] != '\0')
			mount_log_tail(m->rundir, j->tail, sizeof(j->tail));
		if (m->tombstone && umount2(m->real, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
			m->tombstone = false;
		mount_detach(m->real);
		mount_remove_files(m->rundir, m->real, m->created_dir);
		break;
	case PH_NONE:
	default:
		break;
	}
}

/* The start failed (or was abandoned) and nothing of it is left: the request, if it
 * is still there, gets the error, with rclone's last words when there are some. */
static void finish_start_failure(struct mount *m)
{
	struct mount_start *s = m->start;
	if (s != NULL) {
		/* the request is done with the mount, which goes now */
		m->start = NULL;
		s->m = NULL;
		struct shim_err e = s->fail;
		if (m->job.tail[0] != '\0') {
			/* rclone's own words decide the errno when they are clear */
			e.code = mount_classify(m->job.tail, e.code);
			/* the fail message is short; rclone's words get the rest of the room */
			snprintf(e.msg, sizeof(e.msg), "%.80s; rclone: %s", s->fail.msg, m->job.tail);
		}
		log_info("mount %s of %s at %s failed: %s", m->id, m->bucket, m->path, e.msg);
		op_fail(s->op, &e);
	}
	unlink_mount(m);
	mount_free(m);
}

/* Answer every unmount request waiting for m: with e, or (e NULL) with m's record. */
static void end_waiters(struct mount *m, const struct shim_err *e)
{
	while (m->waiters != NULL) {
		struct waiter *w = m->waiters;
		m->waiters = w->next;
		w->m = NULL;
		if (e != NULL)
			op_fail(w->op, e);
		else
			reply_record(w->op, m);
	}
}

static void mjob_done(struct work *w)
{
	struct mount *m = container_of(w, struct mount, job.work);
	struct mount_job *j = &m->job;
	j->busy = false;
	enum phase ph = j->phase;
	j->phase = PH_NONE;
	switch (ph) {
	case PH_DEAD:
		if (j->rc == 1)
			m->tombstone = true;
		if (j->tail[0] != '\0') {
			char what[96];
			snprintf(what, sizeof(what), "%.80s", m->error);
			snprintf(m->error, sizeof(m->error), "%.80s; rclone: %s", what, j->tail);
		}
		if (m->unmount_wanted)
			start_unmount(m);
		return;
	case PH_FLUSH:
		if (j->rc < 0) {
			/* uploads still pending: the mount stays as it was */
			m->state = m->pid > 0 ? SHIM__V1__MOUNT_STATE__MOUNT_LIVE : SHIM__V1__MOUNT_STATE__MOUNT_FAILED;
			end_waiters(m, &j->err);
			if (m->pid <= 0)
				rclone_exited(m, 0, m->status);
			return;
		}
		if (j->rc == 1)
			start_fusermount(m);
		else
			mjob_submit(m, PH_DETACH);
		return;
	case PH_DETACH:
		m->detached = true;
		if (m->pid > 0)
			stop_rclone(m, false); /* it exits by itself once unmounted; CLEANUP then */
		else
			mjob_submit(m, PH_CLEANUP);
		return;
	case PH_CLEANUP:
		if (m->lock_fd >= 0)
			close(m->lock_fd); /* the runtime dir is gone */
		m->lock_fd = -1;
		if (m->state == ST_ABORTING) {
			finish_start_failure(m);
			return;
		}
		m->state = SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTED;
		log_info("mount %s: %s unmounted", m->id, m->path);
		end_waiters(m, NULL);
		retire(m);
		return;
	case PH_NONE:
	default:
		return;
	}
}

static void mjob_submit(struct mount *m, enum phase ph)
{
	struct mount_job *j = &m->job;
	j->phase = ph;
	j->busy = true;
	j->pid = m->pid;
	j->tail[0] = '\0';
	memset(&j->work, 0, sizeof(j->work));
	j->work.run = mjob_run;
	j->work.done = mjob_done;
	worker_submit(&j->work);
}

/* The WAIT failed, the request went away or shutdown came: stop rclone, then CLEANUP. */
static void abort_start(struct mount *m)
{
	m->state = ST_ABORTING;
	if (m->pid > 0)
		stop_rclone(m, true);
	else
		mjob_submit(m, PH_CLEANUP);
}

/* ================================ starting ================================ */

static unsigned remaining_ms(const struct mount_start *s)
{
	uint64_t now = mono_ns();
	return now >= s->deadline_ns ? 100 : (unsigned)((s->deadline_ns - now) / 1000000u) + 1;
}

static void arm_deadline(struct mount_start *s, double extra)
{
	ev_timer_stop(srv->loop, &s->wait_timer);
	ev_timer_set(&s->wait_timer, remaining_ms(s) / 1000.0 + extra, 0);
	ev_timer_start(srv->loop, &s->wait_timer);
}

/* What PREPARE made is the mount's from now on: CLEANUP removes it. */
static void take_prepared(struct mount *m, struct mount_plan *pl)
{
	snprintf(m->real, sizeof(m->real), "%s", pl->real);
	snprintf(m->rundir, sizeof(m->rundir), "%s", pl->rundir);
	m->created_dir = pl->created_dir;
	snprintf(m->fusermount, sizeof(m->fusermount), "%s", pl->fusermount);
	m->lock_fd = pl->lock_fd;
	pl->lock_fd = -1;
}

/* On a worker: the liveness check. */
static void wait_run(struct op_job *job)
{
	struct mount_start *s = container_of(job, struct mount_start, wait);
	struct mount *m = s->m;
	mount_record_pid(m->rundir, s->wait_pid);
	job->rc = mount_wait_live(m->real, &m->exited, &s->abort, remaining_ms(s), &job->err);
}

static void wait_done(struct op_job *job)
{
	struct mount_start *s = container_of(job, struct mount_start, wait);
	struct mount *m = s->m;
	s->waiting = false;
	ev_timer_stop(srv->loop, &s->wait_timer);
	if (job->rc == 0 && !__atomic_load_n(&s->abort, __ATOMIC_ACQUIRE)) {
		m->state = SHIM__V1__MOUNT_STATE__MOUNT_LIVE;
		log_info("mount %s: %s%s%s live at %s (rclone %d)", m->id, m->bucket, m->prefix ? "/" : "",
			 m->prefix ? m->prefix : "", m->path, (int)m->pid);
		/* the mount is on its own from now on */
		m->start = NULL;
		s->m = NULL;
		reply_record(s->op, m);
		if (m->pid <= 0) /* died right after the check */
			rclone_exited(m, 0, m->status);
		else if (m->unmount_wanted)
			start_unmount(m);
		return;
	}
	if (job->rc == 0) {
		err_set(&s->fail, ECANCELED, NULL, "cancelled");
	} else if (m->pid <= 0 && job->err.code == EIO) {
		char what[96];
		describe_exit(what, sizeof(what), m->status);
		err_set(&s->fail, EIO, NULL, "%s before the mount was live", what);
	} else {
		s->fail = job->err;
	}
	abort_start(m);
}

/* The preflight passed: start rclone mount and wait until it is live. */
static void start_rclone(struct mount_start *s)
{
	struct mount *m = s->m;
	struct mount_plan *pl = s->plan;
	pid_t pid = mount_spawn(pl->rclone, pl->argv, pl->envp, pl->log_fd, pl->mp_fd, pl->rundir, &s->fail);
	if (pid > 0 && reaper_watch(pid, rclone_exited, m) < 0) {
		kill(pid, SIGKILL);
		err_set(&s->fail, ENOMEM, NULL, "out of memory");
		pid = -1; /* its status is dropped by the reaper */
	}
	/* the secrets leave our memory: rclone has its config file */
	mount_plan_free(pl);
	free(pl);
	s->plan = NULL;
	if (pid < 0) {
		abort_start(m);
		return;
	}
	m->pid = pid;
	log_debug("mount %s: rclone %d started for %s at %s", m->id, (int)pid, m->bucket, m->real);
	s->wait_pid = pid;
	s->waiting = true;
	s->wait.run = wait_run;
	s->wait.done = wait_done;
	op_submit(s->op, &s->wait);
	/* a listing stuck in the kernel returns once rclone is gone: the timer kills it */
	arm_deadline(s, 1.0);
}

static void pf_verdict(struct mount_start *s, int status)
{
	struct mount *m = s->m;
	if (__atomic_load_n(&s->abort, __ATOMIC_ACQUIRE)) {
		err_set(&s->fail, ECANCELED, NULL, "cancelled");
		abort_start(m);
		return;
	}
	if (s->pf_timed_out) {
		err_set(&s->fail, ETIMEDOUT, NULL, "no answer from the S3 server within %u ms", s->timeout_ms);
		abort_start(m);
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		start_rclone(s);
		return;
	}
	/* 3: "directory not found", rclone's word for a 404 to the listing, which S3 gives
	 * only for a bucket that does not exist (a prefix with nothing under it lists
	 * empty). It must fail here: rclone mount would start all the same, show an
	 * empty directory and pass the liveness check. */
	if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
		err_set(&s->fail, ENOENT, m->bucket, "bucket %s does not exist", m->bucket);
		abort_start(m);
		return;
	}
	char what[96];
	describe_exit(what, sizeof(what), status);
	err_set(&s->fail, EIO, NULL, "cannot list the bucket (%s)", what);
	abort_start(m);
}

static void pf_exited(void *ud, pid_t pid, int status)
{
	struct mount_start *s = ud;
	struct op *op = s->op;
	(void)pid;
	s->pf_pid = 0;
	ev_timer_stop(srv->loop, &s->wait_timer);
	/* a request that is gone has abandoned the mount (mount_release) */
	if (op->st != NULL)
		pf_verdict(s, status);
	op_put(op);
}

static void start_preflight(struct mount_start *s)
{
	struct mount_plan *pl = s->plan;
	pid_t pid = mount_spawn(pl->rclone, pl->pf_argv, pl->envp, pl->log_fd, -1, pl->rundir, &s->fail);
	if (pid > 0 && reaper_watch(pid, pf_exited, s) < 0) {
		kill(pid, SIGKILL);
		err_set(&s->fail, ENOMEM, NULL, "out of memory");
		pid = -1;
	}
	if (pid < 0) {
		abort_start(s->m);
		return;
	}
	s->pf_pid = pid;
	op_hold(s->op); /* until pf_exited */
	arm_deadline(s, 0);
}

/* The start's deadline passed (or it was cancelled): a preflight still running is
 * killed; a liveness check stuck in the kernel is freed by killing rclone. */
static void wait_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct mount_start *s = container_of(w, struct mount_start, wait_timer);
	struct mount *m = s->m;
	if (s->pf_pid > 0) {
		s->pf_timed_out = true;
		kill(-s->pf_pid, SIGKILL);
		kill(s->pf_pid, SIGKILL);
	} else if (s->waiting && m->pid > 0) {
		log_info("mount %s: the mount does not answer; killing rclone %d", m->id, (int)m->pid);
		__atomic_store_n(&s->abort, true, __ATOMIC_RELEASE);
		kill(-m->pid, SIGKILL);
		kill(m->pid, SIGKILL);
	}
}

/* cancel or shutdown while starting */
static void abort_starting(struct mount_start *s)
{
	__atomic_store_n(&s->abort, true, __ATOMIC_RELEASE);
	ev_timer_stop(srv->loop, &s->wait_timer);
	if (s->pf_pid > 0) {
		ev_timer_set(&s->wait_timer, 0, 0);
		ev_timer_start(srv->loop, &s->wait_timer);
	} else if (s->waiting) {
		/* the WAIT job sees the flag within 100 ms, unless stuck in the kernel */
		ev_timer_set(&s->wait_timer, 0.5, 0);
		ev_timer_start(srv->loop, &s->wait_timer);
	}
}

/* ================================ mount ================================ */

/* On a worker, the op's main job. */
static int prepare_job(struct op *op, struct shim_err *err)
{
	struct mount_start *s = op->data;
	int rc = mount_prepare(s->plan, s->timeout_ms, err);
	s->prepared = rc == 0;
	return rc;
}

static void prepare_done(struct op *op, int rc, const struct shim_err *err)
{
	struct mount_start *s = op->data;
	struct mount *m = s->m;
	if (rc < 0) {
		s->fail = *err;
		finish_start_failure(m); /* prepare left nothing behind */
		return;
	}
	take_prepared(m, s->plan);
	if (__atomic_load_n(&s->abort, __ATOMIC_ACQUIRE)) {
		err_set(&s->fail, ECANCELED, NULL, "cancelled");
		abort_start(m);
		return;
	}
	start_preflight(s);
}

static void final_hook(void *ud);

static int mount_begin(struct op *op, struct shim_err *err)
{
	const Shim__V1__MountRequest *q = op->req->mount;
	/* cheap checks first, here; the filesystem ones on the worker */
	if (mount_check_request(q, err) < 0)
		return -1;
	if (mt.n >= MOUNT_MAX)
		return err_set(err, EMFILE, NULL, "too many mounts (at most %d)", MOUNT_MAX);

	struct mount_start *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	s->op = op;
	ev_init(&s->wait_timer, wait_timer_cb);
	op->data = s;
	struct mount *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	m->fm_log = -1;
	m->lock_fd = -1;
	ev_init(&m->timer, stop_timer_cb);
	ev_init(&m->fm_timer, fm_timer_cb);
	memcpy(m->path, q->path.data, q->path.len);
	while (strlen(m->path) > 1 && m->path[strlen(m->path) - 1] == '/')
		m->path[strlen(m->path) - 1] = '\0';
	if (find(mt.list, NULL, m->path) != NULL) {
		mount_free(m);
		return err_setn(err, EBUSY, q->path.data, q->path.len < 1024 ? q->path.len : 1023,
				"a mount at this path exists already");
	}
	uuid4(m->id);
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(m->created_at, sizeof(m->created_at), "%Y-%m-%dT%H:%M:%SZ", &tm);
	bool has_prefix = q->prefix != NULL && q->prefix[0] != '\0';
	m->bucket = strdup(q->bucket);
	m->prefix = has_prefix ? strdup(q->prefix) : NULL;
	m->endpoint = strdup(q->endpoint);
	m->read_only = q->has_read_only && q->read_only;
	m->state = SHIM__V1__MOUNT_STATE__MOUNT_STARTING;
	if (m->bucket == NULL || m->endpoint == NULL || (has_prefix && m->prefix == NULL)) {
		mount_free(m);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	s->timeout_ms = q->has_timeout_ms ? q->timeout_ms : MOUNT_DEFAULT_TIMEOUT_MS;
	s->deadline_ns = mono_ns() + (uint64_t)s->timeout_ms * 1000000u;
	s->plan = mount_plan_new(q, m->path, m->id, srv->cfg.state_dir, err);
	if (s->plan == NULL) {
		mount_free(m);
		return -1;
	}
	if (!mt.hook && init_at_shutdown(final_hook, NULL) == 0)
		mt.hook = true;
	m->next = mt.list;
	mt.list = m;
	mt.n++;
	m->start = s;
	s->m = m;
	op_run_job(op); /* PREPARE */
	return 0;
}

static void mount_cancel(struct op *op)
{
	struct mount_start *s = op->data;
	if (s->m != NULL) /* else final_hook has taken the mount */
		abort_starting(s);
}

static void mount_release(struct op *op)
{
	struct mount_start *s = op->data;
	if (s == NULL)
		return;
	ev_timer_stop(srv->loop, &s->wait_timer);
	struct mount *m = s->m;
	if (m != NULL) {
		/* the request went away while its mount was starting: the mount is
		 * abandoned, and removed without it (what PREPARE made included) */
		m->start = NULL;
		if (s->prepared && m->rundir[0] == '\0')
			take_prepared(m, s->plan);
		if (m->state == SHIM__V1__MOUNT_STATE__MOUNT_STARTING)
			abort_start(m);
	}
	if (s->plan != NULL) {
		mount_plan_free(s->plan);
		free(s->plan);
	}
	free(s);
}

/* ================================ unmount ================================ */

static void start_unmount(struct mount *m)
{
	m->unmount_wanted = false;
	m->state = SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING;
	m->detached = false;
	mjob_submit(m, PH_FLUSH);
}

static int unmount_begin(struct op *op, struct shim_err *err)
{
	const Shim__V1__UnmountRequest *u = op->req->unmount;
	char path[PATH_MAX];
	const char *id = u->id != NULL && u->id[0] != '\0' ? u->id : NULL;
	const char *p = NULL;
	if (u->has_path && u->path.len > 0) {
		if (u->path.len >= sizeof(path) || memchr(u->path.data, 0, u->path.len) != NULL)
			return err_set(err, EINVAL, NULL, "bad path");
		memcpy(path, u->path.data, u->path.len);
		path[u->path.len] = '\0';
		/* "/mnt/x/" names "/mnt/x" */
		while (u->path.len > 1 && strlen(path) > 1 && path[strlen(path) - 1] == '/')
			path[strlen(path) - 1] = '\0';
		p = path;
	}
	if ((id == NULL) == (p == NULL))
		return err_set(err, EINVAL, NULL, "give a mount id or a path (one of them)");
	struct mount *m = find(mt.list, id, p);
	if (m == NULL) {
		struct mount *g = find(mt.gone, id, p);
		if (g == NULL)
			return err_set(err, ENOENT, id != NULL ? id : p, "no such mount");
		reply_record(op, g); /* already unmounted: the same answer again */
		return 0;
	}
	if (m->state == SHIM__V1__MOUNT_STATE__MOUNT_STARTING || m->state == ST_ABORTING)
		return err_set(err, EBUSY, m->path, "the mount is still starting");
	struct waiter *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	w->op = op;
	w->m = m;
	w->next = m->waiters;
	m->waiters = w;
	op->data = w;
	if (m->state == SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING)
		return 0; /* joins the unmount under way */
	m->force = u->has_force && u->force;
	m->flush_ms = u->has_flush_timeout_ms ? u->flush_timeout_ms : MOUNT_DEFAULT_FLUSH_MS;
	if (m->flush_ms > MOUNT_MAX_TIMEOUT_MS)
		m->flush_ms = MOUNT_MAX_TIMEOUT_MS;
	if (m->job.busy)
		m->unmount_wanted = true; /* after the DEAD job */
	else
		start_unmount(m);
	return 0;
}

/* Answered or gone: a request that goes first leaves the unmount to go on. */
static void unmount_release(struct op *op)
{
	struct waiter *w = op->data;
	if (w == NULL)
		return;
	if (w->m != NULL) {
		for (struct waiter **p = &w->m->waiters; *p != NULL; p = &(*p)->next) {
			if (*p == w) {
				*p = w->next;
				break;
			}
		}
	}
	free(w);
}

/* ================================ list ================================ */

static int mounts_begin(struct op *op, struct shim_err *err)
{
	Shim__V1__MountRecord *cleanup_free recs = calloc(mt.n ? mt.n : 1, sizeof(*recs));
	Shim__V1__MountRecord **cleanup_free ptrs = calloc(mt.n ? mt.n : 1, sizeof(*ptrs));
	if (recs == NULL || ptrs == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	size_t n = 0;
	for (struct mount *m = mt.list; m != NULL; m = m->next) {
		fill_record(&recs[n], m);
		ptrs[n] = &recs[n];
		n++;
	}
	Shim__V1__MountList l = SHIM__V1__MOUNT_LIST__INIT;
	l.n_mounts = n;
	l.mounts = ptrs;
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_MOUNTS;
	res.mounts = &l;
	op_end(op, &res);
	return 0;
}

/* ================================ shutdown ================================ */

static void shutdown_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	if (mt.then == NULL)
		return;
	log_warn("shutdown: %u mount(s) not unmounted in time; going on (they are detached at exit)", mt.n);
	void (*then)(struct server *) = mt.then;
	mt.then = NULL;
	then(mt.srv);
}

bool op_mount_shutdown_begin(struct server *s, void (*then)(struct server *s))
{
	if (mt.n == 0)
		return false;
	log_info("shutdown: unmounting %u mount(s)", mt.n);
	mt.then = then;
	mt.srv = s;
	double bound = s->cfg.shutdown_timeout > 1 ? s->cfg.shutdown_timeout : 1;
	unsigned flush = (unsigned)(bound * 1000 / 2);
	for (struct mount *m = mt.list; m != NULL; m = m->next) {
		m->force = true;
		if (m->flush_ms == 0 || m->flush_ms > flush)
			m->flush_ms = flush;
		switch (m->state) {
		case SHIM__V1__MOUNT_STATE__MOUNT_STARTING:
			if (m->start != NULL)
				abort_starting(m->start);
			break;
		case SHIM__V1__MOUNT_STATE__MOUNT_LIVE:
		case SHIM__V1__MOUNT_STATE__MOUNT_FAILED:
			if (m->job.busy)
				m->unmount_wanted = true;
			else
				start_unmount(m);
			break;
		case SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING:
		case SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTED:
		default:
			break;
		}
	}
	ev_timer_init(&mt.shutdown_timer, shutdown_timeout_cb, bound, 0);
	ev_timer_start(s->loop, &mt.shutdown_timer);
	return true;
}

/* The job of m on a worker now, if any: its own, or its mount request's. */
static const struct work *job_in_flight(const struct mount *m)
{
	if (m->job.busy)
		return &m->job.work;
	if (m->start != NULL && m->start->op->jobs != NULL)
		return &m->start->op->jobs->work;
	return NULL;
}

static bool job_running(const struct work *w)
{
	return w != NULL && __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != WORK_FINISHED;
}

/* After the loop: whatever is left (a stuck unmount, a shutdown that timed out) is
 * detached and its files removed, here, synchronously. */
static void final_hook(void *ud)
{
	(void)ud;
	while (mt.list != NULL) {
		struct mount *m = mt.list;
		mt.list = m->next;
		mt.n--;
		/* a job still running (the loop ended as rclone exited, say): give it a
		 * moment; its done() will never run, so its work is finished here */
		const struct work *w = job_in_flight(m);
		for (int i = 0; i < 100 && job_running(w); i++) {
			struct timespec ts = {0, 50 * 1000000L};
			nanosleep(&ts, NULL);
		}
		if (job_running(w)) {
			/* stuck on a worker thread: leave its memory to it */
			log_warn("mount %s: still busy at exit; detaching %s", m->id, m->real);
			if (m->real[0] != '\0')
				umount2(m->real, MNT_DETACH | UMOUNT_NOFOLLOW);
			continue;
		}
		struct mount_start *s = m->start;
		if (s != NULL) {
			/* PREPARE finished but done() never ran: take its results */
			if (s->prepared && m->rundir[0] == '\0')
				take_prepared(m, s->plan);
			/* its op is freed later, by the connection's close, without the mount */
			s->m = NULL;
			m->start = NULL;
		}
		/* streams still open are cancelled later by the connection's close */
		while (m->waiters != NULL) {
			struct waiter *wt = m->waiters;
			m->waiters = wt->next;
			wt->m = NULL;
		}
		if (m->pid > 0)
			kill(m->pid, SIGKILL);
		if (m->real[0] != '\0') {
			if (m->tombstone)
				umount2(m->real, MNT_DETACH | UMOUNT_NOFOLLOW);
			mount_detach(m->real);
		}
		mount_remove_files(m->rundir, m->real, m->created_dir);
		log_info("mount %s: %s unmounted at exit", m->id, m->path);
		mount_free(m);
	}
	while (mt.gone != NULL) {
		struct mount *m = mt.gone;
		mt.gone = m->next;
		mount_free(m);
	}
	mt.n_gone = 0;
}

/* A mount request owns the start; the steps after it are the mount's own (above). */
const struct op_kind op_mount_kind = {SHIM__V1__REQUEST__KIND_MOUNT,
				      "mount",
				      0,
				      .start = mount_begin,
				      .job = prepare_job,
				      .job_done = prepare_done,
				      .cancel = mount_cancel,
				      .release = mount_release};
/* the table is the loop's: listed there and then */
const struct op_kind op_mounts_kind = {SHIM__V1__REQUEST__KIND_MOUNTS, "mounts", 0, .start = mounts_begin};
/* waits for the mount's unmount (or answers at once) */
const struct op_kind op_unmount_kind = {SHIM__V1__REQUEST__KIND_UNMOUNT, "unmount", 0, .start = unmount_begin,
					.release = unmount_release};
