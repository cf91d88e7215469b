"""The examples in sdk/python/examples/, run end to end against a real daemon."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import unittest

from shimtest import HERE, Daemon, slurp

EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


class Examples(unittest.TestCase):
    def setUp(self) -> None:
        self.daemon = Daemon()
        self.env = dict(os.environ, SBX_TARGET=self.daemon.target,
                        PYTHONPATH=os.path.join(os.path.dirname(HERE), "src"))

    def tearDown(self) -> None:
        self.daemon.stop()

    def run_example(self, name: str, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=self.env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, f"{name}: {r.stdout}\n{r.stderr}")
        return r

    def test_000_workspace_snapshot(self) -> None:
        ws = os.path.join(self.daemon.tmp, "workspace")
        archive = os.path.join(self.daemon.tmp, "ws.tar.zst")
        out = json.loads(self.run_example("workspace_snapshot.py", ws, archive).stdout)
        self.assertEqual(out["entries"], ["notes.txt"])
        self.assertEqual(out["sizes"], {"notes.txt": 5})
        self.assertEqual(slurp(os.path.join(ws, "notes.txt")), b"hello")
        rec = out["record"]
        self.assertEqual(rec["dir"], ws)
        self.assertEqual(rec["compression"], "zstd")
        self.assertEqual(rec["sha256"], hashlib.sha256(slurp(archive)).hexdigest())
        self.assertEqual(rec["bytes"], os.path.getsize(archive))

    def test_003_commands_and_eval(self) -> None:
        lines = self.run_example("commands_and_eval.py").stdout.splitlines()
        self.assertTrue(lines[0].startswith("ping: "), lines)
        self.assertEqual(lines[1:6], ["4", "0", "exit_code=3 stderr='oops'", "4", "eval raised: RuntimeError: snippet failed"])
        self.assertRegex(lines[6], r"^p\d+ \(pid \d+\) says: serving$")
        self.assertEqual(lines[7], "terminated: signal 15, exit_code 143")


    def check_004(self, out: str, work: str) -> None:
        lines = out.splitlines()
        self.assertEqual(lines[:4], ["3 rows, total 42", 'report: {"ok": true}', "latest -> out/report-v2.json",
                                     "truncated: b'{\"ok\"'"])
        listing = {ln.split()[0]: ln for ln in lines if ln.startswith("  ")}
        self.assertEqual(set(listing), {"latest", "src", "report.json", "out", "data.csv"})
        self.assertIn("symlink=True", listing["latest"])
        self.assertIn("dir=True", listing["src"])
        self.assertIn("size=12", listing["report.json"])
        self.assertIn("mode=640", listing["report.json"])
        self.assertRegex(out, r"tunnel t\d+: inside got 'hello from the host'")
        self.assertRegex(out, r"preview http://127.0.0.1:\d+/report.json: \{\"ok\": true\}")
        self.assertEqual(slurp(os.path.join(work, "report.json")), b'{"ok": true}')

    def test_004_vm_loop_without_s3(self) -> None:
        for k in ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY"):
            self.env.pop(k, None)
        work = os.path.join(self.daemon.tmp, "work")
        out = self.run_example("vm_loop.py", work).stdout
        self.check_004(out, work)
        self.assertIn("mount: skipped (set S3_ENDPOINT, S3_ACCESS_KEY and S3_SECRET_KEY to mount a bucket)", out)

    def test_004_vm_loop_with_mount(self) -> None:
        import shutil
        import tempfile

        from test_mounts_tunnels import s3rver

        s3dir = tempfile.mkdtemp(prefix="sbxpy-s3-")
        try:
            pid, endpoint, key, secret = s3rver(s3dir)
            try:
                self.env.update(S3_ENDPOINT=endpoint, S3_ACCESS_KEY=key, S3_SECRET_KEY=secret, S3_BUCKET="pybucket")
                work = os.path.join(self.daemon.tmp, "work")
                out = self.run_example("vm_loop.py", work).stdout
                self.check_004(out, work)
                self.assertIn(f"mount: pybucket at {work}/cache is live", out)
                self.assertIn("mount: cache holds ['report.json']", out)
                self.assertIn("mount: unmounted", out)
                # the object is in the bucket: s3rver keeps it on disk
                found = [os.path.join(dp, f) for dp, _, fs in os.walk(s3dir) for f in fs if "report.json" in dp + f]
                self.assertTrue(found, os.listdir(s3dir))
            finally:
                os.kill(pid, 15)
        finally:
            shutil.rmtree(s3dir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
