#!/usr/bin/env python3
"""Seed 004 (sandkiln): the create-run-write-read loop, the full file-operation set with
real metadata, a bucket mount and port tunnels -- against sandbox-shim in a microVM or
container (any target: unix:, vsock:, fc:UDS:PORT, exec:...).

    SBX_TARGET=fc:/run/vm1/vsock.sock:1024 python3 vm_loop.py [WORKDIR]

WORKDIR (inside the sandbox) defaults to /tmp/sandkiln-demo. The mount step needs an
S3-compatible server: give S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY (and S3_BUCKET,
default "build-cache") in the environment, or it is skipped with a message.

The snapshot step runs SNAPSHOT_CMD, the host's command that snapshots the microVM
(e.g. a Firecracker API call pausing it, creating the snapshot and resuming it, or
restoring a fork), between snapshot_prepare and resumed; SNAPSHOT_FREEZE lists mount
points to freeze meanwhile (colon-separated), SNAPSHOT_FORK=1 says the VM is a fork.
Without SNAPSHOT_CMD it is skipped with a message.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import urllib.request

from sandbox_shim import SandboxError, Shim

ANALYZE = """\
import csv, sys
rows = list(csv.DictReader(open(sys.argv[sys.argv.index("--input") + 1])))
print(f"{len(rows)} rows, total {sum(int(r['n']) for r in rows)}")
"""

FETCH = """\
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
"""


def run_loop(sandbox: Shim, work: str) -> None:
    files = sandbox.files
    files.mkdir(f"{work}/src", parents=True, exist_ok=True)
    files.write_file(f"{work}/src/analyze.py", ANALYZE)
    files.write_file(f"{work}/data.csv", "name,n\na,1\nb,2\nc,39\n")

    result = sandbox.commands.run(["python3", "src/analyze.py", "--input", "data.csv"], cwd=work)
    if result.exit_code != 0:
        raise RuntimeError(f"analyze.py failed: {result.stderr}")
    print(result.stdout, end="")  # 3 rows, total 42

    files.write_file(f"{work}/report.json", '{"ok": true}')
    report = files.read_file(f"{work}/report.json")
    print(f"report: {report.decode()}")


def file_ops(sandbox: Shim, work: str) -> None:
    f = sandbox.files
    f.chmod(f"{work}/report.json", 0o640)
    if os.geteuid() == 0 and sandbox.server["uid"] == 0:
        f.chown(f"{work}/report.json", 0, 0)
    f.mkdir(f"{work}/out/nested", parents=True)
    f.copy(f"{work}/report.json", f"{work}/out/copy.json")
    f.rename(f"{work}/out/copy.json", f"{work}/out/report-v2.json")
    f.symlink("out/report-v2.json", f"{work}/latest")
    print(f"latest -> {f.readlink(f'{work}/latest')}")
    f.truncate(f"{work}/out/report-v2.json", 5)
    print(f"truncated: {f.read_file(f'{work}/latest')!r}")
    for e in f.read_directory(work):
        print(f"  {e.name:<12} dir={e.is_dir!s:<5} symlink={e.is_symlink!s:<5} size={e.size:<4} "
              f"mode={e.mode:o} mtime={e.mtime:%Y-%m-%dT%H:%M:%SZ}")


def mount_step(sandbox: Shim, work: str) -> None:
    endpoint = os.environ.get("S3_ENDPOINT")
    key, secret = os.environ.get("S3_ACCESS_KEY"), os.environ.get("S3_SECRET_KEY")
    if not (endpoint and key and secret):
        print("mount: skipped (set S3_ENDPOINT, S3_ACCESS_KEY and S3_SECRET_KEY to mount a bucket)")
        return
    bucket = os.environ.get("S3_BUCKET", "build-cache")
    mount = sandbox.mounts.mount(bucket, f"{work}/cache", endpoint=endpoint, access_key_id=key,
                                 secret_access_key=secret)
    print(f"mount: {bucket} at {mount['path']} is {mount['state']}")
    # ordinary file calls against the mount path read and write through to the bucket
    sandbox.files.write_file(f"{work}/cache/report.json", sandbox.files.read_file(f"{work}/report.json"))
    print(f"mount: cache holds {[e.name for e in sandbox.files.read_directory(f'{work}/cache')]}")
    sandbox.mounts.unmount(mount["id"])
    print("mount: unmounted")


def tunnel_step(sandbox: Shim, work: str) -> None:
    # a service on this machine, reached from inside through a tunnel
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"hello from the host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        tunnel = sandbox.tunnel(0, local_port=host.server_address[1])
        # code inside connecting to 127.0.0.1:<tunnel.port> reaches this machine's server
        r = sandbox.commands.run(["python3", "-c", FETCH, f"http://127.0.0.1:{tunnel.port}/"])
        print(f"tunnel {tunnel.tunnel_id}: inside got {r.stdout.strip()!r}")
        tunnel.close()
    finally:
        host.shutdown()

    # a dev server inside, previewed from here through a forward tunnel
    with sandbox.commands.start(["python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                 "--directory", work]) as dev:
        first = dev.read()  # "Serving HTTP on 127.0.0.1 port N ..."
        port = int(first.text.split(" port ")[1].split()[0]) if first else 0
        with sandbox.forward(port) as preview:
            url = f"http://127.0.0.1:{preview.port}/report.json"
            print(f"preview {url}: {urllib.request.urlopen(url, timeout=10).read().decode()}")
        dev.kill()


def steps(result) -> str:
    return ", ".join(f"{s.name} {s.error_name or 'ok'}" for s in result.steps)


def snapshot_step(sandbox: Shim) -> None:
    cmd = os.environ.get("SNAPSHOT_CMD")
    if not cmd:
        print("snapshot: skipped (set SNAPSHOT_CMD to the host's command that snapshots the VM)")
        return
    freeze = [p for p in os.environ.get("SNAPSHOT_FREEZE", "").split(":") if p]
    # sync, flush the mounts, freeze, stop the background processes; thawed anyway
    # after two minutes should the host never come back
    prep = sandbox.snapshot_prepare(freeze=freeze, stop_background=True, thaw_after=120)
    print(f"snapshot: prepared ({steps(prep)}), generation {prep.generation}")
    subprocess.run(cmd, shell=True, check=True)
    # a snapshot resets every vsock connection: a new one for the host's first request
    with Shim.connect(wait=10) as resumed:
        r = resumed.resumed(fork=os.environ.get("SNAPSHOT_FORK") == "1")
        print(f"snapshot: resumed ({steps(r)}), generation {r.generation}")


def main() -> int:
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sandkiln-demo"
    try:
        with Shim.connect(wait=10) as sandbox:  # $SBX_TARGET; waits while the VM boots
            run_loop(sandbox, work)
            file_ops(sandbox, work)
            mount_step(sandbox, work)
            tunnel_step(sandbox, work)
            snapshot_step(sandbox)
    except SandboxError as e:
        print(f"failed: {e} ({type(e).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
