#!/usr/bin/env bash
# tests/gpu/sum_level_h200.sh: does a holder's memory pattern (bench/candidate.py --holder-gib, the freeze-policy
# reference passes' placement sampling) move torch.sum's level on 1 GiB? Alone, no krex: NONCES commands with a
# 40-GiB holder and as many without, alternating. $OUT/sum-level.log (one JSON line per command).
set -u
. tests/gpu/env.sh
for n in ${NONCES:-1 2 3 4}; do
  for h in 40 0; do
    echo "holder_gib=$h nonce=$n $(timeout 60 python3 bench/candidate.py --op sum --size 1024 --variant 0 --nonce $((1700000 + n)) \
      --repeat 3 --warmup-ms 500 --min-reps 100 --holder-gib $h 2>&1 | tail -1)" | tee -a $OUT/sum-level.log
  done
done
