"""The resumer: a small process the controller forks at start that holds a pidfd of every process the
controller has frozen, and SIGCONTs them all the moment the controller goes away.

Why a separate process: a stopped process cannot resume itself, and the two other guards each miss a case.
The state file is read only when a controller starts again (minutes later, or never); a `krex run` guardian
resumes only its own descendants, so a frozen process that daemonized (reparented to init) or that no
wrapper started stays stopped. The resumer sees the controller die (its end of a socket pair closes, for
any death, SIGKILL included) and needs nothing from it then.

Messages on the SOCK_SEQPACKET pair, controller -> resumer, one datagram each:
    b"F" + region id (8 bytes, little endian), with the pidfds as SCM_RIGHTS: hold these for that region
    b"R" + region id: that region ended, its processes are resumed, close them
Pidfds never name a reused pid, so a late SIGCONT cannot reach a stranger."""

import logging
import os
import signal
import socket
import struct
from typing import Optional

from ..wire.frames import recv_with_fds

log = logging.getLogger("krex.controller")
MAX_FDS = 250          # per datagram (SCM_MAX_FD is 253)
READY = b"+"           # resumer -> controller, once: it has closed every descriptor it inherited
READY_TIMEOUT_S = 10.0


def _serve(sock: socket.socket) -> None:
    """The resumer's whole life: hold pidfds, resume them all on EOF."""
    signal.set_wakeup_fd(-1)                     # the controller's, closed here: a signal would write to nothing
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)       # it leaves when the controller does, not before
    try:
        with open("/proc/self/comm", "w") as f:  # `ps -o comm`, `pgrep krex-resumer` (its arguments are the
            f.write("krex-resumer")              # controller's: `pkill -f 'krex controller'` signals it too)
    except OSError:
        pass
    held: dict[int, list[int]] = {}
    while True:
        fds: list[int] = []
        try:
            data = recv_with_fds(sock, 64, MAX_FDS, fds)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        kind, rid = data[:1], struct.unpack("<Q", data[1:9])[0] if len(data) >= 9 else 0
        if kind == b"F":
            held.setdefault(rid, []).extend(fds)
        else:
            for fd in fds:
                os.close(fd)
            for fd in held.pop(rid, []):
                os.close(fd)
    for fds in held.values():
        for fd in fds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGCONT)
            except OSError:
                pass


class Resumer:
    """The controller's handle on its resumer process."""

    def __init__(self) -> None:
        self.sock: Optional[socket.socket] = None
        self.pid = 0
        self.warned = False

    def start(self) -> bool:
        """Fork the resumer (the controller is single-threaded here). False when it cannot be had."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        except OSError as e:
            log.error("cannot start the resumer (%s); frozen processes rely on the state file", e)
            return False
        pid = os.fork()
        if pid == 0:   # the resumer: keep only its end of the pair, then serve
            code = 0
            try:
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 16)
                os.setsid()                      # out of the controller's process group (a terminal's ^C)
                theirs.send(READY)               # it holds nothing of the controller's any more (start)
                _serve(theirs)
            except BaseException:  # noqa: B902 (a forked child never returns into the controller)
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        # Until the child has closed what it inherited, it holds our listening socket and lock file too: were we
        # SIGKILLed then, they would outlive us (a connection made meanwhile reset when the child closes them, a
        # successor finding the lock held). Wait for it, so that nobody is answered before it is done.
        try:
            ours.settimeout(READY_TIMEOUT_S)
            ready = ours.recv(16) == READY
        except OSError:
            ready = False
        if not ready:
            log.error("the resumer (pid %d) did not start; frozen processes rely on the state file", pid)
            ours.close()
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            return False
        ours.settimeout(None)
        self.sock, self.pid = ours, pid
        return True

    def hold(self, region_id: int, pidfds: list[int]) -> bool:
        """Before SIGSTOP: the resumer holds these pidfds until release(region_id). False if it is gone."""
        if self.sock is None and not self.start():
            return False
        for i in range(0, max(1, len(pidfds)), MAX_FDS):
            chunk = pidfds[i:i + MAX_FDS]
            try:
                self.sock.sendmsg([b"F" + struct.pack("<Q", region_id)],
                                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(chunk)}i", *chunk))]
                                  if chunk else [])
            except OSError as e:
                if not self.warned:
                    log.error("the resumer is gone (%s); starting another", e)
                    self.warned = True
                self.close()
                return self.start() and self.hold(region_id, pidfds)
        return True

    def release(self, region_id: int) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send(b"R" + struct.pack("<Q", region_id))
        except OSError:
            self.close()

    def close(self) -> None:
        """The controller is stopping cleanly (everything already resumed): let the resumer go."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.pid:
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            self.pid = 0
