/* restore.c: the restore job: libarchive reads the stream, we write the tree with directory fds and refuse what would land outside dir. */
#include "backup.h"
#include "log.h"
#include "restore.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/*
 * libarchive only reads here (the tar, pax and GNU formats, gzip/zstd/none found by
 * their signatures); the tree is written by this file, not by archive_write_disk:
 * with its SECURE_SYMLINKS check that makes an fstatat, an open and a close per
 * component of every member's path, plus two umask() calls per member (umask is
 * process-wide in a threaded daemon), and it works relative to the process's
 * working directory. Here every member is resolved one component at a time from
 * the directory being restored with openat(O_PATH|O_DIRECTORY|O_NOFOLLOW), the
 * chain of open directories of the last member kept for the next one, and created
 * with *at() calls that never follow a symlink. So, refused, with the member named:
 *
 *  - EPERM: an absolute member path, a ".." component, a path through a symlink
 *    (one the archive created or one already in dir: the kernel refuses it, no
 *    race), a hard link whose target is absolute or has "..", a device node unless
 *    allow_devices, a member that would replace dir itself by a non-directory;
 *  - ENOENT: a hard link whose target is not there (not extracted yet);
 *  - EBADMSG: anything that is not one whole archive (below), and a sha256 that is
 *    not the expected one.
 *  Errors carry the member's name (as in the archive) as their path.
 *
 * One whole archive. The stream is read by two libarchive readers: the first finds
 * the compression and decompresses (its format "raw" hands over the bytes as they
 * are), the second reads tar from that output, through tar_read_cb, which keeps the
 * last bytes in view. libarchive's tar reader reports "end of archive" for a stream
 * that stops where a header should be, for a first zero block whatever follows it,
 * and after a header it skips without a member (a GNU volume label); it reads no
 * further. So at its end we check ourselves that the two zero blocks of the
 * end-of-archive marker are where the next header would be, that nothing but zeros
 * (the padding of the last record) follows them, that the decompressor's stream
 * ended cleanly with nothing after it, and (without allow_empty) that the archive
 * had a member at all. A truncated archive is EBADMSG naming the offset (of the
 * decompressed archive) and the last member read; nothing in dir changed by then.
 *
 * Replace mode (restore_swap.c) extracts into a fresh directory ".NAME.sbx-XXXXXX"
 * beside dir, in the pending-writes journal (a daemon killed meanwhile removes it at
 * its next start), checks the sha256, sets the directories' modes and times (deepest
 * first), then swaps it in with one renameat2(RENAME_EXCHANGE) (a plain rename when
 * dir did not exist) and removes the old tree, now at the temp name. Until the swap
 * nothing in dir changes; a failure, a cancel or a disconnect before it only removes
 * the temp directory. When dir cannot be renamed (a mount point; on overlayfs a
 * directory from a lower layer, EXDEV) the temp directory is made inside dir (mount
 * point) or kept beside it, and at the swap dir's old entries are removed and the
 * new ones renamed in, one by one: still nothing changes before the archive is
 * complete and verified, but the swap itself is not atomic.
 *
 * Merge mode extracts into such a temp directory too, and once the archive is
 * complete and verified moves its entries into dir: existing files are replaced,
 * directories kept (restore_swap.c, restore_swap_merge_in); then the directories' modes and
 * times are set in dir. So a bad archive, a refused member or a wrong sha256 leave
 * dir as it was; the merge itself is not atomic.
 *
 * Kept: modes with setuid/setgid/sticky, owners by number (as root; otherwise files
 * belong to the daemon's user), mtime and atime with nanoseconds, xattrs (those the
 * filesystem refuses, e.g. user.* on a symlink, are skipped with a log line),
 * symlinks, hard links, sparse files (holes stay holes), FIFOs, device nodes (with
 * allow_devices, as root). Sockets are skipped. The files are not fsync'ed (as with
 * tar -x): the swap is atomic for readers, not durable across a power cut.
 */

/* ---- errors ---- */

int restore_fail(struct restore *x, int code, const char *fmt, ...)
{
	if (x->err_set)
		return -1;
	x->err_set = true;
	char msg[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* the member concerned, or dir itself for the archive as a whole */
	const char *m = x->member != NULL ? x->member : x->r->dir.abs;
	return err_setn(&x->r->j.err, code, m, strlen(m), "restore: %s", msg);
}

/* A libarchive failure: our input's own error (a cancel, a read error of
 * from_path) if that is what it was, else the archive is bad: named with the
 * offset the reader had got to. */
int restore_fail_archive(struct restore *x, const char *what)
{
	if (x->input_err != 0)
		return restore_fail(x, x->input_err, "%s: %s", what, x->input_err == ECANCELED ? "cancelled" : "read");
	struct archive *ar = x->a != NULL ? x->a : x->in;
	const char *msg = ar != NULL ? archive_error_string(ar) : NULL;
	if (msg == NULL)
		msg = "damaged or cut short";
	if (x->in_failed || x->a == NULL) {
		/* the stream as received: the offset is of its bytes (where the
		 * decompressor got to; before it is set up, how much it had read) */
		long long off = x->in != NULL ? (long long)archive_filter_bytes(x->in, -1) : -1;
		if (off < 0)
			return restore_fail(x, EBADMSG, "%s at offset %llu of the stream or before: %s", what,
					    (unsigned long long)x->r->stream_bytes, msg);
		return restore_fail(x, EBADMSG, "%s at offset %lld of the stream: %s", what, off, msg);
	}
	return restore_fail(x, EBADMSG, "%s at offset %lld%s: %s", what, (long long)archive_filter_bytes(x->a, 0),
			    x->compressed ? " (decompressed)" : "", msg);
}

bool restore_cancelled(struct restore *x)
{
	return op_backup_job_cancelled(&x->r->j);
}

/* ---- input ---- */

static la_ssize_t read_cb(struct archive *a, void *ud, const void **buf)
{
	struct restore *x = ud;
	struct restore_job *r = x->r;
	ssize_t n;
	if (r->has_from) {
		if (restore_cancelled(x)) {
			x->input_err = ECANCELED;
			archive_set_error(a, ECANCELED, "cancelled");
			return -1;
		}
		do
			n = read(x->from_fd, x->from_buf, FROM_BUF);
		while (n < 0 && errno == EINTR && !restore_cancelled(x));
		if (n < 0) {
			x->input_err = errno;
			archive_set_error(a, errno, "read %s", r->from.abs);
			return -1;
		}
		sha256_update(&r->sha, (size_t)n, x->from_buf);
		*buf = x->from_buf;
	} else {
		n = op_backup_restore_input(r, buf);
		if (n < 0) {
			x->input_err = ECANCELED;
			archive_set_error(a, ECANCELED, "cancelled");
			return -1;
		}
	}
	r->stream_bytes += (uint64_t)n;
	__atomic_store_n(&r->j.bytes, r->stream_bytes, __ATOMIC_RELAXED);
	return n;
}

/* The tar reader's input: the decompressor's output, a block at a time. The
 * block handed over and the last KiB before it stay in view (blk, before): the
 * checks at the end look at what the tar reader saw there. */
static void keep_before(struct restore *x)
{
	size_t n = x->blk_len, cap = sizeof(x->before);
	if (n >= cap) {
		memcpy(x->before, x->blk + n - cap, cap);
		x->before_len = cap;
	} else if (n > 0) {
		size_t keep = x->before_len < cap - n ? x->before_len : cap - n;
		memmove(x->before, x->before + x->before_len - keep, keep);
		memcpy(x->before + keep, x->blk, n);
		x->before_len = keep + n;
	}
	x->blk_off += n;
	x->blk = NULL;
	x->blk_len = 0;
}

static la_ssize_t tar_read_cb(struct archive *a, void *ud, const void **buf)
{
	struct restore *x = ud;
	keep_before(x);
	while (!x->in_eof) {
		const void *p;
		size_t n;
		la_int64_t off;
		int rc = archive_read_data_block(x->in, &p, &n, &off);
		if (rc == ARCHIVE_EOF)
			break;
		if (rc < ARCHIVE_WARN) {
			x->in_failed = true;
			const char *msg = archive_error_string(x->in);
			archive_set_error(a, EBADMSG, "%s stream: %s", archive_filter_name(x->in, 0),
					  msg != NULL ? msg : "damaged or cut short");
			return -1;
		}
		if (n == 0)
			continue;
		/* the pointer goes on as it is: uncompressed, it is into the stream's
		 * ring, where the file writer may write from (op_backup_restore_ring_offset) */
		x->blk = p;
		x->blk_len = n;
		*buf = p;
		return (la_ssize_t)n;
	}
	x->in_eof = true;
	return 0;
}

/* Byte off of the decompressed archive, if it is still in view; else -1. */
static int arch_byte(const struct restore *x, uint64_t off)
{
	if (off >= x->blk_off && off - x->blk_off < x->blk_len)
		return x->blk[off - x->blk_off];
	if (off < x->blk_off && x->blk_off - off <= x->before_len)
		return x->before[x->before_len - (size_t)(x->blk_off - off)];
	return -1;
}

/* The 512-byte block at off is in view and all zeros. */
static bool zero_block(const struct restore *x, uint64_t off)
{
	for (uint64_t o = off; o < off + 512; o++)
		if (arch_byte(x, o) != 0)
			return false;
	return true;
}

/* The tar reader said "end of archive": the end-of-archive marker (two zero blocks)
 * must be where it looked for the next header, then only zeros to the end of the
 * decompressed stream. last names the last member read (NULL: none). */
static int check_end(struct restore *x, const char *last)
{
	uint64_t h = (uint64_t)archive_read_header_position(x->a);
	uint64_t e = (uint64_t)archive_filter_bytes(x->a, 0);
	const char *z = x->compressed ? " (decompressed)" : "";
	if (e == h)
		return restore_fail(x, EBADMSG,
				    "truncated archive: it ends at offset %llu%s %s, without the end-of-archive blocks",
				    (unsigned long long)h, z, last != NULL ? "after this member" : "before any member");
	if (!zero_block(x, h))
		/* a header the reader skipped (a GNU volume label) or began, then the end */
		return restore_fail(x, EBADMSG, "truncated archive: no member follows the header at offset %llu%s",
				    (unsigned long long)h, z);
	if (e < h + 1024 || !zero_block(x, h + 512)) {
		bool more = arch_byte(x, h + 512) >= 0 || !x->in_eof;
		if (more)
			return restore_fail(
				x, EBADMSG,
				"a lone zero block at offset %llu%s, followed by data: not an end-of-archive marker",
				(unsigned long long)h, z);
		return restore_fail(x, EBADMSG, "truncated archive: one end-of-archive block at offset %llu%s, not two",
				    (unsigned long long)h, z);
	}
	/* the rest of the block in view, then whatever the decompressor still has
	 * (errors from here on are the stream's, not the last member's) */
	x->member = NULL;
	uint64_t end = x->blk_off + x->blk_len;
	for (uint64_t o = e; o < end; o++) {
		int c = arch_byte(x, o);
		if (c != 0)
			return restore_fail(x, EBADMSG, "data after the end of the archive at offset %llu%s",
					    (unsigned long long)o, z);
	}
	while (!x->in_eof) {
		const void *p;
		size_t n;
		la_int64_t off;
		int rc = archive_read_data_block(x->in, &p, &n, &off);
		if (rc == ARCHIVE_EOF) {
			x->in_eof = true;
			break;
		}
		if (rc < ARCHIVE_WARN) {
			x->in_failed = true;
			archive_set_error(x->a, EBADMSG, "%s stream: %s", archive_filter_name(x->in, 0),
					  archive_error_string(x->in) ? archive_error_string(x->in) :
									"damaged or cut short");
			return restore_fail_archive(x, "after the end of the archive");
		}
		const uint8_t *b = p;
		for (size_t i = 0; i < n; i++)
			if (b[i] != 0)
				return restore_fail(x, EBADMSG, "data after the end of the archive at offset %llu%s",
						    (unsigned long long)(end + i), z);
		end += n;
	}
	return 0;
}

/* After the end of the archive: read the stream to its end (its sha256 covers all
 * of it) and set r->sha_hex. A compressed stream must end with the compressor's
 * own end: gzip's reader stops at the first bytes after it that do not start a new
 * member and says nothing (zstd's refuses them). */
static int drain(struct restore *x)
{
	const void *buf;
	la_ssize_t n;
	while ((n = read_cb(x->in, x, &buf)) > 0)
		;
	if (n < 0)
		return restore_fail(x, x->input_err ? x->input_err : EIO, "read the end of the stream");
	if (x->r->has_from)
		op_backup_sha_hex(&x->r->sha, x->r->sha_hex);
	uint64_t used = (uint64_t)archive_filter_bytes(x->in, -1);
	if (x->compressed && x->r->stream_bytes > used)
		return restore_fail(x, EBADMSG, "%llu bytes after the end of the %s stream at offset %llu",
				    (unsigned long long)(x->r->stream_bytes - used), archive_filter_name(x->in, 0),
				    (unsigned long long)used);
	return 0;
}

/* ---- names ---- */

/* The member path raw as a relative path of plain components ("." and empty ones
 * dropped) into out: refused if absolute or with "..". */
static int normalize(struct restore *x, const char *raw, char *out, size_t *olen, const char *what)
{
	if (raw == NULL || raw[0] == '\0')
		return restore_fail(x, EBADMSG, "%s: empty name", what);
	if (raw[0] == '/')
		return restore_fail(x, EPERM, "%s: absolute path refused", what);
	size_t o = 0;
	for (const char *p = raw; *p != '\0';) {
		while (*p == '/')
			p++;
		if (*p == '\0')
			break;
		const char *q = p;
		while (*q != '\0' && *q != '/')
			q++;
		size_t len = (size_t)(q - p);
		if (len == 1 && p[0] == '.') {
			p = q;
			continue;
		}
		if (len == 2 && p[0] == '.' && p[1] == '.')
			return restore_fail(x, EPERM, "%s: \"..\" in the path refused", what);
		if (len > NAME_MAX)
			return restore_fail(x, ENAMETOOLONG, "%s: a name longer than %d bytes", what, NAME_MAX);
		if (o + len + 1 > EX_NAME_MAX)
			return restore_fail(x, ENAMETOOLONG, "%s: path too long", what);
		if (o > 0)
			out[o++] = '/';
		memcpy(out + o, p, len);
		o += len;
		p = q;
	}
	out[o] = '\0';
	*olen = o;
	return 0;
}

/* ---- directories on the way ---- */

/* Open the directory comp in fd, never through a symlink. create: make it if it is
 * missing (a directory the archive implies without an entry of its own). */
static int open_dir(struct restore *x, int fd, const char *comp, bool create)
{
	int nfd = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (nfd >= 0)
		return nfd;
	if (errno == ENOENT && create) {
		if (mkdirat(fd, comp, 0755) < 0 && errno != EEXIST)
			return restore_fail(x, errno, "create directory %s", comp);
		nfd = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd >= 0)
			return nfd;
	}
	int e = errno;
	if (e == ENOTDIR || e == ELOOP) {
		struct stat st;
		if (fstatat(fd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
			return restore_fail(x, EPERM, "the path goes through the symlink %s: refused", comp);
		return restore_fail(x, ENOTDIR, "%s on the path is not a directory", comp);
	}
	if (e == ENOENT)
		return restore_fail(x, ENOENT, "%s on the path does not exist", comp);
	return restore_fail(x, e, "open directory %s", comp);
}

void restore_stack_close(struct restore *x, size_t keep)
{
	while (x->nstk > keep)
		close(x->stk[--x->nstk].fd);
}

/* The directory holding the member path[0..plen) (its first dlen bytes name it):
 * the stack is reused as far as it matches. *tmp is set when the fd returned is
 * not kept in the stack (a very deep path) and must be closed by the caller. */
static int parent_fd(struct restore *x, const char *path, size_t dlen, bool create, bool *tmp)
{
	*tmp = false;
	if (dlen == 0)
		return x->base;
	size_t k = 0;
	while (k < x->nstk) {
		size_t end = x->stk[k].end;
		if (end > dlen || memcmp(x->cur, path, end) != 0 || (end < dlen && path[end] != '/'))
			break;
		k++;
	}
	restore_stack_close(x, k);
	size_t pos = k > 0 ? x->stk[k - 1].end + 1 : 0;
	int fd = k > 0 ? x->stk[k - 1].fd : x->base;
	bool fd_tmp = false;
	memcpy(x->cur, path, dlen);
	while (pos < dlen) {
		size_t e = pos;
		while (e < dlen && path[e] != '/')
			e++;
		char comp[NAME_MAX + 1];
		memcpy(comp, path + pos, e - pos);
		comp[e - pos] = '\0';
		int nfd = open_dir(x, fd, comp, create);
		if (fd_tmp)
			close(fd);
		if (nfd < 0)
			return -1;
		fd_tmp = x->nstk >= EX_STACK;
		if (!fd_tmp)
			x->stk[x->nstk++] = (struct restore_level){nfd, e};
		fd = nfd;
		pos = e + 1;
	}
	*tmp = fd_tmp;
	return fd;
}

/* Make room at pfd/name for a new entry: remove a file, a symlink or an empty
 * directory that is there. */
static int clear_slot(struct restore *x, int pfd, const char *name)
{
	if (unlinkat(pfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno == EISDIR || errno == EPERM) {
		if (unlinkat(pfd, name, AT_REMOVEDIR) == 0)
			return 0;
		if (errno == ENOTEMPTY || errno == EEXIST)
			return restore_fail(x, EEXIST, "a non-empty directory is in the way");
	}
	return restore_fail(x, errno, "remove what is in the way");
}

/* ---- metadata ---- */

bool restore_xattr_skippable(int e)
{
	return e == ENOTSUP || e == EOPNOTSUPP || e == EPERM || e == EACCES || e == ENOSYS;
}

/* Set the member's xattrs: through fd, or (fd < 0) on pfd/name without following. */
static int set_xattrs(struct restore *x, struct archive_entry *e, int fd, int pfd, const char *name)
{
	if (archive_entry_xattr_reset(e) == 0)
		return 0;
	const char *key;
	const void *val;
	size_t size;
	char proc[64 + NAME_MAX];
	if (fd < 0)
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d/%s", pfd, name);
	while (archive_entry_xattr_next(e, &key, &val, &size) == ARCHIVE_OK) {
		int rc = fd >= 0 ? fsetxattr(fd, key, val, size, 0) : lsetxattr(proc, key, val, size, 0);
		if (rc == 0)
			continue;
		if (!restore_xattr_skippable(errno))
			return restore_fail(x, errno, "set xattr %s", key);
		if (!x->xattr_warned)
			log_warn("restore %s: xattr %s of %s not set: %s (further ones not logged)", x->r->dir.abs, key,
				 x->member, strerror(errno));
		x->xattr_warned = true;
	}
	return 0;
}

void restore_entry_times(struct archive_entry *e, struct timespec ts[2])
{
	ts[0].tv_sec = archive_entry_atime(e);
	ts[0].tv_nsec = archive_entry_atime_is_set(e) ? archive_entry_atime_nsec(e) : UTIME_OMIT;
	ts[1].tv_sec = archive_entry_mtime(e);
	ts[1].tv_nsec = archive_entry_mtime_is_set(e) ? archive_entry_mtime_nsec(e) : UTIME_OMIT;
}

bool restore_want_owner(const struct restore *x, struct archive_entry *e, uid_t *uid, gid_t *gid)
{
	if (!x->root)
		return false;
	*uid = (uid_t)archive_entry_uid(e);
	*gid = (gid_t)archive_entry_gid(e);
	return *uid != x->euid || *gid != x->egid || x->sgid_possible;
}

void restore_chown_failed(struct restore *x, int e)
{
	/* an id the user namespace does not map (EINVAL): the file stays ours */
	log_warn("restore %s: cannot give %s its owner: %s", x->r->dir.abs, x->member, strerror(e));
}

/* Owner and xattrs of a directory open as fd (its mode and times are set at the end,
 * apply_fixups; regular files get theirs from the file writer, restore_files.c). */
static int meta_dir(struct restore *x, struct archive_entry *e, int fd)
{
	uid_t uid;
	gid_t gid;
	if (restore_want_owner(x, e, &uid, &gid) && fchown(fd, uid, gid) < 0)
		restore_chown_failed(x, errno);
	return set_xattrs(x, e, fd, -1, NULL);
}

static int add_fix(struct restore *x, struct archive_entry *e)
{
	if (x->nfix == x->capfix) {
		size_t ncap = x->capfix ? x->capfix * 2 : 64;
		struct dirfix *nf = realloc(x->fix, ncap * sizeof(*nf));
		if (nf == NULL)
			return restore_fail(x, ENOMEM, "out of memory");
		x->fix = nf;
		x->capfix = ncap;
	}
	struct dirfix *f = &x->fix[x->nfix];
	f->path = strndup(x->path, x->plen);
	if (f->path == NULL)
		return restore_fail(x, ENOMEM, "out of memory");
	f->mode = archive_entry_perm(e) & 07777;
	restore_entry_times(e, f->ts);
	x->nfix++;
	return 0;
}

/* ---- members ---- */

static int ex_dir(struct restore *x, struct archive_entry *e, int pfd, const char *name)
{
	if (x->plen == 0) {
		/* dir itself ("./"): its owner and xattrs now, mode and times at the end */
		x->root_seen = true;
		if (meta_dir(x, e, x->base) < 0)
			return -1;
		return add_fix(x, e);
	}
	if (mkdirat(pfd, name, 0700) < 0) {
		if (errno != EEXIST)
			return restore_fail(x, errno, "mkdir");
		struct stat st;
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return restore_fail(x, errno, "lstat");
		if (!S_ISDIR(st.st_mode)) {
			if (clear_slot(x, pfd, name) < 0)
				return -1;
			if (mkdirat(pfd, name, 0700) < 0)
				return restore_fail(x, errno, "mkdir");
		}
	}
	uid_t uid;
	gid_t gid;
	if (restore_want_owner(x, e, &uid, &gid) || archive_entry_xattr_count(e) > 0) {
		int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return restore_fail(x, errno, "open directory");
		int rc = meta_dir(x, e, fd);
		close(fd);
		if (rc < 0)
			return -1;
	}
	return add_fix(x, e);
}

static int ex_file(struct restore *x, struct archive_entry *e, int pfd, const char *name)
{
	mode_t perm = archive_entry_perm(e) & 0777;
	int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, perm);
	if (fd < 0 && errno == EEXIST) {
		if (clear_slot(x, pfd, name) < 0)
			return -1;
		fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, perm);
	}
	if (fd < 0)
		return restore_fail(x, errno, "create");
	return restore_files_add(x, e, fd, x->umask_known ? (perm & ~x->umask) : perm);
}

static int ex_symlink(struct restore *x, struct archive_entry *e, int pfd, const char *name)
{
	const char *target = archive_entry_symlink(e);
	if (target == NULL || target[0] == '\0')
		return restore_fail(x, EBADMSG, "symlink without a target");
	/* any target is fine: nothing here ever follows a symlink */
	if (symlinkat(target, pfd, name) < 0) {
		if (errno != EEXIST || clear_slot(x, pfd, name) < 0 || symlinkat(target, pfd, name) < 0)
			return restore_fail(x, errno, "symlink");
	}
	uid_t uid;
	gid_t gid;
	if (restore_want_owner(x, e, &uid, &gid) && fchownat(pfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		restore_chown_failed(x, errno);
	if (set_xattrs(x, e, -1, pfd, name) < 0)
		return -1;
	struct timespec ts[2];
	restore_entry_times(e, ts);
	if (utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
		return restore_fail(x, errno, "set times");
	return 0;
}

/* FIFOs and device nodes. */
static int ex_node(struct restore *x, struct archive_entry *e, int pfd, const char *name)
{
	mode_t type = archive_entry_filetype(e);
	if (type != AE_IFIFO && !x->r->allow_devices)
		return restore_fail(x, EPERM, "device node refused (allow_devices is off)");
	mode_t perm = archive_entry_perm(e) & 0777;
	dev_t dev = type == AE_IFIFO ? 0 : archive_entry_rdev(e);
	if (mknodat(pfd, name, type | perm, dev) < 0) {
		if (errno != EEXIST || clear_slot(x, pfd, name) < 0 || mknodat(pfd, name, type | perm, dev) < 0)
			return restore_fail(x, errno, "mknod");
	}
	/* an O_PATH fd: opening the node itself could block (FIFO) or act (device) */
	int cleanup_close fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return restore_fail(x, errno, "open");
	struct stat st;
	if (fstat(fd, &st) < 0 || (st.st_mode & S_IFMT) != type)
		return restore_fail(x, EAGAIN, "replaced while being restored");
	uid_t uid;
	gid_t gid;
	bool chowned = false;
	if (restore_want_owner(x, e, &uid, &gid)) {
		if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH) < 0)
			restore_chown_failed(x, errno);
		else
			chowned = true;
	}
	if (set_xattrs(x, e, -1, pfd, name) < 0)
		return -1;
	mode_t mode = archive_entry_perm(e) & 07777;
	if ((mode != (st.st_mode & 07777) || chowned) && fs_fd_chmod(fd, mode) < 0)
		return restore_fail(x, errno, "chmod");
	struct timespec ts[2];
	restore_entry_times(e, ts);
	if (fs_fd_utimens(fd, ts) < 0)
		return restore_fail(x, errno, "set times");
	return 0;
}

/* Link x->tpath, resolved from base, to pfd/name. 0; 1 when the target is not
 * there (nothing reported); -1 with the job's error. */
static int link_from(struct restore *x, int base, int pfd, const char *name)
{
	/* the target's directory, walked on its own (the stack holds the member's) */
	const char *slash = strrchr(x->tpath, '/');
	const char *tname = slash ? slash + 1 : x->tpath;
	int tfd = base;
	if (slash != NULL) {
		size_t dlen = (size_t)(slash - x->tpath);
		for (size_t pos = 0; pos < dlen;) {
			size_t end = pos;
			while (end < dlen && x->tpath[end] != '/')
				end++;
			char comp[NAME_MAX + 1];
			memcpy(comp, x->tpath + pos, end - pos);
			comp[end - pos] = '\0';
			int nfd = openat(tfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int e = errno;
			/* not there: the caller says so; anything else as open_dir reports it
			 * (a symlink on the way is refused) */
			if (nfd < 0 && e != ENOENT)
				nfd = open_dir(x, tfd, comp, false);
			if (tfd != base)
				close(tfd);
			if (nfd < 0)
				return x->err_set ? -1 : 1;
			tfd = nfd;
			pos = end + 1;
		}
	}
	int rc = linkat(tfd, tname, pfd, name, 0);
	if (rc < 0 && errno == EEXIST) {
		if (clear_slot(x, pfd, name) == 0)
			rc = linkat(tfd, tname, pfd, name, 0);
		else
			rc = -2;
	}
	int err = errno;
	if (tfd != base)
		close(tfd);
	if (rc == -2)
		return -1;
	if (rc < 0) {
		if (err == ENOENT)
			return 1;
		return restore_fail(x, err, "link to %.150s", x->tpath);
	}
	return 0;
}

static int ex_hardlink(struct restore *x, int pfd, const char *name, const char *raw)
{
	size_t tlen;
	if (normalize(x, raw, x->tpath, &tlen, "hard link target") < 0)
		return -1;
	if (tlen == 0)
		return restore_fail(x, EPERM, "hard link to the directory itself refused");
	if (tlen == x->plen && memcmp(x->tpath, x->path, tlen) == 0)
		return 0; /* a link to itself: nothing to do */
	int rc = link_from(x, x->base, pfd, name);
	if (rc == 1 && x->merge_in)
		/* merging: a link to a file that is in dir already, as if extracting there
		 * (the file gains a link until the merge, or the temp directory goes) */
		rc = link_from(x, x->dirfd, pfd, name);
	if (rc == 1)
		return restore_fail(x, ENOENT, "hard link target %.150s was not extracted", x->tpath);
	return rc;
}

static int ex_member(struct restore *x, struct archive_entry *e)
{
	const char *raw = archive_entry_pathname(e);
	x->member = raw != NULL ? raw : "";
	if (normalize(x, raw, x->path, &x->plen, "member") < 0)
		return -1;
	const char *hard = archive_entry_hardlink(e);
	mode_t type = archive_entry_filetype(e);
	if (x->plen == 0 && (hard != NULL || type != AE_IFDIR))
		return restore_fail(x, EPERM, "a member that would replace the directory itself refused");
	if (type == AE_IFSOCK)
		return 0;
	if (hard == NULL && type != AE_IFDIR && type != AE_IFREG && type != AE_IFLNK && type != AE_IFIFO &&
	    type != AE_IFCHR && type != AE_IFBLK) {
		log_warn("restore %s: member %s of unknown type %o skipped", x->r->dir.abs, x->member, type);
		return 0;
	}
	if ((type == AE_IFCHR || type == AE_IFBLK) && hard == NULL && !x->r->allow_devices)
		return restore_fail(x, EPERM, "device node refused (allow_devices is off)");
	const char *slash = strrchr(x->path, '/');
	const char *name = slash ? slash + 1 : x->path;
	size_t dlen = slash ? (size_t)(slash - x->path) : 0;
	bool tmp = false;
	int pfd = x->plen == 0 ? x->base : parent_fd(x, x->path, dlen, true, &tmp);
	if (pfd < 0)
		return -1;
	int rc;
	if (hard != NULL)
		rc = ex_hardlink(x, pfd, name, hard);
	else if (type == AE_IFDIR)
		rc = ex_dir(x, e, pfd, name);
	else if (type == AE_IFREG)
		rc = ex_file(x, e, pfd, name);
	else if (type == AE_IFLNK)
		rc = ex_symlink(x, e, pfd, name);
	else
		rc = ex_node(x, e, pfd, name);
	if (tmp)
		close(pfd);
	return rc;
}

/* Directories' modes and times, deepest (latest) first: a mode without write
 * permission would stop what is created below it, and creating entries changes a
 * directory's mtime. */
static int apply_fixups(struct restore *x)
{
	restore_stack_close(x, 0);
	for (size_t i = x->nfix; i-- > 0;) {
		struct dirfix *f = &x->fix[i];
		x->member = f->path;
		int fd = x->base;
		bool own = false;
		if (f->path[0] != '\0') {
			char *slash = strrchr(f->path, '/');
			bool tmp = false;
			int pfd = slash ? parent_fd(x, f->path, (size_t)(slash - f->path), false, &tmp) : x->base;
			if (pfd < 0)
				return -1;
			fd = openat(pfd, slash ? slash + 1 : f->path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int err = errno;
			if (tmp)
				close(pfd);
			if (fd < 0) {
				/* replaced by a later member: nothing to fix */
				if (err == ENOENT || err == ENOTDIR || err == ELOOP)
					continue;
				return restore_fail(x, err, "open directory");
			}
			own = true;
		}
		int rc = 0;
		if (fs_fd_chmod(fd, f->mode) < 0)
			rc = restore_fail(x, errno, "chmod");
		else if (fs_fd_utimens(fd, f->ts) < 0)
			rc = restore_fail(x, errno, "set times");
		if (own)
			close(fd);
		if (rc < 0)
			return -1;
	}
	restore_stack_close(x, 0);
	return 0;
}

/* ---- the job ---- */

static void read_umask(struct restore *x)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (f == NULL)
		return;
	char line[128];
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned m;
		if (sscanf(line, "Umask: %o", &m) == 1) {
			x->umask = (mode_t)m;
			x->umask_known = true;
			break;
		}
	}
	fclose(f);
}

/* The two readers: in (the stream, decompressed) and a (tar, from in's output). */
static int open_readers(struct restore *x)
{
	struct archive *in = x->in = archive_read_new();
	if (in == NULL)
		return restore_fail(x, ENOMEM, "out of memory");
	if (archive_read_support_filter_gzip(in) != ARCHIVE_OK || archive_read_support_filter_zstd(in) != ARCHIVE_OK ||
	    archive_read_support_filter_none(in) != ARCHIVE_OK || archive_read_support_format_raw(in) != ARCHIVE_OK)
		return restore_fail_archive(x, "set up the reader");
	struct archive_entry *e;
	if (archive_read_open(in, x, NULL, read_cb, NULL) != ARCHIVE_OK ||
	    archive_read_next_header(in, &e) != ARCHIVE_OK) {
		if (x->input_err == 0 && x->r->stream_bytes == 0)
			return restore_fail(x, EBADMSG,
					    "the stream ends at offset 0: an empty stream is not an archive");
		return restore_fail_archive(x, "open the archive");
	}
	x->compressed = archive_filter_count(in) > 1;
	struct archive *a = x->a = archive_read_new();
	if (a == NULL)
		return restore_fail(x, ENOMEM, "out of memory");
	if (archive_read_support_format_tar(a) != ARCHIVE_OK || archive_read_support_filter_none(a) != ARCHIVE_OK)
		return restore_fail_archive(x, "set up the reader");
	if (archive_read_open(a, x, NULL, tar_read_cb, NULL) != ARCHIVE_OK) {
		if (!x->in_failed && x->input_err == 0 && x->in_eof && x->blk_off == 0)
			return restore_fail(x, EBADMSG, "the %s stream holds nothing: not an archive",
					    archive_filter_name(in, 0));
		return restore_fail_archive(x, "open the archive");
	}
	return 0;
}

static int extract(struct restore *x)
{
	struct restore_job *r = x->r;
	if (open_readers(x) < 0)
		return -1;
	struct archive *a = x->a;
	const char *last = NULL;
	char lastbuf[256];
	for (;;) {
		if (restore_cancelled(x))
			return restore_fail(x, ECANCELED, "cancelled");
		struct archive_entry *e;
		int rc = archive_read_next_header(a, &e);
		x->member = last;
		if (rc == ARCHIVE_EOF)
			break;
		if (rc < ARCHIVE_WARN || rc == ARCHIVE_RETRY)
			return restore_fail_archive(x, last ? "the header after this member" : "the first header");
		if (ex_member(x, e) < 0)
			return -1;
		snprintf(lastbuf, sizeof(lastbuf), "%s", x->member);
		last = lastbuf;
		r->entries++;
		__atomic_store_n(&r->j.items, r->entries, __ATOMIC_RELAXED);
	}
	/* errors name the last member (dir itself when there was none) */
	if (check_end(x, last) < 0)
		return -1;
	x->member = NULL;
	if (r->entries == 0 && !r->allow_empty)
		/* a zero-filled file is such an archive: making dir empty must be asked for */
		return restore_fail(x, EBADMSG,
				    "the archive has no members (at offset 0 the end-of-archive blocks): "
				    "allow_empty restores it as an empty directory");
	if (restore_files_finish(x) < 0)
		return -1;
	if (drain(x) < 0)
		return -1;
	if (r->has_sha && strcmp(r->sha_hex, r->want_sha) != 0)
		return restore_fail(x, EBADMSG, "sha256 mismatch: the stream's is %s", r->sha_hex);
	if (x->merge_in)
		return 0; /* the directories' modes and times are set once merged (restore_run) */
	if (apply_fixups(x) < 0)
		return -1;
	x->member = NULL;
	if (!x->root_seen) {
		/* no "./" member: the new directory looks like the old one, or is new */
		mode_t mode = x->existed ? (x->old.st_mode & 07777) : (0755 & ~(x->umask_known ? x->umask : 022));
		if (x->existed && x->root && fchown(x->base, x->old.st_uid, x->old.st_gid) < 0)
			restore_chown_failed(x, errno);
		if (fchmod(x->base, mode) < 0)
			return restore_fail(x, errno, "chmod");
	}
	return 0;
}

/* Merge mode, all verified: the entries into dir, then the directories' modes and
 * times there (deepest first, as apply_fixups does them). */
static int merge(struct restore *x)
{
	if (restore_swap_merge_in(x) < 0)
		return -1;
	restore_stack_close(x, 0);
	close(x->base);
	x->base = fcntl(x->dirfd, F_DUPFD_CLOEXEC, 0);
	if (x->base < 0)
		return restore_fail(x, errno, "dup");
	return apply_fixups(x);
}

/* The restore itself: open the archive file, the temp directory, the file writer, the
 * entries, then the swap or the merge. -1 with the error in the job; restore_run undoes. */
static int restore_steps(struct restore *x)
{
	struct restore_job *r = x->r;
	if (r->has_from) {
		x->from_fd = fs_open(&r->from, O_RDONLY | O_NOCTTY, 0, &r->j.err);
		x->from_buf = malloc(FROM_BUF);
		if (x->from_fd < 0) {
			x->err_set = true;
			return -1;
		}
		if (x->from_buf == NULL)
			return restore_fail(x, ENOMEM, "out of memory");
		posix_fadvise(x->from_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	}
	if (restore_swap_prepare(x) < 0 || restore_files_start(x) < 0 || extract(x) < 0)
		return -1;
	return x->merge_in ? merge(x) : restore_swap_in(x);
}

int restore_run(struct restore_job *r)
{
	struct restore *x = calloc(1, sizeof(*x));
	if (x == NULL)
		return err_set(&r->j.err, ENOMEM, NULL, "out of memory");
	x->r = r;
	x->base = x->pdfd = x->dirfd = x->from_fd = -1;
	/* the operation's identity (entered by this worker): acting as a user, what is
	 * created is that user's and no owner is given away (a user cannot chown) */
	x->euid = fs_ctx_uid();
	x->egid = fs_ctx_gid();
	x->root = x->euid == 0;
	read_umask(x);
	locale_t loc = op_backup_utf8_locale();
	locale_t old = loc != (locale_t)0 ? uselocale(loc) : (locale_t)0;
	int rc = restore_steps(x);
	/* the file writer first: it may still hold files of the temp directory */
	restore_files_free(x);
	restore_stack_close(x, 0);
	if (x->a != NULL)
		archive_read_free(x->a);
	if (x->in != NULL)
		archive_read_free(x->in);
	if (x->base >= 0)
		close(x->base);
	x->base = -1;
	/* failed: the temp directory goes; done: the old tree (at the temp name) goes */
	bool inside = x->tmp_made && x->dirfd >= 0 && x->tmp_parent == x->dirfd;
	restore_swap_drop_tmp(x);
	if (rc < 0 && inside && !x->touched) {
		/* the temp directory was dir's only change: its times as they were */
		struct timespec ts[2] = {x->old.st_atim, x->old.st_mtim};
		if (futimens(x->dirfd, ts) < 0)
			log_warn("restore %s: cannot set its times back: %s", r->dir.abs, strerror(errno));
	}
	if (x->dirfd >= 0)
		close(x->dirfd);
	if (x->pdfd >= 0)
		close(x->pdfd);
	if (x->from_fd >= 0)
		close(x->from_fd);
	free(x->from_buf);
	for (size_t i = 0; i < x->nfix; i++)
		free(x->fix[i].path);
	free(x->fix);
	free(x->fixidx);
	free(x->mbuf);
	free(x);
	if (loc != (locale_t)0)
		uselocale(old);
	return rc;
}
