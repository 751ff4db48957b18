"""A language-model head and its cross-entropy fused and chunked: no tokens x vocab logits in memory.

``F.cross_entropy(linear(hidden, W), targets)`` over a large vocabulary materialises the float32
logits ``[tokens, vocab]`` (GPT-2: 206 MB at 1,024 tokens), keeps them (or their log-softmax) from
the forward to the backward, and copies them between the head, the loss and their backward. Here,
on the Dynamo FX graph before AOTAutograd traces it, the chain

    linear(hidden, W) | matmul(hidden, W^T)  [-> reshape / view / flatten / float cast]  -> cross_entropy

whose logits feed nothing but the loss is replaced by one op, ``adreno::linear_cross_entropy``
(:func:`fuse_head_and_loss`). Its forward and backward are decomposed into ATen ops chunk by chunk,
a chunk being ``tokens_per_chunk`` tokens by ``words_per_chunk`` words of the vocabulary
(:func:`chunk_shape`), as AOTAutograd traces the joint graph (:data:`DECOMPOSITIONS`):

- forward: per chunk, the chunk's logits (a GEMM of the tokens' hidden states by a slice of W),
  in one reduction their log-sum-exp and the logit of each target among the chunk's words; per
  token the chunks' log-sum-exps combined. The forward returns the loss and the per-token
  log-sum-exp, and saves only hidden, W, the targets and that log-sum-exp (``tokens`` floats);
- backward: per chunk, the logits again, ``softmax - one_hot(target)`` scaled by the incoming
  gradient (over the mean's count; ignored tokens zero), read by the GEMMs of ``grad_hidden``'s
  share and, when W needs a gradient (a tied trainable table, an untied trainable head), of
  ``grad_W``'s; shares summed in float32.

Chunks' logits have lifetimes that do not overlap, so the memory planner gives them one range:
the peak holds one chunk, whatever the number of tokens and the vocabulary's size. Chunks span as
many tokens as they can (up to :data:`MAX_CHUNK_TOKENS`) and split the vocabulary instead: a
chunk's GEMM reads its rows of W once, and W (vocab x d) is far larger than the hidden states.

Invariants: the matrix products run in the head's own dtype (autocast's: the pass casts hidden
and W to the linear's output dtype, as autocast's linear does, so a frozen W's cast is one that
``frozen_casts`` keeps), the softmax and the loss in float32, the loss returned in the dtype eager's
cross-entropy gives; the token order is the logits' row order (only leading dimensions are
merged). Unfusable chains (a bias, class weights, label smoothing, ``reduction="none"``, logits read
elsewhere) are left as they are, with the reason logged, or refused when the option forces fusion.
"""

from __future__ import annotations

import inspect
import logging
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from torch_adreno.config import Config
from torch_adreno.errors import OptionError

_log = logging.getLogger("torch_adreno")

#: Under ``chunked_cross_entropy="auto"``, the head and loss are fused when their float32 logits
#: would take at least this many bytes.
AUTO_THRESHOLD_BYTES = 32 << 20
#: ... or, on a device (target) of more memory, this fraction of its global memory: the fused path
#: recomputes the logits in the backward (one more head GEMM per step, while a desktop GPU's memory
#: holds GPT-2's logits hundreds of times over), which pays only where memory is short.
AUTO_MEMORY_FRACTION = 1 / 256


def auto_threshold_bytes(global_mem_bytes: int | None) -> int:
    """The float32 logits above which "auto" fuses, on a device of ``global_mem_bytes`` (None: unknown)."""
    return max(AUTO_THRESHOLD_BYTES, int((global_mem_bytes or 0) * AUTO_MEMORY_FRACTION))
#: The most bytes of float32 logits one chunk holds, by default (the option's number overrides it).
CHUNK_LOGITS_BYTES = 32 << 20
#: Tokens per chunk at most. A chunk's GEMM reads its slice of W once, so W (the largest operand: a
#: vocabulary of 50k words by 768 is 154 MB in float32) is read once per pass per chunk of tokens;
#: chunks of the vocabulary re-read only the chunk's hidden states, ``tokens x d``, far smaller.
MAX_CHUNK_TOKENS = 1024
#: Vocabulary words per chunk at least (below it the budget takes tokens off instead), in
#: multiples of :data:`WORD_GRANULE`: a GEMM of a few hundred tokens by 256 words still has tiles
#: enough for a phone's GPU, and a multiple of 64 words fits the GEMM templates' tiles.
MIN_CHUNK_WORDS = 256
WORD_GRANULE = 64

_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class ChunkShape:
    tokens: int
    words: int


def chunk_shape(tokens: int, vocab: int, budget_bytes: int = CHUNK_LOGITS_BYTES) -> ChunkShape:
    """Tokens and words per chunk for ``tokens x vocab`` logits: as many tokens as
    :data:`MAX_CHUNK_TOKENS` allows (fewer W reads), then as many words as ``budget_bytes`` of float32
    logits hold, spread evenly over the vocabulary; fewer tokens where the budget holds fewer than
    :data:`MIN_CHUNK_WORDS` words for them."""
    rows = min(tokens, MAX_CHUNK_TOKENS)
    words = budget_bytes // (4 * rows)
    if words < min(vocab, MIN_CHUNK_WORDS):
        words = min(vocab, MIN_CHUNK_WORDS)
        rows = max(1, min(rows, budget_bytes // (4 * words)))
    pieces = math.ceil(vocab / max(words, 1))
    even = math.ceil(vocab / pieces)
    return ChunkShape(rows, min(vocab, math.ceil(even / WORD_GRANULE) * WORD_GRANULE))


# -- the op and its chunked decompositions ------------------------------------------------------------


def _ranges(size: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(start + step, size)) for start in range(0, size, step)]


def _total(values: list[torch.Tensor]) -> torch.Tensor:
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the softmax and the loss are computed in: float32, or float64 for float64 operands."""
    return torch.float64 if dtype is torch.float64 else torch.float32


def _loss_scale(targets: torch.Tensor, ignore_index: int, reduction: str,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(which tokens count, the divisor of their summed losses: their count for a mean, else 1)."""
    valid = targets != ignore_index
    divisor = valid.sum().to(dtype) if reduction == "mean" else torch.ones((), dtype=dtype)
    return valid, divisor


def chunked_forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                    reduction: str, tokens_per_chunk: int, words_per_chunk: int,
                    loss_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss, each token's log-sum-exp of its logits in float32), the logits made one chunk of
    ``tokens_per_chunk x words_per_chunk`` at a time: per chunk its log-sum-exp per token and the
    targets' logits among its words; per token the chunks' log-sum-exps combined. ``hidden``
    [..., d] and ``weight`` [vocab, d] of one dtype, ``targets`` [tokens] class indices."""
    flat, wide = hidden.reshape(-1, hidden.shape[-1]), softmax_dtype(hidden.dtype)
    valid, divisor = _loss_scale(targets, ignore_index, reduction, wide)
    safe_targets = torch.where(valid, targets, 0).unsqueeze(1)
    lses, losses = [], []
    for start, end in _ranges(flat.shape[0], tokens_per_chunk):
        rows, wanted = flat[start:end], safe_targets[start:end]
        parts, target_logits = [], []
        for first, last in _ranges(weight.shape[0], words_per_chunk):
            logits = torch.mm(rows, weight[first:last].t()).to(wide)
            row_max = logits.amax(1, keepdim=True)
            parts.append(torch.log(torch.exp(logits - row_max).sum(1, keepdim=True)) + row_max)
            # A reduction over the chunk, not a gather: fusion would inline a gather into the sum of
            # the chunks' picks, which runs after the last chunk, and keep every chunk's logits alive.
            ids = torch.arange(first, last, device=weight.device).unsqueeze(0)
            target_logits.append(torch.where(ids == wanted, logits, 0.0).sum(1, keepdim=True))
        lse = parts[0] if len(parts) == 1 else torch.logsumexp(torch.cat(parts, 1), 1, keepdim=True)
        lses.append(lse.squeeze(1))
        losses.append(torch.where(valid[start:end], (lse - _total(target_logits)).squeeze(1), 0.0).sum())
    return (_total(losses) / divisor).to(loss_dtype), torch.cat(lses)


def chunked_backward(grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                     lse: torch.Tensor, ignore_index: int, reduction: str, tokens_per_chunk: int,
                     words_per_chunk: int, hidden_grad: bool, weight_grad: bool) -> list[torch.Tensor]:
    """``[grad_hidden if hidden_grad, grad_weight if weight_grad]`` of :func:`chunked_forward`'s
    loss, each chunk's logits recomputed and its probabilities taken from ``lse``. Sums over chunks
    (a token's over the vocabulary's chunks, a word's over the tokens' chunks) are float32, then
    given the operand's dtype."""
    flat, wide = hidden.reshape(-1, hidden.shape[-1]), softmax_dtype(hidden.dtype)
    valid, divisor = _loss_scale(targets, ignore_index, reduction, wide)
    safe_targets = torch.where(valid, targets, 0).unsqueeze(1)
    row_scale = torch.where(valid, grad_loss.to(wide) / divisor, 0.0).unsqueeze(1)
    word_ranges = _ranges(weight.shape[0], words_per_chunk)
    grad_rows: list[torch.Tensor] = []
    grad_words: list[list[torch.Tensor]] = [[] for _ in word_ranges]
    for start, end in _ranges(flat.shape[0], tokens_per_chunk):
        rows, shares = flat[start:end], []
        for (first, last), word_shares in zip(word_ranges, grad_words, strict=True):
            words = weight[first:last]
            logits = torch.mm(rows, words.t()).to(wide)
            probabilities = torch.exp(logits - lse[start:end].unsqueeze(1))
            ids = torch.arange(first, last, device=weight.device).unsqueeze(0)
            grad_logits = torch.where(ids == safe_targets[start:end], probabilities - 1.0, probabilities)
            grad_logits = (grad_logits * row_scale[start:end]).to(weight.dtype)
            if hidden_grad:
                shares.append(torch.mm(grad_logits, words).to(wide))
            if weight_grad:
                word_shares.append(torch.mm(grad_logits.t(), rows).to(wide))
        if hidden_grad:
            grad_rows.append(_total(shares).to(hidden.dtype))
    grads = []
    if hidden_grad:
        grads.append(torch.cat(grad_rows).reshape(hidden.shape))
    if weight_grad:
        grads.append(torch.cat([_total(shares) for shares in grad_words]).to(weight.dtype))
    return grads


@torch.library.custom_op("adreno::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                         reduction: str, tokens_per_chunk: int, words_per_chunk: int,
                         loss_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cross_entropy(hidden @ weight.T, targets), per-token log-sum-exp)``, chunked (see the module)."""
    return chunked_forward(hidden, weight, targets, ignore_index, reduction, tokens_per_chunk, words_per_chunk,
                           loss_dtype)


@linear_cross_entropy.register_fake
def _(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
      tokens_per_chunk: int, words_per_chunk: int, loss_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return (hidden.new_empty((), dtype=loss_dtype),
            hidden.new_empty((targets.shape[0],), dtype=softmax_dtype(hidden.dtype)))


@torch.library.custom_op("adreno::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                                  targets: torch.Tensor, lse: torch.Tensor, ignore_index: int, reduction: str,
                                  tokens_per_chunk: int, words_per_chunk: int, hidden_grad: bool,
                                  weight_grad: bool) -> list[torch.Tensor]:
    return chunked_backward(grad_loss, hidden, weight, targets, lse, ignore_index, reduction, tokens_per_chunk,
                            words_per_chunk, hidden_grad, weight_grad)


@linear_cross_entropy_backward.register_fake
def _(grad_loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
      ignore_index: int, reduction: str, tokens_per_chunk: int, words_per_chunk: int, hidden_grad: bool,
      weight_grad: bool) -> list[torch.Tensor]:
    return [*([torch.empty_like(hidden)] if hidden_grad else []), *([torch.empty_like(weight)] if weight_grad else [])]


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    hidden, weight, targets, *ctx.settings, _ = inputs  # ignore_index, reduction and the chunk's shape
    ctx.save_for_backward(hidden, weight, targets, output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: Any, grad_loss: torch.Tensor, _grad_lse: Any) -> tuple[torch.Tensor | None, ...]:
    hidden, weight, targets, lse = ctx.saved_tensors
    hidden_grad, weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    grads = iter(torch.ops.adreno.linear_cross_entropy_backward(
        grad_loss, hidden, weight, targets, lse, *ctx.settings, hidden_grad, weight_grad))
    return (next(grads) if hidden_grad else None, next(grads) if weight_grad else None, *[None] * 6)


linear_cross_entropy.register_autograd(_backward, setup_context=_save_for_backward)

#: The ops' decompositions into chunked ATen ops, for AOTAutograd's table (not wrapped in eager's
#: checks: those would run the op on real tensors of the traced sizes).
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    torch.ops.adreno.linear_cross_entropy.default: chunked_forward,
    torch.ops.adreno.linear_cross_entropy_backward.default: chunked_backward,
}


# -- the pass on Dynamo's graph ------------------------------------------------------------------------

_LINEARS = (torch._C._nn.linear, F.linear)
_MATMULS = (torch.matmul, operator.matmul)
#: Methods and functions between the head and the loss that only merge dimensions or widen to float32.
_RESHAPES = {"reshape", "view", "flatten", "contiguous"}
_CASTS = {"float", "to", "type"}
_CROSS_ENTROPY_SIGNATURE = inspect.signature(F.cross_entropy)


@dataclass(frozen=True)
class HeadAndLoss:
    """One matched chain: the loss node and what the fused op reads."""

    loss: Node
    #: The linear or matmul node computing the logits.
    head: Node
    hidden: Node
    weight: Node
    #: True: ``weight`` holds W^T (a matmul's second operand), transposed before the op.
    transposed: bool
    targets: Node
    ignore_index: int
    reduction: str
    tokens: int
    vocab: int


def _example(node: Any) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in t.shape)


def _widening_cast(node: Node) -> bool:
    """A ``.float()`` / ``.to(torch.float32)`` / ``.type(torch.float32)`` with nothing else."""
    if node.target == "float":
        return len(node.args) == 1 and not node.kwargs
    dtype = node.args[1] if len(node.args) == 2 else node.kwargs.get("dtype")
    extra = len(node.args) > 2 or any(k != "dtype" for k in node.kwargs)
    return dtype is torch.float32 and not extra


def _head(node: Node) -> tuple[Node, Node, Node, bool] | str:
    """(head, hidden, weight, transposed) of the head that computes ``node``'s logits, or why none does."""
    while (node.op == "call_method" and (node.target in _RESHAPES or (node.target in _CASTS and _widening_cast(node)))) \
            or (node.op == "call_function" and node.target in (torch.reshape, torch.flatten)):
        if len(node.users) != 1:
            return "the logits are also read outside the loss"
        source = node.args[0]
        if not isinstance(source, Node):
            return "the logits come from no node"
        node = source
    if node.op != "call_function" or node.target not in (*_LINEARS, *_MATMULS):
        return "its input is not a linear head's output"
    if len(node.users) != 1:
        return "the logits are also read outside the loss"
    hidden, weight, *rest = (*node.args, *node.kwargs.values())
    if not isinstance(hidden, Node) or not isinstance(weight, Node):
        return "the head's operands are not tensors"
    if node.target in _LINEARS:
        return (node, hidden, weight, False) if all(b is None for b in rest) else "the head has a bias"
    return node, hidden, weight, True


def match(loss: Node) -> HeadAndLoss | str:
    """The fusable chain ending at the ``cross_entropy`` node ``loss``, or the reason it is not one."""
    try:
        bound = _CROSS_ENTROPY_SIGNATURE.bind(*loss.args, **loss.kwargs)
    except TypeError:
        return "its arguments do not bind to F.cross_entropy's"
    arguments = {**{k: p.default for k, p in _CROSS_ENTROPY_SIGNATURE.parameters.items()}, **bound.arguments}
    for name, plain in (("weight", None), ("size_average", None), ("reduce", None), ("label_smoothing", 0.0)):
        if arguments[name] != plain:
            return f"{name}={arguments[name]!r} is not fused (only {name}={plain!r} is)"
    if arguments["reduction"] not in _REDUCTIONS:
        return f"reduction={arguments['reduction']!r} is not fused (only 'mean' and 'sum' are)"
    if not isinstance(arguments["ignore_index"], int):
        return "ignore_index is not a constant int"
    found = _head(arguments["input"]) if isinstance(arguments["input"], Node) else "its input is not a node"
    if isinstance(found, str):
        return found
    head, hidden, weight, transposed = found
    logits, targets, h, w = (_example(n) for n in (arguments["input"], arguments["target"], hidden, weight))
    if logits is None or targets is None or h is None or w is None:
        return "Dynamo recorded no example values for its operands"
    if not all(_static(t) for t in (logits, targets, h, w)):
        return ("its shapes are symbolic (they are specialised per call, after this pass); compile with "
                "torch.compile(..., dynamic=False)")
    vocab = w.shape[1] if transposed else w.shape[0]
    tokens = math.prod(h.shape[:-1])
    if w.dim() != 2 or tuple(logits.shape) != (tokens, vocab) or tuple(targets.shape) != (tokens,) \
            or targets.dtype is not torch.int64:
        return (f"the loss reads logits {tuple(logits.shape)} and targets {tuple(targets.shape)} {targets.dtype}, not "
                f"[tokens, vocab] = [{tokens}, {vocab}] and [tokens] class indices")
    return HeadAndLoss(loss, head, hidden, weight, transposed, arguments["target"], arguments["ignore_index"],
                       arguments["reduction"], tokens, vocab)


def _wanted(loss: Node, mode: str | bool | int, threshold: int) -> bool:
    """Whether ``mode`` asks to fuse the head of ``loss``: always when forced; under "auto" where
    the loss's input, as float32 logits, would take ``threshold`` bytes or more (an input of
    unknown size is looked at, so that the reason it is not fused is logged)."""
    if mode != "auto":
        return True
    logits = _example(loss.args[0] if loss.args else loss.kwargs.get("input"))
    if logits is None or not _static(logits):
        return True
    return math.prod(logits.shape) * 4 >= threshold


def _rewrite(gm: GraphModule, chain: HeadAndLoss, chunk: ChunkShape) -> None:
    graph = gm.graph
    head_dtype = chain.head.meta["example_value"].dtype
    loss_dtype = chain.loss.meta["example_value"].dtype
    with graph.inserting_before(chain.loss):
        hidden, weight = chain.hidden, chain.weight
        if chain.transposed:
            weight = graph.call_method("t", (weight,))
        # Autocast's linear computes in its own dtype: the operands cast as it casts them.
        if chain.hidden.meta["example_value"].dtype is not head_dtype:
            hidden = graph.call_method("to", (hidden, head_dtype))
        if chain.weight.meta["example_value"].dtype is not head_dtype:
            weight = graph.call_method("to", (weight, head_dtype))
        fused = graph.call_function(torch.ops.adreno.linear_cross_entropy.default,
                                    (hidden, weight, chain.targets, chain.ignore_index, chain.reduction, chunk.tokens,
                                     chunk.words, loss_dtype))
        loss = graph.call_function(operator.getitem, (fused, 0))
    # Where the new nodes come from, for profiles and kernels' headers: the casts from the head,
    # the fused op from the loss's line.
    for node in (hidden, weight):
        if node is not chain.hidden and node is not chain.weight:
            node.meta.update(_provenance(chain.head))
    fused.meta.update(_provenance(chain.loss))
    loss.meta.update(chain.loss.meta)
    chain.loss.replace_all_uses_with(loss)
    dead = chain.loss
    while dead is not chain.hidden and dead is not chain.weight and not dead.users:
        source = dead.args[0] if dead is not chain.loss else _loss_input(chain.loss)
        graph.erase_node(dead)
        if not isinstance(source, Node):
            break
        dead = source


def _provenance(node: Node) -> dict[str, Any]:
    return {k: node.meta[k] for k in ("stack_trace", "nn_module_stack", "source_fn_stack") if k in node.meta}


def _loss_input(loss: Node) -> Node:
    value = _CROSS_ENTROPY_SIGNATURE.bind(*loss.args, **loss.kwargs).arguments["input"]
    assert isinstance(value, Node)
    return value


def fuse_head_and_loss(gm: GraphModule, config: Config, global_mem_bytes: int | None = None) -> int:
    """Replace, in place, each fusable head + cross-entropy chain of Dynamo's graph ``gm`` that
    ``config.chunked_cross_entropy`` selects by the fused op; returns how many were replaced.
    ``global_mem_bytes``: the device's (or target's) memory, which sets "auto"'s threshold
    (:func:`auto_threshold_bytes`).
    With the option forcing fusion (True or a chunk size), a cross-entropy of a head's output that
    cannot be fused is an error saying why."""
    mode = config.chunked_cross_entropy
    if mode is False:
        return 0
    replaced = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or node.target is not F.cross_entropy
                or not _wanted(node, mode, auto_threshold_bytes(global_mem_bytes))):
            continue
        chain = match(node)
        if isinstance(chain, str):
            _not_fused(node, chain, mode)
            continue
        budget = mode if isinstance(mode, int) and not isinstance(mode, bool) else CHUNK_LOGITS_BYTES
        chunk = chunk_shape(chain.tokens, chain.vocab, budget)
        _rewrite(gm, chain, chunk)
        _log.info("torch_adreno: %s fused with its head: %d tokens x %d words in chunks of %d x %d", node.name,
                  chain.tokens, chain.vocab, chunk.tokens, chunk.words)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


def _not_fused(node: Node, reason: str, mode: str | bool | int) -> None:
    if mode == "auto" or reason == "its input is not a linear head's output":
        _log.info("torch_adreno: %s is not fused with a head: %s", node.name, reason)
        return
    raise OptionError(
        f"option chunked_cross_entropy={mode!r} asks to fuse every language-model head with its cross-entropy, "
        f"but {node.name} ({_source_line(node)}) cannot be: "
        f"{reason}; use chunked_cross_entropy='auto' (fuses what can be, above {AUTO_THRESHOLD_BYTES >> 20} MB "
        "of logits or 1/256 of the device's memory) or False")


def _source_line(node: Node) -> str:
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    return lines[-1].strip() if lines else "no source line recorded"
