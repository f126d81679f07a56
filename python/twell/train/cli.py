"""Command line of `python -m twell.train`. Every argument is checked before anything runs; a
bad one ends the command with exit status 2 and one line on stderr naming it and what it
expected (also for the files it names: twell.train.files)."""
import argparse
import math
import os
import sys
import time

from twell.train import files
from twell.train.data import BPE_SIZES
from twell.train.distributed import MODES as DIST_MODES
from twell.train.distributed import launch
from twell.train.files import InputError
from twell.train.models import PRESETS, shape

ACTIVATIONS = ("relu", "silu", "relu-torch")

EPILOG = """\
data (--data):
  DIR with meta.json   a token folder: .carry/corpus from scripts/prepare-corpus (English text of
                       Debian packages, BPE 16384, validation CE per source), .carry/gcide from
                       scripts/prepare-gcide
  DIR                  a folder of plain-text files (one document per file), tokenized by
                       --tokenizer: a tokenizer.json (or a folder holding one), a number (train a
                       byte-level BPE of that vocabulary on the training files), or bytes (default)
  hf:NAME              a Hugging Face dataset (needs `pip install datasets`), field --text-field
  synthetic            a counting task needing nothing on disk (smoke tests)

output (--out): log.jsonl (a "config" record, then one "log" record every --log-every steps and
at every validation, "resume" and "end" records), checkpoint/ (state.json + tensors.safetensors,
no pickle; at --ckpt-every, at the end and when --max-minutes or --stop-at stops the run;
--resume continues from it exactly).

examples:
  scripts/prepare-corpus                      # once: .carry/corpus (about 20 MiB)
  python -m twell.train --model s30m --l1 3e-4 --steps 2000 --max-minutes 9 --out runs/l1-3e-4
  python -m twell.train --model s30m --activation silu --steps 2000 --out runs/silu
  # a smoke test, seconds on a CPU: loss 4.9 -> ~0.1, FFN density ~45% -> ~15%, some rows sparse
  python -m twell.train --model tiny --data synthetic --device cpu --steps 100 --batch-size 8 \\
      --seq-len 64 --l1 2e-2 --lr 3e-3 --out build-train/runs/smoke
  torchrun --nproc-per-node 2 -m twell.train --model paper-0.5b --dist fsdp2 --out runs/fsdp2
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, "<name>: <argument>: <message>", exit status 2; int
    and float arguments say what they expected."""

    def __init__(self, *args, name, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name
        # Every add_argument(type=int / float) converts through these (argparse's registry).
        self.register("type", int, _parse(int, "an integer"))
        self.register("type", float, _parse(float, "a number"))

    def error(self, message):
        message = message[len("argument "):] if message.startswith("argument ") else message
        self.exit(2, f"{self.name}: {message}\n")


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help states each option's default: "(default: X)" after a help text that names none
    (options without a value, or with none by default, get nothing)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None
                or action.default is False or action.default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def _parse(kind, expected):
    def convert(text):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    return convert


def _tokenizer(value):
    if value in (None, "bytes"):
        return None
    return int(value) if value.isdigit() else value


def parser():
    p = OneLineParser(
        name="twell.train",
        prog="python -m twell.train",
        usage="python -m twell.train [--data D] [--model M] [--activation relu|silu] [--l1 C] "
              "[--steps N] [--out DIR] [--resume] [--max-minutes T] [options]",
        description="Train a Llama (Hugging Face LlamaForCausalLM) whose MLPs are twell ReLU FFNs "
                    "with the L1 activation penalty, on real text; log per-layer density, dead "
                    "units and the path twell ran.",
        epilog=EPILOG, formatter_class=DefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=".carry/corpus",
                   help="token folder, text folder, hf:NAME or synthetic (default .carry/corpus)")
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
    g.add_argument("--activation", choices=ACTIVATIONS, default="relu",
                   help="relu: MLPs patched to twell ReLU FFNs (default); silu: the unpatched "
                        "Llama MLPs, the dense reference; relu-torch: unpatched Llama MLPs with "
                        "ReLU (a ReLU baseline that runs no twell code; no L1 term, as silu)")
    g.add_argument("--l1", type=float, default=3e-4,
                   help="L1 coefficient on the FFN activations: times the mean over layers of "
                        "each layer's mean over tokens of sum |h| (tt.l1_loss, the paper's "
                        "released code's term; docs/training.md); default 3e-4, its released "
                        "0.5B / 1B / 2B configs' value")
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
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW")
    g.add_argument("--beta2", type=float, default=0.95, help="AdamW")
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0: none)")

    g = p.add_argument_group("validation, logging, dead units")
    g.add_argument("--eval-every", type=int, default=250,
                   help="validate every N steps and at the end (0: only at the end)")
    g.add_argument("--eval-batches", type=int, default=16, help="validation batches (default 16)")
    g.add_argument("--eval-batch-size", type=int, help="default: --batch-size")
    g.add_argument("--log-every", type=int, default=10, help="JSONL record every N steps")
    g.add_argument("--dead-window", type=int, default=1 << 20,
                   help="a unit is dead when active for no token over this many training tokens "
                        "(default 1048576); counted from the state each training forward "
                        "saves (plus a GEMM over its routed rows), else by one extra [M, N] "
                        "GEMM per FFN forward")
    g.add_argument("--no-dead-tracking", action="store_true", help="skip dead-unit tracking")
    g.add_argument("--reinit-dead-every", type=int, default=0,
                   help="re-initialise dead units' gate rows (SparsityTracker.reinit_dead) at the "
                        "first dead-unit window closing N or more steps after the last, and N or "
                        "more before --steps (0: never)")
    g.add_argument("--hot-units", type=int, default=0,
                   help="run each layer's H most active units dense and the rest through twell "
                        "(twell.torch.hot), re-chosen from each closed dead-unit window's counts "
                        "(0: none, the default; not with --dist fsdp2)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar or lines")

    g = p.add_argument_group("run control")
    g.add_argument("--out", help="run folder (default build-train/runs/MODEL-ACTIVATION[-l1-X])")
    g.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint when it exists (else start)")
    g.add_argument("--ckpt-every", type=int, default=0,
                   help="checkpoint every N steps too (default 0: at the end and on stops only)")
    g.add_argument("--max-minutes", type=float,
                   help="stop, checkpoint and exit cleanly before this many minutes from start")
    g.add_argument("--stop-at", type=int, help="stop (checkpoint, exit) after this step")
    g.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda[:N]")
    g.add_argument("--precision", choices=["fp32", "bf16"],
                   help="default: fp32 on the CPU, bf16 (fp32 master weights) on CUDA")
    g.add_argument("--seed", type=int, default=0, help="random seed")
    g.add_argument("--dist", choices=DIST_MODES, default="none",
                   help="several processes, launched by torchrun --nproc-per-node N -m "
                        "twell.train: ddp (DistributedDataParallel) or fsdp2 (fully_shard per "
                        "decoder layer); --batch-size is the global batch, split over the ranks; "
                        "NCCL on CUDA (rank r on cuda:LOCAL_RANK), gloo on the CPU (default none: "
                        "one process)")
    g.add_argument("--no-checkpoint", action="store_true",
                   help="write no checkpoint, not even at the end (timing runs)")
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


def _integer(args, name, low, high=None, optional=False):
    v = getattr(args, name)
    if v is None and optional:
        return
    if type(v) is not int or v < low or (high is not None and v > high):
        flag = f"--{name.replace('_', '-')}"
        raise InputError(flag, f"an integer >= {low}" if high is None else
                         f"an integer from {low} to {high}", repr(v))


def _number(args, name, low, high=None, low_open=False, high_open=False, optional=False):
    v = getattr(args, name)
    if v is None and optional:
        return
    if (type(v) not in (int, float) or not math.isfinite(v) or v < low or (low_open and v == low)
            or (high is not None and (v > high or (high_open and v == high)))):
        bound = f"{'>' if low_open else '>='} {low:g}" + (
            "" if high is None else f" and {'<' if high_open else '<='} {high:g}")
        raise InputError(f"--{name.replace('_', '-')}", f"a finite number {bound}", repr(v))


def _choice(args, name, choices):
    v = getattr(args, name)
    if v not in choices:
        raise InputError(f"--{name.replace('_', '-')}",
                         f"one of {', '.join(map(str, choices))}", repr(v))


def check(args):
    """InputError for the first argument of a parsed command line (or a checkpoint's saved one)
    that twell.train cannot run with; nothing is read or written."""
    for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_every", "eval_batches"):
        _integer(args, name, 1)
    for name in ("eval_every", "l1_warmup", "dead_window", "reinit_dead_every", "ckpt_every"):
        _integer(args, name, 0)
    for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "eval_batch_size",
                 "max_docs"):
        _integer(args, name, 1, optional=True)
    for name in ("warmup", "stop_at"):
        _integer(args, name, 0, optional=True)
    _integer(args, "seed", 0, (1 << 63) - 1)
    _integer(args, "val_permille", 1, 999)  # both splits need documents
    _number(args, "lr", 0, 10, low_open=True)  # AdamW steps of over 10 per unit gradient: no run
    _number(args, "min_lr_ratio", 0, 1)
    _number(args, "weight_decay", 0, 1e3)
    _number(args, "beta1", 0, 1, high_open=True)
    _number(args, "beta2", 0, 1, high_open=True)
    _number(args, "clip", 0)
    _number(args, "l1", 0)
    _number(args, "max_minutes", 0, low_open=True, optional=True)
    _choice(args, "model", list(PRESETS))
    _choice(args, "activation", ACTIVATIONS)
    _choice(args, "dispatch", ("auto", "sparse", "dense"))
    _choice(args, "precision", (None, "fp32", "bf16"))
    _choice(args, "dist", DIST_MODES)
    shape(args.model, hidden=args.hidden, intermediate=args.intermediate, layers=args.layers,
          heads=args.heads, kv_heads=args.kv_heads)
    tok = args.tokenizer
    if isinstance(tok, int) and not isinstance(tok, bool):
        lo, hi = BPE_SIZES
        if not lo <= tok <= hi:
            raise InputError("--tokenizer", f"a path, bytes, or a BPE vocabulary size from {lo} "
                             f"to {hi}", tok)
    elif tok is not None and (not isinstance(tok, str) or not tok):
        raise InputError("--tokenizer", "a path, bytes, or a BPE vocabulary size", repr(tok))
    for name in ("data", "text_field", "device"):
        if not isinstance(getattr(args, name), str) or not getattr(args, name):
            raise InputError(f"--{name.replace('_', '-')}", "a non-empty string",
                             repr(getattr(args, name)))
    if args.hot_units < 0 or args.hot_units % 8 or (args.hot_units and (
            args.no_dead_tracking or not args.dead_window or args.dist == "fsdp2"
            or args.activation != "relu")):
        raise InputError("--hot-units", "0, or a multiple of 8 with twell's ReLU layers, dead-unit "
                         "tracking (whose windows choose the units) and no --dist fsdp2 (its "
                         "sharded weights are not permuted)", args.hot_units)
    if args.reinit_dead_every and (args.no_dead_tracking or not args.dead_window):
        raise InputError("--reinit-dead-every", "0 without dead-unit tracking "
                         "(--no-dead-tracking or --dead-window 0 find no dead units)",
                         args.reinit_dead_every)


def checked_args(saved):
    """A checkpoint's saved arguments (a dict) as a Namespace with this command line's defaults
    for what it lacks, checked as check() checks a command line."""
    if not isinstance(saved, dict):
        raise InputError("args", "a JSON object", type(saved).__name__)
    args = parser().parse_args([])
    for k, v in saved.items():
        if k in vars(args):
            setattr(args, k, v)
    check(args)
    return args


def main(argv=None):
    start = _process_start()
    args = parser().parse_args(argv)
    try:
        check(args)
        if args.out is None:
            tag = f"-l1-{args.l1:g}" if args.activation == "relu" else ""
            args.out = os.path.join("build-train", "runs", f"{args.model}-{args.activation}{tag}")
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise InputError("--out", "a folder (new or existing)",
                             f"{args.out}, which is {files.kind_of(os.stat(args.out).st_mode)}")
        if args.data == ".carry/corpus" and not os.path.isdir(args.data):
            raise InputError("--data", "a token folder, a text folder, hf:NAME or synthetic "
                             "(the default, .carry/corpus, comes from scripts/prepare-corpus)",
                             "no .carry/corpus here")
        launch(args)  # --dist against torchrun's environment, before torch is imported
        from twell.train.loop import run  # imports torch and transformers
        return run(args, start)
    except InputError as e:
        _fail(f"twell.train: {e}")
    except (MemoryError, RuntimeError) as e:
        if type(e).__name__ == "Diverged":  # loop.Diverged: a finished run, not a misuse
            print(str(e), file=sys.stderr)
            sys.exit(1)
        torch = sys.modules.get("torch")
        if not (isinstance(e, MemoryError) or (torch and isinstance(e, torch.OutOfMemoryError))):
            raise
        first = (str(e).splitlines() or [""])[0][:120]
        _fail(f"twell.train: out of memory: expected a model and micro-batch that fit, got "
              f"--model {args.model}, --batch-size {args.batch_size}, --seq-len {args.seq_len} "
              f"on --device {args.device} ({type(e).__name__}: {first})")


def _fail(line):
    line = line.replace("\n", "\\n").replace("\r", "\\r")  # one line, whatever a path holds
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(2)
