#!/usr/bin/env bash
# tests/gpu/level_h200.sh: is the 16384/0 Triton candidate's slower level under load (+1.2% to +2.3% in most
# freeze-policy runs) a property of the process (set up beside the others: the same process stays slow once the
# load is gone) or of the load (it recovers when the others stop)? One probe process P times the candidate and
# cuBLAS in a krex region about every 11 s (3 s idle before each timing) for PROBE_STEPS steps; 7 agents run
# candidate.py commands of MIX under krex for the first LOAD_S seconds (each its own sequence); once they have
# ended, a fresh process Q times the same kernels beside P (4 steps). P and Q stop at LIMIT_S after the start,
# keeping the steps they printed. nvidia-smi with the memory temperature every 0.5 s. The summary groups P's steps
# by what ran beside them (load, taper, withQ, alone) with medians. About LIMIT_S + 40 s.
# PROBE_STEPS (18), LOAD_S (110), LIMIT_S (300), MIX (2048:0,2048:1,4096:0,6144:0,6144:1,8192:0,8192:1,16384:0,16384:1),
# P_HISTORY (PROBE_STEPS x idle:3000; candidate.py --history steps for P, shuffled: e.g. idle:3000 and fresh:3000 to
# tell memory allocated at the start from memory allocated at the step)
# Files back: $OUT/level-P.out, $OUT/level-Q.out (a "step" JSON line per step), $OUT/level-load.jsonl,
#   $OUT/level-smi.csv, $OUT/level.log, $OUT/level-controller.log
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/level_h200.sh
set -u
. tests/gpu/env.sh
make -s shim || exit 1          # a fresh device machine has no build/ (without it every `krex run` refuses)
W=/tmp/krex-level; rm -rf $W; mkdir -p $W
export KREX_SOCKET=$W/krex.sock
: > $OUT/level.log; rm -f $OUT/level-load.jsonl
DEADLINE=$(( $(date +%s) + ${LIMIT_S:-300} ))   # P and Q are stopped by then (their steps so far are kept)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active \
  --format=csv -lms 500 > $OUT/level-smi.csv & SMI=$!
python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file $W/state > $OUT/level-controller.log 2>&1 & CTL=$!
for i in $(seq 150); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done
[ -S $KREX_SOCKET ] || { echo "level: no controller" | tee -a $OUT/level.log; kill $SMI $CTL; exit 1; }
STEPS_ARG=${P_HISTORY:-$(python3 -c "print(','.join(['idle:3000'] * ${PROBE_STEPS:-18}))")}
probe() {  # probe NAME NONCE STEPS: one process, a timing of candidate and reference per step, each after 3 s idle
  local left=$(( DEADLINE - $(date +%s) ))
  [ $left -ge 1 ] || left=1      # (timeout 0 would mean none)
  timeout -k 5 $left python3 -m krex_ctl run -- python3 bench/candidate.py --size 16384 \
    --variant 0 --nonce $2 --region --warmup-ms 500 --min-reps 100 --pads "" --seeds "" --history "$3" \
    > $OUT/level-$1.out 2>> $OUT/level.log
  echo "probe $1 rc=$? $(date +%s.%N)" | tee -a $OUT/level.log
}
echo "start $(date +%s.%N)" | tee -a $OUT/level.log
probe P 3001 "$STEPS_ARG" & P=$!
LOADERS=()
END=$(( $(date +%s) + ${LOAD_S:-110} ))
echo "load until $END" | tee -a $OUT/level.log
MIX=($(echo ${MIX:-2048:0 2048:1 4096:0 6144:0 6144:1 8192:0 8192:1 16384:0 16384:1} | tr , ' '))
for a in 1 2 3 4 5 6 7; do
  ( k=0
    while [ $(date +%s) -lt $END ]; do
      IFS=: read size variant <<< "${MIX[$(( (a - 1 + k) % ${#MIX[@]} ))]}"
      python3 -m krex_ctl run -- python3 bench/candidate.py --size $size --variant $variant --nonce $((4000 + a * 100 + k)) \
        --region --repeat 2 --warmup-ms 500 --min-reps 100 2>> $OUT/level.log > $W/load-$a.out \
        || { echo "agent $a: $size/$variant failed; this agent stops (see above)" | tee -a $OUT/level.log; break; }
      grep '^{' $W/load-$a.out >> $OUT/level-load.jsonl
      k=$((k + 1))
    done ) & LOADERS+=($!)
done
wait "${LOADERS[@]}"            # each loader ends with the command it was running at LOAD_S
echo "load done $(date +%s.%N)" | tee -a $OUT/level.log
probe Q 3002 "idle:3000,idle:3000,idle:3000,idle:3000" & Q=$!
wait $P $Q                      # not a bare wait: nvidia-smi and the controller run until killed
kill $CTL; wait $CTL 2>/dev/null
kill $SMI; wait $SMI 2>/dev/null
python3 - $OUT <<'PY' | tee -a $OUT/level.log
import json, os, statistics, sys
out = sys.argv[1]
m = {}
for line in open(f"{out}/level.log"):
    w = line.split()
    if line.startswith("start "): m["start"] = float(w[1])
    elif line.startswith("load until "): m["end"] = float(w[2])
    elif line.startswith("load done "): m["done"] = float(w[2])
    elif line.startswith("probe Q rc="): m["q"] = float(w[3])
inf = float("inf")
t0, end, done, q_end = m["start"], m.get("end", inf), m.get("done", inf), m.get("q", inf)
STEP = 11      # a step's two timings lie within ~11 s after its "t" (3 s idle, candidate, 3 s idle, reference)
def phase(t):  # P's steps: load (all 7 agents), taper (some finishing), withQ (Q beside it), alone, mixed
    return ("load" if t + STEP <= end else "taper" if t < done else "withQ" if t + STEP <= q_end
            else "alone" if t >= q_end else "mixed")
groups = {}
for name in ("P", "Q"):
    try:
        lines = open(f"{out}/level-{name}.out").read().splitlines()
    except OSError:
        print(f"{name}: no output"); continue
    final = [json.loads(l) for l in lines if l.startswith("{")]
    steps = [json.loads(l[5:]) for l in lines if l.startswith("step ")]
    print(f"{name}: first timing candidate {final[-1]['candidate_ms']:.3f} reference {final[-1]['reference_ms']:.3f}"
          if final else f"{name}: cut short (no final line), {len(steps)} steps")
    for s in sorted(steps, key=lambda s: s["t"]):
        when = phase(s["t"]) if name == "P" else "withP"
        kind = next(k for k in ("idle", "fresh", "heavy", "pad", "seed") if k in s)
        r = s["candidate_ms"] / s["reference_ms"]
        groups.setdefault(f"{name} {when} {kind}", []).append((s["candidate_ms"], r))
        print(f"  t={s['t'] - t0:6.1f} s {when:5s} {kind:5s} candidate {s['candidate_ms']:.3f} reference {s['reference_ms']:.3f} ratio {r:.4f}")
for key, v in sorted(groups.items()):
    print(f"{key:15s} n={len(v):2d} median candidate {statistics.median(c for c, _ in v):.3f} ms, ratio {statistics.median(r for _, r in v):.4f}")
n = sum(1 for _ in open(f"{out}/level-load.jsonl")) if os.path.exists(f"{out}/level-load.jsonl") else 0
print(f"load: {n} commands finished; LOAD_S ended at {end - t0:.0f} s, the last at {done - t0:.0f} s, Q at {q_end - t0:.0f} s")
PY
