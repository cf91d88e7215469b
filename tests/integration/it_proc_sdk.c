/* it_proc_sdk.c: commands through the SDK against the real daemon: collected output with caps,
 * streamed output with back-pressure, stdin, cancel, threads, eval, background processes, PTY. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024u
#define MiB (1024u * 1024u)

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

/* ---- helpers ---- */

static struct sbx_client *start(const char *name, char *target, size_t size)
{
	char sock[64], state[64];
	snprintf(sock, sizeof(sock), "%s.sock", name);
	snprintf(state, sizeof(state), "%s.state", name);
	const char *t = it_unix_target(it_path(sock));
	it_daemon_start(name, "--listen", t, "--state-dir", it_path(state), NULL);
	if (target != NULL)
		snprintf(target, size, "%s", t);
	return it_connect(t, NULL);
}

/* Run a shell command, collected; the exec must start. */
static int run_sh(struct sbx_client *c, const char *cmd, struct sbx_output *out, struct sbx_exit *ex)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	eo.shell = cmd;
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, out, ex, &err), &err);
	return sbx_exit_status(ex);
}

/* The pid a command wrote to a file (0 if not there yet). */
static unsigned read_pid(const char *path)
{
	FILE *f = fopen(path, "r");
	unsigned pid = 0;
	if (f != NULL) {
		if (fscanf(f, "%u", &pid) != 1)
			pid = 0;
		fclose(f);
	}
	return pid;
}

/* True once pid is gone (not even a zombie: the shim reaped it) within ms. */
static bool pid_gone(unsigned pid, unsigned ms)
{
	uint64_t end = it_now_ms() + ms;
	do {
		if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
			return true;
		it_sleep_ms(10);
	} while (it_now_ms() < end);
	return false;
}

static void write_local(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(write(fd, data, len) == (ssize_t)len);
	close(fd);
}

/* Everything a streamed process prints, by channel. */
struct drained {
	char *out, *err;
	size_t out_len, err_len;
};

static void drain(struct sbx_proc *p, struct drained *d, size_t max)
{
	struct sbx_error err;
	char buf[7000]; /* not a power of two: frames get split across reads */
	int ch;
	long n;
	memset(d, 0, sizeof(*d));
	d->out = malloc(max + 1);
	d->err = malloc(max + 1);
	CHECK(d->out != NULL && d->err != NULL);
	while ((n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err)) > 0) {
		CHECK(ch == SBX_STDOUT || ch == SBX_STDERR);
		char *dst = ch == SBX_STDOUT ? d->out : d->err;
		size_t *len = ch == SBX_STDOUT ? &d->out_len : &d->err_len;
		CHECKF(*len + (size_t)n <= max, "more output than the %zu bytes expected", max);
		memcpy(dst + *len, buf, (size_t)n);
		*len += (size_t)n;
	}
	CHECKF(n == 0, "sbx_proc_read: %s", it_errstr(&err));
	d->out[d->out_len] = d->err[d->err_len] = '\0';
}

static void drained_free(struct drained *d)
{
	free(d->out);
	free(d->err);
}

/* ---- cases ---- */

/* sbx_run: exact bytes on both streams, exit codes and signals, caps and truncation. */
static int case_run_collect(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;

	CHECK_EQ(run_sh(c, "printf 'a\\000b\\n'; printf 'e\\001' >&2", &out, &ex), 0);
	CHECK_EQ(out.out_len, 4);
	CHECK(memcmp(out.out, "a\0b\n", 4) == 0);
	CHECK_EQ(out.err_len, 2);
	CHECK(memcmp(out.err, "e\1", 2) == 0);
	CHECK(!ex.stdout_truncated && !ex.stderr_truncated && !ex.timed_out);
	CHECK(ex.pid > 0 && ex.id[0] != '\0');
	sbx_output_free(&out);

	/* no output: empty buffers, not NULL */
	CHECK_EQ(run_sh(c, "exit 7", &out, &ex), 7);
	CHECK_EQ(ex.exit_code, 7);
	CHECK_EQ(ex.signal, 0);
	CHECK(out.out != NULL && out.err != NULL && out.out_len == 0 && out.err_len == 0);
	sbx_output_free(&out);

	CHECK_EQ(run_sh(c, "kill -9 $$", &out, &ex), 128 + 9);
	CHECK_EQ(ex.exit_code, -1);
	CHECK_EQ(ex.signal, 9);
	sbx_output_free(&out);

	/* the cap: 1000 bytes kept of 300000 on stdout, stderr under it intact */
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "head -c 300000 /dev/zero | tr '\\0' x; printf small >&2";
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 1000, &out, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(out.out_len, 1000);
	CHECK(ex.stdout_truncated);
	CHECK(!ex.stderr_truncated);
	for (size_t i = 0; i < out.out_len; i++)
		CHECK(out.out[i] == 'x');
	CHECK_EQ(out.err_len, 5);
	CHECK(memcmp(out.err, "small", 5) == 0);
	sbx_output_free(&out);

	/* exactly the cap: not truncated */
	eo.shell = "printf 12345";
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 5, &out, &ex, &err), &err);
	CHECK_EQ(out.out_len, 5);
	CHECK(!ex.stdout_truncated);
	sbx_output_free(&out);

	/* 10 MiB of binary on each stream, byte-exact */
	size_t big = 10 * MiB;
	uint8_t *data = malloc(big);
	CHECK(data != NULL);
	it_fill(data, big, 42);
	write_local(it_path("big"), data, big);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "cat '%s'; cat '%s' >&2", it_path("big"), it_path("big"));
	eo.shell = cmd;
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(out.out_len, big);
	CHECK_EQ(out.err_len, big);
	CHECK(memcmp(out.out, data, big) == 0);
	CHECK(memcmp(out.err, data, big) == 0);
	CHECK(!ex.stdout_truncated && !ex.stderr_truncated);
	sbx_output_free(&out);
	free(data);

	/* out may be NULL: the output is dropped */
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, NULL, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	sbx_client_close(c);
	return 0;
}

/* Spawn failures are errors with the real errno, and bad options are refused locally. */
static int case_run_errors(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;

	const char *nope[] = {"no-such-program-here", NULL};
	eo.argv = nope;
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(out.out == NULL && out.err == NULL);
	sbx_output_free(&out);

	it_write_file(it_path("noexec"), "#!/bin/sh\necho hi\n");
	chmod(it_path("noexec"), 0644);
	const char *noexec[] = {it_path("noexec"), NULL};
	eo.argv = noexec;
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);

	const char *tru[] = {"true", NULL};
	eo.argv = tru;
	eo.cwd = "/no/such/dir";
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	eo.cwd = NULL;

	eo.user = "no-such-user-xyz";
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	eo.user = NULL;

	/* the same failure through sbx_exec_start and sbx_spawn */
	struct sbx_proc *p = (struct sbx_proc *)1;
	eo.argv = nope;
	CHECK(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(p == NULL);
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	CHECK(sbx_spawn(c, &no_timeout, &eo, &pi, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);

	/* refused before anything is sent */
	eo.shell = "true";
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	eo.argv = NULL;
	eo.shell = NULL;
	CHECK(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	struct sbx_exec_opts zero;
	memset(&zero, 0, sizeof(zero));
	zero.shell = "true";
	CHECK(sbx_run(c, &no_timeout, &zero, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);

	/* the client still works */
	CHECK_EQ(run_sh(c, "exit 0", &out, &ex), 0);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

/* Streamed: both channels apart and exact; id and pid; exit status after EOF. */
static int case_stream_channels(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct drained d;

	eo.shell = "printf out1; printf err1 >&2; sleep 0.1; printf out2; printf 'err\\0002' >&2; exit 5";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	CHECK(sbx_proc_pid(p) > 0);
	CHECK(sbx_proc_id(p)[0] != '\0');
	drain(p, &d, 1000);
	CHECK_EQ(d.out_len, 8);
	CHECK(memcmp(d.out, "out1out2", 8) == 0);
	CHECK_EQ(d.err_len, 9);
	CHECK(memcmp(d.err, "err1err\0002", 9) == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 5);
	CHECK_EQ(ex.pid, sbx_proc_pid(p));
	CHECK(strcmp(ex.id, sbx_proc_id(p)) == 0);
	/* after the end: reads say EOF, wait says the same again */
	char b[4];
	int ch;
	CHECK_EQ(sbx_proc_read(p, &ch, b, sizeof(b), &err), 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 5);
	/* stdin was not asked for */
	CHECK(sbx_proc_write(p, "x", 1, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EBADF);
	drained_free(&d);
	sbx_proc_free(p);

	/* wait without reading: the output is dropped, the command is not blocked by it */
	eo.shell = "head -c 5000000 /dev/zero; exit 3";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 3);
	sbx_proc_free(p);
	sbx_client_close(c);
	return 0;
}

/* A reader that does not read stops the command (not the shim): it writes no more
 * than the windows and pipe hold, then finishes once read. */
static int case_backpressure(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char cmd[512];
	const unsigned chunks = 200, chunk = 64 * KiB; /* 12.5 MiB in all */

	snprintf(cmd, sizeof(cmd),
		 "i=0; while [ $i -lt %u ]; do head -c %u /dev/zero || exit 9; i=$((i+1)); echo $i > '%s.tmp';"
		 " mv '%s.tmp' '%s'; done",
		 chunks, chunk, it_path("progress"), it_path("progress"), it_path("progress"));
	eo.shell = cmd;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	it_sleep_ms(1500);
	unsigned done = read_pid(it_path("progress"));
	fprintf(stderr, "nobody reading: the command wrote %u KiB in 1.5 s\n", done * chunk / KiB);
	/* 256 KiB of window + a 64 KiB pipe + what the shim holds: far below 1.5 MiB */
	CHECKF(done * chunk <= 3 * MiB / 2, "the command wrote %u KiB with nobody reading", done * chunk / KiB);
	/* the shim still answers on the same connection meanwhile */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	/* a slow reader: small reads with pauses, then the rest */
	char *buf = malloc(64 * KiB);
	CHECK(buf != NULL);
	size_t total = 0;
	int ch;
	long n;
	for (int i = 0; i < 20; i++) {
		n = sbx_proc_read(p, &ch, buf, 4096, &err);
		CHECKF(n > 0, "read: %s", it_errstr(&err));
		CHECK_EQ(ch, SBX_STDOUT);
		total += (size_t)n;
		it_sleep_ms(10);
	}
	while ((n = sbx_proc_read(p, &ch, buf, 64 * KiB, &err)) > 0) {
		for (long i = 0; i < n; i++)
			CHECK(buf[i] == 0);
		total += (size_t)n;
	}
	CHECKF(n == 0, "read: %s", it_errstr(&err));
	CHECK_EQ(total, (size_t)chunks * chunk);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(read_pid(it_path("progress")), chunks);
	free(buf);
	sbx_proc_free(p);
	sbx_client_close(c);
	return 0;
}

struct feeder {
	struct sbx_proc *p;
	const uint8_t *data;
	size_t len;
	int rc;
	struct sbx_error err;
};

static void *feed_main(void *arg)
{
	struct feeder *f = arg;
	size_t off = 0;
	/* uneven pieces, some bigger than a frame */
	static const size_t pieces[] = {1, 4095, 70000, 300000, 12345, 1 << 20};
	for (unsigned i = 0; off < f->len; i++) {
		size_t n = pieces[i % 6];
		if (n > f->len - off)
			n = f->len - off;
		if ((f->rc = sbx_proc_write(f->p, f->data + off, n, &f->err)) < 0)
			return NULL;
		off += n;
	}
	f->rc = sbx_proc_close_stdin(f->p, &f->err);
	return NULL;
}

/* 10 MiB through cat, streamed both ways at once, byte-exact. */
static int case_stdin_stream(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct drained d;
	const char *cat[] = {"cat", NULL};
	size_t len = 10 * MiB;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 7);

	eo.argv = cat;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, SBX_PROC_STDIN, &p, &err), &err);
	struct feeder f = {p, data, len, 0, {0}};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, feed_main, &f) == 0);
	drain(p, &d, len);
	pthread_join(t, NULL);
	CHECKF(f.rc == 0, "feeding stdin: %s", it_errstr(&f.err));
	CHECK_EQ(d.out_len, len);
	CHECK_EQ(d.err_len, 0);
	CHECK(memcmp(d.out, data, len) == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	/* stdin is closed now */
	CHECK(sbx_proc_write(p, "x", 1, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EPIPE);
	drained_free(&d);
	sbx_proc_free(p);

	/* a command that does not read its stdin: closing it is enough to end `read`-less
	 * commands, and writing after it exited fails cleanly */
	eo.argv = NULL;
	eo.shell = "exit 4";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, SBX_PROC_STDIN, &p, &err), &err);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 4);
	CHECK(sbx_proc_write(p, data, len, &err) < 0);
	CHECK_EQ(err.code, EPIPE);
	sbx_proc_free(p);

	/* the same 8 MiB through sbx_run (collect mode) */
	struct sbx_output out;
	eo.shell = NULL;
	eo.argv = cat;
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, data, len, 0, &out, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(out.out_len, len);
	CHECK(memcmp(out.out, data, len) == 0);
	sbx_output_free(&out);
	/* stdin the command never reads: the run still ends with the command */
	const char *tru[] = {"true", NULL};
	eo.argv = tru;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, data, len, 0, &out, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK(it_now_ms() - t0 < 5000);
	sbx_output_free(&out);
	eo.argv = cat;
	/* empty stdin: cat ends at once */
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, "", 0, 0, &out, &ex, &err), &err);
	CHECK_EQ(out.out_len, 0);
	sbx_output_free(&out);
	free(data);
	sbx_client_close(c);
	return 0;
}

/* Big stdin frames go from the socket straight into the command's stdin pipe (a
 * splice), small ones through the shim's buffer, behind what is in the pipe: the
 * bytes in order whatever the mix, when the command reads late (the pipe fills and the
 * buffer takes over, then the pipe again), and when it stops reading midway (it exits:
 * the rest is dropped, the writer is not stuck, the stream ends with its exit). */
static int case_stdin_splice(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct drained d;
	size_t len = 12 * MiB;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 11);

	/* a reader that starts late: the first MiBs meet a full pipe */
	eo.shell = "read -r _ < /dev/null; sleep 0.3; exec cat";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, SBX_PROC_STDIN, &p, &err), &err);
	struct feeder f = {p, data, len, 0, {0}};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, feed_main, &f) == 0);
	drain(p, &d, len);
	pthread_join(t, NULL);
	CHECKF(f.rc == 0, "feeding stdin: %s", it_errstr(&f.err));
	CHECK_EQ(d.out_len, len);
	CHECK(memcmp(d.out, data, len) == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	drained_free(&d);
	sbx_proc_free(p);

	/* a reader that takes 100000 bytes of 12 MiB and exits */
	eo.shell = "head -c 100000";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, SBX_PROC_STDIN, &p, &err), &err);
	struct feeder g = {p, data, len, 0, {0}};
	CHECK(pthread_create(&t, NULL, feed_main, &g) == 0);
	drain(p, &d, len);
	pthread_join(t, NULL);
	/* the writes after its exit fail with EPIPE, or were dropped before it was seen */
	CHECKF(g.rc == 0 || g.err.code == EPIPE, "feeding stdin: %s", it_errstr(&g.err));
	CHECK_EQ(d.out_len, 100000);
	CHECK(memcmp(d.out, data, 100000) == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	drained_free(&d);
	sbx_proc_free(p);
	free(data);
	sbx_client_close(c);
	return 0;
}

struct firer {
	struct sbx_cancel *tok;
	unsigned after_ms;
	uint64_t fired_at;
};

static void *fire_main(void *arg)
{
	struct firer *f = arg;
	it_sleep_ms(f->after_ms);
	f->fired_at = it_now_ms();
	sbx_cancel_fire(f->tok);
	return NULL;
}

/* A fired cancel token ends sbx_run at once with ECANCELED, and the command is gone. */
static int case_cancel_run(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "echo $$ > '%s'; exec sleep 30", it_path("pid"));
	eo.shell = cmd;
	struct firer f = {sbx_cancel_new(), 500, 0};
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = f.tok};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, fire_main, &f) == 0);
	CHECK(sbx_run(c, &opts, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	uint64_t back = it_now_ms();
	pthread_join(t, NULL);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECKF(back - f.fired_at < 200, "sbx_run returned %llu ms after the cancel",
	       (unsigned long long)(back - f.fired_at));
	unsigned pid = read_pid(it_path("pid"));
	CHECK(pid > 0);
	CHECKF(pid_gone(pid, 3000), "pid %u still there after the cancel", pid);

	/* a token fired before the call: nothing runs long */
	uint64_t t0 = it_now_ms();
	CHECK(sbx_run(c, &opts, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(it_now_ms() - t0 < 1000);
	sbx_cancel_reset(f.tok);

	/* the call's own timeout: ETIMEDOUT, and the command is killed likewise */
	unlink(it_path("pid"));
	struct sbx_call_opts short_opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 300};
	CHECK(sbx_run(c, &short_opts, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	pid = read_pid(it_path("pid"));
	CHECK(pid > 0);
	CHECKF(pid_gone(pid, 3000), "pid %u still there after the timeout", pid);

	/* the client goes on */
	CHECK_EQ(run_sh(c, "exit 2", &out, &ex), 2);
	sbx_output_free(&out);
	sbx_cancel_free(f.tok);
	sbx_client_close(c);
	return 0;
}

struct worker {
	struct sbx_client *c;
	int n;
};

#define THREADS 16
#define PER_THREAD 20

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < PER_THREAD; i++) {
		char cmd[128], want_out[64], want_err[64];
		int code = (w->n * PER_THREAD + i) % 50;
		snprintf(cmd, sizeof(cmd), "echo out-%d-%d; echo err-%d-%d >&2; exit %d", w->n, i, w->n, i, code);
		snprintf(want_out, sizeof(want_out), "out-%d-%d\n", w->n, i);
		snprintf(want_err, sizeof(want_err), "err-%d-%d\n", w->n, i);
		struct sbx_output out;
		struct sbx_exit ex = SBX_EXIT_INIT;
		if (i % 4 == 3) {
			/* some through the streamed API, on the same client */
			struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
			struct sbx_error err;
			struct sbx_proc *p;
			struct drained d;
			eo.shell = cmd;
			CHECK_SBX(sbx_exec_start(w->c, &no_timeout, &eo, 0, &p, &err), &err);
			drain(p, &d, 256);
			CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
			CHECK_EQ(ex.exit_code, code);
			CHECK(strcmp(d.out, want_out) == 0);
			CHECK(strcmp(d.err, want_err) == 0);
			drained_free(&d);
			sbx_proc_free(p);
			continue;
		}
		CHECK_EQ(run_sh(w->c, cmd, &out, &ex), code);
		CHECKF(strcmp(out.out, want_out) == 0 && strcmp(out.err, want_err) == 0,
		       "thread %d command %d: stdout '%s', stderr '%s'", w->n, i, out.out, out.err);
		sbx_output_free(&out);
	}
	return NULL;
}

/* 16 threads, 20 commands each, one client. */
static int case_threads(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	pthread_t t[THREADS];
	struct worker w[THREADS];
	for (int i = 0; i < THREADS; i++) {
		w[i] = (struct worker){c, i};
		CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	CHECK_EQ(sbx_client_pending(c), 0);
	sbx_client_close(c);
	return 0;
}

/* eval: printed output; a failure is SBX_ERR_EXIT with the status and stderr. */
static int case_eval(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	static const char *const sh[] = {"sh", "-c", NULL};

	CHECK_SBX(sbx_eval(c, &no_timeout, sh, "echo hi; echo note >&2", &out, &ex, &err), &err);
	CHECK(strcmp(out.out, "hi\n") == 0);
	CHECK(strcmp(out.err, "note\n") == 0);
	CHECK_EQ(ex.exit_code, 0);
	sbx_output_free(&out);

	memset(&err, 0, sizeof(err));
	CHECK(sbx_eval(c, &no_timeout, sh, "echo partial; echo 'it broke' >&2; exit 3", &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_EXIT, 3);
	CHECK_CONTAINS(err.message, "it broke");
	CHECK(strcmp(out.out, "partial\n") == 0);
	CHECK(strcmp(out.err, "it broke\n") == 0);
	CHECK_EQ(ex.exit_code, 3);
	char line[512];
	CHECK_CONTAINS(sbx_error_format(&err, line, sizeof(line)), "exit status 3: it broke");
	sbx_output_free(&out);

	/* killed: 128+N; out and ex may be NULL */
	CHECK(sbx_eval(c, &no_timeout, sh, "kill -TERM $$", NULL, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_EXIT, 128 + 15);

	/* a long stderr: the message holds its start, out->err all of it */
	CHECK(sbx_eval(c, &no_timeout, sh, "head -c 5000 /dev/zero | tr '\\0' E >&2; exit 1", &out, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_EXIT, 1);
	CHECK_EQ(out.err_len, 5000);
	CHECK(strlen(err.message) >= 100 && strlen(err.message) < sizeof(err.message));
	sbx_output_free(&out);

	/* a missing interpreter is a spawn error, not an exit status */
	static const char *const nope[] = {"no-such-interpreter", "-c", NULL};
	CHECK(sbx_eval(c, &no_timeout, nope, "1", &out, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);

	/* the default interpreter: python3 -c */
	bool have_python = run_sh(c, "command -v python3 >/dev/null", &out, &ex) == 0;
	sbx_output_free(&out);
	if (have_python) {
		CHECK_SBX(sbx_eval(c, &no_timeout, NULL, "print(6 * 7)", &out, NULL, &err), &err);
		CHECK(strcmp(out.out, "42\n") == 0);
		sbx_output_free(&out);
		CHECK(sbx_eval(c, &no_timeout, NULL, "raise ValueError('bad value')", &out, NULL, &err) < 0);
		CHECK_ERR(&err, SBX_ERR_EXIT, 1);
		CHECK_CONTAINS(err.message, "Traceback");
		CHECK_CONTAINS(out.err, "ValueError: bad value");
		sbx_output_free(&out);
	} else {
		fprintf(stderr, "no python3: the default interpreter is not tried\n");
	}
	sbx_client_close(c);
	return 0;
}

/* Signals to a streamed command; freeing a running one kills its group. */
static int case_signal_free(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char cmd[256];
	int ch;
	char b[64];

	eo.shell = "trap 'echo got-usr1; exit 11' USR1; echo ready; while :; do sleep 0.05; done";
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	CHECK_EQ(sbx_proc_read(p, &ch, b, sizeof(b), &err), 6); /* "ready\n" */
	CHECK_SBX(sbx_proc_signal(p, SIGUSR1, &err), &err);
	struct drained d;
	drain(p, &d, 100);
	CHECK(strcmp(d.out, "got-usr1\n") == 0);
	drained_free(&d);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 11);
	sbx_proc_free(p);

	const char *sleeper[] = {"sleep", "30", NULL};
	eo.shell = NULL;
	eo.argv = sleeper;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	CHECK_SBX(sbx_proc_signal(p, SIGKILL, &err), &err);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.signal, SIGKILL);
	CHECK_EQ(sbx_exit_status(&ex), 128 + SIGKILL);
	sbx_proc_free(p);

	/* a read with a short call timeout times out and leaves the command running */
	struct sbx_call_opts shortt = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 200};
	CHECK_SBX(sbx_exec_start(c, &shortt, &eo, 0, &p, &err), &err);
	CHECK(sbx_proc_read(p, &ch, b, sizeof(b), &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	CHECK(kill((pid_t)sbx_proc_pid(p), 0) == 0);
	/* freed while running (with a grandchild): the whole group goes */
	sbx_proc_free(p);

	snprintf(cmd, sizeof(cmd), "sleep 30 & echo $! > '%s'; echo $$ > '%s'; wait", it_path("gc"), it_path("pid"));
	eo.argv = NULL;
	eo.shell = cmd;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, 0, &p, &err), &err);
	unsigned gc = 0, pid = 0;
	for (int i = 0; i < 300 && (gc == 0 || pid == 0); i++) {
		it_sleep_ms(10);
		gc = read_pid(it_path("gc"));
		pid = read_pid(it_path("pid"));
	}
	CHECK(gc > 0 && pid > 0);
	sbx_proc_free(p);
	CHECKF(pid_gone(pid, 3000), "the command %u survived sbx_proc_free", pid);
	CHECKF(pid_gone(gc, 3000), "the grandchild %u survived sbx_proc_free", gc);
	sbx_client_close(c);
	return 0;
}

struct ps_find {
	const char *id;
	int found;
	struct sbx_process_info info;
	int count;
};

static int ps_find_cb(void *ud, const struct sbx_process_info *pi)
{
	struct ps_find *f = ud;
	f->count++;
	if (strcmp(pi->id, f->id) == 0) {
		f->found = 1;
		f->info = *pi;
	}
	return 0;
}

static struct ps_find ps_lookup(struct sbx_client *c, const char *id)
{
	struct ps_find f = {.id = id};
	struct sbx_error err;
	CHECK_SBX(sbx_ps(c, &no_timeout, ps_find_cb, &f, &err), &err);
	return f;
}

/* A detached process outlives its client; another attaches, waits, removes it. */
static int case_detached(void)
{
	char target[256];
	struct sbx_client *c = start("d", target, sizeof(target));
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "echo hello; echo oops >&2; while [ ! -e '%s' ]; do sleep 0.02; done; echo bye",
		 it_path("go"));
	eo.shell = cmd;
	eo.name = "job-1";
	CHECK_SBX(sbx_spawn(c, &no_timeout, &eo, &pi, &err), &err);
	CHECK(strcmp(pi.id, "job-1") == 0);
	CHECK(pi.pid > 0);
	CHECK(pi.detached);
	/* the same name twice is refused */
	CHECK(sbx_spawn(c, &no_timeout, &eo, NULL, &err) < 0);
	CHECK_EQ(err.kind, SBX_ERR_REMOTE);
	sbx_client_close(c);

	c = it_connect(target, NULL);
	struct ps_find f = ps_lookup(c, "job-1");
	CHECK(f.found);
	CHECK(f.info.running);
	CHECK_EQ(f.info.pid, pi.pid);
	CHECK_CONTAINS(f.info.argv, "echo hello");
	CHECK(f.info.started_at.sec > 1600000000);
	/* rmproc of a running process: EBUSY */
	CHECK(sbx_rmproc(c, &no_timeout, "job-1", 0, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EBUSY);

	/* replay without follow: what it printed so far, then the end of the stream */
	struct sbx_proc *p;
	struct drained d;
	it_sleep_ms(200);
	CHECK_SBX(sbx_attach(c, &no_timeout, "job-1", 0, &p, &err), &err);
	drain(p, &d, 1000);
	CHECK(strcmp(d.out, "hello\n") == 0);
	CHECK(strcmp(d.err, "oops\n") == 0);
	drained_free(&d);
	sbx_proc_free(p);
	/* waiting on such a handle waits for the process (by id); here, with a short timeout */
	struct sbx_call_opts shortt = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 300};
	CHECK_SBX(sbx_attach(c, &shortt, "job-1", 0, &p, &err), &err);
	CHECK(sbx_proc_wait(p, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	sbx_proc_free(p);

	/* follow: replay, then live, then the exit */
	CHECK_SBX(sbx_attach(c, &no_timeout, "job-1", SBX_ATTACH_FOLLOW, &p, &err), &err);
	it_write_file(it_path("go"), "");
	drain(p, &d, 1000);
	CHECK(strcmp(d.out, "hello\nbye\n") == 0);
	CHECK(strcmp(d.err, "oops\n") == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	drained_free(&d);
	sbx_proc_free(p);

	CHECK_SBX(sbx_wait(c, &no_timeout, "job-1", &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK(strcmp(ex.id, "job-1") == 0);
	f = ps_lookup(c, "job-1");
	CHECK(f.found && !f.info.running);
	CHECK_EQ(f.info.exit_code, 0);
	CHECK_SBX(sbx_rmproc(c, &no_timeout, "job-1", 0, &err), &err);
	f = ps_lookup(c, "job-1");
	CHECK(!f.found);
	CHECK(sbx_wait(c, &no_timeout, "job-1", &ex, &err) < 0);
	CHECK_EQ(err.kind, SBX_ERR_REMOTE);
	CHECK(sbx_attach(c, &no_timeout, "job-1", 0, &p, &err) < 0);
	CHECK_EQ(err.kind, SBX_ERR_REMOTE);

	/* kill by id, then rmproc with kill of a running one; generated ids */
	const char *sleeper[] = {"sleep", "30", NULL};
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	eo2.argv = sleeper;
	CHECK_SBX(sbx_spawn(c, &no_timeout, &eo2, &pi, &err), &err);
	CHECK(pi.id[0] != '\0');
	CHECK_SBX(sbx_kill(c, &no_timeout, pi.id, SIGKILL, &err), &err);
	CHECK_SBX(sbx_wait(c, &no_timeout, pi.id, &ex, &err), &err);
	CHECK_EQ(ex.signal, SIGKILL);
	CHECK_SBX(sbx_rmproc(c, &no_timeout, pi.id, 0, &err), &err);
	CHECK_SBX(sbx_spawn(c, &no_timeout, &eo2, &pi, &err), &err);
	CHECK_SBX(sbx_rmproc(c, &no_timeout, pi.id, 1, &err), &err);
	CHECKF(pid_gone(pi.pid, 3000), "rmproc with kill left pid %u", pi.pid);
	CHECK(!ps_lookup(c, pi.id).found);
	sbx_client_close(c);
	return 0;
}

/* A PTY of the given size that follows resizes; stdin reaches the terminal. */
static int case_pty(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_proc *p;
	struct sbx_exit ex = SBX_EXIT_INIT;
	char buf[4096];
	size_t len = 0;
	int ch;
	long n;

	buf[0] = '\0';
	eo.shell = "stty size; test -t 0 && test -t 1 && test -t 2 && echo tty; read line; stty size; echo got:$line";
	eo.pty = 1;
	eo.rows = 33;
	eo.cols = 101;
	CHECK_SBX(sbx_exec_start(c, &no_timeout, &eo, SBX_PROC_STDIN, &p, &err), &err);
	/* wait until the first size is out, then resize and answer the read */
	while (strstr(buf, "tty\r\n") == NULL) {
		n = sbx_proc_read(p, &ch, buf + len, sizeof(buf) - 1 - len, &err);
		CHECKF(n > 0, "read: %s", n < 0 ? it_errstr(&err) : "EOF");
		CHECK_EQ(ch, SBX_STDOUT); /* a PTY has one stream */
		len += (size_t)n;
		buf[len] = '\0';
	}
	CHECK_CONTAINS(buf, "33 101\r\n");
	CHECK_SBX(sbx_proc_resize(p, 40, 120, &err), &err);
	CHECK_SBX(sbx_proc_write(p, "abc\n", 4, &err), &err);
	while ((n = sbx_proc_read(p, &ch, buf + len, sizeof(buf) - 1 - len, &err)) > 0) {
		len += (size_t)n;
		buf[len] = '\0';
	}
	CHECK_CONTAINS(buf, "40 120\r\n");
	CHECK_CONTAINS(buf, "got:abc\r\n");
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	sbx_proc_free(p);
	sbx_client_close(c);
	return 0;
}

/* The command's own timeout: TERM to the group, then KILL after the grace period. */
static int case_timeout(void)
{
	struct sbx_client *c = start("d", NULL, 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_error err;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	const char *sleeper[] = {"sleep", "30", NULL};

	eo.argv = sleeper;
	eo.timeout_ms = 300;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECK(it_now_ms() - t0 < 3000);
	CHECK(ex.timed_out);
	CHECK_EQ(ex.signal, SIGTERM);
	CHECK(ex.duration_ns >= 300000000ull);
	sbx_output_free(&out);

	eo.argv = NULL;
	eo.shell = "trap '' TERM; sleep 30";
	eo.kill_grace_ms = 300;
	t0 = it_now_ms();
	CHECK_SBX(sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECK(it_now_ms() - t0 < 3000);
	CHECK(ex.timed_out);
	CHECK_EQ(ex.signal, SIGKILL);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"run_collect", case_run_collect},
		{"run_errors", case_run_errors},
		{"stream_channels", case_stream_channels},
		{"backpressure", case_backpressure},
		{"stdin_stream", case_stdin_stream},
		{"stdin_splice", case_stdin_splice},
		{"cancel_run", case_cancel_run},
		{"threads", case_threads},
		{"eval", case_eval},
		{"signal_free", case_signal_free},
		{"detached", case_detached},
		{"pty", case_pty},
		{"timeout", case_timeout},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
