"""Generated kernels: pointwise and reduction nodes rendered through the code writer."""

from __future__ import annotations

import math

from torch_adreno import ir
from torch_adreno.kernels.expressions import (
    STORAGE_CTYPE,
    arg_better,
    reduction_combine,
    reduction_init,
    value_ctype,
)
from torch_adreno.kernels.program import KernelSource, header_comment
from torch_adreno.kernels.workgroup import linear_local_size, reduction_local_size, round_up
from torch_adreno.kernels.writer import CodeWriter, Param
from torch_adreno.target import DeviceProfile

INT32_LIMIT = 2**31 - 1


def make_params(graph: ir.Graph, writes: list[str], reads: list[str]) -> dict[str, Param]:
    """Kernel parameters: written buffers first (out0, out1, ...), then read ones (in0, ...)."""
    params: dict[str, Param] = {}
    for i, name in enumerate(writes):
        b = graph.buffers[name]
        params[name] = Param(name, f"out{i}", b.dtype, b.shape, True)
    for name in reads:
        if name not in params:
            b = graph.buffers[name]
            params[name] = Param(name, f"in{len(params) - len(writes)}", b.dtype, b.shape, False)
    return params


def index_ctype_for(params: dict[str, Param], *extents: int) -> str:
    largest = max([math.prod(p.shape) for p in params.values()] + list(extents) + [1])
    return "int" if largest <= INT32_LIMIT else "long"


def signature(name: str, params: dict[str, Param], attribute: str = "") -> str:
    decls = ",\n    ".join(p.declaration() for p in params.values())
    return f"__kernel {attribute}void {name}(\n    {decls})"


def unravel_lines(writer: CodeWriter, linear: str, vars_: tuple[ir.Expr, ...], shape: tuple[int, ...]) -> list[str]:
    """Statements defining the loop variables ``vars_`` from a row-major ``linear`` index."""
    lines = []
    strides = ir.contiguous_strides(shape)
    for d, (v, size) in enumerate(zip(vars_, shape, strict=True)):
        if not isinstance(v, ir.Var):
            continue
        expr = linear if strides[d] == 1 else f"({linear} / {strides[d]})"
        if d > 0:
            expr = f"({expr} % {size})"
        lines.append(f"const INDEX_T {writer.var_names[v]} = {expr};")
    return lines


def _var_names(vars_: tuple[ir.Expr, ...]) -> dict[ir.Var, str]:
    return {v: v.name for v in vars_ if isinstance(v, ir.Var)}


def buffer_bytes(graph: ir.Graph, names: list[str]) -> int:
    return sum(graph.buffers[n].nbytes for n in names)


def render_pointwise(name: str, node: ir.Pointwise, graph: ir.Graph, profile: DeviceProfile) -> KernelSource:
    reads = node.inputs()
    params = make_params(graph, [node.output], reads)
    numel = math.prod(node.ranges)
    writer = CodeWriter(params, _var_names(node.loop_vars))
    value = writer.expr(node.body)
    writer.store(node.output, "x", value)
    index_defs = unravel_lines(writer, "x", node.loop_vars, node.ranges)
    body = writer.close_scope()
    local = linear_local_size(numel, profile)
    src = "\n".join([
        header_comment(name, node.origins, f"pointwise over {list(node.ranges)}"),
        f"#define INDEX_T {index_ctype_for(params, numel)}",
        signature(name, params) + " {",
        "    const INDEX_T x = get_global_id(0);",
        f"    if (x >= {numel}) return;",
        *("    " + ln for ln in index_defs + body),
        "}",
        "",
    ])
    return KernelSource(name, "pointwise", src, (), tuple(params), (round_up(max(numel, 1), local),), (local,),
                        node.origins, buffer_bytes(graph, reads), graph.buffers[node.output].nbytes)


def use_workgroup_reduction(outputs: int, reduction_numel: int, profile: DeviceProfile) -> bool:
    """One work-group per output when each output has much to reduce and outputs alone would not
    keep the device busy (fewer than ~256 work-items per compute unit)."""
    return reduction_numel >= 128 and outputs < profile.compute_units * 256


def render_reduction(name: str, node: ir.Reduction, graph: ir.Graph, profile: DeviceProfile) -> KernelSource:
    reads = node.inputs()
    params = make_params(graph, [node.output], reads)
    outputs, rnumel = math.prod(node.ranges), node.reduction_numel
    out_dtype = graph.buffers[node.output].dtype
    is_arg = node.reduce_op in ("argmax", "argmin")
    acc_dtype = node.body.dtype if is_arg else out_dtype
    acc_ctype = value_ctype(acc_dtype)
    init = reduction_init(node.reduce_op, acc_dtype)
    workgroup = use_workgroup_reduction(outputs, rnumel, profile)
    local = reduction_local_size(rnumel, profile) if workgroup else linear_local_size(outputs, profile)

    writer = CodeWriter(params, _var_names(node.loop_vars))
    writer.open_scope(_var_names(node.reduction_vars))
    value = writer.expr(node.body)
    if is_arg:
        better = arg_better(node.reduce_op, value, "rl", "acc", "acc_index", acc_dtype)
        update = [f"if ({better}) {{ acc = {value}; acc_index = rl; }}"]
    else:
        update = [f"acc = {reduction_combine(node.reduce_op, 'acc', value, acc_dtype)};"]
    reduction_index_defs = unravel_lines(writer, "rl", node.reduction_vars, node.reduction_ranges)
    loop_body = writer.close_scope()
    index_defs = unravel_lines(writer, "x", node.loop_vars, node.ranges)
    outer = writer.close_scope()

    lines = [
        header_comment(name, node.origins, f"reduce_{node.reduce_op} of {list(node.reduction_ranges)} "
                       f"into {list(node.ranges)} ({'work-group' if workgroup else 'serial'})"),
        f"#define INDEX_T {index_ctype_for(params, outputs, rnumel)}",
    ]
    attribute = f"__attribute__((reqd_work_group_size({local}, 1, 1))) " if workgroup else ""
    lines.append(signature(name, params, attribute) + " {")
    if workgroup:
        lines += [f"    __local {acc_ctype} partial[{local}];"]
        if is_arg:
            lines += [f"    __local long partial_index[{local}];"]
        lines += ["    const INDEX_T x = get_group_id(0);", "    const int lid = get_local_id(0);"]
        loop = f"for (INDEX_T rl = lid; rl < {rnumel}; rl += {local})"
    else:
        lines += ["    const INDEX_T x = get_global_id(0);", f"    if (x >= {outputs}) return;"]
        loop = f"for (INDEX_T rl = 0; rl < {rnumel}; ++rl)"
    lines += ["    " + ln for ln in index_defs + outer]
    lines.append(f"    {acc_ctype} acc = {init};")
    if is_arg:
        lines.append("    long acc_index = -1;")
    lines.append(f"    {loop} {{")
    lines += ["        " + ln for ln in reduction_index_defs + loop_body + update]
    lines.append("    }")
    store_ctype = STORAGE_CTYPE[out_dtype]
    result = "acc_index" if is_arg else "acc"
    if workgroup:
        lines += [
            "    partial[lid] = acc;",
            *(["    partial_index[lid] = acc_index;"] if is_arg else []),
            "    barrier(CLK_LOCAL_MEM_FENCE);",
            f"    for (int s = {local // 2}; s > 0; s >>= 1) {{",
            "        if (lid < s) {",
        ]
        if is_arg:
            better = arg_better(node.reduce_op, "partial[lid + s]", "partial_index[lid + s]", "partial[lid]",
                                "partial_index[lid]", acc_dtype)
            lines += [f"            if (partial_index[lid + s] >= 0 && {better}) {{",
                      "                partial[lid] = partial[lid + s];",
                      "                partial_index[lid] = partial_index[lid + s];",
                      "            }"]
        else:
            combined = reduction_combine(node.reduce_op, "partial[lid]", "partial[lid + s]", acc_dtype)
            lines.append(f"            partial[lid] = {combined};")
        lines += [
            "        }",
            "        barrier(CLK_LOCAL_MEM_FENCE);",
            "    }",
            f"    if (lid == 0) out0[x] = ({store_ctype})(partial{'_index' if is_arg else ''}[0]);",
        ]
        global_size = (outputs * local,)
    else:
        lines.append(f"    out0[x] = ({store_ctype})({result});")
        global_size = (round_up(max(outputs, 1), local),)
    lines += ["}", ""]
    return KernelSource(name, "reduction", "\n".join(lines), (), tuple(params), global_size, (local,),
                        node.origins, buffer_bytes(graph, reads), graph.buffers[node.output].nbytes)
