/* fuzz_restore.c: libFuzzer harness for restore's archive parsing (shim/restore*.c): the input is the archive
 * restore_run() reads (as `sbx restore --from`), extracted beneath a fresh mktemp -d directory; built without
 * libFuzzer, fuzz_util.c's main() replays a corpus. */
#include "backup.h"
#include "fs.h"
#include "fuzz.h"
#include "journal.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* An input is one control byte and then the archive (tar, pax, GNU; plain, gzip or zstd):
 *   bit 0  merge mode (else replace)
 *   bit 1  the target exists beforehand: a file f, a directory d with a file g, a symlink l to f
 *          and a symlink esc out of the tree (to TOP/outside); else it is new
 *   bit 2  allow_devices
 *   bit 3  a sha256 is expected: the archive's own (bit 4 clear) or a wrong one (bit 4 set)
 *   bit 5  allow_empty (an archive without members may give an empty directory)
 * The scratch tree, all beneath TOP (mktemp -d), made once:
 *   TOP/root          the file-operation root (fs_init, as --root): every path resolves beneath it
 *   TOP/root/in.tar   the input
 *   TOP/root/t        the target, removed after every input
 *   TOP/outside       where t/esc points: must stay empty
 *   TOP/state         the state directory (the pending-writes journal)
 * After every input these must hold, else the harness aborts (a finding, like a crash):
 *   nothing but in.tar and t in the root (no temp directory left), nothing in outside or in
 *   the journal; a failure carries an errno; a replace that failed left t as it was (or absent).
 * The files a restore may write are capped at FSIZE_MAX bytes (RLIMIT_FSIZE: EFBIG beyond),
 * so a compressed input cannot fill the disk.
 * tests/fuzz/make_corpus.py writes seeds in this layout (corpus_restore/). */
#define CTL_MERGE 0x01
#define CTL_EXISTS 0x02
#define CTL_DEVICES 0x04
#define CTL_SHA 0x08
#define CTL_SHA_WRONG 0x10
#define CTL_EMPTY_OK 0x20
#define FSIZE_MAX (64 << 20)

const char fuzz_name[] = "fuzz_restore";

static struct {
	char top[200], root[210], outside[210], state[210], journal[230], target[220];
	int in_fd;    /* TOP/root/in.tar */
	bool verbose; /* FUZZ_VERBOSE: say what became of each input */
} sc;

/* What a failed replace must leave as it was. */
#define NSIG_PATHS 6
static const char *const sig_paths[NSIG_PATHS] = {"", "/f", "/d", "/d/g", "/l", "/esc"};

static void sign(struct stat sig[NSIG_PATHS])
{
	for (int i = 0; i < NSIG_PATHS; i++) {
		char p[300];
		snprintf(p, sizeof(p), "%s%s", sc.target, sig_paths[i]);
		memset(&sig[i], 0, sizeof(sig[i]));
		if (lstat(p, &sig[i]) < 0)
			sig[i].st_ino = 0;
	}
}

static bool same(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_mode == b->st_mode && a->st_size == b->st_size &&
	       a->st_nlink == b->st_nlink && a->st_uid == b->st_uid && a->st_gid == b->st_gid &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static void put_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
		fuzz_die("cannot create the target tree");
	close(fd);
}

static void build_target(void)
{
	char p[300];
	if (mkdir(sc.target, 0755) < 0)
		fuzz_die("cannot create the target tree");
	snprintf(p, sizeof(p), "%s/f", sc.target);
	put_file(p, "old file\n");
	snprintf(p, sizeof(p), "%s/d", sc.target);
	if (mkdir(p, 0755) < 0)
		fuzz_die("cannot create the target tree");
	snprintf(p, sizeof(p), "%s/d/g", sc.target);
	put_file(p, "");
	snprintf(p, sizeof(p), "%s/l", sc.target);
	if (symlink("f", p) < 0)
		fuzz_die("cannot create the target tree");
	/* from TOP/root/t/esc: TOP/outside */
	snprintf(p, sizeof(p), "%s/esc", sc.target);
	if (symlink("../../outside", p) < 0)
		fuzz_die("cannot create the target tree");
}

/* The names in dir other than the allowed ones (NULL-terminated): the first one, or NULL. */
static const char *stray_entry(const char *dir, const char *const *allowed, char *buf, size_t size)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return errno == ENOENT ? NULL : "(cannot read)";
	const char *found = NULL;
	struct dirent *de;
	while (found == NULL && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		bool ok = false;
		for (const char *const *a = allowed; *a != NULL && !ok; a++)
			ok = strcmp(de->d_name, *a) == 0;
		if (!ok) {
			snprintf(buf, size, "%s", de->d_name);
			found = buf;
		}
	}
	closedir(d);
	return found;
}

static void check_clean(void)
{
	static const char *const in_root[] = {"in.tar", "t", NULL};
	static const char *const none[] = {NULL};
	char name[256], msg[600];
	const char *s;
	if ((s = stray_entry(sc.root, in_root, name, sizeof(name))) != NULL) {
		snprintf(msg, sizeof(msg), "left in the root beside the target: %s", s);
		fuzz_die(msg);
	}
	if ((s = stray_entry(sc.outside, none, name, sizeof(name))) != NULL) {
		snprintf(msg, sizeof(msg), "written outside the target, through its symlink: %s", s);
		fuzz_die(msg);
	}
	if ((s = stray_entry(sc.journal, none, name, sizeof(name))) != NULL) {
		snprintf(msg, sizeof(msg), "left in the pending-writes journal: %s", s);
		fuzz_die(msg);
	}
}

static void hex_sha256(const uint8_t *data, size_t size, char out[65])
{
	struct sha256_ctx ctx;
	sha256_init(&ctx);
	sha256_update(&ctx, size, data);
	op_backup_sha_hex(&ctx, out);
}

static void remove_scratch(void)
{
	fuzz_rm_tree(sc.top, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* FUZZ_RESTORE_LOG=debug shows what the restore makes of each input */
	const char *lvl = getenv("FUZZ_RESTORE_LOG");
	log_max_level = lvl != NULL && log_parse_level(lvl) >= 0 ? (enum log_level)log_parse_level(lvl) : LOG_ERROR;
	sc.verbose = getenv("FUZZ_VERBOSE") != NULL;
	fuzz_mkdtemp(sc.top, sizeof(sc.top));
	atexit(remove_scratch);
	snprintf(sc.root, sizeof(sc.root), "%s/root", sc.top);
	snprintf(sc.outside, sizeof(sc.outside), "%s/outside", sc.top);
	snprintf(sc.state, sizeof(sc.state), "%s/state", sc.top);
	snprintf(sc.journal, sizeof(sc.journal), "%s/pending-writes", sc.state);
	snprintf(sc.target, sizeof(sc.target), "%s/t", sc.root);
	if (mkdir(sc.root, 0755) < 0 || mkdir(sc.outside, 0755) < 0 || mkdir(sc.state, 0700) < 0)
		fuzz_die("cannot create the scratch directories");
	char in[300];
	snprintf(in, sizeof(in), "%s/in.tar", sc.root);
	sc.in_fd = open(in, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (sc.in_fd < 0)
		fuzz_die("cannot create in.tar");
	/* made now, so that journal_init opens it (the first restore would, for good) */
	if (mkdir(sc.journal, 0700) < 0)
		fuzz_die("cannot create the journal directory");
	struct shim_err err;
	if (fs_init(sc.root, &err) < 0 || journal_init(sc.state) < 0)
		fuzz_die("fs_init or journal_init failed");
	/* EFBIG instead of SIGXFSZ past the cap */
	signal(SIGXFSZ, SIG_IGN);
	struct rlimit rl;
	if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > FSIZE_MAX)) {
		rl.rlim_cur = FSIZE_MAX;
		setrlimit(RLIMIT_FSIZE, &rl);
	}
	return 0;
}

void fuzz_teardown(void)
{
	close(sc.in_fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	uint8_t ctl = data[0];
	data++;
	size--;

	if (ftruncate(sc.in_fd, 0) < 0 || pwrite(sc.in_fd, data, size, 0) != (ssize_t)size)
		fuzz_die("cannot write in.tar");
	bool existed = (ctl & CTL_EXISTS) != 0;
	if (existed)
		build_target();
	struct stat before[NSIG_PATHS];
	sign(before);

	struct restore_job *r = calloc(1, sizeof(*r));
	if (r == NULL)
		fuzz_die("out of memory");
	snprintf(r->dir.abs, sizeof(r->dir.abs), "/t");
	r->dir.len = strlen(r->dir.abs);
	snprintf(r->from.abs, sizeof(r->from.abs), "/in.tar");
	r->from.len = strlen(r->from.abs);
	r->has_from = true;
	r->merge = (ctl & CTL_MERGE) != 0;
	r->allow_devices = (ctl & CTL_DEVICES) != 0;
	r->allow_empty = (ctl & CTL_EMPTY_OK) != 0;
	if (ctl & CTL_SHA) {
		r->has_sha = true;
		if (ctl & CTL_SHA_WRONG)
			memset(r->want_sha, '0', 64);
		else
			hex_sha256(data, size, r->want_sha);
	}
	/* no request: its file writer enters the shim's own identity */
	static struct op no_op;
	r->j.job.op = &no_op;
	pthread_mutex_init(&r->j.mu, NULL);
	pthread_cond_init(&r->j.cv, NULL);
	sha256_init(&r->sha);

	int rc = restore_run(r);
	if (sc.verbose && rc == 0)
		fprintf(stderr, "  restored: %llu entries\n", (unsigned long long)r->entries);
	else if (sc.verbose)
		fprintf(stderr, "  refused: %s: %s: %s\n", strerror(r->j.err.code), r->j.err.path, r->j.err.msg);

	if (rc < 0 && r->j.err.code == 0)
		fuzz_die("the restore failed without an errno");
	/* the journal keeps a finished entry, open, for the next write: dropped here so
	 * that the journal is empty and the fds as before unless something leaked */
	journal_drop_spares();
	check_clean();
	if (rc < 0 && !r->merge) {
		/* replace: nothing in dir changes before the archive is complete and checked */
		struct stat after[NSIG_PATHS];
		sign(after);
		for (int i = 0; i < NSIG_PATHS; i++) {
			if (!same(&before[i], &after[i])) {
				char msg[300];
				snprintf(msg, sizeof(msg), "a failed replace (%s: %s) changed t%s",
					 strerror(r->j.err.code), r->j.err.msg, sig_paths[i]);
				fuzz_die(msg);
			}
		}
	}
	if (rc == 0) {
		struct stat st;
		if (lstat(sc.target, &st) < 0 || !S_ISDIR(st.st_mode))
			fuzz_die("a restore succeeded without leaving a directory");
	}
	pthread_cond_destroy(&r->j.cv);
	pthread_mutex_destroy(&r->j.mu);
	free(r);
	fuzz_rm_tree(sc.target, 1);
	return 0;
}
