#!/usr/bin/env bash
# One device call (~4 minutes): the split's training test again, then lab/probes/dispatch_paths.py.
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$OUT/build-ext.log 2>&1 || { tail $OUT/build-ext.log; exit 1; }
python3 -m pytest -q -p no:cacheprovider tests/python/test_hot_units.py 2>&1 | tail -2
timeout 240 python3 lab/probes/dispatch_paths.py 2>&1 | tee $OUT/dispatch_paths.txt
