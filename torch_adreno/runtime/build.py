"""Building OpenCL programs: one program per compiled graph, built once per process and compiled
once per device and driver.

All kernels of a graph go into one program (one compiler invocation: on PoCL a build of twenty
kernels costs about what one of a single kernel does). Programs come from
:mod:`torch_adreno.runtime.binary_cache`: this process's programs, then device binaries cached on
disk, then the compiler; so a second process compiles nothing an earlier one compiled.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

import pyopencl as cl

from torch_adreno.errors import KernelBuildError
from torch_adreno.kernels import KernelSource
from torch_adreno.kernels.program import assemble
from torch_adreno.runtime.binary_cache import BuildStats, build_stats, get_program, reset_build_stats
from torch_adreno.runtime.device import DeviceRuntime

__all__ = ["BuildStats", "build_kernels", "build_names", "build_stats", "reset_build_stats"]

# The number of a graph in its kernels' names ("forward_12_3_gemm_addmm" -> "forward_3_gemm_addmm").
_GRAPH_NUMBER = re.compile(r"_\d+_")
_WORD = re.compile(r"\w+")


_MAX_SUFFIXES = 8


def build_names(source: str, names: Sequence[str]) -> dict[str, str]:
    """Per kernel name, the name the kernel is built under.

    Kernel names, and the helpers and temporaries named after them, carry the process-wide number
    of their graph, so the same graph compiled after a different set of others would be a different
    program: a miss in the binary cache. The built name drops that number, and :func:`_rename`
    replaces it wherever an identifier starts with the kernel's name. Whatever the naming
    convention, this is a consistent renaming of identifiers and the program means the same: a
    changed name is a prefix of no identifier in ``source`` and of no other built name (nor the
    other way round), so no two identifiers become one. A convention this does not recognise only
    costs cache hits.
    """
    words = sorted(set(_WORD.findall(source)))
    taken: list[str] = []

    def clashes(built: str) -> bool:
        at = bisect.bisect_left(words, built)
        return ((at < len(words) and words[at].startswith(built))
                or any(t.startswith(built) or built.startswith(t) for t in taken))

    mapping: dict[str, str] = {}
    for name in names:
        built = _GRAPH_NUMBER.sub("_", name, count=1)
        if built != name:
            for _ in range(_MAX_SUFFIXES):
                if not clashes(built):
                    break
                built += "_"
            else:
                # Suffixes cannot separate a name that extends a taken one: keep every name as it
                # is (always a consistent renaming; it only costs cache hits).
                return {n: n for n in names}
        mapping[name] = built
        taken.append(built)
    return mapping


def _rename(source: str, mapping: dict[str, str]) -> str:
    """``source`` with every identifier that starts with a renamed kernel's name starting with its
    built name instead (the longest name wins where names share a prefix)."""
    changed = sorted((n for n, b in mapping.items() if n != b), key=len, reverse=True)
    if not changed:
        return source
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, changed)) + ")")
    return pattern.sub(lambda m: mapping[m.group(0)], source)


def build_kernels(runtime: DeviceRuntime, kernels: list[KernelSource]) -> dict[str, cl.Kernel]:
    """Build ``kernels`` as one program; returns a kernel object per (original) kernel name.

    A program that does not compile raises :class:`KernelBuildError` with the numbered source.
    """
    if not kernels:
        return {}
    source, options = assemble(kernels)
    names = [k.name for k in kernels]
    mapping = build_names(source, names)
    source = _rename(source, mapping)
    try:
        program = get_program(runtime.context, runtime.device, source, options, list(mapping.values()))
    except cl.RuntimeError as err:
        numbered = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(source.splitlines()))
        raise KernelBuildError(
            f"OpenCL program of kernels {', '.join(names)} failed to build on "
            f"{runtime.entry.label} (options {' '.join(options)}):\n{err}\n--- source ---\n{numbered}"
        ) from None
    # Each Executable gets its own kernel objects: kernel arguments are per object.
    return {name: cl.Kernel(program, mapping[name]) for name in names}
