"""twell._core with numpy arrays only (no framework): the binding runs everywhere."""
import numpy as np
import pytest

import twell
from twell import layout

from problems import FLOOR, backward, forward, make_problem, rel_error

SHAPES = [  # M, K, N, tile, capacity
    (1, 16, 64, 32, 4),
    (7, 24, 96, 32, 2),
    (37, 32, 200, 64, 8),  # N not a multiple of the tile
    (0, 16, 64, 32, 4),
]


def plan_args(p):
    return p.gate, p.up, p.down


def active_count_matches(count, exact):
    """count == the oracle's active units, up to units whose pre-activation is within rounding
    of float32 accumulation from 0."""
    g = exact.x @ (exact.gate if exact.gate is not None else exact.up).T
    return abs(round(float(count)) - np.count_nonzero(g > 0)) <= np.count_nonzero(np.abs(g) < 1e-5)


def test_info():
    assert twell.version() == twell.__version__ == "0.1.0"
    assert isinstance(twell.cuda_compiled(), bool)
    assert twell.cuda_device_count() >= 0
    assert issubclass(twell.TwellError, ValueError)
    assert twell.TwellError.__module__ == "twell"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dispatch", ["automatic", "force_sparse", "force_dense"])
def test_inference(seed, dtype, gated, shape, dispatch):
    m, k, n, tile, capacity = shape
    p = make_problem(np.random.default_rng(seed), m, k, n, gated).cast(dtype)
    exact = p.cast(np.float64)
    plan = twell.InferencePlan(*plan_args(p), tile=tile, capacity=capacity,
                               dispatch=getattr(twell.Dispatch, dispatch))
    y = np.full((m, k), np.nan, dtype)
    counters = np.full(2, -1, np.int64)
    plan.run(p.x, y, counters=counters)
    h, ref = forward(exact)
    _, plain = forward(exact, rounding=dtype)
    assert rel_error(y, ref) <= 2 * rel_error(plain, ref) + FLOOR[np.dtype(dtype)]
    assert np.all(y[np.all(ref == 0, axis=1)] == 0)
    assert active_count_matches(counters[1], exact)
    info = plan.last_run()
    assert info.rows == m
    if dispatch != "automatic" and m > 0:
        assert info.ran_dense == (dispatch == "force_dense")


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_inference_by_address(seed, gated, shape):
    """_run_addresses (private: twell.torch's eager calls) gives run()'s bits; the plan still
    refuses what an address shows (null, misaligned, overlapping, negative rows, a workspace size
    without a workspace), and workspace_bytes_for refuses negative rows."""
    m, k, n, tile, capacity = shape
    p = make_problem(np.random.default_rng(seed), m, k, n, gated).cast(np.float32)
    plan = twell.InferencePlan(*plan_args(p), tile=tile, capacity=capacity,
                               dispatch=twell.Dispatch.force_sparse)
    assert not hasattr(plan, "run_addresses"), "raw addresses are private"
    x = np.ascontiguousarray(p.x)
    y_run = np.full((m, k), np.nan, np.float32)
    plan.run(x, y_run)
    y = np.full((m, k), np.nan, np.float32)
    counters = np.full(2, -1, np.int64)
    plan._run_addresses(x.ctypes.data, y.ctypes.data, m, counters.ctypes.data, 0, 0, 0)
    assert np.array_equal(y, y_run, equal_nan=True) and plan.last_run().rows == m
    assert active_count_matches(counters[1], p.cast(np.float64))
    assert plan.workspace_bytes_for(m) == plan.workspace_bytes(x, y)
    with pytest.raises(twell.TwellError, match="rows"):
        plan.workspace_bytes_for(-1)
    with pytest.raises(twell.TwellError, match="non-negative"):
        plan._run_addresses(x.ctypes.data, y.ctypes.data, -1, 0, 0, 0, 0)
    with pytest.raises(twell.TwellError, match="workspace"):
        plan._run_addresses(x.ctypes.data, y.ctypes.data, m, 0, 0, 64, 0)
    if m > 0:
        with pytest.raises(twell.TwellError, match="overlap|share"):
            plan._run_addresses(x.ctypes.data, x.ctypes.data, m, 0, 0, 0, 0)
        for name, args in {"x": (0, y.ctypes.data), "y": (x.ctypes.data, 0),
                           "x aligned": (x.ctypes.data + 1, y.ctypes.data),
                           "y aligned": (x.ctypes.data, y.ctypes.data + 2)}.items():
            with pytest.raises(twell.TwellError) as e:
                plan._run_addresses(*args, m, 0, 0, 0, 0)
            assert e.value.argument == name.split()[0], str(e.value)
            assert ("aligned" in name) == ("aligned" in e.value.expected), str(e.value)
        with pytest.raises(twell.TwellError, match="counters"):
            plan._run_addresses(x.ctypes.data, y.ctypes.data, m, counters.ctypes.data + 4, 0, 0, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_training(seed, dtype, gated, shape):
    m, k, n, tile, capacity = shape
    rng = np.random.default_rng(seed)
    p = make_problem(rng, m, k, n, gated).cast(dtype)
    exact = p.cast(np.float64)
    l1_coef = 0.3
    plan = twell.TrainingPlan(*plan_args(p), tile=tile, capacity=capacity)
    saved = np.zeros(plan.saved_bytes(m), np.uint8)
    y = np.full((m, k), np.nan, dtype)
    stats = np.zeros(2, np.float32)
    plan.forward(p.x, y, saved, stats)

    h, ref = forward(exact)
    floor = FLOOR[np.dtype(dtype)]
    _, plain = forward(exact, rounding=dtype)
    assert rel_error(y, ref) <= 2 * rel_error(plain, ref) + floor
    assert active_count_matches(stats[0] * max(m, 1), exact)
    assert stats[1] == pytest.approx(np.abs(h).sum() / max(m, 1), rel=1e-4, abs=1e-6)

    dy = rng.standard_normal((m, k)).astype(dtype)
    want = backward(exact, dy.astype(np.float64), l1_coef)
    grads = [np.full((m, k), np.nan, dtype)] + [
        np.full((n, k), np.nan, np.float32) if w is not None else None
        for w in (p.gate, p.up, p.down)]
    plan.backward(dy, grads[0], grads[1], grads[2], grads[3], p.x, saved,
                  l1_coef=np.array([l1_coef], np.float32))
    for name, got, ref_grad in zip(("dx", "dgate", "dup", "ddown"), grads, want):
        if ref_grad is None:
            continue
        rounded = ref_grad.astype(got.dtype).astype(np.float64)
        tol = 2 * rel_error(rounded, ref_grad) + floor
        assert rel_error(got, ref_grad) <= tol, name


def test_l1_coef_from_plan_or_call(seed):
    """The per-call l1_coef array overrides the plan's option; both give the reference."""
    m, k, n = 9, 16, 64
    rng = np.random.default_rng(seed)
    p = make_problem(rng, m, k, n).cast(np.float32)
    dy = rng.standard_normal((m, k)).astype(np.float32)
    out = {}
    for how in ("plan", "call"):
        plan = twell.TrainingPlan(*plan_args(p), tile=32, capacity=4,
                                  l1_coef=0.5 if how == "plan" else 7.0)
        saved = np.zeros(plan.saved_bytes(m), np.uint8)
        plan.forward(p.x, np.empty((m, k), np.float32), saved)
        g = [np.empty((m, k), np.float32)] + [np.empty((n, k), np.float32) for _ in range(3)]
        coef = None if how == "plan" else np.array([0.5], np.float32)
        plan.backward(dy, *g, p.x, saved, l1_coef=coef)
        out[how] = g
    want = backward(p.cast(np.float64), dy.astype(np.float64), 0.5)
    for a, b, ref in zip(out["plan"], out["call"], want):
        assert np.array_equal(a, b)
        assert rel_error(a, ref) <= 1e-5


def test_saved_state_belongs_to_its_plan(seed):
    """Two plans of one shape, options and weights: backward on one refuses the state the other's
    forward wrote; plans made with one state_tag (a cache that may remake a layer's plan between
    forward and backward) accept each other's."""
    m, k, n = 9, 16, 64
    rng = np.random.default_rng(seed)
    p = make_problem(rng, m, k, n).cast(np.float32)
    dy = rng.standard_normal((m, k)).astype(np.float32)
    g = [np.empty((m, k), np.float32)] + [np.empty((n, k), np.float32) for _ in range(3)]

    def step(writer, reader):
        saved = np.zeros(writer.saved_bytes(m), np.uint8)
        writer.forward(p.x, np.empty((m, k), np.float32), saved)
        reader.backward(dy, *g, p.x, saved)

    a, b = (twell.TrainingPlan(*plan_args(p), tile=32, capacity=4) for _ in range(2))
    step(a, a)
    with pytest.raises(twell.TwellError, match="header owner") as e:
        step(a, b)
    assert e.value.argument == "saved"
    tagged = [twell.TrainingPlan(*plan_args(p), tile=32, capacity=4, state_tag=7) for _ in range(2)]
    step(*tagged)
    with pytest.raises(twell.TwellError, match="header owner"):
        step(tagged[0], a)


@pytest.mark.parametrize("m", [0, 1, 7, 255, 257])
@pytest.mark.parametrize("n,tile,capacity", [(64, 32, 4), (200, 64, 8), (1000, 0, 0), (5, 256, 1)])
@pytest.mark.parametrize("gated", [True, False])
def test_saved_layout_mirror(m, n, tile, capacity, gated):
    k = 8
    w = np.zeros((n, k), np.float32)
    plan = twell.TrainingPlan(w if gated else None, w, w, tile=tile, capacity=capacity)
    assert (plan.tile, plan.capacity) == layout.resolve_tile(tile, capacity, training=True)
    # The CPU backend keeps one capacity (only automatic dispatch on CUDA sizes it to the density).
    assert plan.min_capacity == plan.capacity
    assert layout.training_capacities(tile, capacity, False) == [plan.capacity]
    assert [s.capacity for s in plan.saved_shapes(m)] == [plan.capacity]
    shape = plan.saved_shape(m)
    assert (shape.rows, shape.cols, shape.planes, shape.backup_capacity) == (m, n, 1 + gated, 0)
    assert plan.saved_dtype() == twell.DType.f32  # the CPU backend saves float32
    want = layout.saved_bytes(m, n, plan.tile, plan.capacity, 1 + gated, np.dtype(np.float32))
    assert plan.saved_bytes(m) == shape.bytes(twell.DType.f32) == want
    f32 = np.dtype(np.float32)
    assert layout.compact_capacity_of(want, m, n, tile, capacity, False, 1 + gated, f32) == plan.capacity
    if m:  # the dense form's bytes are no compact state's
        dense_bytes = layout.saved_bytes(m, n, plan.tile, plan.capacity, 1 + gated, f32, dense=True)
        assert layout.compact_capacity_of(dense_bytes, m, n, tile, capacity, False, 1 + gated, f32) is None
    assert plan.saved_shape(m, twell.SavedForm.compact).bytes(twell.DType.f32) == want
    # The dense form (the CUDA backend's; its shape does not depend on the backend).
    dense = plan.saved_shape(m, twell.SavedForm.dense)
    assert (dense.capacity, dense.backup_capacity) == ((1, m) if m else (plan.capacity, 0))
    for dt, np_dt in ((twell.DType.f32, np.float32), (twell.DType.bf16, np.float16)):
        assert dense.bytes(dt) == layout.saved_bytes(m, n, plan.tile, plan.capacity, 1 + gated,
                                                     np.dtype(np_dt), dense=True)
    # The CPU backend keeps its own host scratch: no caller workspace, for either form.
    assert plan.workspace_bytes(m) == 0
    for form in (twell.SavedForm.compact, twell.SavedForm.dense):
        assert plan.workspace_bytes(m, form) == 0
        for call in (twell.TrainingCall.forward, twell.TrainingCall.backward, twell.TrainingCall.both):
            assert plan.workspace_bytes(m, form, call) == 0


def test_inference_options_resolved():
    w = np.zeros((64, 8), np.float32)
    plan = twell.InferencePlan(w, w, w)
    assert (plan.tile, plan.capacity) == layout.resolve_tile(0, 0) == (256, 32)
    assert plan.dispatch == twell.Dispatch.automatic
    assert plan.determinism == twell.Determinism.fast
    plan = twell.InferencePlan(w, w, w, determinism=twell.Determinism.deterministic)
    assert plan.determinism == twell.Determinism.deterministic


def test_zero_copy_views():
    """Strided numpy views are seen as they are (and refused), not silently copied."""
    m, k, n = 4, 8, 32
    x = np.ones((m, 2 * k), np.float32)[:, ::2]
    w = np.zeros((n, k), np.float32)
    plan = twell.InferencePlan(w, w, w, tile=32)
    with pytest.raises(twell.TwellError) as e:
        plan.run(x, np.zeros((m, k), np.float32))
    assert e.value.argument == "x" and "strides" in e.value.actual


def expect(argument, fn):
    with pytest.raises(twell.TwellError) as e:
        fn()
    assert e.value.argument == argument, str(e.value)
    assert str(e.value).startswith(f"{e.value.op}: {argument}: expected {e.value.expected}, got")
    return e.value


def test_bad_inputs():
    m, k, n = 4, 8, 32
    f32 = np.float32
    w, x, y = np.zeros((n, k), f32), np.zeros((m, k), f32), np.zeros((m, k), f32)
    plan = twell.InferencePlan(w, w, w, tile=32)
    expect("y", lambda: plan.run(x, np.zeros((m, k + 1), f32)))
    expect("x", lambda: plan.run(x.astype(np.float64), y))
    e = expect("x", lambda: plan.run(x.astype(np.float64), y))
    assert "float64" in e.actual and e.expected == "float32", str(e)  # what x accepts, no more
    assert expect("counters", lambda: plan.run(x, y, np.zeros(2, np.float64))).expected == "int64"
    assert expect("gate weight", lambda: twell.InferencePlan(w.astype(np.float64), w, w)).expected == \
        "float32, float16 or bfloat16"
    expect("x", lambda: plan.run(x.astype(np.float16), y))
    expect("counters", lambda: plan.run(x, y, counters=np.zeros(3, np.int64)))
    expect("down weight", lambda: twell.InferencePlan(w, w, np.zeros((k, n), f32)))
    expect("gate weight", lambda: twell.InferencePlan(w.astype(np.float16), w, w))
    expect("options.tile", lambda: twell.InferencePlan(w, w, w, tile=-1))
    expect("options.capacity", lambda: twell.InferencePlan(w, w, w, tile=32, capacity=33))
    expect("x", lambda: plan.run(np.zeros((2, 2, 2, 2, 2), f32), y))
    ok, reason = plan.can_run(x, np.zeros((m, 1), f32))
    assert not ok and "y: expected" in reason

    t = twell.TrainingPlan(w, w, w, tile=32)
    saved = np.zeros(t.saved_bytes(m), np.uint8)
    expect("saved", lambda: t.forward(x, y, saved[:-1]))
    expect("saved", lambda: t.forward(x, y, saved.view(np.int32)))
    unaligned = np.zeros(t.saved_bytes(m) + 16, np.uint8)[1:-15]
    assert expect("saved", lambda: t.forward(x, y, unaligned)).expected == "16-byte aligned memory"
    assert expect("stats", lambda: t.forward(x, y, saved, stats=np.zeros(2, np.float64))).expected == "float32"
    assert expect("saved", lambda: t.forward(x, y, saved.view(np.float64))).expected == "uint8"
    # A TrainingPlan's bad options name the TrainingPlan (not the InferencePlan whose checks it shares).
    assert expect("options.tile", lambda: twell.TrainingPlan(w, w, w, tile=70000)).op == "TrainingPlan"
    t.forward(x, y, saved)
    g = [np.zeros((n, k), f32) for _ in range(3)]
    expect("l1_coef", lambda: t.backward(y, x.copy(), *g, x, saved, l1_coef=np.zeros(2, f32)))
    expect("dgate", lambda: t.backward(y, x.copy(), None, g[1], g[2], x, saved))
    expect("ddown", lambda: t.backward(y, x.copy(), g[0], g[1], g[2].astype(np.float16), x, saved))
    expect("options.l1_coef", lambda: twell.TrainingPlan(w, w, w, l1_coef=-1.0))
    expect("rows", lambda: t.workspace_bytes(-1, twell.SavedForm.compact))
    expect("rows", lambda: t.workspace_bytes(-1, twell.SavedForm.compact, twell.TrainingCall.backward))
    expect("rows", lambda: t.workspace_bytes(-1))
