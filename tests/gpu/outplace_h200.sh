#!/usr/bin/env bash
# tests/gpu/outplace_h200.sh: does a Triton candidate's time follow where its output lands? bench/candidate.py
# times the 16384 candidates many times in one process (do_bench, 500 ms warm-up, >= 100 repetitions), alone on
# the GPU, not under krex: each call allocating its output from torch's caching allocator (as the mix's commands
# do), and writing into one output allocated at the start (--fixed-out). Each timing is printed with the output's
# address. About 3.5 minutes. Results: docs/measurements/freeze-policy.md.
# RUNS (1:16,1:16:fixed,0:12: VARIANT:TIMINGS[:fixed], all at size 16384)
# Files back: $OUT/outplace.jsonl (one candidate.py JSON line per run; "fixed_out" in those with --fixed-out),
# $OUT/outplace.log
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/outplace_h200.sh
set -u
. tests/gpu/env.sh
for r in $(echo ${RUNS:-1:16,1:16:fixed,0:12} | tr , ' '); do
  IFS=: read variant n fixed <<< "$r"
  if ! [[ "$variant" =~ ^[0-3]$ && "$n" =~ ^[1-9][0-9]*$ && "${fixed:-}" =~ ^(fixed)?$ ]]; then
    echo "outplace: RUNS entry '$r' is not VARIANT:TIMINGS[:fixed] (variant 0-3)" | tee -a $OUT/outplace.log; exit 2
  fi
  # 3 x 180 s at most: the summary still runs inside the device's 600 s
  timeout 180 python3 bench/candidate.py --size 16384 --variant $variant --nonce 1001 --repeat $n \
    --warmup-ms 500 --min-reps 100 $([ "${fixed:-}" = fixed ] && echo --fixed-out) > /tmp/outplace.out 2>> $OUT/outplace.log
  echo "16384/$variant x$n ${fixed:-} rc=$?" | tee -a $OUT/outplace.log
  grep '^{' /tmp/outplace.out >> $OUT/outplace.jsonl
done
[ -s $OUT/outplace.jsonl ] || { echo "outplace: no run finished (see $OUT/outplace.log)"; exit 1; }
python3 - $OUT/outplace.jsonl <<'P' | tee -a $OUT/outplace.log
import json, statistics, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    c = r.get("candidate_all_ms", [r["candidate_ms"]])
    ref = r.get("reference_all_ms", [r["reference_ms"]])
    ptrs = r.get("candidate_out_ptrs", [])
    mc, mr = statistics.median(c), statistics.median(ref)
    print(f"16384/{r['variant']} {'fixed output' if r.get('fixed_out') else 'output per call'}: candidate median {mc:.4f} "
          f"range {min(c):.4f}-{max(c):.4f} ({(max(c) / min(c) - 1) * 100:.2f}%), reference median {mr:.4f} "
          f"range {(max(ref) / min(ref) - 1) * 100:.2f}%, {len(set(ptrs))} output addresses")
    by = {}
    for p, t in zip(ptrs, c):
        by.setdefault(p, []).append(round((t / mc - 1) * 100, 2))
    for p, ts in by.items():
        print(f"  output {p:#x}: {len(ts)} timings, vs median (%) {ts}")
P
