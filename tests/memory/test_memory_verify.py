"""Saved views of one buffer, the donation rule, and the memory verifier (no device), then a LoRA
transformer whose saved views share buffers, trained on the device against float64."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition

import torch_adreno
from torch_adreno.config import Config
from torch_adreno.frontend import decomposition_table
from torch_adreno.frontend.donation import Donation, donatable_saved_tensors
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.verify import verify_program
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import plan_memory
from torch_adreno.memory.verify import Access, MemoryPlanError, Placement, verify_accesses
from torch_adreno.targets import REFERENCE_PROFILE

# -- the engine --------------------------------------------------------------------------------


def _one_slot(value: object) -> Placement:
    return Placement("slot", 0, 16)


def test_a_read_after_its_bytes_were_reused_is_a_violation() -> None:
    accesses = [Access("k0", ("x",), ("a",)), Access("k1", ("a",), ("b",)), Access("k2", ("a",), ("c",))]
    place = {"x": Placement("input x", 0, 16), "a": Placement("slot", 0, 16), "b": Placement("slot", 0, 16),
             "c": Placement("other", 0, 16)}
    with pytest.raises(MemoryPlanError, match=r"k1 writes b into slot .* over a .* read later by k2"):
        verify_accesses(accesses, place.__getitem__, ["x"], {"c"}, "g")


def test_a_write_over_a_value_the_caller_keeps_is_a_violation() -> None:
    accesses = [Access("k0", ("x",), ("a",))]
    with pytest.raises(MemoryPlanError, match="needed after the last launch"):
        verify_accesses(accesses, _one_slot, ["x"], {"x", "a"}, "g")


def test_element_wise_in_place_is_legal_only_where_declared() -> None:
    read_and_overwrite = [Access("k0", ("x",), ("a",)), Access("k1", ("a",), ("b",))]
    place = {"x": Placement("input", 0, 16), "a": Placement("slot", 0, 16), "b": Placement("slot", 0, 16)}
    with pytest.raises(MemoryPlanError, match="read by the same launch"):
        verify_accesses(read_and_overwrite, place.__getitem__, ["x"], {"b"}, "g")
    declared = [Access("k0", ("x",), ("a",)), Access("k1", ("a",), ("b",), {"b": "a"})]
    verify_accesses(declared, place.__getitem__, ["x"], {"b"}, "g")


def test_partial_overlap_counts_and_disjoint_ranges_do_not() -> None:
    accesses = [Access("k0", (), ("a",)), Access("k1", (), ("b",)), Access("k2", ("a", "b"), ("c",))]
    disjoint = {"a": Placement("s", 0, 8), "b": Placement("s", 8, 16), "c": Placement("t", 0, 8)}
    verify_accesses(accesses, disjoint.__getitem__, [], {"c"}, "g")
    overlapping = {**disjoint, "b": Placement("s", 4, 12)}
    with pytest.raises(MemoryPlanError, match="k1 writes b"):
        verify_accesses(accesses, overlapping.__getitem__, [], {"c"}, "g")


# -- saved views of one storage: the donation rule ----------------------------------------------


def _lora_pair(x: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor) -> torch.Tensor:
    """Two adapters reading one frozen LayerNorm output: AOTAutograd saves ``view(n)`` twice."""
    n = F.layer_norm(x, (x.shape[-1],))
    return (n @ a1.t()).sum() + (n @ a2.t() * 2).sum()


def _capturing_partition(captured: dict[str, object]):
    """The backend's partitioner, keeping the graphs and the donation decided for them."""

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        captured["donation"] = donatable_saved_tensors(fw, bw, kwargs["num_fwd_outputs"])
        captured["fw"], captured["bw"] = fw, bw
        return fw, bw

    return partition


def _partitioned(fn, *inputs):
    """The forward and backward FX graphs the backend gets, and the donation decided for them."""
    captured: dict[str, object] = {}
    partition = _capturing_partition(captured)
    compiled = aot_function(fn, fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm,
                            partition_fn=partition, decompositions=decomposition_table())
    with torch._functorch.config.patch(cse=False):  # as the backend partitions
        compiled(*inputs).backward()
    return captured["fw"], captured["bw"], captured["donation"]


def _lora_inputs():
    torch.manual_seed(0)
    return (torch.randn(2, 8, 16), torch.randn(4, 16, requires_grad=True), torch.randn(4, 16, requires_grad=True))


def test_two_saved_views_of_one_buffer_donate_once_with_the_other_as_alias() -> None:
    _, bw, donation = _partitioned(_lora_pair, *_lora_inputs())
    saved_views = [n.name for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("view")]
    assert len(saved_views) >= 2, saved_views  # the case donating every saved tensor gets wrong
    donor = next(iter(donation.aliases))
    assert set(donation.aliases[donor]) | {donor} >= set(saved_views[:2])
    assert not set(donation.aliases[donor]) & donation.donated
    for alias in donation.aliases[donor]:
        assert "donated after the last read of both" in donation.refused[alias]


def test_saved_forward_inputs_and_views_of_them_are_never_donated() -> None:
    def f(x, w):
        return (x @ w.t()).relu().sum() + (x.view(-1) * 2).sum()

    _, bw, donation = _partitioned(f, torch.randn(4, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True))
    placeholders = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    assert not {p for p in placeholders if p.startswith("primals")} & donation.donated
    assert donation.refused  # the weight and the input are saved; reasons are given


def _lora_model_partitioned(layers: int = 2):
    """The partitioned graphs of the LoRA transformer below (at d 64), traced by
    Dynamo and AOTAutograd as the backend traces them, without a device."""
    from torch._dynamo.backends.common import aot_autograd

    captured: dict[str, object] = {}
    partition = _capturing_partition(captured)
    backend = aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm, partition_fn=partition,
                           decompositions=decomposition_table())
    torch.manual_seed(0)
    model = LoRAGPT(layers, d=64, heads=1, vocab=500)
    idx = torch.randint(0, 500, (2, 32))
    with torch._functorch.config.patch(cse=False):
        _lm_loss(torch.compile(model, backend=backend, dynamic=False), idx).backward()
    return captured["fw"], captured["bw"], captured["donation"]


def _backward_program(bw, donation: Donation):
    fused = fuse(lower_graph(bw, Config(), "backward", None), Config())
    plan = plan_memory(fused, REFERENCE_PROFILE, reuse=True, donated=donation.donated,
                       donor_aliases=donation.aliases)
    return render_program(fused, plan, REFERENCE_PROFILE)


def test_the_verifier_rejects_donating_both_views_and_accepts_the_donation_rule() -> None:
    fw, bw, donation = _lora_model_partitioned()
    assert donation.aliases  # saved views of one LayerNorm output, per block
    shared = {name: f"the buffer of {donor}" for donor, aliases in donation.aliases.items()
              for name in (donor, *aliases)}
    # The naive rule: every saved tensor the forward computed donated.
    computed = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    naive = Donation(frozenset(n.name for n in bw.graph.nodes if n.op == "placeholder" and n.name in computed))
    naive_program = _backward_program(bw, naive)
    with pytest.raises(MemoryPlanError, match="read later by"):
        verify_program(naive_program, shared)
    program = _backward_program(bw, donation)
    verify_program(program, shared)
    verify_program(program)
    assert program.plan.donor_aliases == {d: tuple(a) for d, a in donation.aliases.items()
                                          if any(x.donor == d for x in program.plan.allocations.values())}


def test_a_donor_with_an_alias_is_busy_until_the_alias_is_read() -> None:
    _, bw, donation = _lora_model_partitioned()
    plan = _backward_program(bw, donation).plan
    assert plan.donor_aliases
    for donor, aliases in plan.donor_aliases.items():
        last_read = max(plan.allocations[name].last_use for name in (donor, *aliases))
        for alloc in plan.allocations.values():
            if alloc.donor == donor:
                assert alloc.first_use > last_read or alloc.first_use == last_read == plan.allocations[donor].last_use


# -- a LoRA transformer with shared saved views, on the device ------------------------------------


class _LoRA(nn.Module):
    def __init__(self, d: int, r: int = 8) -> None:
        super().__init__()
        self.base = nn.Linear(d, d).requires_grad_(False)
        self.a = nn.Parameter(torch.randn(r, d) / math.sqrt(d))
        self.b = nn.Parameter(torch.randn(d, r) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * 2.0


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.v = _LoRA(d), _LoRA(d)
        self.k, self.o = nn.Linear(d, d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        for m in (self.k, self.o, self.fc, self.proj, self.ln1, self.ln2):
            m.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        n = self.ln1(x)
        q, k, v = (m(n).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class LoRAGPT(nn.Module):
    """A LoRA GPT at small widths: frozen embeddings, tied head, LoRA on q and v."""

    def __init__(self, layers: int, d: int = 32, heads: int = 2, vocab: int = 97) -> None:
        super().__init__()
        self.vocab = vocab
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(64, d)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)
        self.wte.requires_grad_(False)
        self.wpe.requires_grad_(False)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d).requires_grad_(False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def _lm_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(idx).reshape(-1, model.vocab), idx.reshape(-1))


def _gradients(model: nn.Module, idx: torch.Tensor, compiled: bool, options: dict | None = None) -> dict:
    model = copy.deepcopy(model)
    run = torch.compile(model, backend="adreno", options=options or {}, dynamic=False) if compiled else model
    F.cross_entropy(run(idx).reshape(-1, model.vocab), idx.reshape(-1)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.double() - reference).norm() / reference.norm().clamp_min(1e-30))


@pytest.mark.device
@pytest.mark.parametrize("layers", [1, 2, 4, 6, pytest.param(3, marks=pytest.mark.slow),
                                    pytest.param(12, marks=pytest.mark.slow)])
def test_lora_transformer_gradients_follow_float64_and_reuse_changes_no_bit(layers: int) -> None:
    """Donating both saved views of a LayerNorm output would give the last block's q.a gradient
    ~0 with 2 layers and put block 0's adapters far off, while memory_reuse=False is right: every
    gradient follows float64, and reuse changes no bit. CI's depths: one block, two, and blocks
    whose buffers are reused across several others (4, 6); GPT-2's 12 and 3 are ``slow``."""
    torch.manual_seed(layers)
    model = LoRAGPT(layers)
    idx = torch.randint(0, model.vocab, (2, 16 if layers == 12 else 32))
    reference = _gradients(model.double(), idx, compiled=False)
    eager = _gradients(model.float(), idx, compiled=False)
    reused = _gradients(model, idx, compiled=True)
    alone = _gradients(model, idx, compiled=True, options={"memory_reuse": False})
    assert reused.keys() == reference.keys() == alone.keys() and len(reused) == 4 * layers
    for name, grad in reference.items():
        assert torch.equal(reused[name], alone[name]), f"{name}: memory reuse changed the gradient"
        eager_error = _relative_error(eager[name], grad)
        assert _relative_error(reused[name], grad) <= 2 * eager_error + 1e-5, name


@pytest.mark.device
def test_lora_training_step_follows_eager_per_parameter_over_many_steps() -> None:
    """TrainingStep (replayed from the third step) on the LoRA model: every adapter and its
    momentum buffer against eager after 12 steps, frozen weights untouched."""
    torch.manual_seed(0)
    model = LoRAGPT(2)
    reference = copy.deepcopy(model)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trained, lr=0.05, momentum=0.9)
    reference_opt = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    step = torch_adreno.TrainingStep(model, _lm_loss, opt)
    batches = [torch.randint(0, model.vocab, (2, 32)) for _ in range(12)]
    for idx in batches:
        loss = step(idx)
        reference_opt.zero_grad()
        expected = _lm_loss(reference, idx)
        expected.backward()
        reference_opt.step()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-4, atol=1e-5)
    assert step.replayed_steps >= 9
    step.synchronize()
    ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
    for name, p in theirs.items():
        if p.requires_grad:
            torch.testing.assert_close(ours[name], p, rtol=1e-4, atol=1e-6, msg=name)
            torch.testing.assert_close(opt.state[ours[name]]["momentum_buffer"],
                                       reference_opt.state[p]["momentum_buffer"], rtol=1e-3, atol=1e-6, msg=name)
        else:
            assert torch.equal(ours[name], frozen[name]), name
