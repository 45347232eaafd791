"""One agent's candidate benchmark command, as agents run them: a separate process that generates a
Triton matmul kernel variant (real JIT compilation on the CPU), checks it against torch.mm on the GPU,
then times candidate and reference with triton.testing.do_bench. Prints one JSON line.
    python bench/candidate.py --size 8192 --variant 2 --nonce 17 [--region]
--op sum instead generates a memory-bound kernel (row sums of an fp16 matrix, read from HBM; --size is the MiB read
per call) checked against and timed beside torch.sum; with --compiler cuda that kernel is CUDA C++ built by
torch.utils.cpp_extension.load_inline (nvcc), as KernelBench builds a custom-CUDA candidate.
--region marks each do_bench with krex.region explicitly (otherwise KREX_HOOKS=triton does it)."""

import argparse
import contextlib
import importlib.util
import json
import os
import random
import sys
import tempfile
import time

T0 = time.monotonic()
ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--variant", type=int, required=True)
ap.add_argument("--nonce", type=int, required=True)
ap.add_argument("--region", action="store_true")
ap.add_argument("--op", choices=("matmul", "sum"), default="matmul",
                help="matmul: a SIZE x SIZE fp16 matmul, against torch.mm (compute-bound: on the H200 it runs at "
                     "the power cap, where its time moves with the clock); sum: row sums (fp32) of an fp16 matrix "
                     "of 4096 columns, against torch.sum: memory-bound, SIZE MiB read per call from an input of "
                     "min(SIZE, 2048) MiB (above 2048, SIZE a multiple of 2048: the input read SIZE / 2048 times "
                     "over, by one persistent kernel; the reference makes as many torch.sum calls)")
ap.add_argument("--compiler", choices=("triton", "cuda"), default="triton",
                help="triton: the candidate is a Triton kernel, JIT-compiled at its first call (about 1.4 s on the H100 "
                     "machine); cuda (--op sum only): the same row sums in CUDA C++, built at the first call by "
                     "torch.utils.cpp_extension.load_inline with nvcc, g++ and ninja, as KernelBench builds a "
                     "custom-CUDA candidate: tens of seconds of CPU per command (a compile-heavy mix)")
ap.add_argument("--repeat", type=int, default=1,
                help="time candidate and reference this many times each (one do_bench, one region, each); the "
                     "JSON line gets every timing in candidate_all_ms / reference_all_ms")
ap.add_argument("--warmup-ms", type=float, default=25.0,
                help="do_bench's warm-up (25, Triton's default); on the H200 a 500 ms warm-up brings the GPU to its "
                     "power-steady clock first (bench/harness_stability.py, docs/measurements/harness-stability.md)")
ap.add_argument("--min-reps", type=int, default=0,
                help="> 0: do_bench's rep window is at least this many times the kernel's time (Triton's default "
                     "100 ms is 7 repetitions of a 13 ms matmul), from a short do_bench first (one more region "
                     "per kernel)")
ap.add_argument("--timer", choices=("events", "graph"), default="events",
                help="events: triton.testing.do_bench (an L2 flush, then the kernel launched from Python between two "
                     "events, per repetition); graph: do_bench_cudagraph (the repetitions captured in one CUDA graph "
                     "and replayed, no flush): the GPU's time without the host's launches, which a kernel under ~50 us "
                     "otherwise includes when the host is slow (docs/measurements/freeze-policy.md); the same GPU time "
                     "as events (do_bench_cudagraph's rep is per replay, of 10: it gets a tenth), --warmup-ms unused")
ap.add_argument("--churn", action="store_true",
                help="first allocate and free GPU memory and empty torch's cache, as a process that ran another "
                     "command would have (does allocator or page-mapping history move the timings?)")
ap.add_argument("--scatter-gib", type=float, default=0,
                help="> 0: before the inputs, take this much GPU memory in pieces of 32-512 MiB and give a random "
                     "half back (both drawn with --nonce as the seed), the rest held to the end: the inputs land "
                     "between the process's own memory. Measured: that leaves sum@128 at the empty GPU's level, "
                     "unlike --holder-gib's memory of another process (docs/measurements/harness-stability.md); "
                     "the JSON line gets scatter_mib, [held, given back]; with --holder-gib too, the same draws")
ap.add_argument("--holder-gib", type=float, default=0,
                help="> 0: before this process touches the GPU, a child process (cuda-python) takes this much GPU "
                     "memory in pieces of 32-512 MiB and frees a random half (both drawn with --nonce as the seed), "
                     "holding the rest until this one ends: the inputs land between another process's memory, in a "
                     "pattern of this evaluation's own, as on a GPU that others share. Unlike --scatter-gib (the "
                     "process's own holes), this gives sum@128 a level per pattern, as sharing the GPU does "
                     "(docs/measurements/harness-stability.md); the JSON line gets holder_mib, [held, freed]")
ap.add_argument("--pads", default="",
                help="a layout probe after the timings: MiB,MiB,... per step, allocate that much GPU memory, then "
                     "copies of the inputs (same data, new places in memory), and time candidate and reference "
                     "again; --repeat rounds, steps shuffled (seeded by --nonce) per round; the JSON line gets "
                     "'layouts' (does where the operands land move the kernel's time?)")
ap.add_argument("--seeds", default="",
                help="with the layout probe: also steps with new inputs drawn with these seeds (N,N,...), no pad "
                     "(does the data move the kernel's time? a matmul near the power limit draws more on some data)")
ap.add_argument("--history", default="",
                help="with the layout probe: also steps that run something for MS before each timing, "
                     "idle:MS (sleep) or heavy:MS (bf16 16384 matmuls back to back), no pad: does the GPU's load in "
                     "the seconds before a timing move it, after do_bench's warm-up? fresh:MS sleeps as idle does, "
                     "with copies of the inputs allocated for the step (does memory allocated now, rather than at "
                     "the process's start, time otherwise?); frag:MS does as fresh does after filling the GPU's free "
                     "memory with 2 MiB driver allocations and freeing every other one, so the copies are likely "
                     "to be put together from scattered 2 MiB pieces (does a fragmented placement, as on a node "
                     "where many processes allocated and freed, time otherwise?); fragctl:MS is its control: the "
                     "same fill, held pieces and idle time, with the copies made before the fill (in memory in one "
                     "piece). frag and fragctl take all but 256 MiB of the GPU's memory for 5-8 s a step: for a GPU "
                     "alone (refused under krex run), with cuda-python")
ap.add_argument("--fixed-out", action="store_true",
                help="in the timings (the estimates and --repeat's, not the layout probe's), the candidate writes "
                     "into one output allocated at the start, checked against the first result afterwards "
                     "(otherwise each call allocates its output, as torch.mm does, from torch's caching allocator: "
                     "where it lands can change between two do_bench calls); the JSON line gets the output's address "
                     "per timing, candidate_out_ptrs, either way")
ap.add_argument("--fresh-inputs", action="store_true",
                help="--op sum: before each round of timings (--repeat's), the input is copied to a new place in GPU "
                     "memory (a pad of 2-512 MiB, drawn with --nonce as the seed, taken first and given back after, "
                     "torch's cache emptied), so that each timing samples a placement of its own instead of the "
                     "process's one (does a per-process level, docs/measurements/freeze-policy.md run 52, become a "
                     "per-timing spread?); the JSON line gets input_ptrs, the input's address per round")
ap.add_argument("--probe", action="store_true",
                help="also report what could make the same kernel time differently in another process: CPU cost "
                     "per launch, gap-free and CUDA-graph timings, the compiled kernel's hash, heap size, CPUs")
args = ap.parse_args()
for name, gib in (("--scatter-gib", args.scatter_gib), ("--holder-gib", args.holder_gib)):
    if not 0 <= gib < 1 << 20:           # nan and inf too
        ap.error(f"{name}: GiB, 0 or more, not {gib}")
def have_cuda_python() -> bool:
    try:
        return bool(importlib.util.find_spec("cuda.bindings") or importlib.util.find_spec("cuda.cuda"))
    except ImportError:                      # no "cuda" package at all
        return False


if args.holder_gib and not have_cuda_python():
    ap.error("--holder-gib: the holder needs cuda-python (pip install 'krex[cuda]')")
if args.op == "sum":
    if args.size <= 0 or (args.size > 2048 and args.size % 2048):
        ap.error(f"--op sum: --size is the MiB read per call, 1-2048 or a multiple of 2048, not {args.size}")
    if args.pads or args.seeds or args.history or args.fixed_out or args.probe:
        ap.error("--op sum: --pads, --seeds, --history, --fixed-out and --probe are for --op matmul")
elif args.fresh_inputs:
    ap.error("--fresh-inputs: for --op sum")
elif args.compiler == "cuda":
    ap.error("--compiler cuda: for --op sum (the matmul candidate is Triton's)")


def mib_list(text: str, what: str) -> list:
    try:
        xs = [int(x) for x in text.split(",") if x]
    except ValueError:
        ap.error(f"{what}: {text!r} is not a list of whole numbers")
    if any(x < 0 for x in xs):
        ap.error(f"{what}: {text!r} has a negative number")
    return xs


# the layout probe's steps, checked before anything runs (a bad one must not cost the timings)
STEPS = [("pad", x) for x in mib_list(args.pads, "--pads")] + [("seed", x) for x in mib_list(args.seeds, "--seeds")]
for item in filter(None, args.history.split(",")):
    kind, _, ms = item.partition(":")
    if kind not in ("idle", "heavy", "fresh", "frag", "fragctl") or not ms.isdigit():
        ap.error(f"--history: {item!r} is not idle:MS, heavy:MS, fresh:MS, frag:MS or fragctl:MS")
    STEPS.append((kind, int(ms)))
FRAG = any(k in ("frag", "fragctl") for k, _ in STEPS)
if FRAG and os.environ.get("KREX_JOB"):
    ap.error("--history frag/fragctl takes all but 256 MiB of the GPU's memory: run it on a GPU alone, not under "
             "krex run")
if FRAG:
    try:
        from cuda.bindings import driver as cu
    except ImportError:                      # cuda-python before 12.8, or none
        try:
            from cuda import cuda as cu
        except ImportError:
            ap.error("--history frag/fragctl needs cuda-python (pip install 'krex[cuda]')")

HOLDER = r"""
import random, sys
try:
    from cuda.bindings import driver as cu
except ImportError:                      # cuda-python before 12.8, or none
    try:
        from cuda import cuda as cu
    except ImportError:
        sys.exit("candidate --holder-gib: needs cuda-python (pip install 'krex[cuda]')")
def ok(res):
    res = res if isinstance(res, tuple) else (res,)
    if res[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(repr(res[0]))
    return res[1] if len(res) > 1 else None
try:
    ok(cu.cuInit(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    rng, pieces, total = random.Random(int(sys.argv[2])), [], 0
    while total < float(sys.argv[1]) * 1024:
        mib = rng.choice((32, 64, 128, 256, 512))
        pieces.append((ok(cu.cuMemAlloc(mib << 20)), mib))
        total += mib
    held = 0
    for ptr, mib in pieces:              # a random half freed: holes between the held pieces
        if rng.random() < 0.5:
            held += mib
        else:
            ok(cu.cuMemFree(ptr))
except Exception as e:                   # the reason on the line the candidate reads
    print("failed", " ".join(str(e).split())[:300], flush=True)
    sys.exit(1)
print("ready", held, total - held, flush=True)
sys.stdin.read()                         # held until the candidate closes this
"""
holder, holder_mib, HOLDER_S = None, None, 0.0


def end_holder(wait_s: float) -> None:
    """Wait wait_s for the holder to go, then kill it (one stuck in the driver: not waited for long)."""
    import subprocess

    try:
        holder.wait(wait_s)
    except subprocess.TimeoutExpired:
        holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.wait(10)


def close_holder() -> None:
    """The holder's memory back: its stdin closed, then ended if it does not go (its pipe also ends it when this
    process dies; a caller that runs this file by runpy ends it in any case, bench/ray_fleet.py's evaluate)."""
    if holder is not None and holder.poll() is None:
        holder.stdin.close()
        end_holder(30)


if args.holder_gib > 0:
    import atexit
    import selectors
    import subprocess

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(args.holder_gib), str(args.nonce)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    atexit.register(close_holder)
    sel = selectors.DefaultSelector()
    sel.register(holder.stdout, selectors.EVENT_READ)
    line = holder.stdout.readline().split() if sel.select(timeout=120) else ["(no answer in 120 s)"]
    if line[:1] != ["ready"]:
        end_holder(10)                       # a failed holder exits on its own, a silent one is ended
        sys.exit(f"candidate: the --holder-gib process failed (exit {holder.returncode}: {' '.join(line) or 'no line'})")
    holder_mib = [int(line[1]), int(line[2])]
    HOLDER_S = time.monotonic() - T0

import torch  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

IMPORT_S = time.monotonic() - T0 - HOLDER_S    # ~0 in a warm worker (torch and triton already imported)

VARIANTS = [  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages
    (128, 128, 64, 8, 4, 3), (128, 256, 64, 8, 8, 3), (64, 64, 32, 8, 4, 4), (128, 64, 32, 8, 4, 4)]
BM, BN, BK, GM, W, S = VARIANTS[args.variant % len(VARIANTS)]

SOURCE = f'''
import torch, triton, triton.language as tl

NONCE = {args.nonce}  # a new candidate: a new source, a new compilation

@triton.jit
def kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    group = GM * npn
    gid = pid // group
    first = gid * GM
    gsz = min(npm - first, GM)
    pm = first + ((pid % group) % gsz)
    pn = (pid % group) // gsz
    rm = (pm * BM + tl.arange(0, BM)) % M
    rn = (pn * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    ap = a + rm[:, None] * sam + rk[None, :] * sak
    bp = b + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        x = tl.load(ap, mask=rk[None, :] < K - k * BK, other=0.0)
        y = tl.load(bp, mask=rk[:, None] < K - k * BK, other=0.0)
        acc = tl.dot(x, y, acc)
        ap += BK * sak
        bp += BK * sbk
    cm = pm * BM + tl.arange(0, BM)
    cn = pn * BN + tl.arange(0, BN)
    tl.store(c + cm[:, None] * scm + cn[None, :] * scn, acc.to(tl.float16), mask=(cm[:, None] < M) & (cn[None, :] < N))

def matmul(a, b, out=None):
    M, K = a.shape
    K, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=torch.float16) if out is None else out
    grid = (triton.cdiv(M, {BM}) * triton.cdiv(N, {BN}),)
    global LAST, LAST_OUT
    LAST_OUT = c.data_ptr()
    LAST = kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 BM={BM}, BN={BN}, BK={BK}, GM={GM}, num_warps={W}, num_stages={S})
    return c
'''

# --op sum: BLOCK_R rows by BLOCK_C columns a step, num_warps, programs per SM (a persistent grid)
SUM_VARIANTS = [(16, 512, 4, 4), (8, 1024, 8, 2), (32, 256, 4, 8), (4, 2048, 8, 4)]
SUM_COLS = 4096
if args.op == "sum":
    BR, BC, W, PPS = SUM_VARIANTS[args.variant % len(SUM_VARIANTS)]
    SUM_PASSES = max(1, args.size // 2048)
    SOURCE = f'''
import torch, triton, triton.language as tl

NONCE = {args.nonce}  # a new candidate: a new source, a new compilation

@triton.jit
def kernel(x, out, R, C: tl.constexpr, PASSES: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    # a persistent grid: each program owns the row blocks pid, pid + programs, ...; each pass reads the whole
    # input once (programs resident together advance together, so a block read again was read a whole input ago:
    # not in L2; whether all of them fit on the GPU at once depends on n_regs, in the JSON line)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblk = tl.cdiv(R, BR)
    for p in range(PASSES):
        for blk in range(pid, nblk, nprog):
            rows = blk * BR + tl.arange(0, BR)
            acc = tl.zeros((BR,), dtype=tl.float32)
            for c0 in range(0, C, BC):
                cols = c0 + tl.arange(0, BC)
                v = tl.load(x + rows[:, None] * C + cols[None, :], mask=rows[:, None] < R, other=0.0)
                acc += tl.sum(v.to(tl.float32), axis=1)
            prev = tl.load(out + rows, mask=rows < R, other=0.0)
            tl.store(out + rows, tl.where(p > 0, prev, 0.0) + acc, mask=rows < R)

PROGRAMS = {PPS} * torch.cuda.get_device_properties(0).multi_processor_count

def rowsum(x):
    R, C = x.shape
    out = torch.empty((R,), device=x.device, dtype=torch.float32)
    global LAST, LAST_OUT
    LAST_OUT = out.data_ptr()
    LAST = kernel[(min(PROGRAMS, triton.cdiv(R, {BR})),)](x, out, R, C, PASSES={SUM_PASSES}, BR={BR}, BC={BC},
                                                          num_warps={W})
    return out
'''

# --compiler cuda: THREADS a block, blocks per SM (a persistent grid, one warp per row at a time)
CUDA_SUM_VARIANTS = [(256, 8), (512, 4), (128, 16), (1024, 2)]
CUDA_SUM = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_fp16.h>

// NONCE @NONCE@: a new candidate, a new source, a new build

// at most 32 registers: every variant's blocks per SM (2048 threads) resident at once
__global__ void __launch_bounds__(1024, 2) rowsum_kernel(const __half2* __restrict__ x, float* __restrict__ out,
                                                         long long rows, int half2_cols, int passes) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (int p = 0; p < passes; ++p) {            // each pass reads the whole input once, as the Triton one
        for (long long r = warp; r < rows; r += warps) {
            const __half2* row = x + r * half2_cols;
            float acc = 0.f;
            for (int c = lane; c < half2_cols; c += 32) {
                float2 v = __half22float2(row[c]);
                acc += v.x + v.y;
            }
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
            if (lane == 0) out[r] = (p > 0 ? out[r] : 0.f) + acc;
        }
    }
}

torch::Tensor rowsum(torch::Tensor x, int64_t blocks, int64_t threads, int64_t passes) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf && x.is_contiguous() && x.dim() == 2
                && x.size(1) % 2 == 0, "rowsum: a contiguous fp16 CUDA matrix with an even number of columns");
    auto out = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat32));
    rowsum_kernel<<<(unsigned)blocks, (unsigned)threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __half2*>(x.data_ptr<at::Half>()), out.data_ptr<float>(), x.size(0),
        (int)(x.size(1) / 2), (int)passes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

int64_t rowsum_regs() {   // the registers the kernel was built with (the Triton candidate's n_regs)
    cudaFuncAttributes a;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&a, rowsum_kernel));
    return a.numRegs;
}
"""
if args.op == "sum" and args.compiler == "cuda":
    THREADS, BPS = CUDA_SUM_VARIANTS[args.variant % len(CUDA_SUM_VARIANTS)]
    SOURCE = f'''
import types
import torch
from torch.utils.cpp_extension import load_inline

NONCE = {args.nonce}  # a new candidate: a new source, a new build
CUDA_SRC = {CUDA_SUM.replace("@NONCE@", str(args.nonce))!r}
CPP_SRC = ("torch::Tensor rowsum(torch::Tensor x, int64_t blocks, int64_t threads, int64_t passes);\\n"
           "int64_t rowsum_regs();")
EXT, LAST, GRID = None, None, None
PROGRAMS = {BPS} * torch.cuda.get_device_properties(0).multi_processor_count

def rowsum(x):
    """Built at the first call (nvcc and g++ through ninja), in BUILD (set by the caller)."""
    global EXT, GRID, LAST, LAST_OUT
    if EXT is None:
        EXT = load_inline(name="krex_cand_{args.nonce}", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                          functions=["rowsum", "rowsum_regs"], build_directory=BUILD, extra_cuda_cflags=["-O3"])
        LAST = types.SimpleNamespace(n_regs=EXT.rowsum_regs())
    GRID = min(PROGRAMS, -(-x.shape[0] * 32 // {THREADS}))
    out = EXT.rowsum(x, GRID, {THREADS}, {SUM_PASSES})
    LAST_OUT = out.data_ptr()
    return out
'''

with tempfile.TemporaryDirectory() as td:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(td, "cache")
    path = os.path.join(td, f"cand_{args.nonce}.py")
    with open(path, "w") as f:
        f.write(SOURCE)
    spec = importlib.util.spec_from_file_location(f"cand_{args.nonce}", path)
    mod = importlib.util.module_from_spec(spec)
    mod.BUILD = os.path.join(td, "build")      # --compiler cuda: the extension's build directory
    os.makedirs(mod.BUILD)
    spec.loader.exec_module(mod)
    if args.churn:
        junk = [torch.empty(int(s) << 20, dtype=torch.uint8, device="cuda") for s in (96, 32, 256, 64, 128, 48)]
        del junk[::2]
        more = [torch.empty(int(s) << 20, dtype=torch.uint8, device="cuda") for s in (40, 200)]
        del junk, more
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    scattered, scatter_mib = [], None
    if args.scatter_gib > 0:
        rng, total = random.Random(args.nonce), 0
        while total < args.scatter_gib * 1024:
            scattered.append(torch.empty(rng.choice((32, 64, 128, 256, 512)) << 20, dtype=torch.uint8, device="cuda"))
            total += scattered[-1].numel() >> 20
        scattered = [t for t in scattered if rng.random() < 0.5]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()               # the given-back half to the driver: holes between the held pieces
        held = sum(t.numel() for t in scattered) >> 20
        scatter_mib = [held, total - held]
    torch.manual_seed(args.nonce)
    n = args.size
    c_fixed = None
    if args.op == "sum":
        x = torch.randn((min(n, 2048) << 20) // (2 * SUM_COLS), SUM_COLS, device="cuda", dtype=torch.float16)
        r_out = torch.empty(x.shape[0], device="cuda", dtype=torch.float32)
        r_tmp = torch.empty_like(r_out)

        def torch_sum():
            """The reference: SUM_PASSES torch.sum calls over the input, added up."""
            torch.sum(x, 1, dtype=torch.float32, out=r_out)
            for _ in range(SUM_PASSES - 1):
                torch.sum(x, 1, dtype=torch.float32, out=r_tmp)
                r_out.add_(r_tmp)
            return r_out
        t1 = time.monotonic()
        c = mod.rowsum(x)                      # compiles
        torch.cuda.synchronize()
        compile_s = time.monotonic() - t1
        ok = bool(torch.allclose(c, torch_sum(), atol=0.05 * SUM_PASSES, rtol=1e-3))
        kernels = (("candidate", lambda: mod.rowsum(x)), ("reference", torch_sum))
    else:
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        t1 = time.monotonic()
        c = mod.matmul(a, b)                   # compiles
        torch.cuda.synchronize()
        compile_s = time.monotonic() - t1
        ok = bool(torch.allclose(c.float(), (a @ b).float(), atol=1.0, rtol=1e-2))
        if args.fixed_out:
            c_fixed = torch.empty((n, n), device="cuda", dtype=torch.float16)
        kernels = (("candidate", lambda: mod.matmul(a, b, c_fixed)), ("reference", lambda: torch.mm(a, b)))
    timings, every = {}, {"candidate": [], "reference": []}
    out_ptrs = []

    def bench(name, fn, warmup, rep):
        """One do_bench (--timer graph: do_bench_cudagraph, which warms up on its own), in a region of its own
        with --region (else the triton hook makes it one)."""
        def timed():
            if args.timer == "graph":   # rep is per replay there, and it replays 10 times: the same GPU time
                with torch.cuda.stream(torch.cuda.Stream()):   # older Tritons refuse to capture on the default one
                    return do_bench_cudagraph(fn, rep=rep / 10, return_mode="median")
            return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
        if not args.region:
            return timed()
        import krex

        with krex.region(f"do_bench.{name}"):
            return timed()

    rep = {"candidate": 100.0, "reference": 100.0}
    if args.min_reps > 0:
        # the rep window from a short do_bench, itself a region (KREX_HOOKS=triton, or --region): an estimate
        # taken beside other agents' work would be longer, and the window's length alone moves a timing
        # (docs/measurements/harness-stability.md)
        for name, fn in kernels:
            rep[name] = max(100.0, args.min_reps * bench(f"estimate.{name}", fn, warmup=5, rep=20))
    # under krex run with KREX_HOST_BOUND=1: whether the region of each timing was host-bound (the GPU waited for
    # the launches from Python: the timing includes them), from the region the do_bench just ended
    last_region = None
    if os.environ.get("KREX_JOB") and os.environ.get("KREX_HOST_BOUND", "0").lower() in ("1", "true", "yes", "on"):
        from krex import last_region
    bound = {"candidate": [], "reference": []}
    input_ptrs = []
    fresh_rng = random.Random(args.nonce * 7919 + 1)
    for _ in range(max(1, args.repeat)):
        if args.fresh_inputs:      # the kernels read the global x: a new copy of it, somewhere else
            pad = torch.empty(fresh_rng.randrange(2, 513) << 20, dtype=torch.uint8, device="cuda")
            x = x.clone()
            del pad
            torch.cuda.synchronize()
            torch.cuda.empty_cache()       # the old copy and the pad back to the driver
            input_ptrs.append(x.data_ptr())
        for name, fn in kernels:
            t = bench(name, fn, warmup=args.warmup_ms, rep=rep[name])
            timings.setdefault(name, t)
            every[name].append(t)
            if name == "candidate":
                out_ptrs.append(mod.LAST_OUT)
            if last_region is not None:
                info = last_region()
                bound[name].append(None if info is None else bool(info.host_bound))
    if args.fixed_out:             # the output written by the timings' calls is the first call's result
        ok = ok and bool(torch.equal(c_fixed, c))
    layouts = []
    heavy = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16) if any(k == "heavy" for k, _ in STEPS) else None

    def fragment(leave_mib: int = 256) -> tuple:
        """Fill the free GPU memory with 2 MiB driver allocations down to LEAVE_MIB, free every other one: memory
        allocated next is likely put together from the holes. Returns (the pieces still held, the MiB in holes)."""
        ok = cu.CUresult.CUDA_SUCCESS
        err, free, _ = cu.cuMemGetInfo()
        if err != ok:
            raise SystemExit(f"candidate: cuMemGetInfo failed ({err}) for the frag step")
        pieces = []
        for _ in range(max(0, (free >> 20) - leave_mib) // 2):
            err, ptr = cu.cuMemAlloc(2 << 20)
            if err != ok:
                break
            pieces.append(ptr)
        kept, holes = pieces[1::2], pieces[0::2]
        for ptr in holes:
            cu.cuMemFree(ptr)
        return kept, 2 * len(holes)

    def unfragment(kept: list) -> None:
        for ptr in kept:
            cu.cuMemFree(ptr)

    def before(kind: str, ms: int) -> None:
        """What the GPU does in the MS before a timing of a history step."""
        if kind in ("idle", "fresh", "frag", "fragctl"):
            torch.cuda.synchronize()
            time.sleep(ms / 1000)
        elif kind == "heavy":
            end = time.monotonic() + ms / 1000
            while time.monotonic() < end:
                torch.mm(heavy, heavy)
                torch.cuda.synchronize()
    if STEPS:
        for rnd in range(max(1, args.repeat)):
            order = STEPS[:]
            random.Random(args.nonce * 1000 + rnd).shuffle(order)
            for kind, value in order:
                # torch's cache gives back what the timings before left in it (free to the driver, not to torch,
                # so that a step's copies are new memory and the frag step's fill sees all of it)
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                pad = torch.empty(value << 20, dtype=torch.uint8, device="cuda") if kind == "pad" and value else None
                kept, holes_mib, t_frag = [], 0, time.monotonic()
                try:
                    if kind == "frag":
                        kept, holes_mib = fragment()
                    t_frag = time.monotonic() - t_frag
                    # an idle or heavy step's inputs stay where they are: only what ran before the timing changes
                    if kind == "seed":
                        torch.manual_seed(value)
                        a2 = torch.randn(n, n, device="cuda", dtype=torch.float16)
                        b2 = torch.randn(n, n, device="cuda", dtype=torch.float16)
                    elif kind in ("pad", "fresh", "frag", "fragctl"):       # the same data in memory allocated now
                        a2, b2 = a.clone(), b.clone()
                    else:
                        a2, b2 = a, b
                    if kind == "fragctl":      # the fill after the copies: the same hold and wait, not their place
                        t_frag = time.monotonic()
                        torch.cuda.synchronize()
                        kept, holes_mib = fragment()
                        t_frag = time.monotonic() - t_frag
                    torch.cuda.synchronize()
                    step = {"round": rnd, kind: value, "a_ptr": a2.data_ptr(), "b_ptr": b2.data_ptr(),
                            "t": round(time.time(), 3),
                            **({"holes_mib": holes_mib, "pieces_held": len(kept), "frag_s": round(t_frag, 2)}
                               if kind in ("frag", "fragctl") else {})}
                    for name, fn in (("candidate", lambda: mod.matmul(a2, b2)), ("reference", lambda: torch.mm(a2, b2))):
                        before(kind, value)
                        step[f"{name}_ms"] = bench(f"layout.{name}", fn, warmup=args.warmup_ms, rep=rep[name])
                    layouts.append(step)
                    print("step " + json.dumps(step), flush=True)   # kept if the process is cut short
                    del a2, b2
                finally:
                    del pad
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                    unfragment(kept)          # ~35,000 pieces held by a frag step: never left behind
        del heavy
        torch.cuda.empty_cache()
    probe = {"layouts": layouts} if layouts else {}
    if args.probe:
        import gc

        fn = lambda: mod.matmul(a, b)  # noqa: E731
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            fn()
        probe["launch_us"] = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(100):
            fn()
        e1.record()
        torch.cuda.synchronize()
        probe["back_to_back_ms"] = e0.elapsed_time(e1) / 100
        probe["cudagraph_ms"] = do_bench_cudagraph(fn, rep=100, return_mode="median")
        probe["kernel_hash"] = getattr(mod.LAST, "hash", None)
        probe["kernel_shared"] = getattr(getattr(mod.LAST, "metadata", None), "shared", None)
        probe["gc_objects"] = len(gc.get_objects())

        def cpu_ticks() -> dict:
            out = {}
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    out[tid] = int(fields[11]) + int(fields[12])      # utime + stime
                except OSError:
                    pass
            return out
        ticks0 = cpu_ticks()
        time.sleep(0.5)
        after = cpu_ticks()
        probe["threads"] = len(after)
        probe["threads_busy_while_idle"] = sum(1 for t, v in after.items() if v > ticks0.get(t, v))
        probe["cpus"] = len(os.sched_getaffinity(0))
        import triton
        probe["triton_cache_dir"] = str(getattr(getattr(triton, "knobs", None), "cache", None) and triton.knobs.cache.dir)
if args.op == "sum":   # the persistent grid, and the registers that decide how many of its programs fit at once
    probe.update(grid=mod.GRID if args.compiler == "cuda" else min(mod.PROGRAMS, -(-x.shape[0] // BR)),
                 n_regs=getattr(mod.LAST, "n_regs", None))
close_holder()                         # its memory back before this process's line
print(json.dumps({"size": args.size, "variant": args.variant, **({"op": "sum"} if args.op == "sum" else {}),
                  "nonce": args.nonce, "correct": ok, **probe, **({"scatter_mib": scatter_mib} if scatter_mib else {}),
                  **({"holder_mib": holder_mib, "holder_s": round(HOLDER_S, 3)} if holder_mib else {}),
                  "candidate_ms": timings["candidate"], "reference_ms": timings["reference"],
                  **({"candidate_all_ms": every["candidate"], "reference_all_ms": every["reference"]}
                     if args.repeat > 1 else {}),
                  "candidate_out_ptrs": out_ptrs, **({"fixed_out": True} if args.fixed_out else {}),
                  **({"input_ptrs": input_ptrs} if args.fresh_inputs else {}),
                  **({"candidate_host_bound": bound["candidate"], "reference_host_bound": bound["reference"]}
                     if last_region is not None else {}),
                  "timer": args.timer, **({"compiler": "cuda"} if args.compiler == "cuda" else {}),
                  "compile_s": round(compile_s, 3), "import_s": round(IMPORT_S, 3), "total_s": round(time.monotonic() - T0, 3),
                  # CLOCK_MONOTONIC is the node's: the harness splits its wall time into before, inside, after
                  "t0_mono": round(T0, 4), "t_end_mono": round(time.monotonic(), 4)}), flush=True)
sys.exit(0 if ok else 1)
