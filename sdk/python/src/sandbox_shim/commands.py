"""commands: running commands and background processes in a sandbox (``shim.commands``)."""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Union

from . import _lib
from ._core import CallScope, Core, HandleOwner, check_type, cstr, raise_error, strv, text, timeout_ms
from ._lib import lib
from .errors import SandboxEvalError
from .types import CommandResult, OutputChunk, ProcessInfo, utc

__all__ = ["Commands", "Process", "signal_number"]

Command = Union[str, Sequence[str]]

# Linux signal numbers (the sandbox's, whatever the host is)
SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
    "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16,
    "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23,
    "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31,
}
_READ_CHUNK = 256 * 1024


def signal_number(sig: Union[int, str]) -> int:
    """15 for 15, "TERM", "SIGTERM" or signal.SIGTERM (Linux numbering, 1..64)."""
    if isinstance(sig, bool):
        raise TypeError("signal must be an int or a name like 'TERM', not bool")
    if isinstance(sig, int):
        n = int(sig)
    elif isinstance(sig, str):
        name = sig.upper()
        if name.startswith("SIG"):
            name = name[3:]
        if name not in SIGNALS:
            raise ValueError(f"unknown signal name {sig!r}")
        n = SIGNALS[name]
    else:
        raise TypeError(f"signal must be an int or a name like 'TERM', not {type(sig).__name__}")
    if not 1 <= n <= 64:
        raise ValueError(f"signal must be between 1 and 64, got {n}")
    return n


class _ExecArgs:
    """A struct sbx_exec_opts and the buffers it points to (kept alive with it)."""

    def __init__(
        self,
        cmd: Command,
        *,
        cwd: Any = None,
        env: Optional[Mapping[str, str]] = None,
        clear_env: bool = False,
        user: Union[str, int, None] = None,
        group: Union[str, int, None] = None,
        timeout: Optional[float] = None,
        kill_grace: Optional[float] = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
        name: Optional[str] = None,
    ) -> None:
        self.keep: List[Any] = []
        o = _lib.SbxExecOpts()
        o.struct_size = ctypes.sizeof(_lib.SbxExecOpts)
        if isinstance(cmd, str):
            if not cmd.strip():
                raise ValueError("the command is empty")
            o.shell = self._k(cstr(cmd, "cmd"))
        elif isinstance(cmd, (list, tuple)):
            if not cmd:
                raise ValueError("the command's argv is empty")
            args = []
            for i, a in enumerate(cmd):
                if isinstance(a, bytes):
                    args.append(cstr(a, f"cmd[{i}]"))
                elif isinstance(a, str):
                    args.append(cstr(a, f"cmd[{i}]"))
                else:
                    raise TypeError(f"cmd[{i}] must be str or bytes, not {type(a).__name__}")
            o.argv = self._k(strv(args))
        else:
            raise TypeError(f"cmd must be a str (run with /bin/sh -c) or a list of str, not {type(cmd).__name__}")
        if cwd is not None:
            from ._core import fspath

            o.cwd = self._k(fspath(cwd, "cwd"))
        if env is not None:
            if not isinstance(env, Mapping):
                raise TypeError(f"env must be a mapping of str to str, not {type(env).__name__}")
            items = []
            for k, v in env.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError("env keys and values must be str")
                if not k or "=" in k:
                    raise ValueError(f"bad environment variable name {k!r}")
                items.append(cstr(f"{k}={v}", "env"))
            o.env = self._k(strv(items))
        check_type("clear_env", clear_env, bool, "a bool")
        o.clear_env = int(clear_env)
        for fname, val in (("user", user), ("group", group)):
            if val is None:
                continue
            if isinstance(val, bool) or not isinstance(val, (str, int)):
                raise TypeError(f"{fname} must be a name or a number, not {type(val).__name__}")
            if isinstance(val, int) and val < 0:
                raise ValueError(f"{fname} must not be negative")
            b = cstr(str(val), fname)
            if not b:
                raise ValueError(f"{fname} is empty")
            setattr(o, fname, self._k(b))
        if timeout is not None:
            o.timeout_ms = max(timeout_ms(timeout), 0)
        if kill_grace is not None:
            o.kill_grace_ms = max(timeout_ms(kill_grace, "kill_grace"), 0)
        check_type("pty", pty, bool, "a bool")
        if pty:
            for n, v in (("rows", rows), ("cols", cols)):
                check_type(n, v, int, "an int")
                if not 1 <= v <= 0xFFFF:
                    raise ValueError(f"{n} must be between 1 and 65535")
            o.pty, o.rows, o.cols = 1, rows, cols
        if name is not None:
            o.name = self._k(cstr(name, "name"))
        self.opts = o

    def _k(self, v: Any) -> Any:
        self.keep.append(v)
        return v


def _result(ex: _lib.SbxExit, out: bytes, err: bytes) -> CommandResult:
    status = lib.sbx_exit_status(ctypes.byref(ex))
    return CommandResult(
        stdout_bytes=out,
        stderr_bytes=err,
        exit_code=status,
        signal=ex.signal,
        timed_out=bool(ex.timed_out),
        core_dumped=bool(ex.core_dumped),
        duration=ex.duration_ns / 1e9,
        pid=ex.pid,
        id=text(ex.id),
        stdout_truncated=bool(ex.stdout_truncated),
        stderr_truncated=bool(ex.stderr_truncated),
    )


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


class Process(HandleOwner):
    """A command started with commands.start(): stream its output, write its stdin,
    signal it, wait for it. Use it in a ``with`` block: leaving the block (or close())
    kills the command if it still runs (a detached process is only detached from).

    One thread may read (stream/read/wait) while another writes stdin; signal() and
    kill() may come from any thread."""

    def __init__(self, core: Core, scope: CallScope, handle: int, detached: bool) -> None:
        self._core = core
        self._scope = scope
        self._h = handle
        self._lock = threading.Lock()
        self._result: Optional[CommandResult] = None
        self.detached = detached
        self.id: str = text(lib.sbx_proc_id(handle) or b"")
        self.pid: int = lib.sbx_proc_pid(handle)
        self._abort: Any = None
        self._cv = threading.Condition()
        self._busy = 0
        core.register_closer(id(self), self._free)

    def __repr__(self) -> str:
        return f"<Process id={self.id!r} pid={self.pid}>"

    def _handle(self) -> int:
        if not self._h:
            raise ValueError("the process handle is closed")
        return self._h

    @contextmanager
    def _use(self) -> Iterator[int]:
        """Hold the client and this handle: close() waits for every user to leave."""
        with self._core.use():
            with self._cv:
                h = self._handle()
                self._busy += 1
            try:
                yield h
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def _fail(self, err: _lib.SbxError) -> None:
        raise_error(err, aborted=self._scope.aborted, closed=self._core.closed)

    def write_stdin(self, data: Union[str, bytes]) -> None:
        """Send bytes (str as UTF-8) to the command's stdin (start(..., stdin=True))."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be str or bytes, not {type(data).__name__}")
        b = bytes(data)
        err = _lib.SbxError()
        with self._use() as h:
            if lib.sbx_proc_write(h, b, len(b), ctypes.byref(err)) < 0:
                self._fail(err)

    def close_stdin(self) -> None:
        """Close the command's stdin (it reads EOF)."""
        err = _lib.SbxError()
        with self._use() as h:
            if lib.sbx_proc_close_stdin(h, ctypes.byref(err)) < 0:
                self._fail(err)

    def read(self, size: int = _READ_CHUNK) -> Optional[OutputChunk]:
        """The next piece of output, or None when both stdout and stderr have ended."""
        check_type("size", size, int, "an int")
        if size <= 0:
            raise ValueError("size must be positive")
        buf = ctypes.create_string_buffer(size)
        ch = ctypes.c_int()
        err = _lib.SbxError()
        with self._use() as h:
            n = lib.sbx_proc_read(h, ctypes.byref(ch), buf, size, ctypes.byref(err))
            if n < 0:
                self._fail(err)
        if n == 0:
            return None
        return OutputChunk("stderr" if ch.value == _lib.STDERR else "stdout", buf.raw[:n])

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
            out: List[bytes] = []
            errb: List[bytes] = []
            if collect:
                for c in self.stream():
                    (errb if c.stream == "stderr" else out).append(c.data)
            ex = _lib.SbxExit()
            err = _lib.SbxError()
            with self._use() as h:
                if lib.sbx_proc_wait(h, ctypes.byref(ex), ctypes.byref(err)) < 0:
                    self._fail(err)
            self._result = _result(ex, b"".join(out), b"".join(errb))
            return self._result

    def signal(self, sig: Union[int, str] = "TERM") -> None:
        """Send a signal (number or name) to the command's process group."""
        n = signal_number(sig)
        err = _lib.SbxError()
        with self._use() as h:
            if lib.sbx_proc_signal(h, n, ctypes.byref(err)) < 0:
                raise_error(err)

    def kill(self) -> None:
        """SIGKILL the command's process group."""
        self.signal(9)

    def resize(self, rows: int, cols: int) -> None:
        """Resize the pseudo-terminal (start(..., pty=True))."""
        check_type("rows", rows, int, "an int")
        check_type("cols", cols, int, "an int")
        err = _lib.SbxError()
        with self._use() as h:
            if lib.sbx_proc_resize(h, rows, cols, ctypes.byref(err)) < 0:
                raise_error(err)

    def _free(self) -> None:
        with self._core.lifecycle:  # never overlaps the client's own close
            with self._cv:
                h, self._h = self._h, 0
            self._core.unregister_closer(id(self))
            if h:
                self._release(h)

    def _release(self, h: int) -> None:
        if h:
            from ._core import _watcher, AbortLink

            if isinstance(self._abort, AbortLink):
                self._abort.detach(self._scope)
            elif self._abort is not None:
                _watcher.remove(self._scope)
            lib.sbx_proc_free(h)
            self._core.drop_scope(self._scope)

    def close(self) -> None:
        """Release the handle: a command still running is killed (a detached one is
        only detached from). Calls blocked on it in other threads fail."""
        with self._cv:
            if not self._h:
                return
            if self._busy:
                # wake the reader/writer: the stream is cancelled (what close does anyway)
                self._scope.fire_close()
                while self._busy:
                    self._cv.wait(0.05)
        self._free()


class Commands:
    """Commands in the sandbox: run() to completion, start() with streaming, and the
    shim's background processes (spawn/list/attach/kill/wait/remove).

    ``cmd`` is a str (run with ``/bin/sh -c``) or a list of str (argv, no shell)."""

    def __init__(self, core: Core) -> None:
        self._core = core

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
        output_limit: Optional[int] = None,
        kill_grace: Optional[float] = None,
        request_timeout: Optional[float] = None,
        abort: Any = None,
    ) -> CommandResult:
        """Run a command to completion and collect its output.

        ``timeout`` (seconds) kills the command's whole process group when it passes
        (SIGTERM, then SIGKILL after ``kill_grace``); the result then has
        ``timed_out=True``. A non-zero exit is not an exception. ``stdin`` is fed to
        the command (str, bytes or a file-like object; default: /dev/null).
        ``output_limit`` caps each of stdout and stderr (default 16 MiB; the rest is
        dropped and ``*_truncated`` set). ``abort`` kills the command too and raises
        SandboxAbortError."""
        a = _ExecArgs(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout, kill_grace=kill_grace)
        data = _stdin_bytes(stdin)
        cap = 0
        if output_limit is not None:
            check_type("output_limit", output_limit, int, "an int")
            if output_limit <= 0:
                raise ValueError("output_limit must be positive")
            cap = output_limit
        out = _lib.SbxOutput()
        ex = _lib.SbxExit()
        with self._core.call(timeout=request_timeout, abort=abort) as s:
            rc = lib.sbx_run(
                s.handle, s.opts, ctypes.byref(a.opts), data, len(data) if data is not None else 0, cap,
                ctypes.byref(out), ctypes.byref(ex), s.err,
            )
            if rc < 0:
                s.fail()
        try:
            o = ctypes.string_at(out.out, out.out_len) if out.out_len else b""
            e = ctypes.string_at(out.err, out.err_len) if out.err_len else b""
        finally:
            lib.sbx_output_free(ctypes.byref(out))
        return _result(ex, o, e)

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
        a = _ExecArgs(cmd, cwd=cwd, env=env, clear_env=clear_env, user=user, group=group, timeout=timeout,
                      kill_grace=kill_grace, pty=pty, rows=rows, cols=cols)
        check_type("stdin", stdin, bool, "a bool (then write with write_stdin())")
        return self._open(lambda s, out: lib.sbx_exec_start(s.handle, s.opts, ctypes.byref(a.opts), _lib.PROC_STDIN if stdin else 0, out, s.err),
                          request_timeout, abort, detached=False)

    def _open(self, fn: Any, request_timeout: Any, abort: Any, detached: bool) -> Process:
        from ._core import _watcher, check_abort, AbortLink

        check_abort(abort)
        scope = self._core.new_scope(request_timeout)
        try:
            if isinstance(abort, AbortLink):
                abort.attach(scope)
            elif abort is not None:
                _watcher.add(abort, scope)
            h = ctypes.c_void_p()
            with self._core.use():
                if fn(scope, ctypes.byref(h)) < 0:
                    scope.fail()
            proc = Process(self._core, scope, h.value, detached)
            proc._abort = abort
            return proc
        except BaseException:
            if abort is not None and not isinstance(abort, AbortLink):
                _watcher.remove(scope)
            self._core.drop_scope(scope)
            raise

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
        a = _ExecArgs(cmd, cwd=cwd, env=env, user=user, timeout=timeout, name=name)
        info = _lib.SbxProcessInfo()
        with self._core.call(timeout=request_timeout, abort=abort) as s:
            if lib.sbx_spawn(s.handle, s.opts, ctypes.byref(a.opts), ctypes.byref(info), s.err) < 0:
                s.fail()
        return _info(info)

    def list(self, *, timeout: Optional[float] = None, abort: Any = None) -> List[ProcessInfo]:
        """The processes the shim knows (running, and exited ones kept for wait)."""
        out: List[ProcessInfo] = []

        def cb(ud: int, p: Any) -> int:
            out.append(_info(p.contents))
            return 0

        fn = _lib.PROCESS_FN(cb)
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_ps(s.handle, s.opts, fn, None, s.err) < 0:
                s.fail()
        return out

    def attach(self, id: str, *, stdin: bool = False, replay: bool = True, request_timeout: Optional[float] = None, abort: Any = None) -> Process:
        """Attach to a background process's output (the ring buffer's contents unless
        replay=False, then live output until it exits). Closing the handle detaches."""
        b = cstr(id, "id")
        if not b:
            raise ValueError("id is empty")
        check_type("stdin", stdin, bool, "a bool")
        check_type("replay", replay, bool, "a bool")
        fl = _lib.ATTACH_FOLLOW | (_lib.ATTACH_STDIN if stdin else 0) | (0 if replay else _lib.ATTACH_NO_REPLAY)
        return self._open(lambda s, out: lib.sbx_attach(s.handle, s.opts, b, fl, out, s.err), request_timeout, abort, detached=True)

    def wait(self, id: str, *, timeout: Optional[float] = None, abort: Any = None) -> CommandResult:
        """Wait for a process by id (output is not collected: use attach())."""
        b = cstr(id, "id")
        ex = _lib.SbxExit()
        with self._core.call(timeout=timeout, abort=abort) as s:
            if lib.sbx_wait(s.handle, s.opts, b, ctypes.byref(ex), s.err) < 0:
                s.fail()
        return _result(ex, b"", b"")

    def kill(self, id: str, signal: Union[int, str] = "KILL", *, timeout: Optional[float] = None) -> None:
        """Signal a process's whole process group by id (default SIGKILL)."""
        b = cstr(id, "id")
        n = signal_number(signal)
        with self._core.call(timeout=timeout) as s:
            if lib.sbx_kill(s.handle, s.opts, b, n, s.err) < 0:
                s.fail()

    def remove(self, id: str, *, kill: bool = False, timeout: Optional[float] = None) -> None:
        """Forget an exited process (SandboxBusyError if it runs, unless kill=True)."""
        b = cstr(id, "id")
        check_type("kill", kill, bool, "a bool")
        with self._core.call(timeout=timeout) as s:
            if lib.sbx_rmproc(s.handle, s.opts, b, int(kill), s.err) < 0:
                s.fail()


def _info(p: _lib.SbxProcessInfo) -> ProcessInfo:
    return ProcessInfo(
        id=text(p.id),
        pid=p.pid,
        running=bool(p.running),
        started_at=utc(p.started_at),
        detached=bool(p.detached),
        pty=bool(p.pty),
        command=text(p.argv),
        exit_code=None if p.running else lib.sbx_exit_status(ctypes.byref(p.exit)),
        signal=0 if p.running else p.exit.signal,
    )


def run_eval(core: Core, code: str, interpreter: Optional[Sequence[str]], timeout: Optional[float], abort: Any) -> str:
    """Shim.eval(): run a snippet, return what it printed; raise SandboxEvalError."""
    c = cstr(code, "code")
    interp = None
    if interpreter is not None:
        if isinstance(interpreter, str) or not isinstance(interpreter, (list, tuple)):
            raise TypeError("interpreter must be a list of str, e.g. ['python3', '-c']")
        if not interpreter:
            raise ValueError("interpreter is empty")
        interp = strv([cstr(x, "interpreter") for x in interpreter])
    out = _lib.SbxOutput()
    ex = _lib.SbxExit()
    with core.call(timeout=timeout, abort=abort) as s:
        rc = lib.sbx_eval(s.handle, s.opts, interp, c, ctypes.byref(out), ctypes.byref(ex), s.err)
        try:
            o = ctypes.string_at(out.out, out.out_len) if out.out_len else b""
            e = ctypes.string_at(out.err, out.err_len) if out.err_len else b""
        finally:
            lib.sbx_output_free(ctypes.byref(out))
        if rc < 0:
            if s.err.kind == _lib.ERR_EXIT:
                stderr = e.decode("utf-8", "replace")
                msg = stderr.strip() or text(s.err.message)
                exc = SandboxEvalError(msg, errno=0, errno_name=None, path=None, kind="exit")
                exc.stdout = o.decode("utf-8", "replace")
                exc.stderr = stderr
                exc.exit_code = s.err.code
                exc.signal = ex.signal
                raise exc
            s.fail()
    return o.decode("utf-8", "replace")
