"""shimtest: starts a sandbox-shim for a test module and connects to it.

Environment: SHIM_BIN (the daemon; default: sandbox-shim on PATH), set by ctest.
Every daemon listens on a unix socket in its own mktemp directory and is stopped by
its PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import sandbox_shim  # noqa: E402


def shim_bin() -> str:
    b = os.environ.get("SHIM_BIN") or shutil.which("sandbox-shim")
    if not b:
        raise unittest.SkipTest("no SHIM_BIN and no sandbox-shim on PATH")
    return b


class Daemon:
    """One sandbox-shim on a unix socket in a fresh temp directory."""

    def __init__(self, *args: str) -> None:
        self.tmp = tempfile.mkdtemp(prefix="sbxpy-")
        self.sock = os.path.join(self.tmp, "shim.sock")
        self.target = "unix:" + self.sock
        self.log = os.path.join(self.tmp, "shim.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [shim_bin(), "--listen", self.target, "--state-dir", os.path.join(self.tmp, "state"), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(self.log, "rb") as f:
                if b" ready (pid " in f.read():
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("sandbox-shim did not become ready: " + self.read_log())

    def read_log(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


class ShimCase(unittest.TestCase):
    """A daemon and a Shim per test class; a fresh directory per test (self.d)."""

    daemon: Daemon
    shim: "sandbox_shim.Shim"
    daemon_args: List[str] = []

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon(*cls.daemon_args)
        try:
            cls.shim = sandbox_shim.Shim.connect(cls.daemon.target)
        except BaseException:
            cls.daemon.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.shim.close()
        cls.daemon.stop()

    def setUp(self) -> None:
        self.d = tempfile.mkdtemp(prefix="case-", dir=self.daemon.tmp)

    def tearDown(self) -> None:
        shutil.rmtree(self.d, ignore_errors=True)

    def p(self, *names: str) -> str:
        return os.path.join(self.d, *names)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
    return True


def wait_until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def slurp(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
