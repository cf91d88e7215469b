"""aio: AsyncShim, the asyncio twin of Shim. Every method is a coroutine that runs
the blocking libsbx call on a thread pool; ``abort=`` takes an asyncio.Event, and
cancelling the awaiting task cancels the operation in the shim as well."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, TypeVar, Union

from ._core import AbortLink, PathLike, check_abort
from .client import Shim
from .backups import Backups
from .commands import Commands, Process
from .files import Files
from .mounts import AsyncMounts, Mounts
from .errors import SandboxAbortError
from .tunnels import TunnelHandle, TunnelInfo
from .types import (
    CommandResult,
    DirectoryBackupRecord,
    DiskUsage,
    OutputChunk,
    ProcessInfo,
    RestoreResult,
    SandboxFileEntry,
    SandboxFileStat,
    ShimInfo,
    WatchEvent,
)

__all__ = ["AsyncShim", "AsyncProcess"]

T = TypeVar("T")
ECANCELED = 125
_NO_ITEM = object()


class _Runner:
    """Runs sync calls on the pool, wiring abort= and task cancellation to the call's
    cancel token through an AbortLink."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool

    async def __call__(self, fn: Callable[..., T], *args: Any, abort: Any = None, **kw: Any) -> T:
        check_abort(abort)
        if abort is not None and abort.is_set():
            raise SandboxAbortError("aborted before it started", errno=ECANCELED, errno_name="ECANCELED", kind="local")
        loop = asyncio.get_running_loop()
        takes_abort = _takes_abort(fn)
        link = AbortLink()
        if takes_abort:
            kw["abort"] = link
        waiter: Optional[asyncio.Future[Any]] = None
        if abort is not None and takes_abort:
            if isinstance(abort, asyncio.Event):
                waiter = asyncio.ensure_future(abort.wait())
                waiter.add_done_callback(lambda f: None if f.cancelled() else link.set())
            else:  # a threading.Event: polled
                kw["abort"] = _Either(abort, link)
        fut = loop.run_in_executor(self.pool, functools.partial(fn, *args, **kw))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # the task was cancelled: cancel the call in the shim, let it end, re-raise
            link.set()
            await asyncio.wait([fut])
            if not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" warning
            raise
        finally:
            if waiter is not None:
                waiter.cancel()


async def _cancellable(run: _Runner, fn: Callable[..., T], on_cancel: Callable[[], Any], *args: Any) -> T:
    """Run fn on the pool; if the awaiting task is cancelled, call on_cancel on another
    thread (it must make fn return: close the stream, kill the process), wait for fn
    to end, and re-raise."""
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(run.pool, functools.partial(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        threading.Thread(target=on_cancel, daemon=True).start()
        await asyncio.wait([fut])
        if not fut.cancelled():
            fut.exception()
        raise


class _Either:
    """A threading.Event the watcher polls, plus the AbortLink task cancellation fires."""

    def __init__(self, event: Any, link: AbortLink) -> None:
        self.event, self.link = event, link

    def is_set(self) -> bool:
        """Either one is set."""
        return self.event.is_set() or self.link.is_set()


@functools.lru_cache(maxsize=None)
def _takes_abort_of(fn: Any) -> bool:
    try:
        return "abort" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _takes_abort(fn: Any) -> bool:
    return _takes_abort_of(getattr(fn, "__func__", fn))


class _AsyncStream(AsyncIterator[T]):
    """An async iterator over a sync stream (open_read, watch, iter_directory)."""

    def __init__(self, run: _Runner, make: Callable[[], Any]) -> None:
        self._run = run
        self._make = make
        self._it: Any = None

    def __aiter__(self) -> "_AsyncStream[T]":
        return self

    async def __anext__(self) -> T:
        if self._it is None:
            # not through _Runner: the stream's own abort= (already in the partial) stays
            self._it = await asyncio.get_running_loop().run_in_executor(self._run.pool, self._make)
        item = await _cancellable(self._run, next, self._it.close, self._it, _NO_ITEM)
        if item is _NO_ITEM:
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop early (the call is cancelled in the shim)."""
        if self._it is not None:
            await self._run(self._it.close)

    async def __aenter__(self) -> "_AsyncStream[T]":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncFiles:
    """The coroutine twin of Files (same arguments, same results)."""

    def __init__(self, shim: Shim, run: _Runner) -> None:
        self._f = shim.files
        self._run = run

    async def read_file(self, path: PathLike, **kw: Any) -> bytes:
        return await self._run(self._f.read_file, path, **kw)

    async def read_text(self, path: PathLike, **kw: Any) -> str:
        return await self._run(self._f.read_text, path, **kw)

    def open_read(self, path: PathLike, **kw: Any) -> "_AsyncStream[bytes]":
        """An async iterator of chunks: ``async for chunk in shim.files.open_read(p)``."""
        if "abort" in kw:
            kw["abort"] = _link_for(kw["abort"])
        return _AsyncStream(self._run, functools.partial(self._f.open_read, path, **kw))

    async def download(self, path: PathLike, dest: Any, **kw: Any) -> int:
        return await self._run(self._f.download, path, dest, **kw)

    async def write_file(self, path: PathLike, data: Any, **kw: Any) -> SandboxFileStat:
        return await self._run(self._f.write_file, path, data, **kw)

    async def upload(self, local: PathLike, path: PathLike, **kw: Any) -> SandboxFileStat:
        return await self._run(self._f.upload, local, path, **kw)

    async def stat(self, path: PathLike, **kw: Any) -> SandboxFileStat:
        return await self._run(self._f.stat, path, **kw)

    async def lstat(self, path: PathLike, **kw: Any) -> SandboxFileStat:
        return await self._run(self._f.lstat, path, **kw)

    async def exists(self, path: PathLike, **kw: Any) -> bool:
        return await self._run(self._f.exists, path, **kw)

    async def read_directory(self, path: PathLike, **kw: Any) -> List[SandboxFileEntry]:
        return await self._run(self._f.read_directory, path, **kw)

    def iter_directory(self, path: PathLike, **kw: Any) -> "_AsyncStream[SandboxFileEntry]":
        if "abort" in kw:
            kw["abort"] = _link_for(kw["abort"])
        return _AsyncStream(self._run, functools.partial(self._f.iter_directory, path, **kw))

    async def mkdir(self, path: PathLike, **kw: Any) -> None:
        await self._run(self._f.mkdir, path, **kw)

    async def delete(self, path: PathLike, **kw: Any) -> None:
        await self._run(self._f.delete, path, **kw)

    remove = delete

    async def rename(self, src: PathLike, dst: PathLike, **kw: Any) -> None:
        await self._run(self._f.rename, src, dst, **kw)

    move = rename

    async def copy(self, src: PathLike, dst: PathLike, **kw: Any) -> None:
        await self._run(self._f.copy, src, dst, **kw)

    async def chmod(self, path: PathLike, mode: int, **kw: Any) -> None:
        await self._run(self._f.chmod, path, mode, **kw)

    async def chown(self, path: PathLike, uid: Optional[int] = None, gid: Optional[int] = None, **kw: Any) -> None:
        await self._run(self._f.chown, path, uid, gid, **kw)

    async def symlink(self, target: PathLike, link_path: PathLike, **kw: Any) -> None:
        await self._run(self._f.symlink, target, link_path, **kw)

    async def link(self, target: PathLike, link_path: PathLike, **kw: Any) -> None:
        await self._run(self._f.link, target, link_path, **kw)

    async def readlink(self, path: PathLike, **kw: Any) -> str:
        return await self._run(self._f.readlink, path, **kw)

    async def realpath(self, path: PathLike, **kw: Any) -> str:
        return await self._run(self._f.realpath, path, **kw)

    async def truncate(self, path: PathLike, size: int, **kw: Any) -> None:
        await self._run(self._f.truncate, path, size, **kw)

    async def touch(self, path: PathLike, **kw: Any) -> None:
        await self._run(self._f.touch, path, **kw)

    async def disk_usage(self, path: PathLike = "/", **kw: Any) -> DiskUsage:
        return await self._run(self._f.disk_usage, path, **kw)

    def watch(self, path: PathLike, **kw: Any) -> "_AsyncStream[WatchEvent]":
        """``async for event in shim.files.watch(p)``; aclose() (or leaving an
        ``async with`` block) stops it."""
        if "abort" in kw:
            kw["abort"] = _link_for(kw["abort"])
        return _AsyncStream(self._run, functools.partial(self._f.watch, path, **kw))


def _link_for(abort: Any) -> Any:
    """For streams: an asyncio.Event cannot be awaited from the helper thread, so it
    is polled like a threading.Event (is_set() is safe to read)."""
    check_abort(abort)
    return abort


class AsyncProcess:
    """The coroutine twin of Process."""

    def __init__(self, proc: Process, run: _Runner, waiter: Optional["asyncio.Future[Any]"] = None) -> None:
        self._p = proc
        self._run = run
        self._waiter = waiter
        self.id = proc.id
        self.pid = proc.pid

    def __repr__(self) -> str:
        return f"<AsyncProcess id={self.id!r} pid={self.pid}>"

    async def write_stdin(self, data: Union[str, bytes]) -> None:
        await self._run(self._p.write_stdin, data)

    async def close_stdin(self) -> None:
        await self._run(self._p.close_stdin)

    async def read(self, size: int = 256 * 1024) -> Optional[OutputChunk]:
        """The next piece of output (None at the end). Cancelling the awaiting task
        closes the handle: the command is killed."""
        return await _cancellable(self._run, self._p.read, self._p.close, size)

    async def stream(self) -> AsyncIterator[OutputChunk]:
        """``async for chunk in proc.stream()``."""
        while True:
            c = await self.read()
            if c is None:
                return
            yield c

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self.stream()

    async def wait(self, *, collect: bool = True) -> CommandResult:
        """Wait for the exit. Cancelling the awaiting task kills the command."""
        return await _cancellable(self._run, functools.partial(self._p.wait, collect=collect), self._p.close)

    async def signal(self, sig: Union[int, str] = "TERM") -> None:
        await self._run(self._p.signal, sig)

    async def kill(self) -> None:
        await self._run(self._p.kill)

    async def resize(self, rows: int, cols: int) -> None:
        await self._run(self._p.resize, rows, cols)

    async def close(self) -> None:
        if self._waiter is not None:
            self._waiter.cancel()
        await self._run(self._p.close)

    async def __aenter__(self) -> "AsyncProcess":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncCommands:
    """The coroutine twin of Commands."""

    def __init__(self, shim: Shim, run: _Runner) -> None:
        self._c = shim.commands
        self._run = run

    async def run(self, cmd: Union[str, Sequence[str]], **kw: Any) -> CommandResult:
        return await self._run(self._c.run, cmd, **kw)

    async def start(self, cmd: Union[str, Sequence[str]], *, abort: Any = None, **kw: Any) -> AsyncProcess:
        """Start a command; ``abort`` (asyncio.Event) kills it when set."""
        link, waiter = self._process_abort(abort)
        try:
            p = await self._run(self._c.start, cmd, abort=link, **kw)
        except BaseException:
            if waiter is not None:
                waiter.cancel()
            raise
        return AsyncProcess(p, self._run, waiter)

    def _process_abort(self, abort: Any) -> Any:
        check_abort(abort)
        if abort is None:
            return None, None
        if isinstance(abort, asyncio.Event):
            link = AbortLink()
            waiter = asyncio.ensure_future(abort.wait())
            waiter.add_done_callback(lambda f: None if f.cancelled() else link.set())
            return link, waiter
        return abort, None

    async def spawn(self, cmd: Union[str, Sequence[str]], **kw: Any) -> ProcessInfo:
        return await self._run(self._c.spawn, cmd, **kw)

    async def list(self, **kw: Any) -> List[ProcessInfo]:
        return await self._run(self._c.list, **kw)

    async def attach(self, id: str, *, abort: Any = None, **kw: Any) -> AsyncProcess:
        link, waiter = self._process_abort(abort)
        p = await self._run(self._c.attach, id, abort=link, **kw)
        return AsyncProcess(p, self._run, waiter)

    async def wait(self, id: str, **kw: Any) -> CommandResult:
        return await self._run(self._c.wait, id, **kw)

    async def kill(self, id: str, signal: Union[int, str] = "KILL", **kw: Any) -> None:
        await self._run(self._c.kill, id, signal, **kw)

    async def remove(self, id: str, **kw: Any) -> None:
        await self._run(self._c.remove, id, **kw)


class AsyncBackups:
    """The coroutine twin of Backups. A file-like dest/source is called from a pool
    thread: use a plain file or io.BytesIO, not an asyncio stream."""

    def __init__(self, shim: Shim, run: _Runner) -> None:
        self._b = shim.backups
        self._run = run

    async def backup(self, dir: PathLike, dest: Any = None, **kw: Any) -> DirectoryBackupRecord:
        return await self._run(self._b.backup, dir, dest, **kw)

    async def restore(self, dir: PathLike, source: Any = None, **kw: Any) -> RestoreResult:
        return await self._run(self._b.restore, dir, source, **kw)


class AsyncShim:
    """The asyncio twin of Shim::

        async with await AsyncShim.connect("unix:/run/sandbox-shim.sock") as shim:
            await shim.files.write_file("/workspace/a.txt", "hi")
            result = await shim.commands.run(["cat", "/workspace/a.txt"])

    Calls run on a thread pool of ``max_workers`` threads (default 32), so that many
    can be in flight at once on the one connection."""

    def __init__(self, shim: Shim, pool: ThreadPoolExecutor) -> None:
        self.sync = shim
        self._pool = pool
        self._run = _Runner(pool)
        self.files = AsyncFiles(shim, self._run)
        self.commands = AsyncCommands(shim, self._run)
        self.backups = AsyncBackups(shim, self._run)
        self.mounts = AsyncMounts(shim, self._run)

    @classmethod
    async def connect(cls, target: Optional[str] = None, *, max_workers: int = 32, **kw: Any) -> "AsyncShim":
        """Connect (same arguments as Shim.connect) without blocking the loop."""
        if isinstance(max_workers, bool) or not isinstance(max_workers, int):
            raise TypeError("max_workers must be an int")
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox_shim")
        try:
            shim = await asyncio.get_running_loop().run_in_executor(pool, functools.partial(Shim.connect, target, **kw))
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(shim, pool)

    async def close(self) -> None:
        """Close the connection (calls in flight fail) and the thread pool."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.sync.close)
        self._pool.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self.sync.closed

    async def __aenter__(self) -> "AsyncShim":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def server(self) -> Dict[str, Any]:
        """What the shim said in the handshake (see Shim.server)."""
        return self.sync.server

    def has_feature(self, name: str) -> bool:
        return self.sync.has_feature(name)

    async def ping(self, **kw: Any) -> float:
        return await self._run(self.sync.ping, **kw)

    async def info(self, **kw: Any) -> ShimInfo:
        return await self._run(self.sync.info, **kw)

    async def eval(self, code: str, **kw: Any) -> str:
        return await self._run(self.sync.eval, code, **kw)

    async def tunnel(self, guest_port: int, local_port: int, local_host: str = "127.0.0.1", **kw: Any) -> TunnelHandle:
        """Shim.tunnel() (sandbox -> host). The relay runs on libsbx's own thread, not
        on the event loop; close the handle (or the AsyncShim) to stop it."""
        return await self._run(self.sync.tunnel, guest_port, local_port, local_host, **kw)

    async def forward(self, guest_port: int, local_port: int = 0, local_host: str = "127.0.0.1", **kw: Any) -> TunnelHandle:
        """Shim.forward() (host -> sandbox)."""
        return await self._run(self.sync.forward, guest_port, local_port, local_host, **kw)

    async def tunnels(self, **kw: Any) -> List[TunnelInfo]:
        return await self._run(self.sync.tunnels, **kw)

    async def close_tunnel(self, tunnel_id: str, **kw: Any) -> None:
        await self._run(self.sync.close_tunnel, tunnel_id, **kw)


def _twin_docs(async_cls: Any, sync_cls: Any) -> None:
    """Give each coroutine twin the docstring of its sync method."""
    for name, fn in list(vars(async_cls).items()):
        if name.startswith("_") or not callable(fn) or getattr(fn, "__doc__", None):
            continue
        src = getattr(sync_cls, name, None)
        if src is not None and src.__doc__:
            fn.__doc__ = f"Coroutine twin of {sync_cls.__name__}.{name}().\n\n{src.__doc__}"


_twin_docs(AsyncFiles, Files)
_twin_docs(AsyncProcess, Process)
_twin_docs(AsyncCommands, Commands)
_twin_docs(AsyncBackups, Backups)
_twin_docs(AsyncShim, Shim)
_twin_docs(AsyncMounts, Mounts)
