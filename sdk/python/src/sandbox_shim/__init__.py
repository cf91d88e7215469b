"""sandbox_shim: drive a sandbox-shim from Python.

A pure-Python, zero-dependency client of shim protocol v1 (CPython 3.9+ and Pyodide):
a sans-IO protocol core (:mod:`sandbox_shim._protocol`) under a thread-safe sync
:class:`Shim` and a native asyncio :class:`AsyncShim`, over unix, tcp, vsock,
Firecracker hybrid vsock, ``exec:`` or any byte stream you bring (see
:mod:`sandbox_shim.transports`).

::

    from sandbox_shim import Shim

    with Shim.connect("unix:/run/sandbox-shim/shim.sock") as shim:   # or $SBX_TARGET
        shim.files.write_file("/workspace/notes.txt", "hello")
        result = shim.commands.run(["cat", "/workspace/notes.txt"])
        print(result.stdout, result.exit_code)

See :class:`Shim` (files, commands, backups, mounts, tunnels), :class:`AsyncShim`
(the same as coroutines) and :mod:`sandbox_shim.errors`.
"""

from __future__ import annotations

__version__ = "0.2.0"

from . import errors
from .errors import *  # noqa: F401,F403 (the names are listed in errors.__all__)
from .errors import errno_name
from ._ops import signal_number
from .types import (
    CommandResult,
    DirectoryBackupRecord,
    DiskUsage,
    OutputChunk,
    ProcessInfo,
    RestoreResult,
    SandboxFileEntry,
    SandboxFileStat,
    ServerInfo,
    ShimInfo,
    SnapshotResult,
    SnapshotStep,
    WatchEvent,
)
from .client import Shim
from .files import Files, Stream
from .commands import Commands, Process
from .backups import Backups
from .mounts import MountRecord, Mounts
from .tunnels import TunnelEvent, TunnelHandle, TunnelInfo
from .aio import AsyncProcess, AsyncShim

__all__ = [
    "__version__",
    "Shim",
    "AsyncShim",
    "AsyncProcess",
    "Files",
    "Stream",
    "Commands",
    "Process",
    "Backups",
    "Mounts",
    "MountRecord",
    "TunnelHandle",
    "TunnelEvent",
    "TunnelInfo",
    "CommandResult",
    "OutputChunk",
    "ProcessInfo",
    "SandboxFileStat",
    "SandboxFileEntry",
    "ServerInfo",
    "WatchEvent",
    "DiskUsage",
    "DirectoryBackupRecord",
    "RestoreResult",
    "ShimInfo",
    "SnapshotResult",
    "SnapshotStep",
    "errno_name",
    "signal_number",
]
__all__ += [n for n in errors.__all__ if n not in __all__]
