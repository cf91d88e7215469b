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
#include <sys/syscall.h>
#include <unistd.h>

#define TEMP_TAG ".sbx-"
#define TEMP_RAND 6
/* "." + NAME + ".sbx-" + 6 random characters */
#define TEMP_EXTRA (1 + sizeof(TEMP_TAG) - 1 + TEMP_RAND)

/* An entry is a small file named by 16 random hex digits holding "PATH\n". Its
 * writer holds flock(LOCK_EX) on it until the write is over: a sweep (ours at
 * start, or another daemon's sharing the state dir) removes only entries it can
 * lock, i.e. whose daemon is gone, since the kernel drops the lock with the
 * process however it dies.
 *
 * A finished entry is not unlinked but renamed (still locked, then closed) into
 * STATE/pending-writes.idle, up to IDLE_MAX of them, and the next write takes it
 * back: reopened and locked, its new path written over the old one, renamed into
 * the journal. An inode created and deleted per write is what made small writes
 * slow: ext4 without a journal does not reuse a recently deleted inode, and scans
 * past every one of them at each create, in the state dir and in the directories
 * beside it. The idle directory is never read for temp files to remove: a sweep
 * only deletes the files in it that nobody has locked. It holds no fd: it is
 * reached through the journal's, as IDLE_REL. */
struct journal_entry {
	struct journal_entry *prev, *next;
	int fd;
	char name[20];
	char path[]; /* the temp file */
};

#define IDLE_MAX 4
#define IDLE_SUFFIX ".idle"
#define IDLE_REL "../pending-writes" IDLE_SUFFIX "/"

static struct {
	pthread_mutex_t mu;
	/* Held while an entry is added or removed (its file and the lists together), and
	 * taken for good by journal_atexit(): exit() in the middle of a worker's removal
	 * would otherwise find the entry in no list while its file is still in the journal. */
	pthread_mutex_t change_mu;
	char dir[PATH_MAX];
	int dfd; /* -1 until the first write creates the directory */
	struct journal_entry *live;
	pid_t pid; /* the daemon's: a forked child that calls exit() must not sweep */
	/* entries kept for reuse (journal_remove), in STATE/pending-writes.idle */
	char idle_dir[PATH_MAX];
	bool idle_made;             /* the idle directory exists */
	bool no_idle;               /* renames between the two cannot be done here: never keep one */
	struct journal_entry *idle; /* through next; fd -1 */
	unsigned n_idle;            /* in the list, or being renamed into the idle directory */
} jr = {.mu = PTHREAD_MUTEX_INITIALIZER, .change_mu = PTHREAD_MUTEX_INITIALIZER, .dfd = -1};

/* IDLE_REL NAME, for the *at calls on jr.dfd */
static void idle_rel(const struct journal_entry *e, char *buf, size_t size)
{
	snprintf(buf, size, IDLE_REL "%s", e->name);
}

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
	if (n > 0 && buf[n - 1] == '\n') {
		buf[n - 1] = '\0';
		removed = (unsigned)remove_temp(buf);
		if (removed)
			log_info("journal: removed %s, left by an unfinished write", buf);
	}
	/* An entry without its newline was cut short while being written, before its
	 * temp file was created: only the entry is left to remove. */
	unlinkat(dfd, name, 0);
	return removed;
}

/* One file of the idle directory: a dead daemon's spare entry (nothing it names is
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
	if (!jr.no_idle) {
		int cleanup_close idfd = open(jr.idle_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (idfd >= 0)
			sweep_dir(idfd, sweep_idle_one);
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
	/* the spare entries go, and their directory if no other daemon has some there */
	for (struct journal_entry *e = jr.idle; e != NULL; e = e->next) {
		char rel[sizeof(IDLE_REL) + sizeof(e->name)];
		idle_rel(e, rel, sizeof(rel));
		unlinkat(jr.dfd, rel, 0);
	}
	if (jr.idle_made)
		unlinkat(AT_FDCWD, jr.idle_dir, AT_REMOVEDIR);
	pthread_mutex_unlock(&jr.mu);
}

int journal_init(const char *state_dir)
{
	int n = snprintf(jr.dir, sizeof(jr.dir), "%s/pending-writes", state_dir);
	if (n < 0 || (size_t)n >= sizeof(jr.dir)) {
		fprintf(stderr, "sandbox-shim: state dir %s: path too long\n", state_dir);
		return -1;
	}
	if ((size_t)n + sizeof(IDLE_SUFFIX) <= sizeof(jr.idle_dir)) {
		memcpy(jr.idle_dir, jr.dir, (size_t)n);
		memcpy(jr.idle_dir + n, IDLE_SUFFIX, sizeof(IDLE_SUFFIX));
	} else {
		jr.no_idle = true;
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

/* A spare entry, taken out of the idle list, with room for a path of plen bytes and
 * its newline; NULL if there is none. */
static struct journal_entry *idle_take(size_t plen)
{
	pthread_mutex_lock(&jr.mu);
	struct journal_entry *e = jr.idle;
	if (e != NULL) {
		jr.idle = e->next;
		jr.n_idle--;
	}
	pthread_mutex_unlock(&jr.mu);
	if (e == NULL)
		return NULL;
	struct journal_entry *n = realloc(e, sizeof(*e) + plen + 2);
	if (n == NULL) {
		char rel[sizeof(IDLE_REL) + sizeof(e->name)];
		idle_rel(e, rel, sizeof(rel));
		unlinkat(jr.dfd, rel, 0);
		free(e);
	}
	return n;
}

/* idle_reuse's steps on the reopened spare: 1 taken back, 0 gone meanwhile (a sweep
 * removed it), -1 failed (the spare is to be removed). */
static int idle_retake(struct journal_entry *e, const char *rel, size_t len)
{
	struct stat st;
	if (flock(e->fd, LOCK_EX) < 0 || fstat(e->fd, &st) < 0 || !S_ISREG(st.st_mode))
		return -1;
	if (st.st_nlink == 0)
		return 0;
	if (pwrite(e->fd, e->path, len, 0) != (ssize_t)len ||
	    ((size_t)st.st_size > len && ftruncate(e->fd, (off_t)len) < 0))
		return -1;
	/* NOREPLACE: a name that another daemon's entry took meanwhile stays its own */
	return renameat2(jr.dfd, rel, jr.dfd, e->name, RENAME_NOREPLACE) == 0 ? 1 : -1;
}

/* Put the spare entry e (e->path holds len bytes, "PATH\n") back into the journal:
 * locked (a sweep may have removed it while it was not), the new path written over
 * the old one first, so that it never names anything else while in the journal.
 * 0, or -1 with e freed and its file gone. */
static int idle_reuse(struct journal_entry *e, size_t len)
{
	char rel[sizeof(IDLE_REL) + sizeof(e->name)];
	idle_rel(e, rel, sizeof(rel));
	e->fd = openat(jr.dfd, rel, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
	int r = e->fd < 0 ? 0 : idle_retake(e, rel, len);
	if (r == 1)
		return 0;
	if (r < 0)
		unlinkat(jr.dfd, rel, 0);
	if (e->fd >= 0)
		close(e->fd);
	free(e);
	return -1;
}

/* Keep e (out of the live list, still locked) for the next write instead of
 * deleting it: true if it was renamed into the idle directory (and closed). */
static bool idle_keep(struct journal_entry *e)
{
	pthread_mutex_lock(&jr.mu);
	bool room = !jr.no_idle && jr.n_idle < IDLE_MAX;
	if (room)
		jr.n_idle++; /* the place is ours while we rename */
	if (room && !jr.idle_made) {
		/* created by the first entry kept (like the journal, by the first write) */
		if (mkdir(jr.idle_dir, 0700) < 0 && errno != EEXIST) {
			jr.no_idle = true;
			room = false;
			jr.n_idle--;
		} else {
			jr.idle_made = true;
		}
	}
	pthread_mutex_unlock(&jr.mu);
	if (!room)
		return false;
	char rel[sizeof(IDLE_REL) + sizeof(e->name)];
	idle_rel(e, rel, sizeof(rel));
	/* renamed while still locked, so that no sweep sees it unlocked in the journal */
	if (renameat2(jr.dfd, e->name, jr.dfd, rel, RENAME_NOREPLACE) == 0) {
		close(e->fd);
		e->fd = -1;
		pthread_mutex_lock(&jr.mu);
		e->prev = NULL;
		e->next = jr.idle;
		jr.idle = e;
		pthread_mutex_unlock(&jr.mu);
		return true;
	}
	int en = errno;
	pthread_mutex_lock(&jr.mu);
	jr.n_idle--;
	/* no RENAME_NOREPLACE (EINVAL), another filesystem there (EXDEV)...: never again */
	if (en != EEXIST)
		jr.no_idle = true;
	pthread_mutex_unlock(&jr.mu);
	return false;
}

static struct journal_entry *add_entry(const char *path, struct shim_err *err)
{
	int dfd = journal_dir(err);
	if (dfd < 0)
		return NULL;
	size_t plen = strlen(path);
	struct journal_entry cleanup_free *e = idle_take(plen);
	if (e != NULL) {
		memcpy(e->path, path, plen);
		e->path[plen] = '\n';
		e->path[plen + 1] = '\0';
		if (idle_reuse(e, plen + 1) < 0)
			e = NULL; /* (freed) */
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
		ssize_t w = write(e->fd, e->path, plen + 1);
		if (w != (ssize_t)plen + 1) {
			err_set(err, w < 0 ? errno : ENOSPC, jr.dir, "write a journal entry in %s", jr.dir);
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
	/* renamed or unlinked while still holding the lock, so no sweep sees it
	 * unlocked first */
	bool paused = fs_ctx_pause();
	bool kept = idle_keep(e);
	if (!kept && unlinkat(jr.dfd, e->name, 0) < 0)
		log_warn("journal: cannot remove entry %s: %s", e->name, strerror(errno));
	fs_ctx_resume(paused);
	pthread_mutex_unlock(&jr.change_mu);
	if (kept)
		return;
	close(e->fd);
	free(e);
}
