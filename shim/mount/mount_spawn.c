/* mount_spawn.c: forking a mount's helper programs (rclone mount, rclone lsf, fusermount3) from the loop thread. */
#include "mount.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <unistd.h>

pid_t mount_spawn(const char *path, char *const argv[], char *const envp[], int out_fd, int keep_fd, const char *cwd,
		  struct shim_err *err)
{
	int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null_fd < 0)
		return err_set(err, errno, "/dev/null", "open");
	if (out_fd < 0)
		out_fd = null_fd;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t pid = fork();
	if (pid == 0) {
		/* the child: async-signal-safe calls only */
		setsid(); /* its own session: the shim's job-control signals do not reach it */
		/* if the shim dies without unmounting, rclone unmounts and exits */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		for (int sig = 1; sig < NSIG; sig++)
			sigaction(sig, &sa, NULL);
		if (dup2(null_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)
			_exit(127);
		if (cwd != NULL && chdir(cwd) < 0)
			_exit(127);
		if (keep_fd >= 0) {
			/* without CLOEXEC, here only: rclone's fusermount3 inherits it too */
			if (keep_fd != MOUNT_POINT_FD && dup2(keep_fd, MOUNT_POINT_FD) < 0)
				_exit(127);
			if (keep_fd == MOUNT_POINT_FD && fcntl(keep_fd, F_SETFD, 0) < 0)
				_exit(127);
			syscall(SYS_close_range, 3, MOUNT_POINT_FD - 1, 0);
			syscall(SYS_close_range, MOUNT_POINT_FD + 1, ~0U, 0);
		} else {
			syscall(SYS_close_range, 3, ~0U, 0);
		}
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execve(path, argv, envp);
		static const char msg[] = "sandbox-shim: cannot execute the program\n";
		if (write(2, msg, sizeof(msg) - 1) < 0)
			_exit(127);
		_exit(127);
	}
	int e = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(null_fd);
	if (pid < 0)
		return err_set(err, e, path, "fork");
	return pid;
}
