"""IR buffers, nodes (Pointwise, Reduction, Gemm template, HostOp) and graphs, with a text printer."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch_adreno.ir.expr import DType, Expr, loads, loop_var
from torch_adreno.ir.view import View, placeholder_vars


@dataclass(frozen=True)
class Origin:
    """Where a node came from: the FX node, its ATen op, module path and user source line."""

    node: str
    op: str
    module: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class IndexCheck:
    """A place where a kernel uses a tensor's values as indices (the ``site`` argument of the IR op
    ``checked_index`` is its position in :attr:`Graph.index_checks`): what the host reports when a
    value falls outside ``[0, size)`` (or ``[-size, size)`` where negative values count from the end).

    ``error`` is the exception type eager PyTorch raises there ("IndexError" or "RuntimeError");
    ``eager_message`` is eager's wording when it does not name the value (embedding: "index out of
    range in self"), else None. ``value_message``: a check of a value that is not an index (a
    ``histc`` range taken from the data, which must be finite) reports eager's wording alone, with
    no index or dimension in it."""

    origin: Origin
    dim: int
    size: int
    wraps: bool
    error: str
    eager_message: str | None = None
    value_message: str | None = None


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class Pointwise:
    """``output[i] = body(i)`` for every ``i`` in ``ranges`` (the output buffer's shape)."""

    name: str
    output: str
    ranges: tuple[int, ...]
    body: Expr
    origins: tuple[Origin, ...]

    @property
    def loop_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.ranges, "i")

    def inputs(self) -> list[str]:
        return _buffers_read(self.body)


#: Reductions the IR supports and the value each starts from.
REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclass
class Reduction:
    """``output[i] = reduce_op over r in reduction_ranges of body(i, r)``.

    ``body`` uses ``i*`` variables (over ``ranges``, the output shape) and ``r*`` variables (over
    ``reduction_ranges``). ``argmax``/``argmin`` yield the row-major linear index of the winning
    ``r``, the first one on ties; NaN wins like in PyTorch.
    """

    name: str
    output: str
    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    reduce_op: str
    body: Expr
    origins: tuple[Origin, ...]

    def __post_init__(self) -> None:
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduction {self.reduce_op!r}; known: {REDUCE_OPS}")

    @property
    def loop_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.ranges, "i")

    @property
    def reduction_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.reduction_ranges, "r")

    @property
    def reduction_numel(self) -> int:
        return math.prod(self.reduction_ranges)

    def inputs(self) -> list[str]:
        return _buffers_read(self.body)


GEMM_VARS = {"b": "b", "m": "m", "n": "n", "k": "k"}


@dataclass
class Gemm:
    """``output[out_index(b, m, n)] = sum_k lhs(b, m, k) * rhs(b, k, n)`` (a template node).

    ``lhs`` is written over variables ``b, m, k``, ``rhs`` over ``b, k, n`` and ``out_index`` over
    ``b, m, n``; ``out_index`` maps the ``batch x m x n`` space one-to-one onto the output buffer.
    Operands may be any expression: a transposed weight, an im2col gather of a convolution input
    with padding, a masked gradient.
    """

    name: str
    output: str
    batch: int
    m: int
    n: int
    k: int
    lhs: Expr
    rhs: Expr
    out_index: tuple[Expr, ...]
    origins: tuple[Origin, ...]

    def vars(self) -> dict[str, Expr]:
        return {
            "b": loop_var("b", self.batch),
            "m": loop_var("m", self.m),
            "n": loop_var("n", self.n),
            "k": loop_var("k", self.k),
        }

    def inputs(self) -> list[str]:
        return _dedupe(_buffers_read(self.lhs) + _buffers_read(self.rhs))


@dataclass
class HostOp:
    """An op the user asked to run on the host (``fallback="host"``); counted, never silent.

    ``run`` takes host tensors for ``inputs`` (in order) and returns host tensors for ``outputs``.
    """

    name: str
    target: str
    inputs: tuple[View, ...]
    outputs: tuple[str, ...]
    run: Callable[..., Sequence[Any]]
    origins: tuple[Origin, ...]

    def input_buffers(self) -> list[str]:
        return _dedupe([v.buffer for v in self.inputs])


@dataclass
class TemplateOp:
    """A kernel template with buffers in and out, which fusion never merges (fused attention).

    ``target`` names the template (its renderer in the kernels stage), ``attributes`` its static
    parameters. It reads ``inputs`` through their views (a transposed head layout is read in place)
    and writes every element of each of ``outputs``, none of which is one of its inputs."""

    name: str
    target: str
    inputs: tuple[View, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, Any], ...]
    origins: tuple[Origin, ...]

    def input_buffers(self) -> list[str]:
        return _dedupe([v.buffer for v in self.inputs])

    def attribute(self, name: str) -> Any:
        return dict(self.attributes)[name]


Node = Pointwise | Reduction | Gemm | HostOp | TemplateOp


def node_inputs(node: Node) -> list[str]:
    if isinstance(node, HostOp | TemplateOp):
        return node.input_buffers()
    return node.inputs()


def node_outputs(node: Node) -> list[str]:
    return list(node.outputs) if isinstance(node, HostOp | TemplateOp) else [node.output]


def _dedupe(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _buffers_read(expr: Expr) -> list[str]:
    return _dedupe([ld.buffer for ld in loads(expr)])


class OutputRole(enum.Enum):
    """Where a graph output goes: to the user (host) or to a later graph (stays on device)."""

    HOST = "host"
    DEVICE = "device"


@dataclass(frozen=True)
class GraphOutput:
    """Output ``position`` of the graph: a buffer, or None for a ``None`` output.

    An output whose buffer is a graph input is returned as the caller's own object.
    """

    buffer: str | None
    role: OutputRole
    #: The output's shape when it is a reshape of its buffer (same bytes); None: the buffer's shape.
    shape: tuple[int, ...] | None = None


@dataclass
class Graph:
    """A lowered FX graph: inputs bound by position, nodes in execution order, outputs."""

    name: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str | None] = field(default_factory=list)
    outputs: list[GraphOutput] = field(default_factory=list)
    #: In-place updates of inputs (an optimizer step): input buffer -> buffer holding its new value.
    mutations: dict[str, str] = field(default_factory=dict)
    #: Inputs the caller does not pass: at most one, a fresh int64 seed per call that every random
    #: op of the graph reads, drawn by the runtime from torch's default generator (so
    #: torch.manual_seed makes runs repeat). It is the last entry of ``inputs``.
    random_seeds: list[str] = field(default_factory=list)
    #: Where kernels index by tensor values (the ``site`` of each ``checked_index`` expression).
    index_checks: list[IndexCheck] = field(default_factory=list)
    #: Inputs the caller does not pass either: the FX graph's tensor constants (``torch.tensor([...])``
    #: in traced code), buffer name -> the constant's values (a contiguous CPU ``torch.Tensor`` of the
    #: buffer's shape and dtype, never changed). The runtime binds each after the caller's arguments
    #: and before the seed, as a pinned host tensor: its device copy is made once and stays resident.
    constants: dict[str, Any] = field(default_factory=dict)
    #: Inputs (by name) and outputs (by position) the caller holds in double precision: scalars
    #: only, computed here in float32 (``lowering.context.ir_dtype``); the caller converts them.
    float64_inputs: set[str] = field(default_factory=set)
    float64_outputs: set[int] = field(default_factory=set)
    #: Buffers written only so that the kernel writing them runs: device-side assertions
    #: (``_assert_async``, a check through the index error record) whose value nothing reads. Kept
    #: as outputs are (stored, live to the end), never returned.
    effects: list[str] = field(default_factory=list)

    def input_buffers(self) -> set[str]:
        return {b for b in self.inputs if b is not None}

    def output_buffers(self) -> set[str]:
        """Buffers whose values leave the graph or must be computed: its outputs, the new values of
        mutated inputs and its :attr:`effects`."""
        return {o.buffer for o in self.outputs if o.buffer is not None} | set(self.mutations.values()) | set(self.effects)

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in node_outputs(n)}

    def __str__(self) -> str:
        return format_graph(self)


def _format_node(node: Node) -> str:
    origins = ", ".join(o.node for o in node.origins)
    if isinstance(node, Pointwise):
        text = f"{node.output} = pointwise{list(node.ranges)} {node.body}"
    elif isinstance(node, Reduction):
        text = (f"{node.output} = reduce_{node.reduce_op}{list(node.ranges)} "
                f"over {list(node.reduction_ranges)} {node.body}")
    elif isinstance(node, Gemm):
        text = (f"{node.output}[{', '.join(map(str, node.out_index))}] = gemm(b={node.batch}, m={node.m}, "
                f"n={node.n}, k={node.k}) lhs={node.lhs} rhs={node.rhs}")
    else:
        ins = ", ".join(str(v.buffer) for v in node.inputs)
        kind = "template" if isinstance(node, TemplateOp) else "host"
        text = f"{', '.join(node.outputs)} = {kind} {node.target}({ins})"
    return f"  {text}  # {origins}"


def format_graph(graph: Graph) -> str:
    """A stable, readable text form of the graph (used by tests and the debug dump)."""
    lines = [f"graph {graph.name}"]
    for pos, name in enumerate(graph.inputs):
        if name is not None:
            b = graph.buffers[name]
            lines.append(f"  input {pos}: {name} {b.dtype.value}{list(b.shape)}")
    computed = [b for n in graph.nodes for b in node_outputs(n)]
    for name in computed:
        b = graph.buffers[name]
        lines.append(f"  buffer {name} {b.dtype.value}{list(b.shape)}")
    lines.extend(_format_node(n) for n in graph.nodes)
    for target, value in graph.mutations.items():
        lines.append(f"  mutate {target} := {value}")
    for seed in graph.random_seeds:
        lines.append(f"  random seed {seed} (drawn per call)")
    for name in graph.constants:
        lines.append(f"  constant {name} (bound by the runtime)")
    for name in graph.effects:
        lines.append(f"  effect {name} (computed for its check)")
    for pos, out in enumerate(graph.outputs):
        reshaped = f" viewed as {list(out.shape)}" if out.shape is not None else ""
        lines.append(f"  output {pos}: {out.buffer}{reshaped} ({out.role.value})")
    return "\n".join(lines)
