"""client: Shim, one connection to a sandbox-shim."""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from . import _lib
from ._core import Core, cstr, raise_error, text, timeout_ms
from ._lib import lib
from .backups import Backups
from .commands import Commands, run_eval
from .files import Files
from .mounts import Mounts
from .types import ShimInfo

if TYPE_CHECKING:
    from .tunnels import TunnelEvent, TunnelHandle, TunnelInfo

__all__ = ["Shim"]


class Shim:
    """A connection to a sandbox-shim. Thread-safe: any number of threads may use
    one Shim at once (each call is its own stream on the connection).

    ::

        with Shim.connect("unix:/run/sandbox-shim.sock") as shim:
            shim.files.write_file("/workspace/notes.txt", "hello")
            print(shim.commands.run("cat /workspace/notes.txt").stdout)

    Namespaces: ``files`` (Files), ``commands`` (Commands), ``backups`` (Backups),
    ``mounts`` (Mounts); tunnels: ``tunnel()`` (sandbox -> host) and ``forward()``
    (host -> sandbox)."""

    files: Files
    commands: Commands
    backups: Backups
    mounts: Mounts

    def __init__(self, core: Core, target: str) -> None:
        self._core = core
        self.target = target
        self.files = Files(core)
        self.commands = Commands(core)
        self.backups = Backups(core)
        self.mounts = Mounts(core)

    @classmethod
    def connect(
        cls,
        target: Optional[str] = None,
        *,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        wait: Optional[float] = None,
        request_timeout: Optional[float] = None,
        client_name: Optional[str] = None,
    ) -> "Shim":
        """Connect and complete the handshake.

        ``target`` (default ``$SBX_TARGET``) is ``unix:PATH``, ``tcp:HOST:PORT``,
        ``vsock:CID:PORT``, ``fc:UDS_PATH:PORT`` (Firecracker hybrid vsock) or
        ``exec:COMMAND`` (e.g. ``exec:docker exec -i CTR sandbox-shim --stdio``).
        ``token`` defaults to ``$SBX_TOKEN``. ``timeout`` bounds one connect +
        handshake attempt (default 10 s); ``wait`` keeps retrying for that long while
        the shim is not there yet; ``request_timeout`` is every call's default."""
        if target is None:
            target = os.environ.get("SBX_TARGET")
            if not target:
                raise ValueError("no target given and SBX_TARGET is not set (e.g. unix:/run/sandbox-shim.sock)")
        t = cstr(target, "target")
        if not t:
            raise ValueError("target is empty")
        opts = _lib.SbxConnectOpts()
        opts.struct_size = ctypes.sizeof(opts)
        tok = cstr(token, "token") if token is not None else None
        opts.token = tok
        name = cstr(client_name, "client_name") if client_name is not None else None
        if name is None:
            from . import __version__

            name = f"sandbox_shim-python/{__version__}".encode()
        opts.client_name = name
        opts.connect_timeout_ms = max(timeout_ms(timeout), 0)
        opts.wait_ms = max(timeout_ms(wait, "wait"), 0)
        opts.default_timeout_ms = max(timeout_ms(request_timeout, "request_timeout"), 0)
        h = ctypes.c_void_p()
        err = _lib.SbxError()
        if lib.sbx_connect(t, ctypes.byref(opts), ctypes.byref(h), ctypes.byref(err)) < 0:
            raise_error(err)
        return cls(Core(h.value), target)

    # ---- lifetime ----

    def close(self) -> None:
        """Close the connection: calls in flight on other threads fail with
        SandboxConnectionError, open process handles are released (their commands
        killed), and later calls raise. Safe to call twice."""
        self._core.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._core.closed

    def __enter__(self) -> "Shim":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            core = self.__dict__.get("_core")
            if core is not None and not core.closed:
                core.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<Shim {self.target!r}{' closed' if self.closed else ''}>"

    # ---- what the shim is ----

    @property
    def server(self) -> Dict[str, Any]:
        """What the shim said in the handshake: protocol_version, shim_version,
        features, max_frame, pid, pid1, uid, hostname, boot_id."""
        with self._core.use():
            si = lib.sbx_client_server(self._core.handle).contents
            return {
                "protocol_version": si.protocol_version,
                "shim_version": text(si.shim_version or b""),
                "features": text(si.features or b"").split(),
                "max_frame": si.max_frame,
                "pid": si.pid,
                "pid1": bool(si.pid1),
                "uid": si.uid,
                "hostname": text(si.hostname or b""),
                "boot_id": text(si.boot_id or b""),
            }

    def has_feature(self, name: str) -> bool:
        """True if the shim announced this feature ("fs", "exec", "backup", ...)."""
        b = cstr(name, "name")
        with self._core.use():
            return bool(lib.sbx_client_has_feature(self._core.handle, b))

    def ping(self, *, timeout: Optional[float] = None, abort: Any = None) -> float:
        """Round trip to the shim; returns it in seconds."""
        rtt = ctypes.c_uint64()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_ping(s.handle, s.opts, ctypes.byref(rtt), s.err) < 0:
                s.fail()
        return rtt.value / 1e9

    def info(self, *, timeout: Optional[float] = None, abort: Any = None) -> ShimInfo:
        """The shim's state: versions, features, uptime, counts, RSS, load."""
        i = _lib.SbxInfo()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_info(s.handle, s.opts, ctypes.byref(i), s.err) < 0:
                s.fail()
        return ShimInfo(
            shim_version=text(i.shim_version),
            protocol_version=i.protocol_version,
            features=text(i.features).split(),
            uptime=i.uptime_ms / 1000,
            pid=i.pid,
            pid1=bool(i.pid1),
            uid=i.uid,
            gid=i.gid,
            hostname=text(i.hostname),
            boot_id=text(i.boot_id),
            connections=i.connections,
            streams=i.streams,
            processes=i.processes,
            mounts=i.mounts,
            rss_bytes=i.rss_bytes,
            load=list(i.load),
        )

    # ---- tunnels ----

    def tunnel(
        self,
        guest_port: int,
        local_port: int,
        local_host: str = "127.0.0.1",
        *,
        guest_host: str = "127.0.0.1",
        on_event: Optional[Callable[["TunnelEvent"], Any]] = None,
        connect_timeout: Optional[float] = None,
        backlog: Optional[int] = None,
    ) -> "TunnelHandle":
        """Sandbox -> host: the shim listens on ``guest_host:guest_port`` inside the
        sandbox (port 0: the kernel chooses; see the handle's ``port``) and relays
        every connection to ``local_host:local_port`` on this machine. Code inside
        connecting to 127.0.0.1:guest_port reaches the service here. ``on_event`` gets
        a TunnelEvent per connection (on libsbx's relay thread)."""
        from .tunnels import _port, open_tunnel

        gp, lp = _port("guest_port", guest_port, True), _port("local_port", local_port, False)
        return open_tunnel(self._core, "reverse", guest_host, gp, local_host, lp, on_event, connect_timeout, backlog)

    def forward(
        self,
        guest_port: int,
        local_port: int = 0,
        local_host: str = "127.0.0.1",
        *,
        guest_host: str = "127.0.0.1",
        on_event: Optional[Callable[["TunnelEvent"], Any]] = None,
        connect_timeout: Optional[float] = None,
        backlog: Optional[int] = None,
    ) -> "TunnelHandle":
        """Host -> sandbox: listen on ``local_host:local_port`` here (port 0: the kernel
        chooses; see the handle's ``port``) and relay every connection to
        ``guest_host:guest_port`` inside the sandbox -- a preview of a dev server."""
        from .tunnels import _port, open_tunnel

        gp, lp = _port("guest_port", guest_port, False), _port("local_port", local_port, True)
        return open_tunnel(self._core, "forward", guest_host, gp, local_host, lp, on_event, connect_timeout, backlog)

    def tunnels(self, *, timeout: Optional[float] = None, abort: Any = None) -> List["TunnelInfo"]:
        """Every tunnel the shim has (all clients'), oldest first."""
        from .tunnels import list_tunnels

        return list_tunnels(self._core, timeout, abort)

    def close_tunnel(self, tunnel_id: str, *, timeout: Optional[float] = None) -> None:
        """Close a tunnel by id, whichever client owns it."""
        from .tunnels import close_tunnel_id

        close_tunnel_id(self._core, tunnel_id, timeout)

    def eval(
        self,
        code: str,
        *,
        interpreter: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> str:
        """Run a code snippet through ``interpreter`` (default ``["python3", "-c"]``;
        the code is appended as the last argument) in a fresh process and return what
        it printed. A non-zero exit raises SandboxEvalError (a RuntimeError) whose
        message and ``stderr`` hold the snippet's stderr."""
        return run_eval(self._core, code, interpreter, timeout, abort)
