"""Agents timing real KernelBench problems with KernelBench's own timing module, at once, on one GPU: how far
their times move from the isolated ones, naive and under krex, quiet and with injected disturbances, and
whether krex's attestation flags the regions whose time moved (issue 13's goals).

    python bench/kernelbench_mix.py --kernelbench .kb --agents 8 --out /tmp/krex-out/kb-mix.json

.kb holds an unmodified copy of KernelBench's src/kernelbench/timing.py and KernelBench/level1/ (fetched;
not in this repository). Modes, in this order, each a fresh controller where krex is involved:
  isolated    one command at a time, every item (the first isolated pass; it also sorts items into buckets)
  naive       AGENTS agents at once, each COMMANDS commands in turn, no krex
  krex        the same under krex (KREX_HOOKS=kernelbench: each timing call is a region)
  krexdist    krex, with disturbers running: context churn and exits holding 4 GiB (both under krex), an
              allocation loop (under krex), a heavy-matmul neighbour (under krex, frozen in regions: its load
              before a region is what is left of it)
  krexforeign krex, with a process outside krex that holds a context and runs matmul bursts
  krexnf      krex with `krex controller --no-freeze` (the gate and the drain alone keep the GPU exclusive)
  krexns      krex without the clock settle (`--clock-settle-ms 0`)
  krexni      krex without CPU isolation (`--no-cpu-isolation`: the owner's threads stay where they are)
  krexown     krex with `--owner-cpus own-and-reserved` (the owner keeps its CPUs and gains the reserved ones)
  isolated2, isolated3  more isolated passes (item baseline: the median of the passes; the noise floor: each
              pass against it)
  solo, solo2 every agent command of the plan run alone, one after another: the same items in the same order
              in a fresh process, so each measurement has its own isolated twin (a problem's time depends on
              what its process ran before: on the H200 a GELU is 11% slower after some sequences, alone too).
              "analysis_vs_solo" compares each shared measurement with its twins' median; "noise_floor_solo_p95"
              each solo pass with that median
  solok, solok2  the same twins alone under krex (a controller of their own, each timing call a region: the
              clock settle and CPU isolation, nobody to wait for), so the reference starts each timing from the
              state krex gives every region; "analysis_vs_solok", "noise_floor_solok_p95"; solokown, solokni,
              ...: the same with that krex mode's controller options (solokown: those of krexown)
A reference family (solo, solok) also has a leave-one-out floor, "noise_floor_<family>_loo_p95": each pass
against the median of the family's other passes (with two passes, the gap between them). It is what a
measurement krex does not disturb would show against its twins (a little more: the twins' median of two
passes varies less than one pass), while the plain floor (a pass against a median it is part of) is about
half of it and understates the noise.
An item is PROBLEM:DTYPE; the bucket of an item is by its isolated time (< 0.1, 0.1-1, 1-10, > 10 ms). Each
agent command times ITEMS items (bucket by bucket in turn, so every bucket gets about as many measurements).
Inflation of a measurement: its median over the trials / the item's isolated baseline - 1. Each krex command
writes a report (krex run --report); "hand_offs" has the median of each phase of its regions and their
total time. OUT.md (OUT's name with .md) has the results in one table, printed last as well."""

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ITEMS = [  # KernelBench level 1 problems and the dtype they run in (bf16 brings matmuls under 1 ms)
    "1_Square_matrix_multiplication_.py:bf16", "2_Standard_matrix_multiplication_.py:bf16",
    "16_Matmul_with_transposed_A.py:bf16", "17_Matmul_with_transposed_B.py:bf16",
    "13_Matmul_for_symmetric_matrices.py:bf16", "10_3D_tensor_matrix_multiplication.py:bf16",
    "95_CrossEntropyLoss.py:fp32", "88_MinGPTNewGelu.py:bf16", "50_conv_standard_2D__square_input__square_kernel.py:bf16",
    "54_conv_standard_3D__square_input__square_kernel.py:bf16", "6_Matmul_with_large_K_dimension_.py:bf16",
    "1_Square_matrix_multiplication_.py:fp32", "3_Batched_matrix_multiplication.py:fp32",
    "8_Matmul_with_irregular_shapes_.py:fp32", "63_conv_standard_2D__square_input__square_kernel.py:fp32",
    "60_conv_standard_3D__square_input__asymmetric_kernel.py:fp32", "40_LayerNorm.py:fp32",
    "88_MinGPTNewGelu.py:fp32", "57_conv_transposed_2D__square_input__square_kernel.py:fp32",
    "58_conv_transposed_3D__asymmetric_input__asymmetric_kernel.py:fp32",
    "61_conv_transposed_3D__square_input__square_kernel.py:fp32", "11_4D_tensor_matrix_multiplication.py:fp32",
    "70_conv_transposed_3D__asymmetric_input__square_kernel.py:fp32",
    "68_conv_transposed_3D__square_input__asymmetric_kernel.py:fp32", "42_Max_Pooling_2D.py:fp32",
]
BUCKETS = (("<0.1ms", 0, 0.1), ("0.1-1ms", 0.1, 1.0), ("1-10ms", 1.0, 10.0), (">10ms", 10.0, 1e9))
# `krex controller` options of the krex modes (any mode starting with "krex" is a krex mode)
MODE_ARGS = {"krexnf": ["--no-freeze"], "krexdist": ["--settle-ms-per-gib", "10"], "krexns": ["--clock-settle-ms", "0"],
             "krexni": ["--no-cpu-isolation"], "krexown": ["--owner-cpus", "own-and-reserved"]}


def bucket_of(ms: float) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= ms < hi)


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") or k in ("KREX_SOCKET", "KREX_REGISTRY_DIR")}
    e.update(SAFE, PYTHONUNBUFFERED="1", **extra)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return e


class World:
    """A controller of our own for one mode."""

    def __init__(self, tmp: Path, *args: str):
        self.sock = tmp / "krex.sock"
        self.log = open(tmp / "controller.log", "ab")
        self.ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(self.sock),
                                     "--state-file", str(tmp / "state"), *args], env=env(), stdout=self.log,
                                    stderr=self.log)
        deadline = time.monotonic() + 20
        while not self.sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def env(self, **extra) -> dict:
        return env(KREX_SOCKET=str(self.sock), **extra)

    def stop(self) -> None:
        self.ctl.terminate()
        self.ctl.wait(30)


AGENT = [str(ROOT / "bench" / "kb_agent.py")]


def agent_cmd(kb: str, items: list, out: Path, trials: int, tag: str, krex: bool) -> list:
    cmd = [sys.executable, *AGENT, "--kernelbench", kb, "--items", ",".join(items),
           "--out", str(out), "--trials", str(trials), "--tag", tag]
    report = ["--report", str(out.with_suffix(".report.json"))]
    return ([sys.executable, "-m", "krex_ctl", "run", *report, "--"] if krex else []) + cmd


def read(out: Path) -> list:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def hand_offs(outs: list) -> dict:
    """Where the regions' time went, from the commands' reports (krex run --report): the median of each
    phase (queued: request to the start of the drain; drain, settle, freeze, isolate, attest: the hand-off;
    attest_end: the end), and the sum of the regions' durations."""
    recs = []
    for out in outs:
        path = out.with_suffix(".report.json")
        if path.exists():
            recs += json.loads(path.read_text()).get("regions", [])
    if not recs:
        return {}
    keys = sorted({k for r in recs for k, v in r.items() if k.endswith("_ns") and isinstance(v, int)
                   and k not in ("requested_ns", "granted_ns", "ended_ns")})
    res = {k[:-3] + "_ms_median": round(statistics.median(r[k] for r in recs if isinstance(r.get(k), int)) / 1e6, 3)
           for k in keys}
    held = [(r["ended_ns"] - r["granted_ns"]) / 1e9 for r in recs if r.get("granted_ns") and r.get("ended_ns")]
    res.update(regions=len(recs), held_s=round(sum(held), 2))
    settles = [s for r in recs for s in r.get("clock_settle", [])]
    if settles:
        res["clock_settle"] = {
            "status": {k: sum(s["status"] == k for s in settles) for k in sorted({s["status"] for s in settles})},
            "waited_ms_median": round(statistics.median(s["waited_ms"] for s in settles), 3),
            "waited_s_total": round(sum(s["waited_ms"] for s in settles) / 1e3, 2),
            "first_mhz_min": min(s["first_mhz"] for s in settles)}
    return res


def run_agents(plans: list, kb: str, tmp: Path, trials: int, mode: str, world, limit_s: float = 240) -> tuple[list, float]:
    """Each plan is one agent's list of commands (lists of items), run one after another; agents at once (a
    mode that outlives limit_s is stopped: what was measured so far is kept)."""
    t0 = time.monotonic()
    outs, procs = [], []

    def start(a, c):
        out = tmp / f"{mode}-a{a}-c{c}.jsonl"
        outs.append(out)
        e = world.env(KREX_HOOKS="kernelbench") if world else env()
        return subprocess.Popen(agent_cmd(kb, plans[a][c], out, trials, f"{mode}-a{a}-c{c}", world is not None),
                                env=e, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{mode}-a{a}.log", "ab"))

    state = [[0, start(a, 0)] for a in range(len(plans))]
    done = 0
    while done < len(plans):
        time.sleep(0.05)
        if time.monotonic() - t0 > limit_s:
            print(f"{mode}: stopped after {limit_s:.0f} s", flush=True)
            for st in state:
                if st[1] is not None and st[1].poll() is None:
                    st[1].kill()
            break
        for a, st in enumerate(state):
            if st[1] is None or st[1].poll() is None:
                continue
            st[0] += 1
            if st[0] < len(plans[a]):
                st[1] = start(a, st[0])
            else:
                st[1] = None
                done += 1
    wall = time.monotonic() - t0
    if world is not None:
        world.hand_offs = hand_offs(outs)
    return [r for out in outs for r in read(out)], wall


DISTURBERS = [
    ("ctx", True, ["bench/perturb.py", "--disturb", "ctx", "--par", "2"]),
    ("exitbig", True, ["bench/perturb.py", "--disturb", "exitbig", "--par", "1"]),
    ("alloc", True, ["bench/perturb.py", "--disturb", "alloc"]),
    ("load", True, ["bench/perturb.py", "--disturb", "load"]),
    ("bursts", False, ["bench/perturb.py", "--disturb", "bursts"]),
]


def start_disturbers(world: World, tmp: Path, which: list) -> list:
    procs = []
    for name, under_krex, args in DISTURBERS:
        if name not in which:
            continue
        cmd = ([sys.executable, "-m", "krex_ctl", "run", "--"] if under_krex else []) + [sys.executable, *args]
        e = world.env(KREX_LOG_LEVEL="error") if under_krex else env()     # outside krex: no socket, no shim
        procs.append((name, subprocess.Popen(cmd, env=e, cwd=ROOT,
                                             stdout=subprocess.PIPE, stderr=open(tmp / f"dist-{name}.log", "ab"),
                                             text=True, start_new_session=True)))
    return procs


def stop_disturbers(procs: list) -> dict:
    counts = {}
    for name, p in procs:
        os.killpg(p.pid, signal.SIGTERM)
    for name, p in procs:
        try:
            out, _ = p.communicate(timeout=60)
            counts[name] = int((out.strip().splitlines() or ["0"])[-1])
        except (subprocess.TimeoutExpired, ValueError):
            os.killpg(p.pid, signal.SIGKILL)
            counts[name] = None
    return counts


def quantile(xs: list, q: float, digits: int = 5):
    """The q-quantile as a value of xs (numpy's "higher": the rank-ceil(q (n-1)) element, no interpolation)."""
    return round(float(np.quantile(np.asarray(xs, dtype=float), q, method="higher")), digits) if len(xs) else None


def p95(xs: list):
    return quantile(xs, 0.95)


def first_trials(modes: dict, baseline: dict, n: int = 4) -> dict:
    """The first n timed trials of the sub-millisecond items (0.1-1 ms) against the item's isolated baseline,
    per mode: the median and p90 of each trial's inflation (KernelBench's first trials are slow alone too)."""
    out = {}
    for mode, recs in modes.items():
        rows = [[x / baseline[r["item"]] - 1 for x in r.get("times", [])[:n]] for r in recs
                if 0.1 <= baseline.get(r["item"], 0) < 1.0 and r.get("times")]
        k = min((len(t) for t in rows), default=0)      # fewer trials than n: as many as every row has
        if k:
            out[mode] = {"n": len(rows), "median": [round(statistics.median(t[i] for t in rows), 4) for i in range(k)],
                         "p90": [quantile([t[i] for t in rows], 0.9, 4) for i in range(k)]}
    return out


def item_key(r: dict) -> str:
    return r["item"]


def twin_key(r: dict) -> tuple:
    """A measurement's place in the plan: agent, command, position (the tag names the mode, agent and command)"""
    return (r["tag"].split("-", 1)[1], r.get("index"))


def passes(modes: dict, names: list, key) -> tuple[dict, dict]:
    """Reference passes (isolated or solo) grouped by key: the median of each group's times, and how far its
    passes are apart (max/min - 1, where there are two or more)."""
    groups: dict = {}
    for m in names:
        for r in modes[m]:
            groups.setdefault(key(r), []).append(r["median_ms"])
    return ({k: statistics.median(v) for k, v in groups.items()},
            {k: max(v) / min(v) - 1 for k, v in groups.items() if len(v) > 1})


def noise_floor_loo(modes: dict, names: list, key, baseline: dict) -> dict:
    """Each reference pass against the median of the other passes of its family (by key), by bucket."""
    floor: dict = {}
    for m in names:
        others, _ = passes(modes, [n for n in names if n != m], key)
        for r in modes[m]:
            if r["item"] in baseline and others.get(key(r)):
                floor.setdefault(bucket_of(baseline[r["item"]]), []).append(abs(r["median_ms"] / others[key(r)] - 1))
    return floor


def family(mode: str) -> str:
    """solo2 -> solo, solok3 -> solok: the passes that are one reference"""
    return mode.rstrip("0123456789")


def noise_floor(modes: dict, names: list, key, ref: dict, baseline: dict) -> dict:
    """Each reference pass against the median of the passes (ref by key), by the item's bucket: what the
    reference itself varies by."""
    floor: dict = {}
    for m in names:
        for r in modes[m]:
            if r["item"] in baseline:
                floor.setdefault(bucket_of(baseline[r["item"]]), []).append(abs(r["median_ms"] / ref[key(r)] - 1))
    return floor


def analyse(modes: dict, baseline: dict, ref: dict, spread: dict, key=item_key) -> dict:
    """ref and spread by key (the item, or twin_key): spread is how far the reference passes are apart
    (max/min - 1): a reference whose passes disagree by more than 1% is unstable (a cuDNN algorithm chosen per
    process, say), and a measurement "moved beyond noise" only when it moved more than 2% and more than that
    spread. Buckets are by the item's isolated time (baseline)."""
    out = {}
    for mode, recs in modes.items():
        rows = []
        for r in recs:
            base, r_ref, sp = baseline.get(r["item"]), ref.get(key(r)), spread.get(key(r), 0)
            if not base or not r_ref:
                continue
            reg = r.get("region") or {}
            rows.append({"bucket": bucket_of(base), "infl": r["median_ms"] / r_ref - 1, "clean": bool(reg.get("clean")),
                         "stable": sp <= 0.01, "spread": sp,
                         "exclusive": bool(reg.get("exclusive")), "taints": reg.get("taints") or [],
                         "granted": bool(reg.get("granted"))})
        per = {}
        for name, _, _ in BUCKETS:
            b = [x for x in rows if x["bucket"] == name]
            if not b:
                continue
            clean = [x for x in b if x["clean"]]
            stable = [x for x in clean if x["stable"]]
            per[name] = {"n": len(b), "n_clean": len(clean), "p95_abs_all": p95([abs(x["infl"]) for x in b]),
                         "p95_abs_clean": p95([abs(x["infl"]) for x in clean]),
                         "n_clean_stable": len(stable), "p95_abs_clean_stable": p95([abs(x["infl"]) for x in stable]),
                         "median_all": round(statistics.median(x["infl"] for x in b), 5)}
        moved = [x for x in rows if abs(x["infl"]) > 0.02]
        beyond = [x for x in rows if abs(x["infl"]) > max(0.02, x["spread"])]
        taints = {}
        for x in rows:
            for t in x["taints"]:
                taints[t] = taints.get(t, 0) + 1
        out[mode] = {"buckets": per, "n": len(rows), "flagged": sum(not x["clean"] for x in rows),
                     "moved_over_2pct": len(moved), "moved_and_flagged": sum(not x["clean"] for x in moved),
                     "moved_beyond_noise": len(beyond), "beyond_noise_and_flagged": sum(not x["clean"] for x in beyond),
                     "taints": taints}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", default=str(ROOT / ".kb"))
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--commands", type=int, default=3, help="commands per agent and mode")
    ap.add_argument("--items", type=int, default=7, help="items per command")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--modes", default="isolated,naive,krexnf,krex,krexdist,isolated2,isolated3")
    ap.add_argument("--disturbers", default="ctx,exitbig,alloc,load")
    ap.add_argument("--controller-args", default="", help="extra `krex controller` options for the krex modes")
    ap.add_argument("--agent", help="the agent script (default bench/kb_agent.py; the tests use a CPU stand-in)")
    ap.add_argument("--item-list", help="comma-separated items instead of the built-in list")
    ap.add_argument("--mode-limit", type=float, default=240, help="seconds a mode may take before it is stopped")
    ap.add_argument("--reanalyse", metavar="RESULT", help="no runs: analyse the measurements of a written result again")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    kb = str(Path(args.kernelbench).resolve())
    if args.agent:
        AGENT[:] = [args.agent]
    items = args.item_list.split(",") if args.item_list else \
        [i for i in ITEMS if (Path(kb) / "level1" / i.split(":")[0]).exists()]
    if args.reanalyse:      # a written result (a partial one too): the analysis again, from its measurements
        try:
            old = json.loads(Path(args.reanalyse).read_text())
            return report(old["raw"], old["walls_s"], old["notes"], old.get("items", items), args.out,
                          old.get("argv", []), reanalysed=sys.argv)
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"cannot reanalyse {args.reanalyse}: {e!r}")
    tmp = Path(tempfile.mkdtemp(prefix="kbmix-", dir=os.environ.get("KBMIX_TMP")))
    walls, modes, notes = {}, {}, {}

    def new_world(mode: str, options_of: str) -> World:
        """A controller for a mode, with the controller options of the krex mode options_of"""
        return World(Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=tmp)), *args.controller_args.split(),
                     *MODE_ARGS.get(options_of, []))

    def partial() -> None:
        Path(args.out).write_text(json.dumps({"partial": True, "raw": modes, "walls_s": walls, "notes": notes,
                                              "items": items, "argv": sys.argv}))
    rng = random.Random(13)
    plans = None
    for mode in args.modes.split(","):
        t0 = time.monotonic()
        if mode.startswith("solo"):     # the plan's commands, one at a time (solok: under krex)
            if plans is None:
                ap.error(f"mode {mode} needs an isolated pass before it (that pass makes the plan)")
            world = new_world(mode, "krex" + family(mode)[len("solok"):]) if family(mode).startswith("solok") else None
            recs, outs = [], []
            for a, plan in enumerate(plans):
                for c, cmd_items in enumerate(plan):
                    out = tmp / f"{mode}-a{a}-c{c}.jsonl"
                    outs.append(out)
                    subprocess.run(agent_cmd(kb, cmd_items, out, args.trials, f"{mode}-a{a}-c{c}", world is not None),
                                   env=world.env(KREX_HOOKS="kernelbench") if world else env(), timeout=300,
                                   stdout=subprocess.DEVNULL, stderr=open(tmp / f"{mode}.log", "ab"))
                    recs += read(out)
            if world:
                world.stop()
                notes.setdefault("hand_offs", {})[mode] = hand_offs(outs)
            modes[mode], walls[mode] = recs, time.monotonic() - t0
            print(f"{mode}: {len(recs)} measurements in {walls[mode]:.1f} s", flush=True)
            partial()
            continue
        if mode.startswith("isolated"):
            out = tmp / f"{mode}.jsonl"
            subprocess.run(agent_cmd(kb, items, out, args.trials, mode, False), env=env(), check=True, timeout=300,
                           stdout=subprocess.DEVNULL, stderr=open(tmp / f"{mode}.log", "ab"))
            modes[mode] = read(out)
            walls[mode] = time.monotonic() - t0
            if plans is None:   # bucket by bucket in turn, so each bucket gets its share of measurements
                times = {r["item"]: r["median_ms"] for r in modes[mode]}
                by_bucket = {}
                for it, ms in times.items():
                    by_bucket.setdefault(bucket_of(ms), []).append(it)
                cycles = {b: itertools.cycle(rng.sample(v, len(v))) for b, v in by_bucket.items() if b != "<0.1ms"}
                order = itertools.cycle(sorted(cycles))
                plans = [[[next(cycles[next(order)]) for _ in range(args.items)] for _ in range(args.commands)]
                         for _ in range(args.agents)]
                notes["buckets"] = {b: sorted(v) for b, v in by_bucket.items()}
            print(f"{mode}: {len(modes[mode])} items in {walls[mode]:.1f} s", flush=True)
            partial()
            continue
        world = None
        dist = []
        if mode.startswith("krex"):
            world = new_world(mode, mode)
            if mode in ("krexdist", "krexforeign"):
                which = args.disturbers.split(",") if mode == "krexdist" else ["bursts"]
                dist = start_disturbers(world, tmp, which)
                # disturbing: torch imported (load, bursts), or a context made (ctx, exitbig, alloc: ctypes alone)
                time.sleep(8 if {"load", "bursts"} & set(which) else 2)
        mode_plans = plans if mode != "krexforeign" else [p[:1] for p in plans]
        recs, wall = run_agents(mode_plans, kb, tmp, args.trials, mode, world, args.mode_limit)
        if dist:
            notes[f"{mode}_disturber_events"] = stop_disturbers(dist)
        if world:
            world.stop()
            notes.setdefault("hand_offs", {})[mode] = getattr(world, "hand_offs", {})
        modes[mode], walls[mode] = recs, wall
        ncmd = sum(len(p) for p in mode_plans)
        notes.setdefault("commands", {})[mode] = ncmd
        print(f"{mode}: {len(recs)} measurements, {ncmd} commands in {wall:.1f} s "
              f"({ncmd / wall * 60:.1f}/min)", flush=True)
        partial()
    return report(modes, walls, notes, items, args.out, sys.argv)


def table(results: dict) -> str:
    """The results in one markdown table: each shared mode against each reference (the isolated items and
    every twin family), its clean p95 per bucket, the reference's floor (leave-one-out where there is one),
    the regions flagged, the moved ones flagged, and the throughput against naive."""
    names = [b for b, _, _ in BUCKETS if b != "<0.1ms"]
    rows = ["| mode | against | clean p95 " + " / ".join(names) + " | reference floor | flagged | moved > 2%: flagged "
            "| throughput / naive |", "|---|---|---|---|---|---|---|"]
    refs = [("items", "analysis", results.get("noise_floor_p95"))] + \
        [(k[len("analysis_vs_"):], k, results.get(f"noise_floor_{k[len('analysis_vs_'):]}_loo_p95"))
         for k in results if k.startswith("analysis_vs_")]
    pct = lambda x: "-" if x is None else f"{x * 100:.2f}%"    # noqa: E731
    for ref, key, floor in refs:
        for mode, a in results[key].items():
            if mode == "naive":
                continue
            clean = " / ".join(pct(a["buckets"].get(b, {}).get("p95_abs_clean")) for b in names)
            fl = " / ".join(pct((floor or {}).get(b)) for b in names) if floor else "-"
            thr = results.get(f"{mode}_vs_naive_throughput")
            rows.append(f"| {mode} | {ref} | {clean} | {fl} | {a['flagged']} of {a['n']} | "
                        f"{a['moved_and_flagged']} of {a['moved_over_2pct']} | {pct(thr)} |")
    return "\n".join(rows) + "\n"


def report(modes: dict, walls: dict, notes: dict, items: list, out: str, argv: list, reanalysed=None) -> int:
    """The analysis of the modes' measurements, written to out (raw measurements included) and printed."""
    results = {"reanalysed_by": reanalysed} if reanalysed else {}
    iso = [m for m in modes if m.startswith("isolated")]
    baseline, spread = passes(modes, iso, item_key)
    shared = {m: v for m, v in modes.items() if not m.startswith(("isolated", "solo"))}
    results["analysis"] = analyse(shared, baseline, baseline, spread)
    for fam in sorted({family(m) for m in modes if m.startswith("solo")}):
        solo = [m for m in modes if family(m) == fam]   # each measurement against its twins: the same
        twins, twin_spread = passes(modes, solo, twin_key)   # command's same position, run alone
        results[f"analysis_vs_{fam}"] = analyse(shared, baseline, twins, twin_spread, twin_key)
        if len(solo) >= 2:
            floor = noise_floor(modes, solo, twin_key, twins, baseline)
            results[f"noise_floor_{fam}_p95"] = {k: p95(v) for k, v in floor.items()}
            floor = noise_floor_loo(modes, solo, twin_key, baseline)
            results[f"noise_floor_{fam}_loo_p95"] = {k: p95(v) for k, v in floor.items()}
    if len(iso) >= 2:
        floor = noise_floor(modes, iso, item_key, baseline, baseline)
        results["noise_floor_p95"] = {k: p95(v) for k, v in floor.items()}
        results["noise_floor_n"] = {k: len(v) for k, v in floor.items()}
        results["unstable_items"] = sorted(k for k, v in spread.items() if v > 0.01)
    results["commands_per_min"] = {m: round(notes["commands"][m] / walls[m] * 60, 2) for m in notes.get("commands", {})}
    for m in walls:     # each shared krex mode's throughput against naive sharing (the same plan's wall time)
        if "naive" in walls and m.startswith("krex") and m not in ("krexdist", "krexforeign"):
            results[f"{m}_vs_naive_throughput"] = round(walls["naive"] / walls[m], 4)
    results.update(argv=argv, items=items, baseline_ms=baseline, notes=notes, walls_s=walls, raw=modes)
    results["hand_offs"] = notes.get("hand_offs", {})
    results["first_trials"] = first_trials(modes, baseline)
    Path(out).write_text(json.dumps(results, indent=1))
    Path(out).with_suffix(".md").write_text(table(results))
    print(json.dumps({k: results[k] for k in ("analysis", "noise_floor_p95", "analysis_vs_solo", "noise_floor_solo_p95",
                                              "noise_floor_solo_loo_p95", "analysis_vs_solok", "noise_floor_solok_p95",
                                              "noise_floor_solok_loo_p95", "analysis_vs_solokown",
                                              "noise_floor_solokown_loo_p95", "commands_per_min", "unstable_items",
                                              "hand_offs", "first_trials")
                      if k in results} | {k: v for k, v in results.items() if k.endswith("_vs_naive_throughput")},
                     indent=1))
    print(table(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
