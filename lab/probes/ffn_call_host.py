"""Host and GPU time of one eager FFN call at decode sizes, twell against the dense MLP, on the
2B model's first layer (bench/model.py's build and calibration): a diagnostic, not a harness row.
Prints per-call microseconds: enqueue (host, no sync) and end to end (synchronised every call),
and the CUDA runtime calls one twell call makes (torch.profiler).
    python3 lab/probes/ffn_call_host.py [--m 16] [--calls 200]
"""
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import model as mb  # noqa: E402


def per_call(fn, calls, sync_each):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    return host / calls * 1e6, total / calls * 1e6


def main(argv):
    m = int(argv[argv.index("--m") + 1]) if "--m" in argv else 16
    calls = int(argv[argv.index("--calls") + 1]) if "--calls" in argv else 200
    args = mb.parse_args(["--layers", "2", "--densities", "0.005", "--no-write", "--modes", "generate"])
    env, model, ids, swap = mb.frozen_setup(args)
    with torch.no_grad():
        x = model.model.layers[0].post_attention_layernorm(model.model.embed_tokens(ids[:1, :m]))
    for which in ("dense", "twell"):
        swap.use(which)
        mlp = model.model.layers[0].mlp
        with torch.no_grad():
            for _ in range(20):
                mlp(x)
            enq, _ = per_call(lambda: mlp(x), calls, False)
            _, e2e = per_call(lambda: mlp(x), calls, True)
            print(f"{which} M={m}: {type(mlp).__name__}: enqueue {enq:.1f} us/call, synchronised {e2e:.1f} us/call",
                  flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    mlp(x)
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
