/* errnames.h: Linux errno numbers <-> names and texts, without asking the host's libc. */
#ifndef SHIM_ERRNAMES_H
#define SHIM_ERRNAMES_H

/* "ENOENT" for 2; NULL for a value Linux does not define. */
const char *errname_name(int num);
/* "No such file or directory" for 2; NULL for an unknown value. */
const char *errname_text(int num);
/* 2 for "ENOENT" (aliases such as EWOULDBLOCK accepted); -1 for an unknown name. */
int errname_num(const char *name);

#endif
