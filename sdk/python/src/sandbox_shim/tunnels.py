"""tunnels: TCP relayed over the shim connection, both directions (``shim.tunnel()``,
``shim.forward()``).

A tunnel is one long-lived stream (tunnel_listen or tunnel_forward, PROTOCOL.md 12.5);
every TCP connection it carries is a stream of its own (tunnel_accept or
tunnel_connect), relayed between a socket on this host and the shim with the usual
per-stream credit, so a slow reader at either end stalls only its own connection.

Sync side (TunnelHandle): per tunnel one thread watching the tunnel's stream (reverse:
the shim's tunnel_incoming events), for a forward tunnel one more accepting on the local
listener, and one thread delivering on_event calls in order; per relayed connection two
threads, socket -> stream and stream -> socket. Asyncio side (AsyncTunnelHandle): the same
with tasks.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import queue
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Set, Tuple

from . import _pb
from ._core import check_type, seconds
from ._ops import TUNNEL_KINDS
from ._protocol import Data, StreamEvent, make_error
from .errors import SandboxError

__all__ = ["TunnelHandle", "AsyncTunnelHandle", "TunnelEvent", "TunnelInfo", "open_tunnel", "open_tunnel_async",
           "tunnel_info"]

EXTRA_WINDOW = 256 << 10  # the extra credit the shim gets on a connection (PROTOCOL.md 12.5)
READ_MAX = 256 << 10      # one recv() from a local socket
MAX_CONNS = 1024          # per tunnel; more wait in the listen backlog
OPEN_TIMEOUT = 30.0       # the shim's tunnel_ready, when the connection has no default timeout
CONNECT_TIMEOUT = 10.0    # reverse: connecting to the local address, by default
CLOSE_WAIT = 5.0          # close(): how long the shim's confirmation and the threads may take
REFUSE_WAIT = 5.0         # a refused connection: how long its Result{done} may take
ECONNABORTED, ETIMEDOUT, EADDRNOTAVAIL, EPROTO, EINVAL = 103, 110, 99, 71, 22
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
CONNECTING = {0, _errno.EINPROGRESS, _errno.EAGAIN, _errno.EALREADY, _errno.EWOULDBLOCK,
              getattr(_errno, "WSAEWOULDBLOCK", -1)}


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


def tunnel_info(t: Any) -> TunnelInfo:
    return TunnelInfo(t.tunnel_id, TUNNEL_KINDS.get(t.kind, str(t.kind)), t.host, t.port, t.remote or "",
                      t.client or "", t.active or 0, t.total or 0, t.bytes_in or 0, t.bytes_out or 0)


# ---- arguments ----


def _port(name: str, v: Any, zero_ok: bool) -> int:
    check_type(name, v, int, "an int")
    if not (0 if zero_ok else 1) <= v <= 65535:
        raise ValueError(f"{name} must be between {0 if zero_ok else 1} and 65535, got {v}")
    return int(v)


def _host(name: str, v: Any) -> str:
    if isinstance(v, bytes):
        try:
            v = v.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8") from None
    if not isinstance(v, str):
        raise TypeError(f"{name} must be str or bytes, not {type(v).__name__}")
    if "\0" in v:
        raise ValueError(f"{name} contains a NUL byte")
    if not v:
        raise ValueError(f"{name} is empty")
    return v


class _Args:
    """open_tunnel()'s arguments, checked (as the old libsbx-based API did)."""

    def __init__(self, kind: str, guest_host: Any, guest_port: Any, local_host: Any, local_port: Any,
                 on_event: Any, connect_timeout: Any, backlog: Any) -> None:
        if kind not in ("reverse", "forward"):
            raise ValueError(f"kind must be 'reverse' or 'forward', got {kind!r}")
        rev = kind == "reverse"
        self.kind = kind
        self.guest_port = _port("guest_port", guest_port, rev)
        self.local_port = _port("local_port", local_port, not rev)
        self.guest_host = _host("guest_host", guest_host)
        self.local_host = _host("local_host", local_host)
        if on_event is not None and not callable(on_event):
            raise TypeError("on_event must be callable")
        self.on_event: Optional[Callable[[TunnelEvent], Any]] = on_event
        self.connect_timeout = seconds(connect_timeout, "connect_timeout")
        if backlog is not None:
            check_type("backlog", backlog, int, "an int")
            if backlog < 1:
                raise ValueError("backlog must be positive")
        self.backlog: Optional[int] = backlog
        if rev:
            self.listen_host, self.target = self.guest_host, f"{self.local_host}:{self.local_port}"
        else:
            self.listen_host, self.target = self.local_host, f"{self.guest_host}:{self.guest_port}"

    def timeout_ms(self) -> Optional[int]:
        s = self.connect_timeout
        return None if s is None else min(max(int(s * 1000 + 0.999), 1), 2**32 - 1)


# ---- helpers ----


def _fmt(addr: Any) -> str:
    """A socket address as "host:port" ("[v6]:port")."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        h = str(addr[0])
        return f"[{h}]:{addr[1]}" if ":" in h else f"{h}:{addr[1]}"
    return str(addr)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _local_error(e: BaseException, what: str, path: Optional[str]) -> SandboxError:
    if isinstance(e, SandboxError):
        return e
    if isinstance(e, socket.timeout):
        code = ETIMEDOUT
    else:
        code = getattr(e, "errno", None) or 5
    msg = f"{what}: {os.strerror(code)}" if code else what
    return make_error("local", code, msg, None if path is None else path.encode())


def _resolve(host: str, port: int, passive: bool) -> Tuple[int, Any]:
    """host ([v6] allowed) and port to one (family, sockaddr), as libsbx did."""
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    flags = socket.AI_NUMERICSERV | (socket.AI_PASSIVE if passive else 0)
    try:
        ai = socket.getaddrinfo(h, port, 0, socket.SOCK_STREAM, 0, flags)
    except socket.gaierror as e:
        raise make_error("local", EADDRNOTAVAIL, f"cannot resolve {host}: {e.strerror}", host.encode()) from None
    except UnicodeError:
        raise make_error("local", EINVAL, f"cannot resolve {host}: not a valid host name", host.encode()) from None
    if not ai:
        raise make_error("local", EADDRNOTAVAIL, f"cannot resolve {host}", host.encode())
    return ai[0][0], ai[0][4]


def _listen(host: str, port: int, backlog: Optional[int]) -> socket.socket:
    family, addr = _resolve(host, port, True)
    return _listen_addr(family, addr, backlog)


def _listen_addr(family: int, addr: Any, backlog: Optional[int]) -> socket.socket:
    where = _fmt(addr)
    s = None
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(backlog or 128)
        s.setblocking(False)
    except OSError as e:
        if s is not None:
            s.close()
        raise _local_error(e, f"cannot listen on {where}", where) from None
    return s


def _nodelay(s: socket.socket) -> None:
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _close_sock(s: Optional[socket.socket], reset: bool) -> None:
    """Close; with reset the other end sees RST, not a clean end (the connection failed)."""
    if s is None:
        return
    try:
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


def _feature_check(engine: Any) -> None:
    srv = engine.proto.server
    if srv is not None and "tunnel" not in list(srv.features or ()):
        raise make_error("remote", 38, 'this shim has no tunnels (feature "tunnel")')


def _tunnel_request(a: _Args, remote: str) -> "_pb.Request":
    if a.kind == "reverse":
        return _pb.Request(tunnel_listen=_pb.TunnelListenRequest(host=a.guest_host, port=a.guest_port,
                                                                 backlog=a.backlog, remote=remote))
    return _pb.Request(tunnel_forward=_pb.TunnelForwardRequest(host=a.guest_host, port=a.guest_port, remote=remote))


def _ready_of(it: Any) -> "_pb.TunnelReady":
    if it is None or type(it) is not StreamEvent or it.event.which_kind() != "tunnel_ready":
        raise make_error("protocol", EPROTO, "expected the tunnel_ready event" if it is not None
                         else "the shim ended the tunnel at once")
    return it.event.tunnel_ready


def _connected_of(it: Any) -> "_pb.TunnelConnected":
    if it is None:
        raise make_error("protocol", EPROTO, "the shim ended the connection early")
    if type(it) is not StreamEvent or it.event.which_kind() != "tunnel_connected":
        raise make_error("protocol", EPROTO, "expected the tunnel_connected event")
    return it.event.tunnel_connected


def _aborted(tid: str) -> SandboxError:
    return make_error("local", ECONNABORTED, f"tunnel {tid} closed")


class _Conn:
    """One relayed connection (both sides share it)."""

    def __init__(self, no: int, from_addr: str, to_addr: str) -> None:
        self.no = no
        self.from_addr = from_addr
        self.to_addr = to_addr
        self.sock: Any = None
        self.call: Any = None
        self.relaying = False
        self.stopping = False   # we end it: the reader's EOF is not the peer's
        self.cause: Optional[SandboxError] = None  # why it ended, when we know better than the stream
        self.bytes_in = 0       # local socket -> shim
        self.bytes_out = 0      # shim -> local socket
        self.finished = False

    def event(self, type_: str, error: Optional[SandboxError], counts: Any = None) -> TunnelEvent:
        bi, bo = (counts.bytes_in, counts.bytes_out) if counts is not None else (self.bytes_in, self.bytes_out)
        return TunnelEvent(type_, self.no, self.from_addr, self.to_addr, bi or 0, bo or 0, error)


# ======================================================================
# sync
# ======================================================================


class TunnelHandle:
    """An open tunnel. ``kind`` is "reverse" (code in the sandbox reaches a port on
    this host: shim.tunnel()) or "forward" (this host reaches a port in the sandbox:
    shim.forward()); ``port`` is the port listened on (in the sandbox for reverse, on
    this host for forward). The relay runs on background threads. Close it with
    close() (or a ``with`` block); closing the Shim closes it too."""

    def __init__(self, engine: Any, a: _Args, call: Any, ready: "_pb.TunnelReady",
                 lsock: Optional[socket.socket], local: Optional[Tuple[int, Any]], local_str: str) -> None:
        self._e = engine
        self._call = call
        self._a = a
        self.kind = a.kind
        self.tunnel_id: str = ready.tunnel_id
        self.port: int = ready.port if a.kind == "reverse" else (lsock.getsockname()[1] if lsock else 0)
        self.listen_host = a.listen_host
        self.target = a.target
        self._guest = _hostport(ready.host, ready.port)
        self._lsock = lsock
        self._local = local
        self._local_str = local_str
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._conns: Dict[int, _Conn] = {}
        self._next_no = 0
        self._active = 0
        self._closed = False
        self._stopping = False
        self._ended = threading.Event()
        self._end_error: Optional[BaseException] = None
        self._threads: Set[threading.Thread] = set()
        # written once at teardown and never read: every wait on it wakes from then on
        self._wake_r, self._wake_w = socket.socketpair()
        self._q: "Optional[queue.SimpleQueue[Optional[TunnelEvent]]]" = None
        self._dispatcher: Optional[threading.Thread] = None
        if a.on_event is not None:
            self._q = queue.SimpleQueue()
            self._dispatcher = self._spawn(self._dispatch, "events")
        self._watcher = self._spawn(self._watch, "tunnel")
        if lsock is not None:
            self._spawn(self._accept, "accept")
        engine.add_closer(id(self), self.close)

    @property
    def id(self) -> str:
        """The shim's id for the tunnel ("t3"), as tunnel_id."""
        return self.tunnel_id

    def __repr__(self) -> str:
        return f"<TunnelHandle {self.tunnel_id} {self.kind} {self.listen_host}:{self.port} -> {self.target}>"

    @property
    def closed(self) -> bool:
        """True once the handle was closed (by close() or by closing the Shim)."""
        return self._closed

    @property
    def active(self) -> int:
        """Connections open now."""
        return self._active

    def __enter__(self) -> "TunnelHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the tunnel to end by itself (closed by id elsewhere, the shim going
        away). Returns True if it still runs after ``timeout`` seconds (None: no
        limit), False if it ended or was closed; raises if it ended on an error."""
        t = seconds(timeout)
        if self._closed:
            return False
        if not self._ended.wait(t):
            return True
        if self._closed or self._e.closed:
            return False
        if self._end_error is not None:
            raise self._end_error
        return False

    def close(self) -> None:
        """Close the tunnel and every connection it carries. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._e.remove_closer(id(self))
        # the tunnel's stream cancelled: the shim closes its listener and every
        # connection; the watcher sees the stream end and takes ours down
        try:
            self._call.cancel()
        except Exception:
            pass
        me = threading.current_thread()
        watcher = self._watcher
        if watcher is not me:
            watcher.join(CLOSE_WAIT)
        if not self._stopping_done():
            try:
                self._call.close()
            except Exception:
                pass
            self._teardown(None)
        deadline = time.monotonic() + CLOSE_WAIT
        while time.monotonic() < deadline:  # (again: a connection may have started a thread meanwhile)
            with self._lock:
                threads = [th for th in self._threads if th is not me and th is not self._dispatcher]
            if not threads:
                break
            for th in threads:
                th.join(max(0.0, deadline - time.monotonic()))
        if self._lsock is not None:
            _close_sock(self._lsock, False)  # the acceptor's (in case it did not get to it)
        if self._q is not None and self._dispatcher is not None:
            self._q.put(None)  # after the last event: on_event has had them all when close() returns
            if self._dispatcher is not me:
                self._dispatcher.join(max(0.1, deadline - time.monotonic()))
        self._ended.set()
        with self._lock:
            idle = not any(th.is_alive() and th is not me for th in self._threads)
        if idle:  # else left open: a thread that did not stop in time may still wait on it
            self._wake_r.close()
            self._wake_w.close()

    # ---- threads ----

    def _spawn(self, fn: Callable[..., None], what: str, *args: Any) -> threading.Thread:
        th = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                              name=f"sandbox_shim-tunnel-{self.tunnel_id}-{what}")
        with self._lock:  # started under the lock: close() never sees it unstarted
            self._threads.add(th)
            th.start()
        return th

    def _run(self, fn: Callable[..., None], args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            pass  # a relay thread never raises (errors go to on_event)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _emit(self, ev: TunnelEvent) -> None:
        if self._q is not None:
            self._q.put(ev)

    def _dispatch(self) -> None:
        """on_event, called in order on one thread; its exceptions are ignored."""
        q, fn = self._q, self._a.on_event
        assert q is not None and fn is not None
        while True:
            ev = q.get()
            if ev is None:
                return
            try:
                fn(ev)
            except Exception:
                pass  # a logging callback must not break the relay

    def _stopping_done(self) -> bool:
        with self._lock:
            return self._stopping

    def _watch(self) -> None:
        """The tunnel's own stream: incoming connections (reverse), or its end."""
        err: Optional[BaseException] = None
        try:
            while True:
                it = self._call.next()
                if it is None:
                    break
                if type(it) is StreamEvent and it.event.which_kind() == "tunnel_incoming":
                    inc = it.event.tunnel_incoming
                    c = self._new_conn(inc.peer or "?", self._local_str)
                    if c is None:
                        continue  # closing: the shim resets it
                    self._spawn(self._reverse_conn, f"c{c.no}", c, inc.conn_id)
        except Exception as e:
            err = e
        self._end_error = err
        self._teardown(err)
        self._ended.set()

    def _teardown(self, err: Optional[BaseException]) -> None:
        """Take down the listener and every connection (the shim ends their streams
        too, with ECONNABORTED)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            conns = list(self._conns.values())
            self._room.notify_all()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        forced = _aborted(self.tunnel_id)
        for c in conns:
            self._stop_conn(c, forced)

    def _stop_conn(self, c: _Conn, why: SandboxError) -> None:
        with self._lock:
            if c.finished:
                return
            if c.cause is None:
                c.cause = why
            c.stopping = True
            call, sock, relaying = c.call, c.sock, c.relaying
        if call is not None:
            try:
                call.cancel()
            except Exception:
                pass
        if sock is not None and relaying:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _new_conn(self, from_addr: str, to_addr: str) -> Optional[_Conn]:
        with self._lock:
            if self._stopping:
                return None
            self._next_no += 1
            c = _Conn(self._next_no, from_addr, to_addr)
            self._conns[c.no] = c
            return c

    def _forget(self, c: _Conn) -> None:
        with self._lock:
            c.finished = True
            if c.relaying:
                self._active -= 1
            self._conns.pop(c.no, None)
            self._room.notify_all()

    def _fail(self, c: _Conn, err: SandboxError) -> None:
        """A connection that could not be made."""
        with self._lock:
            if c.cause is not None:
                err = c.cause
        _close_sock(c.sock, True)
        c.sock = None
        self._forget(c)
        self._emit(c.event("fail", err))

    # ---- forward: accept here, connect inside ----

    def _accept(self) -> None:
        ls = self._lsock
        assert ls is not None
        sel = selectors.DefaultSelector()
        try:
            sel.register(ls, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                with self._lock:
                    while len(self._conns) >= MAX_CONNS and not self._stopping:
                        self._room.wait(1.0)
                    if self._stopping:
                        return
                try:
                    ready = sel.select()
                except (OSError, ValueError):
                    return
                if any(k.fileobj is self._wake_r for k, _ in ready):
                    return
                try:
                    s, peer = ls.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    if e.errno in (_errno.EMFILE, _errno.ENFILE, _errno.ENOBUFS, _errno.ENOMEM):
                        time.sleep(0.1)  # out of fds: the connections wait in the backlog
                    continue
                s.setblocking(True)
                _nodelay(s)
                c = self._new_conn(_fmt(peer), self._guest)
                if c is None:
                    _close_sock(s, True)
                    return
                c.sock = s
                self._spawn(self._forward_conn, f"c{c.no}", c)
        finally:
            sel.close()
            _close_sock(ls, False)

    def _forward_conn(self, c: _Conn) -> None:
        req = _pb.Request(tunnel_connect=_pb.TunnelConnectRequest(tunnel_id=self.tunnel_id,
                                                                  timeout_ms=self._a.timeout_ms()))
        try:
            call = self._open_conn_call(c, req)
            con = _connected_of(call.next())
        except Exception as e:
            self._fail(c, _local_error(e, "tunnel_connect", None))
            return
        if con.peer:
            c.to_addr = con.peer
        self._relay(c)

    def _open_conn_call(self, c: _Conn, req: "_pb.Request") -> Any:
        call = self._e.open(req, extra_window=EXTRA_WINDOW, use_default=False)
        with self._lock:
            c.call = call
            stop = c.stopping
        if stop:
            call.cancel()
        return call

    # ---- reverse: the shim accepted inside, connect here ----

    def _connect_local(self, c: _Conn) -> Optional[SandboxError]:
        """Connect c.sock to the local address; the error if that failed."""
        assert self._local is not None
        family, addr = self._local
        timeout = self._a.connect_timeout or CONNECT_TIMEOUT
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            return _local_error(e, "socket", c.to_addr)
        c.sock = s
        _nodelay(s)
        s.setblocking(False)
        rc = s.connect_ex(addr)
        if rc not in CONNECTING:
            return make_error("local", rc, f"connect: {os.strerror(rc)}", c.to_addr.encode())
        if rc != 0:
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as sel:
                try:
                    sel.register(self._wake_r, selectors.EVENT_READ)
                    sel.register(s, selectors.EVENT_WRITE)
                except (OSError, ValueError):
                    return _aborted(self.tunnel_id)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return make_error("local", ETIMEDOUT, f"connect: {os.strerror(ETIMEDOUT)}",
                                          c.to_addr.encode())
                    try:
                        ready = sel.select(left)
                    except (OSError, ValueError):
                        return _aborted(self.tunnel_id)
                    if any(k.fileobj is self._wake_r for k, _ in ready):
                        return _aborted(self.tunnel_id)
                    if ready:
                        break
            rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if rc != 0:
                return make_error("local", rc, f"connect: {os.strerror(rc)}", c.to_addr.encode())
        s.setblocking(True)
        return None

    def _reverse_conn(self, c: _Conn, conn_id: int) -> None:
        err = self._connect_local(c)
        if err is not None:
            # the shim resets the connection inside (the program there sees ECONNRESET)
            _close_sock(c.sock, False)
            c.sock = None
            if not self._stopping:
                try:
                    req = _pb.Request(tunnel_accept=_pb.TunnelAcceptRequest(tunnel_id=self.tunnel_id,
                                                                            conn_id=conn_id, refuse=True))
                    self._e.open(req, use_default=False).wait_end(REFUSE_WAIT)
                except Exception:
                    pass
            self._fail(c, err)
            return
        req = _pb.Request(tunnel_accept=_pb.TunnelAcceptRequest(tunnel_id=self.tunnel_id, conn_id=conn_id))
        try:
            call = self._open_conn_call(c, req)
            _connected_of(call.next())
        except Exception as e:
            self._fail(c, _local_error(e, "tunnel_accept", None))
            return
        self._relay(c)

    # ---- relaying ----

    def _relay(self, c: _Conn) -> None:
        """Both directions of a connected connection, until its END (or error)."""
        call, sock = c.call, c.sock
        with self._lock:
            c.relaying = True
            self._active += 1
            stop = c.stopping
        if stop:  # the tunnel closed while it connected
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._emit(c.event("open", None))
        up = threading.Thread(target=self._up, args=(c,), daemon=True,
                              name=f"sandbox_shim-tunnel-{self.tunnel_id}-c{c.no}-up")
        up.start()
        err: Optional[BaseException] = None
        counts = None
        broken = False  # the local socket failed: what still comes is dropped
        try:
            while True:
                it = call.next()
                if it is None:
                    res = call.result
                    if res is not None and res.which_kind() == "tunnel_conn":
                        counts = res.tunnel_conn
                    break
                if type(it) is Data and not broken:
                    if it.data:
                        try:
                            sock.sendall(it.data)
                        except OSError as e:
                            broken = True
                            self._local_failed(c, _local_error(e, "send", c.from_addr))
                            continue  # the cancel's ERROR ends the loop
                        c.bytes_out += len(it.data)
                    if it.fin:
                        try:
                            sock.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
        except Exception as e:
            err = e
        if err is None:
            up.join(1.0)  # END: the shim had our FIN, so the reader is on its way out
        if up.is_alive():
            with self._lock:
                c.stopping = True
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            up.join(CLOSE_WAIT)
        with self._lock:
            cause = c.cause
        if err is not None and cause is not None:
            err = cause
        _close_sock(sock, err is not None)
        c.sock = None
        self._forget(c)
        self._emit(c.event("close", _local_error(err, "relay", None) if err is not None else None, counts))

    def _local_failed(self, c: _Conn, e: SandboxError) -> None:
        """The local socket broke: the connection goes (the shim closes its socket)."""
        with self._lock:
            if c.cause is None:
                c.cause = e
            c.stopping = True
        try:
            c.call.cancel()
        except Exception:
            pass
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _up(self, c: _Conn) -> None:
        """Local socket -> shim; EOF becomes FIN."""
        call, sock = c.call, c.sock
        try:
            while True:
                try:
                    d = sock.recv(READ_MAX)
                except OSError as e:
                    if not c.stopping:
                        self._local_failed(c, _local_error(e, "recv", c.from_addr))
                    return
                if not d:
                    break
                call.write(d)
                c.bytes_in += len(d)
            if not c.stopping:
                call.finish()
        except Exception:
            pass  # the stream ended: the other direction reports how


def open_tunnel(
    engine: Any,
    kind: str,
    guest_host: Any,
    guest_port: int,
    local_host: Any,
    local_port: int,
    on_event: Optional[Callable[[TunnelEvent], Any]],
    connect_timeout: Optional[float],
    backlog: Optional[int],
) -> TunnelHandle:
    a = _Args(kind, guest_host, guest_port, local_host, local_port, on_event, connect_timeout, backlog)
    _feature_check(engine)
    lsock = None
    local = None
    if a.kind == "forward":
        lsock = _listen(a.local_host, a.local_port, a.backlog)
        remote = _fmt(lsock.getsockname())
    else:
        local = _resolve(a.local_host, a.local_port, False)
        remote = _fmt(local[1])
    try:
        call = engine.open(_tunnel_request(a, remote), use_default=False)
        try:
            ready = _ready_of(call.next(engine.default_timeout or OPEN_TIMEOUT))
        except BaseException:
            call.close()
            raise
        return TunnelHandle(engine, a, call, ready, lsock, local, remote if a.kind == "reverse" else "")
    except BaseException:
        _close_sock(lsock, False)
        raise


# ======================================================================
# asyncio
# ======================================================================


async def _resolve_async(host: str, port: int, passive: bool) -> Tuple[int, Any]:
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    flags = socket.AI_NUMERICSERV | (socket.AI_PASSIVE if passive else 0)
    loop = asyncio.get_running_loop()
    try:
        ai = await loop.getaddrinfo(h, port, family=0, type=socket.SOCK_STREAM, proto=0, flags=flags)
    except socket.gaierror as e:
        raise make_error("local", EADDRNOTAVAIL, f"cannot resolve {host}: {e.strerror}", host.encode()) from None
    except UnicodeError:
        raise make_error("local", EINVAL, f"cannot resolve {host}: not a valid host name", host.encode()) from None
    if not ai:
        raise make_error("local", EADDRNOTAVAIL, f"cannot resolve {host}", host.encode())
    return ai[0][0], ai[0][4]


def _abort_writer(w: Any, reset: bool) -> None:
    """Close a StreamWriter now; with reset the other end sees RST."""
    if w is None:
        return
    try:
        if reset:
            s = w.get_extra_info("socket")
            if s is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            w.transport.abort()
        else:
            w.close()
    except Exception:
        pass


class _AConn(_Conn):
    def __init__(self, no: int, from_addr: str, to_addr: str) -> None:
        super().__init__(no, from_addr, to_addr)
        self.reader: Any = None
        self.task: "Optional[asyncio.Task[Any]]" = None  # the connection's own task
        self.connecting = False  # reverse: in open_connection() (the one await we cancel)
        self.up: "Optional[asyncio.Task[Any]]" = None     # local socket -> shim


class AsyncTunnelHandle:
    """An open tunnel of an AsyncShim (see TunnelHandle), relayed by tasks on the
    shim's event loop: ``await close()`` (or ``async with``), ``await wait()``.
    ``on_event`` is called on the loop; if it returns an awaitable, that runs as a
    task of its own. Closing the AsyncShim closes the tunnel too."""

    def __init__(self, engine: Any, a: _Args, call: Any, ready: "_pb.TunnelReady",
                 lsock: Optional[socket.socket], local: Optional[Tuple[int, Any]], local_str: str) -> None:
        self._e = engine
        self._call = call
        self._a = a
        self.kind = a.kind
        self.tunnel_id: str = ready.tunnel_id
        self.port: int = ready.port if a.kind == "reverse" else (lsock.getsockname()[1] if lsock else 0)
        self.listen_host = a.listen_host
        self.target = a.target
        self._guest = _hostport(ready.host, ready.port)
        self._lsock = lsock
        self._local = local
        self._local_str = local_str
        self._conns: Dict[int, _AConn] = {}
        self._next_no = 0
        self._active = 0
        self._closed = False
        self._stopping = False
        self._ended = asyncio.Event()
        self._end_error: Optional[BaseException] = None
        self._server: Any = None
        self._room = asyncio.Condition()
        self._tasks: "Set[asyncio.Task[Any]]" = set()
        self._watcher = self._spawn(self._watch())

    async def _start(self) -> None:
        if self._lsock is not None:
            self._server = await asyncio.start_server(self._on_client, sock=self._lsock,
                                                      backlog=self._a.backlog or 128, limit=READ_MAX)
        self._e.add_closer(id(self), self.close)

    @property
    def id(self) -> str:
        """The shim's id for the tunnel ("t3"), as tunnel_id."""
        return self.tunnel_id

    def __repr__(self) -> str:
        return f"<AsyncTunnelHandle {self.tunnel_id} {self.kind} {self.listen_host}:{self.port} -> {self.target}>"

    @property
    def closed(self) -> bool:
        """True once the handle was closed (by close() or by closing the AsyncShim)."""
        return self._closed

    @property
    def active(self) -> int:
        """Connections open now."""
        return self._active

    async def __aenter__(self) -> "AsyncTunnelHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the tunnel to end by itself (closed by id elsewhere, the shim going
        away). Returns True if it still runs after ``timeout`` seconds (None: no
        limit), False if it ended or was closed; raises if it ended on an error."""
        t = seconds(timeout)
        if self._closed:
            return False
        try:
            await asyncio.wait_for(self._ended.wait(), t)
        except asyncio.TimeoutError:
            return True
        if self._closed or self._e.closed:
            return False
        if self._end_error is not None:
            raise self._end_error
        return False

    async def close(self) -> None:
        """Close the tunnel and every connection it carries. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._e.remove_closer(id(self))
        me = asyncio.current_task()
        try:
            self._call.cancel()  # the shim closes the tunnel; the watcher sees its stream end
        except Exception:
            pass
        if self._watcher is not me and not self._watcher.done():
            await asyncio.wait([self._watcher], timeout=CLOSE_WAIT)
        if not self._stopping:
            try:
                self._call.close()
            except Exception:
                pass
            self._teardown()
        pending = [t for t in list(self._tasks) if t is not me and not t.done()]
        if pending:
            done, left = await asyncio.wait(pending, timeout=CLOSE_WAIT)
            for t in left:
                t.cancel()
        for c in list(self._conns.values()):  # (only those whose tasks did not end in time)
            self._finish(c, "close" if c.relaying else "fail", c.cause or _aborted(self.tunnel_id))
        self._ended.set()

    # ---- tasks ----

    def _spawn(self, coro: Any) -> "asyncio.Task[Any]":
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: "asyncio.Task[Any]") -> None:
        self._tasks.discard(t)
        if not t.cancelled():
            t.exception()  # retrieved: a relay task never raises, but no warning if it did

    def _emit(self, ev: TunnelEvent) -> None:
        fn = self._a.on_event
        if fn is None:
            return
        try:
            r = fn(ev)
            if r is not None and hasattr(r, "__await__"):
                self._spawn(r)
        except Exception:
            pass  # a logging callback must not break the relay

    async def _watch(self) -> None:
        err: Optional[BaseException] = None
        try:
            while True:
                it = await self._call.next()
                if it is None:
                    break
                if type(it) is StreamEvent and it.event.which_kind() == "tunnel_incoming":
                    inc = it.event.tunnel_incoming
                    c = self._new_conn(inc.peer or "?", self._local_str)
                    if c is not None:
                        c.task = self._spawn(self._reverse_conn(c, inc.conn_id))
        except asyncio.CancelledError:
            err = _aborted(self.tunnel_id)
        except Exception as e:
            err = e
        self._end_error = err
        self._teardown()
        self._ended.set()

    def _teardown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        elif self._lsock is not None:
            _close_sock(self._lsock, False)
        self._wake_room()
        forced = _aborted(self.tunnel_id)
        for c in list(self._conns.values()):
            self._stop_conn(c, forced)

    def _wake_room(self) -> None:
        async def wake() -> None:
            async with self._room:
                self._room.notify_all()
        self._spawn(wake())

    def _stop_conn(self, c: _AConn, why: SandboxError) -> None:
        if c.finished:
            return
        if c.cause is None:
            c.cause = why
        c.stopping = True
        if c.call is not None:
            try:
                c.call.cancel()
            except Exception:
                pass
        if c.relaying:
            if c.up is not None and not c.up.done():
                c.up.cancel()  # the stream's end ends the other direction
        elif c.connecting and c.task is not None and c.task is not asyncio.current_task():
            c.task.cancel()  # connecting here: stop waiting (the other phases end with the stream)

    def _new_conn(self, from_addr: str, to_addr: str) -> Optional[_AConn]:
        if self._stopping:
            return None
        self._next_no += 1
        c = _AConn(self._next_no, from_addr, to_addr)
        self._conns[c.no] = c
        return c

    def _finish(self, c: _AConn, type_: str, err: Optional[SandboxError], counts: Any = None) -> None:
        """The connection is over: its socket closed (reset on error), the event given."""
        if c.finished:
            return
        c.finished = True
        _abort_writer(c.sock, err is not None)
        c.sock = None
        if c.relaying:
            self._active -= 1
        self._conns.pop(c.no, None)
        if len(self._conns) == MAX_CONNS - 1:
            self._wake_room()
        self._emit(c.event(type_, err, counts))

    def _fail(self, c: _AConn, err: SandboxError) -> None:
        self._finish(c, "fail", c.cause or err)

    # ---- forward: accept here (asyncio.start_server), connect inside ----

    async def _on_client(self, reader: Any, writer: Any) -> None:
        try:
            if len(self._conns) >= MAX_CONNS:
                async with self._room:
                    await self._room.wait_for(lambda: len(self._conns) < MAX_CONNS or self._stopping)
            c = self._new_conn(_fmt(writer.get_extra_info("peername")), self._guest)
            if c is None:
                _abort_writer(writer, True)
                return
        except BaseException:
            _abort_writer(writer, True)
            raise
        c.sock, c.reader = writer, reader
        task = asyncio.current_task()
        assert task is not None
        c.task = task
        self._tasks.add(task)
        try:
            await self._forward_conn(c)
        except asyncio.CancelledError:
            # cancelled by close() giving up on it, or the loop ending: not re-raised, as
            # asyncio's start_server() callback would log the cancelled task as an error
            self._finish(c, "close" if c.relaying else "fail", c.cause or _aborted(self.tunnel_id))
        finally:
            self._tasks.discard(task)

    async def _forward_conn(self, c: _AConn) -> None:
        req = _pb.Request(tunnel_connect=_pb.TunnelConnectRequest(tunnel_id=self.tunnel_id,
                                                                  timeout_ms=self._a.timeout_ms()))
        try:
            call = await self._open_conn_call(c, req)
            con = _connected_of(await call.next())
        except Exception as e:
            self._fail(c, _local_error(e, "tunnel_connect", None))
            return
        if con.peer:
            c.to_addr = con.peer
        await self._relay(c)

    async def _open_conn_call(self, c: _AConn, req: "_pb.Request") -> Any:
        call = await self._e.open(req, extra_window=EXTRA_WINDOW, use_default=False)
        c.call = call
        if c.stopping:
            call.cancel()
        return call

    # ---- reverse: the shim accepted inside, connect here (asyncio.open_connection) ----

    async def _reverse_conn(self, c: _AConn, conn_id: int) -> None:
        assert self._local is not None
        addr = self._local[1]
        timeout = self._a.connect_timeout or CONNECT_TIMEOUT
        err: Optional[SandboxError] = None
        c.connecting = True
        try:
            c.reader, c.sock = await asyncio.wait_for(asyncio.open_connection(addr[0], addr[1], limit=READ_MAX),
                                                      timeout)
        except asyncio.TimeoutError:
            err = make_error("local", ETIMEDOUT, f"connect: {os.strerror(ETIMEDOUT)}", c.to_addr.encode())
        except asyncio.CancelledError:
            if not c.stopping:
                raise
            err = _aborted(self.tunnel_id)
        except OSError as e:
            err = _local_error(e, "connect", c.to_addr)
        finally:
            c.connecting = False
        if err is not None:
            if not self._stopping:
                try:
                    req = _pb.Request(tunnel_accept=_pb.TunnelAcceptRequest(tunnel_id=self.tunnel_id,
                                                                            conn_id=conn_id, refuse=True))
                    await (await self._e.open(req, use_default=False)).wait_end(REFUSE_WAIT)
                except Exception:
                    pass
            self._fail(c, err)
            return
        req = _pb.Request(tunnel_accept=_pb.TunnelAcceptRequest(tunnel_id=self.tunnel_id, conn_id=conn_id))
        try:
            call = await self._open_conn_call(c, req)
            _connected_of(await call.next())
        except Exception as e:
            self._fail(c, _local_error(e, "tunnel_accept", None))
            return
        await self._relay(c)

    # ---- relaying ----

    async def _relay(self, c: _AConn) -> None:
        """Both directions: this task takes the shim's side, c.up the local socket's."""
        call, w = c.call, c.sock
        c.relaying = True
        self._active += 1
        self._emit(c.event("open", None))
        c.up = self._spawn(self._up(c))
        if c.stopping:
            c.up.cancel()
        err: Optional[BaseException] = None
        counts = None
        broken = False
        try:
            while True:
                it = await call.next()
                if it is None:
                    res = call.result
                    if res is not None and res.which_kind() == "tunnel_conn":
                        counts = res.tunnel_conn
                    break
                if type(it) is Data and not broken:
                    try:
                        if it.data:
                            w.write(it.data)
                            await w.drain()
                            c.bytes_out += len(it.data)
                        if it.fin and w.can_write_eof():
                            w.write_eof()
                    except OSError as e:
                        broken = True
                        self._local_failed(c, _local_error(e, "send", c.from_addr))
        except Exception as e:
            err = e
        up = c.up
        if err is None and not up.done():
            await asyncio.wait([up], timeout=1.0)  # END: the shim had our FIN
        if not up.done():
            c.stopping = True
            up.cancel()
            await asyncio.wait([up], timeout=CLOSE_WAIT)
        if err is not None and c.cause is not None:
            err = c.cause
        self._finish(c, "close", _local_error(err, "relay", None) if err is not None else None, counts)

    def _local_failed(self, c: _AConn, e: SandboxError) -> None:
        if c.cause is None:
            c.cause = e
        c.stopping = True
        try:
            c.call.cancel()
        except Exception:
            pass

    async def _up(self, c: _AConn) -> None:
        """Local socket -> shim; EOF becomes FIN."""
        call, r = c.call, c.reader
        try:
            while True:
                try:
                    d = await r.read(READ_MAX)
                except OSError as e:
                    if not c.stopping:
                        self._local_failed(c, _local_error(e, "recv", c.from_addr))
                    return
                if not d:
                    break
                await call.write(d)
                c.bytes_in += len(d)
            if not c.stopping:
                await call.finish()
        except asyncio.CancelledError:
            pass  # the connection goes: the stream side reports it
        except Exception:
            pass  # the stream ended: the other direction reports how


async def open_tunnel_async(
    engine: Any,
    kind: str,
    guest_host: Any,
    guest_port: int,
    local_host: Any,
    local_port: int,
    on_event: Optional[Callable[[TunnelEvent], Any]],
    connect_timeout: Optional[float],
    backlog: Optional[int],
) -> AsyncTunnelHandle:
    a = _Args(kind, guest_host, guest_port, local_host, local_port, on_event, connect_timeout, backlog)
    _feature_check(engine)
    lsock = None
    local = None
    if a.kind == "forward":
        family, addr = await _resolve_async(a.local_host, a.local_port, True)
        lsock = _listen_addr(family, addr, a.backlog)
        remote = _fmt(lsock.getsockname())
    else:
        local = await _resolve_async(a.local_host, a.local_port, False)
        remote = _fmt(local[1])
    try:
        call = await engine.open(_tunnel_request(a, remote), use_default=False)
        try:
            ready = _ready_of(await call.next(engine.default_timeout or OPEN_TIMEOUT))
        except BaseException:
            call.close()
            raise
        h = AsyncTunnelHandle(engine, a, call, ready, lsock, local, remote if a.kind == "reverse" else "")
        try:
            await h._start()
        except BaseException:
            await h.close()
            raise
        return h
    except BaseException:
        _close_sock(lsock, False)
        raise
