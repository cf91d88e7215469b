#!/usr/bin/env python3
"""bench_python.py: the Python SDK (sandbox_shim, pure Python) against libsbx, the C SDK,
measured in the same run, one printed line per figure with the ratio.

What it measures, each through a sandbox-shim on a unix socket (a fresh daemon in a
mktemp directory, stopped by its PID), and what it compares with:

  exec     ``shim.commands.run(["/bin/true"])`` round trip p50/p99, sync Shim and
           AsyncShim in alternating blocks (200 warm-up, 2000 rounds each), against
           sbx_run's p50/p99 as ``bench_exec`` prints them (same command, same rounds):
           bench_exec runs before and after the Python rounds and libsbx's figure is the
           mean of the two (both are printed).
  stdout   ``commands.run("head -c 10485760 /dev/zero")`` in MB/s, best of 5, against
           bench_exec's "through the shim" figure (sbx_exec_start + sbx_proc_read), from
           the same two runs.
  ping     ``shim.ping()`` round trip p50/p99 timed around the call, sync and async in
           alternating blocks (2000 warm-up, 20000 each), against bench_ping's sbx_ping
           (run before and after, the mean of the two).
  long     one ``ping`` while 32 ``commands.run(["sleep", "2"])`` are in flight on the
           same connection (asyncio tasks; then 32 threads on a sync Shim): the first
           ping's latency and p50/max of pings sent 1 ms apart while they run, against
           the p50 of 500 pings paced alike with nothing else in flight.
  read     1 GiB from the page cache (a file in /dev/shm) with ``files.download(path,
           sink)``, the sink only counting (best of 3), against bench_files'
           sbx_read_file; also against ``sbx cat FILE > /dev/null`` (libsbx through the
           CLI) taking turns with the Python reads.
  write    a durable (atomic: fsync'd, renamed) 1 GiB ``files.write_file(path, source)``
           of zeros into a mktemp directory on a real disk (``$BENCH_SCRATCH``, default
           /var/tmp), median of 5, taking turns with ``sbx put`` (libsbx's
           sbx_write_file through the CLI, the same zeros on stdin), ``dd conv=fsync``
           and the async twin: the disk's speed drifts from one second to the next, so
           libsbx is measured in the same turns. bench_files' own figure (and its dd) is
           printed too. Files are deleted afterwards.
  conns    one asyncio process (a child of this one, so that its RSS and threads are its
           own) holding 1000 AsyncShim connections to 4 daemons (250 each, started with
           --max-connections 2000), RLIMIT_NOFILE raised if needed: the time to connect
           all, the wall time of one ping to every connection at once (asyncio.gather),
           against 1000 pings one after another on the same connections; threads in the
           process (threading.active_count() and /proc/self/status Threads) and VmRSS
           before and after.

These are figures, not tests: the exit status is 0 whatever they are (non-zero only when
something could not run). The machine's load moves them; run it more than once.

Run: ``bash sdk/python/bench/run.sh [BUILD_DIR]`` (a build with the daemon and
tests/bench/*; run.sh builds nothing), or directly:

    python3 sdk/python/bench/bench_python.py --build BUILD_DIR [--only exec,stdout,ping,long,read,write,conns]

Environment: SBX_BUILD_DIR (instead of --build), SHIM_BIN (the daemon the Python side talks
to; the C programs start the one they were built with), SBX_BENCH_BIN
(the directory of the C bench programs, default BUILD_DIR/tests/bench), SBX_CLI (the sbx
CLI, default BUILD_DIR/sbx), BENCH_FILES_MIB
(default 1024, passed to bench_files too), BENCH_SCRATCH (a directory on a real disk for
the durable writes, default /var/tmp), BENCH_SHM (where the read file goes, default
/dev/shm), BENCH_CONNS (default 1000), BENCH_DAEMONS (default 4), BENCH_VERBOSE=1
(echo the C programs' own lines), BENCH_PY_SRC (measure the package in that directory, a
prototype, instead of ../src). ``--profile exec|ping|stdout|read`` prints a cProfile of the sync
and async round trips instead (the sync reader thread profiled as well).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
# BENCH_PY_SRC: measure another copy of the package (a prototype) instead of ../src
sys.path.insert(0, os.environ.get("BENCH_PY_SRC") or os.path.join(os.path.dirname(HERE), "src"))

import sandbox_shim  # noqa: E402
from sandbox_shim import AsyncShim, Shim  # noqa: E402

MiB = 1 << 20
VERBOSE = bool(os.environ.get("BENCH_VERBOSE"))


# ---------------------------------------------------------------- helpers


def now_ns() -> int:
    return time.perf_counter_ns()  # CLOCK_MONOTONIC, as bench_now_ns()


def percentile(v: List[int], p: float) -> int:
    """Nearest rank, as bench_percentile() in tests/bench/bench_util.c."""
    s = sorted(v)
    rank = int(p / 100.0 * len(s) + 0.999999)
    rank = min(max(rank, 1), len(s))
    return s[rank - 1]


def mb_per_s(nbytes: int, ns: int) -> float:
    return nbytes / 1e6 / (ns / 1e9)


def status_kb(key: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def proc_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def out(line: str) -> None:
    print(line, flush=True)


class Daemon:
    """A sandbox-shim on DIR/s.sock with DIR from mkdtemp, as bench_start_shim() starts
    one; stopped by its PID (SIGTERM, then wait)."""

    def __init__(self, shim_bin: str, parent: str, *extra: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="shim-bench.", dir=parent)
        self.sock = os.path.join(self.dir, "s.sock")
        self.target = "unix:" + self.sock
        self.proc = subprocess.Popen(
            [shim_bin, "--listen", self.target, "--state-dir", os.path.join(self.dir, "state"),
             "--log-level", "warn", *extra],
            stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid
        until = time.monotonic() + 10
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.sock)
                break
            except OSError:
                pass
            finally:
                s.close()
            if self.proc.poll() is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise SystemExit(f"bench_python: {shim_bin} exited at start (status {self.proc.returncode})")
            if time.monotonic() > until:
                self.stop()
                raise SystemExit(f"bench_python: {self.sock} takes no connections after 10 s")
            time.sleep(0.002)

    def children_named(self, comm: str) -> int:
        """How many processes whose parent is the daemon are called comm."""
        n = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            if ppid == self.pid and name == comm:
                n += 1
        return n

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        build = args.build or os.environ.get("SBX_BUILD_DIR") or ""
        self.build = os.path.abspath(build) if build else ""
        self.shim_bin = os.environ.get("SHIM_BIN") or (os.path.join(self.build, "sandbox-shim") if build else "")
        self.c_dir = os.environ.get("SBX_BENCH_BIN") or (os.path.join(self.build, "tests", "bench") if build else "")
        if not self.shim_bin or not os.access(self.shim_bin, os.X_OK):
            raise SystemExit("bench_python: no daemon: pass --build BUILD_DIR, or set SBX_BUILD_DIR or SHIM_BIN")
        self.sbx = os.environ.get("SBX_CLI") or (os.path.join(self.build, "sbx") if build else "sbx")
        self.mib = int(os.environ.get("BENCH_FILES_MIB") or 1024)
        self.scratch_parent = os.environ.get("BENCH_SCRATCH") or "/var/tmp"
        self.shm = os.environ.get("BENCH_SHM") or "/dev/shm"
        self.conns = int(os.environ.get("BENCH_CONNS") or 1000)
        self.daemons = int(os.environ.get("BENCH_DAEMONS") or 4)
        # every daemon and file of this run below one directory on a real disk
        self.scratch = tempfile.mkdtemp(prefix="shim-pybench.", dir=self.scratch_parent)

    def c_bench(self, name: str, env: Optional[Dict[str, str]] = None) -> str:
        """Run tests/bench/NAME (it starts its own daemon from its built-in SHIM_BIN);
        returns its stdout."""
        path = os.path.join(self.c_dir, name)
        if not os.access(path, os.X_OK):
            raise SystemExit(f"bench_python: {path} is missing (build the tests/bench targets)")
        e = dict(os.environ, TMPDIR=self.scratch, **(env or {}))
        r = subprocess.run([path], env=e, stdout=subprocess.PIPE, text=True)
        if VERBOSE:
            for line in r.stdout.splitlines():
                out(f"  [{name}] {line}")
        if r.returncode != 0:
            raise SystemExit(f"bench_python: {name} failed (status {r.returncode})")
        return r.stdout

    def cleanup(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def grab(pattern: str, text: str, what: str) -> Tuple[float, ...]:
    m = re.search(pattern, text)
    if m is None:
        raise SystemExit(f"bench_python: cannot find {what} in the C bench's output:\n{text}")
    return tuple(float(g) for g in m.groups())


# ---------------------------------------------------------------- exec and stdout


EXEC_WARMUP, EXEC_ROUNDS, EXEC_BLOCK = 200, 2000, 100
STDOUT_LEN, STDOUT_TRIES = 10 * MiB, 5


def exec_figures(ctx: Ctx) -> Tuple[float, float, float]:
    c = ctx.c_bench("bench_exec")
    p50, p99 = grab(r"sbx_run p50 (\d+) us p99 (\d+) us", c, "the exec line")
    mbs, = grab(r"through the shim (\d+) MB/s", c, "the stdout line")
    return p50, p99, mbs


def bench_exec(ctx: Ctx, want_exec: bool, want_stdout: bool) -> None:
    # bench_exec runs before and after the Python rounds; libsbx's figure is the mean of the two
    before = exec_figures(ctx)
    lines: List[Callable[[Tuple[float, float, float]], str]] = []
    d = Daemon(ctx.shim_bin, ctx.scratch)
    loop = asyncio.new_event_loop()
    try:
        shim = Shim.connect(d.target)
        ashim = loop.run_until_complete(AsyncShim.connect(d.target))
        argv = ["/bin/true"]

        def sync_true(lat: Optional[List[int]], n: int) -> None:
            run = shim.commands.run
            for _ in range(n):
                t0 = now_ns()
                r = run(argv)
                if lat is not None:
                    lat.append(now_ns() - t0)
                if r.exit_code != 0:
                    raise SystemExit(f"bench_python: /bin/true exited {r.exit_code}")

        async def async_true(lat: Optional[List[int]], n: int) -> None:
            run = ashim.commands.run
            for _ in range(n):
                t0 = now_ns()
                r = await run(argv)
                if lat is not None:
                    lat.append(now_ns() - t0)
                if r.exit_code != 0:
                    raise SystemExit(f"bench_python: /bin/true exited {r.exit_code}")

        if want_exec:
            sync_true(None, EXEC_WARMUP)
            loop.run_until_complete(async_true(None, EXEC_WARMUP))
            ls: List[int] = []
            la: List[int] = []
            # alternating blocks, so that a change in the machine's load hits both alike
            for _ in range(0, EXEC_ROUNDS, EXEC_BLOCK):
                sync_true(ls, EXEC_BLOCK)
                loop.run_until_complete(async_true(la, EXEC_BLOCK))
            for name, lat in (("python", ls), ("asyncio", la)):
                p50, p99 = percentile(lat, 50) / 1e3, percentile(lat, 99) / 1e3
                lines.append(lambda c, name=name, p50=p50, p99=p99: (
                    f"exec /bin/true  {name} p50 {p50:.0f} µs p99 {p99:.0f} µs | libsbx p50 {c[0]:.0f} µs "
                    f"p99 {c[1]:.0f} µs | ratio p50 {ratio(p50, c[0])} ({EXEC_ROUNDS} rounds; libsbx: bench_exec "
                    f"before and after, p50 {before[0]:.0f} and {after[0]:.0f} µs; target ≤ 1.3×)"))

        if want_stdout:
            cmd = f"head -c {STDOUT_LEN} /dev/zero"

            def sync_stdout() -> float:
                t0 = now_ns()
                r = shim.commands.run(cmd)
                dt = now_ns() - t0
                if len(r.stdout_bytes) != STDOUT_LEN:
                    raise SystemExit(f"bench_python: got {len(r.stdout_bytes)} bytes of stdout")
                return mb_per_s(STDOUT_LEN, dt)

            async def async_stdout() -> float:
                t0 = now_ns()
                r = await ashim.commands.run(cmd)
                dt = now_ns() - t0
                if len(r.stdout_bytes) != STDOUT_LEN:
                    raise SystemExit(f"bench_python: got {len(r.stdout_bytes)} bytes of stdout")
                return mb_per_s(STDOUT_LEN, dt)

            sync_stdout()
            loop.run_until_complete(async_stdout())
            bs = ba = 0.0
            for _ in range(STDOUT_TRIES):
                bs = max(bs, sync_stdout())
                ba = max(ba, loop.run_until_complete(async_stdout()))
            for name, v in (("python", bs), ("asyncio", ba)):
                lines.append(lambda c, name=name, v=v: (
                    f"stdout 10 MiB  {name} {v:.0f} MB/s | libsbx {c[2]:.0f} MB/s | ratio {ratio(v, c[2])} "
                    f"(best of {STDOUT_TRIES}; libsbx: bench_exec before and after, {before[2]:.0f} and "
                    f"{after[2]:.0f} MB/s)"))
        shim.close()
        loop.run_until_complete(ashim.close())
    finally:
        loop.close()
        d.stop()
    after = exec_figures(ctx)
    mean = tuple((a + b) / 2 for a, b in zip(before, after))
    for line in lines:
        out(line(mean))  # type: ignore[arg-type]


# ---------------------------------------------------------------- ping, and ping under long calls


PING_WARMUP, PING_ROUNDS, PING_BLOCK = 2000, 20000, 1000
LONG_CALLS, LONG_SECONDS = 32, 2
PACE, PACED = 0.001, 500


def ping_figures(ctx: Ctx) -> Tuple[float, float]:
    c = ctx.c_bench("bench_ping")
    p50, = grab(r"ping rtt p50: sbx_ping ([\d.]+) us", c, "the p50 line")
    p99, = grab(r"ping rtt p99: sbx_ping ([\d.]+) us", c, "the p99 line")
    return p50, p99


def bench_ping(ctx: Ctx, want_ping: bool, want_long: bool) -> None:
    # bench_ping runs before and after the Python pings; libsbx's figure is the mean of the two
    before = ping_figures(ctx) if want_ping else (0.0, 0.0)
    lines: List[str] = []

    d = Daemon(ctx.shim_bin, ctx.scratch)
    loop = asyncio.new_event_loop()
    try:
        shim = Shim.connect(d.target)
        ashim = loop.run_until_complete(AsyncShim.connect(d.target))

        def sync_pings(lat: Optional[List[int]], n: int) -> None:
            ping = shim.ping
            for _ in range(n):
                t0 = now_ns()
                ping()
                if lat is not None:
                    lat.append(now_ns() - t0)

        async def async_pings(lat: Optional[List[int]], n: int) -> None:
            ping = ashim.ping
            for _ in range(n):
                t0 = now_ns()
                await ping()
                if lat is not None:
                    lat.append(now_ns() - t0)

        ls: List[int] = []
        la: List[int] = []
        rounds = PING_ROUNDS if want_ping else 4000
        sync_pings(None, PING_WARMUP)
        loop.run_until_complete(async_pings(None, PING_WARMUP))
        for _ in range(0, rounds, PING_BLOCK):
            sync_pings(ls, PING_BLOCK)
            loop.run_until_complete(async_pings(la, PING_BLOCK))
        pings = {name: (percentile(lat, 50) / 1e3, percentile(lat, 99) / 1e3) for name, lat in
                 (("python", ls), ("asyncio", la))}

        if want_long:
            until_started = lambda: d.children_named("sleep") >= LONG_CALLS  # noqa: E731

            # the baseline: the same paced pings (1 ms apart) with nothing else in flight
            async def async_paced(n: int) -> List[int]:
                lat: List[int] = []
                for _ in range(n):
                    t0 = now_ns()
                    await ashim.ping()
                    lat.append(now_ns() - t0)
                    await asyncio.sleep(PACE)
                return lat

            def sync_paced(n: int) -> List[int]:
                lat: List[int] = []
                for _ in range(n):
                    t0 = now_ns()
                    shim.ping()
                    lat.append(now_ns() - t0)
                    time.sleep(PACE)
                return lat

            paced = {"asyncio": percentile(loop.run_until_complete(async_paced(PACED)), 50) / 1e3,
                     "python": percentile(sync_paced(PACED), 50) / 1e3}

            async def async_long() -> Tuple[float, List[int], int]:
                tasks = [asyncio.ensure_future(ashim.commands.run(["sleep", str(LONG_SECONDS)]))
                         for _ in range(LONG_CALLS)]
                deadline = time.monotonic() + 5
                while not until_started() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                t0 = now_ns()
                await ashim.ping()
                first = (now_ns() - t0) / 1e3
                lat: List[int] = []
                while not any(t.done() for t in tasks) and len(lat) < 5000:
                    t0 = now_ns()
                    await ashim.ping()
                    lat.append(now_ns() - t0)
                    await asyncio.sleep(PACE)
                results = await asyncio.gather(*tasks)
                return first, lat, sum(1 for r in results if r.exit_code != 0)

            def sync_long() -> Tuple[float, List[int], int]:
                bad: List[int] = []

                def one() -> None:
                    if shim.commands.run(["sleep", str(LONG_SECONDS)]).exit_code != 0:
                        bad.append(1)

                ths = [threading.Thread(target=one) for _ in range(LONG_CALLS)]
                for t in ths:
                    t.start()
                deadline = time.monotonic() + 5
                while not until_started() and time.monotonic() < deadline:
                    time.sleep(0.005)
                t0 = now_ns()
                shim.ping()
                first = (now_ns() - t0) / 1e3
                lat: List[int] = []
                while all(t.is_alive() for t in ths) and len(lat) < 5000:
                    t0 = now_ns()
                    shim.ping()
                    lat.append(now_ns() - t0)
                    time.sleep(PACE)
                for t in ths:
                    t.join()
                return first, lat, len(bad)

            for name, fn in (("asyncio", lambda: loop.run_until_complete(async_long())), ("python", sync_long)):
                first, lat, bad = fn()
                p50 = percentile(lat, 50) / 1e3 if lat else float("nan")
                mx = max(lat) / 1e3 if lat else float("nan")
                lines.append(f"ping with {LONG_CALLS} `sleep {LONG_SECONDS}` in flight  {name} first {first:.0f} µs, "
                    f"p50 {p50:.0f} µs max {mx:.0f} µs of {len(lat)} (1 ms apart) | idle, paced alike, p50 "
                    f"{paced[name]:.0f} µs | ratio p50 {ratio(p50, paced[name])}{f' ({bad} failed)' if bad else ''}")
        shim.close()
        loop.run_until_complete(ashim.close())
    finally:
        loop.close()
        d.stop()
    if want_ping:
        after = ping_figures(ctx)
        c50, c99 = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        for name, (p50, p99) in pings.items():
            out(f"ping  {name} p50 {p50:.1f} µs p99 {p99:.1f} µs | libsbx p50 {c50:.1f} µs p99 {c99:.1f} µs | "
                f"ratio p50 {ratio(p50, c50)} ({rounds} pings; libsbx: bench_ping before and after, p50 "
                f"{before[0]:.1f} and {after[0]:.1f} µs)")
    for line in lines:
        out(line)


# ---------------------------------------------------------------- files


READ_TRIES, WRITE_TRIES = 3, 5


class CountSink:
    """download()'s destination: counts the bytes, keeps none."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: bytes) -> None:
        self.n += len(b)


class ZeroSource:
    """write_file()'s source: ``left`` zero bytes, from a cache of bytes objects (the
    C bench's pattern source memcpys from a calloc'd MiB; dd reads /dev/zero)."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.cache: Dict[int, bytes] = {}

    def read(self, n: int) -> bytes:
        n = min(n, self.left)
        self.left -= n
        b = self.cache.get(n)
        if b is None:
            b = self.cache[n] = bytes(n)
        return b


def make_file(path: str, length: int) -> None:
    block = bytearray(os.urandom(MiB))
    with open(path, "wb") as f:
        for off in range(0, length, MiB):
            block[0:8] = off.to_bytes(8, "little")  # no two MiB alike
            f.write(block[:min(MiB, length - off)])


def dd_write(path: str, mib: int) -> float:
    t0 = now_ns()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync", "status=none"],
                   check=True)
    return mb_per_s(mib * MiB, now_ns() - t0)


def sbx_cli(ctx: Ctx, args: List[str], stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.DEVNULL) -> int:
    """The sbx CLI (libsbx) once; returns the wall time in ns."""
    t0 = now_ns()
    r = subprocess.run([ctx.sbx, *args], stdin=stdin, stdout=stdout)
    dt = now_ns() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench_python: sbx {' '.join(args)} failed (status {r.returncode})")
    return dt


def bench_files(ctx: Ctx, want_read: bool, want_write: bool) -> None:
    mib, length = ctx.mib, ctx.mib * MiB
    c = ctx.c_bench("bench_files", {"BENCH_FILES_MIB": str(mib)})
    cread, = grab(r"sbx_read_file (\d+) MB/s", c, "the read line")
    cwrite, cdd = grab(r"sbx_write_file (\d+) MB/s, dd conv=fsync (\d+) MB/s", c, "the durable write line")

    d = Daemon(ctx.shim_bin, ctx.scratch)
    loop = asyncio.new_event_loop()
    temps: List[str] = []
    try:
        shim = Shim.connect(d.target)
        ashim = loop.run_until_complete(AsyncShim.connect(d.target))
        shm = ctx.shm if os.path.isdir(ctx.shm) and shutil.disk_usage(ctx.shm).free > 2 * length else ctx.scratch
        if want_read:
            fd, rfile = tempfile.mkstemp(prefix="shim-pybench-read.", dir=shm)
            os.close(fd)
            temps.append(rfile)
            make_file(rfile, length)

            def sync_read() -> float:
                sink = CountSink()
                t0 = now_ns()
                n = shim.files.download(rfile, sink)
                dt = now_ns() - t0
                if n != length or sink.n != length:
                    raise SystemExit(f"bench_python: read {sink.n} bytes of {length}")
                return mb_per_s(length, dt)

            def async_read() -> float:
                async def go() -> float:
                    sink = CountSink()
                    t0 = now_ns()
                    n = await ashim.files.download(rfile, sink)
                    dt = now_ns() - t0
                    if n != length or sink.n != length:
                        raise SystemExit(f"bench_python: read {sink.n} bytes of {length}")
                    return mb_per_s(length, dt)
                return loop.run_until_complete(go())

            def cli_read() -> float:
                return mb_per_s(length, sbx_cli(ctx, ["-t", d.target, "cat", rfile]))

            rfns: Dict[str, Callable[[], float]] = {"python": sync_read, "asyncio": async_read, "sbx": cli_read}
            for fn in rfns.values():
                fn()  # warm-up
            best = {k: 0.0 for k in rfns}
            for t in range(READ_TRIES):
                for name in list(rfns)[t % 3:] + list(rfns)[:t % 3]:
                    best[name] = max(best[name], rfns[name]())
            os.unlink(rfile)
            temps.remove(rfile)
            for name in ("python", "asyncio"):
                v = best[name]
                out(f"read {mib} MiB (page cache, {shm})  {name} {v:.0f} MB/s | libsbx {cread:.0f} MB/s | ratio "
                    f"{ratio(v, cread)} (best of {READ_TRIES}; libsbx: bench_files' sbx_read_file; `sbx cat > "
                    f"/dev/null` taking turns with these {best['sbx']:.0f} MB/s, ratio {ratio(v, best['sbx'])}; "
                    f"target ≥ 1000 MB/s and ≥ 0.5×)")

        if want_write:
            wdir = tempfile.mkdtemp(prefix="write.", dir=ctx.scratch)  # a real disk (BENCH_SCRATCH)
            py_path, ddp = os.path.join(wdir, "py.bin"), os.path.join(wdir, "dd.bin")
            fd, zeros = tempfile.mkstemp(prefix="shim-pybench-zeros.", dir=shm)
            temps.append(zeros)
            os.ftruncate(fd, length)  # sparse: zeros for sbx put's stdin at no cost in memory
            os.close(fd)

            def sync_write() -> float:
                t0 = now_ns()
                st = shim.files.write_file(py_path, ZeroSource(length))  # atomic: fsync'd, renamed
                dt = now_ns() - t0
                if st.size != length:
                    raise SystemExit(f"bench_python: wrote a file of {st.size} bytes, not {length}")
                return mb_per_s(length, dt)

            def async_write() -> float:
                async def go() -> float:
                    t0 = now_ns()
                    st = await ashim.files.write_file(py_path, ZeroSource(length))
                    dt = now_ns() - t0
                    if st.size != length:
                        raise SystemExit(f"bench_python: wrote a file of {st.size} bytes, not {length}")
                    return mb_per_s(length, dt)
                return loop.run_until_complete(go())

            def cli_write() -> float:
                with open(zeros, "rb") as f:
                    dt = sbx_cli(ctx, ["-t", d.target, "put", py_path], stdin=f)  # atomic, as write_file
                if os.path.getsize(py_path) != length:
                    raise SystemExit("bench_python: sbx put wrote a file of the wrong size")
                return mb_per_s(length, dt)

            runs: Dict[str, List[float]] = {"dd": [], "python": [], "asyncio": [], "sbx": []}
            wfns: Dict[str, Callable[[], float]] = {"dd": lambda: dd_write(ddp, mib), "python": sync_write,
                                                    "asyncio": async_write, "sbx": cli_write}
            order = list(wfns)
            for t in range(WRITE_TRIES):
                # taking turns at going first: the disk is shared and its speed drifts
                for name in order[t % 4:] + order[:t % 4]:
                    runs[name].append(wfns[name]())
                    for p in (py_path, ddp):
                        if os.path.exists(p):
                            os.unlink(p)
                if VERBOSE:
                    out(f"  try {t + 1}: " + ", ".join(f"{k} {v[-1]:.0f} MB/s" for k, v in runs.items()))
            shutil.rmtree(wdir, ignore_errors=True)
            os.unlink(zeros)
            temps.remove(zeros)
            med = {k: statistics.median(v) for k, v in runs.items()}
            for name in ("python", "asyncio"):
                v = med[name]
                out(f"durable write {mib} MiB  {name} {v:.0f} MB/s | libsbx {med['sbx']:.0f} MB/s | ratio "
                    f"{ratio(v, med['sbx'])} (medians of {WRITE_TRIES}, taking turns; libsbx: `sbx put` of the same "
                    f"zeros; dd conv=fsync {med['dd']:.0f} MB/s; bench_files' sbx_write_file {cwrite:.0f} MB/s with "
                    f"its dd {cdd:.0f}; target ≥ 0.9×)")
        shim.close()
        loop.run_until_complete(ashim.close())
    finally:
        for p in temps:
            os.unlink(p)
        loop.close()
        d.stop()


# ---------------------------------------------------------------- 1000 connections, one asyncio process


PING_ALL_ROUNDS = 5


def bench_conns(ctx: Ctx) -> None:
    per = ctx.conns // ctx.daemons
    ds: List[Daemon] = []
    try:
        for _ in range(ctx.daemons):
            ds.append(Daemon(ctx.shim_bin, ctx.scratch, "--max-connections", str(max(2 * per, 64))))
        spec = json.dumps({"targets": [d.target for d in ds], "per": per})
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--conns-child", spec])
        if r.returncode != 0:
            raise SystemExit(f"bench_python: the connections child failed (status {r.returncode})")
    finally:
        for d in ds:
            d.stop()


def conns_child(spec: Dict[str, Any]) -> None:
    """In a fresh process: hold every connection in one asyncio loop."""
    targets: List[str] = spec["targets"]
    per: int = spec["per"]
    total = per * len(targets)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = total + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    th0, pth0, rss0 = threading.active_count(), proc_threads(), status_kb("VmRSS:")

    async def main() -> Dict[str, Any]:
        t0 = now_ns()
        shims = await asyncio.gather(*(AsyncShim.connect(t) for t in targets for _ in range(per)))
        connect_s = (now_ns() - t0) / 1e9
        res: Dict[str, Any] = {"connect": connect_s, "th1": threading.active_count(), "pth1": proc_threads(),
                               "rss1": status_kb("VmRSS:")}
        walls: List[float] = []
        for _ in range(PING_ALL_ROUNDS):
            t0 = now_ns()
            await asyncio.gather(*(s.ping() for s in shims))
            walls.append((now_ns() - t0) / 1e9)
        res["pth_ping"] = proc_threads()
        t0 = now_ns()
        for s in shims:
            await s.ping()
        res["serial"] = (now_ns() - t0) / 1e9
        res["walls"] = walls
        res["th2"], res["pth2"], res["rss2"] = threading.active_count(), proc_threads(), status_kb("VmRSS:")
        await asyncio.gather(*(s.close() for s in shims))
        return res

    r = asyncio.run(main())
    w = r["walls"]
    n, nd = total, len(targets)
    out(f"{n} connections ({nd} daemons × {per}), one asyncio process: connect all {r['connect']:.2f} s "
        f"({r['connect'] / n * 1e3:.2f} ms each, concurrently)")
    out(f"{n} pings at once (asyncio.gather)  first {w[0] * 1e3:.0f} ms, best {min(w) * 1e3:.0f} ms, "
        f"median {statistics.median(w) * 1e3:.0f} ms of {len(w)} | {n} pings one after another "
        f"{r['serial'] * 1e3:.0f} ms | ratio {ratio(statistics.median(w), r['serial'])} (target < 1 s)")
    out(f"{n} connections: threads {r['th1']} (threading.active_count) / {r['pth1']} (/proc Threads) connected, "
        f"{r['pth_ping']} after the pings, {th0} / {pth0} before (target ≤ 2)")
    out(f"{n} connections: VmRSS {rss0} kB before, {r['rss1']} kB connected, {r['rss2']} kB after the pings "
        f"(+{(r['rss1'] - rss0) / n:.1f} kB per connection)")


# ---------------------------------------------------------------- profiles


def profile(ctx: Ctx, what: str) -> None:
    """cProfile of N round trips, sync (caller and reader thread) and async."""
    import cProfile
    import pstats

    from sandbox_shim import _sync

    n = {"exec": 2000, "ping": 20000, "stdout": 50, "read": 4}[what]
    d = Daemon(ctx.shim_bin, ctx.scratch)
    rfile = os.path.join(d.dir, "read.bin")
    if what == "read":
        make_file(rfile, 256 * MiB)
    reader_prof = cProfile.Profile()
    orig = _sync._reader_main

    def profiled_reader(*a: Any) -> None:
        reader_prof.enable()
        try:
            orig(*a)
        finally:
            reader_prof.disable()

    _sync._reader_main = profiled_reader  # type: ignore[assignment]
    try:
        shim = Shim.connect(d.target)
        _sync._reader_main = orig  # type: ignore[assignment]
        ops: Dict[str, Callable[[], Any]] = {
            "exec": lambda: shim.commands.run(["/bin/true"]), "ping": shim.ping,
            "stdout": lambda: shim.commands.run(f"head -c {STDOUT_LEN} /dev/zero"),
            "read": lambda: shim.files.download(rfile, CountSink())}
        op = ops[what]
        for _ in range(200 if n > 100 else 2):
            op()
        caller = cProfile.Profile()
        t0 = now_ns()
        caller.enable()
        for _ in range(n):
            op()
        caller.disable()
        dt = (now_ns() - t0) / n / 1e3
        out(f"---- sync {what}: {dt:.0f} µs per call under the profiler ({n} calls); the calling thread:")
        pstats.Stats(caller).sort_stats("tottime").print_stats(22)
        shim.close()  # the reader thread ends: its profile is complete
        out(f"---- sync {what}: the reader thread (the 200 warm-up calls included):")
        pstats.Stats(reader_prof).sort_stats("tottime").print_stats(22)

        async def amain() -> None:
            a = await AsyncShim.connect(d.target)
            aops: Dict[str, Callable[[], Any]] = {
                "exec": lambda: a.commands.run(["/bin/true"]), "ping": a.ping,
                "stdout": lambda: a.commands.run(f"head -c {STDOUT_LEN} /dev/zero"),
                "read": lambda: a.files.download(rfile, CountSink())}
            aop = aops[what]
            for _ in range(200 if n > 100 else 2):
                await aop()
            prof = cProfile.Profile()
            t0 = now_ns()
            prof.enable()
            for _ in range(n):
                await aop()
            prof.disable()
            dt = (now_ns() - t0) / n / 1e3
            out(f"---- async {what}: {dt:.0f} µs per call under the profiler ({n} calls):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(22)
            await a.close()

        asyncio.run(amain())
    finally:
        _sync._reader_main = orig  # type: ignore[assignment]
        d.stop()


# ---------------------------------------------------------------- main


def source_digest(pkg_dir: str) -> str:
    """A short digest of the package's .py files: which state of the tree a run measured."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(os.listdir(pkg_dir)):
        if name.endswith(".py"):
            with open(os.path.join(pkg_dir, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return "src " + h.hexdigest()[:10]


SECTIONS = ("exec", "stdout", "ping", "long", "read", "write", "conns")


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description="Python SDK benchmarks against libsbx (see the docstring).")
    ap.add_argument("--build", help="the build directory (default $SBX_BUILD_DIR)")
    ap.add_argument("--only", help="comma-separated sections: " + ",".join(SECTIONS))
    ap.add_argument("--profile", choices=("exec", "ping", "stdout", "read"), help="print cProfile output instead")
    ap.add_argument("--conns-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.conns_child:
        conns_child(json.loads(args.conns_child))
        return 0
    ctx = Ctx(args)
    try:
        if args.profile:
            profile(ctx, args.profile)
            return 0
        want = set(SECTIONS if not args.only else args.only.split(","))
        bad = want - set(SECTIONS)
        if bad:
            raise SystemExit(f"bench_python: unknown sections {sorted(bad)} (have {', '.join(SECTIONS)})")
        bt = ""
        if ctx.build and os.path.exists(os.path.join(ctx.build, "CMakeCache.txt")):
            with open(os.path.join(ctx.build, "CMakeCache.txt")) as f:
                m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), re.M)
                bt = f", {m.group(1)}" if m else ""
        pkg_dir = os.path.dirname(sandbox_shim.__file__)
        pkg = "" if not os.environ.get("BENCH_PY_SRC") else f" from {os.path.dirname(pkg_dir)}"
        out(f"---- python SDK benchmarks (sandbox_shim {sandbox_shim.__version__}{pkg} [{source_digest(pkg_dir)}], Python "
            f"{sys.version.split()[0]}, {ctx.build or ctx.shim_bin}{bt}, {os.cpu_count()} CPUs)")
        if want & {"exec", "stdout"}:
            bench_exec(ctx, "exec" in want, "stdout" in want)
        if want & {"ping", "long"}:
            bench_ping(ctx, "ping" in want, "long" in want)
        if want & {"read", "write"}:
            bench_files(ctx, "read" in want, "write" in want)
        if "conns" in want:
            bench_conns(ctx)
    finally:
        ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
