"""The host time of one eager FFN call, twell against torch's dense MLP (issue 54: eager
generate() is host-bound, ~0.8 ms of host work per layer and token, and twell's MLP costs it ~5%).
Development probe.

The device is kept busy behind a sleep kernel while `--calls` calls are enqueued, so the clock
sees the host's work alone (the launch queue holds them: calls x launches stays well under its
depth). Per M: torch's dense MLP (three nn.Linear, relu, mul), the frozen twell module with
dispatch auto / sparse / dense, and for auto the pieces under the module: run_ffn_eager and the
plan's _run_addresses with preallocated tensors. Medians of --reps.
    python3 lab/probes/host_cost.py [--m 1,16,128] [--calls 64] [--reps 25] [--small]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from twell.torch import SparseGatedMLP, _ops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import op_train  # noqa: E402


class DenseMLP(nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.gate_proj = nn.Linear(k, n, bias=False)
        self.up_proj = nn.Linear(k, n, bias=False)
        self.down_proj = nn.Linear(n, k, bias=False)

    def forward(self, x):
        return self.down_proj(F.relu(self.gate_proj(x)) * self.up_proj(x))


def host_us(fn, calls, reps, cuda):
    """Median host microseconds per call of fn, the device busy meanwhile."""
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # ~0.1 s of device work ahead of the calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        if cuda:
            torch.cuda.synchronize()
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="1,16,128")
    p.add_argument("--calls", type=int, default=64)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--density", type=float, default=0.005)
    p.add_argument("--small", action="store_true", help="a CPU check of the script itself")
    a = p.parse_args()
    cuda = not a.small
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    k, n = (2048, 5632) if cuda else (64, 256)
    # bench/op_train.py's problem: x's column 0 is 1 and the gate's column 0 a per-neuron
    # threshold, so each unit fires for --density of the tokens
    a.k, a.n, a.seed, a.capacity = k, n, 0, 0
    source = op_train.problem(a, 1, a.density, "uniform", device, dtype)[0]
    dense = DenseMLP(k, n).to(device, dtype).eval()
    dense.load_state_dict(source.state_dict())
    twells = {}
    for dispatch in ("auto", "sparse", "dense"):
        m = SparseGatedMLP(k, n, dispatch=dispatch).to(device, dtype).eval()
        m.load_state_dict(source.state_dict())
        twells[dispatch] = m.freeze()
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, K = {k}, N = {n}, "
          f"{a.calls} calls behind a busy device, medians of {a.reps}")
    with torch.no_grad():
        for rows in [int(r) for r in a.m.split(",")]:
            x = torch.randn(1, rows, k, device=device, dtype=dtype)
            x[..., 0] = 1
            for _ in range(20):  # plans made, trials run, cuBLAS heuristics chosen
                dense(x)
                for mod in twells.values():
                    mod(x)
            if cuda:
                torch.cuda.synchronize()
            row = {"dense MLP": host_us(lambda: dense(x), a.calls, a.reps, cuda)}
            for dispatch, mod in twells.items():
                row[f"twell {dispatch}"] = host_us(lambda: mod(x), a.calls, a.reps, cuda)
            auto = twells["auto"]
            x2 = x.reshape(-1, k)
            plan = auto._eager_plan(auto.gate_proj.weight, auto.up_proj.weight, auto.down_nk, True)
            row["run_ffn_eager"] = host_us(lambda: _ops.run_ffn_eager(plan, x2), a.calls, a.reps, cuda)
            y = torch.empty_like(x2)
            counters = torch.empty(2, dtype=torch.int64, device=device)
            nbytes = plan.workspace_bytes_for(rows) if cuda else 0
            ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            stream = torch.cuda.current_stream().cuda_stream if cuda else 0
            row["_run_addresses"] = host_us(
                lambda: plan._run_addresses(x2.data_ptr(), y.data_ptr(), rows, counters.data_ptr(),
                                            ws.data_ptr() if cuda else 0, nbytes, stream),
                a.calls, a.reps, cuda)
            row["new_empty x3"] = host_us(
                lambda: (x2.new_empty(x2.shape), x2.new_empty(2, dtype=torch.int64),
                         x2.new_empty(max(nbytes, 1), dtype=torch.uint8)), a.calls, a.reps, cuda)
            ran = plan.last_run().ran_dense
            print(f"M = {rows}, density {float(auto.l0) / n:.4f}: auto ran "
                  f"{'dense' if ran else 'sparse'}; host us per call: "
                  + ", ".join(f"{name} {us:.1f}" for name, us in row.items()))


if __name__ == "__main__":
    main()
