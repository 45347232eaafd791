#!/usr/bin/env bash
# tests/gpu/run_all.sh: the real-GPU checks of krex in one device call (logs and JSON under $OUT).
# Default steps: interception coverage matrix, hook table vs libcuda exports, launch overhead,
#   (globalscope: dlsym in the global scope gives the wrapper for the driver's names, NULL for names it lacks;
#   resolver: the driver resolver's answers named by dladdr, as the shim routes them; trimsettle: whether memory
#   a stream-ordered pool gives back is waited for as a free is; allocoverhead: a stream-ordered allocation's cost,
#   with OLD_SHIM=PATH an earlier libkrex.so beside it; stability: KERNELS of bench/candidate.py, PROCS processes
#   each alone, one time per process or levels (tests/gpu/stability.py); none a default step)
#   explicit-region fidelity, hooks. Others (see docs/measurements/): throughput (8 agents, ~6 min), scales (other
#   agent counts), warm (warm workers vs cold, 8 at once), probe (warm timing A/B), warmfid, perturb and
#   perturbgates (GPU work that is not a submission, bare and under krex regions).
set -u
. tests/gpu/env.sh
mkdir -p /tmp/krex-gpu; export KREX_SOCKET=/tmp/krex-gpu/krex.sock
STEPS=${STEPS:-"info build exports coverage overhead fidelity fidelity_hook hooks"}
B=build/gpu; mkdir -p $B
export PYTHONFAULTHANDLER=1   # a hung Python process prints its stack on SIGABRT (see watched)

# watched SECONDS NAME CMD...: run CMD; if it outlives SECONDS, record the processes (state T = stopped)
# and make every krex Python process print its stack (faulthandler) before killing them
watched() {
  local limit=$1 name=$2; shift 2
  "$@" & local pid=$! t=0
  while kill -0 $pid 2>/dev/null && [ $t -lt $limit ]; do sleep 1; t=$((t+1)); done
  if kill -0 $pid 2>/dev/null; then
    echo "!!! $name still running after ${limit}s: see $OUT/$name-hung-ps.txt and the logs"
    ps -eo pid,ppid,stat,wchan:32,etime,args > $OUT/$name-hung-ps.txt
    pkill -ABRT -f 'krex_ctl|bench/' ; sleep 3; pkill -KILL -f 'krex_ctl|bench/'
  fi
  wait $pid
}
for step in $STEPS; do
  echo "=== $step $(date +%T)"
  case $step in
  info)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/info.txt
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a $OUT/info.txt
    nproc | tee -a $OUT/info.txt ;;
  build)
    make -s shim || exit 1
    LIBCUDA=$(python3 -c 'import ctypes;ctypes.CDLL("libcuda.so.1");print([l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l][0])')
    echo "$LIBCUDA" > $B/libcuda.path
    nvcc -O2 -o $B/rt_launch tests/gpu/rt_launch.cu || exit 1
    gcc -O2 -o $B/spin_bench examples/c/spin_bench.c "$LIBCUDA" || exit 1
    nvcc -O2 -o $B/nvtx_bench tests/gpu/hooks/nvtx_bench.cu || exit 1 ;;
  exports)
    python3 tests/gpu/check_exports.py "$(cat $B/libcuda.path)" build/libkrex.so | tee $OUT/exports-check.txt ;;
  globalscope)
    # a lookup in the global scope under the shim: its wrapper where the driver has the name, NULL where it lacks it
    LD_PRELOAD=$PWD/build/libkrex.so python3 tests/gpu/global_scope.py "$(cat $B/libcuda.path)" --out $OUT/global-scope.json ;;
  resolver)
    # does dladdr name every answer of the driver's resolver (the shim's routing), or is the fallback taken?
    python3 tests/gpu/resolver_names.py --out $OUT/resolver-names.json ;;
  stability)
    # does each kernel take one time in every process alone (KERNELS: [OP@]SIZE/VARIANT,...; PROCS processes each)?
    # TIMER (events), HOLD_GIB (none), HOLD_SEEDED=1 and SCATTER_GIB (0): the script's --timer, --hold-gib, --hold-seeded
    # and --scatter-gib
    python3 tests/gpu/stability.py ${KERNELS:+--kernels $KERNELS} --procs ${PROCS:-2} --deadline ${STAB_S:-300} \
      --timer ${TIMER:-events} ${HOLD_GIB:+--hold-gib $HOLD_GIB} $([ "${HOLD_SEEDED:-0}" = 1 ] && echo --hold-seeded) --scatter-gib ${SCATTER_GIB:-0} \
      --out $OUT/stability.json ;;
  trimsettle)
    # memory a stream-ordered pool gives back (a trim, or the synchronize at the default threshold): waited for?
    python3 tests/gpu/trim_settle.py --out $OUT/trim-settle.json ;;
  coverage)
    python3 tests/gpu/coverage.py --build $B --out $OUT/interception.json --log $OUT/coverage.log ;;
  overhead)
    # outside regions, then inside one (the path a launch takes while its process holds the GPU)
    python3 bench/launch_overhead.py --bin $B/spin_bench --out $OUT/overhead.json
    python3 bench/launch_overhead.py --bin $B/spin_bench --in-region --out $OUT/overhead-region.json ;;
  allocoverhead)
    # a stream-ordered allocation's cost (it reads the device's current pool, shim/memory.c); OLD_SHIM: an earlier
    # build of libkrex.so measured beside it
    python3 bench/launch_overhead.py --bin $B/spin_bench --mode alloc --launches 100000 \
      ${OLD_SHIM:+--compare-shim $OLD_SHIM} --out $OUT/alloc-overhead.json ;;
  fidelity)
    python3 bench/fidelity_explicit.py --rounds ${ROUNDS:-3} --out $OUT/fidelity-explicit.json 2>&1 | tail -40 ;;
  fidelity_hook)
    python3 bench/fidelity_explicit.py --via hook --sizes 8192,16384 --rounds ${ROUNDS:-3} --out $OUT/fidelity-hook.json 2>&1 | tail -30 ;;
  hooks)
    python3 bench/hooks_gpu.py --build $B --out $OUT/hooks-gpu.json ;;
  warm)
    watched ${WARM_LIMIT:-240} warm python3 bench/warm_vs_cold.py --repeats 7 --concurrent 8 --logs $OUT \
      --out $OUT/warm-vs-cold-h200.json ;;
  probe)
    # fresh forked workers (the default), then one worker reused, then reused without CPU isolation
    watched 150 probe python3 bench/warm_probe.py --size 4096 --variant 0 --pairs ${PAIRS:-3} --out $OUT/warm-probe.json
    watched 150 probe python3 bench/warm_probe.py --size 4096 --variant 0 --pairs ${PAIRS:-3} --worker-reuse 50 \
      --churn --out $OUT/warm-probe-reused.json
    watched 150 probe python3 bench/warm_probe.py --size 4096 --variant 0 --pairs ${PAIRS:-3} --worker-reuse 50 \
      --no-cpu-isolation --out $OUT/warm-probe-reused-no-isolation.json ;;
  perturb)   # do context creation/teardown and big allocations of other processes move a timed kernel?
    # bare, then with every do_bench a krex region and the disturbers under krex run (gated)
    watched 200 perturb python3 bench/perturb.py --rounds ${ROUNDS:-6} --out $OUT/perturb.json
    python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/perturb.state \
      > $OUT/perturb-controller.log 2>&1 & CTL=$!
    sleep 2
    watched 200 perturb python3 -m krex_ctl run -- python3 bench/perturb.py --region --rounds ${ROUNDS:-6} \
      --out $OUT/perturb-krex.json
    kill $CTL; wait $CTL ;;
  perturbgates)   # which gate helps: contexts and exits gated or not, context churn against krex regions
    python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/perturb.state \
      > $OUT/perturbgates-controller.log 2>&1 & CTL=$!
    sleep 2
    for g in ${GATES:-0:0:1 1:0:1 0:1:1 1:1:1}; do   # KREX_GATE_CONTEXTS:KREX_GATE_EXIT:KREX_GATE_MEMORY
      IFS=: read -r gc ge gm <<< "$g"
      KREX_GATE_CONTEXTS=$gc KREX_GATE_EXIT=$ge KREX_GATE_MEMORY=$gm watched 120 perturbgates \
        python3 -m krex_ctl run -- python3 bench/perturb.py --region --conditions quiet,ctx --rounds ${ROUNDS:-4} \
        --out $OUT/perturb-krex-gates-$gc-$ge-mem$gm.json | tail -6
    done
    kill $CTL; wait $CTL ;;
  warmfid)   # the same kernels timed in warm workers and in cold commands, alternating; clocks sampled meanwhile
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 \
      > $OUT/clocks-warmfid.csv & SMI=$!
    watched ${WARMFID_LIMIT:-220} warmfid python3 bench/throughput.py --plan isolated:1,krexwarm:1,krex:1,krexwarm:1,krex:1,isolated:1 \
      --specs 6 --variants 1 --budget 100 --out $OUT/warm-fidelity.json 2>&1 | tail -8
    kill $SMI ;;
  scales)    # the agent counts the throughput step leaves out, every mode (about 8 minutes)
    watched ${THROUGHPUT_LIMIT:-540} scales python3 bench/throughput.py --plan "${SCALES_PLAN:-isolated:1,naive:2,naive:4,naive:16,cmdlock:2,cmdlock:16,krex:1,krex:2,krex:4,krex:16,krexwarm:2,krexwarm:4,krexwarm:16,isolated:1}" \
      --specs ${SPECS:-24} --variants ${VARIANTS:-2} --budget ${BUDGET:-35} --logs $OUT --out $OUT/throughput-scales.json 2>&1 | tail -40
    python3 bench/plot_throughput.py $OUT/throughput-scales.json $OUT/throughput-scales.png
    python3 bench/report_table.py $OUT/throughput-scales.json | tee $OUT/throughput-scales-table.md ;;
  multigpu)   # nvidia-h200-x2: the overlapped all-gather + GEMM, isolated and under krex with busy neighbours
    watched ${MULTIGPU_LIMIT:-420} multigpu python3 bench/multigpu_overlap.py --rounds ${ROUNDS:-3} --symm \
      --out $OUT/multigpu-overlap.json 2>&1 | tail -40 ;;
  throughput)
    watched ${THROUGHPUT_LIMIT:-480} throughput python3 bench/throughput.py --plan "${PLAN:-isolated:1,cmdlock:8,naive:8,krex:8,krexnofreeze:8,krexwarm:8,krexwarm:1,isolated:1}" \
      --specs ${SPECS:-24} --variants ${VARIANTS:-2} --budget ${BUDGET:-45} --logs $OUT --out $OUT/throughput.json 2>&1 | tail -80
    python3 bench/plot_throughput.py $OUT/throughput.json $OUT/throughput.png
    python3 bench/report_table.py $OUT/throughput.json | tee $OUT/throughput-table.md ;;
  esac
done
cp /tmp/krex-gpu/*.log $OUT/ 2>/dev/null
echo "=== done $(date +%T)"
