/* server.c: the daemon's global state, signal handling and graceful shutdown. */
#include "server.h"
#include "budget.h"
#include "conn.h"
#include "frame.h"
#include "init.h"
#include "listen.h"
#include "log.h"
#include "mount.h"
#include "ops.h"
#include "proc.h"
#include "reaper.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct server *srv;

const char *const server_features[] = {"info", "echo", "fs", "exec", "backup", "tunnel", "mount", "snapshot", NULL};

void server_config_defaults(struct server_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->max_connections = 1024;
	cfg->max_pending = 32;
	cfg->max_streams = 256;
	cfg->max_frame = FRAME_DEFAULT_MAX;
	cfg->initial_window = FRAME_DEFAULT_WINDOW;
	cfg->workers = 1;
	cfg->max_workers = 64;
	cfg->max_buffer = BUDGET_DEFAULT;
	cfg->max_jobs = 16; /* BACKUP_JOB_DEFAULT_MAX */
	cfg->max_watches = 8192;
	cfg->max_watches_total = 65536;
	cfg->keepalive = 60;
	cfg->handshake_timeout = 10;
	cfg->shutdown_timeout = 10;
	cfg->kill_grace = 5;
	cfg->socket_gid = (gid_t)-1;
}

/* Shutdown, once no command runs any more: end every stream and close. */
static void server_close_streams_if_idle(struct server *s)
{
	if (s->streams_closed || proc_running() > 0)
		return;
	s->streams_closed = true;
	for (struct conn *c = s->conns, *next; c != NULL; c = next) {
		next = c->next;
		conn_shutdown(c);
		/* now: this may run from prepare_cb, after its flush, and nothing else
		 * would wake the loop for it */
		conn_flush(c);
	}
}

static void prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)loop;
	(void)revents;
	struct server *s = container_of(w, struct server, prepare);
	for (struct conn *c = s->conns, *next; c != NULL; c = next) {
		next = c->next;
		if (c->want_flush)
			conn_flush(c);
	}
	conn_reap_dead(s);
	/* the end: every connection closed and every child gone (or given up on) */
	if (s->shutting_down)
		server_close_streams_if_idle(s);
	if (s->shutting_down && s->conns == NULL && init_shutdown_done(s) &&
	    (op_snapshot_thawing() == 0 || s->shutdown_expired)) {
		ev_timer_stop(loop, &s->shutdown_timer);
		ev_break(loop, EVBREAK_ALL);
	}
}

/* Without a workload; with one, init.c reads every signal (SIGTERM still ends up in
 * server_shutdown(), SIGINT is the workload's). */
static void signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	server_shutdown(srv, w->signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void shutdown_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	(void)w;
	log_warn("shutdown: timeout; closing the remaining connections");
	srv->shutdown_expired = true; /* a thaw still under way is not waited for (at exit, atexit's is) */
	for (struct conn *c = srv->conns, *next; c != NULL; c = next) {
		next = c->next;
		conn_close(c, "shutdown timeout");
	}
	conn_reap_dead(srv);
	/* the loop ends in prepare_cb once the children are gone too (bounded by the
	 * kill grace) */
	(void)loop;
}

static void read_small_file(const char *path, char *buf, size_t size)
{
	buf[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	ssize_t n = read(fd, buf, size - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

int server_init(struct server *s, struct ev_loop *loop)
{
	s->loop = loop;
	s->start_ns = mono_ns();
	s->pid = getpid();
	s->pid1 = s->pid == 1;
	if (gethostname(s->hostname, sizeof(s->hostname) - 1) < 0)
		s->hostname[0] = '\0';
	/* start-up may block: the loop is not running yet */
	read_small_file("/proc/sys/kernel/random/boot_id", s->boot_id, sizeof(s->boot_id));
	srv = s;

	signal(SIGPIPE, SIG_IGN);
	ev_signal_init(&s->sig_term, signal_cb, SIGTERM);
	ev_signal_init(&s->sig_int, signal_cb, SIGINT);
	ev_signal_start(loop, &s->sig_term);
	ev_signal_start(loop, &s->sig_int);
	ev_unref(loop);
	ev_unref(loop);
	ev_prepare_init(&s->prepare, prepare_cb);
	ev_prepare_start(loop, &s->prepare);
	ev_unref(loop);
	ev_init(&s->shutdown_timer, shutdown_timeout_cb);
	if (reaper_init(loop) < 0)
		return -1;
	budget_init(loop, s->cfg.max_buffer, conn_budget_wake, conn_budget_trim);
	if (worker_init(loop, s->cfg.workers, s->cfg.max_workers) < 0) {
		log_error("cannot start worker threads: %s", strerror(errno));
		return -1;
	}
	return 0;
}

int server_add_listener(struct server *s, struct listener *l)
{
	if (s->n_listeners >= SHIM_MAX_LISTENERS)
		return -1;
	s->listeners[s->n_listeners++] = l;
	listener_start(l);
	return 0;
}

/* Shutdown, once the workload (if any) has exited: SIGTERM to every child (commands,
 * orphans, what the workload left; as PID 1 every process) but those that had one,
 * SIGKILL after the kill grace. */
static void shutdown_children(struct server *s)
{
	/* ---- mounts: flushed and unmounted first (rclone would get the TERM too; a
	 * workload may use them to its end); the children's TERM follows when they are
	 * done (bounded by the shutdown timeout) ---- */
	if (!op_mount_shutdown_begin(s, init_shutdown_begin))
		init_shutdown_begin(s);
}

void server_shutdown(struct server *s, const char *why)
{
	if (s->shutting_down)
		return;
	s->shutting_down = true;
	log_info("shutting down (%s)", why);
	/* nothing stays frozen or stopped by a snapshot_prepare */
	op_snapshot_shutdown();
	for (unsigned i = 0; i < s->n_listeners; i++)
		listener_close(s->listeners[i]);
	/* A workload first gets its SIGTERM and all the time it takes (the shim's
	 * commands get theirs too, and SIGKILL after the kill grace); then, or at once
	 * without one, shutdown_children(): so that commands ended by their stream's
	 * cancel below have had the TERM too */
	init_shutdown_workload(s, shutdown_children);
	/* Streams of running commands stay open through the grace period, so that a
	 * command ending on the TERM reports its real exit status; the rest end now.
	 * prepare_cb closes the connections once no command runs (after the TERM, or
	 * the KILL at the end of the grace). New requests are refused meanwhile. */
	server_close_streams_if_idle(s);
	s->shutdown_timer.repeat = s->cfg.shutdown_timeout;
	/* the prepare watcher ends the loop once every connection has closed and every
	 * child is gone; this timer bounds the connections, the kill grace the children */
	ev_timer_again(s->loop, &s->shutdown_timer);
}

void server_free(struct server *s)
{
	for (unsigned i = 0; i < s->n_listeners; i++)
		listener_close(s->listeners[i]);
	/* the connections before their listeners: closing one updates its listener's count */
	for (struct conn *c = s->conns, *next; c != NULL; c = next) {
		next = c->next;
		conn_close(c, "exit");
	}
	conn_reap_dead(s);
	for (unsigned i = 0; i < s->n_listeners; i++)
		free(s->listeners[i]);
	s->n_listeners = 0;
	worker_shutdown();
	free(s->cfg.token);
	s->cfg.token = NULL;
}
