#!/usr/bin/env bash
# tests/gpu/beside_h200.sh: a process of the job launching outside any block beside the job's region, on the GPU
# (tests/gpu/beside_probe.py: alone, beside a sibling's matmuls, with a child it times). $OUT/beside.json, .log.
set -u
. tests/gpu/env.sh
make -s shim || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${LIMIT:-150} python3 tests/gpu/beside_probe.py --out $OUT/beside.json 2>&1 | tee $OUT/beside.log
