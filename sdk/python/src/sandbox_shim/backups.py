"""backups: directory tar backups and restores (``shim.backups``)."""

from __future__ import annotations

import ctypes
import io
import json
import os
from typing import IO, Any, Callable, List, Optional, Sequence, Union, cast

from . import _lib
from ._core import Core, PathLike, check_type, cstr, fspath, strv
from ._lib import lib
from .files import _Sink, _Source
from .types import DirectoryBackupRecord, RestoreResult

__all__ = ["Backups"]

COMPRESSIONS = {"none": _lib.COMPRESS_NONE, "gzip": _lib.COMPRESS_GZIP, "zstd": _lib.COMPRESS_ZSTD}
Progress = Callable[[int, int], Any]


def _progress_fn(progress: Optional[Progress], exc: List[BaseException]) -> Any:
    if progress is None:
        return _lib.PROGRESS_FN()
    if not callable(progress):
        raise TypeError(f"progress must be callable (bytes, entries), not {type(progress).__name__}")

    def cb(ud: int, nbytes: int, entries: int) -> None:
        try:
            progress(nbytes, entries)
        except BaseException as e:  # reported after the call
            if not exc:
                exc.append(e)

    return _lib.PROGRESS_FN(cb)


class Backups:
    """Back up a sandbox directory as a tar stream (pax; zstd, gzip or none) and
    restore one. Restores are atomic: a failure leaves the directory as it was."""

    def __init__(self, core: Core) -> None:
        self._core = core

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
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> DirectoryBackupRecord:
        """Back up ``dir`` and return its record.

        ``dest`` is a local path (written beside and renamed into place when complete)
        or a writable file-like object that gets the archive chunk by chunk as the
        shim produces it. With ``sandbox_path`` (and no dest) the archive is written
        to that file inside the sandbox instead. ``excludes`` are tar-style glob
        patterns. ``progress(bytes, entries)`` is called along the way."""
        d = fspath(dir, "dir")
        if not isinstance(compression, str):
            raise TypeError(f"compression must be a str, not {type(compression).__name__}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}")
        if isinstance(excludes, (str, bytes)) or not isinstance(excludes, (list, tuple, set, frozenset)):
            raise TypeError("excludes must be a list of glob patterns")
        ex = [cstr(x, "excludes") for x in excludes]
        for x in ex:
            if not x:
                raise ValueError("an exclude pattern is empty")
        if level is not None:
            check_type("level", level, int, "an int")
            if not 1 <= level <= 22:
                raise ValueError("level must be between 1 and 22")
        check_type("skip_unreadable", skip_unreadable, bool, "a bool")
        check_type("one_file_system", one_file_system, bool, "a bool")
        if (dest is None) == (sandbox_path is None):
            raise ValueError("give either dest (a local path or a writable file) or sandbox_path")
        errs: List[BaseException] = []
        bo = _lib.SbxBackupOpts()
        bo.struct_size = ctypes.sizeof(bo)
        exv = strv(ex)
        bo.excludes = ctypes.cast(exv, ctypes.POINTER(ctypes.c_char_p))
        bo.compression = COMPRESSIONS[compression]
        bo.level = level or 0
        bo.skip_unreadable = int(skip_unreadable)
        bo.one_file_system = int(one_file_system)
        pfn = _progress_fn(progress, errs)
        bo.progress = pfn
        to = fspath(sandbox_path, "sandbox_path") if sandbox_path is not None else None
        bo.to_path = to
        rec = _lib.SbxBackupRecord()
        sink = None
        with self._core.call(timeout=timeout, abort=abort) as s:
            if to is not None:
                rc = lib.sbx_backup(s.handle, s.opts, d, ctypes.byref(bo), _lib.SINK_FN(), None, ctypes.byref(rec), s.err)
            elif callable(getattr(dest, "write", None)):
                sink = _Sink(dest.write)  # type: ignore[union-attr]
                rc = lib.sbx_backup(s.handle, s.opts, d, ctypes.byref(bo), sink.fn, None, ctypes.byref(rec), s.err)
            elif isinstance(dest, (str, bytes)) or hasattr(dest, "__fspath__"):
                local = os.fsencode(dest)  # type: ignore[arg-type]
                if not local or b"\0" in local:
                    raise ValueError("dest is empty or holds a NUL byte")
                rc = lib.sbx_backup_to_file(s.handle, s.opts, d, ctypes.byref(bo), local, ctypes.byref(rec), s.err)
            else:
                raise TypeError(f"dest must be a local path or a writable file-like object, not {type(dest).__name__}")
            try:
                if rc < 0:
                    if sink is not None and sink.exc is not None:
                        raise sink.exc
                    s.fail()
                if errs:
                    raise errs[0]
                js = lib.sbx_backup_record_json(ctypes.byref(rec))
                if not js:
                    raise MemoryError("sbx_backup_record_json")
                try:
                    record = json.loads(ctypes.string_at(js).decode("utf-8"))
                finally:
                    lib.libc.free(js)
            finally:
                lib.sbx_backup_record_free(ctypes.byref(rec))
        return cast(DirectoryBackupRecord, record)

    def restore(
        self,
        dir: PathLike,
        source: Union[PathLike, IO[bytes], bytes, None] = None,
        *,
        sha256: Optional[str] = None,
        merge: bool = False,
        allow_devices: bool = False,
        sandbox_path: Optional[PathLike] = None,
        progress: Optional[Progress] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> RestoreResult:
        """Restore ``dir`` from an archive made by backup(): ``source`` is a local
        path, a readable file-like object, or bytes (or, with ``sandbox_path``, a file
        inside the sandbox). ``sha256`` (hex) is checked before the swap: a mismatch
        leaves ``dir`` as it was. ``merge`` extracts into the directory as it is
        instead of replacing it atomically."""
        d = fspath(dir, "dir")
        if sha256 is not None:
            if not isinstance(sha256, str):
                raise TypeError(f"sha256 must be a hex str, not {type(sha256).__name__}")
            if len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256):
                raise ValueError("sha256 must be 64 hex digits")
        check_type("merge", merge, bool, "a bool")
        check_type("allow_devices", allow_devices, bool, "a bool")
        if (source is None) == (sandbox_path is None):
            raise ValueError("give either source (a local path, bytes or a readable file) or sandbox_path")
        errs: List[BaseException] = []
        ro = _lib.SbxRestoreOpts()
        ro.struct_size = ctypes.sizeof(ro)
        ro.merge = int(merge)
        ro.sha256 = sha256.lower().encode() if sha256 else None
        ro.allow_devices = int(allow_devices)
        pfn = _progress_fn(progress, errs)
        ro.progress = pfn
        frm = fspath(sandbox_path, "sandbox_path") if sandbox_path is not None else None
        ro.from_path = frm
        res = _lib.SbxRestoreResult()
        src = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            source = io.BytesIO(bytes(source))
        with self._core.call(timeout=timeout, abort=abort) as s:
            if frm is not None:
                rc = lib.sbx_restore(s.handle, s.opts, d, ctypes.byref(ro), _lib.SOURCE_FN(), None, ctypes.byref(res), s.err)
            elif callable(getattr(source, "read", None)) or callable(getattr(source, "readinto", None)):
                src = _Source(source)
                rc = lib.sbx_restore(s.handle, s.opts, d, ctypes.byref(ro), src.fn, None, ctypes.byref(res), s.err)
            elif isinstance(source, str) or hasattr(source, "__fspath__"):
                local = os.fsencode(source)  # type: ignore[arg-type]
                if not local or b"\0" in local:
                    raise ValueError("source is empty or holds a NUL byte")
                rc = lib.sbx_restore_from_file(s.handle, s.opts, d, ctypes.byref(ro), local, ctypes.byref(res), s.err)
            else:
                raise TypeError(f"source must be a local path, bytes or a readable file-like object, not {type(source).__name__}")
            if rc < 0:
                if src is not None and src.exc is not None:
                    raise src.exc
                s.fail()
        if errs:
            raise errs[0]
        return {"bytes": res.bytes, "entries": res.entries, "sha256": res.sha256.decode()}
