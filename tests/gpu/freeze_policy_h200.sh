#!/usr/bin/env bash
# tests/gpu/freeze_policy_h200.sh: the freeze-policy measurement on the H200 (bench/freeze_policy.py) in one
# device call of at most ~9 minutes: freeze all, busy and none against naive sharing at SCALES agents, with a
# bucket-balanced compile-heavy Triton mix and two isolated passes (the same-run noise floor).
# Files back (at most 5): $OUT/freeze-policy.json, $OUT/freeze-policy.md, $OUT/freeze-policy.log,
# $OUT/freeze-policy-smi.csv, $OUT/freeze-policy-logs.tgz (the controllers' logs and their /metrics pages).
# The H200 machine has one GPU: placement is not measured here (tests/test_placement.py, fake 4- and 8-GPU nodes).
# For >= 50 clean kernels per bucket, one scale per call (each about 9 minutes):
#   SCALES=8 BUDGET=75 bash tests/gpu/freeze_policy_h200.sh     then   SCALES=16 BUDGET=55 ...
# REFERENCE (solo) the reference passes: solo, isolated, solo-busy or a comma list (solo,solo-busy: both, the
# first judging). POLICIES (all,none,busy) the krex policies (also all+warm, busy+warm: commands in the controller's
# warm workers; busy+prewait, busy+warm+prewait: with PREWAIT_MS); SKIP_NAIVE=1: no naive sharing step (a fidelity-only run); GATES (1) 1: the krex controllers with
# --gate-contexts --gate-exit (the controller's default, run 3), 0 with --no-gate-contexts --no-gate-exit (run 4).
# CTL_ARGS: more options for every krex controller, e.g. CTL_ARGS="--region-gap-ms 200".
# PREWAIT_MS (400, the controller's default): busy+prewait's --lifecycle-prewait-ms.
# STAGGER (0): bench/freeze_policy.py --stagger S, each agent's first command after a delay of its own in [0, S].
# ROUNDS (1): bench/freeze_policy.py --rounds R, the shared modes R times, every other round reversed (ABBA).
# SMOKE (1): with COMPILER=cuda, one candidate built and run alone first (~45 s; its failure ends the call); 0: not.
# HOST_BOUND=1: KREX_HOST_BOUND=1 in the krex commands (each timing says whether its region was host-bound).
# TIMER (events): the candidates' timer, events (do_bench) or graph (do_bench_cudagraph: no host launches in it).
# COMPILER (triton): the candidates' compiler, triton or cuda (the sum candidate in CUDA C++ built by nvcc through
# torch's load_inline, as KernelBench builds one: a compile-heavy mix; MIX must name sum@ kernels only). With cuda,
# one candidate is built and timed alone first: a build that fails ends the call with its output.
# REF_HOLDER_GIB (0): bench/freeze_policy.py --reference-holder-gib, each reference command beside a seeded holder.
# NONCE_OFFSET (0): bench/freeze_policy.py --nonce-offset (other nonces: other holder patterns, other placements).
# SCATTER_GIB (0): bench/freeze_policy.py --scatter-gib, each command's inputs placed between memory of its own (every mode).
# FRESH_INPUTS (0): 1: bench/freeze_policy.py --fresh-inputs, each command's input copied to a new place before each
# round of timings (every mode; sum@ kernels only).
# WARMUP_MS (25) and MIN_REPS (0): the candidates' do_bench warm-up and least repetitions (500 and 100: the
# power-steady harness of docs/measurements/harness-stability.md).
# MIX (the four sizes alike): SIZE:WEIGHT,... e.g. 2048:0.4,4096:0.2,8192:0.2,16384:0.2 for more < 0.1 ms timings.
# REF_REPEAT (0: as REPEAT) timings per kernel per command in the reference passes (the floor's sample).
# REF_PROCS (1) commands per distinct kernel in each reference pass (the floor's sample of per-process levels).
# REF_PROCS_FOR (none) KERNEL=K,...: as many for these kernels, e.g. sum@128/0=6 (--reference-processes-for).
# NEIGHBOUR_LOAD (8192: bf16 matmuls) the solo-busy neighbour's work: SIZE or sum@MIB (--neighbour-load).
# REPEAT (default 2) timings per kernel per command: more gives more kernels per bucket but makes the mix
# GPU-bound (each do_bench region holds the GPU ~0.2 s; naive sharing overlaps them, krex cannot).
set -u
. tests/gpu/env.sh
L=/tmp/krex-freeze-policy; mkdir -p $L
make -s shim || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/freeze-policy.log
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a $OUT/freeze-policy.log
cpu_topology | tee -a $OUT/freeze-policy.log
LIMIT=${LIMIT:-520}
if [ "${COMPILER:-triton}" = cuda ]; then   # a mix freeze_policy.py would refuse is refused before the build
  case ",${MIX:-}" in ,|*,[0-9]*) echo "freeze_policy: COMPILER=cuda needs a MIX of sum@ kernels only" | tee -a $OUT/freeze-policy.log; exit 2;; esac
fi
if [ "${COMPILER:-triton}" = cuda ] && [ "${SMOKE:-1}" = 1 ]; then
  t0=$SECONDS
  python3 -c 'from torch.utils.cpp_extension import CUDA_HOME; print("CUDA_HOME", CUDA_HOME)' 2>&1 | tee -a $OUT/freeze-policy.log
  timeout 120 python3 bench/candidate.py --op sum --size 128 --variant 0 --nonce $(( ${NONCE_OFFSET:-0} + 999 )) \
    --compiler cuda > $L/smoke.txt 2>&1
  rc=$?; tail -3 $L/smoke.txt | tee -a $OUT/freeze-policy.log
  [ $rc -eq 0 ] || { echo "freeze_policy: the cuda candidate alone failed (rc=$rc)" | tee -a $OUT/freeze-policy.log; tail -40 $L/smoke.txt; exit 1; }
  LIMIT=$(( LIMIT - (SECONDS - t0) ))      # the build's time comes off the plan's: the call's limit holds both
fi
TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 500 \
  > $OUT/freeze-policy-smi.csv & SMI=$!   # UTC: bench/freeze_policy.py --smi reads its times so
timeout $LIMIT python3 bench/freeze_policy.py --scales ${SCALES:-4,8,16} --budget ${BUDGET:-20} \
  --repeat ${REPEAT:-2} --reference-repeat ${REF_REPEAT:-0} --reference-processes ${REF_PROCS:-1} --reference-processes-for "${REF_PROCS_FOR:-}" --reference-holder-gib ${REF_HOLDER_GIB:-0} $([ -n "${MIX:-}" ] && echo --mix $MIX) --warmup-ms ${WARMUP_MS:-25} --min-reps ${MIN_REPS:-0} --timer ${TIMER:-events} --compiler ${COMPILER:-triton} --scatter-gib ${SCATTER_GIB:-0} $([ "${FRESH_INPUTS:-0}" = 1 ] && echo --fresh-inputs) --nonce-offset ${NONCE_OFFSET:-0} $([ "${HOST_BOUND:-0}" = 1 ] && echo --host-bound-check) --variants ${VARIANTS:-2} --reference ${REFERENCE:-solo} $([ -n "${NEIGHBOUR_LOAD:-}" ] && echo --neighbour-load $NEIGHBOUR_LOAD) --metrics-port 9470 --policies ${POLICIES:-all,none,busy} $([ "${SKIP_NAIVE:-0}" = 1 ] && echo --skip-naive) --gate-lifecycle $([ "${GATES:-1}" = 1 ] && echo on || echo off) --deadline $(( LIMIT - 15 )) --controller-args="${CTL_ARGS:-}" --prewait-ms ${PREWAIT_MS:-400} --stagger ${STAGGER:-0} --rounds ${ROUNDS:-1} --logs $L --out $OUT/freeze-policy.json --md $OUT/freeze-policy.md \
  >> $OUT/freeze-policy.log 2>&1
rc=$?
echo "freeze_policy rc=$rc" | tee -a $OUT/freeze-policy.log
kill $SMI 2>/dev/null; wait $SMI 2>/dev/null   # its last samples written
if [ -s $OUT/freeze-policy.json ]; then   # again with the power samples per mode (and, cut short, the steps that finished)
  cp $OUT/freeze-policy.json $L/partial.json
  python3 bench/freeze_policy.py --reanalyse $L/partial.json --reference ${REFERENCE:-solo} --smi $OUT/freeze-policy-smi.csv \
    --out $OUT/freeze-policy.json --md $OUT/freeze-policy.md > $L/reanalysed.txt 2>&1
  if [ $? -ne 0 ] || [ $rc -ne 0 ]; then cat $L/reanalysed.txt >> $OUT/freeze-policy.log   # its table, or why not
  else grep -E "^GPU power while|^freeze_policy: cannot read" $L/reanalysed.txt >> $OUT/freeze-policy.log; fi
fi
tar czf $OUT/freeze-policy-logs.tgz -C $L . 2>/dev/null
tail -30 $OUT/freeze-policy.log
ls -la $OUT
