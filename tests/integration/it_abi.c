/* it_abi.c: the struct_size rule of libsbx's public structs (sbx.h's conventions, sdk/ABI.md),
 * against a real daemon. A caller built with an older header (a smaller struct_size) gets its
 * missing input fields read as zero and its output filled only up to its size (the bytes after
 * it untouched); a newer header's larger struct works while its unknown tail is zero and fails
 * with E2BIG otherwise; struct_size 0 is EINVAL; both before anything is sent. */
#include "harness.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SPRINTF(buf, ...) CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CANARY 0xa5

static struct sbx_client *start(void)
{
	const char *sock = it_path("shim.sock");
	it_daemon_start("shim", "--listen", it_unix_target(sock), "--state-dir", it_path("state"), NULL);
	return it_connect(it_unix_target(sock), NULL);
}

/* Every byte of buf[from, to) is CANARY. */
static void check_canary(const void *buf, size_t from, size_t to, const char *what)
{
	const unsigned char *p = buf;
	for (size_t i = from; i < to; i++)
		CHECKF(p[i] == CANARY, "%s: byte %zu written (0x%02x), want it left as 0x%02x (struct_size %zu)", what,
		       i, p[i], CANARY, from);
}

/* ---- inputs ---- */

/* sbx_call_opts as a caller built before user, group and resolve existed sees it: the fields after
 * its struct_size are never read (here they name an unknown user, which the shim would refuse). */
static int case_input_old(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	it_write_file(it_path("f"), "abc");
	struct sbx_stat st = SBX_STAT_INIT;
	struct sbx_call_opts o = SBX_CALL_OPTS_INIT;
	o.timeout_ms = -1;
	o.user = "nosuchuser_abi";
	o.resolve = 0x80000000u; /* unknown bits: EINVAL if read */
	CHECK(sbx_stat(c, &o, it_path("f"), 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	o.resolve = 0;
	CHECK(sbx_stat(c, &o, it_path("f"), 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, EINVAL);
	CHECK_CONTAINS(err.message, "unknown user nosuchuser_abi");
	/* the size before user: user and resolve read as zero, the call runs as the shim */
	o.resolve = 0x80000000u;
	o.struct_size = offsetof(struct sbx_call_opts, user);
	CHECK_SBX(sbx_stat(c, &o, it_path("f"), 0, &st, &err), &err);
	CHECK_EQ(st.type, SBX_FT_FILE);
	CHECK_EQ(st.size, 3);
	/* timeout_ms and cancel are still read: a fired token cancels */
	o.cancel = sbx_cancel_new();
	sbx_cancel_fire(o.cancel);
	CHECK(sbx_stat(c, &o, it_path("f"), 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, ECANCELED);
	sbx_cancel_free(o.cancel);

	/* sbx_exec_opts without cwd and what follows: cwd reads as NULL ("/") */
	const char *const argv[] = {"/bin/pwd", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	eo.cwd = "/nonexistent_abi";
	struct sbx_output out;
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_REMOTE, ENOENT);
	eo.struct_size = offsetof(struct sbx_exec_opts, cwd);
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, &out, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	CHECKF(out.out_len == 2 && memcmp(out.out, "/\n", 2) == 0, "pwd printed '%.*s'", (int)out.out_len, out.out);
	sbx_output_free(&out);
	sbx_client_close(c);
	return 0;
}

/* A struct from a newer header: accepted while the fields this library does not know are zero. */
static int case_input_new(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct {
		struct sbx_call_opts o;
		uint64_t later_field;
	} big;
	memset(&big, 0, sizeof(big));
	big.o.struct_size = sizeof(big);
	big.o.timeout_ms = -1;
	unsigned n0 = it_count_entries(it_dir());
	CHECK_SBX(sbx_write_file_buf(c, &big.o, it_path("a"), 0, 0644, "a", 1, NULL, &err), &err);
	CHECK_EQ(it_count_entries(it_dir()), n0 + 1);
	big.later_field = 1;
	CHECK(sbx_write_file_buf(c, &big.o, it_path("b"), 0, 0644, "b", 1, NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, E2BIG);
	CHECK_CONTAINS(err.message, "struct sbx_call_opts");
	struct stat sb;
	CHECKF(lstat(it_path("b"), &sb) < 0 && errno == ENOENT, "the refused write created %s", it_path("b"));
	/* the same for an options struct of a family */
	struct {
		struct sbx_exec_opts eo;
		unsigned char later[8];
	} bx;
	memset(&bx, 0, sizeof(bx));
	const char *const argv[] = {"/bin/true", NULL};
	bx.eo.struct_size = sizeof(bx);
	bx.eo.argv = argv;
	struct sbx_exit ex = SBX_EXIT_INIT;
	CHECK_SBX(sbx_run(c, NULL, &bx.eo, NULL, 0, 0, NULL, &ex, &err), &err);
	CHECK_EQ(ex.exit_code, 0);
	bx.later[7] = 1;
	CHECK(sbx_run(c, NULL, &bx.eo, NULL, 0, 0, NULL, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, E2BIG);
	CHECK_CONTAINS(err.message, "struct sbx_exec_opts");
	sbx_client_close(c);
	return 0;
}

/* struct_size 0 (a struct not started from its INIT macro): EINVAL, nothing done. */
static int case_size_zero(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	unsigned n0 = it_count_entries(it_dir());
	struct sbx_call_opts o;
	memset(&o, 0, sizeof(o));
	CHECK(sbx_mkdir(c, &o, it_path("d"), 0, 0755, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "start from SBX_CALL_OPTS_INIT");
	CHECK_EQ(it_count_entries(it_dir()), n0);
	struct sbx_stat st;
	memset(&st, 0, sizeof(st));
	CHECK(sbx_stat(c, NULL, it_dir(), 0, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "start from SBX_STAT_INIT");
	CHECK(sbx_write_file_buf(c, NULL, it_path("w"), 0, 0644, "w", 1, &st, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_EQ(it_count_entries(it_dir()), n0);
	struct sbx_info info;
	memset(&info, 0, sizeof(info));
	CHECK(sbx_info(c, NULL, &info, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	const char *const argv[] = {"/bin/true", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	struct sbx_exit ex;
	memset(&ex, 0, sizeof(ex));
	CHECK(sbx_run(c, NULL, &eo, NULL, 0, 0, NULL, &ex, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "start from SBX_EXIT_INIT");
	struct sbx_process_info pi;
	memset(&pi, 0, sizeof(pi));
	CHECK(sbx_spawn(c, NULL, &eo, &pi, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	struct sbx_backup_opts bo;
	memset(&bo, 0, sizeof(bo));
	CHECK(sbx_backup_to_file(c, NULL, it_dir(), &bo, it_path("x.tar"), NULL, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "start from SBX_BACKUP_OPTS_INIT");
	CHECK_EQ(it_count_entries(it_dir()), n0);
	struct sbx_connect_opts co;
	memset(&co, 0, sizeof(co));
	struct sbx_client *c2 = NULL;
	CHECK(sbx_connect(it_unix_target(it_path("shim.sock")), &co, &c2, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK(c2 == NULL);
	/* a mount record: refused before the mount is even checked or sent */
	struct sbx_mount_record mr;
	memset(&mr, 0, sizeof(mr));
	struct sbx_mount_opts mo = SBX_MOUNT_OPTS_INIT;
	mo.endpoint = "http://127.0.0.1:1";
	mo.access_key_id = mo.secret_access_key = "k";
	CHECK(sbx_mount(c, NULL, "bkt", it_path("m"), &mo, &mr, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_CONTAINS(err.message, "start from SBX_MOUNT_RECORD_INIT");
	CHECK(sbx_unmount(c, NULL, "/nowhere", NULL, &mr, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	CHECK_EQ(it_count_entries(it_dir()), n0);
	sbx_client_close(c);
	return 0;
}

/* ---- outputs ---- */

/* An output struct of an older, smaller size is filled up to its struct_size, not a byte more. */
static int case_output_old(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	CHECK(symlink("abcdefgh", it_path("l")) == 0);
	union {
		struct sbx_stat st;
		unsigned char raw[sizeof(struct sbx_stat) + 32];
	} s;
	/* the size before the link target's fields */
	memset(&s, CANARY, sizeof(s));
	s.st.struct_size = offsetof(struct sbx_stat, link_target);
	CHECK_SBX(sbx_stat(c, NULL, it_path("l"), 0, &s.st, &err), &err);
	CHECK_EQ(s.st.type, SBX_FT_SYMLINK);
	CHECK_EQ(s.st.size, 8);
	CHECK_EQ(s.st.struct_size, offsetof(struct sbx_stat, link_target));
	check_canary(&s, offsetof(struct sbx_stat, link_target), sizeof(s), "sbx_stat");
	/* the full struct, a buffer too short for the target: cut, NUL-terminated, full length told */
	char target[4];
	memset(&s, CANARY, sizeof(s));
	s.st.struct_size = sizeof(s.st);
	s.st.link_target = target;
	s.st.link_target_size = sizeof(target);
	CHECK_SBX(sbx_stat(c, NULL, it_path("l"), 0, &s.st, &err), &err);
	CHECK(memcmp(target, "abc", 4) == 0);
	CHECK_EQ(s.st.link_target_len, 8);
	CHECK(s.st.link_target == target && s.st.link_target_size == sizeof(target));
	check_canary(&s, sizeof(s.st), sizeof(s), "sbx_stat");
	/* a struct larger than the library's: its unknown tail is zeroed */
	memset(&s, CANARY, sizeof(s));
	s.st.struct_size = sizeof(s);
	s.st.link_target = NULL;
	s.st.link_target_size = 0;
	CHECK_SBX(sbx_stat(c, NULL, it_path("l"), 0, &s.st, &err), &err);
	CHECK_EQ(s.st.link_target_len, 8);
	for (size_t i = sizeof(s.st); i < sizeof(s); i++)
		CHECKF(s.raw[i] == 0, "byte %zu of the larger struct: 0x%02x, want 0", i, s.raw[i]);

	/* sbx_exit without its newest fields */
	union {
		struct sbx_exit ex;
		unsigned char raw[sizeof(struct sbx_exit) + 16];
	} e;
	memset(&e, CANARY, sizeof(e));
	size_t cut = offsetof(struct sbx_exit, duration_ns);
	e.ex.struct_size = cut;
	const char *const argv[] = {"/bin/sh", "-c", "exit 7", NULL};
	struct sbx_exec_opts eo = SBX_EXEC_OPTS_INIT;
	eo.argv = argv;
	CHECK_SBX(sbx_run(c, NULL, &eo, NULL, 0, 0, NULL, &e.ex, &err), &err);
	CHECK_EQ(e.ex.exit_code, 7);
	CHECK_EQ(e.ex.signal, 0);
	check_canary(&e, cut, sizeof(e), "sbx_exit");

	/* sbx_info cut after pid */
	union {
		struct sbx_info info;
		unsigned char raw[sizeof(struct sbx_info) + 16];
	} in;
	memset(&in, CANARY, sizeof(in));
	cut = offsetof(struct sbx_info, pid1);
	in.info.struct_size = cut;
	CHECK_SBX(sbx_info(c, NULL, &in.info, &err), &err);
	CHECK(in.info.pid > 0);
	CHECK(in.info.protocol_version == 1);
	check_canary(&in, cut, sizeof(in), "sbx_info");

	/* sbx_backup_record without to_path: filled but for it; the library keeps nothing
	 * allocated in the bytes it may not write */
	union {
		struct sbx_backup_record rec;
		unsigned char raw[sizeof(struct sbx_backup_record) + 16];
	} r;
	memset(&r, CANARY, sizeof(r));
	cut = offsetof(struct sbx_backup_record, to_path);
	r.rec.struct_size = cut;
	CHECK(mkdir(it_path("d"), 0755) == 0);
	it_write_file(it_path("d/f"), "x");
	struct sbx_backup_opts bo = SBX_BACKUP_OPTS_INIT;
	bo.to_path = it_path("d.tar");
	CHECK_SBX(sbx_backup(c, NULL, it_path("d"), &bo, NULL, NULL, &r.rec, &err), &err);
	CHECKF(r.rec.dir != NULL && strcmp(r.rec.dir, it_path("d")) == 0, "dir '%s'", r.rec.dir ? r.rec.dir : "(null)");
	CHECK(r.rec.entries >= 2);
	check_canary(&r, cut, sizeof(r), "sbx_backup_record");
	sbx_backup_record_free(&r.rec);
	CHECK(r.rec.dir == NULL);
	check_canary(&r, cut, sizeof(r), "sbx_backup_record after sbx_backup_record_free");
	/* and with it: to_path is the library's string */
	struct sbx_backup_record rec = SBX_BACKUP_RECORD_INIT;
	CHECK(unlink(it_path("d.tar")) == 0);
	CHECK_SBX(sbx_backup(c, NULL, it_path("d"), &bo, NULL, NULL, &rec, &err), &err);
	CHECKF(rec.to_path != NULL && strcmp(rec.to_path, it_path("d.tar")) == 0, "to_path '%s'",
	       rec.to_path ? rec.to_path : "(null)");
	sbx_backup_record_free(&rec);
	CHECK(rec.to_path == NULL && rec.dir == NULL && rec.struct_size == sizeof(rec));
	sbx_client_close(c);
	return 0;
}

/* The lists hand out pointers to the library's records (struct_size: the library's sizeof),
 * NULL-terminated, so a caller's own sizeof never indexes them. */
static int case_lists(void)
{
	struct sbx_client *c = start();
	struct sbx_error err;
	struct sbx_tunnel_info **tv = NULL;
	size_t n = 99;
	CHECK_SBX(sbx_tunnels_list(c, NULL, &tv, &n, &err), &err);
	CHECK(n == 0 && tv != NULL && tv[0] == NULL);
	sbx_tunnels_free(tv);
	struct sbx_tunnel *t1, *t2;
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, 9, NULL, &t1, &err), &err);
	CHECK_SBX(sbx_forward_open(c, NULL, 0, NULL, 10, NULL, &t2, &err), &err);
	CHECK_SBX(sbx_tunnels_list(c, NULL, &tv, NULL, &err), &err);
	CHECK(tv[0] != NULL && tv[1] != NULL && tv[2] == NULL);
	CHECK_EQ(tv[0]->struct_size, sizeof(struct sbx_tunnel_info));
	CHECK(strcmp(tv[0]->id, sbx_tunnel_id(t1)) == 0 && tv[0]->port == 9);
	CHECK(strcmp(tv[1]->id, sbx_tunnel_id(t2)) == 0 && tv[1]->port == 10);
	sbx_tunnels_free(tv);
	sbx_tunnel_close(t1);
	sbx_tunnel_close(t2);
	sbx_tunnels_free(NULL);
	struct sbx_mount_record **mv = NULL;
	n = 99;
	CHECK_SBX(sbx_mounts_list(c, NULL, &mv, &n, &err), &err);
	CHECK(n == 0 && mv != NULL && mv[0] == NULL);
	sbx_mounts_free(mv);
	sbx_mounts_free(NULL);
	CHECK(sbx_mounts_list(c, NULL, NULL, &n, &err) < 0);
	CHECK_ERR(&err, SBX_ERR_LOCAL, EINVAL);
	/* freeing a record never filled, and twice, is safe */
	struct sbx_mount_record mr = SBX_MOUNT_RECORD_INIT;
	sbx_mount_record_free(&mr);
	sbx_mount_record_free(&mr);
	CHECK(mr.path == NULL && mr.struct_size == sizeof(mr));
	sbx_client_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	/* clang-format off */
	static const struct it_case cases[] = {
		{"input_old", case_input_old},
		{"input_new", case_input_new},
		{"size_zero", case_size_zero},
		{"output_old", case_output_old},
		{"lists", case_lists},
	};
	/* clang-format on */
	return it_main(argc, argv, cases, ARRAY_LEN(cases));
}
