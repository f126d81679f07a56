"""bench/model.py --hot-units H: each twell FFN's H most active units run dense (twell.torch.hot).

The hot units are chosen from one forward of calibration tokens (the checkpoint's second
validation batch; for a synthetic model, its first two input rows) with twell's modules in place,
counted by a SparsityTracker; each layer's share of the calibration's active (token, unit) pairs
that its hot units carry goes into the rows. --hot-units auto: each layer's H is the fastest of
twell.torch.hot.CANDIDATES (0 among them) on its own calibration input (choose_hot_units: a
training step where training rows are asked for, else a forward)."""
import torch

import twell.torch as tt
from twell.torch.tracker import hot_share


def split(model, swap, calib_ids, units, training=False):
    """Splits every twell FFN of `model` (swap's, in place) at `units` hot units ("auto": each
    layer's fastest) chosen on `calib_ids`; returns (per layer: the hot units' share of the
    calibration's active pairs, the hot units)."""
    swap.use("twell")
    tracker = tt.SparsityTracker(model, window=0)
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: inputs.__setitem__(
        name, args[0].detach())) for name, m in swap.sparse] if units == "auto" else []
    with torch.no_grad():
        model(calib_ids, use_cache=False, logits_to_keep=1)
    tracker.stop()
    for h in hooks:
        h.remove()
    hits = {name: tracker.hits(name) for name, _ in swap.sparse}
    if units == "auto":
        for name, m in swap.sparse:
            tt.choose_hot_units(m, inputs[name], training=training)
    else:
        tt.split_hot(model, units, hits)
    shares = [hot_share(hits[name], (m.hot_units / m.intermediate_size,)) if m.hot_units else [0.0]
              for name, m in swap.sparse]
    return [s[0] if s else None for s in shares], [m.hot_units for _, m in swap.sparse]


def note(row):
    """The report line's note on hot units ("" without them)."""
    if not row.get("hot_units"):
        return ""
    known = [s for s in row["hot_share"] if s is not None]
    span = f"{min(known):.2f}-{max(known):.2f}" if known else "n/a"
    units = row["hot_units_per_layer"]
    what = f"{units[0]}" if len(set(units)) == 1 else "/".join(str(u) for u in units)
    return f"; hot units a layer {what} ({row['hot_units']}; calibration share {span})"
