"""The overlap controls (krex run --overlap, docs/guide/overlap.md) on one GPU, with a proxy of communication:

    python bench/overlap_proxy.py --out $OUT            # every variant, one process each (tests/gpu/overlap_h200.sh)

The proxy of one NCCL collective is a copy kernel with an NCCL CTA's resources (80 KiB of dynamic shared
memory as its staging buffer, 512 threads, 16 or 66 CTAs), named like NCCL's kernels (ncclDevKernel_*) so the
shim takes it for communication. Its ring form makes each CTA wait, step by step, on a flag its predecessor
CTA writes (as ring steps wait across GPUs): a CTA that cannot start stalls the others, which spin. Beside it,
on another stream, bf16 GEMMs through cuBLAS, cuBLASLt or a Triton kernel.

Each case is timed alone (communication, compute), serial (one after the other on one stream) and
concurrent (two streams); the communication span is the copy stream's first-to-last event. Each repetition is
enqueued while the GPU spins (~10 ms), so what is timed is the GPU's span, not the host's enqueueing (before
that, the 24-GEMM pipeline cases of bench/overlap_search.py were host-bound: serial 1.7x the sum of its parts);
a repetition whose enqueueing outlasted the spin is counted (`overruns`, per measurement). A variant is one
set of controls, in its own process under `krex run --overlap CONTROLS` (or, without krex_ctl's cffi, with
the shim preloaded and KREX_OVERLAP set); `off` runs first and calibrates the balanced cases (copy count
chosen so communication alone takes about what compute alone takes); the other variants reuse its counts.
Every control list runs twice: raw (with `noguard`: every eligible launch changed, under the labels of the
first study) and guarded (`guard+...`: the same list without it, the overlap guard of shim/guard.c choosing).
The guard's epochs are communication launches (KREX_OVERLAP_GUARD_EPOCH, set to --guard-epoch, 6: one
repetition of a 6-copy case), so a guarded variant is measured over one whole guard cycle per case: its copy
launches are first brought to a cycle's start (tiny copies, nothing beside them), then the concurrent pattern
runs back to back for one cycle (128 epochs: its exploration, then what it chose), `steady` in the results,
its mean the cost of guarding included. `off` runs the same; guarded variants skip the alone and serial modes.
`off-again`, the last variant (its time kept back from the others), is off once more in its own process: the
same program twice is the noise floor a difference between two variants has to clear (floor_pct per case;
on the H200 the concurrent medians of identical programs differed by up to 9%). A variant whose krex report
shows that its controls changed no launch (`shape=K` where every GEMM is a cluster launch) is marked inert:
one more sample of off, never called best or worst.
A PyTorch training step (GEMMs, a backward pass and an all_reduce on one rank) is timed with controls off and
on (guarded, the default), alternating, for correctness and for what the controls cost when there is nothing
to overlap.

Writes OUT/overlap-summary.json (every number, each variant's krex report, the goals checked), OUT/overlap.png
and OUT/overlap-logs.tgz (each process's output). Goals (the issue): the best control turns each case where
concurrency loses (off's concurrent total above serial) into a win over serial; in a balanced case it cuts total time by >= 25.5% against
serial with the communication span within 1.5x of alone; controls on where nothing overlaps within 1% of off;
no guarded control slower than no control by more than 1% (steady means); no launch lost or failed because of a
control (report: fallbacks, and each process's checks)."""

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# name, GEMM size, GEMMs, GEMM backend, copy CTAs, copies of 256 MiB (0: calibrated to balance), ring form
CASES = {
    "4096": dict(n=4096, gemms=6, backend="cublas", ctas=16, copies=6, ring=False),
    "4096-lt": dict(n=4096, gemms=6, backend="cublaslt", ctas=16, copies=6, ring=False),
    "triton-4096": dict(n=4096, gemms=6, backend="triton", ctas=16, copies=6, ring=False),
    "8192": dict(n=8192, gemms=6, backend="cublas", ctas=16, copies=6, ring=False),
    "balanced": dict(n=8192, gemms=6, backend="cublaslt", ctas=16, copies=0, ring=False),
    "balanced-ring": dict(n=8192, gemms=6, backend="cublaslt", ctas=16, copies=0, ring=True),
    "4096-66cta": dict(n=4096, gemms=6, backend="cublaslt", ctas=66, copies=6, ring=False),
    "triton-balanced": dict(n=8192, gemms=6, backend="triton", ctas=16, copies=0, ring=False),
    # where concurrency can lose: less communication beside the 4096 GEMMs, and (late) the GEMMs launched
    # first, so that their blocks hold the SMs when the copy's CTAs arrive (a ring CTA left waiting stalls the rest)
    "4096-c2": dict(n=4096, gemms=6, backend="cublas", ctas=16, copies=2, ring=False),
    # the copy that lost to serial when measured without krex moved 1.5 GiB in 3.68 ms with 16 CTAs, twice this
    # proxy's rate per CTA (7.4 ms): fast=True loads four 16-byte words per thread before staging them, so that
    # more of each CTA's loads are in flight and it competes for memory bandwidth as that copy did
    "4096-fast": dict(n=4096, gemms=6, backend="cublas", ctas=16, copies=6, ring=False, fast=True),
    "4096-c2-late": dict(n=4096, gemms=6, backend="cublas", ctas=16, copies=2, ring=False, compute_first=True),
    "4096-ring-c2-late": dict(n=4096, gemms=6, backend="cublas", ctas=16, copies=2, ring=True, compute_first=True),
    "4096-66cta-c1-late": dict(n=4096, gemms=6, backend="cublaslt", ctas=66, copies=1, ring=False,
                               compute_first=True),
}
SMS = 132


def search_cases() -> dict:
    """Candidate cases where concurrency may lose to serial (bench/overlap_search.py times each without controls
    and keeps those that lose): the GEMMs through cuBLAS, cuBLASLt or a persistent Triton kernel (one program
    per SM looping over tiles, 160-192 KiB of shared memory: a program that cannot find an SM next to a copy CTA
    waits for it, as a persistent GEMM beside a collective does); 4096-sized x 6 or 2048-sized x 24; 16, 32 or 66
    copy CTAs, 1 or 2 copies; three orders: the copy first, the GEMMs first (late), or a pipeline (each copy
    waits for the GEMM before it, as a gradient's all-reduce waits for the backward GEMM that made it)."""
    out = {}
    for backend in ("cublas", "cublaslt", "triton-persistent"):
        for n, gemms in ((4096, 6), (2048, 24)):
            for ctas, copies in ((16, 1), (16, 2), (32, 1), (66, 1)):
                for order in ("first", "late", "pipe"):
                    name = f"s-{backend}-{n}x{gemms}-c{ctas}x{copies}-{order}"
                    out[name] = dict(n=n, gemms=gemms, backend=backend, ctas=ctas, copies=copies, ring=False,
                                     compute_first=order == "late", pipeline=order == "pipe")
    return out


SEARCH = search_cases()
ALL_CASES = {**CASES, **SEARCH}     # what --cases accepts
# label, KREX_OVERLAP (None: no controls), worker flags
RAW = [
    ("priority", "priority", []),
    ("priority+shape=1", "priority,shape=1", []),
    (f"priority+sm_target={SMS - 16}", f"priority,sm_target={SMS - 16}", []),
    (f"priority+shape=1+sm_target={SMS - 16}", f"priority,shape=1,sm_target={SMS - 16}", []),
    ("shape=1", "shape=1", []),
    (f"sm_target={SMS - 16}", f"sm_target={SMS - 16}", []),
    ("stream-priority", None, ["--copy-stream-priority"]),   # the program's own high-priority copy stream
    ("priority+shape=2", "priority,shape=2", []),
    ("shape=2", "shape=2", []),
    ("shape=4", "shape=4", []),
]


def guarded(controls) -> bool:
    """The overlap guard chooses for this list: a control on, and no noguard (shim/overlap.c)."""
    items = (controls or "").split(",")
    return "noguard" not in items and any(c == "priority" or c.startswith(("shape=", "sm_target=")) for c in items)


# off once more, in its own process, after every other variant: the same program twice is the noise floor that
# a difference between variants (each its own process) has to clear
FLOOR = "off-again"


# in this order: what is skipped when time runs out comes last; each raw list (noguard) then the same guarded
VARIANTS = [("off", None, [])]
for _label, _controls, _flags in RAW:
    VARIANTS.append((_label, f"{_controls},noguard" if guarded(_controls) else _controls, _flags))
    if guarded(_controls):
        VARIANTS.append((f"guard+{_label}", _controls, _flags))
VARIANTS.append((FLOOR, None, []))
TRAIN_CONTROLS = f"priority,shape=2,sm_target={SMS - 16}"      # guarded: the default
GUARD_EPOCH = 6                  # communication launches per guard epoch: one repetition of a 6-copy case
# epochs from one exploration's start to the next: the shim's own constant
GUARD_PERIOD = int(re.search(r"#define KREX_GUARD_PERIOD (\d+)", (ROOT / "shim" / "guard_rule.h").read_text()).group(1))
ALL_MODES = ("comm", "compute", "serial", "concurrent")
COPY_BYTES = 256 << 20
HOLD_CYCLES = 20_000_000        # ~10 ms at the H200's 1980 MHz: longer than enqueueing a repetition takes
COPY_SMEM = 80 << 10
COPY_THREADS = 512

KERNELS = r"""
extern "C" __global__ void __launch_bounds__(640) ncclDevKernel_ProxyCopy(const int4 *src, int4 *dst, long long n,
                                                                         int slots) {
    extern __shared__ int4 stage[];
    for (long long base = (long long)blockIdx.x * slots; base < n; base += (long long)gridDim.x * slots) {
        int m = n - base < slots ? (int)(n - base) : slots;
        for (int i = threadIdx.x; i < m; i += blockDim.x) stage[i] = src[base + i];
        __syncthreads();
        for (int i = threadIdx.x; i < m; i += blockDim.x) dst[base + i] = stage[i];
        __syncthreads();
    }
}

/* the same copy with four loads in flight per thread (registers, then the stage): a faster CTA */
extern "C" __global__ void __launch_bounds__(640) ncclDevKernel_ProxyCopyFast(const int4 *src, int4 *dst,
                                                                             long long n, int slots) {
    extern __shared__ int4 stage[];
    for (long long base = (long long)blockIdx.x * slots; base < n; base += (long long)gridDim.x * slots) {
        int m = n - base < slots ? (int)(n - base) : slots;
        for (int i0 = threadIdx.x; i0 < m; i0 += 4 * blockDim.x) {
            int4 r[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x;
                if (i < m) r[u] = __ldg(src + base + i);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * blockDim.x;
                if (i < m) stage[i] = r[u];
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < m; i += blockDim.x) dst[base + i] = stage[i];
        __syncthreads();
    }
}

/* a ring: at step s, CTA i copies its chunk once CTA i-1 has finished step s-1; flags[i] counts CTA i's steps.
 * A wait longer than ~2 s gives up and marks err (never a hang). */
extern "C" __global__ void __launch_bounds__(640) ncclDevKernel_ProxyRing(const int4 *src, int4 *dst, long long n,
                                                                         int slots, int *flags, int *err) {
    extern __shared__ int4 stage[];
    int g = gridDim.x, i = blockIdx.x, pred = (i + g - 1) % g;
    long long steps = (n + (long long)g * slots - 1) / ((long long)g * slots);
    for (long long s = 0; s < steps; s++) {
        if (s > 0 && threadIdx.x == 0) {
            long long t0 = clock64();
            while (*(volatile int *)&flags[pred] < s)
                if (clock64() - t0 > 4000000000LL) { atomicExch(err, 1); break; }   /* ~2 s of SM cycles */
        }
        __syncthreads();
        long long base = (s * g + i) * (long long)slots;
        int m = base >= n ? 0 : n - base < slots ? (int)(n - base) : slots;
        for (int k = threadIdx.x; k < m; k += blockDim.x) stage[k] = src[base + k];
        __syncthreads();
        for (int k = threadIdx.x; k < m; k += blockDim.x) dst[base + k] = stage[k];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicExch(&flags[i], (int)(s + 1));
    }
}
"""


# ------------------------------------------------------------------ the worker: one variant, every case

@functools.lru_cache(maxsize=None)
def triton_kernels():
    """The Triton GEMM kernels, built once: one output tile (inlined into both), a kernel of one program per
    tile, and a persistent one whose NPROG programs loop over the tiles."""
    import triton
    import triton.language as tl

    @triton.jit
    def tile(a, b, c, pm, pn, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))

    @triton.jit
    def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        grid_n = tl.cdiv(N, BN)
        tile(a, b, c, pid // grid_n, pid % grid_n, M, N, K, BM, BN, BK)

    @triton.jit
    def persistent_kernel(a, b, c, M, N, K, NPROG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):
        grid_n = tl.cdiv(N, BN)
        for t in range(tl.program_id(0), tl.cdiv(M, BM) * grid_n, NPROG):
            tile(a, b, c, t // grid_n, t % grid_n, M, N, K, BM, BN, BK)

    return matmul_kernel, persistent_kernel


def triton_matmul():
    def mm(x, y, out):
        m, k = x.shape
        n = y.shape[1]
        # 128x128x64 tiles, 3 stages: ~96 KiB of shared memory, 2 blocks per SM: what shape=1 can change
        triton_kernels()[0][(m // 128 * (n // 128),)](x, y, out, m, n, k, BM=128, BN=128, BK=64, num_warps=8,
                                                       num_stages=3)
        return out

    return mm


def triton_persistent_matmul(programs: int):
    """A persistent Triton GEMM: `programs` programs (one per SM by default), each looping over output tiles
    (128x128, K in steps of 64, 6 stages of 32 KiB: 160-192 KiB of shared memory, so at most one program per SM
    and none beside an 80 KiB copy CTA). A program that finds no SM free waits, and its tiles with it."""
    def mm(x, y, out):
        m, k = x.shape
        n = y.shape[1]
        triton_kernels()[1][(programs,)](x, y, out, m, n, k, NPROG=programs, BM=128, BN=128, BK=64, num_warps=8,
                                         num_stages=6)
        return out

    return mm


class Case:
    launched = 0          # communication launches of this process, every case's: what the guard's epochs count

    def __init__(self, name: str, spec: dict, copies: int, copy_stream_priority: bool):
        import cupy as cp
        import torch

        self.name, self.spec, self.copies = name, spec, copies
        self.torch, self.cp = torch, cp
        dev = torch.device("cuda")
        n = spec["n"]
        g = torch.Generator(device=dev).manual_seed(1)
        self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
        self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
        self.c = [torch.empty(n, n, device=dev, dtype=torch.bfloat16) for _ in range(spec["gemms"])]
        self.src = torch.randint(-2**31, 2**31 - 1, (COPY_BYTES // 4,), device=dev, dtype=torch.int32, generator=g)
        self.dst = torch.zeros_like(self.src)
        self.flags = torch.zeros(spec["ctas"], device=dev, dtype=torch.int32)
        self.err = torch.zeros(1, device=dev, dtype=torch.int32)
        if spec["backend"] == "triton":
            self.mm = triton_matmul()
        elif spec["backend"] == "triton-persistent":
            self.mm = triton_persistent_matmul(spec.get("programs", SMS))
        else:
            torch.backends.cuda.preferred_blas_library("cublaslt" if spec["backend"] == "cublaslt" else "cublas")
            self.mm = lambda x, y, out: torch.matmul(x, y, out=out)
        self.kernel = cp.RawKernel(KERNELS, "ncclDevKernel_ProxyRing" if spec["ring"] else
                                   "ncclDevKernel_ProxyCopyFast" if spec.get("fast") else "ncclDevKernel_ProxyCopy")
        self.kernel.max_dynamic_shared_size_bytes = COPY_SMEM     # as NCCL raises its kernels' limit
        self.filler = cp.RawKernel(KERNELS, "ncclDevKernel_ProxyCopy")
        self.filler.max_dynamic_shared_size_bytes = COPY_SMEM
        self.s_comm = torch.cuda.Stream(priority=-10 if copy_stream_priority else 0)
        self.s_comp = torch.cuda.Stream()
        self.cp_comm = cp.cuda.ExternalStream(self.s_comm.cuda_stream)
        self.src_cp, self.dst_cp = cp.asarray(self.src), cp.asarray(self.dst)
        self.flags_cp, self.err_cp = cp.asarray(self.flags), cp.asarray(self.err)
        self.reference = None

    def chunks(self) -> list:
        """The copy launches as (offset, length) in 16-byte words of src: `copies` whole copies; in a pipeline
        case the same bytes in one launch per GEMM (each a bucket whose GEMM made it), together covering src."""
        whole = COPY_BYTES // 16
        if not self.spec.get("pipeline"):
            return [(0, whole)] * self.copies
        g = self.spec["gemms"]
        per = -(-self.copies * whole // g)
        return [(min(i * per % whole, whole - per), per) for i in range(g)]

    def comm(self, stream, chunks: list | None = None) -> None:
        """The copy launches (default: every chunk of the case) on stream."""
        import numpy as np

        cps = self.cp_comm if stream is self.s_comm else self.cp.cuda.ExternalStream(stream.cuda_stream)
        slots = np.int32(COPY_SMEM // 16)
        grid, block = (self.spec["ctas"],), (COPY_THREADS,)
        with cps:                                  # CuPy launches on its current stream
            for off, n in (self.chunks() if chunks is None else chunks):
                src, dst = self.src_cp[4 * off:4 * (off + n)], self.dst_cp[4 * off:4 * (off + n)]   # int32 views
                if self.spec["ring"]:
                    with self.torch.cuda.stream(stream):
                        self.flags.zero_()
                    self.kernel(grid, block, (src, dst, np.int64(n), slots, self.flags_cp, self.err_cp),
                                shared_mem=COPY_SMEM)
                else:
                    self.kernel(grid, block, (src, dst, np.int64(n), slots), shared_mem=COPY_SMEM)
                Case.launched += 1

    def pipeline(self, serial: bool, g0, g1, c0, c1) -> None:
        """Each GEMM, then the copy of its bucket: on the copy stream after an event (a gradient's all-reduce
        waits for the backward GEMM that made it), or on the same stream when serial; g0/g1 and c0/c1 mark each
        stream's first and last work."""
        torch = self.torch
        comm = self.s_comp if serial else self.s_comm
        g0.record(self.s_comp)
        for i, (out, chunk) in enumerate(zip(self.c, self.chunks())):
            with torch.cuda.stream(self.s_comp):
                self.mm(self.a, self.b, out)
            if not serial:
                ev = torch.cuda.Event()
                ev.record(self.s_comp)
                comm.wait_event(ev)
            if i == 0:
                c0.record(comm)
            self.comm(comm, [chunk])
        g1.record(self.s_comp)
        c1.record(comm)

    def fill(self, n: int) -> None:
        """n tiny copies (256 bytes of src to dst, as the real ones copy them) on the copy stream, nothing beside
        them: communication launches that only move the guard's epoch count on."""
        import numpy as np

        with self.cp_comm:
            for _ in range(n):
                self.filler((self.spec["ctas"],), (COPY_THREADS,), (self.src_cp, self.dst_cp, np.int64(16),
                                                                    np.int32(COPY_SMEM // 16)), shared_mem=COPY_SMEM)
                Case.launched += 1
        self.torch.cuda.synchronize()

    def steady(self, epoch: int, period: int) -> dict:
        """One whole cycle of the overlap guard on this case: the communication launches brought to a cycle's
        start (fill), then the concurrent pattern back to back for period epochs of epoch launches. Its mean
        total is the cost with the guard's exploration; the median of its second half what the guard chose."""
        cycle = epoch * period
        filled = (-Case.launched) % cycle
        self.fill(filled)
        reps = -(-cycle // len(self.chunks()))      # communication launches per repetition
        runs = [self.timed("concurrent") for _ in range(reps)]
        totals = [r["total_ms"] for r in runs]
        return {"total_ms": statistics.fmean(totals), "comm_ms": statistics.fmean(r["comm_ms"] for r in runs),
                "compute_ms": statistics.fmean(r["compute_ms"] for r in runs),
                "second_half_median_ms": statistics.median(totals[len(totals) // 2:]), "reps": reps,
                "filled": filled, "overruns": sum(r["overrun"] for r in runs)}

    def compute(self, stream) -> None:
        with self.torch.cuda.stream(stream):
            for out in self.c:
                self.mm(self.a, self.b, out)

    def timed(self, mode: str) -> dict:
        torch = self.torch
        ev = lambda: torch.cuda.Event(enable_timing=True)   # noqa: E731
        start, end, c0, c1, g0, g1 = ev(), ev(), ev(), ev(), ev(), ev()
        main = torch.cuda.current_stream()
        torch.cuda.synchronize()
        # the GPU waits (a spin of HOLD_CYCLES) while everything below is enqueued, so that the span timed is the
        # GPU's: with dozens of small launches and event waits, the host's enqueueing would otherwise be timed
        torch.cuda._sleep(HOLD_CYCLES)
        start.record(main)
        for s in (self.s_comm, self.s_comp):
            s.wait_event(start)
        if mode == "comm":
            c0.record(self.s_comm), self.comm(self.s_comm), c1.record(self.s_comm)
        elif self.spec.get("pipeline") and mode in ("serial", "concurrent"):
            self.pipeline(mode == "serial", g0, g1, c0, c1)
        elif mode == "compute":
            g0.record(self.s_comp), self.compute(self.s_comp), g1.record(self.s_comp)
        elif mode == "serial":
            c0.record(self.s_comm), self.comm(self.s_comm), c1.record(self.s_comm)
            g0.record(self.s_comm), self.compute(self.s_comm), g1.record(self.s_comm)
        elif self.spec.get("compute_first"):
            g0.record(self.s_comp), self.compute(self.s_comp), g1.record(self.s_comp)
            c0.record(self.s_comm), self.comm(self.s_comm), c1.record(self.s_comm)
        else:
            c0.record(self.s_comm), self.comm(self.s_comm), c1.record(self.s_comm)
            g0.record(self.s_comp), self.compute(self.s_comp), g1.record(self.s_comp)
        for s in (self.s_comm, self.s_comp):
            main.wait_stream(s)
        end.record(main)
        overrun = bool(start.query())     # the GPU was past the spin before the last launch was enqueued
        torch.cuda.synchronize()
        out = {"total_ms": start.elapsed_time(end), "overrun": overrun}
        if mode != "compute":
            out["comm_ms"] = c0.elapsed_time(c1)
        if mode != "comm":
            out["compute_ms"] = g0.elapsed_time(g1)
        return out

    def measure(self, mode: str, reps: int) -> dict:
        for _ in range(2):
            self.timed(mode)
        runs = [self.timed(mode) for _ in range(reps)]
        overruns = sum(r.pop("overrun") for r in runs)
        return {**{k: statistics.median(r[k] for r in runs) for k in runs[0]}, "overruns": overruns}

    def check(self) -> dict:
        """After the runs: the copies' bytes and the GEMMs' values as alone (bit for bit, or within bf16 rounding
        where a GEMM algorithm accumulates in another order), and no ring wait gave up."""
        torch = self.torch
        torch.cuda.synchronize()
        equal = all(bool(torch.equal(c, self.reference)) for c in self.c)
        close = all(bool(torch.allclose(c.float(), self.reference.float(), rtol=2e-2, atol=2e-1)) for c in self.c)
        return {"copy_ok": bool(torch.equal(self.src, self.dst)), "gemm_ok": close, "gemm_bitwise": equal,
                "ring_ok": int(self.err.item()) == 0}


def worker(args) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    counts = json.loads(args.copies) if args.copies else {}
    results = []
    for name in args.cases.split(","):
        spec = ALL_CASES[name]
        t0 = time.monotonic()
        try:
            case = Case(name, spec, max(1, counts.get(name) or spec["copies"] or 1), args.copy_stream_priority)
            case.dst.zero_()
            case.compute(case.s_comp)
            torch.cuda.synchronize()
            case.reference = case.c[0].clone()
            row = {"case": name, **spec}
            if not spec["copies"] and name not in counts:       # calibrate: copies so comm alone ~ compute alone
                one = case.measure("comm", 3)["comm_ms"]
                compute = case.measure("compute", 3)["compute_ms"]
                case.copies = max(1, round(compute / one))
                row["calibrated"] = True
            row["copies"] = case.copies
            row["launches"] = len(case.chunks())       # communication launches per repetition
            for mode in args.modes.split(","):
                if mode == "steady":
                    row[mode] = case.steady(args.guard_epoch, GUARD_PERIOD)
                else:
                    row[mode] = case.measure(mode, args.reps)
            row.update(case.check())
            row["seconds"] = round(time.monotonic() - t0, 1)
        except Exception as e:   # one case's failure (out of memory, a compile error) is recorded, not fatal
            row = {"case": name, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(row), flush=True)
        results.append(row)
        torch.cuda.empty_cache()
    out = {"overlap": os.environ.get("KREX_OVERLAP", ""), "cases": results}
    Path(args.result).write_text(json.dumps(out, indent=1))


def train_worker(args) -> None:
    """A PyTorch training step: a stack of bf16 Linear layers, AdamW, and the gradients all-reduced over a one-rank
    NCCL group. Prints the median step time and the losses (the same with controls on and off)."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    dist.init_process_group("nccl", init_method=f"file://{tempfile.mkdtemp()}/pg", world_size=1, rank=0)
    dev = torch.device("cuda")
    layers = [torch.nn.Linear(4096, 4096, bias=False) for _ in range(8)]
    model = torch.nn.Sequential(*[m for l in layers for m in (l, torch.nn.GELU())]).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
    times, losses = [], []
    for step in range(args.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
        losses.append(float(loss))
    dist.destroy_process_group()
    warm = times[5:]
    out = {"overlap": os.environ.get("KREX_OVERLAP", ""), "step_ms": statistics.median(warm),
           "step_ms_all": warm, "losses": losses}
    Path(args.result).write_text(json.dumps(out))
    print(json.dumps({k: out[k] for k in ("overlap", "step_ms")}), flush=True)


# ------------------------------------------------------------------ the orchestrator

def krex_available(env: dict) -> bool:
    p = subprocess.run([sys.executable, "-c", "import krex_ctl.wire.frames"], env=env, capture_output=True)
    return p.returncode == 0


def launch_cmd(label: str, controls, inner: list, logs: Path, use_krex: bool,
               guard_epoch: int = GUARD_EPOCH) -> tuple[list, dict]:
    """The command line of one variant: under `krex run` (with its report) or with the shim preloaded. A guarded
    variant gets its epoch length and the shim's log at info (the guard's choices, in the variant's log)."""
    env = dict(os.environ, **SAFE, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    for k in ("KREX_OVERLAP", "KREX_OVERLAP_GUARD_EPOCH"):
        env.pop(k, None)
    if guarded(controls):
        env["KREX_OVERLAP_GUARD_EPOCH"] = str(guard_epoch)
        env["KREX_LOG_LEVEL"] = "info"
    if use_krex:
        cmd = [sys.executable, "-m", "krex_ctl", "run", "--cold", "--report", str(logs / f"{label}.report.json")]
        if controls:
            cmd += ["--overlap", controls]
        return cmd + ["--"] + inner, env
    env["LD_PRELOAD"] = " ".join(p for p in (str(ROOT / "build" / "libkrex.so"), env.get("LD_PRELOAD", "")) if p)
    if controls:
        env["KREX_OVERLAP"] = controls
        if "priority" in controls.split(","):
            env.setdefault("TORCH_NCCL_HIGH_PRIORITY", "1")
    return inner, env


def run_variant(label: str, controls, inner: list, logs: Path, use_krex: bool, timeout: float,
                guard_epoch: int = GUARD_EPOCH) -> dict:
    cmd, env = launch_cmd(label, controls, inner, logs, use_krex, guard_epoch)
    log = logs / f"{label}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        try:
            p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    rec = {"label": label, "controls": controls, "rc": rc, "seconds": round(time.monotonic() - t0, 1)}
    if guarded(controls):        # the guard's choices, from the shim's log: [epoch, "on" or "off"]
        found = re.findall(r"overlap guard: epoch (\d+): the controls are (on|off)", log.read_text(errors="replace"))
        rec["guard_choices"] = [[int(e), arm] for e, arm in found]
    report = logs / f"{label}.report.json"
    if report.exists():
        try:
            r = json.loads(report.read_text())
            rec["report"] = {k: r.get(k) for k in ("launches", "exit_code", "overlap")}
        except ValueError:
            pass
    return rec


def changed(variant: dict):
    """What a variant's controls changed, from its krex report (the whole process: every case): launches
    prioritized or padded and descriptors targeted; None without a report. 0: the controls were inert (every
    launch went as asked), so the variant is one more sample of off."""
    ov = (variant.get("report") or {}).get("overlap")
    if not variant.get("controls") or not ov:
        return None
    return sum(int(ov.get(k) or 0) for k in ("prioritized", "padded", "sm_target"))


def summarize(variants: list, train: list) -> dict:
    """Per case: each variant's concurrent total and communication span against the off variant's serial and alone
    times, and against off's own concurrent total (vs_off); where a variant ran a whole guard cycle (steady), its
    mean against off's (steady_vs_off); the noise floor, off-again against off (floor_pct: concurrent totals,
    floor_steady_pct: the cycle means); the best variant, the worst raw and the worst guarded; the goals checked.
    Variants whose controls changed nothing (inert) are shown but never best or worst."""
    off = next((v for v in variants if v["label"] == "off" and v.get("cases")), None)
    base = {c["case"]: c for c in (off or {}).get("cases", []) if "error" not in c}
    controls = {v["label"]: v.get("controls") for v in variants}
    inert = {v["label"] for v in variants if changed(v) == 0}
    cases = {}
    for name, b in base.items():
        serial, alone_comm, alone_compute = b["serial"]["total_ms"], b["comm"]["comm_ms"], b["compute"]["compute_ms"]
        off_total, off_steady = b["concurrent"]["total_ms"], (b.get("steady") or {}).get("total_ms")
        rows = []
        for v in variants:
            c = next((c for c in v.get("cases", []) if c["case"] == name and "error" not in c), None)
            if c is None or "concurrent" not in c:
                continue
            conc = c["concurrent"]
            row = {"variant": v["label"], "guarded": guarded(v.get("controls")), "inert": v["label"] in inert,
                   "total_ms": conc["total_ms"],
                   "comm_span_ms": conc["comm_ms"], "compute_span_ms": conc["compute_ms"],
                   "vs_serial": conc["total_ms"] / serial, "vs_off": conc["total_ms"] / off_total,
                   "comm_vs_alone": conc["comm_ms"] / alone_comm,
                   "overlap_efficiency": (alone_comm + alone_compute - conc["total_ms"]) / min(alone_comm, alone_compute),
                   "correct": bool(c.get("copy_ok") and c.get("gemm_ok") and c.get("ring_ok", True)),
                   "serial_ms_own": (c.get("serial") or {}).get("total_ms")}
            if c.get("steady") and off_steady:
                row.update(steady_ms=c["steady"]["total_ms"], steady_vs_off=c["steady"]["total_ms"] / off_steady,
                           steady_second_half_ms=c["steady"].get("second_half_median_ms"))
            rows.append(row)
        again = next((r for r in rows if r["variant"] == FLOOR), None)
        floor = abs(again["vs_off"] - 1) * 100 if again else None
        floor_steady = abs(again["steady_vs_off"] - 1) * 100 if again and "steady_vs_off" in again else None
        real = [r for r in rows if r["variant"] not in ("off", FLOOR) and not r["inert"]]
        best = min((r for r in real if r["correct"]), key=lambda r: r["total_ms"], default=None)
        raw = [r for r in real if not r["guarded"] and controls.get(r["variant"])]
        # guarded variants are judged inert or not: an inert one still pays for the guard's events and counting
        guard = [r for r in rows if r["guarded"] and "steady_vs_off" in r]
        worst_raw = max(raw, key=lambda r: r["vs_off"], default=None)
        worst_guard = max(guard, key=lambda r: r["steady_vs_off"], default=None)
        cases[name] = {"serial_ms": serial, "alone_comm_ms": alone_comm, "alone_compute_ms": alone_compute,
                       "copies": b["copies"], "rows": rows, "best": best["variant"] if best else None,
                       "best_vs_serial": best["vs_serial"] if best else None,
                       "best_comm_vs_alone": best["comm_vs_alone"] if best else None,
                       "worst_raw": worst_raw["variant"] if worst_raw else None,
                       "worst_raw_vs_off": worst_raw["vs_off"] if worst_raw else None,
                       "worst_guarded": worst_guard["variant"] if worst_guard else None,
                       "worst_guarded_vs_off": worst_guard["steady_vs_off"] if worst_guard else None,
                       "floor_pct": floor, "floor_steady_pct": floor_steady,
                       "best_beyond_floor": (None if floor is None or best is None
                                             else best["vs_off"] < 1 - floor / 100)}
    goals = {}
    losing = []
    for name, c in cases.items():     # every case where plain concurrency loses to serial
        conc_off = next((r for r in c["rows"] if r["variant"] == "off"), None)
        c["off_vs_serial"] = conc_off["vs_serial"] if conc_off else None
        if conc_off and conc_off["vs_serial"] > 1:
            losing.append(name)
            goals[f"{name}_loss_turned_into_win"] = bool(c["best_vs_serial"] is not None and c["best_vs_serial"] < 1)
        if conc_off:   # how much slower than no control each variant was, the worst of them
            worst = max((r for r in c["rows"] if r["variant"] not in ("off", FLOOR) and not r["inert"]),
                        key=lambda r: r["total_ms"], default=None)
            c["worst"] = worst["variant"] if worst else None
            c["worst_vs_off"] = worst["total_ms"] / conc_off["total_ms"] if worst else None
    goals["a_case_where_concurrency_loses"] = bool(losing)
    for name in [n for n in cases if n.startswith(("balanced", "triton-balanced"))]:
        c = cases[name]
        ok = [r for r in c["rows"] if r["variant"] not in ("off", FLOOR) and not r["inert"] and r["correct"]
              and r["comm_vs_alone"] <= 1.5]
        goals[f"{name}_cut_25.5pct_comm_within_1.5x"] = any(r["vs_serial"] <= 1 - 0.255 for r in ok)
    offs = [t["step_ms"] for t in train if t.get("step_ms") and not t.get("overlap")]
    ons = [t["step_ms"] for t in train if t.get("step_ms") and t.get("overlap")]
    training = {}
    if offs and ons:
        training = {"off_ms": statistics.median(offs), "on_ms": statistics.median(ons)}
        training["on_vs_off"] = training["on_ms"] / training["off_ms"]
        losses = [t["losses"] for t in train if t.get("losses")]
        training["max_loss_difference"] = max(abs(a - b) for ls in losses for a, b in zip(losses[0], ls))
        goals["training_on_within_1pct_of_off"] = training["on_vs_off"] <= 1.01
    judged = [c["worst_guarded_vs_off"] for c in cases.values() if c["worst_guarded_vs_off"] is not None]
    if judged:
        goals["no_guarded_control_1pct_slower_than_off"] = max(judged) <= 1.01
    # the same, with the margin the same-run floor allows: off-again's cycle mean against off's, per case
    floored = [(c["worst_guarded_vs_off"], c["floor_steady_pct"]) for c in cases.values()
               if c["worst_guarded_vs_off"] is not None and c["floor_steady_pct"] is not None]
    if floored:
        goals["no_guarded_control_slower_than_off_beyond_max_1pct_floor"] = all(
            w <= 1 + max(1.0, f) / 100 for w, f in floored)
    fallbacks = sum(((v.get("report") or {}).get("overlap") or {}).get("fallbacks", 0) for v in variants + train)
    failed = [v["label"] for v in variants + train if v.get("rc") != 0]
    errors = {f"{v['label']}/{c['case']}": c["error"] for v in variants for c in v.get("cases", []) if "error" in c}
    goals["no_launch_lost_or_failed"] = bool(cases) and fallbacks == 0 and not failed and not errors and all(
        r["correct"] for c in cases.values() for r in c["rows"])
    return {"cases": cases, "training": training, "goals": goals, "fallbacks": fallbacks, "failed_variants": failed,
            "case_errors": errors}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = summary["cases"]
    if not cases:
        return
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 5.2), squeeze=False)
    for ax, (name, c) in zip(axes[0], cases.items()):
        labels = ["serial"] + [r["variant"] for r in c["rows"]]
        totals = [c["serial_ms"]] + [r["total_ms"] for r in c["rows"]]
        spans = [c["alone_comm_ms"]] + [r["comm_span_ms"] for r in c["rows"]]
        x = range(len(labels))
        ax.bar(x, totals, color=["#888"] + ["#c44" if r["variant"] == "off" else "#4a4" if r.get("guarded") else "#48c"
                                            for r in c["rows"]], label="total (red: off, blue: raw, green: guarded)")
        ax.plot(x, spans, "k_", markersize=14, mew=2, label="communication span (serial: alone)")
        ax.axhline(c["serial_ms"], color="#888", lw=0.8, ls="--")
        ax.axhline(c["serial_ms"] * (1 - 0.255), color="#4a4", lw=0.8, ls=":")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"{name} (copies {c['copies']})", fontsize=9)
        ax.set_ylabel("ms")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("overlap controls on one GPU: concurrent total (bars) and communication span (marks)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def orchestrate(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="overlap-logs-"))
    base_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    use_krex = not args.no_krex and krex_available(base_env)
    me = [sys.executable, str(Path(__file__).resolve())]
    deadline = time.monotonic() + args.budget
    variants, train, counts = [], [], {}
    wanted = [v for v in VARIANTS if not args.variants or v[0] in args.variants.split(",")]

    def training() -> None:          # right after `off`: the controls' cost is measured even when time runs short
        for i in range(args.train_rounds * 2):
            controls = TRAIN_CONTROLS if i % 2 else None
            label = f"train-{'on' if controls else 'off'}-{i // 2}"
            left = deadline - time.monotonic()
            if left < 20:
                train.append({"label": label, "controls": controls, "rc": "skipped: out of time"})
                continue
            result = logs / f"{label}.result.json"
            rec = run_variant(label, controls, me + ["--train", "--steps", str(args.steps), "--result", str(result)],
                              logs, use_krex, min(args.timeout, left), args.guard_epoch)
            if result.exists():
                rec.update(json.loads(result.read_text()))
            train.append(rec)
            print(json.dumps({k: rec.get(k) for k in ("label", "rc", "step_ms")}), flush=True)

    if not any(v[0] == "off" for v in wanted):
        training()
    floor_s = 0.0       # what off-again will need: kept back from the variants before it
    for label, controls, flags in wanted:
        left = deadline - time.monotonic()
        if left < 20 + (floor_s if label != FLOOR else 0):
            variants.append({"label": label, "controls": controls, "rc": "skipped: out of time"})
            continue
        result = logs / f"{label}.result.json"
        # a guarded variant: the concurrent pattern, and one whole guard cycle of it per case; off: every mode
        # and the same cycle, for the like-for-like comparison
        modes = ("concurrent,steady" if guarded(controls) or label == FLOOR
                 else ",".join(ALL_MODES + ("steady",) * (label == "off")))
        inner = me + ["--worker", "--cases", args.cases, "--reps", str(args.reps), "--result", str(result),
                      "--modes", modes, "--guard-epoch", str(args.guard_epoch)] + flags
        if counts:
            inner += ["--copies", json.dumps(counts)]
        rec = run_variant(label, controls, inner, logs, use_krex, min(args.timeout, left), args.guard_epoch)
        if result.exists():
            rec.update(json.loads(result.read_text()))
        variants.append(rec)
        print(json.dumps({k: rec.get(k) for k in ("label", "rc", "seconds")}), flush=True)
        if label == "off":
            counts = {c["case"]: c["copies"] for c in rec.get("cases", []) if "copies" in c}
            if any(v[0] == FLOOR for v in wanted):
                floor_s = 0.9 * float(rec.get("seconds") or 30)   # off-again skips the alone and serial modes
            training()
    summary = summarize(variants, train)
    summary.update({"launcher": "krex run --overlap" if use_krex else "LD_PRELOAD + KREX_OVERLAP",
                    "guard_epoch": args.guard_epoch, "guard_period": GUARD_PERIOD,
                    "variants": variants, "train": train, "cases_spec": {n: ALL_CASES[n] for n in args.cases.split(",")}})
    (out / "overlap-summary.json").write_text(json.dumps(summary, indent=1))
    try:
        plot(summary, out / "overlap.png")
    except Exception as e:   # no matplotlib: the JSON has everything
        print(f"no plot: {e}", file=sys.stderr)
    with tarfile.open(out / "overlap-logs.tgz", "w:gz") as t:
        t.add(logs, arcname="overlap-logs")
    shutil.rmtree(logs, ignore_errors=True)     # all of it is in the archive
    print(json.dumps({"goals": summary["goals"], "best": {n: (c["best"], c["best_vs_serial"], c["best_comm_vs_alone"])
                                                          for n, c in summary["cases"].items()},
                      "worst_raw_vs_off": {n: (c["worst_raw"], c["worst_raw_vs_off"]) for n, c in summary["cases"].items()},
                      "worst_guarded_vs_off": {n: (c["worst_guarded"], c["worst_guarded_vs_off"])
                                               for n, c in summary["cases"].items()},
                      "training": summary["training"]}, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/krex-out"), help="where the summary, plot and logs go")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma list of " + ", ".join(CASES) + " or of the search's s-* cases (bench/overlap_search.py)")
    ap.add_argument("--variants", default="", help="comma list of variant labels (default: all)")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement (the median is kept)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per training run")
    ap.add_argument("--train-rounds", type=int, default=2, help="off/on pairs of the training run")
    ap.add_argument("--budget", type=float, default=450, help="seconds for everything; later variants are skipped")
    ap.add_argument("--timeout", type=float, default=90, help="seconds for one variant's process")
    ap.add_argument("--no-krex", action="store_true", help="preload the shim instead of `krex run`")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--copies", default="", help=argparse.SUPPRESS)
    ap.add_argument("--copy-stream-priority", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--modes", default=",".join(ALL_MODES), help=argparse.SUPPRESS)
    ap.add_argument("--guard-epoch", type=int, default=GUARD_EPOCH,
                    help="KREX_OVERLAP_GUARD_EPOCH of the guarded variants (communication launches per epoch)")
    args = ap.parse_args(argv)
    bad = [c for c in args.cases.split(",") if c not in ALL_CASES]
    if bad:
        ap.error(f"unknown case {', '.join(bad)}")
    if args.worker:
        worker(args)
    elif args.train:
        train_worker(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
