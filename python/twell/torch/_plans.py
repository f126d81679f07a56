"""Plans for the custom ops: created on first use, cached by the weights' addresses.

A C++ plan holds views of its weights. The cache keys each plan on the gate and up weights'
addresses, shapes, strides, dtype and device, and on the down weight's shape, strides, dtype and
device but not its address, and drops it as soon as the gate or up tensor is garbage collected (or
when more than MAX_PLANS are held). The down weight is the exception because the callers make it
anew: the training ops copy down_proj.weight neuron-major inside each call (forward and backward),
and so does an unfrozen module's inference call, eager or compiled. Every call therefore points the plan it finds at
its own down tensor (set_weights, host-only, which a CUDA-graph capture needs), and one plan, with
its density calibration on CUDA, serves every call on the same gate and up weights. Between calls a
plan's down pointer may be stale: every call rebinds it first (a module that keeps its plan checks
`_down_address`), and calls on one weight set are not meant to run from several threads at once.
"""
import threading
import warnings
import weakref
from collections import OrderedDict

import torch
import torch.utils.dlpack

import twell
from twell import _openmp

MAX_PLANS = 512
_STATE_TAG = 0x7477656C6C2E7474  # "twell.tt": every training plan of this cache (training_plan)

_DISPATCH = {
    "auto": twell.Dispatch.automatic,
    "sparse": twell.Dispatch.force_sparse,
    "dense": twell.Dispatch.force_dense,
}

_lock = threading.RLock()  # reentrant: a finalizer may run while it is held
_plans = OrderedDict()  # key -> (plan, [weakref.finalize])


def dl(t):
    """A DLPack capsule of `t` (None stays None): zero copy, no stream synchronisation."""
    return None if t is None else torch.utils.dlpack.to_dlpack(t)


def stream_of(device):
    """The current CUDA stream of `device` as an int (0 for CPU tensors)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def follow_torch_threads():
    """Before each CPU call: twell's CPU threads = torch's intra-op count (torch.get_num_threads(),
    which torch.set_num_threads changes), whether or not torch shares twell's OpenMP runtime; the
    first call with more than one thread warns where the runtime's idle threads spin."""
    n = torch.get_num_threads()
    if n != twell.cpu_threads_setting():
        twell.set_cpu_threads(n)
    global _spin_unwarned
    if _spin_unwarned and n > 1:
        _spin_unwarned = False
        warnings.warn(_openmp.SPIN_WARNING, RuntimeWarning, stacklevel=3)


_spin_unwarned = _openmp.SPINNING


def dispatch_value(dispatch):
    try:
        return _DISPATCH[dispatch]
    except KeyError:
        raise ValueError(f"dispatch: expected one of {sorted(_DISPATCH)}, got {dispatch!r}") from None


def _signature(t):
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


def _forget(entry):
    for f in entry[1]:
        f.detach()


def _drop(key):
    with _lock:
        entry = _plans.pop(key, None)
    if entry is not None:
        _forget(entry)


def _get(cls, gate, up, down, options):
    # down: its layout, not its address (the plan is pointed at this call's tensor); the strides
    # keep a transposed view at the same address from passing as row-major when K = N.
    key = (cls.__name__, _signature(gate), _signature(up),
           (tuple(down.shape), down.stride(), down.dtype, down.device), options)
    with _lock:
        hit = _plans.get(key)
        if hit is not None:
            _plans.move_to_end(key)
            return bound_to(hit[0], gate, up, down)
    if up.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Making a plan allocates (pinned memory, events, cuBLASLt handles): inside a capture
        # that would invalidate the graph and leave the CUDA context in an error state.
        raise twell.TwellError(
            f"{cls.__name__}: weights: expected weights a plan was made for before this CUDA-graph "
            "capture (run the step once eagerly, and keep weight tensors in place between steps), "
            "got weights first seen during the capture")
    plan = cls(dl(gate), dl(up), dl(down), *options, borrow=True)
    owners = (gate, up)
    # A view's plan lives as long as the tensor it views (a split module's cold weights are
    # slices of its parameters, new objects each call: their plan must outlive them).
    finalizers = [weakref.finalize(t if t._base is None else t._base, _drop, key)
                  for t in owners if t is not None]
    for f in finalizers:
        f.atexit = False
    with _lock:
        _plans[key] = (plan, finalizers)
        while len(_plans) > MAX_PLANS:
            _forget(_plans.popitem(last=False)[1])
    return plan


def _determinism():
    # Bit-identical reruns when PyTorch's deterministic algorithms are on; else the faster mode.
    return (twell.Determinism.deterministic if torch.are_deterministic_algorithms_enabled()
            else twell.Determinism.fast)


def inference_options(tile, capacity, dispatch, dense_above):
    """The options an inference plan is cached under (the modules keep their plan beside them)."""
    return (tile, capacity, dispatch_value(dispatch), dense_above, _determinism())


def inference_plan(gate, up, down, tile, capacity, dispatch, dense_above):
    options = inference_options(tile, capacity, dispatch, dense_above)
    return _get(twell.InferencePlan, gate, up, down, options)


def bound_to(plan, gate, up, down):
    """`plan` (of these gate and up weights) pointed at `down`: an inference plan is rebound only
    where another call moved it (callers that keep a plan and skip the cache use this too)."""
    if getattr(plan, "_down_address", None) != down.data_ptr():
        with _lock:
            plan.set_weights(dl(gate), dl(up), dl(down), borrow=True)
    return plan


def training_plan(gate, up, down, tile, capacity, dispatch, dense_above):
    # The L1 coefficient comes with each backward call (the upstream gradient of the L1 value).
    # A shared state_tag: the plan a backward finds may be another than its forward's (evicted,
    # cleared, or FSDP2 moved the weights), and autograd hands each backward its own forward's state.
    options = (tile, capacity, 0.0, _determinism(), dispatch_value(dispatch), dense_above, _STATE_TAG)
    return _get(twell.TrainingPlan, gate, up, down, options)


def clear():
    """Drops every cached plan."""
    with _lock:
        entries = list(_plans.values())
        _plans.clear()
    for entry in entries:
        _forget(entry)
