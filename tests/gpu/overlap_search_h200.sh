#!/usr/bin/env bash
# tests/gpu/overlap_search_h200.sh: where concurrency loses to serial on the H200, then the overlap controls on
# those cases, in one device call of at most LIMIT seconds (420):
#   1. bench/overlap_search.py: every s-* case of bench/overlap_proxy.py without krex or controls (alone, serial,
#      concurrent), the suspected losses timed again in a second process; a loss is one both processes show;
#   2. bench/overlap_proxy.py on at most 3 of the confirmed losses (worst first, those with the worst one's launch
#      count, its --guard-epoch), under `krex run --overlap`, for the variants in VARIANTS (below), no training step.
# Carry .whl (cffi and pycparser, for `krex run` and its reports). Back in $OUT: overlap-search.json,
# search-1.log/-2.log (+ .json), overlap-summary.json, overlap.png, overlap-logs.tgz, overlap-search-run.log.
#   LIMIT (420) seconds for everything; SEARCH_CASES= narrows the search; VARIANTS= the controls' variants;
#   REPS (10) timed repetitions per measurement in both steps (the median kept); TOP (3) losses handed on
set -u
. tests/gpu/env.sh
mkdir -p /tmp/krex-gpu; export KREX_SOCKET=/tmp/krex-gpu/krex.sock XDG_RUNTIME_DIR=/tmp/krex-gpu
START=$(date +%s); LIMIT=${LIMIT:-420}
make -s shim || { echo "the shim did not build" | tee $OUT/overlap-search-run.log; exit 1; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c 'import torch, triton, cupy; print("torch", torch.__version__, "triton", triton.__version__, "cupy", cupy.__version__)'
  git log --oneline -1 2>/dev/null
} > $OUT/overlap-search-run.log 2>&1
timeout $(( LIMIT / 2 )) python3 bench/overlap_search.py --out $OUT ${SEARCH_CASES:+--cases $SEARCH_CASES} \
  --reps ${REPS:-10} --timeout $(( LIMIT / 4 - 5 )) >> $OUT/overlap-search-run.log 2>&1
RC=$?
echo "overlap_search rc=$RC after $(( $(date +%s) - START )) s" | tee -a $OUT/overlap-search-run.log
if [ $RC -ne 0 ] || [ ! -s $OUT/overlap-search.json ]; then   # cut short, or suspects not timed again
  echo "the search did not finish: no verdict on losses" | tee -a $OUT/overlap-search-run.log
  ls -la $OUT; exit 1
fi
read -r CASES EPOCH <<< "$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(",".join(d["handed_on"][:int(sys.argv[2])]), d["guard_epoch"] or "")' $OUT/overlap-search.json ${TOP:-3} 2>/dev/null)"
if [ -z "$CASES" ] || [ -z "${EPOCH:-}" ]; then
  echo "no confirmed loss: nothing for the controls to turn around" | tee -a $OUT/overlap-search-run.log
else
  echo "the controls on $CASES (guard epoch $EPOCH)" | tee -a $OUT/overlap-search-run.log
  python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/overlap.state \
    > /tmp/krex-gpu/overlap-controller.log 2>&1 & CTL=$!
  sleep 2
  LEFT=$(( LIMIT - ($(date +%s) - START) ))
  V=${VARIANTS:-off,priority,guard+priority,sm_target=116,guard+sm_target=116,priority+sm_target=116,guard+priority+sm_target=116,shape=1,guard+shape=1,priority+shape=1+sm_target=116,guard+priority+shape=1+sm_target=116,stream-priority,off-again}
  timeout $LEFT python3 bench/overlap_proxy.py --out $OUT --budget $(( LEFT - 20 )) --cases $CASES --variants $V \
    --guard-epoch $EPOCH --train-rounds 0 --reps ${REPS:-10} >> $OUT/overlap-search-run.log 2>&1
  echo "overlap_proxy rc=$? after $(( $(date +%s) - START )) s" | tee -a $OUT/overlap-search-run.log
  kill $CTL; wait $CTL
fi
grep -v '^{' $OUT/overlap-search-run.log | tail -60
ls -la $OUT
