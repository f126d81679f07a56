"""Checkpoints of twell.train: model, fp32 master weights, optimizer, scheduler, step, token count,
data position, dead-unit windows and every RNG, so that a resumed run continues exactly where an
uninterrupted one would be.

On disk: OUT/checkpoint/, a folder of tensors.safetensors and state.json (twell.train.state_files;
no pickle, so reading a checkpoint runs no code), written atomically. Everything read back is
checked against the run it is loaded into (names, shapes and dtypes of the tensors, the keys and
types of the rest) before use. A checkpoint.pt (a pickle of an older twell) is refused, never
unpickled. `save`, `load`, `find` and `read` are the whole interface.

Several ranks (--dist): the checkpoint is the one-process one. Rank 0 writes it, FSDP2's shards
gathered into whole tensors first (the fp32 shards are the master weights; the model entry holds
them in the compute dtype, as one process's parameters); the data position, the dead-unit window
(hits summed over ranks) and rank 0's generators are global. Every rank reads it back and keeps
its share, so a run resumes on any number of ranks (--batch-size stays the global batch).
"""
import math
import os
import random
import time

import numpy as np
import torch

from twell.train import files, model_state, state_files
from twell.train.files import InputError

FORMAT = "twell.train-2"
FOLDER = "checkpoint"
LEGACY = "checkpoint.pt"

# Arguments a resumed run must share with the checkpoint (the rest may change, with a warning).
SAME_ON_RESUME = ("model", "hidden", "intermediate", "layers", "heads", "kv_heads", "seq_len",
                  "batch_size", "grad_accum", "seed", "activation", "data", "precision")


def path(out):
    """The checkpoint folder of run folder `out`."""
    return os.path.join(out, FOLDER)


def pickle_error(file):
    return InputError(f"checkpoint {file}", "a twell.train checkpoint folder (state.json + "
                      "tensors.safetensors)", "a pickle (checkpoint.pt of an older twell), which "
                      "twell no longer loads: unpickling a file can run any code it carries")


def find(out):
    """The checkpoint to resume run folder `out` from, or None where there is none; InputError
    where `out` holds only an older twell's pickle checkpoint.pt."""
    found = state_files.locate(path(out))
    if found is None and os.path.lexists(os.path.join(out, LEGACY)):
        raise pickle_error(os.path.join(out, LEGACY))
    return found


def _jsonable(x):
    return x if isinstance(x, (int, float, str, bool, type(None), list, dict)) else str(x)


def save(trainer):
    """Writes OUT/checkpoint (atomically; rank 0, every rank taking part)."""
    t = time.monotonic()
    model, master = model_state.weights_state(trainer)  # FSDP2: gathers, every rank
    opt = model_state.optimizer_state(trainer)
    monitor = trainer.monitor.state_dict()  # sums over ranks
    if not trainer.dist.main:
        trainer.dist.barrier()
        trainer.ckpt_time = time.monotonic() - t
        trainer.paused_s += trainer.ckpt_time
        return
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    rng = {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
           "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
    if trainer.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(trainer.device)
    state = {
        "format": FORMAT, "precision": trainer.precision,
        "step": trainer.step, "tokens": trainer.tokens, "last_reinit": trainer.last_reinit,
        "args": {k: _jsonable(v) for k, v in vars(trainer.args).items()},
        "model": model,
        "master": master,
        "optimizer": {"state": {str(i): s for i, s in opt["state"].items()},
                      "param_groups": opt["param_groups"]},
        "scheduler": trainer.scheduler.state_dict(),
        "sampler": trainer.sampler.state_dict(),
        "monitor": monitor,
        "rng": rng,
    }
    state_files.write(trainer.ckpt_path, state)
    trainer.dist.barrier()  # the others wait: nothing runs on while it is written
    trainer.ckpt_time = time.monotonic() - t
    trainer.paused_s += trainer.ckpt_time


# ---- checks ------------------------------------------------------------------------------------

def _type(x):
    return "a tensor" if torch.is_tensor(x) else type(x).__name__


def _keys(x):
    """A dict's keys (briefly), else its type: what a message says it got."""
    return repr(sorted(x))[:80] if isinstance(x, dict) else _type(x)


def _count(x, where, low=0):
    if type(x) is not int or x < low:
        raise InputError(where, f"an integer >= {low}", repr(x)[:40])
    return x


def check_tensors(got, want, where, same_dtype=True):
    """`got` (name -> tensor) has exactly the names and shapes of `want` (and its dtypes, or where
    same_dtype is False one floating dtype throughout); InputError naming the first difference."""
    if not isinstance(got, dict):
        raise InputError(where, "named tensors", _type(got))
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise InputError(where, f"the {len(want)} tensors of this model",
                         f"{len(missing)} missing {repr(missing[:3])[:120]}, {len(extra)} "
                         f"others {repr(extra[:3])[:120]}")
    dtypes = set()
    for k, w in want.items():
        g = got[k]
        if not torch.is_tensor(g) or g.shape != w.shape or (same_dtype and g.dtype != w.dtype):
            raise InputError(f"{where}: {k}", f"a {w.dtype} tensor of shape {list(w.shape)}",
                             f"a {g.dtype} tensor of shape {list(g.shape)}" if torch.is_tensor(g)
                             else _type(g))
        dtypes.add(g.dtype)
    if not same_dtype and (len(dtypes) > 1 or not all(d.is_floating_point for d in dtypes)):
        raise InputError(where, "tensors of one floating dtype", sorted(map(str, dtypes)))


def _conform(saved, mine, where):
    """`saved` (read from JSON) shaped as `mine` (this run's own state): the same keys, list
    lengths and value types, finite numbers, tensors of the same shape and dtype; tuples come
    back as tuples."""
    if torch.is_tensor(mine):
        check_tensors({"tensor": saved}, {"tensor": mine}, where)
        return saved
    if isinstance(mine, dict):
        if not isinstance(saved, dict) or set(saved) != set(mine):
            raise InputError(where, f"the keys {sorted(mine)}", _keys(saved))
        return {k: _conform(saved[k], mine[k], f"{where}.{k}") for k in mine}
    if isinstance(mine, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(mine):
            got = f"{len(saved)} items" if isinstance(saved, list) else _type(saved)
            raise InputError(where, f"a list of {len(mine)}", got)
        return type(mine)(_conform(s, m, f"{where}[{i}]")
                          for i, (s, m) in enumerate(zip(saved, mine)))
    if type(saved) is not type(mine) or (isinstance(saved, float) and not math.isfinite(saved)):
        raise InputError(where, type(mine).__name__, repr(saved)[:40])
    return saved


# ---- resume ------------------------------------------------------------------------------------

def _check_args(state, trainer):
    """Refuses a checkpoint of another run; returns the warning for changed arguments (or
    None)."""
    saved = state.get("args")
    if not isinstance(saved, dict):
        raise InputError(f"--resume: {trainer.ckpt_path}: args", "a JSON object", _type(saved))
    mine = {k: _jsonable(v) for k, v in vars(trainer.args).items()}
    wrong = [k for k in SAME_ON_RESUME if saved.get(k) != mine.get(k)]
    if wrong:
        raise InputError("--resume", "a checkpoint made with this run's " + ", ".join(
            f"--{k.replace('_', '-')} {mine.get(k)!r}" for k in wrong),
            f"{trainer.ckpt_path}, made with " + ", ".join(
            repr(saved.get(k))[:40] for k in wrong))
    if state.get("precision") != trainer.precision:
        raise InputError("--resume", f"a checkpoint of precision {trainer.precision} (this run's "
                         f"on {trainer.device.type}; see --precision)",
                         f"{trainer.ckpt_path}, of precision {state.get('precision')!r}"[:200])
    from twell.train import cli

    # An argument newer than the checkpoint counts as its default there (--dist none, ...).
    defaults = {k: _jsonable(v) for k, v in vars(cli.parser().parse_args([])).items()}
    saved = {k: saved.get(k, defaults.get(k)) for k in mine}
    changed = [k for k in mine if k not in ("resume", "max_minutes", "stop_at", "out",
                                            "no_checkpoint")
               and saved.get(k) != mine[k]]
    return ("WARNING: resuming with changed " + ", ".join(
        f"--{k.replace('_', '-')} {repr(saved.get(k))[:40]} -> {mine[k]!r}" for k in changed)
        if changed else None)


def _optimizer_state(saved, trainer, where):
    """The optimizer's state_dict from `saved`, checked against this run's optimizer."""
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        raise InputError(where, "the keys ['param_groups', 'state']", _keys(saved))
    mine = trainer.optimizer.state_dict()["param_groups"]
    if not isinstance(saved["param_groups"], list) or len(saved["param_groups"]) != len(mine):
        raise InputError(f"{where}.param_groups", f"a list of {len(mine)}",
                         _type(saved["param_groups"]))
    groups = []
    for i, (s, m) in enumerate(zip(saved["param_groups"], mine)):
        # Flags (bool or None: fused, foreach, ...) are this run's; the numbers come back.
        numbers = {k: v for k, v in m.items() if not isinstance(v, (bool, type(None)))}
        s = {k: v for k, v in s.items() if k in numbers} if isinstance(s, dict) else s
        got = _conform(s, numbers, f"{where}.param_groups[{i}]")
        if got["params"] != m["params"]:
            raise InputError(f"{where}.param_groups[{i}].params", f"{m['params'][:4]}...",
                             f"{got['params'][:4]}...")
        groups.append(dict(m, **got))
    if not isinstance(saved["state"], dict):
        raise InputError(f"{where}.state", "a JSON object", _type(saved["state"]))
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    state = {}
    for key, s in saved["state"].items():
        if not key.isdigit() or int(key) >= len(params):
            raise InputError(f"{where}.state", f"parameter indices below {len(params)}",
                             repr(key)[:40])
        p = params[int(key)]
        shapes = {"step": ([], torch.float32), "exp_avg": (list(p.shape), p.dtype),
                  "exp_avg_sq": (list(p.shape), p.dtype)}
        if not isinstance(s, dict) or set(s) != set(shapes):
            raise InputError(f"{where}.state[{key}]", f"the keys {sorted(shapes)}", _keys(s))
        for k, (shape, dtype) in shapes.items():
            t = s[k]
            if not torch.is_tensor(t) or list(t.shape) != shape or t.dtype != dtype:
                raise InputError(f"{where}.state[{key}].{k}", f"a {dtype} tensor of shape {shape}",
                                 f"a {t.dtype} tensor of shape {list(t.shape)}"
                                 if torch.is_tensor(t) else _type(t))
        state[int(key)] = s
    return {"state": state, "param_groups": groups}


def _restore_rng(rng, trainer, where):
    if not isinstance(rng, dict) or not {"torch", "python", "numpy"} <= set(rng):
        raise InputError(where, "the keys ['numpy', 'python', 'torch']", _keys(rng))
    torch_state = _conform(rng["torch"], torch.get_rng_state(), f"{where}.torch")
    py, npy = rng["python"], rng["numpy"]
    try:
        if not (isinstance(py, list) and len(py) == 3 and isinstance(py[1], list)):
            raise TypeError("expected [version, [625 integers], gauss]")
        if not (isinstance(npy, list) and len(npy) == 5 and isinstance(npy[1], list)
                and all(type(k) is int and 0 <= k < 1 << 32 for k in npy[1])):
            raise TypeError("expected [name, [624 integers below 2^32], pos, has_gauss, gauss]")
        py_state = (py[0], tuple(py[1]), py[2])
        np_state = (npy[0], np.asarray(npy[1], dtype=np.uint32), *npy[2:])
        random.setstate(py_state)
        np.random.set_state(np_state)
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"{where}.python/numpy", "Python and NumPy generator states",
                         f"{type(e).__name__}: {e}") from None
    torch.set_rng_state(torch_state)
    if "cuda" in rng and trainer.device.type == "cuda":
        mine = torch.cuda.get_rng_state(trainer.device)
        torch.cuda.set_rng_state(_conform(rng["cuda"], mine, f"{where}.cuda"), trainer.device)


def load(trainer, say):
    """Restores the checkpoint of trainer.out into a freshly built Trainer of the same
    arguments; InputError for anything in it that does not fit this run."""
    folder = find(trainer.out)
    where = f"--resume: {folder}"
    state = state_files.read(folder, where)
    if state.get("format") != FORMAT:
        raise InputError(where, f"a python -m twell.train checkpoint (format {FORMAT!r})",
                         f"format {state.get('format')!r}"[:80])
    warning = _check_args(state, trainer)
    step, tokens, last_reinit = (_count(state.get(k), f"{where}: {k}")
                                 for k in ("step", "tokens", "last_reinit"))
    check_tensors(state.get("model"), model_state.weights_spec(trainer), f"{where}: model")
    master = state.get("master")
    master_spec = model_state.master_spec(trainer)
    if master_spec is None:
        if master is not None:
            raise InputError(f"{where}: master", "none (this run keeps no master weights)",
                             _type(master))
    else:
        check_tensors(dict(enumerate(master)) if isinstance(master, list) else master,
                      dict(enumerate(master_spec)), f"{where}: master")
    optimizer = _optimizer_state(state.get("optimizer"), trainer, f"{where}: optimizer")
    scheduler = _conform(state.get("scheduler"), trainer.scheduler.state_dict(),
                         f"{where}: scheduler")
    sampler = _conform(state.get("sampler"), trainer.sampler.state_dict(), f"{where}: sampler")
    _count(sampler["position"], f"{where}: sampler.position")
    try:
        trainer.sampler.load_state_dict(sampler)
        trainer.monitor.load_state_dict(state.get("monitor"))
    except InputError as e:
        raise e.within(where) from None
    model_state.load_weights(trainer, state["model"], master)
    model_state.load_optimizer(trainer, optimizer)
    trainer.scheduler.load_state_dict(scheduler)
    _restore_rng(state.get("rng"), trainer, f"{where}: rng")
    trainer.step, trainer.tokens, trainer.last_reinit = step, tokens, last_reinit
    if trainer.dist.main:
        _truncate_log(trainer)
    if warning:
        say(warning)


def _truncate_log(trainer):
    """Drops log records past the checkpoint (written after it by a run that then died)."""
    if not os.path.lexists(trainer.log_path):
        return
    keep = []
    for line in files.read_text(trainer.log_path, f"--out {trainer.log_path}").splitlines(True):
        rec = next(files.json_records(line), None)
        if rec is None:
            continue
        step = rec.get("step", 0)
        if rec.get("kind") in ("log", "end") and (type(step) is not int or step > trainer.step):
            continue
        keep.append(line)
    with open(trainer.log_path, "w") as f:
        f.writelines(keep)


def read(folder):
    """A checkpoint folder's format, step, precision, args (twell.train's command line, checked
    as it checks its own) and model (name -> CPU tensor), for use outside a Trainer; InputError
    naming the folder for anything else."""
    from twell.train import cli

    where = f"checkpoint {folder}"
    state = state_files.read(folder, where, keys=("format", "step", "precision", "args",
                                                  "model"))
    if state.get("format") != FORMAT:
        raise InputError(where, f"a python -m twell.train checkpoint (format {FORMAT!r})",
                         f"format {state.get('format')!r}"[:80])
    _count(state.get("step"), f"{where}: step")
    try:
        state["args"] = cli.checked_args(state.get("args"))
    except InputError as e:
        raise e.within(f"{where}: its arguments") from None
    model = state.get("model")
    if not isinstance(model, dict) or not all(torch.is_tensor(t) for t in model.values()):
        raise InputError(f"{where}: model", "named tensors", _type(model))
    return state
