#!/usr/bin/env bash
# tests/gpu/resident_h200.sh: bench/resident_neighbours.py on the H200: the 16384/0 Triton candidate under krex,
# alone, beside idle neighbours holding a CUDA context and GPU memory, and beside CPU spinners. About 4 minutes
# with the defaults (ROUNDS=3, NEIGHBOURS=7, HOLD_GIB=8, CONDITIONS=alone,resident,cpu; also churn).
# Results: docs/measurements/freeze-policy.md.
# Files back: $OUT/resident.json, $OUT/resident.log, $OUT/resident-controller.log
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/resident_h200.sh
set -u
. tests/gpu/env.sh
make -s shim || exit 1
W=/tmp/krex-res; rm -rf $W; mkdir -p $W
export KREX_SOCKET=$W/krex.sock
python3 -m krex_ctl controller --socket $KREX_SOCKET > $OUT/resident-controller.log 2>&1 & CTL=$!
for i in $(seq 100); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done
timeout ${LIMIT:-420} python3 bench/resident_neighbours.py --rounds ${ROUNDS:-3} --neighbours ${NEIGHBOURS:-7} \
  --conditions ${CONDITIONS:-alone,resident,cpu} \
  --hold-gib ${HOLD_GIB:-8} --out $OUT/resident.json > $OUT/resident.log 2>&1
echo "resident rc=$?"
grep -E "^(alone|resident|cpu|churn|gpu) " $OUT/resident.log
kill $CTL; wait $CTL
