"""Lowering stage tests (no device): which IR each ATen graph becomes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import capture_graphs

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.errors import UnsupportedOpError
from torch_adreno.lowering import lower_graph, supported_ops


def lower(fn, *inputs, index=0, num_host_outputs=None, fallback="error"):
    gm = capture_graphs(fn, *inputs)[index]
    return lower_graph(gm, Config(fallback=fallback), "g", num_host_outputs)


def test_linear_relu_is_a_gemm_then_pointwise_nodes():
    g = lower(lambda x, w, b: F.relu(F.linear(x, w, b)), torch.randn(4, 3), torch.randn(5, 3), torch.randn(5))
    kinds = [type(n).__name__ for n in g.nodes]
    assert kinds == ["Gemm", "Pointwise", "Pointwise"]
    gemm = g.nodes[0]
    assert isinstance(gemm, ir.Gemm) and (gemm.m, gemm.n, gemm.k) == (4, 5, 3)
    # The weight is read transposed through the index map, never copied.
    assert str(gemm.rhs) == "arg1_1[n, k]"
    assert "relu(" in str(g.nodes[2].body)


def test_views_lower_to_no_nodes():
    g = lower(lambda x: x.reshape(-1)[2:7].view(5, 1).expand(5, 2).t() * 2, torch.randn(3, 4))
    assert len(g.nodes) == 1
    assert str(g.nodes[0].body) == "mul(arg0_1[floordiv(add(i1, 2), 4), mod(add(i1, 2), 4)], 2.0:f32)"


def test_conv_is_an_implicit_gemm_with_masked_im2col():
    g = lower(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3))
    (gemm,) = g.nodes
    assert isinstance(gemm, ir.Gemm)
    # One GEMM over both images' 25 positions (the batch folded into the columns: no groups).
    assert (gemm.batch, gemm.m, gemm.n, gemm.k) == (1, 4, 2 * 25, 27)
    assert str(gemm.rhs).startswith("where(")  # padding is a guarded read
    assert g.buffers[gemm.output].shape == (2, 4, 5, 5)


def test_backward_graph_outputs_and_saved_tensor_roles():
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    gms = capture_graphs(lambda x, w: torch.tanh(x @ w.t()), x, w)
    fw = lower_graph(gms[0], Config(), "fw", num_host_outputs=1)
    roles = [o.role for o in fw.outputs]
    assert roles[0] is ir.OutputRole.HOST and ir.OutputRole.DEVICE in roles[1:]
    bw = lower_graph(gms[1], Config(), "bw")
    assert all(o.role is ir.OutputRole.HOST for o in bw.outputs)
    assert sum(isinstance(n, ir.Gemm) for n in bw.nodes) == 2


def test_max_pool_lowers_to_window_reductions():
    g = lower(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randn(1, 2, 4, 4))
    assert [n.reduce_op for n in g.nodes if isinstance(n, ir.Reduction)] == ["max", "argmax"]


def test_unsupported_op_raises_with_guidance():
    with pytest.raises(UnsupportedOpError, match=r"(?s)aten.kthvalue.default.*fallback"):
        lower(lambda x: torch.kthvalue(x, 2, 0).values, torch.randn(4))


def test_host_fallback_lowers_to_a_host_node():
    g = lower(lambda x: torch.kthvalue(x, 2, 0).values + 1, torch.randn(4), fallback="host")
    assert [type(n).__name__ for n in g.nodes] == ["HostOp", "Pointwise"]
    assert g.nodes[0].target == "aten.kthvalue.default"


def test_float64_is_rejected_clearly():
    from torch_adreno.errors import LoweringError

    with pytest.raises(LoweringError, match=r"float64.*float32"):
        lower(lambda x: x * 2, torch.randn(3, dtype=torch.float64))


def test_a_tensor_made_on_another_device_is_rejected_clearly():
    # OpInfo's *_like samples ask for device="cuda" where CUDA exists; "meta" stands in for it here.
    from torch_adreno.errors import LoweringError

    with pytest.raises(LoweringError, match=r"makes a tensor on meta.*CPU"):
        lower(lambda x: torch.ones_like(x, device="meta"), torch.randn(3))


def test_registry_covers_the_reference_models():
    ops = set(supported_ops())
    for needed in ["aten.addmm.default", "aten.mm.default", "aten.convolution.default",
                   "aten.convolution_backward.default", "aten.max_pool2d_with_indices.default",
                   "aten.max_pool2d_with_indices_backward.default", "aten.relu.default", "aten.where.self",
                   "aten.sum.dim_IntList", "aten.amax.default", "aten.gather.default", "aten.scatter.value"]:
        assert needed in ops
