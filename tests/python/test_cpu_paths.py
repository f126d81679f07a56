"""CPU inference inside torch: twell's plan or torch's dense MLP per regime (twell.torch._cpu_paths)."""
import math

import pytest
import torch

import twell
from twell.torch import SparseGatedMLP, SparseMLP, _cpu_paths


def counters(active, rows=4):
    return torch.tensor([0, active])


def test_paths_alternate_then_take_the_faster_and_retry():
    p = _cpu_paths.Paths()
    assert p.choose(4) == (None, False)  # no density yet: twell, no trial counted
    p.add(None, False, 1.0, counters(8), 4, 100)  # density 2%
    ways = []
    for i in range(2 * _cpu_paths.TRIALS):
        key, by_torch = p.choose(4)
        ways.append(by_torch)
        p.add(key, by_torch, 2.0 if by_torch else 3.0 + i, counters(8), 4, 100)
    assert ways == [False, True] * _cpu_paths.TRIALS  # alternating, twell first
    key, by_torch = p.choose(4)
    assert by_torch  # torch's best 2.0 < twell's best 3.0
    assert p.choose(8)[0] != key  # twice the rows: another regime, trials again
    p.add(key, True, 2.0, counters(30), 4, 100)  # density 7.5%: another regime
    assert p.choose(4)[0] != key
    # every RETRY calls of a settled regime the other way runs once more
    q = _cpu_paths.Paths()
    q.add(None, False, 1.0, counters(8), 4, 100)
    for _ in range(2 * _cpu_paths.TRIALS):
        k, t = q.choose(4)
        q.add(k, t, 1.0 if t else 2.0, counters(8), 4, 100)
    chosen = [q.choose(4)[1] for _ in range(2 * _cpu_paths.RETRY)]
    assert chosen.count(False) == 2 and chosen.count(True) == len(chosen) - 2


def dense_ref(x, gate, up, down):
    x, up, down = x.double(), up.double(), down.double()
    first = x @ (gate.double() if gate is not None else up).T
    h = torch.relu(first) * (x @ up.T) if gate is not None else torch.relu(first)
    return h @ down.T, int((first > 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [SparseGatedMLP, SparseMLP])
@pytest.mark.parametrize("frozen", [False, True])
def test_both_ways_are_the_dense_ffn(seed, dtype, cls, frozen):
    """Every call, whichever way ran it, equals the dense FFN to the dtype's rounding and counts
    the same active units; both ways run within the trials."""
    torch.manual_seed(seed)
    k, n, rows = 48, 200, 24
    m = cls(k, n, dtype=dtype).eval()
    with torch.no_grad():  # dense-ish rows (the plan's dense path) and sparse ones
        for p in m.parameters():
            p.normal_(0, 0.2)
    if frozen:
        m.freeze()
    gate = m.gate_proj.weight if m.gated else None
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        for i in range(3 + 2 * _cpu_paths.TRIALS):
            x = torch.randn(rows, k, dtype=dtype)
            if i % 2:
                x[rows // 2:] = 0  # all-zero rows: no active unit
            y = m(x)
            ref, active = dense_ref(x, gate, m.up_proj.weight, m.down_proj.weight)
            err = float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))
            assert err < tol, (i, err)
            assert math.isclose(float(m.l0), active / rows, rel_tol=1e-6)
    runs = [r[1] for r in m.__dict__["_cpu_paths"].regimes.values()]
    assert sum(r[0] for r in runs) > 0 and sum(r[1] for r in runs) > 0


def test_nan_reaches_the_output_either_way(seed):
    torch.manual_seed(seed)
    m = SparseGatedMLP(16, 64).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        for i in range(3 + 2 * _cpu_paths.TRIALS):
            x[1, 3] = math.nan
            y = m(x)
            assert torch.isnan(y[1]).all() and torch.isfinite(y[0]).all(), i


@pytest.mark.parametrize("how", ["sparse", "dense", "deterministic"])
def test_plan_alone_where_asked(seed, how):
    """dispatch "sparse" / "dense" and deterministic algorithms: the plan runs every call."""
    m = SparseGatedMLP(16, 64, dispatch="auto" if how == "deterministic" else how).eval()
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(how == "deterministic")
    try:
        with torch.no_grad():
            ys = [m(torch.ones(4, 16)) for _ in range(3 + 2 * _cpu_paths.TRIALS)]
    finally:
        torch.use_deterministic_algorithms(old)
    assert "_cpu_paths" not in m.__dict__
    assert all(torch.equal(ys[0], y) for y in ys)  # the same plan, bit for bit


def torch_runs(m):
    paths = m.__dict__.get("_cpu_paths")
    return sum(r[1][1] for r in paths.regimes.values()) if paths else 0


def test_record_dispatch_says_torch_ran_dense(seed):
    m = SparseGatedMLP(16, 64).eval()
    m.record_dispatch = True
    seen = set()
    with torch.no_grad():
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            before = torch_runs(m)
            m(torch.randn(4, 16))
            after = torch_runs(m)
            if after > before:
                assert m.ran_dense is True
                seen.add("torch")
            else:
                assert m.ran_dense in (True, False)
                seen.add("plan")
    assert seen == {"torch", "plan"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_count_active_as_the_plans_count(dtype):
    """Entries not <= 0: positives and NaNs of either sign (the plans' rule), not +-0 or -inf;
    large tensors (counted on several threads) and empty ones too."""
    t = torch.randn(37, 53).to(dtype)
    t[0, :6] = torch.tensor([0.0, -0.0, -math.inf, math.inf, math.nan, -math.nan]).to(dtype)
    bits = t.view(torch.int32 if dtype == torch.float32 else torch.int16)
    bits[0, 6] = -1  # a NaN with the sign bit set, all mantissa bits
    want = int((~(t <= 0)).sum())
    assert want == int((t > 0).sum()) + int(t.isnan().sum()) and int(t.isnan().sum()) >= 3
    assert twell.count_active(t) == want
    big = torch.randn(300, 1001).to(dtype)
    big.view(-1)[::97] = math.nan
    assert twell.count_active(big) == int((~(big <= 0)).sum())
    assert twell.count_active(big[:0]) == 0


def test_count_active_refuses_what_it_cannot_count():
    with pytest.raises(twell.TwellError, match="contiguous"):
        twell.count_active(torch.randn(8, 8)[:, ::2])
    with pytest.raises(twell.TwellError, match="float32"):
        twell.count_active(torch.ones(8, dtype=torch.int32))


def test_nan_rows_count_the_same_either_way(seed):
    torch.manual_seed(seed)
    m = SparseGatedMLP(16, 64).eval()
    x = torch.randn(6, 16)
    x[1] = math.inf  # inf - inf: NaNs with the sign bit set on x86
    x[1, ::2] = -math.inf
    counts = set()
    with torch.no_grad():
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            m(x)
            counts.add(float(m.l0))
    assert len(counts) == 1


def test_empty_batches_autocast_and_flags_run_the_plan(seed):
    m = SparseGatedMLP(16, 64).eval()
    with torch.no_grad():
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            assert m(torch.randn(0, 16)).shape == (0, 16)
        assert not m.__dict__.get("_cpu_paths", _cpu_paths.Paths()).regimes
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ys = [m(torch.randn(4, 16)) for _ in range(3 + 2 * _cpu_paths.TRIALS)]
        assert {y.dtype for y in ys} == {torch.float32}
        assert not m.__dict__.get("_cpu_paths", _cpu_paths.Paths()).regimes
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            m(torch.randn(4, 16))
            assert m.ran_dense is None  # record_dispatch is off


def test_frozen_module_computes_with_its_copy_either_way(seed):
    """down_proj.weight changed behind autograd's back after freeze(): both ways keep the copy."""
    torch.manual_seed(seed)
    m = SparseGatedMLP(16, 64).eval().freeze()
    x = torch.randn(5, 16)
    with torch.no_grad():
        want = m(x)
        m.down_proj.weight.data.mul_(2)
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            assert torch.allclose(m(x), want, rtol=1e-5, atol=1e-6)


def test_frozen_module_moved_to_another_dtype(seed):
    torch.manual_seed(seed)
    m = SparseGatedMLP(16, 64).eval().freeze()
    with torch.no_grad():
        for _ in range(3 + 2 * _cpu_paths.TRIALS):  # both ways ran: the torch way's copy made
            m(torch.randn(4, 16))
        m.to(torch.bfloat16)
        x = torch.randn(4, 16, dtype=torch.bfloat16)
        ref, _ = dense_ref(x, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight)
        for _ in range(3 + 2 * _cpu_paths.TRIALS):
            y = m(x)
            assert y.dtype == torch.bfloat16
            assert float((y.double() - ref).norm() / ref.norm()) < 3e-2


def test_regimes_key_on_dtype_and_threads(seed):
    p = _cpu_paths.Paths()
    p.add(None, False, 1.0, counters(8), 4, 100)
    old = torch.get_num_threads()
    try:
        a = p.choose(4, torch.float32)[0]
        torch.set_num_threads(1)
        assert p.choose(4, torch.float32)[0] != a
        assert p.choose(4, torch.bfloat16)[0] != p.choose(4, torch.float32)[0]
    finally:
        torch.set_num_threads(old)
