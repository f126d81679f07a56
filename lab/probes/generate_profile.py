"""Where one generate() of bench/model.py's model spends its time, dense against twell: a
diagnostic (torch.profiler), not a harness row. Builds the model as bench/model.py does (same
arguments, e.g. --layers 38 --densities 0.005), one warm generate of each, then a profiled one
of each; prints the top CUDA and CPU self-time operators, the per-token wall time and the GPU's
busy time (the sum of its kernels' and copies' times): busy far below wall means generate() is
bound by the host, where a faster FFN cannot show.
    python3 lab/probes/generate_profile.py [bench/model.py arguments] [--gen-batch B]
"""
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import model as mb  # noqa: E402
import model_generate  # noqa: E402


def gpu_busy(prof):
    """(microseconds, count) of the device activities (kernels, copies, memsets) of a profile."""
    total, count = 0.0, 0
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            total += e.time_range.elapsed_us()
            count += 1
    return total, count


def main(argv):
    batch = 1
    if "--gen-batch" in argv:
        i = argv.index("--gen-batch")
        batch = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    args = mb.parse_args(argv + ["--modes", "generate", "--no-write"])
    env, model, ids, swap = mb.frozen_setup(args)
    prompt = model_generate.prompts(ids, batch, args.prompt_len)
    step = model_generate.Generate(model, prompt, args.new_tokens, args.gen_cache)
    for which in ("dense", "twell"):
        swap.use(which)
        step(which)  # warm
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(which)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(which)
            torch.cuda.synchronize()
        print(f"=== {which}: batch {batch}, {args.new_tokens} new tokens, {wall * 1e3:.1f} ms "
              f"({wall / args.new_tokens * 1e3:.2f} ms per token)", flush=True)
        ka = prof.key_averages()
        busy, kernels = gpu_busy(prof)
        print(f"    GPU busy {busy / 1e3:.1f} ms of {wall * 1e3:.1f} ms wall ({busy / 1e3 / wall / 1e3:.0%}), "
              f"{kernels} kernels, {busy / 1e3 / args.new_tokens:.3f} ms busy per token", flush=True)
        print(ka.table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
        print(ka.table(sort_by="self_cpu_time_total", row_limit=24, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
