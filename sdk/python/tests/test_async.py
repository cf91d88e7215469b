"""AsyncShim: the coroutine twins, asyncio.Event aborts, task cancellation."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time
import unittest

from shimtest import Daemon, pid_alive, slurp, wait_until

from sandbox_shim import (
    AsyncShim,
    SandboxAbortError,
    SandboxEvalError,
    SandboxFileNotFoundError,
    SandboxFileStat,
)


class Async(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    async def asyncSetUp(self) -> None:
        self.shim = await AsyncShim.connect(self.daemon.target)
        import tempfile

        self.d = tempfile.mkdtemp(dir=self.daemon.tmp)

    async def asyncTearDown(self) -> None:
        await self.shim.close()

    def p(self, n: str) -> str:
        return os.path.join(self.d, n)

    async def test_files(self) -> None:
        f = self.shim.files
        st = await f.write_file(self.p("a"), b"hello")
        self.assertIsInstance(st, SandboxFileStat)
        self.assertEqual(await f.read_file(self.p("a")), b"hello")
        self.assertTrue(await f.exists(self.p("a")))
        await f.mkdir(self.p("d"))
        await f.copy(self.p("a"), self.p("d/b"))
        await f.rename(self.p("d/b"), self.p("d/c"))
        await f.chmod(self.p("d/c"), 0o600)
        await f.symlink("c", self.p("d/l"))
        self.assertEqual(await f.readlink(self.p("d/l")), "c")
        await f.truncate(self.p("d/c"), 2)
        self.assertEqual((await f.stat(self.p("d/c"))).size, 2)
        names = sorted(e.name for e in await f.read_directory(self.p("d")))
        self.assertEqual(names, ["c", "l"])
        chunks = [c async for c in f.open_read(self.p("a"))]
        self.assertEqual(b"".join(chunks), b"hello")
        await f.delete(self.p("d"), recursive=True)
        with self.assertRaises(SandboxFileNotFoundError):
            await f.read_file(self.p("d/c"))

    async def test_special_files(self) -> None:
        f = self.shim.files
        os.mkfifo(self.p("fifo"))
        with self.assertRaises(PermissionError) as cm:
            await f.read_file(self.p("fifo"))
        self.assertIn("a FIFO, not a regular file", str(cm.exception))
        with self.assertRaises(PermissionError):
            await f.write_file(self.p("fifo"), b"x", atomic=False)
        with self.assertRaises(PermissionError):
            await f.truncate(self.p("fifo"), 0)
        self.assertEqual(await f.read_file("/dev/zero", length=70000, allow_special=True), bytes(70000))
        chunks = [c async for c in f.open_read("/dev/zero", length=5000, allow_special=True)]
        self.assertEqual(b"".join(chunks), bytes(5000))
        st = await f.write_file("/dev/null", b"gone", allow_special=True)
        self.assertEqual(st.type, "character_device")

    async def test_watch(self) -> None:
        async def touch() -> None:
            await asyncio.sleep(0.2)
            with open(self.p("w"), "w"):
                pass

        task = asyncio.ensure_future(touch())
        async with self.shim.files.watch(self.d, timeout=10) as w:
            async for ev in w:
                if ev.type == "create":
                    self.assertEqual(ev.path, self.p("w"))
                    break
        await task

    async def test_commands_and_eval(self) -> None:
        r = await self.shim.commands.run("echo hi; exit 2")
        self.assertEqual((r.stdout, r.exit_code), ("hi\n", 2))
        self.assertEqual(await self.shim.eval("print(6 * 7)"), "42\n")
        with self.assertRaises(SandboxEvalError):
            await self.shim.eval("import sys; sys.exit(1)")
        async with await self.shim.commands.start(["cat"], stdin=True) as p:
            await p.write_stdin("abc")
            await p.close_stdin()
            out = b"".join([c.data async for c in p.stream()])
            r = await p.wait()
        self.assertEqual((out, r.exit_code), (b"abc", 0))
        self.assertGreater(await self.shim.ping(), 0)
        self.assertEqual((await self.shim.info()).protocol_version, 1)

    async def test_backup_restore(self) -> None:
        os.mkdir(self.p("src"))
        with open(self.p("src/f"), "wb") as h:
            h.write(b"content")
        buf = io.BytesIO()
        rec = await self.shim.backups.backup(self.p("src"), buf)
        self.assertEqual(rec["sha256"], hashlib.sha256(buf.getvalue()).hexdigest())
        res = await self.shim.backups.restore(self.p("dst"), buf.getvalue(), sha256=rec["sha256"])
        self.assertEqual(res["sha256"], rec["sha256"])
        self.assertEqual(slurp(self.p("dst/f")), b"content")

    async def test_abort_event(self) -> None:
        ev = asyncio.Event()
        pidfile = self.p("pid")
        asyncio.get_running_loop().call_later(0.3, ev.set)
        t0 = time.monotonic()
        with self.assertRaises(SandboxAbortError):
            await self.shim.commands.run(f"echo $$ > {pidfile}; exec sleep 30", abort=ev)
        self.assertLess(time.monotonic() - t0, 5)
        pid = int(slurp(pidfile))
        self.assertTrue(wait_until(lambda: not pid_alive(pid)))
        # a large upload, aborted midway: the old file stays
        await self.shim.files.write_file(self.p("big"), b"old")
        ev = asyncio.Event()
        loop = asyncio.get_running_loop()

        class Endless:
            sent = 0

            def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
                self.sent += len(b)
                if self.sent > 32 * 1024 * 1024:
                    loop.call_soon_threadsafe(ev.set)
                return len(b)

        with self.assertRaises(SandboxAbortError):
            await self.shim.files.write_file(self.p("big"), Endless(), abort=ev)
        self.assertEqual(await self.shim.files.read_file(self.p("big")), b"old")
        with self.assertRaises(TypeError):
            await self.shim.files.read_file(self.p("big"), abort="x")

    async def test_task_cancel_kills(self) -> None:
        pidfile = self.p("pid2")
        task = asyncio.ensure_future(self.shim.commands.run(f"echo $$ > {pidfile}; exec sleep 30"))
        self.assertTrue(await asyncio.get_running_loop().run_in_executor(None, wait_until, lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0))
        pid = int(slurp(pidfile))
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertTrue(wait_until(lambda: not pid_alive(pid)))
        # wait_for's timeout cancels too
        with self.assertRaises(asyncio.TimeoutError):
            await asyncio.wait_for(self.shim.commands.run(["sleep", "30"]), 0.3)
        p = await self.shim.commands.start(["sleep", "30"])
        t = asyncio.ensure_future(p.wait())
        await asyncio.sleep(0.2)
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        self.assertTrue(wait_until(lambda: not pid_alive(p.pid)))

    async def test_tunnels_and_mount_errors(self) -> None:
        from test_mounts_tunnels import CLIENT, echo_server

        srv, port = echo_server()
        try:
            t = await self.shim.tunnel(0, port)
            r = await self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "async"])
            self.assertEqual(r.stdout, "echo:async")
            self.assertIn(t.tunnel_id, [x.id for x in await self.shim.tunnels()])
            await self.shim.close_tunnel(t.tunnel_id)
            self.assertFalse(await t.wait(5))
            await t.close()
        finally:
            srv.close()
        self.assertEqual(await self.shim.mounts.list(), [])
        with self.assertRaises(ValueError):
            await self.shim.mounts.mount("b", self.p("m"), endpoint="nope", access_key_id="k", secret_access_key="s")

    async def test_native_no_threads(self) -> None:
        # no thread pool, no thread per stream: a burst of calls and streams on a fresh
        # connection starts no thread at all
        import threading

        before = threading.active_count()
        shim = await AsyncShim.connect(self.daemon.target)
        try:
            await shim.files.write_file(self.p("n"), os.urandom(3 << 20))
            results = await asyncio.gather(
                *(shim.commands.run(["sh", "-c", f"echo {i}"]) for i in range(40)),
                *(shim.files.read_file(self.p("n")) for _ in range(8)),
                *(shim.ping() for _ in range(40)),
            )
            self.assertEqual([r.stdout for r in results[:40]], [f"{i}\n" for i in range(40)])
            self.assertEqual(len({bytes(r) for r in results[40:48]}), 1)
            self.assertEqual(threading.active_count(), before)
        finally:
            await shim.close()

    async def test_ping_while_long_calls_are_in_flight(self) -> None:
        # 32 long calls in flight do not delay a ping (the thread-pool design made it wait 2.5 s)
        long = [asyncio.ensure_future(self.shim.commands.run(["sleep", "3"])) for _ in range(32)]
        try:
            self.assertTrue(await self._until(lambda: self._streams() >= 32))
            t0 = time.monotonic()
            await self.shim.ping()
            self.assertLess(time.monotonic() - t0, 0.5)
            self.assertTrue(all(not t.done() for t in long))
        finally:
            for t in long:
                t.cancel()
            await asyncio.gather(*long, return_exceptions=True)

    def _streams(self) -> int:
        return len(self.shim._e.calls)

    async def _until(self, cond, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            await asyncio.sleep(0.01)
        return bool(cond())

    async def test_max_output(self) -> None:
        from sandbox_shim import SandboxOutputLimitError

        with self.assertRaises(SandboxOutputLimitError) as cm:
            await self.shim.commands.run("head -c 5000 /dev/zero", max_output=100)
        self.assertEqual(len(cm.exception.result.stdout_bytes), 100)  # type: ignore[attr-defined]
        r = await self.shim.commands.run("head -c 5000 /dev/zero", max_output=100, truncate=True)
        self.assertTrue(r.stdout_truncated)
        r = await self.shim.commands.run("head -c 20000000 /dev/zero")
        self.assertEqual(len(r.stdout_bytes), 20000000)

    def test_signatures_are_typed_twins(self) -> None:
        # every coroutine of the async API spells out its parameters (no **kw) and has the
        # same parameters as its sync twin
        import inspect

        import sandbox_shim as S
        from sandbox_shim import aio

        pairs = [(aio.AsyncFiles, S.Files), (aio.AsyncCommands, S.Commands), (aio.AsyncBackups, S.Backups),
                 (aio.AsyncMounts, S.Mounts), (aio.AsyncProcess, S.Process), (aio.AsyncShim, S.Shim)]
        checked = 0
        for acls, scls in pairs:
            for name, fn in vars(acls).items():
                if name.startswith("_") or not callable(fn):
                    continue
                sig = inspect.signature(fn)
                kinds = [p.kind for p in sig.parameters.values()]
                self.assertNotIn(inspect.Parameter.VAR_KEYWORD, kinds, f"{acls.__name__}.{name}")
                twin = getattr(scls, name, None)
                if twin is None or isinstance(twin, property) or name in ("connect", "close"):
                    continue
                if isinstance(inspect.getattr_static(scls, name), classmethod):
                    continue
                self.assertEqual(list(sig.parameters), list(inspect.signature(twin).parameters),
                                 f"{acls.__name__}.{name}")
                self.assertTrue(fn.__doc__, f"{acls.__name__}.{name} has no docstring")
                checked += 1
        self.assertGreater(checked, 50)

    async def test_gather_many(self) -> None:
        async def one(i: int) -> bool:
            data = os.urandom(500 + i)
            await self.shim.files.write_file(self.p(f"g{i}"), data)
            r = await self.shim.commands.run(["cat", self.p(f"g{i}")])
            return r.stdout_bytes == data and await self.shim.files.read_file(self.p(f"g{i}")) == data

        results = await asyncio.gather(*(one(i) for i in range(100)))
        self.assertTrue(all(results))

class AsyncDropped(unittest.IsolatedAsyncioTestCase):
    """An async handle its user drops without close() gives its stream back (the shim
    allows 4 streams here): the command is killed, nothing waits for a slot."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon("--max-streams", "4")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    async def test_dropped_processes_are_killed(self) -> None:
        shim = await AsyncShim.connect(self.daemon.target)
        try:
            pids = []
            for _ in range(12):
                p = await asyncio.wait_for(shim.commands.start(["sleep", "300"]), 20)
                pids.append(p.pid)
                del p
            loop = asyncio.get_running_loop()
            gone = await loop.run_in_executor(None, wait_until, lambda: not any(pid_alive(x) for x in pids), 10)
            self.assertTrue(gone, "commands of dropped handles still run: %r" % [x for x in pids if pid_alive(x)])
            self.assertEqual((await shim.commands.run("echo fine")).stdout, "fine\n")
        finally:
            await shim.close()


if __name__ == "__main__":
    unittest.main()
