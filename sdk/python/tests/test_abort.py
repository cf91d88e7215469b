"""abort=: a threading.Event that cancels the operation in the shim."""

from __future__ import annotations

import os
import threading
import time
import unittest

from shimtest import ShimCase, pid_alive, slurp, wait_until

import sandbox_shim
from sandbox_shim import SandboxAbortError, SandboxConnectionError, SandboxTimeoutError


def set_later(ev: threading.Event, delay: float) -> threading.Timer:
    t = threading.Timer(delay, ev.set)
    t.start()
    return t


class Abort(ShimCase):
    def test_long_sleep(self) -> None:
        ev = threading.Event()
        pidfile = self.p("pid")
        set_later(ev, 0.5)
        t0 = time.monotonic()
        with self.assertRaises(SandboxAbortError) as cm:
            self.shim.commands.run(f"echo $$ > {pidfile}; sleep 30 & wait", abort=ev)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(cm.exception.errno, 125)
        self.assertEqual(cm.exception.errno_name, "ECANCELED")
        pid = int(slurp(pidfile))
        self.assertTrue(wait_until(lambda: not pid_alive(pid)), "the aborted command still runs")
        self.assertEqual(self.shim.commands.run("echo still usable").stdout, "still usable\n")

    def test_large_upload_keeps_old_file(self) -> None:
        target = self.p("big")
        self.shim.files.write_file(target, b"the old contents")
        ev = threading.Event()

        class Endless:
            sent = 0

            def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
                n = len(buf)
                buf[:n] = b"z" * n
                self.sent += n
                if self.sent > 64 * 1024 * 1024:
                    ev.set()  # 64 MiB in: abort from another thread's point of view
                if self.sent > 8 * 1024**3:
                    raise AssertionError("the abort did not stop the upload")
                return n

        src = Endless()
        with self.assertRaises(SandboxAbortError):
            self.shim.files.write_file(target, src, abort=ev)
        self.assertGreater(src.sent, 64 * 1024 * 1024)
        self.assertEqual(self.shim.files.read_file(target), b"the old contents")
        # the shim drops the temp file when the CANCEL reaches it, just after the call returned
        self.assertTrue(wait_until(lambda: sorted(os.listdir(self.d)) == ["big"]), os.listdir(self.d))

    def test_abort_already_set(self) -> None:
        ev = threading.Event()
        ev.set()
        with self.assertRaises(SandboxAbortError):
            self.shim.files.write_file(self.p("x"), b"data", abort=ev)
        self.assertFalse(os.path.exists(self.p("x")))

    def test_abort_read_watch_backup_process(self) -> None:
        with open(self.p("f"), "wb") as f:
            f.write(os.urandom(1024 * 1024))
        ev = threading.Event()
        set_later(ev, 0.3)
        with self.assertRaises(SandboxAbortError):
            for _ in self.shim.files.watch(self.d, abort=ev):
                pass
        ev = threading.Event()
        it = self.shim.files.open_read(self.p("f"), abort=ev)
        next(iter(it))
        ev.set()
        with self.assertRaises(SandboxAbortError):
            for _ in it:
                time.sleep(0.01)
        ev = threading.Event()

        def sink_write(b: bytes) -> None:
            ev.set()
            time.sleep(0.05)

        class W:
            write = staticmethod(sink_write)

        with self.assertRaises(SandboxAbortError):
            self.shim.backups.backup(self.d, W(), compression="none", abort=ev)
        ev = threading.Event()
        p = self.shim.commands.start(["sleep", "30"], abort=ev)
        pid = p.pid
        set_later(ev, 0.3)
        with self.assertRaises(SandboxAbortError):
            p.wait()
        p.close()
        self.assertTrue(wait_until(lambda: not pid_alive(pid)))

    def test_eval_abort_and_timeout(self) -> None:
        ev = threading.Event()
        set_later(ev, 0.3)
        with self.assertRaises(SandboxAbortError):
            self.shim.eval("import time; time.sleep(30)", abort=ev)
        with self.assertRaises(SandboxTimeoutError) as cm:
            self.shim.commands.run(["sleep", "30"], request_timeout=0.3)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertEqual(cm.exception.errno_name, "ETIMEDOUT")

    def test_close_fails_calls_in_flight(self) -> None:
        shim = sandbox_shim.Shim.connect(self.daemon.target)
        errors = []

        def long_call() -> None:
            try:
                shim.commands.run(["sleep", "30"])
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=long_call)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        shim.close()
        t.join(10)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], SandboxConnectionError)
        with self.assertRaises(SandboxConnectionError):
            shim.ping()
        shim.close()  # twice is fine


if __name__ == "__main__":
    unittest.main()
