"""The binary wire format, read from shim/krex_proto.h through cffi: frames, structs and the enums' names.

Every frame is `struct krex_frame_hdr` (magic, type, flags, length, seq) and `length` payload bytes. Message
types, structs, taints, end reasons and settle statuses come from the header itself, so C and Python cannot
drift apart: a taint is one enum line in krex_proto.h, and its name here is that line's name in snake case."""

import array
import re
import socket
import struct
from dataclasses import dataclass
from typing import Any, Optional

from .. import paths
from ..errors import KrexError
from . import cdefs

_HEADER_TEXT = paths.proto_header().read_text()
ffi = cdefs.load(_HEADER_TEXT, paths.compiled_ffi())   # the header and the shim's functions (native.py)
C = ffi.dlopen(None)  # enums and #defines are reachable through any library object

MAGIC = C.KREX_MAGIC
VERSION = C.KREX_PROTO_VERSION
MAX_PAYLOAD = C.KREX_MAX_PAYLOAD
HDR_SIZE = ffi.sizeof("struct krex_frame_hdr")
_HDR = struct.Struct("<IHHII")
assert _HDR.size == HDR_SIZE


def enum_names(enum: str, prefix: str) -> dict[int, str]:
    """{value: snake_case name} of a header enum, each name without its prefix (KREX_TAINT_CLOCK_LOW ->
    clock_low)."""
    return {int(v): n[len(prefix):].lower() for v, n in ffi.typeof(f"enum {enum}").elements.items()
            if n.startswith(prefix)}


TAINT_NAMES = enum_names("krex_taint", "KREX_TAINT_")
TAINT_BITS = {name: bit for bit, name in TAINT_NAMES.items()}
NOT_EXCLUSIVE = C.KREX_TAINTS_NOT_EXCLUSIVE
END_NAMES = {**enum_names("krex_end_reason", "KREX_END_"), C.KREX_END_TIME_LIMIT: "revoked"}
SETTLE_STATUS = enum_names("krex_settle_status", "KREX_SETTLE_")
ROLE_NAMES = {0: "new", **enum_names("krex_role", "KREX_ROLE_")}

# message type code -> (name, payload struct or None for JSON), from enum krex_msg_type; each struct is named
# after its message (KREX_MSG_REGION_BEGIN -> struct krex_region_begin)
MESSAGES: dict[int, tuple[str, Optional[str]]] = {
    code: (name.upper(), None if name.startswith("json") else f"struct krex_{name}")
    for code, name in enum_names("krex_msg_type", "KREX_MSG_").items()}
MSG = {name: code for code, (name, _) in MESSAGES.items()}


def taint_names(bits: int) -> list[str]:
    return [name for bit, name in sorted(TAINT_NAMES.items()) if bits & bit]


def taint_bits(names) -> int:
    bits = 0
    for n in names:
        bits |= TAINT_BITS.get(n, 0)
    return bits


def struct_names() -> list[str]:
    """Every struct the header defines (for the layout test)."""
    return re.findall(r"^struct (\w+) \{", _HEADER_TEXT, flags=re.M)


class ProtocolError(KrexError):
    """A frame that is malformed, oversized or of an unknown type."""


def pack(msg_type: int, payload: bytes, seq: int = 0) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return _HDR.pack(MAGIC, msg_type, 0, len(payload), seq) + payload


def unpack_header(data: bytes) -> tuple[int, int, int]:
    """-> (type, length, seq); raises ProtocolError on a bad magic or length."""
    magic, mtype, _flags, length, seq = _HDR.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic:#x}")
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"frame length {length} exceeds {MAX_PAYLOAD}")
    return mtype, length, seq


def encode(ctype: str, **fields: Any) -> bytes:
    obj = ffi.new(ctype + " *")
    for k, v in fields.items():
        if isinstance(v, str):
            v = v.encode()
        if isinstance(v, bytes):
            ffi.memmove(getattr(obj, k), v[: ffi.sizeof(getattr(obj, k)) - 1], min(len(v), ffi.sizeof(getattr(obj, k)) - 1))
        else:
            setattr(obj, k, v)
    return bytes(ffi.buffer(obj))


def decode(ctype: str, payload: bytes) -> Any:
    """A cffi struct copied from payload; raises ProtocolError if it is too short."""
    size = ffi.sizeof(ctype)
    if len(payload) < size:
        raise ProtocolError(f"{ctype} needs {size} bytes, got {len(payload)}")
    obj = ffi.new(ctype + " *")
    ffi.memmove(obj, payload[:size], size)
    return obj


def cstr(arr: Any) -> str:
    return ffi.string(arr).decode(errors="replace")


def error_payload(code: int, text: str) -> bytes:
    return encode("struct krex_error", code=code, text=text)


def error_text(payload: bytes) -> str:
    return cstr(decode("struct krex_error", payload).text)


def recv_with_fds(sock: socket.socket, size: int, max_fds: int, fds: list) -> bytes:
    """One recvmsg; descriptors that came with it (SCM_RIGHTS) are appended to fds."""
    data, anc, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * 4))
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
            fds.extend(a)
    return data


@dataclass
class Frame:
    type: int
    payload: bytes
    seq: int = 0
    fds: tuple = ()

    @property
    def name(self) -> str:
        return MESSAGES.get(self.type, (f"#{self.type}", None))[0]
