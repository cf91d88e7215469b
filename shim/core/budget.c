/* budget.c: the daemon-wide bound on buffered bytes: the count, waking who waits for room, memory given back after bursts. */
#include "budget.h"
#include "log.h"

#include <ev.h>
#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Waiting holders are woken once this much has come back since the last one was turned
 * away, not at every frame written: a wake-up visits every connection that has some. */
#define WAKE_GAP (64ul << 10)
/* After a burst (what is held has fallen to a quarter of its peak since the last trim,
 * and by TRIM_MIN at least), the heaps are trimmed TRIM_DELAY later: one malloc_trim
 * for a whole run of frees, none while a steady stream takes and gives back. */
#define TRIM_MIN (4ul << 20)
#define TRIM_DELAY 0.25
#define SPARE_MAX 8

static struct {
	struct ev_loop *loop;
	size_t max, used;
	size_t peak; /* since the last trim */
	bool starved;
	size_t starved_at; /* used, when the last holder was turned away */
	void (*wake)(void);
	void (*trim)(void);
	ev_timer wake_timer; /* 0 s: the next loop iteration (an ev_idle would starve under load) */
	ev_timer trim_timer;
	void *spare[SPARE_MAX]; /* BUDGET_POOLED buffers (loop thread only) */
	unsigned nspare;
} bg = {.max = BUDGET_DEFAULT};

static void wake_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	if (bg.wake != NULL)
		bg.wake();
}

static void trim_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)w;
	(void)revents;
	/* the expired timer is stopped already: take back budget_give()'s ev_unref */
	ev_ref(loop);
	if (bg.trim != NULL)
		bg.trim();
	while (bg.nspare > 0)
		munmap(bg.spare[--bg.nspare], BUDGET_POOLED);
	/* all arenas: buffers freed on the loop were often malloc'd on a worker */
	malloc_trim(0);
	log_debug("budget: heap trimmed after a burst (peak %zu kB, now %zu kB held)", bg.peak >> 10, bg.used >> 10);
	bg.peak = bg.used;
}

void budget_init(struct ev_loop *loop, size_t max, void (*wake)(void), void (*trim)(void))
{
	bg.loop = loop;
	bg.max = max < BUDGET_MIN ? BUDGET_MIN : max;
	bg.wake = wake;
	bg.trim = trim;
	ev_timer_init(&bg.wake_timer, wake_cb, 0, 0);
	ev_init(&bg.trim_timer, trim_cb);
	/* A fixed mmap threshold: glibc's moves up to the size of each big block freed
	 * (up to 32 MiB), after which buffers of that size come from the heap and stay
	 * resident when freed, in whichever thread's arena made them. Fixed, every block
	 * of 128 KiB or more is its own mapping and goes back to the system on free. */
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
}

size_t budget_room(size_t mine, size_t want, size_t min, unsigned holders)
{
	size_t floor_left = mine < BUDGET_FLOOR ? BUDGET_FLOOR - mine : 0;
	if (want <= floor_left)
		return want;
	/* three floors (output, buffers, state) for every connection, off the shared part */
	size_t floors = (size_t)holders * 3 * BUDGET_FLOOR;
	if (floors > bg.max / 2)
		floors = bg.max / 2;
	size_t shared = bg.max - floors;
	size_t avail = bg.used < shared ? shared - bg.used : 0;
	if (avail < floor_left)
		avail = floor_left;
	if (avail >= want)
		return want;
	return avail >= min ? avail : 0;
}

void budget_wake_soon(void)
{
	if (bg.loop != NULL && !ev_is_active(&bg.wake_timer))
		ev_timer_start(bg.loop, &bg.wake_timer);
}

void budget_take(size_t n)
{
	bg.used += n;
	if (bg.used > bg.peak)
		bg.peak = bg.used;
}

void budget_give(size_t n)
{
	bg.used = n < bg.used ? bg.used - n : 0;
	if (bg.loop == NULL)
		return;
	if (bg.starved && bg.used + WAKE_GAP <= bg.starved_at) {
		bg.starved = false;
		/* from the loop, not from here: a producer gives back in the middle of its
		 * own sending, and the waiting ones may be on the same connection */
		budget_wake_soon();
	}
	if (bg.peak - bg.used >= TRIM_MIN && bg.used <= bg.peak / 4 && !ev_is_active(&bg.trim_timer)) {
		ev_timer_set(&bg.trim_timer, TRIM_DELAY, 0);
		ev_timer_start(bg.loop, &bg.trim_timer);
		/* the trim is no reason to keep the loop (or a shutdown) going */
		ev_unref(bg.loop);
	}
}

void budget_wait(void)
{
	bg.starved = true;
	bg.starved_at = bg.used;
}

size_t budget_max(void)
{
	return bg.max;
}

size_t budget_used(void)
{
	return bg.used;
}

void *budget_alloc(size_t n)
{
	if (n == BUDGET_POOLED && bg.nspare > 0)
		return bg.spare[--bg.nspare];
	if (n < BUDGET_MAP_MIN)
		return malloc(n);
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

void budget_free(void *p, size_t n)
{
	if (p == NULL)
		return;
	if (n == BUDGET_POOLED && bg.nspare < SPARE_MAX) {
		bg.spare[bg.nspare++] = p;
		return;
	}
	if (n < BUDGET_MAP_MIN)
		free(p);
	else
		munmap(p, n);
}
