"""backups: directory tar backups and restores (``shim.backups``)."""

from __future__ import annotations

import os
from typing import IO, Any, Callable, Optional, Sequence, Tuple, Union, cast

from . import _ops
from ._core import PathLike, check_abort, fspath, seconds
from ._ops import UserSpec
from ._protocol import Data, StreamEvent
from ._sync import Call, Engine
from .files import send_body
from .types import DirectoryBackupRecord, RestoreResult

__all__ = ["Backups"]

Progress = Callable[[int, int], Any]
CHUNK = 256 << 10


def local_dest(dest: Any) -> Tuple[Optional[Callable[[bytes], Any]], Optional[str]]:
    """(write, None) for a writable file-like object, (None, path) for a local path."""
    if callable(getattr(dest, "write", None)):
        return dest.write, None
    if isinstance(dest, (str, bytes)) or hasattr(dest, "__fspath__"):
        local = os.fsdecode(os.fspath(dest))
        if not local or "\0" in local:
            raise ValueError("dest is empty or holds a NUL byte")
        return None, local
    raise TypeError(f"dest must be a local path or a writable file-like object, not {type(dest).__name__}")


def local_source(source: Any) -> Tuple[Any, Optional[str]]:
    """(bytes or file-like, None), or (None, path) for a local path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return source, None
    if callable(getattr(source, "read", None)) or callable(getattr(source, "readinto", None)):
        return source, None
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        local = os.fsdecode(os.fspath(source))
        if not local or "\0" in local:
            raise ValueError("source is empty or holds a NUL byte")
        return None, local
    raise TypeError(f"source must be a local path, bytes or a readable file-like object, not {type(source).__name__}")


def _check_ends(dest_given: bool, sandbox_path: Any, what: str) -> Optional[bytes]:
    if dest_given == (sandbox_path is not None):
        raise ValueError(what)
    return fspath(sandbox_path, "sandbox_path") if sandbox_path is not None else None


class Backups:
    """Back up a sandbox directory as a tar stream (pax; zstd, gzip or none) and
    restore one. Restores are atomic: a failure leaves the directory as it was."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def backup(
        self,
        dir: PathLike,
        dest: Union[PathLike, IO[bytes], None] = None,
        *,
        excludes: Sequence[str] = (),
        compression: str = "zstd",
        level: Optional[int] = None,
        skip_unreadable: bool = False,
        one_file_system: bool = False,
        sandbox_path: Optional[PathLike] = None,
        progress: Optional[Progress] = None,
        user: UserSpec = None,
        group: UserSpec = None,
        no_follow: bool = False,
        no_symlinks: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> DirectoryBackupRecord:
        """Back up ``dir`` and return its record.

        ``dest`` is a local path (written beside and renamed into place when complete)
        or a writable file-like object that gets the archive chunk by chunk as the
        shim produces it. With ``sandbox_path`` (and no dest) the archive is written
        to that file inside the sandbox instead. ``excludes`` are tar-style glob
        patterns. ``progress(bytes, entries)`` is called along the way. ``user``,
        ``group``, ``no_follow``, ``no_symlinks``: as for Files (the walk reads what
        that user may read)."""
        to = _check_ends(dest is not None, sandbox_path, "give either dest (a local path or a writable file) or sandbox_path")
        req = _ops.backup_req(dir, excludes, compression, level, skip_unreadable, one_file_system, to)
        req.fs = _ops.fs_options(user, group, no_follow, no_symlinks)
        progress = _ops.progress_arg(progress)
        write, local = local_dest(dest) if dest is not None else (None, None)
        check_abort(abort)
        extra = 0 if to is not None else _ops.READ_EXTRA_WINDOW
        if local is None:
            call = self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra)
            return cast(DirectoryBackupRecord, self._receive(call, write, progress))
        tmp = f"{local}.part-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                call = self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra)
                rec = self._receive(call, f.write, progress)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, local)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return cast(DirectoryBackupRecord, rec)

    @staticmethod
    def _receive(call: Call, write: Optional[Callable[[bytes], Any]], progress: Optional[Progress]) -> Any:
        try:
            while True:
                it = call.next()
                if it is None:
                    break
                if type(it) is Data:
                    if it.data and write is not None:
                        write(it.data)
                elif type(it) is StreamEvent and progress is not None:
                    p = _ops.progress_of(it.event)
                    if p is not None:
                        progress(*p)
        except BaseException:
            call.close()
            raise
        assert call.result is not None
        return _ops.backup_record(call.result)

    def restore(
        self,
        dir: PathLike,
        source: Union[PathLike, IO[bytes], bytes, None] = None,
        *,
        sha256: Optional[str] = None,
        merge: bool = False,
        allow_devices: bool = False,
        allow_empty: bool = False,
        sandbox_path: Optional[PathLike] = None,
        progress: Optional[Progress] = None,
        user: UserSpec = None,
        group: UserSpec = None,
        no_follow: bool = False,
        no_symlinks: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> RestoreResult:
        """Restore ``dir`` from an archive made by backup(): ``source`` is a local
        path, a readable file-like object, or bytes (or, with ``sandbox_path``, a file
        inside the sandbox). ``sha256`` (hex) is checked before the swap: a mismatch
        leaves ``dir`` as it was. ``merge`` adds the archive's entries to the directory
        as it is instead of replacing it. Only one whole archive is accepted: one cut
        short, without its end-of-archive blocks, with data after them, or (unless
        ``allow_empty``) without members fails with EBADMSG and ``dir`` stays as it
        was, in either mode. ``user``, ``group``, ``no_follow``, ``no_symlinks``: as
        for Files (the files are created as, and owned by, that user)."""
        frm = _check_ends(source is not None, sandbox_path,
                          "give either source (a local path, bytes or a readable file) or sandbox_path")
        req = _ops.restore_req(dir, sha256, merge, allow_devices, frm, allow_empty)
        req.fs = _ops.fs_options(user, group, no_follow, no_symlinks)
        progress = _ops.progress_arg(progress)
        body, local = local_source(source) if source is not None else (None, None)
        check_abort(abort)
        f = open(local, "rb") if local is not None else None
        try:
            if f is not None:
                body = f
            call = self._e.open(req, timeout=seconds(timeout), abort=abort)
            if body is None:
                pass  # from_path: the archive is in the sandbox, the request takes no data
            else:
                send_body(call, body, CHUNK)
            while True:
                it = call.next()
                if it is None:
                    break
                if type(it) is StreamEvent and progress is not None:
                    p = _ops.progress_of(it.event)
                    if p is not None:
                        progress(*p)
        finally:
            if f is not None:
                f.close()
        assert call.result is not None
        return cast(RestoreResult, _ops.restore_result(call.result))

