"""Autocast's casts of frozen tensors taken out of the compiled graphs: each is made once, not per step.

Under autocast AOTAutograd's graphs cast every float32 weight a matrix product reads to 16 bits:
``_to_copy(primals_6, dtype=torch.bfloat16)`` in the forward, and again in the backward (which
recomputes the cast instead of saving it, see ``_recompute_input_casts``). The cast fuses into
the GEMM's operand loads, so the GEMM reads the float32 weight, 4 bytes an element, in every
forward and backward. For a *frozen* input -- a parameter or buffer (a static input) that
requires no grad and that the graph does not update, such as a LoRA base model's weights -- the
16-bit values are the same at every step, so here, on the FX graphs before lowering:

- every cast of a frozen input to a narrower float type (float32 to float16/bfloat16) is replaced
  by a new placeholder after the graph's own, the 16-bit copy, which
  :class:`~torch_adreno.runtime.frozen.FrozenCopyInputs` fills at each call from the source
  argument (:data:`~torch_adreno.runtime.frozen.FROZEN_COPIES` makes it once per change of the
  source);
- where the forward saves a frozen input for the backward and the backward only casts it (to one
  dtype), the forward saves the copy instead, and the backward reads it as it comes: the float32
  tensor is then read by no kernel of either graph, and is not bound at all (in copy mode it is
  not uploaded).

Only narrowing casts are split: a copy of a wider type would cost more bytes than it saves.
Views between a frozen input and its cast are not followed (autocast casts the parameter itself).
Invariant: a rewritten graph computes the same values as before, bit for bit (the copy is made by
PyTorch's cast, the rounding a device cast does).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import torch
from torch.fx import GraphModule, Node

from torch_adreno.runtime.frozen import COPY_DTYPES, NO_FROZEN_COPIES, FrozenCopyInputs

aten = torch.ops.aten
_log = logging.getLogger("torch_adreno")

#: Ops that only change a tensor's dtype (autocast's casts).
CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)

#: ``_to_copy`` keyword values that leave a cast a plain change of dtype of a CPU tensor.
_PLAIN_COPY = {"layout": (None, torch.strided), "device": (None, torch.device("cpu"), "cpu"),
               "pin_memory": (None, False), "non_blocking": (False,),
               "memory_format": (None, torch.preserve_format, torch.contiguous_format)}


def _updated_inputs(gm: GraphModule) -> set[str]:
    """Placeholders the graph writes (``copy_`` into them: an input mutation AOTAutograd kept in the graph)."""
    return {n.args[0].name for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.copy_.default
            and isinstance(n.args[0], Node) and n.args[0].op == "placeholder"}


def _frozen(primals: list[Node], static: Collection[int], needs_grad: list[bool], updated: set[str]) -> frozenset[str]:
    return frozenset(node.name for position, (node, grad) in enumerate(zip(primals, needs_grad, strict=True))
                     if position in static and not grad and node.name not in updated
                     and isinstance(node.meta.get("val"), torch.Tensor) and node.meta["val"].dtype.is_floating_point)


def frozen_in_partition(fw: GraphModule, bw: GraphModule, static: Collection[int]) -> frozenset[str]:
    """Names of the frozen placeholders of a partitioned forward ``fw``: static inputs (parameters
    and buffers, ``static``: their positions) that get no gradient (the backward returns None for
    them), that the forward does not update and that hold floating-point values. Empty when the
    backward's outputs do not line up with the forward's inputs."""
    primals = _placeholders(fw)
    gradients = _output_values(bw)
    if len(gradients) != len(primals):
        _log.debug("torch_adreno: %d gradients for %d forward inputs: frozen casts stay in the graphs",
                   len(gradients), len(primals))
        return frozenset()
    return _frozen(primals, static, [g is not None for g in gradients], _updated_inputs(fw))


def frozen_in_inference(gm: GraphModule) -> frozenset[str]:
    """Names of the frozen placeholders of an inference graph: static inputs that require no grad
    (AOTAutograd's metadata, on the tracing context while the graph compiles), that the graph does
    not update and that hold floating-point values. Empty without metadata that lines up with the
    graph's inputs."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    info = list(getattr(meta, "input_info", ()))
    primals = _placeholders(gm)
    if meta is None or len(primals) != len(info):
        return frozenset()
    static = set(getattr(meta, "static_input_indices", None) or ())
    return _frozen(primals, static, [i.requires_grad for i in info], _updated_inputs(gm))


def narrowing_cast(node: Node) -> torch.dtype | None:
    """The dtype ``node`` casts its input to, if it is a plain cast of a tensor wider than 16
    bits to float16 or bfloat16; else None."""
    if node.op != "call_function" or node.target not in CASTS or not isinstance(node.args[0], Node):
        return None
    if node.target is aten._to_copy.default:
        if len(node.args) != 1 or any(k != "dtype" and v not in _PLAIN_COPY.get(k, ()) for k, v in node.kwargs.items()):
            return None
        dtype = node.kwargs.get("dtype")
    else:
        dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    source = node.args[0].meta.get("val")
    if not isinstance(dtype, torch.dtype) or dtype not in COPY_DTYPES or not isinstance(source, torch.Tensor) \
            or source.element_size() <= 2:
        return None
    return dtype


def _placeholders(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _output(gm: GraphModule) -> Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def _output_values(gm: GraphModule) -> list[Any]:
    values: Any = _output(gm).args[0]
    return list(values) if isinstance(values, list | tuple) else [values]


def _add_copy_placeholder(gm: GraphModule, source: Node, dtype: torch.dtype, example: Node | None) -> Node:
    """A placeholder after the last one, for ``source``'s ``dtype`` copy (its value: ``example``'s, a
    cast node's, else ``source``'s as ``dtype``)."""
    last = _placeholders(gm)[-1]
    with gm.graph.inserting_after(last):
        node = gm.graph.placeholder(f"{source.name}_as_{str(dtype).removeprefix('torch.')}")
    if example is not None:
        node.meta.update(example.meta)
    else:
        node.meta["val"] = source.meta["val"].to(dtype)
    node.meta.pop("recompute", None)
    return node


def split_frozen_casts(gm: GraphModule, frozen: Collection[str],
                       wanted: Collection[tuple[str, torch.dtype]] = ()) -> tuple[FrozenCopyInputs, dict[Any, Node]]:
    """Replace each narrowing cast of a ``frozen`` placeholder of ``gm`` by a placeholder of its
    own, the copy (one per source and dtype); ``wanted``: (source name, dtype) pairs to give a copy
    placeholder even if ``gm`` does not cast them. Returns what the runtime appends to the graph's
    arguments and the copy placeholders by (source name, dtype)."""
    placeholders = _placeholders(gm)
    position = {n.name: i for i, n in enumerate(placeholders)}
    casts: dict[tuple[str, torch.dtype], list[Node]] = {}
    for node in gm.graph.nodes:
        dtype = narrowing_cast(node)
        if dtype is not None and node.args[0].op == "placeholder" and node.args[0].name in frozen:
            casts.setdefault((node.args[0].name, dtype), []).append(node)
    for pair in wanted:
        casts.setdefault(pair, [])
    if not casts:
        return NO_FROZEN_COPIES, {}
    by_name = {n.name: n for n in placeholders}
    copies: dict[Any, Node] = {}
    for (name, dtype), nodes in casts.items():
        copy = _add_copy_placeholder(gm, by_name[name], dtype, nodes[0] if nodes else None)
        copies[(name, dtype)] = copy
        for cast in nodes:
            cast.replace_all_uses_with(copy)
            gm.graph.erase_node(cast)
    gm.graph.lint()
    gm.recompile()
    spec = FrozenCopyInputs(tuple((position[name], dtype) for name, dtype in casts), len(placeholders))
    return spec, copies


def _backward_casts(bw: GraphModule, name: str) -> torch.dtype | None:
    """The one dtype the backward's placeholder ``name`` is cast to, if casts are its only uses."""
    node = next((n for n in _placeholders(bw) if n.name == name), None)
    if node is None or not node.users:
        return None
    dtypes = {narrowing_cast(user) for user in node.users}
    return dtypes.pop() if len(dtypes) == 1 and None not in dtypes else None


def split_partitioned(fw: GraphModule, bw: GraphModule, num_fwd_outputs: int,
                      frozen: Collection[str]) -> tuple[FrozenCopyInputs, FrozenCopyInputs]:
    """:func:`split_frozen_casts` over a partitioned forward and backward; a frozen input the
    forward saves and the backward only casts is saved as its copy (see the module docstring).
    Returns what the runtime appends to the forward's and the backward's arguments."""
    if not frozen:
        return NO_FROZEN_COPIES, NO_FROZEN_COPIES
    output = _output(fw)
    outputs = _output_values(fw)
    saved = {i: node for i, node in enumerate(outputs) if i >= num_fwd_outputs and isinstance(node, Node)
             and node.op == "placeholder" and node.name in frozen}
    swaps: dict[int, tuple[str, torch.dtype]] = {}
    for i, node in saved.items():
        dtype = _backward_casts(bw, node.name)
        if dtype is not None:
            swaps[i] = (node.name, dtype)
    forward, copies = split_frozen_casts(fw, frozen, wanted=set(swaps.values()))
    for i, pair in swaps.items():
        outputs[i] = copies[pair]
    output.args = (tuple(outputs), *output.args[1:])
    swapped = {pair[0]: pair for pair in swaps.values()}
    for node in _placeholders(bw):
        if node.name not in swapped:
            continue
        copy = copies[swapped[node.name]]
        node.meta.update({k: v for k, v in copy.meta.items() if k in ("val", "tensor_meta")})
        for cast in list(node.users):
            cast.replace_all_uses_with(node)
            bw.graph.erase_node(cast)
    bw.graph.lint()
    bw.recompile()
    fw.recompile()
    # Casts the backward still makes of frozen inputs it gets in float32 (it also reads them so).
    backward, _ = split_frozen_casts(bw, frozen)
    _unbind_unread(fw, frozen)
    _unbind_unread(bw, frozen)
    return forward, backward


def _unbind_unread(gm: GraphModule, frozen: Collection[str]) -> None:
    """A frozen placeholder no node reads any more is lowered as a non-tensor input: the runtime
    binds (and, in copy mode, uploads) nothing for it. Its argument is still passed (to the copy)."""
    for node in _placeholders(gm):
        if node.name in frozen and not node.users:
            node.meta["val"] = None


def split_inference(gm: GraphModule) -> FrozenCopyInputs:
    """:func:`split_frozen_casts` over an inference graph (no backward): what the runtime appends
    to its arguments."""
    frozen = frozen_in_inference(gm)
    spec, _ = split_frozen_casts(gm, frozen)
    _unbind_unread(gm, frozen)
    return spec
