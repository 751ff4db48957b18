"""The public surface where PyTorch is installed, re-exported by the package at first use (see
``torch_adreno/__init__.py``: its ``__all__`` is this module's).

Importing it imports the backend's module, :mod:`torch_adreno.frontend`, which installs
:mod:`torch_adreno.torch_patches`; the backend's name is registered with Dynamo by
:mod:`torch_adreno.dynamo_registry` at ``import torch_adreno``, without this module.
"""

from __future__ import annotations

from torch_adreno.config import OPTIONS, Config
from torch_adreno.errors import (
    AdrenoError,
    DeviceNotFoundError,
    LoweringError,
    OptionError,
    ReplayMismatchError,
    ShapeLimitError,
    UnsupportedOpError,
)
from torch_adreno.frontend import adreno_backend
from torch_adreno.profiler import profile
from torch_adreno.runtime import DeviceTensor, list_devices
from torch_adreno.runtime.host_writes import mark_changed
from torch_adreno.training.buckets import Buckets
from torch_adreno.training.frozen import FrozenWeights, freeze
from torch_adreno.training.step import TrainingStep

__all__ = [
    "OPTIONS", "AdrenoError", "Buckets", "Config", "DeviceNotFoundError", "DeviceTensor", "FrozenWeights", "LoweringError",
    "OptionError", "ReplayMismatchError", "ShapeLimitError", "TrainingStep", "UnsupportedOpError", "adreno_backend", "freeze", "list_devices",
    "mark_changed", "profile",
]

