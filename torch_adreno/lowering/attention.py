"""Fused attention: ``scaled_dot_product_attention``'s CPU flash op and its backward as template
nodes (``kernels/attention.cl``) instead of matrix products with the queries x keys scores in
memory.

The choice is made when AOTAutograd traces (``frontend/decompositions.py`` asks
:func:`fused_attention_refusal`): an op the fused kernels take stays one FX node and is lowered
here; any other is decomposed into matrix products, with the reason warned once per reason and
kept in :data:`UNFUSED_REASONS` (never silently). Both paths save the same tensors for the
backward (q, k, v, the output and the row log-sum-exp), so they mix freely.

The forward is one node (out, lse); the backward is a reduction ``delta = rowsum(dO * O)`` (a
generated kernel) and two nodes: dQ (one pass over the key blocks per query block) and dK/dV (one
pass over the query blocks, of every query head of the group, per key block): no atomics.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.fx import Node

from torch_adreno import ir
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering.context import LoweringContext, Value, register

aten = torch.ops.aten

#: Template names (the renderers in ``kernels/attention.py``).
FORWARD = "attention_forward"
GRAD_QUERY = "attention_grad_query"
GRAD_KEY_VALUE = "attention_grad_key_value"

#: Largest head dimension the fused kernels take (their rows and accumulators per work-item).
MAX_HEAD_DIM = 256
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

#: Why each attention decomposed instead of running fused, in order, one entry per distinct reason.
UNFUSED_REASONS: list[str] = []


#: The refusal when the option ``fused_attention`` is off.
TURNED_OFF = "fused attention is turned off (option fused_attention=False)"


def fused_attention_refusal(query: Any, key: Any, value: Any, attn_mask: Any, fused: bool = True) -> str | None:
    """Why the fused kernels cannot run this attention (None: they can). Takes (fake) tensors;
    ``fused``: the option ``fused_attention``."""
    if not fused:
        return TURNED_OFF
    if attn_mask is not None:
        return "an attn_mask is not built into the fused kernels (only is_causal is)"
    tensors = (query, key, value)
    if any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in tensors):
        return "the fused kernels take 4-d [batch, heads, sequence, head dim] tensors"
    if len({t.dtype for t in tensors}) != 1 or query.dtype not in _FLOATS:
        return f"query, key and value must share one of {_FLOATS} (got {', '.join(str(t.dtype) for t in tensors)})"
    if any(isinstance(s, torch.SymInt) for t in tensors for s in t.shape):
        return "symbolic shapes"
    (batch, heads, queries, dim), (kbatch, kv_heads, keys, kdim) = query.shape, key.shape
    if tuple(value.shape) != tuple(key.shape) or kdim != dim or kbatch != batch:
        return (f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} differ in batch "
                "or head dimension (the fused kernels need one head dimension)")
    if dim > MAX_HEAD_DIM:
        return f"head dimension {dim} > {MAX_HEAD_DIM}"
    if kv_heads == 0 or heads % kv_heads:
        return f"{heads} query heads are not a multiple of {kv_heads} key/value heads"
    if min(batch, heads, queries, keys, dim) == 0:
        return "an empty operand"
    return None


def record_unfused(reason: str) -> None:
    """Keep and warn about (once per reason) an attention that runs decomposed."""
    if reason not in UNFUSED_REASONS:
        UNFUSED_REASONS.append(reason)
        warnings.warn(f"torch_adreno: scaled_dot_product_attention runs decomposed, with its queries x keys scores "
                      f"in device memory: {reason}", stacklevel=3)


def _views(node: Node, *values: Value) -> tuple[ir.View, ...]:
    views = tuple(v for v in values if isinstance(v, ir.View))
    if len(views) != len(values):
        raise UnsupportedOpError(f"{node.name}: fused attention expects tensor operands")
    return views


def _check(node: Node, offset: int) -> None:
    """The FX node's operands are what :func:`fused_attention_refusal` accepted when tracing."""
    query, key, value = (a.meta.get("val") if isinstance(a, Node) else a for a in node.args[offset:offset + 3])
    reason = fused_attention_refusal(query, key, value, node.kwargs.get("attn_mask"))
    if reason is not None:
        raise UnsupportedOpError(f"fused attention: {reason}")


def _attributes(query: ir.View, key: ir.View, is_causal: bool, scale: float | None) -> tuple[tuple[str, Any], ...]:
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return (("causal", bool(is_causal)), ("scale", scale), ("group", query.shape[1] // key.shape[1]))


def _template(ctx: LoweringContext, target: str, inputs: tuple[ir.View, ...], outputs: list[ir.Buffer],
              attributes: tuple[tuple[str, Any], ...]) -> tuple[ir.View, ...]:
    ctx.graph.nodes.append(ir.TemplateOp(ctx.fresh("attention"), target, inputs, tuple(b.name for b in outputs),
                                         attributes, ctx.origins))
    return tuple(ir.View.of(b) for b in outputs)


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _flash_attention(ctx: LoweringContext, node: Node, query: Value, key: Value, value: Value, dropout_p: float = 0.0,
                     is_causal: bool = False, *, attn_mask: Value = None, scale: float | None = None) -> Value:
    _check(node, 0)
    q, k, v = _views(node, query, key, value)
    out = ctx.new_buffer(q.shape, ctx.meta(index=0).dtype, "attn")
    lse = ctx.new_buffer(q.shape[:3], ir.DType.F32, "lse")
    return _template(ctx, FORWARD, (q, k, v), [out, lse], _attributes(q, k, is_causal, scale))


@register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _flash_attention_backward(ctx: LoweringContext, node: Node, grad_out: Value, query: Value, key: Value,
                              value: Value, out: Value, logsumexp: Value, dropout_p: float, is_causal: bool, *,
                              attn_mask: Value = None, scale: float | None = None) -> Value:
    _check(node, 1)
    do, q, k, v, o, lse = _views(node, grad_out, query, key, value, out, logsumexp)
    # delta = rowsum(dO * O), read by both passes (sum(dP * P) per row, which it equals).
    delta = ctx.reduction(q.shape[:3], (q.shape[3],), "sum", ir.DType.F32,
                          lambda i, r: ir.call("mul", ir.cast(do.load((*i, *r)), ir.DType.F32),
                                               ir.cast(o.load((*i, *r)), ir.DType.F32)))
    attributes = _attributes(q, k, is_causal, scale)
    inputs = (do, q, k, v, lse, delta)
    (grad_q,) = _template(ctx, GRAD_QUERY, inputs, [ctx.new_buffer(q.shape, ctx.meta(index=0).dtype, "grad_q")],
                          attributes)
    grad_k, grad_v = _template(ctx, GRAD_KEY_VALUE, inputs,
                               [ctx.new_buffer(k.shape, ctx.meta(index=1).dtype, "grad_k"),
                                ctx.new_buffer(v.shape, ctx.meta(index=2).dtype, "grad_v")], attributes)
    return (grad_q, grad_k, grad_v)
