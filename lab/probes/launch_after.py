"""Host time of plain torch kernel launches right after one eager FFN call, twell's against the
dense MLP's (bench/model.py's model, first layer): a diagnostic, not a harness row. Eager
generate() spends more host time outside the MLPs with twell's modules in place; this asks whether
the launches that follow a twell call cost more. Per iteration: one MLP call (or none), then
--ops small in-place adds; prints the adds' host microseconds per launch (median over the
iterations). Run it with TWELL_NO_PDL=1 to take programmatic dependent launch out; --small mm
times a q_proj-sized matmul (cuBLAS through torch) instead of the adds; --dispatch picks twell's path.
    python3 lab/probes/launch_after.py [--m 1] [--ops 30] [--iters 300] [--small add|mm]
        [--dispatch auto|sparse|dense]
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import model as mb  # noqa: E402


def arg(argv, name, default):
    return int(argv[argv.index(name) + 1]) if name in argv else default


def adds_us(call, small, ops, iters):
    """Median host microseconds per small launch (small(): one op) after call()."""
    per = []
    for i in range(iters + 20):
        call()
        start = time.perf_counter()
        for _ in range(ops):
            small()
        t = (time.perf_counter() - start) / ops * 1e6
        if i >= 20:
            per.append(t)
        if i % 50 == 0:
            torch.cuda.synchronize()  # the GPU keeps up; no launch queue builds
    torch.cuda.synchronize()
    return statistics.median(per)


def main(argv):
    m, ops, iters = arg(argv, "--m", 1), arg(argv, "--ops", 30), arg(argv, "--iters", 300)
    kind = argv[argv.index("--small") + 1] if "--small" in argv else "add"
    dispatch = argv[argv.index("--dispatch") + 1] if "--dispatch" in argv else "auto"
    args = mb.parse_args(["--layers", "2", "--densities", "0.005", "--no-write", "--dispatch", dispatch])
    env, model, ids, swap = mb.frozen_setup(args)
    if kind == "mm":
        a = torch.randn(m, args.hidden, device="cuda", dtype=env.dtype)
        w = torch.randn(args.hidden, args.hidden, device="cuda", dtype=env.dtype)
        small = lambda: torch.nn.functional.linear(a, w)  # noqa: E731
    else:
        t = torch.zeros(64, device="cuda")
        small = lambda: t.add_(1.0)  # noqa: E731
    with torch.no_grad():
        x = model.model.layers[0].post_attention_layernorm(model.model.embed_tokens(ids[:1, :m]))
        print(f"M={m} {kind} dispatch {dispatch} TWELL_NO_PDL={os.environ.get('TWELL_NO_PDL', '')}: no call before: "
              f"{adds_us(lambda: None, small, ops, iters):.2f} us per launch", flush=True)
        for rnd in range(2):
            for which in ("dense", "twell"):
                swap.use(which)
                mlp = model.model.layers[0].mlp
                for _ in range(20):
                    mlp(x)
                print(f"M={m} {kind} dispatch {dispatch} round {rnd}: after a {which} MLP call: "
                      f"{adds_us(lambda: mlp(x), small, ops, iters):.2f} us per launch", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
