/* util.c: the helpers of util.h that are not inline (uuid4). */
#include "util.h"

#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void uuid4(char out[37])
{
	uint8_t r[16];
	if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		/* no entropy yet (early boot in a microVM): unique enough for an id */
		static uint64_t counter;
		uint64_t x = mono_ns() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)time(NULL) ^
			     (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 20);
		for (size_t i = 0; i < sizeof(r); i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			r[i] = (uint8_t)x;
		}
	}
	r[6] = (uint8_t)((r[6] & 0x0f) | 0x40); /* version 4 */
	r[8] = (uint8_t)((r[8] & 0x3f) | 0x80); /* variant 10 */
	snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
		 r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]);
}
