"""What the GPU's state at the start of a region does to a short kernel's time, and what brings every region
to one state: the SM clock's ramp from idle (read on the GPU by a canary kernel: clock64 ticks per
globaltimer ns), and a KernelBench-style timing loop (L2 flush, CUDA events, a synchronize per trial) after
an idle GPU, after a spin warm-up of X ms, after this process's own heavy work, and after another process's
heavy work (a context switch, as at a region's hand-off), and after that followed by a spin or a sleep; and
the SM clock's recovery after another process's heavy work (canary spins back to back for 300 ms).

    python bench/region_start.py --out /tmp/krex-out/region-start.json

The canary is the PTX kernel the shim uses (shim/canary_ptx.h, read from there), loaded through libcuda
with ctypes into torch's context: what is measured here is what the shim runs."""

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def canary_ptx() -> bytes:
    text = (ROOT / "shim" / "canary_ptx.h").read_text()
    body = re.search(r'KREX_CANARY_PTX\[\]\s*=\s*((?:\s*"(?:[^"\\]|\\.)*")+)', text).group(1)
    return "".join(bytes(s, "utf-8").decode("unicode_escape") for s in re.findall(r'"((?:[^"\\]|\\.)*)"', body)).encode() + b"\0"


class Canary:
    """krex_spin(out, ns) on every SM: each block spins ns of globaltimer and writes (start ns, elapsed ns, clock64
    ticks); ticks / ns is the SM clock in GHz while it ran."""

    def __init__(self, torch):
        self.torch = torch
        self.cu = ctypes.CDLL("libcuda.so.1")
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        rc = self.cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(canary_ptx()))
        assert rc == 0, f"cuModuleLoadData {rc}"
        rc = self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"krex_spin")
        assert rc == 0, f"cuModuleGetFunction {rc}"
        self.fn = fn
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.buf = torch.zeros((4096, self.sms, 3), dtype=torch.int64, device="cuda")

    def launch(self, ns: int, slot: int = 0) -> None:
        out = ctypes.c_uint64(self.buf[slot].data_ptr())
        lim = ctypes.c_uint64(ns)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(out), ctypes.addressof(lim))
        stream = ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)
        rc = self.cu.cuLaunchKernel(self.fn, self.sms, 1, 1, 32, 1, 1, 0, stream, params, None)
        assert rc == 0, f"cuLaunchKernel {rc}"

    def read(self, slots: int) -> list:
        """(start ns, MHz) of each slot, the median over the SMs"""
        self.torch.cuda.synchronize()
        b = self.buf[:slots].cpu().tolist()
        return [(statistics.median(s[0] for s in row), statistics.median(1e3 * s[2] / max(s[1], 1) for s in row))
                for row in b]


def kb_loop(torch, fn, args, warmup=3, trials=20) -> list:
    """KernelBench's time_execution_with_cuda_event, inlined (its L2 flush included)"""
    for _ in range(warmup):
        fn(*args)
        torch.cuda.synchronize()
    torch.cuda.empty_cache()
    times = []
    for _ in range(trials + 1):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dummy = torch.empty((32, 1024, 1024), dtype=torch.int64, device="cuda")
        dummy.fill_(42)
        del dummy
        s.record()
        fn(*args)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times[1:]


OTHER = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    t = time.monotonic()
    while time.monotonic() - t < float(line):
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
    print("done", flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle-s", type=float, default=1.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conds", default="idle,spin1ms,spin5ms,spin20ms,spin100ms,busy_self,busy_other",
                    help="what comes before each timing loop: idle, spinXms, sleepXms, busy_self, busy_other, joined by +")
    ap.add_argument("--busy-s", type=float, default=0.3, help="seconds of heavy matmuls in busy_self/busy_other")
    ap.add_argument("--items", default="", help="only these items (default: all)")
    ap.add_argument("--kb-items", default="", help="KernelBench PROBLEM:DTYPE items too (needs --kernelbench)")
    ap.add_argument("--kernelbench", default=str(ROOT / ".kb"))
    args = ap.parse_args()
    import torch
    from krex_ctl import nvml
    nv = nvml.open_nvml()
    clock = (lambda: nv.sm_clock(0)) if nv else (lambda: None)
    can = Canary(torch)
    res = {"sms": can.sms, "gpu": torch.cuda.get_device_name(0)}

    # canary cost: one 20 us spin, launched and waited for
    cost = []
    for _ in range(50):
        t0 = time.perf_counter_ns()
        can.launch(20_000)
        torch.cuda.synchronize()
        cost.append((time.perf_counter_ns() - t0) / 1e3)
    res["canary_20us_cost_us"] = statistics.median(cost)

    # the ramp: after idle, 250 spins of 200 us back to back; and the decay: NVML clock after busy
    ramps = []
    for _ in range(args.repeats):
        time.sleep(args.idle_s)
        before = clock()
        for i in range(250):
            can.launch(200_000, i)
        rows = can.read(250)
        t0 = rows[0][0]
        ramps.append({"nvml_before": before, "curve": [(round((t - t0) / 1e6, 3), round(mhz)) for t, mhz in rows]})
    res["ramp"] = ramps
    decay = []
    t0 = time.monotonic()
    can.launch(300_000_000)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3:
        decay.append((round(time.monotonic() - t0, 3), clock()))
        time.sleep(0.02)
    res["decay_after_300ms_spin"] = decay

    other = subprocess.Popen([sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "NCCL_NVLS_ENABLE": "0"})
    assert other.stdout.readline().strip() == "ready"

    def busy_other(s: float) -> None:
        other.stdin.write(f"{s}\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "done"

    # recovery: after another process's heavy work, 1500 spins of 200 us back to back (300 ms)
    recov = []
    for _ in range(args.repeats):
        time.sleep(args.idle_s)
        busy_other(args.busy_s)
        before = clock()
        for i in range(1500):
            can.launch(200_000, i % 4096)
        rows = can.read(1500)
        t0 = rows[0][0]
        recov.append({"nvml_before": before, "curve": [(round((t - t0) / 1e6, 2), round(mhz)) for t, mhz in rows[::5]]})
    res["recovery_after_busy_other"] = recov

    items = {
        "matmul_TA_bf16_2048x8192x4096": (lambda a, b: torch.matmul(a.T, b),
                                          lambda: [torch.rand(8192, 2048, device="cuda", dtype=torch.bfloat16),
                                                   torch.rand(8192, 4096, device="cuda", dtype=torch.bfloat16)]),
        "matmul_bf16_4096": (torch.matmul, lambda: [torch.rand(4096, 4096, device="cuda", dtype=torch.bfloat16)] * 2),
        "matmul_fp32_4096": (torch.matmul, lambda: [torch.rand(4096, 4096, device="cuda")] * 2),
    }
    for item in filter(None, args.kb_items.split(",")):      # KernelBench problems, made as bench/kb_agent.py does
        sys.path.insert(0, str(ROOT / "bench"))
        import kb_agent
        problem, dtype = item.split(":")
        ctx = kb_agent.load_problem(os.path.join(args.kernelbench, "level1", problem))
        dt = getattr(torch, kb_agent.DTYPES[dtype])

        def make(ctx=ctx, dt=dt):
            torch.manual_seed(42)
            with torch.device("cuda"):
                return [x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                        for x in ctx["get_inputs"]()]
        model = ctx["Model"](*ctx["get_init_inputs"]()).to(device="cuda", dtype=dt)
        items[item] = (model, make)
    if args.items:
        items = {k: v for k, v in items.items() if k in args.items.split(",")}
    heavy = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    conds = args.conds.split(",")
    table = {}
    with torch.no_grad():
        for name, (fn, make) in items.items():
            inputs = make()
            kb_loop(torch, fn, inputs, 3, 5)
            for rep in range(args.repeats):
                for cond in conds:
                    time.sleep(args.idle_s)
                    for step in cond.split("+"):
                        if step.startswith("spin"):
                            can.launch(int(float(step[4:-2]) * 1e6))
                            torch.cuda.synchronize()
                        elif step.startswith("sleep"):
                            time.sleep(float(step[5:-2]) / 1e3)
                        elif step == "busy_self":
                            t = time.monotonic()
                            while time.monotonic() - t < args.busy_s:
                                for _ in range(4):
                                    heavy @ heavy
                                torch.cuda.synchronize()
                        elif step == "busy_other":
                            busy_other(args.busy_s)
                    before = clock()
                    times = kb_loop(torch, fn, inputs)
                    after = clock()
                    can.launch(20_000)
                    [(_, mhz)] = can.read(1)
                    table.setdefault(name, {}).setdefault(cond, []).append(
                        {"times": [round(x, 5) for x in times], "nvml_before": before, "nvml_after": after,
                         "canary_after_mhz": round(mhz)})
    other.stdin.close()
    other.wait(30)
    res["kb"] = table
    summary = {}
    for name, by in table.items():
        refc = "idle" if "idle" in by else None
        ref = statistics.median(statistics.median(r["times"]) for r in by[refc]) if refc else None
        for cond, runs in by.items():
            med = statistics.median(statistics.median(r["times"]) for r in runs)
            first = statistics.median(statistics.median(r["times"][:3]) for r in runs)
            summary.setdefault(name, {})[cond] = {
                "median_ms": round(med, 5), "first3_ms": round(first, 5),
                "vs_idle": round(med / ref - 1, 4) if ref else None,
                "spread": round(max(statistics.median(r["times"]) for r in runs) /
                                min(statistics.median(r["times"]) for r in runs) - 1, 4),
                "nvml_before": [r["nvml_before"] for r in runs]}
    res["summary"] = summary
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({"cost_us": res["canary_20us_cost_us"], "summary": summary}, indent=1))
    for r in ramps:
        c = r["curve"]
        print("ramp from", r["nvml_before"], "MHz:", [c[i] for i in (0, 1, 2, 5, 10, 25, 50, 100, 249)])
    print("decay:", decay[::10])
    for r in recov:
        c = r["curve"]
        print("recovery from", r["nvml_before"], "MHz:", [c[i] for i in (0, 1, 2, 5, 10, 20, 50, 100, 200, 299)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
