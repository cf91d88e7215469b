/* sysfilter.h: seccomp policies for commands: the default deny-list, policy files, BPF built with libseccomp. */
#ifndef SHIM_SYSFILTER_H
#define SHIM_SYSFILTER_H

#include <linux/filter.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define SYSFILTER_MAX_CONDS 6    /* one per syscall argument */
#define SYSFILTER_MAX_RULES 1024 /* in a policy file */
#define SYSFILTER_MAX_FILE 65536 /* bytes of a policy file */
#define SYSFILTER_MAX_NAME 48    /* syscall names are shorter */

enum sysfilter_op {
	SYSFILTER_EQ,        /* argN==VALUE */
	SYSFILTER_NE,        /* argN!=VALUE */
	SYSFILTER_MASKED_EQ, /* argN&MASK==VALUE (argN&MASK: VALUE = MASK) */
};

struct sysfilter_cond {
	unsigned arg; /* 0..5 */
	enum sysfilter_op op;
	uint64_t mask; /* SYSFILTER_MASKED_EQ only */
	uint64_t value;
};

struct sysfilter_rule {
	char syscall[SYSFILTER_MAX_NAME];
	bool allow; /* else deny with err */
	int err;    /* errno returned by a denied call */
	unsigned n_conds;
	struct sysfilter_cond conds[SYSFILTER_MAX_CONDS];
};

struct sysfilter_policy {
	bool default_allow; /* else unlisted calls fail with default_err */
	int default_err;
	size_t n_rules;
	const struct sysfilter_rule *rules;
	struct sysfilter_rule *owned; /* == rules when parsed (freed by sysfilter_free) */
};

/* The "default" policy: the C twin of container/seccomp-default.txt (a test
 * compares them). Static data: never freed. */
const struct sysfilter_policy *sysfilter_default(void);

/* Parse a policy's text (format: container/seccomp-default.txt). name labels the
 * errors ("FILE:LINE: ..."). Unknown syscalls, errnos, bad conditions -> EINVAL.
 * On success *out owns its rules (sysfilter_free). */
int sysfilter_parse(const char *text, size_t len, const char *name, struct sysfilter_policy *out, struct shim_err *err);
/* Read and parse a policy file (at most SYSFILTER_MAX_FILE bytes). Blocking: run it
 * on a worker. The path is used as given (policy files are the shim's own config,
 * not confined by --root). */
int sysfilter_read_file(const char *path, struct sysfilter_policy *out, struct shim_err *err);
void sysfilter_free(struct sysfilter_policy *p);

/* Build the BPF program with libseccomp, for the native ABI and its 32-bit compat
 * ABIs. out->filter is malloc'd (sysfilter_prog_free). */
int sysfilter_compile(const struct sysfilter_policy *p, struct sock_fprog *out, struct shim_err *err);
void sysfilter_prog_free(struct sock_fprog *prog);
/* The default policy compiled once (thread-safe; shared, never freed). */
int sysfilter_default_prog(const struct sock_fprog **out, struct shim_err *err);

/* In a forked child: install prog for this process (and what it executes).
 * Async-signal-safe. Returns 0 or -1 with errno. */
int sysfilter_load(const struct sock_fprog *prog);

#endif
