"""_core: argument checks shared by the sync and asyncio APIs."""

from __future__ import annotations

import os
from typing import Any, Optional, Union

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

ECANCELED = 125
ECONNABORTED = 103


def check_type(name: str, value: Any, types: Any, what: str) -> None:
    if not isinstance(value, types) or isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)
    ):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")


def check_bool(name: str, value: Any) -> bool:
    check_type(name, value, bool, "a bool")
    return value


def fspath(path: Any, name: str = "path", *, absolute: bool = True) -> bytes:
    """A sandbox path as bytes (str is encoded like os.fsencode). Paths are absolute."""
    if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
        p = os.fsencode(path)
    else:
        raise TypeError(f"{name} must be str, bytes or os.PathLike, not {type(path).__name__}")
    if not p:
        raise ValueError(f"{name} is empty")
    if b"\0" in p:
        raise ValueError(f"{name} contains a NUL byte")
    if absolute and not p.startswith(b"/"):
        raise ValueError(f"{name} must be an absolute path in the sandbox, got {os.fsdecode(p)!r}")
    return p


def text_arg(value: Any, name: str, *, empty: bool = True) -> str:
    """A str argument without NUL (bytes are decoded as UTF-8)."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8") from None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{name} contains a NUL byte")
    if not empty and not value:
        raise ValueError(f"{name} is empty")
    return value


def bytes_arg(value: Any, name: str) -> bytes:
    """A str (UTF-8) or bytes argument without NUL."""
    if isinstance(value, str):
        b = value.encode()
    elif isinstance(value, bytes):
        b = value
    else:
        raise TypeError(f"{name} must be str or bytes, not {type(value).__name__}")
    if b"\0" in b:
        raise ValueError(f"{name} contains a NUL byte")
    return b


def seconds(value: Optional[float], name: str = "timeout") -> Optional[float]:
    """A timeout in seconds (None: none); inf means none too."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if value != value or value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if value == float("inf"):
        return None
    return float(value)


def millis(value: Optional[float], name: str) -> Optional[int]:
    """Seconds to a request's *_ms field (None: the shim's default)."""
    s = seconds(value, name)
    if s is None:
        return None
    return min(max(int(s * 1000 + 0.999), 1), 2**32 - 1)


def check_abort(abort: Any) -> None:
    if abort is not None and not callable(getattr(abort, "is_set", None)):
        raise TypeError(f"abort must be a threading.Event or asyncio.Event, not {type(abort).__name__}")


def text(b: Optional[Union[bytes, str]]) -> str:
    if b is None:
        return ""
    if isinstance(b, str):
        return b
    return b.decode("utf-8", "replace")
