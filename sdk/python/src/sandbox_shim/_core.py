"""_core: the connection handle shared by every namespace, per-call options, cancel
tokens wired to ``abort=`` events, and the conversion of libsbx errors to exceptions."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

from . import _lib
from ._lib import lib
from .errors import (
    KIND_NAMES,
    SandboxAbortError,
    SandboxConnectionError,
    error_class,
)

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_H = TypeVar("_H", bound="HandleOwner")

ECANCELED = 125
ECONNABORTED = 103


# ---- argument checks ----


def check_type(name: str, value: Any, types: Any, what: str) -> None:
    if not isinstance(value, types) or isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)
    ):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")


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


def cstr(value: Any, name: str) -> bytes:
    """A str/bytes argument for C (no NUL)."""
    if isinstance(value, str):
        b = value.encode()
    elif isinstance(value, bytes):
        b = value
    else:
        raise TypeError(f"{name} must be str or bytes, not {type(value).__name__}")
    if b"\0" in b:
        raise ValueError(f"{name} contains a NUL byte")
    return b


def timeout_ms(timeout: Optional[float], name: str = "timeout") -> int:
    """Seconds (None: the client's default) to sbx_call_opts.timeout_ms (0: default)."""
    if timeout is None:
        return 0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(timeout).__name__}")
    if timeout != timeout or timeout <= 0:
        raise ValueError(f"{name} must be positive, got {timeout!r}")
    if timeout == float("inf"):
        return -1
    ms = int(timeout * 1000 + 0.999)
    if ms > 2**31 - 1:
        return -1
    return max(ms, 1)


def strv(items: List[bytes]) -> Any:
    """A NULL-terminated char* array (keep the result alive during the call)."""
    arr = (ctypes.c_char_p * (len(items) + 1))()
    for i, s in enumerate(items):
        arr[i] = s
    arr[len(items)] = None
    return arr


def text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def raise_error(err: _lib.SbxError, *, aborted: bool = False, closed: bool = False) -> None:
    """Raise the exception for a filled struct sbx_error."""
    kind = KIND_NAMES.get(err.kind, "remote")
    code = err.code
    name = lib.sbx_errno_name(code)
    errno_name = name.decode() if name else None
    msg = text(err.message) or (lib.sbx_strerror(code) or b"").decode()
    path = os.fsdecode(err.path) if err.path else None
    if code == ECANCELED and closed and not aborted:
        raise SandboxConnectionError(
            "the connection was closed", errno=ECONNABORTED, errno_name="ECONNABORTED", kind="local"
        )
    if code == ECANCELED and aborted:
        raise SandboxAbortError(msg or "aborted", errno=code, errno_name=errno_name, path=path, kind=kind)
    cls = error_class(kind, code)
    exc = cls(msg, errno=code, errno_name=errno_name, path=path, kind=kind)
    buf = ctypes.create_string_buffer(1536)
    lib.sbx_error_format(ctypes.byref(err), buf, len(buf))
    exc._formatted = os.fsdecode(buf.value)
    raise exc


# ---- abort= ----


def check_abort(abort: Any) -> None:
    if abort is not None and not callable(getattr(abort, "is_set", None)):
        raise TypeError(
            f"abort must be a threading.Event or asyncio.Event, not {type(abort).__name__}"
        )


class _AbortWatcher:
    """One thread that fires the cancel tokens of calls whose abort= event got set.

    threading.Event offers no callback, so the events are polled (every 5 ms while
    any call with abort= is in flight; the thread sleeps otherwise). Internal events
    (AbortLink, used by the async API) fire their tokens directly."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._items: Dict[int, Tuple[Any, "CallScope"]] = {}
        self._thread: Optional[threading.Thread] = None

    def add(self, event: Any, scope: "CallScope") -> None:
        with self._cv:
            self._items[id(scope)] = (event, scope)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sandbox_shim-abort", daemon=True)
                self._thread.start()
            self._cv.notify()

    def remove(self, scope: "CallScope") -> None:
        with self._cv:
            self._items.pop(id(scope), None)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items:
                    self._cv.wait()
                items = list(self._items.values())
            for event, scope in items:
                try:
                    if event.is_set():
                        scope.fire_abort()
                except Exception:  # a broken event object must not kill the watcher
                    pass
            time.sleep(0.005)


_watcher = _AbortWatcher()


class AbortLink:
    """An abort event the async API fires itself: firing cancels the attached call
    at once, without polling."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._scopes: List["CallScope"] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            self._set = True
            scopes = list(self._scopes)
        for s in scopes:
            s.fire_abort()

    def attach(self, scope: "CallScope") -> None:
        with self._lock:
            self._scopes.append(scope)
            fire = self._set
        if fire:
            scope.fire_abort()

    def detach(self, scope: "CallScope") -> None:
        with self._lock:
            if scope in self._scopes:
                self._scopes.remove(scope)


class CallScope:
    """One call in flight: its cancel token, its sbx_call_opts, and its error struct."""

    def __init__(self, core: "Core", timeout: int) -> None:
        self.core = core
        self.token = lib.sbx_cancel_new()
        if not self.token:
            raise MemoryError("sbx_cancel_new")
        self.opts = _lib.SbxCallOpts(timeout, self.token)
        self.err = _lib.SbxError()
        self.aborted = False
        self._lock = threading.Lock()
        self._freed = False

    @property
    def handle(self) -> int:
        return self.core.handle

    def fire_abort(self) -> None:
        with self._lock:
            if self._freed:
                return
            self.aborted = True
            lib.sbx_cancel_fire(self.token)

    def fire_close(self) -> None:
        with self._lock:
            if not self._freed:
                lib.sbx_cancel_fire(self.token)

    def free(self) -> None:
        with self._lock:
            self._freed = True
            lib.sbx_cancel_free(self.token)
            self.token = None

    def fail(self) -> None:
        """Raise the exception for self.err."""
        raise_error(self.err, aborted=self.aborted, closed=self.core.closed)


class HandleOwner:
    """Base of the objects that own a libsbx handle (``_h``) on a client (``_core``):
    a context manager whose exit calls close(), and a handle still open when the object
    is collected is closed then, unless the client is closed already."""

    _h: int
    _core: "Core"

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._h and not self._core.closed:
                self.close()
        except Exception:
            pass


class Core:
    """The libsbx client and what is needed to close it safely while other threads
    may still be in calls. Every call is a "use"; close() fires the cancel token of
    everything in flight (calls and open process handles), waits for the uses to
    end, runs the closers (freeing process handles), then closes the client."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.closed = False
        self._cv = threading.Condition()
        self._uses = 0
        self._fireables: Dict[int, Any] = {}  # objects with fire_close()
        self._closers: Dict[int, Callable[[], None]] = {}
        # held while the client is torn down, and by whoever frees a handle that lives
        # on the client (a process, a tunnel): such a free never overlaps the client's
        self.lifecycle = threading.RLock()

    @contextmanager
    def use(self) -> Iterator[None]:
        """Hold the client open for the duration of a C call."""
        with self._cv:
            if self.closed:
                raise SandboxConnectionError(
                    "the connection is closed", errno=ECONNABORTED, errno_name="ECONNABORTED", kind="local"
                )
            self._uses += 1
        try:
            yield
        finally:
            with self._cv:
                self._uses -= 1
                self._cv.notify_all()

    def new_scope(self, timeout: Optional[float] = None) -> CallScope:
        """A long-lived scope (a process handle's token), fired on close()."""
        scope = CallScope(self, timeout_ms(timeout))
        with self._cv:
            self._fireables[id(scope)] = scope
        return scope

    def drop_scope(self, scope: CallScope) -> None:
        with self._cv:
            self._fireables.pop(id(scope), None)
        scope.free()

    @contextmanager
    def call(self, *, timeout: Optional[float] = None, abort: Any = None) -> Iterator[CallScope]:
        """Enter a call: yields a scope whose ``opts`` go to the C function."""
        check_abort(abort)
        ms = timeout_ms(timeout)
        if abort is not None and abort.is_set():
            raise SandboxAbortError("aborted before it started", errno=ECANCELED, errno_name="ECANCELED", kind="local")
        with self.use():
            scope = CallScope(self, ms)
            with self._cv:
                self._fireables[id(scope)] = scope
                if self.closed:
                    scope.fire_close()
            try:
                if isinstance(abort, AbortLink):
                    abort.attach(scope)
                elif abort is not None:
                    _watcher.add(abort, scope)
                try:
                    yield scope
                finally:
                    if isinstance(abort, AbortLink):
                        abort.detach(scope)
                    elif abort is not None:
                        _watcher.remove(scope)
            finally:
                with self._cv:
                    self._fireables.pop(id(scope), None)
                scope.free()

    def register_closer(self, key: int, fn: Callable[[], None]) -> None:
        with self._cv:
            self._closers[key] = fn

    def unregister_closer(self, key: int) -> None:
        with self._cv:
            self._closers.pop(key, None)

    def close(self) -> None:
        with self._cv:
            if self.closed:
                return
            self.closed = True
            while True:
                for f in list(self._fireables.values()):
                    f.fire_close()
                if self._uses == 0:
                    break
                self._cv.wait(0.05)
        with self.lifecycle:
            # taken under the lock: a handle freed by its owner meanwhile has left the
            # list, one not freed yet is freed here, before the client goes
            with self._cv:
                closers = list(self._closers.values())
                self._closers.clear()
            for fn in closers:
                try:
                    fn()
                except Exception:
                    pass
            lib.sbx_client_close(self.handle)
            self.handle = 0
