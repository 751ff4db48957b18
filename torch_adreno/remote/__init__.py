"""A remote OpenCL device driven from the desktop: a phone running ``torch-adreno-step serve``
(``native/``, ``native/PROTOCOL.md``), reached over TCP (``adb forward`` or the network).

- :class:`RemoteDevice` / :class:`RemoteStep`: the client (properties, load a step, run steps with
  batches, read and write state, set a scalar input such as ``lr``, profile).
- :func:`parse_remote`: ``remote:HOST:PORT`` device strings (``TORCH_ADRENO_DEVICE``).
- :func:`device_profile`: the remote device's properties as a :class:`~torch_adreno.targets.DeviceProfile`,
  for compiling against its real limits.
- :class:`NativeStep`: the same calls on a local device through the native library (ctypes).
"""

from __future__ import annotations

from torch_adreno.remote.client import (
    RemoteConnectionError,
    RemoteDevice,
    RemoteError,
    RemoteServerError,
    RemoteStep,
    RemoteTimeout,
    parse_remote,
)
from torch_adreno.remote.native_library import NativeStep, NativeStepError
from torch_adreno.remote.profile import device_profile

__all__ = [
    "NativeStep",
    "NativeStepError",
    "RemoteConnectionError",
    "RemoteDevice",
    "RemoteError",
    "RemoteServerError",
    "RemoteStep",
    "RemoteTimeout",
    "device_profile",
    "parse_remote",
]
