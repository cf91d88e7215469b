"""shim.tunnel() / shim.forward() with real TCP traffic, and shim.mounts against a real
S3 server (npm s3rver, through tests/lib/s3rver.sh; skipped when it is not there)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import unittest

from shimtest import HERE, Daemon, ShimCase, wait_until

import sandbox_shim
from sandbox_shim import AsyncShim, SandboxError, SandboxPermissionError, TunnelHandle
from sandbox_shim.tunnels import AsyncTunnelHandle

REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
S3RVER_SH = os.path.join(REPO, "tests", "lib", "s3rver.sh")


def echo_server() -> "tuple[socket.socket, int]":
    """A TCP server on this host that answers every line with "echo:" + line."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                buf = b""
                while True:
                    d = c.recv(65536)
                    if not d:
                        break
                    buf += d
                c.sendall(b"echo:" + buf)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)
out = b""
while True:
    d = s.recv(65536)
    if not d: break
    out += d
sys.stdout.write(out.decode())
"""

SERVER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    data = b""
    while True:
        d = c.recv(65536)
        if not d: break
        data += d
    c.sendall(b"inside:" + data[::-1]); c.close()
"""


BIG = 16 << 20  # bytes each way in the bulk tests


@functools.lru_cache(maxsize=None)
def pattern(seed: int, n: int = BIG) -> bytes:
    return random.Random(seed).randbytes(n)


def recv_all(c: socket.socket) -> bytes:
    out = bytearray()
    while True:
        d = c.recv(1 << 20)
        if not d:
            return bytes(out)
        out += d


def threaded_server(handle) -> "tuple[socket.socket, int]":
    """A TCP server on this host running handle(conn) on a thread per connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)

    def one(c: socket.socket) -> None:
        with c:
            try:
                handle(c)
            except OSError:
                pass

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


# inside: one connection, BIG bytes each way at once; prints the sha256 and size of what it got
BULK_SERVER = """
import hashlib, random, socket, sys, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
data = random.Random(int(sys.argv[1])).randbytes(int(sys.argv[2]))
def send():
    c.sendall(data); c.shutdown(socket.SHUT_WR)
th = threading.Thread(target=send); th.start()
h, n = hashlib.sha256(), 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    h.update(d); n += len(d)
th.join(); c.close()
print(h.hexdigest(), n, flush=True)
"""

BULK_CLIENT = """
import hashlib, random, socket, sys, threading
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
data = random.Random(int(sys.argv[2])).randbytes(int(sys.argv[3]))
def send():
    c.sendall(data); c.shutdown(socket.SHUT_WR)
th = threading.Thread(target=send); th.start()
h, n = hashlib.sha256(), 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    h.update(d); n += len(d)
th.join(); c.close()
print(h.hexdigest(), n)
"""

# inside: sends first and half-closes, then reads what comes after its FIN
HALF_SERVER = """
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.sendall(b"first"); c.shutdown(socket.SHUT_WR)
out = b""
while True:
    d = c.recv(65536)
    if not d: break
    out += d
print(out.decode(), flush=True)
"""

# inside: reads until the host's FIN, then answers (its own FIN last)
HALF_CLIENT = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
got = b""
while True:
    d = c.recv(65536)
    if not d: break
    got += d
c.sendall(b"after-eof:" + got); c.shutdown(socket.SHUT_WR)
print(got.decode())
"""

# inside: N connections at once, each a different message; prints how many came back right
MANY_CLIENT = """
import socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
ok = []
def one(i):
    msg = (b"%d:" % i) * (1000 + 37 * i)
    c = socket.create_connection(("127.0.0.1", port), timeout=30)
    c.sendall(msg); c.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        d = c.recv(65536)
        if not d: break
        out += d
    c.close()
    if out == msg[::-1]:
        ok.append(i)
ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ths: t.start()
for t in ths: t.join()
print(len(ok))
"""

MANY_SERVER = """
import socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(128)
print(s.getsockname()[1], flush=True)
def one(c):
    data = b""
    while True:
        d = c.recv(65536)
        if not d: break
        data += d
    c.sendall(data[::-1]); c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=one, args=(c,), daemon=True).start()
"""


class Lines:
    """A process's stdout, line by line (output chunks may split lines anywhere)."""

    def __init__(self, proc) -> None:
        self.proc, self.buf = proc, b""

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.proc.read()
            assert chunk is not None, "the process inside ended early"
            if chunk.stream == "stdout":
                self.buf += chunk.data
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def reverse_echo(c: socket.socket) -> None:
    c.sendall(recv_all(c)[::-1])
    c.shutdown(socket.SHUT_WR)


class Tunnels(ShimCase):
    def test_reverse_tunnel(self) -> None:
        srv, port = echo_server()
        events = []
        try:
            with self.shim.tunnel(0, port, on_event=events.append) as t:
                self.assertIsInstance(t, TunnelHandle)
                self.assertEqual(t.kind, "reverse")
                self.assertGreater(t.port, 0)
                self.assertTrue(t.tunnel_id)
                for i in range(3):
                    r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), f"hello {i}"])
                    self.assertEqual(r.stdout, f"echo:hello {i}", r.stderr)
                self.assertIn(t.tunnel_id, [x.id for x in self.shim.tunnels()])
                self.assertTrue(wait_until(lambda: sum(e.type == "close" for e in events) == 3))
                closes = [e for e in events if e.type == "close"]
                self.assertEqual(closes[0].bytes_in, len("echo:hello 0"))
                self.assertEqual(closes[0].bytes_out, len("hello 0"))
                self.assertEqual(sum(e.type == "open" for e in events), 3)
            self.assertTrue(t.closed)
            self.assertNotIn(t.tunnel_id, [x.id for x in self.shim.tunnels()])
            r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertNotEqual(r.exit_code, 0)  # nothing listens inside any more
        finally:
            srv.close()

    def test_reverse_fixed_port_and_refused(self) -> None:
        # a port on this host where nothing listens: the connection fails, reported as "fail"
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        s.close()
        events = []
        with self.shim.tunnel(0, dead, on_event=events.append) as t:
            r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertEqual(r.stdout, "")
            self.assertTrue(wait_until(lambda: any(e.type == "fail" for e in events)))
            fail = [e for e in events if e.type == "fail"][0]
            self.assertIsNotNone(fail.error)
            self.assertEqual(fail.error.errno_name, "ECONNREFUSED")
            # the same port inside again: taken
            with self.assertRaises(SandboxError) as cm:
                self.shim.tunnel(t.port, dead)
            self.assertEqual(cm.exception.errno_name, "EADDRINUSE")

    def test_forward(self) -> None:
        with self.shim.commands.start(["python3", "-c", SERVER]) as server:
            first = server.read()
            assert first is not None
            guest_port = int(first.data.split()[0])
            with self.shim.forward(guest_port) as t:
                self.assertEqual(t.kind, "forward")
                self.assertGreater(t.port, 0)

                def ask(msg: bytes) -> bytes:
                    with socket.create_connection(("127.0.0.1", t.port), timeout=10) as c:
                        c.sendall(msg)
                        c.shutdown(socket.SHUT_WR)
                        out = b""
                        while True:
                            d = c.recv(65536)
                            if not d:
                                return out
                            out += d

                self.assertEqual(ask(b"abc"), b"inside:cba")
                big = os.urandom(3 * 1024 * 1024)
                self.assertEqual(ask(big), b"inside:" + big[::-1])
                results = []
                ths = [threading.Thread(target=lambda i=i: results.append(ask(str(i).encode() * 3))) for i in range(8)]
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
                self.assertEqual(sorted(results), sorted(b"inside:" + str(i).encode() * 3 for i in range(8)))
                # closed by id from "elsewhere": the handle sees it end
                self.shim.close_tunnel(t.tunnel_id)
                self.assertFalse(t.wait(5))
            server.kill()

    def test_wait_while_closed_elsewhere(self) -> None:
        t = self.shim.forward(9, 0)
        results = []
        th = threading.Thread(target=lambda: results.append(t.wait()))
        th.start()
        time.sleep(0.3)
        self.assertEqual(t.active, 0)
        t.close()  # from another thread than the waiter's
        th.join(5)
        self.assertEqual(results, [False])
        self.assertFalse(t.wait(1))
        t.close()
        self.assertEqual(t.active, 0)

    def test_close_with_shim_and_validation(self) -> None:
        srv, port = echo_server()
        shim = sandbox_shim.Shim.connect(self.daemon.target)
        t = shim.forward(9, 0)
        lp = t.port
        shim.close()  # closes the tunnel too
        self.assertTrue(t.closed)
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", lp), timeout=2).close()
        srv.close()
        with self.assertRaises(ValueError):
            self.shim.tunnel(0, 0)
        with self.assertRaises(ValueError):
            self.shim.tunnel(70000, 80)
        with self.assertRaises(ValueError):
            self.shim.forward(0)
        with self.assertRaises(TypeError):
            self.shim.forward("80")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.shim.tunnel(0, 80, on_event="log")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            self.shim.tunnel(0, 80, local_host="")
        with self.assertRaises(SandboxError) as cm:
            self.shim.close_tunnel("t999999")
        self.assertEqual(cm.exception.errno_name, "ENOENT")

    def guest_port_of(self, server) -> "tuple[int, Lines]":
        out = Lines(server)
        return int(out.line()), out

    def test_forward_bulk_both_ways(self) -> None:
        events = []
        with self.shim.commands.start(["python3", "-c", BULK_SERVER, "1", str(BIG)]) as server:
            port, out = self.guest_port_of(server)
            with self.shim.forward(port, on_event=events.append) as t:
                mine = pattern(2)
                with socket.create_connection(("127.0.0.1", t.port), timeout=60) as c:
                    th = threading.Thread(target=lambda: (c.sendall(mine), c.shutdown(socket.SHUT_WR)))
                    th.start()
                    got = recv_all(c)
                    th.join()
                self.assertEqual(len(got), BIG)
                self.assertTrue(got == pattern(1), "the bytes from inside differ")
                self.assertEqual(out.line().split(), [hashlib.sha256(mine).hexdigest().encode(), str(BIG).encode()])
                self.assertTrue(wait_until(lambda: any(e.type == "close" for e in events), 10))
                close = [e for e in events if e.type == "close"][0]
                self.assertIsNone(close.error)
                self.assertEqual((close.bytes_in, close.bytes_out), (BIG, BIG))
                self.assertEqual(t.active, 0)

    def test_reverse_bulk_both_ways(self) -> None:
        got = {}

        def handle(c: socket.socket) -> None:
            data = pattern(3)
            th = threading.Thread(target=lambda: (c.sendall(data), c.shutdown(socket.SHUT_WR)))
            th.start()
            got["data"] = recv_all(c)
            th.join()

        srv, port = threaded_server(handle)
        events = []
        try:
            with self.shim.tunnel(0, port, on_event=events.append) as t:
                r = self.shim.commands.run(["python3", "-c", BULK_CLIENT, str(t.port), "4", str(BIG)], timeout=120)
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertEqual(r.stdout.split(), [hashlib.sha256(pattern(3)).hexdigest(), str(BIG)])
                self.assertTrue(wait_until(lambda: any(e.type == "close" for e in events), 10))
                self.assertTrue(wait_until(lambda: "data" in got))  # the server thread stores it at EOF
                self.assertTrue(got["data"] == pattern(4), "the bytes from inside differ")
                close = [e for e in events if e.type == "close"][0]
                self.assertIsNone(close.error)
                self.assertEqual((close.bytes_in, close.bytes_out), (BIG, BIG))
        finally:
            srv.close()

    def test_forward_half_close_both_ways(self) -> None:
        with self.shim.commands.start(["python3", "-c", HALF_SERVER]) as server:
            port, out = self.guest_port_of(server)
            with self.shim.forward(port) as t:
                with socket.create_connection(("127.0.0.1", t.port), timeout=10) as c:
                    self.assertEqual(recv_all(c), b"first")  # inside half-closed first
                    c.sendall(b"after-eof")  # our direction still flows
                    c.shutdown(socket.SHUT_WR)
                    self.assertEqual(c.recv(10), b"")
                self.assertEqual(out.line(), b"after-eof")
        # and the other way round: ours first (as ask() in test_forward)
        with self.shim.commands.start(["python3", "-c", SERVER]) as server:
            with self.shim.forward(self.guest_port_of(server)[0]) as t:
                with socket.create_connection(("127.0.0.1", t.port), timeout=10) as c:
                    c.sendall(b"xyz")
                    c.shutdown(socket.SHUT_WR)
                    self.assertEqual(recv_all(c), b"inside:zyx")
            server.kill()

    def test_reverse_half_close_both_ways(self) -> None:
        got = {}

        def host_first(c: socket.socket) -> None:
            c.sendall(b"from-host")
            c.shutdown(socket.SHUT_WR)  # ours first, then what inside sends after it
            got["data"] = recv_all(c)

        srv, port = threaded_server(host_first)
        try:
            with self.shim.tunnel(0, port) as t:
                r = self.shim.commands.run(["python3", "-c", HALF_CLIENT, str(t.port)])
                self.assertEqual(r.stdout.strip(), "from-host", r.stderr)
                self.assertTrue(wait_until(lambda: "data" in got))
                self.assertEqual(got["data"], b"after-eof:from-host")
        finally:
            srv.close()
        # inside first: its FIN reaches the host, the answer goes back after it
        srv, port = echo_server()
        try:
            with self.shim.tunnel(0, port) as t:
                r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "inside-first"])
                self.assertEqual(r.stdout, "echo:inside-first", r.stderr)
        finally:
            srv.close()

    def test_forward_many_at_once(self) -> None:
        n = 50
        events = []
        with self.shim.commands.start(["python3", "-c", MANY_SERVER]) as server:
            with self.shim.forward(self.guest_port_of(server)[0], on_event=events.append) as t:
                results = {}
                all_open = []

                def all_relayed() -> None:
                    # every client is connected and waits here: the tunnel carries all n at
                    # once (waited for: the relay takes them up in its own time)
                    all_open.append(wait_until(lambda: t.active == n, 30))

                barrier = threading.Barrier(n, action=all_relayed)

                def ask(i: int) -> None:
                    msg = (b"%d:" % i) * (1000 + 37 * i)
                    with socket.create_connection(("127.0.0.1", t.port), timeout=30) as c:
                        barrier.wait(60)
                        c.sendall(msg)
                        c.shutdown(socket.SHUT_WR)
                        results[i] = recv_all(c) == msg[::-1]

                ths = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
                for th in ths:
                    th.start()
                for th in ths:
                    th.join(60)
                self.assertEqual(sorted(results), list(range(n)))
                self.assertTrue(all(results.values()))
                self.assertTrue(wait_until(lambda: sum(e.type == "close" for e in events) == n, 10))
                self.assertEqual(sum(e.type == "open" for e in events), n)
                self.assertEqual(len({e.conn for e in events}), n)
                self.assertTrue(all(e.error is None for e in events))
                self.assertEqual(sorted(e.bytes_in for e in events if e.type == "close"),
                                 sorted(len((b"%d:" % i) * (1000 + 37 * i)) for i in range(n)))
                self.assertEqual(all_open, [True])
                self.assertTrue(wait_until(lambda: t.active == 0))
            server.kill()

    def test_reverse_many_at_once(self) -> None:
        n = 50
        srv, port = threaded_server(reverse_echo)
        events = []
        try:
            with self.shim.tunnel(0, port, on_event=events.append) as t:
                r = self.shim.commands.run(["python3", "-c", MANY_CLIENT, str(t.port), str(n)], timeout=60)
                self.assertEqual(r.stdout.strip(), str(n), r.stderr)
                self.assertTrue(wait_until(lambda: sum(e.type == "close" for e in events) == n, 10))
                self.assertTrue(all(e.error is None for e in events))
                self.assertTrue(wait_until(lambda: t.active == 0))
                info = [x for x in self.shim.tunnels() if x.id == t.tunnel_id][0]
                self.assertEqual(info.total, n)
        finally:
            srv.close()

    def test_close_with_connections_open(self) -> None:
        # a connection held open: close() ends it (ECONNABORTED, "tunnel tN closed")
        srv, port = threaded_server(lambda c: recv_all(c))
        events = []
        try:
            t = self.shim.tunnel(0, port, on_event=events.append)
            p = self.shim.commands.start(["python3", "-c",
                                          "import socket,sys,time\n"
                                          "c=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
                                          "c.sendall(b'x'); print('sent', flush=True)\n"
                                          "print(repr(c.recv(10)), flush=True)",
                                          str(t.port)])
            with p:
                self.assertTrue(wait_until(lambda: t.active == 1))
                t.close()
                self.assertTrue(t.closed)
                self.assertEqual(t.active, 0)
                self.assertFalse(t.wait(1))
                closes = [e for e in events if e.type == "close"]
                self.assertEqual(len(closes), 1)  # delivered before close() returned
                self.assertIsNotNone(closes[0].error)
                self.assertEqual(closes[0].error.errno_name, "ECONNABORTED")
                r = p.wait()
                self.assertIn(r.exit_code, (0, 1))
        finally:
            srv.close()

    def test_forward_refused_inside(self) -> None:
        events = []
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        s.close()
        with self.shim.forward(dead, on_event=events.append) as t:
            try:
                with socket.create_connection(("127.0.0.1", t.port), timeout=10) as c:
                    self.assertEqual(c.recv(10), b"")
            except ConnectionResetError:
                pass  # reset (even before connect returned): the connection inside could not be made
            self.assertTrue(wait_until(lambda: any(e.type == "fail" for e in events)))
            fail = [e for e in events if e.type == "fail"][0]
            self.assertEqual(fail.error.errno_name, "ECONNREFUSED")
            self.assertEqual(t.active, 0)

    def test_on_event_errors_do_not_break_the_relay(self) -> None:
        srv, port = echo_server()

        def boom(ev) -> None:
            raise RuntimeError("a broken callback")

        try:
            with self.shim.tunnel(0, port, on_event=boom) as t:
                for i in range(2):
                    r = self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), f"hi {i}"])
                    self.assertEqual(r.stdout, f"echo:hi {i}", r.stderr)
        finally:
            srv.close()


def ask_blocking(port: int, msg: bytes, first: bytes = b"") -> bytes:
    """Connect to port on this host, send msg, half-close, read the answer to EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(msg)
        c.shutdown(socket.SHUT_WR)
        return recv_all(c)


async def async_until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


class AsyncLines:
    def __init__(self, proc) -> None:
        self.proc, self.buf = proc, b""

    async def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = await self.proc.read()
            assert chunk is not None, "the process inside ended early"
            if chunk.stream == "stdout":
                self.buf += chunk.data
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class AsyncTunnels(unittest.IsolatedAsyncioTestCase):
    """The asyncio twin: AsyncShim.tunnel() / forward(), relayed by tasks (no threads
    of the SDK; the servers and clients on this host here are threads or tasks)."""

    @classmethod
    def setUpClass(cls) -> None:
        for seed in (1, 2, 3, 4):
            pattern(seed)  # made here, not on the loop
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    async def asyncSetUp(self) -> None:
        self.shim = await AsyncShim.connect(self.daemon.target)

    async def asyncTearDown(self) -> None:
        await self.shim.close()

    async def test_reverse(self) -> None:
        srv, port = echo_server()
        events = []
        try:
            async with await self.shim.tunnel(0, port, on_event=events.append) as t:
                self.assertIsInstance(t, AsyncTunnelHandle)
                self.assertEqual(t.kind, "reverse")
                self.assertGreater(t.port, 0)
                self.assertEqual(t.id, t.tunnel_id)
                for i in range(3):
                    r = await self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), f"hello {i}"])
                    self.assertEqual(r.stdout, f"echo:hello {i}", r.stderr)
                self.assertIn(t.tunnel_id, [x.id for x in await self.shim.tunnels()])
                self.assertTrue(await async_until(lambda: sum(e.type == "close" for e in events) == 3))
                closes = [e for e in events if e.type == "close"]
                self.assertEqual((closes[0].bytes_in, closes[0].bytes_out), (len("echo:hello 0"), len("hello 0")))
                self.assertEqual(sum(e.type == "open" for e in events), 3)
                self.assertEqual(t.active, 0)
                # relayed by tasks: no thread of the SDK's
                self.assertEqual([th.name for th in threading.enumerate() if th.name.startswith("sandbox_shim")], [])
            self.assertTrue(t.closed)
            self.assertNotIn(t.tunnel_id, [x.id for x in await self.shim.tunnels()])
            r = await self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertNotEqual(r.exit_code, 0)
        finally:
            srv.close()

    async def test_reverse_refused(self) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        s.close()
        events = []
        async with await self.shim.tunnel(0, dead, on_event=events.append) as t:
            r = await self.shim.commands.run(["python3", "-c", CLIENT, str(t.port), "x"])
            self.assertEqual(r.stdout, "")
            self.assertTrue(await async_until(lambda: any(e.type == "fail" for e in events)))
            fail = [e for e in events if e.type == "fail"][0]
            self.assertEqual(fail.error.errno_name, "ECONNREFUSED")
            with self.assertRaises(SandboxError) as cm:
                await self.shim.tunnel(t.port, dead)
            self.assertEqual(cm.exception.errno_name, "EADDRINUSE")

    async def test_forward_and_closed_by_id(self) -> None:
        async with await self.shim.commands.start(["python3", "-c", SERVER]) as server:
            port = int(await AsyncLines(server).line())
            t = await self.shim.forward(port)
            self.assertEqual(t.kind, "forward")
            self.assertGreater(t.port, 0)
            # an asyncio client of our own, and blocking ones on threads
            r, w = await asyncio.open_connection("127.0.0.1", t.port)
            w.write(b"abc")
            w.write_eof()
            self.assertEqual(await r.read(), b"inside:cba")
            w.close()
            big = os.urandom(3 << 20)
            self.assertEqual(await asyncio.to_thread(ask_blocking, t.port, big), b"inside:" + big[::-1])
            got = await asyncio.gather(*(asyncio.to_thread(ask_blocking, t.port, b"%d" % i * 3) for i in range(8)))
            self.assertEqual(got, [b"inside:" + (b"%d" % i * 3)[::-1] for i in range(8)])
            self.assertTrue(await t.wait(0.2))  # still runs
            await self.shim.close_tunnel(t.tunnel_id)
            self.assertFalse(await t.wait(5))
            await t.close()
            self.assertTrue(t.closed)
            await server.kill()

    async def test_forward_bulk_both_ways(self) -> None:
        events = []
        async with await self.shim.commands.start(["python3", "-c", BULK_SERVER, "1", str(BIG)]) as server:
            out = AsyncLines(server)
            port = int(await out.line())
            async with await self.shim.forward(port, on_event=events.append) as t:
                mine = pattern(2)
                r, w = await asyncio.open_connection("127.0.0.1", t.port)

                async def send() -> None:
                    w.write(mine)
                    await w.drain()
                    w.write_eof()

                sender = asyncio.ensure_future(send())
                got = await r.read()
                await sender
                w.close()
                self.assertEqual(len(got), BIG)
                self.assertTrue(got == pattern(1), "the bytes from inside differ")
                self.assertEqual((await out.line()).split(), [hashlib.sha256(mine).hexdigest().encode(), str(BIG).encode()])
                self.assertTrue(await async_until(lambda: any(e.type == "close" for e in events), 10))
                close = [e for e in events if e.type == "close"][0]
                self.assertIsNone(close.error)
                self.assertEqual((close.bytes_in, close.bytes_out), (BIG, BIG))

    async def test_reverse_bulk_both_ways(self) -> None:
        got = {}

        def handle(c: socket.socket) -> None:
            data = pattern(3)
            th = threading.Thread(target=lambda: (c.sendall(data), c.shutdown(socket.SHUT_WR)))
            th.start()
            got["data"] = recv_all(c)
            th.join()

        srv, port = threaded_server(handle)
        events = []
        try:
            async with await self.shim.tunnel(0, port, on_event=events.append) as t:
                r = await self.shim.commands.run(["python3", "-c", BULK_CLIENT, str(t.port), "4", str(BIG)], timeout=120)
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertEqual(r.stdout.split(), [hashlib.sha256(pattern(3)).hexdigest(), str(BIG)])
                self.assertTrue(await async_until(lambda: any(e.type == "close" for e in events), 10))
                # the local server's thread stores what it read once it has seen EOF
                self.assertTrue(await async_until(lambda: "data" in got, 10))
                self.assertTrue(got["data"] == pattern(4), "the bytes from inside differ")
                close = [e for e in events if e.type == "close"][0]
                self.assertEqual((close.bytes_in, close.bytes_out, close.error), (BIG, BIG, None))
        finally:
            srv.close()

    async def test_half_close_both_ways(self) -> None:
        async with await self.shim.commands.start(["python3", "-c", HALF_SERVER]) as server:
            out = AsyncLines(server)
            async with await self.shim.forward(int(await out.line())) as t:
                r, w = await asyncio.open_connection("127.0.0.1", t.port)
                self.assertEqual(await r.read(), b"first")  # inside half-closed first
                w.write(b"after-eof")
                w.write_eof()
                self.assertEqual(await out.line(), b"after-eof")
                w.close()
        got = {}

        def host_first(c: socket.socket) -> None:
            c.sendall(b"from-host")
            c.shutdown(socket.SHUT_WR)
            got["data"] = recv_all(c)

        srv, port = threaded_server(host_first)
        try:
            async with await self.shim.tunnel(0, port) as t:
                r2 = await self.shim.commands.run(["python3", "-c", HALF_CLIENT, str(t.port)])
                self.assertEqual(r2.stdout.strip(), "from-host", r2.stderr)
                self.assertTrue(await async_until(lambda: "data" in got))
                self.assertEqual(got["data"], b"after-eof:from-host")
        finally:
            srv.close()

    async def test_many_at_once(self) -> None:
        n = 50
        events = []
        async with await self.shim.commands.start(["python3", "-c", MANY_SERVER]) as server:
            port = int(await AsyncLines(server).line())
            async with await self.shim.forward(port, on_event=events.append) as t:

                async def ask(i: int) -> bool:
                    msg = (b"%d:" % i) * (1000 + 37 * i)
                    r, w = await asyncio.open_connection("127.0.0.1", t.port)
                    w.write(msg)
                    w.write_eof()
                    got = await r.read()
                    w.close()
                    return got == msg[::-1]

                self.assertEqual(await asyncio.gather(*(ask(i) for i in range(n))), [True] * n)
                self.assertTrue(await async_until(lambda: sum(e.type == "close" for e in events) == n, 10))
                self.assertTrue(all(e.error is None for e in events))
                self.assertEqual(t.active, 0)
            await server.kill()
        srv, port = threaded_server(reverse_echo)
        try:
            async with await self.shim.tunnel(0, port) as t:
                r = await self.shim.commands.run(["python3", "-c", MANY_CLIENT, str(t.port), str(n)], timeout=60)
                self.assertEqual(r.stdout.strip(), str(n), r.stderr)
        finally:
            srv.close()

    async def test_close_with_connection_open_and_coroutine_on_event(self) -> None:
        srv, port = threaded_server(lambda c: recv_all(c))
        seen = []

        async def on_event(ev) -> None:
            await asyncio.sleep(0)
            seen.append(ev)

        try:
            t = await self.shim.tunnel(0, port, on_event=on_event)
            p = await self.shim.commands.start(["python3", "-c",
                                                "import socket,sys\n"
                                                "c=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
                                                "c.sendall(b'x')\n"
                                                "print(repr(c.recv(10)), flush=True)", str(t.port)])
            async with p:
                self.assertTrue(await async_until(lambda: t.active == 1))
                await t.close()
                self.assertEqual(t.active, 0)
                self.assertFalse(await t.wait(1))
                await p.wait()
            self.assertTrue(await async_until(lambda: any(e.type == "close" for e in seen)))
            close = [e for e in seen if e.type == "close"][0]
            self.assertEqual(close.error.errno_name, "ECONNABORTED")
        finally:
            srv.close()

    async def test_close_with_shim_and_validation(self) -> None:
        shim = await AsyncShim.connect(self.daemon.target)
        t = await shim.forward(9, 0)
        lp = t.port
        waiter = asyncio.ensure_future(t.wait())
        await shim.close()  # closes the tunnel too
        self.assertTrue(t.closed)
        self.assertFalse(await asyncio.wait_for(waiter, 5))
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", lp), timeout=2).close()
        with self.assertRaises(ValueError):
            await self.shim.tunnel(0, 0)
        with self.assertRaises(ValueError):
            await self.shim.forward(0)
        with self.assertRaises(TypeError):
            await self.shim.forward("80")  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            await self.shim.tunnel(0, 80, on_event="log")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            await self.shim.tunnel(0, 80, local_host="")


def s3rver(d: str) -> "tuple[int, str, str, str]":
    """Start s3rver (bucket "pybucket") with its data in directory d; returns (pid,
    endpoint, key, secret). Skips the test when the tools are not there."""
    if not os.path.exists(S3RVER_SH):
        raise unittest.SkipTest("tests/lib/s3rver.sh not found")
    for tool in ("rclone", "fusermount3", "npm"):
        if not shutil.which(tool):
            raise unittest.SkipTest(f"{tool} not installed")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise unittest.SkipTest("FUSE mounts need root and /dev/fuse")
    script = f'source "{S3RVER_SH}" && s3rver_install >&2 && s3rver_start "$1" pybucket >&2 && echo "$S3_PID $S3_ENDPOINT $S3_ACCESS_KEY $S3_SECRET_KEY"'
    r = subprocess.run(["bash", "-c", script, "s3", d], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise unittest.SkipTest("s3rver could not be started: " + r.stderr[-500:])
    pid, endpoint, key, secret = r.stdout.split()
    return int(pid), endpoint, key, secret


class Mounts(ShimCase):
    @classmethod
    def setUpClass(cls) -> None:
        import tempfile

        cls.s3dir = tempfile.mkdtemp(prefix="sbxpy-s3-")
        try:
            cls.s3 = s3rver(cls.s3dir)
        except BaseException:
            shutil.rmtree(cls.s3dir, ignore_errors=True)
            raise
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        try:
            os.kill(cls.s3[0], 15)
        except ProcessLookupError:
            pass
        shutil.rmtree(cls.s3dir, ignore_errors=True)

    def test_mount_write_list_unmount(self) -> None:
        _, endpoint, key, secret = self.s3
        mp = self.p("bucket")
        rec = self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        self.assertEqual(rec["state"], "live")
        self.assertEqual(rec["path"], mp)
        self.assertEqual(rec["bucket"], "pybucket")
        self.shim.files.write_file(f"{mp}/hello.txt", b"through the mount")
        self.assertEqual(self.shim.files.read_file(f"{mp}/hello.txt"), b"through the mount")
        listed = self.shim.mounts.list()
        self.assertIn(rec["id"], [m["id"] for m in listed])
        with self.assertRaises(SandboxError) as cm:  # already a mount point
            self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        self.assertEqual(cm.exception.errno_name, "EBUSY")
        done = self.shim.mounts.unmount(rec["id"])
        self.assertEqual(done["state"], "unmounted")
        self.assertNotIn(rec["id"], [m["id"] for m in self.shim.mounts.list() if m["state"] != "unmounted"])
        # the object really went to the bucket: mount again read-only (by path this time)
        ro = self.shim.mounts.mount("pybucket", mp, endpoint=endpoint, access_key_id=key, secret_access_key=secret,
                                    read_only=True)
        self.assertTrue(ro["read_only"])
        self.assertEqual(self.shim.files.read_file(f"{mp}/hello.txt"), b"through the mount")
        with self.assertRaises(SandboxError) as cm:
            self.shim.files.write_file(f"{mp}/nope.txt", b"x")
        self.assertEqual(cm.exception.errno_name, "EROFS")
        self.shim.mounts.unmount(mp)

    def test_refused_key_and_validation(self) -> None:
        _, endpoint, key, secret = self.s3
        m = self.shim.mounts
        # refused keys: the shim documents EACCES with rclone's words (a PermissionError
        # here); whatever the code, the secret never appears in the error
        with self.assertRaises(SandboxError) as cm:
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id="NOT-A-KEY",
                    secret_access_key="s3cret-never-shown", mount_timeout=5)
        self.assertNotIn("s3cret-never-shown", str(cm.exception))
        if cm.exception.errno_name == "EACCES":
            self.assertIsInstance(cm.exception, SandboxPermissionError)
            self.assertIsInstance(cm.exception, PermissionError)
        with self.assertRaises(ValueError):
            m.mount("pybucket", self.p("x"), endpoint="ftp://x", access_key_id=key, secret_access_key=secret)
        with self.assertRaises(ValueError):
            m.mount("", self.p("x"), endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        with self.assertRaises(TypeError):
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id=1, secret_access_key=secret)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            m.mount("pybucket", self.p("x"), endpoint=endpoint, access_key_id=key, secret_access_key=secret, options="ro")  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            m.mount("pybucket", "relative", endpoint=endpoint, access_key_id=key, secret_access_key=secret)
        with self.assertRaises(SandboxError) as cm:
            m.unmount("no-such-mount")
        self.assertEqual(cm.exception.errno_name, "ENOENT")


if __name__ == "__main__":
    unittest.main()
