#!/usr/bin/env bash
# Every malformed or out-of-range CLI argument is refused before any work: exit status 2, nothing
# on stdout, and one message on stderr that names the flag and what it expects.
#   usage: bad_arguments.sh path/to/twell
set -uo pipefail
twell=$1
limit=30  # seconds per case: a refused argument returns at once; a case that runs takes longer
failures=0

# expect "message fragment" args...
expect() {
  local want=$1
  shift
  local out err rc
  out=$(mktemp) err=$(mktemp)
  timeout "$limit" "$twell" "$@" >"$out" 2>"$err"
  rc=$?
  if [ "$rc" -ne 2 ] || [ -s "$out" ] || ! grep -qF -- "$want" "$err"; then
    echo "FAIL: twell $*: exit $rc (want 2), stderr: $(head -c 300 "$err"), stdout: $(head -c 300 "$out")"
    failures=$((failures + 1))
  else
    echo "ok:   twell $*: $(head -n 1 "$err")"
  fi
  rm -f "$out" "$err"
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
expect "unknown command 'frobnicate'" frobnicate

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all bad arguments refused"
