#!/usr/bin/env bash
# `--suite decode` with --m/--k/--n runs one case of those parameters, as that suite times its own,
# instead of the suite's cases: one result row, of that shape.
#   usage: one_case.sh path/to/twell
set -uo pipefail
twell=$1
out=$(timeout 120 "$twell" bench --no-write --backend cpu --suite decode --m 3 --k 64 --n 264 --pattern uniform \
  --density 0.05 --reps 2 --warmup 1 2>&1)
rc=$?
rows=$(grep -cE '^cpu +\| +3 x +64 x +264 \|' <<<"$out")
others=$(grep -cE '^cpu +\| +[0-9]+ x' <<<"$out")
if [ "$rc" -ne 0 ] || [ "$rows" -ne 1 ] || [ "$others" -ne 1 ]; then
  echo "FAIL: twell bench --suite decode --m 3 --k 64 --n 264: exit $rc, $rows rows of that shape, $others rows in all"
  echo "$out" | tail -n 5
  exit 1
fi
echo "ok: one decode case of the given shape"
