/* pbcheck.c: a second look at a message protobuf-c refused, and at the enum values it took, naming the field. */
#include "pbcheck.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Deeper than any message of shim.proto nests (Request -> ExecRequest -> Rlimit). */
#define MAX_DEPTH 32
/* Fields per message this walker tracks for "required" (shim.proto's largest has 40). */
#define MAX_FIELDS 256

struct walk {
	char *out;
	size_t size;
	char where[200]; /* the fields that lead here from the top: "exec.rlimits[1]" */
};

static int fault(struct walk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fault(struct walk *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(w->out, w->size, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < w->size && w->where[0] != '\0')
		snprintf(w->out + n, w->size - (size_t)n, " (in %s)", w->where);
	return 1;
}

/* A varint at p (n bytes available): 0 with *v and *used, -1 cut short, -2 longer
 * than 10 bytes. */
static int get_varint(const uint8_t *p, size_t n, uint64_t *v, size_t *used)
{
	uint64_t r = 0;
	for (size_t i = 0; i < 10; i++) {
		if (i == n)
			return -1;
		r |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if ((p[i] & 0x80) == 0) {
			*v = r;
			*used = i + 1;
			return 0;
		}
	}
	return -2;
}

enum { WT_VARINT = 0, WT_64 = 1, WT_LEN = 2, WT_32 = 5 };

static const char *wire_name(unsigned wt)
{
	switch (wt) {
	case WT_VARINT:
		return "a varint";
	case WT_64:
		return "8 bytes (fixed64)";
	case WT_LEN:
		return "length-delimited";
	case 3:
		return "a group start";
	case 4:
		return "a group end";
	case WT_32:
		return "4 bytes (fixed32)";
	default:
		return "an undefined wire type";
	}
}

static unsigned wire_of(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_BOOL:
	case PROTOBUF_C_TYPE_ENUM:
		return WT_VARINT;
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return WT_64;
	case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
		return WT_32;
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_BYTES:
	case PROTOBUF_C_TYPE_MESSAGE:
		return WT_LEN;
	}
	return WT_LEN;
}

/* The where chain grows by ".name" or ".name[i]" for a sub-message and is cut back
 * afterwards; a chain too long for the buffer is left as it is (the text only loses
 * detail). */
static size_t where_push(struct walk *w, const ProtobufCFieldDescriptor *f, unsigned index)
{
	size_t old = strlen(w->where);
	size_t room = sizeof(w->where) - old;
	int n = f->label == PROTOBUF_C_LABEL_REPEATED ?
			snprintf(w->where + old, room, "%s%s[%u]", old ? "." : "", f->name, index) :
			snprintf(w->where + old, room, "%s%s", old ? "." : "", f->name);
	if (n < 0 || (size_t)n >= room)
		w->where[old] = '\0';
	return old;
}

static int walk_msg(struct walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t base,
		    int depth);

/* One field's value (tag already read): check it against the schema. *pos moves past it. */
static int walk_value(struct walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t *pos,
		      size_t base, size_t at, uint64_t num, unsigned wt, const ProtobufCFieldDescriptor *f,
		      unsigned index, int depth)
{
	uint64_t v;
	size_t k;
	const uint8_t *payload = NULL;
	size_t plen = 0;
	char fname[160];
	if (f != NULL)
		snprintf(fname, sizeof(fname), "%s.%s (field %u)", d->short_name, f->name, f->id);
	else
		snprintf(fname, sizeof(fname), "%s: field %llu", d->short_name, (unsigned long long)num);
	switch (wt) {
	case WT_VARINT: {
		int r = get_varint(buf + *pos, len - *pos, &v, &k);
		if (r == -1)
			return fault(w, "%s at offset %zu: the varint is cut short by the end of the message", fname,
				     at);
		if (r == -2)
			return fault(w, "%s at offset %zu: a varint longer than 10 bytes", fname, at);
		*pos += k;
		break;
	}
	case WT_64:
	case WT_32: {
		size_t need = wt == WT_64 ? 8 : 4;
		if (len - *pos < need)
			return fault(w, "%s at offset %zu: %zu bytes needed, %zu left", fname, at, need, len - *pos);
		*pos += need;
		break;
	}
	case WT_LEN: {
		int r = get_varint(buf + *pos, len - *pos, &v, &k);
		if (r < 0)
			return fault(w, "%s at offset %zu: its length is cut short or longer than 10 bytes", fname, at);
		*pos += k;
		if (v > len - *pos)
			return fault(
				w,
				"%s at offset %zu: its length %llu runs past the end of the message (%zu bytes left)",
				fname, at, (unsigned long long)v, len - *pos);
		payload = buf + *pos;
		plen = (size_t)v;
		*pos += plen;
		break;
	}
	default:
		/* protobuf-c skips no groups: 3 and 4 fail as 6 and 7 do */
		return fault(w, "%s at offset %zu: wire type %u (%s) is not supported", fname, at, wt, wire_name(wt));
	}
	if (f == NULL)
		return 0; /* unknown: skipped, as protobuf-c does */
	unsigned want = wire_of(f->type);
	bool packed = wt == WT_LEN && want != WT_LEN && f->label == PROTOBUF_C_LABEL_REPEATED;
	if (wt != want && !packed)
		return fault(w, "%s at offset %zu: %s, want %s", fname, at, wire_name(wt), wire_name(want));
	if (packed) {
		if (want == WT_VARINT) {
			for (size_t p = 0; p < plen; p += k)
				if (get_varint(payload + p, plen - p, &v, &k) < 0)
					return fault(w, "%s at offset %zu: a packed varint is cut short", fname, at);
		} else if (plen % (want == WT_64 ? 8 : 4) != 0) {
			return fault(w, "%s at offset %zu: %zu packed bytes are not a whole number of values", fname,
				     at, plen);
		}
	}
	if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
		size_t old = where_push(w, f, index);
		int r = walk_msg(w, f->descriptor, payload, plen, base + (size_t)(payload - buf), depth + 1);
		w->where[old] = '\0';
		return r;
	}
	return 0;
}

static int walk_msg(struct walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t base,
		    int depth)
{
	if (depth > MAX_DEPTH)
		return fault(w, "%s: messages nested more than %d deep", d->short_name, MAX_DEPTH);
	bool seen[MAX_FIELDS] = {false};
	unsigned count[MAX_FIELDS] = {0};
	size_t pos = 0;
	while (pos < len) {
		size_t at = base + pos;
		uint64_t tag;
		size_t k;
		int r = get_varint(buf + pos, len - pos, &tag, &k);
		if (r == -1)
			return fault(w, "%s: a field's tag at offset %zu is cut short by the end of the message",
				     d->short_name, at);
		if (r == -2)
			return fault(w, "%s: a field's tag at offset %zu is longer than 10 bytes", d->short_name, at);
		pos += k;
		uint64_t num = tag >> 3;
		if (num == 0 || num > 536870911)
			return fault(w, "%s: field number %llu at offset %zu (valid: 1 to 536870911)", d->short_name,
				     (unsigned long long)num, at);
		const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, (unsigned)num);
		size_t i = f != NULL ? (size_t)(f - d->fields) : 0;
		unsigned index = f != NULL && i < MAX_FIELDS ? count[i]++ : 0;
		if (walk_value(w, d, buf, len, &pos, base, at, num, (unsigned)(tag & 7), f, index, depth))
			return 1;
		if (f != NULL && i < MAX_FIELDS)
			seen[i] = true;
	}
	for (unsigned i = 0; i < d->n_fields && i < MAX_FIELDS; i++)
		if (d->fields[i].label == PROTOBUF_C_LABEL_REQUIRED && !seen[i])
			return fault(w, "missing required field %s.%s", d->short_name, d->fields[i].name);
	return 0;
}

int pb_explain(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, char *out, size_t size)
{
	struct walk w = {.out = out, .size = size};
	if (size > 0)
		out[0] = '\0';
	return walk_msg(&w, d, buf, len, 0, 0) ? 0 : -1;
}

/* ---- enum values ---- */

static int check_enum(struct walk *w, const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f, int value)
{
	if (protobuf_c_enum_descriptor_get_value(f->descriptor, value) != NULL)
		return 0;
	return fault(w, "%s.%s: unknown value %d", d->short_name, f->name, value);
}

static int enums_msg(struct walk *w, const ProtobufCMessage *m, int depth)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	if (depth > MAX_DEPTH)
		return 0; /* unpack made it, so it is finite; nothing of ours nests this deep */
	const char *base = (const char *)m;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		if (f->type != PROTOBUF_C_TYPE_ENUM && f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		const void *member = base + f->offset;
		size_t n = 1;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			n = *(const size_t *)(const void *)(base + f->quantifier_offset);
		} else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			if (*(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
				continue;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type == PROTOBUF_C_TYPE_ENUM) {
			if (!*(const protobuf_c_boolean *)(const void *)(base + f->quantifier_offset))
				continue;
		}
		for (size_t j = 0; j < n; j++) {
			if (f->type == PROTOBUF_C_TYPE_ENUM) {
				const int *vals = f->label == PROTOBUF_C_LABEL_REPEATED ? *(int *const *)member :
											  (const int *)member;
				if (check_enum(w, d, f, vals[j]))
					return 1;
				continue;
			}
			const ProtobufCMessage *sub = f->label == PROTOBUF_C_LABEL_REPEATED ?
							      (*(ProtobufCMessage *const *const *)member)[j] :
							      *(ProtobufCMessage *const *)member;
			if (sub == NULL)
				continue;
			size_t old = where_push(w, f, (unsigned)j);
			int r = enums_msg(w, sub, depth + 1);
			w->where[old] = '\0';
			if (r)
				return 1;
		}
	}
	return 0;
}

int pb_check_enums(const ProtobufCMessage *m, char *out, size_t size)
{
	struct walk w = {.out = out, .size = size};
	if (size > 0)
		out[0] = '\0';
	return enums_msg(&w, m, 0) ? -1 : 0;
}
