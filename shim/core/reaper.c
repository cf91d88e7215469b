/* reaper.c: SIGCHLD -> waitpid(-1) in one place -> the watcher registered for the pid.
 *
 * Why not ev_signal(SIGCHLD): libev's *default* loop starts its own SIGCHLD watcher
 * (for ev_child) at the highest priority, and that watcher calls waitpid(-1) itself:
 * every status would be collected there first and lost to us. So SIGCHLD gets our
 * own handler, which only wakes the loop through an ev_async (ev_async_send is
 * async-signal-safe); waitpid() then runs on the loop thread, here and nowhere else.
 * Installing the handler replaces libev's, so its watcher never runs. */
#include "reaper.h"
#include "log.h"

#include <errno.h>
#include <ev.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define REAPER_BUCKETS 256

struct watch {
	pid_t pid;
	reaper_fn fn;
	void *ud;
	struct watch *next;
};

static struct {
	struct ev_loop *loop;
	ev_async async;
	struct watch *buckets[REAPER_BUCKETS];
	bool ready;
} rp;

static struct watch **slot(pid_t pid)
{
	struct watch **w = &rp.buckets[(unsigned)pid % REAPER_BUCKETS];
	while (*w != NULL && (*w)->pid != pid)
		w = &(*w)->next;
	return w;
}

int reaper_watch(pid_t pid, reaper_fn fn, void *ud)
{
	struct watch **s = slot(pid);
	if (*s != NULL) {
		(*s)->fn = fn;
		(*s)->ud = ud;
		return 0;
	}
	struct watch *w = malloc(sizeof(*w));
	if (w == NULL) {
		errno = ENOMEM;
		return -1;
	}
	w->pid = pid;
	w->fn = fn;
	w->ud = ud;
	w->next = NULL;
	*s = w;
	return 0;
}

void reaper_unwatch(pid_t pid)
{
	struct watch **s = slot(pid);
	struct watch *w = *s;
	if (w == NULL)
		return;
	*s = w->next;
	free(w);
}

void reaper_poll(void)
{
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return; /* 0: children left but none exited; ECHILD: none at all */
		struct watch **s = slot(pid);
		struct watch *w = *s;
		if (w == NULL) {
			/* an orphan reparented to us (subreaper / PID 1), or a child whose
			 * owner stopped caring */
			log_debug("reaped pid %d (status 0x%x), not watched", (int)pid, (unsigned)status);
			continue;
		}
		/* unlink first: the callback may fork and watch a new child that got the
		 * same pid number */
		*s = w->next;
		reaper_fn fn = w->fn;
		void *ud = w->ud;
		free(w);
		fn(ud, pid, status);
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
