"""Views: index maps from a view's index space to its buffer's multi-index (never copies)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch_adreno.ir.expr import DType, Expr, Load, Var, call, index, loop_var, substitute


class BufferLike(Protocol):
    """What a view needs of the buffer it reads (:class:`torch_adreno.ir.graph.Buffer` is one;
    named by a protocol so that this module, which ``ir.graph`` imports, imports nothing back)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> DType: ...


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(shape[d + 1], 1)
    return tuple(strides)


def placeholder_vars(shape: Sequence[int], prefix: str = "v") -> tuple[Expr, ...]:
    return tuple(loop_var(f"{prefix}{d}", s) for d, s in enumerate(shape))


@dataclass(frozen=True)
class View:
    """A tensor as seen by a consumer: ``buffer[index(v)]`` for ``v`` over ``shape``.

    ``index`` holds one expression per buffer dimension, written over the placeholder variables
    ``placeholder_vars(shape)``. Views compose; none of them copies data.
    """

    buffer: str
    buffer_shape: tuple[int, ...]
    dtype: DType
    shape: tuple[int, ...]
    index: tuple[Expr, ...]
    #: True when the view is its buffer reshaped (elements in memory order); False when unknown.
    in_memory_order: bool = False

    @staticmethod
    def of(buffer: BufferLike) -> View:
        return View(buffer.name, buffer.shape, buffer.dtype, buffer.shape, placeholder_vars(buffer.shape), True)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def at(self, idx: Sequence[Expr]) -> tuple[Expr, ...]:
        """The buffer multi-index of view element ``idx``."""
        if len(idx) != len(self.shape):
            raise ValueError(f"view of rank {len(self.shape)} indexed with {len(idx)} indices")
        mapping = {
            v: i for v, i in zip(placeholder_vars(self.shape), idx, strict=True) if isinstance(v, Var)
        }
        return tuple(substitute(e, mapping) for e in self.index)

    def load(self, idx: Sequence[Expr]) -> Load:
        return Load(self.buffer, self.at(idx), self.dtype)

    def is_identity(self) -> bool:
        return self.shape == self.buffer_shape and self.index == placeholder_vars(self.buffer_shape)

    def is_contiguous_reshape(self) -> bool:
        """Whether the view reads all of its buffer in memory order (a chain of reshapes): then the
        buffer's bytes *are* the view and no copy is needed."""
        return self.in_memory_order and math.prod(self.shape) == math.prod(self.buffer_shape)

    def _remap(self, shape: Sequence[int], old_index_of_new: Sequence[Expr], keeps_order: bool = False) -> View:
        return View(self.buffer, self.buffer_shape, self.dtype, tuple(shape), self.at(old_index_of_new),
                    self.in_memory_order and keeps_order)

    def permute(self, dims: Sequence[int]) -> View:
        dims = [d % max(len(self.shape), 1) for d in dims]
        new_shape = [self.shape[d] for d in dims]
        new_vars = placeholder_vars(new_shape)
        old: list[Expr] = [index(0)] * len(self.shape)
        for new_d, old_d in enumerate(dims):
            old[old_d] = new_vars[new_d]
        return self._remap(new_shape, old)

    def expand(self, shape: Sequence[int]) -> View:
        shape = list(shape)
        lead = len(shape) - len(self.shape)
        if lead < 0:
            raise ValueError(f"cannot expand shape {self.shape} to {tuple(shape)}")
        for d, s in enumerate(self.shape):
            if shape[lead + d] == -1:
                shape[lead + d] = s
            elif s != 1 and s != shape[lead + d]:
                raise ValueError(f"cannot expand shape {self.shape} to {tuple(shape)}")
        new_vars = placeholder_vars(shape)
        old = [index(0) if s == 1 else new_vars[lead + d] for d, s in enumerate(self.shape)]
        return self._remap(shape, old)

    def reshape(self, shape: Sequence[int]) -> View:
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.numel // known if known else 0
        if math.prod(shape) != self.numel:
            raise ValueError(f"cannot reshape {self.shape} ({self.numel} elements) to {tuple(shape)}")
        new_vars = placeholder_vars(shape)
        flat: Expr = index(0)
        for v, stride in zip(new_vars, contiguous_strides(shape), strict=True):
            flat = call("add", flat, call("mul", v, index(stride)))
        old: list[Expr] = []
        for size, stride in zip(self.shape, contiguous_strides(self.shape), strict=True):
            old.append(call("mod", call("floordiv", flat, index(stride)), index(size)) if size > 1 else index(0))
        return self._remap(shape, old, keeps_order=True)

    def repeat(self, repeats: Sequence[int]) -> View:
        """Tiled copies along each dimension (torch.Tensor.repeat), as an index map."""
        lead = len(repeats) - len(self.shape)
        if lead < 0:
            raise ValueError(f"repeat needs at least {len(self.shape)} counts, got {len(repeats)}")
        shape = list(repeats[:lead]) + [r * s for r, s in zip(repeats[lead:], self.shape, strict=True)]
        new_vars = placeholder_vars(shape)
        old = [call("mod", new_vars[lead + d], index(s)) for d, s in enumerate(self.shape)]
        return self._remap(shape, old)

    def flip(self, dims: Sequence[int]) -> View:
        """Reversed along ``dims``, as an index map."""
        rank = len(self.shape)
        flipped = {d % rank for d in dims} if rank else set()
        new_vars = placeholder_vars(self.shape)
        old = [call("sub", index(self.shape[d] - 1), v) if d in flipped else v for d, v in enumerate(new_vars)]
        return self._remap(self.shape, old)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> View:
        dim %= len(self.shape)
        size = self.shape[dim]
        start = max(0, min(size, start + size if start < 0 else start))
        end = max(start, min(size, end + size if end < 0 else end))
        new_size = (end - start + step - 1) // step
        shape = list(self.shape)
        shape[dim] = new_size
        new_vars = list(placeholder_vars(shape))
        new_vars[dim] = call("add", call("mul", new_vars[dim], index(step)), index(start))
        return self._remap(shape, new_vars)

    def select(self, dim: int, i: int) -> View:
        dim %= len(self.shape)
        if i < 0:
            i += self.shape[dim]
        shape = list(self.shape[:dim]) + list(self.shape[dim + 1:])
        new_vars = list(placeholder_vars(shape))
        return self._remap(shape, [*new_vars[:dim], index(i), *new_vars[dim:]])

    def unsqueeze(self, dim: int) -> View:
        dim = dim % (len(self.shape) + 1)
        shape = [*self.shape[:dim], 1, *self.shape[dim:]]
        new_vars = list(placeholder_vars(shape))
        return self._remap(shape, new_vars[:dim] + new_vars[dim + 1:], keeps_order=True)

    def squeeze(self, dims: Sequence[int] | None = None) -> View:
        rank = len(self.shape)
        drop = {d % rank for d in dims} if dims is not None else set(range(rank))
        drop = {d for d in drop if self.shape[d] == 1}
        shape = [s for d, s in enumerate(self.shape) if d not in drop]
        new_vars = list(placeholder_vars(shape))
        it = iter(new_vars)
        return self._remap(shape, [index(0) if d in drop else next(it) for d in range(rank)], keeps_order=True)


