"""GradScaler's in-place unscale, made visible to the version counters device copies trust.

``torch._amp_foreach_non_finite_check_and_unscale_`` (what ``GradScaler.unscale_`` and
``GradScaler.step`` call on the host's gradients) divides them in place without bumping their
version counters (torch 2.11 and 2.13; every other in-place op, the ``_foreach_*_`` ops included,
bumps them). Where tensors are copied to the device (discrete GPUs, ``zero_copy=False``) a copy
is trusted while its tensor's version is unchanged (``residency.py``), so a compiled optimizer
step would read the gradients still multiplied by the scale (65,536 by default) from the
device. :func:`install` wraps the op so that it bumps the versions of the gradients it divided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.graph import increment_version

_ORIGINAL: Any = torch._amp_foreach_non_finite_check_and_unscale_


def _unscale_bumping_versions(grads: Sequence[torch.Tensor], found_inf: torch.Tensor,
                              inv_scale: torch.Tensor) -> None:
    _ORIGINAL(grads, found_inf, inv_scale)
    increment_version([g for g in grads if not g.is_inference()])


def install() -> None:
    """Route ``torch._amp_foreach_non_finite_check_and_unscale_`` through the wrapper (idempotent;
    ``GradScaler`` looks the op up on ``torch`` at every call)."""
    torch._amp_foreach_non_finite_check_and_unscale_ = _unscale_bumping_versions  # type: ignore[assignment]
