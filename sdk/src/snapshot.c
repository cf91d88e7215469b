/* snapshot.c: microVM snapshots: snapshot_prepare and resumed, on the generic request
 * path (call.c). */
#include "internal.h"
#include "shim.pb-c.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define FREEZE_MAX 16

static void strv_free(char **v)
{
	if (v == NULL)
		return;
	for (char **p = v; *p != NULL; p++)
		free(*p);
	free(v);
}

static void result_release(struct sbx_snapshot_result *r)
{
	if (r->steps != NULL) {
		for (struct sbx_snapshot_step **p = r->steps; *p != NULL; p++)
			free(*p);
		free(r->steps);
	}
	strv_free(r->frozen);
	strv_free(r->stopped);
	size_t size = r->struct_size;
	memset(r, 0, sizeof(*r));
	r->struct_size = size;
}

SBX_API void sbx_snapshot_result_free(struct sbx_snapshot_result *r)
{
	if (r == NULL || r->struct_size < sizeof(size_t))
		return;
	struct sbx_snapshot_result full;
	sbx__struct_out_get(&full, sizeof(full), r);
	result_release(&full);
	sbx__struct_out_put(r, &full, sizeof(full));
}

/* A string of len bytes (any but NUL expected), NUL-terminated. */
static char *dup_bytes(const void *p, size_t len)
{
	char *s = malloc(len + 1);
	if (s != NULL) {
		if (len > 0)
			memcpy(s, p, len);
		s[len] = '\0';
	}
	return s;
}

/* One step: the struct and its strings in one block. */
static struct sbx_snapshot_step *step_new(const Shim__V1__SnapshotStep *m)
{
	const char *name = m->name ? m->name : "";
	const char *msg = m->message ? m->message : "";
	size_t nl = strlen(name) + 1, ml = strlen(msg) + 1, pl = (m->has_path ? m->path.len : 0) + 1;
	struct sbx_snapshot_step *s = calloc(1, sizeof(*s) + nl + ml + pl);
	if (s == NULL)
		return NULL;
	char *o = (char *)(s + 1);
	s->struct_size = sizeof(*s);
	s->name = memcpy(o, name, nl);
	o += nl;
	s->message = memcpy(o, msg, ml);
	o += ml;
	if (pl > 1)
		memcpy(o, m->path.data, pl - 1);
	o[pl - 1] = '\0';
	s->path = o;
	s->duration_us = m->duration_us;
	s->error = m->has_errno_num ? m->errno_num : 0;
	s->count = m->has_count ? m->count : 0;
	return s;
}

/* Fill full from the reply's steps and lists; -1 (ENOMEM) with everything freed. */
static int fill(struct sbx_snapshot_result *full, Shim__V1__SnapshotStep **steps, size_t nsteps,
		const ProtobufCBinaryData *frozen, size_t nfrozen, char **stopped, size_t nstopped,
		struct sbx_error *err)
{
	full->steps = calloc(nsteps + 1, sizeof(*full->steps));
	full->frozen = calloc(nfrozen + 1, sizeof(*full->frozen));
	full->stopped = calloc(nstopped + 1, sizeof(*full->stopped));
	bool ok = full->steps != NULL && full->frozen != NULL && full->stopped != NULL;
	for (size_t i = 0; ok && i < nsteps; i++)
		ok = (full->steps[i] = step_new(steps[i])) != NULL;
	for (size_t i = 0; ok && i < nfrozen; i++)
		ok = (full->frozen[i] = dup_bytes(frozen[i].data, frozen[i].len)) != NULL;
	for (size_t i = 0; ok && i < nstopped; i++)
		ok = (full->stopped[i] = dup_bytes(stopped[i], strlen(stopped[i]))) != NULL;
	if (!ok) {
		result_release(full);
		return sbx__fail(err, SBX_ERR_LOCAL, ENOMEM, NULL, "out of memory");
	}
	return 0;
}

/* full to the caller's out (by its struct_size), or released when out is NULL. */
static void hand_out(struct sbx_snapshot_result *out, struct sbx_snapshot_result *full)
{
	if (out == NULL) {
		result_release(full);
		return;
	}
	sbx_snapshot_result_free(out);
	sbx__struct_out_put(out, full, sizeof(*full));
}

SBX_API int sbx_snapshot_prepare(struct sbx_client *c, const struct sbx_call_opts *opts,
				 const struct sbx_snapshot_opts *so, struct sbx_snapshot_result *out,
				 struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(out, "sbx_snapshot_result", err) < 0)
		return -1;
	struct sbx_snapshot_opts o = SBX_SNAPSHOT_OPTS_INIT;
	if (so != NULL && sbx__struct_in(&o, sizeof(o), so, "sbx_snapshot_opts", err) < 0)
		return -1;
	ProtobufCBinaryData paths[FREEZE_MAX];
	size_t n = 0;
	for (; o.freeze != NULL && o.freeze[n] != NULL; n++) {
		if (n == FREEZE_MAX)
			return sbx__fail(err, SBX_ERR_LOCAL, EINVAL, NULL, "freeze: more than %d filesystems",
					 FREEZE_MAX);
		paths[n].data = (uint8_t *)o.freeze[n];
		paths[n].len = strlen(o.freeze[n]);
	}
	Shim__V1__SnapshotPrepareRequest pr = SHIM__V1__SNAPSHOT_PREPARE_REQUEST__INIT;
	pr.n_freeze = n;
	pr.freeze = paths;
	if (o.thaw_after_ms != 0)
		pr.has_thaw_after_ms = 1, pr.thaw_after_ms = o.thaw_after_ms;
	if (o.stop_background)
		pr.has_stop_background = 1, pr.stop_background = 1;
	if (o.flush_timeout_ms != 0)
		pr.has_flush_timeout_ms = 1, pr.flush_timeout_ms = o.flush_timeout_ms;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_SNAPSHOT_PREPARE;
	req.snapshot_prepare = &pr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_SNAPSHOT_PREPARE, err);
	if (r == NULL)
		return -1;
	const Shim__V1__SnapshotPrepareReply *p = r->snapshot_prepare;
	struct sbx_snapshot_result full = SBX_SNAPSHOT_RESULT_INIT;
	int rc = fill(&full, p->steps, p->n_steps, p->frozen, p->n_frozen, p->stopped, p->n_stopped, err);
	full.generation = p->generation;
	full.thaw_after_ms = p->thaw_after_ms;
	shim__v1__result__free_unpacked(r, NULL);
	if (rc < 0)
		return -1;
	hand_out(out, &full);
	return 0;
}

SBX_API int sbx_resumed(struct sbx_client *c, const struct sbx_call_opts *opts, const struct sbx_resumed_opts *ro,
			struct sbx_snapshot_result *out, struct sbx_error *err)
{
	struct sbx_call_opts call_opts;
	if (sbx__call_opts(&opts, &call_opts, err) < 0)
		return -1;
	if (sbx__struct_out_check(out, "sbx_snapshot_result", err) < 0)
		return -1;
	struct sbx_resumed_opts o = SBX_RESUMED_OPTS_INIT;
	if (ro != NULL && sbx__struct_in(&o, sizeof(o), ro, "sbx_resumed_opts", err) < 0)
		return -1;
	Shim__V1__Timestamp ts = SHIM__V1__TIMESTAMP__INIT;
	if (o.time_sec == 0 && o.time_nsec == 0) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		ts.sec = now.tv_sec;
		ts.nsec = (uint32_t)now.tv_nsec;
	} else {
		ts.sec = o.time_sec;
		ts.nsec = o.time_nsec;
	}
	uint8_t rnd[64];
	Shim__V1__ResumedRequest rr = SHIM__V1__RESUMED_REQUEST__INIT;
	rr.time = &ts;
	if (o.entropy != NULL) {
		rr.entropy.data = (uint8_t *)o.entropy;
		rr.entropy.len = o.entropy_len;
	} else {
		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return sbx__fail(err, SBX_ERR_LOCAL, errno ? errno : EIO, NULL, "getrandom failed");
		rr.entropy.data = rnd;
		rr.entropy.len = sizeof(rnd);
	}
	if (o.fork)
		rr.has_fork = 1, rr.fork = 1;
	Shim__V1__Request req = SHIM__V1__REQUEST__INIT;
	req.kind_case = SHIM__V1__REQUEST__KIND_RESUMED;
	req.resumed = &rr;
	Shim__V1__Result *r = sbx__call_simple(c, opts, &req, SHIM__V1__RESULT__KIND_RESUMED, err);
	explicit_bzero(rnd, sizeof(rnd));
	if (r == NULL)
		return -1;
	const Shim__V1__ResumedReply *p = r->resumed;
	struct sbx_snapshot_result full = SBX_SNAPSHOT_RESULT_INIT;
	int rc = fill(&full, p->steps, p->n_steps, NULL, 0, NULL, 0, err);
	full.generation = p->generation;
	full.prepared = p->prepared;
	full.clock_delta_ns = p->has_clock_delta_ns ? p->clock_delta_ns : 0;
	shim__v1__result__free_unpacked(r, NULL);
	if (rc < 0)
		return -1;
	hand_out(out, &full);
	return 0;
}
