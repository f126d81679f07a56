"""Train a tiny Llama with twell's sparse FFNs: patch it to ReLU, add the L1 term, watch L0 fall.

A thin wrapper of the training entry point, `python -m twell.train` (see its --help, and
scripts/prepare-gcide for a real English corpus): a tiny LlamaForCausalLM (built from a config,
nothing downloaded; 2 layers, 256 FFN units each) trained with twell ReLU FFNs and the L1 penalty
on a counting task (each token is the previous one plus one, in runs from random starts), or on
--data. The L1 term drives most units to exactly zero for each token; twell's sparse kernels
then skip them.

    python examples/train_sparse_llama.py --device cpu
    python examples/train_sparse_llama.py --data .carry/gcide --steps 2000 --l1 2e-3

What it prints:
  * a progress bar (tqdm where installed, else a line every 50 steps): loss, mean density, dead
    units, the share of rows twell's sparse kernels ran, tokens/s;
  * every 100 steps and at the end, one line per layer: L0 (mean active units per token) and
    density on held-out tokens, dead units (never active over the validation tokens, and over
    the last 16,384 training tokens), the share of training rows twell ran sparse, and the path
    twell's inference dispatch took on the validation batches (sparse, or dense: on the CPU
    above 3.5% density);
  * a WARNING for a silent layer (no unit active for any token) or one with nearly all units dead;
  * last, one summary line. Every 50 steps' figures are in OUT/log.jsonl.

Defaults (300 steps, L1 2e-2 on the mean over the 2 layers as twell.train's --l1, learning rate
3e-3 with warm-up and cosine decay, dead units re-initialised at most every 200 steps as in the
project's recipe): over 99% sparse at the end (L0 about 0.7 and 2 of 256 on validation tokens),
no silent layer, no unit dead over the training window, in 10 - 20 seconds on 2 CPU cores. The
first ~150 steps are the dense regime (over 3.5% density: twell's inference runs dense, and
training rows overflow the tiles); at step 200 layer 0 runs sparse and layer 1 mostly (a quarter
of its validation calls dense), at step 300 both run sparse. Every flag not listed here goes to
twell.train as is.
"""
import argparse
import sys

from twell.train.cli import DefaultsHelpFormatter
from twell.train.cli import main as train_main


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Other flags are passed on to python -m twell.train.",
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--data", default="synthetic",
                   help="synthetic, a token folder (scripts/prepare-gcide) or a text folder")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    p.add_argument("--hidden", type=int, default=64, help="model width")
    p.add_argument("--intermediate", type=int, default=256, help="FFN units per layer")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--l1", type=float, default=2e-2,
                   help="L1 coefficient (times the mean over layers of each layer's mean over "
                        "tokens of sum |h|, as python -m twell.train --l1)")
    p.add_argument("--lr", type=float, default=3e-3,
                   help="peak learning rate (warm-up, then cosine decay)")
    p.add_argument("--reinit-dead-every", type=int, default=200,
                   help="re-initialise units dead over 16,384 training tokens, at most every N "
                        "steps (0: never)")
    p.add_argument("--report-every", type=int, default=100,
                   help="validate and print the per-layer report every N steps (and at the end)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", default="build-train/runs/example", help="run folder (log.jsonl)")
    return p


def parse_args(argv=None):
    return parser().parse_known_args(argv)


def main(argv=None):
    args, rest = parse_args(argv)
    return train_main([
        "--model", "tiny", "--data", args.data, "--device", args.device,
        "--steps", str(args.steps), "--batch-size", str(args.batch), "--seq-len", str(args.seq),
        "--hidden", str(args.hidden), "--intermediate", str(args.intermediate),
        "--layers", str(args.layers), "--l1", str(args.l1), "--lr", str(args.lr),
        "--seed", str(args.seed), "--out", args.out,
        "--log-every", "50", "--eval-every", str(args.report_every), "--eval-batches", "8",
        "--dead-window", "16384", "--reinit-dead-every", str(args.reinit_dead_every), *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
