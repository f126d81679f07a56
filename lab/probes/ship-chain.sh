#!/usr/bin/env bash
# (Kept from .carry/ship.sh: the device calls of lab/journal.md section 35; run from the repository root
# on the device machine with .carry/corpus carried.)
# Device phases for the shipped-model candidate ($NAME, default relu-l1-1.5e-4-r100), each one call,
# made back to back (the machine keeps build/ only while warm, ~30 s after a call):
#   1  build the extension, the CLI in the background, train $MIN minutes (default 8)
#   2  finish training, capture, per-layer rows (twell bench --from), whole-model prefill and
#      training rows (bench/model.py --floor)
#   3  generate() rows: eager (static and dynamic caches) and compiled
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHON=python3
export TWELL_REAL_NAME=${NAME:-relu-l1-1.5e-4-r100} TWELL_REAL_RESULTS=$OUT/real TWELL_REAL_MINUTES=${MIN:-8}
mkdir -p $OUT/real
run=build/real/$TWELL_REAL_NAME
t0=$(date +%s)
say() { echo "$* at $(( $(date +%s) - t0 )) s"; }
model() { python3 bench/model.py --checkpoint $run/checkpoint --energy-seconds 6 --out $OUT/real "$@"; }
case "$1" in
1)
  TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
  say "ext built"
  ( cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWELL_CUDA=ON -DTWELL_CUDA_ARCHITECTURES=90a \
      >$OUT/cli-build.log 2>&1 && nice cmake --build build -j 10 --target twell_cli >>$OUT/cli-build.log 2>&1; \
      echo "cli build rc $?" >>$OUT/cli-build.log ) &
  scripts/real-model train; rc=$?
  wait; tail -1 $OUT/cli-build.log; say "train rc $rc"
  ;;
2)
  scripts/real-model train; rc=$?; say "train rc $rc"
  [ $rc -eq 0 ] || exit $rc
  [ -x build/tools/twell/twell ] || cmake --build build -j 16 --target twell_cli >>$OUT/cli-build.log 2>&1
  scripts/real-model capture && cp $run/capture/manifest.json $OUT/real/capture-manifest.json; say captured
  scripts/real-model real; say "per-layer rows rc $?"
  model --modes inference,training --floor; say "model rows rc $?"
  ;;
3)
  model --modes generate --append; say "generate rc $?"
  model --modes generate --gen-cache dynamic --append; say "dynamic generate rc $?"
  model --modes generate --gen-cache compiled --append; say "compiled generate rc $?"
  ;;
esac
cp $run/log.jsonl $OUT/real/train-log.jsonl 2>/dev/null
nvidia-smi --query-gpu=name,power.draw,temperature.gpu --format=csv,noheader
