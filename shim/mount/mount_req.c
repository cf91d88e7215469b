/* mount_req.c: an S3 mount request checked, string by string, and turned into the worker's mount_plan. */
#include "mount.h"
#include "shim.pb-c.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ================================ checks ================================ */

int mount_check_bucket(const char *b, struct shim_err *err)
{
	/* S3's bucket naming rules: 3-63 of [a-z0-9.-], starting and ending with a
	 * letter or digit, no "..", ".-" or "-.", not an IPv4 address */
	size_t n = strlen(b);
	if (n < 3 || n > 63)
		return err_set(err, EINVAL, b, "bad bucket name: must be 3 to 63 characters long");
	for (size_t i = 0; i < n; i++) {
		char c = b[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
			return err_set(err, EINVAL, b,
				       "bad bucket name: only lowercase letters, digits, '.' and '-' are allowed");
	}
	if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
		return err_set(err, EINVAL, b, "bad bucket name: must start and end with a letter or digit");
	if (strstr(b, "..") != NULL || strstr(b, ".-") != NULL || strstr(b, "-.") != NULL)
		return err_set(err, EINVAL, b, "bad bucket name: '..', '.-' and '-.' are not allowed");
	unsigned a, bb, c, d;
	char tail;
	if (sscanf(b, "%u.%u.%u.%u%c", &a, &bb, &c, &d, &tail) == 4)
		return err_set(err, EINVAL, b, "bad bucket name: must not look like an IP address");
	return 0;
}

static bool printable(const char *s)
{
	for (; *s != '\0'; s++)
		if ((unsigned char)*s <= 0x20 || (unsigned char)*s == 0x7f)
			return false;
	return true;
}

int mount_check_endpoint(const char *e, struct shim_err *err)
{
	size_t skip = 0;
	if (strncmp(e, "http://", 7) == 0)
		skip = 7;
	else if (strncmp(e, "https://", 8) == 0)
		skip = 8;
	if (skip == 0)
		return err_set(err, EINVAL, e, "bad endpoint: want an http:// or https:// URL");
	if (strlen(e) > 2048)
		return err_set(err, ENAMETOOLONG, NULL, "bad endpoint: longer than 2048 bytes");
	if (!printable(e))
		return err_set(err, EINVAL, e, "bad endpoint: spaces and control characters are not allowed");
	if (e[skip] == '\0' || e[skip] == '/' || e[skip] == ':')
		return err_set(err, EINVAL, e, "bad endpoint: no host");
	return 0;
}

int mount_check_prefix(const char *p, struct shim_err *err)
{
	size_t n = strlen(p);
	if (n > 1024)
		return err_set(err, ENAMETOOLONG, NULL, "bad prefix: longer than 1024 bytes");
	if (p[0] == '/')
		return err_set(err, EINVAL, p, "bad prefix: must not start with '/'");
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return err_set(err, EINVAL, NULL, "bad prefix: control characters are not allowed");
	/* no "." or ".." components: rclone would clean them into another key */
	const char *s = p;
	while (*s != '\0') {
		size_t len = strcspn(s, "/");
		if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.') ||
		    (len == 0 && s[len] == '/'))
			return err_set(err, EINVAL, p, "bad prefix: empty, '.' and '..' components are not allowed");
		s += len;
		if (*s == '/')
			s++;
	}
	return 0;
}

int mount_check_word(const char *what, const char *v, size_t max, bool secret, struct shim_err *err)
{
	/* a secret's value never goes into the message (nor anywhere else) */
	if (v[0] == '\0')
		return err_set(err, EINVAL, NULL, "%s is empty", what);
	if (strlen(v) > max)
		return err_set(err, EINVAL, NULL, "%s is longer than %zu bytes", what, max);
	if (!printable(v))
		return err_set(err, EINVAL, secret ? NULL : v, "%s: spaces and control characters are not allowed",
			       what);
	return 0;
}

/* rclone mount options a client may set: name, and the kind of value. */
enum { OPT_FLAG, OPT_WORD, OPT_CACHE_MODE };
static const struct {
	const char *name;
	int kind;
} allowed[] = {
	{"vfs-cache-mode", OPT_CACHE_MODE},
	{"vfs-cache-max-age", OPT_WORD},
	{"vfs-cache-max-size", OPT_WORD},
	{"vfs-cache-poll-interval", OPT_WORD},
	{"vfs-write-back", OPT_WORD},
	{"vfs-read-chunk-size", OPT_WORD},
	{"vfs-read-chunk-size-limit", OPT_WORD},
	{"vfs-read-ahead", OPT_WORD},
	{"dir-cache-time", OPT_WORD},
	{"attr-timeout", OPT_WORD},
	{"buffer-size", OPT_WORD},
	{"transfers", OPT_WORD},
	{"checkers", OPT_WORD},
	{"contimeout", OPT_WORD},
	{"timeout", OPT_WORD},
	{"low-level-retries", OPT_WORD},
	{"uid", OPT_WORD},
	{"gid", OPT_WORD},
	{"umask", OPT_WORD},
	{"dir-perms", OPT_WORD},
	{"file-perms", OPT_WORD},
	{"allow-other", OPT_FLAG},
	{"no-modtime", OPT_FLAG},
	{"no-checksum", OPT_FLAG},
	{"vfs-fast-fingerprint", OPT_FLAG},
	{"use-server-modtime", OPT_FLAG},
};

int mount_check_option(const char *name, const char *value, struct shim_err *err)
{
	int kind = -1;
	for (size_t i = 0; i < ARRAY_SIZE(allowed); i++)
		if (strcmp(allowed[i].name, name) == 0)
			kind = allowed[i].kind;
	if (kind < 0)
		return err_set(err, EINVAL, name, "rclone option not allowed (see PROTOCOL.md 12.4 for the list)");
	if (kind == OPT_FLAG) {
		if (value != NULL && strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
			return err_set(err, EINVAL, name, "option takes no value, or true or false");
		return 0;
	}
	if (value == NULL || value[0] == '\0')
		return err_set(err, EINVAL, name, "option needs a value");
	if (kind == OPT_CACHE_MODE) {
		if (strcmp(value, "off") != 0 && strcmp(value, "minimal") != 0 && strcmp(value, "writes") != 0 &&
		    strcmp(value, "full") != 0)
			return err_set(err, EINVAL, value, "vfs-cache-mode: want off, minimal, writes or full");
		return 0;
	}
	size_t n = strlen(value);
	if (n > 64)
		return err_set(err, EINVAL, name, "option value longer than 64 bytes");
	for (size_t i = 0; i < n; i++) {
		char c = value[i];
		if (!(isalnum((unsigned char)c) || c == '.' || c == '_' || c == ':' || c == '-'))
			return err_set(err, EINVAL, value, "option %s: only letters, digits, '.', '_', ':' and '-'",
				       name);
	}
	return 0;
}

/* ================================ the request ================================ */

int mount_check_request(const Shim__V1__MountRequest *q, struct shim_err *err)
{
	if (mount_check_bucket(q->bucket, err) < 0 || mount_check_endpoint(q->endpoint, err) < 0)
		return -1;
	if (q->prefix != NULL && q->prefix[0] != '\0' && mount_check_prefix(q->prefix, err) < 0)
		return -1;
	if (mount_check_word("access key id", q->access_key_id, 256, true, err) < 0)
		return -1;
	if (q->secret_access_key.len > 1024 || memchr(q->secret_access_key.data, 0, q->secret_access_key.len))
		return err_set(err, EINVAL, NULL, "bad secret key");
	if (q->has_session_token &&
	    (q->session_token.len > 8192 || memchr(q->session_token.data, 0, q->session_token.len)))
		return err_set(err, EINVAL, NULL, "bad session token");
	if (q->region != NULL && q->region[0] != '\0' && mount_check_word("region", q->region, 64, false, err) < 0)
		return -1;
	if (q->provider != NULL && q->provider[0] != '\0' &&
	    mount_check_word("provider", q->provider, 32, false, err) < 0)
		return -1;
	if (q->n_options > MOUNT_MAX_OPTIONS)
		return err_set(err, EINVAL, NULL, "too many rclone options (at most %d)", MOUNT_MAX_OPTIONS);
	for (size_t i = 0; i < q->n_options; i++)
		if (mount_check_option(q->options[i]->name, q->options[i]->value, err) < 0)
			return -1;
	if (q->path.len == 0 || q->path.data[0] != '/')
		return err_setn(err, EINVAL, q->path.data, q->path.len, "the mount path must be absolute");
	if (q->path.len >= PATH_MAX || memchr(q->path.data, 0, q->path.len) != NULL)
		return err_setn(err, q->path.len >= PATH_MAX ? ENAMETOOLONG : EINVAL, q->path.data,
				q->path.len >= 1024 ? 1024 : q->path.len, "bad mount path");
	if (q->has_timeout_ms && (q->timeout_ms < 100 || q->timeout_ms > MOUNT_MAX_TIMEOUT_MS))
		return err_set(err, EINVAL, NULL, "timeout_ms must be 100 to %d", MOUNT_MAX_TIMEOUT_MS);
	return 0;
}

static char *dup_bytes(const ProtobufCBinaryData *b)
{
	char *s = malloc(b->len + 1);
	if (s != NULL) {
		memcpy(s, b->data, b->len);
		s[b->len] = '\0';
	}
	return s;
}

struct mount_plan *mount_plan_new(const Shim__V1__MountRequest *q, const char *path, const char *id,
				  const char *state_dir, struct shim_err *err)
{
	struct mount_plan *pl = calloc(1, sizeof(*pl));
	if (pl == NULL) {
		err_set(err, ENOMEM, NULL, "out of memory");
		return NULL;
	}
	pl->log_fd = -1;
	pl->lock_fd = -1;
	pl->mp_fd = -1;
	bool has_prefix = q->prefix != NULL && q->prefix[0] != '\0';
	pl->bucket = strdup(q->bucket);
	pl->prefix = has_prefix ? strdup(q->prefix) : NULL;
	pl->endpoint = strdup(q->endpoint);
	pl->region = q->region != NULL && q->region[0] != '\0' ? strdup(q->region) : NULL;
	pl->provider = q->provider != NULL && q->provider[0] != '\0' ? strdup(q->provider) : NULL;
	pl->access_key = strdup(q->access_key_id);
	pl->secret = dup_bytes(&q->secret_access_key);
	pl->session_token = q->has_session_token && q->session_token.len > 0 ? dup_bytes(&q->session_token) : NULL;
	snprintf(pl->path, sizeof(pl->path), "%s", path);
	pl->read_only = q->has_read_only && q->read_only;
	pl->allow_non_empty = q->has_allow_non_empty && q->allow_non_empty;
	snprintf(pl->state_dir, sizeof(pl->state_dir), "%s", state_dir);
	snprintf(pl->id, sizeof(pl->id), "%s", id);
	bool oom = pl->bucket == NULL || pl->endpoint == NULL || pl->access_key == NULL || pl->secret == NULL ||
		   (has_prefix && pl->prefix == NULL);
	for (size_t i = 0; i < q->n_options && !oom; i++) {
		pl->opt_name[i] = strdup(q->options[i]->name);
		pl->opt_value[i] = q->options[i]->value != NULL ? strdup(q->options[i]->value) : NULL;
		pl->n_opts = i + 1;
		oom = pl->opt_name[i] == NULL || (q->options[i]->value != NULL && pl->opt_value[i] == NULL);
	}
	if (oom)
		err_set(err, ENOMEM, NULL, "out of memory");
	/* the secrets once more as C strings: printable, no spaces or newlines */
	if (oom || mount_check_word("secret key", pl->secret, 1024, true, err) < 0 ||
	    (pl->session_token != NULL && mount_check_word("session token", pl->session_token, 8192, true, err) < 0)) {
		mount_plan_free(pl);
		free(pl);
		return NULL;
	}
	return pl;
}
