"""files: the file operations of a sandbox (``shim.files``)."""

from __future__ import annotations

import ctypes
import os
from typing import IO, Any, Callable, List, Optional, Union

from . import _lib
from ._core import CallScope, Core, PathLike, check_type, fspath
from ._lib import lib
from ._stream import CallbackStream, Stopped
from .types import DiskUsage, SandboxFileEntry, SandboxFileStat, WatchEvent

__all__ = ["Files"]

ECANCELED = 125
EIO = 5
WATCH_TYPES = {
    1: "create",
    2: "modify",
    3: "delete",
    4: "moved_from",
    5: "moved_to",
    6: "attrib",
    7: "overflow",
    8: "delete_self",
}
# sbx_read_file_alloc's cap when the caller gives none: larger than any file read whole
_READ_MAX = (1 << 63) - 1


def _mode(mode: Optional[int], name: str = "mode") -> int:
    if mode is None:
        return -1
    check_type(name, mode, int, "an int (e.g. 0o644)")
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"{name} must be between 0 and 0o7777, got {mode:#o}")
    return mode


def _chunks_of(data: Any, name: str = "data") -> Any:
    """What write_file accepts: str (UTF-8), bytes-like, or a readable file-like object."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if callable(getattr(data, "readinto", None)) or callable(getattr(data, "read", None)):
        return data
    raise TypeError(f"{name} must be str, bytes or a readable file-like object, not {type(data).__name__}")


class _Source:
    """A file-like object as an sbx_source_fn; a Python exception inside read()
    aborts the upload (the old file is kept) and is re-raised after the call."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.exc: Optional[BaseException] = None
        self.total = 0
        self.pending = b""  # text read() may return more bytes than asked for once encoded
        self.fn = _lib.SOURCE_FN(self._cb)

    def _cb(self, ud: int, buf: int, size: int) -> int:
        try:
            readinto = getattr(self.f, "readinto", None)
            if readinto is not None and not self.pending:
                view = (ctypes.c_char * size).from_address(buf)
                n = readinto(memoryview(view).cast("B"))
                if n is None:
                    n = 0
            else:
                data = self.pending or self.f.read(size)
                self.pending = b""
                if isinstance(data, str):
                    data = data.encode()
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise TypeError(f"read() returned {type(data).__name__}, not bytes")
                data = bytes(data)
                if len(data) > size:
                    data, self.pending = data[:size], data[size:]
                n = len(data)
                ctypes.memmove(buf, data, n)
            self.total += n
            return n
        except BaseException as e:
            self.exc = e
            ctypes.set_errno(ECANCELED)
            return -1


class _Sink:
    """A callable (or writable file-like object) as an sbx_sink_fn."""

    def __init__(self, write: Callable[[bytes], Any]) -> None:
        self.write = write
        self.exc: Optional[BaseException] = None
        self.fn = _lib.SINK_FN(self._cb)

    def _cb(self, ud: int, buf: int, size: int) -> int:
        try:
            self.write(ctypes.string_at(buf, size))
            return 0
        except BaseException as e:
            self.exc = e
            return ECANCELED


def _read(s: CallScope, p: bytes, offset: int, ln: int, write: Callable[[bytes], Any]) -> int:
    """sbx_read_file() of ``ln`` bytes (or TO_END) from ``offset`` in the call ``s``,
    each chunk passed to ``write``; returns the byte count. An exception raised by
    ``write`` is raised again here."""
    sink = _Sink(write)
    got = ctypes.c_uint64()
    if lib.sbx_read_file(s.handle, s.opts, p, offset, ln, sink.fn, None, ctypes.byref(got), s.err) < 0:
        if sink.exc is not None:
            raise sink.exc
        s.fail()
    return got.value


class Files:
    """File operations in the sandbox. Paths are absolute (str, bytes or PathLike);
    names may hold any bytes (str paths use os.fsencode/os.fsdecode). Every method
    takes ``timeout=`` (seconds) and ``abort=`` (a threading.Event) keywords."""

    def __init__(self, core: Core) -> None:
        self._core = core

    # ---- reading ----

    def read_file(
        self,
        path: PathLike,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> bytes:
        """The contents of a file (or ``length`` bytes from ``offset``) as bytes."""
        p = fspath(path)
        check_type("offset", offset, int, "an int")
        if offset < 0:
            raise ValueError("offset must not be negative")
        if length is not None:
            check_type("length", length, int, "an int or None")
            if length < 0:
                raise ValueError("length must not be negative")
        if offset == 0 and length is None:
            with self._core.call(timeout=timeout, abort=abort) as s:
                data = ctypes.c_void_p()
                n = ctypes.c_size_t()
                if lib.sbx_read_file_alloc(s.handle, s.opts, p, _READ_MAX, ctypes.byref(data), ctypes.byref(n), s.err) < 0:
                    s.fail()
                try:
                    return ctypes.string_at(data, n.value) if n.value else b""
                finally:
                    lib.libc.free(data)
        parts: List[bytes] = []
        self._read_into(p, offset, length, parts.append, timeout, abort)
        return b"".join(parts)

    def _read_into(
        self, p: bytes, offset: int, length: Optional[int], write: Callable[[bytes], Any], timeout: Any, abort: Any
    ) -> int:
        with self._core.call(timeout=timeout, abort=abort) as s:
            return _read(s, p, offset, _lib.TO_END if length is None else length, write)

    def read_text(self, path: PathLike, *, encoding: str = "utf-8", errors: str = "strict", **kw: Any) -> str:
        """read_file() decoded."""
        return self.read_file(path, **kw).decode(encoding, errors)

    def download(self, path: PathLike, dest: Union[PathLike, IO[bytes]], *, timeout: Optional[float] = None, abort: Any = None) -> int:
        """Stream a file to a local path or a writable file-like object; returns the
        byte count. A local path is written beside and renamed into place at the end."""
        p = fspath(path)
        if callable(getattr(dest, "write", None)):
            return self._read_into(p, 0, None, dest.write, timeout, abort)  # type: ignore[union-attr]
        local = os.fsdecode(os.fspath(dest))  # type: ignore[arg-type]
        tmp = f"{local}.part-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                n = self._read_into(p, 0, None, f.write, timeout, abort)
            os.replace(tmp, local)
            return n
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def open_read(
        self,
        path: PathLike,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> "CallbackStream[bytes]":
        """Stream a file: an iterator of bytes chunks, read as they arrive with bounded
        memory. Use it in a ``with`` block (or call ``close()``) to stop early."""
        p = fspath(path)
        check_type("offset", offset, int, "an int")
        if offset < 0 or (length is not None and length < 0):
            raise ValueError("offset and length must not be negative")
        ln = _lib.TO_END if length is None else length

        def run(s: CallScope, push: Callable[[bytes], None]) -> int:
            return _read(s, p, offset, ln, push)

        return CallbackStream(self._core, run, timeout=timeout, abort=abort)

    # ---- writing ----

    def write_file(
        self,
        path: PathLike,
        data: Union[str, bytes, bytearray, memoryview, IO[bytes]],
        *,
        mode: Optional[int] = None,
        append: bool = False,
        exclusive: bool = False,
        parents: bool = False,
        atomic: bool = True,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> SandboxFileStat:
        """Write ``data`` (str as UTF-8, bytes, or a readable file-like object streamed
        in chunks) to ``path``; returns the stat of the file written.

        By default the write is atomic: a failure, an abort or a lost connection
        leaves the old file as it was. ``append`` appends in place; ``exclusive``
        fails with SandboxFileExistsError if the path exists; ``parents`` creates
        missing directories; ``mode`` (e.g. 0o600) sets the permission bits (default:
        keep an existing file's, 0o644 for a new one)."""
        p = fspath(path)
        body = _chunks_of(data)
        m = _mode(mode)
        flags = 0
        for name, val, bit in (
            ("append", append, _lib.WRITE_APPEND),
            ("exclusive", exclusive, _lib.WRITE_EXCLUSIVE),
            ("parents", parents, _lib.WRITE_PARENTS),
        ):
            check_type(name, val, bool, "a bool")
            if val:
                flags |= bit
        check_type("atomic", atomic, bool, "a bool")
        if not atomic:
            flags |= _lib.WRITE_NO_ATOMIC
        st = _lib.SbxStat()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if isinstance(body, (bytes, bytearray, memoryview)):
                mv: Any = body
                if isinstance(mv, memoryview):
                    # a writable contiguous view is passed as it is; anything else is copied once
                    if mv.c_contiguous and not mv.readonly:
                        mv = mv.cast("B")
                    else:
                        mv = mv.tobytes()
                n = len(mv)
                buf: Any = mv if isinstance(mv, bytes) else (ctypes.c_char * n).from_buffer(mv) if n else b""
                rc = lib.sbx_write_file_buf(s.handle, s.opts, p, flags, m, buf, n, ctypes.byref(st), s.err)
                if rc < 0:
                    s.fail()
            else:
                src = _Source(body)
                if lib.sbx_write_file(s.handle, s.opts, p, flags, m, src.fn, None, ctypes.byref(st), s.err) < 0:
                    if src.exc is not None:
                        raise src.exc
                    s.fail()
        return SandboxFileStat._from_c(os.fsdecode(p), st)

    def upload(self, local: PathLike, path: PathLike, **kw: Any) -> SandboxFileStat:
        """write_file() from a local file, streamed."""
        with open(os.fspath(local), "rb") as f:
            return self.write_file(path, f, **kw)

    # ---- metadata ----

    def stat(self, path: PathLike, *, follow_symlinks: bool = True, timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        """Metadata of ``path`` (of a symlink's target unless follow_symlinks=False)."""
        p = fspath(path)
        check_type("follow_symlinks", follow_symlinks, bool, "a bool")
        st = _lib.SbxStat()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_stat(s.handle, s.opts, p, _lib.STAT_FOLLOW if follow_symlinks else 0, ctypes.byref(st), s.err) < 0:
                s.fail()
        return SandboxFileStat._from_c(os.fsdecode(p), st)

    def lstat(self, path: PathLike, **kw: Any) -> SandboxFileStat:
        """stat() of a symlink itself."""
        return self.stat(path, follow_symlinks=False, **kw)

    def exists(self, path: PathLike, *, timeout: Optional[float] = None, abort: Any = None) -> bool:
        """True if path exists (a dangling symlink exists)."""
        p = fspath(path)
        with self._core.call(timeout=timeout, abort=abort) as s:
            rc = lib.sbx_exists(s.handle, s.opts, p, s.err)
            if rc < 0:
                s.fail()
        return rc == 1

    def read_directory(
        self,
        path: PathLike,
        *,
        recursive: bool = False,
        depth: Optional[int] = None,
        hidden: bool = True,
        follow_symlinks: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> List[SandboxFileEntry]:
        """The entries of a directory with their metadata (in the order the
        shim reads them). ``recursive`` lists the whole tree (or ``depth`` levels);
        ``hidden=False`` leaves out names starting with '.'."""
        return list(
            self._list(path, recursive, depth, hidden, follow_symlinks, timeout, abort, stream=False)  # type: ignore[arg-type]
        )

    def iter_directory(self, path: PathLike, *, recursive: bool = False, depth: Optional[int] = None, hidden: bool = True,
                       follow_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> "CallbackStream[SandboxFileEntry]":
        """read_directory() as a stream, for huge directories (close it to stop early)."""
        return self._list(path, recursive, depth, hidden, follow_symlinks, timeout, abort, stream=True)  # type: ignore[return-value]

    def _list(self, path: PathLike, recursive: bool, depth: Optional[int], hidden: bool, follow: bool, timeout: Any, abort: Any, stream: bool) -> Any:
        p = fspath(path)
        check_type("recursive", recursive, bool, "a bool")
        check_type("hidden", hidden, bool, "a bool")
        check_type("follow_symlinks", follow, bool, "a bool")
        if depth is not None:
            check_type("depth", depth, int, "an int or None")
            if depth < 1:
                raise ValueError("depth must be at least 1")
            d = depth
        else:
            d = 0 if recursive else 1
        flags = (_lib.LIST_HIDDEN if hidden else 0) | (_lib.LIST_FOLLOW if follow else 0)
        base = os.fsdecode(p).rstrip("/") or ""

        def run(s: CallScope, push: Callable[[SandboxFileEntry], None]) -> None:
            exc: List[BaseException] = []

            def cb(ud: int, ent: Any) -> int:
                try:
                    e = ent.contents
                    name = os.fsdecode(ctypes.string_at(e.name, e.name_len))
                    full = f"{base}/{name}"
                    push(SandboxFileEntry(name=name, path=full, stat=SandboxFileStat._from_c(full, e.stat.contents)))
                    return 0
                except BaseException as x:
                    exc.append(x)
                    return ECANCELED

            fn = _lib.DIRENT_FN(cb)
            if lib.sbx_list(s.handle, s.opts, p, d, flags, fn, None, None, s.err) < 0:
                if exc:
                    raise exc[0]
                s.fail()

        if stream:
            return CallbackStream(self._core, run, timeout=timeout, abort=abort)
        out: List[SandboxFileEntry] = []
        with self._core.call(timeout=timeout, abort=abort) as s:
            run(s, out.append)
        return out

    # ---- changing things ----

    def _simple(self, fn: Callable[[CallScope], int], timeout: Any, abort: Any) -> None:
        with self._core.call(timeout=timeout, abort=abort) as s:
            if fn(s) < 0:
                s.fail()

    def mkdir(self, path: PathLike, *, parents: bool = False, mode: Optional[int] = None, exist_ok: bool = False,
              timeout: Optional[float] = None, abort: Any = None) -> None:
        """Create a directory (``parents``: with its missing parents; ``mode``:
        default 0o755). ``exist_ok`` ignores an existing directory."""
        p = fspath(path)
        check_type("parents", parents, bool, "a bool")
        check_type("exist_ok", exist_ok, bool, "a bool")
        m = _mode(mode)
        try:
            self._simple(lambda s: lib.sbx_mkdir(s.handle, s.opts, p, _lib.MKDIR_PARENTS if parents else 0, m, s.err), timeout, abort)
        except FileExistsError:
            if not exist_ok or not self.stat(path).is_dir:
                raise

    def delete(self, path: PathLike, *, recursive: bool = False, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Remove a file, a symlink, an empty directory, or (recursive) a whole tree."""
        p = fspath(path)
        check_type("recursive", recursive, bool, "a bool")
        self._simple(lambda s: lib.sbx_remove(s.handle, s.opts, p, _lib.REMOVE_RECURSIVE if recursive else 0, s.err), timeout, abort)

    remove = delete

    def rename(self, src: PathLike, dst: PathLike, *, overwrite: bool = True, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Move ``src`` to ``dst`` atomically (across file systems: copy, then remove).
        ``overwrite=False`` fails with SandboxFileExistsError if dst exists."""
        a, b = fspath(src, "src"), fspath(dst, "dst")
        check_type("overwrite", overwrite, bool, "a bool")
        self._simple(lambda s: lib.sbx_rename(s.handle, s.opts, a, b, 0 if overwrite else _lib.RENAME_NOREPLACE, s.err), timeout, abort)

    move = rename

    def copy(self, src: PathLike, dst: PathLike, *, recursive: bool = False, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Copy a file (or, recursive, a tree), keeping modes, times and symlinks."""
        a, b = fspath(src, "src"), fspath(dst, "dst")
        check_type("recursive", recursive, bool, "a bool")
        self._simple(lambda s: lib.sbx_copy(s.handle, s.opts, a, b, _lib.COPY_RECURSIVE if recursive else 0, s.err), timeout, abort)

    def chmod(self, path: PathLike, mode: int, *, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Set the permission bits (0 to 0o7777)."""
        p = fspath(path)
        if mode is None:
            raise TypeError("mode must be an int, not None")
        m = _mode(mode)
        self._simple(lambda s: lib.sbx_chmod(s.handle, s.opts, p, m, s.err), timeout, abort)

    def chown(self, path: PathLike, uid: Optional[int] = None, gid: Optional[int] = None, *, follow_symlinks: bool = True,
              timeout: Optional[float] = None, abort: Any = None) -> None:
        """Change the owner and/or group (None: leave unchanged)."""
        p = fspath(path)
        ids = []
        for name, v in (("uid", uid), ("gid", gid)):
            if v is None:
                ids.append(-1)
                continue
            check_type(name, v, int, "an int or None")
            if not 0 <= v < 2**32 - 1:
                raise ValueError(f"{name} out of range: {v}")
            ids.append(v)
        check_type("follow_symlinks", follow_symlinks, bool, "a bool")
        fl = 0 if follow_symlinks else _lib.CHOWN_NOFOLLOW
        self._simple(lambda s: lib.sbx_chown(s.handle, s.opts, p, ids[0], ids[1], fl, s.err), timeout, abort)

    def symlink(self, target: PathLike, link_path: PathLike, *, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Create ``link_path`` as a symlink to ``target`` (any text, relative allowed)."""
        t = fspath(target, "target", absolute=False)
        lp = fspath(link_path, "link_path")
        self._simple(lambda s: lib.sbx_symlink(s.handle, s.opts, t, lp, s.err), timeout, abort)

    def link(self, target: PathLike, link_path: PathLike, *, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Create a hard link."""
        t, lp = fspath(target, "target"), fspath(link_path, "link_path")
        self._simple(lambda s: lib.sbx_link(s.handle, s.opts, t, lp, s.err), timeout, abort)

    def _pathcall(self, fn: Any, path: PathLike, timeout: Any, abort: Any) -> str:
        p = fspath(path)
        buf = ctypes.create_string_buffer(4097)
        with self._core.call(timeout=timeout, abort=abort) as s:
            n = fn(s.handle, s.opts, p, buf, len(buf), s.err)
            if n < 0:
                s.fail()
        return os.fsdecode(buf.raw[:n])

    def readlink(self, path: PathLike, *, timeout: Optional[float] = None, abort: Any = None) -> str:
        """The target of a symlink."""
        return self._pathcall(lib.sbx_readlink, path, timeout, abort)

    def realpath(self, path: PathLike, *, timeout: Optional[float] = None, abort: Any = None) -> str:
        """The canonical absolute path (symlinks and .. resolved)."""
        return self._pathcall(lib.sbx_realpath, path, timeout, abort)

    def truncate(self, path: PathLike, size: int, *, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Cut or extend a file to ``size`` bytes."""
        p = fspath(path)
        check_type("size", size, int, "an int")
        if size < 0:
            raise ValueError("size must not be negative")
        self._simple(lambda s: lib.sbx_truncate(s.handle, s.opts, p, size, s.err), timeout, abort)

    def touch(self, path: PathLike, *, create: bool = True, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Set a file's times to now (creating it empty unless create=False)."""
        p = fspath(path)
        check_type("create", create, bool, "a bool")
        fl = 0 if create else _lib.TOUCH_NO_CREATE
        self._simple(lambda s: lib.sbx_set_times(s.handle, s.opts, p, None, None, fl, s.err), timeout, abort)

    def disk_usage(self, path: PathLike = "/", *, timeout: Optional[float] = None, abort: Any = None) -> DiskUsage:
        """statfs() of the file system holding ``path``."""
        p = fspath(path)
        sf = _lib.SbxStatfs()
        self._simple(lambda s: lib.sbx_statfs(s.handle, s.opts, p, ctypes.byref(sf), s.err), timeout, abort)
        bs = sf.block_size
        return DiskUsage(
            total=sf.blocks * bs,
            used=(sf.blocks - sf.blocks_free) * bs,
            free=sf.blocks_free * bs,
            available=sf.blocks_available * bs,
            block_size=bs,
            files=sf.files,
            files_free=sf.files_free,
            fs_type=sf.fs_type,
            read_only=bool(sf.flags & 1),
        )

    def watch(self, path: PathLike, *, recursive: bool = False, timeout: Optional[float] = None, abort: Any = None) -> "CallbackStream[WatchEvent]":
        """Stream changes below ``path`` as WatchEvent values until the iterator is
        closed, ``timeout`` passes (SandboxTimeoutError), ``abort`` is set
        (SandboxAbortError) or the path is deleted (the iterator ends)."""
        p = fspath(path)
        check_type("recursive", recursive, bool, "a bool")

        def run(s: CallScope, push: Callable[[WatchEvent], None]) -> None:
            exc: List[BaseException] = []

            def cb(ud: int, evp: Any) -> int:
                try:
                    ev = evp.contents
                    path_s = os.fsdecode(ctypes.string_at(ev.path, ev.path_len)) if ev.path else None
                    push(WatchEvent(WATCH_TYPES.get(ev.type, str(ev.type)), path_s, bool(ev.is_dir), ev.cookie))
                    return 0
                except Stopped:
                    return 1
                except BaseException as x:
                    exc.append(x)
                    return 1

            fn = _lib.WATCH_FN(cb)
            if lib.sbx_watch(s.handle, s.opts, p, _lib.WATCH_RECURSIVE if recursive else 0, fn, None, s.err) < 0:
                s.fail()
            if exc:
                raise exc[0]

        return CallbackStream(self._core, run, timeout=timeout, abort=abort)
