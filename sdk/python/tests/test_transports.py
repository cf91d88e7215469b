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

    def test_exec_no_token(self) -> None:
        # an exec: command gets neither SBX_TOKEN nor SBX_TOKEN_FILE, and its HELLO no
        # token unless one is given; the command records its environment and (through
        # tee) every byte sent to it
        shim_bin = os.environ.get("SHIM_BIN", "sandbox-shim")
        env_f, hello_f = self.p("env"), self.p("hello")
        # the shim's stdout is a pipe to cat: the shim makes its stdout non-blocking, and
        # the socket there would be tee's stdin too
        target = (f"exec:env > '{env_f}'; tee '{hello_f}' | '{shim_bin}' --stdio --state-dir '{self.p('st2')}'"
                  " | cat")
        saved = {k: os.environ.get(k) for k in ("SBX_TOKEN", "SBX_TOKEN_FILE", "SBX_TARGET", "SBX_KEEP_ME")}
        os.environ.update(SBX_TOKEN="py-env-secret-1", SBX_TOKEN_FILE="/py/secret-file-2", SBX_KEEP_ME="kept")
        try:
            def files() -> tuple:
                with open(env_f, "rb") as f, open(hello_f, "rb") as g:
                    return f.read(), g.read()

            def check_env(env: bytes) -> None:
                self.assertNotIn(b"py-env-secret-1", env)
                self.assertNotIn(b"SBX_TOKEN", env)
                self.assertNotIn(b"secret-file-2", env)
                self.assertIn(b"SBX_KEEP_ME=kept\n", env)

            with Shim.connect(target) as s:
                self.assertEqual(s.commands.run(["echo", "ok"]).stdout, "ok\n")
            env, hello = files()
            check_env(env)
            self.assertTrue(hello)
            self.assertNotIn(b"py-env-secret-1", hello)
            # the token given here is sent; the environment's still is not passed on
            with Shim.connect(target, token="py-explicit-3") as s:
                s.ping()
            env, hello = files()
            check_env(env)
            self.assertIn(b"py-explicit-3", hello)
            # the same through $SBX_TARGET, and for AsyncShim
            os.environ["SBX_TARGET"] = target
            with Shim.connect() as s:
                s.ping()
            env, hello = files()
            check_env(env)
            self.assertNotIn(b"py-env-secret-1", hello)

            async def go() -> None:
                async with await AsyncShim.connect(target) as a:
                    await a.ping()

            asyncio.run(go())
            env, hello = files()
            check_env(env)
            self.assertNotIn(b"py-env-secret-1", hello)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

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
