"""One timing rule for twell.torch and the bench/ scripts."""
import time

import torch

# host_hidden: the device is held this many clock cycles (~4 ms at an H200's 1.98 GHz) before the
# start event, so the host enqueues the timed work meanwhile; doubled (up to MAX_MARGIN_CYCLES)
# whenever a call's host work outlasted it.
MARGIN_CYCLES = 8_000_000
MAX_MARGIN_CYCLES = 64 * MARGIN_CYCLES
_margin = {"cycles": MARGIN_CYCLES}


def time_ms(fn, cuda, host_hidden=False):
    """Milliseconds of fn(): CUDA events around the work it enqueues where `cuda`, else wall
    time. host_hidden (CUDA): the device waits (a sleep kernel) while the host enqueues fn's
    work, so the time is the device's alone, as inside a model whose other layers keep the device
    busy while the host runs ahead; otherwise the device starts idle and the host's launch time
    counts too (as in eager decoding, where the host is the bound). Where the host outlasted the
    wait (the start event had passed once fn returned), fn runs again with a longer wait."""
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    for _ in range(4):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if host_hidden:
            torch.cuda._sleep(_margin["cycles"])
        a.record()
        fn()
        b.record()
        leaked = host_hidden and a.query()  # the device reached the start before the host was done
        b.synchronize()
        if not leaked or _margin["cycles"] >= MAX_MARGIN_CYCLES:
            break
        _margin["cycles"] *= 2
    return a.elapsed_time(b)
