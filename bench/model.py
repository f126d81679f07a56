#!/usr/bin/env python3
"""twell model benchmark: a Hugging Face Llama whose MLPs run on twell against the same model
with its own MLPs (dense, cuBLAS through PyTorch): prefill and training-step time (and, asked
for, generate() time), tokens/s, peak memory and agreement, written as harness rows (suite
"model") to DIR/model.json.

The model is the paper's shape (hidden 2048, intermediate 5632, 32 heads, vocabulary 49152, ReLU
gate; the default 38 layers is its 2B model, 28 its 1.5B), built from a LlamaConfig with random
weights (nothing is downloaded), in bf16 on CUDA (float32 on the CPU). Its activations are made sparse the way an L1
penalty leaves them, but without training: channel 0 of the residual stream is a constant (the
embeddings carry it, and every o_proj and down_proj row 0 is zero, so no layer writes it), which
makes column 0 of each gate weight a per-layer bias; layer by layer, that bias is set so that the
target fraction of the gate's pre-activations is positive (--density). Which units fire depends on
the token and on each unit's random weights, so the pattern is close to "uniform" with a mild
per-unit spread. Every other weight keeps the library's random initialisation.

Both models are one model: twell's modules share the nn.Linear weights (twell.torch.patch_model),
and the benchmark swaps the MLP modules between the two runs. Timing: CUDA events (wall time on
the CPU) around one prefill (forward of batch x seq tokens, logits of the last position only, no
KV cache) or one training step (forward over all positions with the language-model loss, plus
twell's L1 term for twell, then backward; no optimizer step), warm-ups of both (automatic dispatch
tries each path), then reps alternating dense and twell; median, p20, p80. Peak memory is
torch.cuda.max_memory_allocated over one more step of each. Agreement: the last position's logits
(prefill) or the loss and every parameter's gradient, the L1 term left out (training), relative to
the dense model's, ||twell - dense|| / ||dense||, and its floor, rel_diff_floor: the same distance of
the dense model with its MLPs rounded differently (each product as two GEMMs over halves of the
inner dimension, added: exact, like twell). Above both --tolerance and twice the floor the command
fails (a trained model can amplify bf16 rounding in its gradients far beyond --tolerance). A case the
GPU has no memory for (the 2B training step needs ~70 GB) is skipped, saying so, not failed.

Energy (CUDA with NVML, the nvidia-ml-py package; null otherwise): after the timed reps, each
model runs again for about --energy-seconds in blocks ordered dense, twell, twell, dense, the
device's total-energy counter read (after a synchronisation) around each block; joules per token
= the counter's delta over the tokens of those steps; energy_ratio = twell / dense (below 1: twell
spends less; the paper's 6.51 / 7.85 mJ is 0.83). idle_power_w: the GPU's mean power over ~1 s sampled, idle, before the first case.
--floor adds, to prefill rows, the same model with each MLP reduced to its gate GEMM
(bench/model_floor.py): floor_ms, floor_speedup and floor_energy_ratio, what no exact sparse FFN
can beat on that model.

Generate (--modes generate; the default modes are inference,training): Hugging Face
model.generate() of the same model, both MLPs in turn, greedy, a prompt of --prompt-len tokens (the
first of each input row, rows repeated to the batch) and exactly --new-tokens new tokens (no EOS),
with a static KV cache (--gen-cache; dynamic where this transformers has no static one; compiled:
transformers' torch.compile of the decoding step, CUDA graphs), for each batch of --gen-batches.
One whole generate() call is timed (at least one warm-up of each); tokens/s and energy count the
new tokens. Agreement: identical_tokens (the two models' greedy ids equal) and first_divergence;
bf16 rounding can flip a near-tie, so a difference is reported, never failed, with the dense logit
margin between the two tokens there beside the largest logit change of the exact split model at
that point (first_divergence.rounding: the margin is within it, or dense's own forward of the
prefix ranks twell's token first by no more than either model moves a logit), and where one
generate() with the split MLPs first leaves dense's tokens (first_divergence.split_divergence;
null: never). The density is over every token the FFNs saw in one twell generate.

--checkpoint PATH (a checkpoint folder of python -m twell.train or its run folder, or a Hugging
Face model folder with safetensors weights; nothing is unpickled) times that trained model instead: its own shape and weights, no calibration (the
density is the model's), token windows of its validation text (--data, default the checkpoint's;
random ids where there is none), the checkpoint named in every row.

    python3 bench/model.py [--out DIR | --no-write] [--layers 38] [--densities 0.005,0.01]
    python3 bench/model.py --checkpoint runs/s100m-relu-l1-2e-5 [--data .carry/gcide]
    python3 bench/model.py --modes generate [--gen-batches 1,16] [--prompt-len 128]
        [--new-tokens 64] [--gen-cache static|dynamic|compiled] [--out DIR --append]
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import transformers

import twell
import twell.torch as tt
from twell import energy
from twell.torch.patch import _set as set_module

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # model_generate, beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_generate  # noqa: E402
import model_hot  # noqa: E402
from timing import Timer, summary  # noqa: E402
from model_agreement import SplitMLP, agrees, distance  # noqa: E402,F401  (tests use SplitMLP)
from model_floor import GateOnlyMLP, floor_fields, floor_note  # noqa: E402
from cli_args import positive_ints  # noqa: E402

MODES = ("inference", "training", "generate")


def hot_units_arg(v):
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a unit count or auto, got {v!r}") from None


def parse_args(argv, **defaults):
    """model.py's arguments; `defaults` overrides its defaults (a script built on it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda when PyTorch sees a GPU and twell was built with CUDA")
    p.add_argument("--layers", type=int, default=38)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--densities", default="0.005,0.01", help="comma-separated target densities")
    p.add_argument("--modes", default="inference,training",
                   help="comma-separated, of: inference (prefill), training, generate")
    p.add_argument("--gen-batches", type=positive_ints, default=[1, 16],
                   help="generate: comma-separated batch sizes (default 1,16)")
    p.add_argument("--prompt-len", type=int, default=128,
                   help="generate: prompt tokens, the first of each input row (at most --seq)")
    p.add_argument("--new-tokens", type=int, default=64, help="generate: new tokens per row")
    p.add_argument("--gen-cache", choices=["static", "dynamic", "compiled"], default="static",
                   help="generate: the KV cache (static: cache_implementation='static')")
    p.add_argument("--l1", type=float, default=None,
                   help="L1 coefficient of twell's layers (default 2e-5, or the checkpoint's)")
    p.add_argument("--dispatch", choices=["auto", "sparse", "dense"], default="auto")
    p.add_argument("--capacity", type=int, default=0,
                   help="TwELL slots per (row, tile) of twell's layers (default 0: the backend's, "
                        "tile / 8 for inference, tile / 16 for training)")
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--reps", type=int, default=10)
    # Both models round in bf16 at different places (twell keeps h and dh in fp32), and over tens
    # of random layers the whole gradient drifts by a few 1e-2 (1.4e-2 to 3.2e-2 at 28 layers);
    # a wrong FFN gives O(1).
    p.add_argument("--tolerance", type=float, default=1e-1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None,
                   help="a python -m twell.train checkpoint (file or run folder) or a Hugging Face "
                        "model folder, instead of random weights (its shape overrides --layers, "
                        "--hidden, --intermediate, --heads, --vocab; --densities is ignored)")
    p.add_argument("--data", default=None,
                   help="with --checkpoint: the text whose validation windows are the input "
                        "(default: the checkpoint's --data; random ids where there is none)")
    p.add_argument("--energy-seconds", type=float, default=2.0,
                   help="seconds of each model's energy loop (CUDA with NVML; 0: no energy)")
    p.add_argument("--hot-units", type=hot_units_arg, default=0,
                   help="run each layer's H most active units (on calibration tokens) dense, the "
                        "rest through twell (twell.torch.hot; default 0: none); auto: each "
                        "layer's fastest H, measured")
    p.add_argument("--floor", action="store_true",
                   help="inference: also time the model with each MLP reduced to its gate GEMM "
                        "(bench/model_floor.py: the floor of any exact sparse FFN)")
    p.add_argument("--out", default=None, help="folder for model.json (default: no file)")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--append", action="store_true",
                   help="add this run's rows to those already in DIR/model.json")
    p.set_defaults(**defaults)
    return p.parse_args(argv)


def build(args, device, dtype):
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, hidden_act="relu",
        max_position_embeddings=max(args.seq, args.prompt_len + args.new_tokens),
        tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    with torch.device(device):  # initialised where it runs: a 1.5B model takes minutes on a CPU
        model = transformers.LlamaForCausalLM(config)
    model.to(dtype=dtype)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0  # the constant channel
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0
            layer.mlp.down_proj.weight[0, :] = 0
    return model


def calibrate(model, ids, density):
    """Sets each layer's gate column 0 so that `density` of its pre-activations are positive and
    none is zero: one forward, each MLP's bias set from its own input just before it runs (the
    layers after it see its calibrated output)."""

    def set_bias(mlp, inputs):
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        w = mlp.gate_proj.weight
        w[:, 0] = 0
        r = (x @ w.float().t()) / x[:, :1]  # pre-activation = x0 * (r - t) with bias weight -t
        r = r.flatten()
        if r.numel() > 1 << 22:
            r = r[torch.randint(0, r.numel(), (1 << 22,), device=r.device)]
        k = max(1, min(r.numel(), int(round((1 - density) * r.numel()))))
        # Halfway between the k-th and the next value: no pre-activation sits on the ReLU's kink,
        # where the two paths' roundings could disagree on its sign (and on its gradient).
        t = r.kthvalue(k).values
        if k < r.numel():
            t = (t + r.kthvalue(k + 1).values) / 2
        w[:, 0] = -t.to(w.dtype)

    handles = [layer.mlp.register_forward_pre_hook(set_bias) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(ids, use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()


class Swap:
    """Puts the twell modules, the model's own MLPs, those rounded differently ("split",
    SplitMLP) or their gate GEMMs alone ("floor", GateOnlyMLP) in place."""

    def __init__(self, model, l1, dispatch, capacity=0):
        tt.patch_model(model, l1_coef=l1, dispatch=dispatch, capacity=capacity)
        tt.freeze(model)
        self.model = model
        self.sparse = tt.sparse_modules(model)
        self.dense = [(n, m.__dict__["_twell_original"]) for n, m in self.sparse]
        self.split = [(n, SplitMLP(m)) for n, m in self.dense]
        self.floor = [(n, GateOnlyMLP(m)) for n, m in self.dense]

    def use(self, which):
        for name, module in {"twell": self.sparse, "split": self.split,
                             "floor": self.floor}.get(which, self.dense):
            set_module(self.model, name, module)


def peak(device, fn):
    if device.type != "cuda":
        return -1  # no allocator statistics: not measured
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def gb(b):
    return "n/a" if b < 0 else f"{b / 1e9:.2f}"


def make_step(model, ids, mode):
    """step(which) of an inference (prefill) or training case, the model set up for it."""
    params = list(model.parameters())
    if mode == "inference":
        model.eval()
        for p in params:
            p.requires_grad_(False)

        def step(which):
            with torch.no_grad():
                return model(ids, use_cache=False, logits_to_keep=1).logits
        return step
    model.train()
    for p in params:
        p.requires_grad_(True)

    def step(which, with_l1=True):
        for p in params:
            p.grad = None
        loss = model(ids, labels=ids, use_cache=False).loss
        total = loss + tt.l1_loss(model) if which == "twell" and with_l1 else loss
        total.backward()
        return loss.detach()
    return step


def measure(args, swap, step, device, warmup):
    """({"dense": [ms], "twell": [ms]}, {"dense": peak bytes, "twell": ...}): `warmup` steps of
    each model (automatic dispatch tries each path), then args.reps alternating timed steps, then
    one more of each for the peak."""
    timer = Timer(device)
    for _ in range(warmup):
        for which in ("dense", "twell"):
            swap.use(which)
            step(which)
    times = {"dense": [], "twell": []}
    for _ in range(args.reps):
        for which in ("dense", "twell"):
            swap.use(which)
            times[which].append(timer(lambda: step(which)))
    peaks = {}
    for which in ("dense", "twell"):
        swap.use(which)
        peaks[which] = peak(device, lambda: step(which))
    return times, peaks


def run_case(args, model, swap, ids, mode, device, meter=None):
    """(twell's l0 per layer, times, peaks, agreement fields, other fields) of a prefill or
    training case."""
    step = make_step(model, ids, mode)
    params = list(model.parameters())
    # Agreement (the L1 term left out of training's loss): twell's distance from the dense model,
    # and the floor, the differently rounded dense model's.
    swap.use("dense")
    ref = step("dense") if mode == "inference" else step("dense", with_l1=False)
    ref_grads = None if mode == "inference" else [p.grad.detach().clone() for p in params]
    swap.use("split")
    floor = distance(mode, step("split", with_l1=False) if mode == "training" else step("split"),
                     ref, params, ref_grads)
    swap.use("twell")
    got = step("twell") if mode == "inference" else step("twell", with_l1=False)
    l0 = [v for v in tt.l0_per_layer(model).values()]
    diff = distance(mode, got, ref, params, ref_grads)
    extra = {} if mode == "inference" else {"loss_dense": float(ref), "loss_twell": float(got)}
    del ref_grads
    times, peaks = measure(args, swap, step, device, args.warmup)
    extra.update(energy_case(args, meter, swap, step, times, device, args.batch * args.seq))
    if mode == "inference" and args.floor:
        extra.update(floor_fields(args, swap, step, device, meter, times, energy_case,
                                  args.batch * args.seq))
    for p in params:
        p.grad = None
    return l0, times, peaks, {"rel_diff": diff, "rel_diff_floor": floor,
                              "tolerance": args.tolerance}, extra


def run_generate(args, model, swap, ids, batch, device, meter=None):
    """run_case's tuple for a generate case of `batch` prompts: the whole generate() call timed,
    at least one warm-up of each model; the energy per new token."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    prompt = model_generate.prompts(ids, batch, args.prompt_len)
    step = model_generate.Generate(model, prompt, args.new_tokens, args.gen_cache,
                                   say=lambda m: print(m, flush=True))
    l0, fields = model_generate.agreement(model, swap, step)
    times, peaks = measure(args, swap, step, device, max(1, args.warmup))
    extra = energy_case(args, meter, swap, step, times, device, batch * args.new_tokens)
    return l0, times, peaks, {"gen_cache": step.cache, **fields}, extra


def energy_case(args, meter, swap, step, times, device, tokens, pair=("dense", "twell")):
    """Row fields of joules per token (the NVML counter over each model's steps, `tokens` a
    step), in blocks dense, twell, twell, dense (`pair`) of about --energy-seconds / 2 each; null
    without a meter."""
    a, b = pair
    fields = {f"energy_j_per_token_{a}": None, f"energy_j_per_token_{b}": None,
              "energy_ratio": None, f"avg_power_w_{a}": None, f"avg_power_w_{b}": None,
              "energy_steps": None}
    if meter is None or args.energy_seconds <= 0:
        return fields
    steps = {w: max(1, math.ceil(args.energy_seconds / 2 * 1e3 / statistics.median(times[w])))
             for w in pair}
    total = {w: [0.0, 0.0, 0] for w in pair}  # joules, seconds, steps
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None

    def block(which):
        swap.use(which)
        n = steps[which]

        def loop():
            for _ in range(n):
                step(which)
        joules, seconds = meter.measure(loop, sync=sync)
        t = total[which]
        t[0], t[1], t[2] = t[0] + joules, t[1] + seconds, t[2] + n

    for which in (a, b, b, a):
        block(which)
    for w in pair:
        joules, seconds, n = total[w]
        fields[f"energy_j_per_token_{w}"] = energy.joules_per_token(joules, n * tokens)
        fields[f"avg_power_w_{w}"] = joules / seconds if seconds > 0 else None
    d, t = fields[f"energy_j_per_token_{a}"], fields[f"energy_j_per_token_{b}"]
    fields["energy_ratio"] = t / d if t is not None and d else None
    fields["energy_steps"] = {w: total[w][2] for w in pair}
    return fields


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def load_checkpoint(args, device, dtype):
    """(model with its own MLPs, the checkpoint's path, input ids [batch, seq] or None, their
    source, calibration ids for hot units [2, seq] or None) from --checkpoint; args' shape and l1
    set from it."""
    from twell.capture import load_model, validation_ids

    try:
        model, info = load_model(args.checkpoint, device, dtype=dtype, mlp="dense")
    except ValueError as e:
        sys.exit(f"model bench: --checkpoint: {e}")
    cfg = model.config
    args.layers, args.hidden = cfg.num_hidden_layers, cfg.hidden_size
    args.intermediate, args.heads = cfg.intermediate_size, cfg.num_attention_heads
    args.vocab = model.get_input_embeddings().weight.shape[0]
    if args.l1 is None and info["l1_coef"] is not None:
        args.l1 = info["l1_coef"]
    ids, source, calib = None, "random ids", None
    try:
        text, where = validation_ids(info, args.data)
        from twell.train.data import eval_windows
        batches = eval_windows(text, args.batch, args.seq, max_batches=2) \
            if len(text) > args.batch * args.seq else []
        w = batches[0] if batches else None
        if w is None or w.shape[0] < args.batch or int(w.max()) >= args.vocab:
            print(f"model bench: {where}: too short for {args.batch} x {args.seq} tokens, or "
                  f"ids beyond the vocabulary; random ids instead", flush=True)
        else:
            ids, source = torch.from_numpy(w[:, :-1]).to(device), where
            if len(batches) > 1 and int(batches[1].max()) < args.vocab:  # hot units' calibration
                calib = torch.from_numpy(batches[1][:2, :-1]).to(device)
    except (ValueError, ImportError, OSError) as e:
        print(f"model bench: no text for the checkpoint ({e}); random ids instead", flush=True)
    return model, info["checkpoint"], ids, source, calib


def energy_note(row):
    if row.get("energy_j_per_token_dense") is None:
        return ""
    return (f"; energy {1e3 * row['energy_j_per_token_dense']:.3f} / "
            f"{1e3 * row['energy_j_per_token_twell']:.3f} mJ/token ({row['energy_ratio']:.3f}x)")


def check_modes(args):
    """The modes asked for; exits on an unknown one or a generate option out of range."""
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            sys.exit(f"model bench: unknown mode {m!r}")
    if "generate" in modes:
        if not 1 <= args.prompt_len <= args.seq:
            sys.exit(f"model bench: --prompt-len {args.prompt_len}: expected 1 to --seq "
                     f"({args.seq}): the prompt is the start of an input row")
        if args.new_tokens < 1:
            sys.exit(f"model bench: --new-tokens {args.new_tokens}: expected at least 1")
    return modes


def setup(args):
    """(env: device, dtype, name, checkpoint, input source, meter, idle watts, calibration ids of
    the hot units; the model; input ids [batch, seq]; densities)."""
    want_cuda = args.device == "cuda" or (
        args.device is None and torch.cuda.is_available() and twell.cuda_compiled())
    device = torch.device("cuda" if want_cuda else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    densities = [float(d) for d in args.densities.split(",") if d]
    start = time.perf_counter()
    ids, source, ckpt, calib = None, "random ids", None, None
    if args.checkpoint:
        model, ckpt, ids, source, calib = load_checkpoint(args, device, dtype)
        densities = [None]  # the model's own
    else:
        model = build(args, device, dtype)
    if args.l1 is None:
        args.l1 = 2e-5
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, {args.layers} "
          f"layers, {device_name(device)}, built in {time.perf_counter() - start:.1f} s", flush=True)
    if ids is None:
        gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
    meter, idle_w = None, None
    if args.energy_seconds > 0:
        meter = energy.open_meter(device, say=lambda m: print(m, flush=True))
    if meter is not None:
        torch.cuda.synchronize(device)
        time.sleep(0.5)  # let the model's initialisation settle
        idle_w = meter.idle_power_w(1.0)
        print(f"energy: NVML counter; idle power {idle_w:.1f} W", flush=True)
    env = argparse.Namespace(device=device, dtype=dtype, name=device_name(device), ckpt=ckpt,
                             source=source, meter=meter, idle_w=idle_w,
                             hot_calib=calib if calib is not None else ids[: min(args.batch, 2)])
    return env, model, ids, densities


def set_density(args, model, swap, density, calib_ids):
    """The Swap (made on first use), twell's modules in place, after the gates are calibrated to
    `density` (None: the model's own)."""
    if swap is not None:
        swap.use("dense")
    if density is not None:
        calibrate(model, calib_ids, density)
    if swap is None:
        try:
            return Swap(model, args.l1, args.dispatch, args.capacity)
        except ValueError as e:
            sys.exit(f"model bench: {e}")
    swap.use("twell")
    tt.freeze(model)  # the gate weights changed: new neuron-major copies
    return swap


def frozen_setup(args):
    """(env, model, ids, swap) for bench/op_graph.py and lab/probes: setup(), the gates calibrated
    to the first of --densities, twell's modules in place, evaluation mode, no gradients."""
    env, model, ids, densities = setup(args)
    swap = set_density(args, model, None, densities[0], ids[:2])
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return env, model, ids, swap


def case_tokens(args, mode, batch):
    return batch * (args.new_tokens if mode == "generate" else args.seq)


def make_row(args, env, mode, batch, density, result):
    l0, times, peaks, agree, extra = result
    d, t = summary(times["dense"]), summary(times["twell"])
    tokens = case_tokens(args, mode, batch)
    shape = {"prompt_len": args.prompt_len, "new_tokens": args.new_tokens} \
        if mode == "generate" else {"seq": args.seq}
    return {
        "suite": "model", "device": env.name, "backend": env.device.type,
        "dtype": str(env.dtype).replace("torch.", ""), "mode": mode, "layers": args.layers,
        "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads,
        "vocab": args.vocab, "batch": batch, **shape, "tokens": tokens,
        "target_density": density,
        "density": statistics.mean(l0) / args.intermediate,
        "density_min": min(l0) / args.intermediate,
        "density_max": max(l0) / args.intermediate,
        "l1_coef": args.l1, "dispatch": args.dispatch, "capacity": args.capacity or None,
        "warmup": max(1, args.warmup) if mode == "generate" else args.warmup, "reps": args.reps,
        "dense_ms": d, "twell_ms": t, "speedup": d["median"] / t["median"],
        "dense_tokens_per_s": tokens / d["median"] * 1e3,
        "twell_tokens_per_s": tokens / t["median"] * 1e3,
        "peak_bytes_dense": peaks["dense"], "peak_bytes_twell": peaks["twell"], **agree,
        "checkpoint": env.ckpt, "input": env.source, "idle_power_w": env.idle_w,
        "hot_units": args.hot_units, "hot_share": env.hot_share,
        "hot_units_per_layer": env.hot_units_per_layer, **extra,
    }


def report(n, row):
    """Prints the row's line; False where its agreement failed (generate's never does)."""
    d, t = row["dense_ms"]["median"], row["twell_ms"]["median"]
    if row["mode"] == "generate":
        ok = True
        case, agree = model_generate.line_parts(row)
    else:
        ok = agrees(row)
        case, agree = f"tokens {row['tokens']}", (f"rel diff {row['rel_diff']:.1e} (rounding floor "
                                                  f"{row['rel_diff_floor']:.1e}){'' if ok else ' FAILED'}")
    print(f"[{n}] {row['mode']:9s} layers {row['layers']} {case} density "
          f"{100 * row['density']:.2f}% (layers {100 * row['density_min']:.2f}-"
          f"{100 * row['density_max']:.2f}%): dense {d:.2f} ms, twell {t:.2f} ms, "
          f"{row['speedup']:.3f}x; peak {gb(row['peak_bytes_dense'])} / "
          f"{gb(row['peak_bytes_twell'])} GB; {agree}" + energy_note(row) + floor_note(row)
          + model_hot.note(row), flush=True)
    return ok


def skip_oom(args, model, mode, batch, density, error):
    for p in model.parameters():
        p.grad = None
    torch.cuda.empty_cache()
    target = "the model's" if density is None else f"{100 * density:.2f}%"
    case = f"batch {batch} " if mode == "generate" else ""
    print(f"[-] {mode:9s} layers {args.layers} {case}tokens {case_tokens(args, mode, batch)} "
          f"density target {target}: skipped, out of device memory "
          f"({str(error).splitlines()[0][:120]})", flush=True)


def main(argv=None):
    args = parse_args(argv)
    modes = check_modes(args)
    env, model, ids, densities = setup(args)
    calib_ids = ids[: min(args.batch, 2)]
    if args.hot_units != "auto" and args.hot_units and (
            not 0 < args.hot_units < args.intermediate or args.hot_units % 8):
        sys.exit(f"model bench: --hot-units {args.hot_units}: expected 0 (none) or a multiple "
                 f"of 8 up to {args.intermediate - 1}")
    cases = [(m, b) for m in modes for b in (args.gen_batches if m == "generate" else [args.batch])]
    rows, failed, swap = [], False, None
    path = os.path.join(args.out, "model.json") if args.out and not args.no_write else None
    kept = read_rows(path) if path and args.append else []
    for density in densities:
        swap = set_density(args, model, swap, density, calib_ids)
        env.hot_share, env.hot_units_per_layer = None, None
        if args.hot_units:
            env.hot_share, env.hot_units_per_layer = model_hot.split(
                model, swap, env.hot_calib, args.hot_units, training="training" in modes)
        for mode, batch in cases:
            try:
                if mode == "generate":
                    result = run_generate(args, model, swap, ids, batch, env.device, env.meter)
                else:
                    result = run_case(args, model, swap, ids, mode, env.device, env.meter)
            except torch.OutOfMemoryError as e:
                skip_oom(args, model, mode, batch, density, e)
                continue
            rows.append(make_row(args, env, mode, batch, density, result))
            failed |= not report(len(rows), rows[-1])
            if path:  # after every row: a run cut short keeps its rows
                os.makedirs(args.out, exist_ok=True)
                with open(path, "w") as f:
                    json.dump(kept + rows, f, indent=1)
    return 1 if failed else 0


def read_rows(path):
    """The rows of an earlier model.json (--append); none where there is no file yet."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        sys.exit(f"model bench: --append: {path} holds no list of rows")
    return rows


if __name__ == "__main__":
    sys.exit(main())
