"""IR stage tests (no device): index simplification, views as index maps, the text printer."""

from __future__ import annotations

import pytest

from torch_adreno import ir
from torch_adreno.ir import Buffer, DType, View


def v(name: str, size: int) -> ir.Var:
    return ir.Var(name, size)


def test_reshape_round_trip_simplifies_to_identity():
    base = View.of(Buffer("x", (4, 5, 6), DType.F32))
    assert base.reshape((4, 30)).reshape((4, 5, 6)).index == base.index
    assert base.reshape((120,)).reshape((4, 5, 6)).is_identity()


def test_merge_and_split_produce_div_mod_only_where_needed():
    merged = View.of(Buffer("x", (4, 5, 6), DType.F32)).reshape((4, 30))
    assert [str(e) for e in merged.index] == ["v0", "floordiv(v1, 6)", "mod(v1, 6)"]
    split = View.of(Buffer("y", (4, 30), DType.F32)).reshape((4, 5, 6))
    assert [str(e) for e in split.index] == ["v0", "add(mul(v1, 6), v2)"]


def test_permute_expand_slice_select():
    x = View.of(Buffer("x", (3, 4), DType.F32))
    assert [str(e) for e in x.permute((1, 0)).index] == ["v1", "v0"]
    e = x.unsqueeze(0).expand((2, 3, 4))
    assert e.shape == (2, 3, 4) and [str(i) for i in e.index] == ["v1", "v2"]
    s = x.slice(1, 1, 4, 2)
    assert s.shape == (3, 2) and [str(i) for i in s.index] == ["v0", "add(mul(v1, 2), 1)"]
    assert [str(i) for i in x.select(0, -1).index] == ["2", "v0"]


def test_broadcast_of_size_one_dims_reads_index_zero():
    b = View.of(Buffer("b", (1, 4), DType.F32)).expand((3, 4))
    assert [str(i) for i in b.index] == ["0", "v1"]


def test_index_arithmetic_rules():
    a, b = v("a", 8), v("b", 3)
    flat = ir.call("add", ir.call("mul", a, ir.index(3)), b)
    assert ir.call("floordiv", flat, ir.index(3)) == a
    assert ir.call("mod", flat, ir.index(3)) == b
    assert ir.call("mod", a, ir.index(8)) == a
    assert ir.call("floordiv", b, ir.index(3)) == ir.index(0)
    assert ir.call("floordiv", ir.call("floordiv", a, ir.index(2)), ir.index(2)) == ir.call("floordiv", a, ir.index(4))
    assert ir.bounds(flat) == (0, 23)
    assert ir.call("sub", flat, flat) == ir.index(0)


def test_division_by_a_multiple_of_an_aligned_stride_drops_the_lower_terms():
    """GPT-2's [tokens, d] operand read through a [batch, seq, d] view: the flat index
    ``m * 512 + k`` (k < 512) over 32768 = 64 * 512 elements is ``m // 64``, its remainder
    ``(m % 64) * 512 + k``; and that quotient and remainder put back together are the flat index
    again, with no division left (the GEMM's operand loads computed both at every element)."""
    m, k = v("m", 128), v("k", 512)
    flat = ir.call("add", ir.call("mul", m, ir.index(512)), k)
    quotient = ir.call("floordiv", flat, ir.index(32768))
    remainder = ir.call("mod", flat, ir.index(32768))
    assert quotient == ir.call("floordiv", m, ir.index(64))
    assert remainder == ir.call("add", ir.call("mul", ir.call("mod", m, ir.index(64)), ir.index(512)), k)
    rebuilt = ir.call("add", ir.call("mul", quotient, ir.index(32768)), remainder)
    assert rebuilt == flat and not any(isinstance(e, ir.Call) and e.op in ("floordiv", "mod") for e in ir.walk(rebuilt))
    # (k may reach past the stride: then the division stays, as it must)
    wide = ir.call("add", ir.call("mul", m, ir.index(512)), v("j", 1024))
    assert "floordiv(add(j, mul(m, 512)), 32768)" in str(ir.call("floordiv", wide, ir.index(32768)))
    for mv in range(128):
        for kv in (0, 1, 511):
            value = mv * 512 + kv
            assert (value // 32768, value % 32768) == (mv // 64, (mv % 64) * 512 + kv)


def test_a_reshaped_view_read_back_flat_has_no_division():
    view = View.of(Buffer("x", (2, 64, 128), DType.F32)).reshape((128, 128))
    flat = ir.index(0)
    for e, stride in zip(view.index, (8192, 128, 1), strict=True):
        flat = ir.call("add", flat, ir.call("mul", e, ir.index(stride)))
    assert str(flat) == "add(mul(v0, 128), v1)"


def test_negative_ranges_keep_floor_division_unsplit():
    # (a - 2) // 3 must not become a//3 - 1 style rewrites whose C truncation would differ.
    a = v("a", 8)
    e = ir.call("floordiv", ir.call("sub", a, ir.index(2)), ir.index(3))
    assert isinstance(e, ir.Call) and e.op == "floordiv"


def test_expressions_are_structurally_hashable():
    x1 = ir.Load("x", (v("i", 4),), DType.F32)
    x2 = ir.Load("x", (v("i", 4),), DType.F32)
    assert x1 == x2 and hash(x1) == hash(x2) and len({x1, x2}) == 1
    with pytest.raises(AttributeError):
        x1.buffer = "y"  # type: ignore[misc]


def test_pickled_expressions_hash_again_in_the_loading_process():
    """A cached program is loaded by another process, whose str hashes differ: the cached hash
    must not travel with the pickle."""
    import pickle

    x = ir.Load("x", (v("i", 4),), DType.F32)
    hash(x)
    loaded = pickle.loads(pickle.dumps(x))
    assert "_hash" not in loaded.__dict__
    assert loaded == x and hash(loaded) == hash(x) and {x: 1}[loaded] == 1


def test_substitute_and_where_folding():
    i = v("i", 4)
    e = ir.call("add", ir.cast(i, DType.F32), ir.const(1.0, DType.F32))
    assert str(ir.substitute(e, {i: ir.index(2)})) == "add(2.0:f32, 1.0:f32)"  # the cast folds
    assert ir.where(ir.const(True, DType.BOOL), x := ir.const(1.0, DType.F32), ir.const(2.0, DType.F32)) is x


def test_unknown_op_and_arity_are_rejected():
    with pytest.raises(KeyError):
        ir.call("frobnicate", ir.index(1))
    with pytest.raises(ValueError):
        ir.call("add", ir.index(1))


def test_graph_printer_is_stable():
    g = ir.Graph("g")
    g.buffers["x"] = Buffer("x", (2, 3), DType.F32)
    g.buffers["y"] = Buffer("y", (2, 3), DType.F32)
    g.inputs.append("x")
    node = ir.Pointwise("pw0", "y", (2, 3), ir.const(0.0, DType.F32), (ir.Origin("relu", "aten.relu.default"),))
    node.body = ir.call("relu", View.of(g.buffers["x"]).load(node.loop_vars))
    g.nodes.append(node)
    g.outputs.append(ir.GraphOutput("y", ir.OutputRole.HOST))
    assert str(g) == "\n".join([
        "graph g",
        "  input 0: x f32[2, 3]",
        "  buffer y f32[2, 3]",
        "  y = pointwise[2, 3] relu(x[i0, i1])  # relu",
        "  output 0: y (host)",
    ])
