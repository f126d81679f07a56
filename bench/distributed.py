#!/usr/bin/env python3
"""twell multi-GPU training benchmark: harness rows (suite "distributed") in DIR/distributed.json.

Each case is a short run of the one training entry point, python -m twell.train (under
`torchrun --standalone --nproc-per-node N` and --dist ddp or fsdp2 for N > 1 GPUs; one process
for 1 GPU): the paper's 0.5B shape (--model paper-0.5b: hidden 2048, intermediate 5632, 8 layers)
on the corpus (.carry/corpus), bf16 with fp32 master weights, --batch-per-gpu sequences of
--seq-len tokens per GPU (weak scaling: the global batch grows with the GPUs), --warmup-steps
steps then --measure-steps more, no checkpoint, no dead-unit tracking (its counting would be a
cost of twell's runs alone). tokens/s: the median over the log's intervals of --warmup-steps steps
after the first (twell.train's tokens_per_s: the global batch's tokens over rank 0's wall time,
validation excluded); peak memory per GPU: torch.cuda.max_memory_allocated of every rank (the log's
end record).

Cases, for each GPU count (1, then each of --gpus) and engine (one process at 1 GPU; each of
--engines above):
  dense         --activation relu-torch: transformers' own Llama MLPs with ReLU, no twell code
                (its speed does not depend on the weights: one run serves every regime)
  twell init    --activation relu, randomly initialised: about half the units active, where
                twell's dispatch runs dense (issue 51's target: twell >= 0.97x dense)
  twell sparse  the same with its gates calibrated before training (bench/model.py's calibration:
                a constant residual channel, each gate's column 0 a bias) to --density of the units
                active, and --lr 1e-6 so that the few steps keep it (the target: twell's speedup at
                N GPUs within 5% of its speedup at 1)
Row fields: tokens_per_s, tokens_per_s_per_gpu, step_ms, peak_bytes_per_gpu, density (the log's
mean over layers), sparse_rows, speedup (twell over dense at the same GPUs and engine),
scaling_efficiency (tokens/s per GPU over the same MLP's and regime's at 1 GPU), the command.

    python3 bench/distributed.py --out bench/results/h200 [--gpus 2,4] [--engines ddp,fsdp2]
        [--regimes init,sparse] [--density 0.005] [--budget-s 480]
    python3 bench/distributed.py --model tiny --data synthetic --device cpu --gpus 2 --no-write
        (the harness itself, on the CPU: processes over gloo instead of GPUs)

A case that fails is reported and skipped (exit status 1 at the end); cases that would not end
before --budget-s (from the longest case so far) are skipped, saying so. Rows are written after
every case. The worker mode (--worker DENSITY -- ARGS...) is the calibrated twell.train run.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:  # bench/ is no package: its modules are imported beside this one
    sys.path.insert(0, HERE)
from cli_args import positive_ints  # noqa: E402


def words(choices):
    def parse(text):
        values = [v for v in text.split(",") if v]
        if not values or any(v not in choices for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of "
                                             f"{', '.join(choices)}, got {text!r}")
        return values
    return parse


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        return 0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/distributed.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="folder for distributed.json (default bench/results/<device>, "
                   "the device as the first run names it, e.g. h200)")
    p.add_argument("--no-write", action="store_true", help="print the rows only")
    p.add_argument("--append", action="store_true",
                   help="add this run's rows to those already in DIR/distributed.json")
    p.add_argument("--gpus", type=positive_ints,
                   help="GPU counts above 1 (default: 2, 4, 8... up to the GPUs here)")
    p.add_argument("--engines", type=words(("ddp", "fsdp2")), default=["ddp", "fsdp2"])
    p.add_argument("--regimes", type=words(("init", "sparse")), default=["init", "sparse"])
    p.add_argument("--density", type=float, default=0.005,
                   help="the sparse regime's calibrated fraction of active units (default 0.005)")
    p.add_argument("--model", default="paper-0.5b", help="twell.train --model (default paper-0.5b)")
    p.add_argument("--data", default=".carry/corpus", help="twell.train --data")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (gloo)")
    p.add_argument("--batch-per-gpu", type=int, default=16, help="sequences per GPU (default 16)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--warmup-steps", type=int, default=10,
                   help="steps before the timed ones; also the length of a timed interval")
    p.add_argument("--measure-steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--l1", type=float, default=3e-4, help="twell's L1 coefficient")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the init regime")
    p.add_argument("--case-timeout", type=int, default=300, help="seconds per case")
    p.add_argument("--budget-s", type=float, default=480,
                   help="skip the cases that would end past this many seconds (default 480)")
    p.add_argument("--work", default=os.path.join("build", "bench-distributed"),
                   help="run folders (deleted after each case)")
    args = p.parse_args(argv)
    if args.measure_steps % args.warmup_steps:
        p.error("--measure-steps: expected a multiple of --warmup-steps (whole intervals)")
    if args.gpus is None:
        n = gpu_count() if args.device == "cuda" else 2
        args.gpus = [g for g in (2, 4, 8, 16) if g <= n]
    args.gpus = sorted(g for g in set(args.gpus) if g > 1)
    return args


def cases(args):
    """(mlp, regime, gpus, engine) in the order they run: 1 GPU first, then each count."""
    out = []
    for gpus in [1] + args.gpus:
        for engine in (["none"] if gpus == 1 else args.engines):
            out.append(("dense", None, gpus, engine))
            out.extend(("twell", regime, gpus, engine) for regime in args.regimes)
    return out


def command(args, case, run_dir):
    mlp, regime, gpus, engine = case
    train = ["--model", args.model, "--data", args.data, "--device", args.device,
             "--activation", "relu-torch" if mlp == "dense" else "relu",
             "--steps", str(args.warmup_steps + args.measure_steps),
             "--batch-size", str(args.batch_per_gpu * gpus), "--seq-len", str(args.seq_len),
             "--log-every", str(args.warmup_steps), "--eval-every", "0", "--eval-batches", "1",
             "--no-dead-tracking", "--no-checkpoint", "--no-progress", "--l1", str(args.l1),
             "--lr", str(1e-6 if regime == "sparse" else args.lr), "--out", run_dir]
    if engine != "none":
        train += ["--dist", engine]
    if regime == "sparse":
        entry = [os.path.abspath(__file__), "--worker", str(args.density), "--"]
    else:
        entry = ["-m", "twell.train"]
    if gpus == 1:
        return [sys.executable, *entry, *train]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(gpus), *entry, *train]


def read_log(path):
    out = {"config": None, "log": [], "end": None}
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "log":
                out["log"].append(rec)
            elif rec.get("kind") in ("config", "end"):
                out[rec["kind"]] = rec
    return out


def make_row(args, case, cmd, log, seconds):
    mlp, regime, gpus, engine = case
    config, records, end = log["config"], log["log"], log["end"]
    timed = [r["tokens_per_s"] for r in records
             if r["step"] > args.warmup_steps and r.get("tokens_per_s")]
    tps = statistics.median(timed) if timed else None
    last = records[-1] if records else {}
    rows = [r for r in last.get("sparse_rows") or [] if r is not None]
    peaks = end.get("peak_bytes") if end else None
    shape = config["model"]
    return {
        "suite": "distributed", "device": config["device"],
        "backend": "cuda" if args.device == "cuda" else "cpu",
        "dtype": "bfloat16" if config["precision"] == "bf16" else "float32",
        "mode": "training", "engine": engine, "gpus": gpus, "mlp": mlp,
        "activation": "relu-torch" if mlp == "dense" else "relu", "regime": regime,
        "target_density": args.density if regime == "sparse" else None,
        "model": args.model, "layers": shape["layers"], "hidden": shape["hidden"],
        "intermediate": shape["intermediate"], "heads": shape["heads"],
        "vocab": config["vocab_size"], "params": config["params"],
        "batch_per_gpu": args.batch_per_gpu, "batch": args.batch_per_gpu * gpus,
        "seq": args.seq_len, "tokens_per_step": config["tokens_per_step"],
        "warmup_steps": args.warmup_steps, "measure_steps": args.measure_steps,
        "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / gpus if tps else None,
        "tokens_per_s_intervals": timed,
        "step_ms": config["tokens_per_step"] / tps * 1e3 if tps else None,
        "peak_bytes_per_gpu": peaks, "peak_bytes": max(peaks) if peaks else None,
        "density": last.get("mean_density"),
        "sparse_rows": sum(rows) / len(rows) if rows else None,
        "l1_coef": args.l1 if mlp == "twell" else None,
        "lr": 1e-6 if regime == "sparse" else args.lr,
        "data": args.data, "seconds": round(seconds, 1),
        "versions": config.get("versions"),
        "command": " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                            for c in cmd),
        "speedup": None, "scaling_efficiency": None,
    }


def derive(rows):
    """speedup (twell over dense, same GPUs and engine) and scaling_efficiency (tokens/s per GPU
    over the same MLP and regime at 1 GPU), in place."""
    dense = {(r["gpus"], r["engine"]): r["tokens_per_s"] for r in rows if r["mlp"] == "dense"}
    one = {(r["mlp"], r["regime"]): r["tokens_per_s"] for r in rows if r["gpus"] == 1}
    for r in rows:
        d = dense.get((r["gpus"], r["engine"]))
        r["speedup"] = (r["tokens_per_s"] / d if r["mlp"] == "twell" and d and r["tokens_per_s"]
                        else None)
        base = one.get((r["mlp"], r["regime"]))
        r["scaling_efficiency"] = (r["tokens_per_s_per_gpu"] / base
                                   if base and r["tokens_per_s_per_gpu"] else None)
    return rows


def label(case):
    mlp, regime, gpus, engine = case
    return f"{gpus} x {engine:5s} {mlp}{f' ({regime})' if regime else ''}"


def line(row):
    gib = (f"{row['peak_bytes'] / 2**30:.1f} GiB/GPU" if row["peak_bytes"] else "peak n/a")
    extra = []
    if row["speedup"] is not None:
        extra.append(f"{row['speedup']:.3f}x dense")
    if row["scaling_efficiency"] is not None and row["gpus"] > 1:
        extra.append(f"scaling {100 * row['scaling_efficiency']:.1f}%")
    if row["density"] is not None:
        extra.append(f"density {100 * row['density']:.2f}%")
    tps = row["tokens_per_s"]
    return (f"{label((row['mlp'], row['regime'], row['gpus'], row['engine']))}: "
            + (f"{tps:,.0f} tokens/s ({row['tokens_per_s_per_gpu']:,.0f}/GPU, "
               f"{row['step_ms']:.1f} ms/step)" if tps else "no timed interval")
            + f", {gib}" + (f"; {', '.join(extra)}" if extra else ""))


def slug(device):
    """The results folder of a device: "NVIDIA H200" -> h200; a CPU -> cpu."""
    name = device.lower().split()
    return name[1] if len(name) > 1 and name[0] == "nvidia" else "cpu"


def write(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    start = time.monotonic()
    rows, failed, longest = [], False, 0.0
    path, kept = None, []
    todo = cases(args)
    print(f"distributed bench: {len(todo)} cases ({args.model}, {args.batch_per_gpu} x "
          f"{args.seq_len} tokens per GPU, {args.warmup_steps} + {args.measure_steps} steps), "
          f"budget {args.budget_s:.0f} s", flush=True)
    for i, case in enumerate(todo):
        elapsed = time.monotonic() - start
        if elapsed + 1.2 * longest > args.budget_s:
            print(f"[-] {label(case)}: skipped (the budget: {elapsed:.0f} s gone, cases take up "
                  f"to {longest:.0f} s)", flush=True)
            continue
        run_dir = os.path.join(args.work, f"case{i}")
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = command(args, case, run_dir)
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.case_timeout,
                               env=dict(os.environ, OMP_NUM_THREADS="1")
                               if args.device == "cpu" else None)
            rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            rc, tail = "timeout", str(e)[-300:]
        seconds = time.monotonic() - t
        longest = max(longest, seconds)
        log_path = os.path.join(run_dir, "log.jsonl")
        log = read_log(log_path) if os.path.exists(log_path) else None
        if rc != 0 or log is None or log["config"] is None or not log["log"]:
            failed = True
            print(f"[!] {label(case)}: failed ({rc}) after {seconds:.0f} s: {' '.join(cmd)}\n"
                  f"{tail}", flush=True)
            continue
        rows.append(make_row(args, case, cmd, log, seconds))
        derive(rows)
        print(f"[{len(rows)}] {line(rows[-1])} ({seconds:.0f} s)", flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        if not args.no_write:
            if path is None:
                out = args.out or os.path.join(ROOT, "bench", "results", slug(rows[0]["device"]))
                path = os.path.join(out, "distributed.json")
                kept = read_rows(path) if args.append else []
            write(path, kept + rows)
    if rows:
        print("distributed bench: " + (f"rows in {path}" if path else "no file written"))
        for r in rows:
            print("  " + line(r))
    return 1 if failed or not rows else 0


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        sys.exit(f"distributed bench: --append: {path} holds no list of rows")
    return rows


# ---- the calibrated run (one process of it) --------------------------------------------------

def worker(argv):
    """`--worker DENSITY -- ARGS...`: python -m twell.train ARGS with the model's gates calibrated
    to DENSITY before it trains (on every rank alike: the same weights, ids and arithmetic)."""
    if len(argv) < 2 or argv[1] != "--":
        sys.exit("distributed bench: --worker: expected DENSITY -- TWELL.TRAIN ARGUMENTS")
    density = float(argv[0])
    import torch

    from twell.train import cli, distributed, loop
    from model import calibrate  # bench/model.py

    args = cli.parser().parse_args(argv[2:])
    try:
        cli.check(args)
        distributed.launch(args)
    except ValueError as e:
        sys.exit(f"distributed bench: {e}")

    def prepare(trainer):
        model = trainer.model
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 1.0  # the constant channel
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[0, :] = 0
                layer.mlp.down_proj.weight[0, :] = 0
        ids = trainer.data.val_batches(2, args.seq_len, max_batches=1)[0][:, :-1]
        calibrate(model, torch.from_numpy(ids).to(trainer.device), density)

    loop.run(args, prepare=prepare)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
    else:
        sys.exit(main())
