"""The memory verifier: proves that a memory plan never destroys a value that is still to be read.

A plan is checked against what actually runs: the launches in order, each with the buffers it
reads and writes (:attr:`KernelSource.writes`), every buffer resolved to its storage (an arena
slot, a donated input's bytes, an input's own memory, storage of its own) and, when it is known,
which inputs of a call share memory (two saved views of one buffer). The check replays the
launches over those storages, tracking which value each storage holds:

* every read must find the value its producer wrote (or the caller's input) still in its bytes;
* a write may only evict values with no read left, none the caller still holds (its inputs, the
  graph's outputs), unless the plan declares the write an element-wise in-place update of a value
  the same launch reads for the last time.

The first violation raises :class:`MemoryPlanError` naming the launch, the storage and the two
values. :func:`verify_accesses` is the engine; :func:`torch_adreno.kernels.verify.verify_program`
checks one graph's rendered launches against its plan with it, and the replay its whole-step plan
(:func:`torch_adreno.replay.memory.verify_step_memory`). Both run on every compiled graph and every
captured step when the ``verify_memory`` option is on (the test suite turns it on).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from torch_adreno.errors import AdrenoError


class MemoryPlanError(AdrenoError):
    """A memory plan overwrites a value that is still to be read (a torch_adreno bug: please
    report the message; ``options={'memory_reuse': False}`` avoids it meanwhile)."""


@dataclass(frozen=True)
class Access:
    """One launch (or copy): its name for messages, the values it reads and those it writes."""

    label: str
    reads: tuple[Hashable, ...]
    writes: tuple[Hashable, ...]
    #: value written -> the value read by this same access whose bytes it takes over element by
    #: element (declared by the plan: legal only where that is the value's last read).
    in_place: Mapping[Hashable, Hashable] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Where a value lives: a storage key and the byte range ``[start, stop)`` in it."""

    storage: Hashable
    start: int
    stop: int

    def overlaps(self, other: Placement) -> bool:
        return self.storage == other.storage and self.start < other.stop and other.start < self.stop


def verify_accesses(accesses: Sequence[Access], placement: Callable[[Hashable], Placement],
                    initial: Sequence[Hashable], kept: Collection[Hashable],
                    where: str) -> None:
    """Raise :class:`MemoryPlanError` unless every read of ``accesses`` sees the value last written
    for it. ``initial``: values present before the first access (inputs); ``kept``: values that
    must survive the last access (outputs, inputs the caller still holds). ``where`` names the
    graph or step in messages."""
    last_read: dict[Hashable, int] = {}
    for index, access in enumerate(accesses):
        for value in access.reads:
            last_read[value] = index
    resident: dict[Hashable, dict[Hashable, Placement]] = {}
    evicted: dict[Hashable, tuple[Hashable, str]] = {}

    def put(value: Hashable) -> None:
        at = placement(value)
        resident.setdefault(at.storage, {})[value] = at
        evicted.pop(value, None)

    for value in initial:
        put(value)
    for index, access in enumerate(accesses):
        for value in access.reads:
            at = placement(value)
            if value not in resident.get(at.storage, {}):
                by, label = evicted.get(value, (None, "before it was written"))
                cause = f"{label} wrote {by} over it" if by is not None else "nothing wrote it " + label
                raise MemoryPlanError(f"{where}: {access.label} reads {value} from {at.storage}, but {cause}")
        for value in access.writes:
            at = placement(value)
            for other, other_at in list(resident.get(at.storage, {}).items()):
                if other == value or not at.overlaps(other_at):
                    continue
                still_read = last_read.get(other, -1) > index or other in kept
                read_here = other in access.reads
                if read_here and access.in_place.get(value) == other and not last_read.get(other, -1) > index \
                        and other not in kept:
                    pass  # declared element-wise in place over its last read
                elif still_read or read_here:
                    later = next((a.label for a in accesses[index + 1:] if other in a.reads), None)
                    why = (f"read later by {later}" if later is not None
                           else "needed after the last launch" if other in kept else "read by the same launch")
                    raise MemoryPlanError(
                        f"{where}: {access.label} writes {value} into {at.storage} "
                        f"[{at.start}, {at.stop}) over {other} [{other_at.start}, {other_at.stop}), which is {why}")
                del resident[at.storage][other]
                evicted[other] = (value, access.label)
            put(value)
    for value in kept:
        at = placement(value)
        if value not in resident.get(at.storage, {}):
            by, label = evicted.get(value, (None, "never"))
            raise MemoryPlanError(f"{where}: {value} must outlive the last launch, but {label} wrote {by} over it")


__all__ = ["Access", "MemoryPlanError", "Placement", "verify_accesses"]
