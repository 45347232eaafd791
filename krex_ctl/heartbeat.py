"""A node controller's heartbeat file, PATH.heartbeat next to its socket: how a `krex run` tells a node
controller that is restarting from a node that has none.

Between a node controller's stop and its restart (systemd's RestartSec, a container restarted by its pod)
nothing answers at its socket. A `krex run` begun then used to start a per-user controller in its place (or,
with KREX_SOCKET naming the node socket, an embedded controller on that very socket), and the job stayed on
it: regions of both controllers were tainted other_controller while it had GPU processes, and the restarted
node controller could not even bind its socket. A controller with a restart grace (`--restart-grace S`, 15 s
by default for one run by root) therefore keeps this file's modification time fresh while it serves (every
second, and once more as it stops). A `krex run` that finds nobody answering where the file is fresh (touched
less than its grace ago) waits for the socket to answer again, saying so in one line, at most until the grace
has passed since the last touch; then it carries on as on a node without a controller. A file touched longer
ago than its grace costs nothing: a node whose controller is gone for good delays no command. systemd removes
/run/krex when the unit stops for good (RuntimeDirectoryPreserve=restart keeps it over a restart only).

Trust: the file is read through O_NOFOLLOW, must be a regular file of bounded size owned by root or by the
reader, and says only how long to wait (capped at MAX_GRACE_S). A planted one can at worst delay its
owner's own commands, or root's, which root controls."""

import json
import os
import stat
import time
from typing import Optional

from . import sockfiles

SUFFIX = ".heartbeat"
MAX_BYTES = 4096
MAX_GRACE_S = 600.0
DEFAULT_NODE_GRACE_S = 15.0     # RestartSec=1 of packaging/krex-controller.service plus a controller's start


def default_grace(embedded: bool) -> float:
    """A node controller (run by root, not embedded) gets one; a per-user or test controller none: after its
    stop the next `krex run` starts its own at once, as before."""
    return DEFAULT_NODE_GRACE_S if os.geteuid() == 0 and not embedded else 0.0


class Heartbeat:
    """The writer: created at start (0644, so every user's `krex run` reads it), touched every second."""

    def __init__(self, socket_path: str, grace_s: float):
        self.path = socket_path + SUFFIX
        self.fd = sockfiles.open_private(self.path, os.O_WRONLY, "heartbeat")
        os.fchmod(self.fd, 0o644)
        body = json.dumps({"pid": os.getpid(), "restart_grace_s": grace_s}).encode() + b"\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, body, 0)
        self.touch()

    def touch(self) -> None:
        try:
            os.utime(self.fd)
        except OSError:
            pass

    def close(self) -> None:
        """At a stop: one last touch (the grace counts from the stop), and the file stays for the restart."""
        if self.fd is not None:
            self.touch()
            os.close(self.fd)
            self.fd = None


def seconds_left(socket_path: str, now: Optional[float] = None) -> Optional[float]:
    """How much longer a controller that served at socket_path may take to come back: its grace less the time
    since its heartbeat's last touch; None without a trusted, fresh heartbeat."""
    try:
        fd = os.open(socket_path + SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES or st.st_uid not in (0, os.geteuid()):
            return None
        grace = float(json.loads(os.read(fd, MAX_BYTES))["restart_grace_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)
    if not 0 < grace <= MAX_GRACE_S:
        return None
    left = st.st_mtime + grace - (time.time() if now is None else now)
    return left if 0 < left <= grace else None    # a touch from the future (clock stepped back): no wait
