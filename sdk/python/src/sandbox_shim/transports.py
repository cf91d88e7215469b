"""transports: the byte streams a Shim talks over, and how to bring your own.

A **transport** is any object with three methods:

- sync (for :class:`~sandbox_shim.Shim`): ``read(n) -> bytes`` (up to n bytes, b"" at
  EOF, blocking), ``write(data) -> None`` (all of it), ``close() -> None`` (must make a
  read blocked in another thread return);
- async (for :class:`~sandbox_shim.AsyncShim`): the same three as coroutines:
  ``async read(n)``, ``async write(data)``, ``async close()``.

Pass one instead of a target string: ``Shim.connect(my_transport)``. That is how a host
with its own byte stream (a JavaScript socket in Pyodide, a platform's container port,
an SSH channel) plugs in; see the README's "Your own transport" example. The built-in
ones are made from target strings: ``unix:PATH``, ``tcp:HOST:PORT`` (HOST may be
``[v6]``), ``vsock:CID:PORT``, ``fc:UDS_PATH:PORT`` (Firecracker's hybrid vsock:
``CONNECT PORT\\n`` / ``OK N\\n``) and ``exec:COMMAND`` (``/bin/sh -c COMMAND`` running
``sandbox-shim --stdio``; its stderr is kept, the last 64 KiB, for error messages,
unless ``exec_stderr`` says otherwise).
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import socket
import subprocess
import threading
import time
from typing import Any, Dict, Optional, Tuple

from .errors import SandboxConnectionError, SandboxInvalidArgumentError, SandboxTimeoutError, errno_name

__all__ = [
    "SocketTransport",
    "ProcessTransport",
    "AsyncStreamTransport",
    "parse_target",
    "open_transport",
    "open_async_transport",
]

STDERR_KEEP = 64 << 10
FC_LINE_MAX = 64
RETRY_ERRNOS = (_errno.ENOENT, _errno.ECONNREFUSED, _errno.EAGAIN, _errno.ECONNRESET)


def _conn_error(msg: str, code: int, path: Optional[str] = None) -> SandboxConnectionError:
    if code == _errno.ETIMEDOUT:
        return SandboxTimeoutError(msg, errno=code, errno_name="ETIMEDOUT", path=path, kind="connect")  # type: ignore[return-value]
    return SandboxConnectionError(msg, errno=code, errno_name=errno_name(code), path=path, kind="connect")


def _bad_target(target: str, why: str) -> SandboxInvalidArgumentError:
    return SandboxInvalidArgumentError(f"bad target {target!r}: {why}", errno=22, errno_name="EINVAL", kind="local")


def _port(target: str, s: str) -> int:
    if not s.isdigit() or not 0 < int(s) <= 65535:
        raise _bad_target(target, f"port {s!r} is not a number between 1 and 65535")
    return int(s)


def parse_target(target: str) -> Tuple[str, Any]:
    """("unix", path) | ("tcp", (host, port)) | ("vsock", (cid, port)) |
    ("fc", (uds_path, port)) | ("exec", command)."""
    scheme, sep, rest = target.partition(":")
    if not sep or not rest:
        raise _bad_target(target, "expected unix:PATH, tcp:HOST:PORT, vsock:CID:PORT, fc:UDS_PATH:PORT or exec:COMMAND")
    if scheme == "unix":
        return "unix", rest
    if scheme == "exec":
        if not rest.strip():
            raise _bad_target(target, "the command is empty")
        return "exec", rest
    if scheme in ("tcp", "vsock", "fc"):
        host, sep, port = rest.rpartition(":")
        if not sep or not host:
            raise _bad_target(target, f"expected {scheme}:{'HOST' if scheme == 'tcp' else 'CID' if scheme == 'vsock' else 'UDS_PATH'}:PORT")
        p = _port(target, port)
        if scheme == "tcp":
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
            return "tcp", (host, p)
        if scheme == "vsock":
            if not host.isdigit():
                raise _bad_target(target, f"CID {host!r} is not a number")
            return "vsock", (int(host), p)
        return "fc", (host, p)
    raise _bad_target(target, f"unknown transport {scheme!r}")


# ---- sync ----


class SocketTransport:
    """A connected stream socket as a sync transport."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._closed = False

    def read(self, n: int) -> bytes:
        return self.sock.recv(n)

    def readinto(self, buf: Any) -> int:
        return self.sock.recv_into(buf)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked in another thread
        except OSError:
            pass
        self.sock.close()


def exec_env() -> Dict[str, str]:
    """The environment an ``exec:`` command gets: ours without the token (``SBX_TOKEN``,
    ``SBX_TOKEN_FILE``): the command (ssh, podman exec, a shell) is not the shim it is for."""
    return {k: v for k, v in os.environ.items() if k not in ("SBX_TOKEN", "SBX_TOKEN_FILE")}


class ProcessTransport:
    """A subprocess's stdin/stdout (``exec:``). Its stderr goes where ``stderr`` says:
    None keeps the last 64 KiB for error messages (``stderr_tail()``), "inherit" lets it
    through to ours, or a file object / fd."""

    def __init__(self, command: str, stderr: Any = None) -> None:
        self._tail = bytearray()
        keep = stderr is None
        if stderr == "inherit":
            err: Any = None
        elif keep:
            err = subprocess.PIPE
        else:
            err = stderr
        try:
            self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, bufsize=0, start_new_session=True, env=exec_env())
        except OSError as e:
            raise _conn_error(f"exec: cannot start /bin/sh: {e.strerror}", e.errno or 5, command) from None
        self._closed = False
        self._stdout = self.proc.stdout
        self._stdin = self.proc.stdin
        if keep:
            self._err_thread = threading.Thread(target=self._drain, name="sandbox_shim-exec-stderr", daemon=True)
            self._err_thread.start()

    def _drain(self) -> None:
        f = self.proc.stderr
        assert f is not None
        while True:
            try:
                b = f.read(4096)
            except (OSError, ValueError):
                return
            if not b:
                return
            self._tail += b
            if len(self._tail) > STDERR_KEEP:
                del self._tail[: len(self._tail) - STDERR_KEEP]

    def stderr_tail(self) -> str:
        """The last lines the command wrote to stderr (when kept)."""
        return bytes(self._tail).decode("utf-8", "replace").strip()

    def read(self, n: int) -> bytes:
        assert self._stdout is not None
        return os.read(self._stdout.fileno(), n)

    def write(self, data: bytes) -> None:
        assert self._stdin is not None
        fd = self._stdin.fileno()
        mv = memoryview(data)
        while mv:
            k = os.write(fd, mv)
            mv = mv[k:]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._stdin is not None:
                self._stdin.close()  # the shim exits at EOF on its stdin
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._stdout is not None:
            self._stdout.close()
        if self.proc.stderr is not None:
            # the drain thread ends at EOF (a descendant that keeps stderr open: 1 s)
            t = getattr(self, "_err_thread", None)
            if t is not None:
                t.join(1.0)
            try:
                self.proc.stderr.close()
            except OSError:
                pass


def _connect_socket(kind: str, addr: Any, timeout: Optional[float], target: str) -> socket.socket:
    if kind == "unix" or kind == "fc":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where: Any = addr if kind == "unix" else addr[0]
    elif kind == "tcp":
        host, port = addr
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise _conn_error(f"cannot resolve {host}: {e.strerror}", _errno.EHOSTUNREACH, target) from None
        last: Optional[OSError] = None
        for fam, typ, proto, _, sa in infos:
            s = socket.socket(fam, typ, proto)
            s.settimeout(timeout)
            try:
                s.connect(sa)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError as e:
                s.close()
                last = e
        assert last is not None
        raise last
    elif kind == "vsock":
        if not hasattr(socket, "AF_VSOCK"):
            raise _conn_error("vsock is not available on this system", _errno.EAFNOSUPPORT, target)
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)  # type: ignore[attr-defined]
        where = addr
    else:
        raise AssertionError(kind)
    s.settimeout(timeout)
    try:
        s.connect(where)
    except BaseException:
        s.close()
        raise
    if kind == "fc":
        try:
            _fc_preamble(s, addr[1], target)
        except BaseException:
            s.close()
            raise
    return s


def _fc_preamble(s: socket.socket, port: int, target: str) -> None:
    """Firecracker hybrid vsock: CONNECT PORT, then exactly one line "OK N"."""
    s.sendall(f"CONNECT {port}\n".encode())
    line = b""
    while not line.endswith(b"\n"):
        if len(line) >= FC_LINE_MAX:
            raise _conn_error(f"Firecracker answered CONNECT {port} with an overlong line", _errno.EPROTO, target)
        b = s.recv(1)  # byte by byte: what follows the line is the shim's
        if not b:
            raise _conn_error(f"nothing listens on vsock port {port} (Firecracker closed the connection)",
                              _errno.ECONNREFUSED, target)
        line += b
    if not line.startswith(b"OK "):
        raise _conn_error(f"Firecracker answered CONNECT {port} with {line.strip()!r}", _errno.ECONNREFUSED, target)


def open_transport(target: str, *, timeout: Optional[float], wait: Optional[float] = None,
                   exec_stderr: Any = None) -> Any:
    """A connected sync transport for a target string. ``wait``: keep retrying for that
    many seconds while nothing listens there yet."""
    kind, addr = parse_target(target)
    if kind == "exec":
        return ProcessTransport(addr, exec_stderr)
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        try:
            s = _connect_socket(kind, addr, timeout, target)
            s.settimeout(None)
            return SocketTransport(s)
        except socket.timeout:
            raise _conn_error(f"connect to {target} timed out", _errno.ETIMEDOUT, target) from None
        except OSError as e:
            if isinstance(e, SandboxConnectionError):
                if deadline is not None and e.errno in RETRY_ERRNOS and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise
            code = e.errno or _errno.EIO
            if deadline is not None and code in RETRY_ERRNOS and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            raise _conn_error(f"connect to {target}: {e.strerror or e}", code, target) from None


# ---- async ----


class AsyncStreamTransport:
    """An asyncio (reader, writer) pair as an async transport; ``process`` is the
    subprocess of an ``exec:`` target."""

    def __init__(self, reader: asyncio.StreamReader, writer: Any, process: Any = None) -> None:
        self.reader = reader
        self.writer = writer
        self.process = process
        self._tail = bytearray()
        self._err_task: Optional[asyncio.Task[None]] = None
        if process is not None and process.stderr is not None:
            self._err_task = asyncio.ensure_future(self._drain(process.stderr))

    async def _drain(self, r: asyncio.StreamReader) -> None:
        while True:
            b = await r.read(4096)
            if not b:
                return
            self._tail += b
            if len(self._tail) > STDERR_KEEP:
                del self._tail[: len(self._tail) - STDERR_KEEP]

    def stderr_tail(self) -> str:
        return bytes(self._tail).decode("utf-8", "replace").strip()

    async def read(self, n: int) -> bytes:
        return await self.reader.read(n)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def write_nowait(self, proto: Any, high_water: int) -> bool:
        """Hand what proto has queued to the transport now, unless its buffer is above
        high_water (False: nothing taken; the writer task writes and drains)."""
        tr = self.writer.transport
        if tr.is_closing() or tr.get_write_buffer_size() > high_water:
            return False
        self.writer.write(proto.data_to_send())
        return True

    async def close(self) -> None:
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
        except (OSError, RuntimeError):
            pass
        self.writer.close()
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()
            if self._err_task is not None:
                self._err_task.cancel()
        else:
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


async def _async_socket(kind: str, addr: Any, target: str) -> Any:
    if kind == "unix":
        return await asyncio.open_unix_connection(addr, limit=1 << 20)
    if kind == "tcp":
        r, w = await asyncio.open_connection(addr[0], addr[1], limit=1 << 20)
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return r, w
    if kind in ("vsock", "fc"):
        # connect (and for fc the preamble) blocking off the loop, then hand the socket over
        loop = asyncio.get_running_loop()
        s = await loop.run_in_executor(None, _connect_socket, kind, addr, 10.0, target)
        s.settimeout(None)
        s.setblocking(False)
        return await asyncio.open_connection(sock=s, limit=1 << 20)
    raise AssertionError(kind)


async def open_async_transport(target: str, *, wait: Optional[float] = None, exec_stderr: Any = None) -> Any:
    """A connected async transport for a target string."""
    kind, addr = parse_target(target)
    if kind == "exec":
        err: Any = asyncio.subprocess.PIPE if exec_stderr is None else (None if exec_stderr == "inherit" else exec_stderr)
        try:
            proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", addr, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, stderr=err,
                                                        limit=1 << 20, start_new_session=True, env=exec_env())
        except OSError as e:
            raise _conn_error(f"exec: cannot start /bin/sh: {e.strerror}", e.errno or 5, addr) from None
        assert proc.stdout is not None
        return AsyncStreamTransport(proc.stdout, proc.stdin, proc)
    loop = asyncio.get_running_loop()
    deadline = None if wait is None else loop.time() + wait
    while True:
        try:
            r, w = await _async_socket(kind, addr, target)
            return AsyncStreamTransport(r, w)
        except OSError as e:
            code = e.errno or _errno.EIO
            if deadline is not None and code in RETRY_ERRNOS and loop.time() < deadline:
                await asyncio.sleep(0.05)
                continue
            if isinstance(e, SandboxConnectionError):
                raise
            raise _conn_error(f"connect to {target}: {e.strerror or e}", code, target) from None
