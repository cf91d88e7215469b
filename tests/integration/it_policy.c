/* it_policy.c: per-command restrictions against the real daemon: user and groups, capabilities,
 * no_new_privs, seccomp (default, none, policy files), rlimits, nice, oom_score_adj; and the default
 * seccomp policy's C table against container/seccomp-default.txt. */
#include "harness.h"
#include "sysfilter.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef IT_SYS_BIN
#error "IT_SYS_BIN must name the it_sys helper"
#endif
#ifndef SECCOMP_DEFAULT_TXT
#error "SECCOMP_DEFAULT_TXT must name container/seccomp-default.txt"
#endif

static const struct sbx_call_opts no_timeout = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1};

/* ---- helpers ---- */

static struct sbx_client *start(void)
{
	const char *t = it_unix_target(it_path("s.sock"));
	it_daemon_start("shim", "--listen", t, "--state-dir", it_path("state"), NULL);
	return it_connect(t, NULL);
}

/* Run eo (argv or shell set by the caller) to completion; stdout into out
 * (NUL-terminated), the shell-style status returned. The command must start. */
static int run(struct sbx_client *c, struct sbx_exec_opts *eo, char *out, size_t size)
{
	struct sbx_output o;
	struct sbx_exit ex = SBX_EXIT_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_run(c, &no_timeout, eo, NULL, 0, 0, &o, &ex, &err), &err);
	if (out != NULL)
		snprintf(out, size, "%s", o.out_len > 0 ? o.out : "");
	if (o.err_len > 0)
		fprintf(stderr, "(command stderr: %s)\n", o.err);
	sbx_output_free(&o);
	return sbx_exit_status(&ex);
}

/* The command must fail to start with kind REMOTE and this errno. */
static void run_fails(struct sbx_client *c, struct sbx_exec_opts *eo, int code, struct sbx_error *err)
{
	struct sbx_output o;
	struct sbx_exit ex = SBX_EXIT_INIT;
	int rc = sbx_run(c, &no_timeout, eo, NULL, 0, 0, &o, &ex, err);
	CHECKF(rc < 0, "the command ran (status %d), want %s", sbx_exit_status(&ex), sbx_errno_name(code));
	CHECK_ERR(err, SBX_ERR_REMOTE, code);
}

/* One line of /proc/self/status as the command sees it under eo, e.g. "CapEff". */
static void status_line(struct sbx_client *c, struct sbx_exec_opts *eo, const char *key, char *out, size_t size)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "grep '^%s:' /proc/self/status | cut -f2", key);
	eo->shell = cmd;
	CHECK_EQ(run(c, eo, out, size), 0);
}

/* it_sys OP [ARG] under eo: its one line of output. */
static const char *sys_bin = IT_SYS_BIN;

/* Make sys() run a copy of IT_SYS_BIN that any user can reach: the build tree may sit below
 * a 0700 directory (a clone in `mktemp -d`), which "nobody" cannot traverse. */
static void sys_bin_for_anyone(void)
{
	static char path[4096];
	snprintf(path, sizeof(path), "%s", it_path("it_sys"));
	char *slash = strrchr(path, '/');
	*slash = '\0';
	CHECK(chmod(path, 0711) == 0); /* the test's own directory: traversable, not listable */
	*slash = '/';
	int in = open(IT_SYS_BIN, O_RDONLY | O_CLOEXEC);
	int out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
	CHECK(in >= 0 && out >= 0);
	char buf[65536];
	ssize_t n;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		CHECK(write(out, buf, (size_t)n) == n);
	CHECK(n == 0);
	close(in);
	CHECK(close(out) == 0);
	sys_bin = path;
}

static void sys(struct sbx_client *c, struct sbx_exec_opts *eo, const char *op, const char *arg, char *out, size_t size)
{
	const char *argv[] = {sys_bin, op, arg, NULL};
	eo->argv = argv;
	eo->shell = NULL;
	CHECK_EQ(run(c, eo, out, size), 0);
	eo->argv = NULL;
}

#define CHECK_STR(got, want)                                                            \
	do {                                                                            \
		const char *it_g_ = (got), *it_w_ = (want);                             \
		CHECKF(strcmp(it_g_, it_w_) == 0, "got '%s', want '%s'", it_g_, it_w_); \
	} while (0)

/* ---- users and groups ---- */

static int case_user(void)
{
	struct sbx_client *c = start();
	char out[256];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.user = "nobody";
	eo.shell = "id -u; id -g; id -G; echo \"$HOME $USER\"";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	/* nobody's passwd entry: 65534, group nogroup (65534) on Debian */
	CHECK_STR(out, "65534\n65534\n65534\n/nonexistent nobody\n");

	/* by number: the same user */
	eo.user = "65534";
	eo.shell = "id -u; id -g";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n65534\n");

	/* a uid without a passwd entry: its own number as the group, no other groups */
	eo.user = "12345";
	eo.shell = "id -u; id -g; id -G";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "12345\n12345\n12345\n");

	/* the group overrides the primary group only */
	eo.user = "nobody";
	eo.group = "daemon";
	eo.shell = "id -u; id -g";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n1\n");
	eo.group = "4242";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n4242\n");

	/* only a group: the shim's user (root) with that primary group */
	eo.user = NULL;
	eo.group = "4242";
	eo.shell = "id -u; id -g";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "0\n4242\n");

	/* without capabilities: a non-root user has none */
	eo.user = "nobody";
	eo.group = NULL;
	status_line(c, &eo, "CapEff", out, sizeof(out));
	CHECK_STR(out, "0000000000000000\n");
	sbx_client_close(c);
	return 0;
}

static int case_user_unknown(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "true";
	eo.user = "no-such-user";
	run_fails(c, &eo, EINVAL, &err);
	CHECK_STR(err.path, "no-such-user");
	CHECK_CONTAINS(err.message, "unknown user no-such-user");

	eo.user = "nobody";
	eo.group = "no-such-group";
	run_fails(c, &eo, EINVAL, &err);
	CHECK_STR(err.path, "no-such-group");
	CHECK_CONTAINS(err.message, "unknown group no-such-group");

	/* the connection is fine afterwards */
	char out[64];
	eo.user = eo.group = NULL;
	eo.shell = "echo ok";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "ok\n");
	sbx_client_close(c);
	return 0;
}

/* ---- no_new_privs and capabilities ---- */

static int case_no_new_privs(void)
{
	struct sbx_client *c = start();
	char out[64];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "0\n");
	eo.no_new_privs = 1;
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "1\n");
	eo.user = "nobody";
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "1\n");
	sbx_client_close(c);
	return 0;
}

static int case_drop_caps(void)
{
	struct sbx_client *c = start();
	char out[64];
	static const char *const sets[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;

	/* root, everything dropped: the bounding set too */
	eo.drop_caps = 1;
	for (size_t i = 0; i < 5; i++) {
		status_line(c, &eo, sets[i], out, sizeof(out));
		CHECKF(strcmp(out, "0000000000000000\n") == 0, "%s: %s", sets[i], out);
	}
	/* and it shows: root cannot chown a file it does not own any more... */
	eo.shell = "touch /tmp/.it_policy_$$ && chown 1:1 /tmp/.it_policy_$$; r=$?; rm -f /tmp/.it_policy_$$; exit $r";
	CHECK(run(c, &eo, NULL, 0) != 0);

	/* root keeping cap_net_bind_service: that bit alone (bit 10), in every set */
	static const char *const keep[] = {"cap_net_bind_service", NULL};
	eo.keep_caps = keep;
	for (size_t i = 0; i < 5; i++) {
		status_line(c, &eo, sets[i], out, sizeof(out));
		CHECKF(strcmp(out, "0000000000000400\n") == 0, "%s: %s", sets[i], out);
	}

	/* nobody keeping it (name without the prefix): effective after exec thanks to
	 * the ambient set */
	static const char *const keep2[] = {"NET_BIND_SERVICE", NULL};
	static const char *const keep3[] = {"net_bind_service", NULL};
	eo.user = "nobody";
	eo.keep_caps = keep3;
	for (size_t i = 0; i < 5; i++) {
		status_line(c, &eo, sets[i], out, sizeof(out));
		CHECKF(strcmp(out, "0000000000000400\n") == 0, "nobody %s: %s", sets[i], out);
	}
	eo.keep_caps = keep2;
	status_line(c, &eo, "CapEff", out, sizeof(out));
	CHECK_STR(out, "0000000000000400\n");

	/* unknown names */
	struct sbx_error err;
	static const char *const bad[] = {"cap_no_such_thing", NULL};
	eo.user = NULL;
	eo.keep_caps = bad;
	eo.shell = "true";
	run_fails(c, &eo, EINVAL, &err);
	CHECK_STR(err.path, "cap_no_such_thing");
	CHECK_CONTAINS(err.message, "unknown capability");
	sbx_client_close(c);
	return 0;
}

/* ---- seccomp ---- */

static int case_seccomp_default(void)
{
	struct sbx_client *c = start();
	char out[128];
	const char *dir = it_path("mnt");
	CHECK(mkdir(dir, 0700) == 0);
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.seccomp = "default";
	status_line(c, &eo, "Seccomp", out, sizeof(out));
	CHECK_STR(out, "2\n");

	sys(c, &eo, "mount", dir, out, sizeof(out));
	CHECK_STR(out, "mount EPERM\n");
	sys(c, &eo, "unshare", NULL, out, sizeof(out));
	CHECK_STR(out, "unshare EPERM\n");
	sys(c, &eo, "clone_newuser", NULL, out, sizeof(out));
	CHECK_STR(out, "clone_newuser EPERM\n");
	/* clone3 flags cannot be inspected: ENOSYS, so that libcs fall back to clone */
	sys(c, &eo, "clone3", NULL, out, sizeof(out));
	CHECK_STR(out, "clone3 ENOSYS\n");
	sys(c, &eo, "keyctl", NULL, out, sizeof(out));
	CHECK_STR(out, "keyctl EPERM\n");
	sys(c, &eo, "personality_aslr", NULL, out, sizeof(out));
	CHECK_STR(out, "personality_aslr EPERM\n");
	/* what stays allowed */
	sys(c, &eo, "personality_query", NULL, out, sizeof(out));
	CHECK_STR(out, "personality_query 0\n");
	sys(c, &eo, "fork", NULL, out, sizeof(out));
	CHECK_STR(out, "fork 0\n");
	/* the real tools, as a user would see them */
	eo.shell = "mount -t tmpfs x /mnt 2>&1; echo \"rc=$?\"";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_CONTAINS(out, "rc=32");
	eo.shell = "unshare -m true 2>&1; echo \"rc=$?\"";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_CONTAINS(out, "Operation not permitted");
	/* a shell pipeline, threads of a real program: unaffected */
	eo.shell = "seq 1 3 | sort -r --parallel=2 | tr '\\n' ' '";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "3 2 1 ");

	/* with a user change and no no_new_privs the filter goes in first (while
	 * CAP_SYS_ADMIN is held), no_new_privs stays off */
	sys_bin_for_anyone();
	eo.user = "nobody";
	eo.shell = NULL;
	sys(c, &eo, "unshare", NULL, out, sizeof(out));
	CHECK_STR(out, "unshare EPERM\n");
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "0\n");
	status_line(c, &eo, "Seccomp", out, sizeof(out));
	CHECK_STR(out, "2\n");
	/* with no_new_privs, last, after every privilege step */
	eo.no_new_privs = 1;
	eo.drop_caps = 1;
	status_line(c, &eo, "Seccomp", out, sizeof(out));
	CHECK_STR(out, "2\n");
	sys(c, &eo, "clone_newuser", NULL, out, sizeof(out));
	CHECK_STR(out, "clone_newuser EPERM\n");
	sbx_client_close(c);
	return 0;
}

static int case_seccomp_none(void)
{
	struct sbx_client *c = start();
	char out[128];
	const char *dir = it_path("mnt");
	CHECK(mkdir(dir, 0700) == 0);
	static const char *modes[] = {NULL, "none"};
	for (size_t i = 0; i < 2; i++) {
		struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
		eo.seccomp = modes[i];
		status_line(c, &eo, "Seccomp", out, sizeof(out));
		CHECK_STR(out, "0\n");
		sys(c, &eo, "mount", dir, out, sizeof(out));
		CHECK_STR(out, "mount 0\n");
		sys(c, &eo, "unshare", NULL, out, sizeof(out));
		CHECK_STR(out, "unshare 0\n");
		sys(c, &eo, "clone3", NULL, out, sizeof(out));
		CHECK_STR(out, "clone3 0\n");
	}
	sbx_client_close(c);
	return 0;
}

static int case_seccomp_file(void)
{
	struct sbx_client *c = start();
	char out[128];
	struct sbx_error err;
	const char *pol = it_path("deny-mkdir.txt");
	/* glibc's mkdir() is the mkdir syscall on x86_64, mkdirat elsewhere: deny both */
	it_write_file(pol, "# no new directories\n"
			   "default allow\n"
			   "deny mkdir          # EPERM by default\n"
			   "deny mkdirat EPERM\n");
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.seccomp = pol;
	sys(c, &eo, "mkdir", it_path("d1"), out, sizeof(out));
	CHECK_STR(out, "mkdir EPERM\n");
	eo.shell = "mkdir /tmp/.it_policy_dir_$$ 2>&1; echo \"rc=$?\"";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_CONTAINS(out, "Operation not permitted");
	CHECK_CONTAINS(out, "rc=1");
	/* the rest works */
	sys(c, &eo, "unshare", NULL, out, sizeof(out));
	CHECK_STR(out, "unshare 0\n");

	/* another errno, and a condition: only mode 0700 is refused */
	it_write_file(pol, "deny mkdir EACCES arg1==0700\ndeny mkdirat EACCES arg2==0700\n");
	sys(c, &eo, "mkdir", it_path("d2"), out, sizeof(out));
	CHECK_STR(out, "mkdir EACCES\n");
	eo.shell = NULL;
	const char *argv[] = {"mkdir", "-m", "0755", it_path("d3"), NULL};
	eo.argv = argv;
	CHECK_EQ(run(c, &eo, NULL, 0), 0);
	struct stat st;
	CHECK(stat(it_path("d3"), &st) == 0 && S_ISDIR(st.st_mode));
	eo.argv = NULL;

	/* the filter is loaded right before execve: a policy that denies it is refused
	 * (nothing could start, nor report why) */
	eo.shell = "true";
	it_write_file(pol, "default deny ENOSYS\nallow write\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "execve is denied");
	it_write_file(pol, "deny execve\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "execve is denied");

	/* bad files: the file's name and line in the message, EINVAL */
	it_write_file(pol, "default allow\ndeny no_such_syscall\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_STR(err.path, pol);
	CHECK_CONTAINS(err.message, ":2: unknown syscall 'no_such_syscall'");
	it_write_file(pol, "deny mkdir EWHAT\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, ":1: unknown errno 'EWHAT'");
	it_write_file(pol, "deny mkdir arg1==1 arg1==2\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "two conditions on arg1");
	it_write_file(pol, "deny mkdir arg9==1\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "bad condition 'arg9==1'");
	it_write_file(pol, "permit mkdir\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "unknown statement 'permit'");
	it_write_file(pol, "default allow\ndefault deny\n");
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "a second 'default'");
	/* missing file, a relative path, a directory, a file too large */
	eo.seccomp = it_path("nope.txt");
	run_fails(c, &eo, ENOENT, &err);
	CHECK_STR(err.path, it_path("nope.txt"));
	eo.seccomp = "relative/policy.txt";
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "unknown seccomp policy");
	eo.seccomp = it_dir();
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "not a regular file");
	int fd = open(pol, O_WRONLY | O_TRUNC);
	CHECK(fd >= 0 && ftruncate(fd, SYSFILTER_MAX_FILE + 1) == 0);
	close(fd);
	eo.seccomp = pol;
	run_fails(c, &eo, EFBIG, &err);

	/* the shipped default as a policy file gives the default filter */
	eo.seccomp = SECCOMP_DEFAULT_TXT;
	sys(c, &eo, "unshare", NULL, out, sizeof(out));
	CHECK_STR(out, "unshare EPERM\n");
	sys(c, &eo, "clone3", NULL, out, sizeof(out));
	CHECK_STR(out, "clone3 ENOSYS\n");
	sbx_client_close(c);
	return 0;
}

/* The C table the daemon uses and container/seccomp-default.txt: the same rules in
 * the same order. */
static int case_default_table(void)
{
	struct sysfilter_policy file;
	struct shim_err err;
	CHECKF(sysfilter_read_file(SECCOMP_DEFAULT_TXT, &file, &err) == 0, "%s: %s (%s)", SECCOMP_DEFAULT_TXT, err.msg,
	       strerror(err.code));
	const struct sysfilter_policy *c = sysfilter_default();
	CHECK_EQ(file.default_allow, c->default_allow);
	if (!c->default_allow)
		CHECK_EQ(file.default_err, c->default_err);
	size_t n = file.n_rules < c->n_rules ? file.n_rules : c->n_rules;
	for (size_t i = 0; i < n; i++) {
		const struct sysfilter_rule *a = &file.rules[i], *b = &c->rules[i];
		CHECKF(strcmp(a->syscall, b->syscall) == 0 && a->allow == b->allow && a->err == b->err &&
			       a->n_conds == b->n_conds,
		       "rule %zu: file '%s %s %s' (%u conditions), C table '%s %s %s' (%u conditions)", i + 1,
		       a->allow ? "allow" : "deny", a->syscall, sbx_errno_name(a->err), a->n_conds,
		       b->allow ? "allow" : "deny", b->syscall, sbx_errno_name(b->err), b->n_conds);
		for (unsigned k = 0; k < a->n_conds; k++) {
			const struct sysfilter_cond *x = &a->conds[k], *y = &b->conds[k];
			CHECKF(x->arg == y->arg && x->op == y->op && x->value == y->value &&
				       (x->op != SYSFILTER_MASKED_EQ || x->mask == y->mask),
			       "rule %zu (%s): condition %u differs", i + 1, a->syscall, k + 1);
		}
	}
	CHECKF(file.n_rules == c->n_rules, "%zu rules in the file, %zu in the C table", file.n_rules, c->n_rules);
	/* and both compile */
	struct sock_fprog prog;
	CHECKF(sysfilter_compile(&file, &prog, &err) == 0, "compile: %s (%s)", err.msg, strerror(err.code));
	CHECK(prog.len > 0);
	sysfilter_prog_free(&prog);
	const struct sock_fprog *def;
	CHECK(sysfilter_default_prog(&def, &err) == 0 && def->len > 0);
	sysfilter_free(&file);
	return 0;
}

/* ---- limits, nice, oom_score_adj ---- */

static int case_rlimits(void)
{
	struct sbx_client *c = start();
	char out[128];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	struct sbx_rlimit rl[] = {
		{"nofile", 64, 0}, {"nproc", 1000, 2000}, {"cpu", 100, 0}, {"fsize", UINT64_MAX, UINT64_MAX},
		{"core", 0, 0},
	};
	eo.rlimits = rl;
	eo.n_rlimits = 5;
	const char *limits[] = {"bash", "-c",
				"ulimit -n; ulimit -Hn; ulimit -u; ulimit -Hu; ulimit -t; ulimit -f; ulimit -c", NULL};
	eo.argv = limits;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "64\n64\n1000\n2000\n100\nunlimited\n0\n");
	/* and it bites: the 65th open fails */
	eo.n_rlimits = 1;
	eo.shell = NULL;
	const char *bash[] = {"bash", "-c",
			      "exec 63</dev/null && echo ok63; (exec 64</dev/null) 2>/dev/null || echo no64", NULL};
	eo.argv = bash;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "ok63\nno64\n");
	eo.argv = NULL;

	/* a name given twice: the last counts */
	struct sbx_rlimit twice[] = {{"nofile", 64, 0}, {"nofile", 100, 0}};
	eo.rlimits = twice;
	eo.n_rlimits = 2;
	eo.shell = "ulimit -n";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "100\n");

	struct sbx_error err;
	struct sbx_rlimit bad[] = {{"files", 10, 0}};
	eo.rlimits = bad;
	eo.n_rlimits = 1;
	run_fails(c, &eo, EINVAL, &err);
	CHECK_STR(err.path, "files");
	CHECK_CONTAINS(err.message, "unknown rlimit files");
	struct sbx_rlimit inverted[] = {{"nofile", 100, 50}};
	eo.rlimits = inverted;
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "soft limit above the hard limit");
	/* above the shim's own hard limit without CAP_SYS_RESOURCE: the setrlimit step
	 * fails, named */
	struct rlimit own;
	CHECK(getrlimit(RLIMIT_NOFILE, &own) == 0);
	if (own.rlim_max != RLIM_INFINITY) {
		struct sbx_rlimit high[] = {{"nofile", own.rlim_max, (uint64_t)own.rlim_max * 2}};
		eo.rlimits = high;
		struct sbx_output o;
		struct sbx_exit ex = SBX_EXIT_INIT;
		int rc = sbx_run(c, &no_timeout, &eo, NULL, 0, 0, &o, &ex, &err);
		if (rc < 0) {
			CHECK_ERR(&err, SBX_ERR_REMOTE, EPERM);
			CHECK_CONTAINS(err.message, "setrlimit(nofile)");
		} else {
			sbx_output_free(&o); /* the daemon may hold CAP_SYS_RESOURCE */
		}
	}
	sbx_client_close(c);
	return 0;
}

static int case_nice(void)
{
	struct sbx_client *c = start();
	char out[64];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "nice";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "0\n");
	eo.nice = 5;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "5\n");
	eo.nice = 19;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "19\n");
	struct sbx_error err;
	eo.nice = 20;
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "nice 20 out of range");
	sbx_client_close(c);
	return 0;
}

static int write_own_oom(int v)
{
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char b[16];
	int n = snprintf(b, sizeof(b), "%d\n", v);
	int rc = write(fd, b, (size_t)n) == n ? 0 : -1;
	close(fd);
	return rc;
}

static int case_oom_score_adj(void)
{
	/* The daemon inherits ours at its start: protected (-500) if we may lower it
	 * (CAP_SYS_RESOURCE), else raised (+500: always allowed). */
	bool protected_shim = write_own_oom(-500) == 0;
	if (!protected_shim)
		CHECK(write_own_oom(500) == 0);
	struct sbx_client *c = start();
	CHECK(write_own_oom(0) == 0); /* back to what the test had (allowed: its minimum) */
	char out[64];
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "cat /proc/self/oom_score_adj";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	if (protected_shim) {
		/* the shim's protection is not inherited */
		CHECK_STR(out, "0\n");
	} else {
		/* an orchestrator's positive value is (documented); the protected case
		 * needs CAP_SYS_RESOURCE, which this machine does not give */
		fprintf(stderr, "(no CAP_SYS_RESOURCE: checking the inherited +500 instead of a reset -500)\n");
		CHECK_STR(out, "500\n");
	}
	/* a given value */
	eo.oom_score_adj = 800;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "800\n");
	eo.oom_score_adj = 1000;
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "1000\n");
	struct sbx_error err;
	eo.oom_score_adj = 1001;
	run_fails(c, &eo, EINVAL, &err);
	CHECK_CONTAINS(err.message, "oom_score_adj 1001 out of range");
	if (!protected_shim) {
		/* below the shim's own without CAP_SYS_RESOURCE: the step fails, named */
		eo.oom_score_adj = -100;
		run_fails(c, &eo, EACCES, &err);
		CHECK_CONTAINS(err.message, "oom_score_adj");
	}
	sbx_client_close(c);
	return 0;
}

/* ---- a shim that is not root ---- */

static int case_unprivileged(void)
{
	/* the daemon as nobody, without capabilities: its state dir and socket in a
	 * directory of its own */
	CHECK(chmod(it_dir(), 0711) == 0);
	const char *home = it_path("nobody");
	CHECK(mkdir(home, 0700) == 0 && chown(home, 65534, 65534) == 0);
	char state[256], sock[256];
	snprintf(state, sizeof(state), "%s/state", home);
	snprintf(sock, sizeof(sock), "%s/s.sock", home);
	const char *t = it_unix_target(sock);
	const char *argv[] = {"setpriv",
			      "--reuid=65534",
			      "--regid=65534",
			      "--clear-groups",
			      SHIM_BIN,
			      "--listen",
			      t,
			      "--state-dir",
			      state,
			      NULL};
	it_daemon_start_argv("shim", argv);
	struct sbx_client *c = it_connect(t, NULL);
	char out[128];
	struct sbx_error err;
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.shell = "id -u";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n");
	/* its own user by name: nothing to change, so nothing needs privileges */
	eo.user = "nobody";
	CHECK_EQ(run(c, &eo, out, sizeof(out)), 0);
	CHECK_STR(out, "65534\n");
	/* another user: the step that needs privileges fails, named */
	eo.user = "root";
	run_fails(c, &eo, EPERM, &err);
	CHECK_CONTAINS(err.message, "set");
	eo.user = NULL;

	/* seccomp without CAP_SYS_ADMIN: no_new_privs is set for the command */
	eo.seccomp = "default";
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "1\n");
	status_line(c, &eo, "Seccomp", out, sizeof(out));
	CHECK_STR(out, "2\n");
	eo.seccomp = NULL;

	/* drop_caps: the bounding set needs CAP_SETPCAP; with no_new_privs it is not
	 * needed (execve can grant nothing), without it the command fails */
	eo.drop_caps = 1;
	eo.shell = "true";
	run_fails(c, &eo, EPERM, &err);
	CHECK_CONTAINS(err.message, "capbset_drop");
	eo.no_new_privs = 1;
	status_line(c, &eo, "CapEff", out, sizeof(out));
	CHECK_STR(out, "0000000000000000\n");
	status_line(c, &eo, "NoNewPrivs", out, sizeof(out));
	CHECK_STR(out, "1\n");
	/* a capability it does not have cannot be kept */
	static const char *const keep[] = {"cap_net_bind_service", NULL};
	eo.keep_caps = keep;
	eo.shell = "true";
	run_fails(c, &eo, EPERM, &err);
	CHECK_CONTAINS(err.message, "capset");
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"user", case_user},
		{"user_unknown", case_user_unknown},
		{"no_new_privs", case_no_new_privs},
		{"drop_caps", case_drop_caps},
		{"seccomp_default", case_seccomp_default},
		{"seccomp_none", case_seccomp_none},
		{"seccomp_file", case_seccomp_file},
		{"default_table", case_default_table},
		{"rlimits", case_rlimits},
		{"nice", case_nice},
		{"oom_score_adj", case_oom_score_adj},
		{"unprivileged", case_unprivileged},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
