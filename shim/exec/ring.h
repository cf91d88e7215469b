/* ring.h: a bounded byte ring that keeps the newest bytes, addressed by a running byte offset. */
#ifndef SHIM_RING_H
#define SHIM_RING_H

#include <stddef.h>
#include <stdint.h>

/* Bytes are numbered from 0 in the order they were written: the ring holds the
 * range [ring_tail(), head). Writing past max drops the oldest bytes. Memory is
 * taken as the bytes come (doubling from a small start), never more than max. */
struct ring {
	uint8_t *buf;
	size_t cap;    /* allocated */
	size_t max;    /* limit given at creation */
	size_t start;  /* index in buf of the oldest byte held */
	size_t len;    /* bytes held */
	uint64_t head; /* bytes written in all */
};

void ring_init(struct ring *r, size_t max);
void ring_free(struct ring *r);
/* Append n bytes (only the last max of them are kept). -1 (ENOMEM) if the ring
 * could not grow: the bytes then replace the oldest ones within what it has. */
int ring_write(struct ring *r, const void *data, size_t n);
/* Offset of the oldest byte held. */
static inline uint64_t ring_tail(const struct ring *r)
{
	return r->head - r->len;
}
/* The bytes from offset pos on that lie contiguous in memory: *p and the count
 * (0 when pos >= head). pos must be >= ring_tail(). */
size_t ring_peek(const struct ring *r, uint64_t pos, const uint8_t **p);

#endif
