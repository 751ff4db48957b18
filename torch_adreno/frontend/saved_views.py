"""Saved activations that are views of another tensor: the backward remakes the view from its base.

AOTAutograd's partitioner may save a view, such as attention's queries ``q.view(b, t, h, d)
.transpose(1, 2)``, rather than the tensor it views: both weigh the same to its cost model. In eager
the view shares its base's storage. Here a saved tensor is an output of the forward graph, and an
output whose layout is not its buffer's row-major one is copied into a buffer of its own
(``lowering._lower_outputs``): GPT-2's forward would copy the queries, keys and values of every
block into the backward's layout, one kernel reading and writing all three per block.

:func:`recompute_saved_views` marks each view of the joint graph that is not in row-major order
(a contiguous view is returned as its buffer anyway) and whose base is at most
:data:`MAX_BASE_ELEMENTS_RATIO` times its size, and each such view of a graph input (a weight's
transpose), ``MUST_RECOMPUTE``: the partitioner then saves the base, and the backward takes the view of it again, which costs no kernel (a view lowers to an index
map of the kernels that read it). A view of a larger base (a slice of some rows of an activation)
stays as it was: saving the base would keep more memory alive than the copy takes.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import GraphModule, Node

#: A view whose base holds at most this many times its elements is remade in the backward rather
#: than saved. 1: only views of all of their base (a transpose, a permute of heads), so that the
#: saved memory does not grow. The keys sliced out of GPT-2's fused projection (a third of it) stay
#: copied: saving the projection would keep 2 x 3.1 MB more per block alive until the backward
#: reads it (75 MB over 12 blocks, 8% of GPT-2 LoRA's step memory at 1,024 tokens) to save moving
#: 6.3 MB per block a step.
MAX_BASE_ELEMENTS_RATIO = 1


def _viewed(node: Node) -> Node | None:
    """The tensor ``node`` is a view of: a view op's first argument, or, for an element of a view op
    returning several views (``split``, ``unbind``), that op's first argument; None when ``node``
    is not a view."""
    target = node.target
    if node.op != "call_function":
        return None
    if target is operator.getitem and isinstance(node.args[0], Node):
        node = node.args[0]
        target = node.target
    if isinstance(target, torch._ops.OpOverload) and target.is_view and node.args and isinstance(node.args[0], Node):
        return node.args[0]
    return None


def _is_copied_as_output(node: Node) -> bool:
    """Whether the tensor would be copied if the forward returned it: a view not in row-major order
    (a contiguous view is returned as its buffer, reshaped)."""
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and not value.is_contiguous()


def _elements(node: Node) -> int | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return math.prod(int(size) for size in value.shape)
    except TypeError:  # (a symbolic size)
        return None


def _base(node: Node) -> Node:
    """The first node up ``node``'s chain of views that is not a view."""
    while (viewed := _viewed(node)) is not None:
        node = viewed
    return node


def recompute_saved_views(joint: GraphModule, max_base_ratio: int = MAX_BASE_ELEMENTS_RATIO) -> int:
    """Mark the joint graph's views that are not in row-major order and whose base is at most
    ``max_base_ratio`` times their size as recomputed in the backward (see the module
    docstring); return how many were marked. Views of graph inputs are marked whatever their size:
    their base is an input, which stays where it is (a saved input is passed on, never copied)."""
    from torch.utils.checkpoint import CheckpointPolicy

    marked = 0
    for node in joint.graph.nodes:
        if _viewed(node) is None or "recompute" in node.meta or not _is_copied_as_output(node):
            continue
        base = _base(node)
        size, base_size = _elements(node), _elements(base)
        if base.op != "placeholder" and (size is None or base_size is None
                                         or base_size > max_base_ratio * max(size, 1)):
            continue
        # The whole chain up to the base: an element of a split can be remade only with the split.
        link: Node | None = node
        while link is not None and link is not base:
            link.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            if link.target is operator.getitem and isinstance(link.args[0], Node):
                link.args[0].meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            link = _viewed(link)
        marked += 1
    return marked
