#!/usr/bin/env bash
# twell.train at L1 = 0 on the 0.5B shape: twell with the dead-unit tracker, twell without it,
# and the unpatched ReLU model (relu-torch); 120 steps each, tokens/s from the log.
set -uo pipefail
export PYTHONPATH=$PWD/python
t0=$(date +%s)
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
echo "built at $(( $(date +%s) - t0 )) s"
common="--model paper-0.5b --data .carry/corpus --steps 120 --batch-size 32 --seq-len 1024 --eval-every 0 --eval-batches 1 --log-every 20 --no-progress --seed 0 --l1 0 --no-checkpoint"
for cfg in "tracked:" "untracked:--no-dead-tracking" "relu-torch:--activation relu-torch" "tracked2:" "relu-torch2:--activation relu-torch" "untracked2:--no-dead-tracking"; do
  name=${cfg%%:*}; extra=${cfg#*:}
  python3 -m twell.train $common $extra --out build/t/$name >$OUT/$name.out 2>&1; rc=$?
  cp build/t/$name/log.jsonl $OUT/$name.jsonl 2>/dev/null
  python3 - "$OUT/$name.jsonl" "$name" "$rc" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if sys.argv[3] == "0" else []
tps = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s") and r.get("step", 0) > 20]
print(sys.argv[2], "rc", sys.argv[3], "tokens/s", [round(t) for t in tps], "median", round(statistics.median(tps)) if tps else None)
PY
  echo "  at $(( $(date +%s) - t0 )) s"
done
