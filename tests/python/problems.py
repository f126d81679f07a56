"""FFN problems whose sparsity comes out of the real GEMMs, and a float64 numpy oracle.

x[:, 0] is a control channel and column 0 of the first weight (gate, or up for a plain FFN) a
per-unit threshold, so each unit fires for about its own rate of tokens (lognormal rates: heavy
tailed), a row with control 8 has no active unit and a row with control -8 has every unit active
(routed whenever a tile holds more than `capacity`).
"""
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass
class Problem:
    x: np.ndarray          # [M, K] float64
    gate: np.ndarray       # [N, K] or None (plain)
    up: np.ndarray         # [N, K]
    down: np.ndarray       # [N, K] neuron-major (down_proj.weight.T)

    def cast(self, dtype):
        c = lambda a: None if a is None else np.ascontiguousarray(a.astype(dtype))
        return Problem(c(self.x), c(self.gate), c(self.up), c(self.down))


def make_problem(rng, m, k, n, gated=True, rate=0.05, special_rows=True):
    x = rng.standard_normal((m, k))
    x[:, 0] = 1.0
    first = rng.standard_normal((n, k)) / np.sqrt(k)
    rates = np.clip(rate * rng.lognormal(0.0, 1.0, n), 1e-4, 0.45)
    spread = np.sqrt((first[:, 1:] ** 2).sum(1))
    first[:, 0] = np.array([NormalDist().inv_cdf(r) for r in rates]) * spread
    if special_rows and m >= 3:
        x[1, 0] = 8.0   # no active unit
        x[2, 0] = -8.0  # every unit active
    other = rng.standard_normal((n, k)) / np.sqrt(k)
    down = rng.standard_normal((n, k)) / np.sqrt(n)
    if gated:
        return Problem(x, first, other, down)
    return Problem(x, None, first, down)


def forward(p, rounding=None):
    """h [M, N] and y [M, K] in float64; with `rounding` (a numpy dtype), every GEMM output, h and y
    are rounded to it (a plain dense layer in that dtype, float32 accumulation)."""
    r = (lambda a: a) if rounding is None else (lambda a: a.astype(rounding).astype(np.float64))
    acc = np.float64 if rounding is None else np.float32
    mm = lambda a, b: r((a.astype(acc) @ b.astype(acc)).astype(np.float64))
    if p.gate is None:
        h = r(np.maximum(mm(p.x, p.up.T), 0.0))
    else:
        h = r(np.maximum(mm(p.x, p.gate.T), 0.0) * mm(p.x, p.up.T))
    return h, mm(h, p.down)


def backward(p, dy, l1_coef):
    """Gradients of <dy, y> + l1_coef * (1/M) sum |h| (float64): dx, dgate (None if plain), dup,
    ddown (neuron-major), as dense autograd computes them: d|h|/dh = sign(h) multiplies (a NaN or
    infinite l1_coef gives NaN at h = 0), relu's backward selects (inactive units get 0)."""
    m = p.x.shape[0]
    first = p.gate if p.gate is not None else p.up
    g = p.x @ first.T
    active = g > 0
    h, _ = forward(p)
    dh = dy @ p.down.T + (l1_coef / max(m, 1)) * np.sign(h)
    ddown = h.T @ dy
    if p.gate is None:
        dg = np.where(active, dh, 0.0)
        return dg @ p.up, None, dg.T @ p.x, ddown
    u = p.x @ p.up.T
    dg = np.where(active, dh * u, 0.0)
    du = dh * np.maximum(g, 0.0)
    return dg @ p.gate + du @ p.up, dg.T @ p.x, du.T @ p.x, ddown


def rel_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    if not np.all(np.isfinite(a)):
        return np.inf
    return np.linalg.norm(a - b) / nb if nb else float(np.linalg.norm(a))


FLOOR = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3}
