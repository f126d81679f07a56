"""Checkpoints of twell.train: model, fp32 master weights, optimizer, scheduler, step, token count,
data position, dead-unit windows and every RNG, so that a resumed run continues exactly where an
uninterrupted one would be."""
import json
import os
import random
import time

import numpy as np
import torch

FORMAT = "twell.train-1"

# Arguments a resumed run must share with the checkpoint (the rest may change, with a warning).
SAME_ON_RESUME = ("model", "hidden", "intermediate", "layers", "heads", "kv_heads", "seq_len",
                  "batch_size", "grad_accum", "seed", "activation", "data", "precision")


def _jsonable(x):
    return x if isinstance(x, (int, float, str, bool, type(None), list, dict)) else str(x)


def save(trainer):
    """Writes OUT/checkpoint.pt (through a temporary file and a rename)."""
    t = time.monotonic()
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": np.random.get_state()}
    if trainer.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(trainer.device)
    state = {
        "format": FORMAT,
        "step": trainer.step, "tokens": trainer.tokens, "last_reinit": trainer.last_reinit,
        "args": {k: _jsonable(v) for k, v in vars(trainer.args).items()},
        "model": trainer.model.state_dict(),
        "master": trainer.master,
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "sampler": trainer.sampler.state_dict(),
        "monitor": trainer.monitor.state_dict(),
        "rng": rng,
    }
    tmp = trainer.ckpt_path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, trainer.ckpt_path)
    trainer.ckpt_time = time.monotonic() - t
    trainer.paused_s += trainer.ckpt_time


def read(path, map_location="cpu"):
    """A checkpoint's state dict (format, step, args, model, ...) for use outside a Trainer, or
    ValueError naming the file if it is not one of twell.train's."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # pickle, zip or torch errors: say which file
        raise ValueError(f"checkpoint {path}: not a readable torch checkpoint ({e})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"checkpoint {path}: expected a python -m twell.train checkpoint "
                         f"(format {FORMAT!r}), got {got!r}")
    return state


def load(trainer, say):
    """Restores a checkpoint into a freshly built Trainer of the same arguments."""
    state = torch.load(trainer.ckpt_path, map_location=trainer.device, weights_only=False)
    saved = state["args"]
    mine = {k: _jsonable(v) for k, v in vars(trainer.args).items()}
    wrong = [k for k in SAME_ON_RESUME if saved.get(k) != mine.get(k)]
    if wrong:
        raise SystemExit(f"twell.train: --resume: {trainer.ckpt_path} was made with other "
                         + ", ".join(f"--{k.replace('_', '-')} ({saved.get(k)!r}, now "
                                     f"{mine.get(k)!r})" for k in wrong))
    changed = [k for k in mine if k not in ("resume", "max_minutes", "stop_at")
               and saved.get(k) != mine[k]]
    if changed:
        say("WARNING: resuming with changed " + ", ".join(
            f"--{k.replace('_', '-')} {saved.get(k)!r} -> {mine[k]!r}" for k in changed))
    trainer.model.load_state_dict(state["model"])
    if trainer.master is not None:
        with torch.no_grad():
            for m, s in zip(trainer.master, state["master"]):
                m.copy_(s)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.sampler.load_state_dict(state["sampler"])
    trainer.monitor.load_state_dict(state["monitor"])
    trainer.step, trainer.tokens = state["step"], state["tokens"]
    trainer.last_reinit = state["last_reinit"]
    rng = state["rng"]
    torch.set_rng_state(rng["torch"].cpu())
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if "cuda" in rng and trainer.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"].cpu(), trainer.device)
    _truncate_log(trainer)


def _truncate_log(trainer):
    """Drops log records past the checkpoint (written after it by a run that then died)."""
    if not os.path.exists(trainer.log_path):
        return
    with open(trainer.log_path) as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") in ("log", "end") and rec.get("step", 0) > trainer.step:
            continue
        keep.append(line)
    with open(trainer.log_path, "w") as f:
        f.writelines(keep)
