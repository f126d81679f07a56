"""Hot units run dense (twell.torch.hot) against twell unsplit and dense torch, per FFN layer:
an inference forward and a training step (harness rows).

For each layer (a capture's, `--from DIR`: its own weights and MLP inputs; or synthetic: bench/
op_train.py's problem with lognormal firing rates of sigma --spread at each --densities), the hot
units are chosen by their activity on calibration rows (a capture's first --calib rows; synthetic:
--calib more rows of the same distribution) and every way is timed on the other rows:
  dense   torch ops on the same weights (F.linear, ReLU, product, F.linear; autograd backward)
  twell   the unsplit twell module (automatic dispatch)
  H       the same module after split_hot(H) for each --hot value
A training step is y = mlp(x); y.backward(dy). Medians of --reps CUDA-event timings (wall clock on
the CPU) after --warmup runs of each way (automatic dispatch tries its paths), the ways
alternating. --timing device (the default) times the device's work alone, the host's launch time
hidden behind a sleeping device as a model's other layers hide it; --timing call starts each call
on an idle device, so the host's time counts too. Agreement: ||y - y_dense|| / ||y_dense|| of
each way.

Rows (suite "hot_units", one per layer, mode and H): device, source, layer, M, K, N, dtype,
density (measured rows), hot_units, hot_share (the measured rows' active pairs its hot units
carry; 0 for H = 0), mode, dense_ms, twell_ms, split_ms (median, p20, p80), speedup (dense /
split), vs_twell (twell / split), twell_ran_dense / split_ran_dense (inference: the path of the
last timed call), rel_diff, timing.

    python3 bench/hot_units.py [--from CAPTURE [--layers 0,1]] [--densities 0.009 --spread 1.8]
                               [--hot 256,512,768,1024] [--calib 4096] [--timing device|call]
                               [--out DIR]
"""
import argparse
import os
import sys

import torch

import twell.torch as tt
from twell.torch import hot

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # op_train.py, timing.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_train  # noqa: E402
from model_agreement import rel  # noqa: E402
from timing import Timer, summary, write_rows  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="capture", help="a twell.capture folder (default: synthetic)")
    p.add_argument("--layers", help="the capture's layers (comma-separated; default all)")
    p.add_argument("--m", type=int, default=16384, help="synthetic: measured rows")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--densities", default="0.009", help="synthetic: mean densities")
    p.add_argument("--spread", type=float, default=1.8,
                   help="synthetic: sigma of the lognormal firing rates (1.8: the top 10%% of "
                        "units carry ~0.7 of the active pairs)")
    p.add_argument("--calib", type=int, default=4096, help="calibration rows")
    p.add_argument("--hot", default="256,512,768,1024", help="hot units to try (comma-separated)")
    p.add_argument("--modes", default="inference,training")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--timing", choices=("device", "call"), default="device",
                   help="device: the host's launch time hidden (as inside a model); call: each "
                        "call from an idle device, host time included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    p.add_argument("--out", default="build/results", help="folder of hot_units.json")
    p.add_argument("--no-write", action="store_true")
    a = p.parse_args(argv)
    try:
        a.hot = [int(v) for v in a.hot.split(",") if v]
        a.densities = [float(v) for v in a.densities.split(",") if v]
        a.layers = None if a.layers is None else [int(v) for v in a.layers.split(",") if v]
    except ValueError:
        p.error("--hot and --layers want integers, --densities fractions, comma-separated")
    a.modes = [v for v in a.modes.split(",") if v]
    if not a.hot or min(a.hot) < 1 or any(h % 8 for h in a.hot):
        p.error("--hot wants positive unit counts, multiples of 8")
    if set(a.modes) - {"inference", "training"} or not a.modes:
        p.error("--modes wants inference and/or training")
    if a.calib < 1 or a.reps < 3 or a.warmup < 0 or a.m < 1:
        p.error("--calib and --m want at least 1 row, --reps at least 3, --warmup at least 0")
    if not all(0 < d < 1 for d in a.densities):
        p.error("--densities wants fractions in (0, 1)")
    return a


def layers(a, device, dtype):
    """(source, layer, module, calibration x, measured x) per layer to measure."""
    if a.capture:
        from twell.capture import read_layer
        from twell.train.files import InputError, read_json

        try:  # read_layer checks the manifest's dtype and each layer's files
            doc = read_json(os.path.join(a.capture, "manifest.json"), "--from")
        except InputError as e:
            sys.exit(f"hot_units: {e}")
        count = doc.get("layers") if isinstance(doc, dict) else None
        if type(count) is not int:
            sys.exit(f"hot_units: --from {a.capture}: expected a twell.capture folder (a manifest "
                     f"with its layers), got layers {count!r}")
        for i in a.layers if a.layers is not None else range(count):
            try:
                x, up, down = (read_layer(a.capture, i, n) for n in ("x", "up", "down"))
                gate = read_layer(a.capture, i, "gate") if doc.get("kind") == "gated" else None
            except InputError as e:
                sys.exit(f"hot_units: {e}")
            if x.shape[0] <= a.calib:
                sys.exit(f"hot_units: --calib {a.calib}: the capture has {x.shape[0]} rows; "
                         "leave some to measure")
            n, k = up.shape
            cls = tt.SparseGatedMLP if gate is not None else tt.SparseMLP
            mlp = cls(k, n, capacity=a.capacity, device=device, dtype=dtype)
            with torch.no_grad():
                if gate is not None:
                    mlp.gate_proj.weight.copy_(gate)
                mlp.up_proj.weight.copy_(up)
                mlp.down_proj.weight.copy_(down.t())
            x = x.to(device, dtype)
            yield f"{a.capture} layer {i}", i, mlp, x[:a.calib], x[a.calib:]
        return
    for d in a.densities:
        mlp, _, x, _ = op_train.problem(a, a.calib + a.m, d, "heavy_tailed", device, dtype,
                                        a.spread)
        x = x.detach()
        yield f"synthetic lognormal sigma {a.spread:g}, density {d:g}", None, mlp, x[:a.calib], \
            x[a.calib:]


def measure(a, mlp, x, mode, device):
    """{way: ([ms], y)} for dense, twell and each H (the ways alternating)."""
    calib, x = x
    ways = {"dense": op_train.DenseMLP(mlp), "twell": mlp}
    for h in a.hot:
        ways[h] = hot.clone(mlp)
        ways[h].split_hot(h, hot.unit_hits(mlp, calib))
    training = mode == "training"
    for name, w in ways.items():
        for p in w.parameters():
            p.requires_grad_(training)
        if name != "dense":
            w.record_dispatch = not training  # the path each inference call ran (host-side)
    dy = torch.randn(x.shape, generator=torch.Generator(device=device).manual_seed(a.seed),
                     device=device).to(x.dtype) / x.shape[1] ** 0.5
    xg = x.clone().requires_grad_(training)

    def run(w):
        if training:
            xg.grad = None
            for p in w.parameters():
                p.grad = None
            y = w(xg)
            y.backward(dy)
            return y.detach()
        with torch.no_grad():
            return w(x)

    out = {name: run(w) for name, w in ways.items()}
    for _ in range(a.warmup):
        for w in ways.values():
            run(w)
    timer = Timer(device, host_hidden=a.timing == "device")
    times = {name: [] for name in ways}
    for _ in range(a.reps):
        for name, w in ways.items():
            times[name].append(timer(lambda: run(w)))
    return {name: (times[name], out[name]) for name in ways}, ways


def main(argv=None):
    a = parse_args(argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    for source, layer, mlp, calib, x in layers(a, device, dtype):
        n = mlp.intermediate_size
        if max(a.hot) >= n:
            sys.exit(f"hot_units: --hot {max(a.hot)}: expected fewer than the layer's {n} units")
        measured_hits = hot.unit_hits(mlp, x).double()
        density = float(measured_hits.sum()) / (x.shape[0] * n)
        for mode in a.modes:
            result, ways = measure(a, mlp, (calib, x), mode, device)
            dense_ms, y_dense = result["dense"]
            twell_ms, y_twell = result["twell"]
            for h in a.hot:
                ms, y = result[h]
                order = ways[h].unit_order.to(measured_hits.device)
                share = float(measured_hits[order[-h:]].sum() / measured_hits.sum()) \
                    if measured_hits.sum() > 0 else 0.0
                d, t, s = summary(dense_ms), summary(twell_ms), summary(ms)
                rows.append({
                    "suite": "hot_units", "device": name, "source": source, "layer": layer,
                    "M": x.shape[0], "K": mlp.hidden_size, "N": n,
                    "dtype": str(dtype).replace("torch.", ""), "density": density,
                    "hot_units": h, "hot_share": share, "mode": mode,
                    "dense_ms": d, "twell_ms": t, "split_ms": s,
                    "speedup": d["median"] / s["median"], "vs_twell": t["median"] / s["median"],
                    "twell_speedup": d["median"] / t["median"],
                    # inference: whether the last timed call of twell / the split's cold part
                    # ran dense (None in training, whose form the saved state's size tells)
                    "twell_ran_dense": ways["twell"].ran_dense, "split_ran_dense": ways[h].ran_dense,
                    "rel_diff": rel(y, y_dense), "rel_diff_twell": rel(y_twell, y_dense),
                    "timing": a.timing})
                r = rows[-1]
                print(f"{source} {mode:9s} density {100 * density:.3f}% H {h:5d} (share "
                      f"{share:.2f}): dense {d['median']:.3f} ms, twell {t['median']:.3f} ms "
                      f"({r['twell_speedup']:.2f}x), split {s['median']:.3f} ms "
                      f"({r['speedup']:.2f}x, {r['vs_twell']:.2f}x twell's), rel diff "
                      f"{r['rel_diff']:.1e}", flush=True)
    if not a.no_write:
        write_rows(a.out, "hot_units.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
