"""The one client connection to a controller, used by `krex run` (and its guardian thread), `krex status`,
the warm workers and the tests.

One failure rule for every request: a reply comes back as a dict, or the request raises -
ControllerRefused when the controller answered with an error, ControllerLost when the connection broke or
no reply came in time. Callers that carry on without a controller catch ControllerError (both)."""

import errno
import json
import os
import queue
import socket
import stat
import struct
import threading
import time
from typing import Any, Optional

from ..errors import KrexCommandError
from .frames import (HDR_SIZE, MAGIC, MSG, VERSION, Frame, ProtocolError, decode, encode, error_text, pack,
                     recv_with_fds, unpack_header)


class ControllerError(KrexCommandError):
    """A request that got no good reply."""


class ControllerRefused(ControllerError):
    """The controller answered with an error."""


class ControllerLost(ControllerError):
    """The connection broke, or no reply came in time."""


def peer_uid(sock: socket.socket) -> int:
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]


def check_server(sock: socket.socket, path: str) -> None:
    """A controller must run as root or as us: another user's process at that path would get our commands,
    our environment and our stdio (a socket in a directory someone else could write)."""
    uid = peer_uid(sock)
    if uid not in (0, os.getuid()):
        raise KrexCommandError(f"the process serving {path} runs as uid {uid}, neither you nor root; refusing it "
                               "(someone else's controller, or a trap)", 3)


def bind_private(path: str, mode: int = 0o600) -> socket.socket:
    """A Unix stream socket bound at path, created with mode (0600: no window where others may connect). The
    mode is set by the umask at the bind, never by a chmod of the path afterwards, which would follow a link
    someone who may write the directory put there meanwhile."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    return sock


def ask_status(path, io_timeout: float = 10.0) -> dict:
    """A controller's status (ops.STATUS), asked as `krex status` asks it."""
    from . import ops
    from .frames import C

    conn = Connection(path, C.KREX_ROLE_CLI, io_timeout=io_timeout)
    try:
        return conn.request(ops.STATUS)
    finally:
        conn.close()


class Connection:
    """A blocking client connection: HELLO at construction (KrexCommandError, exit status 3, when no
    controller takes it), then frames and JSON requests."""

    def __init__(self, path, role: int, job: int = 0, timeout: Optional[float] = 10.0,
                 io_timeout: Optional[float] = None, job_root: int = 0, flags: int = 0):
        """timeout bounds the connect and handshake; io_timeout every later receive (None: block, as
        the `krex run` guardian must: a quiet controller is not a dead one)."""
        self.path = str(path)
        self.gate_fd = None
        self.replies: Optional[queue.Queue] = None   # set by attach_reader: another thread reads the socket
        self.send_lock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
            check_server(self.sock, self.path)
        except OSError as e:
            self.sock.close()
            from ..heartbeat import NOTHING_LISTENS, seconds_left
            left = seconds_left(self.path) if e.errno in NOTHING_LISTENS else None
            restarting = f"; it served here until moments ago and may be restarting (its restart grace ends in " \
                f"{left:.0f} s)" if left else ""
            why = e.strerror or str(e)           # "AF_UNIX path too long" has no strerror
            if e.errno == errno.EACCES:
                from ..sockfiles import who_may_not

                why = f"permission denied: {who_may_not(self.path)}"
            try:
                if e.errno == errno.ECONNREFUSED and not stat.S_ISSOCK(os.stat(self.path).st_mode):
                    why = "not a socket"
            except OSError:
                pass
            raise KrexCommandError(f"no krex controller answers at {self.path} ({why}){restarting}", 3) from None
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
            self.sock.close()
            raise KrexCommandError(f"controller at {self.path} refused: {error_text(reply.payload)}", 3)
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
        with self.send_lock:
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

    def attach_reader(self) -> "queue.Queue":
        """Another thread will read this connection (the `krex run` guardian): it puts every JSON_REPLY and
        ERROR frame on the returned queue, and None when the connection is gone."""
        self.replies = queue.Queue()
        return self.replies

    def _next_reply(self, deadline: Optional[float]) -> Frame:
        if self.replies is None:
            if deadline is not None:
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            return self.recv()
        try:
            f = self.replies.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError("no reply in time") from None
        if f is None:
            raise ConnectionError("connection closed")
        return f

    def request(self, op: str, timeout: Optional[float] = None, **args: Any) -> dict:
        """One JSON request (wire/ops.py names them), one JSON reply; ControllerRefused or ControllerLost."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            seq = self.send(MSG["JSON"], json.dumps({"op": op, **args}).encode())
            while True:
                f = self._next_reply(deadline)
                if f.seq != seq and not (f.name == "ERROR" and f.seq == 0):
                    continue          # a reply to something earlier (or a message for another purpose)
                if f.name == "JSON_REPLY":
                    reply = json.loads(f.payload)
                    break
                if f.name == "ERROR":
                    raise ControllerRefused(f"controller: {error_text(f.payload)}", 1)
        except (OSError, ConnectionError, ValueError) as e:   # TimeoutError and socket.timeout are OSErrors
            raise ControllerLost(f"controller at {self.path}: {e}", 3) from None
        if "error" in reply:
            raise ControllerRefused(f"controller: {reply['error']}", 1)
        return reply

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.gate_fd is not None:
                os.close(self.gate_fd)
                self.gate_fd = None
