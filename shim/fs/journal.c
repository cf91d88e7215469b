/* journal.c: STATE/pending-writes: one locked entry per unfinished atomic write, swept at start and exit. */
#include "journal.h"
#include "fs.h"
#include "fsctx.h"
#include "log.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TEMP_TAG ".sbx-"
#define TEMP_RAND 6
/* "." + NAME + ".sbx-" + 6 random characters */
#define TEMP_EXTRA (1 + sizeof(TEMP_TAG) - 1 + TEMP_RAND)

/* An entry is a small file named by 16 random hex digits whose first line is
 * "PATH\n". Its daemon holds flock(LOCK_EX) on it for as long as the entry is open: a
 * sweep (ours at start, or another daemon's sharing the state dir) removes only
 * entries it can lock, i.e. whose daemon is gone, since the kernel drops the lock with
 * the process however it dies.
 *
 * A finished entry is not unlinked but kept, open and still locked, as a spare (up to
 * SPARE_MAX of them): its first line is made empty ("\n", one pwrite), which names
 * nothing, and the next write takes it back by writing its own path over it (one
 * pwrite; what is left of a longer old path after the newline is not read). An inode
 * created and deleted per write is what made small writes slow (ext4 without a
 * journal does not reuse a recently deleted inode, and scans past every one of them
 * at each create, in the state dir and in the directories beside it); reopening,
 * relocking and renaming a spare in and out of another directory cost another seven
 * syscalls, ~30 us, per write. A dead daemon's spares are unlocked: a sweep removes
 * them with its other entries.
 *
 * Daemons before this one kept their spares, closed, in STATE/pending-writes.idle:
 * a sweep removes the ones nobody holds, and the directory once it is empty. */
struct journal_entry {
	struct journal_entry *prev, *next;
	int fd;
	size_t fsize; /* the entry file's size: the longest line it has held */
	char name[20];
	char path[]; /* the temp file */
};

/* Write line (ending in its newline) at the start of e's file, NUL bytes after it up
 * to the file's size: a spare's old, longer path leaves no piece of itself to be read
 * (the file's size does not change, which would cost a truncate). 0, or -1. */
static int entry_write(struct journal_entry *e, const char *line, size_t len)
{
	static const char nuls[PATH_MAX + 2];
	size_t pad = e->fsize > len ? e->fsize - len : 0;
	if (pad > sizeof(nuls))
		pad = sizeof(nuls); /* (cannot be: no line is longer than PATH_MAX + 1) */
	struct iovec iov[2] = {{(void *)line, len}, {(void *)nuls, pad}};
	ssize_t n = pwritev(e->fd, iov, pad > 0 ? 2 : 1, 0);
	if (n != (ssize_t)(len + pad)) {
		if (n >= 0)
			errno = ENOSPC; /* (a short write of a regular file: the disk is full) */
		return -1;
	}
	if (len > e->fsize)
		e->fsize = len;
	return 0;
}

#define SPARE_MAX 4
#define OLD_IDLE_SUFFIX ".idle"

static struct {
	pthread_mutex_t mu;
	/* Held while an entry is added or removed (its file and the lists together), and
	 * taken for good by journal_atexit(): exit() in the middle of a worker's removal
	 * would otherwise find the entry in no list while its file is still in the journal. */
	pthread_mutex_t change_mu;
	char dir[PATH_MAX];
	int dfd; /* -1 until the first write creates the directory */
	struct journal_entry *live;
	pid_t pid;                   /* the daemon's: a forked child that calls exit() must not sweep */
	char old_idle_dir[PATH_MAX]; /* STATE/pending-writes.idle, of older daemons; "" if too long */
	/* entries kept for reuse (journal_remove): in the journal, open, locked, naming nothing */
	struct journal_entry *spare; /* through next */
	unsigned n_spare;
} jr = {.mu = PTHREAD_MUTEX_INITIALIZER, .change_mu = PTHREAD_MUTEX_INITIALIZER, .dfd = -1};

static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

static void random_bytes(uint8_t *buf, size_t n)
{
	if (getrandom(buf, n, GRND_NONBLOCK) == (ssize_t)n)
		return;
	/* no entropy yet (early boot): names need only be unlikely to collide, and
	 * O_EXCL catches the rest */
	static uint64_t ctr;
	uint64_t x = mono_ns() ^ ((uint64_t)getpid() << 32) ^ __atomic_add_fetch(&ctr, 0x9e3779b97f4a7c15ull, 0);
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (uint8_t)x;
	}
}

void journal_temp_name(const char *name, char *buf, size_t size)
{
	size_t n = strlen(name);
	if (n > NAME_MAX - TEMP_EXTRA)
		n = NAME_MAX - TEMP_EXTRA;
	uint8_t r[TEMP_RAND];
	random_bytes(r, sizeof(r));
	char rs[TEMP_RAND + 1];
	for (size_t i = 0; i < TEMP_RAND; i++)
		rs[i] = alnum[r[i] % (sizeof(alnum) - 1)];
	rs[TEMP_RAND] = '\0';
	snprintf(buf, size, ".%.*s%s%s", (int)n, name, TEMP_TAG, rs);
}

bool journal_is_temp_name(const char *name)
{
	size_t len = strlen(name);
	if (len < TEMP_EXTRA + 1 || name[0] != '.')
		return false;
	const char *tag = name + len - TEMP_RAND - (sizeof(TEMP_TAG) - 1);
	if (memcmp(tag, TEMP_TAG, sizeof(TEMP_TAG) - 1) != 0)
		return false;
	for (const char *p = name + len - TEMP_RAND; *p != '\0'; p++)
		if (strchr(alnum, *p) == NULL)
			return false;
	return true;
}

/* Remove the temp file at path, recorded by a writer that is gone. Only a regular
 * file (or a restore's temp directory, with its tree) with a temp name, reached
 * without symlinks: the path was fully resolved when
 * it was recorded, so a symlink now on the way means someone changed the tree since,
 * and we do not follow it. Returns 1 if a file was removed. */
static int remove_temp(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (path[0] != '/' || slash == NULL || !journal_is_temp_name(slash + 1))
		return 0;
	char dir[PATH_MAX];
	size_t dlen = slash == path ? 1 : (size_t)(slash - path);
	if (dlen >= sizeof(dir))
		return 0;
	memcpy(dir, path, dlen);
	dir[dlen] = '\0';
	struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC, .resolve = RESOLVE_NO_SYMLINKS};
	int cleanup_close dfd = (int)syscall(SYS_openat2, AT_FDCWD, dir, &how, sizeof(how));
	if (dfd < 0 && errno == ENOSYS)
		dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	struct stat st;
	if (fstatat(dfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	if (S_ISDIR(st.st_mode)) {
		/* a restore's temp directory (op_backup.c), with the tree below it */
		struct shim_err err;
		if (op_fs_remove_tree(dfd, slash + 1, false, path, &err) < 0) {
			log_warn("journal: cannot remove %s: %s: %s", path, err.msg, strerror(err.code));
			return 0;
		}
		return 1;
	}
	if (!S_ISREG(st.st_mode))
		return 0;
	if (unlinkat(dfd, slash + 1, 0) < 0) {
		log_warn("journal: cannot remove %s: %s", path, strerror(errno));
		return 0;
	}
	return 1;
}

/* One entry of a sweep: skip it if a live daemon holds it. */
static unsigned sweep_entry(int dfd, const char *name)
{
	int cleanup_close fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		return 0; /* EWOULDBLOCK: its write is still going on */
	char buf[PATH_MAX + 1];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	unsigned removed = 0;
	char *nl = n > 0 ? memchr(buf, '\n', (size_t)n) : NULL;
	if (nl != NULL && nl > buf) {
		*nl = '\0';
		removed = (unsigned)remove_temp(buf);
		if (removed)
			log_info("journal: removed %s, left by an unfinished write", buf);
	}
	/* An empty first line is a spare, naming nothing; an entry without its newline
	 * was cut short while being written, before its temp file was created: only the
	 * entry is left to remove. */
	unlinkat(dfd, name, 0);
	return removed;
}

/* One file of an older daemon's idle directory: a spare entry (nothing it names is
 * pending), removed unless a live daemon holds it. */
static void sweep_idle_entry(int dfd, const char *name)
{
	int cleanup_close fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || flock(fd, LOCK_EX | LOCK_NB) < 0)
		return;
	unlinkat(dfd, name, 0);
}

/* Each entry of the directory dfd (not the dot files), through fn; the sum of what
 * fn returns. */
static unsigned sweep_dir(int dfd, unsigned (*fn)(int dfd, const char *name))
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return 0;
	}
	unsigned removed = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		removed += fn(dfd, e->d_name);
	}
	closedir(d);
	return removed;
}

static unsigned sweep_idle_one(int dfd, const char *name)
{
	sweep_idle_entry(dfd, name);
	return 0;
}

unsigned journal_sweep(void)
{
	if (jr.old_idle_dir[0] != '\0') {
		int cleanup_close idfd = open(jr.old_idle_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (idfd >= 0) {
			sweep_dir(idfd, sweep_idle_one);
			rmdir(jr.old_idle_dir); /* (ENOTEMPTY while an older daemon holds some) */
		}
	}
	if (jr.dfd < 0)
		return 0;
	return sweep_dir(jr.dfd, sweep_entry);
}

/* At exit (after SIGTERM, say) the writes still in flight lose their temp files
 * now rather than at the next start. */
static void journal_atexit(void)
{
	if (getpid() != jr.pid)
		return;
	/* not released: no worker changes the journal after this (the process is ending) */
	pthread_mutex_lock(&jr.change_mu);
	pthread_mutex_lock(&jr.mu);
	for (struct journal_entry *e = jr.live; e != NULL; e = e->next) {
		remove_temp(e->path);
		unlinkat(jr.dfd, e->name, 0);
	}
	/* the spare entries go too */
	for (struct journal_entry *e = jr.spare; e != NULL; e = e->next)
		unlinkat(jr.dfd, e->name, 0);
	pthread_mutex_unlock(&jr.mu);
}

int journal_init(const char *state_dir)
{
	int n = snprintf(jr.dir, sizeof(jr.dir), "%s/pending-writes", state_dir);
	if (n < 0 || (size_t)n >= sizeof(jr.dir)) {
		fprintf(stderr, "sandbox-shim: state dir %s: path too long\n", state_dir);
		return -1;
	}
	if ((size_t)n + sizeof(OLD_IDLE_SUFFIX) <= sizeof(jr.old_idle_dir)) {
		memcpy(jr.old_idle_dir, jr.dir, (size_t)n);
		memcpy(jr.old_idle_dir + n, OLD_IDLE_SUFFIX, sizeof(OLD_IDLE_SUFFIX));
	}
	jr.dfd = open(jr.dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (jr.dfd < 0 && errno != ENOENT) {
		fprintf(stderr, "sandbox-shim: %s: %s\n", jr.dir, strerror(errno));
		return -1;
	}
	unsigned removed = journal_sweep();
	if (removed > 0)
		log_warn("journal: removed %u temp file(s) left by unfinished writes", removed);
	jr.pid = getpid();
	atexit(journal_atexit);
	return 0;
}

/* The directory, created by the first write (a daemon that never writes leaves
 * nothing in its state dir). */
static int journal_dir(struct shim_err *err)
{
	pthread_mutex_lock(&jr.mu);
	if (jr.dfd < 0) {
		if (mkdir(jr.dir, 0700) < 0 && errno != EEXIST) {
			pthread_mutex_unlock(&jr.mu);
			return err_set(err, errno, jr.dir, "create the pending-writes journal %s", jr.dir);
		}
		jr.dfd = open(jr.dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (jr.dfd < 0) {
			int e = errno;
			pthread_mutex_unlock(&jr.mu);
			return err_set(err, e, jr.dir, "open the pending-writes journal %s", jr.dir);
		}
	}
	int fd = jr.dfd;
	pthread_mutex_unlock(&jr.mu);
	return fd;
}

static struct journal_entry *add_entry(const char *path, struct shim_err *err);

/* The journal is the shim's: a write acting as a user (fsctx.h) records its temp file
 * with the shim's own identity. */
struct journal_entry *journal_add(const char *path, struct shim_err *err)
{
	bool paused = fs_ctx_pause();
	pthread_mutex_lock(&jr.change_mu);
	struct journal_entry *e = add_entry(path, err);
	pthread_mutex_unlock(&jr.change_mu);
	fs_ctx_resume(paused);
	return e;
}

/* Undo entry_create's file after a later step failed: -1. */
static int entry_unmake(int dfd, struct journal_entry *e)
{
	unlinkat(dfd, e->name, 0);
	close(e->fd);
	e->fd = -1;
	return -1;
}

/* A new entry file for e in dfd: a fresh random name, created, locked, and still linked
 * (a sweep may remove an empty entry before we lock it). 0, or -1 with err and nothing
 * left behind. */
static int entry_create(int dfd, struct journal_entry *e, struct shim_err *err)
{
	for (int tries = 0;; tries++) {
		uint8_t r[8];
		random_bytes(r, sizeof(r));
		for (size_t i = 0; i < sizeof(r); i++)
			snprintf(e->name + 2 * i, 3, "%02x", r[i]);
		e->fd = openat(dfd, e->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (e->fd < 0) {
			if (errno == EEXIST && tries < 10)
				continue;
			return err_set(err, errno, jr.dir, "create a journal entry in %s", jr.dir);
		}
		if (flock(e->fd, LOCK_EX) < 0) {
			err_set(err, errno, jr.dir, "lock a journal entry in %s", jr.dir);
			return entry_unmake(dfd, e);
		}
		/* A sweep that got to the entry between its creation and our lock has
		 * removed it (it was empty, so it looked abandoned): start again. */
		struct stat st;
		if (fstat(e->fd, &st) < 0) {
			err_set(err, errno, jr.dir, "stat a journal entry in %s", jr.dir);
			return entry_unmake(dfd, e);
		}
		if (st.st_nlink > 0)
			return 0;
		close(e->fd);
		if (tries >= 10)
			return err_set(err, EAGAIN, jr.dir, "journal entries keep disappearing in %s", jr.dir);
	}
}

/* Drop entry e for good (a spare that cannot be used, or one there is no room to
 * keep): its file unlinked while still locked, so no sweep sees it unlocked first.
 * As the shim (the caller has paused a user's identity). */
static void entry_drop(struct journal_entry *e)
{
	if (unlinkat(jr.dfd, e->name, 0) < 0)
		log_warn("journal: cannot remove entry %s: %s", e->name, strerror(errno));
	close(e->fd);
	free(e);
}

void journal_drop_spares(void)
{
	pthread_mutex_lock(&jr.change_mu);
	pthread_mutex_lock(&jr.mu);
	struct journal_entry *e = jr.spare;
	jr.spare = NULL;
	jr.n_spare = 0;
	pthread_mutex_unlock(&jr.mu);
	while (e != NULL) {
		struct journal_entry *next = e->next;
		entry_drop(e);
		e = next;
	}
	pthread_mutex_unlock(&jr.change_mu);
}

/* A spare entry, taken out of the list, with room for a path of plen bytes and its
 * newline; NULL if there is none. */
static struct journal_entry *spare_take(size_t plen)
{
	pthread_mutex_lock(&jr.mu);
	struct journal_entry *e = jr.spare;
	if (e != NULL) {
		jr.spare = e->next;
		jr.n_spare--;
	}
	pthread_mutex_unlock(&jr.mu);
	if (e == NULL)
		return NULL;
	struct journal_entry *n = realloc(e, sizeof(*e) + plen + 2);
	if (n == NULL)
		entry_drop(e);
	return n;
}

/* Keep e (out of the live list, still locked) for the next write instead of deleting
 * it: true if its first line now names nothing and it is in the spare list. */
static bool spare_keep(struct journal_entry *e)
{
	pthread_mutex_lock(&jr.mu);
	bool room = jr.n_spare < SPARE_MAX;
	if (room)
		jr.n_spare++; /* the place is ours while we write */
	pthread_mutex_unlock(&jr.mu);
	if (!room)
		return false;
	bool ok = entry_write(e, "\n", 1) == 0;
	pthread_mutex_lock(&jr.mu);
	if (ok) {
		e->prev = NULL;
		e->next = jr.spare;
		jr.spare = e;
	} else {
		jr.n_spare--;
	}
	pthread_mutex_unlock(&jr.mu);
	return ok;
}

static struct journal_entry *add_entry(const char *path, struct shim_err *err)
{
	int dfd = journal_dir(err);
	if (dfd < 0)
		return NULL;
	size_t plen = strlen(path);
	struct journal_entry cleanup_free *e = spare_take(plen);
	if (e != NULL) {
		memcpy(e->path, path, plen);
		e->path[plen] = '\n';
		e->path[plen + 1] = '\0';
		/* the new path over the spare's empty line: the entry names it from now on */
		if (entry_write(e, e->path, plen + 1) < 0) {
			entry_drop(steal_ptr(e));
			e = NULL;
		}
	}
	if (e == NULL) {
		e = malloc(sizeof(*e) + plen + 2);
		if (e == NULL) {
			err_set(err, ENOMEM, NULL, "out of memory");
			return NULL;
		}
		memcpy(e->path, path, plen);
		e->path[plen] = '\n';
		e->path[plen + 1] = '\0';
		if (entry_create(dfd, e, err) < 0)
			return NULL;
		e->fsize = 0;
		if (entry_write(e, e->path, plen + 1) < 0) {
			err_set(err, errno, jr.dir, "write a journal entry in %s", jr.dir);
			entry_unmake(dfd, e);
			return NULL;
		}
	}
	e->path[plen] = '\0';
	pthread_mutex_lock(&jr.mu);
	e->prev = NULL;
	e->next = jr.live;
	if (jr.live != NULL)
		jr.live->prev = e;
	jr.live = e;
	pthread_mutex_unlock(&jr.mu);
	return steal_ptr(e);
}

void journal_remove(struct journal_entry *e)
{
	if (e == NULL)
		return;
	pthread_mutex_lock(&jr.change_mu);
	pthread_mutex_lock(&jr.mu);
	if (e->prev != NULL)
		e->prev->next = e->next;
	else
		jr.live = e->next;
	if (e->next != NULL)
		e->next->prev = e->prev;
	pthread_mutex_unlock(&jr.mu);
	/* (a pwrite on the entry's fd needs no identity of the shim's; an unlink does) */
	if (!spare_keep(e)) {
		bool paused = fs_ctx_pause();
		entry_drop(e);
		fs_ctx_resume(paused);
	}
	pthread_mutex_unlock(&jr.change_mu);
}
