"""The overlap controls on real NCCL collectives: torchrun ranks each running bf16 GEMMs overlapped with an
asynchronous all_reduce or all_gather of 64-512 MiB, serial and overlapped, with no control and with each of
`krex run --overlap`'s controls (priority, shape=K, sm_target=N) and NCCL's own knobs (NCCL_MAX_CTAS,
NCCL_CGA_CLUSTER_SIZE=1). Timed with CUDA events and a barrier before each trial.

    python bench/nccl_overlap.py --nproc 2 --out /tmp/krex-out/nccl-overlap.json      # nvidia-h200-x2
    python bench/nccl_overlap.py --nproc 1 --quick --out /tmp/o.json                    # a dry run on one GPU

Each variant is one `krex run [--overlap C] -- python -m torch.distributed.run --nproc_per_node N
bench/nccl_overlap.py --worker ...` (its own processes, its own report); rank 0 writes the variant's numbers.
Cases per collective and message size: `balanced` (GEMMs about as long as the collective), `compute` (twice
as long) and `comm` (half as long), the GEMM count calibrated on the variant's own first pass with no overlap.
Goals (where compute is about equal to communication): the best control cuts total time by >= 25.5% against
serial and beats overlapped-without-controls; no control is slower than no control by more than 1%.
NVLink multicast stays off in every process (the variables in SAFE)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# (name, krex run --overlap value or None, extra environment). The controls raw (noguard: every eligible launch
# changed), as this benchmark measures each control itself; the overlap guard (on by default) is measured by
# bench/overlap_proxy.py's guard+ variants
VARIANTS = [
    ("serial", None, {}),
    ("off", None, {}),
    ("priority", "priority,noguard", {}),
    ("priority+shape=1", "priority,shape=1,noguard", {}),
    ("priority+shape=2", "priority,shape=2,noguard", {}),
    ("priority+shape=4", "priority,shape=4,noguard", {}),
    ("shape=2", "shape=2,noguard", {}),
    ("nccl-max-ctas=8", None, {"NCCL_MAX_CTAS": "8"}),
    ("nccl-cga-1", None, {"NCCL_CGA_CLUSTER_SIZE": "1"}),
    ("priority+nccl-cga-1", "priority,noguard", {"NCCL_CGA_CLUSTER_SIZE": "1"}),
    ("sm_target=116", "sm_target=116", {}),
    ("priority+sm_target=116", "priority,sm_target=116,noguard", {}),
]


# ---- the worker (one torchrun rank) --------------------------------------------------------------------
def worker(args) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    gemm_n = args.gemm_size
    a = torch.randn(gemm_n, gemm_n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(gemm_n, gemm_n, device=dev, dtype=torch.bfloat16)
    out = torch.empty(gemm_n, gemm_n, device=dev, dtype=torch.bfloat16)

    def timed(fn, trials: int) -> list[float]:
        times = []
        for _ in range(trials):
            dist.barrier()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return times

    def gemms(k: int):
        for _ in range(k):
            torch.matmul(a, b, out=out)

    results = []
    for coll in args.collectives.split(","):
        for mib in [int(m) for m in args.sizes.split(",")]:
            elems = mib * (1 << 20) // 2
            if coll == "all_reduce":
                buf = torch.randn(elems, device=dev, dtype=torch.bfloat16)
                comm = lambda async_op=False: dist.all_reduce(buf, async_op=async_op)  # noqa: E731
            else:
                part = torch.randn(elems // world, device=dev, dtype=torch.bfloat16)
                full = torch.empty(part.numel() * world, device=dev, dtype=torch.bfloat16)
                comm = lambda async_op=False: dist.all_gather_into_tensor(full, part, async_op=async_op)  # noqa: E731
            for _ in range(3):               # warm-up: NCCL's channels, cuBLAS's handle
                comm()
                gemms(1)
            comm_ms = statistics.median(timed(comm, args.trials))
            one_ms = statistics.median(timed(lambda: gemms(1), args.trials))
            for case, ratio in (("balanced", 1.0), ("compute", 2.0), ("comm", 0.5)):
                k = max(1, round(ratio * comm_ms / max(one_ms, 1e-3)))
                compute_ms = statistics.median(timed(lambda: gemms(k), args.trials))
                if args.mode == "serial":
                    fn = lambda: (comm(), gemms(k))  # noqa: E731
                else:
                    def fn():
                        work = comm(async_op=True)
                        gemms(k)
                        work.wait()
                total = timed(fn, args.trials)
                results.append({"collective": coll, "mib": mib, "case": case, "gemms": k, "comm_alone_ms": comm_ms,
                                "compute_alone_ms": compute_ms, "total_ms": statistics.median(total),
                                "total_ms_all": total})
    if rank == 0:
        Path(args.result).write_text(json.dumps({"world": world, "mode": args.mode, "results": results}))
    dist.destroy_process_group()


# ---- the orchestrator -------------------------------------------------------------------------------------
def variant_command(args, name: str, overlap, report: Path, result: Path) -> list:
    cmd = [sys.executable, "-m", "krex_ctl", "run", "--cold", "--report", str(report)]
    if overlap:
        cmd += ["--overlap", overlap]
    cmd += ["--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
            str(Path(__file__).resolve()), "--worker", "--mode", "serial" if name == "serial" else "overlap",
            "--sizes", args.sizes, "--collectives", args.collectives, "--trials", str(args.trials),
            "--gemm-size", str(args.gemm_size), "--result", str(result)]
    return cmd


def summarize(runs: dict) -> dict:
    """Per (collective, size, case): each variant's total against serial and against no control."""
    rows: dict = {}
    for name, run in runs.items():
        for r in (run or {}).get("results", []):
            key = f"{r['collective']}-{r['mib']}MiB-{r['case']}"
            rows.setdefault(key, {})[name] = r
    out = {}
    for key, by in rows.items():
        serial, off = by.get("serial"), by.get("off")
        if not serial or not off:
            continue
        entry = {"serial_ms": serial["total_ms"], "off_ms": off["total_ms"],
                 "comm_alone_ms": off["comm_alone_ms"], "compute_alone_ms": off["compute_alone_ms"], "variants": {}}
        for name, r in by.items():
            entry["variants"][name] = {"total_ms": r["total_ms"], "vs_serial": r["total_ms"] / serial["total_ms"],
                                       "vs_off": r["total_ms"] / off["total_ms"]}
        controls = {n: v for n, v in entry["variants"].items() if n not in ("serial", "off")}
        if controls:
            best = min(controls, key=lambda n: controls[n]["total_ms"])
            worst = max(controls, key=lambda n: controls[n]["vs_off"])
            entry.update(best=best, best_cut_vs_serial=1 - controls[best]["vs_serial"],
                         best_beats_off=controls[best]["vs_off"] < 1.0, worst=worst,
                         worst_vs_off=controls[worst]["vs_off"])
        out[key] = entry
    balanced = [e for k, e in out.items() if k.endswith("-balanced") and "best" in e]
    goals = {
        "balanced_best_cut_25.5pct": bool(balanced) and all(e["best_cut_vs_serial"] >= 0.255 for e in balanced),
        "balanced_best_beats_off": bool(balanced) and all(e["best_beats_off"] for e in balanced),
        "no_control_1pct_slower_than_off": all(e.get("worst_vs_off", 1.0) <= 1.01 for e in out.values()),
    }
    return {"cases": out, "goals": goals}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(summary["cases"])
    if not keys:
        return
    names = sorted({n for k in keys for n in summary["cases"][k]["variants"]})
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.9), 5))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ys = [summary["cases"][k]["variants"].get(n, {}).get("vs_serial", float("nan")) for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], ys, width, label=n)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1 - 0.255, color="r", lw=0.8, ls="--")
    ax.set_xticks([j + 0.4 for j in range(len(keys))])
    ax.set_xticklabels(keys, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("total time / serial")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="overlap", choices=["serial", "overlap"], help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs) per variant")
    ap.add_argument("--sizes", default="64,128,256,512", help="collective sizes in MiB")
    ap.add_argument("--collectives", default="all_reduce,all_gather")
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--variants", default=",".join(n for n, _, _ in VARIANTS))
    ap.add_argument("--quick", action="store_true", help="one size, one collective, few variants (a dry run)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per variant")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.out:
        ap.error("--out is required")
    if args.quick:
        args.sizes, args.collectives, args.trials = "64", "all_reduce", 5
        args.variants = "serial,off,priority,priority+shape=2,sm_target=116"
    wanted = args.variants.split(",")
    out = Path(args.out)
    work = out.parent / (out.stem + "-runs")
    work.mkdir(parents=True, exist_ok=True)
    runs, failures = {}, {}
    for name, overlap, extra in VARIANTS:
        if name not in wanted:
            continue
        result, report = work / f"{name}.json", work / f"{name}-report.json"
        env = dict(os.environ, **SAFE, **extra, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        t0 = time.monotonic()
        try:
            p = subprocess.run(variant_command(args, name, overlap, report, result), env=env, capture_output=True,
                               text=True, timeout=args.timeout)
            (work / f"{name}.log").write_text(p.stdout + p.stderr)
            ok = p.returncode == 0 and result.exists()
        except subprocess.TimeoutExpired:
            ok = False
            (work / f"{name}.log").write_text("timed out\n")
        print(f"{name}: {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)
        if ok:
            runs[name] = json.loads(result.read_text())
            if report.exists():
                runs[name]["overlap"] = json.loads(report.read_text()).get("overlap")
        else:
            failures[name] = (work / f"{name}.log").read_text()[-2000:]
    summary = summarize(runs)
    summary.update(nproc=args.nproc, failures=failures, runs=runs,
                   argv=sys.argv, safe=SAFE)
    out.write_text(json.dumps(summary, indent=1))
    try:
        plot(summary, out.with_suffix(".png"))
    except ImportError:
        pass
    print(json.dumps({"goals": summary["goals"], "failed": sorted(failures)}, indent=1))


if __name__ == "__main__":
    main()
