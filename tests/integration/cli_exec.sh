#!/usr/bin/env bash
# cli_exec.sh: the sbx command and process subcommands against a real daemon: exit codes, byte-exact
# streams, stdin, sh, eval, background processes (ps/logs/kill/wait/rmproc), signals, -t on a PTY.
#
# Usage: bash cli_exec.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own daemon in a mktemp -d directory (with --state-dir there) and stops only it, by PID.
# Every section runs even when an earlier one failed; the script exits 1 if any check failed.
# SC2016: the $ in single quotes are for the command's shell; SC2002: cat makes a real pipe.
# shellcheck disable=SC2016,SC2002
set -uo pipefail

SHIM=${1:?usage: cli_exec.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_exec.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-exec.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
# cleanup, fail, start_daemon, run, has, hasnt, empty, py, run_sections, stop_daemon, finish
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"
DAEMON_ENV=(LEAKME=from-the-daemon)

# is FILE TEXT: the last run's out or err is exactly TEXT (no newline added).
is()
{
	printf '%s' "$2" | cmp -s - "$T/$1" || fail "$1 is '$(cat -A "$T/$1" | head -c 500)', want '$2'"
}

# clean FILE: no sanitizer report in $T/FILE (for sbx runs that did not go through run).
clean()
{
	! grep -qE 'Sanitizer|runtime error:' "$T/$1" || fail "sanitizer report in $1: $(grep -m3 -E 'Sanitizer|runtime error:' "$T/$1")"
}

# wait_for FILE TEXT [SECONDS]: until FILE contains TEXT.
wait_for()
{
	local i n=$((${3:-10} * 100))
	for ((i = 0; i < n; i++)); do
		grep -qsF -- "$2" "$1" && return 0
		sleep 0.01
	done
	fail "$1 never showed '$2'"
	return 1
}

# pidfile FILE: until FILE holds a pid (written by the command).
pidfile()
{
	local i
	for ((i = 0; i < 1000; i++)); do
		grep -qsE '^[0-9]+$' "$1" && return 0
		sleep 0.01
	done
	fail "no pid in $1"
}

# gone PID: the process disappears within 3 s.
gone()
{
	local i
	[ -n "$1" ] || {
		fail "no pid to look for"
		return
	}
	for ((i = 0; i < 300; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.01
	done
	fail "process $1 is still there"
}

# ---- sections ----

sec_usage()
{
	run 2 exec
	has err "sbx: exec: no command given"
	run 2 exec --
	run 2 exec --env NOEQUALS -- true
	has err "bad --env 'NOEQUALS'"
	run 2 exec --timeout x -- true
	run 2 exec --rlimit nofile -- true
	run 2 exec --rlimit nofile=abc -- true
	run 2 exec --user : -- true
	run 2 exec --name x -- true
	has err "--name needs --detach"
	run 2 exec -i --detach -- true
	run 2 exec --bogus -- true
	run 2 sh
	has err "no command string given"
	run 2 sh 'echo a' 'echo b'
	run 2 eval
	run 2 eval --interp '' 'x'
	run 2 ps extra
	run 2 logs
	run 2 kill -s NOPE x
	has err "bad signal 'NOPE'"
	run 2 kill -s 65 x
	run 2 wait
	run 2 rmproc a b
	run 0 exec --help
	has out "usage: sbx [OPTIONS] exec"
	run 0 --help
	for c in exec sh eval ps logs kill wait rmproc; do
		grep -q "^  $c " "$T/out" || fail "sbx --help does not list $c"
	done
	TARGET="unix:$T/missing" run 3 exec -- true
	has err "cannot connect"
}

sec_codes()
{
	run 0 exec -- true
	empty out
	empty err
	run 7 exec -- sh -c 'exit 7'
	run 137 exec -- sh -c 'kill -9 $$'
	run 143 exec -- sh -c 'kill -TERM $$'
	local t0=$SECONDS
	run 124 exec --timeout 0.3 -- sleep 30
	[ $((SECONDS - t0)) -lt 5 ] || fail "--timeout 0.3 took $((SECONDS - t0)) s"
	# a TERM-proof command: KILL after the grace period, still 124
	run 124 exec --timeout 0.2 --kill-grace 0.3 -- sh -c 'trap "" TERM; sleep 30'
	run 1 exec -- no-such-program-xyz
	has err "sbx: ENOENT: "
	empty out
	run 1 exec --cwd /no/such/dir -- true
	has err "sbx: ENOENT: "
	run 1 exec --user no-such-user-xyz -- true
	has err "sbx: EINVAL: "
	printf 'echo hi\n' >"$T/noexec"
	chmod 644 "$T/noexec"
	run 1 exec -- "$T/noexec"
	has err "sbx: EACCES: "
	# the command's own options are its own
	run 0 exec -- sh -c 'echo "$@"' sh -i --detach -t
	is out $'-i --detach -t\n'
	run 0 exec ls -d /
	is out $'/\n'
}

sec_streams()
{
	run 0 exec -- sh -c 'printf out; printf err >&2'
	is out "out"
	is err "err"
	# NULs and every byte value, both streams apart, byte-exact
	head -c 3000000 /dev/urandom >"$T/rand"
	run 0 exec -- cat "$T/rand"
	cmp -s "$T/rand" "$T/out" || fail "stdout differs from the file"
	empty err
	run 0 exec -- sh -c "cat '$T/rand'; cat '$T/rand' >&2; printf '\\000end'"
	{ cat "$T/rand"; printf '\000end'; } | cmp -s - "$T/out" || fail "stdout differs"
	cmp -s "$T/rand" "$T/err" || fail "stderr differs"
	# streamed as it comes, not at the end: the first line is out while the command still runs
	"$SBX" -t "$TARGET" exec -- sh -c "echo first; while [ ! -e '$T/go' ]; do sleep 0.02; done; echo second" \
		>"$T/live" 2>&1 &
	local pid=$!
	wait_for "$T/live" first
	grep -q second "$T/live" && fail "second line before its time"
	touch "$T/go"
	wait "$pid" || fail "the streamed exec failed"
	is live $'first\nsecond\n'
	clean live
	# a closed stdout ends the command like a local pipeline would (SIGPIPE: 141)
	timeout 20 "$SBX" -t "$TARGET" exec -- sh -c 'while :; do echo y; done' | head -n 3 >"$T/out"
	[ "${PIPESTATUS[0]}" -eq 141 ] || fail "exec into a closed pipe exited ${PIPESTATUS[0]}, want 141"
	is out $'y\ny\ny\n'
}

sec_stdin()
{
	head -c 2500000 /dev/urandom >"$T/in"
	IN=$T/in run 0 exec -i -- cat
	cmp -s "$T/in" "$T/out" || fail "cat -i output differs from stdin"
	# from a pipe, closed at EOF
	cat "$T/in" | timeout 60 "$SBX" -t "$TARGET" exec -i -- cat >"$T/out" 2>"$T/err"
	[ "${PIPESTATUS[1]}" -eq 0 ] || fail "exec -i from a pipe exited ${PIPESTATUS[1]}"
	cmp -s "$T/in" "$T/out" || fail "stdin through a pipe differs"
	clean err
	printf hello | timeout 60 "$SBX" -t "$TARGET" exec -i -- wc -c >"$T/out"
	[ "$(tr -d ' ' <"$T/out")" = 5 ] || fail "wc -c of 5 bytes said '$(cat "$T/out")'"
	# without -i the command reads /dev/null
	IN=$T/in run 0 exec -- wc -c
	[ "$(tr -d ' ' <"$T/out")" = 0 ] || fail "without -i the command read '$(cat "$T/out")' bytes"
	# stdout closed while stdin waits for a command that does not read it: sbx still ends (141)
	head -c 50000000 /dev/zero | timeout 20 "$SBX" -t "$TARGET" exec -i -- sh -c 'sleep 0.3; while :; do echo y; done' |
		head -n 1 >/dev/null
	[ "${PIPESTATUS[1]}" -eq 141 ] || fail "exec -i into a closed pipe exited ${PIPESTATUS[1]}, want 141"
	# a command that exits without reading its stdin does not hang on it (our stdin stays open)
	local wpid rc t0=$SECONDS
	mkfifo "$T/fifo"
	sleep 30 >"$T/fifo" &
	wpid=$!
	timeout 20 "$SBX" -t "$TARGET" exec -i -- sh -c 'exit 6' <"$T/fifo"
	rc=$?
	kill "$wpid"
	wait "$wpid" 2>/dev/null
	[ "$rc" -eq 6 ] || fail "exec -i of a command ignoring stdin exited $rc"
	[ $((SECONDS - t0)) -lt 5 ] || fail "exec -i of a command ignoring stdin took $((SECONDS - t0)) s"
}

sec_sh()
{
	run 0 sh 'echo $((6 * 7))'
	is out $'42\n'
	run 3 sh 'exit 3'
	run 0 sh --env FOO=bar --env BAZ='a b' 'echo "$FOO/$BAZ"'
	is out $'bar/a b\n'
	run 0 sh --cwd /tmp 'pwd'
	is out $'/tmp\n'
	run 0 sh -- 'echo dashdash'
	is out $'dashdash\n'
	run 0 exec -- env
	has out "LEAKME=from-the-daemon"
	run 0 exec --clear-env --env A=1 -- /usr/bin/env
	has out "A=1"
	hasnt out "LEAKME"
	run 0 sh --rlimit nofile=123 'ulimit -n'
	is out $'123\n'
	run 0 sh --rlimit fsize=unlimited 'ulimit -f'
	is out $'unlimited\n'
	run 0 sh --no-new-privs 'grep NoNewPrivs /proc/self/status'
	has out "1"
	run 0 sh --drop-caps 'grep CapBnd /proc/self/status'
	has out "0000000000000000"
	run 0 sh --seccomp none 'echo ok'
	run 124 sh --timeout 0.3 'sleep 30 & wait'
}

sec_eval()
{
	run 0 eval --interp 'sh -c' 'echo hi; echo note >&2'
	is out $'hi\n'
	is err $'note\n'
	run 4 eval --interp 'sh -c' 'echo part; echo bad thing >&2; exit 4'
	is out $'part\n'
	has err "bad thing"
	run 1 eval --interp 'no-such-interp -c' 'x'
	has err "sbx: ENOENT: "
	if "$SBX" -t "$TARGET" exec -- sh -c 'command -v python3' >/dev/null 2>&1; then
		run 0 eval 'print(6 * 7)'
		is out $'42\n'
		run 1 eval '1 / 0'
		has err "ZeroDivisionError"
		run 0 eval --interp 'python3 -I -c' 'import sys; sys.stdout.write("x\0y")'
		printf 'x\0y' | cmp -s - "$T/out" || fail "eval output not byte-exact"
	else
		echo "no python3: eval's default interpreter not tried"
	fi
}

sec_procs()
{
	local id id2 pid
	run 0 exec --detach --name web -- sh -c 'echo started; echo warn >&2; exec sleep 30'
	is out $'web\n'
	# the same name again
	run 1 exec --detach --name web -- true
	run 0 --json exec --detach --name json1 -- true
	python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); assert d["id"] == "json1" and d["pid"] > 0, d' \
		"$T/out" || fail "--json exec --detach: $(cat "$T/out")"
	run 0 wait json1
	run 0 rmproc json1
	run 0 ps
	has out "web"
	has out "running"
	has out "sh -c echo started"
	head -n 1 "$T/out" | grep -qE '^ID +PID +STATE +EXIT +STARTED +COMMAND$' || fail "ps header: $(head -n 1 "$T/out")"
	run 0 ps --json
	python3 -c '
import json, sys
l = json.load(open(sys.argv[1]))
w = [p for p in l if p["id"] == "web"]
assert len(w) == 1, l
w = w[0]
assert w["state"] == "running" and w["exit"] is None and w["detached"] is True, w
assert w["pid"] > 0 and w["started_at_sec"] > 1600000000, w
' "$T/out" || fail "ps --json"
	pid=$(python3 -c 'import json,sys; print([p["pid"] for p in json.load(open(sys.argv[1])) if p["id"] == "web"][0])' "$T/out")
	# the global --json works too
	run 0 --json ps
	python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/out" || fail "--json ps is not JSON"
	run 0 logs web
	is out $'started\n'
	is err $'warn\n'
	run 1 rmproc web
	has err "EBUSY"
	run 0 kill web
	run 143 wait web
	gone "$pid"
	run 0 ps
	grep -E '^web ' "$T/out" | grep -q 'exited' || fail "ps does not show web exited"
	grep -E '^web ' "$T/out" | grep -q 'SIGTERM' || fail "ps does not show web's signal"
	run 0 ps --json
	python3 -c '
import json, sys
w = [p for p in json.load(open(sys.argv[1])) if p["id"] == "web"][0]
assert w["state"] == "exited" and w["exit"]["signal"] == 15 and w["exit"]["status"] == 143, w
' "$T/out" || fail "ps --json after kill"
	# logs of an exited process: still there
	run 0 logs web
	is out $'started\n'
	run 0 rmproc web
	run 0 ps
	hasnt out "web"
	run 1 wait web
	run 1 logs web
	run 1 kill web
	# logs -f: replay, then live until the end; the id is generated
	run 0 exec --detach -- sh -c "echo a; while [ ! -e '$T/go2' ]; do sleep 0.02; done; echo b >&2; echo c; exit 5"
	id=$(cat "$T/out")
	[ -n "$id" ] || fail "no id printed"
	timeout 30 "$SBX" -t "$TARGET" logs -f "$id" >"$T/lo" 2>"$T/le" &
	pid=$!
	wait_for "$T/lo" a
	touch "$T/go2"
	wait "$pid" || fail "logs -f exited $?"
	is lo $'a\nc\n'
	is le $'b\n'
	clean le
	run 5 wait "$id"
	run 0 rmproc "$id"
	# signals by name and number
	for s in KILL SIGKILL 9 kill; do
		run 0 exec --detach -- sleep 30
		id2=$(cat "$T/out")
		run 0 kill -s "$s" "$id2"
		run 137 wait "$id2"
		run 0 rmproc "$id2"
	done
	run 0 exec --detach -- sleep 30
	id2=$(cat "$T/out")
	run 0 rmproc -k "$id2"
	run 1 wait "$id2"
	# a timed-out background process waits as 124
	run 0 exec --detach --timeout 0.2 -- sleep 30
	id2=$(cat "$T/out")
	run 124 wait "$id2"
	run 0 ps
	grep -E "^$id2 " "$T/out" | grep -q timeout || fail "ps does not show the timeout"
	run 0 rmproc "$id2"
}

sec_signals()
{
	local pid rc
	# TERM and INT to sbx reach the command
	for s in TERM INT; do
		rm -f "$T/so"
		"$SBX" -t "$TARGET" exec -- sh -c "trap 'echo got-$s; exit 3' $s; echo ready; while :; do sleep 0.05; done" \
			>"$T/so" 2>"$T/se" &
		pid=$!
		wait_for "$T/so" ready
		kill -"$s" "$pid"
		wait "$pid"
		rc=$?
		[ "$rc" -eq 3 ] || fail "sbx exec after SIG$s exited $rc, want 3"
		grep -q "got-$s" "$T/so" || fail "the command did not get SIG$s"
		clean se
	done
	# a command that ignores them: the third one kills it, sbx exits 128+N
	rm -f "$T/so"
	"$SBX" -t "$TARGET" exec -- sh -c "trap '' TERM; echo \$\$ > '$T/ipid'; echo ready; while :; do sleep 0.05; done" \
		>"$T/so" 2>"$T/se" &
	pid=$!
	wait_for "$T/so" ready
	kill -TERM "$pid"
	sleep 0.2
	kill -TERM "$pid"
	sleep 0.2
	kill -0 "$pid" 2>/dev/null || fail "sbx ended before the third signal"
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
	[ "$rc" -eq 143 ] || fail "sbx exec after three SIGTERMs exited $rc, want 143"
	gone "$(cat "$T/ipid")"
	clean se
	# sbx killed outright: the connection drops and the command's group is killed
	"$SBX" -t "$TARGET" exec -- sh -c "sleep 30 & echo \$! > '$T/gpid'; echo \$\$ > '$T/kpid'; wait" \
		>"$T/so" 2>"$T/se" &
	pid=$!
	pidfile "$T/gpid"
	pidfile "$T/kpid"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	gone "$(cat "$T/kpid")"
	gone "$(cat "$T/gpid")"
}

sec_tty()
{
	local rc
	if ! script -qc true /dev/null >/dev/null 2>&1 </dev/null; then
		echo "tty: skipped (no working script(1))"
		return
	fi
	# size from our terminal, a terminal on all three descriptors, one output stream
	script -qec "stty rows 31 cols 97; '$SBX' -t '$TARGET' exec -t -- sh -c 'stty size; test -t 0 && test -t 1 && test -t 2 && echo TTY; echo e >&2'" \
		/dev/null </dev/null >"$T/out" 2>"$T/err"
	has out "31 97"
	has out "TTY"
	has out "e"
	clean out
	# -it: our terminal is raw while sbx runs (another look at it from the same terminal),
	# SIGWINCH becomes a resize, keys go through, and the terminal is restored after
	printf 'hello\n' | script -qec "stty rows 20 cols 60; '$SBX' -t '$TARGET' exec -it -- sh -c 'sleep 1; stty size; read x; echo got:\$x' </dev/tty & sleep 0.5; echo MID; stty -a; stty rows 50 cols 100; wait \$!; echo rc=\$?; echo END; stty -a" \
		/dev/null >"$T/out" 2>"$T/err"
	has out "got:hello"
	has out "rc=0"
	has out "50 100"
	sed -n '/^MID/,/^END/p' "$T/out" >"$T/mid"
	sed -n '/^END/,$p' "$T/out" >"$T/end"
	grep -q -- '-icanon' "$T/mid" || fail "the terminal was not raw while sbx ran: $(cat "$T/mid")"
	grep -q -- '-echo ' "$T/mid" || fail "the terminal echoed while sbx ran"
	grep -qE '(^| )icanon' "$T/end" || fail "the terminal was left raw: $(cat "$T/end")"
	grep -qE '(^| )echo( |$)' "$T/end" || fail "the terminal was left without echo"
	clean out
	# exit codes come through -t too
	script -qec "'$SBX' -t '$TARGET' exec -t -- sh -c 'exit 9'" /dev/null </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq 9 ] || fail "exec -t of exit 9 gave $rc"
}

# ---- main ----

start_daemon shim --listen "unix:$T/s"
TARGET="unix:$T/s"
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage codes streams stdin sh eval procs signals tty)
run_sections "${SECTIONS[@]}"
stop_daemon
finish cli_exec
