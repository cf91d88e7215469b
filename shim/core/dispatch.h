/* dispatch.h: the table of request kinds, the handshake, and turning errors into ERROR frames. */
#ifndef SHIM_DISPATCH_H
#define SHIM_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct conn;
struct stream;

/* HELLO payload on a connection still in CONN_HELLO: check version and token, answer
 * HELLO_OK and make the connection ready. -1 with err: refuse (caller sends ERROR and
 * closes). */
int disp_hello(struct conn *c, const uint8_t *payload, size_t len, struct shim_err *err);

/* REQUEST payload for the new stream st: decode, check, look the kind up, start the
 * op. -1 with err: a stream error, which the caller ends the stream with (EBADMSG for
 * a payload that does not decode, naming what is wrong; EINVAL for an enum value the
 * schema lacks; ENOSYS for an unknown kind). */
int disp_request(struct stream *st, const uint8_t *payload, size_t len, struct shim_err *err);

/* Encode err as an Error message into buf; returns its length (at most size). */
size_t disp_pack_error(const struct shim_err *err, uint8_t *buf, size_t size);

#endif
