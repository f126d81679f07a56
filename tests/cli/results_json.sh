#!/usr/bin/env bash
# The results files `twell bench` writes are valid JSON whatever they hold: a capture folder whose
# name has a newline and quotes, and a manifest.json with quotes, newlines, backslashes, Infinity
# and nested values (strict parse: NaN / Infinity are no JSON). Two custom cases of different
# shapes keep their own files.
#   usage: results_json.sh path/to/twell
set -uo pipefail
twell=$1
command -v python3 >/dev/null || { echo "FAIL: results_json.sh parses JSON with python3, which is missing"; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

source "$(dirname "$0")/lib.sh"  # npy

# strict_json FILE: parses FILE as strict JSON, printing its rows' count.
strict_json() {
  python3 - "$1" <<'PY'
import json, sys
def refuse(name):
    raise ValueError(f"not JSON: {name}")
with open(sys.argv[1], encoding="utf-8") as f:
    rows = json.load(f, parse_constant=refuse)
assert isinstance(rows, list) and rows, "a non-empty array of rows"
print(len(rows), rows[0].get("checkpoint"), rows[0].get("source"), sep="|")
PY
}

dir="$scratch/odd \"name\"
with a newline"
mkdir -p "$dir"
npy "$dir/layer0.x.npy" 8 16 "" 074
for w in gate up down; do npy "$dir/layer0.$w.npy" 32 16 "" 074; done
cat >"$dir/manifest.json" <<'JSON'
{"checkpoint": "/runs/\"quoted\"\nline\\two}, \"x\": [", "l1_coef": Infinity,
 "train_log": {"nested": [1, {"deep": NaN}]}, "max_row_active": [1e999]}
JSON
out="$scratch/out"
if ! timeout 300 "$twell" bench --backend cpu --from "$dir" --reps 1 --warmup 1 --out "$out" >"$scratch/log" 2>&1; then
  echo "FAIL: twell bench --from: exit status $?"; tail -n 5 "$scratch/log"; exit 1
fi
for f in real real_training; do
  if got=$(strict_json "$out/$f.json" 2>&1); then
    case "$got" in
      1\|/runs/\"quoted\"*) echo "ok:   $f.json parses and keeps the manifest's values: $(head -n 1 <<<"$got")" ;;
      *) echo "FAIL: $f.json: unexpected values: $got"; failures=$((failures + 1)) ;;
    esac
  else
    echo "FAIL: $f.json is not JSON: $(tail -n 1 <<<"$got")"; failures=$((failures + 1))
  fi
done

for m in 3 5; do
  timeout 120 "$twell" bench --backend cpu --m $m --k 16 --n 64 --reps 1 --warmup 1 --out "$out" >/dev/null 2>&1 \
    || { echo "FAIL: custom case M=$m: exit status $?"; failures=$((failures + 1)); }
done
customs=$(ls "$out" | grep -c '^custom-.*\.json$')
if [ "$customs" -ne 2 ]; then
  echo "FAIL: two custom cases left $customs results files: $(ls "$out")"; failures=$((failures + 1))
else
  for f in "$out"/custom-*.json; do strict_json "$f" >/dev/null || failures=$((failures + 1)); done
  echo "ok:   two custom cases, two results files"
fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all results files are valid JSON"
