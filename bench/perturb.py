"""Does GPU work that is not a submission disturb a timed kernel? A process times torch matmuls with
triton.testing.do_bench while, by turns, nothing else runs ("quiet"), other processes create a CUDA
context, allocate 1 MiB and exit in a loop ("ctx": what every cold command and every new warm worker does
at start and end, and what krex does not gate), or one process allocates and frees 256 MiB in a loop
("alloc"). No disturber launches anything, so a region's closed gate and drain would not stop them.
Rounds interleave the conditions; the report gives each size's median per condition and its shift
against quiet. With --region (run it under `krex run`, a controller up) each do_bench is a krex region
and the disturbers run under `krex run` too: what krex's gates leave of the disturbance.
    python bench/perturb.py --rounds 6 --out bench/results/perturb-h200.json
    krex run -- python bench/perturb.py --region --out bench/results/perturb-krex-h200.json"""

import argparse
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import time

SIZES = (2048, 4096, 8192, 16384)   # fp16 matmul on an H200: ~0.03, 0.2, 1.6, 13 ms


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def __call__(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc:
            raise RuntimeError(f"{name} failed: CUDA error {rc}")

    def context(self) -> None:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self("cuInit", 0)
        self("cuDeviceGet", ctypes.byref(dev), 0)
        self("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self("cuCtxSetCurrent", ctx)


def disturb(kind: str, par: int) -> None:
    """Run until SIGTERM; print how many contexts (or allocations, or bursts) were made.
    ctx: par children at a time, each creates a context, allocates 1 MiB and exits; exitbig: the same holding
    4 GiB when it exits; alloc: allocate and free 256 MiB in a loop; load: bf16 matmuls back to back (heat and
    power draw before the next region); bursts: 0.5 s of matmuls every 2 s (run outside krex: a foreign
    process)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    cuda, count = Cuda(), 0
    if kind in ("load", "bursts"):
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop:
            if kind == "bursts":
                time.sleep(1.5)
            t0 = time.monotonic()
            while not stop and (kind == "load" or time.monotonic() - t0 < 0.5):
                for _ in range(4):
                    torch.mm(a, a)
                torch.cuda.synchronize()
                count += 4 if kind == "load" else 0
            count += kind == "bursts"
        print(count, flush=True)
        return
    if kind == "alloc":
        cuda.context()
        p = ctypes.c_uint64()
        while not stop:
            cuda("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(256 << 20))
            cuda("cuMemFree_v2", p)
            count += 1
    else:   # ctx, exitbig: par children at a time, each creates a context, allocates and exits
        size = (4 << 30) if kind == "exitbig" else (1 << 20)
        kids = set()
        while not stop or kids:
            while not stop and len(kids) < par:
                pid = os.fork()
                if pid == 0:
                    try:
                        cuda.context()
                        p = ctypes.c_uint64()
                        cuda("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
                        cuda("cuMemsetD8_v2", p, ctypes.c_ubyte(1), ctypes.c_size_t(size))
                        os._exit(0)
                    except BaseException:
                        os._exit(1)
                kids.add(pid)
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            kids.discard(pid)
            count += status == 0
    print(count, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--par", type=int, default=4, help="ctx: processes creating contexts at once")
    ap.add_argument("--conditions", default="quiet,ctx,alloc", help="quiet, ctx, exitbig, alloc, load, bursts")
    ap.add_argument("--region", action="store_true",
                    help="time inside krex regions, disturbers under krex run (run this under krex run)")
    ap.add_argument("--disturb", choices=("ctx", "exitbig", "alloc", "load", "bursts"), help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.disturb:
        return disturb(args.disturb, args.par)
    import torch
    from triton.testing import do_bench
    mats = {n: (torch.randn(n, n, device="cuda", dtype=torch.float16),
                torch.randn(n, n, device="cuda", dtype=torch.float16)) for n in SIZES}
    for a, b in mats.values():
        torch.matmul(a, b)
    torch.cuda.synchronize()
    conds = args.conditions.split(",")
    timed = contextlib.nullcontext
    wrap = []
    if args.region:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import krex
        timed = lambda: krex.region("perturb")   # noqa: E731
        wrap = [sys.executable, "-m", "krex_ctl", "run", "--"]
    rows = []
    for r in range(args.rounds):
        for cond in conds:
            proc = None
            if cond != "quiet":
                if cond == "bursts":     # outside krex altogether: no shim, no job
                    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
                    cmd = [sys.executable, __file__, "--disturb", cond]
                else:
                    env = dict(os.environ, KREX_LOG_LEVEL="error")    # thousands of processes
                    cmd = wrap + [sys.executable, __file__, "--disturb", cond, "--par", str(args.par)]
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
                time.sleep(0.5 if cond not in ("load", "bursts") else 6)   # under way (torch imported)
            t0 = time.monotonic()
            for n, (a, b) in mats.items():
                with timed() as reg:
                    ms = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100)
                rows.append({"round": r, "cond": cond, "size": n, "ms": ms})
                if args.region and reg.info is not None:
                    rows[-1].update(clean=reg.clean, exclusive=reg.exclusive, taints=reg.taints,
                                    sm_clock_mhz=reg.sm_clock_mhz)
            busy = time.monotonic() - t0
            if proc:
                (os.killpg if args.region else os.kill)(proc.pid, signal.SIGTERM)
                out, _ = proc.communicate(timeout=60)
                rows[-1]["events"] = int(out.strip() or 0)
                rows[-1]["events_per_s"] = round(int(out.strip() or 0) / (busy + 0.5), 1)
            print(f"round {r} {cond:6}", " ".join(f"{x['ms']:.4f}" for x in rows[-len(mats):]),
                  f"events/s {rows[-1].get('events_per_s', 0)}", flush=True)
    summary = {}
    for n in SIZES:
        quiet = statistics.median(x["ms"] for x in rows if x["size"] == n and x["cond"] == "quiet")
        for cond in conds:
            xs = [x["ms"] for x in rows if x["size"] == n and x["cond"] == cond]
            summary[f"{n}/{cond}"] = {"median_ms": statistics.median(xs),
                                      "median_shift": statistics.median(xs) / quiet - 1,
                                      "max_shift": max(xs) / quiet - 1,
                                      "flagged": sum(x.get("clean") is False for x in rows
                                                     if x["size"] == n and x["cond"] == cond),
                                      "moved_2pct": sum(abs(x["ms"] / quiet - 1) > 0.02 for x in rows
                                                        if x["size"] == n and x["cond"] == cond),
                                      "moved_and_flagged": sum(abs(x["ms"] / quiet - 1) > 0.02 and x.get("clean")
                                                               is False for x in rows
                                                               if x["size"] == n and x["cond"] == cond)}
    print(f"{'size':>6} {'cond':8} {'median ms':>10} {'median':>8} {'max':>8} {'flagged':>8} {'moved':>6} {'m&f':>4}")
    for k, v in summary.items():
        n, cond = k.split("/")
        print(f"{n:>6} {cond:8} {v['median_ms']:10.4f} {v['median_shift']*100:+7.2f}% {v['max_shift']*100:+7.2f}% "
              f"{v['flagged']:>8} {v['moved_2pct']:>6} {v['moved_and_flagged']:>4}")
    rate = {c: statistics.median(x["events_per_s"] for x in rows if x["cond"] == c and "events_per_s" in x)
            for c in conds if c != "quiet"}
    print("disturber events per second:", rate)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"argv": sys.argv, "region": args.region, "rows": rows, "summary": summary, "events_per_s": rate,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
