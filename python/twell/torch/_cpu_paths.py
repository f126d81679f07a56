"""CPU inference inside torch: twell's plan or torch's own dense MLP, the faster per regime.

The CPU plan's dense path runs Debian's OpenBLAS, whose GEMMs over a few rows are slower than
torch's (16 rows of 2048 x 5632 in float32: 9.4 ms against 7.3; lab/journal.md, section 40), so a
call the plan runs dense can be slower than the MLP the module replaced. A module's plain eager
CPU inference calls with dispatch "auto" therefore time both ways per regime (rows to a power of
two, the last call's density to a factor of sqrt(2)), as the CUDA plans time their two paths:
TRIALS calls of each, alternating from twell, then the one with the smaller best time, tried again
every RETRY calls of the regime. Both compute the dense FFN exactly, rounded as the dtype rounds
(torch's: relu(x Wg^T) (x Wu^T) Wd^T); under torch.use_deterministic_algorithms(True) the plan
always runs, so reruns are bit-identical.
"""
import math
import time

import torch
import torch.nn.functional as F

try:
    import numpy as np
except ImportError:  # torch runs without NumPy
    np = None

TRIALS = 2
RETRY = 256


_SAME_WIDTH_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
                   torch.float16: torch.int16, torch.float64: torch.int64}


def dense(x, gate, up, down):
    """(y, counters) of torch's dense MLP: counters as the plan's, {routed rows, active units}
    (every row dense; active: the first projection's positive entries, count_positive)."""
    first = F.linear(x, gate if gate is not None else up)
    active = count_positive(first)
    h = F.relu(first)
    if gate is not None:
        h = h * F.linear(x, up)
    y = F.linear(h, down)
    return y, torch.tensor((x.shape[0], active))


def count_positive(t):
    """The positive entries of a contiguous CPU float tensor, read as integers of the same width
    (positive floats read positive; zeros, negatives and NaNs with the sign bit set do not): NumPy's
    comparison and count (~0.3 ms for 256 x 5632, one thread), else torch's (~1 - 2 ms)."""
    v = t.view(_SAME_WIDTH_INT[t.dtype])
    if np is not None:
        return int(np.count_nonzero(v.numpy() > 0))
    return int(v.clamp(0, 1).sum(dtype=torch.int64))


class Paths:
    """Per regime: the best seconds of each way (0: twell, 1: torch's dense), the calls made."""

    def __init__(self):
        self.regimes = {}
        self.density = -1.0  # the last call's, either way

    def _regime(self, rows):
        r = max(rows, 1).bit_length()
        d = math.floor(2 * math.log2(self.density)) if self.density > 0 else -1000
        return r, d

    def choose(self, rows):
        """(regime, whether torch's dense runs this call)."""
        if self.density < 0:
            return None, False
        key = self._regime(rows)
        t = self.regimes.setdefault(key, [[math.inf, math.inf], [0, 0], 0])
        best, runs, calls = t
        t[2] = calls + 1
        if runs[0] < TRIALS or runs[1] < TRIALS:
            return key, runs[1] < runs[0]  # alternating, twell first
        if calls % RETRY == 0:  # try the other way again
            return key, not best[1] < best[0]
        return key, best[1] < best[0]

    def add(self, key, torch_dense, seconds, counters, rows, units):
        """A finished call of `rows` rows (counters: the call's {routed rows, active})."""
        self.density = float(counters[1]) / max(rows * units, 1)
        if key is not None:
            best, runs, _ = self.regimes[key]
            way = int(torch_dense)
            best[way] = min(best[way], seconds)
            runs[way] += 1


def run(paths, plan_call, x, gate, up, down):
    """One call through `paths`: plan_call() (twell's plan: (y, counters)) or torch's dense MLP;
    returns (y, counters, whether torch's dense ran)."""
    key, by_torch = paths.choose(x.shape[0])
    t0 = time.perf_counter()
    y, counters = dense(x, gate, up, down) if by_torch else plan_call()
    paths.add(key, by_torch, time.perf_counter() - t0, counters, x.shape[0], up.shape[0])
    return y, counters, by_torch
