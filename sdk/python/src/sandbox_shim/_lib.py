"""_lib: loads libsbx with ctypes and declares the parts of sbx.h the package uses.

The structures below mirror sdk/include/sbx.h field for field; tests/test_layout.py
checks their sizes and offsets against the C compiler's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_long,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, List, Optional

__all__ = ["lib", "library_path", "LibraryNotFoundError"]


class LibraryNotFoundError(ImportError):
    """libsbx could not be found or loaded (set SBX_LIBRARY to its path)."""


# ---- structures ----


class SbxError(Structure):
    _fields_ = [
        ("kind", c_int),
        ("code", c_int),
        ("message", c_char * 256),
        ("path", c_char * 1024),
    ]


class SbxCallOpts(Structure):
    _fields_ = [("timeout_ms", c_int), ("cancel", c_void_p)]


TRACE_FN = CFUNCTYPE(None, c_void_p, c_char_p)


class SbxConnectOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("token", c_char_p),
        ("client_name", c_char_p),
        ("connect_timeout_ms", c_int),
        ("wait_ms", c_int),
        ("default_timeout_ms", c_int),
        ("trace", TRACE_FN),
        ("trace_ud", c_void_p),
    ]


class SbxServerInfo(Structure):
    _fields_ = [
        ("protocol_version", c_uint),
        ("shim_version", c_char_p),
        ("features", c_char_p),
        ("max_frame", c_uint),
        ("pid", c_uint),
        ("pid1", c_int),
        ("uid", c_uint),
        ("hostname", c_char_p),
        ("boot_id", c_char_p),
    ]


class SbxInfo(Structure):
    _fields_ = [
        ("shim_version", c_char * 32),
        ("protocol_version", c_uint),
        ("features", c_char * 256),
        ("uptime_ms", c_uint64),
        ("pid", c_uint),
        ("pid1", c_int),
        ("uid", c_uint),
        ("gid", c_uint),
        ("hostname", c_char * 256),
        ("boot_id", c_char * 40),
        ("connections", c_uint),
        ("streams", c_uint),
        ("processes", c_uint),
        ("mounts", c_uint),
        ("rss_bytes", c_uint64),
        ("load", c_double * 3),
        ("max_connections", c_uint),
        ("max_streams", c_uint),
        ("workers", c_uint),
    ]


class SbxTimespec(Structure):
    _fields_ = [("sec", c_int64), ("nsec", c_uint32)]


class SbxStat(Structure):
    _fields_ = [
        ("type", c_int),
        ("size", c_uint64),
        ("mode", c_uint32),
        ("uid", c_uint32),
        ("gid", c_uint32),
        ("nlink", c_uint64),
        ("inode", c_uint64),
        ("device", c_uint64),
        ("rdev", c_uint64),
        ("blocks", c_uint64),
        ("atime", SbxTimespec),
        ("mtime", SbxTimespec),
        ("ctime", SbxTimespec),
        ("link_target_len", c_size_t),
        ("link_target", c_char * 4097),
    ]


class SbxDirent(Structure):
    _fields_ = [("name", c_void_p), ("name_len", c_size_t), ("stat", POINTER(SbxStat))]


class SbxStatfs(Structure):
    _fields_ = [
        ("block_size", c_uint64),
        ("blocks", c_uint64),
        ("blocks_free", c_uint64),
        ("blocks_available", c_uint64),
        ("files", c_uint64),
        ("files_free", c_uint64),
        ("fs_type", c_uint64),
        ("flags", c_uint64),
        ("name_max", c_uint64),
    ]


class SbxWatchEvent(Structure):
    _fields_ = [
        ("type", c_int),
        ("path", c_void_p),
        ("path_len", c_size_t),
        ("is_dir", c_int),
        ("cookie", c_uint32),
    ]


class SbxRlimit(Structure):
    _fields_ = [("name", c_char_p), ("soft", c_uint64), ("hard", c_uint64)]


class SbxExecOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("argv", POINTER(c_char_p)),
        ("shell", c_char_p),
        ("env", POINTER(c_char_p)),
        ("clear_env", c_int),
        ("cwd", c_char_p),
        ("user", c_char_p),
        ("group", c_char_p),
        ("timeout_ms", c_int),
        ("kill_grace_ms", c_int),
        ("pty", c_int),
        ("rows", c_uint),
        ("cols", c_uint),
        ("no_new_privs", c_int),
        ("drop_caps", c_int),
        ("keep_caps", POINTER(c_char_p)),
        ("seccomp", c_char_p),
        ("rlimits", POINTER(SbxRlimit)),
        ("n_rlimits", c_size_t),
        ("nice", c_int),
        ("oom_score_adj", c_int),
        ("name", c_char_p),
        ("ring_bytes", c_uint64),
    ]


class SbxExit(Structure):
    _fields_ = [
        ("id", c_char * 64),
        ("pid", c_uint),
        ("exit_code", c_int),
        ("signal", c_int),
        ("core_dumped", c_int),
        ("duration_ns", c_uint64),
        ("timed_out", c_int),
        ("stdout_truncated", c_int),
        ("stderr_truncated", c_int),
    ]


class SbxOutput(Structure):
    _fields_ = [
        ("out", c_void_p),
        ("err", c_void_p),
        ("out_len", c_size_t),
        ("err_len", c_size_t),
    ]


class SbxProcessInfo(Structure):
    _fields_ = [
        ("id", c_char * 64),
        ("pid", c_uint),
        ("running", c_int),
        ("started_at", SbxTimespec),
        ("detached", c_int),
        ("pty", c_int),
        ("argv", c_char * 512),
        ("exit", SbxExit),
    ]


PROGRESS_FN = CFUNCTYPE(None, c_void_p, c_uint64, c_uint64)


class SbxBackupOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("excludes", POINTER(c_char_p)),
        ("compression", c_int),
        ("level", c_int),
        ("skip_unreadable", c_int),
        ("one_file_system", c_int),
        ("to_path", c_char_p),
        ("progress", PROGRESS_FN),
        ("progress_ud", c_void_p),
    ]


class SbxBackupRecord(Structure):
    _fields_ = [
        ("id", c_char * 40),
        ("dir", c_char * 4096),
        ("bytes", c_uint64),
        ("sha256", c_char * 65),
        ("entries", c_uint64),
        ("source_bytes", c_uint64),
        ("compression", c_int),
        ("created_at", c_char * 40),
        ("skipped", POINTER(c_char_p)),
        ("n_skipped", c_size_t),
        ("changed", POINTER(c_char_p)),
        ("n_changed", c_size_t),
        ("to_path", c_char * 4096),
    ]


class SbxRestoreOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("merge", c_int),
        ("sha256", c_char_p),
        ("from_path", c_char_p),
        ("allow_devices", c_int),
        ("progress", PROGRESS_FN),
        ("progress_ud", c_void_p),
    ]


class SbxRestoreResult(Structure):
    _fields_ = [("bytes", c_uint64), ("entries", c_uint64), ("sha256", c_char * 65)]


# ---- tunnels and mounts (newer parts of libsbx; bound when the library has them) ----


class SbxTunnelEvent(Structure):
    _fields_ = [
        ("type", c_int),
        ("conn", c_uint64),
        ("from_", c_char_p),
        ("to", c_char_p),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("err", POINTER(SbxError)),
    ]


TUNNEL_LOG_FN = CFUNCTYPE(None, c_void_p, c_void_p, POINTER(SbxTunnelEvent))


class SbxTunnelOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("log", TUNNEL_LOG_FN),
        ("log_ud", c_void_p),
        ("connect_timeout_ms", c_int),
        ("backlog", c_int),
    ]


class SbxTunnelInfo(Structure):
    _fields_ = [
        ("id", c_char * 16),
        ("kind", c_int),
        ("host", c_char * 64),
        ("port", c_uint),
        ("remote", c_char * 128),
        ("client", c_char * 96),
        ("active", c_uint),
        ("total", c_uint64),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
    ]


class SbxMountOpts(Structure):
    _fields_ = [
        ("struct_size", c_uint),
        ("endpoint", c_char_p),
        ("access_key_id", c_char_p),
        ("secret_access_key", c_char_p),
        ("session_token", c_char_p),
        ("prefix", c_char_p),
        ("region", c_char_p),
        ("provider", c_char_p),
        ("read_only", c_int),
        ("allow_non_empty", c_int),
        ("timeout_ms", c_int),
        ("options", POINTER(c_char_p)),
    ]


class SbxMountRecord(Structure):
    _fields_ = [
        ("id", c_char * 40),
        ("bucket", c_char * 64),
        ("prefix", c_char * 1040),
        ("path", c_char * 4096),
        ("read_only", c_int),
        ("state", c_int),
        ("rclone_pid", c_uint),
        ("created_at", c_char * 40),
        ("endpoint", c_char * 2056),
        ("error", c_char * 256),
        ("created_dir", c_int),
    ]


class SbxUnmountOpts(Structure):
    _fields_ = [("struct_size", c_uint), ("flush_timeout_ms", c_int), ("force", c_int)]


# test_layout.py checks these too
LAYOUT_EXTRA = {
    "sbx_tunnel_event": SbxTunnelEvent,
    "sbx_tunnel_opts": SbxTunnelOpts,
    "sbx_tunnel_info": SbxTunnelInfo,
    "sbx_mount_opts": SbxMountOpts,
    "sbx_mount_record": SbxMountRecord,
    "sbx_unmount_opts": SbxUnmountOpts,
}

# ---- callbacks ----

SINK_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
SOURCE_FN = CFUNCTYPE(c_long, c_void_p, c_void_p, c_size_t, use_errno=True)
DIRENT_FN = CFUNCTYPE(c_int, c_void_p, POINTER(SbxDirent))
WATCH_FN = CFUNCTYPE(c_int, c_void_p, POINTER(SbxWatchEvent))
PROCESS_FN = CFUNCTYPE(c_int, c_void_p, POINTER(SbxProcessInfo))

# ---- constants (sbx.h) ----

ERR_NONE, ERR_REMOTE, ERR_LOCAL, ERR_CONNECT, ERR_PROTOCOL, ERR_EXIT = range(6)
STAT_FOLLOW = 0x1
TO_END = 2**64 - 1
WRITE_APPEND, WRITE_EXCLUSIVE, WRITE_PARENTS, WRITE_NO_ATOMIC = 0x1, 0x2, 0x4, 0x8
MODE_KEEP = -1
LIST_HIDDEN, LIST_FOLLOW = 0x1, 0x2
MKDIR_PARENTS = 0x1
REMOVE_RECURSIVE = 0x1
RENAME_NOREPLACE = 0x1
COPY_RECURSIVE = 0x1
CHOWN_NOFOLLOW = 0x1
TOUCH_NO_CREATE = 0x1
WATCH_RECURSIVE = 0x1
PROC_STDIN = 0x1
STDOUT, STDERR = 1, 2
ATTACH_STDIN, ATTACH_NO_REPLAY, ATTACH_FOLLOW = 0x1, 0x2, 0x4
COMPRESS_NONE, COMPRESS_GZIP, COMPRESS_ZSTD = 0, 1, 2

P = c_void_p  # opaque handles: client, cancel, proc
E = POINTER(SbxError)
O = POINTER(SbxCallOpts)

# name -> (restype, argtypes); optional ones may be missing from an older library
_PROTOS = {
    "sbx_version": (c_char_p, []),
    "sbx_errno_name": (c_char_p, [c_int]),
    "sbx_errno_from_name": (c_int, [c_char_p]),
    "sbx_strerror": (c_char_p, [c_int]),
    "sbx_error_format": (c_char_p, [E, c_void_p, c_size_t]),
    "sbx_cancel_new": (P, []),
    "sbx_cancel_fire": (None, [P]),
    "sbx_cancel_reset": (None, [P]),
    "sbx_cancel_fired": (c_int, [P]),
    "sbx_cancel_free": (None, [P]),
    "sbx_connect": (c_int, [c_char_p, POINTER(SbxConnectOpts), POINTER(P), E]),
    "sbx_client_close": (None, [P]),
    "sbx_client_server": (POINTER(SbxServerInfo), [P]),
    "sbx_client_has_feature": (c_int, [P, c_char_p]),
    "sbx_ping": (c_int, [P, O, POINTER(c_uint64), E]),
    "sbx_info": (c_int, [P, O, POINTER(SbxInfo), E]),
    "sbx_file_type_name": (c_char_p, [c_int]),
    "sbx_stat": (c_int, [P, O, c_char_p, c_int, POINTER(SbxStat), E]),
    "sbx_exists": (c_int, [P, O, c_char_p, E]),
    "sbx_read_file": (c_int, [P, O, c_char_p, c_uint64, c_uint64, SINK_FN, P, POINTER(c_uint64), E]),
    "sbx_read_file_alloc": (c_int, [P, O, c_char_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t), E]),
    "sbx_write_file": (c_int, [P, O, c_char_p, c_int, c_int, SOURCE_FN, P, POINTER(SbxStat), E]),
    "sbx_write_file_buf": (c_int, [P, O, c_char_p, c_int, c_int, c_void_p, c_size_t, POINTER(SbxStat), E]),
    "sbx_list": (c_int, [P, O, c_char_p, c_uint, c_int, DIRENT_FN, P, POINTER(c_uint64), E]),
    "sbx_mkdir": (c_int, [P, O, c_char_p, c_int, c_int, E]),
    "sbx_remove": (c_int, [P, O, c_char_p, c_int, E]),
    "sbx_rename": (c_int, [P, O, c_char_p, c_char_p, c_int, E]),
    "sbx_copy": (c_int, [P, O, c_char_p, c_char_p, c_int, E]),
    "sbx_chmod": (c_int, [P, O, c_char_p, c_uint, E]),
    "sbx_chown": (c_int, [P, O, c_char_p, c_int64, c_int64, c_int, E]),
    "sbx_symlink": (c_int, [P, O, c_char_p, c_char_p, E]),
    "sbx_link": (c_int, [P, O, c_char_p, c_char_p, E]),
    "sbx_readlink": (c_long, [P, O, c_char_p, c_void_p, c_size_t, E]),
    "sbx_realpath": (c_long, [P, O, c_char_p, c_void_p, c_size_t, E]),
    "sbx_truncate": (c_int, [P, O, c_char_p, c_uint64, E]),
    "sbx_set_times": (c_int, [P, O, c_char_p, POINTER(SbxTimespec), POINTER(SbxTimespec), c_int, E]),
    "sbx_statfs": (c_int, [P, O, c_char_p, POINTER(SbxStatfs), E]),
    "sbx_watch_type_name": (c_char_p, [c_int]),
    "sbx_watch": (c_int, [P, O, c_char_p, c_int, WATCH_FN, P, E]),
    "sbx_exit_status": (c_int, [POINTER(SbxExit)]),
    "sbx_output_free": (None, [POINTER(SbxOutput)]),
    "sbx_run": (
        c_int,
        [P, O, POINTER(SbxExecOpts), c_void_p, c_size_t, c_size_t, POINTER(SbxOutput), POINTER(SbxExit), E],
    ),
    "sbx_exec_start": (c_int, [P, O, POINTER(SbxExecOpts), c_int, POINTER(P), E]),
    "sbx_proc_id": (c_char_p, [P]),
    "sbx_proc_pid": (c_uint, [P]),
    "sbx_proc_write": (c_int, [P, c_void_p, c_size_t, E]),
    "sbx_proc_close_stdin": (c_int, [P, E]),
    "sbx_proc_read": (c_long, [P, POINTER(c_int), c_void_p, c_size_t, E]),
    "sbx_proc_wait": (c_int, [P, POINTER(SbxExit), E]),
    "sbx_proc_signal": (c_int, [P, c_int, E]),
    "sbx_proc_resize": (c_int, [P, c_uint, c_uint, E]),
    "sbx_proc_free": (None, [P]),
    "sbx_spawn": (c_int, [P, O, POINTER(SbxExecOpts), POINTER(SbxProcessInfo), E]),
    "sbx_ps": (c_int, [P, O, PROCESS_FN, P, E]),
    "sbx_attach": (c_int, [P, O, c_char_p, c_int, POINTER(P), E]),
    "sbx_wait": (c_int, [P, O, c_char_p, POINTER(SbxExit), E]),
    "sbx_kill": (c_int, [P, O, c_char_p, c_int, E]),
    "sbx_rmproc": (c_int, [P, O, c_char_p, c_int, E]),
    "sbx_eval": (c_int, [P, O, POINTER(c_char_p), c_char_p, POINTER(SbxOutput), POINTER(SbxExit), E]),
    "sbx_backup_record_free": (None, [POINTER(SbxBackupRecord)]),
    "sbx_backup_record_json": (c_void_p, [POINTER(SbxBackupRecord)]),
    "sbx_backup": (
        c_int,
        [P, O, c_char_p, POINTER(SbxBackupOpts), SINK_FN, P, POINTER(SbxBackupRecord), E],
    ),
    "sbx_backup_to_file": (
        c_int,
        [P, O, c_char_p, POINTER(SbxBackupOpts), c_char_p, POINTER(SbxBackupRecord), E],
    ),
    "sbx_restore": (
        c_int,
        [P, O, c_char_p, POINTER(SbxRestoreOpts), SOURCE_FN, P, POINTER(SbxRestoreResult), E],
    ),
    "sbx_restore_from_file": (
        c_int,
        [P, O, c_char_p, POINTER(SbxRestoreOpts), c_char_p, POINTER(SbxRestoreResult), E],
    ),
}


_OPTIONAL_PROTOS = {
    "sbx_forward_open": (
        c_int,
        [P, c_char_p, c_uint, c_char_p, c_uint, POINTER(SbxTunnelOpts), POINTER(P), E],
    ),
    "sbx_reverse_open": (
        c_int,
        [P, c_char_p, c_uint, c_char_p, c_uint, POINTER(SbxTunnelOpts), POINTER(P), E],
    ),
    "sbx_tunnel_id": (c_char_p, [P]),
    "sbx_tunnel_port": (c_uint, [P]),
    "sbx_tunnel_active": (c_uint, [P]),
    "sbx_tunnel_wait": (c_int, [P, c_int, E]),
    "sbx_tunnel_close": (None, [P]),
    "sbx_tunnels_list": (c_int, [P, O, POINTER(POINTER(SbxTunnelInfo)), POINTER(c_size_t), E]),
    "sbx_tunnel_close_id": (c_int, [P, O, c_char_p, E]),
    "sbx_mount_state_name": (c_char_p, [c_int]),
    "sbx_mount_record_json": (c_void_p, [POINTER(SbxMountRecord)]),
    "sbx_mount": (c_int, [P, O, c_char_p, c_char_p, POINTER(SbxMountOpts), POINTER(SbxMountRecord), E]),
    "sbx_mounts_list": (c_int, [P, O, POINTER(POINTER(SbxMountRecord)), POINTER(c_size_t), E]),
    "sbx_mounts_free": (None, [POINTER(SbxMountRecord)]),
    "sbx_unmount": (c_int, [P, O, c_char_p, POINTER(SbxUnmountOpts), POINTER(SbxMountRecord), E]),
}


def _candidates() -> List[str]:
    """Where `cmake --install` may have put libsbx, most specific first."""
    names = ["libsbx.so.0", "libsbx.so"]
    dirs: List[str] = []
    for prefix in (sys.prefix, "/usr/local", "/usr"):
        for sub in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            d = os.path.join(prefix, sub)
            if d not in dirs:
                dirs.append(d)
    out = [os.path.join(d, n) for d in dirs for n in names]
    return out


class _Lib:
    """The loaded library, resolved on first use so that importing never fails."""

    def __init__(self) -> None:
        self._dll: Optional[ctypes.CDLL] = None
        self._path: Optional[str] = None
        self._lock = threading.Lock()
        self.libc = ctypes.CDLL(None)
        self.libc.free.argtypes = [c_void_p]
        self.libc.free.restype = None

    def _load(self) -> ctypes.CDLL:
        with self._lock:
            if self._dll is not None:
                return self._dll
            tried: List[str] = []
            env = os.environ.get("SBX_LIBRARY")
            if env:
                paths = [env]
            else:
                paths = []
                found = ctypes.util.find_library("sbx")
                if found:
                    paths.append(found)
                paths += [p for p in _candidates() if os.path.exists(p)]
                paths.append("libsbx.so.0")  # the dynamic linker's own search (LD_LIBRARY_PATH)
            dll = None
            for p in paths:
                try:
                    dll = ctypes.CDLL(p)
                    self._path = p
                    break
                except OSError as e:
                    tried.append(f"{p}: {e}")
            if dll is None:
                where = "SBX_LIBRARY=" + env if env else "the installed locations"
                raise LibraryNotFoundError(
                    f"sandbox_shim: cannot load libsbx from {where} "
                    "(build it with CMake and `cmake --install`, or set SBX_LIBRARY to libsbx.so): "
                    + "; ".join(tried[-3:])
                )
            for name, (res, args) in _PROTOS.items():
                f = getattr(dll, name)
                f.restype = res
                f.argtypes = args
            for name, (res, args) in _OPTIONAL_PROTOS.items():
                if hasattr(dll, name):
                    f = getattr(dll, name)
                    f.restype = res
                    f.argtypes = args
            self._dll = dll
            return dll

    @property
    def path(self) -> Optional[str]:
        return self._path

    def has(self, name: str) -> bool:
        return hasattr(self._load(), name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("sbx_"):
            return getattr(self._load(), name)
        raise AttributeError(name)


lib = _Lib()


def library_path() -> str:
    """The path of the libsbx actually loaded (loading it now if needed)."""
    lib._load()
    return lib.path or ""
