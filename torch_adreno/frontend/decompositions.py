"""Decompositions the backend writes itself, where PyTorch's table has none or a wrong one.

Attention: on a CPU host, ``F.scaled_dot_product_attention`` traces to the fused CPU flash
kernel ``_scaled_dot_product_flash_attention_for_cpu`` and its backward. PyTorch's decomposition of
the forward returns the attention weights where the backward expects the log-sum-exp, and the
backward has none. These decompose both the flash way: the forward saves only the row-wise
log-sum-exp (batch x heads x queries floats, not the queries x keys weights) — the op's contract —
and the backward recomputes scores and probabilities, so no attention matrix is kept between the
passes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from torch_adreno.lowering.attention import fused_attention_refusal, record_unfused

aten = torch.ops.aten


def _masked_scores(query: torch.Tensor, key: torch.Tensor, is_causal: bool, attn_mask: torch.Tensor | None,
                   scale: float | None) -> tuple[torch.Tensor, float]:
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        # PyTorch's causal mask is aligned to the top left: query i sees keys 0..i.
        keep = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores, scale


def _grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention (``enable_gqa=True``): keys or values of fewer heads than the
    queries, each shared by ``heads // t.shape[-3]`` consecutive query heads, repeated to ``heads``
    (query head ``h`` reads key head ``h // group``, as eager's kernel does)."""
    kv_heads = t.shape[-3]
    if kv_heads == heads:
        return t
    if heads % kv_heads:
        raise ValueError(f"scaled_dot_product_attention: {heads} query heads cannot share {kv_heads} key/value "
                         "heads (enable_gqa needs the query heads to be a multiple of the key/value heads)")
    group = heads // kv_heads
    lead = t.shape[:-3]
    return t.unsqueeze(-3).expand(*lead, kv_heads, group, *t.shape[-2:]).reshape(*lead, heads, *t.shape[-2:])


def _ungrouped(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of :func:`_grouped`: the query heads' shares summed back per key/value head."""
    heads = grad.shape[-3]
    if heads == kv_heads:
        return grad
    lead = grad.shape[:-3]
    return grad.reshape(*lead, kv_heads, heads // kv_heads, *grad.shape[-2:]).sum(-3)


def _widened(t: Any) -> Any:
    """A 16-bit float tensor as float32 (the precision eager's CPU flash kernel computes in)."""
    if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16):
        return t.float()
    return t


def _check_no_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise NotImplementedError(
            "scaled_dot_product_attention with dropout_p > 0 reached the CPU flash kernel, whose random "
            "mask the adreno backend cannot reproduce; pass dropout_p=0.0 or apply nn.Dropout to the output")


def flash_attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                            is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                            scale: float | None = None, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q k^T * scale + mask) v, logsumexp of the masked scores over keys)``. 16-bit
    inputs are computed in float32 and only the output rounded, as eager's kernel accumulates
    (rounding scores of magnitude ~100 to float16 moves every probability by percents); the
    log-sum-exp is float32 whatever the inputs' type, the kernel's contract (its backward refuses a
    16-bit one). ``fused=False`` (the option ``fused_attention=False``): decomposed even where the
    fused kernels would take it."""
    _check_no_dropout(dropout_p)
    refusal = fused_attention_refusal(query, key, value, attn_mask, fused)
    if refusal is None:
        return NotImplemented  # (traced as the op itself: lowering/attention.py runs it fused)
    record_unfused(refusal)
    dtype = query.dtype
    query, key, value, attn_mask = (_widened(t) for t in (query, key, value, attn_mask))
    heads = query.shape[-3] if query.dim() >= 3 else 1
    if query.dim() >= 3:
        key, value = _grouped(key, heads), _grouped(value, heads)
    scores, _ = _masked_scores(query, key, is_causal, attn_mask, scale)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    return out.to(dtype), torch.logsumexp(scores, dim=-1).float()


def flash_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                             attn_mask: torch.Tensor | None = None, scale: float | None = None,
                             fused: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`flash_attention_forward`, the probabilities recomputed from the scores
    and ``logsumexp``; ``sum(dO * O)`` per row stands in for ``sum(dP * P)`` (they are equal).

    (A softmax of the recomputed scores would be a little more precise where scores are large —
    one ulp of a log-sum-exp near 200 is a 1.5e-5 relative error in every probability — but the
    joint graph then shares the scores with the forward and the partitioner saves the queries x keys
    matrix; tests/frontend/test_attention.py checks that it does not.)
    """
    _check_no_dropout(dropout_p)
    if fused_attention_refusal(query, key, value, attn_mask, fused) is None:
        return NotImplemented
    dtypes = query.dtype, key.dtype, value.dtype
    grad_out, query, key, value, out, attn_mask = (
        _widened(t) for t in (grad_out, query, key, value, out, attn_mask))
    kv_heads = key.shape[-3] if key.dim() >= 3 else 1
    if query.dim() >= 3:
        key, value = _grouped(key, query.shape[-3]), _grouped(value, query.shape[-3])
    scores, scale = _masked_scores(query, key, is_causal, attn_mask, scale)
    probabilities = torch.exp(scores - logsumexp.unsqueeze(-1).to(scores.dtype))
    grad_value = torch.matmul(probabilities.transpose(-2, -1), grad_out)
    grad_probabilities = torch.matmul(grad_out, value.transpose(-2, -1))
    row_dot = (grad_out * out).sum(-1, keepdim=True)
    grad_scores = probabilities * (grad_probabilities - row_dot) * scale
    grad_query = torch.matmul(grad_scores, key)
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query)
    if query.dim() >= 3:
        grad_key, grad_value = _ungrouped(grad_key, kv_heads), _ungrouped(grad_value, kv_heads)
    return grad_query.to(dtypes[0]), grad_key.to(dtypes[1]), grad_value.to(dtypes[2])


def weight_norm_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                         saved_norms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``w = v * g / ||v||`` (norms over every dimension but ``dim``, kept as size
    1 there), as PyTorch's ``_weight_norm_interface_backward`` computes them (which has no
    decomposition of its own): ``grad_g = sum(grad_w * v) / ||v||`` and
    ``grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||)``, in float32 for 16-bit weights."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    grad, v, g, norms = (_widened(t) for t in (grad_w, saved_v, saved_g, saved_norms))
    grad_g = (grad * v).sum(dims, keepdim=True) / norms
    grad_v = (g / norms) * (grad - v * (grad_g / norms))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


#: The backend's own decompositions, on top of PyTorch's table (they replace its entries).
OWN_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_backward,
    aten._weight_norm_interface_backward.default: weight_norm_backward,
}
#: The attention entries of :data:`OWN_DECOMPOSITIONS` with the fused kernels turned off.
UNFUSED_ATTENTION: dict[Any, Callable[..., Any]] = {
    op: functools.partial(decomposition, fused=False) for op, decomposition in OWN_DECOMPOSITIONS.items()}


# -- foreach ops: one op per tensor -----------------------------------------------------------------
#
# ``foreach=True`` optimizers (SGD's and Adam's default on CUDA, and what Dynamo traces with
# foreach=True on the CPU) call ``_foreach_*`` ops over lists of tensors. Each is the same
# element-wise op applied per tensor; decomposed that way, fusion sees the single-tensor chains it
# already fuses per parameter, and multi-tensor grouping (``fusion/multi_tensor.py``) puts them back
# into one launch per kind of update.

#: foreach op -> the per-tensor function, per overload kind ("Scalar"/"ScalarList": a number per
#: tensor; otherwise tensors). maximum/minimum with a number are clamps (torch.maximum takes tensors).
_FOREACH_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    name: getattr(torch, name) for name in (
        "add", "sub", "mul", "div", "addcmul", "addcdiv", "pow", "maximum", "minimum", "lerp", "clamp_min",
        "clamp_max", "sqrt", "neg", "reciprocal", "exp", "log", "abs", "sign", "sigmoid", "tanh")
}
_FOREACH_WITH_NUMBER: dict[str, Callable[..., Any]] = {"maximum": torch.clamp_min, "minimum": torch.clamp_max}


def _foreach_decomposition(name: str, overload: str, schema: torch._C.FunctionSchema) -> Callable[..., Any]:
    per_tensor = _FOREACH_ELEMENTWISE[name]
    if overload in ("Scalar", "ScalarList") and name in _FOREACH_WITH_NUMBER:
        per_tensor = _FOREACH_WITH_NUMBER[name]
    arguments = [(a.name, isinstance(a.type, torch.ListType)) for a in schema.arguments]
    keyword = {"alpha", "value"} | ({"scalars"} if name in ("addcmul", "addcdiv") else set())

    def decomposition(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        values = dict(zip([n for n, _ in arguments], args, strict=False)) | kwargs
        lists = [values[n] for n, is_list in arguments if is_list and n in values]
        results = []
        for i in range(len(lists[0])):
            positional, named = [], {}
            for n, is_list in arguments:
                if n not in values:
                    continue
                v = values[n][i] if is_list else values[n]
                if n in keyword:
                    named["value" if n == "scalars" else n] = v
                else:
                    positional.append(v)
            results.append(per_tensor(*positional, **named))
        return results

    decomposition.__name__ = f"foreach_{name}_{overload}"
    return decomposition


def foreach_decompositions() -> dict[Any, Callable[..., Any]]:
    """Per-tensor decompositions of the element-wise ``_foreach_*`` ops (not of the ``.Tensor``
    overloads of addcmul/addcdiv, whose values come in one tensor, nor of the out= forms)."""
    table: dict[Any, Callable[..., Any]] = {}
    for name in _FOREACH_ELEMENTWISE:
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if "out" in overload.lower() or (name in ("addcmul", "addcdiv") and overload == "Tensor"):
                continue
            table[op] = _foreach_decomposition(name, overload, op._schema)
    table[aten._foreach_copy.default] = _foreach_copy
    return table


def _foreach_copy(self: list[torch.Tensor], src: list[torch.Tensor], non_blocking: bool = False) -> list[torch.Tensor]:
    """The functional ``_foreach_copy``: each ``src`` in its ``self``'s shape and dtype
    (Rprop's and others' multi-tensor steps keep a copy of the gradients this way)."""
    return [aten.copy.default(destination, source) for destination, source in zip(self, src, strict=True)]


OWN_DECOMPOSITIONS.update(foreach_decompositions())
