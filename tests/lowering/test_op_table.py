"""The op table (no device): every IR op is defined once, in ``torch_adreno.ir.ops.OPS``, with every
entry (IR form, OpenCL expression, ONNX body, FLOP count), and every stage that reads the table can
use every entry: each OpenCL form renders, each ONNX form builds a body the ONNX checker accepts."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from onnx import helper

import torch_adreno
from torch_adreno import ir
from torch_adreno.export.kernel_bodies import ONNX_TYPE, Body, translate_node
from torch_adreno.fusion.inline import EXPENSIVE_OPS
from torch_adreno.ir import DType
from torch_adreno.ir.ops import (
    OPS,
    Arg,
    ByKind,
    CastTo,
    IfFlag,
    Lit,
    OnnxBody,
    OnnxOp,
    OpInfo,
    Recipe,
)
from torch_adreno.kernels import _float_ops
from torch_adreno.kernels.expressions import render_op
from torch_adreno.lowering import pointwise

PACKAGE = Path(torch_adreno.__file__).parent
#: Ops with no standard-ONNX body: the export refuses them, naming the op.
NOT_EXPORTABLE = {"atan2", "uniform"}
RESULT_RULES = {"same", "bool", "float", "index", "where", "given"}


#: Functions that take an IR op's name, and the position of that argument.
OP_ARGUMENT = {"call": 0, "Call": 0, "elementwise": 1}


def _literal_op_names() -> Iterator[tuple[str, str]]:
    """(file, name) for every string literal in the op argument of ``call(...)``, ``Call(...)`` and
    the lowering's ``elementwise(ctx, op, ...)`` anywhere in the package: the ops built by name."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            position = OP_ARGUMENT.get(name)
            if position is None or len(node.args) <= position:
                continue
            for op in _names(node.args[position]):
                yield str(path.relative_to(PACKAGE)), op


def _names(expr: ast.expr) -> Iterator[str]:
    """The op names an argument can be: a literal, or the literals of a conditional's branches."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        yield expr.value
    elif isinstance(expr, ast.IfExp):
        yield from _names(expr.body)
        yield from _names(expr.orelse)


def _lowering_map_ops() -> set[str]:
    """The IR ops the lowering's ATen maps name."""
    return {*pointwise._UNARY.values(), *pointwise._BINARY, *pointwise._COMPARE, *pointwise._LOGICAL}


def test_every_op_the_lowering_can_produce_is_in_the_table() -> None:
    by_name = list(_literal_op_names())
    produced = _lowering_map_ops() | {name for _, name in by_name}
    unknown = {(f, n) for f, n in by_name if n not in OPS}
    assert not unknown, f"ops built by name that the table does not define: {sorted(unknown)}"
    assert produced <= set(OPS), sorted(produced - set(OPS))
    # The scan sees the ops built by name (not just through the maps): index arithmetic, masks, casts.
    assert {"mod", "floordiv", "logical_and", "logical_not", "isnan", "pow", "cast", "checked_index", "uniform",
            "where"} <= produced


def _recipes(recipe: Recipe) -> Iterator[Recipe]:
    yield recipe
    if isinstance(recipe, OnnxOp):
        for r in recipe.inputs:
            yield from _recipes(r)
    elif isinstance(recipe, CastTo):
        yield from _recipes(recipe.value)
    elif isinstance(recipe, IfFlag):
        yield from _recipes(recipe.when_set)
        yield from _recipes(recipe.when_clear)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_entry_is_complete(name: str) -> None:
    info = OPS[name]
    assert isinstance(info, OpInfo) and info.name == name
    assert info.arity >= 1 and info.result in RESULT_RULES
    # IR form: the lazily evaluated arguments are arguments.
    assert all(0 <= a < info.arity for a in info.lazy_args)
    # OpenCL: one C pattern per form.
    assert isinstance(info.opencl, ByKind)
    assert all(isinstance(form, str) and form for form in info.opencl.forms())
    # ONNX: a body for every form, or the op is one the export refuses.
    if info.onnx is None:
        assert name in NOT_EXPORTABLE, f"{name} has no ONNX body"
    else:
        assert name not in NOT_EXPORTABLE
        assert isinstance(info.onnx, ByKind)
        for form in info.onnx.forms():
            assert isinstance(form, OnnxBody)
            for recipe in _recipes(form.value):
                assert isinstance(recipe, Arg | Lit | OnnxOp | CastTo | IfFlag), recipe
                if isinstance(recipe, Arg | IfFlag):
                    assert recipe.position < info.arity, recipe
                if isinstance(recipe, OnnxOp):
                    assert onnx.defs.has(recipe.op_type), recipe.op_type  # a standard op
    # FLOPs: counted for float results only, so an op whose result is never a float counts none.
    assert isinstance(info.flops, int) and info.flops >= 0
    if info.result in ("bool", "index") or name == "cast":
        assert info.flops == 0


def _arguments(info: OpInfo, dtypes: list[DType]) -> Iterator[tuple[list[DType], DType]]:
    """Argument and result types that exercise ``info``: each of ``dtypes`` for its value
    arguments (booleans for a condition, indices for sizes and flags)."""
    for t in dtypes:
        if info.name == "where":
            args = [DType.BOOL, t, t]
        elif info.name == "checked_index":
            args = [t, DType.INDEX, DType.INDEX, DType.INDEX]
        else:
            args = [t] * info.arity
        results = dtypes if info.result == "given" else [info.result_dtype(args)]
        for result in results:
            yield args, result


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_opencl_form_renders(name: str) -> None:
    info = OPS[name]
    texts = [f"x{k}" for k in range(info.arity)]
    reached = set()
    for args, result in _arguments(info, list(DType)):
        reached.add(id(info.opencl.pick(args, result)))
        text = render_op(name, texts, args, result)
        assert text and "{" not in text and "}" not in text, text
    assert reached == {id(form) for form in info.opencl.forms()}, f"{name}: a C form no type reaches"


def _onnx_body(name: str, args: list[DType], result: DType, wraps: int) -> onnx.ModelProto:
    """A model computing ``name`` over flat inputs of ``args``'s types (``wraps``: the flag of an
    op that takes one)."""
    i0 = ir.Var("i0", 4)
    buffers = {f"a{k}": ir.Buffer(f"a{k}", (4,), t) for k, t in enumerate(args)}
    operands: list[ir.Expr] = [ir.Load(f"a{k}", (i0,), t) for k, t in enumerate(args)]
    if name == "checked_index":
        operands[1:] = [ir.index(4), ir.index(0), ir.index(wraps)]
        buffers = {"a0": buffers["a0"]}
    buffers["out"] = ir.Buffer("out", (4,), result)
    body = Body("t")
    node = ir.Pointwise("p", "out", (4,), ir.Call(name, tuple(operands), result), ())
    out = translate_node(body, node, {n: n for n in buffers if n != "out"}, buffers, "k")
    graph = helper.make_graph(
        [*body.nodes, helper.make_node("Identity", [out], ["result"])], name,
        [helper.make_tensor_value_info(n, ONNX_TYPE[b.dtype], [4]) for n, b in buffers.items() if n != "out"],
        [helper.make_tensor_value_info("result", ONNX_TYPE[result], [None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("name", sorted(n for n, info in OPS.items() if info.onnx is not None))
def test_every_onnx_form_builds_a_body_the_checker_accepts(name: str) -> None:
    info = OPS[name]
    assert info.onnx is not None
    accepted: set[int] = set()
    reached: set[int] = set()
    for (args, result), wraps in itertools.product(_arguments(info, list(ONNX_TYPE)), (0, 1)):
        form = info.onnx.pick(args, result)
        reached.add(id(form))
        model = _onnx_body(name, args, result, wraps)  # builds for every type: no op is refused
        try:
            onnx.checker.check_model(model, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
            continue  # (an ONNX op that does not take these types: Exp of an integer, say)
        accepted.add(id(form))
    forms = {id(form) for form in info.onnx.forms()}
    assert reached == forms, f"{name}: an ONNX form no type reaches"
    assert accepted == forms, f"{name}: an ONNX form the checker refuses for every type"


def test_float_ops_count_the_table_flops_of_float_results() -> None:
    x = ir.Load("x", (ir.Var("i0", 4),), DType.F32)
    n = ir.Load("n", (ir.Var("i0", 4),), DType.I64)
    assert _float_ops(ir.call("add", ir.call("mul", x, x), x)) == 2
    assert _float_ops(ir.call("exp", x)) == OPS["exp"].flops == 1
    assert _float_ops(ir.cast(n, DType.F32)) == 0  # a conversion, no arithmetic
    assert _float_ops(ir.call("lt", x, x)) == 0  # a boolean result
    assert _float_ops(ir.where(ir.call("lt", x, x), x, ir.call("neg", x))) == 2  # the select and the negation
    assert _float_ops(ir.call("add", n, n)) == 0  # integer arithmetic
    assert _float_ops(ir.Load("x", (ir.call("add", ir.Var("i0", 4), ir.index(1)),), DType.F32)) == 0  # index arithmetic


def test_transcendental_ops_are_the_ones_fusion_weighs_as_expensive() -> None:
    # (fusion.inline keeps its own set until it reads the table's flag)
    assert {n for n, info in OPS.items() if info.transcendental} == EXPENSIVE_OPS


def test_the_ir_imports_no_later_stage() -> None:
    for path in sorted((PACKAGE / "ir").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch_adreno"):
                assert node.module.startswith("torch_adreno.ir"), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("torch_adreno") and not a.name.startswith("torch_adreno.ir")
                               for a in node.names), path.name
