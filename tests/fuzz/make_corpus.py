#!/usr/bin/env python3
"""make_corpus.py: write the seed inputs of the fuzz targets into tests/fuzz/.

  conn     corpus/          fuzz_conn: what a client sends to the daemon
  rx       corpus_rx/       fuzz_rx: what a shim sends to a libsbx client
  restore  corpus_restore/  fuzz_restore: a restore's archive (tar, pax, GNU; plain, gzip, zstd)

Each file is one fuzz input: byte 0 steers the harness, the rest is the bytes (see the
top of each harness). fuzz_conn's byte 0:
  bit 0     the connection needs the token "fuzz-token"
  bits 1-2  the bytes are fed in (bits + 1) chunks, the event loop running in between
  bits 3-7  moves the split points

Protobuf, tar headers and zstd frames are encoded by hand (or with the standard library's
tarfile and gzip), so this needs nothing but Python 3.
Usage: python3 tests/fuzz/make_corpus.py [conn|rx|restore|all [OUTDIR]]
       (default: all, each into its directory next to this file; OUTDIR only with one target)
Seeds are named seed-*; files the fuzzer found keep other names and are left alone.
"""

import gzip
import os
import struct
import sys
import tarfile

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


def conn_seeds():
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



# ---------------------------------------------------------------- fuzz_rx ----
# Byte 0 (fuzz_rx.c): bit 0 the bytes start with the shim's answer to HELLO (else the harness
# sends a HELLO_OK), bits 1-2 (bits + 1) chunks after the handshake, bit 3 trace every frame,
# bits 4-7 move the split points. The client's calls: a download on stream 1, a request on
# stream 3 (its END decoded at the end), stream 5 given up on at its first frame, an echo on
# stream 7 (its DATA read into its buffer; given up when a frame does not fit or starts with
# 0xfe), a ping of seq 1 and an async ping of seq 2.
RX_RAW, RX_TRACE = 0x01, 0x08
DL, REQ, DROP, ECHOED = 1, 3, 5, 7


def rx_chunks(n, shift=0):
    return (n - 1) << 1 | shift << 4


def hello_reply(version=1, max_frame=1 << 20, window=256 << 10, features=(b"fs", b"exec"), extra=b""):
    m = field_varint(1, version) + field_bytes(2, b"0.1.0")
    for f in features:
        m += field_bytes(3, f)
    m += field_varint(4, max_frame) + field_varint(5, 1) + field_varint(6, 1) + field_varint(7, 0)
    m += field_bytes(8, b"fuzzhost") + field_bytes(9, b"boot-1") + field_varint(10, window)
    return m + extra


def error_msg(errno_num=2, name=b"ENOENT", message=b"no such file", path=b"/fuzz"):
    m = field_varint(1, errno_num)
    if name is not None:
        m += field_bytes(2, name)
    if message is not None:
        m += field_bytes(3, message)
    if path is not None:
        m += field_bytes(4, path)
    return m


def result_read(n):
    return field_bytes(11, field_varint(1, n))  # Result{read: ReadReply{bytes}}


RESULT_DONE = field_bytes(9, b"")  # Result{done: Done{}}
EVENT_PROGRESS = field_bytes(1, field_varint(1, 5) + field_varint(2, 1))  # Event{progress}


def data(stream, payload, fin=False):
    return frame(DATA, stream, payload, flags=FIN if fin else 0)


def pattern(n, seed=0):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def pong(seq):
    return frame(PONG, 0, struct.pack(">Q", seq))


def rx_seeds():
    s = {}
    ok_dl = data(DL, b"hello") + data(DL, b"", fin=True) + frame(END, DL, result_read(5))
    ok_req = frame(EVENT, REQ, EVENT_PROGRESS) + frame(END, REQ, RESULT_DONE)
    s["download-small"] = (0x00, ok_dl + ok_req + pong(1) + pong(2))
    s["download-small-trace"] = (RX_TRACE, ok_dl + ok_req + pong(1) + pong(2))
    # DATA of at least 4 KiB not all in one read: read straight into its item, then the
    # frames after it guessed to be DATA of the same kind (reader.c, RX_DIRECT_MIN)
    big = b"".join(data(DL, pattern(5000, i)) for i in range(4)) + data(DL, b"", fin=True)
    s["download-direct"] = (rx_chunks(4, 3), big + frame(END, DL, result_read(20000)) + ok_req)
    s["download-direct-2"] = (rx_chunks(2, 9), big + frame(END, DL, result_read(20000)))
    s["download-direct-mixed"] = (
        rx_chunks(3, 5),
        data(DL, pattern(6000)) + data(REQ, pattern(4500, 1)) + frame(EVENT, DL, EVENT_PROGRESS) + ping()
        + data(DL, pattern(300, 2)) + data(DROP, pattern(5000, 3)) + data(DL, pattern(7000, 4), fin=True)
        + frame(END, DL, result_read(13300)) + frame(END, REQ, RESULT_DONE),
    )
    # bigger than FRAME_DATA_CHUNK: the guess is the part's own size
    s["download-huge-frame"] = (rx_chunks(3, 1), data(DL, pattern(70000)) + data(DL, b"", fin=True)
                                + frame(END, DL, result_read(70000)))
    # a frame cut off by the end of the connection, in the middle of a big payload
    s["eof-mid-payload"] = (rx_chunks(2), data(DL, pattern(1000)) + data(DL, pattern(9000))[:5000])
    s["eof-mid-header"] = (0x00, data(DL, b"abc") + data(DL, b"x")[:7])
    s["interleaved"] = (
        rx_chunks(4, 2),
        data(DL, b"a" * 100) + frame(EVENT, REQ, EVENT_PROGRESS) + window(DL, 4096) + data(DROP, b"dropped")
        + data(DL, b"b" * 100) + frame(ERROR, REQ, error_msg()) + data(DROP, b"late") + frame(END, DROP, RESULT_DONE)
        + data(DL, b"c", fin=True) + frame(END, DL, result_read(201)) + pong(2),
    )
    s["sink-refuses"] = (rx_chunks(2), data(DL, b"\xffrefused") + data(DL, pattern(5000)) + data(DL, b"", fin=True)
                         + frame(END, DL, result_read(0)))
    s["data-after-fin"] = (0x00, data(DL, b"x", fin=True) + data(DL, b"more") + frame(END, DL, result_read(1)))
    s["drop-first-frame"] = (rx_chunks(2, 4), data(DROP, pattern(5000)) + data(DROP, pattern(5000, 1))
                             + frame(END, DROP, RESULT_DONE) + ok_dl)
    s["unknown-stream"] = (0x00, data(9, b"?") + frame(END, 11, RESULT_DONE) + frame(ERROR, 13, error_msg()) + ok_dl)
    # the echo (ECHOED): big DATA read straight into its buffer, frames of any size, a
    # WINDOW or another stream's frame between them
    s["echo-direct"] = (
        rx_chunks(4, 6),
        data(ECHOED, pattern(5000)) + data(ECHOED, pattern(65536, 1)) + window(ECHOED, 65536) + data(ECHOED, pattern(29004, 2))
        + data(DL, pattern(4500, 3)) + data(ECHOED, pattern(40000, 4)) + ping() + data(ECHOED, pattern(100, 5))
        + data(ECHOED, pattern(6000, 6), fin=True) + frame(END, ECHOED, RESULT_DONE) + ok_dl,
    )
    s["echo-small-frames"] = (rx_chunks(3, 2), b"".join(data(ECHOED, pattern(700 + 37 * i, i)) for i in range(40))
                              + frame(END, ECHOED, RESULT_DONE))
    # more than the buffer holds: given up, the frames after it must go nowhere near it
    s["echo-overflow"] = (rx_chunks(3, 7), b"".join(data(ECHOED, pattern(60000, i)) for i in range(4))
                          + data(ECHOED, pattern(60000, 9)) + frame(END, ECHOED, RESULT_DONE) + ok_dl)
    s["echo-give-up"] = (rx_chunks(4, 11), data(ECHOED, pattern(30000)) + data(ECHOED, b"\xfe" + pattern(20000))
                         + data(ECHOED, pattern(50000, 1)) + data(ECHOED, pattern(50000, 2)) + ok_dl)
    s["echo-eof-mid-payload"] = (rx_chunks(2, 3), data(ECHOED, pattern(9000)) + data(ECHOED, pattern(50000, 1))[:30000])
    s["error-on-stream"] = (0x00, frame(ERROR, DL, error_msg(13, b"EACCES", b"permission denied", b"/secret"))
                            + frame(ERROR, REQ, error_msg(name=None, message=None, path=None)))
    s["error-undecodable"] = (RX_TRACE, frame(ERROR, REQ, b"\x08") + frame(ERROR, DL, b"\xff\xff\xff"))
    s["error-conn"] = (RX_TRACE, data(DL, b"abc") + frame(ERROR, 0, error_msg(71, b"EPROTO", b"bad frame", None)))
    s["end-undecodable"] = (0x00, frame(END, REQ, b"\x5a\x03\x08") + frame(END, DL, b""))
    s["end-twice"] = (0x00, frame(END, REQ, RESULT_DONE) + frame(END, REQ, RESULT_DONE) + frame(DATA, REQ, b"x"))
    s["pings"] = (
        rx_chunks(2),
        ping() + ping(b"x" * 64) + ping(b"") + pong(1) + frame(PONG, 0, b"short") + pong(2) + pong(3) + ping(b"y" * 65),
    )
    s["many-pings"] = (0x00, b"".join(ping(struct.pack(">Q", i)) for i in range(20)) + pong(2))
    s["window-odd"] = (0x00, frame(WINDOW, DL, b"\0\0\1") + window(DL, 0x7FFFFFFF) + window(DL, 0x7FFFFFFF)
                       + window(REQ, 0) + ok_dl)
    s["stream0-data"] = (0x00, frame(DATA, 0, b"?"))
    s["stream0-hello-ok"] = (0x00, frame(HELLO_OK, 0, hello_reply()))
    s["request-from-shim"] = (RX_TRACE, frame(REQUEST, DL, INFO))
    s["cancel-from-shim"] = (0x00, frame(CANCEL, REQ))
    s["reserved-bits"] = (0x00, frame(DATA, DL, b"x", reserved=1))
    s["type-zero"] = (0x00, frame(0, DL, b"x"))
    s["type-unknown"] = (0x00, frame(12, DL, b"x"))
    s["too-big"] = (0x00, frame(DATA, DL, length=(1 << 20) + 1))
    s["stderr-flag"] = (RX_TRACE, frame(DATA, DL, b"err", flags=0x02) + frame(DATA, DL, b"", flags=0x03))
    # the handshake from the input
    s["hs-ok"] = (RX_RAW | RX_TRACE, frame(HELLO_OK, 0, hello_reply()) + ok_dl + ok_req + pong(2))
    s["hs-small-frame"] = (RX_RAW | rx_chunks(2), frame(HELLO_OK, 0, hello_reply(max_frame=1, window=0))
                           + data(DL, pattern(17000)) + ok_dl)
    s["hs-huge-frame"] = (RX_RAW, frame(HELLO_OK, 0, hello_reply(max_frame=0xFFFFFFFF, window=0xFFFFFFFF)) + ok_dl)
    s["hs-version-2"] = (RX_RAW, frame(HELLO_OK, 0, hello_reply(version=2)))
    s["hs-many-features"] = (RX_RAW, frame(HELLO_OK, 0, hello_reply(features=[b"f%d" % i for i in range(200)]
                                                                       + [b""]))
                             + pong(1))
    s["hs-error"] = (RX_RAW | RX_TRACE, frame(ERROR, 0, error_msg(11, b"EAGAIN", b"too many connections", None)))
    s["hs-garbage"] = (RX_RAW, frame(HELLO_OK, 0, b"\x08\x01\x12\xff"))
    s["hs-missing-fields"] = (RX_RAW, frame(HELLO_OK, 0, field_varint(1, 1)))
    s["hs-on-stream"] = (RX_RAW, frame(HELLO_OK, 1, hello_reply()))
    s["hs-ping-first"] = (RX_RAW, ping() + frame(HELLO_OK, 0, hello_reply()))
    s["hs-truncated"] = (RX_RAW, frame(HELLO_OK, 0, hello_reply())[:30])
    s["hs-too-big"] = (RX_RAW, frame(HELLO_OK, 0, length=(64 << 10) + 1))
    s["hs-empty"] = (RX_RAW, b"")
    return s


# ----------------------------------------------------------- fuzz_restore ----
# Byte 0 (fuzz_restore.c): bit 0 merge (else replace), bit 1 the target exists beforehand (f,
# d/g, l -> f, esc -> a directory outside), bit 2 allow_devices, bit 3 a sha256 is expected:
# the archive's own (bit 4 clear) or a wrong one (bit 4 set), bit 5 allow_empty.
RS_MERGE, RS_EXISTS, RS_DEVICES, RS_SHA, RS_SHA_WRONG, RS_EMPTY_OK = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
BLOCK = 512
MTIME = 1700000000


def pad(b):
    return b + b"\0" * (-len(b) % BLOCK)


def ti(name, type=tarfile.REGTYPE, size=0, mode=0o644, link="", uid=1000, gid=1000, pax=None, mtime=MTIME):
    t = tarfile.TarInfo(name)
    t.type = type
    t.size = size
    t.mode = mode
    t.linkname = link
    t.uid, t.gid = uid, gid
    t.uname, t.gname = "fuzz", "fuzz"
    t.mtime = mtime
    if pax:
        t.pax_headers = dict(pax)
    return t


def member(t, content=b"", fmt=tarfile.PAX_FORMAT):
    """The header block(s) of t (pax or GNU extension headers included) and its padded data."""
    if t.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
        t.size = len(content)
    return t.tobuf(fmt, "utf-8", "surrogateescape") + (pad(content) if content else b"")


def f(name, content=b"", **kw):
    return member(ti(name, size=len(content), **kw), content)


def d(name, mode=0o755, **kw):
    return member(ti(name, tarfile.DIRTYPE, mode=mode, **kw))


def sym(name, target, **kw):
    return member(ti(name, tarfile.SYMTYPE, mode=0o777, link=target, **kw))


def hard(name, target, **kw):
    return member(ti(name, tarfile.LNKTYPE, link=target, **kw))


END_BLOCKS = b"\0" * (2 * BLOCK)


def tar(*members, end=True):
    return b"".join(members) + (END_BLOCKS if end else b"")


def checksum(hdr):
    """hdr (512 bytes) with its checksum field filled in."""
    h = bytearray(hdr)
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def raw_header(name, typeflag, size_field, magic=b"ustar\x0000", mode=b"0000644\0"):
    """A header written field by field (for what tarfile will not write)."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = mode
    h[108:116] = b"0001750\0"
    h[116:124] = b"0001750\0"
    h[124:136] = size_field
    h[136:148] = b"%011o\0" % MTIME
    h[156:157] = typeflag
    h[257:265] = magic
    return checksum(h)


def gnu_sparse_1_0(name, realsize, chunks):
    """A PAX 1.0 sparse file (GNU tar --sparse --format=pax): the map in the data, then the chunks."""
    smap = b"%d\n" % len(chunks) + b"".join(b"%d\n%d\n" % (off, len(c)) for off, c in chunks)
    payload = pad(smap) + b"".join(c for _, c in chunks)
    t = ti("./GNUSparseFile.0/" + name, pax={"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                                             "GNU.sparse.name": name, "GNU.sparse.realsize": str(realsize)})
    t.size = len(payload)
    return t.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + pad(payload)


def zstd_raw(payload, rle_tail=0, content_size=True):
    """A zstd frame of raw blocks (and an RLE block of rle_tail zero bytes): valid zstd without a
    compressor. Single segment: the window is the content size."""
    total = len(payload) + rle_tail
    out = struct.pack("<I", 0xFD2FB528)
    out += bytes([0xA0]) + struct.pack("<I", total)  # FCS 4 bytes, single segment, no checksum
    blocks = [(0, payload[i:i + (128 << 10)]) for i in range(0, len(payload), 128 << 10)]
    if rle_tail:
        blocks.append((1, rle_tail))
    for i, (kind, b) in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        size = b if kind == 1 else len(b)
        out += struct.pack("<I", last | kind << 1 | size << 3)[:3]
        out += b"\0" if kind == 1 else b
    return out


def gz(b):
    return gzip.compress(b, compresslevel=9, mtime=0)


def basic_tree():
    return (d("./") + d("d/") + f("d/a", b"alpha\n" * 20) + f("empty") + sym("l", "d/a") + hard("h", "d/a")
            + member(ti("p", tarfile.FIFOTYPE)) + f("x", b"x", mode=0o4755) + d("sticky/", mode=0o1777))


def restore_seeds():
    s = {}
    basic = tar(basic_tree())
    s["basic"] = (0x00, basic)
    s["basic-exists"] = (RS_EXISTS, basic)
    s["basic-merge"] = (RS_MERGE, basic)
    s["basic-merge-exists"] = (RS_MERGE | RS_EXISTS, basic)
    s["basic-sha"] = (RS_SHA | RS_EXISTS, basic)
    s["basic-sha-wrong"] = (RS_SHA | RS_SHA_WRONG | RS_EXISTS, basic)
    s["no-root-entry"] = (RS_EXISTS, tar(f("a", b"1"), d("b/"), f("b/c", b"2")))
    s["ustar"] = (0x00, tar(member(ti("u/file", size=3), b"abc", fmt=tarfile.USTAR_FORMAT),
                            member(ti("u/", tarfile.DIRTYPE), fmt=tarfile.USTAR_FORMAT)))
    # v7: no magic
    s["v7"] = (0x00, raw_header(b"v7file", b"0", b"%011o\0" % 4, magic=b"\0" * 8) + pad(b"v7!\n") + END_BLOCKS)
    # pax: long names, long link targets, xattrs, nanoseconds, big ids, a global header
    long_dir = "long/" + "n" * 120 + "/"
    pax = tar(
        tarfile.TarInfo.create_pax_global_header({"comment": "fuzz"}),
        d(long_dir),
        f(long_dir + "file-" + "m" * 90, b"long\n", pax={"mtime": "1700000000.123456789", "atime": "1.5"}),
        sym("longlink", "t" * 300),
        f("xattr", b"x", pax={"SCHILY.xattr.user.fuzz": "value", "SCHILY.xattr.trusted.fuzz": "\x01\x02"}),
        sym("xattr-link", "xattr", pax={"SCHILY.xattr.user.on-a-symlink": "refused by Linux, skipped"}),
        f("bigid", b"", uid=1 << 22, gid=1 << 22),
        f("utf8-\u00e9\u00e8", b"accents"),
        f("hdrcharset", b"", pax={"hdrcharset": "BINARY", "path": "raw-\udcff"}),
    )
    s["pax"] = (0x00, pax)
    s["pax-merge-exists"] = (RS_MERGE | RS_EXISTS, pax)
    s["pax-sparse"] = (0x00, tar(gnu_sparse_1_0("sp", 20000, [(0, b"AAAAA"), (16384, b"BBBBB")])))
    s["pax-bad-header"] = (0x00, tar(f("p", b"", pax={"size": "-5", "GNU.sparse.major": "9"}), f("q", b"q")))
    # GNU: ././@LongLink names and link targets
    gnu = tar(
        member(ti("gnu/" + "g" * 150, size=3), b"gnu", fmt=tarfile.GNU_FORMAT),
        member(ti("gnu/sym", tarfile.SYMTYPE, link="L" * 200), fmt=tarfile.GNU_FORMAT),
        member(ti("gnu/hard-" + "h" * 120, tarfile.LNKTYPE, link="gnu/" + "g" * 150), fmt=tarfile.GNU_FORMAT),
    )
    s["gnu-long"] = (0x00, gnu)
    s["gnu-volume-negative"] = (0x00, raw_header(b"vol", b"V", b"\xff" * 12, magic=b"ustar  \0"))
    s["base256-size"] = (0x00, raw_header(b"b256", b"0", b"\x80" + b"\0" * 10 + b"\x03", magic=b"ustar  \0")
                         + pad(b"abc") + END_BLOCKS)
    s["bad-checksum"] = (0x00, bytes(bytearray(f("c", b"c"))[:148]) + b"0000000\0" + f("c", b"c")[156:] + END_BLOCKS)
    # links
    s["hardlinks"] = (0x00, tar(f("a", b"a"), hard("b", "a"), hard("c", "b"), hard("a", "a"), d("dd/"),
                                hard("dd/e", "./a"), hard("dd/f", "dd//e"), f("b", b"replaces a link"), hard("x", "dd")))
    s["hardlink-missing"] = (RS_EXISTS, tar(f("a", b"a"), hard("missing", "nothere")))
    s["symlinks"] = (0x00, tar(sym("abs", "/etc"), sym("up", "../.."), sym("loop", "loop"), sym("dot", "."),
                               f("abs/x", b"through an absolute symlink")))
    # what must be refused
    s["escape-dotdot"] = (RS_EXISTS, tar(f("../outside-file", b"escape")))
    s["escape-absolute"] = (RS_EXISTS, tar(f("/abs-file", b"escape")))
    s["escape-inner-dotdot"] = (RS_MERGE | RS_EXISTS, tar(d("a/"), f("a/../../x", b"escape")))
    s["escape-symlink-existing"] = (RS_MERGE | RS_EXISTS, tar(f("esc/pwned", b"through the existing symlink")))
    s["escape-symlink-new"] = (RS_MERGE, tar(sym("s", "../../outside"), f("s/pwned", b"through a new symlink")))
    s["escape-symlink-dir"] = (0x00, tar(sym("s", "/tmp"), d("s/"), f("s/x", b"x")))
    s["escape-hardlink-dotdot"] = (RS_MERGE | RS_EXISTS, tar(hard("h1", "../in.tar")))
    s["escape-hardlink-absolute"] = (RS_MERGE | RS_EXISTS, tar(hard("h2", "/etc/passwd")))
    s["escape-hardlink-symlink"] = (RS_MERGE | RS_EXISTS, tar(hard("h3", "esc/x")))
    s["root-replaced-by-file"] = (RS_EXISTS, tar(f(".", b"not a dir")))
    s["root-hardlink"] = (0x00, tar(f("a", b"a"), hard(".", "a")))
    s["devices"] = (RS_DEVICES, tar(member(ti("null", tarfile.CHRTYPE, mode=0o666)),
                                    member(ti("blk", tarfile.BLKTYPE, mode=0o600)), f("after", b"x")))
    s["devices-refused"] = (0x00, tar(member(ti("null", tarfile.CHRTYPE))))
    s["unknown-type"] = (0x00, tar(member(ti("weird", b"X")), member(ti("cont", tarfile.CONTTYPE, size=2), b"ct")))
    # the same name as a file, a directory and a file again; a directory mode without x
    s["replace-kinds"] = (RS_MERGE | RS_EXISTS, tar(f("x", b"1"), d("x/"), f("x/y", b"2"), d("f/"), sym("l", "new"),
                                                     d("e/"), f("e", b"over an empty dir"), sym("x/y", "z")))
    s["replace-nonempty-dir"] = (RS_MERGE | RS_EXISTS, tar(f("d", b"over a non-empty dir")))
    s["dir-modes"] = (0x00, tar(d("ro/", mode=0o500), f("ro/inside", b"i"), d("none/", mode=0), d("none/deeper/"),
                                d("ro/", mode=0o555)))
    deep = "/".join(["a"] * 140)
    s["deep"] = (0x00, tar(f(deep + "/leaf", b"deep"), f(deep[:100] + "/b", b"b")))
    s["many-members"] = (0x00, tar(*[f("m%03d" % i, bytes([i])) for i in range(24)]))
    s["name-too-long"] = (0x00, tar(f("n" * 300, b"x"), f("ok", b"y")))
    s["empty-name"] = (0x00, tar(f("", b"x")))
    # truncated and empty streams (a restore must refuse them: EBADMSG)
    s["truncated-mid-header"] = (RS_EXISTS, basic[:300])
    s["truncated-mid-data"] = (RS_EXISTS, tar(f("a", b"a" * 2000), end=False)[:1200])
    s["truncated-at-member"] = (RS_EXISTS, tar(f("a", b"a"), f("b", b"b"), end=False))
    s["one-end-block"] = (RS_EXISTS, tar(f("a", b"a"), end=False) + b"\0" * BLOCK)
    s["one-zero-block"] = (RS_EXISTS, b"\0" * BLOCK)
    s["zero-record"] = (RS_EXISTS, b"\0" * 10240)
    s["end-blocks-only"] = (RS_EXISTS, END_BLOCKS)
    s["end-blocks-only-allowed"] = (RS_EXISTS | RS_EMPTY_OK, END_BLOCKS)
    s["end-blocks-only-merge"] = (RS_MERGE | RS_EXISTS | RS_EMPTY_OK, gz(END_BLOCKS))
    s["empty"] = (RS_EXISTS, b"")
    s["not-tar"] = (RS_EXISTS, b"this is not an archive\n" * 30)
    s["trailing-garbage"] = (0x00, tar(f("a", b"a")) + b"garbage after the end")
    # compressed
    s["gzip"] = (0x00, gz(basic))
    s["gzip-exists-sha"] = (RS_EXISTS | RS_SHA, gz(pax))
    s["gzip-truncated"] = (RS_EXISTS, gz(basic)[:-20])
    s["gzip-two-members"] = (0x00, gz(tar(f("a", b"a"), end=False)) + gz(tar(f("b", b"b"))))
    s["gzip-garbage-after"] = (0x00, gz(basic) + b"\x1f\x8bgarbage")
    s["gzip-of-nothing"] = (RS_EXISTS, gz(b""))
    s["zstd"] = (0x00, zstd_raw(tar(basic_tree(), end=False), rle_tail=2 * BLOCK))
    s["zstd-merge"] = (RS_MERGE | RS_EXISTS, zstd_raw(gnu))
    s["zstd-truncated"] = (RS_EXISTS, zstd_raw(basic)[:-100])
    s["zstd-rle-only"] = (RS_EXISTS, zstd_raw(b"", rle_tail=4 * BLOCK))
    return s


TARGETS = {"conn": ("corpus", conn_seeds), "rx": ("corpus_rx", rx_seeds), "restore": ("corpus_restore", restore_seeds)}


def write_seeds(out, items):
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        if name.startswith("seed-"):
            os.unlink(os.path.join(out, name))
    total = 0
    for name, (ctl, body) in sorted(items.items()):
        data = bytes([ctl]) + body
        with open(os.path.join(out, "seed-" + name), "wb") as fh:
            fh.write(data)
        total += len(data)
    print(f"wrote {len(items)} seeds ({total} bytes) to {out}")


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which != "all" and which not in TARGETS or (which == "all" and len(sys.argv) > 2):
        sys.exit(__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    for name, (subdir, make) in TARGETS.items():
        if which in ("all", name):
            write_seeds(sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, subdir), make())


if __name__ == "__main__":
    main()
