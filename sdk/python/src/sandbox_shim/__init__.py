"""sandbox_shim: drive a sandbox-shim from Python.

A zero-dependency package over libsbx (the C host SDK) through ctypes: one protocol
implementation. The library is found through ``$SBX_LIBRARY`` or where
``cmake --install`` put it.

::

    from sandbox_shim import Shim

    with Shim.connect("unix:/run/sandbox-shim.sock") as shim:   # or $SBX_TARGET
        shim.files.write_file("/workspace/notes.txt", "hello")
        result = shim.commands.run(["cat", "/workspace/notes.txt"])
        print(result.stdout, result.exit_code)

See :class:`Shim` (files, commands, backups, mounts, tunnels), :class:`AsyncShim`
(the same as coroutines) and :mod:`sandbox_shim.errors`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._lib import LibraryNotFoundError, library_path
from .aio import AsyncProcess, AsyncShim
from .backups import Backups
from .client import Shim
from .commands import Commands, Process, signal_number
from . import errors
from .errors import *  # noqa: F401,F403 (the names are listed in errors.__all__)
from .files import Files
from .mounts import MountRecord, Mounts
from .tunnels import TunnelEvent, TunnelHandle, TunnelInfo
from .types import (
    CommandResult,
    DirectoryBackupRecord,
    DiskUsage,
    OutputChunk,
    ProcessInfo,
    RestoreResult,
    SandboxFileEntry,
    SandboxFileStat,
    ShimInfo,
    WatchEvent,
)


def errno_name(code: int) -> "str | None":
    """"ENOENT" for 2 (libsbx's fixed table of Linux values); None if unknown."""
    from ._lib import lib

    n = lib.sbx_errno_name(code)
    return n.decode() if n else None


def libsbx_version() -> str:
    """The version of the libsbx loaded ("0.1.0")."""
    from ._lib import lib

    return lib.sbx_version().decode()


__all__ = [
    "__version__",
    "Shim",
    "AsyncShim",
    "AsyncProcess",
    "Files",
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
    "WatchEvent",
    "DiskUsage",
    "DirectoryBackupRecord",
    "RestoreResult",
    "ShimInfo",
    "LibraryNotFoundError",
    "library_path",
    "libsbx_version",
    "errno_name",
    "signal_number",
]
__all__ += errors.__all__
