"""The torch op against the C++ plan it runs, graph-replayed at decoding sizes: harness rows.

bench/model.py's model (its shape and arguments, --layers 8 unless given; the gates calibrated to
the first of --densities). For each M of --m, each layer's input is its own MLP input in one
forward of the model over the first M input tokens, and one CUDA graph per way holds one call of
each layer's FFN in turn (each layer its own weights, cold in L2: a decoding step's FFNs):
  dense  the model's own MLP (cuBLAS GEMMs and an elementwise kernel)
  plan   twell.InferencePlan._run_addresses: the C++ plan of each layer's twell module, no torch op
  op     torch.ops.twell.ffn (what twell's modules and compiled graphs call)
Each way first runs eagerly until dispatch has settled, then is captured once. A sample replays one
graph after an L2 flush and is timed by CUDA events; the ways alternate sample by sample. Rows
(suite "op"): device, M, K, N, layers, dtype, density (measured), dense / plan / op microseconds
per layer (median, p20, p80), op_minus_plan_us (the op's cost over the plan, medians), speedup
(dense over op), and how many layers each twell way captured on its dense path.

    python3 bench/op_graph.py [--m 1,16] [--layers 8] [--reps 30] [--out DIR] [model.py arguments]
"""
import argparse
import os
import sys

import torch

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # model, beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as mb  # noqa: E402
from timing import Timer, summary, write_rows  # noqa: E402

from twell.torch import _plans  # noqa: E402

WAYS = ("dense", "plan", "op")
FLUSH_BYTES = 256 << 20  # past the H200's 60 MB of L2


def options(argv):
    """(m list, reps, model.py's args): --m is this script's own; model.py's parser takes the rest,
    with this script's defaults (8 layers, 30 reps)."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--m", type=mb.positive_ints, default=[1, 16])
    mine, rest = own.parse_known_args(argv)
    args = mb.parse_args(rest, layers=8, reps=30)
    if args.reps < 3:
        sys.exit("op bench: --reps at least 3")
    return mine.m, args.reps, args


def capture(fn):
    """A CUDA graph of fn(), after three eager runs on a side stream (allocator warm-up)."""
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


def layer_inputs(model, tokens):
    """[each layer's MLP input, [M, K]]: one forward of the model (its own MLPs) over `tokens`."""
    xs, hooks = [], []
    for block in model.model.layers:
        hooks.append(block.mlp.register_forward_pre_hook(
            lambda module, inputs: xs.append(inputs[0].reshape(-1, inputs[0].shape[-1]).clone())))
    try:
        with torch.no_grad():
            model(tokens.unsqueeze(0))
    finally:
        for h in hooks:
            h.remove()
    return xs


def plan_calls(mlps, xs):
    """fn() running each layer's C++ plan on its input by address (y, counters and workspace made
    once), and the plans, for their last decision."""
    calls = []
    for mlp, x in zip(mlps, xs):
        gate, up = mlp._weights()
        plan = _plans.inference_plan(gate, up, mlp.down_nk, mlp.tile, mlp.capacity, mlp.dispatch,
                                     mlp.dense_above)
        nbytes = plan.workspace_bytes_for(x.shape[0])
        bufs = (x.new_empty(x.shape), x.new_empty(2, dtype=torch.int64),
                x.new_empty(max(nbytes, 1), dtype=torch.uint8))
        calls.append((plan, x, bufs, nbytes))

    def run():
        stream = torch.cuda.current_stream().cuda_stream
        for plan, x, (y, counters, ws), nbytes in calls:
            plan._run_addresses(x.data_ptr(), y.data_ptr(), x.shape[0], counters.data_ptr(),
                                ws.data_ptr(), nbytes, stream)
    return run, [c[0] for c in calls]


def op_calls(mlps, xs):
    args = []
    for mlp, x in zip(mlps, xs):
        gate, up = mlp._weights()
        args.append((x, gate, up, mlp.down_nk, mlp.tile, mlp.capacity, mlp.dispatch, mlp.dense_above))
    return lambda: [torch.ops.twell.ffn(*a) for a in args]


def measure(graphs, reps, layers):
    """{way: [microseconds per layer]}: the graphs' replays, alternating, each after an L2 flush."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    timer = Timer(flush.device)
    times = {w: [] for w in graphs}
    for _ in range(reps):
        for way, graph in graphs.items():
            flush.zero_()
            times[way].append(timer(graph.replay) * 1e3 / layers)
    return times


def run_m(swap, model, ids, m, reps):
    """The row of M rows: each layer's input is its own MLP input in a forward of the model (its
    own MLPs) over the first M input tokens."""
    tokens = ids.reshape(-1)[:m]
    if tokens.numel() < m:
        sys.exit(f"op bench: --m {m} is more than the {tokens.numel()} input tokens (--batch x --seq)")
    swap.use("dense")
    xs = layer_inputs(model, tokens)
    blocks = model.model.layers
    with torch.no_grad():
        graphs = {}
        dense = [b.mlp for b in blocks]
        graphs["dense"] = capture(lambda: [mlp(x) for mlp, x in zip(dense, xs)])
        swap.use("twell")
        mlps = [b.mlp for b in blocks]
        for _ in range(40):  # dispatch's trials settle in eager calls first
            for mlp, x in zip(mlps, xs):
                mlp(x)
        l0 = [float(mlp.l0) for mlp in mlps]
        run_plans, plans = plan_calls(mlps, xs)
        graphs["plan"] = capture(run_plans)
        plan_dense = sum(bool(p.last_run().ran_dense) for p in plans)
        graphs["op"] = capture(op_calls(mlps, xs))
        op_dense = sum(bool(p.last_run().ran_dense) for p in plans)
        times = measure(graphs, reps, len(blocks))
    s = {w: summary(times[w]) for w in WAYS}
    return {"rows": m, "l0": l0, "times": s, "plan_dense_layers": plan_dense, "op_dense_layers": op_dense}


def make_row(args, env, reps, result):
    s = result["times"]
    return {
        "suite": "op", "device": env.name, "dtype": str(env.dtype).replace("torch.", ""),
        "M": result["rows"], "K": args.hidden, "N": args.intermediate, "layers": args.layers,
        "density": sum(result["l0"]) / len(result["l0"]) / args.intermediate,
        "reps": reps,
        "dense_us": s["dense"], "plan_us": s["plan"], "op_us": s["op"],
        "op_minus_plan_us": s["op"]["median"] - s["plan"]["median"],
        "speedup": s["dense"]["median"] / s["op"]["median"],
        "plan_dense_layers": result["plan_dense_layers"], "op_dense_layers": result["op_dense_layers"],
    }


def main(argv=None):
    ms, reps, args = options(sys.argv[1:] if argv is None else argv)
    env, model, ids, swap = mb.frozen_setup(args)
    if env.device.type != "cuda":
        print("op bench: needs a CUDA device (graph replays); nothing to do", flush=True)
        return 0
    rows = []
    for m in ms:
        rows.append(make_row(args, env, reps, run_m(swap, model, ids, m, reps)))
        r = rows[-1]
        print(f"op M={r['M']:<4} K={r['K']} N={r['N']} density {r['density']:.3%}: dense "
              f"{r['dense_us']['median']:.1f} us, plan {r['plan_us']['median']:.1f} us, op "
              f"{r['op_us']['median']:.1f} us per layer; op - plan {r['op_minus_plan_us']:+.2f} us, "
              f"{r['speedup']:.2f}x; dense-path layers plan {r['plan_dense_layers']} op "
              f"{r['op_dense_layers']} of {r['layers']}", flush=True)
    if args.out and not args.no_write:
        write_rows(args.out, "op.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
