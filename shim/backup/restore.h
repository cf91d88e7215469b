/* restore.h: what the restore job's files (restore.c, restore_files.c, restore_swap.c) share. */
#ifndef SHIM_RESTORE_H
#define SHIM_RESTORE_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "backup.h"

struct archive;
struct archive_entry;
struct fs_dirbuf;
struct journal_entry;
struct restore_files;

#define EX_STACK \
	128                   /* open directories kept for the current path; also how deep a
			       * merge may go into directories both dir and the archive have */
#define EX_NAME_MAX 16384     /* longest member name */
#define FROM_BUF (256u << 10) /* from_path read size */

struct dirfix {
	char *path; /* "" for the root */
	mode_t mode;
	struct timespec ts[2];
};

struct restore_level {
	int fd;
	size_t end;
};

struct restore {
	struct restore_job *r;
	struct archive *in; /* the stream: gzip, zstd or none, read as format "raw" */
	struct archive *a;  /* the tar reader, over in's output */
	int base;           /* the directory extracted into (O_RDONLY) */
	bool err_set;
	int input_err;   /* errno of our read callback's failure, 0 if none */
	bool in_failed;  /* in failed to decompress (its error is in a's) */
	bool in_eof;     /* in has given all of its output */
	bool compressed; /* in has a filter other than "none" */
	/* the archive as the tar reader got it (decompressed): the block it has now,
	 * at offset blk_off, and the last up to 1 KiB before it, for the end checks */
	const uint8_t *blk;
	size_t blk_len;
	uint64_t blk_off;
	uint8_t before[1024];
	size_t before_len;
	/* the chain of open directories of the last parent: stk[i] is the directory
	 * made of cur's components up to stk[i].end */
	struct restore_level stk[EX_STACK];
	size_t nstk;
	char cur[EX_NAME_MAX + 1];
	char path[EX_NAME_MAX + 1]; /* the member's normalized path */
	size_t plen;
	char tpath[EX_NAME_MAX + 1]; /* a hard link's normalized target */
	const char *member;          /* as in the archive, for errors */
	struct dirfix *fix;
	size_t nfix, capfix;
	bool root_seen;
	bool umask_known;
	mode_t umask;
	bool root; /* we may chown */
	uid_t euid;
	gid_t egid;
	bool sgid_possible; /* new entries may get a group other than egid */
	bool xattr_warned;
	int from_fd;
	uint8_t *from_buf;
	/* replace mode */
	int pdfd; /* dir's parent */
	char name[NAME_MAX + 1];
	char tmp[NAME_MAX + 1];
	int tmp_parent; /* where tmp is: pdfd, or dir itself (a mount point) */
	int dirfd;      /* dir itself when it exists (content swap) */
	bool existed, inplace, tmp_made;
	bool touched; /* the swap or the merge has begun to change dir */
	struct stat old;
	struct journal_entry *jent;
	struct restore_files *rf; /* the file writer thread (restore_files.c) */
	/* merge mode into a directory that exists: extracted into the temp directory
	 * like replace mode, then merged in (restore_swap.c) */
	bool merge_in;
	const char **fixidx; /* the directories the archive has, by path (sorted) */
	struct fs_dirbuf *mbuf;
};

/* Fill the job's error (the first one only) naming the member being restored, or
 * dir itself when none is; returns -1. */
int restore_fail(struct restore *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool restore_cancelled(struct restore *x);
/* A libarchive failure: our input's error if that is what it was, else EBADMSG. */
int restore_fail_archive(struct restore *x, const char *what);
/* A member's atime and mtime for utimensat (UTIME_OMIT where the archive has none). */
void restore_entry_times(struct archive_entry *e, struct timespec ts[2]);
/* The owner to give a member, or false when we leave it (not root, or ours). */
bool restore_want_owner(const struct restore *x, struct archive_entry *e, uid_t *uid, gid_t *gid);
/* An xattr the filesystem or our privileges refuse: skipped with a log line. */
bool restore_xattr_skippable(int e);
/* A chown that failed (an id the user namespace does not map): logged, not fatal. */
void restore_chown_failed(struct restore *x, int e);
/* Close the open directories of the stack above level keep. */
void restore_stack_close(struct restore *x, size_t keep);

/* restore_files.c: the regular files' data and metadata are written by a thread of
 * their own. restore_files_start starts it (-1 with the job's error); restore_files_add hands it the file
 * just created as fd (the member's data is read from the archive here; fd is the
 * thread's from then on, or closed on failure), created: the mode it got at
 * creation; restore_files_finish waits until all is written (-1 with the job's error, the
 * thread's first failure); restore_files_free stops it and frees (any time). */
#define RF_MODE_UNKNOWN 0xffffffffu
int restore_files_start(struct restore *x);
int restore_files_add(struct restore *x, struct archive_entry *e, int fd, mode_t created);
int restore_files_finish(struct restore *x);
void restore_files_free(struct restore *x);

/* restore_swap.c: set up x->base, the directory to extract into: a journaled temp
 * directory beside dir, or inside it when dir is a mount point (or, merging, when dir
 * is / or its parent is not ours to write). */
int restore_swap_prepare(struct restore *x);
/* Replace mode (and merge mode into a new directory), all extracted and verified:
 * put the new tree in place. */
int restore_swap_in(struct restore *x);
/* Merge mode into an existing dir, all extracted and verified: move the temp
 * directory's entries into dir, entering the directories both have. Checked first
 * without changing anything (a path through a symlink in dir, a non-empty directory
 * in the way); then done. The directories' modes and times are the caller's (after). */
int restore_swap_merge_in(struct restore *x);
/* Remove the temp directory, if any, and forget its journal entry: the new tree of
 * a failed restore, or the old one after the swap, or what a merge left of it. */
void restore_swap_drop_tmp(struct restore *x);

#endif
