"""Host writes that PyTorch's version counters miss, made visible to them.

Where tensors are copied to the device (discrete GPUs, ``zero_copy=False``) a device copy is
trusted while its tensor's version counter and memory are unchanged (:mod:`.copies`): every
in-place ATen op bumps the counter, and ``load_state_dict``, ``copy_`` and in-place edits under
``torch.no_grad()`` go through such ops; replacing a tensor's memory (``p.data = t``) changes its
data pointer. Two kinds of host writes do neither (torch 2.11 and 2.13):

* **Fused optimizer steps** (``Adam``/``AdamW``/``SGD``/``Adagrad`` with ``fused=True``, the
  Hugging Face Trainer's default ``adamw_torch_fused``): their kernels write parameters and state
  without bumping a counter; so does any optimizer whose step writes through ``.data``. A global
  step post-hook bumps, after every step of every ``torch.optim.Optimizer``, the versions of the
  parameters it may have written (those with a gradient) and of its state tensors: one mechanism
  for every optimizer, whatever its step does inside.
* **GradScaler's unscale** (``torch._amp_foreach_non_finite_check_and_unscale_``) divides the
  gradients in place without a bump; the op is wrapped to bump the versions it changed.

Writes outside both (``t.data.add_(...)`` or a NumPy view written by code that is not an
optimizer step) stay invisible to any counter: ``torch_adreno.mark_changed(t)`` says so.
:mod:`torch_adreno.torch_patches` installs the wrapper and the hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.graph import increment_version

_ORIGINAL_UNSCALE: Any = torch._amp_foreach_non_finite_check_and_unscale_


def unscale_bumping_versions(grads: Sequence[torch.Tensor], found_inf: torch.Tensor,
                              inv_scale: torch.Tensor) -> None:
    _ORIGINAL_UNSCALE(grads, found_inf, inv_scale)
    increment_version([g for g in grads if not g.is_inference()])


def written_by_step(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors an optimizer step may have written: parameters with a gradient, and every
    tensor in their state."""
    written: list[torch.Tensor] = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            written.append(param)
            written.extend(v for v in optimizer.state.get(param, {}).values() if isinstance(v, torch.Tensor))
    return [t for t in written if not t.is_inference()]


def bump_after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """The global step post-hook (see the module's docstring). Nothing while Dynamo traces a step
    (a compiled step's writes are the device's own)."""
    if torch.compiler.is_compiling():
        return
    increment_version(written_by_step(optimizer))


def is_own_hook(hook: Any) -> bool:
    """Whether ``hook`` is this module's (a replayed step need not run it: it writes on the device)."""
    return hook is bump_after_step


def mark_changed(*tensors: torch.Tensor) -> None:
    """Say that ``tensors`` were written in a way PyTorch's version counters cannot see (through
    ``.data`` or a NumPy view, outside an optimizer step): device copies of them are made again
    before a compiled graph next reads them."""
    increment_version([t for t in tensors if not t.is_inference()])
