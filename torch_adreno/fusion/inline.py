"""Vertical fusion by recomputation: small reductions unrolled, cheap pointwise producers inlined.

A pointwise node whose result is used a bounded number of times per element is not written to
memory: its expression is substituted into every consumer (a GEMM operand, a reduction's input, a
later pointwise op). The cost rule weighs the recomputation this causes against the buffer it
saves, and every decision is recorded with its reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

from torch_adreno import ir
from torch_adreno.fusion.decisions import Decision

#: Reductions over at most this many elements (a 3x3 window) become unrolled pointwise expressions (pooling
#: windows, scatters over a few targets), so that they fuse like any other elementwise op.
UNROLL_LIMIT = 9
#: A producer is inlined when consumers evaluate it at most this many times per element...
MAX_RECOMPUTE = 4.0
#: ...and it costs at most this many weighted operations (transcendentals weigh 4).
MAX_INLINE_COST = 12
EXPENSIVE_OPS = {"exp", "log", "tanh", "sigmoid", "erf", "pow", "sqrt", "rsqrt", "sin", "cos", "log1p", "expm1",
                 "atan2", "exp2", "log2"}


def op_cost(expr: ir.Expr) -> int:
    """Weighted number of operations in an expression DAG. Free: index arithmetic, and casts
    between float types (a 16-bit value is widened as it is loaded and rounded in a few register
    operations; weighing them would make autocast's casts decide what is stored, and a float16
    graph would then store what its float32 twin recomputes)."""
    cost = 0
    for e in ir.walk(expr):
        if isinstance(e, ir.Call) and e.dtype is not ir.DType.INDEX and not _float_cast(e):
            cost += 4 if e.op in EXPENSIVE_OPS else 1
    return cost


def _float_cast(e: ir.Call) -> bool:
    return e.op == "cast" and e.dtype.is_float and e.args[0].dtype.is_float


# -- unrolling -------------------------------------------------------------------------------------


def _unrolled(node: ir.Reduction) -> ir.Expr:
    shape = node.reduction_ranges
    values = []
    for position in itertools.product(*(range(s) for s in shape)):
        mapping = {v: ir.index(p) for v, p in zip(node.reduction_vars, position, strict=True) if isinstance(v, ir.Var)}
        values.append(ir.substitute(node.body, mapping))
    op = node.reduce_op
    if op in ("argmax", "argmin"):
        best = values[0]
        best_index: ir.Expr = ir.const(0, ir.DType.I64)
        compare = "gt" if op == "argmax" else "lt"
        for k, v in enumerate(values[1:], start=1):
            better = ir.call(compare, v, best)
            if v.dtype.is_float:
                better = ir.call("logical_or", better,
                                 ir.call("logical_and", ir.call("isnan", v), ir.call("logical_not", ir.call("isnan", best))))
            best_index = ir.where(better, ir.const(k, ir.DType.I64), best_index)
            best = ir.where(better, v, best)
        return best_index
    acc = values[0]
    for v in values[1:]:
        if op == "sum" and _float32_product(v):
            # Rounded once per tap (a depthwise convolution's window), not once for the product
            # and once for the sum: 1.13x eager's distance from float64 otherwise (PoCL, measured).
            assert isinstance(v, ir.Call)
            acc = ir.call("fma", v.args[0], v.args[1], acc)
        elif op == "sum":
            acc = ir.call("add", acc, v)
        elif op == "prod":
            acc = ir.call("mul", acc, v)
        elif op == "any":
            acc = ir.call("logical_or", acc, v)
        elif op == "all":
            acc = ir.call("logical_and", acc, v)
        elif op in ("max", "min"):
            take = ir.call("gt" if op == "max" else "lt", v, acc)
            if v.dtype.is_float:
                take = ir.call("logical_or", take, ir.call("isnan", v))
            acc = ir.where(take, v, acc)
    return acc


def _float32_product(value: ir.Expr) -> bool:
    return (isinstance(value, ir.Call) and value.op == "mul" and value.dtype is ir.DType.F32
            and all(a.dtype is ir.DType.F32 for a in value.args))


def _broadcasting_consumer(node: ir.Reduction, nodes: list[ir.Node]) -> str | None:
    """A consumer that reads the result across more elements than it has (softmax reads a row's
    max for every element of the row): kept a reduction, it can share a kernel with that consumer."""
    numel = math.prod(node.ranges)
    for other in nodes:
        if node.output not in ir.node_inputs(other):
            continue
        if isinstance(other, ir.Pointwise) and math.prod(other.ranges) > numel:
            return other.name
        if isinstance(other, ir.Reduction) and math.prod(other.ranges) * other.reduction_numel > numel:
            return other.name
    return None


def unroll_small_reductions(nodes: list[ir.Node], decisions: list[Decision]) -> list[ir.Node]:
    out: list[ir.Node] = []
    for node in nodes:
        if isinstance(node, ir.Reduction) and 1 <= node.reduction_numel <= UNROLL_LIMIT:
            broadcaster = _broadcasting_consumer(node, nodes)
            if broadcaster is not None:
                decisions.append(Decision(node.name, broadcaster, False,
                                          f"kept reduce_{node.reduce_op} over {node.reduction_numel} elements a "
                                          f"reduction: {broadcaster} reads its result across the reduced rows"))
                out.append(node)
                continue
            out.append(ir.Pointwise(node.name, node.output, node.ranges, _unrolled(node), node.origins))
            decisions.append(Decision(node.name, "a pointwise expression", True,
                                      f"unrolled reduce_{node.reduce_op} over {node.reduction_numel} elements "
                                      f"(<= {UNROLL_LIMIT}) into a pointwise expression"))
        else:
            out.append(node)
    return out


# -- inlining ----------------------------------------------------------------------------------------


def _bodies(node: ir.Node) -> list[ir.Expr]:
    if isinstance(node, ir.Pointwise | ir.Reduction):
        return [node.body]
    if isinstance(node, ir.Gemm):
        return [node.lhs, node.rhs]
    return []


#: GEMM templates read each operand element about once per this many output columns (rows).
GEMM_OPERAND_REUSE_TILE = 32


def _evaluations(consumer: ir.Node, buffer: str) -> float:
    """How many times ``consumer`` evaluates its loads of ``buffer`` in total."""
    if isinstance(consumer, ir.Gemm):
        # Tiles re-read an operand once per block of the other output dimension; an inlined operand
        # is recomputed, extra loads included, at every one of those reads.
        total = 0.0
        if any(ld.buffer == buffer for ld in ir.loads(consumer.lhs)):
            total += consumer.batch * consumer.m * consumer.k * math.ceil(consumer.n / GEMM_OPERAND_REUSE_TILE)
        if any(ld.buffer == buffer for ld in ir.loads(consumer.rhs)):
            total += consumer.batch * consumer.k * consumer.n * math.ceil(consumer.m / GEMM_OPERAND_REUSE_TILE)
        return total
    loads = sum(1 for body in _bodies(consumer) for ld in ir.loads(body) if ld.buffer == buffer)
    if isinstance(consumer, ir.Reduction):
        return loads * math.prod(consumer.ranges) * consumer.reduction_numel
    assert isinstance(consumer, ir.Pointwise)
    return loads * math.prod(consumer.ranges)


def _substitute_producer(expr: ir.Expr, producer: ir.Pointwise) -> ir.Expr:
    def replace(e: ir.Expr) -> ir.Expr | None:
        if isinstance(e, ir.Load) and e.buffer == producer.output:
            mapping = {v: i for v, i in zip(producer.loop_vars, e.index, strict=True) if isinstance(v, ir.Var)}
            return ir.cast(ir.substitute(producer.body, mapping), e.dtype)
        return None

    return ir.rewrite(expr, replace)


def _with_producer_inlined(consumer: ir.Node, producer: ir.Pointwise) -> ir.Node:
    if isinstance(consumer, ir.Pointwise | ir.Reduction):
        return dataclasses.replace(consumer, body=_substitute_producer(consumer.body, producer),
                                   origins=_merge(consumer.origins, producer.origins))
    assert isinstance(consumer, ir.Gemm)
    return dataclasses.replace(consumer, lhs=_substitute_producer(consumer.lhs, producer),
                               rhs=_substitute_producer(consumer.rhs, producer),
                               origins=_merge(consumer.origins, producer.origins))


def _merge(a: tuple[ir.Origin, ...], b: tuple[ir.Origin, ...]) -> tuple[ir.Origin, ...]:
    seen = {o.node: o for o in a}
    for o in b:
        seen.setdefault(o.node, o)
    return tuple(seen.values())


def inline_pointwise(graph: ir.Graph, nodes: list[ir.Node], decisions: list[Decision]) -> list[ir.Node]:
    """Substitute cheap pointwise producers into their consumers (see the module doc)."""
    outputs = graph.output_buffers()
    nodes = list(nodes)
    # Buffers each node reads, kept in step with ``nodes`` (walking every expression again per
    # producer made this pass quadratic in the graph's size).
    reads = [set(ir.node_inputs(n)) for n in nodes]
    producers = {out: n for n in nodes for out in ir.node_outputs(n)}
    i = 0
    while i < len(nodes):
        producer = nodes[i]
        if not isinstance(producer, ir.Pointwise):
            i += 1
            continue
        consumers = [(j, nodes[j]) for j in range(i + 1, len(nodes)) if producer.output in reads[j]]
        reason = _refusal(producer, [n for _, n in consumers], outputs)
        if reason is None:
            reason = _narrowed_gemm_result(graph, producer, len(consumers), producers,
                                           lambda b: sum(1 for r in reads if b in r), outputs)
        if reason is not None:
            for _, c in consumers:
                decisions.append(Decision(producer.name, c.name, False, reason))
            i += 1
            continue
        for j, consumer in consumers:
            nodes[j] = _with_producer_inlined(consumer, producer)
            reads[j] = set(ir.node_inputs(nodes[j]))
            decisions.append(Decision(producer.name, consumer.name, True,
                                      f"inlined {producer.output}: recomputed in the consumer instead of stored"))
        del nodes[i]
        del reads[i]
    return nodes


def _refusal(producer: ir.Pointwise, consumers: list[ir.Node], outputs: set[str]) -> str | None:
    """Why ``producer`` must be materialised, or None when inlining it is legal and pays."""
    if producer.output in outputs:
        return f"{producer.output} is a graph output and must be stored anyway"
    if not consumers:
        return "no consumer"
    if any(isinstance(c, ir.HostOp) for c in consumers):
        return "a host op reads it from memory"
    if any(isinstance(c, ir.TemplateOp) for c in consumers):
        return "a template kernel (fused attention) reads it from memory"
    loads = ir.loads(producer.body)
    cost = op_cost(producer.body)
    if not loads or (len({ld.buffer for ld in loads}) == 1 and cost <= 1):
        return None  # a constant, a copy, a cast or a view: nothing is recomputed
    numel = max(1, math.prod(producer.ranges))
    evaluations = [_evaluations(c, producer.output) for c in consumers]
    factor = sum(evaluations) / numel
    if factor <= 1.0:
        return None
    if factor <= MAX_RECOMPUTE and cost <= MAX_INLINE_COST:
        return None
    return (f"recomputing it {factor:.1f}x per element at {cost} weighted ops (limits: {MAX_RECOMPUTE}x, "
            f"{MAX_INLINE_COST} ops) costs more than storing {producer.output}")


def _narrowed_gemm_result(graph: ir.Graph, producer: ir.Pointwise, consumers: int, producers: dict[str, ir.Node],
                          readers: Callable[[str], int], outputs: set[str]) -> str | None:
    """Why ``producer`` should be stored rather than inlined when it narrows a GEMM's float32
    accumulator element for element (autocast's linear: bias added, rounded to 16 bits).

    Stored, it becomes the GEMM's epilogue and the GEMM writes the 16-bit values its consumers
    read; inlined, the GEMM must write its float32 accumulator, which eager never stores, and
    every consumer reads those wider elements. Bytes decide (each consumer counted as one kernel
    reading the buffer once); with equal element sizes inlining never loses, so float32 graphs
    keep their decisions."""
    out = graph.buffers[producer.output]
    for ld in ir.loads(producer.body):
        source = producers.get(ld.buffer)
        wide = graph.buffers[ld.buffer]
        if (not isinstance(source, ir.Gemm) or wide.numel != out.numel
                or wide.dtype.itemsize <= out.dtype.itemsize or producer.ranges != wide.shape
                or tuple(ld.index) != tuple(producer.loop_vars)):
            continue
        # Read by the producer alone, the accumulator is not stored at all once the producer is the epilogue.
        dies = readers(ld.buffer) == 1 and ld.buffer not in outputs
        inlined = consumers * wide.nbytes + (wide.nbytes if dies else 0)
        stored = (1 + consumers) * out.nbytes
        if inlined > stored:
            return (f"it narrows the GEMM result {ld.buffer} ({wide.dtype.value}) to "
                    f"{out.dtype.value}: stored by the GEMM's epilogue, {stored} bytes move; inlined into "
                    f"{consumers} consumer(s), {inlined}")
    return None
