/* listen.h: listening sockets for every transport, and accepting connections on them. */
#ifndef SHIM_LISTEN_H
#define SHIM_LISTEN_H

#include <ev.h>
#include <stdbool.h>
#include <sys/types.h>

#include "err.h"

struct server;

enum listener_kind { LISTEN_UNIX, LISTEN_TCP, LISTEN_VSOCK };

struct listener {
	enum listener_kind kind;
	struct server *srv;
	int fd;
	ev_io io;
	ev_timer retry; /* accept paused after EMFILE */
	bool need_token;
	unsigned n_pending; /* its connections that have not completed HELLO */
	char addr[300];     /* as given, with the real port for tcp:HOST:0 */
	char *unlink_path;  /* unix socket file to remove at close */
	ino_t unix_ino;     /* its inode */
};

/* Create and bind a listener for spec ("unix:PATH", "tcp:HOST:PORT", "vsock:CID:PORT").
 * Returns NULL with err filled. */
struct listener *listener_open(struct server *s, const char *spec, struct shim_err *err);
void listener_start(struct listener *l);
/* Stop accepting, close, and remove a unix socket file. */
void listener_close(struct listener *l);

/* Log a refused connection (at accept, or in the handshake) at warn level, at most one
 * line a second for the whole daemon: refusals in between are counted, and the count
 * is logged when the second is over. */
void listen_log_refusal(struct server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Start-up, once the listeners (and a workload) are set up: keep a spare fd for
 * refusing connections when the fds run out, and clamp cfg.max_connections to what
 * RLIMIT_NOFILE allows, budgeting LISTEN_FDS_PER_CONN fds per connection (logged
 * once), and each listener's cfg.max_pending (one fd each) to a quarter of them.
 * asked, asked_pending: --max-connections, --max-pending were given (a clamp is then
 * a warning). */
#define LISTEN_FDS_PER_CONN 8
#define LISTEN_FDS_DAEMON 16
void listen_fd_budget(struct server *s, bool asked, bool asked_pending);

/* Transport-specific parts (tr_*.c). Each returns a listening fd or -1 with err. */
/* unix: the socket's inode into *ino (its file is removed at close only while it is still ours) */
int tr_unix_listen(struct server *s, const char *path, ino_t *ino, struct shim_err *err);
int tr_tcp_listen(const char *hostport, char *bound, size_t bound_size, struct shim_err *err);
int tr_vsock_listen(const char *cidport, struct shim_err *err);
/* Peer checks after accept: 0 to admit, -1 with err to refuse. */
int tr_unix_check_peer(struct server *s, int fd, char *peer, size_t peer_size, struct shim_err *err);
void tr_tcp_describe_peer(int fd, char *peer, size_t peer_size);
void tr_vsock_describe_peer(int fd, char *peer, size_t peer_size);
/* The --stdio connection on fds 0 and 1. */
int tr_stdio_start(struct server *s, struct shim_err *err);

#endif
