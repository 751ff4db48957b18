"""What ``import torch_adreno`` provides where PyTorch is installed (re-exported by the package)."""

from __future__ import annotations

from torch_adreno import torch_patches
from torch_adreno.config import BACKEND_NAME, OPTIONS, Config
from torch_adreno.errors import (
    AdrenoError,
    DeviceNotFoundError,
    LoweringError,
    OptionError,
    ReplayMismatchError,
    ShapeLimitError,
    UnsupportedOpError,
)
from torch_adreno.frontend import adreno_backend, backend_config
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


def _register() -> None:
    """Register ``backend="adreno"`` with Dynamo unless the installed entry point already does.

    When the package is installed, Dynamo finds the backend through the ``torch_dynamo_backends``
    entry point and registers it itself on first lookup; registering here as well would make
    that lookup fail as a duplicate. Without an install (a source checkout on PYTHONPATH), this
    registration is what makes the name work.
    """
    from torch._dynamo.backends import registry

    registry._lazy_import()  # discovers entry points, filling registry._BACKENDS
    if BACKEND_NAME not in registry._BACKENDS:
        registry.register_backend(adreno_backend, name=BACKEND_NAME)


_register()

# What this package changes in PyTorch (each change, its torch versions and why: torch_patches).
torch_patches.install(adreno_backend, backend_config)
