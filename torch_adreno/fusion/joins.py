"""The join rules: whether a node can be computed in an open kernel, and how the kernel grows.

Each ``join_*`` function either extends ``kernel``'s spec with ``node`` (stores, accumulators,
phases), records what the kernel now holds, accepts the node in ``assembly`` and returns None, or
returns the reason it cannot and leaves the kernel untouched. The one exception is
:func:`promote_to_reduction`, which rewrites a pointwise kernel into a reduction kernel's inner
stage before :func:`join_reduction` adds the reduction; that rewrite stands (and is logged) even
when the join that follows refuses, as the rewritten kernel computes the same values.

Which rule applies to which pair of node and kernel is the scheduler's choice (``schedule.py``).
"""

from __future__ import annotations

import math

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.groups import Assembly, OpenKernel
from torch_adreno.fusion.specs import (
    Accumulator,
    GemmKernel,
    Phase,
    PointwiseKernel,
    ReductionKernel,
    Store,
)


def _unravel(linear: ir.Expr, shape: tuple[int, ...]) -> list[ir.Expr]:
    out = []
    for size, stride in zip(shape, ir.contiguous_strides(shape), strict=True):
        out.append(ir.call("mod", ir.call("floordiv", linear, ir.index(stride)), ir.index(size)))
    return out


# -- onto a GEMM kernel ---------------------------------------------------------------------------


def join_gemm_epilogue(assembly: Assembly, node: ir.Pointwise, kernel: OpenKernel, spec: GemmKernel) -> str | None:
    gemm = spec.gemm
    out_shape = assembly.graph.buffers[gemm.output].shape
    if node.ranges != out_shape:
        return f"its shape {list(node.ranges)} differs from the GEMM result's {list(out_shape)}"
    mapping = {v: e for v, e in zip(node.loop_vars, gemm.out_index, strict=True) if isinstance(v, ir.Var)}
    for ld in ir.loads(node.body):
        if ld.buffer == gemm.output and tuple(ld.index) != tuple(node.loop_vars):
            return "it reads the GEMM result at a different element than it writes"
    value = kernel.resolve(ir.substitute(node.body, mapping))
    if isinstance(value, str):
        return value
    spec.stores.append(Store(node.output, gemm.out_index, value))
    kernel.held[node.output] = gemm.out_index
    kernel.values[node.output] = value
    kernel.reads_from_outside(node)
    assembly.accept(node, kernel, "GEMM epilogue: applied to each result before it is stored")
    return None


def join_gemm_column(assembly: Assembly, node: ir.Reduction, kernel: OpenKernel, spec: GemmKernel) -> str | None:
    """Sum the GEMM's left operand over k in the GEMM kernel itself, from the operand values it
    loads anyway: a bias gradient computed beside its weight gradient (horizontal fusion)."""
    g = spec.gemm
    if node.reduce_op != "sum" or not node.body.dtype.is_float:
        return "only a float sum can ride on a GEMM"
    if spec.row_sum is not None:
        return "the GEMM already carries a row reduction"
    if math.prod(node.ranges) != g.batch * g.m or node.reduction_numel != g.k:
        return (f"it reduces {math.prod(node.ranges)} rows of {node.reduction_numel}, the GEMM has "
                f"{g.batch * g.m} of {g.k}")
    v = g.vars()
    rows = ir.call("add", ir.call("mul", v["b"], ir.index(g.m)), v["m"])
    row_index = _unravel(rows, node.ranges)
    mapping = dict(zip(node.loop_vars, row_index, strict=True))
    mapping.update(zip(node.reduction_vars, _unravel(v["k"], node.reduction_ranges), strict=True))
    body = ir.substitute(node.body, {a: b for a, b in mapping.items() if isinstance(a, ir.Var)})
    if ir.cast(body, g.lhs.dtype) != g.lhs:
        return "it does not sum the GEMM's left operand"
    spec.row_sum = Store(node.output, tuple(row_index), ir.Load(node.output, tuple(row_index),
                                                                   assembly.dtype(node.output)))
    kernel.held[node.output] = None
    kernel.reads_from_outside(node)
    assembly.accept(node, kernel, "row reduction of the GEMM's left operand, summed in the GEMM kernel from the "
                                  "operand values it loads (horizontal fusion: one pass over the shared input)")
    return None


# -- onto a pointwise kernel ----------------------------------------------------------------------


def join_pointwise(assembly: Assembly, node: ir.Pointwise, kernel: OpenKernel, spec: PointwiseKernel) -> str | None:
    squeezed = [s for s in node.ranges if s != 1]
    if squeezed != [s for s in spec.ranges if s != 1]:
        return f"its shape {list(node.ranges)} differs from the kernel's {list(spec.ranges)}"
    # Same elements up to size-1 dimensions: the node's variables are the kernel's, in order.
    mapping = dict(zip([v for v in node.loop_vars if isinstance(v, ir.Var)],
                       [v for v in spec.loop_vars if isinstance(v, ir.Var)], strict=True))
    index = tuple(ir.substitute(v, mapping) for v in node.loop_vars)
    value = kernel.resolve(ir.substitute(node.body, mapping))
    if isinstance(value, str):
        return value
    spec.stores.append(Store(node.output, index, value))
    kernel.held[node.output] = index
    kernel.values[node.output] = value
    kernel.reads_from_outside(node)
    assembly.accept(node, kernel, "same shape: computed by the same work-items (pointwise fusion)")
    return None


def promote_to_reduction(assembly: Assembly, node: ir.Reduction, kernel: OpenKernel,
                         spec: PointwiseKernel) -> str | None:
    """Turn a pointwise kernel into the inner stage of ``node``'s reduction kernel, when ``node``
    reduces exactly what the kernel computes (a bias gradient summed from the masked gradient
    the kernel writes): each element is then computed once, stored, and summed in a register."""
    for ld in ir.loads(node.body):
        if ld.buffer in kernel.held and kernel.held[ld.buffer] is not None:
            index = ld.index
            break
    else:
        return "it reads no result of the kernel"
    if math.prod(spec.ranges) != math.prod(node.ranges) * node.reduction_numel:
        return "the kernel's elements do not match the reduction's loops"
    held_index = kernel.held[ld.buffer]
    assert held_index is not None
    mapping: dict[ir.Var, ir.Expr] = {}
    for own, target in zip(held_index, index, strict=True):
        if isinstance(own, ir.Const):
            continue
        assert isinstance(own, ir.Var)
        if not isinstance(target, ir.Var) or target in mapping.values() or target.size != own.size:
            return "it reads the kernel's result at computed positions"
        mapping[own] = target
    targets = set(mapping.values())
    loop_vars = {v for v in [*node.loop_vars, *node.reduction_vars] if isinstance(v, ir.Var)}
    if targets != loop_vars:
        return "it does not read each element of the kernel's result exactly once"
    stores = [Store(st.buffer, tuple(ir.substitute(e, mapping) for e in st.index), ir.substitute(st.value, mapping))
              for st in spec.stores]
    kernel.spec = ReductionKernel(node.ranges, node.reduction_ranges, [Phase([], stores)], [])
    kernel.values = {b: ir.substitute(v, mapping) for b, v in kernel.values.items()}
    kernel.held = {b: (tuple(ir.substitute(e, mapping) for e in idx) if idx is not None else None)
                   for b, idx in kernel.held.items()}
    assembly.decisions.append(Decision(kernel.label, node.name, True,
                                       "pointwise kernel became the inner stage of this reduction (horizontal fusion)"))
    return None


# -- onto a reduction kernel ----------------------------------------------------------------------


def _phase(spec: ReductionKernel, phase: int) -> Phase:
    """Pass ``phase`` of the kernel, adding empty passes up to it."""
    while len(spec.phases) <= phase:
        spec.phases.append(Phase())
    return spec.phases[phase]


def join_reduction(assembly: Assembly, node: ir.Reduction, kernel: OpenKernel, spec: ReductionKernel) -> str | None:
    if (node.ranges, node.reduction_ranges) != (spec.outer, spec.inner):
        return (f"its loops {list(node.ranges)} x {list(node.reduction_ranges)} differ from the kernel's "
                f"{list(spec.outer)} x {list(spec.inner)}")
    value = kernel.resolve(node.body)
    if isinstance(value, str):
        return value
    phase = kernel.phase_after(value)
    _phase(spec, phase).accumulators.append(Accumulator(node.output, node.reduce_op, value, assembly.dtype(node.output)))
    kernel.held[node.output] = spec.loop_vars
    kernel.phase_of[node.output] = phase
    kernel.reads_from_outside(node)
    assembly.accept(node, kernel, f"same loops: reduced in pass {phase + 1} of the kernel")
    return None


def join_reduction_pointwise(assembly: Assembly, node: ir.Pointwise, kernel: OpenKernel,
                             spec: ReductionKernel) -> str | None:
    mapping = _map_onto_reduction(node, kernel, spec)
    if isinstance(mapping, str):
        return mapping
    mapped_vars = tuple(ir.substitute(v, mapping) for v in node.loop_vars)
    value = kernel.resolve(ir.substitute(node.body, mapping))
    if isinstance(value, str):
        return value
    outer = math.prod(node.ranges) == math.prod(spec.outer)
    if outer:
        spec.outer_stores.append(Store(node.output, mapped_vars, value))
        kernel.held[node.output] = mapped_vars
        kernel.values[node.output] = value
        how = "reduction epilogue: computed once per reduced row"
    else:
        phase = kernel.phase_after(value)
        _phase(spec, phase).stores.append(Store(node.output, mapped_vars, value))
        kernel.held[node.output] = None
        how = f"reduction inner stage: computed over each row in pass {phase + 1}"
    kernel.reads_from_outside(node)
    assembly.accept(node, kernel, how)
    return None


def _map_onto_reduction(node: ir.Pointwise, kernel: OpenKernel, spec: ReductionKernel) -> dict[ir.Var, ir.Expr] | str:
    """Node loop variables -> the kernel's outer (i*) and inner (r*) variables, found from how
    the node reads the kernel's per-row results."""
    row_results = {b for b, idx in kernel.held.items() if idx is not None and tuple(idx) == tuple(spec.loop_vars)}
    by_outer_dim: dict[int, ir.Var] = {}
    for ld in ir.loads(node.body):
        if ld.buffer not in row_results:
            continue
        for d, e in enumerate(ld.index):
            if spec.outer[d] == 1:
                continue
            if not isinstance(e, ir.Var) or by_outer_dim.get(d, e) != e:
                return "it reads the kernel's per-row results at computed positions"
            by_outer_dim[d] = e
    if not by_outer_dim and any(s > 1 for s in spec.outer):
        return "it reads no per-row result of the kernel, so its rows cannot be matched"
    outer_vars = [v for v in spec.loop_vars if isinstance(v, ir.Var)]
    if len(by_outer_dim) != len(outer_vars):
        return "it does not cover every outer dimension of the kernel"
    mapping: dict[ir.Var, ir.Expr] = {}
    for d, var in by_outer_dim.items():
        target = spec.loop_vars[d]
        assert isinstance(target, ir.Var)
        if var.size != target.size:
            return "its sizes do not match the kernel's outer loop"
        mapping[var] = target
    rest = [v for v in node.loop_vars if isinstance(v, ir.Var) and v not in mapping]
    if not rest:
        return mapping
    inner_vars = [v for v in spec.reduction_vars if isinstance(v, ir.Var)]
    if [v.size for v in rest] != [v.size for v in inner_vars]:
        return (f"its remaining dimensions {[v.size for v in rest]} do not match the reduced ones "
                f"{[v.size for v in inner_vars]}")
    mapping.update(zip(rest, inner_vars, strict=True))
    return mapping
