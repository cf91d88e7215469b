#!/usr/bin/env python3
"""make_corpus.py: write the seed inputs of fuzz_conn into tests/fuzz/corpus/.

Each file is one fuzz input: byte 0 steers the harness, the rest is what a client
sends to the daemon (see fuzz_conn.c):
  bit 0     the connection needs the token "fuzz-token"
  bits 1-2  the bytes are fed in (bits + 1) chunks, the event loop running in between
  bits 3-7  moves the split points

Protobuf is encoded by hand (the messages are tiny), so this needs nothing but Python 3.
Usage: python3 tests/fuzz/make_corpus.py [OUTDIR]   (default: the corpus/ next to this file)
Seeds are named seed-*; files the fuzzer found keep other names and are left alone.
"""

import os
import struct
import sys

# frame types (proto/frame.h)
HELLO, HELLO_OK, REQUEST, DATA, EVENT, END, ERROR, CANCEL, WINDOW, PING, PONG = range(1, 12)
FIN = 0x01
TOKEN = b"fuzz-token"


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3 | 0) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def hello_msg(version=1, name=b"fuzz", token=None, max_frame=None, window=None):
    m = field_varint(1, version) + field_bytes(2, name)
    if token is not None:
        m += field_bytes(3, token)
    if max_frame is not None:
        m += field_varint(4, max_frame)
    if window is not None:
        m += field_varint(5, window)
    return m


INFO = field_bytes(1, b"")  # Request{info: InfoRequest{}}
ECHO = field_bytes(2, b"")  # Request{echo: EchoRequest{}}

# file requests: Request field number of each kind (proto/shim.proto)
KIND = dict(stat=10, read=11, write=12, list=13, mkdir=14, remove=15, rename=16, copy=17, chmod=18, chown=19,
            symlink=20, readlink=21, link=22, truncate=23, set_times=24, realpath=25, statfs=26, watch=27)


def fs_req(kind, *fields):
    """Request{kind: XRequest{fields}}; fields are already encoded (field_bytes / field_varint)."""
    return field_bytes(KIND[kind], b"".join(fields))


def path(p, num=1):
    return field_bytes(num, p)


def frame(ftype, stream=0, payload=b"", flags=0, reserved=0, length=None):
    n = len(payload) if length is None else length
    return struct.pack(">IIBBH", n, stream, ftype, flags, reserved) + payload


def hello(**kw):
    return frame(HELLO, 0, hello_msg(**kw))


def ping(payload=b"\0\0\0\0\0\0\0\1", stream=0):
    return frame(PING, stream, payload)


def window(stream, inc):
    return frame(WINDOW, stream, struct.pack(">I", inc))


def seeds():
    h = hello()
    s = {}
    # handshakes
    s["hello-ping"] = (0x00, h + ping())
    s["hello-ping-chunked"] = (0x06 | 0x28, h + ping() + ping(b"x" * 64))
    s["token-ok"] = (0x01, hello(token=TOKEN) + ping())
    s["token-bad"] = (0x01, hello(token=b"fuzz-tokem") + ping())
    s["token-missing"] = (0x01, h + ping())
    s["version-2"] = (0x00, hello(version=2) + ping())
    s["hello-small-limits"] = (0x02, hello(max_frame=1, window=0) + ping())
    s["hello-garbage"] = (0x00, frame(HELLO, 0, b"\xff\xff\xff\xff\x0f\x08") + ping())
    s["hello-twice"] = (0x00, h + h)
    s["ping-before-hello"] = (0x00, ping() + h)
    # requests
    s["info"] = (0x00, h + frame(REQUEST, 1, INFO))
    s["info-x3-ping"] = (0x04, h + frame(REQUEST, 1, INFO) + frame(REQUEST, 3, INFO) + frame(REQUEST, 5, INFO) + ping())
    s["info-cancel"] = (0x02, h + frame(REQUEST, 1, INFO) + frame(CANCEL, 1))
    s["info-data"] = (0x00, h + frame(REQUEST, 1, INFO) + frame(DATA, 1, b"abc"))
    s["echo-fin"] = (0x00, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"hello") + frame(DATA, 1, flags=FIN))
    s["echo-data-fin"] = (0x06, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"hello, echo", flags=FIN) + ping())
    s["echo-cancel"] = (0x02, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"x" * 100) + frame(CANCEL, 1))
    # a 16-byte client window: the echo blocks on credit until WINDOWs arrive
    s["echo-window"] = (
        0x04,
        hello(window=16)
        + frame(REQUEST, 1, ECHO)
        + frame(DATA, 1, bytes(range(100)))
        + window(1, 50)
        + window(1, 1000)
        + frame(DATA, 1, flags=FIN),
    )
    s["echo-zero-window"] = (0x02, hello(window=0) + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"z" * 10, flags=FIN))
    s["echo-big"] = (
        0x06 | 0x50,
        hello(max_frame=16384)
        + frame(REQUEST, 1, ECHO)
        + b"".join(frame(DATA, 1, bytes([i]) * 4000) for i in range(4))
        + frame(DATA, 1, flags=FIN),
    )
    s["echo-flow-violation"] = (0x00, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"v" * (16384 + 1)))
    s["echo-after-end"] = (
        0x00,
        h
        + frame(REQUEST, 1, ECHO)
        + frame(DATA, 1, b"e", flags=FIN)
        + frame(DATA, 1, b"late")
        + window(1, 5)
        + frame(CANCEL, 1)
        + ping(),
    )
    s["echo-data-after-fin"] = (0x00, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, flags=FIN) + frame(DATA, 1, b"x"))
    s["echo-window-overflow"] = (0x00, h + frame(REQUEST, 1, ECHO) + window(1, 0x7FFFFFFF))
    s["too-many-streams"] = (
        0x02,
        h + b"".join(frame(REQUEST, 2 * i + 1, ECHO) for i in range(10)) + frame(DATA, 19, b"ignored") + ping(),
    )
    s["unknown-kind"] = (0x00, h + frame(REQUEST, 1, field_bytes(7, b"")) + frame(REQUEST, 3, b"") + ping())
    s["request-garbage"] = (0x00, h + frame(REQUEST, 1, b"\x0a\x05\x01"))
    # files, beneath the harness's scratch root: /f, /d/g, /l -> /f, /esc -> ../../../../etc
    s["fs-stat"] = (
        0x02,
        h
        + frame(REQUEST, 1, fs_req("stat", path(b"/f")))
        + frame(REQUEST, 3, fs_req("stat", path(b"/l"), field_varint(2, 1)))
        + frame(REQUEST, 5, fs_req("stat", path(b"/l")))
        + frame(REQUEST, 7, fs_req("stat", path(b"/esc/passwd"), field_varint(2, 1)))
        + frame(REQUEST, 9, fs_req("stat", path(b"/../../etc/shadow")))
        + frame(REQUEST, 11, fs_req("stat", path(b"/")))
        + ping(),
    )
    s["fs-stat-bad-paths"] = (
        0x00,
        h
        + frame(REQUEST, 1, fs_req("stat", path(b"relative")))
        + frame(REQUEST, 3, fs_req("stat", path(b"/f\0x")))
        + frame(REQUEST, 5, fs_req("stat", path(b"")))
        + frame(REQUEST, 7, fs_req("stat", path(b"/" + b"a" * 5000)))
        + frame(REQUEST, 9, fs_req("stat")),
    )
    s["fs-stat-cancel"] = (0x00, h + frame(REQUEST, 1, fs_req("stat", path(b"/d/g"))) + frame(CANCEL, 1) + ping())
    s["fs-read-list"] = (
        0x04,
        h
        + frame(REQUEST, 1, fs_req("read", path(b"/f")))
        + frame(REQUEST, 3, fs_req("read", path(b"/f"), field_varint(2, 5), field_varint(3, 4)))
        + frame(REQUEST, 5, fs_req("list", path(b"/"), field_varint(2, 0), field_varint(4, 1)))
        + frame(REQUEST, 7, fs_req("readlink", path(b"/l")))
        + frame(REQUEST, 9, fs_req("realpath", path(b"/esc")))
        + frame(REQUEST, 11, fs_req("statfs", path(b"/")))
        + window(1, 100),
    )
    s["fs-write"] = (
        0x02,
        h
        + frame(REQUEST, 1, fs_req("write", path(b"/d/new"), field_varint(2, 0o600), field_varint(5, 1)))
        + frame(DATA, 1, b"written by the fuzzer")
        + frame(DATA, 1, flags=FIN)
        + frame(REQUEST, 3, fs_req("write", path(b"/f"), field_varint(3, 1), field_varint(6, 1)))
        + frame(DATA, 3, b"more", flags=FIN)
        + frame(REQUEST, 5, fs_req("write", path(b"/x/y"), field_varint(4, 1)))
        + frame(CANCEL, 5),
    )
    s["fs-mutate-1"] = (
        0x06,
        h
        + frame(REQUEST, 1, fs_req("mkdir", path(b"/m/n"), field_varint(2, 1), field_varint(3, 0o700)))
        + frame(REQUEST, 3, fs_req("rename", path(b"/d/g"), path(b"/d/h", 2), field_varint(3, 1)))
        + frame(REQUEST, 5, fs_req("copy", path(b"/d"), path(b"/e", 2), field_varint(3, 1)))
        + frame(REQUEST, 7, fs_req("chmod", path(b"/f"), field_varint(2, 0o640)))
        + frame(REQUEST, 9, fs_req("chown", path(b"/l"), field_varint(2, 0), field_varint(4, 1)))
        + ping(),
    )
    s["fs-mutate-2"] = (
        0x02,
        h
        + frame(REQUEST, 1, fs_req("symlink", path(b"../f"), path(b"/d/s", 2)))
        + frame(REQUEST, 3, fs_req("link", path(b"/f"), path(b"/d/k", 2)))
        + frame(REQUEST, 5, fs_req("truncate", path(b"/f"), field_varint(2, 3)))
        + frame(REQUEST, 7, fs_req("set_times", path(b"/t"), field_varint(4, 1)))
        + frame(REQUEST, 9, fs_req("remove", path(b"/d"), field_varint(2, 1)))
        + ping(),
    )
    s["fs-watch-cancel"] = (
        0x02,
        h + frame(REQUEST, 1, fs_req("watch", path(b"/"), field_varint(2, 1))) + window(1, 4096) + frame(CANCEL, 1),
    )
    # stream id rules
    s["stream-reused"] = (0x00, h + frame(REQUEST, 1, INFO) + frame(REQUEST, 1, INFO))
    s["stream-even"] = (0x00, h + frame(REQUEST, 2, INFO))
    s["data-unknown-stream"] = (0x00, h + frame(DATA, 7, b"?"))
    # framing
    s["oversize-hello"] = (0x00, frame(HELLO, 0, length=(64 << 10) + 1))
    s["oversize-after-hello"] = (0x00, hello(max_frame=16384) + frame(REQUEST, 1, ECHO) + frame(DATA, 1, length=20000))
    s["truncated-header"] = (0x00, h + ping()[:7])
    s["truncated-payload"] = (0x02, h + frame(REQUEST, 1, ECHO) + frame(DATA, 1, b"abc", length=50))
    s["unknown-type"] = (0x00, h + frame(12, 0, b"??"))
    s["reserved-bits"] = (0x00, h + frame(PING, 0, b"12345678", reserved=1))
    s["client-sends-shim-types"] = (0x00, h + frame(END, 1))
    s["ping-too-big"] = (0x00, h + ping(b"p" * 65))
    s["pong"] = (0x00, h + frame(PONG, 0, b"late") + ping())
    s["window-bad-len"] = (0x00, h + frame(REQUEST, 1, ECHO) + frame(WINDOW, 1, b"\0\0\1"))
    s["window-zero"] = (0x00, h + frame(REQUEST, 1, ECHO) + window(1, 0))
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if name.startswith("seed-"):
            os.unlink(os.path.join(out, name))
    total = 0
    items = seeds()
    for name, (ctl, body) in sorted(items.items()):
        data = bytes([ctl]) + body
        with open(os.path.join(out, "seed-" + name), "wb") as f:
            f.write(data)
        total += len(data)
    print(f"wrote {len(items)} seeds ({total} bytes) to {out}")


if __name__ == "__main__":
    main()
