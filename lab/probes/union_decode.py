"""Is batched decoding over the union of the batch's active units worth a kernel? (issue 54)

A torch-only prototype, exact: per layer, g = x Wg^T (cuBLAS); the units active for any of the M
tokens (the union) listed in a fixed-size index of U units (argsort of the union mask: the first
entries are the union, the rest inactive units, whose relu(g) = 0 adds nothing); Wu and Wd rows of
those U units gathered (torch.index_select); u = x Wu[U]^T, h = relu(g[:, U]) * u, y = h Wd[U]
(cuBLAS). Sync-free, so 8 layers go into one CUDA graph. U is fixed per M before capture (the
measured union, rounded up to 64); a union larger than U would need the dense path, not measured
here. A kernel would fuse the gathers into the GEMMs; this prototype pays them as copies, so it
bounds the design from below.

Against, in the same process and graph setting: torch's dense MLP and the frozen twell module
(automatic dispatch), each as one graph of 8 layers (each layer its own weights, cold in L2 after
a flush), medians of CUDA-event timings per layer. Uniform rates and lognormal (sigma 1.8) rates at
the given density; M = 1 ... 64. Development probe.
    python3 lab/probes/union_decode.py [--density 0.005] [--m 1,16,32,64] [--small]
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "bench")
import op_train  # noqa: E402
from timing import Timer  # noqa: E402


def layer(a, density, pattern, seed, device, dtype):
    ns = argparse.Namespace(k=a.k, n=a.n, capacity=0, seed=seed)
    mlp, _, _, _ = op_train.problem(ns, 1, density, pattern, device, dtype, a.sigma)
    return mlp.eval().freeze()


def union_size(mlp, x):
    with torch.no_grad():
        return int((F.linear(x, mlp.gate_proj.weight) > 0).any(0).sum())


def union_ffn(mlp, x, units):
    g = F.linear(x, mlp.gate_proj.weight)
    mask = (g > 0).any(0)
    idx = torch.argsort((~mask).to(torch.int8), stable=True)[:units]
    wu = mlp.up_proj.weight.index_select(0, idx)
    wd = mlp.down_nk.index_select(0, idx)
    h = F.relu(g.index_select(1, idx)) * F.linear(x, wu)
    return h @ wd


def dense_ffn(mlp, x):
    w = mlp
    return F.linear(F.relu(F.linear(x, w.gate_proj.weight)) * F.linear(x, w.up_proj.weight),
                    w.down_proj.weight)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--density", type=float, default=0.005)
    p.add_argument("--m", default="1,16,32,64")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--sigma", type=float, default=1.8)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--small", action="store_true", help="a CPU check of the script itself")
    a = p.parse_args()
    cuda = not a.small
    a.k, a.n = (64, 256) if a.small else (2048, 5632)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = Timer(device)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if cuda else None
    for pattern in ("uniform", "heavy_tailed"):
        layers = [layer(a, a.density, pattern, s, device, dtype) for s in range(a.layers)]
        for m in [int(v) for v in a.m.split(",")]:
            gen = torch.Generator(device=device).manual_seed(m)
            xs = [torch.randn(m, a.k, generator=gen, device=device).to(dtype) for _ in layers]
            for x in xs:
                x[:, 0] = 1  # op_train's control column: the rates hold
            unions = [union_size(l, x) for l, x in zip(layers, xs)]
            units = min(a.n, (max(unions) + 63) // 64 * 64)
            ways = {
                "dense": lambda: [dense_ffn(l, x) for l, x in zip(layers, xs)],
                "twell": lambda: [l(x) for l, x in zip(layers, xs)],
                "union": lambda: [union_ffn(l, x, units) for l, x in zip(layers, xs)],
            }
            with torch.no_grad():
                ref = [dense_ffn(l, x).float() for l, x in zip(layers, xs)]
                for name, fn in ways.items():
                    for _ in range(12):  # twell's dispatch settles eagerly before capture
                        out = fn()
                    err = max(float((o.float() - r).norm() / r.norm().clamp_min(1e-30))
                              for o, r in zip(out, ref))
                    if err > 2e-2:
                        sys.exit(f"{name}: relative error {err:.3g} at M = {m}")
                runs = {}
                for name, fn in ways.items():
                    if cuda:
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            fn()
                        torch.cuda.current_stream().wait_stream(s)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            fn()
                        runs[name] = graph.replay
                    else:
                        runs[name] = fn
                times = {name: [] for name in runs}
                for _ in range(a.reps):
                    for name, run in runs.items():
                        if flush is not None:
                            flush.zero_()
                        times[name].append(timer(run) * 1000 / a.layers)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{pattern:12s} M={m:3d} union {min(unions)}-{max(unions)} of {a.n} (U={units}): "
                  + ", ".join(f"{k} {v:.1f} us" for k, v in med.items())
                  + f" | twell {med['dense'] / med['twell']:.2f}x, union "
                  f"{med['dense'] / med['union']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
