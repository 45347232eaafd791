#!/usr/bin/env bash
# tests/gpu/kbmix_h200.sh: KernelBench agents at once on the H200 (bench/kernelbench_mix.py): isolated, naive,
# krex, krex with disturbers, krex with a foreign process, isolated again. Needs .kb (KernelBench's timing
# module and level 1) and .whl carried. Logs in $OUT/kbmix-logs.tgz, results in $OUT/kbmix.json.
# TRIAL_ITEMS=PROBLEM:DTYPE,... first runs bench/trial_modes.py on them ($OUT/trial-modes.json), and with
# TRIAL_PIN=CPUS once more pinned to those CPUs ($OUT/trial-modes-pinCPUS.json).
set -u
. tests/gpu/env.sh
mkdir -p /tmp/kbmix; export KBMIX_TMP=/tmp/kbmix
make -s shim || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 \
  > /tmp/kbmix/smi.csv & SMI=$!
for pin in "" ${TRIAL_PIN:-}; do
  [ -n "${TRIAL_ITEMS:-}" ] || break
  name=trial-modes${pin:+-pin$pin}
  timeout 150 python3 bench/trial_modes.py --kernelbench .kb --items "$TRIAL_ITEMS" --procs ${TRIAL_PROCS:-3} \
    --trials ${TRIAL_TRIALS:-60} ${pin:+--pin $pin} --out $OUT/$name.json > /tmp/kbmix/$name.log 2>&1
  echo "$name rc=$?"
done
timeout ${LIMIT:-560} python3 bench/kernelbench_mix.py --kernelbench .kb --agents ${AGENTS:-8} --commands ${COMMANDS:-3} \
  --items ${ITEMS:-7} --trials ${TRIALS:-20} ${EXTRA:-} --out $OUT/kbmix.json 2>&1 | tail -80
kill $SMI
tar czf $OUT/kbmix-logs.tgz -C /tmp/kbmix . 2>/dev/null
ls -la $OUT
