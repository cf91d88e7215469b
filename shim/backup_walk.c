/* backup_walk.c: the backup job: our own walk of the tree with directory fds, feeding libarchive's pax writer. */
#include "backup.h"
#include "backup_meta.h"
#include "journal.h"
#include "log.h"
#include "util.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/*
 * Why not archive_read_disk: bsdtar's walker makes about twice the syscalls of GNU
 * tar on a real tree (a hole probe of every file, fchdir and fcntl per directory).
 * This walk makes, per entry, one fstatat(AT_SYMLINK_NOFOLLOW) and one listxattr; per
 * regular file with data openat (O_NOATIME where we may: a backup leaves atimes
 * alone), the reads, fstat (did it change?) and close; per directory openat,
 * getdents64 with 32 KiB buffers and close. Holes are probed (SEEK_DATA/SEEK_HOLE)
 * only for a file whose st_blocks shows fewer bytes than its size. libarchive then
 * only formats (pax) and compresses; uncompressed, file data is read straight into
 * the buffer handed to the loop. On /usr/share: 6.0 syscalls per entry, GNU tar 8.4.
 *
 * Members are named like `tar -C DIR -c .` names them: "./" for DIR itself, then
 * "./a", "./a/b"... The archive is pax (POSIX.1-2001 interchange): names and link
 * targets of any bytes (valid UTF-8 as is, anything else with hdrcharset=BINARY),
 * mtime with nanoseconds (no atime, as GNU tar and bsdtar: it would cost every
 * member a pax header; no ctime: it cannot be restored), uid/gid and their names,
 * all mode bits, xattrs as SCHILY.xattr.* (which GNU tar reads too), sparse files
 * in GNU sparse format 1.0, hard links as links to the first name. A member gets a
 * pax extended header only when its ustar header cannot hold it all (mtime
 * nanoseconds, long or non-ASCII names, xattrs, sparse maps, big ids or sizes).
 *
 * Excludes, with GNU tar's default meaning (--wildcards --no-anchored
 * --wildcards-match-slash): a pattern is matched with fnmatch(3) without flags (so
 * '*' and '?' also match '/' and a leading '.') against the path below DIR ("a/b")
 * and against every tail of it that starts after a '/'. So "*.o", ".*" and "b"
 * match at any depth, "a/b" matches "a/b" and "x/a/b". What GNU tar would do with
 * `tar -C DIR -c .` differs in one way: there every member name starts with "./",
 * which ".*" or "?" or "*x" match too, so they leave out everything; here they
 * apply below DIR. Two additions: a pattern starting with "./" or "/" is anchored
 * at DIR ("./a" matches "a" only, not "x/a"), and one ending with '/' applies to
 * directories only (to GNU tar it matches nothing). An excluded directory is left
 * out with everything below it. DIR itself is never excluded.
 *
 * Errors name the path as the client sees it (DIR/a/b). A file or directory that
 * cannot be opened or read for lack of permission (EACCES, EPERM) fails the backup,
 * or with skip_unreadable is left out and listed in the record's skipped; an empty
 * file is never opened, so it is never unreadable. Any other error fails the
 * backup. A file whose size, mtime or inode differ after it was read (fstat of the
 * open file against the fstatat before) is listed in changed; if it shrank, the
 * missing bytes are stored as zeros (its header was already written). Sockets are
 * left out, as tar does.
 */

#define WALK_DENTS (32u << 10) /* getdents64 buffer of an open level */
#define WALK_OPEN 32           /* levels that keep their fd and buffer */
#define WALK_READ (256u << 10) /* file read buffer */
#define WALK_NAME_MAX 16384    /* longest member name */
#define LIST_BUDGET (256u << 10)
#define TAR_RECORD 10240  /* GNU tar's default record: 20 blocks of 512 bytes */
#define MAX_REGIONS 65536 /* data regions of a sparse file; more are stored as data */

struct dirent64_raw {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

struct level {
	int fd; /* -1 while released (far above the deepest level) */
	dev_t dev;
	ino_t ino;
	off_t next;   /* getdents position of the next entry */
	uint8_t *buf; /* NULL while released */
	size_t len, pos;
	size_t name_len; /* bytes of walk.name that prefix this level's entries ("./a/") */
	bool holds_to;   /* to_path's directory */
};

struct region {
	off_t off, len;
};

struct walk {
	struct bk *b;
	struct archive *a;
	struct archive_entry *e;
	dev_t root_dev;
	uid_t euid;
	bool noatime_any; /* root: O_NOATIME on any file (open_first) */
	struct level *lv;
	size_t nlv, cap_lv;
	char name[WALK_NAME_MAX + NAME_MAX + 2]; /* the member name being written */
	uint8_t *rbuf;
	char *xlist, *xval;
	struct region *reg;
	size_t nreg, cap_reg;
	struct bk_links links;
	struct bk_names users, groups;
	struct bk_excludes ex;
	bool err_set; /* b->j.err holds the first error: keep it */
	bool failing; /* closing after a failure: no more output */
	bool closed;  /* archive_write_close() called (never twice: 3.6 would reuse freed state) */
	/* to_path: the temp file, and where it and the final file are (left out) */
	int to_dfd, to_fd;
	dev_t to_dev;
	ino_t to_ino;
	char to_name[NAME_MAX + 1], to_tmp[NAME_MAX + 1];
	struct journal_entry *jent;
	bool tmp_made;
};

static const uint8_t zeros[WALK_READ];

/* ---- errors ---- */

/* DIR/rel as the client sees it, for errors and the record: rel is a member name. */
static size_t client_path(const struct walk *w, const char *member, char *buf, size_t size)
{
	const struct bk *b = w->b;
	const char *rel = member[0] == '.' && member[1] == '/' ? member + 2 : "";
	int n = snprintf(buf, size, "%.*s%s%s", (int)b->dir_len, b->dir.abs, *rel || b->dir_len == 0 ? "/" : "", rel);
	if (n < 0)
		return 0;
	return (size_t)n < size ? (size_t)n : size - 1;
}

static int fail(struct walk *w, int code, const char *what)
{
	if (w->err_set)
		return -1;
	char p[PATH_MAX + 64];
	size_t n = client_path(w, w->name, p, sizeof(p));
	w->err_set = true;
	return err_setn(&w->b->j.err, code, p, n, "backup: %s", what);
}

static int fail_archive(struct walk *w, const char *what)
{
	int code = archive_errno(w->a);
	const char *msg = archive_error_string(w->a);
	if (code <= 0)
		code = EIO;
	char m[200];
	snprintf(m, sizeof(m), "%s: %s", what, msg ? msg : "libarchive error");
	return fail(w, code, m);
}

static int list_add(struct bk_list *l, const char *path, size_t len)
{
	l->total++;
	if (l->bytes + len > LIST_BUDGET)
		return 0;
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 16;
		char **nv = realloc(l->v, ncap * sizeof(*nv));
		if (nv == NULL)
			return -1;
		l->v = nv;
		l->cap = ncap;
	}
	char *s = strndup(path, len);
	if (s == NULL)
		return -1;
	l->v[l->n++] = s;
	l->bytes += len;
	return 0;
}

static int note(struct walk *w, struct bk_list *l)
{
	char p[PATH_MAX + WALK_NAME_MAX + 2];
	size_t n = client_path(w, w->name, p, sizeof(p));
	if (list_add(l, p, n) < 0)
		return fail(w, ENOMEM, "out of memory");
	return 0;
}

/* A file or directory we may not read: fail, or leave it out and list it. */
static int unreadable(struct walk *w, int code, const char *what)
{
	if ((code == EACCES || code == EPERM) && w->b->skip_unreadable)
		return note(w, &w->b->skipped);
	return fail(w, code, what);
}

static bool cancelled(struct walk *w)
{
	return bjob_cancelled(&w->b->j);
}

/* ---- xattrs ---- */

static bool xattr_ignorable(int e)
{
	/* no xattrs here, or not ours to read (trusted.* without CAP_SYS_ADMIN) */
	return e == ENOTSUP || e == EOPNOTSUPP || e == ENOSYS || e == EPERM || e == EACCES || e == ENODATA ||
	       e == ENOENT;
}

/* The kernel allocates a buffer of the size we pass for every call (64 KiB pages for
 * XATTR_LIST_MAX): ask with a small one first, the full size only on ERANGE. */
#define XATTR_SMALL 1024

static ssize_t list_xattrs(struct walk *w, int fd, int dfd, const char *name, size_t size)
{
	return fd >= 0 ? flistxattr(fd, w->xlist, size) : bk_xattr_list_at(dfd, name, w->xlist, size);
}

static ssize_t get_xattr(struct walk *w, int fd, int dfd, const char *name, const char *key)
{
	ssize_t v = fd >= 0 ? fgetxattr(fd, key, w->xval, XATTR_SMALL) :
			      bk_xattr_get_at(dfd, name, key, w->xval, XATTR_SMALL);
	if (v < 0 && errno == ERANGE)
		v = fd >= 0 ? fgetxattr(fd, key, w->xval, XATTR_SIZE_MAX) :
			      bk_xattr_get_at(dfd, name, key, w->xval, XATTR_SIZE_MAX);
	return v;
}

/* Add the entry's xattrs to w->e: through fd when it has one, else dfd/name. */
static int add_xattrs(struct walk *w, int fd, int dfd, const char *name)
{
	ssize_t n = list_xattrs(w, fd, dfd, name, XATTR_SMALL);
	if (n < 0 && errno == ERANGE)
		n = list_xattrs(w, fd, dfd, name, XATTR_LIST_MAX);
	if (n < 0)
		return xattr_ignorable(errno) ? 0 : fail(w, errno, "listxattr");
	for (ssize_t off = 0; off < n;) {
		const char *key = w->xlist + off;
		size_t klen = strnlen(key, (size_t)(n - off));
		off += (ssize_t)klen + 1;
		if (klen == 0)
			continue;
		ssize_t v = get_xattr(w, fd, dfd, name, key);
		if (v < 0) {
			if (xattr_ignorable(errno))
				continue;
			return fail(w, errno, "getxattr");
		}
		archive_entry_xattr_add_entry(w->e, key, w->xval, (size_t)v);
	}
	return 0;
}

/* ---- headers ---- */

/* Fill w->e for the entry w->name with stat st and write its header. fd: an open fd
 * of the entry (for xattrs), or -1 to use dfd/name. */
static int put_header(struct walk *w, const struct stat *st, int fd, int dfd, const char *name, const char *symlink,
		      const char *hardlink)
{
	struct archive_entry *e = w->e;
	archive_entry_clear(e);
	archive_entry_copy_pathname(e, w->name);
	archive_entry_copy_stat(e, st);
	/* No atime or ctime (as GNU tar and bsdtar by default): either would cost every
	 * member a pax extended header (1 KiB), 8% more archive on a real tree. The
	 * mtime's nanoseconds are kept, in a pax header only when they are not 0. */
	archive_entry_unset_atime(e);
	archive_entry_unset_ctime(e);
	if (!S_ISREG(st->st_mode))
		archive_entry_set_size(e, 0);
	const char *u = bk_name_of(&w->users, st->st_uid);
	if (u != NULL)
		archive_entry_copy_uname(e, u);
	const char *g = bk_name_of(&w->groups, st->st_gid);
	if (g != NULL)
		archive_entry_copy_gname(e, g);
	if (symlink != NULL)
		archive_entry_copy_symlink(e, symlink);
	if (hardlink != NULL) {
		archive_entry_copy_hardlink(e, hardlink);
		archive_entry_set_size(e, 0);
	} else if (add_xattrs(w, fd, dfd, name) < 0) {
		return -1;
	}
	for (size_t i = 0; i < w->nreg; i++)
		archive_entry_sparse_add_entry(e, w->reg[i].off, w->reg[i].len);
	/* ARCHIVE_WARN: a name that is not UTF-8, stored as raw bytes (hdrcharset) */
	if (archive_write_header(w->a, e) < ARCHIVE_WARN)
		return fail_archive(w, "write header");
	w->b->entries++;
	__atomic_store_n(&w->b->j.items, w->b->entries, __ATOMIC_RELAXED);
	return 0;
}

/* ---- file data ---- */

/* A backup leaves atimes alone (and spares the filesystem the inode writes): with
 * O_NOATIME where we may use it, i.e. as the owner or with CAP_FOWNER; EPERM (a
 * user namespace that does not map the owner) just costs one more open. */
static int open_noatime(struct walk *w, int dfd, const char *name, int flags, const struct stat *st)
{
	if (w->euid == 0 || st->st_uid == w->euid) {
		int fd = openat(dfd, name, flags | O_NOATIME);
		if (fd >= 0 || errno != EPERM)
			return fd;
	}
	return openat(dfd, name, flags);
}

static int add_region(struct walk *w, off_t off, off_t len)
{
	if (w->nreg == w->cap_reg) {
		size_t ncap = w->cap_reg ? w->cap_reg * 2 : 16;
		struct region *nr = realloc(w->reg, ncap * sizeof(*nr));
		if (nr == NULL)
			return fail(w, ENOMEM, "out of memory");
		w->reg = nr;
		w->cap_reg = ncap;
	}
	w->reg[w->nreg++] = (struct region){off, len};
	return 0;
}

/* A file with fewer blocks than its size: find its data regions. Leaves w->nreg 0
 * when the file turns out not to be sparse (one region covering it all: inline
 * data, compression) or the filesystem cannot tell. */
static int probe_holes(struct walk *w, int fd, off_t size)
{
	w->nreg = 0;
	off_t pos = 0;
	while (pos < size) {
		off_t d = lseek(fd, pos, SEEK_DATA);
		if (d < 0) {
			if (errno == ENXIO)
				break; /* a hole up to the end */
			w->nreg = 0;
			return 0; /* no SEEK_DATA here: store it whole */
		}
		if (d >= size)
			break;
		off_t h = lseek(fd, d, SEEK_HOLE);
		if (h < 0 || h > size)
			h = size;
		if (w->nreg + 1 >= MAX_REGIONS)
			h = size; /* enough: the rest as data */
		if (add_region(w, d, h - d) < 0)
			return -1;
		pos = h;
	}
	if (w->nreg == 1 && w->reg[0].off == 0 && w->reg[0].len == size) {
		w->nreg = 0;
		return 0;
	}
	if (w->nreg == 0 || w->reg[w->nreg - 1].off + w->reg[w->nreg - 1].len < size) {
		/* GNU sparse 1.0 ends with the file's size: an empty region there */
		if (add_region(w, size, 0) < 0)
			return -1;
	}
	return 0;
}

static int write_data(struct walk *w, const void *buf, size_t len)
{
	la_ssize_t n = archive_write_data(w->a, buf, len);
	if (n < 0 || (size_t)n != len)
		return fail_archive(w, "write data");
	return 0;
}

/* Zeros for a hole (the pax writer skips them) or for a file that shrank. */
static int write_zeros(struct walk *w, uint64_t len)
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
 * filled, and the callback finds the bytes already in place (bk_output, to_write).
 * NULL when a compressor sits in between, when there is little room left there, or
 * for a sparse file: the writer puts its sparse map out first, over those bytes. */
static uint8_t *out_area(struct walk *w, size_t *room)
{
	struct bk *b = w->b;
	if (b->compression != 0 || w->nreg > 0)
		return NULL;
	struct bk_buf *x = &b->buf[b->has_to ? 0 : b->fill];
	if (BK_BUF - x->len < (32u << 10))
		return NULL;
	*room = BK_BUF - x->len;
	return x->data + x->len;
}

/* Copy [off, off+len) of the file into the archive. *shrank: the file ended first
 * (the rest is written as zeros). */
static int copy_range(struct walk *w, int fd, off_t off, off_t len, bool *shrank)
{
	while (len > 0) {
		if (cancelled(w))
			return fail(w, ECANCELED, "cancelled");
		size_t room = WALK_READ;
		uint8_t *dst = out_area(w, &room);
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

static int link_add(struct walk *w, const struct stat *st)
{
	if (bk_link_add(&w->links, st->st_dev, st->st_ino, st->st_nlink, w->name) < 0)
		return fail(w, ENOMEM, "out of memory");
	return 0;
}

/* A regular file; fd: the file already open (open_first), or -1. */
static int entry_file(struct walk *w, struct level *L, const char *name, const struct stat *st, int fd)
{
	w->nreg = 0;
	if (st->st_nlink > 1) {
		const char *first = bk_link_find(&w->links, st->st_dev, st->st_ino);
		if (first != NULL) {
			if (fd >= 0)
				close(fd);
			if (put_header(w, st, -1, L->fd, name, NULL, first) < 0)
				return -1;
			bk_link_met(&w->links, st->st_dev, st->st_ino);
			return 0;
		}
	}
	if (fd >= 0 && st->st_size == 0) {
		/* as when it is not opened: no reads, so no check that it changed */
		int r = put_header(w, st, fd, L->fd, name, NULL, NULL);
		close(fd);
		if (r < 0)
			return -1;
		fd = -1;
		goto finish;
	}
	if (fd < 0 && st->st_size > 0) {
		fd = open_noatime(w, L->fd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC, st);
		if (fd < 0) {
			if (errno == ENOENT || errno == ELOOP)
				return 0; /* gone or replaced since the fstatat */
			return unreadable(w, errno, "open");
		}
	}
	if (fd >= 0 && (uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size && probe_holes(w, fd, st->st_size) < 0)
		goto fail;
	if (put_header(w, st, fd, L->fd, name, NULL, NULL) < 0)
		goto fail;
	bool shrank = false;
	if (fd >= 0) {
		if (w->nreg == 0) {
			if (copy_range(w, fd, 0, st->st_size, &shrank) < 0)
				goto fail;
		} else {
			off_t pos = 0;
			for (size_t i = 0; i < w->nreg && !shrank; i++) {
				const struct region *r = &w->reg[i];
				if (r->off > pos && write_zeros(w, (uint64_t)(r->off - pos)) < 0)
					goto fail;
				if (copy_range(w, fd, r->off, r->len, &shrank) < 0)
					goto fail;
				pos = r->off + r->len;
			}
			w->nreg = 0;
		}
		struct stat after;
		if (fstat(fd, &after) < 0) {
			fail(w, errno, "stat");
			goto fail;
		}
		close(fd);
		fd = -1;
		if (shrank || after.st_size != st->st_size || after.st_mtim.tv_sec != st->st_mtim.tv_sec ||
		    after.st_mtim.tv_nsec != st->st_mtim.tv_nsec || after.st_ino != st->st_ino ||
		    after.st_dev != st->st_dev) {
			if (note(w, &w->b->changed) < 0)
				return -1;
		}
	}
finish:
	if (archive_write_finish_entry(w->a) < ARCHIVE_WARN)
		return fail_archive(w, "finish entry");
	if (st->st_nlink > 1 && link_add(w, st) < 0)
		return -1;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return -1;
}

/* Symlinks, FIFOs, device nodes: a header only. */
static int entry_other(struct walk *w, struct level *L, const char *name, const struct stat *st)
{
	w->nreg = 0;
	const char *first = st->st_nlink > 1 ? bk_link_find(&w->links, st->st_dev, st->st_ino) : NULL;
	char target[PATH_MAX + 1];
	if (first == NULL && S_ISLNK(st->st_mode)) {
		ssize_t n = readlinkat(L->fd, name, target, sizeof(target));
		if (n < 0) {
			if (errno == ENOENT || errno == EINVAL)
				return 0; /* gone or replaced */
			return unreadable(w, errno, "readlink");
		}
		if ((size_t)n >= sizeof(target))
			return fail(w, ENAMETOOLONG, "symlink target too long");
		target[n] = '\0';
	}
	if (put_header(w, st, -1, L->fd, name, first == NULL && S_ISLNK(st->st_mode) ? target : NULL, first) < 0)
		return -1;
	if (st->st_nlink > 1) {
		if (first != NULL)
			bk_link_met(&w->links, st->st_dev, st->st_ino);
		else if (link_add(w, st) < 0)
			return -1;
	}
	return 0;
}

/* ---- the walk ---- */

static void level_release(struct level *l)
{
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	free(l->buf);
	l->buf = NULL;
	l->len = l->pos = 0;
}

static int push_level(struct walk *w, int fd, const struct stat *st, size_t name_len, bool holds_to)
{
	if (w->nlv == w->cap_lv) {
		size_t ncap = w->cap_lv ? w->cap_lv * 2 : 64;
		struct level *nl = realloc(w->lv, ncap * sizeof(*nl));
		if (nl == NULL) {
			close(fd);
			return fail(w, ENOMEM, "out of memory");
		}
		w->lv = nl;
		w->cap_lv = ncap;
	}
	struct level *l = &w->lv[w->nlv];
	*l = (struct level){.fd = fd, .dev = st->st_dev, .ino = st->st_ino, .name_len = name_len, .holds_to = holds_to};
	l->buf = malloc(WALK_DENTS);
	if (l->buf == NULL) {
		close(fd);
		return fail(w, ENOMEM, "out of memory");
	}
	w->nlv++;
	/* a deep tree keeps only the deepest levels open; the others are opened again
	 * on the way back up (fs_dir_reopen_parent checks they are the same) */
	if (w->nlv > WALK_OPEN)
		level_release(&w->lv[w->nlv - 1 - WALK_OPEN]);
	return 0;
}

static int pop_level(struct walk *w)
{
	struct level *l = &w->lv[w->nlv - 1];
	if (w->nlv >= 2) {
		struct level *up = &w->lv[w->nlv - 2];
		if (up->fd < 0) {
			up->fd = fs_dir_reopen_parent(l->fd, up->dev, up->ino);
			if (up->fd < 0 || lseek(up->fd, up->next, SEEK_SET) < 0) {
				w->name[up->name_len - 1] = '\0';
				return fail(w, errno, "open the directory again (was it moved?)");
			}
			up->buf = malloc(WALK_DENTS);
			if (up->buf == NULL)
				return fail(w, ENOMEM, "out of memory");
		}
	}
	level_release(l);
	w->nlv--;
	return 0;
}

/* The next entry of level l: 1, 0 at its end, -1 with errno. */
static int level_next(struct walk *w, struct level *l, const char **name, unsigned char *type)
{
	for (;;) {
		if (l->pos >= l->len) {
			long n = syscall(SYS_getdents64, l->fd, l->buf, WALK_DENTS);
			if (n < 0) {
				if (errno == EINTR && !cancelled(w))
					continue;
				return -1;
			}
			if (n == 0)
				return 0;
			l->len = (size_t)n;
			l->pos = 0;
		}
		const struct dirent64_raw *d = (const void *)(l->buf + l->pos);
		l->pos += d->d_reclen;
		l->next = d->d_off;
		if (d->d_name[0] == '.' && (d->d_name[1] == '\0' || (d->d_name[1] == '.' && d->d_name[2] == '\0')))
			continue;
		*name = d->d_name;
		*type = d->d_type;
		return 1;
	}
}

/* A directory; fd: the directory already open (open_first), or -1. */
static int entry_dir(struct walk *w, struct level *L, const char *name, const struct stat *st, size_t name_end, int fd)
{
	bool other_fs = st->st_dev != w->root_dev;
	if (other_fs && w->b->one_file_system) {
		/* the mount point itself is kept (as an empty directory), not what is on it */
		int r = put_header(w, st, fd, L->fd, name, NULL, NULL);
		if (fd >= 0)
			close(fd);
		return r;
	}
	if (fd < 0)
		fd = open_noatime(w, L->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, st);
	if (fd < 0) {
		if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)
			return 0; /* gone or replaced since the fstatat */
		return unreadable(w, errno, "open directory");
	}
	if (put_header(w, st, fd, -1, NULL, NULL, NULL) < 0) {
		close(fd);
		return -1;
	}
	/* a directory already on the path (a bind mount of an ancestor): kept, not
	 * entered, or the walk would never end */
	for (size_t i = 0; i < w->nlv; i++) {
		if (w->lv[i].dev == st->st_dev && w->lv[i].ino == st->st_ino) {
			close(fd);
			return 0;
		}
	}
	w->name[name_end] = '/';
	w->name[name_end + 1] = '\0';
	bool holds_to = w->to_dfd >= 0 && st->st_dev == w->to_dev && st->st_ino == w->to_ino;
	return push_level(w, fd, st, name_end + 1, holds_to);
}

/* A file or directory by its d_type: open it first and fstat the open fd, which
 * spares the name lookup of an fstatat (a tenth of the walk's time on /usr/share).
 * Only as root, who may use O_NOATIME on any file (a user would open every file it
 * does not own twice). 1 with *fd and *st when the open fd is the entry named in
 * type; 0 when it could not be opened or is something else by now: then the usual
 * fstatat path decides (an unreadable file fails or is skipped there, as always). */
static int open_first(struct walk *w, struct level *L, const char *name, unsigned char type, int *fd, struct stat *st)
{
	if (!w->noatime_any || (type != DT_REG && type != DT_DIR))
		return 0;
	int flags = type == DT_DIR ? O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC :
				     O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC;
	int f = openat(L->fd, name, flags | O_NOATIME);
	if (f < 0 && errno == EPERM) {
		/* root of a user namespace that does not map the owners: no O_NOATIME */
		w->noatime_any = false;
		return 0;
	}
	if (f < 0)
		return 0;
	if (fstat(f, st) < 0 || (st->st_mode & S_IFMT) != (type == DT_DIR ? S_IFDIR : S_IFREG)) {
		close(f);
		return 0;
	}
	*fd = f;
	return 1;
}

static int walk_entry(struct walk *w, struct level *L, const char *name, unsigned char type)
{
	size_t nlen = strlen(name);
	if (L->name_len + nlen > WALK_NAME_MAX)
		return fail(w, ENAMETOOLONG, "path too long");
	memcpy(w->name + L->name_len, name, nlen + 1);
	if (L->holds_to && (strcmp(name, w->to_name) == 0 || strcmp(name, w->to_tmp) == 0))
		return 0; /* the archive itself */
	struct stat st;
	int fd = -1;
	if (w->ex.n > 0 && (type == DT_REG || type == DT_DIR) && bk_excluded(&w->ex, w->name + 2, type == DT_DIR))
		return 0; /* (not opened only to be left out) */
	if (open_first(w, L, name, type, &fd, &st)) {
		if (type == DT_DIR)
			return entry_dir(w, L, name, &st, L->name_len + nlen, fd);
		return entry_file(w, L, name, &st, fd);
	}
	if (fstatat(L->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0; /* removed since getdents */
		return unreadable(w, errno, "lstat");
	}
	if (w->ex.n > 0 && bk_excluded(&w->ex, w->name + 2, S_ISDIR(st.st_mode)))
		return 0;
	switch (st.st_mode & S_IFMT) {
	case S_IFDIR:
		return entry_dir(w, L, name, &st, L->name_len + nlen, -1);
	case S_IFREG:
		return entry_file(w, L, name, &st, -1);
	case S_IFSOCK:
		return 0;
	default:
		return entry_other(w, L, name, &st);
	}
}

static int walk_tree(struct walk *w)
{
	while (w->nlv > 0) {
		if (cancelled(w))
			return fail(w, ECANCELED, "cancelled");
		struct level *L = &w->lv[w->nlv - 1];
		const char *name;
		unsigned char type;
		int r = level_next(w, L, &name, &type);
		if (r < 0) {
			w->name[L->name_len > 2 ? L->name_len - 1 : 1] = '\0';
			return fail(w, errno, "read directory");
		}
		if (r == 0) {
			if (pop_level(w) < 0)
				return -1;
			continue;
		}
		if (walk_entry(w, L, name, type) < 0)
			return -1;
	}
	return 0;
}

/* ---- output ---- */

/* to_path: buffered writes to the temp file, hashed on the way. */
static int to_write(struct walk *w, const void *data, size_t len)
{
	struct bk *b = w->b;
	struct bk_buf *x = &b->buf[0];
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
	struct walk *w = ud;
	struct bk *b = w->b;
	if (cancelled(w) || w->failing) {
		archive_set_error(a, ECANCELED, "cancelled");
		return -1;
	}
	int rc = b->has_to ? to_write(w, buf, len) : bk_output(b, buf, len);
	if (rc < 0) {
		archive_set_error(a, b->has_to ? w->b->j.err.code : ECANCELED, "%s",
				  b->has_to ? "cannot write the archive" : "cancelled");
		return -1;
	}
	b->archive_bytes += len;
	__atomic_store_n(&b->j.bytes, b->archive_bytes, __ATOMIC_RELAXED);
	return (la_ssize_t)len;
}

/* The temp file beside to_path, in the journal before it exists. */
static int to_open(struct walk *w)
{
	struct bk *b = w->b;
	struct shim_err *err = &b->j.err;
	w->to_dfd = fs_open_parent(&b->to, w->to_name, err);
	if (w->to_dfd < 0)
		goto fail;
	if (strcmp(w->to_name, ".") == 0 || b->to.abs[b->to.len - 1] == '/') {
		err_set(err, EISDIR, b->to.abs, "backup: to_path names a directory");
		goto fail;
	}
	struct stat st;
	if (fstatat(w->to_dfd, w->to_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
		err_set(err, EISDIR, b->to.abs, "backup: to_path is a directory");
		goto fail;
	}
	if (fstat(w->to_dfd, &st) < 0) {
		err_set(err, errno, b->to.abs, "backup: stat the directory of to_path");
		goto fail;
	}
	w->to_dev = st.st_dev;
	w->to_ino = st.st_ino;
	char proc[64], dir[PATH_MAX], path[PATH_MAX + NAME_MAX + 2];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", w->to_dfd);
	ssize_t n = readlink(proc, dir, sizeof(dir) - 1);
	if (n <= 0) {
		err_set(err, errno ? errno : EIO, b->to.abs, "backup: where is the directory of to_path");
		goto fail;
	}
	dir[n] = '\0';
	for (int tries = 0;; tries++) {
		journal_temp_name(w->to_name, w->to_tmp, sizeof(w->to_tmp));
		snprintf(path, sizeof(path), "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", w->to_tmp);
		w->jent = journal_add(path, err);
		if (w->jent == NULL)
			goto fail;
		w->to_fd = openat(w->to_dfd, w->to_tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC,
				  0600);
		if (w->to_fd >= 0)
			break;
		int e = errno;
		journal_remove(w->jent);
		w->jent = NULL;
		if (e != EEXIST || tries >= 10) {
			err_set(err, e, b->to.abs, "backup: create the temp file");
			goto fail;
		}
	}
	w->tmp_made = true;
	return 0;
fail:
	w->err_set = true;
	return -1;
}

/* Make the archive durable and put it in place. */
static int to_commit(struct walk *w)
{
	struct bk *b = w->b;
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

static void to_cleanup(struct walk *w)
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

static void make_id(char out[37])
{
	uint8_t r[16];
	if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		uint64_t x = mono_ns() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)time(NULL);
		for (size_t i = 0; i < sizeof(r); i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			r[i] = (uint8_t)x;
		}
	}
	r[6] = (uint8_t)((r[6] & 0x0f) | 0x40); /* version 4 */
	r[8] = (uint8_t)((r[8] & 0x3f) | 0x80); /* variant 10 */
	snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
		 r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]);
}

static int archive_setup(struct walk *w)
{
	struct bk *b = w->b;
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
		 * 12 MB uncompressed): two, not one per CPU. */
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
	 * padded to tar's 10 KiB records at the end (bk_run), a compressed one is not
	 * (zstd and gzip readers take nothing after the end of their stream). */
	if (r == ARCHIVE_OK)
		r = archive_write_set_bytes_per_block(a, 0);
	if (r == ARCHIVE_OK)
		r = archive_write_open2(a, w, NULL, write_cb, NULL, NULL);
	if (r != ARCHIVE_OK)
		return fail_archive(w, "set up the archive");
	return 0;
}

static void walk_free(struct walk *w)
{
	/* the temp file first: freeing a zstd writer waits for its threads to finish
	 * the job in hand, which at a high level takes seconds */
	to_cleanup(w);
	while (w->nlv > 0)
		level_release(&w->lv[--w->nlv]);
	free(w->lv);
	if (w->a != NULL)
		archive_write_free(w->a);
	if (w->e != NULL)
		archive_entry_free(w->e);
	free(w->rbuf);
	free(w->xlist);
	free(w->xval);
	free(w->reg);
	bk_excludes_free(&w->ex);
	bk_links_free(&w->links);
	bk_names_free(&w->users);
	bk_names_free(&w->groups);
}

int bk_run(struct bk *b)
{
	struct walk w = {.b = b, .to_dfd = -1, .to_fd = -1, .euid = geteuid()};
	w.noatime_any = w.euid == 0;
	make_id(b->id);
	struct tm tm;
	time_t now = time(NULL);
	gmtime_r(&now, &tm);
	strftime(b->created_at, sizeof(b->created_at), "%Y-%m-%dT%H:%M:%SZ", &tm);
	/* names in UTF-8 go into the archive as they are; others as raw bytes */
	locale_t loc = bk_utf8_locale();
	locale_t old = loc != (locale_t)0 ? uselocale(loc) : (locale_t)0;
	int rc = -1;
	strcpy(w.name, ".");
	w.rbuf = malloc(WALK_READ);
	w.xlist = malloc(XATTR_LIST_MAX);
	w.xval = malloc(XATTR_SIZE_MAX);
	if (w.rbuf == NULL || w.xlist == NULL || w.xval == NULL) {
		fail(&w, ENOMEM, "out of memory");
		goto out;
	}
	w.users.file = "/etc/passwd";
	w.groups.file = "/etc/group";
	if (bk_excludes_init(&w.ex, b->excludes, b->n_excludes) < 0) {
		fail(&w, ENOMEM, "out of memory");
		goto out;
	}
	int fd = fs_open(&b->dir, O_RDONLY | O_DIRECTORY, 0, &b->j.err);
	if (fd < 0) {
		w.err_set = true;
		goto out;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		fail(&w, errno, "stat");
		close(fd);
		goto out;
	}
	w.root_dev = st.st_dev;
	if (push_level(&w, fd, &st, 2, false) < 0)
		goto out;
	if (b->has_to && to_open(&w) < 0)
		goto out;
	w.lv[0].holds_to = w.to_dfd >= 0 && st.st_dev == w.to_dev && st.st_ino == w.to_ino;
	if (archive_setup(&w) < 0)
		goto out;
	/* DIR itself first, as "./" */
	if (put_header(&w, &st, w.lv[0].fd, -1, NULL, NULL, NULL) < 0)
		goto out;
	strcpy(w.name, "./");
	if (walk_tree(&w) < 0)
		goto out;
	strcpy(w.name, ".");
	w.closed = true;
	if (archive_write_close(w.a) != ARCHIVE_OK) {
		fail_archive(&w, "finish the archive");
		goto out;
	}
	if (b->compression == 0 && b->archive_bytes % TAR_RECORD != 0 &&
	    write_cb(w.a, &w, zeros, TAR_RECORD - b->archive_bytes % TAR_RECORD) < 0) {
		fail(&w, ECANCELED, "cancelled");
		goto out;
	}
	if (b->has_to) {
		if (to_commit(&w) < 0)
			goto out;
		bk_sha_hex(&b->sha, b->sha_hex);
	} else if (bk_output_flush(b) < 0) {
		fail(&w, ECANCELED, "cancelled");
		goto out;
	}
	rc = 0;
out:
	if (rc < 0 && w.a != NULL && !w.closed) {
		/* Not archive_write_fail(): libarchive 3.6 frees its output state only
		 * in close (fixed in later versions). Closing writes nothing: the
		 * callback refuses every byte from now on. */
		w.failing = true;
		archive_write_close(w.a);
	}
	walk_free(&w);
	if (loc != (locale_t)0)
		uselocale(old);
	return rc;
}
