"""The model zoo: tiny random configurations of ``transformers`` architectures, as data.

Each :class:`ZooModel` names a ``transformers`` model class and the configuration that makes it
tiny (one or two layers, hidden size 32, 4 heads, a vocabulary of 64, 8 tokens, 16x16 or 32x32
images), with every dropout, drop-path, layer-drop and SpecAugment probability 0, so that a
training step is deterministic and eager PyTorch is a reference for it. Nothing is downloaded:
the weights are random, seeded. Sizes are shared where the architectures allow (hidden 32,
intermediate 64, head dimension 8), so that kernels compiled for one model serve the next.

The vision entries are ``transformers``' implementations of the families torchvision also has
(ResNet, MobileNetV2, EfficientNet, ConvNeXt, RegNet, ViT) at small widths: torchvision itself
cannot be installed beside the CPU build of PyTorch this package is tested with.

:mod:`torch_adreno.tools.testing.zoo_runner` trains each entry with a ``TrainingStep`` against
eager PyTorch; ``python -m torch_adreno zoo`` prints the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

#: Shared sizes (see the module docstring).
VOCAB, SEQ, BATCH, LABELS = 64, 8, 2, 3
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 32, 64, 4, 2, 8

#: The families, in the order the table lists them.
FAMILIES = ("causal LM", "encoder", "seq2seq", "speech", "vision")

#: What a batch holds and how the loss is called: ``model(**{input_name: x}, labels=y).loss``.
#: tokens: ids (BATCH, SEQ), labels the same ids (causal LM) or target ids (seq2seq);
#: classify: ids (BATCH, SEQ), labels (BATCH,); image: pixels (BATCH, 3, side, side), labels
#: (BATCH,); audio: a waveform (BATCH, samples), labels (BATCH,); features: log-mel features
#: (BATCH, mel bins, frames), target ids (BATCH, SEQ).
INPUTS = ("tokens", "classify", "image", "audio", "features")


def _frozen(**values: Any) -> Mapping[str, Any]:
    return MappingProxyType(values)


@dataclass(frozen=True)
class ZooModel:
    """One architecture: ``transformers.<model_class>(transformers.<config_class>(**config))``.

    ``inputs``: one of :data:`INPUTS`; ``shape``: the input's shape after the batch dimension
    (image: channels, side, side; audio: samples; features: mel bins, frames); ``optimizer``:
    "adamw" (lr 1e-3, weight decay 0.01) or "sgd" (lr 0.01, momentum 0.9)."""

    name: str
    family: str
    model_class: str
    config_class: str
    config: Mapping[str, Any]
    inputs: str = "tokens"
    shape: tuple[int, ...] = (SEQ,)
    optimizer: str = "adamw"
    #: Set every BatchNorm's weight to 1 after building: transformers initializes the BatchNorm
    #: weights of some vision models like linear weights (normal, std 0.02; their pretrained weights
    #: replace them), and from random weights the activations then vanish stage by stage, leaving
    #: gradients of rounding noise to compare.
    unit_batch_norms: bool = False
    input_name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or self.inputs not in INPUTS or self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"zoo entry {self.name}: family {self.family!r}, inputs {self.inputs!r} or optimizer "
                             f"{self.optimizer!r} is not one of {FAMILIES}, {INPUTS}, ('adamw', 'sgd')")
        names = {"tokens": "input_ids", "classify": "input_ids", "image": "pixel_values", "audio": "input_values",
                 "features": "input_features"}
        object.__setattr__(self, "input_name", names[self.inputs])

    def build(self) -> torch.nn.Module:
        """The model with random weights (seeded by the caller), in training mode."""
        import transformers

        config = getattr(transformers, self.config_class)(**self.config)
        model = getattr(transformers, self.model_class)(config).train()
        if self.unit_batch_norms:
            with torch.no_grad():
                for module in model.modules():
                    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                        module.weight.fill_(1.0)
        return model

    def batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch ``(input, labels)`` drawn from ``generator``."""
        if self.inputs in ("tokens", "classify"):
            x = torch.randint(0, VOCAB, (BATCH, *self.shape), generator=generator)
        else:
            x = torch.randn((BATCH, *self.shape), generator=generator)
        if self.inputs == "tokens":
            y = x.clone() if self.family == "causal LM" else torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
        elif self.inputs == "features":
            y = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
        else:
            y = torch.randint(0, LABELS, (BATCH,), generator=generator)
        return x, y


def zoo_loss(entry: ZooModel) -> Any:
    """``loss_fn(model, x, y)`` of ``entry``: the model's own loss of its labels."""
    name = entry.input_name

    def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model(**{name: x}, labels=y).loss

    return loss_fn


_DECODER = _frozen(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1,
                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                   max_position_embeddings=16, attention_dropout=0.0)


def _decoder(**overrides: Any) -> Mapping[str, Any]:
    """The Llama-style decoder's sizes (grouped-query attention: 4 query heads, 2 key-value heads)."""
    return _frozen(**{**_DECODER, **overrides})


_ENCODER = _frozen(hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS,
                   intermediate_size=INTERMEDIATE, vocab_size=VOCAB, max_position_embeddings=16,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=LABELS)


def _encoder(**overrides: Any) -> Mapping[str, Any]:
    return _frozen(**{**_ENCODER, **overrides})


_VIT = _frozen(image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=1,
               num_attention_heads=HEADS, intermediate_size=INTERMEDIATE, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, num_labels=LABELS)

_SMALL_IMAGE, _IMAGE = (3, 16, 16), (3, 32, 32)

ZOO: tuple[ZooModel, ...] = (
    # -- causal language models --------------------------------------------------------------
    ZooModel("gpt2", "causal LM", "GPT2LMHeadModel", "GPT2Config", _frozen(
        n_layer=1, n_embd=HIDDEN, n_head=HEADS, n_positions=16, vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)),
    ZooModel("llama", "causal LM", "LlamaForCausalLM", "LlamaConfig", _decoder()),
    ZooModel("qwen2", "causal LM", "Qwen2ForCausalLM", "Qwen2Config", _decoder()),
    ZooModel("qwen3", "causal LM", "Qwen3ForCausalLM", "Qwen3Config", _decoder(head_dim=HEAD_DIM)),
    ZooModel("mistral", "causal LM", "MistralForCausalLM", "MistralConfig", _decoder(sliding_window=4)),
    ZooModel("gemma", "causal LM", "GemmaForCausalLM", "GemmaConfig", _decoder(head_dim=HEAD_DIM)),
    ZooModel("gemma2", "causal LM", "Gemma2ForCausalLM", "Gemma2Config", _decoder(
        head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, sliding_window=4, num_hidden_layers=2)),
    ZooModel("gemma3", "causal LM", "Gemma3ForCausalLM", "Gemma3TextConfig", _decoder(
        head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, sliding_window=4, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"])),
    ZooModel("phi", "causal LM", "PhiForCausalLM", "PhiConfig", _decoder(
        resid_pdrop=0.0, embd_pdrop=0.0, num_key_value_heads=HEADS)),
    ZooModel("phi3", "causal LM", "Phi3ForCausalLM", "Phi3Config", _decoder(
        resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    ZooModel("opt", "causal LM", "OPTForCausalLM", "OPTConfig", _frozen(
        hidden_size=HIDDEN, ffn_dim=INTERMEDIATE, num_hidden_layers=1, num_attention_heads=HEADS,
        word_embed_proj_dim=HIDDEN, vocab_size=VOCAB, max_position_embeddings=16, dropout=0.0, attention_dropout=0.0,
        layerdrop=0.0)),
    ZooModel("gpt_neox", "causal LM", "GPTNeoXForCausalLM", "GPTNeoXConfig", _frozen(
        hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=1, num_attention_heads=HEADS,
        vocab_size=VOCAB, max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)),
    ZooModel("gptj", "causal LM", "GPTJForCausalLM", "GPTJConfig", _frozen(
        n_embd=HIDDEN, n_layer=1, n_head=HEADS, rotary_dim=4, n_positions=16, vocab_size=VOCAB, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)),
    ZooModel("gpt_neo", "causal LM", "GPTNeoForCausalLM", "GPTNeoConfig", _frozen(
        hidden_size=HIDDEN, num_layers=2, num_heads=HEADS, attention_types=[[["global", "local"], 1]], window_size=4,
        vocab_size=VOCAB, max_position_embeddings=16, embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0,
        bos_token_id=1, eos_token_id=2)),
    ZooModel("bloom", "causal LM", "BloomForCausalLM", "BloomConfig", _frozen(
        hidden_size=HIDDEN, n_layer=1, n_head=HEADS, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0)),
    ZooModel("falcon", "causal LM", "FalconForCausalLM", "FalconConfig", _frozen(
        hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS, vocab_size=VOCAB,
        hidden_dropout=0.0, attention_dropout=0.0)),
    ZooModel("stablelm", "causal LM", "StableLmForCausalLM", "StableLmConfig", _decoder(hidden_dropout=0.0)),
    ZooModel("olmo", "causal LM", "OlmoForCausalLM", "OlmoConfig", _decoder(
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    ZooModel("mixtral", "causal LM", "MixtralForCausalLM", "MixtralConfig", _decoder(
        num_local_experts=4, num_experts_per_tok=2)),
    ZooModel("qwen2_moe", "causal LM", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", _decoder(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=INTERMEDIATE // 2,
        shared_expert_intermediate_size=INTERMEDIATE // 2)),
    # -- encoders (sequence classification) -----------------------------------------------------
    ZooModel("bert", "encoder", "BertForSequenceClassification", "BertConfig", _encoder(), "classify"),
    ZooModel("roberta", "encoder", "RobertaForSequenceClassification", "RobertaConfig", _encoder(
        max_position_embeddings=SEQ + 4), "classify"),
    ZooModel("distilbert", "encoder", "DistilBertForSequenceClassification", "DistilBertConfig", _frozen(
        dim=HIDDEN, n_layers=1, n_heads=HEADS, hidden_dim=INTERMEDIATE, vocab_size=VOCAB, max_position_embeddings=16,
        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, num_labels=LABELS), "classify"),
    ZooModel("albert", "encoder", "AlbertForSequenceClassification", "AlbertConfig", _encoder(
        embedding_size=16, classifier_dropout_prob=0.0), "classify"),
    ZooModel("electra", "encoder", "ElectraForSequenceClassification", "ElectraConfig", _encoder(
        embedding_size=16), "classify"),
    ZooModel("deberta_v2", "encoder", "DebertaV2ForSequenceClassification", "DebertaV2Config", _encoder(
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4, max_relative_positions=-1,
        norm_rel_ebd="layer_norm", share_att_key=True, pooler_dropout=0.0, pooler_hidden_size=HIDDEN,
        # (without a problem type its loss keeps the labels >= 0 by nonzero(): a data-dependent shape)
        problem_type="single_label_classification"), "classify"),
    # -- sequence to sequence ---------------------------------------------------------------------
    ZooModel("t5", "seq2seq", "T5ForConditionalGeneration", "T5Config", _frozen(
        vocab_size=VOCAB, d_model=HIDDEN, d_kv=HEAD_DIM, d_ff=INTERMEDIATE, num_layers=1, num_decoder_layers=1,
        num_heads=HEADS, relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0)),
    ZooModel("bart", "seq2seq", "BartForConditionalGeneration", "BartConfig", _frozen(
        vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=INTERMEDIATE, decoder_ffn_dim=INTERMEDIATE,
        max_position_embeddings=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=2)),
    # -- speech -----------------------------------------------------------------------------------
    ZooModel("whisper", "speech", "WhisperForConditionalGeneration", "WhisperConfig", _frozen(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=INTERMEDIATE, decoder_ffn_dim=INTERMEDIATE, d_model=HIDDEN,
        max_source_positions=8, max_target_positions=16, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None),
        "features", (8, 16)),
    ZooModel("wav2vec2", "speech", "Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", _frozen(
        hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.0, mask_feature_prob=0.0, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
        num_labels=LABELS, classifier_proj_size=16, vocab_size=VOCAB), "audio", (160,)),
    # -- vision (transformers' implementations; see the module docstring) ------------------------
    ZooModel("vit", "vision", "ViTForImageClassification", "ViTConfig", _VIT, "image", _SMALL_IMAGE),
    ZooModel("deit", "vision", "DeiTForImageClassification", "DeiTConfig", _VIT, "image", _SMALL_IMAGE),
    ZooModel("swin", "vision", "SwinForImageClassification", "SwinConfig", _frozen(
        image_size=16, patch_size=2, num_channels=3, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
        mlp_ratio=2.0, drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        num_labels=LABELS), "image", _SMALL_IMAGE),
    ZooModel("resnet", "vision", "ResNetForImageClassification", "ResNetConfig", _frozen(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
        num_labels=LABELS), "image", _IMAGE, "sgd"),
    ZooModel("convnext", "vision", "ConvNextForImageClassification", "ConvNextConfig", _frozen(
        num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], drop_path_rate=0.0,
        image_size=32, num_labels=LABELS), "image", _IMAGE),
    ZooModel("mobilevit", "vision", "MobileViTForImageClassification", "MobileViTConfig", _frozen(
        image_size=32, patch_size=2, num_channels=3, hidden_sizes=[16, 16, 16],
        neck_hidden_sizes=[8, 8, 8, 8, 8, 8, 16],
        num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, num_labels=LABELS), "image", _IMAGE,
        unit_batch_norms=True),
    ZooModel("regnet", "vision", "RegNetForImageClassification", "RegNetConfig", _frozen(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, layer_type="y",
        num_labels=LABELS), "image", _IMAGE, "sgd"),
    ZooModel("mobilenet_v2", "vision", "MobileNetV2ForImageClassification", "MobileNetV2Config", _frozen(
        num_channels=3, image_size=32, depth_multiplier=0.25, min_depth=8, finegrained_output=False,
        classifier_dropout_prob=0.0, num_labels=LABELS), "image", _IMAGE, "sgd"),
    ZooModel("efficientnet", "vision", "EfficientNetForImageClassification", "EfficientNetConfig", _frozen(
        num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=1.0, kernel_sizes=(3, 3, 5),
        in_channels=(32, 16, 24), out_channels=(16, 24, 40), strides=(1, 2, 2), num_block_repeats=(1, 1, 1),
        expand_ratios=(1, 6, 6), hidden_dim=320, dropout_rate=0.0, drop_connect_rate=0.0, num_labels=LABELS),
        "image", _IMAGE, "sgd", unit_batch_norms=True),
)

#: The entries the default test run trains, CI's bounded share (a few minutes on 2 cores; each
#: entry's compile is mostly Dynamo tracing the transformers model, ~10 s): every family, and the
#: mechanisms the other entries reuse -- learned and rotary positions, grouped-query attention,
#: RMSNorm and gated MLPs, relative-position buckets,
#: encoder-decoder cross-attention, convolutional audio and image stems, batch norms, residual
#: stages. (Mixture-of-experts routing is in tests/lowering/test_moe.py's CI share.) The other entries are
#: marked slow; ``python -m torch_adreno zoo`` runs them all.
DEFAULT_SHARE = frozenset({"gpt2", "llama", "bert", "t5", "whisper", "wav2vec2", "vit", "resnet", "convnext"})


def zoo_models(names: list[str] | tuple[str, ...] | None = None) -> list[ZooModel]:
    """The entries named (all, in table order, for None); an unknown name is an error listing the names."""
    if names is None:
        return list(ZOO)
    by_name = {m.name: m for m in ZOO}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"no zoo model named {', '.join(map(repr, unknown))}; the zoo has: {', '.join(by_name)}")
    return [by_name[n] for n in names]
