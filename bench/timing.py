"""Timing shared by the bench/ scripts: CUDA events (wall time on the CPU) and the summary a row
keeps (median, p20, p80)."""
import statistics
import time

import torch


class Timer:
    """timer(fn) -> milliseconds of one fn(): CUDA events around it on a CUDA device (the work
    it enqueues), wall time otherwise."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def summary(times):
    s = sorted(times)

    def q(f):
        return s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]

    return {"median": statistics.median(s), "p20": q(0.2), "p80": q(0.8)}
