/* proc.c: the table of processes the shim started, and each one's life: exec result, output, stdin, timers, exit.
 *
 * A process is owned by references: the table (while its id is listed), its pid
 * (from fork until it is reaped and the exec result is known), its owner (the exec
 * request), and each attachment. The table reports to them through their
 * proc_owner_ops (proc.h): it knows no streams, frames and credit. Everything runs
 * on the loop thread.
 *
 * Life of a process:
 *   STARTING  created by the exec request (id taken, invisible to lookups), then
 *             prepared on a worker and forked; the exec error pipe says how exec went
 *   RUNNING   exec succeeded (pipe EOF): EVENT started / END ProcessInfo; output flows
 *   EXITED    reaped (and the exec result known): waiters answered, then the output
 *             is drained until both pipes reach EOF, or PROC_LINGER_MS after the exit
 *             when descendants keep them open (`sleep 100 &` inherits stdout): our
 *             ends are then closed and the stream ends. A foreground process leaves
 *             the table at its exit; a detached one stays until removed or until
 *             PROC_MAX_EXITED newer ones have exited.
 *   FAILED    never started (the exec stream got the error); not listed */
#include "proc.h"
#include "frame.h"
#include "log.h"
#include "reaper.h"
#include "server.h"
#include "spawn.h"
#include "util.h"
#include "worker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROC_BUCKETS 256

static struct {
	struct proc *buckets[PROC_BUCKETS];
	struct proc *head, *tail; /* listed, creation order */
	struct proc *live;        /* forked, not reaped */
	unsigned n_active;        /* STARTING or RUNNING */
	unsigned n_exited;        /* listed and EXITED */
	unsigned n_live;
	unsigned long long next_id;
	uint64_t exit_seq;
} tab;

/* Output is read through this buffer (loop thread only), up to PROC_READ_MAX at a time. */
static uint8_t rbuf[PROC_READ_MAX];
static unsigned notify_gen;

static struct ev_loop *loop_(void)
{
	return srv->loop;
}

static unsigned hash_id(const char *id)
{
	uint32_t h = 2166136261u;
	for (; *id; id++)
		h = (h ^ (uint8_t)*id) * 16777619u;
	return h % PROC_BUCKETS;
}

static struct proc *find_listed(const char *id)
{
	for (struct proc *p = tab.buckets[hash_id(id)]; p != NULL; p = p->hnext)
		if (strcmp(p->id, id) == 0)
			return p;
	return NULL;
}

bool proc_id_valid(const char *id)
{
	size_t n = strlen(id);
	if (n == 0 || n > PROC_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return false;
	}
	return true;
}

static void set_state(struct proc *p, enum proc_state s)
{
	bool was_active = p->state == PROC_STARTING || p->state == PROC_RUNNING;
	bool active = s == PROC_STARTING || s == PROC_RUNNING;
	if (was_active && !active)
		tab.n_active--;
	if (p->listed && p->state != PROC_EXITED && s == PROC_EXITED)
		tab.n_exited++;
	p->state = s;
}

static void timeout_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void linger_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void chan_cb(struct ev_loop *loop, ev_io *w, int revents);
static void stdin_cb(struct ev_loop *loop, ev_io *w, int revents);
static void errpipe_cb(struct ev_loop *loop, ev_io *w, int revents);
static void chan_read(struct proc_chan *c, int rounds);

/* Reads of FRAME_DATA_CHUNK per channel: per readable event, and as a last drain
 * before the output is cut (more than a pipe holds). */
#define READ_ROUNDS 4
#define LINGER_DRAIN_ROUNDS 32
/* Once a channel's pipe was grown (the command writes in bulk), stdout of at least this
 * much in the pipe is spliced to the client (proc_owner_ops.output_pipe); less is read. */
#define PROC_SPLICE_MIN (64u << 10)

struct proc *proc_create(const char *name, bool detached, struct shim_err *err)
{
	if (tab.n_active >= PROC_MAX_ACTIVE) {
		err_set(err, EAGAIN, NULL, "too many processes (limit %d)", PROC_MAX_ACTIVE);
		return NULL;
	}
	char gen[PROC_ID_MAX + 1];
	if (name != NULL) {
		if (!proc_id_valid(name)) {
			err_set(err, EINVAL, name, "bad process name (1 to %d of A-Z a-z 0-9 . _ -)", PROC_ID_MAX);
			return NULL;
		}
		if (find_listed(name) != NULL) {
			err_set(err, EEXIST, name, "a process with this id exists");
			return NULL;
		}
	} else {
		do
			snprintf(gen, sizeof(gen), "p%llu", ++tab.next_id);
		while (find_listed(gen) != NULL);
		name = gen;
	}
	struct proc *p = calloc(1, sizeof(*p));
	if (p == NULL) {
		err_set(err, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	snprintf(p->id, sizeof(p->id), "%s", name);
	p->detached = detached;
	p->refs = 1; /* the table's */
	p->state = PROC_STARTING;
	p->errfd = p->in_fd = -1;
	for (int i = 0; i < 2; i++) {
		p->out[i].p = p;
		p->out[i].idx = i;
		p->out[i].fd = -1;
		ev_init(&p->out[i].io, chan_cb);
	}
	ev_init(&p->errio, errpipe_cb);
	ev_init(&p->in_io, stdin_cb);
	ev_init(&p->timeout, timeout_cb);
	ev_init(&p->grace, grace_cb);
	ev_init(&p->linger, linger_cb);
	tab.n_active++;
	unsigned b = hash_id(p->id);
	p->hnext = tab.buckets[b];
	tab.buckets[b] = p;
	p->prev = tab.tail;
	if (tab.tail != NULL)
		tab.tail->next = p;
	else
		tab.head = p;
	tab.tail = p;
	p->listed = true;
	return p;
}

void proc_start_failed(struct proc *p)
{
	set_state(p, PROC_FAILED);
	proc_unlist(p);
}

struct proc *proc_lookup(const char *id)
{
	struct proc *p = find_listed(id);
	if (p == NULL || p->state == PROC_STARTING || p->state == PROC_FAILED)
		return NULL;
	return p;
}

struct proc *proc_first(void)
{
	return tab.head;
}

struct proc *proc_next(const struct proc *p)
{
	return p->next;
}

void proc_ref(struct proc *p)
{
	p->refs++;
}

static void chan_close(struct proc_chan *c)
{
	if (c->fd < 0)
		return;
	ev_io_stop(loop_(), &c->io);
	close(c->fd);
	c->fd = -1;
}

static void stdin_close(struct proc *p)
{
	ev_io_stop(loop_(), &p->in_io);
	if (p->in_fd >= 0)
		close(p->in_fd);
	p->in_fd = -1;
	/* bytes that will never be written: give the writer its credit back so that
	 * it does not stall (what it sends from now on is dropped, see stdin_data) */
	if (p->in_len > 0 && p->in_owner != NULL)
		p->in_ops->taken(p, p->in_owner, p->in_len);
	p->in_len = 0;
}

static void proc_free(struct proc *p)
{
	struct ev_loop *loop = loop_();
	ev_io_stop(loop, &p->errio);
	if (p->errfd >= 0)
		close(p->errfd);
	for (int i = 0; i < 2; i++) {
		chan_close(&p->out[i]);
		ring_free(&p->out[i].ring);
	}
	p->in_owner = NULL;
	stdin_close(p);
	ev_timer_stop(loop, &p->timeout);
	ev_timer_stop(loop, &p->grace);
	ev_timer_stop(loop, &p->linger);
	if (p->state == PROC_STARTING || p->state == PROC_RUNNING)
		tab.n_active--;
	free(p->in_buf);
	free(p->tree);
	free(p->tree_start);
	free(p->argv);
	free(p->exec_path);
	free(p->cwd);
	free(p);
}

void proc_unref(struct proc *p)
{
	if (--p->refs == 0)
		proc_free(p);
}

void proc_unlist(struct proc *p)
{
	if (!p->listed)
		return;
	struct proc **pp = &tab.buckets[hash_id(p->id)];
	while (*pp != p)
		pp = &(*pp)->hnext;
	*pp = p->hnext;
	if (p->prev != NULL)
		p->prev->next = p->next;
	else
		tab.head = p->next;
	if (p->next != NULL)
		p->next->prev = p->prev;
	else
		tab.tail = p->prev;
	p->prev = p->next = p->hnext = NULL;
	p->listed = false;
	if (p->state == PROC_EXITED)
		tab.n_exited--;
	proc_unref(p);
}

/* ---- signals ---- */

/*
 * The command tree. Each command leads its own session and process group, and a
 * signal to the group reaches everything that stayed in it; a descendant that
 * called setsid() (or setpgid()) left it. The shim is PID 1 or a subreaper, so such
 * a process is still ours in the end, but once its parent has exited its PPid is
 * the shim's and nothing says which command it came from. So an ending signal
 * (tree_sig) goes like this:
 *   1. on the loop: SIGSTOP to the group: nothing in it can exit (and orphan its
 *      children) or fork while the tree is read;
 *   2. on a worker (reading /proc is filesystem work): every process's PPid, pgid
 *      and start time from /proc/N/stat; the descendants of the leader and of those
 *      found by an earlier walk (same start time: not a reused pid) are collected;
 *      those outside the group get the signal, one by one;
 *   3. still on the worker: the group gets the signal, then SIGCONT (a stopped
 *      process acts on a SIGTERM only once continued).
 * What was found is kept (proc->tree), so the grace period's SIGKILL after a
 * timeout still reaches descendants whose parents the SIGTERM ended. If no worker
 * takes the job within TREE_STALL_MS (every thread blocked) the loop signals and
 * continues the group itself, and the walk follows when it can.
 * Limits: a descendant whose parent exited before any walk (a double fork, then
 * setsid, before the timeout) is not found; cgroups are not used (cgroup v2 with
 * cgroup.kill would find those too).
 */
#define TREE_MAX_PROCS (1u << 16) /* processes read per walk */
#define TREE_MAX 1024             /* descendants kept per command */
#define TREE_STALL_MS 500

struct tree_job {
	struct work work;
	struct proc *p;
	pid_t pid; /* the leader, also the group */
	int sig;
	bool frozen;     /* the group was stopped: continue it */
	bool group_done; /* the group was signalled (by the worker or the stall timer) */
	pid_t *roots;    /* in: the leader's descendants found before; out: all found now */
	unsigned long long *starts;
	unsigned nroots;
	ev_timer stall;
};

static bool tree_sig(int sig)
{
	return sig == SIGTERM || sig == SIGKILL || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
}

struct pstat {
	pid_t pid, ppid, pgid;
	unsigned long long start;
};

/* /proc/PID/stat's ppid, pgrp and starttime. Worker only. */
static bool read_stat(pid_t pid, struct pstat *ps)
{
	char path[48], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	char *q = strrchr(buf, ')'); /* the command name may hold anything */
	if (q == NULL)
		return false;
	int ppid, pgid;
	unsigned long long start;
	/* state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
	 * stime cutime cstime priority nice num_threads itrealvalue starttime */
	if (sscanf(q + 1, " %*c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &ppid,
		   &pgid, &start) != 3)
		return false;
	ps->pid = pid;
	ps->ppid = ppid;
	ps->pgid = pgid;
	ps->start = start;
	return true;
}

/* The group's part: the signal, then SIGCONT if it was stopped. A leader not in its
 * own group yet (before its setsid) gets them itself, only while it is alive
 * (stopped: it cannot have been reaped). Any thread. */
static void tree_group(const struct tree_job *j)
{
	if (kill(-j->pid, j->sig) < 0 && errno == ESRCH && j->frozen)
		kill(j->pid, j->sig);
	if (j->frozen && kill(-j->pid, SIGCONT) < 0 && errno == ESRCH)
		kill(j->pid, SIGCONT);
}

static void tree_run(struct work *w)
{
	struct tree_job *j = container_of(w, struct tree_job, work);
	struct pstat *all = NULL;
	size_t n = 0, cap = 0;
	DIR *d = opendir("/proc");
	struct dirent *e;
	while (d != NULL && (e = readdir(d)) != NULL && n < TREE_MAX_PROCS) {
		char *end;
		long v = strtol(e->d_name, &end, 10);
		if (*end != '\0' || v <= 1)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 512;
			struct pstat *na = realloc(all, nc * sizeof(*na));
			if (na == NULL)
				break;
			all = na;
			cap = nc;
		}
		if (read_stat((pid_t)v, &all[n]))
			n++;
	}
	if (d != NULL)
		closedir(d);
	/* the set: the leader, the earlier ones still alive as themselves, then
	 * whatever has a parent in the set, until nothing is added */
	pid_t *set = malloc(TREE_MAX * sizeof(pid_t));
	unsigned long long *st = malloc(TREE_MAX * sizeof(unsigned long long));
	unsigned ns = 0;
	bool *in = calloc(n ? n : 1, sizeof(bool));
	if (set != NULL && st != NULL && in != NULL) {
		for (size_t i = 0; i < n; i++) {
			/* the leader's pid only while it is alive (stopped): once reaped it
			 * may be someone else's */
			bool root = j->frozen && all[i].pid == j->pid;
			for (unsigned k = 0; !root && k < j->nroots; k++)
				root = all[i].pid == j->roots[k] && all[i].start == j->starts[k];
			if (root)
				in[i] = true;
		}
		for (bool grew = true; grew;) {
			grew = false;
			for (size_t i = 0; i < n; i++) {
				if (in[i])
					continue;
				for (size_t k = 0; k < n; k++) {
					if (in[k] && all[k].pid == all[i].ppid) {
						in[i] = grew = true;
						break;
					}
				}
			}
		}
		for (size_t i = 0; i < n && ns < TREE_MAX; i++) {
			if (!in[i] || all[i].pid == j->pid)
				continue;
			set[ns] = all[i].pid;
			st[ns++] = all[i].start;
			/* the group gets the signal once, below */
			if (all[i].pgid != j->pid)
				kill(all[i].pid, j->sig);
		}
	}
	free(in);
	free(all);
	free(j->roots);
	free(j->starts);
	j->roots = set;
	j->starts = st;
	j->nroots = set != NULL && st != NULL ? ns : 0;
	if (!__atomic_exchange_n(&j->group_done, true, __ATOMIC_SEQ_CST))
		tree_group(j);
}

/* Every thread was busy: end the group's stop now; the walk comes when it can. */
static void tree_stall_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct tree_job *j = container_of(w, struct tree_job, stall);
	if (__atomic_exchange_n(&j->group_done, true, __ATOMIC_SEQ_CST))
		return;
	log_warn("process %s: no worker for the process tree within %d ms: signalling its group", j->p->id,
		 TREE_STALL_MS);
	tree_group(j);
}

static void tree_done(struct work *w)
{
	struct tree_job *j = container_of(w, struct tree_job, work);
	struct proc *p = j->p;
	ev_timer_stop(loop_(), &j->stall);
	/* keep what was found, with what was known (a walk that ran while another was
	 * queued may have seen less) */
	for (unsigned i = 0; i < j->nroots; i++) {
		bool known = false;
		for (unsigned k = 0; k < p->ntree && !known; k++)
			known = p->tree[k] == j->roots[i] && p->tree_start[k] == j->starts[i];
		if (known)
			continue;
		if (p->ntree % 64 == 0) {
			if (p->ntree >= TREE_MAX)
				break;
			pid_t *nt = realloc(p->tree, (p->ntree + 64) * sizeof(pid_t));
			if (nt == NULL)
				break;
			p->tree = nt;
			unsigned long long *ns = realloc(p->tree_start, (p->ntree + 64) * sizeof(unsigned long long));
			if (ns == NULL)
				break;
			p->tree_start = ns;
		}
		p->tree[p->ntree] = j->roots[i];
		p->tree_start[p->ntree++] = j->starts[i];
	}
	if (j->nroots > 0)
		log_debug("process %s: signal %d reached %u descendants (%u outside its group or not)", p->id, j->sig,
			  j->nroots, p->ntree);
	free(j->roots);
	free(j->starts);
	free(j);
	proc_unref(p);
}

/* Signal p's whole tree (see above). freeze: stop the group first (the leader is
 * alive). -1 with errno when even the stop could not be sent. */
static int tree_signal(struct proc *p, int sig, bool freeze)
{
	struct tree_job *j = calloc(1, sizeof(*j));
	if (j != NULL && p->ntree > 0) {
		j->roots = malloc(p->ntree * sizeof(pid_t));
		j->starts = malloc(p->ntree * sizeof(unsigned long long));
		if (j->roots != NULL && j->starts != NULL) {
			memcpy(j->roots, p->tree, p->ntree * sizeof(pid_t));
			memcpy(j->starts, p->tree_start, p->ntree * sizeof(unsigned long long));
			j->nroots = p->ntree;
		}
	}
	if (j == NULL || (p->ntree > 0 && j->nroots == 0)) {
		/* out of memory: the group at least */
		if (j != NULL) {
			free(j->roots);
			free(j->starts);
			free(j);
		}
		if (kill(-p->pid, sig) == 0)
			return 0;
		return errno == ESRCH && freeze ? kill(p->pid, sig) : -1;
	}
	if (freeze) {
		if (kill(-p->pid, SIGSTOP) < 0) {
			/* No such group yet: the child has not reached setsid(). It is still
			 * our unreaped child, so its pid cannot have been reused. */
			if (errno != ESRCH || kill(p->pid, SIGSTOP) < 0) {
				int e = errno;
				free(j->roots);
				free(j->starts);
				free(j);
				errno = e;
				return -1;
			}
		}
		j->frozen = true;
	}
	j->p = p;
	proc_ref(p);
	j->pid = p->pid;
	j->sig = sig;
	j->work.run = tree_run;
	j->work.done = tree_done;
	ev_timer_init(&j->stall, tree_stall_cb, TREE_STALL_MS / 1000.0, 0.);
	ev_timer_start(loop_(), &j->stall);
	worker_submit(&j->work);
	return 0;
}

/* The group alone, at once. */
static int group_kill(struct proc *p, int sig)
{
	if (kill(-p->pid, sig) == 0)
		return 0;
	/* No such group yet: the child has not reached setsid(). It is still our
	 * unreaped child, so its pid cannot have been reused. */
	if (errno == ESRCH)
		return kill(p->pid, sig);
	return -1;
}

int proc_kill(struct proc *p, int sig, bool only_leader)
{
	if (!p->live) {
		errno = ESRCH;
		return -1;
	}
	if (only_leader)
		return kill(p->pid, sig);
	if (tree_sig(sig))
		return tree_signal(p, sig, true);
	return group_kill(p, sig);
}

/* The group, also after the leader was reaped (members may remain, and while they
 * do the group id cannot be reused), and the descendants found before. Only until
 * the process is done. */
static void signal_group(struct proc *p, int sig)
{
	if (p->live)
		proc_kill(p, sig, false);
	else if (p->pid > 0 && !p->done)
		tree_signal(p, sig, false);
}

static void timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	struct proc *p = container_of(w, struct proc, timeout);
	p->timed_out = true;
	log_debug("process %s: timeout after %u ms: SIGTERM", p->id, p->timeout_ms);
	signal_group(p, SIGTERM);
	if (p->grace_ms == 0) {
		signal_group(p, SIGKILL);
		return;
	}
	ev_timer_set(&p->grace, p->grace_ms / 1000.0, 0.);
	ev_timer_start(loop, &p->grace);
}

static void grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	struct proc *p = container_of(w, struct proc, grace);
	log_debug("process %s: grace period over: SIGKILL", p->id);
	signal_group(p, SIGKILL);
}

/* ---- the end ---- */

/* Tell the attachments that something changed. One may end its own stream (and,
 * through the connection, others): each is visited once, starting over after every
 * call. */
static void notify(struct proc *p)
{
	unsigned gen = ++notify_gen;
	struct proc_attachment *a = p->attached;
	while (a != NULL) {
		if (a->gen == gen || a->ops->changed == NULL) {
			a = a->next;
			continue;
		}
		a->gen = gen;
		a->ops->changed(p, a->owner);
		a = p->attached; /* the list may have changed under the call */
	}
}

/* Reaped: the attachments waiting for that are taken off and told. */
static void notify_exited(struct proc *p)
{
	for (;;) {
		struct proc_attachment *a = p->attached;
		while (a != NULL && a->ops->exited == NULL)
			a = a->next;
		if (a == NULL)
			return;
		proc_attach_remove(p, a);
		a->ops->exited(p, a->owner);
	}
}

/* Reaped and both output channels closed: the process is done. */
static void check_done(struct proc *p)
{
	if (p->done || p->state != PROC_EXITED)
		return;
	if (p->out[0].fd >= 0 || p->out[1].fd >= 0) {
		if (!ev_is_active(&p->linger)) {
			ev_now_update(loop_());
			ev_timer_set(&p->linger, PROC_LINGER_MS / 1000.0, 0.);
			ev_timer_start(loop_(), &p->linger);
		}
		return;
	}
	ev_timer_stop(loop_(), &p->linger);
	if (ev_is_active(&p->grace)) {
		/* timed out, the leader is gone, and what is left of its group (and
		 * of its tree) still had its grace period running: it ends with the
		 * stream */
		tree_signal(p, SIGKILL, false);
		ev_timer_stop(loop_(), &p->grace);
	}
	p->done = true;
	stdin_close(p);
	if (p->owner != NULL)
		p->owner_ops->finished(p, p->owner);
	notify(p);
}

static void linger_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	struct proc *p = container_of(w, struct proc, linger);
	/* A client that has not taken what is queued yet is not cut off: the wait
	 * is for descendants that hold the pipes, not for the client. */
	if (p->owner != NULL && p->fg_blocked) {
		ev_timer_set(w, PROC_LINGER_MS / 1000.0, 0.);
		ev_timer_start(loop, w);
		return;
	}
	proc_ref(p);
	/* What is in the pipes now is the command's own last output: take it before
	 * cutting (a busy loop may run this timer before the pipes' read events). */
	for (int i = 0; i < 2; i++)
		if (p->out[i].fd >= 0)
			chan_read(&p->out[i], LINGER_DRAIN_ROUNDS);
	if (!p->done) {
		if (p->owner != NULL && p->fg_blocked) {
			ev_timer_set(w, PROC_LINGER_MS / 1000.0, 0.);
			ev_timer_start(loop, w);
		} else {
			log_debug("process %s: output still open %d ms after the exit: closing it", p->id,
				  PROC_LINGER_MS);
			chan_close(&p->out[0]);
			chan_close(&p->out[1]);
			check_done(p);
		}
	}
	proc_unref(p);
}

/* Drop the pid's reference once the process is reaped and its exec result known. */
static void release_pid(struct proc *p)
{
	if (p->reaped && p->state != PROC_STARTING && !p->pid_released) {
		p->pid_released = true;
		proc_unref(p);
	}
}

/* Keep at most PROC_MAX_EXITED exited processes: the one that exited first goes. */
static void evict_exited(void)
{
	while (tab.n_exited > PROC_MAX_EXITED) {
		struct proc *q = NULL;
		for (struct proc *r = tab.head; r != NULL; r = r->next)
			if (r->state == PROC_EXITED && (q == NULL || r->exit_seq < q->exit_seq))
				q = r;
		if (q == NULL)
			return;
		log_debug("process %s: dropped from the table (more than %d exited)", q->id, PROC_MAX_EXITED);
		proc_unlist(q);
	}
}

/* Reaped, and exec had succeeded. */
static void on_exit_(struct proc *p)
{
	ev_timer_stop(loop_(), &p->timeout);
	p->exit_seq = ++tab.exit_seq;
	set_state(p, PROC_EXITED);
	notify_exited(p);
	if (!p->detached)
		proc_unlist(p); /* foreground: in ps only while running */
	else
		evict_exited();
	notify(p);
	check_done(p);
}

static void reaped_cb(void *ud, pid_t pid, int status)
{
	struct proc *p = ud;
	(void)pid;
	proc_ref(p);
	p->reaped = true;
	p->live = false;
	p->status = status;
	p->end_ns = mono_ns();
	if (p->lprev != NULL)
		p->lprev->lnext = p->lnext;
	else
		tab.live = p->lnext;
	if (p->lnext != NULL)
		p->lnext->lprev = p->lprev;
	p->lprev = p->lnext = NULL;
	tab.n_live--;
	log_debug("process %s: pid %d reaped (status 0x%x)", p->id, (int)p->pid, (unsigned)status);
	/* STARTING: exec's result is not read yet; errpipe_cb goes on from here */
	if (p->state == PROC_RUNNING)
		on_exit_(p);
	release_pid(p);
	proc_unref(p);
}

/* ---- exec result ---- */

static void start_io(struct proc *p)
{
	p->io_started = true;
	for (int i = 0; i < 2; i++) {
		struct proc_chan *c = &p->out[i];
		if (c->fd < 0)
			continue;
		if (!p->detached && p->owner == NULL) {
			chan_close(c); /* nobody to send it to */
			continue;
		}
		ev_io_set(&c->io, c->fd, EV_READ);
		ev_io_start(loop_(), &c->io);
	}
	if (p->in_fd >= 0) {
		ev_io_set(&p->in_io, p->in_fd, EV_WRITE);
		if (p->in_len > 0 || p->in_fin)
			ev_io_start(loop_(), &p->in_io);
	}
}

/* The exec's result: f is the child's failure record, NULL when execve() succeeded. */
static void exec_result(struct proc *p, const struct spawn_failure *f)
{
	struct ev_loop *loop = loop_();
	proc_ref(p);
	if (f != NULL) {
		struct shim_err e;
		spawn_failure_err(f, p->exec_path, p->cwd, &e);
		log_debug("process %s: could not start: %s: %s", p->id, e.msg, strerror(e.code));
		set_state(p, PROC_FAILED);
		if (p->owner != NULL)
			p->owner_ops->failed(p, p->owner, &e);
		chan_close(&p->out[0]);
		chan_close(&p->out[1]);
		p->in_owner = NULL;
		stdin_close(p);
		proc_unlist(p);
	} else {
		set_state(p, PROC_RUNNING);
		if (p->owner != NULL)
			p->owner_ops->started(p, p->owner);
		start_io(p);
		if (p->timeout_ms > 0 && !p->reaped) {
			ev_now_update(loop); /* the timeout counts from now, not from the loop's wakeup */
			ev_timer_set(&p->timeout, p->timeout_ms / 1000.0, 0.);
			ev_timer_start(loop, &p->timeout);
		}
		if (p->reaped)
			on_exit_(p);
	}
	release_pid(p);
	proc_unref(p);
}

static void errpipe_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	struct proc *p = container_of(w, struct proc, errio);
	struct spawn_failure f;
	ssize_t n = read(p->errfd, &f, sizeof(f));
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	ev_io_stop(loop, w);
	close(p->errfd);
	p->errfd = -1;
	/* EOF: execve() closed the pipe (CLOEXEC): it runs */
	exec_result(p, n == (ssize_t)sizeof(f) ? &f : NULL);
}

void proc_spawned(struct proc *p, pid_t pid, struct spawn_plan *pl, uint64_t forked_at)
{
	p->pid = pid;
	p->live = true;
	p->refs++; /* the pid's */
	p->start_ns = mono_ns();
	clock_gettime(CLOCK_REALTIME, &p->started_at);
	p->lnext = tab.live;
	if (tab.live != NULL)
		tab.live->lprev = p;
	tab.live = p;
	tab.n_live++;
	if (reaper_watch_since(pid, reaped_cb, p, forked_at) < 0) {
		/* cannot happen short of memory; then the exit would never be seen */
		log_error("process %s: cannot watch pid %d: %s", p->id, (int)pid, strerror(errno));
	}
	p->errfd = steal_fd(pl->errp_r);
	p->out[0].fd = steal_fd(pl->out_fd);
	p->out[1].fd = steal_fd(pl->err_fd);
	p->in_fd = steal_fd(pl->in_fd);
	p->has_stdin = p->in_fd >= 0;
	p->pty = pl->pty;
	p->veof = pl->veof;
	p->exec_path = steal_ptr(pl->path);
	p->cwd = steal_ptr(pl->cwd);
	if (p->detached)
		for (int i = 0; i < 2; i++)
			ring_init(&p->out[i].ring, p->ring_bytes);
	/* argv for ps, bounded */
	size_t total = 0;
	for (size_t i = 0; i < pl->argc; i++)
		total += strlen(pl->argv[i]) + 1;
	if (total > PROC_ARGV_KEEP)
		total = PROC_ARGV_KEEP;
	p->argv = malloc(total ? total : 1);
	if (p->argv != NULL) {
		size_t off = 0;
		for (size_t i = 0; i < pl->argc && off < total; i++) {
			size_t l = strlen(pl->argv[i]);
			if (l > total - off - 1)
				l = total - off - 1;
			memcpy(p->argv + off, pl->argv[i], l);
			p->argv[off + l] = '\0';
			off += l + 1;
			p->argc++;
		}
		p->argv_len = off;
	}
	/* After a vfork the child has exec'd or failed already, and said which in pl */
	if (p->errfd < 0) {
		exec_result(p, pl->vfailed ? &pl->vfail : NULL);
		return;
	}
	ev_io_set(&p->errio, p->errfd, EV_READ);
	ev_io_start(loop_(), &p->errio);
}

void proc_set_owner(struct proc *p, const struct proc_owner_ops *ops, void *owner)
{
	p->owner_ops = ops;
	p->owner = owner;
}

void proc_abandon(struct proc *p)
{
	proc_set_owner(p, NULL, NULL);
	if (p->live)
		proc_kill(p, SIGKILL, false);
	if (p->state == PROC_STARTING)
		proc_unlist(p); /* the client never learned about it */
	chan_close(&p->out[0]);
	chan_close(&p->out[1]);
	proc_stdin_release(p, p->in_owner);
	stdin_close(p);
	ev_timer_stop(loop_(), &p->timeout);
	check_done(p);
}

/* ---- output ---- */

/* Read a channel. Foreground: only as much as the owner takes (a client that does
 * not read blocks the command on its pipe), except in collect mode past the cap,
 * where bytes are read and dropped. Detached: always, into the ring. */
static void chan_read(struct proc_chan *c, int rounds)
{
	struct proc *p = c->p;
	bool got = false;
	for (int round = 0; round < rounds && c->fd >= 0; round++) {
		size_t want = sizeof(rbuf);
		bool drop = false;
		if (!p->detached) {
			if (p->owner == NULL) {
				chan_close(c);
				check_done(p);
				return;
			}
			if (p->output_cap > 0 && c->sent >= p->output_cap) {
				drop = true;
			} else {
				size_t n = p->owner_ops->room(p, p->owner);
				if (n == 0) {
					/* the owner calls proc_owner_writable() */
					ev_io_stop(loop_(), &c->io);
					p->fg_blocked = true;
					return;
				}
				if (n < want)
					want = n;
				if (p->output_cap > 0 && p->output_cap - c->sent < want)
					want = (size_t)(p->output_cap - c->sent);
			}
		}
		if (c->pipe_grown && !drop && !p->detached && c->idx == 0 && p->owner_ops->output_pipe != NULL &&
		    want >= PROC_SPLICE_MIN) {
			/* bulk stdout: what the pipe holds goes on by splice, without passing
			 * through rbuf (a copy out of the pipe and one into the socket) */
			int avail = 0;
			if (ioctl(c->fd, FIONREAD, &avail) == 0 && (size_t)avail >= PROC_SPLICE_MIN) {
				size_t n = (size_t)avail < want ? (size_t)avail : want;
				p->owner_ops->output_pipe(p, p->owner, c->fd, n);
				c->sent += n;
				if (n < want)
					break; /* drained for now */
				continue;
			}
		}
		ssize_t r = read(c->fd, rbuf, want);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			/* EIO: every pty slave fd is closed; anything else ends it too */
			if (errno != EIO)
				log_debug("process %s: read: %s", p->id, strerror(errno));
			r = 0;
		}
		if (r == 0) {
			chan_close(c);
			if (got)
				notify(p);
			check_done(p);
			return;
		}
		if (p->detached) {
			ring_write(&c->ring, rbuf, (size_t)r);
			got = true;
		} else if (drop) {
			c->truncated = true;
		} else {
			p->owner_ops->output(p, p->owner, c->idx, rbuf, (size_t)r);
			c->sent += (uint64_t)r;
		}
		if ((size_t)r >= FRAME_DATA_CHUNK && !c->pipe_grown && !p->pty) {
			/* the command writes faster than we read: a deeper pipe, so that it
			 * blocks less often and we read more per call */
			c->pipe_grown = true;
			fcntl(c->fd, F_SETPIPE_SZ, (int)sizeof(rbuf));
		}
		if ((size_t)r < want)
			break; /* drained for now */
	}
	if (got)
		notify(p);
}

static void chan_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct proc_chan *c = container_of(w, struct proc_chan, io);
	struct proc *p = c->p;
	proc_ref(p);
	chan_read(c, READ_ROUNDS);
	proc_unref(p);
}

void proc_owner_writable(struct proc *p)
{
	p->fg_blocked = false;
	if (!p->io_started)
		return;
	for (int i = 0; i < 2; i++)
		if (p->out[i].fd >= 0 && !ev_is_active(&p->out[i].io))
			ev_io_start(loop_(), &p->out[i].io);
}

/* ---- stdin ---- */

static void stdin_flush(struct proc *p)
{
	if (p->in_fd < 0 || !p->io_started)
		return;
	size_t done = 0;
	while (done < p->in_len) {
		ssize_t w = write(p->in_fd, p->in_buf + done, p->in_len - done);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			/* EPIPE: the command closed its stdin; the rest is dropped */
			if (done > 0 && p->in_owner != NULL)
				p->in_ops->taken(p, p->in_owner, done);
			memmove(p->in_buf, p->in_buf + done, p->in_len - done);
			p->in_len -= done;
			stdin_close(p);
			return;
		}
		done += (size_t)w;
	}
	if (done > 0) {
		memmove(p->in_buf, p->in_buf + done, p->in_len - done);
		p->in_len -= done;
		if (p->in_owner != NULL)
			p->in_ops->taken(p, p->in_owner, done);
	}
	if (p->in_len > 0) {
		ev_io_start(loop_(), &p->in_io);
		return;
	}
	ev_io_stop(loop_(), &p->in_io);
	if (p->in_fin) {
		p->in_fin = false;
		if (p->pty) {
			/* A terminal has no "close" short of hanging up: the end of input is
			 * its EOF character, as typing ^D. Best effort: a full tty drops it. */
			ssize_t w = write(p->in_fd, &p->veof, 1);
			(void)w;
		} else {
			stdin_close(p);
		}
	}
}

static void stdin_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	struct proc *p = container_of(w, struct proc, in_io);
	proc_ref(p);
	stdin_flush(p);
	proc_unref(p);
}

void proc_stdin_take(struct proc *p, const struct proc_owner_ops *ops, void *owner)
{
	p->in_ops = ops;
	p->in_owner = owner;
	p->in_fin = false;
}

int proc_stdin_data(struct proc *p, const uint8_t *buf, size_t len, bool fin, struct shim_err *err)
{
	if (len > 0) {
		/* stdin closed (the command closed it, or an earlier FIN): dropped, but the
		 * credit goes back so that the client is not stuck */
		bool closed = p->state != PROC_STARTING && p->in_fd < 0;
		if (closed || p->done) {
			p->in_ops->taken(p, p->in_owner, len);
		} else {
			if (p->in_len + len > p->in_cap) {
				/* The client cannot have more in flight than the credit we
				 * granted, which is what we have not written yet: so this
				 * only grows up to the window. */
				size_t cap = p->in_cap ? p->in_cap : 16384;
				while (cap < p->in_len + len)
					cap *= 2;
				if (cap > (size_t)INT32_MAX)
					return err_set(err, ENOBUFS, NULL, "stdin buffer full");
				uint8_t *n = realloc(p->in_buf, cap);
				if (n == NULL)
					return err_set(err, ENOMEM, NULL, "out of memory");
				p->in_buf = n;
				p->in_cap = cap;
			}
			memcpy(p->in_buf + p->in_len, buf, len);
			p->in_len += len;
		}
	}
	if (fin)
		p->in_fin = true;
	stdin_flush(p);
	return 0;
}

/* The stdin pipe's capacity for splices: its bytes, the client's window (256 KiB) twice
 * over, since a splice from a socket may fill a pipe's slot with less than a page. */
#define STDIN_PIPE_SIZE (512u << 10)

int proc_stdin_pipe(struct proc *p, void *owner, size_t n)
{
	if (p->in_owner != owner || owner == NULL || p->pty || p->in_fd < 0 || !p->io_started || p->done ||
	    p->in_len > 0 || p->in_fin)
		return -1;
	if (p->in_pipe_size == 0) {
		/* raised at the first big write only: most commands' stdin never needs it */
		int sz = fcntl(p->in_fd, F_SETPIPE_SZ, (int)STDIN_PIPE_SIZE);
		if (sz < 0)
			sz = fcntl(p->in_fd, F_GETPIPE_SZ);
		p->in_pipe_size = sz > 0 ? (size_t)sz : 1;
	}
	int queued = 0;
	if (ioctl(p->in_fd, FIONREAD, &queued) < 0 || queued < 0)
		return -1;
	return (size_t)queued + n <= p->in_pipe_size ? p->in_fd : -1;
}

void proc_stdin_piped(struct proc *p, size_t n, bool fin)
{
	/* in the pipe: taken, the writer's credit goes back as for a write() */
	if (n > 0 && p->in_owner != NULL)
		p->in_ops->taken(p, p->in_owner, n);
	if (fin)
		p->in_fin = true;
	stdin_flush(p);
}

void proc_stdin_release(struct proc *p, void *owner)
{
	if (owner == NULL || p->in_owner != owner)
		return;
	p->in_owner = NULL;
	p->in_len = 0;
	p->in_fin = false;
	ev_io_stop(loop_(), &p->in_io);
}

/* ---- attachments ---- */

void proc_attach_add(struct proc *p, struct proc_attachment *a)
{
	a->gen = notify_gen; /* a notification running now has not told it */
	a->next = p->attached;
	p->attached = a;
}

void proc_attach_remove(struct proc *p, struct proc_attachment *a)
{
	for (struct proc_attachment **pp = &p->attached; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			a->next = NULL;
			return;
		}
	}
}

/* ---- the whole table ---- */

unsigned proc_running(void)
{
	return tab.n_live;
}

void proc_signal_all(int sig)
{
	/* at once, from the loop: the daemon may exit right after (init.c deals with
	 * what was reparented to it) */
	for (struct proc *p = tab.live; p != NULL; p = p->lnext)
		group_kill(p, sig);
}

unsigned proc_groups(pid_t *pgids, unsigned max)
{
	unsigned n = 0;
	for (struct proc *p = tab.live; p != NULL && n < max; p = p->lnext)
		pgids[n++] = p->pid; /* each command leads its own session and group */
	return n;
}
