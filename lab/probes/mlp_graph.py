"""GPU time of the FFN inside a CUDA graph at decode sizes, twell against the model's own MLP, on
the 2B model of bench/model.py (calibrated gates): a diagnostic, not a harness row.

One graph holds one MLP call of each of the first L layers in turn (cold weights, as in a decoding
step), captured three ways: torch.cuda.graph around the modules (eager calls), the modules under
torch.compile(mode="reduce-overhead") (what generate()'s compiled cache does), and for twell the
op alone (torch.ops.twell.ffn) in torch.cuda.graph. Prints microseconds per layer (median of the
replays), whether twell's captured calls ran dense, and the kernels of one replay (torch.profiler).
    python3 lab/probes/mlp_graph.py [--layers 16] [--m 1,16] [--replays 30]
"""
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import model as mb  # noqa: E402


def arg(argv, name, default):
    return argv[argv.index(name) + 1] if name in argv else default


def replay_us(graph, replays, layers):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / layers)
    return statistics.median(times)


def capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def kernels(graph, title):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    print(f"-- kernels of one replay: {title}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


def main(argv):
    layers = int(arg(argv, "--layers", "16"))
    ms = [int(v) for v in arg(argv, "--m", "1,16").split(",")]
    replays = int(arg(argv, "--replays", "30"))
    args = mb.parse_args(["--layers", str(layers), "--densities", "0.005", "--no-write", "--modes", "generate"])
    env, model, ids, densities = mb.setup(args)
    swap = mb.set_density(args, model, None, densities[0], ids[:2])
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    blocks = model.model.layers
    for m in ms:
        with torch.no_grad():
            x = blocks[0].post_attention_layernorm(model.model.embed_tokens(ids[:1, :m]))[0]
            results = {}
            for which in ("dense", "twell"):
                swap.use(which)
                mlps = [b.mlp for b in blocks]
                for mlp in mlps:
                    mlp.record_dispatch = True
                for _ in range(40):  # dispatch's trials settle in eager calls first
                    for mlp in mlps:
                        mlp(x)
                graph = capture(lambda: [mlp(x) for mlp in mlps])
                results[f"{which} eager-captured"] = replay_us(graph, replays, layers)
                if which == "twell":
                    dense = [mlp.ran_dense for mlp in mlps]
                    print(f"M={m}: twell's captured calls ran dense in {sum(bool(d) for d in dense)} of "
                          f"{len(dense)} layers", flush=True)
                kernels(graph, f"{which} M={m}, torch.cuda.graph around the modules")
                if which == "twell":
                    ops = [(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_nk) for mlp in mlps]
                    op = lambda: [torch.ops.twell.ffn(x, g, u, d, 0, 0, "auto", -1.0) for g, u, d in ops]
                    results["twell op-captured"] = replay_us(capture(op), replays, layers)
                compiled = torch.compile(lambda v: tuple(mlp(v) for mlp in mlps), mode="reduce-overhead",
                                         fullgraph=True)
                step = lambda: compiled(x)
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                times = []
                for _ in range(replays):
                    start.record()
                    step()
                    stop.record()
                    stop.synchronize()
                    times.append(start.elapsed_time(stop) * 1e3 / layers)
                results[f"{which} compiled"] = statistics.median(times)
                torch._dynamo.reset()
            for name, us in results.items():
                print(f"M={m}: {name}: {us:.1f} us per layer", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
