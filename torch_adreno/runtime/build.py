"""Building OpenCL programs: one program per compiled graph, built once per process and compiled
once per device and driver.

All kernels of a graph go into one program (one compiler invocation: on PoCL a build of twenty
kernels costs about what one of a single kernel does). Programs come from
:mod:`torch_adreno.runtime.binary_cache`: this process's programs, then device binaries cached on
disk, then the compiler; so a second process compiles nothing an earlier one compiled.
"""

from __future__ import annotations

import pyopencl as cl

from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelSource
from torch_adreno.kernels.program import assemble
from torch_adreno.runtime.binary_cache import BuildStats, build_stats, get_program, reset_build_stats
from torch_adreno.runtime.device import DeviceRuntime

__all__ = ["BuildStats", "build_kernels", "build_stats", "reset_build_stats"]


def build_kernels(runtime: DeviceRuntime, kernels: list[KernelSource]) -> dict[str, cl.Kernel]:
    """Build ``kernels`` as one program; returns a kernel object per kernel name.

    Each kernel is built under its symbol (``KernelSource.symbol``: no graph number, so the same
    graph compiled under another number is the same program, a binary cache hit); the symbols of
    ``kernels`` must differ. A program that does not compile raises :class:`KernelBuildError` with
    the numbered source.
    """
    if not kernels:
        return {}
    source, options = assemble(kernels)
    names = [k.name for k in kernels]
    try:
        program = get_program(runtime.context, runtime.device, source, options, [k.symbol for k in kernels])
    except cl.RuntimeError as err:
        numbered = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(source.splitlines()))
        raise KernelBuildError(
            f"OpenCL program of kernels {', '.join(names)} failed to build on "
            f"{runtime.entry.label} (options {' '.join(options)}):\n{err}\n--- source ---\n{numbered}"
        ) from None
    # Each Executable gets its own kernel objects: kernel arguments are per object.
    return {k.name: cl.Kernel(program, k.symbol) for k in kernels}
