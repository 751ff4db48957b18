"""IR expressions: scalar expressions over the ops of :mod:`.ops`, and the index-arithmetic simplifier.

Element types live in :mod:`.dtype` and what each op means in :mod:`.ops`; both are re-exported here.

Invariant: index arithmetic (``DType.INDEX``) is done on non-negative values wherever a result is
used; a negative intermediate may only appear under a ``where`` that discards it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Any

from torch_adreno.ir.dtype import DType, round_to
from torch_adreno.ir.ops import OPS, OpInfo

__all__ = ["OPS", "Call", "Const", "DType", "Expr", "Load", "OpInfo", "Var", "bounds", "call", "cast", "const", "index",
           "linear_terms", "loads", "loop_var", "rewrite", "round_to", "substitute", "walk", "where"]


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

    def __getstate__(self) -> dict[str, Any]:
        # The cached hash comes from str hashes, which differ between processes (a pickled
        # program is loaded by another one): it is computed again after loading.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

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
    def __init__(self, value: int | float | bool, const_dtype: DType) -> None:
        self._init(value=value, const_dtype=const_dtype)
        self.value: int | float | bool
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
    """``op`` applied to ``args``; ``op`` is a key of :data:`OPS` (``ir/ops.py``: what it means)."""

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


#: Index arithmetic simplified, by (op, arguments): a model's repeated blocks index their buffers
#: alike, so most of a graph's index expressions were simplified before (expressions are
#: immutable, so a result may be shared). Bounded: cleared when full.
_SIMPLIFIED: dict[tuple[str, tuple[Expr, ...]], Expr | None] = {}
_SIMPLIFIED_LIMIT = 200_000


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
    result = info.result_dtype([a.dtype for a in args])
    if info.result == "bool":
        folded = _fold_logical(op, args)
        return folded if folded is not None else Call(op, args, result)
    if info.result in ("float", "index"):
        return Call(op, args, result)
    if result.is_half and not info.exact_on_half:
        # Invariant: an expression of a 16-bit type holds a value of that type. Eager rounds each
        # op's result to it; so does this (computed in float32 registers, then rounded).
        wide = tuple(cast(a, DType.F32) if a.dtype.is_half else a for a in args)
        return cast(Call(op, wide, DType.F32), result)
    if all(a.dtype is DType.INDEX for a in args):
        key = (op, args)
        if key in _SIMPLIFIED:
            simplified = _SIMPLIFIED[key]
        else:
            simplified = _simplify_index_call(op, args)
            if len(_SIMPLIFIED) >= _SIMPLIFIED_LIMIT:
                _SIMPLIFIED.clear()
            _SIMPLIFIED[key] = simplified
        if simplified is not None:
            return simplified
    return Call(op, args, result)


def _fold_logical(op: str, args: tuple[Expr, ...]) -> Expr | None:
    """``x && true`` is ``x``, ``x && false`` is false (and dually for ``||``): masks built from
    several conditions (a causal mask and a padding guard) often have constant parts."""
    if op not in ("logical_and", "logical_or"):
        return None
    absorbing = op == "logical_or"  # true absorbs ||, false absorbs &&
    for i, arg in enumerate(args):
        if isinstance(arg, Const) and not arg.dtype.is_float:
            if bool(arg.value) == absorbing:
                return Const(absorbing, DType.BOOL)
            return cast(args[1 - i], DType.BOOL)
    return None


def cast(value: Expr, dtype: DType) -> Expr:
    if value.dtype is dtype:
        return value
    if dtype.is_half:
        exact = _exactly_half(value, dtype)
        if exact is not None:
            return exact
    if isinstance(value, Const):
        if dtype.is_float:
            return Const(round_to(float(value.value), dtype), dtype)
        if dtype is DType.BOOL:
            return Const(bool(value.value), dtype)
        return Const(int(value.value), dtype)
    return Call("cast", (value,), dtype)


def _exactly_half(value: Expr, dtype: DType) -> Expr | None:
    """``value`` as an expression of the 16-bit ``dtype`` without rounding, where it already holds
    such a value: a widened 16-bit value, or an exact op (relu, max, ...) of such values."""
    if isinstance(value, Call) and value.op == "cast" and value.args[0].dtype is dtype:
        return value.args[0]
    if isinstance(value, Call) and OPS[value.op].exact_on_half and value.dtype.is_float:
        args: list[Expr] = []
        for arg in value.args:
            if isinstance(arg, Const) and arg.dtype.is_float:
                if round_to(float(arg.value), dtype) != arg.value and not math.isnan(float(arg.value)):
                    return None
                args.append(Const(float(arg.value), dtype))
                continue
            narrow = _exactly_half(arg, dtype) if arg.dtype.is_float else arg
            if narrow is None:
                return None
            args.append(narrow)
        return Call(value.op, tuple(args), dtype)
    return None


def const(value: int | float | bool, dtype: DType) -> Const:
    if dtype.is_float:
        return Const(round_to(float(value), dtype), dtype)
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


def linear_terms(expr: Expr) -> tuple[int, dict[Expr, int]]:
    """Split an index expression into (constant, {atom: coefficient})."""
    if isinstance(expr, Const):
        return int(expr.value), {}
    if isinstance(expr, Call) and expr.op == "add":
        c0, t0 = linear_terms(expr.args[0])
        c1, t1 = linear_terms(expr.args[1])
        for atom, coef in t1.items():
            t0[atom] = t0.get(atom, 0) + coef
        return c0 + c1, {a: c for a, c in t0.items() if c != 0}
    if isinstance(expr, Call) and expr.op == "mul" and isinstance(expr.args[1], Const):
        c, t = linear_terms(expr.args[0])
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
        if expr.op == "checked_index" and isinstance(expr.args[1], Const):
            return (0, max(int(expr.args[1].value) - 1, 0))
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


def _recombine(constant: int, terms: dict[Expr, int]) -> tuple[int, dict[Expr, int]]:
    """``(x // d) * (c * d) + (x % d) * c`` is ``x * c`` (non-negative x): the pair a reshape's
    unravelled index leaves behind when the view is read back in its original layout."""
    changed = True
    while changed:
        changed = False
        for atom, coef in list(terms.items()):
            if not (isinstance(atom, Call) and atom.op == "floordiv" and isinstance(atom.args[1], Const)):
                continue
            x, d = atom.args[0], int(atom.args[1].value)
            partner = Call("mod", (x, index(d)), DType.INDEX)
            low = terms.get(partner)
            xb = bounds(x)
            if low is None or coef != low * d or xb is None or xb[0] < 0:
                continue
            del terms[atom], terms[partner]
            c, inner = linear_terms(x)
            constant += c * low
            for a, k in inner.items():
                terms[a] = terms.get(a, 0) + k * low
            terms = {a: k for a, k in terms.items() if k != 0}
            changed = True
            break
    return constant, terms


def _aligned_split(c: int, terms: dict[Expr, int], k: int) -> tuple[int, Expr, Expr] | None:
    """``(g, high, low)`` with ``a == high * g + low``, ``g`` dividing ``k`` and ``0 <= low < g``,
    for the largest such ``g > 1`` made of the terms' coefficients (``a`` = ``c`` + the terms):
    then ``a // k == high // (k // g)`` and ``a % k == (high % (k // g)) * g + low``. A reshape's
    flat index ``m * 512 + k`` divided by ``32768`` is ``m // 64`` when ``k < 512``."""
    candidates = sorted({math.gcd(coef, k) for coef in terms.values() if coef > 0} - {1}, reverse=True)
    for g in candidates:
        if g == k:
            continue  # (the plain whole/rest split already handles it)
        high = {atom: coef // g for atom, coef in terms.items() if coef % g == 0}
        rest = {atom: coef for atom, coef in terms.items() if coef % g != 0}
        if not high:
            continue
        low = _from_terms(c % g, rest)
        lb, hb = bounds(low), bounds(_from_terms(c // g, high))
        if lb is not None and lb[0] >= 0 and lb[1] < g and hb is not None and hb[0] >= 0:
            return g, _from_terms(c // g, high), low
    return None


def _simplify_index_call(op: str, args: tuple[Expr, ...]) -> Expr | None:
    if op == "add":
        c0, t0 = linear_terms(args[0])
        c1, t1 = linear_terms(args[1])
        for atom, coef in t1.items():
            t0[atom] = t0.get(atom, 0) + coef
        return _from_terms(*_recombine(c0 + c1, {a: k for a, k in t0.items() if k != 0}))
    if op == "sub":
        c, t = linear_terms(args[1])
        negated = _from_terms(-c, {atom: -coef for atom, coef in t.items()})
        return _simplify_index_call("add", (args[0], negated))
    if op == "mul":
        a, b = args
        if isinstance(a, Const) and not isinstance(b, Const):
            a, b = b, a
        if isinstance(b, Const):
            c, t = linear_terms(a)
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
    if isinstance(a, Call) and a.op == "mod" and isinstance(a.args[1], Const):
        # (x % (k*q)) // k == (x // k) % q for non-negative x: one canonical form for unravelled indices.
        modulus, inner = int(a.args[1].value), bounds(a.args[0])
        if modulus % k == 0 and inner is not None and inner[0] >= 0:
            return _mod(_floordiv(a.args[0], k), modulus // k)
    c, terms = linear_terms(a)
    aligned = _aligned_split(c, terms, k) if bounds(a) is not None else None
    if aligned is not None:
        g, high, _ = aligned
        return _floordiv(high, k // g)
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
    c, terms = linear_terms(a)
    aligned = _aligned_split(c, terms, k) if bounds(a) is not None else None
    if aligned is not None:
        g, high, low = aligned
        return call("add", call("mul", _mod(high, k // g), index(g)), low)
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


def _with_children(e: Expr, go: Callable[[Expr], Expr]) -> Expr:
    """``e`` rebuilt over ``go`` of its operands (``e`` itself when none changed)."""
    if isinstance(e, Load):
        new_index = tuple(go(i) for i in e.index)
        unchanged = all(a is b for a, b in zip(new_index, e.index, strict=True))
        return e if unchanged else Load(e.buffer, new_index, e.load_dtype)
    if isinstance(e, Call):
        new_args = tuple(go(a) for a in e.args)
        if e.op == "cast":
            return cast(new_args[0], e.result_dtype)
        if e.op == "where":
            return where(*new_args)
        unchanged = all(a is b for a, b in zip(new_args, e.args, strict=True))
        return e if unchanged else call(e.op, *new_args)
    return e


def rewrite(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: ``fn`` returns a replacement or None to keep the (rebuilt) node.

    ``fn`` sees each node after its operands were rewritten (and simplified), so it may match a
    node that only the rewrite created; a replacement itself is not rewritten again.
    """
    memo: dict[Expr, Expr] = {}

    def go(e: Expr) -> Expr:
        if e in memo:
            return memo[e]
        rebuilt = _with_children(e, go)
        out = fn(rebuilt)
        memo[e] = rebuilt if out is None else out
        return memo[e]

    return go(expr)


def substitute(expr: Expr, mapping: Mapping[Var, Expr]) -> Expr:
    """``expr`` with each variable of ``mapping`` replaced, all at once.

    Only the variables ``expr`` holds are replaced: a variable that appears in a replacement, or
    that simplification produces while operands are rebuilt, is never replaced again. Views and
    fused kernels name their placeholder variables by position (``v0``, ``v1``, ...), so the
    variables of the new index space routinely equal those of the old one in name and size; a
    substitution that looked at rebuilt nodes would send them through the mapping twice.
    """
    if not mapping:
        return expr
    memo: dict[Expr, Expr] = {}

    def go(e: Expr) -> Expr:
        if e not in memo:
            memo[e] = mapping.get(e, e) if isinstance(e, Var) else _with_children(e, go)
        return memo[e]

    return go(expr)


def where(cond: Expr, a: Expr, b: Expr) -> Expr:
    if isinstance(cond, Const):
        return a if cond.value else b
    if a == b:
        return a
    return Call("where", (cond, a, b), a.dtype)


