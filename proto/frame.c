/* frame.c: header encoding and the checks every received frame goes through first. */
#include "frame.h"

void frame_put_hdr(uint8_t out[FRAME_HDR_LEN], const struct frame_hdr *h)
{
	frame_put_u32(out, h->len);
	frame_put_u32(out + 4, h->stream);
	out[8] = h->type;
	out[9] = h->flags;
	out[10] = (uint8_t)(h->reserved >> 8);
	out[11] = (uint8_t)h->reserved;
}

void frame_get_hdr(const uint8_t in[FRAME_HDR_LEN], struct frame_hdr *h)
{
	h->len = frame_get_u32(in);
	h->stream = frame_get_u32(in + 4);
	h->type = in[8];
	h->flags = in[9];
	h->reserved = (uint16_t)(in[10] << 8 | in[11]);
}

enum frame_status frame_check(const uint8_t *buf, size_t len, uint32_t max_payload, struct frame_hdr *h)
{
	if (len < FRAME_HDR_LEN)
		return FRAME_NEED_MORE;
	frame_get_hdr(buf, h);
	/* The length is judged as soon as the header is in, so a peer can never make
	 * us wait for (or buffer) more than max_payload bytes. */
	if (h->len > max_payload)
		return FRAME_TOO_BIG;
	if (h->type == 0 || h->reserved != 0)
		return FRAME_BAD;
	if (len - FRAME_HDR_LEN < h->len)
		return FRAME_NEED_MORE;
	return FRAME_OK;
}

const char *frame_type_name(unsigned type)
{
	static const char *const names[] = {
		[FRAME_HELLO] = "HELLO", [FRAME_HELLO_OK] = "HELLO_OK", [FRAME_REQUEST] = "REQUEST",
		[FRAME_DATA] = "DATA",   [FRAME_EVENT] = "EVENT",       [FRAME_END] = "END",
		[FRAME_ERROR] = "ERROR", [FRAME_CANCEL] = "CANCEL",     [FRAME_WINDOW] = "WINDOW",
		[FRAME_PING] = "PING",   [FRAME_PONG] = "PONG",
	};
	if (type == 0 || type > FRAME_TYPE_MAX)
		return "?";
	return names[type];
}
