"""The backend refuses what eager refuses, with eager's exception type and message, and never
stops on an internal error where eager computes."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_ran_on_device

import torch_adreno
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering.checks import EAGER_DTYPE_CHECKED, eager_error_type

pytestmark = pytest.mark.device


def _eager_error(fn, *args) -> BaseException:
    with pytest.raises(Exception) as caught:
        fn(*args)
    return caught.value


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="adreno", fullgraph=True, dynamic=False)


def _assert_graphs_ran(prof: torch_adreno.profile, *kinds: str) -> None:
    """Compiled graphs of each kind ("forward", "backward", "inference") ran on the device: a
    result equal to eager's says nothing when the backend handed the graph back to run eagerly.
    (Graphs of empty tensors may launch no kernel: the graph run is the evidence.)"""
    ran = [r.graph for r in prof.graph_runs]
    for kind in kinds:
        assert any(g.startswith(kind) for g in ran), f"no {kind} graph ran on the device: {ran}"
    assert not prof.host_fallback_ops, prof.host_fallback_ops


@pytest.mark.parametrize("case", ["matmul", "linear", "addmm_bias", "index_put", "softmax", "gelu", "layer_norm",
                                  "std", "nll_loss"])
def test_mixed_dtype_operands_raise_eagers_error(case):
    if case == "matmul":
        fn, args = (lambda a, b: a @ b), (torch.arange(4).reshape(2, 2), torch.randn(2, 2))
    elif case == "linear":
        torch.manual_seed(0)
        fn, args = torch.nn.Linear(4, 2), (torch.arange(8).reshape(2, 4),)
    elif case == "addmm_bias":
        fn, args = torch.addmm, (torch.arange(2), torch.randn(2, 3), torch.randn(3, 2))
    elif case == "index_put":
        fn = lambda x, i, v: torch.index_put(x, (i,), v)  # noqa: E731
        args = (torch.randn(5), torch.tensor([0, 2]), torch.tensor([1, 2]))
    # Ops that AOTAutograd decomposes: eager's kernel refuses integers its decomposition accepts.
    elif case == "softmax":
        fn, args = (lambda x: torch.softmax(x, -1)), (torch.arange(6).reshape(2, 3),)
    elif case == "gelu":
        fn, args = torch.nn.functional.gelu, (torch.arange(6),)
    elif case == "layer_norm":
        fn = lambda x, w: torch.nn.functional.layer_norm(x, (3,), w)  # noqa: E731
        args = (torch.randn(2, 3), torch.arange(3))
    elif case == "std":
        fn, args = torch.std, (torch.arange(6),)
    else:
        fn, args = torch.nn.functional.nll_loss, (torch.arange(6).reshape(2, 3), torch.tensor([0, 2]))
    eager = _eager_error(fn, *args)
    with pytest.raises(type(eager)) as ours:
        _compiled(fn)(*args)
    # Eager's own message first, then the ATen op that refused (and the FX node where lowering did).
    assert str(ours.value).startswith(str(eager)), (str(ours.value), str(eager))
    assert "aten." in str(ours.value)


def test_the_eager_error_type_is_also_a_lowering_error():
    value_error = eager_error_type(ValueError)
    assert issubclass(value_error, ValueError) and value_error.__name__ == "ValueError"
    assert eager_error_type(ValueError) is value_error  # one class per type
    assert eager_error_type(RuntimeError).__name__ == "LoweringError"
    assert torch.ops.aten.mm.default in EAGER_DTYPE_CHECKED


def test_float32_graphs_are_not_replayed_on_the_host(monkeypatch):
    """The check costs nothing for float32 operands: eager's kernel is not called."""
    from torch_adreno.lowering import checks

    calls = []
    original = checks._disable_current_modes

    def counting():
        calls.append(1)
        return original()

    monkeypatch.setattr(checks, "_disable_current_modes", counting)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(_compiled(lambda a, b: a @ b)(a, b), a @ b)
    assert not calls
    with pytest.raises(RuntimeError):
        _compiled(lambda a, b: a @ b)(a.long(), b)
    assert calls


def test_integer_matrix_products_are_refused_not_rounded():
    # 2**25 + 1 has no float32 form: a float32 GEMM returns 2**25 where eager's is exact.
    a = torch.tensor([[2**25 + 1, 0], [0, 1]])
    b = torch.eye(2, dtype=torch.int64)
    try:
        with torch_adreno.profile() as prof:
            ours = _compiled(lambda a, b: a @ b)(a, b)
    except UnsupportedOpError as err:
        assert "aten.mm.default" in str(err) and "cast the operands to float32" in str(err)
    else:  # an exact integer product: computed on the device, not eagerly
        torch.testing.assert_close(ours, a @ b)
        assert_ran_on_device(prof)


def test_integer_addmm_is_refused_clearly():
    """It stopped with KeyError: 'buf0' in the GEMM epilogue writer."""
    bias, x, w = torch.arange(2), torch.arange(6).reshape(2, 3), torch.arange(6).reshape(3, 2)
    with pytest.raises(UnsupportedOpError, match=r"aten\.addmm\.default"):
        _compiled(torch.addmm)(bias, x, w)


def test_zero_dim_tensor_constants_lower():
    """masked.* ops put a 0-dim tensor constant in the graph; reading it inside AOTAutograd's
    fake mode stopped with "Please convert all Tensors to FakeTensors first"."""
    x = torch.tensor(-8.5, requires_grad=True)
    mask = torch.tensor(True)
    for op in (torch.masked.sum, torch.masked.amax, torch.masked.prod):
        expected = op(x, mask=mask)
        with torch_adreno.profile() as prof:
            ours = _compiled(lambda x, mask, op=op: op(x, mask=mask))(x, mask)
        torch.testing.assert_close(ours, expected)
        assert_ran_on_device(prof)


def test_gather_with_an_empty_index_of_higher_rank_and_its_backward():
    """Eager accepts a [2, 0] index into a 1-d input (result [2, 0]); the backward's scatter_add
    read the empty index with one index: "view of rank 2 indexed with 1 indices"."""
    x = torch.randn(5, requires_grad=True)
    index = torch.empty(2, 0, dtype=torch.int64)
    with torch_adreno.profile() as prof:
        out = _compiled(lambda x, i: torch.gather(x, 0, i))(x, index)
        assert out.shape == (2, 0)
        (grad,) = torch.autograd.grad((out * 2).sum() + (x * x).sum(), x)
    torch.testing.assert_close(grad, 2 * x.detach())
    _assert_graphs_ran(prof, "forward", "backward")


@pytest.mark.parametrize("op", ["scatter_add", "scatter"])
def test_scatter_with_an_empty_index_returns_its_input(op):
    x, src = torch.randn(5), torch.randn(3, 3)
    index = torch.empty(2, 0, dtype=torch.int64)
    fn = getattr(torch, op)
    expected = fn(x, 0, index, src)
    with torch_adreno.profile() as prof:
        ours = _compiled(lambda x, i, s: fn(x, 0, i, s))(x, index, src)
    torch.testing.assert_close(ours, expected)
    _assert_graphs_ran(prof, "inference")


def test_a_result_dtype_eager_would_not_give_is_refused():
    """select_scatter of a float32 source into an int64 tensor: eager returns int64, the traced
    graph (meta function / decomposition) float32; ours returned float32 values."""
    x, src = torch.arange(6).reshape(2, 3), torch.randn(3)
    expected = torch.select_scatter(x, src, 0, 0)
    try:
        with torch_adreno.profile() as prof:
            ours = _compiled(lambda x, s: torch.select_scatter(x, s, 0, 0))(x, src)
    except UnsupportedOpError as err:
        assert "select_scatter" in str(err) and "torch.int64" in str(err)
    else:  # eager's int64 result, computed on the device
        torch.testing.assert_close(ours, expected)
        assert_ran_on_device(prof)
