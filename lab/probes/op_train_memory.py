"""What one FFN training step through the torch op holds at its peak (a diagnostic, not a harness row).

bench/op_train.py's problem (M = 16384, K = 2048, N = 5632, bf16, uniform 0.5% unless given), the
twell module's dispatch forced (--dispatch sparse: the compact form). After warm-up steps, one
step runs under torch.cuda.memory._record_memory_history; the allocator's trace is replayed to
find the peak (above the step's inputs), and the blocks live there are listed largest first with
the Python line that allocated each.

    python3 lab/probes/op_train_memory.py [--m 16384] [--density 0.005] [--dispatch sparse]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import op_train as ot  # noqa: E402


def where(frames):
    """The innermost frame in a .py file outside torch's own autograd plumbing."""
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and "/torch/" not in name:
            return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    for f in frames:
        if f.get("filename", "").endswith(".py"):
            return f"{os.path.basename(f['filename'])}:{f.get('line')} {f.get('name')}"
    return "(C++)"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--density", type=float, default=0.005)
    p.add_argument("--dispatch", default="sparse")
    a = p.parse_args()
    args = ot.parse_args(["--m", str(a.m)])
    mlp, dense, x, dy = ot.problem(args, a.m, a.density, "uniform", torch.device("cuda"), torch.bfloat16)
    mlp.dispatch = a.dispatch
    for name, module in (("dense", dense), ("twell", mlp)):
        for _ in range(4):
            ot.clear_grads(x, mlp)
            ot.step(module, x, dy)
        ot.clear_grads(x, mlp)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=100000)
        ot.step(module, x, dy)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        live, now, best, at_peak = {}, 0, -1, {}
        for e in snap["device_traces"][0]:
            if e["action"] == "alloc":
                live[e["addr"]] = (e["size"], where(e.get("frames", [])))
                now += e["size"]
                if now > best:
                    best, at_peak = now, dict(live)
            elif e["action"] == "free_completed" and e["addr"] in live:
                now -= live.pop(e["addr"])[0]
        print(f"{name}: peak {best / 1e6:.1f} MB above the inputs ({base / 1e6:.0f} MB before the step)")
        for size, site in sorted(at_peak.values(), key=lambda v: -v[0]):
            if size >= 1 << 20:
                print(f"  {size / 1e6:8.1f} MB  {site}")


if __name__ == "__main__":
    main()
