"""Attention written by hand, ``softmax(q @ k.transpose(-2, -1) * scale) @ v``, rewritten in the
Dynamo graph (before AOTAutograd) as ``F.scaled_dot_product_attention(q, k, v, scale=scale)``,
so that it runs as the fused attention kernels (``lowering/attention.py``) forward and backward,
with no queries x keys matrix in device memory.

The rewrite is exact in what it computes (up to rounding: the scale multiplies the scores inside
the kernel instead of dividing the product) and is made only where the graph allows it: the
product, the scaled scores and the probabilities each have one user (the next step of the chain),
so no intermediate is needed elsewhere; the softmax is over the last dimension with no dtype
argument; q, k and v are 4-d floating tensors of one dtype with equal head dimensions; and the
scale is a Python number. A chain that fails one of these is left as it is (it still computes
correctly, decomposed), and the reason is logged at debug level.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

log = logging.getLogger(__name__)

_MATMULS = (operator.matmul, torch.matmul)
_SOFTMAXES = (torch.softmax, F.softmax, torch.Tensor.softmax)


def _is_call(node: Any, targets: tuple[Any, ...], method: str | None = None) -> bool:
    if not isinstance(node, Node):
        return False
    if node.op == "call_function" and node.target in targets:
        return True
    return method is not None and node.op == "call_method" and node.target == method


def _value(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, Node) else None


def _single_user(node: Node, user: Node) -> bool:
    return list(node.users) == [user]


def _last_two_swapped(node: Any) -> Node | None:
    """``k`` where ``node`` is ``k.transpose(-2, -1)`` (or ``(-1, -2)``, ``(2, 3)``, ``(3, 2)``) of a 4-d ``k``."""
    if not _is_call(node, (torch.transpose,), "transpose"):
        return None
    arguments: list[Any] = [*node.args, *node.kwargs.values()]
    source, dims = arguments[0], arguments[1:]
    value = _value(source)
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or len(dims) != 2:
        return None
    if not all(isinstance(d, int) for d in dims) or sorted(d % 4 for d in dims) != [2, 3]:
        return None
    return source if isinstance(source, Node) else None


def _softmax_input(node: Node) -> Node | None:
    """The scores ``node`` (a softmax over the last dimension, no dtype) is taken of."""
    if not _is_call(node, _SOFTMAXES, "softmax"):
        return None
    args = list(node.args)
    kwargs = dict(node.kwargs)
    scores = args.pop(0) if args else kwargs.pop("input", None)
    dim = args.pop(0) if args else kwargs.pop("dim", None)
    kwargs.pop("_stacklevel", None)  # (F.softmax's warning depth)
    if args or kwargs.get("dtype") is not None or dim is None:
        return None
    value = _value(scores)
    if not isinstance(value, torch.Tensor) or not isinstance(dim, int) or dim % value.dim() != value.dim() - 1:
        return None
    return scores if isinstance(scores, Node) else None


def _scaled(scores: Node) -> tuple[Node, float | None] | str:
    """``(q @ k^T node, scale)`` of ``scores``: ``product / c``, ``product * c``, ``c * product`` or
    the product itself (scale None: SDPA's default 1/sqrt(d) does not apply, so 1.0)."""
    if _is_call(scores, (operator.truediv, torch.div), "div"):
        product, divisor = scores.args[:2]
        if not isinstance(divisor, int | float) or isinstance(divisor, bool) or divisor == 0 or scores.kwargs:
            return "the scores are divided by something other than a nonzero number"
        return product, 1.0 / float(divisor)  # type: ignore[return-value]
    if _is_call(scores, (operator.mul, torch.mul), "mul"):
        a, b = scores.args[:2]
        product, factor = (a, b) if isinstance(b, int | float) else (b, a)
        if not isinstance(factor, int | float) or isinstance(factor, bool) or not isinstance(product, Node):
            return "the scores are multiplied by something other than a number"
        return product, float(factor)
    return scores, 1.0


def _match(out: Node) -> tuple[list[Node], tuple[Node, Node, Node, float]] | str | None:
    """For ``out = probabilities @ v``: the nodes to remove and (q, k, v, scale), or why not
    (None: not an attention at all)."""
    if not _is_call(out, _MATMULS, "matmul") or len(out.args) != 2:
        return None
    probabilities, v = out.args
    if not isinstance(probabilities, Node) or not isinstance(v, Node):
        return None
    scores = _softmax_input(probabilities)
    if scores is None:
        return None
    scaled = _scaled(scores)
    if isinstance(scaled, str):
        return scaled
    product, scale = scaled
    if not _is_call(product, _MATMULS, "matmul") or len(product.args) != 2:
        return None
    q, transposed = product.args
    k = _last_two_swapped(transposed)
    if k is None or not isinstance(q, Node):
        return None
    chain = [probabilities, *([scores] if scores is not product else []), product]
    users = [out, probabilities, *([scores] if scores is not product else [])]
    if any(not _single_user(node, user) for node, user in zip(chain, users, strict=True)):
        return "an intermediate (the probabilities or the scores) is used elsewhere"
    values = [_value(t) for t in (q, k, v)]
    if any(not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point() for t in values):
        return "q, k and v are not 4-d floating tensors"
    if len({t.dtype for t in values}) != 1 or values[0].shape[-1] != values[1].shape[-1]:
        return "q, k and v differ in dtype or head dimension"
    if values[1].shape[-2] != values[2].shape[-2] or values[0].shape[:2] != values[1].shape[:2]:
        return "the batch, heads or key counts of q, k and v differ"
    return chain, (q, k, v, float(scale) if scale is not None else 1.0)


def fuse_attention_patterns(gm: GraphModule) -> int:
    """Rewrite every hand-written attention of ``gm`` that qualifies (module doc); returns how many."""
    rewritten = 0
    for out in list(gm.graph.nodes):
        found = _match(out)
        if isinstance(found, str):
            log.debug("attention at %s left decomposed: %s", out.name, found)
            continue
        if found is None:
            continue
        chain, (q, k, v, scale) = found
        transposed = chain[-1].args[1]
        with gm.graph.inserting_before(out):
            fused = gm.graph.call_function(F.scaled_dot_product_attention, (q, k, v), {"scale": scale})
        fused.meta.update(out.meta)
        out.replace_all_uses_with(fused)
        gm.graph.erase_node(out)
        for node in chain:
            gm.graph.erase_node(node)
        if isinstance(transposed, Node) and not transposed.users:
            gm.graph.erase_node(transposed)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
