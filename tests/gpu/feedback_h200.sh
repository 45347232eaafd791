#!/usr/bin/env bash
# tests/gpu/feedback_h200.sh: what a user sees, on a real GPU. A 4-agent mix under one krex controller (with
# --metrics and --trace): two agents time bf16 matmuls with triton's do_bench inside krex.region (long regions:
# one waits for the other and prints the waiting line), one times through the triton hook (--hooks triton),
# and one is a busy neighbour that marks no region (it is frozen during the others' regions, and its summary
# warns "timings not protected"). Then `krex trace` of the four reports and a PNG of its timeline.
# One device call, about 2-3 minutes; files back under $OUT (7): agents.log (every agent's stderr: waiting
# lines, freeze lines, summaries), status.txt, metrics.txt, reports.tgz, trace.json, ctl-trace.json, trace.png.
# Carry .whl with cffi and pycparser (needed by krex run); add rich and prometheus_client wheels for the
# --watch table and --metrics (without prometheus_client the controller runs without --metrics and says so;
# --watch is not used here, so rich is not needed). The render needs matplotlib (the device has it).
#   device: nvidia-h200, carry [".whl"], command: bash tests/gpu/feedback_h200.sh
set -u
. tests/gpu/env.sh
W=/tmp/krex-fb; rm -rf $W; mkdir -p $W   # a new run: a trace file left there would stop --trace
export KREX_SOCKET=$W/krex.sock
make -s shim || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $W/info.txt
METRICS=""
if python3 -c 'import prometheus_client' 2>/dev/null; then METRICS="--metrics 127.0.0.1:9464"
else echo "no prometheus_client wheel carried: the controller runs without --metrics" | tee -a $W/info.txt; fi
python3 -m krex_ctl controller --socket $KREX_SOCKET --gpus 0 $METRICS --trace $W/ctl-trace.json \
  > $W/controller.log 2>&1 & CTL=$!
for i in $(seq 100); do [ -S $KREX_SOCKET ] && break; sleep 0.1; done

cat > $W/agent_region.py <<'PY'
import sys, torch, krex
from triton.testing import do_bench
n, trials = int(sys.argv[1]), int(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
f = lambda: torch.mm(a, b)
f(); torch.cuda.synchronize()
for t in range(trials):
    with krex.region(f"mm{n}") as r:
        ms = do_bench(f, warmup=100, rep=2500)
    print(f"mm{n} trial {t}: {ms:.4f} ms exclusive={r.info.exclusive}", flush=True)
PY
cat > $W/agent_hook.py <<'PY'
import torch
from triton.testing import do_bench
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for t in range(4):
    print(f"hooked mm4096 trial {t}: {do_bench(lambda: a @ a, rep=1500):.4f} ms", flush=True)
PY
cat > $W/agent_busy.py <<'PY'
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 45
while time.time() < end:
    for _ in range(20): a @ a
    torch.cuda.synchronize()
print("busy neighbour done", flush=True)
PY
K="python3 -m krex_ctl run"
$K --report $W/busy.json -- python3 $W/agent_busy.py > $W/busy.out 2> $W/busy.err & P1=$!
sleep 8    # the neighbour holds a context before the regions begin
$K --report $W/region1.json -- python3 $W/agent_region.py 8192 4 > $W/region1.out 2> $W/region1.err & P2=$!
sleep 1
$K --report $W/region2.json -- python3 $W/agent_region.py 16384 3 > $W/region2.out 2> $W/region2.err & P3=$!
$K --hooks triton --report $W/hook.json -- python3 $W/agent_hook.py > $W/hook.out 2> $W/hook.err & P4=$!
sleep 12
python3 -m krex_ctl status > $OUT/status.txt 2>&1
python3 -m krex_ctl status --watch 1 > $W/watch.txt 2>&1 & WATCH=$!
[ -n "$METRICS" ] && curl -s -m 5 127.0.0.1:9464/metrics > $W/metrics-during.txt
for t in $(seq 240); do   # until every agent is done, or 4 min
  alive=0; for p in $P1 $P2 $P3 $P4; do kill -0 $p 2>/dev/null && alive=1; done
  [ $alive = 1 ] || break; sleep 1
done
for p in $P1 $P2 $P3 $P4; do kill -0 $p 2>/dev/null && kill -INT $p; wait $p; echo "agent $p rc=$?"; done
kill -INT $WATCH 2>/dev/null; wait $WATCH 2>/dev/null
[ -n "$METRICS" ] && { cat $W/metrics-during.txt; echo "# --- at the end"; curl -s -m 5 127.0.0.1:9464/metrics; } \
  | grep -v '^# HELP' > $OUT/metrics.txt
kill -TERM $CTL; wait $CTL
for a in busy region1 region2 hook; do
  echo "=== $a (stdout)"; cat $W/$a.out; echo "=== $a (stderr)"; cat $W/$a.err
done > $OUT/agents.log 2>&1
{ cat $W/info.txt; echo "=== status --watch (plain, one block a second)"; head -60 $W/watch.txt;
  echo "=== controller log"; tail -30 $W/controller.log; } >> $OUT/status.txt
python3 -m krex_ctl trace $W/busy.json $W/region1.json $W/region2.json $W/hook.json -o $OUT/trace.json
cp $W/ctl-trace.json $OUT/ctl-trace.json
python3 tests/gpu/render_trace.py $OUT/trace.json $OUT/trace.png --title "krex on an H200: 4 agents (2 explicit regions, 1 hooked do_bench, 1 busy neighbour)"
tar czf $OUT/reports.tgz -C $W busy.json region1.json region2.json hook.json
grep -h '^krex:' $W/*.err | head -40
ls -la $OUT
