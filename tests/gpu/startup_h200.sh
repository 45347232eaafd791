#!/usr/bin/env bash
# tests/gpu/startup_h200.sh: what `krex run` adds to a command's start on the GPU machine (bench/startup.py),
# with the wire declarations compiled (build/krex_ffi.py, as `make shim` writes it) and parsed at import (that
# file moved aside for the second leg, then put back). Files back: $OUT/startup.json, $OUT/startup-parsed.json
# (REPEATS, default 20, per mode and leg; about 1 minute).
set -u
. tests/gpu/env.sh
make -s shim || exit 1
[ -f build/krex_ffi.py ] || { echo "startup_h200: make shim wrote no build/krex_ffi.py (cffi missing?)"; exit 1; }
python3 bench/startup.py --repeats ${REPEATS:-20} --out $OUT/startup.json || exit 1
trap 'mv build/krex_ffi.py.aside build/krex_ffi.py 2>/dev/null' EXIT   # put back, whatever stops the leg
mv build/krex_ffi.py build/krex_ffi.py.aside
python3 bench/startup.py --repeats ${REPEATS:-20} --out $OUT/startup-parsed.json
