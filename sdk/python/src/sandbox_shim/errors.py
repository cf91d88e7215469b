"""errors: the exception classes raised by sandbox_shim, all under SandboxError.

Every error carries the Linux errno number (``errno``), its name from the package's fixed
table of Linux values (``errno_name``, e.g. ``"ENOENT"``), the path or argument concerned (``path``,
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
    "SandboxOutputLimitError",
    "errno_name",
    "errno_number",
    "strerror",
]

# The fixed table of Linux errno values (proto/errnames.c holds the same for C):
# number -> (name, text), whatever the host system is.
_LINUX_ERRNO = {
    1: ("EPERM", "Operation not permitted"),
    2: ("ENOENT", "No such file or directory"),
    3: ("ESRCH", "No such process"),
    4: ("EINTR", "Interrupted system call"),
    5: ("EIO", "Input/output error"),
    6: ("ENXIO", "No such device or address"),
    7: ("E2BIG", "Argument list too long"),
    8: ("ENOEXEC", "Exec format error"),
    9: ("EBADF", "Bad file descriptor"),
    10: ("ECHILD", "No child processes"),
    11: ("EAGAIN", "Resource temporarily unavailable"),
    12: ("ENOMEM", "Cannot allocate memory"),
    13: ("EACCES", "Permission denied"),
    14: ("EFAULT", "Bad address"),
    15: ("ENOTBLK", "Block device required"),
    16: ("EBUSY", "Device or resource busy"),
    17: ("EEXIST", "File exists"),
    18: ("EXDEV", "Invalid cross-device link"),
    19: ("ENODEV", "No such device"),
    20: ("ENOTDIR", "Not a directory"),
    21: ("EISDIR", "Is a directory"),
    22: ("EINVAL", "Invalid argument"),
    23: ("ENFILE", "Too many open files in system"),
    24: ("EMFILE", "Too many open files"),
    25: ("ENOTTY", "Inappropriate ioctl for device"),
    26: ("ETXTBSY", "Text file busy"),
    27: ("EFBIG", "File too large"),
    28: ("ENOSPC", "No space left on device"),
    29: ("ESPIPE", "Illegal seek"),
    30: ("EROFS", "Read-only file system"),
    31: ("EMLINK", "Too many links"),
    32: ("EPIPE", "Broken pipe"),
    33: ("EDOM", "Numerical argument out of domain"),
    34: ("ERANGE", "Numerical result out of range"),
    35: ("EDEADLK", "Resource deadlock avoided"),
    36: ("ENAMETOOLONG", "File name too long"),
    37: ("ENOLCK", "No locks available"),
    38: ("ENOSYS", "Function not implemented"),
    39: ("ENOTEMPTY", "Directory not empty"),
    40: ("ELOOP", "Too many levels of symbolic links"),
    42: ("ENOMSG", "No message of desired type"),
    43: ("EIDRM", "Identifier removed"),
    44: ("ECHRNG", "Channel number out of range"),
    45: ("EL2NSYNC", "Level 2 not synchronized"),
    46: ("EL3HLT", "Level 3 halted"),
    47: ("EL3RST", "Level 3 reset"),
    48: ("ELNRNG", "Link number out of range"),
    49: ("EUNATCH", "Protocol driver not attached"),
    50: ("ENOCSI", "No CSI structure available"),
    51: ("EL2HLT", "Level 2 halted"),
    52: ("EBADE", "Invalid exchange"),
    53: ("EBADR", "Invalid request descriptor"),
    54: ("EXFULL", "Exchange full"),
    55: ("ENOANO", "No anode"),
    56: ("EBADRQC", "Invalid request code"),
    57: ("EBADSLT", "Invalid slot"),
    59: ("EBFONT", "Bad font file format"),
    60: ("ENOSTR", "Device not a stream"),
    61: ("ENODATA", "No data available"),
    62: ("ETIME", "Timer expired"),
    63: ("ENOSR", "Out of streams resources"),
    64: ("ENONET", "Machine is not on the network"),
    65: ("ENOPKG", "Package not installed"),
    66: ("EREMOTE", "Object is remote"),
    67: ("ENOLINK", "Link has been severed"),
    68: ("EADV", "Advertise error"),
    69: ("ESRMNT", "Srmount error"),
    70: ("ECOMM", "Communication error on send"),
    71: ("EPROTO", "Protocol error"),
    72: ("EMULTIHOP", "Multihop attempted"),
    73: ("EDOTDOT", "RFS specific error"),
    74: ("EBADMSG", "Bad message"),
    75: ("EOVERFLOW", "Value too large for defined data type"),
    76: ("ENOTUNIQ", "Name not unique on network"),
    77: ("EBADFD", "File descriptor in bad state"),
    78: ("EREMCHG", "Remote address changed"),
    79: ("ELIBACC", "Can not access a needed shared library"),
    80: ("ELIBBAD", "Accessing a corrupted shared library"),
    81: ("ELIBSCN", ".lib section in a.out corrupted"),
    82: ("ELIBMAX", "Attempting to link in too many shared libraries"),
    83: ("ELIBEXEC", "Cannot exec a shared library directly"),
    84: ("EILSEQ", "Invalid or incomplete multibyte or wide character"),
    85: ("ERESTART", "Interrupted system call should be restarted"),
    86: ("ESTRPIPE", "Streams pipe error"),
    87: ("EUSERS", "Too many users"),
    88: ("ENOTSOCK", "Socket operation on non-socket"),
    89: ("EDESTADDRREQ", "Destination address required"),
    90: ("EMSGSIZE", "Message too long"),
    91: ("EPROTOTYPE", "Protocol wrong type for socket"),
    92: ("ENOPROTOOPT", "Protocol not available"),
    93: ("EPROTONOSUPPORT", "Protocol not supported"),
    94: ("ESOCKTNOSUPPORT", "Socket type not supported"),
    95: ("EOPNOTSUPP", "Operation not supported"),
    96: ("EPFNOSUPPORT", "Protocol family not supported"),
    97: ("EAFNOSUPPORT", "Address family not supported by protocol"),
    98: ("EADDRINUSE", "Address already in use"),
    99: ("EADDRNOTAVAIL", "Cannot assign requested address"),
    100: ("ENETDOWN", "Network is down"),
    101: ("ENETUNREACH", "Network is unreachable"),
    102: ("ENETRESET", "Network dropped connection on reset"),
    103: ("ECONNABORTED", "Software caused connection abort"),
    104: ("ECONNRESET", "Connection reset by peer"),
    105: ("ENOBUFS", "No buffer space available"),
    106: ("EISCONN", "Transport endpoint is already connected"),
    107: ("ENOTCONN", "Transport endpoint is not connected"),
    108: ("ESHUTDOWN", "Cannot send after transport endpoint shutdown"),
    109: ("ETOOMANYREFS", "Too many references: cannot splice"),
    110: ("ETIMEDOUT", "Connection timed out"),
    111: ("ECONNREFUSED", "Connection refused"),
    112: ("EHOSTDOWN", "Host is down"),
    113: ("EHOSTUNREACH", "No route to host"),
    114: ("EALREADY", "Operation already in progress"),
    115: ("EINPROGRESS", "Operation now in progress"),
    116: ("ESTALE", "Stale file handle"),
    117: ("EUCLEAN", "Structure needs cleaning"),
    118: ("ENOTNAM", "Not a XENIX named type file"),
    119: ("ENAVAIL", "No XENIX semaphores available"),
    120: ("EISNAM", "Is a named type file"),
    121: ("EREMOTEIO", "Remote I/O error"),
    122: ("EDQUOT", "Disk quota exceeded"),
    123: ("ENOMEDIUM", "No medium found"),
    124: ("EMEDIUMTYPE", "Wrong medium type"),
    125: ("ECANCELED", "Operation canceled"),
    126: ("ENOKEY", "Required key not available"),
    127: ("EKEYEXPIRED", "Key has expired"),
    128: ("EKEYREVOKED", "Key has been revoked"),
    129: ("EKEYREJECTED", "Key was rejected by service"),
    130: ("EOWNERDEAD", "Owner died"),
    131: ("ENOTRECOVERABLE", "State not recoverable"),
    132: ("ERFKILL", "Operation not possible due to RF-kill"),
}
_BY_NAME = {name: num for num, (name, _) in _LINUX_ERRNO.items()}
_BY_NAME.update(EWOULDBLOCK=11, EDEADLOCK=35)


def errno_name(code: int) -> "str | None":
    """"ENOENT" for 2 (the fixed table of Linux values); None if unknown."""
    e = _LINUX_ERRNO.get(code)
    return e[0] if e else None


def errno_number(name: str) -> "int | None":
    """2 for "ENOENT"; None if unknown."""
    return _BY_NAME.get(name)


def strerror(code: int) -> str:
    """The Linux text for an errno value ("No such file or directory")."""
    e = _LINUX_ERRNO.get(code)
    return e[1] if e else f"Unknown error {code}"


# Linux errno values the classes below are chosen by (the shim's, whatever the host is).
class _errno:
    EPERM, ENOENT, ESRCH, EACCES, EBUSY, EEXIST = 1, 2, 3, 13, 16, 17
    ENOTDIR, EISDIR, EINVAL, EFBIG, ENOSPC, EROFS, EPIPE = 20, 21, 22, 27, 28, 30, 32
    ENAMETOOLONG, ENOSYS, ENOTEMPTY, EOPNOTSUPP = 36, 38, 39, 95
    ECONNABORTED, ECONNRESET, ETIMEDOUT, ECONNREFUSED, EDQUOT, ECANCELED = 103, 104, 110, 111, 122, 125


class SandboxError(Exception):
    """Base class of every error from the shim or from this package.

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
    """The shim or this package refused an argument (EINVAL and the like)."""


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


class SandboxOutputLimitError(SandboxError, OSError):
    """``commands.run(..., max_output=N)``: the command wrote more than N bytes to stdout
    or stderr (EFBIG). ``result`` is the CommandResult with the first N bytes of each
    and the ``*_truncated`` flags; pass ``truncate=True`` to get that result instead of
    this error."""

    result: object = None


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
