"""shim.tunnel() / shim.forward() with real TCP traffic, and shim.mounts against a real
S3 server (npm s3rver, through tests/lib/s3rver.sh; skipped when it is not there)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import unittest

from shimtest import HERE, ShimCase, wait_until

import sandbox_shim
from sandbox_shim import SandboxError, SandboxPermissionError, TunnelHandle

REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
S3RVER_SH = os.path.join(REPO, "tests", "lib", "s3rver.sh")


def echo_server() -> "tuple[socket.socket, int]":
    """A TCP server on this host that answers every line with "echo:" + line."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                buf = b""
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    buf += d
                c.sendall(b"echo:" + buf)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)
out = b""
while True:
    d = s.recv(65536)
    if not d: break
    out += d
sys.stdout.write(out.decode())
"""

SERVER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    data = b""
    while True:
        d = c.recv(65536)
        if not d: break
        data += d
    c.sendall(b"inside:" + data[::-1]); c.close()
"""


class Tunnels(ShimCase):
    def test_reverse_tunnel(self) -> None:
        srv, port = echo_server()
        events = []
        try:
            with self.shim.tunnel(0, port, on_event=events.append) as t:
                self.assertIsInstance(t, TunnelHandle)
                self.assertEqual(t.kind, "reverse")
                self.assertGreater(t.port, 0)
                self.assertTrue(t.tunnel_id)
                for i in range(3):
                    r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), f"hello {i}"])
                    self.assertEqual(r.stdout, f"echo:hello {i}", r.stderr)
                self.assertIn(t.tunnel_id, [x.id for x in self.shim.tunnels()])
                self.assertTrue(wait_until(lambda: sum(e.type == "close" for e in events) == 3))
                closes = [e for e in events if e.type == "close"]
                self.assertEqual(closes[0].bytes_in, len("echo:hello 0"))
                self.assertEqual(closes[0].bytes_out, len("hello 0"))
                self.assertEqual(sum(e.type == "open" for e in events), 3)
            self.assertTrue(t.closed)
            self.assertNotIn(t.tunnel_id, [x.id for x in self.shim.tunnels()])
            r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertNotEqual(r.exit_code, 0)  # nothing listens inside any more
        finally:
            srv.close()

    def test_reverse_fixed_port_and_refused(self) -> None:
        # a port on this host where nothing listens: the connection fails, reported as "fail"
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        s.close()
        events = []
        with self.shim.tunnel(0, dead, on_event=events.append) as t:
            r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertEqual(r.stdout, "")
            self.assertTrue(wait_until(lambda: any(e.type == "fail" for e in events)))
            fail = [e for e in events if e.type == "fail"][0]
            self.assertIsNotNone(fail.error)
            self.assertEqual(fail.error.errno_name, "ECONNREFUSED")
            # the same port inside again: taken
            with self.assertRaises(SandboxError) as cm:
                self.shim.tunnel(t.port, dead)
            self.assertEqual(cm.exception.errno_name, "EADDRINUSE")

    def test_forward(self) -> None:
        with self.shim.commands.start(["python3", "-c", SERVER]) as server:
            first = server.read()
            assert first is not None
            guest_port = int(first.data.split()[0])
            with self.shim.forward(guest_port) as t:
                self.assertEqual(t.kind, "forward")
                self.assertGreater(t.port, 0)

                def ask(msg: bytes) -> bytes:
                    with socket.create_connection(("127.0.0.1", t.port), timeout=10) as c:
                        c.sendall(msg)
                        c.shutdown(socket.SHUT_WR)
                        out = b""
                        while True:
                            d = c.recv(65536)
                            if not d:
                                return out
                            out += d

                self.assertEqual(ask(b"abc"), b"inside:cba")
                big = os.urandom(3 * 1024 * 1024)
                self.assertEqual(ask(big), b"inside:" + big[::-1])
                results = []
                ths = [threading.Thread(target=lambda i=i: results.append(ask(str(i).encode() * 3))) for i in range(8)]
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
                self.assertEqual(sorted(results), sorted(b"inside:" + str(i).encode() * 3 for i in range(8)))
                # closed by id from "elsewhere": the handle sees it end
                self.shim.close_tunnel(t.tunnel_id)
                self.assertFalse(t.wait(5))
            server.kill()

    def test_wait_while_closed_elsewhere(self) -> None:
        t = self.shim.forward(9, 0)
        results = []
        th = threading.Thread(target=lambda: results.append(t.wait()))
        th.start()
        time.sleep(0.3)
        self.assertEqual(t.active, 0)
        t.close()  # from another thread than the waiter's
        th.join(5)
        self.assertEqual(results, [False])
        self.assertFalse(t.wait(1))
        t.close()
        self.assertEqual(t.active, 0)

    def test_close_with_shim_and_validation(self) -> None:
        srv, port = echo_server()
        shim = sandbox_shim.Shim.connect(self.daemon.target)
        t = shim.forward(9, 0)
        lp = t.port
        shim.close()  # closes the tunnel too
        self.assertTrue(t.closed)
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", lp), timeout=2).close()
        srv.close()
        with self.assertRaises(ValueError):
            self.shim.tunnel(0, 0)
        with self.assertRaises(ValueError):
            self.shim.tunnel(70000, 80)
        with self.assertRaises(ValueError):
            self.shim.forward(0)
        with self.assertRaises(TypeError):
            self.shim.forward("80")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.shim.tunnel(0, 80, on_event="log")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            self.shim.tunnel(0, 80, local_host="")
        with self.assertRaises(SandboxError) as cm:
            self.shim.close_tunnel("t999999")
        self.assertEqual(cm.exception.errno_name, "ENOENT")


def s3rver(d: str) -> "tuple[int, str, str, str]":
    """Start s3rver (bucket "pybucket") with its data in directory d; returns (pid,
    endpoint, key, secret). Skips the test when the tools are not there."""
    if not os.path.exists(S3RVER_SH):
        raise unittest.SkipTest("tests/lib/s3rver.sh not found")
    for tool in ("rclone", "fusermount3", "npm"):
        if not shutil.which(tool):
            raise unittest.SkipTest(f"{tool} not installed")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise unittest.SkipTest("FUSE mounts need root and /dev/fuse")
    script = f'source "{S3RVER_SH}" && s3rver_install >&2 && s3rver_start "$1" pybucket >&2 && echo "$S3_PID $S3_ENDPOINT $S3_ACCESS_KEY $S3_SECRET_KEY"'
    r = subprocess.run(["bash", "-c", script, "s3", d], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise unittest.SkipTest("s3rver could not be started: " + r.stderr[-500:])
    pid, endpoint, key, secret = r.stdout.split()
    return int(pid), endpoint, key, secret


class Mounts(ShimCase):
    @classmethod
    def setUpClass(cls) -> None:
        import tempfile

        cls.s3dir = tempfile.mkdtemp(prefix="sbxpy-s3-")
        try:
            cls.s3 = s3rver(cls.s3dir)
        except BaseException:
            shutil.rmtree(cls.s3dir, ignore_errors=True)
            raise
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        try:
            os.kill(cls.s3[0], 15)
        except ProcessLookupError:
            pass
        shutil.rmtree(cls.s3dir, ignore_errors=True)

    def test_mount_write_list_unmount(self) -> None:
        _, endpoint, key, secret = self.s3
        mp = self.p("bucket")
        rec = self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        self.assertEqual(rec["state"], "live")
        self.assertEqual(rec["path"], mp)
        self.assertEqual(rec["bucket"], "pybucket")
        self.shim.files.write_file(f"{mp}/hello.txt", b"through the mount")
        self.assertEqual(self.shim.files.read_file(f"{mp}/hello.txt"), b"through the mount")
        listed = self.shim.mounts.list()
        self.assertIn(rec["id"], [m["id"] for m in listed])
        with self.assertRaises(SandboxError) as cm:  # already a mount point
            self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        self.assertEqual(cm.exception.errno_name, "EBUSY")
        done = self.shim.mounts.unmount(rec["id"])
        self.assertEqual(done["state"], "unmounted")
        self.assertNotIn(rec["id"], [m["id"] for m in self.shim.mounts.list() if m["state"] != "unmounted"])
        # the object really went to the bucket: mount again read-only (by path this time)
        ro = self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret,
                                    read_only=True)
        self.assertTrue(ro["read_only"])
        self.assertEqual(self.shim.files.read_file(f"{mp}/hello.txt"), b"through the mount")
        with self.assertRaises(SandboxError) as cm:
            self.shim.files.write_file(f"{mp}/nope.txt", b"x")
        self.assertEqual(cm.exception.errno_name, "EROFS")
        self.shim.mounts.unmount(mp)

    def test_refused_key_and_validation(self) -> None:
        _, endpoint, key, secret = self.s3
        m = self.shim.mounts
        # refused keys: the shim documents EACCES with rclone's words (a PermissionError
        # here); whatever the code, the secret never appears in the error
        with self.assertRaises(SandboxError) as cm:
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id="NOT-A-KEY",
                    secret_access_key="s3cret-never-shown", mount_timeout=5)
        self.assertNotIn("s3cret-never-shown", str(cm.exception))
        if cm.exception.errno_name == "EACCES":
            self.assertIsInstance(cm.exception, SandboxPermissionError)
            self.assertIsInstance(cm.exception, PermissionError)
        with self.assertRaises(ValueError):
            m.mount("pybucket", self.p("x"), endpoint="ftp://x", access_key_id=key, secret_access_key=secret)
        with self.assertRaises(ValueError):
            m.mount("", self.p("x"), endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        with self.assertRaises(TypeError):
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id=1, secret_access_key=secret)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id=key, secret_access_key=secret, options="ro")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            m.mount("pybucket", "relative", endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        with self.assertRaises(SandboxError) as cm:
            m.unmount("no-such-mount")
        self.assertEqual(cm.exception.errno_name, "ENOENT")


if __name__ == "__main__":
    unittest.main()
