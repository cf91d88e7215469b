/* archive_static.c: with libarchive linked from libarchive.a, keeps its other archive writers (and libxml2) out. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>

/*
 * libarchive's pax writer calls one function of archive_write_set_format.c, the file
 * that also holds archive_write_set_format() and so references every format's writer:
 * 7zip, iso9660, zip, mtree, xar (which needs libxml2)... Linked statically, that one
 * reference would pull them all into the binary. Defined here, in an object linked
 * before libarchive.a, it satisfies the reference without that file. The body is the
 * original's (libarchive 3.6): an error naming the entry and the format
 * (ARCHIVE_ERRNO_FILE_FORMAT is EINVAL on Linux).
 */
void __archive_write_entry_filetype_unsupported(struct archive *a, struct archive_entry *entry, const char *format);

void __archive_write_entry_filetype_unsupported(struct archive *a, struct archive_entry *entry, const char *format)
{
	const char *name = NULL;
	switch (archive_entry_filetype(entry)) {
	case AE_IFDIR:
		name = "directories";
		break;
	case AE_IFLNK:
		name = "symbolic links";
		break;
	case AE_IFCHR:
		name = "character devices";
		break;
	case AE_IFBLK:
		name = "block devices";
		break;
	case AE_IFIFO:
		name = "named pipes";
		break;
	case AE_IFSOCK:
		name = "sockets";
		break;
	default:
		break;
	}
	if (name != NULL)
		archive_set_error(a, EINVAL, "%s: %s format cannot archive %s", archive_entry_pathname(entry), format,
				  name);
	else
		archive_set_error(a, EINVAL, "%s: %s format cannot archive files with mode 0%lo",
				  archive_entry_pathname(entry), format, (unsigned long)archive_entry_mode(entry));
}
