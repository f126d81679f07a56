"""SparsityTracker: L0 per layer, dead units over a token window, re-initialisation."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell.torch as tt  # noqa: E402
from torch import nn  # noqa: E402

from torch_cases import module_for, problem  # noqa: E402


def model_with_dead_units(seed, gated, dead=(0, 5)):
    p = problem(seed, 64, 16, 64, gated, special_rows=False)
    first = p.gate if gated else p.up
    for u in dead:
        first[u, 0] = -100.0  # x[:, 0] == 1: this unit's pre-activation is always negative
    mlp = module_for(p, torch.float32, "cpu", tile=64, capacity=8)
    return nn.Sequential(mlp), torch.from_numpy(p.x).float()


@pytest.mark.parametrize("gated", [True, False])
def test_dead_units_and_l0(seed, gated):
    model, x = model_with_dead_units(seed, gated)
    tracker = tt.SparsityTracker(model, window=100)
    with torch.no_grad():
        model(x)
        assert tracker.dead("0") is None  # 64 tokens < window
        model(x)
    dead = tracker.dead("0")
    first = model[0].first_weight.detach()
    active = (x @ first.T > 0)
    assert torch.equal(dead, ~active.any(0))
    assert dead[0] and dead[5]
    s = tracker.summary()["0"]
    assert s["tokens"] == 128
    assert s["l0"] == pytest.approx(active.sum().item() / 64, rel=1e-6)
    assert s["dead"] == int(dead.sum()) and s["dead_fraction"] == pytest.approx(dead.float().mean().item())


def test_reinit_dead_gate_rows(seed):
    model, x = model_with_dead_units(seed, True)
    tracker = tt.SparsityTracker(model, window=64)
    with torch.no_grad():
        model(x)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dead = tracker.dead("0")
    done = tracker.reinit_dead(generator=torch.Generator().manual_seed(seed))
    assert done == {"0": int(dead.sum())}
    gate = model[0].gate_proj.weight.detach()
    assert not torch.equal(gate[dead], before["0.gate_proj.weight"][dead])
    assert torch.equal(gate[~dead], before["0.gate_proj.weight"][~dead])
    for n in ("0.up_proj.weight", "0.down_proj.weight"):
        assert torch.equal(model.get_parameter(n), before[n])
    assert tracker.tokens("0") == 0 and tracker.dead("0") is None  # a new window


def test_stop_and_start(seed):
    model, x = model_with_dead_units(seed, True)
    tracker = tt.SparsityTracker(model, window=1).stop()
    with torch.no_grad():
        model(x)
    assert tracker.tokens("0") == 0
    tracker.start()
    with torch.no_grad():
        model(x)
    assert tracker.tokens("0") == 64


@pytest.mark.parametrize("gated", [True, False])
def test_ran_dense_records_the_inference_dispatch(seed, gated):
    """record_dispatch: ran_dense tells the path twell's inference dispatch took (forced, and
    automatic on either side of the CPU's 3.5% density); None when not asked for, after a
    training forward and before any forward."""
    torch.manual_seed(seed)
    cls = tt.SparseGatedMLP if gated else tt.SparseMLP
    mlp = cls(64, 256)
    x = torch.randn(64, 64)
    assert mlp.ran_dense is None and not mlp.record_dispatch
    with torch.no_grad():
        mlp(x)
        assert mlp.ran_dense is None  # not recorded unless asked
        mlp.record_dispatch = True
        for dispatch, dense in (("dense", True), ("sparse", False), ("auto", True)):
            mlp.dispatch = dispatch
            mlp(x)  # random weights: about half the units active
            assert mlp.ran_dense is dense, dispatch
        mlp.first_weight[2:] = -mlp.first_weight[2:].abs()
        # the plan alone (deterministic algorithms: no trial of torch's dense, _cpu_paths)
        old = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            mlp(x.abs())  # at most 2 of 256 units active: under 3.5%
        finally:
            torch.use_deterministic_algorithms(old)
        assert mlp.ran_dense is False
    mlp(x.abs()).sum().backward()  # a training forward: its saved state tells the path
    assert mlp.ran_dense is None
