"""Gradients leave the backward in the layout autograd will store them in.

Autograd's gradient layout contract: ``AccumulateGrad`` keeps a new gradient as ``param.grad`` only
if its strides are the parameter's (for a non-overlapping, dense parameter; a contiguous gradient
otherwise), and else clones it on the host into that layout. The strides AOTAutograd traces for a
gradient are eager's kernel's: a convolution's weight gradient comes out channels-last when its
input was (a LayerNorm over channels between permutes, as in ConvNeXt). Returned in those strides,
the gradient would be copied on the host twice (into the traced layout, then into the
parameter's): host work that reads a gradient whose current value is on the device (a copy-mode
training step leaves its host copy unfilled) and that a recorded step cannot replay.

So each gradient output of a backward graph is returned in the strides its input has under the
contract; our buffers hold row-major elements, so for the usual contiguous parameter nothing is
copied anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.fx import GraphModule, Node


def non_overlapping_and_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` is a permutation of a contiguous one (its
    elements fill ``numel`` consecutive places, none shared), as ``is_non_overlapping_and_dense``."""
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(shape, strides, strict=True) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _contract_strides(primal: torch.Tensor) -> tuple[int, ...]:
    """The strides ``AccumulateGrad`` wants for the gradient of ``primal``."""
    if non_overlapping_and_dense(primal.shape, primal.stride()):
        return tuple(int(s) for s in primal.stride())
    strides, step = [], 1
    for size in reversed(primal.shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def gradient_strides(joint: GraphModule, backward: GraphModule) -> tuple[tuple[int, ...] | None, ...]:
    """Per output of ``backward`` (AOTAutograd's partition of ``joint``: output ``i`` is the
    gradient of the joint's ``i``-th primal input), the strides it is returned in: its primal's
    layout under autograd's contract; None where nothing is asked (no gradient, a symbolic shape,
    or outputs that do not line up with the primals)."""
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    output = next(n for n in reversed(backward.graph.nodes) if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], list | tuple) else [output.args[0]]
    if len(results) != len(primals):
        return tuple(None for _ in results)
    wanted: list[tuple[int, ...] | None] = []
    for primal, gradient in zip(primals, results, strict=True):
        primal_value = primal.meta.get("val")
        gradient_value = gradient.meta.get("val") if isinstance(gradient, Node) else None
        if not (isinstance(primal_value, torch.Tensor) and isinstance(gradient_value, torch.Tensor)
                and all(isinstance(s, int) for s in (*primal_value.shape, *primal_value.stride()))
                and tuple(primal_value.shape) == tuple(gradient_value.shape)):
            wanted.append(None)
            continue
        wanted.append(_contract_strides(primal_value))
    return tuple(wanted)
