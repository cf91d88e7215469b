/* test_frame.c: unit tests for the protocol library: header coding, frame_check, type names, errno table, describe,
 * and pbcheck's words for what protobuf-c refuses. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "describe.h"
#include "errnames.h"
#include "frame.h"
#include "pbcheck.h"
#include "shim.pb-c.h"

/* ---- header encode/decode ---- */

START_TEST(test_hdr_wire_layout)
{
	/* every field in network byte order at its fixed offset */
	struct frame_hdr h = {.len = 0x01020304, .stream = 0x05060708, .type = 9, .flags = 0x01, .reserved = 0x0a0b};
	uint8_t out[FRAME_HDR_LEN];
	memset(out, 0xee, sizeof(out));
	frame_put_hdr(out, &h);
	static const uint8_t want[FRAME_HDR_LEN] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 10, 11};
	ck_assert_mem_eq(out, want, FRAME_HDR_LEN);

	struct frame_hdr g;
	memset(&g, 0x55, sizeof(g));
	frame_get_hdr(want, &g);
	ck_assert_uint_eq(g.len, 0x01020304u);
	ck_assert_uint_eq(g.stream, 0x05060708u);
	ck_assert_uint_eq(g.type, 9);
	ck_assert_uint_eq(g.flags, 1);
	ck_assert_uint_eq(g.reserved, 0x0a0b);
}
END_TEST

START_TEST(test_hdr_round_trip)
{
	static const uint32_t lens[] = {0,
					1,
					11,
					12,
					255,
					256,
					65535,
					65536,
					FRAME_MIN_MAX,
					FRAME_HELLO_MAX,
					FRAME_DEFAULT_MAX,
					FRAME_ABS_MAX,
					0x7fffffffu,
					0x80000000u,
					0xfffffffeu,
					UINT32_MAX};
	static const uint32_t streams[] = {0, 1, 2, 3, 255, 256, 0x00010001u, 0x7fffffffu, 0x80000001u, UINT32_MAX};
	static const uint8_t flags[] = {0, FRAME_FLAG_FIN, 0x02, 0x80, 0xff};
	static const uint16_t reserved[] = {0, 1, 0x0100, 0x8000, 0xffff};
	unsigned n = 0;
	for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++)
		for (size_t b = 0; b < sizeof(streams) / sizeof(streams[0]); b++)
			for (unsigned type = 0; type <= 255; type += (type < 16 ? 1 : 60))
				for (size_t d = 0; d < sizeof(flags); d++)
					for (size_t e = 0; e < sizeof(reserved) / sizeof(reserved[0]); e++) {
						struct frame_hdr h = {.len = lens[a],
								      .stream = streams[b],
								      .type = (uint8_t)type,
								      .flags = flags[d],
								      .reserved = reserved[e]};
						uint8_t out[FRAME_HDR_LEN];
						frame_put_hdr(out, &h);
						struct frame_hdr g;
						frame_get_hdr(out, &g);
						/* plain comparisons: a passing ck_assert costs a message to the runner */
						if (frame_get_u32(out) != h.len || frame_get_u32(out + 4) != h.stream ||
						    out[8] != h.type || out[9] != h.flags || g.len != h.len ||
						    g.stream != h.stream || g.type != h.type || g.flags != h.flags ||
						    g.reserved != h.reserved)
							ck_abort_msg(
								"round trip of len %u stream %u type %u flags %u reserved %u",
								h.len, h.stream, h.type, h.flags, h.reserved);
						n++;
					}
	ck_assert_uint_gt(n, 10000);
}
END_TEST

START_TEST(test_u32_helpers)
{
	uint8_t p[4];
	frame_put_u32(p, UINT32_MAX);
	ck_assert_mem_eq(p, "\xff\xff\xff\xff", 4);
	ck_assert_uint_eq(frame_get_u32(p), UINT32_MAX);
	frame_put_u32(p, 0x80000000u);
	ck_assert_mem_eq(p, "\x80\x00\x00\x00", 4);
	ck_assert_uint_eq(frame_get_u32(p), 0x80000000u);
	frame_put_u32(p, 65536);
	ck_assert_mem_eq(p, "\x00\x01\x00\x00", 4);
	ck_assert_uint_eq(frame_get_u32(p), 65536);
}
END_TEST

/* ---- frame_check ---- */

/* A whole frame (header + payload) in buf; returns its length. */
static size_t make_frame(uint8_t *buf, uint32_t len, uint32_t stream, uint8_t type, uint8_t flags, uint8_t fill)
{
	struct frame_hdr h = {.len = len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(buf, &h);
	memset(buf + FRAME_HDR_LEN, fill, len);
	return FRAME_HDR_LEN + len;
}

START_TEST(test_check_every_prefix)
{
	static const uint32_t lens[] = {0, 1, 5, 64, 1000};
	static uint8_t buf[FRAME_HDR_LEN + 1000 + 7];
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		size_t total = make_frame(buf, lens[k], 3, FRAME_DATA, FRAME_FLAG_FIN, 'x');
		for (size_t cut = 0; cut < total; cut++) {
			struct frame_hdr h = {0};
			enum frame_status st = frame_check(buf, cut, FRAME_DEFAULT_MAX, &h);
			if (st != FRAME_NEED_MORE)
				ck_abort_msg("len %u cut %zu: status %d", lens[k], cut, st);
			/* the header is filled as soon as it is complete */
			if (cut >= FRAME_HDR_LEN &&
			    (h.len != lens[k] || h.stream != 3 || h.type != FRAME_DATA || h.flags != FRAME_FLAG_FIN))
				ck_abort_msg("len %u cut %zu: header not filled", lens[k], cut);
		}
		struct frame_hdr h = {0};
		ck_assert_int_eq(frame_check(buf, total, FRAME_DEFAULT_MAX, &h), FRAME_OK);
		ck_assert_uint_eq(h.len, lens[k]);
		/* bytes of the next frame after it change nothing */
		ck_assert_int_eq(frame_check(buf, total + 7, FRAME_DEFAULT_MAX, &h), FRAME_OK);
		ck_assert_uint_eq(h.len, lens[k]);
	}
}
END_TEST

START_TEST(test_check_exact_limit)
{
	/* a payload of exactly max_payload is fine; the status only waits for the bytes */
	uint8_t buf[FRAME_HDR_LEN];
	struct frame_hdr h;
	struct frame_hdr hh = {.len = FRAME_MIN_MAX, .stream = 1, .type = FRAME_DATA};
	frame_put_hdr(buf, &hh);
	ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_MIN_MAX, &h), FRAME_NEED_MORE);
	ck_assert_uint_eq(h.len, FRAME_MIN_MAX);
	ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_MIN_MAX - 1, &h), FRAME_TOO_BIG);
}
END_TEST

START_TEST(test_check_too_big_from_header_alone)
{
	static const uint32_t limits[] = {0, 4, FRAME_MIN_MAX, FRAME_HELLO_MAX, FRAME_DEFAULT_MAX, FRAME_ABS_MAX};
	uint8_t buf[FRAME_HDR_LEN + 16];
	for (size_t k = 0; k < sizeof(limits) / sizeof(limits[0]); k++) {
		uint32_t over[] = {limits[k] + 1, limits[k] + 1000, UINT32_MAX};
		for (size_t j = 0; j < 3; j++) {
			struct frame_hdr h = {0};
			struct frame_hdr hh = {.len = over[j], .stream = 1, .type = FRAME_DATA};
			frame_put_hdr(buf, &hh);
			memset(buf + FRAME_HDR_LEN, 'p', 16);
			/* 11 bytes: nothing can be judged yet */
			ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN - 1, limits[k], &h), FRAME_NEED_MORE);
			/* 12 bytes announce too much: refused before any payload is there */
			ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, limits[k], &h), FRAME_TOO_BIG);
			ck_assert_uint_eq(h.len, over[j]);
			ck_assert_int_eq(frame_check(buf, sizeof(buf), limits[k], &h), FRAME_TOO_BIG);
		}
	}
}
END_TEST

START_TEST(test_check_bad_type_zero)
{
	uint8_t buf[FRAME_HDR_LEN + 4];
	struct frame_hdr h;
	make_frame(buf, 4, 1, 0, 0, 'z');
	ck_assert_int_eq(frame_check(buf, sizeof(buf), FRAME_DEFAULT_MAX, &h), FRAME_BAD);
	/* judged from the header alone, without waiting for the payload */
	ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_DEFAULT_MAX, &h), FRAME_BAD);
	ck_assert_uint_eq(h.type, 0);
	make_frame(buf, 0, 0, 0, 0, 0);
	ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_DEFAULT_MAX, &h), FRAME_BAD);
}
END_TEST

START_TEST(test_check_bad_reserved)
{
	uint8_t buf[FRAME_HDR_LEN + 2];
	for (unsigned bit = 0; bit < 16; bit++) {
		struct frame_hdr hh = {.len = 2, .stream = 1, .type = FRAME_DATA, .reserved = (uint16_t)(1u << bit)};
		frame_put_hdr(buf, &hh);
		buf[12] = buf[13] = 'r';
		struct frame_hdr h;
		ck_assert_int_eq(frame_check(buf, sizeof(buf), FRAME_DEFAULT_MAX, &h), FRAME_BAD);
		ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_DEFAULT_MAX, &h), FRAME_BAD);
		ck_assert_uint_eq(h.reserved, 1u << bit);
	}
}
END_TEST

START_TEST(test_check_types_and_flags_pass)
{
	/* frame_check judges only length, type 0 and reserved bits: every other type and
	 * flag is the connection's business */
	uint8_t buf[FRAME_HDR_LEN];
	for (unsigned type = 1; type <= 255; type++) {
		struct frame_hdr hh = {.len = 0, .stream = 7, .type = (uint8_t)type, .flags = 0xff};
		frame_put_hdr(buf, &hh);
		struct frame_hdr h;
		ck_assert_int_eq(frame_check(buf, FRAME_HDR_LEN, FRAME_DEFAULT_MAX, &h), FRAME_OK);
		ck_assert_uint_eq(h.type, type);
		ck_assert_uint_eq(h.flags, 0xff);
	}
}
END_TEST

START_TEST(test_type_names)
{
	static const char *const want[] = {NULL,  "HELLO", "HELLO_OK", "REQUEST", "DATA", "EVENT",
					   "END", "ERROR", "CANCEL",   "WINDOW",  "PING", "PONG"};
	for (unsigned t = 1; t <= FRAME_TYPE_MAX; t++)
		ck_assert_str_eq(frame_type_name(t), want[t]);
	ck_assert_uint_eq(FRAME_TYPE_MAX, 11);
	ck_assert_str_eq(frame_type_name(0), "?");
	ck_assert_str_eq(frame_type_name(12), "?");
	ck_assert_str_eq(frame_type_name(255), "?");
	ck_assert_str_eq(frame_type_name(256 + FRAME_DATA), "?");
	ck_assert_str_eq(frame_type_name(UINT32_MAX), "?");
}
END_TEST

/* ---- errno table ---- */

START_TEST(test_errnames_known)
{
	ck_assert_str_eq(errname_name(2), "ENOENT");
	ck_assert_str_eq(errname_text(2), "No such file or directory");
	ck_assert_int_eq(errname_num("ENOENT"), 2);
	ck_assert_str_eq(errname_name(125), "ECANCELED");
	ck_assert_int_eq(errname_num("ECANCELED"), 125);
	ck_assert_str_eq(errname_name(71), "EPROTO");
	ck_assert_int_eq(errname_num("EPROTO"), 71);
	ck_assert_str_eq(errname_text(71), "Protocol error");
	ck_assert_str_eq(errname_name(90), "EMSGSIZE");
	ck_assert_str_eq(errname_name(74), "EBADMSG");
	ck_assert_str_eq(errname_name(93), "EPROTONOSUPPORT");
	ck_assert_str_eq(errname_name(13), "EACCES");
	ck_assert_str_eq(errname_name(38), "ENOSYS");
	ck_assert_str_eq(errname_name(1), "EPERM");
	ck_assert_str_eq(errname_name(132), "ERFKILL");
}
END_TEST

START_TEST(test_errnames_aliases)
{
	/* one canonical name per value; the aliases map to the same numbers */
	ck_assert_str_eq(errname_name(11), "EAGAIN");
	ck_assert_int_eq(errname_num("EAGAIN"), 11);
	ck_assert_int_eq(errname_num("EWOULDBLOCK"), 11);
	ck_assert_str_eq(errname_text(11), "Resource temporarily unavailable");
	ck_assert_int_eq(errname_num("EDEADLK"), 35);
	ck_assert_int_eq(errname_num("EDEADLOCK"), 35);
	ck_assert_int_eq(errname_num("EOPNOTSUPP"), 95);
	ck_assert_int_eq(errname_num("ENOTSUP"), 95);
}
END_TEST

START_TEST(test_errnames_unknown)
{
	static const int nums[] = {0, -1, 41, 58, 133, 4095, 100000, -2147483647 - 1};
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		ck_assert_ptr_null(errname_name(nums[i]));
		ck_assert_ptr_null(errname_text(nums[i]));
	}
	ck_assert_int_eq(errname_num(NULL), -1);
	ck_assert_int_eq(errname_num(""), -1);
	ck_assert_int_eq(errname_num("ENOPE"), -1);
	ck_assert_int_eq(errname_num("enoent"), -1);
	ck_assert_int_eq(errname_num("ENOENT "), -1);
}
END_TEST

START_TEST(test_errnames_consistent)
{
	/* name -> number -> name is the identity for every value in the table */
	unsigned known = 0;
	for (int n = 1; n < 200; n++) {
		const char *name = errname_name(n);
		if (name == NULL)
			continue;
		known++;
		ck_assert_ptr_nonnull(errname_text(n));
		ck_assert_int_eq(errname_num(name), n);
	}
	ck_assert_uint_eq(known, 130); /* 1..132 less 41 and 58, which Linux leaves unused */
}
END_TEST

/* ---- frame_describe ---- */

static size_t describe(unsigned type, uint32_t stream, uint8_t flags, const void *payload, uint32_t len, char *buf,
		       size_t size)
{
	struct frame_hdr h = {.len = len, .stream = stream, .type = (uint8_t)type, .flags = flags};
	size_t n = frame_describe(&h, payload, buf, size);
	ck_assert_uint_eq(n, strlen(buf));
	return n;
}

START_TEST(test_describe_hello_hides_token)
{
	static const char token[] = "Sup3r-S3cret-T0ken-4242";
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = 1;
	m.client_name = "unit/1.0";
	m.has_token = 1;
	m.token.data = (uint8_t *)token;
	m.token.len = strlen(token);
	m.has_max_frame = 1;
	m.max_frame = 65536;
	uint8_t payload[256];
	size_t n = shim__v1__hello__pack(&m, payload);
	char out[1024];
	describe(FRAME_HELLO, 0, 0, payload, (uint32_t)n, out, sizeof(out));
	char want[512];
	snprintf(want, sizeof(want),
		 "HELLO stream=0 len=%zu Hello{protocol_version=1 client_name=\"unit/1.0\" token=<23 bytes hidden> "
		 "max_frame=65536}",
		 n);
	ck_assert_str_eq(out, want);
	ck_assert_ptr_null(strstr(out, token));
	ck_assert_ptr_null(strstr(out, "S3cret"));
	ck_assert_ptr_null(strstr(out, "4242"));
}
END_TEST

START_TEST(test_describe_data_escapes)
{
	static const uint8_t payload[] = {'a', '"', 'b', '\\', 'c', '\n', 0x01, 0xff, 0x7f, ' ', '~'};
	char out[256];
	describe(FRAME_DATA, 3, FRAME_FLAG_FIN, payload, sizeof(payload), out, sizeof(out));
	ck_assert_str_eq(out, "DATA stream=3 len=11 FIN \"a\\\"b\\\\c\\n\\x01\\xff\\x7f ~\"");

	describe(FRAME_DATA, 5, 0, NULL, 0, out, sizeof(out));
	ck_assert_str_eq(out, "DATA stream=5 len=0");
	describe(FRAME_DATA, 5, FRAME_FLAG_FIN | 0x80, NULL, 0, out, sizeof(out));
	ck_assert_str_eq(out, "DATA stream=5 len=0 FIN flags=0x81");
}
END_TEST

START_TEST(test_describe_data_preview_cut)
{
	uint8_t payload[40];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)('A' + i % 26);
	char out[256];
	describe(FRAME_DATA, 1, 0, payload, sizeof(payload), out, sizeof(out));
	/* 32 bytes shown, then "..." */
	ck_assert_str_eq(out, "DATA stream=1 len=40 \"ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF\"...");
	describe(FRAME_PING, 0, 0, "ping!", 5, out, sizeof(out));
	ck_assert_str_eq(out, "PING stream=0 len=5 \"ping!\"");
}
END_TEST

START_TEST(test_describe_window_and_misc)
{
	uint8_t p[4];
	char out[256];
	frame_put_u32(p, 65536);
	describe(FRAME_WINDOW, 7, 0, p, 4, out, sizeof(out));
	ck_assert_str_eq(out, "WINDOW stream=7 len=4 +65536");
	frame_put_u32(p, UINT32_MAX);
	describe(FRAME_WINDOW, 1, 0, p, 4, out, sizeof(out));
	ck_assert_str_eq(out, "WINDOW stream=1 len=4 +4294967295");
	/* a malformed WINDOW is shown by size only */
	describe(FRAME_WINDOW, 1, 0, p, 3, out, sizeof(out));
	ck_assert_str_eq(out, "WINDOW stream=1 len=3 <3 bytes>");
	describe(FRAME_CANCEL, 9, 0, NULL, 0, out, sizeof(out));
	ck_assert_str_eq(out, "CANCEL stream=9 len=0");
	describe(42, 9, 0, "xy", 2, out, sizeof(out));
	ck_assert_str_eq(out, "? stream=9 len=2 <2 bytes>");
}
END_TEST

START_TEST(test_describe_error_and_undecodable)
{
	Shim__V1__Error m = SHIM__V1__ERROR__INIT;
	m.errno_num = 2;
	m.errno_name = "ENOENT";
	m.message = "open";
	m.has_path = 1;
	m.path.data = (uint8_t *)"/no\x01where";
	m.path.len = 9;
	uint8_t payload[128];
	size_t n = shim__v1__error__pack(&m, payload);
	char out[512], want[256];
	describe(FRAME_ERROR, 3, 0, payload, (uint32_t)n, out, sizeof(out));
	snprintf(
		want, sizeof(want),
		"ERROR stream=3 len=%zu Error{errno_num=2 errno_name=\"ENOENT\" message=\"open\" path=\"/no\\x01where\"}",
		n);
	ck_assert_str_eq(out, want);

	static const uint8_t junk[] = {0xff, 0xff, 0xff};
	describe(FRAME_HELLO, 0, 0, junk, sizeof(junk), out, sizeof(out));
	ck_assert_str_eq(out, "HELLO stream=0 len=3 <undecodable Hello>");
	describe(FRAME_REQUEST, 1, 0, junk, sizeof(junk), out, sizeof(out));
	ck_assert_str_eq(out, "REQUEST stream=1 len=3 <undecodable Request>");
}
END_TEST

START_TEST(test_describe_small_buffer)
{
	uint8_t payload[100];
	memset(payload, 'q', sizeof(payload));
	char out[16];
	memset(out, '#', sizeof(out));
	size_t n = describe(FRAME_DATA, 1, 0, payload, sizeof(payload), out, sizeof(out));
	ck_assert_uint_eq(n, 15);
	ck_assert_str_eq(out, "DATA stream=1 l");
	char one[1] = {'#'};
	struct frame_hdr h = {.len = 0, .stream = 1, .type = FRAME_DATA};
	ck_assert_uint_eq(frame_describe(&h, NULL, one, 1), 0);
	ck_assert_int_eq(one[0], '\0');
	ck_assert_uint_eq(frame_describe(&h, NULL, one, 0), 0);
	ck_assert_int_eq(one[0], '\0');
}
END_TEST

/* ---- pbcheck ---- */

/* Every payload protobuf-c refuses gets a reason, and that reason is the one named;
 * every payload it takes gets none. */
static void explain(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t n, const char *want)
{
	ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, n, b);
	char out[300];
	int r = pb_explain(d, b, n, out, sizeof(out));
	if (want == NULL) {
		ck_assert_msg(m != NULL, "protobuf-c refused a payload expected to decode");
		ck_assert_msg(r < 0, "a fault found in a good payload: %s", out);
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	ck_assert_msg(m == NULL, "protobuf-c took a payload expected to fail (%s)", want);
	ck_assert_int_eq(r, 0);
	ck_assert_str_eq(out, want);
}

#define B(...) (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})

START_TEST(test_pbcheck_explain)
{
	const ProtobufCMessageDescriptor *rq = &shim__v1__request__descriptor;
	explain(rq, NULL, 0, NULL);
	explain(rq, B(0x52, 0x03, 0x0a, 0x01, '/'), NULL);
	/* truncate (23) without its size: optional now, absent means 0 */
	explain(rq, B(0xba, 0x01, 0x03, 0x0a, 0x01, '/'), NULL);
	explain(rq, B(0x52, 0x00), "missing required field StatRequest.path (in stat)");
	explain(rq, B(0x00, 0x01), "Request: field number 0 at offset 0 (valid: 1 to 536870911)");
	explain(rq, B(0x80), "Request: a field's tag at offset 0 is cut short by the end of the message");
	explain(rq, B(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"Request: a field's tag at offset 0 is longer than 10 bytes");
	/* read (11) { path "/", offset: a varint cut short } */
	explain(rq, B(0x5a, 0x04, 0x0a, 0x01, '/', 0x10),
		"ReadRequest.offset (field 2) at offset 5: the varint is cut short by the end of the message (in read)");
	explain(rq, B(0x5a, 0x05, 0x0a, 0x01, '/', 0x10, 0x80),
		"ReadRequest.offset (field 2) at offset 5: the varint is cut short by the end of the message (in read)");
	/* an 11-byte varint */
	explain(rq,
		B(0x5a, 0x0f, 0x0a, 0x01, '/', 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"ReadRequest.offset (field 2) at offset 5: a varint longer than 10 bytes (in read)");
	/* the offset as fixed64, then as fixed32 cut short */
	explain(rq, B(0x5a, 0x0c, 0x0a, 0x01, '/', 0x11, 1, 2, 3, 4, 5, 6, 7, 8),
		"ReadRequest.offset (field 2) at offset 5: 8 bytes (fixed64), want a varint (in read)");
	explain(rq, B(0x5a, 0x05, 0x0a, 0x01, '/', 0x15, 1),
		"ReadRequest.offset (field 2) at offset 5: 4 bytes needed, 1 left (in read)");
	/* the path as a varint */
	explain(rq, B(0x5a, 0x02, 0x08, 0x01),
		"ReadRequest.path (field 1) at offset 2: a varint, want length-delimited (in read)");
	/* an unknown field is skipped, whatever its wire type but groups */
	explain(rq, B(0x5a, 0x03, 0x0a, 0x01, '/', 0xf8, 0x07, 0x05, 0xfd, 0x07, 1, 2, 3, 4), NULL);
	explain(rq, B(0xfb, 0x07), "Request: field 127 at offset 0: wire type 3 (a group start) is not supported");
	explain(rq, B(0xff, 0x07),
		"Request: field 127 at offset 0: wire type 7 (an undefined wire type) is not supported");
	/* InfoReply.load1 (double, field 16) cut short: 8 bytes needed */
	explain(&shim__v1__info_reply__descriptor, B(0x81, 0x01, 1, 2, 3),
		"InfoReply.load1 (field 16) at offset 0: 8 bytes needed, 3 left");
	/* a length past the end, inside a nested message */
	explain(rq, B(0xc2, 0x02, 0x03, 0xaa, 0x01, 0x09),
		"ExecRequest.rlimits (field 21) at offset 3: its length 9 runs past the end of the message (0 bytes left) "
		"(in exec)");
	/* the second rlimit lacks its name */
	explain(rq, B(0xc2, 0x02, 0x0c, 0xaa, 0x01, 0x04, 0x0a, 0x02, 'a', 's', 0xaa, 0x01, 0x02, 0x10, 0x01),
		"missing required field Rlimit.name (in exec.rlimits[1])");
	/* Hello without its version */
	explain(&shim__v1__hello__descriptor, B(0x12, 0x01, 'x'), "missing required field Hello.protocol_version");
}
END_TEST

START_TEST(test_pbcheck_enums)
{
	char out[200];
	/* restore (61) {dir "/", mode 1}, then mode 7 */
	static const uint8_t ok[] = {0xea, 0x03, 0x05, 0x0a, 0x01, '/', 0x10, 0x01};
	static const uint8_t bad[] = {0xea, 0x03, 0x05, 0x0a, 0x01, '/', 0x10, 0x07};
	Shim__V1__Request *r = shim__v1__request__unpack(NULL, sizeof(ok), ok);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(pb_check_enums(&r->base, out, sizeof(out)), 0);
	shim__v1__request__free_unpacked(r, NULL);
	r = shim__v1__request__unpack(NULL, sizeof(bad), bad);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(pb_check_enums(&r->base, out, sizeof(out)), -1);
	ck_assert_str_eq(out, "RestoreRequest.mode: unknown value 7 (in restore)");
	shim__v1__request__free_unpacked(r, NULL);
	/* a negative value (a 10-byte varint): backup (60) {dir "/", compression -1} */
	static const uint8_t neg[] = {0xe2, 0x03, 0x0e, 0x0a, 0x01, '/',  0x18, 0xff, 0xff,
				      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	r = shim__v1__request__unpack(NULL, sizeof(neg), neg);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(pb_check_enums(&r->base, out, sizeof(out)), -1);
	ck_assert_str_eq(out, "BackupRequest.compression: unknown value -1 (in backup)");
	shim__v1__request__free_unpacked(r, NULL);
	/* a restore without mode: nothing to check */
	static const uint8_t none[] = {0xea, 0x03, 0x03, 0x0a, 0x01, '/'};
	r = shim__v1__request__unpack(NULL, sizeof(none), none);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(pb_check_enums(&r->base, out, sizeof(out)), 0);
	shim__v1__request__free_unpacked(r, NULL);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("header");
	tcase_add_test(tc, test_hdr_wire_layout);
	tcase_add_test(tc, test_hdr_round_trip);
	tcase_add_test(tc, test_u32_helpers);
	suite_add_tcase(s, tc);

	tc = tcase_create("check");
	tcase_add_test(tc, test_check_every_prefix);
	tcase_add_test(tc, test_check_exact_limit);
	tcase_add_test(tc, test_check_too_big_from_header_alone);
	tcase_add_test(tc, test_check_bad_type_zero);
	tcase_add_test(tc, test_check_bad_reserved);
	tcase_add_test(tc, test_check_types_and_flags_pass);
	tcase_add_test(tc, test_type_names);
	suite_add_tcase(s, tc);

	tc = tcase_create("errnames");
	tcase_add_test(tc, test_errnames_known);
	tcase_add_test(tc, test_errnames_aliases);
	tcase_add_test(tc, test_errnames_unknown);
	tcase_add_test(tc, test_errnames_consistent);
	suite_add_tcase(s, tc);

	tc = tcase_create("pbcheck");
	tcase_add_test(tc, test_pbcheck_explain);
	tcase_add_test(tc, test_pbcheck_enums);
	suite_add_tcase(s, tc);

	tc = tcase_create("describe");
	tcase_add_test(tc, test_describe_hello_hides_token);
	tcase_add_test(tc, test_describe_data_escapes);
	tcase_add_test(tc, test_describe_data_preview_cut);
	tcase_add_test(tc, test_describe_window_and_misc);
	tcase_add_test(tc, test_describe_error_and_undecodable);
	tcase_add_test(tc, test_describe_small_buffer);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(frame_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
