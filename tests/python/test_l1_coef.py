"""The L1 coefficient's one rule.

A coefficient the user sets (TrainingPlan(l1_coef=), the modules' l1_coef, patch_model(l1_coef=))
must be a finite number >= 0. The per-call l1_coef of backward is the upstream gradient of the L1
value, and behaves as dense autograd does: any sign, and a NaN or infinite one makes the gradients
non-finite exactly where the dense computation's are (GradScaler relies on that to skip a step).
"""
import math

import numpy as np
import pytest

import twell

from problems import backward, make_problem

try:
    import torch

    import twell.torch as tt
    from torch_cases import dense_step, module_for
except ImportError:  # the binding tests run without PyTorch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

M, K, N, TILE = 16, 16, 64, 32
CAPACITY = TILE  # no row is routed: every row takes the compact path, which skips inactive units
RATE = 0.02  # over 16 rows and 64 units: units no row activates, and rows with no active unit
MARGIN = 1e-4  # pre-activations at least this far from 0: fp32 and fp64 agree on the active set
ATTEMPTS = 32
BAD = [-1.0, -1e-30, math.nan, math.inf, -math.inf]


def clear_problem(seed, gated):
    """A float32 problem (float64 copy too) whose active set is unambiguous and which has a unit
    no row activates and a row with no active unit (where only dense autograd makes NaN)."""
    rng = np.random.default_rng(seed)
    for _ in range(ATTEMPTS):
        p = make_problem(rng, M, K, N, gated, rate=RATE, special_rows=False).cast(np.float32)
        exact = p.cast(np.float64)
        pre = exact.x @ (exact.gate if gated else exact.up).T
        active = pre > 0
        if np.abs(pre).min() > MARGIN and (~active).all(1).any() and (~active).all(0).any():
            return p, exact
    pytest.fail(f"no problem with a clear active set in {ATTEMPTS} attempts (seed {seed})")


def binding_backward(p, dy, coef):
    plan = twell.TrainingPlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    saved = np.zeros(plan.saved_bytes(M), np.uint8)
    plan.forward(p.x, np.empty((M, K), np.float32), saved)
    # A finite poison: NaN would pass an unwritten element as the expected NaN.
    grads = [np.full((M, K), 7.0, np.float32)] + [
        np.full((N, K), 7.0, np.float32) if w is not None else None for w in (p.gate, p.up, p.down)]
    plan.backward(dy, *grads, p.x, saved, l1_coef=np.array([coef], np.float32))
    return grads


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("coef", [math.nan, math.inf, -math.inf])
def test_nonfinite_upstream_gradient_is_nonfinite_where_dense_is(seed, gated, coef):
    p, exact = clear_problem(seed, gated)
    dy = np.random.default_rng(seed + 1).standard_normal((M, K)).astype(np.float32)
    got = binding_backward(p, dy, coef)
    with np.errstate(invalid="ignore"):
        want = backward(exact, dy.astype(np.float64), coef)
    for name, g, w in zip(("dx", "dgate", "dup", "ddown"), got, want):
        if w is None:
            continue
        assert np.array_equal(np.isfinite(g), np.isfinite(w)), f"{name}: non-finite elements differ"
        if math.isnan(coef):
            assert np.array_equal(np.isnan(g), np.isnan(w)), f"{name}: NaN elements differ"
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("gated", [True, False])
def test_negative_upstream_gradient_is_a_gradient(seed, gated):
    """A loss that subtracts the L1 term: its gradient, exactly, not a refusal."""
    p, exact = clear_problem(seed, gated)
    dy = np.random.default_rng(seed + 1).standard_normal((M, K)).astype(np.float32)
    got = binding_backward(p, dy, -0.75)
    want = backward(exact, dy.astype(np.float64), -0.75)
    for name, g, w in zip(("dx", "dgate", "dup", "ddown"), got, want):
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("coef", BAD)
def test_plan_option_must_be_finite_and_nonnegative(coef):
    w = np.zeros((N, K), np.float32)
    with pytest.raises(twell.TwellError) as e:
        twell.TrainingPlan(w, w, w, l1_coef=coef)
    assert e.value.argument == "options.l1_coef"


@needs_torch
@pytest.mark.parametrize("cls", ["SparseGatedMLP", "SparseMLP"])
@pytest.mark.parametrize("coef", BAD + ["0.1x", None])
def test_module_l1_coef_must_be_finite_and_nonnegative(cls, coef):
    with pytest.raises(ValueError, match="l1_coef: expected a finite number >= 0"):
        getattr(tt, cls)(K, N, l1_coef=coef)
    mod = getattr(tt, cls)(K, N, l1_coef=0.25)
    with pytest.raises(ValueError, match="l1_coef"):
        mod.l1_coef = coef
    assert mod.l1_coef == 0.25
    mod.l1_coef = 2  # a number: stored as float
    assert mod.l1_coef == 2.0 and isinstance(mod.l1_coef, float)


@needs_torch
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("scale", [math.nan, math.inf, -3.0])
def test_module_l1_upstream_gradient_follows_dense_autograd(seed, gated, scale):
    """loss = <dy, y> + scale * l1_loss (a loss scaler's inf/NaN, or a negative weight): the
    gradients are the dense layer's, non-finite exactly where its are."""
    p, _ = clear_problem(seed, gated)
    mod = module_for(p, torch.float32, "cpu", tile=TILE, capacity=CAPACITY, l1_coef=0.5)
    x = torch.from_numpy(p.x).requires_grad_()
    dy = torch.randn(M, K, generator=torch.Generator().manual_seed(seed))
    y = mod(x)
    ((y * dy).sum() + scale * mod.l1_loss).backward()
    _, _, want = dense_step(mod, x, dy, scale, torch.float64)
    got = [x.grad] + [q.grad for q in mod.parameters()]
    names = ["x"] + [n for n, _ in mod.named_parameters()]
    for name, g, w in zip(names, got, want):
        assert torch.equal(torch.isfinite(g), torch.isfinite(w)), f"d {name}: non-finite differ"
        if math.isnan(scale):
            assert torch.equal(torch.isnan(g), torch.isnan(w)), f"d {name}: NaN elements differ"
        finite = torch.isfinite(w)
        torch.testing.assert_close(g[finite].double(), w[finite], rtol=1e-4, atol=1e-5)
