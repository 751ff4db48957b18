"""Multi-tensor grouping: independent pointwise kernels (an optimizer's per-parameter updates) run
as segments of one launch. Stage tests (decisions, memory plan, kernel text; no device) and
compiled optimizer steps against eager on the device, with their launches counted."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import capture_graphs
from torch._dynamo.backends.common import aot_autograd
from torch.fx import GraphModule

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.frontend import decomposition_table
from torch_adreno.frontend.decompositions import foreach_decompositions
from torch_adreno.fusion import SegmentedKernel, fuse, max_kernel_buffers
from torch_adreno.kernels import render_program
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import StorageKind, plan_memory
from torch_adreno.targets import REFERENCE_PROFILE
from torch_adreno.training.hyperparameters import _own_step_settings

GROUPED = "multi-tensor grouping"


def _reasons(result) -> str:
    return "\n".join(str(d) for d in result.decisions)


def _fused(fn, *inputs, max_buffers=None):
    graph = lower_graph(capture_graphs(fn, *inputs)[0], Config(), "g", None)
    return fuse(graph, Config(), max_buffers)


def _mlp(widths=(6, 10, 7, 3)) -> torch.nn.Module:
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def _optimizer_graph(make_optimizer, model: torch.nn.Module) -> GraphModule:
    """The ATen graph our backend receives for ``optimizer.step`` (input mutations kept in it)."""
    graphs: list[GraphModule] = []

    def keep(gm: GraphModule, example_inputs) -> GraphModule:
        graphs.append(gm)
        return gm

    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = make_optimizer(model.parameters())
    opt.step()  # the state exists: the compiled step is the steady one
    backend = aot_autograd(fw_compiler=keep, decompositions=decomposition_table(),
                           keep_inference_input_mutations=True)
    torch.compile(opt.step, backend=backend, fullgraph=False)()
    (gm,) = graphs
    return gm


# -- the fusion decision ----------------------------------------------------------------------------


def test_independent_pointwise_kernels_of_different_shapes_are_one_segmented_launch():
    result = _fused(lambda a, b, c: ((a * 2 + 1).exp(), b.tanh() * 3, c - 1),
                    torch.randn(4, 5), torch.randn(7), torch.randn(2, 3, 2))
    (group,) = result.groups
    spec = group.spec
    assert isinstance(spec, SegmentedKernel)
    assert [seg.ranges for seg in spec.segments] == [(4, 5), (7,), (2, 3, 2)]
    assert spec.offsets == [0, 20, 27, 39]
    assert _reasons(result).count(GROUPED) == 2
    assert sorted(group.writes) == sorted(result.graph.output_buffers())


def test_kernel_reading_an_earlier_result_is_not_grouped_with_it_and_says_why():
    # ``c * s`` reads the sum's result, so it cannot move up into the launch of ``a.exp()``.
    result = _fused(lambda a, c: (a.exp(), c * (a * 3).sum()), torch.randn(8, 9), torch.randn(5))
    assert [g.kind for g in result.groups] == ["pointwise", "reduction", "pointwise"]
    total = result.groups[1].writes[0]
    assert total in result.groups[2].reads
    assert f"cannot fuse k2 into the launch of k0: it reads {total}, which the launch of k1 writes" in _reasons(result)


def test_every_kernel_still_runs_after_what_it_reads():
    model = _mlp()
    gm = _optimizer_graph(lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True), model)
    result = fuse(lower_graph(gm, Config(), "g", None), Config())
    available = set(result.graph.input_buffers())
    for g in result.groups:
        assert set(g.reads) <= available, (g.name, set(g.reads) - available)
        available |= set(g.writes)
    assert result.graph.output_buffers() <= available


@pytest.mark.parametrize(("name", "make", "launches"), [
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2), 1),
    ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-2), 2),
    ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1), 2),
    # foreach=True: Dynamo traces the _foreach_* ops, decomposed per tensor, then grouped the same way
    ("sgd_foreach", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=True), 1),
    ("adamw_foreach", lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=True), 2),
])
def test_optimizer_step_is_a_constant_number_of_launches(name, make, launches):
    model = _mlp((6, 10, 7, 5, 3))
    gm = _optimizer_graph(make, model)
    result = fuse(lower_graph(gm, Config(), "g", None), Config())
    assert len(result.groups) == launches, result.describe()
    segmented = [g for g in result.groups if isinstance(g.spec, SegmentedKernel)]
    # Every parameter's update is a segment of the last launch (foreach Adam adds a step count there).
    assert len(list(model.parameters())) <= len(segmented[-1].spec.segments) <= len(list(model.parameters())) + 1
    unfused = fuse(lower_graph(gm, Config(), "g", None), Config(fusion=False))
    assert len(unfused.groups) > 8 * launches


def test_a_launch_is_split_where_it_would_pass_the_kernel_argument_limit():
    inputs = [torch.randn(3 + i) for i in range(6)]

    def fn(*xs):
        return tuple(x * 2 for x in xs)

    unlimited = _fused(fn, *inputs)
    assert len(unlimited.groups) == 1
    limited = _fused(fn, *inputs, max_buffers=5)  # two buffers per kernel: two kernels per launch
    assert [len(g.reads) + len(g.writes) for g in limited.groups] == [4, 4, 4]
    assert "more than 5 buffer arguments" in _reasons(limited)
    assert max_kernel_buffers() == 128 and max_kernel_buffers(4352, 64) == 544 and max_kernel_buffers(256, 32) == 64


def test_grouping_is_off_without_fusion():
    result = fuse(lower_graph(capture_graphs(lambda a, b: (a * 2, b * 3), torch.randn(4), torch.randn(5))[0],
                              Config(), "g", None), Config(fusion=False))
    assert len(result.groups) == 2 and GROUPED not in _reasons(result)


# -- memory plan: in place only where no other segment reads the bytes --------------------------------


def test_optimizer_updates_stay_in_place_in_the_grouped_launch():
    model = _mlp()
    gm = _optimizer_graph(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), model)
    fused = fuse(lower_graph(gm, Config(), "g", None), Config())
    plan = plan_memory(fused, REFERENCE_PROFILE)
    aliased = [a for a in plan.allocations.values() if a.kind is StorageKind.INPUT_ALIAS]
    # parameters and momentum buffers: every new value written over the old one, nothing copied
    assert len(aliased) == len(fused.graph.mutations) == 2 * len(list(model.parameters()))


def test_no_in_place_update_over_bytes_another_segment_reads():
    def fn(a, b):
        out = b + a.flip(0).view(2, 4)  # reads ``a`` at other elements, in a kernel of another shape
        a.mul_(2)
        return out

    graphs: list[GraphModule] = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    backend = aot_autograd(fw_compiler=keep, decompositions=decomposition_table(), keep_inference_input_mutations=True)
    torch.compile(fn, backend=backend)(torch.randn(8), torch.randn(2, 4))
    fused = fuse(lower_graph(graphs[0], Config(), "g", None), Config())
    (group,) = fused.groups
    assert isinstance(group.spec, SegmentedKernel) and len(group.spec.segments) == 2
    plan = plan_memory(fused, REFERENCE_PROFILE)
    ((_target, value),) = fused.graph.mutations.items()
    assert plan.allocations[value].kind is not StorageKind.INPUT_ALIAS, plan.describe()


# -- rendered kernel text ------------------------------------------------------------------------------


def test_segmented_kernel_text_names_its_fx_nodes_and_decides_segments_by_offset():
    gm = capture_graphs(lambda a, b, c: (a.exp(), b.tanh(), c.sigmoid()),
                        torch.randn(4, 5), torch.randn(7), torch.randn(3))[0]
    fused = fuse(lower_graph(gm, Config(), "g", None), Config())
    program = render_program(fused, plan_memory(fused, REFERENCE_PROFILE), REFERENCE_PROFILE)
    (kernel,) = program.kernels
    assert kernel.kind == "segmented" and "_seg_" in kernel.name
    for node in ("exp", "tanh", "sigmoid"):
        assert f"from FX node {node} " in kernel.source
    assert "if (gx >= 30) return;" in kernel.source
    assert "if (gx < 20) {" in kernel.source and "if (gx < 27) {" in kernel.source
    assert "const INDEX_T x = gx - 27;" in kernel.source
    assert kernel.global_size[0] >= 30


def _optimizer_kernel(model: torch.nn.Module):
    gm = _optimizer_graph(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), model)
    fused = fuse(lower_graph(gm, Config(), "g", None), Config())
    program = render_program(fused, plan_memory(fused, REFERENCE_PROFILE), REFERENCE_PROFILE)
    (kernel,) = [k for k in program.kernels if k.kind == "segmented"]
    return kernel


def test_segments_of_equal_code_share_it_so_the_kernel_does_not_grow_with_repeated_layers():
    # SGD with momentum on 2 and on 12 layers of different widths: every parameter's update is the
    # same elementwise code on other buffers, so the kernel holds that code once; only the
    # decision tree pointing the code at each segment's buffers grows with the parameters.
    two, twelve = (_optimizer_kernel(_mlp((6, 10) + (9, 8) * n + (3,))) for n in (0, 5))
    assert (two.source.count("// segment "), twelve.source.count("// segment ")) == (4, 24)  # a segment a parameter
    for kernel in (two, twelve):
        computed = [ln for ln in kernel.source.splitlines() if "const float" in ln]
        assert kernel.source.count("if (segment_group == 0) {") == 1 and "segment_group == 1" not in kernel.source
        assert len(computed) == len([ln for ln in two.source.splitlines() if "const float" in ln]), kernel.source
    # An element read at the segment's own index is read at ``x``: no index arithmetic, no shape.
    assert "(x / " not in twelve.source and "(x % " not in twelve.source


def test_index_simplification_of_a_graph_lowered_again_is_found_memoised(monkeypatch):
    from torch_adreno.ir import expr

    monkeypatch.setattr(expr, "_SIMPLIFIED", {})
    gm = capture_graphs(lambda a: (a.reshape(6, 4).t() * 2).reshape(2, 12), torch.randn(4, 6))[0]
    lower_graph(gm, Config(), "g", None)
    known = dict(expr._SIMPLIFIED)
    assert known  # (the reshapes and transpose simplify index arithmetic)
    lower_graph(gm, Config(), "g2", None)
    assert known == expr._SIMPLIFIED  # every simplification the second lowering asked for was memoised


# -- on the device: compiled optimizer steps against eager ------------------------------------------------


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "sgd_nesterov_weight_decay": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True,
                                                            weight_decay=0.01, dampening=0.0),
    "sgd_dampening_weight_decay": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.2,
                                                             weight_decay=0.05),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adam_weight_decay_tensor_lr": lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-2), weight_decay=0.01),
    "adamw_amsgrad_weight_decay": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "sgd_nesterov_weight_decay_foreach": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True,
                                                                    weight_decay=0.01, foreach=True),
    "adamw_amsgrad_weight_decay_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, weight_decay=0.1,
                                                                       foreach=True),
}


@pytest.mark.device
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step_matches_eager_in_few_launches(name):
    make = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = _mlp((6, 10, 9, 8, 7, 3))  # 10 parameters
    reference = copy.deepcopy(model)
    opt, ref_opt = make(model.parameters()), make(reference.parameters())
    step = torch.compile(opt.step, backend="adreno")
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    launches = []
    for _ in range(4):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
        ref_opt.step()
        with torch_adreno.profile() as prof:
            step()
        launches.append(prof.kernel_launches)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for key, state in ref_opt.state.items():
        ours = opt.state[dict(zip(reference.parameters(), model.parameters(), strict=True))[key]]
        for k, v in state.items():
            torch.testing.assert_close(ours[k], v, rtol=1e-5, atol=1e-6)
    # The first step creates the state (eager code); the later ones are the compiled graph: a
    # constant number of launches for 10 parameters (one per parameter before grouping).
    assert 1 <= max(launches[1:]) <= 2, launches


@pytest.mark.device
def test_training_step_runs_the_adam_update_in_two_launches():
    torch.manual_seed(0)
    model = _mlp((6, 10, 9, 8, 3))
    reference = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)

    def loss_fn(m, x, y):
        return F.cross_entropy(m(x), y)

    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    with torch_adreno.TrainingStep(model, loss_fn, opt) as step:
        for _ in range(3):
            with torch_adreno.profile() as prof:
                loss = step(x, y)
            ref_opt.zero_grad()
            ref_loss = loss_fn(reference, x, y)
            ref_loss.backward()
            ref_opt.step()
            torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    optimizer_launches = [k for k in prof.kernels if k.graph.startswith("inference")]
    assert len(optimizer_launches) == 2, [k.name for k in prof.kernels]
    # The parameters' update is one segmented launch; the other computes each parameter's step size
    # from the learning rate and betas, which the step reads as tensors (bytes, not tensors' worth).
    updates = [k for k in optimizer_launches if k.kind == "segmented"]
    assert len(updates) >= 1
    assert all(k.bytes_read + k.bytes_written < 1024 for k in optimizer_launches if k not in updates)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_an_optimizer_running_its_own_step_is_given_the_multi_tensor_update_for_the_call_only():
    # PyTorch picks the per-tensor step for host tensors when foreach is unset: Dynamo would trace
    # its loop once per parameter. The call sets foreach (bitwise the same update) and fused off
    # (host code); an explicit foreach=False is the user's.
    assert _own_step_settings({"foreach": None, "capturable": False, "fused": None}) == \
        {"foreach": True, "capturable": True}
    assert _own_step_settings({"foreach": False, "capturable": False}) == {}
    assert _own_step_settings({"foreach": None, "differentiable": True}) == {}
    assert _own_step_settings({"foreach": None, "fused": True, "capturable": False}) == \
        {"fused": False, "foreach": True, "capturable": True}


@pytest.mark.device
def test_training_step_runs_an_unset_foreach_optimizer_and_leaves_its_settings_as_given():
    # Rprop is no update rule the step traces itself: its own multi-tensor step(), during each call.
    torch.manual_seed(0)
    model, reference = _mlp((6, 10, 9, 3)), _mlp((6, 10, 9, 3))
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.Rprop(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Rprop(reference.parameters(), lr=1e-2)
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    before = [p.detach().clone() for p in model.parameters()]
    with torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt) as step, \
            torch_adreno.profile() as prof:
        for _ in range(3):
            loss = step(x, y)
            assert opt.param_groups[0]["foreach"] is None and opt.param_groups[0]["capturable"] is False
            ref_opt.zero_grad()
            ref_loss = F.cross_entropy(reference(x), y)
            ref_loss.backward()
            ref_opt.step()
            torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    assert prof.kernels, "the step ran no kernel"
    assert opt.param_groups[0]["foreach"] is None
    for p, q, b in zip(model.parameters(), reference.parameters(), before, strict=True):
        assert not torch.equal(p, b)
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# -- foreach ops: decomposed per tensor ----------------------------------------------------------------


def _sample(argument, generator) -> object:
    shapes = [(3, 4), (5,), ()]
    kind = str(argument.type)
    if kind == "List[Tensor]":
        return [torch.rand(s, generator=generator) + 0.5 for s in shapes]
    if kind.startswith("List["):  # Scalar[]
        return [0.5, 1.5, 2.0]
    if kind == "Tensor":
        return torch.tensor(0.7)
    return 1.3  # a number


@pytest.mark.parametrize("op", sorted(foreach_decompositions(), key=str), ids=str)
def test_foreach_decomposition_matches_the_foreach_op(op):
    generator = torch.Generator().manual_seed(0)
    args = [_sample(a, generator) for a in op._schema.arguments if not a.kwarg_only]
    kwargs = {a.name: 0.6 for a in op._schema.arguments if a.kwarg_only}
    expected = op(*args, **kwargs)
    actual = foreach_decompositions()[op](*args, **kwargs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.device
def test_device_profile_carries_the_kernel_parameter_bytes():
    from torch_adreno.runtime import get_runtime

    runtime = get_runtime(None)
    device = runtime.entry.device
    profile = runtime.profile
    assert (profile.max_parameter_bytes, profile.address_bits) == (device.max_parameter_size, device.address_bits)
    assert max_kernel_buffers(profile.max_parameter_bytes, profile.address_bits) >= 8
