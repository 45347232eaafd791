"""krex demo: several benchmark commands at once on one GPU, each timing inside a krex region.

On a machine with a CUDA GPU (and torch with triton) it runs real bf16 matmul benchmarks
(examples/python_region.py) next to busy neighbours; otherwise it runs the C benchmark
(examples/c/spin_bench.c) on krex's fake driver, where the kernel trace lets it prove that no neighbour
kernel ran inside any region. It says which, and why.
    make demo
    python examples/demo.py [--fake]      (after `make shim fakes`, with krex importable)
    python3 examples/demo.py --has-gpu    (exit status 0 when a CUDA GPU answers; needs nothing installed)

The GPU is detected through the driver itself (libcuda.so.1: cuInit, cuDeviceGetCount), not through
torch, so `make demo` on a machine without a GPU never installs torch."""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"


def cuda_devices() -> int:
    """How many CUDA GPUs the driver reports (0 without a driver or a device); loads nothing but libcuda."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    n = ctypes.c_int(0)
    try:
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return 0
    except AttributeError:
        return 0
    return n.value


def torch_sees_gpu() -> bool:
    probe = "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def krex_run(env, report, cmd, **kw):
    # every command on GPU 0: the demo shares one GPU (with no --gpu, krex would place them across the node)
    return subprocess.Popen([sys.executable, "-m", "krex_ctl", "run", "--gpu", "0", "--report", str(report), "--"]
                            + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def alive(pid: int) -> bool:
    """pid runs (a zombie, exited and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--has-gpu", action="store_true", help="only say (exit status 0) whether a CUDA GPU answers")
    ap.add_argument("--fake", action="store_true", help="use the fake driver even where there is a GPU")
    ap.add_argument("--keep", action="store_true", help="keep the reports, the trace and the controller's log")
    args = ap.parse_args()
    devices = cuda_devices()
    if args.has_gpu:
        return 0 if devices else 1
    gpu = False
    if devices and not args.fake:
        gpu = torch_sees_gpu()
        if not gpu:
            print("krex demo: the driver reports a CUDA GPU, but this Python's torch (with triton) does not see it; "
                  "using the fake driver")
    tmp = Path(tempfile.mkdtemp(prefix="krex-demo-"))
    env = dict(os.environ, KREX_SOCKET=str(tmp / "krex.sock"), PYTHONPATH=str(ROOT))
    env.pop("LD_PRELOAD", None)
    if gpu:
        print("krex demo on the real GPU: 3 matmul benchmarks with regions + 2 busy neighbours, all at once\n")
        bench = [sys.executable, str(ROOT / "examples" / "python_region.py"), "--sizes", "8192", "--trials", "3"]
        hog = [sys.executable, str(ROOT / "bench" / "contender.py"), str(tmp / "stop"), str(tmp / "ready")]
    else:
        why = "--fake" if args.fake else ("no CUDA GPU here" if not devices else "torch does not see the GPU")
        print(f"krex demo on the FAKE driver ({why}): 3 C benchmarks with regions + 2 busy neighbours,"
              " all at once\n")
        env.update(LD_LIBRARY_PATH=f"{BUILD / 'fakes'}:{env.get('LD_LIBRARY_PATH', '')}",
                   KREX_FAKE_TRACE=str(tmp / "trace"), SNIPPET_MS="4000", SNIPPET_STREAMS="2",
                   SNIPPET_STOP=str(tmp / "stop"))   # the neighbours stop once the benchmarks are done
        bench = [str(BUILD / "snippets" / "spin_bench"), "-r", "4", "-n", "5", "-u", "2000"]
        hog = [str(BUILD / "snippets" / "hog")]
    t0 = time.monotonic()
    hogs = [krex_run(env, tmp / f"hog{i}.json", hog) for i in range(2)]
    if gpu:
        while not (tmp / "ready").exists():
            time.sleep(0.1)
    benches = [krex_run(env, tmp / f"bench{i}.json", bench) for i in range(3)]
    outputs = [p.communicate(timeout=600) for p in benches]
    (tmp / "stop").touch()
    for p in hogs:
        p.communicate(timeout=600)
    wall = time.monotonic() - t0
    regions = []
    for i, (out, err) in enumerate(outputs):
        rep = json.loads((tmp / f"bench{i}.json").read_text())
        print(f"benchmark {i}: exit {rep['exit_code']}, {rep['launches']} launches, {len(rep['regions'])} regions, "
              f"waited {rep['waited_ns'] / 1e6:.1f} ms in total")
        for line in out.splitlines():
            if line.startswith("{"):
                print("    " + line)
        for r in rep["regions"]:
            regions.append(r)
            verdict = "exclusive and clean" if r.get("exclusive") and r.get("clean") else \
                f"{'exclusive' if r.get('exclusive') else 'NOT exclusive'}, taints {', '.join(r.get('taints', []))}"
            frozen = f"{r['frozen']} other GPU process{'' if r['frozen'] == 1 else 'es'} frozen"
            print(f"    region '{r['name']}': waited {(r['granted_ns'] - r['requested_ns']) / 1e6:.2f} ms for the GPU "
                  f"({frozen}), held it {(r['ended_ns'] - r['granted_ns']) / 1e6:.2f} ms, {verdict}")
    for i in range(2):
        rep = json.loads((tmp / f"hog{i}.json").read_text())
        print(f"neighbour {i}: {rep['launches']} launches, held at the gate for {rep['gate_waited_ns'] / 1e6:.1f} ms")
    print(f"\nall done in {wall:.1f} s")
    status = 0
    if not gpu:
        inside = flagged = 0     # in regions reported exclusive (a broken promise); in regions reported not
        exclusive = [r for r in regions if r.get("exclusive")]
        for line in (tmp / "trace").read_text().splitlines():
            _pid, _sid, start, end, name = line.split(" ")[:5]   # key=value fields may follow the name
            if name != "hog":
                continue
            overlaps = [r for r in regions if int(start) < r["ended_ns"] and int(end) > r["granted_ns"]]
            inside += any(r.get("exclusive") for r in overlaps)
            flagged += bool(overlaps) and not any(r.get("exclusive") for r in overlaps)
        print(f"fake-driver trace: {inside} neighbour kernels ran inside any of the {len(exclusive)} regions "
              f"reported exclusive" + (f" ({flagged} inside the {len(regions) - len(exclusive)} reported not "
                                       "exclusive, as they say)" if flagged else ""))
        status = 1 if inside else 0
    st = subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=env, capture_output=True, text=True)
    if st.returncode == 0:
        ctl = json.loads(st.stdout)
        c, pid = ctl["counters"], ctl["controller"]["pid"]
        # a context begun just as a region closed the gate is drained with the region; one found only after the
        # drain would taint it late_context
        def n(count: int, what: str) -> str:    # what: its plural's "s" at the "|"
            return f"{count} {what.replace('|', '' if count == 1 else 's')}"

        print(f"the controller: {n(c['regions_granted'], 'region| granted')}, "
              f"{n(c['frozen_total'], 'neighbour freeze|')}, "
              f"{n(c['late_contexts_drained'], 'context| begun as a region started, drained with it')}, "
              f"{n(c['late_contexts_tainted'], 'region| tainted late_context')} (`krex status` shows the queue "
              "while commands run)")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
    if args.keep or status:
        print(f"\nreports, trace and the controller's log: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
