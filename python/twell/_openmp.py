"""OpenMP's wait policy, set before twell loads its OpenMP runtime (docs/python.md, "Threads").

By default GNU OpenMP's idle workers spin for a while (GOMP_SPINCOUNT, 300,000 turns) after every
parallel region. In a process that alternates between torch's and twell's short parallel loops
that spinning takes a core from the thread with work to do as soon as another process is busy
(lab/journal.md measures it on the example). Importing twell sets
OMP_WAIT_POLICY=PASSIVE (idle workers sleep) where the environment sets neither OMP_WAIT_POLICY
nor GOMP_SPINCOUNT and no OpenMP runtime is loaded yet; a runtime reads it once, when it loads,
and torch shares twell's where both load libgomp.so.1. Imported by twell/__init__.py before
twell._core; imports nothing of twell.
"""
import os

_RUNTIMES = ("libgomp", "libiomp", "libomp")


def runtime_loaded():
    """Whether an OpenMP runtime is mapped into this process (Linux: /proc/self/maps); False
    where that cannot be read."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return any(name in line for line in f for name in _RUNTIMES)
    except OSError:
        return False


def prepare(environ=os.environ, loaded=runtime_loaded):
    """Sets OMP_WAIT_POLICY=PASSIVE in `environ` where nothing decided the wait policy yet;
    returns what decides it, as twell.cpu_threading() reports it."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in environ:
            return f"{name}={environ[name]} (environment)"
    if loaded():
        return "the runtime's default: OpenMP was loaded before twell (import twell first, or " \
               "set OMP_WAIT_POLICY=PASSIVE)"
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "passive (set by twell)"


WAIT_POLICY = prepare()
# An OpenMP runtime loaded before twell keeps its default: idle workers spin (twell.torch warns
# once, at its first CPU call with more than one thread).
SPINNING = WAIT_POLICY.startswith("the runtime's default")
SPIN_WARNING = (
    "twell: OpenMP was loaded before twell (torch imported first?), so its idle threads spin: on a "
    "machine that runs anything else, each of twell's CPU calls can wait out a scheduler time "
    "slice per parallel region (many times slower than one thread). Import twell (or twell.torch) before "
    "torch, or start Python with OMP_WAIT_POLICY=PASSIVE (ACTIVE keeps the spinning and this "
    "warning away); twell.cpu_threading()['wait_policy'] says which holds.")
