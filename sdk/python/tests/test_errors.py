"""Error classes: hierarchy, builtin bases, errno/errno_name/path from the shim."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import unittest

from shimtest import HERE, Daemon, ShimCase

import sandbox_shim
from sandbox_shim import errors as E


class Classes(unittest.TestCase):
    def test_hierarchy(self) -> None:
        pairs = [
            (E.SandboxFileNotFoundError, FileNotFoundError),
            (E.SandboxFileExistsError, FileExistsError),
            (E.SandboxPermissionError, PermissionError),
            (E.SandboxNotADirectoryError, NotADirectoryError),
            (E.SandboxIsADirectoryError, IsADirectoryError),
            (E.SandboxTimeoutError, TimeoutError),
            (E.SandboxConnectionError, ConnectionError),
            (E.SandboxProcessLookupError, ProcessLookupError),
            (E.SandboxInvalidArgumentError, ValueError),
            (E.SandboxEvalError, RuntimeError),
            (E.SandboxReadOnlyError, OSError),
        ]
        for cls, builtin in pairs:
            self.assertTrue(issubclass(cls, E.SandboxError), cls)
            self.assertTrue(issubclass(cls, builtin), cls)
        self.assertTrue(issubclass(E.SandboxAbortError, E.SandboxError))
        for name in E.__all__:
            self.assertIs(getattr(sandbox_shim, name), getattr(E, name))
            if name.startswith("Sandbox"):
                self.assertTrue(issubclass(getattr(E, name), E.SandboxError), name)
        self.assertEqual((E.errno_name(2), E.errno_number("ENOENT"), E.strerror(2)),
                         ("ENOENT", 2, "No such file or directory"))
        self.assertEqual((E.errno_name(9999), E.errno_number("ENOPE")), (None, None))

    def test_errno_table(self) -> None:
        # Linux values, whatever the host is: the class follows the number
        for code, cls in [(2, E.SandboxFileNotFoundError), (17, E.SandboxFileExistsError), (13, E.SandboxPermissionError),
                          (1, E.SandboxPermissionError), (20, E.SandboxNotADirectoryError), (21, E.SandboxIsADirectoryError),
                          (39, E.SandboxDirectoryNotEmptyError), (30, E.SandboxReadOnlyError), (28, E.SandboxNoSpaceError),
                          (110, E.SandboxTimeoutError), (125, E.SandboxAbortError), (16, E.SandboxBusyError),
                          (38, E.SandboxUnsupportedError), (22, E.SandboxInvalidArgumentError), (999, E.SandboxError)]:
            self.assertIs(E.error_class("remote", code), cls, code)
        self.assertIs(E.error_class("protocol", 71), E.SandboxProtocolError)
        self.assertIs(E.error_class("connect", 111), E.SandboxConnectionError)
        self.assertEqual(sandbox_shim.errno_name(2), "ENOENT")
        self.assertEqual(sandbox_shim.errno_name(125), "ECANCELED")
        self.assertIsNone(sandbox_shim.errno_name(4095))

    def test_attributes_and_pickle(self) -> None:
        e = E.SandboxFileNotFoundError("open", errno=2, errno_name="ENOENT", path="/x")
        self.assertEqual((e.errno, e.errno_name, e.path, e.filename), (2, "ENOENT", "/x", "/x"))
        e2 = pickle.loads(pickle.dumps(e))
        self.assertIs(type(e2), E.SandboxFileNotFoundError)
        self.assertEqual((e2.errno, e2.errno_name, e2.path), (2, "ENOENT", "/x"))


class FromTheShim(ShimCase):
    def test_remote_errnos(self) -> None:
        f = self.shim.files
        os.mkdir(self.p("dir"))
        os.mkdir(self.p("full"))
        open(self.p("file"), "w").close()
        open(self.p("full", "x"), "w").close()
        cases = [
            (lambda: f.read_file(self.p("nope")), E.SandboxFileNotFoundError, "ENOENT", self.p("nope")),
            (lambda: f.mkdir(self.p("dir")), E.SandboxFileExistsError, "EEXIST", self.p("dir")),
            (lambda: f.read_directory(self.p("file")), E.SandboxNotADirectoryError, "ENOTDIR", self.p("file")),
            (lambda: f.read_file(self.p("dir")), E.SandboxIsADirectoryError, "EISDIR", self.p("dir")),
            (lambda: f.delete(self.p("full")), E.SandboxDirectoryNotEmptyError, "ENOTEMPTY", self.p("full")),
            (lambda: f.stat(self.p("file", "below")), E.SandboxNotADirectoryError, "ENOTDIR", None),
            (lambda: f.write_file("/sys/kernel/sbx-python-test", b"x"), E.SandboxPermissionError, "EACCES", None),
        ]
        for fn, cls, name, path in cases:
            with self.assertRaises(cls) as cm:
                fn()
            e = cm.exception
            self.assertEqual(e.errno_name, name)
            self.assertEqual(e.errno, {"ENOENT": 2, "EEXIST": 17, "ENOTDIR": 20, "EISDIR": 21, "ENOTEMPTY": 39, "EACCES": 13}[name])
            self.assertEqual(e.kind, "remote")
            if path is not None:
                self.assertEqual(e.path, path)
                self.assertIn(path, str(e))
            self.assertTrue(str(e).startswith(name + ": "), str(e))

    def test_permission_as_nobody(self) -> None:
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            self.skipTest("needs root and setpriv to run a daemon as nobody")
        # the directories are searchable, root's 0600 file is not readable by nobody
        os.chmod(self.daemon.tmp, 0o755)
        os.chmod(self.d, 0o755)
        with open(self.p("secret"), "w") as h:
            h.write("x")
        os.chmod(self.p("secret"), 0o600)
        with open(self.p("public"), "w") as h:
            h.write("x")
        os.chmod(self.p("public"), 0o644)
        import tempfile

        tmp = tempfile.mkdtemp(prefix="sbxpy-nobody-")
        # nobody's own directory for its socket (a world-writable one is refused by the shim)
        os.chown(tmp, 65534, 65534)
        os.chmod(tmp, 0o755)
        sock = os.path.join(tmp, "s")
        log = open(os.path.join(tmp, "log"), "wb")
        proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                 os.environ.get("SHIM_BIN", "sandbox-shim"), "--listen", "unix:" + sock,
                                 "--state-dir", os.path.join(tmp, "st")], stdout=log, stderr=log)
        try:
            with sandbox_shim.Shim.connect("unix:" + sock, wait=10) as nb:
                with self.assertRaises(E.SandboxPermissionError) as cm:
                    nb.files.read_file(self.p("secret"))
                self.assertIsInstance(cm.exception, PermissionError)
                self.assertEqual(cm.exception.errno_name, "EACCES")
                self.assertEqual(cm.exception.path, self.p("secret"))
                self.assertEqual(nb.files.read_file(self.p("public")), b"x")
                with self.assertRaises(PermissionError):
                    nb.files.chown(self.p("secret"), 65534)
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_connect_errors(self) -> None:
        with self.assertRaises(E.SandboxConnectionError) as cm:
            sandbox_shim.Shim.connect("unix:" + self.p("no-socket"))
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertEqual(cm.exception.kind, "connect")
        with self.assertRaises(ValueError):
            sandbox_shim.Shim.connect("")
        with self.assertRaises(TypeError):
            sandbox_shim.Shim.connect(5)  # type: ignore[arg-type]
        with self.assertRaises(E.SandboxError):
            sandbox_shim.Shim.connect("bogus:thing")
        env = dict(os.environ)
        env.pop("SBX_TARGET", None)
        code = "import sandbox_shim\ntry:\n sandbox_shim.Shim.connect()\nexcept ValueError as e: print('VE', e)"
        out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": os.path.join(os.path.dirname(HERE), "src")},
                             capture_output=True, text=True, timeout=60)
        self.assertIn("VE no target given", out.stdout, out.stderr)

    def test_connect_timeout_and_wait(self) -> None:
        import socket
        import threading
        import time

        # a socket that accepts and never answers the HELLO
        path = self.p("silent.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(4)
        try:
            t0 = time.monotonic()
            with self.assertRaises(E.SandboxError) as cm:
                sandbox_shim.Shim.connect("unix:" + path, timeout=0.5)
            self.assertLess(time.monotonic() - t0, 5)
            self.assertEqual(cm.exception.errno_name, "ETIMEDOUT")
            self.assertIsInstance(cm.exception, TimeoutError)
        finally:
            srv.close()
        # wait=: the shim is not there yet, then it is
        later: list = []
        sock = self.p("later")

        def start_later() -> None:
            time.sleep(0.5)
            later.append(subprocess.Popen([os.environ.get("SHIM_BIN", "sandbox-shim"), "--listen", "unix:" + sock,
                                           "--state-dir", self.p("later-state")], stderr=subprocess.DEVNULL))

        th = threading.Thread(target=start_later)
        th.start()
        try:
            with sandbox_shim.Shim.connect("unix:" + sock, wait=20) as s:
                self.assertGreater(s.ping(), 0)
        finally:
            th.join()
            for p in later:
                p.terminate()
                p.wait(10)

    def test_env_target_and_token(self) -> None:
        tokfile = self.p("token")
        with open(tokfile, "w") as h:
            h.write("s3cret\n")
        os.chmod(tokfile, 0o600)  # the shim refuses a token file others can read
        d = Daemon("--token-file", tokfile)
        try:
            with self.assertRaises(E.SandboxConnectionError):
                sandbox_shim.Shim.connect(d.target)
            with self.assertRaises(E.SandboxConnectionError):
                sandbox_shim.Shim.connect(d.target, token="wrong")
            with sandbox_shim.Shim.connect(d.target, token="s3cret") as s:
                self.assertGreater(s.ping(), 0)
            code = "import sandbox_shim\nwith sandbox_shim.Shim.connect() as s: print(s.eval('print(7*6)'), end='')"
            env = {**os.environ, "SBX_TARGET": d.target, "SBX_TOKEN": "s3cret",
                   "PYTHONPATH": os.path.join(os.path.dirname(HERE), "src")}
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(out.stdout, "42\n", out.stderr)
        finally:
            d.stop()

    def test_targets_tcp_and_exec(self) -> None:
        import re

        tokfile = self.p("tcp-token")
        with open(tokfile, "w") as h:
            h.write("tcp-secret\n")
        os.chmod(tokfile, 0o600)  # the shim refuses a token file others can read
        d = Daemon("--listen", "tcp:127.0.0.1:0", "--token-file", tokfile)
        try:
            port = re.search(r"listening on tcp:127\.0\.0\.1:(\d+)", d.read_log()).group(1)
            with sandbox_shim.Shim.connect(f"tcp:127.0.0.1:{port}", token="tcp-secret") as s:
                self.assertEqual(s.eval("print('over tcp')"), "over tcp\n")
            with self.assertRaises(E.SandboxConnectionError):
                sandbox_shim.Shim.connect(f"tcp:127.0.0.1:{port}", token="wrong")
        finally:
            d.stop()
        shim_bin = os.environ.get("SHIM_BIN", "sandbox-shim")
        with sandbox_shim.Shim.connect(f"exec:{shim_bin} --stdio --state-dir {self.p('stdio-state')}") as s:
            self.assertEqual(s.commands.run(["echo", "over stdio"]).stdout, "over stdio\n")
            self.assertNotEqual(s.server["pid"], self.daemon.proc.pid)

    def test_no_native_code(self) -> None:
        # the package is pure Python: importing it and making a call loads no shared
        # library and no ctypes, and a missing shim is a clean connection error
        code = ("import sys, sandbox_shim\n"
                "try:\n sandbox_shim.Shim.connect('unix:/nonexistent/shim.sock')\n"
                "except sandbox_shim.SandboxConnectionError as e: print('CE', e.errno_name)\n"
                "print('ctypes' in sys.modules, [m for m in sys.modules if 'sbx' in m.lower()])")
        env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(HERE), "src")}
        env.pop("SBX_LIBRARY", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout, "CE ENOENT\nFalse []\n", out.stderr)
        import sandbox_shim as pkg

        src = os.path.dirname(pkg.__file__)
        self.assertEqual(sorted(f for f in os.listdir(src) if not f.endswith((".py", ".typed")) and f != "__pycache__"), [])

    def test_info_ping_server(self) -> None:
        info = self.shim.info()
        self.assertEqual(info.protocol_version, 1)
        self.assertEqual(info.pid, self.daemon.proc.pid)
        self.assertIn("fs", info.features)
        self.assertGreaterEqual(info.connections, 1)
        srv = self.shim.server
        self.assertEqual(srv["pid"], self.daemon.proc.pid)
        self.assertTrue(self.shim.has_feature("exec"))
        self.assertFalse(self.shim.has_feature("no-such-feature"))
        self.assertGreater(self.shim.ping(), 0)
        self.assertEqual(srv.pid, self.daemon.proc.pid)
        self.assertEqual(srv.protocol_version, 1)
        self.assertEqual(srv.max_frame, 1 << 20)
        self.assertEqual(srv.initial_window, 256 << 10)
        self.assertIsInstance(srv, sandbox_shim.ServerInfo)
        with self.assertRaises(KeyError):
            srv["nope"]


if __name__ == "__main__":
    unittest.main()
