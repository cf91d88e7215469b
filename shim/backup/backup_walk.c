/* backup_walk.c: a backup's walker thread: our own walk of the tree with directory fds, each entry handed to the
 * writer (backup_write.c) as a record of the queue (backup_queue.h). */
#include "backup.h"
#include "backup_meta.h"
#include "backup_queue.h"
#include "fs_walk.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
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
 * Two threads share the work: this walker makes the syscalls of the walk; the
 * writer (the job's worker) formats each record with libarchive and reads file
 * data from the fd the record brings, straight into the output. On a real tree
 * most of the time goes to the syscalls of small files, during which one thread
 * alone would leave the other CPU idle. Who reads a small file (up to BQ_INLINE)
 * depends on who is behind: while the writer has a backlog (BQ_BACKLOG records
 * waiting) the walker reads it whole into its record, otherwise the writer gets
 * the fd. Records go in walk order, so the archive is what a single thread would
 * write; hard links are decided here (the first link met is the one with data).
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

#define WALK_NAME_MAX 16384 /* longest member name */
#define LIST_BUDGET (256u << 10)
#define MAX_REGIONS 65536 /* data regions of a sparse file; more are stored as data */

/* A level's data on the walker (fs_walk.h). */
struct bk_level {
	size_t name_len; /* bytes of walk.name that prefix this level's entries ("./a/") */
	bool holds_to;   /* to_path's directory */
};

/* The deepest level, as the entry functions see it. */
struct level {
	int fd;
	size_t name_len;
	bool holds_to;
};

struct backup_walk {
	struct backup *b;
	struct backup_queue *q;
	struct shim_err err;
	bool err_set; /* err holds the first error: keep it */
	dev_t root_dev;
	struct stat root_st;
	uid_t euid;
	bool noatime_any;                        /* root: O_NOATIME on any file (open_first) */
	struct fs_walk walk;                     /* levels of struct bk_level */
	char name[WALK_NAME_MAX + NAME_MAX + 2]; /* the member name of the entry in hand */
	char *xlist, *xval;
	uint8_t *xbuf; /* the entry's xattrs, as the record carries them */
	size_t xlen, xcap;
	struct backup_queue_region *reg;
	size_t nreg, cap_reg;
	struct backup_meta_links links;
	struct backup_meta_excludes ex;
	/* to_path: its directory and the names there that are left out */
	bool has_to;
	dev_t to_dev;
	ino_t to_ino;
	char to_name[NAME_MAX + 1], to_tmp[NAME_MAX + 1];
};

/* ---- errors and lists (shared with the writer) ---- */

size_t backup_walk_client_path(const struct backup *b, const char *member, char *buf, size_t size)
{
	const char *rel = member[0] == '.' && member[1] == '/' ? member + 2 : "";
	int n = snprintf(buf, size, "%.*s%s%s", (int)b->dir_len, b->dir.abs, *rel || b->dir_len == 0 ? "/" : "", rel);
	if (n < 0)
		return 0;
	return (size_t)n < size ? (size_t)n : size - 1;
}

int backup_walk_list_add(struct backup_list *l, const char *path, size_t len)
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

static int fail(struct backup_walk *w, int code, const char *what)
{
	if (w->err_set)
		return -1;
	char p[PATH_MAX + 64];
	size_t n = backup_walk_client_path(w->b, w->name, p, sizeof(p));
	w->err_set = true;
	return err_setn(&w->err, code, p, n, "backup: %s", what);
}

/* A file or directory we may not read: fail, or leave it out and list it in the
 * record's skipped (the walker's alone). */
static int unreadable(struct backup_walk *w, int code, const char *what)
{
	if ((code == EACCES || code == EPERM) && w->b->skip_unreadable) {
		char p[PATH_MAX + WALK_NAME_MAX + 2];
		size_t n = backup_walk_client_path(w->b, w->name, p, sizeof(p));
		if (backup_walk_list_add(&w->b->skipped, p, n) < 0)
			return fail(w, ENOMEM, "out of memory");
		return 0;
	}
	return fail(w, code, what);
}

/* Cancelled, or the writer stopped (it failed). */
static bool cancelled(struct backup_walk *w)
{
	return op_backup_job_cancelled(&w->b->j) || __atomic_load_n(&w->q->stop, __ATOMIC_ACQUIRE);
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

static ssize_t list_xattrs(struct backup_walk *w, int fd, int dfd, const char *name, size_t size)
{
	return fd >= 0 ? flistxattr(fd, w->xlist, size) : backup_meta_xattr_list_at(dfd, name, w->xlist, size);
}

static ssize_t get_xattr(struct backup_walk *w, int fd, int dfd, const char *name, const char *key)
{
	ssize_t v = fd >= 0 ? fgetxattr(fd, key, w->xval, XATTR_SMALL) :
			      backup_meta_xattr_get_at(dfd, name, key, w->xval, XATTR_SMALL);
	if (v < 0 && errno == ERANGE)
		v = fd >= 0 ? fgetxattr(fd, key, w->xval, XATTR_SIZE_MAX) :
			      backup_meta_xattr_get_at(dfd, name, key, w->xval, XATTR_SIZE_MAX);
	return v;
}

static int xbuf_add(struct backup_walk *w, const char *key, size_t klen, const void *val, size_t vlen)
{
	size_t need = w->xlen + backup_queue_xattr_size(klen, vlen);
	if (need > w->xcap) {
		size_t ncap = w->xcap ? w->xcap : 4096;
		while (ncap < need)
			ncap *= 2;
		uint8_t *nb = realloc(w->xbuf, ncap);
		if (nb == NULL)
			return fail(w, ENOMEM, "out of memory");
		w->xbuf = nb;
		w->xcap = ncap;
	}
	backup_queue_xattr_put(w->xbuf + w->xlen, key, klen, val, vlen);
	w->xlen = need;
	return 0;
}

/* The entry's xattrs into w->xbuf: through fd when it has one, else dfd/name. */
static int get_xattrs(struct backup_walk *w, int fd, int dfd, const char *name)
{
	w->xlen = 0;
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
		if (xbuf_add(w, key, klen, w->xval, (size_t)v) < 0)
			return -1;
	}
	return 0;
}

/* ---- records ---- */

/* A record for the entry w->name with stat st: link (a symlink's target or the first
 * name of a hard link, per flags), the xattrs gathered in w->xbuf (none for a hard
 * link), w->reg's regions, and room for data_len bytes of data. NULL once failed. */
static struct backup_queue_rec *rec_new(struct backup_walk *w, const struct stat *st, uint32_t flags, const char *link,
					size_t data_len)
{
	size_t name_len = strlen(w->name), link_len = link != NULL ? strlen(link) : 0;
	size_t xlen = flags & BQF_HARDLINK ? 0 : w->xlen;
	size_t payload = backup_queue_payload_size(name_len, link_len, xlen, w->nreg, data_len);
	struct backup_queue_rec *r = backup_queue_reserve(w->q, payload, flags & BQF_FD);
	if (r == NULL) {
		fail(w, errno, errno == ENOMEM ? "out of memory" : "cancelled");
		return NULL;
	}
	r->flags = flags;
	r->st = *st;
	r->name_len = (uint32_t)name_len;
	r->link_len = (uint32_t)link_len;
	r->xattr_bytes = (uint32_t)xlen;
	r->nreg = (uint32_t)w->nreg;
	r->data_len = data_len;
	memcpy(r->payload, w->name, name_len + 1);
	uint8_t *l = r->payload + name_len + 1;
	if (link_len > 0)
		memcpy(l, link, link_len);
	l[link_len] = '\0';
	if (xlen > 0)
		memcpy(backup_queue_xattrs(r), w->xbuf, xlen);
	if (w->nreg > 0)
		memcpy(backup_queue_regions(r), w->reg, w->nreg * sizeof(*w->reg));
	return r;
}

/* A header-only record (directory, symlink, node, empty file, hard link). */
static int put_header(struct backup_walk *w, const struct stat *st, int fd, int dfd, const char *name,
		      const char *symlink, const char *hardlink)
{
	w->nreg = 0;
	w->xlen = 0;
	if (hardlink == NULL && get_xattrs(w, fd, dfd, name) < 0)
		return -1;
	uint32_t flags = hardlink != NULL ? BQF_HARDLINK : symlink != NULL ? BQF_SYMLINK : 0;
	struct backup_queue_rec *r = rec_new(w, st, flags, hardlink != NULL ? hardlink : symlink, 0);
	if (r == NULL)
		return -1;
	backup_queue_commit(w->q, r);
	return 0;
}

/* ---- regular files ---- */

/* A backup leaves atimes alone (and spares the filesystem the inode writes): with
 * O_NOATIME where we may use it, i.e. as the owner or with CAP_FOWNER; EPERM (a
 * user namespace that does not map the owner) just costs one more open. */
static int open_noatime(struct backup_walk *w, int dfd, const char *name, int flags, const struct stat *st)
{
	if (w->euid == 0 || st->st_uid == w->euid) {
		int fd = openat(dfd, name, flags | O_NOATIME);
		if (fd >= 0 || errno != EPERM)
			return fd;
	}
	return openat(dfd, name, flags);
}

static int add_region(struct backup_walk *w, off_t off, off_t len)
{
	if (w->nreg == w->cap_reg) {
		size_t ncap = w->cap_reg ? w->cap_reg * 2 : 16;
		struct backup_queue_region *nr = realloc(w->reg, ncap * sizeof(*nr));
		if (nr == NULL)
			return fail(w, ENOMEM, "out of memory");
		w->reg = nr;
		w->cap_reg = ncap;
	}
	w->reg[w->nreg++] = (struct backup_queue_region){off, len};
	return 0;
}

/* A file with fewer blocks than its size: find its data regions. Leaves w->nreg 0
 * when the file turns out not to be sparse (one region covering it all: inline
 * data, compression) or the filesystem cannot tell. */
static int probe_holes(struct backup_walk *w, int fd, off_t size)
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

int backup_walk_file_changed(int fd, const struct stat *st, bool *changed)
{
	struct stat after;
	if (fstat(fd, &after) < 0)
		return -1;
	if (after.st_size != st->st_size || after.st_mtim.tv_sec != st->st_mtim.tv_sec ||
	    after.st_mtim.tv_nsec != st->st_mtim.tv_nsec || after.st_ino != st->st_ino || after.st_dev != st->st_dev)
		*changed = true;
	return 0;
}

/* The whole of a small file into data: *got bytes (fewer if it shrank: the writer pads
 * with zeros), *changed if it changed while read. -1 with the walk failed. */
static int inline_read(struct backup_walk *w, int fd, const struct stat *st, uint8_t *data, size_t *got, bool *changed)
{
	size_t want = (size_t)st->st_size;
	*got = 0;
	while (*got < want) {
		ssize_t n = pread(fd, data + *got, want - *got, (off_t)*got);
		if (n < 0) {
			if (errno == EINTR && !cancelled(w))
				continue;
			return fail(w, errno, "read");
		}
		if (n == 0)
			break;
		*got += (size_t)n;
	}
	*changed = *got < want;
	if (backup_walk_file_changed(fd, st, changed) < 0)
		return fail(w, errno, "stat");
	return 0;
}

/* A small file (fd ours to close): read it whole into its record. */
static int file_inline(struct backup_walk *w, const struct stat *st, int fd_in)
{
	int cleanup_close fd = fd_in;
	struct backup_queue_rec *r = rec_new(w, st, 0, NULL, (size_t)st->st_size);
	if (r == NULL)
		return -1;
	size_t got = 0;
	bool changed = false;
	if (inline_read(w, fd, st, backup_queue_data(r), &got, &changed) < 0) {
		backup_queue_abandon(w->q, r);
		return -1;
	}
	r->data_len = got;
	if (changed)
		r->flags |= BQF_CHANGED;
	backup_queue_commit(w->q, r);
	return 0;
}

static int link_add(struct backup_walk *w, const struct stat *st)
{
	if (backup_meta_link_add(&w->links, st->st_dev, st->st_ino, st->st_nlink, w->name) < 0)
		return fail(w, ENOMEM, "out of memory");
	return 0;
}

/* A regular file; fd: the file already open (open_first), or -1. */
static int entry_file(struct backup_walk *w, struct level *L, const char *name, const struct stat *st, int fd)
{
	w->nreg = 0;
	if (st->st_nlink > 1) {
		const char *first = backup_meta_link_find(&w->links, st->st_dev, st->st_ino);
		if (first != NULL) {
			if (fd >= 0)
				close(fd);
			if (put_header(w, st, -1, L->fd, name, NULL, first) < 0)
				return -1;
			backup_meta_link_met(&w->links, st->st_dev, st->st_ino);
			return 0;
		}
	}
	if (st->st_size == 0) {
		/* no reads, so no check that it changed (and never unreadable) */
		int r = put_header(w, st, fd, L->fd, name, NULL, NULL);
		if (fd >= 0)
			close(fd);
		if (r < 0)
			return -1;
	} else {
		if (fd < 0) {
			fd = open_noatime(w, L->fd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC,
					  st);
			if (fd < 0) {
				if (errno == ENOENT || errno == ELOOP)
					return 0; /* gone or replaced since the fstatat */
				return unreadable(w, errno, "open");
			}
		}
		w->xlen = 0;
		if (((uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size && probe_holes(w, fd, st->st_size) < 0) ||
		    get_xattrs(w, fd, -1, NULL) < 0) {
			close(fd);
			return -1;
		}
		if (w->nreg == 0 && st->st_size <= (off_t)BQ_INLINE &&
		    __atomic_load_n(&w->q->nrec, __ATOMIC_RELAXED) >= BQ_BACKLOG) {
			if (file_inline(w, st, fd) < 0)
				return -1;
		} else {
			struct backup_queue_rec *r = rec_new(w, st, BQF_FD, NULL, 0);
			if (r == NULL) {
				close(fd);
				return -1;
			}
			r->fd = fd; /* the writer reads it and closes it */
			backup_queue_commit(w->q, r);
		}
	}
	if (st->st_nlink > 1 && link_add(w, st) < 0)
		return -1;
	return 0;
}

/* Symlinks, FIFOs, device nodes: a header only. */
static int entry_other(struct backup_walk *w, struct level *L, const char *name, const struct stat *st)
{
	const char *first = st->st_nlink > 1 ? backup_meta_link_find(&w->links, st->st_dev, st->st_ino) : NULL;
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
			backup_meta_link_met(&w->links, st->st_dev, st->st_ino);
		else if (link_add(w, st) < 0)
			return -1;
	}
	return 0;
}

/* ---- the walk ---- */

/* Make fd (the directory st, its entries named w->name[0, name_len)) the deepest level. */
static int push_level(struct backup_walk *w, int fd, const struct stat *st, size_t name_len, bool holds_to)
{
	if (fs_walk_push(&w->walk, fd, st, -1) < 0)
		return fail(w, errno, w->walk.fail == FS_WALK_FAIL_MEMORY ? "out of memory" : "stat");
	*(struct bk_level *)fs_walk_data(&w->walk, w->walk.n - 1) =
		(struct bk_level){.name_len = name_len, .holds_to = holds_to};
	return 0;
}

/* A directory; fd: the directory already open (open_first), or -1. */
static int entry_dir(struct backup_walk *w, struct level *L, const char *name, const struct stat *st, size_t name_end,
		     int fd)
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
	if (fs_walk_on_path(&w->walk, st->st_dev, st->st_ino)) {
		close(fd);
		return 0;
	}
	w->name[name_end] = '/';
	w->name[name_end + 1] = '\0';
	bool holds_to = w->has_to && st->st_dev == w->to_dev && st->st_ino == w->to_ino;
	return push_level(w, fd, st, name_end + 1, holds_to);
}

/* A file or directory by its d_type: open it first and fstat the open fd, which
 * spares the name lookup of an fstatat (a tenth of the walk's time on /usr/share).
 * Only as root, who may use O_NOATIME on any file (a user would open every file it
 * does not own twice). 1 with *fd and *st when the open fd is the entry named in
 * type; 0 when it could not be opened or is something else by now: then the usual
 * fstatat path decides (an unreadable file fails or is skipped there, as always). */
static int open_first(struct backup_walk *w, struct level *L, const char *name, unsigned char type, int *fd,
		      struct stat *st)
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

static int walk_entry(struct backup_walk *w, struct level *L, const char *name, unsigned char type)
{
	size_t nlen = strlen(name);
	if (L->name_len + nlen > WALK_NAME_MAX)
		return fail(w, ENAMETOOLONG, "path too long");
	memcpy(w->name + L->name_len, name, nlen + 1);
	if (L->holds_to && (strcmp(name, w->to_name) == 0 || strcmp(name, w->to_tmp) == 0))
		return 0; /* the archive itself */
	struct stat st;
	int fd = -1;
	if (w->ex.n > 0 && (type == DT_REG || type == DT_DIR) &&
	    backup_meta_excluded(&w->ex, w->name + 2, type == DT_DIR))
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
	if (w->ex.n > 0 && backup_meta_excluded(&w->ex, w->name + 2, S_ISDIR(st.st_mode)))
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

static int walk_tree(struct backup_walk *w)
{
	for (;;) {
		if (cancelled(w))
			return fail(w, ECANCELED, "cancelled");
		int r = fs_walk_next(&w->walk);
		if (r == FS_WALK_END)
			return 0;
		const struct bk_level *d = fs_walk_data(&w->walk, w->walk.n - 1);
		if (r < 0 && w->walk.fail == FS_WALK_FAIL_REOPEN) {
			/* the level above, opened again as "..": moved meanwhile? */
			d = fs_walk_data(&w->walk, w->walk.n - 2);
			w->name[d->name_len - 1] = '\0';
			return fail(w, errno, "open the directory again (was it moved?)");
		}
		if (r < 0) {
			w->name[d->name_len > 2 ? d->name_len - 1 : 1] = '\0';
			return fail(w, errno, "read directory");
		}
		if (r == FS_WALK_POST) {
			fs_walk_pop(&w->walk);
			continue;
		}
		struct level L = {.fd = fs_walk_top(&w->walk)->d.fd, .name_len = d->name_len, .holds_to = d->holds_to};
		if (walk_entry(w, &L, w->walk.name, w->walk.type) < 0)
			return -1;
	}
}

/* ---- the thread ---- */

static void *walk_main(void *arg)
{
	struct backup_walk *w = arg;
	pthread_setname_np(pthread_self(), "backup-walk"); /* top -H, perf */
	/* the walk's syscalls as the request's identity (the job's worker entered it:
	 * it took there, so it takes here) */
	int rc = fs_ctx_enter(&w->b->j.job.op->fsx, &w->err);
	if (rc < 0)
		w->err_set = true;
	/* DIR itself first, as "./" */
	strcpy(w->name, ".");
	if (rc == 0)
		rc = put_header(w, &w->root_st, w->walk.lv[0].d.fd, -1, NULL, NULL, NULL);
	if (rc == 0) {
		strcpy(w->name, "./");
		rc = walk_tree(w);
	}
	if (rc < 0 && !w->err_set)
		fail(w, ECANCELED, "cancelled");
	backup_queue_finish(w->q, rc, &w->err);
	/* the last thing it does: the writer may free w once it sees this */
	backup_queue_helper_exit(w->q);
	return NULL;
}

static void backup_walk_freep(struct backup_walk **w)
{
	backup_walk_free(*w);
}

struct backup_walk *backup_walk_new(struct backup *b, struct shim_err *err)
{
	struct backup_walk *w __attribute__((cleanup(backup_walk_freep))) = calloc(1, sizeof(*w));
	if (w == NULL) {
		err_set(err, ENOMEM, b->dir.abs, "backup: out of memory");
		return NULL;
	}
	w->b = b;
	w->euid = fs_ctx_uid(); /* the operation's (on the job's worker, which entered it) */
	w->noatime_any = w->euid == 0;
	strcpy(w->name, ".");
	w->xlist = malloc(XATTR_LIST_MAX);
	w->xval = malloc(XATTR_SIZE_MAX);
	if (w->xlist == NULL || w->xval == NULL || backup_meta_excludes_init(&w->ex, b->excludes, b->n_excludes) < 0 ||
	    fs_walk_init(&w->walk, FS_WALK_LEVEL_BUFS, sizeof(struct bk_level)) < 0) {
		err_set(err, ENOMEM, b->dir.abs, "backup: out of memory");
		return NULL;
	}
	int fd = fs_open(&b->dir, O_RDONLY | O_DIRECTORY, 0, err);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &w->root_st) < 0) {
		err_set(err, errno, b->dir.abs, "backup: stat");
		close(fd);
		return NULL;
	}
	w->root_dev = w->root_st.st_dev;
	if (push_level(w, fd, &w->root_st, 2, false) < 0) {
		*err = w->err;
		return NULL;
	}
	return steal_ptr(w);
}

void backup_walk_skip(struct backup_walk *w, dev_t dev, ino_t ino, const char *name, const char *tmp)
{
	w->has_to = true;
	w->to_dev = dev;
	w->to_ino = ino;
	snprintf(w->to_name, sizeof(w->to_name), "%s", name);
	snprintf(w->to_tmp, sizeof(w->to_tmp), "%s", tmp);
	((struct bk_level *)fs_walk_data(&w->walk, 0))->holds_to = w->root_st.st_dev == dev && w->root_st.st_ino == ino;
}

int backup_walk_start(struct backup_walk *w, struct backup_queue *q, struct shim_err *err)
{
	w->q = q;
	int rc = backup_queue_spawn(q, walk_main, w);
	if (rc != 0)
		return err_set(err, rc, w->b->dir.abs, "backup: cannot start the walker thread");
	return 0;
}

void backup_walk_stop(struct backup_walk *w)
{
	if (w == NULL || w->q == NULL)
		return;
	backup_queue_stop(w->q);
	backup_queue_join(w->q);
}

void backup_walk_free(struct backup_walk *w)
{
	if (w == NULL)
		return;
	backup_walk_stop(w);
	fs_walk_free(&w->walk);
	free(w->xlist);
	free(w->xval);
	free(w->xbuf);
	free(w->reg);
	backup_meta_excludes_free(&w->ex);
	backup_meta_links_free(&w->links);
	free(w);
}
