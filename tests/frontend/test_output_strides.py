"""Outputs and gradients come back with eager's strides (channels_last, transposed, permuted)."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_adreno
from torch_adreno.frontend.compile_cache import _non_overlapping

pytestmark = pytest.mark.device


def test_channels_last_model_output_and_gradients_keep_eager_strides():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, padding=1)).to(memory_format=torch.channels_last)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    ours_x, eager_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch_adreno.profile() as prof:
        out = torch.compile(model, backend="adreno", fullgraph=True)(ours_x)
        (grad_x,) = torch.autograd.grad(out.square().sum(), ours_x)
    expected = reference(eager_x)
    (expected_grad_x,) = torch.autograd.grad(expected.square().sum(), eager_x)
    assert prof.kernel_launches > 0
    assert expected.stride() == (144, 1, 24, 4), "eager keeps channels_last"
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert grad_x.stride() == expected_grad_x.stride() == x.stride()
    torch.testing.assert_close(grad_x, expected_grad_x, rtol=1e-4, atol=1e-4)


def _views(a):
    return (a * 2).t(), (a.unsqueeze(0) + 1).permute(2, 0, 1), (a[:, None] * a[None]).transpose(0, 2)[::2]


def test_transposed_permuted_and_strided_outputs_keep_eager_strides():
    a = torch.randn(4, 5)
    ours_a, eager_a = a.clone().requires_grad_(), a.clone().requires_grad_()
    with torch_adreno.profile() as prof:
        outs = torch.compile(_views, backend="adreno", fullgraph=True)(ours_a)
        grad = torch.autograd.grad(sum((o * torch.arange(o.numel()).view(o.shape)).sum() for o in outs), ours_a)[0]
    expected = _views(eager_a)
    expected_grad = torch.autograd.grad(
        sum((o * torch.arange(o.numel()).view(o.shape)).sum() for o in expected), eager_a)[0]
    assert prof.kernel_launches > 0
    for ours, eager in zip(outs, expected, strict=True):
        assert ours.stride() == eager.stride(), (ours.shape, ours.stride(), eager.stride())
        torch.testing.assert_close(ours, eager)
    torch.testing.assert_close(grad, expected_grad)


def test_overlap_check():
    assert _non_overlapping((2, 3, 4), (12, 1, 3))
    assert _non_overlapping((4, 3), (6, 2))  # gaps between elements are fine
    assert not _non_overlapping((3, 4), (0, 1))  # an expanded view
    assert not _non_overlapping((4, 4), (2, 1))
    assert _non_overlapping((1, 4), (0, 1))
    assert _non_overlapping((3, 4, 4), (2, 5, 20))  # interleaved, yet every offset distinct
    assert not _non_overlapping((3, 4), (2, 1))  # element (1, 0) is element (0, 2)
