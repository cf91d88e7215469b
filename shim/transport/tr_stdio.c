/* tr_stdio.c: --stdio: one client on stdin/stdout; the daemon lives as long as it does. */
#include "conn.h"
#include "listen.h"
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int tr_stdio_start(struct server *s, struct shim_err *err)
{
	/* Move the channel off fds 0 and 1 and put /dev/null there: nothing we start
	 * (commands, rclone) may inherit the protocol channel or write into it. */
	int in = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
	int out = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
	if (in < 0 || out < 0)
		return err_set(err, errno, NULL, "dup stdin/stdout");
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0)
		return err_set(err, errno, "/dev/null", "open");
	dup2(null, STDIN_FILENO);
	dup2(null, STDOUT_FILENO);
	close(null);
	s->stdio_mode = true;
	if (conn_new(s, in, out, NULL, false, "stdio") == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	return 0;
}
