"""The per-layer report of twell.train, from one log record: a table (printed at each validation
and at the end) and warnings for a silent layer or one whose units are nearly all dead.

  L0, density  mean active units per token, and that over N (validation; else the training
               interval's)
  dead (val)   units active for no validation token
  dead (train) units active for no token of the last closed training window (--dead-window)
  train rows sparse  rows twell's sparse kernels carried in the interval's training forwards
               (the rest: rows routed to the dense backup, or the dense form on CUDA)
  top 10%      the share of the active (token, unit) pairs that the 10% most active units
               carry (validation; else the last closed training window): 10% is uniform firing,
               more is the concentration hot units (--hot-units) turn into speed
  inference    the path twell's inference dispatch took on the validation batches: sparse,
               dense (above 3.5% density on the CPU, 4% on CUDA, or where CUDA measured dense
               faster) or mixed
"""
from twell.torch.tracker import HOT_FRACTIONS
from twell.train import files

NEARLY_ALL_DEAD = 0.9  # a warning at this fraction of a layer's units dead
TOP10 = HOT_FRACTIONS.index(0.1)  # the log's hot_share lists a share per HOT_FRACTIONS entry


def _density(record):
    """(per-layer density, where it comes from)."""
    if record.get("val_density"):
        return record["val_density"], "validation"
    return record["density"], "training"


def _count(value, n):
    return "-" if value is None else f"{value} ({100 * value / n:.1f}%)"


def _path(ran_dense):
    if ran_dense is None:
        return "-"
    if ran_dense == 0:
        return "sparse"
    if ran_dense == 1:
        return "dense"
    return f"mixed ({100 * ran_dense:.0f}% of calls dense)"


def layer_table(names, n, record):
    """The table's lines: a header, then one line per layer."""
    density, source = _density(record)
    val_dead = record.get("val_dead") or [None] * len(names)
    ran_dense = record.get("val_ran_dense") or [None] * len(names)
    hot = record.get("val_hot_share") or record.get("hot_share") or [None] * len(names)
    width = max(len("layer"), *(len(name) for name in names))
    head = (f"  {'layer':<{width}}  {'L0':>11}  {'density':>7}  {'dead (val)':>12}  "
            f"{'dead (train)':>12}  {'train rows sparse':>17}  {'top 10%':>7}  inference")
    lines = [f"per layer at step {record['step']} (L0 and density over the {source} tokens):",
             head]
    for i, name in enumerate(names):
        d = density[i]
        l0 = "-" if d is None else f"{d * n:.1f}/{n}"
        pct = "-" if d is None else f"{100 * d:.2f}%"
        rows = record["sparse_rows"][i]
        rows = "-" if rows is None else f"{100 * rows:.0f}%"
        top = "-" if hot[i] is None else f"{100 * hot[i][TOP10]:.0f}%"
        lines.append(f"  {name:<{width}}  {l0:>11}  {pct:>7}  {_count(val_dead[i], n):>12}  "
                     f"{_count(record['dead'][i], n):>12}  {rows:>17}  {top:>7}  "
                     f"{_path(ran_dense[i])}")
    return lines


def layer_warnings(names, n, record, dead_window=None):
    """A line per layer that is silent (no unit active for any token) or has nearly all of its
    units dead; [] when none is."""
    val_density = record.get("val_density") or [None] * len(names)
    val_dead = record.get("val_dead") or [None] * len(names)
    tokens = record.get("val_tokens")
    out = []
    for i, name in enumerate(names):
        silent = [source for source, d in (("validation", val_density[i]),
                                           ("training", record["density"][i])) if d == 0.0]
        if silent:
            out.append(f"WARNING: {name} is silent: no unit was active for any "
                       f"{' or '.join(silent)} token (its FFN adds nothing); lower --l1 or "
                       "re-initialise dead units (--reinit-dead-every)")
            continue
        over = []
        if val_dead[i] is not None and val_dead[i] >= NEARLY_ALL_DEAD * n:
            over.append(f"{val_dead[i]} of {n} units never active over the "
                        + (f"{tokens:,} " if tokens else "") + "validation tokens")
        dead = record["dead"][i]
        if dead is not None and dead >= NEARLY_ALL_DEAD * n:
            over.append(f"{dead} of {n} never active over "
                        + (f"{dead_window:,} training tokens" if dead_window else
                           "the last training window"))
        if over:
            out.append(f"WARNING: {name}: nearly all units dead: {'; '.join(over)}")
    return out


def summary_line(trainer, record, val_ce):
    n = trainer.shape["intermediate"]
    parts = [f"final: loss {record['train_ce']:.4f}" if record["train_ce"] is not None
             else "final: loss n/a"]
    if val_ce is not None:
        parts.append(f"val CE {val_ce:.4f}")
    if trainer.sparse:
        parts.append("L0 per layer " + ", ".join(
            "n/a" if v is None else f"{v:.1f}" for v in record["l0"]) + f" of {n} in training"
            + (f" (mean density {100 * record['mean_density']:.2f}%)"
               if record["mean_density"] is not None else ""))
        parts.append("dead units per layer " + (
            "n/a (no window closed)" if record["dead"][0] is None else
            ", ".join(str(d) for d in record["dead"])
            + f" (over {trainer.args.dead_window:,} training tokens)"))
        if any(r is not None for r in record["sparse_rows"]):
            parts.append("twell ran sparse for " + ", ".join(
                "n/a" if r is None else f"{100 * r:.0f}%" for r in record["sparse_rows"])
                + " of training rows")
        if any(r is not None for r in record.get("val_ran_dense") or []):
            parts.append("inference ran " + ", ".join(
                "n/a" if r is None else "sparse" if r == 0 else "dense" if r == 1 else "mixed"
                for r in record["val_ran_dense"]))
    else:
        parts.append(f"L0 per layer n/a ({trainer.args.activation}, dense MLPs)")
    if record["silent"]:
        parts.append("SILENT layers (density 0): " + ", ".join(record["silent"]))
    rate = record["tokens_per_s"]
    parts.append(f"{rate:,.0f} tokens/s" if rate else "n/a tokens/s")
    return ", ".join(parts)


def layer_report(trainer, record):
    """The per-layer table and warnings of a record (twell.train.report); [] without twell
    layers."""
    if not trainer.sparse:
        return []
    names, n = trainer.monitor.names, trainer.shape["intermediate"]
    window = trainer.args.dead_window if trainer.monitor.tracker is not None else None
    return layer_table(names, n, record) + layer_warnings(names, n, record, window)


def last_record(path):
    rec = None
    for r in files.json_records(files.read_text(path, f"--out {path}")):
        if r.get("kind") == "log":
            rec = r
    return rec
