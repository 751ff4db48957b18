"""The lowering registry and the context that builds an :class:`ir.Graph` node by node.

Lowerings are registered per ATen overload. Each receives the context, the FX node and the node's
arguments with every tensor replaced by an :class:`ir.View`; it returns a View (or a tuple of
them for multi-output ops). Lowerings emit one IR node per ATen op where they can, so that the
fusion stage, not lowering, decides what shares a kernel.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.errors import LoweringError, UnsupportedOpError
from torch_adreno.ir.torch_dtypes import TORCH_TO_IR

#: A lowered value: a tensor view, a tuple of values, or a plain Python value (int, float, None).
Value = ir.View | tuple[Any, ...] | int | float | bool | None
Lowering = Callable[..., Value]

LOWERINGS: dict[Any, Lowering] = {}
#: Lowerings of ops other libraries define (``torch.library`` custom ops), by the overload's name
#: (``transformers.grouped_mm_fallback.default``): the op exists only once its library is imported,
#: which the backend does not do itself.
LOWERINGS_BY_NAME: dict[str, Lowering] = {}

_TORCH_TO_IR = TORCH_TO_IR


def register(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register a lowering for one or more ATen overloads."""

    def wrap(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {op}")
            LOWERINGS[op] = fn
        return fn

    return wrap


def register_by_name(*names: str) -> Callable[[Lowering], Lowering]:
    """Register a lowering for custom ops of other libraries, by overload name (see
    :data:`LOWERINGS_BY_NAME`)."""

    def wrap(fn: Lowering) -> Lowering:
        for name in names:
            if name in LOWERINGS_BY_NAME:
                raise RuntimeError(f"two lowerings registered for {name}")
            LOWERINGS_BY_NAME[name] = fn
        return fn

    return wrap


def lowering_for(target: Any) -> Lowering | None:
    """The lowering of an FX node's target, or None."""
    found = LOWERINGS.get(target)
    if found is None and isinstance(target, torch._ops.OpOverload):
        found = LOWERINGS_BY_NAME.get(str(target))
    return found


def supported_ops() -> list[str]:
    return sorted([str(op) for op in LOWERINGS] + list(LOWERINGS_BY_NAME))


def ir_dtype(dtype: torch.dtype, what: str = "tensor", numel: int | None = None) -> ir.DType:
    """The IR type of a tensor of ``dtype`` (``numel`` elements, where known).

    A float64 scalar (``numel`` at most 1) is computed in float32: it is a Python float that
    Dynamo passes as a 0-dim float64 tensor (a value read by ``.item()`` between two graphs, a
    number that changes between calls), and OpenCL GPUs such as Adreno have no double precision.
    A larger float64 tensor is refused: its precision would be lost silently."""
    if representable(dtype, numel):
        return ir.DType.F32 if dtype == torch.float64 else _TORCH_TO_IR[dtype]
    advice = ("pass complex values as real tensors: torch.view_as_real(x) holds the real and imaginary "
              "parts in a last dimension of 2" if dtype.is_complex else
              "cast the model and its inputs to one of these (model.float(), x.float())")
    raise LoweringError(f"{what} has dtype {dtype}, which the adreno backend does not support "
                        f"(it supports {supported_dtype_names()}); {advice}")


def representable(dtype: torch.dtype, numel: int | None = None) -> bool:
    """Whether the backend computes in ``dtype`` (a float64 scalar in float32: see :func:`ir_dtype`)."""
    return dtype in _TORCH_TO_IR or (dtype == torch.float64 and numel is not None and numel <= 1)


def supported_dtype_names() -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in _TORCH_TO_IR)


def user_source(node: Node) -> str | None:
    """The innermost user frame of an FX node's stack trace: 'file:line: code'."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("File "):
            parts = line.split(",")
            file = parts[0].removeprefix("File ").strip().strip('"')
            lineno = parts[1].strip().removeprefix("line ").strip() if len(parts) > 1 else "?"
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{file}:{lineno}: {code}"
    return None


def module_path(node: Node) -> str | None:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    # Dynamo names the root module after the compiled function's argument: L['self'], L['model'].
    return re.sub(r"^L\['[^']*'\]\.?", "", path) or None


def origin_of(node: Node) -> ir.Origin:
    return ir.Origin(node.name, str(node.target), module_path(node), user_source(node))


@dataclass
class TensorMeta:
    shape: tuple[int, ...]
    dtype: ir.DType
    torch_dtype: torch.dtype


class LoweringContext:
    """Builds one :class:`ir.Graph`; tracks the FX node being lowered for node origins."""

    def __init__(self, graph_name: str, config: Config) -> None:
        self.graph = ir.Graph(graph_name)
        self.config = config
        self._counter = 0
        self._random_streams = 0
        self.node: Node | None = None

    # -- naming and metadata -------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    @property
    def origins(self) -> tuple[ir.Origin, ...]:
        return (origin_of(self.node),) if self.node is not None else ()

    def meta(self, node: Any = None, index: int | None = None) -> TensorMeta:
        """Shape and dtype of an FX node's (or the current node's) tensor result."""
        node = self.node if node is None else node
        val = node.meta.get("val") if isinstance(node, Node) else None
        if index is not None and isinstance(val, (tuple, list)):
            val = val[index]
        if not isinstance(val, torch.Tensor):
            raise LoweringError(f"FX node {getattr(node, 'name', node)} carries no tensor metadata")
        return TensorMeta(
            tuple(int(s) for s in val.shape), ir_dtype(val.dtype, f"FX node {node.name}", val.numel()), val.dtype
        )

    # -- buffers and nodes ---------------------------------------------------------------------

    def new_buffer(self, shape: Sequence[int], dtype: ir.DType, prefix: str = "buf") -> ir.Buffer:
        buf = ir.Buffer(self.fresh(prefix), tuple(int(s) for s in shape), dtype)
        self.graph.buffers[buf.name] = buf
        return buf

    def add_input(self, shape: Sequence[int], dtype: ir.DType, name: str) -> ir.View:
        buf = ir.Buffer(name, tuple(shape), dtype)
        if name in self.graph.buffers:
            raise LoweringError(f"duplicate graph input name {name}")
        self.graph.buffers[name] = buf
        self.graph.inputs.append(name)
        return ir.View.of(buf)

    def add_constant(self, value: torch.Tensor, name: str) -> ir.View:
        """A tensor constant of the graph as an input buffer the runtime binds itself (see
        :attr:`ir.Graph.constants`); ``value`` is a real (not fake) CPU tensor, copied here."""
        if name in self.graph.buffers:
            raise LoweringError(f"duplicate graph buffer name {name}")
        buf = ir.Buffer(name, tuple(int(s) for s in value.shape), ir_dtype(value.dtype, f"tensor constant {name}"))
        self.graph.buffers[name] = buf
        # Before the seed, which stays the last input (see Graph.random_seeds).
        self.graph.inputs.insert(len(self.graph.inputs) - len(self.graph.random_seeds), name)
        self.graph.constants[name] = value.detach().to("cpu", copy=True).contiguous()
        return ir.View.of(buf)

    def random_stream(self) -> tuple[ir.View, int]:
        """The graph's seed (a 0-dim int64 input the runtime draws for every call, see
        Graph.random_seeds) and a stream number of its own for the calling random op.

        One seed per graph, not per op: each call uploads one value, and ops differ by stream.
        """
        if not self.graph.random_seeds:
            self.graph.random_seeds.append(self.add_input((), ir.DType.I64, self.fresh("seed")).buffer)
        seed = self.graph.random_seeds[0]
        self._random_streams += 1
        return ir.View.of(self.graph.buffers[seed]), self._random_streams - 1

    def pointwise(
        self, shape: Sequence[int], dtype: ir.DType, body: Callable[[tuple[ir.Expr, ...]], ir.Expr]
    ) -> ir.View:
        """Emit ``out[i] = body(i)`` over ``shape``; ``body`` gets the loop variables."""
        out = self.new_buffer(shape, dtype)
        node = ir.Pointwise(self.fresh("pw"), out.name, out.shape, ir.const(0, dtype), self.origins)
        node.body = ir.cast(body(node.loop_vars), dtype)
        self.graph.nodes.append(node)
        return ir.View.of(out)

    def reduction(
        self,
        shape: Sequence[int],
        reduction_shape: Sequence[int],
        reduce_op: str,
        dtype: ir.DType,
        body: Callable[[tuple[ir.Expr, ...], tuple[ir.Expr, ...]], ir.Expr],
    ) -> ir.View:
        """Emit ``out[i] = reduce_op over r of body(i, r)``."""
        out = self.new_buffer(shape, dtype)
        node = ir.Reduction(
            self.fresh("red"), out.name, out.shape, tuple(int(s) for s in reduction_shape), reduce_op,
            ir.const(0, dtype), self.origins,
        )
        value = body(node.loop_vars, node.reduction_vars)
        # A 16-bit result accumulates in float32 and is rounded once, when stored (as eager does).
        node.body = value if reduce_op in ("argmax", "argmin") else ir.cast(value, dtype.compute)
        self.graph.nodes.append(node)
        return ir.View.of(out)

    def gemm(
        self,
        out_shape: Sequence[int],
        dtype: ir.DType,
        batch: int,
        m: int,
        n: int,
        k: int,
        lhs: Callable[[ir.Expr, ir.Expr, ir.Expr], ir.Expr],
        rhs: Callable[[ir.Expr, ir.Expr, ir.Expr], ir.Expr],
        out_index: Callable[[ir.Expr, ir.Expr, ir.Expr], Sequence[ir.Expr]],
    ) -> ir.View:
        """Emit a GEMM; ``lhs(b, m, k)``, ``rhs(b, k, n)`` and ``out_index(b, m, n)`` build its parts."""
        if not dtype.is_float:
            # The GEMM templates (matrix products, convolutions) accumulate in float32: integer
            # results past 2**24 would come out rounded where eager's integer kernels are exact.
            raise UnsupportedOpError(
                f"its {dtype.name} form is not supported (the matrix-product and convolution templates "
                "compute in float32, which is not exact for integers); cast the operands to float32")
        out = self.new_buffer(out_shape, dtype)
        if math.prod(out_shape) != batch * m * n:
            raise LoweringError(f"gemm output {tuple(out_shape)} does not hold {batch}x{m}x{n} elements")
        node = ir.Gemm(self.fresh("gemm"), out.name, batch, m, n, k, ir.const(0, dtype), ir.const(0, dtype),
                       (), self.origins)
        v = node.vars()
        node.lhs = ir.cast(lhs(v["b"], v["m"], v["k"]), dtype)
        node.rhs = ir.cast(rhs(v["b"], v["k"], v["n"]), dtype)
        node.out_index = tuple(out_index(v["b"], v["m"], v["n"]))
        self.graph.nodes.append(node)
        return ir.View.of(out)

    # -- helpers for lowerings -----------------------------------------------------------------

    def load(self, value: Any, idx: Sequence[ir.Expr], shape: Sequence[int], dtype: ir.DType) -> ir.Expr:
        """``value`` broadcast to ``shape`` and read at ``idx`` as ``dtype`` (scalars become constants).

        A 16-bit ``dtype`` is read as float32 (its compute type): a lowering's arithmetic runs in
        float32 and its node rounds once, to its output's type, as eager's 16-bit kernels do.
        """
        dtype = dtype.compute
        if isinstance(value, ir.View):
            return ir.cast(value.expand(shape).load(idx), dtype)
        if isinstance(value, (bool, int, float)):
            return ir.const(value, dtype)
        raise LoweringError(f"expected a tensor or a number, got {type(value).__name__}")

    def materialize(self, view: ir.View) -> ir.View:
        """A contiguous copy of a view (an identity view is returned as it is)."""
        if view.is_identity():
            return view
        return self.pointwise(view.shape, view.dtype, lambda idx: view.load(idx))
