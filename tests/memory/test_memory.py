"""Memory planning (no device) and residency, zero-copy and the on-device optimizer (device)."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_matches_eager, capture_graphs
from test_fusion import FUSION_CASES

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.fusion import fuse
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import StorageKind, plan_memory
from torch_adreno.models import MODELS
from torch_adreno.runtime import get_runtime
from torch_adreno.targets import REFERENCE_PROFILE


def model_graphs(model_name: str):
    spec = MODELS[model_name]
    model = spec.make()
    names = [n for n, _ in model.named_parameters()]
    x, y = spec.batch()

    def step(x, y, *params):
        return F.cross_entropy(torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,)), y)

    gms = capture_graphs(step, x, y, *[p.detach().requires_grad_() for p in model.parameters()])
    return [fuse(lower_graph(gm, Config(), f"g{i}", 1 if i == 0 else None), Config()) for i, gm in enumerate(gms)]


def assert_no_live_overlap(plan) -> None:
    placed = [a for a in plan.allocations.values() if a.kind in (StorageKind.ARENA, StorageKind.DONATED)]
    for a in placed:
        assert a.offset % plan.alignment == 0
        if a.kind is StorageKind.ARENA:
            assert a.offset + a.nbytes <= plan.arena_bytes[a.arena]
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            same_region = (a.kind, a.arena, a.donor) == (b.kind, b.arena, b.donor)
            bytes_overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            live_together = a.first_use <= b.last_use and b.first_use <= a.last_use
            in_place = plan.storage_root(a.buffer) == plan.storage_root(b.buffer)
            assert not (same_region and bytes_overlap and live_together and not in_place), (a, b)
    for a in placed:
        if a.kind is StorageKind.DONATED:
            donor = plan.allocations[a.donor]
            assert a.offset + a.nbytes <= donor.nbytes
            assert a.first_use >= donor.last_use, (a, donor)  # the donor is read for the last time first


@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_plans_never_overlap_live_buffers_and_reuse_shrinks_them(model_name):
    for fused in model_graphs(model_name):
        reused = plan_memory(fused, REFERENCE_PROFILE, reuse=True, donated=fused.graph.input_buffers())
        alone = plan_memory(fused, REFERENCE_PROFILE, reuse=False)
        assert_no_live_overlap(reused)
        assert_no_live_overlap(alone)
        assert reused.planned_peak_bytes <= alone.planned_peak_bytes
        assert alone.planned_arena_bytes >= reused.unshared_bytes - len(reused.allocations) * reused.alignment


def test_backward_reuses_bytes():
    backward = model_graphs("lenet")[1]
    reused = plan_memory(backward, REFERENCE_PROFILE, reuse=True)
    alone = plan_memory(backward, REFERENCE_PROFILE, reuse=False)
    assert reused.planned_arena_bytes <= 0.8 * alone.planned_arena_bytes


def test_arenas_respect_the_largest_allocation():
    import dataclasses

    small = dataclasses.replace(REFERENCE_PROFILE, max_alloc_bytes=2_000_000)
    backward = model_graphs("mlp")[1]
    for reuse in (True, False):
        plan = plan_memory(backward, small, reuse=reuse, shared_outputs=False)
        assert all(size <= small.max_alloc_bytes for size in plan.arena_bytes)
        assert len(plan.arena_bytes) >= 2  # more than one allocation's worth: split, not refused
        assert_no_live_overlap(plan)


# -- on the device ---------------------------------------------------------------------------------


@pytest.mark.device
@pytest.mark.parametrize("case", ["gemm_epilogue", "log_softmax_nll", "mean_var", "conv_bias_relu_pool"])
@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("zero_copy", [pytest.param(True, marks=pytest.mark.unified_memory), False])
def test_numerics_with_and_without_reuse_and_sharing(case, reuse, zero_copy):
    fn, *shapes = FUSION_CASES[case]
    assert_matches_eager(fn, *[torch.randn(*s) for s in shapes], atol=1e-4,
                         options={"memory_reuse": reuse, "zero_copy": zero_copy})


def _optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


@pytest.mark.device
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("zero_copy", [pytest.param(True, marks=pytest.mark.unified_memory), False])
def test_on_device_optimizer_keeps_host_copies_right(opt_name, zero_copy):
    spec = MODELS["lenet"]
    model = spec.make()
    reference = copy.deepcopy(model)
    options = {"zero_copy": zero_copy}
    opt, ref_opt = _optimizer(opt_name, model.parameters()), _optimizer(opt_name, reference.parameters())
    loss_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", options=options)
    step = torch.compile(opt.step, backend="adreno", options=options)
    gen = torch.Generator().manual_seed(3)
    for i in range(8):
        x, y = spec.batch(gen)
        if i == 5:  # a change made on the host between steps reaches the device
            with torch.no_grad():
                for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                    p.mul_(0.9)
                    q.mul_(0.9)
        with torch_adreno.profile() as prof:
            opt.zero_grad()
            loss = loss_fn(model, x, y)
            loss.backward()
            if i == 6:  # gradients changed on the host (clipping) reach the step
                for p in model.parameters():
                    p.grad.mul_(0.5)
            step()
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        if i == 6:
            for q in reference.parameters():
                q.grad.mul_(0.5)
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), i
        assert prof.host_fallback_ops == []
        if zero_copy and get_runtime(None).profile.unified_memory:
            assert prof.bytes_host_to_device == prof.bytes_device_to_host == 0
        elif i >= 2 and i != 5:
            # Parameters and optimizer state were written back after the last step: nothing to
            # upload again (AOTAutograd's version bump before the step changes no value); the
            # gradients are still on the device from the backward, unless changed on the host.
            assert prof.transfer_bytes("h2d", "parameter") == 0, i
            grads = sum(p.numel() * 4 for p in model.parameters())
            uploaded = sum(t.nbytes for t in prof.transfers if t.direction == "h2d" and t.copied
                           and t.graph.startswith("inference"))
            assert uploaded == (grads if i == 6 else 0), (i, uploaded)
        elif i == 5:
            assert prof.transfer_bytes("h2d", "parameter") == sum(p.numel() * 4 for p in model.parameters())
    # Host copies read in the ways users read them: state_dict, eager evaluation, optimizer state.
    ours, theirs = model.state_dict(), reference.state_dict()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    x, _ = spec.batch(gen)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        for key, value in ref_opt.state[q].items():
            torch.testing.assert_close(opt.state[p][key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.device
@pytest.mark.unified_memory
def test_zero_copy_step_moves_no_bytes_and_counts_what_it_shares():
    spec = MODELS["mlp"]
    model = spec.make()
    loss_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno", options={"zero_copy": True})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = torch.compile(opt.step, backend="adreno", options={"zero_copy": True})
    x, y = spec.batch()
    for _ in range(2):
        with torch_adreno.profile() as prof:
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            step()
    assert prof.bytes_host_to_device == prof.bytes_device_to_host == 0
    assert prof.bytes_shared >= x.numel() * 4 + sum(p.numel() * 4 for p in model.parameters())


@pytest.mark.device
def test_no_memory_growth_over_many_steps():
    spec = MODELS["lenet"]
    model = spec.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno")
    runtime = get_runtime(None)
    gen = torch.Generator().manual_seed(0)
    sizes = []
    # What lived before the first step (torch, the interpreter: most of a full collection's time)
    # is set aside; each step's collection and scan walk what the steps made, where a leak is.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(30):
            x, y = spec.batch(gen)
            opt.zero_grad()
            loss_fn(model, x, y).backward()
            opt.step()
            gc.collect()
            sizes.append(runtime.pool.allocated_bytes)
            alive = [o for o in gc.get_objects() if isinstance(o, torch_adreno.DeviceTensor)]
            assert not alive, f"{len(alive)} saved activations outlived their backward"
    finally:
        gc.unfreeze()
    assert len(set(sizes[3:])) == 1, sizes


@pytest.mark.device
def test_second_backward_over_reused_saved_tensors_is_refused_clearly(tmp_path):
    spec = MODELS["lenet"]
    model = spec.make()
    x, _ = spec.batch()
    out = torch.compile(model, backend="adreno", options={"debug_dir": str(tmp_path)})(x)
    out.sum().backward(retain_graph=True)
    (plan_text,) = [p.read_text() for p in tmp_path.glob("backward_*.memory.txt")]
    assert "(donated)" in plan_text
    with pytest.raises(RuntimeError, match="memory_reuse"):
        out.sum().backward()
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    with torch_adreno.profile() as prof:
        out = torch.compile(model, backend="adreno", options={"memory_reuse": False})(x)
        out.sum().backward(retain_graph=True)
        out.sum().backward()
    assert sum(k.graph.startswith("backward") for k in prof.kernels) >= 2 * len(
        {k.name for k in prof.kernels if k.graph.startswith("backward")}), "both backwards ran on the device"
    # Both backwards accumulate into .grad: twice eager's gradient, each from the saved tensors intact.
    reference = copy.deepcopy(model)
    reference.zero_grad(set_to_none=True)
    reference(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, 2 * q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.device
@pytest.mark.parametrize("model_name", ["resnet_mini", "transformer"])
def test_backward_memory_with_reuse(model_name, tmp_path):
    """The backward's own buffers with reuse (in place, lifetimes, donated saved activations) need
    at most half the bytes they would without (measured 0.30 and 0.17)."""
    spec = MODELS[model_name]
    model = spec.make()
    x, y = spec.batch()
    step = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno",
                         options={"debug_dir": str(tmp_path)})
    step(model, x, y).backward()
    with torch_adreno.profile() as prof:
        step(model, x, y).backward()
    (backward,) = [v for k, v in prof.peak_device_bytes.items() if k.startswith("backward")]
    assert backward["planned"] <= 0.5 * backward["unshared"], backward
    (plan_text,) = [p.read_text() for p in tmp_path.glob("backward_*.memory.txt")]
    if model_name == "resnet_mini":  # its BatchNorm backward updates buffers it reads for the last time
        assert "in place of" in plan_text
    assert "(donated)" in plan_text and "is released after kernel" in plan_text  # saved activations serve


@pytest.mark.device
def test_activation_memory_budget_saves_fewer_bytes_and_keeps_gradients():
    """Below 1, the partitioner recomputes BatchNorm+ReLU in the backward instead of saving them."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 4))
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    saved, grads = {}, {}
    for budget in (1.0, 0.5):
        torch._dynamo.reset()
        model = copy.deepcopy(net)
        loss_fn = torch.compile(lambda m, x, y: F.cross_entropy(m(x), y), backend="adreno",
                                options={"activation_memory_budget": budget})
        with torch_adreno.profile() as prof:
            loss_fn(model, x, y).backward()
        saved[budget] = prof.graph_runs[0].escaping_bytes
        grads[budget] = [p.grad for p in model.parameters()]
    reference = copy.deepcopy(net)
    F.cross_entropy(reference(x), y).backward()
    assert saved[0.5] < saved[1.0], saved
    for g, r in zip(grads[0.5], (p.grad for p in reference.parameters()), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_activation_memory_budget_is_validated():
    with pytest.raises(ValueError, match="activation_memory_budget"):
        torch.compile(torch.nn.Linear(2, 2), backend="adreno",
                      options={"activation_memory_budget": 1.5})(torch.randn(1, 2))
