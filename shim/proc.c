/* proc.c: the table of processes the shim started. */
#include "proc.h"

unsigned proc_running(void)
{
	return 0;
}

void proc_signal_all(int sig)
{
	(void)sig;
}
