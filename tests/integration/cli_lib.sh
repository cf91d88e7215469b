# cli_lib.sh: the helpers shared by the cli_*.sh scripts; sourced, not run.
#
# The sourcing script sets SHIM, SBX and T (its mktemp -d directory) first. This file then sets
# PIDS, FAILS, SECTION, the cleanup trap and the check helpers below. Knobs a script may set after
# sourcing: DAEMON_ENV (NAME=VALUE words for the daemon's environment only), RUN_TIMEOUT (seconds
# for one sbx run, default 60). run also honours IN (stdin) and OUT (stdout file), default
# /dev/null and $T/out.
# shellcheck shell=bash
# shellcheck disable=SC2034 # PIDS, FAILS and SECTION are used by the sourcing script

PIDS=()
FAILS=0
SECTION=
DAEMON_ENV=()
RUN_TIMEOUT=60
unset OUT

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

# fail MESSAGE: record a failed check (with the last run's output) and go on. The location is the
# first caller outside this file (the check in the test script, not run or has).
fail()
{
	local f i=1
	while [ "${BASH_SOURCE[i]##*/}" = cli_lib.sh ] && [ $((i + 1)) -lt ${#BASH_SOURCE[@]} ]; do
		i=$((i + 1))
	done
	echo "${BASH_SOURCE[i]##*/}:${BASH_LINENO[i - 1]}: [$SECTION] $*" >&2
	for f in "$T"/out "$T"/err; do
		[ -s "$f" ] || continue
		echo "---- $(basename "$f") ----" >&2
		head -c 2000 "$f" | tail -n 10 | cat -v >&2
	done
	FAILS=$((FAILS + 1))
}

# start_daemon NAME ARGS...: start the daemon (stderr to $T/NAME.log) and wait for "ready"; sets DPID.
start_daemon()
{
	local name=$1 i
	shift
	env "${DAEMON_ENV[@]}" "$SHIM" --state-dir "$T/state-$name" "$@" 2>"$T/$name.log" </dev/null &
	DPID=$!
	PIDS+=("$DPID")
	for ((i = 0; i < 1000; i++)); do
		grep -qs ' ready (pid ' "$T/$name.log" && return 0
		if ! kill -0 "$DPID" 2>/dev/null; then
			cat "$T/$name.log" >&2
			echo "${0##*/}: $name exited before it was ready" >&2
			exit 1
		fi
		sleep 0.01
	done
	echo "${0##*/}: $name was not ready within 10 s" >&2
	exit 1
}

# run WANT_STATUS ARGS...: sbx -t the daemon ARGS, stdout in $OUT (default $T/out), stderr in
# $T/err (stdin from $IN, default /dev/null). Returns 0 if the status was WANT_STATUS.
run()
{
	local want=$1 rc
	shift
	timeout -k 5 "$RUN_TIMEOUT" "$SBX" -t "$TARGET" "$@" <"${IN:-/dev/null}" >"${OUT:-$T/out}" 2>"$T/err"
	rc=$?
	if [ "$rc" -ne "$want" ]; then
		fail "sbx $* exited $rc, want $want"
		return 1
	fi
	# under ASan/UBSan, a report must not hide behind an expected exit status 1
	if grep -qE 'Sanitizer|runtime error:' "$T/err"; then
		fail "sbx $*: sanitizer report"
		return 1
	fi
	return 0
}

# has FILE TEXT / hasnt FILE TEXT: the last run's out or err contains TEXT (or not).
has()
{
	grep -qF -- "$2" "$T/$1" || fail "$1 of the last sbx run does not contain '$2'"
}
hasnt()
{
	! grep -qF -- "$2" "$T/$1" || fail "$1 of the last sbx run contains '$2'"
}

empty()
{
	[ ! -s "$T/$1" ] || fail "$1 of the last sbx run is not empty: $(head -c 300 "$T/$1")"
}

# py CODE ARGS...: a python3 check; fails the test with the code's message.
py()
{
	local code=$1 msg
	shift
	msg=$(python3 -c "$code" "$@" 2>&1) || fail "python check: $msg"
}

# run_sections NAME...: run sec_NAME for each NAME, every one even after a failure, and print
# "NAME: ok" or "NAME: FAILED (N checks)" after each.
run_sections()
{
	local before
	for SECTION in "$@"; do
		before=$FAILS
		"sec_$SECTION"
		if [ "$FAILS" -eq "$before" ]; then
			echo "$SECTION: ok"
		else
			echo "$SECTION: FAILED ($((FAILS - before)) checks)"
		fi
	done
}

# stop_daemon: SIGTERM the daemon start_daemon started; a failed check unless it exits 0.
stop_daemon()
{
	kill -TERM "$DPID"
	wait "$DPID" || {
		SECTION=main
		fail "the daemon did not exit 0 after SIGTERM: $(tail -n 5 "$T/shim.log")"
	}
}

# finish NAME: exit 1 if any check failed, else print "NAME: ok".
finish()
{
	if [ "$FAILS" -ne 0 ]; then
		echo "FAIL: $FAILS checks failed" >&2
		exit 1
	fi
	echo "$1: ok"
}
