"""Transports: Firecracker's hybrid vsock (against a fake muxer), exec: and its stderr,
vsock where it cannot connect, bad targets, and a transport object of the caller's."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import unittest

from shimtest import HERE, ShimCase

import sandbox_shim
from sandbox_shim import AsyncShim, Shim
from sandbox_shim import errors as E


class FakeFirecracker:
    """Firecracker's host side of a hybrid vsock: a unix socket where a client writes
    ``CONNECT PORT\\n``; for the port it knows it answers ``OK N\\n`` and relays the rest
    to the shim's unix socket, for any other it closes the connection."""

    def __init__(self, path: str, port: int, shim_sock: str, answer: bytes = b"OK 1073741824\n") -> None:
        self.path, self.port, self.shim_sock, self.answer = path, port, shim_sock, answer
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(8)
        self.lines: list = []
        self.socks: list = []
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.socks.append(c)
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket) -> None:
        line = b""
        while not line.endswith(b"\n") and len(line) < 64:
            b = c.recv(1)
            if not b:
                c.close()
                return
            line += b
        self.lines.append(line)
        if line != f"CONNECT {self.port}\n".encode():
            c.close()
            return
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socks.append(up)
        up.connect(self.shim_sock)
        # the answer and the first protocol bytes in one write: the client must not read
        # past the answer's newline
        c.sendall(self.answer)

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while True:
                    d = a.recv(65536)
                    if not d:
                        break
                    b.sendall(d)
            except OSError:
                pass
            finally:
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        threading.Thread(target=pump, args=(c, up), daemon=True).start()
        threading.Thread(target=pump, args=(up, c), daemon=True).start()

    def close(self) -> None:
        self.srv.close()
        for c in self.socks:
            c.close()


class Transports(ShimCase):
    def test_firecracker_hybrid_vsock(self) -> None:
        fc = FakeFirecracker(self.p("fc.sock"), 1024, self.daemon.sock)
        try:
            with Shim.connect(f"fc:{self.p('fc.sock')}:1024") as s:
                self.assertEqual(s.commands.run(["echo", "through fc"]).stdout, "through fc\n")
                data = os.urandom(3 << 20)
                s.files.write_file(self.p("fcdata"), data)
                self.assertEqual(s.files.read_file(self.p("fcdata")), data)
            self.assertEqual(fc.lines[0], b"CONNECT 1024\n")

            async def via_async() -> str:
                async with await AsyncShim.connect(f"fc:{self.p('fc.sock')}:1024") as a:
                    return (await a.commands.run(["echo", "async fc"])).stdout

            self.assertEqual(asyncio.run(via_async()), "async fc\n")
            # a port nothing listens on: Firecracker closes the connection
            with self.assertRaises(E.SandboxConnectionError) as cm:
                Shim.connect(f"fc:{self.p('fc.sock')}:2048")
            self.assertEqual(cm.exception.errno_name, "ECONNREFUSED")
            self.assertIn("2048", str(cm.exception))
        finally:
            fc.close()

    def test_firecracker_bad_answer(self) -> None:
        fc = FakeFirecracker(self.p("fc2.sock"), 1024, self.daemon.sock, answer=b"NO thanks\n")
        try:
            with self.assertRaises(E.SandboxConnectionError) as cm:
                Shim.connect(f"fc:{self.p('fc2.sock')}:1024", timeout=5)
            self.assertIn("NO thanks", str(cm.exception))
        finally:
            fc.close()

    def test_exec_stderr_is_not_ours(self) -> None:
        # the spawned command's stderr does not land in the host program's stderr; a
        # command that fails says why in the error
        shim_bin = os.environ.get("SHIM_BIN", "sandbox-shim")
        code = (
            "import sys\nsys.path.insert(0, sys.argv[1])\nfrom sandbox_shim import Shim, SandboxConnectionError\n"
            "with Shim.connect('exec:echo noise-on-stderr >&2; exec ' + sys.argv[2] + ' --stdio --state-dir ' + sys.argv[3]) as s:\n"
            "    print(s.commands.run(['echo', 'ok']).stdout, end='')\n"
            "try:\n    Shim.connect('exec:echo it-went-wrong >&2; exit 3')\n"
            "except SandboxConnectionError as e:\n    print('refused:', e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code, os.path.join(os.path.dirname(HERE), "src"), shim_bin,
                              self.p("st")], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith("ok\nrefused: "), out.stdout)
        self.assertIn("it-went-wrong", out.stdout)
        self.assertNotIn("noise-on-stderr", out.stderr)
        self.assertNotIn("it-went-wrong", out.stderr)

    def test_exec_stderr_inherit(self) -> None:
        code = ("import sys\nsys.path.insert(0, sys.argv[1])\nfrom sandbox_shim import Shim, SandboxError\n"
                "try:\n    Shim.connect('exec:echo shown-to-us >&2; exit 3', exec_stderr='inherit')\n"
                "except SandboxError as e:\n    print(type(e).__name__)\n")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(os.path.dirname(HERE), "src")],
                             capture_output=True, text=True, timeout=60)
        self.assertIn("shown-to-us", out.stderr)
        self.assertEqual(out.stdout, "SandboxConnectionError\n")

    def test_vsock_and_bad_targets(self) -> None:
        # no loopback vsock transport on this kernel: a clean connection error, not a hang
        if hasattr(socket, "AF_VSOCK"):
            with self.assertRaises((E.SandboxConnectionError, E.SandboxTimeoutError)):
                Shim.connect("vsock:1:1024", timeout=1)
        for bad in ("nope", "unix:", "tcp:127.0.0.1", "tcp:127.0.0.1:0", "tcp:127.0.0.1:99999", "vsock:x:1",
                    "fc:/x", "exec:  ", "http://x"):
            with self.subTest(target=bad):
                with self.assertRaises(E.SandboxInvalidArgumentError):
                    Shim.connect(bad)
        with self.assertRaises(TypeError):
            Shim.connect(42)  # type: ignore[arg-type]

    def test_environment_defaults(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("SBX_TARGET", "SBX_TOKEN")}
        code = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport sandbox_shim\n"
                "with sandbox_shim.Shim.connect() as s: print(s.ping() > 0, s.target)\n")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(os.path.dirname(HERE), "src")],
                             env={**env, "SBX_TARGET": self.daemon.target}, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout, f"True {self.daemon.target}\n", out.stderr)

    def test_own_transport_object(self) -> None:
        # anything with read/write/close: here a socketpair-like wrapper that counts bytes
        class Counting:
            def __init__(self, path: str) -> None:
                self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.s.connect(path)
                self.rx = self.tx = 0

            def read(self, n: int) -> bytes:
                b = self.s.recv(n)
                self.rx += len(b)
                return b

            def write(self, data: bytes) -> None:
                self.s.sendall(data)
                self.tx += len(data)

            def close(self) -> None:
                try:
                    self.s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.s.close()

        t = Counting(self.daemon.sock)
        with Shim.connect(t) as s:
            self.assertEqual(s.files.read_text(self.daemon.log)[:0], "")
            s.files.write_file(self.p("own"), b"x" * 100000)
        self.assertGreater(t.tx, 100000)
        self.assertGreater(t.rx, 0)
        self.assertEqual(sandbox_shim.Shim.connect.__doc__.count("transport"), 2)


if __name__ == "__main__":
    unittest.main()
