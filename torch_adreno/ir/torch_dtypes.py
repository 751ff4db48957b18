"""IR dtypes and the torch dtypes they stand for, both ways. Imported by the stages that meet
torch tensors (lowering, runtime); not by ``torch_adreno.ir`` itself, which needs no torch."""

from __future__ import annotations

import torch

from torch_adreno.ir.dtype import DType

TORCH_TO_IR: dict[torch.dtype, DType] = {
    torch.float32: DType.F32,
    torch.float16: DType.F16,
    torch.bfloat16: DType.BF16,
    torch.int64: DType.I64,
    torch.int32: DType.I32,
    torch.bool: DType.BOOL,
    torch.uint8: DType.U8,
}
IR_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_IR.items()}
