"""Swap the MLPs of a Hugging Face Llama / Qwen2 / Mistral model for twell modules, in place, and
back.

patch_model replaces only the MLP modules whose function it knows,
y = down_proj(act_fn(gate_proj(x)) * up_proj(x)): instances of transformers' LlamaMLP, Qwen2MLP
and MistralMLP, and of the classes a caller names in `extra_classes` (asserting that their
forward is that function of those four attributes). An instance qualifies only where nothing else
decides its output: its class keeps the known class's forward (a subclass that overrides it is
not known), the instance does not replace forward, neither it nor its projections carry hooks,
and gate_proj, up_proj and down_proj are plain nn.Linear modules (not a subclass with its own
forward, such as a quantised or adapter layer). Every other module with gate_proj, up_proj and
down_proj is left as it is and named, with the reason, in one warning; where none qualifies,
patch_model raises.

twell is exact for ReLU FFNs only: act_fn must be an nn.ReLU and the model config's hidden_act
(where it has one) "relu". Otherwise the model is refused unless activation="relu" is asked for,
which changes the model's function (for training from scratch or fine-tuning into a ReLU model):
the MLPs' act_fn and config.hidden_act become ReLU.
"""
import sys
import warnings

from torch import nn

from twell.torch.modules import SparseGatedMLP, _SparseFFN, check_l1_coef, sparse_modules

_ACTIVATIONS = ("relu",)
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# (module, class) of the MLPs patch_model knows; looked up among the modules already imported (a
# model of one of them has imported its module), so patching never imports transformers.
_KNOWN = (("transformers.models.llama.modeling_llama", "LlamaMLP"),
          ("transformers.models.qwen2.modeling_qwen2", "Qwen2MLP"),
          ("transformers.models.mistral.modeling_mistral", "MistralMLP"))
_FUNCTION = "down_proj(act_fn(gate_proj(x)) * up_proj(x))"


def _known_classes():
    found = [getattr(sys.modules.get(module), name, None) for module, name in _KNOWN]
    return tuple(c for c in found if c is not None)


def _check_extra(extra_classes):
    if isinstance(extra_classes, type) or not isinstance(extra_classes, (tuple, list)) or not all(
            isinstance(c, type) and issubclass(c, nn.Module) for c in extra_classes):
        raise ValueError(f"extra_classes: expected a tuple of nn.Module classes, got "
                         f"{extra_classes!r}")
    return tuple(extra_classes)


def _hooked(module):
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _own_forward(module):
    """Whether the instance replaces its class's forward (as accelerate's hooks do)."""
    return "forward" in module.__dict__


def _plain_linear(module):
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def _skip_reason(module, classes):
    """Why `module` (of a class in `classes`, or with gate_proj, up_proj and down_proj) is not
    replaced, or None."""
    cls = type(module)
    bases = [c for c in classes if isinstance(module, c)]
    if not bases:
        names = ", ".join(c.__name__ for c in classes) or "none imported"
        return (f"its class {cls.__name__} is not one patch_model knows ({names}); pass "
                f"extra_classes=({cls.__name__},) if its forward is {_FUNCTION}")
    if not any(cls.forward is c.forward for c in bases):
        return f"{cls.__name__} overrides {bases[0].__name__}.forward"
    if _own_forward(module):
        return "its forward is replaced on the instance"
    for name in _PROJECTIONS:
        part = getattr(module, name, None)
        if part is None:
            return f"it has no {name}"
        if not _plain_linear(part):
            return f"{name} is a {type(part).__name__}, not a plain nn.Linear"
        if _own_forward(part) or _hooked(part):
            return f"{name} has hooks or its own forward, which a twell module would not run"
    if _hooked(module):
        return "it has hooks, which a twell module would not run"
    if not hasattr(module, "act_fn"):
        return "it has no act_fn"
    return None


def _is_relu(act):
    return isinstance(act, nn.ReLU) and type(act).forward is nn.ReLU.forward


def _configs(model):
    config = getattr(model, "config", None)
    return [c for c in (config, getattr(config, "text_config", None)) if c is not None]


def _activation_problem(mlp, configs):
    """What makes `mlp` not a ReLU MLP (its act_fn, or a config's hidden_act), or None."""
    other = [c.hidden_act for c in configs
             if isinstance(getattr(c, "hidden_act", None), str) and c.hidden_act != "relu"]
    if not _is_relu(mlp.act_fn):
        name = type(mlp.act_fn).__name__
        return f"{other[0]} ({name})" if other else name
    return f"ReLU in act_fn but {other[0]!r} in config.hidden_act" if other else None


def _check(name, mlp, activation, configs):
    if not name:
        raise ValueError("patch_model: the model itself is an MLP; use SparseGatedMLP directly")
    biased = [n for n in _PROJECTIONS if getattr(mlp, n).bias is not None]
    if biased:
        raise ValueError(f"{name}: twell FFNs have no bias, but {', '.join(biased)} has one")
    problem = _activation_problem(mlp, configs)
    if activation is None and problem is not None:
        raise ValueError(
            f"{name}: the activation is {problem}, not ReLU; twell computes ReLU FFNs exactly and "
            f"cannot run this model sparsely. Pass activation='relu' to switch the model to ReLU "
            f"(this changes its function: train from scratch or fine-tune)")


def patch_model(model, activation=None, *, l1_coef=0.0, tile=0, capacity=0, dispatch="auto",
                dense_above=-1.0, extra_classes=()):
    """Replaces every MLP of `model` that patch_model knows (see the module's doc; `extra_classes`:
    more MLP classes, the caller asserting that their forward is
    down_proj(act_fn(gate_proj(x)) * up_proj(x))) by a SparseGatedMLP sharing its nn.Linear
    modules (same parameters, same state dict), and warns naming every other module with
    gate_proj, up_proj and down_proj, and why it was left. Returns the number replaced. Checks
    every MLP (and l1_coef: a finite number >= 0) before changing any."""
    check_l1_coef(l1_coef)
    if activation is not None and activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected None or one of {_ACTIVATIONS}, got {activation!r}")
    classes = _known_classes() + _check_extra(extra_classes)
    configs = _configs(model)
    found, skipped = [], []
    for name, module in model.named_modules():
        if isinstance(module, _SparseFFN) or not (
                isinstance(module, classes) or all(hasattr(module, n) for n in _PROJECTIONS)):
            continue
        reason = _skip_reason(module, classes)
        if reason is None:
            found.append((name, module))
        else:
            skipped.append(f"{name or 'the model'} ({reason})")
    if not found:
        left = f"; left: {'; '.join(skipped)}" if skipped else ""
        raise ValueError("patch_model: no MLP to replace (Llama, Qwen2 or Mistral MLPs, or "
                         f"extra_classes, with gate_proj, up_proj and down_proj){left}")
    for name, mlp in found:
        _check(name, mlp, activation, configs)
    if skipped:
        warnings.warn(f"patch_model: left {len(skipped)} module(s) as they are: "
                      f"{'; '.join(skipped)}", stacklevel=2)
    if activation == "relu":
        for c in configs:
            if hasattr(c, "hidden_act"):
                c.hidden_act = "relu"
    for name, mlp in found:
        if activation == "relu":
            mlp.act_fn = nn.ReLU()
        sparse = SparseGatedMLP(mlp.gate_proj.in_features, mlp.gate_proj.out_features,
                                l1_coef=l1_coef, tile=tile, capacity=capacity, dispatch=dispatch,
                                dense_above=dense_above, device="meta")
        sparse.gate_proj, sparse.up_proj, sparse.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        sparse.train(mlp.training)
        sparse.__dict__["_twell_original"] = mlp  # not a submodule: stays out of the state dict
        _set(model, name, sparse)
    return len(found)


def unpatch_model(model):
    """Puts back the modules patch_model replaced, with the twell modules' current nn.Linear
    modules. Returns the number restored."""
    found = sparse_modules(model)
    missing = [n for n, m in found if "_twell_original" not in m.__dict__]
    if missing:
        raise ValueError(f"unpatch_model: {', '.join(missing)} were not made by patch_model")
    for name, sparse in found:
        mlp = sparse.__dict__.pop("_twell_original")
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = sparse.gate_proj, sparse.up_proj, sparse.down_proj
        mlp.train(sparse.training)
        _set(model, name, mlp)
    return len(found)


def _set(model, name, module):
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)
