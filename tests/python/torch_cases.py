"""Helpers of the PyTorch tests: devices, modules built from a Problem, the dense reference."""
import numpy as np
import pytest
import torch

import twell
import twell.torch as tt

from problems import make_problem


def captured(fn, warmup=3):
    """(graph, output): fn() captured in a CUDA graph after `warmup` eager runs on a side stream
    (plans, workspaces and the allocator's pools exist before the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and twell.cuda_device_count() > 0:
        out.append("cuda")
    return out


def dtypes(device):
    """Weight dtypes a backend runs: CPU float32/float16/bfloat16, CUDA float16/bfloat16."""
    both = [torch.bfloat16, torch.float16]
    return ([torch.float32] if device == "cpu" else []) + both


FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


def rel_error(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    nb = b.norm()
    return float((a - b).norm() / nb) if nb > 0 else float(a.norm())


def module_for(problem, dtype, device, **kwargs):
    """A SparseGatedMLP / SparseMLP holding the problem's weights (down_proj in nn.Linear layout)."""
    gated = problem.gate is not None
    n, k = problem.up.shape
    cls = tt.SparseGatedMLP if gated else tt.SparseMLP
    m = cls(k, n, device=device, dtype=dtype, **kwargs)
    with torch.no_grad():
        if gated:
            m.gate_proj.weight.copy_(torch.from_numpy(problem.gate))
        m.up_proj.weight.copy_(torch.from_numpy(problem.up))
        m.down_proj.weight.copy_(torch.from_numpy(problem.down.T.copy()))
    return m


def dense_step(module, x, dy, l1_scale, dtype):
    """y, l1 value and gradients (x, then each parameter) of <dy, y> + l1_scale * l1_coef * l1 for
    the dense FFN with `module`'s weights, computed in `dtype` by plain PyTorch ops."""
    params = {n: p.detach().to(dtype).requires_grad_() for n, p in module.named_parameters()}
    xd = x.detach().to(dtype).requires_grad_()
    with torch.enable_grad():
        if module.gated:
            h = torch.relu(xd @ params["gate_proj.weight"].T) * (xd @ params["up_proj.weight"].T)
        else:
            h = torch.relu(xd @ params["up_proj.weight"].T)
        y = h @ params["down_proj.weight"].T
        l1 = h.abs().sum(-1).mean() if h.shape[0] else h.sum()
        loss = (y * dy.to(dtype)).sum() + l1_scale * module.l1_coef * l1
        loss.backward()
    return y.detach(), l1.detach(), [xd.grad] + [params[n].grad for n, _ in module.named_parameters()]


def kink_bound(xd, first):
    """(x first^T, its float32 accumulation bound: k unit roundoffs of |x| |first|^T, twice over),
    float64, from x and first as rounded: within the bound of zero a kernel's sum may land on
    either side of the ReLU's kink, depending on its summation order."""
    xd, fd = xd.double(), first.detach().double().to(xd.device)
    return xd @ fd.T, 2 * xd.shape[1] * 2.0**-24 * (xd.abs() @ fd.abs().T)


def off_the_kink(x, first):
    """x (rounded to its dtype) with no pre-activation x first^T within kink_bound of zero. There
    the ReLU's gradient jumps
    (the unit's dh, and the L1 term's sign, appear or vanish), and which side a sum lands on is its
    summation order, not an error of either side. A row near the kink has its column 0 (make_problem's
    bias column, never 0) moved by 1, 2, 4, ... units in the last place, until none is."""
    x = x.detach().clone()
    if x.numel() == 0:
        return x
    eps = torch.finfo(x.dtype).eps
    for i in range(32):
        pre, bound = kink_bound(x, first)
        rows = (pre.abs() <= bound).any(dim=1)
        if not rows.any():
            return x
        x[rows, 0] = (x[rows, 0].double() * (1 + eps * 2.0**i)).to(x.dtype)
    raise AssertionError("off_the_kink: rows stay within the rounding bound of a ReLU kink")


def skip_unless_trainable(device):
    """CUDA training raises TwellError until the CUDA training backend lands: skip, saying so."""
    if device == "cpu":
        return
    w = torch.zeros(64, 64, device=device, dtype=torch.bfloat16)
    try:
        twell.TrainingPlan(*(torch.utils.dlpack.to_dlpack(w) for _ in range(3)))
    except twell.TwellError as e:
        pytest.skip(f"CUDA training not available in this build: {e}")


def problem(seed, m, k, n, gated, **kwargs):
    return make_problem(np.random.default_rng(seed), m, k, n, gated, **kwargs)
