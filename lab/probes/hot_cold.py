"""Hot / cold split of a ReLU FFN's units, measured (a lab probe, not a harness).

A trained model's neuron firing rates spread over orders of magnitude: on the shipped recipe the
10% most active units carry 56-84% of a layer's active (token, unit) pairs (lab/runs/h200/
hot-share). An FFN is a sum over its units, so it splits exactly into the H most active units,
run dense (three cuBLAS GEMMs over H units: no gathers, tensor cores) and the rest, run by twell's
sparse path at a fraction of the density:

  y = twell_ffn(x; Wg[cold], Wu[cold], Wd[:, cold]) + (relu(x Wg[hot]^T) * x Wu[hot]^T) Wd[:, hot]^T

This probe builds activations with log-normal firing rates (a mean density and the share the top
10% of units carry, both chosen), picks the hot units from a calibration batch, and times dense,
twell and the split at several H: an inference forward, and a training step (forward + backward)
through autograd, median of CUDA-event timings (CPU: wall clock), with each output's error against
an fp32 computation of the same FFN.

  python3 lab/probes/hot_cold.py [--m 16384 --k 2048 --n 5632] [--density 0.009] [--top10 0.7]
                                 [--hot 256,512,768,1024] [--reps 20] [--no-train]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

import twell.torch  # noqa: F401  (registers torch.ops.twell)


def rates_for(n, density, top10, generator):
    """N firing rates, log-normal, mean `density`, the top 10% carrying ~`top10` of the sum."""
    z = torch.randn(n, generator=generator, dtype=torch.float64)
    lo, hi = 0.0, 6.0
    for _ in range(50):  # the spread whose top-10% share is top10
        sigma = (lo + hi) / 2
        r = torch.exp(sigma * z)
        r = (r / r.mean() * density).clamp(max=0.5)
        share = r.sort(descending=True).values[: math.ceil(0.1 * n)].sum() / r.sum()
        lo, hi = (sigma, hi) if share < top10 else (lo, sigma)
    return r


def problem(m, k, n, density, top10, dtype, device, seed=0):
    """x (calibration and measured batches) and weights whose gate fires unit j with rate r_j:
    x's column 0 is 1, the rest N(0, 1); W1[j] = [b_j, v_j] with v_j ~ N(0, 1/K) and
    b_j = |v_j| Phi^-1(r_j)."""
    g = torch.Generator().manual_seed(seed)
    r = rates_for(n, density, top10, g)
    v = torch.randn(n, k - 1, generator=g, dtype=torch.float64) / math.sqrt(k)
    normal = torch.distributions.Normal(0.0, 1.0)
    b = v.norm(dim=1) * normal.icdf(r.clamp(1e-6, 1 - 1e-6))
    gate = torch.cat([b[:, None], v], 1)
    up = torch.randn(n, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    down = torch.randn(k, n, generator=g, dtype=torch.float64) / math.sqrt(n)

    def batch():
        x = torch.randn(m, k, generator=g, dtype=torch.float64)
        x[:, 0] = 1
        return x.to(dtype).to(device)

    w = [t.to(dtype).to(device) for t in (gate, up, down)]
    return batch(), batch(), w


def dense_ffn(x, gate, up, down):
    return F.linear(F.relu(F.linear(x, gate)) * F.linear(x, up), down)


def timer(device):
    if device.type == "cuda":
        def run(f, reps):
            out = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                f()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b))
            return statistics.median(out)
    else:
        def run(f, reps):
            out = []
            for _ in range(reps):
                t = time.perf_counter()
                f()
                out.append(1e3 * (time.perf_counter() - t))
            return statistics.median(out)
    return run


def main():
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--density", type=float, default=0.009)
    p.add_argument("--top10", type=float, default=0.7)
    p.add_argument("--hot", default="256,512,768,1024")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    calib, x, (gate, up, down) = problem(a.m, a.k, a.n, a.density, a.top10, dtype, device)
    time_ms = timer(device)

    with torch.no_grad():
        hits = (F.linear(calib, gate) > 0).sum(0)
        mask = F.linear(x, gate) > 0
        density = mask.float().mean().item()
        rate = mask.float().sum(0)
        order = hits.argsort(descending=True)
        ref = dense_ffn(*(t.float() for t in (x, gate, up, down)))

    def err(y):
        return ((y.float() - ref).norm() / ref.norm()).item()

    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'} {dtype} M {a.m} "
          f"K {a.k} N {a.n}: density {100 * density:.3f}%, the calibration's top 10% carry "
          f"{rate[order[: math.ceil(0.1 * a.n)]].sum().item() / rate.sum().item():.3f} of the "
          f"pairs; ms are medians of {a.reps}")

    down_nk = down.t().contiguous()

    def twell_ffn(xx, g, u, d_nk):
        return torch.ops.twell.ffn(xx, g, u, d_nk, 0, 0, "auto", -1.0)[0]

    cases = {"dense": lambda: dense_ffn(x, gate, up, down),
             "twell": lambda: twell_ffn(x, gate, up, down_nk)}
    parts = {}
    for h in (int(s) for s in a.hot.split(",") if s):
        hot, cold = order[:h].sort().values, order[h:].sort().values
        w = {"gc": gate[cold].contiguous(), "uc": up[cold].contiguous(),
             "dc": down_nk[cold].contiguous(), "gh": gate[hot].contiguous(),
             "uh": up[hot].contiguous(), "dh": down[:, hot].contiguous(),
             "dc_kn": down[:, cold].contiguous()}
        parts[h] = (w, rate[hot].sum().item() / rate.sum().item())
        cases[f"split H={h}"] = (lambda w=w: twell_ffn(x, w["gc"], w["uc"], w["dc"])
                                 + dense_ffn(x, w["gh"], w["uh"], w["dh"]))
    with torch.no_grad():
        for name, f in cases.items():
            y = f()
            for _ in range(a.warmup):
                f()
            ms = time_ms(f, a.reps)
            extra = ""
            if name.startswith("split"):
                extra = f"  hot units carry {parts[int(name.split('=')[1])][1]:.3f}"
            print(f"inference {name:<14} {ms:8.4f} ms  error {err(y):.2e}{extra}")
    if a.no_train:
        return

    dy = torch.randn_like(x)

    def train_step(fwd, params):
        xx = x.detach().requires_grad_()
        y = fwd(xx)
        return torch.autograd.grad(y, [xx, *params], dy)

    def twell_train(xx, g, u, d):
        return torch.ops.twell.ffn_train(xx, g, u, d, 0, 0, "auto", -1.0)[0]

    leaf = {n: t.detach().requires_grad_() for n, t in (("g", gate), ("u", up), ("d", down))}
    steps = {"dense": (lambda xx: dense_ffn(xx, leaf["g"], leaf["u"], leaf["d"]), list(leaf.values())),
             "twell": (lambda xx: twell_train(xx, leaf["g"], leaf["u"], leaf["d"]), list(leaf.values()))}
    for h, (w, _) in parts.items():
        lw = {n: w[n].detach().requires_grad_() for n in ("gc", "uc", "dc_kn", "gh", "uh", "dh")}
        steps[f"split H={h}"] = (
            lambda xx, lw=lw: twell_train(xx, lw["gc"], lw["uc"], lw["dc_kn"])
            + dense_ffn(xx, lw["gh"], lw["uh"], lw["dh"]), list(lw.values()))
    base = None
    for name, (fwd, params) in steps.items():
        grads = train_step(fwd, params)
        for _ in range(a.warmup):
            train_step(fwd, params)
        ms = time_ms(lambda: train_step(fwd, params), a.reps)
        dx = grads[0].float()
        base = dx if base is None else base
        print(f"training  {name:<14} {ms:8.4f} ms  dx vs dense {((dx - base).norm() / base.norm()).item():.2e}")


if __name__ == "__main__":
    main()
