"""Per-region attestation: what the controller knows of a region's conditions, as taints.

krex's own taints (a drain that timed out, a revocation) are set by the region mechanics; the GPU's
counters are read here at the region's boundaries, and its process list also every SAMPLE_S while the region
is held (a process that came and went between the ends was missed)."""

from dataclasses import dataclass, field
from typing import Optional

from .. import procs
from ..wire.frames import C
from ..wire.report import region_flags, verdict

@dataclass
class Result:
    taints: int = 0
    clock_min: int = 0
    clock_max: int = 0
    attested: bool = False
    details: Optional[dict] = None

    @property
    def flags(self) -> int:
        return region_flags(self.taints, self.attested)

    def record(self) -> dict:
        out = {**verdict(self.taints), "attested": self.attested,
               "sm_clock_mhz": [self.clock_min, self.clock_max] if self.attested else None}
        if self.details:
            out["attestation"] = self.details
        return out


SAMPLE_S = 0.2     # while a region is held, its GPUs' process lists are read this often (server.py)


class Attestor:
    """Without a GPU counter source: only krex's own taints."""

    source = None

    def snapshot(self, gpu_mask: int):
        return None

    def sample(self, region) -> None:
        pass

    def taints_so_far(self, region) -> Result:
        return Result(region.taints)

    def finish(self, region, ended_ns: int) -> Result:
        return Result(region.taints)


@dataclass
class GpuSnapshot:
    wall_us: int                  # NVML's sample clock (microseconds of wall time)
    reasons: int
    clock: Optional[int]
    temperature: Optional[int]
    pids: dict
    looks: dict = field(default_factory=dict)   # at the grant: pid -> look() of each listed pid not a client
    seen: dict = field(default_factory=dict)    # listed first while the region was held (sample()): pid -> look()


def krex_managed(pid: int) -> bool:
    """A process on the GPU that krex's shim is in (a command's child between its context creation and its
    HELLO, or after its goodbye), or one that has already exited (NVML lists a process until its context is
    torn down: that is lifecycle work, not a foreign process): not foreign. Exited means gone or every thread
    a zombie, not a process whose main thread alone has exited (procs.exit_state)."""
    env = procs.environ_entries(pid)
    if env is None:
        return procs.exit_state(pid, None) == "exited"
    return any(e.startswith(b"KREX_JOB=") for e in env) and procs.preloads_krex(env)


class NvmlAttestor(Attestor):
    """Reads the GPU's own state at a region's grant and at its end: clock event reasons, the SM clock (and at
    the end every SM clock sample NVML took meanwhile), temperature, the processes with a context (also every
    SAMPLE_S in between, sample()), XID events. Only the cheap reads (a few microseconds each on the H200; the violation counters
    took 0.6 ms and the energy counter 2.8 ms, bench/results/attest-h200-*.json, so they are not read).

    Taints are what other jobs or the machine did to the region, not what the region's own load does to the
    GPU (a heavy kernel caps the GPU's power by itself, alone as well: that is its isolated time too):
      power_cap        power-capped at the grant, right after other jobs' GPU work (their work still took
                       busy_before_us or more to finish at the drain): their load lowered the clock we start at;
                       not when the shim's clock settle then read the clock back at its peak before the region's
                       owner went on (the canary measures the clock the region starts at; NVML's reason bit at
                       the grant only says the limiter was active then)
      thermal          thermal slowdown at either end
      hw_slowdown      hardware slowdown or power brake at either end
      clock_drop       the SM clock samples span more than clock_drop_pct with no power or thermal reason at
                       either end to explain it; off by default (clock_drop_pct 0): on the H200 a kernel's own
                       load lowers the clock from the grant's idle boost (1980 MHz) to ~1650 MHz with no reason
                       bit set, and NVML samples the clock about every 1/6 s, so most regions have no sample
                       between their ends (bench/results/perturb-ab-h200-run5.json: every clock_drop was that)
      foreign_process  a process neither a krex client nor under krex's shim held a context on the GPU
      lifecycle        (also the lifecycle barrier's) another job's client that disconnected on its way out still
                       held a context on the GPU: its teardown ran in the region's time
      xid              the driver reported an XID error meanwhile
    Everything read goes into the region's record ("attestation") for whoever wants to judge otherwise."""

    source = "nvml"

    def __init__(self, nv, cfg, known_pids, departed=dict) -> None:
        self.nv, self.cfg, self.known_pids, self.departed = nv, cfg, known_pids, departed
        if fake_gpus(nv):
            self.source = "fake"    # the tests' fake NVML: its figures are no claim about a GPU

    def look(self, pid: int) -> tuple:
        """What a listed pid that is no client is now: ("departed", its exit_state, its job ids) for a client
        that disconnected lately and is on its way out or has exited, else ("managed", krex_managed)."""
        d = self.departed_state(pid)
        if d is not None and d[0] != "running":
            return ("departed", d[0], d[1])
        return ("managed", krex_managed(pid))

    def departed_state(self, pid: int) -> Optional[tuple]:
        """(its exit_state, its job ids) for a client that has disconnected lately, else None. Its connection
        can close before its GPU context does, and by then its environment is unreadable (its memory is
        released first), so krex_managed cannot tell: if it is exiting, its teardown is lifecycle work, not a
        foreign process; if it has exited, NVML's listing is stale (its files are closed). One that disconnected
        and runs on is judged as any other process."""
        d = self.departed().get(pid)
        return (procs.exit_state(pid, d[0]), d[1]) if d is not None else None

    def _gpu(self, g: int) -> GpuSnapshot:
        import time

        nv = self.nv
        return GpuSnapshot(int(time.time() * 1e6), nv.reasons(g), nv.sm_clock(g), nv.temperature(g), nv.processes(g))

    def snapshot(self, gpu_mask: int):
        gpus = [g for g in range(gpu_mask.bit_length()) if gpu_mask >> g & 1 and g < self.nv.count]
        if not gpus:
            return None
        self.nv.xid_events()         # what happened before the region is not the region's
        snaps = {g: self._gpu(g) for g in gpus}
        known = self.known_pids()
        looks: dict = {}             # judged now too: one that exits before the region ends ran in it
        for snap in snaps.values():
            snap.looks = {p: self.look_once(p, looks) for p in set(snap.pids) - known}
        return snaps

    def sample(self, region) -> None:
        """While the region is held: a process listed on one of its GPUs that is no client and was not listed
        at the grant is judged now, while it runs (one that exits before the region's end ran in it unseen)."""
        start = region.attest_start
        if not start:
            return
        known = None
        for g, s in start.items():
            for p in self.nv.processes(g):
                if p in s.looks or p in s.seen:
                    continue
                known = self.known_pids() if known is None else known
                if p not in known:
                    s.seen[p] = self.look(p)

    def look_once(self, pid: int, looks: dict) -> tuple:
        """look(pid), read once per snapshot or judgement however many of its GPUs list the pid."""
        if pid not in looks:
            looks[pid] = self.look(pid)
        return looks[pid]

    def taints_so_far(self, region) -> Result:
        return self._judge(region, consume_xid=False)

    def finish(self, region, ended_ns: int) -> Result:
        return self._judge(region, consume_xid=True)

    def _judge(self, region, consume_xid: bool) -> Result:
        from .. import nvml

        start = region.attest_start
        if not start:
            return Result(region.taints)
        taints = region.taints
        xids = self.nv.xid_events() if consume_xid else []
        known = self.known_pids()
        busy = getattr(region, "others_busy_us", 0) >= float(getattr(self.cfg, "busy_before_us", 1000.0))
        settles = getattr(region, "clock_settle", [])
        settled = bool(settles) and all(s["status"] in ("at_once", "waited") for s in settles)
        lo, hi, gpus = None, None, {}
        capped = nvml.REASON_SW_POWER_CAP
        thermal = nvml.REASON_SW_THERMAL | nvml.REASON_HW_THERMAL
        own = {getattr(j, "id", None) for j in getattr(region, "own", ())} | \
            {getattr(getattr(region, "job", None), "id", None)}      # the region's jobs' ids
        looks_now: dict = {}
        for g, s in start.items():
            e = self._gpu(g)
            reasons = s.reasons | e.reasons
            clocks = [mhz for t, mhz in self.nv.sm_clock_samples(g, s.wall_us) if t <= e.wall_us]
            clocks += [c for c in (s.clock, e.clock) if c]
            capped_by_others = bool(s.reasons & capped and busy)
            if capped_by_others and not settled:
                taints |= C.KREX_TAINT_POWER_CAP
            if reasons & thermal:
                taints |= C.KREX_TAINT_THERMAL
            if reasons & (nvml.REASON_HW_SLOWDOWN | nvml.REASON_HW_POWER_BRAKE):
                taints |= C.KREX_TAINT_HW_SLOWDOWN
            pct = float(self.cfg.clock_drop_pct)
            if pct > 0 and clocks and min(clocks) < max(clocks) * (1 - pct / 100) and not reasons & (capped | thermal):
                taints |= C.KREX_TAINT_CLOCK_DROP
            foreign, leaving = [], []
            for p in sorted((set(s.pids) | set(s.seen) | set(e.pids)) - known):
                looks = [x for x in (s.looks.get(p), s.seen.get(p), self.look_once(p, looks_now))   # grant, held, now
                         if x is not None]
                if ("managed", False) in looks:
                    foreign.append(p)
                elif any(x[0] == "departed" and x[1] == "exiting" and not x[2] & own for x in looks):
                    leaving.append(p)    # another job's context torn down in the region's time
            if foreign:
                taints |= C.KREX_TAINT_FOREIGN_PROCESS
            if leaving:
                taints |= C.KREX_TAINT_LIFECYCLE
            gxid = [x for gi, x in xids if gi == g]
            if gxid:
                taints |= C.KREX_TAINT_XID
            if clocks:
                lo = min(clocks) if lo is None else min(lo, min(clocks))
                hi = max(clocks) if hi is None else max(hi, max(clocks))
            gpus[str(g)] = {
                "clock_event_reasons": [hex(s.reasons), hex(e.reasons)],
                "sm_clock_mhz": [min(clocks), max(clocks)] if clocks else None, "sm_clock_samples": len(clocks),
                "sm_clock_at_grant_mhz": s.clock, "temperature_c": [s.temperature, e.temperature],
                "others_busy_us": getattr(region, "others_busy_us", 0), "foreign_pids": foreign,
                "leaving_pids": leaving, "xid": gxid,
            }
            if capped_by_others:
                gpus[str(g)]["power_cap_at_grant"] = "cleared by the clock settle" if settled else "taint"
        return Result(taints, lo or 0, hi or 0, True, {"source": self.source, "gpus": gpus})


FAKE_UUID_PREFIX = b"krex"   # tests/fakes/engine.c: GPU-6b726578-... ("krex" in hex) for every fake GPU


def fake_gpus(nv) -> bool:
    """Whether this NVML's GPUs are all krex's fakes (their UUIDs begin with the bytes of "krex")."""
    try:
        uuids = [nv.uuid(i) for i in range(nv.count)]
    except Exception:
        return False
    return bool(uuids) and all(u is not None and u[:4] == FAKE_UUID_PREFIX for u in uuids)


def make(cfg, known_pids, departed=dict):
    """The attestor the controller uses: NVML's where it can be had and cfg.attest is on, else krex's own.
    known_pids(): the clients' pids; departed(): pid -> (start time, the ids of the jobs it worked for) of
    clients that disconnected lately."""
    if not cfg.attest:
        return Attestor()
    from .. import nvml

    nv = nvml.open_nvml()
    return NvmlAttestor(nv, cfg, known_pids, departed) if nv is not None else Attestor()
