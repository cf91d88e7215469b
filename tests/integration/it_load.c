/* it_load.c: many clients at once, one client shared by threads, and 1,000 clients driven from one thread. */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- 100 clients x 100 pings, each client on its own thread ---- */

#define MANY_CLIENTS 100
#define MANY_PINGS 100

struct many {
	const char *target;
	pthread_barrier_t start;
	unsigned ok; /* pings that succeeded, all threads */
};

static void *many_thread(void *arg)
{
	struct many *m = arg;
	struct sbx_client *c = it_connect(m->target, NULL);
	pthread_barrier_wait(&m->start);
	struct sbx_error err;
	for (int i = 0; i < MANY_PINGS; i++) {
		uint64_t rtt = 0;
		CHECK_SBX(sbx_ping(c, NULL, &rtt, &err), &err);
		CHECK(rtt > 0);
		__atomic_add_fetch(&m->ok, 1, __ATOMIC_RELAXED);
	}
	CHECK_EQ(sbx_client_pending(c), 0);
	sbx_client_close(c);
	return NULL;
}

static int case_many_clients(void)
{
	const char *sock = it_path("s");
	it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct many m = {.target = it_unix_target(sock)};
	pthread_barrier_init(&m.start, NULL, MANY_CLIENTS);
	pthread_t th[MANY_CLIENTS];
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 << 10);
	uint64_t t0 = it_now_ms();
	for (int i = 0; i < MANY_CLIENTS; i++)
		CHECK(pthread_create(&th[i], &attr, many_thread, &m) == 0);
	for (int i = 0; i < MANY_CLIENTS; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	pthread_attr_destroy(&attr);
	pthread_barrier_destroy(&m.start);
	printf("%u pings from %d clients in %llu ms\n", m.ok, MANY_CLIENTS, (unsigned long long)(it_now_ms() - t0));
	CHECK_EQ(m.ok, MANY_CLIENTS * MANY_PINGS);

	/* every connection is gone from the daemon's books */
	struct sbx_client *c = it_connect(m.target, NULL);
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	uint64_t deadline = it_now_ms() + 5000;
	do {
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		CHECKF(it_now_ms() < deadline, "daemon still counts %u connections", in.connections);
	} while (in.connections != 1);
	sbx_client_close(c);
	return 0;
}

/* ---- 8 threads sharing one client ---- */

#define SHARED_THREADS 8
#define SHARED_ROUNDS 40

struct shared {
	struct sbx_client *c;
	unsigned pid;
	unsigned seed;
	pthread_barrier_t *start;
};

static void *shared_thread(void *arg)
{
	struct shared *s = arg;
	struct sbx_error err;
	size_t cap = 200u << 10;
	uint8_t *data = malloc(cap), *back = malloc(cap);
	CHECK(data != NULL && back != NULL);
	pthread_barrier_wait(s->start);
	for (unsigned r = 0; r < SHARED_ROUNDS; r++) {
		CHECK_SBX(sbx_ping(s->c, NULL, NULL, &err), &err);
		struct sbx_info in = SBX_INFO_INIT;
		CHECK_SBX(sbx_info(s->c, NULL, &in, &err), &err);
		CHECK_EQ(in.pid, s->pid);
		/* sizes from 0 up to past the 256 KiB window's worth of frames in flight */
		size_t n = (size_t)((s->seed * 7919u + r * 104729u) % cap);
		it_fill(data, n, s->seed * 1000u + r);
		memset(back, 0, n);
		CHECK_SBX(sbx_echo(s->c, NULL, data, n, back, &err), &err);
		CHECKF(memcmp(data, back, n) == 0, "thread %u round %u: echo of %zu bytes differs", s->seed, r, n);
	}
	free(data);
	free(back);
	return NULL;
}

static int case_shared_client(void)
{
	const char *sock = it_path("s");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	pthread_barrier_t start;
	pthread_barrier_init(&start, NULL, SHARED_THREADS);
	pthread_t th[SHARED_THREADS];
	struct shared s[SHARED_THREADS];
	for (unsigned i = 0; i < SHARED_THREADS; i++) {
		s[i] = (struct shared){.c = c, .pid = (unsigned)d->pid, .seed = i + 1, .start = &start};
		CHECK(pthread_create(&th[i], NULL, shared_thread, &s[i]) == 0);
	}
	for (unsigned i = 0; i < SHARED_THREADS; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	pthread_barrier_destroy(&start);
	CHECK_EQ(sbx_client_pending(c), 0);
	struct sbx_info in = SBX_INFO_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
	CHECK_EQ(in.connections, 1);
	CHECK_EQ(in.streams, 1); /* this info call itself */
	sbx_client_close(c);
	return 0;
}

/* ---- 1,000 clients on 4 daemons, driven from one thread ---- */

#define K_CLIENTS 1000
#define K_DAEMONS 4
#define K_ROUNDS 3

static unsigned pongs, ping_failures;

static void pong_cb(void *ud, int status, uint64_t rtt_ns, const struct sbx_error *err)
{
	(void)ud;
	(void)rtt_ns;
	if (status == 0) {
		pongs++;
	} else {
		ping_failures++;
		fprintf(stderr, "async ping failed: %s\n", it_errstr(err));
	}
}

static long status_field(const char *key)
{
	FILE *f = fopen("/proc/self/status", "re");
	CHECK(f != NULL);
	char line[256];
	long v = -1;
	size_t klen = strlen(key);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, key, klen) == 0 && line[klen] == ':')
			v = strtol(line + klen + 1, NULL, 10);
	fclose(f);
	CHECKF(v >= 0, "no %s in /proc/self/status", key);
	return v;
}

static int case_thousand_clients(void)
{
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 4096) {
		printf("SKIP: RLIMIT_NOFILE hard limit is %llu (< 4096)\n", (unsigned long long)rl.rlim_max);
		return IT_SKIP;
	}
	rl.rlim_cur = rl.rlim_max;
	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);

	char names[K_DAEMONS][16];
	const char *targets[K_DAEMONS];
	for (int i = 0; i < K_DAEMONS; i++) {
		snprintf(names[i], sizeof(names[i]), "s%d", i);
		targets[i] = strdup(it_unix_target(it_path(names[i])));
		it_daemon_start(names[i], "--listen", targets[i], NULL);
	}
	static struct sbx_client *c[K_CLIENTS];
	uint64_t t0 = it_now_ms();
	for (int i = 0; i < K_CLIENTS; i++) {
		struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
		struct sbx_error err;
		CHECK_SBX(sbx_connect(targets[i % K_DAEMONS], &o, &c[i], &err), &err);
	}
	uint64_t t1 = it_now_ms();

	static struct pollfd pf[K_CLIENTS];
	for (int round = 0; round < K_ROUNDS; round++) {
		pongs = ping_failures = 0;
		for (int i = 0; i < K_CLIENTS; i++) {
			struct sbx_error err;
			CHECK_SBX(sbx_ping_async(c[i], pong_cb, NULL, &err), &err);
			pf[i] = (struct pollfd){.fd = sbx_client_fd(c[i]), .events = POLLIN};
		}
		/* the caller's event loop: one thread, poll(), sbx_client_process() */
		uint64_t deadline = it_now_ms() + 30000;
		while (pongs + ping_failures < K_CLIENTS) {
			CHECKF(it_now_ms() < deadline, "round %d: only %u of %d pongs", round, pongs, K_CLIENTS);
			int r = poll(pf, K_CLIENTS, 1000);
			CHECK(r >= 0 || errno == EINTR);
			for (int i = 0; i < K_CLIENTS && r > 0; i++) {
				if (pf[i].revents == 0)
					continue;
				struct sbx_error err;
				CHECK_SBX(sbx_client_process(c[i], &err), &err);
			}
		}
		CHECK_EQ(ping_failures, 0);
		CHECK_EQ(pongs, K_CLIENTS);
		for (int i = 0; i < K_CLIENTS; i++)
			CHECK_EQ(sbx_client_pending(c[i]), 0);
	}
	uint64_t t2 = it_now_ms();

	long threads = status_field("Threads"), rss_kb = status_field("VmRSS");
	printf("%d clients on %d daemons: connected in %llu ms, %d rounds of async pings in %llu ms; "
	       "Threads: %ld, VmRSS: %ld kB (%.1f kB per client)\n",
	       K_CLIENTS, K_DAEMONS, (unsigned long long)(t1 - t0), K_ROUNDS, (unsigned long long)(t2 - t1), threads,
	       rss_kb, (double)rss_kb / K_CLIENTS);
	CHECKF(threads == 1, "%ld threads: the SDK must not start a thread per client", threads);

	/* each daemon holds its share */
	for (int i = 0; i < K_DAEMONS; i++) {
		struct sbx_info in = SBX_INFO_INIT;
		struct sbx_error err;
		CHECK_SBX(sbx_info(c[i], NULL, &in, &err), &err);
		CHECK_EQ(in.connections, K_CLIENTS / K_DAEMONS);
	}
	for (int i = 0; i < K_CLIENTS; i++)
		sbx_client_close(c[i]);
	for (int i = 0; i < K_DAEMONS; i++)
		free((void *)targets[i]);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"many_clients", case_many_clients},
		{"shared_client", case_shared_client},
		{"thousand_clients", case_thousand_clients},
	};
	return it_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
}
