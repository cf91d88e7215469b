/* proc.h: the table of processes the shim started: ids, state, exit statuses, ring buffers. */
#ifndef SHIM_PROC_H
#define SHIM_PROC_H

#include <stdbool.h>

/* Processes running now (for info and shutdown). */
unsigned proc_running(void);
/* Send sig to every running process group the shim started. */
void proc_signal_all(int sig);

#endif
