#!/usr/bin/env bash
# tests/gpu/hostbound_h200.sh: the host-bound check (KREX_HOST_BOUND) on the H200: tests/gpu/hostbound_probe.py
# under `krex run` with the check on, then off (the reference for the cost case), then on again with the process
# confined to one CPU that a busy loop shares (a second controller, with --no-cpu-isolation, so that the region
# keeps that CPU). About 45 s. Results: docs/measurements/host-bound-check.md.
# Files back: $OUT/hostbound.log (controller and runs), $OUT/hostbound.jsonl (one line per case and run).
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/hostbound_h200.sh
set -u
. tests/gpu/env.sh
W=/tmp/krex-hb; rm -rf $W; mkdir -p $W
export KREX_SOCKET=$W/krex.sock
make -s shim || exit 1
python3 -m krex_ctl controller --socket $KREX_SOCKET --gpus 0 > $W/controller.log 2>&1 & CTL=$!
for i in $(seq 100); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done
K="python3 -m krex_ctl run"
for mode in on off; do
  echo "== check $mode" | tee -a $OUT/hostbound.log
  KREX_HOST_BOUND=$([ $mode = on ] && echo 1 || echo 0) $K -- python3 tests/gpu/hostbound_probe.py \
    >> $OUT/hostbound.jsonl 2>> $OUT/hostbound.log
  echo "rc=$?" | tee -a $OUT/hostbound.log
done
kill $CTL; wait $CTL; cat $W/controller.log >> $OUT/hostbound.log; rm -f $KREX_SOCKET
echo "== check on, one CPU shared with a busy loop (controller --no-cpu-isolation)" | tee -a $OUT/hostbound.log
python3 -m krex_ctl controller --socket $KREX_SOCKET --gpus 0 --no-cpu-isolation > $W/controller.log 2>&1 & CTL=$!
for i in $(seq 100); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done
CPU=$(python3 -c 'import os; print(sorted(os.sched_getaffinity(0))[0])')
taskset -c $CPU python3 -c 'import time; t=time.time()+120
while time.time()<t: pass' & HOG=$!
KREX_HOST_BOUND=1 taskset -c $CPU $K -- python3 tests/gpu/hostbound_probe.py 2>> $OUT/hostbound.log \
  | sed 's/"check": "1"/"check": "1-loaded"/' >> $OUT/hostbound.jsonl
echo "rc=${PIPESTATUS[0]}" | tee -a $OUT/hostbound.log
kill $HOG 2>/dev/null
kill $CTL; wait $CTL
cat $W/controller.log >> $OUT/hostbound.log
cat $OUT/hostbound.jsonl
