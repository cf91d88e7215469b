/* bench_util.h: what the benchmarks share: clocks, percentiles, starting and stopping the daemon. */
#ifndef SHIM_BENCH_UTIL_H
#define SHIM_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

uint64_t bench_now_ns(void);

/* Sort v (n values) in place, then return its p-th percentile (0 < p <= 100). */
uint64_t bench_percentile(uint64_t *v, size_t n, double p);

/* A fresh private directory under $TMPDIR (or /tmp); exits on failure. The caller
 * removes it with bench_rmdir() once the daemon is gone (it knows s.sock and state/). */
void bench_tmpdir(char *buf, size_t size);
void bench_rmdir(const char *dir);

/* Start bin --listen unix:DIR/s.sock --state-dir DIR/state --log-level warn, with dir from
 * bench_tmpdir(), and wait until the socket takes connections (up to 10 s). Returns the
 * daemon's pid; exits on failure. */
pid_t bench_start_shim(const char *bin, const char *dir);
/* SIGTERM, then wait; returns its exit status as waitpid gives it. */
int bench_stop(pid_t pid);

/* VmRSS of pid in kB from /proc/PID/status; -1 if unreadable. */
long bench_vmrss_kb(pid_t pid);

/* Loop until all len bytes are written / read; -1 on error or early EOF. */
int bench_write_all(int fd, const void *buf, size_t len);
int bench_read_all(int fd, void *buf, size_t len);

#endif
