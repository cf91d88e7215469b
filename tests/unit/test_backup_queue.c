/* test_backup_queue.c: unit tests for the queue between a backup's walker and writer threads: order and content
 * across wraps of the ring, payloads too big for it, the bound on open fds, stop, cancel, the walker's error. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backup.h"
#include "backup_queue.h"

/* Deterministic sizes and bytes for record i. */
static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static size_t data_size(unsigned i)
{
	uint64_t r = mix(i);
	switch (r % 8) {
	case 0:
		return 0;
	case 1:
		return BQ_INLINE; /* the biggest inline file */
	case 2:
		return BQ_RING / 4 + 1 + r % 4096; /* malloc'd payload */
	default:
		return (size_t)(r >> 8) % 20000;
	}
}

static uint8_t byte_at(unsigned i, size_t k)
{
	return (uint8_t)(i * 131 + k * 7 + (k >> 9));
}

struct producer {
	struct backup_queue *q;
	unsigned n;        /* records to push */
	bool with_fds;     /* every 3rd record carries a pipe fd */
	int fail_at;       /* push this many, then finish with an error (-1: never) */
	unsigned pushed;   /* records committed */
	int reserve_errno; /* why backup_queue_reserve gave NULL, if it did */
	int *fds;          /* the fds handed over, by record */
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	for (unsigned i = 0; i < p->n; i++) {
		if (p->fail_at >= 0 && i == (unsigned)p->fail_at) {
			struct shim_err e;
			err_set(&e, EACCES, "/x/unreadable", "backup: open");
			backup_queue_finish(p->q, -1, &e);
			return NULL;
		}
		char name[64], link[64];
		int nl = snprintf(name, sizeof(name), "./dir/entry-%u", i);
		int ll = snprintf(link, sizeof(link), "target-%u", i * 3);
		size_t xlen = i % 5 == 0 ? 8 + 7 + 1 + 3 : 0;
		size_t nreg = i % 7 == 0 ? 2 : 0;
		size_t dlen = data_size(i);
		bool fd = p->with_fds && i % 3 == 0;
		struct backup_queue_rec *r = backup_queue_reserve(
			p->q, backup_queue_payload_size((size_t)nl, (size_t)ll, xlen, nreg, dlen), fd);
		if (r == NULL) {
			p->reserve_errno = errno;
			backup_queue_finish(p->q, 0, NULL);
			return NULL;
		}
		r->name_len = (uint32_t)nl;
		r->link_len = (uint32_t)ll;
		r->xattr_bytes = (uint32_t)xlen;
		r->nreg = (uint32_t)nreg;
		r->data_len = dlen;
		r->st.st_size = (off_t)i;
		memcpy(r->payload, name, (size_t)nl + 1);
		memcpy(r->payload + nl + 1, link, (size_t)ll + 1);
		if (xlen > 0) {
			uint32_t k = 7, v = 3;
			uint8_t *x = backup_queue_xattrs(r);
			memcpy(x, &k, 4);
			memcpy(x + 4, &v, 4);
			memcpy(x + 8, "user.ab", 8);
			memcpy(x + 16, "v\0w", 3);
		}
		for (size_t g = 0; g < nreg; g++)
			backup_queue_regions(r)[g] = (struct backup_queue_region){(int64_t)(i + g), (int64_t)(g * 10)};
		uint8_t *d = backup_queue_data(r);
		for (size_t k = 0; k < dlen; k++)
			d[k] = byte_at(i, k);
		if (fd) {
			int pf[2];
			ck_assert_int_eq(pipe(pf), 0);
			close(pf[1]);
			r->flags |= BQF_FD;
			r->fd = pf[0];
			p->fds[i] = pf[0];
		}
		backup_queue_commit(p->q, r);
		p->pushed++;
	}
	backup_queue_finish(p->q, 0, NULL);
	return NULL;
}

static void check_rec(const struct backup_queue_rec *r, unsigned i, bool with_fds)
{
	char name[64], link[64];
	snprintf(name, sizeof(name), "./dir/entry-%u", i);
	snprintf(link, sizeof(link), "target-%u", i * 3);
	ck_assert_int_eq((int)r->st.st_size, (int)i);
	ck_assert_str_eq(backup_queue_name(r), name);
	ck_assert_str_eq(backup_queue_link(r), link);
	ck_assert_uint_eq(r->xattr_bytes, i % 5 == 0 ? 19u : 0u);
	if (r->xattr_bytes > 0) {
		const uint8_t *x = backup_queue_xattrs(r);
		ck_assert_str_eq((const char *)x + 8, "user.ab");
		ck_assert(memcmp(x + 16, "v\0w", 3) == 0);
	}
	ck_assert_uint_eq(r->nreg, i % 7 == 0 ? 2u : 0u);
	for (size_t g = 0; g < r->nreg; g++) {
		ck_assert_int_eq(backup_queue_regions(r)[g].off, (int64_t)(i + g));
		ck_assert_int_eq(backup_queue_regions(r)[g].len, (int64_t)(g * 10));
	}
	ck_assert_uint_eq(r->data_len, data_size(i));
	ck_assert(((uintptr_t)backup_queue_regions(r) & 7) == 0);
	const uint8_t *d = backup_queue_data(r);
	for (size_t k = 0; k < r->data_len; k++)
		if (d[k] != byte_at(i, k))
			ck_abort_msg("record %u: byte %zu differs", i, k);
	ck_assert_int_eq((r->flags & BQF_FD) != 0, with_fds && i % 3 == 0);
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* Everything arrives once, in order, whole, across many wraps of the ring and
 * payloads that do not fit it; never more than max_fds open fds in the queue. */
START_TEST(order_and_content)
{
	struct backup b;
	memset(&b, 0, sizeof(b));
	struct backup_queue q;
	ck_assert_int_eq(backup_queue_init(&q, &b.j), 0);
	enum { N = 3000 };
	int *fds = calloc(N, sizeof(int));
	ck_assert_ptr_nonnull(fds);
	struct producer p = {.q = &q, .n = N, .with_fds = true, .fail_at = -1, .fds = fds};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, produce, &p), 0);
	unsigned got = 0, max_fds = 0;
	struct backup_queue_rec *r;
	while ((r = backup_queue_next(&q, NULL)) != NULL) {
		check_rec(r, got, true);
		pthread_mutex_lock(&q.mu);
		if (q.fds > max_fds)
			max_fds = q.fds;
		pthread_mutex_unlock(&q.mu);
		if (r->flags & BQF_FD) {
			ck_assert_int_eq(r->fd, fds[got]);
			close(r->fd);
			r->fd = -1;
		}
		/* a slow writer now and then: the walker fills the ring and waits */
		if (got % 500 == 0)
			usleep(20000);
		backup_queue_release(&q, r);
		got++;
	}
	pthread_join(t, NULL);
	ck_assert_uint_eq(got, N);
	ck_assert_int_eq(q.rc, 0);
	ck_assert(max_fds <= q.max_fds && q.max_fds >= 16 && q.max_fds <= BQ_FDS_MAX);
	ck_assert_uint_eq(q.used, 0);
	backup_queue_free(&q);
	free(fds);
}
END_TEST

/* The writer stops: the walker's next reserve fails with ECANCELED, and the fds of
 * the records nobody took are closed by backup_queue_free. */
START_TEST(stop_closes_fds)
{
	struct backup b;
	memset(&b, 0, sizeof(b));
	struct backup_queue q;
	ck_assert_int_eq(backup_queue_init(&q, &b.j), 0);
	enum { N = 100000 };
	int *fds = calloc(N, sizeof(int));
	ck_assert_ptr_nonnull(fds);
	struct producer p = {.q = &q, .n = N, .with_fds = true, .fail_at = -1, .fds = fds};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, produce, &p), 0);
	for (unsigned i = 0; i < 10; i++) {
		struct backup_queue_rec *r = backup_queue_next(&q, NULL);
		ck_assert_ptr_nonnull(r);
		check_rec(r, i, true);
		if (r->fd >= 0) {
			close(r->fd);
			r->fd = -1;
		}
		backup_queue_release(&q, r);
	}
	usleep(50000); /* the walker fills the ring (or the fd budget) and waits */
	backup_queue_stop(&q);
	pthread_join(t, NULL);
	ck_assert_int_eq(p.reserve_errno, ECANCELED);
	ck_assert(p.pushed < N);
	unsigned open_fds = 0;
	for (unsigned i = 10; i < p.pushed; i++)
		open_fds += fds[i] > 0 && fd_open(fds[i]);
	ck_assert(open_fds > 0 && open_fds <= q.max_fds);
	backup_queue_free(&q);
	for (unsigned i = 10; i < p.pushed; i++)
		ck_assert(fds[i] <= 0 || !fd_open(fds[i]));
	free(fds);
}
END_TEST

/* A cancel of the job: a writer waiting for records returns NULL, a walker waiting
 * for room gets ECANCELED; both within the poll interval. */
START_TEST(cancel_wakes_both)
{
	struct backup b;
	memset(&b, 0, sizeof(b));
	struct backup_queue q;
	ck_assert_int_eq(backup_queue_init(&q, &b.j), 0);
	struct producer p = {.q = &q, .n = 100000, .fail_at = -1};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, produce, &p), 0);
	usleep(50000); /* the ring is full and the walker waits */
	__atomic_store_n(&b.j.cancelled, true, __ATOMIC_RELEASE);
	pthread_join(t, NULL);
	ck_assert_int_eq(p.reserve_errno, ECANCELED);
	ck_assert_ptr_null(backup_queue_next(&q, NULL));
	backup_queue_free(&q);

	/* a writer waiting on an empty queue */
	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(backup_queue_init(&q, &b.j), 0);
	__atomic_store_n(&b.j.cancelled, true, __ATOMIC_RELEASE);
	ck_assert_ptr_null(backup_queue_next(&q, NULL));
	backup_queue_free(&q);
}
END_TEST

/* The walker's error reaches the writer after the records before it. */
START_TEST(walker_error)
{
	struct backup b;
	memset(&b, 0, sizeof(b));
	struct backup_queue q;
	ck_assert_int_eq(backup_queue_init(&q, &b.j), 0);
	struct producer p = {.q = &q, .n = 50, .fail_at = 20};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, produce, &p), 0);
	unsigned got = 0;
	struct backup_queue_rec *r;
	while ((r = backup_queue_next(&q, NULL)) != NULL) {
		check_rec(r, got++, false);
		backup_queue_release(&q, r);
	}
	pthread_join(t, NULL);
	ck_assert_uint_eq(got, 20);
	ck_assert_int_eq(q.rc, -1);
	ck_assert_int_eq(q.err.code, EACCES);
	ck_assert_str_eq(q.err.path, "/x/unreadable");
	backup_queue_free(&q);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("backup_queue");
	TCase *tc = tcase_create("queue");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, order_and_content);
	tcase_add_test(tc, stop_closes_fds);
	tcase_add_test(tc, cancel_wakes_both);
	tcase_add_test(tc, walker_error);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? 0 : 1;
}
