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
    """Run until SIGTERM; print how many contexts (or allocations) were made."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    cuda, count = Cuda(), 0
    if kind == "alloc":
        cuda.context()
        p = ctypes.c_uint64()
        while not stop:
            cuda("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(256 << 20))
            cuda("cuMemFree_v2", p)
            count += 1
    else:   # ctx: par children at a time, each creates a context, allocates 1 MiB and exits
        kids = set()
        while not stop or kids:
            while not stop and len(kids) < par:
                pid = os.fork()
                if pid == 0:
                    try:
                        cuda.context()
                        cuda("cuMemAlloc_v2", ctypes.byref(ctypes.c_uint64()), ctypes.c_size_t(1 << 20))
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
    ap.add_argument("--conditions", default="quiet,ctx,alloc")
    ap.add_argument("--region", action="store_true",
                    help="time inside krex regions, disturbers under krex run (run this under krex run)")
    ap.add_argument("--disturb", choices=("ctx", "alloc"), help=argparse.SUPPRESS)
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
                proc = subprocess.Popen(wrap + [sys.executable, __file__, "--disturb", cond, "--par", str(args.par)],
                                        env=dict(os.environ, KREX_LOG_LEVEL="error"),   # thousands of processes
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
                time.sleep(0.5)   # under way
            t0 = time.monotonic()
            for n, (a, b) in mats.items():
                with timed():
                    ms = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100)
                rows.append({"round": r, "cond": cond, "size": n, "ms": ms})
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
                                      "max_shift": max(xs) / quiet - 1}
    print(f"{'size':>6} {'cond':6} {'median ms':>10} {'median':>8} {'max':>8}")
    for k, v in summary.items():
        n, cond = k.split("/")
        print(f"{n:>6} {cond:6} {v['median_ms']:10.4f} {v['median_shift']*100:+7.2f}% {v['max_shift']*100:+7.2f}%")
    rate = {c: statistics.median(x["events_per_s"] for x in rows if x["cond"] == c and "events_per_s" in x)
            for c in conds if c != "quiet"}
    print("disturber events per second:", rate)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"argv": sys.argv, "region": args.region, "rows": rows, "summary": summary, "events_per_s": rate,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
