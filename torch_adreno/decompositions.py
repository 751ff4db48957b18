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

import math
from collections.abc import Callable
from typing import Any

import torch

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


def _check_no_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise NotImplementedError(
            "scaled_dot_product_attention with dropout_p > 0 reached the CPU flash kernel, whose random "
            "mask the adreno backend cannot reproduce; pass dropout_p=0.0 or apply nn.Dropout to the output")


def flash_attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                            is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                            scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q k^T * scale + mask) v, logsumexp of the masked scores over keys)``."""
    _check_no_dropout(dropout_p)
    scores, _ = _masked_scores(query, key, is_causal, attn_mask, scale)
    return torch.matmul(torch.softmax(scores, dim=-1), value), torch.logsumexp(scores, dim=-1)


def flash_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                             attn_mask: torch.Tensor | None = None,
                             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`flash_attention_forward`, the probabilities recomputed from the scores
    and ``logsumexp``; ``sum(dO * O)`` per row stands in for ``sum(dP * P)`` (they are equal).

    (A softmax of the recomputed scores would be a little more precise where scores are large —
    one ulp of a log-sum-exp near 200 is a 1.5e-5 relative error in every probability — but the
    joint graph then shares the scores with the forward and the partitioner saves the queries x keys
    matrix; tests/test_attention.py checks that it does not.)
    """
    _check_no_dropout(dropout_p)
    scores, scale = _masked_scores(query, key, is_causal, attn_mask, scale)
    probabilities = torch.exp(scores - logsumexp.unsqueeze(-1))
    grad_value = torch.matmul(probabilities.transpose(-2, -1), grad_out)
    grad_probabilities = torch.matmul(grad_out, value.transpose(-2, -1))
    row_dot = (grad_out * out).sum(-1, keepdim=True)
    grad_scores = probabilities * (grad_probabilities - row_dot) * scale
    grad_query = torch.matmul(grad_scores, key)
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query)
    return grad_query, grad_key, grad_value


#: The backend's own decompositions, on top of PyTorch's table (they replace its entries).
OWN_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_backward,
}
