/* policy.c: per-command restrictions, prepared in the parent and applied in the child. */
#include "policy.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

struct policy {
	uid_t uid;
	gid_t gid;
};

int policy_prepare(const Shim__V1__ExecRequest *req, struct policy **out, struct shim_err *err)
{
	(void)req;
	struct policy *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return err_set(err, ENOMEM, NULL, "out of memory");
	p->uid = getuid();
	p->gid = getgid();
	*out = p;
	return 0;
}

int policy_apply_child(const struct policy *p, const char **stage)
{
	(void)p;
	(void)stage;
	return 0;
}

uid_t policy_uid(const struct policy *p)
{
	return p->uid;
}

gid_t policy_gid(const struct policy *p)
{
	return p->gid;
}

const char *policy_home(const struct policy *p)
{
	(void)p;
	return NULL;
}

const char *policy_user(const struct policy *p)
{
	(void)p;
	return NULL;
}

void policy_free(struct policy *p)
{
	free(p);
}
