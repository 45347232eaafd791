"""A fleet of agents on Ray, on one GPU node: throughput and timing fidelity of krex against naive sharing
(Ray's fractional num_gpus as it is) and against one task per GPU (what fleets do today).

Each agent evaluates candidate kernels one after another, each evaluation one Ray task: bench/candidate.py,
a Triton matmul variant compiled, checked against torch.mm and timed (candidate and reference) with
triton.testing.do_bench, with the specs and kernel mix of bench/throughput.py. Modes:
  pergpu  num_gpus=1 per task: Ray runs one task at a time per GPU. Its timings are the isolated ground truth;
          it runs each distinct spec once, whatever the budget
  pergpubusy  the same under krex.ray.runtime_env(), beside a GPU neighbour under `krex run` on the same
          controller (bench/contender.py, frozen in every region): one task per GPU on a GPU that is busy between
          the tasks, as it is under load (krex's timings below 1 ms were faster than pergpu's in H200 run 2); with
          two passes of it, --reference pergpubusy judges against them
  pergpukrex  the same under krex.ray.runtime_env() without the neighbour: one task per GPU, each region's
          start clock-settled as krex's are (pergpu times with the GPU coming out of idle: up to 16% slower
          kernels, H200 run 6), so it isolates what sharing does from what the settle does
  naive   num_gpus=1/AGENTS per task, nothing between the tasks
  krex    the same, the tasks' workers under krex.ray.runtime_env(hooks="triton"): each do_bench a region
  shell   the same through krex.ray.shell(): the candidate as a command under `krex run`, the task a plain one
In the task modes the candidate runs in the task's own worker (runpy), a fresh one per task (Ray's max_calls=1
for GPU tasks), so it imports torch each time, as a command would. The controller is started here (its socket
in KREX_SOCKET before Ray starts, so the raylet's workers find it); its counters before and after each krex
mode are in the results, and each region's flags (exclusive, clean, taints) in its row.
    python bench/ray_fleet.py --agents 8 --plan pergpu,naive,krex,shell --out results.json"""

import argparse
import contextlib
import io
import json
import os
import runpy
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import throughput as T  # noqa: E402
from throughput import (BUCKETS, MIX, bucket, kernel_of, make_specs, p95, parse_mix, read_result,  # noqa: E402
                        reference_specs)

MODES = ("pergpu", "naive", "krex", "shell", "pergpubusy", "pergpukrex")
REFERENCE_MODES = ("pergpu", "pergpubusy", "pergpukrex")   # one task per GPU, each distinct spec once
KREX_MODES = ("krex", "shell", "pergpubusy", "pergpukrex")  # under the controller: counters, regions' flags


CANDIDATE_ARGS: list = ["--repeat", "1"]   # --repeat and throughput.timing_args': passed to bench/candidate.py


def candidate_argv(candidate: str, spec: dict, nonce: int, cargs: list | None = None) -> list:
    return [candidate, "--size", str(spec["size"]), "--variant", str(spec["variant"]), "--nonce", str(nonce),
            *(["--op", spec["op"]] if spec.get("op") else []), *(CANDIDATE_ARGS if cargs is None else cargs)]


def mode_args(mode: str, reference: str, reference_args: list) -> list:
    """bench/candidate.py's options for one mode: the judging reference's get throughput.reference_args' after
    them (--reference-repeat's --repeat wins; --reference-holder-gib's --holder-gib)."""
    return list(CANDIDATE_ARGS) + (list(reference_args) if mode == reference else [])


def end_children() -> None:
    """End this worker's child processes: an evaluation runs in a worker of its own (max_calls=1), so any child
    left is the candidate's, and the next evaluation must not find its memory held on the GPU."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            kid.terminate()
    _, alive = psutil.wait_procs(kids, timeout=10)
    for kid in alive:
        with contextlib.suppress(psutil.Error):
            kid.kill()
    psutil.wait_procs(alive, timeout=5)


def evaluate(candidate: str, spec: dict, nonce: int, cargs: list | None = None) -> dict:
    """One evaluation in this task's worker process; its row (the candidate's JSON line, and the regions this
    process's krex job recorded, when it runs under krex)."""
    t0 = time.monotonic()
    out, err, code = io.StringIO(), "", 0
    saved = sys.argv
    sys.argv = candidate_argv(candidate, spec, nonce, cargs)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(candidate, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        err = "" if e.code is None or isinstance(e.code, int) else str(e.code)
    except Exception as e:     # a failed candidate is a row, not a lost task
        code, err = 1, repr(e)
    finally:
        sys.argv = saved
        end_children()         # what the candidate started and left (its --holder-gib holder, when it failed)
    row = {"exit": code, "task_wall_s": time.monotonic() - t0, "pid": os.getpid(),
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    if lines:
        row.update(json.loads(lines[-1]))
    if err:
        row["error"] = err[-2000:]
    if os.environ.get("KREX_COUNTERS"):
        from krex_ctl.wire import counters, report

        local, _ = counters.read_local_regions(Path(os.environ["KREX_COUNTERS"]))
        row["regions"] = [report.local_record(r) for r in local]
    return row


def shell_row(res) -> dict:
    row = {"exit": res.returncode, "visible": res.visible_devices}
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    if lines:
        row.update(json.loads(lines[-1]))
    else:
        row["error"] = res.stderr[-2000:]
    row["regions"] = res.regions
    return row


def krex_counters(sock: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json", "--socket", sock],
                         capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)["counters"] if out.returncode == 0 else {}


def run_mode(ray, mode: str, agents: int, specs: list, budget_s: float, candidate: str, nonce_base: int,
             sock: str, cargs: list | None = None, processes: int = 1) -> dict:
    import krex.ray

    cargs = list(CANDIDATE_ARGS) if cargs is None else cargs

    share = 1.0 if mode in REFERENCE_MODES else 1.0 / agents
    if mode in REFERENCE_MODES:
        specs, budget_s = reference_specs(specs, processes), float("inf")
    if mode == "shell":
        def launch(spec, nonce):
            return krex.ray.shell([sys.executable] + candidate_argv(candidate, spec, nonce, cargs), num_gpus=share,
                                  hooks="triton", timeout=600)
    else:
        env = krex.ray.runtime_env(hooks="triton") if mode in ("krex", "pergpubusy", "pergpukrex") else None
        task = ray.remote(num_gpus=share, max_retries=0, runtime_env=env)(evaluate)

        def launch(spec, nonce):
            return task.remote(candidate, spec, nonce, cargs)

    before = krex_counters(sock) if mode in KREX_MODES else {}
    neighbour = T.start_neighbour(dict(os.environ), Path(sock).parent, mode) if mode == "pergpubusy" else None
    try:
        rows = run_tasks(ray, launch, mode, agents, specs, budget_s, nonce_base)
    finally:             # never a neighbour left busy on the GPU
        if neighbour:
            T.stop_neighbour(*neighbour)
    wall = max((r["start_s"] + r["wall_s"] for r in rows), default=0.0)
    ok = [r for r in rows if r.get("exit") == 0 and "candidate_ms" in r]
    after = krex_counters(sock) if mode in KREX_MODES else {}
    return {"mode": mode, "agents": agents, "num_gpus": share, "candidate_args": cargs, "wall_s": wall,
            "commands": len(ok),
            "failed": len(rows) - len(ok), "commands_per_min": 60 * len(ok) / wall if wall else 0.0,
            "counters": {k: after.get(k, 0) - before.get(k, 0) for k in after}, "rows": rows}


def run_tasks(ray, launch, mode: str, agents: int, specs: list, budget_s: float, nonce_base: int) -> list:
    """Each agent's evaluations one after another, agents at once, until the budget: the rows."""
    todo, inflight, rows = list(enumerate(specs)), {}, []
    t_start = time.monotonic()

    def submit() -> None:
        idx, spec = todo.pop(0)
        inflight[launch(spec, nonce_base + idx)] = (idx, spec, time.monotonic())

    for _ in range(min(agents, len(todo))):
        submit()
    while inflight:
        done, _ = ray.wait(list(inflight), num_returns=1, timeout=900)
        if not done:
            raise SystemExit(f"{mode}: no task finished in 900 s")
        idx, spec, t0 = inflight.pop(done[0])
        t1 = time.monotonic()
        try:
            res = ray.get(done[0])
            row = shell_row(res) if mode == "shell" else res
        except Exception as e:                 # a task that died: a failed row
            row = {"exit": -1, "error": repr(e)[-2000:]}
        row.update(idx=idx, **spec, start_s=t0 - t_start, wall_s=t1 - t0)
        rows.append(row)
        if todo and time.monotonic() - t_start < budget_s:
            submit()
    return rows


def clean_row(row: dict) -> bool:
    regs = row.get("regions") or []
    return bool(regs) and all(x.get("exclusive") and x.get("clean") for x in regs)


def fidelity(runs: list, stable_pct: float = 2.0, reference: str = "pergpu") -> dict:
    """With two passes of the reference mode (the first and the last of the plan): the same-run floor per
    bucket, and per mode the p95 |inflation| against it (krex modes: the evaluations whose regions were all
    exclusive and clean), the median signed inflation (negative: faster than the reference) and, per kernel,
    what makes each tail (throughput.per_kernel)."""
    passes = [r["rows"] for r in runs if r["mode"] == reference]
    if len(passes) < 2:
        return {}
    ref = T.reference_passes(passes, stable_pct)
    modes = {}
    for i, r in enumerate(runs):
        if r["mode"] in REFERENCE_MODES:
            continue
        clean = clean_row if r["mode"] in KREX_MODES else None
        modes[f"{r['mode']}#{i}"] = T.judge(r["rows"], ref, clean)
        modes[f"{r['mode']}#{i}"]["median_signed_pct"] = T.signed_medians(r["rows"], ref["stable"], clean)
        modes[f"{r['mode']}#{i}"]["per_kernel"] = T.per_kernel(r["rows"], ref["stable"], clean)
    return {"reference": reference,
            **{k: v for k, v in ref.items() if k not in ("stable", "pass_medians") + T.FLOOR_PRIVATE},
            "modes": modes}


def analyse(runs: list) -> list:
    truth: dict = {}
    for r in runs:
        if r["mode"] == "pergpu":
            for row in r["rows"]:
                for k in ("candidate", "reference"):
                    if f"{k}_ms" in row:
                        truth.setdefault((*kernel_of(row), k), []).append(row[f"{k}_ms"])
    iso = {key: statistics.median(v) for key, v in truth.items()}
    summary = []
    for r in runs:
        infl: dict = {name: [] for name, _, _ in BUCKETS}
        regions = []
        for row in r["rows"]:
            regions += row.get("regions", [])
            for k in ("candidate", "reference"):
                ref = iso.get((*kernel_of(row), k))
                if ref and f"{k}_ms" in row:
                    infl[bucket(ref)].append(row[f"{k}_ms"] / ref - 1)
        ok = [row for row in r["rows"] if "candidate_ms" in row]
        s = {"mode": r["mode"], "agents": r["agents"], "num_gpus": r["num_gpus"], "commands": r["commands"],
             "failed": r["failed"], "wall_s": round(r["wall_s"], 2), "commands_per_min": round(r["commands_per_min"], 2),
             "mean_task_wall_s": round(statistics.mean(row["wall_s"] for row in ok), 3) if ok else None,
             "p95_inflation": {b: p95(v) for b, v in infl.items()},
             "median_inflation": {b: (statistics.median(v) if v else float("nan")) for b, v in infl.items()},
             "kernels": {b: len(v) for b, v in infl.items()}}
        if r["mode"] in KREX_MODES:
            s.update(regions=len(regions), regions_exclusive=sum(bool(x.get("exclusive")) for x in regions),
                     regions_clean=sum(bool(x.get("clean")) for x in regions),
                     taints=sorted({t for x in regions for t in x.get("taints", [])}),
                     region_clock_mhz=T.clock_summary((x.get("sm_clock_mhz") or [None])[0] for x in regions),
                     controller=r["counters"])
        summary.append(s)
    per_gpu = next((s["commands_per_min"] for s in summary if s["mode"] == "pergpu"), None)
    for s in summary:
        s["vs_pergpu"] = round(s["commands_per_min"] / per_gpu, 3) if per_gpu else None
    return summary


def start_controller(sock: Path, log: Path, extra: tuple = ()) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock), *extra], env=env,
                           stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not sock.exists():
        if ctl.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the controller did not start (see {log})")
        time.sleep(0.05)
    return ctl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--plan", default="pergpu,naive,krex,shell", help=f"modes in order, of {', '.join(MODES)}")
    ap.add_argument("--specs", type=int, default=16, help="candidate evaluations per mode (pergpu: one per kind)")
    ap.add_argument("--variants", type=int, default=2, help="kernel variants per size (1-4)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mix", default=None,
                    help="[OP@]SIZE[/VARIANT]:WEIGHT,... the evaluations' matmul sizes and how often each is drawn "
                         "(default: bench/throughput.py's mix, 1024 to 16384); sum@N: bench/candidate.py --op sum "
                         "(as bench/freeze_policy.py's --mix); SIZE/VARIANT: every evaluation of that "
                         "size times that variant (e.g. 8192/1 and 16384/1: the variant-0 candidates' times move "
                         "with where their operands land, docs/measurements/freeze-policy.md)")
    ap.add_argument("--budget", type=float, default=90.0, help="seconds per mode before agents stop taking work")
    ap.add_argument("--gpus", type=float, default=1, help="the GPUs Ray is told the node has")
    ap.add_argument("--repeat", type=int, default=1, help="timings per kernel per evaluation (candidate --repeat)")
    T.add_reference_options(ap, "evaluation")    # in the --reference mode's passes only
    ap.add_argument("--candidate", default=str(ROOT / "bench" / "candidate.py"),
                    help="the candidate script (a stand-in for dry runs)")
    ap.add_argument("--logs", default=None, help="directory for the controller's and Ray's logs")
    ap.add_argument("--reference", choices=REFERENCE_MODES, default=None,
                    help="the mode whose first and last passes are the ground truth and the floor (the others, "
                         "with two passes in the plan, are shown beside it in fidelity_other)")
    ap.add_argument("--neighbour", default=None,
                    help="pergpubusy's neighbour script (args STOP READY; default bench/contender.py)")
    T.add_timing_options(ap, "evaluation")
    ap.add_argument("--controller-args", default="",
                    help="more options for the krex controller, one string (e.g. \"--region-gap-ms 200\")")
    ap.add_argument("--out", help="the result file (required unless --reanalyse)")
    ap.add_argument("--reanalyse", metavar="RESULT", default=None,
                    help="run nothing: recompute a result's summary and fidelity (with --reference) and print them")
    args = ap.parse_args()
    if args.reanalyse:
        data = read_result(ap, args.reanalyse)
        fid = fidelity(data["runs"], reference=args.reference or (data.get("fidelity") or {}).get("reference", "pergpu"))
        print(json.dumps({"summary": analyse(data["runs"]), "fidelity": fid}, indent=1))
        return
    if not args.out:
        ap.error("--out is required (or --reanalyse RESULT)")
    args.reference = args.reference or "pergpu"
    plan = args.plan.split(",")
    CANDIDATE_ARGS[:] = ["--repeat", str(max(1, args.repeat))] + T.timing_args(ap, args)
    if args.neighbour:
        T.NEIGHBOUR[:] = [os.path.abspath(args.neighbour)]
    if any(m not in MODES for m in plan) or args.agents < 1:
        ap.error(f"--plan: modes of {', '.join(MODES)}; --agents >= 1")
    T.check_reference_options(ap, args)
    ref_work = T.reference_args(args) or args.reference_processes > 1
    if ref_work and args.reference not in plan:
        ap.error(f"--reference-repeat, --reference-processes and --reference-holder-gib act on the --reference "
                 f"mode's passes, and {args.reference} is not in --plan")
    if ref_work and args.reference == "pergpu" and "pergpu" in plan:
        ap.error("--reference-repeat, --reference-processes or --reference-holder-gib with --reference pergpu: "
                 "pergpu is also the throughput baseline, so its work must match krex's; judge by pergpukrex or "
                 "pergpubusy")
    if args.mix:
        MIX[:] = parse_mix(args.mix, ap)
    T.check_compiler(ap, args, MIX)
    specs = make_specs(args.specs, args.seed, max(1, min(4, args.variants)))
    candidate = os.path.abspath(args.candidate)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="ray-fleet-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ray-fleet-"))
    sock = tmp / "krex.sock"
    ctl = start_controller(sock, logs / "controller.log", tuple(shlex.split(args.controller_args)))
    os.environ.update(KREX_SOCKET=str(sock), RAY_USAGE_STATS_ENABLED="0")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    import ray

    runs = []
    try:
        ray.init(num_cpus=os.cpu_count(), num_gpus=args.gpus, include_dashboard=False, log_to_driver=False,
                 _temp_dir=str(tmp / "ray"))
        for i, mode in enumerate(plan):
            r = run_mode(ray, mode, args.agents, specs, args.budget, candidate, 1000 * (i + 1) + args.nonce_offset,
                         str(sock),
                         mode_args(mode, args.reference, T.reference_args(args)),
                         args.reference_processes if mode == args.reference else 1)
            runs.append(r)
            Path(args.out).write_text(json.dumps({"plan": plan, "specs": specs, "runs": runs, "partial": True,
                                                  "summary": analyse(runs),
                                                  "fidelity": fidelity(runs, reference=args.reference)}, indent=1))
            print(f"{mode}: {r['commands']} evaluations ({r['failed']} failed) in {r['wall_s']:.1f} s = "
                  f"{r['commands_per_min']:.1f}/min", flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        ctl.terminate()
        ctl.wait(60)
        subprocess.run(["cp", "-r", str(tmp / "ray" / "session_latest" / "logs"), str(logs / "ray")],
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    summary = analyse(runs)
    fid = fidelity(runs, reference=args.reference)
    other = {m: fidelity(runs, reference=m) for m in REFERENCE_MODES if m != args.reference and m in plan}
    Path(args.out).write_text(json.dumps({"plan": plan, "specs": specs, "runs": runs, "summary": summary,
                                          "fidelity": fid, "fidelity_other": other,
                                          "env": {"python": sys.version, "argv": sys.argv,
                                                  "ray": ray.__version__}}, indent=1))
    print(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in fid.items() if k != "unstable"}, indent=1))


if __name__ == "__main__":
    main()
