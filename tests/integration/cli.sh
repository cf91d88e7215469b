#!/usr/bin/env bash
# cli.sh: the sbx command line against real daemons: exit codes, readiness wait, JSON, trace, decode, tokens,
# global options after the command.
#
# Usage: bash cli.sh SHIM_BIN SBX_BIN CASE
# Each case runs in its own mktemp -d directory and stops only the daemons it started, by PID.
set -uo pipefail

SHIM=${1:?usage: cli.sh SHIM_BIN SBX_BIN CASE}
SBX=${2:?usage: cli.sh SHIM_BIN SBX_BIN CASE}
CASE=${3:?usage: cli.sh SHIM_BIN SBX_BIN CASE}
unset SBX_TARGET SBX_TOKEN
# the system's python starts faster than a version manager's shim
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli.XXXXXX") || exit 1
PIDS=()

cleanup()
{
	local pid
	for pid in "${PIDS[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
		fi
	done
	rm -rf "$T"
}
trap cleanup EXIT

fail()
{
	local f
	echo "cli.sh:${BASH_LINENO[0]}: [$CASE] $*" >&2
	for f in "$T"/*.log "$T"/out "$T"/err; do
		[ -f "$f" ] || continue
		echo "---- $(basename "$f") ----" >&2
		tail -n 20 "$f" >&2
	done
	echo "FAIL: $CASE" >&2
	exit 1
}

# start_daemon NAME ARGS...: start the daemon (stderr to $T/NAME.log), wait for "ready";
# sets DPID.
start_daemon()
{
	local name=$1 i
	shift
	"$SHIM" "$@" 2>"$T/$name.log" </dev/null &
	DPID=$!
	PIDS+=("$DPID")
	for ((i = 0; i < 1000; i++)); do
		grep -q ' ready (pid ' "$T/$name.log" && return 0
		kill -0 "$DPID" 2>/dev/null || fail "$name exited before it was ready"
		sleep 0.01
	done
	fail "$name was not ready within 10 s"
}

# tcp_port NAME: the port from "listening on tcp:127.0.0.1:PORT" in NAME's log.
tcp_port()
{
	sed -n 's/.*listening on tcp:127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$T/$1.log" | head -n 1
}

# stop_daemon PID: SIGTERM, and it must exit 0.
stop_daemon()
{
	local pid=$1 rc
	kill -TERM "$pid"
	wait "$pid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "daemon $pid exited $rc after SIGTERM"
}

# run WANT_STATUS ARGS...: run sbx with stdout in $T/out, stderr in $T/err.
run()
{
	local want=$1 rc
	shift
	"$SBX" "$@" >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" -eq "$want" ] || fail "sbx $* exited $rc, want $want"
}

has()
{
	grep -qF -- "$2" "$T/$1" || fail "$1 of the last sbx run does not contain '$2'"
}

now_ms()
{
	echo $(($(date +%s%N) / 1000000))
}

# ---- cases ----

case_wait()
{
	local sock=$T/s spid rc t0 ms
	# started before the daemon: --wait turns it into a readiness check
	"$SBX" -t "unix:$sock" --timeout 10 ping --wait 5 >"$T/out" 2>"$T/err" &
	spid=$!
	sleep 0.3
	start_daemon shim --listen "unix:$sock"
	wait "$spid"
	rc=$?
	[ "$rc" -eq 0 ] || fail "ping --wait 5 exited $rc"
	has out "pong from sandbox-shim 0.1.0 (protocol 1) pid $DPID pid1=no: time="

	# no daemon at all: retried for the whole wait, then exit 3
	t0=$(now_ms)
	run 3 -t "unix:$T/nothing" ping --wait 0.5
	ms=$(($(now_ms) - t0))
	if [ "$ms" -lt 490 ] || [ "$ms" -ge 3000 ]; then
		fail "ping --wait 0.5 gave up after $ms ms"
	fi
	has err "cannot connect"
	stop_daemon "$DPID"
}

case_exit_codes()
{
	local sock=$T/s
	run 3 -t "unix:$T/missing" ping
	has err "sbx: cannot connect to unix:$T/missing: ENOENT"
	[ ! -s "$T/out" ] || fail "a failed ping printed on stdout"

	run 2
	has err "no command given"
	run 2 -t "unix:$sock" nosuchcmd
	has err "unknown command 'nosuchcmd'"
	run 2 -t "unix:$sock" ping -c 0
	run 2 -t "unix:$sock" ping extra
	run 2 --timeout 0 ping
	run 2 --nosuchoption ping
	run 0 --help
	has out "usage: sbx"
	run 0 --version
	has out "sbx 0.1.0"

	start_daemon shim --listen "unix:$sock"
	run 0 -t "unix:$sock" ping -c 3
	[ "$(grep -c '^pong from sandbox-shim' "$T/out")" -eq 3 ] || fail "ping -c 3 did not print 3 pongs"
	# SBX_TARGET stands in for -t
	SBX_TARGET="unix:$sock" run 0 ping
	run 0 -t "unix:$sock" echo --size 3M
	has out "echoed 3145728 bytes"
	stop_daemon "$DPID"
}

case_json()
{
	local sock=$T/s
	start_daemon shim --listen "unix:$sock"
	run 0 --json -t "unix:$sock" info
	"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["pid"] == int(sys.argv[2]), d
assert d["protocol_version"] == 1, d
assert "echo" in d["features"] and "info" in d["features"], d
assert d["connections"] == 1 and d["streams"] == 1, d
assert isinstance(d["load"], list) and len(d["load"]) == 3, d
' "$T/out" "$DPID" || fail "sbx --json info: $(cat "$T/out")"

	run 0 --json -t "unix:$sock" ping -c 3
	"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["pid"] == int(sys.argv[2]), d
assert len(d["rtt_ms"]) == 3 and all(r >= 0 for r in d["rtt_ms"]), d
' "$T/out" "$DPID" || fail "sbx --json ping: $(cat "$T/out")"

	run 0 --json -t "unix:$sock" echo --size 64K
	"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bytes"] == 65536, d
' "$T/out" || fail "sbx --json echo: $(cat "$T/out")"
	stop_daemon "$DPID"
}

case_trace()
{
	local sock=$T/s
	start_daemon shim --listen "unix:$sock"
	run 0 --trace -t "unix:$sock" ping
	has err "sbx: trace: > HELLO stream=0"
	has err "sbx: trace: < HELLO_OK stream=0"
	has err "sbx: trace: > PING stream=0 len=8"
	has err "sbx: trace: < PONG stream=0 len=8"
	has out "pong from sandbox-shim"
	stop_daemon "$DPID"
}

# The frames of a hand-made capture, and what decode must print for them.
case_decode()
{
	# PING "abcd" | DATA FIN, empty, stream 1 | WINDOW +65536 on stream 1
	printf '\x00\x00\x00\x04\x00\x00\x00\x00\x0a\x00\x00\x00abcd' >"$T/good.bin"
	printf '\x00\x00\x00\x00\x00\x00\x00\x01\x04\x01\x00\x00' >>"$T/good.bin"
	printf '\x00\x00\x00\x04\x00\x00\x00\x01\x09\x00\x00\x00\x00\x01\x00\x00' >>"$T/good.bin"
	run 0 decode "$T/good.bin"
	printf '%s\n' '@0: PING stream=0 len=4 "abcd"' '@16: DATA stream=1 len=0 FIN' \
		'@28: WINDOW stream=1 len=4 +65536' >"$T/want"
	cmp -s "$T/out" "$T/want" || fail "decode printed: $(cat "$T/out")"
	# from stdin too
	"$SBX" decode <"$T/good.bin" >"$T/out2" 2>"$T/err" || fail "decode from stdin failed"
	cmp -s "$T/out2" "$T/want" || fail "decode - printed: $(cat "$T/out2")"

	# a capture cut off in the middle of a frame is normal
	head -c 20 "$T/good.bin" >"$T/cut.bin"
	run 0 decode "$T/cut.bin"
	printf '%s\n' '@0: PING stream=0 len=4 "abcd"' '@16: 4 trailing bytes: an unfinished frame' >"$T/want"
	cmp -s "$T/out" "$T/want" || fail "decode of a cut capture printed: $(cat "$T/out")"

	# malformed: reserved bits set, after one good frame
	printf '\x00\x00\x00\x04\x00\x00\x00\x00\x0a\x00\x00\x00abcd' >"$T/bad.bin"
	printf '\x00\x00\x00\x00\x00\x00\x00\x01\x04\x00\x12\x34' >>"$T/bad.bin"
	run 1 decode "$T/bad.bin"
	has out '@0: PING stream=0 len=4 "abcd"'
	has out "@16: not a frame: bad header"
	has err "not a valid frame stream"
	# malformed: type 0; and a length over 16 MiB
	printf '\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' >"$T/bad2.bin"
	run 1 decode "$T/bad2.bin"
	has out "@0: not a frame: bad header"
	printf '\x7f\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00' >"$T/bad3.bin"
	run 1 decode "$T/bad3.bin"
	has out "@0: not a frame: length over 16 MiB"
	run 1 decode "$T/does-not-exist"

	# a real session, recorded by socat between sbx and the daemon
	if ! command -v socat >/dev/null 2>&1; then
		echo "socat not installed: the recorded-session part is skipped"
		return 0
	fi
	local sock=$T/s proxy=$T/proxy spid i
	start_daemon shim --listen "unix:$sock"
	socat -r "$T/c2s.bin" -R "$T/s2c.bin" "UNIX-LISTEN:$proxy" "UNIX-CONNECT:$sock" 2>"$T/socat.log" &
	spid=$!
	PIDS+=("$spid")
	for ((i = 0; i < 500; i++)); do
		[ -S "$proxy" ] && break
		sleep 0.01
	done
	[ -S "$proxy" ] || fail "socat did not listen"
	run 0 -t "unix:$proxy" ping
	wait "$spid" || fail "socat failed"

	run 0 decode "$T/c2s.bin"
	[ "$(wc -l <"$T/out")" -eq 2 ] || fail "client side: want 2 frames, got: $(cat "$T/out")"
	grep -q '^@0: HELLO stream=0 len=[0-9]* Hello{protocol_version=1 client_name="sbx/0.1.0"' "$T/out" ||
		fail "client side, frame 1: $(cat "$T/out")"
	grep -q '^@[0-9]*: PING stream=0 len=8 ' "$T/out" || fail "client side, frame 2: $(cat "$T/out")"
	run 0 decode "$T/s2c.bin"
	[ "$(wc -l <"$T/out")" -eq 2 ] || fail "shim side: want 2 frames, got: $(cat "$T/out")"
	grep -q "^@0: HELLO_OK stream=0 len=[0-9]* HelloReply{protocol_version=1 shim_version=\"0.1.0\".* pid=$DPID " \
		"$T/out" || fail "shim side, frame 1: $(cat "$T/out")"
	grep -q '^@[0-9]*: PONG stream=0 len=8 ' "$T/out" || fail "shim side, frame 2: $(cat "$T/out")"
	stop_daemon "$DPID"
}

case_token()
{
	local port sock=$T/s
	printf 'correct-horse\n' >"$T/token"
	printf 'wrong-horse\n' >"$T/bad-token"
	chmod 600 "$T/token" "$T/bad-token"
	start_daemon shim --listen tcp:127.0.0.1:0 --listen "unix:$sock" --token-file "$T/token"
	port=$(tcp_port shim)
	[ -n "$port" ] || fail "no tcp port in the log"

	run 0 --token-file "$T/token" -t "tcp:127.0.0.1:$port" ping
	has out "pong from sandbox-shim"
	run 0 --token-file "$T/token" -t "unix:$sock" info

	run 3 --token-file "$T/bad-token" -t "tcp:127.0.0.1:$port" ping
	has err "EACCES"
	has err "bad token"
	run 3 -t "tcp:127.0.0.1:$port" ping
	has err "EACCES"
	has err "token required"
	# $SBX_TOKEN stands in for --token-file
	SBX_TOKEN=correct-horse run 0 -t "tcp:127.0.0.1:$port" ping
	run 1 --token-file "$T/no-such-file" -t "tcp:127.0.0.1:$port" ping

	# a trace never shows the token
	run 0 --trace --token-file "$T/token" -t "tcp:127.0.0.1:$port" ping
	has err "token=<13 bytes hidden>"
	if grep -q correct-horse "$T/err"; then
		fail "the trace shows the token"
	fi
	stop_daemon "$DPID"
}

# issue 18: the global options after the command too; each at most on one side
case_global_after()
{
	local sock=$T/s
	start_daemon shim --listen "unix:$sock"
	mkdir "$T/d"
	run 0 stat --json "$T/d" -t "unix:$sock"
	"$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["type"] == "directory"' "$T/out" ||
		fail "stat --json PATH -t: $(cat "$T/out")"
	run 0 ping --target "unix:$sock" --timeout 10 --trace
	has err "sbx: trace: > PING"
	has out "pong from sandbox-shim"
	run 0 -t "unix:$sock" ls --json "$T/d"
	run 0 ping -t "unix:$sock" -c 2 --json
	"$PY" -c 'import json, sys; assert len(json.load(open(sys.argv[1]))["rtt_ms"]) == 2' "$T/out" ||
		fail "ping --json after the command: $(cat "$T/out")"
	# ps and tunnels now take the global --json, before or after
	run 0 -t "unix:$sock" ps --json
	run 0 --json -t "unix:$sock" tunnels
	# after exec, -t is exec's --tty and --timeout the command's; the global ones come first
	run 0 --timeout 10 -t "unix:$sock" exec --timeout 5 -- true
	run 0 -t "unix:$sock" exec --trace -- true
	has err "sbx: trace: > REQUEST stream=1"
	# a -- ends the options: what follows is the command's
	run 0 -t "unix:$sock" exec -- echo --json -t x
	[ "$(cat "$T/out")" = "--json -t x" ] || fail "exec -- ARGV: $(cat "$T/out")"
	stop_daemon "$DPID"
}

# issue 18: bad global options after the command: a clear message and exit status 2
case_global_bad()
{
	local sock=$T/s
	start_daemon shim --listen "unix:$sock"
	# given twice: once before and once after the command
	run 2 -t "unix:$sock" ping -t "unix:$sock"
	has err "sbx: ping: option '-t/--target' given both before and after the command"
	run 2 --json -t "unix:$sock" stat --json /
	has err "option '--json' given both before and after the command"
	run 2 --timeout 5 -t "unix:$sock" info --timeout 5
	has err "option '--timeout' given both before and after the command"
	run 2 --trace -t "unix:$sock" info --trace
	has err "option '--trace' given both before and after the command"
	echo tok >"$T/tok"
	run 2 --token-file "$T/tok" -t "unix:$sock" ping --token-file "$T/tok"
	has err "sbx: ping: option '--token-file' given both before and after the command"
	empty out
	# the long form after the short one before is the same option
	run 2 -t "unix:$sock" info --target "unix:$sock"
	has err "option '-t/--target' given both before and after the command"
	empty out
	# repeated on one side, the last one wins, as it always did
	run 0 -t unix:/nonexistent -t "unix:$sock" ping
	# unknown, ambiguous and malformed options after the command
	run 2 -t "unix:$sock" ping --bogus
	has err "sbx: ping: unknown option '--bogus'"
	has err "usage: sbx [OPTIONS] ping"
	run 2 -t "unix:$sock" stat -Q /
	has err "unknown option '-Q'"
	# a command without options of its own: the same messages, and nothing done
	run 2 -t "unix:$sock" info --bogus
	has err "sbx: info: unknown option '--bogus'"
	has err "Try 'sbx info --help' for more information."
	empty out
	run 2 -t "unix:$sock" mkdir "$T/nope2" --bogus
	has err "sbx: mkdir: unknown option '--bogus'"
	[ ! -e "$T/nope2" ] || fail "mkdir ran despite the unknown option"
	run 2 -t "unix:$sock" ls -Z /
	has err "sbx: ls: unknown option '-Z'"
	empty out
	# reverse has no --bind (forward has): refused by name
	run 2 -t "unix:$sock" reverse --bind 127.0.0.1 0 1
	has err "sbx: reverse: unknown option '--bind'"
	run 2 -t "unix:$sock" ping --json=yes
	has err "option '--json' takes no argument"
	run 2 -t "unix:$sock" ping --t
	has err "ambiguous option '--t'"
	run 2 -t "unix:$sock" ping --timeout 0
	has err "bad --timeout '0'"
	run 2 ping -t
	has err "needs an argument"
	# --json on a command without JSON output, before or after it
	run 2 -t "unix:$sock" cat --json /etc/hostname
	has err "sbx: cat: --json: this command has no JSON output"
	run 2 --json -t "unix:$sock" mkdir "$T/nope"
	has err "sbx: mkdir: --json: this command has no JSON output"
	[ ! -e "$T/nope" ] || fail "mkdir ran despite the usage error"
	run 2 --json decode /dev/null
	has err "no JSON output"
	run 2 -t "unix:$sock" kill --json -s TERM nosuchid
	has err "sbx: kill: --json: this command has no JSON output"
	empty out
	run 2 -t "unix:$sock" help --json
	has err "sbx: help: --json: this command has no JSON output"
	empty out
	stop_daemon "$DPID"
}

# issue 18: JSON strings use the short escapes (\n, \t...), \u00XX only for other control bytes
case_json_escapes()
{
	local sock=$T/s d
	start_daemon shim --listen "unix:$sock"
	d=$T/$'dir\nwith\ttab'
	mkdir "$d"
	printf x >"$d/"$'f\r\b\f\x01\x7f"\\'
	run 0 -t "unix:$sock" stat --json "$d"
	has out 'dir\nwith\ttab"'
	grep -q 'u000a\|u0009' "$T/out" && fail "stat --json: \\u000a or \\u0009 for a newline or tab"
	"$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["path"] == sys.argv[2]' "$T/out" "$d" ||
		fail "stat --json path does not round-trip: $(cat "$T/out")"
	run 0 -t "unix:$sock" ls --json "$d"
	has out '"f\r\b\f\u0001\u007f\"\\"'
	run 0 -t "unix:$sock" realpath --json "$d"
	has out '{"path":"'"$T"'/dir\nwith\ttab"}'
	# the SDK's record writers (sbx_backup_record_json) escape the same way
	run 0 -t "unix:$sock" backup "$d" --to "$T/b.tar" --json
	has out '"dir":"'"$T"'/dir\nwith\ttab"'
	"$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["dir"] == sys.argv[2]' "$T/out" "$d" ||
		fail "backup --json dir does not round-trip: $(cat "$T/out")"
	stop_daemon "$DPID"
}

case "$CASE" in
wait | exit_codes | json | trace | decode | token | global_after | global_bad | json_escapes) "case_$CASE" ;;
*)
	echo "cli.sh: no case '$CASE'" >&2
	exit 2
	;;
esac
echo "$CASE: ok"
