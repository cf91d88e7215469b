"""_sync: the blocking connection behind Shim: one Protocol, one reader thread.

The reader thread is the only one that reads the transport; it feeds the Protocol and
wakes the calls whose streams got something (one lock guards the Protocol and every
stream). Any thread writes: it queues frames under the lock, then whoever holds the
write lock sends everything queued, so frames (and stream ids) go out in the order
they were queued and the reader never blocks on a write.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Union

from . import _pb
from ._protocol import (
    ConnectionFailed,
    CreditAvailable,
    Data,
    HandshakeDone,
    PongReceived,
    Protocol,
    StreamEnd,
    StreamError,
    StreamEvent,
    make_error,
    transport_error,
)
from .errors import SandboxAbortError, SandboxConnectionError, SandboxError, SandboxTimeoutError

ECANCELED, ETIMEDOUT, ECONNABORTED = 125, 110, 103
READ_SIZE = 256 << 10
# how long a cancelled call waits for the shim's END/ERROR before it gives up on it
CANCEL_WAIT = 5.0


def deadline_of(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def timeout_error(what: str = "the call") -> SandboxTimeoutError:
    return SandboxTimeoutError(f"{what} timed out", errno=ETIMEDOUT, errno_name="ETIMEDOUT", kind="local")  # type: ignore[return-value]


def abort_error(msg: str = "aborted") -> SandboxAbortError:
    return SandboxAbortError(msg, errno=ECANCELED, errno_name="ECANCELED", kind="local")


def closed_error() -> SandboxConnectionError:
    return SandboxConnectionError("the connection was closed", errno=ECONNABORTED, errno_name="ECONNABORTED", kind="local")


class Call:
    """One stream as the sync engine sees it. ``next()`` returns Data and StreamEvent
    items in order and None once END arrived (``result``); an ERROR raises."""

    def __init__(self, engine: "Engine", sid: int, deadline: Optional[float], abort: Any) -> None:
        self.engine = engine
        self.sid = sid
        self.deadline = deadline
        self.abort = abort
        self.items: Deque[Union[Data, StreamEvent]] = collections.deque()
        self.result: Optional[_pb.Result] = None
        self.error: Optional[BaseException] = None
        self.done = False
        self.aborted = False
        self.cond = threading.Condition(engine.lock)

    # ---- waiting (with engine.lock held) ----

    def _wait(self, pred: Callable[[], bool], deadline: Optional[float]) -> None:
        """Wait for pred() (lock held); on timeout or abort the stream is given up:
        CANCEL sent, and the matching exception raised."""
        abort = self.abort
        while not pred():
            if abort is not None and abort.is_set():
                self._give_up_locked(aborted=True)
                raise abort_error()
            if deadline is None:
                left = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._give_up_locked(aborted=False)
                    raise timeout_error()
            if abort is not None:
                left = 0.01 if left is None else min(left, 0.01)
            self.cond.wait(left)

    def _give_up_locked(self, aborted: bool) -> None:
        if self.done:
            return
        self.aborted = self.aborted or aborted
        if aborted:
            # an abort waits (briefly) for the shim to confirm, so that what the call
            # did is undone when it returns (a partial upload discarded...)
            self.engine.proto.cancel(self.sid)
            self._flush_unlocked()
            end = time.monotonic() + CANCEL_WAIT
            while not self.done:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            if self.done:
                return
        self.engine.proto.abandon(self.sid)
        self.engine.forget_locked(self)
        self._flush_unlocked()

    def _flush_unlocked(self) -> None:
        """With the lock held: write what is queued (the lock is let go meanwhile)."""
        self.cond.release()
        try:
            self.engine.flush()
        finally:
            self.cond.acquire()

    def _raise(self) -> None:
        e = self.error
        assert e is not None
        if self.aborted:
            if isinstance(e, SandboxError) and e.errno == ECANCELED:
                raise SandboxAbortError(e.message or "aborted", errno=ECANCELED, errno_name="ECANCELED",
                                        path=e.path, kind=e.kind)
        raise e

    # ---- reading ----

    def next(self, timeout: Optional[float] = None) -> Union[Data, StreamEvent, None]:
        """The next item; None at END. ``timeout`` overrides the call's deadline."""
        deadline = self.deadline if timeout is None else time.monotonic() + timeout
        with self.cond:
            if self.abort is not None and (self.items or not self.done) and self.abort.is_set():
                # aborted while data was still to come (or to be taken): the rest is dropped
                self.items.clear()
                self._give_up_locked(aborted=True)
                raise abort_error()
            if not self.items and not self.done:
                self._wait(lambda: bool(self.items) or self.done, deadline)
            if self.items:
                it = self.items.popleft()
                if isinstance(it, Data) and it.data:
                    self.engine.proto.consumed(self.sid, len(it.data))
                    kick = True
                else:
                    kick = False
            else:
                if self.error is not None:
                    self._raise()
                return None
        if kick:
            self.engine.flush()
        return it

    def wait_end(self, timeout: Optional[float] = None, *, discard: bool = True) -> "_pb.Result":
        """Wait for END (DATA still coming is consumed and dropped when discard)."""
        while True:
            it = self.next(timeout)
            if it is None:
                assert self.result is not None
                return self.result
            if not discard and isinstance(it, Data) and it.data:
                raise make_error("protocol", 71, f"unexpected DATA on stream {self.sid}")

    # ---- writing ----

    def write(self, data: Union[bytes, bytearray, memoryview], fin: bool = False) -> None:
        """Send all of data (waiting for credit); with fin, end our direction."""
        eng = self.engine
        # a view, never a slice of the bytes: slicing bytes copies the rest every round
        mv = memoryview(data).cast("B")
        pos, n = 0, len(mv)
        while True:
            with self.cond:
                if self.done:
                    if self.error is not None:
                        self._raise()
                    return  # ended meanwhile: END will tell
                if pos < n and eng.proto.send_credit(self.sid) == 0:
                    self._wait(lambda: self.done or eng.proto.send_credit(self.sid) > 0, self.deadline)
                    continue
                chunk = mv if pos == 0 else mv[pos:]
                took = eng.proto.send_data(self.sid, chunk, fin)
                pos += took
            eng.flush()
            if pos >= n:
                return

    def finish(self) -> None:
        self.write(b"", fin=True)

    def cancel(self) -> None:
        with self.cond:
            self.engine.proto.cancel(self.sid)
        self.engine.flush()

    def close(self) -> None:
        """Give the stream up if it has not ended (CANCEL; later frames dropped)."""
        with self.cond:
            self.abandon_locked()
        self.engine.flush()

    def abandon_locked(self) -> None:
        if self.done:
            return
        self.engine.proto.abandon(self.sid)
        self.engine.forget_locked(self)
        self.done = True
        self.error = closed_error()
        self.cond.notify_all()  # a thread blocked in next() or write() on it returns


class Engine:
    """A Protocol over a sync transport, with a reader thread."""

    def __init__(self, transport: Any, proto: Protocol) -> None:
        self.transport = transport
        self.proto = proto
        self.lock = threading.Lock()
        self.wlock = threading.Lock()
        self.hello = threading.Condition(self.lock)
        self.slots = threading.Condition(self.lock)  # a stream ended: room under max_streams
        self.calls: Dict[int, Call] = {}
        self._dropped: Deque[Call] = collections.deque()  # drop() could not lock: for open()
        self.closed = False
        self.default_timeout: Optional[float] = None
        self.error: Optional[BaseException] = None
        self.pongs: Dict[bytes, Any] = {}
        self._ping_seq = 0
        self._closers: "Dict[int, Any]" = {}  # weakref.WeakMethod each
        self._reader = threading.Thread(target=_reader_main, args=(weakref.proxy(self), transport),
                                        name="sandbox_shim-reader", daemon=True)

    # ---- start-up ----

    def handshake(self, timeout: Optional[float]) -> _pb.HelloReply:
        with self.lock:
            self.proto.start()
        self._reader.start()
        self.flush()
        deadline = deadline_of(timeout)
        with self.lock:
            while not self.proto.is_open and self.error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self.hello.wait(left)
            if self.proto.is_open:
                assert self.proto.server is not None
                return self.proto.server
            err = self.error
        self.close()
        if err is None:
            raise SandboxTimeoutError("no answer to HELLO (the handshake timed out)", errno=ETIMEDOUT,
                                      errno_name="ETIMEDOUT", kind="connect")
        raise err

    # ---- writing ----

    def flush(self) -> None:
        """Write everything queued. If another thread is writing, it writes ours too."""
        while True:
            if not self.wlock.acquire(blocking=False):
                return
            try:
                while True:
                    with self.lock:
                        out = self.proto.data_to_send()
                    if not out:
                        break
                    try:
                        self.transport.write(out)
                    except (OSError, ValueError) as e:
                        self._transport_failed(e)
                        return
            finally:
                self.wlock.release()
            with self.lock:
                if not self.proto.pending_output():
                    return

    def _transport_failed(self, e: BaseException) -> None:
        with self.lock:
            if self.proto.state == "hello_sent" and not self.closed:
                # the shim may have refused us before reading HELLO (PROTOCOL.md 5): its
                # ERROR, or EOF, is what the reader will report, not our EPIPE
                return
            err = transport_error("writing to", e, 32, False)
            if self.closed and self.error is None:
                err = closed_error()
            self._apply(self.proto.fail(err))

    # ---- calls ----

    def open(self, req: "_pb.Request", *, timeout: Optional[float] = None, abort: Any = None,
             extra_window: int = 0, use_default: bool = True) -> Call:
        """Send REQUEST on a new stream (waiting for room under max_streams). Without
        ``timeout`` the connection's default request timeout applies, if any (unless
        use_default is False: a process handle's stream lives as long as it runs)."""
        if timeout is None and use_default:
            timeout = self.default_timeout
        if abort is not None and abort.is_set():
            raise abort_error("aborted before it started")
        deadline = deadline_of(timeout)
        payload = req.encode()
        with self.lock:
            while True:
                if self.error is not None:
                    raise self.error
                while self._dropped:
                    self._dropped.popleft().abandon_locked()  # (their CANCELs go with ours)
                if self.proto.can_open():
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise timeout_error("waiting for a free stream")
                self.slots.wait(left if abort is None else min(left or 0.01, 0.01))
                if abort is not None and abort.is_set():
                    raise abort_error()
            sid = self.proto.open(payload, extra_window=extra_window)
            call = Call(self, sid, deadline, abort)
            self.calls[sid] = call
        self.flush()
        return call

    def request(self, req: "_pb.Request", *, timeout: Optional[float] = None, abort: Any = None) -> "_pb.Result":
        """A request without DATA: its Result."""
        return self.open(req, timeout=timeout, abort=abort).wait_end()

    def drop(self, call: Call) -> None:
        """The stream of a handle nobody holds any more (its __del__, which the garbage
        collector may run on any thread in the middle of anything, this engine's own
        locked sections included): given up now if the lock is free, else by the next
        open(). Never waits for a lock."""
        if call.done:
            return
        if not self.lock.acquire(blocking=False):
            self._dropped.append(call)
            return
        try:
            call.abandon_locked()
        finally:
            self.lock.release()
        self.flush()

    def forget_locked(self, call: Call) -> None:
        if self.calls.pop(call.sid, None) is not None:
            self.slots.notify()

    def ping(self, timeout: Optional[float], abort: Any) -> float:
        deadline = deadline_of(timeout)
        with self.lock:
            if self.error is not None:
                raise self.error
            self._ping_seq += 1
            payload = self._ping_seq.to_bytes(8, "big")
            box: List[Any] = []
            self.pongs[payload] = box
            t0 = time.monotonic()
            self.proto.ping(payload)
        self.flush()
        with self.lock:
            try:
                while not box and self.error is None:
                    if abort is not None and abort.is_set():
                        raise abort_error()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise timeout_error("ping")
                    if abort is not None:
                        left = 0.01 if left is None else min(left, 0.01)
                    self.hello.wait(left)
                if not box:
                    assert self.error is not None
                    raise self.error
                return box[0] - t0
            finally:
                self.pongs.pop(payload, None)

    # ---- events from the reader ----

    def _apply(self, events: List[Any]) -> None:
        """With lock held: route events to their calls."""
        for ev in events:
            t = type(ev)
            if t is Data or t is StreamEvent:
                c = self.calls.get(ev.stream)
                if c is not None:
                    c.items.append(ev)
                    c.cond.notify_all()
            elif t is CreditAvailable:
                c = self.calls.get(ev.stream)
                if c is not None:
                    c.cond.notify_all()
            elif t is StreamEnd or t is StreamError:
                c = self.calls.pop(ev.stream, None)
                if c is not None:
                    c.done = True
                    if t is StreamEnd:
                        c.result = ev.result
                    else:
                        c.error = ev.error
                    c.cond.notify_all()
                self.slots.notify()
            elif t is PongReceived:
                box = self.pongs.get(ev.payload)
                if box is not None and not box:
                    box.append(time.monotonic())
                    self.hello.notify_all()
            elif t is HandshakeDone:
                self.hello.notify_all()
            elif t is ConnectionFailed:
                self.error = ev.error
                for c in self.calls.values():
                    c.done = True
                    c.error = ev.error
                    c.cond.notify_all()
                self.calls.clear()
                self.hello.notify_all()
                self.slots.notify_all()

    def feed(self, data: bytes) -> None:
        with self.lock:
            self._apply(self.proto.receive(data) if data else self.proto.receive_eof())
        if self.proto.pending_output():
            self.flush()

    # ---- closing ----

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.closed = True
                self.transport.close()
        except Exception:
            pass

    def add_closer(self, key: int, fn: Callable[[], None]) -> None:
        """fn, a handle's bound method, is called when the connection closes. Held
        weakly: a handle its user drops is collected, and its __del__ cancels its stream
        (a strong reference here would keep every dropped handle's stream open until
        the streams run out)."""
        closers = self._closers

        def gone(ref: Any, key: int = key) -> None:
            # (the object is being freed: its id cannot be reused before this runs)
            if closers.get(key) is ref:
                closers.pop(key, None)

        ref = weakref.WeakMethod(fn, gone)  # type: ignore[arg-type]
        with self.lock:
            self._closers[key] = ref

    def remove_closer(self, key: int) -> None:
        with self.lock:
            self._closers.pop(key, None)

    def close(self) -> None:
        """Fail every call in flight, close the transport, stop the reader."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._apply(self.proto.fail(closed_error()))
            self.error = closed_error()
            closers = [ref() for ref in self._closers.values()]
            self._closers.clear()
        for fn in closers:
            try:
                if fn is not None:
                    fn()
            except Exception:
                pass
        try:
            self.transport.close()
        except Exception:
            pass
        if self._reader.is_alive() and threading.current_thread() is not self._reader:
            self._reader.join(10)


def _reader_main(engine: Any, transport: Any) -> None:
    """The reader thread: holds the engine only weakly, so that a Shim nobody holds
    any more is collected (and closed) while its reader waits on the socket."""
    readinto = getattr(transport, "readinto", None)
    view = memoryview(bytearray(READ_SIZE)) if readinto is not None else None
    while True:
        try:
            if readinto is not None:
                # one buffer for the connection's life (Protocol.receive copies payloads
                # out): no 256 KiB bytes object malloc'd, shrunk and freed per read
                n = readinto(view)
                data = view[:n] if n else b""
            else:
                data = transport.read(READ_SIZE)
        except ReferenceError:
            return
        except Exception as e:  # the transport broke (or was closed under us)
            try:
                with engine.lock:
                    err = closed_error() if engine.closed else transport_error(
                        "reading from", e, 104, engine.proto.state == "hello_sent")
                    engine._apply(engine.proto.fail(err))
            except ReferenceError:
                pass
            return
        try:
            engine.feed(data)
            if not data or engine.error is not None:
                # the connection is over (EOF, ERROR on stream 0, a protocol violation):
                # close it, so that the shim cancels what still runs for us (PROTOCOL.md 15)
                try:
                    transport.close()
                except Exception:
                    pass
                return
        except ReferenceError:
            return
