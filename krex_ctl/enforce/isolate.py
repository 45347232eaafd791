"""CPU isolation: a held region's members on the reserved cores, every other krex-managed process off them;
afterwards each thread's own mask back. Back-to-back regions on the same cores hand the isolation over
instead of restoring every thread and walking every job again (~4 ms with 60 clients).

Regions held at once on different GPUs never share a core: one reserved_cores list for every GPU (the default)
gives a region the listed cores no other held region has (none left: its owner keeps its own CPUs, said in the
log). A thread's saved mask is its own, from before krex moved it (a region that starts while another holds
cores takes that region's saved mask for the threads it moves again), and a mask goes back less the cores other
held regions still hold (their members are theirs to restore). The saved masks are also kept in SOCKET.affinity,
so that a controller that died holding cores has them put back by the next one (or by its own clean stop)."""

import logging
import os
from typing import Callable, Optional

from .. import procs
from ..wire import runtime


def live(held_regions, but=None) -> list:
    """The regions holding reserved cores now, other than `but`."""
    return [r for r in held_regions if r is not but and r.reserved
            and getattr(getattr(r, "state", None), "value", None) != "ended"]


class Isolation:
    def __init__(self, cfg, socket_path: str, rate_log: Callable[..., None]) -> None:
        self.cfg, self.socket_path, self.rate_log = cfg, socket_path, rate_log
        self.handover: Optional[tuple[set[int], dict[int, set[int]]]] = None   # (cores, saved masks)
        self.saved_from: list = []            # the regions whose saved masks SOCKET.affinity is to hold
        self.saved_dirty = False
        self.freed: list = []                 # (cores, saved masks) put back, their newcomers not yet (free_newcomers)
        self.restore_predecessors()
        if runtime.read_reserved(socket_path):
            # a dead predecessor's (its directory kept over a restart: heartbeat.py): no region holds cores now, and
            # commands started meanwhile would step off them (procs.step_off_reserved)
            self.publish(())

    def restore_predecessors(self) -> None:
        """The masks a controller that died holding cores left in SOCKET.affinity: each thread still alive (the
        same start time) gets its own mask back."""
        saved = runtime.read_affinity(self.socket_path)
        if not saved:
            return
        # only a mask krex could have left (its own less some cores, or on the cores regions held then): one set
        # since by someone else (wider than that, or elsewhere) is theirs and stays
        held_then = runtime.read_reserved(self.socket_path)
        for tid, own in list(saved.items()):
            try:
                now = os.sched_getaffinity(tid)
            except OSError:
                now = None
            if now is None or now == set(own) or not now <= set(own) | held_then:
                del saved[tid]
        n = len(saved)
        procs.restore_affinity(saved)
        if n:
            logging.getLogger("krex.controller").warning(
                "put back the CPU masks of %d thread(s) a previous controller had moved for its regions", n)
        self.write_saved(())

    def isolate(self, region, member_pids: list[int], frozen_pids: set[int], managed: Callable[[], set[int]],
                held_regions) -> None:
        """At the grant. managed(): every krex-managed pid (jobs' trees and registered clients)."""
        if not self.cfg.isolate_cpus:
            return
        listed = self.cfg.reserved_for(region.gpu_mask)
        others_held = live(held_regions, region)
        taken = set().union(*(r.reserved for r in others_held)) if others_held else set()
        reserved = listed - taken
        if listed and not reserved:
            self.rate_log("cores_taken", logging.WARNING, "region %d: its reserved cores (%s) are all held by another "
                          "region on other GPUs; its owner keeps its own CPUs (give each GPU cores of its own: "
                          "reserved_cores per GPU)", region.id, ",".join(map(str, sorted(listed))))
        if self.handover is not None and self.handover[0] != reserved:
            self.release(held_regions)
        if not reserved:
            return
        region.reserved = reserved
        handed_over = self.handover is not None
        if handed_over:
            region.saved_affinity, self.handover = self.handover[1], None
        elif not isinstance(region.saved_affinity, procs.Saved):
            region.saved_affinity = procs.Saved(region.saved_affinity)
            region.saved_affinity.since = procs.ticks_now() - 1     # a tick early: /proc counts whole ticks
        # a thread another held region moved already: its own mask is the one that region saved
        prior = {t: m for r in others_held for t, m in r.saved_affinity.items()}
        # the owner confined to the reserved cores with all its threads, or on its own CPUs and the reserved
        # ones (a torch process confined to two cores launched its small kernels late: bench/trial_modes)
        owner = (lambda old: reserved) if self.cfg.owner_cpus == "reserved" else (lambda old: old | reserved)
        for pid in member_pids:
            tids = procs.threads(pid)
            region.member_tids.update(tids)
            self.own_masks(tids, prior, region.saved_affinity)
            procs.set_affinity(tids, owner, region.saved_affinity)
        if not handed_over:
            # (back-to-back regions on the same cores: everyone else is already off them, the last owner and its
            # frozen siblings moved at its end, newcomers at their HELLO)
            others = managed() - set(member_pids) - {os.getpid()} - frozen_pids
            for pid in others:
                tids = procs.threads(pid)
                self.own_masks(tids, prior, region.saved_affinity)
                procs.set_affinity(tids, lambda old: old - reserved, region.saved_affinity)
        self.publish(held_regions, region)

    @staticmethod
    def own_masks(tids, prior: dict, saved: dict) -> None:
        """Threads another held region moved: their own masks (that region's saved ones) are what to put back."""
        for t in tids:
            if t in prior and t not in saved:
                saved[t] = prior[t]

    def held_elsewhere(self, held_regions, region=None) -> set:
        """The cores other held regions (and a hand-over) hold now."""
        cpus = set().union(*(r.reserved for r in live(held_regions, region)))
        return cpus | (set(self.handover[0]) if self.handover is not None else set())

    def put_back(self, saved: dict, held_regions, region=None) -> None:
        """Restore saved masks less the cores other held regions (and a hand-over) still hold. A member of another
        held region is left as it is, its own mask handed to that region, which puts it back at its end."""
        others = live(held_regions, region)
        if not others and self.handover is None:
            procs.restore_affinity(saved)
            return
        taken = self.held_elsewhere(held_regions, region)
        kept = {}
        for tid, cpus in saved.items():
            holder = next((r for r in others if tid in r.member_tids), None)
            if holder is not None:
                holder.saved_affinity.setdefault(tid, cpus)
                continue
            mask = procs.Mask(set(cpus) - taken)
            mask.start = getattr(cpus, "start", None)
            if mask:
                kept[tid] = mask
            if mask != set(cpus):
                self.owe(tid, cpus, others)    # kept off their cores: theirs to give back whole at their end
        saved.clear()
        procs.restore_affinity(kept)

    def owe(self, tid: int, own, others) -> None:
        """A thread left off cores other held regions (or the hand-over) hold: each of them keeps its own mask,
        to put back at its end (a region that saved it first keeps its own saving)."""
        for r in others:
            if r.reserved & set(own):
                r.saved_affinity.setdefault(tid, own)
        if self.handover is not None and self.handover[0] & set(own):
            self.handover[1].setdefault(tid, own)

    def join(self, region, pid: int) -> None:
        """A gang member joined a held region: onto its cores."""
        if region.reserved:
            tids = procs.threads(pid)
            region.member_tids.update(tids)
            procs.set_affinity(tids, lambda old: region.reserved, region.saved_affinity)
            self.saved_dirty = True

    def leave(self, region, pid: int, held_regions=()) -> None:
        """A member left a region that goes on: its CPUs back now."""
        if region.reserved:
            self.unpin_newcomers(region, [pid], taken=self.held_elsewhere(held_regions, region),
                                 others=live(held_regions, region))
            mine = {}
            for tid in procs.threads(pid):
                region.member_tids.discard(tid)     # no longer the region's: another region's end puts it back
                old = region.saved_affinity.pop(tid, None)
                if old is not None:
                    mine[tid] = old
            self.put_back(mine, held_regions, region)
            self.saved_dirty = True

    def end(self, region, frozen_pids: list[int], others_waiting: bool, held_regions) -> None:
        """At the end: hand the cores over when another request waits on these GPUs, else restore."""
        if region.reserved and others_waiting and self.handover is not None:
            self.release(held_regions)     # one hand-over at a time: the earlier one's masks go back first
        taken = self.held_elsewhere(held_regions, region) if region.reserved else set()
        if region.reserved:
            self.unpin_newcomers(region, region.pids, off=others_waiting, taken=taken,
                                 others=live(held_regions, region))
        if region.reserved and others_waiting:
            saved = region.saved_affinity
            away = region.reserved | taken
            for pid in region.pids:        # the members: from their own masks before the region, less ours and
                for tid in procs.threads(pid):     # other held regions'
                    procs.set_affinity([tid], lambda old, t=tid: saved.get(t, old) - away, saved)
            for pid in frozen_pids:
                procs.set_affinity(procs.threads(pid), lambda old: old - away, saved)
            if taken:
                others = live(held_regions, region)
                for tid, own in saved.items():
                    if own & taken:
                        self.owe(tid, own, others)
            self.handover = (region.reserved, region.saved_affinity)
        else:
            if region.reserved:
                self.note_freed(region.reserved, region.saved_affinity)
            self.put_back(region.saved_affinity, held_regions, region)
        if region.reserved:
            self.publish(held_regions, exclude=region)

    def unpin_newcomers(self, region, pids, off: bool = False, taken: frozenset = frozenset(), others=()) -> None:
        """Threads and child processes a member made inside the region inherited its confinement and are in no
        saved mask: each on the reserved cores gets the mask its process had before the region (its main
        thread's, saved, or left as it was: --owner-cpus own-and-reserved adds cores only to those lacking
        them). off (the cores are handed over): that mask less the reserved cores now, the mask itself saved for
        the hand-over's end. Never onto `taken`, the cores other held regions hold."""
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
                        new = (base - region.reserved if off else base) - taken   # never onto held cores
                        if new and new != cur:
                            start = procs.thread_start(tid)
                            os.sched_setaffinity(tid, new)
                            kept = procs.Mask(base)
                            kept.start = start
                            if off:
                                saved[tid] = kept
                            elif base & taken:      # kept off other regions' cores: theirs to give back
                                self.owe(tid, kept, others)
                    except OSError:
                        pass

    def note_freed(self, cores, saved: dict) -> None:
        """Masks about to go back as their cores are freed: free_newcomers looks for what their threads made."""
        if cores and saved:
            self.freed.append((frozenset(cores), dict(saved), getattr(saved, "since", 0)))

    def free_newcomers(self, held_regions) -> None:
        """Threads and processes that threads moved off reserved cores made while the cores were held inherited
        the moved mask and are in no saved mask: without this they stayed off those cores for good (a compiler
        a build started during a region ran its whole life on fewer CPUs). Each one started since the cores
        were taken whose mask is its maker's own less some of those cores (and maybe less cores other regions
        still hold) gets that own mask back, less the cores regions hold now (owed to them, as put_back does). A
        mask set otherwise is the program's and stays; one set to exactly what krex would leave (all but the
        reserved cores) cannot be told from it. The server calls this a moment after the end, off the end's
        path, and at its stop: it reads /proc for every saved thread (each process's task list and children
        once)."""
        pending, self.freed = self.freed, []
        if not pending:
            return
        # one walk for every reservation freed since the last call (each saved every moved thread: a walk each
        # cost ~45 ms per 2000 threads), matched against all their cores: a newcomer made while regions on several
        # GPUs held cores lacks all of them
        cores = frozenset().union(*(c for c, _, _ in pending))
        since = min(s for _, _, s in pending)
        saved: dict = {}
        for _, sv, _ in pending:
            for t, m in sv.items():
                saved.setdefault(t, m)
        others = live(held_regions)
        taken = self.held_elsewhere(held_regions)
        seen: set = set()
        for tid in saved:
            if tid in seen:
                continue
            try:        # one process's trouble (a /proc read gone wrong) leaves the others' newcomers to be freed
                group = procs.thread_group(tid)
                seen.update(group)
                own = [saved[t] for t in group if t in saved]
                if not own:
                    continue
                made = [t for t in group if t not in saved]
                kids = procs.children(tid)
                # the processes it made and theirs (a saved child's are walked with its own group); a kernel
                # without /proc/PID/task/TID/children: every descendant, from one scan of /proc
                tree = procs.descendants(tid) if kids is None else \
                    [p for k in kids if k not in saved for p in [k] + procs.descendants(k)]
                for p in tree:
                    if p not in saved:
                        made.extend(procs.threads(p))
                self.free_made(made, own, cores, since, taken, others, saved.keys())
            except Exception as e:
                self.rate_log("free_newcomers", logging.ERROR, "could not give the reserved cores back to what "
                              "thread %d's process made during a region: %r", tid, e)

    def free_made(self, tids, own: list, cores: frozenset, since: int, taken: set, others, skip: set) -> None:
        """free_newcomers for the threads one saved process made (own: its saved masks). A held region (or the
        hand-over) that moved such a thread again saved the inherited mask as its own: that saving becomes the
        maker's mask, for it to put back at its end."""
        savings = [r.saved_affinity for r in others] + ([self.handover[1]] if self.handover is not None else [])
        for tid in tids:
            if tid in skip or any(tid in r.member_tids for r in others):
                continue
            try:
                start = procs.thread_start(tid)
                if start is None or start < since:
                    continue
                having = [sv for sv in savings if tid in sv]
                # (a saving of a thread whose tid another has taken since is not its; it is replaced below)
                holders = [sv for sv in having if getattr(sv[tid], "start", start) == start]
                inherited = set(holders[0][tid]) if holders else os.sched_getaffinity(tid)
                # its maker's own less freed cores, and maybe less cores other regions still hold
                base = next((set(m) for m in own if inherited < set(m) and set(m) - inherited <= cores | taken
                             and (set(m) - inherited) & cores), None)
                if base is None or inherited & cores:
                    continue
                mask = procs.Mask(base)
                mask.start = start
                for sv in having:
                    sv[tid] = mask
                new = base - taken
                if new and new != os.sched_getaffinity(tid):
                    os.sched_setaffinity(tid, new)
            except OSError:
                continue
            if base & taken:        # off cores other regions hold now: theirs to give back at their end
                self.owe(tid, mask, others)
            if having or base & taken:
                self.saved_dirty = True

    def release(self, held_regions) -> None:
        """Nobody took the handed-over cores: everyone's masks back."""
        if self.handover is not None:
            cores, saved = self.handover
            self.handover = None
            self.note_freed(cores, saved)
            self.put_back(saved, held_regions)
            self.publish(held_regions)

    def publish(self, held_regions, include=None, exclude=None) -> None:
        """SOCKET.reserved: the CPUs region owners hold now (wire/runtime.py); SOCKET.affinity: the masks to put
        back should this controller die holding them."""
        regions = live(held_regions, exclude) + ([include] if include is not None and include.reserved else [])
        cpus = self.held_elsewhere(regions)
        try:
            runtime.write_reserved(self.socket_path, cpus)
        except OSError as e:
            self.rate_log("reserved_file", logging.ERROR, "cannot write %s: %s",
                          runtime.reserved_path(self.socket_path), e)
        self.saved_from, self.saved_dirty = regions, True    # written by flush_saved, off the grant's path

    def flush_saved(self) -> None:
        """SOCKET.affinity brought up to date (the server calls it every second): tens of milliseconds for a
        few thousand threads, so never in a grant or an end; a controller that dies within a second of a change
        leaves that change's masks to the wrappers (krex run puts its job's back) or to the threads' exit."""
        if self.saved_dirty:
            self.saved_dirty = False
            self.write_saved(self.saved_from)

    def write_saved(self, regions) -> None:
        saved: dict = {}
        for r in regions:
            for t, m in r.saved_affinity.items():
                saved.setdefault(t, m)
        if self.handover is not None:
            for t, m in self.handover[1].items():
                saved.setdefault(t, m)
        try:
            runtime.write_affinity(self.socket_path, saved)
        except OSError as e:
            self.rate_log("affinity_file", logging.ERROR, "cannot write %s: %s",
                          runtime.affinity_path(self.socket_path), e)

    def keep_off(self, client, held_regions) -> None:
        """A process that registers while regions hold reserved cores moves off them at once: commands started
        during a region (a new `krex run`, its Python importing torch) must not land there. Each reservation
        saves the thread's own mask (the first one's save, not a mask another has reduced already)."""
        held = [(r.reserved, r.saved_affinity) for r in live(held_regions) if client not in r.members]
        reservations = held + ([self.handover] if self.handover else [])
        if not reservations:
            return
        tids = [t for pid in [client.pid] + procs.descendants(client.pid) for t in procs.threads(pid)]
        prior = {t: m for _, saved in reservations for t, m in saved.items()}
        for reserved, saved in reservations:
            self.own_masks(tids, prior, saved)
            before = set(saved)
            procs.set_affinity(tids, lambda old, r=reserved: old - r, saved)
            for t in set(saved) - before:
                prior.setdefault(t, saved[t])
        self.saved_from, self.saved_dirty = live(held_regions), True
