"""GEMMs of too few 128 x 128 tiles to fill a desktop GPU are split in k
(fusion/split_k.py ``choose_large_tile_split``), and so are outputs too narrow for those tiles
(``choose_small_output_split``): the rules without a device, and on the device forward and
gradients against eager with the rules forced on (the CPU runs the direct template, where the
kernels stage makes no 128 x 128 tiles)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno import ir
from torch_adreno.frontend import adreno_backend
from torch_adreno.fusion import split_k
from torch_adreno.fusion.schedule import FusionGroup
from torch_adreno.fusion.specs import GemmKernel
from torch_adreno.fusion.split_k import SplitPolicy
from torch_adreno.kernels import KernelChoices

F32 = ir.DType.F32


def _gemm(m: int, n: int, k: int, batch: int = 1) -> ir.Gemm:
    mv, nv, kv = ir.Var("m", m), ir.Var("n", n), ir.Var("k", k)
    return ir.Gemm("g", "out", batch, m, n, k, ir.Load("a", (mv, kv), F32), ir.Load("c", (kv, nv), F32), (mv, nv), ())


@pytest.mark.parametrize(("m", "n", "k", "split", "why"), [
    (1024, 768, 768, 5, "GPT-2's attention projection: 48 tiles, 5 slices make 240 work-groups on 132 units"),
    (1024, 768, 3072, 5, "GPT-2's MLP projection: the same tiles, longer k"),
    (512, 784, 4608, 9, "ResNet-18's last convolution: 28 tiles"),
    (1024, 768, 128, 2, "k = 128: slices no shorter than 64"),
    (1024, 2304, 768, 1, "144 tiles: a whole wave already (splitting gains nothing)"),
    (64, 50176, 576, 1, "64 rows: no 128 x 128 tile"),
])
def test_gemms_of_fewer_large_tiles_than_compute_units_are_split_to_fill_them_twice(m, n, k, split, why) -> None:
    assert split_k.choose_large_tile_split(_gemm(m, n, k), 132) == split, why


@pytest.mark.parametrize(("m", "n", "k", "split", "why"), [
    (384, 64, 3136, 44, "MobileNetV2's 1x1 weight gradient at 14 x 14: 6 tiles of 64 x 64, 44 slices of 72"),
    (128, 64, 12544, 132, "ResNet-18's 1x1 downsampling weight gradient: 2 tiles"),
    (8, 768, 1024, 16, "a LoRA factor's gradient: 12 tiles, slices no shorter than 64"),
    (64, 576, 50176, 29, "ResNet-18's first-stage weight gradient: 9 tiles (choose_split cuts it in 64 already)"),
    (1024, 768, 768, 1, "both extents fill 128 x 128 tiles: choose_large_tile_split's"),
    (64, 50176, 576, 1, "784 tiles: more than the compute units"),
    (32, 32, 63, 1, "k under one slice"),
])
def test_outputs_too_small_for_large_tiles_are_split_to_fill_the_compute_units(m, n, k, split, why) -> None:
    assert split_k.choose_small_output_split(_gemm(m, n, k), 132) == split, why


def test_the_small_output_split_is_applied_beside_the_traffic_bound_one() -> None:
    # 384 x 64 over k = 3,136: the traffic bound allows 4 slices; the small-output rule makes 44.
    graph = ir.Graph("g")
    gemm = _gemm(384, 64, 3136)
    graph.buffers["out"] = ir.Buffer("out", (384, 64), F32)
    group = FusionGroup("k0", GemmKernel(gemm, []), [gemm], ["a", "c"], ["out"])
    decisions: list = []
    split_k.split_long_gemms(graph, [group], decisions, SplitPolicy(132, fill_units=None))
    assert group.spec.split_k == 4, "without the large tiles (a phone) the traffic bound holds"
    group = FusionGroup("k0", GemmKernel(gemm, []), [gemm], ["a", "c"], ["out"])
    split_k.split_long_gemms(graph, [group], decisions, SplitPolicy(132, fill_units=132))
    assert group.spec.split_k == 44 and "two work-groups" in decisions[-1].reason


def _filling(compute_units: int):
    """The backend with the split-K fill rules on, filling (as if) ``compute_units`` compute units,
    whatever the device's template (the CPU's direct template makes no 128 x 128 tiles itself)."""

    def choose(choices: KernelChoices) -> KernelChoices:
        return dataclasses.replace(choices, split=dataclasses.replace(choices.split, fill_units=compute_units))

    return functools.partial(adreno_backend, kernel_choices=choose)


@pytest.mark.device
def test_a_narrow_linear_layer_split_to_fill_follows_eager() -> None:
    # The weight gradient's 40 x 300 outputs: 5 tiles of 64 x 64 on (as if) 8 compute units: k = 512
    # cut into 3 slices.
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = torch.nn.Linear(300, 40)
    x = torch.randn(512, 300, requires_grad=True)
    compiled = torch.compile(lambda x: torch.tanh(layer(x)), backend=_filling(8), options={"compile_cache": False})
    with torch_adreno.profile() as prof:
        y = compiled(x)
        y.square().sum().backward()
    torch._dynamo.reset()
    assert [k.name for k in prof.kernels if "splitsum" in k.name and k.graph.startswith("backward")]
    ours = (y.detach(), x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    y64 = torch.tanh(F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    y64.square().sum().backward()
    reference = (y64.detach(), x.grad, layer.weight.grad, layer.bias.grad)
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    ye = torch.tanh(layer(x))
    ye.square().sum().backward()
    eager = (ye.detach(), x.grad, layer.weight.grad, layer.bias.grad)
    for o, r, e in zip(ours, reference, eager, strict=True):
        assert (o.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-6


@pytest.mark.device
def test_a_filled_linear_layer_forward_and_gradients_follow_eager() -> None:
    # 200 x 200 outputs: 4 tiles of 128 x 128 on (as if) 8 compute units: k = 300 cut into 4 slices.
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = torch.nn.Linear(300, 200)
    x = torch.randn(200, 300, requires_grad=True)
    compiled = torch.compile(lambda x: F.gelu(layer(x)), backend=_filling(8), options={"compile_cache": False})
    with torch_adreno.profile() as prof:
        y = compiled(x)
        y.square().sum().backward()
    torch._dynamo.reset()
    assert [k.name for k in prof.kernels if "splitsum" in k.name and k.graph.startswith("forward")]
    ours = (y.detach(), x.grad.clone(), layer.weight.grad.clone())
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    y64 = F.gelu(F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    y64.square().sum().backward()
    reference = (y64.detach(), x.grad, layer.weight.grad)
    x.grad, layer.weight.grad = None, None
    ye = F.gelu(layer(x))
    ye.square().sum().backward()
    eager = (ye.detach(), x.grad, layer.weight.grad)
    for o, r, e in zip(ours, reference, eager, strict=True):
        assert (o.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-6
