"""types: the values sandbox_shim returns (dataclasses and TypedDicts)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import List, Optional, TypedDict

from . import _lib

__all__ = [
    "SandboxFileStat",
    "SandboxFileEntry",
    "WatchEvent",
    "DiskUsage",
    "CommandResult",
    "OutputChunk",
    "ProcessInfo",
    "DirectoryBackupRecord",
    "RestoreResult",
    "ShimInfo",
]

FILE_TYPES = {
    0: "unknown",
    1: "file",
    2: "directory",
    3: "symlink",
    4: "fifo",
    5: "socket",
    6: "block_device",
    7: "character_device",
}


def utc(ts: _lib.SbxTimespec) -> datetime:
    """A struct sbx_timespec as an aware UTC datetime (microsecond precision)."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=ts.sec, microseconds=ts.nsec // 1000)


@dataclass(frozen=True)
class SandboxFileStat:
    """What stat() says about a path in the sandbox.

    ``type`` is one of ``"file"``, ``"directory"``, ``"symlink"``, ``"fifo"``,
    ``"socket"``, ``"block_device"``, ``"character_device"`` (``"unknown"``).
    Times are UTC datetimes; ``*_ns`` give them in nanoseconds since the epoch.
    """

    path: str
    type: str
    size: int
    mode: int
    uid: int
    gid: int
    nlink: int
    inode: int
    device: int
    rdev: int
    blocks: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    link_target: Optional[str] = None

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.type == "file"

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.type == "directory"

    @property
    def is_symlink(self) -> bool:
        """True for a symlink."""
        return self.type == "symlink"

    @classmethod
    def _from_c(cls, path: str, st: _lib.SbxStat) -> "SandboxFileStat":
        target = None
        if st.type == 3 and st.link_target_len:
            target = os.fsdecode(bytes(st.link_target[: st.link_target_len]))
        return cls(
            path=path,
            type=FILE_TYPES.get(st.type, "unknown"),
            size=st.size,
            mode=st.mode,
            uid=st.uid,
            gid=st.gid,
            nlink=st.nlink,
            inode=st.inode,
            device=st.device,
            rdev=st.rdev,
            blocks=st.blocks,
            atime=utc(st.atime),
            mtime=utc(st.mtime),
            ctime=utc(st.ctime),
            atime_ns=st.atime.sec * 10**9 + st.atime.nsec,
            mtime_ns=st.mtime.sec * 10**9 + st.mtime.nsec,
            ctime_ns=st.ctime.sec * 10**9 + st.ctime.nsec,
            link_target=target,
        )


@dataclass(frozen=True)
class SandboxFileEntry:
    """One entry of read_directory(): ``name`` is relative to the directory listed
    (``"sub/file"`` below the first level), ``path`` absolute, ``stat`` its metadata."""

    name: str
    path: str
    stat: SandboxFileStat

    @property
    def type(self) -> str:
        """The entry's file type."""
        return self.stat.type

    @property
    def size(self) -> int:
        """Size in bytes."""
        return self.stat.size

    @property
    def mode(self) -> int:
        """Permission bits."""
        return self.stat.mode

    @property
    def mtime(self) -> datetime:
        """Modification time (UTC)."""
        return self.stat.mtime

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.stat.type == "directory"

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.stat.type == "file"

    @property
    def is_symlink(self) -> bool:
        """True for a symlink."""
        return self.stat.type == "symlink"


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by watch(): ``type`` is ``"create"``, ``"modify"``, ``"delete"``,
    ``"moved_from"``, ``"moved_to"``, ``"attrib"``, ``"overflow"`` (events were dropped;
    ``path`` is None) or ``"delete_self"`` (the watched path went away)."""

    type: str
    path: Optional[str]
    is_dir: bool
    cookie: int


@dataclass(frozen=True)
class DiskUsage:
    """statfs() of the file system holding a path; sizes in bytes."""

    total: int
    used: int
    free: int
    available: int
    block_size: int
    files: int
    files_free: int
    fs_type: int
    read_only: bool


@dataclass(frozen=True)
class CommandResult:
    """The outcome of a command. A non-zero exit is not an exception: read
    ``exit_code``. ``exit_code`` is shell-style: the exit status, or 128+N when
    signal N ended the command (then ``signal`` is N)."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    exit_code: int
    signal: int = 0
    timed_out: bool = False
    core_dumped: bool = False
    duration: float = 0.0
    pid: int = 0
    id: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def stdout(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """exit_code == 0."""
        return self.exit_code == 0


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a running command's output: ``stream`` is "stdout" or "stderr"."""

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """data decoded as UTF-8 (invalid bytes replaced)."""
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ProcessInfo:
    """A process the shim knows (commands.list())."""

    id: str
    pid: int
    running: bool
    started_at: datetime
    detached: bool
    pty: bool
    command: str
    exit_code: Optional[int] = None
    signal: int = 0


class DirectoryBackupRecord(TypedDict, total=False):
    """The record of a directory backup (the JSON shape libsbx and the CLI print)."""

    id: str
    dir: str
    bytes: int
    sha256: str
    entries: int
    source_bytes: int
    compression: str
    skipped: List[str]
    changed: List[str]
    created_at: str
    to_path: str


class RestoreResult(TypedDict):
    """What a restore read: archive bytes, entries extracted, the archive's sha256."""

    bytes: int
    entries: int
    sha256: str


@dataclass(frozen=True)
class ShimInfo:
    """What the shim reports about itself (Shim.info())."""

    shim_version: str
    protocol_version: int
    features: List[str]
    uptime: float
    pid: int
    pid1: bool
    uid: int
    gid: int
    hostname: str
    boot_id: str
    connections: int
    streams: int
    processes: int
    mounts: int
    rss_bytes: int
    load: List[float] = field(default_factory=list)
