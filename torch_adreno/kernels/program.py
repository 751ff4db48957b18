"""Data types of the kernels stage: rendered kernels and the program of launches for one graph."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from importlib import resources

from torch_adreno import ir
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.expressions import HELPER_SOURCES
from torch_adreno.kernels.params import BOUND_BUFFER_ROLES, KernelParam, Role
from torch_adreno.memory import MemoryPlan
from torch_adreno.targets import DeviceProfile


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


#: The C name a kernel is rendered under to compare it with others by content
#: (:meth:`KernelSource.content`): no kernel's symbol.
CANONICAL_SYMBOL = "KERNEL"

#: Macros every kernel's source defines from its records (:meth:`KernelSource.render`): its C
#: function name, its parameter list and the declarations at the top of its body.
RECORD_MACROS = ("KERNEL_NAME", "KERNEL_PARAMS", "KERNEL_LOCALS")


#: Lines defining ``KERNEL_HELPER(suffix)``, the name of a helper function of one kernel (a GEMM's
#: operand loads and epilogue): the kernel's symbol with ``suffix`` appended, by token pasting (two
#: levels, so that ``KERNEL_NAME`` is expanded first). The symbol stays in one ``#define`` line.
HELPER_NAMING = ("#define KERNEL_CAT_(a, b) a##b", "#define KERNEL_CAT(a, b) KERNEL_CAT_(a, b)",
                 "#define KERNEL_HELPER(suffix) KERNEL_CAT(KERNEL_NAME, suffix)")
HELPER_NAMING_MACROS = ("KERNEL_CAT_", "KERNEL_CAT", "KERNEL_HELPER")


def helper_name(suffix: str) -> str:
    """The C name of the kernel's helper ``<symbol><suffix>`` in its text (see :data:`HELPER_NAMING`)."""
    return f"KERNEL_HELPER({suffix})"


def kernel_opening(attribute: str = "") -> list[str]:
    """The first lines of a kernel's text: the signature through ``KERNEL_NAME(KERNEL_PARAMS)``
    and ``KERNEL_LOCALS`` opening the body (the operands a replay placed in an arena)."""
    return [f"__kernel {attribute}void KERNEL_NAME(KERNEL_PARAMS) {{", "    KERNEL_LOCALS"]


@dataclass(frozen=True)
class KernelSource:
    """One OpenCL kernel, ready to build and launch.

    ``arguments`` are the kernel's parameter records, in signature order (with the operands a
    replay placed in an arena, which are not arguments, where they were). ``params`` is derived
    from them: the IR buffer (or arena) bound to each buffer argument, in order. ``local_size`` is
    always set: the launch geometry is chosen here, never left to the driver.
    ``bytes_read``/``bytes_written`` are the global-memory bytes one launch must move (each
    buffer it touches counted once), the measure fusion is judged by.

    ``name`` identifies the kernel (messages, profiles, tuning results, launch lists) and carries
    its graph's process-wide number; ``symbol`` is its C function name, without that number, so
    the same graph compiled under another number has the same text (a binary cache hit).

    Invariant: ``text`` never names the symbol and never declares the kernel's own parameters:
    it takes them through ``KERNEL_NAME``, ``KERNEL_PARAMS`` and ``KERNEL_LOCALS``, whose
    ``#define`` lines :meth:`render` writes from ``symbol`` and ``arguments``, and names arguments
    only by their C names (a helper it calls with them declares parameters of its own, which an
    arena's local pointers bind as well). So the records are the one source of truth of the
    signature, and changing them (a rename, an arena placement) changes no text.
    """

    name: str
    symbol: str
    kind: str
    #: The kernel's text after its ``#define`` lines: its own macros, helpers and the kernel.
    text: str
    build_options: tuple[str, ...]
    arguments: tuple[KernelParam, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    origins: tuple[ir.Origin, ...]
    bytes_read: int
    bytes_written: int
    #: What the kernel computes (its header comment says it, with the FX nodes); "": no header.
    description: str = ""
    #: Macros ``text`` defines (besides :data:`RECORD_MACROS`); undefined after it when several
    #: kernels share one program.
    macros: tuple[str, ...] = ("INDEX_T",)
    #: Floating-point operations of one launch (a multiply-add counts two), estimated from the IR.
    flops: int = 0
    #: Buffers also read through images, one image argument each after the buffers (and the index
    #: check arguments), in this order (the image records of ``arguments``, with their geometry).
    images: tuple[ImageOperand, ...] = ()
    #: The IR buffers (among ``params``) this launch writes and those it reads (a split-K GEMM's
    #: two launches take the same parameters and use different ones). What the memory verifier
    #: (:mod:`torch_adreno.memory.verify`) checks a plan against.
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    #: OpenCL extensions the kernel enables (``cl_khr_fp16`` where it computes in half).
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        images = tuple(r.key for r in self.arguments if r.role is Role.IMAGE)
        if images != tuple(i.buffer for i in self.images):
            raise ValueError(f"kernel {self.name}: image arguments {images} and image operands "
                             f"{tuple(i.buffer for i in self.images)} differ")

    @property
    def fx_nodes(self) -> tuple[str, ...]:
        return tuple(o.node for o in self.origins)

    @functools.cached_property
    def params(self) -> tuple[str, ...]:
        """The IR buffer (or arena, :func:`~torch_adreno.kernels.arena_params.arena_buffer`) bound
        to each buffer argument, in argument order; the index check arguments follow them, then
        the images."""
        return tuple(r.key for r in self.arguments if r.is_argument and r.role in BOUND_BUFFER_ROLES)

    @property
    def writable(self) -> tuple[str, ...]:
        """The IR buffers whose parameters are declared writable (no ``const``): every buffer the
        kernel's fusion group writes, in both launches of a split-K GEMM (they share one parameter
        list)."""
        return tuple(r.key for r in self.arguments if r.role is Role.BUFFER and r.written)

    @property
    def checks_indices(self) -> bool:
        """Whether the kernel checks data-dependent indices (``index_check.cl``): it then takes two
        arguments after ``params``, the device's index error record and a token naming the launch."""
        return any(r.role is Role.INDEX_ERROR for r in self.arguments)

    @property
    def header(self) -> str:
        """The comment opening the kernel's source: its symbol, what it computes, its FX nodes."""
        return header_comment(self.symbol, self.origins, self.description) if self.description else ""

    @property
    def source(self) -> str:
        """The kernel's whole source: header, extensions, the record macros, then ``text``."""
        return self.render()

    def content(self) -> tuple[str, tuple[str, ...]]:
        """What the kernel's program function is, whatever its names and FX nodes: its source under
        :data:`CANONICAL_SYMBOL` without the header, and its build options. Kernels of equal content
        compute the same function of their arguments (the same code on the same shapes: the
        repeated blocks of a model), so one function of a program runs them all
        (:func:`assemble_program`). The launch geometry is not part of it: the code does not read
        it except through build options."""
        return self.render(symbol=CANONICAL_SYMBOL, header=False), self.build_options

    def render(self, symbol: str | None = None, header: bool = True) -> str:
        """The source with ``symbol`` as its C function name (default: the kernel's own) and,
        unless ``header`` is false, its header comment. Everything that depends on the kernel's
        name or parameters is a ``#define`` line written here from the records."""
        symbol = self.symbol if symbol is None else symbol
        lines = [header_comment(symbol, self.origins, self.description)] if header and self.description else []
        lines += [f"#pragma OPENCL EXTENSION {extension} : enable" for extension in self.extensions]
        arguments = [r.declaration() for r in self.arguments if r.is_argument]
        located = [r.local_declaration() for r in self.arguments if not r.is_argument]
        lines += [f"#define KERNEL_NAME {symbol}", f"#define KERNEL_PARAMS {', '.join(arguments)}",
                  " ".join(["#define KERNEL_LOCALS", *located])]
        return "\n".join([*lines, self.text])


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
    #: The code choices the kernels were rendered with (a tuner's heuristic candidate follows
    #: them). None: the device's own.
    choices: KernelChoices | None = None

    @property
    def kernels(self) -> list[KernelSource]:
        return [s for s in self.steps if isinstance(s, KernelSource)]

    def renamed(self, graph_name: str) -> KernelProgram:
        """This program for a graph named ``graph_name``: the graph and its kernels' names (``<graph
        name>_<index>_...``) renamed. No text changes: a kernel's text names only its symbol,
        which carries no graph number."""
        old = f"{self.graph.name}_"
        steps: list[Step] = [
            replace(s, name=f"{graph_name}_{s.name.removeprefix(old)}") if isinstance(s, KernelSource)
            and s.name.startswith(old) else s for s in self.steps]
        return replace(self, graph=replace(self.graph, name=graph_name), steps=steps)


@dataclass(frozen=True)
class ProgramText:
    """One program's source for several kernels: ``functions`` maps each kernel's name to the C
    function of the program that runs it (its own symbol, or that of the first kernel of the same
    content)."""

    source: str
    options: tuple[str, ...]
    functions: dict[str, str]

    @property
    def function_count(self) -> int:
        return len(set(self.functions.values()))


def assemble_program(kernels: list[KernelSource]) -> ProgramText:
    """One program source for several kernels, its build options, and the function of each kernel.

    A program per graph is built in one compiler invocation (on PoCL, one build of 20 kernels costs
    about what one build of a single kernel does). Kernels of equal :meth:`~KernelSource.content`
    are one function, named by the first one's symbol (a model's repeated blocks compile once);
    the headers of the others follow its header, so the program still names every kernel's FX
    nodes. Each function's ``-D`` options become ``#define`` lines around its source, and every
    macro it defines (its record macros too) is undefined after it; options that are not macro
    definitions apply to the whole program. The kernels' symbols must differ (each names a
    function of the program, or a kernel run by one).
    """
    symbols = [k.symbol for k in kernels]
    if len(set(symbols)) != len(symbols):
        repeated = sorted({s for s in symbols if symbols.count(s) > 1})
        raise ValueError(f"kernels of one program share the symbol(s) {', '.join(repeated)}")
    by_content: dict[tuple[str, tuple[str, ...]], list[KernelSource]] = {}
    for k in kernels:
        by_content.setdefault(k.content(), []).append(k)
    parts: list[str] = [helper_source(name) for name in helpers_called(kernels)]
    program_options: dict[str, None] = {}
    functions: dict[str, str] = {}
    for first, *others in by_content.values():
        functions.update((k.name, first.symbol) for k in (first, *others))
        defined: list[str] = []
        for opt in first.build_options:
            if opt.startswith("-D"):
                name, _, value = opt[2:].partition("=")
                parts.append(f"#define {name} {value or 1}")
                defined.append(name)
            else:
                program_options[opt] = None
        parts.extend(header_comment(f"{k.symbol} (run by {first.symbol} below)", k.origins, k.description)
                     for k in others if k.description)
        parts.append(first.source)
        parts.extend(f"#undef {name}" for name in dict.fromkeys([*defined, *RECORD_MACROS, *first.macros]))
        parts.append("")
    return ProgramText("\n".join(parts), tuple(program_options), functions)


def assemble(kernels: list[KernelSource]) -> tuple[str, tuple[str, ...]]:
    """The source and build options of :func:`assemble_program`."""
    text = assemble_program(kernels)
    return text.source, text.options


def helpers_called(kernels: list[KernelSource]) -> list[str]:
    """The helper ``.cl`` files (see ``HELPER_SOURCES``) that some kernel of ``kernels`` calls."""
    return sorted({file for call, file in HELPER_SOURCES.items() if any(call in k.text for k in kernels)})


def helper_source(file: str) -> str:
    return resources.files("torch_adreno.kernels").joinpath(file).read_text()


def c_identifier(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", text)


def header_comment(symbol: str, origins: tuple[ir.Origin, ...], description: str) -> str:
    """The comment that opens every kernel: what it computes and which FX nodes it came from."""
    lines = [f"// kernel {symbol}: {description}"]
    for o in origins:
        extra = f" [{o.module}]" if o.module else ""
        lines.append(f"//   from FX node {o.node} ({o.op}){extra}")
    return "\n".join(lines)
