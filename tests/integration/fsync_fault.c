/* fsync_fault.c: an LD_PRELOAD interposer that makes fsync/fdatasync fail for chosen paths.
 *
 * Loaded into the daemon by the durability tests (it_fs_io fsync_*). Environment:
 *   FSYNC_FAULT_MATCH  a glob (fnmatch, no flags: '*' also matches '/'); an fsync or
 *                      fdatasync of an fd whose path (readlink /proc/self/fd/N) matches
 *                      it fails. Unset: nothing fails.
 *   FSYNC_FAULT_ERRNO  the errno it fails with (a number; default 5, EIO)
 *   FSYNC_FAULT_LOG    a file to append to: "loaded PID" when the library is loaded (so a
 *                      test can tell a static daemon, which LD_PRELOAD cannot reach), and
 *                      "fsync PATH" / "fdatasync PATH" for each call it failed.
 * Every other call goes to the kernel as it would have (the syscall itself, so no
 * lookup of the next definition is needed). */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void note(const char *line)
{
	const char *log = getenv("FSYNC_FAULT_LOG");
	if (log == NULL || log[0] == '\0')
		return;
	int lfd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (lfd < 0)
		return;
	/* one write per line: lines from several threads do not interleave */
	ssize_t w = write(lfd, line, strlen(line));
	(void)w;
	close(lfd);
}

__attribute__((constructor)) static void loaded(void)
{
	char line[64];
	snprintf(line, sizeof(line), "loaded %d\n", (int)getpid());
	note(line);
}

/* Should a sync of fd fail? Then errno is set and the call noted. */
static int faulty(int fd, const char *call)
{
	const char *pat = getenv("FSYNC_FAULT_MATCH");
	if (pat == NULL || pat[0] == '\0')
		return 0;
	char proc[64], path[PATH_MAX];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(proc, path, sizeof(path) - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	if (fnmatch(pat, path, 0) != 0)
		return 0;
	char line[PATH_MAX + 32];
	snprintf(line, sizeof(line), "%s %s\n", call, path);
	note(line);
	const char *en = getenv("FSYNC_FAULT_ERRNO");
	errno = en != NULL && atoi(en) > 0 ? atoi(en) : EIO;
	return 1;
}

int fsync(int fd)
{
	int saved = errno;
	if (faulty(fd, "fsync"))
		return -1;
	errno = saved;
	return (int)syscall(SYS_fsync, fd);
}

int fdatasync(int fd)
{
	int saved = errno;
	if (faulty(fd, "fdatasync"))
		return -1;
	errno = saved;
	return (int)syscall(SYS_fdatasync, fd);
}
