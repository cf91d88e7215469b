/* journal.h: the pending-writes journal: temp files of unfinished atomic writes, removed after a crash. */
#ifndef SHIM_JOURNAL_H
#define SHIM_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

/* Start-up, before listening: remove the temp files that writes of a daemon that
 * died (even by SIGKILL) left behind, as recorded in STATE/pending-writes, and arm
 * an at-exit sweep of this daemon's own unfinished writes. Entries still locked by
 * a live daemon sharing the state dir are left alone. Prints to stderr and returns
 * -1 only when the journal cannot be used at all. */
int journal_init(const char *state_dir);

struct journal_entry;

/* Record path (the absolute real path of a temp file about to be created) in a new
 * entry, locked for as long as the entry lives. Worker threads only. A temp
 * directory (a restore's) may be recorded too: a sweep removes it with its tree. */
struct journal_entry *journal_add(const char *path, struct shim_err *err);
/* Forget the entry (the temp file was renamed into place or removed): it leaves the
 * journal, kept open and locked as a spare naming nothing (its first line empty) for a
 * later journal_add (or unlinked). NULL is fine. Worker threads only. */
void journal_remove(struct journal_entry *e);

/* Close and remove the spare entries (journal_remove keeps a few, open). For a
 * process that checks its fds and the journal's directory between operations (the
 * fuzz harness); no write may be running. */
void journal_drop_spares(void);

/* Temp file names: ".NAME.sbx-XXXXXX" (NAME shortened to fit NAME_MAX). Fill buf
 * (size > NAME_MAX) with a fresh random name for NAME. */
void journal_temp_name(const char *name, char *buf, size_t size);
/* Does name have that shape? Only such files are ever removed by a sweep. */
bool journal_is_temp_name(const char *name);

/* Sweep the journal now (what journal_init does; for tests), and the spare entries
 * that nobody holds. Returns the number of temp files removed. */
unsigned journal_sweep(void);

#endif
