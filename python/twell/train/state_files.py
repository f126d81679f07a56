"""A nested state (dicts with string keys, lists, numbers, strings, None and torch tensors) on
disk without pickle: a folder holding tensors.safetensors (every tensor, under its path in the
state, e.g. "optimizer/state/3/exp_avg") and state.json (the rest, each tensor replaced by
{"__tensor__": its key}). Reading either runs no code: safetensors is a JSON header and raw
bytes, and state.json is parsed strictly, refused over files.JSON_LIMIT before parsing and
nested over MAX_DEPTH levels after.

Writing is atomic: FOLDER.tmp is written and synced, then an existing FOLDER moves to
FOLDER.old, FOLDER.tmp becomes FOLDER and FOLDER.old goes. A reader finding no FOLDER but a
FOLDER.old (a writer stopped between the two renames) reads FOLDER.old, the last complete one.
"""
import json
import math
import os
import shutil

from twell.train import files
from twell.train.files import InputError

STATE, TENSORS = "state.json", "tensors.safetensors"
TENSOR = "__tensor__"
MAX_DEPTH = 64  # levels of nesting in state.json (a state has a few; reading recurses per level)
PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; a pickle of protocol >= 2


def looks_like_pickle(path):
    """Whether the file starts as torch.save's output or a pickle does (read, never unpickled)."""
    try:
        return files.read_head(path, str(path), 4).startswith(PICKLE_MAGIC)
    except InputError:
        return False


def is_state_folder(folder):
    return os.path.isdir(folder) and os.path.lexists(os.path.join(folder, STATE))


def locate(folder):
    """The folder to read for `folder` (itself, or FOLDER.old after an interrupted write), or
    None where neither holds a state."""
    for candidate in (folder, folder + ".old"):
        if is_state_folder(candidate):
            return candidate
    return None


def _split(obj, tensors, key):
    """obj with its tensors moved into `tensors` (CPU, contiguous) under their paths."""
    import torch

    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().to("cpu").contiguous()
        return {TENSOR: key}
    if isinstance(obj, dict):
        if TENSOR in obj or not all(isinstance(k, str) for k in obj):
            raise TypeError(f"state {key!r}: keys must be strings other than {TENSOR!r}")
        return {k: _split(v, tensors, f"{key}/{k}" if key else k) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split(v, tensors, f"{key}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"state {key!r}: {obj} is not a finite number")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"state {key!r}: {type(obj).__name__} is not a JSON value or a tensor")


def _sync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(folder, state):
    """Writes `state` (a dict) to `folder` atomically (see the module's docstring)."""
    from safetensors.torch import save_file

    tensors = {}
    doc = _split(state, tensors, "")
    tmp, old = folder + ".tmp", folder + ".old"
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, TENSORS))
    _sync(os.path.join(tmp, TENSORS))
    with open(os.path.join(tmp, STATE), "w") as f:
        json.dump(doc, f, allow_nan=False, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    _sync(tmp)
    if os.path.isdir(folder):
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.replace(folder, old)
    os.replace(tmp, folder)
    _sync(os.path.dirname(os.path.abspath(folder)))
    if os.path.lexists(old):
        shutil.rmtree(old)


def _nests_within(doc, limit):
    """Whether no dict or list in `doc` lies more than `limit` levels deep (doc itself: 1),
    found without recursion."""
    stack = [(doc, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return True


def _join(obj, source, where):
    """obj with each {"__tensor__": key} replaced by that tensor of `source`."""
    if isinstance(obj, dict):
        if TENSOR in obj:
            key = obj[TENSOR]
            if len(obj) != 1 or not isinstance(key, str):
                raise InputError(f"{where}/{STATE}", f'tensor references {{"{TENSOR}": key}}',
                                 f"{json.dumps(obj)[:80]}")
            return source(key)
        return {k: _join(v, source, where) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, source, where) for v in obj]
    return obj


def read(folder, where, keys=None):
    """The state in `folder` (a dict; only its top-level `keys` where given, and only their
    tensors read), tensors on the CPU; InputError naming `where` for anything that is not a
    state this module wrote."""
    from safetensors import SafetensorError, safe_open

    doc = files.read_json(os.path.join(folder, STATE), f"{where}/{STATE}")
    if not isinstance(doc, dict):
        raise InputError(f"{where}/{STATE}", "a JSON object", type(doc).__name__)
    if not _nests_within(doc, MAX_DEPTH):
        raise InputError(f"{where}/{STATE}", f"JSON nested at most {MAX_DEPTH} levels deep",
                         "deeper nesting")
    if keys is not None:
        doc = {k: doc[k] for k in keys if k in doc}
    path = os.path.join(folder, TENSORS)
    files.check_regular(path, f"{where}/{TENSORS}")
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            names = set(f.keys())

            def source(key):
                if key not in names:
                    raise InputError(f"{where}/{TENSORS}", f"a tensor {key!r}", "none")
                return f.get_tensor(key)

            return _join(doc, source, where)
    except (SafetensorError, TypeError, RuntimeError) as e:
        raise InputError(f"{where}/{TENSORS}", "a readable safetensors file",
                         f"{type(e).__name__}: {e}") from None
