"""Sparsity tracking: L0 per layer and dead units over a token window, and re-initialisation of
the gate rows of dead units.

While started, the tracker observes every forward of every twell FFN of a model (a forward hook):
it counts, per unit, the tokens for which the unit was active (relu(x W1^T) > 0 with W1 the gate,
or up for a plain FFN) and sums the layer's L0. A unit that was active for no token of a window of
at least `window` tokens is dead. Counts stay on the device.

Where the forward is a training forward whose twell::ffn_train node is reachable from the
module's output, the counts are the op's own, read from the state it saved for backward
(twell.torch.saved): no GEMM for the rows it keeps (every row of the dense form, the compact rows
of the compact form), a GEMM on x over the rows it does not (the compact form's routed rows; on
CUDA, reading their count is one host synchronisation per forward). Elsewhere (inference and
validation forwards, torch.compile, a CUDA graph's capture of a compact-form forward, a state of
unknown size) one extra [M, N] GEMM per forward computes them.
"""
import math

import torch
import torch.nn.functional as F

from twell.torch import saved
from twell.torch.modules import sparse_modules

# The fractions of a layer's units whose share of the hits hot_share reports: how concentrated
# the firing is (uniform firing gives each fraction its own size; trained models' neuron rates
# spread over orders of magnitude, so their most active units carry far more).
HOT_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


class SparsityTracker:
    def __init__(self, model, window=4096):
        self.window = window
        self.layers = dict(sparse_modules(model))
        self._hooks = []
        self._hits, self._tokens, self._l0_sum = {}, {}, {}
        self.reset()
        self.start()

    def start(self):
        if not self._hooks:
            self._hooks = [m.register_forward_hook(self._observe(n)) for n, m in self.layers.items()]
            for m in self.layers.values():  # a split module keeps its hot gate values for us
                m._hot_gate_readers = m.__dict__.get("_hot_gate_readers", 0) + 1
        return self

    def stop(self):
        for h in self._hooks:
            h.remove()
        if self._hooks:
            for m in self.layers.values():
                m._hot_gate_readers = max(0, m.__dict__.get("_hot_gate_readers", 0) - 1)
                m.__dict__.pop("_hot_gate", None)
        self._hooks = []
        return self

    def reset(self, names=None):
        """Starts a new window (for the named layers, default all)."""
        for n in self.layers if names is None else names:
            self._hits[n] = None
            self._tokens[n] = 0
            self._l0_sum[n] = None

    def _observe(self, name):
        def hook(module, args, output):
            with torch.no_grad():
                state = None if torch.compiler.is_compiling() else saved.find(module, output)
                hot_gate = module.__dict__.pop("_hot_gate", None)  # one reader takes it
                if state is not None:
                    hits, rows = state.unit_hits(), state.rows
                    if module.hot_units:  # the op saw the cold units; the hot ones ran dense
                        if hot_gate is None:  # another tracker took it
                            x = args[0].detach().reshape(-1, module.hidden_size)
                            hot_gate = F.linear(x, module.first_weight.detach()[-module.hot_units:])
                        hits = torch.cat([hits, saved.positive_counts(hot_gate)])
                else:
                    x = args[0].detach().reshape(-1, module.hidden_size)
                    hits = saved.positive_counts(F.linear(x, module.first_weight.detach()))
                    rows = x.shape[0]
                l0 = module.l0 * rows
            self._hits[name] = hits if self._hits[name] is None else self._hits[name] + hits
            self._l0_sum[name] = l0 if self._l0_sum[name] is None else self._l0_sum[name] + l0
            self._tokens[name] += rows
        return hook

    def tokens(self, name):
        return self._tokens[name]

    def hits(self, name):
        """int64 [N]: per unit of layer `name`, the window's tokens it was active for (None before
        any forward), in the module's unit order (what split_hot takes)."""
        return self._hits[name]

    def dead(self, name):
        """Bool mask [N] of the layer's dead units, or None while its window is not full."""
        if self._tokens[name] < self.window or self._hits[name] is None:
            return None
        return self._hits[name] == 0

    def hot_share(self, name, fractions=HOT_FRACTIONS):
        """[share of the window's hits (active (token, unit) pairs) carried by the ceil(f N) most
        active units, for f in fractions], or None before any hit (host values: synchronises)."""
        return hot_share(self._hits[name], fractions)

    def summary(self):
        """{layer: {"tokens", "l0" (mean active units per token), "dead" (count or None),
        "dead_fraction", "hot_share" (hot_share's)}} (host values: synchronises with the
        device)."""
        out = {}
        for n, m in self.layers.items():
            tokens = self._tokens[n]
            dead = self.dead(n)
            out[n] = {
                "tokens": tokens,
                "l0": float(self._l0_sum[n]) / tokens if tokens else None,
                "dead": int(dead.sum()) if dead is not None else None,
                "dead_fraction": float(dead.float().mean()) if dead is not None else None,
                "hot_share": self.hot_share(n),
            }
        return out

    @torch.no_grad()
    def reinit_dead(self, std=None, generator=None):
        """Re-initialises the gate rows (up rows for a plain FFN) of the dead units of every layer
        whose window is full, from N(0, std) (default: the standard deviation of the live rows),
        then starts a new window for those layers. Returns {layer: units re-initialised}."""
        done = {}
        for n, m in self.layers.items():
            dead = self.dead(n)
            if dead is None:
                continue
            w = m.first_weight
            count = int(dead.sum())
            if count:
                live = w[~dead] if count < len(dead) else w
                scale = std if std is not None else live.float().std().item()
                fresh = torch.randn((count, w.shape[1]), generator=generator, device=w.device,
                                    dtype=torch.float32) * scale
                w[dead] = fresh.to(w.dtype)
            done[n] = count
            self.reset([n])
        return done


def hot_share(hits, fractions=HOT_FRACTIONS):
    """Per fraction f: the share of sum(hits) that the ceil(f N) largest of the N counts hold
    (None where hits is None or sums to 0)."""
    if hits is None:
        return None
    counts = hits.double().sort(descending=True).values
    total = float(counts.sum())
    if total <= 0:
        return None
    cumulative = counts.cumsum(0)
    n = counts.numel()
    out = []
    for f in fractions:
        if not 0 < f <= 1:
            raise ValueError(f"hot_share: fractions must lie in (0, 1], got {f}")
        top = min(n, max(1, math.ceil(round(f * n, 9))))
        out.append(float(cumulative[top - 1]) / total)
    return out
