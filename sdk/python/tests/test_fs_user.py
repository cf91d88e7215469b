"""user=, group=, no_follow=, no_symlinks= on file operations (Request.fs, PROTOCOL.md 12.1.1),
sync and async, and the as_user() views, against a real daemon run as root: as nobody, root's
files are refused with the kernel's errno and stay as they were; what nobody writes is nobody's."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import unittest

from shimtest import Daemon, slurp

import sandbox_shim
from sandbox_shim import AsyncShim, SandboxInvalidArgumentError, SandboxPermissionError, _pb

NOBODY = 65534
SECRET = b"top secret\n"
PUB = b"public\n"


def need_root() -> None:
    if os.geteuid() != 0:
        raise unittest.SkipTest("needs root (the daemon acts as nobody for some calls)")


class World:
    """Root's files in a 0711 mktemp directory: a 0755 directory with a 0600 secret and a
    0644 file; a directory of nobody's."""

    def __init__(self) -> None:
        self.top = tempfile.mkdtemp(prefix="sbxpy-user-")
        os.chmod(self.top, 0o711)
        self.rootdir = os.path.join(self.top, "rootdir")
        os.mkdir(self.rootdir, 0o755)
        os.chmod(self.rootdir, 0o755)
        self.secret = os.path.join(self.rootdir, "secret")
        self.pub = os.path.join(self.rootdir, "pub")
        for path, data, mode in ((self.secret, SECRET, 0o600), (self.pub, PUB, 0o644)):
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
        self.mine = os.path.join(self.top, "mine")
        os.mkdir(self.mine)
        os.chown(self.mine, NOBODY, NOBODY)
        os.chmod(self.mine, 0o755)

    def unchanged(self, case: unittest.TestCase) -> None:
        for path, data, mode in ((self.secret, SECRET, 0o600), (self.pub, PUB, 0o644)):
            st = os.lstat(path)
            case.assertEqual(slurp(path), data, path)
            case.assertEqual(stat.S_IMODE(st.st_mode), mode, path)
            case.assertEqual((st.st_uid, st.st_gid), (0, 0), path)
        case.assertEqual(sorted(os.listdir(self.rootdir)), ["pub", "secret"])

    def remove(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)


class Sync(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        need_root()
        cls.daemon = Daemon()
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
        self.w = World()

    def tearDown(self) -> None:
        self.w.remove()

    def test_read_refused(self) -> None:
        f = self.shim.files
        with self.assertRaises(SandboxPermissionError) as cm:
            f.read_file(self.w.secret, user="nobody")
        self.assertEqual(cm.exception.errno_name, "EACCES")
        self.assertEqual(cm.exception.path, self.w.secret)
        with self.assertRaises(SandboxPermissionError):
            f.read_text(self.w.secret, user=NOBODY)
        with self.assertRaises(SandboxPermissionError):
            with f.open_read(self.w.secret, user="nobody") as it:
                list(it)
        self.assertEqual(f.read_file(self.w.pub, user="nobody"), PUB)
        # the shim itself still may, on the same connection
        self.assertEqual(f.read_file(self.w.secret), SECRET)
        self.assertEqual(f.read_file(self.w.secret, user="root"), SECRET)

    def test_write_refused(self) -> None:
        f = self.shim.files
        for kw in ({}, {"atomic": False}, {"append": True}):
            with self.assertRaises(SandboxPermissionError) as cm:
                f.write_file(self.w.pub, b"x", user="nobody", **kw)
            self.assertEqual(cm.exception.errno_name, "EACCES", kw)
        with self.assertRaises(SandboxPermissionError):
            f.write_file(os.path.join(self.w.rootdir, "new"), b"x", user="nobody")
        with self.assertRaises(SandboxPermissionError) as cm:
            f.chmod(self.w.secret, 0o777, user="nobody")
        self.assertEqual(cm.exception.errno_name, "EPERM")
        with self.assertRaises(SandboxPermissionError):
            f.delete(self.w.pub, user="nobody")
        with self.assertRaises(SandboxPermissionError):
            f.truncate(self.w.pub, 0, user="nobody")
        self.w.unchanged(self)

    def test_stat_and_owner(self) -> None:
        f = self.shim.files
        st = f.stat(self.w.secret, user="nobody")  # the directory is 0755: stat may
        self.assertEqual(st.uid, 0)
        p = os.path.join(self.w.mine, "f")
        st = f.write_file(p, "hello", user="nobody")
        self.assertEqual((st.uid, st.gid), (NOBODY, NOBODY))
        self.assertEqual(os.lstat(p).st_uid, NOBODY)
        self.assertEqual(slurp(p), b"hello")
        self.assertEqual(f.stat(p, user="nobody", group="root").uid, NOBODY)

    def test_view(self) -> None:
        nob = self.shim.files.as_user("nobody")
        self.assertIsNot(nob, self.shim.files)
        with self.assertRaises(SandboxPermissionError):
            nob.read_file(self.w.secret)
        self.assertEqual(nob.read_file(self.w.secret, user="root"), SECRET)  # the call's user wins
        st = nob.write_file(os.path.join(self.w.mine, "v"), b"v")
        self.assertEqual(st.uid, NOBODY)
        self.assertEqual(self.shim.files.read_file(self.w.secret), SECRET)  # the original is unbound
        # a view's flags reach the wire
        v = self.shim.files.as_user("nobody", group="nogroup", no_symlinks=True)
        fs = v._fs(None, None, True, False)
        self.assertEqual((fs.user, fs.group, fs.no_follow, fs.no_symlinks), ("nobody", "nogroup", True, True))
        fs = v._fs("root", None, False, False)
        self.assertEqual((fs.user, fs.group), ("root", None))
        self.assertIsNone(self.shim.files._fs(None, None, False, False))
        self.w.unchanged(self)

    def test_backup_refused(self) -> None:
        import io
        with self.assertRaises(SandboxPermissionError):
            self.shim.backups.backup(self.w.rootdir, io.BytesIO(), user="nobody")
        self.w.unchanged(self)

    def test_bad_arguments(self) -> None:
        f = self.shim.files
        with self.assertRaises(SandboxInvalidArgumentError) as cm:
            f.read_file(self.w.pub, user="nosuchuser_h2x")
        self.assertIn("unknown user nosuchuser_h2x", str(cm.exception))
        with self.assertRaises(SandboxInvalidArgumentError) as cm:
            f.stat(self.w.pub, user="nobody", group="nosuchgroup_h2x")
        self.assertIn("unknown group nosuchgroup_h2x", str(cm.exception))
        for bad in ("", "a:b", "a\0b", -1, 1 << 32):
            with self.assertRaises(ValueError, msg=repr(bad)):
                f.stat(self.w.pub, user=bad)  # type: ignore[arg-type]
        for bad in (True, 1.5, b"nobody"):
            with self.assertRaises(TypeError, msg=repr(bad)):
                f.stat(self.w.pub, user=bad)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            f.stat(self.w.pub, no_follow=1)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.shim.files.as_user(True)  # type: ignore[arg-type]
        # the connection is fine after all that
        self.assertEqual(f.read_file(self.w.pub), PUB)

    def test_wire(self) -> None:
        # no option: no fs field (the request is what it was); with one: the field
        from sandbox_shim import _ops
        self.assertIsNone(_ops.fs_options(None, None, False, False))
        fs = _ops.fs_options(65534, None, False, True)
        self.assertEqual(fs.encode(), _pb.FsOptions(user="65534", no_symlinks=True).encode())


class Async(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        need_root()
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    async def asyncSetUp(self) -> None:
        self.shim = await AsyncShim.connect(self.daemon.target)
        self.w = World()

    async def asyncTearDown(self) -> None:
        await self.shim.close()
        self.w.remove()

    async def test_twins(self) -> None:
        f = self.shim.files
        with self.assertRaises(SandboxPermissionError) as cm:
            await f.read_file(self.w.secret, user="nobody")
        self.assertEqual(cm.exception.errno_name, "EACCES")
        with self.assertRaises(SandboxPermissionError):
            await f.write_file(self.w.pub, b"x", user="nobody")
        with self.assertRaises(SandboxPermissionError):
            await f.chmod(self.w.secret, 0o644, user="nobody")
        st = await f.stat(self.w.secret, user="nobody")
        self.assertEqual(st.uid, 0)
        p = os.path.join(self.w.mine, "a")
        st = await f.write_file(p, b"async", user="nobody")
        self.assertEqual(st.uid, NOBODY)
        self.assertEqual(os.lstat(p).st_uid, NOBODY)
        nob = f.as_user("nobody")
        with self.assertRaises(SandboxPermissionError):
            await nob.read_file(self.w.secret)
        with self.assertRaises(SandboxPermissionError):
            async with nob.open_read(self.w.secret) as it:
                async for _ in it:
                    pass
        self.assertEqual(await nob.read_file(self.w.pub), PUB)
        self.assertEqual(await f.read_file(self.w.secret), SECRET)
        with self.assertRaises(SandboxInvalidArgumentError):
            await f.read_file(self.w.pub, user="nosuchuser_h2x")
        self.w.unchanged(self)


if __name__ == "__main__":
    unittest.main()
