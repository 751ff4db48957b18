"""Indices read from tensors, checked on the device as eager checks them (``checked_index``):
the IR each index lowering builds them with, and eager's rules (which ops wrap negative values,
which exception type a value out of range raises)."""

from __future__ import annotations

from collections.abc import Sequence

from torch.fx import Node

from torch_adreno import ir
from torch_adreno.lowering.context import LoweringContext

#: Eager's wording where its message does not name the value (index_select, embedding).
OUT_OF_RANGE_IN_SELF = "index out of range in self"


def as_index(ctx: LoweringContext, value: ir.Expr, size: int, dim: int, *, wraps: bool, error: str,
             eager_message: str | None = None) -> ir.Expr:
    """A loaded tensor value as an index into dimension ``dim`` (of ``size``), checked on the device
    as eager checks it: a value outside ``[0, size)`` (``[-size, size)`` where ``wraps``: negative
    values count from the end) is reported to the host at its next wait, as eager's ``error`` type
    naming this FX node, and replaced by 0 so that no kernel reads or writes out of bounds."""
    check = ir.IndexCheck(ctx.origins[0], dim, size, wraps, error, eager_message)
    checks = ctx.graph.index_checks
    if check not in checks:
        checks.append(check)
    site = checks.index(check)
    return ir.call("checked_index", value, ir.index(size), ir.index(site), ir.index(int(wraps)))


def load_scalar_checked(src: ir.View, check: ir.Expr) -> ir.Expr:
    """The one element of a 0-dim ``src`` once index ``check`` (into a dimension of 1) is checked:
    written so that the check is evaluated even where ``src`` is a constant."""
    # (A checked index is never negative: the cast adds 0; a conditional would be folded away.)
    return ir.call("add", src.load([]), ir.cast(ir.call("lt", check, ir.index(0)), src.dtype))


def load_checked(src: ir.View, pos: Sequence[ir.Expr]) -> ir.Expr:
    """``src[pos]``, where ``pos`` holds checked indices. From a tensor without elements (where
    every index is out of range) nothing is read: a 0 that still evaluates a check, which fails."""
    if src.numel:
        return src.load(pos)
    checks = [e for p in pos for e in ir.walk(p) if isinstance(e, ir.Call) and e.op == "checked_index"]
    # (A checked index is never negative: this is 0, and nothing folds it away before the check.)
    return ir.cast(ir.call("lt", checks[0], ir.index(0)), src.dtype) if checks else ir.const(0, src.dtype)


#: Ops that decompose into index / index_put but whose eager kernels refuse negative indices, with
#: the exception type eager raises for an index out of range.
NON_WRAPPING_INDEX_OPS = {"index_add": "RuntimeError", "index_copy": "IndexError"}


def index_rule(node: Node) -> tuple[bool, str]:
    """(negative indices count from the end, eager's exception type) for an index / index_put node,
    by the op it was decomposed from (``original_aten``): advanced indexing wraps, index_add and
    index_copy do not."""
    original = node.meta.get("original_aten")
    name = getattr(original, "__name__", "").split(".")[0].rstrip("_")
    if name in NON_WRAPPING_INDEX_OPS:
        return False, NON_WRAPPING_INDEX_OPS[name]
    return True, "IndexError"


def value_check(ctx: LoweringContext, failed: ir.Expr, error: str, eager_message: str) -> ir.Expr:
    """An index expression that is always 0 and, where ``failed`` (a boolean) is true, reports
    ``eager_message`` as eager's ``error`` type at the host's next wait: a check of a value that is
    not an index, through the index error record. Add it to a value that is always computed (with
    :func:`always_zero`) so that the check is evaluated."""
    check = ir.IndexCheck(ctx.origins[0], 0, 1, False, error, value_message=eager_message)
    checks = ctx.graph.index_checks
    if check not in checks:
        checks.append(check)
    return ir.call("checked_index", ir.cast(failed, ir.DType.I64), ir.index(1), ir.index(checks.index(check)),
                   ir.index(0))


def always_zero(check: ir.Expr, dtype: ir.DType) -> ir.Expr:
    """0 of ``dtype``, computed from ``check`` (a checked index, never negative) so that nothing
    folds the check away."""
    return ir.cast(ir.call("lt", check, ir.index(0)), dtype)
