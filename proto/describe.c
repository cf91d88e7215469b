/* describe.c: one readable line per frame, for --trace, `sbx decode` and debug logs. */
#include "describe.h"
#include "frame.h"
#include "shim.pb-c.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct out {
	char *buf;
	size_t size, len;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
	if (o->len + 1 >= o->size)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
	if (o->len >= o->size)
		o->len = o->size - 1;
}

/* Bytes as a C-like quoted string, at most max of them. */
static void put_bytes(struct out *o, const uint8_t *p, size_t len, size_t max)
{
	put(o, "\"");
	for (size_t i = 0; i < len && i < max; i++) {
		uint8_t ch = p[i];
		if (ch == '"' || ch == '\\')
			put(o, "\\%c", ch);
		else if (ch == '\n')
			put(o, "\\n");
		else if (ch >= 0x20 && ch < 0x7f)
			put(o, "%c", ch);
		else
			put(o, "\\x%02x", ch);
	}
	put(o, "\"%s", len > max ? "..." : "");
}

/* Secrets are shown by their length only (and the entropy of resumed, which must not
 * be known to anyone once it is credited to the guest's random pool). */
static int is_secret(const char *name)
{
	return strstr(name, "token") != NULL || strstr(name, "secret") != NULL || strstr(name, "password") != NULL ||
	       strstr(name, "access_key") != NULL || strcmp(name, "entropy") == 0;
}

static void put_message(struct out *o, const ProtobufCMessage *m, int depth);

static void put_value(struct out *o, const ProtobufCFieldDescriptor *f, const void *v, int depth)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		put(o, "%d", *(const int32_t *)v);
		break;
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		put(o, "%u", *(const uint32_t *)v);
		break;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		put(o, "%lld", (long long)*(const int64_t *)v);
		break;
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		put(o, "%llu", (unsigned long long)*(const uint64_t *)v);
		break;
	case PROTOBUF_C_TYPE_FLOAT:
		put(o, "%g", (double)*(const float *)v);
		break;
	case PROTOBUF_C_TYPE_DOUBLE:
		put(o, "%g", *(const double *)v);
		break;
	case PROTOBUF_C_TYPE_BOOL:
		put(o, "%s", *(const protobuf_c_boolean *)v ? "true" : "false");
		break;
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
			(const ProtobufCEnumDescriptor *)f->descriptor, *(const int *)v);
		if (ev != NULL)
			put(o, "%s", ev->name);
		else
			put(o, "%d", *(const int *)v);
		break;
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)v;
		if (s == NULL)
			put(o, "null");
		else if (is_secret(f->name))
			put(o, "<%zu bytes hidden>", strlen(s));
		else
			put_bytes(o, (const uint8_t *)s, strlen(s), 200);
		break;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *b = v;
		if (is_secret(f->name))
			put(o, "<%zu bytes hidden>", b->len);
		else
			put_bytes(o, b->data, b->len, 200);
		break;
	}
	case PROTOBUF_C_TYPE_MESSAGE:
		put_message(o, *(const ProtobufCMessage *const *)v, depth + 1);
		break;
	}
}

static size_t value_size(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_ENUM:
		return 4;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_BOOL:
		return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	}
	return 0;
}

/* Generic printer driven by protobuf-c's descriptors, so new messages need no code here. */
static void put_message(struct out *o, const ProtobufCMessage *m, int depth)
{
	if (m == NULL) {
		put(o, "null");
		return;
	}
	if (depth > 8) {
		put(o, "{...}");
		return;
	}
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;
	int first = 1;
	put(o, "{");
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *member = base + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			if (n == 0)
				continue;
			put(o, "%s%s=[", first ? "" : " ", f->name);
			const char *arr = *(char *const *)member;
			for (size_t k = 0; k < n && k < 32; k++) {
				if (k > 0)
					put(o, " ");
				put_value(o, f, arr + k * value_size(f), depth);
			}
			put(o, "%s]", n > 32 ? " ..." : "");
			first = 0;
			continue;
		}
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
				continue;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
			if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) {
				if (*(const void *const *)member == NULL)
					continue;
			} else if (!*(const protobuf_c_boolean *)(base + f->quantifier_offset)) {
				continue;
			}
		}
		put(o, "%s%s=", first ? "" : " ", f->name);
		put_value(o, f, member, depth);
		first = 0;
	}
	put(o, "}");
}

static const ProtobufCMessageDescriptor *payload_descriptor(unsigned type)
{
	switch (type) {
	case FRAME_HELLO:
		return &shim__v1__hello__descriptor;
	case FRAME_HELLO_OK:
		return &shim__v1__hello_reply__descriptor;
	case FRAME_REQUEST:
		return &shim__v1__request__descriptor;
	case FRAME_EVENT:
		return &shim__v1__event__descriptor;
	case FRAME_END:
		return &shim__v1__result__descriptor;
	case FRAME_ERROR:
		return &shim__v1__error__descriptor;
	default:
		return NULL;
	}
}

size_t frame_describe(const struct frame_hdr *h, const uint8_t *payload, char *buf, size_t size)
{
	struct out o = {buf, size, 0};
	if (size == 0)
		return 0;
	buf[0] = '\0';
	put(&o, "%s stream=%u len=%u", frame_type_name(h->type), h->stream, h->len);
	if (h->flags & FRAME_FLAG_FIN)
		put(&o, " FIN");
	if (h->type == FRAME_DATA && (h->flags & FRAME_FLAG_STDERR))
		put(&o, " STDERR");
	unsigned known = FRAME_FLAG_FIN | (h->type == FRAME_DATA ? FRAME_FLAG_STDERR : 0);
	if (h->flags & ~known)
		put(&o, " flags=0x%02x", h->flags);
	const ProtobufCMessageDescriptor *d = payload_descriptor(h->type);
	if (d != NULL) {
		ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, h->len, payload);
		if (m == NULL) {
			put(&o, " <undecodable %s>", d->short_name);
		} else {
			put(&o, " %s", d->short_name);
			put_message(&o, m, 0);
			protobuf_c_message_free_unpacked(m, NULL);
		}
	} else if (h->type == FRAME_WINDOW && h->len == 4) {
		put(&o, " +%u", frame_get_u32(payload));
	} else if (h->len > 0 && payload == NULL) {
		put(&o, " <%u bytes, not in memory>", h->len); /* spliced from socket to pipe */
	} else if (h->len > 0 && (h->type == FRAME_DATA || h->type == FRAME_PING || h->type == FRAME_PONG)) {
		put(&o, " ");
		put_bytes(&o, payload, h->len, 32);
	} else if (h->len > 0) {
		put(&o, " <%u bytes>", h->len);
	}
	return o.len;
}
