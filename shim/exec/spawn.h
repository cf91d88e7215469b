/* spawn.h: starting a command: everything prepared on a worker, then fork and exec on the loop. */
#ifndef SHIM_SPAWN_H
#define SHIM_SPAWN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "err.h"
#include "shim.pb-c.h"

struct policy;

/* Limits on what a request may ask for (checked before anything is built). */
#define SPAWN_MAX_ENV 4096 /* "K=V" entries added by a request */

/* What a child that failed before or in execve() reports. */
struct spawn_failure {
	int32_t err;
	int32_t what; /* SPAWN_WHAT_*: which path the error is about */
	char stage[48];
};
enum { SPAWN_WHAT_NONE = 0, SPAWN_WHAT_CWD = 1, SPAWN_WHAT_PROGRAM = 2 };

/* What the child needs, all built before fork: the child allocates nothing. */
struct spawn_plan {
	char *path;  /* what execve() gets: argv[0], or what the PATH search found */
	char **argv; /* NULL-terminated, each string malloc'd */
	char **envp; /* NULL-terminated, each string malloc'd */
	size_t argc, envc;
	char *cwd;  /* for error messages: as the client gave it, or "/" */
	int cwd_fd; /* O_PATH directory (beneath --root); the child fchdir()s to it */
	struct policy *pol;
	bool pty;
	/* clone(CLONE_VM|CLONE_VFORK) is safe for this command (see spawn.c); after
	 * spawn_fork(): whether it was used */
	bool vfork;
	unsigned char veof; /* the terminal's end-of-file character (pty) */
	/* the child's 0, 1, 2 (for a pty all three are the slave) */
	int child_fd[3];
	/* ours, non-blocking: stdin writer (-1: none), stdout and stderr readers
	 * (pty: out is the master and err is -1) */
	int in_fd, out_fd, err_fd;
	/* exec error pipe: the child writes a struct spawn_failure on failure; on
	 * success execve() closes the write end and the reader gets EOF. Only for a
	 * fork() (-1 for a vfork: see vfail) */
	int errp_r, errp_w;
	/* A vfork child shares our memory, and clone() returns only once it has
	 * exec'd or exited: it writes its failure here (vfailed true) instead. */
	struct spawn_failure vfail;
	bool vfailed;
};

/* What the shim started with, before it changed anything of its own: commands get
 * these back (an ExecRequest's rlimits still apply after). Filled by spawn_startup();
 * "have" false where getrlimit failed (the child then keeps the shim's value).
 * RLIMIT_CORE is here for the shim's own no-core-dump setting: lower it only after
 * spawn_startup() ran. */
struct spawn_start_limits {
	struct rlimit nofile, core;
	bool have_nofile, have_core;
};
extern struct spawn_start_limits spawn_start_limits;

/* Start-up, once, before the shim raises RLIMIT_NOFILE (main.c) and after it has read
 * its own variables: save spawn_start_limits, and take the shim's own variables out
 * of its environment (SBX_* and SANDBOX_SHIM_*: the token file's name, the listen
 * addresses, a client's SBX_TOKEN), so that no command and no workload inherits them. */
void spawn_startup(void);

void spawn_plan_init(struct spawn_plan *pl);
/* On a worker thread: check the request (argv or shell, env entries), build argv
 * and the environment (see build_env in spawn.c and PROTOCOL.md: the shim's for a
 * command of the shim's own user; for another user that user's login variables and
 * the image's environment without secret-looking names; only the request's with
 * clear_env; then the request's entries, PATH defaulted), resolve the user,
 * group and restrictions (policy_prepare), open the cwd beneath --root, search
 * argv[0] in the command's PATH, and make the pipes or the pseudo-terminal.
 * -1 with err (ENOENT naming the cwd or program, EINVAL, ...). */
int spawn_prepare(const Shim__V1__ExecRequest *req, struct spawn_plan *pl, struct shim_err *err);
/* On the worker that prepared pl, or any thread: fork (or clone with
 * CLONE_VM|CLONE_VFORK when pl->vfork); the child sets itself up and execs. A pid
 * forked off the loop thread is watched with reaper_watch_since(). Returns the pid;
 * the child's ends of the pipes are closed here (ours stay in pl). -1 with err. After a vfork (pl->vfork
 * still true) the exec's result is known on return: pl->vfailed and pl->vfail;
 * after a fork it comes through pl->errp_r. */
pid_t spawn_fork(struct spawn_plan *pl, struct shim_err *err);
/* Turn a failure record into err: "ENOENT: /no/such (execve)". */
void spawn_failure_err(const struct spawn_failure *f, const char *path, const char *cwd, struct shim_err *err);
/* Close every fd still in pl and free what it holds. */
void spawn_plan_free(struct spawn_plan *pl);

#endif
