/* rawclient.c: frames written and read by hand with proto/frame.h and the generated protobuf-c code. */
#include "rawclient.h"
#include "harness.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int raw_connect_unix(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	CHECK(strlen(path) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", path, strerror(errno));
	return fd;
}

bool raw_try_send(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len)
{
	uint8_t *buf = malloc(FRAME_HDR_LEN + len);
	CHECK(buf != NULL);
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(buf, &h);
	if (len > 0)
		memcpy(buf + FRAME_HDR_LEN, payload, len);
	size_t off = 0;
	while (off < FRAME_HDR_LEN + len) {
		ssize_t w = send(fd, buf + off, FRAME_HDR_LEN + len - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
			free(buf);
			return false;
		}
		CHECKF(w > 0, "send %s frame: %s", frame_type_name(type), strerror(errno));
		off += (size_t)w;
	}
	free(buf);
	return true;
}

void raw_send(int fd, uint32_t stream, uint8_t type, uint8_t flags, const void *payload, size_t len)
{
	CHECKF(raw_try_send(fd, stream, type, flags, payload, len), "send %s frame: %s", frame_type_name(type),
	       strerror(errno));
}

void raw_send_bytes(int fd, const void *buf, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t w = send(fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		CHECKF(w > 0, "send: %s", strerror(errno));
		off += (size_t)w;
	}
}

/* Read exactly len bytes; returns the count read before EOF. */
static size_t read_full(int fd, uint8_t *buf, size_t len, uint64_t deadline)
{
	size_t got = 0;
	while (got < len) {
		uint64_t now = it_now_ms();
		CHECKF(now < deadline, "timed out reading from the shim (%zu of %zu bytes)", got, len);
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int r = poll(&pf, 1, (int)(deadline - now));
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r >= 0);
		if (r == 0)
			continue;
		ssize_t n = read(fd, buf + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		CHECKF(n >= 0, "read: %s", strerror(errno));
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return got;
}

int raw_recv(int fd, struct frame_hdr *h, uint8_t **payload, unsigned timeout_ms)
{
	uint64_t deadline = it_now_ms() + timeout_ms;
	uint8_t hdr[FRAME_HDR_LEN];
	size_t n = read_full(fd, hdr, sizeof(hdr), deadline);
	if (n == 0)
		return 0;
	CHECKF(n == sizeof(hdr), "EOF inside a frame header");
	frame_get_hdr(hdr, h);
	CHECKF(h->len <= FRAME_ABS_MAX && h->type != 0 && h->reserved == 0, "bad frame header from the shim");
	*payload = malloc(h->len + 1u);
	CHECK(*payload != NULL);
	CHECKF(read_full(fd, *payload, h->len, deadline) == h->len, "EOF inside a %s frame", frame_type_name(h->type));
	return 1;
}

void raw_hello(int fd, const char *token)
{
	Shim__V1__Hello m = SHIM__V1__HELLO__INIT;
	m.protocol_version = SHIM_PROTOCOL_VERSION;
	m.client_name = (char *)"rawclient";
	if (token != NULL) {
		m.has_token = 1;
		m.token.data = (uint8_t *)(uintptr_t)token;
		m.token.len = strlen(token);
	}
	uint8_t buf[1024];
	size_t n = shim__v1__hello__get_packed_size(&m);
	CHECK(n <= sizeof(buf));
	shim__v1__hello__pack(&m, buf);
	raw_send(fd, 0, FRAME_HELLO, 0, buf, n);
	struct frame_hdr h;
	uint8_t *p;
	CHECKF(raw_recv(fd, &h, &p, 10000) == 1, "EOF instead of HELLO_OK");
	CHECKF(h.type == FRAME_HELLO_OK && h.stream == 0, "got %s on stream %u instead of HELLO_OK",
	       frame_type_name(h.type), h.stream);
	Shim__V1__HelloReply *r = shim__v1__hello_reply__unpack(NULL, h.len, p);
	CHECK(r != NULL);
	CHECK_EQ(r->protocol_version, 1);
	shim__v1__hello_reply__free_unpacked(r, NULL);
	free(p);
}

void raw_request_echo(int fd, uint32_t stream)
{
	Shim__V1__EchoRequest er = SHIM__V1__ECHO_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_ECHO;
	req.echo = &er;
	uint8_t buf[64];
	size_t n = shim__v1__request__get_packed_size(&req);
	CHECK(n <= sizeof(buf));
	shim__v1__request__pack(&req, buf);
	raw_send(fd, stream, FRAME_REQUEST, 0, buf, n);
}

int raw_error_code(const uint8_t *payload, size_t len, char *msg, size_t msg_size)
{
	Shim__V1__Error *e = shim__v1__error__unpack(NULL, len, payload);
	CHECKF(e != NULL, "undecodable ERROR payload");
	int code = e->errno_num;
	snprintf(msg, msg_size, "%s", e->message ? e->message : "");
	shim__v1__error__free_unpacked(e, NULL);
	return code;
}
