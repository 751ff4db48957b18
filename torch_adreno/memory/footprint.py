"""A training step's device memory against the limits of the device or target it is compiled for.

Two limits decide whether a step can run on a GPU (both from :class:`~torch_adreno.targets.DeviceProfile`,
narrowed to a target's by :func:`torch_adreno.targets.profiles.compile_profile`):

- the largest single allocation, ``CL_DEVICE_MAX_MEM_ALLOC_SIZE`` (1 GiB on Adreno 7xx drivers):
  every buffer and image is at most that; a replay's arena larger than it is split into several
  buffers (:func:`torch_adreno.memory.intervals.split_into_buffers`), a single tensor larger than it
  is refused (:func:`check_allocations`, naming it);
- the global memory, ``CL_DEVICE_GLOBAL_MEM_SIZE`` (5.4 GiB on an Adreno 750 phone): everything the
  step holds at once, its :class:`DeviceFootprint`, is at most that (:meth:`DeviceFootprint.check`).

Both refusals are :class:`~torch_adreno.errors.DeviceMemoryError` s that say what would make the
step fit. Nothing here talks to OpenCL or torch: callers pass sizes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch_adreno.errors import DeviceMemoryError
from torch_adreno.targets import DeviceProfile

#: What makes a step's memory smaller, for the refusals' messages.
FIT_ADVICE = (
    "a smaller batch (activations, gradients and the arena grow with it); "
    "options={'activation_memory_budget': 0.5} (the forward keeps fewer activations for the backward "
    "and recomputes cheap ones there); or 16-bit storage (float16 / bfloat16 parameters and "
    "activations: torch.autocast, or a model in 16 bits), which halves their bytes"
)


def human_bytes(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it at least 1 (for messages)."""
    value, unit = float(nbytes), "bytes"
    for larger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:,.1f} {unit}" if unit != "bytes" else f"{nbytes} bytes"


@dataclass(frozen=True)
class MemoryLimits:
    """The two limits a step is held to, and whose they are (for messages)."""

    max_allocation_bytes: int
    global_memory_bytes: int
    #: "target adreno740" or "the device <name>".
    owner: str

    @staticmethod
    def of(profile: DeviceProfile) -> MemoryLimits:
        """The limits of ``profile``: a target's (already the tighter of target and device) or the
        present device's."""
        owner = f"target {profile.target}" if profile.target else f"the device {profile.name!r}"
        return MemoryLimits(profile.max_alloc_bytes, profile.global_mem_bytes, owner)


def check_allocations(tensors: Iterable[tuple[str, int]], limits: MemoryLimits, what: str) -> None:
    """Refuse the first of ``tensors`` (name, bytes) larger than the largest single allocation:
    each is one buffer on the device (a parameter, buffer or optimizer state tensor of ``what``)
    and no buffer may exceed ``CL_DEVICE_MAX_MEM_ALLOC_SIZE``."""
    for name, nbytes in tensors:
        if nbytes > limits.max_allocation_bytes:
            raise DeviceMemoryError(
                f"{what}: {name} takes {nbytes:,} bytes ({human_bytes(nbytes)}) on the device, more than the largest "
                f"single allocation of {limits.owner} ({limits.max_allocation_bytes:,} bytes, "
                f"{human_bytes(limits.max_allocation_bytes)}); one tensor is one buffer, which cannot be split across "
                "allocations. Make it smaller: split the layer into several parameters (a linear layer into "
                "row blocks, an embedding table into several tables), store it in 16 bits (half its bytes), "
                "or compile for a target with a larger limit")


def check_state_fits(tensors: Iterable[tuple[str, int]], limits: MemoryLimits, what: str) -> int:
    """:func:`check_allocations` over ``tensors`` (name, bytes: the training state a step keeps on
    the device), and refuse them where they alone exceed the global memory; returns their bytes."""
    listed = list(tensors)
    check_allocations(listed, limits, what)
    total = sum(n for _, n in listed)
    if total > limits.global_memory_bytes:
        raise DeviceMemoryError(
            f"{what}: its parameters, buffers and optimizer state alone take {total:,} bytes ({human_bytes(total)}), "
            f"more than the global memory of {limits.owner} ({limits.global_memory_bytes:,} bytes, "
            f"{human_bytes(limits.global_memory_bytes)}). To fit: 16-bit storage of the parameters (half their bytes), "
            "fewer trainable parameters (frozen ones carry no gradient or optimizer state: LoRA adapters), "
            "or a smaller model")
    return total


@dataclass(frozen=True)
class DeviceFootprint:
    """Device bytes a replayed training step holds while it exists (what a phone must have free).

    ``persistent_bytes``: parameters, buffers, optimizer state and graph constants the step reads
    (device copies, or host memory the GPU uses in place: on a phone both are the same DRAM);
    ``arena_buffers``: the bytes of each buffer of the replay's arena (the memory made during the
    step: activations, gradients, scratch, seeds, the batch's copy); ``image_bytes``: images the
    replay holds of its own (an image made over a buffer's memory takes none);
    ``graph_arena_bytes``: the arenas of the compiled graphs the step was captured from, which
    stay allocated while the compiled graphs exist (a failed guard runs them again).

    Invariant: every arena buffer, image and persistent tensor is at most
    ``largest_allocation_bytes``, which :meth:`check` holds to the limit."""

    persistent_bytes: int
    arena_buffers: tuple[int, ...]
    image_bytes: int
    graph_arena_bytes: int
    largest_allocation_bytes: int
    limits: MemoryLimits

    @property
    def arena_bytes(self) -> int:
        return sum(self.arena_buffers)

    @property
    def total_bytes(self) -> int:
        return self.persistent_bytes + self.arena_bytes + self.image_bytes + self.graph_arena_bytes

    @property
    def fits(self) -> bool:
        return (self.total_bytes <= self.limits.global_memory_bytes
                and self.largest_allocation_bytes <= self.limits.max_allocation_bytes)

    def describe(self) -> str:
        buffers = len(self.arena_buffers)
        return (f"{self.total_bytes:,} bytes ({human_bytes(self.total_bytes)}) of {self.limits.owner}'s "
                f"{self.limits.global_memory_bytes:,} ({human_bytes(self.limits.global_memory_bytes)}): persistent state "
                f"{human_bytes(self.persistent_bytes)}, the replay's arena {human_bytes(self.arena_bytes)} in {buffers} "
                f"buffer{'s' if buffers != 1 else ''}, images {human_bytes(self.image_bytes)}, the compiled graphs' "
                f"arenas {human_bytes(self.graph_arena_bytes)}; largest allocation {human_bytes(self.largest_allocation_bytes)} "
                f"(limit {human_bytes(self.limits.max_allocation_bytes)})")

    def check(self, what: str) -> None:
        """Raise :class:`DeviceMemoryError` unless the footprint fits the limits (``what`` names
        the step in the message)."""
        if self.largest_allocation_bytes > self.limits.max_allocation_bytes:
            raise DeviceMemoryError(
                f"{what}: one of its buffers or images takes {self.largest_allocation_bytes:,} bytes, more than the "
                f"largest single allocation of {self.limits.owner} ({self.limits.max_allocation_bytes:,}); "
                f"to fit: {FIT_ADVICE}")
        if self.total_bytes > self.limits.global_memory_bytes:
            raise DeviceMemoryError(
                f"{what} needs {self.describe()}: more than the global memory. To fit: {FIT_ADVICE}")


__all__ = ["FIT_ADVICE", "DeviceFootprint", "MemoryLimits", "check_allocations", "check_state_fits", "human_bytes"]
