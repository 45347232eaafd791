#!/usr/bin/env bash
# tests/gpu/region_start_h200.sh: the canary PTX checked by ptxas, then bench/region_start.py (clock ramp,
# state at a region's start). Results in $OUT/region-start.json, log in $OUT/region-start.log.
set -u
. tests/gpu/env.sh
python3 -c 'import sys; sys.path.insert(0, "bench"); import region_start; open("/tmp/canary.ptx", "wb").write(region_start.canary_ptx()[:-1])'
ptxas -arch=sm_90 -o /tmp/canary.cubin /tmp/canary.ptx && echo "ptxas: canary PTX ok for sm_90"
timeout ${LIMIT:-200} python3 bench/region_start.py ${EXTRA:-} --out $OUT/region-start.json 2>&1 | tee $OUT/region-start.log | tail -60
