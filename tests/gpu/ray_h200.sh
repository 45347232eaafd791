#!/usr/bin/env bash
# tests/gpu/ray_h200.sh: a Ray fleet on one H200 (bench/ray_fleet.py): 8 agents with num_gpus=0.125, naive and
# under krex (krex.ray.runtime_env, and krex.ray.shell), against one task per GPU. One device call, about
# 5 minutes; results in $OUT/ray-fleet.json, logs (controller, Ray, nvidia-smi) in $OUT/ray-fleet-logs.tgz.
#
# The H200 has torch and triton but neither ray nor cffi, and reaches no package registry, so the wheels travel
# in .whl/. Ray's wheel (ray 2.60.0, cp312) is 79 MB, over the 64 MiB a call carries with the tree; 32 MB of it
# is a Java jar (ray/jars) and 3 MB the dashboard's web pages, which a Python worker never loads. So, here
# first (on a machine that reaches the registry):
#     bash tests/gpu/ray_h200.sh prepare      # .whl/: ray without those parts (~40 MB), its deps, cffi
# then one device call with carry [".whl"]:
#     bash tests/gpu/ray_h200.sh
# Settings: AGENTS (8), PLAN (pergpu,naive,krex,shell), SPECS (16), MIX (bench/ray_fleet.py's --mix, e.g.
# 2048:0.3,4096:0.2,8192/1:0.25,16384/1:0.25), BUDGET (75 s per mode), LIMIT (420 s),
# TIMER (events): the evaluations' timer, events (do_bench) or graph (do_bench_cudagraph).
# REF_HOLDER_GIB (0): bench/ray_fleet.py --reference-holder-gib, each REFERENCE evaluation beside a seeded holder.
# NONCE_OFFSET (0): bench/ray_fleet.py --nonce-offset (other nonces: other holder patterns, other placements).
# SCATTER_GIB (0): bench/ray_fleet.py --scatter-gib, each evaluation's inputs placed between memory of its own (every mode).
# WARMUP_MS (25) and MIN_REPS (0): the candidates' do_bench warm-up and least repetitions (500 and 100: the
# power-steady harness of docs/measurements/harness-stability.md).
# REPEAT (1: timings per kernel per evaluation); REF_REPEAT (0: as REPEAT) the same in the REFERENCE mode's passes
# only (not pergpu's when pergpu is the throughput baseline: refused), for a floor of >= 50 timings per bucket.
# REF_PROCS (1): evaluations per distinct kernel in each pass of the REFERENCE mode (each its own worker process). Fidelity against the same-run floor needs a second pergpu pass
# and >= 50 timings per bucket, e.g.  PLAN=pergpu,krex,pergpu SPECS=400 BUDGET=150 REPEAT=2 LIMIT=420
# CTL_ARGS: more options for the krex controller, e.g. CTL_ARGS="--region-gap-ms 200".
# REFERENCE (pergpu), pergpubusy or pergpukrex: the passes that judge (pergpubusy: one task per GPU beside a GPU neighbour
# frozen in every region; both with two passes each, e.g. PLAN=pergpu,pergpubusy,krex,pergpubusy,pergpu)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

if [ "${1:-}" = prepare ]; then
  set -e
  rm -rf .whl/ray-full && mkdir -p .whl/ray-full
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl/ray-full ray==2.60.0 cffi click psutil nvidia-ml-py
  python3 - <<'EOF'
import base64, glob, hashlib, os, shutil, zipfile
DROP = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/",
        "ray/data/", "ray/llm/")          # Java workers, the web UI, libraries of their own: no Python worker loads them
for path in glob.glob(".whl/ray-full/*.whl"):
    name = os.path.basename(path)
    if not name.startswith("ray-"):
        shutil.move(path, os.path.join(".whl", name))
        continue
    src = zipfile.ZipFile(path)
    out = os.path.join(".whl", name)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        record = None
        for info in src.infolist():
            if info.filename.startswith(DROP):
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                record = info
                continue
            dst.writestr(info, src.read(info.filename))
        kept = {i.filename for i in dst.infolist()}
        lines = [l for l in src.read(record.filename).decode().splitlines() if l.split(",")[0] in kept]
        dst.writestr(record.filename, "\n".join(lines + [f"{record.filename},,"]) + "\n")
    print(f"{name}: {os.path.getsize(path) / 2**20:.1f} MiB -> {os.path.getsize(out) / 2**20:.1f} MiB")
shutil.rmtree(".whl/ray-full")
total = sum(os.path.getsize(p) for p in glob.glob(".whl/*.whl"))
print(f".whl/: {len(glob.glob('.whl/*.whl'))} wheels, {total / 2**20:.1f} MiB")
EOF
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  whl=$(du -cb .whl/*.whl | tail -1 | cut -f1)
  echo "tree $((tree / 1048576)) MiB + .whl $((whl / 1048576)) MiB of the 64 MiB a device call carries"
  [ $((tree + whl)) -lt $((64 * 1048576)) ] || { echo "too big to carry"; exit 1; }
  exit 0
fi

OUT=${OUT:-/tmp/krex-out}
L=/tmp/rayfleet
mkdir -p "$OUT" $L
# the carried wheels, only those whose package this Python lacks (torch's own stay as they are)
python3 - > $L/install.txt <<'EOF'
import glob, importlib.metadata, os
ALWAYS = {"ray", "cffi", "pycparser"}
for path in sorted(glob.glob(".whl/*.whl")):
    dist = os.path.basename(path).split("-")[0]
    try:
        have = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have is None or dist.lower() in ALWAYS:
        print(path)
EOF
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(cat $L/install.txt) 2>&1 | tail -5
export PYTHONPATH=$PWD:/tmp/site RAY_USAGE_STATS_ENABLED=0
make -s shim || exit 1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import ray, torch, triton; print("ray", ray.__version__, "torch", torch.__version__, "triton", triton.__version__)'
  nproc; cat $L/install.txt; } 2>&1 | tee $OUT/ray-info.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv -lms 500 > $L/smi.csv & SMI=$!
timeout ${LIMIT:-420} python3 bench/ray_fleet.py --agents ${AGENTS:-8} --plan ${PLAN:-pergpu,naive,krex,shell} \
  --specs ${SPECS:-16} $([ -n "${MIX:-}" ] && echo --mix $MIX) --budget ${BUDGET:-75} --repeat ${REPEAT:-1} --reference-repeat ${REF_REPEAT:-0} --reference-processes ${REF_PROCS:-1} --reference-holder-gib ${REF_HOLDER_GIB:-0} --warmup-ms ${WARMUP_MS:-25} --min-reps ${MIN_REPS:-0} --timer ${TIMER:-events} --scatter-gib ${SCATTER_GIB:-0} --nonce-offset ${NONCE_OFFSET:-0} --reference ${REFERENCE:-pergpu} --controller-args="${CTL_ARGS:-}" --logs $L --out $OUT/ray-fleet.json > $L/ray-fleet.log 2>&1
echo "ray_fleet rc=$?"
kill $SMI
grep -v '^\s' $L/ray-fleet.log | tail -20
python3 - <<EOF
import json
d = json.load(open("$OUT/ray-fleet.json"))
for s in d["summary"]:
    print(s["mode"], s["agents"], s["num_gpus"], "evals", s["commands"], "failed", s["failed"], "per min",
          s["commands_per_min"], "vs pergpu", s["vs_pergpu"], "p95", s["p95_inflation"], "regions",
          s.get("regions"), "exclusive", s.get("regions_exclusive"), "taints", s.get("taints"))
f = d.get("fidelity") or {}
print("floors", f.get("floors_pct"), "floor kernels", f.get("floor_kernels"), "unstable", f.get("unstable"))
for m, x in (f.get("modes") or {}).items():
    print(m, "p95 abs", x["p95_abs_inflation_pct"], "kernels", x["kernels"], "goal", x["fidelity_goal"] and x["enough_kernels"])
EOF
tar czf $OUT/ray-fleet-logs.tgz -C $L . 2>/dev/null
ls -la $OUT
