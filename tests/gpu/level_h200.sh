#!/usr/bin/env bash
# tests/gpu/level_h200.sh: is the 16384/0 Triton candidate's slower level under load (+1.2% to +2.3% in most
# freeze-policy runs) a property of the process (where it was set up: the same process stays slow once the load is
# gone) or of the load (it recovers when the others stop)? One probe process P times the candidate and cuBLAS in a
# krex region every ~10 s for PROBE_STEPS steps; 7 agents run the freeze-policy mix under krex for the first LOAD_S
# seconds; a fresh process Q times the same kernels alone after the load. Timestamps per timing, nvidia-smi with
# the memory temperature every 0.5 s. About LOAD_S + 130 s.
# PROBE_STEPS (26), LOAD_S (150), MIX sizes (2048:0,2048:1,4096:0,6144:0,6144:1,8192:0,8192:1,16384:0,16384:1)
# Files back: $OUT/level-P.json, $OUT/level-Q.json, $OUT/level-load.jsonl, $OUT/level-smi.csv, $OUT/level.log
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/level_h200.sh
set -u
. tests/gpu/env.sh
make -s shim || exit 1          # a fresh device machine has no build/ (without it every `krex run` refuses)
export KREX_SOCKET=/tmp/krex-level/krex.sock; mkdir -p /tmp/krex-level
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,clocks_event_reasons.active \
  --format=csv -lms 500 > $OUT/level-smi.csv & SMI=$!
python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-level/state > $OUT/level-controller.log 2>&1 & CTL=$!
sleep 3
STEPS_ARG=$(python3 -c "print(','.join(['idle:3000'] * ${PROBE_STEPS:-26}))")
probe() {  # probe NAME NONCE STEPS: one process, a timing of candidate and reference per step, each after 3 s idle
  python3 -m krex_ctl run -- python3 bench/candidate.py --size 16384 --variant 0 --nonce $2 --region --warmup-ms 500 \
    --min-reps 100 --pads "" --seeds "" --history "$3" > $OUT/level-$1.out 2>> $OUT/level.log
  echo "probe $1 rc=$? $(date +%T)" | tee -a $OUT/level.log
  grep '^{' $OUT/level-$1.out > $OUT/level-$1.json; rm -f $OUT/level-$1.out
}
echo "start $(date +%s.%N)" | tee -a $OUT/level.log
probe P 3001 "$STEPS_ARG" & P=$!
LOADERS=()
END=$(( $(date +%s) + ${LOAD_S:-150} ))
MIX=(${MIX:-2048:0 2048:1 4096:0 6144:0 6144:1 8192:0 8192:1 16384:0 16384:1})
for a in 1 2 3 4 5 6 7; do
  ( i=$a
    while [ $(date +%s) -lt $END ]; do
      IFS=: read size variant <<< "${MIX[$(( (i * 5 + a) % ${#MIX[@]} ))]}"
      python3 -m krex_ctl run -- python3 bench/candidate.py --size $size --variant $variant --nonce $((4000 + a * 100 + i)) \
        --region --repeat 2 --warmup-ms 500 --min-reps 100 2>> $OUT/level.log > $OUT/level-load-$a.out \
        || { echo "agent $a: a command failed; this agent stops (see above)" | tee -a $OUT/level.log; break; }
      grep '^{' $OUT/level-load-$a.out >> $OUT/level-load.jsonl
      i=$((i + 1))
    done
    rm -f $OUT/level-load-$a.out ) & LOADERS+=($!)
done
wait "${LOADERS[@]}"            # each loader ends with the command it was running at LOAD_S
echo "load done $(date +%s.%N)" | tee -a $OUT/level.log
probe Q 3002 "idle:3000,idle:3000,idle:3000,idle:3000,idle:3000" & Q=$!
wait $P $Q                      # not a bare wait: nvidia-smi and the controller run until killed
kill $CTL; wait $CTL 2>/dev/null
kill $SMI; wait $SMI 2>/dev/null
python3 - $OUT <<'P' | tee -a $OUT/level.log
import json, sys, os
out = sys.argv[1]
marks = dict(l.split()[:2] if l.startswith("start") else ("load", l.split()[2]) for l in open(f"{out}/level.log")
             if l.startswith(("start", "load done")))
t0, t_load = float(marks["start"]), float(marks["load"])
for name in ("P", "Q"):
    try:
        r = json.loads(open(f"{out}/level-{name}.json").read().splitlines()[0])
    except (OSError, IndexError, ValueError):
        print(f"{name}: no result"); continue
    print(f"{name}: first timing candidate {r['candidate_ms']:.3f} reference {r['reference_ms']:.3f}")
    for s in r.get("layouts", []):
        when = "load" if s["t"] < t_load else "alone"
        print(f"  t={s['t'] - t0:6.1f} s {when:5s} candidate {s['candidate_ms']:.3f} reference {s['reference_ms']:.3f} "
              f"ratio {s['candidate_ms'] / s['reference_ms']:.4f}")
n = sum(1 for _ in open(f"{out}/level-load.jsonl")) if os.path.exists(f"{out}/level-load.jsonl") else 0
print(f"load: {n} commands finished")
P
