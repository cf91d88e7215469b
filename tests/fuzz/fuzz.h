/* fuzz.h: what every fuzz target defines, and the helpers they share (fuzz_util.c). */
#ifndef SHIM_FUZZ_H
#define SHIM_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Each target defines these two (libFuzzer's names) and the two below them. Built
 * with libFuzzer, libFuzzer calls them; built without, fuzz_util.c's main() calls
 * LLVMFuzzerInitialize once, then LLVMFuzzerTestOneInput for every file of the
 * corpus directories given, then fuzz_teardown, and fails when an input leaked a
 * file descriptor or when there was nothing to replay. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* The target's name, for messages. */
extern const char fuzz_name[];
/* Free what LLVMFuzzerInitialize set up (the replay's last step, for leak checks). */
void fuzz_teardown(void);

/* Print "NAME: what" and abort: a broken harness or a violated invariant, which
 * libFuzzer reports as a crash (with the input that caused it). */
__attribute__((noreturn)) void fuzz_die(const char *what);
/* A fresh mktemp -d directory NAME.XXXXXX in $TMPDIR (or /tmp) into buf; dies on failure. */
void fuzz_mkdtemp(char *buf, size_t size);
/* Remove everything below dir (dir itself too when self), never following a symlink
 * nor leaving dir's file system, whatever the directories' modes. */
void fuzz_rm_tree(const char *dir, int self);

#endif
