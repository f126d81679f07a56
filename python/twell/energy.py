"""GPU energy from NVML (the nvidia-ml-py package, module `pynvml`): the device's total-energy
counter (nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver loaded; Volta and
newer) read around a loop, and its power draw (nvmlDeviceGetPowerUsage, milliwatts) sampled
while idle. Where NVML, the package or the counter is missing, open_meter returns None and
callers report null: nothing here is required to run.

    meter = open_meter(torch.device("cuda"))          # None without NVML
    idle_w = meter.idle_power_w(1.0) if meter else None
    joules, seconds = meter.measure(loop, sync=torch.cuda.synchronize)
    j_per_token = joules / tokens
"""
import time


class EnergyMeter:
    """One GPU's NVML handle; `nvml` is the pynvml module (or a stand-in with its functions)."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle

    def energy_mj(self):
        """The total-energy counter, millijoules."""
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def power_w(self):
        """The current power draw, watts."""
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def idle_power_w(self, seconds=1.0, interval=0.05, sleep=time.sleep):
        """The mean of power_w() sampled every `interval` s over `seconds` (at least one sample):
        call it with the GPU idle (synchronised, nothing queued)."""
        n = max(1, int(round(seconds / interval)))
        samples = []
        for i in range(n):
            samples.append(self.power_w())
            if i + 1 < n:
                sleep(interval)
        return sum(samples) / len(samples)

    def measure(self, fn, sync=None, clock=time.perf_counter):
        """(joules, seconds) that fn() took: the counter's delta over it, `sync` (e.g.
        torch.cuda.synchronize) called before each reading so that queued work is counted."""
        if sync is not None:
            sync()
        e0, t0 = self.energy_mj(), clock()
        fn()
        if sync is not None:
            sync()
        e1, t1 = self.energy_mj(), clock()
        return (e1 - e0) / 1000.0, t1 - t0


def _nvml_index(device):
    """The NVML handle's key for a torch device: ("uuid", "GPU-...") where torch knows the UUID,
    else ("index", n) (right when CUDA_VISIBLE_DEVICES does not reorder devices)."""
    index = getattr(device, "index", device)
    index = 0 if index is None else int(index)
    try:
        import torch
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            uuid = str(uuid)
            return "uuid", uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
    except Exception:
        pass
    return "index", index


def open_meter(device=0, nvml=None, say=None):
    """An EnergyMeter for a CUDA device (torch.device or index), or None where NVML (the
    nvidia-ml-py package), the device or its energy counter is unavailable; `say` (e.g. print)
    is told why. `nvml`: the pynvml module to use (default: import it)."""
    def no(why):
        if say is not None:
            say(f"energy: not measured ({why})")
        return None

    if getattr(device, "type", "cuda") != "cuda":
        return no(f"device {device} is not a CUDA GPU")
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return no("no pynvml: pip install nvidia-ml-py")
    try:
        nvml.nvmlInit()
    except Exception as e:
        return no(f"nvmlInit: {e}")
    try:
        how, key = _nvml_index(device)
        if how == "uuid":
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(key)
            except Exception:
                handle = nvml.nvmlDeviceGetHandleByIndex(int(getattr(device, "index", 0) or 0))
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(key)
        meter = EnergyMeter(nvml, handle)
        meter.energy_mj()  # raises where the counter is unsupported
        meter.power_w()
    except Exception as e:
        return no(f"NVML: {e}")
    return meter


def joules_per_token(joules, tokens):
    """joules / tokens, or None where either is unknown or tokens is not positive."""
    if joules is None or not tokens or tokens <= 0:
        return None
    return joules / tokens
