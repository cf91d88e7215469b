/* reaper.c: SIGCHLD -> waitpid(-1) in one place -> the watcher registered for the pid.
 *
 * Why not ev_signal(SIGCHLD): libev's *default* loop starts its own SIGCHLD watcher
 * (for ev_child) at the highest priority, and that watcher calls waitpid(-1) itself:
 * every status would be collected there first and lost to us. So SIGCHLD gets our
 * own handler, which only wakes the loop through an ev_async (ev_async_send is
 * async-signal-safe); waitpid() then runs on the loop thread, here and nowhere else.
 * Installing the handler replaces libev's, so its watcher never runs.
 *
 * A child may be reaped before anyone watches it: exec forks on a worker thread, and the
 * loop learns the pid only when the job is done, by which time a quick command may have
 * exited and been collected. So a status nobody watches is kept a while (a bounded ring:
 * REAPER_KEEP entries, REAPER_KEEP_NS old at most, so the orphans PID 1 reaps cannot grow
 * it), and reaper_watch_since() hands it over. The time of each reap tells a status of the
 * new child from one of an earlier process that had the same pid number: that one was
 * reaped before the fork could reuse its pid. */
#include "reaper.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <ev.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define REAPER_BUCKETS 256
#ifndef REAPER_KEEP
#define REAPER_KEEP 256
#endif
#define REAPER_KEEP_NS (30ull * 1000000000ull)

struct watch {
	pid_t pid;
	bool exited; /* status below is to be delivered at the next async_cb */
	int status;
	reaper_fn fn;
	void *ud;
	struct watch *next;
};

/* a status nobody watched when it was collected (pid 0: taken) */
struct kept {
	pid_t pid;
	int status;
	uint64_t at;
};

static struct {
	struct ev_loop *loop;
	ev_async async;
	struct watch *buckets[REAPER_BUCKETS];
	unsigned n_exited; /* watches with exited set */
	struct kept kept[REAPER_KEEP];
	unsigned kept_head, kept_n; /* the ring: oldest at kept_head */
	bool ready;
} rp;

static struct watch **slot(pid_t pid)
{
	struct watch **w = &rp.buckets[(unsigned)pid % REAPER_BUCKETS];
	while (*w != NULL && (*w)->pid != pid)
		w = &(*w)->next;
	return w;
}

static void kept_expire(uint64_t now)
{
	while (rp.kept_n > 0 && (rp.kept[rp.kept_head].pid == 0 || now - rp.kept[rp.kept_head].at > REAPER_KEEP_NS)) {
		rp.kept_head = (rp.kept_head + 1) % REAPER_KEEP;
		rp.kept_n--;
	}
}

static void kept_add(pid_t pid, int status, uint64_t now)
{
	kept_expire(now);
	if (rp.kept_n == REAPER_KEEP) { /* full: the oldest goes */
		log_debug("reaped pid %d (status 0x%x) dropped: %u unwatched statuses kept already",
			  (int)rp.kept[rp.kept_head].pid, (unsigned)rp.kept[rp.kept_head].status, REAPER_KEEP);
		rp.kept_head = (rp.kept_head + 1) % REAPER_KEEP;
		rp.kept_n--;
	}
	struct kept *k = &rp.kept[(rp.kept_head + rp.kept_n) % REAPER_KEEP];
	k->pid = pid;
	k->status = status;
	k->at = now;
	rp.kept_n++;
}

/* Take pid's kept status, if one was collected at or after since; older ones of that pid
 * (an earlier process with the same number) go. */
static bool kept_take(pid_t pid, uint64_t since, int *status)
{
	bool found = false;
	for (unsigned i = 0; i < rp.kept_n; i++) {
		struct kept *k = &rp.kept[(rp.kept_head + i) % REAPER_KEEP];
		if (k->pid != pid)
			continue;
		if (k->at >= since) {
			*status = k->status;
			found = true;
		}
		k->pid = 0;
	}
	kept_expire(mono_ns());
	return found;
}

int reaper_watch_since(pid_t pid, reaper_fn fn, void *ud, uint64_t since)
{
	struct watch **s = slot(pid);
	struct watch *w = *s;
	if (w == NULL) {
		if ((w = malloc(sizeof(*w))) == NULL) {
			errno = ENOMEM;
			return -1;
		}
		w->pid = pid;
		w->exited = false;
		w->next = NULL;
		*s = w;
	}
	w->fn = fn;
	w->ud = ud;
	if (!w->exited && kept_take(pid, since, &w->status)) {
		/* gone already: told from the loop, not from inside the caller */
		w->exited = true;
		rp.n_exited++;
		ev_async_send(rp.loop, &rp.async);
	}
	return 0;
}

int reaper_watch(pid_t pid, reaper_fn fn, void *ud)
{
	/* forked just now on the loop thread: nothing of this child was collected yet */
	return reaper_watch_since(pid, fn, ud, UINT64_MAX);
}

void reaper_unwatch(pid_t pid)
{
	struct watch **s = slot(pid);
	struct watch *w = *s;
	if (w == NULL)
		return;
	*s = w->next;
	if (w->exited)
		rp.n_exited--;
	free(w);
}

/* Unlink first: the callback may fork and watch a new child that got the same pid number. */
static void deliver(struct watch **s)
{
	struct watch *w = *s;
	*s = w->next;
	reaper_fn fn = w->fn;
	void *ud = w->ud;
	pid_t pid = w->pid;
	int status = w->status;
	if (w->exited)
		rp.n_exited--;
	free(w);
	fn(ud, pid, status);
}

/* the statuses reaper_watch_since() found kept */
static void deliver_exited(void)
{
	for (unsigned b = 0; b < REAPER_BUCKETS && rp.n_exited > 0; b++) {
		struct watch **s = &rp.buckets[b];
		while (*s != NULL) {
			if ((*s)->exited)
				deliver(s); /* *s is the next one now */
			else
				s = &(*s)->next;
		}
	}
}

void reaper_poll(void)
{
	if (rp.n_exited > 0)
		deliver_exited();
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return; /* 0: children left but none exited; ECHILD: none at all */
		struct watch **s = slot(pid);
		if (*s == NULL || (*s)->exited) {
			/* an orphan reparented to us (subreaper / PID 1), a child whose owner
			 * stopped caring, or one forked on a worker whose pid the loop does not
			 * know yet (exited set: a status of an earlier process of that pid
			 * number is still to be delivered; this one waits its turn) */
			log_debug("reaped pid %d (status 0x%x), not watched", (int)pid, (unsigned)status);
			kept_add(pid, status, mono_ns());
			continue;
		}
		(*s)->status = status;
		deliver(s);
	}
}

static void async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	reaper_poll();
}

static void sigchld_handler(int sig)
{
	(void)sig;
	int e = errno;
	if (rp.ready)
		ev_async_send(rp.loop, &rp.async);
	errno = e;
}

int reaper_init(struct ev_loop *loop)
{
	rp.loop = loop;
	ev_async_init(&rp.async, async_cb);
	ev_async_start(loop, &rp.async);
	ev_unref(loop); /* reaping alone does not keep the loop running */
	rp.ready = true;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = sigchld_handler;
	sigemptyset(&sa.sa_mask);
	/* stops and continues are of no interest; SA_RESTART keeps the loop's own
	 * syscalls from failing with EINTR */
	sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) {
		log_error("sigaction(SIGCHLD): %s", strerror(errno));
		return -1;
	}
	/* children that exited before the handler was in place */
	ev_async_send(loop, &rp.async);
	return 0;
}
