"""One FFN training step through the torch op against dense torch: time and peak memory (harness rows).

A twell.torch.SparseGatedMLP and a dense MLP in torch (gate and up by F.linear, ReLU, their
product, down by F.linear: a Llama MLP with a ReLU gate, autograd for its backward) share the same
weights. x [M, K] requires grad; its column 0 is 1 and the gate's column 0 a per-neuron threshold,
so each neuron fires for its own rate of tokens (uniform: every neuron at --density;
heavy_tailed: lognormal rates, their mean --density). A step: y = mlp(x); y.backward(dy).

Peak memory: torch.cuda.max_memory_allocated over one step, minus what was allocated before it
(x, dy, the weights; every gradient set to None), so it counts all the step holds, the gradients
it leaves (x.grad, the three weight gradients) included, as the paper's and the official kernels'
figures do. held_mb: what the forward leaves allocated for the backward (y included).
Time: median of CUDA events over --reps steps (the ways alternating) after --warmup steps of each
(automatic dispatch tries both saved forms); --timing device (the default) the device's work alone,
the host's launch time hidden behind a sleeping device as a model's other layers hide it, --timing
call each step from an idle device, the host's time included. Agreement: ||twell - dense|| / ||dense|| of y, dx and
each weight gradient (both bf16, fp32-accumulated: rounding apart).

Rows (suite "op_train"): device, M, K, N, dtype, pattern, density (measured), dense_ms, twell_ms
(median, p20, p80), timing, speedup, dense_peak_mb, twell_peak_mb, peak_ratio, dense_held_mb,
twell_held_mb, rel_diff {y, dx, dgate, dup, ddown}, and the plan's view: saved_form (what the
twell steps saved), twell_saved_mb, workspace_mb {compact_forward, compact_backward,
dense_forward, dense_backward} (the scratch the op allocates for each call of each saved form).

    python3 bench/op_train.py [--m 16384] [--k 2048] [--n 5632] [--densities 0.005]
                              [--patterns uniform] [--reps 20] [--warmup 8] [--out DIR]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import twell
import twell.torch as tt
from twell.torch import _ops

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # timing.py, model_agreement.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_agreement import rel  # noqa: E402
from timing import Timer, summary, write_rows  # noqa: E402

MB = 1e6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default="16384", help="comma-separated rows (tokens)")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--densities", default="0.005", help="comma-separated fractions of active units")
    p.add_argument("--patterns", default="uniform", help="uniform, heavy_tailed (comma-separated)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--timing", choices=("device", "call"), default="device",
                   help="device: the host's launch time hidden (as inside a model); call: each "
                        "step from an idle device, host time included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity", type=int, default=0,
                   help="TwELL slots per (row, tile) (default 0: the backend's training default, tile / 16)")
    p.add_argument("--out", default="build/results", help="folder of op_train.json")
    return problem_args(p, p.parse_args(argv))


def problem_args(p, a):
    """--m, --densities and --patterns of `a` parsed into lists, and the problem's options checked
    (argparse's error otherwise); bench/op_infer.py shares them."""
    try:
        a.m = [int(v) for v in a.m.split(",") if v]
        a.densities = [float(v) for v in a.densities.split(",") if v]
    except ValueError:
        p.error("--m wants integers, --densities fractions, comma-separated")
    a.patterns = [v for v in a.patterns.split(",") if v]
    if not a.m or min(a.m) < 1 or a.k < 2 or a.n < 1:
        p.error("--m, --k and --n must be positive (--k at least 2: column 0 is the control)")
    if not a.densities or not all(0 < d < 1 for d in a.densities):
        p.error("--densities wants fractions in (0, 1)")
    bad = set(a.patterns) - {"uniform", "heavy_tailed"}
    if bad or not a.patterns:
        p.error(f"--patterns wants uniform and/or heavy_tailed, got {sorted(bad) or 'none'}")
    if a.reps < 3 or a.warmup < 0:
        p.error("--reps wants at least 3, --warmup at least 0")
    return a


class DenseMLP(torch.nn.Module):
    """The dense reference on the same weights: torch ops and autograd."""

    def __init__(self, sparse):
        super().__init__()
        self.gate, self.up, self.down = (sparse.gate_proj.weight, sparse.up_proj.weight,
                                         sparse.down_proj.weight)

    def forward(self, x):
        return F.linear(F.relu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)


def rates(gen, n, density, pattern, device, sigma=1.0):
    """Per-neuron firing rates: uniform, or lognormal with `sigma` (heavy_tailed), mean
    `density`."""
    if pattern == "uniform":
        return torch.full((n,), density, dtype=torch.float64, device=device)
    r = torch.empty(n, dtype=torch.float64, device=device).log_normal_(0.0, sigma, generator=gen)
    return (r * density / r.mean()).clamp(1e-5, 0.45)


def problem(a, m, density, pattern, device, dtype, sigma=1.0):
    """(sparse module, dense module, x, dy): the pattern made by x's column 0 and the gate's
    (heavy_tailed: lognormal rates of `sigma`)."""
    gen = torch.Generator(device=device).manual_seed(a.seed)
    mlp = tt.SparseGatedMLP(a.k, a.n, capacity=a.capacity, device=device, dtype=dtype)
    with torch.no_grad():
        for w, scale in ((mlp.gate_proj.weight, a.k), (mlp.up_proj.weight, a.k),
                         (mlp.down_proj.weight, a.n)):
            w.copy_(torch.randn(w.shape, generator=gen, device=device) / scale ** 0.5)
        gate = mlp.gate_proj.weight.double()
        spread = gate[:, 1:].norm(dim=1)
        inv = torch.special.ndtri(rates(gen, a.n, density, pattern, device, sigma))
        mlp.gate_proj.weight[:, 0] = (inv * spread).to(dtype)
    x = torch.randn(m, a.k, generator=gen, device=device).to(dtype)
    x[:, 0] = 1
    dy = (torch.randn(m, a.k, generator=gen, device=device) / a.k ** 0.5).to(dtype)
    return mlp, DenseMLP(mlp), x.requires_grad_(True), dy


def clear_grads(x, mlp):
    x.grad = None
    for p in mlp.parameters():
        p.grad = None


def step(mlp, x, dy):
    y = mlp(x)
    y.backward(dy)
    return y


def memory(mlp, module, x, dy):
    """(peak above the step's inputs, held between forward and backward) in bytes, one step."""
    clear_grads(x, mlp)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = module(x)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    y.backward(dy)
    del y
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, held


def agreement(mlp, dense, x, dy):
    out = {}
    for name, module in (("dense", dense), ("twell", mlp)):
        clear_grads(x, mlp)
        y = step(module, x, dy)
        out[name] = {"y": y.detach(), "dx": x.grad, "dgate": mlp.gate_proj.weight.grad,
                     "dup": mlp.up_proj.weight.grad, "ddown": mlp.down_proj.weight.grad}
    clear_grads(x, mlp)
    return {k: rel(out["twell"][k], out["dense"][k]) for k in out["dense"]}


def plan_fields(mlp, x):
    """The twell plan's view of the step: the saved form and capacity its dispatch asks for now
    (what the last steps saved), the bytes it saves and the scratch each form's step takes."""
    plan, _ = _ops._training_plan(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                                  mlp.tile, mlp.capacity, mlp.dispatch, mlp.dense_above, "op_train")
    m = x.shape[0]
    shape = plan.saved_shape(m)  # asked once: under automatic dispatch each ask polls
    return {"saved_form": "dense" if shape.backup_capacity == m else "compact",
            "saved_capacity": shape.capacity,
            "twell_saved_mb": shape.bytes(plan.saved_dtype()) / MB,
            "workspace_mb": {f"{form}_{call}": plan.workspace_bytes(
                m, getattr(twell.SavedForm, form), getattr(twell.TrainingCall, call)) / MB
                for form in ("compact", "dense") for call in ("forward", "backward")}}


def run_case(a, m, density, pattern, device, dtype):
    mlp, dense, x, dy = problem(a, m, density, pattern, device, dtype)
    ways = {"dense": dense, "twell": mlp}
    for _ in range(a.warmup):
        for module in ways.values():
            clear_grads(x, mlp)
            step(module, x, dy)
    timer = Timer(device, host_hidden=a.timing == "device")
    times = {w: [] for w in ways}
    for _ in range(a.reps):
        for w, module in ways.items():
            clear_grads(x, mlp)
            times[w].append(timer(lambda: step(module, x, dy)))
    peaks = {w: memory(mlp, module, x, dy) for w, module in ways.items()}
    diff = agreement(mlp, dense, x, dy)  # twell's step last: its l0, mean active units per token
    measured = float(mlp.l0) / a.n
    t = {w: summary(v) for w, v in times.items()}
    return {
        "suite": "op_train", "device": torch.cuda.get_device_name(device),
        "dtype": str(dtype).replace("torch.", ""),
        "M": m, "K": a.k, "N": a.n, "pattern": pattern, "density": measured, "reps": a.reps,
        "capacity": a.capacity or None,
        "dense_ms": t["dense"], "twell_ms": t["twell"], "timing": a.timing,
        "speedup": t["dense"]["median"] / t["twell"]["median"],
        "dense_peak_mb": peaks["dense"][0] / MB, "twell_peak_mb": peaks["twell"][0] / MB,
        "peak_ratio": peaks["twell"][0] / peaks["dense"][0],
        "dense_held_mb": peaks["dense"][1] / MB, "twell_held_mb": peaks["twell"][1] / MB,
        "rel_diff": diff, **plan_fields(mlp, x),
    }


def main(argv=None):
    a = parse_args(argv)
    if not (torch.cuda.is_available() and twell.cuda_compiled()):
        print("op_train bench: needs a CUDA device and twell built with CUDA (peak memory is the "
              "CUDA allocator's); nothing measured")
        return 0
    device = torch.device("cuda")
    rows = []
    for m in a.m:
        for pattern in a.patterns:
            for density in a.densities:
                row = run_case(a, m, density, pattern, device, torch.bfloat16)
                rows.append(row)
                print(f"M={m} {pattern} {row['density']:.2%}: dense {row['dense_ms']['median']:.3f} ms, "
                      f"twell {row['twell_ms']['median']:.3f} ms ({row['speedup']:.2f}x); peak "
                      f"{row['dense_peak_mb']:.0f} / {row['twell_peak_mb']:.0f} MB "
                      f"({row['peak_ratio']:.2f}x), held {row['dense_held_mb']:.0f} / "
                      f"{row['twell_held_mb']:.0f} MB, {row['saved_form']}; rel. diff "
                      + ", ".join(f"{k} {v:.1e}" for k, v in row["rel_diff"].items()), flush=True)
                torch.cuda.empty_cache()
    print(f"wrote {write_rows(a.out, 'op_train.json', rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
