#!/usr/bin/env bash
# Build the benchmarks and run them all: `bash tests/bench/run.sh` (from any directory).
#
#   BUILD_DIR=DIR        build there instead of build/
#   BUILD_TYPE=TYPE      CMAKE_BUILD_TYPE (default RelWithDebInfo, as tests/run-tests.sh builds build/)
#   SHIM_STATIC_BIN=BIN  a static sandbox-shim for bench_rss and bench_startup (default: build-static/sandbox-shim if it exists;
#                        tests/run-tests.sh makes it)
#   BENCH_ECHO_MIB=N     bytes bench_echo sends, in MiB (default 256)
#   BENCH_FILES_MIB=N    size of bench_files' big read and write, in MiB (default 1024)
#   BENCH_TUNNEL_MIB=N   bytes bench_tunnel moves per run and direction, in MiB (default 256)
#   BENCH_TUNNEL_CONNS=N connections per bench_tunnel connection-rate run (default 2000)
#   BENCHES="bench_ping bench_echo"  run only these (default: all, in the order below)
#   BENCH_CPU=N          run each benchmark (and the daemons and baselines it starts) on CPU N only:
#                        in a VM, figures made of wake-ups (ping, exec, small writes) swing with
#                        whether the other vCPU is idle; on one CPU they are stable
#
# Each benchmark prints one line per figure, with its same-run baseline and the ratio.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
ALL=(bench_ping bench_startup bench_rss bench_echo bench_files bench_exec bench_backup bench_tunnel)
if [ -n "${BENCHES:-}" ]; then
	read -r -a BENCHES <<<"$BENCHES"
	for b in "${BENCHES[@]}"; do
		case " ${ALL[*]} " in
		*" $b "*) ;;
		*)
			echo "run.sh: unknown benchmark '$b' (known: ${ALL[*]})" >&2
			exit 2
			;;
		esac
	done
else
	BENCHES=("${ALL[@]}")
fi

cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$BUILD_DIR" -j2 --target "${BENCHES[@]}"

if [ -z "${SHIM_STATIC_BIN:-}" ] && [ -x "$ROOT/build-static/sandbox-shim" ]; then
	export SHIM_STATIC_BIN="$ROOT/build-static/sandbox-shim"
fi

PIN=()
where="$(nproc) CPUs"
if [ -n "${BENCH_CPU:-}" ]; then
	PIN=(taskset -c "$BENCH_CPU")
	if ! "${PIN[@]}" true 2>/dev/null; then
		echo "run.sh: BENCH_CPU=$BENCH_CPU: not a CPU this process may run on (0-$(($(nproc) - 1)))" >&2
		exit 2
	fi
	where="on CPU $BENCH_CPU only"
fi
echo "---- benchmarks ($BUILD_DIR, $(grep -E '^CMAKE_BUILD_TYPE:' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2), $where)"
rc=0
for b in "${BENCHES[@]}"; do
	if ! "${PIN[@]}" "$BUILD_DIR/tests/bench/$b"; then
		echo "$b: FAILED" >&2
		rc=1
	fi
done
exit "$rc"
