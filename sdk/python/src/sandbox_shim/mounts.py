"""mounts: S3-compatible buckets mounted in the sandbox with rclone (``shim.mounts``)."""

from __future__ import annotations

import ctypes
import json
from typing import Any, List, Optional, Sequence, TypedDict, cast

from . import _lib
from ._core import Core, check_type, cstr, fspath, strv, timeout_ms
from ._lib import lib
from .errors import SandboxUnsupportedError

__all__ = ["Mounts", "AsyncMounts", "MountRecord"]


class MountRecord(TypedDict, total=False):
    """A mount as the shim reports it. ``state`` is "starting", "live", "failed",
    "unmounting" or "unmounted"; ``error`` says what happened to a failed one."""

    id: str
    bucket: str
    prefix: str
    path: str
    read_only: bool
    state: str
    rclone_pid: int
    created_at: str
    endpoint: str
    error: str
    created_dir: bool


def _record(rec: _lib.SbxMountRecord) -> MountRecord:
    js = lib.sbx_mount_record_json(ctypes.byref(rec))
    if not js:
        raise MemoryError("sbx_mount_record_json")
    try:
        return cast(MountRecord, json.loads(ctypes.string_at(js).decode("utf-8")))
    finally:
        lib.libc.free(js)


def _opt_str(name: str, v: Optional[str]) -> Optional[bytes]:
    if v is None:
        return None
    b = cstr(v, name)
    if not b:
        raise ValueError(f"{name} is empty")
    return b


class Mounts:
    """S3 bucket mounts inside the sandbox (rclone mount, driven by the shim). The
    credentials go into a 0600 rclone config in the shim's private state directory,
    never on a command line or in another process's environment."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def _check(self) -> None:
        if not lib.has("sbx_mount"):
            raise SandboxUnsupportedError("this libsbx has no mount API", errno=38, errno_name="ENOSYS", kind="local")

    def mount(
        self,
        bucket: str,
        mount_path: Any,
        *,
        endpoint: str,
        access_key_id: str,
        secret_access_key: str,
        read_only: bool = False,
        prefix: Optional[str] = None,
        region: Optional[str] = None,
        session_token: Optional[str] = None,
        provider: Optional[str] = None,
        allow_non_empty: bool = False,
        options: Sequence[str] = (),
        mount_timeout: Optional[float] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> MountRecord:
        """Mount ``bucket`` (optionally only ``prefix`` inside it) at ``mount_path``
        and return once the mount is live. ``endpoint`` is the full http(s) URL of the
        S3-compatible service (never defaulted). ``options`` are allow-listed rclone
        options ("vfs-cache-mode=full"). ``mount_timeout`` bounds the wait for the mount
        to be live (default 15 s). Errors carry rclone's own words: SandboxPermissionError
        for refused keys, SandboxBusyError for a path already mounted, ..."""
        self._check()
        b = cstr(bucket, "bucket")
        if not b:
            raise ValueError("bucket is empty")
        p = fspath(mount_path, "mount_path")
        for name, v in (("endpoint", endpoint), ("access_key_id", access_key_id), ("secret_access_key", secret_access_key)):
            if not isinstance(v, str):
                raise TypeError(f"{name} must be a str, not {type(v).__name__}")
            if not v:
                raise ValueError(f"{name} is empty")
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
        check_type("read_only", read_only, bool, "a bool")
        check_type("allow_non_empty", allow_non_empty, bool, "a bool")
        if isinstance(options, (str, bytes)) or not isinstance(options, (list, tuple)):
            raise TypeError("options must be a list of str")
        opts_b = [cstr(o, "options") for o in options]
        mo = _lib.SbxMountOpts()
        mo.struct_size = ctypes.sizeof(mo)
        keep = [cstr(endpoint, "endpoint"), cstr(access_key_id, "access_key_id"), cstr(secret_access_key, "secret_access_key")]
        mo.endpoint, mo.access_key_id, mo.secret_access_key = keep
        mo.session_token = _opt_str("session_token", session_token)
        mo.prefix = _opt_str("prefix", prefix)
        mo.region = _opt_str("region", region)
        mo.provider = _opt_str("provider", provider)
        mo.read_only = int(read_only)
        mo.allow_non_empty = int(allow_non_empty)
        if mount_timeout is not None:
            mo.timeout_ms = max(timeout_ms(mount_timeout, "mount_timeout"), 0)
        ov = strv(opts_b) if opts_b else None
        mo.options = ctypes.cast(ov, ctypes.POINTER(ctypes.c_char_p)) if ov is not None else None
        rec = _lib.SbxMountRecord()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_mount(s.handle, s.opts, b, p, ctypes.byref(mo), ctypes.byref(rec), s.err) < 0:
                s.fail()
        return _record(rec)

    def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[MountRecord]:
        """Every mount the shim has (live, failed, or on the way)."""
        self._check()
        arr = ctypes.POINTER(_lib.SbxMountRecord)()
        n = ctypes.c_size_t()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_mounts_list(s.handle, s.opts, ctypes.byref(arr), ctypes.byref(n), s.err) < 0:
                s.fail()
        try:
            return [_record(arr[i]) for i in range(n.value)]
        finally:
            if arr:
                lib.sbx_mounts_free(arr)

    def unmount(
        self,
        id_or_path: Any,
        *,
        flush_timeout: Optional[float] = None,
        force: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> MountRecord:
        """Unmount by id or by path (a str starting with '/'). Pending uploads are
        flushed first (SandboxTimeoutError, mount left as it was, if they do not finish
        within ``flush_timeout`` seconds, default 60, unless ``force``)."""
        self._check()
        if isinstance(id_or_path, str) and not id_or_path.startswith("/"):
            key = cstr(id_or_path, "id_or_path")
            if not key:
                raise ValueError("id_or_path is empty")
        else:
            key = fspath(id_or_path, "id_or_path")
        check_type("force", force, bool, "a bool")
        uo = _lib.SbxUnmountOpts()
        uo.struct_size = ctypes.sizeof(uo)
        if flush_timeout is not None:
            uo.flush_timeout_ms = max(timeout_ms(flush_timeout, "flush_timeout"), 0)
        uo.force = int(force)
        rec = _lib.SbxMountRecord()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_unmount(s.handle, s.opts, key, ctypes.byref(uo), ctypes.byref(rec), s.err) < 0:
                s.fail()
        return _record(rec)


class AsyncMounts:
    """The coroutine twin of Mounts."""

    def __init__(self, shim: Any, run: Any) -> None:
        self._m = shim.mounts
        self._run = run

    async def mount(self, bucket: str, mount_path: Any, **kw: Any) -> MountRecord:
        """Coroutine twin of Mounts.mount()."""
        return await self._run(self._m.mount, bucket, mount_path, **kw)

    async def list(self, **kw: Any) -> List[MountRecord]:
        """Coroutine twin of Mounts.list()."""
        return await self._run(self._m.list, **kw)

    async def unmount(self, id_or_path: Any, **kw: Any) -> MountRecord:
        """Coroutine twin of Mounts.unmount()."""
        return await self._run(self._m.unmount, id_or_path, **kw)
