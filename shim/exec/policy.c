/* policy.c: per-command restrictions, prepared in the parent and applied in the child. */
#include "policy.h"
#include "sysfilter.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_GROUPS 65536         /* NGROUPS_MAX */
#define MAX_PW_BUF (1024 * 1024) /* getpwnam_r & co: a generous bound for one entry */

struct policy_rlimit {
	int resource;
	const char *stage; /* "setrlimit(nofile)" */
	struct rlimit lim;
};

struct policy {
	/* credentials: each step only when it changes something */
	bool set_groups, set_gid, set_uid;
	uid_t uid;
	gid_t gid;
	gid_t *groups;
	size_t ngroups;
	char *home, *user; /* when a user was given and is in the user database */

	/* capabilities */
	bool drop_caps;
	bool drop_bounding; /* PR_CAPBSET_DROP (needs CAP_SETPCAP) */
	bool keepcaps;      /* PR_SET_KEEPCAPS: keep the permitted set across the uid change */
	uint64_t keep;      /* bit per capability kept */
	unsigned last_cap;
	struct __user_cap_data_struct caps[2]; /* effective = permitted = inheritable = keep */
	bool nnp;

	/* seccomp */
	const struct sock_fprog *prog; /* NULL: no filter */
	struct sock_fprog own_prog;    /* compiled from a policy file (prog points here) */
	bool seccomp_early;            /* load before the privilege drop (no no_new_privs) */

	/* limits and scheduling */
	unsigned n_rlimits;
	struct policy_rlimit rlimits[RLIM_NLIMITS];
	bool set_nice, nice_strict;
	int nice;
	bool set_oom, oom_strict;
	char oom[16];
	size_t oom_len;
};

/* ---- users and groups ---- */

/* Whether this process has cap in its effective set. */
static bool have_cap(cap_value_t cap)
{
	cap_t caps = cap_get_proc();
	if (caps == NULL)
		return false;
	cap_flag_value_t v = CAP_CLEAR;
	cap_get_flag(caps, cap, CAP_EFFECTIVE, &v);
	cap_free(caps);
	return v == CAP_SET;
}

/* A decimal id (not the reserved -1); -1 when s is not all digits. */
static int parse_id(const char *s, uint32_t *out)
{
	if (s[0] == '\0')
		return -1;
	uint64_t v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
		if (v > 0xfffffffeu)
			return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* "not found" as the NSS functions report it: 0 with no result, or one of these */
static bool not_found(int rc)
{
	return rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM;
}

/* Resolve spec (a name or a number) from the user database. A number that is not
 * in it is still a valid uid (*found false); an unknown name is EINVAL. */
static int lookup_user(const char *spec, struct policy *p, gid_t *pw_gid, bool *found, struct shim_err *err)
{
	uint32_t id;
	bool numeric = parse_id(spec, &id) == 0;
	for (size_t size = 16384;; size *= 4) {
		cleanup_free char *buf = malloc(size);
		if (buf == NULL)
			return err_set(err, ENOMEM, spec, "out of memory");
		struct passwd pw, *res = NULL;
		int rc = numeric ? getpwuid_r(id, &pw, buf, size, &res) : getpwnam_r(spec, &pw, buf, size, &res);
		if (rc == ERANGE && size < MAX_PW_BUF)
			continue;
		if (res == NULL) {
			if (!not_found(rc))
				return err_set(err, rc, spec, "looking up user %s", spec);
			if (!numeric)
				return err_set(err, EINVAL, spec, "unknown user %s", spec);
			p->uid = id;
			*found = false;
			return 0;
		}
		p->uid = pw.pw_uid;
		*pw_gid = pw.pw_gid;
		p->user = strdup(pw.pw_name);
		p->home = strdup(pw.pw_dir);
		if (p->user == NULL || p->home == NULL)
			return err_set(err, ENOMEM, spec, "out of memory");
		*found = true;
		return 0;
	}
}

static int lookup_group(const char *spec, gid_t *gid, struct shim_err *err)
{
	uint32_t id;
	if (parse_id(spec, &id) == 0) {
		*gid = id;
		return 0;
	}
	for (size_t size = 16384;; size *= 4) {
		cleanup_free char *buf = malloc(size);
		if (buf == NULL)
			return err_set(err, ENOMEM, spec, "out of memory");
		struct group gr, *res = NULL;
		int rc = getgrnam_r(spec, &gr, buf, size, &res);
		if (rc == ERANGE && size < MAX_PW_BUF)
			continue;
		if (res == NULL) {
			if (!not_found(rc))
				return err_set(err, rc, spec, "looking up group %s", spec);
			return err_set(err, EINVAL, spec, "unknown group %s", spec);
		}
		*gid = gr.gr_gid;
		return 0;
	}
}

/* The user's supplementary groups, as a login would set them. */
static int user_groups(struct policy *p, gid_t base, struct shim_err *err)
{
	int n = 64;
	for (;;) {
		gid_t *g = malloc((size_t)n * sizeof(*g));
		if (g == NULL)
			return err_set(err, ENOMEM, p->user, "out of memory");
		int want = n;
		if (getgrouplist(p->user, base, g, &want) >= 0) {
			p->groups = g;
			p->ngroups = (size_t)want;
			return 0;
		}
		free(g);
		if (want <= n || want > MAX_GROUPS)
			return err_set(err, E2BIG, p->user, "user %s: too many groups", p->user);
		n = want;
	}
}

/* Whether the process's supplementary groups are exactly p's (then setgroups,
 * which needs CAP_SETGID, is left out). */
static bool same_groups(const struct policy *p)
{
	int n = getgroups(0, NULL);
	if (n < 0 || (size_t)n != p->ngroups)
		return false;
	if (n == 0)
		return true;
	cleanup_free gid_t *cur = malloc((size_t)n * sizeof(*cur));
	if (cur == NULL || getgroups(n, cur) != n)
		return false;
	for (size_t i = 0; i < p->ngroups; i++) {
		bool in = false;
		for (int j = 0; j < n && !in; j++)
			in = cur[j] == p->groups[i];
		if (!in)
			return false;
	}
	return true;
}

/* p's uid, gid, groups (and user, home) from a user and group spec, each NULL or ""
 * for none: the shim's own euid and egid then (and no groups: the shim's). */
static int resolve_ids(const char *user, const char *group, struct policy *p, struct shim_err *err)
{
	bool has_user = user != NULL && user[0] != '\0';
	bool has_group = group != NULL && group[0] != '\0';
	p->uid = geteuid();
	p->gid = getegid();
	if (!has_user && !has_group)
		return 0;

	gid_t pw_gid = 0;
	bool found = false;
	if (has_user && lookup_user(user, p, &pw_gid, &found, err) < 0)
		return -1;
	if (has_group) {
		if (lookup_group(group, &p->gid, err) < 0)
			return -1;
	} else if (found) {
		p->gid = pw_gid;
	} else if (has_user) {
		/* a uid without a passwd entry: its own number as the group (the usual
		 * user-private group), never root's group by accident */
		p->gid = p->uid;
	}
	/* the user's groups (none for a bare uid), not the shim's */
	if (found && user_groups(p, pw_gid, err) < 0)
		return -1;
	return 0;
}

int policy_lookup_ids(const char *user, const char *group, uid_t *uid, gid_t *gid, gid_t **groups, size_t *ngroups,
		      struct shim_err *err)
{
	struct policy p;
	memset(&p, 0, sizeof(p));
	int rc = resolve_ids(user, group, &p, err);
	if (rc == 0) {
		*uid = p.uid;
		*gid = p.gid;
		*groups = p.groups;
		*ngroups = p.ngroups;
		p.groups = NULL;
	}
	free(p.groups);
	free(p.user);
	free(p.home);
	return rc;
}

static int prepare_ids(const Shim__V1__ExecRequest *req, struct policy *p, struct shim_err *err)
{
	bool has_user = req->user != NULL && req->user[0] != '\0';
	uid_t ruid, euid, suid;
	gid_t rgid, egid, sgid;
	getresuid(&ruid, &euid, &suid);
	getresgid(&rgid, &egid, &sgid);
	if (resolve_ids(req->user, req->group, p, err) < 0)
		return -1;
	if (!has_user && (req->group == NULL || req->group[0] == '\0'))
		return 0;
	if (has_user) {
		p->set_groups = !same_groups(p);
		p->set_uid = !(ruid == p->uid && euid == p->uid && suid == p->uid);
	}
	p->set_gid = !(rgid == p->gid && egid == p->gid && sgid == p->gid);
	/* A shim that may not set groups, naming its own user: the command runs with
	 * the shim's groups. No boundary is lost: a process of the same uid and gid
	 * could reach the shim's groups through the shim anyway (ptrace, /proc). */
	if (p->set_groups && !p->set_uid && !p->set_gid && !have_cap(CAP_SETGID))
		p->set_groups = false;
	return 0;
}

/* ---- capabilities ---- */

static int prepare_caps(const Shim__V1__ExecRequest *req, struct policy *p, struct shim_err *err)
{
	p->drop_caps = req->has_drop_caps && req->drop_caps;
	/* a list of capabilities to keep only makes sense with the others dropped */
	if (req->n_keep_caps > 0)
		p->drop_caps = true;
	if (!p->drop_caps)
		return 0;
	int bits = cap_max_bits();
	if (bits <= 0 || bits > 64)
		return err_set(err, ENOSYS, NULL, "capabilities: this kernel knows %d", bits);
	p->last_cap = (unsigned)bits - 1;
	for (size_t i = 0; i < req->n_keep_caps; i++) {
		const char *name = req->keep_caps[i];
		cap_value_t v;
		if (cap_from_name(name, &v) < 0) {
			/* also without the prefix: "net_bind_service" */
			char full[64];
			if (snprintf(full, sizeof(full), "cap_%s", name) >= (int)sizeof(full) ||
			    cap_from_name(full, &v) < 0)
				return err_set(err, EINVAL, name, "unknown capability %s", name);
		}
		if (v < 0 || (unsigned)v > p->last_cap)
			return err_set(err, EINVAL, name, "capability %s is not supported by this kernel", name);
		p->keep |= UINT64_C(1) << v;
	}
	for (int i = 0; i < 2; i++) {
		uint32_t w = (uint32_t)(p->keep >> (32 * i));
		p->caps[i].effective = p->caps[i].permitted = p->caps[i].inheritable = w;
	}
	/* a uid change from root clears the permitted set, unless told to keep it */
	p->keepcaps = p->set_uid && p->keep != 0;
	return 0;
}

/* ---- seccomp ---- */

static int prepare_seccomp(const Shim__V1__ExecRequest *req, struct policy *p, struct shim_err *err)
{
	p->nnp = req->has_no_new_privs && req->no_new_privs;
	const char *s = req->seccomp;
	if (s == NULL || s[0] == '\0' || strcmp(s, "none") == 0)
		return 0;
	if (strcmp(s, "default") == 0) {
		if (sysfilter_default_prog(&p->prog, err) < 0)
			return -1;
	} else if (s[0] == '/') {
		struct sysfilter_policy pol;
		if (sysfilter_read_file(s, &pol, err) < 0)
			return -1;
		int rc = sysfilter_compile(&pol, &p->own_prog, err);
		sysfilter_free(&pol);
		if (rc < 0)
			return -1;
		p->prog = &p->own_prog;
	} else {
		return err_set(err, EINVAL, s,
			       "unknown seccomp policy %s (want default, none or an absolute file path)", s);
	}
	/* The kernel loads a filter only with no_new_privs or CAP_SYS_ADMIN. Without
	 * no_new_privs asked for, the filter goes in while we still hold CAP_SYS_ADMIN,
	 * before the privilege drop (as runc does); a shim without that capability has
	 * no choice but to set no_new_privs for the command. */
	if (!p->nnp && !have_cap(CAP_SYS_ADMIN))
		p->nnp = true;
	p->seccomp_early = !p->nnp;
	return 0;
}

/* ---- limits ---- */

static const struct {
	const char *name;
	const char *stage;
	int resource;
} rlimit_names[] = {
	{"as", "setrlimit(as)", RLIMIT_AS},
	{"core", "setrlimit(core)", RLIMIT_CORE},
	{"cpu", "setrlimit(cpu)", RLIMIT_CPU},
	{"data", "setrlimit(data)", RLIMIT_DATA},
	{"fsize", "setrlimit(fsize)", RLIMIT_FSIZE},
	{"locks", "setrlimit(locks)", RLIMIT_LOCKS},
	{"memlock", "setrlimit(memlock)", RLIMIT_MEMLOCK},
	{"msgqueue", "setrlimit(msgqueue)", RLIMIT_MSGQUEUE},
	{"nice", "setrlimit(nice)", RLIMIT_NICE},
	{"nofile", "setrlimit(nofile)", RLIMIT_NOFILE},
	{"nproc", "setrlimit(nproc)", RLIMIT_NPROC},
	{"rss", "setrlimit(rss)", RLIMIT_RSS},
	{"rtprio", "setrlimit(rtprio)", RLIMIT_RTPRIO},
	{"rttime", "setrlimit(rttime)", RLIMIT_RTTIME},
	{"sigpending", "setrlimit(sigpending)", RLIMIT_SIGPENDING},
	{"stack", "setrlimit(stack)", RLIMIT_STACK},
};

static rlim_t to_rlim(uint64_t v)
{
	return v == UINT64_MAX || v >= (uint64_t)RLIM_INFINITY ? RLIM_INFINITY : (rlim_t)v;
}

static int prepare_limits(const Shim__V1__ExecRequest *req, struct policy *p, struct shim_err *err)
{
	for (size_t i = 0; i < req->n_rlimits; i++) {
		const Shim__V1__Rlimit *rl = req->rlimits[i];
		const char *name = rl->name != NULL ? rl->name : "";
		size_t k = 0;
		while (k < ARRAY_SIZE(rlimit_names) && strcmp(rlimit_names[k].name, name) != 0)
			k++;
		if (k == ARRAY_SIZE(rlimit_names))
			return err_set(err, EINVAL, name, "unknown rlimit %s", name);
		struct rlimit lim = {.rlim_cur = to_rlim(rl->soft),
				     .rlim_max = to_rlim(rl->has_hard ? rl->hard : rl->soft)};
		if (lim.rlim_cur > lim.rlim_max)
			return err_set(err, EINVAL, name, "rlimit %s: soft limit above the hard limit", name);
		/* a name given twice: the last one counts */
		unsigned j = 0;
		while (j < p->n_rlimits && p->rlimits[j].resource != rlimit_names[k].resource)
			j++;
		if (j == p->n_rlimits)
			p->n_rlimits++;
		p->rlimits[j].resource = rlimit_names[k].resource;
		p->rlimits[j].stage = rlimit_names[k].stage;
		p->rlimits[j].lim = lim;
	}
	if (req->has_nice) {
		if (req->nice < -20 || req->nice > 19)
			return err_set(err, EINVAL, NULL, "nice %d out of range (-20..19)", req->nice);
		p->set_nice = true;
		p->nice = req->nice;
		/* 0 is the default: best effort (a shim running niced without the right to
		 * lower it leaves its commands at its own level) */
		p->nice_strict = req->nice != 0;
	}
	/* oom_score_adj: the shim itself may run protected (-1000); its commands must not
	 * inherit that: absent means 0 then. A positive value of the shim's is kept: it
	 * is the orchestrator's (docker --oom-score-adj, a Kubernetes QoS class), and
	 * lowering it would need CAP_SYS_RESOURCE anyway. */
	int oom = 0;
	if (req->has_oom_score_adj) {
		if (req->oom_score_adj < -1000 || req->oom_score_adj > 1000)
			return err_set(err, EINVAL, NULL, "oom_score_adj %d out of range (-1000..1000)",
				       req->oom_score_adj);
		oom = req->oom_score_adj;
		p->set_oom = p->oom_strict = true;
	} else {
		p->set_oom = policy_own_oom_score_adj() < 0;
	}
	p->oom_len = (size_t)snprintf(p->oom, sizeof(p->oom), "%d\n", oom);
	return 0;
}

/* The shim's /proc/self/oom_score_adj, opened once: a pread at 0 gives the value of
 * the moment (an orchestrator may change it while we run) without a path walk
 * through /proc per command (open, read, close: a fifth of a spawn's preparation). */
static int oom_fd = -1;
static pthread_once_t oom_once = PTHREAD_ONCE_INIT;

static void oom_open(void)
{
	oom_fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
}

void policy_startup(void)
{
	pthread_once(&oom_once, oom_open);
}

int policy_own_oom_score_adj(void)
{
	char cur[16];
	pthread_once(&oom_once, oom_open);
	if (oom_fd < 0)
		return 0;
	ssize_t n = pread(oom_fd, cur, sizeof(cur) - 1, 0);
	if (n <= 0)
		return 0;
	cur[n] = '\0';
	return atoi(cur);
}

/* ---- the API ---- */

int policy_prepare(const Shim__V1__ExecRequest *req, struct policy **out, struct shim_err *err)
{
	struct policy *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	if (prepare_ids(req, p, err) < 0 || prepare_caps(req, p, err) < 0 || prepare_seccomp(req, p, err) < 0 ||
	    prepare_limits(req, p, err) < 0) {
		policy_free(p);
		return -1;
	}
	/* The bounding set only matters for what execve could grant (setuid-root and
	 * file-capability programs); with no_new_privs it grants nothing. So a shim
	 * without CAP_SETPCAP (not root) still honours drop_caps with no_new_privs;
	 * without no_new_privs it fails, honestly, at capbset_drop (EPERM). */
	p->drop_bounding = p->drop_caps && !(p->nnp && !have_cap(CAP_SETPCAP));
	*out = p;
	return 0;
}

#define FAIL(name)               \
	do {                     \
		*stage = (name); \
		return -1;       \
	} while (0)

int policy_apply_child(const struct policy *p, const char **stage)
{
	for (unsigned i = 0; i < p->n_rlimits; i++)
		if (setrlimit(p->rlimits[i].resource, &p->rlimits[i].lim) < 0)
			FAIL(p->rlimits[i].stage);
	if (p->set_nice && setpriority(PRIO_PROCESS, 0, p->nice) < 0 && p->nice_strict)
		FAIL("setpriority");
	if (p->set_oom) {
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? write(fd, p->oom, p->oom_len) : -1;
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (n != (ssize_t)p->oom_len && p->oom_strict) {
			errno = n < 0 ? e : EIO;
			FAIL("oom_score_adj");
		}
	}
	if (p->prog != NULL && p->seccomp_early && sysfilter_load(p->prog) < 0)
		FAIL("seccomp");
	if (p->drop_bounding) {
		/* the bounding set first: it needs CAP_SETPCAP, which the rest takes away */
		for (unsigned c = 0; c <= p->last_cap; c++) {
			if (p->keep & (UINT64_C(1) << c))
				continue;
			int in = prctl(PR_CAPBSET_READ, c, 0, 0, 0);
			if (in > 0 && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0)
				FAIL("capbset_drop");
		}
	}
	if (p->keepcaps && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
		FAIL("keepcaps");
	/* Raw syscalls: glibc's wrappers change every thread of the process (setxid
	 * broadcast over its thread list), which in a child sharing the parent's memory
	 * (CLONE_VM) would reach for the parent's threads. The kernel call changes this
	 * task, which is all there is in a forked child. */
	if (p->set_groups && syscall(SYS_setgroups, p->ngroups, p->groups) < 0)
		FAIL("setgroups");
	if (p->set_gid && syscall(SYS_setresgid, p->gid, p->gid, p->gid) < 0)
		FAIL("setresgid");
	if (p->set_uid && syscall(SYS_setresuid, p->uid, p->uid, p->uid) < 0)
		FAIL("setresuid");
	if (p->drop_caps) {
		/* raw capset: libcap's cap_set_proc allocates */
		struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
		struct __user_cap_data_struct data[2];
		memcpy(data, p->caps, sizeof(data));
		if (syscall(SYS_capset, &hdr, data) < 0)
			FAIL("capset");
		/* ambient: the kept capabilities survive execve for a non-root user too */
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
			FAIL("cap_ambient_clear");
		for (unsigned c = 0; c <= p->last_cap; c++)
			if ((p->keep & (UINT64_C(1) << c)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c, 0, 0) < 0)
				FAIL("cap_ambient_raise");
	}
	if (p->nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		FAIL("no_new_privs");
	if (p->prog != NULL && !p->seccomp_early && sysfilter_load(p->prog) < 0)
		FAIL("seccomp");
	return 0;
}

uid_t policy_uid(const struct policy *p)
{
	return p->uid;
}

gid_t policy_gid(const struct policy *p)
{
	return p->gid;
}

const char *policy_home(const struct policy *p)
{
	return p->home;
}

const char *policy_user(const struct policy *p)
{
	return p->user;
}

void policy_free(struct policy *p)
{
	if (p == NULL)
		return;
	free(p->groups);
	free(p->home);
	free(p->user);
	sysfilter_prog_free(&p->own_prog);
	free(p);
}
