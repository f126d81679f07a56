"""CPU inference inside torch: twell's plan or torch's own dense MLP, the faster per regime.

The CPU plan's dense path runs Debian's OpenBLAS, whose GEMMs over a few rows are slower than
torch's (16 rows of 2048 x 5632 in float32: 9.4 ms against 7.3; lab/journal.md, section 40), so a
call the plan runs dense can be slower than the MLP the module replaced. A module's plain eager
CPU inference calls with dispatch "auto" therefore time both ways per regime (rows to a power of
two, the last call's density to a factor of sqrt(2)), as the CUDA plans time their two paths:
TRIALS calls of each, alternating from twell, then the one with the smaller best time, tried again
every RETRY calls of the regime (a regime also keys on the dtype and torch's thread count).
Both compute the dense FFN exactly, rounded as the dtype rounds (torch's: relu(x Wg^T) (x Wu^T)
Wd^T). Empty batches, autocast and torch.use_deterministic_algorithms(True) run the plan alone
(the last so that reruns are bit-identical).
"""
import math
import time

import torch
import torch.nn.functional as F

import twell

TRIALS = 2
RETRY = 256

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def applies(dispatch, x):
    """Whether a plain eager CPU inference call may run torch's dense MLP: automatic dispatch,
    rows to time, no deterministic algorithms (reruns bit-identical), no autocast (whose GEMMs
    would return another dtype than the plan)."""
    return (dispatch == "auto" and x.shape[0] > 0 and x.dtype in _DTYPES
            and not torch.are_deterministic_algorithms_enabled()
            and not torch.is_autocast_enabled("cpu"))


def dense(x, gate, up, down):
    """(y, counters) of torch's dense MLP: counters as the plan's dense path gives them, (0 routed
    rows, active units), a tuple. The active units are counted on the first projection by
    twell.count_active, one C++ pass (right after the GEMM that wrote it each Python or torch
    operation costs ~10 us here: NumPy's comparisons and counts took 0.4 ms at 16 x 5632)."""
    first = F.linear(x, gate if gate is not None else up)
    active = twell.count_active(first)
    h = F.relu(first)
    if gate is not None:
        h = h * F.linear(x, up)
    return F.linear(h, down), (0, active)


class Paths:
    """Per regime: the best seconds of each way (0: twell, 1: torch's dense), the calls made."""

    def __init__(self):
        self.regimes = {}
        self.density = -1.0  # the last call's, either way

    def _regime(self, rows, dtype):
        r = max(rows, 1).bit_length()
        d = math.floor(2 * math.log2(self.density)) if self.density > 0 else -1000
        return r, d, dtype, torch.get_num_threads()

    def choose(self, rows, dtype=torch.float32):
        """(regime, whether torch's dense runs this call): a regime is also the dtype and torch's
        thread count, whose change makes earlier times stale."""
        if self.density < 0:
            return None, False
        key = self._regime(rows, dtype)
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
    """One call through `paths`: plan_call() (twell's plan: (y, counters)) or torch's dense MLP
    (down(): its [K, N] down weight); returns (y, counters, whether torch's dense ran)."""
    key, by_torch = paths.choose(x.shape[0], x.dtype)
    t0 = time.perf_counter()
    y, counters = dense(x, gate, up, down()) if by_torch else plan_call()
    paths.add(key, by_torch, time.perf_counter() - t0, counters, x.shape[0], up.shape[0])
    return y, counters, by_torch
