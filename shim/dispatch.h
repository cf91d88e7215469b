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

/* REQUEST payload for the new stream st: decode, look the kind up, start the op.
 * -1 with err and conn_fatal set: a connection error (undecodable); -1 without:
 * a stream error (the stream is ended by the caller). */
int disp_request(struct stream *st, const uint8_t *payload, size_t len, struct shim_err *err, int *conn_fatal);

/* Encode err as an Error message into buf; returns its length (at most size). */
size_t disp_pack_error(const struct shim_err *err, uint8_t *buf, size_t size);

#endif
