"""Average, adaptive average and adaptive max pooling and transposed convolution: forward and
gradients on the OpenCL device (PoCL in CI) against eager PyTorch, plus their IR shape (no device)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager, capture_graphs, training_step_against_eager
from torch import nn

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering import lower_graph

device = pytest.mark.device


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def lower(fn, *inputs, index=0):
    return lower_graph(capture_graphs(fn, *inputs)[index], Config(), "g")


# -- average pooling -----------------------------------------------------------------------------


@device
@pytest.mark.parametrize(
    "kernel,stride,padding,ceil,include_pad,divisor",
    [(2, None, 0, False, True, None), (3, 2, 1, False, True, None), (3, 2, 1, True, True, None),
     (3, 2, 1, True, False, None), ((3, 2), (2, 1), (1, 0), False, False, None), (3, 3, 1, True, True, None),
     ((2, 3), (1, 2), (1, 1), False, True, 5), (3, 2, 1, True, False, 4)],
)
def test_avg_pool2d(kernel, stride, padding, ceil, include_pad, divisor):
    def fn(x):
        return F.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil, count_include_pad=include_pad,
                            divisor_override=divisor)

    assert_matches_eager(fn, r(2, 3, 10, 7))


@device
def test_avg_pool2d_unbatched_odd_shape():
    assert_matches_eager(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), r(3, 5, 9))


# -- adaptive pooling ----------------------------------------------------------------------------


@device
@pytest.mark.parametrize("in_hw,out_hw", [((10, 7), (3, 5)), ((5, 7), (9, 4)), ((8, 6), (4, 3)), ((7, 9), (1, 1)),
                                          ((6, 11), (6, 1)), ((13, 13), (5, 7))])
def test_adaptive_avg_pool2d(in_hw, out_hw):
    assert_matches_eager(lambda x: F.adaptive_avg_pool2d(x, out_hw), r(2, 3, *in_hw))


@device
def test_adaptive_avg_pool2d_unbatched():
    assert_matches_eager(lambda x: F.adaptive_avg_pool2d(x, (4, 3)), r(3, 9, 7))


@device
@pytest.mark.parametrize("in_hw,out_hw", [((10, 7), (3, 5)), ((5, 7), (9, 4)), ((8, 6), (4, 3)), ((7, 9), (2, 2))])
def test_adaptive_max_pool2d_values_indices_and_gradient(in_hw, out_hw):
    assert_matches_eager(lambda x: F.adaptive_max_pool2d(x, out_hw, return_indices=True), r(2, 3, *in_hw))


@device
def test_adaptive_max_pool2d_ties_take_the_first_maximum():
    # Few distinct values: most windows hold their maximum more than once; the index (and so the
    # gradient) must go to the first one in row-major order, like PyTorch's.
    x = torch.randint(0, 3, (2, 2, 9, 7)).float()
    assert_matches_eager(lambda x: F.adaptive_max_pool2d(x, (4, 3), return_indices=True), x)
    assert_matches_eager(lambda x: F.adaptive_max_pool2d(x, (3, 5)), r(3, 7, 11))  # unbatched


@device
def test_max_pool2d_unbatched():
    assert_matches_eager(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), r(3, 9, 8))


# -- transposed convolution ----------------------------------------------------------------------


@device
@pytest.mark.parametrize(
    "stride,padding,output_padding,dilation,groups,bias",
    [(1, 0, 0, 1, 1, True), (2, 0, 0, 1, 1, False), (2, 1, 1, 1, 1, True), ((2, 3), (1, 0), (1, 2), 1, 1, True),
     (1, 1, 0, 2, 1, False), (2, 2, 1, 2, 2, True), (1, 0, 1, 2, 1, True), (3, 1, 2, (2, 1), 4, False)],
)
def test_conv_transpose2d(stride, padding, output_padding, dilation, groups, bias):
    x, w, b = r(2, 4, 5, 6), r(4, 3, 3, 2), r(3 * groups)  # weight: (C_in, C_out / groups, kH, kW)

    def fn(x, w, b=None):
        return F.conv_transpose2d(x, w, b, stride=stride, padding=padding, output_padding=output_padding,
                                  groups=groups, dilation=dilation)

    if bias:
        assert_matches_eager(fn, x, w, b, atol=1e-4)
    else:
        assert_matches_eager(fn, x, w, atol=1e-4)


@device
def test_conv_transpose1d_and_unbatched_2d():
    assert_matches_eager(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
                         r(2, 3, 7), r(3, 5, 4), r(5), atol=1e-4)
    assert_matches_eager(lambda x, w: F.conv_transpose2d(x, w, stride=2), r(3, 4, 5), r(3, 2, 3, 3), atol=1e-4)


@device
def test_conv_transpose2d_only_some_gradients():
    # output_mask without the input gradient (x is a constant) or the weight gradient.
    x, w = r(2, 4, 5, 5), r(4, 3, 3, 3)
    assert_matches_eager(lambda w: F.conv_transpose2d(x, w, stride=2, padding=1), w, atol=1e-4)
    assert_matches_eager(lambda x: F.conv_transpose2d(x, w, stride=2, padding=1), x, atol=1e-4)


class _Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 6, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.ConvTranspose2d(6, 4, 2, stride=1, groups=2, bias=False)
        self.pool = nn.AdaptiveAvgPool2d((3, 5))
        self.fc = nn.Linear(4 * 15, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(F.relu(self.up2(F.relu(self.up(x)))))
        return self.fc(y.flatten(1))


@device
def test_conv_transpose_and_adaptive_pool_module_trains_like_eager():
    model = _Decoder()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="adreno")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        x, y = torch.randn(4, 3, 5, 6, generator=gen), torch.randint(0, 5, (4,), generator=gen)
        training_step_against_eager(compiled, model, reference, x, y, step)
        opt.step()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


# -- the IR they lower to (no device) ------------------------------------------------------------


def test_conv_transpose_forward_and_backward_are_implicit_gemms():
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    fn = lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)  # noqa: E731
    fw, bw = (lower_graph(gm, Config(), "g") for gm in capture_graphs(fn, x, w))
    gemms = [n for n in fw.nodes if isinstance(n, ir.Gemm)]
    # One GEMM per output phase (position modulo the stride): the 5x5 positions of that phase of
    # both images as the columns (the batch folded in: no groups), summed over the input channels
    # times the taps that reach the phase (1, 2, 2 and 4 of the 9): no product is a masked zero.
    assert sorted((g.batch, g.m, g.n, g.k) for g in gemms) == [(1, 3, 50, 4), (1, 3, 50, 8), (1, 3, 50, 8),
                                                               (1, 3, 50, 16)]
    assert {fw.buffers[g.output].shape for g in gemms} == {(2, 3, 5, 5)}
    assert sum(isinstance(n, ir.Gemm) for n in bw.nodes) == 2
    assert not any(isinstance(n, ir.HostOp) for n in [*fw.nodes, *bw.nodes])


@pytest.mark.parametrize("kernel,stride,padding,dilation,size",
                         [(3, 2, 1, 1, 56), (3, 2, 1, 1, 7), (1, 2, 0, 1, 8), (3, (2, 1), 1, 1, 9), (2, 3, 0, 1, 10),
                          (3, 2, 2, 2, 9)])
def test_strided_input_gradient_does_only_the_products_that_reach_each_position(kernel, stride, padding,
                                                                                dilation, size):
    # The input gradient of a strided convolution as one GEMM per input phase: each input position
    # is summed over only the taps whose window can read it (the dense form over every position and
    # every tap did about stride**2 times as many products, most of them masked zeros), and phases
    # no tap reaches get no GEMM at all.
    x = torch.randn(2, 4, size, size, requires_grad=True)
    w = torch.randn(6, 4, kernel, kernel, requires_grad=True)
    fn = lambda x, w: F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)  # noqa: E731
    fw, bw = (lower_graph(gm, Config(), "g") for gm in capture_graphs(fn, x, w))
    (forward,) = [n for n in fw.nodes if isinstance(n, ir.Gemm)]
    gemms = [n for n in bw.nodes if isinstance(n, ir.Gemm)]
    weight_gradient = [g for g in gemms if bw.buffers[g.output].shape == tuple(w.shape)]
    input_gradient = [g for g in gemms if g not in weight_gradient]
    assert len(weight_gradient) == 1 and input_gradient
    strides = [stride] * 2 if isinstance(stride, int) else list(stride)
    reaching = math.prod(sum(sum((q + padding - t * dilation) % s == 0 for t in range(kernel)) for q in range(size))
                         for s in strides)
    assert sum(g.m * g.n * g.k for g in input_gradient) == 2 * 4 * 6 * reaching
    assert reaching < size * size * kernel * kernel / math.prod(strides) + 2 * size * kernel
    assert forward.m * forward.n * forward.k == 2 * 6 * 4 * kernel * kernel * math.prod(
        (size + 2 * padding - dilation * (kernel - 1) - 1) // s + 1 for s in strides)


@device
@pytest.mark.parametrize("kernel,stride,padding,dilation,size",
                         [(3, 2, 1, 1, 8), (3, 2, 1, 1, 7), (1, 2, 0, 1, 7), (3, (2, 1), 1, 1, 9), (2, 3, 0, 1, 10),
                          (3, 2, 2, 2, 9), (4, 3, 1, 1, 11)])
def test_strided_convolution_gradients_match_eager(kernel, stride, padding, dilation, size):
    x, w, b = r(2, 3, size, size + 1), r(5, 3, kernel, kernel), r(5)
    assert_matches_eager(lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation),
                         x, w, b, atol=1e-4)


@device
def test_strided_convolution_gradients_in_1d_and_3d_match_eager():
    assert_matches_eager(lambda x, w: F.conv1d(x, w, stride=3, padding=2), r(2, 3, 17), r(4, 3, 5), atol=1e-4)
    assert_matches_eager(lambda x, w: F.conv3d(x, w, stride=(2, 1, 2), padding=1), r(2, 2, 5, 6, 7),
                         r(3, 2, 3, 3, 3), atol=1e-4)


def test_pooling_lowers_to_window_reductions():
    g = lower(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), torch.randn(1, 2, 7, 7))
    assert [type(n).__name__ for n in g.nodes] == ["Reduction", "Pointwise"]
    g = lower(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), torch.randn(1, 2, 7, 7))
    (red,) = [n for n in g.nodes if isinstance(n, ir.Reduction)]
    assert red.reduction_ranges == (3, 4)  # the longest windows of 7 -> 3 ([0,3) [2,5) [4,7)) and 7 -> 2
    g = lower(lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True), torch.randn(1, 2, 7, 7))
    assert [n.reduce_op for n in g.nodes if isinstance(n, ir.Reduction)] == ["max", "argmax"]


def test_integer_pooling_is_rejected_clearly():
    with pytest.raises(UnsupportedOpError, match=r"avg_pool2d is lowered for float32"):
        lower(lambda x: F.avg_pool2d(x, 2), torch.randint(0, 5, (1, 2, 4, 4)))


# -- depthwise convolution -----------------------------------------------------------------------


@device
@pytest.mark.parametrize(
    "channels,multiplier,stride,padding,dilation",
    [(6, 1, 1, 1, 1), (6, 1, 2, 1, 1), (4, 2, 1, 0, 1), (4, 1, 2, 2, 2), (3, 3, (2, 1), (1, 0), 1)],
)
def test_depthwise_conv2d_is_reductions_not_gemms(channels, multiplier, stride, padding, dilation):
    # Forward, input and weight gradients of a depthwise convolution (one input channel per group)
    # run as sums over the taps and over batch x positions: no GEMM kernel launches.
    x, w, b = r(2, channels, 9, 8), r(channels * multiplier, 1, 3, 3), r(channels * multiplier)

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=channels)

    prof = assert_matches_eager(fn, x, w, b, atol=1e-4)
    kinds = {k.name: k.kind for k in prof.kernels}
    assert "gemm" not in kinds.values(), kinds
    ops = {op for k in prof.kernels for op in k.aten_ops}
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= ops, ops


@device
def test_depthwise_conv1d_and_transposed():
    assert_matches_eager(lambda x, w: F.conv1d(x, w, stride=2, padding=1, groups=5), r(3, 5, 11), r(5, 1, 4),
                         atol=1e-4)
    assert_matches_eager(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, groups=4),
                         r(2, 4, 5, 6), r(4, 1, 3, 3), atol=1e-4)


def test_depthwise_convolution_lowers_to_reductions():
    graph = lower(lambda x, w: F.conv2d(x, w, padding=1, groups=8), r(2, 8, 6, 6), r(8, 1, 3, 3))
    assert not any(isinstance(n, ir.Gemm) for n in graph.nodes)
    assert any(isinstance(n, ir.Reduction) and n.reduction_ranges == (3, 3) for n in graph.nodes)
