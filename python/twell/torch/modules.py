"""SparseGatedMLP and SparseMLP: drop-in FFN modules running on the twell ops.

Parameters and state dicts are those of a Llama MLP (gate_proj, up_proj, down_proj nn.Linear
weights, no bias). With autograd recording and a parameter or the input requiring grad, forward
runs the training op: it records `l0` (mean active units per token, detached) and
`l1_loss` = l1_coef * (1/M) sum |h| over its M tokens, a differentiable term (the function
`l1_loss(model)` averages them over the layers: add that to the loss; docs/training.md states the
definition). `l1_coef` (constructor or attribute) must be a finite number >= 0 (ValueError
otherwise). x must be [..., hidden_size] in the weights' dtype, on their device (a twell.TwellError,
a ValueError, names it otherwise).
Otherwise it runs the inference op and records `l0` only, and, where `record_dispatch` is set
(False by default: it costs a plan look-up per call), `ran_dense`: whether twell's dispatch ran
that call on the dense path (on the CPU: any block of its rows, or torch's dense MLP, which plain
eager CPU calls with dispatch "auto" run where it measured faster: twell.torch._cpu_paths); None
after a training forward
(whose path the size of the saved state tells, see twell.train.sparsity) and inside
torch.compile.

Plain eager calls (no compiler, tracer or Python dispatch mode) run the ops' bodies directly,
skipping the custom ops' dispatch (host time that a decoding step's kernels do not cover; in
training, an autograd Function around the same forward and backward bodies); the plan, the
result, the saved state and the recorded state are the ops'.
`dispatch` ("auto", "sparse", "dense") applies to both: inference picks its path per call,
training the form of the state saved for backward (CUDA, "auto": the plan's timing dispatch,
compact at low density, dense cuBLAS above `dense_above` or where it measured faster). Inside
torch.compile the training op saves the compact form, whose size the shapes alone decide.
With `torch.use_deterministic_algorithms(True)` both ops run with twell.Determinism.deterministic
(reruns bit-identical); otherwise fast, whose backup rows may round differently once the plan has
learned to send them through cuBLAS (exact to the dtype either way).
"""
import math
import weakref

import torch
from torch import nn

from twell.torch import _ops  # noqa: F401  (registers torch.ops.twell)
from twell.torch import _cpu_paths, _plans, hot


# module -> (options, weights, their addresses, plan) of its last eager inference call (kept off
# the module itself, which stays picklable and deep-copyable).
_HELD_PLANS = weakref.WeakKeyDictionary()


def check_l1_coef(value):
    """`value` as a float if it is a finite number >= 0 (the rule of the C++ TrainingOptions), else
    ValueError."""
    try:
        coef = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"l1_coef: expected a finite number >= 0, got {value!r}") from None
    if not (math.isfinite(coef) and coef >= 0):
        raise ValueError(f"l1_coef: expected a finite number >= 0, got {value!r}")
    return coef


class _SparseFFN(nn.Module):
    record_dispatch = False  # set True on a module to record `ran_dense` after inference calls
    hot_units = 0  # the last hot_units units run dense (split_hot; twell.torch.hot)

    def __init__(self, hidden_size, intermediate_size, gated, *, l1_coef=0.0, tile=0, capacity=0,
                 dispatch="auto", dense_above=-1.0, device=None, dtype=None):
        super().__init__()
        kw = {"bias": False, "device": device, "dtype": dtype}
        if gated:
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)
        self.gated = gated
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.l1_coef = l1_coef
        self.tile = tile
        self.capacity = capacity
        self.dispatch = dispatch
        self.dense_above = dense_above
        self.l0 = None
        self.l1_loss = None
        self.ran_dense = None

    @property
    def l0(self):
        """Mean active units per token of the last call (a 0-d tensor on the call's device), or
        None. An eager inference call keeps the op's counters and divides here, on first read:
        that costs the call no torch operations."""
        d = self.__dict__
        counts = d.get("_l0_counts")
        if counts is not None:  # the op's counter tensor, or (0, active) of torch's dense way
            active = counts[1]
            if not isinstance(active, torch.Tensor):
                active = torch.tensor(float(active))
            d["_l0"] = active.float() / max(d["_l0_rows"], 1)
            d["_l0_counts"] = None
        return d.get("_l0")

    @l0.setter
    def l0(self, value):
        self.__dict__.update(_l0=value, _l0_counts=None)

    @property
    def l1_coef(self):
        return self._l1_coef

    @l1_coef.setter
    def l1_coef(self, value):
        self._l1_coef = check_l1_coef(value)

    @property
    def first_weight(self):
        """The weight whose ReLU decides which units are active (gate, or up for a plain FFN)."""
        return self.gate_proj.weight if self.gated else self.up_proj.weight

    def freeze(self):
        """Keeps a neuron-major copy of down_proj.weight for inference (instead of transposing it
        at every call): fast, but inference then ignores later changes of down_proj.weight until
        freeze() is called again. Training never uses the copy."""
        self.register_buffer("down_nk", self.down_proj.weight.detach().t().contiguous(),
                             persistent=False)
        self.__dict__.pop("_down_kn_copy", None)
        _HELD_PLANS.pop(self, None)  # held beside the previous copy
        return self

    def unfreeze(self):
        self.down_nk = None
        self.__dict__.pop("_down_kn_copy", None)
        _HELD_PLANS.pop(self, None)
        return self

    def _weights(self):
        return (self.gate_proj.weight if self.gated else None), self.up_proj.weight

    def _check_input(self, x, up):
        """x: [..., K] (K = hidden_size, the weights' row length) in the weights' dtype, on their
        device: a reshape alone would run an input whose last dimension is a multiple of K as more
        rows."""
        op = type(self).__name__
        if x.dim() == 0 or x.shape[-1] != up.shape[-1]:
            raise _ops.error(op, "x", f"[..., hidden_size={up.shape[-1]}]", str(list(x.shape)))
        if x.dtype != up.dtype:
            raise _ops.error(op, "x", f"{_ops.dtype_name(up.dtype)} (the weights' dtype)",
                             _ops.dtype_name(x.dtype))
        if x.device != up.device:
            raise _ops.error(op, "x", f"a tensor on {up.device} (the weights' device)",
                             str(x.device))

    def split_hot(self, units, hits, optimizer=None):
        """Runs the `units` units with the most `hits` dense, the rest through twell
        (twell.torch.hot.split_hot: permutes the units, leaving the function unchanged)."""
        return hot.split_hot(self, units, hits, optimizer)

    def forward(self, x):
        gate, up = self._weights()
        self._check_input(x, up)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        training = torch.is_grad_enabled() and (x.requires_grad or any(
            p.requires_grad for p in self.parameters()))
        # Compiled graphs size the training state from shapes alone: the compact form.
        dispatch = "sparse" if training and torch.compiler.is_compiling() else self.dispatch
        if self.hot_units:
            return hot.forward(self, x2, training, dispatch).reshape(shape)
        if training:
            y, _, stats = _ops.train(x2, gate, up, self.down_proj.weight, self.tile,
                                     self.capacity, dispatch, self.dense_above)
            self.l0 = stats[0].detach()
            self.l1_loss = self.l1_coef * stats[1]
            self.ran_dense = None
        else:
            y = self._infer(x2, gate, up)
        return y.reshape(shape)

    def _infer(self, x2, gate, up):
        """An inference call: the op (compiled, traced), or its body on the plan; plain eager CPU
        calls with dispatch "auto" may run torch's dense MLP instead where it measured faster
        (twell.torch._cpu_paths)."""
        down = getattr(self, "down_nk", None)
        frozen = down is not None
        plan = None
        if not _ops.plain_eager(x2):
            if not frozen:  # a new copy each call; the op's plan is rebound to it (_plans)
                down = self.down_proj.weight.detach().t().contiguous()
            args = (x2, gate, up, down, self.tile, self.capacity, self.dispatch, self.dense_above)
            y, counters = torch.ops.twell.ffn(*args)
            # Kept, divided on first read (l0): no tensor operation in a compiled graph.
            self._l0_counts, self._l0_rows = counters, x2.shape[0]
            self.l1_loss, self.ran_dense = None, None
        else:
            def plan_call():
                nonlocal plan, down
                if not frozen:
                    down = self.down_proj.weight.detach().t().contiguous()
                plan = self._eager_plan(gate, up, down, frozen)
                return _ops.run_ffn_eager(plan, x2)

            by_torch = False
            if x2.is_cuda or not _cpu_paths.applies(self.dispatch, x2):
                y, counters = plan_call()
            else:  # CPU: the plan or torch's dense MLP, whichever measured faster
                paths = self.__dict__.get("_cpu_paths")
                if paths is None:
                    paths = self.__dict__["_cpu_paths"] = _cpu_paths.Paths()
                y, counters, by_torch = _cpu_paths.run(paths, plan_call, x2, gate, up,
                                                       lambda: self._down_kn(frozen))
            # nn.Module.__setattr__ and l0's division cost as much host time as the kernels
            self.__dict__.update(_l0_counts=counters, _l0_rows=x2.shape[0], l1_loss=None,
                                 ran_dense=True if by_torch and self.record_dispatch else None)
            if by_torch:
                return y
        if self.record_dispatch and not torch.compiler.is_compiling():
            # The op's plan (cached, found again by the same weights and options) knows its
            # last decision on the host: no device synchronisation.
            if plan is None:
                plan = _plans.inference_plan(gate, up, down, self.tile, self.capacity,
                                             self.dispatch, self.dense_above)
            self.ran_dense = plan.last_run().ran_dense
        return y

    def _down_kn(self, frozen):
        """down for torch's dense MLP, [K, N] contiguous: down_proj.weight, or for a frozen module
        a copy of its frozen down_nk, as its plan computes with that whatever happened to the
        weight since (made on the first such call, dropped by freeze() and unfreeze(); a [K, N]
        view of down_nk would be exact too, but ~15% slower in bf16 over a few rows here)."""
        if not frozen:
            return self.down_proj.weight
        held = self.__dict__.get("_down_kn_copy")
        if held is None or held[0] is not self.down_nk:  # .to() and the like replace down_nk
            held = self.__dict__["_down_kn_copy"] = (self.down_nk, self.down_nk.t().contiguous())
        return held[1]

    def _eager_plan(self, gate, up, down, keep):
        """The op's cached plan for these weights, found once per weight set: where `keep` (down
        is the frozen down_nk, not a per-call copy, which the cache rebinds the plan to) the
        module keeps it beside the weights it was found for (identity and address), skipping the
        cache's look-up on every call."""
        options = _plans.inference_options(self.tile, self.capacity, self.dispatch, self.dense_above)
        held = _HELD_PLANS.get(self)
        if held is not None and held[0] == options and all(
                a is b and a.data_ptr() == p for a, b, p in zip(held[1], (gate, up, down), held[2])
                if b is not None):
            # another caller on the same gate and up (a compiled call) may have rebound it
            return _plans.bound_to(held[3], gate, up, down)
        plan = _plans.inference_plan(gate, up, down, self.tile, self.capacity, self.dispatch,
                                     self.dense_above)
        if keep:
            weights = (gate, up, down)
            ptrs = tuple(t.data_ptr() if t is not None else 0 for t in weights)
            _HELD_PLANS[self] = (options, weights, ptrs, plan)
        return plan

    def extra_repr(self):
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"l1_coef={self.l1_coef}, tile={self.tile}, capacity={self.capacity}, "
                f"dispatch={self.dispatch!r}" + (f", hot_units={self.hot_units}"
                                                 if self.hot_units else ""))


class SparseGatedMLP(_SparseFFN):
    """y = down(relu(gate(x)) * up(x)), exactly, with twell's sparse kernels."""

    def __init__(self, hidden_size, intermediate_size, **kwargs):
        super().__init__(hidden_size, intermediate_size, True, **kwargs)


class SparseMLP(_SparseFFN):
    """y = down(relu(up(x))), exactly, with twell's sparse kernels."""

    def __init__(self, hidden_size, intermediate_size, **kwargs):
        super().__init__(hidden_size, intermediate_size, False, **kwargs)


def sparse_modules(model):
    """(name, module) for every twell FFN module in `model`."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _SparseFFN)]


_REDUCTIONS = ("mean", "sum")


def l1_loss(model, reduction="mean"):
    """The L1 term to add to the loss: over the twell FFNs of `model` whose last forward was a
    training forward (each recorded l1_coef * (1/M) sum |h|; L of them), the mean of their terms
    ("mean", the default: (1/L) sum over layers, the paper's released code's reduction, so its
    coefficients carry over whatever the depth) or their sum ("sum"). 0.0 when none recorded one.
    Gradients are exact either way: each layer's term gets the upstream gradient 1/L (or 1)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction: expected one of {_REDUCTIONS}, got {reduction!r}")
    terms = [m.l1_loss for _, m in sparse_modules(model) if m.l1_loss is not None]
    if not terms:
        return 0.0
    total = sum(terms)
    return total / len(terms) if reduction == "mean" else total


def freeze(model):
    """freeze() every twell FFN of `model` (fast inference, CUDA-graph capture); returns it."""
    for _, m in sparse_modules(model):
        m.freeze()
    return model


def l0_per_layer(model):
    """{name: mean active units per token} of the last forward of every twell FFN (host floats;
    this synchronises with the device)."""
    return {n: float(m.l0) for n, m in sparse_modules(model) if m.l0 is not None}
