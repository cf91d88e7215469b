/* it_wire.c: one-shot replies (stat, readlink, ...) and small writes' ENDs that the worker
 * making them writes to the socket itself (conn_wire_send): whole frames among the
 * loop's, a reply the socket takes only part of, CANCEL racing the reply, the stream
 * limit right after an END, and connections that go while replies are on their way.
 * Watched at the frame level. */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void send_readlink(int fd, uint32_t id, const char *path)
{
	Shim__V1__ReadlinkRequest rr = SHIM__V1__READLINK_REQUEST__INIT;
	rr.path.data = (uint8_t *)path;
	rr.path.len = strlen(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_READLINK;
	req.readlink = &rr;
	uint8_t buf[8192];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, id, FRAME_REQUEST, 0, buf, n);
}

/* The REQUEST for a stat of path, packed into buf (a frame's payload): its length. */
static size_t pack_stat(const char *path, uint8_t *buf, size_t size)
{
	Shim__V1__StatRequest sr = SHIM__V1__STAT_REQUEST__INIT;
	sr.path.data = (uint8_t *)path;
	sr.path.len = strlen(path);
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_STAT;
	req.stat = &sr;
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= size);
	return shim__v1__request__pack(&req, buf);
}

/* Frames for many streams at once, in one write (REQUEST, then CANCEL when cancel). */
static void send_stats(int fd, uint32_t first, unsigned n, const char *path, bool cancel)
{
	uint8_t req[512];
	size_t rn = pack_stat(path, req, sizeof(req));
	size_t per = FRAME_HDR_LEN + rn + (cancel ? FRAME_HDR_LEN : 0);
	uint8_t *buf = malloc(per * n);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < n; i++) {
		uint8_t *p = buf + per * i;
		struct frame_hdr h = {.len = (uint32_t)rn, .stream = first + 2 * i, .type = FRAME_REQUEST};
		frame_put_hdr(p, &h);
		memcpy(p + FRAME_HDR_LEN, req, rn);
		if (cancel) {
			struct frame_hdr hc = {.len = 0, .stream = first + 2 * i, .type = FRAME_CANCEL};
			frame_put_hdr(p + FRAME_HDR_LEN + rn, &hc);
		}
	}
	raw_send_bytes(fd, buf, per * n);
	free(buf);
}

/* REQUEST (write path), DATA with FIN (body, body_len bytes), and CANCEL when cancel,
 * for n streams from first, all in one send: path_i is dir/f<i>. */
static void send_writes(int fd, uint32_t first, unsigned n, const char *dir, const uint8_t *body, size_t body_len,
			bool cancel)
{
	size_t cap = n * (3 * FRAME_HDR_LEN + 512 + body_len), len = 0;
	uint8_t *buf = malloc(cap);
	CHECK(buf != NULL);
	for (unsigned i = 0; i < n; i++) {
		char path[PATH_MAX + 16];
		snprintf(path, sizeof(path), "%s/f%u", dir, i);
		Shim__V1__WriteRequest wq = SHIM__V1__WRITE_REQUEST__INIT;
		wq.path.data = (uint8_t *)path;
		wq.path.len = strlen(path);
		Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
		req.kind_case = SHIM__V1__REQUEST__KIND_WRITE;
		req.write = &wq;
		size_t rn = shim__v1__request__get_packed_size(&req);
		CHECK(rn <= 512);
		uint32_t id = first + 2 * i;
		struct frame_hdr h = {.len = (uint32_t)rn, .stream = id, .type = FRAME_REQUEST};
		frame_put_hdr(buf + len, &h);
		shim__v1__request__pack(&req, buf + len + FRAME_HDR_LEN);
		len += FRAME_HDR_LEN + rn;
		struct frame_hdr hd = {
			.len = (uint32_t)body_len, .stream = id, .type = FRAME_DATA, .flags = FRAME_FLAG_FIN};
		frame_put_hdr(buf + len, &hd);
		memcpy(buf + len + FRAME_HDR_LEN, body, body_len);
		len += FRAME_HDR_LEN + body_len;
		if (cancel) {
			struct frame_hdr hc = {.len = 0, .stream = id, .type = FRAME_CANCEL};
			frame_put_hdr(buf + len, &hc);
			len += FRAME_HDR_LEN;
		}
	}
	raw_send_bytes(fd, buf, len);
	free(buf);
}

/* Names in dir that are not f<N>: a temp file left, or anything else. */
static int strays(const char *dir)
{
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != 'f' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* Every stream has ended: a PING's PONG is the next frame, and the connection lives. */
static void expect_pong(int fd)
{
	raw_send(fd, 0, FRAME_PING, 0, "p", 1);
	struct frame_hdr h;
	uint8_t *p;
	CHECK(raw_recv(fd, &h, &p, 5000) == 1);
	CHECKF(h.type == FRAME_PONG && h.len == 1 && p[0] == 'p', "after all had ended: a %s frame for stream %u",
	       frame_type_name(h.type), h.stream);
	free(p);
}

static int tcp_connect_small(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	/* a small window: the shim's replies meet a full socket, and some only partly fit */
	int rcv = 2048;
	CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv)) == 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s", strerror(errno));
	return fd;
}

/* 1500 readlinks (replies of about 4 KiB: 6 MB, past TCP's largest send buffer of
 * 4 MiB) sent at once over TCP to a client with a 2 KiB receive buffer, read only after
 * the last is sent: the replies go out whole from the workers, or behind the loop's
 * queue once the socket is full, and where the socket takes only part of one (seen
 * about once a round), its rest goes before anything else. Each stream gets exactly
 * one END with the link's whole target, 8 rounds on one connection, and a ping after. */
static int case_partial(void)
{
	char target[4001];
	it_fill(target, sizeof(target) - 1, 7);
	for (size_t i = 0; i < sizeof(target) - 1; i++)
		target[i] = (char)('a' + (uint8_t)target[i] % 26);
	target[sizeof(target) - 1] = '\0';
	const char *link = it_path("link");
	CHECK(symlink(target, link) == 0);
	struct it_daemon *d = it_daemon_start("shim", "--listen", "tcp:127.0.0.1:0", "--insecure-no-token", "--workers",
					      "4", "--max-streams", "2000", NULL);
	int fd = tcp_connect_small(it_daemon_tcp_port(d));
	raw_hello(fd, NULL);
	enum { N = 1500, ROUNDS = 8 };
	uint32_t id = 1;
	for (int r = 0; r < ROUNDS; r++) {
		uint32_t first = id;
		for (unsigned i = 0; i < N; i++, id += 2)
			send_readlink(fd, id, link);
		static bool seen[N];
		memset(seen, 0, sizeof(seen));
		for (unsigned got = 0; got < N; got++) {
			struct frame_hdr h;
			uint8_t *p;
			CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF after %u replies of round %d", got, r);
			CHECKF(h.type == FRAME_END, "round %d: a %s frame on stream %u", r, frame_type_name(h.type),
			       h.stream);
			CHECKF(h.stream >= first && h.stream < id && (h.stream - first) % 2 == 0, "END for stream %u",
			       h.stream);
			unsigned k = (h.stream - first) / 2;
			CHECKF(!seen[k], "two ENDs for stream %u", h.stream);
			seen[k] = true;
			Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, p);
			CHECKF(res != NULL, "stream %u: an END that does not decode", h.stream);
			CHECK(res->kind_case == SHIM__V1__RESULT__KIND_PATH);
			CHECK(res->path->path.len == strlen(target));
			CHECK(memcmp(res->path->path.data, target, strlen(target)) == 0);
			shim__v1__result__free_unpacked(res, NULL);
			free(p);
		}
	}
	expect_pong(fd);
	close(fd);
	it_daemon_stop(d);
	return 0;
}

/* REQUEST and CANCEL for each of 200 stats, in one write, 25 times: every stream ends
 * exactly once, with END (the stat was out first) or ERROR ECANCELED, never both and
 * nothing after; the connection lives on. */
static int case_cancel(void)
{
	const char *sock = it_path("shim.sock");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--workers", "2", NULL);
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	enum { N = 200, ROUNDS = 25 };
	uint32_t id = 1;
	unsigned ends = 0, cancels = 0;
	for (int r = 0; r < ROUNDS; r++, id += 2 * N) {
		send_stats(fd, id, N, "/", true);
		static int seen[N];
		memset(seen, 0, sizeof(seen));
		for (unsigned got = 0; got < N; got++) {
			struct frame_hdr h;
			uint8_t *p;
			CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF after %u of round %d", got, r);
			CHECKF(h.stream >= id && h.stream < id + 2 * N, "a %s frame for stream %u",
			       frame_type_name(h.type), h.stream);
			unsigned k = (h.stream - id) / 2;
			CHECKF(seen[k] == 0, "stream %u ended twice (a %s frame after the first)", h.stream,
			       frame_type_name(h.type));
			if (h.type == FRAME_END) {
				Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, p);
				CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_STAT);
				shim__v1__result__free_unpacked(res, NULL);
				ends++;
			} else {
				CHECKF(h.type == FRAME_ERROR, "a %s frame on stream %u", frame_type_name(h.type),
				       h.stream);
				char msg[256];
				CHECK_EQ(raw_error_code(p, h.len, msg, sizeof(msg)), ECANCELED);
				cancels++;
			}
			seen[k] = 1;
			free(p);
		}
	}
	printf("%u stats ended, %u cancelled\n", ends, cancels);
	/* nothing more came for any of them: the next frame is the PONG */
	expect_pong(fd);
	close(fd);
	it_daemon_stop(d);
	return 0;
}

/* Small writes whose REQUEST, DATA and FIN come in one read (one job each, the END from
 * the worker), 100 at once, 12 rounds, every other one with a CANCEL for each, right
 * after its FIN or once the first reply is in: each stream ends exactly once, with END
 * (bytes and size as sent, the file's bytes exact) or ERROR ECANCELED (the file then
 * absent, or whole: the commit came first), nothing after; no temp file is left, no
 * journal entry pending. */
static int case_writes(void)
{
	const char *sock = it_path("shim.sock");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--workers", "2", "--state-dir",
					      it_path("state"), NULL);
	int fd = raw_connect_unix(sock);
	raw_hello(fd, NULL);
	enum { N = 100, ROUNDS = 12 };
	uint8_t body[777];
	uint32_t id = 1;
	unsigned ends = 0, cancels = 0;
	for (int r = 0; r < ROUNDS; r++, id += 2 * N) {
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s/r%d", it_dir(), r);
		CHECK(mkdir(dir, 0755) == 0);
		it_fill(body, sizeof(body), (unsigned)r);
		size_t blen = sizeof(body) - (size_t)r;
		bool cancel = r % 2 == 1;
		/* the CANCELs with the writes (before their jobs start: all ECANCELED), or
		 * sent once the first reply is in (below: racing the jobs and their ENDs) */
		send_writes(fd, id, N, dir, body, blen, cancel && r % 4 == 1);
		static int seen[N];
		memset(seen, 0, sizeof(seen));
		for (unsigned got = 0; got < N; got++) {
			struct frame_hdr h;
			uint8_t *p;
			CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF after %u of round %d", got, r);
			if (got == 0 && cancel && r % 4 == 3) {
				/* every stream's CANCEL as the first reply is in: some ENDs have
				 * gone, jobs run, the CANCELs race them */
				uint8_t cb[N * FRAME_HDR_LEN];
				for (unsigned i = 0; i < N; i++) {
					struct frame_hdr hc = {.len = 0, .stream = id + 2 * i, .type = FRAME_CANCEL};
					frame_put_hdr(cb + FRAME_HDR_LEN * i, &hc);
				}
				raw_send_bytes(fd, cb, sizeof(cb));
			}
			CHECKF(h.stream >= id && h.stream < id + 2 * N && (h.stream - id) % 2 == 0,
			       "a %s frame for stream %u", frame_type_name(h.type), h.stream);
			unsigned k = (h.stream - id) / 2;
			CHECKF(seen[k] == 0, "stream %u ended twice (a %s frame after the first)", h.stream,
			       frame_type_name(h.type));
			seen[k] = 1;
			char path[PATH_MAX + 16];
			snprintf(path, sizeof(path), "%s/f%u", dir, k);
			size_t flen = 0;
			uint8_t *now = it_slurp(path, &flen);
			CHECKF(now != NULL || errno == ENOENT, "%s: %s", path, strerror(errno));
			if (h.type == FRAME_END) {
				Shim__V1__Result *res = shim__v1__result__unpack(NULL, h.len, p);
				CHECK(res != NULL && res->kind_case == SHIM__V1__RESULT__KIND_WRITE);
				CHECK_EQ(res->write->bytes, blen);
				CHECK(res->write->stat != NULL && res->write->stat->size == blen);
				shim__v1__result__free_unpacked(res, NULL);
				CHECKF(now != NULL && flen == blen && memcmp(now, body, blen) == 0,
				       "%s after its END: %zu bytes", path, flen);
				ends++;
			} else {
				CHECKF(h.type == FRAME_ERROR && cancel, "a %s frame on stream %u",
				       frame_type_name(h.type), h.stream);
				char msg[256];
				CHECK_EQ(raw_error_code(p, h.len, msg, sizeof(msg)), ECANCELED);
				CHECKF(now == NULL || (flen == blen && memcmp(now, body, blen) == 0),
				       "%s after ECANCELED: %zu bytes", path, flen);
				cancels++;
			}
			free(now);
			free(p);
		}
		/* a cancelled write's temp file goes after its stream (on a worker) */
		uint64_t deadline = it_now_ms() + 5000;
		while (strays(dir) != 0 || it_journal_pending(it_path("state/pending-writes")) > 0) {
			CHECKF(it_now_ms() < deadline, "round %d: %d stray names, %d journal entries", r, strays(dir),
			       it_journal_pending(it_path("state/pending-writes")));
			it_sleep_ms(5);
		}
	}
	printf("%u writes ended, %u cancelled\n", ends, cancels);
	expect_pong(fd);
	close(fd);
	it_daemon_stop(d);
	return 0;
}

/* --max-streams 1: a call sent the moment the last one's END arrives is in flight
 * alone, even when the worker sent that END and the loop has not yet seen the job end. */
static int case_limit(void)
{
	const char *sock = it_path("shim.sock");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--max-streams", "1", NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	const char *f = it_path("small");
	for (int i = 0; i < 5000; i++) {
		struct sbx_stat st = SBX_STAT_INIT;
		struct sbx_error err;
		int rc = sbx_stat(c, NULL, "/", 0, &st, &err);
		CHECKF(rc == 0, "stat %d: %s", i, it_errstr(&err));
		/* and a small write (its END from the worker too) */
		if (i % 5 == 0) {
			rc = sbx_write_file_buf(c, NULL, f, 0, SBX_MODE_KEEP, &i, sizeof(i), NULL, &err);
			CHECKF(rc == 0, "write %d: %s", i, it_errstr(&err));
		}
	}
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

/* 100 connections that each send 100 stats and close without reading: the shim lives
 * on, answers, and holds no more fds than before. */
static int case_vanish(void)
{
	const char *sock = it_path("shim.sock");
	struct it_daemon *d = it_daemon_start("shim", "--listen", it_unix_target(sock), "--workers", "4", NULL);
	struct sbx_client *c = it_connect(it_unix_target(sock), NULL);
	unsigned fds0 = it_count_fds(d->pid);
	for (int i = 0; i < 100; i++) {
		int fd = raw_connect_unix(sock);
		raw_hello(fd, NULL);
		send_stats(fd, 1, 100, "/", false);
		close(fd);
	}
	/* the daemon has seen every connection go when it counts only ours; fds0 may
	 * include an fd open for a moment just after the first call (CI's ASan run saw 14
	 * then, 13 for good), hence no more than before */
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		struct sbx_info in = SBX_INFO_INIT;
		struct sbx_error err;
		CHECK_SBX(sbx_info(c, NULL, &in, &err), &err);
		if (in.connections == 1 && in.streams == 1 && it_count_fds(d->pid) <= fds0)
			break;
		CHECKF(it_now_ms() < deadline, "%u connections, %u streams, %u fds (%u before)", in.connections,
		       in.streams, it_count_fds(d->pid), fds0);
		it_sleep_ms(10);
	}
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_error err;
	CHECK_SBX(sbx_stat(c, NULL, "/", 0, &st, &err), &err);
	CHECK(st.type == SBX_FT_DIRECTORY);
	sbx_client_close(c);
	it_daemon_stop(d);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct it_case cases[] = {
		{"partial", case_partial}, {"cancel", case_cancel}, {"writes", case_writes},
		{"limit", case_limit},     {"vanish", case_vanish},
	};
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
