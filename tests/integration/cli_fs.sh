#!/usr/bin/env bash
# cli_fs.sh: the sbx file subcommands against a real daemon: output, exit codes, errors, byte-exact data.
#
# Usage: bash cli_fs.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own daemon in a mktemp -d directory (with --state-dir there) and stops only it, by PID.
# Every section runs even when an earlier one failed; the script exits 1 if any check failed.
set -uo pipefail

SHIM=${1:?usage: cli_fs.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_fs.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-fs.XXXXXX") || exit 1
# T itself may sit below a symlinked TMPDIR: compare against canonical paths.
T=$(cd "$T" && pwd -P)
D=$T/d
mkdir "$D"
# cleanup, fail, start_daemon, run, has, hasnt, empty, py, run_sections, stop_daemon, finish
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"

# out_is TEXT: stdout of the last run is exactly TEXT (plus a newline).
out_is()
{
	printf '%s\n' "$1" | cmp -s - "$T/out" || fail "stdout is '$(cat -A "$T/out" | head -c 500)', want '$1'"
}

# ---- sections ----

sec_usage()
{
	run 2 cat
	has err "sbx: cat: missing operand"
	empty out
	run 2 cat "$D/a" "$D/b"
	has err "unexpected argument"
	run 2 cat --offset x "$D/a"
	run 2 cat --length -1 "$D/a"
	run 2 cat --bogus "$D/a"
	run 2 put --mode 999 "$D/a"
	has err "bad --mode '999'"
	run 2 put --mode rw "$D/a"
	run 2 stat -X "$D/a"
	run 2 exists
	run 2 ls --depth 0 "$D"
	run 2 ls --depth x "$D"
	run 2 mkdir -m 8 "$D/a"
	run 2 mkdir -m
	has err "needs an argument"
	run 2 mv "$D/a"
	run 2 cp -r "$D/a"
	run 2 chmod u+x "$D/a"
	has err "bad mode 'u+x'"
	run 2 chmod 10000 "$D/a"
	run 2 chown a:b "$D/a"
	run 2 chown 1:2:3 "$D/a"
	run 2 chown -1 "$D/a"
	run 2 chown 4294967295 "$D/a"
	run 2 chown 1: "$D/a"
	run 2 ln -s "$D/a"
	run 2 readlink
	run 2 realpath "$D/a" "$D/b"
	run 2 truncate "$D/a"
	has err "-s SIZE is required"
	run 2 truncate -s 1Q "$D/a"
	run 2 truncate -s -5 "$D/a"
	run 2 touch -d yesterday "$D/a"
	has err "bad time 'yesterday'"
	run 2 touch -d 2024-02-30T00:00:00Z "$D/a"
	run 2 touch -d 2023-02-29T00:00:00Z "$D/a"
	run 2 touch -d 2024-05-01T24:00:00Z "$D/a"
	run 2 touch -d 2024-05-01T12:00:00 "$D/a"
	run 2 touch -d 2024-05-01T12:00:00+2:00 "$D/a"
	run 2 touch -d 2024-05-01T12:00:00.Z "$D/a"
	run 2 df
	run 2 watch -x "$D"
	# nothing was created by any of them
	[ -z "$(ls -A "$D")" ] || fail "a usage error touched the filesystem: $(ls -A "$D")"
	run 0 cat --help
	has out "usage: sbx [OPTIONS] cat PATH [--offset N] [--length N]"
	run 0 --help
	for c in cat put stat exists ls mkdir rm mv cp chmod chown ln readlink truncate touch realpath df watch; do
		grep -q "^  $c " "$T/out" || fail "sbx --help does not list $c"
	done
	# no shim there: exit 3
	TARGET="unix:$T/missing" run 3 exists "$D"
	has err "cannot connect"
	TARGET="unix:$T/missing" run 3 cat "$D/a"
	TARGET="unix:$T/missing" run 3 watch "$D"
}

# leftovers: the names in $D that sec_cat_put did not create itself (temp files).
leftovers()
{
	local f
	for f in "$D"/* "$D"/.[!.]*; do
		[ -e "$f" ] || [ -L "$f" ] || continue
		case ${f##*/} in
		rand | empty | excl | app | m600 | p1 | fifo) ;;
		*) printf '%s ' "${f##*/}" ;;
		esac
	done
}

sec_cat_put()
{
	local ino1 ino2
	head -c 3000000 /dev/urandom >"$T/rand"
	IN=$T/rand run 0 put "$D/rand"
	empty out
	empty err
	cmp -s "$T/rand" "$D/rand" || fail "put: $D/rand differs from what was sent"
	run 0 cat "$D/rand"
	cmp -s "$T/rand" "$T/out" || fail "cat: the bytes differ from the file"
	empty err

	# ranges, with suffixes too
	# (a file first: head closing the pipe early would fail the pipeline under pipefail)
	run 0 cat --offset 1000 --length 5000 "$D/rand"
	tail -c +1001 "$T/rand" | head -c 5000 >"$T/want"
	cmp -s "$T/want" "$T/out" || fail "cat --offset 1000 --length 5000"
	run 0 cat --offset 1K --length 2K "$D/rand"
	tail -c +1025 "$T/rand" | head -c 2048 >"$T/want"
	cmp -s "$T/want" "$T/out" || fail "cat --offset 1K --length 2K"
	run 0 cat --offset 2999990 "$D/rand"
	tail -c 10 "$T/rand" | cmp -s - "$T/out" || fail "cat --offset to the end"
	run 0 cat --offset 5000000 "$D/rand"
	empty out
	run 0 cat --length 0 "$D/rand"
	empty out

	# empty file
	IN=/dev/null run 0 put "$D/empty"
	[ -f "$D/empty" ] && [ ! -s "$D/empty" ] || fail "put of nothing did not make an empty file"
	run 0 cat "$D/empty"
	empty out

	# errors: the message, the exit status, nothing on stdout
	run 1 cat "$D/nope"
	has err "sbx: ENOENT: $D/nope: No such file or directory"
	empty out
	run 1 cat "$D"
	has err "sbx: EISDIR: $D: Is a directory"
	run 1 cat "$D/rand/x"
	has err "sbx: ENOTDIR: "
	run 1 cat relative/path
	has err "sbx: EINVAL: relative/path"

	# --exclusive on an existing file: EEXIST, file unchanged
	printf 'other' >"$T/other"
	IN=$T/other run 1 put --exclusive "$D/rand"
	has err "sbx: EEXIST: $D/rand: File exists"
	cmp -s "$T/rand" "$D/rand" || fail "put --exclusive changed the existing file"
	IN=$T/other run 0 put --exclusive "$D/excl"
	[ "$(cat "$D/excl")" = other ] || fail "put --exclusive of a new file"

	# --append
	printf 'abc' >"$T/abc"
	IN=$T/abc run 0 put "$D/app"
	IN=$T/abc run 0 put --append "$D/app"
	[ "$(cat "$D/app")" = abcabc ] || fail "put --append: $(cat "$D/app")"

	# modes: given, kept, default
	IN=$T/abc run 0 put --mode 0600 "$D/m600"
	[ "$(stat -c %a "$D/m600")" = 600 ] || fail "put --mode 0600 gave $(stat -c %a "$D/m600")"
	chmod 640 "$D/app"
	IN=$T/abc run 0 put "$D/app"
	[ "$(stat -c %a "$D/app")" = 640 ] || fail "put did not keep mode 640: $(stat -c %a "$D/app")"
	[ "$(stat -c %a "$D/excl")" = 644 ] || fail "a new file is not 0644: $(stat -c %a "$D/excl")"

	# --parents
	IN=$T/abc run 1 put "$D/p1/p2/f"
	has err "sbx: ENOENT: "
	[ ! -e "$D/p1" ] || fail "put without --parents created $D/p1"
	IN=$T/abc run 0 put --parents "$D/p1/p2/f"
	[ "$(cat "$D/p1/p2/f")" = abc ] || fail "put --parents"

	# atomic by default (a new inode renamed over the old), in place with --no-atomic
	ino1=$(stat -c %i "$D/app")
	IN=$T/other run 0 put "$D/app"
	ino2=$(stat -c %i "$D/app")
	[ "$ino1" != "$ino2" ] || fail "put replaced the file in place, not atomically"
	IN=$T/abc run 0 put --no-atomic "$D/app"
	[ "$(stat -c %i "$D/app")" = "$ino2" ] || fail "put --no-atomic changed the inode"
	[ "$(cat "$D/app")" = abc ] || fail "put --no-atomic content: $(cat "$D/app")"
	# no temp files left beside them
	[ -z "$(leftovers)" ] || fail "leftovers in $D: $(leftovers)"

	# an error after the first bytes (here the call's timeout): exit 1, and stdout has exactly
	# the bytes read before it
	local wp spid rc
	mkfifo "$D/fifo"
	# a FIFO only with --special (issue 17): else EPERM naming the type, at once, and the
	# FIFO stays as it was (also for put and truncate)
	run 1 --timeout 5 cat "$D/fifo"
	has err "sbx: EPERM: "
	has err "a FIFO, not a regular file"
	IN=/dev/null run 1 --timeout 5 put --no-atomic "$D/fifo"
	has err "a FIFO, not a regular file"
	run 1 --timeout 5 truncate -s 0 "$D/fifo"
	has err "a FIFO, not a regular file"
	[ -p "$D/fifo" ] || fail "the FIFO is no longer a FIFO"
	(
		printf 'partial'
		exec sleep 10
	) >"$D/fifo" &
	wp=$!
	PIDS+=("$wp")
	run 1 --timeout 2 cat --special "$D/fifo"
	has err "sbx: ETIMEDOUT: "
	[ "$(cat "$T/out")" = partial ] || fail "cat cut off by an error wrote '$(cat -v "$T/out")', want 'partial'"
	kill "$wp"
	wait "$wp" 2>/dev/null

	# stdin fails (a directory): the write is abandoned and the old file kept
	IN=$D run 1 put "$D/rand"
	has err "EISDIR"
	cmp -s "$T/rand" "$D/rand" || fail "a put whose stdin failed changed the file"
	# put killed part way (SIGTERM: a background job of a script ignores SIGINT): the old
	# file stays as it was
	(
		head -c 100000 /dev/zero
		exec sleep 10
	) >"$D/fifo" &
	wp=$!
	PIDS+=("$wp")
	"$SBX" -t "$TARGET" put "$D/rand" <"$D/fifo" >"$T/out" 2>"$T/err" &
	spid=$!
	PIDS+=("$spid")
	sleep 0.5
	kill -TERM "$spid"
	wait "$spid"
	rc=$?
	[ "$rc" -eq 143 ] || fail "put killed by SIGTERM exited $rc"
	kill "$wp"
	wait "$wp" 2>/dev/null
	rm "$D/fifo"
	cmp -s "$T/rand" "$D/rand" || fail "an interrupted put changed the file"
	# the shim removes its temp file once it sees the connection gone
	for ((rc = 0; rc < 200; rc++)); do
		[ -z "$(leftovers)" ] && break
		sleep 0.01
	done
	[ "$rc" -lt 200 ] || fail "an interrupted put left: $(leftovers)"

	# --json: the stat of the file written
	IN=$T/abc run 0 --json put "$D/j"
	py 'import json,sys,os
d = json.load(open(sys.argv[1]))
st = os.lstat(sys.argv[2])
assert d["path"] == sys.argv[2] and d["type"] == "file" and d["size"] == 3, d
assert d["inode"] == st.st_ino and d["mode"] == 0o644, d' "$T/out" "$D/j"

	# a reader that goes away: exit 1 with the write error, no hang
	local st
	timeout -k 5 60 "$SBX" -t "$TARGET" cat "$D/rand" 2>"$T/err" | head -c 10 >/dev/null
	st=${PIPESTATUS[0]}
	[ "$st" -eq 1 ] || fail "cat into a closed pipe exited $st, want 1"
	has err "EPIPE"
	rm -f "$D"/{rand,empty,excl,app,m600,j} && rm -r "$D/p1"
}

sec_stat()
{
	printf '0123456789' >"$D/f"
	chmod 640 "$D/f"
	touch -h -d '2024-05-01 12:34:56.123456789Z' "$D/f"
	ln -s f "$D/lnk"
	run 0 stat "$D/f"
	has out "path:          $D/f"
	has out "type:          file"
	has out "size:          10"
	has out "mode:          0640 (-rw-r-----)"
	has out "uid/gid:       $(id -u)/$(id -g)"
	has out "links:         1"
	has out "inode:         $(stat -c %i "$D/f")"
	has out "device:        $(stat -c %d "$D/f") ($(stat -c %Hd:%Ld "$D/f"))"
	has out "modify:        2024-05-01T12:34:56.123456789Z"
	grep -qE '^access: +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{9}Z$' "$T/out" ||
		fail "stat: no RFC 3339 access time"
	grep -qE '^change: +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{9}Z$' "$T/out" ||
		fail "stat: no RFC 3339 change time"
	hasnt out "link target"

	# the link itself, then through it with -L
	run 0 stat "$D/lnk"
	has out "type:          symlink"
	has out "link target:   f"
	has out "size:          1"
	has out "mode:          0777 (lrwxrwxrwx)"
	run 0 stat -L "$D/lnk"
	has out "type:          file"
	has out "size:          10"
	has out "inode:         $(stat -c %i "$D/f")"
	hasnt out "link target"
	run 0 stat --dereference "$D/lnk"
	has out "type:          file"

	# other types, with their snake_case names
	mkfifo "$D/fifo"
	python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$D/sock"
	run 0 stat "$D/fifo"
	has out "type:          fifo"
	run 0 stat "$D/sock"
	has out "type:          socket"
	run 0 stat "$D"
	has out "type:          directory"
	run 0 stat /dev/null
	has out "type:          character_device"
	has out "device type:   1:3"

	# --json agrees with lstat(2)/stat(2)
	run 0 --json stat "$D/f"
	py 'import json,sys,os
d = json.load(open(sys.argv[1]))
st = os.lstat(sys.argv[2])
assert d["path"] == sys.argv[2] and d["type"] == "file", d
assert d["size"] == 10 and d["mode"] == 0o640 and d["mode_octal"] == "0640", d
assert (d["uid"], d["gid"], d["nlink"], d["inode"], d["device"]) == (st.st_uid, st.st_gid, 1, st.st_ino, st.st_dev), d
assert d["blocks"] == st.st_blocks, d
assert d["mtime"] == "2024-05-01T12:34:56.123456789Z", d
assert (d["mtime_sec"], d["mtime_nsec"]) == (1714566896, 123456789), d
assert d["atime_sec"] * 10**9 + d["atime_nsec"] == st.st_atime_ns, d
assert d["ctime_sec"] * 10**9 + d["ctime_nsec"] == st.st_ctime_ns, d
assert d["link_target"] is None, d' "$T/out" "$D/f"
	run 0 --json stat "$D/lnk"
	py 'import json,sys
d = json.load(open(sys.argv[1]))
assert d["type"] == "symlink" and d["link_target"] == "f" and d["size"] == 1, d' "$T/out"
	run 0 --json stat -L "$D/lnk"
	py 'import json,sys
d = json.load(open(sys.argv[1]))
assert d["type"] == "file" and d["link_target"] is None and d["size"] == 10, d' "$T/out"

	# errors
	run 1 stat "$D/nope"
	has err "sbx: ENOENT: $D/nope: No such file or directory"
	empty out
	ln -s nowhere "$D/dangling"
	run 0 stat "$D/dangling"
	run 1 stat -L "$D/dangling"
	has err "sbx: ENOENT: $D/dangling"
	ln -s loop "$D/loop"
	run 1 stat -L "$D/loop"
	has err "sbx: ELOOP: "
	run 1 stat "$D/f/x"
	has err "sbx: ENOTDIR: "

	# exists: 0 if it is there (a dangling symlink is), 1 if not, nothing printed
	run 0 exists "$D/f"
	empty out
	empty err
	run 0 exists "$D/dangling"
	run 0 exists "$D"
	run 1 exists "$D/nope"
	empty out
	empty err
	run 1 exists "$D/f/x"
	empty err
	run 1 exists relative
	has err "EINVAL"
	rm -f "$D"/{f,lnk,fifo,sock,dangling,loop}
}

sec_ls()
{
	local L=$D/l
	mkdir -p "$L/sub/deeper"
	: >"$L/a b"
	printf 'xyz' >"$L/new
line"
	: >"$L/back\\slash"
	: >"$L/.hidden"
	: >"$L/$(printf 'tab\there')"
	: >"$L/$(printf 'bad\377utf8')"
	: >"$L/$(printf 'caf\303\251')"
	: >"$L/sub/inner"
	: >"$L/sub/deeper/x"
	ln -s "a b" "$L/link"

	run 0 ls "$L"
	sort "$T/out" >"$T/sorted"
	printf '%s\n' 'a b' 'back\\slash' 'bad\377utf8' "$(printf 'caf\303\251')" 'link' 'new\nline' 'sub' \
		'tab\there' | sort >"$T/want"
	cmp -s "$T/sorted" "$T/want" || fail "ls printed: $(cat -A "$T/out")"

	run 0 ls -a "$L"
	grep -qx '.hidden' "$T/out" || fail "ls -a does not show .hidden"
	[ "$(wc -l <"$T/out")" -eq 9 ] || fail "ls -a printed $(wc -l <"$T/out") lines, want 9"

	# depth: 1 by default, N with --depth, unlimited with -R
	run 0 ls --depth 2 "$L"
	grep -qx 'sub/inner' "$T/out" || fail "ls --depth 2 does not show sub/inner"
	grep -qx 'sub/deeper' "$T/out" || fail "ls --depth 2 does not show sub/deeper"
	! grep -q 'sub/deeper/x' "$T/out" || fail "ls --depth 2 went 3 deep"
	run 0 ls -R "$L"
	grep -qx 'sub/deeper/x' "$T/out" || fail "ls -R does not show sub/deeper/x"
	[ "$(wc -l <"$T/out")" -eq 11 ] || fail "ls -R printed $(wc -l <"$T/out") lines, want 11"
	run 0 ls -R --depth 1 "$L"
	! grep -q '/' "$T/out" || fail "ls -R --depth 1 recursed"

	# -l: type and mode, size, mtime, name, symlink target
	touch -d '2024-05-01 12:34:56Z' "$L/new
line"
	run 0 ls -l "$L"
	grep -qxE -- '-rw-r--r-- +3 2024-05-01T12:34:56Z new\\nline' "$T/out" || fail "ls -l: no line for new\\nline"
	grep -qxE -- 'drwxr-xr-x +[0-9]+ [0-9T:-]+Z sub' "$T/out" || fail "ls -l: no line for sub"
	grep -qxE -- 'lrwxrwxrwx +3 [0-9T:-]+Z link -> a b' "$T/out" || fail "ls -l: no line for link"

	# --json: NDJSON, names exact (invalid UTF-8 as \u00XX)
	run 0 --json ls -a "$L"
	py 'import json,sys,os
lines = open(sys.argv[1], "rb").read().decode("utf-8").splitlines()
objs = [json.loads(l) for l in lines]
names = sorted(o["name"] for o in objs)
want = sorted(["a b", "new\nline", "back\\slash", ".hidden", "tab\there", "bad\u00ffutf8", "caf\u00e9", "sub", "link"])
assert names == want, names
for o in objs:
    if o["name"] == "new\nline":
        assert o["type"] == "file" and o["size"] == 3 and o["mtime_sec"] == 1714566896, o
    if o["name"] == "sub":
        assert o["type"] == "directory", o
    if o["name"] == "link":
        assert o["type"] == "symlink" and o["link_target"] == "a b", o
assert "\\u00ff" in open(sys.argv[1], encoding="utf-8").read()' "$T/out"
	run 0 --json ls -R "$L"
	[ "$(wc -l <"$T/out")" -eq 11 ] || fail "ls --json -R printed $(wc -l <"$T/out") lines, want 11"

	# symlinks are not followed
	ln -s sub "$L/sublink"
	run 0 ls -R "$L"
	! grep -q '^sublink/' "$T/out" || fail "ls -R followed a symlink"

	# errors
	run 1 ls "$D/nope"
	has err "sbx: ENOENT: $D/nope: No such file or directory"
	empty out
	run 1 ls "$L/a b"
	has err "sbx: ENOTDIR: "
	rm -rf "$L"
}

sec_mkdir_rm()
{
	run 0 mkdir "$D/m"
	empty out
	[ -d "$D/m" ] && [ "$(stat -c %a "$D/m")" = 755 ] || fail "mkdir: not a 0755 directory"
	run 1 mkdir "$D/m"
	has err "sbx: EEXIST: $D/m: File exists"
	run 0 mkdir -p "$D/m"
	run 0 mkdir -p "$D/m/a/b/c"
	[ -d "$D/m/a/b/c" ] || fail "mkdir -p did not create the parents"
	run 1 mkdir "$D/n/a"
	has err "sbx: ENOENT: "
	run 0 mkdir -m 0700 "$D/m700"
	[ "$(stat -c %a "$D/m700")" = 700 ] || fail "mkdir -m 0700 gave $(stat -c %a "$D/m700")"
	run 0 mkdir -p -m 711 "$D/pm/x"
	[ "$(stat -c %a "$D/pm/x")" = 711 ] || fail "mkdir -p -m 711 gave $(stat -c %a "$D/pm/x")"

	: >"$D/m/a/file"
	run 0 rm "$D/m/a/file"
	[ ! -e "$D/m/a/file" ] || fail "rm left the file"
	run 1 rm "$D/m/a/file"
	has err "sbx: ENOENT: $D/m/a/file: No such file or directory"
	run 1 rm "$D/m"
	[ -d "$D/m/a/b/c" ] || fail "a failed rm removed something"
	run 0 rm "$D/m/a/b/c"
	[ ! -e "$D/m/a/b/c" ] || fail "rm of an empty directory left it"
	: >"$D/m/a/b/f"
	run 0 rm -r "$D/m"
	[ ! -e "$D/m" ] || fail "rm -r left $D/m"
	ln -s "$D/m700" "$D/l700"
	run 0 rm -r "$D/l700"
	[ -d "$D/m700" ] && [ ! -L "$D/l700" ] || fail "rm -r of a symlink to a directory"
	rm -rf "$D/m700" "$D/pm"
}

sec_mv_cp()
{
	local C=$D/c
	mkdir -p "$C/tree/sub"
	head -c 100000 /dev/urandom >"$C/tree/data"
	printf 'hello' >"$C/tree/sub/h"
	chmod 600 "$C/tree/sub/h"
	touch -d '2020-01-02 03:04:05.5Z' "$C/tree/data"
	ln -s sub/h "$C/tree/rel"

	run 0 mv "$C/tree/data" "$C/moved"
	empty out
	[ ! -e "$C/tree/data" ] && [ -f "$C/moved" ] || fail "mv: the file did not move"
	run 0 mv "$C/moved" "$C/tree/data"
	run 1 mv "$C/nope" "$C/x"
	has err "sbx: ENOENT: "
	run 1 mv "$C/tree/data" "$C/nodir/x"
	[ -f "$C/tree/data" ] || fail "a failed mv lost the file"

	run 0 cp "$C/tree/data" "$C/copy"
	cmp -s "$C/tree/data" "$C/copy" || fail "cp: the copy differs"
	[ "$(stat -c %Y "$C/copy")" = "$(stat -c %Y "$C/tree/data")" ] || fail "cp did not keep the mtime"
	run 0 cp "$C/tree/sub/h" "$C/h600"
	[ "$(stat -c %a "$C/h600")" = 600 ] || fail "cp did not keep mode 0600"
	run 1 cp "$C/tree" "$C/tree2"
	[ ! -e "$C/tree2" ] || fail "cp of a directory without -r created it"
	run 0 cp -r "$C/tree" "$C/tree2"
	diff -r "$C/tree" "$C/tree2" >/dev/null || fail "cp -r: the trees differ"
	[ "$(readlink "$C/tree2/rel")" = sub/h ] || fail "cp -r did not copy the symlink as a symlink"
	run 1 cp -r "$C/tree" "$C/tree/sub/inside"
	has err "sbx: EINVAL: "
	run 1 cp "$C/nope" "$C/x"
	has err "sbx: ENOENT: "
	rm -rf "$C"
}

sec_attrs()
{
	: >"$D/a"
	run 0 chmod 0640 "$D/a"
	empty out
	[ "$(stat -c %a "$D/a")" = 640 ] || fail "chmod 0640 gave $(stat -c %a "$D/a")"
	run 0 chmod 4755 "$D/a"
	[ "$(stat -c %a "$D/a")" = 4755 ] || fail "chmod 4755 gave $(stat -c %a "$D/a")"
	run 0 chmod 7 "$D/a"
	[ "$(stat -c %a "$D/a")" = 7 ] || fail "chmod 7 gave $(stat -c %a "$D/a")"
	run 1 chmod 644 "$D/nope"
	has err "sbx: ENOENT: $D/nope: No such file or directory"

	if [ "$(id -u)" -eq 0 ]; then
		run 0 chown 1234:5678 "$D/a"
		[ "$(stat -c %u:%g "$D/a")" = 1234:5678 ] || fail "chown 1234:5678 gave $(stat -c %u:%g "$D/a")"
		run 0 chown :4321 "$D/a"
		[ "$(stat -c %u:%g "$D/a")" = 1234:4321 ] || fail "chown :4321 gave $(stat -c %u:%g "$D/a")"
		run 0 chown 99 "$D/a"
		[ "$(stat -c %u:%g "$D/a")" = 99:4321 ] || fail "chown 99 gave $(stat -c %u:%g "$D/a")"
	else
		run 0 chown "$(id -u):$(id -g)" "$D/a"
		run 1 chown 0 "$D/a"
		has err "sbx: EPERM: "
	fi
	run 1 chown 1 "$D/nope"
	has err "sbx: ENOENT: "

	# links
	run 0 ln -s "../some target" "$D/sl"
	[ "$(readlink "$D/sl")" = "../some target" ] || fail "ln -s stored '$(readlink "$D/sl")'"
	run 0 readlink "$D/sl"
	out_is "../some target"
	run 0 --json readlink "$D/sl"
	out_is '{"target":"../some target"}'
	run 1 ln -s x "$D/sl"
	has err "sbx: EEXIST: "
	run 1 readlink "$D/a"
	has err "sbx: EINVAL: "
	run 1 readlink "$D/nope"
	has err "sbx: ENOENT: "
	run 0 ln "$D/a" "$D/hard"
	[ "$(stat -c %i "$D/hard")" = "$(stat -c %i "$D/a")" ] || fail "ln: not the same inode"
	[ "$(stat -c %h "$D/a")" = 2 ] || fail "ln: link count $(stat -c %h "$D/a")"
	run 1 ln "$D/nope" "$D/hard2"
	has err "sbx: ENOENT: "

	# realpath
	mkdir -p "$D/rp/dir"
	ln -s dir "$D/rp/l"
	run 0 realpath "$D/rp/l/../l/./"
	out_is "$D/rp/dir"
	run 0 --json realpath "$D/rp/l"
	out_is "{\"path\":\"$D/rp/dir\"}"
	run 1 realpath "$D/rp/nope"
	has err "sbx: ENOENT: "

	# truncate, past 4 GiB too (sparse)
	printf '0123456789' >"$D/t"
	run 0 truncate -s 4 "$D/t"
	[ "$(cat "$D/t")" = 0123 ] || fail "truncate -s 4 left '$(cat "$D/t")'"
	run 0 truncate -s 1K "$D/t"
	[ "$(stat -c %s "$D/t")" = 1024 ] || fail "truncate -s 1K gave $(stat -c %s "$D/t")"
	run 0 truncate -s 5G "$D/t"
	[ "$(stat -c %s "$D/t")" = 5368709120 ] || fail "truncate -s 5G gave $(stat -c %s "$D/t")"
	run 0 cat --offset 5368709110 "$D/t"
	head -c 10 /dev/zero | cmp -s - "$T/out" || fail "cat past 4 GiB"
	run 0 truncate --size 0 "$D/t"
	[ ! -s "$D/t" ] || fail "truncate -s 0"
	run 1 truncate -s 1 "$D/nope"
	has err "sbx: ENOENT: "
	run 1 truncate -s 1 "$D/rp"
	has err "sbx: EISDIR: "

	# touch: given times exactly (both atime and mtime), offsets, before 1970, now, creation
	run 0 touch -d 2024-05-01T12:34:56.123456789Z "$D/a"
	empty out
	run 0 --json stat "$D/a"
	py 'import json,sys
d = json.load(open(sys.argv[1]))
assert (d["mtime_sec"], d["mtime_nsec"]) == (1714566896, 123456789), d
assert (d["atime_sec"], d["atime_nsec"]) == (1714566896, 123456789), d
assert d["mtime"] == "2024-05-01T12:34:56.123456789Z", d' "$T/out"
	[ "$(stat -c %.9Y "$D/a")" = 1714566896.123456789 ] || fail "touch -d: mtime is $(stat -c %.9Y "$D/a")"
	run 0 touch -d 2024-05-01T12:34:56.5+02:00 "$D/a"
	run 0 --json stat "$D/a"
	py 'import json,sys
d = json.load(open(sys.argv[1]))
assert (d["mtime_sec"], d["mtime_nsec"]) == (1714566896 - 7200, 500000000), d' "$T/out"
	run 0 touch -d "2024-05-01 12:34:56-05:30" "$D/a"
	[ "$(stat -c %Y "$D/a")" = $((1714566896 + 5 * 3600 + 1800)) ] || fail "touch -d -05:30: $(stat -c %Y "$D/a")"
	run 0 touch -d 2024-02-29t00:00:00z "$D/a"
	[ "$(stat -c %Y "$D/a")" = 1709164800 ] || fail "touch -d 2024-02-29: $(stat -c %Y "$D/a")"
	run 0 touch -d 1969-12-31T23:59:59.25Z "$D/a"
	run 0 --json stat "$D/a"
	py 'import json,sys
d = json.load(open(sys.argv[1]))
assert (d["mtime_sec"], d["mtime_nsec"]) == (-1, 250000000), d
assert d["mtime"] == "1969-12-31T23:59:59.250000000Z", d' "$T/out"
	run 0 touch "$D/a"
	[ $(($(date +%s) - $(stat -c %Y "$D/a"))) -le 60 ] || fail "touch did not set now: $(stat -c %Y "$D/a")"
	run 0 touch -d 2001-09-09T01:46:40Z "$D/new"
	[ -f "$D/new" ] && [ ! -s "$D/new" ] && [ "$(stat -c %Y "$D/new")" = 1000000000 ] ||
		fail "touch did not create $D/new with the time"
	run 1 touch "$D/nodir/x"
	has err "sbx: ENOENT: "
	rm -rf "$D"/{a,hard,sl,rp,t,new}
}

sec_df()
{
	run 0 df "$D"
	has out "1K-blocks"
	has out "IUse%"
	[ "$(wc -l <"$T/out")" -eq 2 ] || fail "df printed $(wc -l <"$T/out") lines"
	[ "$(tail -n 1 "$T/out" | awk '{print $1}')" = "$(df -k --output=size "$D" | tail -n 1 | tr -d ' ')" ] ||
		fail "df size differs from df(1): $(df -k "$D" | tail -n 1)"
	[ "$(tail -n 1 "$T/out" | awk '{print $5}')" = "$(df -i "$D" | tail -n 1 | awk '{print $2}')" ] ||
		fail "df inodes differ from df(1): $(df -i "$D" | tail -n 1)"
	tail -n 1 "$T/out" | grep -q " $D\$" || fail "df: the line does not end with the path"
	run 0 --json df "$D"
	py 'import json,sys,os
d = json.load(open(sys.argv[1]))
s = os.statvfs(sys.argv[2])
assert d["path"] == sys.argv[2], d
assert d["block_size"] == s.f_frsize and d["blocks"] == s.f_blocks and d["files"] == s.f_files, d
assert d["name_max"] == s.f_namemax and d["size_bytes"] == s.f_blocks * s.f_frsize, d
for k in ("blocks_free", "blocks_available", "files_free", "fs_type", "flags", "used_bytes", "available_bytes"):
    assert isinstance(d[k], int), k' "$T/out" "$D"
	run 1 df "$D/nope"
	has err "sbx: ENOENT: "
}

# wait_line FILE PATTERN [TRIES]: wait up to TRIES/100 s (default 10 s) for a line matching the
# grep -E PATTERN.
wait_line()
{
	local i
	for ((i = 0; i < ${3:-1000}; i++)); do
		grep -qE -- "$2" "$1" && return 0
		sleep 0.01
	done
	return 1
}

# watch_ready FILE DIR: create probe files in DIR until the watch writing FILE reports one
# (there is no "ready" signal: a watch is established once it sees events).
watch_ready()
{
	local i
	for ((i = 0; i < 50; i++)); do
		: >"$2/probe"
		rm -f "$2/probe"
		wait_line "$1" "(^create |\"path\":\")$2/probe" 20 && return 0
	done
	return 1
}

sec_watch()
{
	local W=$D/w wpid rc
	mkdir "$W"
	"$SBX" -t "$TARGET" watch -r "$W" >"$T/watch.out" 2>"$T/watch.err" &
	wpid=$!
	PIDS+=("$wpid")
	watch_ready "$T/watch.out" "$W" || fail "watch -r: no event for a probe file within 10 s"
	mkdir "$W/sub"
	wait_line "$T/watch.out" "^create $W/sub\$" || fail "watch -r: no 'create $W/sub'"
	# the new directory gets its own watch: probe it too
	watch_ready "$T/watch.out" "$W/sub" || fail "watch -r: new subdirectory not watched"
	: >"$W/sub/f"
	echo data >>"$W/sub/f"
	chmod 600 "$W/sub/f"
	mv "$W/sub/f" "$W/g"
	rm "$W/g"
	: >"$W/name
with newline"
	wait_line "$T/watch.out" "^delete $W/g\$" || fail "watch -r: no 'delete $W/g'"
	wait_line "$T/watch.out" "^create $W/name\\\\nwith newline\$" || fail "watch: name with a newline"
	kill -INT "$wpid"
	wait "$wpid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "watch exited $rc after SIGINT, want 0: $(cat "$T/watch.err")"
	[ ! -s "$T/watch.err" ] || fail "watch wrote on stderr: $(cat "$T/watch.err")"
	for want in "create $W/sub/f" "modify $W/sub/f" "attrib $W/sub/f" "moved_from $W/sub/f" \
		"moved_to $W/g" "delete $W/g"; do
		grep -qx -- "$want" "$T/watch.out" || fail "watch: no line '$want' in: $(head -c 1500 "$T/watch.out")"
	done
	grep -vqE '^(create|modify|delete|moved_from|moved_to|attrib|overflow|delete_self)( |$)' "$T/watch.out" &&
		fail "watch: a line that is not 'TYPE PATH': $(grep -vE '^[a-z_]+ ' "$T/watch.out" | head -n 3)"

	# --json: one object per line; SIGTERM ends it cleanly too
	"$SBX" --json -t "$TARGET" watch "$W" >"$T/watch.out" 2>"$T/watch.err" &
	wpid=$!
	PIDS+=("$wpid")
	watch_ready "$T/watch.out" "$W" || fail "watch --json: no event for a probe file within 10 s"
	: >"$W/j"
	wait_line "$T/watch.out" "\"path\":\"$W/j\"" || fail "watch --json: no event for $W/j"
	kill -TERM "$wpid"
	wait "$wpid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "watch --json exited $rc after SIGTERM, want 0: $(cat "$T/watch.err")"
	py 'import json,sys
objs = [json.loads(l) for l in open(sys.argv[1])]
assert objs, "no events"
for o in objs:
    assert set(o) == {"type", "path", "is_dir", "cookie"}, o
assert any(o["type"] == "create" and o["path"] == sys.argv[2] and o["is_dir"] is False for o in objs), objs' \
		"$T/watch.out" "$W/j"

	# the watched directory goes away: the watch ends by itself, exit 0
	"$SBX" -t "$TARGET" watch "$W/sub" >"$T/watch.out" 2>"$T/watch.err" &
	wpid=$!
	PIDS+=("$wpid")
	watch_ready "$T/watch.out" "$W/sub" || fail "watch: no event for a probe file within 10 s"
	rmdir "$W/sub"
	for ((rc = 0; rc < 1000; rc++)); do
		kill -0 "$wpid" 2>/dev/null || break
		sleep 0.01
	done
	if kill -0 "$wpid" 2>/dev/null; then
		fail "watch did not end when its directory was removed"
		kill -INT "$wpid"
	fi
	wait "$wpid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "watch of a removed directory exited $rc: $(cat "$T/watch.err")"
	grep -qx "delete_self $W/sub" "$T/watch.out" || fail "watch: no 'delete_self $W/sub'"

	run 1 watch "$D/nope"
	has err "sbx: ENOENT: "
	rm -rf "$W"
}

sec_root()
{
	local R=$T/root pid_saved=$DPID target_saved=$TARGET
	mkdir "$R"
	start_daemon rooted --listen "unix:$T/rs" --root "$R"
	TARGET="unix:$T/rs"
	printf 'inside' >"$T/in"
	IN=$T/in run 0 put /f
	[ "$(cat "$R/f")" = inside ] || fail "--root: put /f did not land in the root"
	run 0 cat /../../f
	[ "$(cat "$T/out")" = inside ] || fail "--root: cat /../../f gave '$(cat "$T/out")'"
	run 0 ls /
	out_is f
	# a symlink to / leads to the root, not to the host's /
	printf 'secret' >"$T/secret"
	ln -s / "$R/up"
	run 1 cat "/up$T/secret"
	has err "sbx: ENOENT: "
	empty out
	run 1 stat "/..$T/secret"
	has err "sbx: ENOENT: "
	kill -TERM "$DPID"
	wait "$DPID" || fail "the --root daemon did not exit 0"
	DPID=$pid_saved
	TARGET=$target_saved
}

# --as, --no-follow, --no-symlinks (PROTOCOL.md 12.1.1): as nobody, root's files are refused
# with the kernel's errno, before or after the command; what nobody writes is nobody's.
sec_as()
{
	local A
	if [ "$(id -u)" -ne 0 ]; then
		echo "cli_fs: as: needs root: skipped"
		return 0
	fi
	A=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-as.XXXXXX") || {
		fail "mktemp"
		return 1
	}
	A=$(cd "$A" && pwd -P)
	chmod 0711 "$A" # nobody gets through to the files, not to the names
	printf 'top secret\n' >"$A/secret"
	chmod 0600 "$A/secret"
	printf 'public\n' >"$A/pub"
	chmod 0644 "$A/pub"
	mkdir "$A/mine"
	chown 65534:65534 "$A/mine"

	run 1 --as nobody cat "$A/secret"
	has err "sbx: EACCES: $A/secret: Permission denied"
	empty out
	run 1 cat "$A/secret" --as nobody
	has err "sbx: EACCES: $A/secret: Permission denied"
	empty out
	run 1 cat --as 65534:65534 "$A/secret"
	has err "sbx: EACCES: "
	run 0 --as nobody cat "$A/pub"
	out_is public
	run 0 cat "$A/secret"
	out_is "top secret"
	printf 'new' >"$T/in"
	IN=$T/in run 1 --as nobody put "$A/new"
	has err "sbx: EACCES: $A/new: Permission denied"
	IN=$T/in run 1 put "$A/pub" --as nobody
	has err "sbx: EACCES: "
	run 1 --as nobody chmod 0666 "$A/secret"
	has err "sbx: EPERM: $A/secret: Operation not permitted"
	run 1 --as nobody rm "$A/pub"
	has err "sbx: EACCES: "
	[ "$(stat -c '%a %u %s' "$A/secret" "$A/pub" | tr '\n' ' ')" = "600 0 11 644 0 7 " ] ||
		fail "--as nobody changed root's files: $(stat -c '%n %a %u %s' "$A/secret" "$A/pub")"
	[ "$(ls -A "$A" | tr '\n' ' ')" = "mine pub secret " ] || fail "--as nobody left $(ls -A "$A")"
	IN=$T/in run 0 --as nobody put "$A/mine/f"
	[ "$(stat -c '%u:%g %a' "$A/mine/f")" = "65534:65534 644" ] ||
		fail "a file put as nobody is $(stat -c '%u:%g %a' "$A/mine/f")"
	run 0 --as nobody --json stat "$A/mine/f"
	has out '"uid":65534'

	# bad input
	run 1 --as nosuchuser_h2x cat "$A/pub"
	has err "sbx: EINVAL: nosuchuser_h2x: Invalid argument (unknown user nosuchuser_h2x)"
	run 1 --as nobody:nosuchgroup_h2x cat "$A/pub"
	has err "unknown group nosuchgroup_h2x"
	run 2 --as nobody cat "$A/pub" --as root
	has err "option '--as' given both before and after the command"
	empty out
	run 2 --no-follow cat "$A/pub" --no-follow
	has err "option '--no-follow' given both before and after the command"
	run 2 --no-symlinks cat --no-symlinks "$A/pub"
	has err "option '--no-symlinks' given both before and after the command"
	run 2 --as "" cat "$A/pub"
	has err "bad --as ''"
	run 2 --as nobody: cat "$A/pub"
	has err "bad --as 'nobody:'"
	run 2 --as :root cat "$A/pub"
	has err "bad --as ':root'"
	run 2 --as nobody exec -- true
	has err "--as: 'exec' does no file operations"
	run 2 ping --no-follow
	has err "--no-follow: 'ping' does no file operations"
	run 2 cat "$A/pub" --as
	has err "needs an argument"
	run 0 --no-follow --no-symlinks cat "$A/pub"
	out_is public
	rm -rf "$A"
}

# ---- main ----

start_daemon shim --listen "unix:$T/s"
TARGET="unix:$T/s"
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage cat_put stat ls mkdir_rm mv_cp attrs df watch root as)
run_sections "${SECTIONS[@]}"
stop_daemon
finish cli_fs
