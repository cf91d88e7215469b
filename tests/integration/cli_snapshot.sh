#!/usr/bin/env bash
# cli_snapshot.sh: sbx snapshot-prepare and sbx resumed against a real daemon: the steps as text
# and JSON, the generation in sbx info, the refusals (EBUSY, EINVAL) and usage errors. The daemon
# "sets" its clock through the test seam (SANDBOX_SHIM_TEST_CLOCK_FILE, PROTOCOL.md 12.6): no
# run here changes this machine's clock.
#
# Usage: bash cli_snapshot.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own daemon in a mktemp -d directory and stops only it, by PID.
set -uo pipefail

SHIM=${1:?usage: cli_snapshot.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_snapshot.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-snapshot.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
# cleanup, fail, start_daemon, run, has, hasnt, empty, py, run_sections, stop_daemon, finish
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"
DAEMON_ENV=("SANDBOX_SHIM_TEST_CLOCK_FILE=$T/clock")
start_daemon shim --listen "unix:$T/shim.sock"
TARGET=unix:$T/shim.sock

sec_usage()
{
	run 2 snapshot-prepare extra
	run 2 snapshot-prepare --thaw-after x
	has err "bad --thaw-after"
	run 2 resumed --time yesterday
	has err "bad --time"
	run 2 resumed extra
	run 1 resumed --entropy-file "$T/missing"
	has err "$T/missing"
}

sec_sequence()
{
	run 0 info --json
	has out '"generation":0'
	run 0 snapshot-prepare
	has out "sync"
	has out "generation:    0"
	has out "thaw after:    30000 ms"
	run 1 snapshot-prepare
	has err EBUSY
	# the host's time now (the default), through the seam
	run 0 resumed --json
	# only once the seam is seen in place is a time sent that is not this host's
	local before=$FAILS
	py 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["generation"] == 1 and r["prepared"] is True, r
names = [s["name"] for s in r["steps"]]
assert names[:2] == ["clock", "entropy"] and "continue" in names, names
c = r["steps"][0]
assert "test seam" in c["message"] or c["error"] == "EPERM", c' "$T/out" || return
	[ "$FAILS" -eq "$before" ] || return
	run 0 info
	has out "generation:    1"
	head -c 32 /dev/urandom >"$T/e32"
	run 0 resumed --fork --entropy-file "$T/e32" --time 2030-01-02T03:04:05Z
	has out "generation:    2"
	has out "prepared:      no"
}

sec_errors()
{
	run 1 resumed --entropy-file /dev/null
	has err EINVAL
	has err "entropy: 0 bytes"
	head -c 600 /dev/zero >"$T/e600"
	run 1 resumed --entropy-file "$T/e600"
	has err "entropy: 513 bytes"
	run 1 resumed --time 1969-12-31T23:59:59Z
	has err "before 1970"
	run 1 snapshot-prepare --freeze "$T"
	has err "not a mount point"
	run 1 snapshot-prepare --freeze /
	has err EBUSY
	run 1 snapshot-prepare --thaw-after 0.05
	has err "thaw_after_ms"
	# nothing is held after those
	run 0 snapshot-prepare --json --thaw-after 90
	has out '"thaw_after_ms":90000'
	run 0 resumed
}

SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage sequence errors)
run_sections "${SECTIONS[@]}"
stop_daemon
finish cli_snapshot
