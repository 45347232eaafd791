"""Signals a `krex run` wrapper passes on to its command.

The wrapper blocks the forwarded signals in every thread and takes them in one thread with sigwaitinfo,
which says where each came from. A signal the terminal sent (Ctrl-C, Ctrl-\\, hang-up: si_code SI_KERNEL)
went to the whole foreground process group, the command included, so it is not sent again; one sent to the
wrapper alone (kill, a job scheduler, a harness's send_signal) is passed to the command. A warm worker runs
in another process group, so it gets every signal, by kill() on its pid (the kernel acts on it at once, even
while the command holds the interpreter in C code), but only while the worker's connection has nothing for the
wrapper to read: once the worker has answered (the command is over) or closed it, a signal is dropped, so one
the wrapper passes on late (stopped past the worker's wait for its close, say) does not reach the worker's next
command, another wrapper's. A signal that arrives before the command has started is
kept: the wrapper then does not start it. A signal the wrapper was started with ignored (nohup's SIGHUP, the
SIGINT and SIGQUIT a non-interactive shell ignores for `cmd &`) is neither taken nor passed on: it stays ignored,
for the command too (shim/krex_exec.c), as without krex."""

import os
import select
import signal
import socket
import threading
from typing import Optional

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SI_KERNEL = 0x80


def taken() -> tuple:
    """The forwarded signals this process was not started with ignored."""
    return tuple(s for s in FORWARDED if signal.getsignal(s) != signal.SIG_IGN)


def block() -> None:
    """Block the forwarded signals in this thread and the threads it starts from now on (not an ignored one: a
    blocked signal is kept pending even when ignored, and sigwaitinfo would take it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, taken())


def answered(conn: Optional[socket.socket]) -> bool:
    """Whether conn, a warm worker's connection, has something to read or has been closed (its answer, or its end):
    the command it ran is over."""
    if conn is None:
        return False
    p = select.poll()
    p.register(conn.fileno(), select.POLLIN | select.POLLRDHUP)
    try:
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


def send(pid: int, sig: int, over: Optional[socket.socket]) -> None:
    """sig to pid, unless over says the command is over (answered); dropped where pid is gone."""
    if answered(over):
        return
    try:
        os.kill(pid, sig)
    except OSError:
        pass


class Forwarder(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="krex-signals")
        self.lock = threading.Lock()
        # (pid, skip signals from the terminal, a warm worker's connection: nothing goes once it has an answer)
        self.target: Optional[tuple[int, bool, Optional[socket.socket]]] = None
        self.pending: list[int] = []                       # arrived while there was no target
        self.arrived = threading.Event()
        self.last: Optional[int] = None

    def run(self) -> None:
        waited = taken()
        while True:
            try:
                info = signal.sigwaitinfo(waited)
            except InterruptedError:
                continue
            with self.lock:   # sent under the lock: once aim(None) has returned, nothing more goes to the old pid
                self.last = info.si_signo
                target = self.target
                if target is None:
                    self.pending.append(info.si_signo)
                    self.arrived.set()
                    continue
                pid, skip_tty, over = target
                if skip_tty and info.si_code == SI_KERNEL:
                    continue
                send(pid, info.si_signo, over)

    def aim(self, pid: Optional[int], skip_tty: bool = False, over: Optional[socket.socket] = None) -> None:
        """Forward to pid from now on (None: keep what arrives); what was kept so far goes to pid now. over: the
        warm worker's connection the command was sent on; a signal goes only while it has nothing to read."""
        with self.lock:
            self.target = (pid, skip_tty, over) if pid else None
            early, self.pending = (self.pending, []) if pid else ([], self.pending)
        for sig in early:
            send(pid, sig, over)

    def first_pending(self) -> Optional[int]:
        with self.lock:
            return self.pending[0] if self.pending else None
