/* op_fs_watch.c: inotify watches streamed as delimited WatchEvent messages. */
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "fs.h"
#include "fs_walk.h"
#include "log.h"
#include "op.h"
#include "ops.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

/*
 * One inotify instance per watch stream. Its fd is non-blocking and read on the loop
 * (reading queued events never waits on a filesystem). Everything that resolves a
 * path runs on a worker: creating the instance and the first watch, the initial
 * recursive walk, and adding watches for directories that appear later (-r). While
 * such a job runs the loop stops reading the inotify fd (the kernel queues events),
 * so the wd -> path map is only ever touched by one thread at a time and every event
 * read afterwards belongs to a known watch.
 *
 * Output: the DATA bytes are a stream of WatchEvent messages, each preceded by its
 * length as a varint; an event may be split across DATA frames. Events wait in a
 * bounded queue (WATCH_Q_EVENTS events or WATCH_Q_BYTES bytes) until the client's
 * credit lets them go. When it is full, events are dropped and a single OVERFLOW is
 * queued as soon as there is room again; the kernel's own overflow (IN_Q_OVERFLOW)
 * is reported the same way. Consecutive identical MODIFY events that have not been
 * sent yet are coalesced.
 *
 * Paths are absolute, as the client named them (the watched path without trailing
 * slashes, then the names below it). With -r, a directory created later gets its
 * watch from a worker; entries created in it before the watch was in place are
 * reported as CREATE events found by that worker's scan (a file may then be reported
 * twice, never missed). A directory moved within the tree keeps its watches under
 * its new path; one moved out loses them; one moved in gets watches (no events for
 * what it holds). A directory that cannot be watched later (permissions, the
 * inotify watch limit) makes the stream report OVERFLOW: events may be missing.
 *
 * Caps: a stream holds at most max_watches inotify watches (the request's, at most
 * the daemon's --max-watches, default 8192), and every stream together at most
 * --max-watches-total (default 65536), counted exactly (a reservation before each
 * inotify_add_watch, any thread). A recursive watch that reaches either sends one
 * OVERFLOW and stops adding watches: the rest of the tree, and directories made
 * later, go unwatched for the life of the stream (events there are missed). A new
 * watch whose first watch finds the daemon's total used up fails with ENOSPC.
 *
 * The stream ends on cancel, or when the watched path itself goes away: DELETE_SELF,
 * then DATA FIN and END Result.done. A move of the watched path itself is not
 * reported (the watch follows the inode; paths keep the old name).
 */

#define WATCH_MASK                                                                                                     \
	(IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | \
	 IN_EXCL_UNLINK)
#define WATCH_Q_EVENTS 4096
#define WATCH_Q_BYTES (1u << 20)
#define WATCH_BUCKETS 256
#define WATCH_TODO_MAX 4096
#define WATCH_MOVES_MAX 64
#define WATCH_MAX_LEVELS 256
#define WATCH_READ_ROUNDS 16

/* A level of a walk (fs_walk.h): the directory's absolute path. */
struct wlevel {
	char *path;
	size_t len;
};

/* wd -> absolute path */
struct wnode {
	struct wnode *next;
	int wd;
	size_t len;
	char path[];
};

/* a directory to watch (loop -> job) */
struct todo {
	struct todo *next;
	bool created; /* IN_CREATE: report what it already holds */
	size_t len;
	char path[];
};

struct move {
	uint32_t cookie;
	size_t len;
	char *path;
};

/* While the op's job (op->job) is queued or running, the loop leaves the map and the
 * inotify fd alone. */
struct watcher {
	struct op *op;
	struct ev_loop *loop;
	ev_io io;
	int ifd;
	bool started; /* the first job succeeded */
	bool ending;  /* the watched path is gone: finish once the queue is sent */
	bool recursive;
	bool root_is_dir;
	int root_wd;
	struct fs_path path;
	size_t root_len; /* path.abs without trailing slashes ("/" stays "/") */

	struct wnode *map[WATCH_BUCKETS];
	unsigned nwatch;
	unsigned max_watches, max_total; /* this stream's cap, and the daemon's */
	bool capped;                     /* a cap was reached: no more watches are added */
	struct todo *todo, *todo_tail;   /* collected by the loop */
	unsigned ntodo;
	struct todo *jobs; /* taken by the running job */

	/* found by a job, queued by done(): records of {u8 is_dir, u32 len, path} */
	uint8_t *syn;
	size_t syn_len, syn_cap;
	bool syn_overflow;

	struct move moves[WATCH_MOVES_MAX];
	unsigned nmoves;

	/* the event queue: bytes q[qoff, qlen) not sent yet; offsets in ends[] and
	 * last_start count from the start of the stream (qbase is q[0]'s) */
	uint8_t *q;
	size_t qcap, qoff, qlen;
	uint64_t qbase;
	uint64_t ends[WATCH_Q_EVENTS];
	unsigned ehead, ecount;
	uint64_t last_start;
	size_t last_len;
	bool last_modify;
	bool overflow; /* events were dropped and OVERFLOW is not queued yet */

	char *scratch;
	size_t scratch_cap;
};

/* ---- the wd map ---- */

static struct wnode **map_slot(struct watcher *w, int wd)
{
	struct wnode **pp = &w->map[(unsigned)wd % WATCH_BUCKETS];
	while (*pp != NULL && (*pp)->wd != wd)
		pp = &(*pp)->next;
	return pp;
}

static struct wnode *map_get(struct watcher *w, int wd)
{
	return *map_slot(w, wd);
}

/* Watches of every stream together (reserved before inotify_add_watch, by workers
 * and released on the loop: atomic). */
static unsigned watch_total;

/* Room for one more watch under both caps: reserves it in watch_total. */
static bool watch_reserve(struct watcher *w)
{
	if (w->nwatch >= w->max_watches)
		return false;
	unsigned cur = __atomic_load_n(&watch_total, __ATOMIC_RELAXED);
	do {
		if (cur >= w->max_total)
			return false;
	} while (!__atomic_compare_exchange_n(&watch_total, &cur, cur + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return true;
}

static void watch_release(unsigned n)
{
	__atomic_sub_fetch(&watch_total, n, __ATOMIC_RELAXED);
}

/* Set wd's path (a wd seen again, e.g. a directory moved back in, gets the new path).
 * 1: a new watch (its reservation is kept), 0: a known wd (the reservation given back
 * by the caller), -1: ENOMEM. */
static int map_put(struct watcher *w, int wd, const char *path, size_t len)
{
	struct wnode *n = malloc(sizeof(*n) + len + 1);
	if (n == NULL)
		return -1;
	n->wd = wd;
	n->len = len;
	memcpy(n->path, path, len);
	n->path[len] = '\0';
	struct wnode **pp = map_slot(w, wd);
	int fresh = *pp == NULL;
	if (*pp != NULL) {
		n->next = (*pp)->next;
		free(*pp);
	} else {
		n->next = NULL;
		w->nwatch++;
	}
	*pp = n;
	return fresh;
}

static void map_del(struct watcher *w, int wd)
{
	struct wnode **pp = map_slot(w, wd);
	if (*pp == NULL)
		return;
	struct wnode *n = *pp;
	*pp = n->next;
	free(n);
	w->nwatch--;
	watch_release(1);
}

static bool under(const char *path, size_t len, const char *dir, size_t dlen)
{
	return len >= dlen && memcmp(path, dir, dlen) == 0 && (len == dlen || path[dlen] == '/');
}

/* A directory moved from old to new within the tree: its watches (and those below
 * it) now have new paths. */
static void map_rename(struct watcher *w, const char *old, size_t olen, const char *new, size_t nlen)
{
	for (unsigned b = 0; b < WATCH_BUCKETS; b++) {
		for (struct wnode **pp = &w->map[b]; *pp != NULL; pp = &(*pp)->next) {
			struct wnode *o = *pp;
			if (!under(o->path, o->len, old, olen))
				continue;
			size_t len = nlen + (o->len - olen);
			struct wnode *n = malloc(sizeof(*n) + len + 1);
			if (n == NULL)
				continue; /* keeps the stale path: events still flow */
			n->wd = o->wd;
			n->len = len;
			n->next = o->next;
			memcpy(n->path, new, nlen);
			memcpy(n->path + nlen, o->path + olen, o->len - olen);
			n->path[len] = '\0';
			*pp = n;
			free(o);
		}
	}
}

/* A directory moved out of the tree: stop watching it and what is below it.
 * inotify_rm_watch does no path lookup: fine on the loop. */
static void map_remove_tree(struct watcher *w, const char *dir, size_t dlen)
{
	for (unsigned b = 0; b < WATCH_BUCKETS; b++) {
		for (struct wnode **pp = &w->map[b]; *pp != NULL;) {
			struct wnode *o = *pp;
			if (o->wd == w->root_wd || !under(o->path, o->len, dir, dlen)) {
				pp = &o->next;
				continue;
			}
			inotify_rm_watch(w->ifd, o->wd);
			*pp = o->next;
			free(o);
			w->nwatch--;
			watch_release(1);
		}
	}
}

/* ---- the event queue ---- */

static void q_drop_sent(struct watcher *w)
{
	uint64_t sent = w->qbase + w->qoff;
	while (w->ecount > 0 && w->ends[w->ehead] <= sent) {
		w->ehead = (w->ehead + 1) % WATCH_Q_EVENTS;
		w->ecount--;
	}
	if (w->qoff == w->qlen) {
		w->qbase += w->qlen;
		w->qoff = w->qlen = 0;
	}
}

static int q_reserve(struct watcher *w, size_t n)
{
	if (w->qlen + n <= w->qcap)
		return 0;
	if (w->qoff > 0) {
		memmove(w->q, w->q + w->qoff, w->qlen - w->qoff);
		w->qbase += w->qoff;
		w->qlen -= w->qoff;
		w->qoff = 0;
	}
	if (w->qlen + n <= w->qcap)
		return 0;
	size_t cap = w->qcap ? w->qcap : 16384;
	while (cap < w->qlen + n)
		cap *= 2;
	/* the queue grows out of the daemon's memory budget: when it has no room, the
	 * queue is full (the events are dropped for an OVERFLOW, as for a slow client) */
	struct shim_err e;
	if (w->op->st == NULL || stream_reserve(w->op->st, cap - w->qcap, &e) < 0)
		return -1;
	uint8_t *q = realloc(w->q, cap);
	if (q == NULL) {
		budget_give(cap - w->qcap);
		return -1;
	}
	w->q = q;
	w->qcap = cap;
	return 0;
}

/* Encode one event at the end of the queue. false (and nothing queued) when the
 * queue is full. */
static bool q_add(struct watcher *w, Shim__V1__WatchEventType type, const char *path, size_t len, bool is_dir,
		  uint32_t cookie)
{
	Shim__V1__WatchEvent ev = SHIM__V1__WATCH_EVENT__INIT;
	ev.type = type;
	if (path != NULL) {
		ev.has_path = 1;
		ev.path.data = (uint8_t *)(uintptr_t)path;
		ev.path.len = len;
		ev.has_is_dir = 1;
		ev.is_dir = is_dir;
	}
	if (cookie != 0) {
		ev.has_cookie = 1;
		ev.cookie = cookie;
	}
	size_t n = shim__v1__watch_event__get_packed_size(&ev);
	size_t total = n + 10;
	if (w->ecount >= WATCH_Q_EVENTS || (w->qlen - w->qoff) + total > WATCH_Q_BYTES)
		return false;
	if (q_reserve(w, total) < 0)
		return false;
	uint8_t *p = w->q + w->qlen;
	size_t h = frame_put_varint(p, n);
	shim__v1__watch_event__pack(&ev, p + h);
	total = h + n;
	/* the same MODIFY again while the previous one still waits: one is enough */
	if (type == SHIM__V1__WATCH_EVENT_TYPE__WATCH_MODIFY && w->last_modify && w->last_start >= w->qbase + w->qoff &&
	    w->last_len == total && memcmp(w->q + (w->last_start - w->qbase), p, total) == 0)
		return true;
	w->last_start = w->qbase + w->qlen;
	w->last_len = total;
	w->last_modify = type == SHIM__V1__WATCH_EVENT_TYPE__WATCH_MODIFY;
	w->qlen += total;
	w->ends[(w->ehead + w->ecount) % WATCH_Q_EVENTS] = w->qbase + w->qlen;
	w->ecount++;
	return true;
}

static void q_overflow_now(struct watcher *w)
{
	if (w->overflow && q_add(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_OVERFLOW, NULL, 0, false, 0))
		w->overflow = false;
}

/* Queue an event, or drop it (and owe the client an OVERFLOW). */
static void q_event(struct watcher *w, Shim__V1__WatchEventType type, const char *path, size_t len, bool is_dir,
		    uint32_t cookie)
{
	q_overflow_now(w);
	if (w->overflow || !q_add(w, type, path, len, is_dir, cookie))
		w->overflow = true;
}

/* ---- ending ---- */

struct closer {
	struct work work;
	int fd;
};

static void closer_run(struct work *wk)
{
	close(container_of(wk, struct closer, work)->fd);
}

static void closer_done(struct work *wk)
{
	free(container_of(wk, struct closer, work));
}

/* Closing an inotify fd that holds watches waits for an SRCU grace period (5-10 ms
 * measured): long enough to matter when many watches end at once, so it happens
 * on a worker. */
static void close_on_worker(int fd)
{
	struct closer *k = malloc(sizeof(*k));
	if (k == NULL) {
		close(fd);
		return;
	}
	k->fd = fd;
	k->work.run = closer_run;
	k->work.done = closer_done;
	worker_submit(&k->work);
}

/* The op is freed (its stream gone, no job left). */
static void watch_free(struct op *op)
{
	struct watcher *w = op->data;
	if (w == NULL)
		return;
	ev_io_stop(w->loop, &w->io);
	if (w->ifd >= 0)
		close_on_worker(w->ifd);
	watch_release(w->nwatch);
	w->nwatch = 0;
	for (unsigned b = 0; b < WATCH_BUCKETS; b++) {
		while (w->map[b] != NULL) {
			struct wnode *n = w->map[b];
			w->map[b] = n->next;
			free(n);
		}
	}
	for (struct todo *lists[2] = {w->todo, w->jobs}, **l = lists; l < lists + 2; l++) {
		while (*l != NULL) {
			struct todo *t = *l;
			*l = t->next;
			free(t);
		}
	}
	for (unsigned i = 0; i < w->nmoves; i++)
		free(w->moves[i].path);
	free(w->syn);
	free(w->q);
	budget_give(w->qcap); /* q_reserve()'s stream_reserve() */
	free(w->scratch);
	free(w);
}

/* ---- the worker side: adding watches ---- */

/* Add a watch on the directory or file open as fd: through /proc/self/fd, so the
 * path that was resolved (confined) when fd was opened is the one watched. */
static int add_watch_fd(int ifd, int fd)
{
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	return inotify_add_watch(ifd, proc, WATCH_MASK);
}

/* add_watch_fd() within the caps. -1 with errno (EDQUOT: a cap is reached). */
static int add_watch_capped(struct watcher *w, int fd)
{
	if (!watch_reserve(w)) {
		errno = EDQUOT;
		return -1;
	}
	int wd = add_watch_fd(w->ifd, fd);
	if (wd < 0) {
		int e = errno;
		watch_release(1);
		errno = e;
	}
	return wd;
}

/* map_put() after add_watch_capped(): a known wd gives its reservation back. */
static int map_put_new(struct watcher *w, int wd, const char *path, size_t len)
{
	int r = map_put(w, wd, path, len);
	if (r <= 0)
		watch_release(1);
	return r < 0 ? -1 : 0;
}

/* A cap was reached: one OVERFLOW, and no more watches for this stream. */
static void watch_capped(struct watcher *w)
{
	if (!w->capped)
		log_info("watch %s: %u inotify watches: a cap is reached (--max-watches %u, --max-watches-total %u); "
			 "reporting OVERFLOW, no more directories are watched",
			 w->path.abs, w->nwatch, w->max_watches, w->max_total);
	w->capped = true;
	w->syn_overflow = true;
}

static int watch_errno(struct shim_err *err, int code, const char *path, const char *what)
{
	if (code == ENOSPC)
		return err_set(err, ENOSPC, path,
			       "inotify_add_watch: watch limit reached (fs.inotify.max_user_watches)");
	return err_set(err, code, path, "%s", what);
}

static void syn_add(struct watcher *w, const char *path, size_t len, bool is_dir)
{
	size_t need = 5 + len;
	if (w->syn_len + need > WATCH_Q_BYTES) {
		w->syn_overflow = true;
		return;
	}
	if (w->syn_len + need > w->syn_cap) {
		size_t cap = w->syn_cap ? w->syn_cap : 4096;
		while (cap < w->syn_len + need)
			cap *= 2;
		uint8_t *s = realloc(w->syn, cap);
		if (s == NULL) {
			w->syn_overflow = true;
			return;
		}
		w->syn = s;
		w->syn_cap = cap;
	}
	uint8_t *p = w->syn + w->syn_len;
	uint32_t l32 = (uint32_t)len;
	p[0] = is_dir;
	memcpy(p + 1, &l32, 4);
	memcpy(p + 5, path, len);
	w->syn_len += need;
}

static int wl_push(struct fs_walk *wk, int fd, char *path, size_t len, struct shim_err *err)
{
	if (fs_walk_push(wk, fd, NULL, -1) < 0) {
		free(path);
		return err_set(err, errno, NULL, "%s", errno == ENOMEM ? "out of memory" : "stat");
	}
	*(struct wlevel *)fs_walk_data(wk, wk->n - 1) = (struct wlevel){.path = path, .len = len};
	return 0;
}

static void wl_pop(struct fs_walk *wk)
{
	free(((struct wlevel *)fs_walk_data(wk, wk->n - 1))->path);
	fs_walk_pop(wk);
}

/* One step of walk(): 1 to go on, 0 at the end, -1 with err. */
static int walk_step(struct watcher *w, struct fs_walk *wk, bool synth, bool strict, unsigned base,
		     struct shim_err *err)
{
	if (worker_cancelled(&w->op->job.work))
		return 0;
	int got = fs_walk_next(wk);
	if (got == FS_WALK_END)
		return 0;
	struct wlevel *l = fs_walk_data(wk, wk->n - 1);
	if (got < 0 && wk->fail == FS_WALK_FAIL_REOPEN) {
		/* the level above cannot be read on (moved meanwhile): nor the walk */
		if (strict)
			return err_set(err, errno, ((struct wlevel *)fs_walk_data(wk, wk->n - 2))->path,
				       "open the directory again");
		w->syn_overflow = true;
		return 0;
	}
	if (got < 0) {
		if (strict)
			return err_set(err, errno, l->path, "read directory");
		w->syn_overflow = true;
		wl_pop(wk);
		return 1;
	}
	if (got == FS_WALK_POST) {
		wl_pop(wk);
		return 1;
	}
	const char *name = wk->name;
	bool is_dir = wk->type == DT_DIR;
	if (wk->type == DT_UNKNOWN) {
		struct stat st;
		if (fstatat(fs_walk_top(wk)->d.fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return 1;
		is_dir = S_ISDIR(st.st_mode);
	}
	size_t nlen = strlen(name);
	size_t clen = (l->len == 1 ? 0 : l->len) + 1 + nlen;
	char *cleanup_free child = malloc(clen + 1);
	if (child == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	snprintf(child, clen + 1, "%s/%s", l->len == 1 ? "" : l->path, name);
	if (synth)
		syn_add(w, child, clen, is_dir);
	if (!is_dir)
		return 1;
	if (base + wk->n >= WATCH_MAX_LEVELS) {
		if (strict)
			return err_set(err, ELOOP, child, "directory tree deeper than 256 levels");
		w->syn_overflow = true;
		return 1;
	}
	if (w->capped) {
		wl_pop(wk); /* its other subdirectories cannot be watched either */
		return 1;
	}
	int cfd = fs_walk_enter(wk, name, 0);
	int wd = cfd < 0 ? -1 : add_watch_capped(w, cfd);
	if (wd < 0) {
		int e = errno;
		if (cfd >= 0)
			close(cfd);
		if (cfd >= 0 && e == EDQUOT) {
			watch_capped(w);
			wl_pop(wk);
			return 1;
		}
		if (e == ENOENT || e == ENOTDIR || e == ELOOP)
			return 1; /* gone or replaced meanwhile */
		if (strict)
			return watch_errno(err, e, child, cfd < 0 ? "open directory" : "inotify_add_watch");
		w->syn_overflow = true;
		return 1;
	}
	if (map_put_new(w, wd, child, clen) < 0) {
		close(cfd);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	return wl_push(wk, cfd, steal_ptr(child), clen, err) < 0 ? -1 : 1;
}

/* Watch every directory below dfd (which is watched already; at depth base), depth
 * first, on the walker. synth: report what is found as CREATE events. strict: a
 * directory that cannot be watched fails the job (the first walk); otherwise it is
 * skipped and OVERFLOW reported. Takes dfd. 0, or -1 with err. */
static int walk(struct watcher *w, int dfd, const char *path, size_t plen, bool synth, bool strict, unsigned base,
		struct shim_err *err)
{
	struct fs_walk wk;
	char *top = strndup(path, plen);
	if (top == NULL || fs_walk_init(&wk, 0, sizeof(struct wlevel)) < 0) {
		free(top);
		close(dfd);
		return err_set(err, ENOMEM, NULL, "out of memory");
	}
	int rc = wl_push(&wk, dfd, top, plen, err);
	if (rc == 0)
		while ((rc = walk_step(w, &wk, synth, strict, base, err)) > 0)
			;
	while (wk.n > 0)
		wl_pop(&wk);
	fs_walk_free(&wk);
	return rc;
}

/* The first job: the inotify instance, the watched path, and with -r the tree. */
static int watch_first(struct watcher *w, struct shim_err *err)
{
	/* O_PATH: never opens the object itself (a FIFO would block) */
	int cleanup_close pfd = fs_open(&w->path, O_PATH, 0, err);
	if (pfd < 0)
		return -1;
	w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->ifd < 0) {
		if (errno == EMFILE) {
			/* the limit's value helps whoever reads the error; pfd's slot lets
			 * us read it when the fd table is what is full */
			close(steal_fd(pfd));
			char lim[32] = "?";
			FILE *f = fopen("/proc/sys/fs/inotify/max_user_instances", "re");
			if (f != NULL) {
				if (fscanf(f, "%30s", lim) != 1)
					strcpy(lim, "?");
				fclose(f);
			}
			return err_set(err, EMFILE, w->path.abs,
				       "inotify_init1: too many inotify instances for this user "
				       "(fs.inotify.max_user_instances = %s) or too many open files",
				       lim);
		}
		return err_set(err, errno, w->path.abs, "inotify_init1");
	}
	struct stat st;
	if (fstat(pfd, &st) < 0)
		return err_set(err, errno, w->path.abs, "stat");
	w->root_is_dir = S_ISDIR(st.st_mode);
	int wd = add_watch_capped(w, pfd);
	if (wd < 0 && errno == EDQUOT)
		return err_set(err, ENOSPC, w->path.abs,
			       "the daemon's inotify watches are all in use (--max-watches-total %u)", w->max_total);
	if (wd < 0)
		return watch_errno(err, errno, w->path.abs, "inotify_add_watch");
	w->root_wd = wd;
	if (map_put_new(w, wd, w->path.abs, w->root_len) < 0)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (!w->recursive || !w->root_is_dir)
		return 0;
	int dfd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return err_set(err, errno, w->path.abs, "open directory");
	return walk(w, dfd, w->path.abs, w->root_len, false, true, 0, err);
}

/* Later jobs: directories that appeared under a recursive watch. */
static void watch_add_dirs(struct watcher *w)
{
	for (struct todo *t = w->jobs; t != NULL && !worker_cancelled(&w->op->job.work) && !w->capped; t = t->next) {
		struct fs_path p;
		if (t->len >= sizeof(p.abs)) {
			w->syn_overflow = true;
			continue;
		}
		memcpy(p.abs, t->path, t->len + 1);
		p.len = t->len;
		struct shim_err e;
		int fd = fs_open(&p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0, &e);
		int wd = fd < 0 ? -1 : add_watch_capped(w, fd);
		if (wd < 0) {
			int code = fd < 0 ? e.code : errno;
			if (fd >= 0)
				close(fd);
			if (fd >= 0 && code == EDQUOT) {
				watch_capped(w);
				return;
			}
			if (code != ENOENT && code != ENOTDIR && code != ELOOP)
				w->syn_overflow = true;
			continue;
		}
		if (map_put_new(w, wd, t->path, t->len) < 0) {
			close(fd);
			w->syn_overflow = true;
			continue;
		}
		if (walk(w, fd, t->path, t->len, t->created, false, 1, &e) < 0) {
			w->syn_overflow = true;
			return;
		}
	}
}

/* On a worker: the first job, or directories that appeared since. The watched path
 * and the directories added later are opened (and watched: inotify wants read
 * permission) as the request's identity (OP_FS). */
static int watch_job(struct op *op, struct shim_err *err)
{
	struct watcher *w = op->data;
	if (!w->started)
		return watch_first(w, err);
	watch_add_dirs(w);
	return 0;
}

/* ---- the loop side ---- */

static void watch_pump(struct op *op);
static void watch_io_cb(struct ev_loop *loop, ev_io *io, int revents);

static void watch_submit(struct watcher *w)
{
	w->jobs = w->todo;
	w->todo = w->todo_tail = NULL;
	w->ntodo = 0;
	ev_io_stop(w->loop, &w->io);
	op_run_job(w->op);
}

static void watch_job_done(struct op *op, int rc, const struct shim_err *err)
{
	struct watcher *w = op->data;
	while (w->jobs != NULL) {
		struct todo *t = w->jobs;
		w->jobs = t->next;
		free(t);
	}
	if (rc < 0 && !w->started) {
		op_fail(op, err);
		return;
	}
	if (rc < 0) {
		/* the identity could not be entered: the new directories go unwatched, say so */
		w->syn_overflow = true;
	}
	if (!w->started) {
		w->started = true;
		ev_io_init(&w->io, watch_io_cb, w->ifd, EV_READ);
	}
	for (size_t off = 0; off < w->syn_len;) {
		uint32_t len;
		memcpy(&len, w->syn + off + 1, 4);
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_CREATE, (const char *)w->syn + off + 5, len,
			w->syn[off] != 0, 0);
		off += 5 + len;
	}
	w->syn_len = 0;
	if (w->syn_cap > (64u << 10)) {
		free(w->syn);
		w->syn = NULL;
		w->syn_cap = 0;
	}
	if (w->syn_overflow) {
		log_warn("watch %s: some directories could not be watched; reporting OVERFLOW", w->path.abs);
		w->syn_overflow = false;
		w->overflow = true;
		q_overflow_now(w);
	}
	if (!w->ending)
		ev_io_start(w->loop, &w->io);
	watch_pump(op);
}

/* dir + "/" + name in the scratch buffer ("/" + name for the root directory "/"). */
static const char *join(struct watcher *w, const struct wnode *dir, const char *name, size_t nlen, size_t *len)
{
	size_t dlen = dir->len == 1 ? 0 : dir->len;
	size_t need = dlen + 1 + nlen + 1;
	if (need > w->scratch_cap) {
		size_t cap = w->scratch_cap ? w->scratch_cap : 1024;
		while (cap < need)
			cap *= 2;
		char *s = realloc(w->scratch, cap);
		if (s == NULL)
			return NULL;
		w->scratch = s;
		w->scratch_cap = cap;
	}
	memcpy(w->scratch, dir->path, dlen);
	w->scratch[dlen] = '/';
	memcpy(w->scratch + dlen + 1, name, nlen);
	w->scratch[dlen + 1 + nlen] = '\0';
	*len = dlen + 1 + nlen;
	return w->scratch;
}

static void todo_add(struct watcher *w, const char *path, size_t len, bool created)
{
	if (w->capped)
		return; /* OVERFLOW was sent: directories made now go unwatched */
	if (w->ntodo >= WATCH_TODO_MAX) {
		w->overflow = true;
		return;
	}
	struct todo *t = malloc(sizeof(*t) + len + 1);
	if (t == NULL) {
		w->overflow = true;
		return;
	}
	t->next = NULL;
	t->created = created;
	t->len = len;
	memcpy(t->path, path, len);
	t->path[len] = '\0';
	if (w->todo_tail != NULL)
		w->todo_tail->next = t;
	else
		w->todo = t;
	w->todo_tail = t;
	w->ntodo++;
}

/* A directory pending a watch was moved before the job ran: follow it. */
static void todo_rename(struct watcher *w, const char *old, size_t olen, const char *new, size_t nlen)
{
	struct todo *prev = NULL;
	for (struct todo *t = w->todo; t != NULL; prev = t, t = t->next) {
		if (!under(t->path, t->len, old, olen))
			continue;
		size_t len = nlen + (t->len - olen);
		struct todo *n = malloc(sizeof(*n) + len + 1);
		if (n == NULL)
			continue;
		*n = *t;
		n->len = len;
		memcpy(n->path, new, nlen);
		memcpy(n->path + nlen, t->path + olen, t->len - olen);
		n->path[len] = '\0';
		if (prev != NULL)
			prev->next = n;
		else
			w->todo = n;
		if (w->todo_tail == t)
			w->todo_tail = n;
		free(t);
		t = n;
	}
}

static void move_from(struct watcher *w, uint32_t cookie, const char *path, size_t len)
{
	if (w->nmoves >= WATCH_MOVES_MAX) {
		/* cannot pair it: treat as moved out */
		map_remove_tree(w, path, len);
		return;
	}
	char *p = malloc(len + 1);
	if (p == NULL) {
		map_remove_tree(w, path, len);
		return;
	}
	memcpy(p, path, len);
	p[len] = '\0';
	w->moves[w->nmoves++] = (struct move){cookie, len, p};
}

static void move_to(struct watcher *w, uint32_t cookie, const char *path, size_t len)
{
	for (unsigned i = 0; i < w->nmoves; i++) {
		struct move *m = &w->moves[i];
		if (m->cookie != cookie)
			continue;
		map_rename(w, m->path, m->len, path, len);
		todo_rename(w, m->path, m->len, path, len);
		free(m->path);
		*m = w->moves[--w->nmoves];
		return;
	}
	/* moved in from outside the tree */
	todo_add(w, path, len, false);
}

/* MOVED_FROM without its MOVED_TO in the same read: the directory left the tree. */
static void moves_settle(struct watcher *w)
{
	for (unsigned i = 0; i < w->nmoves; i++) {
		map_remove_tree(w, w->moves[i].path, w->moves[i].len);
		free(w->moves[i].path);
	}
	w->nmoves = 0;
}

static void handle_event(struct watcher *w, const struct inotify_event *ev)
{
	if (ev->mask & IN_Q_OVERFLOW) {
		w->overflow = true;
		q_overflow_now(w);
		return;
	}
	const struct wnode *dir = map_get(w, ev->wd);
	if (dir == NULL)
		return; /* a watch we have dropped; its last events are still queued */
	bool is_root = ev->wd == w->root_wd;
	if (ev->mask & IN_IGNORED) {
		map_del(w, ev->wd);
		if (is_root && !w->ending) {
			/* the watched path went away without DELETE_SELF (unmounted) */
			q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_DELETE_SELF, w->path.abs, w->root_len,
				w->root_is_dir, 0);
			w->ending = true;
		}
		return;
	}
	size_t nlen = ev->len > 0 ? strnlen(ev->name, ev->len) : 0;
	size_t len;
	const char *path;
	if (nlen > 0) {
		path = join(w, dir, ev->name, nlen, &len);
		if (path == NULL) {
			w->overflow = true;
			return;
		}
	} else {
		/* an event on the watched object itself: the watch on its parent reports
		 * it for every directory but the root */
		if (!is_root)
			return;
		path = w->path.abs;
		len = w->root_len;
	}
	bool is_dir = (ev->mask & IN_ISDIR) != 0 || (nlen == 0 && w->root_is_dir);
	uint32_t m = ev->mask;
	if (m & IN_CREATE) {
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_CREATE, path, len, is_dir, 0);
		if (is_dir && w->recursive)
			todo_add(w, path, len, true);
	}
	if (m & IN_MODIFY)
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_MODIFY, path, len, is_dir, 0);
	if (m & IN_ATTRIB)
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_ATTRIB, path, len, is_dir, 0);
	if (m & IN_DELETE)
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_DELETE, path, len, is_dir, 0);
	if (m & IN_MOVED_FROM) {
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_MOVED_FROM, path, len, is_dir, ev->cookie);
		if (is_dir && w->recursive)
			move_from(w, ev->cookie, path, len);
	}
	if (m & IN_MOVED_TO) {
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_MOVED_TO, path, len, is_dir, ev->cookie);
		if (is_dir && w->recursive)
			move_to(w, ev->cookie, path, len);
	}
	if ((m & IN_DELETE_SELF) && is_root && !w->ending) {
		q_event(w, SHIM__V1__WATCH_EVENT_TYPE__WATCH_DELETE_SELF, path, len, is_dir, 0);
		w->ending = true;
	}
}

static void watch_io_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	struct watcher *w = container_of(io, struct watcher, io);
	struct op *op = w->op;
	/* aligned for struct inotify_event; big enough for many events at once */
	union {
		struct inotify_event ev;
		char buf[16384];
	} u;
	/* not a hook of the op: kept while it may end its stream here */
	op_hold(op);
	for (unsigned round = 0; round < WATCH_READ_ROUNDS && op->jobs == NULL && !w->ending; round++) {
		ssize_t n = read(w->ifd, u.buf, sizeof(u.buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			struct shim_err e;
			err_set(&e, n < 0 ? errno : EIO, w->path.abs, "read inotify events");
			op_fail(op, &e);
			op_put(op);
			return;
		}
		for (ssize_t off = 0; off < n;) {
			const struct inotify_event *ev = (const void *)(u.buf + off);
			off += (ssize_t)(sizeof(*ev) + ev->len);
			handle_event(w, ev);
		}
		moves_settle(w);
		if (w->ntodo > 0)
			watch_submit(w);
	}
	if (w->ending)
		ev_io_stop(w->loop, &w->io);
	watch_pump(op); /* may end the stream */
	op_put(op);
}

static void watch_pump(struct op *op)
{
	struct watcher *w = op->data;
	struct stream *st = op->st;
	for (;;) {
		while (w->qoff < w->qlen) {
			size_t n = stream_can_send(st);
			if (n == 0)
				break;
			if (n > w->qlen - w->qoff)
				n = w->qlen - w->qoff;
			stream_send_data(st, w->q + w->qoff, n, false);
			w->qoff += n;
		}
		q_drop_sent(w);
		if (!w->overflow)
			break;
		q_overflow_now(w); /* room again: the OVERFLOW owed goes out next */
		if (w->overflow)
			break;
	}
	if (w->qoff < w->qlen) {
		stream_wait_writable(st);
		return;
	}
	if (w->qcap > (256u << 10)) {
		/* a burst is over: give the big buffer back */
		free(w->q);
		stream_unreserve(st, w->qcap);
		w->q = NULL;
		w->qcap = 0;
	}
	if (w->ending && op->jobs == NULL) {
		stream_send_data(st, NULL, 0, true);
		Shim__V1__Done d = SHIM__V1__DONE__INIT;
		Shim__V1__Result res = SHIM__V1__RESULT__INIT;
		res.kind_case = SHIM__V1__RESULT__KIND_DONE;
		res.done = &d;
		op_end(op, &res);
	}
}

/* A job in flight is interrupted (and the op freed after it): only the inotify fd's
 * watcher runs on the loop. */
static void watch_cancel(struct op *op)
{
	struct watcher *w = op->data;
	ev_io_stop(w->loop, &w->io);
}

static int watch_start(struct op *op, struct shim_err *err)
{
	const Shim__V1__WatchRequest *r = op->req->watch;
	const struct server *s = op->st->conn->srv;
	struct watcher *w = calloc(1, sizeof(*w));
	if (w == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	op->data = w;
	w->op = op;
	w->ifd = -1;
	w->root_wd = -1;
	w->loop = s->loop;
	ev_init(&w->io, watch_io_cb);
	if (fs_path_get(&r->path, &w->path, err) < 0)
		return -1;
	w->root_len = w->path.len;
	while (w->root_len > 1 && w->path.abs[w->root_len - 1] == '/')
		w->root_len--;
	w->path.abs[w->root_len] = '\0';
	w->path.len = w->root_len;
	w->recursive = r->has_recursive && r->recursive;
	w->max_total = s->cfg.max_watches_total;
	w->max_watches = s->cfg.max_watches;
	if (r->has_max_watches && r->max_watches > 0 && r->max_watches < w->max_watches)
		w->max_watches = r->max_watches;
	op_run_job(op);
	return 0;
}

const struct op_kind op_fs_watch_kind = {
	SHIM__V1__REQUEST__KIND_WATCH,
	"watch",
	OP_FS,
	.start = watch_start,
	.job = watch_job,
	.job_done = watch_job_done,
	.writable = watch_pump,
	.cancel = watch_cancel,
	.release = watch_free,
};
