"""Split reductions: a long sum into few outputs becomes per-slice partial sums, then their sum.

A BatchNorm's statistics and its backward's sums reduce batch x height x width (ResNet-18's
stem: 16 x 112 x 112) into one value per channel (64): one work-group per channel, so 64
work-groups walk 200,704 elements each while most of a large GPU idles.
Moving the leading reduced dimensions into the outputs makes ``outputs x S`` rows of partial
results (one work-group each, every element still read once) and a second, small reduction over
the ``S`` partials per output.

Invariant: every element is reduced exactly once, in the first reduction, whose loop also holds
whatever the original reduction's kernel stored element by element; the second reads only the
partials. The partials are float32 (the reduction's compute type); the result is rounded to the
output's type once, as before. Sums are then two-level, which only brings them nearer float64.
"""

from __future__ import annotations

import math

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision
from torch_adreno.fusion.split_k import target_tiles

#: Reductions that combine partial results with themselves (argmax/argmin would need the index).
SPLITTABLE = ("sum", "prod", "max", "min", "any", "all")
#: Elements each partial still reduces, at least: shorter rows do not pay for the second launch.
MIN_PARTIAL_ROW = 1024


def choose_leading_dims(node: ir.Reduction, target: int) -> int:
    """How many leading reduced dimensions move into the outputs (0: no split): added while the
    outputs stay under ``target`` work-groups and each partial row keeps at least
    :data:`MIN_PARTIAL_ROW` elements."""
    if node.reduce_op not in SPLITTABLE:
        return 0
    outputs = math.prod(node.ranges)
    rest = node.reduction_numel
    moved = 0
    for size in node.reduction_ranges[:-1]:
        if outputs >= target or rest // size < MIN_PARTIAL_ROW:
            break
        outputs, rest, moved = outputs * size, rest // size, moved + 1
    return moved


def split_long_reductions(graph: ir.Graph, nodes: list[ir.Node], decisions: list[Decision],
                          compute_units: int | None = None) -> list[ir.Node]:
    """``nodes`` with every reduction that :func:`choose_leading_dims` splits replaced by the
    partial reduction and the reduction of its partials (a new float32 buffer between them)."""
    target = target_tiles(compute_units)
    out: list[ir.Node] = []
    replaced: dict[str, list[ir.Node]] = {}
    for node in nodes:
        moved = choose_leading_dims(node, target) if isinstance(node, ir.Reduction) else 0
        if not moved:
            out.append(node)
            continue
        assert isinstance(node, ir.Reduction)
        replaced[node.output] = _split(graph, node, moved, decisions)
        out.extend(replaced[node.output])
    if replaced:
        # The graph's own node list says what the kernels compute (the ONNX export rebuilds each
        # kernel's body from it): the partials' producer included.
        graph.nodes = [n for old in graph.nodes
                       for n in (replaced.get(ir.node_outputs(old)[0], [old]) if isinstance(old, ir.Reduction) else [old])]
    return out


def _split(graph: ir.Graph, node: ir.Reduction, moved: int, decisions: list[Decision]) -> list[ir.Node]:
    leading, rest = node.reduction_ranges[:moved], node.reduction_ranges[moved:]
    partial_shape = (*node.ranges, *leading)
    name = f"{node.output}_partials"
    graph.buffers[name] = ir.Buffer(name, partial_shape, node.body.dtype)
    partial = ir.Reduction(f"{node.name}_part", name, partial_shape, rest, node.reduce_op, node.body, node.origins)
    mapping: dict[ir.Var, ir.Expr] = {}
    new_loop = partial.loop_vars
    for old, new in zip(node.loop_vars, new_loop[:len(node.ranges)], strict=True):
        if isinstance(old, ir.Var):
            mapping[old] = new
    for old, new in zip(node.reduction_vars[:moved], new_loop[len(node.ranges):], strict=True):
        if isinstance(old, ir.Var):
            mapping[old] = new
    for old, new in zip(node.reduction_vars[moved:], partial.reduction_vars, strict=True):
        if isinstance(old, ir.Var):
            mapping[old] = new
    partial.body = ir.substitute(node.body, mapping)
    total = ir.Reduction(node.name, node.output, node.ranges, leading, node.reduce_op, node.body, node.origins)
    total.body = ir.View.of(graph.buffers[name]).load([*total.loop_vars, *total.reduction_vars])
    decisions.append(Decision(
        node.name, partial.name, True,
        f"split reduce_{node.reduce_op} over {node.reduction_numel} elements into {math.prod(node.ranges)} "
        f"output(s): {math.prod(partial_shape)} partial rows of {math.prod(rest)}, then a reduction over "
        f"{math.prod(leading)} partials each (one work-group per output would leave most compute units idle)"))
    return [partial, total]
