"""shim.files: every method against a real daemon, with exact bytes and metadata."""

from __future__ import annotations

import io
import os
import stat as pystat
import threading
import time
import unittest
from datetime import datetime, timezone

from shimtest import ShimCase, slurp, wait_until

from sandbox_shim import (
    SandboxError,
    SandboxFileExistsError,
    SandboxFileStat,
    SandboxPermissionError,
    SandboxTimeoutError,
)


class WriteRead(ShimCase):
    def test_bytes_roundtrip_exact(self) -> None:
        data = bytes(range(256)) * 1000 + b"\0\n\r"
        st = self.shim.files.write_file(self.p("bin"), data)
        self.assertIsInstance(st, SandboxFileStat)
        self.assertEqual(st.size, len(data))
        self.assertEqual(self.shim.files.read_file(self.p("bin")), data)
        with open(self.p("bin"), "rb") as f:
            self.assertEqual(f.read(), data)


    def test_big_bytes_write_is_linear(self) -> None:
        # a bytes body is sent from a view: a slice of bytes would copy the rest of it
        # for every frame (quadratic: 256 MiB took 85 s). The bytes path may not be much
        # slower than the same data from a file-like object, measured in the same run.
        import io
        import time

        data = os.urandom(1 << 20) * 96
        t0 = time.monotonic()
        self.shim.files.write_file(self.p("big-bytes"), data)
        t_bytes = time.monotonic() - t0
        t0 = time.monotonic()
        self.shim.files.write_file(self.p("big-file"), io.BytesIO(data))
        t_file = time.monotonic() - t0
        self.assertEqual(slurp(self.p("big-bytes")), data)
        self.assertLess(t_bytes, 3 * t_file + 1.0, (t_bytes, t_file))
    def test_str_is_utf8(self) -> None:
        self.shim.files.write_file(self.p("t"), "héllo ✓\n")
        with open(self.p("t"), "rb") as f:
            self.assertEqual(f.read(), "héllo ✓\n".encode())
        self.assertEqual(self.shim.files.read_text(self.p("t")), "héllo ✓\n")

    def test_bytearray_memoryview_and_empty(self) -> None:
        self.shim.files.write_file(self.p("a"), bytearray(b"abc"))
        self.shim.files.write_file(self.p("m"), memoryview(b"xyz123")[1:4])
        self.shim.files.write_file(self.p("e"), b"")
        strided = memoryview(b"a1b2c3")[::2]  # not contiguous: copied
        self.shim.files.write_file(self.p("s"), strided)
        self.assertEqual(self.shim.files.read_file(self.p("s")), b"abc")
        ba = bytearray(b"writable view")
        self.shim.files.write_file(self.p("w"), memoryview(ba)[9:])
        self.assertEqual(self.shim.files.read_file(self.p("w")), b"view")
        self.assertEqual(self.shim.files.read_file(self.p("a")), b"abc")
        self.assertEqual(self.shim.files.read_file(self.p("m")), b"yz1")
        self.assertEqual(self.shim.files.read_file(self.p("e")), b"")

    def test_file_like_streamed(self) -> None:
        data = os.urandom(3 * 1024 * 1024 + 17)
        src = io.BytesIO(data)
        st = self.shim.files.write_file(self.p("big"), src)
        self.assertEqual(st.size, len(data))
        self.assertEqual(self.shim.files.read_file(self.p("big")), data)

        class OnlyRead:  # read() without readinto(), returning small pieces
            def __init__(self) -> None:
                self.left = b"0123456789" * 1000

            def read(self, n: int) -> bytes:
                out, self.left = self.left[: min(n, 7)], self.left[min(n, 7) :]
                return out

        self.shim.files.write_file(self.p("small"), OnlyRead())
        self.assertEqual(self.shim.files.read_file(self.p("small")), b"0123456789" * 1000)
        text = "ünïcödé ✓ " * 50000  # a text stream: str chunks, more bytes than characters
        self.shim.files.write_file(self.p("text"), io.StringIO(text))
        self.assertEqual(self.shim.files.read_file(self.p("text")), text.encode())

    def test_upload_download(self) -> None:
        local = os.path.join(self.d, "local.bin")
        data = os.urandom(200000)
        with open(local, "wb") as f:
            f.write(data)
        self.shim.files.upload(local, self.p("up"))
        back = os.path.join(self.d, "back.bin")
        self.assertEqual(self.shim.files.download(self.p("up"), back), len(data))
        with open(back, "rb") as f:
            self.assertEqual(f.read(), data)
        sink = io.BytesIO()
        self.shim.files.download(self.p("up"), sink)
        self.assertEqual(sink.getvalue(), data)

    def test_failing_source_keeps_old_file(self) -> None:
        self.shim.files.write_file(self.p("keep"), b"old contents")

        class Broken:
            n = 0

            def read(self, size: int) -> bytes:
                self.n += 1
                if self.n > 3:
                    raise RuntimeError("disk on fire")
                return b"x" * size

        with self.assertRaisesRegex(RuntimeError, "disk on fire"):
            self.shim.files.write_file(self.p("keep"), Broken())
        self.assertEqual(self.shim.files.read_file(self.p("keep")), b"old contents")
        # no temp file left (dropped when the CANCEL reaches the shim, just after the call)
        self.assertTrue(wait_until(lambda: sorted(os.listdir(self.d)) == ["keep"]), os.listdir(self.d))

    def test_flags(self) -> None:
        f = self.shim.files
        f.write_file(self.p("m"), b"x", mode=0o600)
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("m")).st_mode), 0o600)
        self.assertEqual(f.stat(self.p("m")).mode, 0o600)
        f.write_file(self.p("m"), b"y")  # mode kept
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("m")).st_mode), 0o600)
        f.write_file(self.p("m"), b"z", append=True)
        self.assertEqual(f.read_file(self.p("m")), b"yz")
        with self.assertRaises(SandboxFileExistsError) as cm:
            f.write_file(self.p("m"), b"new", exclusive=True)
        self.assertEqual(cm.exception.errno_name, "EEXIST")
        self.assertEqual(f.read_file(self.p("m")), b"yz")
        with self.assertRaises(FileNotFoundError):
            f.write_file(self.p("no", "such", "f"), b"1")
        f.write_file(self.p("no", "such", "f"), b"1", parents=True)
        self.assertEqual(f.read_file(self.p("no", "such", "f")), b"1")
        f.write_file(self.p("inplace"), b"abc", atomic=False)
        self.assertEqual(f.read_file(self.p("inplace")), b"abc")

    def test_offset_length(self) -> None:
        self.shim.files.write_file(self.p("r"), b"0123456789")
        self.assertEqual(self.shim.files.read_file(self.p("r"), offset=3, length=4), b"3456")
        self.assertEqual(self.shim.files.read_file(self.p("r"), offset=8), b"89")
        self.assertEqual(self.shim.files.read_file(self.p("r"), offset=20), b"")

    def test_open_read_streams_chunks(self) -> None:
        data = os.urandom(5 * 1024 * 1024)
        with open(self.p("s"), "wb") as f:
            f.write(data)
        chunks = []
        with self.shim.files.open_read(self.p("s")) as it:
            for c in it:
                self.assertIsInstance(c, bytes)
                chunks.append(c)
        self.assertGreater(len(chunks), 1)
        self.assertEqual(b"".join(chunks), data)
        # stop early: the call ends, the connection stays usable
        it = self.shim.files.open_read(self.p("s"))
        first = next(iter(it))
        it.close()
        self.assertTrue(data.startswith(first))
        self.assertEqual(self.shim.files.read_file(self.p("s"), length=5), data[:5])
        with self.assertRaises(FileNotFoundError):
            list(self.shim.files.open_read(self.p("missing")))


class Metadata(ShimCase):
    def test_stat_fields(self) -> None:
        with open(self.p("f"), "wb") as f:
            f.write(b"12345")
        os.chmod(self.p("f"), 0o640)
        os.utime(self.p("f"), ns=(1_600_000_000_123_456_789, 1_700_000_000_987_654_321))
        st = self.shim.files.stat(self.p("f"))
        real = os.stat(self.p("f"))
        self.assertEqual(st.type, "file")
        self.assertIsInstance(st.size, int)
        self.assertEqual(st.size, 5)
        self.assertEqual(st.mode, 0o640)
        self.assertEqual((st.uid, st.gid, st.nlink, st.inode), (real.st_uid, real.st_gid, 1, real.st_ino))
        self.assertEqual(st.mtime_ns, 1_700_000_000_987_654_321)
        self.assertEqual(st.atime_ns, 1_600_000_000_123_456_789)
        self.assertEqual(st.mtime, datetime(2023, 11, 14, 22, 13, 20, 987654, tzinfo=timezone.utc))
        self.assertEqual(st.mtime.tzinfo, timezone.utc)
        self.assertEqual(st.path, self.p("f"))

    def test_types(self) -> None:
        f = self.shim.files
        os.mkdir(self.p("dir"))
        os.symlink("dir", self.p("link"))
        os.mkfifo(self.p("fifo"))
        self.assertEqual(f.stat(self.p("dir")).type, "directory")
        self.assertEqual(f.lstat(self.p("link")).type, "symlink")
        self.assertEqual(f.lstat(self.p("link")).link_target, "dir")
        self.assertEqual(f.stat(self.p("link")).type, "directory")
        self.assertEqual(f.stat(self.p("link"), follow_symlinks=False).type, "symlink")
        self.assertEqual(f.stat(self.p("fifo")).type, "fifo")
        self.assertEqual(f.stat(self.daemon.sock).type, "socket")
        null = f.stat("/dev/null")
        self.assertEqual(null.type, "character_device")
        self.assertEqual(null.rdev, os.stat("/dev/null").st_rdev)
        blocks = [os.path.join("/dev", n) for n in sorted(os.listdir("/dev"))
                  if pystat.S_ISBLK(os.lstat(os.path.join("/dev", n)).st_mode)]
        if blocks:
            self.assertEqual(f.stat(blocks[0]).type, "block_device")

    def test_exists(self) -> None:
        os.symlink(self.p("nowhere"), self.p("dangling"))
        self.assertTrue(self.shim.files.exists(self.d))
        self.assertTrue(self.shim.files.exists(self.p("dangling")))
        self.assertFalse(self.shim.files.exists(self.p("nope")))
        self.assertFalse(self.shim.files.exists(self.p("nope", "deeper")))

    def test_read_directory(self) -> None:
        for n, body in (("a", b"1"), ("b b", b"22"), ("new\nline", b"333"), (".hidden", b"4444")):
            with open(self.p(n), "wb") as f:
                f.write(body)
        os.makedirs(self.p("sub", "deep"))
        with open(self.p("sub", "deep", "x"), "wb") as f:
            f.write(b"xxxxx")
        os.symlink("a", self.p("ln"))
        entries = self.shim.files.read_directory(self.d)
        by = {e.name: e for e in entries}
        self.assertEqual(set(by), {"a", "b b", "new\nline", ".hidden", "sub", "ln"})
        self.assertEqual(by["new\nline"].size, 3)
        self.assertEqual(by["b b"].stat.size, 2)
        self.assertTrue(by["sub"].is_dir)
        self.assertTrue(by["ln"].is_symlink)
        self.assertEqual(by["ln"].stat.link_target, "a")
        self.assertEqual(by["a"].path, self.p("a"))
        self.assertEqual(by["a"].mtime, self.shim.files.stat(self.p("a")).mtime)
        visible = {e.name for e in self.shim.files.read_directory(self.d, hidden=False)}
        self.assertNotIn(".hidden", visible)
        rec = {e.name for e in self.shim.files.read_directory(self.d, recursive=True)}
        self.assertIn("sub/deep/x", rec)
        self.assertIn("sub/deep", rec)
        two = {e.name for e in self.shim.files.read_directory(self.d, depth=2)}
        self.assertIn("sub/deep", two)
        self.assertNotIn("sub/deep/x", two)
        streamed = {e.name for e in self.shim.files.iter_directory(self.d)}
        self.assertEqual(streamed, set(by))
        with self.assertRaises(NotADirectoryError):
            self.shim.files.read_directory(self.p("a"))

    def test_read_directory_big(self) -> None:
        os.mkdir(self.p("many"))
        for i in range(3000):
            open(self.p("many", f"f{i:05d}"), "wb").close()
        names = [e.name for e in self.shim.files.read_directory(self.p("many"))]
        self.assertEqual(sorted(names), [f"f{i:05d}" for i in range(3000)])

    def test_disk_usage(self) -> None:
        du = self.shim.files.disk_usage(self.d)
        sv = os.statvfs(self.d)
        self.assertEqual(du.total, sv.f_blocks * sv.f_frsize)
        self.assertGreater(du.total, 0)
        self.assertFalse(du.read_only)


class Changes(ShimCase):
    def test_mkdir(self) -> None:
        f = self.shim.files
        f.mkdir(self.p("d"))
        self.assertTrue(os.path.isdir(self.p("d")))
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("d")).st_mode), 0o755)
        with self.assertRaises(FileExistsError):
            f.mkdir(self.p("d"))
        f.mkdir(self.p("d"), exist_ok=True)
        with self.assertRaises(FileNotFoundError):
            f.mkdir(self.p("x", "y"))
        f.mkdir(self.p("x", "y"), parents=True, mode=0o700)
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("x", "y")).st_mode), 0o700)

    def test_delete(self) -> None:
        f = self.shim.files
        os.makedirs(self.p("t", "u"))
        open(self.p("t", "u", "f"), "w").close()
        open(self.p("file"), "w").close()
        f.delete(self.p("file"))
        self.assertFalse(os.path.exists(self.p("file")))
        with self.assertRaises(SandboxError) as cm:
            f.delete(self.p("t"))
        self.assertEqual(cm.exception.errno_name, "ENOTEMPTY")
        self.assertTrue(os.path.exists(self.p("t", "u", "f")))
        f.delete(self.p("t"), recursive=True)
        self.assertFalse(os.path.exists(self.p("t")))
        with self.assertRaises(FileNotFoundError):
            f.delete(self.p("t"))

    def test_rename(self) -> None:
        f = self.shim.files
        with open(self.p("a"), "w") as h:
            h.write("A")
        with open(self.p("b"), "w") as h:
            h.write("B")
        with self.assertRaises(FileExistsError):
            f.rename(self.p("a"), self.p("b"), overwrite=False)
        self.assertEqual(slurp(self.p("b")).decode(), "B")
        f.rename(self.p("a"), self.p("b"))
        self.assertEqual(slurp(self.p("b")).decode(), "A")
        self.assertFalse(os.path.exists(self.p("a")))
        f.move(self.p("b"), self.p("c"))
        self.assertEqual(slurp(self.p("c")).decode(), "A")

    def test_copy(self) -> None:
        f = self.shim.files
        os.makedirs(self.p("src", "in"))
        with open(self.p("src", "in", "f"), "wb") as h:
            h.write(b"data")
        os.chmod(self.p("src", "in", "f"), 0o604)
        os.symlink("in/f", self.p("src", "l"))
        f.copy(self.p("src", "in", "f"), self.p("one"))
        self.assertEqual(slurp(self.p("one")), b"data")
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("one")).st_mode), 0o604)
        with self.assertRaises(IsADirectoryError):
            f.copy(self.p("src"), self.p("dst"))
        f.copy(self.p("src"), self.p("dst"), recursive=True)
        self.assertEqual(slurp(self.p("dst", "in", "f")), b"data")
        self.assertEqual(os.readlink(self.p("dst", "l")), "in/f")

    def test_chmod_chown(self) -> None:
        f = self.shim.files
        open(self.p("f"), "w").close()
        f.chmod(self.p("f"), 0o4751)
        self.assertEqual(pystat.S_IMODE(os.stat(self.p("f")).st_mode), 0o4751)
        if os.geteuid() == 0:
            f.chown(self.p("f"), 65534, 65534)
            st = os.stat(self.p("f"))
            self.assertEqual((st.st_uid, st.st_gid), (65534, 65534))
            f.chown(self.p("f"), gid=0)
            st = os.stat(self.p("f"))
            self.assertEqual((st.st_uid, st.st_gid), (65534, 0))

    def test_symlink_readlink_realpath(self) -> None:
        f = self.shim.files
        os.mkdir(self.p("real"))
        f.symlink("real", self.p("l"))
        self.assertEqual(os.readlink(self.p("l")), "real")
        self.assertEqual(f.readlink(self.p("l")), "real")
        self.assertEqual(f.realpath(self.p("l")), os.path.realpath(self.p("real")))
        with self.assertRaises(FileExistsError):
            f.symlink("x", self.p("l"))
        with self.assertRaises(SandboxError) as cm:
            f.readlink(self.p("real"))
        self.assertEqual(cm.exception.errno_name, "EINVAL")

    def test_truncate_touch(self) -> None:
        f = self.shim.files
        with open(self.p("t"), "wb") as h:
            h.write(b"0123456789")
        f.truncate(self.p("t"), 4)
        self.assertEqual(slurp(self.p("t")), b"0123")
        f.truncate(self.p("t"), 6)
        self.assertEqual(slurp(self.p("t")), b"0123\0\0")
        f.touch(self.p("new"))
        self.assertEqual(os.path.getsize(self.p("new")), 0)
        with self.assertRaises(FileNotFoundError):
            f.touch(self.p("nope"), create=False)

    def test_hard_link(self) -> None:
        open(self.p("a"), "w").close()
        self.shim.files.link(self.p("a"), self.p("b"))
        self.assertEqual(os.stat(self.p("a")).st_ino, os.stat(self.p("b")).st_ino)


class SpecialFiles(ShimCase):
    """FIFOs, sockets and devices: refused (EPERM naming the type) unless allow_special."""

    def test_fifo_refused_then_allowed(self) -> None:
        f = self.shim.files
        fifo = self.p("fifo")
        os.mkfifo(fifo, 0o644)
        before = os.lstat(fifo)
        t0 = time.monotonic()
        for call in (lambda: f.read_file(fifo),
                     lambda: f.write_file(fifo, b"planted"),
                     lambda: f.write_file(fifo, b"planted", atomic=False),
                     lambda: f.write_file(fifo, b"planted", append=True),
                     lambda: f.truncate(fifo, 0)):
            with self.assertRaises(SandboxPermissionError) as cm:
                call()
            self.assertEqual(cm.exception.errno_name, "EPERM")
            self.assertIn("a FIFO, not a regular file", str(cm.exception))
            self.assertIn("allow_special", str(cm.exception))
        self.assertLess(time.monotonic() - t0, 5.0)
        after = os.lstat(fifo)
        self.assertTrue(pystat.S_ISFIFO(after.st_mode))
        self.assertEqual((after.st_ino, after.st_mode), (before.st_ino, before.st_mode))
        self.assertEqual([n for n in os.listdir(self.d) if n.startswith(".")], [])

        def writer() -> None:
            with open(fifo, "wb") as w:
                w.write(b"hello")

        t = threading.Thread(target=writer)
        t.start()
        self.assertEqual(f.read_file(fifo, allow_special=True), b"hello")
        t.join()

        got = []

        def reader() -> None:
            with open(fifo, "rb") as r:
                got.append(r.read())

        t = threading.Thread(target=reader)
        t.start()
        data = os.urandom(200000)  # more than a pipe holds
        f.write_file(fifo, data, allow_special=True)
        t.join()
        self.assertEqual(got, [data])
        # truncate with allow_special: no reader, the non-blocking open says ENXIO
        with self.assertRaises(SandboxError) as cm:
            f.truncate(fifo, 0, allow_special=True)
        self.assertEqual(cm.exception.errno_name, "ENXIO")

    def test_devices(self) -> None:
        f = self.shim.files
        with self.assertRaises(SandboxPermissionError) as cm:
            f.read_file("/dev/zero", length=16)
        self.assertIn("a character device", str(cm.exception))
        self.assertEqual(f.read_file("/dev/zero", length=1 << 20, allow_special=True), bytes(1 << 20))
        chunks = list(f.open_read("/dev/urandom", length=4096, allow_special=True))
        self.assertEqual(sum(len(c) for c in chunks), 4096)
        with self.assertRaises(TypeError):
            f.read_file("/dev/zero", length=1, allow_special=1)  # type: ignore[arg-type]


class Watch(ShimCase):
    def test_events(self) -> None:
        events = []
        ready = threading.Event()

        def act() -> None:
            ready.wait(5)
            time.sleep(0.2)
            with open(self.p("new.txt"), "wb") as h:
                h.write(b"x")
            os.rename(self.p("new.txt"), self.p("moved.txt"))
            os.unlink(self.p("moved.txt"))

        t = threading.Thread(target=act)
        t.start()
        with self.shim.files.watch(self.d, timeout=10) as w:
            ready.set()
            for ev in w:
                events.append(ev)
                if ev.type == "delete":
                    break
        t.join()
        kinds = [(e.type, os.path.basename(e.path or "")) for e in events]
        self.assertIn(("create", "new.txt"), kinds)
        self.assertIn(("moved_from", "new.txt"), kinds)
        self.assertIn(("moved_to", "moved.txt"), kinds)
        self.assertIn(("delete", "moved.txt"), kinds)
        mf = [e for e in events if e.type == "moved_from"][0]
        mt = [e for e in events if e.type == "moved_to"][0]
        self.assertEqual(mf.cookie, mt.cookie)
        self.assertEqual(mt.path, self.p("moved.txt"))

    def test_timeout_and_delete_self(self) -> None:
        with self.assertRaises(SandboxTimeoutError):
            for _ in self.shim.files.watch(self.d, timeout=0.3):
                pass
        os.mkdir(self.p("gone"))
        w = self.shim.files.watch(self.p("gone"), timeout=10)
        time.sleep(0.2)
        os.rmdir(self.p("gone"))
        types = [e.type for e in w]  # ends by itself
        self.assertEqual(types[-1], "delete_self")


class Validation(ShimCase):
    def test_values_and_types(self) -> None:
        f = self.shim.files
        with self.assertRaises(ValueError):
            f.read_file("relative/path")
        with self.assertRaises(ValueError):
            f.read_file("")
        with self.assertRaises(ValueError):
            f.read_file("/a\0b")
        with self.assertRaises(TypeError):
            f.read_file(42)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            f.write_file(self.p("x"), 42)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            f.write_file(self.p("x"), b"", mode=0o10000)
        with self.assertRaises(TypeError):
            f.write_file(self.p("x"), b"", mode="644")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            f.write_file(self.p("x"), b"", append="yes")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            f.truncate(self.p("x"), -1)
        with self.assertRaises(ValueError):
            f.read_file(self.p("x"), offset=-1)
        with self.assertRaises(ValueError):
            f.read_directory(self.d, depth=0)
        with self.assertRaises(ValueError):
            f.stat(self.p("x"), timeout=-1)
        with self.assertRaises(TypeError):
            f.stat(self.p("x"), timeout="1")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            f.stat(self.p("x"), abort="now")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            f.chown(self.p("x"), -5)
        self.assertFalse(os.path.exists(self.p("x")))

    def test_bytes_and_pathlike(self) -> None:
        import pathlib

        weird = os.fsencode(self.d) + b"/\xff\xfe name"
        self.shim.files.write_file(weird, b"raw")
        with open(weird, "rb") as h:
            self.assertEqual(h.read(), b"raw")
        names = [e.name for e in self.shim.files.read_directory(self.d)]
        self.assertEqual(names, [os.fsdecode(b"\xff\xfe name")])
        self.assertEqual(self.shim.files.read_file(pathlib.Path(os.fsdecode(weird))), b"raw")


if __name__ == "__main__":
    unittest.main()
