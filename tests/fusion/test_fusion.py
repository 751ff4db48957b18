"""Fusion decisions and their reasons (no device), and fused == unfused == eager numerics on the device."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager, capture_graphs

import torch_adreno
from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion import GemmKernel, PointwiseKernel, ReductionKernel, fuse
from torch_adreno.lowering import lower_graph
from torch_adreno.models import MODELS


def fused(fn, *inputs, index=0, fusion=True, num_host_outputs=None):
    gm = capture_graphs(fn, *inputs)[index]
    graph = lower_graph(gm, Config(), "g", num_host_outputs)
    return fuse(graph, Config(fusion=fusion))


def reasons(result) -> str:
    return "\n".join(str(d) for d in result.decisions)


def test_pointwise_chain_is_one_kernel_storing_only_its_output():
    result = fused(lambda x, y: ((x * 2 + y).exp() - 1).relu(), torch.randn(8, 5), torch.randn(5))
    (group,) = result.groups
    assert isinstance(group.spec, PointwiseKernel)
    assert group.writes == [result.graph.outputs[0].buffer]
    assert "inlined" in reasons(result)


def test_linear_bias_relu_is_a_gemm_with_epilogue():
    result = fused(lambda x, w, b: F.relu(F.linear(x, w, b)), torch.randn(4, 3), torch.randn(6, 3), torch.randn(6))
    (group,) = result.groups
    assert isinstance(group.spec, GemmKernel)
    assert "relu" in str(group.spec.stores[0].value)
    assert "GEMM epilogue" in reasons(result)


def test_log_softmax_is_one_reduction_kernel_in_two_passes():
    result = fused(lambda x: F.log_softmax(x, 1), torch.randn(32, 100))
    (group,) = result.groups
    spec = group.spec
    assert isinstance(spec, ReductionKernel)
    assert [len(p.accumulators) for p in spec.phases] == [1, 1, 0]
    assert spec.phases[2].stores, "the normalised row is written in the last pass"
    assert "pass 2" in reasons(result)


def test_mean_and_variance_share_one_pass():
    result = fused(lambda x: (x.mean(1), (x * x).mean(1)), torch.randn(16, 200))
    reductions = [g for g in result.groups if isinstance(g.spec, ReductionKernel)]
    assert len(reductions) == 1 and len(reductions[0].spec.phases[0].accumulators) == 2


def test_bias_gradient_rides_on_the_weight_gradient_gemm():
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    result = fused(lambda x, w, b: F.linear(x, w, b).tanh(), x, w, b, index=1)
    carriers = [g for g in result.groups if isinstance(g.spec, GemmKernel) and g.spec.row_sum is not None]
    assert len(carriers) == 1
    assert "summed in the GEMM kernel" in reasons(result)


def test_long_k_with_few_outputs_is_split_with_reason():
    from torch_adreno.fusion.split_k import choose_split, target_tiles

    # resnet_mini's first-stage weight gradient: 16 x 144 outputs (3 tiles) over k = 32 x 32 x 32.
    stage1 = ir.Gemm("g", "out", 1, 16, 144, 32768, ir.index(0), ir.index(0), (), ())
    assert choose_split(stage1) == 32  # 96 work-groups' worth, slices of 1024
    assert choose_split(ir.Gemm("g", "out", 1, 1024, 1024, 4096, ir.index(0), ir.index(0), (), ())) == 1
    assert choose_split(ir.Gemm("g", "out", 1, 16, 144, 500, ir.index(0), ir.index(0), (), ())) == 1  # short k
    # A device of many compute units gets two tiles per unit: 132 -> 528 tiles' worth.
    assert choose_split(stage1, target_tiles(132)) == 128  # (slices of 256: no further)
    assert target_tiles(None) == target_tiles(8) == 64
    x = torch.randn(8, 3, 32, 32, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    for fusion in (True, False):
        result = fused(lambda x, w, b: F.conv2d(x, w, b, padding=1).tanh(), x, w, b, index=1, fusion=fusion)
        split = [g for g in result.groups if isinstance(g.spec, GemmKernel) and g.spec.split_k > 1]
        assert len(split) == 1 and split[0].spec.partials in split[0].writes
        assert "split k=8192 into 32 slices of 256" in reasons(result)


def test_pooling_values_and_indices_share_a_kernel():
    result = fused(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randn(2, 3, 8, 8))
    (group,) = result.groups
    assert len(group.writes) == 2
    assert "unrolled reduce_max" in reasons(result) and "unrolled reduce_argmax" in reasons(result)


def test_reading_a_kernel_result_at_another_element_is_refused_with_reason():
    def fn(x, perm):
        y = x.exp().tanh()
        return y, torch.gather(y, 0, perm) * 2  # same shape, other elements

    result = fused(fn, torch.randn(9), torch.randperm(9))
    assert len(result.groups) == 2
    assert "at a different element than the kernel produces" in reasons(result)


def test_expensive_producer_read_many_times_is_materialised_with_reason():
    def fn(x, y):
        heavy = (x.exp() + x.tanh() + x.sigmoid() + x.log1p().abs())
        return heavy.unsqueeze(1) * y  # every element of heavy is read y.shape[1] times

    result = fused(fn, torch.rand(16), torch.randn(16, 50))
    assert len(result.groups) == 2
    assert "recomputing it 50.0x per element" in reasons(result)


def test_fusion_off_gives_one_kernel_per_node():
    result = fused(lambda x, w, b: F.relu(F.linear(x, w, b)), torch.randn(4, 3), torch.randn(6, 3), torch.randn(6),
                   fusion=False)
    assert len(result.groups) == len(result.graph.nodes) == 3
    assert "fusion disabled" in reasons(result)


@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_kernels_only_read_what_earlier_kernels_wrote(model_name):
    spec = MODELS[model_name]
    model = spec.make()
    names = [n for n, _ in model.named_parameters()]

    def forward(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))

    x, _ = spec.batch()
    params = [p.detach().requires_grad_() for p in model.parameters()]
    for index in (0, 1):
        result = fused(forward, x, *params, index=index)
        available = set(result.graph.input_buffers())
        for g in result.groups:
            assert set(g.reads) <= available, (g.name, set(g.reads) - available)
            available |= set(g.writes)
        assert result.graph.output_buffers() <= available


# -- numerics on the device: fused, unfused and eager agree -----------------------------------------


FUSION_CASES = {
    "pointwise_chain": (lambda x, y: ((x * 2 + y).exp() - 1).relu() * y, (8, 5), (5,)),
    "gemm_epilogue": (lambda x, w, b: F.relu(F.linear(x, w, b)) + 1, (9, 7), (6, 7), (6,)),
    "activation_backward_into_gemm": (lambda x, w1, w2: F.linear(F.relu(F.linear(x, w1)), w2), (16, 8), (12, 8),
                                      (5, 12)),
    "log_softmax_nll": (lambda x: F.log_softmax(x, 1).sum(1).mean(), (12, 37)),
    "softmax_inner_stage": (lambda x: F.softmax(x * 3, 0), (200, 6)),
    "mean_var": (lambda x: x.mean(1) * x.var(1) + x.sum(), (10, 300)),
    "bias_gradient_column": (lambda x, w, b: F.linear(x, w, b).tanh(), (16, 8), (4, 8), (4,)),
    "conv_bias_relu_pool": (lambda x, w, b: F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 2),
                            (2, 3, 8, 8), (4, 3, 3, 3), (4,)),
}


@pytest.mark.device
@pytest.mark.parametrize("case", sorted(FUSION_CASES))
@pytest.mark.parametrize("fusion", [True, False])
def test_fused_and_unfused_match_eager(case, fusion):
    fn, *shapes = FUSION_CASES[case]
    inputs = [torch.randn(*s) for s in shapes]
    assert_matches_eager(fn, *inputs, options={"fusion": fusion}, atol=1e-4)


@pytest.mark.device
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_fusion_cuts_launches_and_bytes_with_identical_losses(model_name):
    spec = MODELS[model_name]
    results = {}
    for fusion in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = spec.make()
        step = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", options={"fusion": fusion})
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(4):
            x, y = spec.batch(gen)
            with torch_adreno.profile() as prof:
                opt.zero_grad()
                loss = step(model, x, y)
                loss.backward()
            opt.step()
            losses.append(loss.item())
        results[fusion] = (losses, prof.kernel_launches, prof.bytes_kernel_read + prof.bytes_kernel_written,
                           copy.deepcopy(model.state_dict()))
    (l0, n0, b0, s0), (l1, n1, b1, s1) = results[False], results[True]
    for a, b in zip(l0, l1, strict=True):
        assert abs(a - b) <= 1e-4 * abs(a)
    assert n1 * 3 <= n0, (n0, n1)
    assert b1 < b0
    for k in s0:
        torch.testing.assert_close(s1[k], s0[k], rtol=1e-4, atol=1e-5)


def test_every_decision_has_a_reason():
    result = fused(lambda x: F.log_softmax(x.exp(), 1), torch.randn(4, 5))
    assert result.decisions and all(d.reason for d in result.decisions)
    assert all(isinstance(n, ir.Pointwise | ir.Reduction | ir.Gemm | ir.HostOp) for g in result.groups for n in g.nodes)


@pytest.mark.device
def test_debug_directory_gets_every_stage(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend="adreno", options={"debug_dir": str(tmp_path)})
    compiled(torch.randn(5, 8)).sum().backward()
    for graph in ("forward_", "backward_"):
        (name,) = {p.name.split(".")[0] for p in tmp_path.glob(f"{graph}*.fx.txt")}
        assert "torch.ops.aten." in (tmp_path / f"{name}.fx.txt").read_text()
        assert (tmp_path / f"{name}.ir.txt").read_text().startswith(f"graph {name}")
        fusion = (tmp_path / f"{name}.fusion.txt").read_text()
        assert "decisions:" in fusion and ": " in fusion.split("decisions:")[1]
        assert "memory plan" in (tmp_path / f"{name}.memory.txt").read_text()
        sources = list((tmp_path / name).glob("*.cl"))
        assert sources and all("from FX node" in s.read_text() for s in sources)


def test_long_reduction_into_few_outputs_is_split_into_partials_with_reason():
    from torch_adreno.fusion.split_reductions import choose_leading_dims

    # A BatchNorm's per-channel sum over batch x height x width: 16 channels of 8 x 32 x 32.
    x = torch.randn(8, 16, 32, 32)
    result = fused(lambda x: x.sum(dim=(0, 2, 3)), x)
    reductions = [n for g in result.groups for n in g.nodes if isinstance(n, ir.Reduction)]
    assert [(n.ranges, n.reduction_ranges) for n in reductions] == [((16, 8), (32, 32)), ((16,), (8,))]
    assert "split reduce_sum over 8192 elements into 16 output(s): 128 partial rows of 1024" in reasons(result)
    # The graph's own nodes say so too (the ONNX export rebuilds each kernel from them).
    assert [n for n in result.graph.nodes if isinstance(n, ir.Reduction)] == reductions
    # Enough outputs already, or rows too short to split: unchanged; a GPU of 132 compute units aims at 528 rows.
    assert choose_leading_dims(ir.Reduction("r", "o", (1024,), (8, 1024), "sum", ir.index(0), ()), 64) == 0
    assert choose_leading_dims(ir.Reduction("r", "o", (16,), (8, 512), "sum", ir.index(0), ()), 64) == 0
    assert choose_leading_dims(ir.Reduction("r", "o", (64,), (16, 112, 112), "sum", ir.index(0), ()), 528) == 1
    assert choose_leading_dims(ir.Reduction("r", "o", (16,), (8, 4096), "argmax", ir.index(0), ()), 64) == 0


@pytest.mark.device
def test_split_batchnorm_statistics_and_backward_match_eager():
    # Per-channel statistics and their backward over 8 x 32 x 32 elements each: two reduction
    # kernels per split sum (partials, then their sum) in both graphs.
    bn = torch.nn.BatchNorm2d(16)
    prof = assert_matches_eager(lambda x: torch.relu(bn(x)), torch.randn(8, 16, 32, 32), atol=1e-4)
    for graph in ("forward", "backward"):
        reductions = [k for k in prof.kernels if k.kind == "reduction" and k.graph.startswith(graph)]
        assert len(reductions) >= 2, [k.name for k in prof.kernels]
