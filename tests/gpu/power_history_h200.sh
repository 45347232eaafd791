#!/usr/bin/env bash
# tests/gpu/power_history_h200.sh: bench/power_history.py on the H200 twice: with its own settle (NVML's clock
# at 98% of the peak) and under `krex run`, each timing a krex region settled by krex's canary (shim/settle.c).
# About 4 minutes. Results: docs/measurements/power-history.md.
# Files back: $OUT/power-history{,-krex}.{json,log}, $OUT/power-history-krex.report.json, $OUT/ph-controller.log
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/power_history_h200.sh
set -u
. tests/gpu/env.sh
make -s shim || exit 1
nvidia-smi --query-gpu=name,temperature.gpu,power.draw,power.limit,clocks.sm --format=csv
if [ "${SKIP_NVML:-0}" != 1 ]; then
  timeout 240 python3 bench/power_history.py --out $OUT/power-history.json > $OUT/power-history.log 2>&1
  echo "own settle: rc=$?"; grep -E "^(cold|heavy)" $OUT/power-history.log
fi
W=/tmp/krex-ph; rm -rf $W; mkdir -p $W
export KREX_SOCKET=$W/krex.sock
python3 -m krex_ctl controller --socket $KREX_SOCKET --gpus 0 > $OUT/ph-controller.log 2>&1 & CTL=$!
for i in $(seq 100); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done
timeout 240 python3 -m krex_ctl run --report $OUT/power-history-krex.report.json -- \
  python3 bench/power_history.py --krex --out $OUT/power-history-krex.json > $OUT/power-history-krex.log 2>&1
echo "krex settle: rc=$?"
python3 bench/power_history.py --join $OUT/power-history-krex.report.json --out $OUT/power-history-krex.json
grep -E "^(cold|heavy)" $OUT/power-history-krex.log
python3 -c "
import json; d=json.load(open('$OUT/power-history-krex.json'))
for k, v in d['summary'].items(): print(k, v.get('krex_settle'))"
kill $CTL; wait $CTL
