"""Hugging Face models as users write them: GPT-2, Llama and Qwen2 (grouped-query
attention: 4 query heads, 2 key-value heads) causal LMs and BERT sequence classification, with
LoRA adapters from peft, trained through ``TrainingStep`` and through ``torch.compile``.

What they need beyond plain layers: ``model(input_ids=x, labels=y).loss`` calls
``logger.warning_once`` inside transformers' loss function, which Dynamo refuses under
``fullgraph=True`` (the backend makes logger calls no-ops in its own traces:
``torch_adreno.torch_patches``); every causal LM's key-value cache starts from
``torch.tensor([])``, a tensor constant of the FX graph (constants are data the graph carries:
``ir.Graph.constants``); and ``scaled_dot_product_attention(..., enable_gqa=True)``.

Judged as ``test_graph_accuracy.py`` judges the reference models: every output of every compiled
graph (activations saved for the backward, the LoRA gradients) against the same FX graph run
eagerly in float32 and in float64, RMSE at most twice eager float32's plus a floor; then the
trainable parameters after the steps (the last one replayed) against eager float32 and float64
training by the same rule; frozen weights bit for bit untouched.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_ran_on_device
from test_graph_accuracy import FLOOR, GraphAccuracy

import torch_adreno
from torch_adreno.frontend import pipeline

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.device

VOCAB, SEQ, BATCH, LABELS = 48, 8, 2, 3
LR = 0.5
#: As in test_graph_accuracy: the compile cache would hand back graphs compiled without the
#: checking wrapper.
OPTIONS = {"compile_cache": False}


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _lora(transformers.GPT2LMHeadModel(config), ["c_attn"])


def _decoder_config(config_class: Any) -> Any:
    return config_class(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=16)


def _llama() -> torch.nn.Module:
    return _lora(transformers.LlamaForCausalLM(_decoder_config(transformers.LlamaConfig)), ["q_proj", "v_proj"])


def _qwen2() -> torch.nn.Module:
    return _lora(transformers.Qwen2ForCausalLM(_decoder_config(transformers.Qwen2Config)), ["q_proj", "v_proj"])


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                     vocab_size=VOCAB, max_position_embeddings=16, num_labels=LABELS,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return _lora(transformers.BertForSequenceClassification(config), ["query", "value"])


def _lora(model: torch.nn.Module, targets: list[str]) -> torch.nn.Module:
    # init_lora_weights=False: A and B both random (peft's default B = 0 would make A's first
    # gradients zero, which any backend computes exactly).
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)
    return peft.get_peft_model(model, config)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {"gpt2": _gpt2, "llama": _llama, "qwen2": _qwen2, "bert": _bert}


def _labels_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y).loss


def _logits_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    if logits.dim() == 2:  # sequence classification
        return F.cross_entropy(logits, y)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))


LOSSES = {"labels": _labels_loss, "logits": _logits_loss}


def _batches(model_name: str, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
        y = (torch.randint(0, LABELS, (BATCH,), generator=generator) if model_name == "bert"
             else torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator))
        batches.append((x, y))
    return batches


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def _eager_training(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batches: list[Any],
                    dtype: torch.dtype) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model).to(dtype)
    params = _trainable(model)
    opt = torch.optim.SGD(params.values(), lr=LR)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x, y).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in params.items()}


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(((a.double() - b.double()) ** 2).mean().item())


def _rms(a: torch.Tensor) -> float:
    return math.sqrt((a.double() ** 2).mean().item())


def _worse_than_eager(ours: dict[str, torch.Tensor], eager: dict[str, torch.Tensor],
                      exact: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> list[str]:
    """Tensors of ``ours`` further from ``exact`` (float64) than twice eager float32's distance,
    plus a floor of four float32 ulps of the tensor and of its change from ``start``."""
    worse = []
    for name, x in exact.items():
        floor = FLOOR * (_rms(x) + _rms(x - start[name].double()))
        if _rmse(ours[name], x) > 2 * _rmse(eager[name], x) + floor:
            worse.append(f"{name}: RMSE from float64 {_rmse(ours[name], x):.3g}, eager float32's "
                         f"{_rmse(eager[name], x):.3g} (RMS {_rms(x):.3g})")
    return worse


def _graph_accuracy_failures(accuracy: GraphAccuracy) -> list[str]:
    return [f"{graph} {output}: RMSE from float64 {ours:.3g}, eager float32's {eager:.3g} (RMS {rms:.3g})"
            for graph, output, ours, eager, rms in accuracy.records if ours > 2 * eager + FLOOR * rms]


#: (model, loss, steps): three steps run the compiled graphs twice (the second captures them) and
#: replay the third; two (no replay: it is bit-identical to the compiled graphs, test_replay.py)
#: spare PoCL a second build of every kernel where the model adds nothing to what replays.
CASES = [
    pytest.param("gpt2", "labels", 3, id="gpt2-labels"),
    pytest.param("gpt2", "logits", 3, id="gpt2-logits", marks=pytest.mark.slow),
    pytest.param("llama", "labels", 3, id="llama-labels"),
    pytest.param("llama", "logits", 3, id="llama-logits", marks=pytest.mark.slow),
    pytest.param("qwen2", "logits", 2, id="qwen2-logits"),
    pytest.param("qwen2", "labels", 3, id="qwen2-labels", marks=pytest.mark.slow),
    pytest.param("bert", "labels", 2, id="bert-labels"),
    pytest.param("bert", "logits", 3, id="bert-logits", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("model_name", "loss_name", "steps"), CASES)
def test_lora_trains_through_the_training_step_like_eager(model_name, loss_name, steps, monkeypatch):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    loss_fn = LOSSES[loss_name]
    batches = _batches(model_name, steps)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert _trainable(model) and frozen
    eager = _eager_training(model, loss_fn, batches, torch.float32)
    exact = _eager_training(model, loss_fn, batches, torch.float64)

    accuracy = GraphAccuracy()
    monkeypatch.setattr(pipeline, "compile_graph", accuracy.compile_graph(pipeline.compile_graph))
    step = torch_adreno.TrainingStep(model, loss_fn, torch.optim.SGD(_trainable(model).values(), lr=LR), OPTIONS,
                                     replay=steps > 2)
    with torch_adreno.profile() as prof:
        losses = [step(x, y) for x, y in batches]
    step.synchronize()

    # Steps 1 and 2 ran the compiled graphs (with replay on, the second captured them); a third replayed.
    assert step.replayed_steps == prof.replayed_steps == steps - 2
    assert_ran_on_device(prof, ["forward", "backward"])
    assert all(torch.isfinite(loss) for loss in losses)
    graphs = {r[0] for r in accuracy.records}
    assert any(g.startswith("forward") for g in graphs) and any(g.startswith("backward") for g in graphs), graphs
    worse = _graph_accuracy_failures(accuracy)
    assert not worse, "\n".join(worse)
    assert not accuracy.unexplained, "\n".join(accuracy.unexplained)

    params = dict(model.named_parameters())
    worse = _worse_than_eager({n: params[n].detach() for n in exact}, eager, exact, start)
    assert not worse, "\n".join(worse)
    changed = [name for name in exact if not torch.equal(params[name], start[name])]
    assert changed == list(exact), "some trainable parameters were not updated"
    touched = [name for name in frozen if not torch.equal(params[name], start[name])]
    assert not touched, f"frozen weights changed: {touched[:5]}"


@pytest.mark.parametrize("model_name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_lora_gradients_through_torch_compile_follow_float64(model_name):
    """The plain loop (torch.compile of the model, loss and backward by the user): each trainable
    parameter's gradient within twice eager float32's distance from float64."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    (x, y), = _batches(model_name, 1)

    def gradients(m: torch.nn.Module, call: Callable[..., Any]) -> dict[str, torch.Tensor]:
        _labels_loss(call, x, y).backward()
        return {name: p.grad.detach().clone() for name, p in _trainable(m).items()}

    eager_model, exact_model = copy.deepcopy(model), copy.deepcopy(model).double()
    eager = gradients(eager_model, eager_model)
    exact = gradients(exact_model, exact_model)
    compiled = torch.compile(model, backend="adreno", options=OPTIONS, dynamic=False)
    with torch_adreno.profile() as prof:
        ours = gradients(model, compiled)
    assert_ran_on_device(prof, ["forward", "backward"])
    zero = {name: torch.zeros_like(g) for name, g in exact.items()}
    worse = _worse_than_eager(ours, eager, exact, zero)
    assert not worse, "\n".join(worse)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in frozen)
