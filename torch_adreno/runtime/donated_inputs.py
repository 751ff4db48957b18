"""The saved activations a compiled graph may overwrite (donated inputs), checked at each call.

The memory plan places later buffers in a donated input's bytes after its last read
(:mod:`torch_adreno.frontend.donation` decides which inputs are donated and which other inputs
view the same bytes). At each call this makes that safe for the inputs the call really got:
a donor that came as a host tensor, or whose device buffer another input the plan does not know
of shares, gets a scratch block of its size instead (the latter warned: the analysis missed a
view). With ``verify_memory``, each new pattern of inputs sharing memory is first proved by the
memory verifier (:func:`torch_adreno.kernels.verify.verify_program`). After the call every donor
device tensor is marked consumed: its bytes may hold other values now.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torch_adreno.kernels import KernelProgram
from torch_adreno.kernels.verify import verify_program
from torch_adreno.runtime.device_tensor import DeviceTensor
from torch_adreno.runtime.pool import BufferPool


class DonatedInputs:
    """The donated inputs of one compiled graph (see the module docstring)."""

    def __init__(self, program: KernelProgram, input_positions: Mapping[str, int], verify_memory: bool,
                 fills: bool = False) -> None:
        """``fills``: the call fills memory before its first write (verified with the plan)."""
        self.program = program
        self.fills = fills
        self.graph = program.graph
        self._input_positions = input_positions
        self.verify_memory = verify_memory
        self.donors = sorted({a.donor for a in program.plan.allocations.values() if a.donor is not None})
        self._verified_sharing: set[tuple[int, ...]] = set()

    def sharing(self, args: Sequence[Any]) -> dict[str, Any]:
        """Per input, a key of the memory it is bound to, where the call needs one (donors, or the
        verifier); proved by the verifier first when ``verify_memory`` is on."""
        if not (self.donors or self.verify_memory):
            return {}
        keys = self._input_sharing(args, self.verify_memory)
        if self.verify_memory:
            self._verify(args, keys)
        return keys


    def _input_sharing(self, args: Sequence[Any], host_too: bool) -> dict[str, Any]:
        """Per input, a key of the memory it is bound to: equal keys share memory (saved views of
        one device buffer, host views of one storage). Without ``host_too`` only device tensors
        are keyed (what a donation can collide with: only a device tensor's bytes are reused)."""
        keys: dict[str, Any] = {}
        for name, pos in self._input_positions.items():
            value = args[pos]
            if isinstance(value, DeviceTensor):
                keys[name] = ("device", id(value.block))
            elif not host_too:
                continue
            elif isinstance(value, torch.Tensor) and value.numel():
                # The storage's first byte, from data_ptr(): asking for untyped_storage() of a
                # deferred parameter made the residency see it as changed on the host.
                keys[name] = ("host", value.data_ptr() - value.storage_offset() * value.element_size())
            else:
                keys[name] = ("own", name)
        return keys

    def _shares_unplanned(self, donor: str, sharing: dict[str, Any]) -> bool:
        """Whether an input the plan does not know to view ``donor``'s bytes is bound to them."""
        key = sharing.get(donor)
        known = {donor, *self.program.plan.donor_aliases.get(donor, ())}
        return any(k == key and name not in known for name, k in sharing.items())

    def _verify(self, args: Sequence[Any], sharing: dict[str, Any]) -> None:
        groups: dict[Any, int] = {}
        pattern = tuple(groups.setdefault(sharing[name], len(groups)) for name in sorted(sharing))
        if pattern in self._verified_sharing:
            return
        scratch = {d for d in self.donors if self._donor_is_scratch(d, args, sharing)}
        members: dict[Any, list[str]] = {}
        for name in sorted(sharing):
            members.setdefault(sharing[name], []).append(name)
        labels = {name: f"the memory bound to input {' and '.join(members[key])}" for name, key in sharing.items()}
        verify_program(self.program, labels, scratch, self.fills)
        self._verified_sharing.add(pattern)

    def _donor_is_scratch(self, donor: str, args: Sequence[Any], sharing: dict[str, Any]) -> bool:
        return not isinstance(args[self._input_positions[donor]], DeviceTensor) or self._shares_unplanned(donor, sharing)

    def storage(self, donor: str, args: Sequence[Any], storage: dict[str, Any], blocks: dict[str, Any],
                sharing: dict[str, Any], pool: BufferPool) -> Any:
        """The bytes planned inside a saved activation: the activation's own buffer when it came as a
        device tensor that no input the plan does not know of shares. Otherwise a scratch block of
        the same size, so that nothing still to be read is overwritten: when AOTAutograd handed a
        host tensor instead (a view of a forward input it rebuilt), or (warned: the donation analysis
        missed a view) when another input is bound to the same buffer."""
        if isinstance(args[self._input_positions[donor]], DeviceTensor):
            if not self._shares_unplanned(donor, sharing):
                return storage[donor]
            warnings.warn(f"{self.graph.name}: saved tensor {donor} shares its device buffer with another input the "
                      "memory plan does not know of; its bytes are not reused (a torch_adreno bug: please report it)", RuntimeWarning, stacklevel=3)
        key = f"scratch:{donor}"
        if key not in blocks:
            blocks[key] = pool.allocate(self.graph.buffers[donor].nbytes)
        return blocks[key].buffer

    def mark_consumed(self, args: Sequence[Any]) -> None:
        """Every donor that came as a device tensor: its bytes may now hold other values."""
        for donor in self.donors:
            arg = args[self._input_positions[donor]]
            if isinstance(arg, DeviceTensor):
                arg.consumed_by = self.graph.name
