/* backup_queue.h: a bounded queue of records from one thread to another. A backup's walker (backup_walk.c: the
 * tree's syscalls) hands entries to its writer (backup_write.c: libarchive, the data of big files, the output); a
 * restore's extractor (restore.c: libarchive, paths, creation) hands file data and metadata to its file writer
 * (restore_files.c: the writes, owners, modes, times). */
#ifndef SHIM_BACKUP_QUEUE_H
#define SHIM_BACKUP_QUEUE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "err.h"

struct backup_job;

/* Bytes of records waiting at most, and open files among them. A record is one
 * entry: its stat, member name, link target, xattrs, sparse map and, for a small
 * regular file, maybe its data; otherwise a file travels as its open fd and the
 * writer reads it straight into the output. */
#define BQ_RING (4u << 20)
#define BQ_INLINE (64u << 10) /* regular files up to this size may come with their data */
#define BQ_BACKLOG 32         /* ...when the writer has this many records waiting */
#define BQ_FDS_MAX 512        /* open files in the queue at most: RLIMIT_NOFILE / 16, 16 to this */

enum {
	BQF_FD = 1,       /* fd is open: the writer reads the data (regions, if any) and closes it */
	BQF_CHANGED = 2,  /* the walker saw the file change while it read it */
	BQF_HARDLINK = 4, /* link is the member name of an earlier link: a header only */
	BQF_SYMLINK = 8,  /* link is the symlink's target */
	/* restore */
	BQF_LAST = 16,  /* the file's last record: metadata; then it is closed */
	BQF_CHOWN = 32, /* give it st_uid/st_gid */
};

struct backup_queue_region {
	int64_t off, len;
};

struct backup_queue_rec {
	uint32_t size; /* bytes of the record in the ring (0: a wrap marker) */
	uint32_t flags;
	int fd;
	struct stat st;
	uint32_t name_len, link_len; /* each followed by a NUL */
	uint32_t xattr_bytes;        /* xattrs (backup_queue_xattr_put/get) */
	uint32_t nreg;               /* sparse map: struct backup_queue_region[nreg] */
	uint64_t data_len;           /* inline data (less than st_size if the file shrank) */
	int64_t off;                 /* restore: where the data goes in the file */
	uint32_t aux;                /* restore: the mode the file got when created (RF_MODE_UNKNOWN) */
	const uint8_t *ext;          /* restore: the data is there (the stream's ring), not in the payload */
	uint64_t ext_end;            /* restore: ...and this stream offset is unpinned once it is written */
	uint8_t *payload;            /* name, link, xattrs, regions, data (in the ring or malloc'd) */
	bool heap;                   /* payload malloc'd: too big for the ring */
};

struct backup_queue {
	struct backup_job *j;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* either side waits here: the other signals when it waits */
	uint8_t *ring;
	size_t head, tail, used; /* bytes in use from head (wrap markers included) */
	unsigned fds;            /* records with an open fd in the ring */
	unsigned max_fds;        /* ...at most (backup_queue_init: from RLIMIT_NOFILE) */
	bool done;               /* the producer has pushed its last record */
	int rc;                  /* and how it ended: 0, or -1 with err */
	struct shim_err err;
	bool stop;           /* the consumer gave up: the producer stops */
	unsigned nrec;       /* records in the ring */
	bool producer_waits; /* for room: woken once half the ring is free */
	bool consumer_waits; /* for records: woken once a batch is there */
	/* what the producer does instead of waiting for room, if it can (true: it did
	 * some): a backup's walker hashes the stream meanwhile */
	bool (*idle_fn)(void *arg);
	void *idle_arg;
	/* the job's helper thread (a backup's walker, a restore's file writer) */
	pthread_t helper;
	bool helper_started;
	bool exited; /* it is about to return: no more signals to it */
};

int backup_queue_init(struct backup_queue *q, struct backup_job *j);
/* Close the fds of records nobody will take, free the ring. */
void backup_queue_free(struct backup_queue *q);

/* Producer: room for a record with payload bytes (waits for the consumer). NULL when
 * the consumer stopped or the job is cancelled (ECANCELED), or ENOMEM for a payload
 * too big for the ring that could not be malloc'd. */
struct backup_queue_rec *backup_queue_reserve(struct backup_queue *q, size_t payload, bool with_fd);
/* Producer: hand over the reserved record. */
void backup_queue_commit(struct backup_queue *q, struct backup_queue_rec *r);
/* Producer: give the reserved record back unused (closes nothing). */
void backup_queue_abandon(struct backup_queue *q, struct backup_queue_rec *r);
/* Producer: no more records; rc 0, or -1 with *err. */
void backup_queue_finish(struct backup_queue *q, int rc, const struct shim_err *err);

/* Consumer: done with the record done (if not NULL: as backup_queue_release), and the next
 * one, waiting for it; NULL at the end (q->rc says how) or once cancelled. */
struct backup_queue_rec *backup_queue_next(struct backup_queue *q, struct backup_queue_rec *done);
/* Consumer: done with the record from backup_queue_next (its fd closed or taken). */
void backup_queue_release(struct backup_queue *q, struct backup_queue_rec *r);
/* Consumer: stop the producer (an error, a cancel): its backup_queue_reserve fails. */
void backup_queue_stop(struct backup_queue *q);

/* Start fn(arg) as the job's helper thread, on the other side of q: a small stack,
 * and the worker's signal mask (the interrupt signal gets through, so a syscall
 * stuck on a hung filesystem can be made to return). 0, or an errno. */
int backup_queue_spawn(struct backup_queue *q, void *(*fn)(void *), void *arg);
/* Helper thread: the last thing it does before it returns. */
void backup_queue_helper_exit(struct backup_queue *q);
/* Wait until the helper has returned (if it was started). Once q->stop is set or the
 * job is cancelled it is sent the interrupt signal every 100 ms meanwhile. */
void backup_queue_join(struct backup_queue *q);

/* Did the file change while it was read? fstat of the open file against st (size,
 * mtime, inode) sets *changed. -1 with errno if fstat fails. */
int backup_walk_file_changed(int fd, const struct stat *st, bool *changed);

/* Accessors of a record's payload. */
static inline const char *backup_queue_name(const struct backup_queue_rec *r)
{
	return (const char *)r->payload;
}
static inline const char *backup_queue_link(const struct backup_queue_rec *r)
{
	return (const char *)r->payload + r->name_len + 1;
}
static inline uint8_t *backup_queue_xattrs(const struct backup_queue_rec *r)
{
	return r->payload + r->name_len + 1 + r->link_len + 1;
}
static inline struct backup_queue_region *backup_queue_regions(const struct backup_queue_rec *r)
{
	size_t off = r->name_len + 1 + r->link_len + 1 + r->xattr_bytes;
	off = (off + 7) & ~(size_t)7;
	return (struct backup_queue_region *)(void *)(r->payload + off);
}
static inline uint8_t *backup_queue_data(const struct backup_queue_rec *r)
{
	return (uint8_t *)(backup_queue_regions(r) + r->nreg);
}
/* The xattrs of a record, one after the other: u32 key length, u32 value length, the
 * key and a NUL, the value. Bytes one takes: */
static inline size_t backup_queue_xattr_size(size_t klen, size_t vlen)
{
	return 8 + klen + 1 + vlen;
}
/* Put one at p; where the next one goes. */
static inline uint8_t *backup_queue_xattr_put(uint8_t *p, const char *key, size_t klen, const void *val, size_t vlen)
{
	uint32_t k = (uint32_t)klen, v = (uint32_t)vlen;
	memcpy(p, &k, 4);
	memcpy(p + 4, &v, 4);
	memcpy(p + 8, key, klen);
	p[8 + klen] = '\0';
	memcpy(p + 8 + klen + 1, val, vlen);
	return p + backup_queue_xattr_size(klen, vlen);
}
/* The one at p; where the next one is. */
static inline const uint8_t *backup_queue_xattr_get(const uint8_t *p, const char **key, const void **val, size_t *vlen)
{
	uint32_t k, v;
	memcpy(&k, p, 4);
	memcpy(&v, p + 4, 4);
	*key = (const char *)p + 8;
	*val = p + 8 + k + 1;
	*vlen = v;
	return p + backup_queue_xattr_size(k, v);
}

/* Payload bytes for these sizes (as laid out by the accessors above). */
static inline size_t backup_queue_payload_size(size_t name_len, size_t link_len, size_t xattr_bytes, size_t nreg,
					       size_t data_len)
{
	size_t off = name_len + 1 + link_len + 1 + xattr_bytes;
	off = (off + 7) & ~(size_t)7;
	return off + nreg * sizeof(struct backup_queue_region) + data_len;
}

#endif
