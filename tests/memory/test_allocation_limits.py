"""Every allocation within the target's limits.

A replayed step's arena larger than the largest single allocation is split into several buffers
(no slot straddling two), the heap's slabs are held to the target's limit, the step's device
footprint is reported and refused above the target's global memory, and a single tensor above the
largest allocation is refused naming it. The device tests record every ``cl.Buffer`` (and every
image of its own) created while a small network trains through ``TrainingStep`` under a copy of the
adreno740 profile whose largest allocation is 16 KiB. The full sizes (MobileNetV2 at 224x224,
batch 32, adreno740) take far too long on a CPU: ``benchmarks/allocation_limits.py`` runs them.
"""

from __future__ import annotations

import itertools

import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F

import torch_adreno
from torch_adreno.errors import DeviceMemoryError
from torch_adreno.memory.intervals import AllocationLimitError, split_into_buffers
from torch_adreno.targets import profiles

#: The reduced profile's largest allocation: every tensor of the model below fits, its step's
#: arena (about 80 KiB) does not.
SMALL_LIMIT = 16 << 10


def _loss(model, x, y):
    return F.cross_entropy(model(x), y)


def _model() -> torch.nn.Module:
    """Two linear layers: GEMMs with image operands (the profile prefers images), reductions and
    an SGD update with momentum, in few kernels (each is built cold in CI)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def _batches(n: int):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 3, 4, 4, generator=generator), torch.randint(0, 10, (32,), generator=generator))
            for _ in range(n)]


@pytest.fixture
def derived_target(monkeypatch):
    """A function registering a copy of adreno740's profile with some limits changed (undone after
    the test)."""
    def derive(name: str, **changes) -> str:
        monkeypatch.setitem(profiles.TARGETS, name, profiles.derive_target(
            "adreno740", name, "test: a reduced copy of adreno740", **changes))
        return name

    return derive


@pytest.fixture
def allocations(monkeypatch):
    """Bytes of every ``cl.Buffer`` and of every image of its own (not over a buffer) created while
    the test runs, whichever module makes them."""
    made: dict[str, list[int]] = {"buffers": [], "images": []}

    class RecordedBuffer(cl.Buffer):
        def __init__(self, context, flags, size=0, hostbuf=None):
            made["buffers"].append(size if hostbuf is None else memoryview(hostbuf).nbytes)
            if hostbuf is None:
                super().__init__(context, flags, size)
            else:
                super().__init__(context, flags, size, hostbuf)

    create_image = cl.create_image

    def recorded_image(context, flags, format, shape=None, pitches=None, hostbuf=None, **kwargs):
        made["images"].append(format.itemsize * int(torch.tensor(shape).prod()))
        return create_image(context, flags, format, shape=shape, pitches=pitches, hostbuf=hostbuf, **kwargs)

    monkeypatch.setattr(cl, "Buffer", RecordedBuffer)
    monkeypatch.setattr(cl, "create_image", recorded_image)
    return made


def _train(target: str, options: dict, steps: int = 4, replay: bool = True):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = torch_adreno.TrainingStep(model, _loss, optimizer, options={"target": target, **options}, replay=replay)
    with torch_adreno.profile() as prof:
        losses = torch.stack([step(x, y) for x, y in _batches(steps)])
    # Copy mode: the state's host copies stayed out of date through the capture (measuring the
    # footprint reads no tensor, which would have synchronized it), until now.
    assert step.synchronize() > 0 or step._residency.zero_copy
    assert step.replayed_steps == (steps - 2 if replay else 0)
    return losses, [p.detach().clone() for p in model.parameters()], step, prof


# -- the split, without a device ------------------------------------------------------------------


def test_blocks_split_into_buffers_within_the_capacity_none_straddling():
    sizes = [20_000, 12_000, 9_000, 700, 100, 1]
    split = split_into_buffers(sizes, 32 << 10, 256)
    assert len(split.sizes) > 1 and max(split.sizes) <= 32 << 10
    for (buffer, offset), nbytes in zip(split.placed, sizes, strict=True):
        assert offset % 256 == 0 and offset + nbytes <= split.sizes[buffer]  # within one buffer
    by_buffer = sorted((b, o, -(-n // 256) * 256) for (b, o), n in zip(split.placed, sizes, strict=True))
    assert all(a[0] != b[0] or a[1] + a[2] <= b[1] for a, b in itertools.pairwise(by_buffer))
    # Everything within one buffer: the blocks one after another, as a single arena held them.
    assert split_into_buffers(sizes, 1 << 30, 256).placed == ((0, 0), (0, 20224), (0, 32256), (0, 41472),
                                                              (0, 42240), (0, 42496))
    with pytest.raises(AllocationLimitError, match="block 1 of 40000 bytes"):
        split_into_buffers([10, 40_000], 32 << 10, 256)


@pytest.mark.device
def test_heap_slabs_and_regions_stay_within_the_groups_limit():
    from torch_adreno.runtime.heap import DeviceHeap, HeapGroup, placement

    heap = DeviceHeap(cl.create_some_context(interactive=False), base_alignment=128, max_allocation=1 << 30)
    group = HeapGroup(64 << 10, "target small")
    regions = [heap.allocate(40 << 10, group) for _ in range(3)]
    assert len({id(placement(r)[0]) for r in regions}) == 3  # one 64 KiB slab each, not one of 64 MiB
    assert heap.reserved_bytes == 3 * (64 << 10)
    with pytest.raises(DeviceMemoryError, match="exceeds the largest single allocation of target small"):
        heap.allocate((64 << 10) + 1, group)


# -- on the device --------------------------------------------------------------------------------


@pytest.mark.device
@pytest.mark.parametrize("options", [
    pytest.param({}, id="zero-copy-images"),  # a phone's way: host memory in place, operands through images
    # The arena's buffers as heap regions beside the parameters' copies (a GPU with memory of its own).
    pytest.param({"zero_copy": False, "images": False}, id="copy-heap", marks=pytest.mark.slow)])
def test_no_allocation_exceeds_the_targets_limit_and_the_split_arena_changes_no_bit(
        options, derived_target, allocations):
    small = derived_target("adreno740_32k", max_alloc_bytes=SMALL_LIMIT)
    losses, params, step, prof = _train(small, options)
    replay = step.replay
    assert allocations["buffers"] and max(allocations["buffers"]) <= SMALL_LIMIT
    assert max(allocations["images"], default=0) <= SMALL_LIMIT
    copied_images = {id(image.image) for image in replay._bound.operations.images if not image.shared}
    assert len(allocations["images"]) >= len(copied_images)  # each image of its own was recorded
    assert len(replay.arena.parts) > 1 and max(replay.arena.parts) <= SMALL_LIMIT
    assert len(replay._buffers.arenas) == len(replay.arena.parts)
    if options:  # copy mode: the arena's buffers are heap regions, each of a slab within the limit
        from torch_adreno.runtime.heap import placement

        assert all(placement(arena) is not None for arena in replay._buffers.arenas)
    footprint = step.device_footprint
    assert footprint is prof.device_footprint and footprint.fits
    assert footprint.arena_buffers == replay.arena.parts
    assert footprint.largest_allocation_bytes <= SMALL_LIMIT
    assert footprint.total_bytes == (footprint.persistent_bytes + footprint.arena_bytes + footprint.image_bytes
                                     + footprint.graph_arena_bytes)
    assert footprint.persistent_bytes >= 2 * sum(p.numel() * 4 for p in params)  # parameters + momentum
    assert step.memory_limits.max_allocation_bytes == SMALL_LIMIT
    # The compiled graphs the replay was captured from (no arena: each slot a buffer of its own; a
    # replay is bit-identical to them, tests/replay/test_replay.py): the same bits.
    compiled_losses, compiled_params, _, _ = _train(small, options, replay=False)
    assert torch.equal(losses, compiled_losses)
    assert all(torch.equal(a, b) for a, b in zip(params, compiled_params, strict=True))


@pytest.mark.device
def test_a_footprint_above_the_targets_global_memory_is_refused_before_the_replay_allocates(
        derived_target, monkeypatch):
    from torch_adreno.replay import bound_step

    state_bytes = 2 * sum(p.numel() * 4 for p in _model().parameters())  # parameters and momentum
    tight = derived_target("adreno740_tight", global_mem_bytes=state_bytes + (8 << 10))
    arenas_made = []
    monkeypatch.setattr(bound_step, "StepBuffers", lambda *args: arenas_made.append(args))
    model = _model()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     options={"target": tight})
    batches = _batches(2)
    step(*batches[0])  # the compiled graphs (the state alone fits)
    with pytest.raises(DeviceMemoryError) as refused:
        step(*batches[1])  # the capture: its replay would need more than the global memory
    message = str(refused.value)
    assert "the training step on a batch of [32, 3, 4, 4], [32] needs" in message
    assert "more than the global memory" in message and "target adreno740_tight" in message
    assert "smaller batch" in message and "activation_memory_budget" in message and "16-bit storage" in message
    assert step.replay is None and step.replayed_steps == 0 and step.device_footprint is None
    assert arenas_made == []  # refused before the replay allocated its arena


@pytest.mark.device
def test_state_above_the_global_memory_is_refused_before_the_first_step(derived_target, allocations):
    tiny = derived_target("adreno740_tiny", global_mem_bytes=4 << 10)
    model = _model()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.05), options={"target": tiny})
    state = f"{sum(p.numel() * 4 for p in model.parameters()):,}"
    with pytest.raises(DeviceMemoryError, match=rf"parameters, buffers and optimizer state alone take {state} bytes "
                                                r".*more than the global memory of target adreno740_tiny"):
        step(*_batches(1)[0])
    assert allocations["buffers"] == []  # nothing compiled, nothing allocated


@pytest.mark.device
def test_a_parameter_above_the_largest_allocation_is_refused_naming_it(derived_target, allocations):
    small = derived_target("adreno740_8k", max_alloc_bytes=8 << 10)
    model = _model()
    step = torch_adreno.TrainingStep(model, _loss, torch.optim.SGD(model.parameters(), lr=0.05), options={"target": small})
    with pytest.raises(DeviceMemoryError, match=r"1\.weight \(\[64, 48\], torch\.float32\) takes 12,288 bytes "
                                                r"\(12\.0 KiB\) on the device, more than the largest single allocation "
                                                r"of target adreno740_8k \(8,192 bytes.*split the layer"):
        step(*_batches(1)[0])
    assert allocations["buffers"] == []


@pytest.mark.device
def test_an_activation_above_the_largest_allocation_is_refused_naming_its_fx_node(derived_target):
    small = derived_target("adreno740_4k", max_alloc_bytes=4 << 10)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    compiled = torch.compile(model, backend="adreno", options={"target": small})
    with pytest.raises(DeviceMemoryError, match=r"the output of FX node relu \(aten\.relu\.default, module 1\) in "
                                                r"forward_\d+ \(buffer buf\d+\), shape \[64, 64\] F32, needs 16384 bytes, "
                                                r"more than the largest single allocation of target adreno740_4k "
                                                r"\(4096 bytes, 4\.0 KiB\).* a smaller batch"):
        compiled(torch.randn(64, 8))

