#!/usr/bin/env bash
# tests/gpu/idle_drain_h200.sh: which siblings the busy freeze policy stops, idle or busy, with and without CPU
# load (tests/gpu/idle_drain_probe.py), in one device call of about 3 minutes. With build/oldshim-src (an earlier
# shim's sources, carried: `git archive REV shim | tar x -C DIR` with shim/ flattened) its libkrex.so is built
# and compared. Files back: $OUT/idle-drain.json, $OUT/idle-drain.log, $OUT/idle-drain-logs.tgz (controllers' logs).
# REGIONS (12) regions per case, HOGS (32) busy-looping processes for the loaded cases, LIMIT (400) seconds.
set -u
. tests/gpu/env.sh
make -s shim || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/idle-drain.log
cpu_topology | tee -a $OUT/idle-drain.log
old=
if [ -d build/oldshim-src ]; then
  make -s -C build/oldshim-src OUT=$PWD/build/oldshim >> $OUT/idle-drain.log 2>&1 && old=$PWD/build/oldshim/libkrex.so
  echo "old shim: ${old:-build failed}" | tee -a $OUT/idle-drain.log
fi
L=/tmp/idle-drain-logs; mkdir -p $L
timeout ${LIMIT:-400} python3 tests/gpu/idle_drain_probe.py --out $OUT/idle-drain.json ${old:+--old-shim $old} \
  --regions ${REGIONS:-12} --hogs ${HOGS:-32} --logs $L >> $OUT/idle-drain.log 2>&1
echo "idle_drain rc=$?" | tee -a $OUT/idle-drain.log
pkill -f krex-idle-drain-hog 2>/dev/null   # the probe's busy loops, were it killed before its own cleanup
tar czf $OUT/idle-drain-logs.tgz -C $L . 2>/dev/null
tail -12 $OUT/idle-drain.log
