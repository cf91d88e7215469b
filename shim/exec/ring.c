/* ring.c: a bounded byte ring that keeps the newest bytes (detached processes' output). */
#include "ring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define RING_START (16u << 10)

void ring_init(struct ring *r, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->max = max;
}

void ring_free(struct ring *r)
{
	free(r->buf);
	r->buf = NULL;
	r->cap = r->len = r->start = 0;
}

/* Grow to hold at least want bytes (at most max), keeping the bytes in order. */
static int ring_grow(struct ring *r, size_t want)
{
	size_t cap = r->cap ? r->cap : RING_START;
	while (cap < want && cap < r->max)
		cap *= 2;
	if (cap > r->max)
		cap = r->max;
	if (cap <= r->cap)
		return 0;
	uint8_t *n = malloc(cap);
	if (n == NULL)
		return -1;
	/* linearise: oldest byte at index 0 */
	size_t first = r->cap - r->start < r->len ? r->cap - r->start : r->len;
	if (r->len > 0) {
		memcpy(n, r->buf + r->start, first);
		memcpy(n + first, r->buf, r->len - first);
	}
	free(r->buf);
	r->buf = n;
	r->cap = cap;
	r->start = 0;
	return 0;
}

int ring_write(struct ring *r, const void *data, size_t n)
{
	const uint8_t *d = data;
	int rc = 0;
	if (r->max == 0) {
		r->head += n;
		return 0;
	}
	if (r->len + n > r->cap && r->cap < r->max && ring_grow(r, r->len + n) < 0) {
		rc = -1;
		errno = ENOMEM;
		if (r->cap == 0) {
			r->head += n; /* nothing can be kept */
			return rc;
		}
	}
	r->head += n;
	if (n >= r->cap) {
		/* only the last cap bytes survive */
		d += n - r->cap;
		memcpy(r->buf, d, r->cap);
		r->start = 0;
		r->len = r->cap;
		return rc;
	}
	if (r->len + n > r->cap) {
		size_t drop = r->len + n - r->cap;
		r->start = (r->start + drop) % r->cap;
		r->len -= drop;
	}
	size_t end = (r->start + r->len) % r->cap;
	size_t first = r->cap - end < n ? r->cap - end : n;
	memcpy(r->buf + end, d, first);
	memcpy(r->buf, d + first, n - first);
	r->len += n;
	return rc;
}

size_t ring_peek(const struct ring *r, uint64_t pos, const uint8_t **p)
{
	if (pos >= r->head || pos < ring_tail(r))
		return 0;
	size_t skip = (size_t)(pos - ring_tail(r));
	size_t idx = (r->start + skip) % r->cap;
	size_t avail = r->len - skip;
	size_t contig = r->cap - idx;
	*p = r->buf + idx;
	return avail < contig ? avail : contig;
}
