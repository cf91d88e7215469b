"""puretest: what the pure-Python protocol tests share (test_protocol, test_rx_cases,
test_fake_daemon).

- The modules under test, loaded from sdk/python/src whether or not the package's
  ``__init__`` imports (during the rewrite it may still pull in the ctypes modules): if
  ``import sandbox_shim._protocol`` fails, a bare package object ``sandbox_shim`` with
  ``__path__ = [src/sandbox_shim]`` is registered and the submodules are imported into it
  without running ``__init__``.
- Frame helpers (build and parse frames by hand).
- ``FakeShim``: a scripted fake shim on one end of a socketpair, run on its own thread,
  for the tests that drive the sync Engine over a real socket. Every wait it makes is
  bounded (``WAIT`` seconds) and fails the test when it runs out.
"""

from __future__ import annotations

import importlib
import os
import socket
import struct
import sys
import threading
import time
import types
from typing import Any, Callable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
PKG_DIR = os.path.join(SRC, "sandbox_shim")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# how long any wait of a test may take before it counts as a hang
WAIT = 10.0


def _load() -> None:
    if SRC not in sys.path:
        sys.path.insert(0, SRC)
    try:
        importlib.import_module("sandbox_shim._protocol")
        return
    except Exception:
        for k in [k for k in sys.modules if k == "sandbox_shim" or k.startswith("sandbox_shim.")]:
            del sys.modules[k]
    pkg = types.ModuleType("sandbox_shim")
    pkg.__path__ = [PKG_DIR]  # type: ignore[attr-defined]
    pkg.__package__ = "sandbox_shim"
    pkg.__file__ = os.path.join(PKG_DIR, "__init__.py")
    sys.modules["sandbox_shim"] = pkg
    importlib.import_module("sandbox_shim._protocol")


_load()

from sandbox_shim import _pb as pb  # noqa: E402
from sandbox_shim import _protocol as P  # noqa: E402
from sandbox_shim import errors as E  # noqa: E402

try:
    from sandbox_shim import _sync as S  # noqa: E402
except Exception as _e:  # not usable (yet): the tests that need it are skipped
    S = None  # type: ignore[assignment]
    SYNC_ERROR: Optional[str] = f"{type(_e).__name__}: {_e}"
else:
    SYNC_ERROR = None

try:
    from sandbox_shim.transports import SocketTransport  # noqa: E402
except Exception:
    SocketTransport = None  # type: ignore[assignment,misc]

HDR = struct.Struct(">IIBBH")
HELLO, HELLO_OK, REQUEST, DATA, EVENT, END, ERROR, CANCEL, WINDOW, PING, PONG = range(1, 12)
FIN, STDERR = 0x01, 0x02


def frame(stream: int, ftype: int, flags: int = 0, payload: bytes = b"", *, length: Optional[int] = None,
          reserved: int = 0) -> bytes:
    """One frame's bytes; ``length`` overrides the header's length (payload as given)."""
    n = len(payload) if length is None else length
    return HDR.pack(n, stream, ftype, flags, reserved) + payload


def header(length: int, stream: int, ftype: int, flags: int = 0, reserved: int = 0) -> bytes:
    return HDR.pack(length, stream, ftype, flags, reserved)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def window(stream: int, inc: int) -> bytes:
    return frame(stream, WINDOW, 0, u32(inc))


def hello_reply(**kw: Any) -> "pb.HelloReply":
    args = dict(protocol_version=1, shim_version="fake", max_frame=1 << 20, pid=1, pid1=False, uid=0,
                initial_window=256 << 10)
    args.update(kw)
    return pb.HelloReply(**args)


def hello_ok(**kw: Any) -> bytes:
    return frame(0, HELLO_OK, 0, hello_reply(**kw).encode())


def error_payload(code: int, name: Optional[str] = None, message: Optional[str] = None,
                  path: Optional[bytes] = None) -> bytes:
    return pb.Error(errno_num=code, errno_name=name, message=message, path=path).encode()


def end_read(stream: int, nbytes: int) -> bytes:
    return frame(stream, END, 0, pb.Result(read=pb.ReadReply(bytes=nbytes)).encode())


def read_request(path: bytes) -> "pb.Request":
    return pb.Request(read=pb.ReadRequest(path=path))


class Frame:
    __slots__ = ("length", "stream", "type", "flags", "reserved", "payload")

    def __init__(self, length: int, stream: int, ftype: int, flags: int, reserved: int, payload: bytes) -> None:
        self.length, self.stream, self.type, self.flags, self.reserved, self.payload = (
            length, stream, ftype, flags, reserved, payload)

    def __repr__(self) -> str:
        return f"Frame(stream={self.stream}, type={self.type}, flags={self.flags}, payload={self.payload[:32]!r})"


def parse_frames(buf: bytearray) -> List[Frame]:
    """Take the whole frames off the front of buf (what remains is a frame cut short)."""
    out = []
    pos = 0
    while len(buf) - pos >= 12:
        n, sid, t, fl, res = HDR.unpack_from(buf, pos)
        if len(buf) - pos - 12 < n:
            break
        out.append(Frame(n, sid, t, fl, res, bytes(buf[pos + 12:pos + 12 + n])))
        pos += 12 + n
    del buf[:pos]
    return out


def all_frames(data: bytes) -> List[Frame]:
    """Every frame of data, which must hold whole frames only."""
    buf = bytearray(data)
    out = parse_frames(buf)
    assert not buf, f"{len(buf)} bytes of a frame cut short"
    return out


def wait_until(pred: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait (polling) until pred() holds; AssertionError naming what after timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


class FakeShim:
    """A fake shim on one end of a socketpair; ``client_sock`` is the other end.

    ``run(script)`` runs ``script(self)`` on a thread; ``join()`` waits for it and re-raises
    what it raised. The script reads the client's frames with ``pump()`` and the
    ``wait_*`` helpers (which track HELLO, REQUESTs, WINDOW credit, CANCELs, PINGs and
    PONGs) and writes with ``send()``. ``answer_hello()`` replies HELLO_OK."""

    def __init__(self) -> None:
        self.sock, self.client_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.inbuf = bytearray()
        self.frames: List[Frame] = []
        self.hello: Optional["pb.Hello"] = None
        self.window = 256 << 10
        self.requests: List[int] = []
        self.request_payloads: List[bytes] = []
        self.credit: dict = {}
        self.sent: dict = {}
        self.cancels: List[int] = []
        self.pings: List[bytes] = []  # the client's PINGs not answered yet
        self.our_pings: List[bytes] = []
        self.our_pongs = 0
        self.eof = False
        self.bytes_sent = 0
        self.gone = False
        self._thread: Optional[threading.Thread] = None
        self._exc: Optional[BaseException] = None

    # ---- reading what the client sends ----

    def pump(self, timeout: float = 0.01) -> bool:
        """Read and parse what the client sent within timeout; False at EOF."""
        if self.eof:
            return False
        self.sock.settimeout(timeout)
        try:
            b = self.sock.recv(1 << 16)
        except (socket.timeout, BlockingIOError):
            return True
        except OSError:
            self.eof = True
            return False
        if not b:
            self.eof = True
            return False
        self.inbuf += b
        for f in parse_frames(self.inbuf):
            self.frames.append(f)
            if f.type == HELLO:
                self.hello = pb.Hello.decode(f.payload)
                if self.hello.initial_window is not None:
                    self.window = self.hello.initial_window
            elif f.type == REQUEST:
                assert not self.requests or f.stream > self.requests[-1], "stream ids not increasing"
                assert f.stream & 1, f"even stream id {f.stream}"
                self.requests.append(f.stream)
                self.request_payloads.append(f.payload)
                self.credit[f.stream] = self.window
                self.sent[f.stream] = 0
            elif f.type == WINDOW:
                assert len(f.payload) == 4, "WINDOW of the wrong size from the client"
                inc = struct.unpack(">I", f.payload)[0]
                assert inc > 0, "WINDOW 0 from the client"
                if f.stream in self.credit:
                    self.credit[f.stream] += inc
                    assert self.credit[f.stream] - self.sent[f.stream] <= 2**31 - 1, "credit over 2^31-1"
            elif f.type == CANCEL:
                self.cancels.append(f.stream)
            elif f.type == PING:
                self.pings.append(f.payload)
            elif f.type == PONG:
                assert self.our_pongs < len(self.our_pings), "a PONG for no PING"
                assert f.payload == self.our_pings[self.our_pongs], "the PONG does not carry the PING's payload"
                self.our_pongs += 1
        return True

    def wait(self, pred: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"fake shim: timed out waiting for {what}")
            if not self.pump(0.01) and not pred():
                raise AssertionError(f"fake shim: the client hung up before {what}")

    def wait_hello(self) -> None:
        self.wait(lambda: self.hello is not None, "HELLO")

    def answer_hello(self, **kw: Any) -> None:
        self.wait_hello()
        self.send(hello_ok(**kw))

    def wait_request(self, n: int = 1) -> int:
        """The stream id of the client's n-th REQUEST (from 1)."""
        self.wait(lambda: len(self.requests) >= n, f"REQUEST {n}")
        return self.requests[n - 1]

    def wait_cancel(self, sid: int) -> None:
        self.wait(lambda: sid in self.cancels, f"CANCEL of stream {sid}")

    def wait_credit(self, sid: int, n: int) -> None:
        """Until the client allows n more bytes of DATA on sid; counts them as sent."""
        self.wait(lambda: self.credit[sid] - self.sent[sid] >= n, f"credit for {n} bytes on stream {sid}")
        self.sent[sid] += n

    def answer_ping(self) -> None:
        self.wait(lambda: bool(self.pings), "a PING")
        # the PONGs for our PINGs came before it, on the same byte stream
        assert self.our_pongs == len(self.our_pings), f"{self.our_pongs} of our {len(self.our_pings)} PINGs answered"
        self.send(frame(0, PONG, 0, self.pings.pop(0)))

    def wait_eof(self, timeout: float = WAIT) -> bool:
        """True once the client has closed its end (within timeout)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self.pump(0.01)
        return self.eof

    # ---- writing ----

    def send(self, data: bytes) -> bool:
        """All of data; False (and nothing more sent) once the client has gone."""
        if self.gone:
            return False
        self.sock.settimeout(WAIT)
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.gone = True
            return False
        self.bytes_sent += len(data)
        return True

    def outq(self) -> int:
        import fcntl
        import termios

        b = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        return int(struct.unpack("i", b)[0])

    def wait_drained(self) -> None:
        """Until the client has read every byte sent."""
        deadline = time.monotonic() + WAIT
        while self.outq() > 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"fake shim: the client stopped reading ({self.outq()} bytes queued)")
            self.pump(0.0005)

    def hang_up(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- the thread ----

    def run(self, script: Callable[["FakeShim"], None]) -> "FakeShim":
        def main() -> None:
            try:
                script(self)
            except BaseException as e:  # re-raised by join()
                self._exc = e
            finally:
                self.hang_up()

        self._thread = threading.Thread(target=main, name="fake-shim", daemon=True)
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread is not None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float = WAIT) -> None:
        """Wait for the script; re-raise (once) what it raised."""
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("fake shim: its script did not finish")
        e, self._exc = self._exc, None
        if e is not None:
            raise e

    def close(self) -> None:
        for s in (self.sock, self.client_sock):
            try:
                s.close()
            except OSError:
                pass


class SockTransport:
    """A sync transport over a socket (as transports.SocketTransport), counting what it
    read, so that tests can tell how much the client took in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.read_bytes = 0
        self.closed = False

    def read(self, n: int) -> bytes:
        b = self.sock.recv(n)
        self.read_bytes += len(b)
        return b

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect_engine(fake: FakeShim, proto: Optional["P.Protocol"] = None, timeout: float = WAIT) -> Tuple[Any, SockTransport]:
    """An Engine over the client end of fake's socketpair, handshake done (the fake's
    script must answer HELLO)."""
    assert S is not None, SYNC_ERROR
    tr = SockTransport(fake.client_sock)
    eng = S.Engine(tr, proto or P.Protocol(client_name="puretest"))
    eng.handshake(timeout)
    return eng, tr
