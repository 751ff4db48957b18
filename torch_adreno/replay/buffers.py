"""Where each memory identity of a replayed step lives: the arena (allocated here), the
persistent tensors' buffers, or a batch binding.

The arena holds the memory made during the step, the seeds and (unless bound in place) the batch,
each at its fixed offset (:class:`~torch_adreno.replay.memory.ArenaLayout`) of one of its
buffers (one, or several where one would exceed the largest single allocation). Where the
persistent tensors are device copies (heap regions), the arena is a region of the same heap group,
so that the kernels reach it and them in one slab through one argument. Otherwise it is buffers of
its own: with zero-copy the parameters are host memory, and a slab would only reserve memory (a
phone's). A replay binding kernels as compiled (images, or arena kernels off) binds sub-buffers of
its arena: then too the arena is a buffer of its own, their parent (NVIDIA's OpenCL driver
crashes releasing such sub-buffers made over a slab; over a buffer of their own it does not).
"""

from __future__ import annotations

from collections.abc import Hashable

import pyopencl as cl

from torch_adreno.replay.batch import BatchBinding
from torch_adreno.replay.capture import BATCH, IdentityKind, StepRecorder
from torch_adreno.replay.memory import ArenaLayout
from torch_adreno.runtime.device import DeviceRuntime
from torch_adreno.runtime.heap import device_heap, placement


class StepBuffers:
    """The buffers of one replayed step's identities. ``buffers`` maps each persistent identity to
    its buffer and each batch identity to its own buffer (None: bound by each replay, or in the
    arena); internal identities and seeds are in the arena, whose buffers are ``arenas`` (one per
    buffer of the layout, each at most the layout's largest buffer: heap regions of at most the
    group's allocation limit, or buffers of their own)."""

    def __init__(self, runtime: DeviceRuntime, recorder: StepRecorder, layout: ArenaLayout, in_heap: bool,
                 heap_group: Hashable) -> None:
        self.layout = layout
        self.arenas: list[cl.Buffer] = []
        #: Per arena buffer: (the buffer a kernel takes, the arena's byte offset in it): a heap
        #: region's slab and the region's offset, or the buffer itself and 0.
        self.arena_bases: list[tuple[cl.Buffer, int]] = []
        for nbytes in layout.parts:
            if in_heap:
                arena = device_heap(runtime).allocate(nbytes, heap_group)
                located = placement(arena)
                assert located is not None
            else:
                arena = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
                located = arena, 0
            self.arenas.append(arena)
            self.arena_bases.append(located)
        self.buffers: dict[int, cl.Buffer | None] = {
            i.index: i.buffer for i in recorder.identities if i.kind is IdentityKind.PERSISTENT}
        self._persistent = {i.index for i in recorder.identities if i.kind is IdentityKind.PERSISTENT}
        self._nbytes = {identity.index: identity.nbytes for identity in recorder.identities}
        self._sub_buffers: dict[int, cl.Buffer] = {}

    @property
    def slabs(self) -> list[cl.Buffer]:
        """The buffers kernels take for the arena, in the arena's order (distinct: two arena buffers
        may be regions of one slab)."""
        return list({id(base): base for base, _ in self.arena_bases}.values())

    def located(self, index: int) -> tuple[cl.Buffer, int] | None:
        """Where identity ``index``'s bytes are as (slab, byte offset), if in a heap region or the
        arena (a persistent tensor's device copy); None for any other buffer (a batch bound in
        place, host memory shared in place)."""
        if index in self.layout.offset_of:
            part, offset = self.layout.where(index)
            base, start = self.arena_bases[part]
            return base, start + offset
        if index in self._persistent:
            buffer = self.buffers[index]
            assert buffer is not None
            return placement(buffer)
        return None

    def place(self, index: int) -> tuple[cl.Buffer, int]:
        """The buffer holding identity ``index`` and its byte offset there."""
        if index in self.layout.offset_of:
            part, offset = self.layout.where(index)
            return self.arenas[part], offset
        buffer = self.buffers[index]
        if buffer is None:
            raise ValueError("a batch argument bound in place is copied within the step")
        return buffer, 0

    def buffer(self, index: int) -> cl.Buffer:
        """A buffer of identity ``index`` alone (a sub-buffer of the arena where it lives there)."""
        if index not in self.layout.offset_of:
            buffer = self.buffers[index]
            assert buffer is not None
            return buffer
        if index not in self._sub_buffers:
            nbytes = max(self._nbytes[index], 1)
            base, start = self.located(index) or (None, 0)
            assert base is not None
            # (A sub-buffer of the slab: OpenCL makes none of a sub-buffer.)
            self._sub_buffers[index] = base.get_sub_region(start, nbytes)
        return self._sub_buffers[index]

    def batch_bindings(self, recorder: StepRecorder, in_place: bool) -> dict[int, BatchBinding]:
        """A binding per batch identity of the recording, by identity index (``in_place``: its
        buffer is None and each replay binds one; else its place in the arena)."""
        bindings: dict[int, BatchBinding] = {}
        for identity in recorder.identities:
            if identity.kind is not BATCH:
                continue
            assert identity.tensor is not None and identity.view is not None
            own = tuple(identity.tensor.shape), tuple(identity.tensor.stride()), identity.tensor.storage_offset()
            base = recorder.batch[identity.batch_position]
            whole = own == (tuple(base.shape), tuple(base.stride()), base.storage_offset())
            binding = BatchBinding(identity.batch_position, None if whole else identity.view, identity.nbytes,
                                   identity.label, None)
            if not in_place:
                binding.buffer, binding.offset = self.place(identity.index)
            bindings[identity.index] = binding
            self.buffers[identity.index] = binding.buffer if in_place else None
        return bindings
