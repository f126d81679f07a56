#!/usr/bin/env bash
# One device call (~8 minutes): hot units on CUDA with no trained model at hand.
#   1. the hot-unit tests (and the harness's, model bench's) on CUDA
#   2. bench/hot_units.py harness rows on lognormal firing rates: sigma 1.8 (top 10% of units
#      ~0.7 of the active pairs) at 0.6 / 0.9 / 1.3% mean density, sigma 1.0 (op_train's
#      heavy_tailed, #54's training row) at 1.3 / 1.9%
# Each part starts only while the call has time for it; results return in $OUT/results.tgz.
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
res=build/hot/results; mkdir -p $res
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
fits() { [ $(( $(el) + $1 )) -le ${LIMIT:-540} ] || { echo "skip $2 at $(el) s"; return 1; }; }
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$res/build-ext.log 2>&1 || { tail $res/build-ext.log; exit 1; }
echo "ext built at $(el) s"
python3 -m pytest -q -p no:cacheprovider tests/python/test_hot_units.py tests/python/test_hot_units_bench.py \
  tests/python/test_model_bench.py -k "hot or split or choose or tracker or plans" >$res/tests.out 2>&1
echo "tests rc $? at $(el) s"; tail -15 $res/tests.out
for cfg in "1.8:0.006,0.009,0.013" "1.0:0.013,0.019"; do
  fits 150 "$cfg" || break
  sigma=${cfg%%:*}; dens=${cfg#*:}
  python3 bench/hot_units.py --spread $sigma --densities $dens --hot 256,512,768,1024 \
    --out $res/sigma-$sigma >$res/sigma-$sigma.out 2>&1; echo "sigma $sigma rc $? at $(el) s"
  grep -v "^\s*$" $res/sigma-$sigma.out | tail -24
done
nvidia-smi --query-gpu=name,power.draw,temperature.gpu,clocks.sm --format=csv,noheader
tar czf $OUT/results.tgz -C build/hot results
