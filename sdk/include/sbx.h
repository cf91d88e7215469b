/* sbx.h: the host SDK for sandbox-shim (shim protocol v1). The only public header.
 *
 * Conventions
 * - Every call returns 0 on success and -1 on failure, filling the caller's
 *   struct sbx_error (which may be NULL) and leaving it untouched on success.
 * - Error codes are Linux errno values (ENOENT is 2 on every host), named by
 *   sbx_errno_name() from a fixed table.
 * - A client is thread-safe: any number of threads may run calls on one client at
 *   once; each call is its own stream. Blocking calls run on the caller's thread
 *   (no thread is created per client). A call's timeout and cancel token come in
 *   struct sbx_call_opts; a cancelled call returns -1 with code ECANCELED.
 * - A client can also be driven from the caller's event loop: watch sbx_client_fd()
 *   for readability and call sbx_client_process(); *_async calls report through
 *   callbacks invoked from sbx_client_process().
 */
#ifndef SBX_H
#define SBX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SBX_BUILDING)
#define SBX_API __attribute__((visibility("default")))
#else
#define SBX_API
#endif

#define SBX_VERSION_MAJOR 0
#define SBX_VERSION_MINOR 1
#define SBX_VERSION_PATCH 0
#define SBX_VERSION "0.1.0"
#define SBX_VERSION_NUM ((SBX_VERSION_MAJOR << 16) | (SBX_VERSION_MINOR << 8) | SBX_VERSION_PATCH)
#define SBX_PROTOCOL_VERSION 1

/* The library's version at run time ("0.1.0") and as SBX_VERSION_NUM. */
SBX_API const char *sbx_version(void);
SBX_API unsigned sbx_version_num(void);

/* ---- errors ---- */

enum sbx_error_kind {
	SBX_ERR_NONE = 0,
	SBX_ERR_REMOTE = 1,   /* the operation failed in the shim (code is the shim's errno) */
	SBX_ERR_LOCAL = 2,    /* failed on this side: bad argument, timeout, cancel, local I/O */
	SBX_ERR_CONNECT = 3,  /* could not connect, or the handshake was refused */
	SBX_ERR_PROTOCOL = 4, /* the peer broke the protocol; the client is no longer usable */
};

struct sbx_error {
	int kind;          /* enum sbx_error_kind */
	int code;          /* Linux errno value */
	char message[256]; /* human-readable text, NUL-terminated */
	char path[1024];   /* path or argument concerned ("" if none), NUL-terminated */
};

/* "ENOENT" for 2; NULL for a value Linux does not define. */
SBX_API const char *sbx_errno_name(int code);
/* 2 for "ENOENT"; -1 for an unknown name. */
SBX_API int sbx_errno_from_name(const char *name);
/* Linux's text for a code ("No such file or directory"); "Unknown error" if unknown. */
SBX_API const char *sbx_strerror(int code);
/* One line for an error: "ENOENT: /nope: No such file or directory". Returns buf. */
SBX_API char *sbx_error_format(const struct sbx_error *err, char *buf, size_t size);

/* ---- cancellation ---- */

/* A cancel token: fire it from any thread to cancel the call it was passed to.
 * A fired token stays fired until sbx_cancel_reset(). */
struct sbx_cancel;
SBX_API struct sbx_cancel *sbx_cancel_new(void);
SBX_API void sbx_cancel_fire(struct sbx_cancel *tok);
SBX_API void sbx_cancel_reset(struct sbx_cancel *tok);
SBX_API int sbx_cancel_fired(const struct sbx_cancel *tok);
SBX_API void sbx_cancel_free(struct sbx_cancel *tok);

/* Per-call options; NULL means "the client's default timeout, no cancel token". */
struct sbx_call_opts {
	int timeout_ms;            /* 0: the client's default; -1: no timeout */
	struct sbx_cancel *cancel; /* may be NULL */
};

/* ---- connecting ---- */

/* Called with one line per frame sent ("> ") or received ("< "), decoded. */
typedef void (*sbx_trace_fn)(void *ud, const char *line);

struct sbx_connect_opts {
	unsigned struct_size;    /* sizeof(struct sbx_connect_opts): set by SBX_CONNECT_OPTS_INIT */
	const char *token;       /* NULL: $SBX_TOKEN, if set */
	const char *client_name; /* for the shim's logs; NULL: "libsbx/VERSION" */
	int connect_timeout_ms;  /* one connect + handshake attempt; 0: 10000 */
	int wait_ms;             /* keep retrying with backoff for this long while the shim is
	                            not there yet (refused, missing socket, child exited); 0: once */
	int default_timeout_ms;  /* calls' timeout when sbx_call_opts says 0; 0: none */
	sbx_trace_fn trace;      /* NULL: no tracing */
	void *trace_ud;
};
/* (clang-format 14 would lay out a macro body that starts with { as a block) */
/* clang-format off */
#define SBX_CONNECT_OPTS_INIT {sizeof(struct sbx_connect_opts), 0, 0, 0, 0, 0, 0, 0}
/* clang-format on */

struct sbx_client;

/* Connect to target and complete the handshake. target (NULL: $SBX_TARGET) is one of
 *   unix:PATH            a unix stream socket
 *   tcp:HOST:PORT        TCP; HOST may be [v6addr]; needs a token
 *   vsock:CID:PORT       AF_VSOCK
 *   fc:UDS_PATH:PORT     Firecracker hybrid vsock ("CONNECT PORT\n", then "OK n\n")
 *   exec:COMMAND...      run COMMAND with /bin/sh -c; talk over its stdin/stdout;
 *                        it is reaped by sbx_client_close()
 * On success *out owns the connection; free it with sbx_client_close(). */
SBX_API int sbx_connect(const char *target, const struct sbx_connect_opts *opts, struct sbx_client **out,
			struct sbx_error *err);

/* Close the connection; in-flight calls on other threads fail with ECONNABORTED.
 * No call may be running on the client once this returns; it must not be used after. */
SBX_API void sbx_client_close(struct sbx_client *c);

/* What the shim said about itself in the handshake. Strings live as long as the client. */
struct sbx_server_info {
	unsigned protocol_version;
	const char *shim_version;
	const char *features; /* space-separated */
	unsigned max_frame;
	unsigned pid;
	int pid1;
	unsigned uid;
	const char *hostname;
	const char *boot_id;
};
SBX_API const struct sbx_server_info *sbx_client_server(const struct sbx_client *c);
/* 1 if the shim announced feature name (e.g. "echo"). */
SBX_API int sbx_client_has_feature(const struct sbx_client *c, const char *name);

/* The file descriptor to watch for readability when driving the client from an
 * event loop, and the call to make when it is readable: reads what is there without
 * blocking, completes calls, runs async callbacks. Returns 0, or -1 when the
 * connection is dead (err says why). */
SBX_API int sbx_client_fd(const struct sbx_client *c);
SBX_API int sbx_client_process(struct sbx_client *c, struct sbx_error *err);
/* Number of calls (sync and async) still in flight. */
SBX_API unsigned sbx_client_pending(struct sbx_client *c);

/* ---- system calls ---- */

/* Send a PING and wait for its PONG; *rtt_ns (may be NULL) gets the round trip. */
SBX_API int sbx_ping(struct sbx_client *c, const struct sbx_call_opts *opts, uint64_t *rtt_ns, struct sbx_error *err);

/* Asynchronous ping: cb runs from sbx_client_process() (or from whatever call is
 * reading on another thread) with status 0 or -1 and err set on failure. */
typedef void (*sbx_ping_cb)(void *ud, int status, uint64_t rtt_ns, const struct sbx_error *err);
SBX_API int sbx_ping_async(struct sbx_client *c, sbx_ping_cb cb, void *ud, struct sbx_error *err);

struct sbx_info {
	char shim_version[32];
	unsigned protocol_version;
	char features[256];
	uint64_t uptime_ms;
	unsigned pid;
	int pid1;
	unsigned uid;
	unsigned gid;
	char hostname[256];
	char boot_id[40];
	unsigned connections;
	unsigned streams;
	unsigned processes;
	unsigned mounts;
	uint64_t rss_bytes;
	double load[3];
	unsigned max_connections;
	unsigned max_streams;
	unsigned workers;
};
SBX_API int sbx_info(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_info *out,
		     struct sbx_error *err);

/* Send len bytes through the shim's echo stream and receive them back into out
 * (len bytes). Checks a channel's integrity and measures its throughput; the bytes
 * are streamed in frames with flow control, so len may be any size. */
SBX_API int sbx_echo(struct sbx_client *c, const struct sbx_call_opts *opts, const void *data, size_t len, void *out,
		     struct sbx_error *err);

/* ---- frame decoding for debugging ---- */

/* Decoder for a captured raw byte stream (either direction): feed bytes, get one
 * line per frame through cb. */
struct sbx_decoder;
SBX_API struct sbx_decoder *sbx_decoder_new(sbx_trace_fn cb, void *ud);
/* Returns 0, or -1 when the stream cannot be a frame sequence (the line says why). */
SBX_API int sbx_decoder_feed(struct sbx_decoder *d, const void *buf, size_t len);
/* Reports leftover bytes of an unfinished frame, if any; then frees. */
SBX_API void sbx_decoder_free(struct sbx_decoder *d);

#ifdef __cplusplus
}
#endif
#endif
