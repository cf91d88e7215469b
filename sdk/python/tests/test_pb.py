"""The generated protobuf codec (sandbox_shim/_pb.py) and its generator (tools/gen_pb.py):
PROTOCOL.md's worked examples, round trips of every message, malformed input, encode
errors, a cross-check against protoc when it is installed, and --check.
No daemon and no libsbx needed."""

from __future__ import annotations

import ast
import enum
import glob
import importlib.util
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)  # sdk/python
ROOT = os.path.dirname(os.path.dirname(PKG))
PROTO = os.path.join(ROOT, "proto", "shim.proto")
PB_PATH = os.path.join(PKG, "src", "sandbox_shim", "_pb.py")
GEN = os.path.join(PKG, "tools", "gen_pb.py")
sys.path.insert(0, os.path.join(PKG, "src"))


def load(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


try:
    from sandbox_shim import _pb as pb
except Exception:  # the package's __init__ wants libsbx; _pb itself needs nothing
    pb = load(PB_PATH, "sandbox_shim_pb_test")

gen_pb = load(GEN, "gen_pb_test")

DecodeError, EncodeError = pb.DecodeError, pb.EncodeError


def h(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


# ---- sample messages, made from the field metadata ----

INTS = {
    "uint32": [0xDEADBEEF, 0, 1, 127, 128, 300, 0xFFFFFFFF],
    "uint64": [0xFFFFFFFFFFFFFFFF, 0, 1 << 35, 1 << 63, 16384],
    "int32": [-5, 0, -0x80000000, 0x7FFFFFFF, 1, -1],
    "int64": [-0x8000000000000000, 0x7FFFFFFFFFFFFFFF, 0, -1, 1 << 40],
}
DOUBLES = [1.25, 0.0, -1e300, float("inf"), 5e-324, -0.5]


def scalar(typ: str, name: str, seed: int) -> Any:
    if typ in INTS:
        vals = INTS[typ]
        return vals[seed % len(vals)]
    if typ == "bool":
        return seed % 2 == 0
    if typ == "double":
        return DOUBLES[seed % len(DOUBLES)]
    if typ == "string":
        return ["", f"{name}-{seed}", f"{name} \u00e9\u4e2d\U0001f600 {seed}", "x" * 200][seed % 4]
    if typ == "bytes":
        return [b"", bytes((seed & 0xFF,)) + b"\x00\xff" + name.encode(), bytes(range(256)) * 2][seed % 3]
    raise AssertionError(typ)


def enum_value(typ: str, seed: int, unknown: bool) -> int:
    values = sorted(getattr(pb, typ + "_NAMES"))
    if unknown and seed % 5 == 4:
        return 1000 + seed  # not in the enum: kept as it is
    return values[seed % len(values)]


def sample(cls: type, seed: int, member: Dict[str, str] = {}, unknown_enums: bool = True, depth: int = 0) -> Any:
    """cls with every field filled (of each oneof: the member named in `member`, else the
    first), values varying with seed."""
    kw: Dict[str, Any] = {}
    for number, name, label, kind, typ, oneof in cls._FIELDS:
        if oneof is not None and name != member.get(oneof, cls._ONEOFS[oneof][0]):
            continue

        def one(i: int) -> Any:
            s = seed + number * 7 + i
            if kind == "scalar":
                return scalar(typ, name, s)
            if kind == "enum":
                return enum_value(typ, s, unknown_enums)
            return sample(pb.MESSAGES[typ], s, {}, unknown_enums, depth + 1)

        kw[name] = [one(i) for i in range(3)] if label == "repeated" else one(0)
    return cls(**kw)


def variants(cls: type) -> List[Dict[str, str]]:
    """One member choice per member of the class's (first) oneof; [{}] without oneofs."""
    if not cls._ONEOFS:
        return [{}]
    out = []
    for oneof, members in cls._ONEOFS.items():
        out += [{oneof: m} for m in members]
    return out


def all_samples(unknown_enums: bool = True) -> List[Any]:
    out = []
    for cls in pb.MESSAGES.values():
        for member in variants(cls):
            for seed in range(3):
                out.append(sample(cls, seed, member, unknown_enums))
    return out


def minimal(cls: type) -> Any:
    """cls with its required fields only (and nothing else)."""
    kw = {}
    for number, name, label, kind, typ, oneof in cls._FIELDS:
        if label == "required":
            if kind == "scalar":
                kw[name] = scalar(typ, name, 1)
            elif kind == "enum":
                kw[name] = 0
            else:
                kw[name] = minimal(pb.MESSAGES[typ])
    return cls(**kw)


# ---- PROTOCOL.md §2 ----


class WorkedExamples(unittest.TestCase):
    def test_protocol_md(self) -> None:
        cases = [
            (pb.Hello(protocol_version=1, client_name="x"), "08 01 12 01 78"),
            (pb.Request(echo=pb.EchoRequest()), "12 00"),
            (pb.Request(info=pb.InfoRequest()), "0a 00"),
            (pb.Result(echo=pb.EchoReply(bytes=5)), "12 02 08 05"),
            (pb.Error(errno_num=125, errno_name="ECANCELED", message="cancelled"),
             "08 7d 12 09 45 43 41 4e 43 45 4c 45 44 1a 09 63 61 6e 63 65 6c 6c 65 64"),
        ]
        for msg, wire in cases:
            with self.subTest(msg=msg):
                self.assertEqual(msg.encode(), h(wire))
                self.assertEqual(type(msg).decode(h(wire)), msg)

    def test_which(self) -> None:
        self.assertEqual(pb.Request.decode(h("12 00")).which_kind(), "echo")
        self.assertIsNone(pb.Request.decode(b"").which_kind())
        stat = pb.Result(stat=minimal(pb.FileStat)).encode()
        self.assertEqual(pb.Result.decode(stat).which_kind(), "stat")
        self.assertEqual(pb.Event(progress=pb.Progress()).which_kind(), "progress")

    def test_field_order_and_empty_members(self) -> None:
        # fields go out in number order whatever the declaration order; an empty message
        # member of a oneof is still written, an empty optional string too
        self.assertEqual(pb.Result(done=pb.Done()).encode(), h("4a 00"))
        self.assertEqual(pb.Hello(protocol_version=0, client_name="").encode(), h("08 00 12 00"))
        self.assertEqual(pb.Request().encode(), b"")


# ---- round trips ----


class RoundTrip(unittest.TestCase):
    def test_every_message(self) -> None:
        n = 0
        for msg in all_samples():
            with self.subTest(msg=type(msg).__name__):
                b = msg.encode()
                back = type(msg).decode(b)
                self.assertEqual(back, msg)
                self.assertEqual(back.encode(), b)  # canonical: same bytes again
                self.assertEqual(type(msg).decode(bytearray(b)), msg)
                self.assertEqual(type(msg).decode(memoryview(b)), msg)
                n += 1
        self.assertGreater(n, 3 * len(pb.MESSAGES))

    def test_every_field_alone(self) -> None:
        # each optional / repeated field on top of the required ones, decoded back to
        # exactly that field: a wrong tag would land it elsewhere or in unknown fields
        for cls in pb.MESSAGES.values():
            full = sample(cls, 1)
            for number, name, label, kind, typ, oneof in cls._FIELDS:
                if label == "required":
                    continue
                msg = minimal(cls)
                setattr(msg, name, getattr(full, name) if getattr(full, name) is not None
                        else getattr(sample(cls, 1, {oneof: name}), name))
                with self.subTest(cls=cls.__name__, field=name):
                    self.assertEqual(cls.decode(msg.encode()), msg)

    def test_empty_messages(self) -> None:
        for cls in pb.MESSAGES.values():
            if not cls._FIELDS:
                self.assertEqual(cls().encode(), b"")
                self.assertEqual(cls.decode(b""), cls())

    def test_types_after_decode(self) -> None:
        msg = sample(pb.ExecRequest, 1)
        back = pb.ExecRequest.decode(bytearray(msg.encode()))
        self.assertIs(type(back.argv), list)
        self.assertTrue(all(type(a) is bytes for a in back.argv))
        self.assertIs(type(back.cwd), bytes)
        self.assertIs(type(back.user), str)
        self.assertIs(type(back.pty), bool)
        self.assertIs(type(back.rlimits[0]), pb.Rlimit)
        st = pb.InfoReply.decode(sample(pb.InfoReply, 0).encode())
        self.assertIs(type(st.load1), float)

    def test_defaults(self) -> None:
        a, b = pb.ExecRequest(), pb.ExecRequest()
        self.assertEqual(a.argv, [])
        self.assertIsNot(a.argv, b.argv)
        self.assertIsNone(a.shell)
        self.assertEqual(pb.ExecRequest(argv=(x for x in [b"a", b"b"])).argv, [b"a", b"b"])
        with self.assertRaises(TypeError):
            pb.ExecRequest(argv=b"ls")  # would be split into bytes
        with self.assertRaises(TypeError):
            pb.Hello(protocol_version=1, bogus=2)  # type: ignore[call-arg]
        with self.assertRaises(TypeError):
            pb.Hello(1)  # type: ignore[misc]  # keyword-only
        with self.assertRaises(AttributeError):
            pb.Hello().bogus = 1  # type: ignore[attr-defined]  # __slots__

    def test_negative_int32(self) -> None:
        for msg, field in ((pb.ExecRequest(nice=-5), "nice"), (pb.Error(errno_num=-1), "errno_num")):
            b = msg.encode()
            number = type(msg)._FIELDS[[f[1] for f in type(msg)._FIELDS].index(field)][0]
            tag = pb.encode_varint(number << 3)
            self.assertEqual(b[:len(tag)], tag)
            self.assertEqual(len(b), len(tag) + 10, b.hex())  # a 10-byte varint
            self.assertEqual(b[-1], 0x01)
            self.assertEqual(getattr(type(msg).decode(b), field), getattr(msg, field))
        self.assertEqual(pb.Error(errno_num=-1).encode(), h("08 ff ff ff ff ff ff ff ff ff 01"))
        self.assertEqual(pb.Timestamp(sec=-1, nsec=0).encode(), h("08 ff ff ff ff ff ff ff ff ff 01 10 00"))

    def test_enums(self) -> None:
        self.assertEqual(pb.FileType.FILE_TYPE_DIRECTORY, 2)
        self.assertEqual(pb.FileType_NAMES[7], "FILE_TYPE_CHARACTER_DEVICE")
        self.assertEqual(pb.WatchEventType_NAMES[pb.WatchEventType.WATCH_DELETE_SELF], "WATCH_DELETE_SELF")
        for name, cls in pb.ENUMS.items():
            names = getattr(pb, name + "_NAMES")
            for num, vname in names.items():
                self.assertEqual(getattr(cls, vname), num)
        ev = pb.WatchEvent.decode(pb.WatchEvent(type=42).encode())
        self.assertEqual(ev.type, 42)  # unknown value kept

    def test_equality_and_repr(self) -> None:
        self.assertEqual(pb.Hello(protocol_version=1), pb.Hello(protocol_version=1))
        self.assertNotEqual(pb.Hello(protocol_version=1), pb.Hello(protocol_version=2))
        self.assertNotEqual(pb.ReadReply(bytes=1), pb.WriteReply(bytes=1))
        self.assertNotEqual(pb.Done(), pb.InfoRequest())
        self.assertNotEqual(pb.Hello(), None)
        self.assertEqual(pb.Done(), pb.Done())
        self.assertEqual(repr(pb.Hello(protocol_version=1, client_name="x")),
                         "Hello(protocol_version=1, client_name='x')")
        self.assertEqual(repr(pb.Request(stat=pb.StatRequest(path=b"/a"))),
                         "Request(stat=StatRequest(path=b'/a'))")
        m = pb.MountRequest(bucket="b", access_key_id="AKIAXXXX", secret_access_key=b"s3cr3t!",
                            session_token=b"SESS", path=b"/mnt")
        r = repr(pb.Request(mount=m))
        for secret in ("AKIAXXXX", "s3cr3t", "SESS"):
            self.assertNotIn(secret, r)
        self.assertIn("secret_access_key=<7 bytes>", r)
        self.assertIn("access_key_id=<8 bytes>", r)
        self.assertIn("session_token=<4 bytes>", r)
        self.assertIn("bucket='b'", r)
        self.assertEqual(repr(pb.Hello(token=b"abcd")), "Hello(token=<4 bytes>)")
        with self.assertRaises(TypeError):
            hash(pb.Done())


# ---- decoding: what protobuf allows, and what it refuses ----

UNKNOWN = {
    0: h("a0 06 96 01"),  # field 100, varint 150
    1: h("a9 06") + bytes(range(8)),  # field 101, fixed64
    2: h("b2 06 03 61 62 63"),  # field 102, "abc"
    5: h("bd 06 01 02 03 04"),  # field 103, fixed32
}


class Decoding(unittest.TestCase):
    def test_unknown_fields_skipped(self) -> None:
        hello = pb.Hello(protocol_version=1, client_name="x")
        a, b = h("08 01"), h("12 01 78")
        for wt, unk in UNKNOWN.items():
            with self.subTest(wire_type=wt):
                for data in (unk + a + b, a + unk + b, a + b + unk, unk + a + unk + b + unk):
                    self.assertEqual(pb.Hello.decode(data), hello)
        every = b"".join(UNKNOWN.values())
        self.assertEqual(pb.Hello.decode(a + every + b), hello)
        # inside an embedded message too, and a large field number (5-byte tag)
        ts = h("08 05") + every + h("10 06") + h("f8 ff ff ff 0f 01")
        st = minimal(pb.FileStat)
        st.atime = pb.Timestamp.decode(ts)
        self.assertEqual(st.atime, pb.Timestamp(sec=5, nsec=6))
        self.assertEqual(pb.InfoRequest.decode(every), pb.InfoRequest())

    def test_wrong_wire_type(self) -> None:
        cases = [
            (pb.Hello, h("0a 00")),  # uint32 as length-delimited
            (pb.Hello, h("0d 01 00 00 00")),  # uint32 as fixed32
            (pb.Hello, h("08 01 10 05")),  # string as varint
            (pb.Hello, h("08 01 19") + bytes(8)),  # string as fixed64
            (pb.StatRequest, h("0a 00 15 01 00 00 00")),  # bool as fixed32
            (pb.InfoReply, h("80 01 05")),  # double (field 16) as varint
            (pb.Request, h("50 00")),  # a message as varint
            (pb.Result, h("52 02 08 00")),  # FileStat.type as length-delimited inside
        ]
        for cls, data in cases:
            with self.subTest(cls=cls.__name__, data=data.hex()):
                with self.assertRaises(DecodeError):
                    cls.decode(data)

    def test_bad_wire_types(self) -> None:
        for tag in ("a3 06", "a4 06", "a6 06", "a7 06", "0b", "0c"):  # groups, 6, 7
            for cls in (pb.Hello, pb.InfoRequest, pb.Result):
                with self.subTest(cls=cls.__name__, tag=tag):
                    with self.assertRaises(DecodeError):
                        cls.decode(h(tag) + h("08 01"))
        for bad in ("00 00", "02 00", "80 80 80 80 80 01 00"):  # field number 0, tag > 32 bits
            with self.assertRaises(DecodeError):
                pb.InfoRequest.decode(h(bad))

    def test_missing_required(self) -> None:
        with self.assertRaisesRegex(DecodeError, r"Hello\.protocol_version"):
            pb.Hello.decode(h("12 01 78"))
        with self.assertRaisesRegex(DecodeError, r"FileStat\.\w+: required"):
            pb.Result.decode(h("52 00"))  # an empty FileStat inside
        for cls in pb.MESSAGES.values():
            required = [f for f in cls._FIELDS if f[2] == "required"]
            if required:
                with self.assertRaisesRegex(DecodeError, f"{cls.__name__}.{required[0][1]}"):
                    cls.decode(b"")
                b = minimal(cls).encode()
                self.assertEqual(cls.decode(b), minimal(cls))

    def test_last_wins(self) -> None:
        self.assertEqual(pb.Hello.decode(h("08 01 08 02")).protocol_version, 2)
        st = pb.StatRequest.decode(h("0a 01 61 10 01 0a 01 62"))
        self.assertEqual((st.path, st.follow), (b"b", True))
        # oneof: the member seen last wins, the one before is reset
        r = pb.Result.decode(pb.Result(echo=pb.EchoReply(bytes=1)).encode() + pb.Result(done=pb.Done()).encode())
        self.assertEqual(r.which_kind(), "done")
        self.assertIsNone(r.echo)
        r = pb.Result.decode(h("12 02 08 01 4a 00 12 02 08 07"))
        self.assertEqual((r.which_kind(), r.echo, r.done), ("echo", pb.EchoReply(bytes=7), None))
        # an embedded message seen twice replaces the first (protobuf would merge them)
        a = pb.Event(progress=pb.Progress(bytes=1)).encode()
        b = pb.Event(progress=pb.Progress(items=2)).encode()
        self.assertEqual(pb.Event.decode(a + b).progress, pb.Progress(items=2))

    def test_varint_widths(self) -> None:
        # uint32 from a longer varint: low 32 bits; int32: sign-extended from them
        self.assertEqual(pb.Hello.decode(h("08 85 80 80 80 10")).protocol_version, 5)  # 2**32 + 5
        self.assertEqual(pb.Error.decode(h("08 ff ff ff ff 0f")).errno_num, -1)  # 5-byte -1
        self.assertEqual(pb.Error.decode(h("08 ff ff ff ff 07")).errno_num, 0x7FFFFFFF)
        self.assertEqual(pb.Timestamp.decode(h("08 ff ff ff ff ff ff ff ff ff 01 10 00")).sec, -1)
        self.assertEqual(pb.EchoReply.decode(h("08 ff ff ff ff ff ff ff ff ff 01")).bytes, 2**64 - 1)
        self.assertIs(pb.StatRequest.decode(h("0a 00 10 02")).follow, True)  # any non-zero
        self.assertIs(pb.StatRequest.decode(h("0a 00 10 80 00")).follow, False)  # non-minimal 0
        self.assertEqual(pb.Hello.decode(h("08 81 80 80 80 80 80 80 80 80 00")).protocol_version, 1)
        with self.assertRaises(DecodeError):  # 11 bytes
            pb.Hello.decode(h("08 81 80 80 80 80 80 80 80 80 80 00"))

    def test_strings_and_bytes(self) -> None:
        e = pb.Error.decode(h("08 01 12 03 61 ff 62"))  # not UTF-8
        self.assertEqual(e.errno_name, "a\ufffdb")
        e = pb.Error.decode(memoryview(h("08 01 22 02 00 ff")))
        self.assertEqual(e.path, b"\x00\xff")
        self.assertIs(type(e.path), bytes)
        with self.assertRaises(TypeError):
            pb.Error.decode("08 01")  # type: ignore[arg-type]

    def test_length_past_end(self) -> None:
        for data in ("08 01 12 05 78", "08 01 12 80", "08 01 12 ff ff ff ff 0f 78"):
            with self.assertRaises(DecodeError):
                pb.Hello.decode(h(data))
        # a field inside an embedded message that runs past the embedded message's end
        # (though not past the buffer's)
        for inner in ("08 96", "08 01 10 01 1a 05 00", "0a 05 00 00"):
            data = h("52") + bytes((len(h(inner)),)) + h(inner) + h("00 00 00 00 00 00")
            with self.assertRaises(DecodeError, msg=inner):
                pb.Result.decode(data)
        with self.assertRaises(DecodeError):
            pb.InfoReply.decode(sample(pb.InfoReply, 0).encode()[:-3])  # a cut double

    def test_every_prefix(self) -> None:
        msgs = [
            sample(pb.Result, 1, {"kind": "stat"}),
            sample(pb.ExecRequest, 2),
            sample(pb.InfoReply, 0),
            sample(pb.Hello, 1),
            sample(pb.Event, 0, {"kind": "tunnel_ready"}),
            sample(pb.Result, 0, {"kind": "ps"}),
        ]
        for msg in msgs:
            cls = type(msg)
            b = msg.encode()
            decoded = 0
            for cut in range(len(b)):
                prefix = b[:cut]
                try:
                    part = cls.decode(prefix)
                except DecodeError:
                    continue
                # a prefix that decodes is itself a valid message: whole fields, every
                # required one present; our encoding being canonical, it re-encodes to itself
                self.assertEqual(part.encode(), prefix, f"{cls.__name__} cut at {cut}")
                decoded += 1
            self.assertLess(decoded, len(b))

    def test_random_bytes(self) -> None:
        rnd = random.Random(1234)
        seeds = [m.encode() for m in all_samples() if type(m) in (pb.Result, pb.Event)]
        ok = 0
        for i in range(6000):
            if i % 2:
                data = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(40)))
            else:  # a valid message, mutated
                data = bytearray(rnd.choice(seeds))
                for _ in range(rnd.randrange(1, 4)):
                    op = rnd.randrange(3)
                    p = rnd.randrange(len(data) + 1)
                    if op == 0 and data:
                        data[min(p, len(data) - 1)] = rnd.getrandbits(8)
                    elif op == 1:
                        data[p:p] = bytes((rnd.getrandbits(8),))
                    else:
                        del data[p:p + rnd.randrange(1, 4)]
                data = bytes(data)
            for cls in (pb.Result, pb.Event):
                try:
                    cls.decode(data)
                    ok += 1
                except DecodeError:
                    pass
        self.assertGreater(ok, 0)

    def test_delimited(self) -> None:
        entries = [pb.DirEntry(name=b"e%d" % i * i, stat=sample(pb.FileStat, i)) for i in range(5)]
        stream = b"".join(pb.encode_delimited(e) for e in entries)
        for buf in (stream, memoryview(stream), bytearray(stream)):
            pos, back = 0, []
            while pos < len(buf):
                part, pos = pb.read_delimited(buf, pos)
                self.assertIs(type(part), type(buf))
                back.append(pb.DirEntry.decode(part))
            self.assertEqual(back, entries)
        long = pb.PathReply(path=b"p" * 300)
        self.assertEqual(pb.encode_delimited(long)[:2], pb.encode_varint(len(long.encode())))
        with self.assertRaises(DecodeError):
            pb.read_delimited(pb.encode_delimited(entries[1])[:-1], 0)
        with self.assertRaises(DecodeError):
            pb.read_delimited(h("80"), 0)
        self.assertEqual(pb.read_delimited(h("00 03"), 0), (b"", 1))

    def test_varint_functions(self) -> None:
        for n, wire in ((0, "00"), (1, "01"), (127, "7f"), (128, "80 01"), (300, "ac 02"),
                        (2**64 - 1, "ff ff ff ff ff ff ff ff ff 01"), (-1, "ff ff ff ff ff ff ff ff ff 01")):
            self.assertEqual(pb.encode_varint(n), h(wire))
            self.assertEqual(pb.decode_varint(b"\x00" + h(wire), 1), (n % 2**64, 1 + len(h(wire))))
        for bad in (2**64, -(2**63) - 1, 1.0, True, "1"):
            with self.assertRaises(EncodeError):
                pb.encode_varint(bad)  # type: ignore[arg-type]
        for bad in ("", "80", "ff ff", "80 80 80 80 80 80 80 80 80 80 00"):
            with self.assertRaises(DecodeError):
                pb.decode_varint(h(bad), 0)


# ---- encoding errors ----


class Color(enum.IntEnum):
    RED = 3


class Encoding(unittest.TestCase):
    def test_required(self) -> None:
        with self.assertRaisesRegex(EncodeError, r"Hello\.protocol_version"):
            pb.Hello(client_name="x").encode()
        st = minimal(pb.FileStat)
        st.mtime = None
        with self.assertRaisesRegex(EncodeError, r"FileStat\.mtime"):
            pb.Result(stat=st).encode()
        st.mtime = pb.Timestamp(sec=1)
        with self.assertRaisesRegex(EncodeError, r"Timestamp\.nsec"):
            pb.DirEntry(name=b"x", stat=st).encode()

    def test_two_oneof_members(self) -> None:
        with self.assertRaisesRegex(EncodeError, r"kind.*echo.*stat|kind.*info"):
            pb.Request(echo=pb.EchoRequest(), stat=pb.StatRequest(path=b"/")).encode()
        with self.assertRaises(EncodeError):
            pb.Request(info=pb.InfoRequest(), echo=pb.EchoRequest()).encode()

    def test_ranges(self) -> None:
        bad = [
            pb.Hello(protocol_version=2**32),
            pb.Hello(protocol_version=-1),
            pb.Error(errno_num=2**31),
            pb.Error(errno_num=-(2**31) - 1),
            pb.EchoReply(bytes=2**64),
            pb.EchoReply(bytes=-1),
            pb.Timestamp(sec=2**63, nsec=0),
            pb.Timestamp(sec=-(2**63) - 1, nsec=0),
            pb.WatchEvent(type=2**31),
            pb.InfoReply(shim_version="v", protocol_version=1, uptime_ms=1, pid=1, pid1=True, uid=0, gid=0,
                         load1=10**400),
        ]
        for msg in bad:
            with self.subTest(msg=msg):
                with self.assertRaisesRegex(EncodeError, "range"):
                    msg.encode()
        self.assertEqual(len(pb.Timestamp(sec=-(2**63), nsec=2**32 - 1).encode()), 1 + 10 + 1 + 5)

    def test_types(self) -> None:
        bad = [
            pb.Hello(protocol_version="1"),
            pb.Hello(protocol_version=1.0),
            pb.Hello(protocol_version=True),
            pb.Hello(protocol_version=1, client_name=b"x"),
            pb.Hello(protocol_version=1, token="secret"),
            pb.StatRequest(path=b"/", follow=1),
            pb.StatRequest(path=b"/", follow=None or "yes"),
            pb.Request(stat=pb.ReadRequest(path=b"/")),
            pb.Request(stat=b"\x0a\x00"),
            pb.ExecRequest(argv=[b"ls", "-l"]),
            pb.ExecRequest(rlimits=[pb.Rlimit(name="nofile", soft=1), None]),
            pb.InfoReply(shim_version="v", protocol_version=1, uptime_ms=1, pid=1, pid1=True, uid=0, gid=0,
                         load1="1.5"),
            pb.Error(errno_num=1, message="\udc80"),  # a lone surrogate: not UTF-8
        ]
        for msg in bad:
            with self.subTest(msg=msg):
                with self.assertRaises(EncodeError):
                    msg.encode()
        ex = pb.ExecRequest()
        ex.argv = b"ls"  # assigned after __init__: refused at encode
        with self.assertRaises(EncodeError):
            ex.encode()
        ex.argv = 5
        with self.assertRaises(EncodeError):
            ex.encode()

    def test_accepted_types(self) -> None:
        ref = pb.StatRequest(path=b"/tmp").encode()
        self.assertEqual(pb.StatRequest(path=bytearray(b"/tmp")).encode(), ref)
        self.assertEqual(pb.StatRequest(path=memoryview(b"/tmp")).encode(), ref)
        self.assertEqual(pb.StatRequest(path=memoryview(b"x/tmp")[1:]).encode(), ref)
        self.assertEqual(pb.Hello(protocol_version=Color.RED).encode(), h("08 03"))
        r = pb.InfoReply(shim_version="v", protocol_version=1, uptime_ms=1, pid=1, pid1=True, uid=0, gid=0, load1=2)
        self.assertEqual(pb.InfoReply.decode(r.encode()).load1, 2.0)
        ex = pb.ExecRequest()
        ex.argv = (b"a", b"b")  # any iterable assigned later
        ex.env = None
        self.assertEqual(pb.ExecRequest.decode(ex.encode()), pb.ExecRequest(argv=[b"a", b"b"]))
        nan = pb.InfoReply.decode(pb.InfoReply(shim_version="v", protocol_version=1, uptime_ms=1, pid=1, pid1=True,
                                               uid=0, gid=0, load1=float("nan")).encode()).load1
        self.assertTrue(math.isnan(nan))

    def test_doubles_and_strings_wire(self) -> None:
        r = pb.InfoReply(shim_version="é", protocol_version=1, uptime_ms=1, pid=1, pid1=False, uid=0, gid=0,
                         load1=1.0)
        self.assertEqual(r.encode(), h("0a 02 c3 a9 10 01 20 01 28 01 30 00 38 00 40 00 81 01 00 00 00 00 00 00 f0 3f"))


# ---- the generated module itself ----


class Module(unittest.TestCase):
    def test_imports_only_struct(self) -> None:
        with open(PB_PATH, encoding="utf-8") as f:
            src = f.read()
        self.assertTrue(src.startswith("# Generated by tools/gen_pb.py from proto/shim.proto; do not edit"))
        tree = ast.parse(src)
        imported = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        self.assertEqual(imported, {"__future__", "struct"})

    def test_every_message_and_enum_of_the_schema(self) -> None:
        with open(PROTO, encoding="utf-8") as f:
            src = f.read()
        self.assertEqual(set(pb.MESSAGES), set(re.findall(r"^message (\w+)", src, re.M)))
        self.assertEqual(set(pb.ENUMS), set(re.findall(r"^enum (\w+)", src, re.M)))
        for name, cls in pb.MESSAGES.items():
            self.assertEqual(set(cls.__slots__), {f[1] for f in cls._FIELDS}, name)
            self.assertEqual([f[0] for f in cls._FIELDS], sorted(f[0] for f in cls._FIELDS), name)

    def test_other_pythons(self) -> None:
        # the package supports CPython 3.8+: load the module and round-trip a message
        # with every other one found here (PATH, pyenv)
        exes = [shutil.which(f"python3.{v}") for v in range(8, 15)]
        exes += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
        code = ("import importlib.util as u, sys; s = u.spec_from_file_location('pb', sys.argv[1]); "
                "m = u.module_from_spec(s); s.loader.exec_module(m); "
                "r = m.Result(stat=m.FileStat(type=1, size=2, mode=3, uid=4, gid=5, nlink=6, inode=7, device=8, "
                "atime=m.Timestamp(sec=-1, nsec=2), mtime=m.Timestamp(sec=3, nsec=4), "
                "ctime=m.Timestamp(sec=5, nsec=6), link_target=b'x')); "
                "assert m.Result.decode(r.encode()) == r; print(sys.version_info[:2] >= (3, 8))")
        seen = {os.path.realpath(sys.executable)}
        tried = 0
        for exe in exes:
            if not exe or os.path.realpath(exe) in seen:
                continue
            seen.add(os.path.realpath(exe))
            v = subprocess.run([exe, "-c", "import sys; print(sys.version_info >= (3, 8))"], capture_output=True,
                               text=True, timeout=60)
            if v.returncode or v.stdout.strip() != "True":
                continue  # a pyenv shim of a version not selected, or a Python the package does not support
            r = subprocess.run([exe, "-c", code, PB_PATH], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"{exe}: {r.stderr}")
            tried += 1
        if not tried:
            self.skipTest("no other Python 3.8+ here")


# ---- protoc, the reference implementation ----


def text_format(msg: Any, indent: str = "") -> str:
    """msg in protobuf's text format (for protoc --encode)."""
    def lit(v: Any, kind: str, typ: str) -> str:
        if kind == "enum":
            return str(v)
        if typ == "bool":
            return "true" if v else "false"
        if typ == "double":
            return "-inf" if v == -math.inf else "inf" if v == math.inf else repr(v)
        if typ in ("string", "bytes"):
            b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            return '"' + "".join(chr(c) if 0x20 <= c < 0x7F and c not in b'"\\' else f"\\{c:03o}" for c in b) + '"'
        return str(v)

    out = []
    for number, name, label, kind, typ, oneof in msg._FIELDS:
        v = getattr(msg, name)
        for x in (v if label == "repeated" else [] if v is None else [v]):
            if kind == "message":
                out.append(f"{indent}{name} {{\n{text_format(x, indent + '  ')}{indent}}}\n")
            else:
                out.append(f"{indent}{name}: {lit(x, kind, typ)}\n")
    return "".join(out)


PROTOC = shutil.which("protoc")


@unittest.skipUnless(PROTOC, "protoc not installed (apt-get install protobuf-compiler)")
class Protoc(unittest.TestCase):
    tmp = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="test_pb-")
        # one wrapper message with a repeated field per message type: one protoc run
        # checks samples of every message
        lines = ['syntax = "proto2";', "package shimtest;", 'import "shim.proto";', "message All {"]
        for i, name in enumerate(pb.MESSAGES, 1):
            lines.append(f"  repeated shim.v1.{name} m_{name} = {i};")
        lines.append("}")
        with open(os.path.join(cls.tmp, "all.proto"), "w") as f:
            f.write("\n".join(lines) + "\n")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def protoc(self, mode: str, name: str, data: bytes, proto: str = "shim.proto") -> bytes:
        paths = ["--proto_path", os.path.join(ROOT, "proto"), "--proto_path", self.tmp]
        r = subprocess.run([PROTOC, f"--{mode}={name}", *paths, proto], input=data, capture_output=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        return r.stdout

    def test_worked_examples(self) -> None:
        for name, text, ours in (
            ("Hello", 'protocol_version: 1 client_name: "x"', pb.Hello(protocol_version=1, client_name="x")),
            ("Request", "echo {}", pb.Request(echo=pb.EchoRequest())),
            ("Result", "echo { bytes: 5 }", pb.Result(echo=pb.EchoReply(bytes=5))),
            ("ExecRequest", 'argv: "ls" argv: "-l" nice: -5 rlimits { name: "nofile" soft: 10 }',
             pb.ExecRequest(argv=[b"ls", b"-l"], nice=-5, rlimits=[pb.Rlimit(name="nofile", soft=10)])),
        ):
            with self.subTest(name=name):
                self.assertEqual(self.protoc("encode", "shim.v1." + name, text.encode()), ours.encode())

    def test_all_samples(self) -> None:
        samples = all_samples(unknown_enums=False)  # protoc keeps unknown proto2 enum values apart
        by_type: Dict[str, List[Any]] = {}
        for m in samples:
            by_type.setdefault(type(m).__name__, []).append(m)
        text, ours = [], bytearray()
        for i, name in enumerate(pb.MESSAGES, 1):
            for m in by_type.get(name, []):
                text.append(f"m_{name} {{\n{text_format(m, '  ')}}}\n")
                b = m.encode()
                ours += pb.encode_varint(i << 3 | 2) + pb.encode_varint(len(b)) + b
        theirs = self.protoc("encode", "shimtest.All", "".join(text).encode(), "all.proto")
        self.assertEqual(theirs, bytes(ours))
        # and protoc reads ours back to the same thing
        back = self.protoc("decode", "shimtest.All", bytes(ours), "all.proto")
        self.assertEqual(self.protoc("encode", "shimtest.All", back, "all.proto"), bytes(ours))


# ---- the generator ----

PACKED_PROTO = """syntax = "proto2";
package t;
enum E { E0 = 0; E1 = 1; ENEG = -2; }
message P {
  repeated uint32 u32 = 1%(opt)s;
  repeated int32 i32 = 2%(opt)s;
  repeated uint64 u64 = 3%(opt)s;
  repeated int64 i64 = 4%(opt)s;
  repeated bool b = 5%(opt)s;
  repeated double d = 6%(opt)s;
  repeated E e = 7%(opt)s;
  repeated string s = 8;
}
"""


class Generator(unittest.TestCase):
    tmp = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="test_pb-gen-")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_gen(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, GEN, *args], capture_output=True, text=True, timeout=120)

    def test_check_passes_on_the_committed_file(self) -> None:
        r = self.run_gen("--check")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_check_fails_on_a_changed_schema(self) -> None:
        proto = os.path.join(self.tmp, "shim.proto")
        out = os.path.join(self.tmp, "_pb.py")
        shutil.copy(PROTO, proto)
        shutil.copy(PB_PATH, out)
        r = self.run_gen("--check", "--proto", proto, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(proto, encoding="utf-8") as f:
            src = f.read()
        src = src.replace("  optional uint32 initial_window = 5;", "  optional uint32 initial_window = 5;\n"
                          "  optional string added = 6;", 1)
        with open(proto, "w", encoding="utf-8") as f:
            f.write(src)
        r = self.run_gen("--check", "--proto", proto, "--out", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("_pb.py is out of date with", r.stderr)
        self.assertIn("run tools/gen_pb.py", r.stderr)
        self.assertIn("+", r.stderr)  # a diff head
        # writing: then --check passes, and the new field works
        r = self.run_gen("--proto", proto, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.run_gen("--check", "--proto", proto, "--out", out).returncode, 0)
        mod = load(out, "test_pb_changed")
        self.assertEqual(mod.Hello(protocol_version=1, added="y").encode(), h("08 01 32 01 79"))
        self.assertEqual(mod.Hello.decode(h("08 01 32 01 79")).added, "y")
        # the committed module reads it, skipping the field it does not know
        self.assertEqual(pb.Hello.decode(h("08 01 32 01 79")), pb.Hello(protocol_version=1))

    def test_deterministic(self) -> None:
        a = gen_pb.generate(PROTO)
        self.assertEqual(a, gen_pb.generate(PROTO))
        with open(PB_PATH, encoding="utf-8") as f:
            self.assertEqual(a, f.read())

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_refuses_what_it_does_not_know(self) -> None:
        head = 'syntax = "proto2";\npackage p;\n'
        cases = {
            "nested message": "message A { message B {} optional B b = 1; }",
            "nested enum": "message A { enum E { X = 0; } }",
            "map": "message A { map<string, string> m = 1; }",
            "group": "message A { optional group G = 1 { optional int32 x = 2; } }",
            "field option": "message A { repeated int32 x = 1 [packed = true]; }",
            "default": "message A { optional int32 x = 1 [default = 5]; }",
            "file option": 'option java_package = "x";\nmessage A {}',
            "message option": "message A { option deprecated = true; }",
            "import": 'import "other.proto";',
            "service": "service S {}",
            "extensions": "message A { extensions 100 to 200; }",
            "reserved": "message A { reserved 2; }",
            "extend": "message A {} extend A { optional int32 x = 100; }",
            "unknown type": "message A { optional Missing x = 1; }",
            "unsupported scalar": "message A { optional sint32 x = 1; }",
            "float": "message A { optional float x = 1; }",
            "no label": "message A { int32 x = 1; }",
            "label in oneof": "message A { oneof k { optional int32 x = 1; } }",
            "duplicate number": "message A { optional int32 x = 1; optional int32 y = 1; }",
            "duplicate name": "message A { optional int32 x = 1; optional int64 x = 2; }",
            "reserved number": "message A { optional int32 x = 19000; }",
            "number 0": "message A { optional int32 x = 0; }",
            "keyword name": "message A { optional int32 from = 1; }",
            "method name": "message A { optional int32 encode = 1; }",
            "enum alias": "enum E { option allow_alias = true; A = 0; B = 0; }",
            "enum duplicate value": "enum E { A = 0; B = 0; }",
            "module name": "message DecodeError {}",
            "garbage": "message A { optional int32 x = 1; } $",
            "unterminated comment": "message A {} /* ...",
            "missing semicolon": "message A { optional int32 x = 1 }",
            "enum value option": "enum E { A = 0 [deprecated = true]; }",
        }
        for what, body in cases.items():
            with self.subTest(what=what):
                path = self.write("bad.proto", head + body + "\n")
                with self.assertRaises(gen_pb.ProtoError) as cm:
                    gen_pb.generate(path)
                self.assertIn("bad.proto", str(cm.exception))
        for what, text in {"proto3": 'syntax = "proto3";\nmessage A {}', "no syntax": "message A {}"}.items():
            with self.subTest(what=what):
                with self.assertRaises(gen_pb.ProtoError):
                    gen_pb.generate(self.write("bad.proto", text))
        r = self.run_gen("--proto", self.write("bad.proto", head + cases["map"]), "--out",
                         os.path.join(self.tmp, "never.py"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("map", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "never.py")))

    def test_packed(self) -> None:
        # shim.proto has no repeated numeric field: a schema of our own has one of each
        path = self.write("packed.proto", PACKED_PROTO % {"opt": ""})
        out = os.path.join(self.tmp, "_pb_packed.py")
        r = self.run_gen("--proto", path, "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        m = load(out, "test_pb_packed")
        msg = m.P(u32=[0, 300, 2**32 - 1], i32=[-1, 5, -(2**31)], u64=[2**64 - 1, 1], i64=[-(2**63), 7],
                  b=[True, False, True], d=[1.5, -0.25], e=[1, -2, 99], s=["x"])
        unpacked = msg.encode()
        self.assertEqual(unpacked[:2], h("08 00"))  # proto2: unpacked
        self.assertEqual(m.P.decode(unpacked), msg)

        def packed(num: int, payload: bytes) -> bytes:
            return m.encode_varint(num << 3 | 2) + m.encode_varint(len(payload)) + payload

        def vs(*ns: int) -> bytes:
            return b"".join(m.encode_varint(n) for n in ns)

        data = (packed(1, vs(0, 300, 2**32 - 1)) + packed(2, vs(-1, 5) + vs(-(2**31))) +
                packed(3, vs(2**64 - 1, 1)) + packed(4, vs(-(2**63), 7)) + packed(5, vs(1, 0, 1)) +
                packed(6, bytes.fromhex("000000000000f83f000000000000d0bf")) + packed(7, vs(1, -2, 99)) +
                h("42 01 78"))
        self.assertEqual(m.P.decode(data), msg)
        # packed and unpacked mixed, in any order: appended in the order seen
        mixed = h("08 01") + packed(1, vs(2, 3)) + h("08 04")
        self.assertEqual(m.P.decode(mixed).u32, [1, 2, 3, 4])
        # a uint32 from a longer varint in a packed run is masked; an int32 sign-extended
        self.assertEqual(m.P.decode(packed(1, vs(2**32 + 5)) + packed(2, vs(0xFFFFFFFF))).i32, [-1])
        self.assertEqual(m.P.decode(packed(1, vs(2**32 + 5))).u32, [5])
        self.assertEqual(m.P.decode(packed(1, b"")).u32, [])
        for bad in (packed(1, h("80")), packed(6, bytes(7)), packed(2, h("ff ff")), h("0a 05 01")):
            with self.assertRaises(m.DecodeError):
                m.P.decode(bad)
        # a packed run whose last varint runs past the field into what follows
        with self.assertRaises(m.DecodeError):
            m.P.decode(h("0a 01 80 08 01"))
        if PROTOC:
            # protoc writes packed when told to: we read it
            ppath = self.write("packed_ref.proto", (PACKED_PROTO % {"opt": " [packed = true]"}).replace(
                "package t;", "package tref;"))
            text = ("u32: 0 u32: 300 u32: 4294967295 i32: -1 i32: 5 i32: -2147483648 "
                    "u64: 18446744073709551615 u64: 1 i64: -9223372036854775808 i64: 7 b: true b: false b: true "
                    "d: 1.5 d: -0.25 e: E1 e: ENEG s: \"x\"")
            r = subprocess.run([PROTOC, "--encode=tref.P", "--proto_path", self.tmp, ppath], input=text.encode(),
                               capture_output=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout[:1], h("0a"))  # packed
            got = m.P.decode(r.stdout)
            msg.e = [1, -2]
            self.assertEqual(got, msg)


if __name__ == "__main__":
    unittest.main()
