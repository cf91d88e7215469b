/* restore_files.c: a restore's file writer thread: the data, owners, xattrs, modes and times of the regular files
 * the extractor (restore.c) has created, while it goes on with the next members. */
#include "backup_queue.h"
#include "log.h"
#include "restore.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/*
 * Writing the files is most of a restore's time (on tmpfs: allocating and filling
 * pages; elsewhere, the filesystem's own work), and the rest (reading the archive,
 * resolving and creating paths) is as much again: each on its own thread, the two
 * CPUs share them. The extractor creates each file (openat O_CREAT|O_EXCL, so the
 * path checks stay where they were) and queues its data in pieces as libarchive
 * hands them over, then a last record with its metadata; this thread writes the
 * pieces, sets the size, the owner, the xattrs, the mode and the times, and closes
 * it. The fd belongs to the extractor until it queues the last record, to this
 * thread after. Directories, links and nodes stay with the extractor; nothing
 * here creates, removes or resolves a name.
 *
 * A failure here (ENOSPC...) is kept with the member's name and stops the
 * extractor at its next record; the job reports it. Records after it are only
 * closed. restore_files_finish waits until every file is written: the directories' fixups
 * and the swap come after.
 */

#define RF_CHUNK (256u << 10) /* data bytes per record at most */

struct restore_files {
	struct restore *x; /* read-only here: root, umask_known, r->dir */
	struct backup_queue q;
	/* the writer's failure (under q.mu once the thread runs) */
	bool err_set;
	struct shim_err err;
	bool xattr_warned;
	int orphan; /* a file the extractor gave up on after handing over some of its data: the
		     * thread may still write to it, so it is closed after the thread is gone */
};

static void rf_fail(struct restore_files *f, const struct backup_queue_rec *r, int code, const char *what)
{
	pthread_mutex_lock(&f->q.mu);
	if (!f->err_set) {
		f->err_set = true;
		err_setn(&f->err, code, backup_queue_name(r), r->name_len, "restore: %s", what);
	}
	pthread_mutex_unlock(&f->q.mu);
	backup_queue_stop(&f->q);
}

static int write_piece(struct restore_files *f, const struct backup_queue_rec *r)
{
	const uint8_t *p = r->ext != NULL ? r->ext : backup_queue_data(r);
	size_t left = (size_t)r->data_len;
	off_t off = r->off;
	while (left > 0) {
		ssize_t n = pwrite(r->fd, p, left, off);
		if (n < 0) {
			if (errno == EINTR && !op_backup_job_cancelled(&f->x->r->j))
				continue;
			rf_fail(f, r, errno, "write");
			return -1;
		}
		p += n;
		left -= (size_t)n;
		off += n;
	}
	return 0;
}

/* The size (a sparse file's last hole, when the data written ends at end), owner,
 * xattrs, mode and times. */
static int finish_file(struct restore_files *f, const struct backup_queue_rec *r, int64_t end)
{
	const struct stat *st = &r->st;
	if (st->st_size > end && ftruncate(r->fd, st->st_size) < 0) {
		rf_fail(f, r, errno, "truncate");
		return -1;
	}
	bool chowned = false;
	if (r->flags & BQF_CHOWN) {
		if (fchown(r->fd, st->st_uid, st->st_gid) < 0)
			/* an id the user namespace does not map (EINVAL): the file stays ours */
			log_warn("restore %s: cannot give %s its owner: %s", f->x->r->dir.abs, backup_queue_name(r),
				 strerror(errno));
		else
			chowned = true;
	}
	/* after the chown and the data: both drop security.capability */
	for (const uint8_t *x = backup_queue_xattrs(r), *xend = x + r->xattr_bytes; x < xend;) {
		const char *key;
		const void *val;
		size_t vlen;
		x = backup_queue_xattr_get(x, &key, &val, &vlen);
		if (fsetxattr(r->fd, key, val, vlen, 0) < 0) {
			if (!restore_xattr_skippable(errno)) {
				char what[300];
				snprintf(what, sizeof(what), "set xattr %.200s", key);
				rf_fail(f, r, errno, what);
				return -1;
			}
			if (!f->xattr_warned)
				log_warn("restore %s: xattr %s of %s not set: %s (further ones not logged)",
					 f->x->r->dir.abs, key, backup_queue_name(r), strerror(errno));
			f->xattr_warned = true;
		}
	}
	mode_t mode = st->st_mode & 07777;
	if ((mode != r->aux || (chowned && (mode & 06000))) && fchmod(r->fd, mode) < 0) {
		rf_fail(f, r, errno, "chmod");
		return -1;
	}
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	if (futimens(r->fd, ts) < 0) {
		rf_fail(f, r, errno, "set times");
		return -1;
	}
	return 0;
}

static void *rf_main(void *arg)
{
	struct restore_files *f = arg;
	pthread_setname_np(pthread_self(), "restore-files"); /* top -H, perf */
	/* as the request's identity, like the extractor (which entered it: it takes) */
	struct shim_err ce;
	bool failed = fs_ctx_enter(&f->x->r->j.job.op->fsx, &ce) < 0;
	if (failed) {
		pthread_mutex_lock(&f->q.mu);
		if (!f->err_set) {
			f->err_set = true;
			f->err = ce;
		}
		pthread_mutex_unlock(&f->q.mu);
		backup_queue_stop(&f->q);
	}
	int64_t end = 0; /* of the data written to the file in hand (its records come together) */
	struct backup_queue_rec *r = NULL;
	while ((r = backup_queue_next(&f->q, r)) != NULL) {
		/* stopped (the extractor failed, or we did): the rest is only closed */
		if (__atomic_load_n(&f->q.stop, __ATOMIC_ACQUIRE))
			failed = true;
		if (!failed && r->data_len > 0 && write_piece(f, r) < 0)
			failed = true;
		if (r->data_len > 0 && r->off + (int64_t)r->data_len > end)
			end = r->off + (int64_t)r->data_len;
		if (r->ext != NULL)
			op_backup_restore_unpin(f->x->r, r->ext_end);
		if (r->flags & BQF_LAST) {
			if (!failed && finish_file(f, r, end) < 0)
				failed = true;
			close(r->fd);
			r->fd = -1;
			end = 0;
		}
	}
	backup_queue_helper_exit(&f->q);
	return NULL;
}

int restore_files_start(struct restore *x)
{
	struct restore_files *f = calloc(1, sizeof(*f));
	if (f == NULL || backup_queue_init(&f->q, &x->r->j) < 0) {
		free(f);
		return restore_fail(x, ENOMEM, "out of memory");
	}
	f->x = x;
	f->orphan = -1;
	x->rf = f;
	int rc = backup_queue_spawn(&f->q, rf_main, f);
	if (rc != 0)
		return restore_fail(x, rc, "cannot start the file writer thread");
	return 0;
}

/* The extractor's error when the writer stopped it: the writer's own. */
static int stopped(struct restore *x)
{
	struct restore_files *f = x->rf;
	pthread_mutex_lock(&f->q.mu);
	bool have = f->err_set;
	struct shim_err e = f->err;
	pthread_mutex_unlock(&f->q.mu);
	if (have && !x->err_set) {
		x->err_set = true;
		x->r->j.err = e;
		return -1;
	}
	return restore_fail(x, ECANCELED, "cancelled");
}

/* A record for the file x->member with payload room for data bytes (data_len is
 * set by the caller). */
static struct backup_queue_rec *rec(struct restore *x, size_t xattr_bytes, size_t data, bool last)
{
	size_t nlen = strlen(x->member);
	struct backup_queue_rec *r =
		backup_queue_reserve(&x->rf->q, backup_queue_payload_size(nlen, 0, xattr_bytes, 0, data), last);
	if (r == NULL) {
		if (errno == ENOMEM)
			restore_fail(x, ENOMEM, "out of memory");
		else
			stopped(x);
		return NULL;
	}
	r->name_len = (uint32_t)nlen;
	r->xattr_bytes = (uint32_t)xattr_bytes;
	memcpy(r->payload, x->member, nlen + 1);
	r->payload[nlen + 1] = '\0'; /* no link */
	return r;
}

/* The extractor gives up on fd: closed now if the thread never saw it, else once it
 * is gone (it may be writing to it: closing now could let it write to a file opened
 * meanwhile under the same number). */
static void drop_fd(struct restore *x, int fd, bool handed)
{
	if (handed && x->rf->orphan < 0)
		x->rf->orphan = fd;
	else
		close(fd);
}

int restore_files_add(struct restore *x, struct archive_entry *e, int fd, mode_t created)
{
	bool handed = false;
	for (;;) {
		if (restore_cancelled(x)) {
			drop_fd(x, fd, handed);
			return restore_fail(x, ECANCELED, "cancelled");
		}
		const void *buf;
		size_t size;
		la_int64_t off;
		int rc = archive_read_data_block(x->a, &buf, &size, &off);
		if (rc == ARCHIVE_EOF)
			break;
		if (rc < ARCHIVE_WARN) {
			drop_fd(x, fd, handed);
			return restore_fail_archive(x, "read member data");
		}
		/* uncompressed from the client, the data is in the stream's ring: written
		 * from there (pinned until then); else copied into the queue */
		const uint8_t *p = buf;
		uint64_t so = x->r->has_from ? UINT64_MAX : op_backup_restore_ring_offset(x->r, buf);
		while (size > 0) {
			size_t n = size < RF_CHUNK ? size : RF_CHUNK;
			struct backup_queue_rec *r = rec(x, 0, so != UINT64_MAX ? 0 : n, false);
			if (r == NULL) {
				drop_fd(x, fd, handed);
				return -1;
			}
			r->fd = fd;
			r->off = off;
			r->data_len = n;
			if (so != UINT64_MAX) {
				r->ext = p;
				r->ext_end = so + n;
				op_backup_restore_pin(x->r, so + n);
				so += n;
			} else {
				memcpy(backup_queue_data(r), p, n);
			}
			backup_queue_commit(&x->rf->q, r);
			handed = true;
			p += n;
			size -= n;
			off += (la_int64_t)n;
		}
	}
	/* the last record: the metadata, and the fd goes with it */
	size_t xb = 0;
	const char *key;
	const void *val;
	size_t vsize;
	if (archive_entry_xattr_reset(e) > 0) {
		while (archive_entry_xattr_next(e, &key, &val, &vsize) == ARCHIVE_OK)
			xb += backup_queue_xattr_size(strlen(key), vsize);
	}
	struct backup_queue_rec *r = rec(x, xb, 0, true);
	if (r == NULL) {
		drop_fd(x, fd, handed);
		return -1;
	}
	uint8_t *xp = backup_queue_xattrs(r);
	if (xb > 0 && archive_entry_xattr_reset(e) > 0) {
		while (archive_entry_xattr_next(e, &key, &val, &vsize) == ARCHIVE_OK)
			xp = backup_queue_xattr_put(xp, key, strlen(key), val, vsize);
	}
	r->fd = fd;
	r->flags = BQF_FD | BQF_LAST;
	r->st.st_mode = archive_entry_perm(e) & 07777;
	r->st.st_size = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;
	uid_t uid;
	gid_t gid;
	if (restore_want_owner(x, e, &uid, &gid)) {
		r->flags |= BQF_CHOWN;
		r->st.st_uid = uid;
		r->st.st_gid = gid;
	}
	struct timespec ts[2];
	restore_entry_times(e, ts);
	r->st.st_atim = ts[0];
	r->st.st_mtim = ts[1];
	r->aux = x->umask_known ? created : RF_MODE_UNKNOWN;
	backup_queue_commit(&x->rf->q, r);
	return 0;
}

int restore_files_finish(struct restore *x)
{
	struct restore_files *f = x->rf;
	if (f == NULL)
		return 0;
	backup_queue_finish(&f->q, 0, NULL);
	backup_queue_join(&f->q);
	if (f->err_set)
		return stopped(x);
	if (restore_cancelled(x))
		return restore_fail(x, ECANCELED, "cancelled");
	return 0;
}

void restore_files_free(struct restore *x)
{
	struct restore_files *f = x->rf;
	if (f == NULL)
		return;
	backup_queue_stop(&f->q);
	backup_queue_finish(&f->q, -1, NULL);
	backup_queue_join(&f->q);
	if (f->orphan >= 0)
		close(f->orphan);
	backup_queue_free(&f->q);
	free(f);
	x->rf = NULL;
}
