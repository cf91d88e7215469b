/* listen.c: listeners common to every transport: accept, connection limit, peer checks. */
#include "listen.h"
#include "conn.h"
#include "dispatch.h"
#include "frame.h"
#include "log.h"
#include "server.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents);
static void retry_cb(struct ev_loop *loop, ev_timer *w, int revents);

struct listener *listener_open(struct server *s, const char *spec, struct shim_err *err)
{
	struct listener *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		err_set(err, ENOMEM, spec, "out of memory");
		return NULL;
	}
	l->srv = s;
	snprintf(l->addr, sizeof(l->addr), "%s", spec);
	if (strncmp(spec, "unix:", 5) == 0) {
		l->kind = LISTEN_UNIX;
		l->fd = tr_unix_listen(s, spec + 5, &l->unix_ino, err);
		if (l->fd >= 0)
			l->unlink_path = strdup(spec + 5);
		l->need_token = s->cfg.token != NULL;
	} else if (strncmp(spec, "tcp:", 4) == 0) {
		l->kind = LISTEN_TCP;
		if (s->cfg.token == NULL && !s->cfg.insecure_no_token) {
			err_set(err, EINVAL, spec,
				"a tcp listener needs --token-file (or --insecure-no-token to accept anyone)");
			free(l);
			return NULL;
		}
		char bound[200];
		l->fd = tr_tcp_listen(spec + 4, bound, sizeof(bound), err);
		if (l->fd >= 0)
			snprintf(l->addr, sizeof(l->addr), "tcp:%s", bound);
		l->need_token = s->cfg.token != NULL;
	} else if (strncmp(spec, "vsock:", 6) == 0) {
		l->kind = LISTEN_VSOCK;
		l->fd = tr_vsock_listen(spec + 6, err);
		l->need_token = s->cfg.token != NULL;
	} else {
		err_set(err, EINVAL, spec, "unknown listen address (want unix:PATH, tcp:HOST:PORT or vsock:CID:PORT)");
		l->fd = -1;
	}
	if (l->fd < 0) {
		free(l);
		return NULL;
	}
	ev_io_init(&l->io, accept_cb, l->fd, EV_READ);
	ev_init(&l->retry, retry_cb);
	return l;
}

void listener_start(struct listener *l)
{
	ev_io_start(l->srv->loop, &l->io);
	log_info("listening on %s", l->addr);
}

void listener_close(struct listener *l)
{
	ev_io_stop(l->srv->loop, &l->io);
	ev_timer_stop(l->srv->loop, &l->retry);
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	if (l->unlink_path != NULL) {
		/* only our socket: not what someone put at the path since */
		struct stat st;
		if (lstat(l->unlink_path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == l->unix_ino)
			unlink(l->unlink_path);
		free(l->unlink_path);
		l->unlink_path = NULL;
	}
}

/* Tell a refused peer why, in one ERROR frame, without waiting for its HELLO. The
 * socket is fresh, so a frame this small goes out in one write or not at all. */
static void refuse(int fd, const struct shim_err *e)
{
	uint8_t buf[FRAME_HDR_LEN + 1600];
	size_t n = disp_pack_error(e, buf + FRAME_HDR_LEN, sizeof(buf) - FRAME_HDR_LEN);
	struct frame_hdr h = {.len = (uint32_t)n, .type = FRAME_ERROR};
	frame_put_hdr(buf, &h);
	ssize_t w = send(fd, buf, FRAME_HDR_LEN + n, MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)w;
	close(fd);
}

/* ---- refusals: at most one log line a second ---- */

static struct {
	ev_timer window; /* active: a line went out less than a second ago */
	bool ready;
	unsigned suppressed; /* refusals since, not logged */
	char last[300];      /* the last of them */
} refusals;

static void refusals_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	if (refusals.suppressed == 0) {
		ev_timer_stop(loop, w); /* the next refusal is logged at once */
		return;
	}
	log_warn("%u more connection%s refused in the last second (the last: %s)", refusals.suppressed,
		 refusals.suppressed == 1 ? "" : "s", refusals.last);
	refusals.suppressed = 0; /* the timer repeats: this line opens a new second */
}

void listen_log_refusal(struct server *s, const char *fmt, ...)
{
	if (!refusals.ready) {
		ev_init(&refusals.window, refusals_cb);
		refusals.window.repeat = 1.0;
		refusals.ready = true;
	}
	char line[sizeof(refusals.last)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (ev_is_active(&refusals.window)) {
		refusals.suppressed++;
		memcpy(refusals.last, line, sizeof(line));
		return;
	}
	log_warn("%s", line);
	ev_timer_again(s->loop, &refusals.window);
}

/* ---- the fd budget ---- */

/* An fd kept open for one purpose: when accept() meets EMFILE, it is closed, the
 * connection accepted, told why it is refused and closed, and the spare taken again
 * (the classic trick: otherwise the client would hang in the backlog, or the
 * listener would spin on a readable socket it cannot accept from). */
static int spare_fd = -1;

static void spare_take(void)
{
	if (spare_fd < 0)
		spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static unsigned open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return 16; /* no /proc: a guess on the safe side of an idle daemon */
	unsigned n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n > 0 ? n - 1 : 0; /* opendir's own */
}

void listen_fd_budget(struct server *s, bool asked, bool asked_pending)
{
	spare_take();
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return;
	unsigned used = open_fds();
	rlim_t reserved = (rlim_t)used + LISTEN_FDS_DAEMON;
	rlim_t avail = rl.rlim_cur > reserved ? rl.rlim_cur - reserved : 0;
	/* one fd for each connection a listener may hold before HELLO: at most a quarter
	 * of what is left, the rest for the admitted */
	unsigned nl = s->n_listeners > 0 ? s->n_listeners : 1;
	if ((rlim_t)nl * s->cfg.max_pending > avail / 4) {
		unsigned p = (unsigned)(avail / 4 / nl);
		if (p < 1)
			p = 1;
		log_msg(asked_pending ? LOG_WARN : LOG_INFO,
			"--max-pending %u lowered to %u: RLIMIT_NOFILE is %llu, %u fds are in use, %u listener%s",
			s->cfg.max_pending, p, (unsigned long long)rl.rlim_cur, used, nl, nl == 1 ? "" : "s");
		s->cfg.max_pending = p;
	}
	avail = avail > (rlim_t)nl * s->cfg.max_pending ? avail - (rlim_t)nl * s->cfg.max_pending : 0;
	rlim_t fit = avail / LISTEN_FDS_PER_CONN;
	if (fit < 1)
		fit = 1;
	if (fit >= s->cfg.max_connections)
		return;
	/* once, at start-up: the limit is what it is for the daemon's life (a warning
	 * when the operator asked for more, news otherwise) */
	log_msg(asked ? LOG_WARN : LOG_INFO,
		"--max-connections %u lowered to %u: RLIMIT_NOFILE is %llu, %u fds are in use, %d kept for the "
		"daemon, %u for connections before HELLO and %d budgeted per connection",
		s->cfg.max_connections, (unsigned)fit, (unsigned long long)rl.rlim_cur, used, LISTEN_FDS_DAEMON,
		s->n_listeners * s->cfg.max_pending, LISTEN_FDS_PER_CONN);
	s->cfg.max_connections = (unsigned)fit;
}

enum spare_result { SPARE_REFUSED, SPARE_NONE_WAITING, SPARE_FAILED };

/* accept() met EMFILE or ENFILE: refuse one waiting connection with the spare fd.
 * The kernel finds no fd before it looks at the queue, so the EMFILE may also mean
 * that nobody is waiting (NONE_WAITING). FAILED: no spare, or another thread took the
 * fd meanwhile. */
static enum spare_result refuse_with_spare(struct listener *l, int accept_errno)
{
	if (spare_fd < 0)
		return SPARE_FAILED;
	close(spare_fd);
	spare_fd = -1;
	int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	int e = errno;
	if (fd >= 0) {
		struct shim_err err;
		err_set(&err, EAGAIN, NULL, "too many connections: the shim is out of file descriptors");
		listen_log_refusal(l->srv, "refusing a connection on %s: accept: %s", l->addr, strerror(accept_errno));
		refuse(fd, &err);
	}
	spare_take();
	return fd >= 0 ? SPARE_REFUSED : e == EAGAIN || e == EWOULDBLOCK ? SPARE_NONE_WAITING : SPARE_FAILED;
}

static void retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	struct listener *l = container_of(w, struct listener, retry);
	if (l->fd >= 0 && !l->srv->shutting_down)
		ev_io_start(loop, &l->io);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	struct listener *l = container_of(w, struct listener, io);
	struct server *s = l->srv;
	for (int i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			int e = errno;
			if (e == EINTR || e == ECONNABORTED)
				continue;
			if (e == EMFILE || e == ENFILE) {
				enum spare_result r = refuse_with_spare(l, e);
				if (r == SPARE_REFUSED)
					continue;
				if (r == SPARE_NONE_WAITING)
					return;
			}
			if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
				/* out of descriptors (or memory) even for a refusal: pause
				 * accepting instead of spinning */
				listen_log_refusal(s, "accept on %s: %s; pausing for 100 ms", l->addr, strerror(e));
				spare_take();
				ev_io_stop(loop, &l->io);
				l->retry.repeat = 0.1;
				ev_timer_again(loop, &l->retry);
			}
			return;
		}
		char peer[96];
		struct shim_err e;
		/* Before HELLO a peer is a stranger: it takes one of its listener's
		 * --max-pending, not one of the --max-connections (conn_admit(), at HELLO),
		 * so strangers on one listener never lock out the clients of another. A
		 * unix socket's peers got past its mode and the peer-credential check: a
		 * host's burst of clients there may be as large as --max-connections. */
		unsigned pending_max = s->cfg.max_pending;
		if (l->kind == LISTEN_UNIX && s->cfg.max_connections > pending_max)
			pending_max = s->cfg.max_connections;
		if (l->n_pending >= pending_max) {
			listen_log_refusal(s,
					   "refusing a connection on %s: too many connections before HELLO (limit %u)",
					   l->addr, pending_max);
			err_set(&e, EAGAIN, NULL, "too many connections before HELLO on this listener (limit %u)",
				pending_max);
			refuse(fd, &e);
			continue;
		}
		switch (l->kind) {
		case LISTEN_UNIX:
			if (tr_unix_check_peer(s, fd, peer, sizeof(peer), &e) < 0) {
				listen_log_refusal(s, "refusing %s on %s: %s", peer, l->addr, e.msg);
				refuse(fd, &e);
				continue;
			}
			break;
		case LISTEN_TCP:
			tr_tcp_describe_peer(fd, peer, sizeof(peer));
			break;
		case LISTEN_VSOCK:
			tr_vsock_describe_peer(fd, peer, sizeof(peer));
			break;
		}
		if (conn_new(s, fd, fd, l, l->need_token, peer) == NULL) {
			log_error("cannot set up a connection: out of memory");
			close(fd);
		}
	}
}
