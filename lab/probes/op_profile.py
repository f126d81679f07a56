"""Where a training step through the torch op goes, against torch's dense step (issue 54's
heavy-tailed training row; the op's rows against its C++ plan's). Development probe.

For each case (pattern, density, the module's dispatch): the twell module's step and the dense
module's (bench/op_train.py's problem: y = mlp(x); y.backward(dy)), timed both ways of
twell.torch._timing (the device's time alone, and each step from an idle device: host time
included), then one profiled step of each under torch.profiler: every CUDA kernel and copy with
its time, and the host time of the step.
    python3 lab/probes/op_profile.py [--m 16384] [--cases uniform:0.005:auto,heavy_tailed:0.013:auto,
                                      heavy_tailed:0.013:dense] [--top 14] [--small]
"""
import argparse
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
import op_train  # noqa: E402
from twell.torch._timing import time_ms  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--cases", default="uniform:0.005:auto,heavy_tailed:0.013:auto,"
                                      "heavy_tailed:0.013:dense")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--small", action="store_true", help="a CPU check of the script itself")
    a = p.parse_args()
    cuda = not a.small
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    a.k, a.n, a.seed, a.capacity = (2048, 5632, 0, 0) if cuda else (64, 256, 0, 0)
    m = a.m if cuda else 256
    for case in a.cases.split(","):
        pattern, density, dispatch = case.split(":")
        mlp, dense, x, dy = op_train.problem(a, m, float(density), pattern, device, dtype,
                                             sigma=1.8 if pattern == "heavy_tailed" else 1.0)
        mlp.dispatch = dispatch
        ways = {"dense": dense, "twell": mlp}

        def run(module):
            op_train.clear_grads(x, mlp)
            op_train.step(module, x, dy)

        for _ in range(8):
            for w in ways.values():
                run(w)
        times = {(w, hidden): [] for w in ways for hidden in (True, False)}
        for _ in range(a.reps):
            for (w, hidden), t in times.items():
                t.append(time_ms(lambda: run(ways[w]), cuda, host_hidden=hidden))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"== {pattern} {density} dispatch {dispatch}, M = {m}: density {float(mlp.l0) / a.n:.4f}; "
              f"device ms dense {med['dense', True]:.3f} twell {med['twell', True]:.3f} "
              f"({med['dense', True] / med['twell', True]:.3f}x); from idle dense "
              f"{med['dense', False]:.3f} twell {med['twell', False]:.3f} "
              f"({med['dense', False] / med['twell', False]:.3f}x)")
        for w, module in ways.items():
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                t0 = time.perf_counter()
                run(module)
                host = (time.perf_counter() - t0) * 1e3
                if cuda:
                    torch.cuda.synchronize()
            events = [e for e in prof.key_averages()
                      if (e.device_time_total if cuda else e.self_cpu_time_total) > 0]
            key = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
            events.sort(key=key, reverse=True)
            total = sum(key(e) for e in events) / 1e3
            print(f"-- {w}: host {host:.3f} ms to enqueue the step; {total:.3f} ms of kernels")
            for e in events[:a.top]:
                print(f"   {key(e) / 1e3:8.3f} ms  x{e.count:<3d} {e.key[:110]}")


if __name__ == "__main__":
    main()
