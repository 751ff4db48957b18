"""GPT-2 (124M shapes) with LoRA r=8 on q and v, in plain torch: the benchmarks' name for
:mod:`torch_adreno.models.gpt2_lora` (where the model lives, so that ``python -m torch_adreno
project`` profiles the same step)."""

from __future__ import annotations

from torch_adreno.models.gpt2_lora import (
    FULL,
    SMALL,
    GPT2Config,
    GPT2LoRA,
    gpt2_lora,
    lm_loss,
    token_batch,
    trainable_parameters,
)

__all__ = ["FULL", "SMALL", "GPT2Config", "GPT2LoRA", "gpt2_lora", "lm_loss", "token_batch", "trainable_parameters"]
