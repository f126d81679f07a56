"""Where automatic dispatch stands against its own paths and torch's dense composition, M = 16384,
2048 x 5632 bf16, lognormal firing rates (bench/op_train.py's problem): inference (frozen and
unfrozen modules, auto / dense / sparse, the path auto ran) and a training step (auto / dense /
sparse). Medians of CUDA-event timings, the ways alternating. Development probe."""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, "bench")
import op_train  # noqa: E402
from timing import Timer  # noqa: E402


def main():
    small = "--small" in sys.argv  # a CPU check of the script itself
    a = argparse.Namespace(k=64 if small else 2048, n=256 if small else 5632, capacity=0, seed=0)
    dev = torch.device("cpu" if small else "cuda")
    dtype = torch.float32 if small else torch.bfloat16
    rows = 64 if small else 16384
    timer = Timer(dev)
    for sigma, density in ((1.0, 0.019), (1.0, 0.013), (1.8, 0.013), (1.8, 0.009)):
        mlp, dense, x, dy = op_train.problem(a, rows, density, "heavy_tailed", dev, dtype,
                                             sigma)
        x = x.detach()
        ways = {"torch": dense}
        for d in ("auto", "dense", "sparse"):
            for frozen in (True, False):
                w = type(mlp)(a.k, a.n, dispatch=d, device=dev, dtype=dtype)
                w.load_state_dict(mlp.state_dict())
                w.record_dispatch = True
                ways[f"{d}{'' if frozen else '-unfrozen'}"] = w.freeze() if frozen else w
        times = {k: [] for k in ways}
        with torch.no_grad():
            for _ in range(10):
                for w in ways.values():
                    w(x)
            for _ in range(20):
                for k, w in ways.items():
                    times[k].append(timer(lambda: w(x)))
        med = {k: statistics.median(v) for k, v in times.items()}
        ran = {k: getattr(w, "ran_dense", None) for k, w in ways.items() if k != "torch"}
        print(f"sigma {sigma} density {density} inference: " + ", ".join(
            f"{k} {v:.3f}" for k, v in med.items()) + f" | ran_dense {ran}", flush=True)
        # training: y = mlp(x); y.backward(dy)
        tways = {"torch": dense}
        for d in ("auto", "dense", "sparse"):
            w = type(mlp)(a.k, a.n, dispatch=d, device=dev, dtype=dtype)
            w.load_state_dict(mlp.state_dict())
            tways[d] = w
        xg = x.clone().requires_grad_()

        def step(w):
            xg.grad = None
            for p in list(w.parameters()) + list(mlp.parameters()):
                p.grad = None
            w(xg).backward(dy)

        ttimes = {k: [] for k in tways}
        for _ in range(8):
            for w in tways.values():
                step(w)
        for _ in range(15):
            for k, w in tways.items():
                ttimes[k].append(timer(lambda: step(w)))
        tmed = {k: statistics.median(v) for k, v in ttimes.items()}
        print(f"sigma {sigma} density {density} training:  " + ", ".join(
            f"{k} {v:.3f}" for k, v in tmed.items()), flush=True)
        del ways, tways, mlp, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
