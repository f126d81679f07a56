"""Hot units run dense (twell.torch.hot): a split module computes what the unsplit one does, in
inference and training (outputs, gradients, l0, l1), keeps its state dict a Llama MLP's, moves an
optimizer's state with its units, and its tracker counts every unit."""
import copy

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import twell.torch as tt  # noqa: E402
from twell.torch import saved  # noqa: E402

from torch_cases import (FLOOR, captured, dense_step, devices, dtypes, module_for,  # noqa: E402
                         off_the_kink, problem, rel_error, skip_unless_trainable)

K, N, TILE = 16, 200, 64


def case(seed, gated, dtype, m, device, hot, **kwargs):
    """An unsplit module, its copy split with `hot` hot units (chosen by the units' activity on
    a calibration batch) and an input off the kink."""
    p = problem(seed, m, K, N, gated, rate=0.05)
    base = module_for(p, dtype, device, tile=TILE, capacity=8, **kwargs)
    x = off_the_kink(torch.from_numpy(p.x).to(device, dtype), base.first_weight)
    with torch.no_grad():
        hits = (F.linear(x.float(), base.first_weight.float()) > 0).sum(0)
    split = copy.deepcopy(base)
    perm = split.split_hot(hot, hits)
    return base, split, x, perm, hits


def close(split, base, ref, dtype):
    """The split module's result is as near the float64 reference as the unsplit one's, give or
    take the rounding of adding two partial outputs (one more rounding of the dtype)."""
    e_split, e_base = rel_error(split, ref), rel_error(base, ref)
    return e_split <= 2 * e_base + torch.finfo(dtype).eps + FLOOR[dtype], (e_split, e_base)


def reference(mod, x):
    """The unsplit FFN in float64."""
    w = {n: p.detach().double() for n, p in mod.named_parameters()}
    xd = x.double()
    h = torch.relu(xd @ w["gate_proj.weight"].T) * (xd @ w["up_proj.weight"].T) if mod.gated \
        else torch.relu(xd @ w["up_proj.weight"].T)
    return h @ w["down_proj.weight"].T


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("hot", [8, 24, 64])
def test_inference_equals_the_unsplit_module(seed, device, gated, hot):
    for dtype in dtypes(device):
        base, split, x, perm, hits = case(seed, gated, dtype, 37, device, hot)
        with torch.no_grad():
            y0, y1 = base(x), split(x)
        assert y1.dtype == dtype and y1.shape == y0.shape
        ok, errors = close(y1, y0, reference(base, x), dtype)
        assert ok, (dtype, errors)
        assert float(split.l0) == pytest.approx(float(base.l0), rel=1e-6)
        assert split.hot_units == hot and "hot_units" in repr(split)
        # the hot units are the most active ones, last, in their old order
        top = hits.cpu().double().argsort(descending=True, stable=True)[:hot].sort().values
        assert torch.equal(perm[-hot:].cpu(), top) and torch.equal(split.unit_order, perm)
        assert sorted(perm.tolist()) == list(range(N))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("gated", [True, False])
def test_training_equals_the_unsplit_module(seed, device, gated):
    skip_unless_trainable(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    base, split, x, perm, _ = case(seed, gated, dtype, 41, device, 32, l1_coef=0.01)
    dy = torch.randn(x.shape, device=device, dtype=dtype)
    ref_y, ref_l1, ref_grads = dense_step(base, x, dy, 1.0, torch.float64)
    outs = []
    for mod in (base, split):
        xx = x.clone().requires_grad_()
        y = mod(xx)
        loss = (y.float() * dy.float()).sum() + mod.l1_loss
        loss.backward()
        outs.append((y.detach(), xx.grad, float(mod.l0), float(mod.l1_loss.detach()),
                     [p.grad for _, p in mod.named_parameters()]))
    (y0, dx0, l00, l10, g0), (y1, dx1, l01, l11, g1) = outs
    for got, want, ref in ((y1, y0, ref_y), (dx1, dx0, ref_grads[0])):
        ok, errors = close(got, want, ref, dtype)
        assert ok, errors
    # the hot units' |h| come from torch's rounded g and u (bf16 on CUDA), the op's from its own
    # products: their sums agree to the dtype's rounding, not closer (1.03e-4 apart once on CUDA)
    l1_tol = 1e-4 if dtype == torch.float32 else torch.finfo(dtype).eps
    assert l01 == pytest.approx(l00, rel=1e-5) and l11 == pytest.approx(l10, rel=l1_tol)
    assert l10 == pytest.approx(0.01 * float(ref_l1), rel=1e-2)
    names = [n for n, _ in base.named_parameters()]
    for name, a, b, ref in zip(names, g0, g1, ref_grads[1:]):  # the split's, unpermuted
        dim = 1 if name.startswith("down") else 0
        back = torch.empty_like(b)
        back.index_copy_(dim, perm, b)
        ok, errors = close(back, a, ref, dtype)
        assert ok, (name, errors)


def test_state_dict_is_a_permuted_llama_mlp(seed):
    base, split, x, perm, _ = case(seed, True, torch.float32, 9, "cpu", 16)
    state = split.state_dict()
    assert set(state) == set(base.state_dict())
    assert torch.equal(state["gate_proj.weight"], base.gate_proj.weight[perm])
    assert torch.equal(state["down_proj.weight"], base.down_proj.weight[:, perm])
    fresh = tt.SparseGatedMLP(K, N)  # loads anywhere, computes the same function unsplit
    fresh.load_state_dict(state)
    with torch.no_grad():
        assert rel_error(fresh(x), base(x)) <= FLOOR[torch.float32]


def test_optimizer_state_moves_with_the_units(seed):
    base, _, x, _, hits = case(seed, True, torch.float32, 23, "cpu", 0)
    opts = []
    split = copy.deepcopy(base)
    for mod in (base, split):
        opt = torch.optim.AdamW(mod.parameters(), lr=1e-2)
        mod(x.clone().requires_grad_()).square().sum().backward()
        opt.step()
        opt.zero_grad()
        opts.append(opt)
    perm = split.split_hot(40, hits, optimizer=opts[1])
    for mod, opt in zip((base, split), opts):  # a second step: Adam's moments must follow
        mod(x.clone().requires_grad_()).square().sum().backward()
        opt.step()
    assert torch.allclose(split.gate_proj.weight, base.gate_proj.weight[perm], rtol=1e-5, atol=1e-6)
    assert torch.allclose(split.down_proj.weight, base.down_proj.weight[:, perm], rtol=1e-5,
                          atol=1e-6)


def test_splitting_again_composes_and_frozen_copies_follow(seed):
    base, split, x, perm, _ = case(seed, True, torch.float32, 19, "cpu", 8)
    split.freeze()
    hits = torch.arange(N)  # the last units of the current order are the most active
    perm2 = split.split_hot(48, hits)
    assert torch.equal(perm2, torch.arange(N))  # already last: nothing moves
    assert torch.equal(split.unit_order, perm) and split.hot_units == 48
    assert torch.equal(split.down_nk, split.down_proj.weight.t())
    split.split_hot(0, hits)  # no hot units: every unit through twell again, order kept
    with torch.no_grad():
        assert rel_error(split(x), base(x)) <= FLOOR[torch.float32]


@pytest.mark.parametrize("device", devices())
def test_tracker_counts_every_unit(seed, device):
    skip_unless_trainable(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    base, split, x, perm, _ = case(seed, True, dtype, 31, device, 24)
    tracker = tt.SparsityTracker(nn.Sequential(split), window=1)
    y = split(x.clone().requires_grad_())
    assert saved.find(split, y) is not None  # read from the op's state, not a GEMM
    # x is off the kink: every g is far enough from 0 for its sign to survive the dtype's GEMM
    expected = (x.double() @ split.first_weight.detach().double().T > 0).sum(0)
    assert torch.equal(tracker.hits("0").cpu(), expected.cpu())
    with torch.no_grad():  # inference forwards: the GEMM over every unit
        split(x)
    assert torch.equal(tracker.hits("0").cpu(), 2 * expected.cpu())


def test_model_level_split_and_bad_arguments(seed):
    base, _, x, _, hits = case(seed, True, torch.float32, 5, "cpu", 0)
    model = nn.Sequential(copy.deepcopy(base), copy.deepcopy(base))
    perms = tt.split_hot(model, 8, {"1": hits})
    assert list(perms) == ["1"] and model[1].hot_units == 8 and model[0].hot_units == 0
    for units in (-1, N, 2.0, True, 12):  # 12: N - 12 units is no count the CUDA kernels take
        with pytest.raises(ValueError, match="split_hot: units"):
            base.split_hot(units, hits)
    for bad in (hits[:-1], hits.bool(), hits.view(2, -1), [1] * N,
                torch.full((N,), float("nan"))):
        with pytest.raises(ValueError, match="split_hot: hits"):
            base.split_hot(8, bad)
    assert base.hot_units == 0


def test_compiled_split_module(seed):
    base, split, x, _, _ = case(seed, True, torch.float32, 29, "cpu", 24)
    f = torch.compile(split)
    with torch.no_grad():
        assert rel_error(f(x), base(x)) <= FLOOR[torch.float32]
    assert float(split.l0) == pytest.approx(float(base.l0), rel=1e-6)
    xs, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    f(xs).sum().backward()
    base(xb).sum().backward()
    assert rel_error(xs.grad, xb.grad) <= FLOOR[torch.float32]


@pytest.mark.parametrize("training", [False, True])
def test_choose_hot_units_keeps_the_fastest_candidate(seed, training, monkeypatch):
    from twell.torch import hot
    base, _, x, _, _ = case(seed, True, torch.float32, 33, "cpu", 0)
    mod = copy.deepcopy(base)
    if training:  # a training forward first (its l1_loss is no leaf) and a tracker watching
        mod(x.clone().requires_grad_()).sum().backward()
        mod.zero_grad()
    tracker = tt.SparsityTracker(nn.Sequential(mod), window=1)
    seen = []
    forward = tt.SparseGatedMLP.forward

    def recording(self, xx):
        seen.append(self.hot_units)
        return forward(self, xx)

    def fake_ms(fn, cuda, host_hidden=False):  # the split at 48 units is the fast one
        fn()
        return 1.0 if seen[-1] == 48 else 5.0

    monkeypatch.setattr(tt.SparseGatedMLP, "forward", recording)
    monkeypatch.setattr(hot, "_time_ms", fake_ms)
    times = tt.choose_hot_units(mod, x, candidates=(48, 96, N), training=training, reps=3,
                                warmup=1)
    assert times == {0: 5.0, 48: 1.0, 96: 5.0} and mod.hot_units == 48
    assert tracker.tokens("0") == 0  # the timing runs were copies, unobserved
    monkeypatch.undo()
    with torch.no_grad():
        ok, errors = close(mod(x), base(x), reference(base, x), torch.float32)
    assert ok, errors
    with pytest.raises(ValueError, match="choose_hot_units: candidates"):
        tt.choose_hot_units(mod, x, candidates=(N, -1, 12))


@pytest.mark.parametrize("device", devices())
def test_plans_are_kept_and_dispatch_recorded(seed, device):
    from twell.torch import _plans
    skip_unless_trainable(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    base, split, x, _, _ = case(seed, True, dtype, 21, device, 24, dispatch="dense")
    split.freeze()
    split.record_dispatch = True
    tt.clear_plans()
    with torch.no_grad():
        for _ in range(3):
            split(x)
    assert len(_plans._plans) == 1 and split.ran_dense is True
    for _ in range(3):
        split(x.clone().requires_grad_()).sum().backward()
    assert len(_plans._plans) == 2  # one inference and one training plan, each made once


def test_composed_splits_and_gradients_follow(seed):
    base, split, x, perm, _ = case(seed, True, torch.float32, 25, "cpu", 16)
    split(x.clone().requires_grad_()).square().sum().backward()
    grad = split.gate_proj.weight.grad.clone()
    hits = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    perm2 = split.split_hot(40, hits)
    assert not torch.equal(perm2, torch.arange(N))
    assert torch.equal(split.gate_proj.weight.grad, grad[perm2])
    assert torch.equal(split.gate_proj.weight, base.gate_proj.weight[split.unit_order])
    assert torch.equal(split.down_proj.weight, base.down_proj.weight[:, split.unit_order])
    assert "unit_order" in dict(split.named_buffers()) and "unit_order" not in split.state_dict()


def test_two_trackers_and_no_tracker_hold_no_hot_gate(seed):
    _, split, x, _, _ = case(seed, True, torch.float32, 17, "cpu", 24)
    split(x.clone().requires_grad_())
    assert getattr(split, "_hot_gate", None) is None  # no hook: nothing kept
    model = nn.Sequential(split)
    first, second = tt.SparsityTracker(model, window=1), tt.SparsityTracker(model, window=1)
    split(x.clone().requires_grad_())
    expected = (x.double() @ split.first_weight.detach().double().T > 0).sum(0)
    assert torch.equal(first.hits("0"), expected) and torch.equal(second.hits("0"), expected)
    assert getattr(split, "_hot_gate", None) is None


@pytest.mark.parametrize("dispatch", ["auto", "sparse", "dense"])
def test_cuda_graph_replays_a_split_module(seed, dispatch):
    if "cuda" not in devices():
        pytest.skip("no CUDA device")
    base, split, x, _, _ = case(seed, True, torch.bfloat16, 64, "cuda", 24, dispatch=dispatch)
    split.freeze()
    static_x = x.clone()
    with torch.no_grad():
        graph, static_y = captured(lambda: split(static_x))
        for scale in (1.0, -0.5, 2.0):
            static_x.copy_(x * scale)
            graph.replay()
            ok, errors = close(static_y, base(static_x), reference(base, static_x), torch.bfloat16)
            assert ok, (scale, errors)


def test_choose_hot_units_times_on_cuda(seed):
    """The real timing (CUDA events) on a CUDA module: a candidate is chosen, applied, and the
    module still computes the unsplit function."""
    if "cuda" not in devices():
        pytest.skip("no CUDA device")
    base, _, x, _, _ = case(seed, True, torch.bfloat16, 256, "cuda", 0)
    for training in (False, True):
        mod = copy.deepcopy(base).train(training)
        times = tt.choose_hot_units(mod, x, candidates=(64, 128), training=training, reps=2,
                                    warmup=2)
        assert set(times) == {0, 64, 128} and all(t > 0 for t in times.values())
        assert mod.hot_units == min(times, key=times.get)
        with torch.no_grad():
            ok, errors = close(mod(x), base(x), reference(base, x), torch.bfloat16)
        assert ok, (training, errors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: the device's time against the host's")
def test_timing_hides_the_host_where_asked():
    """choose_hot_units times the device's work alone (as inside a model, where other layers keep
    the device busy while the host enqueues): 2 ms of host time before a short kernel counts in
    a call's timing and not in the device's."""
    import time

    from twell.torch._timing import time_ms
    x = torch.randn(256, 256, device="cuda")

    def host_then_kernel():
        time.sleep(0.002)
        x.mul_(1.0)

    for _ in range(3):
        time_ms(host_then_kernel, True)
    call = min(time_ms(host_then_kernel, True) for _ in range(5))
    device = min(time_ms(host_then_kernel, True, host_hidden=True) for _ in range(5))
    assert call >= 1.9 and device < 0.5, (call, device)
