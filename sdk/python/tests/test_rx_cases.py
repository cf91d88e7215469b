"""The receiving-side cases of tests/integration/rx_cases.txt (the same file libsbx's
it_rx.c runs; its header describes the format), run against the Python core:

- ``SansIO``: the fake shim's bytes fed to a Protocol, cut as the case says; the client's
  output parsed back (credit, CANCEL, PONG), no sockets, threads or clocks. A read given
  up on is abandoned when the fake waits for its CANCEL (that is when a client's timeout
  would have passed).
- ``OverSocket``: the sync Engine over a socketpair with a fake-shim thread, as it_rx.c
  runs libsbx (timeouts real, pieces drained one by one as the case says).
"""

from __future__ import annotations

import copy
import os
import shlex
import unittest
from typing import Any, Dict, List, Optional, Tuple

from puretest import (
    DATA, END, ERROR, FIN, PING, PONG, REPO, S, SYNC_ERROR, WAIT, WINDOW, E, FakeShim, P, all_frames, frame,
    hello_ok, parse_frames, pb, read_request, u32,
)

CASES_FILE = os.environ.get("SBX_RX_CASES") or os.path.join(REPO, "tests", "integration", "rx_cases.txt")
READ_EXTRA_WINDOW = 4 << 20  # what libsbx's reads grant on top of the initial window (fs_io.c)
HDR_LEN = 12


# ---- the case file ----


class FLine:
    def __init__(self, op: str, call: Optional[str], stream: Optional[int] = None, n: int = 0) -> None:
        self.op, self.call, self.stream, self.n = op, call, stream, n
        self.raw: Tuple[int, int, int] = (0, 0, 0)
        self.err: Tuple[str, str, Optional[str]] = ("", "", None)
        self.payload = b""


class Expect:
    def __init__(self, toks: List[str], where: str) -> None:
        self.what = toks[0]
        self.kind = ""
        self.code = 0
        self.got = 0
        self.path: Optional[str] = None
        self.msg: Optional[str] = None
        rest: List[str] = []
        if self.what == "ok":
            rest = toks[1:]
        elif self.what == "timeout":
            self.got = int(toks[1])
            rest = toks[2:]
        elif self.what == "fail":
            self.kind = toks[1]
            assert self.kind in ("remote", "local", "connect", "protocol"), where
            code = E.errno_number(toks[2])
            assert code is not None, f"{where}: unknown errno {toks[2]}"
            self.code = code
            self.got = int(toks[3])
            rest = toks[4:]
        else:
            raise AssertionError(f"{where}: unknown expectation {self.what}")
        for k in range(0, len(rest), 2):
            key, val = rest[k], rest[k + 1]
            if key == "path":
                self.path = val
            elif key == "message.py":
                self.msg = val
            else:
                assert key == "message.c", f"{where}: unknown attribute {key}"


class Step:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.call = ""
        self.index = 0  # the n-th read of the case, from 0
        self.timeout_ms = 0
        self.cut = "none"
        self.cut_seed = 0
        self.nowait = False
        self.lines: List[FLine] = []
        self.expect: Optional[Expect] = None
        self.ping_fails = False


class Case:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seeds: Dict[str, int] = {}
        self.order: List[str] = []
        self.steps: List[Step] = []


def tokenize(text: str) -> List[Tuple[int, List[str]]]:
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        lex = shlex.shlex(line, posix=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        toks = list(lex)
        if toks:
            out.append((no, toks))
    return out


def load_cases(path: str = CASES_FILE) -> List[Case]:
    with open(path, encoding="utf-8") as f:
        lines = tokenize(f.read())
    blocks: Dict[str, List[Tuple[int, List[str]]]] = {}
    cases: List[Case] = []
    case: Optional[Case] = None
    step: Optional[Step] = None
    i = 0

    def add_fline(c: Case, s: Step, no: int, t: List[str], depth: int = 0) -> None:
        where = f"{path}:{no}"
        w = t[0]
        if w == "use":
            assert len(t) == 2 and t[1] in blocks and depth < 4, where
            for no2, t2 in blocks[t[1]]:
                add_fline(c, s, no2, t2, depth + 1)
            return

        def stream_of(tok: str) -> Tuple[Optional[str], Optional[int]]:
            if tok[0].isdigit():
                return None, int(tok)
            assert tok in c.seeds, f"{where}: no call named {tok} in this case (yet)"
            return tok, None

        rest: List[str] = []
        if w in ("data", "window", "zeros"):
            fl = FLine(w, s.call, None, int(t[1]))
            rest = t[2:]
        elif w in ("fin", "end"):
            fl = FLine(w, s.call)
            rest = t[1:]
        elif w == "error":
            fl = FLine(w, s.call, None, int(t[1]))
            p = None
            rest = t[4:]
            if rest[:1] == ["path"]:
                p = rest[1]
                rest = rest[2:]
            fl.err = (t[2], t[3], p)
        elif w == "ping":
            fl = FLine(w, None, 0)
            fl.payload = bytes.fromhex(t[1])
            assert len(fl.payload) <= 64, where
        elif w == "raw":
            call, st = stream_of(t[2])
            fl = FLine(w, call, st, int(t[1]))
            fl.raw = (int(t[3]), int(t[4]), int(t[5]))
        elif w == "at":
            assert t[2] in ("cancel", "eof"), where
            fl = FLine("at_" + t[2], s.call, None, int(t[1]))
        else:
            raise AssertionError(f"{where}: unknown frame line {w}")
        if rest:
            assert len(rest) == 2 and rest[0] == "on", f"{where}: trailing {rest}"
            fl.call, fl.stream = stream_of(rest[1])
        s.lines.append(fl)

    while i < len(lines):
        no, t = lines[i]
        where = f"{path}:{no}"
        w = t[0]
        if w == "frames":
            name = t[1]
            body = []
            i += 1
            while lines[i][1][0] != "endframes":
                body.append(lines[i])
                i += 1
            blocks[name] = body
            i += 1
            continue
        if w == "case":
            case = Case(t[1])
            cases.append(case)
            i += 1
            continue
        assert case is not None, f"{where}: {w} outside a case"
        if w.startswith("expect"):
            assert step is not None, f"{where}: expect without a read"
            if w == "expect.py" or (w == "expect" and step.expect is None):
                step.expect = Expect(t[1:], where)
            else:
                assert w in ("expect", "expect.c"), where
            if i + 1 >= len(lines) or not lines[i + 1][1][0].startswith("expect"):
                assert step.expect is not None, f"{where}: no expectation for the Python SDK"
                step = None
            i += 1
            continue
        if step is not None:
            add_fline(case, step, no, t)
            i += 1
            continue
        if w == "read":
            assert t[2] == "seed" and t[1] not in case.seeds, where
            step = Step("read")
            step.call = t[1]
            step.index = len(case.order)
            case.seeds[t[1]] = int(t[3])
            case.order.append(t[1])
            k = 4
            while k < len(t):
                if t[k] == "timeout":
                    step.timeout_ms = int(t[k + 1])
                    k += 2
                elif t[k] == "nowait":
                    step.nowait = True
                    k += 1
                elif t[k] == "cut":
                    step.cut = t[k + 1]
                    k += 2
                    if step.cut == "random":
                        step.cut_seed = int(t[k])
                        k += 1
                    assert step.cut in ("none", "edges", "bytes", "random"), where
                else:
                    raise AssertionError(f"{where}: unknown read attribute {t[k]}")
            case.steps.append(step)
        elif w in ("ping", "ping.c", "ping.py"):
            assert t[1:] in ([], ["fails"]), where
            if w != "ping.c":
                s = Step("ping")
                s.ping_fails = t[1:] == ["fails"]
                case.steps.append(s)
        else:
            raise AssertionError(f"{where}: unknown step {w}")
        i += 1
    assert step is None, f"{path}: the last read has no expect line"
    return cases


# ---- the bytes of a call ----

_TABLES: Dict[int, bytes] = {}
PERIOD = 65521
K = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1


def pattern(seed: int, pos: int, n: int) -> bytes:
    """Bytes pos..pos+n of the data of a call with this seed (rx_cases.txt)."""
    t = _TABLES.get(seed)
    if t is None:
        base = seed * 1000003
        t = bytes(97 + ((((i + base) * K) & M64) >> 40) % 26 for i in range(PERIOD))
        _TABLES[seed] = t
    start = pos % PERIOD
    reps = (start + n) // PERIOD + 1
    return (t * reps)[start:start + n]


# ---- the fake's bytes for a read ----


class Wire:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.starts: List[int] = []
        self.fcall: List[Optional[str]] = []  # a DATA frame's call (for the credit)
        self.fdata: List[int] = []
        self.marks: List[List[Any]] = []  # [pos, op]
        self._pending: List[Tuple[int, int]] = []  # (mark index, offset)

    def start_frame(self, call: Optional[str], ndata: int) -> None:
        self.starts.append(len(self.buf))
        self.fcall.append(call)
        self.fdata.append(ndata)
        for k, off in self._pending:
            self.marks[k][0] = len(self.buf) + off
        self._pending = []

    def finish(self) -> None:
        for k, _ in self._pending:
            self.marks[k][0] = len(self.buf)
        self._pending = []


class Calls:
    """What the fake knows of the case's calls: their streams, seeds and bytes sent."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.sid: Dict[str, int] = {}
        self.pos: Dict[str, int] = {n: 0 for n in case.order}

    def stream(self, fl: FLine) -> int:
        if fl.call is None:
            assert fl.stream is not None
            return fl.stream
        return self.sid[fl.call]


def build_wire(calls: Calls, step: Step, our_pings: List[bytes]) -> Wire:
    w = Wire()
    for fl in step.lines:
        if fl.op == "data":
            if fl.call is not None:
                data = pattern(calls.case.seeds[fl.call], calls.pos[fl.call], fl.n)
                calls.pos[fl.call] += fl.n
            else:
                data = pattern(999, 0, fl.n)
            w.start_frame(fl.call, fl.n)
            w.buf += frame(calls.stream(fl), DATA, 0, data)
        elif fl.op == "fin":
            w.start_frame(None, 0)
            w.buf += frame(calls.stream(fl), DATA, FIN)
        elif fl.op == "end":
            n = calls.pos[fl.call] if fl.call is not None else 0
            w.start_frame(None, 0)
            w.buf += frame(calls.stream(fl), END, 0, pb.Result(read=pb.ReadReply(bytes=n)).encode())
        elif fl.op == "error":
            name, msg, path = fl.err
            e = pb.Error(errno_num=fl.n, errno_name=name, message=msg, path=None if path is None else path.encode())
            w.start_frame(None, 0)
            w.buf += frame(calls.stream(fl), ERROR, 0, e.encode())
        elif fl.op == "window":
            w.start_frame(None, 0)
            w.buf += frame(calls.stream(fl), WINDOW, 0, u32(fl.n))
        elif fl.op == "ping":
            our_pings.append(fl.payload)
            w.start_frame(None, 0)
            w.buf += frame(0, PING, 0, fl.payload)
        elif fl.op == "raw":
            t, flags, res = fl.raw
            w.start_frame(None, 0)
            w.buf += P.HDR.pack(fl.n, calls.stream(fl), t, flags, res)
        elif fl.op == "zeros":
            w.buf += bytes(fl.n)
        else:  # at_cancel / at_eof
            w.marks.append([None, fl.op])
            w._pending.append((len(w.marks) - 1, fl.n))
    w.finish()
    return w


def cuts_edges(w: Wire, every_byte: bool) -> List[int]:
    cuts: List[int] = []
    nf = len(w.starts)
    for i in range(nf):
        f = w.starts[i]
        end = w.starts[i + 1] if i + 1 < nf else len(w.buf)
        ln = end - f - HDR_LEN
        if every_byte:
            b = f + 1
            while b < f + 24 and b < end:
                cuts.append(b)
                b += 1
            b = end - 24 if end > 24 else 0
            while b < end:
                if b > f + 24:
                    cuts.append(b)
                b += 1
        else:
            for c in (f + 1, f + 5, f + 11, f + 12, f + 13, f + 12 + ln // 2, end - 13, end - 12, end - 11, end - 1):
                if f < c < end and (not cuts or c > cuts[-1]):
                    cuts.append(c)
    return cuts


def cuts_of(step: Step, w: Wire) -> List[int]:
    if step.cut in ("edges", "bytes"):
        return cuts_edges(w, step.cut == "bytes")
    cuts: List[int] = []
    if step.cut == "random":
        x = step.cut_seed
        at = 0
        while at < len(w.buf) and len(cuts) < 2000:
            x = (x * 6364136223846793005 + 1442695040888963407) & M64
            at += 1 + (x >> 33) % 150000
            cuts.append(at)
    return cuts


def pieces(step: Step, w: Wire) -> List[Tuple[int, int, Optional[str]]]:
    """(start, end, mark op at end or None), in order, as the fake sends them."""
    stops = sorted(set(c for c in cuts_of(step, w) if 0 < c < len(w.buf)))
    out = []
    at = 0
    ci = 0
    mi = 0
    while at < len(w.buf) or mi < len(w.marks):
        end = len(w.buf)
        while ci < len(stops) and stops[ci] <= at:
            ci += 1
        if ci < len(stops):
            end = stops[ci]
        op = None
        if mi < len(w.marks) and w.marks[mi][0] <= end:
            end = w.marks[mi][0]
            op = w.marks[mi][1]
            mi += 1
        out.append((at, end, op))
        at = end
        if op == "at_eof":
            break
    return out


def frames_begun(w: Wire, fi: int, end: int) -> Tuple[int, List[Tuple[str, int]]]:
    """The DATA frames (call, bytes) that begin before end, from frame fi on."""
    need = []
    while fi < len(w.starts) and w.starts[fi] < end:
        if w.fcall[fi] is not None and w.fdata[fi] > 0:
            need.append((w.fcall[fi], w.fdata[fi]))
        fi += 1
    return fi, need


def expected_of(case: Case, step: Step) -> Tuple[int, int, int]:
    """(bytes of the read's data, its DATA frames, other calls' DATA frames)."""
    total = mine = other = 0
    for fl in step.lines:
        if fl.op in ("data", "fin"):
            if fl.call == step.call:
                mine += 1
                total += fl.n if fl.op == "data" else 0
            else:
                other += 1
    return total, mine, other


class Outcome:
    def __init__(self) -> None:
        self.data = bytearray()
        self.nframes = 0
        self.result: Optional[Any] = None
        self.error: Optional[BaseException] = None
        self.gave_up = False


def check_outcome(t: unittest.TestCase, case: Case, step: Step, out: Outcome) -> None:
    x = step.expect
    assert x is not None
    total, mine, _ = expected_of(case, step)
    what = f"{case.name}: read /{step.call}"
    seed = case.seeds[step.call]
    if x.what == "ok":
        t.assertIsNone(out.error, f"{what} failed: {out.error!r}")
        t.assertFalse(out.gave_up, what)
        t.assertIsNotNone(out.result, what)
        t.assertEqual(out.result.which_kind(), "read", what)
        t.assertEqual(out.result.read.bytes, total, what)
        t.assertEqual(len(out.data), total, what)
        t.assertEqual(out.nframes, mine, f"{what}: DATA frames")
    elif x.what == "timeout":
        t.assertTrue(out.gave_up, what)
        t.assertIsNone(out.result, what)
        t.assertEqual(len(out.data), x.got, what)
        if out.error is not None:
            t.assertIsInstance(out.error, E.SandboxTimeoutError, what)
            t.assertEqual((out.error.errno, out.error.kind), (110, "local"), what)
    else:
        t.assertIsNone(out.result, f"{what} succeeded")
        e = out.error
        t.assertIsInstance(e, E.SandboxError, f"{what}: {e!r}")
        assert isinstance(e, E.SandboxError)
        t.assertEqual((e.kind, e.errno), (x.kind, x.code), f"{what}: {e!r}")
        t.assertIsInstance(e, E.error_class(x.kind, x.code), what)
        if x.kind == "protocol":
            t.assertIsInstance(e, E.SandboxProtocolError, what)
        if x.path is not None:
            t.assertEqual(e.path, x.path, what)
        if x.msg is not None:
            t.assertIn(x.msg, e.message, what)
        t.assertEqual(len(out.data), x.got, what)
    t.assertEqual(bytes(out.data), pattern(seed, 0, len(out.data)), f"{what}: the bytes")


CASES = load_cases()


# ---- sans-IO ----


class SansFake:
    """The fake's view of what the client sent (parsed from data_to_send())."""

    def __init__(self, t: unittest.TestCase, p: "P.Protocol") -> None:
        self.t, self.p = t, p
        self.buf = bytearray()
        self.window = 256 << 10
        self.requests: List[int] = []
        self.credit: Dict[int, int] = {}
        self.sent: Dict[int, int] = {}
        self.cancels: List[int] = []
        self.pings: List[bytes] = []
        self.our_pings: List[bytes] = []
        self.our_pongs = 0
        self.hello = False

    def take(self) -> None:
        self.buf += self.p.data_to_send()
        for f in parse_frames(self.buf):
            self.t.assertEqual(f.reserved, 0)
            if f.type == 1:
                h = pb.Hello.decode(f.payload)
                self.window = h.initial_window if h.initial_window is not None else 256 << 10
                self.hello = True
            elif f.type == 3:
                self.t.assertTrue(not self.requests or f.stream > self.requests[-1])
                self.requests.append(f.stream)
                self.credit[f.stream] = self.window
                self.sent[f.stream] = 0
            elif f.type == WINDOW:
                self.t.assertEqual(len(f.payload), 4)
                inc = int.from_bytes(f.payload, "big")
                self.t.assertGreater(inc, 0)
                self.credit[f.stream] += inc
                self.t.assertLessEqual(self.credit[f.stream] - self.sent[f.stream], 2**31 - 1)
            elif f.type == 8:
                self.cancels.append(f.stream)
            elif f.type == PING:
                self.pings.append(f.payload)
            elif f.type == PONG:
                self.t.assertLess(self.our_pongs, len(self.our_pings), "a PONG for no PING")
                self.t.assertEqual(f.payload, self.our_pings[self.our_pongs])
                self.our_pongs += 1
            else:
                self.t.assertIn(f.type, (4,), f"unexpected frame from the client: {f!r}")


def run_sansio(t: unittest.TestCase, case: Case) -> None:
    p = P.Protocol(client_name="rx-cases")
    fake = SansFake(t, p)
    calls = Calls(case)
    outs: Dict[int, Outcome] = {}
    live = {"dead": False}

    def handle(evs: List[Any]) -> None:
        for ev in evs:
            if isinstance(ev, P.Data):
                o = outs[ev.stream]
                t.assertFalse(o.gave_up, f"DATA for stream {ev.stream}, given up on")
                o.data += ev.data
                o.nframes += 1
                p.consumed(ev.stream, len(ev.data))
            elif isinstance(ev, P.StreamEnd):
                t.assertFalse(outs[ev.stream].gave_up)
                outs[ev.stream].result = ev.result
            elif isinstance(ev, P.StreamError):
                t.assertFalse(outs[ev.stream].gave_up)
                outs[ev.stream].error = ev.error
            elif isinstance(ev, P.ConnectionFailed):
                live["dead"] = True
                for sid in ev.streams:
                    t.assertFalse(outs[sid].gave_up, "a stream given up on listed as failed")
                    outs[sid].error = ev.error
            elif isinstance(ev, (P.CreditAvailable, P.PongReceived, P.StreamEvent, P.HandshakeDone)):
                pass
            else:
                raise AssertionError(f"unknown event {ev!r}")
        fake.take()

    p.start()
    fake.take()
    t.assertTrue(fake.hello)
    evs = p.receive(hello_ok())
    t.assertIsInstance(evs[0], P.HandshakeDone)
    handle(evs)
    hung_up = False
    for step in case.steps:
        if step.kind == "ping":
            if step.ping_fails:
                t.assertTrue(live["dead"] or hung_up, f"{case.name}: the connection should be gone")
                with t.assertRaises(E.SandboxError):
                    p.ping(b"rx-cases")
                continue
            t.assertFalse(live["dead"], f"{case.name}: the connection is gone")
            p.ping(b"rx-ping")
            fake.take()
            t.assertEqual(fake.pings, [b"rx-ping"])
            t.assertEqual(fake.our_pongs, len(fake.our_pings), "PINGs of the fake not answered")
            fake.pings.clear()
            evs = p.receive(frame(0, PONG, 0, b"rx-ping"))
            t.assertEqual([type(e) for e in evs], [P.PongReceived])
            handle(evs)
            continue
        sid = p.open(read_request(("/" + step.call).encode()), extra_window=READ_EXTRA_WINDOW)
        t.assertEqual(sid, 2 * step.index + 1)
        outs[sid] = Outcome()
        fake.take()
        t.assertEqual(fake.requests[-1], sid)
        calls.sid[step.call] = sid
        w = build_wire(calls, step, fake.our_pings)
        fi = 0
        for start, end, op in pieces(step, w):
            fi, need = frames_begun(w, fi, end)
            if not live["dead"]:
                for call, n in need:
                    s = calls.sid[call]
                    t.assertGreaterEqual(fake.credit[s] - fake.sent[s], n,
                                         f"{case.name}: the fake would wait for credit on stream {s} forever")
                    fake.sent[s] += n
            if end > start:
                handle(p.receive(bytes(w.buf[start:end])))
            if op == "at_cancel":
                # the client's deadline passes: it gives up on the read
                if not outs[sid].gave_up and outs[sid].result is None and outs[sid].error is None:
                    p.abandon(sid)
                    outs[sid].gave_up = True
                fake.take()
                t.assertIn(sid, fake.cancels, "no CANCEL for a read given up on")
            elif op == "at_eof":
                handle(p.receive_eof())
                hung_up = True
        check_outcome(t, case, step, outs[sid])
        for s, o in outs.items():
            t.assertTrue(o.gave_up or o.result is not None or o.error is not None, f"stream {s} still in flight")
    if not live["dead"] and not hung_up:
        t.assertTrue(p.is_open)


class SansIO(unittest.TestCase):
    pass


# ---- over a socketpair, through the sync Engine ----


def fake_script(case: Case, steps: List[Step]):
    def script(f: FakeShim) -> None:
        calls = Calls(case)
        f.answer_hello()
        n = 0
        for step in steps:
            if step.kind == "ping":
                if not step.ping_fails:
                    f.answer_ping()
                continue
            n += 1
            calls.sid[step.call] = f.wait_request(n)
            f.pump(0)
            w = build_wire(calls, step, f.our_pings)
            fi = 0
            for start, end, op in pieces(step, w):
                fi, need = frames_begun(w, fi, end)
                for call, k in need:
                    f.wait_credit(calls.sid[call], k)
                if end > start:
                    if not f.send(bytes(w.buf[start:end])):
                        return  # the client has gone
                    if not step.nowait and step.cut != "none":
                        f.wait_drained()
                if op is not None:
                    f.wait_drained()
                    if op == "at_cancel":
                        f.wait_cancel(calls.sid[step.call])
                    else:
                        return  # hang up
        f.wait_eof()

    return script


def run_engine(t: unittest.TestCase, case: Case) -> None:
    if S is None:
        raise unittest.SkipTest(f"_sync is not usable: {SYNC_ERROR}")
    from puretest import SockTransport

    fake = FakeShim()
    fake.run(fake_script(case, case.steps))
    tr = SockTransport(fake.client_sock)
    eng = S.Engine(tr, P.Protocol(client_name="rx-cases"))
    try:
        eng.handshake(WAIT)
        for step in case.steps:
            if step.kind == "ping":
                if step.ping_fails:
                    with t.assertRaises(E.SandboxError):
                        eng.ping(WAIT, None)
                else:
                    eng.ping(WAIT, None)
                continue
            timeout = step.timeout_ms / 1000 if step.timeout_ms else WAIT
            out = Outcome()
            call = eng.open(read_request(("/" + step.call).encode()), timeout=timeout, extra_window=READ_EXTRA_WINDOW)
            t.assertEqual(call.sid, 2 * step.index + 1)
            try:
                while True:
                    it = call.next()
                    if it is None:
                        out.result = call.result
                        break
                    if isinstance(it, P.Data):
                        out.data += it.data
                        out.nframes += 1
            except E.SandboxTimeoutError as e:
                out.error = e
                out.gave_up = step.expect is not None and step.expect.what == "timeout"
            except E.SandboxError as e:
                out.error = e
            check_outcome(t, case, step, out)
            with eng.lock:
                t.assertEqual(dict(eng.calls), {}, "calls still in flight")
    finally:
        eng.close()
        fake.join()
        fake.close()


class OverSocket(unittest.TestCase):
    pass


def _add(cls: type, runner: Any, case: Case) -> None:
    def test(self: unittest.TestCase) -> None:
        runner(self, case)

    test.__name__ = f"test_{case.name}"
    test.__doc__ = f"rx_cases.txt: case {case.name}"
    setattr(cls, test.__name__, test)


for _c in CASES:
    _add(SansIO, run_sansio, _c)
    _add(OverSocket, run_engine, _c)


class TheFile(unittest.TestCase):
    def test_cases_there(self) -> None:
        names = [c.name for c in CASES]
        for want in ("split", "abandon", "eof", "bad", "bad_length", "unknown_stream"):
            self.assertIn(want, names)
        self.assertEqual(len(names), len(set(names)))

    def test_pattern_matches_the_formula(self) -> None:
        for seed in (1, 7, 999):
            for pos in (0, 1, 65520, 65521, 65522, 1553120):
                want = 97 + ((((pos % 65521) + seed * 1000003) * K & M64) >> 40) % 26
                self.assertEqual(pattern(seed, pos, 1)[0], want)
        self.assertEqual(pattern(3, 65000, 2000), bytes(pattern(3, i, 1)[0] for i in range(65000, 67000)))

    def test_cut_modes(self) -> None:
        case = next(c for c in CASES if c.name == "split")
        calls = Calls(case)
        for name in case.order:
            calls.sid[name] = 1 + 2 * case.order.index(name)
        step = copy.copy(case.steps[1])
        w = build_wire(calls, step, [])
        self.assertEqual(all_frames(bytes(w.buf))[0].type, WINDOW)
        for mode in ("none", "edges", "bytes", "random"):
            step.cut = mode
            step.cut_seed = 12345
            ps = pieces(step, w)
            self.assertEqual(b"".join(bytes(w.buf[a:b]) for a, b, _ in ps), bytes(w.buf), mode)
            self.assertTrue(all(a < b for a, b, _ in ps), mode)


if __name__ == "__main__":
    unittest.main()
