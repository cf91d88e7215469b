/* pbcheck.h: what is wrong with a protobuf message, in words that name the field. */
#ifndef SHIM_PBCHECK_H
#define SHIM_PBCHECK_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

/* protobuf-c's unpack says only "NULL". Walk buf (len bytes) as an encoding of a
 * message of type d and describe the first fault the way unpack would meet it:
 * "missing required field StatRequest.path", "ReadRequest.offset (field 2): wire
 * type 2, want a varint", "field 11 at offset 2: its length 40 runs past the end of
 * the message (7 bytes left)". Nested messages are named by the fields that lead to
 * them ("(in exec.rlimits[1])"). Writes a NUL-terminated text into out. Returns 0 if
 * a fault was found, -1 if the bytes look well-formed (unpack failed otherwise, e.g.
 * out of memory). */
int pb_explain(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, char *out, size_t size);

/* A decoded message's enum fields (its own and its sub-messages', at any depth) must
 * hold values the schema defines: protobuf-c stores any number it reads. 0 if they
 * do; -1 with out ("RestoreRequest.mode: unknown value 7 (in restore)") if not. */
int pb_check_enums(const ProtobufCMessage *m, char *out, size_t size);

#endif
