#!/usr/bin/env bash
# tests/gpu/nccl_x2.sh: the NCCL row of the interception matrix, on a two-GPU machine.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/krex-out}; mkdir -p "$OUT" /tmp/krex-gpu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site KREX_SOCKET=/tmp/krex-gpu/krex.sock
make -s shim || exit 1
nvidia-smi -L
cd tests/gpu/workloads
python3 -m krex_ctl run --report $OUT/nccl-report.json -- python3 -m torch.distributed.run --nproc_per_node 2 \
  nccl_two.py 2>&1 | tee $OUT/nccl.log
