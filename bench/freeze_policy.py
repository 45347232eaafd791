"""Which freeze policy: all (SIGSTOP every sibling during a region), none (`--no-freeze`: the gate and the drain
only) or busy (`--freeze-policy busy`: only the siblings with GPU work in flight at the drain), at several
agent counts, against naive sharing, with the noise floor of two isolated passes measured in the same run.

The workload is bench/throughput.py's: agents running compile-heavy Triton candidate commands
(bench/candidate.py), here with a mix balanced over the four kernel-length buckets (2048: < 0.1 ms, 4096:
0.1-1 ms, 8192: 1-10 ms, 16384: > 10 ms on an H200) and --repeat R timings per kernel per command, so that
each bucket gets enough kernels. Plan, per scale N: naive:N (unless --skip-naive), then one mode per policy of
--policies (all: krex:N, none: krexnofreeze:N, busy: krexbusy:N, all+warm: krexwarm:N, busy+warm:
krexwarmbusy:N, busy+prewait: krexprewait:N, busy+warm+prewait: krexwarmprewait:N; the +warm ones run each command in a warm worker of the controller, its pool filled before the
mode's clock starts), --rounds R times (every other round in the reverse order); one
reference pass first and one last (--reference solo, the default: each command alone under a krex controller
of its own, krexsolo; --reference isolated: alone without krex). A solo reference times each kernel as every
region does (after the clock settle, on the owner's own CPUs), with nobody else there. In H200 run 2 the
plain isolated 0.1-1 ms kernels were 3-5% slower (medians) than the same kernels timed in krex regions with
7 agents around, though nvidia-smi's SM clock (sampled every 500 ms) was higher in the isolated passes: the
cause is not known, and a reference that is off by itself makes every |inflation| larger; in run 3 the timings
above 1 ms under krex were faster than the solo reference. --reference solo-busy takes the reference beside a
GPU neighbour (bench/contender.py under krex run, frozen in every region), so that the GPU is as busy between
the commands as under load; --reference solo,solo-busy runs both (the first judges, the second is shown) and
each row gets the median signed inflation per bucket (median_signed_pct: negative, faster). Analysis:
  - a kernel (size, variant, candidate or reference) is stable when its two isolated passes agree within
    --stable-pct (default 2%, the bimodality check across processes); unstable kernels are left out of every
    inflation figure and listed;
  - the floor of a bucket: the p95 of |timing / the other pass's median - 1| over every timing of its stable
    kernels in the two passes (the judged statistic, where nothing else ran; see throughput.reference_passes);
    the older floor over pass medians and the spread of one process's repeats are shown beside it;
  - per mode: throughput against naive at the same N, and per bucket the p95 |inflation| of the timings
    whose regions were all exclusive and clean, against the isolated median, and how many there are
    (goal: >= 50 per bucket); goal met when p95 <= floor + 0.25 points in every bucket.
    python bench/freeze_policy.py --scales 4,8,16 --budget 30 --out freeze-policy.json [--md freeze-policy.md]
The result names a best policy only where every scale met the fidelity goal; the default is not changed by
this script."""

import argparse
import calendar
import json
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import throughput as T  # noqa: E402

POLICIES = {"krex": "all", "krexnofreeze": "none", "krexbusy": "busy",
            # the same policies with the controller's warm workers (krex controller --warm-workers N): each command
            # in a process forked from one that imported torch and triton and holds its context
            "krexwarm": "all+warm", "krexwarmbusy": "busy+warm",
            # busy with --lifecycle-prewait-ms (throughput.PREWAIT_MS): other jobs' lifecycle work waited for with the
            # gates still open
            "krexprewait": "busy+prewait",
            # warm workers with the controller's defaults (busy, the prewait): the pool's spares make their contexts
            # while regions wait for them (run 40), which the prewait waits for with the gates open
            "krexwarmprewait": "busy+warm+prewait"}
COLD = ("all", "none", "busy")   # the default --policies
REFERENCES = {"solo": "krexsolo", "isolated": "isolated", "solo-busy": "krexsolobusy", "none": None}
TAIL_S = 20.0   # after its budget a shared mode still finishes the commands it started (about one command's time)


HELD_SHARED = 1.5   # a region holds the GPU longer among others (drain, settle) than alone: run 29, 4.5 s / 3.1 s


def expected_tail(reference_runs: list, agents: int) -> float:
    """Seconds a shared mode of `agents` runs past its budget: the commands in flight then finish, each taking
    about one command's wall time at that scale. Alone, a command takes the reference's mean wall time; where the
    GPU is the limit (the regions serialize), about agents x the time its regions hold the GPU there, which is
    HELD_SHARED x what they held in the reference (run 29: 3.1 s a command alone, 4.5 s at 16 agents, where a
    command took 72 s and the mode ran 77 s past its budget). At least TAIL_S."""
    rows = [row for r in reference_runs for row in r.get("rows", []) if row.get("exit") == 0]
    if not rows:
        return TAIL_S
    wall = sum(float(row.get("wall_s") or 0.0) for row in rows) / len(rows)
    held = sum(float(row.get("region_held_s") or 0.0) for row in rows) / len(rows)
    return max(TAIL_S, wall, agents * held * HELD_SHARED)
BALANCED = [(2048, 0.25), (4096, 0.25), (8192, 0.25), (16384, 0.25)]




def analyse(runs, stable_pct: float, reference: str = "isolated", leave_out=()) -> dict:
    ref = T.reference_passes([r["rows"] for r in runs if r["mode"] == reference], stable_pct, leave_out)
    floors = ref["floors_pct"]
    naive = {r["agents"]: r["commands_per_min"] for r in runs if r["mode"] == "naive"}
    naive_in = {(r["agents"], r.get("round", 0)): r["commands_per_min"] for r in runs if r["mode"] == "naive"}
    alone = T.command_levels([row for r in runs if r["mode"] == reference for row in r["rows"]], ref["stable"])
    rows = []
    for r in runs:
        if r["mode"] not in POLICIES and r["mode"] != "naive":
            continue
        clean = None if r["mode"] == "naive" else (lambda row: bool(row.get("regions_clean")) and all(row["regions_clean"]))
        fid = T.judge(r["rows"], ref, clean)
        fid["median_signed_pct"] = T.signed_medians(r["rows"], ref["stable"], clean)
        fid["per_kernel"] = T.per_kernel(r["rows"], ref["stable"], clean)
        shared = T.command_levels(r["rows"], ref["stable"], clean)
        levels = {f"{k[0]}/{k[1]}/{k[2]}": w for k in sorted(shared, key=str)
                  if (w := T.wider_levels(shared[k], alone.get(k, [])))}
        if levels:   # per kernel: its commands' levels against the reference processes' (T.wider_levels),
            for name, p in T.holm({k: w["p_wider"] for k, w in levels.items()}).items():
                levels[name]["p_wider_holm"] = p   # adjusted over the mode's kernels: one flag in eight by chance
            fid["levels"] = levels
        flagged = sum(k["host_bound"] for k in fid["per_kernel"].values())   # of the stable kernels, as judged
        checked = any(f"{k}_host_bound" in row for row in r["rows"] for k in ("candidate", "reference"))
        if checked:   # --host-bound-check: the same judgement without the timings whose region was host-bound
            fid["host_bound_timings"] = flagged
            fid["without_host_bound"] = {k: v for k, v in T.judge(r["rows"], ref, clean, skip_host_bound=True).items()
                                         if k in ("p95_abs_inflation_pct", "kernels", "fidelity_goal", "enough_kernels",
                                                  "excess_ci_points")}
        # its own round's naive only: a round whose naive never ran (a plan cut short) has no ratio
        against = naive_in.get((r["agents"], r["round"])) if "round" in r else naive.get(r["agents"])
        rows.append({"mode": r["mode"], "policy": POLICIES.get(r["mode"], "naive"), "agents": r["agents"],
                     **({"round": r["round"]} if "round" in r else {}),
                     "commands": r["commands"], "failed": r["failed"],
                     "commands_per_min": round(r["commands_per_min"], 2),
                     "vs_naive": round(r["commands_per_min"] / against, 4) if against else None,
                     **fid, "metrics": r.get("metrics")})
    best, pooled = None, pool_rounds(runs)
    for policy in POLICIES.values():
        mine = [x for x in rows if x["policy"] == policy]
        if mine and all(x["fidelity_goal"] and x["enough_kernels"] for x in mine):
            over = {x["agents"]: x["vs_naive"] for x in pooled if x["policy"] == policy}   # --rounds: pooled
            score = min((over[x["agents"]] if x["agents"] in over else x["vs_naive"]) or 0 for x in mine)
            if best is None or score > best[1]:
                best = (policy, score)
    by_mode: dict = {}      # a mode run twice (the reference's two passes): one summary of both
    for r in runs:
        by_mode.setdefault(f"{r['mode']}:{r['agents']}", []).extend(r["rows"])
    clocks = {k: c for k, rows_ in by_mode.items() if (c := T.region_clocks(rows_))}
    cpu = {f"{r['mode']}:{r['agents']}" + (f"#{r['round'] + 1}" if "round" in r else ""):
           {k: r[k] for k in ("node_cpu_busy_pct", "controller_cpu_s", "wall_s") if k in r}
           for r in runs if "node_cpu_busy_pct" in r and r["mode"] not in T.REFERENCE_MODES}
    phases = {k: p for k, rows_ in by_mode.items() if (p := command_phases(rows_))}
    return {"reference": reference, "floors_pct": floors, "floor_timings": ref["floor_timings"],
            **({"pooled": pooled} if pooled else {}),
            "region_clock_mhz": clocks, **({"command_phases_s": phases} if phases else {}),
            **({"cpu_use": cpu} if cpu else {}),
            "floors_medians_pct": ref["floors_medians_pct"], "floor_kernels": ref["floor_kernels"],
            "repeat_spread_pct": ref["repeat_spread_pct"], "unstable": ref["unstable"],
            **({"left_out": ref["left_out"]} if leave_out else {}),
            "rows": rows, "best_policy": best[0] if best else None,
            "best_reason": (f"every scale met the fidelity goal with >= 50 kernels per bucket; lowest throughput "
                            f"against naive {best[1]}") if best else
                           "no reference passes (--reference none): throughput only, no timing judged" if reference is None
                           else "no policy met the goal at every scale"}


def pool_rounds(runs) -> list:
    """--rounds: each shared mode's runs at one scale taken together (commands over wall time summed), against
    naive sharing's taken together, with each round's own ratio; empty for a plan of one round. The rounds run the
    modes in alternate orders (ABBA), so that a drift of the node over the plan (the builds took 43 s at its start
    and up to 51 s later in run 53) weighs on every mode alike."""
    by: dict = {}
    for r in runs:
        if "round" in r and r["mode"] not in T.REFERENCE_MODES:
            by.setdefault((r["mode"], r["agents"]), []).append(r)
    if not any(len(v) > 1 for v in by.values()):
        return []
    def per_min(rs) -> float:
        wall = sum(r["wall_s"] for r in rs)
        return 60.0 * sum(r["commands"] for r in rs) / wall if wall > 0 else 0.0
    out = []
    for (mode, agents), rs in by.items():
        own = {r["round"]: r["commands_per_min"] for r in by.get(("naive", agents), ())}
        both = [r for r in rs if r["round"] in own]          # the rounds that ran both: ABBA kept
        kept = {r["round"] for r in both}
        naive = [x for x in by.get(("naive", agents), ()) if x["round"] in kept]
        out.append({"mode": mode, "policy": POLICIES.get(mode, "naive"), "agents": agents, "rounds": len(rs),
                    "commands": sum(r["commands"] for r in rs), "failed": sum(r["failed"] for r in rs),
                    "wall_s": round(sum(r["wall_s"] for r in rs), 1), "commands_per_min": round(per_min(rs), 3),
                    "vs_naive": round(per_min(both) / per_min(naive), 4) if naive and per_min(naive) else None,
                    "vs_naive_rounds": [round(r["commands_per_min"] / own[r["round"]], 4)
                                        if own.get(r["round"]) else None for r in rs],
                    "budgets_s": [round(float(r["budget_s"]), 1) for r in rs if "budget_s" in r]})
    return out


PHASES = ("before", "import", "inside", "after", "region_wait", "gate_wait", "lifecycle_wait", "frozen")


def command_phases(rows: list) -> dict:
    """Where a command's wall time went, mean seconds over the finished commands that say it (results since
    bench/candidate.py printed its monotonic start and end): before its body (the wrapper, the interpreter, the
    shim's start), its import (torch, triton), the rest of its body (compile, check, timings; a reference
    command's holder), after it (its exit: contexts torn down, the exit gate; the wrapper's report); and within
    those, the waits for region grants, at closed gates (of which the lifecycle waits: its context's creation
    and its exit held at another job's gate, the exit's after the body), and the time frozen for others'
    regions."""
    ok = [r for r in rows if r.get("exit") == 0 and "before_s" in r]
    if not ok:
        return {}
    def mean(f) -> float:
        return round(statistics.fmean(f(r) for r in ok), 3)
    return {"commands": len(ok), "wall": mean(lambda r: r["wall_s"]), "before": mean(lambda r: r["before_s"]),
            "import": mean(lambda r: r.get("import_s", 0.0)),
            "inside": mean(lambda r: r["total_s"] - r.get("import_s", 0.0)), "after": mean(lambda r: r["after_s"]),
            "region_wait": mean(lambda r: r.get("region_wait_s", 0.0)),
            "gate_wait": mean(lambda r: r.get("gate_wait_s", 0.0)),
            "lifecycle_wait": mean(lambda r: r.get("lifecycle_wait_s", 0.0)),
            "frozen": mean(lambda r: r.get("frozen_s", 0.0))}


SW_POWER_CAP = 0x4   # NVML's clocks_event_reasons bit for the software power cap


def read_smi(path: str) -> list:
    """The device script's nvidia-smi log (--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,
    clocks_event_reasons.active --format=csv, run with TZ=UTC: nvidia-smi writes local time): (unix time, SM MHz
    or None, W or None, reasons) per sample; a line whose time or reasons do not parse (the header) is skipped."""
    def number(text: str, kind):
        try:
            return kind(text.split()[0])
        except (ValueError, IndexError):
            return None                  # "[N/A]"
    out = []
    for line in Path(path).read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            whole, _, frac = f[0].partition(".")
            t = calendar.timegm(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + (float("0." + frac) if frac else 0.0)
            out.append((t, number(f[1], int), number(f[2], float), int(f[4], 16)))
        except (ValueError, IndexError):
            continue
    return out


def power_by_mode(runs: list, samples: list) -> dict:
    """Per run of a mode (in the plan's order; a reference's two passes apart, #1 and #2), the samples taken
    while it ran: how many, how many at the software power cap, the lowest SM clock and the most power: whether
    the shared mode and its floor ran in the same power state."""
    out, seen = {}, {}
    for r in runs:
        if "started_unix" not in r or r.get("split_from_one_pass") == 2:   # the same pass as its first half
            continue
        key = f"{r['mode']}:{r['agents']}"
        seen[key] = seen.get(key, 0) + 1
        mine = [x for x in samples if r["started_unix"] <= x[0] <= r["ended_unix"]]
        out[f"{key}#{seen[key]}"] = {"samples": len(mine), "capped": sum(bool(x[3] & SW_POWER_CAP) for x in mine),
                                     "sm_mhz_min": min((x[1] for x in mine if x[1] is not None), default=None),
                                     "watts_max": max((x[2] for x in mine if x[2] is not None), default=None)}
    return out


def split_pass(runs: list, ref: dict) -> list:
    """runs with the one isolated pass ref made two, by process: each kernel's commands taken in turn (the
    first, third, ... to one, the others to the other); the second comes after every other run, where a
    finished plan's last pass stands. A floor so made compares processes of one pass, not passes apart in time.
    Each half says which it is (split_from_one_pass: 1 or 2); power_by_mode counts the pass once."""
    seen: dict = {}
    halves: tuple = ([], [])
    for row in ref["rows"]:
        k = T.kernel_of(row)
        halves[seen.get(k, 0) % 2].append(row)
        seen[k] = seen.get(k, 0) + 1
    made = [{**ref, "rows": rows, "commands": len(rows), "split_from_one_pass": half}
            for half, rows in enumerate(halves, 1)]
    return [made[0] if r is ref else r for r in runs] + [made[1]]


def row_label(r: dict) -> str:
    """POLICY:AGENTS, and the round where the plan had several (--rounds)."""
    return f"{r['policy']}:{r['agents']}" + (f"#{r['round'] + 1}" if "round" in r else "")


def table(result) -> str:
    b = [name for name, _, _ in T.BUCKETS]
    fmt = lambda x: "-" if x is None else f"{x:.2f}"   # noqa: E731
    out = ["| policy | agents | commands | vs naive | " + " | ".join(f"p95 abs {x} (%)" for x in b)
           + " | timings per bucket | goal |", "|---" * (5 + len(b)) + "|"]
    ref = result.get("reference", "isolated")
    judged_any = ref is not None       # --reference none: no floor, no timing judged, no goal to meet
    if result.get("reference_split"):
        ref = f"{ref}, one pass split by process"
    if judged_any:
        out.append(f"| floor ({ref} x2, per timing) | 1 | - | - | "
                   + " | ".join(fmt(result["floors_pct"][x]) for x in b)
                   + " | " + "/".join(str((result.get("floor_timings") or result["floor_kernels"])[x]) for x in b)
                   + " | |")
    if judged_any and result.get("floors_medians_pct"):
        out.append(f"| floor ({ref} x2, pass medians) | 1 | - | - | "
                   + " | ".join(fmt(result["floors_medians_pct"][x]) for x in b)
                   + " | " + "/".join(f"{result['floor_kernels'][x]} kernels" for x in b) + " | |")
    if judged_any and result.get("repeat_spread_pct"):
        out.append(f"| one process's repeats ({ref}, max/min - 1) | 1 | - | - | "
                   + " | ".join(fmt(result["repeat_spread_pct"][x]) for x in b) + " | | |")
    def judged(j: dict) -> str:     # a judgement's cells: p95 per bucket, timings per bucket, the goal
        return (" | ".join(fmt(j["p95_abs_inflation_pct"][x]) for x in b) + " | "
                + "/".join(str(j["kernels"][x]) for x in b) + " | "
                + (("met" if j["fidelity_goal"] and j["enough_kernels"] else "not met") if judged_any else "-") + " |")
    for r in result["rows"]:
        label = r["policy"] + (f" (round {r['round'] + 1})" if "round" in r else "")
        out.append(f"| {label} | {r['agents']} | {r['commands']} | {fmt(r['vs_naive'])} | " + judged(r))
        if r.get("without_host_bound"):
            out.append(f"| {r['policy']}, less {r['host_bound_timings']} host-bound timings | {r['agents']} | - | - | "
                       + judged(r["without_host_bound"]))
    for r in result.get("pooled", []):
        rounds = ", ".join(fmt(x) for x in r["vs_naive_rounds"])
        out.append(f"| {r['policy']}, {r['rounds']} rounds together (each round: {rounds}) | {r['agents']} | "
                   f"{r['commands']} | {fmt(r['vs_naive'])} | " + " | ".join("-" for _ in b) + " | | |")
    out.append("")
    budgets: dict = {}       # per scale: the ratios pooled compare one scale's modes
    for r in result.get("pooled", []):
        budgets.setdefault(r["agents"], set()).update(r.get("budgets_s", []))
    if any(len(v) > 1 for v in budgets.values()):    # --deadline cut some: less work per agent weighs on throughput
        out.append("the runs pooled had different budgets (--deadline cut some): " + "; ".join(
            f"{r['policy']}:{r['agents']} " + ", ".join(f"{x:g}" for x in r["budgets_s"]) + " s"
            for r in result["pooled"]) + "; a mode with less work per agent finishes nearer its last start")
        out.append("")
    cis = [r for r in result["rows"] if any((r.get("excess_ci_points") or {}).values())]
    if cis:   # how far past the goal each bucket is, with the sampling noise of both p95s (throughput.excess_interval)
        out.append("p95 past the floor + 0.25, 90% bootstrap interval in points (timings resampled; a kernel's "
                   "shift is not, so the truth is wider; past the goal beyond noise only where the lower end is above 0): "
                   + "; ".join(f"{row_label(r)} " + " ".join(
                       f"{x} [{c[0]:+.2f}, {c[1]:+.2f}]" for x in b if (c := r["excess_ci_points"].get(x)))
                               for r in cis))
        out.append("")
    tails = [r for r in result["rows"] if any((r.get("signed_p5_p95_pct") or {}).values())]
    if tails:   # which side each p95 of |inflation| comes from (throughput.judge)
        out.append("signed inflation, 5th and 95th percentiles in % (negative: faster than in the reference passes; "
                   "a p95 of |inflation| set by the 5th percentile is a level the reference passes had, not a "
                   "slowdown under krex): " + "; ".join(f"{row_label(r)} " + " ".join(
                       f"{x} [{t[0]:+.2f}, {t[1]:+.2f}]" for x in b if (t := r["signed_p5_p95_pct"].get(x)))
                       for r in tails))
        out.append("")
    for r in result["rows"]:
        if r.get("metrics"):
            since = "since its controller started, for this run" if r["mode"] in T.WARM_MODES else \
                "cumulative over the plan"     # a warm mode's controller is stopped after each run
            out.append(f"controller metrics after {row_label(r)} ({since}): "
                       + ", ".join(f"{k.replace('krex_', '')}={v:g}" for k, v in sorted(r["metrics"].items())))
    if result.get("region_clock_mhz"):
        out.append("lowest SM clock per region (MHz; median, 10th percentile, regions): " + ", ".join(
            f"{k} {c['median']}/{c['p10']}/{c['regions']}" for k, c in result["region_clock_mhz"].items()))
    if result.get("power_by_mode"):
        out.append("GPU power while each mode ran (nvidia-smi samples: all, at the software power cap, lowest SM "
                   "MHz, most W): " + ", ".join(f"{k} {p['samples']}/{p['capped']}/{p['sm_mhz_min']}/{p['watts_max']}"
                                                for k, p in result["power_by_mode"].items()))
    if result.get("command_phases_s"):
        out.append("a command's wall time, mean s (" + " / ".join(("wall",) + PHASES) + "; the waits and the frozen "
                   "time lie within the first four; gate_wait holds lifecycle_wait): " + ", ".join(
                       f"{k} " + " / ".join(f"{p[x]:.2f}" for x in ("wall",) + PHASES) + f" ({p['commands']})"
                       for k, p in result["command_phases_s"].items()))
    if result.get("cpu_use"):
        out.append("the node's CPUs while each mode ran (busy %, of all of them; its controller's CPU seconds over "
                   "the mode's wall seconds): " + ", ".join(
                       f"{k} {c['node_cpu_busy_pct']}%" + (f", controller {c['controller_cpu_s']:.1f} s of "
                                                            f"{c['wall_s']:.0f} s" if "controller_cpu_s" in c else "")
                       for k, c in result["cpu_use"].items()))
    out.append("")
    out.append(f"best: {result['best_policy']} ({result['best_reason']}); unstable kernels left out: "
               f"{', '.join(result['unstable']) or 'none'}"
               + (f"; left out by --leave-out (not judged, not in the floor): {', '.join(result['left_out'])}"
                  if result.get("left_out") is not None else ""))
    kernel_rows = [r for r in result["rows"] if r.get("per_kernel")]
    if kernel_rows:
        # which kernels make each tail: per stable kernel and mode, median signed inflation (lowest .. highest),
        # timings, and how many lie more than 5% off
        names = sorted({k for r in kernel_rows for k in r["per_kernel"]},
                       key=lambda k: (T.kernel_order((T.parse_size(k.split("/")[0])[1],)), k))
        out += ["", "per kernel: median signed inflation % (lowest .. highest), timings, beyond 5%; with several "
                "commands timing it more than once, the largest spread within one command / the spread of the "
                "commands' medians (points; host-bound timings included)", "",
                "| kernel | " + " | ".join(row_label(r) for r in kernel_rows) + " |",
                "|---" * (1 + len(kernel_rows)) + "|"]
        for k in names:
            cells = []
            for r in kernel_rows:
                x = r["per_kernel"].get(k)
                cells.append("-" if x is None else
                             f"{x['median_pct']:+.2f} ({x['min_pct']:+.1f} .. {x['max_pct']:+.1f}) n={x['n']} far={x['far']}"
                             + (f" host-bound={x['host_bound']}" if x.get("host_bound") else "")
                             + (f" in/across {x['within_pct']:.1f}/{x['between_pct']:.1f}" if "within_pct" in x else ""))
            out.append(f"| {k} | " + " | ".join(cells) + " |")
    wide = [f"{row_label(r)} {k} {x['sd_pct']:.2f} against {x['reference_sd_pct']:.2f} "
            f"({x['commands']}/{x['reference_processes']}), median {x['median_shift_pct']:+.2f}, "
            f"p={x['p_wider']:.3f} (Holm {x.get('p_wider_holm', x['p_wider']):.3f})"
            for r in result["rows"] for k, x in (r.get("levels") or {}).items()
            if x.get("p_wider_holm", x["p_wider"]) < 0.05]
    tested = [f"{row_label(r)} {len(r['levels'])}" for r in result["rows"] if r.get("levels")]
    if tested:
        out += ["", "per-process levels (each command's median inflation of a kernel it timed more than once, of as "
                "many timings on both sides): spread wider than in the reference processes by a permutation test "
                "of the ratio of standard deviations, p < 0.05 Holm-adjusted over each mode's kernels (kernels "
                "tested: " + ", ".join(tested) + "; sd in points, shared against alone, commands/processes, the "
                "shift of the medians): " + ("; ".join(wide) if wide else "none")]
    for ref, other in (result.get("also") or {}).items():   # the same runs against another reference
        out += ["", f"against the {ref} reference:", ""] + table({**other, "also": None}).splitlines()
    return "\n".join(out) + "\n"


def check_references(ap, text: str) -> None:
    """--reference: a comma list of distinct known references, or AP's one-line error (exit status 2)."""
    names = text.split(",")
    if any(x not in REFERENCES for x in names) or len(set(names)) != len(names):
        ap.error(f"--reference: a comma list of distinct ones of {', '.join(sorted(REFERENCES))}, not {text!r}")
    if "none" in names and len(names) > 1:
        ap.error(f"--reference: none stands alone (no reference passes), not {text!r}")


def stored_option(argv: list, name: str):
    """The value a result's stored command line gave an option ("--x V" or "--x=V"), or None."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if isinstance(a, str) and a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def metrics_summary(text: str) -> dict:
    """The few figures of a controller's /metrics page that say what it saw: regions granted, not exclusive,
    tainted by taint, and the wait and hold histograms' count and sum (prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("krex_regions_granted_total", "krex_regions_not_exclusive_total", "krex_regions_revoked_total"):
                out[s.name] = out.get(s.name, 0) + s.value
            elif s.name == "krex_regions_tainted_total":
                key = f"tainted:{s.labels.get('taint')}"
                out[key] = out.get(key, 0) + s.value
            elif s.name in ("krex_region_wait_seconds_count", "krex_region_wait_seconds_sum",
                            "krex_region_hold_seconds_count", "krex_region_hold_seconds_sum"):
                out[s.name] = round(out.get(s.name, 0) + s.value, 3)
            elif s.name == "krex_region_handover_seconds_total":      # the gates closed before each grant
                key = f"handover:{s.labels.get('phase')}"
                out[key] = round(out.get(key, 0) + s.value, 3)
            elif s.name == "krex_controller_events_total" and s.labels.get("event") in SUMMARY_EVENTS:
                out[f"events:{s.labels['event']}"] = s.value    # the fair share's waits, the loop's NVML samples
    return out


SUMMARY_EVENTS = ("fair_share_waits", "process_samples", "process_sample_us", "drain_timeouts", "frozen_total",
                  "lifecycle_prewaits", "lifecycle_prewaits_at_gate", "lifecycle_prewait_ms", "lifecycle_prewait_bounded", "barrier_ms_create",
                  "barrier_ms_destroy", "barrier_ms_exit", "barrier_ms_leaving", "barrier_ms_scrub")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="4,8,16")
    ap.add_argument("--budget", type=float, default=30.0, help="seconds per mode before agents stop taking work")
    ap.add_argument("--specs", type=int, default=400, help="candidate commands available per mode")
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timings per kernel per command")
    T.add_reference_options(ap, "command")
    ap.add_argument("--reference-processes-for", default="", metavar="KERNEL=K,...",
                    help="commands a reference pass for these kernels ([OP@]SIZE/VARIANT as the mix names them, e.g. "
                         "sum@128/0=6), the others --reference-processes: a kernel under 0.1 ms takes a level per "
                         "placement of its inputs, which a floor from a few processes does not sample")
    ap.add_argument("--mix", default=",".join(f"{n}:{w:g}" for n, w in BALANCED),
                    help="[OP@]SIZE[/VARIANT]:WEIGHT,... the commands' matmul sizes and how often each is drawn "
                         "(default: the four buckets alike); sum@N: bench/candidate.py --op sum, memory-bound row "
                         "sums reading N MiB per call (sum@128, sum@1024, sum@8192, sum@49152: 0.04-0.05, 0.25-0.29, "
                         "2.0-2.2 and 12.0-13.3 ms on the H200, variant 0 and torch.sum); SIZE/VARIANT: every command of that size times that variant "
                         "(16384/1: the 16384/0 Triton candidate's time moves with where its operands land, a "
                         "kernel no two processes time alike); more weight on 2048 gives the < 0.1 ms bucket more "
                         "timings, where half its kernels (the Triton candidates, launched from Python) can be "
                         "host-bound")
    ap.add_argument("--stable-pct", type=float, default=None)   # 2; a --reanalyse: the run's own
    T.add_timing_options(ap, "command")
    ap.add_argument("--host-bound-check", action="store_true",
                    help="KREX_HOST_BOUND=1 in the krex commands: each timing says whether its region was host-bound "
                         "(the GPU waited for the launches from Python), and each policy gets a row without those")
    ap.add_argument("--candidate", default=T.CANDIDATE)
    ap.add_argument("--logs", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--md", default=None)
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="> 0: each krex controller serves --metrics on 127.0.0.1 from this port on; each krex mode's "
                         "page is scraped when it ends (LOGS/metrics-MODE-N.prom, a summary in the result)")
    ap.add_argument("--policies", default=",".join(COLD),
                    help="the krex policies to run at each scale, of " + ", ".join(POLICIES.values())
                         + " (+warm: commands in warm workers)")
    ap.add_argument("--skip-naive", action="store_true",
                    help="no naive sharing step (no throughput against naive): for a fidelity-only run")
    ap.add_argument("--rounds", type=int, default=1, metavar="R",
                    help="run each scale's shared modes R times, every other round in the reverse order (ABBA), and "
                         "give each mode's throughput over the rounds together: a node's drift over the plan weighs "
                         "on every mode alike")
    ap.add_argument("--stagger", type=float, default=0.0, metavar="S",
                    help="each shared mode's agent starts its first command after a delay of its own, uniform in "
                         "[0, S] and the same in every mode (seeded by the agent), and takes work for the budget "
                         "from then (--deadline keeps S aside): agents not in step, as a fleet's "
                         "that think between commands; without it they start together and commands of like length "
                         "reach their timings in bursts (default 0)")
    ap.add_argument("--controller-args", default="",
                    help="more options for every krex controller of the plan, one string (e.g. \"--region-gap-ms 200\")")
    ap.add_argument("--prewait-ms", type=float, default=T.PREWAIT_MS, metavar="MS",
                    help="busy+prewait's --lifecycle-prewait-ms (default %(default)s)")
    ap.add_argument("--gate-lifecycle", choices=("on", "off"), default="on",
                    help="on: the krex controllers run with --gate-contexts --gate-exit (the default of krex "
                         "controller: a context is created, and a process with contexts exits, only while no other "
                         "job's region holds its GPU); off: with --no-gate-contexts --no-gate-exit")
    ap.add_argument("--reference", default=None,
                    help="the two reference passes: solo (each command alone under a krex controller of its own, so "
                         "each timing starts from the clock settle every region gets), isolated (alone, no krex) or "
                         "solo-busy (solo beside a GPU neighbour, --neighbour, frozen in every region: a GPU that is "
                         "busy between the commands); a comma list runs each, the first judging, the others shown; "
                         "none: no reference passes, throughput against naive sharing only (a plan of commands too "
                         "long to run alone twice, e.g. --compiler cuda's; no fidelity is judged) "
                         "(default solo; with --reanalyse, the run's own)")
    ap.add_argument("--neighbour", default=None,
                    help="solo-busy's neighbour script (args STOP READY [LOAD]; default bench/contender.py, bf16 matmuls)")
    ap.add_argument("--neighbour-load", default=None, metavar="SIZE|sum@MIB",
                    help="solo-busy's neighbour's work between the reference's regions (bench/contender.py's LOAD; "
                         "default 8192, bf16 matmuls, which hold the GPU at its power cap; sum@1024: torch.sum over "
                         "1 GiB, memory-bound like the sum mix's kernels)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="> 0: seconds for the whole plan; the shared modes' budgets shrink so that the last isolated "
                         "pass (as long as the first one took) still runs within it")
    ap.add_argument("--reanalyse", default=None, help="a result JSON: analyse its runs again, run nothing")
    ap.add_argument("--split-reference", action="store_true",
                    help="with --reanalyse, for a plan cut before its last isolated pass: split the one pass of the "
                         "reference into two by process (each kernel's commands taken in turn), so that the floor "
                         "and the stability check compare processes of one pass; the table says so")
    ap.add_argument("--smi", default=None, metavar="CSV",
                    help="nvidia-smi samples taken while the plan ran (the device script's freeze-policy-smi.csv): "
                         "the output says, per mode, how many were at the power cap")
    ap.add_argument("--leave-out", default="",
                    help="[OP@]SIZE/VARIANT/KIND,... (KIND candidate or reference; OP@ for --mix's other ops, e.g. "
                         "sum@1024/0/reference): kernels to leave out of the judgement "
                         "and the floor alike, named in the table (a reading without them, for a diagnosis; the "
                         "result of record is the one without this option)")
    args = ap.parse_args()
    leave_out = tuple(x for x in args.leave_out.split(",") if x)
    ops = "|".join(re.escape(op) for op in T.OPS)
    bad = [x for x in leave_out if not re.fullmatch(rf"(?:(?:{ops})@)?\d+/\d+/(candidate|reference)", x)]
    if bad:
        ap.error(f"--leave-out: {', '.join(bad)} is not [OP@]SIZE/VARIANT/candidate or [OP@]SIZE/VARIANT/reference")
    if args.reference is not None:      # a bad one is refused before anything is read
        check_references(ap, args.reference)
    data = T.read_result(ap, args.reanalyse) if args.reanalyse else None
    stored = (data or {}).get("argv") or []       # a --reanalyse judges as the run did unless told otherwise
    if args.reference is None:
        args.reference = stored_option(stored, "--reference") or "solo"
    if args.stable_pct is None:
        try:
            args.stable_pct = float(stored_option(stored, "--stable-pct") or 2.0)
        except ValueError:
            args.stable_pct = 2.0
    check_references(ap, args.reference)
    refs = [REFERENCES[x] for x in args.reference.split(",") if REFERENCES[x]]   # none: no passes
    if not refs and not args.reanalyse:
        if args.skip_naive:
            ap.error("--reference none with --skip-naive: no reference passes and no naive sharing, so nothing the "
                     "plan runs is measured against anything")
        given = [o for o in ("--reference-repeat", "--reference-processes", "--reference-processes-for",
                             "--reference-holder-gib", "--neighbour", "--neighbour-load")
                 if getattr(args, o[2:].replace("-", "_")) != ap.get_default(o[2:].replace("-", "_"))]
        if given:
            ap.error(f"--reference none runs no reference passes: {', '.join(given)} would do nothing")
    if args.neighbour:
        T.NEIGHBOUR[:] = [str(Path(args.neighbour).resolve())]
    if args.neighbour_load is not None:
        if not re.fullmatch(r"[1-9]\d*|sum@[1-9]\d*", args.neighbour_load):
            ap.error(f"--neighbour-load: SIZE (a matmul's, e.g. 8192) or sum@MIB (e.g. sum@1024), "
                     f"not {args.neighbour_load!r}")
        T.NEIGHBOUR_ARGS[:] = [args.neighbour_load]
    argv = sys.argv
    if data is not None:
        runs, argv = data["runs"], stored or sys.argv   # the run's own command line stays
    else:
        T.CANDIDATE = str(Path(args.candidate).resolve())
        T.CANDIDATE_ARGS[:] = ["--repeat", str(args.repeat)] + T.timing_args(ap, args)
        T.check_reference_options(ap, args)
        T.REFERENCE_ARGS[:] = T.reference_args(args)
        T.REFERENCE_PROCESSES[0] = args.reference_processes
        T.MIX[:] = T.parse_mix(args.mix, ap)
        T.check_compiler(ap, args, T.MIX)
        T.REFERENCE_PROCESSES_FOR.clear()
        T.REFERENCE_PROCESSES_FOR.update(T.parse_kernel_counts(args.reference_processes_for, ap,
                                                               "--reference-processes-for", T.MIX, args.variants))
        T.HOST_BOUND[0] = args.host_bound_check
        if not 0 <= args.stagger < args.budget:
            ap.error(f"--stagger: seconds from 0 up to the budget ({args.budget:g}), not {args.stagger:g}")
        T.STAGGER_S[0] = args.stagger
        scales = [int(x) for x in args.scales.split(",")]
        wanted = args.policies.split(",")
        if any(w not in POLICIES.values() for w in wanted):
            ap.error("--policies: a comma list of " + ", ".join(POLICIES.values()))
        modes = ([] if args.skip_naive else ["naive"]) + [m for m, pol in POLICIES.items() if pol in wanted]
        # each reference's two passes: one before everything, one after (in the reverse order)
        if args.rounds < 1 or args.rounds > 1 and args.rounds % 2:
            ap.error(f"--rounds: 1, or an even number (each order as often as the other), not {args.rounds}")
        # --rounds: each scale's shared modes R times, every other round reversed (ABBA)
        shared = [(m, n, k) for n in scales for k in range(args.rounds) for m in (modes if k % 2 == 0 else modes[::-1])]
        rounds = [None] * len(refs) + [k for _, _, k in shared] + [None] * len(refs)
        plan = [(m, 1) for m in refs] + [(m, n) for m, n, _ in shared] + [(m, 1) for m in refs[::-1]]
        specs = T.make_specs(args.specs, 11, max(1, min(4, args.variants)))
        runs = []
        if not args.prewait_ms > 0:
            ap.error("--prewait-ms: more than 0 (busy+prewait without a prewait is busy)")
        T.set_prewait_ms(args.prewait_ms)
        with tempfile.TemporaryDirectory() as td:
            ctls = T.Controllers(Path(td), plan, Path(args.logs or td), metrics_port=args.metrics_port,
                                 extra=(("--gate-contexts", "--gate-exit") if args.gate_lifecycle == "on"
                                        else ("--no-gate-contexts", "--no-gate-exit"))
                                 + tuple(shlex.split(args.controller_args)))
            try:
                t_plan = time.monotonic()
                for i, (mode, n) in enumerate(plan):
                    budget = args.budget
                    if args.deadline and mode not in T.REFERENCE_MODES:   # --reference none: the first one too
                        first = sum(r["wall_s"] for r in runs[:len(refs)])   # the last passes take as long
                        left = args.deadline - (time.monotonic() - t_plan) - 1.2 * first
                        shared_left = sum(1 for m, _ in plan[i:] if m not in T.REFERENCE_MODES)
                        # a command's wall time: alone, from the first passes; with none, from the shared modes so far
                        tail = expected_tail(runs[:len(refs)] if refs else runs, n)
                        # --stagger: an agent takes work for the budget from its own start, up to S later
                        budget = max(5.0, min(budget, left / shared_left - tail - args.stagger))
                    runs.append(T.run_mode(mode, n, specs, budget, Path(td), 1000 * (i + 1) + args.nonce_offset,
                                           ctls))
                    runs[-1]["budget_s"] = budget
                    if args.rounds > 1 and rounds[i] is not None:
                        runs[-1]["round"] = rounds[i]
                    page = ctls.scrape(mode)
                    if page:   # the controller lives for the whole plan: its counters are cumulative
                        rnd = f"-round{rounds[i] + 1}" if args.rounds > 1 and rounds[i] is not None else ""
                        (Path(args.logs or td) / f"metrics-{mode}-{n}{rnd}.prom").write_text(page)
                        runs[-1]["metrics"] = metrics_summary(page)
                    if mode in T.WARM_MODES:   # its idle workers' contexts would taint the next steps' regions
                        ctls.stop(mode)        # (other_controller); the next scale starts and fills it again
                    Path(args.out).write_text(json.dumps({"partial": True, "runs": runs, "argv": sys.argv}, indent=1))
                    cut = (f" (its budget cut from {args.budget:g} to {budget:.0f} s by --deadline: fewer timings)"
                           if budget < args.budget else "")
                    rnd = f" (round {rounds[i] + 1})" if "round" in runs[-1] else ""
                    print(f"{mode}:{n}{rnd}: {runs[-1]['commands']} commands in {runs[-1]['wall_s']:.1f} s{cut}",
                          flush=True)
            finally:
                ctls.stop()
    ref_mode = refs[0] if refs else None   # none: throughput only, no timing judged
    if args.reanalyse and not any(r["mode"] == ref_mode for r in runs):
        ref_mode = next((m for m in T.REFERENCE_MODES if any(r["mode"] == m for r in runs)), ref_mode)
    if args.split_reference:
        if not args.reanalyse:
            ap.error("--split-reference is for --reanalyse (a plan that was cut before its last isolated pass)")
        passes = [r for r in runs if r["mode"] == ref_mode]
        if len(passes) != 1:
            ap.error(f"--split-reference: the result has {len(passes)} passes of {ref_mode}, not one")
        runs = split_pass(runs, passes[0])
    result = analyse(runs, args.stable_pct, ref_mode, leave_out)
    if any(r.get("split_from_one_pass") for r in runs):
        result["reference_split"] = True
    also = [m for m in refs[1:] if any(r["mode"] == m for r in runs)]
    if also:
        result["also"] = {m: analyse(runs, args.stable_pct, m, leave_out) for m in also}
    if args.smi:
        try:
            result["power_by_mode"] = power_by_mode(runs, read_smi(args.smi))
        except OSError as e:
            print(f"freeze_policy: cannot read --smi {args.smi}: {e.strerror}; no power per mode", file=sys.stderr)
    Path(args.out).write_text(json.dumps({**result, "runs": runs, "argv": argv,
                                          **({"partial": True} if (data or {}).get("partial") else {}),
                                          **({"reanalysed_argv": sys.argv} if args.reanalyse else {})}, indent=1))
    md = table(result)
    if args.md:
        Path(args.md).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
