#!/usr/bin/env bash
# tests/gpu/startup_h200.sh: what `krex run` adds to a command's start on the GPU machine (bench/startup.py),
# with the wire declarations compiled (build/krex_ffi.py, as `make shim` writes it) and parsed at import (that
# file moved aside for the second leg, then put back). `make shim` also writes krex's bytecode; where
# PYTHONDONTWRITEBYTECODE is set (no interpreter writes .pyc files then), a third leg runs with krex's
# __pycache__ folders moved aside (what every command paid before `make shim` wrote them), then put back.
# Files back: $OUT/startup.json, $OUT/startup-parsed.json, $OUT/startup-nopyc.json (the third leg's),
# $OUT/startup-env.txt (REPEATS, default 20, per mode and leg; about 1-2 minutes).
set -u
. tests/gpu/env.sh
make -s shim || exit 1
[ -f build/krex_ffi.py ] || { echo "startup_h200: make shim wrote no build/krex_ffi.py (cffi missing?)"; exit 1; }
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-<unset>} python3=$(python3 -c 'import sys; print(sys.version.split()[0], sys.dont_write_bytecode)')" | tee $OUT/startup-env.txt
python3 bench/startup.py --repeats ${REPEATS:-20} --out $OUT/startup.json || exit 1
DIRS="krex krex_ctl krex_ctl/commands krex_ctl/wire krex_ctl/policy krex_ctl/enforce hooks/krex_hooks hooks/krex_hooks/sitedir build"
ASIDE=$(mktemp -d /tmp/krex-pyc-aside.XXXXXX)   # this run's own: the bytecode folders it moved, and only those
MOVED=""
restore() {
  [ -f build/krex_ffi.py.aside ] && mv build/krex_ffi.py.aside build/krex_ffi.py
  for d in $MOVED; do [ -d "$ASIDE/$d/__pycache__" ] && rm -rf "$d/__pycache__" && mv "$ASIDE/$d/__pycache__" "$d/"; done
  MOVED=""
}
trap 'restore; rm -rf "$ASIDE"' EXIT   # put back, whatever stops a leg
mv build/krex_ffi.py build/krex_ffi.py.aside
python3 bench/startup.py --repeats ${REPEATS:-20} --out $OUT/startup-parsed.json
restore
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  for d in $DIRS; do
    [ -d $d/__pycache__ ] || continue
    mkdir -p "$ASIDE/$d" && mv $d/__pycache__ "$ASIDE/$d/" && MOVED="$MOVED $d"
  done
  python3 bench/startup.py --repeats ${REPEATS:-20} --out $OUT/startup-nopyc.json
fi
