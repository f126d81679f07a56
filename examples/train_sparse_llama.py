"""Train a tiny Llama with twell's sparse FFNs: patch it to ReLU, add the L1 term, watch L0 fall.

A thin wrapper of the training entry point, `python -m twell.train` (see its --help, and
scripts/prepare-gcide for a real English corpus): a tiny LlamaForCausalLM (built from a config,
nothing downloaded) trained with twell ReLU FFNs and the L1 penalty on a counting task (each
token is the previous one plus one, in runs from random starts), or on --data. It ends with one
line: loss, L0 per layer, dead units per layer, the share of rows twell's sparse kernels ran, and
tokens/s; the JSONL log of every 50 steps is in --out.

    python examples/train_sparse_llama.py --device cpu
    python examples/train_sparse_llama.py --data .carry/gcide --steps 2000 --l1 1e-3

With the defaults (300 steps, L1 1e-2) the tiny model gets under 1% density on the counting task
without a silent layer or dead units; every flag not listed here goes to twell.train as is.
"""
import argparse
import sys

from twell.train.cli import main as train_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="Other flags are passed on to python -m twell.train.")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--data", default="synthetic",
                   help="synthetic (default), a token folder (scripts/prepare-gcide) or a text "
                        "folder")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--l1", type=float, default=1e-2, help="L1 coefficient")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="build-train/runs/example", help="run folder (log.jsonl)")
    return p.parse_known_args(argv)


def main(argv=None):
    args, rest = parse_args(argv)
    return train_main([
        "--model", "tiny", "--data", args.data, "--device", args.device,
        "--steps", str(args.steps), "--batch-size", str(args.batch), "--seq-len", str(args.seq),
        "--hidden", str(args.hidden), "--intermediate", str(args.intermediate),
        "--layers", str(args.layers), "--l1", str(args.l1), "--lr", str(args.lr),
        "--seed", str(args.seed), "--out", args.out,
        "--log-every", "50", "--eval-every", "0", "--eval-batches", "8",
        "--dead-window", "16384", *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
