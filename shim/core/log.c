/* log.c: leveled logging to stderr (or a file), one line per message, with a UTC timestamp. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum log_level log_max_level = LOG_INFO;
static int log_fd = STDERR_FILENO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int log_open_file(const char *path)
{
	/* O_APPEND: one write per line stays whole beside other writers, and a log
	 * rotated by truncation goes on at its new end */
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
	if (fd < 0)
		return -1;
	log_fd = fd;
	return 0;
}

int log_fd_get(void)
{
	return log_fd;
}

int log_parse_level(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (strcmp(name, level_names[i]) == 0)
			return i;
	return -1;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	if (lvl > log_max_level)
		return;
	int saved = errno;
	char line[2048];
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	int n = snprintf(line, sizeof(line),
			 "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ sandbox-shim[%d] %s: ", tm.tm_year + 1900, tm.tm_mon + 1,
			 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000), (int)getpid(),
			 level_names[lvl]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	/* one write per line so lines from threads never interleave */
	ssize_t r = write(log_fd, line, len);
	(void)r;
	errno = saved;
}
