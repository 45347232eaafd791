#!/usr/bin/env bash
# tests/gpu/green_ctx_h200.sh: does another job's region wait for work queued in a green context
# (tests/gpu/green_ctx_probe.py with tests/gpu/green_probe.cu), about a minute. With build/oldshim-src (an earlier
# shim's sources, carried) its libkrex.so is compared. Files back: $OUT/green-ctx.json, $OUT/green-ctx.log.
# LAUNCHES (5) spin kernels of MS (200) ms on BLOCKS (264) blocks each.
set -u
. tests/gpu/env.sh
make -s shim || exit 1
mkdir -p build/gpu
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/green-ctx.log
LIBCUDA=$(python3 -c 'import ctypes;ctypes.CDLL("libcuda.so.1");print([l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l][0])')
nvcc -O2 -o build/gpu/green_probe tests/gpu/green_probe.cu -Xlinker "$LIBCUDA" >> $OUT/green-ctx.log 2>&1 || { tail -20 $OUT/green-ctx.log; exit 1; }
old=
if [ -d build/oldshim-src ]; then
  make -s -C build/oldshim-src OUT=$PWD/build/oldshim >> $OUT/green-ctx.log 2>&1 && old=$PWD/build/oldshim/libkrex.so
fi
L=/tmp/green-ctx-logs; mkdir -p $L
timeout ${LIMIT:-200} python3 tests/gpu/green_ctx_probe.py --bin build/gpu/green_probe --out $OUT/green-ctx.json \
  ${old:+--old-shim $old} --launches ${LAUNCHES:-5} --ms ${MS:-200} --blocks ${BLOCKS:-264} --logs $L >> $OUT/green-ctx.log 2>&1
echo "green_ctx rc=$?" | tee -a $OUT/green-ctx.log
cp $L/*.log $OUT/ 2>/dev/null
tail -8 $OUT/green-ctx.log
