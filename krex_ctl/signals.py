"""Signals a `krex run` wrapper passes on to its command.

The wrapper blocks the forwarded signals in every thread and takes them in one thread with sigwaitinfo,
which says where each came from. A signal the terminal sent (Ctrl-C, Ctrl-\\, hang-up: si_code SI_KERNEL)
went to the whole foreground process group, the command included, so it is not sent again; one sent to the
wrapper alone (kill, a job scheduler, a harness's send_signal) is passed to the command. A warm worker runs
in another process group, so it gets every signal, as a line {"signal": N} on the connection that carried the
command, never by kill() on the worker's pid: the worker delivers it only while that command runs, so one the
wrapper passes on late (stopped past the worker's wait for its close, say) cannot reach the worker's next
command, another wrapper's (worker.watch_wrapper). A signal that arrives before the command has started is
kept: the wrapper then does not start it. A signal the wrapper was started with ignored (nohup's SIGHUP, the
SIGINT and SIGQUIT a non-interactive shell ignores for `cmd &`) is neither taken nor passed on: it stays ignored,
for the command too (shim/krex_exec.c), as without krex."""

import json
import os
import signal
import socket
import threading
from typing import Optional, Union

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SI_KERNEL = 0x80


def taken() -> tuple:
    """The forwarded signals this process was not started with ignored."""
    return tuple(s for s in FORWARDED if signal.getsignal(s) != signal.SIG_IGN)


def block() -> None:
    """Block the forwarded signals in this thread and the threads it starts from now on (not an ignored one: a
    blocked signal is kept pending even when ignored, and sigwaitinfo would take it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, taken())


Target = Union[int, socket.socket]   # a process, or the connection a warm worker took the command on


def send(target: Target, sig: int) -> None:
    """sig passed on to target; dropped where it cannot go (a process gone, a connection the worker has closed,
    or one too full to take it without waiting)."""
    try:
        if isinstance(target, socket.socket):
            target.send(json.dumps({"signal": int(sig)}).encode() + b"\n", socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        else:
            os.kill(target, sig)
    except OSError:
        pass


class Forwarder(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True, name="krex-signals")
        self.lock = threading.Lock()
        self.target: Optional[tuple[Target, bool]] = None  # (where to, skip signals from the terminal)
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
            with self.lock:   # sent under the lock: once aim(None) has returned, nothing more goes to the old target
                self.last = info.si_signo
                target = self.target
                if target is None:
                    self.pending.append(info.si_signo)
                    self.arrived.set()
                    continue
                to, skip_tty = target
                if skip_tty and info.si_code == SI_KERNEL:
                    continue
                send(to, info.si_signo)

    def aim(self, target: Optional[Target], skip_tty: bool = False) -> None:
        """Forward to target from now on, a pid or a warm worker's connection (None: keep what arrives); what was
        kept so far goes to it now."""
        with self.lock:
            self.target = (target, skip_tty) if target else None
            early, self.pending = (self.pending, []) if target else ([], self.pending)
        for sig in early:
            send(target, sig)

    def first_pending(self) -> Optional[int]:
        with self.lock:
            return self.pending[0] if self.pending else None
