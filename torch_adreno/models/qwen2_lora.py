"""Qwen2 (Qwen2.5-0.5B's shapes) with LoRA adapters on the query and value projections, in plain
torch: the second language-model workload (``benchmarks/allocation_limits.py
--workload qwen2_lora``, ``tests/memory/test_allocation_limits_full.py``).

What ``transformers.Qwen2ForCausalLM`` + ``peft.get_peft_model(..., LoraConfig(r=8, lora_alpha=16,
target_modules=["q_proj", "v_proj"]))`` trains, written without either (neither is on the GPU
machine), with transformers' module names (``model.layers.0.self_attn.q_proj``) so that its
``state_dict`` loads into transformers' model (``tests/memory/test_allocation_limits_full.py`` checks that
both compute the same logits):

- pre-norm decoder blocks with RMSNorm (statistics in float32, as Qwen2RMSNorm);
- rotary position embeddings (``rotate_half`` form, base ``rope_theta``) on queries and keys;
- grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads through
  ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)``;
- q, k and v projections with biases, the output projection and the MLP without (as Qwen2);
- a SwiGLU MLP, ``down(silu(gate(x)) * up(x))``;
- the head tied to the token embedding (Qwen2.5-0.5B's ``tie_word_embeddings``).

:func:`qwen2_lora` freezes every base weight: only the adapters require grad
(:func:`~torch_adreno.models.gpt2_lora.trainable_parameters` gives them to the optimizer);
``torch_adreno.freeze(model, torch.float16)`` then stores the frozen projections and the table in
16 bits (the forward runs under ``torch.autocast("cpu", dtype=torch.float16)``). Base parameters at
:data:`FULL`: 494,032,768, Qwen2.5-0.5B's published count (:func:`base_parameter_count`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torch_adreno.models.gpt2_lora import LoRA, lm_loss, trainable_parameters

__all__ = ["FULL", "TINY", "Qwen2Config", "Qwen2LoRA", "base_parameter_count", "lm_loss", "qwen2_lora",
           "token_batch", "trainable_parameters"]


@dataclass(frozen=True)
class Qwen2Config:
    """Model shape (Qwen2.5-0.5B's by default), the batch it trains on, and the adapters' rank."""

    layers: int = 24
    d: int = 896
    heads: int = 14
    kv_heads: int = 2
    intermediate: int = 4864
    vocab: int = 151936
    #: Rows of the rotary tables (the longest sequence the model takes). Qwen2.5 allows 32,768;
    #: tables for what is trained are enough and keep the buffers small (2 x positions x head dim floats).
    positions: int = 1024
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    seq: int = 256
    batch: int = 4
    rank: int = 8
    alpha: float = 16.0

    @property
    def head_dim(self) -> int:
        return self.d // self.heads


#: Qwen2.5-0.5B's shapes, at the memory-limit workloads' sequence length (256).
FULL = Qwen2Config()
#: A few layers of the same structure (grouped queries: 4 heads over 2 key/value heads) a 2-core
#: CPU compiles and trains in seconds.
TINY = Qwen2Config(layers=2, d=64, heads=4, kv_heads=2, intermediate=128, vocab=256, positions=64, seq=16, batch=2)


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, the statistics in float32 and the normalised value back in the
    input's type before the weight multiplies it (Qwen2RMSNorm's order)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    """Cosine and sine tables ``[positions, head_dim]`` (float32, not saved in the state dict:
    computed from the config); :meth:`forward` rotates ``[batch, heads, seq, head_dim]`` queries
    or keys by their positions 0..seq-1."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        inverse = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        angles = torch.outer(torch.arange(cfg.positions, dtype=torch.int64).float(), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[-2]
        if seq > self.cos.shape[0]:
            raise ValueError(f"a sequence of {seq} tokens is longer than the model's rotary tables "
                             f"({self.cos.shape[0]} positions): build it with Qwen2Config(positions={seq}) or more")
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)  # as transformers casts them
        return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        if cfg.d % cfg.heads or cfg.heads % cfg.kv_heads:
            raise ValueError(f"Qwen2Config: d ({cfg.d}) must be a multiple of heads ({cfg.heads}), and heads a "
                             f"multiple of kv_heads ({cfg.kv_heads})")
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        kv = cfg.kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.d, cfg.d)
        self.k_proj = nn.Linear(cfg.d, kv)
        self.v_proj = nn.Linear(cfg.d, kv)
        self.o_proj = nn.Linear(cfg.d, cfg.d, bias=False)
        self.lora_q = LoRA(cfg.d, cfg.d, cfg.rank, cfg.alpha)
        self.lora_v = LoRA(cfg.d, kv, cfg.rank, cfg.alpha)

    def forward(self, x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        batch, seq, d = x.shape
        q = self.q_proj(x) + self.lora_q(x)
        k = self.k_proj(x)
        v = self.v_proj(x) + self.lora_v(x)
        q = q.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        out = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, d))


class MLP(nn.Module):
    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.d, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.d)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d, cfg.norm_eps)
        self.rotary_emb = Rotary(cfg)


class Qwen2LoRA(nn.Module):
    """``model(tokens)`` -> logits ``[batch, seq, vocab]``. Weights random: normal(0, 0.02) as
    transformers initialises Qwen2 (``initializer_range``), biases zero, norms one; the adapters'
    ``B`` zero, as LoRA starts."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as Qwen2.5-0.5B's
        for name, p in self.named_parameters():
            if ".lora_" in name or name.endswith("norm.weight"):
                continue  # LoRA's own initialisation; norms start at one
            if name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        decoder = self.model
        x = decoder.embed_tokens(tokens)
        for layer in decoder.layers:
            x = layer(x, decoder.rotary_emb)
        return self.lm_head(decoder.norm(x))


def qwen2_lora(cfg: Qwen2Config = FULL) -> Qwen2LoRA:
    """The model with its base weights frozen: only the LoRA adapters require grad."""
    model = Qwen2LoRA(cfg)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def base_parameter_count(cfg: Qwen2Config = FULL) -> int:
    """The base model's parameters (adapters left out, the tied table counted once), from the
    shapes alone (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        model = Qwen2LoRA(cfg)
    return sum(p.numel() for name, p in model.named_parameters() if ".lora_" not in name)


def token_batch(cfg: Qwen2Config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``[batch, seq + 1]`` split into inputs and next-token targets."""
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
