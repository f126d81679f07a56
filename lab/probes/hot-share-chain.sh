#!/usr/bin/env bash
# One device call (~9 minutes): how concentrated a sparse model's firing is, what the dead-unit
# tracker costs now, the cuBLAS GEMMs a hot/cold split would run, and automatic dispatch on
# trained-like decoding.
#   1. the shipped model's recipe (runs file: relu-l1-1.5e-4-r100) to step $STOP: its log carries
#      hot_share per layer (training window and validation)
#   2. twell.train at L1 = 0, tracked and untracked, 60 steps each (tokens/s)
#   3. bf16 GEMMs of M = 16384, K = 2048 and N = H hot units (up) and back (down), CUDA events
#   4. twell bench decode cases, trained_like: automatic against forced sparse
# Each part starts only while the call has time for it; everything returns in $OUT/results.tgz.
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
res=build/hot/results; mkdir -p $res
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
fits() { [ $(( $(el) + $1 )) -le ${LIMIT:-540} ] || { echo "skip $2 at $(el) s"; return 1; }; }
TWELL_CUDA=ON TWELL_CUDA_ARCHITECTURES=90a PYTHON=python3 scripts/build-ext >$res/build-ext.log 2>&1 || { tail $res/build-ext.log; exit 1; }
echo "ext built at $(el) s"
( cmake -S . -B build-ext -DTWELL_BUILD_TOOLS=ON >$res/cli-build.log 2>&1 &&
  nice cmake --build build-ext -j 8 --target twell_cli >>$res/cli-build.log 2>&1; echo "cli rc $?" >>$res/cli-build.log ) &
common="--model paper-0.5b --data .carry/corpus --batch-size 32 --seq-len 1024 --log-every 20 --no-progress --seed 0 --no-checkpoint"
STOP=${STOP:-700}
python3 -m twell.train $common --steps 3200 --stop-at $STOP --eval-every $(( STOP / 2 )) --eval-batches 16 \
  --l1 1.5e-4 --reinit-dead-every 100 --out build/hot/ship >$res/ship.out 2>&1; echo "ship rc $? at $(el) s"
cp build/hot/ship/log.jsonl $res/ship.jsonl 2>/dev/null
for cfg in "tracked:" "untracked:--no-dead-tracking"; do
  fits 60 "$cfg" || break
  name=${cfg%%:*}; extra=${cfg#*:}
  python3 -m twell.train $common --steps 60 --eval-every 0 --eval-batches 1 --l1 0 $extra --out build/hot/$name \
    >$res/$name.out 2>&1; echo "$name rc $? at $(el) s"
  cp build/hot/$name/log.jsonl $res/$name.jsonl 2>/dev/null
done
fits 30 gemms && python3 - >$res/gemms.txt 2>&1 <<'PY'
import torch
torch.manual_seed(0)
M, K = 16384, 2048
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
dev = torch.cuda.get_device_name()
def ms(f, reps=20):
    for _ in range(3): f()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]
print(dev, "M", M, "K", K, "bf16, median of 20 CUDA-event timings, ms")
for h in (56, 113, 282, 564, 1127, 2816, 5632):
    w = torch.randn(h, K, device="cuda", dtype=torch.bfloat16) * 0.02
    wd = torch.randn(K, h, device="cuda", dtype=torch.bfloat16) * 0.02
    u = torch.randn(M, h, device="cuda", dtype=torch.bfloat16)
    up = ms(lambda: x @ w.t())
    down = ms(lambda: u @ wd.t())
    print(f"H {h:5d}  up x@Wu_hot^T {up:.4f}  down U@Wd_hot^T {down:.4f}")
PY
echo "gemms at $(el) s"
cli=build-ext/tools/twell/twell
for i in $(seq 1 60); do grep -q "cli rc" $res/cli-build.log && break; sleep 2; done
tail -1 $res/cli-build.log
if [ -x $cli ]; then
  for m in 1 16 32 64; do
    for d in auto sparse; do
      fits 20 "decode m$m $d" || break 2
      $cli bench --suite decode --m $m --k 2048 --n 5632 --density 0.005 --pattern trained_like --dispatch $d \
        --no-write 2>&1 | tail -2 | tee -a $res/decode.txt
    done
  done
fi
echo "done at $(el) s"
tar czf $OUT/results.tgz -C build/hot results
