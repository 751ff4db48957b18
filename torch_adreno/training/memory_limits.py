"""The memory limits a :class:`~torch_adreno.TrainingStep` is held to.

A step compiled for a target (``options={"target": "adreno740"}``) is held to the target's largest
single allocation and global memory, narrowed to the present device's where those are smaller
(:func:`torch_adreno.targets.profiles.compile_profile`); without a target, to the present device's.
Three places hold it there:

- before the first step, :meth:`StepMemory.check_state` refuses a parameter, buffer or optimizer
  state tensor larger than the largest allocation (naming it) and a state larger than the global
  memory;
- the step's device heap group (:attr:`StepMemory.heap_group`) makes no slab or region larger than
  the largest allocation;
- a capture's replay splits its arena into buffers within the largest allocation and refuses a
  footprint above the global memory before it allocates anything
  (:mod:`torch_adreno.replay.step`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_adreno.memory.footprint import MemoryLimits, check_state_fits
from torch_adreno.runtime.heap import HeapGroup
from torch_adreno.targets import DeviceProfile


class StepMemory:
    """One step's limits and heap group, and the check of its training state (made once)."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.limits = MemoryLimits.of(profile)
        #: The step's device heap group: its parameters, optimizer state and replay arenas share slabs
        #: no other step's tensors are in (see :mod:`torch_adreno.runtime.heap`), each within the limit.
        self.heap_group = HeapGroup(self.limits.max_allocation_bytes, self.limits.owner)
        self._checked = False

    def check_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    name_of: Callable[[torch.Tensor], str | None]) -> None:
        """The first time: each parameter, buffer and optimizer state tensor within the largest
        allocation, all of them within the global memory (a
        :class:`~torch_adreno.errors.DeviceMemoryError` naming the tensor, or giving the total,
        otherwise). A storage several tensors share (tied weights) counts once."""
        if self._checked:
            return
        state = [(name_of(value) or key, value) for entry in optimizer.state.values()
                 for key, value in entry.items() if isinstance(value, torch.Tensor)]
        named: dict[int, tuple[str, int]] = {}
        for name, tensor in (*model.named_parameters(), *model.named_buffers(), *state):
            if tensor.numel() and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                named.setdefault(storage.data_ptr(), (f"{name} ({list(tensor.shape)}, {tensor.dtype})",
                                                      storage.nbytes()))
        check_state_fits(named.values(), self.limits, "TrainingStep")
        self._checked = True


__all__ = ["StepMemory"]
