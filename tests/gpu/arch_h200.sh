#!/usr/bin/env bash
# tests/gpu/arch_h200.sh: after a restructure, on the H200 in one device call: the interception matrix, the
# hook table against libcuda's exports, the hooks, and a short agent mix (isolated, naive sharing and krex
# with 8 agents). Summaries in $OUT (at most 8 files come back); every log in $OUT/arch-logs.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
FINAL=${OUT:-/tmp/krex-out}
W=/tmp/arch-out; rm -rf $W; mkdir -p $W "$FINAL"
OUT=$W STEPS="info build exports coverage hooks throughput" PLAN="${PLAN:-isolated:1,naive:8,krex:8,isolated:1}" \
  SPECS=${SPECS:-16} BUDGET=${BUDGET:-40} THROUGHPUT_LIMIT=${THROUGHPUT_LIMIT:-330} \
  bash tests/gpu/run_all.sh 2>&1 | tee $W/run_all.log | tail -60
for f in info.txt exports-check.txt interception.json hooks-gpu.json throughput.json throughput-table.md throughput.png; do
  [ -f $W/$f ] && cp $W/$f "$FINAL/"
done
tar czf "$FINAL/arch-logs.tgz" -C $W . 2>/dev/null
ls -la "$FINAL"
