/* it_sys.c: a helper the policy and init tests run as a command: makes one syscall and prints its errno.
 *
 *   it_sys OP [ARG]   prints "OP 0" on success or "OP ENAME" on failure, exits 0
 *
 * OP: mount DIR (tmpfs, unmounted again at once), unshare (CLONE_NEWNS), clone_newuser,
 * clone3, fork, personality_aslr (ADDR_NO_RANDOMIZE), personality_query, mkdir PATH,
 * keyctl, zombies (prints the number of processes in state Z in /proc instead),
 * ppid (prints the parent's pid). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int result(const char *op, long rc)
{
	if (rc < 0)
		printf("%s %s\n", op, strerrorname_np(errno));
	else
		printf("%s 0\n", op);
	return 0;
}

/* A child made by a raw clone: exit at once; the parent waits for it. */
static long raw_clone(unsigned long flags)
{
	long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
	if (pid == 0)
		_exit(0);
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
	return pid;
}

static long raw_clone3(void)
{
	struct clone_args a;
	memset(&a, 0, sizeof(a));
	a.exit_signal = SIGCHLD;
	long pid = syscall(SYS_clone3, &a, sizeof(a));
	if (pid == 0)
		_exit(0);
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
	return pid;
}

static int zombies(void)
{
	DIR *d = opendir("/proc");
	if (d == NULL)
		return result("zombies", -1);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		char path[300], buf[512];
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		char *rp = strrchr(buf, ')');
		if (rp != NULL && rp[1] == ' ' && rp[2] == 'Z')
			n++;
	}
	closedir(d);
	printf("zombies %d\n", n);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return 2;
	const char *op = argv[1];
	const char *arg = argc > 2 ? argv[2] : NULL;
	if (strcmp(op, "mount") == 0 && arg != NULL) {
		long rc = mount("it_sys", arg, "tmpfs", 0, NULL);
		if (rc == 0)
			umount2(arg, MNT_DETACH);
		return result(op, rc);
	}
	if (strcmp(op, "unshare") == 0)
		return result(op, unshare(CLONE_NEWNS));
	if (strcmp(op, "clone_newuser") == 0)
		return result(op, raw_clone(CLONE_NEWUSER));
	if (strcmp(op, "clone3") == 0)
		return result(op, raw_clone3());
	if (strcmp(op, "fork") == 0)
		return result(op, raw_clone(0));
	if (strcmp(op, "personality_aslr") == 0)
		return result(op, personality(ADDR_NO_RANDOMIZE));
	if (strcmp(op, "personality_query") == 0)
		return result(op, personality(0xffffffff));
	if (strcmp(op, "mkdir") == 0 && arg != NULL)
		return result(op, mkdir(arg, 0700));
	if (strcmp(op, "keyctl") == 0)
		return result(op, syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
	if (strcmp(op, "zombies") == 0)
		return zombies();
	if (strcmp(op, "ppid") == 0) {
		printf("ppid %d\n", (int)getppid());
		return 0;
	}
	fprintf(stderr, "it_sys: unknown op %s\n", op);
	return 2;
}
