"""The server's half of regions: it carries out the effects of the region state machine (policy/regions.py)
with the mechanisms of enforce/ and sends every reply. Nothing is decided here: what happens next is the
policy's; this module only does it and reports back what it observed (the time, which siblings are stopped).

Order at the end matters and is the same for every region: the GPU's counters first (before anyone else
runs), CPUs back (or handed over to the next region on these cores), resume, the state file, open the gates,
the record, the replies, the next grant."""

import logging
import os
import time
import weakref

from . import procs, server_feedback
from .policy import regions as policy
from .policy.regions import Event
from .wire import report
from .wire.frames import MSG, C, encode

log = logging.getLogger("krex.controller")


def now_ns() -> int:
    return time.monotonic_ns()


def job_ids(region) -> set:
    """The ids of the jobs a region worked for: its own, and its warm workers' commands' (Region.own)."""
    return {j.id for j in region.own | {region.job}}


class RegionEffects:
    """Mixed into the server (server.py): it owns self.book (policy.regions.Regions), self.gate,
    self.freezer, self.isolation, self.attest, self.jobs, self.clients, self.pool, and self.last_on_gpu (GPU ->
    what held it last, for each record's previous_region)."""

    def apply(self, effects: list) -> None:
        for e in effects:
            try:
                self.apply_one(e)
            except Exception:     # the controller never dies of one region; the requester hears why
                region = getattr(e, "region", None)
                log.exception("region step %s failed", type(e).__name__)
                if region is not None and self.book.live(region):
                    self.apply(self.book.abort(region, time.monotonic()))
        if self.isolation.handover is not None and not self.book.regions:
            self.isolation.release(())    # the waiter the cores were kept for went away

    def apply_one(self, e) -> None:
        if isinstance(e, policy.CloseGates):
            for g in report.mask_to_list(e.region.gpu_mask):
                self.gate.close_gate(g, e.region.job.id, e.region.id)
            e.region.gates_closed_ns = time.monotonic_ns()   # after the close: see Regions.late_context
            # after the close: a process honouring the gate file from now on sees it closed (unregistered.py)
            e.region.unconnected = set(self.unregistered.unconnected())
        elif isinstance(e, policy.SendDrain):
            drain = encode("struct krex_drain", drain_id=e.region.id, gpu_mask=e.mask or e.region.gpu_mask)
            for c in e.clients:
                self.send(c, MSG["DRAIN"], drain)
        elif isinstance(e, policy.Arm):
            # a weak reference: a region that has ended is not kept alive until its time limit's timer fires
            # (at hundreds of regions a second, a 60 s limit kept tens of thousands of them)
            ref = weakref.ref(e.region)
            t = self.after(e.delay, lambda ref=ref, ev=e.event: (lambda r: r is not None and self.fire(r, ev))(ref()))
            self.__dict__.setdefault("region_timers", {}).setdefault(e.region.id, []).append(t)
        elif isinstance(e, policy.Freeze):
            new = self.book.to_stop(e.region, e.clients)
            already = [c for c in e.clients if c not in new]
            held, skipped = self.freezer.freeze(e.region.id, new, already, self.book.freezes.clients())
            server_feedback.mark_frozen(held)
            self.apply(self.book.frozen(e.region, held, skipped, time.monotonic()))
        elif isinstance(e, policy.Grant):
            self.grant(e.region)
        elif isinstance(e, policy.GrantMember):
            self.isolation.join(e.region, e.member.pid)
            self.send_granted(e.region, e.member)
        elif isinstance(e, policy.SendEnded):
            self.isolation.leave(e.region, e.member.pid, self.book.regions.values())
            if e.reason != C.KREX_END_OWNER_GONE and self.connected(e.member.client):
                self.send_ended(e.member.client, e.region, e.reason, e.seq, now_ns(), self.attest.taints_so_far(e.region))
        elif isinstance(e, policy.Finish):
            self.finish(e)
        elif isinstance(e, policy.Refuse):
            if self.connected(e.client):
                self.send_error(e.client, e.code, e.text, seq=e.seq)
        elif isinstance(e, policy.Recheck):      # a request waits for its fair share: schedule again then
            self.after(e.delay, lambda: self.apply(self.book.recheck(time.monotonic())))
        elif isinstance(e, policy.Wake):
            if not self.book.live(e.region):
                return            # the region was aborted in this same batch: its Restop came first
            for c in e.clients:
                self.isolation.keep_off(c, self.book.regions.values())
            self.freezer.wake(e.clients)
        elif isinstance(e, policy.Restop):
            self.freezer.restop(e.clients)
        elif isinstance(e, policy.Thaw):
            for c in e.clients:
                if c.pidfd is not None and c.pidfd.alive():
                    # it goes on unconnected: its shim may launch before it registers again (an exec), so the
                    # live regions it overlaps are tainted unregistered rather than silently shared
                    self.unregistered.note(c.pid)
                    log.warning("pid %d lost its connection while frozen; resumed", c.pid)
            self.freezer.thaw(e.clients, self.book.freezes.clients())
            server_feedback.mark_thawed(e.clients)
        elif isinstance(e, policy.Cancelled):
            self.send(e.client, MSG["REGION_ENDED"], encode(
                "struct krex_region_ended", region_id=0, ended_ns=now_ns(), reason=C.KREX_END_CANCELLED), seq=e.seq)
        else:
            raise TypeError(f"unknown effect {e!r}")

    def read_pass_done(self, started_ns: int) -> None:
        """The event loop read every ready client in a pass whose select() began at started_ns: regions whose
        gates closed before it may go on (policy.Regions.read_pass_done)."""
        self.apply(self.book.read_pass_done(started_ns, time.monotonic()))

    def fire(self, region, event: Event) -> None:
        """A timer the policy armed: feed it back with what can be observed now."""
        now = time.monotonic()
        if event is Event.DRAIN_TIMEOUT:
            if region.state is policy.State.DRAINING and self.book.live(region):
                if region.pending_drain:
                    log.warning("region %d: %d process(es) did not finish draining in %.1f s: %s", region.id,
                                len(region.pending_drain), self.cfg.drain_timeout_s,
                                [c.pid for c in region.pending_drain])
                else:
                    log.warning("region %d: its clients were not all read in the %.1f s of its drain after its gates "
                                "closed; going on, tainted drain_timeout", region.id, self.cfg.drain_timeout_s)
            self.apply(self.book.drain_timed_out(region, now))
        elif event is Event.SETTLED:
            before = region.taints
            effects = self.book.settle_poll(region, now)
            if region.taints & ~before & C.KREX_TAINT_LIFECYCLE:
                log.warning("region %d: a sibling's context or exit was still in flight after %.1f s", region.id,
                            self.cfg.lifecycle_timeout_s)
            self.apply(effects)
        elif event is Event.STOPPED:
            running = self.freezer.running(region.frozen) if self.book.live(region) else []
            effects = self.book.stop_poll(region, running, now)
            if region.unstopped:
                log.warning("region %d: pids %s not yet stopped; granting (they stay gated and drained)", region.id,
                            region.unstopped)
            self.apply(effects)
        elif event is Event.TIME_LIMIT:
            if self.book.live(region) and region.state is policy.State.HELD:
                log.warning("region %d (%s) of pid %d ran past %.1f s; revoked", region.id, region.req.name,
                            region.owner.pid, self.cfg.region_time_limit_s)
            self.apply(self.book.time_limit(region, now))

    # ---- the grant -----------------------------------------------------------------------------------
    def managed_pids(self) -> set[int]:
        """Every krex-managed pid: each job's root and its descendants of the job's user, and the GPU clients.
        A Slurm step's slurmstepd (a job rooted there: KREX_SLURM_JOB_SCOPE=step) is not the job's process, even
        for a job of root's: its tasks are."""
        managed: set[int] = set()
        for job in self.jobs.values():
            tree = ([] if job.stepd else [job.root_pid]) + procs.descendants(job.root_pid) if job.root_pid else []
            managed.update(p for p in tree if procs.owned_by(p, job.uid))
        managed.update(c.pid for c in self.clients.values() if c.role in (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON))
        return managed

    def grant(self, region) -> None:
        t0 = now_ns()
        frozen = {c.pid for c in self.book.freezes.clients()}
        self.isolation.isolate(region, [m.pid for m in region.members.values()], frozen, self.managed_pids,
                               self.book.regions.values())
        t1 = now_ns()
        region.phase_ns["isolate"] = t1 - t0
        # the GPU's counters as the region begins: before the grant, so that nothing of the owner's own work
        # is in them (is the GPU power-capped by the load before the region?)
        region.attest_start = self.attest.snapshot(region.gpu_mask)
        region.other_controllers = self.registry.during_region(region.gpu_mask, since_ns=now_ns())
        region.unconnected = getattr(region, "unconnected", set()) | set(self.unregistered.unconnected())
        region.phase_ns["attest"] = now_ns() - t1
        region.granted_ns = now_ns()
        region.previous = self.previous_region(region)
        for m in list(region.members.values()):
            self.send_granted(region, m)

    def previous_region(self, region):
        """What held any of this region's GPUs last, as the record's "previous_region": how long before this
        grant it ended, how long it held them, its lowest SM clock, and whether it was this region's own job.
        A region's timings can depend on the GPU's recent load even when it starts at the peak clock (H200: the
        1-10 ms kernels of regions that followed other agents' heavy ones ran at lower clocks), so the record
        says what came before."""
        last = self.last_on_gpu
        prev = max((last[g] for g in report.mask_to_list(region.gpu_mask) if g in last),
                   key=lambda p: p["ended_ns"], default=None)
        if prev is None:
            return None
        return {"gap_ms": round((region.granted_ns - prev["ended_ns"]) / 1e6, 3), "held_ms": prev["held_ms"],
                "sm_clock_min_mhz": prev["sm_clock_min_mhz"],
                "same_job": bool(prev["jobs"] & job_ids(region))}

    def send_granted(self, region, m) -> None:
        flags = C.KREX_REGION_GRANTED | (C.KREX_REGION_JOINED if m.joined else 0)
        self.send(m.client, MSG["REGION_GRANTED"], encode(
            "struct krex_region_granted", region_id=region.id, gpu_mask=region.gpu_mask,
            requested_ns=m.requested_ns, granted_ns=region.granted_ns, frozen=len(region.frozen),
            drain_timeouts=region.drain_timeouts, time_limit_ns=int(self.cfg.region_time_limit_s * 1e9),
            flags=flags, members=len(region.members)), seq=m.seq)

    def send_ended(self, client, region, reason: int, seq: int, ended: int, att) -> None:
        flags = (C.KREX_REGION_GRANTED if region.granted_ns else 0) | att.flags
        self.send(client, MSG["REGION_ENDED"], encode(
            "struct krex_region_ended", region_id=region.id, ended_ns=ended, reason=reason, flags=flags,
            taints=att.taints, sm_clock_min_mhz=att.clock_min, sm_clock_max_mhz=att.clock_max), seq=seq)

    # ---- the end -------------------------------------------------------------------------------------
    def finish(self, e) -> None:
        region, reason = e.region, e.reason
        ended = now_ns()   # exclusivity ends here: siblings may run from the SIGCONT below on
        unregistered, others, att, failed = [], set(), None, ""
        try:
            unregistered = self.unregistered.during(int(region.started * 1e9), ended,
                                                    getattr(region, "unconnected", ()))
            if unregistered:
                region.taints |= C.KREX_TAINT_UNREGISTERED
            others = {(o["pid"], o["uid"], o["socket"]) for o in getattr(region, "other_controllers", [])}
            others |= {(o["pid"], o["uid"], o["socket"])
                       for o in self.registry.during_region(region.gpu_mask, since_ns=int(region.started * 1e9))}
            if others:
                region.taints |= C.KREX_TAINT_OTHER_CONTROLLER
            att = self.attest.finish(region, ended) if region.granted_ns else self.attest.taints_so_far(region)
            region.phase_ns["attest_end"] = now_ns() - ended
            # another request for these GPUs: still queued, or started by this very end (the policy schedules the
            # next before this Finish is carried out) and not granted yet
            waiting = any(r.gpu_mask & region.gpu_mask for r in self.book.queue) or any(
                r is not region and r.gpu_mask & region.gpu_mask and not r.granted_ns
                for r in self.book.regions.values())
            self.isolation.end(region, [c.pid for c in region.frozen], waiting, self.book.regions.values())
        except Exception as x:     # logged and recorded; the record, the replies and the timers still follow
            log.exception("region %d: a step of its end failed", region.id)
            failed = f"{type(x).__name__}: {x}"
        finally:    # whatever failed above: nobody stays stopped, no gate stays closed
            self.freezer.resume(region.id, e.thaw, self.book.freezes.clients())
            server_feedback.mark_thawed(e.thaw)
            for g in report.mask_to_list(region.gpu_mask):
                if self.gate.owner(g) == region.job.id:
                    self.gate.open_gate(g)
        if att is None:
            att = self.attest.taints_so_far(region)
        named = region.recorded_member() or region.every_member[0]   # not a requester that gave up, if another used it
        extra = {"frozen": len(region.frozen), "drain_timeouts": region.drain_timeouts,
                 "queued_ns": max(0, int(region.started * 1e9) - named.requested_ns),
                 **{f"{k}_ns": v for k, v in region.phase_ns.items()},
                 "region_id": region.id, "controller_pid": os.getpid(), "others_busy_us": region.others_busy_us}
        rec = att.record()
        extra.update({k: v for k, v in rec.items() if k not in ("exclusive", "clean", "taints")})
        optional = {"frozen_pids": [c.pid for c in region.frozen], "freeze_skipped": region.freeze_skipped,
                    "unstopped": region.unstopped, "unregistered_pids": unregistered,
                    "other_controllers": [{"pid": p, "uid": u, "socket": s} for p, u, s in sorted(others)],
                    "clock_settle": region.clock_settle, "previous_region": region.previous,
                    "gap_waited_ms": region.gap_waited_ms, "end_step_failed": failed,
                    "kin_busy_us": region.kin_busy_us}
        extra.update({k: v for k, v in optional.items() if v})    # each only where there is something to say
        taints = att.taints | (0 if region.granted_ns else C.KREX_TAINT_NOT_GRANTED)
        record = report.region_record(name=named.name, gpu_mask=region.gpu_mask,
                                      requested_ns=named.requested_ns, granted_ns=region.granted_ns,
                                      ended_ns=ended, pid=named.pid,
                                      pids=[p for p in region.pids if p not in region.cancelled_pids] or region.pids,
                                      end_reason=reason, taints=taints, **extra)
        if not region.given_up:       # what a launch beside it read after its end amends (Regions.beside)
            region.ended_ns, region.record, region.record_taints = ended, record, taints
        # a region given up (its requester's wait ran out or was interrupted) is in that process's own record
        # alone (not_granted): a second record would count it and its wait twice, and say exclusive where the
        # grant crossed the cancel
        if not region.given_up:
            region.job.regions.append(record)
        if region.granted_ns and not region.given_up:
            for g in report.mask_to_list(region.gpu_mask):
                self.last_on_gpu[g] = {"ended_ns": ended, "held_ms": round((ended - region.granted_ns) / 1e6, 3),
                                       "sm_clock_min_mhz": att.clock_min or None, "jobs": job_ids(region)}
        for observer in getattr(self, "observers", ()):   # --trace, --metrics (commands/controller.py)
            try:
                observer.region_finished(record, region)
            except Exception:
                log.exception("region observer failed")
        for pid in set(region.pids):
            worker = self.pool.by_pid(pid)
            if worker is not None and worker.serving is not None and worker.serving is not region.job \
                    and not region.given_up:
                worker.serving.regions.append(record)   # a warm worker's region belongs to the command it runs
        leaver = e.leaver[0] if e.leaver else None
        if reason != C.KREX_END_OWNER_GONE:
            for client, m in list(region.members.items()):
                if client is not leaver and self.connected(client):
                    self.send_ended(client, region, reason, m.seq, ended, att)
            if leaver is not None and self.connected(leaver):
                self.send_ended(leaver, region, reason, e.leaver[1], ended, att)
        region.members.clear()
        self.drop_timers(region)

    def drop_timers(self, region) -> None:
        """An ended region's timers are cancelled, and the heap compacted when most of it is cancelled."""
        import heapq

        timers = self.__dict__.setdefault("region_timers", {}).pop(region.id, [])
        for t in timers:
            t.cancelled = True
        self.cancelled_timers = getattr(self, "cancelled_timers", 0) + len(timers)
        if self.cancelled_timers > 1024 and self.cancelled_timers > len(self.timers) // 2:
            self.timers = [t for t in self.timers if not t.cancelled]
            heapq.heapify(self.timers)
            self.cancelled_timers = 0
