"""The standard ONNX ops one of our kernels computes: the body of its model-local function.

A kernel computes IR nodes (pointwise, reduction, GEMM) of one graph. Each node becomes ops over a
grid of its loop variables: a loop variable is a ``Range`` along its own axis, an IR op is the ONNX
body its op-table entry gives (``onnx`` of :data:`torch_adreno.ir.ops.OPS`), index arithmetic is
int64 arithmetic, a load is a ``Gather`` from the flat input at the flat index (clamped into the
buffer where the IR cannot bound it: an index only a ``where`` discards may point anywhere), a
reduction reduces the grid's reduction axes, a GEMM is a ``MatMul`` of its operand grids. Every
value that crosses a function boundary is a flat (1-D) tensor of its buffer's element type.

Invariant: the body computes, for every buffer the kernel writes, the values the kernel writes (in
exact arithmetic; float results may differ in rounding, as the order of a reduction differs); an
op it cannot express raises :class:`ExportError` naming the op and the kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from torch_adreno import ir
from torch_adreno.ir import DType
from torch_adreno.ir.ops import OPS, Arg, CastTo, IfFlag, Lit, OnnxBody, OnnxOp, Recipe, Target

ONNX_TYPE = {DType.F32: TensorProto.FLOAT, DType.I64: TensorProto.INT64, DType.I32: TensorProto.INT32,
             DType.BOOL: TensorProto.BOOL, DType.U8: TensorProto.UINT8, DType.INDEX: TensorProto.INT64}
NUMPY_TYPE = {DType.F32: np.float32, DType.I64: np.int64, DType.I32: np.int32, DType.BOOL: np.bool_,
              DType.U8: np.uint8, DType.INDEX: np.int64}


class ExportError(ValueError):
    """A step that cannot be written as ONNX; the message names what and where."""


@dataclass
class Body:
    """Nodes of one function body under construction, with fresh value names."""

    prefix: str
    nodes: list[NodeProto] = field(default_factory=list)
    _count: int = 0
    _constants: dict[tuple[Any, ...], str] = field(default_factory=dict)

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def op(self, op_type: str, inputs: Sequence[str], hint: str = "", **attrs: Any) -> str:
        out = self.fresh(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def constant(self, value: Any, dtype: DType) -> str:
        array: np.ndarray = np.asarray(value, dtype=NUMPY_TYPE[dtype])
        key = (dtype, array.shape, array.tobytes())
        if key not in self._constants:
            out = self.fresh("const")
            self.nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(array, out)))
            self._constants[key] = out
        return self._constants[key]

    def ints(self, values: Sequence[int]) -> str:
        return self.constant(np.asarray(list(values), dtype=np.int64), DType.INDEX)

    def cast(self, value: str, dtype: DType) -> str:
        return self.op("Cast", [value], "cast", to=ONNX_TYPE[dtype])


class Grid:
    """Expressions evaluated over loop variables laid along the axes of one grid."""

    def __init__(self, body: Body, axes: dict[str, int], rank: int, values: dict[str, str],
                 shapes: dict[str, ir.Buffer], kernel: str) -> None:
        self.body = body
        self.axes = axes
        self.rank = rank
        self.values = values
        self.shapes = shapes
        self.kernel = kernel
        self._memo: dict[ir.Expr, str] = {}

    def emit(self, expr: ir.Expr) -> str:
        cached = self._memo.get(expr)
        if cached is None:
            cached = self._memo[expr] = self._emit(expr)
        return cached

    def _var(self, var: ir.Var) -> str:
        axis = self.axes.get(var.name)
        if axis is None:
            raise ExportError(f"kernel {self.kernel}: loop variable {var.name} is not one of this node's")
        b = self.body
        line = b.op("Range", [b.constant(0, DType.INDEX), b.constant(var.size, DType.INDEX), b.constant(1, DType.INDEX)],
                    var.name)
        shape = [1] * self.rank
        shape[axis] = var.size
        return b.op("Reshape", [line, b.ints(shape)], var.name)

    def flat_index(self, buffer: ir.Buffer, index: Sequence[ir.Expr]) -> ir.Expr:
        flat: ir.Expr = ir.index(0)
        stride = 1
        for size, part in reversed(list(zip(buffer.shape, index, strict=True))):
            flat = ir.call("add", flat, ir.call("mul", part, ir.index(stride)))
            stride *= size
        return flat

    def _load(self, load: ir.Load) -> str:
        b = self.body
        buffer = self.shapes[load.buffer]
        source = self.values.get(load.buffer)
        if source is None:
            raise ExportError(f"kernel {self.kernel}: reads buffer {load.buffer}, which is neither an argument "
                              "of the kernel nor computed in it")
        flat = self.flat_index(buffer, load.index)
        index = self.emit(flat)
        bounds = ir.bounds(flat)
        if bounds is None or bounds[0] < 0 or bounds[1] >= max(buffer.numel, 1):
            index = b.op("Clip", [index, b.constant(0, DType.INDEX), b.constant(max(buffer.numel - 1, 0), DType.INDEX)],
                         "clamped")
        value = b.op("Gather", [source, index], load.buffer, axis=0)
        return value

    def _emit(self, expr: ir.Expr) -> str:
        b = self.body
        if isinstance(expr, ir.Var):
            return self._var(expr)
        if isinstance(expr, ir.Const):
            return b.constant(expr.value, expr.dtype)
        if isinstance(expr, ir.Load):
            return self._load(expr)
        assert isinstance(expr, ir.Call), expr
        return self._call(expr)

    def _call(self, expr: ir.Call) -> str:
        info = OPS.get(expr.op)
        if info is None or info.onnx is None:
            raise ExportError(f"kernel {self.kernel}: IR op {expr.op!r} has no translation to standard ONNX ops "
                              "(random numbers and atan2 are not exportable yet)")
        form = info.onnx.pick([a.dtype for a in expr.args], expr.dtype)
        return _Translation(self, expr, form).value()


class _Translation:
    """One op's ONNX body (its table entry's recipe) over the values of its arguments.

    Built in the order the body's values are needed: the arguments it reads (in argument order,
    each cast to its operand type), its constants, then its nodes, each after its inputs. A recipe
    that occurs more than once in the body is one value.
    """

    def __init__(self, grid: Grid, expr: ir.Call, form: OnnxBody) -> None:
        self.grid, self.body, self.expr, self.form = grid, grid.body, expr, form
        self._memo: dict[Recipe, str] = {}

    def value(self) -> str:
        root = self._resolve(self.form.value)
        parts = list(_parts(root))
        for position in sorted({p.position for p in parts if isinstance(p, Arg)}):
            self._memo[Arg(position)] = self._argument(position)
        for lit in parts:
            if isinstance(lit, Lit):
                self._build(lit, root)
        return self._build(root, root)

    def _resolve(self, recipe: Recipe) -> Recipe:
        """``recipe`` with every flag decided by this call's (constant) arguments."""
        if isinstance(recipe, IfFlag):
            flag = self.expr.args[recipe.position]
            clear = isinstance(flag, ir.Const) and not flag.value
            return self._resolve(recipe.when_clear if clear else recipe.when_set)
        if isinstance(recipe, OnnxOp):
            return dataclasses.replace(recipe, inputs=tuple(self._resolve(r) for r in recipe.inputs))
        if isinstance(recipe, CastTo):
            return CastTo(self._resolve(recipe.value), recipe.to)
        return recipe

    def _dtype(self, target: Target) -> DType | None:
        """The type ``target`` names for this call (None: an argument's own)."""
        if target is None or isinstance(target, DType):
            return target
        args = self.expr.args
        if target == "common":
            return DType.F32 if any(a.dtype.is_float for a in args) else DType.I64
        return args[1].dtype if target == "arg1" else self.expr.dtype

    def _argument(self, position: int) -> str:
        arg = self.expr.args[position]
        value = self.grid.emit(arg)
        target = self._dtype(self.form.operand(position))
        if target is not None and ONNX_TYPE[arg.dtype] != ONNX_TYPE[target]:
            value = self.body.cast(value, target)
        return value

    def _build(self, recipe: Recipe, root: Recipe) -> str:
        cached = self._memo.get(recipe)
        if cached is not None:
            return cached
        b = self.body
        if isinstance(recipe, Lit):
            value = b.constant(recipe.value, recipe.dtype or self.expr.dtype)
        elif isinstance(recipe, OnnxOp):
            inputs = [self._build(r, root) for r in recipe.inputs]
            hint = recipe.hint if recipe.hint is not None else self.expr.op if recipe is root else ""
            value = b.op(recipe.op_type, inputs, hint, **dict(recipe.attrs))
        elif isinstance(recipe, CastTo):
            target = self._dtype(recipe.to)
            assert target is not None, recipe
            value = b.cast(self._build(recipe.value, root), target)
        else:  # an argument is built first; a flag is resolved
            raise AssertionError(recipe)
        self._memo[recipe] = value
        return value


def _parts(recipe: Recipe) -> Iterator[Recipe]:
    """``recipe`` and everything in it, depth first, inputs left to right."""
    yield recipe
    if isinstance(recipe, OnnxOp):
        for r in recipe.inputs:
            yield from _parts(r)
    elif isinstance(recipe, CastTo):
        yield from _parts(recipe.value)


def full(body: Body, value: str, shape: Sequence[int]) -> str:
    """``value`` broadcast to ``shape``."""
    return body.op("Expand", [value, body.ints(shape)], "full")


def flat(body: Body, value: str) -> str:
    return body.op("Reshape", [value, body.ints([-1])], "flat")


@dataclass(frozen=True)
class SplitK:
    """A split-K GEMM's two launches: the first writes ``partials`` (slice sums), the second adds
    them up through the epilogue (see :mod:`torch_adreno.kernels.gemm`)."""

    gemm: ir.Gemm
    partials: str
    split: int
    slice_k: int
    row_sums: bool


def _output_of(body: Body, buffer: ir.Buffer, value: str, value_dtype: DType) -> str:
    if ONNX_TYPE[value_dtype] != ONNX_TYPE[buffer.dtype]:
        value = body.cast(value, buffer.dtype)
    return flat(body, value)


def translate_node(body: Body, node: ir.Node, values: dict[str, str], shapes: dict[str, ir.Buffer], kernel: str,
                   split: SplitK | None = None) -> str:
    """The flat value of ``node``'s output; ``values`` holds the flat value of every buffer it may read."""
    if isinstance(node, ir.HostOp):
        raise ExportError(f"kernel {kernel}: {node.target} runs on the host (fallback='host'); not exportable")
    assert not isinstance(node, ir.TemplateOp), "a template's outputs come from export.attention_bodies"
    out = shapes[node.output]
    if isinstance(node, ir.Pointwise):
        grid = Grid(body, {n: a for a, n in enumerate(_var_names(node.ranges, "i"))}, len(node.ranges), values, shapes,
                    kernel)
        value = full(body, grid.emit(node.body), node.ranges)
        return _output_of(body, out, value, node.body.dtype)
    if isinstance(node, ir.Reduction):
        outer, inner = len(node.ranges), len(node.reduction_ranges)
        axes = {n: a for a, n in enumerate(_var_names(node.ranges, "i"))}
        axes.update({n: outer + a for a, n in enumerate(_var_names(node.reduction_ranges, "r"))})
        grid = Grid(body, axes, outer + inner, values, shapes, kernel)
        value = full(body, grid.emit(node.body), (*node.ranges, *node.reduction_ranges))
        reduced = _reduce(body, node, value, outer, inner, kernel)
        dtype = DType.I64 if node.reduce_op in ("argmax", "argmin") else node.body.dtype
        return _output_of(body, out, reduced, dtype)
    assert isinstance(node, ir.Gemm)
    g = node
    if split is not None:  # the second launch of a split-K GEMM: the slice sums, added up
        sums = body.op("Slice", [values[split.partials], body.ints([0]), body.ints([split.split * g.batch * g.m * g.n])],
                       "slices")
        shaped = body.op("Reshape", [sums, body.ints([g.batch, split.split, g.m, g.n])])
        product = body.op("ReduceSum", [shaped, body.ints([1])], "gemm", keepdims=0)
    else:
        product = body.op("MatMul", [gemm_operand(body, g, "lhs", values, shapes, kernel),
                                     gemm_operand(body, g, "rhs", values, shapes, kernel)], "gemm")
    grid = Grid(body, {"b": 0, "m": 1, "n": 2}, 3, values, shapes, kernel)
    target = grid.flat_index(out, g.out_index)
    expected = {v: s for v, s in ((g.vars()["b"], g.m * g.n), (g.vars()["m"], g.n), (g.vars()["n"], 1))
                if isinstance(v, ir.Var)}
    constant, terms = ir.linear_terms(target)
    if constant == 0 and terms == expected and out.numel == g.batch * g.m * g.n:
        return _output_of(body, out, product, DType.F32)
    # Another layout (a transposed store): scatter every product element to its place.
    positions = flat(body, full(body, grid.emit(target), (g.batch, g.m, g.n)))
    zeros = body.constant(np.zeros(out.numel, dtype=np.float32), DType.F32)
    placed = body.op("ScatterElements", [zeros, positions, flat(body, product)], "placed", axis=0)
    return _output_of(body, out, placed, DType.F32)


def gemm_operand(body: Body, g: ir.Gemm, which: str, values: dict[str, str], shapes: dict[str, ir.Buffer],
                 kernel: str) -> str:
    """The operand as a [batch, m, k] (lhs) or [batch, k, n] (rhs) tensor."""
    if which == "lhs":
        grid = Grid(body, {"b": 0, "m": 1, "k": 2}, 3, values, shapes, kernel)
        return full(body, grid.emit(g.lhs), (g.batch, g.m, g.k))
    grid = Grid(body, {"b": 0, "k": 1, "n": 2}, 3, values, shapes, kernel)
    return full(body, grid.emit(g.rhs), (g.batch, g.k, g.n))


def split_slices(body: Body, split: SplitK, values: dict[str, str], shapes: dict[str, ir.Buffer], kernel: str) -> str:
    """The first launch of a split-K GEMM: the product of every k slice ([b][slice][m][n]), then,
    when the kernel sums the left operand's rows too, those per slice ([b][slice][m])."""
    g, s, length = split.gemm, split.split, split.slice_k
    pad = s * length - g.k
    lhs = gemm_operand(body, g, "lhs", values, shapes, kernel)
    rhs = gemm_operand(body, g, "rhs", values, shapes, kernel)
    if pad:
        lhs = body.op("Pad", [lhs, body.ints([0, 0, 0, 0, 0, pad])], "padded")
        rhs = body.op("Pad", [rhs, body.ints([0, 0, 0, 0, pad, 0])], "padded")
    lhs = body.op("Transpose", [body.op("Reshape", [lhs, body.ints([g.batch, g.m, s, length])])], "lhs", perm=[0, 2, 1, 3])
    rhs = body.op("Reshape", [rhs, body.ints([g.batch, s, length, g.n])], "rhs")
    parts = [flat(body, body.op("MatMul", [lhs, rhs], "slices"))]
    if split.row_sums:
        parts.append(flat(body, body.op("ReduceSum", [lhs, body.ints([3])], "row_slices", keepdims=0)))
    return parts[0] if len(parts) == 1 else body.op("Concat", parts, "partials", axis=0)


def _var_names(ranges: tuple[int, ...], prefix: str) -> list[str]:
    return [f"{prefix}{d}" for d in range(len(ranges))]


def _reduce(body: Body, node: ir.Reduction, value: str, outer: int, inner: int, kernel: str) -> str:
    axes = body.ints(list(range(outer, outer + inner)))
    op = node.reduce_op
    if op in ("sum", "prod", "max", "min"):
        onnx_op = {"sum": "ReduceSum", "prod": "ReduceProd", "max": "ReduceMax", "min": "ReduceMin"}[op]
        if ONNX_TYPE[node.body.dtype] == TensorProto.BOOL:
            value = body.cast(value, DType.I64)
        return body.op(onnx_op, [value, axes], op, keepdims=0)
    if op in ("any", "all"):
        ints = body.cast(value, DType.I32) if ONNX_TYPE[node.body.dtype] == TensorProto.BOOL else \
            body.cast(body.cast(value, DType.BOOL), DType.I32)
        reduced = body.op("ReduceMax" if op == "any" else "ReduceMin", [ints, axes], op, keepdims=0)
        return body.cast(reduced, DType.BOOL)
    # argmax/argmin: the row-major linear index over the reduction ranges, the first on ties.
    rows = body.op("Reshape", [value, body.ints([*node.ranges, math.prod(node.reduction_ranges)])])
    return body.op("ArgMax" if op == "argmax" else "ArgMin", [rows], op, axis=-1, keepdims=0, select_last_index=0)
