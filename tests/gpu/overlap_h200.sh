#!/usr/bin/env bash
# tests/gpu/overlap_h200.sh: the overlap controls (krex run --overlap) on the H200 in one device call, under 9
# minutes: bench/overlap_proxy.py runs every variant of the controls in its own process with a timeout (a
# failure is recorded, never fatal), each control list raw (noguard) and guarded (the overlap guard choosing,
# measured over one whole guard cycle per case), then a training step with the controls off and on, alternating
# (about 420 s in all).
# Carry .whl (cffi and pycparser, for `krex run` and its report; without them the variants run with the shim
# preloaded and no report). Back in $OUT: overlap-summary.json, overlap.png, overlap-logs.tgz (every process's
# output and krex report), overlap-run.log, overlap-info.txt, overlap-smoke.txt.
#   LIMIT=seconds for everything (540); CASES=, VARIANTS= narrow bench/overlap_proxy.py's lists; EXTRA= more options
set -u
. tests/gpu/env.sh
mkdir -p /tmp/krex-gpu; export KREX_SOCKET=/tmp/krex-gpu/krex.sock XDG_RUNTIME_DIR=/tmp/krex-gpu
START=$(date +%s)
make -s shim || { echo "the shim did not build" | tee $OUT/overlap-run.log; exit 1; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c 'import torch, triton, cupy; print("torch", torch.__version__, "triton", triton.__version__, "cupy", cupy.__version__)'
  python3 -c 'import krex_ctl.wire.frames; print("krex_ctl with cffi: krex run --overlap and its reports")' \
    || echo "no cffi: the variants run with the shim preloaded, without reports"
  git log --oneline -1 2>/dev/null
} > $OUT/overlap-info.txt 2>&1
cat $OUT/overlap-info.txt

# smoke: one real process with every control on, the shim's own log at info level (what it resolved, what failed)
timeout 60 env LD_PRELOAD=$PWD/build/libkrex.so KREX_OVERLAP=priority,shape=2,sm_target=116 KREX_LOG_LEVEL=info \
  python3 - > $OUT/overlap-smoke.txt 2>&1 <<'EOF'
import torch
torch.backends.cuda.preferred_blas_library("cublaslt")
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
c = a @ a
torch.cuda.synchronize()
print("smoke ok", float(c.float().abs().mean()))
EOF
echo "smoke rc=$? ($(tail -1 $OUT/overlap-smoke.txt))"

# the controller krex run connects to (else it would start an embedded one that outlives this call)
CTL=
if python3 -c 'import krex_ctl.wire.frames' 2>/dev/null; then
  python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/overlap.state \
    > /tmp/krex-gpu/overlap-controller.log 2>&1 & CTL=$!
  sleep 2
fi
LEFT=$(( ${LIMIT:-540} - ($(date +%s) - START) ))
timeout $LEFT python3 bench/overlap_proxy.py --out $OUT --budget $(( LEFT - 25 )) \
  ${CASES:+--cases $CASES} ${VARIANTS:+--variants $VARIANTS} ${EXTRA:-} > $OUT/overlap-run.log 2>&1
echo "overlap_proxy rc=$? after $(( $(date +%s) - START )) s"
[ -n "$CTL" ] && { kill $CTL; wait $CTL; }
tail -40 $OUT/overlap-run.log
ls -la $OUT
