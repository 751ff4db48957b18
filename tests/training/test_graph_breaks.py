"""A TrainingStep trains a loss with graph breaks as torch.compile does: in pieces, the host code
between them, not replayed, with one warning naming the first break; a Python float from
``.item()`` is a float32 scalar on the device."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.errors import LoweringError
from torch_adreno.lowering import lower_graph

pytestmark = pytest.mark.device


class Branch(nn.Module):
    """A branch on a tensor's value: Dynamo cannot make it one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.sum() > 0:  # BREAK
            h = h * 0.5
        return self.b(h)


class DataDependentSize(nn.Module):
    """A guard on a size only the data decides (``nonzero``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        chosen = (h[:, 0] > 0).nonzero()
        if chosen.size(0) > 0:  # BREAK
            h = h + 1.0
        return self.b(h)


class SharedAcrossPieces(nn.Module):
    """A layer used before and after the break (its gradient summed by autograd on the host) and
    BatchNorm statistics updated in the first piece."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(8, 8), nn.Linear(8, 4), nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.a(x)))
        if h.mean() > 0:  # BREAK
            h = self.a(h) * 0.5
        return self.b(h)


class ItemScale(nn.Module):
    """A value read with ``.item()`` and used as a Python float: one graph, the float a device scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        scale = h.mean().item()
        return self.b(h / (1.0 + abs(scale)))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def _batches(steps: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    return [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(steps)]


def _break_line(model_class: type) -> int:
    import inspect

    lines, first = inspect.getsourcelines(model_class)
    return first + next(i for i, line in enumerate(lines) if "# BREAK" in line)


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
@pytest.mark.parametrize("model_class", [Branch, DataDependentSize, SharedAcrossPieces])
def test_a_loss_with_a_graph_break_trains_in_pieces_like_eager(model_class, zero_copy, caplog):
    torch.manual_seed(0)
    model = model_class()
    reference = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     {"zero_copy": zero_copy})
    with caplog.at_level(logging.WARNING, logger="torch_adreno"), torch_adreno.profile() as prof:
        for x, y in _batches():
            eager_opt.zero_grad()
            expected = _loss(reference, x, y)
            expected.backward()
            eager_opt.step()
            torch.testing.assert_close(step(x, y), expected.detach(), rtol=1e-5, atol=1e-6)
    step.synchronize()
    for ours, theirs in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert prof.kernel_launches > 0 and prof.host_fallback_ops == []
    assert step.replayed_steps == 0
    where = f"{__file__}:{_break_line(model_class)}"
    (reason,) = step.unreplayable_reasons
    assert reason.startswith(f"the loss has a graph break at {where} (") and "runs in pieces" in reason, reason
    warnings = [r.getMessage() for r in caplog.records if "graph break" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and where in warnings[0], warnings


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copies"])
def test_an_item_used_as_a_float_stays_in_the_graph_and_replays(zero_copy):
    torch.manual_seed(0)
    model = ItemScale()
    reference = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1), {"zero_copy": zero_copy})
    for x, y in _batches():
        eager_opt.zero_grad()
        expected = _loss(reference, x, y)
        expected.backward()
        eager_opt.step()
        torch.testing.assert_close(step(x, y), expected.detach(), rtol=1e-5, atol=1e-6)
    step.synchronize()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert step.replayed_steps == 3 and step.unreplayable_reasons == ()


def test_torch_compile_takes_a_changing_python_float_as_a_float64_scalar_input():
    """Plain torch.compile: ``.item()`` breaks the graph and the float enters the next graph as a
    0-dim float64 input from its second value on (Dynamo's automatic dynamism)."""
    torch.manual_seed(0)
    model = ItemScale()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="adreno")
    opt, eager_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    with torch_adreno.profile() as prof:
        for x, y in _batches():
            for m, o in ((compiled, opt), (reference, eager_opt)):
                o.zero_grad()
                _loss(m, x, y).backward()
                o.step()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert prof.kernel_launches > 0


def _graph_of(fn, *inputs):
    return torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake")(*inputs)


def test_a_float64_scalar_is_computed_in_float32_and_a_float64_tensor_is_refused():
    """Stage test: the lowering takes a 0-dim float64 input as a float32 scalar the caller converts
    (named in ``float64_inputs``), and refuses a float64 tensor (its precision would be lost)."""
    graph = lower_graph(_graph_of(lambda x, s: x * (s.abs() + 1).float(), torch.randn(3),
                                  torch.tensor(2.0, dtype=torch.float64)), Config.from_options({}), "scalar")
    (scalar,) = graph.float64_inputs
    assert graph.buffers[scalar].dtype.value == "f32"
    with pytest.raises(LoweringError, match="float64"):
        lower_graph(_graph_of(lambda x: x * 2, torch.randn(3, dtype=torch.float64)), Config.from_options({}), "tensor")
