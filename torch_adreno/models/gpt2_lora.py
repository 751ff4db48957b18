"""GPT-2 (124M shapes) with LoRA adapters on the query and value projections, in plain torch: the
language-model workload of ``benchmarks/workloads.py`` and ``python -m torch_adreno project``.

What ``transformers.GPT2LMHeadModel`` + ``peft.get_peft_model(..., LoraConfig(r=8, lora_alpha=16,
target_modules=["c_attn"]))`` trains, written without either (neither is on the GPU machine):
pre-LN blocks, a fused ``c_attn`` Linear (d -> 3d) whose q and v slices get adapters (``A``: d -> r,
kaiming-uniform as LoRA initialises it; ``B``: r -> d, zero; added scaled by alpha / r),
``F.scaled_dot_product_attention(..., is_causal=True)``, a tanh-GELU MLP of 4d, a final LayerNorm
and the head tied to the token embedding. Module names follow GPT-2's (``transformer.h.0.attn.c_attn``);
dropout is left out (deterministic steps, so that peers' losses can be compared).

:func:`gpt2_lora` freezes every base weight: only the adapters require grad, and only they go to the
optimizer (:func:`trainable_parameters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FULL", "SMALL", "GPT2Config", "GPT2LoRA", "gpt2_lora", "lm_loss", "token_batch", "trainable_parameters"]


@dataclass(frozen=True)
class GPT2Config:
    layers: int = 12
    d: int = 768
    heads: int = 12
    vocab: int = 50257
    positions: int = 1024
    seq: int = 256
    batch: int = 4
    rank: int = 8
    alpha: float = 16.0


FULL = GPT2Config()
SMALL = GPT2Config(layers=2, d=64, heads=4, vocab=512, positions=64, seq=32, batch=2)


class LoRA(nn.Module):
    """``B(A(x)) * alpha / r``: the low-rank update of one projection."""

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.A = nn.Linear(d_in, rank, bias=False)
        self.B = nn.Linear(rank, d_out, bias=False)
        self.scaling = alpha / rank
        nn.init.kaiming_uniform_(self.A.weight, a=math.sqrt(5))  # as peft's LoRA layers
        nn.init.zeros_(self.B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.B(self.A(x)) * self.scaling


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.heads, self.d = cfg.heads, cfg.d
        self.c_attn = nn.Linear(cfg.d, 3 * cfg.d)
        self.c_proj = nn.Linear(cfg.d, cfg.d)
        self.lora_q = LoRA(cfg.d, cfg.d, cfg.rank, cfg.alpha)
        self.lora_v = LoRA(cfg.d, cfg.d, cfg.rank, cfg.alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q + self.lora_q(x)
        v = v + self.lora_v(x)
        q, k, v = (t.view(batch, seq, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(batch, seq, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d, 4 * cfg.d)
        self.c_proj = nn.Linear(4 * cfg.d, cfg.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # GPT-2's gelu_new


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.d)
        self.wpe = nn.Embedding(cfg.positions, cfg.d)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d)


class GPT2LoRA(nn.Module):
    """``model(tokens)`` -> logits ``[batch, seq, vocab]``."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's
        std = 0.02
        for name, p in self.named_parameters():
            if ".lora_" in name:
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or "ln_f" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * cfg.layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = t.wte(tokens) + t.wpe(positions)
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def gpt2_lora(cfg: GPT2Config = FULL) -> GPT2LoRA:
    """The model with its base weights frozen: only the LoRA adapters require grad."""
    model = GPT2LoRA(cfg)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def lm_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (``targets`` are ``tokens`` shifted by one)."""
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def token_batch(cfg: GPT2Config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids ``[batch, seq + 1]`` split into inputs and next-token targets."""
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
