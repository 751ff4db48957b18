"""The memory limits at full size: with ``target="adreno740"``, MobileNetV2 at 224x224 batch 32,
GPT-2-124M LoRA at seq 512 batch 4 with a float16 base, and Qwen2.5-0.5B's shapes with LoRA on q
and v at seq 256 batch 4 (float16 base) train through ``TrainingStep`` with no ``cl.Buffer`` or
image over the profile's largest allocation (1 GiB) and a device footprint within its global memory.

The full sizes take minutes on a GPU and far longer on a CPU: they are marked ``slow``. Unmarked:
the tiny Qwen2 (the same modules, two layers, a small vocabulary) under a copy of adreno740 whose
largest allocation its step's arena exceeds (the arena must split, every buffer within the limit,
the footprint within the global memory), its logits against transformers' ``Qwen2ForCausalLM``
with the same weights, and its forward and LoRA gradients through
``torch.compile(backend="adreno")`` against eager by the float64 rule of test_graph_accuracy.
``benchmarks/allocation_limits.py`` runs and reports the same workloads.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import LaunchProfile, assert_ran_on_device
from test_allocation_limits import allocations, derived_target  # noqa: F401  (fixtures)
from test_graph_accuracy import FLOOR

import torch_adreno
from torch_adreno.models import gpt2_lora, mobilenet_v2, qwen2_lora
from torch_adreno.targets import profiles

#: (model, the parameters it trains, one batch, the loss function).
Workload = tuple[torch.nn.Module, list[torch.nn.Parameter], tuple[torch.Tensor, ...], Callable[..., torch.Tensor]]


def _frozen_fp16(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> Workload:
    """A LoRA model with its base stored in float16 (``torch_adreno.freeze``), the loss under autocast."""
    torch_adreno.freeze(model, torch.float16)

    def loss_fn(m: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return gpt2_lora.lm_loss(m, tokens, targets)

    return model, gpt2_lora.trainable_parameters(model), batch, loss_fn


def _mobilenet_v2() -> Workload:
    """Every layer trained (BatchNorm in train mode): transfer learning's frozen backbone keeps
    fewer activations, no gradients and no momentum for it, so this is the larger footprint."""
    torch.manual_seed(0)
    model = mobilenet_v2(1000, dropout=0.0).train()
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(32, 3, 224, 224, generator=generator), torch.randint(0, 1000, (32,), generator=generator))
    return model, list(model.parameters()), batch, lambda m, x, y: F.cross_entropy(m(x), y)


def _gpt2_lora() -> Workload:
    cfg = dataclasses.replace(gpt2_lora.FULL, seq=512, batch=4)
    torch.manual_seed(0)
    return _frozen_fp16(gpt2_lora.gpt2_lora(cfg), gpt2_lora.token_batch(cfg, torch.Generator().manual_seed(1)))


def _qwen2_lora(cfg: qwen2_lora.Qwen2Config = qwen2_lora.FULL) -> Workload:
    torch.manual_seed(0)
    return _frozen_fp16(qwen2_lora.qwen2_lora(cfg), qwen2_lora.token_batch(cfg, torch.Generator().manual_seed(1)))


def _train_recorded(workload: Workload, target: str, made: dict[str, list[int]], steps: int = 3,
                    **options: Any) -> Any:
    """Compile, capture and replay ``workload``'s step for ``target``; every buffer and image made
    meanwhile is in ``made`` (the ``allocations`` fixture). Returns the step and its losses."""
    model, trainable, batch, loss_fn = workload
    optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)
    step = torch_adreno.TrainingStep(model, loss_fn, optimizer, options={"target": target, **options})
    losses = torch.stack([step(*batch).detach().float() for _ in range(steps)])
    assert step.replayed_steps == steps - 2, "the step was not replayed"
    assert torch.isfinite(losses).all(), losses
    return step, losses


def _assert_within(step: Any, made: dict[str, list[int]], target: str) -> None:
    """No buffer or image made above the profile's largest allocation; the footprint within its
    global memory (the limits the step was held to are the profile's, or the present device's where
    they are smaller: PoCL reports part of the host's memory, 5.4 GB of 24 GiB on one CI machine,
    below adreno740's 5.8 GB)."""
    profile = profiles.compile_profile(step._residency.runtime.profile, profiles.get_target(target))
    limits = step.memory_limits
    assert (limits.max_allocation_bytes, limits.global_memory_bytes) == (profile.max_alloc_bytes,
                                                                         profile.global_mem_bytes)
    assert made["buffers"], "no cl.Buffer was recorded"
    largest = max(made["buffers"] + made["images"])
    assert largest <= profile.max_alloc_bytes, f"an allocation of {largest:,} bytes > {profile.max_alloc_bytes:,}"
    footprint = step.device_footprint
    assert footprint is not None and footprint.fits, footprint
    assert footprint.largest_allocation_bytes <= profile.max_alloc_bytes
    assert max(footprint.arena_buffers) <= profile.max_alloc_bytes
    assert footprint.total_bytes <= profile.global_mem_bytes, footprint.describe()


FULL_SIZE = {"mobilenet_v2_224_b32": _mobilenet_v2, "gpt2_lora_seq512_b4_fp16": _gpt2_lora,
             "qwen2_lora_seq256_b4_fp16": _qwen2_lora}


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("workload", list(FULL_SIZE))
def test_full_size_workload_trains_within_adreno740s_allocation_and_global_memory(workload, allocations):  # noqa: F811
    step, _ = _train_recorded(FULL_SIZE[workload](), "adreno740", allocations)
    _assert_within(step, allocations, "adreno740")
    step.close()


# -- unmarked: the tiny Qwen2 -----------------------------------------------------------------------

#: The reduced profile's largest allocation: the one-layer tiny model's largest tensors (its token
#: table in float16, the float32 logits and their gradient: 32 KiB each) fit, its step's arena
#: (about 88 KiB) does not.
TINY_LIMIT = 40 << 10


@pytest.mark.device
def test_tiny_qwen2_step_splits_its_arena_within_a_reduced_adreno740(derived_target, allocations):  # noqa: F811
    small = derived_target("adreno740_40k", max_alloc_bytes=TINY_LIMIT)
    # Kernels bound to the arena's buffers as compiled (no arena-offset rebuild of every kernel: 10 s
    # of PoCL's time here); test_allocation_limits.py splits with the default arena kernels.
    step, _ = _train_recorded(_qwen2_lora(dataclasses.replace(qwen2_lora.TINY, layers=1)), small, allocations,
                              replay_arena_kernels=False)
    _assert_within(step, allocations, small)
    arena = step.replay.arena
    assert len(arena.parts) > 1 and max(arena.parts) <= TINY_LIMIT, arena.parts  # split, each part within
    assert step.device_footprint.arena_buffers == arena.parts
    step.close()


def _with_random_adapters(cfg: qwen2_lora.Qwen2Config) -> qwen2_lora.Qwen2LoRA:
    """The model with every adapter's ``B`` random: LoRA's zero ``B`` would make ``A``'s gradients
    zero and the adapters' share of the logits nothing, which any backend computes exactly."""
    torch.manual_seed(0)
    model = qwen2_lora.qwen2_lora(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".B.weight"):
                p.normal_(0.0, 0.05)
    return model


def test_tiny_qwen2_computes_transformers_qwen2_logits_with_the_same_weights():
    """The plain-torch model is Qwen2: its base state dict loads into transformers'
    ``Qwen2ForCausalLM`` name for name, and both give the same logits (adapters zero)."""
    transformers = pytest.importorskip("transformers")
    cfg = qwen2_lora.TINY
    torch.manual_seed(0)
    ours = qwen2_lora.qwen2_lora(cfg).eval()
    theirs = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        hidden_size=cfg.d, intermediate_size=cfg.intermediate, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, vocab_size=cfg.vocab,
        max_position_embeddings=cfg.positions, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=True)).eval()
    base = {name: value for name, value in ours.state_dict().items() if ".lora_" not in name}
    result = theirs.load_state_dict(base, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    tokens, _ = qwen2_lora.token_batch(cfg, torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)
    assert qwen2_lora.base_parameter_count() == 494_032_768  # Qwen2.5-0.5B's published count


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(((a.double() - b.double()) ** 2).mean().item())


@pytest.mark.device
def test_tiny_qwen2_forward_and_lora_gradients_through_torch_compile_follow_float64():
    """``torch.compile(model, backend="adreno")``: the logits and every adapter's gradient at most
    twice eager float32's RMSE from a float64 run (plus four float32 ulps of their RMS), the
    grouped-query attention in the fused kernels."""
    cfg = dataclasses.replace(qwen2_lora.TINY, layers=1)
    model = _with_random_adapters(cfg)
    tokens, targets = qwen2_lora.token_batch(cfg, torch.Generator().manual_seed(3))

    def run(m: torch.nn.Module, call: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = call(tokens)
        F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1)).backward()
        return {"logits": logits.detach(), **{n: p.grad.detach().clone() for n, p in m.named_parameters()
                                              if p.requires_grad}}

    eager_model, exact_model = copy.deepcopy(model), copy.deepcopy(model).double()
    eager, exact = run(eager_model, eager_model), run(exact_model, exact_model)
    compiled = torch.compile(model, backend="adreno", options={"compile_cache": False}, dynamic=False)
    with LaunchProfile() as prof:
        ours = run(model, compiled)
    assert_ran_on_device(prof, ["forward", "backward"])
    assert any(k.kind == "attention" for k in prof.launched), "the attention did not run in the fused kernels"
    assert len(exact) == 1 + 4 * cfg.layers  # the logits, and A and B of each layer's two adapters
    worse = [f"{name}: RMSE from float64 {_rmse(ours[name], x):.3g}, eager float32's {_rmse(eager[name], x):.3g}"
             for name, x in exact.items()
             if _rmse(ours[name], x) > 2 * _rmse(eager[name], x) + FLOOR * math.sqrt((x ** 2).mean().item())]
    assert not worse, "\n".join(worse)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
