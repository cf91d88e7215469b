/* rawclient.h: a hand-made protocol client for the tests that must misbehave or watch the wire. */
#ifndef SBX_IT_RAWCLIENT_H
#define SBX_IT_RAWCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"

/* A blocking unix-socket connection to path, or the test fails. */
int raw_connect_unix(const char *path);
/* Send one whole frame or fail the test. */
void raw_send(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len);
/* Send len bytes as they are (frames made by the caller, several at once) or fail. */
void raw_send_bytes(int fd, const void *buf, size_t len);
/* The same, false if the shim has closed the connection already (EPIPE, ECONNRESET):
 * what it sent before closing can still be read. */
bool raw_try_send(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len);
/* Receive one whole frame within timeout_ms: 1 with *h and *payload (malloc'd, caller
 * frees), or 0 on a clean EOF before any byte of a frame. Anything else fails the test. */
int raw_recv(int fd, struct frame_hdr *h, uint8_t **payload, unsigned timeout_ms);
/* HELLO with protocol 1 (and the token, if not NULL); wait for HELLO_OK. */
void raw_hello(int fd, const char *token);
/* Open stream id with an echo REQUEST. */
void raw_request_echo(int fd, uint32_t stream);
/* Decode an ERROR payload: its errno and message (copied into msg). */
int raw_error_code(const uint8_t *payload, size_t len, char *msg, size_t msg_size);

#endif
