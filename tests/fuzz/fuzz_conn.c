/* fuzz_conn.c: libFuzzer harness for a connection's input path (framing, handshake, streams, every request
 * kind, file requests beneath a scratch root); built without libFuzzer, fuzz_util.c's main() replays a corpus. */
#include "conn.h"
#include "fs.h"
#include "fuzz.h"
#include "log.h"
#include "server.h"
#include "util.h"
#include "worker.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An input is one control byte and then the bytes a client sends:
 *   bit 0     the connection needs the token FUZZ_TOKEN (as on a unix listener with --token-file)
 *   bits 1-2  the bytes go in (bits + 1) chunks, with the event loop running in between
 *   bits 3-7  move the split points
 * tests/fuzz/make_corpus.py writes seeds in this layout. */
#define FUZZ_TOKEN "fuzz-token"
/* Longest wait for the worker pool to hand back its jobs (info, file operations). */
#define DRAIN_SECONDS 5.0

static struct server fuzz_srv;
static bool fuzz_ready;

/* File requests act on a scratch tree, never on the machine's files: the server's
 * root is scratch/root (resolved with RESOLVE_IN_ROOT like --root), its state
 * directory scratch/state. */
static struct {
	char top[200], root[240], state[240];
	struct stat sig[3]; /* root, root/d, root/f as last built */
} scratch;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	/* depth 0 is the directory itself; the caller decides whether it goes */
	if (ftw->level > 0)
		remove(path);
	return 0;
}

/* Empty dir without following symlinks or leaving its file system. */
static void rm_below(const char *dir)
{
	chmod(dir, 0755);
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

static void scratch_at(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", scratch.root, name);
}

static void scratch_sign(struct stat sig[3])
{
	char p[400];
	memset(sig, 0, 3 * sizeof(*sig));
	lstat(scratch.root, &sig[0]);
	scratch_at(p, sizeof(p), "d");
	lstat(p, &sig[1]);
	scratch_at(p, sizeof(p), "f");
	lstat(p, &sig[2]);
}

static bool stat_same(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_mode == b->st_mode && a->st_size == b->st_size &&
	       a->st_nlink == b->st_nlink && a->st_uid == b->st_uid && a->st_gid == b->st_gid &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* (Re)build the tree every input starts from: a file, a directory with a file, a
 * symlink inside the root and one that points out of it. */
static void scratch_build(void)
{
	char p[400];
	rm_below(scratch.root);
	scratch_at(p, sizeof(p), "f");
	FILE *f = fopen(p, "we");
	if (f == NULL)
		fuzz_die("cannot create the scratch tree");
	fputs("fuzz file contents\n", f);
	fclose(f);
	scratch_at(p, sizeof(p), "d");
	mkdir(p, 0755);
	scratch_at(p, sizeof(p), "d/g");
	f = fopen(p, "we");
	if (f != NULL)
		fclose(f);
	scratch_at(p, sizeof(p), "l");
	if (symlink("/f", p) < 0)
		fuzz_die("cannot create the scratch tree");
	scratch_at(p, sizeof(p), "esc");
	if (symlink("../../../../etc", p) < 0)
		fuzz_die("cannot create the scratch tree");
	scratch_sign(scratch.sig);
}

/* Cheap check after each input: rebuild only if a request changed the tree, so
 * that every input starts from the same files (and crashes reproduce alone). */
static void scratch_reset(void)
{
	struct stat now[3];
	scratch_sign(now);
	for (int i = 0; i < 3; i++) {
		if (!stat_same(&now[i], &scratch.sig[i])) {
			scratch_build();
			return;
		}
	}
}

static void scratch_remove(void)
{
	rm_below(scratch.top);
	rmdir(scratch.top);
}

static void scratch_setup(void)
{
	const char *t = getenv("TMPDIR");
	snprintf(scratch.top, sizeof(scratch.top), "%s/fuzz_conn.XXXXXX", t != NULL && t[0] == '/' ? t : "/tmp");
	if (mkdtemp(scratch.top) == NULL)
		fuzz_die("mkdtemp failed");
	atexit(scratch_remove);
	snprintf(scratch.root, sizeof(scratch.root), "%s/root", scratch.top);
	snprintf(scratch.state, sizeof(scratch.state), "%s/state", scratch.top);
	if (mkdir(scratch.root, 0755) < 0 || mkdir(scratch.state, 0700) < 0)
		fuzz_die("cannot create the scratch directories");
	scratch_build();
}

/* One server for the whole run, with small limits so that the fuzzer reaches them. */
static void fuzz_setup(void)
{
	struct server *s = &fuzz_srv;
	if (fuzz_ready)
		return;
	/* FUZZ_CONN_LOG=debug shows what the daemon makes of each input */
	const char *lvl = getenv("FUZZ_CONN_LOG");
	log_max_level = lvl != NULL && log_parse_level(lvl) >= 0 ? (enum log_level)log_parse_level(lvl) : LOG_ERROR;
	server_config_defaults(&s->cfg);
	s->cfg.max_frame = 64u << 10;
	s->cfg.initial_window = 16u << 10;
	s->cfg.max_streams = 8;
	s->cfg.keepalive = 0;
	/* a fixed pool: no thread is started while an input runs */
	s->cfg.workers = 2;
	s->cfg.max_workers = 2;
	s->cfg.token = strdup(FUZZ_TOKEN);
	if (s->cfg.token == NULL)
		fuzz_die("out of memory");
	s->cfg.token_len = strlen(FUZZ_TOKEN);
	scratch_setup();
	s->cfg.root = scratch.root;
	snprintf(s->cfg.state_dir, sizeof(s->cfg.state_dir), "%s", scratch.state);
	struct shim_err err;
	if (fs_init(s->cfg.root, &err) < 0) {
		fprintf(stderr, "fuzz_conn: fs_init %s: %s\n", s->cfg.root, err.msg);
		abort();
	}
	struct ev_loop *loop = ev_loop_new(0);
	if (loop == NULL)
		fuzz_die("ev_loop_new failed");
	if (server_init(s, loop) < 0)
		fuzz_die("server_init failed");
	/* Nothing here shuts the server down: leave SIGINT and SIGTERM to libFuzzer (it
	 * prints its summary) or to their default. The watchers were unref'd by
	 * server_init, so ref before stopping, as libev asks. */
	ev_ref(loop);
	ev_signal_stop(loop, &s->sig_term);
	ev_ref(loop);
	ev_signal_stop(loop, &s->sig_int);
	fuzz_ready = true;
}

static void pump(unsigned rounds)
{
	for (unsigned i = 0; i < rounds; i++)
		ev_run(fuzz_srv.loop, EVRUN_NOWAIT);
}

static void drain_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	fuzz_die("worker jobs still pending after 5 s");
}

/* Run the loop until every worker job has come back (the jobs of a closed
 * connection are orphaned and freed by their done() callback). */
static void drain_workers(void)
{
	struct ev_loop *loop = fuzz_srv.loop;
	if (worker_pending() == 0)
		return;
	/* the timer also keeps ev_run from returning at once: every other watcher is unref'd */
	ev_timer guard;
	ev_timer_init(&guard, drain_timeout_cb, DRAIN_SECONDS, 0);
	ev_now_update(loop);
	ev_timer_start(loop, &guard);
	while (worker_pending() > 0)
		ev_run(loop, EVRUN_ONCE);
	ev_timer_stop(loop, &guard);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct server *s = &fuzz_srv;
	if (size == 0)
		return 0;
	fuzz_setup();
	uint8_t ctl = data[0];
	data++;
	size--;

	/* Input comes only through conn_feed: the read end's writer stays open and silent.
	 * Output goes to /dev/null, which always takes everything. */
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		fuzz_die("pipe2 failed");
	int out = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (out < 0)
		fuzz_die("cannot open /dev/null");
	/* the connection owns p[0] and out from here on: conn_reap_dead closes them */
	struct conn *c = conn_new(s, p[0], out, NULL, (ctl & 1) != 0, "fuzz");
	if (c == NULL)
		fuzz_die("conn_new failed");

	/* The harness makes the only connection, so s->conns != NULL means it is still
	 * open; once it has closed, the loop's prepare watcher may have freed it. */
	unsigned chunks = 1 + ((ctl >> 1) & 3);
	size_t shift = ctl >> 3;
	size_t off = 0;
	for (unsigned i = 1; i <= chunks && s->conns != NULL; i++) {
		size_t end = i == chunks ? size : size * i / chunks + shift * i;
		if (end > size)
			end = size;
		if (end < off)
			end = off;
		conn_feed(c, data + off, end - off);
		off = end;
		pump(2);
	}
	pump(2);
	if (s->conns != NULL)
		conn_close(c, "end of fuzz input");
	drain_workers();
	conn_reap_dead(s);
	close(p[1]);
	scratch_reset();

	if (s->conns != NULL || s->dead != NULL || s->n_conns != 0 || s->n_streams != 0)
		fuzz_die("connection or stream left behind after close");
	return 0;
}

const char fuzz_name[] = "fuzz_conn";

/* Set up before libFuzzer installs its signal handlers. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_setup();
	return 0;
}

void fuzz_teardown(void)
{
	server_free(&fuzz_srv);
}
