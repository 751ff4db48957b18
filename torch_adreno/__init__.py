"""torch_adreno: a torch.compile backend that trains PyTorch models on OpenCL GPUs.

    cmodel = torch.compile(model, backend="adreno")

The pipeline, one folder per stage: frontend (Dynamo's graphs) -> lowering -> ir -> fusion ->
memory -> kernels -> runtime -> replay -> training; ``api`` is the public surface.
"""

from __future__ import annotations

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
    from torch_adreno.api import *  # noqa: F403  (the backend, registered with Dynamo on import)
    from torch_adreno.api import __all__  # noqa: F401
