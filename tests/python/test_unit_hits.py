"""Per-unit hits from the state twell::ffn_train saves (twell.torch.saved), and the tracker that
counts with them: the op's own activations > 0, no GEMM for the rows the state keeps."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

import twell.layout  # noqa: E402
import twell.torch as tt  # noqa: E402
from twell.torch import saved  # noqa: E402

from torch_cases import (devices, module_for, off_the_kink, problem,  # noqa: E402
                         skip_unless_trainable)

K, N, TILE = 16, 200, 64  # 4 tiles, the last 8 wide
GEMMS = {F.linear, torch.matmul, torch.mm, torch.addmm, torch.bmm, torch.Tensor.__matmul__,
         torch.Tensor.matmul, torch.Tensor.mm}


class CountGemms(TorchFunctionMode):
    """Records the row count of every GEMM's first operand while active."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in GEMMS:
            self.rows.append(args[0].shape[0] if args[0].dim() > 1 else 1)
        return func(*args, **(kwargs or {}))


def reference(x, first):
    """Per (row, unit): g > 0 in float64, the sign any float32 sum of x (off the kink) gives; a NaN
    row has none."""
    return x.double() @ first.detach().double().to(x.device).T > 0


def case(seed, gated, dtype, m, device="cpu", rate=0.03, capacity=4, special=True, **kwargs):
    """A module and an input off the kink; with `special`, row 3 all zero and row 4 NaN (where
    there are such rows), and make_problem's row 2 with every unit active (routed)."""
    p = problem(seed, m, K, N, gated, rate=rate, special_rows=special)
    mlp = module_for(p, dtype, device, tile=TILE, capacity=capacity, **kwargs)
    x = off_the_kink(torch.from_numpy(p.x).to(device, dtype), mlp.first_weight)
    nan_rows = 0
    if special and m > 3:
        x[3] = 0.0
    if special and m > 4:
        x[4, 5] = float("nan")
        nan_rows = 1
    return mlp, x, nan_rows


def state_of(mlp, x):
    y = mlp(x)
    state = saved.find(mlp, y)
    assert state is not None
    return state, y


@pytest.mark.parametrize("m", [1, 7, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gated", [True, False])
def test_hits_are_the_ops_activations(seed, gated, dtype, m):
    mlp, x, nan_rows = case(seed, gated, dtype, m)
    state, _ = state_of(mlp, x)
    assert not state.dense and state.rows == m  # the CPU backend saves the compact form
    active = reference(x, mlp.first_weight)
    hits = state.unit_hits()
    assert hits.dtype == torch.int64 and hits.shape == (N,)
    assert torch.equal(hits, active.sum(0))
    # The tracker's former count, a GEMM in the weights' dtype, agrees off the kink.
    with torch.no_grad():
        assert torch.equal(hits, (F.linear(x, mlp.first_weight) > 0).sum(0))
    # The op's L0 counts relu_active units: > 0, and NaN (every unit of a NaN row).
    assert round(float(mlp.l0) * m) == int(hits.sum()) + N * nan_rows
    if m == 130:  # both kinds of row were there
        assert 0 < int(state.num_routed()) < m


@pytest.mark.parametrize("gated", [True, False])
def test_routed_rows_only_take_a_gemm(seed, gated):
    """A compact state with no routed row: no GEMM. With routed rows (CPU): one GEMM over those
    rows alone."""
    mlp, x, _ = case(seed, gated, torch.float32, 64, rate=0.01, capacity=64, special=False)
    tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
    with CountGemms() as gemms:
        state, _ = state_of(mlp, x)
    assert int(state.num_routed()) == 0 and gemms.rows == []
    assert torch.equal(tracker._hits["0"], reference(x, mlp.first_weight).sum(0))

    mlp, x, _ = case(seed, gated, torch.float32, 130)
    tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
    with CountGemms() as gemms:
        state, _ = state_of(mlp, x)
    routed = int(state.num_routed())
    assert routed > 0 and gemms.rows == [routed]
    assert torch.equal(tracker._hits["0"], reference(x, mlp.first_weight).sum(0))


def test_inference_forwards_keep_the_gemm(seed):
    mlp, x, _ = case(seed, True, torch.float32, 32, special=False)
    tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
    with torch.no_grad(), CountGemms() as gemms:
        y = mlp(x)
    assert saved.find(mlp, y) is None and gemms.rows == [32]
    assert torch.equal(tracker._hits["0"], reference(x, mlp.first_weight).sum(0))


class Layers(nn.Module):
    """Twell FFNs side by side, each on its own input (each input kept off its layer's kink)."""

    def __init__(self, mlps):
        super().__init__()
        self.mlps = nn.ModuleList(mlps)

    def forward(self, xs):
        return sum(m(x).square().mean() for m, x in zip(self.mlps, xs))


class GemmTracker(tt.SparsityTracker):
    """The tracker counting as it did before: one GEMM per forward."""

    def _observe(self, name):
        def hook(module, args, output):
            x = args[0].detach().reshape(-1, module.hidden_size)
            with torch.no_grad():
                hits = (F.linear(x, module.first_weight.detach()) > 0).sum(0)
                l0 = module.l0 * x.shape[0]
            self._hits[name] = hits if self._hits[name] is None else self._hits[name] + hits
            self._l0_sum[name] = l0 if self._l0_sum[name] is None else self._l0_sum[name] + l0
            self._tokens[name] += x.shape[0]
        return hook


@pytest.mark.parametrize("gated", [True, False])
def test_tracker_matches_the_gemm_tracker_over_training(seed, gated):
    """Two layers, steps of 2 micro-batches, dead units re-initialised as windows close: the same
    hits, dead masks and summaries as the GEMM-based tracker fed the same forwards, and no GEMM
    in the training forwards but over the rows the second layer routes (the first, of capacity
    = tile, routes none)."""
    mlps, rows = [], (48, 31)
    for i, capacity in enumerate((TILE, 4)):
        p = problem(seed + i, 8, K, N, gated, rate=0.03, special_rows=False)
        mlps.append(module_for(p, torch.float32, "cpu", tile=TILE, capacity=capacity, l1_coef=0.5))
    with torch.no_grad():
        mlps[0].first_weight[:5, 0] = -50.0  # x[:, 0] == 1: dead until re-initialised
    model = Layers(mlps)
    window = 3 * 2 * rows[0]
    tracker = tt.SparsityTracker(model, window=window)
    ref = GemmTracker(model, window=window).stop()  # fed by hand, after each forward
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    closed = []
    for step in range(7):
        for _ in range(2):
            xs = []
            for m, r in zip(mlps, rows):
                x = torch.randn(r, K, generator=gen)
                x[:, 0] = 1.0
                xs.append(off_the_kink(x, m.first_weight))
            with CountGemms() as gemms:
                loss = model(xs) + tt.l1_loss(model)
            assert len(gemms.rows) <= 1 and all(0 < r < rows[1] for r in gemms.rows)
            for (name, m), x in zip(ref.layers.items(), xs):
                ref._observe(name)(m, (x,), None)
            loss.backward()
        opt.step()
        opt.zero_grad()
        ours, theirs = tracker.summary(), ref.summary()
        for n in tracker.layers:
            assert torch.equal(tracker._hits[n], ref._hits[n])
            assert ours[n]["tokens"] == theirs[n]["tokens"]
            assert ours[n]["dead"] == theirs[n]["dead"]
            assert ours[n]["dead_fraction"] == theirs[n]["dead_fraction"]
            assert ours[n]["l0"] == pytest.approx(theirs[n]["l0"], rel=1e-6)
        full = [n for n in tracker.layers if tracker.dead(n) is not None]
        assert full == [n for n in ref.layers if ref.dead(n) is not None]
        if full:
            for n in full:
                assert torch.equal(tracker.dead(n), ref.dead(n))
            masks = {n: tracker.dead(n).clone() for n in full}
            done = tracker.reinit_dead(generator=torch.Generator().manual_seed(seed + step))
            assert done == {n: int(masks[n].sum()) for n in full}
            if not closed:
                assert done["mlps.0"] >= 5
            ref.reset(full)
            closed += full
    assert closed == ["mlps.0", "mlps.1", "mlps.0"]


def test_compiled_forwards_keep_the_gemm(seed):
    mlp, x, _ = case(seed, True, torch.float32, 24, special=False)
    tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
    torch._dynamo.reset()
    compiled = torch.compile(nn.Sequential(mlp), backend="aot_eager")
    compiled(x).sum().backward()
    assert torch.equal(tracker._hits["0"], reference(x, mlp.first_weight).sum(0))
    assert tracker.tokens("0") == 24


def test_saved_offsets_match_the_layout():
    for rows, cols, tile, cap, planes, dtype, dense in [
            (0, 200, 64, 4, 2, torch.float32, False), (7, 200, 64, 4, 1, torch.float32, False),
            (130, 5632, 256, 16, 2, torch.bfloat16, False),
            (3, 300, 256, 4, 2, torch.float16, True),
            (33, 65, 64, 1, 1, torch.bfloat16, True)]:
        off = twell.layout.saved_offsets(rows, cols, tile, cap, planes, dtype.itemsize, dense)
        assert off["end"] == twell.layout.saved_bytes(rows, cols, tile, cap, planes, dtype, dense)
        assert list(off) == list(twell.layout.SAVED_ARRAYS) + ["end"]
        assert all(v % 16 == 0 for v in off.values())


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_form_counts_plane_0_of_the_backup(seed, planes, dtype):
    """The dense form (CUDA writes it; built by hand here): hits are g > 0 in backup plane 0 (a
    NaN, -0 and -Inf are not; the smallest subnormal and +Inf are), nothing else of the buffer."""
    m, n, tile = 37, 300, 256
    gen = torch.Generator().manual_seed(seed)
    nbytes = twell.layout.saved_bytes(m, n, tile, 1, planes, dtype, dense=True)
    off = twell.layout.saved_offsets(m, n, tile, 1, planes, dtype.itemsize, dense=True)
    buf = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)  # garbage elsewhere
    g = torch.randn(m, n, generator=gen).to(dtype)
    g[0] = 0.0
    g[1, :4] = torch.tensor([float("nan"), -0.0, float("-inf"), float("inf")]).to(dtype)
    g[2, :2] = torch.tensor([torch.finfo(dtype).smallest_normal / 4, -1e-30]).to(dtype)
    plane = m * n * dtype.itemsize
    buf[off["backup"]:off["backup"] + plane] = g.reshape(-1).view(torch.uint8)
    if planes == 2:  # plane 1 (u): all positive, must not count
        buf[off["backup"] + plane:off["backup"] + 2 * plane] = torch.ones(m * n, dtype=dtype).view(
            torch.uint8)
    first = torch.zeros(n, K, dtype=dtype)
    state = saved.SavedState(buf, torch.zeros(m, K, dtype=dtype), first, m, n, tile, None, planes,
                             dtype)
    with CountGemms() as gemms:
        hits = state.unit_hits()
    assert gemms.rows == [] and hits.dtype == torch.int64
    assert torch.equal(hits, (g.float() > 0).sum(0))
    assert int(hits[3]) == int((g[:, 3].float() > 0).sum()) and bool(g[1, 3] > 0)


def cuda_devices():
    return [d for d in devices() if d == "cuda"]


@pytest.mark.parametrize("device", cuda_devices() or
                         [pytest.param("cuda", marks=pytest.mark.skip(reason="no CUDA device"))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gated", [True, False])
def test_cuda_hits_in_both_forms(seed, device, dtype, gated):
    """CUDA: the dense form (forced, and automatic dispatch above dense_above) counts from its
    backup with no GEMM; the compact form's compact rows from the state, its routed rows by a
    GEMM over those rows alone. Each equals the float64 sign off the kink and the former GEMM
    count."""
    skip_unless_trainable(device)
    for dispatch, rate, m in (("dense", 0.3, 130), ("sparse", 0.03, 130), ("sparse", 0.03, 1),
                              ("auto", 0.3, 257)):
        mlp, x, nan_rows = case(seed, gated, dtype, m, device=device, rate=rate, capacity=4,
                                dispatch=dispatch)
        tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
        # Automatic dispatch saves the compact form until it measured the density: a few forwards.
        for _ in range(8 if dispatch == "auto" else 1):
            tracker.reset()
            with CountGemms() as gemms:
                state, _ = state_of(mlp, x)
            torch.cuda.synchronize()
            if state.dense:
                break
        assert state.dense == (dispatch != "sparse"), dispatch
        routed = 0 if state.dense else int(state.num_routed())
        assert gemms.rows == ([routed] if routed else [])  # the routed rows alone
        active = reference(x, mlp.first_weight)
        hits = state.unit_hits()
        assert torch.equal(hits, active.sum(0)), dispatch
        assert torch.equal(tracker._hits["0"], hits)
        with torch.no_grad():
            assert torch.equal(hits, (F.linear(x, mlp.first_weight) > 0).sum(0))
        assert round(float(mlp.l0) * m) == int(hits.sum()) + N * nan_rows


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [0, 1, 7, 1030])
def test_positive_counts_equal_the_bool_sum(device, dtype, m):
    gen = torch.Generator().manual_seed(m + 17)
    g = torch.randn(m, 37, generator=gen).to(device=device, dtype=dtype)
    if m:
        g[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
        g[:, 5] = 0
        g[:, 6] = float("nan")
        g[:, 7] = 1e-30  # rounds to 0 in half precision: > 0 in the dtype decides
    got = saved.positive_counts(g)
    assert got.dtype == torch.int64 and got.shape == (37,) and got.device == g.device
    assert torch.equal(got, (g > 0).sum(0))
    assert got[5] == 0 and got[6] == 0
    # A strided view counts as its values.
    assert torch.equal(saved.positive_counts(g.t().contiguous().t()), (g > 0).sum(0))


def test_hot_share_of_known_counts():
    from twell.torch.tracker import hot_share
    hits = torch.tensor([10, 0, 5, 5, 80, 0, 0, 0, 0, 0], dtype=torch.int64)  # N = 10, 100 hits
    # ceil(f N) units: 0.1 -> 1 (80), 0.2 -> 2 (90), 0.5 -> 5 (100); f below 1/N still takes one
    assert hot_share(hits, (0.01, 0.1, 0.2, 0.3, 0.5, 1.0)) == pytest.approx(
        [0.8, 0.8, 0.9, 0.95, 1.0, 1.0])
    assert hot_share(torch.zeros(10, dtype=torch.int64)) is None and hot_share(None) is None
    uniform = torch.full((5632,), 7, dtype=torch.int64)  # each fraction carries its own size
    assert hot_share(uniform) == pytest.approx(
        [57 / 5632, 113 / 5632, 282 / 5632, 564 / 5632, 1127 / 5632, 0.5])
    with pytest.raises(ValueError, match="fractions must lie in"):
        hot_share(hits, (0.0,))


def test_tracker_reports_the_hot_share(seed):
    mlp, x, _ = case(seed, True, torch.float32, 130, special=False)
    tracker = tt.SparsityTracker(nn.Sequential(mlp), window=1)
    with torch.no_grad():
        mlp(x)
    hits = reference(x, mlp.first_weight).sum(0).double().sort(descending=True).values
    n = hits.numel()
    got = tracker.summary()["0"]["hot_share"]
    for f, share in zip((0.01, 0.02, 0.05, 0.1, 0.2, 0.5), got):
        top = max(1, -(-int(round(f * n * 1e6)) // 1000000))
        assert share == pytest.approx(float(hits[:top].sum() / hits.sum()))
