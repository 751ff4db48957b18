"""The code writer: turns IR expressions into OpenCL C statements.

One writer renders one kernel (or one helper function). It numbers temporaries, shares common
sub-expressions (CSE), and places each temporary in the outermost loop scope where all of its
variables exist, so loop-invariant work leaves the reduction loop. Sub-expressions that C only
evaluates conditionally (the branches of ``where``, the right side of ``&&``/``||``) are written
inline when they read memory: hoisting them would turn a guarded read into an unguarded one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch_adreno import ir
from torch_adreno.kernels.expressions import (
    GUARDED_ARGS,
    INDEX_CHECK_TOKEN_ARG,
    INDEX_ERROR_ARG,
    literal,
    load_text,
    render_op,
    store_text,
    value_ctype,
)
from torch_adreno.kernels.params import (
    INDEX_ERROR_KEY,
    INDEX_TOKEN_KEY,
    KernelParam,
    Role,
    buffer_record,
)


@dataclass
class Param:
    """A kernel parameter bound to an IR buffer, as the code writer uses it (with the buffer's
    shape, for flat indices); :meth:`record` is what the kernel carries of it."""

    buffer: str
    c_name: str
    dtype: ir.DType
    shape: tuple[int, ...]
    written: bool
    #: Another parameter of the kernel uses the same bytes (an in-place update): no ``restrict``.
    aliased: bool = False

    def record(self) -> KernelParam:
        return buffer_record(self.buffer, self.c_name, self.dtype, self.written, self.aliased)

    def declaration(self) -> str:
        return self.record().declaration()


class IndexCheckParam(Param):
    """One of the two arguments a kernel that checks data-dependent indices takes after its
    buffers (see ``index_check.cl``): not an IR buffer; the runtime binds it."""

    def record(self) -> KernelParam:
        if self.c_name == INDEX_ERROR_ARG:
            return KernelParam(INDEX_ERROR_KEY, INDEX_ERROR_ARG, Role.INDEX_ERROR, ir.DType.I32, written=True,
                               aliased=True)
        return KernelParam(INDEX_TOKEN_KEY, INDEX_CHECK_TOKEN_ARG, Role.INDEX_TOKEN, ir.DType.I32,
                           address_space="__private")


#: Keys of the index check arguments in a kernel's parameter map (no IR buffer has such a name).
INDEX_CHECK_PARAMS = (INDEX_ERROR_KEY, INDEX_TOKEN_KEY)


def with_index_check_params(params: Mapping[str, Param]) -> dict[str, Param]:
    """``params`` followed by the index check arguments."""
    extra = {key: IndexCheckParam(key, c_name, ir.DType.I32, (), written=True, aliased=True)
             for key, c_name in zip(INDEX_CHECK_PARAMS, (INDEX_ERROR_ARG, INDEX_CHECK_TOKEN_ARG), strict=True)}
    return {**params, **extra}


def records(params: Mapping[str, Param]) -> tuple[KernelParam, ...]:
    """The parameter records of ``params``, in order."""
    return tuple(p.record() for p in params.values())


@dataclass
class Scope:
    """A block of statements; ``defines`` are the loop variables that become known in it."""

    defines: set[ir.Var] = field(default_factory=set)
    lines: list[str] = field(default_factory=list)


class CodeWriter:
    """Writes expressions of one kernel into scoped C statements."""

    def __init__(self, params: Mapping[str, Param], var_names: Mapping[ir.Var, str] | None = None,
                 prefix: str = "t", registers: Mapping[ir.Load, str] | None = None, native_half: bool = False,
                 linear: tuple[str, tuple[ir.Expr, ...], tuple[int, ...]] | None = None) -> None:
        self.params = params
        #: float16 values are ``half`` in registers (cl_khr_fp16), not floats rounded to float16.
        self.native_half = native_half
        #: Loads served from registers: a kernel's own results read where it produces them.
        self.registers: dict[ir.Load, str] = dict(registers or {})
        self.var_names: dict[ir.Var, str] = dict(var_names or {})
        #: (name, loop variables, ranges) of a kernel's linear element index: an element read at
        #: the kernel's own index of a buffer of the kernel's own shape is read at it, with no
        #: index arithmetic (and no code that depends on the shape).
        self._linear: tuple[ir.Var, tuple[ir.Expr, ...], tuple[int, ...]] | None = None
        if linear is not None:
            name, loop_vars, ranges = linear
            self._linear = (ir.Var(name, math.prod(ranges)), tuple(loop_vars), tuple(ranges))
            self.var_names[self._linear[0]] = name
        self.scopes: list[Scope] = [Scope(set(self.var_names))]
        self._temps: dict[ir.Expr, str] = {}
        self._prefix = prefix
        self._count = 0
        self._free_vars: dict[ir.Expr, frozenset[ir.Var]] = {}
        self._has_load: dict[ir.Expr, bool] = {}

    # -- scopes ------------------------------------------------------------------------------------

    def open_scope(self, var_names: Mapping[ir.Var, str]) -> None:
        self.var_names.update(var_names)
        self.scopes.append(Scope(set(var_names)))

    def close_scope(self) -> list[str]:
        """Pop the innermost scope and return its statements; its temporaries are forgotten."""
        scope = self.scopes.pop()
        for var in scope.defines:
            self.var_names.pop(var, None)
        self._temps = {e: n for e, n in self._temps.items() if not (self.free_vars(e) & scope.defines)}
        return scope.lines

    def emit(self, line: str) -> None:
        self.scopes[-1].lines.append(line)

    def take_lines(self) -> list[str]:
        """Statements emitted so far into the current (innermost) scope; later ones start afresh.

        Reduction kernels cut the outer scope at each pass over the row, so that values derived
        from a pass's results are computed after that pass, not hoisted before it.
        """
        lines = self.scopes[-1].lines
        self.scopes[-1].lines = []
        return lines

    # -- analysis ----------------------------------------------------------------------------------

    def free_vars(self, expr: ir.Expr) -> frozenset[ir.Var]:
        cached = self._free_vars.get(expr)
        if cached is None:
            if isinstance(expr, ir.Var):
                cached = frozenset([expr])
            else:
                cached = frozenset().union(*(self.free_vars(c) for c in expr.children()))
            self._free_vars[expr] = cached
        return cached

    def has_load(self, expr: ir.Expr) -> bool:
        cached = self._has_load.get(expr)
        if cached is None:
            cached = isinstance(expr, ir.Load) or any(self.has_load(c) for c in expr.children())
            self._has_load[expr] = cached
        return cached

    def _scope_for(self, expr: ir.Expr) -> Scope:
        needed = self.free_vars(expr)
        for scope in self.scopes:
            needed = needed - scope.defines
            if not needed:
                return scope
        missing = ", ".join(sorted(v.name for v in self.free_vars(expr)))
        raise ValueError(f"expression {expr} uses variables not defined in any open scope ({missing})")

    # -- rendering ---------------------------------------------------------------------------------

    def flat_index(self, buffer: str, index: tuple[ir.Expr, ...]) -> ir.Expr:
        shape = self.params[buffer].shape
        if self._linear is not None and shape == self._linear[2] and tuple(index) == self._linear[1]:
            return self._linear[0]
        flat: ir.Expr = ir.index(0)
        for e, stride in zip(index, ir.contiguous_strides(shape), strict=True):
            flat = ir.call("add", flat, ir.call("mul", e, ir.index(stride)))
        return flat

    def expr(self, expr: ir.Expr, guarded: bool = False) -> str:
        """C text for ``expr``; emits the temporaries it needs (none for guarded reads)."""
        if isinstance(expr, ir.Var):
            return self.var_names[expr]
        if isinstance(expr, ir.Const):
            if self._native(expr.dtype):
                return f"((half){literal(expr.value, expr.dtype)})"
            return literal(expr.value, expr.dtype) if expr.dtype is not ir.DType.INDEX else str(int(expr.value))
        known = self._temps.get(expr)
        if known is not None:
            return known
        if isinstance(expr, ir.Load) and expr in self.registers:
            if not expr.dtype.is_half:
                return self.registers[expr]
            # A register holds a float32 accumulator; readers of a 16-bit result see it rounded,
            # as they would had it been stored.
            return self._temporary(expr, render_op("cast", [self.registers[expr]], [ir.DType.F32], expr.dtype))
        if guarded and self.has_load(expr):
            return self._render(expr, guarded=True)
        if isinstance(expr, ir.Call) and expr.op == "cast" and expr.args[0].dtype.is_half and expr.dtype.is_float \
                and not expr.dtype.is_half and not self._native(expr.args[0].dtype):
            return self.expr(expr.args[0], guarded)  # (a 16-bit value already is a float in registers)
        text = self._render(expr, guarded=False)
        if isinstance(expr, ir.Call) and expr.op == "cast" and isinstance(expr.args[0], ir.Var):
            return text
        return self._temporary(expr, text)

    def _temporary(self, expr: ir.Expr, text: str) -> str:
        name = f"{self._prefix}{self._count}"
        self._count += 1
        ctype = "half" if self._native(expr.dtype) else value_ctype(expr.dtype)
        self._scope_for(expr).lines.append(f"const {ctype} {name} = {text};")
        self._temps[expr] = name
        return name

    def _native(self, dtype: ir.DType) -> bool:
        return self.native_half and dtype is ir.DType.F16

    def _render(self, expr: ir.Expr, guarded: bool) -> str:
        if isinstance(expr, ir.Load):
            param = self.params[expr.buffer]
            offset = self.expr(self.flat_index(expr.buffer, expr.index), guarded)
            if self._native(param.dtype):
                return f"{param.c_name}[{offset}]"
            return load_text(param.dtype, param.c_name, offset)
        assert isinstance(expr, ir.Call)
        guarded_args = GUARDED_ARGS.get(expr.op, ())
        args = [self.expr(a, guarded or i in guarded_args) for i, a in enumerate(expr.args)]
        if expr.op == "cast" and (self._native(expr.dtype) or self._native(expr.args[0].dtype)):
            # (conversions to half round to nearest even, OpenCL's default for floating types)
            return f"(({'half' if self._native(expr.dtype) else value_ctype(expr.dtype)})({args[0]}))"
        return render_op(expr.op, args, [a.dtype for a in expr.args], expr.dtype)

    def store_statement(self, buffer: str, offset: str, value: str) -> str:
        param = self.params[buffer]
        if self._native(param.dtype):
            return f"{param.c_name}[{offset}] = (half)({value});"
        return store_text(param.dtype, param.c_name, offset, value)

    def store(self, buffer: str, offset: str, value: str) -> None:
        self.emit(self.store_statement(buffer, offset, value))
