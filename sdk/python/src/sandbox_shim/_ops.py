"""_ops: each operation's Request, built from the public arguments (checked), and its
Result turned into the public types. Shared by the sync and asyncio APIs, which only
move the bytes; nothing here does I/O."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _pb
from ._core import bytes_arg, check_bool, check_type, fspath, millis, text, text_arg
from .errors import SandboxError, SandboxEvalError, SandboxOutputLimitError, SandboxProtocolError
from .types import (
    CommandResult,
    DiskUsage,
    ProcessInfo,
    SandboxFileEntry,
    SandboxFileStat,
    ShimInfo,
    SnapshotResult,
    SnapshotStep,
    WatchEvent,
    utc,
)

Command = Union[str, Sequence[str]]
R = _pb.Request

WATCH_TYPES = {1: "create", 2: "modify", 3: "delete", 4: "moved_from", 5: "moved_to", 6: "attrib", 7: "overflow",
               8: "delete_self"}
COMPRESSIONS = {"none": 0, "gzip": 1, "zstd": 2}
COMPRESSION_NAMES = {v: k for k, v in COMPRESSIONS.items()}
MOUNT_STATES = {0: "starting", 1: "live", 2: "failed", 3: "unmounting", 4: "unmounted"}
TUNNEL_KINDS = {1: "forward", 2: "reverse"}
# Linux signal numbers (the sandbox's, whatever the host is)
SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
    "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16,
    "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23,
    "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31,
}
DEFAULT_INTERPRETER = ("python3", "-c")


def expect(res: "_pb.Result", kind: str) -> Any:
    """The member ``kind`` of a Result; a Result of another kind is a protocol error."""
    got = res.which_kind()
    if got != kind:
        raise SandboxProtocolError(f"the shim answered with a {got or 'empty'} result where {kind} was expected",
                                   errno=71, errno_name="EPROTO", kind="protocol")
    return getattr(res, kind)


# ---- system ----


def info_result(i: "_pb.InfoReply") -> ShimInfo:
    return ShimInfo(
        shim_version=i.shim_version, protocol_version=i.protocol_version, features=list(i.features),
        uptime=i.uptime_ms / 1000, pid=i.pid, pid1=bool(i.pid1), uid=i.uid, gid=i.gid,
        hostname=i.hostname or "", boot_id=i.boot_id or "", connections=i.connections or 0,
        streams=i.streams or 0, processes=i.processes or 0, mounts=i.mounts or 0, rss_bytes=i.rss_bytes or 0,
        load=[i.load1 or 0.0, i.load5 or 0.0, i.load15 or 0.0], generation=i.generation or 0,
    )


# ---- microVM snapshots (PROTOCOL.md 12.6) ----

FREEZE_MAX = 16


def snapshot_prepare_req(freeze: Optional[Sequence[Any]], thaw_after: Optional[float], stop_background: bool,
                         flush_timeout: Optional[float]) -> "_pb.Request":
    if isinstance(freeze, (str, bytes)):
        raise TypeError("freeze must be a list of paths, not a single path")
    paths = [fspath(p, "freeze") for p in (freeze or [])]
    if len(paths) > FREEZE_MAX:
        raise ValueError(f"freeze: at most {FREEZE_MAX} filesystems")
    return _pb.Request(snapshot_prepare=_pb.SnapshotPrepareRequest(
        freeze=paths, thaw_after_ms=millis(thaw_after, "thaw_after"),
        stop_background=check_bool("stop_background", stop_background) or None,
        flush_timeout_ms=millis(flush_timeout, "flush_timeout")))


def resumed_req(time: Optional[float], entropy: Optional[bytes], fork: bool) -> "_pb.Request":
    """time: the host's wall clock in seconds since the epoch (None: this host's now);
    entropy: 32..512 bytes (None: 64 bytes of os.urandom). Range checks are the shim's."""
    import time as _time

    if time is None:
        ns = _time.time_ns()
    else:
        if isinstance(time, bool) or not isinstance(time, (int, float)):
            raise TypeError(f"time must be a number of seconds, not {type(time).__name__}")
        ns = int(time * 1_000_000_000) if isinstance(time, float) else time * 1_000_000_000
    if entropy is None:
        entropy = os.urandom(64)
    elif not isinstance(entropy, (bytes, bytearray, memoryview)):
        raise TypeError(f"entropy must be bytes, not {type(entropy).__name__}")
    return _pb.Request(resumed=_pb.ResumedRequest(
        time=_pb.Timestamp(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000), entropy=bytes(entropy),
        fork=check_bool("fork", fork) or None))


def _steps(steps: Sequence[Any]) -> List[SnapshotStep]:
    from .errors import errno_name

    out = []
    for s in steps:
        e = s.errno_num or 0
        out.append(SnapshotStep(name=s.name, duration=s.duration_us / 1e6, error=e,
                                error_name=(errno_name(e) or f"E{e}") if e else "", message=s.message or "",
                                path=os.fsdecode(s.path) if s.path else "", count=s.count or 0))
    return out


def snapshot_prepare_result(r: "_pb.SnapshotPrepareReply") -> SnapshotResult:
    return SnapshotResult(generation=r.generation, steps=_steps(r.steps), frozen=[os.fsdecode(p) for p in r.frozen],
                          stopped=list(r.stopped), thaw_after=r.thaw_after_ms / 1000)


def resumed_result(r: "_pb.ResumedReply") -> SnapshotResult:
    return SnapshotResult(generation=r.generation, steps=_steps(r.steps), prepared=bool(r.prepared),
                          clock_delta=(r.clock_delta_ns or 0) / 1e9)


# ---- files ----

UserSpec = Union[str, int, None]


def id_spec(value: UserSpec, name: str) -> Optional[str]:
    """A user or group for Request.fs: a name, or a number (int or decimal str)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= 0xFFFFFFFE:
            raise ValueError(f"{name} must be between 0 and 4294967294, got {value}")
        return str(value)
    check_type(name, value, str, "a name, a number or None")
    if value == "" or "\0" in value or ":" in value:
        raise ValueError(f"{name} must be a non-empty name or number without ':' or NUL, got {value!r}")
    return value


def fs_options(user: UserSpec, group: UserSpec, no_follow: bool, no_symlinks: bool,
               base: Optional["_pb.FsOptions"] = None) -> Optional["_pb.FsOptions"]:
    """A file operation's identity and resolve flags (Request.fs, PROTOCOL.md 12.1.1),
    over a view's defaults (base): a user given replaces the view's user and group, a
    group alone the view's group; the flags add up. None when nothing is set (the
    request then goes without an fs field, as before)."""
    u = id_spec(user, "user")
    g = id_spec(group, "group")
    check_bool("no_follow", no_follow)
    check_bool("no_symlinks", no_symlinks)
    if base is not None:
        if u is None:
            u = base.user
            if g is None:
                g = base.group
        no_follow = no_follow or bool(base.no_follow)
        no_symlinks = no_symlinks or bool(base.no_symlinks)
    if u is None and g is None and not no_follow and not no_symlinks:
        return None
    return _pb.FsOptions(user=u, group=g, no_follow=no_follow or None, no_symlinks=no_symlinks or None)


def mode_arg(mode: Optional[int], name: str = "mode") -> Optional[int]:
    if mode is None:
        return None
    check_type(name, mode, int, "an int (e.g. 0o644)")
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"{name} must be between 0 and 0o7777, got {mode:#o}")
    return mode


def stat_req(path: Any, follow: bool) -> Tuple[bytes, "_pb.Request"]:
    p = fspath(path)
    check_bool("follow_symlinks", follow)
    return p, R(stat=_pb.StatRequest(path=p, follow=True if follow else None))


def stat_result(p: bytes, res: "_pb.Result") -> SandboxFileStat:
    return SandboxFileStat._from_pb(os.fsdecode(p), expect(res, "stat"))


def read_req(path: Any, offset: int, length: Optional[int], allow_special: bool = False) -> "_pb.Request":
    p = fspath(path)
    check_bool("allow_special", allow_special)
    check_type("offset", offset, int, "an int")
    if offset < 0:
        raise ValueError("offset must not be negative")
    if length is not None:
        check_type("length", length, int, "an int or None")
        if length < 0:
            raise ValueError("length must not be negative")
    return R(read=_pb.ReadRequest(path=p, offset=offset or None, length=length, allow_special=allow_special or None))


# Extra credit granted for reads and backups on top of the initial window (as libsbx
# does): with 4 MiB in flight a download is bound by bandwidth, not by round trips.
READ_EXTRA_WINDOW = 4 << 20


def check_read_end(res: "_pb.Result", delivered: int, fin: bool) -> int:
    """A read's END must announce exactly the bytes delivered, after the shim's FIN:
    anything else means bytes went missing, and the data must not pass for the file."""
    announced = expect(res, "read").bytes
    if not fin or announced != delivered:
        raise SandboxProtocolError(
            f"read ended with {delivered} bytes delivered of {announced} announced"
            + ("" if fin else " (no FIN)"), errno=71, errno_name="EPROTO", kind="protocol")
    return delivered


def write_req(path: Any, mode: Optional[int], append: bool, exclusive: bool, parents: bool,
              atomic: bool, allow_special: bool = False) -> Tuple[bytes, "_pb.Request"]:
    p = fspath(path)
    m = mode_arg(mode)
    for name, v in (("append", append), ("exclusive", exclusive), ("parents", parents), ("atomic", atomic),
                    ("allow_special", allow_special)):
        check_bool(name, v)
    return p, R(write=_pb.WriteRequest(path=p, mode=m, append=append or None, exclusive=exclusive or None,
                                       parents=parents or None, no_atomic=None if atomic else True,
                                       allow_special=allow_special or None))


def write_result(p: bytes, res: "_pb.Result") -> SandboxFileStat:
    return SandboxFileStat._from_pb(os.fsdecode(p), expect(res, "write").stat)


def body_arg(data: Any, name: str = "data") -> Any:
    """What write_file accepts: str (UTF-8), bytes-like, or a readable file-like object."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray)):
        return data
    if isinstance(data, memoryview):
        return data if data.c_contiguous else data.tobytes()
    if callable(getattr(data, "readinto", None)) or callable(getattr(data, "read", None)):
        return data
    raise TypeError(f"{name} must be str, bytes or a readable file-like object, not {type(data).__name__}")


class Reader:
    """Chunks from a file-like object (readinto when it has it); str is encoded."""

    def __init__(self, f: Any, size: int) -> None:
        self.f = f
        self.size = size
        self.into = getattr(f, "readinto", None)
        self.buf = bytearray(size) if self.into is not None else None

    def chunk(self) -> bytes:
        if self.into is not None:
            assert self.buf is not None
            n = self.into(memoryview(self.buf))
            if not n:
                return b""
            return bytes(self.buf[:n])
        data = self.f.read(self.size)
        if isinstance(data, str):
            data = data.encode()
        if data is None:
            return b""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"read() returned {type(data).__name__}, not bytes")
        return bytes(data)


def list_req(path: Any, recursive: bool, depth: Optional[int], hidden: bool, follow: bool) -> Tuple[str, "_pb.Request"]:
    p = fspath(path)
    check_bool("recursive", recursive)
    check_bool("hidden", hidden)
    check_bool("follow_symlinks", follow)
    if depth is not None:
        check_type("depth", depth, int, "an int or None")
        if depth < 1:
            raise ValueError("depth must be at least 1")
        d = depth
    else:
        d = 0 if recursive else 1
    base = os.fsdecode(p).rstrip("/")
    return base, R(list=_pb.ListRequest(path=p, depth=d, follow_symlinks=follow or None, hidden=hidden or None))


class Delimited:
    """Splits a stream of DATA into length-delimited messages (list, watch)."""

    MAX = 1 << 20

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        buf = self.buf
        buf += data
        out: List[bytes] = []
        pos, n = 0, len(buf)
        while True:
            ln, shift, q = 0, 0, pos
            while q < n:
                b = buf[q]
                q += 1
                ln |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise SandboxProtocolError("bad length in a delimited message stream", errno=74,
                                               errno_name="EBADMSG", kind="protocol")
            else:
                break  # the length itself is not all there yet
            if ln > self.MAX:
                raise SandboxProtocolError(f"a delimited message of {ln} bytes", errno=90, errno_name="EMSGSIZE",
                                           kind="protocol")
            if n - q < ln:
                break
            out.append(bytes(buf[q:q + ln]))
            pos = q + ln
        if pos:
            del buf[:pos]
        return out

    def finish(self) -> None:
        if self.buf:
            raise SandboxProtocolError("the message stream ended in the middle of a message", errno=74,
                                       errno_name="EBADMSG", kind="protocol")


def decode(cls: Any, b: bytes) -> Any:
    try:
        return cls.decode(b)
    except _pb.DecodeError as e:
        raise SandboxProtocolError(f"cannot decode {cls.__name__}: {e}", errno=74, errno_name="EBADMSG",
                                   kind="protocol") from None


def dir_entry(base: str, b: bytes) -> SandboxFileEntry:
    e = decode(_pb.DirEntry, b)
    name = os.fsdecode(e.name)
    full = f"{base}/{name}"
    return SandboxFileEntry(name=name, path=full, stat=SandboxFileStat._from_pb(full, e.stat))


def watch_req(path: Any, recursive: bool) -> "_pb.Request":
    p = fspath(path)
    check_bool("recursive", recursive)
    return R(watch=_pb.WatchRequest(path=p, recursive=recursive or None))


def watch_event(b: bytes) -> WatchEvent:
    e = decode(_pb.WatchEvent, b)
    return WatchEvent(WATCH_TYPES.get(e.type, str(e.type)), os.fsdecode(e.path) if e.path is not None else None,
                      bool(e.is_dir), e.cookie or 0)


def mkdir_req(path: Any, parents: bool, mode: Optional[int]) -> "_pb.Request":
    p = fspath(path)
    check_bool("parents", parents)
    return R(mkdir=_pb.MkdirRequest(path=p, parents=parents or None, mode=mode_arg(mode)))


def remove_req(path: Any, recursive: bool) -> "_pb.Request":
    p = fspath(path)
    check_bool("recursive", recursive)
    return R(remove=_pb.RemoveRequest(path=p, recursive=recursive or None))


def rename_req(src: Any, dst: Any, overwrite: bool) -> "_pb.Request":
    a, b = fspath(src, "src"), fspath(dst, "dst")
    check_bool("overwrite", overwrite)
    return R(rename=_pb.RenameRequest(src=a, dst=b, no_replace=None if overwrite else True))


def copy_req(src: Any, dst: Any, recursive: bool) -> "_pb.Request":
    a, b = fspath(src, "src"), fspath(dst, "dst")
    check_bool("recursive", recursive)
    return R(copy=_pb.CopyRequest(src=a, dst=b, recursive=recursive or None))


def chmod_req(path: Any, mode: int) -> "_pb.Request":
    p = fspath(path)
    if mode is None:
        raise TypeError("mode must be an int, not None")
    return R(chmod=_pb.ChmodRequest(path=p, mode=mode_arg(mode)))


def chown_req(path: Any, uid: Optional[int], gid: Optional[int], follow: bool) -> "_pb.Request":
    p = fspath(path)
    ids: List[Optional[int]] = []
    for name, v in (("uid", uid), ("gid", gid)):
        if v is None:
            ids.append(None)
            continue
        check_type(name, v, int, "an int or None")
        if not 0 <= v < 2**32 - 1:
            raise ValueError(f"{name} out of range: {v}")
        ids.append(v)
    check_bool("follow_symlinks", follow)
    return R(chown=_pb.ChownRequest(path=p, uid=ids[0], gid=ids[1], no_follow=None if follow else True))


def symlink_req(target: Any, link_path: Any) -> "_pb.Request":
    return R(symlink=_pb.SymlinkRequest(target=fspath(target, "target", absolute=False),
                                        link=fspath(link_path, "link_path")))


def link_req(target: Any, link_path: Any) -> "_pb.Request":
    return R(link=_pb.LinkRequest(target=fspath(target, "target"), link=fspath(link_path, "link_path")))


def readlink_req(path: Any) -> "_pb.Request":
    return R(readlink=_pb.ReadlinkRequest(path=fspath(path)))


def realpath_req(path: Any) -> "_pb.Request":
    return R(realpath=_pb.RealpathRequest(path=fspath(path)))


def path_result(res: "_pb.Result") -> str:
    return os.fsdecode(expect(res, "path").path)


def truncate_req(path: Any, size: int, allow_special: bool = False) -> "_pb.Request":
    p = fspath(path)
    check_type("size", size, int, "an int")
    check_bool("allow_special", allow_special)
    if size < 0:
        raise ValueError("size must not be negative")
    return R(truncate=_pb.TruncateRequest(path=p, size=size, allow_special=allow_special or None))


def touch_req(path: Any, create: bool) -> "_pb.Request":
    p = fspath(path)
    check_bool("create", create)
    return R(set_times=_pb.SetTimesRequest(path=p, no_create=None if create else True))


def statfs_req(path: Any) -> "_pb.Request":
    return R(statfs=_pb.StatfsRequest(path=fspath(path)))


def statfs_result(res: "_pb.Result") -> DiskUsage:
    sf = expect(res, "statfs")
    bs = sf.block_size
    return DiskUsage(total=sf.blocks * bs, used=(sf.blocks - sf.blocks_free) * bs, free=sf.blocks_free * bs,
                     available=sf.blocks_available * bs, block_size=bs, files=sf.files, files_free=sf.files_free,
                     fs_type=sf.fs_type, read_only=bool(sf.flags & 1))


def exists_answer(e: BaseException) -> bool:
    """exists(): ENOENT and ENOTDIR from the shim mean False; anything else raises."""
    if isinstance(e, SandboxError) and e.kind == "remote" and e.errno in (2, 20):
        return False
    raise e


# ---- commands ----


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


def exec_req(
    cmd: Command,
    *,
    cwd: Any = None,
    env: Optional[Mapping[str, str]] = None,
    clear_env: bool = False,
    user: Union[str, int, None] = None,
    group: Union[str, int, None] = None,
    timeout: Optional[float] = None,
    kill_grace: Optional[float] = None,
    stdin: bool = False,
    pty: bool = False,
    rows: int = 24,
    cols: int = 80,
    detach: bool = False,
    name: Optional[str] = None,
    output_cap: Optional[int] = None,
) -> "_pb.Request":
    """The ExecRequest for the public arguments (all checked here)."""
    e = _pb.ExecRequest()
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("the command is empty")
        e.shell = bytes_arg(cmd, "cmd")
    elif isinstance(cmd, (list, tuple)):
        if not cmd:
            raise ValueError("the command's argv is empty")
        args = []
        for i, a in enumerate(cmd):
            if not isinstance(a, (str, bytes)):
                raise TypeError(f"cmd[{i}] must be str or bytes, not {type(a).__name__}")
            args.append(bytes_arg(a, f"cmd[{i}]"))
        e.argv = args
    else:
        raise TypeError(f"cmd must be a str (run with /bin/sh -c) or a list of str, not {type(cmd).__name__}")
    if cwd is not None:
        e.cwd = fspath(cwd, "cwd")
    if env is not None:
        if not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of str to str, not {type(env).__name__}")
        items = []
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("env keys and values must be str")
            if not k or "=" in k:
                raise ValueError(f"bad environment variable name {k!r}")
            items.append(bytes_arg(f"{k}={v}", "env"))
        e.env = items
    if check_bool("clear_env", clear_env):
        e.clear_env = True
    for fname, val in (("user", user), ("group", group)):
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, (str, int)):
            raise TypeError(f"{fname} must be a name or a number, not {type(val).__name__}")
        if isinstance(val, int) and val < 0:
            raise ValueError(f"{fname} must not be negative")
        setattr(e, fname, text_arg(str(val), fname, empty=False))
    e.timeout_ms = millis(timeout, "timeout")
    e.kill_grace_ms = millis(kill_grace, "kill_grace")
    if stdin:
        e.stdin = True
    if check_bool("pty", pty):
        for n, v in (("rows", rows), ("cols", cols)):
            check_type(n, v, int, "an int")
            if not 1 <= v <= 0xFFFF:
                raise ValueError(f"{n} must be between 1 and 65535")
        e.pty, e.rows, e.cols = True, rows, cols
    if detach:
        e.detach = True
    if name is not None:
        e.name = text_arg(name, "name", empty=False)
    if output_cap:
        e.output_cap = output_cap
    return R(exec=e)


def max_output_arg(max_output: Optional[int], name: str = "max_output") -> Optional[int]:
    if max_output is None:
        return None
    check_type(name, max_output, int, "an int")
    if max_output <= 0:
        raise ValueError(f"{name} must be positive")
    return max_output


def exit_code(ex: "_pb.ExitStatus") -> int:
    """Shell-style: the exit status, or 128+N when signal N ended it."""
    if ex.exit_code >= 0:
        return ex.exit_code
    return 128 + (ex.signal or 0)


def command_result(ex: "_pb.ExitStatus", out: bytes, err: bytes) -> CommandResult:
    return CommandResult(
        stdout_bytes=out, stderr_bytes=err, exit_code=exit_code(ex), signal=ex.signal or 0,
        timed_out=bool(ex.timed_out), core_dumped=bool(ex.core_dumped), duration=ex.duration_ns / 1e9,
        pid=ex.pid, id=ex.id, stdout_truncated=bool(ex.stdout_truncated), stderr_truncated=bool(ex.stderr_truncated),
    )


def check_output_limit(result: CommandResult, limit: Optional[int], truncate: bool) -> CommandResult:
    """max_output= was given and the command wrote more: an error unless truncate."""
    if limit is None or truncate or not (result.stdout_truncated or result.stderr_truncated):
        return result
    which = " and ".join(s for s, t in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)) if t)
    exc = SandboxOutputLimitError(f"the command wrote more than max_output={limit} bytes to {which}", errno=27,
                                  errno_name="EFBIG", kind="local")
    exc.result = result
    raise exc


def process_info(p: "_pb.ProcessInfo") -> ProcessInfo:
    running = p.state == 0
    argv = " ".join(text(a) for a in p.argv)
    ex = p.exit
    return ProcessInfo(
        id=p.id, pid=p.pid, running=running, started_at=utc(p.started_at), detached=bool(p.detached),
        pty=bool(p.pty), command=argv,
        exit_code=None if running or ex is None else exit_code(ex),
        signal=0 if running or ex is None else (ex.signal or 0),
    )


def eval_argv(code: str, interpreter: Optional[Sequence[str]]) -> List[bytes]:
    c = bytes_arg(code, "code")
    if not c:
        raise ValueError("no code given")
    if interpreter is None:
        interp: Sequence[str] = DEFAULT_INTERPRETER
    else:
        if isinstance(interpreter, str) or not isinstance(interpreter, (list, tuple)):
            raise TypeError("interpreter must be a list of str, e.g. ['python3', '-c']")
        if not interpreter:
            raise ValueError("interpreter is empty")
        interp = interpreter
    return [bytes_arg(x, "interpreter") for x in interp] + [c]


def eval_result(r: CommandResult) -> str:
    """eval(): what the snippet printed, or SandboxEvalError for a non-zero exit."""
    if r.exit_code == 0:
        return r.stdout
    stderr = r.stderr
    line = " ".join(stderr.strip().split("\n"))[:200].strip() if stderr.strip() else ""
    if r.timed_out:
        msg = "timed out" + (": " + line if line else "")
    elif r.signal:
        msg = f"killed by signal {r.signal}" + (": " + line if line else "")
    elif line:
        msg = stderr.strip() or line
    else:
        msg = f"exited with status {r.exit_code}"
    exc = SandboxEvalError(msg, errno=0, errno_name=None, path=None, kind="exit")
    exc.stdout = r.stdout
    exc.stderr = stderr
    exc.exit_code = r.exit_code
    exc.signal = r.signal
    raise exc


# ---- backups ----


def backup_req(dir: Any, excludes: Sequence[str], compression: str, level: Optional[int], skip_unreadable: bool,
               one_file_system: bool, to_path: Optional[bytes]) -> "_pb.Request":
    d = fspath(dir, "dir")
    if not isinstance(compression, str):
        raise TypeError(f"compression must be a str, not {type(compression).__name__}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}")
    if isinstance(excludes, (str, bytes)) or not isinstance(excludes, (list, tuple, set, frozenset)):
        raise TypeError("excludes must be a list of glob patterns")
    ex = [bytes_arg(x, "excludes") for x in excludes]
    for x in ex:
        if not x:
            raise ValueError("an exclude pattern is empty")
    if level is not None:
        check_type("level", level, int, "an int")
        if not 1 <= level <= 22:
            raise ValueError("level must be between 1 and 22")
    check_bool("skip_unreadable", skip_unreadable)
    check_bool("one_file_system", one_file_system)
    return R(backup=_pb.BackupRequest(dir=d, excludes=ex, compression=COMPRESSIONS[compression], level=level,
                                      skip_unreadable=skip_unreadable or None,
                                      one_file_system=one_file_system or None, to_path=to_path))


def backup_record(res: "_pb.Result") -> Dict[str, Any]:
    r = expect(res, "backup")
    out: Dict[str, Any] = {
        "id": r.id, "dir": os.fsdecode(r.dir), "bytes": r.bytes, "sha256": r.sha256, "entries": r.entries,
        "source_bytes": r.source_bytes, "compression": COMPRESSION_NAMES.get(r.compression, r.compression),
        "skipped": [os.fsdecode(x) for x in r.skipped], "changed": [os.fsdecode(x) for x in r.changed],
        "created_at": r.created_at,
    }
    if r.to_path:
        out["to_path"] = os.fsdecode(r.to_path)
    return out


def restore_req(dir: Any, sha256: Optional[str], merge: bool, allow_devices: bool,
                from_path: Optional[bytes], allow_empty: bool = False) -> "_pb.Request":
    d = fspath(dir, "dir")
    if sha256 is not None:
        if not isinstance(sha256, str):
            raise TypeError(f"sha256 must be a hex str, not {type(sha256).__name__}")
        if len(sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha256):
            raise ValueError("sha256 must be 64 hex digits")
    check_bool("merge", merge)
    check_bool("allow_devices", allow_devices)
    check_bool("allow_empty", allow_empty)
    return R(restore=_pb.RestoreRequest(dir=d, mode=1 if merge else None, sha256=sha256.lower() if sha256 else None,
                                        from_path=from_path, allow_devices=allow_devices or None,
                                        allow_empty=allow_empty or None))


def restore_result(res: "_pb.Result") -> Dict[str, Any]:
    r = expect(res, "restore")
    return {"bytes": r.bytes, "entries": r.entries, "sha256": r.sha256}


def progress_arg(progress: Any) -> Any:
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable (bytes, entries), not {type(progress).__name__}")
    return progress


def progress_of(ev: "_pb.Event") -> Optional[Tuple[int, int]]:
    p = ev.progress
    if ev.which_kind() != "progress" or p is None:
        return None
    return p.bytes or 0, p.items or 0


# ---- mounts ----


def _opt_text(name: str, v: Optional[str]) -> Optional[str]:
    if v is None:
        return None
    return text_arg(v, name, empty=False)


def mount_req(bucket: str, mount_path: Any, *, endpoint: str, access_key_id: str, secret_access_key: str,
              read_only: bool, prefix: Optional[str], region: Optional[str], session_token: Optional[str],
              provider: Optional[str], allow_non_empty: bool, options: Sequence[str],
              mount_timeout: Optional[float]) -> "_pb.Request":
    b = text_arg(bucket, "bucket", empty=False)
    p = fspath(mount_path, "mount_path")
    for name, v in (("endpoint", endpoint), ("access_key_id", access_key_id), ("secret_access_key", secret_access_key)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a str, not {type(v).__name__}")
        if not v:
            raise ValueError(f"{name} is empty")
        text_arg(v, name)
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
    check_bool("read_only", read_only)
    check_bool("allow_non_empty", allow_non_empty)
    if isinstance(options, (str, bytes)) or not isinstance(options, (list, tuple)):
        raise TypeError("options must be a list of str")
    opts = []
    for o in options:
        o = text_arg(o, "options", empty=False)
        name, eq, value = o.partition("=")
        if not name:
            raise ValueError(f"bad rclone option {o!r} (want name=value or name)")
        opts.append(_pb.MountOption(name=name, value=value if eq else None))
    return R(mount=_pb.MountRequest(
        bucket=b, endpoint=endpoint, access_key_id=access_key_id, secret_access_key=secret_access_key.encode(),
        session_token=_opt_text("session_token", session_token).encode() if session_token is not None else None,
        path=p, read_only=read_only or None, prefix=_opt_text("prefix", prefix), region=_opt_text("region", region),
        provider=_opt_text("provider", provider), allow_non_empty=allow_non_empty or None,
        timeout_ms=millis(mount_timeout, "mount_timeout"), options=opts,
    ))


def mount_record(r: "_pb.MountRecord") -> Dict[str, Any]:
    return {
        "id": r.id, "bucket": r.bucket, "prefix": r.prefix or "", "path": os.fsdecode(r.path),
        "read_only": bool(r.read_only), "state": MOUNT_STATES.get(r.state, "unknown"), "rclone_pid": r.rclone_pid,
        "created_at": r.created_at, "endpoint": r.endpoint or "", "error": r.error or "",
        "created_dir": bool(r.created_dir),
    }


def unmount_req(id_or_path: Any, flush_timeout: Optional[float], force: bool) -> "_pb.Request":
    u = _pb.UnmountRequest()
    if isinstance(id_or_path, str) and not id_or_path.startswith("/"):
        u.id = text_arg(id_or_path, "id_or_path", empty=False)
    else:
        u.path = fspath(id_or_path, "id_or_path")
    check_bool("force", force)
    if flush_timeout is not None:
        u.flush_timeout_ms = millis(flush_timeout, "flush_timeout")
    u.force = force or None
    return R(unmount=u)


# ---- ids ----


def id_arg(id: Any, name: str = "id") -> str:
    return text_arg(id, name, empty=False)
