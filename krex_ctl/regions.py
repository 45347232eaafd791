"""Region mechanics of the controller: start (close the gates, drain, freeze, isolate CPUs, grant), gang
members, and the end (restore, resume, open the gates, record, grant the next).

A region belongs to one job. Its first requester starts it; a later request from a process of the same
job whose GPUs lie inside the region's *joins* it (a gang: all ranks of a torchrun, or a process and the
children it forks inside its region) instead of queueing behind it, which would deadlock a parent waiting
for its child. The region ends when its last member leaves, or for all of them at the time limit.

Order of the start matters and is the same for every region: nothing is registered before the steps that
can fail are done (a half-built region would hang every later region on its GPUs), and frozen pids are
written to the state file and handed to the resumer before the first SIGSTOP (never a stopped process
without a durable record of it)."""

import json
import logging
import os
import signal
import time
from typing import Optional

from . import procs, proto
from .proto import C, MSG
from .scheduler import Request, mask_to_list, startable

log = logging.getLogger("krex.controller")


def now_ns() -> int:
    return time.monotonic_ns()


END_NAMES = {C.KREX_END_NORMAL: "normal", C.KREX_END_TIME_LIMIT: "revoked", C.KREX_END_OWNER_GONE: "owner_gone",
             C.KREX_END_CANCELLED: "cancelled"}


class Member:
    """One client inside a region, with the seq of its REGION_BEGIN (replies and revocations carry it)."""

    def __init__(self, client, seq: int, name: str, requested_ns: int, joined: bool):
        self.client, self.seq, self.name, self.requested_ns, self.joined = client, seq, name, requested_ns, joined
        self.pid = client.pid


class Region:
    def __init__(self, req: Request, first: Member):
        self.req = req
        self.id = req.id
        self.gpu_mask = req.gpu_mask
        self.job = first.client.job
        self.members: dict = {first.client: first}
        self.owner = first.client                  # the first member still inside (CPU isolation, records)
        self.pids: list[int] = [first.pid]          # everyone who was inside
        self.state = "draining"
        self.pending_drain: set = set()
        self.drain_timeouts = 0
        self.drain_started_ns = now_ns()
        self.frozen: list[procs.Pidfd] = []
        self.freeze_skipped = ""                     # why nobody was frozen although siblings exist
        self.saved_affinity: dict[int, set[int]] = {}
        self.reserved: set[int] = set()              # cores given to the members while the region is held
        self.granted_ns = 0
        self.phase_ns: dict[str, int] = {}           # drain, settle, freeze, isolate: where the hand-off time goes
        self.timer = None
        self.taints = 0
        self.attest_start = None                     # attest.Snapshot at the grant
        self.others_busy_us = 0                      # the longest a sibling's GPU work took to finish at the drain
        self.clock_settle: list[dict] = []           # each member's clock settle after its grant (shim/settle.c)


class RegionsMixin:
    """The region half of Controller (controller.py): it owns self.regions, self.queue, self.gate."""

    # ---- requests --------------------------------------------------------------------------------
    def busy_mask(self) -> int:
        m = 0
        for r in self.regions.values():
            m |= r.gpu_mask
        return m

    def joinable(self, client, mask: int) -> Optional[Region]:
        """A region of the client's job that covers mask: the client joins it rather than waiting behind it."""
        jobs = {client.job, self.command_job(client)}
        for r in self.regions.values():
            if mask & ~r.gpu_mask == 0 and self.own_jobs(r) & jobs:
                return r
        return None

    def join(self, region: Region, client, seq: int, name: str, requested_ns: int) -> None:
        m = Member(client, seq, name, requested_ns, joined=True)
        region.members[client] = m
        region.pids.append(client.pid)
        if region.state == "held":
            if region.reserved:
                procs.set_affinity(procs.threads(client.pid), lambda old: region.reserved, region.saved_affinity)
            self.send_granted(region, m)

    def schedule(self) -> None:
        for req in startable(self.queue, self.busy_mask()):
            self.queue.remove(req)
            req.owner.request = None
            try:
                self.start_region(req)
            except Exception:   # the controller never dies of one region; the requester hears why
                log.exception("region %d of pid %d could not start", req.id, req.owner.pid)
                self.abort_region(req)
        if self.handover is not None and not self.regions:
            self.release_handover()   # the waiter it was kept for went away

    def abort_region(self, req: Request) -> None:
        region = self.regions.pop(req.id, None)
        if region is not None:
            if region.timer:
                region.timer.cancelled = True
            for p in region.frozen:
                p.signal(signal.SIGCONT)
            self.resumer.release(region.id)
            procs.restore_affinity(region.saved_affinity)
        for g in mask_to_list(req.gpu_mask):
            if self.gate.owner(g) == (region.job.id if region else -1):
                self.gate.open_gate(g)
        if self.connected(req.owner):
            self.send_error(req.owner, C.KREX_ERR_STATE, "the controller could not start this region", seq=req.seq)

    # ---- start: gate, drain, settle, freeze, isolate, grant ------------------------------------------
    def command_job(self, client):
        """The job a client works for: a warm worker's is the command it runs, whose other processes (the
        command's children, under the wrapper's job) must not be its siblings."""
        worker = self.pool.by_pid(client.pid)
        return worker.serving if worker is not None and worker.serving is not None else client.job

    def own_jobs(self, region: Region) -> set:
        """The jobs a region works for: its own, and the commands its members run (warm workers)."""
        return {region.job} | {self.command_job(c) for c in region.members}

    def outsider(self, region: Region, client, mine: Optional[set] = None) -> bool:
        """client is not of the region's job (nor of the command a member runs for); mine: own_jobs(region)."""
        mine = self.own_jobs(region) if mine is None else mine
        return client not in region.members and client.job not in mine and self.command_job(client) not in mine

    def siblings(self, region: Region) -> list:
        mine = self.own_jobs(region)
        return [c for c in self.clients.values()
                if c.role == C.KREX_ROLE_SHIM and c.devices & region.gpu_mask and self.outsider(region, c, mine)]

    def start_region(self, req: Request) -> None:
        owner = req.owner
        if owner.job is None:
            raise RuntimeError("a region request from a client without a job")
        region = Region(req, Member(owner, req.seq, req.name, req.requested_ns, joined=False))
        siblings = self.siblings(region)
        drain = proto.encode("struct krex_drain", drain_id=region.id, gpu_mask=req.gpu_mask)
        self.regions[region.id] = region          # registered only now: nothing above can leave it half-built
        for g in mask_to_list(req.gpu_mask):
            self.gate.close_gate(g, region.job.id, region.id)
        for c in siblings:
            region.pending_drain.add(c)
            self.send(c, MSG["DRAIN"], drain)
        region.timer = self.after(float(self.cfg.drain_timeout_s), lambda: self.drain_timed_out(region))
        self.maybe_freeze(region)

    def drain_timed_out(self, region: Region) -> None:
        if region.state != "draining" or self.regions.get(region.id) is not region:
            return
        region.drain_timeouts = len(region.pending_drain)
        region.taints |= C.KREX_TAINT_DRAIN_TIMEOUT
        self.counters["drain_timeouts"] += region.drain_timeouts
        log.warning("region %d: %d process(es) did not finish draining in %.1f s: %s", region.id,
                    region.drain_timeouts, self.cfg.drain_timeout_s, [c.pid for c in region.pending_drain])
        region.pending_drain.clear()
        self.maybe_freeze(region)

    def maybe_freeze(self, region: Region) -> None:
        if region.state != "draining" or region.pending_drain:
            return
        if region.timer:
            region.timer.cancelled = True
        region.state = "settling"
        region.phase_ns["drain"] = now_ns() - region.drain_started_ns
        self.await_settled(region, time.monotonic() + float(self.cfg.lifecycle_timeout_s))

    def await_settled(self, region: Region, deadline: float) -> None:
        """The lifecycle barrier and settle time (lifecycle.py): no region starts while a sibling's context
        creation, teardown or exit is in flight, nor before the memory it freed has had time to be scrubbed."""
        if self.regions.get(region.id) is not region:
            return
        wait = self.lifecycle.wait_s(region)
        if wait > 0 and time.monotonic() < deadline:
            self.after(min(wait, 0.005), lambda: self.await_settled(region, deadline))
            return
        if wait > 0:
            region.taints |= C.KREX_TAINT_LIFECYCLE
            log.warning("region %d: a sibling's context or exit was still in flight after %.1f s", region.id,
                        self.cfg.lifecycle_timeout_s)
        region.phase_ns["settle"] = now_ns() - region.drain_started_ns - region.phase_ns["drain"]
        self.freeze(region)

    def freeze(self, region: Region) -> None:
        region.state = "freezing"
        # without freezing, exclusivity rests on the closed gate and the drain; the others' CPU work (compiling,
        # importing) goes on, off the reserved cores
        targets = [c for c in self.siblings(region) if c.pidfd is not None] if self.cfg.freeze else []
        if targets and not self.write_state_file(extra=[(c.pid, c.pidfd.start_time) for c in targets]):
            # no durable record, no SIGSTOP: a restarted controller could not resume them
            region.freeze_skipped = "state file not writable"
            self.rate_log("freeze_skipped", logging.ERROR, "cannot record frozen pids in %s; regions keep the GPU "
                          "exclusive by the gate and the drain, without freezing", self.state_path)
            targets = []
        if targets:
            self.resumer.hold(region.id, [c.pidfd.fd for c in targets])
        for c in targets:
            if c.pidfd.signal(signal.SIGSTOP):
                region.frozen.append(c.pidfd)
        self.counters["frozen_total"] += len(region.frozen)
        self.await_stopped(region, time.monotonic() + float(self.cfg.freeze_timeout_s))

    def await_stopped(self, region: Region, deadline: float) -> None:
        if self.regions.get(region.id) is not region:
            return
        running = [p for p in region.frozen if procs.state(p.pid) not in ("T", "t", "Z", "X", None)]
        if running and time.monotonic() < deadline:
            self.after(0.0001, lambda: self.await_stopped(region, deadline))
            return
        if running:
            log.warning("region %d: pids %s not yet stopped; granting anyway", region.id, [p.pid for p in running])
        t0 = now_ns()
        region.phase_ns["freeze"] = t0 - region.drain_started_ns - region.phase_ns["drain"] - region.phase_ns["settle"]
        self.isolate_cpus(region)
        region.phase_ns["isolate"] = now_ns() - t0
        self.grant(region)

    def member_pids(self, region: Region) -> list[int]:
        return [m.pid for m in region.members.values()]

    def isolate_cpus(self, region: Region) -> None:
        if not self.cfg.isolate_cpus:
            return
        reserved = self.cfg.reserved_for(region.gpu_mask)
        if self.handover is not None and self.handover[0] != reserved:
            self.release_handover()
        if not reserved:
            return
        region.reserved = reserved
        inside = self.member_pids(region)
        handed_over = self.handover is not None
        if handed_over:
            region.saved_affinity, self.handover = self.handover[1], None
        # the owner confined to the reserved cores with all its threads, or on its own CPUs and the reserved
        # ones (a torch process confined to two cores launched its small kernels late: bench/trial_modes)
        owner = (lambda old: reserved) if self.cfg.owner_cpus == "reserved" else (lambda old: old | reserved)
        for pid in inside:
            procs.set_affinity(procs.threads(pid), owner, region.saved_affinity)
        self.publish_reserved()
        if handed_over:
            # back-to-back regions on the same cores: everyone else is already off them (the last
            # owner and its frozen siblings were moved at its end, newcomers at their HELLO)
            return
        frozen = {p.pid for p in region.frozen}
        managed: set[int] = set()
        for job in self.jobs.values():
            tree = [job.root_pid] + procs.descendants(job.root_pid) if job.root_pid else []
            managed.update(p for p in tree if procs.owned_by(p, job.uid))
        managed.update(c.pid for c in self.clients.values() if c.role in (C.KREX_ROLE_SHIM, C.KREX_ROLE_PYTHON))
        managed -= set(inside) | {os.getpid()} | frozen
        for pid in managed:
            procs.set_affinity(procs.threads(pid), lambda old: old - reserved, region.saved_affinity)

    def hand_over_cores(self, region: Region) -> bool:
        """At the end of a region with others waiting on its GPUs: keep the isolation for the next one
        instead of restoring every thread and walking every job again (~4 ms with 60 clients)."""
        if not region.reserved or not any(r.gpu_mask & region.gpu_mask for r in self.queue):
            return False
        saved = region.saved_affinity
        for pid in region.pids:        # the members: from their own masks before the region, less ours
            for tid in procs.threads(pid):
                procs.set_affinity([tid], lambda old, t=tid: saved.get(t, old) - region.reserved, saved)
        for p in region.frozen:
            procs.set_affinity(procs.threads(p.pid), lambda old: old - region.reserved, saved)
        self.handover = (region.reserved, region.saved_affinity)
        return True

    def release_handover(self) -> None:
        if self.handover is not None:
            saved = self.handover[1]
            self.handover = None
            self.publish_reserved()
            procs.restore_affinity(saved)

    def publish_reserved(self) -> None:
        """Write the CPUs region owners hold now to SOCKET.reserved, so a starting `krex run` can step
        off them before it has even connected (procs.step_off_reserved)."""
        cpus = set()
        for r in self.regions.values():
            cpus |= r.reserved
        if self.handover is not None:
            cpus |= self.handover[0]
        path = self.socket_path + ".reserved"
        try:
            procs.write_atomic(path, ",".join(map(str, sorted(cpus))), 0o644)
        except OSError as e:
            self.rate_log("reserved_file", logging.ERROR, "cannot write %s: %s", path, e)

    def keep_off_reserved(self, client) -> None:
        """A process that registers while regions hold reserved cores moves off them at once: commands
        started during a region (a new `krex run`, its Python importing torch) must not land there."""
        held = [(r.reserved, r.saved_affinity) for r in self.regions.values()
                if r.reserved and client not in r.members]
        reservations = held + ([self.handover] if self.handover else [])
        tids = [t for pid in [client.pid] + procs.descendants(client.pid) for t in procs.threads(pid)] \
            if reservations else []
        for reserved, saved in reservations:
            procs.set_affinity(tids, lambda old, r=reserved: old - r, saved)

    def grant(self, region: Region) -> None:
        if self.lifecycle.busy(region):     # the barrier is off, or gave up waiting
            region.taints |= C.KREX_TAINT_LIFECYCLE
        # the GPU's counters as the region begins: before the grant, so that nothing of the owner's own work
        # is in them (is the GPU power-capped by the load before the region?)
        t0 = now_ns()
        region.attest_start = self.attest.snapshot(region.gpu_mask)
        region.phase_ns["attest"] = now_ns() - t0
        region.state = "held"
        region.granted_ns = now_ns()
        self.counters["regions_granted"] += 1
        for m in list(region.members.values()):
            self.send_granted(region, m)
        region.timer = self.after(float(self.cfg.region_time_limit_s), lambda: self.revoke(region))

    def send_granted(self, region: Region, m: Member) -> None:
        flags = C.KREX_REGION_GRANTED | (C.KREX_REGION_JOINED if m.joined else 0)
        self.send(m.client, MSG["REGION_GRANTED"], proto.encode(
            "struct krex_region_granted", region_id=region.id, gpu_mask=region.gpu_mask,
            requested_ns=m.requested_ns, granted_ns=region.granted_ns, frozen=len(region.frozen),
            drain_timeouts=region.drain_timeouts, time_limit_ns=int(self.cfg.region_time_limit_s * 1e9),
            flags=flags, members=len(region.members)), seq=m.seq)

    # ---- end ---------------------------------------------------------------------------------------
    def revoke(self, region: Region) -> None:
        if self.regions.get(region.id) is region:
            log.warning("region %d (%s) of pid %d ran past %.1f s; revoked", region.id, region.req.name,
                        region.owner.pid, self.cfg.region_time_limit_s)
            self.counters["regions_revoked"] += 1
            region.taints |= C.KREX_TAINT_REVOKED
            self.revoked_ids[region.id] = True
            while len(self.revoked_ids) > 4096:
                del self.revoked_ids[next(iter(self.revoked_ids))]
            self.end_region(region, C.KREX_END_TIME_LIMIT)

    def leave(self, region: Region, client, reason: int, seq: int) -> None:
        """A member is done (REGION_END, cancel, or its connection closed); the region ends with the last."""
        region.members.pop(client, None)
        if region.members:
            if region.owner is client:
                region.owner = next(iter(region.members))
            if region.reserved:   # the leaver gets its CPUs back now; the others keep the region
                for tid in procs.threads(client.pid):
                    old = region.saved_affinity.pop(tid, None)
                    if old is not None:
                        procs.set_affinity([tid], lambda _o, c=old: c, {})
            if reason != C.KREX_END_OWNER_GONE and self.connected(client):
                self.send_ended(client, region, reason, seq, now_ns(), self.attest.taints_so_far(region))
            return
        self.end_region(region, reason, leaver=(client, seq))

    def send_ended(self, client, region: Region, reason: int, seq: int, ended: int, att) -> None:
        flags = (C.KREX_REGION_GRANTED if region.granted_ns else 0) | att.flags
        self.send(client, MSG["REGION_ENDED"], proto.encode(
            "struct krex_region_ended", region_id=region.id, ended_ns=ended, reason=reason, flags=flags,
            taints=att.taints, sm_clock_min_mhz=att.clock_min, sm_clock_max_mhz=att.clock_max), seq=seq)

    def end_region(self, region: Region, reason: int, leaver=None) -> None:
        if self.regions.pop(region.id, None) is None:
            return
        ended = now_ns()   # exclusivity ends here: siblings may run from the SIGCONT below on
        att = self.attest.finish(region, ended)   # the GPU's counters first, before anyone else runs
        region.phase_ns["attest_end"] = now_ns() - ended
        if region.timer:
            region.timer.cancelled = True
        if not self.hand_over_cores(region):
            procs.restore_affinity(region.saved_affinity)
        if region.reserved:
            self.publish_reserved()
        frozen = len(region.frozen)
        for p in region.frozen:
            p.signal(signal.SIGCONT)
        region.frozen.clear()
        self.resumer.release(region.id)
        self.write_state_file()
        for g in mask_to_list(region.gpu_mask):
            self.gate.open_gate(g)
        record = {
            "name": region.req.name, "gpu": mask_to_list(region.gpu_mask),
            "requested_ns": region.req.requested_ns, "granted_ns": region.granted_ns or None, "ended_ns": ended,
            "pid": region.req.owner.pid, "pids": sorted(set(region.pids)), "end": END_NAMES[reason],
            "frozen": frozen, "drain_timeouts": region.drain_timeouts,
            "queued_ns": region.drain_started_ns - region.req.requested_ns,
            **{f"{k}_ns": v for k, v in region.phase_ns.items()},
            "region_id": region.id, "controller_pid": os.getpid(), "others_busy_us": region.others_busy_us,
            **att.record(),
        }
        if region.freeze_skipped:
            record["freeze_skipped"] = region.freeze_skipped
        if region.clock_settle:
            record["clock_settle"] = region.clock_settle
        region.job.regions.append(record)
        for pid in set(region.pids):
            worker = self.pool.by_pid(pid)
            if worker is not None and worker.serving is not None and worker.serving is not region.job:
                worker.serving.regions.append(record)   # a warm worker's region belongs to the command it runs
        for client, m in list(region.members.items()):
            if client is (leaver[0] if leaver else None) or not self.connected(client):
                continue
            if reason != C.KREX_END_OWNER_GONE:
                self.send_ended(client, region, reason, m.seq, ended, att)
        if leaver is not None and reason != C.KREX_END_OWNER_GONE and self.connected(leaver[0]):
            self.send_ended(leaver[0], region, reason, leaver[1], ended, att)
        region.members.clear()
        self.schedule()

    # ---- never leave a process stopped ---------------------------------------------------------
    def write_state_file(self, extra: list = ()) -> bool:
        """Record every frozen pid (with its start time) durably; False when that failed."""
        frozen = [(p.pid, p.start_time) for r in self.regions.values() for p in r.frozen] + list(extra)
        try:
            if frozen:
                procs.write_atomic(str(self.state_path), json.dumps(
                    {"controller_pid": os.getpid(), "frozen": frozen}), 0o600)
            else:
                self.state_path.unlink(missing_ok=True)
            return True
        except OSError as e:
            self.rate_log("state_file", logging.ERROR, "cannot write state file %s: %s", self.state_path, e)
            return False

    def resume_from_state_file(self) -> None:
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as e:
            log.error("cannot read state file %s (%s); ignored", self.state_path, e)
            return
        frozen = parse_state(text)
        if frozen is None:
            aside = self.state_path.with_name(self.state_path.name + ".bad")
            log.error("state file %s is not a krex state file; moved to %s and ignored", self.state_path, aside)
            try:
                os.replace(self.state_path, aside)
            except OSError:
                pass
            return
        for pid, st in frozen:
            if st is not None and procs.start_time(pid) == st:
                try:
                    p = procs.Pidfd(pid)
                    if p.start_time == st:
                        p.signal(signal.SIGCONT)
                        log.warning("resumed pid %d left stopped by a previous controller", pid)
                    p.close()
                except OSError:
                    pass
        self.state_path.unlink(missing_ok=True)


def parse_state(text: str) -> Optional[list[tuple[int, Optional[int]]]]:
    """The frozen (pid, start time) pairs of a state file, or None when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("frozen", []), list):
        return None
    out = []
    for item in data.get("frozen", []):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and item[0] > 1
                and (item[1] is None or isinstance(item[1], int))):
            return None
        out.append((item[0], item[1]))
    return out
