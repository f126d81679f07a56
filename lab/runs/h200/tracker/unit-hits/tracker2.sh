#!/usr/bin/env bash
# twell.train at L1 = 0 on the 0.5B shape: twell with the dead-unit tracker, twell without it,
# 60 steps each, as many as fit (the unit-hits tracker against none), tokens/s from the log.
set -uo pipefail
export PYTHONPATH=$PWD/python
t0=$(date +%s)
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
echo "built at $(( $(date +%s) - t0 )) s"
common="--model paper-0.5b --data .carry/corpus --steps 60 --batch-size 32 --seq-len 1024 --eval-every 0 --eval-batches 1 --log-every 10 --no-progress --seed 0 --l1 0 --no-checkpoint"
for cfg in "tracked:" "untracked:--no-dead-tracking" "tracked2:" "untracked2:--no-dead-tracking"; do
  [ $(( $(date +%s) - t0 )) -lt 140 ] || break
  name=${cfg%%:*}; extra=${cfg#*:}
  python3 -m twell.train $common $extra --out build/t/$name >build/$name.out 2>&1; rc=$?; [ $rc -eq 0 ] || tail -5 build/$name.out
  cp build/t/$name/log.jsonl $OUT/$name.jsonl 2>/dev/null
  python3 - "$OUT/$name.jsonl" "$name" "$rc" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[3] == "0" else []
tps = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s") and r.get("step", 0) > 10]
print(sys.argv[2], "rc", sys.argv[3], "tokens/s", [round(t) for t in tps], "median", round(statistics.median(tps)) if tps else None)
PY
  echo "  at $(( $(date +%s) - t0 )) s"
done
