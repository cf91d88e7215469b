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
 */

enum phase { PH_NONE, PH_PREPARE, PH_WAIT, PH_DEAD, PH_FLUSH, PH_DETACH, PH_CLEANUP };
/* internal states beyond the protocol's */
#define ST_ABORTING 100

#define STOP_WAIT 3.0       /* after the unmount: time for rclone to exit by itself, then TERM, then KILL */
#define GONE_KEEP 32        /* unmounted records kept for idempotent unmounts */
#define FUSERMOUNT_WAIT 5.0 /* fusermount3 -u: then it is killed and the mount detached lazily */

struct waiter {
	struct waiter *next;
	struct stream *st;
	struct mount *m;
};

struct mount {
	struct mount *next;
	char id[40];
	char created_at[32];
	char *bucket, *prefix, *endpoint;
	char path[PATH_MAX];   /* as the client gave it */
	char real[PATH_MAX];   /* the mount point in our namespace */
	char rundir[PATH_MAX]; /* config, log, cache */
	bool read_only, created_dir, tombstone;
	int state; /* SHIM__V1__MOUNT_STATE__* or ST_ABORTING */
	pid_t pid; /* rclone; 0 once reaped */
	int status;
	bool exited; /* atomic: read by the WAIT job */
	bool abort;  /* atomic: the request is gone, or shutdown */
	char error[256];
	unsigned timeout_ms;
	struct stream *st; /* the mount request, until answered */
	struct shim_err fail;
	/* the one worker job */
	struct work work;
	enum phase phase;
	bool busy;
	struct mount_plan *plan;
	int job_rc;
	struct shim_err job_err;
	char job_tail[160]; /* + 80 + 10 fits an error message */
	pid_t job_pid;      /* rclone's pid as the job starts */
	/* unmount */
	struct waiter *waiters;
	bool unmount_wanted, force;
	unsigned flush_ms;
	int kill_stage;
	ev_timer timer;
	char fusermount[PATH_MAX];
	pid_t fm_pid; /* fusermount3 -u, while it runs */
	int fm_log;   /* its stderr: rclone's log */
	int lock_fd;  /* the runtime dir's flock (mount_sweep), until CLEANUP removed it */
	ev_timer fm_timer;
	bool detached; /* unmount: the mount is off the path; rclone may go */
	/* starting: the preflight (rclone lsf), and the deadline of the whole start */
	pid_t pf_pid;
	bool pf_timed_out;
	uint64_t deadline_ns;
	ev_timer wait_timer;
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

static void job_submit(struct mount *m, enum phase ph);
static void start_unmount(struct mount *m);
static void abort_start(struct mount *m);
static void rclone_exited(void *ud, pid_t pid, int status);

unsigned op_mount_count(void)
{
	return mt.n;
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

static void reply_record(struct stream *st, const struct mount *m)
{
	Shim__V1__MountRecord r;
	fill_record(&r, m);
	Shim__V1__Result res = SHIM__V1__RESULT__INIT;
	res.kind_case = SHIM__V1__RESULT__KIND_MOUNT;
	res.mount = &r;
	op_end_stream(st, &res);
}

/* ================================ table ================================ */

static void mount_free(struct mount *m)
{
	ev_timer_stop(srv->loop, &m->timer);
	ev_timer_stop(srv->loop, &m->fm_timer);
	ev_timer_stop(srv->loop, &m->wait_timer);
	if (m->fm_log >= 0)
		close(m->fm_log);
	if (m->lock_fd >= 0)
		close(m->lock_fd);
	if (m->plan != NULL) {
		mount_plan_free(m->plan);
		free(m->plan);
	}
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
		if (!m->busy)
			job_submit(m, PH_CLEANUP);
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
		if (!m->busy)
			job_submit(m, PH_DEAD);
		break;
	case ST_ABORTING:
		if (!m->busy)
			job_submit(m, PH_CLEANUP);
		break;
	case SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING:
		/* before the mount is off the path, the unmount steps go on; they end in
		 * CLEANUP themselves */
		if (m->detached && !m->busy)
			job_submit(m, PH_CLEANUP);
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
	job_submit(m, PH_DETACH); /* does nothing if fusermount3 has unmounted it */
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

/* ================================ jobs ================================ */

static unsigned remaining_ms(const struct mount *m)
{
	uint64_t now = mono_ns();
	return now >= m->deadline_ns ? 100 : (unsigned)((m->deadline_ns - now) / 1000000u) + 1;
}

static void job_run(struct work *w)
{
	struct mount *m = container_of(w, struct mount, work);
	m->job_rc = 0;
	switch (m->phase) {
	case PH_PREPARE:
		m->job_rc = mount_prepare(m->plan, m->timeout_ms, &m->job_err);
		break;
	case PH_WAIT:
		mount_record_pid(m->rundir, m->job_pid);
		m->job_rc = mount_wait_live(m->real, &m->exited, &m->abort, remaining_ms(m), &m->job_err);
		break;
	case PH_DEAD:
		/* the FUSE connection is gone: cover the path (read-only), detach it */
		if (mount_tombstone(m->real) == 0)
			m->job_rc = 1;
		else
			mount_detach(m->real);
		mount_log_tail(m->rundir, m->job_tail, sizeof(m->job_tail));
		break;
	case PH_FLUSH: {
		if (!m->tombstone && m->flush_ms > 0) {
			/* pending uploads first: after the unmount rclone would drop them */
			uint64_t end = mono_ns() + (uint64_t)m->flush_ms * 1000000u;
			unsigned dirty, clean_scans = 0;
			/* two clean looks 50 ms apart: a close that is still on its way to
			 * rclone shows up in between */
			for (;;) {
				dirty = mount_dirty_count(m->rundir, m->job_pid);
				clean_scans = dirty == 0 ? clean_scans + 1 : 0;
				if (clean_scans >= 2 || mono_ns() >= end ||
				    __atomic_load_n(&m->exited, __ATOMIC_ACQUIRE))
					break;
				struct timespec ts = {0, 50 * 1000000L};
				nanosleep(&ts, NULL);
			}
			if (dirty > 0 && !m->force && !__atomic_load_n(&m->exited, __ATOMIC_ACQUIRE)) {
				m->job_rc = err_set(
					&m->job_err, ETIMEDOUT, m->path,
					"%u file(s) still uploading after %u ms; unmount again later, or with force",
					dirty, m->flush_ms);
				break;
			}
			if (dirty > 0)
				log_warn("mount %s: unmounting with %u file(s) not uploaded", m->id, dirty);
		}
		if (!m->tombstone && mount_is_fuse(m->real)) {
			m->job_rc = 1; /* fusermount3 -u next, from the loop */
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
			mount_log_tail(m->rundir, m->job_tail, sizeof(m->job_tail));
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

static void finish_start_failure(struct mount *m)
{
	if (m->st != NULL) {
		struct shim_err e = m->fail;
		if (m->job_tail[0] != '\0') {
			/* rclone's own words decide the errno when they are clear */
			e.code = mount_classify(m->job_tail, e.code);
			/* the fail message is short; rclone's words get the rest of the room */
			snprintf(e.msg, sizeof(e.msg), "%.80s; rclone: %s", m->fail.msg, m->job_tail);
		}
		log_info("mount %s of %s at %s failed: %s", m->id, m->bucket, m->path, e.msg);
		struct stream *st = m->st;
		m->st = NULL;
		stream_fail(st, &e);
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
		w->st->op_data = NULL;
		if (e != NULL)
			stream_fail(w->st, e);
		else
			reply_record(w->st, m);
		free(w);
	}
}

/* the WAIT failed or the request went away: stop rclone, then CLEANUP */
static void abort_start(struct mount *m)
{
	m->state = ST_ABORTING;
	if (m->pid > 0)
		stop_rclone(m, true);
	else
		job_submit(m, PH_CLEANUP);
}

static void arm_deadline(struct mount *m, double extra)
{
	ev_timer_stop(srv->loop, &m->wait_timer);
	ev_timer_set(&m->wait_timer, remaining_ms(m) / 1000.0 + extra, 0);
	ev_timer_start(srv->loop, &m->wait_timer);
}

/* The preflight passed: start rclone mount and wait until it is live. */
static void start_rclone(struct mount *m)
{
	struct mount_plan *pl = m->plan;
	pid_t pid = mount_spawn(pl->rclone, pl->argv, pl->envp, pl->log_fd, pl->mp_fd, pl->rundir, &m->fail);
	if (pid > 0 && reaper_watch(pid, rclone_exited, m) < 0) {
		kill(pid, SIGKILL);
		err_set(&m->fail, ENOMEM, NULL, "out of memory");
		pid = -1; /* its status is dropped by the reaper */
	}
	/* the secrets leave our memory: rclone has its config file */
	mount_plan_free(pl);
	free(pl);
	m->plan = NULL;
	if (pid < 0) {
		abort_start(m);
		return;
	}
	m->pid = pid;
	log_debug("mount %s: rclone %d started for %s at %s", m->id, (int)pid, m->bucket, m->real);
	job_submit(m, PH_WAIT);
	/* a listing stuck in the kernel returns once rclone is gone: the timer kills it */
	arm_deadline(m, 1.0);
}

static void pf_exited(void *ud, pid_t pid, int status)
{
	struct mount *m = ud;
	(void)pid;
	m->pf_pid = 0;
	ev_timer_stop(srv->loop, &m->wait_timer);
	if (__atomic_load_n(&m->abort, __ATOMIC_ACQUIRE)) {
		err_set(&m->fail, ECANCELED, NULL, "cancelled");
		abort_start(m);
		return;
	}
	if (m->pf_timed_out) {
		err_set(&m->fail, ETIMEDOUT, NULL, "no answer from the S3 server within %u ms", m->timeout_ms);
		abort_start(m);
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		start_rclone(m);
		return;
	}
	/* 3: "directory not found", rclone's word for a 404 to the listing, which S3 gives
	 * only for a bucket that does not exist (a prefix with nothing under it lists
	 * empty). It must fail here: rclone mount would start all the same, show an
	 * empty directory and pass the liveness check. */
	if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
		err_set(&m->fail, ENOENT, m->bucket, "bucket %s does not exist", m->bucket);
		abort_start(m);
		return;
	}
	char what[96];
	describe_exit(what, sizeof(what), status);
	err_set(&m->fail, EIO, NULL, "cannot list the bucket (%s)", what);
	abort_start(m);
}

static void start_preflight(struct mount *m)
{
	struct mount_plan *pl = m->plan;
	pid_t pid = mount_spawn(pl->rclone, pl->pf_argv, pl->envp, pl->log_fd, -1, pl->rundir, &m->fail);
	if (pid > 0 && reaper_watch(pid, pf_exited, m) < 0) {
		kill(pid, SIGKILL);
		err_set(&m->fail, ENOMEM, NULL, "out of memory");
		pid = -1;
	}
	if (pid < 0) {
		abort_start(m);
		return;
	}
	m->pf_pid = pid;
	arm_deadline(m, 0);
}

/* The start's deadline passed (or it was cancelled): a preflight still running is
 * killed; a liveness check stuck in the kernel is freed by killing rclone. */
static void wait_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct mount *m = container_of(w, struct mount, wait_timer);
	if (m->pf_pid > 0) {
		m->pf_timed_out = true;
		kill(-m->pf_pid, SIGKILL);
		kill(m->pf_pid, SIGKILL);
	} else if (m->busy && m->phase == PH_WAIT && m->pid > 0) {
		log_info("mount %s: the mount does not answer; killing rclone %d", m->id, (int)m->pid);
		__atomic_store_n(&m->abort, true, __ATOMIC_RELEASE);
		kill(-m->pid, SIGKILL);
		kill(m->pid, SIGKILL);
	}
}

/* cancel or shutdown while starting */
static void abort_starting(struct mount *m)
{
	__atomic_store_n(&m->abort, true, __ATOMIC_RELEASE);
	ev_timer_stop(srv->loop, &m->wait_timer);
	if (m->pf_pid > 0) {
		ev_timer_set(&m->wait_timer, 0, 0);
		ev_timer_start(srv->loop, &m->wait_timer);
	} else if (m->busy && m->phase == PH_WAIT) {
		/* the WAIT job sees the flag within 100 ms, unless stuck in the kernel */
		ev_timer_set(&m->wait_timer, 0.5, 0);
		ev_timer_start(srv->loop, &m->wait_timer);
	}
}

static void job_done(struct work *w)
{
	struct mount *m = container_of(w, struct mount, work);
	m->busy = false;
	enum phase ph = m->phase;
	m->phase = PH_NONE;
	switch (ph) {
	case PH_PREPARE: {
		struct mount_plan *pl = m->plan;
		snprintf(m->real, sizeof(m->real), "%s", pl->real);
		snprintf(m->rundir, sizeof(m->rundir), "%s", pl->rundir);
		m->created_dir = pl->created_dir;
		snprintf(m->fusermount, sizeof(m->fusermount), "%s", pl->fusermount);
		m->lock_fd = pl->lock_fd;
		pl->lock_fd = -1;
		if (m->job_rc < 0) {
			m->fail = m->job_err;
			finish_start_failure(m); /* prepare left nothing behind */
			return;
		}
		if (__atomic_load_n(&m->abort, __ATOMIC_ACQUIRE)) {
			err_set(&m->fail, ECANCELED, NULL, "cancelled");
			abort_start(m);
			return;
		}
		start_preflight(m);
		return;
	}
	case PH_WAIT:
		ev_timer_stop(srv->loop, &m->wait_timer);
		if (m->job_rc == 0 && m->st != NULL && !__atomic_load_n(&m->abort, __ATOMIC_ACQUIRE)) {
			m->state = SHIM__V1__MOUNT_STATE__MOUNT_LIVE;
			log_info("mount %s: %s%s%s live at %s (rclone %d)", m->id, m->bucket, m->prefix ? "/" : "",
				 m->prefix ? m->prefix : "", m->path, (int)m->pid);
			struct stream *st = m->st;
			m->st = NULL;
			reply_record(st, m);
			if (m->pid <= 0) /* died right after the check */
				rclone_exited(m, 0, m->status);
			else if (m->unmount_wanted)
				start_unmount(m);
			return;
		}
		if (m->job_rc == 0) {
			err_set(&m->fail, ECANCELED, NULL, "cancelled");
		} else if (m->pid <= 0 && m->job_err.code == EIO) {
			char what[96];
			describe_exit(what, sizeof(what), m->status);
			err_set(&m->fail, EIO, NULL, "%s before the mount was live", what);
		} else {
			m->fail = m->job_err;
		}
		abort_start(m);
		return;
	case PH_DEAD:
		if (m->job_rc == 1)
			m->tombstone = true;
		if (m->job_tail[0] != '\0') {
			char what[96];
			snprintf(what, sizeof(what), "%.80s", m->error);
			snprintf(m->error, sizeof(m->error), "%.80s; rclone: %s", what, m->job_tail);
		}
		if (m->unmount_wanted)
			start_unmount(m);
		return;
	case PH_FLUSH:
		if (m->job_rc < 0) {
			/* uploads still pending: the mount stays as it was */
			m->state = m->pid > 0 ? SHIM__V1__MOUNT_STATE__MOUNT_LIVE : SHIM__V1__MOUNT_STATE__MOUNT_FAILED;
			end_waiters(m, &m->job_err);
			if (m->pid <= 0)
				rclone_exited(m, 0, m->status);
			return;
		}
		if (m->job_rc == 1)
			start_fusermount(m);
		else
			job_submit(m, PH_DETACH);
		return;
	case PH_DETACH:
		m->detached = true;
		if (m->pid > 0)
			stop_rclone(m, false); /* it exits by itself once unmounted; CLEANUP then */
		else
			job_submit(m, PH_CLEANUP);
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

static void job_submit(struct mount *m, enum phase ph)
{
	m->phase = ph;
	m->busy = true;
	m->job_pid = m->pid;
	m->job_tail[0] = '\0';
	memset(&m->work, 0, sizeof(m->work));
	m->work.run = job_run;
	m->work.done = job_done;
	worker_submit(&m->work);
}

/* ================================ unmount ================================ */

static void start_unmount(struct mount *m)
{
	m->unmount_wanted = false;
	m->state = SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING;
	m->detached = false;
	job_submit(m, PH_FLUSH);
}

static void waiter_cancel(struct stream *st)
{
	struct waiter *w = st->op_data;
	if (w == NULL)
		return;
	for (struct waiter **p = &w->m->waiters; *p != NULL; p = &(*p)->next) {
		if (*p == w) {
			*p = w->next;
			break;
		}
	}
	free(w);
}

static const struct stream_ops waiter_ops = {.cancel = waiter_cancel};

int op_unmount(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	const Shim__V1__UnmountRequest *u = req->unmount;
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
		reply_record(st, g); /* already unmounted: the same answer again */
		return 0;
	}
	if (m->state == SHIM__V1__MOUNT_STATE__MOUNT_STARTING || m->state == ST_ABORTING)
		return err_set(err, EBUSY, m->path, "the mount is still starting");
	struct waiter *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	w->st = st;
	w->m = m;
	w->next = m->waiters;
	m->waiters = w;
	st->ops = &waiter_ops;
	st->op_data = w;
	if (m->state == SHIM__V1__MOUNT_STATE__MOUNT_UNMOUNTING)
		return 0; /* joins the unmount under way */
	m->force = u->has_force && u->force;
	m->flush_ms = u->has_flush_timeout_ms ? u->flush_timeout_ms : MOUNT_DEFAULT_FLUSH_MS;
	if (m->flush_ms > MOUNT_MAX_TIMEOUT_MS)
		m->flush_ms = MOUNT_MAX_TIMEOUT_MS;
	if (m->busy)
		m->unmount_wanted = true; /* after the DEAD job */
	else
		start_unmount(m);
	return 0;
}

/* ================================ list ================================ */

int op_mounts(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	(void)req;
	Shim__V1__MountRecord *recs = calloc(mt.n ? mt.n : 1, sizeof(*recs));
	Shim__V1__MountRecord **ptrs = calloc(mt.n ? mt.n : 1, sizeof(*ptrs));
	if (recs == NULL || ptrs == NULL) {
		free(recs);
		free(ptrs);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
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
	op_end_stream(st, &res);
	free(recs);
	free(ptrs);
	return 0;
}

/* ================================ mount ================================ */

static void mount_stream_cancel(struct stream *st)
{
	struct mount *m = st->op_data;
	if (m == NULL)
		return;
	m->st = NULL;
	abort_starting(m);
}

static const struct stream_ops mount_ops = {.cancel = mount_stream_cancel};

static void final_hook(void *ud);

int op_mount(struct stream *st, const Shim__V1__Request *req, struct shim_err *err)
{
	const Shim__V1__MountRequest *q = req->mount;
	/* cheap checks first, here; the filesystem ones on the worker */
	if (mount_check_request(q, err) < 0)
		return -1;
	if (mt.n >= MOUNT_MAX)
		return err_set(err, EMFILE, NULL, "too many mounts (at most %d)", MOUNT_MAX);

	struct mount *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	m->fm_log = -1;
	m->lock_fd = -1;
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
	m->timeout_ms = q->has_timeout_ms ? q->timeout_ms : MOUNT_DEFAULT_TIMEOUT_MS;
	m->deadline_ns = mono_ns() + (uint64_t)m->timeout_ms * 1000000u;
	m->state = SHIM__V1__MOUNT_STATE__MOUNT_STARTING;
	ev_init(&m->timer, stop_timer_cb);
	ev_init(&m->fm_timer, fm_timer_cb);
	ev_init(&m->wait_timer, wait_timer_cb);
	if (m->bucket == NULL || m->endpoint == NULL || (has_prefix && m->prefix == NULL)) {
		mount_free(m);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	m->plan = mount_plan_new(q, m->path, m->id, srv->cfg.state_dir, err);
	if (m->plan == NULL) {
		mount_free(m);
		return -1;
	}
	if (!mt.hook && init_at_shutdown(final_hook, NULL) == 0)
		mt.hook = true;
	m->next = mt.list;
	mt.list = m;
	mt.n++;
	m->st = st;
	st->ops = &mount_ops;
	st->op_data = m;
	job_submit(m, PH_PREPARE);
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
			abort_starting(m);
			break;
		case SHIM__V1__MOUNT_STATE__MOUNT_LIVE:
		case SHIM__V1__MOUNT_STATE__MOUNT_FAILED:
			if (m->busy)
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
		for (int i = 0;
		     i < 100 && m->busy && __atomic_load_n(&m->work.state, __ATOMIC_ACQUIRE) != WORK_FINISHED; i++) {
			struct timespec ts = {0, 50 * 1000000L};
			nanosleep(&ts, NULL);
		}
		if (m->busy && __atomic_load_n(&m->work.state, __ATOMIC_ACQUIRE) != WORK_FINISHED) {
			/* stuck on a worker thread: leave its memory to it */
			log_warn("mount %s: still busy at exit; detaching %s", m->id, m->real);
			if (m->real[0] != '\0')
				umount2(m->real, MNT_DETACH | UMOUNT_NOFOLLOW);
			continue;
		}
		if (m->plan != NULL && m->rundir[0] == '\0') {
			/* PREPARE finished but done() never ran: take its results */
			snprintf(m->real, sizeof(m->real), "%s", m->plan->real);
			snprintf(m->rundir, sizeof(m->rundir), "%s", m->plan->rundir);
			m->created_dir = m->plan->created_dir;
		}
		/* streams still open are cancelled later by the connection's close */
		while (m->waiters != NULL) {
			struct waiter *w = m->waiters;
			m->waiters = w->next;
			w->st->op_data = NULL;
			free(w);
		}
		if (m->st != NULL)
			m->st->op_data = NULL;
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

/* not moved onto struct op yet: each takes its stream over itself */
const struct op_kind op_mount_kind = {SHIM__V1__REQUEST__KIND_MOUNT, "mount", 0, .legacy = op_mount};
const struct op_kind op_mounts_kind = {SHIM__V1__REQUEST__KIND_MOUNTS, "mounts", 0, .legacy = op_mounts};
const struct op_kind op_unmount_kind = {SHIM__V1__REQUEST__KIND_UNMOUNT, "unmount", 0, .legacy = op_unmount};
