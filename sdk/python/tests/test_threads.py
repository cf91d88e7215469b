"""Thread safety: many threads on one Shim at once."""

from __future__ import annotations

import hashlib
import os
import threading
import unittest
from concurrent.futures import ThreadPoolExecutor

from shimtest import ShimCase, wait_until

from sandbox_shim import SandboxFileNotFoundError


class Threads(ShimCase):
    def test_many_threads_one_connection(self) -> None:
        n_threads, rounds = 16, 25
        barrier = threading.Barrier(n_threads)

        def worker(t: int) -> int:
            barrier.wait()
            done = 0
            for i in range(rounds):
                path = self.p(f"t{t}-{i}")
                data = os.urandom(1000 + 37 * i + t)
                self.shim.files.write_file(path, data)
                self.assertEqual(self.shim.files.read_file(path), data)
                self.assertEqual(self.shim.files.stat(path).size, len(data))
                r = self.shim.commands.run(["sha256sum", path])
                self.assertEqual(r.stdout.split()[0], hashlib.sha256(data).hexdigest())
                with self.assertRaises(SandboxFileNotFoundError):
                    self.shim.files.read_file(path + ".missing")
                if i % 5 == 0:
                    self.assertEqual(self.shim.eval(f"print({t} * {i})"), f"{t * i}\n")
                done += 1
            return done

        with ThreadPoolExecutor(n_threads) as pool:
            results = list(pool.map(worker, range(n_threads)))
        self.assertEqual(results, [rounds] * n_threads)
        self.assertEqual(len(os.listdir(self.d)), n_threads * rounds)

    def test_streams_in_parallel(self) -> None:
        data = os.urandom(2 * 1024 * 1024)
        with open(self.p("big"), "wb") as f:
            f.write(data)

        def reader(_: int) -> bytes:
            return b"".join(self.shim.files.open_read(self.p("big")))

        def runner(i: int) -> str:
            with self.shim.commands.start(["sh", "-c", f"for j in 1 2 3; do echo {i}-$j; sleep 0.01; done"]) as p:
                return b"".join(c.data for c in p.stream()).decode()

        with ThreadPoolExecutor(8) as pool:
            reads = list(pool.map(reader, range(8)))
            outs = list(pool.map(runner, range(8)))
        self.assertTrue(all(r == data for r in reads))
        self.assertEqual(outs, [f"{i}-1\n{i}-2\n{i}-3\n" for i in range(8)])

    def test_close_under_load(self) -> None:
        import sandbox_shim
        from sandbox_shim import SandboxConnectionError

        shim = sandbox_shim.Shim.connect(self.daemon.target)
        with open(self.p("f"), "wb") as f:
            f.write(os.urandom(256 * 1024))
        outcomes: list = []
        started = threading.Barrier(13)
        pids: list = []

        def guard(fn):  # type: ignore[no-untyped-def]
            def run() -> None:
                started.wait()
                try:
                    while True:
                        fn()
                except SandboxConnectionError:
                    outcomes.append("closed")
                except BaseException as e:  # anything else is a failure
                    outcomes.append(repr(e))
            return run

        def reader() -> None:
            shim.files.read_file(self.p("f"))

        def sleeper() -> None:
            shim.commands.run(["sleep", "30"])

        def streamer() -> None:
            with shim.commands.start(["sh", "-c", "while :; do echo tick; sleep 0.01; done"]) as p:
                pids.append(p.pid)
                for _ in p.stream():
                    pass

        def watcher() -> None:
            for _ in shim.files.watch(self.d):
                pass

        fns = [reader] * 4 + [sleeper] * 3 + [streamer] * 3 + [watcher] * 2
        threads = [threading.Thread(target=guard(fn)) for fn in fns]
        for t in threads:
            t.start()
        started.wait()
        import time

        time.sleep(0.5)
        t0 = time.monotonic()
        shim.close()
        for t in threads:
            t.join(15)
        self.assertLess(time.monotonic() - t0, 15)
        self.assertEqual(outcomes, ["closed"] * len(fns))
        from shimtest import pid_alive, wait_until

        for pid in pids:  # the streamed commands were killed with their handles
            self.assertTrue(wait_until(lambda: not pid_alive(pid)), pid)
        # the daemon is fine and serves others
        self.assertEqual(self.shim.eval("print(1)"), "1\n")

    def test_namespaces_keep_the_connection(self) -> None:
        import gc

        import sandbox_shim

        # the Shim itself is gone at once; its namespace keeps the connection open
        st = sandbox_shim.Shim.connect(self.daemon.target).files.stat(self.d)
        self.assertTrue(st.is_dir)
        n0 = self.shim.info().connections
        files = sandbox_shim.Shim.connect(self.daemon.target).files
        gc.collect()
        self.assertTrue(files.exists(self.d))
        self.assertTrue(wait_until(lambda: self.shim.info().connections == n0 + 1), self.shim.info())
        # a process handle does too
        proc = sandbox_shim.Shim.connect(self.daemon.target).commands.start(["sh", "-c", "read x; echo got $x"],
                                                                            stdin=True)
        gc.collect()
        proc.write_stdin("it\n")
        self.assertEqual(proc.wait().stdout, "got it\n")
        # and once nothing refers to a connection any more it is closed
        del files, proc
        gc.collect()
        self.assertTrue(wait_until(lambda: self.shim.info().connections == n0), self.shim.info())
        before = threading.active_count()
        for _ in range(5):
            sandbox_shim.Shim.connect(self.daemon.target).ping()
        gc.collect()
        self.assertTrue(wait_until(lambda: threading.active_count() <= before), threading.enumerate())


if __name__ == "__main__":
    unittest.main()
