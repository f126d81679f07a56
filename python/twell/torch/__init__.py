"""PyTorch integration of twell: custom ops (torch.ops.twell.*), nn.Modules, model patching and
sparsity tracking. Tensors cross to the C++ library through DLPack; no libtorch is linked."""
import importlib.util as _importlib_util

if _importlib_util.find_spec("torch") is None:  # torch is optional: say how to get it
    raise ModuleNotFoundError(
        "twell.torch needs PyTorch, which is not installed: `pip install torch`, or install twell "
        "with its torch extra (`pip install .[torch]` in the source tree); twell itself (numpy and "
        "DLPack arrays) works without it",
        name="torch",
    )

from twell.torch import _ops  # noqa: F401  (registers torch.ops.twell)
from twell.torch._ops import saved_dtype
from twell.torch._plans import clear as clear_plans
from twell.torch.hot import choose_hot_units
from twell.torch.hot import split_model as split_hot
from twell.torch.modules import (SparseGatedMLP, SparseMLP, freeze, l0_per_layer, l1_loss,
                                 sparse_modules)
from twell.torch.patch import patch_model, unpatch_model
from twell.torch.tracker import SparsityTracker

__all__ = [
    "SparseGatedMLP",
    "SparseMLP",
    "SparsityTracker",
    "choose_hot_units",
    "clear_plans",
    "freeze",
    "l0_per_layer",
    "l1_loss",
    "patch_model",
    "saved_dtype",
    "split_hot",
    "sparse_modules",
    "unpatch_model",
]
