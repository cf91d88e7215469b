/* log.h: leveled logging to stderr (or a file). */
#ifndef SHIM_LOG_H
#define SHIM_LOG_H

#include <stdint.h>
#include <time.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern enum log_level log_max_level;

/* "error", "warn", "info", "debug" -> level; -1 if unknown. */
int log_parse_level(const char *name);
/* From now on the lines go to path (appended; created 0600) instead of stderr.
 * Start-up only; -1 with errno. */
int log_open_file(const char *path);
/* The fd the lines go to: stderr, or the --log-file. */
int log_fd_get(void);
/* t (seconds since the epoch) as a UTC date and time: tm_year, tm_mon, tm_mday,
 * tm_hour, tm_min and tm_sec as gmtime_r sets them, the other fields 0. */
void log_utc(int64_t t, struct tm *tm);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)                                   \
	do {                                            \
		if (log_max_level >= LOG_INFO)          \
			log_msg(LOG_INFO, __VA_ARGS__); \
	} while (0)
#define log_debug(...)                                   \
	do {                                             \
		if (log_max_level >= LOG_DEBUG)          \
			log_msg(LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif
