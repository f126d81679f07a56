"""twell.energy without a GPU: None where NVML is missing or refuses; the arithmetic (counter
delta over tokens, mean idle power) with a stand-in pynvml; bench/model.py's energy loop."""
import argparse
import sys

import pytest

from twell import energy


class FakeNVML:
    """The pynvml functions energy uses: a counter (mJ) and a list of power readings (mW)."""

    class NVMLError(Exception):
        pass

    def __init__(self, counter=0, power_mw=(), init_fails=False, counter_fails=False):
        self.counter, self.power = counter, list(power_mw)
        self.init_fails, self.counter_fails = init_fails, counter_fails
        self.handles = []

    def nvmlInit(self):
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(uuid)
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(index)
        return ("index", index)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.counter_fails:
            raise self.NVMLError("Not Supported")
        return self.counter

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power.pop(0) if len(self.power) > 1 else (self.power or [0])[0]


def test_none_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    said = []
    assert energy.open_meter(0, say=said.append) is None
    assert "nvidia-ml-py" in said[0]


def test_none_where_nvml_refuses():
    assert energy.open_meter(0, nvml=FakeNVML(init_fails=True)) is None
    assert energy.open_meter(0, nvml=FakeNVML(counter_fails=True)) is None

    class Cpu:
        type = "cpu"
    assert energy.open_meter(Cpu(), nvml=FakeNVML()) is None


def test_counter_delta_per_token_and_idle_power():
    nvml = FakeNVML(counter=1_000_000, power_mw=[40_000, 50_000, 60_000, 70_000, 90_000])
    meter = energy.open_meter(0, nvml=nvml)  # reads the power once: 40 W
    assert meter is not None and nvml.handles  # a handle by UUID or by index
    slept = []
    assert meter.idle_power_w(seconds=0.15, interval=0.05, sleep=slept.append) == \
        pytest.approx(60.0)  # three samples, two sleeps
    assert slept == [0.05, 0.05]
    syncs = []
    times = iter([10.0, 12.5])

    def loop():
        nvml.counter += 250_000  # 250 J

    joules, seconds = meter.measure(loop, sync=lambda: syncs.append(1), clock=lambda: next(times))
    assert joules == pytest.approx(250.0) and seconds == pytest.approx(2.5)
    assert len(syncs) == 2  # before each reading
    assert energy.joules_per_token(joules, 1000) == pytest.approx(0.25)
    assert energy.joules_per_token(None, 1000) is None
    assert energy.joules_per_token(1.0, 0) is None


def _bench_module():
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    from bench_scripts import load

    return load("model")


def test_bench_energy_loop_arithmetic():
    import torch

    bench = _bench_module()
    nvml = FakeNVML(counter=5_000)
    meter = energy.open_meter(0, nvml=nvml)
    order = []

    class Swap:
        def use(self, which):
            order.append(which)

    def step(which):  # a dense step spends 300 mJ, a twell step 100 mJ
        nvml.counter += 300 if which == "dense" else 100

    args = argparse.Namespace(energy_seconds=0.02)
    times = {"dense": [10.0, 10.0], "twell": [5.0, 5.0]}  # ms
    f = bench.energy_case(args, meter, Swap(), step, times, torch.device("cpu"), 16)
    assert order == ["dense", "twell", "twell", "dense"]
    # 10 ms of each block: 1 dense step, 2 twell steps; two blocks each; 16 tokens a step
    assert f["energy_steps"] == {"dense": 2, "twell": 4}
    assert f["energy_j_per_token_dense"] == pytest.approx(0.3 / 16)
    assert f["energy_j_per_token_twell"] == pytest.approx(0.1 / 16)
    assert f["energy_ratio"] == pytest.approx(1 / 3)
    assert f["avg_power_w_dense"] > 0
    none = bench.energy_case(args, None, Swap(), step, times, torch.device("cpu"), 16)
    assert set(none) == set(f) and all(v is None for v in none.values())
    # Another pair (the --floor model against dense): its blocks and its own field names.
    order.clear()
    g = bench.energy_case(args, meter, Swap(), step, {"dense": times["dense"], "floor": times["twell"]},
                          torch.device("cpu"), 16, pair=("dense", "floor"))
    assert order == ["dense", "floor", "floor", "dense"]
    assert g["energy_j_per_token_floor"] == pytest.approx(0.1 / 16) and g["energy_ratio"] == pytest.approx(1 / 3)
    assert "energy_j_per_token_twell" not in g
