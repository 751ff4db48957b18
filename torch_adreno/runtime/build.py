"""Building OpenCL programs: one program per compiled graph, built once per process and compiled
once per device and driver.

All kernels of a graph go into one program (one compiler invocation: on PoCL a build of twenty
kernels costs about what one of a single kernel does), each distinct kernel once: kernels of
equal content (a model's repeated blocks) are one function of it, which every one of them gets a
kernel object of (:func:`~torch_adreno.kernels.program.assemble_program`). Programs come from
:mod:`torch_adreno.runtime.binary_cache`: this process's programs, then device binaries cached on
disk, then the compiler; so a second process compiles nothing an earlier one compiled.
"""

from __future__ import annotations

import pyopencl as cl

from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelSource
from torch_adreno.kernels.program import assemble_program
from torch_adreno.runtime.binary_cache import (
    BuildStats,
    build_stats,
    count_kernels,
    get_program,
    reset_build_stats,
)
from torch_adreno.runtime.device import DeviceRuntime

__all__ = ["BuildStats", "build_kernels", "build_stats", "reset_build_stats"]


def build_kernels(runtime: DeviceRuntime, kernels: list[KernelSource]) -> dict[str, cl.Kernel]:
    """Build ``kernels`` as one program; returns a kernel object per kernel name.

    Each distinct kernel is built once, under its symbol (``KernelSource.symbol``: no graph
    number, so the same graph compiled under another number is the same program, a binary cache
    hit); a kernel of the same content as an earlier one of ``kernels`` gets a kernel object of
    that one's function (its ``function_name`` is then the earlier kernel's symbol). The symbols
    of ``kernels`` must differ. A program that does not compile raises :class:`KernelBuildError`
    with the numbered source.
    """
    if not kernels:
        return {}
    text = assemble_program(kernels)
    count_kernels(len(kernels), text.function_count)
    try:
        program = get_program(runtime.context, runtime.device, text.source, text.options,
                              sorted(set(text.functions.values())))
    except cl.RuntimeError as err:
        numbered = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(text.source.splitlines()))
        raise KernelBuildError(
            f"OpenCL program of kernels {', '.join(k.name for k in kernels)} failed to build on "
            f"{runtime.entry.label} (options {' '.join(text.options)}):\n{err}\n--- source ---\n{numbered}"
        ) from None
    # Each Executable gets its own kernel objects: kernel arguments are per object.
    return {k.name: cl.Kernel(program, text.functions[k.name]) for k in kernels}
