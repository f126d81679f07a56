#!/usr/bin/env bash
# Every malformed or out-of-range CLI argument, and every input file that cannot be read, is
# refused before any work: exit status 2, nothing on stdout, and exactly one line on stderr that
# names the command, the argument and what it expects. Each command's --help prints its own help.
#   usage: bad_arguments.sh path/to/twell
set -uo pipefail
twell=$1
limit=30  # seconds per case: a refused argument returns at once; a case that runs takes longer
failures=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# case RC STREAM "text" args...: `twell args` exits RC with "text" on STREAM (out or err) and
# nothing on the other; a refusal (RC 2) prints exactly one line.
case_of() {
  local rc_want=$1 stream=$2 want=$3
  shift 3
  local out err rc said quiet
  out=$(mktemp) err=$(mktemp)
  timeout "$limit" "$twell" "$@" >"$out" 2>"$err"
  rc=$?
  if [ "$stream" = err ]; then said=$err quiet=$out; else said=$out quiet=$err; fi
  if [ "$rc" -ne "$rc_want" ] || [ -s "$quiet" ] || ! grep -qF -- "$want" "$said" ||
     { [ "$rc_want" -eq 2 ] && [ "$(wc -l <"$said")" -ne 1 ]; }; then
    echo "FAIL: twell $*: exit $rc (want $rc_want), $(wc -l <"$said") line(s) on std$stream: $(head -c 300 "$said"); std$([ "$stream" = err ] && echo out || echo err): $(head -c 300 "$quiet")"
    failures=$((failures + 1))
  else
    echo "ok:   twell $*: $(head -n 1 "$said")"
  fi
  rm -f "$out" "$err"
}
# expect "message fragment" args...: refused (exit 2, one line on stderr, nothing on stdout).
expect() { case_of 2 err "$@"; }
# help "text on stdout" args...: exit status 0, the text on stdout, nothing on stderr.
help() { case_of 0 out "$@"; }

source "$(dirname "$0")/lib.sh"  # npy

# capture DIR: a one-layer capture folder (x [4, 16], weights [32, 16]).
capture() {
  mkdir -p "$1"
  npy "$1/layer0.x.npy" 4 16
  for w in gate up down; do npy "$1/layer0.$w.npy" 32 16; done
}

for d in -1 0 2 nan inf -inf 0.5x "" " 0.5"; do
  expect "--density: expected a number in (0, 1], got '$d'" bench --no-write --density "$d"
done
for m in 1.5 nan 1e30 0 -3 3e9 12abc "" 99999999999999999999; do
  expect "--m: expected an integer in 1..16777216, got '$m'" bench --no-write --m "$m"
done
expect "--k: expected an integer in 1..1048576, got '3e9'" bench --no-write --k 3e9
expect "--k: expected an integer in 1..1048576, got '3000000000'" bench --no-write --k 3000000000
expect "--n: expected an integer in 1..1048576, got '0'" bench --no-write --n 0
expect "more than this machine's" bench --no-write --m 16777216 --k 1048576 --n 1048576
expect "--reps: expected an integer in 1..1000000, got '0'" bench --no-write --reps 0
expect "--reps: expected an integer in 1..1000000, got '2.5'" bench --no-write --reps 2.5
expect "--warmup: expected an integer in 0..1000000, got '-1'" bench --no-write --warmup -1
expect "--suite: expected default | cpu | inference |" bench --no-write --suite foo
expect "--suite real needs --from DIR" bench --no-write --suite real
expect "--from takes its shapes from the capture: drop --m" bench --no-write --from /nonexistent --m 4
expect "--from runs the real suite" bench --no-write --from /nonexistent --suite cpu
expect "--rows applies to --from" bench --no-write --rows 4
expect "--rows: expected an integer in 1..16777216, got '0'" bench --no-write --from /nonexistent --rows 0
expect "--suite: expected default | cpu | inference |" bench --no-write --suite foo --m 4
expect "--m describes a custom case: use it with --suite custom, training or decode" bench --no-write --suite cpu --m 4
expect "--backend: expected auto | cpu | cuda, got 'foo'" bench --no-write --backend foo
expect "--pattern: expected uniform, heavy_tailed" bench --no-write --pattern foo
expect "--kind: expected gated | plain, got 'x'" bench --no-write --kind x
expect "--dtype: expected float32 | bfloat16 | float16, got 'int8'" bench --no-write --dtype int8
expect "option --m needs a value" bench --no-write --m
expect "unknown bench option --bogus" bench --bogus
expect "the training suite runs gated FFNs only" bench --no-write --suite training --kind plain
expect "--backend: expected auto | cpu | cuda, got 'foo'" check --backend foo
expect "unknown check option --bogus" check --bogus
expect "option --backend needs a value" check --backend
expect "twell: unknown command 'frobnicate'" frobnicate
expect "twell: unknown command 'bogus'" help bogus
expect "twell info: arguments: expected none" info extra
expect "twell help: arguments: expected one command (bench | check | info), got 'check extra'" help check extra
expect "twell help: arguments: expected one command (bench | check | info), got 'info --help'" help info --help
expect "twell bench: --from: folder: expected a folder" bench --no-write --from "$scratch/nonexistent"
capture "$scratch/ok"
expect "twell bench: --out: expected a folder" bench --from "$scratch/ok" --out /dev/null/results
capture "$scratch/fifo" && rm "$scratch/fifo/layer0.up.npy" && mkfifo "$scratch/fifo/layer0.up.npy"
expect "layer0.up.npy: expected a readable regular file, got a FIFO" bench --no-write --from "$scratch/fifo"
capture "$scratch/dir" && mkdir "$scratch/dir/manifest.json"
expect "manifest.json: expected a readable regular file, got a directory" bench --no-write --from "$scratch/dir"
capture "$scratch/json" && printf '{"checkpoint": "a' >"$scratch/json/manifest.json"
expect "manifest.json: expected a closing quote" bench --no-write --from "$scratch/json"
capture "$scratch/empty" && npy "$scratch/empty/layer0.x.npy" 0 16
expect "layer 0 x: expected [M, K] with at least one row" bench --no-write --from "$scratch/empty"
capture "$scratch/spaced" && npy "$scratch/spaced/layer0.x.npy" "1 6" 16 1024
expect "a 2-D shape" bench --no-write --from "$scratch/spaced"
capture "$scratch/late" && mkdir -p "$scratch/late" && cp "$scratch/late/layer0.x.npy" "$scratch/late/layer1.x.npy"
expect "layer1.up.npy: expected a readable regular file" bench --no-write --from "$scratch/late"
# A link to nothing is no missing file: a dangling gate made the layer a plain FFN, a dangling
# layer1.x.npy ended the layers at one.
capture "$scratch/gatelink" && rm "$scratch/gatelink/layer0.gate.npy" && ln -s nowhere.npy "$scratch/gatelink/layer0.gate.npy"
expect "layer0.gate.npy: expected a readable regular file, got a dangling symbolic link" bench --no-write --from "$scratch/gatelink"
capture "$scratch/xlink" && ln -s nowhere.npy "$scratch/xlink/layer1.x.npy"
expect "layer1.x.npy: expected a readable regular file, got a dangling symbolic link" bench --no-write --from "$scratch/xlink"
capture "$scratch/twice" && npy_dict "$scratch/twice/layer0.x.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 16), 'shape': (2, 16), }" 256
expect "layer0.x.npy: expected a header dict of 'descr', 'fortran_order' and 'shape', each once, got 'shape' again" bench --no-write --from "$scratch/twice"
capture "$scratch/dup" && printf '{"checkpoint": "a", "checkpoint": "b"}' >"$scratch/dup/manifest.json"
expect 'manifest.json: expected a member name not used before in its object at byte 20, got "checkpoint" again' bench --no-write --from "$scratch/dup"
# About 1 MB of 70000 member names: refused at once by their count (each name was looked up among
# the ones before it, for every row of the run).
capture "$scratch/many" && seq 100000 169999 | awk 'BEGIN { printf "{" } { printf "%s\"k%d\": 0", (NR > 1 ? ", " : ""), $1 } END { print "}" }' >"$scratch/many/manifest.json"
expect "manifest.json: expected at most 65536 values" bench --no-write --from "$scratch/many"
if ! "$twell" info | grep -q "CUDA backend: compiled"; then
  expect "twell check: --backend: expected auto | cpu (this twell was built without CUDA), got 'cuda'" check --backend cuda
  expect "twell bench: --backend: expected auto | cpu (this twell was built without CUDA), got 'cuda'" bench --no-write --backend cuda
fi

help "usage: twell <command>" --help
help "usage: twell <command>" help
help "usage: twell bench" bench --help
help "usage: twell bench" help bench
help "usage: twell check" check --help
help "usage: twell check" check --backend cpu -h
help "usage: twell info" info --help

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all bad arguments refused"
