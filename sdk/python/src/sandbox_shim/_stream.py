"""_stream: turns a libsbx call that pushes items through a callback into a Python
iterator, by running the call on a helper thread with a small bounded queue (the
callback blocks while the consumer is behind, so the shim is back-pressured)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar

from ._core import CallScope, Core

T = TypeVar("T")

ECANCELED = 125
_END = object()


class Stopped(Exception):
    """Raised inside the callback when the consumer went away."""


class CallbackStream(Generic[T]):
    """Iterate over what ``run(scope, push)`` pushes; ``run`` makes the C call with
    ``scope.opts`` and calls ``push(item)`` from its callback (push raises Stopped
    once the consumer closed the iterator: the callback then returns non-zero).
    Closing the iterator early stops the call in the shim."""

    def __init__(
        self,
        core: Core,
        run: Callable[[CallScope, Callable[[T], None]], Any],
        *,
        timeout: Optional[float] = None,
        abort: Any = None,
        depth: int = 4,
    ) -> None:
        self._q: "queue.Queue[Any]" = queue.Queue(depth)
        self._stop = threading.Event()
        self._scope: Optional[CallScope] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self.result: Any = None
        # enter the call here, so argument errors and a closed client raise at once
        self._cm = core.call(timeout=timeout, abort=abort)
        self._scope = self._cm.__enter__()
        self._run = run
        self._thread = threading.Thread(target=self._main, name="sandbox_shim-stream", daemon=True)
        self._thread.start()
        self._done = False

    def _push(self, item: T) -> None:
        while True:
            if self._stop.is_set():
                raise Stopped()
            try:
                self._q.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _main(self) -> None:
        assert self._scope is not None
        try:
            self.result = self._run(self._scope, self._push)
        except BaseException as e:  # handed to the consumer
            self._error = e
        finally:
            try:
                self._cm.__exit__(None, None, None)
            finally:
                while True:
                    try:
                        self._q.put(_END, timeout=0.05)
                        break
                    except queue.Full:
                        if self._stop.is_set():
                            break

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            if self._stop.is_set():  # closed by another thread
                raise StopIteration
            try:
                item = self._q.get(timeout=0.05)
                break
            except queue.Empty:
                continue
        if item is _END:
            self._done = True
            self._thread.join()
            if self._error is not None and not isinstance(self._error, Stopped):
                raise self._error
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop early: the call is cancelled in the shim; waits for the helper thread."""
        if self._done:
            return
        self._done = True
        self._stop.set()
        scope = self._scope
        if scope is not None and self._thread.is_alive():
            scope.fire_close()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    def __enter__(self) -> "CallbackStream[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
