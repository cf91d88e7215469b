"""aio: AsyncShim, the asyncio twin of Shim, native: one reader task per connection,
no threads. Every method is a coroutine with the same arguments and results as its
sync twin; ``abort=`` takes an asyncio.Event (or a threading.Event, polled), and
cancelling the awaiting task cancels the operation in the shim as well."""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
from typing import IO, Any, AsyncIterator, Callable, Generic, List, Mapping, Optional, Sequence, TypeVar, Union, cast

from . import _ops, _pb
from ._async import AsyncCall, AsyncEngine
from ._sync import closed_error
from ._core import PathLike, check_abort, check_type, seconds
from ._ops import Command, UserSpec, signal_number
from ._protocol import Data, Protocol, StreamEvent, make_error
from .backups import CHUNK, _check_ends, local_dest, local_source
from .client import DEFAULT_CONNECT_TIMEOUT, client_name_of, is_transport, target_of, token_of
from .errors import SandboxError
from .mounts import MountRecord
from .transports import open_async_transport
from .types import (
    CommandResult,
    DirectoryBackupRecord,
    DiskUsage,
    OutputChunk,
    ProcessInfo,
    RestoreResult,
    SandboxFileEntry,
    SandboxFileStat,
    ServerInfo,
    ShimInfo,
    SnapshotResult,
    WatchEvent,
)

__all__ = ["AsyncShim", "AsyncProcess", "AsyncStream", "AsyncFiles", "AsyncCommands", "AsyncBackups", "AsyncMounts"]

T = TypeVar("T")
Progress = Callable[[int, int], Any]
WRITE_CHUNK = 256 << 10


async def _maybe_await(r: Any) -> None:
    if inspect.isawaitable(r):
        await r


class AsyncStream(Generic[T]):
    """``async for item in stream``: file chunks, directory entries or watch events as
    they arrive. ``await aclose()`` (or leaving an ``async with`` block) stops early
    and cancels the call in the shim."""

    def __init__(self, opener: Callable[[], Any], convert: Callable[[bytes], List[T]],
                 finish: Optional[Callable[[], None]] = None) -> None:
        self._opener = opener
        self._call: Optional[AsyncCall] = None
        self._convert = convert
        self._finish = finish
        self._finish_fin: Optional[Callable[[bool], Any]] = None
        self._fin = False
        self._pending: List[T] = []
        self._done = False
        self.result: Any = None

    def __aiter__(self) -> "AsyncStream[T]":
        return self

    async def __anext__(self) -> T:
        if self._call is None and not self._done:
            self._call = await self._opener()
        while not self._pending:
            if self._done:
                raise StopAsyncIteration
            assert self._call is not None
            try:
                it = await self._call.next()
            except BaseException:
                self._done = True
                raise
            if it is None:
                self._done = True
                self.result = self._call.result
                if self._finish is not None:
                    self._finish()
                if self._finish_fin is not None:
                    self._finish_fin(self._fin)
                raise StopAsyncIteration
            if type(it) is Data:
                self._fin = self._fin or it.fin
                if it.data:
                    self._pending = self._convert(it.data)
                    self._pending.reverse()
        return self._pending.pop()

    async def aclose(self) -> None:
        """Stop early (the call is cancelled in the shim)."""
        if not self._done:
            self._done = True
            if self._call is not None:
                self._call.close()

    def __del__(self) -> None:
        # dropped before its end: the call is cancelled (on the loop, soon)
        try:
            if not self._done and self._call is not None:
                self._done = True
                self._call.engine.drop(self._call)
        except Exception:
            pass

    async def __aenter__(self) -> "AsyncStream[T]":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def _read_into(call: AsyncCall, write: Callable[[bytes], Any]) -> int:
    n = 0
    fin = False
    try:
        while True:
            it = await call.next()
            if it is None:
                assert call.result is not None
                return _ops.check_read_end(call.result, n, fin)
            if type(it) is Data:
                fin = fin or it.fin
                if it.data:
                    await _maybe_await(write(it.data))
                    n += len(it.data)
    except BaseException:
        call.close()
        raise


async def _send_body(call: AsyncCall, body: Any, chunk: int = WRITE_CHUNK) -> None:
    if isinstance(body, (bytes, bytearray, memoryview)):
        await call.write(body, fin=True)
        return
    reader = _ops.Reader(body, chunk)
    while True:
        try:
            b = reader.chunk()
            if inspect.isawaitable(b):  # an async file-like object
                b = await b  # type: ignore[misc]
        except BaseException:
            call.close()
            raise
        if not b:
            await call.finish()
            return
        await call.write(b)


class AsyncFiles:
    """The coroutine twin of Files (same arguments, same results)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._e = engine
        self._fsd: Any = None  # as_user()'s defaults (a _pb.FsOptions)

    def as_user(self, user: UserSpec = None, *, group: UserSpec = None, no_follow: bool = False,
                no_symlinks: bool = False) -> "AsyncFiles":
        """A view whose calls act as ``user`` (and ``group``) and resolve with
        ``no_follow``/``no_symlinks`` unless a call says otherwise (Files.as_user)."""
        v = copy.copy(self)
        v._fsd = _ops.fs_options(user, group, no_follow, no_symlinks, self._fsd)
        return v

    def _fs(self, user: UserSpec, group: UserSpec, no_follow: bool, no_symlinks: bool) -> Any:
        return _ops.fs_options(user, group, no_follow, no_symlinks, self._fsd)

    async def _open(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None,
                    extra_window: int = 0) -> AsyncCall:
        check_abort(abort)
        if fs is not None:
            req.fs = fs
        return await self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra_window)

    async def _read(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None) -> AsyncCall:
        return await self._open(req, timeout, abort, fs, _ops.READ_EXTRA_WINDOW)

    async def _do(self, req: Any, timeout: Optional[float], abort: Any, fs: Any = None) -> "_pb.Result":
        call = await self._open(req, timeout, abort, fs)
        return await call.wait_end()

    async def read_file(self, path: PathLike, *, offset: int = 0, length: Optional[int] = None,
                        allow_special: bool = False, user: UserSpec = None, group: UserSpec = None,
                        no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                        abort: Any = None) -> bytes:
        fs = self._fs(user, group, no_follow, no_symlinks)
        call = await self._read(_ops.read_req(path, offset, length, allow_special), timeout, abort, fs)
        parts: List[bytes] = []
        await _read_into(call, parts.append)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_text(self, path: PathLike, *, encoding: str = "utf-8", errors: str = "strict", offset: int = 0,
                        length: Optional[int] = None, user: UserSpec = None, group: UserSpec = None,
                        no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                        abort: Any = None) -> str:
        data = await self.read_file(path, offset=offset, length=length, user=user, group=group, no_follow=no_follow,
                                    no_symlinks=no_symlinks, timeout=timeout, abort=abort)
        return data.decode(encoding, errors)

    def open_read(self, path: PathLike, *, offset: int = 0, length: Optional[int] = None, allow_special: bool = False,
                  user: UserSpec = None, group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                  timeout: Optional[float] = None, abort: Any = None) -> "AsyncStream[bytes]":
        """An async iterator of chunks: ``async for chunk in shim.files.open_read(p)``."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.read_req(path, offset, length, allow_special)
        check_abort(abort)
        got = [0]

        def count(b: bytes) -> List[bytes]:
            got[0] += len(b)
            return [b]

        stream: "AsyncStream[bytes]" = AsyncStream(lambda: self._read(req, timeout, abort, fs), count)
        stream._finish_fin = lambda fin: _ops.check_read_end(stream.result, got[0], fin)
        return stream

    async def download(self, path: PathLike, dest: Union[PathLike, IO[bytes], Any], *, user: UserSpec = None,
                       group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                       timeout: Optional[float] = None, abort: Any = None) -> int:
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.read_req(path, 0, None)
        if callable(getattr(dest, "write", None)):
            return await _read_into(await self._read(req, timeout, abort, fs), dest.write)
        local = os.fsdecode(os.fspath(dest))  # type: ignore[arg-type]
        tmp = f"{local}.part-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                n = await _read_into(await self._read(req, timeout, abort, fs), f.write)
            os.replace(tmp, local)
            return n
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    async def write_file(self, path: PathLike, data: Union[str, bytes, bytearray, memoryview, IO[bytes], Any], *,
                         mode: Optional[int] = None, append: bool = False, exclusive: bool = False,
                         parents: bool = False, atomic: bool = True, allow_special: bool = False, user: UserSpec = None,
                         group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                         timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        fs = self._fs(user, group, no_follow, no_symlinks)
        p, req = _ops.write_req(path, mode, append, exclusive, parents, atomic, allow_special)
        body = _ops.body_arg(data)
        call = await self._open(req, timeout, abort, fs)
        await _send_body(call, body)
        return _ops.write_result(p, await call.wait_end())

    async def upload(self, local: PathLike, path: PathLike, *, mode: Optional[int] = None, append: bool = False,
                     exclusive: bool = False, parents: bool = False, atomic: bool = True, user: UserSpec = None,
                     group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                     timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        with open(os.fspath(local), "rb") as f:
            return await self.write_file(path, f, mode=mode, append=append, exclusive=exclusive, parents=parents,
                                         atomic=atomic,
                                         user=user, group=group, no_follow=no_follow, no_symlinks=no_symlinks,
                                         timeout=timeout, abort=abort)

    async def stat(self, path: PathLike, *, follow_symlinks: bool = True, user: UserSpec = None, group: UserSpec = None,
                   no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                   abort: Any = None) -> SandboxFileStat:
        fs = self._fs(user, group, no_follow, no_symlinks)
        p, req = _ops.stat_req(path, follow_symlinks)
        return _ops.stat_result(p, await self._do(req, timeout, abort, fs))

    async def lstat(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                    no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> SandboxFileStat:
        return await self.stat(path, follow_symlinks=False, user=user, group=group, no_follow=no_follow,
                               no_symlinks=no_symlinks, timeout=timeout, abort=abort)

    async def exists(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                     no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> bool:
        fs = self._fs(user, group, no_follow, no_symlinks)
        _, req = _ops.stat_req(path, False)
        try:
            await self._do(req, timeout, abort, fs)
            return True
        except Exception as e:
            return _ops.exists_answer(e)

    async def read_directory(self, path: PathLike, *, recursive: bool = False, depth: Optional[int] = None,
                             hidden: bool = True, follow_symlinks: bool = False, user: UserSpec = None,
                             group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                             timeout: Optional[float] = None, abort: Any = None) -> List[SandboxFileEntry]:
        out: List[SandboxFileEntry] = []
        async with self.iter_directory(path, recursive=recursive, depth=depth, hidden=hidden,
                                       follow_symlinks=follow_symlinks,
                                       user=user, group=group, no_follow=no_follow, no_symlinks=no_symlinks,
                                       timeout=timeout, abort=abort) as it:
            async for e in it:
                out.append(e)
        return out

    def iter_directory(self, path: PathLike, *, recursive: bool = False, depth: Optional[int] = None,
                       hidden: bool = True, follow_symlinks: bool = False, user: UserSpec = None,
                       group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                       timeout: Optional[float] = None, abort: Any = None) -> "AsyncStream[SandboxFileEntry]":
        fs = self._fs(user, group, no_follow, no_symlinks)
        base, req = _ops.list_req(path, recursive, depth, hidden, follow_symlinks)
        check_abort(abort)
        dl = _ops.Delimited()
        return AsyncStream(lambda: self._open(req, timeout, abort, fs),
                           lambda b: [_ops.dir_entry(base, m) for m in dl.feed(b)], dl.finish)

    def watch(self, path: PathLike, *, recursive: bool = False, user: UserSpec = None, group: UserSpec = None,
              no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
              abort: Any = None) -> "AsyncStream[WatchEvent]":
        """``async for event in shim.files.watch(p)``; aclose() (or leaving an
        ``async with`` block) stops it."""
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.watch_req(path, recursive)
        check_abort(abort)
        dl = _ops.Delimited()
        return AsyncStream(lambda: self._open(req, timeout, abort, fs),
                           lambda b: [_ops.watch_event(m) for m in dl.feed(b)], dl.finish)

    async def mkdir(self, path: PathLike, *, parents: bool = False, mode: Optional[int] = None, exist_ok: bool = False,
                    user: UserSpec = None, group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                    timeout: Optional[float] = None, abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        req = _ops.mkdir_req(path, parents, mode)
        _ops.check_bool("exist_ok", exist_ok)
        try:
            await self._do(req, timeout, abort, fs)
        except FileExistsError:
            if not exist_ok or not (await self.stat(path, user=user, group=group, no_follow=no_follow,
                                                    no_symlinks=no_symlinks, timeout=timeout, abort=abort)).is_dir:
                raise

    async def delete(self, path: PathLike, *, recursive: bool = False, user: UserSpec = None, group: UserSpec = None,
                     no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                     abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.remove_req(path, recursive), timeout, abort, fs)

    remove = delete

    async def rename(self, src: PathLike, dst: PathLike, *, overwrite: bool = True, user: UserSpec = None,
                     group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                     timeout: Optional[float] = None, abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.rename_req(src, dst, overwrite), timeout, abort, fs)

    move = rename

    async def copy(self, src: PathLike, dst: PathLike, *, recursive: bool = False, user: UserSpec = None,
                   group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                   timeout: Optional[float] = None, abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.copy_req(src, dst, recursive), timeout, abort, fs)

    async def chmod(self, path: PathLike, mode: int, *, user: UserSpec = None, group: UserSpec = None,
                    no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                    abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.chmod_req(path, mode), timeout, abort, fs)

    async def chown(self, path: PathLike, uid: Optional[int] = None, gid: Optional[int] = None, *,
                    follow_symlinks: bool = True, user: UserSpec = None, group: UserSpec = None,
                    no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                    abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.chown_req(path, uid, gid, follow_symlinks), timeout, abort, fs)

    async def symlink(self, target: PathLike, link_path: PathLike, *, user: UserSpec = None, group: UserSpec = None,
                      no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                      abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.symlink_req(target, link_path), timeout, abort, fs)

    async def link(self, target: PathLike, link_path: PathLike, *, user: UserSpec = None, group: UserSpec = None,
                   no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                   abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.link_req(target, link_path), timeout, abort, fs)

    async def readlink(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                       no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> str:
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.path_result(await self._do(_ops.readlink_req(path), timeout, abort, fs))

    async def realpath(self, path: PathLike, *, user: UserSpec = None, group: UserSpec = None, no_follow: bool = False,
                       no_symlinks: bool = False, timeout: Optional[float] = None, abort: Any = None) -> str:
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.path_result(await self._do(_ops.realpath_req(path), timeout, abort, fs))

    async def truncate(self, path: PathLike, size: int, *, allow_special: bool = False, user: UserSpec = None,
                       group: UserSpec = None, no_follow: bool = False, no_symlinks: bool = False,
                       timeout: Optional[float] = None, abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.truncate_req(path, size, allow_special), timeout, abort, fs)

    async def touch(self, path: PathLike, *, create: bool = True, user: UserSpec = None, group: UserSpec = None,
                    no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                    abort: Any = None) -> None:
        fs = self._fs(user, group, no_follow, no_symlinks)
        await self._do(_ops.touch_req(path, create), timeout, abort, fs)

    async def disk_usage(self, path: PathLike = "/", *, user: UserSpec = None, group: UserSpec = None,
                         no_follow: bool = False, no_symlinks: bool = False, timeout: Optional[float] = None,
                         abort: Any = None) -> DiskUsage:
        fs = self._fs(user, group, no_follow, no_symlinks)
        return _ops.statfs_result(await self._do(_ops.statfs_req(path), timeout, abort, fs))


async def _collect(call: AsyncCall, stdin: Optional[bytes]) -> CommandResult:
    out: List[bytes] = []
    err: List[bytes] = []
    feeder = None
    if stdin is not None:
        async def feed() -> None:
            try:
                await call.write(stdin, fin=True)
            except Exception:
                pass  # the command ended: the result says how

        feeder = asyncio.ensure_future(feed())
    try:
        while True:
            it = await call.next()
            if it is None:
                break
            if type(it) is Data and it.data:
                (err if it.stderr else out).append(it.data)
    except BaseException:
        call.close()
        raise
    finally:
        if feeder is not None and not feeder.done():
            feeder.cancel()
    assert call.result is not None
    return _ops.command_result(_ops.expect(call.result, "exit"), b"".join(out), b"".join(err))


async def _started(call: AsyncCall, timeout: Optional[float]) -> "_pb.ProcessStarted":
    early: List[Any] = []
    while True:
        it = await call.next(timeout)
        if it is None:
            raise make_error("protocol", 71, "the shim ended an exec stream without a started event")
        if type(it) is StreamEvent and it.event.which_kind() == "started":
            call.items.extendleft(reversed(early))
            return it.event.started
        early.append(it)


class AsyncProcess:
    """The coroutine twin of Process: ``async for chunk in proc``, ``await proc.wait()``;
    leaving ``async with`` (or ``await close()``) kills a command that still runs (a
    detached one is only detached from). Cancelling a task awaiting read() or wait()
    cancels the stream in the shim, as close() does."""

    def __init__(self, engine: AsyncEngine, call: AsyncCall, started: "_pb.ProcessStarted", detached: bool,
                 request_timeout: Optional[float], stdin: bool = False) -> None:
        self._e = engine
        self._call = call
        self._timeout = request_timeout
        self._buf: Optional[Data] = None
        self._eof = False
        self._closed = False
        self._result: Optional[CommandResult] = None
        self.detached = detached
        self._stdin = stdin
        self.id: str = started.id
        self.pid: int = started.pid
        engine.add_closer(id(self), self._drop)

    def __repr__(self) -> str:
        return f"<AsyncProcess id={self.id!r} pid={self.pid}>"

    def _drop(self) -> None:
        # the connection is closing: calls on the handle fail as the connection's do
        self._conn_closed = True
        self._closed = True

    _conn_closed = False

    def _check(self) -> None:
        if self._closed:
            if self._conn_closed:
                raise closed_error()
            raise ValueError("the process handle is closed")

    async def _write(self, data: Any, fin: bool) -> None:
        self._check()
        if not self._stdin:
            raise SandboxError("the command's stdin was not opened (start it with stdin=True)", errno=9,
                               errno_name="EBADF", kind="local")
        c = self._call
        if c.done and c.error is None:
            raise SandboxError("the command has ended: its stdin is closed", errno=32, errno_name="EPIPE", kind="local")
        try:
            await c.write(data, fin)
        except RuntimeError:
            raise SandboxError("stdin is closed already", errno=32, errno_name="EPIPE", kind="local") from None

    async def write_stdin(self, data: Union[str, bytes]) -> None:
        """Send bytes (str as UTF-8) to the command's stdin (start(..., stdin=True))."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be str or bytes, not {type(data).__name__}")
        await self._write(data, False)

    async def close_stdin(self) -> None:
        """Close the command's stdin (it reads EOF)."""
        await self._write(b"", True)

    async def read(self, size: int = 256 * 1024) -> Optional[OutputChunk]:
        """The next piece of output, or None when both stdout and stderr have ended."""
        check_type("size", size, int, "an int")
        if size <= 0:
            raise ValueError("size must be positive")
        self._check()
        while True:
            d = self._buf
            if d is not None:
                if len(d.data) <= size:
                    self._buf = None
                    return OutputChunk("stderr" if d.stderr else "stdout", d.data)
                self._buf = Data(d.stream, d.data[size:], d.fin, d.stderr)
                return OutputChunk("stderr" if d.stderr else "stdout", d.data[:size])
            if self._eof:
                return None
            it = await self._call.next(self._timeout)
            if it is None:
                self._eof = True
                return None
            if type(it) is Data:
                if it.fin:
                    self._eof = True
                if it.data:
                    self._buf = it

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
        """Wait for the exit (output not read yet goes into the result with collect)."""
        if self._result is not None:
            return self._result
        self._check()
        out: List[bytes] = []
        errb: List[bytes] = []
        while True:
            c = await self.read()
            if c is None:
                break
            if collect:
                (errb if c.stream == "stderr" else out).append(c.data)
        res = await self._call.wait_end(self._timeout)
        self._result = _ops.command_result(_ops.expect(res, "exit"), b"".join(out), b"".join(errb))
        self._e.remove_closer(id(self))
        return self._result

    async def signal(self, sig: Union[int, str] = "TERM") -> None:
        """Send a signal (number or name) to the command's process group."""
        n = signal_number(sig)
        await self._e.request(_pb.Request(signal=_pb.SignalRequest(id=self.id, signal=n)), timeout=self._timeout)

    async def kill(self) -> None:
        """SIGKILL the command's process group."""
        await self.signal(9)

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the pseudo-terminal (start(..., pty=True))."""
        check_type("rows", rows, int, "an int")
        check_type("cols", cols, int, "an int")
        if not (1 <= rows <= 0xFFFF and 1 <= cols <= 0xFFFF):
            raise ValueError("rows and cols must be between 1 and 65535")
        await self._e.request(_pb.Request(resize=_pb.ResizeRequest(id=self.id, rows=rows, cols=cols)),
                              timeout=self._timeout)

    async def close(self) -> None:
        """Release the handle: a command still running is killed (a detached one is
        only detached from)."""
        if self._closed:
            return
        self._closed = True
        self._e.remove_closer(id(self))
        self._call.close()

    def __del__(self) -> None:
        # dropped without close(): a command still running is killed, as close() would
        try:
            if not self._closed:
                self._closed = True
                self._e.drop(self._call)
        except Exception:
            pass

    async def __aenter__(self) -> "AsyncProcess":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncCommands:
    """The coroutine twin of Commands."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._e = engine

    async def run(
        self,
        cmd: Command,
        *,
        cwd: Any = None,
        env: Optional[Mapping[str, str]] = None,
        clear_env: bool = False,
        timeout: Optional[float] = None,
        stdin: Union[str, bytes, None, Any] = None,
        user: Union[str, int, None] = None,
        group: Union[str, int, None] = None,
        max_output: Optional[int] = None,
        truncate: bool = False,
        kill_grace: Optional[float] = None,
        request_timeout: Optional[float] = None,
        abort: Any = None,
    ) -> CommandResult:
        from .commands import _stdin_bytes

        limit = _ops.max_output_arg(max_output)
        _ops.check_bool("truncate", truncate)
        data = _stdin_bytes(stdin)
        req = _ops.exec_req(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout,
                            kill_grace=kill_grace, stdin=data is not None, output_cap=limit)
        check_abort(abort)
        call = await self._e.open(req, timeout=seconds(request_timeout, "request_timeout"), abort=abort)
        return _ops.check_output_limit(await _collect(call, data), limit, truncate)

    async def start(
        self,
        cmd: Command,
        *,
        cwd: Any = None,
        env: Optional[Mapping[str, str]] = None,
        clear_env: bool = False,
        timeout: Optional[float] = None,
        stdin: bool = False,
        user: Union[str, int, None] = None,
        group: Union[str, int, None] = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
        kill_grace: Optional[float] = None,
        request_timeout: Optional[float] = None,
        abort: Any = None,
    ) -> AsyncProcess:
        check_type("stdin", stdin, bool, "a bool (then write with write_stdin())")
        req = _ops.exec_req(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout,
                            kill_grace=kill_grace, stdin=stdin, pty=pty, rows=rows, cols=cols)
        return await self._open(req, request_timeout, abort, detached=False, stdin=stdin)

    async def _open(self, req: Any, request_timeout: Optional[float], abort: Any,
                    detached: bool, stdin: bool = False) -> AsyncProcess:
        check_abort(abort)
        rt = seconds(request_timeout, "request_timeout")
        call = await self._e.open(req, abort=abort, use_default=False)
        try:
            started = await _started(call, rt)
        except BaseException:
            call.close()
            raise
        return AsyncProcess(self._e, call, started, detached, rt, stdin)

    async def spawn(
        self,
        cmd: Command,
        *,
        name: Optional[str] = None,
        cwd: Any = None,
        env: Optional[Mapping[str, str]] = None,
        user: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
        abort: Any = None,
    ) -> ProcessInfo:
        req = _ops.exec_req(cmd, cwd=cwd, env=env, user=user, timeout=timeout, name=name, detach=True)
        check_abort(abort)
        res = await self._e.request(req, timeout=seconds(request_timeout, "request_timeout"), abort=abort)
        return _ops.process_info(_ops.expect(res, "process"))

    async def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[ProcessInfo]:
        check_abort(abort)
        res = await self._e.request(_pb.Request(ps=_pb.ProcessListRequest()), timeout=seconds(timeout), abort=abort)
        return [_ops.process_info(p) for p in _ops.expect(res, "ps").processes]

    async def attach(self, id: str, *, stdin: bool = False, replay: bool = True,
                     request_timeout: Optional[float] = None, abort: Any = None) -> AsyncProcess:
        i = _ops.id_arg(id)
        _ops.check_bool("stdin", stdin)
        _ops.check_bool("replay", replay)
        req = _pb.Request(attach=_pb.AttachRequest(id=i, stdin=stdin or None, no_replay=None if replay else True,
                                                   follow=True))
        return await self._open(req, request_timeout, abort, detached=True, stdin=stdin)

    async def wait(self, id: str, *, timeout: Optional[float] = None, abort: Any = None) -> CommandResult:
        i = _ops.id_arg(id)
        check_abort(abort)
        res = await self._e.request(_pb.Request(wait=_pb.WaitRequest(id=i)), timeout=seconds(timeout), abort=abort)
        return _ops.command_result(_ops.expect(res, "exit"), b"", b"")

    async def kill(self, id: str, signal: Union[int, str] = "KILL", *, timeout: Optional[float] = None) -> None:
        i = _ops.id_arg(id)
        n = signal_number(signal)
        await self._e.request(_pb.Request(signal=_pb.SignalRequest(id=i, signal=n)), timeout=seconds(timeout))

    async def remove(self, id: str, *, kill: bool = False, timeout: Optional[float] = None) -> None:
        i = _ops.id_arg(id)
        _ops.check_bool("kill", kill)
        await self._e.request(_pb.Request(rmproc=_pb.RemoveProcessRequest(id=i, kill=kill or None)),
                              timeout=seconds(timeout))


class AsyncBackups:
    """The coroutine twin of Backups. ``dest``/``source`` may be plain file objects
    (called on the loop) or objects whose write()/read() are coroutines."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._e = engine

    async def backup(
        self,
        dir: PathLike,
        dest: Union[PathLike, IO[bytes], Any, None] = None,
        *,
        excludes: Sequence[str] = (),
        compression: str = "zstd",
        level: Optional[int] = None,
        skip_unreadable: bool = False,
        one_file_system: bool = False,
        sandbox_path: Optional[PathLike] = None,
        progress: Optional[Progress] = None,
        user: UserSpec = None,
        group: UserSpec = None,
        no_follow: bool = False,
        no_symlinks: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> DirectoryBackupRecord:
        to = _check_ends(dest is not None, sandbox_path, "give either dest (a local path or a writable file) or sandbox_path")
        req = _ops.backup_req(dir, excludes, compression, level, skip_unreadable, one_file_system, to)
        req.fs = _ops.fs_options(user, group, no_follow, no_symlinks)
        progress = _ops.progress_arg(progress)
        write, local = local_dest(dest) if dest is not None else (None, None)
        check_abort(abort)
        extra = 0 if to is not None else _ops.READ_EXTRA_WINDOW
        if local is None:
            call = await self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra)
            return cast(DirectoryBackupRecord, await self._receive(call, write, progress))
        tmp = f"{local}.part-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                call = await self._e.open(req, timeout=seconds(timeout), abort=abort, extra_window=extra)
                rec = await self._receive(call, f.write, progress)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, local)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return cast(DirectoryBackupRecord, rec)

    @staticmethod
    async def _receive(call: AsyncCall, write: Optional[Callable[[bytes], Any]], progress: Optional[Progress]) -> Any:
        try:
            while True:
                it = await call.next()
                if it is None:
                    break
                if type(it) is Data:
                    if it.data and write is not None:
                        await _maybe_await(write(it.data))
                elif type(it) is StreamEvent and progress is not None:
                    p = _ops.progress_of(it.event)
                    if p is not None:
                        await _maybe_await(progress(*p))
        except BaseException:
            call.close()
            raise
        assert call.result is not None
        return _ops.backup_record(call.result)

    async def restore(
        self,
        dir: PathLike,
        source: Union[PathLike, IO[bytes], bytes, Any, None] = None,
        *,
        sha256: Optional[str] = None,
        merge: bool = False,
        allow_devices: bool = False,
        allow_empty: bool = False,
        sandbox_path: Optional[PathLike] = None,
        progress: Optional[Progress] = None,
        user: UserSpec = None,
        group: UserSpec = None,
        no_follow: bool = False,
        no_symlinks: bool = False,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> RestoreResult:
        frm = _check_ends(source is not None, sandbox_path,
                          "give either source (a local path, bytes or a readable file) or sandbox_path")
        req = _ops.restore_req(dir, sha256, merge, allow_devices, frm, allow_empty)
        req.fs = _ops.fs_options(user, group, no_follow, no_symlinks)
        progress = _ops.progress_arg(progress)
        body, local = local_source(source) if source is not None else (None, None)
        check_abort(abort)
        f = open(local, "rb") if local is not None else None
        try:
            if f is not None:
                body = f
            call = await self._e.open(req, timeout=seconds(timeout), abort=abort)
            if body is None:
                pass  # from_path: the archive is in the sandbox, the request takes no data
            else:
                await _send_body(call, body, CHUNK)
            while True:
                it = await call.next()
                if it is None:
                    break
                if type(it) is StreamEvent and progress is not None:
                    p = _ops.progress_of(it.event)
                    if p is not None:
                        await _maybe_await(progress(*p))
        finally:
            if f is not None:
                f.close()
        assert call.result is not None
        return cast(RestoreResult, _ops.restore_result(call.result))


class AsyncMounts:
    """The coroutine twin of Mounts."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._e = engine

    async def mount(
        self,
        bucket: str,
        mount_path: Any,
        *,
        endpoint: str,
        access_key_id: str,
        secret_access_key: str,
        read_only: bool = False,
        prefix: Optional[str] = None,
        region: Optional[str] = None,
        session_token: Optional[str] = None,
        provider: Optional[str] = None,
        allow_non_empty: bool = False,
        options: Sequence[str] = (),
        mount_timeout: Optional[float] = None,
        timeout: Optional[float] = None,
        abort: Any = None,
    ) -> MountRecord:
        req = _ops.mount_req(bucket, mount_path, endpoint=endpoint, access_key_id=access_key_id,
                             secret_access_key=secret_access_key, read_only=read_only, prefix=prefix, region=region,
                             session_token=session_token, provider=provider, allow_non_empty=allow_non_empty,
                             options=options, mount_timeout=mount_timeout)
        check_abort(abort)
        res = await self._e.request(req, timeout=seconds(timeout), abort=abort)
        return cast(MountRecord, _ops.mount_record(_ops.expect(res, "mount")))

    async def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[MountRecord]:
        check_abort(abort)
        res = await self._e.request(_pb.Request(mounts=_pb.MountListRequest()), timeout=seconds(timeout), abort=abort)
        return [cast(MountRecord, _ops.mount_record(m)) for m in _ops.expect(res, "mounts").mounts]

    async def unmount(self, id_or_path: Any, *, flush_timeout: Optional[float] = None, force: bool = False,
                      timeout: Optional[float] = None, abort: Any = None) -> MountRecord:
        req = _ops.unmount_req(id_or_path, flush_timeout, force)
        check_abort(abort)
        res = await self._e.request(req, timeout=seconds(timeout), abort=abort)
        return cast(MountRecord, _ops.mount_record(_ops.expect(res, "mount")))


class AsyncShim:
    """The asyncio twin of Shim::

        async with await AsyncShim.connect("unix:/run/sandbox-shim/shim.sock") as shim:
            await shim.files.write_file("/workspace/a.txt", "hi")
            result = await shim.commands.run(["cat", "/workspace/a.txt"])

    One connection, one reader task; any number of calls in flight at once (each a
    stream of its own). No threads are used."""

    files: AsyncFiles
    commands: AsyncCommands
    backups: AsyncBackups
    mounts: AsyncMounts

    def __init__(self, engine: AsyncEngine, target: str) -> None:
        self._e = engine
        self.target = target
        self.files = AsyncFiles(engine)
        self.commands = AsyncCommands(engine)
        self.backups = AsyncBackups(engine)
        self.mounts = AsyncMounts(engine)
        assert engine.proto.server is not None
        self._server = ServerInfo._from_pb(engine.proto.server)

    @classmethod
    async def connect(
        cls,
        target: Any = None,
        *,
        token: Optional[Union[str, bytes]] = None,
        timeout: Optional[float] = None,
        wait: Optional[float] = None,
        request_timeout: Optional[float] = None,
        client_name: Optional[str] = None,
        exec_stderr: Any = None,
    ) -> "AsyncShim":
        """Connect (same arguments as Shim.connect); ``target`` may also be an async
        transport object (``async read(n)``, ``async write(data)``, ``async close()``)."""
        ct = seconds(timeout) or DEFAULT_CONNECT_TIMEOUT
        w = seconds(wait, "wait")
        tok = token_of(token, target)
        name = client_name_of(client_name)
        rt = seconds(request_timeout, "request_timeout")
        if is_transport(target):
            return await cls._over(target, "transport", tok, name, ct, rt)
        t = target_of(target)
        loop = asyncio.get_running_loop()
        deadline = None if w is None else loop.time() + w
        while True:
            left = None if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                tr = await asyncio.wait_for(open_async_transport(t, wait=left, exec_stderr=exec_stderr),
                                            ct + (left or 0.0))
            except asyncio.TimeoutError:
                raise make_error("connect", 110, f"connect to {t} timed out") from None
            try:
                return await cls._over(tr, t, tok, name, ct, rt)
            except Exception as e:
                if deadline is not None and loop.time() < deadline and getattr(e, "errno", 0) == 104:
                    await asyncio.sleep(0.05)
                    continue
                tail = getattr(tr, "stderr_tail", None)
                if tail is not None and tail() and getattr(e, "kind", "") == "connect":
                    e.message = f"{e.message}; the command said: {tail()[-500:]}"  # type: ignore[attr-defined]
                    e.args = (e.message,)  # type: ignore[attr-defined]
                raise

    @classmethod
    async def _over(cls, transport: Any, target: str, token: Optional[bytes], name: str, timeout: float,
                    request_timeout: Optional[float]) -> "AsyncShim":
        eng = AsyncEngine(transport, Protocol(client_name=name, token=token))
        eng.default_timeout = request_timeout
        await eng.handshake(timeout)
        return cls(eng, target)

    async def close(self) -> None:
        """Close the connection (calls in flight fail with SandboxConnectionError)."""
        await self._e.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._e.closed

    async def __aenter__(self) -> "AsyncShim":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncShim {self.target!r}{' closed' if self.closed else ''}>"

    @property
    def server(self) -> ServerInfo:
        """What the shim said in the handshake (see Shim.server)."""
        return self._server

    def has_feature(self, name: str) -> bool:
        return name in self._server.features

    async def ping(self, *, timeout: Optional[float] = None, abort: Any = None) -> float:
        check_abort(abort)
        return await self._e.ping(seconds(timeout), abort)

    async def info(self, *, timeout: Optional[float] = None, abort: Any = None) -> ShimInfo:
        check_abort(abort)
        res = await self._e.request(_pb.Request(info=_pb.InfoRequest()), timeout=seconds(timeout), abort=abort)
        return _ops.info_result(_ops.expect(res, "info"))

    async def snapshot_prepare(self, *, freeze: Optional[Sequence[Any]] = None, thaw_after: Optional[float] = None,
                               stop_background: bool = False, flush_timeout: Optional[float] = None,
                               timeout: Optional[float] = None, abort: Any = None) -> SnapshotResult:
        """As Shim.snapshot_prepare()."""
        check_abort(abort)
        req = _ops.snapshot_prepare_req(freeze, thaw_after, stop_background, flush_timeout)
        res = await self._e.request(req, timeout=seconds(timeout), abort=abort)
        return _ops.snapshot_prepare_result(_ops.expect(res, "snapshot_prepare"))

    async def resumed(self, *, time: Optional[float] = None, entropy: Optional[bytes] = None, fork: bool = False,
                      timeout: Optional[float] = None, abort: Any = None) -> SnapshotResult:
        """As Shim.resumed()."""
        check_abort(abort)
        req = _ops.resumed_req(time, entropy, fork)
        res = await self._e.request(req, timeout=seconds(timeout), abort=abort)
        return _ops.resumed_result(_ops.expect(res, "resumed"))

    async def eval(self, code: str, *, interpreter: Optional[Sequence[str]] = None, timeout: Optional[float] = None,
                   abort: Any = None) -> str:
        argv = _ops.eval_argv(code, interpreter)
        check_abort(abort)
        call = await self._e.open(_ops.exec_req(argv), timeout=seconds(timeout), abort=abort)
        return _ops.eval_result(await _collect(call, None))

    async def tunnel(self, guest_port: int, local_port: int, local_host: str = "127.0.0.1", *,
                     guest_host: str = "localhost", on_event: Optional[Callable[[Any], Any]] = None,
                     connect_timeout: Optional[float] = None, backlog: Optional[int] = None) -> Any:
        """Shim.tunnel() (sandbox -> host), relayed by tasks on this loop; returns an
        AsyncTunnelHandle (``await handle.close()``, or ``async with``)."""
        from .tunnels import open_tunnel_async

        return await open_tunnel_async(self._e, "reverse", guest_host, guest_port, local_host, local_port, on_event,
                                       connect_timeout, backlog)

    async def forward(self, guest_port: int, local_port: int = 0, local_host: str = "127.0.0.1", *,
                      guest_host: str = "127.0.0.1", on_event: Optional[Callable[[Any], Any]] = None,
                      connect_timeout: Optional[float] = None, backlog: Optional[int] = None) -> Any:
        """Shim.forward() (host -> sandbox), relayed by tasks on this loop."""
        from .tunnels import open_tunnel_async

        return await open_tunnel_async(self._e, "forward", guest_host, guest_port, local_host, local_port, on_event,
                                       connect_timeout, backlog)

    async def tunnels(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[Any]:
        from .tunnels import tunnel_info

        check_abort(abort)
        res = await self._e.request(_pb.Request(tunnels=_pb.TunnelListRequest()), timeout=seconds(timeout),
                                    abort=abort)
        return [tunnel_info(t) for t in _ops.expect(res, "tunnels").tunnels]

    async def close_tunnel(self, tunnel_id: str, *, timeout: Optional[float] = None) -> None:
        i = _ops.id_arg(tunnel_id, "tunnel_id")
        await self._e.request(_pb.Request(tunnel_close=_pb.TunnelCloseRequest(tunnel_id=i)), timeout=seconds(timeout))


def _twin_docs(async_cls: Any, sync_cls: Any) -> None:
    """Give each coroutine twin the docstring of its sync method."""
    for name, fn in list(vars(async_cls).items()):
        if name.startswith("_") or not callable(fn) or getattr(fn, "__doc__", None):
            continue
        src = getattr(sync_cls, name, None)
        if src is not None and src.__doc__:
            fn.__doc__ = f"Coroutine twin of {sync_cls.__name__}.{name}().\n\n{src.__doc__}"


def _link_docs() -> None:
    from .backups import Backups
    from .client import Shim
    from .commands import Commands, Process
    from .files import Files
    from .mounts import Mounts

    for a, s in ((AsyncFiles, Files), (AsyncProcess, Process), (AsyncCommands, Commands), (AsyncBackups, Backups),
                 (AsyncShim, Shim), (AsyncMounts, Mounts)):
        _twin_docs(a, s)


_link_docs()
