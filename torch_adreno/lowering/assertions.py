"""Device-side assertions: ``_assert_async(cond, message)``, which ``one_hot``'s decomposition
makes of its class-range checks (a router's one-hot expert mask, a load-balancing loss).

The condition is a tensor value, known only on the device: it is checked there, through the index
error record (``index_checks.value_check``), and a false one raises eager's RuntimeError with the
assertion's message at the host's next wait. The node writing the check's (unread) result is a
graph effect (``ir.Graph.effects``), so that fusion keeps it.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import LoweringError
from torch_adreno.lowering.context import LoweringContext, Value, register
from torch_adreno.lowering.index_checks import always_zero, value_check
from torch_adreno.lowering.views import tensor_arg

aten = torch.ops.aten


@register(aten._assert_async.msg, aten._assert_async.default)
def _assert_async(ctx: LoweringContext, node: Node, cond: Value, message: str = "Expected Tensor with single "
                  "nonzero value, but got zero") -> Value:
    """(The default message is eager's for ``_assert_async`` without one.)"""
    value = tensor_arg(cond, node.name)
    if value.numel != 1:
        # (eager: "Boolean value of Tensor with more than one value is ambiguous", a RuntimeError)
        raise LoweringError(f"{node.name}: _assert_async takes a tensor of one element, got shape {list(value.shape)}")
    holds = ir.call("ne", value.reshape([]).load([]), ir.const(0, value.dtype))
    check = value_check(ctx, ir.call("logical_not", holds), "RuntimeError", message)
    effect = ctx.pointwise((), ir.DType.BOOL, lambda i: always_zero(check, ir.DType.BOOL))
    ctx.graph.effects.append(effect.buffer)
    return None

