#!/usr/bin/env bash
# tests/gpu/attest_h200.sh: protocol 2 on the H200 (exports, interception coverage), what attestation costs,
# and the disturbance A/B: bench/perturb.py under krex regions with the lifecycle barrier on, off, and with a
# settle time; every log in $OUT/attest-run.tgz, the summaries beside it.
set -u
. tests/gpu/env.sh
W=/tmp/krex-work; mkdir -p $W /tmp/krex-gpu
export KREX_SOCKET=/tmp/krex-gpu/krex.sock
OUT=$W STEPS="info build exports coverage" bash tests/gpu/run_all.sh 2>&1 | tail -30
python3 bench/nvml_cost.py --out $W/nvml-cost.json | tail -25
ROUNDS=${ROUNDS:-3}
for setting in barrier: nobarrier:--no-lifecycle-barrier settle:--settle-ms-per-gib=${SETTLE:-10}; do
  name=${setting%%:*}; args=${setting#*:}; args=${args//=/ }
  echo "=== perturb $name ($args) $(date +%T)"
  python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file /tmp/krex-gpu/p.state $args \
    > $W/perturb-$name-controller.log 2>&1 & CTL=$!
  sleep 2
  timeout 200 python3 -m krex_ctl run --report $W/perturb-$name-report.json -- python3 bench/perturb.py --region \
    --conditions ${CONDS:-quiet,ctx,exitbig,load,bursts} --rounds $ROUNDS --out $W/perturb-$name.json 2>&1 | tail -24
  kill $CTL; wait $CTL
done
python3 - <<'PY' > $OUT/attest-summary.json
import json, glob, statistics
out = {}
for f in sorted(glob.glob("/tmp/krex-work/perturb-*-report.json")):
    rep = json.load(open(f))
    regs = rep["regions"]
    out[f.split("/")[-1]] = {"regions": len(regs), "clean": sum(r.get("clean", False) for r in regs),
        "attest_us_median": statistics.median(r.get("attest_ns", 0) for r in regs) / 1e3 if regs else None,
        "attest_end_us_median": statistics.median(r.get("attest_end_ns", 0) for r in regs) / 1e3 if regs else None,
        "settle_ms_median": statistics.median(r.get("settle_ns", 0) for r in regs) / 1e6 if regs else None,
        "taints": sorted({t for r in regs for t in r.get("taints", [])})}
for f in sorted(glob.glob("/tmp/krex-work/perturb-*.json")):
    if "report" in f:
        continue
    out[f.split("/")[-1]] = json.load(open(f))["summary"]
print(json.dumps(out, indent=1))
PY
cp $W/interception.json $W/nvml-cost.json $OUT/ 2>/dev/null
tar czf $OUT/attest-run.tgz -C $W . 2>/dev/null
ls -la $OUT
