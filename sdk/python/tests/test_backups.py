"""shim.backups: backup to a path or a file-like object, the record, restore."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import unittest

from shimtest import ShimCase, slurp

from sandbox_shim import SandboxError, SandboxFileNotFoundError


def make_tree(root: str) -> None:
    os.makedirs(os.path.join(root, "sub"))
    with open(os.path.join(root, "a.txt"), "wb") as f:
        f.write(b"alpha\n")
    with open(os.path.join(root, "sub", "b.bin"), "wb") as f:
        f.write(os.urandom(100000))
    with open(os.path.join(root, "skip.log"), "wb") as f:
        f.write(b"noise")
    os.symlink("a.txt", os.path.join(root, "link"))
    os.chmod(os.path.join(root, "a.txt"), 0o640)


def snapshot(root: str) -> dict:
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.islink(p):
                out[rel] = ("l", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("d", st.st_mode & 0o7777)
            else:
                out[rel] = ("f", st.st_mode & 0o7777, slurp(p))
    return out


class Backup(ShimCase):
    def test_to_file_like_streams_chunks_and_record(self) -> None:
        src = self.p("src")
        make_tree(src)

        class Sink(io.RawIOBase):
            def __init__(self) -> None:
                self.parts = []

            def writable(self) -> bool:
                return True

            def write(self, b) -> int:  # type: ignore[override]
                self.parts.append(bytes(b))
                return len(b)

        sink = Sink()
        progress = []
        rec = self.shim.backups.backup(src, sink, compression="none", excludes=["*.log"],
                                       progress=lambda b, e: progress.append((b, e)))
        data = b"".join(sink.parts)
        self.assertGreater(len(sink.parts), 1)  # handed over as it arrived
        self.assertEqual(rec["sha256"], hashlib.sha256(data).hexdigest())
        self.assertEqual(rec["bytes"], len(data))
        self.assertEqual(rec["compression"], "none")
        self.assertEqual(rec["dir"], src)
        self.assertIsInstance(rec["entries"], int)
        self.assertTrue(rec["id"])
        self.assertTrue(rec["created_at"].endswith("Z"))
        self.assertEqual(rec["skipped"], [])
        names = tarfile.open(fileobj=io.BytesIO(data)).getnames()
        self.assertIn("sub/b.bin", [n.lstrip("./") for n in names])
        self.assertFalse(any(n.endswith("skip.log") for n in names))

    def test_progress(self) -> None:
        src = self.p("src")
        os.mkdir(src)
        with open(os.path.join(src, "big"), "wb") as f:
            f.write(os.urandom(6 * 1024 * 1024))
        progress = []

        def slow(b: bytes) -> None:
            time.sleep(0.02)  # a slow consumer: the backup takes a while, progress events come

        class W:
            write = staticmethod(slow)

        self.shim.backups.backup(src, W(), compression="none", progress=lambda b, e: progress.append((b, e)))
        self.assertTrue(progress)
        self.assertTrue(all(isinstance(b, int) and isinstance(e, int) for b, e in progress))
        with self.assertRaises(TypeError):
            self.shim.backups.backup(src, io.BytesIO(), progress="yes")  # type: ignore[arg-type]

    def test_to_path_and_restore(self) -> None:
        src = self.p("src")
        make_tree(src)
        before = snapshot(src)
        archive = self.p("w.tar.zst")
        rec = self.shim.backups.backup(src, archive)
        self.assertEqual(rec["compression"], "zstd")
        self.assertEqual(hashlib.sha256(slurp(archive)).hexdigest(), rec["sha256"])
        # change the tree, then restore it from the local file
        os.unlink(os.path.join(src, "a.txt"))
        with open(os.path.join(src, "new"), "w") as f:
            f.write("x")
        res = self.shim.backups.restore(src, archive, sha256=rec["sha256"])
        self.assertEqual(res["sha256"], rec["sha256"])
        self.assertEqual(res["bytes"], rec["bytes"])
        self.assertEqual(snapshot(src), before)
        # from bytes and from a file-like object, into a new directory
        for source in (slurp(archive), io.BytesIO(slurp(archive))):
            dst = self.p("copy")
            self.shim.backups.restore(dst, source)
            self.assertEqual(snapshot(dst), before)
            self.shim.files.delete(dst, recursive=True)

    def test_gzip_and_in_sandbox(self) -> None:
        src = self.p("src")
        make_tree(src)
        buf = io.BytesIO()
        rec = self.shim.backups.backup(src, buf, compression="gzip")
        self.assertEqual(buf.getvalue()[:2], b"\x1f\x8b")
        self.assertEqual(rec["compression"], "gzip")
        rec = self.shim.backups.backup(src, sandbox_path=self.p("inside.tar.zst"))
        self.assertEqual(rec["to_path"], self.p("inside.tar.zst"))
        self.assertEqual(hashlib.sha256(slurp(self.p("inside.tar.zst"))).hexdigest(), rec["sha256"])
        self.shim.backups.restore(self.p("back"), sandbox_path=self.p("inside.tar.zst"))
        self.assertEqual(snapshot(self.p("back")), snapshot(src))

    def test_wrong_sha_leaves_dir(self) -> None:
        src = self.p("src")
        make_tree(src)
        data = io.BytesIO()
        self.shim.backups.backup(src, data)
        with open(os.path.join(src, "a.txt"), "w") as f:
            f.write("changed")
        before = snapshot(src)
        with self.assertRaises(SandboxError):
            self.shim.backups.restore(src, data.getvalue(), sha256="0" * 64)
        self.assertEqual(snapshot(src), before)
        with self.assertRaises(SandboxError):  # not an archive
            self.shim.backups.restore(src, b"this is not a tar stream" * 100)
        self.assertEqual(snapshot(src), before)

    def test_only_whole_archives(self) -> None:
        # a cut archive, one without its end blocks, and one without members are refused
        # with EBADMSG (in both modes) and leave the directory as it was
        dst = self.p("whole")
        os.mkdir(dst)
        with open(os.path.join(dst, "keep"), "wb") as f:
            f.write(b"old contents")
        src = self.p("src")
        os.mkdir(src)
        for n, size in (("a", 5000), ("b", 3000)):
            with open(os.path.join(src, n), "wb") as f:
                f.write(os.urandom(size))
        buf = io.BytesIO()
        self.shim.backups.backup(src, buf, compression="none")
        good = buf.getvalue()
        for name, bad in (("cut", good[:2100]), ("no end", good[:512]),
                          ("zeros", bytes(8704)), ("empty", bytes(1024))):
            for merge in (False, True):
                with self.subTest(name=name, merge=merge):
                    with self.assertRaises(SandboxError) as cm:
                        self.shim.backups.restore(dst, bad, merge=merge)
                    self.assertEqual(cm.exception.errno_name, "EBADMSG", cm.exception)
                    self.assertEqual(sorted(os.listdir(dst)), ["keep"])
                    self.assertEqual(slurp(os.path.join(dst, "keep")), b"old contents")
        # allow_empty: the empty archive makes an empty directory
        r = self.shim.backups.restore(dst, bytes(1024), allow_empty=True)
        self.assertEqual(r["entries"], 0)
        self.assertEqual(os.listdir(dst), [])
        with self.assertRaises(TypeError):
            self.shim.backups.restore(dst, bytes(1024), allow_empty="yes")  # type: ignore[arg-type]

    def test_errors_and_validation(self) -> None:
        b = self.shim.backups
        with self.assertRaises(SandboxFileNotFoundError):
            b.backup(self.p("missing"), io.BytesIO())
        with self.assertRaises(ValueError):
            b.backup(self.d, io.BytesIO(), compression="lz4")
        with self.assertRaises(TypeError):
            b.backup(self.d, io.BytesIO(), compression=1)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            b.backup(self.d, io.BytesIO(), excludes="*.log")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            b.backup(self.d, 42)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            b.backup(self.d)
        with self.assertRaises(ValueError):
            b.restore(self.d, b"", sha256="xyz")
        with self.assertRaises(TypeError):
            b.restore(self.d, 3.0)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            b.restore("relative", b"")

        class Boom(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b) -> int:  # type: ignore[override]
                raise OSError(28, "local disk full")

        with self.assertRaisesRegex(OSError, "local disk full"):
            b.backup(self.d, Boom())
        self.assertEqual(self.shim.files.read_directory(self.d), [])  # nothing left behind


if __name__ == "__main__":
    unittest.main()
