"""The ops the backend has AOTAutograd decompose, and how: PyTorch's core ATen table, its
decompositions of the composite ops in :data:`EXTRA_DECOMPOSITIONS`, ours
(:mod:`~torch_adreno.frontend.decompositions`) and the fused language-model head's, each checked
as eager checks its arguments."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from torch_adreno.config import Config
from torch_adreno.frontend.decompositions import OWN_DECOMPOSITIONS, UNFUSED_ATTENTION
from torch_adreno.frontend.fused_cross_entropy import DECOMPOSITIONS as FUSED_HEAD_DECOMPOSITIONS
from torch_adreno.lowering.checks import with_eager_checks

aten = torch.ops.aten

#: Composite ops that are decomposed into primitives we lower (beyond PyTorch's core ATen set).
EXTRA_DECOMPOSITIONS = [
    aten._log_softmax.default,
    aten._softmax.default,
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.native_batch_norm_backward.default,
    aten.native_group_norm.default,
    aten.native_group_norm_backward.default,
    aten.gelu.default,
    aten.gelu_backward.default,
    aten.leaky_relu.default,
    aten.leaky_relu_backward.default,
    aten.elu.default,
    aten.elu_backward.default,
    aten.hardtanh.default,
    aten.hardtanh_backward.default,
    aten.hardswish.default,
    aten.hardswish_backward.default,
    aten.hardsigmoid.default,
    aten.hardsigmoid_backward.default,
    aten.silu.default,
    aten.silu_backward.default,
    aten.mish.default,
    aten.softplus.default,
    aten.softplus_backward.default,
    aten.index_add.default,
    aten.index_copy.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.lerp.Scalar,
    aten.lerp.Tensor,
    aten.addcmul.default,
    aten.addcdiv.default,
    aten.mse_loss.default,
    aten.mse_loss_backward.default,
    aten.binary_cross_entropy_with_logits.default,
    aten.smooth_l1_loss.default,
    aten.huber_loss.default,
    aten.repeat.default,
    aten.linalg_vector_norm.default,
    aten._weight_norm_interface.default,
]


@functools.cache
def decomposition_table(fused_attention: bool = True) -> dict[Any, Callable[..., Any]]:
    """The ops the backend has AOTAutograd decompose, and how (``fused_attention``: the option)."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(EXTRA_DECOMPOSITIONS))
    table.update(OWN_DECOMPOSITIONS if fused_attention else {**OWN_DECOMPOSITIONS, **UNFUSED_ATTENTION})
    checked = {op: with_eager_checks(op, decomposition) for op, decomposition in table.items()}
    return checked | FUSED_HEAD_DECOMPOSITIONS


class LazyDecompositions(Mapping[Any, Callable[..., Any]]):
    """:func:`decomposition_table` for ``config``, built at its first read: AOTAutograd reads it
    only to trace, which a graph loaded from the compile cache skips (building it costs ~0.15 s per
    process)."""

    def __init__(self, config: Config) -> None:
        self._fused_attention = config.fused_attention

    def __getitem__(self, op: Any) -> Callable[..., Any]:
        return decomposition_table(self._fused_attention)[op]

    def __iter__(self) -> Iterator[Any]:
        return iter(decomposition_table(self._fused_attention))

    def __len__(self) -> int:
        return len(decomposition_table(self._fused_attention))
