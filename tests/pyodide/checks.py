# tests/pyodide/checks.py: sandbox_shim under Pyodide, against a real daemon over TCP.
#
# Run by run.mjs (runPythonAsync: top-level await works, and awaiting a JS promise from
# Python is how the transport below waits for the socket). run.mjs puts the package
# from the source tree on sys.path, registers the JS module `node_host` (connect(),
# sha256(), proc()) and sets HOST, PORT, TOKEN and WORK (a directory of the daemon's).
# Prints one `ok - NAME` / `not ok - NAME: WHY` line per check and "N passed, M failed";
# the value of the last expression (the number of failures) goes back to run.mjs.

import asyncio
import errno
import hashlib
import os
import sys
import time
import traceback

import node_host  # the JS side: run.mjs
from pyodide.ffi import JsException, to_js

import sandbox_shim
from sandbox_shim import AsyncShim, SandboxAbortError, SandboxConnectionError


# ---- "Your own transport": a Node net.Socket as an AsyncShim transport ----


class NodeSocketTransport:
    """sandbox_shim's async transport interface (``async read(n)``, ``async write(data)``,
    ``async close()``) over a Node ``net.Socket``, as a Python Worker reaches a container's
    TCP port. ``sock`` is the JS object of run.mjs's connect(): ``read()`` -> Promise of the
    next received Uint8Array (empty at EOF; it pauses the socket while Python is behind),
    ``write(Uint8Array)`` -> Promise settled when the socket takes more (its back-pressure),
    ``close()`` -> Promise. Socket errors reject; they reach sandbox_shim as OSError."""

    def __init__(self, sock):
        self._sock = sock
        self._rest = b""  # what the last chunk had beyond the n asked for

    @classmethod
    async def connect(cls, host, port):
        return cls(await _js(node_host.connect(host, port)))

    async def read(self, n):
        if not self._rest:
            chunk = await _js(self._sock.read())
            self._rest = chunk.to_bytes()  # JS Uint8Array -> bytes (a copy); b"" at EOF
        data, self._rest = self._rest[:n], self._rest[n:]
        return data

    async def write(self, data):
        await _js(self._sock.write(to_js(data)))  # to_js copies bytes into a new Uint8Array

    async def close(self):
        await _js(self._sock.close())


async def _js(promise):
    """Await a JS promise; a rejection (a Node socket error) becomes an OSError."""
    try:
        return await promise
    except JsException as e:
        code = getattr(getattr(e, "js_error", None), "code", None) or "ECONNRESET"
        raise ConnectionError(getattr(errno, str(code), errno.EIO), f"node socket: {e}") from None


# ---- the checks ----

results = []  # (ok, name)


def report(ok, name, why=""):
    results.append(ok)
    print(f"ok - {name}" if ok else f"not ok - {name}: {why}", flush=True)


async def check(name, coro, timeout=60.0):
    """Run one check (a coroutine returning None, or a reason for failing) with a time limit."""
    try:
        why = await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        why = f"no answer in {timeout:g} s"
    except Exception:
        why = "raised:\n" + traceback.format_exc()
    report(why is None, name, why or "")


def expect(got, want, what):
    return None if got == want else f"{what}: got {got!r}, want {want!r}"


def first(*whys):
    return next((w for w in whys if w), None)


async def wait_for_pid(shim, pidfile):
    """The PID the command's shell wrote, read through the shim (polled until there)."""
    for _ in range(200):
        if await shim.files.exists(pidfile):
            text = (await shim.files.read_text(pidfile)).strip()
            if text:
                return int(text)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{pidfile} never written")


async def gone(pid, started):
    """Whether the process `pid` (start time `started`) is gone: no /proc/PID, another
    process by now, or a zombie. Asked of Node (this Python has no /proc of the host)."""
    for _ in range(250):
        st = node_host.proc(pid)  # "" when /proc/PID is gone, else "STATE STARTTIME"
        if not st:
            return None
        state, start = st.split()
        if start != started or state == "Z":
            return None
        await asyncio.sleep(0.02)
    return f"pid {pid} still running: {node_host.proc(pid)}"


async def killed_when(shim, name, stop):
    """Start `sleep 30` through `sh -c 'echo $$ > PIDFILE; exec sleep 30'`, make sure it
    runs (by its PID), then stop the call with stop(task, event); the call must end with
    the expected exception and the process must be gone."""
    pidfile = f"{WORK}/{name}.pid"
    ev = asyncio.Event()
    cmd = ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]
    t0 = time.monotonic()
    task = asyncio.ensure_future(shim.commands.run(cmd, abort=ev))
    try:
        pid = await wait_for_pid(shim, pidfile)
        for _ in range(250):  # the exec of sleep may be a moment behind the echo
            st = node_host.proc(pid)
            if st and node_host.cmdline(pid) == "sleep\x0030\x00":
                break
            await asyncio.sleep(0.02)
        else:
            return f"pid {pid} is not our sleep 30: {node_host.cmdline(pid)!r}"
        started = st.split()[1]
        await asyncio.sleep(max(0.0, 0.3 - (time.monotonic() - t0)))  # at least 0.3 s in
        why = await stop(task, ev)
        elapsed = time.monotonic() - t0
    finally:
        if not task.done():  # failed before stop(): end the call, and take its outcome
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return first(why, None if elapsed < 10 else f"took {elapsed:.1f} s", await gone(pid, started))


async def main():
    # the package is the source tree's, and pure Python (no ctypes in sight)
    report(sandbox_shim.__file__.startswith(SRC + "/") and "_ctypes" not in sys.modules,
           "sandbox_shim imported from the source tree, no ctypes",
           f"{sandbox_shim.__file__}, _ctypes loaded: {'_ctypes' in sys.modules}")

    async def bad_token():
        try:
            s = await AsyncShim.connect(await NodeSocketTransport.connect(HOST, PORT), token="not-the-token")
        except SandboxConnectionError:
            return None
        await s.close()
        return "a wrong token was accepted"

    await check("a wrong token is refused", bad_token())

    box = {}

    async def handshake():
        tr = await NodeSocketTransport.connect(HOST, PORT)
        box["tr"] = tr
        box["shim"] = shim = await AsyncShim.connect(tr, token=TOKEN, client_name="pyodide-test")
        srv = shim.server
        rtt = await shim.ping()
        return first(expect(srv.protocol_version, 1, "protocol_version"),
                     None if srv.pid > 0 and srv.shim_version else f"server info: {srv!r}",
                     None if rtt > 0 else f"ping {rtt!r}")

    await check("handshake over a Node net.Socket, with the token", handshake())
    shim = box.get("shim")
    if shim is None:
        print("cannot go on without a connection", flush=True)
        return summary()

    blob = os.urandom(1 << 20)
    big = f"{WORK}/data/blob.bin"

    async def round_trip():
        st = await shim.files.write_file(big, blob, parents=True)
        back = await shim.files.read_file(big)
        return first(expect(st.size, len(blob), "write_file's size"),
                     expect(len(back), len(blob), "bytes read back"),
                     None if back == blob else "the bytes read back differ")

    await check("write and read back 1 MiB byte-exact", round_trip())

    async def stat():
        st = await shim.files.stat(big)
        d = await shim.files.stat(f"{WORK}/data")
        return first(expect((st.type, st.size, st.path), ("file", 1 << 20, big), "stat of the file"),
                     expect(d.type, "directory", "stat of its directory"))

    await check("stat", stat())

    async def listing():
        for n in ("a.txt", "b.txt"):
            await shim.files.write_file(f"{WORK}/data/{n}", n * 3)
        await shim.files.mkdir(f"{WORK}/data/sub")
        got = {(e.name, e.type, e.size if e.type == "file" else -1)
               for e in await shim.files.read_directory(f"{WORK}/data")}
        want = {("a.txt", "file", 15), ("b.txt", "file", 15), ("blob.bin", "file", 1 << 20), ("sub", "directory", -1)}
        return expect(got, want, "entries")

    await check("list a directory", listing())

    async def execute():
        r = await shim.commands.run(["sh", "-c", "echo out; printf 'err\\n' >&2; exit 3"])
        return first(expect(r.stdout, "out\n", "stdout"), expect(r.stderr, "err\n", "stderr"),
                     expect(r.exit_code, 3, "exit code"))

    await check("exec: stdout, stderr and exit code", execute())

    class Sink:  # the backup's dest: any object with write(bytes)
        def __init__(self):
            self.parts = []

        def write(self, b):
            self.parts.append(bytes(b))

    async def backup():
        sink = Sink()
        rec = await shim.backups.backup(f"{WORK}/data", sink)
        data = b"".join(sink.parts)
        box["archive"], box["rec"] = data, rec
        return first(expect(rec["bytes"], len(data), "record's bytes vs bytes received"),
                     expect(hashlib.sha256(data).hexdigest(), rec["sha256"], "hashlib sha256 vs the record's"),
                     expect(data[:4], b"\x28\xb5\x2f\xfd", "zstd magic"),
                     None if rec["entries"] >= 5 else f"entries {rec['entries']}")

    await check("backup: hashlib sha256 of the bytes received = the record's", backup())

    async def node_sha():
        if "archive" not in box:
            return "no archive (the backup failed)"
        node_sha256 = node_host.sha256(to_js(box["archive"]))  # the same bytes, as a Uint8Array
        return expect(node_sha256, box["rec"]["sha256"], "Node crypto sha256 vs the record's")

    await check("backup: Node crypto's sha256 of the same bytes = the record's", node_sha())

    async def by_event(task, ev):
        ev.set()
        try:
            await task
        except SandboxAbortError:
            return None
        return "the call did not raise SandboxAbortError"

    await check("abort with an asyncio.Event: SandboxAbortError, the process gone",
                killed_when(shim, "abort", by_event))

    async def by_cancel(task, ev):
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return None
        return "the task was not cancelled"

    await check("cancelling the awaiting task: the process gone", killed_when(shim, "cancel", by_cancel))

    async def still_works():
        r = await shim.commands.run(["echo", "after"])
        return expect(r.stdout, "after\n", "stdout")

    await check("the connection still works after abort and cancel", still_works())

    async def close():
        await shim.close()
        return None if box["tr"]._sock.closed() else "the Node socket is still open"

    await check("close: the Node socket is closed", close())
    return summary()


def summary():
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed", flush=True)
    return failed


await main()  # noqa: F704 (top-level await: runPythonAsync)
