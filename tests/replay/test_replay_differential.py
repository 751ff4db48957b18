"""The replayed step computes what the captured one does: random small graphs (layouts, permutes,
strides, reductions over leading dimensions, convolutions of every stride and kernel size) trained
with replay on and off agree bit for bit, and ``verify_replay`` checks each replayed step against
the compiled graphs; a planted fault in a replay is found and named."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno
from torch_adreno.errors import OptionError, ReplayMismatchError

pytestmark = pytest.mark.device

CHANNELS, SIZE, CLASSES, BATCH = 3, 12, 5, 2


class Block(nn.Module):
    """One random layer: ``kind`` names it, ``module`` holds its parameters (if any)."""

    def __init__(self, kind: str, module: nn.Module | None = None, **settings: int) -> None:
        super().__init__()
        self.kind, self.module, self.settings = kind, module, settings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.kind
        if self.module is not None and kind != "channels_norm":
            return self.module(x)
        if kind == "channels_norm":  # ConvNeXt's LayerNorm over channels, between permutes
            return self.module(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if kind == "channels_last_scale":
            return (x.permute(0, 2, 3, 1) * 1.5).permute(0, 3, 1, 2)
        if kind == "transpose":
            return x.transpose(2, 3) + 0.25
        if kind == "center_channels":
            return x - x.mean(dim=1, keepdim=True)
        if kind == "normalize_rows":
            return x / (x.std(dim=2, keepdim=True) + 1.0)
        if kind == "row_sums":
            return x + 0.1 * x.sum(dim=2, keepdim=True)
        if kind == "every_other_row":
            return x[:, :, ::2, :]
        if kind == "flatten_back":
            n, c, h, w = x.shape
            return torch.tanh(x.reshape(n, c, h * w)).reshape(n, c, h, w)
        if kind == "gelu":
            return F.gelu(x)
        raise AssertionError(kind)


def random_model(seed: int) -> nn.Module:
    """A small random network over NCHW images; every layer keeps the spatial size at least 1."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    channels, height, width = CHANNELS, SIZE, SIZE
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(["conv", "conv", "channels_norm", "channels_last_scale", "transpose", "center_channels",
                           "normalize_rows", "row_sums", "every_other_row", "flatten_back", "batch_norm", "pool",
                           "gelu"])
        if kind == "conv":
            kernel, stride = rng.randint(1, 4), rng.randint(1, 3)
            padding = rng.randint(0, kernel // 2)
            if (height + 2 * padding - kernel) // stride + 1 < 1 or (width + 2 * padding - kernel) // stride + 1 < 1:
                continue
            out = rng.choice([4, 6, 8])
            layers.append(Block(kind, nn.Conv2d(channels, out, kernel, stride=stride, padding=padding)))
            channels = out
            height = (height + 2 * padding - kernel) // stride + 1
            width = (width + 2 * padding - kernel) // stride + 1
        elif kind == "channels_norm":
            layers.append(Block(kind, nn.LayerNorm(channels)))
        elif kind == "batch_norm":
            layers.append(Block(kind, nn.BatchNorm2d(channels)))
        elif kind == "pool":
            if min(height, width) < 2:
                continue
            layers.append(Block(kind, rng.choice([nn.MaxPool2d(2), nn.AvgPool2d(2)])))
            height, width = height // 2, width // 2
        elif kind == "every_other_row":
            if height < 2:
                continue
            layers.append(Block(kind))
            height = (height + 1) // 2
        elif kind == "transpose":
            layers.append(Block(kind))
            height, width = width, height
        else:
            layers.append(Block(kind))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, CLASSES))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=generator),
             torch.randint(0, CLASSES, (BATCH,), generator=generator)) for _ in range(steps)]


def _train(model: nn.Module, steps: int, replay: bool, options: dict | None = None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss, optimizer, options, replay=replay)
    losses = [step(x, y) for x, y in _batches(steps)]
    step.synchronize()
    return step, losses, {k: v.clone() for k, v in model.state_dict().items()}


SEEDS = list(range(10))


@pytest.mark.parametrize("seed", [*SEEDS, *(pytest.param(s, marks=pytest.mark.slow) for s in range(10, 40))])
def test_random_graph_replays_bit_for_bit_as_captured(seed):
    model = random_model(seed)
    replayed, replayed_losses, replayed_state = _train(copy.deepcopy(model), 5, True, {"verify_replay": 2})
    _, losses, state = _train(model, 5, False)
    assert replayed.replayed_steps == 3, (replayed.unreplayable_reasons, model)
    assert replayed.replays_verified == 2
    assert [loss.item() for loss in replayed_losses] == [loss.item() for loss in losses], model
    for name, value in state.items():
        assert torch.equal(replayed_state[name], value), (name, model)


def test_a_replay_whose_memory_plan_overlaps_two_live_values_is_named(monkeypatch):
    """A planted fault: the replay (not its reference) puts two values that live at the same time in
    one slot. verify_replay raises, naming the first kernel whose output differs."""
    import torch_adreno.replay.memory as memory
    import torch_adreno.replay.step_memory as step_memory

    planned = memory.plan_step_memory

    def overlapping(recorder, keep, shared=True):
        plan = planned(recorder, keep, shared)
        if not shared:
            return plan
        by_start = sorted(plan.slot_of, key=lambda i: plan.lifetimes[i])
        for first in by_start:
            start, end = plan.lifetimes[first]
            second = next((i for i in by_start if i != first and start < plan.lifetimes[i][0] < end
                           and recorder.identities[i].nbytes >= 64 and recorder.identities[first].nbytes >= 64), None)
            if second is not None:
                slot_of, sizes = dict(plan.slot_of), list(plan.slot_bytes)
                slot_of[second] = slot_of[first]
                sizes[slot_of[first]] = max(sizes[slot_of[first]], recorder.identities[second].nbytes)
                return memory.StepMemoryPlan(slot_of, tuple(sizes), plan.lifetimes, plan.unshared_bytes,
                                             plan.full_path_bytes)
        raise AssertionError("no two overlapping values to plant the fault on")

    monkeypatch.setattr(step_memory, "plan_step_memory", overlapping)
    with pytest.raises(ReplayMismatchError, match=r"the first kernel whose output differs from its reference: "
                                                  r"operation \d+ \(forward_\d+ kernel .*\) wrote "):
        _train(random_model(3), 4, True, {"verify_replay": 2, "verify_memory": False})


def test_a_recording_that_misses_host_work_is_told_apart_from_a_kernel_fault(monkeypatch):
    """A planted fault of the other kind: the weight gradient of a convolution fed by a permuted
    LayerNorm copied on the host (as before gradients took their parameter's layout), with the
    recorder's guard against host-made gradients off. Every kernel agrees with its reference;
    the error says the recording lacks work."""
    import torch_adreno.frontend.partition as partition
    from torch_adreno.replay.capture import StepRecorder

    monkeypatch.setattr(partition, "gradient_strides", lambda joint, backward: ())
    monkeypatch.setattr(StepRecorder, "_is_gradient", lambda self, value: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=3), Block("channels_norm", nn.LayerNorm(8)),
                          nn.Conv2d(8, 8, 2, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES))
    with pytest.raises(ReplayMismatchError, match="every recorded operation agrees with its reference, so the "
                                                  "recording lacks work the compiled graphs do"):
        _train(model, 4, True, {"verify_replay": 2, "compile_cache": False})


@pytest.mark.parametrize("value", [-1, "x", 1.5, True])
def test_verify_replay_takes_a_number_of_steps(value):
    with pytest.raises(OptionError, match="verify_replay"):
        torch_adreno.Config.from_options({"verify_replay": value})
