#!/usr/bin/env bash
# Device phases for the shipped-model candidate ($NAME, default relu-l1-1.5e-4-r100), calls made
# back to back (the machine keeps build/ only while warm, ~30 s after a call):
#   1   build the extension, the CLI in the background, train $MIN minutes (default 8)
#   go  finish training, then the pending measurements in order, each started only while the call
#       has time for it (a done flag per item under build/real/done-$TWELL_REAL_NAME): capture, per-layer rows,
#       whole-model prefill/training rows, generate() static / dynamic / compiled, per-layer and
#       whole-model rows with hot units run dense (bench/hot_units.py, --hot-units), the unit-hits
#       tests on CUDA.
#       Call again until it prints "all done". MEASURE=0: training alone (a baseline of the
#       study: NAME=silu, NAME=relu-l1-0-lr5e-4); phase 1 then builds no CLI. HITS=1: phase 1 runs
#       the unit-hits tests on CUDA before training.
# Results accumulate in build/real/results; each call returns them as $OUT/results.tgz.
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHON=python3 PYTHONUNBUFFERED=1
export TWELL_REAL_NAME=${NAME:-relu-l1-1.5e-4-r100} TWELL_REAL_RESULTS=build/real/results
run=build/real/$TWELL_REAL_NAME
res=build/real/results
mkdir -p $res build/real/done-$TWELL_REAL_NAME
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
say() { echo "$* at $(el) s"; }
model() { python3 bench/model.py --checkpoint $run/checkpoint --energy-seconds 6 --out $res "$@"; }
pack() {
  cp $run/log.jsonl $res/train-log.jsonl 2>/dev/null
  cp $OUT/*.log $res/ 2>/dev/null
  tar czf $OUT/results.tgz -C build/real results done-$TWELL_REAL_NAME
  nvidia-smi --query-gpu=name,power.draw,temperature.gpu --format=csv,noheader
}
# item NAME ESTIMATE_S COMMAND...: runs COMMAND once (done flag) if ESTIMATE_S fits before 570 s
# (estimates: the 0.5B model's measured times plus ~30%).
item() {
  local name=$1 est=$2; shift 2
  [ -f build/real/done-$TWELL_REAL_NAME/$name ] && return 0
  if [ $(( $(el) + est )) -gt 570 ]; then say "defer $name"; return 1; fi
  say "start $name"
  "$@" > >(tee $res/$name.out) 2>&1 && touch build/real/done-$TWELL_REAL_NAME/$name; say "$name rc $?"
}
hits() {
  python3 -m pytest -q -p no:cacheprovider tests/python/test_unit_hits.py
}
case "$1" in
1)
  TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
  say "ext built"
  [ "${HITS:-0}" = 1 ] && item hits 60 hits
  [ "${MEASURE:-1}" = 1 ] && ( cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWELL_CUDA=ON -DTWELL_CUDA_ARCHITECTURES=90a \
      >$OUT/cli-build.log 2>&1 && nice cmake --build build -j 10 --target twell_cli >>$OUT/cli-build.log 2>&1; \
      echo "cli build rc $?" >>$OUT/cli-build.log ) &
  TWELL_REAL_MINUTES=${MIN:-8} scripts/real-model train; rc=$?
  wait; tail -1 $OUT/cli-build.log; say "train rc $rc"
  ;;
go)
  if [ ! -f build/real/done-$TWELL_REAL_NAME/train ]; then
    TWELL_REAL_MINUTES=9 scripts/real-model train; rc=$?; say "train rc $rc"
    [ $rc -eq 0 ] && touch build/real/done-$TWELL_REAL_NAME/train
  fi
  if [ -f build/real/done-$TWELL_REAL_NAME/train ] && [ "${MEASURE:-1}" = 1 ]; then
    [ -x build/tools/twell/twell ] || cmake --build build -j 16 --target twell_cli >>$OUT/cli-build.log 2>&1
    item capture 40 bash -c "scripts/real-model capture && cp $run/capture/manifest.json $res/capture-manifest.json" &&
    item real 45 scripts/real-model real &&
    item model 90 model --modes inference,training --floor &&
    item gen-static 130 model --modes generate --append &&
    item gen-dynamic 130 model --modes generate --gen-cache dynamic --append &&
    item gen-compiled 180 model --modes generate --gen-cache compiled --append &&
    item hot 120 python3 bench/hot_units.py --from $run/capture --hot 512,768,1024 --out $res &&
    item model-hot 120 model --modes inference,training --hot-units auto --append &&
    item hits 40 hits && say "all done"
  fi
  ;;
esac
pack
