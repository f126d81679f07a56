"""The twell custom ops (namespace ``twell``), their fake implementations and autograd.

Weights in nn.Linear layout: gate and up [N, K], and for the training ops down_proj.weight itself
[K, N]; twell::ffn takes down neuron-major [N, K] (down_proj.weight.t(), the copy an inference
module keeps). The training ops make the neuron-major copy during each call and never save it for
backward. `gate` is None for a plain FFN. x is [M, K], contiguous, of the weights' dtype. Streams
are the current CUDA stream; nothing synchronises the host, so the ops can be captured in CUDA
graphs.

  twell::ffn                 y, counters = FFN(x)   counters: int64 [2] {routed rows, active}
  twell::ffn_train           y, saved, stats        saved: uint8 state for backward,
                                                    stats: float32 [2] {L0, L1 value}
ffn_train's dispatch picks the saved form: "sparse" the compact form (its size depends on the
shapes alone, as torch.compile's fake tensors need: the modules pass it while compiling),
"dense" the dense form (CUDA), "auto" the form the plan's timing dispatch asks for (CUDA: the
compact form until measured, then the faster per density regime, the compact form with a default
capacity sized to the last forward's density: a data-dependent size). Backward takes the form and
capacity from the saved tensor's size.
  twell::ffn_train_backward  [dx, dgate, dup, ddown] (weights' gradients in float32, each
                                                    [N, K]: ddown neuron-major; no dgate for a
                                                    plain FFN)

ffn_train is differentiable w.r.t. x and the weights, through y and through stats[1], the L1
value (1/M) sum |h|: the upstream gradient of stats[1] is passed to the C++ backward as this
call's L1 coefficient, so any loss that uses l1_coef * stats[1] gets its exact gradient.

The modules' plain eager calls run the same bodies without the custom ops' dispatch (host time):
run_ffn_eager for inference, train() (an autograd Function around both training bodies) for
training; compiled, traced and dispatch-mode calls go through the ops.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

import twell
from twell import layout
from twell.torch import _plans


def saved_dtype(device_type, weight_dtype):
    """Element type of what training saves: float32 on the CPU backend, the weights' on CUDA."""
    return torch.float32 if device_type == "cpu" else weight_dtype


def _saved_bytes(x, gate, up, tile, capacity, dense=False):
    """Bytes of the saved state: the dense form's, or the compact form's at `capacity` (0: the
    default, the largest automatic dispatch may pick and force_sparse's fixed one)."""
    tile, capacity = layout.resolve_tile(tile, capacity, training=True)
    return layout.saved_bytes(x.shape[0], up.shape[0], tile, capacity, 2 if gate is not None else 1,
                              saved_dtype(x.device.type, up.dtype), dense=dense)


def _compact_sizes(x, gate, up, tile, capacity, dispatch):
    """Bytes of the compact state at each capacity the plan may size it to (largest first):
    automatic dispatch on CUDA sizes a default capacity to the density (twell.layout)."""
    adaptive = x.device.type == "cuda" and dispatch == "auto"
    return [_saved_bytes(x, gate, up, tile, c)
            for c in layout.training_capacities(tile, capacity, adaptive)]


@torch.library.custom_op("twell::ffn", mutates_args=())
def ffn(x: Tensor, gate: Optional[Tensor], up: Tensor, down: Tensor, tile: int, capacity: int,
        dispatch: str, dense_above: float) -> Tuple[Tensor, Tensor]:
    return run_ffn(x, gate, up, down, tile, capacity, dispatch, dense_above)


def run_ffn(x, gate, up, down, tile, capacity, dispatch, dense_above):
    """twell::ffn's body (the modules' plain eager calls skip the op's dispatch, whose host time
    is more than a decoding step's kernels take: run_ffn_eager)."""
    plan = _plans.inference_plan(gate, up, down, tile, capacity, dispatch, dense_above)
    y = x.new_empty(x.shape)
    counters = x.new_empty(2, dtype=torch.int64)
    workspace = None
    if x.device.type == "cuda":
        workspace = x.new_empty(plan.workspace_bytes(_plans.dl(x), _plans.dl(y)), dtype=torch.uint8)
    else:
        _plans.follow_torch_threads()
    plan.run(_plans.dl(x), _plans.dl(y), _plans.dl(counters), _plans.dl(workspace),
             _plans.stream_of(x.device))
    return y, counters


def run_ffn_eager(plan, x):
    """run_ffn on a plan already found, for the modules' plain eager calls: x is a contiguous 2-D
    tensor of the weights' dtype and device (the module checked), passed by address."""
    rows = x.shape[0]
    y = x.new_empty(x.shape)
    counters = x.new_empty(2, dtype=torch.int64)
    workspace, nbytes, stream = None, 0, 0
    if x.is_cuda:
        nbytes = plan.workspace_bytes_for(rows)
        workspace = x.new_empty(nbytes, dtype=torch.uint8)
        stream = _plans.stream_of(x.device)
    else:
        _plans.follow_torch_threads()
    plan._run_addresses(x.data_ptr(), y.data_ptr(), rows, counters.data_ptr(),
                        workspace.data_ptr() if workspace is not None else 0, nbytes, stream)
    return y, counters


@ffn.register_fake
def _(x, gate, up, down, tile, capacity, dispatch, dense_above):
    _plans.dispatch_value(dispatch)  # the real op's error for an unknown name
    _check_rows(x, up, "ffn")
    return x.new_empty(x.shape), x.new_empty(2, dtype=torch.int64)


def _workspace(plan, x, dense, call):
    """Training scratch from PyTorch's allocator (a capture-safe pool inside CUDA-graph capture),
    so the plan never allocates while a step is captured; None where none is needed. Sized for
    this call (twell.TrainingCall: forward or backward) of the saved form the step runs (dense:
    the dense form)."""
    form = twell.SavedForm.dense if dense else twell.SavedForm.compact
    nbytes = plan.workspace_bytes(x.shape[0], form, call)
    return _plans.dl(x.new_empty(nbytes, dtype=torch.uint8)) if nbytes else None


def error(op, argument, expected, actual):
    """A twell.TwellError reading "<op>: <argument>: expected <expected>, got <actual>", carrying
    the four as attributes as the C++ library's errors do."""
    e = twell.TwellError(f"{op}: {argument}: expected {expected}, got {actual}")
    e.op, e.argument, e.expected, e.actual = op, argument, expected, actual
    return e


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _check_rows(x, up, op, argument="x"):
    """x (or dy) against the weights, as the C++ plans check it: [M, K], the weights' dtype and
    device. The fake implementations run it, so a compiled graph fails as it is traced."""
    if x.dim() != 2 or up.dim() != 2 or x.shape[1] != up.shape[1]:
        raise error(f"twell::{op}", argument, f"[M, {up.shape[-1]}]", str(list(x.shape)))
    if x.dtype != up.dtype:
        raise error(f"twell::{op}", argument, f"{dtype_name(up.dtype)} (the weights' dtype)",
                    dtype_name(x.dtype))
    if x.device != up.device:
        raise error(f"twell::{op}", argument, f"a tensor on {up.device} (the weights' device)",
                    str(x.device))


def _check_down(up, down, op):
    """The training ops' down: down_proj.weight, [K, N] (the fake implementations check it too,
    so a compiled graph fails as it is traced)."""
    if down.dim() != 2 or up.dim() != 2 or tuple(down.shape) != (up.shape[1], up.shape[0]):
        expected = f"down_proj.weight, [K, N] = {list(up.shape[::-1])} for up {list(up.shape)}"
        raise error(f"twell::{op}", "down", expected, str(list(down.shape)))


def _training_plan(gate, up, down, tile, capacity, dispatch, dense_above, op):
    """The training plan, pointed at a neuron-major copy of `down` ([K, N], down_proj.weight);
    returns (plan, the copy), which the caller holds until the plan's call is enqueued (the
    allocator reuses its bytes in stream order after that)."""
    _check_down(up, down, op)
    down_nk = down.t().contiguous()
    return _plans.training_plan(gate, up, down_nk, tile, capacity, dispatch, dense_above), down_nk


def _train_forward(x: Tensor, gate: Optional[Tensor], up: Tensor, down: Tensor, tile: int,
                   capacity: int, dispatch: str, dense_above: float) -> Tuple[Tensor, Tensor, Tensor]:
    """twell::ffn_train's body."""
    plan, down_nk = _training_plan(gate, up, down, tile, capacity, dispatch, dense_above, "ffn_train")
    nbytes = plan.saved_bytes(x.shape[0])
    mirror = {}
    if True in _forms(x, dispatch):
        mirror[_saved_bytes(x, gate, up, tile, capacity, dense=True)] = True
    if False in _forms(x, dispatch):  # the compact sizes win a tie, as in the plan's backward
        mirror.update({b: False for b in _compact_sizes(x, gate, up, tile, capacity, dispatch)})
    if nbytes not in mirror:  # the fake implementation would disagree with this one
        raise RuntimeError(f"twell.torch: the C++ plan saves {nbytes} bytes, twell.layout says "
                           f"{sorted(mirror)}: update twell/layout.py or saved_dtype()")
    y = x.new_empty(x.shape)
    saved = _saved_buffer(x, gate, up, tile, nbytes, dense=mirror[nbytes])
    stats = x.new_empty(2, dtype=torch.float32)
    if x.device.type == "cpu":
        _plans.follow_torch_threads()
    plan.forward(_plans.dl(x), _plans.dl(y), _plans.dl(saved), _plans.dl(stats),
                 _plans.stream_of(x.device),
                 _workspace(plan, x, mirror[nbytes], twell.TrainingCall.forward))
    return y, saved, stats


ffn_train = torch.library.custom_op("twell::ffn_train", mutates_args=())(_train_forward)


def _saved_buffer(x, gate, up, tile, nbytes, dense, empty=None):
    """The saved state's buffer, zeroed where the plan may leave bytes unwritten (slots past each
    count, alignment padding): an op's outputs must not depend on what memory held before (eager
    and compiled runs agree byte for byte). The dense form's backup planes (all but ~1% of its
    bytes) are skipped: its gate and up GEMMs write every byte of them. `empty` (tests): the
    allocator, x.new_empty by default."""
    saved = (empty or x.new_empty)(nbytes, dtype=torch.uint8)
    if not dense:
        return saved.zero_()
    planes = 2 if gate is not None else 1
    rows, cols = x.shape[0], up.shape[0]
    itemsize = saved_dtype(x.device.type, up.dtype).itemsize
    at = layout.saved_offsets(rows, cols, layout.resolve_tile(tile, 0, training=True)[0], 1, planes,
                              itemsize, dense=True)
    if at["end"] != nbytes:  # not the dense layout twell.layout knows: zero it all
        return saved.zero_()
    saved[:at["backup"]].zero_()
    saved[at["backup"] + planes * rows * cols * itemsize:].zero_()
    return saved


def _forms(x, dispatch):
    """The saved forms `dispatch` may give (True: dense): the CPU backend saves the compact one."""
    if x.device.type != "cuda":
        return (False,)
    return {"sparse": (False,), "dense": (True,), "auto": (False, True)}[dispatch]


@ffn_train.register_fake
def _(x, gate, up, down, tile, capacity, dispatch, dense_above):
    _plans.dispatch_value(dispatch)  # the real op's error for an unknown name
    _check_rows(x, up, "ffn_train")
    _check_down(up, down, "ffn_train")
    forms = _forms(x, dispatch)
    if len(forms) > 1:
        nbytes = torch.library.get_ctx().new_dynamic_size()  # decided by the timing dispatch
    else:
        nbytes = _saved_bytes(x, gate, up, tile, capacity, dense=forms[0])
    saved = x.new_empty(nbytes, dtype=torch.uint8)
    return x.new_empty(x.shape), saved, x.new_empty(2, dtype=torch.float32)


def _train_backward(dy: Tensor, x: Tensor, gate: Optional[Tensor], up: Tensor, down: Tensor,
                    saved: Tensor, l1_coef: Tensor, tile: int, capacity: int, dispatch: str,
                    dense_above: float) -> List[Tensor]:
    """twell::ffn_train_backward's body."""
    plan, down_nk = _training_plan(gate, up, down, tile, capacity, dispatch, dense_above,
                                   "ffn_train_backward")
    # The saved form from the buffer's size: a compact state's bytes (at any capacity the plan may
    # pick), else the dense form's (a buffer of neither size is the plan's error).
    dense = layout.compact_capacity_of(
        saved.numel(), x.shape[0], up.shape[0], tile, capacity,
        x.device.type == "cuda" and dispatch == "auto", 2 if gate is not None else 1,
        saved_dtype(x.device.type, up.dtype)) is None
    dx = x.new_empty(x.shape)
    grads = [up.new_empty(up.shape, dtype=torch.float32) for _ in range(3 if gate is not None else 2)]
    dgate = grads[0] if gate is not None else None
    if x.device.type == "cpu":
        _plans.follow_torch_threads()
    plan.backward(_plans.dl(dy), _plans.dl(dx), _plans.dl(dgate), _plans.dl(grads[-2]),
                  _plans.dl(grads[-1]), _plans.dl(x), _plans.dl(saved), _plans.dl(l1_coef),
                  _plans.stream_of(x.device),
                  _workspace(plan, x, dense, twell.TrainingCall.backward))
    return [dx] + grads


ffn_train_backward = torch.library.custom_op("twell::ffn_train_backward",
                                             mutates_args=())(_train_backward)


@ffn_train_backward.register_fake
def _(dy, x, gate, up, down, saved, l1_coef, tile, capacity, dispatch, dense_above):
    _check_rows(x, up, "ffn_train_backward")
    _check_rows(dy, up, "ffn_train_backward", "dy")
    if dy.shape != x.shape:
        raise error("twell::ffn_train_backward", "dy", f"x's shape {list(x.shape)}",
                    str(list(dy.shape)))
    _check_down(up, down, "ffn_train_backward")
    count = 3 if gate is not None else 2
    return [x.new_empty(x.shape)] + [up.new_empty(up.shape, dtype=torch.float32)
                                     for _ in range(count)]


def _setup_train(ctx, inputs, output):
    # saved (uint8) and stats get no gradient, or an undefined one: never a zero-filled tensor as
    # large as the saved state (autograd's default materialises one for every output).
    ctx.set_materialize_grads(False)
    x, gate, up, down, tile, capacity, dispatch, dense_above = inputs
    ctx.save_for_backward(x, gate, up, down, output[1])
    ctx.tile, ctx.capacity, ctx.dispatch, ctx.dense_above = tile, capacity, dispatch, dense_above


def _backward_train(ctx, dy, dsaved, dstats, backward=None):
    """The training op's backward: `backward` twell::ffn_train_backward (default) or its body."""
    x, gate, up, down, saved = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy.contiguous()
    l1_coef = x.new_zeros(1, dtype=torch.float32) if dstats is None else dstats[1:2].contiguous()
    grads = (backward or ffn_train_backward)(dy, x, gate, up, down, saved, l1_coef, ctx.tile,
                                             ctx.capacity, ctx.dispatch, ctx.dense_above)
    dx = grads[0]
    weight_grads = ([None] if gate is None else []) + grads[1:]
    del grads
    # In the weights' dtype one at a time, each fp32 gradient released once cast: at most one
    # cast copy beside the fp32 ones, not all three.
    for i, w in enumerate((gate, up)):
        g, weight_grads[i] = weight_grads[i], None
        weight_grads[i] = None if g is None else g.to(w.dtype)
        del g
    # ddown is neuron-major: cast and transposed into down_proj.weight's layout in one copy.
    g, weight_grads[2] = weight_grads[2], None
    ddown = down.new_empty(down.shape).copy_(g.t())
    del g
    return dx, weight_grads[0], weight_grads[1], ddown, None, None, None, None


ffn_train.register_autograd(_backward_train, setup_context=_setup_train)


class _twell_ffn_train_eager(torch.autograd.Function):
    """twell::ffn_train for plain eager calls: the op's bodies, forward and backward, and its
    autograd (the same plan, state and kernels), without the custom op's dispatch, whose host
    time per call is more than a small step's kernels take. Its autograd node's name holds
    "twell_ffn_train", as the op's does (twell.torch.saved finds the state by it)."""

    @staticmethod
    def forward(ctx, x, gate, up, down, tile, capacity, dispatch, dense_above):
        inputs = (x, gate, up, down, tile, capacity, dispatch, dense_above)
        out = _train_forward(*inputs)
        ctx.mark_non_differentiable(out[1])
        _setup_train(ctx, inputs, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dsaved, dstats):  # first order only, as the op (no double backward)
        return _backward_train(ctx, dy, dsaved, dstats, backward=_train_backward)


def plain_eager(x):
    """Whether a call can skip a custom op's dispatch: a plain tensor, no compiler or tracer, no
    Python dispatch mode (fake tensors, make_fx, flop counters see the op as one), no torch.func
    transform (its wrapped tensors are of type torch.Tensor too)."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing() and not _intercepted())


def _intercepted():
    """A Python dispatch mode or a torch.func transform is active (an older PyTorch without
    these queries: assumed, so calls go through the op)."""
    try:
        return (torch._C._len_torch_dispatch_stack() > 0
                or torch._C._are_functorch_transforms_active())
    except AttributeError:
        return True


def train(x, gate, up, down, tile, capacity, dispatch, dense_above):
    """(y, saved, stats) of twell::ffn_train as the modules call it: plain eager calls through
    _twell_ffn_train_eager, any other through the op."""
    args = (x, gate, up, down, tile, capacity, dispatch, dense_above)
    if plain_eager(x):
        return _twell_ffn_train_eager.apply(*args)
    return torch.ops.twell.ffn_train(*args)
