#!/usr/bin/env bash
# tests/gpu/overlap_x2.sh: the overlap controls on real NCCL collectives (bench/nccl_overlap.py), torchrun
# with NPROC ranks (2 on nvidia-h200-x2; NPROC=1 QUICK=1 is a dry run of the plumbing on one GPU, where an
# all_reduce of one rank moves nothing). Carry .whl (cffi, pycparser). Results: $OUT/nccl-overlap.json,
# $OUT/nccl-overlap.png, every variant's log and report in $OUT/nccl-overlap-runs.tgz.
set -u
. tests/gpu/env.sh
mkdir -p /tmp/krex-gpu; export KREX_SOCKET=/tmp/krex-gpu/krex.sock
make -s shim || exit 1
nvidia-smi -L
python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/x2.state \
  > /tmp/krex-gpu/controller.log 2>&1 & CTL=$!
sleep 2
W=/tmp/krex-gpu/nccl-overlap.json
timeout ${LIMIT:-540} python3 bench/nccl_overlap.py --nproc ${NPROC:-2} ${QUICK:+--quick} ${EXTRA:-} --out $W
cp $W $OUT/; cp /tmp/krex-gpu/nccl-overlap.png $OUT/ 2>/dev/null
cp /tmp/krex-gpu/controller.log /tmp/krex-gpu/nccl-overlap-runs/
tar czf $OUT/nccl-overlap-runs.tgz -C /tmp/krex-gpu nccl-overlap-runs
kill $CTL; wait $CTL
ls -la $OUT
