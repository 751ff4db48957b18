"""Stage tests of the ONNX function bodies (no device): IR nodes translated to standard ops and
evaluated by ONNX's reference evaluator against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from torch_adreno import ir
from torch_adreno.export.kernel_bodies import (
    ONNX_TYPE,
    Body,
    ExportError,
    SplitK,
    split_slices,
    translate_node,
)
from torch_adreno.ir import DType

F32 = DType.F32


def _evaluate(buffers: dict[str, ir.Buffer], inputs: dict[str, np.ndarray], build, out: str = "out") -> np.ndarray:
    """Run the body ``build(body, values, shapes)`` makes over flat ``inputs``; its flat result."""
    body = Body("t")
    values = {name: name for name in inputs}
    result = build(body, values, buffers)
    graph = helper.make_graph(
        [*body.nodes, helper.make_node("Identity", [result], ["result"])], "body",
        [helper.make_tensor_value_info(n, ONNX_TYPE[buffers[n].dtype], [buffers[n].numel]) for n in inputs],
        [helper.make_tensor_value_info("result", ONNX_TYPE[buffers[out].dtype], [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    (out,) = ReferenceEvaluator(model).run(None, {n: a.reshape(-1) for n, a in inputs.items()})
    return out


def _node(node: ir.Node, buffers: dict[str, ir.Buffer], inputs: dict[str, np.ndarray]) -> np.ndarray:
    return _evaluate(buffers, inputs, lambda body, values, shapes: translate_node(body, node, values, shapes, "k"))


def test_pointwise_with_a_guarded_out_of_range_load_is_clamped_and_discarded() -> None:
    # out[i, j] = i >= 5 ? 2 * x[i - 5, j] : -1: rows i < 5 read far before x (discarded by the where),
    # which a Gather would refuse unless the index is clamped into the buffer.
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    buffers = {"x": ir.Buffer("x", (3, 4), F32), "out": ir.Buffer("out", (8, 4), F32)}
    i0, i1 = ir.Var("i0", 8), ir.Var("i1", 4)
    shifted = ir.Load("x", (ir.call("sub", i0, ir.index(5)), i1), F32)
    body = ir.where(ir.call("ge", i0, ir.index(5)), ir.call("mul", shifted, ir.const(2.0, F32)), ir.const(-1.0, F32))
    out = _node(ir.Pointwise("p", "out", (8, 4), body, ()), buffers, {"x": x})
    expected = np.concatenate([np.full((5, 4), -1.0, np.float32), 2 * x])
    np.testing.assert_array_equal(out.reshape(8, 4), expected)


def test_integer_floor_division_and_remainder_follow_python_on_negative_values() -> None:
    a = np.array([-7, -6, 5, 7, -1], dtype=np.int64)
    b = np.array([2, -4, -3, 3, 5], dtype=np.int64)
    buffers = {n: ir.Buffer(n, (5,), DType.I64) for n in ("a", "b", "out")}
    i0 = ir.Var("i0", 5)
    la, lb = ir.Load("a", (i0,), DType.I64), ir.Load("b", (i0,), DType.I64)
    q = _node(ir.Pointwise("q", "out", (5,), ir.call("floordiv", la, lb), ()), buffers, {"a": a, "b": b})
    r = _node(ir.Pointwise("r", "out", (5,), ir.call("remainder", la, lb), ()), buffers, {"a": a, "b": b})
    np.testing.assert_array_equal(q, a // b)
    np.testing.assert_array_equal(r, a % b)


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "argmin", "any"])
def test_reductions_over_two_axes(op) -> None:
    x = np.array([[[1, 5, 5], [0, 2, 5]], [[3, 3, 0], [3, 1, 1]]], dtype=np.float32)  # ties: the first wins
    buffers = {"x": ir.Buffer("x", (2, 2, 3), F32), "out": ir.Buffer("out", (2,), DType.I64 if "arg" in op else F32)}
    value: ir.Expr = ir.Load("x", (ir.Var("i0", 2), ir.Var("r0", 2), ir.Var("r1", 3)), F32)
    if op == "any":
        buffers["out"] = ir.Buffer("out", (2,), DType.BOOL)
        value = ir.call("gt", value, ir.const(4.0, F32))
    out = _node(ir.Reduction("red", "out", (2,), (2, 3), op, value, ()), buffers, {"x": x})
    rows = x.reshape(2, 6)
    expected = {"sum": rows.sum(1), "max": rows.max(1), "argmax": rows.argmax(1), "argmin": rows.argmin(1),
                "any": (rows > 4).any(1)}[op]
    np.testing.assert_array_equal(out, expected)


def test_gemm_with_a_transposed_operand_and_a_transposed_store() -> None:
    # out[n, m] = sum_k a[m, k] * w[n, k]: both the right operand and the store are transposed.
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    buffers = {"a": ir.Buffer("a", (2, 3), F32), "w": ir.Buffer("w", (4, 3), F32), "out": ir.Buffer("out", (4, 2), F32)}
    m, n, k = ir.Var("m", 2), ir.Var("n", 4), ir.Var("k", 3)
    gemm = ir.Gemm("g", "out", 1, 2, 4, 3, ir.Load("a", (m, k), F32), ir.Load("w", (n, k), F32), (n, m), ())
    out = _node(gemm, buffers, {"a": a, "w": w})
    np.testing.assert_array_equal(out.reshape(4, 2), (a @ w.T).T)


def test_split_k_slices_in_the_kernels_layout_with_row_sums() -> None:
    # k = 10 in 4 slices of 3 (the last padded): partials [b][slice][m][n], then row sums [b][slice][m].
    a = np.arange(20, dtype=np.float32).reshape(2, 10) / 7
    c = np.arange(30, dtype=np.float32).reshape(10, 3) - 4
    buffers = {"a": ir.Buffer("a", (2, 10), F32), "c": ir.Buffer("c", (10, 3), F32), "out": ir.Buffer("out", (2, 3), F32)}
    m, n, k = ir.Var("m", 2), ir.Var("n", 3), ir.Var("k", 10)
    gemm = ir.Gemm("g", "out", 1, 2, 3, 10, ir.Load("a", (m, k), F32), ir.Load("c", (k, n), F32), (m, n), ())
    split = SplitK(gemm, "g_slices", 4, 3, True)
    out = _evaluate(buffers, {"a": a, "c": c},
                    lambda body, values, shapes: split_slices(body, split, values, shapes, "k"))
    pa, pc = np.pad(a, ((0, 0), (0, 2))), np.pad(c, ((0, 2), (0, 0)))
    slices = [pa[:, 3 * s:3 * s + 3] @ pc[3 * s:3 * s + 3] for s in range(4)]
    rows = [pa[:, 3 * s:3 * s + 3].sum(1) for s in range(4)]
    np.testing.assert_allclose(out, np.concatenate([np.stack(slices).reshape(-1), np.stack(rows).reshape(-1)]), rtol=1e-6)


def test_an_op_without_a_translation_is_named() -> None:
    buffers = {"x": ir.Buffer("x", (4,), F32), "out": ir.Buffer("out", (4,), F32)}
    x = ir.Load("x", (ir.Var("i0", 4),), F32)
    node = ir.Pointwise("p", "out", (4,), ir.call("atan2", x, x), ())
    with pytest.raises(ExportError, match="kernel k: IR op 'atan2'"):
        _node(node, buffers, {"x": np.ones(4, np.float32)})


@pytest.mark.parametrize("wraps", [0, 1])
def test_checked_indices_wrap_where_eager_wraps_and_read_zero_when_out_of_range(wraps: int) -> None:
    # out[i] = x[checked(idx[i])]: as the kernel computes it (the kernel also records the bad value).
    x = np.array([10.0, 11.0, 12.0, 13.0], dtype=np.float32)
    idx = np.array([0, 3, -1, -4, 4, -5, 2], dtype=np.int64)
    buffers = {"x": ir.Buffer("x", (4,), F32), "idx": ir.Buffer("idx", (7,), DType.I64),
               "out": ir.Buffer("out", (7,), F32)}
    i0 = ir.Var("i0", 7)
    checked = ir.call("checked_index", ir.Load("idx", (i0,), DType.I64), ir.index(4), ir.index(0), ir.index(wraps))
    out = _node(ir.Pointwise("p", "out", (7,), ir.Load("x", (checked,), F32), ()), buffers, {"x": x, "idx": idx})
    wrapped = [10.0, 13.0, 13.0, 10.0, 10.0, 10.0, 12.0] if wraps else [10.0, 13.0, 10.0, 10.0, 10.0, 10.0, 12.0]
    np.testing.assert_array_equal(out, np.array(wrapped, np.float32))
