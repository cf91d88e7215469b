/* server.h: the daemon's global state: configuration, listeners, connections, shutdown. */
#ifndef SHIM_SERVER_H
#define SHIM_SERVER_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SHIM_MAX_ALLOW_UIDS 16
#define SHIM_MAX_LISTENERS 16
/* root's default --state-dir: tmpfs (credentials never reach a disk), apart from the
 * image's shared socket directory /run/sandbox-shim */
#define SHIM_STATE_DIR_ROOT "/run/sandbox-shim-state"

struct conn;
struct listener;

struct server_config {
	unsigned max_connections; /* admitted (HELLO_OK) connections, every listener together */
	unsigned max_pending;     /* per listener: connections that have not completed HELLO */
	unsigned max_streams;
	uint32_t max_frame;
	uint32_t initial_window;
	unsigned workers;
	unsigned max_workers;
	size_t max_buffer;        /* bytes buffered daemon-wide for the peers (budget.h) */
	unsigned max_jobs;        /* backups and restores running at once (the others queue) */
	double keepalive;         /* seconds of silence before a PING; 0 = off */
	double handshake_timeout; /* seconds from accept to an accepted HELLO; 0 = none */
	double shutdown_timeout;  /* seconds to finish in-flight work on SIGTERM */
	double kill_grace;        /* shutdown: seconds from SIGTERM to SIGKILL for children */
	char *token;              /* NULL: no token configured */
	size_t token_len;
	bool insecure_no_token;
	mode_t socket_mode;
	gid_t socket_gid; /* (gid_t)-1: leave as created */
	uid_t allow_uids[SHIM_MAX_ALLOW_UIDS];
	unsigned n_allow_uids;
	const char *root;    /* --root: every file path resolves beneath it (NULL: "/") */
	char state_dir[256]; /* private runtime state: pending-write journal, ... (0700) */

	unsigned max_watches;       /* inotify watches of one watch stream (a request may ask for fewer) */
	unsigned max_watches_total; /* inotify watches of every watch stream together */
};

struct server {
	struct ev_loop *loop;
	struct server_config cfg;
	struct listener *listeners[SHIM_MAX_LISTENERS];
	unsigned n_listeners;
	struct conn *conns;  /* doubly linked, live connections */
	struct conn *dead;   /* closed, freed before the loop sleeps */
	unsigned n_conns;    /* every live connection */
	unsigned n_admitted; /* of which past HELLO_OK (the others: their listener's n_pending) */
	unsigned n_streams;
	uint64_t start_ns;
	pid_t pid;
	bool pid1;
	char hostname[256];
	char boot_id[40];
	bool shutting_down;
	bool streams_closed;   /* shutdown: every connection's streams ended */
	bool shutdown_expired; /* the shutdown timeout has passed */
	bool stdio_mode;       /* exit when the stdio connection closes */
	int exit_code;         /* the workload's status, if there is one */
	ev_signal sig_term, sig_int;
	ev_prepare prepare; /* flush output and free dead connections before sleeping */
	ev_timer shutdown_timer;
};

extern struct server *srv;

/* Fill cfg with defaults. */
void server_config_defaults(struct server_config *cfg);
/* Set up the loop, workers and signal handling; listeners are added afterwards. */
int server_init(struct server *s, struct ev_loop *loop);
int server_add_listener(struct server *s, struct listener *l);
/* Stop accepting, cancel what is in flight, flush, close; ends the loop when done
 * or when the shutdown timeout passes. */
void server_shutdown(struct server *s, const char *why);
void server_free(struct server *s);
/* A space-separated feature list for HELLO_OK and info. */
extern const char *const server_features[];

#endif
