"""``torch_adreno.freeze(model, dtype)``: a model's frozen weights stored in 16 bits from the start.

LoRA and transfer learning train a few adapters or a head over a large frozen base. Under autocast
the base's matrix products read its weights in 16 bits anyway (the backend casts each frozen
weight once, :mod:`torch_adreno.runtime.frozen`), but the model still holds them in float32: 4 bytes
an element in host memory, which on a phone *is* the device's memory. :func:`freeze` converts them
in place to ``dtype``, the same rounding autocast applies to them, so state takes half the bytes
on the host and on the device, and nothing is ever cast again. What it converts, what it keeps:

- the frozen (``requires_grad=False``) weights and biases of the modules whose forward autocast
  computes in 16 bits -- ``nn.Linear``, the convolutions, ``nn.Bilinear`` and transformers'
  ``Conv1D`` (GPT-2's projections, an ``addmm``). Under ``torch.autocast(dtype=...)`` these compute
  exactly as before: autocast would have rounded the same weights to the same 16-bit values;
- the frozen tables of ``nn.Embedding``: a lookup is not autocast's, so its rows are widened back
  to the table's old type as they are read (a forward hook): what follows computes as autocast
  would, on the table rounded to 16 bits once;
- trainable parameters (adapters, a new head), their optimizer state, buffers (BatchNorm's running
  statistics) and frozen parameters of other modules (normalisations, which eager's CPU kernels
  refuse to mix with 16-bit parameters) stay as they are.

The forward must then run under ``torch.autocast("cpu", dtype=dtype)`` (put it in the loss
function): a converted module checks that before each call and says so otherwise. Parameters keep
their objects, names and ties (GPT-2's head and token table stay one tensor), so ``state_dict`` and
``load_state_dict`` (which rounds float32 values into them) work as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

#: The storage types :func:`freeze` converts to.
FREEZE_DTYPES = (torch.float16, torch.bfloat16)

#: Modules whose forward autocast computes in 16 bits (their parameters are read as 16-bit operands).
_AUTOCAST_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)


def _autocast_module(module: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2): addmm(bias, x, weight), an op autocast computes in 16 bits.
    return isinstance(module, _AUTOCAST_MODULES) or (
        type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers"))


@dataclass
class FrozenWeights:
    """What :func:`freeze` did: the parameters it stored in 16 bits, the frozen ones it kept and why,
    and the bytes of the frozen parameters before and after."""

    dtype: torch.dtype
    converted: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0


class AutocastRequired:
    """Forward pre-hook of a module whose weights :func:`freeze` stored in 16 bits: they meet
    float32 activations only inside autocast of the same type (traced by Dynamo into nothing)."""

    def __init__(self, dtype: torch.dtype, name: str) -> None:
        self.dtype = dtype
        self.name = name

    def __call__(self, module: nn.Module, args: object) -> None:
        if not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") is not self.dtype:
            raise RuntimeError(
                f"{self.name or 'the model'} holds weights that torch_adreno.freeze stored as {self.dtype}: run the "
                f"forward under torch.autocast('cpu', dtype={self.dtype}) (in the loss function), where they meet "
                "the float32 activations as autocast's 16-bit operands")


class WidenLookup:
    """Forward hook of an ``nn.Embedding`` whose table :func:`freeze` stored in 16 bits: the rows it
    returns are widened back to the table's old type (autocast leaves a lookup in float32)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output.to(self.dtype)


def _owners(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, nn.Parameter]]:
    """Every (module name, module, attribute, parameter), a tied parameter once per module holding it."""
    for module_name, module in model.named_modules(remove_duplicate=False):
        for attribute, parameter in module._parameters.items():
            if parameter is not None:
                yield module_name, module, attribute, parameter


def freeze(model: nn.Module, dtype: torch.dtype = torch.float16) -> FrozenWeights:
    """Store ``model``'s frozen weights in ``dtype`` (float16 or bfloat16) in place (see the module
    docstring); returns what was converted and kept. Run the forward under
    ``torch.autocast("cpu", dtype=dtype)`` afterwards. Calling it again with the same dtype
    converts only what was frozen since."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"torch_adreno.freeze takes an nn.Module, got {type(model).__name__}")
    if dtype not in FREEZE_DTYPES:
        raise ValueError(f"torch_adreno.freeze stores weights in 16 bits: dtype must be torch.float16 or "
                         f"torch.bfloat16, got {dtype}")
    owners = list(_owners(model))
    frozen = {id(p): p for _, _, _, p in owners if not p.requires_grad and p.is_floating_point()}
    if not frozen:
        raise ValueError(
            "torch_adreno.freeze found no frozen parameter in the model (every floating-point parameter requires "
            "grad): freeze the base weights first (p.requires_grad_(False), or peft.get_peft_model for LoRA), "
            "then call it")
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=True)}
    # A parameter is converted when every module holding it reads it as autocast's 16-bit operand
    # (or looks rows up in it); one held by any other module stays as it is.
    readers: dict[int, list[tuple[str, nn.Module]]] = {}
    for module_name, module, _, parameter in owners:
        if id(parameter) in frozen:
            readers.setdefault(id(parameter), []).append((module_name, module))
    report = FrozenWeights(dtype)
    convert: list[nn.Parameter] = []
    for key, parameter in frozen.items():
        name = names[key]
        report.bytes_before += parameter.numel() * parameter.element_size()
        others = [(n, m) for n, m in readers[key] if not _autocast_module(m) and not isinstance(m, nn.Embedding)]
        if others:
            holder, module = others[0]
            report.kept[name] = (f"held by {holder or 'the model'} ({type(module).__name__}), which autocast does not "
                                 "compute in 16 bits")
        elif parameter.dtype in FREEZE_DTYPES and parameter.dtype is not dtype:
            raise ValueError(f"{name} is already stored as {parameter.dtype}; torch_adreno.freeze would round it again "
                             f"to {dtype}: freeze with dtype={parameter.dtype}")
        elif parameter.element_size() <= 2:
            report.kept[name] = f"already {parameter.dtype}"
        else:
            convert.append(parameter)
            report.converted.append(name)
    if not convert and not any(v == f"already {dtype}" for v in report.kept.values()):
        raise ValueError(
            f"torch_adreno.freeze found frozen parameters but none it can store in 16 bits: {report.kept}. It converts "
            "the frozen weights of Linear, convolution, Bilinear, transformers' Conv1D and Embedding modules")
    widened = {id(p): p.dtype for p in convert}
    for parameter in convert:
        with torch.no_grad():
            parameter.data = parameter.data.to(dtype)
    for module_name, module, _, parameter in owners:
        if id(parameter) not in widened:
            continue
        if isinstance(module, nn.Embedding):
            if not any(isinstance(h, WidenLookup) for h in module._forward_hooks.values()):
                module.register_forward_hook(WidenLookup(widened[id(parameter)]))
        elif not any(isinstance(h, AutocastRequired) for h in module._forward_pre_hooks.values()):
            module.register_forward_pre_hook(AutocastRequired(dtype, module_name))
    report.bytes_after = sum(p.numel() * p.element_size() for p in frozen.values())
    return report
