"""errors: the exception classes raised by sandbox_shim, all under SandboxError.

Every error carries the Linux errno number (``errno``), its name from libsbx's fixed
table (``errno_name``, e.g. ``"ENOENT"``), the path or argument concerned (``path``,
``None`` if none) and the text (``message``). The file-related classes also subclass
the matching builtin, so ``except FileNotFoundError`` works as it does for local files.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
    "SandboxError",
    "SandboxAbortError",
    "SandboxTimeoutError",
    "SandboxConnectionError",
    "SandboxProtocolError",
    "SandboxInvalidArgumentError",
    "SandboxFileNotFoundError",
    "SandboxFileExistsError",
    "SandboxPermissionError",
    "SandboxNotADirectoryError",
    "SandboxIsADirectoryError",
    "SandboxDirectoryNotEmptyError",
    "SandboxReadOnlyError",
    "SandboxNoSpaceError",
    "SandboxProcessLookupError",
    "SandboxBusyError",
    "SandboxUnsupportedError",
    "SandboxEvalError",
]

# kinds of struct sbx_error
# Linux errno values (the shim's, whatever the host is): the fixed table libsbx uses.
class _errno:
    EPERM, ENOENT, ESRCH, EACCES, EBUSY, EEXIST = 1, 2, 3, 13, 16, 17
    ENOTDIR, EISDIR, EINVAL, EFBIG, ENOSPC, EROFS, EPIPE = 20, 21, 22, 27, 28, 30, 32
    ENAMETOOLONG, ENOSYS, ENOTEMPTY, EOPNOTSUPP = 36, 38, 39, 95
    ECONNABORTED, ECONNRESET, ETIMEDOUT, ECONNREFUSED, EDQUOT, ECANCELED = 103, 104, 110, 111, 122, 125


KIND_NAMES = {0: "none", 1: "remote", 2: "local", 3: "connect", 4: "protocol", 5: "exit"}


class SandboxError(Exception):
    """Base class of every error from the shim or from libsbx.

    Attributes: ``errno`` (Linux value), ``errno_name`` (``"ENOENT"``), ``path``
    (``str`` or ``None``), ``message`` and ``kind`` (``"remote"``: failed in the shim;
    ``"local"``: on this side; ``"connect"``; ``"protocol"``; ``"exit"``).
    """

    def __init__(
        self,
        message: str = "",
        *,
        errno: int = 0,
        errno_name: Optional[str] = None,
        path: Optional[str] = None,
        kind: str = "remote",
    ) -> None:
        Exception.__init__(self, message)
        self.message = message
        self.errno = errno
        self.errno_name = errno_name
        self.path = path
        self.kind = kind
        # OSError compatibility for the subclasses that are also OSErrors
        if isinstance(self, OSError):
            self.strerror = message
            self.filename = path

    _formatted: Optional[str] = None

    def __str__(self) -> str:
        if self._formatted:
            return self._formatted
        parts = []
        if self.errno_name:
            parts.append(self.errno_name)
        if self.path:
            parts.append(self.path)
        parts.append(self.message or "error")
        return ": ".join(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, errno={self.errno}, errno_name={self.errno_name!r}, path={self.path!r})"

    def __reduce__(self):  # picklable across processes
        return (_rebuild, (type(self), self.message, self.errno, self.errno_name, self.path, self.kind))


def _rebuild(cls, message, errno, errno_name, path, kind):
    return cls(message, errno=errno, errno_name=errno_name, path=path, kind=kind)


class SandboxAbortError(SandboxError):
    """The operation was cancelled through its ``abort=`` event (ECANCELED)."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A call (or the command behind it) ran out of time (ETIMEDOUT)."""


class SandboxConnectionError(SandboxError, ConnectionError):
    """Connecting failed, the handshake was refused, or the connection is gone."""


class SandboxProtocolError(SandboxError):
    """The peer broke the protocol; the connection can no longer be used."""


class SandboxInvalidArgumentError(SandboxError, ValueError):
    """The shim or libsbx refused an argument (EINVAL and the like)."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """ENOENT."""


class SandboxFileExistsError(SandboxError, FileExistsError):
    """EEXIST."""


class SandboxPermissionError(SandboxError, PermissionError):
    """EACCES or EPERM."""


class SandboxNotADirectoryError(SandboxError, NotADirectoryError):
    """ENOTDIR."""


class SandboxIsADirectoryError(SandboxError, IsADirectoryError):
    """EISDIR."""


class SandboxDirectoryNotEmptyError(SandboxError, OSError):
    """ENOTEMPTY."""


class SandboxReadOnlyError(SandboxError, OSError):
    """EROFS: a read-only file system (or a read-only mount)."""


class SandboxNoSpaceError(SandboxError, OSError):
    """ENOSPC, EDQUOT or EFBIG."""


class SandboxProcessLookupError(SandboxError, ProcessLookupError):
    """ESRCH: no such process."""


class SandboxBusyError(SandboxError, OSError):
    """EBUSY."""


class SandboxUnsupportedError(SandboxError, OSError):
    """ENOSYS or EOPNOTSUPP: the shim does not offer this (an older shim, a missing feature)."""


class SandboxEvalError(SandboxError, RuntimeError):
    """``eval()``: the snippet exited non-zero. ``stderr`` holds what it printed there,
    ``stdout`` what it printed before, ``exit_code`` its shell-style status."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    signal: int = 0


_BY_ERRNO: Dict[int, Type[SandboxError]] = {
    _errno.ECANCELED: SandboxAbortError,
    _errno.ETIMEDOUT: SandboxTimeoutError,
    _errno.ENOENT: SandboxFileNotFoundError,
    _errno.EEXIST: SandboxFileExistsError,
    _errno.EACCES: SandboxPermissionError,
    _errno.EPERM: SandboxPermissionError,
    _errno.ENOTDIR: SandboxNotADirectoryError,
    _errno.EISDIR: SandboxIsADirectoryError,
    _errno.ENOTEMPTY: SandboxDirectoryNotEmptyError,
    _errno.EROFS: SandboxReadOnlyError,
    _errno.ENOSPC: SandboxNoSpaceError,
    _errno.EDQUOT: SandboxNoSpaceError,
    _errno.EFBIG: SandboxNoSpaceError,
    _errno.ESRCH: SandboxProcessLookupError,
    _errno.EBUSY: SandboxBusyError,
    _errno.ENOSYS: SandboxUnsupportedError,
    _errno.EOPNOTSUPP: SandboxUnsupportedError,
    _errno.EINVAL: SandboxInvalidArgumentError,
    _errno.ENAMETOOLONG: SandboxInvalidArgumentError,
    _errno.ECONNABORTED: SandboxConnectionError,
    _errno.ECONNREFUSED: SandboxConnectionError,
    _errno.ECONNRESET: SandboxConnectionError,
    _errno.EPIPE: SandboxConnectionError,
}


def error_class(kind: str, code: int) -> Type[SandboxError]:
    """The class for an error of this kind and Linux errno value."""
    if kind == "protocol":
        return SandboxProtocolError
    if kind == "connect":
        if code == _errno.ETIMEDOUT:
            return SandboxTimeoutError
        return SandboxConnectionError
    if kind == "exit":
        return SandboxEvalError
    if kind == "local" and code == _errno.EPIPE:
        return SandboxError  # e.g. writing stdin of a process that ended
    return _BY_ERRNO.get(code, SandboxError)
