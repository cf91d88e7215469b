/* policy.h: per-command restrictions: user and groups, capabilities, no_new_privs, seccomp, rlimits. */
#ifndef SHIM_POLICY_H
#define SHIM_POLICY_H

#include <sys/types.h>

#include "err.h"
#include "shim.pb-c.h"

struct policy;

/* On a worker thread (it reads /etc/passwd, /etc/group and policy files): resolve
 * the user and group (unknown -> EINVAL naming it), capability names, rlimits, and
 * compile the seccomp filter to BPF. *out is owned by the caller (policy_free). */
int policy_prepare(const Shim__V1__ExecRequest *req, struct policy **out, struct shim_err *err);

/* In the child between fork and exec: nothing allocated, async-signal-safe calls only.
 * Applies rlimits, nice, oom_score_adj, then drops privileges in this order:
 * bounding set, keepcaps, setgroups/setresgid, setresuid, capset, ambient,
 * no_new_privs, seccomp. Returns 0, or -1 with errno set and *stage naming the step. */
int policy_apply_child(const struct policy *p, const char **stage);

/* The uid/gid the command will run as (the shim's own when no user was asked for). */
uid_t policy_uid(const struct policy *p);
gid_t policy_gid(const struct policy *p);
/* The user's home directory and name, when a user was given (for HOME, USER). */
const char *policy_home(const struct policy *p);
const char *policy_user(const struct policy *p);

void policy_free(struct policy *p);

#endif
