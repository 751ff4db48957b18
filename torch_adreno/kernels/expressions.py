"""How IR ops, constants, loads and stores are written in OpenCL C.

This is the only place where IR operations become C text; the code writer composes these
renderings. What each op's C expression is lives in the op table (``opencl`` of
:data:`torch_adreno.ir.ops.OPS`): this module fills in its patterns, with the names only kernels
know (C types, the rounding helpers, the index-check arguments).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

from torch_adreno.ir import DType
from torch_adreno.ir.ops import OPS

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


#: Helper functions some renderings call, with the ``.cl`` file that defines each.
HELPER_SOURCES = {"adreno_uniform(": "random.cl", "adreno_checked_index(": "index_check.cl", "adreno_round_half(": "half.cl", "adreno_round_bf16(": "half.cl",
                  "adreno_bf16_load(": "half.cl", "adreno_bf16_bits(": "half.cl"}

#: Arguments of these ops that are only evaluated when the op needs them (the table's
#: ``lazy_args``). The code writer must not hoist loads out of them: the guard is what keeps an
#: out-of-bounds read (a padded convolution tap, say) from happening.
GUARDED_ARGS: dict[str, tuple[int, ...]] = {name: op.lazy_args for name, op in OPS.items() if op.lazy_args}


def render_op(op: str, args: Sequence[str], arg_dtypes: Sequence[DType], result: DType) -> str:
    """C text of IR op ``op`` on arguments ``args`` (C texts) of types ``arg_dtypes``: the table's
    form for those types, with the kernels' names filled in."""
    pattern = OPS[op].opencl.pick(arg_dtypes, result)
    return pattern.format(*args, ctype=value_ctype(result), round=ROUND_FUNCTION.get(result, ""),
                          index_ctype=INDEX_CTYPE, index_error=INDEX_ERROR_ARG,
                          index_check_token=INDEX_CHECK_TOKEN_ARG)


#: One renderer per op, ``render_op`` bound to its name (derived from the table, for callers that
#: look renderings up by op).
EXPRESSIONS: dict[str, Renderer] = {name: partial(render_op, name) for name in OPS}


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
