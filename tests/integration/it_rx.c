/* it_rx.c: libsbx's receiving side against a scripted fake shim: DATA frames of every
 * size split at every kind of boundary, frames for calls given up on in the middle of
 * their payload, the connection lost or a bad frame after half a payload.
 *
 * The cases are data: rx_cases.txt (its header describes the format), shared with the
 * Python SDK's sdk/python/tests/test_rx_cases.py, so that both SDKs run the same ones.
 * Usage: it_rx --cases FILE [CASE] (the CMake test passes the file). */
#include "harness.h"
#include "rawclient.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

/* ---- the case file ---- */

#define MAX_TOKENS 24
#define MAX_CALLS 16
#define MAX_STEPS 32
#define MAX_LINES 128
#define MAX_CASES 32
#define MAX_BLOCKS 8
#define STR_MAX 128

struct tline {
	int lineno;
	int ntok;
	char *tok[MAX_TOKENS];
};

enum fop { F_DATA, F_FIN, F_END, F_ERROR, F_WINDOW, F_PING, F_RAW, F_ZEROS, F_AT_CANCEL, F_AT_EOF };

struct fline {
	enum fop op;
	int call;        /* the call it is for, or -1: the literal stream */
	uint32_t stream; /* when call < 0 */
	uint32_t n;      /* data/window/zeros N, raw LEN, at OFF, error errno */
	uint32_t raw_type, raw_flags, raw_reserved;
	char name[32], msg[STR_MAX], path[STR_MAX]; /* error */
	bool has_path;
	uint8_t hex[FRAME_PING_MAX];
	unsigned hexlen;
};

enum xwhat { EXP_NONE, EXP_OK, EXP_TIMEOUT, EXP_FAIL };

struct expect {
	enum xwhat what;
	int kind, code;
	uint64_t got;
	char path[STR_MAX], msg[STR_MAX];
	bool has_path, has_msg;
};

struct step {
	enum { S_READ, S_PING } kind;
	bool ping_fails;
	int call; /* S_READ */
	int timeout_ms;
	enum { CUT_NONE, CUT_EDGES, CUT_BYTES, CUT_RANDOM } cut;
	uint64_t cut_seed;
	bool nowait;
	struct fline *lines;
	unsigned nlines;
	struct expect expect;
};

struct rxcase {
	char name[32];
	char calls[MAX_CALLS][32];
	uint32_t seeds[MAX_CALLS];
	unsigned ncalls;
	struct step steps[MAX_STEPS];
	unsigned nsteps;
};

struct block {
	char name[32];
	unsigned first, n; /* lines of the file */
};

static struct {
	const char *path;
	char *text; /* the file, which the tokens point into */
	struct tline *lines;
	unsigned nlines;
	struct block blocks[MAX_BLOCKS];
	unsigned nblocks;
	struct rxcase cases[MAX_CASES];
	unsigned ncases;
} rx;

#define PARSE_CHECK(l, cond, ...)                                         \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "%s:%d: ", rx.path, (l)->lineno); \
			fprintf(stderr, __VA_ARGS__);                     \
			fputc('\n', stderr);                              \
			exit(2);                                          \
		}                                                         \
	} while (0)

static void tokenize(char *text)
{
	unsigned cap = 0;
	int lineno = 0;
	for (char *line = text; line != NULL;) {
		char *next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		lineno++;
		struct tline t = {.lineno = lineno};
		char *p = line;
		for (;;) {
			while (*p == ' ' || *p == '\t' || *p == '\r')
				p++;
			if (*p == '\0' || *p == '#')
				break;
			if (t.ntok == MAX_TOKENS) {
				fprintf(stderr, "%s:%d: too many tokens\n", rx.path, lineno);
				exit(2);
			}
			if (*p == '"') {
				char *end = strchr(p + 1, '"');
				if (end == NULL) {
					fprintf(stderr, "%s:%d: unterminated string\n", rx.path, lineno);
					exit(2);
				}
				*end = '\0';
				t.tok[t.ntok++] = p + 1;
				p = end + 1;
			} else {
				t.tok[t.ntok++] = p;
				while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\r' && *p != '#')
					p++;
				bool comment = *p == '#';
				if (*p != '\0')
					*p++ = '\0';
				if (comment)
					break;
			}
		}
		if (t.ntok > 0) {
			if (rx.nlines == cap) {
				cap = cap ? cap * 2 : 256;
				rx.lines = realloc(rx.lines, cap * sizeof(*rx.lines));
				if (rx.lines == NULL)
					exit(2);
			}
			rx.lines[rx.nlines++] = t;
		}
		line = next;
	}
}

static uint64_t num(const struct tline *l, const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	PARSE_CHECK(l, errno == 0 && end != s && *end == '\0', "'%s' is not a number", s);
	return v;
}

static int call_index(struct rxcase *c, const char *name)
{
	for (unsigned i = 0; i < c->ncalls; i++)
		if (strcmp(c->calls[i], name) == 0)
			return (int)i;
	return -1;
}

/* STREAM: a call's name or a number */
static void parse_stream(struct rxcase *c, const struct tline *l, const char *s, struct fline *f)
{
	if (s[0] >= '0' && s[0] <= '9') {
		f->call = -1;
		f->stream = (uint32_t)num(l, s);
	} else {
		f->call = call_index(c, s);
		PARSE_CHECK(l, f->call >= 0, "no call named '%s' in this case (yet)", s);
	}
}

static int kind_of(const struct tline *l, const char *s)
{
	static const char *const names[] = {"", "remote", "local", "connect", "protocol"};
	for (int i = 1; i < 5; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	PARSE_CHECK(l, false, "unknown error kind '%s'", s);
	return 0;
}

static int errno_of(const struct tline *l, const char *s)
{
	int e = sbx_errno_from_name(s);
	PARSE_CHECK(l, e > 0, "unknown errno name '%s'", s);
	return e;
}

static void parse_expect(const struct tline *l, struct expect *x)
{
	memset(x, 0, sizeof(*x));
	PARSE_CHECK(l, l->ntok >= 2, "expect what?");
	const char *w = l->tok[1];
	int i;
	if (strcmp(w, "ok") == 0) {
		x->what = EXP_OK;
		i = 2;
	} else if (strcmp(w, "timeout") == 0) {
		PARSE_CHECK(l, l->ntok >= 3, "expect timeout GOT");
		x->what = EXP_TIMEOUT;
		x->got = num(l, l->tok[2]);
		i = 3;
	} else if (strcmp(w, "fail") == 0) {
		PARSE_CHECK(l, l->ntok >= 5, "expect fail KIND ERRNO GOT");
		x->what = EXP_FAIL;
		x->kind = kind_of(l, l->tok[2]);
		x->code = errno_of(l, l->tok[3]);
		x->got = num(l, l->tok[4]);
		i = 5;
	} else {
		PARSE_CHECK(l, false, "unknown expectation '%s'", w);
		return;
	}
	for (; i < l->ntok; i += 2) {
		PARSE_CHECK(l, i + 1 < l->ntok, "'%s' without a value", l->tok[i]);
		if (strcmp(l->tok[i], "path") == 0) {
			x->has_path = true;
			snprintf(x->path, sizeof(x->path), "%s", l->tok[i + 1]);
		} else if (strcmp(l->tok[i], "message.c") == 0) {
			x->has_msg = true;
			snprintf(x->msg, sizeof(x->msg), "%s", l->tok[i + 1]);
		} else {
			PARSE_CHECK(l, strcmp(l->tok[i], "message.py") == 0, "unknown attribute '%s'", l->tok[i]);
		}
	}
}

static void add_fline(struct rxcase *c, struct step *s, const struct tline *l, int depth);

static void add_flines_of_block(struct rxcase *c, struct step *s, const struct tline *l, int depth)
{
	PARSE_CHECK(l, l->ntok == 2 && depth < 4, "use NAME");
	for (unsigned b = 0; b < rx.nblocks; b++) {
		if (strcmp(rx.blocks[b].name, l->tok[1]) != 0)
			continue;
		for (unsigned i = 0; i < rx.blocks[b].n; i++)
			add_fline(c, s, &rx.lines[rx.blocks[b].first + i], depth + 1);
		return;
	}
	PARSE_CHECK(l, false, "no frames named '%s'", l->tok[1]);
}

static void add_fline(struct rxcase *c, struct step *s, const struct tline *l, int depth)
{
	const char *w = l->tok[0];
	if (strcmp(w, "use") == 0) {
		add_flines_of_block(c, s, l, depth);
		return;
	}
	PARSE_CHECK(l, s->nlines < MAX_LINES, "too many frame lines");
	struct fline *f = &s->lines[s->nlines++];
	memset(f, 0, sizeof(*f));
	f->call = s->call;
	int i = 1; /* the first token after the fixed arguments */
	if (strcmp(w, "data") == 0 || strcmp(w, "window") == 0 || strcmp(w, "zeros") == 0) {
		PARSE_CHECK(l, l->ntok >= 2, "%s N", w);
		f->op = w[0] == 'd' ? F_DATA : w[0] == 'w' ? F_WINDOW : F_ZEROS;
		f->n = (uint32_t)num(l, l->tok[1]);
		i = 2;
	} else if (strcmp(w, "fin") == 0 || strcmp(w, "end") == 0) {
		f->op = w[0] == 'f' ? F_FIN : F_END;
	} else if (strcmp(w, "error") == 0) {
		PARSE_CHECK(l, l->ntok >= 4, "error ERRNO NAME MESSAGE");
		f->op = F_ERROR;
		f->n = (uint32_t)num(l, l->tok[1]);
		snprintf(f->name, sizeof(f->name), "%s", l->tok[2]);
		snprintf(f->msg, sizeof(f->msg), "%s", l->tok[3]);
		i = 4;
		if (i + 1 < l->ntok && strcmp(l->tok[i], "path") == 0) {
			f->has_path = true;
			snprintf(f->path, sizeof(f->path), "%s", l->tok[i + 1]);
			i += 2;
		}
	} else if (strcmp(w, "ping") == 0) {
		PARSE_CHECK(l, l->ntok == 2 && strlen(l->tok[1]) % 2 == 0 && strlen(l->tok[1]) / 2 <= FRAME_PING_MAX,
			    "ping HEX (at most 64 bytes)");
		f->op = F_PING;
		f->call = -1;
		f->hexlen = (unsigned)strlen(l->tok[1]) / 2;
		for (unsigned k = 0; k < f->hexlen; k++) {
			unsigned v;
			PARSE_CHECK(l, sscanf(l->tok[1] + 2 * k, "%2x", &v) == 1, "bad hex");
			f->hex[k] = (uint8_t)v;
		}
		return;
	} else if (strcmp(w, "raw") == 0) {
		PARSE_CHECK(l, l->ntok == 6, "raw LEN STREAM TYPE FLAGS RESERVED");
		f->op = F_RAW;
		f->n = (uint32_t)num(l, l->tok[1]);
		parse_stream(c, l, l->tok[2], f);
		f->raw_type = (uint32_t)num(l, l->tok[3]);
		f->raw_flags = (uint32_t)num(l, l->tok[4]);
		f->raw_reserved = (uint32_t)num(l, l->tok[5]);
		return;
	} else if (strcmp(w, "at") == 0) {
		PARSE_CHECK(l, l->ntok == 3, "at OFF cancel|eof");
		f->n = (uint32_t)num(l, l->tok[1]);
		PARSE_CHECK(l, strcmp(l->tok[2], "cancel") == 0 || strcmp(l->tok[2], "eof") == 0, "at OFF cancel|eof");
		f->op = l->tok[2][0] == 'c' ? F_AT_CANCEL : F_AT_EOF;
		return;
	} else {
		PARSE_CHECK(l, false, "unknown frame line '%s'", w);
	}
	if (i < l->ntok) {
		PARSE_CHECK(l, i + 2 == l->ntok && strcmp(l->tok[i], "on") == 0, "trailing tokens (on STREAM?)");
		parse_stream(c, l, l->tok[i + 1], f);
	}
}

static void load_cases(const char *path)
{
	rx.path = path;
	FILE *fp = fopen(path, "r");
	if (fp == NULL) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(2);
	}
	size_t cap = 1 << 16, len = 0;
	char *text = malloc(cap);
	for (;;) {
		if (len + 4096 > cap)
			text = realloc(text, cap *= 2);
		size_t n = fread(text + len, 1, cap - len - 1, fp);
		if (n == 0)
			break;
		len += n;
	}
	fclose(fp);
	text[len] = '\0';
	rx.text = text;
	tokenize(text); /* the tokens point into text, kept for good */

	struct rxcase *c = NULL;
	struct step *s = NULL; /* a read still taking frame lines */
	for (unsigned i = 0; i < rx.nlines; i++) {
		const struct tline *l = &rx.lines[i];
		const char *w = l->tok[0];
		if (strcmp(w, "frames") == 0) {
			PARSE_CHECK(l, l->ntok == 2 && rx.nblocks < MAX_BLOCKS && s == NULL, "frames NAME");
			struct block *b = &rx.blocks[rx.nblocks++];
			snprintf(b->name, sizeof(b->name), "%s", l->tok[1]);
			b->first = i + 1;
			while (++i < rx.nlines && strcmp(rx.lines[i].tok[0], "endframes") != 0)
				b->n++;
			PARSE_CHECK(l, i < rx.nlines, "frames without endframes");
			continue;
		}
		if (strcmp(w, "case") == 0) {
			PARSE_CHECK(l, l->ntok == 2 && rx.ncases < MAX_CASES && s == NULL, "case NAME");
			c = &rx.cases[rx.ncases++];
			snprintf(c->name, sizeof(c->name), "%s", l->tok[1]);
			continue;
		}
		PARSE_CHECK(l, c != NULL, "'%s' outside a case", w);
		if (strncmp(w, "expect", 6) == 0) {
			PARSE_CHECK(l, s != NULL, "expect without a read");
			if (strcmp(w, "expect") == 0) {
				if (s->expect.what == EXP_NONE)
					parse_expect(l, &s->expect);
			} else if (strcmp(w, "expect.c") == 0) {
				parse_expect(l, &s->expect);
			} else {
				PARSE_CHECK(l, strcmp(w, "expect.py") == 0, "unknown '%s'", w);
			}
			/* the read ends at the first expect line not followed by another */
			if (i + 1 >= rx.nlines || strncmp(rx.lines[i + 1].tok[0], "expect", 6) != 0) {
				PARSE_CHECK(l, s->expect.what != EXP_NONE, "no expectation for libsbx");
				s = NULL;
			}
			continue;
		}
		if (s != NULL) {
			add_fline(c, s, l, 0);
			continue;
		}
		PARSE_CHECK(l, c->nsteps < MAX_STEPS, "too many steps");
		if (strcmp(w, "read") == 0) {
			PARSE_CHECK(l, l->ntok >= 4 && strcmp(l->tok[2], "seed") == 0, "read CALL seed S ...");
			PARSE_CHECK(l, c->ncalls < MAX_CALLS && call_index(c, l->tok[1]) < 0, "call '%s' again",
				    l->tok[1]);
			s = &c->steps[c->nsteps++];
			memset(s, 0, sizeof(*s));
			s->kind = S_READ;
			s->call = (int)c->ncalls;
			snprintf(c->calls[c->ncalls], sizeof(c->calls[0]), "%s", l->tok[1]);
			c->seeds[c->ncalls++] = (uint32_t)num(l, l->tok[3]);
			s->lines = calloc(MAX_LINES, sizeof(*s->lines));
			for (int k = 4; k < l->ntok; k++) {
				if (strcmp(l->tok[k], "timeout") == 0 && k + 1 < l->ntok) {
					s->timeout_ms = (int)num(l, l->tok[++k]);
				} else if (strcmp(l->tok[k], "nowait") == 0) {
					s->nowait = true;
				} else if (strcmp(l->tok[k], "cut") == 0 && k + 1 < l->ntok) {
					const char *m = l->tok[++k];
					if (strcmp(m, "none") == 0) {
						s->cut = CUT_NONE;
					} else if (strcmp(m, "edges") == 0) {
						s->cut = CUT_EDGES;
					} else if (strcmp(m, "bytes") == 0) {
						s->cut = CUT_BYTES;
					} else {
						PARSE_CHECK(l, strcmp(m, "random") == 0 && k + 1 < l->ntok,
							    "cut none|edges|bytes|random SEED");
						s->cut = CUT_RANDOM;
						s->cut_seed = num(l, l->tok[++k]);
					}
				} else {
					PARSE_CHECK(l, false, "unknown read attribute '%s'", l->tok[k]);
				}
			}
		} else if (strcmp(w, "ping") == 0 || strcmp(w, "ping.c") == 0 || strcmp(w, "ping.py") == 0) {
			PARSE_CHECK(l, l->ntok == 1 || (l->ntok == 2 && strcmp(l->tok[1], "fails") == 0),
				    "ping [fails]");
			if (strcmp(w, "ping.py") == 0)
				continue; /* the Python SDK's step only */
			s = &c->steps[c->nsteps++];
			memset(s, 0, sizeof(*s));
			s->kind = S_PING;
			s->ping_fails = l->ntok == 2;
			s = NULL;
		} else {
			PARSE_CHECK(l, false, "unknown step '%s'", w);
		}
	}
	if (s != NULL) {
		fprintf(stderr, "%s: the last read has no expect line\n", path);
		exit(2);
	}
}

/* ---- the bytes of a call ---- */

static uint8_t pattern(uint32_t seed, uint64_t pos)
{
	uint64_t x = (pos % 65521u + (uint64_t)seed * 1000003u) * 0x9E3779B97F4A7C15u;
	return (uint8_t)('a' + (x >> 40) % 26);
}

/* ---- the fake shim: one connection, driven by the case on its own thread ---- */

struct fake {
	int lfd, fd;
	const struct rxcase *c;
	pthread_t thread;
	uint8_t in[1 << 16]; /* what the client sent, not yet parsed */
	size_t inlen;
	uint32_t window;              /* the client's Hello.initial_window */
	uint32_t requests[MAX_CALLS]; /* stream ids of the REQUESTs seen, in order */
	uint64_t credit[MAX_CALLS];   /* DATA the client has allowed on each */
	uint64_t sent[MAX_CALLS];     /* DATA sent on each */
	unsigned nreq;
	uint32_t cancels[64];
	unsigned ncancel;
	uint8_t ping[FRAME_PING_MAX]; /* the client's last PING not answered yet */
	uint32_t ping_len;
	bool ping_pending;
	uint8_t our_pings[16][FRAME_PING_MAX]; /* the PINGs we sent, and how many were answered */
	uint32_t our_ping_len[16];
	unsigned our_npings, our_npongs;
	uint64_t pos[MAX_CALLS]; /* the next byte of each call's data */
	bool gone;               /* the client hung up (a write failed) */
};

static int req_index(struct fake *f, uint32_t stream)
{
	for (unsigned i = 0; i < f->nreq; i++)
		if (f->requests[i] == stream)
			return (int)i;
	return -1;
}

/* Parse what the client sent; false on EOF. */
static bool fake_pump(struct fake *f, int timeout_ms)
{
	struct pollfd pf = {.fd = f->fd, .events = POLLIN};
	if (poll(&pf, 1, timeout_ms) <= 0)
		return true;
	ssize_t n = read(f->fd, f->in + f->inlen, sizeof(f->in) - f->inlen);
	if (n <= 0)
		return n < 0 && errno == EINTR;
	f->inlen += (size_t)n;
	size_t off = 0;
	for (;;) {
		struct frame_hdr h;
		enum frame_status fs = frame_check(f->in + off, f->inlen - off, sizeof(f->in) - FRAME_HDR_LEN, &h);
		if (fs == FRAME_NEED_MORE)
			break;
		CHECKF(fs == FRAME_OK, "bad frame from the client");
		const uint8_t *p = f->in + off + FRAME_HDR_LEN;
		if (h.type == FRAME_HELLO) {
			Shim__V1__Hello *hello = shim__v1__hello__unpack(NULL, h.len, p);
			CHECKF(hello != NULL, "bad HELLO from the client");
			f->window = hello->has_initial_window ? hello->initial_window : FRAME_DEFAULT_WINDOW;
			shim__v1__hello__free_unpacked(hello, NULL);
			Shim__V1__HelloReply r = SHIM__V1__HELLO_REPLY__INIT;
			r.protocol_version = SHIM_PROTOCOL_VERSION;
			r.shim_version = (char *)"fake";
			r.max_frame = FRAME_DEFAULT_MAX;
			r.pid = (uint32_t)getpid();
			r.initial_window = FRAME_DEFAULT_WINDOW;
			uint8_t buf[256];
			size_t len = shim__v1__hello_reply__get_packed_size(&r);
			CHECK(len <= sizeof(buf));
			shim__v1__hello_reply__pack(&r, buf);
			raw_send(f->fd, 0, FRAME_HELLO_OK, 0, buf, len);
		} else if (h.type == FRAME_REQUEST) {
			CHECK(f->nreq < MAX_CALLS);
			CHECKF(f->nreq == 0 || h.stream > f->requests[f->nreq - 1], "stream ids not increasing");
			f->requests[f->nreq] = h.stream;
			f->credit[f->nreq] = f->window;
			f->nreq++;
		} else if (h.type == FRAME_WINDOW) {
			int i = req_index(f, h.stream);
			CHECKF(h.len == 4, "WINDOW of %u bytes from the client", h.len);
			if (i >= 0)
				f->credit[i] += frame_get_u32(p);
		} else if (h.type == FRAME_CANCEL) {
			CHECK(f->ncancel < 64);
			f->cancels[f->ncancel++] = h.stream;
		} else if (h.type == FRAME_PING) {
			memcpy(f->ping, p, h.len);
			f->ping_len = h.len;
			f->ping_pending = true;
		} else if (h.type == FRAME_PONG) {
			CHECKF(f->our_npongs < f->our_npings, "a PONG for no PING");
			unsigned k = f->our_npongs++;
			CHECKF(h.len == f->our_ping_len[k] && memcmp(p, f->our_pings[k], h.len) == 0,
			       "the PONG does not carry the PING's payload");
		}
		off += FRAME_HDR_LEN + h.len;
	}
	memmove(f->in, f->in + off, f->inlen - off);
	f->inlen -= off;
	return true;
}

static void fake_wait_request(struct fake *f, unsigned n)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (f->nreq < n) {
		CHECKF(it_now_ms() < deadline, "no REQUEST from the client");
		CHECKF(fake_pump(f, 10), "the client hung up before its REQUEST");
	}
}

static void fake_wait_cancel(struct fake *f, uint32_t stream)
{
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		for (unsigned i = 0; i < f->ncancel; i++)
			if (f->cancels[i] == stream)
				return;
		CHECKF(it_now_ms() < deadline, "no CANCEL for stream %u", stream);
		CHECKF(fake_pump(f, 10), "the client hung up before its CANCEL");
	}
}

static void fake_answer_ping(struct fake *f)
{
	uint64_t deadline = it_now_ms() + 10000;
	while (!f->ping_pending) {
		CHECKF(it_now_ms() < deadline, "no PING from the client");
		CHECKF(fake_pump(f, 10), "the client hung up before its PING");
	}
	/* the PONGs for our PINGs came before it, on the same byte stream */
	CHECKF(f->our_npongs == f->our_npings, "%u of our %u PINGs answered", f->our_npongs, f->our_npings);
	f->ping_pending = false;
	raw_send(f->fd, 0, FRAME_PONG, 0, f->ping, f->ping_len);
}

/* false once the client has hung up */
static bool write_all(struct fake *f, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t w = send(f->fd, p, len, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
			f->gone = true;
			return false;
		}
		CHECKF(w > 0, "send: %s", strerror(errno));
		p += w;
		len -= (size_t)w;
	}
	return true;
}

/* Until the client has read every byte sent (the socket's send queue is empty). */
static void fake_wait_drained(struct fake *f)
{
	uint64_t deadline = it_now_ms() + 10000;
	for (;;) {
		int q = 0;
		CHECK(ioctl(f->fd, SIOCOUTQ, &q) == 0);
		if (q == 0)
			return;
		CHECKF(it_now_ms() < deadline, "the client stopped reading (%d bytes queued)", q);
		fake_pump(f, 0);
		usleep(20);
	}
}

/* ---- the frames of a read, built from its lines ---- */

#define MAX_FRAMES 256

struct wire {
	uint8_t *p;
	size_t len, cap;
	size_t starts[MAX_FRAMES]; /* where each frame begins */
	int fcall[MAX_FRAMES];     /* a DATA frame's call (for the credit), else -1 */
	uint32_t fdata[MAX_FRAMES];
	unsigned nframes;
	struct {
		size_t pos;
		enum fop op;
	} marks[8];
	unsigned nmarks, unresolved; /* marks waiting for the next frame */
	uint32_t unresolved_off[8];
};

static void wire_bytes(struct wire *w, const uint8_t *p, size_t len)
{
	if (w->len + len > w->cap) {
		w->cap = (w->len + len) * 2;
		w->p = realloc(w->p, w->cap);
		CHECK(w->p != NULL);
	}
	if (p != NULL)
		memcpy(w->p + w->len, p, len);
	else
		memset(w->p + w->len, 0, len);
	w->len += len;
}

static void wire_frame_start(struct wire *w, int call, uint32_t data)
{
	CHECK(w->nframes < MAX_FRAMES);
	w->starts[w->nframes] = w->len;
	w->fcall[w->nframes] = call;
	w->fdata[w->nframes] = data;
	w->nframes++;
	for (unsigned i = 0; i < w->unresolved; i++)
		w->marks[w->nmarks - w->unresolved + i].pos = w->len + w->unresolved_off[i];
	w->unresolved = 0;
}

static void wire_put(struct wire *w, uint32_t stream, uint8_t type, uint8_t flags, const uint8_t *payload, size_t len)
{
	uint8_t hdr[FRAME_HDR_LEN];
	struct frame_hdr h = {.len = (uint32_t)len, .stream = stream, .type = type, .flags = flags};
	frame_put_hdr(hdr, &h);
	wire_bytes(w, hdr, sizeof(hdr));
	if (len > 0)
		wire_bytes(w, payload, len);
}

static uint32_t stream_of(struct fake *f, const struct fline *l)
{
	if (l->call < 0)
		return l->stream;
	CHECKF((unsigned)l->call < f->nreq, "a frame for call %s before its REQUEST", f->c->calls[l->call]);
	return f->requests[l->call];
}

static void build_wire(struct fake *f, const struct step *s, struct wire *w)
{
	memset(w, 0, sizeof(*w));
	for (unsigned i = 0; i < s->nlines; i++) {
		const struct fline *l = &s->lines[i];
		switch (l->op) {
		case F_DATA: {
			uint32_t stream = stream_of(f, l);
			uint8_t *buf = malloc(l->n + 1u);
			CHECK(buf != NULL);
			uint32_t seed = l->call >= 0 ? f->c->seeds[l->call] : 999;
			uint64_t *pos = l->call >= 0 ? &f->pos[l->call] : &(uint64_t){0};
			for (uint32_t k = 0; k < l->n; k++)
				buf[k] = pattern(seed, *pos + k);
			*pos += l->n;
			wire_frame_start(w, l->call, l->n);
			wire_put(w, stream, FRAME_DATA, 0, buf, l->n);
			free(buf);
			break;
		}
		case F_FIN:
			wire_frame_start(w, -1, 0);
			wire_put(w, stream_of(f, l), FRAME_DATA, FRAME_FLAG_FIN, NULL, 0);
			break;
		case F_END: {
			Shim__V1__ReadReply rr = SHIM__V1__READ_REPLY__INIT;
			rr.bytes = l->call >= 0 ? f->pos[l->call] : 0;
			Shim__V1__Result r = SHIM__V1__RESULT__INIT;
			r.kind_case = SHIM__V1__RESULT__KIND_READ;
			r.read = &rr;
			uint8_t buf[64];
			size_t n = shim__v1__result__get_packed_size(&r);
			CHECK(n <= sizeof(buf));
			shim__v1__result__pack(&r, buf);
			wire_frame_start(w, -1, 0);
			wire_put(w, stream_of(f, l), FRAME_END, 0, buf, n);
			break;
		}
		case F_ERROR: {
			Shim__V1__Error e = SHIM__V1__ERROR__INIT;
			e.errno_num = (int32_t)l->n;
			e.errno_name = (char *)l->name;
			e.message = (char *)l->msg;
			if (l->has_path) {
				e.has_path = 1;
				e.path.data = (uint8_t *)l->path;
				e.path.len = strlen(l->path);
			}
			uint8_t buf[512];
			size_t n = shim__v1__error__get_packed_size(&e);
			CHECK(n <= sizeof(buf));
			shim__v1__error__pack(&e, buf);
			wire_frame_start(w, -1, 0);
			wire_put(w, stream_of(f, l), FRAME_ERROR, 0, buf, n);
			break;
		}
		case F_WINDOW: {
			uint8_t b[4] = {(uint8_t)(l->n >> 24), (uint8_t)(l->n >> 16), (uint8_t)(l->n >> 8),
					(uint8_t)l->n};
			wire_frame_start(w, -1, 0);
			wire_put(w, stream_of(f, l), FRAME_WINDOW, 0, b, 4);
			break;
		}
		case F_PING:
			CHECK(f->our_npings < 16);
			memcpy(f->our_pings[f->our_npings], l->hex, l->hexlen);
			f->our_ping_len[f->our_npings++] = l->hexlen;
			wire_frame_start(w, -1, 0);
			wire_put(w, 0, FRAME_PING, 0, l->hex, l->hexlen);
			break;
		case F_RAW: {
			uint8_t hdr[FRAME_HDR_LEN];
			struct frame_hdr h = {.len = l->n,
					      .stream = stream_of(f, l),
					      .type = (uint8_t)l->raw_type,
					      .flags = (uint8_t)l->raw_flags,
					      .reserved = (uint16_t)l->raw_reserved};
			frame_put_hdr(hdr, &h);
			wire_frame_start(w, -1, 0);
			wire_bytes(w, hdr, sizeof(hdr));
			break;
		}
		case F_ZEROS:
			wire_bytes(w, NULL, l->n);
			break;
		case F_AT_CANCEL:
		case F_AT_EOF:
			CHECK(w->nmarks < 8);
			w->marks[w->nmarks].op = l->op;
			w->marks[w->nmarks].pos = SIZE_MAX;
			w->nmarks++;
			w->unresolved_off[w->unresolved++] = l->n;
			break;
		}
	}
	for (unsigned i = 0; i < w->unresolved; i++)
		w->marks[w->nmarks - w->unresolved + i].pos = w->len;
	w->unresolved = 0;
}

/* Cuts around each frame's edges; with every_byte, at every byte near them. */
static size_t cuts_edges(const struct wire *w, size_t *cuts, size_t max, bool every_byte)
{
	size_t n = 0;
	for (unsigned i = 0; i < w->nframes; i++) {
		size_t f = w->starts[i], end = i + 1 < w->nframes ? w->starts[i + 1] : w->len;
		size_t len = end - f - FRAME_HDR_LEN;
		size_t c[] = {f + 1,    f + 5,    f + 11,   f + 12, f + 13, f + 12 + len / 2,
			      end - 13, end - 12, end - 11, end - 1};
		if (every_byte) {
			for (size_t b = f + 1; b < f + 24 && b < end && n < max; b++)
				cuts[n++] = b;
			for (size_t b = end > 24 ? end - 24 : 0; b < end && n < max; b++)
				if (b > f + 24)
					cuts[n++] = b;
		} else {
			for (size_t j = 0; j < sizeof(c) / sizeof(c[0]) && n < max; j++)
				if (c[j] > f && c[j] < end && (n == 0 || c[j] > cuts[n - 1]))
					cuts[n++] = c[j];
		}
	}
	return n;
}

static size_t cuts_of(const struct step *s, const struct wire *w, size_t *cuts, size_t max)
{
	if (s->cut == CUT_EDGES || s->cut == CUT_BYTES)
		return cuts_edges(w, cuts, max, s->cut == CUT_BYTES);
	size_t n = 0;
	if (s->cut == CUT_RANDOM) {
		uint64_t x = s->cut_seed;
		for (size_t at = 0; at < w->len && n < 2000 && n < max; n++) {
			x = x * 6364136223846793005u + 1442695040888963407u;
			at += 1 + (x >> 33) % 150000;
			cuts[n] = at;
		}
	}
	return n;
}

/* Send the read's frames as the step says; false once the fake has hung up. */
static bool fake_send_step(struct fake *f, const struct step *s)
{
	static size_t cuts[20000];
	struct wire w;
	build_wire(f, s, &w);
	size_t ncuts = cuts_of(s, &w, cuts, sizeof(cuts) / sizeof(cuts[0]));
	size_t at = 0, ci = 0;
	unsigned mi = 0, fi = 0;
	bool alive = true;
	while (alive && (at < w.len || mi < w.nmarks)) {
		/* the next stop: a cut, a mark or the end */
		size_t end = w.len;
		while (ci < ncuts && cuts[ci] <= at)
			ci++;
		if (ci < ncuts && cuts[ci] < end)
			end = cuts[ci];
		bool mark = mi < w.nmarks && w.marks[mi].pos <= end;
		if (mark)
			end = w.marks[mi].pos;
		/* the credit for every DATA frame begun in this piece */
		for (; fi < w.nframes && w.starts[fi] < end; fi++) {
			int k = w.fcall[fi];
			if (k < 0 || w.fdata[fi] == 0)
				continue;
			uint64_t deadline = it_now_ms() + 10000;
			while (f->sent[k] + w.fdata[fi] > f->credit[k]) {
				CHECKF(it_now_ms() < deadline, "no credit from the client for %u bytes on stream %u",
				       w.fdata[fi], f->requests[k]);
				CHECKF(fake_pump(f, 10), "the client hung up");
			}
			f->sent[k] += w.fdata[fi];
		}
		if (end > at) {
			alive = write_all(f, w.p + at, end - at);
			at = end;
			if (alive && !s->nowait && s->cut != CUT_NONE)
				fake_wait_drained(f);
		}
		if (alive && mark) {
			fake_wait_drained(f);
			if (w.marks[mi].op == F_AT_CANCEL) {
				fake_wait_cancel(f, f->requests[s->call]);
			} else {
				alive = false;
			}
			mi++;
		}
	}
	free(w.p);
	return alive && !f->gone;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	CHECK(f->fd >= 0);
	const struct rxcase *c = f->c;
	unsigned nreads = 0;
	bool alive = true;
	for (unsigned i = 0; alive && i < c->nsteps; i++) {
		const struct step *s = &c->steps[i];
		if (s->kind == S_READ) {
			fake_wait_request(f, ++nreads);
			/* the read's WINDOW follows its REQUEST: take what is there */
			fake_pump(f, 0);
			alive = fake_send_step(f, s);
		} else if (!s->ping_fails) {
			fake_answer_ping(f);
		}
	}
	if (alive) {
		/* until the client closes */
		while (fake_pump(f, 1000)) {
		}
	}
	close(f->fd);
	return NULL;
}

static const char *fake_start(struct fake *f, const struct rxcase *c)
{
	const char *path = it_path("fake.sock");
	unlink(path);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	memset(f, 0, sizeof(*f));
	f->c = c;
	f->window = FRAME_DEFAULT_WINDOW;
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(f->lfd >= 0);
	CHECK(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(f->lfd, 1) == 0);
	CHECK(pthread_create(&f->thread, NULL, fake_main, f) == 0);
	return it_unix_target(path);
}

static void fake_join(struct fake *f)
{
	CHECK(pthread_join(f->thread, NULL) == 0);
	close(f->lfd);
}

/* ---- the client's side ---- */

struct sink {
	uint8_t *p;
	size_t len, cap;
};

static int sink_put(void *ud, const void *buf, size_t len)
{
	struct sink *s = ud;
	if (s->len + len > s->cap) {
		s->cap = (s->len + len) * 2;
		s->p = realloc(s->p, s->cap);
		if (s->p == NULL)
			return ENOMEM;
	}
	memcpy(s->p + s->len, buf, len);
	s->len += len;
	return 0;
}

struct tracer {
	pthread_mutex_t mu;
	unsigned data_mine, data_other, bad;
	uint32_t stream;
	uint32_t seed;
	uint64_t pos; /* of the next DATA on stream */
};

/* Every DATA frame received shows up in the trace, with its first bytes. */
static void trace_line(void *ud, const char *line)
{
	struct tracer *t = ud;
	unsigned stream, len;
	if (sscanf(line, "< DATA stream=%u len=%u", &stream, &len) != 2)
		return;
	pthread_mutex_lock(&t->mu);
	if (stream != t->stream) {
		t->data_other++;
	} else {
		t->data_mine++;
		if (len > 0) {
			char want[16];
			size_t n = len < 8 ? len : 8;
			for (size_t i = 0; i < n; i++)
				want[i] = (char)pattern(t->seed, t->pos + i);
			want[n] = '\0';
			const char *q = strchr(line, '"');
			if (q == NULL || strncmp(q + 1, want, n) != 0)
				t->bad++;
			t->pos += len;
		}
	}
	pthread_mutex_unlock(&t->mu);
}

static int run_rx_case(unsigned idx)
{
	const struct rxcase *rc = &rx.cases[idx];
	struct fake f;
	const char *target = fake_start(&f, rc);
	struct tracer t = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct sbx_connect_opts o = SBX_CONNECT_OPTS_INIT;
	o.connect_timeout_ms = 10000;
	o.default_timeout_ms = 30000;
	o.trace = trace_line;
	o.trace_ud = &t;
	struct sbx_client *c;
	struct sbx_error err;
	CHECK_SBX(sbx_connect(target, &o, &c, &err), &err);
	for (unsigned i = 0; i < rc->nsteps; i++) {
		const struct step *s = &rc->steps[i];
		if (s->kind == S_PING) {
			memset(&err, 0, sizeof(err));
			if (s->ping_fails)
				CHECKF(sbx_ping(c, NULL, NULL, &err) < 0, "step %u: the ping went through", i + 1);
			else
				CHECK_SBX(sbx_ping(c, NULL, NULL, &err), &err);
			continue;
		}
		const struct expect *x = &s->expect;
		uint32_t seed = rc->seeds[s->call];
		/* what the fake sends for this call, and for others meanwhile */
		uint64_t total = 0;
		unsigned mine = 0, other = 0;
		for (unsigned k = 0; k < s->nlines; k++) {
			const struct fline *l = &s->lines[k];
			if (l->op != F_DATA && l->op != F_FIN)
				continue;
			if (l->call == s->call) {
				mine++;
				if (l->op == F_DATA)
					total += l->n;
			} else {
				other++;
			}
		}
		pthread_mutex_lock(&t.mu);
		t.stream = 1 + 2 * (uint32_t)s->call; /* the ids the client gives its streams */
		t.seed = seed;
		t.pos = 0;
		t.data_mine = t.data_other = 0;
		pthread_mutex_unlock(&t.mu);
		char path[64];
		snprintf(path, sizeof(path), "/%s", rc->calls[s->call]);
		struct sink sk = {0};
		uint64_t bytes = 0;
		struct sbx_call_opts opts = {.struct_size = sizeof(struct sbx_call_opts), .timeout_ms = s->timeout_ms};
		uint64_t t0 = it_now_ms();
		memset(&err, 0, sizeof(err));
		int r = sbx_read_file(c, &opts, path, 0, SBX_TO_END, sink_put, &sk, &bytes, &err);
		printf("%s: read %s: %zu bytes in %llu ms: %s\n", rc->name, path, sk.len,
		       (unsigned long long)(it_now_ms() - t0), r == 0 ? "ok" : it_errstr(&err));
		if (x->what == EXP_OK) {
			CHECK_SBX(r, &err);
			CHECK_EQ(sk.len, total);
			CHECK_EQ(bytes, total);
			pthread_mutex_lock(&t.mu);
			CHECK_EQ(t.data_mine, mine);
			CHECK_EQ(t.data_other, other);
			pthread_mutex_unlock(&t.mu);
		} else {
			CHECKF(r < 0, "%s: the read succeeded", path);
			if (x->what == EXP_TIMEOUT)
				CHECK_ERR(&err, SBX_ERR_LOCAL, ETIMEDOUT);
			else
				CHECK_ERR(&err, x->kind, x->code);
			CHECK_EQ(sk.len, x->got);
			if (x->has_path)
				CHECKF(strcmp(err.path, x->path) == 0, "error path '%s', want '%s'", err.path, x->path);
			if (x->has_msg)
				CHECK_CONTAINS(err.message, x->msg);
		}
		for (size_t k = 0; k < sk.len; k++)
			CHECKF(sk.p[k] == pattern(seed, k), "%s: byte %zu is wrong", path, k);
		free(sk.p);
		pthread_mutex_lock(&t.mu);
		CHECK_EQ(t.bad, 0);
		pthread_mutex_unlock(&t.mu);
		CHECK_EQ(sbx_client_pending(c), 0);
	}
	sbx_client_close(c);
	fake_join(&f);
	return 0;
}

/* it_main() runs the cases of a table in order, each through a function without
 * arguments: the table holds the cases to run, order[] their index in the file. */
static unsigned order[MAX_CASES], next_slot;

static int run_next(void)
{
	return run_rx_case(order[next_slot++]);
}

int main(int argc, char **argv)
{
	const char *file = getenv("SBX_RX_CASES");
	if (argc >= 3 && strcmp(argv[1], "--cases") == 0) {
		file = argv[2];
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	if (file == NULL) {
		fprintf(stderr, "usage: it_rx --cases FILE [CASE] (or $SBX_RX_CASES)\n");
		return 2;
	}
	load_cases(file);
	static struct it_case cases[MAX_CASES];
	size_t n = 0;
	for (unsigned i = 0; i < rx.ncases; i++) {
		if (argc == 2 && strcmp(argv[1], rx.cases[i].name) != 0)
			continue;
		order[n] = i;
		cases[n].name = rx.cases[i].name;
		cases[n].run = run_next;
		n++;
	}
	if (n == 0) {
		/* it_main() says which cases there are */
		for (unsigned i = 0; i < rx.ncases; i++) {
			cases[i].name = rx.cases[i].name;
			cases[i].run = run_next;
		}
		n = rx.ncases;
	}
	return it_main(argc, argv, cases, n);
}
