"""twell.torch ops and modules against a float64 dense PyTorch reference, opcheck, bad inputs."""
import contextlib

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell  # noqa: E402
import twell.torch as tt  # noqa: E402
from twell import layout  # noqa: E402

from torch_cases import (FLOOR, dense_step, devices, dtypes, kink_bound, module_for,  # noqa: E402
                         off_the_kink, problem, rel_error, skip_unless_trainable)

SHAPES = [  # M, K, N, tile, capacity (K, N multiples of 8 and tiles the CUDA backend supports)
    (1, 16, 64, 64, 8),
    (7, 24, 96, 64, 2),
    (37, 32, 200, 64, 8),
    (257, 64, 512, 128, 16),
    (0, 16, 64, 64, 8),
]
CASES = [pytest.param(d, t, id=f"{d}-{str(t).removeprefix('torch.')}")
         for d in devices() for t in dtypes(d)]


def within(got, ref, plain, dtype, what, floor=None):
    err, base = rel_error(got, ref), rel_error(plain, ref)
    floor = FLOOR[dtype] if floor is None else floor
    assert err <= 2 * base + floor, f"{what}: error {err:.3g}, plain {dtype}: {base:.3g}"


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dispatch", ["auto", "sparse", "dense"])
def test_inference(seed, device, dtype, gated, shape, dispatch):
    m, k, n, tile, capacity = shape
    p = problem(seed, m, k, n, gated)
    mod = module_for(p, dtype, device, tile=tile, capacity=capacity, dispatch=dispatch).eval()
    x = torch.from_numpy(p.x).to(device, dtype).reshape(1, m, k)
    with torch.no_grad():
        y = mod(x)
        y_ref, _, _ = dense_step(mod, x[0], torch.zeros(m, k, device=device), 0.0, torch.float64)
        y_plain, _, _ = dense_step(mod, x[0], torch.zeros(m, k, device=device), 0.0, dtype)
    assert y.shape == x.shape and y.dtype == dtype
    within(y[0], y_ref, y_plain, dtype, "y")
    assert (y[0][(y_ref == 0).all(1)] == 0).all()
    with torch.no_grad():
        # The same plan (one per gate and up weight), pointed at the frozen copy: its second run
        # may take the other path ("auto", CUDA calibration) or send backup rows through cuBLAS
        # (fast mode), rounding differently; exact to the dtype either way.
        frozen = mod.freeze()(x)
    within(frozen[0], y_ref, y_plain, dtype, "frozen")
    if dispatch == "dense":
        torch.testing.assert_close(frozen, y, rtol=0, atol=0)
    assert mod.l0.shape == () and mod.l1_loss is None


@pytest.mark.parametrize("device,dtype", CASES)
def test_eager_inference_skips_the_op_dispatch_only(seed, device, dtype, monkeypatch):
    """Plain eager inference calls the op's body directly; under a Python dispatch mode it goes
    through torch.ops.twell.ffn. Same plan, same bits, same recorded state."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.twell = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.twell += "twell" in str(func)
            return func(*args, **(kwargs or {}))

    p = problem(seed, 37, 32, 200, True)
    mod = module_for(p, dtype, device, tile=64, capacity=8, dispatch="sparse").eval().freeze()
    x = torch.from_numpy(p.x).to(device, dtype).reshape(1, 37, 32)
    direct, body = [], []
    real, real_eager = tt._ops.run_ffn, tt._ops.run_ffn_eager
    monkeypatch.setattr(tt._ops, "run_ffn", lambda *a: body.append(1) or real(*a))
    monkeypatch.setattr(tt._ops, "run_ffn_eager", lambda *a: direct.append(1) or real_eager(*a))
    with torch.no_grad():
        fast = mod(x)
        l0_fast = mod.l0.clone()
        assert direct == [1] and body == [] and mod.l1_loss is None and mod.ran_dense is None
        with Count() as mode:
            slow = mod(x)
    assert mode.twell == 1 and len(direct) == 1 and len(body) == 1  # the op's own call of the body
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)
    torch.testing.assert_close(mod.l0, l0_fast, rtol=0, atol=0)


@pytest.mark.parametrize("device,dtype", CASES)
def test_eager_plan_follows_the_weights(seed, device, dtype):
    """The plan an eager module keeps is found again when its weights move (new memory, same
    Parameter), when down_nk is made anew (freeze) or dropped (unfreeze), and a module that kept
    one still deep-copies; every call exact against a plain Llama MLP on the same weights."""
    import copy

    p = problem(seed, 23, 32, 200, True)
    mod = module_for(p, dtype, device, tile=64, capacity=8).eval().freeze()
    x = torch.from_numpy(p.x).to(device, dtype)

    def check(m, what):
        zeros = torch.zeros(23, 32, device=device)
        with torch.no_grad():
            y = m(x)
            y_ref, _, _ = dense_step(m, x, zeros, 0.0, torch.float64)
            y_plain, _, _ = dense_step(m, x, zeros, 0.0, dtype)
        within(y, y_ref, y_plain, dtype, what)

    check(mod, "first call")
    check(mod, "the kept plan")
    with torch.no_grad():
        mod.up_proj.weight.data = mod.up_proj.weight.data * 2  # same Parameter, new memory
    check(mod, "moved up weight")
    mod.unfreeze()
    check(mod, "unfrozen")
    mod.freeze()
    twin = copy.deepcopy(mod)
    with torch.no_grad():
        twin.gate_proj.weight.mul_(-1)
    check(twin, "a deep copy")
    check(mod, "the original after its copy changed")


@pytest.mark.parametrize("device,dtype", CASES)
def test_transposed_down_at_the_same_address_is_refused(device, dtype):
    """K = N: down's transpose (a view at the same address) after a call with down is refused as
    a fresh plan refuses it, not run through the cached plan as if it were row-major."""
    x, gate, up, down = sample_inputs(device, dtype, True, k=64, n=64)
    tt.clear_plans()
    torch.ops.twell.ffn(x, gate, up, down, 64, 8, "auto", -1.0)
    with pytest.raises(twell.TwellError, match="down"):
        torch.ops.twell.ffn(x, gate, up, down.t(), 64, 8, "auto", -1.0)


@pytest.mark.parametrize("device,dtype", CASES)
def test_kept_plan_follows_a_rebind_by_another_caller(seed, device, dtype):
    """A module keeps its plan beside its weights; an op call on the same gate and up weights with
    another down tensor (an unfrozen module under torch.compile) rebinds that plan: the module's
    next call points it back at its own down weight."""
    p = problem(seed, 23, 32, 200, True)
    mod = module_for(p, dtype, device, tile=64, capacity=8).eval().freeze()
    x = torch.from_numpy(p.x).to(device, dtype)
    zeros = torch.zeros(23, 32, device=device)
    with torch.no_grad():
        y0 = mod(x)
        other = mod.down_nk * -2
        torch.ops.twell.ffn(x, mod.gate_proj.weight, mod.up_proj.weight, other, 64, 8, "auto",
                            -1.0)
        del other
        y1 = mod(x)
    y_ref, _, _ = dense_step(mod, x, zeros, 0.0, torch.float64)
    y_plain, _, _ = dense_step(mod, x, zeros, 0.0, dtype)
    within(y0, y_ref, y_plain, dtype, "before")
    within(y1, y_ref, y_plain, dtype, "after another caller's rebind")


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("hot", [0, 48])
def test_unfrozen_inference_keeps_one_plan(seed, device, dtype, hot):
    """Unfrozen inference makes one plan and keeps it (its dispatch calibration with it), rebound
    to each call's new neuron-major copy of down_proj.weight, so a change of down_proj.weight by
    any means (.data too, which no version counter sees) shows at the next call; the module
    holds none of its copies between calls, under no_grad or inference_mode."""
    from twell.torch import _plans
    from twell.torch.modules import _HELD_PLANS
    p = problem(seed, 23, 32, 200, True)
    mod = module_for(p, dtype, device, tile=64, capacity=8).eval()
    if hot:
        mod.split_hot(hot, torch.arange(200))
    x = torch.from_numpy(p.x).to(device, dtype)
    zeros = torch.zeros(23, 32, device=device)
    tt.clear_plans()
    made = []
    real = _plans._get

    def counting(cls, *args, **kwargs):
        before = set(_plans._plans)
        plan = real(cls, *args, **kwargs)
        made.append(set(_plans._plans) != before)
        return plan

    _plans._get = counting
    try:
        for i in range(4):
            with torch.inference_mode() if i % 2 else torch.no_grad():
                if i == 2:  # outside autograd's sight: only a copy at every call follows it
                    mod.down_proj.weight.data.mul_(-0.5)
                y = mod(x)
            y_ref, _, _ = dense_step(mod, x, zeros, 0.0, torch.float64)
            y_plain, _, _ = dense_step(mod, x, zeros, 0.0, dtype)
            within(y, y_ref, y_plain, dtype, f"call {i}")
    finally:
        _plans._get = real
    assert made[0] and not any(made[1:]), made
    assert mod not in _HELD_PLANS


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_training(seed, device, dtype, gated, shape):
    """Forward, the L1 value and every gradient, with the L1 term scaled by an upstream factor."""
    skip_unless_trainable(device)
    m, k, n, tile, capacity = shape
    p = problem(seed, m, k, n, gated)
    mod = module_for(p, dtype, device, tile=tile, capacity=capacity, l1_coef=0.25).train()
    first = mod.gate_proj.weight if gated else mod.up_proj.weight
    x = off_the_kink(torch.from_numpy(p.x).to(device, dtype), first).requires_grad_()
    dy = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(device, dtype)
    y = mod(x)
    l1_scale = 3.0  # the loss uses the L1 term scaled: its gradient must follow
    ((y * dy).sum() + l1_scale * mod.l1_loss).backward()

    y_ref, l1_ref, g_ref = dense_step(mod, x, dy, l1_scale, torch.float64)
    y_plain, l1_plain, g_plain = dense_step(mod, x, dy, l1_scale, dtype)
    within(y.detach(), y_ref, y_plain, dtype, "y")
    # The L1 value sums |h| over a row's few active neurons, each term rounded to the dtype (g and
    # u, gated). The plain baseline rounds the sum itself too, which can land it on the reference
    # by chance (bf16, 5 active neurons: plain 9e-6, the terms' rounding alone 1.3e-3), so the
    # floor is the terms' rounding bound: two unit roundoffs (float32: FLOOR is the larger).
    within(mod.l1_loss.detach() / mod.l1_coef, l1_ref, l1_plain, dtype, "l1",
           floor=max(FLOOR[dtype], torch.finfo(dtype).eps))
    grads = [x.grad] + [q.grad for q in mod.parameters()]
    names = ["x"] + [n for n, _ in mod.named_parameters()]
    for name, got, ref, plain in zip(names, grads, g_ref, g_plain):
        assert got.dtype == dtype and got.shape == ref.shape, name
        within(got, ref, plain, dtype, f"d {name}")
    # L0 against the exact pre-activations; those within the fp32 accumulation bound of zero may
    # fall either way in the kernels' sums (none should remain after off_the_kink).
    pre, bound = kink_bound(x.detach(), first)
    sure, either = (pre > bound).sum().item(), (pre.abs() <= bound).sum().item()
    rows, slack = max(m, 1), 0.5 / max(m, 1) + 1e-6
    assert sure / rows - slack <= float(mod.l0) <= (sure + either) / rows + slack


def test_l1_gradient_follows_upstream(seed):
    """Scaling the loss (as GradScaler does) scales every gradient, the L1 part included; an
    unused L1 term contributes nothing."""
    p = problem(seed, 9, 16, 64, True)
    mod = module_for(p, torch.float32, "cpu", tile=64, capacity=8, l1_coef=0.5)
    x = torch.from_numpy(p.x).float()
    grads = {}
    for scale in (1.0, 8.0, 0.0):
        mod.zero_grad()
        y = mod(x)
        (scale * (y.sum() + mod.l1_loss)).backward()
        grads[scale] = [q.grad.clone() for q in mod.parameters()]
    for a, b, z in zip(grads[1.0], grads[8.0], grads[0.0]):
        torch.testing.assert_close(8 * a, b, rtol=1e-6, atol=1e-6)
        assert not z.any()
    mod.zero_grad()
    mod(x).sum().backward()  # the L1 term not in the loss: no L1 gradient
    y_ref, _, g_ref = dense_step(mod, x, torch.ones(9, 16), 0.0, torch.float64)
    for got, ref in zip([q.grad for q in mod.parameters()], g_ref[1:]):
        assert rel_error(got, ref) < 1e-5


def mlp_reference(x, gate, up, down_nk):
    """The FFN in float64 from the op's arguments (down neuron-major [N, K])."""
    xd, u = x.double(), x.double() @ up.double().T
    h = torch.relu(xd @ gate.double().T) * u if gate is not None else torch.relu(u)
    return h @ down_nk.double()


def sample_inputs(device, dtype, gated, requires_grad=False, m=9, k=16, n=64, train=False):
    """x, gate, up, down; down neuron-major [N, K] for twell::ffn, or (train) down_proj.weight's
    [K, N] for the training ops."""
    g = torch.Generator().manual_seed(0)
    w = lambda *s: (torch.randn(*s, generator=g) / 4).to(device, dtype).requires_grad_(requires_grad)
    x = w(m, k)
    return x, (w(n, k) if gated else None), w(n, k), (w(k, n) if train else w(n, k))


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("gated", [True, False])
def test_opcheck_inference(device, dtype, gated):
    x, gate, up, down = sample_inputs(device, dtype, gated)
    for dispatch in ("sparse", "dense"):  # "auto" may switch paths between runs (calibration)
        torch.library.opcheck(torch.ops.twell.ffn.default,
                              (x, gate, up, down, 64, 8, dispatch, -1.0))


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("gated", [True, False])
def test_opcheck_training(device, dtype, gated):
    skip_unless_trainable(device)
    args = sample_inputs(device, dtype, gated, requires_grad=True, train=True)
    # "auto" may switch saved forms between runs (calibration), and its fake size is dynamic.
    dispatches = ("sparse", "dense") if device == "cuda" else ("sparse",)
    for dispatch in dispatches:
        torch.library.opcheck(torch.ops.twell.ffn_train.default, (*args, 64, 8, dispatch, -1.0))
        x, gate, up, down = (None if a is None else a.detach() for a in args)
        _, saved, _ = torch.ops.twell.ffn_train(x, gate, up, down, 64, 8, dispatch, -1.0)
        dy = torch.randn_like(x)
        l1 = torch.tensor([0.5], device=device)
        torch.library.opcheck(torch.ops.twell.ffn_train_backward.default,
                              (dy, x, gate, up, down, saved, l1, 64, 8, dispatch, -1.0))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [0, 1, 257])
def test_fake_saved_size_matches(device, dtype, m):
    """The fake implementation's saved size (twell.layout) is the C++ plan's."""
    skip_unless_trainable(device)
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA backend runs float16/bfloat16 only")
    x, gate, up, down = sample_inputs(device, dtype, True, m=m, train=True)
    tile, capacity = layout.resolve_tile(0, 0, training=True)
    for dispatch in ("sparse", "dense"):  # the CPU backend saves the compact form either way
        _, saved, stats = torch.ops.twell.ffn_train(x, gate, up, down, 0, 0, dispatch, -1.0)
        dense = dispatch == "dense" and device == "cuda"
        want = layout.saved_bytes(m, 64, tile, capacity, 2, tt.saved_dtype(device, dtype), dense=dense)
        assert saved.numel() == want and saved.dtype == torch.uint8 and stats.shape == (2,)


def expect(argument, fn):
    with pytest.raises(twell.TwellError) as e:
        fn()
    assert e.value.argument == argument, str(e.value)
    return e.value


def test_bad_inputs():
    x, gate, up, down = sample_inputs("cpu", torch.float32, True)
    ffn, train = torch.ops.twell.ffn, torch.ops.twell.ffn_train
    expect("down weight", lambda: ffn(x, gate, up, down[:, :8].contiguous(), 64, 8, "auto", -1.0))
    e = expect("x", lambda: ffn(x.double(), gate, up, down, 64, 8, "auto", -1.0))
    assert e.op == "InferencePlan::run" and "float64" in e.actual
    expect("x", lambda: ffn(x.t(), gate, up, down, 64, 8, "auto", -1.0))
    down_kn = down.t().contiguous()  # the training ops take down_proj.weight
    expect("gate weight", lambda: train(x, gate.half(), up, down_kn, 64, 8, "auto", -1.0))
    expect("options.capacity", lambda: train(x, gate, up, down_kn, 64, 65, "auto", -1.0))
    expect("options.dense_above", lambda: train(x, gate, up, down_kn, 64, 8, "auto", 2.0))
    e = expect("down", lambda: train(x, gate, up, down, 64, 8, "auto", -1.0))
    assert e.op == "twell::ffn_train" and "[16, 64]" in e.expected and e.actual == "[64, 16]"
    with pytest.raises(ValueError, match="dispatch"):
        train(x, gate, up, down_kn, 64, 8, "fastest", -1.0)
    with pytest.raises(ValueError, match="dispatch"):
        ffn(x, gate, up, down, 64, 8, "fastest", -1.0)


@pytest.mark.parametrize("cls", ["SparseGatedMLP", "SparseMLP"])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [(4, 32), (2, 3, 48), (3, 15), (32,), ()])
def test_module_refuses_a_wrong_last_dimension(cls, training, shape):
    """[4, 32] into a hidden-16 module would reshape to [8, 16] and run as more rows: refused,
    naming the module, x and the hidden size, in inference and in training."""
    mod = getattr(tt, cls)(16, 64).train(training)
    x = torch.randn(shape, requires_grad=training)
    with torch.set_grad_enabled(training):
        e = expect("x", lambda: mod(x))
    assert e.op == cls and e.expected == "[..., hidden_size=16]" and e.actual == str(list(shape))
    assert mod.l1_loss is None and mod.l0 is None  # nothing recorded


@pytest.mark.parametrize("cls", ["SparseGatedMLP", "SparseMLP"])
@pytest.mark.parametrize("training", [False, True])
def test_module_refuses_a_wrong_dtype_or_device(cls, training):
    mod = getattr(tt, cls)(16, 64).train(training)
    with torch.set_grad_enabled(training):
        for dtype in (torch.float64, torch.bfloat16, torch.int64):
            e = expect("x", lambda: mod(torch.zeros(3, 16, dtype=dtype)))
            assert e.op == cls and "float32" in e.expected and e.actual == str(dtype)[6:]
        meta = getattr(tt, cls)(16, 64, device="meta").train(training)  # weights elsewhere
        e = expect("x", lambda: meta(torch.zeros(3, 16)))
        assert e.op == cls and "meta" in e.expected and e.actual == "cpu"


def test_fake_implementations_check_x():
    """The fake implementations (torch.compile traces with them) refuse what the real ops refuse,
    so a compiled graph fails as it is traced instead of giving a wrongly shaped result."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, gate, up, down = sample_inputs("cpu", torch.float32, True)
    down_kn = down.t().contiguous()
    with FakeTensorMode() as mode:
        x, gate, up, down, down_kn = (mode.from_tensor(t) for t in (x, gate, up, down, down_kn))
        wide = torch.empty(4, 32)
        for bad in (wide, x.double(), x.reshape(1, 9, 16)):
            expect("x", lambda: torch.ops.twell.ffn(bad, gate, up, down, 64, 8, "sparse", -1.0))
            expect("x", lambda: torch.ops.twell.ffn_train(bad, gate, up, down_kn, 64, 8, "sparse",
                                                          -1.0))
        _, saved, _ = torch.ops.twell.ffn_train(x, gate, up, down_kn, 64, 8, "sparse", -1.0)
        l1 = torch.zeros(1)
        backward = torch.ops.twell.ffn_train_backward
        for bad in (wide, x[:4], x.double()):
            expect("dy", lambda: backward(bad, x, gate, up, down_kn, saved, l1, 64, 8, "sparse",
                                          -1.0))
        expect("x", lambda: backward(wide, wide, gate, up, down_kn, saved, l1, 64, 8, "sparse",
                                     -1.0))


def test_state_dict_is_a_llama_mlps():
    mod = tt.SparseGatedMLP(16, 64)
    assert {k: tuple(v.shape) for k, v in mod.state_dict().items()} == {
        "gate_proj.weight": (64, 16), "up_proj.weight": (64, 16), "down_proj.weight": (16, 64)}
    mod.freeze()
    assert set(mod.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    plain = tt.SparseMLP(16, 64)
    assert set(plain.state_dict()) == {"up_proj.weight", "down_proj.weight"}


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("gated", [True, False])
def test_plan_cache_follows_weights(device, dtype, gated):
    """One plan per gate and up weights, reused while they live and dropped when one dies, pointed
    at each call's down tensor (a new copy per call under torch.compile); it reads the weights'
    values at every run (the CPU backend's fp32 copies of 16-bit weights too)."""
    from twell.torch import _plans
    tt.clear_plans()
    x, gate, up, down = sample_inputs(device, dtype, gated)
    torch.ops.twell.ffn(x, gate, up, down, 64, 8, "auto", -1.0)
    torch.ops.twell.ffn(x, gate, up, down, 64, 8, "auto", -1.0)
    assert len(_plans._plans) == 1
    for scale in (-3.0, 0.5):  # fresh down copies, one plan: each call reads its own
        other = down * scale
        y1, _ = torch.ops.twell.ffn(x, gate, up, other, 64, 8, "auto", -1.0)
        want = mlp_reference(x, gate, up, other)
        del other
        torch.testing.assert_close(y1.double(), want, rtol=2e-2,
                                   atol=2e-2 * float(want.abs().max()))
        assert len(_plans._plans) == 1
    keep = up.clone()
    torch.ops.twell.ffn(x, gate, keep, down, 64, 8, "auto", -1.0)
    assert len(_plans._plans) == 2
    del keep  # the up weight dies: its plan goes
    assert len(_plans._plans) == 1
    with torch.no_grad():
        down.mul_(2)  # weights updated in place: the plan reads the new values
        up.mul_(-4)  # (the first weight of a plain FFN: its active set changes)
    y2, _ = torch.ops.twell.ffn(x, gate, up, down, 64, 8, "auto", -1.0)
    assert len(_plans._plans) == 1
    want = mlp_reference(x, gate, up, down)
    torch.testing.assert_close(y2.double(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("gated", [True, False])
def test_dense_saved_buffer_zeroes_all_but_the_planes(gated):
    """The dense form's state buffer (CUDA's, whose GEMMs write the backup planes) is zeroed
    everywhere else: every array before the planes, the padding after them and the arrays after;
    a size of another layout is zeroed whole."""
    from twell import layout
    from twell.torch import _ops
    m, k, n, tile = 37, 16, 200, 64
    x = torch.empty(m, k, dtype=torch.bfloat16)
    up = torch.empty(n, k, dtype=torch.bfloat16)
    gate = up if gated else None
    planes = 2 if gated else 1
    size = _ops.saved_dtype("cpu", torch.bfloat16).itemsize  # the values' (on CUDA: bf16's 2)
    at = layout.saved_offsets(m, n, tile, 1, planes, size, dense=True)
    plane_end = at["backup"] + planes * m * n * size
    def garbage(n, dtype):  # memory as an allocator may hand it out: anything but zeros
        return torch.full((n,), 0xFF, dtype=dtype)

    for nbytes in (at["end"], at["end"] + 16):
        buf = _ops._saved_buffer(x, gate, up, tile, nbytes, dense=True, empty=garbage)
        assert buf.numel() == nbytes and buf.dtype == torch.uint8
        assert not buf[:at["backup"]].any() and not buf[plane_end:].any()
        assert plane_end < at["end"]  # padding and later arrays exist and were checked
    buf = _ops._saved_buffer(x, gate, up, tile, at["end"], dense=True, empty=garbage)
    assert buf[at["backup"]:plane_end].eq(0xFF).all()  # the planes: left to the GEMMs
    assert not _ops._saved_buffer(x, gate, up, tile, 1000, dense=False, empty=garbage).any()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("gated", [True, False])
def test_eager_training_skips_the_op_dispatch_with_the_ops_results(seed, device, gated,
                                                                   monkeypatch):
    """A plain eager training call runs the op's own forward and backward bodies through an
    autograd Function (no custom-op dispatch): outputs, L1 term and every gradient are the op's
    (bit for bit where the plan's path is fixed), twell.torch.saved finds its state, and under a
    Python dispatch mode (here FlopCounterMode) the call goes through the op."""
    from torch.utils.flop_counter import FlopCounterMode

    from twell.torch import _ops, saved
    skip_unless_trainable(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    p = problem(seed, 45, 32, 200, gated)
    mod = module_for(p, dtype, device, l1_coef=1e-3, dispatch="sparse")
    x = torch.from_numpy(p.x).to(device, dtype)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)

    def step(mode=None):
        xg = x.clone().requires_grad_()
        for q in mod.parameters():
            q.grad = None
        with mode if mode is not None else contextlib.nullcontext():
            y = mod(xg)
        node = saved.train_node(y)
        ((y * dy).sum() + mod.l1_loss).backward()
        return node, [y.detach(), mod.l1_loss.detach(), xg.grad] + [q.grad for q in mod.parameters()]

    node, eager = step()
    assert node is not None and "eager" in type(node).__name__
    node, through_op = step(FlopCounterMode(display=False))
    assert node is not None and "eager" not in type(node).__name__
    monkeypatch.setattr(_ops, "plain_eager", lambda x: False)
    node, op = step()
    assert node is not None and "eager" not in type(node).__name__
    monkeypatch.undo()
    for through in ("eager", "op"):  # first order only, both ways: a clear error, never a silent 0
        if through == "op":
            monkeypatch.setattr(_ops, "plain_eager", lambda x: False)
        xg = x.clone().requires_grad_()
        # a loss whose gradient at y depends on y: its second order needs the layer's
        (gx,) = torch.autograd.grad((mod(xg) * dy).pow(2).sum(), xg, create_graph=True)
        with pytest.raises(RuntimeError, match="differentiate twice|no autograd formula"):
            gx.sum().backward()
    for a, b, c in zip(eager, op, through_op):
        if device == "cpu":
            assert torch.equal(a, b) and torch.equal(a, c)
        else:  # a CUDA plan's later calls may send backup rows through cuBLAS: exact, not bitwise
            assert rel_error(a, b) < 1e-2 and rel_error(a, c) < 1e-2
