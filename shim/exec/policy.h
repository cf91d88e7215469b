/* policy.h: per-command restrictions: user and groups, capabilities, no_new_privs, seccomp, rlimits. */
#ifndef SHIM_POLICY_H
#define SHIM_POLICY_H

#include <sys/types.h>

#include "err.h"
#include "shim.pb-c.h"

struct policy;

/* On a worker thread (it reads /etc/passwd, /etc/group and policy files): resolve
 * the user and group (unknown -> EINVAL naming it), capability names, rlimits, and
 * compile the seccomp filter to BPF. *out is owned by the caller (policy_free).
 *   user: a name, or a number (not in the user database: its own number as the
 *     group, no supplementary groups, no HOME/USER); sets the primary group and the
 *     user's groups (getgrouplist). group: a name or number; overrides the primary
 *     group only. Ids equal to the shim's own are not set again (so an unprivileged
 *     shim may name its own user; the command then keeps the shim's groups).
 *   drop_caps: every capability goes (bounding, permitted, effective, inheritable,
 *     ambient) but keep_caps ("cap_net_bind_service" or "net_bind_service"), which
 *     stay effective, also for a non-root user (ambient). keep_caps implies drop_caps.
 *     The bounding set needs CAP_SETPCAP: a shim without it leaves the bounding set
 *     when no_new_privs is set too (execve can then grant nothing), else the command
 *     fails at "capbset_drop" (EPERM).
 *   seccomp: "default" (container/seccomp-default.txt), "none", or an absolute path
 *     of a policy file, read as given (not beneath --root: it is the shim's config).
 *   rlimits: nofile nproc as cpu fsize core stack memlock data rss locks sigpending
 *     msgqueue nice rtprio rttime (soft > hard: EINVAL; UINT64_MAX: unlimited).
 *   nice -20..19 (absent: the shim's; 0 is best effort, any other value must apply).
 *   oom_score_adj -1000..1000; absent: 0 when the shim's own is negative (it may run
 *     protected at -1000: its commands must not inherit that), else the shim's own
 *     (a positive value is the orchestrator's, e.g. a Kubernetes QoS class). */
int policy_prepare(const Shim__V1__ExecRequest *req, struct policy **out, struct shim_err *err);

/* Worker side (reads the user and group databases): user and group as a command's
 * (policy_prepare's rules; each NULL or "" for none): *uid and *gid (the shim's euid
 * and egid where not given), and with a user in the database its groups
 * (getgrouplist; *groups malloc'd, the caller frees; NULL with 0 otherwise). Unknown
 * name: EINVAL naming it. Also the file operations' identity (fsctx.c). */
int policy_lookup_ids(const char *user, const char *group, uid_t *uid, gid_t *gid, gid_t **groups, size_t *ngroups,
		      struct shim_err *err);

/* In the child between fork and exec: nothing allocated, async-signal-safe calls only.
 * Applies rlimits, nice, oom_score_adj, then drops privileges in this order:
 * bounding set, keepcaps, setgroups/setresgid, setresuid, capset, ambient,
 * no_new_privs, seccomp. Without no_new_privs the seccomp filter is loaded first
 * instead, while CAP_SYS_ADMIN is still held (the kernel requires one or the other;
 * a shim without CAP_SYS_ADMIN sets no_new_privs whenever a filter is asked for).
 * Returns 0, or -1 with errno set and *stage naming the step ("setresuid",
 * "seccomp", "capbset_drop", "setrlimit(nofile)", ...). */
int policy_apply_child(const struct policy *p, const char **stage);

/* The uid/gid the command will run as (the shim's own when no user was asked for). */
uid_t policy_uid(const struct policy *p);
gid_t policy_gid(const struct policy *p);
/* The user's home directory and name, when a user was given and is in the user
 * database (for HOME, USER); NULL otherwise. */
const char *policy_home(const struct policy *p);
const char *policy_user(const struct policy *p);

/* Start-up, once (spawn_startup): opens the shim's /proc/self/oom_score_adj and keeps it
 * (policy_own_oom_score_adj opens it on first use otherwise). */
void policy_startup(void);
/* The shim's own /proc/self/oom_score_adj (0 if unreadable), as of now. Blocking (a /proc
 * read). */
int policy_own_oom_score_adj(void);

/* Frees p and what it owns (NULL is fine). */
void policy_free(struct policy *p);

#endif
