/* frame.h: shim protocol v1 framing: the 12-byte header, frame types and limits.
 * Shared by the daemon and the SDK; no allocation, no I/O. */
#ifndef SHIM_FRAME_H
#define SHIM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define SHIM_PROTOCOL_VERSION 1u

/* Header: u32 payload length, u32 stream id, u8 type, u8 flags, u16 reserved (0);
 * all in network byte order. */
#define FRAME_HDR_LEN 12u

/* Payload limits. Every side accepts at least FRAME_MIN_MAX; the handshake settles
 * on the smaller of the two sides' maxima. FRAME_HELLO_MAX bounds a HELLO, whose
 * size is checked before the limit has been negotiated. */
#define FRAME_DEFAULT_MAX (1u << 20)
#define FRAME_MIN_MAX (16u << 10)
#define FRAME_ABS_MAX (16u << 20)
#define FRAME_HELLO_MAX (64u << 10)
#define FRAME_PING_MAX 64u
#define FRAME_DEFAULT_WINDOW (256u << 10)
#define FRAME_MIN_WINDOW (4u << 10)
/* Size of the DATA frames both sides produce: big enough that per-frame costs
 * vanish, small enough that buffers come from the heap rather than from fresh
 * mmap()s (whose page faults would cost more than the copy). */
#define FRAME_DATA_CHUNK (64u << 10)

enum frame_type {
	FRAME_HELLO = 1,    /* client -> shim, stream 0, proto Hello */
	FRAME_HELLO_OK = 2, /* shim -> client, stream 0, proto HelloReply */
	FRAME_REQUEST = 3,  /* client -> shim, opens a stream, proto Request */
	FRAME_DATA = 4,     /* both ways, raw bytes; flag FIN ends that direction */
	FRAME_EVENT = 5,    /* shim -> client, proto Event in the middle of a stream */
	FRAME_END = 6,      /* shim -> client, proto Result, ends the stream */
	FRAME_ERROR = 7,    /* shim -> client, proto Error; ends the stream (stream 0: the connection) */
	FRAME_CANCEL = 8,   /* client -> shim, empty: abort the stream */
	FRAME_WINDOW = 9,   /* both ways, u32 credit increment for DATA on that stream */
	FRAME_PING = 10,    /* both ways, stream 0, opaque payload up to 64 bytes */
	FRAME_PONG = 11,    /* answer to PING with the same payload */
};
#define FRAME_TYPE_MAX FRAME_PONG

enum frame_flag {
	FRAME_FLAG_FIN = 0x01,    /* DATA: no more data in this direction after this frame */
	FRAME_FLAG_STDERR = 0x02, /* DATA from exec/attach: these bytes are the command's stderr */
};

struct frame_hdr {
	uint32_t len;
	uint32_t stream;
	uint8_t type;
	uint8_t flags;
	uint16_t reserved;
};

enum frame_status {
	FRAME_NEED_MORE = 0, /* fewer than FRAME_HDR_LEN bytes, or the payload is not all there */
	FRAME_OK = 1,        /* a whole frame is available */
	FRAME_TOO_BIG = -1,  /* declared length over the limit: refuse before allocating */
	FRAME_BAD = -2,      /* reserved bits set or type 0 */
};

void frame_put_hdr(uint8_t out[FRAME_HDR_LEN], const struct frame_hdr *h);
void frame_get_hdr(const uint8_t in[FRAME_HDR_LEN], struct frame_hdr *h);

/* Look at the first len bytes of buf: is a whole frame there, and is its header
 * sane? Fills *h whenever the header itself is complete. */
enum frame_status frame_check(const uint8_t *buf, size_t len, uint32_t max_payload, struct frame_hdr *h);

/* "DATA", "HELLO", ...; "?" for an unknown type. */
const char *frame_type_name(unsigned type);

static inline void frame_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* A protobuf varint (the length before each delimited message in a listing's or a
 * watch's DATA): at most 10 bytes at p; returns how many. */
static inline size_t frame_put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

static inline uint32_t frame_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

#endif
