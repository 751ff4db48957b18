"""Building OpenCL programs: one program per compiled graph, built once per process.

All kernels of a graph go into one program (one compiler invocation: on PoCL a build of twenty
kernels costs about what one of a single kernel does). PyOpenCL keeps built binaries in its
on-disk cache keyed by source, options and device, so a second process rebuilds nothing it built
before.
"""

from __future__ import annotations

import threading

import pyopencl as cl

from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelSource
from torch_adreno.kernels.program import assemble
from torch_adreno.runtime.device import DeviceRuntime

_programs: dict[tuple[str, str, tuple[str, ...]], cl.Program] = {}
_lock = threading.Lock()


def build_kernels(runtime: DeviceRuntime, kernels: list[KernelSource]) -> dict[str, cl.Kernel]:
    """Build ``kernels`` as one program; returns a kernel object per kernel name."""
    if not kernels:
        return {}
    source, options = assemble(kernels)
    key = (runtime.profile.key, source, options)
    with _lock:
        program = _programs.get(key)
        if program is None:
            try:
                program = cl.Program(runtime.context, source).build(options=list(options))
            except cl.RuntimeError as err:
                numbered = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(source.splitlines()))
                raise KernelBuildError(
                    f"OpenCL program of kernels {', '.join(k.name for k in kernels)} failed to build on "
                    f"{runtime.entry.label} (options {' '.join(options)}):\n{err}\n--- source ---\n{numbered}"
                ) from None
            _programs[key] = program
    # Each Executable gets its own kernel objects: kernel arguments are per object.
    return {k.name: cl.Kernel(program, k.name) for k in kernels}
