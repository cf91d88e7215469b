/* fsctx.c: per-thread identity and resolve flags of the file operation running.
 *
 * The identity is the thread's fsuid, fsgid and supplementary groups, set with raw
 * syscalls: the kernel keeps credentials per thread, and only the libc wrappers of
 * setgroups & co make every thread of the process follow (a signal to each). So a
 * worker acting as "nobody" changes nothing for the workers beside it. setfsuid
 * cannot report an error: each change is read back (setfsuid(-1) returns the
 * current value without changing it). A root fsuid keeps the file capabilities
 * (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER...) in effect; any other drops them from
 * the thread's effective set, and going back to 0 raises them again. */
#include "fsctx.h"
#include "log.h"
#include "policy.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Thread_local unsigned cur_resolve;
static _Thread_local bool cur_as_user; /* the thread's ids are not the shim's */
static _Thread_local bool cur_groups;  /* and its groups too */
static _Thread_local uid_t cur_uid;
static _Thread_local gid_t cur_gid;
static _Thread_local struct fs_ctx cur_ctx; /* with cur_as_user: what was entered */

/* the shim's own identity, saved once */
static pthread_once_t own_once = PTHREAD_ONCE_INIT;
static uid_t own_uid;
static gid_t own_gid;
static gid_t *own_groups;
static size_t own_ngroups;

/* --fs-user */
static bool have_default;
static struct fs_ctx default_ctx;

static void own_init(void)
{
	own_uid = geteuid();
	own_gid = getegid();
	int n = getgroups(0, NULL);
	if (n > 0) {
		own_groups = malloc((size_t)n * sizeof(*own_groups));
		if (own_groups != NULL) {
			n = getgroups(n, own_groups);
			own_ngroups = n > 0 ? (size_t)n : 0;
		}
	}
}

static void own_load(void)
{
	pthread_once(&own_once, own_init);
}

gid_t fs_ctx_gid(void)
{
	if (cur_as_user)
		return cur_gid;
	own_load();
	return own_gid;
}

unsigned fs_ctx_resolve(void)
{
	return cur_resolve;
}

uid_t fs_ctx_uid(void)
{
	if (cur_as_user)
		return cur_uid;
	own_load();
	return own_uid;
}

static unsigned opt_resolve(const Shim__V1__FsOptions *opt)
{
	unsigned r = 0;
	if (opt == NULL)
		return 0;
	if (opt->has_no_follow && opt->no_follow)
		r |= FS_NO_FOLLOW;
	if (opt->has_no_symlinks && opt->no_symlinks)
		r |= FS_NO_SYMLINKS;
	return r;
}

static bool named(const char *s)
{
	return s != NULL && s[0] != '\0';
}

static int copy_name(char dst[FS_CTX_NAME], const char *src, const char *what, struct shim_err *err)
{
	size_t n = strlen(src);
	if (n >= FS_CTX_NAME)
		return err_set(err, EINVAL, NULL, "%s name too long (%zu bytes, at most %d)", what, n, FS_CTX_NAME - 1);
	memcpy(dst, src, n + 1);
	return 0;
}

/* ctx's ids from the names already in ctx->user and ctx->group (either may be ""). */
static int lookup(struct fs_ctx *ctx, struct shim_err *err)
{
	uid_t uid;
	gid_t gid;
	gid_t *groups = NULL;
	size_t ngroups = 0;
	if (policy_lookup_ids(ctx->user, ctx->group, &uid, &gid, &groups, &ngroups, err) < 0)
		return -1;
	if (ngroups > FS_CTX_MAX_GROUPS) {
		free(groups);
		return err_set(err, E2BIG, ctx->user, "user %s is in %zu groups (a file operation takes at most %d)",
			       ctx->user, ngroups, FS_CTX_MAX_GROUPS);
	}
	own_load();
	ctx->uid = uid;
	ctx->gid = gid;
	ctx->ngroups = (unsigned)ngroups;
	if (ngroups > 0)
		memcpy(ctx->groups, groups, ngroups * sizeof(*groups));
	free(groups);
	/* the shim's own uid and gid: nothing to switch, its groups stay (as for a command
	 * of the shim's own user: no boundary there to keep) */
	ctx->as_user = !(uid == own_uid && gid == own_gid);
	/* a user named: its groups (none for a bare uid); a group alone: the shim's */
	ctx->set_groups = ctx->as_user && ctx->user[0] != '\0';
	ctx->pending = false;
	return 0;
}

int fs_ctx_defer(const Shim__V1__FsOptions *opt, struct fs_ctx *out, struct shim_err *err)
{
	unsigned resolve = opt_resolve(opt);
	bool has_user = opt != NULL && named(opt->user);
	bool has_group = opt != NULL && named(opt->group);
	if (!has_user && !has_group) {
		if (have_default)
			*out = default_ctx;
		else
			memset(out, 0, sizeof(*out));
		out->resolve = resolve;
		return 0;
	}
	memset(out, 0, sizeof(*out));
	out->resolve = resolve;
	if (has_user) {
		if (copy_name(out->user, opt->user, "user", err) < 0)
			return -1;
	} else if (have_default) {
		/* a group alone: for --fs-user's user */
		memcpy(out->user, default_ctx.user, sizeof(out->user));
	}
	if (has_group && copy_name(out->group, opt->group, "group", err) < 0)
		return -1;
	out->pending = true;
	return 0;
}

int fs_ctx_settle(struct fs_ctx *ctx, struct shim_err *err)
{
	if (!ctx->pending)
		return 0;
	return lookup(ctx, err);
}

int fs_ctx_begin(struct fs_ctx *ctx, struct shim_err *err)
{
	if (fs_ctx_settle(ctx, err) < 0)
		return -1;
	return fs_ctx_enter(ctx, err);
}

int fs_ctx_from_request(const Shim__V1__FsOptions *opt, struct fs_ctx *out, struct shim_err *err)
{
	if (fs_ctx_defer(opt, out, err) < 0)
		return -1;
	return fs_ctx_settle(out, err);
}

int fs_ctx_set_default(const char *spec, struct shim_err *err)
{
	struct fs_ctx c;
	memset(&c, 0, sizeof(c));
	const char *colon = strchr(spec, ':');
	size_t ulen = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
	if (ulen == 0 || (colon != NULL && colon[1] == '\0'))
		return err_set(err, EINVAL, NULL, "want USER or USER:GROUP");
	if (ulen >= FS_CTX_NAME || (colon != NULL && strlen(colon + 1) >= FS_CTX_NAME))
		return err_set(err, EINVAL, NULL, "a name longer than %d bytes", FS_CTX_NAME - 1);
	memcpy(c.user, spec, ulen);
	if (colon != NULL)
		memcpy(c.group, colon + 1, strlen(colon + 1) + 1);
	if (lookup(&c, err) < 0)
		return -1;
	/* a shim that may not switch to the user finds out now, not at every request
	 * (tried on this thread only, and undone) */
	if (fs_ctx_enter(&c, err) < 0)
		return -1;
	fs_ctx_leave();
	default_ctx = c;
	have_default = true;
	return 0;
}

/* The thread back to the shim's ids (each step only when it was changed). */
static void restore_ids(void)
{
	if (!cur_as_user)
		return;
	own_load();
	/* fsuid first: a root fsuid regains the file capabilities */
	syscall(SYS_setfsuid, own_uid);
	syscall(SYS_setfsgid, own_gid);
	if (cur_groups)
		syscall(SYS_setgroups, own_ngroups, own_groups);
	cur_as_user = false;
	cur_groups = false;
}

static const char *who(const struct fs_ctx *ctx, char *buf, size_t size)
{
	if (ctx->user[0] != '\0')
		return ctx->user;
	snprintf(buf, size, "uid %u", (unsigned)ctx->uid);
	return buf;
}

/* The calling thread's groups, fsgid and fsuid to ctx's: 0, or the errno with *stage the
 * step that did not take (setfsuid and setfsgid say nothing: their effect is checked). */
static int switch_ids(const struct fs_ctx *ctx, const char **stage)
{
	if (ctx->set_groups && syscall(SYS_setgroups, (size_t)ctx->ngroups, ctx->groups) < 0) {
		*stage = "setgroups";
		return errno;
	}
	syscall(SYS_setfsgid, ctx->gid);
	if ((gid_t)syscall(SYS_setfsgid, (gid_t)-1) != ctx->gid) {
		*stage = "setfsgid";
		return EPERM;
	}
	syscall(SYS_setfsuid, ctx->uid);
	if ((uid_t)syscall(SYS_setfsuid, (uid_t)-1) != ctx->uid) {
		*stage = "setfsuid";
		return EPERM;
	}
	return 0;
}

int fs_ctx_enter(const struct fs_ctx *ctx, struct shim_err *err)
{
	if (ctx->pending) {
		/* not settled: look it up for this time only */
		struct fs_ctx c = *ctx;
		if (lookup(&c, err) < 0)
			return -1;
		return fs_ctx_enter(&c, err);
	}
	restore_ids();
	cur_resolve = ctx->resolve;
	if (!ctx->as_user)
		return 0;
	own_load();
	cur_as_user = true; /* from here on restore_ids() undoes what took */
	cur_groups = ctx->set_groups;
	const char *stage;
	int e = switch_ids(ctx, &stage);
	if (e != 0) {
		restore_ids();
		cur_resolve = 0;
		char buf[32];
		return err_set(err, e == EINVAL ? EINVAL : EPERM, NULL, "cannot act as user %s: %s did not take: %s",
			       who(ctx, buf, sizeof(buf)), stage, strerror(e));
	}
	cur_uid = ctx->uid;
	cur_gid = ctx->gid;
	cur_ctx = *ctx;
	return 0;
}

void fs_ctx_leave(void)
{
	cur_resolve = 0;
	if (cur_as_user)
		restore_ids();
}

bool fs_ctx_pause(void)
{
	if (!cur_as_user)
		return false;
	restore_ids();
	return true;
}

void fs_ctx_resume(bool paused)
{
	if (!paused)
		return;
	struct shim_err e;
	unsigned resolve = cur_resolve;
	struct fs_ctx c = cur_ctx; /* (fs_ctx_enter sets cur_ctx) */
	/* it took a moment ago; should it not now, the thread stays the shim's and the
	 * operation's next syscalls have the shim's rights: stop there instead */
	if (fs_ctx_enter(&c, &e) < 0) {
		log_error("%s", e.msg);
		abort();
	}
	cur_resolve = resolve;
}
