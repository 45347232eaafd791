#!/usr/bin/env bash
# tests/gpu/layout_h200.sh: does where a kernel's operands land in GPU memory, or which data they hold, move its
# time? bench/candidate.py's layout probe (--pads, --seeds) for the 16384/0 Triton candidate (+1.2% to +2.3% under
# load in most freeze-policy runs) and, for contrast, 16384/1 (steady); one process per kernel, nothing else on
# the GPU, not under krex. About 4 minutes (HISTORY adds 2 x its ms per step and round). Results: docs/measurements/freeze-policy.md.
# KERNELS (16384:0:3,16384:1:2: SIZE:VARIANT:ROUNDS), PADS (0,2,64,1024,4096,16384 MiB), SEEDS (1,2,3), HISTORY (none;
# e.g. idle:2000,heavy:2000: what runs before each timing; fresh:MS and frag:MS: copies in memory allocated for the
# step, frag after fragmenting the GPU's free memory (5-8 s more a step), fragctl:MS its control (the same fill after
# the copies), see bench/candidate.py --history); PADS= or SEEDS= (set, empty): none of them
# Files back: $OUT/layout.jsonl (one candidate.py JSON line per kernel), $OUT/layout.log, $OUT/layout-smi.csv
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/layout_h200.sh
set -u
. tests/gpu/env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 \
  > $OUT/layout-smi.csv & SMI=$!
for k in $(echo ${KERNELS:-16384:0:3,16384:1:2} | tr , ' '); do
  IFS=: read size variant rounds <<< "$k"
  rounds=${rounds:-3}
  timeout 300 python3 bench/candidate.py --size $size --variant $variant --nonce 1001 --repeat $rounds \
    --warmup-ms 500 --min-reps 100 --pads "${PADS-0,2,64,1024,4096,16384}" --seeds "${SEEDS-1,2,3}" --history "${HISTORY:-}" --probe \
    > $OUT/layout-$size-$variant.out 2>> $OUT/layout.log
  echo "$size/$variant rc=$?" | tee -a $OUT/layout.log
  grep '^{' $OUT/layout-$size-$variant.out >> $OUT/layout.jsonl
  rm -f $OUT/layout-$size-$variant.out
done
kill $SMI; wait $SMI 2>/dev/null
[ -s $OUT/layout.jsonl ] || { echo "layout: no kernel finished (see $OUT/layout.log)"; exit 1; }
python3 - $OUT/layout.jsonl <<'P' | tee -a $OUT/layout.log
import json, statistics, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['size']}/{r['variant']}: plain candidate {r.get('candidate_all_ms')} reference {r.get('reference_all_ms')}")
    steps = {}
    for s in r.get("layouts", []):
        kind = next(k for k in ("pad", "seed", "idle", "heavy", "fresh", "fragctl", "frag") if k in s)
        key = f"{kind} {s[kind]}" + (" MiB" if kind == "pad" else " ms" if kind != "seed" else "")
        steps.setdefault(key, []).append(s)
    for key, ss in steps.items():
        c = statistics.median(s["candidate_ms"] for s in ss)
        ref = statistics.median(s["reference_ms"] for s in ss)
        print(f"  {key:16s} candidate {c:.4f} reference {ref:.4f} ratio {c / ref:.4f}  "
              f"candidate each {[round(s['candidate_ms'], 3) for s in ss]}")
P
