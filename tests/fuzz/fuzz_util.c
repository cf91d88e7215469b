/* fuzz_util.c: the fuzz targets' shared helpers, and (without libFuzzer) the main() that replays a corpus. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void fuzz_die(const char *what)
{
	fprintf(stderr, "%s: %s\n", fuzz_name, what);
	abort();
}

void fuzz_mkdtemp(char *buf, size_t size)
{
	const char *t = getenv("TMPDIR");
	int n = snprintf(buf, size, "%s/%s.XXXXXX", t != NULL && t[0] == '/' ? t : "/tmp", fuzz_name);
	if (n < 0 || (size_t)n >= size || mkdtemp(buf) == NULL)
		fuzz_die("mkdtemp failed");
}

/* Everything in the directory dfd (closed here); st_dev: its file system. */
static void rm_below_fd(int dfd, dev_t st_dev)
{
	DIR *d = fdopendir(dfd);
	if (d == NULL) {
		close(dfd);
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		const char *name = de->d_name;
		if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && st.st_dev == st_dev) {
			/* a mode without rwx for us would stop the walk (when not root); if the
			 * chmod fails, the open or the rmdir below says so by failing too */
			int rc = fchmodat(dirfd(d), name, 0700, 0);
			(void)rc;
			int fd = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (fd >= 0)
				rm_below_fd(fd, st_dev);
			unlinkat(dirfd(d), name, AT_REMOVEDIR);
		} else if (!S_ISDIR(st.st_mode)) {
			unlinkat(dirfd(d), name, 0);
		}
		/* a directory on another file system (a mount point) stays */
	}
	closedir(d);
}

void fuzz_rm_tree(const char *dir, int self)
{
	struct stat st;
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return;
	chmod(dir, 0700);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0)
		rm_below_fd(fd, st.st_dev);
	if (self)
		rmdir(dir);
}

#ifndef SHIM_LIBFUZZER
/* ---- replay: every regular file in the directories (and the files) given ---- */

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return -1;
	int n = 0;
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rbe");
	if (f == NULL) {
		fprintf(stderr, "%s: %s: %s\n", fuzz_name, path, strerror(errno));
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	for (;;) {
		if (buf == NULL)
			fuzz_die("out of memory");
		len += fread(buf + len, 1, cap - len, f);
		if (len < cap)
			break;
		cap *= 2;
		uint8_t *nb = realloc(buf, cap);
		if (nb == NULL)
			free(buf);
		buf = nb;
	}
	bool bad = ferror(f) != 0;
	fclose(f);
	if (bad) {
		fprintf(stderr, "%s: %s: read error\n", fuzz_name, path);
		free(buf);
		return -1;
	}
	if (getenv("FUZZ_VERBOSE") != NULL)
		fprintf(stderr, "%s: %s (%zu bytes)\n", fuzz_name, path, len);
	LLVMFuzzerTestOneInput(buf, len);
	free(buf);
	return 0;
}

static int replay_dir(const char *dir, unsigned *count)
{
	struct dirent **names;
	int n = scandir(dir, &names, NULL, alphasort);
	if (n < 0) {
		fprintf(stderr, "%s: %s: %s\n", fuzz_name, dir, strerror(errno));
		return -1;
	}
	int rc = 0;
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(path) < 0)
				rc = -1;
			else
				(*count)++;
		}
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR [FILE]...\n", fuzz_name);
		return 2;
	}
	LLVMFuzzerInitialize(&argc, &argv);
	int fds = count_fds();
	unsigned count = 0;
	int rc = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "%s: %s: %s\n", fuzz_name, argv[i], strerror(errno));
			rc = 1;
		} else if (S_ISDIR(st.st_mode)) {
			if (replay_dir(argv[i], &count) < 0)
				rc = 1;
		} else if (replay_file(argv[i]) < 0) {
			rc = 1;
		} else {
			count++;
		}
	}
	if (count_fds() != fds) {
		fprintf(stderr, "%s: file descriptors leaked: %d open before, %d after\n", fuzz_name, fds, count_fds());
		rc = 1;
	}
	printf("%s: replayed %u inputs\n", fuzz_name, count);
	if (count == 0) {
		fprintf(stderr, "%s: no inputs found\n", fuzz_name);
		rc = 1;
	}
	fuzz_teardown();
	return rc;
}
#endif
