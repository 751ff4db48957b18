"""View ops (index maps, no IR node, no copy) and data-dependent indexing (gather, scatter)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError, UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.index_checks import (
    OUT_OF_RANGE_IN_SELF,
    as_index,
    index_rule,
    load_checked,
    load_scalar_checked,
)

aten = torch.ops.aten


def tensor_arg(x: Value, what: str) -> ir.View:
    if not isinstance(x, ir.View):
        raise LoweringError(f"{what}: expected a tensor argument, got {type(x).__name__}")
    return x


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _reshape(ctx: LoweringContext, node: Node, x: Value, shape: Sequence[int]) -> Value:
    return tensor_arg(x, node.name).reshape(ctx.meta().shape)


@register(aten.permute.default)
def _permute(ctx: LoweringContext, node: Node, x: Value, dims: Sequence[int]) -> Value:
    return tensor_arg(x, node.name).permute(dims)


@register(aten.t.default)
def _t(ctx: LoweringContext, node: Node, x: Value) -> Value:
    v = tensor_arg(x, node.name)
    return v if len(v.shape) < 2 else v.permute([1, 0])


@register(aten.transpose.int)
def _transpose(ctx: LoweringContext, node: Node, x: Value, d0: int, d1: int) -> Value:
    v = tensor_arg(x, node.name)
    rank = len(v.shape)
    if rank == 0:
        return v
    dims = list(range(rank))
    dims[d0 % rank], dims[d1 % rank] = dims[d1 % rank], dims[d0 % rank]
    return v.permute(dims)


@register(aten.expand.default)
def _expand(ctx: LoweringContext, node: Node, x: Value, shape: Sequence[int], *, implicit: bool = False) -> Value:
    return tensor_arg(x, node.name).expand(ctx.meta().shape)


@register(aten.unsqueeze.default)
def _unsqueeze(ctx: LoweringContext, node: Node, x: Value, dim: int) -> Value:
    return tensor_arg(x, node.name).unsqueeze(dim)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(ctx: LoweringContext, node: Node, x: Value, dims: Any = None) -> Value:
    v = tensor_arg(x, node.name)
    if not v.shape:
        return v
    if isinstance(dims, int):
        dims = [dims]
    return v.squeeze(dims)


@register(aten.slice.Tensor)
def _slice(ctx: LoweringContext, node: Node, x: Value, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> Value:
    v = tensor_arg(x, node.name)
    size = v.shape[dim]
    return v.slice(dim, 0 if start is None else start, size if end is None else min(end, size), step)


@register(aten.select.int)
def _select(ctx: LoweringContext, node: Node, x: Value, dim: int, i: int) -> Value:
    return tensor_arg(x, node.name).select(dim, i)


@register(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def _alias(ctx: LoweringContext, node: Node, x: Value) -> Value:
    return tensor_arg(x, node.name)


@register(aten.as_strided.default)
def _as_strided(ctx: LoweringContext, node: Node, x: Value, size: Sequence[int], stride: Sequence[int],
                offset: int | None = None) -> Value:
    # as_strided addresses the storage of its input; our buffers are contiguous, so it is only an
    # index map when the input is the whole, unviewed buffer.
    v = tensor_arg(x, node.name)
    if not v.is_identity():
        raise LoweringError(f"{node.name}: as_strided of a view is not supported; materialise the tensor first")
    flat_view = v.reshape([v.numel])
    shape = ctx.meta().shape
    placeholders = ir.placeholder_vars(shape)
    flat: ir.Expr = ir.index(offset or 0)
    for var, st in zip(placeholders, stride, strict=True):
        flat = ir.call("add", flat, ir.call("mul", var, ir.index(st)))
    return ir.View(flat_view.buffer, flat_view.buffer_shape, flat_view.dtype, tuple(shape), flat_view.at([flat]))


@register(aten.gather.default)
def _gather(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value, *, sparse_grad: bool = False) -> Value:
    src, index_view = tensor_arg(x, node.name), tensor_arg(idx, node.name)
    out = ctx.meta()
    dim %= max(len(src.shape), 1)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        if not src.shape:  # a 0-dim input is gathered as a 1-element one: every index must be 0
            return load_scalar_checked(src, as_index(ctx, index_view.load(i), 1, 0, wraps=False, error="RuntimeError"))
        pos = list(i)
        pos[dim] = as_index(ctx, index_view.load(i), src.shape[dim], dim, wraps=False, error="RuntimeError")
        return load_checked(src, pos)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.index_select.default)
def _index_select(ctx: LoweringContext, node: Node, x: Value, dim: int, idx: Value) -> Value:
    src, index_view = tensor_arg(x, node.name), tensor_arg(idx, node.name)
    out = ctx.meta()
    dim %= max(len(src.shape), 1)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        # (A 0-dim input gives a 0-dim result from its one index element.)
        sel = index_view.load(([i[dim]] if i else [ir.index(0)]) if index_view.shape else [])
        if not src.shape:  # a 0-dim input is selected from as a 1-element one: every index must be 0
            return load_scalar_checked(src, as_index(ctx, sel, 1, 0, wraps=False, error="IndexError",
                                                       eager_message=OUT_OF_RANGE_IN_SELF))
        pos = list(i)
        # (Eager's CPU kernel has a path of its own for dim 1, with another error type.)
        error, message = (("RuntimeError", "INDICES element is out of DATA bounds") if dim == 1
                          else ("IndexError", OUT_OF_RANGE_IN_SELF))
        pos[dim] = as_index(ctx, sel, src.shape[dim], dim, wraps=False, error=error, eager_message=message)
        return load_checked(src, pos)

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.embedding.default)
def _embedding(ctx: LoweringContext, node: Node, weight: Value, indices: Value, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    table, ids = tensor_arg(weight, node.name), tensor_arg(indices, node.name)
    out = ctx.meta()
    rows = table.shape[0]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        # (An empty table is refused by eager's shape check, a RuntimeError, whatever the index.)
        error, message = (("IndexError", OUT_OF_RANGE_IN_SELF) if rows else
                          ("RuntimeError", "index_select(): self indexing axis dim should be positive"))
        row = as_index(ctx, ids.load(i[:-1]), rows, 0, wraps=False, error=error, eager_message=message)
        return load_checked(table, [row, i[-1]])

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.split_with_sizes.default)
def _split_with_sizes(ctx: LoweringContext, node: Node, x: Value, sizes: Sequence[int], dim: int = 0) -> Value:
    v = tensor_arg(x, node.name)
    start, parts = 0, []
    for size in sizes:
        parts.append(v.slice(dim, start, start + size))
        start += size
    return tuple(parts)


@register(aten.split.Tensor)
def _split(ctx: LoweringContext, node: Node, x: Value, size: int, dim: int = 0) -> Value:
    v = tensor_arg(x, node.name)
    length = v.shape[dim % len(v.shape)]
    return tuple(v.slice(dim, start, min(start + size, length)) for start in range(0, length, size))


@register(aten.unbind.int)
def _unbind(ctx: LoweringContext, node: Node, x: Value, dim: int = 0) -> Value:
    v = tensor_arg(x, node.name)
    return tuple(v.select(dim, i) for i in range(v.shape[dim % len(v.shape)]))


@register(aten.cat.default)
def _cat(ctx: LoweringContext, node: Node, tensors: Sequence[Value], dim: int = 0) -> Value:
    """Concatenation as one pointwise node: each element reads the input whose range holds it."""
    out = ctx.meta()
    dim %= len(out.shape)
    # (An all-empty cat never gets here: empty results are made before any lowering runs.)
    parts = [tensor_arg(t, node.name) for t in tensors if isinstance(t, ir.View) and t.numel > 0]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        value: ir.Expr | None = None
        offset = sum(p.shape[dim] for p in parts)
        for part in reversed(parts):
            offset -= part.shape[dim]
            pos = list(i)
            pos[dim] = ir.call("sub", i[dim], ir.index(offset))
            read = ir.cast(part.load(pos), out.dtype)
            value = read if value is None else ir.where(ir.call("lt", i[dim], ir.index(offset + part.shape[dim])),
                                                         read, value)
        assert value is not None
        return value

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.stack.default)
def _stack(ctx: LoweringContext, node: Node, tensors: Sequence[Value], dim: int = 0) -> Value:
    out = ctx.meta()
    dim %= len(out.shape)
    parts = [tensor_arg(t, node.name) for t in tensors]

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        rest = list(i[:dim]) + list(i[dim + 1:])
        value: ir.Expr = ir.cast(parts[-1].load(rest), out.dtype)
        for k in range(len(parts) - 2, -1, -1):
            value = ir.where(ir.call("eq", i[dim], ir.index(k)), ir.cast(parts[k].load(rest), out.dtype), value)
        return value

    return ctx.pointwise(out.shape, out.dtype, body)


def _broadcast_shape(shapes: Sequence[Sequence[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for shape in shapes:
        for d, size in enumerate(shape):
            pos = rank - len(shape) + d
            if size != 1:
                out[pos] = size
    return out


class _Advanced:
    """Positions of an advanced index (``x[i, :, j]``): which dims are indexed, the broadcast shape
    ``B`` of the index tensors, and how result dims map to (B, remaining dims)."""

    def __init__(self, node: Node, x: ir.View, indices: Sequence[Value]) -> None:
        if any(isinstance(ix, ir.View) and ix.dtype is ir.DType.BOOL for ix in indices):
            raise UnsupportedOpError(f"{node.name}: boolean-mask indexing has a data-dependent shape")
        self.x = x
        self.tensors = {d: ix for d, ix in enumerate(indices) if ix is not None}
        if not self.tensors or not all(isinstance(ix, ir.View) for ix in self.tensors.values()):
            raise UnsupportedOpError(f"{node.name}: indexing needs at least one index tensor")
        self.positions = sorted(self.tensors)
        self.batch = _broadcast_shape([ix.shape for ix in self.tensors.values()])  # type: ignore[union-attr]
        self.rest = [d for d in range(len(x.shape)) if d not in self.tensors]
        self.adjacent = self.positions == list(range(self.positions[0], self.positions[-1] + 1))
        self.wraps, self.error = index_rule(node)

    def result_shape(self) -> list[int]:
        if self.adjacent:
            first = self.positions[0]
            return ([self.x.shape[d] for d in self.rest if d < first] + self.batch
                    + [self.x.shape[d] for d in self.rest if d > first])
        return self.batch + [self.x.shape[d] for d in self.rest]

    def split(self, i: Sequence[ir.Expr]) -> tuple[list[ir.Expr], dict[int, ir.Expr]]:
        """Result index -> (batch index, {remaining dim: its index})."""
        nb = len(self.batch)
        if self.adjacent:
            first = self.positions[0]
            before = [d for d in self.rest if d < first]
            after = [d for d in self.rest if d > first]
            rest = dict(zip(before, i[:len(before)], strict=True))
            rest.update(zip(after, i[len(before) + nb:], strict=True))
            return list(i[len(before):len(before) + nb]), rest
        return list(i[:nb]), dict(zip(self.rest, i[nb:], strict=True))

    def join(self, b: Sequence[ir.Expr], rest: dict[int, ir.Expr]) -> list[ir.Expr]:
        """(batch index, remaining dims) -> result index."""
        if self.adjacent:
            first = self.positions[0]
            return ([rest[d] for d in self.rest if d < first] + list(b) + [rest[d] for d in self.rest if d > first])
        return list(b) + [rest[d] for d in self.rest]

    def target(self, ctx: LoweringContext, d: int, b: Sequence[ir.Expr]) -> ir.Expr:
        """Where along dim ``d`` batch index ``b`` points (negative values count from the end)."""
        ix = self.tensors[d]
        assert isinstance(ix, ir.View)
        return as_index(ctx, ix.expand(self.batch).load(b), self.x.shape[d], d, wraps=self.wraps, error=self.error)

    def source(self, ctx: LoweringContext, b: Sequence[ir.Expr], rest: dict[int, ir.Expr]) -> list[ir.Expr]:
        """The element of ``x`` that batch index ``b`` and remaining dims ``rest`` select."""
        pos = []
        for d in range(len(self.x.shape)):
            if d in self.tensors:
                pos.append(self.target(ctx, d, b))
            else:
                pos.append(rest[d])
        return pos


@register(aten.index.Tensor)
def _index(ctx: LoweringContext, node: Node, x: Value, indices: Sequence[Value]) -> Value:
    """Advanced indexing ``x[idx0, :, idx1]``: a gather through the index tensors."""
    src = tensor_arg(x, node.name)
    adv = _Advanced(node, src, indices)
    out = ctx.meta()
    if list(out.shape) != adv.result_shape():
        raise UnsupportedOpError(f"{node.name}: indexing of shape {list(out.shape)} is not lowered")

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        b, rest = adv.split(i)
        return load_checked(src, adv.source(ctx, b, rest))

    return ctx.pointwise(out.shape, out.dtype, body)


@register(aten.index_put.default)
def _index_put(ctx: LoweringContext, node: Node, x: Value, indices: Sequence[Value], values: Value,
               accumulate: bool = False) -> Value:
    """``x[indices] = values`` (or ``+=``): each output element gathers the values aimed at it, a
    sum over the index positions (without accumulate the last one wins, like PyTorch's sequential
    CPU order). One index on the leading dimension with accumulate (embedding gradients) is a GEMM
    with a one-hot left operand instead, so the matching runs at GEMM speed."""
    base = tensor_arg(x, node.name)
    out = ctx.meta()
    masks = [ix for ix in indices if isinstance(ix, ir.View) and ix.dtype is ir.DType.BOOL]
    if len(masks) == 1 and len(indices) == 1 and isinstance(values, ir.View) and values.numel == 1:
        # x[mask] = v with one value: masked_fill, no data-dependent shape.
        mask = masks[0]

        def fill(i: tuple[ir.Expr, ...]) -> ir.Expr:
            m = mask.expand(out.shape).load(i) if len(mask.shape) == len(out.shape) else \
                mask.load(i[:len(mask.shape)])
            v = ir.cast(values.reshape([]).load([]), out.dtype)
            old = base.load(i)
            return ir.where(ir.call("ne", m, ir.const(0, ir.DType.BOOL)), ir.call("add", old, v) if accumulate else v, old)

        return ctx.pointwise(out.shape, out.dtype, fill)
    adv = _Advanced(node, base, indices)
    src = tensor_arg(values, node.name).expand(adv.result_shape())
    batch = math.prod(adv.batch)
    if accumulate and out.dtype.is_float and adv.positions == [0] and len(adv.batch) >= 1:
        ids = adv.tensors[0]
        assert isinstance(ids, ir.View)
        flat_ids = ids.expand(adv.batch).reshape([batch])
        flat_src = src.reshape([batch, *out.shape[1:]])
        rows, tail = out.shape[0], list(out.shape[1:])
        cols = math.prod(tail)

        def onehot(b: ir.Expr, m: ir.Expr, k: ir.Expr) -> ir.Expr:
            # (An inf among the values would meet the zeros of the one-hot and give NaN.)
            row = as_index(ctx, flat_ids.load([k]), rows, 0, wraps=adv.wraps, error=adv.error)
            return ir.where(ir.call("eq", row, m), ir.const(1.0, out.dtype),
                            ir.const(0.0, out.dtype))

        def value(b: ir.Expr, k: ir.Expr, n: ir.Expr) -> ir.Expr:
            return ir.cast(flat_src.load([k, *_unravel(n, tail)]), out.dtype)

        added = ctx.gemm(out.shape, out.dtype, 1, rows, cols, batch, onehot, value,
                         lambda b, m, n: [m, *_unravel(n, tail)])
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.call("add", base.load(i), added.load(i)))

    def hit(i: tuple[ir.Expr, ...], j: ir.Expr) -> tuple[ir.Expr, list[ir.Expr]]:
        b = _unravel(j, adv.batch)
        rest = {d: i[d] for d in adv.rest}
        cond: ir.Expr = ir.const(True, ir.DType.BOOL)
        for d in adv.positions:
            match = ir.call("eq", adv.target(ctx, d, b), i[d])
            cond = match if isinstance(cond, ir.Const) else ir.call("logical_and", cond, match)
        return cond, adv.join(b, rest)

    if accumulate:
        def contributions(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
            cond, pos = hit(i, r[0])
            return ir.where(cond, ir.cast(src.load(pos), out.dtype), ir.const(0, out.dtype))

        added = ctx.reduction(out.shape, (batch,), "sum", out.dtype, contributions)
        return ctx.pointwise(out.shape, out.dtype, lambda i: ir.call("add", base.load(i), added.load(i)))

    def last(i: tuple[ir.Expr, ...], r: tuple[ir.Expr, ...]) -> ir.Expr:
        cond, _ = hit(i, r[0])
        return ir.where(cond, ir.cast(r[0], ir.DType.I64), ir.const(-1, ir.DType.I64))

    winner = ctx.reduction(out.shape, (batch,), "max", ir.DType.I64, last)

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        j = winner.load(i)
        _, pos = hit(i, ir.cast(j, ir.DType.INDEX))
        return ir.where(ir.call("ge", j, ir.const(0, ir.DType.I64)), ir.cast(src.load(pos), out.dtype), base.load(i))

    return ctx.pointwise(out.shape, out.dtype, body)


def _unravel(linear: ir.Expr, shape: Sequence[int]) -> list[ir.Expr]:
    return [ir.call("mod", ir.call("floordiv", linear, ir.index(stride)), ir.index(size))
            for size, stride in zip(shape, ir.contiguous_strides(shape), strict=True)]


@register(aten.flip.default)
def _flip(ctx: LoweringContext, node: Node, x: Value, dims: Sequence[int]) -> Value:
    return tensor_arg(x, node.name).flip(dims)


@register(aten.constant_pad_nd.default)
def _constant_pad(ctx: LoweringContext, node: Node, x: Value, pad: Sequence[int], value: float = 0) -> Value:
    """``pad`` holds (before, after) pairs from the last dimension backwards; negative amounts crop."""
    src = tensor_arg(x, node.name)
    out = ctx.meta()
    rank = len(out.shape)
    before = [0] * rank
    for j in range(len(pad) // 2):
        before[rank - 1 - j] = int(pad[2 * j])

    def body(i: tuple[ir.Expr, ...]) -> ir.Expr:
        pos = [ir.call("sub", i[d], ir.index(before[d])) if before[d] else i[d] for d in range(rank)]
        inside: ir.Expr | None = None
        for d in range(rank):
            if before[d] <= 0 and out.shape[d] - before[d] <= src.shape[d]:
                continue  # never outside the source along d
            cond = ir.call("logical_and", ir.call("ge", pos[d], ir.index(0)),
                           ir.call("lt", pos[d], ir.index(src.shape[d])))
            inside = cond if inside is None else ir.call("logical_and", inside, cond)
        fill = ir.const(value, out.dtype)
        read = ir.cast(src.load(pos), out.dtype) if src.numel else fill
        return read if inside is None else ir.where(inside, read, fill)

    return ctx.pointwise(out.shape, out.dtype, body)
