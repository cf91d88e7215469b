"""commands: running commands and background processes in a sandbox (``shim.commands``)."""

from __future__ import annotations

import threading
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Union

from . import _ops, _pb
from ._core import check_abort, check_type, seconds
from ._ops import Command, signal_number
from ._protocol import Data, StreamEvent
from ._sync import Call, Engine, closed_error, make_error
from .errors import SandboxError
from .types import CommandResult, OutputChunk, ProcessInfo

__all__ = ["Commands", "Process", "signal_number"]

_READ_CHUNK = 256 * 1024


def _stdin_bytes(stdin: Any) -> Optional[bytes]:
    if stdin is None:
        return None
    if isinstance(stdin, str):
        return stdin.encode()
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return bytes(stdin)
    if callable(getattr(stdin, "read", None)):
        data = stdin.read()
        return data.encode() if isinstance(data, str) else bytes(data)
    raise TypeError(f"stdin must be str, bytes or a readable file-like object, not {type(stdin).__name__}")


def collect(call: Call, stdin: Optional[bytes]) -> CommandResult:
    """Run an exec stream to its END: stdin sent (then closed), output gathered."""
    out: List[bytes] = []
    err: List[bytes] = []
    if stdin is not None:
        # from a helper thread: a command that writes before it reads must not deadlock
        # against our writing (its output is read here meanwhile)
        t = threading.Thread(target=_feed, args=(call, stdin), name="sandbox_shim-stdin", daemon=True)
        t.start()
    while True:
        it = call.next()
        if it is None:
            break
        if type(it) is Data and it.data:
            (err if it.stderr else out).append(it.data)
    res = call.result
    assert res is not None
    return _ops.command_result(_ops.expect(res, "exit"), b"".join(out), b"".join(err))


def _feed(call: Call, data: bytes) -> None:
    try:
        call.write(data, fin=True)
    except Exception:
        pass  # the command ended (or the call failed): the main loop reports it


def _started(call: Call) -> "_pb.ProcessStarted":
    """Wait for exec's first EVENT (started); output arriving before it is kept."""
    early: List[Any] = []
    while True:
        it = call.next()
        if it is None:
            raise make_error("protocol", 71, "the shim ended an exec stream without a started event")
        if type(it) is StreamEvent and it.event.which_kind() == "started":
            call.items.extendleft(reversed(early))
            return it.event.started
        early.append(it)


class Process:
    """A command started with commands.start(): stream its output, write its stdin,
    signal it, wait for it. Use it in a ``with`` block: leaving the block (or close())
    kills the command if it still runs (a detached process is only detached from).

    One thread may read (stream/read/wait) while another writes stdin; signal() and
    kill() may come from any thread."""

    def __init__(self, engine: Engine, call: Call, started: "_pb.ProcessStarted", detached: bool,
                 request_timeout: Optional[float], stdin: bool = False) -> None:
        self._e = engine
        self._call = call
        self._lock = threading.Lock()
        self._result: Optional[CommandResult] = None
        self._timeout = request_timeout
        self._buf: Optional[Data] = None
        self._eof = False
        self._closed = False
        self.detached = detached
        self._stdin = stdin
        self.id: str = started.id
        self.pid: int = started.pid
        engine.add_closer(id(self), self._drop)

    def __repr__(self) -> str:
        return f"<Process id={self.id!r} pid={self.pid}>"

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # dropped without close(): a command still running is killed (its stream
        # cancelled), as close() would, without waiting for a lock
        try:
            if not self._closed:
                self._closed = True
                self._e.drop(self._call)
        except Exception:
            pass

    _conn_closed = False

    def _check(self) -> None:
        if self._closed:
            if self._conn_closed:
                raise closed_error()
            raise ValueError("the process handle is closed")

    def write_stdin(self, data: Union[str, bytes]) -> None:
        """Send bytes (str as UTF-8) to the command's stdin (start(..., stdin=True))."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be str or bytes, not {type(data).__name__}")
        self._check()
        self._write(data, False)

    def close_stdin(self) -> None:
        """Close the command's stdin (it reads EOF)."""
        self._check()
        self._write(b"", True)

    def _write(self, data: Any, fin: bool) -> None:
        if not self._stdin:
            raise SandboxError("the command's stdin was not opened (start it with stdin=True)", errno=9,
                               errno_name="EBADF", kind="local")
        c = self._call
        if c.done and c.error is None:
            raise SandboxError("the command has ended: its stdin is closed", errno=32, errno_name="EPIPE", kind="local")
        try:
            c.write(data, fin)
        except RuntimeError:
            raise SandboxError("stdin is closed already", errno=32, errno_name="EPIPE", kind="local") from None

    def read(self, size: int = _READ_CHUNK) -> Optional[OutputChunk]:
        """The next piece of output (at most ``size`` bytes), or None when both stdout
        and stderr have ended."""
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
                head, rest = d.data[:size], d.data[size:]
                self._buf = Data(d.stream, rest, d.fin, d.stderr)
                return OutputChunk("stderr" if d.stderr else "stdout", head)
            if self._eof:
                return None
            it = self._call.next(self._timeout)
            if it is None:
                self._eof = True
                return None
            if type(it) is Data:
                if it.fin:
                    self._eof = True
                if it.data:
                    self._buf = it

    def stream(self) -> Iterator[OutputChunk]:
        """Iterate over the output as it comes: OutputChunk(stream, data)."""
        while True:
            c = self.read()
            if c is None:
                return
            yield c

    __iter__ = stream

    def wait(self, *, collect: bool = True) -> CommandResult:
        """Wait for the exit. With ``collect`` the output not read yet is gathered
        into the result's stdout/stderr (all of it if you never streamed); otherwise
        it is discarded."""
        with self._lock:
            if self._result is not None:
                return self._result
            self._check()
            out: List[bytes] = []
            errb: List[bytes] = []
            while True:
                c = self.read()
                if c is None:
                    break
                if collect:
                    (errb if c.stream == "stderr" else out).append(c.data)
            res = self._call.wait_end(self._timeout)
            self._result = _ops.command_result(_ops.expect(res, "exit"), b"".join(out), b"".join(errb))
            self._e.remove_closer(id(self))
            return self._result

    def signal(self, sig: Union[int, str] = "TERM") -> None:
        """Send a signal (number or name) to the command's process group."""
        n = signal_number(sig)
        self._e.request(_pb.Request(signal=_pb.SignalRequest(id=self.id, signal=n)), timeout=self._timeout)

    def kill(self) -> None:
        """SIGKILL the command's process group."""
        self.signal(9)

    def resize(self, rows: int, cols: int) -> None:
        """Resize the pseudo-terminal (start(..., pty=True))."""
        check_type("rows", rows, int, "an int")
        check_type("cols", cols, int, "an int")
        if not (1 <= rows <= 0xFFFF and 1 <= cols <= 0xFFFF):
            raise ValueError("rows and cols must be between 1 and 65535")
        self._e.request(_pb.Request(resize=_pb.ResizeRequest(id=self.id, rows=rows, cols=cols)), timeout=self._timeout)

    def _drop(self) -> None:
        # the connection is closing: calls on the handle fail as the connection's do
        self._conn_closed = True
        self._closed = True

    def close(self) -> None:
        """Release the handle: a command still running is killed (a detached one is
        only detached from). Calls blocked on it in other threads fail."""
        if self._closed:
            return
        self._closed = True
        self._e.remove_closer(id(self))
        self._call.close()  # CANCEL: kills the group of an exec, detaches an attach


class Commands:
    """Commands in the sandbox: run() to completion, start() with streaming, and the
    shim's background processes (spawn/list/attach/kill/wait/remove).

    ``cmd`` is a str (run with ``/bin/sh -c``) or a list of str (argv, no shell)."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    def run(
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
        """Run a command to completion and collect its output.

        ``timeout`` (seconds) kills the command's whole process group when it passes
        (SIGTERM, then SIGKILL after ``kill_grace``); the result then has
        ``timed_out=True``. A non-zero exit is not an exception. ``stdin`` is fed to
        the command (str, bytes or a file-like object; default: /dev/null).

        Output is never cut silently: all of it is collected (streamed with flow
        control), unless ``max_output`` bytes per stream is given; a command that
        writes more then raises SandboxOutputLimitError (its ``result`` holds the
        first ``max_output`` bytes), or, with ``truncate=True``, returns that result
        with ``stdout_truncated``/``stderr_truncated`` set. ``abort`` kills the command
        too and raises SandboxAbortError."""
        limit = _ops.max_output_arg(max_output)
        _ops.check_bool("truncate", truncate)
        data = _stdin_bytes(stdin)
        req = _ops.exec_req(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout,
                            kill_grace=kill_grace, stdin=data is not None, output_cap=limit)
        check_abort(abort)
        call = self._e.open(req, timeout=seconds(request_timeout, "request_timeout"), abort=abort)
        try:
            r = collect(call, data)
        except BaseException:
            call.close()
            raise
        return _ops.check_output_limit(r, limit, truncate)

    def start(
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
    ) -> Process:
        """Start a command and return at once with a Process to stream its output,
        write its stdin (``stdin=True``), signal it and wait for it. Output is
        back-pressured: a command whose output nobody reads is paused, not buffered.
        ``timeout`` limits the command's run time; ``request_timeout`` each wait on
        it; ``abort`` (an event) kills it and fails the waits with SandboxAbortError."""
        check_type("stdin", stdin, bool, "a bool (then write with write_stdin())")
        req = _ops.exec_req(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout,
                            kill_grace=kill_grace, stdin=stdin, pty=pty, rows=rows, cols=cols)
        return self._open(req, request_timeout, abort, detached=False, stdin=stdin)

    def _open(self, req: Any, request_timeout: Optional[float], abort: Any, detached: bool,
              stdin: bool = False) -> Process:
        check_abort(abort)
        rt = seconds(request_timeout, "request_timeout")
        call = self._e.open(req, abort=abort, use_default=False)
        try:
            started = _started(call) if rt is None else _with_timeout(call, rt)
        except BaseException:
            call.close()
            raise
        return Process(self._e, call, started, detached, rt, stdin)

    # ---- background processes (they outlive the connection) ----

    def spawn(
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
        """Start a detached background process that outlives this connection (its
        output is kept in a ring buffer); returns its info with its ``id``."""
        req = _ops.exec_req(cmd, cwd=cwd, env=env, user=user, timeout=timeout, name=name, detach=True)
        check_abort(abort)
        res = self._e.request(req, timeout=seconds(request_timeout, "request_timeout"), abort=abort)
        return _ops.process_info(_ops.expect(res, "process"))

    def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[ProcessInfo]:
        """The processes the shim knows (running, and exited ones kept for wait)."""
        check_abort(abort)
        res = self._e.request(_pb.Request(ps=_pb.ProcessListRequest()), timeout=seconds(timeout), abort=abort)
        return [_ops.process_info(p) for p in _ops.expect(res, "ps").processes]

    def attach(self, id: str, *, stdin: bool = False, replay: bool = True, request_timeout: Optional[float] = None,
               abort: Any = None) -> Process:
        """Attach to a background process's output (the ring buffer's contents unless
        replay=False, then live output until it exits). Closing the handle detaches."""
        i = _ops.id_arg(id)
        _ops.check_bool("stdin", stdin)
        _ops.check_bool("replay", replay)
        req = _pb.Request(attach=_pb.AttachRequest(id=i, stdin=stdin or None, no_replay=None if replay else True,
                                                   follow=True))
        return self._open(req, request_timeout, abort, detached=True, stdin=stdin)

    def wait(self, id: str, *, timeout: Optional[float] = None, abort: Any = None) -> CommandResult:
        """Wait for a process by id (output is not collected: use attach())."""
        i = _ops.id_arg(id)
        check_abort(abort)
        res = self._e.request(_pb.Request(wait=_pb.WaitRequest(id=i)), timeout=seconds(timeout), abort=abort)
        return _ops.command_result(_ops.expect(res, "exit"), b"", b"")

    def kill(self, id: str, signal: Union[int, str] = "KILL", *, timeout: Optional[float] = None) -> None:
        """Signal a process's whole process group by id (default SIGKILL)."""
        i = _ops.id_arg(id)
        n = signal_number(signal)
        self._e.request(_pb.Request(signal=_pb.SignalRequest(id=i, signal=n)), timeout=seconds(timeout))

    def remove(self, id: str, *, kill: bool = False, timeout: Optional[float] = None) -> None:
        """Forget an exited process (SandboxBusyError if it runs, unless kill=True)."""
        i = _ops.id_arg(id)
        _ops.check_bool("kill", kill)
        self._e.request(_pb.Request(rmproc=_pb.RemoveProcessRequest(id=i, kill=kill or None)), timeout=seconds(timeout))


def _with_timeout(call: Call, rt: float) -> "_pb.ProcessStarted":
    saved = call.deadline
    import time

    call.deadline = time.monotonic() + rt
    try:
        return _started(call)
    finally:
        call.deadline = saved


def run_eval(engine: Engine, code: str, interpreter: Optional[Sequence[str]], timeout: Optional[float],
             abort: Any) -> str:
    """Shim.eval(): run a snippet, return what it printed; raise SandboxEvalError."""
    argv = _ops.eval_argv(code, interpreter)
    check_abort(abort)
    call = engine.open(_ops.exec_req(argv), timeout=seconds(timeout), abort=abort)
    try:
        r = collect(call, None)
    except BaseException:
        call.close()
        raise
    return _ops.eval_result(r)
