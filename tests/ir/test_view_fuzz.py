"""The view fuzzer: random chains of view ops over shapes with coinciding sizes.

* Without a device: each chain composed as index maps (:class:`torch_adreno.ir.View`) addresses
  exactly the elements torch's strided view does (hundreds of chains, evaluated numerically).
* On the device: the chain, then a pointwise op, a reduction, a matrix product or attention,
  compiled with ``fullgraph=True``; forward and input gradient against eager.

A chain such as ``x.view(T, B*H, D).transpose(0, 1).view(B, H, T, D)`` with ``T == H`` once came
back silently wrong (index substitution sent a new placeholder variable through the mapping a
second time when it coincided with an old one in name and size); both tests find that bug.
The seed is fixed (``derandomize``); ``TORCH_ADRENO_FUZZ_EXAMPLES=N`` runs N cases of each.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from view_chains import Chain, apply_to_view, chains, index_values

from torch_adreno import ir

INDEX_EXAMPLES = int(os.environ.get("TORCH_ADRENO_FUZZ_EXAMPLES", "600"))
DEVICE_EXAMPLES = int(os.environ.get("TORCH_ADRENO_FUZZ_EXAMPLES", "40"))


class _Buffer:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.name, self.shape, self.dtype = "x", shape, ir.DType.F32


@settings(max_examples=INDEX_EXAMPLES, deadline=None, derandomize=True)
@given(chains(as_strided=False, max_steps=7))
def test_index_maps_address_what_torch_views_address(chain: Chain) -> None:
    numel = math.prod(chain.base)
    expected = chain.apply(torch.arange(numel).reshape(chain.base))
    view = apply_to_view(ir.View.of(_Buffer(chain.base)), chain)
    torch.testing.assert_close(index_values(view), expected, msg=lambda m: f"{chain}: {m}")


def test_the_multihead_attention_chain_with_as_many_tokens_as_heads() -> None:
    """The chain ``F.multi_head_attention_forward`` runs on its queries, keys and values."""
    for t, b, h, d in [(2, 3, 2, 2), (4, 3, 4, 2), (3, 2, 3, 4), (8, 2, 8, 8), (4, 3, 2, 4)]:
        chain = Chain((t, b, h * d), (("view", (t, b * h, d)), ("transpose", 0, 1), ("view", (b, h, t, d))))
        expected = chain.apply(torch.arange(t * b * h * d).reshape(chain.base))
        torch.testing.assert_close(index_values(apply_to_view(ir.View.of(_Buffer(chain.base)), chain)), expected)


CONSUMERS = ("pointwise", "reduction", "matmul", "attention")


def _consume(y: torch.Tensor, consumer: str) -> torch.Tensor:
    if consumer == "pointwise":
        return torch.sin(y) * 2.0 + y
    if consumer == "reduction":
        return y.sum(dim=-1) if y.dim() else y * 3.0
    if consumer == "matmul":
        weight = torch.linspace(-1.0, 1.0, y.shape[-1] * 3).reshape(y.shape[-1], 3)
        return y @ weight
    assert consumer == "attention"
    q = y.flatten(0, -3) if y.dim() > 3 else y
    return F.scaled_dot_product_attention(q, torch.tanh(q), q * 0.5)


def _program(chain: Chain, consumer: str):
    def run(x: torch.Tensor) -> torch.Tensor:
        return _consume(chain.apply(x), consumer)
    return run


@pytest.mark.device
@settings(max_examples=DEVICE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_view_chains_then_a_consumer_match_eager(data: st.DataObject) -> None:
    consumer = data.draw(st.sampled_from(CONSUMERS), label="consumer")
    min_rank = {"pointwise": 0, "reduction": 1, "matmul": 1, "attention": 3}[consumer]
    chain = data.draw(chains(min_rank=min_rank), label="chain")
    x = torch.randn(chain.base, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    assert_matches_eager(_program(chain, consumer), x)


@pytest.mark.device
@pytest.mark.parametrize("t, b, h, d", [(2, 3, 2, 2), (4, 3, 4, 2), (3, 2, 3, 4), (8, 2, 8, 8),
                                        (4, 3, 2, 4), (8, 2, 4, 8), (2, 3, 3, 2)])
def test_the_multihead_attention_chain_on_the_device(t: int, b: int, h: int, d: int) -> None:
    """Forward and gradient equal eager's for every size, ``T == H`` included."""
    chain = Chain((t, b, h * d), (("view", (t, b * h, d)), ("transpose", 0, 1), ("view", (b, h, t, d))))
    assert_matches_eager(_program(chain, "pointwise"), torch.randn(t, b, h * d))


@pytest.mark.device
@pytest.mark.parametrize("size, stride, offset", [((2, 3), (1, 2), 0), ((2, 2), (6, 2), 1), ((3,), (2,), 1),
                                                  ((2, 2, 2), (1, 4, 2), 0), ((3, 3), (1, 1), 0)])
def test_as_strided_and_its_scatter_match_eager(size, stride, offset) -> None:
    """Strided windows with gaps, transposed strides and an offset (the backward scatters through
    them); the last one overlaps itself, so its gradient sums."""
    assert_matches_eager(lambda x: torch.sin(x.as_strided(size, stride, offset)) * 2.0, torch.randn(3, 4))
