"""bench/model.py --hot-units H: each twell FFN's H most active units run dense (twell.torch.hot).

The hot units are chosen from one forward of calibration tokens (the checkpoint's second
validation batch; for a synthetic model, its first two input rows) with twell's modules in place,
counted by a SparsityTracker; each layer's share of the calibration's active (token, unit) pairs
that its hot units carry goes into the rows."""
import torch

import twell.torch as tt


def split(model, swap, calib_ids, units):
    """Splits every twell FFN of `model` (swap's, in place) at `units` hot units chosen on
    `calib_ids`; returns the hot units' share of the calibration's active pairs per layer."""
    swap.use("twell")
    tracker = tt.SparsityTracker(model, window=0)
    with torch.no_grad():
        model(calib_ids, use_cache=False, logits_to_keep=1)
    tracker.stop()
    hits = {name: tracker.hits(name) for name, _ in swap.sparse}
    tt.split_hot(model, hits, units)
    shares = []
    for name, _ in swap.sparse:
        h = hits[name].double()
        top = h.sort(descending=True).values[:units].sum()
        shares.append(float(top / h.sum()) if h.sum() > 0 else None)
    return shares


def note(row):
    """The report line's note on hot units ("" without them)."""
    if not row.get("hot_units"):
        return ""
    known = [s for s in row["hot_share"] if s is not None]
    span = f"{min(known):.2f}-{max(known):.2f}" if known else "n/a"
    return f"; {row['hot_units']} hot units a layer (calibration share {span})"
