"""Where an eager generate() of bench/model.py's model spends its host time, dense against twell: a
diagnostic, not a harness row. Builds the model as bench/model.py does (same arguments), then
alternates one eager generate() (static cache) of each model --reps times, with Python's garbage
collector on and then off. Per generate it prints the wall time, the host time inside the MLP
modules (forward pre- and post-hooks, perf_counter) and the rest, per token.
    python3 lab/probes/eager_generate_host.py [bench/model.py arguments] [--gen-batch B] [--reps R]
        [--reuse workspace|all]
--shadow: two more ways, "wrap" (the model's own MLP behind a one-line wrapper module) and "shadow"
(the same wrapper calling the layer's twell module first, its output dropped): whether a twell call
makes the rest of the step slower than its own host time accounts for (shadow's rest against
wrap's).
--reuse: twell's eager calls take their workspace (or workspace, y and counters) from buffers kept
per row count instead of three allocations per call (a probe of the allocator's share; y reused
is safe here only because each layer's output is consumed before the next layer's MLP runs).
"""
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import model as mb  # noqa: E402
import model_generate  # noqa: E402


def take(argv, name, default):
    if name in argv:
        i = argv.index(name)
        value = argv[i + 1]
        del argv[i:i + 2]
        return int(value)
    return default


class MlpClock:
    """Host seconds spent inside the model's MLP modules (whichever are in place)."""

    def __init__(self, model):
        self.model, self.handles, self.inside, self.start = model, [], 0.0, 0.0

    def __enter__(self):
        for block in self.model.model.layers:
            self.handles.append(block.mlp.register_forward_pre_hook(self._pre))
            self.handles.append(block.mlp.register_forward_hook(self._post))
        return self

    def _pre(self, module, inputs):
        self.start = time.perf_counter()

    def _post(self, module, inputs, output):
        self.inside += time.perf_counter() - self.start

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


class Wrap(torch.nn.Module):
    """The model's own MLP, and first (shadow) its twell twin, whose output is dropped."""

    def __init__(self, dense, twin=None):
        super().__init__()
        self.dense, self.twin = dense, twin

    def forward(self, x):
        if self.twin is not None:
            self.twin(x)
        return self.dense(x)


def add_shadow_ways(swap):
    """swap.use("wrap") / swap.use("shadow") put the wrappers in place."""
    from twell.torch.patch import _set

    twins = dict(swap.sparse)
    ways = {"wrap": [(n, Wrap(m)) for n, m in swap.dense],
            "shadow": [(n, Wrap(m, twins[n])) for n, m in swap.dense]}
    use = swap.use

    def use_any(which):
        if which in ways:
            for name, module in ways[which]:
                _set(swap.model, name, module)
        else:
            use(which)

    swap.use = use_any


def reuse_buffers(what):
    """Replaces the modules' eager run by one that keeps its buffers per (rows, plan workspace)."""
    from twell.torch import _ops, _plans

    kept = {}

    def run(plan, x):
        rows = x.shape[0]
        nbytes = plan.workspace_bytes_for(rows)
        key = (rows, x.shape[1], nbytes)
        if key not in kept:
            kept[key] = (x.new_empty(x.shape), x.new_empty(2, dtype=torch.int64),
                         x.new_empty(max(nbytes, 1), dtype=torch.uint8))
        y, counters, ws = kept[key]
        if what != "all":
            y, counters = x.new_empty(x.shape), x.new_empty(2, dtype=torch.int64)
        plan._run_addresses(x.data_ptr(), y.data_ptr(), rows, counters.data_ptr(), ws.data_ptr(), nbytes,
                            _plans.stream_of(x.device))
        return y, counters

    _ops.run_ffn_eager = run


def main(argv):
    argv = list(argv)
    if "--reuse" in argv:
        i = argv.index("--reuse")
        reuse_buffers(argv[i + 1])
        del argv[i:i + 2]
    shadow = "--shadow" in argv
    if shadow:
        argv.remove("--shadow")
    batch = take(argv, "--gen-batch", 1)
    reps = take(argv, "--reps", 5)
    args = mb.parse_args(argv + ["--modes", "generate", "--no-write"])
    env, model, ids, swap = mb.frozen_setup(args)
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    prompt = model_generate.prompts(ids, batch, args.prompt_len)
    step = model_generate.Generate(model, prompt, args.new_tokens, "static")
    names = ("dense", "twell")
    if shadow:
        add_shadow_ways(swap)
        names += ("wrap", "shadow")
    for which in names:
        swap.use(which)
        step(which)  # warm
    for collector in ("gc on", "gc off"):
        if collector == "gc off":
            gc.collect()
            gc.disable()
        got = {name: [] for name in names}
        for _ in range(reps):
            for which in names:
                swap.use(which)
                sync()
                with MlpClock(model) as clock:
                    start = time.perf_counter()
                    step(which)
                    sync()
                    wall = time.perf_counter() - start
                got[which].append((wall, clock.inside))
        gc.enable()
        for which, runs in got.items():
            wall = statistics.median(w for w, _ in runs) / args.new_tokens * 1e3
            mlp = statistics.median(m for _, m in runs) / args.new_tokens * 1e3
            print(f"{collector}, {which}, batch {batch}: {wall:.2f} ms per token wall, MLP modules "
                  f"{mlp:.2f} ms ({mlp / args.layers * 1e3:.1f} us per layer), rest {wall - mlp:.2f} ms",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
