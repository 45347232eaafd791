"""What `krex run` tells its user on stderr, one line each, prefixed `krex:` (silenced by --quiet /
KREX_QUIET=1; warnings that a timing was not protected are said even then, in one line):

  while waiting    "krex: waiting 3.1 s for GPU 0: held by pid 812 (alice, region 'bench', python b.py); 2nd of 3"
                   after 1 s of waiting for a region or at a closed gate, then at most every 10 s
  after a pause    "krex: this command's pid 901 was paused (frozen) at least 3.0 s on GPU 0 by pid 812 (alice, region
                   'bench', python b.py); resumed; 3.0 s frozen in all", one line per pause: a process frozen by one
                   region after another without being resumed between two polls is one pause ("by 12 regions: pid
                   812 (...) x10, pid 813 (...) x2"); a pause still going on is told after 10 s, then every 10 s
                   ("krex: this command's pid 901 has been paused (frozen) 10.4 s so far on GPU 0, by pid 813 (...)")
  at exit          with KREX_HOST_BOUND=1, one line per region name with host-bound regions ("krex: region 'mm' (2 of 5
                   regions): in 20 of 50 timings the GPU waited for the host ..."), then
                   "krex: 3 regions (3 exclusive, 3 clean), waited 0.41 s, frozen 0.00 s, 15 launches (3 outside
                   regions), 2.10 s wall" (for a command that used a GPU; "outside regions": launches a process made
                   while it had no region open, for information: set-up, warm-ups and checks belong there)
                   then "krex: timings not protected: ..." when the command made GPU launches and no region was
                   granted, a region was not exclusive, or hooks were asked for and every GPU launch was outside
                   every region (the hooked timing functions ran no GPU work, or never ran)

--strict (KREX_STRICT=1) turns "timings not protected" into exit status STRICT_EXIT for a command that
succeeded (docs/reference/cli.md, strict mode, says the rule). The Watcher asks the controller over its own
connection (role cli, ops.JOB_WAIT), so it never takes a reply meant for the wrapper's job connection."""

import os
import pwd
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

STRICT_EXIT = 5           # docs/reference/exit-codes.md
FIRST_WAIT_S = 1.0
REPEAT_WAIT_S = 10.0
POLL_S = 0.5
TRUE_WORDS = ("1", "true", "yes", "on")


def flag(env, name: str) -> bool:
    return (env.get(name) or "").strip().lower() in TRUE_WORDS


def user_name(uid) -> str:
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, TypeError, ValueError):
        return f"uid {uid}"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Feedback:
    def __init__(self, quiet: bool = False, out=None):
        self.quiet = quiet
        self.out = out or sys.stderr
        self.lock = threading.Lock()

    def say(self, text: str, always: bool = False) -> None:
        if self.quiet and not always:
            return
        with self.lock:
            print(f"krex: {text}", file=self.out, flush=True)


def describe_holder(h: Optional[dict]) -> str:
    if not h:
        return "a region being handed over"
    what = f"pid {h['pid']} ({user_name(h.get('uid'))}, region '{h.get('region', '')}'"
    if h.get("command"):
        cmd = h["command"]
        what += f", {cmd[:60]}..." if len(cmd) > 60 else f", {cmd}"
    return what + ")"


def wait_line(w: dict) -> str:
    held = f"held by {describe_holder(w.get('holder'))}"
    if w.get("kind") == "region" and not w.get("holder") and w.get("waits_for"):
        other = w["waits_for"]        # this GPU is free, kept for this region until its other GPU is
        held = f"free, kept for it while it waits for GPU {other['gpu']}, held by {describe_holder(other.get('holder'))}"
    elif w.get("kind") == "region" and not w.get("holder") and w.get("fair_share"):
        held = "free"
    if w.get("kind") == "region":
        where = f"{ordinal(w['place'])} of {w['queued']} in the queue" + (
            ", waiting for its job's fair share of the GPU" if w.get("fair_share") else "")
        return f"waiting {w['since_s']:.1f} s for GPU {w['gpu']} (region '{w['name']}'): {held}; {where}"
    queued = f"; {w['queued']} region(s) queued" if w.get("queued") else ""
    return f"waiting {w['since_s']:.1f} s at GPU {w['gpu']}'s closed gate: {held}{queued}"


def freeze_key(f: dict) -> tuple:
    """One freeze: a process and the region that froze it (its id; from a controller that sends none, the
    holder's pid and region name)."""
    by = f.get("by") or {}
    region = f["region_id"] if "region_id" in f else (by.get("pid"), by.get("region"))
    return f["pid"], region


class Pause:
    """One process frozen without a break the watcher saw: by one region, or by several one after another (back-
    to-back regions, resumed and frozen again between two polls)."""

    def __init__(self, start_ns: int, said: float):
        self.start_ns = start_ns      # the process's frozen total (ns) when this pause began
        self.said = said              # monotonic time it was last told (or began: the first line comes 10 s in)
        self.regions: dict = {}       # freeze key -> its last entry, in the order the regions came
        self.gpus: list = []

    def add(self, key: tuple, f: dict) -> None:
        self.regions[key] = f
        self.gpus += [g for g in f.get("gpu", []) if g not in self.gpus]

    def held_s(self, total_ns: int) -> float:
        """How long the process was frozen in this pause: from the controller's count where it has one (a
        controller that lost the process's count gives less), never less than the longest region's own."""
        longest = max((float(f.get("since_s", 0.0)) for f in self.regions.values()), default=0.0)
        return max(longest, (total_ns - self.start_ns) / 1e9)

    def holders(self) -> str:
        """Who froze it: one holder, or 'N regions: <holder> xK, ...' in the order they came."""
        if len(self.regions) == 1:
            return describe_holder(next(iter(self.regions.values())).get("by"))
        counts: dict = {}
        for f in self.regions.values():
            who = describe_holder(f.get("by"))
            counts[who] = counts.get(who, 0) + 1
        return f"{len(self.regions)} regions: " + ", ".join(f"{who} x{n}" for who, n in counts.items())

    def where(self) -> str:
        return ",".join(str(g) for g in sorted(self.gpus))

    def over_line(self, pid: int, total_ns: int) -> str:
        return (f"this command's pid {pid} was paused (frozen) at least {self.held_s(total_ns):.1f} s on GPU "
                f"{self.where()} by {self.holders()}; resumed; {max(self.held_s(total_ns), total_ns / 1e9):.1f} s "
                f"frozen in all")

    def ongoing_line(self, pid: int, total_ns: int) -> str:
        now_by = describe_holder(list(self.regions.values())[-1].get("by"))
        more = f" (its {ordinal(len(self.regions))} region in a row)" if len(self.regions) > 1 else ""
        return (f"this command's pid {pid} has been paused (frozen) {self.held_s(total_ns):.1f} s so far on GPU "
                f"{self.where()}, by {now_by}{more}")


class Watcher(threading.Thread):
    """Polls the controller about this job while the command runs; says what it waits for and when it was
    paused. Never fails the run: a controller it cannot ask is a controller it stops asking."""

    def __init__(self, socket_path: str, job: int, fb: Feedback, counters: Optional[str] = None,
                 source: Optional[Callable[[], tuple]] = None):
        """source: the wrapper's job connection as (how many times it was lost, its job id now, or None while it
        is lost); without it, job throughout. A controller that took a lost one's place numbers its jobs anew and
        counts frozen time from nothing."""
        super().__init__(daemon=True, name="krex-watcher")
        self.socket_path, self.job, self.fb, self.counters = socket_path, job, fb, counters
        self.source = source
        self.done = threading.Event()
        self.conn = None
        self.said: dict = {}         # wait key -> monotonic time last said
        self.pauses: dict = {}       # pid -> its Pause going on (frozen by one region or several in a row)
        self.frozen_ns: dict = {}    # pid -> ns frozen, as the controller asked last counts it
        self.banked: dict = {}       # pid -> ns frozen counted by the controllers before it (the job connections lost)
        self.losses = 0              # the job connection's losses banked
        self.lock = threading.Lock()

    def ask(self) -> Optional[dict]:
        """The controller's JOB_WAIT reply for this job; an empty one while the wrapper has lost its controller
        (the guardian resumed the job's processes: no freeze goes on, none is counted); None when it could not ask."""
        from .wire.client import ControllerError
        from .errors import KrexCommandError

        job = self.job
        if self.source is not None:
            losses, job = self.source()
            if losses != self.losses or job is None:
                self.bank()
                self.losses = losses
            if job is None:
                return {"waits": [], "frozen": [], "frozen_ns": {}}
        with self.lock:
            try:
                return self.request(job)
            except (ControllerError, KrexCommandError, OSError):
                self.close_conn()
                return None

    def request(self, job: int) -> dict:
        from .wire import ops
        from .wire.client import Connection
        from .wire.frames import C

        if self.conn is None:
            self.conn = Connection(self.socket_path, C.KREX_ROLE_CLI, timeout=5.0, io_timeout=5.0)
        return self.conn.request(ops.JOB_WAIT, timeout=5.0, job=job)

    def bank(self) -> None:
        """The job's controller was lost: what it counted stays this command's; a new one counts from nothing."""
        for pid, ns in self.frozen_ns.items():
            self.banked[pid] = self.banked.get(pid, 0) + ns
        self.frozen_ns = {}

    def totals(self) -> dict:
        """pid -> ns frozen over every controller this command met."""
        return {pid: self.banked.get(pid, 0) + self.frozen_ns.get(pid, 0) for pid in {*self.banked, *self.frozen_ns}}

    def close_conn(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None

    def run(self) -> None:
        failures = 0
        while not self.done.wait(POLL_S):
            reply = self.ask()
            if reply is None:
                failures += 1
                if failures > 5:
                    return
                continue
            failures = 0
            self.take(reply)

    def take(self, reply: dict) -> None:
        now = time.monotonic()
        keys = set()
        for w in reply.get("waits", []) + self.counted_gate_waits(reply):
            key = (w.get("kind"), w.get("gpu"), w.get("name"))
            keys.add(key)
            if w.get("since_s", 0) < FIRST_WAIT_S:
                continue
            last = self.said.get(key)
            if last is None or now - last >= REPEAT_WAIT_S:
                self.said[key] = now
                self.fb.say(wait_line(w))
        for key in list(self.said):
            if key not in keys:
                del self.said[key]
        seen = {freeze_key(f): f for f in reply.get("frozen", [])}
        self.frozen_ns = {int(k): int(v) for k, v in reply.get("frozen_ns", {}).items()}
        self.follow_pauses(seen, now)

    def follow_pauses(self, listed: dict, now: float) -> None:
        """Adds the freezes listed now to their process's pause, says each pause that is over (its process is
        listed frozen by no region) and each that has gone on for REPEAT_WAIT_S since it was last said."""
        totals = self.totals()
        for key, f in listed.items():
            pid = key[0]
            p = self.pauses.get(pid)
            if p is None:
                since = float(f.get("since_s", 0.0))
                p = self.pauses[pid] = Pause(start_ns=totals.get(pid, 0) - int(since * 1e9),
                                             said=now - since)
            p.add(key, f)
        for pid in [pid for pid in self.pauses if pid not in {k[0] for k in listed}]:
            self.fb.say(self.pauses.pop(pid).over_line(pid, totals.get(pid, 0)))
        for pid, p in self.pauses.items():
            if now - p.said >= REPEAT_WAIT_S:
                p.said = now
                self.fb.say(p.ongoing_line(pid, totals.get(pid, 0)))

    def counted_gate_waits(self, reply: dict) -> list:
        """The gate waits the controller did not list, from the job's counters: a process blocked at a closed
        gate before the controller knows its GPUs (its first context's creation), one wait per GPU."""
        if not self.counters:
            return []
        from .wire import counters as counters_file
        try:
            blocked = counters_file.gate_waits(Path(self.counters))
        except (OSError, ValueError):
            return []
        listed = {w.get("gpu") for w in reply.get("waits", [])}
        held = reply.get("held", {})
        out, now_ns = {}, time.monotonic_ns()
        for b in blocked:
            for g in b["gpus"]:
                if g in listed or str(g) not in held:
                    continue
                since = (now_ns - b["since_ns"]) / 1e9
                if g not in out or since > out[g]["since_s"]:
                    out[g] = {"gpu": g, "kind": "gate", "since_s": since, "holder": held[str(g)], "queued": 0}
        return list(out.values())

    def stop(self) -> dict:
        """Stop watching; the frozen time of each of the job's processes (pid -> ns), asked one last time."""
        self.done.set()
        self.join(timeout=10)
        reply = self.ask()
        if reply is not None:
            self.frozen_ns = {int(k): int(v) for k, v in reply.get("frozen_ns", {}).items()}
            self.follow_pauses({freeze_key(f): f for f in reply.get("frozen", [])}, float("-inf"))
        self.close_conn()
        return self.totals()


# ---- at exit -----------------------------------------------------------------------------------------------
def unused(r: dict) -> bool:
    """A region cancelled before its grant (krex.RegionTimeout raised, Ctrl-C in the wait): nothing was timed in
    it, so it is neither a protected nor an unprotected timing."""
    return r.get("end") == "cancelled" and not r.get("granted_ns")


def refused(r: dict) -> bool:
    """A hooked timing's region that strict mode refused to time without a grant: nothing was timed, but a
    timing was wanted and krex could not protect it (the caller's StrictError may have been caught)."""
    return r.get("end") == "refused" and not r.get("granted_ns")


def summary(rep: dict) -> str:
    every = rep.get("regions", [])
    regions = [r for r in every if not unused(r) and not refused(r)]
    n_refused = sum(refused(r) for r in every)
    cancelled = len(every) - len(regions) - n_refused
    n = len(regions)
    ex = sum(bool(r.get("exclusive")) for r in regions)
    clean = sum(bool(r.get("clean")) for r in regions)
    taints: dict = {}
    for r in regions:
        for t in r.get("taints", []):
            taints[t] = taints.get(t, 0) + 1
    bound = sum(bool(r.get("host_bound")) for r in regions)   # KREX_HOST_BOUND: the GPU waited for the host
    # still open when their process exited (no krex_region_end: a crash, os._exit, a forgotten end): what they
    # timed may be cut short, though the GPU was theirs alone until then
    open_at_exit = sum(r.get("end") == "owner_gone" and bool(r.get("granted_ns")) for r in regions)
    parts = [f"{n} region{'s' if n != 1 else ''} ({ex} exclusive, {clean} clean"
             + (f", {bound} host-bound" if bound else "")
             + (f", {open_at_exit} still open when its process exited" if open_at_exit else "")
             + (", tainted: " + ", ".join(f"{t} x{c}" for t, c in sorted(taints.items())) if taints else "") + ")"
             + (f" and {cancelled} cancelled before a grant (nothing timed)" if cancelled else "")
             + (f", {n_refused} refused by strict mode (not granted, nothing timed)" if n_refused else "")]
    if rep.get("regions_unrecorded_by_processes"):
        parts[0] += f", {rep['regions_unrecorded_by_processes']} more whose process record was lost"
    parts.append(f"waited {rep.get('waited_ns', 0) / 1e9:.2f} s")
    parts.append(f"frozen {rep.get('frozen_ns', 0) / 1e9:.2f} s")
    if rep.get("counters_unavailable"):
        parts.append("launches not counted")
    elif rep.get("launches"):
        n_l = rep["launches"]
        parts.append(f"{n_l} launch{'es' if n_l != 1 else ''} ({rep.get('launches_outside_regions', 0)} outside regions)")
    else:
        parts.append("0 launches")
    if rep.get("wall_ns") is not None:
        parts.append(f"{rep['wall_ns'] / 1e9:.2f} s wall")
    return ", ".join(parts)


def unprotected(rep: dict, controller: bool, hooks: Optional[str] = None, why_none: str = "") -> list[str]:
    """Why this run's timings were not protected (empty when they were, or when nothing was timed on a GPU).

    Launches outside regions fail a run only where hooks were asked for and no GPU launch at all was inside a
    region: a hooked timing function that runs its kernels opens a region around them, and the set-up,
    correctness checks and first calls it leaves outside are legitimate. Every launch outside means the hooks
    never fired around GPU work (the benchmark timed with something else). With explicit regions only, what
    they cover is the user's choice: not judged."""
    regions = rep.get("regions", [])
    launches = rep.get("launches", 0)
    outside = rep.get("launches_outside_regions", 0)
    out = []
    if not controller and (regions or launches):     # why_none: what the wrapper was told at its start
        out.append(f"no controller ({why_none})" if why_none else "no controller")
    granted = [r for r in regions if r.get("granted_ns")]
    if launches and not granted:
        hint = ""
        if not regions:
            hint = (f" (the hooks {hooks} marked none: is the timing function one of theirs, in a Python that has "
                    f"cffi?)" if hooks else " (mark one: krex.region(), --hooks, docs/guide/marking-regions.md)")
        out.append(f"{launches} GPU launch{'es' if launches != 1 else ''} but no region was granted{hint}")
    elif hooks and launches and outside >= launches:
        what = f"all {launches} GPU launches were" if launches != 1 else "the one GPU launch was"
        out.append(f"hooks {hooks} were asked for, but {what} outside every region (no hooked timing function ran "
                   f"GPU work: is the timing function one of theirs?)")
    bad = [r for r in regions if r.get("granted_ns") and not r.get("exclusive")]
    if bad:
        names = sorted({r.get("name", "") for r in bad})
        taints = sorted({t for r in bad for t in r.get("taints", [])})
        why = ""
        if "shared_gpu" in taints:   # the one a harness fixes itself (docs/guide/marking-regions.md: processes)
            why = (" - shared_gpu: another process of this command had GPU work on the region's GPU while it was "
                   "held: keep the command's other processes off it while one times, and end the region, or call "
                   "torch.cuda.synchronize(), before starting a child that checks")
        out.append(f"{len(bad)} region(s) not exclusive ({', '.join(names)[:80]}: {', '.join(taints)}){why}")
    # regions that ran with no grant beside granted ones (a timeout with on_timeout="unprotected", a hook's
    # fallback, a refusal): each ended normally, having timed something nobody protected. One cancelled before
    # anything ran in it (RegionTimeout, a hook's strict refusal) or whose process died waiting is no timing.
    ungranted = [r for r in regions if not r.get("granted_ns") and r.get("end", "normal") == "normal"]
    if granted and ungranted:
        names = sorted({r.get("name", "") for r in ungranted})
        out.append(f"{len(ungranted)} region(s) ran without a grant ({', '.join(names)[:80]}: not_granted)")
    strict_refused = [r for r in regions if refused(r)]
    if strict_refused:
        names = sorted({r.get("name", "") for r in strict_refused})
        out.append(f"{len(strict_refused)} timing(s) refused by strict mode, not granted ({', '.join(names)[:80]})")
    bare = rep.get("processes_without_shim", [])
    if bare:          # on a GPU (NVML), or asking for regions with the shim not preloaded: nothing of theirs was
        first = bare[0]   # gated or counted
        gpus = ",".join(str(g) for g in first.get("gpus", []))
        who = f"pid {first['pid']} ({' '.join(first.get('command', []))[:60]})" + (f" on GPU {gpus}" if gpus else "")
        more = f" and {len(bare) - 1} more" if len(bare) > 1 else ""
        did = "ran GPU work" if any(u.get("gpus") for u in bare) else "asked for regions"   # NVML never listed them
        out.append(f"{len(bare)} process(es) of the command {did} without krex's shim ({who}{more}; "
                   "LD_PRELOAD dropped from their environment?): their launches were neither gated nor counted")
    lost = rep.get("regions_unrecorded_by_processes", 0)
    if lost:          # what a process saw of these (a timeout, a refusal, the controller's loss) is unknown
        from .wire.frames import C

        out.append(f"{lost} region record(s) of its processes lost (over {C.KREX_LOCAL_REGIONS} regions in one "
                   "job): whether those timings were protected is unknown")
    return out


def host_bound_lines(regions: list) -> list:
    """KREX_HOST_BOUND: one line per region name with host-bound regions (the GPU waited for the host in at least
    half of 8 or more timings), whatever marked them (krex.region, C, a hook)."""
    by_name: dict = {}
    for r in regions:
        if r.get("host_bound"):
            n = by_name.setdefault(r.get("name", ""), {"regions": 0, "checked": 0, "late": 0})
            n["regions"] += 1
            n["checked"] += r.get("timings_checked", 0)
            n["late"] += r.get("timings_late", 0)
    out = []
    for name, n in by_name.items():
        every = sum(1 for r in regions if r.get("name", "") == name and r.get("timings_checked"))
        which = f" ({n['regions']} of {every} regions)" if every > 1 else ""
        out.append(f"region {name!r}{which}: in {n['late']} of {n['checked']} timings the GPU waited for the host "
                   "(a launch or the end record); they include host time (host-bound)")
    return out


def at_exit(fb: Feedback, rep: dict, controller: bool, strict: bool, exit_code: int,
            hooks: Optional[str] = None, why_none: str = "") -> int:
    """Say the summary (for a command that used a GPU: contexts, launches, regions or waits) and any warning;
    the exit status the run ends with."""
    for line in host_bound_lines(rep.get("regions", [])):
        fb.say(line)
    if rep.get("regions") or rep.get("launches") or rep.get("context_creations") or rep.get("waited_ns") \
            or rep.get("frozen_ns"):
        fb.say(summary(rep))
    why = unprotected(rep, controller, hooks, why_none)
    if why:
        fb.say("timings not protected: " + "; ".join(why), always=True)
        if strict and exit_code == 0:
            fb.say(f"--strict: exit status {STRICT_EXIT} (the command itself succeeded)", always=True)
            return STRICT_EXIT
    return exit_code


def host() -> str:
    return os.uname().nodename
