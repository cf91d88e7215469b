#!/usr/bin/env python3
"""Seed 000 (crosswind-sandboxes): a workspace snapshot, from an asyncio worker.

Writes a file into the workspace, lists the workspace with real metadata, and backs
it up, returning the entries and the backup record -- what the seed's
``Workspace.snapshot()`` does, against sandbox-shim.

    SBX_TARGET=unix:/run/sandbox-shim.sock python3 workspace_snapshot.py [WORKSPACE] [ARCHIVE]

WORKSPACE defaults to /workspace; ARCHIVE (a local path) to ./workspace.tar.zst.
"""

from __future__ import annotations

import asyncio
import json
import sys

from sandbox_shim import AsyncShim, SandboxError


async def snapshot(workspace: str, archive: str) -> dict:
    async with await AsyncShim.connect() as shim:  # $SBX_TARGET, $SBX_TOKEN
        files = shim.files
        await files.mkdir(workspace, parents=True, exist_ok=True)
        await files.write_file(f"{workspace}/notes.txt", "hello")
        entries = await files.read_directory(workspace)

        abort = asyncio.Event()  # set it from elsewhere to cancel the backup in the shim
        record = await shim.backups.backup(workspace, archive, excludes=["*.tmp"], abort=abort)
        return {
            "entries": [entry.name for entry in entries],
            "sizes": {entry.name: entry.size for entry in entries},
            "record": record,
        }


def main() -> int:
    workspace = sys.argv[1] if len(sys.argv) > 1 else "/workspace"
    archive = sys.argv[2] if len(sys.argv) > 2 else "workspace.tar.zst"
    try:
        result = asyncio.run(snapshot(workspace, archive))
    except SandboxError as e:
        print(f"snapshot failed: {e} ({type(e).__name__}, errno {e.errno_name})", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
