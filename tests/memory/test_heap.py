"""The device heap: regions of slabs, returned once nothing references them (runtime/heap.py)."""

from __future__ import annotations

import gc
import itertools

import pyopencl as cl
import pytest

from torch_adreno.runtime import heap as heap_module
from torch_adreno.runtime.heap import DeviceHeap, placement

pytestmark = pytest.mark.device


@pytest.fixture(scope="module")
def context() -> cl.Context:
    return cl.create_some_context(interactive=False)


def _ranges(buffers: list[cl.Buffer]) -> list[tuple[int, int]]:
    return sorted((placement(b)[1], placement(b)[1] + b.size) for b in buffers)


def test_regions_are_aligned_disjoint_and_in_one_slab(context) -> None:
    heap = DeviceHeap(context, base_alignment=128, max_allocation=1 << 30)
    buffers = [heap.allocate(n) for n in (0, 1, 100, 256, 257, 4096)]
    ranges = _ranges(buffers)
    assert all(start % heap.alignment == 0 for start, _ in ranges)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(ranges))
    assert len({id(placement(b)[0]) for b in buffers}) == 1
    assert [b.size for b in buffers] == [1, 1, 100, 256, 257, 4096]
    assert heap.reserved_bytes == heap_module.SLAB_BYTES


def test_a_region_returns_only_once_its_buffer_is_unreferenced(context) -> None:
    heap = DeviceHeap(context, base_alignment=128, max_allocation=1 << 30)
    first, second = heap.allocate(1000), heap.allocate(1000)
    kept = [first]  # another holder (a replay, an image entry) keeps the region
    del first
    gc.collect()
    assert heap.used_bytes == 2 * 1024
    third = heap.allocate(1000)
    assert placement(third)[1] == 2048  # not over the kept region
    del kept[:], second
    assert heap.used_bytes == 1024
    # The freed ranges merge: a region as large as both fits at the start.
    assert placement(heap.allocate(2048))[1] == 0


def test_an_empty_slab_is_released_and_a_large_request_gets_its_own(context) -> None:
    heap = DeviceHeap(context, base_alignment=128, max_allocation=1 << 30)
    small = heap.allocate(64)
    large = heap.allocate(heap_module.SLAB_BYTES + 1)
    assert placement(large)[0] is not placement(small)[0]
    assert heap.reserved_bytes == heap_module.SLAB_BYTES + heap_module.SLAB_BYTES + heap.alignment
    del large
    assert heap.used_bytes == heap.alignment
    assert heap.reserved_bytes == heap_module.SLAB_BYTES
    del small
    heap.collect()
    assert heap.reserved_bytes == 0


def test_groups_take_regions_from_slabs_of_their_own(context) -> None:
    heap = DeviceHeap(context, base_alignment=128, max_allocation=1 << 30)
    a, b, c = heap.allocate(64, "a"), heap.allocate(64, "b"), heap.allocate(64, "a")
    assert placement(a)[0] is placement(c)[0] is not placement(b)[0]
    assert heap.reserved_bytes == 2 * heap_module.SLAB_BYTES
    del b
    assert heap.reserved_bytes == heap_module.SLAB_BYTES


def test_regions_hold_what_is_written_to_them(context) -> None:
    import numpy as np

    heap = DeviceHeap(context, base_alignment=128, max_allocation=1 << 30)
    queue = cl.CommandQueue(context)
    buffers = [heap.allocate(4 * n) for n in (3, 70, 5)]
    values = [np.arange(b.size // 4, dtype=np.float32) + 100 * i for i, b in enumerate(buffers)]
    for buffer, value in zip(buffers, values, strict=True):
        cl.enqueue_copy(queue, buffer, value)
    slab, _ = placement(buffers[0])
    whole = np.empty(slab.size // 4, dtype=np.float32)
    cl.enqueue_copy(queue, whole, slab)
    for buffer, value in zip(buffers, values, strict=True):
        start = placement(buffer)[1] // 4
        assert np.array_equal(whole[start:start + value.size], value)


def test_persistent_copies_are_heap_regions(context) -> None:
    """The residency puts parameters' device copies (copy mode) in the heap, in the current group's
    slabs; batches get buffers of their own (a slab's live sub-buffers make its enqueues dearer)."""
    import torch

    from torch_adreno.runtime import get_residency, get_runtime

    runtime = get_runtime(None)
    residency = get_residency(runtime, zero_copy=False)
    weight, batch = torch.randn(8, 8), torch.randn(4, 8)
    assert placement(residency.buffer_for(weight, pinned=True, graph="g", buffer="w")) is not None
    assert placement(residency.buffer_for(batch, pinned=False, graph="g", buffer="x")) is None
    from torch_adreno.runtime.residency import StepContext

    group = object()
    with residency.in_step(StepContext(heap_group=group)):
        other = torch.randn(8, 8)
        in_group = placement(residency.buffer_for(other, pinned=True, graph="g", buffer="w2"))
    assert residency.heap_group is None and not residency.deferring
    assert in_group is not None and in_group[0] is not placement(residency.buffer_for(weight, pinned=True,
                                                                                       graph="g", buffer="w"))[0]
    assert group is not None
