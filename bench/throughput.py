"""Concurrent agent benchmarking on one GPU: throughput against command-granular locking, and the
timing inflation of every measured kernel against its isolated median.

Agents (threads here, each running one candidate command at a time as a separate process:
bench/candidate.py, a Triton matmul variant compiled, checked and timed with do_bench against
torch.mm) work through the same list of candidate specs in each mode:
  isolated  one agent, nothing else on the GPU (the ground truth per kernel; run twice, interleaved,
            for the noise floor)
  naive     N agents at once, no coordination
  cmdlock   N agents, each whole command under an exclusive flock (command-granular exclusivity)
  krex      N agents, each command under `krex run` with KREX_HOOKS=triton (region-granular)
  krexwarm  as krex, with a controller keeping N warm workers (`--warm-workers N`): each command runs in a
            process forked for it from one that imported torch and triton, already holding its GPU
            context. The pool is filled before the clock starts (steady state); how long that took is
            reported as warmup_s.
  krexnofreeze  as krex, with `krex controller --no-freeze`: the others are kept off the GPU by the gate
            and the drain only, their CPU work (compiling, importing) goes on during a region
  krexbusy  as krex, with `krex controller --freeze-policy busy`: only the siblings whose GPU work was in
            flight at the drain are stopped
  krexwarmbusy  krexwarm's warm workers under krexbusy's freeze policy
  krexwarmprewait  krexwarm's warm workers under krexprewait's settings (the controller's defaults)
  krexprewait  krexbusy with `--lifecycle-prewait-ms 400` (the controller's default: 100 since run 31, 400 since
           run 38; every other krex mode but krexwarmprewait runs with `--lifecycle-prewait-ms 0`, as before it): a request waits, its gates open, for other jobs'
           context creations, teardowns and exits on its GPU to end before its drain
Each kind of krex mode gets its own controller (socket in a temporary directory), kept for the whole plan.
Kernel mix (matmul sizes, fp16): 1024 and 2048 (< 0.1 ms), 4096 (0.1-1 ms), 8192 (1-10 ms),
16384 (> 10 ms), drawn 15/15/25/30/15 %.
    python bench/throughput.py --plan isolated:1,naive:8,cmdlock:8,krex:8,isolated:1 --out results.json"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
CANDIDATE = str(ROOT / "bench" / "candidate.py")
MODES = ("isolated", "naive", "cmdlock", "krex", "krexwarm", "krexnofreeze", "krexbusy", "krexwarmbusy", "krexprewait",
         "krexwarmprewait", "krexsolo", "krexsolobusy")
WARM_MODES = ("krexwarm", "krexwarmbusy", "krexwarmprewait")   # commands run in the controller's warm workers
# each krex mode's freeze policy, always named (the controller's default changed from all to busy)
PREWAIT_MS = 400   # krexprewait's --lifecycle-prewait-ms (the controller's default)
# and its lifecycle prewait (the default became 100 ms after run 31, 400 after run 38; the modes but krexprewait and
# krexwarmprewait keep the 0 of the runs before it)
NO_PREWAIT = ["--lifecycle-prewait-ms", "0"]
PREWAIT_MODES = ("krexprewait", "krexwarmprewait")   # busy with PREWAIT_MS (set_prewait_ms), cold and warm
FREEZE_ARGS = {"krexnofreeze": ["--no-freeze", *NO_PREWAIT], "krexbusy": ["--freeze-policy", "busy", *NO_PREWAIT],
               "krexwarmbusy": ["--freeze-policy", "busy", *NO_PREWAIT],
               **{m: ["--freeze-policy", "busy", "--lifecycle-prewait-ms", f"{PREWAIT_MS:g}"] for m in PREWAIT_MODES},
               **{m: ["--freeze-policy", "all", *NO_PREWAIT] for m in ("krex", "krexwarm", "krexsolo", "krexsolobusy")}}


def set_prewait_ms(ms: float) -> None:
    """krexprewait's and krexwarmprewait's --lifecycle-prewait-ms (bench/freeze_policy.py --prewait-ms); each
    controller's command line is in the result (controller_argv)."""
    for mode in PREWAIT_MODES:
        FREEZE_ARGS[mode] = ["--freeze-policy", "busy", "--lifecycle-prewait-ms", f"{ms:g}"]


# one command at a time, every distinct spec once, no budget; krexsolobusy: the same as krexsolo beside a GPU
# neighbour under the same controller (frozen in every region), so the GPU is busy between the commands
REFERENCE_MODES = ("isolated", "krexsolo", "krexsolobusy")
NEIGHBOUR = [str(ROOT / "bench" / "contender.py")]   # krexsolobusy's neighbour: args STOP READY [LOAD]
NEIGHBOUR_ARGS: list = []           # its LOAD (freeze_policy.py --neighbour-load), none: its default
CANDIDATE_ARGS: list = []           # more arguments for every candidate command (bench/freeze_policy.py)
REFERENCE_ARGS: list = []           # and for the reference passes' commands after them (the last --repeat wins)
MIX = [(1024, 0.15), (2048, 0.15), (4096, 0.25), (8192, 0.30), (16384, 0.15)]
BUCKETS = [("<0.1ms", 0, 0.1), ("0.1-1ms", 0.1, 1), ("1-10ms", 1, 10), (">10ms", 10, 1e9)]


OPS = ("sum",)           # bench/candidate.py --op besides matmul, as a mix names them: OP@SIZE


def read_result(ap, path: str) -> dict:
    """A --reanalyse RESULT file's JSON, or AP's one-line error (exit status 2) when it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        ap.error(f"--reanalyse: cannot read {path}: {e}")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        ap.error(f"--reanalyse: {path} is not a benchmark result (no runs)")
    if any(isinstance(r, dict) and "rows" not in r for r in data["runs"]):   # bench/reduce_result.py --drop-rows
        whole = (data.get("reduced_from") or {}).get("whole")
        ap.error(f"--reanalyse: {path} keeps its summary only, not its runs' rows" +
                 (f"; the whole result: {whole}" if whole else ""))
    return data


def size_ok(op: str, n: int) -> bool:
    """Whether bench/candidate.py takes --op OP --size N: a sum reads N MiB, from an input of at most 2048 MiB read
    N / 2048 times over above that (so a multiple of 2048 there); a matmul any N > 0."""
    return n > 0 and (op != "sum" or n <= 2048 or n % 2048 == 0)


def parse_size(text: str) -> tuple:
    """A kernel's size as a mix names it, "N" or "OP@N": (op or "", its key: N as an int or "OP@N", N). A size that
    is not a whole number raises ValueError; whether OP is known and N allowed is the caller's (OPS, size_ok)."""
    op, at, n = text.rpartition("@")
    n = int(n)
    return op, (f"{op}@{n}" if at else n), n


def spec_of(size, variant: int) -> dict:
    """A spec from a mix entry's size (an int: a matmul; "OP@N": bench/candidate.py --op OP --size N)."""
    if isinstance(size, str):
        op, _, n = size.partition("@")
        return {"size": int(n), "variant": variant, "op": op}
    return {"size": size, "variant": variant}


def kernel_of(row: dict) -> tuple:
    """(size, variant) of a spec or a result row, the size as the mix names it: an int for a matmul, "OP@N" for
    another op (rows from before --op have none: matmuls)."""
    op = row.get("op") or "matmul"
    return (row.get("size") if op == "matmul" else f"{op}@{row.get('size')}", row.get("variant"))


def kernel_order(key: tuple) -> tuple:
    """Matmuls first, then each op's kernels, by size and variant (a key mixes ints and strings)."""
    size = key[0]
    return (0, "", size, *key[1:]) if isinstance(size, int) else (1, size.partition("@")[0],
                                                                  int(size.partition("@")[2]), *key[1:])


def make_specs(n: int, seed: int, variants: int) -> list[dict]:
    """Every size once (so every bucket has data), then draws from the mix; shuffled, seeded. A mix entry is a
    size (its commands take turns over the variants) or (size, variant) (every command times that variant); a
    size is an int (a matmul) or "OP@N"."""
    rng = random.Random(seed)
    sizes = [s for s, _ in MIX]
    weights = [w for _, w in MIX]
    drawn = sizes[:n] + rng.choices(sizes, weights, k=max(0, n - len(sizes)))
    rng.shuffle(drawn)
    return [spec_of(*s) if isinstance(s, tuple) else spec_of(s, i % variants) for i, s in enumerate(drawn)]


def parse_mix(text: str, ap) -> list:
    """A --mix option's text, "2048:0.4,4096:0.2,16384/1:0.2,sum@1024:0.2,...", as MIX takes it: (size, weight)
    pairs, or ((size, variant), weight) for a size whose commands all time one variant (a kernel left out of the
    mix: docs/measurements/freeze-policy.md); a size N is a matmul's (an int), OP@N another op's (the string:
    bench/candidate.py --op OP --size N, e.g. sum@1024, 1024 MiB read). Entries distinct, a size either plain or
    pinned (to one variant or several: 8192/0 and 8192/1 together), N a positive integer, OP one of OPS,
    variants 0-3, weights > 0. A bad one is AP's error (exit status 2)."""
    out = []
    for item in text.split(","):
        size, _, weight = item.partition(":")
        size, slash, variant = size.partition("/")
        at = "@" in size
        try:
            op, tok, n = parse_size(size)
            w = float(weight)
            v = int(variant) if slash else None
        except ValueError:
            op, tok, n, w, v = "", 0, 0, 0.0, None
        key = tok if v is None else (tok, v)
        size_of = lambda k: k[0] if isinstance(k, tuple) else k   # noqa: E731
        # a size plain and pinned at once would draw the pinned-out variants too; one pin per variant is fine
        clash = any(key == k or (size_of(k) == tok and (v is None or not isinstance(k, tuple))) for k, _ in out)
        if not size_ok(op, n) or not (0 < w < float("inf")) or (v is not None and not 0 <= v <= 3) or clash or \
                (at and op not in OPS):
            ap.error(f"--mix: [OP@]SIZE[/VARIANT]:WEIGHT,... distinct, with sizes > 0 (a sum's 1-2048 or a multiple "
                     f"of 2048), OP one of {', '.join(OPS)}, variants 0-3 and weights > 0, not {text!r}")
        out.append((key, w))
    return out


def distinct(specs: list) -> list[dict]:
    """One spec per kernel (size, variant, op): what the isolated ground-truth passes time, all of it, with no
    budget."""
    seen = {kernel_of(s): s for s in specs}
    return [seen[k] for k in sorted(seen, key=kernel_order)]


REFERENCE_PROCESSES = [1]   # commands per distinct spec in a reference pass (freeze_policy.py --reference-processes)
REFERENCE_PROCESSES_FOR: dict = {}   # kernel_of key -> commands a reference pass, for those kernels named in
                                     # freeze_policy.py --reference-processes-for


def parse_kernel_counts(text: str, ap, option: str, mix: list, variants: int) -> dict:
    """An option's "KERNEL=K,..." (KERNEL as the mix names a kernel, [OP@]SIZE/VARIANT, e.g. sum@128/0 or 2048/1;
    K a whole number, 1 or more) as {kernel_of key: K}; a kernel the mix (MIX's entries, with `variants`) does not
    time, a repeated one or a bad K is AP's error (one line, exit status 2)."""
    known = set()
    for size, _ in mix:
        known |= {size} if isinstance(size, tuple) else {(size, v) for v in range(variants)}
    out: dict = {}
    for item in filter(None, text.split(",")):
        name, eq, count = item.partition("=")
        size, slash, variant = name.partition("/")
        try:
            key = (parse_size(size)[1], int(variant))
            k = int(count)
        except ValueError:
            ap.error(f"{option}: KERNEL=K with KERNEL as [OP@]SIZE/VARIANT (sum@128/0) and K a whole number, "
                     f"not {item!r}")
        if not (eq and slash) or k < 1:
            ap.error(f"{option}: KERNEL=K with KERNEL as [OP@]SIZE/VARIANT (sum@128/0) and K 1 or more, not {item!r}")
        if key not in known:
            ap.error(f"{option}: {name} is not a kernel of the mix")
        if key in out:
            ap.error(f"{option}: {name} named twice")
        out[key] = k
    return out


def gib(text: str) -> float:
    """An argparse type: GiB of GPU memory, 0 or more (not nan, not inf): one line and exit 2 otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"GiB, 0 or more, not {text!r}") from None
    if not 0 <= value < 1 << 20:
        raise argparse.ArgumentTypeError(f"GiB, 0 or more, not {value}")
    return value


def add_reference_options(ap, unit: str) -> None:
    """--reference-repeat and --reference-processes, as bench/freeze_policy.py (UNIT command) and
    bench/ray_fleet.py (UNIT evaluation: a Ray task, each its own worker, max_calls=1 for GPU tasks) take them."""
    ap.add_argument("--reference-repeat", type=int, default=0,
                    help=f"timings per kernel per {unit} in the reference passes (0: as --repeat): more gives the "
                         "floor as many timings per bucket as the shared modes have, so that its p95 is not the "
                         "largest of a few")
    ap.add_argument("--reference-processes", type=int, default=1,
                    help=f"{unit}s per distinct kernel in each reference pass, each its own process: more samples "
                         "the level a kernel takes per process, as the shared modes' many processes do")
    ap.add_argument("--reference-holder-gib", type=gib, default=0,
                    help=f"> 0: each {unit} of the reference passes (bench/ray_fleet.py: the --reference mode's; "
                         "bench/freeze_policy.py: every --reference's) beside a holder of its own (bench/candidate.py "
                         "--holder-gib G: another process takes G GiB in pieces and frees a random half, seeded by "
                         "the nonce): its inputs land between others' memory, as in the shared modes, where "
                         "the other agents' memory does that (a kernel whose input is not much larger than the L2 "
                         "takes a level per placement, docs/measurements/harness-stability.md)")


def add_timing_options(ap, unit: str) -> None:
    """How every UNIT (command, evaluation) times its kernels: bench/candidate.py's --warmup-ms, --min-reps,
    --timer and --scatter-gib, as bench/freeze_policy.py and bench/ray_fleet.py take them (timing_args)."""
    ap.add_argument("--warmup-ms", type=float, default=25.0,
                    help=f"each {unit}'s do_bench warm-up (bench/candidate.py --warmup-ms; 500: power-steady)")
    ap.add_argument("--min-reps", type=int, default=0, help=f"each {unit}'s do_bench repetitions, at least")
    ap.add_argument("--timer", choices=("events", "graph"), default="events",
                    help=f"each {unit}'s timer (bench/candidate.py --timer): events, do_bench; graph, "
                         "do_bench_cudagraph, without the host's launches in the timing")
    ap.add_argument("--compiler", choices=("triton", "cuda"), default="triton",
                    help=f"each {unit}'s candidate kernel (bench/candidate.py --compiler): triton, JIT-compiled at its "
                         "first call; cuda, the sum candidate in CUDA C++ built by torch.utils.cpp_extension.load_inline "
                         "(nvcc, g++, ninja) as KernelBench builds one: tens of seconds of CPU per command, a "
                         "compile-heavy mix (sum@ kernels only)")
    ap.add_argument("--scatter-gib", type=gib, default=0,
                    help=f"each {unit} first takes this much GPU memory in pieces and gives a random half back "
                         "(bench/candidate.py --scatter-gib, seeded by its nonce), in every mode: its inputs land "
                         "between its own memory (which left sum@128's level as on an empty GPU; "
                         "--reference-holder-gib is what samples placement)")
    ap.add_argument("--fresh-inputs", action="store_true",
                    help=f"each {unit} copies its input to a new place in GPU memory before each round of timings "
                         "(bench/candidate.py --fresh-inputs; sum@ kernels only), in every mode: each timing samples "
                         "a placement, not one per process")
    ap.add_argument("--nonce-offset", type=int, default=0,
                    help=f"added to every {unit}'s nonce (its source, its inputs' seed and its --holder-gib or "
                         "--scatter-gib pattern, fixed otherwise by the mode's place in the plan and the index): "
                         "another run with another offset samples other placements")


def timing_args(ap, args) -> list:
    """bench/candidate.py's options from add_timing_options' (one line and exit 2 for a --min-reps or
    --nonce-offset below 0; --scatter-gib is checked by its type, gib)."""
    if args.min_reps < 0:
        ap.error(f"--min-reps: 0 or more, not {args.min_reps}")
    if not 0 <= args.nonce_offset < 1 << 40:
        ap.error(f"--nonce-offset: 0 or more, not {args.nonce_offset}")
    return ["--warmup-ms", str(args.warmup_ms), "--min-reps", str(args.min_reps), "--timer", args.timer] + \
        (["--scatter-gib", str(args.scatter_gib)] if args.scatter_gib else []) + \
        (["--fresh-inputs"] if getattr(args, "fresh_inputs", False) else []) + \
        (["--compiler", args.compiler] if args.compiler != "triton" else [])


def check_compiler(ap, args, mix: list) -> None:
    """One line and exit 2 for --compiler cuda or --fresh-inputs with a kernel other than sum@ in the mix
    (parse_mix's list)."""
    sizes = [k[0] if isinstance(k, tuple) else k for k, _ in mix]
    if args.compiler == "cuda" and any(spec_of(size, 0).get("op") != "sum" for size in sizes):
        ap.error("--compiler cuda: the mix's kernels must all be sum@SIZE (the matmul candidate is Triton's)")
    if getattr(args, "fresh_inputs", False) and any(spec_of(size, 0).get("op") != "sum" for size in sizes):
        ap.error("--fresh-inputs: the mix's kernels must all be sum@SIZE (bench/candidate.py copies a sum's input)")


def check_reference_options(ap, args) -> None:
    """One line and exit 2 for a --reference-repeat below 0 or a --reference-processes below 1."""
    if args.reference_repeat < 0:
        ap.error("--reference-repeat: 0 (as --repeat) or more")
    if args.reference_processes < 1:
        ap.error("--reference-processes: 1 or more")


def reference_args(args) -> list:
    """bench/candidate.py's options for the reference passes only, after the others (the last --repeat wins)."""
    return (["--repeat", str(args.reference_repeat)] if args.reference_repeat else []) + \
        (["--holder-gib", str(args.reference_holder_gib)] if args.reference_holder_gib else [])


def reference_specs(specs: list, processes: int = 0) -> list[dict]:
    """What a reference pass runs: every distinct spec in PROCESSES commands (0: REFERENCE_PROCESSES), or as many
    as REFERENCE_PROCESSES_FOR says for it, all of one round before the next. One command per spec samples one
    process per kernel a pass, so a level a kernel takes per process (docs/measurements/freeze-policy.md: cuBLAS
    1.3% apart in two processes) or per placement of its inputs (a kernel under 0.1 ms) shows in the floor only
    when the two passes' processes differ; several sample it as the shared modes' many commands do."""
    base = max(1, processes or REFERENCE_PROCESSES[0])
    specs = distinct(specs)
    counts = [REFERENCE_PROCESSES_FOR.get(kernel_of(s), base) for s in specs]
    return [s for r in range(max(counts, default=0)) for s, n in zip(specs, counts) if n > r]


STAGGER_S = [0.0]   # a shared mode's agent starts its first command after a delay drawn for it, uniform in [0, this],
                    # and takes work for the mode's budget from then


def stagger_delay(aid: int) -> float:
    """Agent aid's delay before its first command (freeze_policy --stagger): seeded by the agent alone, so every
    shared mode of a plan starts its agents alike; 0 without --stagger."""
    return random.Random(f"stagger-{aid}").uniform(0.0, STAGGER_S[0]) if STAGGER_S[0] > 0 else 0.0


HOST_BOUND = [False]   # KREX_HOST_BOUND=1 in the krex commands (freeze_policy --host-bound-check): each timing's
                      # region says whether the GPU waited for the host (candidate.py's *_host_bound lists)


def krex_env(sock: Path) -> dict:
    env = dict(os.environ, KREX_SOCKET=str(sock), KREX_HOOKS="triton")
    if HOST_BOUND[0]:
        env["KREX_HOST_BOUND"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def krex_status(env: dict) -> dict:
    return json.loads(subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=env,
                                     capture_output=True, text=True, check=True, timeout=30).stdout)


def wait_idle(env: dict, n: int, timeout: float) -> None:
    """Until the controller at env's KREX_SOCKET has n idle warm workers."""
    deadline = time.monotonic() + timeout
    while True:
        st = krex_status(env)
        if sum(w["state"] == "idle" for w in st["workers"]) >= n:
            return
        if time.monotonic() > deadline or (st.get("zygotes_failed") and not st.get("zygotes")):
            raise SystemExit(f"warm workers did not come up: {st['workers']}, stopped: {st.get('zygotes_failed')} "
                             "(see the controller's log)")
        time.sleep(0.2)


class Controllers:
    """One controller per krex mode kind, kept for the whole plan as a node's controller is. A warm mode's
    (WARM_MODES) keeps as many warm workers as the plan's largest warm step has agents; before each warm step
    the pool is filled (steady state) and the time that took is reported as warmup_s."""

    def __init__(self, tmp: Path, plan: list, logs: Path, extra: tuple = (), metrics_port: int = 0):
        self.tmp, self.logs, self.live, self.extra = tmp, logs, {}, list(extra)
        self.metrics_port = metrics_port   # > 0: each controller serves Prometheus metrics, one port per mode
        self.ports: dict = {}
        self.argv: dict = {}   # mode: the controller's command line after `krex_ctl` (what the result records)
        self.pool = max([a for m, a in plan if m in WARM_MODES], default=0)

    def get(self, mode: str, agents: int) -> tuple:
        if mode not in self.live:
            sock = self.tmp / f"{mode}.sock"
            env = krex_env(sock)
            args = [sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock)] + self.extra
            if mode in WARM_MODES:
                args += ["--warm-workers", str(self.pool), "--worker-preload", "torch,triton"]
            args += FREEZE_ARGS[mode]
            if self.metrics_port:       # a mode's controller started again (stop(mode)) keeps its port
                self.ports.setdefault(mode, self.metrics_port + len(self.ports))
                args += ["--metrics", f"127.0.0.1:{self.ports[mode]}"]
            self.argv[mode] = args[3:]
            log = open(self.logs / f"throughput-{mode}-controller.log", "wb")
            ctl = subprocess.Popen(args, env=env, stdout=log, stderr=log)
            deadline = time.monotonic() + 30
            while not sock.exists():
                if ctl.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the {mode} controller did not start (see {log.name})")
                time.sleep(0.05)
            if mode in WARM_MODES:   # one command declares the pool's environment (it runs cold)
                subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", sys.executable, "-c", "pass"],
                               env=env, check=True, timeout=300)
            self.live[mode] = (ctl, env)
        ctl, env = self.live[mode]
        t0 = time.monotonic()
        if mode in WARM_MODES:
            wait_idle(env, agents, 400)
        return env, time.monotonic() - t0

    def scrape(self, mode: str) -> str:
        """The mode's controller's /metrics page ("" when it serves none or does not answer in 5 s)."""
        if mode not in self.ports:
            return ""
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[mode]}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError as e:
            return f"# scrape failed: {e}\n"

    def stop(self, mode: str | None = None) -> None:
        """Stop every controller, or mode's only (a warm pool's workers hold GPU contexts: while its controller
        lives, it counts as active in the node's registry and taints other controllers' regions)."""
        for m in [mode] if mode else list(self.live):
            ctl, _ = self.live.pop(m, (None, None))
            if ctl is not None:
                ctl.terminate()
                ctl.wait(60)


def run_mode(mode: str, agents: int, specs: list, budget_s: float, tmp: Path, nonce_base: int,
             ctls: Controllers) -> dict:
    if mode in REFERENCE_MODES:   # krexsolo: the same alone, under a controller of its own (its clock settle)
        specs, budget_s = reference_specs(specs), float("inf")
    todo = list(enumerate(specs))
    rows, lock = [], threading.Lock()
    kenv, warmup = ctls.get(mode, agents) if mode.startswith("krex") else (None, 0.0)
    workers_before = {w["pid"] for w in krex_status(kenv)["workers"]} if mode in WARM_MODES else set()
    neighbour = start_neighbour(kenv, tmp, mode) if mode == "krexsolobusy" else None
    cpu = CpuUse(ctls.live[mode][0].pid if mode in ctls.live else None)
    t_start, started_unix = time.monotonic(), time.time()

    def agent(aid: int) -> None:
        t_own = t_start
        if mode not in REFERENCE_MODES:   # agents not in step (--stagger), alike in every mode: each takes work for
            t_own += stagger_delay(aid)   # the budget from its own start, so a budget shorter than its delay (cut
            time.sleep(t_own - t_start)   # by --deadline) still has it run, and every mode loses the same time
        while True:
            with lock:
                if not todo or time.monotonic() - t_own > budget_s:
                    return
                idx, spec = todo.pop(0)
            nonce = nonce_base + idx
            cmd = [sys.executable, CANDIDATE, "--size", str(spec["size"]),
                   "--variant", str(spec["variant"]), "--nonce", str(nonce)] + \
                  (["--op", spec["op"]] if spec.get("op") else []) + CANDIDATE_ARGS + \
                  (REFERENCE_ARGS if mode in REFERENCE_MODES else [])
            env = dict(os.environ)
            report = tmp / f"{mode}-{agents}-{nonce}.json"   # its own: a run of the same mode again (--rounds)
                                                              # never reads an earlier run's report
            if mode == "cmdlock":
                cmd = ["flock", str(tmp / "gpu.lock")] + cmd
            elif mode.startswith("krex"):
                cmd = [sys.executable, "-m", "krex_ctl", "run", "--report", str(report), "--"] + cmd
                env = kenv
            t0 = time.monotonic()
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            t1 = time.monotonic()
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            row = {"idx": idx, "agent": aid, **spec, "exit": out.returncode, "start_s": t0 - t_start,
                   "wall_s": t1 - t0}
            if lines:
                row.update(json.loads(lines[-1]))
                if "t0_mono" in row:       # the wall time outside the command's own body: the start (the
                    # wrapper, the interpreter, the shim's start) and the end (the exit: contexts torn down, the
                    # exit gate, the wrapper's report)
                    row["before_s"] = round(row.pop("t0_mono") - t0, 4)
                    row["after_s"] = round(t1 - row.pop("t_end_mono"), 4)
            else:
                row["stderr"] = out.stderr[-2000:]
            if report.exists():
                rep = json.loads(report.read_text())
                regs = rep["regions"]
                row["regions"] = len(regs)
                row["region_held_s"] = sum((r["ended_ns"] - r["granted_ns"]) / 1e9 for r in regs)
                row["region_wait_s"] = sum((r["granted_ns"] - r["requested_ns"]) / 1e9 for r in regs)
                row["drain_s"] = sum(r.get("drain_ns", 0) / 1e9 for r in regs)
                # where each wait for a grant went (the report's hand-off phases), summed over the regions
                row["region_phases_s"] = {k: round(sum(r.get(f"{k}_ns", 0) for r in regs) / 1e9, 4)
                                          for k in ("queued", "drain", "settle", "freeze", "isolate", "attest")}
                row["gate_wait_s"] = rep["gate_waited_ns"] / 1e9
                row["frozen_s"] = rep.get("frozen_ns", 0) / 1e9
                row["lifecycle_wait_s"] = rep.get("lifecycle_waited_ns", 0) / 1e9   # of gate_wait_s
                row["regions_clean"] = [bool(r.get("exclusive") and r.get("clean")) for r in regs]
                # why each region that was not: [its index, exclusive, its taints, the pids NVML showed that krex
                # did not know]
                row["region_taints"] = [[i, bool(r.get("exclusive")), r.get("taints"), sorted(
                    {p for g in (r.get("attestation") or {}).get("gpus", {}).values() for p in g.get("foreign_pids", [])})]
                    for i, r in enumerate(regs) if not (r.get("exclusive") and r.get("clean"))]
                # the lowest SM clock NVML saw in each attested region (None: not attested): a timing's GPU state
                row["region_clocks_mhz"] = [r["sm_clock_mhz"][0] if r.get("sm_clock_mhz") else None for r in regs]
                # what held the GPU just before each region: [gap ms, its held ms, its lowest clock, same job] or None
                row["region_previous"] = [[p["gap_ms"], p["held_ms"], p["sm_clock_min_mhz"], p["same_job"]]
                                          if (p := r.get("previous_region")) else None for r in regs]
            with lock:
                rows.append(row)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:           # never a neighbour left busy on the GPU
        if neighbour:
            stop_neighbour(*neighbour)
    wall = max((r["start_s"] + r["wall_s"] for r in rows), default=0.0)
    ok = [r for r in rows if r.get("exit") == 0 and "candidate_ms" in r]
    extra = cpu.since()
    if mode in WARM_MODES:
        now = {w["pid"] for w in krex_status(kenv)["workers"]}
        extra.update(warmup_s=round(warmup, 2), workers_replaced=len(workers_before - now),
                     warm_commands=sum(1 for r in rows if r.get("import_s", 9) < 1.0))   # cold: >= 2.9 s
    if mode in ctls.argv:
        extra["controller_argv"] = ctls.argv[mode]
    if STAGGER_S[0] > 0 and mode not in REFERENCE_MODES:
        extra["stagger_s"] = [round(stagger_delay(i), 3) for i in range(agents)]
    return {"mode": mode, "agents": agents, "wall_s": wall, "commands": len(ok), "failed": len(rows) - len(ok),
            "commands_per_min": 60 * len(ok) / wall if wall else 0.0, "rows": rows,
            # when the mode ran (the node's clock): what else was sampled then, e.g. NVML's power state
            "started_unix": round(started_unix, 3), "ended_unix": round(time.time(), 3), **extra}


class CpuUse:
    """What a mode's run cost the node's CPUs: how busy they were (all of them, user + system + the rest but
    idle and iowait, from psutil's system-wide counters) and the CPU seconds of its controller (without its
    children: the resumer, warm workers), from when it was made to since()."""

    def __init__(self, controller_pid: Optional[int]):
        import psutil
        self.node0 = psutil.cpu_times()
        try:
            self.ctl = psutil.Process(controller_pid) if controller_pid else None
            self.ctl0 = sum(self.ctl.cpu_times()[:2]) if self.ctl else 0.0
        except psutil.Error:
            self.ctl = None

    @staticmethod
    def total(t) -> float:
        """All of psutil's CPU times once: Linux counts guest and guest_nice inside user and nice already."""
        return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    def since(self) -> dict:
        import psutil
        now = psutil.cpu_times()
        total = self.total(now) - self.total(self.node0)
        idle = (now.idle - self.node0.idle) + (getattr(now, "iowait", 0.0) - getattr(self.node0, "iowait", 0.0))
        out = {"node_cpu_busy_pct": round(100.0 * (total - idle) / total, 1) if total > 0 else None}
        if self.ctl is not None:
            try:
                out["controller_cpu_s"] = round(sum(self.ctl.cpu_times()[:2]) - self.ctl0, 2)
            except psutil.Error:
                pass
        return out


def start_neighbour(kenv: dict, tmp: Path, mode: str) -> tuple:
    """The GPU neighbour of krexsolobusy, under `krex run` on the mode's controller, once it is running (its
    READY file), or SystemExit."""
    stop, ready = tmp / f"{mode}.stop", tmp / f"{mode}.ready"
    stop.unlink(missing_ok=True)
    ready.unlink(missing_ok=True)
    log = open(tmp / f"{mode}-neighbour.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "krex_ctl", "run", "--", sys.executable, *NEIGHBOUR, str(stop),
                          str(ready), *NEIGHBOUR_ARGS], env=kenv, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise SystemExit(f"the {mode} neighbour did not start (see {log.name})")
        time.sleep(0.1)
    return p, stop


def stop_neighbour(p, stop: Path) -> None:
    stop.touch()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def bucket(ms: float) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= ms < hi)


def quantile(xs: list, q: float) -> float:
    """The q-quantile of xs by nearest rank (nan for none)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def p95(xs: list) -> float:
    return quantile(xs, 0.95)


def timings(row: dict, kind: str) -> list:
    """Every timing of a kernel (candidate or reference) in a command's row: --repeat's list, or the one."""
    return row.get(f"{kind}_all_ms") or ([row[f"{kind}_ms"]] if f"{kind}_ms" in row else [])


def reference_passes(passes: list, stable_pct: float, leave_out=()) -> dict:
    """The ground truth from isolated passes (each a list of command rows; two at least for a floor): per kernel
    (size, variant, candidate or reference) the median of each pass. A kernel is stable when its first two
    passes agree within stable_pct (the same kernel in two processes alone on the GPU: bimodal ones are left
    out); its reference is the median of the pass medians.

    The floor of a bucket is the same statistic as the one it judges, taken where nothing else ran: the p95 of
    |timing / the other pass's median - 1| over every timing of the bucket's stable kernels in both passes, in
    percent (floor_timings: how many). judge() holds a timing against each pass's median in turn, so that
    the judged figure is the same statistic (one timing against one pass's median). The older floor, the p95
    over kernels of |pass 2 median / pass 1 median - 1| (floors_medians_pct, on 2-4 kernels a bucket), hid the
    spread of single timings behind medians and so compared unlike figures. repeat_spread_pct: per bucket, the
    p95 over the reference commands of max / min - 1 of one stable kernel's timings in one process
    (--repeat > 1), the harness's own repeatability. With 20 or fewer values a p95 is the largest or the
    second largest: read it with its count."""
    import statistics as st
    per: dict = {}
    all_t: dict = {}
    spread: list = []       # (kernel, max / min - 1 of its timings in one command)
    for rows in passes:
        seen: dict = {}
        for row in rows:
            for kind in ("candidate", "reference"):
                ts = timings(row, kind)
                if ts:
                    seen.setdefault((*kernel_of(row), kind), []).extend(ts)
                    if len(ts) > 1 and min(ts) > 0:
                        spread.append(((*kernel_of(row), kind), (max(ts) / min(ts) - 1) * 100))
        for k, ts in seen.items():
            per.setdefault(k, []).append(st.median(ts))
            all_t.setdefault(k, []).append(ts)
    name = lambda k: f"{k[0]}/{k[1]}/{k[2]}"   # noqa: E731
    # leave_out: kernels (SIZE/VARIANT/KIND) the reader chose to leave out of the judgement and the floor alike
    stable = {k: st.median(v) for k, v in per.items()
              if len(v) >= 2 and abs(v[1] / v[0] - 1) * 100 <= stable_pct and name(k) not in leave_out}
    medians: dict = {b: [] for b, _, _ in BUCKETS}
    floor: dict = {b: [] for b, _, _ in BUCKETS}
    spreads: dict = {b: [] for b, _, _ in BUCKETS}
    for k, x in spread:
        if k in stable:
            spreads[bucket(stable[k])].append(x)
    for k in stable:
        b = bucket(stable[k])
        medians[b].append(abs(per[k][1] / per[k][0] - 1) * 100)
        for j in (0, 1):
            floor[b] += [abs(t / per[k][1 - j] - 1) * 100 for t in all_t[k][j]]
    return {"stable": stable, "pass_medians": {k: per[k][:2] for k in stable},
            "floor_values": floor,     # for judge's interval; not written to results (see FLOOR_PRIVATE)
            "unstable": sorted(name(k) for k in per if k not in stable and name(k) not in leave_out),
            "left_out": sorted(name(k) for k in per if name(k) in leave_out),
            "floors_pct": {b: (p95(v) if v else None) for b, v in floor.items()},
            "floor_timings": {b: len(v) for b, v in floor.items()},
            "floors_medians_pct": {b: (p95(v) if v else None) for b, v in medians.items()},
            "floor_kernels": {b: len(v) for b, v in medians.items()},
            "repeat_spread_pct": {b: (p95(v) if v else None) for b, v in spreads.items()}}


def clock_summary(clocks) -> Optional[dict]:
    """Regions' lowest SM clocks (MHz; None: a region not attested): median, 10th percentile and count; None when
    no region was attested (an older result, or --no-attest)."""
    clocks = sorted(c for c in clocks if c)
    if not clocks:
        return None
    return {"median": clocks[len(clocks) // 2], "p10": clocks[len(clocks) // 10], "regions": len(clocks)}


def region_clocks(rows: list) -> Optional[dict]:
    """clock_summary of every region of these commands (their rows' region_clocks_mhz)."""
    return clock_summary(c for row in rows for c in row.get("region_clocks_mhz") or [])


def host_bound_flags(row: dict, kind: str) -> list:
    """Per timing of timings(row, kind): True when its region was host-bound (KREX_HOST_BOUND), else False (also
    where the check did not run)."""
    flags = row.get(f"{kind}_host_bound") or []
    return [bool(flags[i]) if i < len(flags) else False for i in range(len(timings(row, kind)))]


def flagged_timings(rows: list, stable: dict, clean=None):
    """(kernel, its reference median, one timing, whether its region was host-bound) for every timing of a stable
    kernel in the rows clean(row) accepts (all rows without clean)."""
    for row in rows:
        if clean is not None and not clean(row):
            continue
        for kind in ("candidate", "reference"):
            key = (*kernel_of(row), kind)
            ref = stable.get(key)
            if ref:
                for t, bound in zip(timings(row, kind), host_bound_flags(row, kind)):
                    yield key, ref, t, bound


def stable_timings(rows: list, stable: dict, clean=None, skip_host_bound: bool = False):
    """flagged_timings' (kernel, reference median, timing); skip_host_bound: not the timings whose region was
    host-bound."""
    for key, ref, t, bound in flagged_timings(rows, stable, clean):
        if not (skip_host_bound and bound):
            yield key, ref, t


def inflation(rows: list, stable: dict, clean=None) -> dict:
    """Per bucket, timing / the kernel's isolated median - 1 in percent (negative: faster) of every timing of a
    stable kernel, in the rows clean(row) accepts (all rows without clean)."""
    out: dict = {b: [] for b, _, _ in BUCKETS}
    for _, ref, t in stable_timings(rows, stable, clean):
        out[bucket(ref)].append((t / ref - 1) * 100)
    return out


def signed_medians(rows: list, stable: dict, clean=None) -> dict:
    """Per bucket, the median of inflation() (negative: the timings lean faster than the reference)."""
    return {b: (round(statistics.median(v), 3) if v else None) for b, v in inflation(rows, stable, clean).items()}


def per_kernel(rows: list, stable: dict, clean=None, far_pct: float = 5.0) -> dict:
    """Per stable kernel ("size/variant/kind"), what makes a bucket's tail: its reference median (ms), how many
    timings, and their median, lowest and highest inflation against it (percent), and how many lie further than
    far_pct either way. A tail that one kernel makes (a small Triton kernel whose timing includes its
    launch from Python when the host is slow, say) reads differently from one spread over every kernel.
    Over the commands that timed a kernel more than once (two at least): within_pct, the largest spread of one
    command's timings, and between_pct, the spread of the commands' medians (points; both extremes, host-bound
    timings included). A kernel whose commands each sit at
    a level of their own (between far above within) is moved by something set per process, or lasting, not by
    what happens during one timing."""
    per: dict = {}
    bound: dict = {}               # timings whose region was host-bound (KREX_HOST_BOUND), per kernel
    for key, ref, t, flag in flagged_timings(rows, stable, clean):
        per.setdefault(key, (ref, []))[1].append((t / ref - 1) * 100)
        bound[key] = bound.get(key, 0) + flag
    by_command = command_levels(rows, stable, clean)   # per kernel, the timings of each command that took two or more
    out = {}
    for key in sorted(per, key=lambda k: per[k][0]):
        ref, xs = per[key]
        out[f"{key[0]}/{key[1]}/{key[2]}"] = k = {
            "ref_ms": round(ref, 5), "n": len(xs), "median_pct": round(statistics.median(xs), 2),
            "min_pct": round(min(xs), 2), "max_pct": round(max(xs), 2),
            "far": sum(abs(x) > far_pct for x in xs), "host_bound": bound.get(key, 0)}
        cmds = by_command.get(key, [])
        if len(cmds) >= 2:
            medians = [statistics.median(c) for c in cmds]
            k.update(commands=len(cmds), within_pct=round(max(max(c) - min(c) for c in cmds), 2),
                     between_pct=round(max(medians) - min(medians), 2))
    return out


FLOOR_PRIVATE = ("floor_values",)   # reference_passes' keys that stay out of results


def command_levels(rows: list, stable: dict, clean=None) -> dict:
    """Per stable kernel (size, variant, kind): the inflations (percent, in order) of each command that timed it
    more than once, in the rows clean accepts. Their median is the command's level: what a process's placement or
    history set for the kernel (wider_levels)."""
    by_command: dict = {}
    for row in rows:
        mine: dict = {}
        for key, ref, t, _ in flagged_timings([row], stable, clean):
            mine.setdefault(key, []).append((t / ref - 1) * 100)
        for key, xs in mine.items():
            if len(xs) >= 2:
                by_command.setdefault(key, []).append(xs)
    return by_command


def wider_levels(shared: list, alone: list, n: int = 20000, seed: int = 7) -> Optional[dict]:
    """Are the commands' levels of a kernel spread wider when shared than in the reference processes? Each
    list: per command or process, its timings' inflations (command_levels); a level is the median of the first k
    of them, k the fewest any command on either side took (so that a side with more timings per command is not
    made narrower by them: --repeat against --reference-repeat); non-finite levels are left out. Returns the
    standard deviations of the levels (points), how many on each side, k, the shift of the medians and p_wider:
    a permutation test of the ratio of standard deviations, each side centred on its own median first (a shift
    is not a spread), one-sided, seeded, (hits + 1) / (n + 1). None with fewer than three levels on a side."""
    import numpy as np

    k = min((len(x) for x in [*shared, *alone]), default=0)
    levels = [np.array([np.median(x[:k]) for x in side], dtype=float) for side in (shared, alone)]
    a, b = (x[np.isfinite(x)] for x in levels)
    if k < 2 or len(a) < 3 or len(b) < 3:
        return None
    ca, cb = a - np.median(a), b - np.median(b)
    observed = ca.std(ddof=1) / max(cb.std(ddof=1), 1e-12)
    pool, rng, hits = np.concatenate([ca, cb]), np.random.default_rng(seed), 0
    for done in range(0, n, 2000):       # 2000 permutations at a time, as index rows
        perm = pool[rng.random((min(2000, n - done), len(pool))).argsort(axis=1)]
        ratio = perm[:, :len(ca)].std(axis=1, ddof=1) / np.maximum(perm[:, len(ca):].std(axis=1, ddof=1), 1e-12)
        hits += int((ratio >= observed * (1 - 1e-9)).sum())   # ties count as hits
    return {"sd_pct": round(float(a.std(ddof=1)), 2), "reference_sd_pct": round(float(b.std(ddof=1)), 2),
            "commands": len(a), "reference_processes": len(b), "timings_each": k,
            "median_shift_pct": round(float(np.median(a) - np.median(b)), 2), "p_wider": round((hits + 1) / (n + 1), 4)}


def holm(ps: dict) -> dict:
    """Holm's step-down adjustment of a family of p-values ({name: p}): each p times the number of tests not
    smaller than it, kept monotone, at most 1."""
    out, worst = {}, 0.0
    for i, (name, p) in enumerate(sorted(ps.items(), key=lambda kv: kv[1])):
        worst = max(worst, min(1.0, (len(ps) - i) * p))
        out[name] = round(worst, 4)
    return out


def excess_interval(groups: list, floor: list, points: float = 0.25, n: int = 2000, seed: int = 7) -> list:
    """A 90% bootstrap interval of p95(judged) - (p95(floor) + points), in points: how far past the goal a
    bucket is, with the sampling noise of both p95s. groups: per judged timing its values (one per pass
    median); floor: one value per floor timing. Both are resampled by timing, independently. Timings of one
    kernel move together (a kernel shifted by 1% shifts all of them), which this treats as independent: the
    interval is narrower than the truth, so read a bucket as past the goal beyond noise only when even its
    lower end is above 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fl = np.asarray(floor, dtype=float)
    lens = np.array([len(g) for g in groups])
    flat = np.concatenate([np.asarray(g, dtype=float) for g in groups])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    out = np.empty(n)
    for i in range(n):
        pick = rng.integers(0, len(groups), len(groups))
        vals = np.concatenate([flat[starts[j]:starts[j] + lens[j]] for j in pick])
        out[i] = p95(vals.tolist()) - p95(fl[rng.integers(0, len(fl), len(fl))].tolist()) - points
    lo, hi = np.quantile(out, [0.05, 0.95])
    return [round(float(lo), 2), round(float(hi), 2)]


def judge(rows: list, ref: dict, clean=None, points: float = 0.25, need: int = 50,
          skip_host_bound: bool = False) -> dict:
    """The fidelity goal of rows against reference_passes' result: every timing of a stable kernel (in the rows
    clean accepts) against each pass's median in turn, |timing / median - 1| in percent, the floor's own
    statistic; the p95 of those against the floor + points, with at least need timings in every bucket.
    excess_ci_points: per bucket, excess_interval's 90% interval of how far the p95 is past the floor + points.
    signed_p5_p95_pct: per bucket, the 5th and 95th percentiles of the same values signed (timing / median - 1;
    negative: faster than the reference passes): which side a p95 of |inflation| comes from (a kernel slowed by
    its neighbours, or one the reference passes ran slower than krex did)."""
    vals: dict = {b: [] for b, _, _ in BUCKETS}
    signed: dict = {b: [] for b, _, _ in BUCKETS}
    groups: dict = {b: [] for b, _, _ in BUCKETS}
    counts: dict = {b: 0 for b, _, _ in BUCKETS}
    for key, median, t in stable_timings(rows, ref["stable"], clean, skip_host_bound):
        b = bucket(median)
        counts[b] += 1
        off = [(t / m - 1) * 100 for m in ref["pass_medians"][key]]
        signed[b] += off
        groups[b].append([abs(x) for x in off])
        vals[b] += groups[b][-1]
    p = {b: (p95(v) if v else None) for b, v in vals.items()}
    floors = ref["floors_pct"]
    met = all(p[b] is not None and floors.get(b) is not None and p[b] <= floors[b] + points for b in p)
    floor_values = ref.get("floor_values") or {}
    ci = {b: (excess_interval(groups[b], floor_values[b], points) if groups[b] and floor_values.get(b) else None)
          for b in groups}
    tails = {b: ([round(quantile(v, 0.05), 2), round(quantile(v, 0.95), 2)] if v else None) for b, v in signed.items()}
    return {"p95_abs_inflation_pct": p, "kernels": counts, "enough_kernels": all(n >= need for n in counts.values()),
            "fidelity_goal": met, "excess_ci_points": ci, "signed_p5_p95_pct": tails}


def analyse(runs: list) -> dict:
    iso_runs = [r for r in runs if r["mode"] == "isolated"]
    truth: dict = {}
    for r in iso_runs:
        for row in r["rows"]:
            if "candidate_ms" in row:
                for k in ("candidate", "reference"):
                    truth.setdefault((*kernel_of(row), k), []).append(row[f"{k}_ms"])
    iso = {key: statistics.median(v) for key, v in truth.items()}
    summary = []
    for r in runs:
        infl: dict = {name: [] for name, _, _ in BUCKETS}
        for row in r["rows"]:
            if "candidate_ms" not in row:
                continue
            for k in ("candidate", "reference"):
                ref = iso.get((*kernel_of(row), k))
                if ref:
                    infl[bucket(ref)].append(row[f"{k}_ms"] / ref - 1)
        ok = [row for row in r["rows"] if "candidate_ms" in row]
        s = {"mode": r["mode"], "agents": r["agents"], "commands": r["commands"], "failed": r["failed"],
             "wall_s": round(r["wall_s"], 2), "commands_per_min": round(r["commands_per_min"], 2),
             "mean_command_wall_s": round(statistics.mean(row["wall_s"] for row in ok), 3) if ok else None,
             "p95_inflation": {b: p95(v) for b, v in infl.items()},
             "median_inflation": {b: (statistics.median(v) if v else float("nan")) for b, v in infl.items()},
             "kernels": {b: len(v) for b, v in infl.items()}}
        for k in ("warmup_s", "workers_replaced", "warm_commands"):
            if k in r:
                s[k] = r[k]
        if r["mode"].startswith("krex") and ok:
            t_cmd = statistics.mean(row["total_s"] for row in ok)
            held = statistics.mean(row.get("region_held_s", 0) for row in ok)
            iso_t = statistics.mean(row["wall_s"] for x in iso_runs for row in x["rows"] if "total_s" in row) \
                if iso_runs else t_cmd
            if r["mode"] in WARM_MODES:   # commands that skip start-up, as fast as alone: the mode's :1 commands,
                alone = [row["wall_s"] for x in runs if x["mode"] == r["mode"] and x["agents"] == 1
                         for row in x["rows"] if "total_s" in row]
                if not alone:             # or else the isolated ones without their imports (an optimistic bound)
                    alone = [row["total_s"] - row.get("import_s", 0) for x in iso_runs for row in x["rows"]
                             if "total_s" in row]
                iso_t = statistics.mean(alone) if alone else t_cmd
            bound = min(r["agents"] / iso_t, 1 / held) * 60 if held else float("nan")
            s.update(mean_command_s=round(t_cmd, 3), mean_region_held_s=round(held, 3),
                     amdahl_bound_per_min=round(bound, 2), amdahl_fraction=round(r["commands_per_min"] / bound, 3),
                     mean_region_wait_s=round(statistics.mean(row.get("region_wait_s", 0) for row in ok), 3),
                     mean_drain_s=round(statistics.mean(row.get("drain_s", 0) for row in ok), 4))
        summary.append(s)
    base = {s["agents"]: s["commands_per_min"] for s in summary if s["mode"] == "cmdlock"}
    for s in summary:
        ref = base.get(s["agents"]) or (next(iter(base.values())) if base else None)
        s["vs_cmdlock"] = round(s["commands_per_min"] / ref, 3) if ref else None
    return {"summary": summary, "isolated_medians": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in iso.items()}}


def main() -> None:
    global CANDIDATE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="isolated:1,naive:8,cmdlock:8,krex:8,krex:4,krex:16,isolated:1")
    ap.add_argument("--specs", type=int, default=16, help="candidate commands per mode (isolated: one per kind)")
    ap.add_argument("--variants", type=int, default=2, help="kernel variants per size (1-4)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budget", type=float, default=100.0, help="seconds per mode before agents stop taking work")
    ap.add_argument("--candidate", default=CANDIDATE, help="the candidate command's script (a stand-in for dry runs)")
    ap.add_argument("--logs", default=None, help="directory for the controllers' logs (default: discarded)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    CANDIDATE = os.path.abspath(args.candidate)
    specs = make_specs(args.specs, args.seed, max(1, min(4, args.variants)))
    plan = []
    for step in args.plan.split(","):
        mode, _, agents = step.partition(":")
        if mode not in MODES or not agents.isdigit() or int(agents) < 1:
            ap.error(f"bad plan step {step!r}: MODE:AGENTS with MODE one of {', '.join(MODES)}")
        plan.append((mode, int(agents)))
    runs = []
    with tempfile.TemporaryDirectory() as td:
        ctls = Controllers(Path(td), plan, Path(args.logs or td))
        try:
            for i, (mode, agents) in enumerate(plan):
                r = run_mode(mode, agents, specs, args.budget, Path(td), 1000 * (i + 1), ctls)
                runs.append(r)
                Path(args.out).write_text(json.dumps({"specs": specs, "plan": args.plan, "runs": runs,
                                                      "partial": True, **analyse(runs)}, indent=1))
                print(f"{mode}:{agents}: {r['commands']} commands ({r['failed']} failed) in {r['wall_s']:.1f} s = "
                      f"{r['commands_per_min']:.1f}/min" + (f" (pool filled in {r['warmup_s']} s)"
                                                             if "warmup_s" in r else ""), flush=True)
        finally:
            ctls.stop()
    result = {"specs": specs, "plan": args.plan, "runs": runs, **analyse(runs),
              "env": {"python": sys.version, "argv": sys.argv}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
