"""Eager's operand checks that fake tensors skip, replayed before an op is lowered.

Dynamo and AOTAutograd trace with fake tensors, which run each op's meta function. Meta functions
check shapes, but some of eager's CPU kernels also check operand dtypes their meta functions let
through: ``mm`` of an int64 and a float32 matrix traces (the meta result is int64) and fails in
eager with "expected m1 and m2 to have the same dtype". A lowering handed such a node would
compute something; eager refuses. For the ops listed in :data:`EAGER_DTYPE_CHECKED` the lowering
dispatch therefore replays eager's own kernel, on the CPU with zero-filled tensors of the node's
shapes and dtypes, whenever the operands are not all float32 (the form every lowering is written
for), and raises what eager raises: the same exception type and eager's message, followed by the
FX node and the user's source line. Eager's kernel is the judge, so the check can neither refuse
what eager accepts nor word its refusal differently; it costs one small CPU call per such node at
compile time, and nothing for float32 graphs.

``python -m torch_adreno opinfo --error-inputs`` finds the ops that belong here: it runs every
claimed op with mixed-dtype operands and OpInfo's error inputs, eager vs compiled.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node
from torch.utils._pytree import tree_map

from torch_adreno.errors import LoweringError
from torch_adreno.lowering.context import user_source

aten = torch.ops.aten

#: ATen ops whose eager CPU kernels check operand dtypes, with meta functions that check less: on
#: torch 2.13 fake tensors accept an int64 operand beside float32 ones for mm, addmm, mv,
#: index_put and index_add (found by the error-input sweep). The other matrix products and the
#: convolutions are listed too: their meta functions check today, and the replay costs nothing
#: for float32 operands, so a meta function that stops checking cannot reopen the hole.
EAGER_DTYPE_CHECKED = frozenset({
    aten.mm.default, aten.addmm.default, aten.mv.default, aten.index_put.default, aten.index_add.default,
    aten.bmm.default, aten.baddbmm.default, aten.addmv.default, aten.dot.default,
    aten.convolution.default, aten.convolution_backward.default,
})


_ERROR_TYPES: dict[type[BaseException], type[LoweringError]] = {}


def eager_error_type(error_type: type[BaseException]) -> type[LoweringError]:
    """A LoweringError that is also ``error_type``, so ``except error_type`` catches it as it
    would catch eager's, and Dynamo hands it to the user unwrapped (see torch_adreno.errors)."""
    if issubclass(LoweringError, error_type):
        return LoweringError
    if error_type not in _ERROR_TYPES:
        _ERROR_TYPES[error_type] = _mixed_error_type(error_type)
    return _ERROR_TYPES[error_type]


def _mixed_error_type(error_type: type[BaseException]) -> type[LoweringError]:
    try:
        return type(error_type.__name__, (LoweringError, error_type), {
            "__module__": __name__,
            "__doc__": f"Eager raises {error_type.__name__} for this input; so does the adreno backend."})
    except TypeError:  # a layout that cannot be combined (a C-level exception with extra fields)
        return LoweringError


def check_like_eager(node: Node, graph_name: str) -> None:
    """Raise what eager raises for ``node``'s operand dtypes (see the module docstring)."""
    if node.target not in EAGER_DTYPE_CHECKED:
        return
    metas = [a.meta.get("val") for a in node.all_input_nodes]
    dtypes = {v.dtype for v in metas if isinstance(v, torch.Tensor)}
    if dtypes <= {torch.float32}:
        return

    def real(arg: Any) -> Any:
        val = arg.meta.get("val") if isinstance(arg, Node) else arg
        if isinstance(val, torch.Tensor):
            return torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype)
        return val

    with unset_fake_temporarily():
        args = tree_map(real, node.args)
        kwargs = tree_map(real, dict(node.kwargs))
        try:
            node.target(*args, **kwargs)
        except Exception as err:
            source = user_source(node)
            where = f"\n  (FX node '{node.name}', {node.target}, in graph {graph_name}"
            where += f"; from your code: {source})" if source else ")"
            raise eager_error_type(type(err))(f"{err}{where}") from None
