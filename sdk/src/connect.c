/* connect.c: a target to a connected client: the transport's fd, the client's set-up,
 * the HELLO handshake, retries while the shim starts; closing; what HELLO_OK said. */
#include "internal.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define IN_START (64u << 10)

/* ---- connecting ---- */

static int client_init(struct sbx_client *c, int fd, pid_t child, const struct sbx_connect_opts *o,
		       struct sbx_error *err)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	c->fd = fd;
	c->child = child;
	c->pump_fd = -1;
	c->next_id = 1;
	c->max_frame = FRAME_HELLO_MAX;
	c->my_window = FRAME_DEFAULT_WINDOW;
	c->default_timeout_ms = o->default_timeout_ms;
	c->trace = o->trace;
	c->trace_ud = o->trace_ud;
	c->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->in = malloc(IN_START);
	c->incap = IN_START;
	if (c->wakefd < 0 || c->in == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, c->wakefd < 0 ? errno : ENOMEM, NULL, "client set-up");
	return 0;
}

static void client_destroy(struct sbx_client *c)
{
	while (c->calls != NULL) {
		struct call *k = c->calls;
		c->calls = k->next;
		sbx__call_abandon_locked(k);
		sbx__rx_pipe_put(k->rx_pipe);
		free(k->result);
		free(k);
	}
	if (c->fd >= 0)
		close(c->fd);
	if (c->wakefd >= 0)
		close(c->wakefd);
	if (c->child > 0)
		sbx__transport_reap(c->child);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->wmu);
	pthread_cond_destroy(&c->cv);
	sbx__rx_free(c->part);
	sbx__rx_free(c->part_marker);
	sbx__rx_pipe_put(c->part_pipe);
	free(c->in);
	free(c->strings);
	free(c);
}

/* Keep HelloReply's strings in one block owned by the client. */
static int keep_info(struct sbx_client *c, const Shim__V1__HelloReply *r)
{
	size_t flen = 1;
	for (size_t i = 0; i < r->n_features; i++)
		flen += strlen(r->features[i]) + 1;
	const char *host = r->hostname ? r->hostname : "";
	const char *boot = r->boot_id ? r->boot_id : "";
	size_t total = strlen(r->shim_version) + 1 + flen + strlen(host) + 1 + strlen(boot) + 1;
	char *s = malloc(total);
	if (s == NULL)
		return -1;
	c->strings = s;
	c->info.shim_version = s;
	s = stpcpy(s, r->shim_version) + 1;
	c->info.features = s;
	*s = '\0';
	for (size_t i = 0; i < r->n_features; i++) {
		if (i > 0)
			s = stpcpy(s, " ");
		s = stpcpy(s, r->features[i]);
	}
	s++;
	c->info.hostname = s;
	s = stpcpy(s, host) + 1;
	c->info.boot_id = s;
	stpcpy(s, boot);
	c->info.protocol_version = r->protocol_version;
	c->info.max_frame = r->max_frame;
	c->info.pid = r->pid;
	c->info.pid1 = r->pid1;
	c->info.uid = r->uid;
	c->info.generation = r->generation;
	return 0;
}

/* A shim that refuses a connection (connection limit, peer uid) sends ERROR and
 * closes at once, possibly before our HELLO arrives: sending HELLO then fails with
 * EPIPE, but the ERROR saying why is already waiting to be read. If it is, put it in
 * err and return true. */
static bool refusal_pending(struct sbx_client *c, struct sbx_error *err)
{
	while (c->inlen < c->incap) {
		ssize_t r = read(c->fd, c->in + c->inlen, c->incap - c->inlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		c->inlen += (size_t)r;
	}
	struct frame_hdr fh;
	if (frame_check(c->in, c->inlen, FRAME_HELLO_MAX, &fh) != FRAME_OK || fh.type != FRAME_ERROR || fh.stream != 0)
		return false;
	sbx__trace_frame(c, "<", &fh, c->in + FRAME_HDR_LEN);
	sbx__decode_error(c->in + FRAME_HDR_LEN, fh.len, SBX_ERR_CONNECT, err);
	return true;
}

/* Send HELLO and read frames until HELLO_OK or ERROR. *retry: the peer went away
 * before answering (a shim still starting, or an exec: child that exited). */
static int handshake(struct sbx_client *c, const char *token, const char *name, uint64_t deadline, bool *retry,
		     struct sbx_error *err)
{
	Shim__V1__Hello h = SHIM__V1__HELLO__INIT;
	h.protocol_version = SBX_PROTOCOL_VERSION;
	h.client_name = (char *)(uintptr_t)name;
	if (token != NULL && token[0] != '\0') {
		h.has_token = 1;
		h.token.data = (uint8_t *)(uintptr_t)token;
		h.token.len = strlen(token);
	}
	h.has_max_frame = h.has_initial_window = 1;
	h.max_frame = FRAME_DEFAULT_MAX;
	h.initial_window = c->my_window;
	uint8_t buf[8192];
	size_t n = shim__v1__hello__get_packed_size(&h);
	if (n > sizeof(buf))
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "token too long");
	shim__v1__hello__pack(&h, buf);
	if (sbx__send(c, 0, FRAME_HELLO, 0, buf, n, deadline, err) < 0) {
		if (refusal_pending(c, err))
			return -1;
		*retry = true;
		err->kind = SBX_ERR_CONNECT;
		return -1;
	}
	for (;;) {
		struct frame_hdr fh;
		enum frame_status fs = frame_check(c->in, c->inlen, FRAME_HELLO_MAX, &fh);
		if (fs == FRAME_OK)
			break;
		if (fs != FRAME_NEED_MORE)
			return sbx__fail(err, SBX_ERR_CONNECT, EPROTO, NULL,
					 "the peer does not speak shim protocol v1 (bad frame header)");
		int ms = sbx__poll_ms(deadline);
		struct pollfd pf = {.fd = c->fd, .events = POLLIN};
		if (ms == 0 || poll(&pf, 1, ms) == 0)
			return sbx__fail(err, SBX_ERR_CONNECT, ETIMEDOUT, NULL, "timed out waiting for the handshake");
		ssize_t r = read(c->fd, c->in + c->inlen, c->incap - c->inlen);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0) {
			*retry = true;
			return sbx__fail(err, SBX_ERR_CONNECT, r == 0 ? ECONNRESET : errno, NULL,
					 "connection closed before the handshake completed");
		}
		c->inlen += (size_t)r;
	}
	struct frame_hdr fh;
	frame_get_hdr(c->in, &fh);
	const uint8_t *p = c->in + FRAME_HDR_LEN;
	sbx__trace_frame(c, "<", &fh, p);
	int rc = 0;
	if (fh.type == FRAME_ERROR) {
		sbx__decode_error(p, fh.len, SBX_ERR_CONNECT, err);
		rc = -1;
	} else if (fh.type != FRAME_HELLO_OK || fh.stream != 0) {
		rc = sbx__fail(err, SBX_ERR_CONNECT, EPROTO, NULL, "expected HELLO_OK, got %s",
			       frame_type_name(fh.type));
	} else {
		Shim__V1__HelloReply *r = shim__v1__hello_reply__unpack(NULL, fh.len, p);
		if (r == NULL) {
			rc = sbx__fail(err, SBX_ERR_CONNECT, EBADMSG, NULL, "cannot decode HelloReply");
		} else if (r->protocol_version != SBX_PROTOCOL_VERSION) {
			rc = sbx__fail(err, SBX_ERR_CONNECT, EPROTONOSUPPORT, NULL,
				       "the shim speaks protocol %u, this library %d", r->protocol_version,
				       SBX_PROTOCOL_VERSION);
		} else if (keep_info(c, r) < 0) {
			rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		} else {
			uint32_t mf = r->max_frame;
			c->max_frame = mf < FRAME_MIN_MAX ? FRAME_MIN_MAX : mf > FRAME_ABS_MAX ? FRAME_ABS_MAX : mf;
			c->peer_window = r->initial_window > INT32_MAX ? INT32_MAX : r->initial_window;
		}
		if (r != NULL)
			shim__v1__hello_reply__free_unpacked(r, NULL);
	}
	size_t used = FRAME_HDR_LEN + fh.len;
	memmove(c->in, c->in + used, c->inlen - used);
	c->inlen -= used;
	return rc;
}

/* A client on fd (and child), which it owns from here on, also on failure: set up,
 * then the handshake. */
static int client_start(int fd, pid_t child, const struct sbx_connect_opts *o, const char *token, uint64_t deadline,
			struct sbx_client **out, bool *retry, struct sbx_error *err)
{
	struct sbx_client *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		close(fd);
		sbx__transport_reap(child);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	c->wakefd = -1;
	if (client_init(c, fd, child, o, err) < 0) {
		client_destroy(c);
		return -1;
	}
	char name[64];
	snprintf(name, sizeof(name), "libsbx/%s", SBX_VERSION);
	if (handshake(c, token, o->client_name ? o->client_name : name, deadline, retry, err) < 0) {
		client_destroy(c);
		return -1;
	}
	*out = c;
	return 0;
}

static int connect_once(const char *target, const struct sbx_connect_opts *o, const char *token,
			struct sbx_client **out, bool *retry, struct sbx_error *err)
{
	int timeout = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000;
	uint64_t deadline = sbx__deadline_after(timeout);
	int fd;
	pid_t child = 0;
	*retry = false;
	if (sbx__transport_open(target, timeout, &fd, &child, retry, err) < 0)
		return -1;
	return client_start(fd, child, o, token, deadline, out, retry, err);
}

int sbx__client_adopt(int fd, const struct sbx_connect_opts *opts, struct sbx_client **out, struct sbx_error *err)
{
	/* opts is the caller's own: this library's struct, whole */
	int timeout = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 10000;
	bool retry = false;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return client_start(fd, 0, opts, opts->token, sbx__deadline_after(timeout), out, &retry, err);
}

SBX_API int sbx_connect(const char *target, const struct sbx_connect_opts *opts, struct sbx_client **out,
			struct sbx_error *err)
{
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	if (opts != NULL && sbx__struct_in(&o, sizeof(o), opts, "sbx_connect_opts", err) < 0)
		return -1;
	if (target == NULL)
		target = getenv("SBX_TARGET");
	if (target == NULL || target[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no target given and SBX_TARGET is not set");
	/* $SBX_TOKEN is for the shims one connects to; an exec: target's command is
	 * spawned by us and gets a token only when the caller gives one (issue 17.7) */
	const char *token = o.token != NULL ? o.token : strncmp(target, "exec:", 5) == 0 ? NULL : getenv("SBX_TOKEN");
	uint64_t wait_until_ns = o.wait_ms > 0 ? sbx__deadline_after(o.wait_ms) : 0;
	unsigned backoff_ms = 10;
	for (;;) {
		bool retry;
		struct sbx_error e;
		if (connect_once(target, &o, token, out, &retry, &e) == 0)
			return 0;
		uint64_t now = sbx__now_ns();
		if (!retry || now >= wait_until_ns) {
			sbx__copy_error(err, &e);
			return -1;
		}
		/* the last sleep is cut short so that one more attempt falls on the deadline */
		uint64_t left_ms = (wait_until_ns - now + 999999u) / 1000000u;
		unsigned ms = backoff_ms < left_ms ? backoff_ms : (unsigned)left_ms;
		struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
		nanosleep(&ts, NULL);
		backoff_ms = backoff_ms * 2 > 500 ? 500 : backoff_ms * 2;
	}
}

SBX_API void sbx_client_close(struct sbx_client *c)
{
	if (c == NULL)
		return;
	struct sbx_error e;
	sbx__fail(&e, SBX_ERR_LOCAL, ECONNABORTED, NULL, "client closed");
	pthread_mutex_lock(&c->mu);
	sbx__client_kill(c, &e);
	struct call *done_list = sbx__take_dead_async(c);
	pthread_mutex_unlock(&c->mu);
	sbx__run_done(done_list);
	/* wake a reader in poll; it finds the client dead and returns */
	uint64_t one = 1;
	ssize_t w = write(c->wakefd, &one, sizeof(one));
	(void)w;
	pthread_mutex_lock(&c->mu);
	while (c->reading)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	client_destroy(c);
}

SBX_API const struct sbx_server_info *sbx_client_server(const struct sbx_client *c)
{
	return &c->info;
}

SBX_API int sbx_client_has_feature(const struct sbx_client *c, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = c->info.features; p != NULL && *p != '\0';) {
		const char *sp = strchr(p, ' ');
		size_t len = sp ? (size_t)(sp - p) : strlen(p);
		if (len == n && memcmp(p, name, n) == 0)
			return 1;
		p = sp ? sp + 1 : NULL;
	}
	return 0;
}

SBX_API int sbx_client_fd(const struct sbx_client *c)
{
	return c->fd;
}
