"""shim.commands and shim.eval against a real daemon."""

from __future__ import annotations

import io
import os
import threading
import time
import unittest

from shimtest import ShimCase, pid_alive, slurp, wait_until

from sandbox_shim import (
    CommandResult,
    OutputChunk,
    SandboxError,
    SandboxEvalError,
    SandboxFileNotFoundError,
    SandboxOutputLimitError,
    signal_number,
)


class Run(ShimCase):
    def test_shell_string_and_argv(self) -> None:
        r = self.shim.commands.run("echo out; echo err >&2; exit 3")
        self.assertIsInstance(r, CommandResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.signal), ("out\n", "err\n", 3, 0))
        self.assertFalse(r.ok)
        r = self.shim.commands.run(["printf", "%s|", "a b", "$HOME", "*"])
        self.assertEqual(r.stdout, "a b|$HOME|*|")
        self.assertEqual(r.exit_code, 0)
        self.assertTrue(r.ok)
        self.assertGreater(r.pid, 0)

    def test_binary_output_exact(self) -> None:
        r = self.shim.commands.run(["head", "-c", "300000", "/dev/urandom"])
        self.assertEqual(len(r.stdout_bytes), 300000)
        r = self.shim.commands.run(["printf", "\\377\\000\\n"])
        self.assertEqual(r.stdout_bytes, b"\xff\x00\n")
        self.assertEqual(r.stdout, "\ufffd\x00\n")

    def test_signal(self) -> None:
        r = self.shim.commands.run("kill -TERM $$")
        self.assertEqual(r.signal, 15)
        self.assertEqual(r.exit_code, 128 + 15)

    def test_cwd_env_stdin(self) -> None:
        r = self.shim.commands.run("pwd; echo $FOO; cat", cwd=self.d, env={"FOO": "bar baz"}, stdin="piped\n")
        self.assertEqual(r.stdout, f"{os.path.realpath(self.d)}\nbar baz\npiped\n")
        r = self.shim.commands.run(["cat"], stdin=bytes(range(256)))
        self.assertEqual(r.stdout_bytes, bytes(range(256)))
        r = self.shim.commands.run(["cat"], stdin=io.BytesIO(b"from a file"))
        self.assertEqual(r.stdout, "from a file")
        r = self.shim.commands.run(["env"], env={"ONLY": "1"}, clear_env=True)
        self.assertIn("ONLY=1\n", r.stdout)
        self.assertNotIn("FOO=", r.stdout)
        self.assertEqual(self.shim.commands.run("echo $FOO", env={"FOO": "x"}).stdout, "x\n")
        r = self.shim.commands.run("cat")  # no stdin: /dev/null, not a hang
        self.assertEqual(r.stdout, "")

    def test_user(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("needs root to switch users")
        r = self.shim.commands.run(["id", "-u"], user="nobody")
        self.assertEqual(r.stdout.strip(), "65534")
        r = self.shim.commands.run(["id", "-u"], user=65534)
        self.assertEqual(r.stdout.strip(), "65534")
        with self.assertRaises(SandboxError) as cm:
            self.shim.commands.run(["true"], user="no-such-user-xyz")
        self.assertEqual(cm.exception.errno_name, "EINVAL")

    def test_timeout_kills_group(self) -> None:
        pidfile = self.p("child.pid")
        t0 = time.monotonic()
        r = self.shim.commands.run(f"sleep 30 & echo $! > {pidfile}; wait", timeout=0.5, kill_grace=0.5)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertTrue(r.timed_out)
        self.assertNotEqual(r.exit_code, 0)
        child = int(slurp(pidfile))
        self.assertTrue(wait_until(lambda: not pid_alive(child)), "the background sleep survived")

    def test_output_is_never_cut_silently(self) -> None:
        # no cap unless asked: 40 MiB of stdout (more than the old 16 MiB default) arrives whole
        r = self.shim.commands.run("head -c 41943040 /dev/zero; echo tail >&2")
        self.assertEqual(len(r.stdout_bytes), 40 << 20)
        self.assertEqual(r.stdout_bytes.count(0), 40 << 20)
        self.assertEqual(r.stderr, "tail\n")
        self.assertFalse(r.stdout_truncated)

    def test_max_output(self) -> None:
        # over the limit: an error carrying the first max_output bytes
        with self.assertRaises(SandboxOutputLimitError) as cm:
            self.shim.commands.run(["head", "-c", "100000", "/dev/zero"], max_output=1000)
        e = cm.exception
        self.assertEqual(e.errno_name, "EFBIG")
        self.assertIn("max_output=1000", str(e))
        self.assertEqual(len(e.result.stdout_bytes), 1000)
        self.assertTrue(e.result.stdout_truncated)
        self.assertFalse(e.result.stderr_truncated)
        # truncate=True: the cut is a flag on the result instead
        r = self.shim.commands.run(["head", "-c", "100000", "/dev/zero"], max_output=1000, truncate=True)
        self.assertEqual(len(r.stdout_bytes), 1000)
        self.assertTrue(r.stdout_truncated)
        self.assertEqual(r.exit_code, 0)
        # exactly the limit is not over it
        r = self.shim.commands.run(["head", "-c", "1000", "/dev/zero"], max_output=1000)
        self.assertEqual((len(r.stdout_bytes), r.stdout_truncated), (1000, False))

    def test_not_found(self) -> None:
        with self.assertRaises(SandboxFileNotFoundError) as cm:
            self.shim.commands.run(["/no/such/program"])
        self.assertEqual(cm.exception.errno, 2)
        with self.assertRaises(FileNotFoundError):
            self.shim.commands.run(["true"], cwd=self.p("missing"))

    def test_validation(self) -> None:
        c = self.shim.commands
        with self.assertRaises(ValueError):
            c.run("")
        with self.assertRaises(ValueError):
            c.run([])
        with self.assertRaises(TypeError):
            c.run(["echo", 1])  # type: ignore[list-item]
        with self.assertRaises(TypeError):
            c.run(42)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            c.run("true", env={"A": 1})  # type: ignore[dict-item]
        with self.assertRaises(ValueError):
            c.run("true", env={"A=B": "1"})
        with self.assertRaises(ValueError):
            c.run("true", timeout=0)
        with self.assertRaises(TypeError):
            c.run("true", stdin=3.5)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            c.run("true", max_output=0)
        with self.assertRaises(TypeError):
            c.run("true", max_output="1k")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            c.run("true", truncate=1)  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            c.run("true", cwd="relative")
        with self.assertRaises(ValueError):
            signal_number("NOPE")
        with self.assertRaises(ValueError):
            signal_number(0)
        with self.assertRaises(TypeError):
            signal_number(1.5)  # type: ignore[arg-type]
        self.assertEqual(signal_number("sigterm"), 15)
        self.assertEqual(signal_number("KILL"), 9)


class Start(ShimCase):
    def test_stream_channels(self) -> None:
        with self.shim.commands.start("echo one; sleep 0.1; echo two >&2; printf three") as p:
            self.assertGreater(p.pid, 0)
            self.assertTrue(p.id)
            chunks = list(p.stream())
            r = p.wait()
        self.assertTrue(all(isinstance(c, OutputChunk) for c in chunks))
        out = b"".join(c.data for c in chunks if c.stream == "stdout")
        err = b"".join(c.data for c in chunks if c.stream == "stderr")
        self.assertEqual((out, err), (b"one\nthree", b"two\n"))
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, "")  # all of it was streamed already

    def test_output_arrives_while_running(self) -> None:
        with self.shim.commands.start("echo first; sleep 30") as p:
            t0 = time.monotonic()
            c = p.read()
            self.assertEqual(c, OutputChunk("stdout", b"first\n"))
            self.assertLess(time.monotonic() - t0, 5)
            p.signal("TERM")
            r = p.wait()
        self.assertEqual(r.signal, 15)

    def test_stdin(self) -> None:
        with self.shim.commands.start(["cat"], stdin=True) as p:
            p.write_stdin("hello ")
            p.write_stdin(b"\x00world")
            p.close_stdin()
            r = p.wait()
        self.assertEqual(r.stdout_bytes, b"hello \x00world")
        big = os.urandom(4 * 1024 * 1024)
        with self.shim.commands.start(["sha256sum"], stdin=True) as p:
            p.write_stdin(big)
            p.close_stdin()
            r = p.wait()
        import hashlib

        self.assertEqual(r.stdout.split()[0], hashlib.sha256(big).hexdigest())
        with self.shim.commands.start(["true"]) as p:
            with self.assertRaises(SandboxError) as cm:
                p.write_stdin("x")
            self.assertEqual(cm.exception.errno_name, "EBADF")

    def test_wait_collects_and_kill(self) -> None:
        p = self.shim.commands.start("for i in 1 2 3; do echo $i; done; exit 7")
        r = p.wait()
        self.assertEqual((r.stdout, r.exit_code), ("1\n2\n3\n", 7))
        self.assertIs(p.wait(), r)
        p.close()
        p = self.shim.commands.start(["sleep", "30"])
        pid = p.pid
        p.kill()
        self.assertEqual(p.wait().signal, 9)
        p.close()
        self.assertFalse(pid_alive(pid))

    def test_close_kills(self) -> None:
        p = self.shim.commands.start(["sleep", "30"])
        pid = p.pid
        self.assertTrue(pid_alive(pid))
        p.close()
        self.assertTrue(wait_until(lambda: not pid_alive(pid)))
        with self.assertRaises(ValueError):
            p.read()

    def test_pty(self) -> None:
        with self.shim.commands.start(["sh", "-c", "tty; stty size"], pty=True, rows=30, cols=100) as p:
            r = p.wait()
        self.assertIn("/dev/pts/", r.stdout)
        self.assertIn("30 100", r.stdout)


class Dropped(ShimCase):
    """A handle its user drops without close() gives its stream back: nothing waits
    for a stream slot behind handles nobody holds (the shim allows 4 here)."""

    daemon_args = ["--max-streams", "4"]

    def test_dropped_processes_are_killed(self) -> None:
        pids = []
        stuck = threading.Event()  # a start waiting for a stream slot fails, not hangs
        timer = threading.Timer(20, stuck.set)
        timer.start()
        try:
            for _ in range(12):
                # the shim allows 4 streams: without the drop the 5th start would wait
                p = self.shim.commands.start(["sleep", "300"], abort=stuck)
                pids.append(p.pid)
                del p
        finally:
            timer.cancel()
        self.assertTrue(wait_until(lambda: not any(pid_alive(x) for x in pids), 10),
                        "commands of dropped handles still run: %r" % [x for x in pids if pid_alive(x)])
        self.assertEqual(self.shim.commands.run("echo fine", timeout=10).stdout, "fine\n")

    def test_dropped_streams_are_cancelled(self) -> None:
        path = self.p("big")
        with open(path, "wb") as f:
            f.write(os.urandom(8 << 20))
        for _ in range(12):
            s = self.shim.files.open_read(path, timeout=10)
            self.assertTrue(next(iter(s)))  # one chunk, then dropped
            del s
        self.assertEqual(self.shim.files.read_file(path, timeout=10)[:4], open(path, "rb").read(4))
        self.assertTrue(wait_until(lambda: self.shim.info().streams <= 1, 10))


class Background(ShimCase):
    def test_spawn_list_attach_wait_remove(self) -> None:
        c = self.shim.commands
        info = c.spawn("echo hi; sleep 0.3; echo bye", name="job-1")
        self.assertEqual(info.id, "job-1")
        self.assertTrue(info.running)
        self.assertIn("job-1", [p.id for p in c.list()])
        with c.attach("job-1") as a:
            out = b"".join(ch.data for ch in a.stream())
        self.assertEqual(out, b"hi\nbye\n")
        r = c.wait("job-1")
        self.assertEqual(r.exit_code, 0)
        done = [p for p in c.list() if p.id == "job-1"][0]
        self.assertFalse(done.running)
        self.assertEqual(done.exit_code, 0)
        c.remove("job-1")
        self.assertNotIn("job-1", [p.id for p in c.list()])
        with self.assertRaises(SandboxError) as cm:  # the shim: ENOENT, no such process id
            c.kill("job-1")
        self.assertEqual(cm.exception.errno_name, "ENOENT")

    def test_outlives_connection(self) -> None:
        import sandbox_shim

        with sandbox_shim.Shim.connect(self.daemon.target) as other:
            info = other.commands.spawn(["sleep", "30"])
        self.assertTrue(pid_alive(info.pid))
        self.shim.commands.kill(info.id, "TERM")
        self.assertEqual(self.shim.commands.wait(info.id).signal, 15)
        self.shim.commands.remove(info.id)


class Eval(ShimCase):
    def test_eval(self) -> None:
        self.assertEqual(self.shim.eval("print(2 + 2)"), "4\n")
        self.assertEqual(self.shim.eval("echo $((6 * 7))", interpreter=["sh", "-c"]), "42\n")

    def test_eval_failure(self) -> None:
        with self.assertRaises(SandboxEvalError) as cm:
            self.shim.eval("print('partial'); import sys; sys.stderr.write('bad thing\\n'); sys.exit(4)")
        e = cm.exception
        self.assertIsInstance(e, RuntimeError)
        self.assertIsInstance(e, SandboxError)
        self.assertEqual(e.exit_code, 4)
        self.assertEqual(e.stderr, "bad thing\n")
        self.assertEqual(e.stdout, "partial\n")
        self.assertIn("bad thing", str(e))
        with self.assertRaises(SandboxEvalError) as cm:
            self.shim.eval("raise ValueError('nope')")
        self.assertIn("ValueError: nope", cm.exception.stderr)
        self.assertIn("Traceback", cm.exception.stderr)
        with self.assertRaises(TypeError):
            self.shim.eval(b"print(1)" if False else 5)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.shim.eval("1", interpreter="python3 -c")  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
