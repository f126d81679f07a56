"""Timing shared by the bench/ scripts: CUDA events (wall time on the CPU), the summary a row
keeps (median, p20, p80), and writing a script's rows."""
import json
import os
import statistics

from twell.torch._timing import time_ms


class Timer:
    """timer(fn) -> milliseconds of one fn(): CUDA events around it on a CUDA device (the work
    it enqueues; host_hidden: the device's time alone, the host's launch time hidden, see
    twell.torch._timing), wall time otherwise."""

    def __init__(self, device, host_hidden=False):
        self.cuda = device.type == "cuda"
        self.host_hidden = host_hidden

    def __call__(self, fn):
        return time_ms(fn, self.cuda, self.host_hidden)


def summary(times):
    s = sorted(times)

    def q(f):
        return s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]

    return {"median": statistics.median(s), "p20": q(0.2), "p80": q(0.8)}


def write_rows(folder, name, rows):
    """Writes `rows` to folder/name (JSON; the folder made if needed); returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    return path
