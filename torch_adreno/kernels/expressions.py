"""The expression table: how each IR op and constant is written in OpenCL C.

This is the only place where IR operations become C text; the code writer composes these
renderings. Every op of :data:`torch_adreno.ir.OPS` has an entry (a test checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch_adreno.ir import DType

#: C type of values of each dtype inside a kernel (booleans compute as int, are stored as uchar;
#: 16-bit floats compute as float, see ``half.cl``).
VALUE_CTYPE = {DType.F32: "float", DType.F16: "float", DType.BF16: "float", DType.I64: "long", DType.I32: "int",
               DType.BOOL: "int", DType.U8: "int"}
#: C type of buffer elements of each dtype. ``half`` is storage only (read and written through
#: vload_half/vstore_half_rte: core OpenCL, no cl_khr_fp16 needed); bfloat16 is stored as its bits.
STORAGE_CTYPE = {DType.F32: "float", DType.F16: "half", DType.BF16: "ushort", DType.I64: "long", DType.I32: "int",
                 DType.BOOL: "uchar", DType.U8: "uchar"}

Renderer = Callable[[Sequence[str], Sequence[DType], DType], str]


#: The C names of the two arguments that every kernel checking data-dependent indices takes after
#: its buffers: the device's index error record and the token the runtime gave this kernel.
INDEX_ERROR_ARG = "index_error"
INDEX_CHECK_TOKEN_ARG = "index_check_token"
#: What a kernel's source contains when it checks indices (and so takes those two arguments).
INDEX_CHECK_CALL = "adreno_checked_index("

#: Every kernel defines INDEX_T (int, or long when a buffer is too large for int offsets).
INDEX_CTYPE = "INDEX_T"


def value_ctype(dtype: DType) -> str:
    return INDEX_CTYPE if dtype is DType.INDEX else VALUE_CTYPE[dtype]


def literal(value: float | int | bool, dtype: DType) -> str:
    """A C literal of ``value`` as ``dtype``."""
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f" if v >= 0 else f"({text}f)"
    if dtype is DType.BOOL:
        return "1" if value else "0"
    v = int(value)
    if dtype is DType.I64:
        # LONG_MIN has no literal form; write it as an expression.
        return "(-9223372036854775807L - 1L)" if v == -(2**63) else f"({v}L)" if v < 0 else f"{v}L"
    return f"({v})" if v < 0 else str(v)


def _fmt(pattern: str) -> Renderer:
    return lambda a, t, r: pattern.format(*a)


def _by_kind(float_pattern: str, int_pattern: str) -> Renderer:
    def render(a: Sequence[str], t: Sequence[DType], r: DType) -> str:
        kind = t[0] if t else r
        return (float_pattern if kind.is_float else int_pattern).format(*a)

    return render


def _index_or_value(index_pattern: str, value_render: Renderer) -> Renderer:
    def render(a: Sequence[str], t: Sequence[DType], r: DType) -> str:
        if all(x is DType.INDEX for x in t):
            return index_pattern.format(*a)
        return value_render(a, t, r)

    return render


def _int_floordiv(a: Sequence[str], t: Sequence[DType], r: DType) -> str:
    # C division truncates; floor division subtracts one when the signs differ and a remainder exists.
    x, y = a
    return f"(({x}) / ({y}) - ((({x}) % ({y}) != 0) && ((({x}) < 0) != (({y}) < 0))))"


def _cast(a: Sequence[str], t: Sequence[DType], r: DType) -> str:
    if r is DType.BOOL:
        return f"(({a[0]}) != 0)"
    if r.is_half:
        return f"{ROUND_FUNCTION[r]}((float)({a[0]}))"
    return f"(({value_ctype(r)})({a[0]}))"


#: The function rounding a float to the nearest value of each 16-bit type (ties to even).
ROUND_FUNCTION = {DType.F16: "adreno_round_half", DType.BF16: "adreno_round_bf16"}


def load_text(dtype: DType, pointer: str, offset: str) -> str:
    """C text reading element ``offset`` of a buffer of ``dtype`` as a kernel value."""
    if dtype is DType.F16:
        return f"vload_half({offset}, {pointer})"
    if dtype is DType.BF16:
        return f"adreno_bf16_load({pointer}[{offset}])"
    return f"{pointer}[{offset}]"


def store_text(dtype: DType, pointer: str, offset: str, value: str) -> str:
    """A C statement writing ``value`` into element ``offset`` of a buffer of ``dtype``, rounded to
    nearest even where the type is narrower than float32."""
    # The value may be an integer (a count stored as a float16): vstore_half_rte is overloaded
    # for float and double only, so it is converted first (exact below 2**24, beyond float16's
    # range; bfloat16 converts through float as eager does).
    if dtype is DType.F16:
        return f"vstore_half_rte((float)({value}), {offset}, {pointer});"
    if dtype is DType.BF16:
        return f"{pointer}[{offset}] = adreno_bf16_bits((float)({value}));"
    return f"{pointer}[{offset}] = ({STORAGE_CTYPE[dtype]})({value});"


EXPRESSIONS: dict[str, Renderer] = {
    "add": _fmt("({0} + {1})"),
    "sub": _fmt("({0} - {1})"),
    "mul": _fmt("({0} * {1})"),
    "div": _fmt("({0} / {1})"),
    "neg": _fmt("(-{0})"),
    "abs": _by_kind("fabs({0})", "(({0}) < 0 ? -({0}) : ({0}))"),
    "exp": _fmt("exp({0})"),
    "log": _fmt("log({0})"),
    "sqrt": _fmt("sqrt({0})"),
    "rsqrt": _fmt("rsqrt({0})"),
    "tanh": _fmt("tanh({0})"),
    "sigmoid": _fmt("(1.0f / (1.0f + exp(-({0}))))"),
    # (x < 0 ? 0 : x) keeps NaN, like torch.relu.
    "relu": _by_kind("(({0}) < 0.0f ? 0.0f : ({0}))", "(({0}) < 0 ? 0 : ({0}))"),
    "sin": _fmt("sin({0})"),
    "cos": _fmt("cos({0})"),
    "floor": _by_kind("floor({0})", "({0})"),
    "ceil": _by_kind("ceil({0})", "({0})"),
    # rint rounds half to even, as torch.round does.
    "round": _by_kind("rint({0})", "({0})"),
    "trunc": _by_kind("trunc({0})", "({0})"),
    "sign": _by_kind("(isnan({0}) ? ({0}) : (float)((({0}) > 0.0f) - (({0}) < 0.0f)))",
                     "((({0}) > 0) - (({0}) < 0))"),
    "reciprocal": _fmt("(1.0f / ({0}))"),
    "erf": _fmt("erf({0})"),
    "log1p": _fmt("log1p({0})"),
    "expm1": _fmt("expm1({0})"),
    "log2": _fmt("log2({0})"),
    "exp2": _fmt("exp2({0})"),
    # On booleans (0/1 ints in a kernel) bitwise not is logical not: ~1 would be -2, i.e. true.
    "bitwise_not": lambda a, t, r: f"(!({a[0]}))" if t[0] is DType.BOOL else f"(~({a[0]}))",
    "floordiv": _index_or_value("({0} / {1})", lambda a, t, r: f"floor(({a[0]}) / ({a[1]}))"
                                if r.is_float else _int_floordiv(a, t, r)),
    "mod": _index_or_value("({0} % {1})", lambda a, t, r: EXPRESSIONS["remainder"](a, t, r)),
    "pow": _by_kind("pow({0}, {1})", "((long)pown((float)({0}), (int)({1})))"),
    # maximum/minimum propagate NaN (fmax would drop it).
    "maximum": _by_kind("((isnan({0}) || isnan({1})) ? NAN : fmax({0}, {1}))", "max({0}, {1})"),
    "minimum": _by_kind("((isnan({0}) || isnan({1})) ? NAN : fmin({0}, {1}))", "min({0}, {1})"),
    "fmod": _by_kind("fmod({0}, {1})", "(({0}) % ({1}))"),
    # Python-style remainder: the sign follows the divisor.
    "remainder": _by_kind("(({0}) - floor(({0}) / ({1})) * ({1}))", "(((({0}) % ({1})) + ({1})) % ({1}))"),
    "atan2": _fmt("atan2({0}, {1})"),
    "bitwise_and": _fmt("({0} & {1})"),
    "bitwise_or": _fmt("({0} | {1})"),
    "bitwise_xor": _fmt("({0} ^ {1})"),
    "eq": _fmt("({0} == {1})"),
    "ne": _fmt("({0} != {1})"),
    "lt": _fmt("({0} < {1})"),
    "le": _fmt("({0} <= {1})"),
    "gt": _fmt("({0} > {1})"),
    "ge": _fmt("({0} >= {1})"),
    "logical_and": _fmt("({0} && {1})"),
    "logical_or": _fmt("({0} || {1})"),
    "logical_xor": _fmt("((!({0})) != (!({1})))"),
    "logical_not": _fmt("(!({0}))"),
    "isnan": _by_kind("isnan({0})", "0"),
    "where": _fmt("({0} ? {1} : {2})"),
    "cast": _cast,
    # Defined in random.cl, which a program includes when one of its kernels calls it.
    "uniform": _fmt("adreno_uniform((ulong)({0}), (ulong)({1}))"),
    # Defined in index_check.cl; reads the two kernel arguments every checking kernel ends with.
    "checked_index": lambda a, t, r: (
        f"((INDEX_T)adreno_checked_index((long)({a[0]}), {a[1]}L, {a[2]}, {a[3]}, "
        f"{INDEX_ERROR_ARG}, {INDEX_CHECK_TOKEN_ARG}))"),
}

#: Helper functions some renderings call, with the ``.cl`` file that defines each.
HELPER_SOURCES = {"adreno_uniform(": "random.cl", "adreno_checked_index(": "index_check.cl", "adreno_round_half(": "half.cl", "adreno_round_bf16(": "half.cl",
                  "adreno_bf16_load(": "half.cl", "adreno_bf16_bits(": "half.cl"}

#: Arguments of these ops that are only evaluated when the op needs them (C short-circuit and the
#: conditional operator). The code writer must not hoist loads out of them: the guard is what keeps
#: an out-of-bounds read (a padded convolution tap, say) from happening.
GUARDED_ARGS: dict[str, tuple[int, ...]] = {"where": (1, 2), "logical_and": (1,), "logical_or": (1,)}


def render_op(op: str, args: Sequence[str], arg_dtypes: Sequence[DType], result: DType) -> str:
    return EXPRESSIONS[op](args, arg_dtypes, result)


# -- reductions ---------------------------------------------------------------------------------


def reduction_init(op: str, dtype: DType) -> str:
    """The identity a reduction starts from."""
    if op in ("sum", "any"):
        return literal(0, dtype)
    if op in ("prod", "all"):
        return literal(1, dtype)
    if op in ("max", "argmax"):
        return literal(float("-inf"), dtype) if dtype.is_float else _int_extreme(dtype, low=True)
    if op in ("min", "argmin"):
        return literal(float("inf"), dtype) if dtype.is_float else _int_extreme(dtype, low=False)
    raise KeyError(op)


def _int_extreme(dtype: DType, low: bool) -> str:
    if dtype is DType.I64:
        return "LONG_MIN" if low else "LONG_MAX"
    if dtype is DType.BOOL:
        return "0" if low else "1"
    return "INT_MIN" if low else "INT_MAX"


def reduction_combine(op: str, acc: str, value: str, dtype: DType) -> str:
    """The new accumulator after folding ``value`` into ``acc`` (NaN propagates for max/min)."""
    if op == "sum":
        return f"{acc} + {value}"
    if op == "prod":
        return f"{acc} * {value}"
    if op == "any":
        return f"({acc} || {value})"
    if op == "all":
        return f"({acc} && {value})"
    nan = dtype.is_float
    if op == "max":
        return f"(({value}) > {acc} || isnan({value})) ? ({value}) : {acc}" if nan else f"max({acc}, {value})"
    if op == "min":
        return f"(({value}) < {acc} || isnan({value})) ? ({value}) : {acc}" if nan else f"min({acc}, {value})"
    raise KeyError(op)


def arg_better(op: str, value: str, index: str, best: str, best_index: str, dtype: DType) -> str:
    """Whether (value, index) beats (best, best_index): strictly better, NaN first, then lower index."""
    cmp = ">" if op == "argmax" else "<"
    if dtype.is_float:
        return (f"({best_index} < 0 || (isnan({value}) && !isnan({best})) || "
                f"(!isnan({best}) && ({value} {cmp} {best} || ({value} == {best} && {index} < {best_index}))) || "
                f"(isnan({value}) && isnan({best}) && {index} < {best_index}))")
    return f"({best_index} < 0 || {value} {cmp} {best} || ({value} == {best} && {index} < {best_index}))"
