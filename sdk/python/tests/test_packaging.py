"""Packaging: `pip install --no-build-isolation` offline, with each Python here, gives a
package that works at its first call with nothing else installed (pure Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from shimtest import HERE, Daemon

PKG = os.path.dirname(HERE)
CHECK = (
    "import sys, sandbox_shim\n"
    "with sandbox_shim.Shim.connect(sys.argv[1]) as s:\n"
    "    print(sandbox_shim.__file__)\n"
    "    print(sorted(m for m in sys.modules if m in ('ctypes', '_ctypes')))\n"
    "    print(s.eval('print(6 * 7)'), end='')\n"
)


def interpreters() -> list:
    seen, out = set(), []
    for p in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if p and os.path.exists(p):
            real = os.path.realpath(p)
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SBX_LIBRARY", "SBX_TARGET")}
    env.update(extra)
    return env


class Packaging(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon()
        cls.tmp = tempfile.mkdtemp(prefix="sbxpy-pkg-")
        # build from a copy: pip builds in-tree and must not leave files in the repository
        cls.src = os.path.join(cls.tmp, "src")
        shutil.copytree(PKG, cls.src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def pip_install(self, python: str, target: str) -> None:
        r = subprocess.run(
            [python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
             "--disable-pip-version-check", "--target", target, self.src],
            capture_output=True, text=True, timeout=300, env=clean_env(PIP_NO_INPUT="1"),
        )
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_pip_install_each_python(self) -> None:
        for py in interpreters():
            with self.subTest(python=py):
                r = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True)
                if r.returncode != 0:
                    self.skipTest(f"{py} has no pip")
                target = tempfile.mkdtemp(dir=self.tmp)
                self.pip_install(py, target)
                self.assertTrue(os.path.exists(os.path.join(target, "sandbox_shim", "py.typed")))
                self.assertTrue(any(n.endswith(".dist-info") for n in os.listdir(target)))
                r = subprocess.run(
                    [py, "-c", CHECK, self.daemon.target], capture_output=True, text=True, timeout=120,
                    env=clean_env(PYTHONPATH=target), cwd=self.tmp,
                )
                self.assertEqual(r.returncode, 0, r.stderr)
                lines = r.stdout.splitlines()
                self.assertTrue(lines[0].startswith(target), lines)
                self.assertEqual(lines[1], "[]")  # no ctypes: nothing native is loaded
                self.assertEqual(lines[2], "42")
                files = sorted(os.listdir(os.path.join(target, "sandbox_shim")))
                self.assertIn("_pb.py", files)
                self.assertEqual([f for f in files if f.endswith((".so", ".dll", ".dylib"))], [])


if __name__ == "__main__":
    unittest.main()
