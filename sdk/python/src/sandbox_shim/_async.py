"""_async: the asyncio connection behind AsyncShim: one Protocol, one reader task.

No threads: the reader task reads the transport and feeds the Protocol; calls wait on
futures; writes are queued in the Protocol and sent by one writer task, in order. A
call whose awaiting task is cancelled sends CANCEL (its stream is given up), and so
does one whose ``abort=`` event (asyncio.Event, or anything with is_set()) fires.
Works under any asyncio loop, Pyodide's included.
"""

from __future__ import annotations

import asyncio
import collections
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
    transport_error,
)
from ._sync import abort_error, closed_error, timeout_error
from .errors import SandboxAbortError, SandboxError, SandboxTimeoutError

ECANCELED, ETIMEDOUT = 125, 110
READ_SIZE = 256 << 10
CANCEL_WAIT = 5.0
POLL = 0.01


class AsyncCall:
    """One stream. ``await next()`` returns Data and StreamEvent items in order and None
    once END arrived (``result``); an ERROR raises."""

    def __init__(self, engine: "AsyncEngine", sid: int, deadline: Optional[float], abort: Any) -> None:
        self.engine = engine
        self.sid = sid
        self.deadline = deadline
        self.abort = abort
        self.items: Deque[Union[Data, StreamEvent]] = collections.deque()
        self.result: Optional[_pb.Result] = None
        self.error: Optional[BaseException] = None
        self.done = False
        self.aborted = False
        self._waiters: "set[asyncio.Future[None]]" = set()

    def _wake(self) -> None:
        for w in self._waiters:
            if not w.done():
                w.set_result(None)

    async def _wait(self, pred: Callable[[], bool], deadline: Optional[float]) -> None:
        loop = self.engine.loop
        abort = self.abort
        abort_task: Optional[asyncio.Future[Any]] = None
        try:
            while not pred():
                if abort is not None and abort.is_set():
                    await self._give_up(aborted=True)
                    raise abort_error()
                timeout: Optional[float] = None
                if deadline is not None:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        await self._give_up(aborted=False)
                        raise timeout_error()
                w = loop.create_future()
                self._waiters.add(w)
                waits: List[Any] = [w]
                if abort is not None:
                    if isinstance(abort, asyncio.Event):
                        if abort_task is None:
                            abort_task = asyncio.ensure_future(abort.wait())
                        waits.append(abort_task)
                    else:  # a threading.Event or the like: polled
                        timeout = POLL if timeout is None else min(timeout, POLL)
                try:
                    if timeout is None and len(waits) == 1:
                        await w  # the common case: just the future
                    else:
                        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    # the awaiting task was cancelled: the call is cancelled in the shim
                    self.give_up_now()
                    raise
                finally:
                    self._waiters.discard(w)
        finally:
            if abort_task is not None and not abort_task.done():
                abort_task.cancel()

    async def _give_up(self, aborted: bool) -> None:
        if self.done:
            return
        self.aborted = self.aborted or aborted
        eng = self.engine
        if aborted:
            eng.proto.cancel(self.sid)
            eng.kick()
            end = eng.loop.time() + CANCEL_WAIT
            while not self.done:
                left = end - eng.loop.time()
                if left <= 0:
                    break
                w = eng.loop.create_future()
                self._waiters.add(w)
                try:
                    await asyncio.wait([w], timeout=left)
                finally:
                    self._waiters.discard(w)
            if self.done:
                return
        self.give_up_now()

    def give_up_now(self) -> None:
        """CANCEL and forget the stream (later frames for it are dropped)."""
        if self.done:
            return
        eng = self.engine
        eng.proto.abandon(self.sid)
        eng.forget(self)
        self.done = True
        self.error = closed_error()
        eng.kick()

    def _raise(self) -> None:
        e = self.error
        assert e is not None
        if self.aborted and isinstance(e, SandboxError) and e.errno == ECANCELED:
            raise SandboxAbortError(e.message or "aborted", errno=ECANCELED, errno_name="ECANCELED", path=e.path,
                                    kind=e.kind)
        raise e

    async def next(self, timeout: Optional[float] = None) -> Union[Data, StreamEvent, None]:
        """The next item; None at END. ``timeout`` overrides the call's deadline."""
        deadline = self.deadline if timeout is None else self.engine.loop.time() + timeout
        if self.abort is not None and (self.items or not self.done) and self.abort.is_set():
            # aborted while data was still to come (or to be taken): the rest is dropped
            self.items.clear()
            await self._give_up(aborted=True)
            raise abort_error()
        if not self.items and not self.done:
            await self._wait(lambda: bool(self.items) or self.done, deadline)
        if self.items:
            it = self.items.popleft()
            if type(it) is Data and it.data:
                self.engine.proto.consumed(self.sid, len(it.data))
                self.engine.kick()
            return it
        if self.error is not None:
            self._raise()
        return None

    async def wait_end(self, timeout: Optional[float] = None) -> "_pb.Result":
        while True:
            it = await self.next(timeout)
            if it is None:
                assert self.result is not None
                return self.result

    async def write(self, data: Union[bytes, bytearray, memoryview], fin: bool = False) -> None:
        """Send all of data (waiting for credit); with fin, end our direction."""
        eng = self.engine
        # a view, never a slice of the bytes: slicing bytes copies the rest every round
        mv = memoryview(data).cast("B")
        pos, n = 0, len(mv)
        while True:
            if self.done:
                if self.error is not None:
                    self._raise()
                return
            if pos < n and eng.proto.send_credit(self.sid) == 0:
                await self._wait(lambda: self.done or eng.proto.send_credit(self.sid) > 0, self.deadline)
                continue
            took = eng.proto.send_data(self.sid, mv if pos == 0 else mv[pos:], fin)
            pos += took
            eng.kick()
            # back-pressure from the transport: don't queue far ahead of what it takes
            if eng.proto.pending_output() > eng.high_water:
                await eng.drained()
            if pos >= n:
                return

    async def finish(self) -> None:
        await self.write(b"", fin=True)

    def cancel(self) -> None:
        self.engine.proto.cancel(self.sid)
        self.engine.kick()

    def close(self) -> None:
        """Give the stream up if it has not ended (CANCEL; later frames dropped)."""
        self.give_up_now()


class AsyncEngine:
    """A Protocol over an async transport (``async read/write/close``)."""

    high_water = 1 << 20

    def __init__(self, transport: Any, proto: Protocol) -> None:
        self.transport = transport
        self.proto = proto
        self.loop = asyncio.get_running_loop()
        self.calls: Dict[int, AsyncCall] = {}
        self.closed = False
        self.error: Optional[BaseException] = None
        self.default_timeout: Optional[float] = None
        self._hello: "asyncio.Future[None]" = self.loop.create_future()
        self._pongs: Dict[bytes, "asyncio.Future[float]"] = {}
        self._ping_seq = 0
        self._slot_waiters: Deque["asyncio.Future[None]"] = collections.deque()
        self._write_event = asyncio.Event()
        self._drain_waiters: List["asyncio.Future[None]"] = []
        self._closers: Dict[int, Any] = {}  # weakref.WeakMethod each
        self._reader: Optional[asyncio.Task[None]] = None
        self._writer: Optional[asyncio.Task[None]] = None
        self._write_nowait = getattr(transport, "write_nowait", None)

    # ---- start-up ----

    async def handshake(self, timeout: Optional[float]) -> _pb.HelloReply:
        self.proto.start()
        self._reader = asyncio.ensure_future(self._read_loop())
        self._writer = asyncio.ensure_future(self._write_loop())
        self.kick()
        try:
            await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise SandboxTimeoutError("no answer to HELLO (the handshake timed out)", errno=ETIMEDOUT,
                                      errno_name="ETIMEDOUT", kind="connect") from None
        except BaseException:
            await self.close()
            raise
        assert self.proto.server is not None
        return self.proto.server

    # ---- writing ----

    def kick(self) -> None:
        if self.proto.pending_output():
            w = self._write_nowait
            if w is not None and self.error is None:
                try:
                    if w(self.proto, self.high_water):
                        return
                except Exception:
                    pass  # the writer task finds out and fails the connection
            self._write_event.set()

    async def drained(self) -> None:
        if not self.proto.pending_output() or self.error is not None:
            return
        f = self.loop.create_future()
        self._drain_waiters.append(f)
        await f

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._write_event.wait()
                self._write_event.clear()
                while True:
                    out = self.proto.data_to_send()
                    if not out:
                        break
                    await self.transport.write(out)
                for f in self._drain_waiters:
                    if not f.done():
                        f.set_result(None)
                self._drain_waiters.clear()
                if self.error is not None:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self.proto.state == "hello_sent" and not self.closed:
                return  # refused before HELLO was read: the reader reports the shim's ERROR or EOF
            self._apply(self.proto.fail(closed_error() if self.closed else transport_error(
                "writing to", e, 32, False)))

    # ---- reading ----

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.transport.read(READ_SIZE)
                self._apply(self.proto.receive(data) if data else self.proto.receive_eof())
                self.kick()
                if not data or self.error is not None:
                    # over: close it, so that the shim cancels what still runs for us
                    if not self.closed:
                        self.closed = True
                        try:
                            await self.transport.close()
                        except Exception:
                            pass
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._apply(self.proto.fail(closed_error() if self.closed else transport_error(
                "reading from", e, 104, self.proto.state == "hello_sent")))

    def _apply(self, events: List[Any]) -> None:
        for ev in events:
            t = type(ev)
            if t is Data or t is StreamEvent:
                c = self.calls.get(ev.stream)
                if c is not None:
                    c.items.append(ev)
                    c._wake()
            elif t is CreditAvailable:
                c = self.calls.get(ev.stream)
                if c is not None:
                    c._wake()
            elif t is StreamEnd or t is StreamError:
                c = self.calls.pop(ev.stream, None)
                if c is not None:
                    c.done = True
                    if t is StreamEnd:
                        c.result = ev.result
                    else:
                        c.error = ev.error
                    c._wake()
                self._free_slot()
            elif t is PongReceived:
                f = self._pongs.get(ev.payload)
                if f is not None and not f.done():
                    f.set_result(self.loop.time())
            elif t is HandshakeDone:
                if not self._hello.done():
                    self._hello.set_result(None)
            elif t is ConnectionFailed:
                self.error = ev.error
                for c in self.calls.values():
                    c.done = True
                    c.error = ev.error
                    c._wake()
                self.calls.clear()
                if not self._hello.done():
                    self._hello.set_exception(ev.error)
                    self._hello.exception()  # retrieved: no warning if nobody awaits it
                for f in list(self._pongs.values()):
                    if not f.done():
                        f.set_exception(ev.error)
                        f.exception()
                while self._slot_waiters:
                    f2 = self._slot_waiters.popleft()
                    if not f2.done():
                        f2.set_result(None)
                for f3 in self._drain_waiters:
                    if not f3.done():
                        f3.set_result(None)
                self._drain_waiters.clear()
                self._write_event.set()

    def _free_slot(self) -> None:
        while self._slot_waiters:
            f = self._slot_waiters.popleft()
            if not f.done():
                f.set_result(None)
                return

    def forget(self, call: AsyncCall) -> None:
        if self.calls.pop(call.sid, None) is not None:
            self._free_slot()

    # ---- calls ----

    async def open(self, req: "_pb.Request", *, timeout: Optional[float] = None, abort: Any = None,
                   extra_window: int = 0, use_default: bool = True) -> AsyncCall:
        """Send REQUEST on a new stream (waiting for room under max_streams)."""
        if timeout is None and use_default:
            timeout = self.default_timeout
        if abort is not None and abort.is_set():
            raise abort_error("aborted before it started")
        deadline = None if timeout is None else self.loop.time() + timeout
        payload = req.encode()
        while True:
            if self.error is not None:
                raise self.error
            if self.proto.can_open():
                break
            f = self.loop.create_future()
            self._slot_waiters.append(f)
            left = None if deadline is None else deadline - self.loop.time()
            if left is not None and left <= 0:
                raise timeout_error("waiting for a free stream")
            await asyncio.wait([f], timeout=left if abort is None else min(left or POLL, POLL))
            if abort is not None and abort.is_set():
                raise abort_error()
        sid = self.proto.open(payload, extra_window=extra_window)
        call = AsyncCall(self, sid, deadline, abort)
        self.calls[sid] = call
        self.kick()
        return call

    async def request(self, req: "_pb.Request", *, timeout: Optional[float] = None, abort: Any = None) -> "_pb.Result":
        call = await self.open(req, timeout=timeout, abort=abort)
        return await call.wait_end()

    async def ping(self, timeout: Optional[float], abort: Any) -> float:
        if self.error is not None:
            raise self.error
        self._ping_seq += 1
        payload = self._ping_seq.to_bytes(8, "big")
        f: "asyncio.Future[float]" = self.loop.create_future()
        self._pongs[payload] = f
        t0 = self.loop.time()
        self.proto.ping(payload)
        self.kick()
        deadline = None if timeout is None else t0 + timeout
        try:
            while not f.done():
                if abort is not None and abort.is_set():
                    raise abort_error()
                left = None if deadline is None else deadline - self.loop.time()
                if left is not None and left <= 0:
                    raise timeout_error("ping")
                waits: List[Any] = [f]
                at = None
                if isinstance(abort, asyncio.Event):
                    at = asyncio.ensure_future(abort.wait())
                    waits.append(at)
                elif abort is not None:
                    left = POLL if left is None else min(left, POLL)
                try:
                    if left is None and at is None:
                        await f
                    else:
                        await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if at is not None:
                        at.cancel()
            return f.result() - t0
        finally:
            self._pongs.pop(payload, None)

    # ---- closing ----

    def add_closer(self, key: int, fn: Callable[[], Any]) -> None:
        """fn, a handle's bound method, is called when the connection closes; held
        weakly, so that a handle its user drops is collected (its __del__ drops its
        stream)."""
        closers = self._closers

        def gone(ref: Any, key: int = key) -> None:
            if closers.get(key) is ref:
                closers.pop(key, None)

        self._closers[key] = weakref.WeakMethod(fn, gone)  # type: ignore[arg-type]

    def drop(self, call: "AsyncCall") -> None:
        """The stream of a handle nobody holds any more (its __del__, which the garbage
        collector may run on any thread): given up on the loop, soon."""
        if call.done or self.closed:
            return
        try:
            self.loop.call_soon_threadsafe(call.give_up_now)
        except RuntimeError:
            pass  # the loop is closed: so is the connection

    def remove_closer(self, key: int) -> None:
        self._closers.pop(key, None)

    async def close(self) -> None:
        """Fail every call in flight, close the transport, stop the tasks."""
        if self.closed:
            return
        self.closed = True
        self._apply(self.proto.fail(closed_error()))
        self.error = closed_error()
        closers = [ref() for ref in self._closers.values()]
        self._closers.clear()
        for fn in closers:
            if fn is None:
                continue
            try:
                r = fn()
                if asyncio.iscoroutine(r):
                    await r
            except Exception:
                pass
        for t in (self._writer, self._reader):
            if t is not None and not t.done():
                t.cancel()
        try:
            await self.transport.close()
        except Exception:
            pass
        for t in (self._writer, self._reader):
            if t is not None:
                try:
                    await t
                except BaseException:
                    pass

