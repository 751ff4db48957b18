"""The graph of an exported step under construction: one node per device operation of the step.

A launch becomes a node calling a model-local function (domain :data:`~torch_adreno.runner.format.DOMAIN`)
named after its kernel, whose body is the standard ONNX ops of what the kernel fused
(:mod:`.kernel_bodies`, :mod:`.attention_bodies`), the node carrying the kernel's OpenCL source,
build options, launch geometry and buffers (:data:`~torch_adreno.runner.format.KERNEL_ATTRIBUTES`);
a copy becomes a :data:`~torch_adreno.runner.format.COPY_OP` node. Values between nodes are flat
(1-D) tensors, one per value a memory identity takes during the step (:class:`Value`).

Invariant: a node reads the value its memory identity holds at that point of the step, never a
later one; reading an identity before anything wrote it, or as another element type than it was
written, is an :class:`ExportError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from torch_adreno import ir
from torch_adreno.export.attention_bodies import attention_body
from torch_adreno.export.kernel_bodies import (
    NUMPY_TYPE,
    ONNX_TYPE,
    Body,
    ExportError,
    SplitK,
    split_slices,
    translate_node,
)
from torch_adreno.kernels.program import KernelSource, assemble
from torch_adreno.replay.capture import RecordedCopy
from torch_adreno.runner import format as fmt

__all__ = ["StepGraph", "Value", "copy_node", "kernel_nodes", "launch_node", "read_value"]


@dataclass
class Value:
    """The value a memory identity holds at a point of the step: a flat tensor of the graph."""

    name: str
    dtype: ir.DType
    numel: int


class StepGraph:
    """The nodes and model-local functions of the step's graph, in operation order."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.functions: dict[str, onnx.FunctionProto] = {}
        self.body = Body("v")  # value names of the main graph
        self._node_names: set[str] = set()

    def node_name(self, wanted: str) -> str:
        """``wanted``, or with a number when another node has it (ONNX node names are unique)."""
        name, number = wanted, 1
        while name in self._node_names:
            number += 1
            name = f"{wanted}#{number}"
        self._node_names.add(name)
        return name


def read_value(g: StepGraph, values: dict[int, Value], identity: int, dtype: ir.DType, numel: int, what: str) -> str:
    """The current value of ``identity`` as ``numel`` elements of ``dtype``."""
    value = values.get(identity)
    if value is None:
        raise ExportError(f"{what} reads memory identity {identity} before anything of the step wrote it")
    if ONNX_TYPE[value.dtype] != ONNX_TYPE[dtype]:
        raise ExportError(f"{what} reads memory identity {identity} as {dtype.value}, written as {value.dtype.value}: "
                          "reinterpreting bytes is not exportable")
    if value.numel == numel:
        return value.name
    if value.numel < numel:
        raise ExportError(f"{what} reads {numel} elements of memory identity {identity}, which holds {value.numel}")
    body = g.body
    out = body.fresh("part")
    g.nodes.append(helper.make_node("Slice", [value.name, body.ints([0]), body.ints([numel])], [out]))
    return out


def copy_node(g: StepGraph, op: RecordedCopy, values: dict[int, Value]) -> None:
    source = values.get(op.source)
    if source is None:
        raise ExportError(f"{op.graph} copies memory identity {op.source} before anything wrote it")
    itemsize = np.dtype(NUMPY_TYPE[source.dtype]).itemsize
    if op.nbytes % itemsize:
        raise ExportError(f"{op.graph} copies {op.nbytes} bytes, not whole {source.dtype.value} elements")
    value = read_value(g, values, op.source, source.dtype, op.nbytes // itemsize, f"a copy of {op.graph}")
    if fmt.COPY_OP not in g.functions:
        g.functions[fmt.COPY_OP] = helper.make_function(
            fmt.DOMAIN, fmt.COPY_OP, ["source"], ["destination"], [helper.make_node("Identity", ["source"], ["destination"])],
            [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.COPY_ATTRIBUTES))
    out = g.body.fresh("copied")
    g.nodes.append(helper.make_node(fmt.COPY_OP, [value], [out], domain=fmt.DOMAIN, name=g.node_name(f"{op.graph}.copy"),
                                    destination=op.destination, source=op.source, nbytes=op.nbytes))
    values[op.destination] = Value(out, source.dtype, op.nbytes // itemsize)


def _split_of(graph: ir.Graph, source: KernelSource) -> SplitK | None:
    """For a launch of a split-K GEMM (its slices, or their sum): the split; else None."""
    producers = graph.producers()
    gemms = {f"{n.name}_slices": n for n in graph.nodes if isinstance(n, ir.Gemm)}
    partials = [p for p in dict.fromkeys((*source.writes, *source.reads)) if p not in producers and p in gemms]
    if not partials:
        return None
    (name,) = partials
    gemm = gemms[name]
    defines = dict(o[2:].partition("=")[::2] for o in source.build_options if o.startswith("-D"))
    rows = defines.get("ROW_SUM") == "1"
    outputs = gemm.batch * gemm.m * gemm.n + (gemm.batch * gemm.m if rows else 0)
    split = graph.buffers[name].numel // outputs
    return SplitK(gemm, name, split, math.ceil(gemm.k / split), rows)


def launch_node(g: StepGraph, graph_name: str, source: KernelSource, args: Sequence[int], program: Any,
            values: dict[int, Value]) -> None:
    graph: ir.Graph = program.graph
    if not source.writes:
        raise ExportError(f"kernel {source.name} carries no record of the buffers it writes (KernelSource.writes): "
                          "compiled by a torch_adreno that did not keep one; compile the step again")
    # What the launch writes and the arguments its function takes, as the kernels stage recorded
    # them (no signature is parsed): every argument not declared writable, and a split GEMM's
    # partials in its sum launch.
    split = _split_of(graph, source)
    writes = list(dict.fromkeys(source.writes))
    reads = [p for p in source.params if p not in source.writable
             or (split is not None and p == split.partials and source.kind != "gemm")]
    identity_of = dict(zip(source.params, args, strict=True))
    function_name = source.name
    if function_name not in g.functions:
        g.functions[function_name] = _kernel_function(function_name, graph, source, reads, writes, split)
    node_inputs = [read_value(g, values, identity_of[p], graph.buffers[p].dtype, graph.buffers[p].numel,
                         f"kernel {source.name} (argument {p})") for p in reads]
    node_outputs = []
    for p in writes:
        out = g.body.fresh(p)
        node_outputs.append(out)
        values[identity_of[p]] = Value(out, graph.buffers[p].dtype, graph.buffers[p].numel)
    kernel_text, _ = assemble([source])
    _, program_options = assemble(program.kernels)
    g.nodes.append(helper.make_node(
        function_name, node_inputs, node_outputs, domain=fmt.DOMAIN, name=g.node_name(source.name),
        kernel_name=source.symbol, opencl_source=kernel_text, build_options=list(program_options) or [""],
        extensions=list(source.extensions) or [""],
        global_size=list(source.global_size), local_size=list(source.local_size), buffers=list(args),
        parameters=list(source.params), fx_nodes=list(source.fx_nodes) or [""], graph=graph_name,
        index_checks=int(source.checks_indices)))


def _kernel_function(name: str, graph: ir.Graph, source: KernelSource, reads: list[str], writes: list[str],
                     split: SplitK | None) -> onnx.FunctionProto:
    body = Body("t")
    values = {p: f"in_{p}" for p in reads}
    slices = split is not None and source.kind == "gemm"
    # The slice launch of a split GEMM computes the operands (and any prologue fused into them).
    targets = ir.node_inputs(split.gemm) if slices and split is not None else writes
    for node in kernel_nodes(graph, targets, set(reads), name):
        if isinstance(node, ir.TemplateOp):  # (fused attention: several outputs)
            values.update(attention_body(body, node, values, graph.buffers, name))
            continue
        values[ir.node_outputs(node)[0]] = translate_node(
            body, node, values, graph.buffers, name,
            split if split is not None and isinstance(node, ir.Gemm) and node is split.gemm else None)
    if slices and split is not None:
        values[split.partials] = split_slices(body, split, values, graph.buffers, name)
    for p in writes:
        body.nodes.append(helper.make_node("Identity", [values[p]], [f"out_{p}"]))
    return helper.make_function(fmt.DOMAIN, name, [f"in_{p}" for p in reads], [f"out_{p}" for p in writes],
                                body.nodes, [helper.make_opsetid("", fmt.OPSET)], attributes=list(fmt.KERNEL_ATTRIBUTES),
                                doc_string=source.header[:4000])


def kernel_nodes(graph: ir.Graph, writes: Sequence[str], reads: set[str], kernel: str) -> list[ir.Node]:
    """The IR nodes that compute ``writes`` from ``reads``, in the graph's order."""
    producers = graph.producers()
    needed: set[int] = set()
    stack = list(writes)
    seen: set[str] = set()
    while stack:
        buffer = stack.pop()
        if buffer in seen or buffer in reads:
            continue
        seen.add(buffer)
        node = producers.get(buffer)
        if node is None:
            raise ExportError(f"kernel {kernel}: writes or reads buffer {buffer}, which no IR node of graph "
                              f"{graph.name} computes and the kernel does not take as an argument")
        needed.add(id(node))
        stack.extend(ir.node_inputs(node))
    return [n for n in graph.nodes if id(n) in needed]
