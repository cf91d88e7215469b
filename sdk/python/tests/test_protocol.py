"""The sans-IO protocol core (sandbox_shim._protocol): bytes in, events out; no sockets,
threads or clocks. Checks the client's side of PROTOCOL.md 2-11 and 15."""

from __future__ import annotations

import random
import unittest
from typing import Any, List, Optional, Tuple

from puretest import (
    CANCEL, DATA, END, ERROR, EVENT, FIN, HELLO, HELLO_OK, PING, PONG, REQUEST, STDERR, WINDOW,
    E, P, all_frames, error_payload, frame, header, hello_ok, hello_reply, pb, u32, window,
)

MAXC = 2**31 - 1
ECHO = pb.Request(echo=pb.EchoRequest())


def norm(ev: Any) -> Tuple:
    """An event as a comparable tuple."""
    t = type(ev).__name__
    if isinstance(ev, P.Data):
        return (t, ev.stream, bytes(ev.data), ev.fin, ev.stderr)
    if isinstance(ev, P.StreamEvent):
        return (t, ev.stream, repr(ev.event))
    if isinstance(ev, P.StreamEnd):
        return (t, ev.stream, repr(ev.result))
    if isinstance(ev, P.StreamError):
        e = ev.error
        return (t, ev.stream, type(e).__name__, e.errno, e.errno_name, e.message, e.path, e.kind)
    if isinstance(ev, P.CreditAvailable):
        return (t, ev.stream)
    if isinstance(ev, P.PongReceived):
        return (t, bytes(ev.payload))
    if isinstance(ev, P.HandshakeDone):
        return (t, repr(ev.reply))
    if isinstance(ev, P.ConnectionFailed):
        e = ev.error
        return (t, type(e).__name__, e.errno, e.message, e.kind, tuple(ev.streams))
    raise AssertionError(f"unknown event {ev!r}")


def feed(p: "P.Protocol", data: bytes, pieces: Optional[List[int]] = None) -> List[Tuple]:
    """Feed data cut at the given positions; the events, normalized."""
    out: List[Tuple] = []
    at = 0
    for c in (pieces or []) + [len(data)]:
        out += [norm(e) for e in p.receive(data[at:c])]
        at = c
    return out


def opened(*, reply: Optional[dict] = None, **kw: Any) -> "P.Protocol":
    """A Protocol past the handshake (HELLO taken off its output)."""
    p = P.Protocol(**kw)
    p.start()
    p.data_to_send()
    ev = p.receive(hello_ok(**(reply or {})))
    assert len(ev) == 1 and isinstance(ev[0], P.HandshakeDone), ev
    return p


def failed(evs: List[Any]) -> Any:
    """The one ConnectionFailed among evs (the last event)."""
    assert evs and isinstance(evs[-1], P.ConnectionFailed), [norm(e) for e in evs]
    assert sum(isinstance(e, P.ConnectionFailed) for e in evs) == 1
    return evs[-1]


class Handshake(unittest.TestCase):
    def test_hello_bytes(self) -> None:
        p = P.Protocol(client_name="x")
        self.assertEqual(p.data_to_send(), b"")
        p.start()
        out = p.data_to_send()
        # PROTOCOL.md 2.1: Hello{protocol_version: 1, client_name: "x"} is 08 01 12 01 78; the
        # client also states its max_frame (field 4) and initial_window (field 5)
        payload = bytes.fromhex("0801120178") + bytes.fromhex("20 80 80 40") + bytes.fromhex("28 80 80 10")
        self.assertEqual(out, bytes.fromhex("0000000d 00000000 01 00 0000") + payload)
        h = pb.Hello.decode(out[12:])
        self.assertEqual((h.protocol_version, h.client_name, h.max_frame, h.initial_window, h.token),
                         (1, "x", 1 << 20, 256 << 10, None))
        self.assertEqual(p.data_to_send(), b"")
        with self.assertRaises(RuntimeError):
            p.start()

    def test_hello_options(self) -> None:
        p = P.Protocol(client_name="sdk", token=b"s3cret", max_frame=16384, initial_window=4096)
        p.start()
        (f,) = all_frames(p.data_to_send())
        self.assertEqual((f.stream, f.type, f.flags, f.reserved), (0, HELLO, 0, 0))
        h = pb.Hello.decode(f.payload)
        self.assertEqual((h.token, h.max_frame, h.initial_window), (b"s3cret", 16384, 4096))

    def test_bad_options(self) -> None:
        for kw in ({"max_frame": 16383}, {"max_frame": (16 << 20) + 1}, {"initial_window": 4095},
                   {"initial_window": 2**31}):
            with self.assertRaises(ValueError, msg=kw):
                P.Protocol(**kw)

    def test_hello_ok_settles_limits(self) -> None:
        p = P.Protocol()
        p.start()
        p.data_to_send()
        self.assertFalse(p.is_open)
        with self.assertRaises(RuntimeError):
            p.open(ECHO)  # nothing but HELLO before HELLO_OK
        with self.assertRaises(RuntimeError):
            p.ping(b"")
        self.assertEqual(p.data_to_send(), b"")
        rep = hello_reply(max_frame=65536, initial_window=100000, max_streams=3, features=["echo", "fs"])
        (ev,) = p.receive(frame(0, HELLO_OK, 0, rep.encode()))
        self.assertIsInstance(ev, P.HandshakeDone)
        self.assertEqual(ev.reply.features, ["echo", "fs"])
        self.assertTrue(p.is_open)
        self.assertEqual((p.max_frame, p.send_window, p.max_streams), (65536, 100000, 3))
        sid = p.open(ECHO)
        self.assertEqual(p.send_credit(sid), 100000)
        # the negotiated limit now bounds what we take
        ev = p.receive(header(65537, sid, DATA))
        self.assertEqual(failed(ev).error.errno, 90)
        self.assertIn("exceeds the limit of 65536", failed(ev).error.message)

    def test_no_max_streams(self) -> None:
        p = opened()
        self.assertIsNone(p.max_streams)
        for _ in range(300):
            self.assertTrue(p.can_open())
            p.open(ECHO)
        self.assertEqual(p.streams_in_flight(), 300)

    def test_bad_hello_ok(self) -> None:
        cases = [
            (hello_reply(protocol_version=2), 93),
            (hello_reply(max_frame=1000), 71),
            (hello_reply(max_frame=(16 << 20) + 1), 71),
            (hello_reply(initial_window=0), 71),
            (hello_reply(initial_window=2**31), 71),
        ]
        for rep, code in cases:
            p = P.Protocol()
            p.start()
            f = failed(p.receive(frame(0, HELLO_OK, 0, rep.encode())))
            self.assertEqual(f.error.errno, code, rep)
            self.assertFalse(p.is_open)
        # required fields missing: not a HelloReply
        p = P.Protocol()
        p.start()
        f = failed(p.receive(frame(0, HELLO_OK, 0, b"\x08\x01")))
        self.assertEqual(f.error.errno, 74)
        self.assertIsInstance(f.error, E.SandboxProtocolError)

    def test_hello_ok_twice(self) -> None:
        p = opened()
        f = failed(p.receive(hello_ok()))
        self.assertEqual((f.error.errno, f.error.kind), (71, "protocol"))

    def test_stream_frames_before_hello_ok(self) -> None:
        p = P.Protocol()
        p.start()
        f = failed(p.receive(frame(1, DATA, 0, b"x")))
        self.assertEqual(f.error.errno, 71)

    def test_eof_during_handshake(self) -> None:
        p = P.Protocol()
        p.start()
        f = failed(p.receive_eof())
        self.assertEqual((f.error.errno, f.error.kind), (104, "connect"))
        self.assertIsInstance(f.error, E.SandboxConnectionError)


# Every frame the shim can send, after the handshake, with streams 1, 3, 5 and 7 open.
def shim_frames() -> bytes:
    started = pb.Event(started=pb.ProcessStarted(id="p1", pid=42)).encode()
    unknown_event = bytes.fromhex("9a0603010203")  # field 99, length-delimited: a kind from the future
    return b"".join([
        window(1, 1000),
        frame(1, DATA, 0, b"hello"),
        frame(1, EVENT, 0, started),
        frame(1, DATA, STDERR, b"oops\n"),
        frame(1, DATA, FIN),
        frame(1, END, 0, pb.Result(echo=pb.EchoReply(bytes=5)).encode()),
        frame(0, PING, 0, b"12345678"),
        frame(0, PONG, 0, b"\x00" * 8),
        frame(0, PING, 0, b""),
        frame(3, DATA, 0, b"x" * 300),
        frame(3, ERROR, 0, error_payload(2, "ENOENT", "open", b"/nope")),
        frame(5, EVENT, 0, unknown_event),
        frame(5, DATA, FIN, b"last"),
        frame(5, END, 0, pb.Result(done=pb.Done()).encode()),
        frame(0, ERROR, 0, error_payload(11, "EAGAIN", "shim going away")),
    ])


def opened4() -> "P.Protocol":
    p = opened()
    for want in (1, 3, 5, 7):
        assert p.open(ECHO) == want
    p.data_to_send()
    return p


class Splits(unittest.TestCase):
    def test_hello_ok_split_everywhere(self) -> None:
        data = hello_ok(max_frame=65536, max_streams=5, hostname="h")

        def run(pieces: List[int]) -> List[Tuple]:
            p = P.Protocol()
            p.start()
            return feed(p, data, pieces)

        ref = run([])
        self.assertEqual(ref[0][0], "HandshakeDone")
        self.assertEqual(run(list(range(1, len(data)))), ref)
        for c in range(len(data) + 1):
            self.assertEqual(run([c]), ref, c)

    def test_every_frame_split_everywhere(self) -> None:
        data = shim_frames()
        p = opened4()
        ref = feed(p, data)
        ref_out = p.data_to_send()
        kinds = [e[0] for e in ref]
        self.assertEqual(kinds, ["CreditAvailable", "Data", "StreamEvent", "Data", "Data", "StreamEnd",
                                 "PongReceived", "Data", "StreamError", "StreamEvent", "Data", "StreamEnd",
                                 "ConnectionFailed"])
        self.assertEqual(ref[-1][1:], ("SandboxError", 11, "shim going away", "remote", (7,)))
        self.assertEqual(ref_out, frame(0, PONG, 0, b"12345678") + frame(0, PONG, 0, b""))
        # one byte at a time
        p = opened4()
        self.assertEqual(feed(p, data, list(range(1, len(data)))), ref)
        self.assertEqual(p.data_to_send(), ref_out)
        # every 2-way split
        for c in range(len(data) + 1):
            p = opened4()
            self.assertEqual(feed(p, data, [c]), ref, c)
            self.assertEqual(p.data_to_send(), ref_out, c)
        # random 5-way splits
        rnd = random.Random(7)
        for _ in range(200):
            cuts = sorted(rnd.sample(range(1, len(data)), 4))
            p = opened4()
            self.assertEqual(feed(p, data, cuts), ref, cuts)

    def test_memoryview_and_bytearray_input(self) -> None:
        data = shim_frames()
        p = opened4()
        ref = feed(p, data)
        p = opened4()
        got = [norm(e) for e in p.receive(bytearray(data[:100]))] + [norm(e) for e in p.receive(memoryview(data)[100:])]
        self.assertEqual(got, ref)


class Headers(unittest.TestCase):
    """Each header check is made from the 12 header bytes alone (PROTOCOL.md 2)."""

    def test_oversize_before_hello_ok(self) -> None:
        for mine in (16384, 65536, 1 << 20):
            p = P.Protocol(max_frame=mine)
            p.start()
            self.assertEqual(p.receive(header(mine, 0, HELLO_OK)), [])  # at the limit: waits for the payload
            p = P.Protocol(max_frame=mine)
            p.start()
            f = failed(p.receive(header(mine + 1, 0, HELLO_OK)))  # only the header
            self.assertEqual((f.error.errno, f.error.errno_name, f.error.kind), (90, "EMSGSIZE", "protocol"))
            self.assertIsInstance(f.error, E.SandboxProtocolError)
            self.assertEqual(f.error.message, f"frame of {mine + 1} bytes exceeds the limit of {mine}")

    def test_oversize_after_hello_ok(self) -> None:
        p = opened(reply={"max_frame": 16384})
        sid = p.open(ECHO)
        self.assertEqual(p.receive(header(16384, sid, DATA)), [])
        p = opened(reply={"max_frame": 16384})
        sid = p.open(ECHO)
        f = failed(p.receive(header(16385, sid, DATA)))
        self.assertEqual(f.error.errno, 90)
        self.assertEqual(f.streams, [sid])
        for n in (0xFFFFFFFF, 1 << 24):
            p = opened()
            f = failed(p.receive(header(n, 0, PING)))
            self.assertEqual(f.error.message, f"frame of {n} bytes exceeds the limit of {1 << 20}")

    def test_the_length_is_checked_first(self) -> None:
        p = opened()
        f = failed(p.receive(header(1 << 21, 0, 0, 0, 7)))  # too long, type 0, reserved set
        self.assertEqual(f.error.errno, 90)
        p = opened()
        f = failed(p.receive(header(10, 0, 200, 0, 1)))  # reserved set and unknown type
        self.assertEqual(f.error.message, "malformed frame header")

    def test_malformed(self) -> None:
        for hdr in (header(5, 0, 0), header(0, 1, 0), header(5, 0, PING, 0, 1), header(0, 1, DATA, 0, 0x8000)):
            p = opened()
            p.open(ECHO)
            f = failed(p.receive(hdr))  # no payload needed to tell
            self.assertEqual((f.error.errno, f.error.errno_name, f.error.message), (71, "EPROTO", "malformed frame header"))
            self.assertIsInstance(f.error, E.SandboxProtocolError)

    def test_unknown_type(self) -> None:
        for t in range(12, 256):
            p = opened()
            p.open(ECHO)
            f = failed(p.receive(header(4, 1, t)))
            self.assertEqual((f.error.errno, f.error.message), (71, f"unknown frame type {t}"))

    def test_unknown_type_before_hello_ok(self) -> None:
        p = P.Protocol()
        p.start()
        f = failed(p.receive(header(0, 0, 12)))
        self.assertEqual(f.error.message, "unknown frame type 12")

    def test_garbage(self) -> None:
        # text where a header should be: its first 4 bytes make a huge length
        p = opened()
        p.open(ECHO)
        f = failed(p.receive(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
        self.assertEqual(f.error.errno, 90)
        self.assertEqual(p.receive(b"more"), [])
        # random bytes: a connection error (never an exception), then nothing
        rnd = random.Random(1)
        for i in range(300):
            data = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(12, 200)))
            if i % 3 == 0:
                data = header(rnd.randrange(0, 64), rnd.choice([0, 1, 2, 3]), rnd.randrange(0, 14)) + data
            p = opened()
            p.open(ECHO)
            evs: List[Any] = []
            for k in range(0, len(data), 7):
                evs += p.receive(data[k:k + 7])
            evs += p.receive_eof()
            fails = [e for e in evs if isinstance(e, P.ConnectionFailed)]
            self.assertEqual(len(fails), 1, data.hex())
            self.assertIs(evs[-1], fails[0])
            self.assertIn(fails[0].error.errno, (90, 71, 74, 104), data.hex())
            self.assertIsInstance(fails[0].error, E.SandboxError)


class Streams(unittest.TestCase):
    def test_ids_odd_increasing(self) -> None:
        p = opened()
        ids = [p.open(ECHO) for _ in range(6)]
        self.assertEqual(ids, [1, 3, 5, 7, 9, 11])
        frames = all_frames(p.data_to_send())
        self.assertEqual([(f.stream, f.type, f.payload) for f in frames], [(i, REQUEST, b"\x12\x00") for i in ids])
        # ended streams do not give their id back
        p.receive(frame(1, END, 0, pb.Result(echo=pb.EchoReply(bytes=0)).encode()))
        self.assertEqual(p.open(ECHO), 13)

    def test_request_bytes(self) -> None:
        # PROTOCOL.md 2.2
        p = opened()
        self.assertEqual(p.open(ECHO), 1)
        self.assertEqual(p.open(pb.Request(info=pb.InfoRequest())), 3)
        self.assertEqual(p.data_to_send(), bytes.fromhex("00000002 00000001 03000000 1200"
                                                         "00000002 00000003 03000000 0a00"))

    def test_request_too_big(self) -> None:
        p = opened(reply={"max_frame": 16384})
        with self.assertRaises(E.SandboxError) as cm:
            p.open(pb.Request(read=pb.ReadRequest(path=b"/" * 20000)))
        self.assertEqual(cm.exception.errno, 90)
        self.assertEqual(p.data_to_send(), b"")

    def test_max_streams(self) -> None:
        p = opened(reply={"max_streams": 2})
        a = p.open(ECHO)
        self.assertTrue(p.can_open())
        b = p.open(ECHO)
        self.assertFalse(p.can_open())
        p.abandon(b)  # still in flight at the shim until its END/ERROR
        self.assertFalse(p.can_open())
        p.receive(frame(a, ERROR, 0, error_payload(125, "ECANCELED", "cancelled")))
        self.assertTrue(p.can_open())
        p.receive(frame(b, END, 0, pb.Result(done=pb.Done()).encode()))
        self.assertEqual(p.streams_in_flight(), 0)

    def test_unknown_stream(self) -> None:
        for sid, t, payload in [(2, DATA, b"x"), (4, END, b""), (3, DATA, b"x"), (999, WINDOW, u32(1)),
                                (5, EVENT, b""), (7, ERROR, error_payload(2)), (0xFFFFFFFF, CANCEL, b"")]:
            p = opened()
            p.open(ECHO)  # stream 1
            f = failed(p.receive(frame(sid, t, 0, payload)))
            self.assertEqual((f.error.errno, f.error.kind), (71, "protocol"), (sid, t))
            self.assertIsInstance(f.error, E.SandboxProtocolError)
            if sid != 0xFFFFFFFF:
                self.assertIn(f"unknown stream {sid}", f.error.message)
            self.assertEqual(f.streams, [1])

    def test_frame_for_an_ended_stream(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.receive(frame(sid, END, 0, pb.Result(done=pb.Done()).encode()))
        f = failed(p.receive(frame(sid, DATA, 0, b"late")))
        self.assertEqual(f.error.errno, 71)
        self.assertIn(f"stream {sid}", f.error.message)

    def test_client_only_frames_from_the_shim(self) -> None:
        for sid, t in [(1, REQUEST), (1, CANCEL), (1, HELLO), (0, HELLO), (0, REQUEST), (0, DATA), (1, PING),
                       (0, EVENT), (0, END), (0, WINDOW), (1, HELLO_OK), (1, PONG)]:
            p = opened()
            p.open(ECHO)
            f = failed(p.receive(frame(sid, t, 0, b"")))
            self.assertEqual(f.error.errno, 71, (sid, t))

    def test_data_beyond_credit(self) -> None:
        p = opened(initial_window=4096)
        sid = p.open(ECHO)
        f = failed(p.receive(frame(sid, DATA, 0, b"x" * 4097)))
        self.assertEqual((f.error.errno, f.error.kind), (71, "protocol"))
        self.assertIn(f"flow control violated on stream {sid}", f.error.message)
        # the credit, exactly; then one byte more
        p = opened(initial_window=4096)
        sid = p.open(ECHO)
        (d,) = p.receive(frame(sid, DATA, 0, b"x" * 4000))
        (d,) = p.receive(frame(sid, DATA, 0, b"x" * 96))
        (d,) = p.receive(frame(sid, DATA, 0, b""))  # an empty DATA takes no credit
        f = failed(p.receive(frame(sid, DATA, 0, b"y")))
        self.assertIn("flow control violated", f.error.message)
        # with a FIN too
        p = opened(initial_window=4096)
        sid = p.open(ECHO)
        p.receive(frame(sid, DATA, 0, b"x" * 4096))
        (d,) = p.receive(frame(sid, DATA, FIN))
        self.assertTrue(d.fin)

    def test_extra_window(self) -> None:
        p = opened(initial_window=4096)
        sid = p.open(ECHO, extra_window=10000)
        frames = all_frames(p.data_to_send())
        self.assertEqual([(f.type, f.payload) for f in frames], [(REQUEST, b"\x12\x00"), (WINDOW, u32(10000))])
        (d,) = p.receive(frame(sid, DATA, 0, b"x" * 14096))
        failed(p.receive(frame(sid, DATA, 0, b"x")))

    def test_extra_window_never_beyond_max_credit(self) -> None:
        p = opened(initial_window=MAXC)
        sid = p.open(ECHO, extra_window=1 << 20)
        for f in all_frames(p.data_to_send()):
            self.assertNotEqual(f.type, WINDOW, "a WINDOW beyond 2^31-1 of credit")
        p = opened(initial_window=MAXC - 10)
        sid = p.open(ECHO, extra_window=1 << 20)
        wins = [f for f in all_frames(p.data_to_send()) if f.type == WINDOW]
        self.assertEqual([w.payload for w in wins], [u32(10)])
        self.assertEqual(sid, 1)

    def test_data_after_fin(self) -> None:
        for second in (b"more", b""):
            p = opened()
            sid = p.open(ECHO)
            (d,) = p.receive(frame(sid, DATA, FIN, b"abc"))
            self.assertEqual((d.data, d.fin), (b"abc", True))
            f = failed(p.receive(frame(sid, DATA, 0, second)))
            self.assertEqual(f.error.errno, 71)
            self.assertIn(f"DATA after FIN on stream {sid}", f.error.message)

    def test_stderr_flag(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        evs = p.receive(frame(sid, DATA, STDERR, b"e") + frame(sid, DATA, 0, b"o") + frame(sid, DATA, FIN))
        self.assertEqual([(e.data, e.stderr, e.fin) for e in evs], [(b"e", True, False), (b"o", False, False),
                                                                    (b"", False, True)])


class Windows(unittest.TestCase):
    def test_bad_window(self) -> None:
        for payload, what in [(b"", "0 bytes"), (b"\x00\x01\x00", "3 bytes"), (b"\x00\x00\x01\x00\x00", "5 bytes"),
                              (u32(0), "increment 0")]:
            p = opened()
            sid = p.open(ECHO)
            f = failed(p.receive(frame(sid, WINDOW, 0, payload)))
            self.assertEqual((f.error.errno, f.error.kind), (71, "protocol"), what)

    def test_window_overflow(self) -> None:
        p = opened(reply={"initial_window": 262144})
        sid = p.open(ECHO)
        (ev,) = p.receive(window(sid, MAXC - 262144))  # exactly 2^31-1 of credit
        self.assertIsInstance(ev, P.CreditAvailable)
        self.assertEqual(p.send_credit(sid), MAXC)
        f = failed(p.receive(window(sid, 1)))
        self.assertEqual(f.error.errno, 71)
        p = opened()
        sid = p.open(ECHO)
        failed(p.receive(window(sid, 0xFFFFFFFF)))
        p = opened()
        sid = p.open(ECHO)
        failed(p.receive(window(sid, 2**31)))


class Ping(unittest.TestCase):
    def test_pong_with_the_same_payload(self) -> None:
        p = opened()
        for payload in (b"", b"\x00", b"12345678", bytes(range(64))):
            self.assertEqual(p.receive(frame(0, PING, 0, payload)), [])
            self.assertEqual(p.data_to_send(), frame(0, PONG, 0, payload))

    def test_ping_too_big(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        f = failed(p.receive(frame(0, PING, 0, bytes(65))))
        self.assertEqual((f.error.errno, f.error.kind), (71, "protocol"))
        self.assertEqual(f.streams, [sid])
        self.assertNotIn(PONG, [x.type for x in all_frames(p.data_to_send())])

    def test_our_ping(self) -> None:
        p = opened()
        p.ping(b"abcdefgh")
        self.assertEqual(p.data_to_send(), frame(0, PING, 0, b"abcdefgh"))
        (ev,) = p.receive(frame(0, PONG, 0, b"abcdefgh"))
        self.assertEqual(ev.payload, b"abcdefgh")
        with self.assertRaises(ValueError):
            p.ping(bytes(65))


class Payloads(unittest.TestCase):
    def test_unknown_fields_in_result(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        # END Result{echo: {bytes: 5}} (PROTOCOL.md 2.2), then fields from the future: in the
        # Result (field 1000 varint, field 1001 bytes) and inside EchoReply (field 7 fixed64)
        end = bytes.fromhex("00000004 00000001 06000000 12020805")
        (ev,) = p.receive(end)
        self.assertEqual((ev.stream, ev.result.which_kind(), ev.result.echo.bytes), (sid, "echo", 5))
        # the same END with an unknown field (1000, varint 1) appended to its payload
        p = opened()
        sid = p.open(ECHO)
        (ev,) = p.receive(bytes.fromhex("00000007 00000001 06000000 12020805 c03e01"))
        self.assertEqual((ev.stream, ev.result.which_kind(), ev.result.echo.bytes), (sid, "echo", 5))
        p = opened()
        sid = p.open(ECHO)
        inner = bytes.fromhex("0805") + bytes.fromhex("39") + bytes(8)
        payload = bytes.fromhex("12") + bytes([len(inner)]) + inner + bytes.fromhex("c03e01") + bytes.fromhex("ca3e03616263")
        (ev,) = p.receive(frame(sid, END, 0, payload))
        self.assertIsInstance(ev, P.StreamEnd)
        self.assertEqual(ev.result.echo.bytes, 5)

    def test_unknown_fields_in_error(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        payload = error_payload(2, "ENOENT", "open", b"/x") + bytes.fromhex("c03e01")
        (ev,) = p.receive(frame(sid, ERROR, 0, payload))
        self.assertIsInstance(ev.error, FileNotFoundError)

    def test_unknown_event_kind(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        evs = p.receive(frame(sid, EVENT, 0, bytes.fromhex("9a0603010203"))   # field 99, bytes
                        + frame(sid, EVENT, 0, bytes.fromhex("f8ff0301"))      # field 65535, varint
                        + frame(sid, EVENT, 0, b"")                            # no field at all
                        + frame(sid, DATA, 0, b"still here"))
        self.assertEqual([type(e) for e in evs], [P.StreamEvent] * 3 + [P.Data])
        for e in evs[:3]:
            self.assertIsNone(e.event.which_kind())
        self.assertTrue(p.is_open)
        # a known kind with an unknown field inside
        started = pb.Event(started=pb.ProcessStarted(id="p1", pid=7)).encode() + bytes.fromhex("c03e01")
        (ev,) = p.receive(frame(sid, EVENT, 0, started))
        self.assertEqual((ev.event.which_kind(), ev.event.started.pid), ("started", 7))

    def test_undecodable_payload(self) -> None:
        for t, payload in [(END, b"\x12\x05\x08"), (ERROR, b"\x12\x01x"), (EVENT, b"\xff")]:
            p = opened()
            sid = p.open(ECHO)
            f = failed(p.receive(frame(sid, t, 0, payload)))
            self.assertEqual((f.error.errno, f.error.kind), (74, "protocol"), t)


class Errors(unittest.TestCase):
    def test_connection_error_before_hello_ok(self) -> None:
        p = P.Protocol()
        p.start()
        p.data_to_send()
        f = failed(p.receive(frame(0, ERROR, 0, error_payload(13, "EACCES", "token required"))))
        e = f.error
        self.assertEqual((e.errno, e.errno_name, e.message, e.kind), (13, "EACCES", "token required", "connect"))
        self.assertIsInstance(e, E.SandboxConnectionError)
        self.assertEqual(f.streams, [])
        self.assertFalse(p.is_open)
        # as the first frame read, before our HELLO is even answered (PROTOCOL.md 5)
        p = P.Protocol()
        p.start()
        f = failed(p.receive(frame(0, ERROR, 0, error_payload(11, None, "too many connections (limit 2)"))))
        self.assertEqual((f.error.errno, f.error.errno_name, f.error.kind), (11, "EAGAIN", "connect"))

    def test_connection_error_after_hello_ok(self) -> None:
        p = opened()
        ids = [p.open(ECHO) for _ in range(4)]
        p.abandon(ids[1])  # nobody waits for it: not listed
        p.receive(frame(ids[2], END, 0, pb.Result(done=pb.Done()).encode()))
        f = failed(p.receive(frame(0, ERROR, 0, error_payload(71, "EPROTO", "bad frame from the client"))))
        e = f.error
        self.assertEqual((e.errno, e.errno_name, e.message, e.kind), (71, "EPROTO", "bad frame from the client", "remote"))
        self.assertIsInstance(e, E.SandboxError)
        self.assertEqual(sorted(f.streams), [ids[0], ids[3]])

    def test_stream_error_classes(self) -> None:
        cases = [
            (2, "ENOENT", b"/nope", E.SandboxFileNotFoundError, FileNotFoundError),
            (13, "EACCES", b"/root", E.SandboxPermissionError, PermissionError),
            (21, None, b"/dir", E.SandboxIsADirectoryError, IsADirectoryError),
            (125, "ECANCELED", None, E.SandboxAbortError, E.SandboxError),
            (38, "ENOSYS", None, E.SandboxUnsupportedError, OSError),
            (110, "ETIMEDOUT", None, E.SandboxTimeoutError, TimeoutError),
        ]
        for code, name, path, cls, builtin in cases:
            p = opened()
            sid = p.open(ECHO)
            (ev,) = p.receive(frame(sid, ERROR, 0, error_payload(code, name, "what failed", path)))
            self.assertIsInstance(ev, P.StreamError)
            e = ev.error
            self.assertIsInstance(e, cls)
            self.assertIsInstance(e, builtin)
            self.assertEqual((e.errno, e.errno_name, e.message, e.kind), (code, E.errno_name(code), "what failed", "remote"))
            self.assertEqual(e.path, None if path is None else path.decode())
            self.assertIsInstance(e.path, (str, type(None)))
            self.assertFalse(p.has_stream(sid))
            self.assertTrue(p.is_open)  # the connection goes on

    def test_error_path_not_utf8(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        (ev,) = p.receive(frame(sid, ERROR, 0, error_payload(2, "ENOENT", "lstat", b"/tmp/\xff\xfe")))
        self.assertIsInstance(ev.error.path, str)
        self.assertEqual(ev.error.path.encode("utf-8", "surrogateescape"), b"/tmp/\xff\xfe")
        self.assertEqual(ev.error.filename, ev.error.path)

    def test_unknown_errno(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        (ev,) = p.receive(frame(sid, ERROR, 0, error_payload(4000, None, "odd")))
        self.assertIs(type(ev.error), E.SandboxError)
        self.assertEqual((ev.error.errno, ev.error.errno_name), (4000, None))

    def test_worked_example_error(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        (ev,) = p.receive(bytes.fromhex("00000018 00000001 07000000 087d1209 4543414e 43454c45 441a0963 616e6365 6c6c6564"))
        self.assertEqual((ev.stream, ev.error.errno, ev.error.errno_name, ev.error.message), (sid, 125, "ECANCELED", "cancelled"))
        self.assertIsInstance(ev.error, E.SandboxAbortError)

    def test_eof(self) -> None:
        p = opened()
        a = p.open(ECHO)
        b = p.open(ECHO)
        f = failed(p.receive_eof())
        self.assertEqual((f.error.errno, sorted(f.streams)), (104, [a, b]))
        self.assertIsInstance(f.error, E.SandboxConnectionError)
        # in the middle of a frame
        p = opened()
        a = p.open(ECHO)
        self.assertEqual(p.receive(frame(a, DATA, 0, b"x" * 100)[:50]), [])
        f = failed(p.receive_eof())
        self.assertEqual((f.error.errno, f.error.kind, f.streams), (71, "protocol", [a]))
        self.assertIn("truncated frame", f.error.message)
        # in the middle of a header
        p = opened()
        p.open(ECHO)
        p.receive(b"\x00\x00")
        self.assertEqual(failed(p.receive_eof()).error.errno, 71)

    def test_dead_after_failure(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        f = failed(p.receive(frame(0, PING, 0, bytes(65))))
        self.assertEqual(p.receive(frame(sid, DATA, 0, b"x")), [])
        self.assertEqual(p.receive(hello_ok()), [])
        self.assertEqual(p.receive_eof(), [])
        self.assertEqual(p.fail(E.SandboxError("again")), [])
        self.assertFalse(p.is_open)
        self.assertFalse(p.has_stream(sid))
        with self.assertRaises(E.SandboxProtocolError) as cm:
            p.open(ECHO)
        self.assertIs(cm.exception, f.error)
        with self.assertRaises(E.SandboxError):
            p.ping(b"")
        self.assertEqual(p.send_data(sid, b"dropped"), 7)

    def test_fail(self) -> None:
        p = opened()
        a = p.open(ECHO)
        err = E.SandboxConnectionError("closed", errno=103, kind="local")
        f = failed(p.fail(err))
        self.assertIs(f.error, err)
        self.assertEqual(f.streams, [a])


class SendSide(unittest.TestCase):
    def test_worked_example_data(self) -> None:
        # PROTOCOL.md 2.2: "hello" on stream 1, then an empty DATA with FIN
        p = opened()
        sid = p.open(ECHO)
        p.data_to_send()
        self.assertEqual(p.send_data(sid, b"hello"), 5)
        self.assertEqual(p.send_data(sid, b"", fin=True), 0)
        self.assertEqual(p.data_to_send(), bytes.fromhex("00000005 00000001 04 00 0000 68656c6c6f"
                                                         "00000000 00000001 04 01 0000"))
        with self.assertRaises(RuntimeError):
            p.send_data(sid, b"x")
        self.assertEqual(p.send_credit(sid), 0)

    def test_fin_with_the_last_byte(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.data_to_send()
        self.assertEqual(p.send_data(sid, b"bye", fin=True), 3)
        self.assertEqual(p.data_to_send(), frame(sid, DATA, FIN, b"bye"))

    def test_credit(self) -> None:
        # the flow-control worked example of PROTOCOL.md 8 (64 KiB frames, 256 KiB window)
        p = opened(reply={"initial_window": 262144})
        sid = p.open(ECHO)
        p.data_to_send()
        chunk = bytes(65536)
        for _ in range(4):
            self.assertEqual(p.send_data(sid, chunk), 65536)
        self.assertEqual(p.send_credit(sid), 0)
        self.assertEqual(p.send_data(sid, chunk), 0)  # must stop
        frames = all_frames(p.data_to_send())
        self.assertEqual([len(f.payload) for f in frames], [65536] * 4)
        (ev,) = p.receive(window(sid, 131072))
        self.assertIsInstance(ev, P.CreditAvailable)
        self.assertEqual(ev.stream, sid)
        self.assertEqual(p.send_data(sid, chunk), 65536)
        self.assertEqual(p.send_data(sid, chunk), 65536)
        self.assertEqual(p.send_credit(sid), 0)
        p.receive(window(sid, 65536))
        self.assertEqual(p.send_data(sid, bytes(40000), fin=True), 40000)
        self.assertEqual(p.send_credit(sid), 0)  # our direction is over
        frames = all_frames(p.data_to_send())
        self.assertEqual([(len(f.payload), f.flags) for f in frames], [(65536, 0), (65536, 0), (40000, FIN)])

    def test_partial_take_holds_the_fin(self) -> None:
        p = opened(reply={"initial_window": 10000})
        sid = p.open(ECHO)
        p.data_to_send()
        data = bytes(range(256)) * 100  # 25600 bytes
        took = p.send_data(sid, data, fin=True)
        self.assertEqual(took, 10000)
        frames = all_frames(p.data_to_send())
        self.assertEqual(b"".join(f.payload for f in frames), data[:10000])
        self.assertTrue(all(f.flags == 0 for f in frames))
        p.receive(window(sid, 20000))
        took2 = p.send_data(sid, memoryview(data)[took:], fin=True)
        self.assertEqual(took2, 15600)
        frames = all_frames(p.data_to_send())
        self.assertEqual(b"".join(f.payload for f in frames), data[10000:])
        self.assertEqual(frames[-1].flags, FIN)
        self.assertTrue(all(f.flags == 0 for f in frames[:-1]))

    def test_empty_fin_at_zero_credit(self) -> None:
        p = opened(reply={"initial_window": 4096})
        sid = p.open(ECHO)
        p.data_to_send()
        self.assertEqual(p.send_data(sid, bytes(4096)), 4096)
        self.assertEqual(p.send_data(sid, b"", fin=True), 0)
        frames = all_frames(p.data_to_send())
        self.assertEqual([(len(f.payload), f.flags) for f in frames], [(4096, 0), (0, FIN)])

    def test_frames_never_exceed_max_frame(self) -> None:
        for mf in (16384, 65536, 1 << 20):
            p = opened(reply={"max_frame": mf, "initial_window": 3 << 20})
            sid = p.open(ECHO)
            p.data_to_send()
            data = bytes(random.Random(mf).getrandbits(8) for _ in range(100)) * 25000  # 2.5 MB
            took = p.send_data(sid, bytearray(data), fin=True)
            self.assertEqual(took, len(data))
            frames = all_frames(p.data_to_send())
            self.assertTrue(all(len(f.payload) <= mf for f in frames), mf)
            self.assertEqual(b"".join(f.payload for f in frames), data)
            self.assertEqual([f.flags for f in frames], [0] * (len(frames) - 1) + [FIN])

    def test_send_on_ended_stream(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.receive(frame(sid, ERROR, 0, error_payload(2)))
        p.data_to_send()
        self.assertEqual(p.send_data(sid, b"late"), 4)  # dropped: the ERROR said what happened
        self.assertEqual(p.data_to_send(), b"")
        self.assertEqual(p.send_credit(sid), 0)


class Consumed(unittest.TestCase):
    def test_window_at_half(self) -> None:
        # PROTOCOL.md 2.2: WINDOW +65536 on stream 1
        p = opened(initial_window=131072)
        sid = p.open(ECHO)
        p.data_to_send()
        p.receive(frame(sid, DATA, 0, bytes(65536)))
        p.consumed(sid, 65535)
        self.assertEqual(p.data_to_send(), b"")
        p.consumed(sid, 1)
        self.assertEqual(p.data_to_send(), bytes.fromhex("00000004 00000001 09000000 00010000"))

    def test_credit_keeps_flowing(self) -> None:
        # a receiver that consumes everything never runs the shim out of credit
        p = opened()
        sid = p.open(ECHO)
        p.data_to_send()
        credit = 256 << 10  # as the shim sees it
        total = 0
        for _ in range(100):
            n = min(65536, credit)
            self.assertGreater(n, 0)
            (d,) = p.receive(frame(sid, DATA, 0, bytes(n)))
            credit -= n
            total += n
            p.consumed(sid, n)
            for f in all_frames(p.data_to_send()):
                self.assertEqual((f.type, f.stream), (WINDOW, sid))
                credit += int.from_bytes(f.payload, "big")
            self.assertLessEqual(credit, 256 << 10)
        self.assertEqual(total, 100 * 65536)

    def test_never_beyond_max_credit(self) -> None:
        p = opened(initial_window=MAXC)
        sid = p.open(ECHO)
        p.data_to_send()
        p.receive(frame(sid, DATA, 0, bytes(1000)))
        p.consumed(sid, 2**30 + 5)  # more than was ever sent
        wins = [f for f in all_frames(p.data_to_send()) if f.type == WINDOW]
        self.assertEqual([int.from_bytes(w.payload, "big") for w in wins], [1000])

    def test_no_window_after_fin_or_end(self) -> None:
        p = opened(initial_window=8192)
        sid = p.open(ECHO)
        p.data_to_send()
        p.receive(frame(sid, DATA, FIN, bytes(8192)))
        p.consumed(sid, 8192)
        self.assertEqual(p.data_to_send(), b"")
        p.receive(frame(sid, END, 0, pb.Result(done=pb.Done()).encode()))
        p.consumed(sid, 8192)
        p.consumed(12345, 10)
        self.assertEqual(p.data_to_send(), b"")


class Cancel(unittest.TestCase):
    def test_cancel_once(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.data_to_send()
        p.cancel(sid)
        p.cancel(sid)
        self.assertEqual(p.data_to_send(), bytes.fromhex("00000000 00000001 08000000"))
        # the stream stays until its END or ERROR, and DATA still comes through
        self.assertTrue(p.has_stream(sid))
        (d,) = p.receive(frame(sid, DATA, 0, b"late"))
        self.assertEqual(d.data, b"late")
        self.assertEqual(p.send_data(sid, b"dropped"), 7)
        self.assertEqual(p.data_to_send(), b"")
        (ev,) = p.receive(frame(sid, ERROR, 0, error_payload(125, "ECANCELED", "cancelled")))
        self.assertIsInstance(ev.error, E.SandboxAbortError)
        p.cancel(sid)  # ended: nothing to cancel
        p.cancel(999)
        self.assertEqual(p.data_to_send(), b"")

    def test_cancel_then_end(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.cancel(sid)
        (ev,) = p.receive(frame(sid, END, 0, pb.Result(echo=pb.EchoReply(bytes=0)).encode()))
        self.assertIsInstance(ev, P.StreamEnd)  # it had finished already: either answer is fine

    def test_abandon(self) -> None:
        p = opened(initial_window=8192)
        a = p.open(ECHO)
        b = p.open(ECHO)
        p.data_to_send()
        p.abandon(a)
        p.abandon(a)
        self.assertEqual(p.data_to_send(), frame(a, CANCEL))
        # what still comes for it makes no events, but its credit keeps flowing
        credit = 8192
        evs: List[Any] = []
        for i in range(40):
            n = min(3000, credit)
            evs += p.receive(frame(a, DATA, 0, bytes(n)) + frame(a, EVENT, 0, b"") + window(a, 100))
            credit -= n
            for f in all_frames(p.data_to_send()):
                self.assertEqual((f.type, f.stream), (WINDOW, a))
                credit += int.from_bytes(f.payload, "big")
            self.assertGreater(credit, 0, i)
        evs += p.receive(frame(a, DATA, FIN, b""))
        evs += p.receive(frame(b, DATA, 0, b"for b"))
        evs += p.receive(frame(a, END, 0, pb.Result(echo=pb.EchoReply(bytes=0)).encode()))
        self.assertEqual([norm(e) for e in evs], [("Data", b, b"for b", False, False)])
        self.assertFalse(p.has_stream(a))
        self.assertEqual(p.data_to_send(), b"")
        # its ERROR would be swallowed just the same; and it is not listed when the connection dies
        c = p.open(ECHO)
        p.abandon(c)
        f = failed(p.receive_eof())
        self.assertEqual(f.streams, [b])

    def test_abandon_after_cancel(self) -> None:
        p = opened()
        sid = p.open(ECHO)
        p.cancel(sid)
        p.data_to_send()
        p.abandon(sid)
        self.assertEqual(p.data_to_send(), b"")  # one CANCEL only
        self.assertEqual(p.receive(frame(sid, ERROR, 0, error_payload(125))), [])
        self.assertFalse(p.has_stream(sid))

    def test_abandoned_stream_still_checked(self) -> None:
        p = opened(initial_window=4096)
        sid = p.open(ECHO)
        p.abandon(sid)
        f = failed(p.receive(frame(sid, DATA, 0, bytes(4097))))
        self.assertIn("flow control violated", f.error.message)
        self.assertEqual(f.streams, [])


if __name__ == "__main__":
    unittest.main()
