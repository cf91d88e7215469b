/* op_exec.h: the process messages op_exec.c makes, which op_proc.c sends too. */
#ifndef SHIM_OP_EXEC_H
#define SHIM_OP_EXEC_H

#include <stddef.h>

#include "shim.pb-c.h"

struct proc;
struct stream;

/* The filled messages point into p and into b. */
void op_exec_fill_exit(const struct proc *p, Shim__V1__ExitStatus *ex);
struct exec_info_buf {
	Shim__V1__ProcessInfo info;
	Shim__V1__ExitStatus exit;
	Shim__V1__Timestamp started_at;
	ProtobufCBinaryData *argv; /* malloc'd */
};
/* argv_max: bytes of argv to include (the rest is cut). -1 (ENOMEM). */
int op_exec_fill_info(const struct proc *p, struct exec_info_buf *b, size_t argv_max);
void op_exec_info_buf_free(struct exec_info_buf *b);
/* EVENT started {id, pid} on st (exec, and attach). */
void op_exec_send_started(struct stream *st, const struct proc *p);

#endif
