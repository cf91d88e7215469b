"""files: the file operations of a sandbox (``shim.files``)."""

from __future__ import annotations

import copy
import os
from typing import IO, Any, Callable, Generic, Iterator, List, Optional, TypeVar, Union

from . import _ops
from ._core import PathLike, check_abort, seconds
from ._ops import UserSpec
from ._protocol import Data
from ._sync import Call, Engine
from .types import DiskUsage, SandboxFileEntry, SandboxFileStat, WatchEvent

__all__ = ["Files", "Stream"]

T = TypeVar("T")
WRITE_CHUNK = 256 << 10
Sink = Callable[[bytes], Any]


class Stream(Generic[T]):
    """An iterator over what a streamed call sends (file chunks, directory entries,
    watch events), read as it arrives with bounded memory. Use it in a ``with`` block
    (or call ``close()``) to stop early: the call is then cancelled in the shim."""

    def __init__(self, call: Call, convert: Callable[[bytes], List[T]], finish: Optional[Callable[[], None]] = None,
                 end_ok: Optional[Callable[[BaseException], bool]] = None,
                 finish_fin: Optional[Callable[[bool], None]] = None) -> None:
        self._call = call
        self._convert = convert
        self._finish = finish
        self._finish_fin = finish_fin
        self._fin = False
        self._pending: List[T] = []
        self._done = False
        self._end_ok = end_ok
        self.result: Any = None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while not self._pending:
            if self._done:
                raise StopIteration
            try:
                it = self._call.next()
            except BaseException as e:
                self._done = True
                if self._end_ok is not None and self._end_ok(e):
                    raise StopIteration from None
                raise
            if it is None:
                self._done = True
                self.result = self._call.result
                if self._finish is not None:
                    self._finish()
                if self._finish_fin is not None:
                    self._finish_fin(self._fin)
                raise StopIteration
            if type(it) is Data:
                self._fin = self._fin or it.fin
                if it.data:
                    self._pending = self._convert(it.data)
                    self._pending.reverse()
        return self._pending.pop()

    def close(self) -> None:
        """Stop early (the call is cancelled in the shim). Safe to call twice."""
        if not self._done:
            self._done = True
            self._call.close()

    def __enter__(self) -> "Stream[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # dropped without close(): the call is cancelled, without waiting for a lock
        try:
            if not self._done:
                self._done = True
                self._call.engine.drop(self._call)
        except Exception:
            pass


def read_into(call: Call, write: Sink) -> int:
    """Pass the DATA of a read call to write(); returns the byte count, checked against
    the END. An exception from write() gives the call up (CANCEL) and propagates."""
    n = 0
    fin = False
    while True:
        it = call.next()
        if it is None:
            assert call.result is not None
            return _ops.check_read_end(call.result, n, fin)
        if type(it) is Data:
            fin = fin or it.fin
            if it.data:
                try:
                    write(it.data)
                except BaseException:
                    call.close()
                    raise
                n += len(it.data)


def send_body(call: Call, body: Any, chunk: int = WRITE_CHUNK) -> None:
    """Send a bytes-like body or a file-like object's contents, then FIN. An exception
    from the file-like object gives the call up (the shim discards what it got)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        call.write(body, fin=True)
        return
    reader = _ops.Reader(body, chunk)
    while True:
        try:
            b = reader.chunk()
        except BaseException:
            call.close()
            raise
        if not b:
            call.finish()
            return
        call.write(b)


class Files:
    """File operations in the sandbox. Paths are absolute (str, bytes or PathLike);
    names may hold any bytes (str paths use os.fsencode/os.fsdecode). Every method
    takes ``timeout=`` (seconds) and ``abort=`` (a threading.Event) keywords, and
    ``user=``, ``group=``, ``no_follow=``, ``no_symlinks=`` (PROTOCOL.md 12.1.1):
    ``user`` (a name or a number) makes the shim act as that user, with its groups
    (``group``: another primary group), so that the sandbox's permission checks apply
    (SandboxPermissionError, EACCES or EPERM, where that user may not); ``no_follow``
    refuses a symlink as the path's last component, ``no_symlinks`` anywhere in it
    (ELOOP). as_user() binds them for every call of a view."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine
        self._fsd: Any = None  # as_user()'s defaults (a _pb.FsOptions)

    def as_user(self, user: UserSpec = None, *, group: UserSpec = None, no_follow: bool = False,
                no_symlinks: bool = False) -> "Files":
        """A view of these file operations whose calls act as ``user`` (and ``group``),
        and resolve with ``no_follow``/``no_symlinks``, unless a call says otherwise:
        ``shim.files.as_user("nobody").read_file(p)``. A call's own ``user=`` replaces
        the view's user and group; its flags add to the view's."""
        v = copy.copy(self)
        v._fsd = _ops.fs_options(user, group, no_follow, no_symlinks, self._fsd)
        return v

    def _fs(self, user: UserSpec, group: UserSpec, no_follow: bool, no_symlinks: bool) -> Any:
        return _ops.fs_options(user, group, no_follow, no_symlinks, self._fsd)

    def _open(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None, extra_window: int = 0) -> Call:
        check_abort(abort)
        if fs is not None:
            req.fs = fs
        return self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra_window)

    def _read(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None) -> Call:
        return self._open(req, timeout, abort, fs, _ops.READ_EXTRA_WINDOW)

    def _do(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None) -> Any:
        return self._open(req, timeout, abort, fs).wait_end()

    # ---- reading ----

    def read_file(self, path: PathLike, *, offset: int = 0, length: Optional[int] = None, allow_special: bool = False,
                  user: UserSpec = None, group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                  timeout: Optional[float] = None, abort: Any = None) -> bytes:
        """The contents of a file (or ``length`` bytes from ``offset``) as bytes. A FIFO,
        socket or device is read only with ``allow_special`` (else SandboxPermissionError,
        EPERM, naming its type)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        call = self._read(_ops.read_req(path, offset, length, allow_special), timeout, abort, fs)
        parts: List[bytes] = []
        read_into(call, parts.append)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_text(self, path: PathLike, *, encoding: str = "utf-8", errors: str = "strict", offset: int = 0,
                  length: Optional[int] = None, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                  no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> str:
        """read_file() decoded."""
        return self.read_file(path, offset=offset, length=length, user=user, group=group, no_follow=no_follow,
                              no_symlinks=no_symlinks, timeout=timeout, abort=abort).decode(encoding, errors)

    def download(self, path: PathLike, dest: Union[PathLike, IO[bytes]], *, user: UserSpec = None,
                 group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                 timeout: Optional[float] = None, abort: Any = None) -> int:
        """Stream a file to a local path or a writable file-like object; returns the
        byte count. A local path is written beside and renamed into place at the end."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.read_req(path, 0, None)
        if callable(getattr(dest, "write", None)):
            return read_into(self._read(req, timeout, abort, fs), dest.write)  # type: ignore[union-attr]
        local = os.fsdecode(os.fspath(dest))  # type: ignore[arg-type]
        tmp = f"{local}.part-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                n = read_into(self._read(req, timeout, abort, fs), f.write)
            os.replace(tmp, local)
            return n
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def open_read(self, path: PathLike, *, offset: int = 0, length: Optional[int] = None, allow_special: bool = False,
                  user: UserSpec = None, group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                  timeout: Optional[float] = None, abort: Any = None) -> "Stream[bytes]":
        """Stream a file: an iterator of bytes chunks, read as they arrive with bounded
        memory. Use it in a ``with`` block (or call ``close()``) to stop early."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        call = self._read(_ops.read_req(path, offset, length, allow_special), timeout, abort, fs)
        got = [0, False]

        def count(b: bytes) -> List[bytes]:
            got[0] += len(b)
            return [b]

        def end(fin: bool) -> None:
            assert call.result is not None
            _ops.check_read_end(call.result, got[0], fin)

        return Stream(call, count, finish_fin=end)

    # ---- writing ----

    def write_file(self, path: PathLike, data: Union[str, bytes, bytearray, memoryview, IO[bytes]], *,
                   mode: Optional[int] = None, append: bool = False, exclusive: bool = False, parents: bool = False,
                   atomic: bool = True, allow_special: bool = False, user: UserSpec = None, group: UserSpec = None,
                   no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                   abort: Any = None) -> SandboxFileStat:
        """Write ``data`` (str as UTF-8, bytes, or a readable file-like object streamed
        in chunks) to ``path``; returns the stat of the file written.

        By default the write is atomic: a failure, an abort or a lost connection
        leaves the old file as it was. ``append`` appends in place; ``exclusive``
        fails with SandboxFileExistsError if the path exists; ``parents`` creates
        missing directories; ``mode`` (e.g. 0o600) sets the permission bits (default:
        keep an existing file's, 0o644 for a new one). A FIFO, socket or device is
        written into only with ``allow_special``."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        p, req = _ops.write_req(path, mode, append, exclusive, parents, atomic, allow_special)
        body = _ops.body_arg(data)
        call = self._open(req, timeout, abort, fs)
        send_body(call, body)
        return _ops.write_result(p, call.wait_end())

    def upload(self, local: PathLike, path: PathLike, *, mode: Optional[int] = None, append: bool = False,
               exclusive: bool = False, parents: bool = False, atomic: bool = True, user: UserSpec = None,
               group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
               timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        """write_file() from a local file, streamed."""
        with open(os.fspath(local), "rb") as f:
            return self.write_file(path, f, mode=mode, append=append, exclusive=exclusive, parents=parents,
                                   atomic=atomic,
                                   user=user, group=group, no_follow=no_follow, no_symlinks=no_symlinks,
                                   timeout=timeout, abort=abort)

    # ---- metadata ----

    def stat(self, path: PathLike, *, follow_symlinks: bool = True, user: UserSpec = None, group: UserSpec = None,
             no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
             abort: Any = None) -> SandboxFileStat:
        """Metadata of ``path`` (of a symlink's target unless follow_symlinks=False)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        p, req = _ops.stat_req(path, follow_symlinks)
        return _ops.stat_result(p, self._do(req, timeout, abort, fs))

    def lstat(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
              no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        """stat() of a symlink itself."""
        return self.stat(path, follow_symlinks=False, user=user, group=group, no_follow=no_follow,
                         no_symlinks=no_symlinks, timeout=timeout, abort=abort)

    def exists(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
               no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> bool:
        """True if path exists (a dangling symlink exists)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        _, req = _ops.stat_req(path, False)
        try:
            self._do(req, timeout, abort, fs)
            return True
        except Exception as e:
            return _ops.exists_answer(e)

    def read_directory(self, path: PathLike, *, recursive: bool = False, depth: Optional[int] = None,
                       hidden: bool = True, follow_symlinks: bool = False, user: UserSpec = None,
                       group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                       timeout: Optional[float] = None, abort: Any = None) -> List[SandboxFileEntry]:
        """The entries of a directory with their metadata (in the order the
        shim reads them). ``recursive`` lists the whole tree (or ``depth`` levels);
        ``hidden=False`` leaves out names starting with '.'."""
        with self.iter_directory(path, recursive=recursive, depth=depth, hidden=hidden,
                                 follow_symlinks=follow_symlinks,
                                 user=user, group=group, no_follow=no_follow, no_symlinks=no_symlinks,
                                 timeout=timeout, abort=abort) as it:
            return list(it)

    def iter_directory(self, path: PathLike, *, recursive: bool = False, depth: Optional[int] = None,
                       hidden: bool = True, follow_symlinks: bool = False, user: UserSpec = None,
                       group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                       timeout: Optional[float] = None, abort: Any = None) -> "Stream[SandboxFileEntry]":
        """read_directory() as a stream, for huge directories (close it to stop early)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        base, req = _ops.list_req(path, recursive, depth, hidden, follow_symlinks)
        dl = _ops.Delimited()
        call = self._open(req, timeout, abort, fs)
        return Stream(call, lambda b: [_ops.dir_entry(base, m) for m in dl.feed(b)], dl.finish)

    def watch(self, path: PathLike, *, recursive: bool = False, user: UserSpec = None, group: UserSpec = None,
              no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
              abort: Any = None) -> "Stream[WatchEvent]":
        """Stream changes below ``path`` as WatchEvent values until the iterator is
        closed, ``timeout`` passes (SandboxTimeoutError), ``abort`` is set
        (SandboxAbortError) or the path is deleted (the iterator ends)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        dl = _ops.Delimited()
        call = self._open(_ops.watch_req(path, recursive), timeout, abort, fs)
        return Stream(call, lambda b: [_ops.watch_event(m) for m in dl.feed(b)], dl.finish)

    # ---- changes ----

    def mkdir(self, path: PathLike, *, parents: bool = False, mode: Optional[int] = None, exist_ok: bool = False,
              user: UserSpec = None, group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
              timeout: Optional[float] = None, abort: Any = None) -> None:
        """Create a directory (``parents``: with its missing parents; ``mode``:
        default 0o755). ``exist_ok`` ignores an existing directory."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.mkdir_req(path, parents, mode)
        _ops.check_bool("exist_ok", exist_ok)
        try:
            self._do(req, timeout, abort, fs)
        except FileExistsError:
            if not exist_ok or not self.stat(path, user=user, group=group, no_follow=no_follow,
                                             no_symlinks=no_symlinks, timeout=timeout, abort=abort).is_dir:
                raise

    def delete(self, path: PathLike, *, recursive: bool = False, user: UserSpec = None, group: UserSpec = None,
               no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
               abort: Any = None) -> None:
        """Remove a file, a symlink, an empty directory, or (recursive) a whole tree."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.remove_req(path, recursive), timeout, abort, fs)

    remove = delete

    def rename(self, src: PathLike, dst: PathLike, *, overwrite: bool = True, user: UserSpec = None,
               group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
               timeout: Optional[float] = None, abort: Any = None) -> None:
        """Move ``src`` to ``dst`` atomically (across file systems: copy, then remove).
        ``overwrite=False`` fails with SandboxFileExistsError if dst exists."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.rename_req(src, dst, overwrite), timeout, abort, fs)

    move = rename

    def copy(self, src: PathLike, dst: PathLike, *, recursive: bool = False, user: UserSpec = None,
             group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
             timeout: Optional[float] = None, abort: Any = None) -> None:
        """Copy a file (or, recursive, a tree), keeping modes, times and symlinks."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.copy_req(src, dst, recursive), timeout, abort, fs)

    def chmod(self, path: PathLike, mode: int, *, user: UserSpec = None, group: UserSpec = None,
              no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
              abort: Any = None) -> None:
        """Set the permission bits (0 to 0o7777)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.chmod_req(path, mode), timeout, abort, fs)

    def chown(self, path: PathLike, uid: Optional[int] = None, gid: Optional[int] = None, *,
              follow_symlinks: bool = True, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
              no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> None:
        """Change the owner and/or group (None: leave unchanged)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.chown_req(path, uid, gid, follow_symlinks), timeout, abort, fs)

    def symlink(self, target: PathLike, link_path: PathLike, *, user: UserSpec = None, group: UserSpec = None,
                no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                abort: Any = None) -> None:
        """Create ``link_path`` as a symlink to ``target`` (any text, relative allowed)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.symlink_req(target, link_path), timeout, abort, fs)

    def link(self, target: PathLike, link_path: PathLike, *, user: UserSpec = None, group: UserSpec = None,
             no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
             abort: Any = None) -> None:
        """Create a hard link."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.link_req(target, link_path), timeout, abort, fs)

    def readlink(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                 no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> str:
        """The target of a symlink."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.path_result(self._do(_ops.readlink_req(path), timeout, abort, fs))

    def realpath(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                 no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> str:
        """The canonical absolute path (symlinks and .. resolved)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.path_result(self._do(_ops.realpath_req(path), timeout, abort, fs))

    def truncate(self, path: PathLike, size: int, *, allow_special: bool = False, user: UserSpec = None,
                 group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                 timeout: Optional[float] = None, abort: Any = None) -> None:
        """Cut or extend a file to ``size`` bytes (a FIFO or device only with allow_special)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.truncate_req(path, size, allow_special), timeout, abort, fs)

    def touch(self, path: PathLike, *, create: bool = True, user: UserSpec = None, group: UserSpec = None,
              no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
              abort: Any = None) -> None:
        """Set a file's times to now (creating it empty unless create=False)."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        self._do(_ops.touch_req(path, create), timeout, abort, fs)

    def disk_usage(self, path: PathLike = "/", *, user: UserSpec = None, group: UserSpec = None,
                   no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                   abort: Any = None) -> DiskUsage:
        """statfs() of the file system holding ``path``."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.statfs_result(self._do(_ops.statfs_req(path), timeout, abort, fs))
