"""A replayed step's memory, planned before anything is allocated (:class:`StepMemory`).

The memory made during the step is packed by one plan spanning the whole step
(:func:`~torch_adreno.replay.memory.plan_step_memory`); its slots, the seeds and (where copied) the
batch are laid out in the arena's buffers within the largest allocation of the device or target
(:func:`~torch_adreno.replay.memory.arena_layout`), proved against the recorded operations where
asked (:func:`~torch_adreno.replay.memory.verify_step_memory`), and the step's device footprint is
held to the limits, so that a step that cannot fit is refused before any of it is allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch_adreno.memory.footprint import DeviceFootprint, MemoryLimits
from torch_adreno.replay.batch import BatchMode
from torch_adreno.replay.capture import StepRecorder
from torch_adreno.replay.memory import (
    ArenaLayout,
    StepMemoryPlan,
    arena_layout,
    plan_step_memory,
    step_footprint,
    verify_step_memory,
)
from torch_adreno.replay.options import ReplayOptions

__all__ = ["StepMemory", "step_memory"]


@dataclass(frozen=True)
class StepMemory:
    """Where a replay's memory goes, before any of it is allocated. Invariants: ``arena`` lays out
    ``plan``'s slots in buffers of at most ``limits``' largest allocation, and ``footprint`` (the
    images the kernels read not yet counted: they are made at binding) fits ``limits``."""

    #: The slots of the memory made during the step (identities whose lifetimes overlap never share one).
    plan: StepMemoryPlan
    #: Where the slots, the seeds and (copied) the batch lie in the arena's buffers.
    arena: ArenaLayout
    #: The largest allocation and global memory the replay is held to.
    limits: MemoryLimits
    #: The device memory the step holds, without its images.
    footprint: DeviceFootprint


def step_memory(recorder: StepRecorder, loss_identity: int, mode: BatchMode, name_of: Callable[[Any, str], str],
                options: ReplayOptions) -> StepMemory:
    """The memory of ``recorder``'s step (its loss, ``loss_identity``, kept to the end; the batch
    in the arena unless ``mode`` binds it in place) within ``options.limits`` (None: the device's); a
    :class:`~torch_adreno.errors.DeviceMemoryError` where it cannot fit (persistent tensors named
    by ``name_of(tensor, label)``), a :class:`~torch_adreno.memory.verify.MemoryPlanError` where
    ``options.verify_memory`` finds a value the layout destroys before its last read."""
    keep_to_end = {loss_identity}
    plan = plan_step_memory(recorder, keep_to_end, options.share_memory)
    runtime = recorder.runtime
    limits = options.limits or MemoryLimits.of(runtime.profile)
    # The memory made during the step, the seeds and the batch's own copy live in the arena, each at
    # a fixed offset (internal identities at their slot's) of one of its buffers, each within the limit.
    arena = arena_layout(recorder, plan, mode is not BatchMode.IN_PLACE, runtime.device.mem_base_addr_align // 8,
                         limits)
    if options.verify_memory:
        verify_step_memory(recorder, arena, keep_to_end)
    return StepMemory(plan, arena, limits, step_footprint(recorder, arena, [], limits, name_of))
