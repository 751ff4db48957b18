"""TrainingStep: training state stays on the device; host copies are right at the sync points.

Run in copy mode (zero_copy=False: how a GPU with its own memory runs), where deferring matters.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_adreno

pytestmark = pytest.mark.device

COPY = {"zero_copy": False}


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _setup(optimizer: str = "sgd"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    reference = copy.deepcopy(model)

    def make(params):
        if optimizer == "adam":
            return torch.optim.Adam(params, lr=0.01)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    return model, make(model.parameters()), reference, make(reference.parameters())


def _eager_step(model, opt, x, y) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = _loss(model, x, y)
    loss.backward()
    opt.step()
    return loss.detach()


def _batches(n: int):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator))
            for _ in range(n)]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_steps_match_eager_and_only_the_batch_and_loss_cross(optimizer: str) -> None:
    model, opt, reference, reference_opt = _setup(optimizer)
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    for i, (x, y) in enumerate(_batches(6)):
        with torch_adreno.profile() as prof:
            loss = step(x, y)
        expected = _eager_step(reference, reference_opt, x, y)
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
        assert all(p.grad is None for p in model.parameters())
        if i >= 2:  # after warm-up: the batch up, the loss down, nothing else
            minimum = x.numel() * x.element_size() + y.numel() * y.element_size() + loss.element_size()
            copied = prof.bytes_host_to_device + prof.bytes_device_to_host
            assert copied <= 1.05 * minimum, (copied, minimum)
    # Out of date on the host until a sync point, and visibly so.
    assert torch.isnan(model[0].weight.detach().reshape(-1)[0])
    state = model.state_dict()  # a sync point
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)
    optimizer_state = opt.state_dict()["state"]
    for index, p in enumerate(reference.parameters()):
        for key, value in reference_opt.state[p].items():
            torch.testing.assert_close(optimizer_state[index][key], value, rtol=1e-4, atol=1e-5)
    step.close()


def test_synchronize_then_eager_use_and_more_steps() -> None:
    model, opt, reference, reference_opt = _setup()
    batches = _batches(4)
    with torch_adreno.TrainingStep(model, _loss, opt, options=COPY) as step:
        for x, y in batches[:2]:
            step(x, y)
            _eager_step(reference, reference_opt, x, y)
        assert step.synchronize() > 0
        x, y = batches[2]
        with torch.no_grad():  # eager evaluation between steps, after a sync point
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        for x, y in batches[2:]:
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
    # Leaving the block synchronized: the host copies are current.
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="closed"):
        step(*batches[0])


def test_host_changes_between_sync_points_are_refused() -> None:
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    step(x, y)
    step(x, y)
    with torch.no_grad():
        model[2].bias.add_(1.0)
    with pytest.raises(RuntimeError, match="changed on the host"):
        step(x, y)
    # The next sync point reports it too, after restoring the device's values over the change made
    # to an out-of-date copy; training then goes on from them.
    with pytest.raises(RuntimeError, match="discarded"):
        step.synchronize()
    assert not torch.isnan(model[2].bias).any()
    step(x, y)
    step.close()
    assert not any(torch.isnan(p).any() for p in model.parameters())


def test_misuse_is_refused_with_a_reason() -> None:
    model, opt, _, _ = _setup()
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    x, y = _batches(1)[0]
    _loss(model, x, y).backward()
    with pytest.raises(ValueError, match="zero_grad"):
        step(x, y)
    opt.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="do not require gradients"):
        step(x.requires_grad_(), y)


def test_no_growth_over_many_steps() -> None:
    """Deferred entries and the gradients' device copies are replaced, not accumulated."""
    from torch_adreno.runtime import get_residency, get_runtime

    model, opt, _, _ = _setup()
    residency = get_residency(get_runtime(), False)
    step = torch_adreno.TrainingStep(model, _loss, opt, options=COPY)
    batches = _batches(2)
    sizes = []
    for i in range(30):
        step(*batches[i % 2])
        if i in (5, 29):
            sizes.append((len(residency), residency.resident_bytes(), residency.deferred_tensors,
                          get_runtime().pool.allocated_bytes))
    assert sizes[0] == sizes[1], sizes
    step.close()
    assert residency.deferred_tensors == 0


@pytest.mark.parametrize("options", [COPY, {}], ids=["copies", "default"])
def test_batchnorm_statistics_are_deferred_and_synchronized(options) -> None:
    """The forward's own in-place updates (running statistics) follow the same sync points."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    with torch_adreno.TrainingStep(model, _loss, opt, options=options) as step:
        for _ in range(4):
            x, y = torch.randn(8, 3, 8, 8, generator=generator), torch.randint(0, 5, (8,), generator=generator)
            torch.testing.assert_close(step(x, y), _eager_step(reference, reference_opt, x, y), rtol=1e-4, atol=1e-5)
        state = model.state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)
