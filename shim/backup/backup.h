/* backup.h: backups and restores: what the loop side (op_backup.c) and the worker side
 * (backup_walk.c, backup_write.c, restore.c) share. */
#ifndef SHIM_BACKUP_H
#define SHIM_BACKUP_H

#include <ev.h>
#include <locale.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "fs.h"
#include "op.h"

/* A job that runs whole on one thread of its own (libarchive is synchronous; not a
 * pool thread: it waits for the client while its stream has no credit or no data) and
 * talks to the loop while it runs: the loop hands it bytes or takes bytes from it
 * under mu, and it wakes the loop with async. At most --max-jobs run at once; the
 * others wait in a queue on the loop, holding no thread (op_backup.c). */
struct backup_job {
	/* on its thread (op_submit_own); job.op is the request: its stream, and the
	 * identity (op->fsx) the job's helper thread enters too */
	struct op_job job;
	struct ev_loop *loop;
	ev_async async; /* worker -> loop: bytes ready, credit to give back */
	ev_timer timer; /* progress events */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool cancelled;                  /* set by the loop under mu; polled by the worker (atomic load) */
	bool finished;                   /* run() has returned (loop side) */
	bool queued;                     /* waiting for a slot of --max-jobs (loop side) */
	bool running;                    /* counted in the running jobs (loop side) */
	struct backup_job *qnext;        /* the queue of waiting jobs */
	uint64_t items, bytes;           /* progress, written by the worker (atomics) */
	uint64_t sent_items, sent_bytes; /* what the last EVENT said */
	/* the first error of the job's threads (backup_write_run, restore_run): run()
	 * hands it on in job.err */
	struct shim_err err;
};

/* The default --max-jobs: backups and restores running at once, each on a thread of
 * its own (and a backup's walker on another); the next ones wait queued. */
#define BACKUP_JOB_DEFAULT_MAX 16

/* True once the loop has cancelled the job: the worker stops at its next check. */
bool op_backup_job_cancelled(struct backup_job *j);

/* ---- backup ---- */

/* Archive bytes are handed to the loop in buffers of BK_BUF bytes, at most BK_NBUF
 * of them at once: the worker fills one while the loop sends the others. (Measured
 * on /usr/share: with 256 KiB buffers the walker spent a third of its time waiting
 * for the loop, more than with 1 MiB ones; with 3 of them a core was idle a tenth
 * of the time, the two sides taking turns between regions of small files, where the
 * walk is behind, and of big ones, where sending and the client are.) */
#define BK_BUF (1u << 20)
#define BK_NBUF 12
#define BK_NBUF_MIN 3 /* when other backups or restores run: they share the CPUs anyway */

enum { BKB_FREE, BKB_FILLING, BKB_READY };

struct backup_buf {
	uint8_t *data;
	size_t len;    /* bytes in data */
	size_t sent;   /* loop: bytes of data already queued as DATA */
	size_t hashed; /* bytes of data in the stream's sha256 (under mu, by the thread hashing) */
	bool sent_all; /* under mu: the loop is done with it (it is free once hashed too) */
	int state;     /* under mu */
};

/* Paths for the record (skipped, changed): all counted, the first kept up to a byte
 * budget (the record must fit in one frame anyway). */
struct backup_list {
	char **v;
	size_t n, cap, bytes;
	uint64_t total;
};

struct backup {
	struct backup_job j;
	/* the request */
	struct fs_path dir;
	size_t dir_len; /* dir.abs without trailing slashes ("/" -> 0) */
	char **excludes;
	size_t n_excludes;
	int compression; /* Shim__V1__Compression */
	bool has_level;
	int level;
	bool skip_unreadable, one_file_system;
	bool has_to;
	struct fs_path to;
	/* the handoff */
	struct backup_buf buf[BK_NBUF];
	unsigned nbuf;         /* of them in use */
	size_t held;           /* bytes of the daemon's budget they are (stream_reserve) */
	bool counted;          /* in jobs_running (op_backup.c) */
	unsigned fill;         /* worker: the buffer being filled */
	unsigned head;         /* loop: the next buffer to send */
	unsigned hash_head;    /* under mu: the next buffer to hash (in stream order) */
	bool hashing;          /* under mu: a thread is hashing (it owns sha until it clears this) */
	struct sha256_ctx sha; /* streaming: either side (bk_hash_step); worker side with to_path */
	/* the result (worker) */
	uint64_t entries, source_bytes, archive_bytes;
	struct backup_list skipped, changed;
	char id[37];
	char created_at[32];
	char sha_hex[65];
};

/* On the worker: walk b->dir and write the archive through op_backup_output(); to a temp
 * file beside b->to when b->has_to (renamed into place at the end). 0, or -1 with
 * b->j.err set. */
int backup_write_run(struct backup *b);
/* On the worker: len archive bytes for the stream (copied into the handoff buffers,
 * waiting for the loop to take them when all are full). -1 (ECANCELED) once the job
 * is cancelled. */
int op_backup_output(struct backup *b, const void *data, size_t len);
/* On the worker: hand the buffer being filled to the loop (the end of the stream). */
int op_backup_output_flush(struct backup *b);
/* On any job thread with nothing better to do: put the next piece of the stream
 * that is ready into its sha256 (arg: the struct backup). True if it did. */
bool op_backup_hash_idle(void *arg);

void op_backup_list_free(struct backup_list *l);
/* Add path to the list (counted always, kept within its budget). -1 (ENOMEM). */
int backup_walk_list_add(struct backup_list *l, const char *path, size_t len);
/* DIR/rel as the client sees it, for errors and the record: member is a member
 * name ("./a/b"). The length written. */
size_t backup_walk_client_path(const struct backup *b, const char *member, char *buf, size_t size);

/* The walker (backup_walk.c): a thread of its own that walks b->dir and hands each
 * entry to the writer through a queue (backup_queue.h). */
struct backup_queue;
struct backup_walk;
/* Open DIR and get ready; NULL with *err. */
struct backup_walk *backup_walk_new(struct backup *b, struct shim_err *err);
/* Leave out name and tmp in the directory (dev, ino): the archive being written. */
void backup_walk_skip(struct backup_walk *w, dev_t dev, ino_t ino, const char *name, const char *tmp);
/* Start the thread. -1 with *err. */
int backup_walk_start(struct backup_walk *w, struct backup_queue *q, struct shim_err *err);
/* Stop the thread (if it runs) and wait for it. */
void backup_walk_stop(struct backup_walk *w);
void backup_walk_free(struct backup_walk *w);

/* ---- restore ---- */

struct restore_job {
	struct backup_job j;
	/* the request */
	struct fs_path dir;
	bool merge, allow_devices;
	bool allow_empty; /* an archive without members may restore an empty dir */
	bool has_sha;
	char want_sha[65];
	bool has_from;
	struct fs_path from;
	/* the stream (under mu): DATA from the client waits in a ring as large as the
	 * credit it may have; the worker hands libarchive one piece of it at a time */
	bool counted; /* in jobs_running (op_backup.c) */
	uint8_t *ring;
	size_t cap, head, len;
	size_t given;         /* bytes from head handed to libarchive */
	size_t done;          /* of those, the ones it is done with (all but the last piece): they
				* are released, but not past the oldest pinned byte */
	uint64_t head_off;    /* stream offset of head */
	uint64_t pin_end;     /* worker: the end (stream offset) of the last piece pinned for the file
				* writer, which writes it from the ring itself (atomic) */
	uint64_t done_end;    /* file writer: the end of the last pinned piece written (atomic) */
	bool worker_waits;    /* worker, under mu: for more of the stream (atomic) */
	uint64_t hash_off;    /* under mu: the stream's bytes in sha up to here (none released before) */
	bool hashing;         /* under mu: a thread is hashing (it owns sha until it clears this) */
	const uint8_t *piece; /* worker: the last piece handed to libarchive */
	size_t piece_len;
	uint64_t piece_off;    /* its stream offset */
	size_t to_grant;       /* released bytes the loop has still to give back as credit */
	bool fin;              /* the client's FIN has come: the stream is complete */
	struct sha256_ctx sha; /* of the stream: by the loop or the worker (rs_hash_step), or by the
				* worker alone with from_path */
	char sha_hex[65];      /* set by the worker once the stream is complete and hashed */
	/* the result (worker) */
	uint64_t entries, stream_bytes;
};

/* On the worker: extract the stream into r->dir (see restore.c). 0, or -1 with
 * r->j.err set. */
int restore_run(struct restore_job *r);
/* On the worker: the next piece of the client's stream. *buf points into the ring
 * until the next call; 0 at the end of the stream, -1 (ECANCELED) once cancelled. */
ssize_t op_backup_restore_input(struct restore_job *r, const void **buf);
/* On the worker: the stream offset of p if it points into the ring (at bytes handed
 * out by op_backup_restore_input), else UINT64_MAX. Bytes from there may be pinned: */
uint64_t op_backup_restore_ring_offset(struct restore_job *r, const void *p);
/* On the worker: keep the ring's bytes of the last piece up to end (a stream offset,
 * from op_backup_restore_ring_offset) until op_backup_restore_unpin(end): the file writer writes them from where
 * they are. Pinned and unpinned in stream order. */
void op_backup_restore_pin(struct restore_job *r, uint64_t end);
/* On the file writer's thread: the pinned bytes up to end are written. */
void op_backup_restore_unpin(struct restore_job *r, uint64_t end);

/* A C.UTF-8 LC_CTYPE locale for uselocale() on the job's thread, or (locale_t)0 if
 * the system has none: libarchive then stores names in UTF-8 as they are (in the C
 * locale every name with a byte >= 0x80 would be stored as raw bytes). */
locale_t op_backup_utf8_locale(void);

/* Lowercase hex of a sha256 digest into out[65]. */
void op_backup_sha_hex(struct sha256_ctx *ctx, char out[65]);

#endif
