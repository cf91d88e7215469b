/* backup_write.c: the backup job: the writer side. Takes the walker's entries (backup_walk.c) in order, formats
 * them with libarchive's pax writer, reads the data of bigger files, and puts the archive out: to the loop through
 * the handoff buffers (op_backup.c), or to a temp file renamed into place (to_path). */
#include "backup.h"
#include "backup_meta.h"
#include "backup_queue.h"
#include "journal.h"
#include "log.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WRITE_READ (256u << 10) /* file read buffer (when not straight into the output) */
#define TAR_RECORD 10240        /* GNU tar's default record: 20 blocks of 512 bytes */

struct wr {
	struct backup *b;
	struct backup_queue q;
	bool q_ready;
	struct backup_walk *walk;
	struct archive *a;
	struct archive_entry *e;
	const struct backup_queue_rec *cur; /* the entry being written (for errors) */
	uint8_t *rbuf;
	struct backup_meta_names users, groups;
	bool err_set; /* b->j.err holds the first error: keep it */
	bool failing; /* closing after a failure: no more output */
	bool closed;  /* archive_write_close() called (never twice: 3.6 would reuse freed state) */
	/* to_path: the temp file, and where it and the final file are */
	int to_dfd, to_fd;
	char to_name[NAME_MAX + 1], to_tmp[NAME_MAX + 1];
	struct journal_entry *jent;
	bool tmp_made;
};

static const uint8_t zeros[64u << 10];

/* ---- errors ---- */

static int fail(struct wr *w, int code, const char *what)
{
	if (w->err_set)
		return -1;
	char p[PATH_MAX + 64];
	size_t n = backup_walk_client_path(w->b, w->cur != NULL ? backup_queue_name(w->cur) : ".", p, sizeof(p));
	w->err_set = true;
	return err_setn(&w->b->j.err, code, p, n, "backup: %s", what);
}

static int fail_archive(struct wr *w, const char *what)
{
	int code = archive_errno(w->a);
	const char *msg = archive_error_string(w->a);
	if (code <= 0)
		code = EIO;
	char m[200];
	snprintf(m, sizeof(m), "%s: %s", what, msg ? msg : "libarchive error");
	return fail(w, code, m);
}

static bool cancelled(struct wr *w)
{
	return op_backup_job_cancelled(&w->b->j);
}

/* ---- data ---- */

static int write_data(struct wr *w, const void *buf, size_t len)
{
	la_ssize_t n = archive_write_data(w->a, buf, len);
	if (n < 0 || (size_t)n != len)
		return fail_archive(w, "write data");
	return 0;
}

/* Zeros for a hole (the pax writer skips them) or for a file that shrank. */
static int write_zeros(struct wr *w, uint64_t len)
{
	while (len > 0) {
		size_t n = len < sizeof(zeros) ? (size_t)len : sizeof(zeros);
		if (write_data(w, zeros, n) < 0)
			return -1;
		len -= n;
	}
	return 0;
}

/* Uncompressed, the pax writer hands the data of a plain file to the output
 * callback as it gets it (no blocking): read straight into the output buffer being
 * filled, and the callback finds the bytes already in place (op_backup_output, to_write).
 * NULL when a compressor sits in between, when there is little room left there, or
 * for a sparse file: the writer puts its sparse map out first, over those bytes. */
static uint8_t *out_area(struct wr *w, bool sparse, size_t *room)
{
	struct backup *b = w->b;
	if (b->compression != 0 || sparse)
		return NULL;
	struct backup_buf *x = &b->buf[b->has_to ? 0 : b->fill];
	if (BK_BUF - x->len < (32u << 10))
		return NULL;
	*room = BK_BUF - x->len;
	return x->data + x->len;
}

/* Copy [off, off+len) of the file into the archive. *shrank: the file ended first
 * (the rest is written as zeros). */
static int copy_range(struct wr *w, int fd, bool sparse, off_t off, off_t len, bool *shrank)
{
	while (len > 0) {
		if (cancelled(w))
			return fail(w, ECANCELED, "cancelled");
		size_t room = WRITE_READ;
		uint8_t *dst = out_area(w, sparse, &room);
		if (dst == NULL)
			dst = w->rbuf;
		size_t want = len < (off_t)room ? (size_t)len : room;
		ssize_t n = pread(fd, dst, want, off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return fail(w, errno, "read");
		}
		if (n == 0) {
			*shrank = true;
			return write_zeros(w, (uint64_t)len);
		}
		if (write_data(w, dst, (size_t)n) < 0)
			return -1;
		w->b->source_bytes += (uint64_t)n;
		off += n;
		len -= n;
	}
	return 0;
}

/* The data of a file the walker left open: whole or by its regions; then was it
 * changed while read? The fd is closed. */
static int file_from_fd(struct wr *w, struct backup_queue_rec *r, bool *changed)
{
	int fd = r->fd;
	r->fd = -1;
	const struct backup_queue_region *reg = backup_queue_regions(r);
	bool shrank = false;
	int rc = 0;
	if (r->nreg == 0) {
		rc = copy_range(w, fd, false, 0, r->st.st_size, &shrank);
	} else {
		off_t pos = 0;
		for (size_t i = 0; i < r->nreg && !shrank && rc == 0; i++) {
			if (reg[i].off > pos)
				rc = write_zeros(w, (uint64_t)(reg[i].off - pos));
			if (rc == 0)
				rc = copy_range(w, fd, true, reg[i].off, reg[i].len, &shrank);
			pos = reg[i].off + reg[i].len;
		}
	}
	if (rc == 0 && backup_walk_file_changed(fd, &r->st, changed) < 0)
		rc = fail(w, errno, "stat");
	close(fd);
	if (shrank)
		*changed = true;
	return rc;
}

/* ---- entries ---- */

static int put_entry(struct wr *w, struct backup_queue_rec *r)
{
	struct backup *b = w->b;
	struct archive_entry *e = w->e;
	w->cur = r;
	archive_entry_clear(e);
	archive_entry_copy_pathname(e, backup_queue_name(r));
	archive_entry_copy_stat(e, &r->st);
	/* No atime or ctime (as GNU tar and bsdtar by default): either would cost every
	 * member a pax extended header (1 KiB), 8% more archive on a real tree. The
	 * mtime's nanoseconds are kept, in a pax header only when they are not 0. */
	archive_entry_unset_atime(e);
	archive_entry_unset_ctime(e);
	bool data = S_ISREG(r->st.st_mode) && !(r->flags & BQF_HARDLINK);
	if (!data)
		archive_entry_set_size(e, 0);
	const char *u = backup_meta_name_of(&w->users, r->st.st_uid);
	if (u != NULL)
		archive_entry_copy_uname(e, u);
	const char *g = backup_meta_name_of(&w->groups, r->st.st_gid);
	if (g != NULL)
		archive_entry_copy_gname(e, g);
	if (r->flags & BQF_SYMLINK)
		archive_entry_copy_symlink(e, backup_queue_link(r));
	if (r->flags & BQF_HARDLINK)
		archive_entry_copy_hardlink(e, backup_queue_link(r));
	for (const uint8_t *x = backup_queue_xattrs(r), *end = x + r->xattr_bytes; x < end;) {
		const char *key;
		const void *val;
		size_t vlen;
		x = backup_queue_xattr_get(x, &key, &val, &vlen);
		archive_entry_xattr_add_entry(e, key, val, vlen);
	}
	const struct backup_queue_region *reg = backup_queue_regions(r);
	for (size_t i = 0; i < r->nreg; i++)
		archive_entry_sparse_add_entry(e, reg[i].off, reg[i].len);
	/* ARCHIVE_WARN: a name that is not UTF-8, stored as raw bytes (hdrcharset) */
	if (archive_write_header(w->a, e) < ARCHIVE_WARN)
		return fail_archive(w, "write header");
	b->entries++;
	__atomic_store_n(&b->j.items, b->entries, __ATOMIC_RELAXED);
	bool changed = (r->flags & BQF_CHANGED) != 0;
	if (r->flags & BQF_FD) {
		if (file_from_fd(w, r, &changed) < 0)
			return -1;
	} else if (data && r->st.st_size > 0) {
		if (r->data_len > 0 && write_data(w, backup_queue_data(r), (size_t)r->data_len) < 0)
			return -1;
		b->source_bytes += r->data_len;
		if (r->data_len < (uint64_t)r->st.st_size && write_zeros(w, (uint64_t)r->st.st_size - r->data_len) < 0)
			return -1;
	}
	if (archive_write_finish_entry(w->a) < ARCHIVE_WARN)
		return fail_archive(w, "finish entry");
	if (changed) {
		char p[PATH_MAX + 64];
		size_t n = backup_walk_client_path(b, backup_queue_name(r), p, sizeof(p));
		if (backup_walk_list_add(&b->changed, p, n) < 0)
			return fail(w, ENOMEM, "out of memory");
	}
	return 0;
}

/* Every record the walker hands over, in order, until its end. */
static int put_entries(struct wr *w)
{
	struct backup_queue_rec *r = NULL;
	while ((r = backup_queue_next(&w->q, r)) != NULL) {
		int rc = put_entry(w, r);
		if (r->fd >= 0) {
			close(r->fd);
			r->fd = -1;
		}
		w->cur = NULL;
		if (rc < 0) {
			backup_queue_release(&w->q, r);
			return -1;
		}
	}
	if (cancelled(w))
		return fail(w, ECANCELED, "cancelled");
	if (w->q.rc < 0) {
		/* the walker's error, as it was (its path, its errno) */
		if (!w->err_set) {
			w->b->j.err = w->q.err;
			w->err_set = true;
		}
		return -1;
	}
	return 0;
}

/* ---- output ---- */

/* to_path: buffered writes to the temp file, hashed on the way. */
static int to_write(struct wr *w, const void *data, size_t len)
{
	struct backup *b = w->b;
	struct backup_buf *x = &b->buf[0];
	const uint8_t *p = data;
	while (len > 0 || (data == NULL && x->len > 0)) {
		size_t n = BK_BUF - x->len;
		if (n > len)
			n = len;
		if (n > 0) {
			if (p != x->data + x->len) /* else read there already (out_area) */
				memcpy(x->data + x->len, p, n);
			x->len += n;
			p += n;
			len -= n;
		}
		if (x->len < BK_BUF && data != NULL)
			break;
		sha256_update(&b->sha, x->len, x->data);
		size_t off = 0;
		while (off < x->len) {
			ssize_t k = write(w->to_fd, x->data + off, x->len - off);
			if (k < 0) {
				if (errno == EINTR && !cancelled(w))
					continue;
				char p2[PATH_MAX];
				snprintf(p2, sizeof(p2), "%s", b->to.abs);
				w->err_set = true;
				return err_set(&b->j.err, errno, p2, "backup: write");
			}
			off += (size_t)k;
		}
		x->len = 0;
	}
	return 0;
}

static la_ssize_t write_cb(struct archive *a, void *ud, const void *buf, size_t len)
{
	struct wr *w = ud;
	struct backup *b = w->b;
	if (cancelled(w) || w->failing) {
		archive_set_error(a, ECANCELED, "cancelled");
		return -1;
	}
	int rc = b->has_to ? to_write(w, buf, len) : op_backup_output(b, buf, len);
	if (rc < 0) {
		archive_set_error(a, b->has_to ? w->b->j.err.code : ECANCELED, "%s",
				  b->has_to ? "cannot write the archive" : "cancelled");
		return -1;
	}
	b->archive_bytes += len;
	__atomic_store_n(&b->j.bytes, b->archive_bytes, __ATOMIC_RELAXED);
	return (la_ssize_t)len;
}

/* to_open's failures: the error is in the job already (rc -1). */
static int to_failed(struct wr *w, int rc)
{
	w->err_set = true;
	return rc;
}

/* The temp file beside to_path, in the journal before it exists. */
static int to_open(struct wr *w)
{
	struct backup *b = w->b;
	struct shim_err *err = &b->j.err;
	w->to_dfd = fs_open_parent(&b->to, w->to_name, err);
	if (w->to_dfd < 0)
		return to_failed(w, -1);
	if (strcmp(w->to_name, ".") == 0 || b->to.abs[b->to.len - 1] == '/')
		return to_failed(w, err_set(err, EISDIR, b->to.abs, "backup: to_path names a directory"));
	struct stat st;
	if (fstatat(w->to_dfd, w->to_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
		return to_failed(w, err_set(err, EISDIR, b->to.abs, "backup: to_path is a directory"));
	if (fstat(w->to_dfd, &st) < 0)
		return to_failed(w, err_set(err, errno, b->to.abs, "backup: stat the directory of to_path"));
	char proc[64], dir[PATH_MAX], path[PATH_MAX + NAME_MAX + 2];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", w->to_dfd);
	ssize_t n = readlink(proc, dir, sizeof(dir) - 1);
	if (n <= 0)
		return to_failed(w, err_set(err, errno ? errno : EIO, b->to.abs,
					    "backup: where is the directory of to_path"));
	dir[n] = '\0';
	for (int tries = 0;; tries++) {
		journal_temp_name(w->to_name, w->to_tmp, sizeof(w->to_tmp));
		snprintf(path, sizeof(path), "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", w->to_tmp);
		w->jent = journal_add(path, err);
		if (w->jent == NULL)
			return to_failed(w, -1);
		w->to_fd = openat(w->to_dfd, w->to_tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
				  0600);
		if (w->to_fd >= 0)
			break;
		int e = errno;
		journal_remove(w->jent);
		w->jent = NULL;
		if (e != EEXIST || tries >= 10)
			return to_failed(w, err_set(err, e, b->to.abs, "backup: create the temp file"));
	}
	w->tmp_made = true;
	/* the archive and its temp file are left out of the walk */
	backup_walk_skip(w->walk, st.st_dev, st.st_ino, w->to_name, w->to_tmp);
	return 0;
}

/* Make the archive durable and put it in place. */
static int to_commit(struct wr *w)
{
	struct backup *b = w->b;
	struct shim_err *err = &b->j.err;
	if (to_write(w, NULL, 0) < 0)
		return -1;
	w->err_set = true;
	if (fsync(w->to_fd) < 0)
		return err_set(err, errno, b->to.abs, "backup: fsync");
	if (cancelled(w))
		return err_set(err, ECANCELED, b->to.abs, "cancelled");
	if (renameat(w->to_dfd, w->to_tmp, w->to_dfd, w->to_name) < 0)
		return err_set(err, errno, b->to.abs, "backup: rename into place");
	w->tmp_made = false;
	journal_remove(w->jent);
	w->jent = NULL;
	if (fsync(w->to_dfd) < 0 && errno != EINVAL && errno != EBADF)
		log_warn("backup %s: fsync of the directory: %s", b->to.abs, strerror(errno));
	w->err_set = false;
	return 0;
}

static void to_cleanup(struct wr *w)
{
	if (w->to_fd >= 0)
		close(w->to_fd);
	w->to_fd = -1;
	if (w->tmp_made && unlinkat(w->to_dfd, w->to_tmp, 0) < 0 && errno != ENOENT)
		log_warn("backup %s: cannot remove the temp file %s: %s", w->b->to.abs, w->to_tmp, strerror(errno));
	w->tmp_made = false;
	journal_remove(w->jent);
	w->jent = NULL;
	if (w->to_dfd >= 0)
		close(w->to_dfd);
	w->to_dfd = -1;
}

/* ---- the job ---- */

static int archive_setup(struct wr *w)
{
	struct backup *b = w->b;
	w->a = archive_write_new();
	w->e = archive_entry_new();
	if (w->a == NULL || w->e == NULL)
		return fail(w, ENOMEM, "out of memory");
	struct archive *a = w->a;
	int r = archive_write_set_format_pax(a);
	/* xattrs as SCHILY.xattr.* only: what GNU tar reads, and no second copy */
	if (r == ARCHIVE_OK)
		r = archive_write_set_format_option(a, "pax", "xattrheader", "SCHILY");
	char lv[16];
	snprintf(lv, sizeof(lv), "%d", b->level);
	switch (b->compression) {
	case 1: /* gzip */
		if (r == ARCHIVE_OK)
			r = archive_write_add_filter_gzip(a);
		if (r == ARCHIVE_OK && b->has_level)
			r = archive_write_set_filter_option(a, "gzip", "compression-level", lv);
		break;
	case 2: /* zstd */
		if (r == ARCHIVE_OK)
			r = archive_write_add_filter_zstd(a);
		if (r == ARCHIVE_OK && b->has_level)
			r = archive_write_set_filter_option(a, "zstd", "compression-level", lv);
		/* Compressed by two threads of zstd's own while this one walks: 1.3x
		 * `tar --zstd` on two CPUs. Each thread costs zstd buffers of a few jobs
		 * (at the default level the daemon peaks at about 75 MB during a backup,
		 * 12 MB uncompressed): two, not one per CPU. Only with a libzstd built
		 * with ZSTD_MULTITHREAD (Debian's libzstd.so.1 is, its libzstd.a is not):
		 * without, libarchive takes the option and zstd ignores it, and this
		 * thread compresses alone (15-25% slower on /usr/share, 2 CPUs). */
		if (r == ARCHIVE_OK)
			r = archive_write_set_filter_option(a, "zstd", "threads", "2");
		break;
	default:
		if (r == ARCHIVE_OK)
			r = archive_write_add_filter_none(a);
		break;
	}
	/* No blocking in libarchive: it would copy every small member into its block
	 * buffer first. The handoff buffers do the batching; an uncompressed archive is
	 * padded to tar's 10 KiB records at the end (backup_write_run), a compressed one is not
	 * (zstd and gzip readers take nothing after the end of their stream). */
	if (r == ARCHIVE_OK)
		r = archive_write_set_bytes_per_block(a, 0);
	if (r == ARCHIVE_OK)
		r = archive_write_open2(a, w, NULL, write_cb, NULL, NULL);
	if (r != ARCHIVE_OK)
		return fail_archive(w, "set up the archive");
	return 0;
}

static void wr_free(struct wr *w)
{
	/* the walker first: it may be blocked on the queue */
	backup_walk_stop(w->walk);
	/* then the temp file: freeing a zstd writer waits for its threads to finish the
	 * job in hand, which at a high level takes seconds */
	to_cleanup(w);
	if (w->a != NULL)
		archive_write_free(w->a);
	if (w->e != NULL)
		archive_entry_free(w->e);
	backup_walk_free(w->walk);
	if (w->q_ready)
		backup_queue_free(&w->q);
	free(w->rbuf);
	backup_meta_names_free(&w->users);
	backup_meta_names_free(&w->groups);
}

/* The backup itself: the queue, the walker, the temp file, the archive, the entries, the
 * end of the archive and its commit or last flush. -1 with the error in the job. */
static int write_steps(struct wr *w)
{
	struct backup *b = w->b;
	w->rbuf = malloc(WRITE_READ);
	if (w->rbuf == NULL || backup_queue_init(&w->q, &b->j) < 0)
		return fail(w, ENOMEM, "out of memory");
	w->q_ready = true;
	w->walk = backup_walk_new(b, &b->j.err);
	if (w->walk == NULL) {
		w->err_set = true;
		return -1;
	}
	if ((b->has_to && to_open(w) < 0) || archive_setup(w) < 0)
		return -1;
	if (!b->has_to) {
		/* the walker hashes while it waits for the writer (with to_path the
		 * writer hashes as it writes the file) */
		w->q.idle_fn = op_backup_hash_idle;
		w->q.idle_arg = b;
	}
	if (backup_walk_start(w->walk, &w->q, &b->j.err) < 0) {
		w->err_set = true;
		return -1;
	}
	if (put_entries(w) < 0)
		return -1;
	w->closed = true;
	if (archive_write_close(w->a) != ARCHIVE_OK)
		return fail_archive(w, "finish the archive");
	if (b->compression == 0 && b->archive_bytes % TAR_RECORD != 0 &&
	    write_cb(w->a, w, zeros, TAR_RECORD - b->archive_bytes % TAR_RECORD) < 0)
		return fail(w, ECANCELED, "cancelled");
	if (b->has_to) {
		if (to_commit(w) < 0)
			return -1;
		op_backup_sha_hex(&b->sha, b->sha_hex);
	} else if (op_backup_output_flush(b) < 0) {
		return fail(w, ECANCELED, "cancelled");
	}
	return 0;
}

int backup_write_run(struct backup *b)
{
	struct wr w = {.b = b, .to_dfd = -1, .to_fd = -1};
	uuid4(b->id);
	struct tm tm;
	time_t now = time(NULL);
	gmtime_r(&now, &tm);
	strftime(b->created_at, sizeof(b->created_at), "%Y-%m-%dT%H:%M:%SZ", &tm);
	/* names in UTF-8 go into the archive as they are; others as raw bytes */
	locale_t loc = op_backup_utf8_locale();
	locale_t old = loc != (locale_t)0 ? uselocale(loc) : (locale_t)0;
	w.users.file = "/etc/passwd";
	w.groups.file = "/etc/group";
	int rc = write_steps(&w);
	if (rc < 0 && w.a != NULL && !w.closed) {
		/* Not archive_write_fail(): libarchive 3.6 frees its output state only
		 * in close (fixed in later versions). Closing writes nothing: the
		 * callback refuses every byte from now on. */
		w.failing = true;
		archive_write_close(w.a);
	}
	wr_free(&w);
	if (loc != (locale_t)0)
		uselocale(old);
	return rc;
}
