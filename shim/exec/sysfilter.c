/* sysfilter.c: seccomp policies for commands: the default deny-list, policy files, BPF built with libseccomp. */
#include "sysfilter.h"
#include "errnames.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the default policy: keep in step with container/seccomp-default.txt ---- */

#define DENY(name)                            \
	{                                     \
		.syscall = name, .err = EPERM \
	}
#define DENY_ERR(name, e)                 \
	{                                 \
		.syscall = name, .err = e \
	}
/* deny when every bit of mask is set in arg0 */
#define DENY_BIT0(name, bit)                                                                                 \
	{                                                                                                    \
		.syscall = name, .err = EPERM, .n_conds = 1, .conds = { {0, SYSFILTER_MASKED_EQ, bit, bit} } \
	}
#define DENY_MASKED0(name, mask, value)                                                                         \
	{                                                                                                       \
		.syscall = name, .err = EPERM, .n_conds = 1, .conds = { {0, SYSFILTER_MASKED_EQ, mask, value} } \
	}

static const struct sysfilter_rule default_rules[] = {
	/* mounts, the new mount API included */
	DENY("mount"),
	DENY("umount"),
	DENY("umount2"),
	DENY("pivot_root"),
	DENY("fsopen"),
	DENY("fsconfig"),
	DENY("fsmount"),
	DENY("fspick"),
	DENY("move_mount"),
	DENY("open_tree"),
	DENY("mount_setattr"),
	/* namespaces; clone3's flags cannot be inspected: ENOSYS makes libcs fall back to clone */
	DENY("setns"),
	DENY("unshare"),
	DENY_BIT0("clone", 0x00020000), /* CLONE_NEWNS */
	DENY_BIT0("clone", 0x02000000), /* CLONE_NEWCGROUP */
	DENY_BIT0("clone", 0x04000000), /* CLONE_NEWUTS */
	DENY_BIT0("clone", 0x08000000), /* CLONE_NEWIPC */
	DENY_BIT0("clone", 0x10000000), /* CLONE_NEWUSER */
	DENY_BIT0("clone", 0x20000000), /* CLONE_NEWPID */
	DENY_BIT0("clone", 0x40000000), /* CLONE_NEWNET */
	DENY_ERR("clone3", ENOSYS),
	/* the kernel itself */
	DENY("init_module"),
	DENY("finit_module"),
	DENY("delete_module"),
	DENY("kexec_load"),
	DENY("kexec_file_load"),
	DENY("reboot"),
	DENY("swapon"),
	DENY("swapoff"),
	DENY("bpf"),
	DENY("perf_event_open"),
	DENY("iopl"),
	DENY("ioperm"),
	DENY("acct"),
	DENY("quotactl"),
	DENY("quotactl_fd"),
	DENY("lookup_dcookie"),
	DENY("syslog"),
	DENY("vhangup"),
	DENY("uselib"),
	/* keyrings */
	DENY("keyctl"),
	DENY("add_key"),
	DENY("request_key"),
	/* file handles */
	DENY("open_by_handle_at"),
	DENY("name_to_handle_at"),
	/* the clock */
	DENY("settimeofday"),
	DENY("stime"),
	DENY("clock_settime"),
	DENY("clock_adjtime"),
	DENY("adjtimex"),
	/* exploit helpers */
	DENY("userfaultfd"),
	DENY("io_uring_setup"),
	DENY("io_uring_enter"),
	DENY("io_uring_register"),
	/* personality: not ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO, READ_IMPLIES_EXEC (bit 31
	 * clear: 0xffffffff is a query) */
	DENY_MASKED0("personality", 0x80040000, 0x00040000),
	DENY_MASKED0("personality", 0x80100000, 0x00100000),
	DENY_MASKED0("personality", 0x80400000, 0x00400000),
};

static const struct sysfilter_policy default_policy = {
	.default_allow = true,
	.default_err = EPERM,
	.n_rules = ARRAY_SIZE(default_rules),
	.rules = default_rules,
};

const struct sysfilter_policy *sysfilter_default(void)
{
	return &default_policy;
}

/* ---- policy files ---- */

static int parse_u64(const char *s, uint64_t *out)
{
	if (s[0] < '0' || s[0] > '9')
		return -1;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

/* "EPERM" or "1" -> 1; -1 when it is neither a known name nor 1..4095. */
static int parse_errno(const char *s)
{
	if (s[0] >= '0' && s[0] <= '9') {
		uint64_t v;
		if (parse_u64(s, &v) < 0 || v < 1 || v > 4095)
			return -1;
		return (int)v;
	}
	int n = errname_num(s);
	return n > 0 ? n : -1;
}

/* argN==V, argN!=V, argN&M, argN&M==V */
static int parse_cond(const char *s, struct sysfilter_cond *c)
{
	if (strncmp(s, "arg", 3) != 0 || s[3] < '0' || s[3] > '5')
		return -1;
	c->arg = (unsigned)(s[3] - '0');
	const char *p = s + 4;
	char num[64];
	if (p[0] == '=' && p[1] == '=') {
		c->op = SYSFILTER_EQ;
		return parse_u64(p + 2, &c->value);
	}
	if (p[0] == '!' && p[1] == '=') {
		c->op = SYSFILTER_NE;
		return parse_u64(p + 2, &c->value);
	}
	if (p[0] != '&')
		return -1;
	c->op = SYSFILTER_MASKED_EQ;
	p++;
	const char *eq = strstr(p, "==");
	size_t mlen = eq != NULL ? (size_t)(eq - p) : strlen(p);
	if (mlen == 0 || mlen >= sizeof(num))
		return -1;
	memcpy(num, p, mlen);
	num[mlen] = '\0';
	if (parse_u64(num, &c->mask) < 0)
		return -1;
	if (eq == NULL) {
		c->value = c->mask;
		return 0;
	}
	if (parse_u64(eq + 2, &c->value) < 0)
		return -1;
	/* a value with bits outside the mask would never match: surely a typo */
	return (c->value & ~c->mask) != 0 ? -1 : 0;
}

#define MAX_TOKENS (3 + SYSFILTER_MAX_CONDS + 1)

/* Split line (modified in place) into whitespace-separated tokens up to a '#'. */
static unsigned tokenize(char *line, char *tok[MAX_TOKENS])
{
	char *hash = strchr(line, '#');
	if (hash != NULL)
		*hash = '\0';
	unsigned n = 0;
	for (char *save = NULL, *t = strtok_r(line, " \t\r", &save); t != NULL; t = strtok_r(NULL, " \t\r", &save)) {
		if (n == MAX_TOKENS)
			return n + 1; /* too many: the caller reports it */
		tok[n++] = t;
	}
	return n;
}

static int parse_line(char **tok, unsigned n, const char *name, unsigned lineno, struct sysfilter_policy *p,
		      struct sysfilter_rule *rules, bool *seen_default, struct shim_err *err)
{
#define BAD(...) err_set(err, EINVAL, name, __VA_ARGS__)
	if (n > MAX_TOKENS)
		return BAD("%s:%u: too many words", name, lineno);
	if (strcmp(tok[0], "default") == 0) {
		if (*seen_default)
			return BAD("%s:%u: a second 'default'", name, lineno);
		*seen_default = true;
		if (n == 2 && strcmp(tok[1], "allow") == 0) {
			p->default_allow = true;
			return 0;
		}
		if ((n == 2 || n == 3) && strcmp(tok[1], "deny") == 0) {
			p->default_allow = false;
			p->default_err = n == 3 ? parse_errno(tok[2]) : EPERM;
			if (p->default_err < 0)
				return BAD("%s:%u: unknown errno '%s'", name, lineno, tok[2]);
			return 0;
		}
		return BAD("%s:%u: want 'default allow' or 'default deny [ERRNO]'", name, lineno);
	}
	bool allow = strcmp(tok[0], "allow") == 0;
	if (!allow && strcmp(tok[0], "deny") != 0)
		return BAD("%s:%u: unknown statement '%s' (want default, allow or deny)", name, lineno, tok[0]);
	if (n < 2)
		return BAD("%s:%u: '%s' needs a syscall name", name, lineno, tok[0]);
	if (p->n_rules >= SYSFILTER_MAX_RULES)
		return BAD("%s:%u: more than %d rules", name, lineno, SYSFILTER_MAX_RULES);
	struct sysfilter_rule *r = &rules[p->n_rules];
	memset(r, 0, sizeof(*r));
	if (strlen(tok[1]) >= sizeof(r->syscall) || seccomp_syscall_resolve_name(tok[1]) == __NR_SCMP_ERROR)
		return BAD("%s:%u: unknown syscall '%s'", name, lineno, tok[1]);
	snprintf(r->syscall, sizeof(r->syscall), "%s", tok[1]);
	r->allow = allow;
	r->err = allow ? 0 : EPERM;
	unsigned i = 2;
	if (!allow && i < n && strncmp(tok[i], "arg", 3) != 0) {
		r->err = parse_errno(tok[i]);
		if (r->err < 0)
			return BAD("%s:%u: unknown errno '%s'", name, lineno, tok[i]);
		i++;
	}
	unsigned args_seen = 0;
	for (; i < n; i++) {
		struct sysfilter_cond *c = &r->conds[r->n_conds];
		if (r->n_conds == SYSFILTER_MAX_CONDS || parse_cond(tok[i], c) < 0)
			return BAD("%s:%u: bad condition '%s' (want argN==V, argN!=V, argN&MASK or argN&MASK==V)", name,
				   lineno, tok[i]);
		/* libseccomp takes one comparison per argument and rule */
		if (args_seen & (1u << c->arg))
			return BAD("%s:%u: two conditions on arg%u in one rule", name, lineno, c->arg);
		args_seen |= 1u << c->arg;
		r->n_conds++;
	}
	p->n_rules++;
	return 0;
#undef BAD
}

int sysfilter_parse(const char *text, size_t len, const char *name, struct sysfilter_policy *out, struct shim_err *err)
{
	struct sysfilter_policy p = {.default_allow = true, .default_err = EPERM};
	/* the rules array is sized by the lines there can be, and at most the limit */
	size_t lines = 1;
	for (size_t i = 0; i < len; i++)
		lines += text[i] == '\n';
	size_t cap = lines < SYSFILTER_MAX_RULES ? lines : SYSFILTER_MAX_RULES;
	struct sysfilter_rule *rules = calloc(cap, sizeof(*rules));
	if (rules == NULL)
		return err_set(err, ENOMEM, name, "out of memory");
	bool seen_default = false;
	unsigned lineno = 0;
	for (size_t pos = 0; pos < len;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t llen = nl != NULL ? (size_t)(nl - (text + pos)) : len - pos;
		lineno++;
		char line[1024];
		if (llen >= sizeof(line)) {
			free(rules);
			return err_set(err, EINVAL, name, "%s:%u: line too long", name, lineno);
		}
		memcpy(line, text + pos, llen);
		line[llen] = '\0';
		pos += llen + (nl != NULL);
		if (memchr(line, '\0', llen) != NULL) {
			free(rules);
			return err_set(err, EINVAL, name, "%s:%u: NUL byte", name, lineno);
		}
		char *tok[MAX_TOKENS];
		unsigned n = tokenize(line, tok);
		if (n == 0)
			continue;
		if (parse_line(tok, n, name, lineno, &p, rules, &seen_default, err) < 0) {
			free(rules);
			return -1;
		}
	}
	/* The filter is loaded right before execve: a policy under which execve always
	 * fails could never start a command (and could not even say why). */
	bool exec_ok = p.default_allow;
	for (size_t i = 0; i < p.n_rules; i++) {
		if (strcmp(rules[i].syscall, "execve") != 0)
			continue;
		if (rules[i].allow)
			exec_ok = true;
		else if (rules[i].n_conds == 0 && p.default_allow)
			exec_ok = false;
	}
	if (!exec_ok) {
		free(rules);
		return err_set(err, EINVAL, name, "%s: execve is denied: no command could start (allow execve)", name);
	}
	p.owned = rules;
	p.rules = rules;
	*out = p;
	return 0;
}

int sysfilter_read_file(const char *path, struct sysfilter_policy *out, struct shim_err *err)
{
	cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return err_set(err, errno, path, "seccomp policy %s", path);
	struct stat st;
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, path, "seccomp policy %s: fstat", path);
	if (!S_ISREG(st.st_mode))
		return err_set(err, EINVAL, path, "seccomp policy %s: not a regular file", path);
	if (st.st_size > SYSFILTER_MAX_FILE)
		return err_set(err, EFBIG, path, "seccomp policy %s: larger than %d bytes", path, SYSFILTER_MAX_FILE);
	cleanup_free char *buf = malloc(SYSFILTER_MAX_FILE + 1);
	if (buf == NULL)
		return err_set(err, ENOMEM, path, "out of memory");
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, SYSFILTER_MAX_FILE + 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return err_set(err, errno, path, "seccomp policy %s: read", path);
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > SYSFILTER_MAX_FILE) /* grew since fstat */
			return err_set(err, EFBIG, path, "seccomp policy %s: larger than %d bytes", path,
				       SYSFILTER_MAX_FILE);
	}
	return sysfilter_parse(buf, len, path, out, err);
}

void sysfilter_free(struct sysfilter_policy *p)
{
	free(p->owned);
	p->owned = NULL;
	p->rules = NULL;
	p->n_rules = 0;
}

/* ---- BPF ---- */

static void release_ctx(scmp_filter_ctx *ctx)
{
	if (*ctx != NULL)
		seccomp_release(*ctx);
}

/* The 32-bit ABIs a native process can also call the kernel with. */
static int add_compat_arches(scmp_filter_ctx ctx)
{
	static const struct {
		uint32_t native, compat;
	} compat[] = {
		{SCMP_ARCH_X86_64, SCMP_ARCH_X86},
		{SCMP_ARCH_X86_64, SCMP_ARCH_X32},
		{SCMP_ARCH_AARCH64, SCMP_ARCH_ARM},
	};
	uint32_t native = seccomp_arch_native();
	for (size_t i = 0; i < ARRAY_SIZE(compat); i++) {
		if (compat[i].native != native)
			continue;
		int rc = seccomp_arch_add(ctx, compat[i].compat);
		if (rc < 0 && rc != -EEXIST)
			return rc;
	}
	return 0;
}

static uint32_t action_of(bool allow, int e)
{
	return allow ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO((uint32_t)e);
}

int sysfilter_compile(const struct sysfilter_policy *p, struct sock_fprog *out, struct shim_err *err)
{
	uint32_t def = action_of(p->default_allow, p->default_err);
	__attribute__((cleanup(release_ctx))) scmp_filter_ctx ctx = seccomp_init(def);
	if (ctx == NULL)
		return err_set(err, ENOMEM, NULL, "seccomp_init");
	int rc = add_compat_arches(ctx);
	if (rc < 0)
		return err_set(err, -rc, NULL, "seccomp_arch_add");
	for (size_t i = 0; i < p->n_rules; i++) {
		const struct sysfilter_rule *r = &p->rules[i];
		uint32_t act = action_of(r->allow, r->err);
		if (act == def)
			continue; /* libseccomp refuses (EACCES) a rule that is the default */
		int nr = seccomp_syscall_resolve_name(r->syscall);
		if (nr == __NR_SCMP_ERROR)
			return err_set(err, EINVAL, r->syscall, "unknown syscall %s", r->syscall);
		struct scmp_arg_cmp cmp[SYSFILTER_MAX_CONDS];
		for (unsigned c = 0; c < r->n_conds; c++) {
			const struct sysfilter_cond *cd = &r->conds[c];
			cmp[c].arg = cd->arg;
			switch (cd->op) {
			case SYSFILTER_EQ:
				cmp[c].op = SCMP_CMP_EQ;
				cmp[c].datum_a = cd->value;
				cmp[c].datum_b = 0;
				break;
			case SYSFILTER_NE:
				cmp[c].op = SCMP_CMP_NE;
				cmp[c].datum_a = cd->value;
				cmp[c].datum_b = 0;
				break;
			case SYSFILTER_MASKED_EQ:
				cmp[c].op = SCMP_CMP_MASKED_EQ;
				cmp[c].datum_a = cd->mask;
				cmp[c].datum_b = cd->value;
				break;
			}
		}
		rc = seccomp_rule_add_array(ctx, act, nr, r->n_conds, cmp);
		if (rc < 0)
			return err_set(err, -rc, r->syscall, "seccomp rule for %s", r->syscall);
	}
	/* export into memory: a memfd, read back */
	cleanup_close int fd = memfd_create("sandbox-shim-seccomp", MFD_CLOEXEC);
	if (fd < 0)
		return err_set(err, errno, NULL, "memfd_create");
	rc = seccomp_export_bpf(ctx, fd);
	if (rc < 0)
		return err_set(err, -rc, NULL, "seccomp_export_bpf");
	struct stat st;
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, NULL, "fstat memfd");
	size_t size = (size_t)st.st_size;
	if (size == 0 || size % sizeof(struct sock_filter) != 0 || size / sizeof(struct sock_filter) > BPF_MAXINSNS)
		return err_set(err, E2BIG, NULL, "seccomp filter of %zu bytes", size);
	struct sock_filter *insns = malloc(size);
	if (insns == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	for (size_t got = 0; got < size;) {
		ssize_t n = pread(fd, (char *)insns + got, size - got, (off_t)got);
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;
			free(insns);
			return err_set(err, e, NULL, "read memfd");
		}
		got += (size_t)n;
	}
	out->len = (unsigned short)(size / sizeof(struct sock_filter));
	out->filter = insns;
	return 0;
}

void sysfilter_prog_free(struct sock_fprog *prog)
{
	free(prog->filter);
	prog->filter = NULL;
	prog->len = 0;
}

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sock_fprog default_prog;

int sysfilter_default_prog(const struct sock_fprog **out, struct shim_err *err)
{
	pthread_mutex_lock(&default_mu);
	int rc = 0;
	if (default_prog.filter == NULL)
		rc = sysfilter_compile(&default_policy, &default_prog, err);
	pthread_mutex_unlock(&default_mu);
	if (rc == 0)
		*out = &default_prog;
	return rc;
}

int sysfilter_load(const struct sock_fprog *prog)
{
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0);
}
