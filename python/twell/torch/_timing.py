"""One timing rule for twell.torch and the bench/ scripts."""
import time

import torch


def time_ms(fn, cuda):
    """Milliseconds of fn(): CUDA events around the work it enqueues where `cuda`, else wall
    time."""
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
