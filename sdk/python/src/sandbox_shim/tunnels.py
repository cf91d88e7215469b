"""tunnels: TCP relayed over the shim connection, both directions (``shim.tunnel()``,
``shim.forward()``)."""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from . import _lib
from ._core import Core, HandleOwner, check_type, cstr, raise_error, text, timeout_ms
from ._lib import lib
from .errors import SandboxError, SandboxUnsupportedError

__all__ = ["TunnelHandle", "TunnelEvent", "TunnelInfo", "open_tunnel", "list_tunnels", "close_tunnel_id"]

EVENT_TYPES = {1: "open", 2: "close", 3: "fail"}
KINDS = {1: "forward", 2: "reverse"}


@dataclass(frozen=True)
class TunnelEvent:
    """One connection through a tunnel: ``type`` "open", "close" or "fail" (could not
    be made: ``error`` says why); byte counts on "close"."""

    type: str
    conn: int
    from_addr: str
    to_addr: str
    bytes_in: int
    bytes_out: int
    error: Optional[SandboxError]


@dataclass(frozen=True)
class TunnelInfo:
    """A tunnel the shim has (any client's)."""

    id: str
    kind: str
    host: str
    port: int
    remote: str
    client: str
    active: int
    total: int
    bytes_in: int
    bytes_out: int


def _port(name: str, v: Any, zero_ok: bool) -> int:
    check_type(name, v, int, "an int")
    if not (0 if zero_ok else 1) <= v <= 65535:
        raise ValueError(f"{name} must be between {0 if zero_ok else 1} and 65535, got {v}")
    return int(v)


def _host(name: str, v: Any) -> bytes:
    b = cstr(v, name)
    if not b:
        raise ValueError(f"{name} is empty")
    return b


def _error(e: Any) -> Optional[SandboxError]:
    if not e:
        return None
    try:
        raise_error(e.contents)
    except SandboxError as x:
        return x
    return None


class TunnelHandle(HandleOwner):
    """An open tunnel. ``kind`` is "reverse" (code in the sandbox reaches a port on
    this host: shim.tunnel()) or "forward" (this host reaches a port in the sandbox:
    shim.forward()); ``port`` is the port listened on (in the sandbox for reverse, on
    this host for forward). The relay runs on a background thread of libsbx. Close it
    with close() (or a ``with`` block); closing the Shim closes it too."""

    def __init__(self, core: Core, handle: int, kind: str, log_fn: Any, listen_host: str, target: str) -> None:
        self._core = core
        self._h = handle
        self._log_fn = log_fn  # keeps the ctypes callback alive
        self._cv = threading.Condition()
        self._busy = 0
        self.kind = kind
        self.tunnel_id: str = text(lib.sbx_tunnel_id(handle) or b"")
        self.port: int = lib.sbx_tunnel_port(handle)
        self.listen_host = listen_host
        self.target = target
        core.register_closer(id(self), self._close)

    @property
    def id(self) -> str:
        """The shim's id for the tunnel ("t3"), as tunnel_id."""
        return self.tunnel_id

    def __repr__(self) -> str:
        return f"<TunnelHandle {self.tunnel_id} {self.kind} {self.listen_host}:{self.port} -> {self.target}>"

    @property
    def closed(self) -> bool:
        """True once the handle was closed (by close() or by closing the Shim)."""
        return not self._h

    # libsbx frees the tunnel in sbx_tunnel_close(): no other call on it may overlap,
    # so calls hold the handle (_enter/_leave) and _close waits for them to leave.
    def _enter(self) -> int:
        with self._cv:
            if self._h:
                self._busy += 1
            return self._h

    def _leave(self) -> None:
        with self._cv:
            self._busy -= 1
            self._cv.notify_all()

    @property
    def active(self) -> int:
        """Connections open now."""
        h = self._enter()
        if not h:
            return 0
        try:
            return lib.sbx_tunnel_active(h)
        finally:
            self._leave()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the tunnel to end by itself (closed by id elsewhere, the shim going
        away). Returns True if it still runs after ``timeout`` seconds (None: no
        limit), False if it ended or was closed; raises if it ended on an error."""
        if timeout is not None:
            timeout_ms(timeout)  # checks the value
        deadline = None if timeout is None else time.monotonic() + timeout
        err = _lib.SbxError()
        while True:
            h = self._enter()
            if not h:
                return False
            try:
                left = 100 if deadline is None else max(0, min(100, int((deadline - time.monotonic()) * 1000)))
                rc = lib.sbx_tunnel_wait(h, left, ctypes.byref(err))
            finally:
                self._leave()
            if rc < 0:
                raise_error(err)
            if rc == 0:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return True

    def _close(self) -> None:
        with self._core.lifecycle:  # never while the client is being closed
            with self._cv:
                h, self._h = self._h, 0
                while self._busy:  # a wait() slice ends within 0.1 s
                    self._cv.wait(0.05)
            self._core.unregister_closer(id(self))
            if h:
                lib.sbx_tunnel_close(h)

    def close(self) -> None:
        """Close the tunnel and every connection it carries. Safe to call twice."""
        self._close()


def open_tunnel(
    core: Core,
    kind: str,
    guest_host: Any,
    guest_port: int,
    local_host: Any,
    local_port: int,
    on_event: Optional[Callable[[TunnelEvent], Any]],
    connect_timeout: Optional[float],
    backlog: Optional[int],
) -> TunnelHandle:
    if not lib.has("sbx_forward_open"):
        raise SandboxUnsupportedError("this libsbx has no tunnel API", errno=38, errno_name="ENOSYS", kind="local")
    gh, lh = _host("guest_host", guest_host), _host("local_host", local_host)
    if on_event is not None and not callable(on_event):
        raise TypeError("on_event must be callable")
    to = _lib.SbxTunnelOpts()
    to.struct_size = ctypes.sizeof(to)
    log_fn = None
    if on_event is not None:

        def cb(ud: Any, t: Any, evp: Any) -> None:
            try:
                ev = evp.contents
                on_event(TunnelEvent(EVENT_TYPES.get(ev.type, str(ev.type)), ev.conn, text(ev.from_ or b""),
                                     text(ev.to or b""), ev.bytes_in, ev.bytes_out, _error(ev.err)))
            except Exception:
                pass  # a logging callback must not break the relay

        log_fn = _lib.TUNNEL_LOG_FN(cb)
        to.log = log_fn
    if connect_timeout is not None:
        to.connect_timeout_ms = max(timeout_ms(connect_timeout, "connect_timeout"), 0)
    if backlog is not None:
        check_type("backlog", backlog, int, "an int")
        if backlog < 1:
            raise ValueError("backlog must be positive")
        to.backlog = backlog
    h = ctypes.c_void_p()
    err = _lib.SbxError()
    with core.use():
        if kind == "reverse":
            rc = lib.sbx_reverse_open(core.handle, gh, guest_port, lh, local_port, ctypes.byref(to), ctypes.byref(h), ctypes.byref(err))
        else:
            rc = lib.sbx_forward_open(core.handle, lh, local_port, gh, guest_port, ctypes.byref(to), ctypes.byref(h), ctypes.byref(err))
        if rc < 0:
            raise_error(err)
    if kind == "reverse":
        return TunnelHandle(core, h.value, kind, log_fn, gh.decode(), f"{lh.decode()}:{local_port}")
    return TunnelHandle(core, h.value, kind, log_fn, lh.decode(), f"{gh.decode()}:{guest_port}")


def list_tunnels(core: Core, timeout: Optional[float], abort: Any) -> List[TunnelInfo]:
    if not lib.has("sbx_tunnels_list"):
        raise SandboxUnsupportedError("this libsbx has no tunnel API", errno=38, errno_name="ENOSYS", kind="local")
    arr = ctypes.POINTER(_lib.SbxTunnelInfo)()
    n = ctypes.c_size_t()
    with core.call(timeout=timeout, abort=abort) as s:
        if lib.sbx_tunnels_list(s.handle, s.opts, ctypes.byref(arr), ctypes.byref(n), s.err) < 0:
            s.fail()
    try:
        out = []
        for i in range(n.value):
            t = arr[i]
            out.append(TunnelInfo(text(t.id), KINDS.get(t.kind, str(t.kind)), text(t.host), t.port, text(t.remote),
                                  text(t.client), t.active, t.total, t.bytes_in, t.bytes_out))
        return out
    finally:
        if arr:
            lib.libc.free(arr)


def close_tunnel_id(core: Core, id: str, timeout: Optional[float]) -> None:
    b = cstr(id, "id")
    if not b:
        raise ValueError("id is empty")
    with core.call(timeout=timeout) as s:
        if lib.sbx_tunnel_close_id(s.handle, s.opts, b, s.err) < 0:
            s.fail()
