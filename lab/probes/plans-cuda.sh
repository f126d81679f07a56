#!/usr/bin/env bash
# One device call (~5 minutes): CUDA tests of the plan cache and hot units, then
# bench/hot_units.py's rows on lognormal firing rates (sigma 1.8 at 0.6 / 0.9 / 1.3%, sigma 1.0 at
# 1.3 / 1.9%). Its first form, with the hot-unit tests, made the rows of
# lab/runs/h200/hot-units/new-plan-per-call/ (every unfrozen inference call on a new plan).
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
res=build/hot/results; mkdir -p $res
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$res/build-ext.log 2>&1 || { tail $res/build-ext.log; exit 1; }
echo "ext built at $(el) s"
python3 -m pytest -q -p no:cacheprovider tests/python/test_ops.py tests/python/test_hot_units.py \
  -k "plan or unfrozen or cuda or inference" >$res/tests.out 2>&1
echo "tests rc $? at $(el) s"; tail -6 $res/tests.out
for cfg in "1.8:0.006,0.009,0.013" "1.0:0.013,0.019"; do
  sigma=${cfg%%:*}; dens=${cfg#*:}
  python3 bench/hot_units.py --spread $sigma --densities $dens --hot 512,768,1024 \
    --out $res/sigma-$sigma >$res/sigma-$sigma.out 2>&1; echo "sigma $sigma rc $? at $(el) s"
  grep "H   512\|H  1024" $res/sigma-$sigma.out | sed 's/synthetic lognormal //'
done
nvidia-smi --query-gpu=name,power.draw,temperature.gpu,clocks.sm --format=csv,noheader
tar czf $OUT/results.tgz -C build/hot results
