/* proc.h: the table of processes the shim started: ids, state, exit statuses, output pipes, ring buffers. */
#ifndef SHIM_PROC_H
#define SHIM_PROC_H

#include <ev.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "err.h"
#include "ring.h"

struct spawn_plan;

/* Limits (see PROTOCOL.md, commands). */
#define PROC_MAX_ACTIVE 1024         /* starting or running; EAGAIN beyond */
#define PROC_MAX_EXITED 1024         /* exited detached processes kept; the oldest dropped */
#define PROC_RING_DEFAULT (1u << 20) /* per stream */
#define PROC_RING_MAX (16u << 20)    /* largest ring_bytes a request may ask for */
#define PROC_READ_MAX (256u << 10)   /* output read (or spliced as one frame) at a time */
#define PROC_LINGER_MS 100           /* output still open this long after the exit: cut */
#define PROC_GRACE_DEFAULT_MS 5000   /* SIGTERM -> SIGKILL on timeout */
#define PROC_ID_MAX 63               /* [A-Za-z0-9._-]{1,63} */
#define PROC_ARGV_KEEP 4096          /* bytes of argv kept for ps */

enum proc_state {
	PROC_STARTING, /* being prepared or forked; not visible by id yet */
	PROC_RUNNING,  /* exec succeeded */
	PROC_EXITED,   /* reaped */
	PROC_FAILED,   /* could not be started (the exec stream got the error) */
};

/* One output channel: stdout or stderr (with a pty only [0], the master). */
struct proc_chan {
	struct proc *p;
	int idx; /* 0 stdout, 1 stderr */
	int fd;  /* our read end; -1 once at EOF or cut */
	ev_io io;
	struct ring ring; /* detached: the newest ring_bytes of output */
	uint64_t sent;    /* foreground: bytes handed to the owner */
	bool truncated;   /* collect mode: bytes were dropped */
	bool pipe_grown;  /* made deeper once a read found it full (proc.c) */
};

/* How the table reports to the operations (op_exec.c, op_proc.c). Each callback gets
 * the process and the opaque owner pointer it was registered with; a kind of owner
 * leaves NULL what it has no use for. proc.c knows no streams: framing output as DATA
 * and the credit of both directions stay with the owner. */
struct proc_owner_ops {
	/* The owner of the process (the exec request: proc_set_owner). */
	void (*started)(struct proc *p, void *owner);                            /* execve() succeeded */
	void (*failed)(struct proc *p, void *owner, const struct shim_err *err); /* it could not start */
	/* Foreground output: bytes it can take now; 0 when it cannot, and then it calls
	 * proc_owner_writable() once it can. */
	size_t (*room)(struct proc *p, void *owner);
	void (*output)(struct proc *p, void *owner, int chan, const uint8_t *buf, size_t len); /* chan 1: stderr */
	/* Optional: stdout's next len bytes, which are in the pipe fd, taken straight from it
	 * (splice: the pipe's pages go to the client without being copied twice). */
	void (*output_pipe)(struct proc *p, void *owner, int fd, size_t len);
	void (*finished)(struct proc *p, void *owner); /* reaped, and the output closed */

	/* An attachment (proc_attach_add): attach, wait, rmproc. */
	void (*exited)(struct proc *p, void *owner);  /* reaped: it is taken off first */
	void (*changed)(struct proc *p, void *owner); /* new output in the rings, the exit, output closed */

	/* The stdin writer (proc_stdin_take): n of its bytes were written, or dropped
	 * (its credit to hand back). */
	void (*taken)(struct proc *p, void *owner, size_t n);
};

/* One attachment; the owner keeps it (usually inside its own struct). */
struct proc_attachment {
	const struct proc_owner_ops *ops;
	void *owner;
	struct proc_attachment *next;
	unsigned gen; /* visited by the current notification */
};

struct proc {
	char id[PROC_ID_MAX + 1];
	pid_t pid; /* also the process group and session id; 0 before fork */
	enum proc_state state;
	unsigned refs;
	bool listed; /* in the id table */
	bool live;   /* forked and not yet reaped */
	bool reaped; /* exit status collected (maybe before the exec result was read) */
	bool detached, pty, timed_out, done;
	bool io_started;            /* exec succeeded: pipes watched, stdin written */
	bool fg_blocked;            /* the owner ran out of credit or room */
	bool pid_released;          /* the pid's reference was dropped */
	uint64_t exit_seq;          /* order of exits, for the retention of exited processes */
	int status;                 /* raw wait status */
	struct timespec started_at; /* wall clock */
	uint64_t start_ns, end_ns;  /* monotonic */
	uint64_t output_cap;        /* foreground collect mode: bytes per stream; 0 = stream */
	uint32_t timeout_ms, grace_ms;
	size_t ring_bytes;

	/* argv for ps: NUL-separated, at most PROC_ARGV_KEEP bytes */
	char *argv;
	size_t argv_len;
	unsigned argc;
	char *exec_path, *cwd; /* for the exec error message */

	struct proc *hnext;         /* id hash */
	struct proc *prev, *next;   /* table, in creation order */
	struct proc *lprev, *lnext; /* live processes */

	int errfd; /* exec error pipe */
	ev_io errio;
	struct proc_chan out[2];

	/* stdin: a pipe, or a dup of the pty master. Bytes from the writer are written
	 * straight through; what the pipe does not take waits in buf, whose size the
	 * writer's credit bounds (in_ops->taken hands it back as bytes are written). */
	int in_fd;
	ev_io in_io;
	uint8_t *in_buf;
	size_t in_len, in_cap;
	bool in_fin;         /* close (pty: send VEOF) once buf is written */
	size_t in_pipe_size; /* the stdin pipe's capacity, once raised for splices (0 before) */
	bool has_stdin;      /* the command was given a stdin pipe or a pty */
	unsigned char veof;  /* pty: the end-of-file character */
	void *in_owner;      /* the writer, NULL if none */
	const struct proc_owner_ops *in_ops;

	ev_timer timeout, grace, linger;

	/* Descendants outside the command's process group (a setsid() of theirs), found by
	 * the last tree walk (proc.c): still signalled after the leader is gone and they
	 * were reparented to the shim. Start times guard against pid reuse. */
	pid_t *tree;
	unsigned long long *tree_start;
	unsigned ntree;

	void *owner; /* the exec request while its stream lasts, NULL after */
	const struct proc_owner_ops *owner_ops;
	struct proc_attachment *attached; /* newest first */
};

/* Check an id a client chose: 1..63 of [A-Za-z0-9._-]. */
bool proc_id_valid(const char *id);
/* A new process in state STARTING, listed (its id taken) and counted against the
 * limit: EAGAIN beyond PROC_MAX_ACTIVE, EEXIST for a taken name, EINVAL for a bad
 * one. name NULL: a generated id ("p1", "p2", ...). The table holds one reference. */
struct proc *proc_create(const char *name, bool detached, struct shim_err *err);
/* Visible processes by id (not STARTING or FAILED). */
struct proc *proc_lookup(const char *id);
void proc_ref(struct proc *p);
void proc_unref(struct proc *p);
/* Take it out of the table (its id becomes free); drops the table's reference. */
void proc_unlist(struct proc *p);
/* Iterate the table in creation order. */
struct proc *proc_first(void);
struct proc *proc_next(const struct proc *p);

/* The owner (the exec request) or, with NULL, none from now on. */
void proc_set_owner(struct proc *p, const struct proc_owner_ops *ops, void *owner);
/* The fork happened: take over pl's fds and strings, watch the pid and the exec
 * error pipe. The outcome comes back through the owner's started() or failed(). */
/* forked_at: mono_ns() before the fork (reaper_watch_since). */
void proc_spawned(struct proc *p, pid_t pid, struct spawn_plan *pl, uint64_t forked_at);
/* It will never be forked (prepare failed, fork failed, the stream went away
 * first): FAILED, out of the table. */
void proc_start_failed(struct proc *p);
/* Signal the process group (or only the leader). -1 with errno (ESRCH once reaped).
 * SIGTERM, SIGKILL, SIGINT, SIGHUP and SIGQUIT to the group reach the whole command
 * tree, setsid()'d descendants included: the group is stopped (SIGSTOP) so nothing
 * in it exits and orphans its children, a worker walks /proc for every descendant
 * (PPid chains from the leader and from those found before), signals the ones
 * outside the group, then the group gets the signal and SIGCONT. */
int proc_kill(struct proc *p, int sig, bool only_leader);
/* The foreground owner went away: SIGKILL the group, drop its output. */
void proc_abandon(struct proc *p);
/* The owner can take output again: read the pipes. */
void proc_owner_writable(struct proc *p);
/* owner becomes the one writer of stdin (ops->taken gets its credit back); the end
 * of input it may have sent before is forgotten. */
void proc_stdin_take(struct proc *p, const struct proc_owner_ops *ops, void *owner);
/* Stdin bytes from the writer (the caller checks that it is p->in_owner). -1 with err. */
int proc_stdin_data(struct proc *p, const uint8_t *buf, size_t len, bool fin, struct shim_err *err);
/* The stdin pipe's write end, for the connection to splice n more of the writer's bytes
 * into (stream_ops.data_pipe): only when nothing of the writer's waits in the buffer,
 * the command's stdin is a pipe (not a pty) and still open, and n more bytes fit in it
 * now. Else -1, and they come through proc_stdin_data(). */
int proc_stdin_pipe(struct proc *p, void *owner, size_t n);
/* n bytes went into that pipe (fin: the writer's last): as proc_stdin_data's. */
void proc_stdin_piped(struct proc *p, size_t n, bool fin);
/* owner stops being the stdin writer; bytes of it not yet written are dropped. */
void proc_stdin_release(struct proc *p, void *owner);
/* An attachment: add (told of changes from now on), or take away. */
void proc_attach_add(struct proc *p, struct proc_attachment *a);
void proc_attach_remove(struct proc *p, struct proc_attachment *a);

/* Processes running now (for info and shutdown). */
unsigned proc_running(void);
/* Send sig to every running process group the shim started. */
void proc_signal_all(int sig);
/* The process groups of the running commands (at most max of them); their number. */
unsigned proc_groups(pid_t *pgids, unsigned max);

#endif
