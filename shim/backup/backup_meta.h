/* backup_meta.h: what a backup looks up for each entry: owner names, earlier hard links, excludes, xattrs of path-only entries. */
#ifndef SHIM_BACKUP_META_H
#define SHIM_BACKUP_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- user and group names: /etc/passwd and /etc/group, read once ---- */

struct backup_meta_idname;
struct backup_meta_names {
	const char *file; /* "/etc/passwd" or "/etc/group" */
	bool loaded;
	struct backup_meta_idname *v;
	size_t n;
	char *blob;
	uint32_t last_id;
	const char *last;
};

/* The name of id in t->file (loaded at the first call), or NULL. Read by hand, not
 * through NSS: a fully static daemon must not dlopen the image's NSS modules. */
const char *backup_meta_name_of(struct backup_meta_names *t, uint32_t id);
void backup_meta_names_free(struct backup_meta_names *t);

/* ---- hard links: (dev, ino) -> the member name of its first link ---- */

struct backup_meta_link;
struct backup_meta_links {
	struct backup_meta_link **b;
	size_t nbuckets, n;
};

/* The member name an earlier link of (dev, ino) was archived under, or NULL. */
const char *backup_meta_link_find(const struct backup_meta_links *t, dev_t dev, ino_t ino);
/* One more link of (dev, ino) met: forgotten once all of them were (memory grows
 * with the inodes whose links are not all met yet, not with the tree). */
void backup_meta_link_met(struct backup_meta_links *t, dev_t dev, ino_t ino);
/* The first link of an inode with nlink links, archived as name. -1 (ENOMEM). */
int backup_meta_link_add(struct backup_meta_links *t, dev_t dev, ino_t ino, nlink_t nlink, const char *name);
void backup_meta_links_free(struct backup_meta_links *t);

/* ---- excludes (see backup_walk.c for their meaning) ---- */

struct backup_meta_pattern;
struct backup_meta_excludes {
	struct backup_meta_pattern *v;
	size_t n;
};

/* Prepare patterns (edited in place: they must outlive x). -1 (ENOMEM). */
int backup_meta_excludes_init(struct backup_meta_excludes *x, char **patterns, size_t n);
/* Is the entry at rel (its path below DIR, "a/b") left out? */
bool backup_meta_excluded(const struct backup_meta_excludes *x, const char *rel, bool is_dir);
void backup_meta_excludes_free(struct backup_meta_excludes *x);

/* ---- xattrs of an entry without an fd of its own (symlink, node, empty file) ---- */

/* llistxattr/lgetxattr of dfd/name: listxattrat/getxattrat where the kernel has them
 * (6.13), else through the directory's /proc/self/fd link. -1 with errno. */
ssize_t backup_meta_xattr_list_at(int dfd, const char *name, char *buf, size_t size);
ssize_t backup_meta_xattr_get_at(int dfd, const char *name, const char *key, void *buf, size_t size);

#endif
