"""torch_adreno: a torch.compile backend that trains PyTorch models on OpenCL GPUs.

    cmodel = torch.compile(model, backend="adreno")

The pipeline, one folder per stage: frontend (Dynamo's graphs) -> lowering -> ir -> fusion ->
memory -> kernels -> runtime -> replay -> training; ``api`` is the public surface.

``import torch_adreno`` stays light (it adds well under half a second to ``import torch``): it
registers the backend's name with Dynamo without importing Dynamo (:mod:`torch_adreno.dynamo_registry`)
and imports the options and errors; the rest of the public surface (:mod:`torch_adreno.api`) and
the subpackages load at their first use (a module ``__getattr__``), Dynamo, OpenCL and ONNX with them.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

# Before anything loads OpenCL: pip-installed drivers (Intel's CPU runtime) join the ICD loader's.
from torch_adreno.opencl_drivers import register_pip_drivers as _register_pip_drivers

_register_pip_drivers()

from torch_adreno.config import BACKEND_NAME as BACKEND_NAME  # noqa: E402  (config needs no torch, no OpenCL)
from torch_adreno.config import VERSION  # noqa: E402

__version__ = VERSION

# Where PyTorch is not installed (a phone), the package still imports, for torch_adreno.runner:
# training exported steps needs numpy, pyopencl and onnx only. Everything else needs torch.
try:
    import torch  # noqa: F401
except ImportError as _torch_missing:
    if _torch_missing.name != "torch":
        raise
    _reason = str(_torch_missing)

    def __getattr__(name: str) -> object:
        raise ImportError(f"torch_adreno.{name} needs PyTorch, which cannot be imported here ({_reason}); without "
                          "it, `python -m torch_adreno.runner` trains steps exported by torch_adreno")
else:
    from torch_adreno import errors as errors
    from torch_adreno.config import OPTIONS, Config
    from torch_adreno.dynamo_registry import register_backend_name as _register_backend_name
    from torch_adreno.errors import (
        AdrenoError,
        DeviceNotFoundError,
        LoweringError,
        OptionError,
        ReplayMismatchError,
        ShapeLimitError,
        UnsupportedOpError,
    )

    _register_backend_name()

    if TYPE_CHECKING:
        from torch_adreno.api import (
            Buckets,
            DeviceTensor,
            FrozenWeights,
            TrainingStep,
            adreno_backend,
            freeze,
            list_devices,
            mark_changed,
            profile,
        )

    #: The public names; those not imported above are torch_adreno.api's, loaded at first use.
    __all__ = [
        "OPTIONS", "AdrenoError", "Buckets", "Config", "DeviceNotFoundError", "DeviceTensor", "FrozenWeights",
        "LoweringError", "OptionError", "ReplayMismatchError", "ShapeLimitError", "TrainingStep", "UnsupportedOpError",
        "adreno_backend", "freeze", "list_devices", "mark_changed", "profile",
    ]

    def __getattr__(name: str) -> object:
        """A public name of :mod:`torch_adreno.api`, or a submodule (``torch_adreno.runtime``),
        imported at its first use. Loading the public surface imports the backend's module, which
        installs :mod:`torch_adreno.torch_patches`. A submodule is imported alone: ``from
        torch_adreno import runtime`` asks for it here first, from inside the package too."""
        if name in __all__:
            return getattr(importlib.import_module("torch_adreno.api"), name)
        # Probes of other names (hasattr, pytest, inspect) import nothing.
        if not name.startswith("_") and importlib.util.find_spec(f"torch_adreno.{name}") is not None:
            return importlib.import_module(f"torch_adreno.{name}")
        raise AttributeError(f"module 'torch_adreno' has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
