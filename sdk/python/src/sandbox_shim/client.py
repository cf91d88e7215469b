"""client: Shim, one connection to a sandbox-shim."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Union

from . import _ops, _pb
from ._core import check_abort, seconds, text_arg
from ._protocol import Protocol
from ._sync import Engine
from .backups import Backups
from .commands import Commands, run_eval
from .files import Files
from .mounts import Mounts
from .transports import open_transport
from .types import ServerInfo, ShimInfo, SnapshotResult

if TYPE_CHECKING:
    from .tunnels import TunnelEvent, TunnelHandle, TunnelInfo

__all__ = ["Shim"]

DEFAULT_CONNECT_TIMEOUT = 10.0


def client_name_of(client_name: Optional[str]) -> str:
    if client_name is not None:
        return text_arg(client_name, "client_name")
    from . import __version__

    return f"sandbox_shim-python/{__version__}"


def target_of(target: Optional[str]) -> str:
    if target is None:
        target = os.environ.get("SBX_TARGET")
        if not target:
            raise ValueError("no target given and SBX_TARGET is not set (e.g. unix:/run/sandbox-shim/shim.sock)")
    t = text_arg(target, "target")
    if not t:
        raise ValueError("target is empty")
    return t


def token_of(token: Optional[Union[str, bytes]], target: Any = None) -> Optional[bytes]:
    """The token to send: the given one, else ``$SBX_TOKEN`` -- but never ``$SBX_TOKEN``
    to an ``exec:`` target (or ``$SBX_TARGET``), whose command we spawn ourselves."""
    if token is None:
        t = os.environ.get("SBX_TARGET") if target is None else target
        if isinstance(t, str) and t.startswith("exec:"):
            return None
        token = os.environ.get("SBX_TOKEN") or None
        if token is None:
            return None
    if isinstance(token, str):
        token = token.encode()
    if not isinstance(token, bytes):
        raise TypeError(f"token must be str or bytes, not {type(token).__name__}")
    return token


def is_transport(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("read", "write", "close"))


class Shim:
    """A connection to a sandbox-shim. Thread-safe: any number of threads may use
    one Shim at once (each call is its own stream on the connection).

    ::

        with Shim.connect("unix:/run/sandbox-shim/shim.sock") as shim:
            shim.files.write_file("/workspace/notes.txt", "hello")
            print(shim.commands.run("cat /workspace/notes.txt").stdout)

    Namespaces: ``files`` (Files), ``commands`` (Commands), ``backups`` (Backups),
    ``mounts`` (Mounts); tunnels: ``tunnel()`` (sandbox -> host) and ``forward()``
    (host -> sandbox). The namespaces keep the connection alive: it closes when
    close() is called (or a ``with`` block ends), or once nothing refers to the Shim
    or any of its namespaces and handles any more."""

    files: Files
    commands: Commands
    backups: Backups
    mounts: Mounts

    def __init__(self, engine: Engine, target: str) -> None:
        self._e = engine
        self.target = target
        self.files = Files(engine)
        self.commands = Commands(engine)
        self.backups = Backups(engine)
        self.mounts = Mounts(engine)
        assert engine.proto.server is not None
        self._server = ServerInfo._from_pb(engine.proto.server)

    @classmethod
    def connect(
        cls,
        target: Any = None,
        *,
        token: Optional[Union[str, bytes]] = None,
        timeout: Optional[float] = None,
        wait: Optional[float] = None,
        request_timeout: Optional[float] = None,
        client_name: Optional[str] = None,
        exec_stderr: Any = None,
    ) -> "Shim":
        """Connect and complete the handshake.

        ``target`` (default ``$SBX_TARGET``) is ``unix:PATH``, ``tcp:HOST:PORT``,
        ``vsock:CID:PORT``, ``fc:UDS_PATH:PORT`` (Firecracker hybrid vsock) or
        ``exec:COMMAND`` (e.g. ``exec:docker exec -i CTR sandbox-shim --stdio``), or a
        transport object of your own (``read(n)``, ``write(data)``, ``close()``; see
        :mod:`sandbox_shim.transports`). ``token`` defaults to ``$SBX_TOKEN``
        (not for ``exec:``: its command gets no ``SBX_TOKEN``/``SBX_TOKEN_FILE`` and
        its HELLO a token only when one is given here).
        ``timeout`` bounds one connect + handshake attempt (default 10 s); ``wait``
        keeps retrying for that long while the shim is not there yet;
        ``request_timeout`` is every call's default. ``exec_stderr``: where an
        ``exec:`` command's stderr goes (None: kept for error messages, not mixed
        into ours; "inherit": ours; or a file object)."""
        ct = seconds(timeout) or DEFAULT_CONNECT_TIMEOUT
        w = seconds(wait, "wait")
        tok = token_of(token, target)
        name = client_name_of(client_name)
        rt = seconds(request_timeout, "request_timeout")
        if is_transport(target):
            return cls._over(target, "transport", tok, name, ct, rt)
        t = target_of(target)
        import time

        deadline = None if w is None else time.monotonic() + w
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            tr = open_transport(t, timeout=ct, wait=left, exec_stderr=exec_stderr)
            try:
                return cls._over(tr, t, tok, name, ct, rt)
            except Exception as e:
                # a shim that closes during the handshake may just be starting: retry within wait
                if deadline is not None and time.monotonic() < deadline and getattr(e, "errno", 0) == 104:
                    time.sleep(0.05)
                    continue
                tail = getattr(tr, "stderr_tail", None)
                if tail is not None and tail() and getattr(e, "kind", "") == "connect":
                    e.message = f"{e.message}; the command said: {tail()[-500:]}"  # type: ignore[attr-defined]
                    e.args = (e.message,)  # type: ignore[attr-defined]
                raise

    @classmethod
    def _over(cls, transport: Any, target: str, token: Optional[bytes], name: str, timeout: float,
              request_timeout: Optional[float]) -> "Shim":
        proto = Protocol(client_name=name, token=token)
        eng = Engine(transport, proto)
        eng.default_timeout = request_timeout
        eng.handshake(timeout)
        return cls(eng, target)

    # ---- lifetime ----

    def close(self) -> None:
        """Close the connection: calls in flight on other threads fail with
        SandboxConnectionError, open process handles are released (their commands
        killed), and later calls raise. Safe to call twice."""
        self._e.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._e.closed

    def __enter__(self) -> "Shim":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Shim {self.target!r}{' closed' if self.closed else ''}>"

    # ---- what the shim is ----

    @property
    def server(self) -> ServerInfo:
        """What the shim said in the handshake (a ServerInfo)."""
        return self._server

    def has_feature(self, name: str) -> bool:
        """True if the shim announced this feature ("fs", "exec", "backup", ...)."""
        return text_arg(name, "name") in self._server.features

    def ping(self, *, timeout: Optional[float] = None, abort: Any = None) -> float:
        """Round trip to the shim; returns it in seconds."""
        check_abort(abort)
        return self._e.ping(seconds(timeout), abort)

    def info(self, *, timeout: Optional[float] = None, abort: Any = None) -> ShimInfo:
        """The shim's state: versions, features, uptime, counts, RSS, load."""
        check_abort(abort)
        res = self._e.request(_pb.Request(info=_pb.InfoRequest()), timeout=seconds(timeout), abort=abort)
        return _ops.info_result(_ops.expect(res, "info"))

    # ---- microVM snapshots (PROTOCOL.md 12.6) ----

    def snapshot_prepare(
        self,
        *,
        freeze: Optional[Sequence[Any]] = None,
        thaw_after: Optional[float] = None,
        stop_background: bool = False,
        flush_timeout: Optional[float] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> SnapshotResult:
        """Before the host snapshots the VM: the shim syncs, flushes its mounts' pending
        uploads (``flush_timeout`` seconds, default 60), freezes the filesystems mounted
        at the ``freeze`` paths (FIFREEZE) and, with ``stop_background``, SIGSTOPs the
        process group of every detached command -- until resumed(), or ``thaw_after``
        seconds (default 30) after which it thaws and continues everything itself. A
        prepare already held raises SandboxBusyError (EBUSY); a path that is no mount
        point SandboxInvalidArgumentError; "/", or the filesystem of the shim's state
        directory or log, EBUSY. After any failure nothing is frozen or stopped."""
        check_abort(abort)
        req = _ops.snapshot_prepare_req(freeze, thaw_after, stop_background, flush_timeout)
        res = self._e.request(req, timeout=seconds(timeout), abort=abort)
        return _ops.snapshot_prepare_result(_ops.expect(res, "snapshot_prepare"))

    def resumed(
        self,
        *,
        time: Optional[float] = None,
        entropy: Optional[bytes] = None,
        fork: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> SnapshotResult:
        """The host's first request after a resume (or in a fork), on a new connection
        (a snapshot resets vsock): the shim sets its clock to ``time`` (seconds since
        the epoch; default this host's clock now) when it has CAP_SYS_TIME, credits
        ``entropy`` (32..512 bytes; default 64 from os.urandom) when root -- either not
        allowed is a step with error EPERM, not an exception -- bumps the generation
        (``info().generation``, ``server.generation`` of new connections), thaws what
        snapshot_prepare() froze and continues what it stopped. A time before 1970 or
        more than 10 years ahead, or entropy outside 32..512 bytes:
        SandboxInvalidArgumentError. Without a prepare it works, with nothing to undo."""
        check_abort(abort)
        req = _ops.resumed_req(time, entropy, fork)
        res = self._e.request(req, timeout=seconds(timeout), abort=abort)
        return _ops.resumed_result(_ops.expect(res, "resumed"))

    # ---- tunnels ----

    def tunnel(
        self,
        guest_port: int,
        local_port: int,
        local_host: str = "127.0.0.1",
        *,
        guest_host: str = "localhost",
        on_event: Optional[Callable[["TunnelEvent"], Any]] = None,
        connect_timeout: Optional[float] = None,
        backlog: Optional[int] = None,
    ) -> "TunnelHandle":
        """Sandbox -> host: the shim listens on ``guest_host:guest_port`` inside the
        sandbox (port 0: the kernel chooses; see the handle's ``port``) and relays
        every connection to ``local_host:local_port`` on this machine. Code inside
        connecting to localhost:guest_port reaches the service here (``localhost``, the
        default, listens on 127.0.0.1 and ::1 both, and is refused if either is taken). ``on_event`` gets
        a TunnelEvent per connection (on the tunnel's relay thread)."""
        from .tunnels import open_tunnel

        return open_tunnel(self._e, "reverse", guest_host, guest_port, local_host, local_port, on_event,
                           connect_timeout, backlog)

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
        from .tunnels import open_tunnel

        return open_tunnel(self._e, "forward", guest_host, guest_port, local_host, local_port, on_event,
                           connect_timeout, backlog)

    def tunnels(self, *, timeout: Optional[float] = None, abort: Any = None) -> List["TunnelInfo"]:
        """Every tunnel the shim has (all clients'), oldest first."""
        from .tunnels import tunnel_info

        check_abort(abort)
        res = self._e.request(_pb.Request(tunnels=_pb.TunnelListRequest()), timeout=seconds(timeout), abort=abort)
        return [tunnel_info(t) for t in _ops.expect(res, "tunnels").tunnels]

    def close_tunnel(self, tunnel_id: str, *, timeout: Optional[float] = None) -> None:
        """Close a tunnel by id, whichever client owns it."""
        i = _ops.id_arg(tunnel_id, "tunnel_id")
        self._e.request(_pb.Request(tunnel_close=_pb.TunnelCloseRequest(tunnel_id=i)), timeout=seconds(timeout))

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
        return run_eval(self._e, code, interpreter, timeout, abort)
