#!/usr/bin/env bash
# Run the Python SDK benchmarks against libsbx in the same run: `bash sdk/python/bench/run.sh [BUILD_DIR]`.
#
# Builds nothing: BUILD_DIR (or $SBX_BUILD_DIR; default build/ at the top of the tree) must hold
# sandbox-shim and tests/bench/bench_{exec,ping,files}, e.g. from
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build-bench -j2
#
#   SHIM_BIN=BIN          the daemon (default BUILD_DIR/sandbox-shim)
#   PYTHON=PY             the interpreter (default python3)
#   BENCH_ONLY=a,b        sections of bench_python.py: exec,stdout,ping,long,read,write,conns (default all)
#   BENCH_FILES_MIB=N     size of the big read and write, in MiB (default 1024; bench_files gets it too)
#   BENCH_SCRATCH=DIR     a directory on a real disk (not tmpfs) for the durable writes (default /var/tmp)
#   BENCH_SHM=DIR         where the file read from the page cache goes (default /dev/shm)
#   BENCH_CONNS=N, BENCH_DAEMONS=N  connections held by one asyncio process, and daemons (default 1000, 4)
#   BENCH_VERBOSE=1       also print the C benchmarks' own lines
#
# Every line is a figure next to libsbx's (or another same-run baseline) and the ratio; nothing
# here passes or fails on the figures (exit status non-zero only if something could not run).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BUILD_DIR=${1:-${SBX_BUILD_DIR:-$ROOT/build}}
if [ ! -d "$BUILD_DIR" ]; then
	echo "run.sh: no build directory $BUILD_DIR (pass one, or set SBX_BUILD_DIR)" >&2
	exit 2
fi
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
export SHIM_BIN=${SHIM_BIN:-$BUILD_DIR/sandbox-shim}
export SBX_BENCH_BIN=${SBX_BENCH_BIN:-$BUILD_DIR/tests/bench}
missing=0
for f in "$SHIM_BIN" "$SBX_BENCH_BIN/bench_exec" "$SBX_BENCH_BIN/bench_ping" "$SBX_BENCH_BIN/bench_files"; do
	if [ ! -x "$f" ]; then
		echo "run.sh: $f is missing (build the daemon and the tests/bench targets in $BUILD_DIR)" >&2
		missing=1
	fi
done
[ "$missing" = 0 ] || exit 2

args=(--build "$BUILD_DIR")
if [ -n "${BENCH_ONLY:-}" ]; then
	args+=(--only "$BENCH_ONLY")
fi
exec "${PYTHON:-python3}" "$HERE/bench_python.py" "${args[@]}"
