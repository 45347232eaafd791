"""CPU isolation: a held region's members on the reserved cores, every other krex-managed process off them;
afterwards each thread's own mask back. Back-to-back regions on the same cores hand the isolation over
instead of restoring every thread and walking every job again (~4 ms with 60 clients)."""

import logging
import os
from typing import Callable, Optional

from .. import procs
from ..wire import runtime


class Isolation:
    def __init__(self, cfg, socket_path: str, rate_log: Callable[..., None]) -> None:
        self.cfg, self.socket_path, self.rate_log = cfg, socket_path, rate_log
        self.handover: Optional[tuple[set[int], dict[int, set[int]]]] = None   # (cores, saved masks)
        if runtime.read_reserved(socket_path):
            # a dead predecessor's (its directory kept over a restart: heartbeat.py): no region holds cores now, and
            # commands started meanwhile would step off them (procs.step_off_reserved)
            self.publish(())

    def isolate(self, region, member_pids: list[int], frozen_pids: set[int], managed: Callable[[], set[int]],
                held_regions) -> None:
        """At the grant. managed(): every krex-managed pid (jobs' trees and registered clients)."""
        if not self.cfg.isolate_cpus:
            return
        reserved = self.cfg.reserved_for(region.gpu_mask)
        if self.handover is not None and self.handover[0] != reserved:
            self.release(held_regions)
        if not reserved:
            return
        region.reserved = reserved
        handed_over = self.handover is not None
        if handed_over:
            region.saved_affinity, self.handover = self.handover[1], None
        # the owner confined to the reserved cores with all its threads, or on its own CPUs and the reserved
        # ones (a torch process confined to two cores launched its small kernels late: bench/trial_modes)
        owner = (lambda old: reserved) if self.cfg.owner_cpus == "reserved" else (lambda old: old | reserved)
        for pid in member_pids:
            tids = procs.threads(pid)
            region.member_tids.update(tids)
            procs.set_affinity(tids, owner, region.saved_affinity)
        self.publish(held_regions)
        if handed_over:
            # back-to-back regions on the same cores: everyone else is already off them (the last owner and
            # its frozen siblings were moved at its end, newcomers at their HELLO)
            return
        others = managed() - set(member_pids) - {os.getpid()} - frozen_pids
        for pid in others:
            procs.set_affinity(procs.threads(pid), lambda old: old - reserved, region.saved_affinity)

    def join(self, region, pid: int) -> None:
        """A gang member joined a held region: onto its cores."""
        if region.reserved:
            tids = procs.threads(pid)
            region.member_tids.update(tids)
            procs.set_affinity(tids, lambda old: region.reserved, region.saved_affinity)

    def leave(self, region, pid: int) -> None:
        """A member left a region that goes on: its CPUs back now."""
        if region.reserved:
            self.unpin_newcomers(region, [pid])
            for tid in procs.threads(pid):
                old = region.saved_affinity.pop(tid, None)
                if old is not None and procs.same_thread(tid, old):
                    procs.set_affinity([tid], lambda _o, c=old: c, {})

    def end(self, region, frozen_pids: list[int], others_waiting: bool, held_regions) -> None:
        """At the end: hand the cores over when another request waits on these GPUs, else restore."""
        if region.reserved:
            self.unpin_newcomers(region, region.pids, off=others_waiting)
        if region.reserved and others_waiting:
            saved = region.saved_affinity
            for pid in region.pids:        # the members: from their own masks before the region, less ours
                for tid in procs.threads(pid):
                    procs.set_affinity([tid], lambda old, t=tid: saved.get(t, old) - region.reserved, saved)
            for pid in frozen_pids:
                procs.set_affinity(procs.threads(pid), lambda old: old - region.reserved, saved)
            self.handover = (region.reserved, region.saved_affinity)
        else:
            procs.restore_affinity(region.saved_affinity)
        if region.reserved:
            self.publish(held_regions)

    @staticmethod
    def unpin_newcomers(region, pids, off: bool = False) -> None:
        """Threads and child processes a member made inside the region inherited its confinement and are in no
        saved mask: each on the reserved cores gets the mask its process had before the region (its main
        thread's, saved, or left as it was: --owner-cpus own-and-reserved adds cores only to those lacking
        them). off (the cores are handed over): that mask less the reserved cores now, the mask itself saved for
        the hand-over's end."""
        saved = region.saved_affinity
        for pid in pids:
            try:
                base = set(saved[pid]) if pid in saved else os.sched_getaffinity(pid)
            except OSError:
                continue
            for p in [pid] + procs.descendants(pid):
                for tid in procs.threads(p):
                    if tid in saved or tid in region.member_tids:
                        continue
                    try:
                        cur = os.sched_getaffinity(tid)
                        if not cur & region.reserved:
                            continue
                        new = base - region.reserved if off else base
                        if new and new != cur:
                            start = procs.thread_start(tid)
                            os.sched_setaffinity(tid, new)
                            if off:
                                kept = procs.Mask(base)
                                kept.start = start
                                saved[tid] = kept
                    except OSError:
                        pass

    def release(self, held_regions) -> None:
        """Nobody took the handed-over cores: everyone's masks back."""
        if self.handover is not None:
            saved = self.handover[1]
            self.handover = None
            self.publish(held_regions)
            procs.restore_affinity(saved)

    def publish(self, held_regions) -> None:
        """SOCKET.reserved: the CPUs region owners hold now (wire/runtime.py)."""
        cpus: set[int] = set()
        for r in held_regions:
            cpus |= r.reserved
        if self.handover is not None:
            cpus |= self.handover[0]
        try:
            runtime.write_reserved(self.socket_path, cpus)
        except OSError as e:
            self.rate_log("reserved_file", logging.ERROR, "cannot write %s: %s",
                          runtime.reserved_path(self.socket_path), e)

    def keep_off(self, client, held_regions) -> None:
        """A process that registers while regions hold reserved cores moves off them at once: commands started
        during a region (a new `krex run`, its Python importing torch) must not land there."""
        held = [(r.reserved, r.saved_affinity) for r in held_regions if r.reserved and client not in r.members]
        reservations = held + ([self.handover] if self.handover else [])
        tids = [t for pid in [client.pid] + procs.descendants(client.pid) for t in procs.threads(pid)] \
            if reservations else []
        for reserved, saved in reservations:
            procs.set_affinity(tids, lambda old, r=reserved: old - r, saved)
