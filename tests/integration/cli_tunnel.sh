#!/usr/bin/env bash
# cli_tunnel.sh: sbx forward, sbx reverse and sbx tunnels against a real daemon: python3 -m
# http.server inside fetched through a forward, a command inside reaching a host echo server
# through a reverse, per-connection logs, the list (table and JSON), closing by id, SIGINT and
# SIGTERM, ECONNREFUSED and EADDRINUSE, the exec: (stdio) transport.
#
# Usage: bash cli_tunnel.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own daemon in a mktemp -d directory and stops only it (and what it started), by PID.
# Every port is kernel-chosen. Exits 1 if any check failed.
set -uo pipefail

SHIM=${1:?usage: cli_tunnel.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_tunnel.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-tunnel.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
# cleanup, fail, start_daemon, run, has, hasnt, empty, py, run_sections, stop_daemon, finish
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"

# wait_for FILE TEXT [SECONDS]: FILE comes to contain TEXT.
wait_for()
{
	local i n=$((${3:-10} * 100))
	for ((i = 0; i < n; i++)); do
		grep -qsF -- "$2" "$1" && return 0
		sleep 0.01
	done
	fail "$1 never showed '$2': $(tail -n 3 "$1" 2>/dev/null)"
	return 1
}

# A host echo server on a kernel-chosen port (written to $1), until killed; sets EPID.
echo_server()
{
	python3 -u -c '
import socket, sys, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
def h(c):
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()
' "$1" &
	EPID=$!
	PIDS+=("$EPID")
	local i
	for ((i = 0; i < 1000; i++)); do
		[ -s "$1" ] && return 0
		sleep 0.01
	done
	fail "the echo server did not start"
}

# The client used inside (via sbx exec) and on the host: connect to port $1, send $2 bytes
# (a fixed pattern), half-close, read to EOF, print "OK N" if the echo came back exact.
CLIENT='
import socket, sys, threading
n = int(sys.argv[2])
data = (bytes(range(256)) * (n // 256 + 1))[:n]
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def w():
    s.sendall(data); s.shutdown(socket.SHUT_WR)
th = threading.Thread(target=w); th.start()
got = bytearray()
while True:
    b = s.recv(65536)
    if not b: break
    got += b
th.join()
print("OK" if bytes(got) == data else "BAD", len(got))
'

# tunnel_start LOG ARGS...: run sbx ARGS in the background (stderr to LOG) until it prints its
# port; sets TPID and TPORT.
tunnel_start()
{
	local log=$1
	shift
	TLOG=$log
	"$SBX" -t "$TARGET" "$@" 2>"$log" </dev/null &
	TPID=$!
	PIDS+=("$TPID")
	TPORT=
	wait_for "$log" "listening on" || return 1
	TPORT=$(sed -n 's/.*listening on [^ ,]*:\([0-9][0-9]*\)[, ].*/\1/p' "$log" | head -n 1)
	[ -n "$TPORT" ] || fail "no port in $(cat "$log")"
}

# tunnel_stop SIGNAL: the tunnel exits 0 on it.
tunnel_stop()
{
	kill -"$1" "$TPID"
	local rc=0
	wait "$TPID" || rc=$?
	[ "$rc" -eq 0 ] || fail "sbx tunnel exited $rc after SIG$1"
	# under ASan/UBSan: no report from the tunnel's sbx either
	! grep -qE 'Sanitizer|runtime error:' "$TLOG" || fail "sanitizer report in $TLOG: $(grep -m3 -E 'Sanitizer|runtime error:' "$TLOG")"
}

sec_usage()
{
	run 2 forward
	has err "usage: sbx"
	run 2 forward 0
	run 2 forward 70000 80
	run 2 forward 0 0
	run 2 forward 0 http
	run 2 forward ::1:80 80
	run 2 forward --bind 127.0.0.1 127.0.0.1:0 80
	has err "given twice"
	run 2 reverse 80
	run 2 reverse 80 0
	run 2 reverse 80 81 82
	run 2 tunnels extra
	run 0 forward --help
	has out "forward"
	run 0 reverse --help
	has out "reverse"
	run 0 tunnels --help
}

sec_forward()
{
	mkdir -p "$T/www"
	head -c 200000 /dev/urandom >"$T/www/blob.bin"
	run 0 exec --detach --name web -- python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$T/www" || return
	local i port=
	for ((i = 0; i < 1000; i++)); do
		run 0 logs web
		port=$(sed -n 's/.* port \([0-9][0-9]*\) .*/\1/p' "$T/out" | head -n 1)
		[ -n "$port" ] && break
		sleep 0.01
	done
	[ -n "$port" ] || {
		fail "http.server printed no port"
		return
	}
	tunnel_start "$T/fwd.log" forward 0 "$port" || return
	has_log()
	{
		grep -qF -- "$1" "$T/fwd.log" || fail "fwd.log does not contain '$1': $(cat "$T/fwd.log")"
	}
	has_log "forwarding to 127.0.0.1:$port in the sandbox"
	py '
import sys, urllib.request
got = urllib.request.urlopen("http://127.0.0.1:%s/blob.bin" % sys.argv[1], timeout=30).read()
want = open(sys.argv[2], "rb").read()
assert got == want, "%d bytes, want %d" % (len(got), len(want))
' "$TPORT" "$T/www/blob.bin"
	wait_for "$T/fwd.log" "closed after"
	has_log "connection 1 from 127.0.0.1:"
	has_log "to 127.0.0.1:$port: open"
	run 0 tunnels
	has out "forward"
	has out "127.0.0.1:$port"
	has out "127.0.0.1:$TPORT"
	run 0 tunnels --json
	py '
import json, sys
v = json.load(open(sys.argv[1]))
assert len(v) == 1, v
t = v[0]
assert t["kind"] == "forward" and t["port"] == int(sys.argv[2]) and t["host"] == "127.0.0.1", t
assert t["remote"] == "127.0.0.1:" + sys.argv[3], t
assert t["total"] >= 1 and t["bytes_out"] >= 200000, t
assert set(t) == {"id", "kind", "host", "port", "remote", "client", "active", "total", "bytes_in", "bytes_out"}, t
' "$T/out" "$port" "$TPORT"
	tunnel_stop INT
	has_log "closing"
	# its port is closed and the shim forgot the tunnel
	py '
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
    raise SystemExit("the forward port still accepts")
except ConnectionRefusedError:
    pass
' "$TPORT"
	for ((i = 0; i < 500; i++)); do
		run 0 tunnels --json
		[ "$(cat "$T/out")" = "[]" ] && break
		sleep 0.01
	done
	[ "$(cat "$T/out")" = "[]" ] || fail "tunnels after the forward ended: $(cat "$T/out")"
	run 0 rmproc -k web
}

sec_reverse()
{
	echo_server "$T/echo.port"
	local eport
	eport=$(cat "$T/echo.port")
	tunnel_start "$T/rev.log" reverse 0 "$eport" || return
	grep -qF "in the sandbox, forwarding to 127.0.0.1:$eport" "$T/rev.log" || fail "rev.log: $(cat "$T/rev.log")"
	# a command inside reaches the host's echo server
	run 0 exec -- python3 -c "$CLIENT" "$TPORT" 1048580
	has out "OK 1048580"
	wait_for "$T/rev.log" "closed after 1048580 bytes in, 1048580 out"
	wait_for "$T/rev.log" "to 127.0.0.1:$eport: open"
	run 0 tunnels --json
	py '
import json, sys
v = json.load(open(sys.argv[1]))
assert len(v) == 1 and v[0]["kind"] == "reverse" and v[0]["port"] == int(sys.argv[2]), v
assert v[0]["bytes_in"] == 1048580 and v[0]["bytes_out"] == 1048580, v
' "$T/out" "$TPORT"
	local id
	id=$(sed -n 's/^sbx: \(t[0-9]*\): listening.*/\1/p' "$T/rev.log")
	run 1 tunnels --close t999999
	has err "ENOENT"
	# closed by id from another client: the running sbx reverse ends, status 0
	run 0 tunnels --close "$id"
	local rc=0
	wait "$TPID" || rc=$?
	[ "$rc" -eq 0 ] || fail "sbx reverse exited $rc after its tunnel was closed"
	grep -qF "closed by the shim" "$T/rev.log" || fail "rev.log: $(tail -n 2 "$T/rev.log")"
	# SIGTERM ends a reverse as well
	tunnel_start "$T/rev2.log" reverse 0 "$eport" || return
	tunnel_stop TERM
}

sec_errors()
{
	# nothing listens inside: each connection fails with ECONNREFUSED (logged), the tunnel stays
	local free
	free=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	tunnel_start "$T/ref.log" forward 0 "$free" || return
	# the host side of the connection is reset
	python3 -c '
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
try:
    print("got %r" % s.recv(10))
except ConnectionResetError:
    print("reset")
' "$TPORT" >"$T/out" 2>&1
	has out "reset"
	wait_for "$T/ref.log" "failed: ECONNREFUSED: 127.0.0.1:$free"
	kill -0 "$TPID" 2>/dev/null || fail "sbx forward ended after a refused connection"
	tunnel_stop INT
	# a port taken inside, and on the host
	python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(120)
' "$T/taken" &
	local hold=$! i
	PIDS+=("$hold")
	for ((i = 0; i < 1000; i++)); do
		[ -s "$T/taken" ] && break
		sleep 0.01
	done
	run 1 reverse "$(cat "$T/taken")" 80
	has err "EADDRINUSE"
	has err "127.0.0.1:$(cat "$T/taken")"
	run 1 forward --bind 127.0.0.1 "$(cat "$T/taken")" 80
	has err "EADDRINUSE"
	run 1 reverse not-an-ip:0 80
	has err "EINVAL"
	kill "$hold"
	wait "$hold" 2>/dev/null
	run 0 tunnels --json
	[ "$(cat "$T/out")" = "[]" ] || fail "tunnels left after failures: $(cat "$T/out")"
}

sec_stdio()
{
	local saved=$TARGET
	TARGET="exec:$SHIM --stdio --state-dir $T/state-stdio"
	echo_server "$T/echo2.port"
	tunnel_start "$T/stdio.log" forward 0 "$(cat "$T/echo2.port")" || {
		TARGET=$saved
		return
	}
	python3 -c "$CLIENT" "$TPORT" 1048576 >"$T/out" 2>&1
	has out "OK 1048576"
	tunnel_stop INT
	tunnel_start "$T/stdio2.log" reverse 0 "$(cat "$T/echo2.port")"
	python3 -c "$CLIENT" "$TPORT" 1048576 >"$T/out" 2>&1
	has out "OK 1048576"
	tunnel_stop TERM
	TARGET=$saved
}

start_daemon shim --listen "unix:$T/s.sock"
TARGET=unix:$T/s.sock

SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage forward reverse errors stdio)
run_sections "${SECTIONS[@]}"
stop_daemon
finish cli_tunnel
