"""The op table: every IR operation defined once, in :data:`OPS`.

An entry (:class:`OpInfo`) is everything the pipeline knows of one op:

* its IR form: name, arity, how its result type is formed (``result``), whether it is exact on
  16-bit floats, which arguments are evaluated only when needed (``lazy_args``);
* its OpenCL C expression (``opencl``): ``str.format`` patterns, read by ``kernels.expressions``;
* its ONNX body (``onnx``): a recipe of standard ONNX nodes, read by ``export.kernel_bodies``;
* its floating-point work (``flops``), read by ``kernels.estimate_flops`` for the roofline.

Entries are plain data (strings, numbers, recipes), so that the IR imports nothing of the stages
that read them; each stage interprets them and keeps no table of its own. An op with several forms
(float and integer arguments, say) gives one per kind of operand (:class:`ByKind`), and every stage
picks the form the same way.

FLOP rule (``flops``): floating-point operations per evaluation, counted for a call whose result
is a float; a call with an integer, boolean or index result counts nothing (index and integer
arithmetic is not floating-point work). Every arithmetic op, select and transcendental counts 1
(``where``, ``relu`` and ``exp`` alike: the roofline compares against a device's measured rate,
not its issue slots); casts count 0 (a conversion, no arithmetic); comparisons, logical, bitwise
and index ops count 0 (their results are never floats).

Bytes: no op moves bytes. A kernel's bytes are those of the buffers it reads and writes (its
loads and stores, counted per buffer by the kernels stage); ``checked_index`` writes its error
record only when an index is out of range, which is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Generic, Literal, TypeAlias, TypeVar

from torch_adreno.ir.dtype import DType

T = TypeVar("T")

#: How an op's result type is formed: "same" (its first argument's), "bool", "float" (float32),
#: "index", "where" (its second argument's), "given" (a cast: the type asked for).
ResultRule: TypeAlias = Literal["same", "bool", "float", "index", "where", "given"]


@dataclass(frozen=True)
class ByKind(Generic[T]):
    """One form of an op per kind of operand; :meth:`pick` chooses.

    ``on_index`` where every argument is an index; otherwise by the kind of the first argument's
    type (of the result type where ``by_result``, or where there are no arguments): ``on_bool``
    for booleans, ``on_half`` for 16-bit floats, ``on_float`` for floats, ``default`` for the rest
    and for any kind without a form of its own.
    """

    default: T
    on_float: T | None = None
    on_half: T | None = None
    on_bool: T | None = None
    on_index: T | None = None
    by_result: bool = False

    def pick(self, args: Sequence[DType], result: DType) -> T:
        if self.on_index is not None and all(a is DType.INDEX for a in args):
            return self.on_index
        kind = result if self.by_result or not args else args[0]
        if kind is DType.BOOL and self.on_bool is not None:
            return self.on_bool
        if kind.is_half and self.on_half is not None:
            return self.on_half
        if kind.is_float and self.on_float is not None:
            return self.on_float
        return self.default

    def forms(self) -> Iterator[T]:
        """Every form given, ``default`` first."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "by_result" and value is not None:
                yield value


# -- ONNX recipes ----------------------------------------------------------------------------------
# An op's ONNX body is a tree of these over its (cast) arguments; export.kernel_bodies builds it.

#: The type an argument is cast to before the body reads it (where its ONNX type differs):
#: a dtype, "result" (the op's result type), "common" (float32 where any argument is a float, else
#: int64), "arg1" (argument 1's type), or None (as it is).
Target: TypeAlias = DType | Literal["result", "common", "arg1"] | None


@dataclass(frozen=True)
class Arg:
    """Argument ``position`` of the op, cast to its :attr:`OnnxBody.operands` target."""

    position: int


@dataclass(frozen=True)
class Lit:
    """A constant ``value`` of ``dtype`` (None: the op's result type)."""

    value: float | int | bool
    dtype: DType | None = None


@dataclass(frozen=True)
class OnnxOp:
    """The standard ONNX op ``op_type`` over ``inputs`` with attributes ``attrs``. ``hint`` names
    its value (None: the IR op's name for the body's root, ``op_type`` in lower case inside)."""

    op_type: str
    inputs: tuple[Recipe, ...]
    attrs: tuple[tuple[str, int | float | str], ...] = ()
    hint: str | None = None


@dataclass(frozen=True)
class CastTo:
    """``value`` cast to the type ``to`` names (a :data:`Target` other than None)."""

    value: Recipe
    to: Target


@dataclass(frozen=True)
class IfFlag:
    """``when_set``, or ``when_clear`` where argument ``position`` is a constant false: a flag the
    kernel reads at run time and the ONNX body resolves when it is built."""

    position: int
    when_set: Recipe
    when_clear: Recipe


Recipe: TypeAlias = Arg | Lit | OnnxOp | CastTo | IfFlag


@dataclass(frozen=True)
class OnnxBody:
    """``value`` over the op's arguments, each cast to ``operands`` (one target for all, or one per
    argument). Only the arguments ``value`` reads are translated."""

    value: Recipe
    operands: Target | tuple[Target, ...] = "result"

    def operand(self, position: int) -> Target:
        return self.operands[position] if isinstance(self.operands, tuple) else self.operands


def _onnx(op_type: str, *inputs: Recipe, hint: str | None = None, **attrs: int | float | str) -> OnnxOp:
    return OnnxOp(op_type, inputs, tuple(attrs.items()), hint)


def _one(value: Recipe, operands: Target | tuple[Target, ...] = "result") -> ByKind[OnnxBody]:
    return ByKind(OnnxBody(value, operands))


def _floats_only(value: Recipe) -> ByKind[OnnxBody]:
    """``value`` on floats; on integers the argument itself (rounding an integer changes nothing)."""
    return ByKind(OnnxBody(X), on_float=OnnxBody(value), by_result=True)


X, Y, Z = Arg(0), Arg(1), Arg(2)


# -- the table -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpInfo:
    """Everything the pipeline knows of one IR op (see the module's docstring).

    ``opencl`` forms are ``str.format`` patterns over the arguments' C texts (``{0}``, ``{1}``, ...)
    and the names the kernels supply: ``{ctype}`` (the result's C value type), ``{round}`` (the
    function rounding a float to the 16-bit result type), ``{index_ctype}``, ``{index_error}`` and
    ``{index_check_token}`` (the index type and the two arguments of an index-checking kernel).
    ``onnx`` is None for an op with no standard-ONNX form (the export refuses it, naming the op).
    """

    name: str
    arity: int
    result: ResultRule
    opencl: ByKind[str]
    onnx: ByKind[OnnxBody] | None
    flops: int
    #: The result is one of the arguments' values or an integer: on 16-bit floats it needs no
    #: rounding. Every other op with a 16-bit result is computed in float32 and rounded (a cast).
    exact_on_half: bool = False
    #: Arguments evaluated only when the op needs them (C short-circuit and the conditional
    #: operator): the code writer must not hoist loads out of them, as the guard is what keeps an
    #: out-of-bounds read (a padded convolution tap, say) from happening.
    lazy_args: tuple[int, ...] = ()
    #: A transcendental function: recomputing it costs several arithmetic ops (fusion's inlining
    #: cost weighs these).
    transcendental: bool = False

    def result_dtype(self, args: Sequence[DType], given: DType | None = None) -> DType:
        """The result type of this op on arguments of types ``args`` (``given``: a cast's target)."""
        if self.result == "given":
            if given is None:
                raise ValueError(f"IR op {self.name!r} needs a target dtype")
            return given
        fixed = {"bool": DType.BOOL, "float": DType.F32, "index": DType.INDEX}.get(self.result)
        if fixed is not None:
            return fixed
        return args[1] if self.result == "where" else args[0]


def _c(pattern: str) -> ByKind[str]:
    return ByKind(pattern)


def _c_by_kind(on_float: str, default: str) -> ByKind[str]:
    return ByKind(default, on_float=on_float)


def _unary(name: str, c: ByKind[str], onnx: ByKind[OnnxBody] | None, flops: int = 1, *,
           exact_on_half: bool = False, transcendental: bool = False) -> OpInfo:
    return OpInfo(name, 1, "same", c, onnx, flops, exact_on_half=exact_on_half, transcendental=transcendental)


def _binary(name: str, c: ByKind[str], onnx: ByKind[OnnxBody] | None, flops: int = 1, *,
            exact_on_half: bool = False, transcendental: bool = False) -> OpInfo:
    return OpInfo(name, 2, "same", c, onnx, flops, exact_on_half=exact_on_half, transcendental=transcendental)


def _compare(name: str, c_operator: str, onnx: Recipe) -> OpInfo:
    return OpInfo(name, 2, "bool", _c(f"({{0}} {c_operator} {{1}})"), _one(onnx, "common"), 0)


def _bitwise(name: str, c_operator: str, logical: str, bitwise: str) -> OpInfo:
    # On booleans ONNX has only the logical ops (equal to the bitwise ones on 0/1).
    onnx = ByKind(OnnxBody(_onnx(bitwise, X, Y)), on_bool=OnnxBody(_onnx(logical, X, Y)), by_result=True)
    return OpInfo(name, 2, "same", _c(f"({{0}} {c_operator} {{1}})"), onnx, 0)


def _logical(name: str, c: str, onnx_op: str) -> OpInfo:
    return OpInfo(name, 2, "bool", _c(c), _one(_onnx(onnx_op, X, Y), DType.BOOL), 0)


#: Python-style remainder: the sign follows the divisor.
_REMAINDER_C = _c_by_kind("(({0}) - floor(({0}) / ({1})) * ({1}))", "(((({0}) % ({1})) + ({1})) % ({1}))")
#: x - floor(x / y) * y on floats, as the kernels compute it; ONNX's Mod with fmod=0 on integers.
_REMAINDER_ONNX = ByKind(OnnxBody(_onnx("Mod", X, Y, fmod=0)),
                         on_float=OnnxBody(_onnx("Sub", X, _onnx("Mul", _onnx("Floor", _onnx("Div", X, Y)), Y))),
                         by_result=True)

#: checked_index's value after wrapping: -size <= value < 0 counts from the end where ``wraps``.
_INDEX_ZERO = Lit(0, DType.INDEX)
_WRAPPED = IfFlag(3, _onnx("Where", _onnx("Less", X, _INDEX_ZERO), _onnx("Add", X, Y), X, hint="wrap"), X)

_TABLE: tuple[OpInfo, ...] = (
    # -- unary, result of the argument's type
    _unary("neg", _c("(-{0})"), _one(_onnx("Neg", X)), exact_on_half=True),
    _unary("abs", _c_by_kind("fabs({0})", "(({0}) < 0 ? -({0}) : ({0}))"), _one(_onnx("Abs", X)), exact_on_half=True),
    _unary("exp", _c("exp({0})"), _one(_onnx("Exp", X)), transcendental=True),
    _unary("log", _c("log({0})"), _one(_onnx("Log", X)), transcendental=True),
    _unary("sqrt", _c("sqrt({0})"), _one(_onnx("Sqrt", X)), transcendental=True),
    _unary("rsqrt", _c("rsqrt({0})"), _one(_onnx("Reciprocal", _onnx("Sqrt", X))), transcendental=True),
    _unary("tanh", _c("tanh({0})"), _one(_onnx("Tanh", X)), transcendental=True),
    _unary("sigmoid", _c("(1.0f / (1.0f + exp(-({0}))))"), _one(_onnx("Sigmoid", X)), transcendental=True),
    # (x < 0 ? 0 : x) keeps NaN, like torch.relu.
    _unary("relu", _c_by_kind("(({0}) < 0.0f ? 0.0f : ({0}))", "(({0}) < 0 ? 0 : ({0}))"),
           _one(_onnx("Where", _onnx("Less", X, Lit(0)), Lit(0), X)), exact_on_half=True),
    _unary("sin", _c("sin({0})"), _one(_onnx("Sin", X)), transcendental=True),
    _unary("cos", _c("cos({0})"), _one(_onnx("Cos", X)), transcendental=True),
    _unary("floor", _c_by_kind("floor({0})", "({0})"), _floats_only(_onnx("Floor", X)), exact_on_half=True),
    _unary("ceil", _c_by_kind("ceil({0})", "({0})"), _floats_only(_onnx("Ceil", X)), exact_on_half=True),
    # rint rounds half to even, as torch.round (and ONNX's Round) does.
    _unary("round", _c_by_kind("rint({0})", "({0})"), _floats_only(_onnx("Round", X)), exact_on_half=True),
    _unary("trunc", _c_by_kind("trunc({0})", "({0})"),
           _floats_only(_onnx("Where", _onnx("Less", X, Lit(0)), _onnx("Ceil", X), _onnx("Floor", X))),
           exact_on_half=True),
    _unary("sign", _c_by_kind("(isnan({0}) ? ({0}) : (float)((({0}) > 0.0f) - (({0}) < 0.0f)))",
                              "((({0}) > 0) - (({0}) < 0))"), _one(_onnx("Sign", X)), exact_on_half=True),
    _unary("reciprocal", _c("(1.0f / ({0}))"), _one(_onnx("Reciprocal", X))),
    _unary("erf", _c("erf({0})"), _one(_onnx("Erf", X)), transcendental=True),
    _unary("log1p", _c("log1p({0})"), _one(_onnx("Log", _onnx("Add", X, Lit(1.0)))), transcendental=True),
    _unary("expm1", _c("expm1({0})"), _one(_onnx("Sub", _onnx("Exp", X), Lit(1.0))), transcendental=True),
    _unary("log2", _c("log2({0})"), _one(_onnx("Div", _onnx("Log", X), Lit(math.log(2.0)))), transcendental=True),
    _unary("exp2", _c("exp2({0})"), _one(_onnx("Pow", Lit(2.0), X)), transcendental=True),
    # On booleans (0/1 ints in a kernel) bitwise not is logical not: ~1 would be -2, i.e. true.
    _unary("bitwise_not", ByKind("(~({0}))", on_bool="(!({0}))"),
           ByKind(OnnxBody(_onnx("BitwiseNot", X)), on_bool=OnnxBody(_onnx("Not", X)), by_result=True), flops=0),
    # -- binary, result of the first argument's type
    _binary("add", _c("({0} + {1})"), _one(_onnx("Add", X, Y))),
    _binary("sub", _c("({0} - {1})"), _one(_onnx("Sub", X, Y))),
    _binary("mul", _c("({0} * {1})"), _one(_onnx("Mul", X, Y))),
    _binary("div", _c("({0} / {1})"), _one(_onnx("Div", X, Y))),
    # Index floor division is on non-negative values (the IR's invariant): C's truncation is floor.
    # On other integers C truncates, so one is subtracted where the signs differ and a remainder exists.
    _binary("floordiv", ByKind("(({0}) / ({1}) - ((({0}) % ({1}) != 0) && ((({0}) < 0) != (({1}) < 0))))",
                               on_float="floor(({0}) / ({1}))", on_index="({0} / {1})", by_result=True),
            ByKind(OnnxBody(_onnx("Div", _onnx("Sub", X, _onnx("Mod", X, Y, fmod=0)), Y)),
                   on_float=OnnxBody(_onnx("Floor", _onnx("Div", X, Y))), on_index=OnnxBody(_onnx("Div", X, Y)),
                   by_result=True)),
    _binary("mod", ByKind(_REMAINDER_C.default, on_float=_REMAINDER_C.on_float, on_index="({0} % {1})"),
            _REMAINDER_ONNX),
    # Integer powers through float, as pown computes them.
    _binary("pow", _c_by_kind("pow({0}, {1})", "((long)pown((float)({0}), (int)({1})))"),
            ByKind(OnnxBody(CastTo(_onnx("Pow", X, Y), "result"), DType.F32), on_float=OnnxBody(_onnx("Pow", X, Y)),
                   by_result=True), transcendental=True),
    # maximum/minimum propagate NaN (fmax would drop it); so do ONNX's Max and Min.
    _binary("maximum", _c_by_kind("((isnan({0}) || isnan({1})) ? NAN : fmax({0}, {1}))", "max({0}, {1})"),
            _one(_onnx("Max", X, Y)), exact_on_half=True),
    _binary("minimum", _c_by_kind("((isnan({0}) || isnan({1})) ? NAN : fmin({0}, {1}))", "min({0}, {1})"),
            _one(_onnx("Min", X, Y)), exact_on_half=True),
    _binary("fmod", _c_by_kind("fmod({0}, {1})", "(({0}) % ({1}))"), _one(_onnx("Mod", X, Y, fmod=1))),
    _binary("remainder", _REMAINDER_C, _REMAINDER_ONNX),
    _binary("atan2", _c("atan2({0}, {1})"), None, transcendental=True),
    _bitwise("bitwise_and", "&", "And", "BitwiseAnd"),
    _bitwise("bitwise_or", "|", "Or", "BitwiseOr"),
    _bitwise("bitwise_xor", "^", "Xor", "BitwiseXor"),
    # -- comparisons and logic, boolean results
    _compare("eq", "==", _onnx("Equal", X, Y)),
    _compare("ne", "!=", _onnx("Not", _onnx("Equal", X, Y))),
    _compare("lt", "<", _onnx("Less", X, Y)),
    _compare("le", "<=", _onnx("LessOrEqual", X, Y)),
    _compare("gt", ">", _onnx("Greater", X, Y)),
    _compare("ge", ">=", _onnx("GreaterOrEqual", X, Y)),
    # The right argument of && and || is evaluated only where the left does not decide.
    OpInfo("logical_and", 2, "bool", _c("({0} && {1})"), _one(_onnx("And", X, Y), DType.BOOL), 0, lazy_args=(1,)),
    OpInfo("logical_or", 2, "bool", _c("({0} || {1})"), _one(_onnx("Or", X, Y), DType.BOOL), 0, lazy_args=(1,)),
    _logical("logical_xor", "((!({0})) != (!({1})))", "Xor"),
    OpInfo("logical_not", 1, "bool", _c("(!({0}))"), _one(_onnx("Not", X), DType.BOOL), 0),
    OpInfo("isnan", 1, "bool", _c_by_kind("isnan({0})", "0"),
           ByKind(OnnxBody(Lit(False, DType.BOOL)), on_float=OnnxBody(_onnx("IsNaN", X), None)), 0),
    # -- the rest
    # fma(a, b, c) = a * b + c rounded once (floats): an unrolled sum of products accumulates
    # through it, as a GEMM's inner loop does.
    OpInfo("fma", 3, "same", _c("fma({0}, {1}, {2})"), _one(_onnx("Add", _onnx("Mul", X, Y), Z)), 2),
    # where(cond, a, b): only the branch taken is evaluated.
    OpInfo("where", 3, "where", _c("({0} ? {1} : {2})"),
           _one(_onnx("Where", X, Y, Z), (DType.BOOL, None, "arg1")), 1, exact_on_half=True, lazy_args=(1, 2)),
    OpInfo("cast", 1, "given",
           ByKind("(({ctype})({0}))", on_bool="(({0}) != 0)", on_half="{round}((float)({0}))", by_result=True),
           _one(X), 0),
    # uniform(seed, counter): a float in [0, 1), a pure function of its arguments (counter-based
    # generator), so recomputing it in several kernels gives the same numbers. Defined in random.cl.
    OpInfo("uniform", 2, "float", _c("adreno_uniform((ulong)({0}), (ulong)({1}))"), None, 1),
    # checked_index(value, size, site, wraps): a loaded tensor value used as an index into a
    # dimension of ``size``, checked on the device (see ``Graph.index_checks[site]``); ``wraps``
    # (1/0) says whether -size <= value < 0 counts from the end. Always in [0, size): a value out of
    # range is recorded as an error for the host and replaced by 0, so nothing is read out of bounds.
    # Defined in index_check.cl; the ONNX body computes the same value (it cannot record the error).
    OpInfo("checked_index", 4, "index",
           _c("(({index_ctype})adreno_checked_index((long)({0}), {1}L, {2}, {3}, {index_error}, {index_check_token}))"),
           _one(_onnx("Where", _onnx("And", _onnx("GreaterOrEqual", _WRAPPED, _INDEX_ZERO), _onnx("Less", _WRAPPED, Y)),
                      _WRAPPED, _INDEX_ZERO), (DType.INDEX, DType.INDEX, None, None)), 0),
)

#: Every operation an expression may use, by name.
OPS: dict[str, OpInfo] = {op.name: op for op in _TABLE}
