"""tt.l1_loss(model): the mean over layers of each layer's l1_coef * (1/M) sum |h| (the paper's
released code's reduction; docs/training.md), or their sum with reduction="sum"."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell.torch as tt  # noqa: E402
from torch import nn  # noqa: E402

from torch_cases import module_for, problem  # noqa: E402

COEF = 0.25


class Parallel(nn.Module):
    """Layers that all see the same input (so every layer records the same L1 term)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        return sum(layer(x) for layer in self.layers)


def copies(seed, count, gated=True):
    mod = module_for(problem(seed, 24, 32, 128, gated), torch.float32, "cpu", tile=64,
                     capacity=8, l1_coef=COEF)
    return Parallel([copy.deepcopy(mod) for _ in range(count)])


def x_of(seed):
    return torch.from_numpy(problem(seed, 24, 32, 128, True).x).float().reshape(2, 12, 32)


@pytest.mark.parametrize("gated", [True, False])
def test_the_mean_does_not_depend_on_depth(seed, gated):
    """8 layers and 2 layers with identical activations: the same L1 loss, one layer's term."""
    x = x_of(seed)
    losses = {}
    for count in (1, 2, 8):
        model = copies(seed, count, gated).train()
        model(x)
        losses[count] = tt.l1_loss(model)
        torch.testing.assert_close(tt.l1_loss(model, reduction="sum"), count * losses[count])
    assert float(losses[1].detach()) > 0
    torch.testing.assert_close(losses[8], losses[1], rtol=1e-6, atol=0)
    torch.testing.assert_close(losses[2], losses[1], rtol=1e-6, atol=0)


def test_layers_without_a_term_are_not_counted(seed):
    """L counts the layers whose last forward recorded a term: a frozen layer on an input that
    needs no gradient runs the inference op and records none."""
    x = x_of(seed)
    model = copies(seed, 3).train()
    model.layers[2].requires_grad_(False)
    model.layers[1].l1_coef = 3 * COEF
    model(x)
    assert model.layers[2].l1_loss is None
    terms = [model.layers[i].l1_loss for i in (0, 1)]
    torch.testing.assert_close(tt.l1_loss(model), (terms[0] + terms[1]) / 2)
    with torch.no_grad():
        model(x)
    assert tt.l1_loss(model) == 0.0


@pytest.mark.parametrize("reduction", ["Mean", "none", None, 1])
def test_unknown_reduction_is_refused(seed, reduction):
    model = copies(seed, 2).train()
    with pytest.raises(ValueError, match="reduction: expected one of"):
        tt.l1_loss(model, reduction=reduction)
    model(x_of(seed))
    with pytest.raises(ValueError, match="reduction: expected one of"):
        tt.l1_loss(model, reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradients_are_the_reference_formulas(seed, reduction):
    """ce + tt.l1_loss(model) on a patched Llama has the gradients of the unpatched model with
    the formula written out: coef * (mean or sum over layers) of (1/M) sum over tokens and
    neurons of |relu(g) * u|, M the tokens of the batch."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from test_patch import mlps, tiny, tokens

    model = tiny("Llama", hidden_act="relu").train()
    dense = copy.deepcopy(model)
    coef = 0.05
    tt.patch_model(model, l1_coef=coef)
    ids = tokens(seed)
    terms = []

    def record(mlp, args, out):
        h = mlp.act_fn(mlp.gate_proj(args[0])) * mlp.up_proj(args[0])
        terms.append(h.abs().sum(-1).flatten().mean())

    for mlp in mlps(dense):
        mlp.register_forward_hook(record)
    ce = dense(ids, labels=ids).loss
    l1_ref = coef * (sum(terms) / len(terms) if reduction == "mean" else sum(terms))
    (ce + l1_ref).backward()
    ce_twell = model(ids, labels=ids).loss
    l1 = tt.l1_loss(model, reduction=reduction)
    torch.testing.assert_close(l1, l1_ref, rtol=1e-5, atol=0)
    (ce_twell + l1).backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_training_cli_default_is_the_released_configs():
    from twell.train.cli import parser

    assert parser().parse_args([]).l1 == 3e-4
