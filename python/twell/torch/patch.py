"""Swap the MLPs of a Hugging Face Llama / Qwen2 / Mistral model (or any model whose MLP modules
have gate_proj, up_proj, down_proj and act_fn) for twell modules, in place, and back.

twell is exact for ReLU FFNs only. A SiLU model is refused unless activation="relu" is asked for,
which changes the model's function (for training from scratch or fine-tuning into a ReLU model):
the MLPs' act_fn and config.hidden_act become ReLU.
"""
from torch import nn

from twell.torch.modules import SparseGatedMLP, check_l1_coef, sparse_modules

_ACTIVATIONS = ("relu",)


def _is_mlp(module):
    return all(isinstance(getattr(module, n, None), nn.Linear)
               for n in ("gate_proj", "up_proj", "down_proj")) and hasattr(module, "act_fn")


def _activation_name(module, config):
    if isinstance(module.act_fn, nn.ReLU):
        return "relu"
    name = type(module.act_fn).__name__
    hidden_act = getattr(config, "hidden_act", None)
    return f"{hidden_act} ({name})" if isinstance(hidden_act, str) and hidden_act != "relu" else name


def _configs(model):
    config = getattr(model, "config", None)
    return [c for c in (config, getattr(config, "text_config", None)) if c is not None]


def _check(name, mlp, activation, config):
    if not name:
        raise ValueError("patch_model: the model itself is an MLP; use SparseGatedMLP directly")
    biased = [n for n in ("gate_proj", "up_proj", "down_proj")
              if getattr(mlp, n).bias is not None]
    if biased:
        raise ValueError(f"{name}: twell FFNs have no bias, but {', '.join(biased)} has one")
    current = _activation_name(mlp, config)
    if activation is None and current != "relu":
        raise ValueError(
            f"{name}: the activation is {current}, not ReLU; twell computes ReLU FFNs exactly and "
            f"cannot run this model sparsely. Pass activation='relu' to switch the model to ReLU "
            f"(this changes its function: train from scratch or fine-tune)")


def patch_model(model, activation=None, *, l1_coef=0.0, tile=0, capacity=0, dispatch="auto",
                dense_above=-1.0):
    """Replaces every MLP of `model` by a SparseGatedMLP sharing its nn.Linear modules (same
    parameters, same state dict). Returns the number replaced. Checks every MLP (and l1_coef: a
    finite number >= 0) before changing any."""
    check_l1_coef(l1_coef)
    if activation is not None and activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected None or one of {_ACTIVATIONS}, got {activation!r}")
    configs = _configs(model)
    config = configs[0] if configs else None
    found = [(name, module) for name, module in model.named_modules() if _is_mlp(module)]
    if not found:
        raise ValueError("patch_model: no MLP with gate_proj, up_proj, down_proj (nn.Linear) and "
                         "act_fn in this model")
    for name, mlp in found:
        _check(name, mlp, activation, config)
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
