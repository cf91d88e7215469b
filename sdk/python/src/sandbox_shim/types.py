"""types: the values sandbox_shim returns (dataclasses and TypedDicts)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import List, Optional, TypedDict

__all__ = [
    "ServerInfo",
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
    "SnapshotStep",
    "SnapshotResult",
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


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def utc(ts: object) -> datetime:
    """A Timestamp {sec, nsec} as an aware UTC datetime (microsecond precision)."""
    return _EPOCH + timedelta(seconds=ts.sec, microseconds=ts.nsec // 1000)  # type: ignore[attr-defined]


def _ns(ts: object) -> int:
    return ts.sec * 1_000_000_000 + ts.nsec  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ServerInfo:
    """What the shim said in the handshake (``Shim.server``): its protocol version,
    version string, features, the frame limit and per-stream window it settled on,
    the streams a connection may have in flight (0: not announced), its pid, whether
    it is PID 1, its uid, hostname and boot id."""

    protocol_version: int
    shim_version: str
    features: List[str]
    max_frame: int
    initial_window: int
    max_streams: int
    pid: int
    pid1: bool
    uid: int
    hostname: str
    boot_id: str
    generation: int = 0  # bumped by every resumed(); 0 from a shim without snapshots

    def __getitem__(self, key: str) -> object:
        """``server["pid"]`` as well as ``server.pid`` (the mapping of earlier versions)."""
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)

    @classmethod
    def _from_pb(cls, r: object) -> "ServerInfo":
        g = r.__getattribute__
        return cls(
            protocol_version=g("protocol_version"),
            shim_version=g("shim_version"),
            features=list(g("features")),
            max_frame=g("max_frame"),
            initial_window=g("initial_window"),
            max_streams=g("max_streams") or 0,
            pid=g("pid"),
            pid1=bool(g("pid1")),
            uid=g("uid"),
            hostname=g("hostname") or "",
            boot_id=g("boot_id") or "",
            generation=g("generation") or 0,
        )


@dataclass(frozen=True)
class SandboxFileStat:
    """What stat() says about a path in the sandbox.

    ``type`` is one of ``"file"``, ``"directory"``, ``"symlink"``, ``"fifo"``,
    ``"socket"``, ``"block_device"``, ``"character_device"`` (``"unknown"``).
    ``mode`` holds the permission bits only, set-id and sticky bits included
    (``st_mode & 0o7777``, e.g. ``0o644``); the file type is in ``type``. ``device`` is
    ``st_dev``, ``rdev`` the device number of a device node, ``blocks`` 512-byte blocks
    allocated. Times are UTC datetimes; ``*_ns`` give them in nanoseconds since the epoch.
    ``link_target`` is a symlink's target (None for other types).
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
    def _from_pb(cls, path: str, st: object) -> "SandboxFileStat":
        g = st.__getattribute__
        t = g("type")
        lt = g("link_target")
        at, mt, ct = g("atime"), g("mtime"), g("ctime")
        return cls(
            path=path,
            type=FILE_TYPES.get(t, "unknown"),
            size=g("size"),
            mode=g("mode"),
            uid=g("uid"),
            gid=g("gid"),
            nlink=g("nlink"),
            inode=g("inode"),
            device=g("device"),
            rdev=g("rdev") or 0,
            blocks=g("blocks") or 0,
            atime=utc(at),
            mtime=utc(mt),
            ctime=utc(ct),
            atime_ns=_ns(at),
            mtime_ns=_ns(mt),
            ctime_ns=_ns(ct),
            link_target=os.fsdecode(lt) if t == 3 and lt else None,
        )


@dataclass(frozen=True)
class SandboxFileEntry:
    """One entry of read_directory(): ``name`` is relative to the directory listed
    (``"sub/file"`` below the first level), ``path`` absolute, ``stat`` its metadata
    (an lstat: a symlink is reported as the link). The shortcuts ``type``, ``size``,
    ``mode`` (permission bits, ``st_mode & 0o7777``; not the file type) and ``mtime``
    are those of ``stat``."""

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
        """Permission bits incl. set-id and sticky (``st_mode & 0o7777``)."""
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
    """The record of a directory backup (the JSON shape the CLI prints)."""

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
    generation: int = 0  # as ServerInfo.generation


@dataclass(frozen=True)
class SnapshotStep:
    """One step of snapshot_prepare() or resumed(), in the order the shim took them:
    name ("sync", "flush", "freeze", "stop", "clock", "entropy", "thaw", "continue",
    "mount"), how long it took (seconds), error (0: done, else the errno saying why
    not, e.g. 1 EPERM for a clock the shim may not set) and its name, a message, the
    mount point (freeze, thaw, mount) and a count (process groups; entropy: bits
    credited; flush: live mounts)."""

    name: str
    duration: float
    error: int = 0
    error_name: str = ""
    message: str = ""
    path: str = ""
    count: int = 0


@dataclass(frozen=True)
class SnapshotResult:
    """What snapshot_prepare() or resumed() did. prepare: the filesystems now frozen,
    the ids of the commands whose groups are stopped, the automatic thaw armed
    (seconds); resumed: whether a prepare was held (and is undone) and the host's time
    minus the guest's before it was set (seconds)."""

    generation: int
    steps: List[SnapshotStep] = field(default_factory=list)
    frozen: List[str] = field(default_factory=list)
    stopped: List[str] = field(default_factory=list)
    thaw_after: float = 0.0
    prepared: bool = False
    clock_delta: float = 0.0

    def step(self, name: str) -> Optional[SnapshotStep]:
        """The first step of that name, or None."""
        return next((s for s in self.steps if s.name == name), None)
