"""One timing rule for twell.torch and the bench/ scripts."""
import time

import torch

# host_hidden: the device is held this many clock cycles (~4 ms at an H200's 1.98 GHz) before the
# start event, so the host enqueues the timed work meanwhile.
HOST_MARGIN_CYCLES = 8_000_000


def time_ms(fn, cuda, host_hidden=False):
    """Milliseconds of fn(): CUDA events around the work it enqueues where `cuda`, else wall
    time. host_hidden (CUDA): the device waits (a sleep kernel) while the host enqueues fn's
    work, so the time is the device's alone, as inside a model whose other layers keep the device
    busy while the host runs ahead; otherwise the device starts idle and the host's launch time
    counts too (as in eager decoding, where the host is the bound)."""
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if host_hidden:
            torch.cuda._sleep(HOST_MARGIN_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
