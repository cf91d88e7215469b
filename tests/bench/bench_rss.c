/* bench_rss.c: the daemon's resident memory when idle after start (and that of a static build given
 * in $SHIM_STATIC_BIN), against an idle /bin/sleep. */
#include "bench_util.h"

#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Time given to a process to settle before its RSS is read. */
#define SETTLE_US 300000

extern char **environ;

static long shim_rss(const char *bin)
{
	char dir[256];
	bench_tmpdir(dir, sizeof(dir));
	pid_t pid = bench_start_shim(bin, dir);
	usleep(SETTLE_US);
	long kb = bench_vmrss_kb(pid);
	bench_stop(pid);
	bench_rmdir(dir);
	if (kb < 0) {
		fprintf(stderr, "bench_rss: cannot read the RSS of %s\n", bin);
		exit(1);
	}
	return kb;
}

static long sleep_rss(void)
{
	char *argv[] = {"/bin/sleep", "30", NULL};
	pid_t pid;
	int rc = posix_spawn(&pid, "/bin/sleep", NULL, NULL, argv, environ);
	if (rc != 0) {
		fprintf(stderr, "bench_rss: cannot start /bin/sleep: %s\n", strerror(rc));
		exit(1);
	}
	usleep(SETTLE_US);
	long kb = bench_vmrss_kb(pid);
	bench_stop(pid);
	return kb;
}

int main(void)
{
	long base = sleep_rss();
	long shim = shim_rss(SHIM_BIN);
	printf("idle rss: sandbox-shim %ld kB, /bin/sleep %ld kB, ratio %.2f\n", shim, base,
	       (double)shim / (double)base);
	const char *st = getenv("SHIM_STATIC_BIN");
	if (st != NULL && st[0] != '\0') {
		if (access(st, X_OK) != 0) {
			fprintf(stderr, "bench_rss: SHIM_STATIC_BIN=%s is not an executable\n", st);
			return 1;
		}
		long sst = shim_rss(st);
		printf("idle rss static: sandbox-shim %ld kB, /bin/sleep %ld kB, ratio %.2f (dynamic build: %ld kB)\n",
		       sst, base, (double)sst / (double)base, shim);
	} else {
		printf("idle rss static: skipped (set SHIM_STATIC_BIN to a static sandbox-shim)\n");
	}
	return 0;
}
