"""Data types of the kernels stage: rendered kernels and the program of launches for one graph."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from importlib import resources

from torch_adreno import ir
from torch_adreno.kernels.expressions import HELPER_SOURCES
from torch_adreno.memory import MemoryPlan
from torch_adreno.target import DeviceProfile


@dataclass(frozen=True)
class ImageOperand:
    """A buffer a kernel reads through a 2D RGBA image as well (the texture path).

    The buffer's flat element ``i`` is channel ``i % 4`` of texel ``(i / 4 % width, i / 4 / width)``:
    the image is the buffer's bytes, ``width`` texels (4 elements each) per row, ``height`` rows,
    ``width * height * 4`` elements in all. The kernel takes the image as an argument after its
    buffer arguments (which still include the buffer: the runtime makes the image from it).
    """

    buffer: str
    width: int
    height: int
    #: Storage of each of a texel's 4 channels, the buffer's element type ("float32"; the half
    #: formats read the same way: ``read_imagef`` widens them).
    channel_type: str = "float32"


@dataclass(frozen=True)
class KernelSource:
    """One OpenCL kernel, ready to build and launch.

    ``params`` names the IR buffer bound to each kernel argument, in order. ``local_size`` is
    always set: the launch geometry is chosen here, never left to the driver.
    ``bytes_read``/``bytes_written`` are the global-memory bytes one launch must move (each
    buffer it touches counted once), the measure fusion is judged by.
    """

    name: str
    kind: str
    source: str
    build_options: tuple[str, ...]
    params: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    origins: tuple[ir.Origin, ...]
    bytes_read: int
    bytes_written: int
    #: Macros the source defines; undefined after it when several kernels share one program.
    macros: tuple[str, ...] = ("INDEX_T",)
    #: Floating-point operations of one launch (a multiply-add counts two), estimated from the IR.
    flops: int = 0
    #: Buffers also read through images, one image argument each after ``params``, in this order.
    images: tuple[ImageOperand, ...] = ()
    #: Whether the kernel checks data-dependent indices (``index_check.cl``): it then takes two
    #: arguments after ``params``, the device's index error record and a token naming the launch.
    checks_indices: bool = False
    #: The IR buffers (among ``params``) this launch writes and those it reads (a split-K GEMM's
    #: two launches take the same parameters and use different ones). What the memory verifier
    #: (:mod:`torch_adreno.memory.verify`) checks a plan against.
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    #: The parameters declared writable (no ``const``): every buffer the kernel's fusion group
    #: writes, in both launches of a split-K GEMM (they share one parameter list).
    writable: tuple[str, ...] = ()

    @property
    def fx_nodes(self) -> tuple[str, ...]:
        return tuple(o.node for o in self.origins)


@dataclass(frozen=True)
class HostStep:
    """An op run on the host by request (``fallback="host"``)."""

    node: ir.HostOp


Step = KernelSource | HostStep


@dataclass
class KernelProgram:
    """Everything the runtime needs to run one graph: its steps in order, buffers and plan."""

    graph: ir.Graph
    plan: MemoryPlan
    steps: list[Step]
    #: The profile the kernels were planned for (the device's, narrowed to a target's limits
    #: where one was given): a tuner varies launches only within it. None: the device's own.
    profile: DeviceProfile | None = None

    @property
    def kernels(self) -> list[KernelSource]:
        return [s for s in self.steps if isinstance(s, KernelSource)]

    def renamed(self, graph_name: str) -> KernelProgram:
        """This program for a graph named ``graph_name``: the graph, and its kernels and every
        identifier named after them (``<graph name>_<index>_...``), renamed."""
        old = re.compile(rf"\b{re.escape(self.graph.name)}_")
        steps: list[Step] = [
            replace(s, name=old.sub(f"{graph_name}_", s.name), source=old.sub(f"{graph_name}_", s.source))
            if isinstance(s, KernelSource) else s for s in self.steps]
        return replace(self, graph=replace(self.graph, name=graph_name), steps=steps)


def assemble(kernels: list[KernelSource]) -> tuple[str, tuple[str, ...]]:
    """One program source for several kernels, and the program's build options.

    A program per graph is built in one compiler invocation (on PoCL, one build of 20 kernels costs
    about what one build of a single kernel does). Each kernel's ``-D`` options become ``#define``
    lines around its source, and every macro it defines is undefined after it; options that are
    not macro definitions apply to the whole program.
    """
    parts: list[str] = [helper_source(name) for name in helpers_called(kernels)]
    program_options: dict[str, None] = {}
    for k in kernels:
        defined: list[str] = []
        for opt in k.build_options:
            if opt.startswith("-D"):
                name, _, value = opt[2:].partition("=")
                parts.append(f"#define {name} {value or 1}")
                defined.append(name)
            else:
                program_options[opt] = None
        parts.append(k.source)
        parts.extend(f"#undef {name}" for name in [*defined, *k.macros])
        parts.append("")
    return "\n".join(parts), tuple(program_options)


def helpers_called(kernels: list[KernelSource]) -> list[str]:
    """The helper ``.cl`` files (see ``HELPER_SOURCES``) that some kernel of ``kernels`` calls."""
    return sorted({file for call, file in HELPER_SOURCES.items() if any(call in k.source for k in kernels)})


def helper_source(file: str) -> str:
    return resources.files("torch_adreno.kernels").joinpath(file).read_text()


def c_identifier(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", text)


def header_comment(kernel_name: str, origins: tuple[ir.Origin, ...], description: str) -> str:
    """The comment that opens every kernel: what it computes and which FX nodes it came from."""
    lines = [f"// kernel {kernel_name}: {description}"]
    for o in origins:
        extra = f" [{o.module}]" if o.module else ""
        lines.append(f"//   from FX node {o.node} ({o.op}){extra}")
    return "\n".join(lines)
