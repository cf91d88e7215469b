"""snapshot_prepare() and resumed() (PROTOCOL.md 12.6) on the sync and async clients:
the generation in HELLO_OK and info, what each step reports, stopped background
commands, bad input. The daemon "sets" the clock through its test seam
(SANDBOX_SHIM_TEST_CLOCK_FILE): no test here ever sets this machine's clock."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import unittest

from shimtest import Daemon, wait_until

import sandbox_shim
from sandbox_shim import AsyncShim, SandboxBusyError, SandboxInvalidArgumentError, Shim


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except OSError:
        return ""


class SnapshotTest(unittest.TestCase):
    daemon: Daemon
    seam_dir: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.seam_dir = tempfile.mkdtemp(prefix="sbxpy-seam-")
        cls.seam = os.path.join(cls.seam_dir, "clock")
        old = os.environ.get("SANDBOX_SHIM_TEST_CLOCK_FILE")
        os.environ["SANDBOX_SHIM_TEST_CLOCK_FILE"] = cls.seam
        try:
            cls.daemon = Daemon()
        finally:
            if old is None:
                del os.environ["SANDBOX_SHIM_TEST_CLOCK_FILE"]
            else:
                os.environ["SANDBOX_SHIM_TEST_CLOCK_FILE"] = old

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
        shutil.rmtree(cls.seam_dir, ignore_errors=True)

    def connect(self) -> Shim:
        s = Shim.connect(self.daemon.target)
        self.addCleanup(s.close)
        return s

    def test_sequence(self) -> None:
        """prepare -> (snapshot) -> resumed, and the generation it bumps."""
        s = self.connect()
        g0 = s.server.generation
        self.assertEqual(s.info().generation, g0)
        self.assertEqual(s.server["generation"], g0)
        p = s.snapshot_prepare()
        self.assertIsInstance(p, sandbox_shim.SnapshotResult)
        self.assertEqual(p.generation, g0)
        self.assertEqual(p.thaw_after, 30.0)
        self.assertEqual([x.name for x in p.steps][:2], ["sync", "flush"])
        self.assertEqual(p.frozen, [])
        with self.assertRaises(SandboxBusyError):
            s.snapshot_prepare()
        # the host's time now (the default): through the seam when the shim may set it
        r = s.resumed()
        self.assertEqual(r.generation, g0 + 1)
        self.assertTrue(r.prepared)
        clock = r.step("clock")
        self.assertIsNotNone(clock)
        if os.geteuid() == 0:
            self.assertEqual(clock.error, 0, clock.message)
            self.assertIn("test seam", clock.message)
        else:
            self.assertEqual(clock.error_name, "EPERM")
        self.assertIsNotNone(r.step("entropy"))
        # a new connection's HELLO_OK and info say the new generation
        s2 = self.connect()
        self.assertEqual(s2.server.generation, g0 + 1)
        self.assertEqual(s2.info().generation, g0 + 1)
        r = s2.resumed(fork=True, entropy=bytes(range(32)))
        self.assertEqual(r.generation, g0 + 2)
        self.assertFalse(r.prepared)

    def test_clock_through_seam(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("needs CAP_SYS_TIME (root)")
        s = self.connect()
        # first the host's time now: were the seam not in place, that sets nothing new
        self.assertIn("test seam", s.resumed().step("clock").message)
        os.unlink(self.seam)
        want = int(time.time()) + 7200
        before = time.time()
        r = s.resumed(time=want)
        self.assertEqual(r.step("clock").error, 0)
        self.assertGreater(r.clock_delta, 7000)
        with open(self.seam) as f:
            self.assertEqual(f.read(), f"{want} 0\n")
        self.assertLess(abs(time.time() - before), 600)

    def test_bad_input(self) -> None:
        s = self.connect()
        g = s.info().generation
        now = time.time()
        for kw, words in [
            ({"time": -1}, "before 1970"),
            ({"time": now + 11 * 366 * 86400}, "10 years ahead"),
            ({"entropy": b""}, "entropy: 0 bytes"),
            ({"entropy": b"x" * 31}, "entropy: 31 bytes"),
            ({"entropy": b"x" * 513}, "entropy: 513 bytes"),
        ]:
            with self.subTest(kw=list(kw)):
                with self.assertRaises(SandboxInvalidArgumentError) as cm:
                    s.resumed(**kw)
                self.assertIn(words, str(cm.exception))
        self.assertEqual(s.info().generation, g)
        with self.assertRaises(SandboxInvalidArgumentError):
            s.snapshot_prepare(thaw_after=0.05)
        with self.assertRaises(SandboxInvalidArgumentError) as cm:
            s.snapshot_prepare(freeze=[self.daemon.tmp])
        self.assertIn("not a mount point", str(cm.exception))
        with self.assertRaises(SandboxBusyError):
            s.snapshot_prepare(freeze=["/"])
        with self.assertRaises(TypeError):
            s.snapshot_prepare(freeze="/mnt")
        with self.assertRaises(TypeError):
            s.resumed(entropy="text")
        # nothing is held after those
        s.snapshot_prepare()
        self.assertTrue(s.resumed().prepared)

    def test_stop_background(self) -> None:
        s = self.connect()
        p = s.commands.spawn(["sleep", "1000"])
        self.addCleanup(lambda: s.commands.kill(p.id) if proc_state(p.pid) else None)
        self.assertTrue(wait_until(lambda: proc_state(p.pid) == "S", 10))
        r = s.snapshot_prepare(stop_background=True)
        self.assertEqual(r.stopped, [p.id])
        self.assertEqual(r.step("stop").count, 1)
        self.assertTrue(wait_until(lambda: proc_state(p.pid) == "T", 10))
        r = s.resumed()
        self.assertEqual(r.step("continue").count, 1)
        self.assertTrue(wait_until(lambda: proc_state(p.pid) == "S", 10))

    def test_example(self) -> None:
        """The sandkiln-shaped example: prepare -> the host's snapshot command -> resumed."""
        import subprocess
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        marker = os.path.join(self.seam_dir, "snapshotted")
        env = dict(os.environ, SBX_TARGET=self.daemon.target, PYTHONPATH=os.path.join(os.path.dirname(here), "src"),
                   SNAPSHOT_CMD=f"touch '{marker}'")
        for k in ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "SNAPSHOT_FREEZE", "SNAPSHOT_FORK"):
            env.pop(k, None)
        g = self.connect().info().generation
        work = os.path.join(self.seam_dir, "work")
        r = subprocess.run([sys.executable, os.path.join(os.path.dirname(here), "examples", "vm_loop.py"), work],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.exists(marker))
        self.assertRegex(r.stdout, rf"snapshot: prepared \(sync ok, flush ok, stop ok\), generation {g}\n")
        self.assertRegex(r.stdout, rf"snapshot: resumed \(clock (ok|EPERM), entropy (ok|EPERM), continue ok\), "
                                   rf"generation {g + 1}\n")

    def test_async(self) -> None:
        async def main() -> None:
            async with await AsyncShim.connect(self.daemon.target) as a:
                g = (await a.info()).generation
                p = await a.snapshot_prepare(thaw_after=60)
                self.assertEqual(p.thaw_after, 60.0)
                r = await a.resumed()
                self.assertEqual(r.generation, g + 1)
                self.assertTrue(r.prepared)
                self.assertEqual((await a.info()).generation, g + 1)

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
