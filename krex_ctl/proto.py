"""The wire format, read from shim/krex_proto.h through cffi, and a blocking client connection.

Every frame is `struct krex_frame_hdr` (magic, type, flags, length, seq) and `length` payload bytes.
Message types and structs come from the header itself, so C and Python cannot drift apart."""

import array
import json
import os
import re
import socket
import struct
from dataclasses import dataclass
from typing import Any, Optional

from cffi import FFI

from . import paths
from .errors import KrexCommandError, KrexError

ffi = FFI()
_HEADER_TEXT = paths.proto_header().read_text()
ffi.cdef(_HEADER_TEXT)
C = ffi.dlopen(None)  # enums and #defines are reachable through any library object

MAGIC = C.KREX_MAGIC
VERSION = C.KREX_PROTO_VERSION
MAX_PAYLOAD = C.KREX_MAX_PAYLOAD
HDR_SIZE = ffi.sizeof("struct krex_frame_hdr")
_HDR = struct.Struct("<IHHII")
assert _HDR.size == HDR_SIZE

# message type code -> (name, payload struct or None for JSON)
MESSAGES: dict[int, tuple[str, Optional[str]]] = {}
for _name, _struct in [
    ("HELLO", "krex_hello"), ("WELCOME", "krex_welcome"), ("ERROR", "krex_error"),
    ("CONTEXT", "krex_context"), ("REGION_BEGIN", "krex_region_begin"),
    ("REGION_GRANTED", "krex_region_granted"), ("REGION_END", "krex_region_end"),
    ("REGION_ENDED", "krex_region_ended"), ("DRAIN", "krex_drain"), ("DRAINED", "krex_drained"),
    ("JSON", None), ("JSON_REPLY", None), ("REGION_CANCEL", "krex_region_cancel"), ("LIFECYCLE", "krex_lifecycle"),
    ("REGION_SETTLED", "krex_region_settled"),
]:
    MESSAGES[getattr(C, f"KREX_MSG_{_name}")] = (_name, f"struct {_struct}" if _struct else None)
MSG = {name: code for code, (name, _) in MESSAGES.items()}


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


def recv_with_fds(sock: socket.socket, size: int, max_fds: int, fds: list) -> bytes:
    """One recvmsg; descriptors that came with it (SCM_RIGHTS) are appended to fds."""
    data, anc, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(max_fds * 4))
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
            fds.extend(a)
    return data


def peer_uid(sock: socket.socket) -> int:
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]


def check_server(sock: socket.socket, path: str) -> None:
    """A controller must run as root or as us: another user's process at that path would get our commands,
    our environment and our stdio (a socket in a directory someone else could write)."""
    uid = peer_uid(sock)
    if uid not in (0, os.getuid()):
        raise KrexCommandError(f"the process serving {path} runs as uid {uid}, neither you nor root; refusing it "
                               "(someone else's controller, or a trap)", 3)


def bind_private(path: str) -> socket.socket:
    """A Unix stream socket bound at path, created with mode 0600 (no window where others may connect)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    return sock


@dataclass
class Frame:
    type: int
    payload: bytes
    seq: int = 0
    fds: tuple = ()

    @property
    def name(self) -> str:
        return MESSAGES.get(self.type, (f"#{self.type}", None))[0]


class Connection:
    """A blocking client connection to a controller (used by `krex run`, `krex status`, krex.region)."""

    def __init__(self, path, role: int, job: int = 0, timeout: Optional[float] = 10.0,
                 io_timeout: Optional[float] = None, job_root: int = 0, flags: int = 0):
        """timeout bounds the connect and handshake; io_timeout every later receive (None: block, as
        the `krex run` guardian must: a quiet controller is not a dead one)."""
        self.path = str(path)
        self.gate_fd = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
            check_server(self.sock, self.path)
        except OSError as e:
            self.sock.close()
            raise KrexCommandError(f"no krex controller answers at {self.path} ({e.strerror})", 3) from None
        except KrexCommandError:
            self.sock.close()
            raise
        self._seq = 0
        self._buf = b""
        try:
            self.send(MSG["HELLO"], encode("struct krex_hello", magic=MAGIC, version=VERSION, role=role, job=job,
                                           job_root=job_root, flags=flags))
        except OSError:
            pass  # refused at accept (a limit): the controller's ERROR frame is already waiting to be read
        try:
            reply = self.recv()
        except (OSError, ConnectionError) as e:
            self.sock.close()
            raise KrexCommandError(f"controller at {self.path} closed the connection ({e})", 3) from None
        if reply.name == "ERROR":
            err = decode("struct krex_error", reply.payload)
            raise KrexCommandError(f"controller at {self.path} refused: {cstr(err.text)}", 3)
        if reply.name != "WELCOME":
            raise ProtocolError(f"expected WELCOME, got {reply.name}")
        self.welcome = decode("struct krex_welcome", reply.payload)
        if self.welcome.version != VERSION:
            raise KrexCommandError(
                f"controller at {self.path} speaks protocol {self.welcome.version}, this krex {VERSION}: upgrade one", 3)
        self.gate_fd = reply.fds[0] if reply.fds else None
        self.job = self.welcome.job
        self.sock.settimeout(io_timeout)

    def send(self, msg_type: int, payload: bytes) -> int:
        self._seq += 1
        self.sock.sendall(pack(msg_type, payload, self._seq))
        return self._seq

    def recv(self) -> Frame:
        fds: list[int] = []
        while len(self._buf) < HDR_SIZE:
            self._buf += self._recv_some(fds)
        mtype, length, seq = unpack_header(self._buf)
        while len(self._buf) < HDR_SIZE + length:
            self._buf += self._recv_some(fds)
        payload = self._buf[HDR_SIZE:HDR_SIZE + length]
        self._buf = self._buf[HDR_SIZE + length:]
        return Frame(mtype, payload, seq, tuple(fds))

    def _recv_some(self, fds: list) -> bytes:
        data = recv_with_fds(self.sock, 65536, 4, fds)
        if not data:
            raise ConnectionError(f"controller at {self.path} closed the connection")
        return data

    def request(self, op: str, **args: Any) -> dict:
        """One JSON request, one JSON reply (errors come back as {"error": ...})."""
        seq = self.send(MSG["JSON"], json.dumps({"op": op, **args}).encode())
        while True:
            f = self.recv()
            if f.seq != seq and not (f.name == "ERROR" and f.seq == 0):
                continue          # a reply to something earlier (or a message for another purpose)
            if f.name == "JSON_REPLY":
                reply = json.loads(f.payload)
                if "error" in reply:
                    raise KrexCommandError(f"controller: {reply['error']}", 1)
                return reply
            if f.name == "ERROR":
                raise KrexCommandError(f"controller: {cstr(decode('struct krex_error', f.payload).text)}", 1)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.gate_fd is not None:
                os.close(self.gate_fd)
                self.gate_fd = None
