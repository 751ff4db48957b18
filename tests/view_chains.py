"""Random chains of view ops over shapes whose sizes coincide, for the view fuzzer.

A chain is a base shape and a list of steps (each a view op with its arguments), drawn so that
every step is valid for the tensor it receives; sizes come from a small set, so two dimensions of
equal size (the case that hid a wrong index map: a sequence as long as the head count) are common.
The same chain runs on a torch tensor (``apply``) and on an :class:`torch_adreno.ir.View`
(``apply_to_view``); ``index_values`` evaluates a view's index map numerically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from torch_adreno import ir

SIZES = (1, 2, 2, 3, 3, 4)
MAX_RANK = 5


@dataclass(frozen=True)
class Chain:
    base: tuple[int, ...]
    steps: tuple[tuple[Any, ...], ...]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = _apply_step(x, step)
        return x

    def __str__(self) -> str:
        return f"x{list(self.base)}" + "".join(f".{s[0]}{tuple(s[1:])}" for s in self.steps)


def _apply_step(x: torch.Tensor, step: tuple[Any, ...]) -> torch.Tensor:
    op, *args = step
    if op == "view":
        return x.view(args[0])
    if op == "reshape":
        return x.reshape(args[0])
    if op == "flatten":
        return x.flatten(args[0], args[1])
    if op == "unflatten":
        return x.unflatten(args[0], args[1])
    if op == "transpose":
        return x.transpose(args[0], args[1])
    if op == "permute":
        return x.permute(args[0])
    if op == "unsqueeze":
        return x.unsqueeze(args[0])
    if op == "squeeze":
        return x.squeeze(args[0])
    if op == "expand":
        return x.expand(args[0])
    if op == "slice":
        dim, start, end, step_ = args
        return x[(slice(None),) * dim + (slice(start, end, step_),)]
    if op == "select":
        return x.select(args[0], args[1])
    if op == "movedim":
        return x.movedim(args[0], args[1])
    if op == "as_strided":
        return x.as_strided(args[0], args[1], args[2])
    raise AssertionError(f"unknown view step {op}")


def apply_to_view(view: ir.View, chain: Chain) -> ir.View:
    """The chain as index maps, the way the lowering composes them (every step is a reshape,
    permute, expand, slice, select, squeeze or unsqueeze of the one before)."""
    shape = torch.Size(chain.base)
    probe = torch.empty(shape, device="meta")
    for step in chain.steps:
        op, *args = step
        out = _apply_step(probe, step)
        if op in ("view", "reshape", "flatten", "unflatten"):
            view = view.reshape(tuple(out.shape))
        elif op in ("transpose", "movedim", "permute"):
            dims = list(range(probe.dim()))
            if op == "transpose":
                a, b = args[0] % probe.dim(), args[1] % probe.dim()
                dims[a], dims[b] = dims[b], dims[a]
            elif op == "movedim":
                dims.insert(args[1] % probe.dim(), dims.pop(args[0] % probe.dim()))
            else:
                dims = list(args[0])
            view = view.permute(dims)
        elif op == "unsqueeze":
            view = view.unsqueeze(args[0])
        elif op == "squeeze":
            view = view.squeeze([args[0]])
        elif op == "expand":
            view = view.expand(args[0])
        elif op == "slice":
            dim, start, end, step_ = args
            view = view.slice(dim, start, end, step_)
        elif op == "select":
            view = view.select(args[0], args[1])
        else:
            raise AssertionError(f"{op} has no index-map counterpart here")
        assert view.shape == tuple(out.shape), (step, view.shape, tuple(out.shape))
        probe = out
    return view


# ----------------------------------------------------------------------------------------------
# Drawing chains


def _factorisations(n: int) -> list[tuple[int, int]]:
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


@st.composite
def chains(draw: st.DrawFn, min_steps: int = 1, max_steps: int = 6, as_strided: bool = True,
           min_rank: int = 0) -> Chain:
    rank = draw(st.integers(2, 4))
    base = tuple(draw(st.sampled_from(SIZES[1:])) for _ in range(rank))  # no size-1 base dims
    x = torch.empty(base, device="meta")
    steps: list[tuple[Any, ...]] = []
    if as_strided and draw(st.integers(0, 5)) == 0:
        # A permutation of the base's dimensions as explicit strides (what a decomposition may emit).
        order = draw(st.permutations(range(rank)))
        step = ("as_strided", tuple(base[d] for d in order), tuple(_permuted_strides(base, order)), 0)
        steps.append(step)
        x = _apply_step(x, step)
    for _ in range(draw(st.integers(min_steps, max_steps))):
        step = draw(_next_step(x))
        if step is None:
            continue
        steps.append(step)
        x = _apply_step(x, step)
    while x.dim() < min_rank:
        step = ("unsqueeze", 0)
        steps.append(step)
        x = _apply_step(x, step)
    return Chain(base, tuple(steps))


def _permuted_strides(base: Sequence[int], order: Sequence[int]) -> list[int]:
    contiguous = [math.prod(base[d + 1:]) for d in range(len(base))]
    return [contiguous[d] for d in order]


@st.composite
def _next_step(draw: st.DrawFn, x: torch.Tensor) -> tuple[Any, ...] | None:
    rank = x.dim()
    # Splits, merges and transposes weigh double: a reshape of a permuted view is where index maps
    # go wrong.
    kinds = ["split", "split", "merge", "merge", "transpose", "transpose", "flatten", "unflatten", "permute",
             "unsqueeze", "slice", "movedim", "select", "squeeze", "expand"]
    kind = draw(st.sampled_from(kinds))
    shape = list(x.shape)
    if kind == "split" and rank and rank < MAX_RANK:
        d = draw(st.integers(0, rank - 1))
        a, b = draw(st.sampled_from(_factorisations(shape[d])))
        return _viewed(x, [*shape[:d], a, b, *shape[d + 1:]])
    if kind == "merge" and rank >= 2:
        d = draw(st.integers(0, rank - 2))
        return _viewed(x, [*shape[:d], shape[d] * shape[d + 1], *shape[d + 2:]])
    if kind == "flatten" and rank >= 2:
        start = draw(st.integers(0, rank - 2))
        end = draw(st.integers(start + 1, rank - 1))
        return ("flatten", start, end)
    if kind == "unflatten" and rank and rank < MAX_RANK:
        d = draw(st.integers(0, rank - 1))
        a, b = draw(st.sampled_from(_factorisations(shape[d])))
        return ("unflatten", d, (a, b))
    if kind == "transpose" and rank >= 2:
        a, b = draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1))
        return ("transpose", a, b) if a != b else None
    if kind == "permute" and rank >= 2:
        return ("permute", tuple(draw(st.permutations(range(rank)))))
    if kind == "movedim" and rank >= 2:
        return ("movedim", draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1)))
    if kind == "unsqueeze" and rank < MAX_RANK:
        return ("unsqueeze", draw(st.integers(0, rank)))
    if kind == "squeeze" and 1 in shape:
        return ("squeeze", draw(st.sampled_from([d for d, s in enumerate(shape) if s == 1])))
    if kind == "expand" and 1 in shape:
        d = draw(st.sampled_from([d for d, s in enumerate(shape) if s == 1]))
        shape[d] = draw(st.sampled_from((2, 3, 4)))
        return ("expand", tuple(shape))
    if kind == "slice" and rank:
        d = draw(st.integers(0, rank - 1))
        size = shape[d]
        start = draw(st.integers(0, max(size - 1, 0)))
        end = draw(st.integers(start + 1, size)) if size else 0
        return ("slice", d, start, end, draw(st.sampled_from((1, 1, 2, 3))))
    if kind == "select" and rank >= 2:
        d = draw(st.integers(0, rank - 1))
        return ("select", d, draw(st.integers(0, shape[d] - 1)))
    return None


def _viewed(x: torch.Tensor, shape: list[int]) -> tuple[Any, ...]:
    """``view`` where torch allows it on this tensor (a reshape that needs no copy), else
    ``reshape`` (a copy in eager, an index map for us)."""
    try:
        x.view(shape)
    except RuntimeError:
        return ("reshape", tuple(shape))
    return ("view", tuple(shape))


# ----------------------------------------------------------------------------------------------
# Evaluating index maps


def index_values(view: ir.View) -> torch.Tensor:
    """The buffer's flat (row-major) offset of every element of ``view``, as an integer tensor of
    the view's shape."""
    grids = torch.meshgrid(*[torch.arange(s) for s in view.shape], indexing="ij") if view.shape else ()
    env: dict[ir.Var, torch.Tensor] = {}
    for var, grid in zip(ir.placeholder_vars(view.shape), grids, strict=True):
        if isinstance(var, ir.Var):
            env[var] = grid
    flat = torch.zeros(view.shape, dtype=torch.long)
    strides = ir.contiguous_strides(view.buffer_shape)
    for expr, stride in zip(view.index, strides, strict=True):
        flat = flat + _evaluate(expr, env, view.shape) * stride
    return flat


_INDEX_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "mod": lambda a, b: torch.remainder(a, b),
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "where": torch.where,
}


def _evaluate(expr: ir.Expr, env: dict[ir.Var, torch.Tensor], shape: Sequence[int]) -> torch.Tensor:
    if isinstance(expr, ir.Var):
        return env[expr]
    if isinstance(expr, ir.Const):
        return torch.full(tuple(shape), int(expr.value), dtype=torch.long)
    assert isinstance(expr, ir.Call), expr
    if expr.op not in _INDEX_OPS:
        raise AssertionError(f"index op {expr.op} has no evaluator in the view fuzzer: add it")
    return _INDEX_OPS[expr.op](*(_evaluate(a, env, shape) for a in expr.args))
