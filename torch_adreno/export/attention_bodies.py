"""ONNX bodies of the fused attention templates (``lowering/attention.py``): what each pass
computes, in standard ONNX ops over the whole [batch, heads, queries, keys] scores (an ONNX
runtime has no flash kernel to call; the body states the function, not the kernel's blocking).

Values are flat (as every kernel body's, see ``kernel_bodies.py``); operands are read through
their views with the same gathers a generated kernel's body uses.
"""

from __future__ import annotations

import numpy as np

from torch_adreno import ir
from torch_adreno.export.kernel_bodies import Body, Grid, flat, full
from torch_adreno.ir import DType
from torch_adreno.lowering.attention import FORWARD, GRAD_KEY_VALUE, GRAD_QUERY

_NAMES = ("b", "h", "s", "d")


def _operand(body: Body, view: ir.View, values: dict[str, str], shapes: dict[str, ir.Buffer], kernel: str) -> str:
    """``view`` as a float32 tensor of its shape."""
    vars_ = tuple(ir.loop_var(n, size) for n, size in zip(_NAMES, view.shape, strict=False))
    grid = Grid(body, {n: a for a, n in enumerate(_NAMES[:len(view.shape)])}, len(view.shape), values, shapes, kernel)
    return full(body, grid.emit(ir.cast(view.load(vars_), DType.F32)), view.shape)


def _per_query_head(body: Body, t: str, shape: tuple[int, ...], group: int) -> str:
    """Key/value heads [b, kv, n, d] repeated to the query heads [b, kv * group, n, d] (head h reads h // group)."""
    if group == 1:
        return t
    b, kv, n, d = shape
    spread = body.op("Expand", [body.op("Unsqueeze", [t, body.ints([2])]), body.ints([b, kv, group, n, d])])
    return body.op("Reshape", [spread, body.ints([b, kv * group, n, d])])


def _per_key_head(body: Body, t: str, shape: tuple[int, ...], group: int) -> str:
    """Gradients of the query heads [b, kv * group, n, d] summed per key/value head."""
    if group == 1:
        return t
    b, kv, n, d = shape
    grouped = body.op("Reshape", [t, body.ints([b, kv, group, n, d])])
    return body.op("ReduceSum", [grouped, body.ints([2])], keepdims=0)


def _scores(body: Body, q: str, k: str, queries: int, keys: int, scale: float, causal: bool) -> str:
    transposed = body.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = body.op("Mul", [body.op("MatMul", [q, transposed]), body.constant(scale, DType.F32)], "scores")
    if not causal:
        return scores
    hidden = np.triu(np.full((queries, keys), -np.inf, dtype=np.float32), 1)  # query i sees keys 0..i
    return body.op("Add", [scores, body.constant(hidden, DType.F32)], "masked")


def _stored(body: Body, value: str, buffer: ir.Buffer) -> str:
    return flat(body, value if buffer.dtype is DType.F32 else body.cast(value, buffer.dtype))


def attention_body(body: Body, node: ir.TemplateOp, values: dict[str, str], shapes: dict[str, ir.Buffer],
                   kernel: str) -> dict[str, str]:
    """The flat value of each output of ``node``."""
    group, scale, causal = node.attribute("group"), node.attribute("scale"), node.attribute("causal")
    views = node.inputs if node.target == FORWARD else node.inputs[1:4]
    q, k, v = (_operand(body, view, values, shapes, kernel) for view in views)
    kv_shape = views[1].shape
    k, v = (_per_query_head(body, t, kv_shape, group) for t in (k, v))
    queries, keys = views[0].shape[2], kv_shape[2]
    scores = _scores(body, q, k, queries, keys, scale, causal)
    outputs = [shapes[name] for name in node.outputs]
    if node.target == FORWARD:
        probabilities = body.op("Softmax", [scores], axis=-1)
        out = body.op("MatMul", [probabilities, v])
        lse = body.op("ReduceLogSumExp", [scores, body.ints([-1])], keepdims=0)
        return {outputs[0].name: _stored(body, out, outputs[0]), outputs[1].name: flat(body, lse)}
    grad_out = _operand(body, node.inputs[0], values, shapes, kernel)
    lse, delta = (body.op("Unsqueeze", [_operand(body, view, values, shapes, kernel), body.ints([3])])
                  for view in node.inputs[4:6])
    probabilities = body.op("Exp", [body.op("Sub", [scores, lse])])
    grad_p = body.op("MatMul", [grad_out, body.op("Transpose", [v], perm=[0, 1, 3, 2])])
    grad_scores = body.op("Mul", [probabilities, body.op("Sub", [grad_p, delta])], "grad_scores")
    scale_value = body.constant(scale, DType.F32)
    if node.target == GRAD_QUERY:
        grad_q = body.op("Mul", [body.op("MatMul", [grad_scores, k]), scale_value])
        return {outputs[0].name: _stored(body, grad_q, outputs[0])}
    assert node.target == GRAD_KEY_VALUE
    grad_k = body.op("Mul", [body.op("MatMul", [body.op("Transpose", [grad_scores], perm=[0, 1, 3, 2]), q]),
                             scale_value])
    grad_v = body.op("MatMul", [body.op("Transpose", [probabilities], perm=[0, 1, 3, 2]), grad_out])
    return {outputs[0].name: _stored(body, _per_key_head(body, grad_k, kv_shape, group), outputs[0]),
            outputs[1].name: _stored(body, _per_key_head(body, grad_v, kv_shape, group), outputs[1])}
