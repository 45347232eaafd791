"""Freezing: SIGSTOP and SIGCONT through pidfds (never a bare pid that may have been reused), with the two
guards that no process is ever left stopped: the state file (every frozen pid with its start time, written
before the first SIGSTOP; the next controller resumes what it lists) and the resumer process (which resumes
them the moment this controller dies). Who is frozen by which region is the policy's (policy/freezes.py):
this module only carries it out."""

import logging
import signal
from typing import Callable

from .. import procs
from ..wire import runtime
from .resumer import Resumer

log = logging.getLogger("krex.controller")


class Freezer:
    def __init__(self, state_path: str, rate_log: Callable[..., None]) -> None:
        self.state_path = state_path
        self.rate_log = rate_log
        self.resumer = Resumer()

    def start(self) -> None:
        self.resume_from_state_file()
        self.resumer.start()

    def record(self, clients) -> bool:
        """Write every frozen client (pid, start time) to the state file; False when that failed."""
        try:
            runtime.write_state(self.state_path, [(c.pid, c.pidfd.start_time) for c in clients])
            return True
        except OSError as e:
            self.rate_log("state_file", logging.ERROR, "cannot write state file %s: %s", self.state_path, e)
            return False

    def freeze(self, region_id: int, new: list, already: list, frozen_now: list) -> tuple[list, str]:
        """Stop `new` for region_id (`already` are stopped by other live regions and stay so); frozen_now: every
        client frozen before this one. Returns the clients this region now holds stopped, and why nobody was
        stopped when it could not be recorded."""
        if new and not self.record(list(frozen_now) + new):
            # no durable record, no SIGSTOP: a restarted controller could not resume them
            self.rate_log("freeze_skipped", logging.ERROR, "cannot record frozen pids in %s; regions keep the GPU "
                          "exclusive by the gate and the drain, without freezing", self.state_path)
            new = []
            skipped = "state file not writable"
        else:
            skipped = ""
        targets = [c for c in new if c.pidfd is not None]
        if targets or already:
            # the resumer holds them before the first SIGSTOP: a controller killed in between leaves nobody
            # stopped (a SIGCONT to a process that was never stopped does nothing)
            self.resumer.hold(region_id, [c.pidfd.fd for c in list(already) + targets])
        held = list(already) + [c for c in targets if c.pidfd.signal(signal.SIGSTOP)]
        return held, skipped

    @staticmethod
    def running(clients) -> list[int]:
        """The pids of these that are not seen stopped yet."""
        return [c.pid for c in clients if procs.state(c.pid) not in ("T", "t", "Z", "X", None)]

    @staticmethod
    def signal_all(clients, sig: int) -> None:
        """sig to each client, through its pidfd (a client without one is skipped)."""
        for c in clients:
            if c.pidfd is not None:
                c.pidfd.signal(sig)

    def resume(self, region_id: int, clients, still_frozen) -> None:
        """SIGCONT clients (no other live region froze them), release the region's pidfds, record the rest."""
        self.signal_all(clients, signal.SIGCONT)
        self.resumer.release(region_id)
        self.record(still_frozen)

    def wake(self, clients) -> None:
        """SIGCONT clients that other live regions hold stopped, for a drain (they are stopped again after)."""
        self.signal_all(clients, signal.SIGCONT)

    def restop(self, clients) -> None:
        """SIGSTOP clients woken for a drain again (still in the state file and held by the resumer)."""
        self.signal_all(clients, signal.SIGSTOP)

    def thaw(self, clients, still_frozen) -> None:
        """SIGCONT clients that left while stopped (their regions go on); record the rest."""
        self.signal_all(clients, signal.SIGCONT)
        self.record(still_frozen)

    def resume_from_state_file(self) -> None:
        """At start: resume what a previous controller of this socket left stopped, if the file is ours."""
        try:
            frozen = runtime.read_state(self.state_path)
        except runtime.UntrustedFile as e:
            log.error("state file ignored: %s", e)
            return
        except OSError as e:
            log.error("cannot read state file %s (%s); ignored", self.state_path, e)
            return
        if frozen is None:
            aside = self.state_path + ".bad"
            log.error("state file %s is not a krex state file; moved to %s and ignored", self.state_path, aside)
            try:
                import os

                os.replace(self.state_path, aside)
            except OSError:
                pass
            return
        for pid, st in frozen:
            if st is not None and procs.start_time(pid) == st:
                try:
                    p = procs.Pidfd(pid)
                    if p.start_time == st:
                        stopped = procs.state(pid) in ("T", "t")   # the resumer may have resumed it already
                        p.signal(signal.SIGCONT)
                        if stopped:
                            log.warning("resumed pid %d left stopped by a previous controller", pid)
                        else:
                            log.info("pid %d, frozen by a previous controller, runs already (resumed by its "
                                     "resumer or its krex run)", pid)
                    p.close()
                except OSError:
                    pass
        runtime.write_state(self.state_path, [])

    def close(self) -> None:
        self.resumer.close()
