/* backup.c: backups and restores from the SDK.
 *
 * backup: REQUEST, then the shim's DATA (the archive; we grant a big window and hand
 * each chunk to the sink as it arrives), DATA FIN, END BackupRecord; EVENT progress
 * along the way. With to_path no DATA comes.
 * restore: REQUEST, then our DATA (pulled from the source within the shim's credit)
 * and FIN at the source's end, END RestoreReply. With from_path we send no DATA. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* As for reads (fs_io.c): 4 MiB in flight so that a backup is bound by bandwidth,
 * credit returned in batches. */
#define BACKUP_EXTRA_WINDOW (4u << 20)

static ProtobufCBinaryData bin(const char *s)
{
	ProtobufCBinaryData b = {s ? strlen(s) : 0, (uint8_t *)(uintptr_t)(s ? s : "")};
	return b;
}

/* A string field of the record: at most size-1 bytes, NUL-terminated. */
static void copy_str(char *dst, size_t size, const char *src)
{
	size_t n = src != NULL ? strnlen(src, size - 1) : 0;
	memcpy(dst, src != NULL ? src : "", n);
	dst[n] = '\0';
}

/* n byte strings as a malloc'd array of malloc'd C strings; -1 on ENOMEM. */
static int copy_list(char ***out, size_t *nout, const ProtobufCBinaryData *v, size_t n)
{
	*out = NULL;
	*nout = 0;
	if (n == 0)
		return 0;
	char **a = calloc(n, sizeof(*a));
	if (a == NULL)
		return -1;
	*out = a;
	for (size_t i = 0; i < n; i++) {
		a[i] = malloc(v[i].len + 1);
		if (a[i] == NULL)
			return -1; /* the caller frees what was copied */
		if (v[i].len > 0)
			memcpy(a[i], v[i].data, v[i].len);
		a[i][v[i].len] = '\0';
		*nout = i + 1;
	}
	return 0;
}

/* What a full-size record owns. */
static void record_release(struct sbx_backup_record *r)
{
	free(r->dir);
	free(r->to_path);
	for (size_t i = 0; r->skipped != NULL && i < r->n_skipped; i++)
		free(r->skipped[i]);
	free(r->skipped);
	for (size_t i = 0; r->changed != NULL && i < r->n_changed; i++)
		free(r->changed[i]);
	free(r->changed);
}

/* The caller's record zeroed, up to its struct_size (which stays). */
static void record_clear(struct sbx_backup_record *rec)
{
	struct sbx_backup_record zero = SBX_BACKUP_RECORD_INIT;
	sbx__struct_out_put(rec, &zero, sizeof(zero));
}

/* Hand a full record to the caller; what its (older, smaller) struct has no room for
 * is freed here. */
static void record_put(struct sbx_backup_record *rec, struct sbx_backup_record *full)
{
	sbx__struct_out_put(rec, full, sizeof(*full));
	struct sbx_backup_record left = SBX_BACKUP_RECORD_INIT;
#define LEFT(f)                                                                         \
	if (rec->struct_size < offsetof(struct sbx_backup_record, f) + sizeof(full->f)) \
	left.f = full->f
	LEFT(dir);
	LEFT(to_path);
	LEFT(skipped);
	LEFT(n_skipped);
	LEFT(changed);
	LEFT(n_changed);
#undef LEFT
	record_release(&left);
}

SBX_API void sbx_backup_record_free(struct sbx_backup_record *rec)
{
	if (rec == NULL || rec->struct_size < sizeof(size_t))
		return;
	struct sbx_backup_record r;
	sbx__struct_out_get(&r, sizeof(r), rec);
	record_release(&r);
	/* what it owned, forgotten; the other fields stay as they were */
	r.dir = r.to_path = NULL;
	r.skipped = r.changed = NULL;
	r.n_skipped = r.n_changed = 0;
	sbx__struct_out_put(rec, &r, sizeof(r));
}

/* Hand an EVENT's progress to the callback; other events are ignored (PROTOCOL.md §13). */
static void progress_event(const struct rx_item *it, sbx_progress_fn fn, void *ud)
{
	if (it->type != FRAME_EVENT || fn == NULL)
		return;
	Shim__V1__Event *ev = shim__v1__event__unpack(NULL, it->len, it->data);
	if (ev == NULL)
		return;
	if (ev->kind_case == SHIM__V1__EVENT__KIND_PROGRESS && ev->progress != NULL)
		fn(ud, ev->progress->bytes, ev->progress->items);
	shim__v1__event__free_unpacked(ev, NULL);
}

/* The Result of a call that is done (nothing queued): the shim's error, or the END
 * payload decoded and checked to be of kind. NULL with err on failure. */
static Shim__V1__Result *end_result(struct call *k, int kind, const char *path, struct sbx_error *err)
{
	if (k->err.kind != SBX_ERR_NONE) {
		sbx__copy_error(err, &k->err);
		return NULL;
	}
	Shim__V1__Result *r = shim__v1__result__unpack(NULL, k->result_len, k->result);
	if (r == NULL) {
		sbx__fail(err, SBX_ERR_PROTOCOL, EBADMSG, path, "undecodable Result from the shim");
		return NULL;
	}
	if ((int)r->kind_case != kind || (kind == SHIM__V1__RESULT__KIND_BACKUP && r->backup == NULL) ||
	    (kind == SHIM__V1__RESULT__KIND_RESTORE && r->restore == NULL)) {
		shim__v1__result__free_unpacked(r, NULL);
		sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, path, "the shim answered with another kind of result");
		return NULL;
	}
	return r;
}

/* Wait for the END (or ERROR) of a call that sends us no more DATA, passing progress
 * events on. */
static Shim__V1__Result *wait_end(struct call *k, int kind, const char *path, uint64_t deadline, struct sbx_cancel *tok,
				  sbx_progress_fn fn, void *ud, struct sbx_error *err)
{
	for (;;) {
		struct rx_item *it = sbx__call_pop(k);
		if (it != NULL) {
			progress_event(it, fn, ud);
			sbx__rx_free(it);
			continue;
		}
		if (sbx__call_done(k))
			return end_result(k, kind, path, err);
		if (sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, tok, err) < 0)
			return NULL;
	}
}

static int record_from(struct sbx_backup_record *rec, const Shim__V1__BackupRecord *b, const char *dir,
		       struct sbx_error *err)
{
	copy_str(rec->id, sizeof(rec->id), b->id);
	rec->dir = strndup(b->dir.len > 0 ? (const char *)b->dir.data : "", b->dir.len);
	rec->bytes = b->bytes;
	copy_str(rec->sha256, sizeof(rec->sha256), b->sha256);
	rec->entries = b->entries;
	rec->source_bytes = b->source_bytes;
	rec->compression = (int)b->compression;
	copy_str(rec->created_at, sizeof(rec->created_at), b->created_at);
	if (b->has_to_path)
		rec->to_path = strndup(b->to_path.len > 0 ? (const char *)b->to_path.data : "", b->to_path.len);
	if (rec->dir == NULL || (b->has_to_path && rec->to_path == NULL) ||
	    copy_list(&rec->skipped, &rec->n_skipped, b->skipped, b->n_skipped) < 0 ||
	    copy_list(&rec->changed, &rec->n_changed, b->changed, b->n_changed) < 0) {
		record_release(rec);
		*rec = (struct sbx_backup_record)SBX_BACKUP_RECORD_INIT;
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, dir, "out of memory");
	}
	return 0;
}

/* The caller's options (possibly an older, smaller struct; NULL: the defaults). */
static int backup_opts_copy(const struct sbx_backup_opts *bo, struct sbx_backup_opts *o, const char *dir,
			    struct sbx_error *err)
{
	struct sbx_backup_opts init = SBX_BACKUP_OPTS_INIT;
	*o = init;
	if (bo != NULL && sbx__struct_in(o, sizeof(*o), bo, "sbx_backup_opts", err) < 0)
		return -1;
	if (o->compression < SBX_COMPRESS_NONE || o->compression > SBX_COMPRESS_ZSTD)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "unknown compression %d", o->compression);
	return 0;
}

SBX_API int sbx_backup(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
		       const struct sbx_backup_opts *bo, sbx_sink_fn sink, void *ud, struct sbx_backup_record *rec,
		       struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	struct sbx_backup_opts o;
	if (sbx__struct_out_check(rec, "sbx_backup_record", err) < 0)
		return -1;
	if (rec != NULL)
		record_clear(rec);
	if (c == NULL || dir == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no client or no directory given");
	if (backup_opts_copy(bo, &o, dir, err) < 0)
		return -1;
	bool to_path = o.to_path != NULL;
	if (!to_path && sink == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no sink given (and no to_path)");
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;

	Shim__V1__BackupRequest br = SHIM__V1__BACKUP_REQUEST__INIT;
	br.dir = bin(dir);
	size_t nex = 0;
	while (o.excludes != NULL && o.excludes[nex] != NULL)
		nex++;
	ProtobufCBinaryData *ex = NULL;
	if (nex > 0) {
		ex = calloc(nex, sizeof(*ex));
		if (ex == NULL)
			return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, dir, "out of memory");
		for (size_t i = 0; i < nex; i++)
			ex[i] = bin(o.excludes[i]);
	}
	br.n_excludes = nex;
	br.excludes = ex;
	br.has_compression = 1;
	br.compression = (Shim__V1__Compression)o.compression;
	if (o.level != 0) {
		br.has_level = 1;
		br.level = o.level;
	}
	br.has_skip_unreadable = br.skip_unreadable = o.skip_unreadable != 0;
	br.has_one_file_system = br.one_file_system = o.one_file_system != 0;
	if (to_path) {
		br.has_to_path = 1;
		br.to_path = bin(o.to_path);
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_BACKUP;
	req.backup = &br;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0) {
		free(ex);
		return -1;
	}
	struct call *k = sbx__start_request(c, &req, deadline, err);
	free(ex);
	if (k == NULL)
		return -1;

	struct sbx__download d = {.sink = sink, .ud = ud};
	int rc = to_path ? 0 : sbx__call_grant(k, BACKUP_EXTRA_WINDOW, deadline, err);
	while (rc == 0) {
		struct rx_item *it = sbx__call_pop(k);
		if (it == NULL) {
			if (sbx__call_done(k))
				break;
			rc = sbx__call_wait_for(k, SBX__WAIT_NEXT, deadline, tok, err);
			continue;
		}
		if (it->type == FRAME_EVENT) {
			progress_event(it, o.progress, o.progress_ud);
		} else if (it->type == FRAME_DATA) {
			if (to_path && it->len > 0 && !d.fin)
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, dir, "archive DATA for a backup to_path");
			else
				rc = sbx__download_data(k, &d, it, deadline, dir, err);
		}
		sbx__rx_free(it);
		if (rc == 0 && tok != NULL && sbx_cancel_fired(tok))
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, dir, "cancelled");
	}
	if (rc == 0) {
		Shim__V1__Result *r = end_result(k, SHIM__V1__RESULT__KIND_BACKUP, dir, err);
		if (r == NULL) {
			rc = -1;
		} else {
			const Shim__V1__BackupRecord *b = r->backup;
			if (!to_path && (!d.fin || b->bytes != d.got))
				rc = sbx__fail(err, SBX_ERR_PROTOCOL, EPROTO, dir,
					       "backup ended with %llu bytes delivered of %llu announced%s",
					       (unsigned long long)d.got, (unsigned long long)b->bytes,
					       d.fin ? "" : " (no FIN)");
			else if (rec != NULL) {
				struct sbx_backup_record full = SBX_BACKUP_RECORD_INIT;
				rc = record_from(&full, b, dir, err);
				if (rc == 0)
					record_put(rec, &full);
			}
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	sbx__call_free(k);
	return rc;
}

/* ---- backups into local files ---- */

struct fd_sink {
	int fd;
};

static int fd_sink_fn(void *ud, const void *buf, size_t len)
{
	struct fd_sink *s = ud;
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(s->fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno ? errno : EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Create a new file beside path (".NAME.sbx-XXXXXXXX", mode 0666 less the umask, as
 * the final file would get). Returns the fd, tmp holding its name; -1 with err. */
static int open_temp_beside(const char *path, char *tmp, size_t size, struct sbx_error *err)
{
	const char *slash = strrchr(path, '/');
	int dlen = slash != NULL ? (int)(slash - path + 1) : 0;
	const char *base = slash != NULL ? slash + 1 : path;
	if (*base == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EISDIR, path, "not a file name");
	static unsigned counter;
	for (int tries = 0; tries < 100; tries++) {
		uint64_t r = sbx__now_ns() ^ ((uint64_t)getpid() << 40) ^
			     ((uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
		int n = snprintf(tmp, size, "%.*s.%s.sbx-%08x", dlen, path, base, (unsigned)(r ^ (r >> 32)));
		if (n < 0 || (size_t)n >= size)
			return sbx__fail(err, SBX_ERR_LOCAL, ENAMETOOLONG, path, "temporary file name too long");
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (fd >= 0)
			return fd;
		if (errno != EEXIST)
			return sbx__fail(err, SBX_ERR_LOCAL, errno, path, "create a temporary file beside it");
	}
	return sbx__fail(err, SBX_ERR_LOCAL, EEXIST, path, "no free temporary file name beside it");
}

/* fsync the directory holding path, so that a rename into it is durable. */
static void sync_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	char d[4096];
	if (slash == NULL) {
		snprintf(d, sizeof(d), ".");
	} else if (slash == path) {
		snprintf(d, sizeof(d), "/");
	} else {
		if ((size_t)(slash - path) >= sizeof(d))
			return;
		memcpy(d, path, (size_t)(slash - path));
		d[slash - path] = '\0';
	}
	int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

SBX_API int sbx_backup_to_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
			       const struct sbx_backup_opts *bo, const char *local_path, struct sbx_backup_record *rec,
			       struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(rec, "sbx_backup_record", err) < 0)
		return -1;
	if (rec != NULL)
		record_clear(rec);
	if (local_path == NULL || *local_path == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no local file given");
	if (bo != NULL && bo->struct_size > offsetof(struct sbx_backup_opts, to_path) && bo->to_path != NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, local_path, "to_path and a local file are exclusive");
	char tmp[4200];
	int fd = open_temp_beside(local_path, tmp, sizeof(tmp), err);
	if (fd < 0)
		return -1;
	struct fd_sink s = {fd};
	int rc = sbx_backup(c, opts, dir, bo, fd_sink_fn, &s, rec, err);
	if (rc == 0 && fsync(fd) < 0)
		rc = sbx__fail(err, SBX_ERR_LOCAL, errno, local_path, "fsync");
	if (close(fd) < 0 && rc == 0)
		rc = sbx__fail(err, SBX_ERR_LOCAL, errno, local_path, "close");
	if (rc == 0 && rename(tmp, local_path) < 0)
		rc = sbx__fail(err, SBX_ERR_LOCAL, errno, local_path, "rename the temporary file over it");
	if (rc < 0) {
		unlink(tmp);
		if (rec != NULL)
			sbx_backup_record_free(rec);
		return -1;
	}
	sync_parent(local_path);
	return 0;
}

/* ---- the record as JSON ---- */

struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *q = realloc(b->p, cap);
		if (q == NULL) {
			b->oom = true;
			return;
		}
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		sb_put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* Length of the valid UTF-8 sequence (2-4 bytes) at p, else 0. */
static size_t utf8_seq(const unsigned char *p, size_t len)
{
	size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
	uint32_t cp = p[0] & (0x7f >> n);
	if (p[0] < 0xc2 || p[0] > 0xf4 || n > len)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* s as a JSON string. Bytes that are not valid UTF-8 come out as \u00XX (the byte's
 * value): the output is always valid JSON, though such a name cannot be told from its
 * Latin-1 reading. */
static void sb_json_str(struct sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	sb_put(b, "\"", 1);
	while (p < end) {
		const unsigned char *q = p;
		while (q < end && *q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\')
			q++;
		sb_put(b, (const char *)p, (size_t)(q - p));
		p = q;
		if (p == end)
			break;
		size_t n;
		char e[2] = {'\\', sbx__json_escape(*p)};
		if (e[1] != 0) {
			sb_put(b, e, 2);
			p++;
		} else if (*p >= 0x80 && (n = utf8_seq(p, (size_t)(end - p))) > 0) {
			sb_put(b, (const char *)p, n);
			p += n;
		} else {
			sb_printf(b, "\\u%04x", *p++);
		}
	}
	sb_put(b, "\"", 1);
}

static void sb_json_list(struct sbuf *b, char *const *v, size_t n)
{
	sb_put(b, "[", 1);
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			sb_put(b, ",", 1);
		sb_json_str(b, v[i] != NULL ? v[i] : "");
	}
	sb_put(b, "]", 1);
}

SBX_API char *sbx_backup_record_json(const struct sbx_backup_record *caller)
{
	static const char *const comp[] = {"none", "gzip", "zstd"};
	if (caller == NULL || caller->struct_size < sizeof(size_t))
		return NULL;
	struct sbx_backup_record full;
	const struct sbx_backup_record *rec = &full;
	sbx__struct_out_get(&full, sizeof(full), caller);
	struct sbuf b = {0};
	/* the fixed-size fields may not be terminated if the caller filled them */
	char id[sizeof(rec->id)], sha[sizeof(rec->sha256)], created[sizeof(rec->created_at)];
	char *dir = strdup(rec->dir != NULL ? rec->dir : "");
	char *to = strdup(rec->to_path != NULL ? rec->to_path : "");
	copy_str(id, sizeof(id), rec->id);
	copy_str(sha, sizeof(sha), rec->sha256);
	copy_str(created, sizeof(created), rec->created_at);
	if (dir == NULL || to == NULL) {
		free(dir);
		free(to);
		return NULL;
	}
	sb_str(&b, "{\"id\":");
	sb_json_str(&b, id);
	sb_str(&b, ",\"dir\":");
	sb_json_str(&b, dir);
	sb_printf(&b, ",\"bytes\":%llu,\"sha256\":", (unsigned long long)rec->bytes);
	sb_json_str(&b, sha);
	sb_printf(&b, ",\"entries\":%llu,\"source_bytes\":%llu,\"compression\":", (unsigned long long)rec->entries,
		  (unsigned long long)rec->source_bytes);
	if (rec->compression >= 0 && rec->compression <= 2)
		sb_json_str(&b, comp[rec->compression]);
	else
		sb_printf(&b, "%d", rec->compression);
	sb_str(&b, ",\"skipped\":");
	sb_json_list(&b, rec->skipped, rec->skipped != NULL ? rec->n_skipped : 0);
	sb_str(&b, ",\"changed\":");
	sb_json_list(&b, rec->changed, rec->changed != NULL ? rec->n_changed : 0);
	sb_str(&b, ",\"created_at\":");
	sb_json_str(&b, created);
	if (to[0] != '\0') {
		sb_str(&b, ",\"to_path\":");
		sb_json_str(&b, to);
	}
	sb_str(&b, "}");
	free(dir);
	free(to);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* ---- restores ---- */

static int restore_opts_copy(const struct sbx_restore_opts *ro, struct sbx_restore_opts *o, char *sha, const char *dir,
			     struct sbx_error *err)
{
	struct sbx_restore_opts init = SBX_RESTORE_OPTS_INIT;
	*o = init;
	if (ro != NULL) {
		if (sbx__struct_in(o, sizeof(*o), ro, "sbx_restore_opts", err) < 0)
			return -1;
	}
	if (o->sha256 != NULL) {
		/* 64 hex digits, sent in lowercase as the shim computes it */
		size_t n = strlen(o->sha256);
		if (n != 64 || strspn(o->sha256, "0123456789abcdefABCDEF") != 64)
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir,
					 "expected sha256 is not 64 hexadecimal digits");
		for (size_t i = 0; i < 64; i++)
			sha[i] = (char)(o->sha256[i] >= 'A' && o->sha256[i] <= 'F' ? o->sha256[i] + 32 : o->sha256[i]);
		sha[64] = '\0';
		o->sha256 = sha;
	}
	return 0;
}

static void pipe_close(int pfd[2])
{
	for (int i = 0; i < 2; i++) {
		if (pfd[i] >= 0)
			close(pfd[i]);
		pfd[i] = -1;
	}
}

/* sbx_restore; with splice_fd >= 0 (sbx_restore_from_file: source reads that fd) the
 * bytes go from it into a pipe and from there into the connection by splice(), never
 * through our memory: the kernel passes page references along (from the page cache into
 * a unix socket without a copy since Linux 6.5), where read() and the socket's write
 * copied them twice. An fd or a connection that takes no splice gets the copies. */
static int restore_run(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
		       const struct sbx_restore_opts *ro, sbx_source_fn source, void *ud, int splice_fd,
		       struct sbx_restore_result *res, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	struct sbx_restore_opts o;
	char sha[65];
	if (sbx__struct_out_check(res, "sbx_restore_result", err) < 0)
		return -1;
	struct sbx_restore_result zero = SBX_RESTORE_RESULT_INIT;
	if (res != NULL)
		sbx__struct_out_put(res, &zero, sizeof(zero));
	if (c == NULL || dir == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no client or no directory given");
	if (restore_opts_copy(ro, &o, sha, dir, err) < 0)
		return -1;
	bool from_path = o.from_path != NULL;
	if (!from_path && source == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no source given (and no from_path)");
	uint64_t deadline = sbx__deadline(c, opts);
	struct sbx_cancel *tok = opts ? opts->cancel : NULL;

	Shim__V1__RestoreRequest rr = SHIM__V1__RESTORE_REQUEST__INIT;
	rr.dir = bin(dir);
	rr.has_mode = 1;
	rr.mode = o.merge ? SHIM__V1__RESTORE_MODE__RESTORE_MERGE : SHIM__V1__RESTORE_MODE__RESTORE_REPLACE;
	rr.sha256 = (char *)(uintptr_t)o.sha256;
	if (from_path) {
		rr.has_from_path = 1;
		rr.from_path = bin(o.from_path);
	}
	rr.has_allow_devices = rr.allow_devices = o.allow_devices != 0;
	rr.has_allow_empty = rr.allow_empty = o.allow_empty != 0;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESTORE;
	req.restore = &rr;
	Shim__V1__FsOptions fso;
	if (sbx__fs_options(opts, &req, &fso, err) < 0)
		return -1;

	size_t chunk_max = c->max_frame < FRAME_DATA_CHUNK ? c->max_frame : FRAME_DATA_CHUNK;
	uint8_t *buf = NULL;
	if (!from_path && (buf = malloc(chunk_max)) == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, dir, "out of memory");
	int pfd[2] = {-1, -1};
	/* (not under --trace: its lines show the bytes sent, as they are in memory) */
	if (!from_path && splice_fd >= 0 && c->trace == NULL && !__atomic_load_n(&c->no_splice_out, __ATOMIC_RELAXED) &&
	    pipe2(pfd, O_CLOEXEC) < 0)
		pfd[0] = pfd[1] = -1; /* no pipe: copied */
	struct call *k = sbx__start_request(c, &req, deadline, err);
	if (k == NULL) {
		free(buf);
		pipe_close(pfd);
		return -1;
	}
	int rc = 0;
	bool fin = from_path; /* nothing (more) to send */
	while (rc == 0 && !fin) {
		struct rx_item *it = sbx__call_pop(k);
		if (it != NULL) {
			progress_event(it, o.progress, o.progress_ud);
			sbx__rx_free(it);
			continue;
		}
		/* the shim may have ended already (a refused member, ENOSPC...): stop sending */
		if (sbx__call_done(k))
			break;
		if (tok != NULL && sbx_cancel_fired(tok)) {
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, dir, "cancelled");
			break;
		}
		int64_t credit = sbx__call_credit(k);
		if (credit <= 0) {
			rc = sbx__call_wait_for(k, SBX__WAIT_FRAME | SBX__WAIT_CREDIT, deadline, tok, err);
			continue;
		}
		size_t n = (uint64_t)credit < chunk_max ? (size_t)credit : chunk_max;
		errno = 0;
		long got;
		if (pfd[0] >= 0) {
			do
				got = splice(splice_fd, NULL, pfd[1], NULL, n, SPLICE_F_MOVE);
			while (got < 0 && errno == EINTR);
			if (got < 0 && errno == EINVAL) {
				/* this fd (a terminal, a filesystem without splice) is read */
				pipe_close(pfd);
				continue;
			}
		} else {
			got = source(ud, buf, n);
		}
		if (got < 0 || (size_t)got > n) {
			int e = got < 0 ? errno : EINVAL;
			if (e == 0)
				e = EIO;
			/* CANCEL goes out from sbx__call_free(): the shim leaves dir as it was */
			rc = sbx__fail(err, SBX_ERR_LOCAL, e, dir, "the source failed: %s", sbx_strerror(e));
			break;
		}
		if (tok != NULL && sbx_cancel_fired(tok)) {
			rc = sbx__fail(err, SBX_ERR_LOCAL, ECANCELED, dir, "cancelled");
			break;
		}
		pthread_mutex_lock(&c->mu);
		k->send_credit -= got;
		pthread_mutex_unlock(&c->mu);
		fin = got == 0;
		if (pfd[0] >= 0 && got > 0) {
			rc = sbx__send_pipe(c, k->id, pfd[0], (size_t)got, deadline, err);
			if (__atomic_load_n(&c->no_splice_out, __ATOMIC_RELAXED))
				pipe_close(pfd); /* the connection takes no splice: copied from now on */
		} else {
			rc = sbx__send(c, k->id, FRAME_DATA, fin ? FRAME_FLAG_FIN : 0, buf, (size_t)got, deadline, err);
		}
	}
	free(buf);
	pipe_close(pfd);
	if (rc == 0) {
		Shim__V1__Result *r =
			wait_end(k, SHIM__V1__RESULT__KIND_RESTORE, dir, deadline, tok, o.progress, o.progress_ud, err);
		if (r == NULL) {
			rc = -1;
		} else {
			if (res != NULL) {
				struct sbx_restore_result full = SBX_RESTORE_RESULT_INIT;
				full.bytes = r->restore->bytes;
				full.entries = r->restore->entries;
				copy_str(full.sha256, sizeof(full.sha256), r->restore->sha256);
				sbx__struct_out_put(res, &full, sizeof(full));
			}
			shim__v1__result__free_unpacked(r, NULL);
		}
	}
	sbx__call_free(k);
	return rc;
}

SBX_API int sbx_restore(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
			const struct sbx_restore_opts *ro, sbx_source_fn source, void *ud,
			struct sbx_restore_result *res, struct sbx_error *err)
{
	return restore_run(c, opts, dir, ro, source, ud, -1, res, err);
}

struct fd_source {
	int fd;
};

static long fd_source_fn(void *ud, void *buf, size_t len)
{
	struct fd_source *s = ud;
	ssize_t n;
	do
		n = read(s->fd, buf, len);
	while (n < 0 && errno == EINTR);
	return (long)n;
}

SBX_API int sbx_restore_from_file(struct sbx_client *c, const struct sbx_call_opts *opts, const char *dir,
				  const struct sbx_restore_opts *ro, const char *local_path,
				  struct sbx_restore_result *res, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(res, "sbx_restore_result", err) < 0)
		return -1;
	struct sbx_restore_result zero = SBX_RESTORE_RESULT_INIT;
	if (res != NULL)
		sbx__struct_out_put(res, &zero, sizeof(zero));
	if (local_path == NULL || *local_path == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, dir, "no local file given");
	if (ro != NULL && ro->struct_size > offsetof(struct sbx_restore_opts, from_path) && ro->from_path != NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, local_path, "from_path and a local file are exclusive");
	int fd = open(local_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sbx__fail(err, SBX_ERR_LOCAL, errno, local_path, "open");
	struct fd_source s = {fd};
	int rc = restore_run(c, opts, dir, ro, fd_source_fn, &s, fd, res, err);
	close(fd);
	return rc;
}
