"""twell: exact, fast activation-sparse transformer FFN layers.

The C++ library is in ``twell._core`` (tensors cross as DLPack arrays: numpy, PyTorch CPU and CUDA);
the PyTorch integration (custom ops, modules, model patching) is in ``twell.torch``.
"""
from twell import _openblas  # before twell._core loads OpenBLAS: its kernel set
from twell import _openmp  # before twell._core loads the OpenMP runtime: its wait policy
from twell._core import (
    Determinism,
    Dispatch,
    DType,
    FfnKind,
    InferencePlan,
    RunInfo,
    SavedForm,
    TrainingCall,
    TrainingPlan,
    TwellError,
    TwellShape,
    blas_core,
    blas_core_advice,
    count_active,
    cpu_count,
    cpu_description,
    cpu_threads,
    cpu_threads_setting,
    cuda_compiled,
    cuda_device_count,
    cuda_devices,
    dtype_size,
    last_cpu_threads,
    set_cpu_threads,
    version,
)

TwellError.__module__ = "twell"
__version__ = version()
if blas_core_advice():  # OpenBLAS was loaded before twell, on kernels older than the CPU
    import warnings

    warnings.warn(f"twell: {blas_core_advice()}", RuntimeWarning, stacklevel=2)


def cpu_threading():
    """The CPU backend's threads: `threads` (what a call from this thread runs now), `setting`
    (set_cpu_threads: 0 automatic), `cpus` (cpu_count()), `last` (the last call's) and
    `wait_policy` (what decides whether idle OpenMP workers spin or sleep)."""
    return {"threads": cpu_threads(), "setting": cpu_threads_setting(), "cpus": cpu_count(),
            "last": last_cpu_threads(), "wait_policy": _openmp.WAIT_POLICY}


__all__ = [
    "Determinism",
    "Dispatch",
    "DType",
    "FfnKind",
    "InferencePlan",
    "RunInfo",
    "SavedForm",
    "TrainingCall",
    "TrainingPlan",
    "TwellError",
    "TwellShape",
    "blas_core",
    "blas_core_advice",
    "cpu_count",
    "cpu_description",
    "cpu_threading",
    "cpu_threads",
    "cpu_threads_setting",
    "cuda_compiled",
    "cuda_device_count",
    "cuda_devices",
    "dtype_size",
    "last_cpu_threads",
    "set_cpu_threads",
    "version",
]
