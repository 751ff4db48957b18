"""Claimed ops that only OpInfo's first samples covered: forward and gradients on the device against
eager PyTorch, on the inputs where their lowerings can go wrong (zeros in products, halves in
rounding, signs in modulo, repeated indices, negative padding, strided and channels_last layouts),
each asserting that the op itself was part of a launched kernel."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager

import torch_adreno

pytestmark = pytest.mark.device


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def check(fn: Callable[..., Any], *inputs: Any, ops: set[str], grad: bool = True, **tolerance: float) -> None:
    """``fn`` compiled matches eager (forward and gradients) and kernels of ``ops`` launched."""
    prof = assert_matches_eager(fn, *inputs, grad=grad, **tolerance)
    launched = {o for k in prof.kernels for o in k.aten_ops}
    assert ops <= launched, (sorted(ops - launched), sorted(launched))


def with_zeros(x: torch.Tensor, *positions: tuple[int, ...]) -> torch.Tensor:
    x = x.clone()
    for p in positions:
        x[p] = 0.0
    return x


# -- products ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("zeros", [(), ((1, 2),), ((1, 2), (3, 2), (0, 4))], ids=["no-zero", "one-zero", "zeros"])
def test_cumprod(dim, zeros):
    x = with_zeros(r(5, 7), *zeros)
    check(lambda x: torch.cumprod(x, dim), x, ops={"aten.cumprod.default"})


def test_cumprod_of_a_3d_middle_dim():
    check(lambda x: torch.cumprod(x, 1), r(3, 6, 4) * 0.9, ops={"aten.cumprod.default"})


@pytest.mark.parametrize("zeros", [(), ((2, 3),), ((2, 3), (2, 5))], ids=["no-zero", "one-zero", "two-zeros"])
def test_prod_all_and_along_dims(zeros):
    # Values near 1 keep the product of 35 numbers in float32's comfortable range.
    x = with_zeros(1 + 0.3 * r(5, 7), *zeros)
    check(torch.prod, x, ops={"aten.prod.default"})
    check(lambda x: torch.prod(x, 1), x, ops={"aten.prod.dim_int"})
    check(lambda x: torch.prod(x, 0, keepdim=True), x, ops={"aten.prod.dim_int"})


# -- binary math --------------------------------------------------------------------------------

def test_atan2_in_every_quadrant_and_broadcast():
    y, x = r(6, 1), r(1, 5)
    check(torch.atan2, y, x, ops={"aten.atan2.default"})
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 2.0, -2.0])
    check(torch.atan2, signs, signs.roll(1) + 0.5, ops={"aten.atan2.default"})


# Divisors and dividends of both signs: fmod takes the dividend's sign, remainder the divisor's.
@pytest.mark.parametrize("op", [torch.fmod, torch.remainder], ids=["fmod", "remainder"])
def test_modulo_of_tensors_and_scalars(op):
    name = op.__name__
    a = r(6, 5) * 4
    b = torch.where(torch.rand(6, 5) < 0.5, -1.0, 1.0) * (0.5 + torch.rand(6, 5))
    check(op, a, b, ops={f"aten.{name}.Tensor"})
    check(lambda a: op(a, 1.5), a, ops={f"aten.{name}.Scalar"})
    check(lambda a: op(a, -1.5), a, ops={f"aten.{name}.Scalar"})


@pytest.mark.parametrize("op", [torch.fmod, torch.remainder], ids=["fmod", "remainder"])
def test_modulo_of_integers(op):
    a = torch.tensor([[7, -7, 7, -7, 0, 13], [5, -5, 3, -3, 9, -9]])
    b = torch.tensor([[3, 3, -3, -3, 4, 5], [2, 2, -2, -2, -4, 4]])
    check(op, a, b, ops={f"aten.{op.__name__}.Tensor"}, grad=False)
    check(lambda a: op(a, 3), a, ops={f"aten.{op.__name__}.Scalar"}, grad=False)


# -- rounding ---------------------------------------------------------------------------------

HALVES = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997, 1e7 + 0.5, 3.7, -3.7, 0.0])


@pytest.mark.parametrize(("fn", "op"), [
    (torch.round, "aten.round.default"),
    (torch.floor, "aten.floor.default"),
    (torch.ceil, "aten.ceil.default"),
    (torch.trunc, "aten.trunc.default"),
    (torch.sign, "aten.sign.default"),
], ids=["round", "floor", "ceil", "trunc", "sign"])
def test_rounding_at_halves_and_signs(fn, op):
    # Gradients are zero everywhere: checked too (a lowering must not pass the incoming gradient).
    check(fn, HALVES, ops={op})
    check(lambda x: fn(x) * x, r(4, 9) * 3, ops={op})


@pytest.mark.parametrize("decimals", [2, -1])
def test_round_to_decimals(decimals):
    x = torch.tensor([1.005, 2.675, -0.125, 15.0, 25.0, -35.0, 123.456])
    check(lambda x: torch.round(x, decimals=decimals), x, ops={"aten.round.decimals"})


# -- exponentials -----------------------------------------------------------------------------

def test_exp2_and_log2():
    check(torch.exp2, r(4, 7) * 3, ops={"aten.exp2.default"})
    check(torch.log2, torch.rand(4, 7) * 10 + 1e-3, ops={"aten.log2.default"})
    check(torch.exp2, torch.tensor([-130.0, -10.0, 0.0, 10.0, 127.0]), ops={"aten.exp2.default"})


# -- advanced indexing ------------------------------------------------------------------------

def test_indexing_with_repeated_and_negative_indices_and_its_backward():
    """x[idx] reads a row many times: the backward accumulates (index_put with accumulate)."""
    idx = torch.tensor([3, 0, 3, -1, 3])
    check(lambda x: x[idx], r(6, 4), ops={"aten.index.Tensor"})
    check(lambda x: x[:, idx], r(3, 6), ops={"aten.index.Tensor"})
    rows, cols = torch.tensor([[0, 2], [2, 2]]), torch.tensor([[1, 1], [-1, 0]])
    check(lambda x: x[rows, cols], r(4, 5), ops={"aten.index.Tensor"})
    check(lambda x: x[rows, :, cols], r(4, 2, 5), ops={"aten.index.Tensor"})


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_forward_and_gradients_of_both_inputs(accumulate):
    # Repeated indices only with accumulate: without it, which write wins is undefined in eager too.
    idx = torch.tensor([4, 1, 4, 0]) if accumulate else torch.tensor([4, 1, 0])

    def put(x, v):
        return torch.index_put(x * 1.5, (idx,), v * 2, accumulate=accumulate)

    check(put, r(6, 3), r(len(idx), 3), ops={"aten.index_put.default"})
    rows, cols = torch.tensor([0, 2, 2]), torch.tensor([1, 1, 3]) if accumulate else torch.tensor([1, 0, 3])
    check(lambda x, v: torch.index_put(x, (rows, cols), v, accumulate=accumulate), r(3, 4), r(3),
          ops={"aten.index_put.default"})


# -- padding and scatters ---------------------------------------------------------------------

@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 3), (-1, 2, 0, -2), (1, 1, 2, 2, 1, 0)],
                         ids=["last-dim", "two-dims", "negative-crops", "three-dims"])
def test_constant_pad_nd(pad):
    check(lambda x: F.pad(x, pad, value=-0.75), r(2, 3, 4, 5), ops={"aten.constant_pad_nd.default"})


@pytest.mark.parametrize(("dim", "start", "end", "step"), [(0, 1, 4, 1), (1, 0, 6, 2), (1, -3, None, 1), (2, 1, 3, 1)])
def test_slice_scatter(dim, start, end, step):
    x = r(5, 6, 4)
    length = len(range(*slice(start, end, step).indices(x.shape[dim])))
    src = r(*[length if d == dim else s for d, s in enumerate(x.shape)])
    check(lambda x, s: torch.slice_scatter(x * 2, s, dim, start, end, step), x, src,
          ops={"aten.slice_scatter.default"})


@pytest.mark.parametrize(("dim", "index"), [(0, 2), (1, -1), (2, 0)])
def test_select_scatter(dim, index):
    x = r(3, 4, 5)
    src = r(*[s for d, s in enumerate(x.shape) if d != dim])
    # PyTorch's core decompositions turn select_scatter into a masked where before it is lowered.
    check(lambda x, s: torch.select_scatter(x * 2, s, dim, index), x, src, ops={"aten.where.self"})


def _assign_row(x, v):
    y = x * 2
    y[1:3] = v
    return y


def _assign_column(x, v):
    y = x * 2
    y[:, 1] = v
    return y


def _assign_strided(x, v):
    y = x * 2
    y[:, ::2] = v * 3
    return y.sin()


@pytest.mark.parametrize(("fn", "value_shape"), [(_assign_row, (2, 4)), (_assign_column, (3,)),
                                                 (_assign_strided, (3, 2))], ids=["slice", "select", "strided"])
def test_assignment_into_a_slice_of_an_intermediate_and_its_backward(fn, value_shape):
    """Its backward copies the incoming gradient into a fresh (new_empty_strided) buffer first."""
    check(fn, r(3, 4), r(*value_shape), ops={"aten.new_empty_strided.default"})


def test_index_tensor_built_inside_the_compiled_function():
    """torch.tensor([...]) inside the compiled function is a graph constant the graph carries."""
    check(lambda x: x[torch.tensor([2, 0, 2])], r(4, 3), ops={"aten.index.Tensor"})


# -- instance norm ----------------------------------------------------------------------------

@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_functional(affine):
    x = r(3, 4, 5, 6) * 2 + 1
    weight, bias = (r(4), r(4)) if affine else (None, None)
    inputs = (x, weight, bias) if affine else (x,)

    def norm(x, weight=None, bias=None):
        return F.instance_norm(x, weight=weight, bias=bias, eps=1e-5)

    check(norm, *inputs, ops=set())


def test_instance_norm_module_tracking_running_statistics():
    """InstanceNorm1d(track_running_stats=True) in training mode: output, gradients and the
    running statistics it writes back, as eager."""
    torch.manual_seed(0)
    module = torch.nn.InstanceNorm1d(4, affine=True, track_running_stats=True)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    reference = copy.deepcopy(module)
    x = r(3, 4, 10) * 2 + 1
    weights = torch.linspace(0.5, 1.5, x.numel()).reshape(x.shape)  # distinct gradient per element
    with torch_adreno.profile() as prof:
        out = torch.compile(module, backend="adreno", fullgraph=True)(x)
        (out * weights).sum().backward()
    ref = reference(x)
    (ref * weights).sum().backward()
    assert prof.kernel_launches > 0 and prof.host_fallback_ops == []
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(module, name).grad, getattr(reference, name).grad, rtol=1e-4, atol=1e-5)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(module, name), getattr(reference, name), rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")


# -- convolution layouts ----------------------------------------------------------------------

def _conv(x, w, b):
    return F.conv2d(x, w, b, stride=1, padding=1)


@pytest.mark.parametrize("layout", ["channels_last-input", "channels_last-both", "transposed-input",
                                    "sliced-input", "sliced-weight"])
def test_convolution_of_strided_inputs(layout):
    x, w, b = r(2, 5, 7, 6), r(4, 5, 3, 3), r(4)
    if layout.startswith("channels_last"):
        x = x.to(memory_format=torch.channels_last)
        if layout.endswith("both"):
            w = w.to(memory_format=torch.channels_last)
    elif layout == "transposed-input":
        x = r(2, 5, 6, 7).transpose(2, 3)  # (2, 5, 7, 6) with the last two dims swapped in memory
    elif layout == "sliced-input":
        x = r(2, 10, 7, 12)[:, ::2, :, ::2]
    else:
        w = r(4, 5, 3, 6)[..., ::2]
    assert not x.is_contiguous() or not w.is_contiguous()
    check(_conv, x, w, b, ops={"aten.convolution.default", "aten.convolution_backward.default"})


def test_channels_last_module_trains_like_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, stride=2)).to(memory_format=torch.channels_last)
    reference = copy.deepcopy(model)
    x = r(2, 3, 9, 9).to(memory_format=torch.channels_last)
    out = torch.compile(model, backend="adreno", fullgraph=True)(x)
    ref = reference(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    ref.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
