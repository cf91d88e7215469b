/* test_mount.c: unit tests for the mount helpers: request checks, rclone's log tail, errno mapping, mountinfo, the dirty-upload count. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mount.h"

static char dir_[256];

static void make_dir(void)
{
	snprintf(dir_, sizeof(dir_), "/tmp/test_mount.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir_));
}

static void put(const char *rel, const char *content)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir_, rel);
	FILE *f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs(content, f);
	fclose(f);
}

START_TEST(test_bucket_names)
{
	struct shim_err e;
	static const char *const good[] = {
		"abc", "my-bucket", "my.bucket.2",
		"0ab", "a-b.c-d",   "bucket-63-chars-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ck_assert_msg(mount_check_bucket(good[i], &e) == 0, "%s refused: %s", good[i], e.msg);
	static const char *const bad[] = {
		"",        "ab",
		"Abc",     "a_b",
		"-ab",     "ab-",
		".ab",     "a..b",
		"a.-b",    "a-.b",
		"a b",     "a/b",
		"1.2.3.4", "toolong-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(mount_check_bucket(bad[i], &e) == -1, "%s accepted", bad[i]);
		ck_assert_int_eq(e.code, EINVAL);
		ck_assert_ptr_nonnull(strstr(e.msg, "bucket"));
	}
}
END_TEST

START_TEST(test_endpoints)
{
	struct shim_err e;
	ck_assert_int_eq(mount_check_endpoint("http://127.0.0.1:9000", &e), 0);
	ck_assert_int_eq(mount_check_endpoint("https://s3.eu-west-1.amazonaws.com", &e), 0);
	ck_assert_int_eq(mount_check_endpoint("https://[::1]:9000/path", &e), 0);
	static const char *const bad[] = {"",           "s3.amazonaws.com", "ftp://x",    "http://", "http:///x",
					  "http://:80", "http://a b",       "http://x\n", "HTTP://x"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(mount_check_endpoint(bad[i], &e) == -1, "%s accepted", bad[i]);
		ck_assert_int_eq(e.code, EINVAL);
	}
}
END_TEST

START_TEST(test_prefixes_words_options)
{
	struct shim_err e;
	ck_assert_int_eq(mount_check_prefix("a", &e), 0);
	ck_assert_int_eq(mount_check_prefix("a/b/c", &e), 0);
	ck_assert_int_eq(mount_check_prefix("a/b/", &e), 0);
	static const char *const bad[] = {"/a", "a//b", "../a", "a/..", "./a", "a/./b", "a\nb"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(mount_check_prefix(bad[i], &e) == -1 && e.code == EINVAL, "%s accepted", bad[i]);
	/* a secret's value never shows in the error */
	ck_assert_int_eq(mount_check_word("secret key", "top secret", 64, true, &e), -1);
	ck_assert_ptr_null(strstr(e.msg, "top"));
	ck_assert_str_eq(e.path, "");
	ck_assert_int_eq(mount_check_word("region", "eu west", 64, false, &e), -1);
	ck_assert_str_eq(e.path, "eu west");
	ck_assert_int_eq(mount_check_word("region", "eu-west-1", 64, false, &e), 0);
	ck_assert_int_eq(mount_check_word("region", "", 64, false, &e), -1);
	/* the option allow-list */
	ck_assert_int_eq(mount_check_option("vfs-cache-mode", "full", &e), 0);
	ck_assert_int_eq(mount_check_option("vfs-cache-mode", "most", &e), -1);
	ck_assert_int_eq(mount_check_option("dir-cache-time", "1m30s", &e), 0);
	ck_assert_int_eq(mount_check_option("dir-cache-time", NULL, &e), -1);
	ck_assert_int_eq(mount_check_option("dir-cache-time", "1s --rc", &e), -1);
	ck_assert_int_eq(mount_check_option("allow-other", NULL, &e), 0);
	ck_assert_int_eq(mount_check_option("allow-other", "true", &e), 0);
	ck_assert_int_eq(mount_check_option("allow-other", "yes", &e), -1);
	ck_assert_int_eq(mount_check_option("config", "/etc/passwd", &e), -1);
	ck_assert_int_eq(mount_check_option("rc", NULL, &e), -1);
	ck_assert_int_eq(e.code, EINVAL);
}
END_TEST

START_TEST(test_log_tail)
{
	make_dir();
	char tail[160];
	mount_log_tail(dir_, tail, sizeof(tail)); /* no log */
	ck_assert_str_eq(tail, "");
	/* a refused key, then rclone's goodbyes (which say nothing about why) */
	put("rclone.log",
	    "2026/11/29 13:11:24 INFO  : S3 bucket bkt: poll-interval is not supported\n"
	    "2026/11/29 13:11:25 ERROR : IO error: InvalidAccessKeyId: The AWS Access Key Id you provided "
	    "does not exist in our records.\n"
	    "\tstatus code: 403, request id: , host id: \n"
	    "2026/11/29 13:11:25 INFO  : Signal received: terminated\n"
	    "2026/11/29 13:11:25 ERROR : /mnt: Unmounted rclone mount\n"
	    "2026/11/29 13:11:25 INFO  : Exiting...\n");
	mount_log_tail(dir_, tail, sizeof(tail));
	ck_assert_str_eq(tail, "ERROR : InvalidAccessKeyId: The AWS Access Key Id you provided does not exist in our "
			       "records. status code: 403");
	ck_assert_int_eq(mount_classify(tail, EIO), EACCES);
	/* a dead server, as the preflight says it */
	put("rclone.log",
	    "2026/11/29 13:29:36 ERROR : : error listing: RequestError: send request failed\n"
	    "caused by: Get \"http://127.0.0.1:1/bkt?delimiter=%2F&max-keys=1000&prefix=\": dial tcp 127.0.0.1:1: "
	    "connect: connection refused\n"
	    "2026/11/29 13:29:36 Failed to lsf with 2 errors: last error was: error in ListJSON: RequestError: send "
	    "request failed\n"
	    "caused by: Get \"http://127.0.0.1:1/bkt?delimiter=%2F&max-keys=1000&prefix=\": dial tcp 127.0.0.1:1: "
	    "connect: connection refused\n");
	mount_log_tail(dir_, tail, sizeof(tail));
	ck_assert_str_eq(tail, "dial tcp 127.0.0.1:1: connect: connection refused");
	ck_assert_int_eq(mount_classify(tail, EIO), ECONNREFUSED);
	/* nothing that looks like an error: the last line; cut to size */
	put("rclone.log", "plain line one\nplain line two\n");
	char small[8];
	mount_log_tail(dir_, small, sizeof(small));
	ck_assert_str_eq(small, "plain l");
	ck_assert_int_eq(mount_classify("something else", ETIMEDOUT), ETIMEDOUT);
	ck_assert_int_eq(mount_classify("NoSuchBucket: The specified bucket does not exist", EIO), ENOENT);
	char p[512];
	snprintf(p, sizeof(p), "%s/rclone.log", dir_);
	unlink(p);
	rmdir(dir_);
}
END_TEST

START_TEST(test_mountinfo)
{
	char fstype[64];
	ck_assert_int_eq(mount_info_find("/", fstype, sizeof(fstype)), 0);
	ck_assert_str_ne(fstype, "");
	ck_assert_int_eq(mount_info_find("/proc", fstype, sizeof(fstype)), 0);
	ck_assert_str_eq(fstype, "proc");
	make_dir();
	ck_assert_int_eq(mount_info_find(dir_, fstype, sizeof(fstype)), 0);
	ck_assert_str_eq(fstype, "");
	ck_assert(!mount_is_fuse(dir_));
	rmdir(dir_);
}
END_TEST

START_TEST(test_dirty_count)
{
	make_dir();
	ck_assert_uint_eq(mount_dirty_count(dir_, 0), 0); /* no cache at all */
	char p[512];
	static const char *const dirs[] = {"cache", "cache/vfsMeta", "cache/vfsMeta/sbx", "cache/vfsMeta/sbx/bkt",
					   "cache/vfsMeta/sbx/bkt/sub"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir_, dirs[i]);
		ck_assert_int_eq(mkdir(p, 0700), 0);
	}
	put("cache/vfsMeta/sbx/bkt/a", "{\n\t\"Size\": 6,\n\t\"Dirty\": true\n}\n");
	put("cache/vfsMeta/sbx/bkt/b", "{\n\t\"Size\": 6,\n\t\"Dirty\": false\n}\n");
	put("cache/vfsMeta/sbx/bkt/sub/c", "{\"Dirty\":true}");
	ck_assert_uint_eq(mount_dirty_count(dir_, 0), 2);
	put("cache/vfsMeta/sbx/bkt/a", "{\n\t\"Dirty\": false\n}\n");
	ck_assert_uint_eq(mount_dirty_count(dir_, 0), 1);
	mount_remove_files(dir_, NULL, false);
	ck_assert_int_eq(access(dir_, F_OK), -1);
}
END_TEST

static Suite *mount_suite(void)
{
	Suite *s = suite_create("mount");
	TCase *tc = tcase_create("helpers");
	tcase_add_test(tc, test_bucket_names);
	tcase_add_test(tc, test_endpoints);
	tcase_add_test(tc, test_prefixes_words_options);
	tcase_add_test(tc, test_log_tail);
	tcase_add_test(tc, test_mountinfo);
	tcase_add_test(tc, test_dirty_count);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(mount_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? 0 : 1;
}
