"""Eager's operand checks that fake tensors skip, replayed before an op is lowered.

Dynamo and AOTAutograd trace with fake tensors, which run each op's meta function. Meta functions
check shapes, but some of eager's CPU kernels also check operand dtypes their meta functions let
through: ``mm`` of an int64 and a float32 matrix traces (the meta result is int64) and fails in
eager with "expected m1 and m2 to have the same dtype". A lowering handed such a node would
compute something; eager refuses. For the ops listed in :data:`EAGER_DTYPE_CHECKED` the lowering
dispatch therefore replays eager's own kernel, on the CPU with zero-filled tensors of the node's
shapes and dtypes, whenever the operands are not all float32 (the form every lowering is written
for), and raises what eager raises: the same exception type and eager's message, followed by the
FX node and the user's source line. Any other op is replayed where its operands are all integers
or booleans (eager's kernels for pooling, say, have no integer form). Eager's kernel is the judge, so the check can neither refuse
what eager accepts nor word its refusal differently; it costs one small CPU call per such node at
compile time, and nothing for float32 graphs.

``python -m torch_adreno opinfo --error-inputs`` finds the ops that belong here: it runs every
claimed op with mixed-dtype operands and OpInfo's error inputs, eager vs compiled.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from torch_adreno.errors import LoweringError, UnsupportedOpError
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
    # Eager copies the source into the destination's dtype; the meta function returns the source's.
    aten.select_scatter.default, aten.slice_scatter.default,
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
    def value(arg: Any) -> Any:
        return arg.meta.get("val") if isinstance(arg, Node) else arg

    args, kwargs = tree_map(value, node.args), tree_map(value, dict(node.kwargs))
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if node.target not in EAGER_DTYPE_CHECKED and (not tensors or any(t.is_floating_point() for t in tensors)):
        # Integer-only operands are replayed for every op (eager has no integer kernel for
        # pooling or softmax); they are small index arithmetic in float models, and cheap.
        return
    results: list[Any] = []
    error = eager_refusal(node.target, args, kwargs, results)
    source = user_source(node)
    where = f"\n  (FX node '{node.name}', {node.target}, in graph {graph_name}"
    where += f"; from your code: {source})" if source else ")"
    if error is not None:
        raise eager_error_type(type(error))(f"{error}{where}") from None
    traced = [v.dtype for v in tree_flatten(node.meta.get("val"))[0] if isinstance(v, torch.Tensor)]
    eager = [v.dtype for v in tree_flatten(results)[0] if isinstance(v, torch.Tensor)]
    if results and traced != eager:
        # The op's meta function (or a decomposition) gives another result dtype than eager's
        # kernel: the graph was traced for a result eager would not produce.
        raise UnsupportedOpError(
            f"eager's {node.target} returns {', '.join(map(str, eager))} for these operands where the traced "
            f"graph expects {', '.join(map(str, traced))}; cast the operands to one dtype{where}")


def eager_refusal(op: Any, args: Any, kwargs: Any, results: list[Any] | None = None) -> Exception | None:
    """The exception eager's CPU kernel of ``op`` raises for operands of these shapes and dtypes
    (``args`` and ``kwargs`` may hold fake tensors), or None. Runs nothing where every tensor
    operand is float32, nor for random ops (a replay would advance the user's generator).

    The operands are replayed filled with zeros, and, where that raises, with ones: an error both
    fillings raise does not come from the values (a zero divisor, an index past a size-1 dimension)
    but from what the op was given. Where the replay succeeds, its result is appended to ``results``.
    """
    leaves = tree_flatten((args, kwargs))[0]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if all(t.dtype == torch.float32 for t in tensors) or torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()):
        return None
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    if any(isinstance(v, symbolic) for v in leaves) or any(isinstance(s, symbolic) for t in tensors for s in t.shape):
        return None  # reading a symbolic size would specialise it; static shapes are what we compile
    first: Exception | None = None
    for fill in (0, 1):
        def real(arg: Any, fill: int = fill) -> Any:
            if isinstance(arg, torch.Tensor):
                return torch.full(tuple(int(s) for s in arg.shape), fill, dtype=arg.dtype)
            return arg

        # Outside every dispatch mode: AOTAutograd's fake mode, and its tracer, which would
        # otherwise record the replay in the graph it is making.
        with _disable_current_modes():
            try:
                result = op(*tree_map(real, args), **tree_map(real, kwargs))
                if results is not None:
                    results.append(result)
                return None
            except Exception as err:
                first = first or err
    return first


def with_eager_checks(op: Any, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """``decomposition`` of ``op``, refusing first what eager's kernel of ``op`` refuses.

    Decompositions are written for valid operands: softmax of an int64 tensor decomposes into ops
    that all accept int64, where eager's softmax kernel raises NotImplementedError.
    """
    @functools.wraps(decomposition)
    def checked(*args: Any, **kwargs: Any) -> Any:
        results: list[Any] = []
        error = eager_refusal(op, args, kwargs, results)
        if error is not None:
            raise eager_error_type(type(error))(f"{error}\n  ({op}, as eager raises it)") from None
        if results and _mixed_half(args, kwargs):
            out = _in_float32(decomposition, results, args, kwargs)
        else:
            out = decomposition(*args, **kwargs)
            if results and any(isinstance(t, torch.Tensor) and t.dtype in _HALF for t in tree_flatten((args, kwargs))[0]):
                # (a 16-bit batch norm: eager's kernel gives its running statistics the input's
                # type, PyTorch's decomposition its float32 computation type)
                out = _with_eager_float_dtypes(out, results)
        ours = [v.dtype for v in tree_flatten(out)[0] if isinstance(v, torch.Tensor)]
        eager = [v.dtype for v in tree_flatten(results)[0] if isinstance(v, torch.Tensor)]
        # (eager gives None where an output mask asks for no result, the decompositions a tensor:
        # results of another count are not compared)
        if results and len(ours) == len(eager) and ours != eager:
            raise UnsupportedOpError(
                f"the adreno backend cannot run {op} for these operands: eager returns "
                f"{', '.join(map(str, eager))} where its decomposition gives {', '.join(map(str, ours))}; "
                "cast the operands to one dtype")
        return out

    return checked


_HALF = (torch.float16, torch.bfloat16)


def _mixed_half(args: Any, kwargs: Any) -> bool:
    """Whether the float operands mix a 16-bit type with float32 (autocast's batch norm: a float16
    input with float32 weights and statistics), where eager computes in float32."""
    floats = {t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.is_floating_point()}
    return bool(floats & set(_HALF)) and torch.float32 in floats


def _in_float32(decomposition: Callable[..., Any], eager_results: list[Any], args: Any, kwargs: Any) -> Any:
    """``decomposition`` run on float32 copies of the 16-bit operands, each result converted to the
    dtype eager's kernel gives it: eager's mixed-precision kernels compute in float32 and round only
    their 16-bit results (PyTorch's decompositions would round saved statistics to the input's type)."""
    def widen(v: Any) -> Any:
        return v.to(torch.float32) if isinstance(v, torch.Tensor) and v.dtype in _HALF else v

    return _with_eager_float_dtypes(decomposition(*tree_map(widen, args), **tree_map(widen, kwargs)), eager_results)


def _with_eager_float_dtypes(out: Any, eager_results: list[Any]) -> Any:
    """``out`` with each floating-point result converted to the floating type eager gives it."""
    flat, spec = tree_flatten(out)
    eager = [v for v in tree_flatten(eager_results[0])[0]]
    if len(eager) != len(flat):
        return out
    converted = [v.to(e.dtype) if isinstance(v, torch.Tensor) and isinstance(e, torch.Tensor) and v.dtype != e.dtype
                 and v.is_floating_point() and e.is_floating_point() else v for v, e in zip(flat, eager, strict=True)]
    return tree_unflatten(converted, spec)


def data_dependent_shape_error(gm: Any, err: Exception) -> UnsupportedOpError:
    """A clear error for a graph whose shapes depend on tensor values (``nonzero``, ``.item()``
    sizes, ``tensor_split`` at tensor indices): AOTAutograd stops on them with a guard error, and
    the backend compiles static shapes only. Names the first op making a data-dependent value."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    culprit = next((n for n in gm.graph.nodes if n.op == "call_function"
                    and free_unbacked_symbols(n.meta.get("example_value", n.meta.get("val")))), None)
    what = f"{culprit.target} (FX node '{culprit.name}')" if culprit is not None else "an op of this graph"
    source = user_source(culprit) if culprit is not None else None
    where = f"\n  from your code: {source}" if source else ""
    return UnsupportedOpError(
        f"the adreno backend cannot run {what}: the shape of its result depends on tensor values, and the "
        f"backend compiles static shapes only ({type(err).__name__}).{where}\n"
        "How to proceed: compute the sizes outside the compiled function, or let Dynamo break the graph "
        "there (torch._dynamo.config.capture_dynamic_output_shape_ops = False, the default, "
        "and capture_scalar_outputs = False).")
