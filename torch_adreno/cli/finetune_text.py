"""``finetune --task text``: LoRA adapters (peft) on a causal language model (transformers),
trained through a replayed ``TrainingStep`` on the bundled corpus or the user's text, saved in
peft's format (``save_pretrained``) so that ``peft.PeftModel.from_pretrained`` loads them.

Nothing is downloaded. The model is a checkpoint directory (``from_pretrained`` on a path: the
user's weights, config and tokenizer), a config JSON file or a built-in shape (random weights in
both). A model with random weights is saved beside the adapter (``OUT/base``) and named as the
adapter's base, since the adapter means nothing without the weights it was trained on."""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from torch_adreno.cli.arguments import backend_options
from torch_adreno.cli.finetune_steps import (
    TrainingLog,
    describe_device,
    loss_fell,
    train_steps,
    trainable_count,
)
from torch_adreno.data.text import ByteTokenizer, load_corpus
from torch_adreno.training.frozen import freeze
from torch_adreno.training.optimizers import make_optimizer
from torch_adreno.training.step import TrainingStep

INSTALL_HINT = "pip install 'transformers>=5.24' 'peft>=0.21'"

#: Built-in shapes, random weights: (model type, config values). tiny-random fits CI on a CPU
#: OpenCL device; the others are the shapes of GPT-2 124M and Qwen2.5-0.5B (the language-model workloads).
BUILTIN_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-random": ("gpt2", {"n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 256, "vocab_size": 256,
                             "bos_token_id": None, "eos_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                             "attn_pdrop": 0.0}),
    "gpt2-124m-random": ("gpt2", {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
                                  "vocab_size": 50257, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
    "qwen2.5-0.5b-random": ("qwen2", {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                                      "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                                      "max_position_embeddings": 32768, "tie_word_embeddings": True,
                                      "rms_norm_eps": 1e-6,
                                      "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}),
}

#: Share of the text's tokens held out for the loss measured before and after training.
HELD_OUT_SHARE = 0.1

#: Where the base model of an adapter trained on random weights goes, under ``--out``.
BASE_DIR = "base"


class FinetuneInputError(ValueError):
    """Input the command cannot train on: the message says what was wrong and what to do."""


def require_hf() -> tuple[ModuleType, ModuleType]:
    """transformers and peft, or a :class:`FinetuneInputError` naming the pip command."""
    modules = []
    for name in ("transformers", "peft"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as err:
            raise FinetuneInputError(f"finetune --task text needs transformers and peft, and {name} cannot be "
                                     f"imported ({err}); install them: {INSTALL_HINT}") from None
    return modules[0], modules[1]


@dataclass
class BaseModel:
    """The model to put adapters on; ``checkpoint``: the directory its weights came from (None:
    random weights)."""

    model: Any  # a transformers PreTrainedModel (transformers is imported only when the task runs)
    description: str
    checkpoint: Path | None


def load_base_model(spec: str, seed: int, transformers: ModuleType) -> BaseModel:
    """The causal LM ``spec`` names: a checkpoint directory, a config JSON file or a built-in shape."""
    path = Path(spec)
    if path.is_dir():
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path)
        except (OSError, ValueError, KeyError) as err:
            raise FinetuneInputError(f"--model {spec}: not a causal LM checkpoint transformers can load ({err}); "
                                     "a directory written by model.save_pretrained(DIR) is") from None
        return BaseModel(model, f"{type(model).__name__} from {path}", path.resolve())
    if path.suffix == ".json" and path.is_file():
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise FinetuneInputError(f"--model {spec}: not a readable JSON file ({err})") from None
        if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
            raise FinetuneInputError(f"--model {spec}: a config JSON needs a \"model_type\" (e.g. \"gpt2\", "
                                     "\"llama\", \"qwen2\"), as config.json of a checkpoint has")
        config = make_config(transformers, values.pop("model_type"), values, spec)
        return BaseModel(_random_model(transformers, config, seed, spec), f"random weights from {path}", None)
    if spec in BUILTIN_SHAPES:
        model_type, values = BUILTIN_SHAPES[spec]
        config = make_config(transformers, model_type, dict(values), spec)
        return BaseModel(_random_model(transformers, config, seed, spec), f"built-in shape {spec} (random weights)",
                         None)
    raise FinetuneInputError(
        f"--model {spec!r} is not a directory, a .json config file or a built-in shape ({', '.join(BUILTIN_SHAPES)}); "
        "nothing is downloaded: give a checkpoint directory (model.save_pretrained(DIR) with its tokenizer) or a "
        "config JSON file")


def make_config(transformers: ModuleType, model_type: str, values: dict[str, Any], spec: str) -> Any:
    """transformers' config of ``model_type`` with ``values`` (``spec``: what --model said, for errors)."""
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except (ValueError, TypeError) as err:
        raise FinetuneInputError(f"--model {spec}: transformers makes no config of model_type {model_type!r} "
                                 f"with these values ({err})") from None


def _random_model(transformers: ModuleType, config: Any, seed: int, spec: str) -> Any:
    torch.manual_seed(seed)  # the random weights repeat with the seed
    try:
        return transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        raise FinetuneInputError(f"--model {spec}: model_type {config.model_type!r} has no causal LM class "
                                 f"in transformers ({err})") from None


class Tokens:
    """A text as token ids, split into training and held-out ids (the last :data:`HELD_OUT_SHARE`),
    with a description of where they came from."""

    def __init__(self, ids: torch.Tensor, description: str, held_out: bool) -> None:
        cut = len(ids) - int(len(ids) * HELD_OUT_SHARE) if held_out else len(ids)
        self.train, self.held_out, self.description = ids[:cut], ids[cut:], description


def tokenize(settings: argparse.Namespace, base: BaseModel, transformers: ModuleType) -> Tokens:
    """The training text's ids under the tokenizer ``--tokenizer`` names, checked against the
    model's vocabulary and ``--seq``."""
    kind = settings.tokenizer or ("model" if base.checkpoint is not None else "bytes")
    text = load_corpus().decode("utf-8") if settings.text is None else _read_text(settings.text)
    source = "the bundled Shakespeare" if settings.text is None else str(settings.text)
    encode: Callable[[str], torch.Tensor]
    if kind == "bytes":
        encode = ByteTokenizer().encode
    elif base.checkpoint is None:
        raise FinetuneInputError("--tokenizer model needs a checkpoint directory with a tokenizer as --model; "
                                 "a config or a built-in shape has none (use --tokenizer bytes)")
    else:
        encode = _checkpoint_tokenizer(base.checkpoint, transformers)
    ids = encode(text)
    vocabulary = base.model.get_input_embeddings().num_embeddings
    if len(ids) and int(ids.max()) >= vocabulary:
        raise FinetuneInputError(f"token id {int(ids.max())} of the {kind} tokenizer is outside the model's "
                                 f"vocabulary of {vocabulary}: give a model with vocab_size >= "
                                 f"{int(ids.max()) + 1}" + (" (bytes need 256)" if kind == "bytes" else ""))
    positions = getattr(base.model.config, "max_position_embeddings", None)
    if positions is not None and settings.seq > positions:
        raise FinetuneInputError(f"--seq {settings.seq} is longer than the model's {positions} positions "
                                 f"(max_position_embeddings); pass --seq {positions} or less")
    what = "byte tokens" if kind == "bytes" else "tokens of the checkpoint's tokenizer"
    tokens = Tokens(ids, f"{source} ({len(text):,} characters) as {len(ids):,} {what}", settings.eval_batches > 0)
    for name, part in (("training", tokens.train), ("held-out", tokens.held_out if settings.eval_batches else None)):
        if part is not None and len(part) < settings.seq:
            raise FinetuneInputError(f"the {name} part of the text has {len(part)} tokens, fewer than --seq "
                                     f"{settings.seq}; give a longer --text or a smaller --seq")
    return tokens


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FinetuneInputError(f"--text {path}: not a readable UTF-8 text file ({err})") from None


def _checkpoint_tokenizer(path: Path, transformers: ModuleType) -> Callable[[str], torch.Tensor]:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise FinetuneInputError(f"--model {path} has no tokenizer transformers can load ({err}); save one there "
                                 "(tokenizer.save_pretrained(DIR)) or pass --tokenizer bytes") from None

    def encode(text: str) -> torch.Tensor:
        # The whole text at once: longer than the model's positions, which is what the warning
        # transformers would print says; the sequences cut from it are --seq long.
        return torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.int64)

    return encode


def add_adapters(model: Any, settings: argparse.Namespace, peft: ModuleType) -> Any:
    """``model`` with LoRA adapters (peft) on ``--lora-modules`` (peft's default for the model type)."""
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha or 2 * settings.rank, lora_dropout=0.0,
                             target_modules=settings.lora_modules, task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():
            # GPT-2's Conv1D stores weights transposed; peft sets fan_in_fan_out for it and says so.
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")
            # peft 0.21 asks transformers 5 a deprecated question; nothing the user can change.
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
            return peft.get_peft_model(model, config)
    except ValueError as err:
        raise FinetuneInputError(f"no LoRA adapters for this model ({err}); name the modules that get them with "
                                 "--lora-modules NAME ...") from None


def sequence_batch(ids: torch.Tensor, seq: int, batch: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` sequences of ``seq`` consecutive ids, each from a random offset."""
    starts = torch.randint(0, len(ids) - seq + 1, (batch, 1), generator=generator)
    return ids[starts + torch.arange(seq)]


def held_out_batches(ids: torch.Tensor, seq: int, batch: int, count: int) -> list[torch.Tensor]:
    """``count`` batches of sequences at evenly spaced offsets of the held-out ids (the same every run)."""
    starts = torch.linspace(0, len(ids) - seq, count * batch).long().view(count, batch, 1)
    return [ids[s + torch.arange(seq)] for s in starts]


def causal_lm_loss(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (transformers shifts the labels)."""
    return model(input_ids=input_ids, labels=input_ids, use_cache=False).loss


def loss_function(base_dtype: str) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """:func:`causal_lm_loss`, under autocast to ``base_dtype`` unless it is float32 (weights that
    torch_adreno.freeze stored in 16 bits are read only there)."""
    if base_dtype == "float32":
        return causal_lm_loss
    dtype = getattr(torch, base_dtype)

    def autocast_loss(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=dtype):
            return causal_lm_loss(model, input_ids)

    return autocast_loss


def host_loss(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
              batches: list[torch.Tensor]) -> float:
    """Mean of ``loss_fn`` over ``batches``, eager PyTorch on the host in eval mode (no dropout)."""
    model.eval()
    with torch.no_grad():
        loss = statistics.fmean(loss_fn(model, x).item() for x in batches)
    model.train()
    return loss


def run(settings: argparse.Namespace) -> int:
    """The text task: load, add adapters, train, save; 0 when the loss fell."""
    try:
        transformers, peft = require_hf()
        transformers.utils.logging.disable_progress_bar()  # weight loading and saving bars, not ours
        base = load_base_model(settings.model, settings.seed, transformers)
        tokens = tokenize(settings, base, transformers)
        # The base's own tensors (not copies; the adapters leave them as they are), by their names
        # before peft wraps the modules that get adapters.
        base_state = base.model.state_dict()
        model = add_adapters(base.model, settings, peft)
    except FinetuneInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    base_dir = base.checkpoint
    if base_dir is None:  # random weights: kept beside the adapter, as its base
        base_dir = (settings.out / BASE_DIR).resolve()
        base.model.save_pretrained(base_dir, state_dict=dict(base_state))  # (it empties the dict it gets)
    if getattr(base.model, "loss_type", "") is None:
        # What transformers picks for a causal LM anyway, without its warning that it picked it.
        base.model.loss_type = "ForCausalLM"
    if settings.base_dtype != "float32":  # after the base was saved: it keeps its own float32 weights
        frozen = freeze(model, getattr(torch, settings.base_dtype))
        print(f"base weights: {len(frozen.converted)} frozen tensors stored as {settings.base_dtype}, "
              f"{frozen.bytes_before / 2**20:,.1f} -> {frozen.bytes_after / 2**20:,.1f} MiB of frozen parameters")
    loss_fn = loss_function(settings.base_dtype)
    trainable, total = trainable_count(model)
    modules = sorted(model.peft_config["default"].target_modules)
    print(f"model: {base.description}: {total:,} parameters; LoRA r={settings.rank} on {', '.join(modules)}: "
          f"{trainable:,} trainable")
    print(f"text: {tokens.description}: {len(tokens.train):,} for training, {len(tokens.held_out):,} held out")
    print(f"device: {describe_device(settings)}")

    evaluation = held_out_batches(tokens.held_out, settings.seq, settings.batch, settings.eval_batches)
    before = host_loss(model, loss_fn, evaluation) if evaluation else None
    log = train(model, loss_fn, tokens.train, settings)
    after = host_loss(model, loss_fn, evaluation) if evaluation else None

    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    model.save_pretrained(settings.out)
    for line in log.summary(settings.batch * settings.seq, "tok"):
        print(line)
    if before is not None and after is not None:
        print(f"held-out loss: {before:.4f} -> {after:.4f} ({len(evaluation)} batches of {settings.batch}x"
              f"{settings.seq} tokens, eager on the host, before and after training)")
    write_summary(settings, log, before, after, base_dir)
    print(f"adapter: {settings.out} (peft format; base model: {base_dir}); load it with "
          f"peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained({str(base_dir)!r}), "
          f"{str(settings.out)!r})")
    if before is not None and after is not None:
        return 0 if loss_fell(before, after, "held-out loss") else 1
    return 0 if loss_fell(log.first_loss, log.last_loss, "training loss") else 1


def train(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
          ids: torch.Tensor, settings: argparse.Namespace) -> TrainingLog:
    """``--steps`` steps of random sequences of ``ids`` through one ``TrainingStep``."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(settings.optimizer, trainable, lr=settings.lr)
    generator = torch.Generator().manual_seed(settings.seed)
    step = TrainingStep(model, loss_fn, optimizer, backend_options(settings, settings.target), replay=not settings.no_replay)
    try:
        return train_steps(step, lambda _: (sequence_batch(ids, settings.seq, settings.batch, generator),),
                           settings.steps, settings.batch * settings.seq, "tok", "finetune")
    finally:
        step.close()  # host copies of the adapters current, for the held-out loss and the save


def write_summary(settings: argparse.Namespace, log: TrainingLog, before: float | None, after: float | None,
                  base_dir: Path) -> None:
    """``finetune.json`` in ``--out``: the run's settings and what it measured."""
    steady = log.steady_seconds
    summary = {
        "task": "text", "model": settings.model, "base_model": str(base_dir), "target": settings.target,
        "steps": settings.steps, "batch": settings.batch, "seq": settings.seq, "rank": settings.rank,
        "lr": settings.lr, "optimizer": settings.optimizer, "losses": log.losses, "step_seconds": log.seconds,
        "base_dtype": settings.base_dtype, "replayed_steps": log.replayed,
        "device_footprint_bytes": None if log.footprint is None else log.footprint.total_bytes,
        "largest_allocation_bytes": None if log.footprint is None else log.footprint.largest_allocation_bytes,
        "held_out_loss_before": before, "held_out_loss_after": after,
        "tokens_per_second": settings.batch * settings.seq / statistics.median(steady) if steady else None,
    }
    (settings.out / "finetune.json").write_text(json.dumps(summary, indent=1) + "\n")
