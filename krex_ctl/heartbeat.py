"""A node controller's heartbeat file, PATH.heartbeat next to its socket: how a `krex run` tells a node
controller that is restarting from a node that has none.

Between a node controller's stop and its restart (systemd's RestartSec, a container restarted by its pod)
nothing answers at its socket. A `krex run` begun then used to start a per-user controller in its place (or,
with KREX_SOCKET naming the node socket, an embedded controller on that very socket), and the job stayed on
it: regions of both controllers were tainted other_controller while it had GPU processes, and the restarted
node controller could not even bind its socket. A controller with a restart grace (`--restart-grace S`; 15 s
by default at /run/krex/krex.sock, the node controller's socket, else none) therefore keeps this file's
modification time fresh while it serves (every second while its socket is still the one it bound, and once
more at a clean stop). A `krex run` that finds nothing listening there (the socket missing, or refusing:
ENOENT, ECONNREFUSED) while the file is fresh (touched less than its grace ago) waits for the socket to answer
again, saying so in one line, at most until the grace has passed since the last touch; then it carries on as
on a node without a controller. Any other failure (EACCES: a user outside the socket's group) is no restart
and is not waited for. A file touched longer ago than its grace costs nothing: a node whose controller is gone
for good delays no command. systemd removes /run/krex when the unit stops for good
(RuntimeDirectoryPreserve=restart keeps it over a restart only).

The file is put in place before the socket is bound, as a fresh temporary file renamed over a predecessor's
heartbeat (a regular file of ours or root's holding one), keeping its modification time (a dead predecessor's
wait goes on while we start), else the epoch (not fresh until we serve). Anything else at that path (a link,
a directory, another file) is never replaced: one line, exit status 2, nothing bound.

Trust: the file is read through O_NOFOLLOW, must be a regular file of bounded size owned by root or by the
reader, and says only how long to wait (capped at MAX_GRACE_S). A planted one can at worst delay its
owner's own commands, or root's, which root controls."""

import errno
import json
import os
import stat
import tempfile
import time
from typing import Optional

from . import paths
from .errors import KrexCommandError
from .wire import runtime

SUFFIX = ".heartbeat"
MAX_BYTES = 4096
MAX_GRACE_S = 600.0
DEFAULT_NODE_GRACE_S = 15.0     # RestartSec=1 of packaging/krex-controller.service plus a controller's start
NOTHING_LISTENS = (errno.ENOENT, errno.ECONNREFUSED)   # the connect errors a restart gives


def default_grace(embedded: bool, socket_path: str, environ=os.environ, pid: Optional[int] = None) -> float:
    """The node controller gets one: at the node's socket, or at any socket when a service manager runs it (it
    restarts it there): systemd's unit (SYSTEMD_EXEC_PID is this very process), a container's entrypoint (pid 1
    in its namespace, as the Kubernetes DaemonSet's). Any other controller none (a per-user one, a test's or a
    benchmark's started by hand: after its stop the next `krex run` starts its own at once, as before)."""
    if embedded:
        return 0.0
    pid = os.getpid() if pid is None else pid
    node = os.path.realpath(socket_path) == os.path.realpath(paths.SYSTEM_SOCKET)   # /var/run/krex too
    managed = environ.get("SYSTEMD_EXEC_PID", "") == str(pid) or pid == 1
    return DEFAULT_NODE_GRACE_S if node or managed else 0.0


class Heartbeat:
    """The writer. Made before the socket is bound (refused there: nothing is bound), touched as we serve."""

    def __init__(self, socket_path: str, grace_s: float):
        self.path = socket_path + SUFFIX
        self.grace_s = grace_s
        flag = f"--socket {socket_path}: cannot put its heartbeat file {self.path} in place"
        try:
            old = os.lstat(self.path)
        except FileNotFoundError:
            old = None
        except OSError as e:
            raise KrexCommandError(f"{flag} ({e.strerror})", 2) from None
        keep = 0.0
        if old is not None:
            if not stat.S_ISREG(old.st_mode):
                what = "a symbolic link" if stat.S_ISLNK(old.st_mode) else \
                    "a directory" if stat.S_ISDIR(old.st_mode) else "not a regular file"
                raise KrexCommandError(f"{flag} (it is {what}; krex replaces only a heartbeat of its own)", 2)
            if read(self.path) is None:
                raise KrexCommandError(f"{flag} (a file there is not a krex heartbeat of this user's or root's; "
                                       "move it away)", 2)
            keep = old.st_mtime
        directory, name = os.path.split(os.path.abspath(self.path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        except OSError as e:
            raise KrexCommandError(f"{flag} ({e.strerror})", 2) from None
        try:
            os.write(fd, json.dumps({"pid": os.getpid(), "restart_grace_s": grace_s}).encode() + b"\n")
            os.fchmod(fd, 0o644)          # every user's `krex run` reads it
            os.utime(fd, (keep, keep))
            os.replace(tmp, self.path)
        except OSError as e:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise KrexCommandError(f"{flag} ({e.strerror})", 2) from None
        self.fd: Optional[int] = fd

    def touch(self) -> None:
        if self.fd is not None:
            try:
                os.utime(self.fd)
            except OSError:
                pass

    def close(self, last_touch: bool = True) -> None:
        """At a clean stop: one last touch (the grace counts from the stop), and the file stays for the restart."""
        if self.fd is not None:
            if last_touch:
                self.touch()
            os.close(self.fd)
            self.fd = None


def read(path: str) -> Optional[tuple]:
    """(its body, its stat) of a heartbeat we may trust at path (wire/runtime.py's rule: a regular file of at
    most MAX_BYTES, root's or ours, read without following a link) holding a JSON object with restart_grace_s;
    None otherwise."""
    try:
        text, st = runtime.read_trusted_with_stat(path, MAX_BYTES)
        body = json.loads(text)
    except (OSError, ValueError):      # UntrustedFile is an OSError, a bad UTF-8 or JSON body a ValueError
        return None
    return (body, st) if isinstance(body, dict) and "restart_grace_s" in body else None


def seconds_left(socket_path: str, now: Optional[float] = None) -> Optional[float]:
    """How much longer a controller that served at socket_path may take to come back: its grace less the time
    since its heartbeat's last touch; None without a trusted, fresh heartbeat."""
    found = read(socket_path + SUFFIX)
    if found is None:
        return None
    body, st = found
    try:
        grace = float(body["restart_grace_s"])
    except (ValueError, TypeError):
        return None
    if not 0 < grace <= MAX_GRACE_S:
        return None
    left = st.st_mtime + grace - (time.time() if now is None else now)
    return left if 0 < left <= grace else None    # a touch from the future (clock stepped back): no wait
