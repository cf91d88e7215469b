/* test_log.c: the log's UTC timestamps (log_utc, its own calendar arithmetic) against
 * gmtime_r, and a line as log_msg writes it. */
#include "log.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static int differs(int64_t t)
{
	time_t tt = (time_t)t;
	struct tm want, got;
	if (gmtime_r(&tt, &want) == NULL)
		return 0;
	log_utc(t, &got);
	return got.tm_year != want.tm_year || got.tm_mon != want.tm_mon || got.tm_mday != want.tm_mday ||
	       got.tm_hour != want.tm_hour || got.tm_min != want.tm_min || got.tm_sec != want.tm_sec;
}

/* Every day boundary (and the second before it) from 1900 to 2500: leap years, the
 * centuries that are not (1900, 2100, 2200, 2300) and the one that is (2000, 2400),
 * negative times; then random seconds over the same span. */
START_TEST(test_utc_matches_gmtime)
{
	const int64_t from = -2208988800LL, to = 16725225600LL; /* 1900-01-01, 2500-01-01 */
	int bad = 0;
	for (int64_t t = from; t < to; t += 86400)
		bad += differs(t) + differs(t - 1) + differs(t + 86399);
	srand(42);
	for (int i = 0; i < 200000; i++) {
		int64_t r = ((int64_t)rand() << 31 | rand()) % (to - from);
		bad += differs(from + r);
	}
	ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(test_utc_known_dates)
{
	struct tm tm;
	log_utc(0, &tm);
	ck_assert_int_eq(tm.tm_year, 70);
	ck_assert_int_eq(tm.tm_mon, 0);
	ck_assert_int_eq(tm.tm_mday, 1);
	log_utc(951782400, &tm); /* 2000-02-29 00:00:00 */
	ck_assert_int_eq(tm.tm_year, 100);
	ck_assert_int_eq(tm.tm_mon, 1);
	ck_assert_int_eq(tm.tm_mday, 29);
	log_utc(4107542399LL, &tm); /* 2100-02-28 23:59:59: 2100 has no Feb 29 */
	ck_assert_int_eq(tm.tm_year, 200);
	ck_assert_int_eq(tm.tm_mon, 1);
	ck_assert_int_eq(tm.tm_mday, 28);
	ck_assert_int_eq(tm.tm_hour, 23);
	ck_assert_int_eq(tm.tm_min, 59);
	ck_assert_int_eq(tm.tm_sec, 59);
	log_utc(4107542400LL, &tm);
	ck_assert_int_eq(tm.tm_mon, 2);
	ck_assert_int_eq(tm.tm_mday, 1);
	log_utc(-1, &tm); /* 1969-12-31 23:59:59 */
	ck_assert_int_eq(tm.tm_year, 69);
	ck_assert_int_eq(tm.tm_mon, 11);
	ck_assert_int_eq(tm.tm_mday, 31);
	ck_assert_int_eq(tm.tm_sec, 59);
}
END_TEST

/* A line: "YYYY-MM-DDTHH:MM:SS.mmmZ sandbox-shim[PID] LEVEL: message\n", its time the
 * time it was written. */
START_TEST(test_line_format)
{
	char path[] = "/tmp/test_log.XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(log_open_file(path), 0);
	struct timeval before, after;
	gettimeofday(&before, NULL);
	log_warn("disk %s", "full");
	gettimeofday(&after, NULL);
	char buf[256] = {0};
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	unlink(path);
	close(fd);
	ck_assert_int_gt(n, 0);
	int y, mo, d, h, mi, s, ms, pid;
	char rest[128];
	ck_assert_int_eq(sscanf(buf, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ sandbox-shim[%d] %127[^\n]", &y, &mo, &d, &h, &mi,
				&s, &ms, &pid, rest),
			 9);
	ck_assert_str_eq(rest, "warn: disk full");
	ck_assert_int_eq(pid, (int)getpid());
	ck_assert_int_eq(buf[n - 1], '\n');
	struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = s};
	int64_t t = (int64_t)timegm(&tm);
	ck_assert_int_ge(t, (int64_t)before.tv_sec);
	ck_assert_int_le(t, (int64_t)after.tv_sec);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("utc");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_utc_matches_gmtime);
	tcase_add_test(tc, test_utc_known_dates);
	tcase_add_test(tc, test_line_format);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
