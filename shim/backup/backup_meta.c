/* backup_meta.c: owner names, the hard-link table, exclude patterns and path-only xattr reads for backups. */
#include "backup_meta.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#define IDFILE_MAX (4u << 20)

/* ---- user and group names ---- */

struct backup_meta_idname {
	uint32_t id;
	uint32_t line; /* position in the file: the first line of an id wins */
	char *name;
};

static int idname_cmp(const void *x, const void *y)
{
	const struct backup_meta_idname *a = x, *b = y;
	if (a->id != b->id)
		return a->id < b->id ? -1 : 1;
	return a->line < b->line ? -1 : a->line > b->line;
}

/* "name:password:id:..." lines; NIS "+" and "-" lines and comments skipped. A file
 * that cannot be read gives no names (the archive then has numbers only). */
static void names_load(struct backup_meta_names *t)
{
	t->loaded = true;
	int fd = open(t->file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	char *blob = malloc(IDFILE_MAX + 1);
	size_t len = 0;
	ssize_t n;
	while (blob != NULL && len < IDFILE_MAX && (n = read(fd, blob + len, IDFILE_MAX - len)) > 0)
		len += (size_t)n;
	close(fd);
	if (blob == NULL)
		return;
	blob[len] = '\0';
	size_t cap = 0;
	uint32_t line = 0;
	for (char *p = blob; p < blob + len; line++) {
		char *end = strchr(p, '\n');
		if (end == NULL)
			end = blob + len;
		*end = '\0';
		char *c1 = strchr(p, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (c2 != NULL && c1 != p && p[0] != '+' && p[0] != '-' && p[0] != '#') {
			char *ep;
			unsigned long id = strtoul(c2 + 1, &ep, 10);
			if (ep != c2 + 1 && *ep == ':' && id <= UINT32_MAX) {
				if (t->n == cap) {
					cap = cap ? cap * 2 : 64;
					struct backup_meta_idname *nv = realloc(t->v, cap * sizeof(*nv));
					if (nv == NULL)
						break;
					t->v = nv;
				}
				*c1 = '\0';
				t->v[t->n++] = (struct backup_meta_idname){(uint32_t)id, line, p};
			}
		}
		p = end + 1;
	}
	t->blob = blob;
	qsort(t->v, t->n, sizeof(*t->v), idname_cmp);
}

const char *backup_meta_name_of(struct backup_meta_names *t, uint32_t id)
{
	if (!t->loaded)
		names_load(t);
	if (t->last != NULL && t->last_id == id)
		return t->last;
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo >= t->n || t->v[lo].id != id)
		return NULL;
	t->last_id = id;
	t->last = t->v[lo].name;
	return t->last;
}

void backup_meta_names_free(struct backup_meta_names *t)
{
	free(t->v);
	free(t->blob);
	t->v = NULL;
	t->blob = NULL;
}

/* ---- hard links ---- */

struct backup_meta_link {
	struct backup_meta_link *next;
	dev_t dev;
	ino_t ino;
	nlink_t left; /* links still to meet */
	char name[];
};

static size_t link_hash(const struct backup_meta_links *t, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)dev * 0xc2b2ae3d27d4eb4full);
	return (size_t)(h >> 20) & (t->nbuckets - 1);
}

const char *backup_meta_link_find(const struct backup_meta_links *t, dev_t dev, ino_t ino)
{
	if (t->n == 0)
		return NULL;
	for (struct backup_meta_link *l = t->b[link_hash(t, dev, ino)]; l != NULL; l = l->next)
		if (l->dev == dev && l->ino == ino)
			return l->name;
	return NULL;
}

void backup_meta_link_met(struct backup_meta_links *t, dev_t dev, ino_t ino)
{
	if (t->n == 0)
		return;
	for (struct backup_meta_link **pp = &t->b[link_hash(t, dev, ino)]; *pp != NULL; pp = &(*pp)->next) {
		struct backup_meta_link *l = *pp;
		if (l->dev != dev || l->ino != ino)
			continue;
		if (--l->left == 0) {
			*pp = l->next;
			free(l);
			t->n--;
		}
		return;
	}
}

int backup_meta_link_add(struct backup_meta_links *t, dev_t dev, ino_t ino, nlink_t nlink, const char *name)
{
	if (t->n >= t->nbuckets) {
		size_t nb = t->nbuckets ? t->nbuckets * 2 : 1024;
		struct backup_meta_link **nt = calloc(nb, sizeof(*nt));
		if (nt == NULL)
			return -1;
		size_t ob = t->nbuckets;
		struct backup_meta_link **old = t->b;
		t->b = nt;
		t->nbuckets = nb;
		for (size_t i = 0; i < ob; i++) {
			for (struct backup_meta_link *l = old[i], *next; l != NULL; l = next) {
				next = l->next;
				size_t h = link_hash(t, l->dev, l->ino);
				l->next = nt[h];
				nt[h] = l;
			}
		}
		free(old);
	}
	size_t len = strlen(name);
	struct backup_meta_link *l = malloc(sizeof(*l) + len + 1);
	if (l == NULL)
		return -1;
	l->dev = dev;
	l->ino = ino;
	l->left = nlink - 1;
	memcpy(l->name, name, len + 1);
	size_t h = link_hash(t, dev, ino);
	l->next = t->b[h];
	t->b[h] = l;
	t->n++;
	return 0;
}

void backup_meta_links_free(struct backup_meta_links *t)
{
	for (size_t i = 0; i < t->nbuckets; i++) {
		for (struct backup_meta_link *l = t->b[i], *next; l != NULL; l = next) {
			next = l->next;
			free(l);
		}
	}
	free(t->b);
	memset(t, 0, sizeof(*t));
}

/* ---- excludes ---- */

struct backup_meta_pattern {
	char *pat;
	bool dir_only; /* it ended with '/' */
	bool anchored; /* it started with "./" or "/" */
};

int backup_meta_excludes_init(struct backup_meta_excludes *x, char **patterns, size_t n)
{
	x->n = 0;
	x->v = NULL;
	if (n == 0)
		return 0;
	x->v = calloc(n, sizeof(*x->v));
	if (x->v == NULL)
		return -1;
	for (size_t i = 0; i < n; i++) {
		char *p = patterns[i];
		bool anchored = false;
		for (;;) {
			if (p[0] == '/') {
				p++;
				anchored = true;
			} else if (p[0] == '.' && p[1] == '/') {
				p += 2;
				anchored = true;
			} else {
				break;
			}
		}
		size_t len = strlen(p);
		bool dir_only = false;
		while (len > 0 && p[len - 1] == '/') {
			p[--len] = '\0';
			dir_only = true;
		}
		if (len == 0)
			continue; /* "./" or "/": DIR itself, never excluded */
		x->v[x->n++] = (struct backup_meta_pattern){p, dir_only, anchored};
	}
	return 0;
}

/* Matched against the path below DIR ("a/b", not the member name "./a/b", which
 * every pattern starting with a wildcard would match) and each of its tails. */
bool backup_meta_excluded(const struct backup_meta_excludes *x, const char *rel, bool is_dir)
{
	for (size_t i = 0; i < x->n; i++) {
		const struct backup_meta_pattern *p = &x->v[i];
		if (p->dir_only && !is_dir)
			continue;
		if (fnmatch(p->pat, rel, 0) == 0)
			return true;
		if (p->anchored)
			continue;
		for (const char *s = rel; *s != '\0'; s++)
			if (*s == '/' && s[1] != '/' && s[1] != '\0' && fnmatch(p->pat, s + 1, 0) == 0)
				return true;
	}
	return false;
}

void backup_meta_excludes_free(struct backup_meta_excludes *x)
{
	free(x->v);
	x->v = NULL;
	x->n = 0;
}

/* ---- xattrs by path ---- */

#ifndef SYS_getxattrat
#define SYS_getxattrat 464 /* Linux 6.13; the same number on every architecture */
#define SYS_listxattrat 465
#endif
struct xattr_args_compat {
	uint64_t value;
	uint32_t size;
	uint32_t flags;
};

static bool no_xattrat; /* the kernel (or a seccomp filter) refuses *xattrat */

ssize_t backup_meta_xattr_list_at(int dfd, const char *name, char *buf, size_t size)
{
	if (!__atomic_load_n(&no_xattrat, __ATOMIC_RELAXED)) {
		long n = syscall(SYS_listxattrat, dfd, name, AT_SYMLINK_NOFOLLOW, buf, size);
		/* EPERM: what a container's seccomp profile says for a syscall it does
		 * not know */
		if (n >= 0 || (errno != ENOSYS && errno != EPERM))
			return n;
		__atomic_store_n(&no_xattrat, true, __ATOMIC_RELAXED);
	}
	char p[64 + NAME_MAX];
	snprintf(p, sizeof(p), "/proc/self/fd/%d/%s", dfd, name);
	return llistxattr(p, buf, size);
}

ssize_t backup_meta_xattr_get_at(int dfd, const char *name, const char *key, void *buf, size_t size)
{
	if (!__atomic_load_n(&no_xattrat, __ATOMIC_RELAXED)) {
		struct xattr_args_compat args = {(uint64_t)(uintptr_t)buf, (uint32_t)size, 0};
		long n = syscall(SYS_getxattrat, dfd, name, AT_SYMLINK_NOFOLLOW, key, &args, sizeof(args));
		if (n >= 0 || (errno != ENOSYS && errno != EPERM))
			return n;
	}
	char p[64 + NAME_MAX];
	snprintf(p, sizeof(p), "/proc/self/fd/%d/%s", dfd, name);
	return lgetxattr(p, key, buf, size);
}
