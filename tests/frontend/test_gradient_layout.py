"""Gradients leave the backward in their parameter's layout, and a step whose values are made on
the host is never replayed as if they were persistent.

The model: ConvNeXt's LayerNorm over channels (permute to channels-last, LayerNorm, permute back)
feeding a strided convolution, whose weight gradient eager computes channels-last. Returned in
that layout, it was copied on the host (into eager's strides, then by autograd into the
parameter's): in a copy-mode step from a gradient whose values were still on the device (NaN
from the second step), and in a replay not at all (the capture's copy was bound as if it were
persistent state: the weights drifted from the fourth step).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition

import torch_adreno
from torch_adreno.frontend.gradient_layout import gradient_strides, non_overlapping_and_dense


class ChannelsLayerNorm(nn.Module):
    """``ConvNextLayerNorm(data_format="channels_first")`` as transformers writes it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _convnext_toy(kernel: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), ChannelsLayerNorm(16), nn.Conv2d(16, 32, kernel, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _train_against_eager(model: nn.Module, loss_fn, batches, options=None) -> torch_adreno.TrainingStep:
    reference = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    step = torch_adreno.TrainingStep(model, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), options)
    for number, batch in enumerate(batches):
        eager_opt.zero_grad()
        expected = loss_fn(reference, *batch)
        expected.backward()
        eager_opt.step()
        loss = step(*batch)
        assert torch.isfinite(loss), f"step {number}: loss {float(loss)}"
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6, msg=f"step {number}")
    step.synchronize()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    return step


def _batches(steps: int, shape=(4, 3, 32, 32), classes: int = 10):
    torch.manual_seed(1)
    return [(torch.randn(shape), torch.randint(0, classes, (shape[0],))) for _ in range(steps)]


def test_a_gradient_takes_its_parameter_layout_not_eagers_kernel_layout():
    """Stage test: the backward's weight gradient is traced channels-last; it is asked for in the
    weight's own (contiguous) strides, and an input's gradient in the input's."""
    captured = {}

    def partition(joint, inputs, **kwargs):
        fw, bw = default_partition(joint, inputs, **kwargs)
        captured["strides"] = gradient_strides(joint, bw)
        captured["traced"] = [None if n is None else tuple(n.meta["val"].stride())
                              for n in next(n for n in bw.graph.nodes if n.op == "output").args[0]]
        return fw, bw

    def conv(x, weight):
        return F.conv2d(x.permute(0, 3, 1, 2), weight, stride=2)

    x = torch.randn(2, 8, 8, 16, requires_grad=True)
    weight = torch.randn(32, 16, 2, 2, requires_grad=True)
    compiled = aot_function(conv, fw_compiler=lambda gm, _: gm, partition_fn=partition)
    compiled(x, weight).sum().backward()
    assert captured["traced"][1] == (64, 1, 32, 16), "eager's kernel gives the weight gradient channels-last"
    assert captured["strides"] == ((1024, 128, 16, 1), (64, 4, 2, 1))


@pytest.mark.parametrize(("shape", "strides", "dense"), [
    ((2, 3), (3, 1), True), ((2, 3), (1, 2), True), ((4, 1, 3), (3, 7, 1), True),
    ((2, 3), (4, 1), False), ((2, 3), (0, 1), False), ((2, 2), (1, 1), False)])
def test_non_overlapping_and_dense(shape, strides, dense):
    assert non_overlapping_and_dense(shape, strides) is dense


@pytest.mark.device
@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
@pytest.mark.parametrize("kernel", [2, 3])
def test_layer_norm_between_permutes_then_strided_convolution_trains_replayed_like_eager(zero_copy, kernel):
    """10 replayed steps follow eager within 1e-5; with copies (a discrete GPU's residency) the
    gradient is read where the step wrote it, not from a host copy nothing wrote."""
    step = _train_against_eager(_convnext_toy(kernel), _loss, _batches(12), {"zero_copy": zero_copy})
    assert step.replayed_steps == 10, step.unreplayable_reasons
    assert step.unreplayable_reasons == ()


@pytest.mark.device
def test_transformers_convnext_trains_replayed_like_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                         num_labels=5, patch_size=4)
    torch.manual_seed(0)
    model = transformers.ConvNextForImageClassification(config)

    def loss_fn(model, x, y):
        return F.cross_entropy(model(pixel_values=x).logits, y)

    step = _train_against_eager(model, loss_fn, _batches(12, (2, 3, 32, 32), 5))
    assert step.replayed_steps == 10, step.unreplayable_reasons
