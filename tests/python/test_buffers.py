"""Every array argument of every binding is checked before the library touches its memory.

Each bad argument (a reversed or strided view, another dtype, too few elements, a read-only array
where the op writes, another device) must raise twell.TwellError naming that argument. The
arguments are carved out of one random byte buffer, and after each refused call the whole buffer
must be unchanged: a write outside an argument's own bytes, or any write before the error, shows.
"""
import numpy as np
import pytest

import twell

from problems import make_problem

M, K, N, TILE, CAPACITY = 4, 16, 64, 32, 4
ALIGN = 64  # every carved array starts on a 64-byte boundary (the saved state needs 16)


class Guarded:
    """Arrays carved one after another out of a random byte buffer."""

    def __init__(self, rng, nbytes):
        self.raw = rng.integers(0, 256, nbytes + 2 * ALIGN, dtype=np.uint8)
        start = -self.raw.ctypes.data % ALIGN + ALIGN  # a gap before the first array
        self.buf = self.raw[start:start + nbytes]
        self.at = 0
        self.snapshot = self.raw.copy()

    def take(self, count, dtype, shift=0):
        """`count` elements of `dtype` at the next aligned offset (plus `shift` bytes), a gap of
        ALIGN bytes after."""
        dtype = np.dtype(dtype)
        begin = self.at + shift
        self.at += (shift + count * dtype.itemsize + ALIGN - 1) // ALIGN * ALIGN + ALIGN
        assert self.at <= len(self.buf), "guard buffer too small"
        return self.buf[begin:begin + count * dtype.itemsize].view(dtype)

    def untouched(self):
        return np.array_equal(self.raw, self.snapshot)


OTHER_DTYPE = {np.dtype(np.float32): np.int32, np.dtype(np.int64): np.uint64,
               np.dtype(np.uint8): np.int8}


def bad_variants(g, shape, dtype, written):
    """(what, array) for each way an argument of `shape` and `dtype` can be wrong."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    out = []
    if shape[0] > 1:
        out.append(("reversed", g.take(count, dtype).reshape(shape)[::-1]))
        out.append(("strided", g.take(2 * count, dtype)[::2].reshape(shape)))
    out.append(("dtype", g.take(count, OTHER_DTYPE[dtype]).reshape(shape)))
    # An address its element type does not divide (byte buffers: not 16-byte aligned).
    out.append(("misaligned", g.take(count, dtype, 1 if dtype.itemsize > 1 else 8).reshape(shape)))
    small = shape[:-1] + (shape[-1] - 1,)  # contiguous, one element short in its last dimension
    out.append(("too small", g.take(int(np.prod(small)), dtype).reshape(small)))
    if written:
        ro = g.take(count, dtype).reshape(shape)
        ro.flags.writeable = False
        out.append(("read-only", ro))
    return out


def refused(argument, call, g):
    with pytest.raises(twell.TwellError) as e:
        call()
    assert e.value.argument == argument, str(e.value)
    assert g.untouched(), f"{argument}: memory changed by a refused call"
    return e.value


def problem(seed):
    return make_problem(np.random.default_rng(seed), M, K, N).cast(np.float32)


def inference_args(plan, p):
    """run()'s arguments, good ones: name -> (array, written)."""
    y = np.empty((M, K), np.float32)
    nbytes = plan.workspace_bytes(p.x, y)
    return {"x": (p.x, False), "y": (y, True), "counters": (np.empty(2, np.int64), True),
            "workspace": (np.empty(nbytes, np.uint8), True)}


@pytest.mark.parametrize("argument", ["x", "y", "counters", "workspace"])
def test_inference_run_refuses_bad_buffers(seed, argument):
    p = problem(seed)
    plan = twell.InferencePlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    args = inference_args(plan, p)
    good, written = args[argument]
    g = Guarded(np.random.default_rng(seed), 64 * good.nbytes + 16 * ALIGN)
    variants = bad_variants(g, good.shape, good.dtype, written)
    for what, bad in variants:
        call = dict({k: v for k, (v, _) in args.items()}, **{argument: bad})
        e = refused(argument, lambda: plan.run(**call), g)
        if what == "reversed":
            assert "non-negative strides" in e.expected, str(e)
        if what == "read-only":
            assert e.actual == "a read-only array", str(e)
    # The same arguments where they are good, carved from the guard: the call writes only them.
    call = {k: v for k, (v, _) in args.items()}
    call[argument] = g.take(good.size, good.dtype).reshape(good.shape)
    call[argument][...] = good
    around = g.raw.copy()
    plan.run(**call)
    inside = np.zeros(len(g.raw), bool)
    offset = call[argument].ctypes.data - g.raw.ctypes.data
    inside[offset:offset + call[argument].nbytes] = True
    assert np.array_equal(g.raw[~inside], around[~inside])


def training_setup(seed):
    p = problem(seed)
    plan = twell.TrainingPlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    saved = np.zeros(plan.saved_bytes(M), np.uint8)
    plan.forward(p.x, np.empty((M, K), np.float32), saved)
    return p, plan, saved


FORWARD = ["x", "y", "saved", "stats"]


@pytest.mark.parametrize("argument", FORWARD)
def test_training_forward_refuses_bad_buffers(seed, argument):
    p, plan, _ = training_setup(seed)
    args = {"x": (p.x, False), "y": (np.empty((M, K), np.float32), True),
            "saved": (np.zeros(plan.saved_bytes(M), np.uint8), True),
            "stats": (np.empty(2, np.float32), True)}
    good, written = args[argument]
    g = Guarded(np.random.default_rng(seed), 64 * good.nbytes + 16 * ALIGN)
    for _, bad in bad_variants(g, good.shape, good.dtype, written):
        call = dict({k: v for k, (v, _) in args.items()}, **{argument: bad})
        refused(argument, lambda: plan.forward(**call), g)


BACKWARD = ["dy", "dx", "dgate", "dup", "ddown", "x", "saved", "l1_coef"]


@pytest.mark.parametrize("argument", BACKWARD)
def test_training_backward_refuses_bad_buffers(seed, argument):
    p, plan, saved = training_setup(seed)
    dy = np.random.default_rng(seed).standard_normal((M, K)).astype(np.float32)
    args = {"dy": (dy, False), "dx": (np.empty((M, K), np.float32), True),
            "dgate": (np.empty((N, K), np.float32), True), "dup": (np.empty((N, K), np.float32), True),
            "ddown": (np.empty((N, K), np.float32), True), "x": (p.x, False), "saved": (saved, False),
            "l1_coef": (np.array([0.5], np.float32), False)}
    good, written = args[argument]
    g = Guarded(np.random.default_rng(seed), 64 * good.nbytes + 16 * ALIGN)
    for _, bad in bad_variants(g, good.shape, good.dtype, written):
        call = dict({k: v for k, (v, _) in args.items()}, **{argument: bad})
        refused(argument, lambda: plan.backward(**call), g)


@pytest.mark.parametrize("step", ["forward", "backward"])
def test_training_workspace_refused(seed, step):
    """The CPU backend needs no scratch, but a workspace passed in is still checked."""
    p, plan, saved = training_setup(seed)
    g = Guarded(np.random.default_rng(seed), 64 * ALIGN)
    ws = [("reversed", g.take(64, np.uint8)[::-1]), ("strided", g.take(128, np.uint8)[::2]),
          ("dtype", g.take(64, np.int8)), ("matrix", g.take(64, np.uint8).reshape(8, 8)),
          ("misaligned", g.take(64, np.uint8, 8))]
    ro = g.take(64, np.uint8)
    ro.flags.writeable = False
    ws.append(("read-only", ro))
    dy = np.ones((M, K), np.float32)
    grads = [np.empty((M, K), np.float32)] + [np.empty((N, K), np.float32) for _ in range(3)]
    for _, bad in ws:
        if step == "forward":
            call = lambda: plan.forward(p.x, np.empty((M, K), np.float32), saved, workspace=bad)
        else:
            call = lambda: plan.backward(dy, *grads, p.x, saved, workspace=bad)
        refused("workspace", call, g)


@pytest.mark.parametrize("weight", ["gate", "up", "down"])
def test_misaligned_weights_are_refused(seed, weight):
    """A weight at an address its dtype does not divide is refused by both plans' constructors."""
    p = problem(seed)
    g = Guarded(np.random.default_rng(seed), 4 * p.up.nbytes + 4 * ALIGN)
    bad = g.take(p.up.size, np.float32, 2).reshape(p.up.shape)
    weights = {"gate": p.gate, "up": p.up, "down": p.down}
    weights[weight] = bad
    for cls in (twell.InferencePlan, twell.TrainingPlan):
        refused(f"{weight} weight", lambda: cls(**weights, tile=TILE, capacity=CAPACITY), g)


def test_readonly_inputs_are_accepted(seed):
    """Inputs the library only reads (x, weights, dy, saved in backward, l1_coef) may be
    read-only."""
    p = problem(seed)
    for a in (p.x, p.gate, p.up, p.down):
        a.flags.writeable = False
    y = np.full((M, K), np.nan, np.float32)
    twell.InferencePlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY).run(p.x, y)
    plan = twell.TrainingPlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    saved = np.zeros(plan.saved_bytes(M), np.uint8)
    y2 = np.full((M, K), np.nan, np.float32)
    plan.forward(p.x, y2, saved)
    # The inference and training kernels sum in different orders: float32 rounding apart.
    np.testing.assert_allclose(y, y2, rtol=1e-4, atol=1e-5)
    dy = np.ones((M, K), np.float32)
    coef = np.array([0.5], np.float32)
    for a in (saved, dy, coef):
        a.flags.writeable = False
    grads = [np.full((M, K), np.nan, np.float32)] + [np.full((N, K), np.nan, np.float32)
                                                     for _ in range(3)]
    plan.backward(dy, *grads, p.x, saved, l1_coef=coef)
    assert all(np.isfinite(gr).all() for gr in grads)


def test_not_an_array_is_named(seed):
    p = problem(seed)
    plan = twell.InferencePlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    y = np.empty((M, K), np.float32)
    e = refused("x", lambda: plan.run(p.x.tolist(), y), Guarded(np.random.default_rng(0), 0))
    assert e.actual == "list"
    e = refused("workspace", lambda: plan.run(p.x, y, workspace=b"\0" * 4096),
                Guarded(np.random.default_rng(0), 0))  # bytes: read-only
    assert e.actual == "a read-only array"
    ok, reason = plan.can_run(p.x, np.zeros((M, K), np.float32)[::-1])
    assert not ok and "y: expected non-negative strides" in reason


def test_wrong_device_is_named(seed):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not (torch.cuda.is_available() and twell.cuda_compiled()):
        pytest.skip("no CUDA device (or twell built without CUDA): no other device to pass")
    p = problem(seed)
    plan = twell.InferencePlan(p.gate, p.up, p.down, tile=TILE, capacity=CAPACITY)
    y = np.empty((M, K), np.float32)
    cuda = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype, device="cuda")
    refused("workspace", lambda: plan.run(p.x, y, workspace=cuda(4096, dtype=torch.uint8)),
            Guarded(np.random.default_rng(0), 0))
    refused("counters", lambda: plan.run(p.x, y, counters=cuda(2, dtype=torch.int64)),
            Guarded(np.random.default_rng(0), 0))
    _, train, saved = training_setup(seed)
    grads = [np.empty((M, K), np.float32)] + [np.empty((N, K), np.float32) for _ in range(3)]
    refused("l1_coef", lambda: train.backward(np.ones((M, K), np.float32), *grads, p.x, saved,
                                              l1_coef=cuda(1)), Guarded(np.random.default_rng(0), 0))
    refused("saved", lambda: train.backward(np.ones((M, K), np.float32), *grads, p.x,
                                            cuda(len(saved), dtype=torch.uint8)),
            Guarded(np.random.default_rng(0), 0))
