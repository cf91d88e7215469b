/* log.c: leveled logging to stderr (or a file), one line per message, with a UTC timestamp. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
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

void log_utc(int64_t t, struct tm *tm)
{
	/* days since 1970-01-01 to a civil date: the proleptic Gregorian calendar counted
	 * in 400-year eras from 0000-03-01, so that a leap day ends its year */
	int64_t days = t / 86400, secs = t % 86400;
	if (secs < 0) {
		secs += 86400;
		days--;
	}
	int64_t z = days + 719468;
	int64_t era = (z >= 0 ? z : z - 146096) / 146097;
	int64_t doe = z - era * 146097;                                      /* [0, 146096] */
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);               /* [0, 365], from March 1 */
	int64_t mp = (5 * doy + 2) / 153;                                    /* [0, 11], March = 0 */
	int64_t mon = mp < 10 ? mp + 3 : mp - 9;                             /* [1, 12] */
	memset(tm, 0, sizeof(*tm));
	tm->tm_year = (int)(yoe + era * 400 + (mon <= 2) - 1900);
	tm->tm_mon = (int)mon - 1;
	tm->tm_mday = (int)(doy - (153 * mp + 2) / 5 + 1);
	tm->tm_hour = (int)(secs / 3600);
	tm->tm_min = (int)(secs / 60 % 60);
	tm->tm_sec = (int)(secs % 60);
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
	/* not gmtime_r: its first call loads /etc/localtime (glibc), five syscalls on the
	 * daemon's way to its first HELLO_OK for a zone it does not use */
	log_utc(tv.tv_sec, &tm);
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
