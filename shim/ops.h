/* ops.h: the operation families' entry points, as the dispatch table sees them. */
#ifndef SHIM_OPS_H
#define SHIM_OPS_H

#include "err.h"
#include "shim.pb-c.h"

struct stream;

/* Start the operation on st. Return 0 when the op has taken over the stream (it ends
 * it with stream_end/stream_fail, now or later), or -1 with err to fail it at once. */
typedef int (*op_start_fn)(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* op_sys.c */
int op_sys_info(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);
int op_sys_echo(struct stream *st, const Shim__V1__Request *req, struct shim_err *err);

/* End st with END carrying result (packed here). */
void op_end(struct stream *st, const Shim__V1__Result *result);

#endif
