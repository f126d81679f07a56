"""GPU only: CUDA streams, no host synchronisation, CUDA-graph capture."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import twell  # noqa: E402
import twell.torch as tt  # noqa: E402

from torch_cases import (captured, module_for, problem, rel_error,  # noqa: E402
                         skip_unless_trainable)

if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)
if not twell.cuda_compiled():
    pytest.skip("twell was built without its CUDA backend", allow_module_level=True)

DTYPE = torch.bfloat16


def frozen_module(seed, gated=True, m=64, k=64, n=512, **kwargs):
    p = problem(seed, m, k, n, gated)
    mod = module_for(p, DTYPE, "cuda", tile=128, capacity=16, **kwargs).eval().freeze()
    return mod, torch.from_numpy(p.x).to("cuda", DTYPE)


def test_deterministic_algorithms_give_bit_identical_inference(seed):
    """Under torch.use_deterministic_algorithms the layer's plan keeps every backup row on twell's
    kernel, so reruns match bit for bit (fast mode sends them through cuBLAS once it has learned
    how many there are); a capacity of 2 routes some rows (and the problem's all-active row)."""
    p = problem(seed, 64, 64, 512, True)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        tt.clear_plans()
        mod = module_for(p, DTYPE, "cuda", tile=64, capacity=2, dispatch="sparse").eval().freeze()
        x = torch.from_numpy(p.x).to("cuda", DTYPE)
        with torch.no_grad():
            runs = [mod(x).clone() for _ in range(3)]
        torch.cuda.synchronize()
    finally:
        torch.use_deterministic_algorithms(was)
        tt.clear_plans()
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_inference_does_not_synchronise(seed):
    mod, x = frozen_module(seed)
    with torch.no_grad():
        mod(x)  # plan creation (allocates pinned memory) happens once, outside the check
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            y = mod(x)
            l0 = mod.l0
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert y.shape == x.shape and l0.device.type == "cuda"


def test_side_stream_matches_default_stream(seed):
    mod, x = frozen_module(seed, dispatch="sparse")
    with torch.no_grad():
        # The plan learns from its first run how many backup rows to send through cuBLAS (their
        # rounding may differ from the first run's kernel); later runs on the same data agree.
        mod(x)
        torch.cuda.synchronize()
        want = mod(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = mod(x)
        torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dispatch", ["auto", "sparse", "dense"])
@pytest.mark.parametrize("gated", [True, False])
def test_cuda_graph_inference(seed, dispatch, gated):
    mod, x = frozen_module(seed, gated, dispatch=dispatch)
    static_x = x.clone()
    with torch.no_grad():
        graph, static_y = captured(lambda: mod(static_x))
        for scale in (1.0, -0.5, 2.0):
            static_x.copy_(x * scale)
            graph.replay()
            want = mod(static_x)
            if dispatch == "auto":
                # The graph keeps the path chosen at capture; eager runs may calibrate to the other,
                # which rounds h once more (dense) or not: the two agree to bf16 rounding, not
                # elementwise (a near-zero output's relative difference can be large).
                assert rel_error(static_y, want) < 1e-2
            else:
                torch.testing.assert_close(static_y, want, rtol=0, atol=0)


@pytest.mark.parametrize("compiled", [False, True])
def test_unfrozen_module_in_a_cuda_graph(seed, compiled):
    """An unfrozen module (its down copy made inside each call) captures and replays: the plan
    made in the warm-up is pointed at the copy the capture makes; replays follow later changes
    of down_proj.weight, as eager calls do. Compiled: the op's path, a new down copy per call."""
    mod, x = frozen_module(seed)
    mod.unfreeze()
    f = torch.compile(mod) if compiled else mod
    static_x = x.clone()
    with torch.no_grad():
        graph, static_y = captured(lambda: f(static_x))
        for scale in (1.0, -0.5):
            mod.down_proj.weight.mul_(scale)
            graph.replay()
            want = mod.freeze()(static_x)
            mod.unfreeze()
            assert rel_error(static_y, want) < 1e-2, scale


@pytest.mark.parametrize("dispatch", ["sparse", "auto"])
def test_cuda_graph_training_step(seed, dispatch):
    """Whole-step capture (forward, L1 term, backward, optimizer) replays like eager steps. "auto":
    this problem's density (~8%) is above dense_above, so once a forward has finished (the
    synchronisation below) both modules save the dense form, eager and captured alike."""
    skip_unless_trainable("cuda")
    p = problem(seed, 64, 64, 512, True)
    kw = {"tile": 128, "capacity": 16, "l1_coef": 0.01, "dispatch": dispatch}
    eager = module_for(p, DTYPE, "cuda", **kw).train()
    graphed = module_for(p, DTYPE, "cuda", **kw).train()
    x = torch.from_numpy(p.x).to("cuda", DTYPE)
    # lr small enough that the steps converge (0.1 diverges to inf within 5 steps, CPU and CUDA alike).
    opt_e = torch.optim.SGD(eager.parameters(), lr=1e-3)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=1e-3)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(eager, opt_e, x)
            step(graphed, opt_g, x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()  # the plans' calibration sees the warm-up steps' densities
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(graphed, opt_g, x)
    for _ in range(3):
        graph.replay()
        loss = step(eager, opt_e, x)
        assert torch.isfinite(loss)
        torch.testing.assert_close(static_loss, loss)
    for a, b in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dispatch", ["sparse", "dense"])
def test_nonfinite_l1_gradient_reaches_the_gradients(seed, dispatch):
    """A NaN upstream gradient of the L1 value (a loss scaler's overflow) stays on the device,
    unchecked, and still makes gradients non-finite, so that GradScaler skips the step: those of
    the active units on either saved form, and on the dense form every element dense autograd
    makes NaN through the inactive units too (a gated FFN's dup and dx: all of them). ddown does
    not depend on it and stays finite."""
    skip_unless_trainable("cuda")
    p = problem(seed, 64, 64, 512, True)
    mod = module_for(p, DTYPE, "cuda", tile=128, capacity=16, l1_coef=0.5, dispatch=dispatch)
    x = torch.from_numpy(p.x).to("cuda", DTYPE).requires_grad_()
    y = mod(x)
    (y.float().sum() + float("nan") * mod.l1_loss).backward()
    dgate, dup, ddown = (q.grad for q in mod.parameters())
    assert torch.isfinite(ddown).all()
    for name, g in (("x", x.grad), ("gate", dgate), ("up", dup)):
        assert not torch.isfinite(g).all(), f"d {name}: no non-finite element"
    if dispatch == "dense":
        assert torch.isnan(dup).all() and torch.isnan(x.grad).all()


def auto_step_sizes(leaves, tile, capacity, steps):
    """(the saved size of one eager training step under "sparse", those of `steps` steps under
    "auto" after it): every auto step's output and gradients match the sparse step's to bf16
    rounding. leaves: x, gate, up, down (nn.Linear layout, [K, N]), the same tensors every call
    (plans are cached on the weights' addresses, and the calibration is the plan's)."""
    def run(dispatch):
        for a in leaves:
            a.grad = None
        y, saved, stats = torch.ops.twell.ffn_train(*leaves, tile, capacity, dispatch, -1.0)
        (y.float().square().mean() + 0.01 * stats[1]).backward()
        torch.cuda.synchronize()  # the calibration polls finished forwards only
        return saved.numel(), [y.detach()] + [a.grad for a in leaves]

    tt.clear_plans()
    first, want = run("sparse")
    seen = []
    for _ in range(steps):
        size, got = run("auto")
        seen.append(size)
        for a, b in zip(got, want):
            err = float((a.float() - b.float()).norm() / b.float().norm())
            assert err <= 2e-2, f"{err:.3g}"
    return first, seen


def test_training_dispatch_moves_to_the_dense_form(seed):
    """Eager training under "auto": the first forward saves the compact form; once it has finished,
    a density above dense_above (this problem: ~8% against 4%) moves the saved state to the dense
    form (the saved tensor's size tells), and every step's output and gradients are the compact
    form's to bf16 rounding. Backward takes the form from the saved tensor, whatever the plan
    would ask for by then."""
    from twell import layout

    skip_unless_trainable("cuda")
    p = problem(seed, 96, 64, 512, True)
    t = lambda a: torch.from_numpy(a).to("cuda", DTYPE)
    tile, capacity = 128, 16
    sizes = {form: layout.saved_bytes(96, 512, tile, capacity, 2, DTYPE, dense=form == "dense")
             for form in ("compact", "dense")}
    leaves = [a.clone().requires_grad_() for a in (t(p.x), t(p.gate), t(p.up), t(p.down).t().contiguous())]
    first, seen = auto_step_sizes(leaves, tile, capacity, 4)
    assert first == sizes["compact"]
    assert seen[0] == sizes["compact"] and set(seen[1:]) == {sizes["dense"]}, seen


@pytest.mark.parametrize("gated", [True, False])
def test_dense_form_state_is_the_same_whatever_memory_held(seed, gated):
    """The dense form's saved buffer is not zeroed where its GEMMs write (the backup planes): its
    bytes must still not depend on what the allocator's memory held before (a run over 0xff
    garbage, one over zeros, byte for byte), and the step is exact (dense's own gradients)."""
    skip_unless_trainable("cuda")
    m, k, n = 80, 64, 520  # N not a multiple of the tile: a partial last tile and padding
    p = problem(seed, m, k, n, gated, special_rows=False)
    t = lambda a: torch.from_numpy(a).to("cuda", DTYPE)
    gate = t(p.gate) if gated else None
    args = (t(p.x), gate, t(p.up), t(p.down).t().contiguous(), 128, 16, "dense", -1.0)
    nbytes = torch.ops.twell.ffn_train(*args)[1].numel()
    states = []
    for fill in (0xFF, 0x00):
        # blocks of the state's size, freed holding `fill`: the caching allocator hands one back
        junk = [torch.full((nbytes,), fill, dtype=torch.uint8, device="cuda") for _ in range(8)]
        block = -(-nbytes // 512) * 512  # the caching allocator's rounding
        held = [(j.data_ptr(), j.data_ptr() + block) for j in junk]
        del junk
        y, saved, stats = torch.ops.twell.ffn_train(*args)
        # the state took memory that held `fill` (the call's smaller tensors may take the start
        # of a freed block, so the state can begin inside one and run into the next)
        assert _covered(saved.data_ptr(), saved.data_ptr() + nbytes, held)
        states.append((y.clone(), saved.clone(), stats.clone()))
    (y0, s0, st0), (y1, s1, st1) = states
    assert torch.equal(s0, s1) and torch.equal(y0, y1) and torch.equal(st0, st1)
    ref = dense_mlp(args[0].double(), None if gate is None else gate.double(), args[2].double(),
                    args[3].double())
    assert rel_error(y0, ref) < 1e-2


def _covered(lo, hi, ranges):
    """Whether [lo, hi) lies within the union of the [start, end) ranges."""
    for start, end in sorted(ranges):
        if start <= lo < end:
            lo = end
        if lo >= hi:
            return True
    return False


def dense_mlp(x, gate, up, down):
    """y = relu(x gate^T) (x up^T) down^T (gated), or relu(x up^T) down^T, in x's dtype."""
    import torch.nn.functional as F
    u = F.linear(x, up)
    h = torch.relu(F.linear(x, gate)) * u if gate is not None else torch.relu(u)
    return F.linear(h, down)


def test_training_state_follows_the_density(seed):
    """Eager training under "auto" with the default capacity: once a forward's density has
    arrived (~0.02% here), the compact state shrinks from tile / 16 to tile / 64 slots per tile
    (its size tells; the capacities are twell.layout's mirror of the plan's), and every step's
    output and gradients are the fixed-size "sparse" run's to bf16 rounding."""
    from twell import layout

    skip_unless_trainable("cuda")
    m, n = 512, 1024
    p = problem(seed, m, 64, n, True, rate=1e-4, special_rows=False)
    t = lambda a: torch.from_numpy(a).to("cuda", DTYPE)
    leaves = [a.clone().requires_grad_() for a in (t(p.x), t(p.gate), t(p.up), t(p.down).t().contiguous())]
    plan = twell.TrainingPlan(*[tt._plans.dl(a.detach()) for a in leaves[1:3]],
                              tt._plans.dl(leaves[3].detach().t().contiguous()))
    capacities = layout.training_capacities(0, 0, True)
    assert capacities == [16, 8, 4] and plan.min_capacity == 4
    assert [s.capacity for s in plan.saved_shapes(m)] == capacities + [1]
    sizes = {c: layout.saved_bytes(m, n, 256, c, 2, DTYPE) for c in capacities}
    dense = layout.saved_bytes(m, n, 256, 1, 2, DTYPE, dense=True)
    first, seen = auto_step_sizes(leaves, 0, 0, 6)
    assert first == sizes[16]
    compact = [s for s in seen if s != dense]
    assert compact[0] == sizes[16] and set(compact[1:]) == {sizes[4]}, (seen, sizes)


@pytest.mark.parametrize("tile", [0, 64, 128])
@pytest.mark.parametrize("capacity", [0, 8])
@pytest.mark.parametrize("dispatch", ["auto", "sparse", "dense"])
def test_training_capacities_mirror_the_plan(tile, capacity, dispatch):
    """twell.layout's capacities and sizes (the torch ops' fake and their form detection) are the
    CUDA plan's saved_shapes, for every tile, capacity and dispatch the ops pass."""
    from twell import layout
    from twell.torch import _ops

    skip_unless_trainable("cuda")
    m, n, k = 33, 1000, 64
    w = torch.zeros(n, k, device="cuda", dtype=DTYPE)
    plan = twell.TrainingPlan(*[tt._plans.dl(w) for _ in range(3)], tile=tile, capacity=capacity,
                              dispatch=tt._plans.dispatch_value(dispatch))
    want = layout.training_capacities(tile, capacity, dispatch == "auto")
    shapes = plan.saved_shapes(m)
    assert [s.capacity for s in shapes if s.backup_capacity == 0] == want
    x = torch.zeros(m, k, device="cuda", dtype=DTYPE)
    assert [s.bytes(twell.DType.bf16) for s in shapes if s.backup_capacity == 0] == \
        _ops._compact_sizes(x, w, w, tile, capacity, dispatch)
    assert plan.saved_bytes(m) in [s.bytes(twell.DType.bf16) for s in shapes]


def step(model, opt, x):
    opt.zero_grad(set_to_none=True)  # inside a capture: backward allocates the grads it writes
    loss = model(x).float().square().mean() + tt.l1_loss(model)
    loss.backward()
    opt.step()
    return loss.detach()


def _mlp_against_fp64(mlp, x, dy):
    """Relative errors of one MLP's y, dx, dWg, dWu, dWd against an fp64 evaluation of the same
    module (its weights, x and dy as given); the module's own .grad fields are left alone."""
    wg, wu, wd = (p.detach().double() for p in (mlp.gate_proj.weight, mlp.up_proj.weight,
                                                  mlp.down_proj.weight))
    x64, dy64 = x.double(), dy.double()
    g, u = x64 @ wg.t(), x64 @ wu.t()
    h = g.clamp_min(0) * u
    dh = dy64 @ wd
    dg, du = dh * u * (g > 0), dh * g.clamp_min(0)
    want = [h @ wd.t(), dg @ wg + du @ wu, dg.t() @ x64, du.t() @ x64, dy64.t() @ h]
    xi = x.clone().requires_grad_(True)
    y = mlp(xi)
    params = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    got = [y] + list(torch.autograd.grad(y, [xi] + params, dy))
    return [float((a.double() - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(got, want)]


def test_patched_llama_forward_backward_match_dense(seed):
    """A transformers Llama patched with twell runs forward and backward on the GPU.
    Each patched MLP, fed the input and output gradient its layer saw in the bf16 dense model, is
    within 2x the dense MLP's error from an fp64 evaluation (y, dx and each weight gradient), in
    the compact saved form and as automatic dispatch runs it. The whole model: logits within 2x
    the dense model's distance from a float32 run; gradients only loosely (each within 0.5 of the
    float32 run, their sum within 4x the dense model's), which catches wiring errors: in this model
    of 2 layers and 24 tokens some gate values lie within rounding of zero, and a ReLU that an
    upstream layer's rounding flips moves a small gradient (layer 1's gate weight) by several times
    bf16's error. Development runs on an H200: per-tensor checks at 3x failed 5 seeds of 61 while
    each patched layer stayed as close to fp64 as the dense one; over 500 seeds the sum ratio had
    median 1.00 and maximum 2.54, the largest gradient error 0.21, the logits ratio at most 0.32."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from test_patch import mlps, tiny, tokens

    skip_unless_trainable("cuda")
    model = tiny("Llama", hidden_act="relu").to("cuda", DTYPE).train()
    dense = copy.deepcopy(model)
    exact = copy.deepcopy(model).float()
    assert tt.patch_model(model) == 2
    ids = tokens(seed).to("cuda")
    seen = {}
    hooks = []
    for i, mlp in enumerate(mlps(dense)):
        hooks.append(mlp.register_forward_hook(
            lambda m, args, out, i=i: seen.__setitem__(("x", i), args[0].detach().clone())))
        hooks.append(mlp.register_full_backward_hook(
            lambda m, gin, gout, i=i: seen.__setitem__(("dy", i), gout[0].detach().clone())))
    outs = [m(ids, labels=ids) for m in (model, dense, exact)]
    for o in outs:
        o.loss.backward()
    for h in hooks:
        h.remove()

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))

    pairs = [("logits", outs[0].logits, outs[1].logits, outs[2].logits)]
    for (name, p), q, r in zip(model.named_parameters(), dense.parameters(), exact.parameters()):
        pairs.append((name, p.grad, q.grad, r.grad))
    ours = [rel(a, ref) for _, a, _, ref in pairs]
    theirs = [rel(b, ref) for _, _, b, ref in pairs]
    assert ours[0] <= 2 * theirs[0] + 2**-9, f"logits: twell {ours[0]:.3g}, dense bf16 {theirs[0]:.3g}"
    assert sum(ours) <= 4 * sum(theirs), f"twell {sum(ours):.3g}, dense bf16 {sum(theirs):.3g} in all"
    for (name, *_), err in zip(pairs, ours):
        assert err <= 0.5, f"{name}: twell {err:.3g} from float32"

    names = ("y", "dx", "dWg", "dWu", "dWd")
    patched = [m for _, m in tt.sparse_modules(model)]
    for i, (ours_mlp, dense_mlp) in enumerate(zip(patched, mlps(dense))):
        x = seen[("x", i)].reshape(-1, ours_mlp.hidden_size)
        dy = seen[("dy", i)].reshape(-1, ours_mlp.hidden_size)
        base = _mlp_against_fp64(dense_mlp, x, dy)
        for dispatch in ("sparse", ours_mlp.dispatch):
            ours_mlp.dispatch, kept = dispatch, ours_mlp.dispatch
            try:
                errs = _mlp_against_fp64(ours_mlp, x, dy)
            finally:
                ours_mlp.dispatch = kept
            for n, err, b in zip(names, errs, base):
                assert err <= 2 * b + 2**-12, \
                    f"layer {i} {n} ({dispatch}): twell {err:.3g}, dense bf16 {b:.3g}"
