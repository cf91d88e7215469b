"""The ctypes structures of sandbox_shim/_lib.py match sbx.h as the C compiler lays
it out (sizes and field offsets), so a field added or moved in C is caught here."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import unittest

import shimtest  # noqa: F401  (puts src/ on sys.path)

from sandbox_shim import _lib

NAMES = {
    "sbx_error": _lib.SbxError,
    "sbx_call_opts": _lib.SbxCallOpts,
    "sbx_connect_opts": _lib.SbxConnectOpts,
    "sbx_server_info": _lib.SbxServerInfo,
    "sbx_info": _lib.SbxInfo,
    "sbx_timespec": _lib.SbxTimespec,
    "sbx_stat": _lib.SbxStat,
    "sbx_dirent": _lib.SbxDirent,
    "sbx_statfs": _lib.SbxStatfs,
    "sbx_watch_event": _lib.SbxWatchEvent,
    "sbx_rlimit": _lib.SbxRlimit,
    "sbx_exec_opts": _lib.SbxExecOpts,
    "sbx_exit": _lib.SbxExit,
    "sbx_output": _lib.SbxOutput,
    "sbx_process_info": _lib.SbxProcessInfo,
    "sbx_backup_opts": _lib.SbxBackupOpts,
    "sbx_backup_record": _lib.SbxBackupRecord,
    "sbx_restore_opts": _lib.SbxRestoreOpts,
    "sbx_restore_result": _lib.SbxRestoreResult,
}


class Layout(unittest.TestCase):
    def test_structs_match_c(self) -> None:
        exe = os.environ.get("SBX_PY_LAYOUT")
        if not exe:
            self.skipTest("SBX_PY_LAYOUT (the layout program built by CMake) not given")
        c = json.loads(subprocess.run([exe], capture_output=True, text=True, check=True).stdout)
        extra = getattr(_lib, "LAYOUT_EXTRA", {})
        names = dict(NAMES, **extra)
        self.assertEqual(set(c), set(names))
        for name, fields in c.items():
            cls = names[name]
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(cls), fields["__size__"], "size")
                for f, off in fields.items():
                    if f != "__size__":
                        self.assertEqual(getattr(cls, "from_" if f == "from" else f).offset, off, f)


class Api(unittest.TestCase):
    def test_docstrings_everywhere(self) -> None:
        import inspect

        import sandbox_shim
        from sandbox_shim import aio

        classes = [getattr(sandbox_shim, n) for n in sandbox_shim.__all__ if inspect.isclass(getattr(sandbox_shim, n))]
        classes += [aio.AsyncFiles, aio.AsyncCommands, aio.AsyncBackups, sandbox_shim.mounts.AsyncMounts]
        missing = []
        for cls in classes:
            if not cls.__doc__:
                missing.append(cls.__name__)
            for name, member in vars(cls).items():
                if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                if not (member.__doc__ or "").strip():
                    missing.append(f"{cls.__name__}.{name}")
        self.assertEqual(missing, [])

    def test_async_twins_complete(self) -> None:
        import inspect

        import sandbox_shim
        from sandbox_shim import aio, mounts

        pairs = [(sandbox_shim.Files, aio.AsyncFiles), (sandbox_shim.Commands, aio.AsyncCommands),
                 (sandbox_shim.Backups, aio.AsyncBackups), (mounts.Mounts, mounts.AsyncMounts),
                 (sandbox_shim.Process, aio.AsyncProcess), (sandbox_shim.Shim, aio.AsyncShim)]
        for sync_cls, async_cls in pairs:
            names = {n for n, m in vars(sync_cls).items() if not n.startswith("_") and inspect.isfunction(m)}
            twins = {n for n, m in vars(async_cls).items() if not n.startswith("_")}
            self.assertEqual(names - twins, set(), f"{async_cls.__name__} lacks twins")
            for n in names & twins:
                m = getattr(async_cls, n)
                if n in ("open_read", "iter_directory", "watch", "stream", "has_feature", "connect"):
                    continue  # async iterators / plain
                self.assertTrue(inspect.iscoroutinefunction(m), f"{async_cls.__name__}.{n}")

    def test_py_typed(self) -> None:
        import sandbox_shim

        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(sandbox_shim.__file__), "py.typed")))


if __name__ == "__main__":
    unittest.main()
