"""patch_model / unpatch_model on tiny Hugging Face Llama, Qwen2 and Mistral models."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import twell.torch as tt  # noqa: E402
from torch import nn  # noqa: E402

FAMILIES = ["Llama", "Qwen2", "Mistral"]


def tiny(family, hidden_act="silu", **extra):
    config_cls = getattr(transformers, f"{family}Config")
    model_cls = getattr(transformers, f"{family}ForCausalLM")
    config = config_cls(vocab_size=64, hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        hidden_act=hidden_act, **extra)
    torch.manual_seed(0)
    return model_cls(config).eval()


def tokens(seed, batch=2, length=12):
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def mlps(model):
    return [m for m in model.modules() if hasattr(m, "gate_proj") and hasattr(m, "act_fn")]


@pytest.mark.parametrize("family", FAMILIES)
def test_silu_model_is_refused_unchanged(family):
    model = tiny(family)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"activation is silu.*activation='relu'"):
        tt.patch_model(model)
    assert not tt.sparse_modules(model)
    assert model.config.hidden_act == "silu"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("family", FAMILIES)
def test_switch_to_relu_and_round_trip(seed, family):
    model = tiny(family)
    relu_ref = copy.deepcopy(model)
    for m in mlps(relu_ref):
        m.act_fn = nn.ReLU()
    ids = tokens(seed)
    want = logits(relu_ref, ids)
    params = dict(model.named_parameters())

    assert tt.patch_model(model, activation="relu") == 2
    assert model.config.hidden_act == "relu"
    assert len(tt.sparse_modules(model)) == 2
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())  # same Parameter objects
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)

    assert tt.unpatch_model(model) == 2
    assert not tt.sparse_modules(model)
    assert torch.equal(logits(model, ids), want)
    assert all(isinstance(m.act_fn, nn.ReLU) for m in mlps(model))


def test_relu_model_patches_without_asking(seed):
    model = tiny("Llama", hidden_act="relu")
    ids = tokens(seed)
    want = logits(model, ids)
    tt.patch_model(model, l1_coef=0.01)
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)
    tt.freeze(model)
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)
    tt.unpatch_model(model)
    assert torch.equal(logits(model, ids), want)


def test_training_gradients_match_dense(seed):
    model = tiny("Llama", hidden_act="relu").train()
    dense = copy.deepcopy(model)
    tt.patch_model(model, l1_coef=0.0)
    ids = tokens(seed)
    for m in (model, dense):
        m(ids, labels=ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_l1_term_and_l0_are_recorded(seed):
    model = tiny("Llama").train()
    tt.patch_model(model, activation="relu", l1_coef=0.1)
    ids = tokens(seed)
    out = model(ids, labels=ids)
    l1 = tt.l1_loss(model)
    assert l1.requires_grad and float(l1.detach()) > 0
    (out.loss + l1).backward()
    l0 = tt.l0_per_layer(model)
    assert set(l0) == {n for n, _ in tt.sparse_modules(model)}
    assert all(0 < v <= 128 for v in l0.values())


def test_biased_mlp_is_refused():
    model = tiny("Llama", hidden_act="relu", mlp_bias=True)
    with pytest.raises(ValueError, match="bias"):
        tt.patch_model(model)


def test_model_without_mlps_is_refused():
    with pytest.raises(ValueError, match="no MLP"):
        tt.patch_model(nn.Sequential(nn.Linear(4, 4)))


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation"):
        tt.patch_model(tiny("Llama"), activation="gelu")


@pytest.mark.parametrize("l1_coef", [-1.0, float("nan"), float("inf")])
def test_bad_l1_coef_is_refused_unchanged(l1_coef):
    model = tiny("Llama", hidden_act="relu")
    with pytest.raises(ValueError, match="l1_coef: expected a finite number >= 0"):
        tt.patch_model(model, l1_coef=l1_coef)
    assert not tt.sparse_modules(model)
    assert tt.patch_model(model, l1_coef=1e-3) == 2
    assert all(m.l1_coef == 1e-3 for _, m in tt.sparse_modules(model))


def llama_mlp_class():
    from transformers.models.llama.modeling_llama import LlamaMLP
    return LlamaMLP


class PlainMLP(nn.Module):
    """A Llama-shaped MLP of a class patch_model does not know (same function)."""

    def __init__(self, mlp):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act_fn = mlp.act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def relu_model_and_logits(seed, change=None):
    """A ReLU Llama, `change(model)` applied to it, a batch and the changed model's logits."""
    model = tiny("Llama", hidden_act="relu")
    if change is not None:
        change(model)
    ids = tokens(seed)
    return model, ids, logits(model, ids)


def test_known_models_patch_without_warning(recwarn):
    assert tt.patch_model(tiny("Llama", hidden_act="relu")) == 2
    assert not [w for w in recwarn if "patch_model" in str(w.message)]


def test_subclass_with_an_extra_term_is_left_and_named(seed):
    """A LlamaMLP subclass whose forward adds a term: patching it would drop the term."""
    class Shifted(llama_mlp_class()):
        def forward(self, x):
            return super().forward(x) + 0.5 * x

    def change(model):
        model.model.layers[0].mlp.__class__ = Shifted

    model, ids, want = relu_model_and_logits(seed, change)
    with pytest.warns(UserWarning, match=r"left 1 module.*model\.layers\.0\.mlp \(Shifted "
                                         r"overrides LlamaMLP\.forward\)"):
        assert tt.patch_model(model) == 1
    assert type(model.model.layers[0].mlp) is Shifted
    assert [n for n, _ in tt.sparse_modules(model)] == ["model.layers.1.mlp"]
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)


def test_subclass_keeping_forward_is_patched(seed):
    class Renamed(llama_mlp_class()):
        pass

    def change(model):
        for m in mlps(model):
            m.__class__ = Renamed

    model, ids, want = relu_model_and_logits(seed, change)
    assert tt.patch_model(model) == 2
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)


def test_hooks_and_replaced_forwards_are_left(seed):
    """What a twell module would not run (a hook on the MLP or a projection, a forward set on the
    instance, a projection of another class) keeps that MLP as it is."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    def change(model):
        m = model.model.layers
        m[0].mlp.register_forward_hook(lambda mod, args, out: out * 3)
        m[1].mlp.up_proj.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))

    model, ids, want = relu_model_and_logits(seed, change)
    with pytest.raises(ValueError, match=r"no MLP to replace.*layers\.0\.mlp \(it has hooks.*"
                                         r"layers\.1\.mlp \(up_proj has hooks"):
        tt.patch_model(model)
    assert not tt.sparse_modules(model)
    torch.testing.assert_close(logits(model, ids), want, rtol=0, atol=0)

    def change(model):
        m = model.model.layers
        m[0].mlp.forward = lambda x: 0 * x
        m[1].mlp.down_proj.__class__ = Scaled

    model, ids, want = relu_model_and_logits(seed, change)
    with pytest.raises(ValueError, match=r"forward is replaced on the instance.*down_proj is a "
                                         r"Scaled, not a plain nn\.Linear"):
        tt.patch_model(model)
    torch.testing.assert_close(logits(model, ids), want, rtol=0, atol=0)


def test_unknown_class_needs_opting_in(seed):
    def change(model):
        for layer in model.model.layers:
            layer.mlp = PlainMLP(layer.mlp)

    model, ids, want = relu_model_and_logits(seed, change)
    with pytest.raises(ValueError, match=r"no MLP to replace.*its class PlainMLP is not one "
                                         r"patch_model knows.*extra_classes=\(PlainMLP,\)"):
        tt.patch_model(model)
    assert not tt.sparse_modules(model)
    assert tt.patch_model(model, extra_classes=(PlainMLP,)) == 2
    torch.testing.assert_close(logits(model, ids), want, rtol=1e-4, atol=1e-5)
    assert tt.unpatch_model(model) == 2
    assert all(type(layer.mlp) is PlainMLP for layer in model.model.layers)

    model, ids, want = relu_model_and_logits(seed)
    model.model.layers[1].mlp = PlainMLP(model.model.layers[1].mlp)
    with pytest.warns(UserWarning, match=r"left 1 module.*layers\.1\.mlp \(its class PlainMLP"):
        assert tt.patch_model(model) == 1


@pytest.mark.parametrize("extra", [PlainMLP, (PlainMLP, 3), ("PlainMLP",), (int,), None])
def test_bad_extra_classes_are_refused(extra):
    model = tiny("Llama", hidden_act="relu")
    with pytest.raises(ValueError, match="extra_classes: expected a tuple of nn.Module classes"):
        tt.patch_model(model, extra_classes=extra)
    assert not tt.sparse_modules(model)


def test_an_activation_that_is_not_relu_is_refused(seed):
    """An nn.ReLU subclass with its own forward, or ReLU modules in a model whose config names
    another activation, is refused unless activation='relu' makes both ReLU."""
    class Clipped(nn.ReLU):
        def forward(self, x):
            return x.clamp(0, 1)

    model = tiny("Llama", hidden_act="relu")
    model.model.layers[1].mlp.act_fn = Clipped()
    with pytest.raises(ValueError, match=r"layers\.1\.mlp: the activation is Clipped, not ReLU"):
        tt.patch_model(model)
    assert not tt.sparse_modules(model)

    model = tiny("Llama")  # hidden_act silu
    for m in mlps(model):
        m.act_fn = nn.ReLU()
    with pytest.raises(ValueError, match=r"ReLU in act_fn but 'silu' in config\.hidden_act"):
        tt.patch_model(model)
    assert tt.patch_model(model, activation="relu") == 2
    assert model.config.hidden_act == "relu"
