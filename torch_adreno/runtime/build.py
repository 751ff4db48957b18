"""Building OpenCL programs, once per (device, source, options) in a process.

PyOpenCL keeps built binaries in its on-disk cache keyed by source, options and device, so a
second process rebuilds nothing it built before.
"""

from __future__ import annotations

import threading

import pyopencl as cl

from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelSource
from torch_adreno.runtime.device import DeviceRuntime


_programs: dict[tuple[str, str, tuple[str, ...]], cl.Program] = {}
_lock = threading.Lock()


def build_kernel(runtime: DeviceRuntime, kernel: KernelSource) -> cl.Kernel:
    key = (runtime.profile.key, kernel.source, kernel.build_options)
    with _lock:
        program = _programs.get(key)
        if program is None:
            try:
                program = cl.Program(runtime.context, kernel.source).build(options=list(kernel.build_options))
            except cl.RuntimeError as err:
                numbered = "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(kernel.source.splitlines()))
                raise KernelBuildError(
                    f"OpenCL kernel {kernel.name} failed to build on {runtime.entry.label} "
                    f"(options {' '.join(kernel.build_options)}):\n{err}\n--- source ---\n{numbered}"
                ) from None
            _programs[key] = program
    return getattr(program, kernel.name)
