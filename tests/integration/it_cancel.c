/* it_cancel.c: cancel tokens and call timeouts end a call quickly and leave the client usable. */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG (256u << 20)

struct firer {
	struct sbx_cancel *tok;
	unsigned after_ms;
	uint64_t fired_at;
};

static void *fire_thread(void *arg)
{
	struct firer *f = arg;
	it_sleep_ms(f->after_ms);
	f->fired_at = it_now_ms();
	sbx_cancel_fire(f->tok);
	return NULL;
}

/* The daemon has ended every stream but the info call asking. */
static void wait_streams_idle(struct sbx_client *c)
{
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	uint64_t deadline = it_now_ms() + 5000;
	for (;;) {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.streams == 1)
			return;
		CHECKF(it_now_ms() < deadline, "the daemon still has %u streams", in.streams);
		it_sleep_ms(5);
	}
}

static void small_echo(struct sbx_client *c)
{
	uint8_t data[100000], back[sizeof(data)];
	struct sbx_error err;
	it_fill(data, sizeof(data), 5);
	CHECK_SBX(sbx_echo(c, NULL, data, sizeof(data), back, &err), &err);
	CHECK(memcmp(data, back, sizeof(data)) == 0);
}

static int case_cancel_echo(void)
{
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	/* untouched zero pages: cheap to allocate, and echo does not care */
	uint8_t *data = calloc(1, BIG), *back = calloc(1, BIG);
	CHECK(data != NULL && back != NULL);

	struct sbx_cancel *tok = sbx_cancel_new();
	CHECK(tok != NULL);
	CHECK(!sbx_cancel_fired(tok));
	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = -1, .cancel = tok};
	struct firer f = {.tok = tok, .after_ms = 20};
	pthread_t th;
	struct sbx_error err;
	memset(&err, 0, sizeof(err));
	uint64_t t0 = it_now_ms();
	CHECK(pthread_create(&th, NULL, fire_thread, &f) == 0);
	int rc = sbx_echo(c, &opts, data, BIG, back, &err);
	uint64_t t1 = it_now_ms();
	CHECK(pthread_join(th, NULL) == 0);
	printf("256 MiB echo cancelled after %llu ms, returned %llu ms after the cancel\n",
	       (unsigned long long)(f.fired_at - t0), (unsigned long long)(t1 - f.fired_at));
	CHECK_EQ(rc, -1);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(sbx_cancel_fired(tok));
	CHECKF(t1 - f.fired_at < 500, "the call returned %llu ms after the cancel",
	       (unsigned long long)(t1 - f.fired_at));

	/* back is the caller's again: what the shim had sent on the cancelled stream is
	 * dropped, not read into it (libsbx reads an echo's DATA straight into out) */
	memset(back, 0x5a, BIG);
	/* the same client goes on working, and the daemon ended the stream */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	small_echo(c);
	wait_streams_idle(c);
	CHECK_EQ(sbx_client_pending(c), 0);
	size_t same = 0;
	while (same < BIG && back[same] == 0x5a)
		same++;
	CHECKF(same == BIG, "byte %zu of the cancelled echo's buffer changed after it returned", same);

	/* a token stays fired: the next call with it is cancelled at once */
	memset(&err, 0, sizeof(err));
	t0 = it_now_ms();
	CHECK(sbx_echo(c, &opts, data, BIG, back, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	CHECK(it_now_ms() - t0 < 500);
	/* until reset */
	sbx_cancel_reset(tok);
	CHECK(!sbx_cancel_fired(tok));
	CHECK_SBX(sbx_ping(c, &opts, NULL, &err), &err);
	small_echo(c);
	wait_streams_idle(c);

	sbx_cancel_free(tok);
	free(data);
	free(back);
	sbx_client_close(c);
	return 0;
}

static int case_timeout_echo(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	uint8_t *data = calloc(1, BIG), *back = calloc(1, BIG);
	CHECK(data != NULL && back != NULL);

	struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 1};
	struct sbx_error err;
	memset(&err, 0, sizeof(err));
	uint64_t t0 = it_now_ms();
	CHECK(sbx_echo(c, &opts, data, BIG, back, &err) < 0);
	uint64_t ms = it_now_ms() - t0;
	printf("256 MiB echo with timeout_ms=1 failed after %llu ms: %s\n", (unsigned long long)ms, it_errstr(&err));
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	CHECKF(ms < 500, "a 1 ms timeout took %llu ms", (unsigned long long)ms);
	free(data);
	free(back);

	/* the client is still usable after its call timed out */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	small_echo(c);
	wait_streams_idle(c);

	/* a daemon that does not answer at all: a ping times out on time */
	CHECK(kill(d->pid, SIGSTOP) == 0);
	opts.timeout_ms = 200;
	memset(&err, 0, sizeof(err));
	t0 = it_now_ms();
	CHECK(sbx_ping(c, &opts, NULL, &err) < 0);
	ms = it_now_ms() - t0;
	CHECK(kill(d->pid, SIGCONT) == 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
	CHECKF(ms >= 190 && ms < 1000, "a 200 ms timeout took %llu ms", (unsigned long long)ms);
	/* the late PONG is dropped, the next ping gets its own */
	CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
	CHECK_EQ(sbx_client_pending(c), 0);
	sbx_client_close(c);
	return 0;
}

struct resumer {
	pid_t pid;
	unsigned after_ms;
};

static void *resume_thread(void *arg)
{
	struct resumer *r = arg;
	it_sleep_ms(r->after_ms);
	kill(r->pid, SIGCONT);
	return NULL;
}

/* A call's timeout that falls while one of its frames is half written (the daemon is
 * stopped, the socket buffer full) fails that call only: the connection and the
 * other calls on it go on. */
static int case_timeout_midframe(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	size_t n = 4u << 20;
	uint8_t *data = calloc(1, n), *back = calloc(1, n);
	CHECK(data != NULL && back != NULL);
	struct sbx_error err;
	for (int round = 0; round < 3; round++) {
		CHECK(kill(d->pid, SIGSTOP) == 0);
		struct resumer r = {.pid = d->pid, .after_ms = 400};
		pthread_t th;
		CHECK(pthread_create(&th, NULL, resume_thread, &r) == 0);
		struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = 150};
		memset(&err, 0, sizeof(err));
		uint64_t t0 = it_now_ms();
		CHECK(sbx_echo(c, &opts, data, n, back, &err) < 0);
		uint64_t ms = it_now_ms() - t0;
		CHECK(pthread_join(th, NULL) == 0);
		printf("round %d: echo with timeout_ms=150 against a stopped daemon failed after %llu ms: %s\n", round,
		       (unsigned long long)ms, it_errstr(&err));
		CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
		CHECK(ms >= 140);
		/* the same client still works */
		CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
		small_echo(c);
		wait_streams_idle(c);
	}
	free(data);
	free(back);
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"cancel_echo", case_cancel_echo},
		{"timeout_echo", case_timeout_echo},
		{"timeout_midframe", case_timeout_midframe},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
