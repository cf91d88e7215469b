#!/usr/bin/env bash
# shim_image_opts.sh SHIM SBX: the daemon options images rely on (issue 8).
#   - `--listen-optional vsock:...` without /dev/vsock (hidden by a tmpfs in a private mount
#     namespace): logged and skipped, the other listeners serve; with /dev/vsock: listened on
#   - a trailing `--` with nothing after it: no workload (an ENTRYPOINT ending in "--" with an
#     empty CMD); without any transport it is still a usage error
#   - --listen-optional on a unix path that cannot be bound is still fatal; nothing left to
#     serve (every optional listener skipped, no workload) is an error
set -uo pipefail
SHIM=$1
SBX=$2
T=$(mktemp -d)
PIDS=()
FAILS=0
cleanup()
{
	local p
	for p in "${PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	rm -rf "$T"
}
trap cleanup EXIT

fail()
{
	echo "shim_image_opts.sh:${BASH_LINENO[0]}: FAIL $*" >&2
	FAILS=$((FAILS + 1))
}

# wait_ready LOG PID: until the daemon logs "ready"
wait_ready()
{
	local i
	for ((i = 0; i < 1000; i++)); do
		grep -qs ' ready (pid ' "$1" && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.01
	done
	return 1
}

# stop PID: SIGTERM, wait; returns the exit status
stop()
{
	kill -TERM "$1"
	wait "$1"
}

# 1. no /dev/vsock: the optional vsock listener is skipped, the unix one serves
if unshare -m true 2>/dev/null; then
	unshare -m sh -c 'mount -t tmpfs none /dev && exec "$@"' - \
		"$SHIM" --state-dir "$T/st1" --listen-optional vsock:-1:4294967295 --listen "unix:$T/a.sock" -- \
		2>"$T/a.log" </dev/null &
	p=$!
	PIDS+=("$p")
	if wait_ready "$T/a.log" "$p"; then
		grep -q 'not listening on vsock:-1:4294967295: no /dev/vsock here' "$T/a.log" ||
			fail "no log line for the skipped vsock listener: $(cat "$T/a.log")"
		"$SBX" -t "unix:$T/a.sock" ping >/dev/null || fail "ping on the unix socket"
		stop "$p" || fail "exit status after SIGTERM"
	else
		fail "the daemon did not start without /dev/vsock: $(cat "$T/a.log")"
	fi
else
	echo "no mount namespaces here: the /dev/vsock-less case is not run"
fi

# 2. with /dev/vsock: listened on (a kernel-chosen port)
if [ -e /dev/vsock ]; then
	"$SHIM" --state-dir "$T/st2" --listen-optional vsock:-1:4294967295 2>"$T/b.log" </dev/null &
	p=$!
	PIDS+=("$p")
	if wait_ready "$T/b.log" "$p"; then
		grep -q 'listening on vsock:-1:4294967295' "$T/b.log" || fail "vsock not listened on: $(cat "$T/b.log")"
		stop "$p" || fail "exit status after SIGTERM (vsock)"
	else
		fail "the daemon did not start with /dev/vsock: $(cat "$T/b.log")"
	fi
fi

# 3. a trailing "--" without a workload, given a transport: runs
"$SHIM" --state-dir "$T/st3" --listen "unix:$T/c.sock" -- 2>"$T/c.log" </dev/null &
p=$!
PIDS+=("$p")
if wait_ready "$T/c.log" "$p"; then
	"$SBX" -t "unix:$T/c.sock" ping >/dev/null || fail "ping with a trailing --"
	stop "$p" || fail "exit status with a trailing --"
else
	fail "a trailing -- with a transport: $(cat "$T/c.log")"
fi

# 4. "--" alone: still a usage error (nothing to serve)
"$SHIM" --state-dir "$T/st4" -- 2>"$T/d.log" </dev/null
rc=$?
[ "$rc" = 2 ] || fail "'sandbox-shim --': exit $rc, want 2"
grep -q "nothing after '--'" "$T/d.log" || fail "'sandbox-shim --': $(cat "$T/d.log")"

# 5. --listen-optional is not a way to ignore real errors: a unix path in a missing directory
"$SHIM" --state-dir "$T/st5" --listen-optional "unix:$T/missing/e.sock" 2>"$T/e.log" </dev/null &
p=$!
PIDS+=("$p")
wait "$p"
rc=$?
[ "$rc" = 1 ] || fail "--listen-optional on an unbindable unix path: exit $rc, want 1"
grep -q "cannot listen on unix:$T/missing/e.sock" "$T/e.log" || fail "no error for the unbindable path: $(cat "$T/e.log")"

# 6. only optional listeners, all skipped, no workload: nothing to serve is an error
if unshare -m true 2>/dev/null; then
	unshare -m sh -c 'mount -t tmpfs none /dev && exec "$@"' - \
		"$SHIM" --state-dir "$T/st6" --listen-optional vsock:-1:4294967295 2>"$T/f.log" </dev/null
	rc=$?
	[ "$rc" = 1 ] || fail "every optional listener skipped: exit $rc, want 1"
	grep -q "nothing to serve here: every --listen-optional was skipped" "$T/f.log" ||
		fail "every optional listener skipped: $(cat "$T/f.log")"
fi

[ "$FAILS" -eq 0 ] || exit 1
echo "shim_image_opts.sh: all checks passed"
