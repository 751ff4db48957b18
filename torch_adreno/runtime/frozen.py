"""16-bit copies of frozen tensors, made once and kept: autocast's casts of a LoRA base model's weights.

Under autocast every matrix product casts its float32 weight to 16 bits, in the forward and again
in the backward, and the GEMM then reads the float32 weight (4 bytes an element) each time. For a
tensor that does not change between steps -- a parameter that requires no grad, a buffer the
graphs do not update -- the backend gives each such cast a graph input of its own
(:mod:`torch_adreno.frontend.frozen_casts`), which :class:`FrozenCopies` fills with the tensor's
16-bit copy: made at the first call, kept, and made again only when the tensor changed.

The copy is an ordinary host tensor made by PyTorch's own cast (``tensor.to(dtype)``: the very
rounding eager autocast does, so results are bit-identical to casting on the device), which the
residency treats as any other parameter: used in place on unified-memory devices (phones, PoCL),
uploaded once and kept resident elsewhere -- 2 bytes an element cross the bus once instead of
the float32 weight's 4, and the float32 weight itself need not be on the device at all when every
read of it was a cast.

Invariant: :meth:`FrozenCopies.copy` returns values equal to ``source.to(dtype)`` now. A copy is
reused only while its source is the same tensor object at the same version counter and address; an
in-place edit (``load_state_dict``, an optimizer the user runs on it, ``p.copy_(...)``) bumps the
version and a ``.data`` swap moves the address, so the next call makes the copy again (in place:
the copy keeps its address, its version counter moves, and the residency uploads it again). Edits
that bypass the version counter (NumPy views, C code) are not seen, as for every resident tensor.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torch_adreno.runtime.host_memory import version_of

#: The cast dtypes a frozen copy may have (narrowing float32 to 16 bits is what autocast does).
COPY_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class _Copy:
    source: weakref.ref[torch.Tensor]
    copy: weakref.ref[torch.Tensor]
    #: The source's version counter and address when the copy was made.
    version: int | None = None
    address: int = 0


class FrozenCopies:
    """The 16-bit copies of frozen tensors in this process, by source tensor and dtype (see the
    module docstring). The table holds sources and copies weakly: a copy lives while something
    reads it -- the compiled graphs that last bound it (:class:`FrozenCopyInputs` users keep their
    last call's copies) and the replays that bind it -- and never longer than its source."""

    def __init__(self) -> None:
        self._copies: dict[tuple[int, torch.dtype], _Copy] = {}
        self._sources: dict[int, weakref.ref[torch.Tensor]] = {}  # id(copy) -> its source
        self._lock = threading.Lock()
        #: Copies made (or made again) so far: a step that found every copy current adds nothing.
        self.copies_made = 0
        #: Bytes of the copies made so far.
        self.bytes_made = 0

    def copy(self, source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``source`` as ``dtype`` (its current values), made at most once per change of ``source``."""
        if dtype not in COPY_DTYPES:
            raise ValueError(f"a frozen copy is float16 or bfloat16, not {dtype}")
        key = (id(source), dtype)
        entry = self._copies.get(key)
        copy = entry.copy() if entry is not None else None
        version = version_of(source)
        if copy is not None and entry is not None and entry.source() is source and version is not None \
                and entry.version == version and entry.address == source.data_ptr():
            return copy
        with self._lock:
            return self._make(key, source, dtype, version)

    def _make(self, key: tuple[int, torch.dtype], source: torch.Tensor, dtype: torch.dtype,
              version: int | None) -> torch.Tensor:
        entry = self._copies.get(key)
        copy = entry.copy() if entry is not None and entry.source() is source else None
        # As eager computes it, whatever mode the caller runs under (no autograd, no autocast).
        with torch.no_grad(), torch._C.DisableTorchFunction():
            if entry is not None and copy is not None and copy.shape == source.shape:
                copy.copy_(source)  # the same host memory: bound buffers stay valid, its version moves
            else:
                copy = source.detach().to(dtype, memory_format=torch.contiguous_format)
                entry = self._remember(key, source, copy)
        entry.version, entry.address = version, source.data_ptr()
        self.copies_made += 1
        self.bytes_made += copy.numel() * copy.element_size()
        return copy

    def _remember(self, key: tuple[int, torch.dtype], source: torch.Tensor, copy: torch.Tensor) -> _Copy:
        copies, sources, copy_id = self._copies, self._sources, id(copy)
        entry: _Copy

        def forget(_: object) -> None:  # the source or the copy died: the entry goes (unless replaced)
            if copies.get(key) is entry:
                del copies[key]
            if sources.get(copy_id) is entry.source:
                del sources[copy_id]

        entry = _Copy(weakref.ref(source, forget), weakref.ref(copy, forget))
        copies[key] = entry
        sources[copy_id] = entry.source
        return entry

    def source_of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The tensor ``tensor`` is a frozen copy of (None: it is not one)."""
        ref = self._sources.get(id(tensor))
        source = ref() if ref is not None else None
        if source is None:
            return None
        entry = self._copies.get((id(source), tensor.dtype))
        return source if entry is not None and entry.copy() is tensor else None

    def __len__(self) -> int:
        return sum(1 for e in list(self._copies.values()) if e.copy() is not None)

    def nbytes(self) -> int:
        """Host bytes the live copies hold (on unified memory, the device's copies themselves)."""
        live = [e.copy() for e in list(self._copies.values())]
        return sum(c.numel() * c.element_size() for c in live if c is not None)


#: The process's frozen copies (host tensors: one table serves every device).
FROZEN_COPIES = FrozenCopies()


@dataclass(frozen=True)
class FrozenCopyInputs:
    """Inputs a compiled graph takes after the caller's arguments: per input, the position of the
    argument it is a copy of and the copy's dtype. ``first`` is the number of the caller's
    arguments (the first copy's position)."""

    sources: tuple[tuple[int, torch.dtype], ...] = ()
    first: int = 0

    def __bool__(self) -> bool:
        return bool(self.sources)

    @property
    def positions(self) -> range:
        return range(self.first, self.first + len(self.sources))

    def extend(self, args: Sequence[Any], graph: str) -> list[Any]:
        """``args`` with the frozen copies after them (the caller keeps them alive while it may
        bind them again: :class:`FrozenCopies` holds them weakly)."""
        if len(args) != self.first:
            raise RuntimeError(f"{graph} takes {self.first} arguments before its frozen copies, got {len(args)}")
        copies = []
        for position, dtype in self.sources:
            source = args[position]
            if not isinstance(source, torch.Tensor) or not source.dtype.is_floating_point:
                raise TypeError(f"{graph}: argument {position} should be the frozen float tensor whose {dtype} copy "
                                f"the graph reads, got {type(source).__name__}")
            copies.append(FROZEN_COPIES.copy(source, dtype))
        return [*args, *copies]


NO_FROZEN_COPIES = FrozenCopyInputs()
