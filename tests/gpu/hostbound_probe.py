"""tests/gpu/hostbound_probe.py: the host-bound check (KREX_HOST_BOUND=1) on a real GPU, run under `krex run`.

Cases, each in its own region, each timing read inside the region (16 timings unless said):
  gpu      a 8192 bf16 matmul queued ahead of the start event, then a small kernel: the GPU never waits (expect late 0)
  host     synchronize, record start, sleep 1 ms on the host, launch the kernel, record end (expect every one late)
  end      as gpu, then 3 ms of host time before the end is recorded (expect every one late: the GPU waited for it)
  syncend  an 8192 matmul timed with a synchronize before the end record: the host's return from it and the record
           (~20 us in Python) are in the 1.4 ms timing, over the check's 1%: late (H200 run 3: 16 of 16)
  synclong the same with eight 8192 matmuls (11 ms: 1% is 110 us): late 0 when the synchronize hook moves the end
           bound's start to the synchronize's return; without it the bound would be the whole 11 ms
  sync     KernelBench's loop: record start, kernel, record end, synchronize, read (the kernel on an idle stream)
  bench:K  triton.testing.do_bench of kernel K (small add, mm2048, mm8192): its repetitions' timings
  graph:K  do_bench_cudagraph: no host launch inside a timing (expect checked 0: graph launches are not checked)
and the check's cost: 20000 launches of a small kernel timed on the host inside a region (the same script with
the check off gives the reference: hostbound_h200.sh runs both). One JSON line per case on stdout."""
import json, os, sys, time
import torch, krex
from triton.testing import do_bench, do_bench_cudagraph

dev = torch.device("cuda")
x = torch.zeros(1 << 20, device=dev)
a2 = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
a8 = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
small = lambda: x.add_(1.0)
kernels = {"add1M": small, "mm2048": lambda: a2 @ a2, "mm8192": lambda: a8 @ a8}
for f in kernels.values():
    f()
torch.cuda.synchronize()


def out(case, r, **kw):
    print(json.dumps({"case": case, "check": os.environ.get("KREX_HOST_BOUND", "0"), "granted": r.granted,
                      "exclusive": r.exclusive, "checked": r.timings_checked, "late": r.timings_late,
                      "host_bound": r.host_bound, "sm_clock_mhz": r.sm_clock_mhz, **kw}), flush=True)


def pairs(n=16):
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def timed(case, before=lambda: None, between=lambda: None, fn=small, after_fn=lambda: None):
    """One region of 16 timings read at its end: before(), start, between(), fn(), after_fn(), end."""
    with krex.region(case) as r:
        ev = pairs()
        for s, e in ev:
            before()
            s.record(); between(); fn(); after_fn(); e.record()
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in ev)
    out(case, r, median_ms=ms[len(ms) // 2])


timed("gpu", before=lambda: a8 @ a8)    # the GPU is busy when the start is recorded and the kernel launched
timed("host", before=torch.cuda.synchronize, between=lambda: time.sleep(0.001))
timed("end", before=lambda: a8 @ a8, after_fn=lambda: time.sleep(0.003))
timed("syncend", fn=lambda: a8 @ a8, after_fn=torch.cuda.synchronize)
timed("synclong", fn=lambda: [a8 @ a8 for _ in range(8)], after_fn=torch.cuda.synchronize)

with krex.region("sync") as r:
    ms = []
    for s, e in pairs():
        s.record(); a2 @ a2; e.record()
        torch.cuda.synchronize()
        ms.append(s.elapsed_time(e))
out("sync", r, median_ms=sorted(ms)[len(ms) // 2])

for k, f in kernels.items():
    for rep in range(3):
        with krex.region(f"bench:{k}") as r:
            ms = do_bench(f, warmup=25, rep=100)
        out(f"bench:{k}", r, ms=ms, rep=rep)
    with krex.region(f"graph:{k}") as r:
        ms = do_bench_cudagraph(f, rep=20)
    out(f"graph:{k}", r, ms=ms)

with krex.region("cost") as r:        # host time of 20000 launches: the check asks cuEventQuery only after a
    t = time.perf_counter()           # record, so records interleave (one per 10 launches, as a timed loop would)
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(2000)]
    for i in range(20000):
        if i % 10 == 0:
            evs[i // 10].record()
        small()
    host_s = time.perf_counter() - t
    torch.cuda.synchronize()
out("cost", r, host_us_per_launch=host_s / 20000 * 1e6)
