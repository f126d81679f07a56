"""Command line of `python -m twell.train`."""
import argparse
import os
import sys
import time

from twell.train.models import PRESETS

EPILOG = """\
data (--data):
  DIR with meta.json   a token folder, e.g. .carry/gcide from scripts/prepare-gcide
  DIR                  a folder of plain-text files (one document per file), tokenized by
                       --tokenizer: a tokenizer.json (or a folder holding one), a number (train a
                       byte-level BPE of that vocabulary on the training files), or bytes (default)
  hf:NAME              a Hugging Face dataset (needs `pip install datasets`), field --text-field
  synthetic            a counting task needing nothing on disk (smoke tests)

output (--out): log.jsonl (a "config" record, then one "log" record every --log-every steps and
at every validation, "resume" and "end" records), checkpoint.pt (at --ckpt-every, at the end and
when --max-minutes or --stop-at stops the run; --resume continues from it exactly).

examples:
  scripts/prepare-gcide                       # once: .carry/gcide (about 22 MiB)
  python -m twell.train --model s30m --l1 2e-5 --steps 2000 --max-minutes 9 --out runs/l1-2e-5
  python -m twell.train --model s30m --activation silu --steps 2000 --out runs/silu
  python -m twell.train --model tiny --data synthetic --device cpu --steps 50
"""


def _tokenizer(value):
    if value in (None, "bytes"):
        return None
    return int(value) if value.isdigit() else value


def parser():
    p = argparse.ArgumentParser(
        prog="python -m twell.train",
        usage="python -m twell.train [--data D] [--model M] [--activation relu|silu] [--l1 C] "
              "[--steps N] [--out DIR] [--resume] [--max-minutes T] [options]",
        description="Train a Llama (Hugging Face LlamaForCausalLM) whose MLPs are twell ReLU FFNs "
                    "with the L1 activation penalty, on real text; log per-layer density, dead "
                    "units and the path twell ran.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=".carry/gcide",
                   help="token folder, text folder, hf:NAME or synthetic (default .carry/gcide)")
    g.add_argument("--tokenizer", type=_tokenizer, default=None,
                   help="for a text folder or hf: dataset: tokenizer.json path, a BPE vocabulary "
                        "size to train, or bytes (default)")
    g.add_argument("--text-field", default="text", help="hf: datasets: the text column")
    g.add_argument("--val-permille", type=int, default=20,
                   help="text folders and hf: datasets: documents per 1000 held out (default 20)")
    g.add_argument("--max-docs", type=int, help="hf: datasets: use the first N rows")

    g = p.add_argument_group("model")
    g.add_argument("--model", default="s30m", choices=list(PRESETS),
                   help="shape preset (default s30m); see twell.train.models")
    for name in ("hidden", "intermediate", "layers", "heads", "kv-heads"):
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")
    g.add_argument("--activation", choices=["relu", "silu"], default="relu",
                   help="relu: MLPs patched to twell ReLU FFNs (default); silu: the unpatched "
                        "Llama MLPs, the dense reference")
    g.add_argument("--l1", type=float, default=2e-5,
                   help="L1 coefficient on the FFN activations (tt.l1_loss; default 2e-5)")
    g.add_argument("--l1-warmup", type=int, default=0,
                   help="ramp the L1 coefficient linearly from 0 over this many steps (default 0)")
    g.add_argument("--dispatch", choices=["auto", "sparse", "dense"], default="auto",
                   help="twell's dispatch (default auto: the plan picks sparse or dense)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    g.add_argument("--batch-size", type=int, default=32, help="sequences per micro-batch")
    g.add_argument("--seq-len", type=int, default=512, help="tokens per sequence (default 512)")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    g.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="the cosine ends at lr * this (default 0.1)")
    g.add_argument("--warmup", type=int,
                   help="linear warm-up steps (default steps/20, at most 200)")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW, matrices only")
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0: none)")

    g = p.add_argument_group("validation, logging, dead units")
    g.add_argument("--eval-every", type=int, default=250,
                   help="validate every N steps and at the end (0: only at the end)")
    g.add_argument("--eval-batches", type=int, default=16, help="validation batches (default 16)")
    g.add_argument("--eval-batch-size", type=int, help="default: --batch-size")
    g.add_argument("--log-every", type=int, default=10, help="JSONL record every N steps")
    g.add_argument("--dead-window", type=int, default=1 << 20,
                   help="a unit is dead when active for no token over this many training tokens "
                        "(default 1048576); one extra [M, N] GEMM per FFN forward")
    g.add_argument("--no-dead-tracking", action="store_true", help="skip dead-unit tracking")
    g.add_argument("--reinit-dead-every", type=int, default=0,
                   help="re-initialise dead units' gate rows (SparsityTracker.reinit_dead) at the "
                        "first dead-unit window closing N or more steps after the last, and N or "
                        "more before --steps (0: never)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar or lines")

    g = p.add_argument_group("run control")
    g.add_argument("--out", help="run folder (default build-train/runs/MODEL-ACTIVATION[-l1-X])")
    g.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.pt when it exists (else start)")
    g.add_argument("--ckpt-every", type=int, default=0,
                   help="checkpoint every N steps too (default 0: at the end and on stops only)")
    g.add_argument("--max-minutes", type=float,
                   help="stop, checkpoint and exit cleanly before this many minutes from start")
    g.add_argument("--stop-at", type=int, help="stop (checkpoint, exit) after this step")
    g.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda[:N]")
    g.add_argument("--precision", choices=["fp32", "bf16"],
                   help="default: fp32 on the CPU, bf16 (fp32 master weights) on CUDA")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms (twell: deterministic kernels)")
    return p


def _process_start():
    """time.monotonic() at this process's start (Linux /proc; else now): --max-minutes counts
    the interpreter's start-up and imports too."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
        return now - age if 0 <= age < 3600 else now
    except (OSError, ValueError, IndexError):
        return now


def main(argv=None):
    start = _process_start()
    args = parser().parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_every"):
        if getattr(args, name) < 1:
            sys.exit(f"twell.train: --{name.replace('_', '-')} must be at least 1")
    if args.out is None:
        tag = f"-l1-{args.l1:g}" if args.activation == "relu" else ""
        args.out = os.path.join("build-train", "runs", f"{args.model}-{args.activation}{tag}")
    if args.data == ".carry/gcide" and not os.path.isdir(args.data):
        sys.exit("twell.train: no .carry/gcide here: run scripts/prepare-gcide first, or pass "
                 "--data (a token folder, a text folder, hf:NAME or synthetic)")
    from twell.train.loop import run  # imports torch and transformers
    return run(args, start)
