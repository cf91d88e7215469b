#!/usr/bin/env python3
"""Seed 003 (sandstorm): run a command and a code snippet, print their outputs, then
terminate what was started.

    SBX_TARGET=unix:/run/sandbox-shim.sock python3 commands_and_eval.py

As in the seed, a command that exits non-zero is not an error (read exit_code), and a
snippet that fails raises with its stderr.
"""

from __future__ import annotations

import sys

from sandbox_shim import SandboxEvalError, Shim


def main() -> int:
    with Shim.connect() as sandbox:  # $SBX_TARGET, $SBX_TOKEN; closed at the end
        print(f"ping: {sandbox.ping() * 1000:.2f} ms")

        result = sandbox.commands.run("python3 -c 'print(2 + 2)'")
        print(result.stdout, end="")  # 4
        print(result.exit_code)  # 0

        result = sandbox.commands.run(["sh", "-c", "echo oops >&2; exit 3"])
        print(f"exit_code={result.exit_code} stderr={result.stderr.strip()!r}")  # not an exception

        print(sandbox.eval("print(2 + 2)"), end="")  # '4\n'
        try:
            sandbox.eval("raise RuntimeError('snippet failed')")
        except SandboxEvalError as e:  # also a RuntimeError, as in the seed
            print(f"eval raised: {e.stderr.strip().splitlines()[-1]}")

        # a background process, streamed, then terminated
        server = sandbox.commands.start(["sh", "-c", "echo serving; exec sleep 600"])
        first = server.read()
        print(f"{server.id} (pid {server.pid}) says: {first.text.strip() if first else ''}")
        server.signal("TERM")
        ended = server.wait()
        print(f"terminated: signal {ended.signal}, exit_code {ended.exit_code}")
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
