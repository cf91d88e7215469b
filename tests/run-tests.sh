#!/usr/bin/env bash
# Run every test: `bash tests/run-tests.sh` (from any directory).
#
#   1. tests/deps.sh                     install what is missing (Debian 12 packages); then
#      tests/deps.sh --containers        podman & co. for the e2e image test, ctest label e2e
#                                        (both skipped with SBX_SKIP_E2E=1)
#   2. clang-format check                *.c/*.h under shim/ sdk/ proto/ tests/ (if clang-format is installed)
#   3. build/         RelWithDebInfo, -Werror, then ctest
#   4. build-asan/    Debug, ASan+UBSan, then ctest        (skipped with SBX_SKIP_ASAN=1)
#   5. build-static/  the daemon linked fully statically, checked to have no dynamic dependencies
#   6. build-fuzz/    the libFuzzer targets (clang), each run for SBX_FUZZ_SECONDS (60) on a copy
#                     of its corpus                     (skipped with SBX_SKIP_FUZZ=1)
#
# A failing section does not stop the later ones; the script exits non-zero if any failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
JOBS=2

failed=()
tests_passed=0
tests_failed=0

section()
{
	printf '\n==== %s ====\n' "$*"
}

# ok/fail NAME: record a section's outcome.
ok()
{
	printf -- '---- %s: OK\n' "$1"
}
fail()
{
	printf -- '---- %s: FAILED\n' "$1"
	failed+=("$1")
}

# run_ctest DIR: ctest in DIR; adds its counts to the totals.
run_ctest()
{
	local dir=$1 log rc line
	log=$(mktemp)
	ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$JOBS" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	# "100% tests passed, 0 tests failed out of 12"
	line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
	if [ -n "$line" ]; then
		local nfail total
		nfail=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
		total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
		tests_passed=$((tests_passed + total - nfail))
		tests_failed=$((tests_failed + nfail))
	fi
	rm -f "$log"
	return "$rc"
}

# build_and_test NAME DIR CMAKE_ARGS...: configure, build, ctest.
build_and_test()
{
	local name=$1 dir=$2
	shift 2
	section "$name: configure ($dir)"
	if ! cmake -S "$ROOT" -B "$dir" "$@"; then
		fail "$name"
		return
	fi
	section "$name: build"
	if ! cmake --build "$dir" -j"$JOBS"; then
		fail "$name"
		return
	fi
	section "$name: ctest"
	if ! run_ctest "$dir"; then
		fail "$name"
		return
	fi
	ok "$name"
}

# ---- 1. dependencies ----
section "dependencies (tests/deps.sh)"
if ! bash "$ROOT/tests/deps.sh"; then
	fail "dependencies"
	echo "cannot go on without the dependencies" >&2
	exit 1
fi
# s3rver from npm for the mount tests (skipped when already installed)
# shellcheck source=tests/lib/s3rver.sh
source "$ROOT/tests/lib/s3rver.sh"
if ! s3rver_install; then
	echo "s3rver could not be installed: the mount tests (it_mount, cli_mount) will fail" >&2
fi
# podman & co. for tests/e2e/image.sh (without them it skips); the image prepared in the background
if [ "${SBX_SKIP_E2E:-0}" = 1 ]; then
	echo "e2e: skipped (SBX_SKIP_E2E=1)"
elif ! bash "$ROOT/tests/deps.sh" --containers; then
	echo "podman & co. could not be installed: tests/e2e/image.sh will skip" >&2
else
	# the base image and podman's layer cache, made while the builds below compile (debootstrap
	# and apt are mostly network); the e2e test waits for it through a lock
	e2e_prepare_log=$(mktemp /tmp/sbx-e2e-prepare.XXXXXX)
	echo "e2e: preparing the image in the background (log: $e2e_prepare_log)"
	bash "$ROOT/tests/e2e/image.sh" --prepare >"$e2e_prepare_log" 2>&1 </dev/null &
	e2e_prepare_pid=$!
fi

# ---- 2. formatting ----
section "format (clang-format --dry-run --Werror)"
if command -v clang-format >/dev/null 2>&1; then
	clang-format --version
	mapfile -d '' sources < <(find shim sdk proto tests -type f \( -name '*.c' -o -name '*.h' \) \
		-not -path 'tests/fuzz/corpus/*' -print0 2>/dev/null | sort -z)
	bad=()
	for f in "${sources[@]}"; do
		if ! clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
			bad+=("$f")
		fi
	done
	if [ "${#bad[@]}" -eq 0 ]; then
		echo "${#sources[@]} files formatted as .clang-format says"
		ok "format"
	else
		echo "not formatted as .clang-format says (fix with: clang-format -i FILE...):"
		printf '  %s\n' "${bad[@]}"
		fail "format"
	fi
else
	echo "clang-format not installed: skipped"
fi

# ---- 3. main build ----
build_and_test "build" build -DSHIM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

# ---- 4. sanitizers ----
if [ "${SBX_SKIP_ASAN:-0}" = 1 ]; then
	section "asan: skipped (SBX_SKIP_ASAN=1)"
else
	export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
	export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
	build_and_test "asan" build-asan -DSHIM_WERROR=ON -DSHIM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	unset ASAN_OPTIONS UBSAN_OPTIONS
fi

# ---- 5. static daemon ----
static_check()
{
	local bin=build-static/sandbox-shim
	section "static: configure (build-static)"
	cmake -S "$ROOT" -B build-static -DSHIM_STATIC=ON -DSHIM_WERROR=ON -DSHIM_TESTS=OFF \
		-DCMAKE_BUILD_TYPE=Release || return 1
	section "static: build (target sandbox-shim)"
	cmake --build build-static -j"$JOBS" --target sandbox-shim || return 1
	section "static: check $bin"
	if command -v file >/dev/null 2>&1; then
		file "$bin"
	fi
	ls -l "$bin"
	# A static binary has no program interpreter and needs no shared library.
	if readelf -lW "$bin" | grep -q 'Requesting program interpreter'; then
		echo "$bin has a program interpreter (INTERP): not static" >&2
		readelf -lW "$bin" | grep -A1 INTERP >&2
		return 1
	fi
	if readelf -dW "$bin" | grep -q '(NEEDED)'; then
		echo "$bin needs shared libraries: not static" >&2
		readelf -dW "$bin" | grep '(NEEDED)' >&2
		return 1
	fi
	echo "no INTERP, no NEEDED: static"
	"$bin" --version || return 1
}
if static_check; then
	ok "static"
else
	fail "static"
fi

# ---- 6. fuzzing ----
# ctest replays each fuzz target's corpus in the builds above (fuzz_replay, fuzz_rx_replay,
# fuzz_restore_replay); here the libFuzzer build (clang, ASan+UBSan) mutates from those seeds
# for a while. Each target works on a copy of its corpus in a fresh directory (on tmpfs when
# there is one: the restore target's journal fsyncs), so the tree stays clean. A crash, a leak,
# a timeout, a harness abort (a broken invariant) or an exit status other than 0 fails the
# section; the input that did it is kept there, its path and base64 printed.
FUZZ_TARGETS=(fuzz_conn:corpus fuzz_rx:corpus_rx fuzz_restore:corpus_restore)

# fuzz_one NAME CORPUS SECONDS: run build-fuzz/tests/fuzz/NAME on a copy of tests/fuzz/CORPUS.
fuzz_one()
{
	local name=$1 corpus=$2 secs=$3 work log rc art seeds
	work=$(mktemp -d "$fuzz_tmp/$name.XXXXXX")
	mkdir "$work/corpus" "$work/tmp"
	seeds=("$ROOT/tests/fuzz/$corpus"/*)
	cp "${seeds[@]}" "$work/corpus/"
	log=$work/libfuzzer.log
	section "fuzz: $name for $secs s on tests/fuzz/$corpus (${#seeds[@]} inputs)"
	# the harness's own scratch directories go to $work/tmp as well
	TMPDIR=$work/tmp UBSAN_OPTIONS=print_stacktrace=1 "build-fuzz/tests/fuzz/$name" \
		-max_total_time="$secs" -timeout=25 -rss_limit_mb=4096 -print_final_stats=1 \
		-artifact_prefix="$work/" "$work/corpus" >"$log" 2>&1
	rc=$?
	grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log"
	grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log"
	if [ "$rc" -eq 0 ] && ! grep -qE '^==[0-9]+==ERROR|^SUMMARY: ' "$log"; then
		# "#123456 DONE cov: 513 ft: 1473 corp: 264/639Kb lim: ... exec/s: 6500 rss: 331Mb"
		local done_line runs eps
		done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
		runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log")
		eps=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log")
		echo "$name: ${runs:-?} runs in $secs s, ${eps:-?} exec/s, $(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$done_line")"
		rm -rf "$work"
		return 0
	fi
	echo "$name: FAILED (exit status $rc); the end of libFuzzer's log ($log):"
	tail -n 80 "$log"
	for art in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*; do
		[ -f "$art" ] || continue
		echo "$name: crashing input saved as $art ($(stat -c %s "$art") bytes)"
		echo "$name: replay it with: build-fuzz/tests/fuzz/$name $art"
		echo "$name: its base64 (first 64 KiB): $(head -c 65536 "$art" | base64 -w0)"
	done
	return 1
}

fuzz_section()
{
	local secs=${SBX_FUZZ_SECONDS:-60} t status=0
	section "fuzz: configure (build-fuzz, clang)"
	CC=clang cmake -S "$ROOT" -B build-fuzz -DSHIM_FUZZ=ON -DSHIM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo ||
		return 1
	section "fuzz: build (${FUZZ_TARGETS[*]%%:*})"
	cmake --build build-fuzz -j"$JOBS" --target "${FUZZ_TARGETS[@]%%:*}" || return 1
	if [ -d /dev/shm ] && [ -w /dev/shm ]; then
		fuzz_tmp=$(mktemp -d /dev/shm/sbx-fuzz.XXXXXX)
	else
		fuzz_tmp=$(mktemp -d /tmp/sbx-fuzz.XXXXXX)
	fi
	for t in "${FUZZ_TARGETS[@]}"; do
		fuzz_one "${t%%:*}" "${t#*:}" "$secs" || status=1
	done
	# what failed stays (its inputs are named above); the rest was removed
	rmdir "$fuzz_tmp" 2>/dev/null
	return "$status"
}
if [ "${SBX_SKIP_FUZZ:-0}" = 1 ]; then
	section "fuzz: skipped (SBX_SKIP_FUZZ=1)"
elif fuzz_section; then
	ok "fuzz"
else
	fail "fuzz"
fi

# ---- summary ----
# the background image preparation (section 1) must have ended
if [ -n "${e2e_prepare_pid:-}" ]; then
	if wait "$e2e_prepare_pid"; then
		rm -f "$e2e_prepare_log"
	else
		echo "e2e: the background preparation failed (see $e2e_prepare_log)"
	fi
fi
section "summary"
if [ "${#failed[@]}" -ne 0 ]; then
	echo "FAILED sections: ${failed[*]}"
else
	echo "all sections passed"
fi
# ctest's counts added up over all builds, as the closing line.
echo "tests: $tests_passed passed, $tests_failed failed"
[ "${#failed[@]}" -eq 0 ]
