/* describe.h: a frame as one line of text (trace, decode, debug logs). Secrets are hidden. */
#ifndef SHIM_DESCRIBE_H
#define SHIM_DESCRIBE_H

#include <stddef.h>
#include <stdint.h>

struct frame_hdr;

/* Write a NUL-terminated description of the frame (payload holds h->len bytes) into
 * buf; returns its length. Control payloads are decoded with their message type. */
size_t frame_describe(const struct frame_hdr *h, const uint8_t *payload, char *buf, size_t size);

#endif
