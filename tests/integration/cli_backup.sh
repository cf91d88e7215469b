#!/usr/bin/env bash
# cli_backup.sh: sbx backup and sbx restore against a real daemon: archives on stdout and in files,
# the record as JSON, restores from stdin and files, --merge, --sha256, --to/--from, terminals,
# --skip-unreadable and --one-file-system.
#
# Usage: bash cli_backup.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own daemon in a mktemp -d directory (with --state-dir there) and stops only it, by PID.
# Every section runs even when an earlier one failed; the script exits 1 if any check failed, 77 if
# the daemon has no backups yet (ENOSYS).
set -uo pipefail

SHIM=${1:?usage: cli_backup.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_backup.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-backup.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
D=$T/src
# cleanup, fail, start_daemon, run, has, hasnt, empty, py
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"
RUN_TIMEOUT=120

# record_ok JSON_FILE ARCHIVE COMPRESSION: the record is one JSON object whose bytes and sha256
# are the archive's.
record_ok()
{
	local sha size
	sha=$(sha256sum "$2" | cut -d' ' -f1)
	size=$(stat -c %s "$2")
	py '
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "want one line, got %r" % lines
r = json.loads(lines[0])
keys = {"id", "dir", "bytes", "sha256", "entries", "source_bytes", "compression", "skipped", "changed", "created_at"}
assert keys <= set(r), "missing keys: %s" % (keys - set(r))
assert r["sha256"] == sys.argv[2], "sha256 %s, file %s" % (r["sha256"], sys.argv[2])
assert r["bytes"] == int(sys.argv[3]), "bytes %s, file %s" % (r["bytes"], sys.argv[3])
assert r["compression"] == sys.argv[4], r["compression"]
assert r["dir"] == sys.argv[5], r["dir"]
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", r["created_at"]), r["created_at"]
assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r["id"]), r["id"]
assert r["entries"] >= 8 and r["source_bytes"] > 0, r
' "$1" "$sha" "$size" "$3" "$D"
}

# same_tree A B: same names, types and contents.
same_tree()
{
	diff -r --no-dereference "$1" "$2" >"$T/diff" 2>&1 || fail "trees $1 and $2 differ: $(head -n 5 "$T/diff")"
}

# only_names DIR NAMES...: DIR holds exactly these names (no temporary leftovers).
only_names()
{
	local dir=$1 got want
	shift
	got=$(ls -A "$dir" | sort | tr '\n' ' ')
	want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
	[ "$got" = "$want" ] || fail "$dir holds '$got', want '$want'"
}

# the source tree: files, an empty file and directory, a symlink, a hard link, a log file to exclude
make_tree()
{
	mkdir -p "$D/sub/deep" "$D/empty"
	head -c 300000 /dev/urandom >"$D/rand"
	printf 'hello\n' >"$D/a.txt"
	: >"$D/zero"
	printf 'deep\n' >"$D/sub/deep/f"
	printf 'noise\n' >"$D/sub/x.log"
	ln -s a.txt "$D/link"
	ln "$D/a.txt" "$D/hard"
	chmod 0640 "$D/sub/deep/f"
}

# ---- sections ----

sec_usage()
{
	mkdir -p "$T/u"
	cd "$T/u" || return
	run 2 backup
	has err "sbx: backup: missing operand"
	empty out
	run 2 backup "$D" "$D"
	has err "unexpected argument"
	run 2 backup --compress lz4 "$D"
	has err "bad --compress 'lz4'"
	run 2 backup --compress zstd --level x "$D"
	has err "bad --level 'x'"
	run 2 backup --level 3 "$D"
	has err "--level needs --compress"
	run 2 backup -o f.tar --to /x.tar "$D"
	has err "exclusive"
	run 2 backup --json "$D"
	has err "--json"
	run 2 backup --bogus "$D"
	run 2 backup -o
	has err "needs an argument"
	run 2 restore
	has err "sbx: restore: missing operand"
	run 2 restore --sha256 xyz "$D"
	has err "bad --sha256 'xyz'"
	run 2 restore --sha256 "$(printf '%063d' 0)" "$D"
	run 2 restore -i f.tar --from /x.tar "$D"
	has err "exclusive"
	run 2 restore --bogus "$D"
	# nothing was created by any of them
	[ -z "$(ls -A "$T/u")" ] || fail "a usage error touched the filesystem: $(ls -A "$T/u")"
	run 0 backup --help
	has out "usage: sbx [OPTIONS] backup DIR [-o FILE|-]"
	run 0 restore --help
	has out "usage: sbx [OPTIONS] restore DIR [-i FILE|-]"
	run 0 --help
	for c in backup restore; do
		grep -q "^  $c " "$T/out" || fail "sbx --help does not list $c"
	done
	# no shim there: exit 3, and no file left behind
	TARGET="unix:$T/missing" run 3 backup "$D" -o "$T/u/f.tar"
	has err "cannot connect"
	TARGET="unix:$T/missing" run 3 restore "$T/u/r"
	[ -z "$(ls -A "$T/u")" ] || fail "a failed connect left: $(ls -A "$T/u")"
	# a local input that does not exist: exit 1 before connecting
	run 1 restore -i "$T/u/nope.tar" "$T/u/r"
	has err "nope.tar"
	cd "$T" || return
}

sec_stdout()
{
	# the default: the archive on stdout, the record on stderr
	OUT=$T/a.tar run 0 backup "$D"
	tar -tvf "$T/a.tar" >"$T/list" 2>&1 || fail "tar -tvf failed: $(head -n 3 "$T/list")"
	for f in a.txt rand zero sub/deep/f sub/x.log link hard empty/; do
		grep -qE "(^| |\./)$f( |$)" "$T/list" || grep -qE " (\./)?$f( ->| link to|$)" "$T/list" ||
			fail "tar -tvf does not list $f: $(cat "$T/list")"
	done
	record_ok "$T/err" "$T/a.tar" none
	# -o - is the same
	OUT=$T/b.tar run 0 backup -o - "$D"
	tar -tf "$T/b.tar" >/dev/null || fail "-o -: not a tar archive"
	record_ok "$T/err" "$T/b.tar" none
	# excludes, compressed with gzip
	OUT=$T/c.tar.gz run 0 backup --exclude '*.log' --exclude empty --compress gzip "$D"
	gzip -t "$T/c.tar.gz" || fail "--compress gzip: not gzip"
	tar -tzf "$T/c.tar.gz" >"$T/list" || fail "tar -tzf failed"
	grep -q 'x\.log' "$T/list" && fail "--exclude '*.log' did not exclude sub/x.log"
	grep -q 'empty' "$T/list" && fail "--exclude empty did not exclude empty/"
	grep -q 'deep/f' "$T/list" || fail "sub/deep/f is missing"
	record_ok "$T/err" "$T/c.tar.gz" gzip
	# a reader that goes away: a write error, exit 1
	timeout -k 5 60 "$SBX" -t "$TARGET" backup "$D" 2>"$T/err" | head -c 1000 >/dev/null
	rc=${PIPESTATUS[0]}
	[ "$rc" -eq 1 ] || fail "backup into a closed pipe exited $rc, want 1"
	has err "EPIPE"
	# no such directory
	OUT=$T/n.tar run 1 backup "$T/nope"
	has err "ENOENT"
	[ ! -s "$T/n.tar" ] || fail "a failed backup wrote to stdout"
	# interrupted while stdout is stalled (a reader that does not read): exit 1, at once
	mkfifo "$T/fifo"
	sleep 30 <"$T/fifo" >/dev/null 2>&1 &
	local reader=$! pid
	"$SBX" -t "$TARGET" backup "$D" >"$T/fifo" 2>"$T/err" &
	pid=$!
	sleep 0.5
	kill -TERM "$pid"
	local i
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		fail "sbx backup did not end on SIGTERM while stdout was stalled"
		kill -KILL "$pid"
	fi
	wait "$pid"
	rc=$?
	[ "$rc" -eq 1 ] || fail "interrupted backup exited $rc, want 1"
	has err "interrupted"
	kill "$reader" 2>/dev/null
	wait "$reader" 2>/dev/null
	rm -f "$T/fifo"
}

sec_file()
{
	mkdir -p "$T/f"
	# -o FILE --compress zstd --json: the record on stdout, nothing on stderr
	run 0 backup "$D" -o "$T/f/a.tar.zst" --compress zstd --json
	empty err
	record_ok "$T/out" "$T/f/a.tar.zst" zstd
	zstd -dc "$T/f/a.tar.zst" | tar -tf - >"$T/list" || fail "zstd -dc | tar -tf failed"
	grep -q 'deep/f' "$T/list" || fail "sub/deep/f is missing from the zstd archive"
	only_names "$T/f" a.tar.zst
	# the global --json does the same
	run 0 --json backup "$D" -o "$T/f/g.tar"
	record_ok "$T/out" "$T/f/g.tar" none
	rm -f "$T/f/g.tar"
	# without --json: the record on stderr, stdout empty; a level
	run 0 backup "$D" -o "$T/f/b.tar.zst" --compress zstd --level 19
	empty out
	record_ok "$T/err" "$T/f/b.tar.zst" zstd
	# a failed backup leaves an existing file as it was and no temporary file
	printf 'OLD' >"$T/f/old.tar"
	run 1 backup "$T/nope" -o "$T/f/old.tar"
	has err "ENOENT"
	[ "$(cat "$T/f/old.tar")" = OLD ] || fail "a failed backup changed the existing file"
	only_names "$T/f" a.tar.zst b.tar.zst old.tar
	# into a directory that does not exist
	run 1 backup "$D" -o "$T/f/nodir/a.tar"
	has err "ENOENT"
	only_names "$T/f" a.tar.zst b.tar.zst old.tar
}

sec_restore()
{
	local R=$T/rs/r
	mkdir -p "$T/rs"
	OUT=$T/a.tar run 0 backup "$D"
	# from stdin into a new directory
	IN=$T/a.tar run 0 restore "$R"
	empty out
	same_tree "$D" "$R"
	[ "$(stat -c %a "$R/sub/deep/f")" = 640 ] || fail "mode of sub/deep/f not kept"
	[ "$(stat -c %i "$R/a.txt")" = "$(stat -c %i "$R/hard")" ] || fail "hard link not restored as a link"
	# replace (the default): what is not in the archive goes
	printf 'extra' >"$R/extra"
	IN=$T/a.tar run 0 restore "$R" -i -
	[ ! -e "$R/extra" ] || fail "replace mode kept a file that is not in the archive"
	same_tree "$D" "$R"
	# --merge: it stays
	printf 'extra' >"$R/extra"
	IN=$T/a.tar run 0 restore --merge "$R"
	[ "$(cat "$R/extra" 2>/dev/null)" = extra ] || fail "--merge removed a file"
	rm -f "$R/extra"
	same_tree "$D" "$R"
	# from -i FILE, zstd, --json
	OUT=$T/a.tar.zst run 0 backup --compress zstd "$D"
	run 0 restore -i "$T/a.tar.zst" --json "$T/rs/r2"
	same_tree "$D" "$T/rs/r2"
	py '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["bytes"] == int(sys.argv[2]) and r["sha256"] == sys.argv[3] and r["entries"] >= 8, r
' "$T/out" "$(stat -c %s "$T/a.tar.zst")" "$(sha256sum "$T/a.tar.zst" | cut -d' ' -f1)"
	# an archive made by GNU tar
	tar -cf "$T/gnu.tar" -C "$D" .
	run 0 restore -i "$T/gnu.tar" "$T/rs/r3"
	same_tree "$D" "$T/rs/r3"
	# garbage: exit 1, the directory as it was
	head -c 20000 /dev/urandom >"$T/junk"
	cp -a "$R" "$T/snap"
	run 1 restore -i "$T/junk" "$R"
	same_tree "$T/snap" "$R"
	# a truncated archive: the same
	head -c 200000 "$T/a.tar" >"$T/cut.tar"
	run 1 restore -i "$T/cut.tar" "$R"
	same_tree "$T/snap" "$R"
	# not one whole archive (a lone zero block; the end-of-archive blocks alone, which only
	# --allow-empty takes): EBADMSG naming the offset, the directory as it was, in both modes
	head -c 512 /dev/zero >"$T/zero.tar"
	head -c 1024 /dev/zero >"$T/end.tar"
	for m in "" --merge; do
		# shellcheck disable=SC2086
		run 1 restore $m -i "$T/zero.tar" "$R"
		has err "EBADMSG"
		has err "one end-of-archive block at offset 0"
		same_tree "$T/snap" "$R"
		# shellcheck disable=SC2086
		run 1 restore $m --allow-empty -i "$T/zero.tar" "$R"
		same_tree "$T/snap" "$R"
		# shellcheck disable=SC2086
		run 1 restore $m -i "$T/end.tar" "$R"
		has err "no members"
		same_tree "$T/snap" "$R"
	done
	mkdir -p "$T/re"
	cp -a "$R" "$T/re/e"
	run 0 restore --allow-empty --json -i "$T/end.tar" "$T/re/e"
	has out '"entries":0'
	[ -d "$T/re/e" ] && [ -z "$(ls -A "$T/re/e")" ] || fail "--allow-empty did not leave an empty directory"
	run 0 restore --allow-empty --merge -i "$T/end.tar" "$R"
	same_tree "$T/snap" "$R"
	only_names "$T/re" e
	sleep 0.2
	only_names "$T/rs" r r2 r3
	# interrupted while stdin stalls part way: exit 1 at once, the directory as it was
	mkfifo "$T/fifo"
	# (exec: the writer's PID is the sleep's, so that killing it leaves nothing behind)
	(
		head -c 100000 "$T/a.tar"
		exec sleep 30 2>/dev/null
	) >"$T/fifo" &
	local writer=$! pid i rc
	"$SBX" -t "$TARGET" restore "$R" <"$T/fifo" >/dev/null 2>"$T/err" &
	pid=$!
	sleep 0.5
	kill -TERM "$pid"
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		fail "sbx restore did not end on SIGTERM while stdin stalled"
		kill -KILL "$pid"
	fi
	wait "$pid"
	rc=$?
	[ "$rc" -eq 1 ] || fail "interrupted restore exited $rc, want 1"
	has err "interrupted"
	kill "$writer" 2>/dev/null
	wait "$writer" 2>/dev/null
	rm -f "$T/fifo"
	sleep 0.2
	same_tree "$T/snap" "$R"
	only_names "$T/rs" r r2 r3
	rm -rf "$T/snap"
}

sec_sha256()
{
	local R=$T/ss/r sha wrong
	mkdir -p "$T/ss"
	OUT=$T/a.tar run 0 backup "$D"
	sha=$(sha256sum "$T/a.tar" | cut -d' ' -f1)
	IN=$T/a.tar run 0 restore --sha256 "$sha" "$R"
	same_tree "$D" "$R"
	IN=$T/a.tar run 0 restore --sha256 "$(printf '%s' "$sha" | tr a-f A-F)" "$R"
	# wrong: exit 1, the directory exactly as it was, nothing left beside it
	printf 'mine' >"$R/mine"
	cp -a "$R" "$T/snap"
	wrong=$(printf '%s' "$sha" | tr 0-9a-f 1-9a-f0)
	IN=$T/a.tar run 1 restore --sha256 "$wrong" "$R"
	has err "sbx: "
	same_tree "$T/snap" "$R"
	IN=$T/a.tar run 1 restore --merge --sha256 "$wrong" "$R"
	same_tree "$T/snap" "$R"
	sleep 0.2
	only_names "$T/ss" r
	rm -rf "$T/snap"
}

sec_sandbox()
{
	local R=$T/sbr/r sha
	mkdir -p "$T/sbr"
	mkdir -p "$T/sandbox"
	# --to: the archive stays in the sandbox, nothing on stdout, the record (with to_path) on stderr
	run 0 backup "$D" --to "$T/sandbox/in.tar"
	empty out
	record_ok "$T/err" "$T/sandbox/in.tar" none
	has err "\"to_path\":\"$T/sandbox/in.tar\""
	tar -tf "$T/sandbox/in.tar" >/dev/null || fail "--to: not a tar archive"
	# --json: the record on stdout
	run 0 backup "$D" --to "$T/sandbox/in.tar.zst" --compress zstd --json
	empty err
	record_ok "$T/out" "$T/sandbox/in.tar.zst" zstd
	only_names "$T/sandbox" in.tar in.tar.zst
	# --from
	run 0 restore "$R" --from "$T/sandbox/in.tar.zst"
	same_tree "$D" "$R"
	sha=$(sha256sum "$T/sandbox/in.tar" | cut -d' ' -f1)
	run 0 restore "$R" --from "$T/sandbox/in.tar" --sha256 "$sha"
	same_tree "$D" "$R"
	printf 'mine' >"$R/mine"
	cp -a "$R" "$T/snap"
	run 1 restore "$R" --from "$T/sandbox/in.tar" --sha256 "$(printf '%064d' 0)"
	same_tree "$T/snap" "$R"
	run 1 restore "$R" --from "$T/sandbox/missing.tar"
	has err "ENOENT"
	same_tree "$T/snap" "$R"
	sleep 0.2
	only_names "$T/sbr" r
	rm -rf "$T/snap"
}

# --skip-unreadable and --one-file-system, against a second daemon that may not read everything
# (as root: one without capabilities, so that a mode 000 file is unreadable to it too).
sec_unreadable()
{
	local U=$T/u main_pid=$DPID main_target=$TARGET upid
	mkdir -p "$U/src/sub"
	printf 'ok' >"$U/src/ok"
	printf 'secret' >"$U/src/sub/locked"
	chmod 000 "$U/src/sub/locked"
	if [ "$(id -u)" -eq 0 ]; then
		command -v setpriv >/dev/null || {
			fail "no setpriv (util-linux) to drop root's capabilities"
			return
		}
		printf '#!/bin/sh\nexec setpriv --inh-caps=-all --bounding-set=-all -- "%s" "$@"\n' "$SHIM" >"$U/shim"
		chmod 755 "$U/shim"
		SHIM=$U/shim start_daemon unreadable --listen "unix:$T/su"
	else
		start_daemon unreadable --listen "unix:$T/su"
	fi
	upid=$DPID
	DPID=$main_pid
	TARGET="unix:$T/su"
	# by default: the backup fails, naming the file; no archive left behind
	run 1 backup "$U/src" -o "$U/a.tar"
	has err "EACCES"
	has err "$U/src/sub/locked"
	[ -e "$U/a.tar" ] && fail "a failed backup left $U/a.tar"
	# --skip-unreadable: done, the file listed in the record's skipped, the rest archived
	run 0 backup "$U/src" -o "$U/b.tar" --skip-unreadable --json
	py "import json,os,sys; r=json.load(open(sys.argv[1])); assert r['skipped']==[sys.argv[2]], r; \
assert r['bytes']==os.path.getsize(sys.argv[3]) and r['entries']==3, r" "$T/out" "$U/src/sub/locked" "$U/b.tar"
	tar -tf "$U/b.tar" >"$U/list" || fail "tar -tf failed"
	grep -qx './ok' "$U/list" || fail "./ok is missing from the archive"
	grep -q 'locked' "$U/list" && fail "the unreadable file is in the archive"
	# --one-file-system: the tree is one file system; accepted, nothing left out
	run 0 backup "$U/src" -o "$U/c.tar" --skip-unreadable --one-file-system
	tar -tf "$U/c.tar" | grep -qx './sub/' || fail "--one-file-system left out ./sub/"
	kill -TERM "$upid"
	wait "$upid" 2>/dev/null
	TARGET=$main_target
	chmod 600 "$U/src/sub/locked"
}

sec_tty()
{
	local rc
	if ! script -qc true /dev/null >/dev/null 2>&1 </dev/null; then
		echo "tty: skipped (no working script(1))"
		return
	fi
	mkdir -p "$T/tty"
	# an archive is not written to a terminal: exit 2, nothing done
	script -qec "'$SBX' -t '$TARGET' backup '$D'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 2 ] || fail "backup to a terminal exited $rc, want 2"
	has out "refusing to write an archive to a terminal"
	script -qec "'$SBX' -t '$TARGET' backup -o - '$D'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 2 ] || fail "backup -o - to a terminal exited $rc, want 2"
	# nor read from one
	script -qec "'$SBX' -t '$TARGET' restore '$T/tty/r'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 2 ] || fail "restore from a terminal exited $rc, want 2"
	has out "refusing to read an archive from a terminal"
	[ ! -e "$T/tty/r" ] || fail "restore from a terminal created the directory"
	# progress on a terminal's stderr: a line rewritten with \r and cleared at the end; the
	# record follows it (the archive to a pipe: its first chunk shows the line at once)
	script -qec "'$SBX' -t '$TARGET' backup '$D' | cat >'$T/tty/a.tar'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 0 ] || fail "backup | cat on a terminal exited $rc"
	has out "backup: "
	has out " files"
	grep -q $'\r\e\[K' "$T/out" || fail "no progress line cleared with \\r ESC [K"
	has out "\"sha256\":"
	tar -tf "$T/tty/a.tar" >/dev/null || fail "the archive written under a terminal is not a tar archive"
	# -o FILE on a terminal: progress comes from the shim's events (4 a second), so a quick
	# backup may show none; the record is there
	script -qec "'$SBX' -t '$TARGET' backup '$D' -o '$T/tty/o.tar'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 0 ] || fail "backup -o on a terminal exited $rc"
	has out "\"sha256\":"
	tar -tf "$T/tty/o.tar" >/dev/null || fail "backup -o on a terminal: not a tar archive"
	script -qec "'$SBX' -t '$TARGET' restore '$T/tty/r' -i '$T/tty/a.tar'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 0 ] || fail "restore -i on a terminal exited $rc"
	has out "restore: "
	same_tree "$D" "$T/tty/r"
	# not a terminal: no progress line
	run 0 backup "$D" -o "$T/tty/b.tar"
	grep -q $'\r' "$T/err" && fail "a progress line on a stderr that is not a terminal"
}

# ---- main ----

make_tree
start_daemon shim --listen "unix:$T/s"
TARGET="unix:$T/s"
# the daemon may not have backups yet: then only the usage section runs
NOBACKUP=0
SKIPPED=0
"$SBX" -t "$TARGET" backup "$D" >/dev/null 2>"$T/err"
grep -q ENOSYS "$T/err" && NOBACKUP=1
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage stdout file restore sha256 sandbox tty unreadable)
for SECTION in "${SECTIONS[@]}"; do
	if [ "$NOBACKUP" -eq 1 ] && [ "$SECTION" != usage ]; then
		echo "$SECTION: skipped (the daemon answers ENOSYS to backups)"
		SKIPPED=1
		continue
	fi
	before=$FAILS
	"sec_$SECTION"
	if [ "$FAILS" -eq "$before" ]; then
		echo "$SECTION: ok"
	else
		echo "$SECTION: FAILED ($((FAILS - before)) checks)"
	fi
done
kill -TERM "$DPID"
wait "$DPID" || {
	SECTION=main
	fail "the daemon did not exit 0 after SIGTERM: $(tail -n 5 "$T/shim.log")"
}
if [ "$FAILS" -ne 0 ]; then
	echo "FAIL: $FAILS checks failed" >&2
	exit 1
fi
if [ "$SKIPPED" -eq 1 ]; then
	exit 77
fi
echo "cli_backup: ok"
