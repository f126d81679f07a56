"""Per-layer sparsity figures of a model's twell FFNs during training, for the log.

  density      mean active units per token / N (the modules' `l0`) over the training forwards of
               a log interval (and, apart, over validation)
  dead         units active for no token over a window of `window` tokens (SparsityTracker); the
               count of the last closed window (None until one closes)
  hot_share    per fraction f of twell.torch.tracker.HOT_FRACTIONS, the share of the last closed
               window's active (token, unit) pairs that its ceil(f N) most active units carry (how
               concentrated the firing is; None until a window closes)
  sparse_form  fraction of the interval's training forwards that saved the compact (sparse) state;
               the rest saved the dense form (CUDA: the dense cuBLAS path, every row dense)
  sparse_rows  fraction of the interval's rows the sparse kernels carried: rows of compact-form
               forwards not routed to the dense backup (a row is routed when a tile of it has more
               active units than the tile's capacity: 16 of 256 by default, sized down to 4 where
               automatic dispatch on CUDA follows the density)

The form and routed rows are read from the state each forward saves for backward (the autograd
node of twell::ffn_train, twell.torch.saved): its size tells the form (twell.layout.saved_bytes),
its num_routed array the routed rows (the single-buffer form of docs/format.md: values, backup,
cols, counts, row_slot, routed_rows, num_routed, each 16-byte aligned). No host synchronisation
except in `collect`.

Over validation (inference) forwards, `collect("eval")` gives the density and
  dead         units active for no validation token (one extra [M, N] GEMM per forward: the
               tracker's on inference forwards); a small sample next to the training window, so
               it counts rare units too
  hot_share    as above, over the validation tokens
  ran_dense    fraction of the validation forwards that twell's inference dispatch ran dense
               (the modules' `ran_dense`: CPU, dense above 3.5% density or torch's dense MLP
               where it measured faster; CUDA, where it measured dense faster)

Several ranks (twell.train.distributed: `group`): every figure is reduced over the ranks (sums of
the L0 sums, calls, rows and hits) before it is computed, so it is the one-process figure of the
global batch; the dead-unit window closes when the ranks together have seen `window` tokens, its
hits summed over ranks, and re-initialisation (FSDP2: on sharded weights, reinit_dead_sharded)
draws the same values on every rank.
"""
import contextlib

import torch

import twell.torch as tt
from twell.torch import saved
from twell.torch.hot import set_unit_order
from twell.torch.tracker import HOT_FRACTIONS, hot_share
from twell.train.files import InputError


@torch.no_grad()
def reinit_dead_sharded(tracker, dtype):
    """SparsityTracker.reinit_dead (default std, global generator) for gate weights that are FSDP2
    DTensors sharded over their rows: the same draws as one process holding the weights in
    `dtype` (the std of its live rows in `dtype`, the new rows rounded to `dtype`), each rank
    writing its rows. Every rank calls it (it gathers each layer's gate weight)."""
    from twell.train import distributed

    done = {}
    for n, m in tracker.layers.items():
        dead = tracker.dead(n)
        if dead is None:
            continue
        w = m.first_weight
        count = int(dead.sum())
        if count:
            whole = distributed.full(w)
            rounded = whole.to(dtype)
            live = rounded[~dead] if count < len(dead) else rounded
            scale = live.float().std().item()
            fresh = torch.randn((count, whole.shape[1]), device=whole.device,
                                dtype=torch.float32) * scale
            whole[dead] = fresh.to(dtype).to(whole.dtype)
            w.to_local().copy_(distributed.shard_like(whole, w).to_local())
        done[n] = count
        tracker.reset([n])
    return done


class LayerMonitor:
    def __init__(self, model, window, track_dead=True, group=None):
        self.group = group
        self.world = group.world if group is not None else 1
        self.rank = group.rank if group is not None else 0
        self._muted = False
        self.layers = tt.sparse_modules(model)
        self.names = [n for n, _ in self.layers]
        self.window = window
        self.tracker = (tt.SparsityTracker(model, window=window)
                        if self.layers and track_dead and window > 0 else None)
        # Units never active over the validation forwards (window 0: dead = no hit so far).
        self.val_tracker = tt.SparsityTracker(model, window=0).stop() if self.layers else None
        self.dead = [None] * len(self.layers)
        self.hot_share = [None] * len(self.layers)  # the last closed window's, per layer
        self.dead_windows = 0  # windows closed so far
        self.training = True
        self._hooks = [m.register_forward_hook(self._observe(i))
                       for i, (_, m) in enumerate(self.layers)]
        self.reset_interval()

    def reset_interval(self, split="train"):
        n = len(self.layers)
        acc = {"l0": [None] * n, "calls": [0] * n, "compact": [0] * n, "known": [0] * n,
               "rows": [0] * n, "compact_rows": [0] * n, "routed": [None] * n,
               "dense_calls": [0] * n, "dispatch_calls": [0] * n}
        if split == "train":
            self._train = acc
        else:
            self._eval = acc
            if self.val_tracker is not None:
                self.val_tracker.reset()

    def set_training(self, training):
        """Training forwards feed the interval figures and the dead-unit windows; validation
        forwards only the validation density."""
        self.training = training
        if self.tracker is not None:
            (self.tracker.start if training else self.tracker.stop)()
        if self.val_tracker is not None:
            (self.val_tracker.stop if training else self.val_tracker.start)()
        for _, m in self.layers:
            m.record_dispatch = not training
        if not training:
            self.reset_interval("eval")

    @contextlib.contextmanager
    def muted(self):
        """Forwards inside are not counted (FSDP2's extra validation forwards)."""
        tracking = self.val_tracker is not None and bool(self.val_tracker._hooks)
        if tracking:
            self.val_tracker.stop()
        self._muted = True
        try:
            yield
        finally:
            self._muted = False
            if tracking:
                self.val_tracker.start()

    def _observe(self, i):
        def hook(module, args, out):
            if self._muted:
                return
            acc = self._train if self.training else self._eval
            if module.l0 is not None:
                acc["l0"][i] = module.l0 if acc["l0"][i] is None else acc["l0"][i] + module.l0
                acc["calls"][i] += 1
            if module.ran_dense is not None:
                acc["dispatch_calls"][i] += 1
                acc["dense_calls"][i] += int(module.ran_dense)
            state = saved.find(module, out) if self.training else None
            if state is None:
                return
            acc["known"][i] += 1
            acc["rows"][i] += state.rows
            # The compact form at the capacity whose size the state has (automatic dispatch sizes
            # a default capacity to the density), else the dense form.
            if state.dense:
                return
            acc["compact"][i] += 1
            acc["compact_rows"][i] += state.rows
            routed = state.num_routed()
            acc["routed"][i] = routed if acc["routed"][i] is None else acc["routed"][i] + routed
        return hook

    def collect(self, split="train"):
        """{"density": [...], "sparse_form": [...], "sparse_rows": [...]} per layer (None where
        nothing was seen) over the interval (synchronises), and starts a new interval; for
        split="eval" also "dead" and "ran_dense" (see the module's docstring) and "tokens"."""
        acc = self._reduced(self._train if split == "train" else self._eval)
        out = {"density": [], "sparse_form": [], "sparse_rows": []}
        if split != "train":
            out.update(self._eval_figures(acc))
        for i, (_, m) in enumerate(self.layers):
            calls = acc["calls"][i]
            out["density"].append(float(acc["l0"][i]) / calls / m.intermediate_size
                                  if calls else None)
            known = acc["known"][i]
            out["sparse_form"].append(acc["compact"][i] / known if known else None)
            routed = float(acc["routed"][i]) if acc["routed"][i] is not None else 0.0
            out["sparse_rows"].append((acc["compact_rows"][i] - routed) / acc["rows"][i]
                                      if known and acc["rows"][i] else None)
        self.reset_interval(split)
        return out

    def _sum(self, t):
        return self.group.sum_(t) if self.world > 1 else t

    def _device(self):
        return self.group.device if self.group is not None and self.group.device is not None \
            else self.layers[0][1].up_proj.weight.device

    _COUNTS = ("calls", "compact", "known", "rows", "compact_rows", "dense_calls",
               "dispatch_calls")

    def _reduced(self, acc):
        """An interval's figures summed over ranks (itself for one process)."""
        if self.world == 1 or not self.layers:
            return acc
        n, keys = len(self.layers), self._COUNTS
        t = torch.zeros(n, 2 + len(keys), dtype=torch.float64, device=self._device())
        for i in range(n):
            for j, k in enumerate(("l0", "routed")):
                if acc[k][i] is not None:
                    t[i, j] = acc[k][i]
        t[:, 2:] = torch.tensor([[acc[k][i] for k in keys] for i in range(n)],
                                dtype=torch.float64)
        rows = self._sum(t).tolist()
        out = {k: [int(r[2 + j]) for r in rows] for j, k in enumerate(keys)}
        out["l0"] = [r[0] if r[2] else None for r in rows]
        out["routed"] = [r[1] for r in rows]
        return out

    def _summed_hits(self, tracker):
        """({layer: hits summed over ranks}, {layer: tokens summed over ranks}) of a tracker's
        window (a rank without hits counts zeros)."""
        device = self._device()
        hits = [tracker._hits[n] if tracker._hits[n] is not None else
                torch.zeros(m.intermediate_size, dtype=torch.int64, device=device)
                for n, m in self.layers]
        flat = self._sum(torch.cat(hits + [torch.tensor([tracker._tokens[n] for n in self.names],
                                                        dtype=torch.int64, device=device)]))
        parts = flat.split([m.intermediate_size for _, m in self.layers] + [len(self.names)])
        tokens = [int(t) for t in parts[-1].tolist()]
        return dict(zip(self.names, parts[:-1])), dict(zip(self.names, tokens))

    def _eval_figures(self, acc):
        out = {"dead": [], "hot_share": [], "ran_dense": [], "tokens": 0}
        summary = self.val_tracker.summary() if self.val_tracker is not None else {}
        if self.world > 1 and self.val_tracker is not None:
            hits, tokens = self._summed_hits(self.val_tracker)
            summary = {n: {"tokens": tokens[n], "dead": int((hits[n] == 0).sum()),
                           "hot_share": hot_share(hits[n])} for n in self.names}
        for i, name in enumerate(self.names):
            s = summary.get(name, {})
            out["dead"].append(s.get("dead") if s.get("tokens") else None)
            out["hot_share"].append(s.get("hot_share") if s.get("tokens") else None)
            calls = acc["dispatch_calls"][i]
            out["ran_dense"].append(acc["dense_calls"][i] / calls if calls else None)
            out["tokens"] = max(out["tokens"], s.get("tokens", 0))
        return out

    def window_full(self):
        # Every rank sees as many tokens (equal slices of each batch): the ranks' count is this
        # rank's times the world size.
        return self.tracker is not None and all(
            self.tracker.tokens(n) * self.world >= self.window for n in self.names)

    def close_window(self, reinit=False, generator=None, dtype=None):
        """Records the dead units of the full window (hits summed over ranks), then
        re-initialises them (reinit=True, see SparsityTracker.reinit_dead; reinit_dead_sharded
        for FSDP2's sharded weights, `dtype` the weights' compute dtype) or just starts a new
        window. Returns {layer: bool mask of the dead units} (the units re-initialised when
        reinit)."""
        if self.world > 1:
            hits, tokens = self._summed_hits(self.tracker)
            self.tracker._hits.update(hits)
            self.tracker._tokens.update(tokens)
        masks = {n: self.tracker.dead(n).clone() for n in self.names}
        self.last_hits = {n: self.tracker.hits(n).clone() for n in self.names}
        self.dead = [int(masks[n].sum()) for n in self.names]
        self.hot_share = [self.tracker.hot_share(n) for n in self.names]
        self.dead_windows += 1
        from twell.train import distributed
        if reinit and distributed.is_sharded(self.layers[0][1].first_weight):
            reinit_dead_sharded(self.tracker, dtype or torch.float32)
        elif reinit:
            self.tracker.reinit_dead(generator=generator)
        else:
            self.tracker.reset()
        return masks

    def dead_fraction(self):
        return [None if d is None else d / m.intermediate_size
                for d, (_, m) in zip(self.dead, self.layers)]

    # The tracker keeps its window in private fields; a checkpoint saves and restores them so a
    # resumed run closes (and re-initialises) windows at the same steps as an uninterrupted one.
    def state_dict(self):
        """The windows' state (the ranks' sums: a checkpoint resumes on any number of ranks;
        every rank calls it)."""
        state = {"dead": self.dead, "dead_windows": self.dead_windows,
                 "hot_share": self.hot_share,
                 # split_hot's: the hot units are the last hot_units of the saved weights
                 "hot_units": [m.hot_units for _, m in self.layers],
                 "unit_order": {n: getattr(m, "unit_order", None) for n, m in self.layers}}
        if self.tracker is not None:
            t = self.tracker
            state["tracker"] = {"hits": dict(t._hits), "tokens": dict(t._tokens),
                                "l0_sum": dict(t._l0_sum)}
            if self.world > 1:
                started = any(t._hits[n] is not None for n in self.names)
                hits, tokens = self._summed_hits(t)
                l0 = {n: self._sum(t._l0_sum[n].clone() if t._l0_sum[n] is not None else
                                   torch.zeros((), device=self._device())) for n in self.names}
                # None where no rank has seen a token since the window started (as one process)
                state["tracker"] = {
                    "hits": {n: hits[n] if started else None for n in self.names},
                    "tokens": tokens,
                    "l0_sum": {n: l0[n] if started else None for n in self.names}}
        return state

    def load_state_dict(self, state):
        """Restores state_dict()'s output (tensors on any device); InputError naming the part of
        a state that does not fit this model's layers."""
        sizes = [m.intermediate_size for _, m in self.layers]
        if not isinstance(state, dict):
            raise InputError("monitor", "a JSON object", type(state).__name__)
        dead, windows = state.get("dead"), state.get("dead_windows")
        if not (isinstance(dead, list) and len(dead) == len(sizes) and all(
                d is None or (type(d) is int and 0 <= d <= n) for d, n in zip(dead, sizes))):
            raise InputError("monitor.dead", f"{len(sizes)} dead-unit counts (null or 0 to N)",
                             repr(dead)[:60])
        if type(windows) is not int or windows < 0:
            raise InputError("monitor.dead_windows", "an integer >= 0", repr(windows)[:40])
        hot = state.get("hot_share", [None] * len(sizes))  # absent from older checkpoints
        if not (isinstance(hot, list) and len(hot) == len(sizes) and all(
                h is None or (isinstance(h, list) and len(h) == len(HOT_FRACTIONS) and all(
                    type(v) in (int, float) and 0 <= v <= 1 for v in h)) for h in hot)):
            raise InputError("monitor.hot_share", f"{len(sizes)} lists of {len(HOT_FRACTIONS)} "
                             "shares in [0, 1] (or null)", repr(hot)[:60])
        tracker = state.get("tracker")
        restored = (self._tracker_state(tracker, sizes)
                    if self.tracker is not None and tracker is not None else None)
        if restored is not None and self.world > 1:
            restored = self._share(*restored)
        units = state.get("hot_units", [0] * len(sizes))
        if not (isinstance(units, list) and len(units) == len(sizes) and all(
                type(u) is int and 0 <= u < n and u % 8 == 0 for u, n in zip(units, sizes))):
            raise InputError("monitor.hot_units", f"{len(sizes)} multiples of 8 from 0 to N - 1",
                             repr(units)[:60])
        orders = state.get("unit_order") or {}
        if not isinstance(orders, dict):
            raise InputError("monitor.unit_order", "{layer: permutation or null}",
                             type(orders).__name__)
        orders = [orders.get(name) for name in self.names]
        for name, o, n in zip(self.names, orders, sizes):
            if o is not None and not (torch.is_tensor(o) and o.dim() == 1 and o.numel() == n
                                      and not o.is_floating_point()
                                      and torch.equal(o.sort().values.cpu(), torch.arange(n))):
                raise InputError(f"monitor.unit_order[{name}]", f"a permutation of 0..{n - 1}",
                                 repr(o)[:60])
        for (_, m), u, o in zip(self.layers, units, orders):
            m.hot_units = u
            if o is not None:
                set_unit_order(m, o.to(m.up_proj.weight.device))
        self.dead, self.dead_windows, self.hot_share = list(dead), windows, list(hot)
        if restored is not None:
            for field, values in zip(("_hits", "_tokens", "_l0_sum"), restored):
                getattr(self.tracker, field).update(values)

    def _share(self, hits, tokens, l0_sum):
        """A saved window's (the ranks' sums) share of this rank: the token count split evenly
        (every rank counts as many), the hits and L0 sum on rank 0 (zeros elsewhere)."""
        for name, t in tokens.items():
            if t % self.world:
                raise InputError(f"monitor.tracker.tokens[{name}]", f"a multiple of the "
                                 f"world size {self.world}", t)
        tokens = {n: t // self.world for n, t in tokens.items()}
        if self.rank != 0:
            hits = {n: None if h is None else torch.zeros_like(h) for n, h in hits.items()}
            l0_sum = {n: None if s is None else torch.zeros_like(s) for n, s in l0_sum.items()}
        return hits, tokens, l0_sum

    def _tracker_state(self, tracker, sizes):
        """(hits, tokens, l0_sum) per layer from a saved tracker state, checked, on the model's
        device."""
        if not isinstance(tracker, dict) or set(tracker) != {"hits", "tokens", "l0_sum"} or not all(
                isinstance(v, dict) and set(v) == set(self.names) for v in tracker.values()):
            raise InputError("monitor.tracker", f"hits, tokens and l0_sum of layers {self.names}",
                             repr(tracker)[:80])
        device = self.layers[0][1].up_proj.weight.device
        hits, tokens, l0_sum = {}, {}, {}
        for name, n in zip(self.names, sizes):
            h, t, s = (tracker[k][name] for k in ("hits", "tokens", "l0_sum"))
            if h is not None and not (torch.is_tensor(h) and h.dtype == torch.int64
                                      and list(h.shape) == [n]):
                raise InputError(f"monitor.tracker.hits[{name}]", f"an int64 tensor [{n}]",
                                 repr(h)[:60])
            if type(t) is not int or t < 0:
                raise InputError(f"monitor.tracker.tokens[{name}]", "an integer >= 0", repr(t)[:40])
            if s is not None and not (torch.is_tensor(s) and s.dtype.is_floating_point
                                      and s.dim() == 0):
                raise InputError(f"monitor.tracker.l0_sum[{name}]", "a floating scalar tensor",
                                 repr(s)[:60])
            hits[name] = None if h is None else h.to(device)
            tokens[name] = t
            l0_sum[name] = None if s is None else s.to(device)
        return hits, tokens, l0_sum

    def remove(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for tracker in (self.tracker, self.val_tracker):
            if tracker is not None:
                tracker.stop()
        for _, m in self.layers:
            m.record_dispatch = False
