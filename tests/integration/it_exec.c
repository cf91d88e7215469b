/* it_exec.c: commands and background processes against the real daemon, through libsbx and raw frames. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIB (1u << 20)

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* An SDK call that must fail in the shim with code; the call names its error err_. */
#define FAILS_WITH(code, call)                                                                             \
	do {                                                                                               \
		struct sbx_error err_;                                                                     \
		memset(&err_, 0, sizeof(err_));                                                            \
		if ((call) >= 0)                                                                           \
			it_fail(__FILE__, __LINE__, "%s succeeded, want %s", #call, sbx_errno_name(code)); \
		CHECK_ERR(&err_, SBX_ERR_REMOTE, code);                                                    \
	} while (0)

#define OK(call)                          \
	do {                              \
		struct sbx_error err_;    \
		CHECK_SBX((call), &err_); \
	} while (0)

static struct it_daemon *daemon_;
static const char *sock;

static struct sbx_client *start(void)
{
	sock = it_path("shim.sock");
	daemon_ = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"),
				  "--log-level", "debug", NULL);
	return it_connect(it_unix_target(sock), NULL);
}

static struct sbx_client *connect2(void)
{
	return it_connect(it_unix_target(sock), NULL);
}

/* Nothing is left running: the daemon's process table empties (the children that
 * failed are reaped as they finish dying). */
static void wait_no_processes(struct sbx_client *c)
{
	struct sbx_error err;
	struct sbx_info in = SBX_INFO_INIT;
	uint64_t t0 = it_now_ms();
	for (;;) {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.processes == 0)
			return;
		CHECKF(it_now_ms() - t0 < 10000, "%u processes left", in.processes);
		it_sleep_ms(5);
	}
}

/* Run to completion and collect (cap 0: the SDK's default). */
static void run(struct sbx_client *c, const struct sbx_exec_opts *eo, const void *in, size_t in_len, size_t cap,
		struct sbx_output *out, struct sbx_exit *ex)
{
	struct sbx_error err;
	memset(out, 0, sizeof(*out));
	CHECK_SBX(sbx_run(c, NULL, eo, in, in_len, cap, out, ex, &err), &err);
}

static void run_sh(struct sbx_client *c, const char *cmd, struct sbx_output *out, struct sbx_exit *ex)
{
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	run(c, &eo, NULL, 0, 0, out, ex);
}

static void check_bytes(const char *what, const char *got, size_t got_len, const char *want, size_t want_len)
{
	CHECKF(got_len == want_len && (want_len == 0 || memcmp(got, want, want_len) == 0),
	       "%s: got %zu bytes, want %zu (\"%.*s\")", what, got_len, want_len, (int)(got_len < 200 ? got_len : 200),
	       got ? got : "");
}

static long vm_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	CHECK(f != NULL);
	long kb = -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void write_bytes(const char *path, const void *buf, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	CHECK(fd >= 0);
	CHECK(write(fd, buf, len) == (ssize_t)len);
	CHECK(close(fd) == 0);
}

/* Read a proc's output until both streams end: stdout and stderr into growing buffers. */
struct sink {
	char *b[2];
	size_t len[2], cap[2];
};

static void sink_add(struct sink *s, int ch, const void *buf, size_t n)
{
	if (s->len[ch] + n + 1 > s->cap[ch]) {
		s->cap[ch] = (s->len[ch] + n + 1) * 2;
		s->b[ch] = realloc(s->b[ch], s->cap[ch]);
		CHECK(s->b[ch] != NULL);
	}
	memcpy(s->b[ch] + s->len[ch], buf, n);
	s->len[ch] += n;
	s->b[ch][s->len[ch]] = '\0';
}

static void sink_free(struct sink *s)
{
	free(s->b[0]);
	free(s->b[1]);
	memset(s, 0, sizeof(*s));
}

static void read_all(struct sbx_proc *p, struct sink *s)
{
	static char buf[256 << 10];
	for (;;) {
		struct sbx_error err;
		int ch = 0;
		long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
		CHECKF(n >= 0, "sbx_proc_read: %s", it_errstr(&err));
		if (n == 0)
			return;
		CHECK(ch == SBX_STDOUT || ch == SBX_STDERR);
		sink_add(s, ch == SBX_STDERR, buf, (size_t)n);
	}
}

/* Read stdout until it contains want (or fail). */
static void read_until(struct sbx_proc *p, struct sink *s, const char *want)
{
	char buf[4096];
	uint64_t deadline = it_now_ms() + 10000;
	while (s->b[0] == NULL || strstr(s->b[0], want) == NULL) {
		CHECKF(it_now_ms() < deadline, "no \"%s\" in the output: \"%s\"", want, s->b[0] ? s->b[0] : "");
		struct sbx_error err;
		int ch = 0;
		long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
		CHECKF(n > 0, "sbx_proc_read: %ld: %s (have \"%s\")", n, it_errstr(&err), s->b[0] ? s->b[0] : "");
		sink_add(s, ch == SBX_STDERR, buf, (size_t)n);
	}
}

/* ---- cases ---- */

static int case_argv_shell(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;

	/* argv: no shell; NUL bytes and no trailing newline arrive as they are */
	const char *argv[] = {"printf", "a\\0b", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	run(c, &eo, NULL, 0, 0, &out, &ex);
	check_bytes("argv stdout", out.out, out.out_len, "a\0b", 3);
	check_bytes("argv stderr", out.err, out.err_len, "", 0);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(ex.signal, 0);
	CHECK(ex.pid > 0);
	CHECK(ex.id[0] != '\0');
	CHECK(ex.duration_ns > 0);
	sbx_output_free(&out);

	/* argv words are not split or expanded */
	const char *argv2[] = {"/bin/echo", "$HOME", "a  b", "*", NULL};
	eo.argv = argv2;
	run(c, &eo, NULL, 0, 0, &out, &ex);
	check_bytes("echo", out.out, out.out_len, "$HOME a  b *\n", 13);
	sbx_output_free(&out);

	/* shell: stdout and stderr kept apart, byte-exact */
	run_sh(c, "printf 'x\\0y'; printf 'e\\0' >&2; printf z", &out, &ex);
	check_bytes("shell stdout", out.out, out.out_len, "x\0yz", 4);
	check_bytes("shell stderr", out.err, out.err_len, "e\0", 2);
	CHECK_EQ(ex.exit_code, 0);
	sbx_output_free(&out);

	/* without stdin asked for, stdin is /dev/null */
	const char *cat[] = {"cat", NULL};
	struct sbx_exec_opts eo4 = SBX_EXEC_OPTS_INIT;
	eo4.argv = cat;
	run(c, &eo4, NULL, 0, 0, &out, &ex);
	CHECK_EQ(out.out_len, 0);
	CHECK_EQ(ex.exit_code, 0);
	sbx_output_free(&out);

	/* a user (even our own) takes the fork() path rather than the vfork one */
	struct sbx_exec_opts eo3 = SBX_EXEC_OPTS_INIT;
	eo3.shell = "id -u; printf x >&2";
	eo3.user = "0";
	run(c, &eo3, NULL, 0, 0, &out, &ex);
	check_bytes("user 0", out.out, out.out_len, "0\n", 2);
	check_bytes("user 0 stderr", out.err, out.err_len, "x", 1);
	sbx_output_free(&out);

	run_sh(c, "exit 42", &out, &ex);
	CHECK_EQ(ex.exit_code, 42);
	CHECK_EQ(ex.signal, 0);
	CHECK_EQ(sbx_exit_status(&ex), 42);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

static int case_signal_exit(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	run_sh(c, "kill -9 $$", &out, &ex);
	CHECK_EQ(ex.exit_code, -1);
	CHECK_EQ(ex.signal, 9);
	CHECK_EQ(ex.core_dumped, 0);
	CHECK_EQ(ex.timed_out, 0);
	CHECK_EQ(sbx_exit_status(&ex), 137);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

static int case_core(void)
{
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_CORE, &rl) == 0);
	if (rl.rlim_max == 0) {
		printf("core dumps are not allowed here (hard limit 0): skipped\n");
		return IT_SKIP;
	}
	char pattern[256] = "";
	FILE *f = fopen("/proc/sys/kernel/core_pattern", "re");
	if (f != NULL) {
		if (fgets(pattern, sizeof(pattern), f) == NULL)
			pattern[0] = '\0';
		fclose(f);
	}
	struct sbx_client *c = start();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "ulimit -c unlimited && kill -SEGV $$";
	eo.cwd = it_dir();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	run(c, &eo, NULL, 0, 0, &out, &ex);
	CHECK_EQ(ex.signal, SIGSEGV);
	CHECK_EQ(ex.exit_code, -1);
	if (!ex.core_dumped) {
		/* e.g. a core_pattern pipe to a helper that refused */
		printf("no core dumped (core_pattern %s): skipped\n", pattern);
		sbx_output_free(&out);
		sbx_client_close(c);
		return IT_SKIP;
	}
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

static int case_env_cwd(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;

	/* added to the shim's environment, replacing a variable of the same name */
	const char *env[] = {"FOO=bar baz", "PATH=/usr/bin:/bin", NULL};
	eo.env = env;
	eo.shell = "printf '%s|%s|%s' \"$FOO\" \"$PATH\" \"${HOME+set}\"";
	run(c, &eo, NULL, 0, 0, &out, &ex);
	check_bytes("env add", out.out, out.out_len, "bar baz|/usr/bin:/bin|set", 25);
	sbx_output_free(&out);

	/* clear_env: only what was given, plus a default PATH */
	const char *env2[] = {"A=1", "B==2", NULL};
	const char *argv[] = {"env", NULL};
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	eo2.argv = argv;
	eo2.env = env2;
	eo2.clear_env = 1;
	run(c, &eo2, NULL, 0, 0, &out, &ex);
	const char want[] = "A=1\nB==2\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n";
	check_bytes("clear_env", out.out, out.out_len, want, sizeof(want) - 1);
	sbx_output_free(&out);

	/* a bad entry is refused */
	const char *env3[] = {"NOEQUALS", NULL};
	eo2.env = env3;
	struct sbx_error err;
	memset(&out, 0, sizeof(out));
	CHECK(sbx_run(c, NULL, &eo2, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);

	/* cwd (default "/") */
	struct sbx_exec_opts eo3 = SBX_EXEC_OPTS_INIT;
	eo3.shell = "pwd -P";
	run(c, &eo3, NULL, 0, 0, &out, &ex);
	check_bytes("default cwd", out.out, out.out_len, "/\n", 2);
	sbx_output_free(&out);
	char real[4096], want_cwd[4200];
	CHECK(realpath(it_dir(), real) != NULL);
	snprintf(want_cwd, sizeof(want_cwd), "%s\n", real);
	eo3.cwd = it_dir();
	run(c, &eo3, NULL, 0, 0, &out, &ex);
	check_bytes("cwd", out.out, out.out_len, want_cwd, strlen(want_cwd));
	sbx_output_free(&out);

	/* relative program paths resolve in the cwd */
	write_bytes(it_path("hello.sh"), "#!/bin/sh\necho hello from $0\n", 29, 0755);
	const char *argv4[] = {"./hello.sh", NULL};
	struct sbx_exec_opts eo4 = SBX_EXEC_OPTS_INIT;
	eo4.argv = argv4;
	eo4.cwd = it_dir();
	run(c, &eo4, NULL, 0, 0, &out, &ex);
	check_bytes("./hello.sh", out.out, out.out_len, "hello from ./hello.sh\n", 22);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

/* Failures in the child itself, after a vfork (a local ELF program, no user): the
 * child reports them in the memory it shares with the daemon, not through a pipe
 * (a fork after all, on a slow machine, reports the same through the pipe). */
static int case_child_errors(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;

	/* "\177ELF" and then nothing an ELF loader takes: execve() says ENOEXEC */
	static const char junk[] = "\177ELF\1\1\1\0 not an ELF file at all";
	write_bytes(it_path("junk-elf"), junk, sizeof(junk) - 1, 0755);
	const char *a1[] = {it_path("junk-elf"), NULL};
	eo.argv = a1;
	memset(&out, 0, sizeof(out));
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOEXEC);
	CHECK(strcmp(err.path, it_path("junk-elf")) == 0);
	CHECK_CONTAINS(err.message, "execve");

	/* a hard RLIMIT_NOFILE above fs.nr_open: setrlimit() fails in the child, even as root */
	unsigned long long nr_open = 1ull << 30;
	FILE *f = fopen("/proc/sys/fs/nr_open", "r");
	if (f != NULL) {
		if (fscanf(f, "%llu", &nr_open) != 1)
			nr_open = 1ull << 30;
		fclose(f);
	}
	struct sbx_rlimit rl = {.name = "nofile", .soft = nr_open + 1, .hard = nr_open + 1};
	const char *a2[] = {"/bin/true", NULL};
	eo.argv = a2;
	eo.rlimits = &rl;
	eo.n_rlimits = 1;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	CHECK_CONTAINS(err.message, "setrlimit(nofile)");

	/* the same for a detached process: the spawn fails, no process is left */
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	CHECK(sbx_spawn(c, NULL, &eo, &pi, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
	eo.rlimits = NULL;
	eo.n_rlimits = 0;
	eo.argv = a1;
	CHECK(sbx_spawn(c, NULL, &eo, &pi, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOEXEC);

	/* and a good one right after, through the same path */
	eo.argv = a2;
	memset(&out, 0, sizeof(out));
	run(c, &eo, NULL, 0, 0, &out, &ex);
	CHECK(ex.exit_code == 0);
	sbx_output_free(&out);
	wait_no_processes(c);
	sbx_client_close(c);
	return 0;
}

static int case_spawn_errors(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;

	/* errors with the real errno, never an exit code */
	const char *a1[] = {"/no/such", NULL};
	eo.argv = a1;
	memset(&out, 0, sizeof(out));
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, "/no/such") == 0);
	CHECK_CONTAINS(err.message, "execve");

	const char *a2[] = {"no-such-program-xyz", NULL};
	eo.argv = a2;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, "no-such-program-xyz") == 0);

	write_bytes(it_path("noexec"), "#!/bin/sh\necho no\n", 18, 0644);
	const char *a3[] = {it_path("noexec"), NULL};
	eo.argv = a3;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	CHECK(strcmp(err.path, it_path("noexec")) == 0);

	const char *a4[] = {it_dir(), NULL}; /* a directory */
	eo.argv = a4;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);

	/* a PATH holding only a non-executable match */
	char envpath[4200];
	snprintf(envpath, sizeof(envpath), "PATH=%s", it_dir());
	const char *env[] = {envpath, NULL};
	const char *a5[] = {"noexec", NULL};
	eo.argv = a5;
	eo.env = env;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EACCES);
	eo.env = NULL;

	const char *a6[] = {"true", NULL};
	eo.argv = a6;
	eo.cwd = it_path("missing-dir");
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, it_path("missing-dir")) == 0);
	eo.cwd = it_path("noexec");
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOTDIR);
	eo.cwd = "relative";
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);

	/* an unknown user */
	eo.cwd = NULL;
	eo.user = "no-such-user-xyz";
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);

	/* the client and the daemon go on; nothing is left running */
	run_sh(c, "echo ok", &out, &ex);
	check_bytes("after errors", out.out, out.out_len, "ok\n", 3);
	sbx_output_free(&out);
	/* (the children that failed are reaped as they finish dying) */
	wait_no_processes(c);
	sbx_client_close(c);
	return 0;
}

struct feeder {
	struct sbx_proc *p;
	const uint8_t *buf;
	size_t len;
	int rc;
	struct sbx_error err;
};

static void *feed_main(void *arg)
{
	struct feeder *f = arg;
	f->rc = 0;
	for (size_t off = 0; off < f->len && f->rc == 0;) {
		size_t n = f->len - off < 100000 ? f->len - off : 100000; /* odd sizes on purpose */
		f->rc = sbx_proc_write(f->p, f->buf + off, n, &f->err);
		off += n;
	}
	if (f->rc == 0)
		f->rc = sbx_proc_close_stdin(f->p, &f->err);
	return NULL;
}

/* 1 MiB of binary through cat (stdin streamed and closed), on stdout and on stderr. */
static int case_stdin_binary(void)
{
	struct sbx_client *c = start();
	size_t len = MIB + 12345;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 42);
	for (int to_err = 0; to_err < 2; to_err++) {
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.shell = to_err ? "cat >&2" : "cat";
		struct sbx_proc *p;
		struct sbx_error err;
		CHECK_SBX(sbx_exec_start(c, NULL, &eo, SBX_PROC_STDIN, &p, &err), &err);
		CHECK(sbx_proc_pid(p) > 0);
		struct feeder f = {.p = p, .buf = data, .len = len};
		pthread_t th;
		CHECK(pthread_create(&th, NULL, feed_main, &f) == 0);
		struct sink s = {0};
		read_all(p, &s);
		CHECK(pthread_join(th, NULL) == 0);
		CHECKF(f.rc == 0, "feeding stdin: %s", it_errstr(&f.err));
		struct sbx_exit ex = SBX_EXIT_INIT;
		CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
		CHECK_EQ(ex.exit_code, 0);
		check_bytes(to_err ? "stderr" : "stdout", s.b[to_err], s.len[to_err], (const char *)data, len);
		CHECK_EQ(s.len[1 - to_err], 0);
		sink_free(&s);
		sbx_proc_free(p);
	}
	/* sbx_run feeds stdin too */
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"cat", NULL};
	eo.argv = argv;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	run(c, &eo, data, len, 0, &out, &ex);
	check_bytes("sbx_run cat", out.out, out.out_len, (const char *)data, len);
	sbx_output_free(&out);
	free(data);
	sbx_client_close(c);
	return 0;
}

static int case_timeout(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"sleep", "30", NULL};
	eo.argv = argv;
	eo.timeout_ms = 200;
	uint64_t t0 = it_now_ms();
	run(c, &eo, NULL, 0, 0, &out, &ex);
	uint64_t dt = it_now_ms() - t0;
	printf("sleep 30 with a 200 ms timeout: ended after %llu ms\n", (unsigned long long)dt);
	CHECK(ex.timed_out);
	CHECK_EQ(ex.signal, SIGTERM);
	CHECK_EQ(ex.exit_code, -1);
	CHECK(dt >= 190 && dt < 1500);
	sbx_output_free(&out);

	/* TERM ignored: SIGKILL after the grace period */
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	eo2.shell = "trap '' TERM; sleep 30";
	eo2.timeout_ms = 200;
	eo2.kill_grace_ms = 300;
	t0 = it_now_ms();
	run(c, &eo2, NULL, 0, 0, &out, &ex);
	dt = it_now_ms() - t0;
	printf("TERM trapped, grace 300 ms: ended after %llu ms\n", (unsigned long long)dt);
	CHECK(ex.timed_out);
	CHECK_EQ(ex.signal, SIGKILL);
	CHECK(dt >= 480 && dt < 2000);
	sbx_output_free(&out);

	/* a command that ends in time did not time out */
	struct sbx_exec_opts eo3 = SBX_EXEC_OPTS_INIT;
	eo3.shell = "exit 3";
	eo3.timeout_ms = 5000;
	run(c, &eo3, NULL, 0, 0, &out, &ex);
	CHECK(!ex.timed_out);
	CHECK_EQ(ex.exit_code, 3);
	sbx_output_free(&out);

	/* the timeout reaches a grandchild holding the output pipe */
	struct sbx_exec_opts eo4 = SBX_EXEC_OPTS_INIT;
	eo4.shell = "sleep 30 & echo $!; wait";
	eo4.timeout_ms = 200;
	run(c, &eo4, NULL, 0, 0, &out, &ex);
	CHECK(ex.timed_out);
	pid_t gc = (pid_t)atoi(out.out);
	CHECK(gc > 0);
	t0 = it_now_ms();
	while (kill(gc, 0) == 0) {
		CHECKF(it_now_ms() - t0 < 1000, "grandchild %d still there 1 s after the timeout", (int)gc);
		it_sleep_ms(5);
	}
	CHECK_EQ(errno, ESRCH);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

/* The timeout's SIGTERM goes to the whole process group, not only to the leader: a member
 * that traps TERM must see it at once, long before the grace period's SIGKILL (a shim that
 * signalled only the leader would SIGKILL the member at the end of the grace, or as soon as
 * the output closes, without its trap ever running). */
static int case_timeout_group(void)
{
	struct sbx_client *c = start();
	const char *mark = it_path("term"), *armed = it_path("armed");
	char cmd[1024];
	/* the member: its own sh in the leader's group, noting TERM in mark; the leader waits */
	snprintf(cmd, sizeof(cmd),
		 "sh -c 'trap \"echo TERM >> %s; exit 0\" TERM; echo $$ > %s; while :; do sleep 1; done' & wait", mark,
		 armed);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	eo.timeout_ms = 500;
	eo.kill_grace_ms = 5000;
	for (int attempt = 0;; attempt++) {
		unlink(mark);
		unlink(armed);
		struct sbx_output out;
		struct sbx_exit ex = SBX_EXIT_INIT;
		uint64_t t0 = it_now_ms();
		run(c, &eo, NULL, 0, 0, &out, &ex);
		uint64_t dt = it_now_ms() - t0;
		sbx_output_free(&out);
		CHECK(ex.timed_out);
		CHECK_EQ(ex.signal, SIGTERM); /* the leader: default action */
		size_t len = 0;
		char got[64] = "";
		int fd = open(mark, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			ssize_t n = read(fd, got, sizeof(got) - 1);
			len = n > 0 ? (size_t)n : 0;
			got[len] = '\0';
			close(fd);
		}
		if (len == 0 && access(armed, F_OK) < 0 && attempt < 3) {
			/* the machine stalled for the whole timeout before the member had set its
			 * trap (the TERM then killed it): that proves nothing, try again */
			printf("the member had not set its trap after %d ms: again\n", eo.timeout_ms);
			eo.timeout_ms *= 2;
			continue;
		}
		printf("timeout %d ms, grace %d ms: the group's TERM trap ran, the command ended after %llu ms\n",
		       eo.timeout_ms, eo.kill_grace_ms, (unsigned long long)dt);
		CHECKF(strcmp(got, "TERM\n") == 0,
		       "the group member's TERM trap did not run (\"%s\" in %s): the timeout's SIGTERM missed the group",
		       got, mark);
		/* the member ended on its trap, so nothing waited for the grace's SIGKILL */
		CHECKF(dt < (uint64_t)eo.timeout_ms + 2500, "the command ended after %llu ms, grace %d ms",
		       (unsigned long long)dt, eo.kill_grace_ms);
		break;
	}
	sbx_client_close(c);
	return 0;
}

/* Cancel kills the whole group, a background grandchild too. */
static int case_cancel_group(void)
{
	struct sbx_client *c = start();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "sleep 300 & echo $!; wait";
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	pid_t leader = (pid_t)sbx_proc_pid(p);
	struct sink s = {0};
	read_until(p, &s, "\n");
	pid_t gc = (pid_t)atoi(s.b[0]);
	CHECK(gc > 0 && gc != leader);
	CHECK(kill(gc, 0) == 0);
	CHECK_EQ(getpgid(gc), leader);
	uint64_t t0 = it_now_ms();
	sbx_proc_free(p); /* CANCEL */
	while (kill(gc, 0) == 0 || kill(leader, 0) == 0) {
		CHECKF(it_now_ms() - t0 < 1000, "process group still there 1 s after the cancel");
		it_sleep_ms(5);
	}
	printf("group gone %llu ms after the cancel\n", (unsigned long long)(it_now_ms() - t0));
	sink_free(&s);

	/* a lost connection does the same */
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	leader = (pid_t)sbx_proc_pid(p);
	read_until(p, &s, "\n");
	gc = (pid_t)atoi(s.b[0]);
	sbx_proc_free(p);
	sbx_client_close(c);
	t0 = it_now_ms();
	while (kill(gc, 0) == 0 || kill(leader, 0) == 0) {
		CHECKF(it_now_ms() - t0 < 1000, "process group still there 1 s after the disconnect");
		it_sleep_ms(5);
	}
	sink_free(&s);

	c = connect2();
	struct sbx_info in = SBX_INFO_INIT;
	t0 = it_now_ms();
	for (;;) {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.processes == 0)
			break;
		CHECKF(it_now_ms() - t0 < 2000, "%u processes left", in.processes);
		it_sleep_ms(5);
	}
	sbx_client_close(c);
	return 0;
}

/* With --root, the cwd resolves beneath the root (the command itself is not confined). */
static int case_root_cwd(void)
{
	const char *root = it_path("root");
	CHECK(mkdir(root, 0755) == 0);
	CHECK(mkdir(it_path("root/sub"), 0755) == 0);
	CHECK(symlink("/sub", it_path("root/abs-link")) == 0);
	sock = it_path("shim.sock");
	daemon_ = it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), "--root",
				  root, NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	char real[4096], want[4200];
	CHECK(realpath(root, real) != NULL);
	const char *cwds[] = {NULL, "/sub", "/abs-link", "/../../sub"};
	const char *subs[] = {"", "/sub", "/sub", "/sub"};
	for (size_t i = 0; i < ARRAY_LEN(cwds); i++) {
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.shell = "pwd -P";
		eo.cwd = cwds[i];
		struct sbx_output out;
		struct sbx_exit ex = SBX_EXIT_INIT;
		run(c, &eo, NULL, 0, 0, &out, &ex);
		snprintf(want, sizeof(want), "%s%s\n", real, subs[i]);
		check_bytes(cwds[i] ? cwds[i] : "(default)", out.out, out.out_len, want, strlen(want));
		sbx_output_free(&out);
	}
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "true";
	eo.cwd = "/nope";
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	CHECK(strcmp(err.path, "/nope") == 0);
	sbx_client_close(c);
	return 0;
}

/* A background child that keeps stdout open does not hold the stream up: it ends
 * 100 ms after the command's exit, and the child lives on. */
static int case_linger(void)
{
	struct sbx_client *c = start();
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	uint64_t t0 = it_now_ms();
	run_sh(c, "sleep 30 & echo $!; printf done", &out, &ex);
	uint64_t dt = it_now_ms() - t0;
	printf("ended %llu ms after the start\n", (unsigned long long)dt);
	CHECK(dt < 1000);
	CHECK_EQ(ex.exit_code, 0);
	pid_t bg = (pid_t)atoi(out.out);
	CHECK(bg > 0);
	CHECK(strstr(out.out, "\ndone") != NULL);
	CHECK(kill(bg, 0) == 0);
	CHECK(kill(bg, SIGKILL) == 0);
	sbx_output_free(&out);

	/* output written just before the exit is all there */
	run_sh(c, "head -c 300000 /dev/zero; sleep 30 & echo $! >&2; exit 0", &out, &ex);
	CHECK_EQ(out.out_len, 300000);
	bg = (pid_t)atoi(out.err);
	CHECK(bg > 0 && kill(bg, SIGKILL) == 0);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

/* An attached client that reads nothing does not hold the process up. */
static int case_attach_slow(void)
{
	struct sbx_client *c = start(), *c2 = connect2();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "sleep 0.3; head -c 20M /dev/zero; echo end";
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	struct sbx_proc *p;
	CHECK_SBX(sbx_attach(c, NULL, pi.id, SBX_ATTACH_FOLLOW, &p, &err), &err);
	struct sbx_exit ex = SBX_EXIT_INIT;
	uint64_t t0 = it_now_ms();
	CHECK_SBX(sbx_wait(c2, NULL, pi.id, &ex, &err), &err);
	printf("the writer ended after %llu ms with nobody reading\n", (unsigned long long)(it_now_ms() - t0));
	CHECK(it_now_ms() - t0 < 5000);
	CHECK_EQ(ex.exit_code, 0);
	struct sink s = {0};
	read_all(p, &s);
	printf("the attached client got %zu of %u bytes\n", s.len[0], (20u << 20) + 4);
	CHECK(s.len[0] >= MIB && s.len[0] < (20u << 20));
	CHECK(memcmp(s.b[0] + s.len[0] - 4, "end\n", 4) == 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	sink_free(&s);
	sbx_proc_free(p);
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

struct ps_find {
	const char *id;
	struct sbx_process_info info;
	int found;
	int total;
};

static int ps_cb(void *ud, const struct sbx_process_info *pi)
{
	struct ps_find *f = ud;
	f->total++;
	if (strcmp(pi->id, f->id) == 0) {
		f->info = *pi;
		f->found = 1;
	}
	return 0;
}

static struct ps_find ps_lookup(struct sbx_client *c, const char *id)
{
	struct ps_find f = {.id = id};
	struct sbx_error err;
	CHECK_SBX(sbx_ps(c, NULL, ps_cb, &f, &err), &err);
	return f;
}

/* Foreground commands have ids: listed while they run, signalled from elsewhere. */
static int case_signal_by_id(void)
{
	struct sbx_client *c = start(), *c2 = connect2();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"sleep", "30", NULL};
	eo.argv = argv;
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	const char *id = sbx_proc_id(p);
	CHECK(id[0] != '\0');
	struct ps_find f = ps_lookup(c2, id);
	CHECK(f.found && f.info.running && !f.info.detached);
	CHECK_EQ(f.info.pid, sbx_proc_pid(p));
	CHECK_CONTAINS(f.info.argv, "sleep 30");
	struct sbx_info in = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c2, NULL, &in, &err), &err);
	CHECK_EQ(in.processes, 1);

	CHECK_SBX(sbx_kill(c2, NULL, id, SIGTERM, &err), &err);
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.signal, SIGTERM);
	CHECK(!ex.timed_out);
	CHECK(strcmp(ex.id, id) == 0);
	/* gone from the table once it has exited */
	FAILS_WITH(ENOENT, sbx_kill(c2, NULL, id, SIGTERM, &err_));
	CHECK(!ps_lookup(c2, id).found);
	sbx_proc_free(p);

	/* only the leader */
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	eo2.shell = "trap 'echo got USR1; exit 7' USR1; sleep 30 & wait";
	CHECK_SBX(sbx_exec_start(c, NULL, &eo2, 0, &p, &err), &err);
	it_sleep_ms(100); /* let the shell set its trap */
	CHECK_SBX(sbx_proc_signal(p, SIGUSR1, &err), &err);
	struct sink s = {0};
	read_all(p, &s);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 7);
	check_bytes("trap", s.b[0], s.len[0], "got USR1\n", 9);
	sink_free(&s);
	sbx_proc_free(p);

	FAILS_WITH(ENOENT, sbx_kill(c2, NULL, "no-such-id", SIGTERM, &err_));
	FAILS_WITH(EINVAL, sbx_kill(c2, NULL, "no-such-id", 999, &err_));
	sbx_client_close(c2);
	sbx_client_close(c);
	return 0;
}

/* A client that reads nothing for a while: the command blocks on its pipe, the
 * daemon's memory stays bounded, and every byte arrives. */
/* Stdout goes straight from the pipe to the socket when nothing is queued, stderr
 * is queued: both interleaved, with the client late to read (the socket full, frames
 * taken in part), each channel's bytes exact and in order; then a stream cancelled
 * while its output flows leaves the connection working. */
static int case_stdout_direct(void)
{
	struct sbx_client *c = start();
	size_t blk = 300000; /* not a multiple of a frame or a pipe */
	uint8_t *d1 = malloc(blk), *d2 = malloc(blk / 3);
	CHECK(d1 != NULL && d2 != NULL);
	it_fill(d1, blk, 11);
	it_fill(d2, blk / 3, 12);
	write_bytes(it_path("d1"), d1, blk, 0644);
	write_bytes(it_path("d2"), d2, blk / 3, 0644);
	char cmd[9000];
	snprintf(cmd, sizeof(cmd), "for i in $(seq 24); do cat '%s'; cat '%s' >&2; done", it_path("d1"), it_path("d2"));
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	it_sleep_ms(300); /* late on purpose: the output piles up in the socket */
	static char buf[100000];
	size_t got[3] = {0, 0, 0};
	for (;;) {
		int ch = 0;
		long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
		CHECKF(n >= 0, "read: %s", it_errstr(&err));
		if (n == 0)
			break;
		CHECK(ch == SBX_STDOUT || ch == SBX_STDERR);
		const uint8_t *want = ch == SBX_STDOUT ? d1 : d2;
		size_t len = ch == SBX_STDOUT ? blk : blk / 3;
		for (long off = 0; off < n; off++, got[ch]++)
			CHECKF((uint8_t)buf[off] == want[got[ch] % len], "channel %d: byte %zu differs", ch, got[ch]);
	}
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(got[SBX_STDOUT], 24 * blk);
	CHECK_EQ(got[SBX_STDERR], 24 * (blk / 3));
	sbx_proc_free(p);

	/* cancelled in the middle of its output */
	eo.shell = "while :; do cat /dev/zero; done";
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	int ch = 0;
	long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
	CHECKF(n > 0, "read: %s", it_errstr(&err));
	it_sleep_ms(50);
	sbx_proc_free(p); /* CANCEL */
	struct sbx_output out;
	run_sh(c, "echo ok", &out, &ex);
	check_bytes("after the cancel", out.out, out.out_len, "ok\n", 3);
	sbx_output_free(&out);
	free(d1);
	free(d2);
	sbx_client_close(c);
	return 0;
}

/* A field of /proc/PID/io ("rchar", "wchar"). */
static long long proc_io(pid_t pid, const char *field)
{
	char path[64], line[256], key[32];
	snprintf(path, sizeof(path), "/proc/%d/io", (int)pid);
	FILE *f = fopen(path, "re");
	CHECK(f != NULL);
	long long v = -1, x;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "%31[a-z_]: %lld", key, &x) == 2 && strcmp(key, field) == 0)
			v = x;
	fclose(f);
	CHECK(v >= 0);
	return v;
}

/* Wait until process pid sleeps in write(2) (its pipe is full). */
static void wait_blocked_in_write(pid_t pid)
{
	char path[64], buf[128];
	snprintf(path, sizeof(path), "/proc/%d/syscall", (int)pid);
	uint64_t until = it_now_ms() + 20000;
	for (;;) {
		CHECK(it_read_text(path, buf, sizeof(buf)) > 0);
		if (atol(buf) == SYS_write)
			return;
		CHECKF(it_now_ms() < until, "process %d never blocked writing (%s)", (int)pid, buf);
		it_sleep_ms(1);
	}
}

/* Bulk stdout goes from the command's pipe to the client by splice: every byte arrives,
 * in order, and the daemon does not read(2) most of them itself. Its /proc/PID/io rchar
 * counts what it read, plus what its reaped children read (cat: the file, and a few KB
 * of its libraries); the client reads 1 MiB at a time and, between, waits until cat is
 * stuck on a full pipe, so the daemon always finds a full one when credit comes. */
static int case_stdout_spliced(void)
{
	struct sbx_client *c = start();
	size_t len = 16 * MIB;
	uint8_t *data = malloc(len), *got = malloc(len);
	CHECK(data != NULL && got != NULL);
	it_fill(data, len, 23);
	write_bytes(it_path("big"), data, len, 0644);
	const char *argv[] = {"cat", it_path("big"), NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	long long r0 = proc_io(daemon_->pid, "rchar");
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	pid_t pid = (pid_t)sbx_proc_pid(p);
	CHECK(pid > 0);
	size_t total = 0, mark = 0;
	for (;;) {
		if (total >= mark && mark < len - MIB) {
			wait_blocked_in_write(pid);
			mark += MIB;
		}
		int ch = 0;
		static uint8_t extra[64]; /* the EOF, or bytes beyond len (counted, and failed below) */
		long n = total < len ? sbx_proc_read(p, &ch, got + total, len - total < MIB ? len - total : MIB, &err) :
				       sbx_proc_read(p, &ch, extra, sizeof(extra), &err);
		CHECKF(n >= 0, "read: %s", it_errstr(&err));
		if (n == 0)
			break;
		CHECK_EQ(ch, SBX_STDOUT);
		total += (size_t)n;
		CHECK(total <= len);
	}
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(total, len);
	CHECK(memcmp(got, data, len) == 0);
	sbx_proc_free(p);
	/* cat's exit is reported once it is reaped, so its reads are counted by now */
	long long own = proc_io(daemon_->pid, "rchar") - r0 - (long long)len;
	printf("16 MiB of stdout: the daemon read %lld bytes itself\n", own);
	CHECKF(own < (long long)len / 2, "the daemon read %lld of %zu bytes itself", own, len);
	free(data);
	free(got);
	sbx_client_close(c);
	return 0;
}

static int case_backpressure(void)
{
	struct sbx_client *c = start();
	size_t blk = MIB;
	uint8_t *data = malloc(blk);
	CHECK(data != NULL);
	it_fill(data, blk, 7);
	write_bytes(it_path("blk"), data, blk, 0644);
	char cmd[4400];
	snprintf(cmd, sizeof(cmd), "for i in $(seq 64); do cat '%s'; done", it_path("blk"));
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	/* warm the daemon up first, so the peak below is this command's doing */
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	run_sh(c, "head -c 4000000 /dev/zero", &out, &ex);
	sbx_output_free(&out);
	long hwm0 = vm_hwm_kb(daemon_->pid);

	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo, 0, &p, &err), &err);
	it_sleep_ms(500);
	static char buf[256 << 10];
	size_t total = 0;
	uint8_t *cur = malloc(blk);
	CHECK(cur != NULL);
	size_t in_blk = 0;
	for (;;) {
		int ch = 0;
		long n = sbx_proc_read(p, &ch, buf, sizeof(buf), &err);
		CHECKF(n >= 0, "read: %s", it_errstr(&err));
		if (n == 0)
			break;
		CHECK_EQ(ch, SBX_STDOUT);
		for (long off = 0; off < n;) {
			size_t k = blk - in_blk < (size_t)(n - off) ? blk - in_blk : (size_t)(n - off);
			memcpy(cur + in_blk, buf + off, k);
			in_blk += k;
			off += (long)k;
			if (in_blk == blk) {
				CHECKF(memcmp(cur, data, blk) == 0, "block %zu differs", total / blk);
				in_blk = 0;
			}
			total += k;
		}
	}
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECK_EQ(total, 64 * blk);
	long hwm1 = vm_hwm_kb(daemon_->pid);
	printf("64 MiB through a paused reader: daemon VmHWM %ld -> %ld kB (+%ld kB)\n", hwm0, hwm1, hwm1 - hwm0);
	if (!UNDER_ASAN)
		CHECKF(hwm1 - hwm0 < 8 * 1024, "VmHWM grew by %ld kB", hwm1 - hwm0);
	sbx_proc_free(p);
	free(cur);
	free(data);
	sbx_client_close(c);
	return 0;
}

static int case_output_cap(void)
{
	struct sbx_client *c = start();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "head -c 10M /dev/zero; head -c 3000 /dev/zero >&2";
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	uint64_t t0 = it_now_ms();
	run(c, &eo, NULL, 0, MIB, &out, &ex);
	uint64_t dt = it_now_ms() - t0;
	printf("10 MiB with a 1 MiB cap: %llu ms\n", (unsigned long long)dt);
	CHECK_EQ(out.out_len, MIB);
	CHECK_EQ(out.err_len, 3000);
	CHECK(ex.stdout_truncated);
	CHECK(!ex.stderr_truncated);
	CHECK_EQ(ex.exit_code, 0);
	CHECK(dt < 3000);
	for (size_t i = 0; i < out.out_len; i++)
		CHECK(out.out[i] == 0);
	sbx_output_free(&out);

	/* exactly the cap: not truncated */
	eo.shell = "head -c 1000 /dev/zero";
	run(c, &eo, NULL, 0, 1000, &out, &ex);
	CHECK_EQ(out.out_len, 1000);
	CHECK(!ex.stdout_truncated);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

static int case_pty(void)
{
	struct sbx_client *c = start();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"tty", NULL};
	eo.argv = argv;
	eo.pty = 1;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	run(c, &eo, NULL, 0, 0, &out, &ex);
	CHECKF(out.out_len > 9 && memcmp(out.out, "/dev/pts/", 9) == 0, "tty printed \"%s\"", out.out);
	CHECK_EQ(out.err_len, 0);
	CHECK_EQ(ex.exit_code, 0);
	sbx_output_free(&out);

	/* rows and cols, a resize, stdin to the terminal, stderr merged */
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	eo2.shell = "stty size; echo err >&2; read x; echo \"got $x\"; stty size";
	eo2.pty = 1;
	eo2.rows = 30;
	eo2.cols = 100;
	struct sbx_proc *p;
	struct sbx_error err;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo2, SBX_PROC_STDIN, &p, &err), &err);
	struct sink s = {0};
	read_until(p, &s, "30 100\r\n");
	read_until(p, &s, "err\r\n");
	CHECK_SBX(sbx_proc_resize(p, 40, 120, &err), &err);
	CHECK_SBX(sbx_proc_write(p, "hello\n", 6, &err), &err);
	read_all(p, &s);
	CHECK_CONTAINS(s.b[0], "got hello\r\n");
	CHECK_CONTAINS(s.b[0], "40 120\r\n");
	CHECK_EQ(s.len[1], 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	sink_free(&s);
	sbx_proc_free(p);

	/* the client's FIN is the terminal's EOF */
	struct sbx_exec_opts eo3 = SBX_EXEC_OPTS_INIT;
	const char *cat[] = {"cat", NULL};
	eo3.argv = cat;
	eo3.pty = 1;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo3, SBX_PROC_STDIN, &p, &err), &err);
	CHECK_SBX(sbx_proc_write(p, "abc\n", 4, &err), &err);
	CHECK_SBX(sbx_proc_close_stdin(p, &err), &err);
	read_all(p, &s);
	CHECK_CONTAINS(s.b[0], "abc\r\n");
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	sink_free(&s);
	sbx_proc_free(p);

	/* resize of a process without a terminal */
	struct sbx_exec_opts eo4 = SBX_EXEC_OPTS_INIT;
	const char *sl[] = {"sleep", "30", NULL};
	eo4.argv = sl;
	CHECK_SBX(sbx_exec_start(c, NULL, &eo4, 0, &p, &err), &err);
	FAILS_WITH(ENOTTY, sbx_proc_resize(p, 10, 10, &err_));
	sbx_proc_free(p);
	sbx_client_close(c);
	return 0;
}

/* A detached process outlives its client; another attaches, waits, removes it. */
static int case_detached(void)
{
	struct sbx_client *c = start();
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "echo hi; sleep 1; echo bye; echo err >&2; exit 5";
	eo.name = "job-1";
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	CHECK(strcmp(pi.id, "job-1") == 0);
	CHECK(pi.running && pi.detached && pi.pid > 0);
	/* the name is taken; bad names are refused */
	FAILS_WITH(EEXIST, sbx_spawn(c, NULL, &eo, &pi, &err_));
	eo.name = "bad name";
	FAILS_WITH(EINVAL, sbx_spawn(c, NULL, &eo, &pi, &err_));
	sbx_client_close(c);

	it_sleep_ms(200);
	c = connect2();
	struct ps_find f = ps_lookup(c, "job-1");
	CHECK(f.found && f.info.running && f.info.detached);
	CHECK_CONTAINS(f.info.argv, "echo hi");
	CHECK(f.info.started_at.sec > 0);
	/* running: rmproc refuses */
	FAILS_WITH(EBUSY, sbx_rmproc(c, NULL, "job-1", 0, &err_));

	struct sbx_proc *p;
	CHECK_SBX(sbx_attach(c, NULL, "job-1", SBX_ATTACH_FOLLOW, &p, &err), &err);
	struct sink s = {0};
	read_all(p, &s);
	check_bytes("attach stdout", s.b[0], s.len[0], "hi\nbye\n", 7);
	check_bytes("attach stderr", s.b[1], s.len[1], "err\n", 4);
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 5);
	sink_free(&s);
	sbx_proc_free(p);

	CHECK_SBX(sbx_wait(c, NULL, "job-1", &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 5);
	CHECK(strcmp(ex.id, "job-1") == 0);
	f = ps_lookup(c, "job-1");
	CHECK(f.found && !f.info.running);
	CHECK_EQ(f.info.exit_code, 5);
	FAILS_WITH(ESRCH, sbx_kill(c, NULL, "job-1", SIGTERM, &err_));

	/* a replay of an exited process, without follow */
	CHECK_SBX(sbx_attach(c, NULL, "job-1", 0, &p, &err), &err);
	read_all(p, &s);
	check_bytes("replay", s.b[0], s.len[0], "hi\nbye\n", 7);
	sink_free(&s);
	sbx_proc_free(p);

	CHECK_SBX(sbx_rmproc(c, NULL, "job-1", 0, &err), &err);
	CHECK(!ps_lookup(c, "job-1").found);
	FAILS_WITH(ENOENT, sbx_rmproc(c, NULL, "job-1", 0, &err_));
	FAILS_WITH(ENOENT, sbx_wait(c, NULL, "job-1", &ex, &err_));
	FAILS_WITH(ENOENT, sbx_attach(c, NULL, "job-1", 0, &p, &err_));
	/* the name is free again */
	eo.name = "job-1";
	eo.shell = "exit 0";
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	CHECK_SBX(sbx_wait(c, NULL, "job-1", &ex, &err), &err);

	/* rmproc with kill: killed, reaped, removed, then answered */
	struct sbx_exec_opts eo2 = SBX_EXEC_OPTS_INIT;
	const char *sl[] = {"sleep", "300", NULL};
	eo2.argv = sl;
	CHECK_SBX(sbx_spawn(c, NULL, &eo2, &pi, &err), &err);
	CHECK(pi.id[0] == 'p');
	pid_t pid = (pid_t)pi.pid;
	CHECK_SBX(sbx_rmproc(c, NULL, pi.id, 1, &err), &err);
	CHECK(!ps_lookup(c, pi.id).found);
	CHECK(kill(pid, 0) < 0 && errno == ESRCH);

	/* attach live only, then a signal by id ends it */
	CHECK_SBX(sbx_spawn(c, NULL, &eo2, &pi, &err), &err);
	CHECK_SBX(sbx_attach(c, NULL, pi.id, SBX_ATTACH_FOLLOW | SBX_ATTACH_NO_REPLAY, &p, &err), &err);
	CHECK_SBX(sbx_kill(c, NULL, pi.id, SIGKILL, &err), &err);
	read_all(p, &s);
	CHECK_EQ(s.len[0] + s.len[1], 0);
	CHECK_SBX(sbx_proc_wait(p, &ex, &err), &err);
	CHECK_EQ(ex.signal, SIGKILL);
	sbx_proc_free(p);
	CHECK_SBX(sbx_rmproc(c, NULL, pi.id, 0, &err), &err);
	sbx_client_close(c);
	return 0;
}

/* 3 MiB into a 1 MiB ring: the replay is exactly the last 1 MiB, stdout then stderr. */
static int case_ring(void)
{
	struct sbx_client *c = start();
	size_t len = 3 * MIB + 777;
	uint8_t *data = malloc(len);
	CHECK(data != NULL);
	it_fill(data, len, 99);
	write_bytes(it_path("big"), data, len, 0644);
	char cmd[4400];
	snprintf(cmd, sizeof(cmd), "cat '%s'; cat '%s' >&2; echo tail >&2", it_path("big"), it_path("big"));
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = cmd;
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_wait(c, NULL, pi.id, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	it_sleep_ms(200); /* the output is drained after the exit */
	struct sbx_proc *p;
	CHECK_SBX(sbx_attach(c, NULL, pi.id, 0, &p, &err), &err);
	struct sink s = {0};
	read_all(p, &s);
	check_bytes("stdout ring", s.b[0], s.len[0], (const char *)data + len - MIB, MIB);
	CHECK_EQ(s.len[1], MIB);
	CHECK(memcmp(s.b[1], data + len - MIB + 5, MIB - 5) == 0);
	CHECK(memcmp(s.b[1] + MIB - 5, "tail\n", 5) == 0);
	sink_free(&s);
	sbx_proc_free(p);

	/* a smaller ring on request */
	eo.shell = "head -c 100000 /dev/zero; printf end";
	eo.ring_bytes = 1000;
	CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	CHECK_SBX(sbx_wait(c, NULL, pi.id, &ex, &err), &err);
	it_sleep_ms(200);
	CHECK_SBX(sbx_attach(c, NULL, pi.id, SBX_ATTACH_FOLLOW, &p, &err), &err);
	read_all(p, &s);
	CHECK_EQ(s.len[0], 1000);
	CHECK(memcmp(s.b[0] + 997, "end", 3) == 0);
	sink_free(&s);
	sbx_proc_free(p);
	free(data);
	sbx_client_close(c);
	return 0;
}

struct runner {
	struct sbx_client *c;
	int exit_code;
	struct sbx_error err;
	int rc;
};

static void *run_true(void *arg)
{
	struct runner *r = arg;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *argv[] = {"true", NULL};
	eo.argv = argv;
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	memset(&out, 0, sizeof(out));
	r->rc = sbx_run(r->c, NULL, &eo, NULL, 0, 0, &out, &ex, &r->err);
	r->exit_code = ex.exit_code;
	sbx_output_free(&out);
	return NULL;
}

static int count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static int case_concurrent(void)
{
	struct sbx_client *c = start();
	int fds0 = count_fds(daemon_->pid);
	enum { N = 200 };
	static struct runner r[N];
	static pthread_t th[N];
	uint64_t t0 = it_now_ms();
	for (int i = 0; i < N; i++) {
		r[i].c = c;
		r[i].exit_code = -2;
		CHECK(pthread_create(&th[i], NULL, run_true, &r[i]) == 0);
	}
	for (int i = 0; i < N; i++) {
		CHECK(pthread_join(th[i], NULL) == 0);
		CHECKF(r[i].rc == 0, "run %d: %s", i, it_errstr(&r[i].err));
		CHECK_EQ(r[i].exit_code, 0);
	}
	printf("%d concurrent `true` on one connection: %llu ms\n", N, (unsigned long long)(it_now_ms() - t0));
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.processes, 0);
	/* nothing left open in the daemon */
	int fds1 = count_fds(daemon_->pid);
	CHECKF(fds1 == fds0, "the daemon had %d fds, now %d", fds0, fds1);
	sbx_client_close(c);
	return 0;
}

static int mark_seen(void *ud, const struct sbx_process_info *pi)
{
	bool *seen = ud;
	int n = pi->id[0] == 'p' ? atoi(pi->id + 1) : 0;
	if (n > 0 && n <= 1034)
		seen[n] = true;
	return 0;
}

/* At most 1024 processes at once (EAGAIN beyond); at most 1024 exited ones kept. */
static int case_limits(void)
{
	struct sbx_client *c = start();
	enum { MAX = 1024 };
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	const char *sl[] = {"sleep", "60", NULL};
	eo.argv = sl;
	struct sbx_process_info pi = SBX_PROCESS_INFO_INIT;
	struct sbx_error err;
	uint64_t t0 = it_now_ms();
	for (int i = 0; i < MAX; i++)
		CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
	printf("%d detached processes started in %llu ms\n", MAX, (unsigned long long)(it_now_ms() - t0));
	CHECK(strcmp(pi.id, "p1024") == 0);
	FAILS_WITH(EAGAIN, sbx_spawn(c, NULL, &eo, &pi, &err_));
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	FAILS_WITH(EAGAIN, sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err_));
	struct sbx_info in = SBX_INFO_INIT;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.processes, MAX);
	for (int i = 1; i <= MAX; i++) {
		char id[16];
		snprintf(id, sizeof(id), "p%d", i);
		CHECK_SBX(sbx_kill(c, NULL, id, SIGKILL, &err), &err);
	}
	for (int i = 1; i <= MAX; i++) {
		char id[16];
		snprintf(id, sizeof(id), "p%d", i);
		CHECK_SBX(sbx_wait(c, NULL, id, &ex, &err), &err);
		CHECK_EQ(ex.signal, SIGKILL);
	}
	/* ten more exit: the ten that exited first are dropped */
	const char *tr[] = {"true", NULL};
	eo.argv = tr;
	for (int i = 0; i < 10; i++) {
		CHECK_SBX(sbx_spawn(c, NULL, &eo, &pi, &err), &err);
		CHECK_SBX(sbx_wait(c, NULL, pi.id, &ex, &err), &err);
	}
	struct ps_find f = ps_lookup(c, "p1025");
	CHECK(f.found);
	CHECK_EQ(f.total, MAX);
	static bool seen[MAX + 11];
	memset(seen, 0, sizeof(seen));
	CHECK_SBX(sbx_ps(c, NULL, mark_seen, seen, &err), &err);
	int gone = 0;
	for (int i = 1; i <= MAX + 10; i++) {
		char id[16];
		snprintf(id, sizeof(id), "p%d", i);
		bool found = seen[i];
		if (i > MAX)
			CHECKF(found, "%s, among the last to exit, was dropped", id);
		gone += !found;
	}
	CHECK_EQ(gone, 10);
	sbx_client_close(c);
	return 0;
}

/* ---- raw frames: the exact sequence on the wire ---- */

static void raw_exec(int fd, uint32_t stream, const char *shell, bool detach)
{
	Shim__V1__ExecRequest er = SHIM__V1__EXEC_REQUEST__INIT;
	er.has_shell = 1;
	er.shell.data = (uint8_t *)(uintptr_t)shell;
	er.shell.len = strlen(shell);
	er.has_detach = er.detach = detach;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_EXEC;
	req.exec = &er;
	uint8_t buf[1024];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

static int case_raw_frames(void)
{
	struct sbx_client *c = start();
	sbx_client_close(c);
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	raw_exec(fd, 1, "printf out; sleep 0.1; printf err >&2; exit 4", false);
	struct frame_hdr h;
	uint8_t *pl;
	/* EVENT started first */
	CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
	CHECKF(h.type == FRAME_EVENT && h.stream == 1, "got %s", frame_type_name(h.type));
	Shim__V1__Event *ev = shim__v1__event__unpack(NULL, h.len, pl);
	CHECK(ev != NULL && ev->kind_case == SHIM__V1__EVENT__KIND_STARTED);
	CHECK(ev->started->pid > 0);
	char id[64];
	snprintf(id, sizeof(id), "%s", ev->started->id);
	shim__v1__event__free_unpacked(ev, NULL);
	free(pl);
	/* output, each stream flagged, then one empty DATA FIN, then END */
	char out[16] = "", err[16] = "";
	for (;;) {
		CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
		CHECK_EQ(h.stream, 1);
		if (h.type != FRAME_DATA)
			break;
		if (h.flags & FRAME_FLAG_FIN) {
			CHECK_EQ(h.len, 0);
			CHECK_EQ(h.flags, FRAME_FLAG_FIN);
			free(pl);
			CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
			break;
		}
		char *dst = (h.flags & FRAME_FLAG_STDERR) ? err : out;
		CHECK(strlen(dst) + h.len < 16);
		strncat(dst, (const char *)pl, h.len);
		free(pl);
	}
	CHECKF(h.type == FRAME_END, "got %s", frame_type_name(h.type));
	Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, pl);
	CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_EXIT);
	CHECK_EQ(res->exit->exit_code, 4);
	CHECK(strcmp(res->exit->id, id) == 0);
	shim__v1__result__free_unpacked(res, NULL);
	free(pl);
	CHECK(strcmp(out, "out") == 0);
	CHECK(strcmp(err, "err") == 0);

	/* a command that cannot start: ERROR, nothing before it */
	raw_exec(fd, 3, "x", false);
	Shim__V1__ExecRequest er = SHIM__V1__EXEC_REQUEST__INIT;
	ProtobufCBinaryData a0 = {8, (uint8_t *)"/no/such"};
	er.n_argv = 1;
	er.argv = &a0;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_EXEC;
	req.exec = &er;
	uint8_t buf[256];
	size_t n = shim__v1__request__get_packed_size(&req);
	shim__v1__request__pack(&req, buf);
	raw_send(fd, 5, FRAME_REQUEST, 0, buf, n);
	bool got3 = false, got5 = false;
	while (!got3 || !got5) {
		CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
		if (h.stream == 5) {
			CHECKF(h.type == FRAME_ERROR, "got %s", frame_type_name(h.type));
			char msg[256];
			CHECK_EQ(raw_error_code(pl, h.len, msg, sizeof(msg)), ENOENT);
			got5 = true;
		} else if (h.stream == 3 && h.type == FRAME_END) {
			got3 = true; /* sh: x: not found; exit 127: that is an exit code */
			res = shim__v1__result__unpack(NULL, h.len, pl);
			CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_EXIT);
			CHECK_EQ(res->exit->exit_code, 127);
			shim__v1__result__free_unpacked(res, NULL);
		}
		free(pl);
	}

	/* detached: END ProcessInfo, no EVENT, no output on the exec stream */
	raw_exec(fd, 7, "echo detached", true);
	CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
	CHECKF(h.type == FRAME_END && h.stream == 7, "got %s", frame_type_name(h.type));
	res = shim__v1__result__unpack(NULL, h.len, pl);
	CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_PROCESS);
	CHECK(res->process->has_detached && res->process->detached);
	CHECK_EQ(res->process->state, SHIM__V1__PROCESS_STATE__PROCESS_RUNNING);
	CHECK_EQ(res->process->n_argv, 3);
	shim__v1__result__free_unpacked(res, NULL);
	free(pl);

	/* stdin DATA without stdin asked for: the stream fails, the command is killed */
	raw_exec(fd, 9, "sleep 30", false);
	CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
	CHECK(h.type == FRAME_EVENT);
	free(pl);
	raw_send(fd, 9, FRAME_DATA, 0, "x", 1);
	CHECK(raw_recv(fd, &h, &pl, 5000) == 1);
	CHECKF(h.type == FRAME_ERROR && h.stream == 9, "got %s", frame_type_name(h.type));
	free(pl);
	close(fd);
	return 0;
}

static void raw_request(int fd, uint32_t stream, const Shim__V1__Request *req)
{
	uint8_t buf[1024];
	size_t n = shim__v1__request__get_packed_size(req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

static void raw_attach(int fd, uint32_t stream, const char *id, bool in, bool follow)
{
	Shim__V1__AttachRequest ar = SHIM__V1__ATTACH_REQUEST__INIT;
	ar.id = (char *)id;
	ar.has_stdin = ar.stdin = in;
	ar.has_follow = ar.follow = follow;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_ATTACH;
	req.attach = &ar;
	raw_request(fd, stream, &req);
}

/* The next frame on stream (frames of other streams are skipped); its payload in *pl. */
static struct frame_hdr raw_next(int fd, uint32_t stream, uint8_t **pl)
{
	for (;;) {
		struct frame_hdr h;
		CHECK(raw_recv(fd, &h, pl, 10000) == 1);
		if (h.stream == stream && h.type != FRAME_WINDOW)
			return h;
		free(*pl);
	}
}

/* A detached process with stdin: one attached client at a time writes it; its FIN
 * closes it. */
static int case_attach_stdin(void)
{
	struct sbx_client *c = start();
	sbx_client_close(c);
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	Shim__V1__ExecRequest er = SHIM__V1__EXEC_REQUEST__INIT;
	const char *cmd = "while read l; do echo \"[$l]\"; done; echo eof";
	er.has_shell = 1;
	er.shell.data = (uint8_t *)(uintptr_t)cmd;
	er.shell.len = strlen(cmd);
	er.has_detach = er.detach = 1;
	er.has_stdin = er.stdin = 1;
	er.name = (char *)"reader";
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_EXEC;
	req.exec = &er;
	raw_request(fd, 1, &req);
	uint8_t *pl;
	struct frame_hdr h = raw_next(fd, 1, &pl);
	CHECKF(h.type == FRAME_END, "got %s", frame_type_name(h.type));
	free(pl);

	/* a first client writes a line and detaches without FIN */
	raw_attach(fd, 3, "reader", true, true);
	h = raw_next(fd, 3, &pl);
	CHECK(h.type == FRAME_EVENT);
	free(pl);
	raw_send(fd, 3, FRAME_DATA, 0, "one\n", 4);
	char got[64] = "";
	while (strstr(got, "[one]\n") == NULL) {
		h = raw_next(fd, 3, &pl);
		CHECKF(h.type == FRAME_DATA && !(h.flags & FRAME_FLAG_STDERR), "got %s", frame_type_name(h.type));
		CHECK(strlen(got) + h.len < sizeof(got));
		strncat(got, (const char *)pl, h.len);
		free(pl);
	}
	/* only one writer at a time */
	raw_attach(fd, 5, "reader", true, true);
	h = raw_next(fd, 5, &pl);
	CHECKF(h.type == FRAME_ERROR, "got %s", frame_type_name(h.type));
	char msg[256];
	CHECK_EQ(raw_error_code(pl, h.len, msg, sizeof(msg)), EBUSY);
	free(pl);
	raw_send(fd, 3, FRAME_CANCEL, 0, NULL, 0); /* detach */
	h = raw_next(fd, 3, &pl);
	CHECKF(h.type == FRAME_ERROR, "got %s", frame_type_name(h.type));
	CHECK_EQ(raw_error_code(pl, h.len, msg, sizeof(msg)), ECANCELED);
	free(pl);

	/* a second one replays, writes, and closes stdin: the process ends */
	raw_attach(fd, 7, "reader", true, true);
	h = raw_next(fd, 7, &pl);
	CHECK(h.type == FRAME_EVENT);
	free(pl);
	raw_send(fd, 7, FRAME_DATA, FRAME_FLAG_FIN, "two\n", 4);
	char out[128] = "";
	for (;;) {
		h = raw_next(fd, 7, &pl);
		if (h.type != FRAME_DATA)
			break;
		CHECK(strlen(out) + h.len < sizeof(out));
		strncat(out, (const char *)pl, h.len);
		free(pl);
	}
	CHECKF(h.type == FRAME_END, "got %s", frame_type_name(h.type));
	Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, pl);
	CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_EXIT);
	CHECK_EQ(res->exit->exit_code, 0);
	shim__v1__result__free_unpacked(res, NULL);
	free(pl);
	CHECKF(strcmp(out, "[one]\n[two]\neof\n") == 0, "got \"%s\"", out);

	/* attach to a process that was started without stdin, asking for it */
	er.has_stdin = er.stdin = 0;
	er.name = (char *)"nostdin";
	raw_request(fd, 9, &req);
	h = raw_next(fd, 9, &pl);
	CHECK(h.type == FRAME_END);
	free(pl);
	raw_attach(fd, 11, "nostdin", true, false);
	h = raw_next(fd, 11, &pl);
	CHECKF(h.type == FRAME_ERROR, "got %s", frame_type_name(h.type));
	CHECK_EQ(raw_error_code(pl, h.len, msg, sizeof(msg)), EINVAL);
	free(pl);
	close(fd);
	return 0;
}

static const struct it_case cases[] = {
	{"argv_shell", case_argv_shell},
	{"signal_exit", case_signal_exit},
	{"core", case_core},
	{"env_cwd", case_env_cwd},
	{"spawn_errors", case_spawn_errors},
	{"child_errors", case_child_errors},
	{"stdin_binary", case_stdin_binary},
	{"timeout", case_timeout},
	{"timeout_group", case_timeout_group},
	{"cancel_group", case_cancel_group},
	{"signal_by_id", case_signal_by_id},
	{"backpressure", case_backpressure},
	{"stdout_direct", case_stdout_direct},
	{"stdout_spliced", case_stdout_spliced},
	{"output_cap", case_output_cap},
	{"pty", case_pty},
	{"detached", case_detached},
	{"ring", case_ring},
	{"concurrent", case_concurrent},
	{"root_cwd", case_root_cwd},
	{"linger", case_linger},
	{"attach_slow", case_attach_slow},
	{"limits", case_limits},
	{"raw_frames", case_raw_frames},
	{"attach_stdin", case_attach_stdin},
};

int main(int argc, char **argv)
{
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
