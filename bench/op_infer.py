"""One FFN inference call through the twell.torch module against torch's dense MLP (harness rows).

The problem of bench/op_train.py (the same weights in a frozen twell.torch.SparseGatedMLP and in
torch's relu(x Wg^T)(x Wu^T) Wd^T; x's column 0 and the gate's set each neuron's firing rate:
uniform, or lognormal rates of mean --density for heavy_tailed), without gradients: what a user's
eager inference call costs. On the CPU the module's automatic dispatch may run torch's dense MLP
where it measured faster (twell.torch._cpu_paths); `torch_share` is the fraction of the timed
twell calls it did. Time: medians of --reps calls after --warmup of each (the ways alternating,
which first alternating too),
wall time on the CPU, CUDA events on a GPU (each call from an idle device: the host's time
included, as in an eager decoding step). Agreement: ||twell - dense|| / ||dense|| of y, one more
call after the timed ones (whichever way it ran).

Rows (suite "op_infer"): device, dtype, M, K, N, pattern, density (measured), dense_ms, twell_ms
(median, p20, p80), speedup, torch_share, rel_diff, threads (CPU).

    python3 bench/op_infer.py [--m 1,16,256] [--k 2048] [--n 5632] [--densities 0.005,0.01,0.5]
                              [--patterns uniform] [--dtypes float32,bfloat16] [--device cpu]
                              [--reps 9] [--warmup 6] [--out DIR]
"""
import argparse
import os
import sys

import torch

import twell
from twell.torch import _cpu_paths

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # timing.py, op_train.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_train  # noqa: E402
from model_agreement import rel  # noqa: E402
from timing import Timer, summary, write_rows  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default="1,16,256", help="comma-separated rows (tokens)")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--densities", default="0.005,0.01,0.5",
                   help="comma-separated fractions of active units")
    p.add_argument("--patterns", default="uniform", help="uniform, heavy_tailed (comma-separated)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="build/results", help="folder of op_infer.json")
    a = op_train.problem_args(p, p.parse_args(argv))
    dtypes = [getattr(torch, v, None) for v in a.dtypes.split(",") if v]
    if not dtypes or not set(dtypes) <= {torch.float32, torch.bfloat16, torch.float16}:
        p.error(f"--dtypes wants float32, bfloat16, float16, got {a.dtypes!r}")
    a.dtypes, a.capacity = dtypes, 0
    return a


def torch_calls(mlp):
    paths = mlp.__dict__.get("_cpu_paths")
    return sum(r[1][1] for r in paths.regimes.values()) if paths else 0


def run_case(a, m, density, pattern, device, dtype):
    mlp, dense, x, _ = op_train.problem(a, m, density, pattern, device, dtype)
    mlp.eval().freeze()
    x = x.detach()
    ways = {"dense": dense, "twell": mlp}
    timer = Timer(device)
    times = {w: [] for w in ways}
    with torch.no_grad():
        for _ in range(a.warmup):
            for module in ways.values():
                module(x)
        before = torch_calls(mlp)
        for i in range(a.reps):  # which way runs first alternates too (caches, clocks)
            for w, module in (list(ways.items()) if i % 2 == 0 else list(ways.items())[::-1]):
                times[w].append(timer(lambda: module(x)))
        share = (torch_calls(mlp) - before) / a.reps
        y = mlp(x)
        diff = rel(y, dense(x))
    t = {w: summary(v) for w, v in times.items()}
    return {
        "suite": "op_infer",
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else twell.cpu_description()),
        "dtype": str(dtype).replace("torch.", ""), "M": m, "K": a.k, "N": a.n, "pattern": pattern,
        "density": float(mlp.l0) / a.n, "reps": a.reps, "dense_ms": t["dense"], "twell_ms": t["twell"],
        "speedup": t["dense"]["median"] / t["twell"]["median"], "torch_share": share,
        "rel_diff": diff, "threads": torch.get_num_threads() if device.type == "cpu" else None,
    }


def main(argv=None):
    a = parse_args(argv)
    device = torch.device(a.device)
    rows = []
    for dtype in a.dtypes:
        for pattern in a.patterns:
            for density in a.densities:
                for m in a.m:
                    r = run_case(a, m, density, pattern, device, dtype)
                    rows.append(r)
                    print(f"{r['dtype']:8s} M={m:<5d} {pattern} {r['density']:.2%}: dense "
                          f"{r['dense_ms']['median']:.3f} ms, twell {r['twell_ms']['median']:.3f} ms "
                          f"({r['speedup']:.2f}x; torch's dense ran {r['torch_share']:.0%}); "
                          f"rel. diff {r['rel_diff']:.1e}", flush=True)
    print("wrote", write_rows(a.out, "op_infer.json", rows))


if __name__ == "__main__":
    main()
