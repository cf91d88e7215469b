/* budget.h: the daemon-wide bound on buffered bytes (--max-buffer), and the big buffers that count against it. */
#ifndef SHIM_BUDGET_H
#define SHIM_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

struct ev_loop;

/* The default --max-buffer: an eighth of a 512 MiB microVM. The shim protects itself
 * from the OOM killer, so what it buffers for slow or hostile clients is taken from
 * the workload; 64 MiB still gives a few dozen streams at full speed their read-ahead
 * (each needs about 1 MiB: a 256 KiB buffer or two and its connection's output). */
#define BUDGET_DEFAULT (64ul << 20)
#define BUDGET_MIN (4ul << 20)
/* What a connection may always hold, of each kind (output, its streams' buffers, their
 * state), whatever the others hold: a client that arrives while hoarders hold all the
 * rest is still served. The floors of the connections there are come off the shared
 * part (up to half the budget), so that the bound holds with up to
 * max / 6 / BUDGET_FLOOR of them (170 at the default); beyond that it is half the budget
 * plus their floors. */
#define BUDGET_FLOOR (64ul << 10)

/* Set the bound (bytes) and the loop. wake() runs from the loop once bytes come back
 * after budget_wait(); trim() gives back what its owner keeps spare, before the heap
 * is trimmed after a burst. Before budget_init() the bound is BUDGET_DEFAULT and
 * nobody is woken (unit tests, the fuzz harness). */
void budget_init(struct ev_loop *loop, size_t max, void (*wake)(void), void (*trim)(void));

/* How many of want bytes a holder that has `mine` (of one kind) already may add now,
 * with `holders` connections there: up to its floor always, beyond that what the shared
 * part has left. Less than min (and less than want) comes back as 0: the holder is to
 * wait for room (budget_wait). Nothing is taken: that is budget_take(). */
size_t budget_room(size_t mine, size_t want, size_t min, unsigned holders);
/* Count n bytes as held / given back. Taking always succeeds (control frames are
 * counted but never refused; they are bounded per connection). */
void budget_take(size_t n);
void budget_give(size_t n);
/* A holder was turned away by the budget: wake() is called once it has room again. */
void budget_wait(void);
/* Call wake() from the loop soon (its owner has given back room that someone waits for). */
void budget_wake_soon(void);

size_t budget_max(void);
size_t budget_used(void);

/* Buffers for what is counted: a buffer of BUDGET_MAP_MIN bytes or more is mmap'd, so
 * that it goes back to the system the moment it is freed instead of staying in a heap
 * that cannot shrink (or in a worker thread's arena); BUDGET_POOLED ones are kept in a
 * small pool of spares, for the streams that take and give back one again and again.
 * The caller counts them (budget_take/give). NULL on failure. */
#define BUDGET_MAP_MIN (64ul << 10)
#define BUDGET_POOLED (256ul << 10)
void *budget_alloc(size_t n);
void budget_free(void *p, size_t n);

#endif
