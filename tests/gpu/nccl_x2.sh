#!/usr/bin/env bash
# tests/gpu/nccl_x2.sh: the NCCL row of the interception matrix, on a two-GPU machine.
set -u
. tests/gpu/env.sh
mkdir -p /tmp/krex-gpu; export KREX_SOCKET=/tmp/krex-gpu/krex.sock
make -s shim || exit 1
nvidia-smi -L
cd tests/gpu/workloads
python3 -m krex_ctl run --report $OUT/nccl-report.json -- python3 -m torch.distributed.run --nproc_per_node 2 \
  nccl_two.py 2>&1 | tee $OUT/nccl.log
