"""The project's loop-level IR: buffers, expressions, views as index maps, and kernel-sized nodes.

Lowering builds an :class:`Graph` from an FX graph; fusion, memory planning and code generation
read it. The IR knows nothing of torch or OpenCL.

Invariants
----------
* Every :class:`Buffer` is dense and row-major (contiguous) over its ``shape``.
* A :class:`Load` indexes its buffer with one index expression per dimension of that buffer.
* Views never copy: a :class:`View` maps its own index space to a multi-index of its buffer.
* Every node writes every element of its output buffer exactly once.
* Index arithmetic (``DType.INDEX``) is done on non-negative values wherever a result is used;
  a negative intermediate may only appear under a ``where`` that discards it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Union


class DType(enum.Enum):
    """Element types the IR computes in. ``INDEX`` is the integer type of loop variables."""

    F32 = "f32"
    I64 = "i64"
    I32 = "i32"
    BOOL = "b8"
    INDEX = "idx"

    @property
    def itemsize(self) -> int:
        return {"f32": 4, "i64": 8, "i32": 4, "b8": 1, "idx": 8}[self.value]

    @property
    def is_float(self) -> bool:
        return self is DType.F32

    @property
    def is_integer(self) -> bool:
        return self in (DType.I64, DType.I32, DType.INDEX)


# ----------------------------------------------------------------------------------------------
# Expressions


class Expr:
    """A side-effect-free scalar expression.

    Expressions are immutable and hashable (they are CSE keys); equality is structural and the
    hash is computed once per object, since expression trees are DAGs that share sub-trees.
    """

    @property
    def dtype(self) -> DType:
        raise NotImplementedError

    def children(self) -> tuple[Expr, ...]:
        return ()

    def key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    @cached_property
    def _hash(self) -> int:
        return hash((type(self).__name__, self.key()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self):
            return False
        assert isinstance(other, Expr)
        return self._hash == other._hash and self.key() == other.key()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _init(self, **fields: Any) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)


class Var(Expr):
    """A loop variable ranging over ``[0, size)``."""

    def __init__(self, name: str, size: int) -> None:
        self._init(name=name, size=size)
        self.name: str
        self.size: int

    @property
    def dtype(self) -> DType:
        return DType.INDEX

    def key(self) -> tuple[Any, ...]:
        return (self.name, self.size)

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self.size})"

    def __str__(self) -> str:
        return self.name


class Const(Expr):
    def __init__(self, value: Union[int, float, bool], const_dtype: DType) -> None:
        self._init(value=value, const_dtype=const_dtype)
        self.value: Union[int, float, bool]
        self.const_dtype: DType

    @property
    def dtype(self) -> DType:
        return self.const_dtype

    def key(self) -> tuple[Any, ...]:
        return (type(self.value).__name__, self.value, self.const_dtype)

    def __repr__(self) -> str:
        return f"Const({self.value!r}, {self.const_dtype})"

    def __str__(self) -> str:
        if self.const_dtype is DType.INDEX:
            return str(self.value)
        return f"{self.value!r}:{self.const_dtype.value}"


class Load(Expr):
    """Element ``index`` (one expression per buffer dimension) of ``buffer``."""

    def __init__(self, buffer: str, index: tuple[Expr, ...], load_dtype: DType) -> None:
        self._init(buffer=buffer, index=tuple(index), load_dtype=load_dtype)
        self.buffer: str
        self.index: tuple[Expr, ...]
        self.load_dtype: DType

    @property
    def dtype(self) -> DType:
        return self.load_dtype

    def children(self) -> tuple[Expr, ...]:
        return self.index

    def key(self) -> tuple[Any, ...]:
        return (self.buffer, self.index, self.load_dtype)

    def __repr__(self) -> str:
        return f"Load({self.buffer!r}, {self.index!r}, {self.load_dtype})"

    def __str__(self) -> str:
        return f"{self.buffer}[{', '.join(map(str, self.index))}]"


class Call(Expr):
    """``op`` applied to ``args``; ``op`` is a key of :data:`OPS`."""

    def __init__(self, op: str, args: tuple[Expr, ...], result_dtype: DType) -> None:
        self._init(op=op, args=tuple(args), result_dtype=result_dtype)
        self.op: str
        self.args: tuple[Expr, ...]
        self.result_dtype: DType

    @property
    def dtype(self) -> DType:
        return self.result_dtype

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def key(self) -> tuple[Any, ...]:
        return (self.op, self.args, self.result_dtype)

    def __repr__(self) -> str:
        return f"Call({self.op!r}, {self.args!r}, {self.result_dtype})"

    @cached_property
    def _text(self) -> str:
        inner = ", ".join(map(str, self.args))
        if self.op == "cast":
            return f"cast<{self.result_dtype.value}>({inner})"
        return f"{self.op}({inner})"

    def __str__(self) -> str:
        return self._text


@dataclass(frozen=True)
class OpInfo:
    """What the IR knows of an operation: arity and how its result type is formed."""

    arity: int
    result: str  # "same" (type of first arg), "bool", "float", or "given" (cast)


#: Every operation an expression may use. ``kernels/expressions.py`` holds one rendering each.
OPS: dict[str, OpInfo] = {
    **{name: OpInfo(1, "same") for name in (
        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "sin", "cos",
        "floor", "ceil", "round", "trunc", "sign", "reciprocal", "erf", "log1p", "expm1",
        "log2", "exp2", "bitwise_not",
    )},
    **{name: OpInfo(2, "same") for name in (
        "add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum", "fmod",
        "remainder", "atan2", "bitwise_and", "bitwise_or", "bitwise_xor",
    )},
    **{name: OpInfo(2, "bool") for name in (
        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    )},
    "logical_not": OpInfo(1, "bool"),
    "isnan": OpInfo(1, "bool"),
    "where": OpInfo(3, "where"),
    "cast": OpInfo(1, "given"),
}


def call(op: str, *args: Expr, dtype: DType | None = None) -> Expr:
    """Build ``op(args)`` with its result type; index arithmetic is simplified on the way."""
    info = OPS.get(op)
    if info is None:
        raise KeyError(f"unknown IR op {op!r}; known: {sorted(OPS)}")
    if len(args) != info.arity:
        raise ValueError(f"IR op {op!r} takes {info.arity} arguments, got {len(args)}")
    if op == "cast":
        if dtype is None:
            raise ValueError("cast needs a target dtype")
        return cast(args[0], dtype)
    if info.result == "bool":
        return Call(op, args, DType.BOOL)
    result = args[1].dtype if info.result == "where" else args[0].dtype
    if all(a.dtype is DType.INDEX for a in args):
        simplified = _simplify_index_call(op, args)
        if simplified is not None:
            return simplified
    return Call(op, args, result)


def cast(value: Expr, dtype: DType) -> Expr:
    if value.dtype is dtype:
        return value
    if isinstance(value, Const):
        if dtype.is_float:
            return Const(float(value.value), dtype)
        if dtype is DType.BOOL:
            return Const(bool(value.value), dtype)
        return Const(int(value.value), dtype)
    return Call("cast", (value,), dtype)


def const(value: Union[int, float, bool], dtype: DType) -> Const:
    if dtype.is_float:
        return Const(float(value), dtype)
    if dtype is DType.BOOL:
        return Const(bool(value), dtype)
    return Const(int(value), dtype)


def index(value: int) -> Const:
    return Const(int(value), DType.INDEX)


def loop_var(name: str, size: int) -> Expr:
    """A loop variable; a dimension of size 1 has the single index 0."""
    return index(0) if size == 1 else Var(name, size)


# ----------------------------------------------------------------------------------------------
# Index arithmetic: a small simplifier over sums of (coefficient * atom) terms.


def _terms(expr: Expr) -> tuple[int, dict[Expr, int]]:
    """Split an index expression into (constant, {atom: coefficient})."""
    if isinstance(expr, Const):
        return int(expr.value), {}
    if isinstance(expr, Call) and expr.op == "add":
        c0, t0 = _terms(expr.args[0])
        c1, t1 = _terms(expr.args[1])
        for atom, coef in t1.items():
            t0[atom] = t0.get(atom, 0) + coef
        return c0 + c1, {a: c for a, c in t0.items() if c != 0}
    if isinstance(expr, Call) and expr.op == "mul" and isinstance(expr.args[1], Const):
        c, t = _terms(expr.args[0])
        k = int(expr.args[1].value)
        return c * k, {a: coef * k for a, coef in t.items() if coef * k != 0}
    return 0, {expr: 1}


def _from_terms(constant: int, terms: Mapping[Expr, int]) -> Expr:
    parts: list[Expr] = []
    for atom in sorted(terms, key=str):
        coef = terms[atom]
        if coef == 0:
            continue
        parts.append(atom if coef == 1 else Call("mul", (atom, index(coef)), DType.INDEX))
    if constant != 0 or not parts:
        parts.append(index(constant))
    out = parts[0]
    for p in parts[1:]:
        out = Call("add", (out, p), DType.INDEX)
    return out


def bounds(expr: Expr) -> tuple[int, int] | None:
    """Inclusive value range of an index expression, or None when unknown."""
    if isinstance(expr, Var):
        return (0, expr.size - 1)
    if isinstance(expr, Const):
        return (int(expr.value), int(expr.value))
    if isinstance(expr, Call) and expr.dtype is DType.INDEX:
        if expr.op == "add":
            a, b = bounds(expr.args[0]), bounds(expr.args[1])
            return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])
        if expr.op == "mul" and isinstance(expr.args[1], Const):
            a, k = bounds(expr.args[0]), int(expr.args[1].value)
            if a is None:
                return None
            return (min(a[0] * k, a[1] * k), max(a[0] * k, a[1] * k))
        if expr.op == "floordiv" and isinstance(expr.args[1], Const):
            a, k = bounds(expr.args[0]), int(expr.args[1].value)
            if a is None or a[0] < 0 or k <= 0:
                return None
            return (a[0] // k, a[1] // k)
        if expr.op == "mod" and isinstance(expr.args[1], Const):
            a, k = bounds(expr.args[0]), int(expr.args[1].value)
            if a is not None and a[0] >= 0 and a[1] < k:
                return a
            return (0, k - 1) if a is not None and a[0] >= 0 else None
        if expr.op in ("minimum", "maximum"):
            a, b = bounds(expr.args[0]), bounds(expr.args[1])
            if a is None or b is None:
                return None
            f = min if expr.op == "minimum" else max
            return (f(a[0], b[0]), f(a[1], b[1]))
    return None


def _simplify_index_call(op: str, args: tuple[Expr, ...]) -> Expr | None:
    if op == "add":
        c0, t0 = _terms(args[0])
        c1, t1 = _terms(args[1])
        for atom, coef in t1.items():
            t0[atom] = t0.get(atom, 0) + coef
        return _from_terms(c0 + c1, t0)
    if op == "sub":
        c, t = _terms(args[1])
        negated = _from_terms(-c, {atom: -coef for atom, coef in t.items()})
        return _simplify_index_call("add", (args[0], negated))
    if op == "mul":
        a, b = args
        if isinstance(a, Const) and not isinstance(b, Const):
            a, b = b, a
        if isinstance(b, Const):
            c, t = _terms(a)
            k = int(b.value)
            return _from_terms(c * k, {atom: coef * k for atom, coef in t.items()})
        return None
    if op in ("floordiv", "mod") and isinstance(args[1], Const):
        k = int(args[1].value)
        if k <= 0:
            return None
        return _floordiv(args[0], k) if op == "floordiv" else _mod(args[0], k)
    return None


def _floordiv(a: Expr, k: int) -> Expr:
    if k == 1:
        return a
    b = bounds(a)
    if b is not None and b[0] >= 0 and b[1] < k:
        return index(0)
    if isinstance(a, Call) and a.op == "floordiv" and isinstance(a.args[1], Const):
        return _floordiv(a.args[0], k * int(a.args[1].value))
    c, terms = _terms(a)
    whole = {atom: coef // k for atom, coef in terms.items() if coef % k == 0}
    rest = {atom: coef for atom, coef in terms.items() if coef % k != 0}
    if c % k == 0:
        whole_c, rest_c = c // k, 0
    else:
        whole_c, rest_c = 0, c
    if whole and (rest or rest_c):
        rest_expr = _from_terms(rest_c, rest)
        rb = bounds(rest_expr)
        # (k*q + r) // k == q + r // k holds for floor division; we keep it to non-negative r so
        # that C's truncating division agrees.
        if rb is not None and rb[0] >= 0:
            return call("add", _from_terms(whole_c, whole), _floordiv(rest_expr, k))
        return Call("floordiv", (a, index(k)), DType.INDEX)
    if whole and not rest and not rest_c:
        return _from_terms(whole_c, whole)
    return Call("floordiv", (a, index(k)), DType.INDEX)


def _mod(a: Expr, k: int) -> Expr:
    if k == 1:
        return index(0)
    b = bounds(a)
    if b is not None and b[0] >= 0 and b[1] < k:
        return a
    if isinstance(a, Call) and a.op == "mod" and isinstance(a.args[1], Const):
        inner = int(a.args[1].value)
        if inner % k == 0:
            return _mod(a.args[0], k)
    c, terms = _terms(a)
    kept = {atom: coef % k for atom, coef in terms.items() if coef % k != 0}
    rest = _from_terms(c % k, kept)
    rb = bounds(rest)
    full_b = bounds(a)
    if full_b is not None and full_b[0] >= 0 and rb is not None and rb[0] >= 0:
        if rb[1] < k:
            return rest
        return Call("mod", (rest, index(k)), DType.INDEX)
    return Call("mod", (a, index(k)), DType.INDEX)


# ----------------------------------------------------------------------------------------------
# Traversal and substitution


def walk(expr: Expr) -> Iterator[Expr]:
    """Pre-order traversal, each distinct sub-expression once."""
    seen: set[int] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(reversed(e.children()))


def loads(expr: Expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


def rewrite(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: ``fn`` returns a replacement or None to keep the (rebuilt) node."""
    memo: dict[Expr, Expr] = {}

    def go(e: Expr) -> Expr:
        if e in memo:
            return memo[e]
        if isinstance(e, Load):
            new_index = tuple(go(i) for i in e.index)
            unchanged = all(a is b for a, b in zip(new_index, e.index, strict=True))
            rebuilt: Expr = e if unchanged else Load(e.buffer, new_index, e.load_dtype)
        elif isinstance(e, Call):
            new_args = tuple(go(a) for a in e.args)
            if e.op == "cast":
                rebuilt = cast(new_args[0], e.result_dtype)
            elif e.op == "where":
                rebuilt = where(*new_args)
            else:
                unchanged = all(a is b for a, b in zip(new_args, e.args, strict=True))
                rebuilt = e if unchanged else call(e.op, *new_args)
        else:
            rebuilt = e
        out = fn(rebuilt)
        memo[e] = rebuilt if out is None else out
        return memo[e]

    return go(expr)


def substitute(expr: Expr, mapping: Mapping[Var, Expr]) -> Expr:
    if not mapping:
        return expr
    return rewrite(expr, lambda e: mapping.get(e) if isinstance(e, Var) else None)


def where(cond: Expr, a: Expr, b: Expr) -> Expr:
    if isinstance(cond, Const):
        return a if cond.value else b
    if a == b:
        return a
    return Call("where", (cond, a, b), a.dtype)


# ----------------------------------------------------------------------------------------------
# Views: index maps from a view's index space to its buffer's multi-index


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

    @staticmethod
    def of(buffer: Buffer) -> View:
        return View(buffer.name, buffer.shape, buffer.dtype, buffer.shape, placeholder_vars(buffer.shape))

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

    def _remap(self, shape: Sequence[int], old_index_of_new: Sequence[Expr]) -> View:
        return View(self.buffer, self.buffer_shape, self.dtype, tuple(shape), self.at(old_index_of_new))

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
        return self._remap(shape, old)

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
        shape = list(self.shape[:dim]) + [1] + list(self.shape[dim:])
        new_vars = list(placeholder_vars(shape))
        return self._remap(shape, new_vars[:dim] + new_vars[dim + 1:])

    def squeeze(self, dims: Sequence[int] | None = None) -> View:
        rank = len(self.shape)
        drop = {d % rank for d in dims} if dims is not None else set(range(rank))
        drop = {d for d in drop if self.shape[d] == 1}
        shape = [s for d, s in enumerate(self.shape) if d not in drop]
        new_vars = list(placeholder_vars(shape))
        it = iter(new_vars)
        return self._remap(shape, [index(0) if d in drop else next(it) for d in range(rank)])


# ----------------------------------------------------------------------------------------------
# Buffers, nodes and the graph


@dataclass(frozen=True)
class Origin:
    """Where a node came from: the FX node, its ATen op, module path and user source line."""

    node: str
    op: str
    module: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class Pointwise:
    """``output[i] = body(i)`` for every ``i`` in ``ranges`` (the output buffer's shape)."""

    name: str
    output: str
    ranges: tuple[int, ...]
    body: Expr
    origins: tuple[Origin, ...]

    @property
    def loop_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.ranges, "i")

    def inputs(self) -> list[str]:
        return _buffers_read(self.body)


#: Reductions the IR supports and the value each starts from.
REDUCE_OPS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


@dataclass
class Reduction:
    """``output[i] = reduce_op over r in reduction_ranges of body(i, r)``.

    ``body`` uses ``i*`` variables (over ``ranges``, the output shape) and ``r*`` variables (over
    ``reduction_ranges``). ``argmax``/``argmin`` yield the row-major linear index of the winning
    ``r``, the first one on ties; NaN wins like in PyTorch.
    """

    name: str
    output: str
    ranges: tuple[int, ...]
    reduction_ranges: tuple[int, ...]
    reduce_op: str
    body: Expr
    origins: tuple[Origin, ...]

    def __post_init__(self) -> None:
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduction {self.reduce_op!r}; known: {REDUCE_OPS}")

    @property
    def loop_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.ranges, "i")

    @property
    def reduction_vars(self) -> tuple[Expr, ...]:
        return placeholder_vars(self.reduction_ranges, "r")

    @property
    def reduction_numel(self) -> int:
        return math.prod(self.reduction_ranges)

    def inputs(self) -> list[str]:
        return _buffers_read(self.body)


GEMM_VARS = {"b": "b", "m": "m", "n": "n", "k": "k"}


@dataclass
class Gemm:
    """``output[out_index(b, m, n)] = sum_k lhs(b, m, k) * rhs(b, k, n)`` (a template node).

    ``lhs`` is written over variables ``b, m, k``, ``rhs`` over ``b, k, n`` and ``out_index`` over
    ``b, m, n``; ``out_index`` maps the ``batch x m x n`` space one-to-one onto the output buffer.
    Operands may be any expression: a transposed weight, an im2col gather of a convolution input
    with padding, a masked gradient.
    """

    name: str
    output: str
    batch: int
    m: int
    n: int
    k: int
    lhs: Expr
    rhs: Expr
    out_index: tuple[Expr, ...]
    origins: tuple[Origin, ...]

    def vars(self) -> dict[str, Expr]:
        return {
            "b": loop_var("b", self.batch),
            "m": loop_var("m", self.m),
            "n": loop_var("n", self.n),
            "k": loop_var("k", self.k),
        }

    def inputs(self) -> list[str]:
        return _dedupe(_buffers_read(self.lhs) + _buffers_read(self.rhs))


@dataclass
class HostOp:
    """An op the user asked to run on the host (``fallback="host"``); counted, never silent.

    ``run`` takes host tensors for ``inputs`` (in order) and returns host tensors for ``outputs``.
    """

    name: str
    target: str
    inputs: tuple[View, ...]
    outputs: tuple[str, ...]
    run: Callable[..., Sequence[Any]]
    origins: tuple[Origin, ...]

    def input_buffers(self) -> list[str]:
        return _dedupe([v.buffer for v in self.inputs])


Node = Union[Pointwise, Reduction, Gemm, HostOp]


def node_inputs(node: Node) -> list[str]:
    if isinstance(node, HostOp):
        return node.input_buffers()
    return node.inputs()


def node_outputs(node: Node) -> list[str]:
    return list(node.outputs) if isinstance(node, HostOp) else [node.output]


def _dedupe(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _buffers_read(expr: Expr) -> list[str]:
    return _dedupe([ld.buffer for ld in loads(expr)])


class OutputRole(enum.Enum):
    """Where a graph output goes: to the user (host) or to a later graph (stays on device)."""

    HOST = "host"
    DEVICE = "device"


@dataclass(frozen=True)
class GraphOutput:
    """Output ``position`` of the graph: a buffer, or None for a ``None`` output.

    An output whose buffer is a graph input is returned as the caller's own object.
    """

    buffer: str | None
    role: OutputRole


@dataclass
class Graph:
    """A lowered FX graph: inputs bound by position, nodes in execution order, outputs."""

    name: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str | None] = field(default_factory=list)
    outputs: list[GraphOutput] = field(default_factory=list)

    def input_buffers(self) -> set[str]:
        return {b for b in self.inputs if b is not None}

    def output_buffers(self) -> set[str]:
        return {o.buffer for o in self.outputs if o.buffer is not None}

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in node_outputs(n)}

    def __str__(self) -> str:
        return format_graph(self)


def _format_node(node: Node) -> str:
    origins = ", ".join(o.node for o in node.origins)
    if isinstance(node, Pointwise):
        text = f"{node.output} = pointwise{list(node.ranges)} {node.body}"
    elif isinstance(node, Reduction):
        text = (f"{node.output} = reduce_{node.reduce_op}{list(node.ranges)} "
                f"over {list(node.reduction_ranges)} {node.body}")
    elif isinstance(node, Gemm):
        text = (f"{node.output}[{', '.join(map(str, node.out_index))}] = gemm(b={node.batch}, m={node.m}, "
                f"n={node.n}, k={node.k}) lhs={node.lhs} rhs={node.rhs}")
    else:
        ins = ", ".join(str(v.buffer) for v in node.inputs)
        text = f"{', '.join(node.outputs)} = host {node.target}({ins})"
    return f"  {text}  # {origins}"


def format_graph(graph: Graph) -> str:
    """A stable, readable text form of the graph (used by tests and the debug dump)."""
    lines = [f"graph {graph.name}"]
    for pos, name in enumerate(graph.inputs):
        if name is not None:
            b = graph.buffers[name]
            lines.append(f"  input {pos}: {name} {b.dtype.value}{list(b.shape)}")
    computed = [b for n in graph.nodes for b in node_outputs(n)]
    for name in computed:
        b = graph.buffers[name]
        lines.append(f"  buffer {name} {b.dtype.value}{list(b.shape)}")
    lines.extend(_format_node(n) for n in graph.nodes)
    for pos, out in enumerate(graph.outputs):
        lines.append(f"  output {pos}: {out.buffer} ({out.role.value})")
    return "\n".join(lines)
