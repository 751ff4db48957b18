"""The project's loop-level IR: buffers, expressions, views as index maps, and kernel-sized nodes.

Lowering builds an :class:`Graph` from an FX graph; fusion, memory planning and code generation
read it. The IR knows nothing of torch or OpenCL.

Invariants
----------
* Every :class:`Buffer` is dense and row-major (contiguous) over its ``shape``.
* A :class:`Load` indexes its buffer with one index expression per dimension of that buffer.
* Views never copy: a :class:`View` maps its own index space to a multi-index of its buffer.
* Every node writes every element of its output buffer exactly once.
* Index arithmetic (``DType.INDEX``) is done on non-negative values wherever a result is used;
  a negative intermediate may only appear under a ``where`` that discards it.
"""

from __future__ import annotations

from torch_adreno.ir.expr import (
    OPS,
    Call,
    Const,
    DType,
    Expr,
    Load,
    OpInfo,
    Var,
    bounds,
    call,
    cast,
    const,
    index,
    linear_terms,
    loads,
    loop_var,
    rewrite,
    round_to,
    substitute,
    walk,
    where,
)
from torch_adreno.ir.graph import (
    GEMM_VARS,
    REDUCE_OPS,
    Buffer,
    Gemm,
    Graph,
    GraphOutput,
    HostOp,
    IndexCheck,
    Node,
    Origin,
    OutputRole,
    Pointwise,
    Reduction,
    TemplateOp,
    format_graph,
    node_inputs,
    node_outputs,
)
from torch_adreno.ir.view import View, contiguous_strides, placeholder_vars

__all__ = [
    "GEMM_VARS", "OPS", "REDUCE_OPS", "Buffer", "Call", "Const", "DType", "Expr", "Gemm", "Graph", "GraphOutput",
    "HostOp", "IndexCheck", "Load", "Node", "OpInfo", "Origin", "OutputRole", "Pointwise", "Reduction", "TemplateOp", "Var", "View", "bounds",
    "call", "cast", "const", "contiguous_strides", "format_graph", "index",
    "linear_terms", "loads", "loop_var", "node_inputs",
    "node_outputs", "placeholder_vars", "rewrite", "round_to", "substitute", "walk", "where",
]
