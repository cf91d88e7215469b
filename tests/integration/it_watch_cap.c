/* it_watch_cap.c: a recursive watch holds at most --max-watches inotify watches (or fewer, as its
 * request asks), every watch together at most --max-watches-total; reaching a cap sends OVERFLOW
 * and stops adding (issue 17.7). The trees are made by nobody. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool can_nobody(void)
{
	return geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0;
}

/* As nobody: mkdir DIR/PREFIX0 .. DIR/PREFIX(n-1). */
static void nobody_mkdirs(const char *dir, const char *prefix, unsigned n)
{
	char script[600];
	snprintf(script, sizeof(script),
		 "cd '%s' && i=0 && while [ $i -lt %u ]; do mkdir %s$i || exit 1; i=$((i+1)); done", dir, n, prefix);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
		      script, (char *)NULL);
		_exit(127);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "mkdir as nobody failed (status 0x%x)", st);
}

/* A directory owned by nobody in the test's folder (which nobody may traverse). */
static const char *nobody_dir(const char *name)
{
	CHECK(chmod(it_dir(), 0711) == 0);
	const char *p = it_path(name);
	CHECK(mkdir(p, 0755) == 0);
	CHECK(chown(p, 65534, 65534) == 0);
	return p;
}

/* The socket's path, in a 0700 directory of its own (the test's folder is 0711 here). */
static const char *sock_path(void)
{
	static char p[512];
	const char *d = it_path("run");
	if (mkdir(d, 0700) < 0)
		CHECK(errno == EEXIST);
	snprintf(p, sizeof(p), "%s/s", d);
	return p;
}

/* inotify watches the daemon holds: "inotify wd:" lines of every /proc/PID/fdinfo entry. */
static unsigned daemon_watches(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int)pid);
	DIR *d = opendir(path);
	CHECK(d != NULL);
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char fp[400];
		snprintf(fp, sizeof(fp), "%s/%s", path, e->d_name);
		FILE *f = fopen(fp, "re");
		if (f == NULL)
			continue; /* closed meanwhile */
		char line[512];
		while (fgets(line, sizeof(line), f) != NULL)
			n += strncmp(line, "inotify wd:", 11) == 0;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Wait until the daemon holds want watches (a watch's walk runs on a worker). */
static void wait_watches(pid_t pid, unsigned want)
{
	uint64_t deadline = it_now_ms() + 10000;
	unsigned n;
	while ((n = daemon_watches(pid)) != want) {
		CHECKF(it_now_ms() < deadline, "the daemon holds %u inotify watches, want %u", n, want);
		it_sleep_ms(5);
	}
}

struct w {
	struct sbx_client *c;
	const char *path;
	struct sbx_call_opts opts;
	pthread_t th;
	volatile int overflows, events, finished, rc;
	struct sbx_error err;
};

static int cb(void *ud, const struct sbx_watch_event *e)
{
	struct w *w = ud;
	if (e->type == SBX_WATCH_OVERFLOW)
		__atomic_add_fetch(&w->overflows, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&w->events, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static void *thread(void *arg)
{
	struct w *w = arg;
	w->rc = sbx_watch(w->c, &w->opts, w->path, SBX_WATCH_RECURSIVE, cb, w, &w->err);
	w->finished = 1;
	return NULL;
}

static void watch_start(struct w *w, struct sbx_client *c, const char *path)
{
	memset(w, 0, sizeof(*w));
	w->c = c;
	w->path = path;
	w->opts.struct_size = sizeof(w->opts);
	w->opts.timeout_ms = -1;
	w->opts.cancel = sbx_cancel_new();
	CHECK(pthread_create(&w->th, NULL, thread, w) == 0);
}

static void watch_stop(struct w *w)
{
	sbx_cancel_fire(w->opts.cancel);
	pthread_join(w->th, NULL);
	sbx_cancel_free(w->opts.cancel);
}

static void wait_overflow(struct w *w, int want)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (w->overflows < want) {
		CHECKF(!w->finished, "the watch of %s ended: %s", w->path, it_errstr(&w->err));
		CHECKF(it_now_ms() < deadline, "no OVERFLOW from the watch of %s", w->path);
		it_sleep_ms(5);
	}
}

/* --max-watches 100 and 150 directories: 100 watches (the root's included), one
 * OVERFLOW; directories made later add none; events in watched ones still come. */
static int case_per_watch(void)
{
	if (!can_nobody())
		return IT_SKIP;
	const char *tree = nobody_dir("tree");
	nobody_mkdirs(tree, "d", 150);
	const char *sock = sock_path();
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
					      "--max-watches", "100", NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct w w;
	watch_start(&w, c, tree);
	wait_overflow(&w, 1);
	wait_watches(d->pid, 100);
	/* more directories as nobody: still 100, no second OVERFLOW for them */
	int before = w.events;
	nobody_mkdirs(tree, "late", 20);
	char probe[600];
	snprintf(probe, sizeof(probe), "%s/probe", tree);
	it_write_file(probe, "x");
	uint64_t deadline = it_now_ms() + 10000;
	while (w.events <= before + 20) { /* 20 CREATE of late*, then the probe's */
		CHECKF(it_now_ms() < deadline, "events stopped after the cap (%d, was %d)", w.events, before);
		it_sleep_ms(5);
	}
	CHECK_EQ(daemon_watches(d->pid), 100);
	CHECK_EQ(w.overflows, 1);
	watch_stop(&w);
	wait_watches(d->pid, 0); /* given back at the end */
	printf("150 directories, --max-watches 100: 100 watches, 1 OVERFLOW\n");

	/* the default cap is far above this tree: every directory is watched */
	sbx_client_close(c);
	it_daemon_stop(d);
	d = it_daemon_start("shim2", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	c = it_connect(it_unix_target(sock), NULL);
	watch_start(&w, c, tree);
	wait_watches(d->pid, 1 + 150 + 20);
	snprintf(probe, sizeof(probe), "%s/d7/probe", tree);
	it_write_file(probe, "y");
	deadline = it_now_ms() + 10000;
	while (w.events < 1) {
		CHECKF(it_now_ms() < deadline, "no event from d7");
		it_sleep_ms(5);
	}
	CHECK_EQ(w.overflows, 0);
	watch_stop(&w);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* --max-watches-total 50: a first watch of 40 directories takes 41; a second of 40
 * gets the 9 left and OVERFLOW; a third cannot get its first watch: ENOSPC. */
static int case_total(void)
{
	if (!can_nobody())
		return IT_SKIP;
	const char *a = nobody_dir("a"), *b = it_path("b");
	CHECK(mkdir(b, 0755) == 0 && chown(b, 65534, 65534) == 0);
	nobody_mkdirs(a, "d", 40);
	nobody_mkdirs(b, "d", 40);
	const char *sock = sock_path();
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
					      "--max-watches-total", "50", NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	struct w wa, wb;
	watch_start(&wa, c, a);
	wait_watches(d->pid, 41);
	CHECK_EQ(wa.overflows, 0);
	watch_start(&wb, c, b);
	wait_overflow(&wb, 1);
	wait_watches(d->pid, 50);
	CHECK_EQ(wa.overflows, 0);
	struct sbx_error err;
	CHECK(sbx_watch(c, NULL, a, SBX_WATCH_RECURSIVE, cb, &wa, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOSPC);
	CHECK_CONTAINS(err.message, "--max-watches-total 50");
	/* one ends: its watches are free again */
	watch_stop(&wa);
	wait_watches(d->pid, 9);
	watch_start(&wa, c, a);
	wait_watches(d->pid, 50);
	watch_stop(&wa);
	watch_stop(&wb);
	wait_watches(d->pid, 0);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* The request's max_watches (raw frames: the SDKs do not expose it): 10 of 30
 * directories; a larger one is lowered to --max-watches. */
static int case_request(void)
{
	if (!can_nobody())
		return IT_SKIP;
	const char *tree = nobody_dir("tree");
	nobody_mkdirs(tree, "d", 30);
	const char *sock = sock_path();
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
					      "--max-watches", "20", NULL);
	static const unsigned ask[] = {10, 1000};
	static const unsigned want[] = {10, 20};
	for (size_t k = 0; k < ARRAY_LEN(ask); k++) {
		int fd = raw_connect_unix(sock);
		raw_hello(fd, NULL);
		Shim__V1__WatchRequest wr = SHIM__V1__WATCH_REQUEST__INIT;
		wr.path.data = (uint8_t *)(uintptr_t)tree;
		wr.path.len = strlen(tree);
		wr.has_recursive = 1;
		wr.recursive = 1;
		wr.has_max_watches = 1;
		wr.max_watches = ask[k];
		Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
		req.kind_case = SHIM__V1__REQUEST__KIND_WATCH;
		req.watch = &wr;
		uint8_t buf[1024];
		size_t n = shim__v1__request__get_packed_size(&req);
		CHECK(n <= sizeof(buf));
		shim__v1__request__pack(&req, buf);
		raw_send(fd, 1, FRAME_REQUEST, 0, buf, n);
		/* the first walk reports nothing but the OVERFLOW: {len, type 7} */
		bool overflow = false;
		while (!overflow) {
			struct frame_hdr h;
			uint8_t *p;
			CHECK(raw_recv(fd, &h, &p, 10000) == 1);
			CHECKF(h.type != FRAME_ERROR, "the watch failed");
			if (h.type == FRAME_DATA)
				for (size_t i = 0; i + 2 < h.len + 0u && !overflow; i++)
					overflow = p[i] == 2 && p[i + 1] == 0x08 && p[i + 2] == 7;
			free(p);
		}
		wait_watches(d->pid, want[k]);
		close(fd);
		wait_watches(d->pid, 0);
		printf("max_watches %u with --max-watches 20: %u watches\n", ask[k], want[k]);
	}
	it_daemon_stop(d);
	return 0;
}

/* Bad option values stop the start with a clear message. */
static int case_bad_option(void)
{
	static const char *const bad[][2] = {{"--max-watches", "0"},
					     {"--max-watches", "x"},
					     {"--max-watches-total", "0"},
					     {"--max-watches-total", "99999999999"}};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		struct it_daemon *d = it_daemon_spawn("shim", "--stdio", bad[i][0], bad[i][1], NULL);
		CHECK(it_daemon_wait_exit(d, 10000));
		CHECKF(WIFEXITED(d->status) && WEXITSTATUS(d->status) == 2, "%s %s: status 0x%x", bad[i][0], bad[i][1],
		       d->status);
		char want[80];
		snprintf(want, sizeof(want), "bad %s '%s' (want 1..16777216)", bad[i][0], bad[i][1]);
		char *log = it_daemon_log(d);
		CHECK_CONTAINS(log, want);
		free(log);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"per_watch", case_per_watch},
		{"total", case_total},
		{"request", case_request},
		{"bad_option", case_bad_option},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
