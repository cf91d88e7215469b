/* harness.h: what every integration test shares: checks, a private temp dir, daemons run by PID. */
#ifndef SBX_IT_HARNESS_H
#define SBX_IT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sbx.h"

/* Exit status that ctest reports as "skipped" (SKIP_RETURN_CODE). */
#define IT_SKIP 77

/* Fail the test: print file:line and the message, the daemons' log tails, clean up, exit 1.
 * Safe to call from any thread. */
void it_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));

#define CHECK(cond)                                                             \
	do {                                                                    \
		if (!(cond))                                                    \
			it_fail(__FILE__, __LINE__, "check failed: %s", #cond); \
	} while (0)

#define CHECKF(cond, ...)                                         \
	do {                                                      \
		if (!(cond))                                      \
			it_fail(__FILE__, __LINE__, __VA_ARGS__); \
	} while (0)

#define CHECK_EQ(a, b)                                                                                              \
	do {                                                                                                        \
		long long it_a_ = (long long)(a), it_b_ = (long long)(b);                                           \
		if (it_a_ != it_b_)                                                                                 \
			it_fail(__FILE__, __LINE__, "check failed: %s == %s (%lld != %lld)", #a, #b, it_a_, it_b_); \
	} while (0)

/* An SDK call that must succeed; on failure the error is printed. */
#define CHECK_SBX(call, errp)                                                                 \
	do {                                                                                  \
		if ((call) < 0)                                                               \
			it_fail(__FILE__, __LINE__, "%s failed: %s", #call, it_errstr(errp)); \
	} while (0)

/* An SDK error with this kind and errno code. */
#define CHECK_ERR(errp, want_kind, want_code)                                                                        \
	do {                                                                                                         \
		if ((errp)->kind != (want_kind) || (errp)->code != (want_code))                                      \
			it_fail(__FILE__, __LINE__, "want error kind %d code %s, got kind %d: %s", (int)(want_kind), \
				sbx_errno_name(want_code), (errp)->kind, it_errstr(errp));                           \
	} while (0)

#define CHECK_CONTAINS(hay, needle)                                                                                    \
	do {                                                                                                           \
		const char *it_h_ = (hay);                                                                             \
		if (it_h_ == NULL || strstr(it_h_, (needle)) == NULL)                                                  \
			it_fail(__FILE__, __LINE__, "'%s' does not contain '%s'", it_h_ ? it_h_ : "(null)", (needle)); \
	} while (0)

/* "EAGAIN: too many connections (limit 2)" (a static buffer per thread). */
const char *it_errstr(const struct sbx_error *err);

/* ---- the test program ---- */

struct it_case {
	const char *name;
	/* Returns 0 (passed) or IT_SKIP; failures go through it_fail(). */
	int (*run)(void);
};

/* Run the case named by argv[1] (or every case), each with a fresh temp dir and a
 * watchdog; returns the exit status. */
int it_main(int argc, char **argv, const struct it_case *cases, size_t ncases);

/* The current case's temp dir (from mkdtemp), and a path inside it (static buffer
 * per call slot: it_path() rotates through 8 of them). */
const char *it_dir(void);
const char *it_path(const char *name);

uint64_t it_now_ms(void);
void it_sleep_ms(unsigned ms);
/* Under ASan, let the daemons this case starts keep the core limit they are given
 * (ASan sets RLIMIT_CORE to 0 at start unless told disable_coredump=0). */
void it_keep_core_limit(void);

/* Entries of a pending-writes journal (STATE/pending-writes) that name a temp file:
 * those whose first line is not empty (a spare the daemon keeps for its next write has
 * an empty one). -1 if there is no such directory. it_journal_spares: the others. */
int it_journal_pending(const char *journal);
int it_journal_spares(const char *journal);

/* ---- daemons ---- */

struct it_daemon {
	pid_t pid;
	bool exited;
	int status; /* from waitpid, once exited */
	char name[32];
	char log[256]; /* its stderr */
};

/* Start SHIM_BIN with the NULL-terminated arguments; its stderr goes to a log file
 * in the temp dir. It is killed (by PID) if the test ends first. */
struct it_daemon *it_daemon_spawn(const char *name, ...) __attribute__((sentinel));
/* it_daemon_spawn() and wait until it logs "ready". */
struct it_daemon *it_daemon_start(const char *name, ...) __attribute__((sentinel));
/* Wait until the log contains what; fails the test if it exits or time runs out. */
void it_daemon_wait_log(struct it_daemon *d, const char *what, unsigned timeout_ms);
/* The whole log so far (caller frees). */
char *it_daemon_log(const struct it_daemon *d);
/* The port of its first "listening on tcp:127.0.0.1:PORT". */
unsigned it_daemon_tcp_port(struct it_daemon *d);
/* Wait up to timeout_ms for it to exit; true if it did (d->status is set). */
bool it_daemon_wait_exit(struct it_daemon *d, unsigned timeout_ms);
/* SIGTERM, then wait (SIGKILL after 5 s); returns the waitpid status. */
int it_daemon_stop(struct it_daemon *d);

/* ---- clients ---- */

/* Connect or fail the test. token may be NULL. */
struct sbx_client *it_connect(const char *target, const char *token);
/* "unix:" + path, in a static buffer per call slot (8 of them). */
const char *it_unix_target(const char *path);
const char *it_tcp_target(unsigned port);
/* Fill buf with pseudo-random bytes from seed. */
void it_fill(void *buf, size_t len, uint64_t seed);
/* Write a file (mode 0600) or fail. */
void it_write_file(const char *path, const char *content);
/* Entries of dir whose names do not start with '.'; 0 when dir does not exist. Fails
 * the test when it cannot be read otherwise. */
unsigned it_count_entries(const char *dir);
/* A whole file's bytes (malloc'd, *len of them), or NULL with errno when it cannot be
 * opened (ENOENT: it does not exist). A failed read fails the test. */
uint8_t *it_slurp(const char *path, size_t *len);
/* Read a small file (a /proc one) into buf, NUL-terminated; its length, or -1 with errno
 * when it cannot be opened or read. */
ssize_t it_read_text(const char *path, char *buf, size_t size);
/* SIGSTOP pid and wait until every one of its threads is stopped (fails the test
 * otherwise): a multi-threaded process may still answer for a moment after kill(). */
void it_stop_process(pid_t pid);
/* The file descriptors process pid holds (entries of /proc/PID/fd). */
unsigned it_count_fds(pid_t pid);

/* it_daemon_start() for a daemon run through another program, e.g. unshare ...
 * sh -c '... exec SHIM_BIN ...': argv[0] is looked up in PATH; the program must end
 * up as the daemon in the same process (exec), so that its PID is the daemon's. */
struct it_daemon *it_daemon_start_argv(const char *name, const char *const argv[]);
/* The same without waiting for "ready" (for daemons meant to fail at start). */
struct it_daemon *it_daemon_spawn_argv(const char *name, const char *const argv[]);

#endif
