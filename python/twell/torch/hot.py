"""Hot units run dense: a twell FFN split into its most active units and the rest.

A trained model's neuron firing rates spread over orders of magnitude: a tenth of a layer's units
often carries most of its active (token, unit) pairs (SparsityTracker.hot_share measures it). An
FFN is a sum over its units, so it splits exactly:

    y = FFN(x; cold units) + FFN(x; hot units)

where the H hot units run as three dense GEMMs (torch, cuBLAS: no gathers, tensor cores) and the
N - H cold ones through twell's sparse kernels, at the density they leave. The split is a
permutation of the units, which leaves the function unchanged: split_hot moves the hot units to
the end of the parameters (gate and up rows, down columns; an optimizer's per-parameter state
alike), so the state dict stays a Llama MLP's and the model computes what it did, up to the
rounding of adding two bf16 / fp16 partial outputs. `unit_order` maps the module's units to the
indices they had before any split.

What stays the same: `l0` and `l1_loss` count every unit (the hot units' active count and sum |h|
added to the op's), SparsityTracker counts every unit (the op's saved state for the cold units,
the hot gate's values for the hot ones), dead units are re-initialised in the module's own order.
Whether a split is faster depends on how concentrated the firing is and on H (the GEMMs over H
units run far below cuBLAS's peak unless H is a multiple of 64); bench/hot_units.py measures it,
and choose_hot_units times the candidates on a module's own input and keeps the fastest (0, the
unsplit module, among them), as twell's dispatch keeps the faster path.
"""
import statistics

import torch
import torch.nn.functional as F

from twell.torch import _ops, _plans
from twell.torch.saved import positive_counts
from twell.torch._timing import time_ms as _time_ms


def unit_hits(module, x):
    """int64 [N]: per unit, the rows of x [M, K] it is active for (relu(x W1^T) > 0)."""
    with torch.no_grad():
        return positive_counts(F.linear(x, module.first_weight))


def check_hits(module, hits):
    n = module.intermediate_size
    if not torch.is_tensor(hits) or hits.dim() != 1 or hits.numel() != n or hits.is_complex() \
            or hits.dtype == torch.bool:
        got = (f"a {hits.dtype} tensor of shape {list(hits.shape)}" if torch.is_tensor(hits)
               else type(hits).__name__)
        raise ValueError(f"split_hot: hits: expected a real tensor of shape [{n}] (a count per "
                         f"unit, e.g. SparsityTracker.hits(name)), got {got}")
    if hits.is_floating_point() and not torch.isfinite(hits).all():
        raise ValueError("split_hot: hits: expected finite counts, got NaN or Inf")


@torch.no_grad()
def split_hot(module, units, hits, optimizer=None):
    """Makes the `units` units with the most `hits` (a count per unit, in the module's current
    order; ties keep the lower index) the module's hot units, run dense from now on (0: none,
    every unit through twell). Permutes the parameters (and, given `optimizer`, each of their
    state tensors of the parameter's shape, e.g. Adam's moments) so that those units come last.
    Returns the permutation (new unit j is old unit perm[j])."""
    n = module.intermediate_size
    if type(units) is not int or not 0 <= units < n or units % 8:
        raise ValueError(f"split_hot: units: expected a multiple of 8 in [0, {n - 1}] (at least "
                         "one unit stays sparse; the CUDA kernels take unit counts in steps of 8 "
                         f"and cuBLAS runs the hot units' GEMMs best in steps of 64), got {units!r}")
    check_hits(module, hits)
    device = module.up_proj.weight.device
    hot = torch.zeros(n, dtype=torch.bool)
    hot[hits.detach().to("cpu", torch.float64).argsort(descending=True, stable=True)[:units]] = True
    perm = torch.cat([(~hot).nonzero().flatten(), hot.nonzero().flatten()]).to(device)
    rows = [module.up_proj.weight] + ([module.gate_proj.weight] if module.gated else [])
    for p, dim in [(w, 0) for w in rows] + [(module.down_proj.weight, 1)]:
        permute_units(p, perm, dim)
        if p.grad is not None:
            permute_units(p.grad, perm, dim)
        if optimizer is not None:
            for v in optimizer.state.get(p, {}).values():
                if torch.is_tensor(v) and v.shape == p.shape:
                    permute_units(v, perm, dim)
    order = getattr(module, "unit_order", None)
    set_unit_order(module, (order.to(device) if order is not None
                            else torch.arange(n, device=device))[perm])
    if getattr(module, "down_nk", None) is not None:
        module.freeze()  # the neuron-major copy in the new order
    module.hot_units = units
    return perm


def set_unit_order(module, order):
    """module.unit_order: a buffer (it moves with .to()) left out of the state dict."""
    module.register_buffer("unit_order", order, persistent=False)


def clone(module):
    """A new module of `module`'s class, options, weights and split: no hooks, no recorded state
    of earlier calls (a training call's l1_loss cannot be deep-copied)."""
    m = module
    out = type(m)(m.hidden_size, m.intermediate_size, l1_coef=m.l1_coef, tile=m.tile,
                  capacity=m.capacity, dispatch=m.dispatch, dense_above=m.dense_above,
                  device=m.up_proj.weight.device, dtype=m.up_proj.weight.dtype)
    with torch.no_grad():
        for (_, a), (_, b) in zip(out.named_parameters(), m.named_parameters()):
            a.copy_(b)
            a.requires_grad_(b.requires_grad)
    out.hot_units = m.hot_units
    if getattr(m, "unit_order", None) is not None:
        set_unit_order(out, m.unit_order.clone())
    if getattr(m, "down_nk", None) is not None:
        out.freeze()
    return out


def permute_units(t, perm, dim):
    """t's slices along `dim` in the order `perm` (split_hot's), in place: for copies of a
    module's parameters that split_hot does not know (fp32 master weights and their state)."""
    t.copy_(t.index_select(dim, perm.to(t.device)))


def forward(module, x2, training, dispatch):
    """The split module's forward over x2 [M, K] (contiguous): the cold units through the twell op,
    the hot ones dense; records l0, l1_loss, ran_dense (and, training, the hot gate values the
    tracker counts) as the module's forward does. Returns y [M, K]."""
    m = module
    c, hot = m.intermediate_size - m.hot_units, m.hot_units
    # torch.split: one backward node per weight that concatenates the two parts' gradients
    # (two slices would each materialise a full-size gradient, then add them).
    up_c, up_h = m.up_proj.weight.split([c, hot])
    down_c, down_h = m.down_proj.weight.split([c, hot], dim=1)
    gate_c, gate_h = m.gate_proj.weight.split([c, hot]) if m.gated else (None, None)
    rows = x2.shape[0]
    g = F.linear(x2, gate_h if m.gated else up_h)
    h = F.relu(g)
    if m.gated:
        h = h * F.linear(x2, up_h)
    y_hot = F.linear(h, down_h)
    active = (g.detach() > 0).sum()
    if training:
        y, _, stats = _ops.train(x2, gate_c, up_c, down_c, m.tile, m.capacity, dispatch,
                                 m.dense_above)
        m.l0 = stats[0].detach() + active / max(rows, 1)
        l1 = torch.linalg.vector_norm(h, 1, dtype=torch.float32) / max(rows, 1)
        m.l1_loss = m.l1_coef * (stats[1] + l1)
        m.ran_dense = None
        # For a SparsityTracker's hook, which takes it: g is [M, H], more than autograd keeps of
        # the hot part, so only a module a tracker watches keeps it, until the hook runs.
        m._hot_gate = g.detach() if m.__dict__.get("_hot_gate_readers") else None
    else:
        frozen = getattr(m, "down_nk", None)
        down_nk = frozen[:c] if frozen is not None else down_c.detach().t().contiguous()
        y, counters = torch.ops.twell.ffn(x2, gate_c, up_c, down_nk, m.tile, m.capacity,
                                          dispatch, m.dense_above)
        m.l0 = (counters[1] + active).float() / max(rows, 1)
        m.l1_loss, m.ran_dense, m._hot_gate = None, None, None
        if m.record_dispatch and not torch.compiler.is_compiling():
            plan = _plans.inference_plan(gate_c, up_c, down_nk, m.tile, m.capacity,
                                         m.dispatch, m.dense_above)
            m.ran_dense = plan.last_run().ran_dense
    return y + y_hot


def split_model(model, units, hits, optimizer=None):
    """split_hot on every twell FFN of `model` named in `hits` ({layer name: counts}, e.g. a
    SparsityTracker's `{n: tracker.hits(n)}`) with `units` hot units each (an int, or {name: int}).
    Returns {name: permutation}. Under DDP, give every rank the same hits (summed over ranks):
    each rank permutes its own replica."""
    from twell.torch.modules import sparse_modules

    out = {}
    for name, mod in sparse_modules(model):
        if name in hits:
            count = units[name] if isinstance(units, dict) else units
            out[name] = split_hot(mod, count, hits[name], optimizer)
    return out


CANDIDATES = (0, 256, 512, 768, 1024)


def choose_hot_units(module, x, candidates=CANDIDATES, training=False, reps=5, warmup=8,
                     optimizer=None):
    """Splits `module` at the candidate hot-unit count (hot units by their activity on x [M, K])
    whose forward on x (training: forward and backward) took the least time, median of `reps`
    runs after `warmup` runs of each (CUDA events on CUDA around the device's work, the host's
    launch time hidden as a model's other layers hide it; else wall time; twell's automatic
    dispatch settles in its warm-up); 0 (no hot units) competes too. Candidates of N or more
    units, or not multiples of 8, are skipped. Returns {H: ms}, the chosen H applied (split_hot,
    `optimizer` following)."""
    n = module.intermediate_size
    counts = {int(h) for h in candidates if 0 <= int(h) < n and int(h) % 8 == 0}
    if not counts:
        raise ValueError(f"choose_hot_units: candidates: expected multiples of 8 in [0, {n - 1}], "
                         f"got {list(candidates)!r}")
    x2 = x.detach().reshape(-1, module.hidden_size)
    hits = unit_hits(module, x2)
    dy = torch.ones_like(x2) / x2.shape[1] if training else None
    ways = {}
    for h in sorted(counts | {0}):
        ways[h] = clone(module)
        apply(ways[h], h, hits)
    cuda = x2.device.type == "cuda"

    def run(way):
        if training:
            xx = x2.clone().requires_grad_()
            way(xx).backward(dy)
            for p in way.parameters():
                p.grad = None
        else:
            with torch.no_grad():
                way(x2)

    with torch.enable_grad() if training else torch.no_grad():
        for _ in range(warmup):
            for way in ways.values():
                run(way)
        times = {h: [] for h in ways}
        for _ in range(max(1, reps)):
            for h, way in ways.items():
                times[h].append(_time_ms(lambda: run(way), cuda, host_hidden=True))
    medians = {h: statistics.median(t) for h, t in times.items()}
    apply(module, min(medians, key=medians.get), hits, optimizer)
    return medians


def apply(module, units, hits, optimizer=None):
    """split_hot(units) where it changes the hot units (0: none, the units left in place)."""
    if units == 0:
        module.hot_units = 0
    elif units != module.hot_units:
        split_hot(module, units, hits, optimizer)
