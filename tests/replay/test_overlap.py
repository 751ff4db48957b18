"""A replayed step that returns once its loss is read (option ``replay_overlap``, where the batch is
copied to the device): its batch and seeds go up into a second device buffer on a queue of their
own, the step copies them into place after the previous step, and the device finishes the backward
and the optimizer after the call returned. Results must be the bits of a step that waits for all
of itself, and of the compiled graphs.

These run unprofiled: under ``torch_adreno.profile()`` a replay enqueues launch by launch and waits
for all of itself (the replay tests' ``_train`` profiles)."""

from __future__ import annotations

import pytest
import torch
from helpers import cross_entropy_loss as _loss

import torch_adreno
from torch_adreno.replay.launch_list import Copy, Launch

pytestmark = pytest.mark.device

COPY = {"zero_copy": False}
WHOLE = {**COPY, "replay_overlap": False}


def _mlp(dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 5))


def _batches(n: int, batch: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 12, generator=generator), torch.randint(0, 5, (batch,), generator=generator))
            for _ in range(n)]


def _run(options: dict, batches, dropout: float = 0.0, replay: bool = True):
    """Losses and state after training on ``batches`` unprofiled (each step a fresh batch tensor,
    as a loader hands them out), and the step."""
    model = _mlp(dropout)
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     options=options, replay=replay)
    torch.manual_seed(3)
    losses = torch.stack([step(x.clone(), y.clone()) for x, y in batches])
    step.synchronize()  # (right after the last call: the device may still be running it)
    return losses, {k: v.clone() for k, v in model.state_dict().items()}, step


def _assert_bit_identical(a, b) -> None:
    assert torch.equal(a[0], b[0]), (a[0], b[0])
    for key in a[1]:
        assert torch.equal(a[1][key], b[1][key]), key


def _staged(monkeypatch) -> None:
    """Pinned staging, what a device with memory of its own uses, forced on a CPU runtime (as
    test_replay.py's staged tests do)."""
    from torch_adreno.replay import step as replay_module

    monkeypatch.setattr(replay_module, "step_batch_mode", lambda *_: replay_module.BatchMode.STAGED)


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-seeds", "dropout-seeds"])
@pytest.mark.parametrize("staged", [False, True], ids=["uploaded", "staged"])
def test_overlapped_steps_are_bit_identical_to_whole_steps_and_the_compiled_graphs(monkeypatch, dropout, staged) -> None:
    if staged:
        _staged(monkeypatch)
    batches = _batches(8)
    full = _run(COPY, batches, dropout, replay=False)
    whole = _run(WHOLE, batches, dropout)
    overlapped = _run(COPY, batches, dropout)
    replay = overlapped[2].replay
    assert overlapped[2].replayed_steps == whole[2].replayed_steps == 6
    assert replay.overlap_refused is None and replay.enqueue_path.endswith("returns once the loss is read")
    assert whole[2].replay.overlap_refused == "off: replay_overlap=False"
    # Every replayed step's batch (and seeds) went up through the second buffer; none of the whole steps'.
    assert replay.batch_input.landed_steps == 6 and whole[2].replay.batch_input.landed_steps == 0
    assert replay.batch_input.staging_buffers == (1 if staged else 0) and replay.batch_input.staged_seeds == (1 if staged and dropout else 0)
    _assert_bit_identical(full, whole)
    _assert_bit_identical(full, overlapped)


def test_the_step_copies_the_second_buffer_into_place_first_and_reads_the_loss_before_its_backward() -> None:
    *_, step = _run(COPY, _batches(4))
    operations = step.replay._operations.operations
    landing, arena = operations[0], step.replay.batch_input.arena
    assert isinstance(landing, Copy) and landing.destination is arena and landing.source is not arena
    read = next(i for i, op in enumerate(operations) if not isinstance(op, Launch | Copy) and callable(op))
    # The backward (and the optimizer step after it) is enqueued after the loss read.
    backward = [i for i, op in enumerate(operations) if isinstance(op, Launch) and op.name.startswith("backward")]
    assert backward and min(backward) > read, (read, backward)


def test_zero_copy_and_profiled_steps_wait_for_the_whole_step() -> None:
    batches = _batches(5)
    *_, step = _run({"zero_copy": "auto"}, batches)
    if step.replay.runtime.profile.unified_memory:
        assert step.replay.overlap_refused.startswith("zero-copy")
    with torch_adreno.profile() as prof:
        *_, copied = _run(COPY, batches)
    assert copied.replay.overlap_refused is None and prof.replayed_steps == 3
    assert copied.replay.batch_input.landed_steps == 0  # profiled: uploaded in place, launch by launch
    assert "launch by launch" in prof.table() and prof.replay_enqueue == copied.replay.enqueue_path


def test_two_overlapped_steps_interleave_bit_identically() -> None:
    """Two TrainingSteps, each replay on a queue of its own, alternate: each waits for the other's
    step still running, and the compiled path of one (its first calls) for the other's."""
    results = []
    for replay in (False, True):
        models = [_mlp(0.3), _mlp(0.0)]
        steps = [torch_adreno.TrainingStep(m, _loss, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           options=COPY, replay=replay) for m in models]
        torch.manual_seed(3)
        generator = torch.Generator().manual_seed(3)
        losses = []
        for _ in range(8):
            for step in steps:
                x, y = torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator)
                losses.append(step(x, y))
        for step in steps:
            step.synchronize()
        results.append((torch.stack(losses), {f"{i}.{k}": v.clone() for i, m in enumerate(models)
                                              for k, v in m.state_dict().items()}))
        if replay:
            assert all(s.replayed_steps == 6 and s.replay.overlap_refused is None for s in steps)
    _assert_bit_identical(results[0], results[1])


def _token_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Flatten(), torch.nn.Linear(24, 3))


def test_an_index_error_of_the_forward_is_raised_by_the_overlapped_step_that_made_it() -> None:
    model = _token_model()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.1), options=COPY)
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 10, (4, 3), generator=generator), torch.randint(0, 3, (4,), generator=generator))
               for _ in range(5)]
    for x, y in batches[:3]:
        step(x, y)
    assert step.replayed_steps == 1 and step.replay.overlap_refused is None
    bad = batches[3][0].clone()
    bad[1, 2] = 10  # == the vocabulary
    with pytest.raises(IndexError, match=r"index 10 is out of bounds.*with size 10.*aten\.embedding"):
        step(bad, batches[3][1])
    loss = step(*batches[4])  # the record was cleared: the next step runs
    assert torch.isfinite(loss) and step.replayed_steps == 2  # (the call that raised returned nothing)
    step.synchronize()
    step.close()
