"""_protocol: shim protocol v1, client side, sans-IO (bytes in, events out).

No sockets, threads or clocks in here: the sync and asyncio connections (and any host's
own byte stream) drive one :class:`Protocol` object. Feed what the transport read to
``receive()`` (``receive_eof()`` at EOF), act on the events it returns, and write what
``data_to_send()`` gives. Every check of PROTOCOL.md a client must make is made here:
header limits before any payload is buffered, stream ids, flow control both ways,
PING/PONG, ERROR on stream 0 failing the connection. After the first connection-level
error the object is dead: it returns no more events and refuses new streams.
"""

from __future__ import annotations

import struct
from typing import Dict, List, Optional, Union

from . import _pb
from .errors import SandboxError, error_class

__all__ = [
    "Protocol",
    "HandshakeDone",
    "ConnectionFailed",
    "Data",
    "StreamEvent",
    "StreamEnd",
    "StreamError",
    "CreditAvailable",
    "PongReceived",
    "HDR_LEN",
]

PROTOCOL_VERSION = 1
HDR = struct.Struct(">IIBBH")
HDR_LEN = 12
U32 = struct.Struct(">I")

HELLO, HELLO_OK, REQUEST, DATA, EVENT, END, ERROR, CANCEL, WINDOW, PING, PONG = range(1, 12)
TYPE_NAMES = {
    1: "HELLO", 2: "HELLO_OK", 3: "REQUEST", 4: "DATA", 5: "EVENT", 6: "END",
    7: "ERROR", 8: "CANCEL", 9: "WINDOW", 10: "PING", 11: "PONG",
}
FLAG_FIN = 0x01
FLAG_STDERR = 0x02

DEFAULT_MAX_FRAME = 1 << 20
MIN_MAX_FRAME = 16 << 10
ABS_MAX_FRAME = 16 << 20
DEFAULT_WINDOW = 256 << 10
MAX_CREDIT = 2**31 - 1
PING_MAX = 64
DATA_CHUNK = 64 << 10

EPROTO, EBADMSG, EMSGSIZE, ECONNRESET, ECANCELED = 71, 74, 90, 104, 125


def make_error(kind: str, code: int, message: str, path: Optional[bytes] = None,
               errno_name: Optional[str] = None) -> SandboxError:
    """The exception for an error of ``kind`` ("remote", "protocol", "connect", "local")."""
    from .errors import errno_name as _name

    name = errno_name or _name(code)
    p = None if path is None else path.decode("utf-8", "surrogateescape")
    return error_class(kind, code)(message, errno=code, errno_name=name, path=p, kind=kind)


def transport_error(what: str, e: BaseException, default: int, handshake: bool) -> SandboxError:
    """The exception for a transport that failed under us (reading or writing): a
    SandboxConnectionError; kind "connect" while the handshake was still going on."""
    from .errors import SandboxConnectionError, errno_name as _name

    code = getattr(e, "errno", None) or default
    msg = f"{what} the shim failed: {getattr(e, 'strerror', None) or e}"
    return SandboxConnectionError(msg, errno=code, errno_name=_name(code), kind="connect" if handshake else "local")


def remote_error(e: "_pb.Error", kind: str = "remote") -> SandboxError:
    """The exception for an Error message from the shim."""
    return make_error(kind, e.errno_num, e.message or "", e.path, e.errno_name)


# ---- events ----


class HandshakeDone:
    """HELLO_OK arrived: ``reply`` is the HelloReply."""

    __slots__ = ("reply",)

    def __init__(self, reply: "_pb.HelloReply") -> None:
        self.reply = reply


class ConnectionFailed:
    """The connection is over: an ERROR on stream 0, a protocol violation by the shim,
    or EOF. Every stream still open has failed with ``error`` (no per-stream events
    follow)."""

    __slots__ = ("error", "streams")

    def __init__(self, error: SandboxError, streams: List[int]) -> None:
        self.error = error
        self.streams = streams


class Data:
    """DATA on a stream: ``data`` (may be empty), ``fin`` (the shim's last DATA),
    ``stderr`` (exec/attach: these bytes are stderr)."""

    __slots__ = ("stream", "data", "fin", "stderr")

    def __init__(self, stream: int, data: bytes, fin: bool, stderr: bool) -> None:
        self.stream, self.data, self.fin, self.stderr = stream, data, fin, stderr


class StreamEvent:
    __slots__ = ("stream", "event")

    def __init__(self, stream: int, event: "_pb.Event") -> None:
        self.stream, self.event = stream, event


class StreamEnd:
    """END: the stream succeeded with ``result``; it is forgotten."""

    __slots__ = ("stream", "result")

    def __init__(self, stream: int, result: "_pb.Result") -> None:
        self.stream, self.result = stream, result


class StreamError:
    """ERROR on a stream: it failed with ``error``; it is forgotten."""

    __slots__ = ("stream", "error")

    def __init__(self, stream: int, error: SandboxError) -> None:
        self.stream, self.error = stream, error


class CreditAvailable:
    """WINDOW: the stream may send more (see Protocol.send_credit())."""

    __slots__ = ("stream",)

    def __init__(self, stream: int) -> None:
        self.stream = stream


class PongReceived:
    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


Event = Union[HandshakeDone, ConnectionFailed, Data, StreamEvent, StreamEnd, StreamError, CreditAvailable, PongReceived]


class _Stream:
    __slots__ = ("send_credit", "recv_credit", "unacked", "window", "local_fin", "remote_fin", "cancelled", "abandoned")

    def __init__(self, send_credit: int, window: int) -> None:
        self.send_credit = send_credit  # bytes we may send
        self.recv_credit = window       # bytes the shim may still send us
        self.unacked = 0                # consumed by the application, not yet given back
        self.window = window
        self.local_fin = False
        self.remote_fin = False
        self.cancelled = False
        self.abandoned = False          # nobody waits: data is dropped, events swallowed


class _Violation(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Protocol:
    """One connection's protocol state, client side.

    ``start()`` queues HELLO. ``open(request)`` queues a REQUEST and returns the new
    stream id. ``send_data()`` sends what the stream's credit allows and says how much
    it took; ``consumed()`` gives credit back to the shim as the application takes data.
    """

    def __init__(
        self,
        *,
        client_name: Optional[str] = None,
        token: Optional[bytes] = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        initial_window: int = DEFAULT_WINDOW,
    ) -> None:
        if not MIN_MAX_FRAME <= max_frame <= ABS_MAX_FRAME:
            raise ValueError(f"max_frame must be between {MIN_MAX_FRAME} and {ABS_MAX_FRAME}")
        if not 4096 <= initial_window <= MAX_CREDIT:
            raise ValueError("initial_window must be between 4096 and 2**31-1")
        self.client_name = client_name
        self.token = token
        self.my_max_frame = max_frame
        self.my_window = initial_window
        self.max_frame = max_frame     # the limit in force for what we receive and send
        self.send_window = DEFAULT_WINDOW
        self.max_streams: Optional[int] = None
        self.server: Optional[_pb.HelloReply] = None
        self.state = "new"             # new -> hello_sent -> open -> dead
        self.error: Optional[SandboxError] = None
        self._in = bytearray()
        self._out: List[bytes] = []
        self._out_bytes = 0
        self._streams: Dict[int, _Stream] = {}
        self._next_id = 1
        self._early_ping: Optional[bytes] = None

    # ---- output ----

    def _frame(self, stream: int, ftype: int, flags: int = 0, payload: bytes = b"") -> None:
        self._out.append(HDR.pack(len(payload), stream, ftype, flags, 0))
        if payload:
            self._out.append(payload)
        self._out_bytes += HDR_LEN + len(payload)

    def data_to_send(self) -> bytes:
        """Everything queued for the transport, in order (b"" if nothing)."""
        if not self._out:
            return b""
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out = []
        self._out_bytes = 0
        return out

    def pending_output(self) -> int:
        return self._out_bytes

    # ---- handshake ----

    def start(self) -> None:
        """Queue HELLO (the first bytes of the connection)."""
        if self.state != "new":
            raise RuntimeError("start() called twice")
        h = _pb.Hello(protocol_version=PROTOCOL_VERSION, client_name=self.client_name, token=self.token,
                      max_frame=self.my_max_frame, initial_window=self.my_window)
        self._frame(0, HELLO, 0, h.encode())
        self.state = "hello_sent"

    @property
    def is_open(self) -> bool:
        return self.state == "open"

    # ---- streams ----

    def streams_in_flight(self) -> int:
        return len(self._streams)

    def can_open(self) -> bool:
        """False while max_streams streams are in flight (wait for one to end)."""
        return self.max_streams is None or len(self._streams) < self.max_streams

    def open(self, request: Union["_pb.Request", bytes], *, extra_window: int = 0) -> int:
        """Queue REQUEST on a new stream; returns its id. ``extra_window`` grants the shim
        that much credit beyond the initial window right away (tunnel connections)."""
        self._check_open()
        payload = request if isinstance(request, (bytes, bytearray)) else request.encode()
        if len(payload) > self.max_frame:
            raise make_error("local", EMSGSIZE,
                             f"request of {len(payload)} bytes exceeds the frame limit of {self.max_frame}")
        sid = self._next_id
        if sid > 0xFFFFFFFF:
            raise make_error("local", 75, "stream ids used up on this connection: reconnect")
        self._next_id += 2
        st = _Stream(self.send_window, self.my_window)
        self._streams[sid] = st
        self._frame(sid, REQUEST, 0, bytes(payload))
        # never more credit than 2^31-1 (PROTOCOL.md 8)
        extra = min(extra_window, MAX_CREDIT - st.recv_credit)
        if extra > 0:
            st.recv_credit += extra
            st.window += extra  # credit goes back in batches of half of all of it
            self._frame(sid, WINDOW, 0, U32.pack(extra))
        return sid

    def _check_open(self) -> None:
        if self.state == "dead":
            assert self.error is not None
            raise self.error
        if self.state != "open":
            raise RuntimeError("the handshake is not complete")

    def has_stream(self, sid: int) -> bool:
        return sid in self._streams

    def send_credit(self, sid: int) -> int:
        st = self._streams.get(sid)
        return 0 if st is None or st.local_fin else st.send_credit

    def send_data(self, sid: int, data: Union[bytes, bytearray, memoryview], fin: bool = False) -> int:
        """Queue DATA within the stream's credit; returns how many bytes were taken.
        FIN goes with the last byte, only once all of ``data`` is taken (empty data
        with fin=True needs no credit). A stream that has ended takes everything
        (silently dropped: the END or ERROR says what happened)."""
        st = self._streams.get(sid)
        n = len(data)
        if st is None or st.cancelled:
            return n
        if st.local_fin:
            raise RuntimeError(f"DATA after FIN on stream {sid}")
        take = min(n, st.send_credit)
        mv = memoryview(data) if take < n or not isinstance(data, bytes) else None
        pos = 0
        limit = min(self.max_frame, DATA_CHUNK * 4)
        while pos < take:
            k = min(take - pos, limit)
            last = pos + k == take
            flags = FLAG_FIN if (fin and last and take == n) else 0
            chunk = data if (mv is None and k == n) else bytes((mv if mv is not None else memoryview(data))[pos:pos + k])
            self._frame(sid, DATA, flags, chunk)  # type: ignore[arg-type]
            pos += k
        st.send_credit -= take
        if fin and take == n:
            if n == 0:
                self._frame(sid, DATA, FLAG_FIN)
            st.local_fin = True
        return take

    def consumed(self, sid: int, n: int) -> None:
        """The application took ``n`` bytes of the stream's DATA: give the credit back
        once about half the window has been taken (PROTOCOL.md 8)."""
        st = self._streams.get(sid)
        if st is None or n <= 0 or st.remote_fin:
            return
        st.unacked += n
        if st.unacked >= st.window // 2:
            self._grant(sid, st)

    def _grant(self, sid: int, st: _Stream) -> None:
        inc = min(st.unacked, MAX_CREDIT - st.recv_credit)
        st.unacked = 0
        if inc > 0:
            st.recv_credit += inc
            self._frame(sid, WINDOW, 0, U32.pack(inc))

    def cancel(self, sid: int) -> None:
        """Queue CANCEL; the stream stays until its END or ERROR arrives."""
        st = self._streams.get(sid)
        if st is None or st.cancelled or self.state != "open":
            return
        st.cancelled = True
        self._frame(sid, CANCEL)

    def abandon(self, sid: int) -> None:
        """Nobody waits for this stream any more (a timeout, an abort, a closed
        iterator): CANCEL it and drop whatever still comes for it."""
        st = self._streams.get(sid)
        if st is None:
            return
        self.cancel(sid)
        st.abandoned = True

    def ping(self, payload: bytes) -> None:
        self._check_open()
        if len(payload) > PING_MAX:
            raise ValueError("a PING payload is at most 64 bytes")
        self._frame(0, PING, 0, payload)

    # ---- input ----

    def receive_eof(self) -> List[Event]:
        """The transport reached EOF (or failed): the connection is over."""
        if self.state == "dead":
            return []
        if self._in:
            return self._die(make_error("protocol", EPROTO, "truncated frame (the connection ended in the middle of a frame)"))
        if self.state == "hello_sent":
            return self._die(make_error("connect", ECONNRESET, "the shim closed the connection during the handshake"))
        return self._die(make_error("local", ECONNRESET, "the connection was closed by the shim"))

    def fail(self, error: SandboxError) -> List[Event]:
        """The transport failed (or the application closes): end everything with error."""
        if self.state == "dead":
            return []
        return self._die(error)

    def _die(self, error: SandboxError) -> List[Event]:
        self.state = "dead"
        self.error = error
        streams = [sid for sid, st in self._streams.items() if not st.abandoned]
        self._streams.clear()
        self._in = bytearray()
        return [ConnectionFailed(error, streams)]

    def receive(self, data: Union[bytes, bytearray, memoryview]) -> List[Event]:
        """Take bytes the transport read; returns the events they complete."""
        if self.state == "dead":
            return []
        if self._in:
            self._in += data
            buf: Union[bytes, bytearray, memoryview] = self._in
            self._in = bytearray()  # buf is ours now: exported to mv below, never resized
        else:
            buf = data  # the common case: no partial frame left from the last read
        mv = memoryview(buf)
        events: List[Event] = []
        pos = 0
        n = len(buf)
        try:
            while n - pos >= HDR_LEN:
                length, sid, ftype, flags, reserved = HDR.unpack_from(mv, pos)
                # checked before a byte of the payload is waited for (PROTOCOL.md 2)
                if length > self.max_frame:
                    raise _Violation(EMSGSIZE, f"frame of {length} bytes exceeds the limit of {self.max_frame}")
                if ftype == 0 or reserved != 0:
                    raise _Violation(EPROTO, "malformed frame header")
                if ftype > PONG:
                    raise _Violation(EPROTO, f"unknown frame type {ftype}")
                if n - pos - HDR_LEN < length:
                    break
                start = pos + HDR_LEN
                payload = bytes(mv[start:start + length]) if length else b""  # the one copy
                pos = start + length
                self._dispatch(sid, ftype, flags, payload, events)
                if self.state == "dead":
                    return events
        except _Violation as v:
            events.extend(self._die(make_error("protocol", v.code, v.message)))
            return events
        if pos < n:
            self._in += mv[pos:]  # a partial frame waits for the next read
        return events

    def _dispatch(self, sid: int, ftype: int, flags: int, payload: bytes, events: List[Event]) -> None:
        if sid == 0:
            self._conn_frame(ftype, payload, events)
            return
        if self.state != "open":
            raise _Violation(EPROTO, f"{TYPE_NAMES[ftype]} on stream {sid} before HELLO_OK")
        st = self._streams.get(sid)
        if st is None:
            if sid & 1 and sid < self._next_id:
                # a stream that ended: the shim sends nothing after END/ERROR
                raise _Violation(EPROTO, f"{TYPE_NAMES[ftype]} on stream {sid}, which has ended")
            raise _Violation(EPROTO, f"{TYPE_NAMES[ftype]} for unknown stream {sid}")
        if ftype == DATA:
            n = len(payload)
            if st.remote_fin:
                raise _Violation(EPROTO, f"DATA after FIN on stream {sid}")
            if n > st.recv_credit:
                raise _Violation(EPROTO, f"flow control violated on stream {sid} ({n} bytes, credit {st.recv_credit})")
            st.recv_credit -= n
            fin = bool(flags & FLAG_FIN)
            if fin:
                st.remote_fin = True
            if st.abandoned:
                st.unacked += n
                if st.unacked >= st.window // 2:
                    self._grant(sid, st)
                return
            events.append(Data(sid, payload, fin, bool(flags & FLAG_STDERR)))
        elif ftype == WINDOW:
            if len(payload) != 4:
                raise _Violation(EPROTO, f"WINDOW payload of {len(payload)} bytes on stream {sid}")
            inc = U32.unpack(payload)[0]
            if inc == 0 or st.send_credit + inc > MAX_CREDIT:
                raise _Violation(EPROTO, f"bad WINDOW increment {inc} on stream {sid}")
            st.send_credit += inc
            if not st.abandoned:
                events.append(CreditAvailable(sid))
        elif ftype == EVENT:
            ev = self._decode(_pb.Event, payload, sid)
            if not st.abandoned:
                events.append(StreamEvent(sid, ev))
        elif ftype == END:
            res = self._decode(_pb.Result, payload, sid)
            del self._streams[sid]
            if not st.abandoned:
                events.append(StreamEnd(sid, res))
        elif ftype == ERROR:
            err = self._decode(_pb.Error, payload, sid)
            del self._streams[sid]
            if not st.abandoned:
                events.append(StreamError(sid, remote_error(err)))
        else:
            raise _Violation(EPROTO, f"unexpected {TYPE_NAMES[ftype]} from the shim on stream {sid}")

    @staticmethod
    def _decode(cls: type, payload: bytes, sid: int) -> object:
        try:
            return cls.decode(payload)  # type: ignore[attr-defined]
        except _pb.DecodeError as e:
            raise _Violation(EBADMSG, f"cannot decode {cls.__name__} on stream {sid}: {e}") from None

    def _conn_frame(self, ftype: int, payload: bytes, events: List[Event]) -> None:
        if ftype == PING:
            if len(payload) > PING_MAX:
                raise _Violation(EPROTO, f"PING payload of {len(payload)} bytes (at most 64)")
            if self.state != "open":
                # we may send nothing before HELLO_OK (PROTOCOL.md 5): answer once it is here
                self._early_ping = payload
            else:
                self._frame(0, PONG, 0, payload)
        elif ftype == PONG:
            events.append(PongReceived(payload))
        elif ftype == ERROR:
            try:
                err = _pb.Error.decode(payload)
            except _pb.DecodeError:
                raise _Violation(EBADMSG, "cannot decode Error on stream 0") from None
            kind = "connect" if self.state == "hello_sent" else "remote"
            events.extend(self._die(remote_error(err, kind)))
        elif ftype == HELLO_OK:
            if self.state != "hello_sent":
                raise _Violation(EPROTO, "HELLO_OK twice" if self.state == "open" else "HELLO_OK before HELLO")
            try:
                rep = _pb.HelloReply.decode(payload)
            except _pb.DecodeError:
                raise _Violation(EBADMSG, "cannot decode HelloReply") from None
            if rep.protocol_version != PROTOCOL_VERSION:
                raise _Violation(93, f"the shim speaks protocol version {rep.protocol_version}, not 1")
            if not MIN_MAX_FRAME <= rep.max_frame <= ABS_MAX_FRAME:
                raise _Violation(EPROTO, f"HelloReply.max_frame {rep.max_frame} out of range")
            if not 1 <= rep.initial_window <= MAX_CREDIT:
                raise _Violation(EPROTO, f"HelloReply.initial_window {rep.initial_window} out of range")
            self.server = rep
            # the limit is the smaller of the two sides' (PROTOCOL.md 10)
            self.max_frame = min(rep.max_frame, self.my_max_frame)
            self.send_window = rep.initial_window
            self.max_streams = rep.max_streams or None
            self.state = "open"
            if self._early_ping is not None:
                self._frame(0, PONG, 0, self._early_ping)
                self._early_ping = None
            events.append(HandshakeDone(rep))
        else:
            raise _Violation(EPROTO, f"unexpected {TYPE_NAMES[ftype]} on stream 0")
