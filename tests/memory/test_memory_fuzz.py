"""Random graphs against the memory plan: DAGs of pointwise, reduction, view, GEMM and
in-place nodes with random shapes and frozen inputs.

* Without a device, every case's forward and backward plans (with the backend's donation rule)
  are proven by the memory verifier, also with the saved views of one storage bound together.
* On the device, memory reuse on and off give bit-identical outputs and gradients: reuse changes
  where values live, never the arithmetic.

The seed is fixed (``derandomize``). Each property has a bounded test (CI's) and a ``slow`` variant
with the full sweep (deselected under ``CI=true``); ``TORCH_ADRENO_FUZZ_EXAMPLES=N`` runs N cases of each.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torch_adreno.config import Config
from torch_adreno.frontend import decomposition_table
from torch_adreno.frontend.donation import donatable_saved_tensors
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.verify import verify_program
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.memory.plan import StorageKind
from torch_adreno.memory.verify import MemoryPlanError
from torch_adreno.targets import REFERENCE_PROFILE

_EXAMPLES = os.environ.get("TORCH_ADRENO_FUZZ_EXAMPLES")
#: Cases of the plan property: the bounded test's (about 0.4 s each on two cores), the full sweep's.
PLAN_EXAMPLES, PLAN_SWEEP = (int(_EXAMPLES),) * 2 if _EXAMPLES else (80, 300)
#: Cases of the device property (two compiled runs each): the bounded test's, the full sweep's.
DEVICE_EXAMPLES, DEVICE_SWEEP = (int(_EXAMPLES),) * 2 if _EXAMPLES else (10, 30)
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]

#: (name, arity): what one node of a random graph computes from earlier values.
OPS = (
    ("add", 2), ("mul", 2), ("sub", 2), ("relu", 1), ("tanh", 1), ("exp_neg_sq", 1), ("scale", 1),
    ("sum_rows", 1), ("amax_cols", 1), ("softmax", 1), ("transpose", 1), ("flat_view", 1), ("matmul", 2),
    ("mul_", 2), ("add_", 2), ("relu_", 1), ("where_pos", 2), ("layer_norm", 1), ("batched_matmul", 2),
    ("two_adapters", 3), ("two_adapters", 3), ("two_adapters", 3),
)


@dataclass(frozen=True)
class RandomGraph:
    """A program over square ``size x size`` values: inputs first (some frozen), then ``nodes``,
    each ``(op, operand indices)``; the loss sums weighted ``outputs``, and ``extra`` (if not None)
    is returned to the user as well (a forward output that may also be saved)."""

    size: int
    inputs: int
    frozen: tuple[bool, ...]
    nodes: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[int, ...]
    extra: int | None

    def tensors(self, seed: int = 0) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(self.size, self.size, generator=generator).requires_grad_(not frozen)
                for frozen in self.frozen]

    def function(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        n = self.size

        def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # Distinct weights make every element's gradient distinct (transposed ones show).
            weights = torch.arange(n * n, dtype=torch.float32).reshape(n, n) / (n * n) + 0.5
            values = list(inputs)
            for op, operands in self.nodes:
                values.append(_apply(op, [values[i] for i in operands]))
            # A trained input always reaches the loss, so that there is a backward.
            trained = self.frozen.index(False)
            loss = (values[trained] * weights).sum() * 0.25
            for k, i in enumerate(self.outputs):
                loss = loss + (values[i] * weights * (k + 1)).sum()
            return (loss,) if self.extra is None else (loss, values[self.extra])

        return run


def _apply(op: str, args: list[torch.Tensor]) -> torch.Tensor:
    a = args[0]
    b = args[1] if len(args) > 1 else None
    if op == "add":
        return a + b
    if op == "mul":
        return a * b
    if op == "sub":
        return a - b
    if op == "relu":
        return torch.relu(a)
    if op == "tanh":
        return torch.tanh(a)
    if op == "exp_neg_sq":
        return torch.exp(-a * a)
    if op == "scale":
        return a * 0.5 + 1.0
    if op == "sum_rows":
        return a - a.sum(dim=1, keepdim=True) / a.shape[1]
    if op == "amax_cols":
        return a - a.amax(dim=0, keepdim=True)
    if op == "softmax":
        return torch.softmax(a, dim=-1)
    if op == "transpose":
        return a.t()
    if op == "flat_view":
        return a.reshape(-1).view(a.shape[1], a.shape[0]) if a.is_contiguous() else a.reshape(a.shape)
    if op == "matmul":
        return a @ b / a.shape[0]
    if op == "batched_matmul":  # a 3-D by 2-D product: AOTAutograd saves a view of ``a`` per use
        return (a.unsqueeze(0) @ b).squeeze(0) / a.shape[0]
    if op == "two_adapters":  # one value read by two products (LoRA's q and v on one LayerNorm output)
        return _apply("batched_matmul", [a, b]) + _apply("batched_matmul", [torch.tanh(a), args[2]]) \
            + _apply("batched_matmul", [a, args[2]])
    if op == "where_pos":
        return torch.where(a > 0, a, b)
    if op == "layer_norm":
        return torch.nn.functional.layer_norm(a, (a.shape[1],))
    # In-place on a fresh intermediate (never on a graph input: autograd refuses leaves).
    target = a.clone()
    if op == "mul_":
        return target.mul_(b)
    if op == "add_":
        return target.add_(b)
    assert op == "relu_"
    return target.relu_()


@st.composite
def random_graphs(draw: st.DrawFn) -> RandomGraph:
    size = draw(st.integers(1, 6))
    inputs = draw(st.integers(1, 4))
    frozen = tuple(draw(st.booleans()) for _ in range(inputs))
    if all(frozen):
        frozen = (False, *frozen[1:])
    nodes = []
    for index in range(draw(st.integers(1, 12))):
        available = inputs + index
        op, arity = draw(st.sampled_from(OPS))
        operands = tuple(draw(st.integers(0, available - 1)) for _ in range(arity))
        if op == "two_adapters":  # adapters are trained inputs, as LoRA's are
            trained = [i for i in range(inputs) if not frozen[i]]
            operands = (operands[0], draw(st.sampled_from(trained)), draw(st.sampled_from(trained)))
        nodes.append((op, operands))
    total = inputs + len(nodes)
    outputs = tuple(sorted(set(draw(st.lists(st.integers(inputs, total - 1), min_size=1, max_size=3)))))
    extra = draw(st.one_of(st.none(), st.integers(inputs, total - 1)))
    return RandomGraph(size, inputs, frozen, tuple(nodes), outputs, extra)


def _saved_sharing(fw, bw, num_fwd_outputs: int) -> dict[str, str]:
    """Backward inputs (saved tensors) that are views of one storage, each named by its storage:
    the ground truth of which handles the backward gets on one buffer, found independently of the
    donation rule (from the fake tensors, as eager aliases them)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    output = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    saved = [n for n in output.args[0][num_fwd_outputs:] if isinstance(n, torch.fx.Node)]
    placeholders = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    storages: dict[object, list[str]] = {}
    for node in saved:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and node.name in placeholders:
            storages.setdefault(StorageWeakRef(value.untyped_storage()), []).append(node.name)
    return {name: f"the storage of {names[0]}" for names in storages.values() if len(names) > 1 for name in names}


def _plans(case: RandomGraph, donation_rule: Callable = donatable_saved_tensors
           ) -> list[tuple[str, object, dict[str, str]]]:
    """Each graph's program as the backend would plan it, and which of its inputs share memory."""
    programs: list[tuple[str, object, dict[str, str]]] = []
    donations = []

    sharing: dict[str, str] = {}

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        donations.append(donation_rule(fw, bw, kwargs["num_fwd_outputs"]))
        sharing.update(_saved_sharing(fw, bw, kwargs["num_fwd_outputs"]))
        return fw, bw

    def compile_graph(kind: str) -> Callable:
        def compiler(gm, _inputs):
            donation = donations[-1] if kind == "backward" and donations else None
            graph = lower_graph(gm, Config(), kind, None)
            fused = fuse(graph, Config())
            plan = plan_memory(fused, REFERENCE_PROFILE, reuse=True, resident_outputs=kind == "backward",
                               donated=donation.donated if donation else frozenset(),
                               donor_aliases=donation.aliases if donation else None)
            shared = sharing if kind == "backward" else {}
            programs.append((kind, render_program(fused, plan, REFERENCE_PROFILE), dict(shared)))
            return gm
        return compiler

    compiled = aot_function(case.function(), fw_compiler=compile_graph("forward"),
                            bw_compiler=compile_graph("backward"), partition_fn=partition,
                            decompositions=decomposition_table())
    with torch._functorch.config.patch(cse=False):
        compiled(*case.tensors())[0].backward()
    return programs


def _plans_pass_the_verifier(case: RandomGraph) -> None:
    """Every plan passes; every plan corrupted so that two buffers alive at once share bytes fails."""
    programs = _plans(case)
    assert [kind for kind, _, _ in programs][:1] == ["forward"]
    for _kind, program, shared in programs:
        verify_program(program)
        verify_program(program, shared)
        corrupted = _overlapping(program)
        if corrupted is not None:
            with pytest.raises(MemoryPlanError):
                verify_program(corrupted)


@settings(max_examples=PLAN_EXAMPLES, derandomize=True, deadline=None, suppress_health_check=_HEALTH)
@given(random_graphs())
def test_random_graph_plans_pass_the_verifier(case: RandomGraph) -> None:
    _plans_pass_the_verifier(case)


@pytest.mark.slow
@settings(max_examples=PLAN_SWEEP, derandomize=True, deadline=None, suppress_health_check=_HEALTH)
@given(random_graphs())
def test_random_graph_plans_pass_the_verifier_full_sweep(case: RandomGraph) -> None:
    _plans_pass_the_verifier(case)


def _overlapping(program):
    """``program`` with the later written of two arena buffers alive at the same time moved onto the
    other's bytes (None: no two such buffers, the first read after the second is written)."""
    arena = [a for a in program.plan.allocations.values() if a.kind is StorageKind.ARENA and a.nbytes
             and a.first_use >= 0 and a.last_use > a.first_use]
    for first in arena:
        for second in arena:
            if first.first_use < second.first_use < first.last_use and second.nbytes <= first.nbytes:
                allocations = dict(program.plan.allocations)
                allocations[second.buffer] = dataclasses.replace(second, arena=first.arena, offset=first.offset)
                return dataclasses.replace(program, plan=dataclasses.replace(program.plan, allocations=allocations))
    return None


def test_the_verifier_rejects_two_live_buffers_on_one_range() -> None:
    """The fuzz above corrupts plans where it can; this graph (a chain whose values outlive their
    successors' writes) always gives it a pair, so the rejection is exercised whatever was drawn."""
    case = RandomGraph(8, 2, (False, False), (("matmul", (0, 1)), ("softmax", (2,)), ("matmul", (3, 0)),
                                              ("layer_norm", (4,)), ("matmul", (5, 2)), ("add", (6, 3))), (7,), None)
    corrupted = [c for _, program, _ in _plans(case) if (c := _overlapping(program)) is not None]
    assert corrupted, "no plan of the graph has two buffers alive at once"
    for program in corrupted:
        with pytest.raises(MemoryPlanError, match=r"over .* which is read later|reads"):
            verify_program(program)


def _compiled_run(case: RandomGraph, reuse: bool) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    torch._dynamo.reset()
    fn = torch.compile(case.function(), backend="adreno", options={"memory_reuse": reuse}, dynamic=False)
    inputs = case.tensors()
    outputs = fn(*inputs)
    outputs[0].backward()
    return [o.detach().clone() for o in outputs], [None if x.grad is None else x.grad.clone() for x in inputs]


def _reuse_changes_no_bit(case: RandomGraph) -> None:
    reused_outputs, reused_grads = _compiled_run(case, True)
    alone_outputs, alone_grads = _compiled_run(case, False)
    for ours, theirs in zip(reused_outputs, alone_outputs, strict=True):
        assert torch.equal(ours, theirs) or (ours.isnan() == theirs.isnan()).all()
    for ours, theirs in zip(reused_grads, alone_grads, strict=True):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    inputs = case.tensors()
    eager = case.function()(*inputs)
    eager[0].backward()
    torch.testing.assert_close(reused_outputs[0], eager[0].detach(), rtol=1e-3, atol=1e-3, equal_nan=True)
    for ours, x in zip(reused_grads, inputs, strict=True):
        if x.grad is not None:
            torch.testing.assert_close(ours, x.grad, rtol=1e-3, atol=1e-3, equal_nan=True)


_DEVICE_HEALTH = [*_HEALTH, HealthCheck.function_scoped_fixture]


@pytest.mark.device
@settings(max_examples=DEVICE_EXAMPLES, derandomize=True, deadline=None, suppress_health_check=_DEVICE_HEALTH)
@given(random_graphs())
def test_random_graphs_give_the_same_bits_with_and_without_memory_reuse(case: RandomGraph) -> None:
    _reuse_changes_no_bit(case)


@pytest.mark.slow
@pytest.mark.device
@settings(max_examples=DEVICE_SWEEP, derandomize=True, deadline=None, suppress_health_check=_DEVICE_HEALTH)
@given(random_graphs())
def test_random_graphs_give_the_same_bits_with_and_without_memory_reuse_full_sweep(case: RandomGraph) -> None:
    _reuse_changes_no_bit(case)
