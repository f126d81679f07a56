"""The CPU backend's threads in a Python process: twell.torch runs torch's intra-op count, never
more than the CPUs; importing twell first makes idle OpenMP workers sleep instead of spinning
(docs/python.md, "Threads")."""
import os
import subprocess
import sys

import numpy as np
import pytest

import twell
from twell import _openmp


def run_python(code, env=None):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **(env or {})))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cpu_threads_api():
    assert twell.cpu_count() >= 1
    old = twell.cpu_threads_setting()
    try:
        twell.set_cpu_threads(1)
        assert twell.cpu_threads() == 1 and twell.cpu_threading()["setting"] == 1
        twell.set_cpu_threads(10_000)
        assert twell.cpu_threads() == twell.cpu_count()
        with pytest.raises(twell.TwellError) as e:
            twell.set_cpu_threads(-1)
        assert e.value.argument == "n"
    finally:
        twell.set_cpu_threads(old)


def test_numpy_calls_run_the_count_set(seed):
    rng = np.random.default_rng(seed)
    w = [rng.standard_normal((96, 32), dtype=np.float32) for _ in range(3)]
    plan = twell.InferencePlan(*w)
    x = rng.standard_normal((64, 32), dtype=np.float32)
    old = twell.cpu_threads_setting()
    try:
        for n in (1, 2):
            twell.set_cpu_threads(n)
            plan.run(x, np.empty_like(x))
            assert twell.last_cpu_threads() == min(n, twell.cpu_count())
    finally:
        twell.set_cpu_threads(old)


def test_twell_torch_follows_torch_set_num_threads(seed):
    torch = pytest.importorskip("torch")
    import twell.torch as tt
    torch.manual_seed(seed)
    mlp = tt.SparseGatedMLP(32, 96, dispatch="sparse")  # the plan every call (no torch trial)
    x = torch.randn(64, 32)
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            want = min(n, twell.cpu_count())
            with torch.no_grad():
                mlp(x)  # the modules' eager inference call
            assert twell.last_cpu_threads() == want
            torch.ops.twell.ffn(x, mlp.gate_proj.weight, mlp.up_proj.weight,
                                mlp.down_proj.weight.t().contiguous(), 0, 0, "auto", 0.035)
            assert twell.last_cpu_threads() == want
            twell.set_cpu_threads(0)  # the training forward sets it again
            y = mlp(x.clone().requires_grad_())
            assert twell.last_cpu_threads() == want
            twell.set_cpu_threads(0)
            y.sum().backward()
            assert twell.last_cpu_threads() == want
            assert twell.cpu_threading()["threads"] == want
    finally:
        torch.set_num_threads(old)


def test_prepare_sets_passive_only_where_nothing_decided():
    env = {}
    assert _openmp.prepare(env, lambda: False) == "passive (set by twell)"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "active"}
    assert "environment" in _openmp.prepare(env, lambda: False)
    assert env == {"OMP_WAIT_POLICY": "active"}
    env = {"GOMP_SPINCOUNT": "10000"}
    assert "environment" in _openmp.prepare(env, lambda: False)
    assert "OMP_WAIT_POLICY" not in env
    env = {}
    assert "loaded before twell" in _openmp.prepare(env, lambda: True)
    assert env == {}


def test_import_order_decides_the_wait_policy():
    clean = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}
    code = ("import os; [os.environ.pop(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]; {}; "
            "import twell; print(os.environ.get('OMP_WAIT_POLICY'), '|', "
            "twell.cpu_threading()['wait_policy'])")
    assert run_python(code.format("pass"), clean) == "PASSIVE | passive (set by twell)"
    if _openmp.runtime_loaded():  # this process loaded libgomp with twell: /proc/self/maps works
        assert "loaded before twell" in run_python(code.format("import ctypes; "
                                                                "ctypes.CDLL('libgomp.so.1')"), clean)
    out = run_python("import os, twell; print(os.environ['OMP_WAIT_POLICY'], '|', "
                     "twell.cpu_threading()['wait_policy'])", {"OMP_WAIT_POLICY": "ACTIVE"})
    assert out == "ACTIVE | OMP_WAIT_POLICY=ACTIVE (environment)"


def test_spinning_runtime_warns_once_at_the_first_cpu_call():
    """torch imported before twell keeps libgomp's spinning workers: the first CPU call with more
    than one thread warns, once; twell imported first, or a policy the environment set, does not."""
    call = ("{first}; import warnings, torch; torch.set_num_threads(2); "
            "from twell.torch import SparseGatedMLP; m = SparseGatedMLP(16, 64).eval(); "
            "x = torch.randn(3, 16)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    [m(x) for _ in range(3)]\n"
            "print(sum('OMP_WAIT_POLICY=PASSIVE' in str(i.message) for i in w))")
    clean = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}
    pop = "import os; [os.environ.pop(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')]"
    if not _openmp.runtime_loaded():  # no /proc/self/maps: the order cannot be seen
        pytest.skip("no /proc/self/maps")
    assert run_python(call.format(first=pop + "; import torch"), clean) == "1"
    assert run_python(call.format(first=pop + "; import twell"), clean) == "0"
    assert run_python(call.format(first="import torch"), {"OMP_WAIT_POLICY": "ACTIVE"}) == "0"


# The CPU time of the threads started after NumPy (the OpenMP runtime's workers that twell's calls
# start) while the main thread sleeps right after each call: per-thread /proc figures, so that
# NumPy's own worker and the main thread's wake-ups (~40 ms over these 400 ms on a 2-core VM,
# with no twell worker at all) are not counted.
SPIN = """
import os, time, numpy as np
TICK = os.sysconf("SC_CLK_TCK")
def cpu(tids):
    total = 0
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / TICK
before = set(os.listdir("/proc/self/task"))
import twell
rng = np.random.default_rng(0)
w = [rng.standard_normal((512, 64), dtype=np.float32) for _ in range(3)]
x = rng.standard_normal((256, 64), dtype=np.float32)
plan = twell.InferencePlan(*w)
twell.set_cpu_threads(2)
plan.run(x, np.empty_like(x))
idle = 0.0
for _ in range(20):
    plan.run(x, np.empty_like(x))
    workers = set(os.listdir("/proc/self/task")) - before
    c0 = cpu(workers); time.sleep(0.02); idle += cpu(workers) - c0
print(idle)
"""


@pytest.mark.skipif(twell.cpu_count() < 2, reason="one CPU: no OpenMP worker to spin")
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no per-thread CPU times (/proc)")
def test_idle_workers_sleep_after_a_call():
    """The OpenMP workers' CPU time while the caller sleeps right after twell calls on 2 threads:
    GNU OpenMP's default spinning burns 60 - 100+ ms of the 400 ms slept (two thirds of a core
    beside a busy process), the passive policy nothing."""
    clean = {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""}
    idle = float(run_python("import os; [os.environ.pop(k) for k in ('OMP_WAIT_POLICY', "
                            "'GOMP_SPINCOUNT')]\n" + SPIN, clean))
    assert idle < 0.04, f"{idle * 1000:.0f} ms of CPU while sleeping 400 ms after twell calls"


def test_openblas_core_chosen_from_the_cpu_where_nothing_decided():
    from twell import _openblas
    x86 = lambda: "x86_64"  # noqa: E731
    avx512 = set("avx2 fma avx512f avx512bw avx512vl avx512dq avx512cd".split())
    cases = [(("GenuineIntel", avx512), "SkylakeX"), (("AuthenticAMD", {"avx2", "fma"}), "Zen"),
             (("GenuineIntel", {"avx2", "fma", "avx512f"}), "Haswell")]
    for cpu, core in cases:
        env = {}
        assert _openblas.prepare(env, lambda: cpu, lambda: False, x86) == f"{core} (set by twell)"
        assert env == {"OPENBLAS_CORETYPE": core}
    for cpu, why in ((("GenuineIntel", {"sse3", "avx"}), "no AVX2"), (("", set()), "no AVX2")):
        env = {}
        assert why in _openblas.prepare(env, lambda: cpu, lambda: False, x86) and env == {}
    env = {"OPENBLAS_CORETYPE": "Haswell"}
    assert "environment" in _openblas.prepare(env, lambda: cases[0][0], lambda: False, x86)
    assert env == {"OPENBLAS_CORETYPE": "Haswell"}
    env = {}
    said = _openblas.prepare(env, lambda: cases[0][0], lambda: True, x86)
    assert "loaded before twell" in said and "OPENBLAS_CORETYPE=SkylakeX" in said and env == {}
    assert "not x86-64" in _openblas.prepare({}, lambda: cases[0][0], lambda: False, lambda: "aarch64")


def test_openblas_kernels_follow_the_environment():
    """In a fresh process, twell's OpenBLAS runs the set OPENBLAS_CORETYPE names (twell's choice
    where unset); its description names it, and no advice is given on a set with AVX2."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 OpenBLAS kernel sets")
    code = ("import twell; print(twell.blas_core(), '|', twell._openblas.CORETYPE, '|', "
            "twell.blas_core_advice() == '', '|', twell.blas_core() in twell.cpu_description())")
    out = run_python(code, {"OPENBLAS_CORETYPE": "Prescott"}).split(" | ")
    if out[0] != "Prescott":
        pytest.skip(f"this OpenBLAS chooses no kernels at run time (it runs {out[0]}'s)")
    assert "environment" in out[1] and out[3] == "True"
    chosen = twell._openblas.core_for(*twell._openblas.cpu_flags())
    # the one rule, read twice: from /proc/cpuinfo before the library loads, from cpuid in it
    assert chosen == (twell._core.blas_core_for_cpu() or None)
    if chosen is not None:  # this CPU has AVX2: twell's choice is in force, and no advice
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=env)
        assert res.returncode == 0, res.stderr
        core, how, quiet, _ = res.stdout.strip().split(" | ")
        assert core.lower() == chosen.lower() and "set by twell" in how and quiet == "True"
        assert out[2] == "False"  # Prescott's kernels on an AVX2 CPU: advice given
