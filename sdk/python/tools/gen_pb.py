#!/usr/bin/env python3
"""gen_pb: writes sandbox_shim/_pb.py, the pure-Python protobuf codec, from proto/shim.proto.

    python3 sdk/python/tools/gen_pb.py            regenerate src/sandbox_shim/_pb.py
    python3 sdk/python/tools/gen_pb.py --check    exit 1 (with a diff head) if it is stale
    ... --proto PATH --out PATH                   other input / output files

Stdlib only, so neither protoc nor the protobuf package is needed. It understands the
subset of proto2 that shim.proto uses -- `syntax`, `package`, top-level `message` and
`enum`, `oneof`, `required`/`optional`/`repeated` fields of the scalar types in SCALARS,
message and enum references, `//` and `/* */` comments -- and stops with an error at
anything else (nested types, maps, groups, options, imports, services, extensions,
reserved ranges, other scalar types): a construct it does not know must be taught to it,
never guessed at. The output is deterministic: the same schema gives the same bytes.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import os
import re
import sys
import textwrap
from typing import Dict, List, NoReturn, Optional, Set, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)  # sdk/python
ROOT = os.path.dirname(os.path.dirname(PKG))  # the repository
DEFAULT_PROTO = os.path.join(ROOT, "proto", "shim.proto")
DEFAULT_OUT = os.path.join(PKG, "src", "sandbox_shim", "_pb.py")

# proto scalar type -> (wire type, Python type in annotations)
SCALARS: Dict[str, Tuple[int, str]] = {
    "uint32": (0, "int"),
    "uint64": (0, "int"),
    "int32": (0, "int"),
    "int64": (0, "int"),
    "bool": (0, "bool"),
    "double": (1, "float"),
    "string": (2, "str"),
    "bytes": (2, "bytes"),
}
# legal proto2 types this generator has not been taught (their coding differs)
UNSUPPORTED_TYPES = {"float", "sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64"}

# integer ranges for EncodeError checks, and the masks decoding applies
INT_RANGES = {
    "uint32": ("0", "0xFFFFFFFF"),
    "uint64": ("0", "0xFFFFFFFFFFFFFFFF"),
    "int32": ("-0x80000000", "0x7FFFFFFF"),
    "int64": ("-0x8000000000000000", "0x7FFFFFFFFFFFFFFF"),
}

# names the generated module defines itself: a message or enum may not take them
MODULE_NAMES = {
    "DecodeError", "EncodeError", "encode_varint", "decode_varint", "read_delimited",
    "encode_delimited", "MESSAGES", "ENUMS", "PACKAGE", "TYPE_CHECKING", "Iterable",
    "struct", "annotations",
}
# attribute names of a generated message class besides its fields
CLASS_NAMES = {"encode", "decode", "self", "cls"}

MAX_FIELD = (1 << 29) - 1


class ProtoError(Exception):
    """The schema uses something this generator does not understand, or is invalid."""


# ---- schema model ----


class Field:
    def __init__(self, name: str, number: int, label: str, type_name: str, oneof: Optional[str],
                 line: int, lead: List[str], trail: str) -> None:
        self.name = name
        self.number = number
        self.label = label  # required | optional | repeated (oneof members: optional)
        self.type_name = type_name  # as written
        self.type = ""  # resolved: a SCALARS key or a top-level message / enum name
        self.kind = ""  # scalar | enum | message
        self.oneof = oneof
        self.line = line
        self.lead = lead  # comment lines above it
        self.trail = trail  # comment after it

    @property
    def wire_type(self) -> int:
        if self.kind == "scalar":
            return SCALARS[self.type][0]
        return 0 if self.kind == "enum" else 2

    @property
    def packable(self) -> bool:
        return self.label == "repeated" and self.wire_type != 2


class Oneof:
    def __init__(self, name: str, line: int) -> None:
        self.name = name
        self.line = line
        self.fields: List[Field] = []


class Message:
    def __init__(self, name: str, line: int, lead: List[str]) -> None:
        self.name = name
        self.line = line
        self.lead = lead
        self.fields: List[Field] = []  # in declaration order
        self.oneofs: List[Oneof] = []


class Enum:
    def __init__(self, name: str, line: int, lead: List[str]) -> None:
        self.name = name
        self.line = line
        self.lead = lead
        self.values: List[Tuple[str, int, str]] = []  # (name, number, trailing comment)


class Schema:
    def __init__(self) -> None:
        self.syntax = ""
        self.package = ""
        self.items: List[Union[Message, Enum]] = []


# ---- tokenizer ----

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f\v]+)
  | (?P<lcomment>//[^\n]*)
  | (?P<bcomment>/\*.*?\*/)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<int>-?(?:0[xX][0-9A-Fa-f]+|[0-9]+))(?![A-Za-z0-9_.])
  | (?P<str>"[^"\\\n]*"|'[^'\\\n]*')
  | (?P<sym>[{}\[\]()<>;=,.])
    """,
    re.VERBOSE | re.DOTALL,
)


class Token:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind: str, text: str, line: int, col: int) -> None:
        self.kind = kind
        self.text = text
        self.line = line
        self.col = col


class Comment:
    __slots__ = ("line", "col", "text", "own_line")

    def __init__(self, line: int, col: int, text: str, own_line: bool) -> None:
        self.line = line
        self.col = col
        self.text = text
        self.own_line = own_line


def tokenize(src: str, fname: str) -> Tuple[List[Token], Dict[int, Comment]]:
    tokens: List[Token] = []
    comments: Dict[int, Comment] = {}
    pos, line, line_start = 0, 1, 0
    last_token_line = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        col = pos - line_start + 1
        if m is None:
            what = "an unterminated /* comment" if src.startswith("/*", pos) else repr(src[pos])
            raise ProtoError(f"{fname}:{line}:{col}: unexpected {what}")
        kind, text = m.lastgroup or "", m.group()
        if kind == "lcomment":
            comments[line] = Comment(line, col, text[2:].strip(), last_token_line != line)
        elif kind not in ("ws", "bcomment"):
            tokens.append(Token(kind, text, line, col))
            last_token_line = line
        nl = text.count("\n")
        if nl:
            line += nl
            line_start = pos + text.rindex("\n") + 1
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens, comments


# ---- parser ----


class Parser:
    def __init__(self, src: str, fname: str) -> None:
        self.fname = fname
        self.toks, self.comments = tokenize(src, fname)
        self.i = 0
        self.used: Set[int] = set()  # comment lines already attached

    def fail(self, tok: Token, msg: str) -> NoReturn:
        raise ProtoError(f"{self.fname}:{tok.line}:{tok.col}: {msg}")

    def peek(self) -> Token:
        return self.toks[self.i]

    def next(self) -> Token:
        tok = self.toks[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def expect(self, text: str) -> Token:
        tok = self.next()
        if tok.text != text or tok.kind not in ("sym", "ident"):
            self.fail(tok, f"expected {text!r}, found {tok.text or 'end of file'!r}")
        return tok

    def ident(self, what: str) -> Token:
        tok = self.next()
        if tok.kind != "ident":
            self.fail(tok, f"expected {what}, found {tok.text or 'end of file'!r}")
        return tok

    def number(self, what: str) -> int:
        tok = self.next()
        if tok.kind != "int":
            self.fail(tok, f"expected {what}, found {tok.text or 'end of file'!r}")
        text = tok.text.lstrip("-")
        if text[:2] in ("0x", "0X"):
            n = int(text[2:], 16)
        elif len(text) > 1 and text[0] == "0":
            self.fail(tok, f"octal number {tok.text} is not supported")
        else:
            n = int(text)
        return -n if tok.text.startswith("-") else n

    def dotted(self, what: str) -> str:
        """A possibly qualified name: [.]a.b.c"""
        parts = []
        if self.peek().text == "." and self.peek().kind == "sym":
            self.next()
            parts.append("")
        parts.append(self.ident(what).text)
        while self.peek().kind == "sym" and self.peek().text == ".":
            self.next()
            parts.append(self.ident(what).text)
        return ".".join(parts)

    def lead_comments(self, line: int) -> List[str]:
        """The run of whole-line // comments directly above `line`."""
        out: List[str] = []
        ln = line - 1
        while ln in self.comments and self.comments[ln].own_line and ln not in self.used:
            out.append(self.comments[ln].text)
            self.used.add(ln)
            ln -= 1
        out.reverse()
        return out

    def trail_comment(self, line: int) -> str:
        """The // comment after a declaration on `line`, with the whole-line comments
        below it that start in the same column (its continuation)."""
        c = self.comments.get(line)
        if c is None or c.own_line or line in self.used:
            return ""
        self.used.add(line)
        parts = [c.text]
        ln = line + 1
        while ln in self.comments and self.comments[ln].own_line and self.comments[ln].col == c.col:
            parts.append(self.comments[ln].text)
            self.used.add(ln)
            ln += 1
        return " ".join(p for p in parts if p)

    def parse(self) -> Schema:
        schema = Schema()
        first = True
        while True:
            tok = self.peek()
            if tok.kind == "eof":
                break
            if tok.kind == "sym" and tok.text == ";":
                self.next()
                continue
            if tok.kind != "ident":
                self.fail(tok, f"unexpected {tok.text!r} at top level")
            if tok.text == "syntax":
                if not first:
                    self.fail(tok, "'syntax' must be the first statement")
                self.next()
                self.expect("=")
                s = self.next()
                if s.kind != "str":
                    self.fail(s, "expected a string after 'syntax ='")
                schema.syntax = s.text[1:-1]
                if schema.syntax != "proto2":
                    self.fail(s, f"syntax {s.text} is not supported: only proto2")
                self.expect(";")
            elif tok.text == "package":
                if schema.package:
                    self.fail(tok, "a second 'package' statement")
                self.next()
                schema.package = self.dotted("a package name")
                if schema.package.startswith("."):
                    self.fail(tok, "a package name cannot start with '.'")
                self.expect(";")
            elif tok.text == "message":
                schema.items.append(self.message())
            elif tok.text == "enum":
                schema.items.append(self.enum())
            else:
                self.fail(tok, f"{tok.text!r} is not supported by gen_pb.py "
                               "(only syntax, package, message and enum at top level)")
            first = False
        if not schema.syntax:
            raise ProtoError(f"{self.fname}: no 'syntax = \"proto2\";' statement")
        return schema

    def message(self) -> Message:
        start = self.expect("message")
        lead = self.lead_comments(start.line)
        name = self.ident("a message name")
        msg = Message(name.text, name.line, lead)
        self.expect("{")
        while True:
            tok = self.peek()
            if tok.kind == "sym" and tok.text == "}":
                self.next()
                break
            if tok.kind == "sym" and tok.text == ";":
                self.next()
                continue
            if tok.kind != "ident":
                self.fail(tok, f"unexpected {tok.text or 'end of file'!r} in message {msg.name}")
            if tok.text in ("required", "optional", "repeated"):
                self.next()
                msg.fields.append(self.field(msg, tok, tok.text, None))
            elif tok.text == "oneof":
                self.oneof(msg)
            elif tok.text in ("message", "enum"):
                self.fail(tok, f"nested {tok.text} in {msg.name} is not supported: "
                               "declare it at top level")
            elif tok.text in ("map", "group", "option", "reserved", "extensions", "extend"):
                self.fail(tok, f"{tok.text!r} (in message {msg.name}) is not supported by gen_pb.py")
            else:
                self.fail(tok, f"field without a label in message {msg.name}: proto2 fields are "
                               "required, optional or repeated")
        return msg

    def oneof(self, msg: Message) -> None:
        start = self.expect("oneof")
        self.lead_comments(start.line)  # consumed; a oneof has no place for them
        name = self.ident("a oneof name")
        one = Oneof(name.text, name.line)
        msg.oneofs.append(one)
        self.expect("{")
        while True:
            tok = self.peek()
            if tok.kind == "sym" and tok.text == "}":
                self.next()
                break
            if tok.kind == "sym" and tok.text == ";":
                self.next()
                continue
            if tok.kind == "ident" and tok.text in ("required", "optional", "repeated"):
                self.fail(tok, f"a oneof member (in {msg.name}.{one.name}) takes no label")
            if tok.kind == "ident" and tok.text in ("option", "group", "map", "message", "enum"):
                self.fail(tok, f"{tok.text!r} in oneof {msg.name}.{one.name} is not supported")
            f = self.field(msg, tok, "optional", one.name)
            one.fields.append(f)
            msg.fields.append(f)
        if not one.fields:
            self.fail(name, f"oneof {msg.name}.{one.name} has no members")

    def field(self, msg: Message, start: Token, label: str, oneof: Optional[str]) -> Field:
        lead = self.lead_comments(start.line)
        ttok = self.peek()
        if ttok.kind == "ident" and ttok.text in ("group", "map"):
            self.fail(ttok, f"{ttok.text!r} fields (in {msg.name}) are not supported")
        type_name = self.dotted("a field type")
        if type_name in UNSUPPORTED_TYPES:
            self.fail(ttok, f"type {type_name} (in {msg.name}) is not supported by gen_pb.py yet")
        name = self.ident("a field name")
        self.expect("=")
        ntok = self.peek()
        number = self.number("a field number")
        if not 1 <= number <= MAX_FIELD or 19000 <= number <= 19999:
            self.fail(ntok, f"field number {number} of {msg.name}.{name.text} is not allowed")
        end = self.next()
        if end.kind == "sym" and end.text == "[":
            self.fail(end, f"field options (on {msg.name}.{name.text}) are not supported by gen_pb.py")
        if not (end.kind == "sym" and end.text == ";"):
            self.fail(end, f"expected ';' after {msg.name}.{name.text} = {number}")
        return Field(name.text, number, label, type_name, oneof, name.line, lead,
                     self.trail_comment(end.line))

    def enum(self) -> Enum:
        start = self.expect("enum")
        lead = self.lead_comments(start.line)
        name = self.ident("an enum name")
        en = Enum(name.text, name.line, lead)
        self.expect("{")
        while True:
            tok = self.peek()
            if tok.kind == "sym" and tok.text == "}":
                self.next()
                break
            if tok.kind == "sym" and tok.text == ";":
                self.next()
                continue
            if tok.kind == "ident" and tok.text in ("option", "reserved"):
                self.fail(tok, f"{tok.text!r} in enum {en.name} is not supported by gen_pb.py")
            vname = self.ident(f"a value name in enum {en.name}")
            self.lead_comments(vname.line)
            self.expect("=")
            ntok = self.peek()
            number = self.number("an enum value")
            if not -(1 << 31) <= number < (1 << 31):
                self.fail(ntok, f"enum value {en.name}.{vname.text} = {number} is out of int32 range")
            end = self.next()
            if end.kind == "sym" and end.text == "[":
                self.fail(end, f"enum value options (on {vname.text}) are not supported by gen_pb.py")
            if not (end.kind == "sym" and end.text == ";"):
                self.fail(end, f"expected ';' after {vname.text} = {number}")
            en.values.append((vname.text, number, self.trail_comment(end.line)))
        if not en.values:
            self.fail(name, f"enum {en.name} has no values")
        return en


# ---- checks ----


def check(schema: Schema, fname: str) -> None:
    """Names, numbers and type references; fills Field.type and Field.kind."""
    def fail(line: int, msg: str) -> NoReturn:
        raise ProtoError(f"{fname}:{line}: {msg}")

    types: Dict[str, Union[Message, Enum]] = {}
    enum_values: Dict[str, str] = {}
    for item in schema.items:
        n = item.name
        if n in types:
            fail(item.line, f"{n} is defined twice")
        if n.startswith("_") or keyword.iskeyword(n) or n in MODULE_NAMES or n in SCALARS:
            fail(item.line, f"the name {n} is not usable in the generated module")
        types[n] = item
    for item in schema.items:
        if isinstance(item, Enum):
            if item.name + "_NAMES" in types:
                fail(item.line, f"{item.name}_NAMES would clash with a type of that name")
            seen: Dict[int, str] = {}
            for vname, num, _ in item.values:
                if vname.startswith("_") or keyword.iskeyword(vname):
                    fail(item.line, f"enum value name {vname} is not usable in Python")
                if vname in enum_values or vname in types:
                    # proto scopes enum values beside their enum: unique in the package
                    fail(item.line, f"{vname} is defined twice ({enum_values.get(vname, 'a type')})")
                enum_values[vname] = item.name
                if num in seen:
                    fail(item.line, f"{item.name}: {vname} and {seen[num]} share the value {num} "
                                    "(aliases need allow_alias, which is not supported)")
                seen[num] = vname
            continue
        msg = item
        names: Set[str] = set()
        numbers: Dict[int, str] = {}
        oneof_names = {o.name for o in msg.oneofs}
        for o in msg.oneofs:
            if not o.name.isidentifier() or keyword.iskeyword(o.name) or o.name.startswith("_"):
                fail(o.line, f"oneof name {msg.name}.{o.name} is not usable in Python")
        for f in msg.fields:
            where = f"{msg.name}.{f.name}"
            if f.name in names:
                fail(f.line, f"{where} is declared twice")
            names.add(f.name)
            if (keyword.iskeyword(f.name) or f.name.startswith("_") or f.name in CLASS_NAMES
                    or f.name.startswith("which_") or f.name in oneof_names):
                fail(f.line, f"field name {where} is not usable in the generated class")
            if f.number in numbers:
                fail(f.line, f"{where} reuses field number {f.number} of {msg.name}.{numbers[f.number]}")
            numbers[f.number] = f.name
            t = f.type_name
            if t in SCALARS:
                f.type, f.kind = t, "scalar"
                continue
            if t.startswith("."):
                t = t[1:]
                if schema.package:
                    if not t.startswith(schema.package + "."):
                        fail(f.line, f"{where}: type {f.type_name} is outside package {schema.package}")
                    t = t[len(schema.package) + 1:]
            elif schema.package and t.startswith(schema.package + "."):
                t = t[len(schema.package) + 1:]
            target = types.get(t)
            if target is None or "." in t:
                fail(f.line, f"{where}: unknown type {f.type_name}")
            f.type = t
            f.kind = "enum" if isinstance(target, Enum) else "message"


# ---- code generation ----


def blit(b: bytes) -> str:
    """A bytes literal with every byte as \\xNN (tags read better that way)."""
    return 'b"' + "".join(f"\\x{c:02x}" for c in b) + '"'


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def q(s: str) -> str:
    """s as a double-quoted literal (black's style, like the rest of the package)."""
    r = repr(s)
    if r.startswith("'") and '"' not in s:
        r = '"' + r[1:-1] + '"'
    return r


def comment_text(text: str) -> str:
    return " ".join(text.split())


def annotation(f: Field) -> str:
    if f.kind == "scalar":
        t = SCALARS[f.type][1]
    elif f.kind == "enum":
        t = "int"
    else:
        t = f.type
    if f.label == "repeated":
        return f"Iterable[{t}] | None"
    return f"{t} | None"


class Gen:
    def __init__(self, schema: Schema, proto_display: str) -> None:
        self.schema = schema
        self.proto_display = proto_display
        self.lines: List[str] = []
        self.helpers: Set[str] = set()  # optional helpers the messages need

    def w(self, indent: int, text: str = "") -> None:
        self.lines.append(("    " * indent + text) if text else "")

    # -- encode --

    def enc_value(self, ind: int, msg: Message, f: Field) -> None:
        """Code that appends field f's tag and the value held in `v`."""
        where = f"{msg.name}.{f.name}"
        tag = blit(varint(f.number << 3 | f.wire_type))
        w = self.w
        if f.kind == "message":
            w(ind, f"out += {tag}")
            w(ind, f"_put_msg(out, v, {f.type}, {q(where)})")
        elif f.type == "string":
            w(ind, f"out += {tag}")
            w(ind, f"_put_str(out, v, {q(where)})")
        elif f.type == "bytes":
            w(ind, f"out += {tag}")
            w(ind, f"_put_bytes(out, v, {q(where)})")
        elif f.type == "bool":
            key = varint(f.number << 3)
            w(ind, "if v is True:")
            w(ind + 1, f"out += {blit(key + bytes((1,)))}")
            w(ind, "elif v is False:")
            w(ind + 1, f"out += {blit(key + bytes((0,)))}")
            w(ind, "else:")
            w(ind + 1, f"raise _type_error({q(where)}, v, \"bool\")")
        elif f.type == "double":
            w(ind, "if v.__class__ is not float:")
            w(ind + 1, f"v = _float(v, {q(where)})")
            w(ind, f"out += {tag}")
            w(ind, "out += _pack_d(v)")
        else:  # an integer type or an enum (int32 on the wire)
            t = "int32" if f.kind == "enum" else f.type
            lo, hi = INT_RANGES[t]
            w(ind, f"if v.__class__ is not int or v < {lo} or v > {hi}:")
            w(ind + 1, f"v = _check_int(v, {q(where)}, {q(t)})")
            w(ind, f"out += {tag}")
            if t.startswith("u"):
                w(ind, "if v < 0x80:")
                w(ind + 1, "out.append(v)")
                w(ind, "else:")
                w(ind + 1, "out += _ev(v)")
            else:
                w(ind, "if 0 <= v < 0x80:")
                w(ind + 1, "out.append(v)")
                w(ind, "else:")
                w(ind + 1, "out += _ev(v & 0xFFFFFFFFFFFFFFFF)  # negative: 10 bytes, two's complement")

    def gen_encode(self, msg: Message) -> None:
        w = self.w
        w(1, "def encode(self) -> bytes:")
        w(2, '"""The message in protobuf binary form; EncodeError if it cannot be encoded."""')
        if not msg.fields:
            w(2, 'return b""')
            return
        w(2, "out = bytearray()")
        for o in msg.oneofs:
            w(2, f"n_{o.name} = 0  # members of oneof {o.name} set")
        for f in sorted(msg.fields, key=lambda x: x.number):
            where = f"{msg.name}.{f.name}"
            if f.label == "repeated":
                w(2, f"vs = self.{f.name}")
                w(2, "if vs.__class__ is not list:")
                w(3, f"vs = _seq(vs, {q(where)})")
                w(2, "for v in vs:")
                self.enc_value(3, msg, f)
                continue
            w(2, f"v = self.{f.name}")
            if f.label == "required":
                w(2, "if v is None:")
                w(3, f"raise EncodeError({q(where + ': required field not set')})")
                self.enc_value(2, msg, f)
            else:
                w(2, "if v is not None:")
                if f.oneof:
                    w(3, f"n_{f.oneof} += 1")
                self.enc_value(3, msg, f)
        for o in msg.oneofs:
            w(2, f"if n_{o.name} > 1:")
            w(3, f"raise _oneof_error(self, {q(o.name)})")
        w(2, "return bytes(out)")

    # -- decode --

    def dec_varint(self, ind: int, target: str, t: str) -> None:
        """Read a varint at data[pos] into v, normalised for type t (proto scalar or 'enum')."""
        w = self.w
        w(ind, "v = data[pos]")
        w(ind, "if v < 0x80:")
        w(ind + 1, "pos += 1")
        w(ind, "else:")
        w(ind + 1, "v, pos = _dv(data, pos)")
        if t == "uint32":
            w(ind + 1, "v &= 0xFFFFFFFF")
        elif t == "uint64" or t == "bool":
            w(ind + 1, "v &= 0xFFFFFFFFFFFFFFFF")
        elif t in ("int32", "enum"):
            w(ind + 1, "v &= 0xFFFFFFFF")
            w(ind + 1, "if v > 0x7FFFFFFF:")
            w(ind + 2, "v -= 0x100000000")
        elif t == "int64":
            w(ind + 1, "v &= 0xFFFFFFFFFFFFFFFF")
            w(ind + 1, "if v > 0x7FFFFFFFFFFFFFFF:")
            w(ind + 2, "v -= 0x10000000000000000")
        else:
            raise AssertionError(t)
        val = "v != 0" if t == "bool" else "v"
        w(ind, target.format(val))

    def gen_decode(self, msg: Message) -> None:
        w = self.w
        name = msg.name
        w(1, "@classmethod")
        w(1, f"def decode(cls, data: bytes | bytearray | memoryview) -> {name}:")
        w(2, '"""The message encoded in data; DecodeError if data is not one."""')
        w(2, f"return _decode({name}, data)")
        w(0)
        w(1, "@staticmethod")
        w(1, f"def _dec(data: bytes, pos: int, end: int) -> {name}:")
        w(2, f"self = {name}.__new__({name})")
        for f in msg.fields:
            w(2, f"self.{f.name} = {'[]' if f.label == 'repeated' else 'None'}")
        for o in msg.oneofs:
            w(2, f"o_{o.name} = None  # the member of oneof {o.name} seen last")
        w(2, "while pos < end:")
        w(3, "tag = data[pos]")
        w(3, "if tag < 0x80:")
        w(4, "pos += 1")
        w(3, "else:")
        w(4, "tag, pos = _dv(data, pos)")
        kw = "if"
        for f in sorted(msg.fields, key=lambda x: x.number):
            self.dec_field(msg, f, kw)
            kw = "elif"
        if msg.fields:
            w(3, "else:")
            w(4, f"pos = _skip(data, pos, end, tag, {name}._NUMBERS, {q(name)})")
        else:
            w(3, f"pos = _skip(data, pos, end, tag, {name}._NUMBERS, {q(name)})")
        w(2, "if pos != end:")
        w(3, f"raise DecodeError({q(name + ': the last field runs past the end of the message')})")
        for f in msg.fields:
            if f.label == "required":
                w(2, f"if self.{f.name} is None:")
                w(3, f"raise DecodeError({q(name + '.' + f.name + ': required field missing')})")
        w(2, "return self")

    def dec_field(self, msg: Message, f: Field, kw: str) -> None:
        w = self.w
        where = f"{msg.name}.{f.name}"
        key = f.number << 3 | f.wire_type
        tname = f.type if f.kind != "enum" else f"{f.type} (enum)"
        desc = f"field {f.number} {f.name}: {f.label + ' ' if f.label == 'repeated' else ''}{tname}"
        if f.oneof:
            desc += f", oneof {f.oneof}"
        w(3, f"{kw} tag == {key}:  # {desc}")
        rep = f.label == "repeated"
        if rep:
            target = f"self.{f.name}.append({{}})"
        else:
            target = f"self.{f.name} = {{}}"
        if f.oneof:
            w(4, f"if o_{f.oneof} is not None:")
            w(5, f"setattr(self, o_{f.oneof}, None)")
            w(4, f"o_{f.oneof} = {q(f.name)}")
        if f.kind == "message":
            w(4, f"p, pos = _ld(data, pos, end, {q(where)})")
            w(4, target.format(f"{f.type}._dec(data, p, pos)"))
        elif f.type == "string":
            w(4, f"p, pos = _ld(data, pos, end, {q(where)})")
            w(4, target.format('data[p:pos].decode("utf-8", "replace")'))
        elif f.type == "bytes":
            w(4, f"p, pos = _ld(data, pos, end, {q(where)})")
            w(4, target.format("data[p:pos]"))
        elif f.type == "double":
            w(4, "if end - pos < 8:")
            w(5, f"raise DecodeError({q(where + ': truncated double')})")
            w(4, target.format("_unpack_d(data, pos)[0]"))
            w(4, "pos += 8")
        else:
            self.dec_varint(4, target, "enum" if f.kind == "enum" else f.type)
        if f.packable:
            # proto2 writes repeated numbers unpacked, but a parser must take both forms
            pkey = f.number << 3 | 2
            w(3, f"elif tag == {pkey}:  # field {f.number} {f.name}, packed")
            w(4, f"p, pos = _ld(data, pos, end, {q(where)})")
            if f.type == "double":
                self.helpers.add("packed_doubles")
                w(4, f"self.{f.name} += _packed_doubles(data, p, pos, {q(where)})")
            else:
                self.helpers.add("packed_varints")
                t = "enum" if f.kind == "enum" else f.type
                conv = {
                    "uint32": "v & 0xFFFFFFFF",
                    "uint64": "v & 0xFFFFFFFFFFFFFFFF",
                    "bool": "v & 0xFFFFFFFFFFFFFFFF != 0",
                    "int32": "_s32(v)",
                    "enum": "_s32(v)",
                    "int64": "_s64(v)",
                }[t]
                if conv.startswith("_s32"):
                    self.helpers.add("s32")
                if conv.startswith("_s64"):
                    self.helpers.add("s64")
                w(4, f"self.{f.name} += [{conv} for v in _packed_varints(data, p, pos, {q(where)})]")

    # -- the rest of a class --

    def gen_init(self, msg: Message) -> None:
        w = self.w
        if not msg.fields:
            w(1, "def __init__(self) -> None:")
            w(2, "pass")
            return
        w(1, "def __init__(")
        w(2, "self,")
        w(2, "*,")
        for f in msg.fields:
            for c in f.lead:
                w(2, f"# {comment_text(c)}" if c.strip() else "#")
            line = f"{f.name}: {annotation(f)} = None,"
            if f.trail and len(line) + len(f.trail) > 100:  # too long for the end of the line: above it
                for c in textwrap.wrap(comment_text(f.trail), 100 - 10):
                    w(2, f"# {c}")
            elif f.trail:
                line += f"  # {comment_text(f.trail)}"
            w(2, line)
        w(1, ") -> None:")
        for f in msg.fields:
            if f.label == "repeated":
                w(2, f"self.{f.name} = [] if {f.name} is None else _list({f.name}, "
                     f"{q(msg.name + '.' + f.name)})")
            else:
                w(2, f"self.{f.name} = {f.name}")

    def gen_which(self, msg: Message) -> None:
        w = self.w
        for o in msg.oneofs:
            w(0)
            w(1, f"def which_{o.name}(self) -> str | None:")
            w(2, f'"""The name of the member of oneof {o.name} that is set, or None."""')
            for f in o.fields:
                w(2, f"if self.{f.name} is not None:")
                w(3, f"return {q(f.name)}")
            w(2, "return None")

    def gen_message(self, msg: Message) -> None:
        w = self.w
        pkg = self.schema.package
        for c in msg.lead:
            w(0, f"# {comment_text(c)}" if c.strip() else "#")
        w(0, f"class {msg.name}(_Message):")
        w(1, f'"""message {pkg + "." if pkg else ""}{msg.name}"""')
        w(0)
        slots = ", ".join(q(f.name) for f in msg.fields) + ("," if len(msg.fields) == 1 else "")
        if len(f"    __slots__ = ({slots})") <= 100:
            w(1, f"__slots__ = ({slots})")
        else:
            w(1, "__slots__ = (")
            for f in msg.fields:
                w(2, f"{q(f.name)},")
            w(1, ")")
        if msg.fields:
            # (number, name, label, kind, type, oneof); _NUMBERS is made from it at the end
            w(1, "_FIELDS = (")
            for f in sorted(msg.fields, key=lambda x: x.number):
                oneof = q(f.oneof) if f.oneof else "None"
                w(2, f"({f.number}, {q(f.name)}, {q(f.label)}, {q(f.kind)}, {q(f.type)}, {oneof}),")
            w(1, ")")
        if msg.oneofs:
            w(1, "_ONEOFS = {")
            for o in msg.oneofs:
                w(2, f"{q(o.name)}: (")
                for f in o.fields:
                    w(3, f"{q(f.name)},")
                w(2, "),")
            w(1, "}")
        w(0)
        self.gen_init(msg)
        w(0)
        self.gen_encode(msg)
        w(0)
        self.gen_decode(msg)
        self.gen_which(msg)

    def gen_enum(self, en: Enum) -> None:
        w = self.w
        pkg = self.schema.package
        for c in en.lead:
            w(0, f"# {comment_text(c)}" if c.strip() else "#")
        w(0, f"class {en.name}:")
        w(1, f'"""enum {pkg + "." if pkg else ""}{en.name} (a field of this type holds a plain int)"""')
        w(0)
        w(1, "__slots__ = ()")
        for vname, num, trail in en.values:
            w(1, f"{vname} = {num}" + (f"  # {comment_text(trail)}" if trail else ""))
        w(0)
        w(0)
        w(0, f"{en.name}_NAMES = {{")
        for vname, num, _ in en.values:
            w(1, f"{num}: {q(vname)},")
        w(0, "}")

    def generate(self) -> str:
        body_start = len(self.lines)
        for item in self.schema.items:
            self.w(0)
            self.w(0)
            if isinstance(item, Enum):
                self.gen_enum(item)
            else:
                self.gen_message(item)
        body = self.lines[body_start:]
        self.lines = []
        pkg = self.schema.package
        head = PREAMBLE.replace("@PROTO@", self.proto_display).replace("@PACKAGE@", pkg)
        head = head.rstrip("\n").split("\n")
        for name in ("packed_varints", "packed_doubles", "s32", "s64"):
            if name in self.helpers:
                head += [""] + OPTIONAL_HELPERS[name].rstrip("\n").split("\n")
        tail = ["", "", f"PACKAGE = {q(pkg)}", "", "# every message class and every enum class, by name",
                "MESSAGES = {"]
        tail += [f"    {q(m.name)}: {m.name}," for m in self.schema.items if isinstance(m, Message)]
        tail += ["}", "ENUMS = {"]
        tail += [f"    {q(e.name)}: {e.name}," for e in self.schema.items if isinstance(e, Enum)]
        if any(isinstance(m, Message) for m in self.schema.items):
            tail += ["}", "", "for _cls in MESSAGES.values():",
                     "    _cls._NUMBERS = {f[0]: f[1] for f in _cls._FIELDS}  # for _skip: the field numbers known",
                     "del _cls"]
        else:
            tail += ["}"]
        return "\n".join(head + body + tail) + "\n"


# The generated module's head: its docstring and the runtime every class uses.
# @PROTO@ and @PACKAGE@ are replaced; the rest is copied as it is.
PREAMBLE = '''\
# Generated by tools/gen_pb.py from @PROTO@; do not edit.
# Regenerate with `python3 sdk/python/tools/gen_pb.py`; `--check` tells whether this is stale.
"""_pb: the shim protocol's messages (package @PACKAGE@) as plain Python classes with a
protobuf (proto2) binary codec in pure Python: no protoc, no protobuf package, stdlib only.

Every message class takes its fields as keyword arguments. A field not present is None;
a repeated field is a list (empty when absent); an enum field holds a plain int (values
not in the enum are kept as they are). ``msg.encode()`` gives the bytes, writing fields
in field-number order, repeated numbers unpacked; ``Class.decode(data)`` takes bytes,
bytearray or memoryview. ``which_<oneof>()`` names the member of a oneof that is set.

Decoding skips unknown fields, accepts repeated numbers packed or not, and keeps the last
value of a field that appears twice -- an embedded message too: it replaces the earlier
one rather than being merged into it as protobuf does. Of a oneof, the member seen last
wins and the others are reset to None. Strings are decoded as UTF-8 with errors="replace".
Any malformed input raises DecodeError, never another exception; a value that cannot be
encoded (a required field unset, two members of one oneof set, a value out of range for
its type or of the wrong Python type) raises EncodeError. Both are ValueErrors.

Field metadata: ``Class._FIELDS`` is a tuple, in field-number order, of
``(number, name, label, kind, type, oneof)`` with label "required" / "optional" /
"repeated", kind "scalar" (type: the proto scalar type), "enum" or "message" (type: the
class name), oneof: the oneof's name or None. ``Class._ONEOFS`` maps each oneof to its
members. MESSAGES and ENUMS map names to classes.
"""

from __future__ import annotations

import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the message asked for."""


class EncodeError(ValueError):
    """A message that cannot be encoded: a required field not set, two members of one
    oneof set, a value out of range for its field or of the wrong type."""


_pack_d = struct.Struct("<d").pack
_unpack_d = struct.Struct("<d").unpack_from
_REDACTED = ("secret", "token", "access_key")  # repr shows only the length of these fields


def encode_varint(n: int) -> bytes:
    """n as a protobuf varint: 0 <= n < 2**64, or a negative n >= -2**63 as 10 bytes of
    two's complement (how int32 and int64 fields carry negative values)."""
    if n.__class__ is not int:
        n = _int(n, "varint")
    if n < 0:
        if n < -0x8000000000000000:
            raise _range_error("varint", n, "int64")
        n &= 0xFFFFFFFFFFFFFFFF
    elif n > 0xFFFFFFFFFFFFFFFF:
        raise _range_error("varint", n, "uint64")
    return bytes(_ev(n))


def _ev(n: int) -> bytes | bytearray:
    # n: 0 <= n < 2**64, checked by the caller
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return out


def decode_varint(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """(value, position after it) of the varint at buf[pos] (pos >= 0). DecodeError if it is cut
    short or longer than 10 bytes. The value is not masked: up to 70 bits as read."""
    # unrolled for the first four bytes: it is on every decode's path
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        n = b & 0x7F
        b = buf[pos + 1]
        if b < 0x80:
            return n | b << 7, pos + 2
        n |= (b & 0x7F) << 7
        b = buf[pos + 2]
        if b < 0x80:
            return n | b << 14, pos + 3
        n |= (b & 0x7F) << 14
        b = buf[pos + 3]
        if b < 0x80:
            return n | b << 21, pos + 4
        n |= (b & 0x7F) << 21
        pos += 4
        shift = 28
        while True:
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n, pos
            shift += 7
            if shift == 70:
                raise DecodeError("varint longer than 10 bytes")
    except IndexError:
        raise DecodeError("truncated varint") from None


_dv = decode_varint


def read_delimited(
    buf: bytes | bytearray | memoryview, pos: int = 0
) -> tuple[bytes | bytearray | memoryview, int]:
    """One message of protobuf's length-delimited stream format (a varint length, then
    the message) at buf[pos]: (the message's bytes, position after it). The bytes are a
    slice of buf, of buf's type (a memoryview of a memoryview). DecodeError if the length
    is cut short or runs past the end of buf; call it only when pos < len(buf)."""
    n, pos = decode_varint(buf, pos)
    if n > len(buf) - pos:
        raise DecodeError(f"delimited message of {n} bytes runs past the end of the buffer")
    return buf[pos:pos + n], pos + n


def encode_delimited(msg: _Message) -> bytes:
    """msg in the length-delimited stream format: its length as a varint, then it."""
    b = msg.encode()
    return bytes(_ev(len(b))) + b


# ---- helpers of the generated classes ----


class _Message:
    """What every message class shares: equality, repr (length only of secrets)."""

    __slots__ = ()
    _FIELDS: tuple = ()
    _ONEOFS: dict = {}
    _NUMBERS: dict = {}

    def encode(self) -> bytes:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        for name in self.__slots__:
            if getattr(self, name) != getattr(other, name):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        parts = []
        for _, name, label, _, _, _ in self._FIELDS:
            v = getattr(self, name)
            if v is None or (label == "repeated" and not v):
                continue
            if any(w in name for w in _REDACTED):
                if isinstance(v, list):
                    parts.append(f"{name}=[{', '.join(_redact(x) for x in v)}]")
                else:
                    parts.append(f"{name}={_redact(v)}")
            else:
                parts.append(f"{name}={v!r}")
        return f"{self.__class__.__name__}({', '.join(parts)})"


def _redact(v: object) -> str:
    if isinstance(v, str):
        return f"<{len(v.encode('utf-8', 'replace'))} bytes>"
    try:
        return f"<{len(v)} bytes>"  # type: ignore[arg-type]
    except TypeError:
        return "<?>"


def _decode(cls: type, data: bytes | bytearray | memoryview) -> _Message:
    if data.__class__ is not bytes:
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
        else:
            raise TypeError(f"{cls.__name__}.decode takes bytes, bytearray or memoryview, "
                            f"not {type(data).__name__}")
    try:
        return cls._dec(data, 0, len(data))  # type: ignore[attr-defined, no-any-return]
    except IndexError:
        # a read at the very end of data: the inline fast paths leave this check to here
        raise DecodeError(f"{cls.__name__}: truncated message") from None
    except RecursionError:
        raise DecodeError(f"{cls.__name__}: messages nested too deeply") from None


def _ld(data: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    # a length-delimited field's value: (start, end) of its bytes
    n = data[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _dv(data, pos)
    stop = pos + n
    if stop > end:
        raise DecodeError(f"{where}: length {n} runs past the end of the message")
    return pos, stop


def _skip(data: bytes, pos: int, end: int, tag: int, numbers: dict, where: str) -> int:
    # a field this message does not know: skipped; a known one with the wrong wire type
    # or a group: refused
    num = tag >> 3
    wt = tag & 7
    if num in numbers:
        raise DecodeError(f"{where}.{numbers[num]}: unexpected wire type {wt}")
    if num == 0 or tag > 0xFFFFFFFF:
        raise DecodeError(f"{where}: invalid field number {num}")
    if wt == 0:
        return _dv(data, pos)[1]
    if wt == 2:
        return _ld(data, pos, end, f"{where}: field {num}")[1]
    if wt == 1:
        pos += 8
    elif wt == 5:
        pos += 4
    elif wt == 3 or wt == 4:
        raise DecodeError(f"{where}: field {num}: groups (wire type {wt}) are not supported")
    else:
        raise DecodeError(f"{where}: field {num}: invalid wire type {wt}")
    if pos > end:
        raise DecodeError(f"{where}: field {num} runs past the end of the message")
    return pos


def _type_error(where: str, v: object, expected: str) -> EncodeError:
    return EncodeError(f"{where}: expected {expected}, got {type(v).__name__}")


def _range_error(where: str, v: int, t: str) -> EncodeError:
    return EncodeError(f"{where}: {v} is out of range for {t}")


def _check_int(v: object, where: str, t: str) -> int:
    # the slow path of an integer field: an int subclass (IntEnum...), or an error
    v = _int(v, where)
    lo, hi = _INT_RANGES[t]
    if v < lo or v > hi:
        raise _range_error(where, v, t)
    return v


_INT_RANGES = {
    "uint32": (0, 0xFFFFFFFF),
    "uint64": (0, 0xFFFFFFFFFFFFFFFF),
    "int32": (-0x80000000, 0x7FFFFFFF),
    "int64": (-0x8000000000000000, 0x7FFFFFFFFFFFFFFF),
}


def _int(v: object, where: str) -> int:
    # ints and int subclasses (IntEnum...); bool is refused: it is a mistake here
    if isinstance(v, int) and not isinstance(v, bool):
        return int(v)
    raise _type_error(where, v, "int")


def _float(v: object, where: str) -> float:
    if isinstance(v, (float, int)) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            raise EncodeError(f"{where}: {v} is out of range for double") from None
    raise _type_error(where, v, "float")


def _put_str(out: bytearray, v: object, where: str) -> None:
    if not isinstance(v, str):
        raise _type_error(where, v, "str")
    try:
        b = v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EncodeError(f"{where}: not encodable as UTF-8: {e.reason} at {e.start}") from None
    n = len(b)
    if n < 0x80:
        out.append(n)
    else:
        out += _ev(n)
    out += b


def _put_bytes(out: bytearray, v: object, where: str) -> None:
    if v.__class__ is not bytes:
        if isinstance(v, memoryview):
            v = v.tobytes()
        elif not isinstance(v, (bytes, bytearray)):
            raise _type_error(where, v, "bytes, bytearray or memoryview")
    n = len(v)  # type: ignore[arg-type]
    if n < 0x80:
        out.append(n)
    else:
        out += _ev(n)
    out += v  # type: ignore[operator]


def _put_msg(out: bytearray, v: object, cls: type, where: str) -> None:
    if v.__class__ is not cls and not isinstance(v, cls):
        raise _type_error(where, v, cls.__name__)
    b = v.encode()  # type: ignore[attr-defined]
    n = len(b)
    if n < 0x80:
        out.append(n)
    else:
        out += _ev(n)
    out += b


def _list(v: Iterable[object], where: str) -> list:
    # a repeated field's initial value: any iterable, but a str or bytes would be split
    # into characters, which is never what was meant
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"{where} is repeated: it takes an iterable of values, not {type(v).__name__}")
    return list(v)


def _seq(v: object, where: str) -> list:
    # a repeated field that was assigned something other than a list
    if v is None:
        return []
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        raise EncodeError(f"{where} is repeated: it holds {type(v).__name__}, not a list of values")
    try:
        return list(v)  # type: ignore[call-overload]
    except TypeError:
        raise _type_error(where, v, "a list") from None


def _oneof_error(msg: _Message, oneof: str) -> EncodeError:
    names = [n for n in msg._ONEOFS[oneof] if getattr(msg, n) is not None]
    return EncodeError(f"{msg.__class__.__name__}: more than one member of oneof {oneof} is set: "
                       f"{', '.join(names)}")
'''

OPTIONAL_HELPERS = {
    "packed_varints": '''\
def _packed_varints(data: bytes, pos: int, end: int, where: str) -> list:
    # the varints of a packed repeated field, unmasked
    out = []
    while pos < end:
        v = data[pos]
        if v < 0x80:
            pos += 1
        else:
            v, pos = _dv(data, pos)
        out.append(v)
    if pos != end:
        raise DecodeError(f"{where}: packed values run past the end of the field")
    return out
''',
    "packed_doubles": '''\
def _packed_doubles(data: bytes, pos: int, end: int, where: str) -> list:
    if (end - pos) % 8:
        raise DecodeError(f"{where}: packed doubles of {end - pos} bytes")
    return [_unpack_d(data, p)[0] for p in range(pos, end, 8)]
''',
    "s32": '''\
def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v > 0x7FFFFFFF else v
''',
    "s64": '''\
def _s64(v: int) -> int:
    v &= 0xFFFFFFFFFFFFFFFF
    return v - 0x10000000000000000 if v > 0x7FFFFFFFFFFFFFFF else v
''',
}


# ---- driver ----


def display(path: str) -> str:
    """path relative to the repository when it is inside it, for messages."""
    a = os.path.abspath(path)
    try:
        rel = os.path.relpath(a, ROOT)
    except ValueError:
        return path
    return a if rel.startswith("..") else rel


def generate(proto_path: str) -> str:
    with open(proto_path, encoding="utf-8") as f:
        src = f.read()
    fname = display(proto_path)
    schema = Parser(src, fname).parse()
    check(schema, fname)
    # the header names the schema as it lives in the repository, wherever this copy is,
    # so that a copy of both files elsewhere (tests) compares equal
    out = Gen(schema, "proto/" + os.path.basename(proto_path)).generate()
    compile(out, "_pb.py", "exec")  # a generator bug must not get as far as a commit
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="gen_pb.py", description=__doc__.split("\n")[0])
    ap.add_argument("--proto", default=DEFAULT_PROTO, help="the schema (default: proto/shim.proto)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="the module to write (default: src/sandbox_shim/_pb.py)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if --out differs from what --proto gives")
    args = ap.parse_args(argv)
    try:
        text = generate(args.proto)
    except (ProtoError, OSError) as e:
        print(f"gen_pb.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                old = f.read()
        except FileNotFoundError:
            old = ""
        if old == text:
            return 0
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), display(args.out),
                                         "generated", lineterm="", n=2))
        for line in diff[:30]:
            print(line, file=sys.stderr)
        if len(diff) > 30:
            print(f"... ({len(diff) - 30} more diff lines)", file=sys.stderr)
        print(f"{display(args.out)} is out of date with {display(args.proto)}: run tools/gen_pb.py",
              file=sys.stderr)
        return 1
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, args.out)  # never a half-written module
    except OSError as e:
        print(f"gen_pb.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
