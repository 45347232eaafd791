#!/usr/bin/env bash
# tests/gpu/perturb_ab_h200.sh: the mechanisms against disturbance that is not a submission, each on and off:
# bench/perturb.py under krex regions, a controller of its own per setting (its own socket: no embedded
# controller left by an earlier step can answer instead): the lifecycle barrier (default), no barrier, a settle
# time after frees and exits, and the barrier with the context gate (KREX_GATE_CONTEXTS=1). AB="NAME:ARGS ..."
# picks other settings (e.g. AB="settle_on: settle_off:--clock-settle-ms=0" CONDS=quiet,load: the clock settle).
set -u
. tests/gpu/env.sh
W=/tmp/krex-ab; mkdir -p $W
make -s shim || exit 1
for setting in ${AB:-barrier: nobarrier:--no-lifecycle-barrier settle:--settle-ms-per-gib=${SETTLE:-10} ctxgate:}; do
  name=${setting%%:*}; args=${setting#*:}; args=${args//=/ }
  export KREX_SOCKET=$W/$name.sock
  gate=0; [ $name = ctxgate ] && gate=1
  echo "=== $name ($args, KREX_GATE_CONTEXTS=$gate) $(date +%T)"
  python3 -m krex_ctl controller --socket $KREX_SOCKET --state-file $W/$name.state $args > $W/$name-controller.log 2>&1 &
  CTL=$!
  sleep 2
  python3 -m krex_ctl status | head -1
  KREX_GATE_CONTEXTS=$gate timeout 150 python3 -m krex_ctl run --report $W/$name-report.json -- python3 bench/perturb.py \
    --region --conditions ${CONDS:-quiet,ctx,exitbig} --rounds ${ROUNDS:-3} --out $W/$name.json 2>&1 | tail -14
  kill $CTL; wait $CTL
done
names=""; for setting in ${AB:-barrier: nobarrier: settle: ctxgate:}; do names="$names ${setting%%:*}"; done
AB_NAMES=$names python3 - <<'PY' > $OUT/perturb-ab-summary.json
import json, os, statistics
out = {}
for name in os.environ["AB_NAMES"].split():
    try:
        rep, res = json.load(open(f"/tmp/krex-ab/{name}-report.json")), json.load(open(f"/tmp/krex-ab/{name}.json"))
    except OSError:
        continue
    regs = rep["regions"]
    out[name] = {"summary": res["summary"], "regions": len(regs), "clean": sum(r.get("clean", False) for r in regs),
                 "settle_ms": [round(r.get("settle_ns", 0) / 1e6, 1) for r in regs],
                 "clock_settle": [r.get("clock_settle") for r in regs],
                 "attest_us_median": statistics.median(r.get("attest_ns", 0) for r in regs) / 1e3,
                 "attest_end_us_median": statistics.median(r.get("attest_end_ns", 0) for r in regs) / 1e3,
                 "rows": [{k: x.get(k) for k in ("round", "cond", "size", "ms", "clean", "taints")} for x in res["rows"]]}
print(json.dumps(out, indent=1))
PY
tar czf $OUT/perturb-ab-logs.tgz -C $W . 2>/dev/null
ls -la $OUT
