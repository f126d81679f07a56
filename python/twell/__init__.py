"""twell: exact, fast activation-sparse transformer FFN layers.

The C++ library is in ``twell._core`` (tensors cross as DLPack arrays: numpy, PyTorch CPU and CUDA);
the PyTorch integration (custom ops, modules, model patching) is in ``twell.torch``.
"""
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
    cpu_description,
    cuda_compiled,
    cuda_device_count,
    cuda_devices,
    dtype_size,
    version,
)

TwellError.__module__ = "twell"
__version__ = version()

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
    "cpu_description",
    "cuda_compiled",
    "cuda_device_count",
    "cuda_devices",
    "dtype_size",
    "version",
]
