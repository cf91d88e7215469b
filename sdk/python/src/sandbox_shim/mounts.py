"""mounts: S3-compatible buckets mounted in the sandbox with rclone (``shim.mounts``)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, TypedDict, cast

from . import _ops, _pb
from ._core import check_abort, seconds
from ._sync import Engine

__all__ = ["Mounts", "MountRecord"]


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


class Mounts:
    """S3 bucket mounts inside the sandbox (rclone mount, driven by the shim). The
    credentials go into a 0600 rclone config in the shim's private state directory,
    never on a command line or in another process's environment."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

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
        req = _ops.mount_req(bucket, mount_path, endpoint=endpoint, access_key_id=access_key_id,
                             secret_access_key=secret_access_key, read_only=read_only, prefix=prefix, region=region,
                             session_token=session_token, provider=provider, allow_non_empty=allow_non_empty,
                             options=options, mount_timeout=mount_timeout)
        check_abort(abort)
        res = self._e.request(req, timeout=seconds(timeout), abort=abort)
        return cast(MountRecord, _ops.mount_record(_ops.expect(res, "mount")))

    def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[MountRecord]:
        """Every mount the shim has (live, failed, or on the way)."""
        check_abort(abort)
        res = self._e.request(_pb.Request(mounts=_pb.MountListRequest()), timeout=seconds(timeout), abort=abort)
        return [cast(MountRecord, _ops.mount_record(m)) for m in _ops.expect(res, "mounts").mounts]

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
        req = _ops.unmount_req(id_or_path, flush_timeout, force)
        check_abort(abort)
        res = self._e.request(req, timeout=seconds(timeout), abort=abort)
        return cast(MountRecord, _ops.mount_record(_ops.expect(res, "mount")))
