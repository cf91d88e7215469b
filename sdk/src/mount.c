/* mount.c: S3 bucket mounts in the sandbox: mount, list, unmount, and records as JSON. */
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

SBX_API const char *sbx_mount_state_name(int state)
{
	static const char *const names[] = {"starting", "live", "failed", "unmounting", "unmounted"};
	return state >= 0 && state < (int)(sizeof(names) / sizeof(names[0])) ? names[state] : "unknown";
}

static void copy_str(char *dst, size_t size, const char *src)
{
	snprintf(dst, size, "%s", src != NULL ? src : "");
}

static char *dup_str(const char *src, size_t len)
{
	char *d = malloc(len + 1);
	if (d != NULL) {
		if (len > 0)
			memcpy(d, src, len);
		d[len] = '\0';
	}
	return d;
}

static char *dup_cstr(const char *s)
{
	return s != NULL ? dup_str(s, strlen(s)) : dup_str("", 0);
}

static void record_release(struct sbx_mount_record *rec)
{
	free(rec->prefix);
	free(rec->path);
	free(rec->endpoint);
	free(rec->error);
	rec->prefix = rec->path = rec->endpoint = rec->error = NULL;
}

/* A full-size record from r, its strings malloc'd: -1 (nothing left allocated) when out
 * of memory. */
static int record_from(struct sbx_mount_record *out, const Shim__V1__MountRecord *r, struct sbx_error *err)
{
	memset(out, 0, sizeof(*out));
	out->struct_size = sizeof(*out);
	copy_str(out->id, sizeof(out->id), r->id);
	copy_str(out->bucket, sizeof(out->bucket), r->bucket);
	out->prefix = dup_cstr(r->prefix);
	out->path = dup_str((const char *)r->path.data, r->path.len);
	out->read_only = r->read_only;
	out->state = (int)r->state;
	out->rclone_pid = r->rclone_pid;
	copy_str(out->created_at, sizeof(out->created_at), r->created_at);
	out->endpoint = dup_cstr(r->endpoint);
	out->error = dup_cstr(r->error);
	out->created_dir = r->has_created_dir && r->created_dir;
	if (out->prefix == NULL || out->path == NULL || out->endpoint == NULL || out->error == NULL) {
		record_release(out);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	return 0;
}

/* Hand a full record to the caller; what its (older, smaller) struct has no room for
 * is freed here. */
static void record_put(struct sbx_mount_record *rec, struct sbx_mount_record *full)
{
	sbx__struct_out_put(rec, full, sizeof(*full));
	struct sbx_mount_record left = SBX_MOUNT_RECORD_INIT;
#define LEFT(f)                                                                        \
	if (rec->struct_size < offsetof(struct sbx_mount_record, f) + sizeof(full->f)) \
	left.f = full->f
	LEFT(prefix);
	LEFT(path);
	LEFT(endpoint);
	LEFT(error);
#undef LEFT
	record_release(&left);
}

static void record_clear(struct sbx_mount_record *rec)
{
	struct sbx_mount_record zero = SBX_MOUNT_RECORD_INIT;
	sbx__struct_out_put(rec, &zero, sizeof(zero));
}

SBX_API void sbx_mount_record_free(struct sbx_mount_record *rec)
{
	if (rec == NULL || rec->struct_size < sizeof(size_t))
		return;
	struct sbx_mount_record r;
	sbx__struct_out_get(&r, sizeof(r), rec);
	record_release(&r);
	sbx__struct_out_put(rec, &r, sizeof(r));
}

/* Send req (mount or unmount) and wait for its mount result; its record into rec (if
 * given, already checked and cleared). */
static int call_record(struct sbx_client *c, const struct sbx_call_opts *opts, const Shim__V1__Request *req,
		       struct sbx_mount_record *rec, struct sbx_error *err)
{
	Shim__V1__Result *r = sbx__call_simple(c, opts, req, SHIM__V1__RESULT__KIND_MOUNT, err);
	if (r == NULL)
		return -1;
	int rc = 0;
	if (rec != NULL) {
		struct sbx_mount_record full;
		rc = record_from(&full, r->mount, err);
		if (rc == 0)
			record_put(rec, &full);
	}
	shim__v1__result__free_unpacked(r, NULL);
	return rc;
}

/* The caller's options, copied into a full-size struct (older, shorter ones get zeros). */
static int take_opts(struct sbx_mount_opts *o, const struct sbx_mount_opts *mo, struct sbx_error *err)
{
	memset(o, 0, sizeof(*o));
	if (mo == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "mount options are required (endpoint and keys)");
	return sbx__struct_in(o, sizeof(*o), mo, "sbx_mount_opts", err);
}

#define MAX_OPTIONS 32

SBX_API int sbx_mount(struct sbx_client *c, const struct sbx_call_opts *opts, const char *bucket, const char *path,
		      const struct sbx_mount_opts *mo, struct sbx_mount_record *rec, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(rec, "sbx_mount_record", err) < 0)
		return -1;
	if (rec != NULL)
		record_clear(rec);
	struct sbx_mount_opts o;
	if (take_opts(&o, mo, err) < 0)
		return -1;
	if (bucket == NULL || path == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "bucket and path are required");
	if (o.endpoint == NULL || o.endpoint[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL,
				 "an endpoint URL is required (it is never defaulted)");
	if (o.access_key_id == NULL || o.secret_access_key == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "an access key id and a secret key are required");

	Shim__V1__MountOption ov[MAX_OPTIONS + 1];
	Shim__V1__MountOption *op[MAX_OPTIONS + 1];
	char names[MAX_OPTIONS + 1][64];
	size_t nopt = 0;
	for (size_t i = 0; o.options != NULL && o.options[i] != NULL; i++) {
		if (nopt > MAX_OPTIONS)
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "too many rclone options (at most %d)",
					 MAX_OPTIONS);
		const char *s = o.options[i];
		const char *eq = strchr(s, '=');
		size_t nl = eq != NULL ? (size_t)(eq - s) : strlen(s);
		if (nl == 0 || nl >= sizeof(names[0]))
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, s, "bad rclone option (want name=value or name)");
		memcpy(names[nopt], s, nl);
		names[nopt][nl] = '\0';
		shim__v1__mount_option__init(&ov[nopt]);
		ov[nopt].name = names[nopt];
		ov[nopt].value = eq != NULL ? (char *)eq + 1 : NULL;
		op[nopt] = &ov[nopt];
		nopt++;
	}

	Shim__V1__MountRequest m = SHIM__V1__MOUNT_REQUEST__INIT;
	m.bucket = (char *)bucket;
	m.endpoint = (char *)o.endpoint;
	m.access_key_id = (char *)o.access_key_id;
	m.secret_access_key.data = (uint8_t *)o.secret_access_key;
	m.secret_access_key.len = strlen(o.secret_access_key);
	if (o.session_token != NULL && o.session_token[0] != '\0') {
		m.has_session_token = 1;
		m.session_token.data = (uint8_t *)o.session_token;
		m.session_token.len = strlen(o.session_token);
	}
	m.path.data = (uint8_t *)path;
	m.path.len = strlen(path);
	if (o.read_only) {
		m.has_read_only = 1;
		m.read_only = 1;
	}
	m.prefix = (char *)o.prefix;
	m.region = (char *)o.region;
	m.provider = (char *)o.provider;
	if (o.allow_non_empty) {
		m.has_allow_non_empty = 1;
		m.allow_non_empty = 1;
	}
	if (o.timeout_ms > 0) {
		m.has_timeout_ms = 1;
		m.timeout_ms = (uint32_t)o.timeout_ms;
	}
	m.n_options = nopt;
	m.options = op;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_MOUNT;
	req.mount = &m;
	return call_record(c, opts, &req, rec, err);
}

SBX_API int sbx_mounts_list(struct sbx_client *c, const struct sbx_call_opts *opts, struct sbx_mount_record ***out,
			    size_t *n, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (out == NULL)
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "no place for the list given");
	*out = NULL;
	if (n != NULL)
		*n = 0;
	Shim__V1__MountListRequest lr = SHIM__V1__MOUNT_LIST_REQUEST__INIT;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_MOUNTS;
	req.mounts = &lr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_MOUNTS, err);
	if (r == NULL)
		return -1;
	size_t cnt = r->mounts != NULL ? r->mounts->n_mounts : 0;
	struct sbx_mount_record **v = calloc(cnt + 1, sizeof(*v));
	int rc = v != NULL ? 0 : sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	for (size_t i = 0; rc == 0 && i < cnt; i++) {
		v[i] = malloc(sizeof(*v[i]));
		if (v[i] == NULL)
			rc = sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
		else if ((rc = record_from(v[i], r->mounts->mounts[i], err)) < 0) {
			free(v[i]);
			v[i] = NULL;
		}
	}
	shim__v1__result__free_unpacked(r, NULL);
	if (rc < 0) {
		sbx_mounts_free(v);
		return -1;
	}
	*out = v;
	if (n != NULL)
		*n = cnt;
	return 0;
}

SBX_API void sbx_mounts_free(struct sbx_mount_record **list)
{
	if (list == NULL)
		return;
	for (size_t i = 0; list[i] != NULL; i++) {
		record_release(list[i]);
		free(list[i]);
	}
	free(list);
}

SBX_API int sbx_unmount(struct sbx_client *c, const struct sbx_call_opts *opts, const char *id_or_path,
			const struct sbx_unmount_opts *uo, struct sbx_mount_record *rec, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(rec, "sbx_mount_record", err) < 0)
		return -1;
	if (rec != NULL)
		record_clear(rec);
	if (id_or_path == NULL || id_or_path[0] == '\0')
		return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "give a mount id or path");
	struct sbx_unmount_opts o = SBX_UNMOUNT_OPTS_INIT;
	if (uo != NULL && sbx__struct_in(&o, sizeof(o), uo, "sbx_unmount_opts", err) < 0)
		return -1;
	Shim__V1__UnmountRequest u = SHIM__V1__UNMOUNT_REQUEST__INIT;
	if (id_or_path[0] == '/') {
		u.has_path = 1;
		u.path.data = (uint8_t *)id_or_path;
		u.path.len = strlen(id_or_path);
	} else {
		u.id = (char *)id_or_path;
	}
	if (o.flush_timeout_ms != 0) {
		u.has_flush_timeout_ms = 1;
		u.flush_timeout_ms = o.flush_timeout_ms < 0 ? 0 : (uint32_t)o.flush_timeout_ms;
	}
	if (o.force) {
		u.has_force = 1;
		u.force = 1;
	}
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_UNMOUNT;
	req.unmount = &u;
	return call_record(c, opts, &req, rec, err);
}

/* ---- JSON ---- */

/* Length of the valid UTF-8 sequence (2-4 bytes) at p, else 0. */
static size_t utf8_seq(const unsigned char *p)
{
	size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
	uint32_t cp = p[0] & (0x3f >> (n - 1));
	if (p[0] < 0xc2 || p[0] > 0xf4)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80) /* also stops at the NUL */
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* s as a JSON string: valid UTF-8 as it is, the short escapes (\n, \t...), other control
 * characters and bytes that are not UTF-8 as \u00XX (their value). */
static void json_str(FILE *f, const char *s)
{
	if (s == NULL)
		s = "";
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
		size_t n;
		char e = sbx__json_escape(*p);
		if (e != 0) {
			fprintf(f, "\\%c", e);
		} else if (*p < 0x20 || *p == 0x7f) {
			fprintf(f, "\\u%04x", *p);
		} else if (*p >= 0x80 && (n = utf8_seq(p)) > 0) {
			fwrite(p, 1, n, f);
			p += n - 1;
		} else if (*p >= 0x80) {
			fprintf(f, "\\u%04x", *p);
		} else {
			fputc(*p, f);
		}
	}
	fputc('"', f);
}

SBX_API char *sbx_mount_record_json(const struct sbx_mount_record *rec)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL)
		return NULL;
	fputs("{\"id\":", f);
	json_str(f, rec->id);
	fputs(",\"bucket\":", f);
	json_str(f, rec->bucket);
	fputs(",\"prefix\":", f);
	json_str(f, rec->prefix);
	fputs(",\"path\":", f);
	json_str(f, rec->path);
	fprintf(f, ",\"read_only\":%s,\"state\":", rec->read_only ? "true" : "false");
	json_str(f, sbx_mount_state_name(rec->state));
	fprintf(f, ",\"rclone_pid\":%u,\"created_at\":", rec->rclone_pid);
	json_str(f, rec->created_at);
	fputs(",\"endpoint\":", f);
	json_str(f, rec->endpoint);
	fputs(",\"error\":", f);
	json_str(f, rec->error);
	fprintf(f, ",\"created_dir\":%s}", rec->created_dir ? "true" : "false");
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}
