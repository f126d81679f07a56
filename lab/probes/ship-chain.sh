#!/usr/bin/env bash
# Device phases for the shipped-model candidate ($NAME, default relu-l1-1.5e-4-r100), calls made
# back to back (the machine keeps build/ and what runs under setsid only while it is held, ~30 s
# after a call):
#   1   build the extension, then start the whole training run and the CLI and C++ test build in
#       their own process sessions (they outlive the call; $PROBES, a command line of timing
#       probes, runs before them), then run $TESTS (pytest paths, default
#       the plan-cache, CUDA and hot-unit tests) on CUDA beside them, then the C++ CUDA API tests
#       if built in time, then wait for the training (up to ~9.5 minutes a call: fewer gaps between
#       calls, each of which loses the machine if it passes ~30 s).
#   go  wait for training to end (it ran while the calls came and went), then the pending
#       measurements in order, each started only while the call has time for it (a done flag per
#       item under build/real/done-$TWELL_REAL_NAME): the C++ CUDA API tests (built beside the
#       training in phase 1, run there if the build was done in time), capture, per-layer rows,
#       per-layer rows with hot units run dense (bench/hot_units.py), whole-model prefill/training
#       rows, the same with --hot-units auto, the union-decoding probe, generate() static /
#       compiled / dynamic.
#       Call again until it prints "all done". MEASURE=0: training alone (a baseline of the study:
#       NAME=silu-lr5e-4, NAME=relu-l1-0-lr5e-4); phase 1 then builds no CLI (CPP=1: the C++ tests).
# Results accumulate in build/real/results; each call returns them as $OUT/results.tgz. Carry the
# corpus (.carry/corpus) in phase 1's call; later calls need not (the running job reads it).
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHON=python3 PYTHONUNBUFFERED=1
export TWELL_REAL_NAME=${NAME:-relu-l1-1.5e-4-r100} TWELL_REAL_RESULTS=build/real/results
run=build/real/$TWELL_REAL_NAME
res=build/real/results
done=build/real/done-$TWELL_REAL_NAME
mkdir -p $res $done
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
say() { echo "$* at $(el) s"; }
model() { python3 bench/model.py --checkpoint $run/checkpoint --energy-seconds 6 --out $res "$@"; }
pack() {
  cp $run/log.jsonl $res/train-log.jsonl 2>/dev/null
  cp build/real/train.out $res/ 2>/dev/null
  cp $OUT/*.log $res/ 2>/dev/null
  tar czf $OUT/results.tgz -C build/real results done-$TWELL_REAL_NAME
  nvidia-smi --query-gpu=name,power.draw,temperature.gpu,memory.used --format=csv,noheader
}
# item NAME ESTIMATE_S COMMAND...: runs COMMAND once (done flag) if ESTIMATE_S fits before 570 s
# (estimates: the 0.5B model's measured times plus ~30%).
item() {
  local name=$1 est=$2; shift 2
  [ -f $done/$name ] && return 0
  if [ $(( $(el) + est )) -gt 570 ]; then say "defer $name"; return 1; fi
  say "start $name"
  "$@" > >(tee $res/$name.out) 2>&1 && touch $done/$name; say "$name rc $?"
}
# wait_train: until the training ends or the call has run 560 s.
wait_train() {
  while [ ! -f build/real/train.rc ] && [ $(el) -lt 560 ]; do sleep 10; done
  tail -4 build/real/train.out
}
# cpp_tests: the C++ CUDA API suites (plans, set_weights, graphs, dispatch, decoding) of build/;
# done once run, failures or not (its output says which: no call runs them twice).
cpp_tests() {
  build/tests/twell_tests --gtest_brief=1 \
    --gtest_filter='CudaInference.*:CudaTrainingApi.*:CudaTrainingGraph.*:*CudaGraph*:DispatchRule.*:*CudaDecode*:*CudaPack*'
  echo "twell_tests exit status $?"
}
# detached CMD...: runs CMD in a new process session, output in build/real/<first word>.out
detached() {
  local log=$1; shift
  setsid nohup bash -c "$*" >build/real/$log.out 2>&1 </dev/null &
}
case "$1" in
1)
  TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
  say "ext built"
  # $PROBES: timing probes, run before the training starts (the GPU is the training's after it)
  if [ -n "${PROBES:-}" ]; then bash -c "$PROBES" > >(tee $res/probes.out) 2>&1; say "probes done"; fi
  detached train "TWELL_REAL_MINUTES=40 scripts/real-model train; echo \$? > build/real/train.rc"
  # the CLI and the C++ tests (MEASURE=1), or the C++ tests alone (CPP=1, with MEASURE=0)
  targets=""; [ "${MEASURE:-1}" = 1 ] && targets="twell_cli twell_tests"
  [ "${MEASURE:-1}" = 0 ] && [ "${CPP:-0}" = 1 ] && targets="twell_tests"
  [ -n "$targets" ] && detached cli "rc=0; cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTWELL_CUDA=ON -DTWELL_CUDA_ARCHITECTURES=90a || rc=1; for t in $targets; do [ \$rc = 0 ] && \
      { nice cmake --build build -j 6 --target \$t || rc=1; }; done; echo \$rc > build/real/cli.rc"
  # (the timing test compares device and host times: not beside a training on the same GPU)
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/python/test_ops.py tests/python/test_cuda.py \
      tests/python/test_hot_units.py -k "not timing_hides"} 2>&1 | tail -40
  say "tests done"
  while [ -n "$targets" ] && [ ! -f build/real/cli.rc ] && [ $(el) -lt 420 ]; do sleep 10; done
  [ -f build/real/cli.rc ] && item cpp-tests 120 cpp_tests
  wait_train
  ;;
go)
  # A fresh machine (the last call's was given back: more than ~30 s between the calls) holds no
  # training: say so at once rather than wait out the call.
  if [ ! -f build/real/train.out ]; then echo "no training on this machine: start again with phase 1"; exit 3; fi
  wait_train
  [ "${MEASURE:-1}" = 0 ] && [ -f build/real/cli.rc ] && item cpp-tests 120 cpp_tests
  if [ "$(cat build/real/train.rc 2>/dev/null)" = 0 ] && [ "${MEASURE:-1}" = 1 ]; then
    tail -2 build/real/cli.out
    [ -x build/tools/twell/twell ] || cmake --build build -j 16 --target twell_cli >>build/real/cli.out 2>&1
    while [ ! -f build/real/cli.rc ] && [ $(el) -lt 300 ]; do sleep 10; done
    item cpp-tests 120 cpp_tests
    item capture 40 bash -c "scripts/real-model capture && cp $run/capture/manifest.json $res/capture-manifest.json" &&
    item real 45 scripts/real-model real &&
    item hot 120 python3 bench/hot_units.py --from $run/capture --hot 512,768,1024 --out $res &&
    item model 90 model --modes inference,training --floor &&
    item model-hot 120 model --modes inference,training --hot-units auto --append &&
    item union 90 python3 lab/probes/union_decode.py --m 1,16,32,64 &&
    item gen-static 130 model --modes generate --append &&
    item gen-compiled 180 model --modes generate --gen-cache compiled --append &&
    item gen-dynamic 130 model --modes generate --gen-cache dynamic --append && say "all done"
  fi
  ;;
esac
pack
