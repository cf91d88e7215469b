/* listen.c: listeners common to every transport: accept, connection limit, peer checks. */
#include "listen.h"
#include "conn.h"
#include "dispatch.h"
#include "frame.h"
#include "log.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
		l->fd = tr_unix_listen(s, spec + 5, err);
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
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* out of descriptors: pause accepting instead of spinning */
				log_warn("accept on %s: %s; pausing for 100 ms", l->addr, strerror(errno));
				ev_io_stop(loop, &l->io);
				l->retry.repeat = 0.1;
				ev_timer_again(loop, &l->retry);
			}
			return;
		}
		char peer[96];
		struct shim_err e;
		if (s->n_conns >= s->cfg.max_connections) {
			log_warn("refusing a connection on %s: too many connections (limit %u)", l->addr,
				 s->cfg.max_connections);
			err_set(&e, EAGAIN, NULL, "too many connections (limit %u)", s->cfg.max_connections);
			refuse(fd, &e);
			continue;
		}
		switch (l->kind) {
		case LISTEN_UNIX:
			if (tr_unix_check_peer(s, fd, peer, sizeof(peer), &e) < 0) {
				log_warn("refusing %s on %s: %s", peer, l->addr, e.msg);
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
