#!/usr/bin/env bash
# tests/pyodide/pyodide.sh: sandbox_shim (the Python package, from the source tree) under
# Pyodide in Node, against a real daemon over TCP with a token, through a Node net.Socket
# handed to Python as its transport: how a Python Worker reaches a container.
#
#   SHIM_BIN=build/sandbox-shim bash tests/pyodide/pyodide.sh
#
# Needs node (else exit 77: skipped) and the npm package pyodide, pinned by package-lock.json
# here and installed with `npm ci` into $SBX_PYODIDE_DIR (default
# ~/.cache/sandbox-shim/npm-pyodide) when it is not there yet; no npm and nothing installed:
# skipped too. Prints `ok - NAME` / `not ok - NAME` per check and "N passed, M failed".
set -uo pipefail

command -v node >/dev/null || {
	echo "skip: node not found (apt-get install nodejs npm)"
	exit 77
}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHIM_BIN=${SHIM_BIN:-sandbox-shim}
PYODIDE_DIR=${SBX_PYODIDE_DIR:-${HOME:-/tmp}/.cache/sandbox-shim/npm-pyodide}
command -v "$SHIM_BIN" >/dev/null || [ -x "$SHIM_BIN" ] || {
	echo "not ok - SHIM_BIN=$SHIM_BIN is not an executable" >&2
	exit 1
}

# ---- pyodide from npm, cached; an exclusive lock while installing, a shared one while in use
# (held by this shell only: the daemon and node get fd 9 closed) ----
mkdir -p "$PYODIDE_DIR" || exit 1
exec 9>"$PYODIDE_DIR.lock"
flock -x 9
if cmp -s "$HERE/package-lock.json" "$PYODIDE_DIR/package-lock.json" &&
	[ -f "$PYODIDE_DIR/node_modules/pyodide/pyodide.mjs" ]; then
	: # installed, from this very lock file
elif ! command -v npm >/dev/null; then
	echo "skip: npm not found and pyodide not installed in $PYODIDE_DIR"
	exit 77
else
	echo "# npm ci pyodide into $PYODIDE_DIR"
	if ! cp "$HERE/package.json" "$HERE/package-lock.json" "$PYODIDE_DIR/" ||
		! (cd "$PYODIDE_DIR" && npm ci --no-audit --no-fund --loglevel=error >&2); then
		rm -f "$PYODIDE_DIR/package-lock.json" # not installed: try again next time
		echo "not ok - npm ci pyodide (from the registry) failed" >&2
		exit 1
	fi
fi
flock -s 9

# ---- the daemon: TCP on a kernel-chosen port, a token ----
T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-pyodide.XXXXXX") || exit 1
SHIM_PID=""
# shellcheck disable=SC2317 # cleanup runs from the trap
cleanup()
{
	if [ -n "$SHIM_PID" ] && kill -0 "$SHIM_PID" 2>/dev/null; then
		kill -TERM "$SHIM_PID" 2>/dev/null
		for _ in $(seq 1 100); do
			kill -0 "$SHIM_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$SHIM_PID" 2>/dev/null
		wait "$SHIM_PID" 2>/dev/null
	fi
	rm -rf "$T"
}
trap cleanup EXIT

(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token")
mkdir -p "$T/work"
"$SHIM_BIN" --listen tcp:127.0.0.1:0 --token-file "$T/token" --state-dir "$T/state" \
	>"$T/shim.log" 2>&1 </dev/null 9>&- &
SHIM_PID=$!
PORT=""
for _ in $(seq 1 200); do
	PORT=$(sed -n 's/.* listening on tcp:127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$T/shim.log" | head -1)
	[ -n "$PORT" ] && grep -q " ready (pid " "$T/shim.log" && break
	PORT=""
	kill -0 "$SHIM_PID" 2>/dev/null || break
	sleep 0.05
done
if [ -z "$PORT" ]; then
	echo "not ok - the daemon did not start; its log:"
	cat "$T/shim.log"
	exit 1
fi
echo "# sandbox-shim pid $SHIM_PID on tcp:127.0.0.1:$PORT; $(node --version); pyodide from $PYODIDE_DIR"

# ---- the checks ----
PYODIDE_DIR=$PYODIDE_DIR node "$HERE/run.mjs" --host 127.0.0.1 --port "$PORT" \
	--token-file "$T/token" --work "$T/work" 9>&-
rc=$?
if ! kill -0 "$SHIM_PID" 2>/dev/null; then
	echo "not ok - the daemon exited during the test"
	rc=1
fi
if [ "$rc" -ne 0 ]; then
	echo "# the daemon's log:"
	sed 's/^/#   /' "$T/shim.log"
fi
exit "$rc"
