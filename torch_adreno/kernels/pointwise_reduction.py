"""Generated kernels: pointwise and reduction kernel specs rendered through the code writer."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from torch_adreno import ir
from torch_adreno.fusion import Accumulator, PointwiseKernel, ReductionKernel, SegmentedKernel, Store
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.expressions import (
    STORAGE_CTYPE,
    arg_better,
    reduction_combine,
    reduction_init,
    value_ctype,
)
from torch_adreno.kernels.params import Role
from torch_adreno.kernels.program import kernel_opening
from torch_adreno.kernels.workgroup import (
    Launch,
    linear_local_size,
    reduction_local_candidates,
    reduction_local_size,
    round_up,
)
from torch_adreno.kernels.writer import CodeWriter, Param
from torch_adreno.targets import DeviceProfile

INT32_LIMIT = 2**31 - 1
#: The ``-D`` option that sizes a tree reduction's work-group (its local arrays, its loop stride and
#: its ``reqd_work_group_size``): a tuner rebuilds the kernel with another value, nothing else.
GROUP_SIZE = "GROUP_SIZE"


def make_params(graph: ir.Graph, writes: Sequence[str], reads: Sequence[str],
                storage_of: Mapping[str, str] | None = None) -> dict[str, Param]:
    """Kernel parameters: written buffers first (out0, out1, ...), then read ones (in0, ...).

    ``storage_of`` maps a buffer to the buffer whose bytes it uses; parameters sharing bytes are
    declared without ``restrict``.
    """
    params: dict[str, Param] = {}
    storage_of = storage_of or {}
    names = list(dict.fromkeys(writes)) + [r for r in reads if r not in writes]
    roots = [storage_of.get(n, n) for n in names]
    shared = {n for n, root in zip(names, roots, strict=True) if roots.count(root) > 1}
    for i, name in enumerate(dict.fromkeys(writes)):
        b = graph.buffers[name]
        params[name] = Param(name, f"out{i}", b.dtype, b.shape, True, name in shared)
    n_out = len(params)
    for name in reads:
        if name not in params:
            b = graph.buffers[name]
            params[name] = Param(name, f"in{len(params) - n_out}", b.dtype, b.shape, False, name in shared)
    return params


def index_ctype_for(params: Mapping[str, Param], *extents: int) -> str:
    largest = max([math.prod(p.shape) for p in params.values()] + list(extents) + [1])
    return "int" if largest <= INT32_LIMIT else "long"


def unravel_lines(writer: CodeWriter, linear: str, vars_: tuple[ir.Expr, ...], shape: tuple[int, ...],
                  used_by: Sequence[str] | None = None) -> list[str]:
    """Statements defining the loop variables ``vars_`` from a row-major ``linear`` index (only
    those the statements ``used_by`` name, when given)."""
    used = None if used_by is None else set(re.findall(r"\w+", "\n".join(used_by)))
    lines = []
    strides = ir.contiguous_strides(shape)
    for d, (v, size) in enumerate(zip(vars_, shape, strict=True)):
        if not isinstance(v, ir.Var) or (used is not None and writer.var_names[v] not in used):
            continue
        expr = linear if strides[d] == 1 else f"({linear} / {strides[d]})"
        if d > 0:
            expr = f"({expr} % {size})"
        lines.append(f"const INDEX_T {writer.var_names[v]} = {expr};")
    return lines


def var_names(vars_: Sequence[ir.Expr]) -> dict[ir.Var, str]:
    return {v: v.name for v in vars_ if isinstance(v, ir.Var)}


def buffer_bytes(graph: ir.Graph, names: Sequence[str]) -> int:
    return sum(graph.buffers[n].nbytes for n in dict.fromkeys(names))


def _store_exprs(stores: Sequence[Store]) -> list[ir.Expr]:
    return [e for s in stores for e in (s.value, *s.index, *([s.when] if s.when is not None else []))]


def _scopes(spec: PointwiseKernel | SegmentedKernel | ReductionKernel) -> list[tuple[int, list[ir.Expr]]]:
    """The kernel's expressions by the number of iterations each runs in."""
    if isinstance(spec, PointwiseKernel):
        return [(math.prod(spec.ranges), _store_exprs(spec.stores))]
    if isinstance(spec, SegmentedKernel):
        return [(math.prod(seg.ranges), _store_exprs(seg.stores)) for seg in spec.segments]
    inner = [a.value for a in spec.accumulators()] + _store_exprs([s for p in spec.phases for s in p.stores])
    return [(math.prod(spec.outer) * spec.inner_numel, inner), (math.prod(spec.outer), _store_exprs(spec.outer_stores))]


def read_bytes(graph: ir.Graph, spec: PointwiseKernel | SegmentedKernel | ReductionKernel,
               names: Sequence[str]) -> int:
    """Global-memory bytes a generated kernel reads from ``names``: each buffer once, and no more of
    it than its distinct loads can reach, one element per iteration each (a gather from an
    embedding table reads the rows it is given, not the table; a slice its part). An upper bound:
    never more than :func:`buffer_bytes`."""
    reachable: dict[str, int] = {}
    for iterations, exprs in _scopes(spec):
        sites = {load for e in exprs for load in ir.loads(e)}
        for load in sites:
            reachable[load.buffer] = reachable.get(load.buffer, 0) + iterations
    return _capped_bytes(graph, names, reachable)


def _capped_bytes(graph: ir.Graph, names: Sequence[str], reachable: Mapping[str, int]) -> int:
    """Bytes of each buffer of ``names`` once, no more of it than ``reachable`` elements (all of a
    buffer it does not name)."""
    total = 0
    for name in dict.fromkeys(names):
        buffer = graph.buffers[name]
        total += min(buffer.nbytes, reachable.get(name, buffer.numel) * buffer.dtype.itemsize)
    return total


def template_read_bytes(graph: ir.Graph, node: ir.TemplateOp, names: Sequence[str]) -> int:
    """Global-memory bytes a template kernel reads from ``names``: each buffer once, and no more of it
    than the views it reads it through hold (the keys sliced out of a fused projection are a third
    of it). An upper bound: never more than :func:`buffer_bytes`."""
    reachable: dict[str, int] = {}
    for view in node.inputs:
        reachable[view.buffer] = reachable.get(view.buffer, 0) + math.prod(view.shape)
    return _capped_bytes(graph, names, reachable)


def write_stores(writer: CodeWriter, stores: Sequence[Store], linear: str | None = None,
                 ranges: tuple[int, ...] | None = None, loop_vars: tuple[ir.Expr, ...] | None = None) -> None:
    """Emit ``stores``; a store over the kernel's own shape at its own index writes at ``linear``.

    Every value is computed before the first store is made, so a store may overwrite, in place, an
    element that another store of the same iteration still reads (the memory plan relies on it).
    """
    statements = []
    for store in stores:
        guarded = store.when is not None
        condition = writer.expr(store.when) if store.when is not None else None
        stored = store.value
        if isinstance(stored, ir.Call) and stored.op == "cast" and stored.dtype is writer.params[store.buffer].dtype \
                and stored.dtype.is_half:
            stored = stored.args[0]  # the store rounds to nearest even itself
        value = writer.expr(stored, guarded)
        shape = writer.params[store.buffer].shape
        if linear is not None and shape == ranges and tuple(store.index) == tuple(loop_vars or ()):
            offset = linear
        else:
            offset = writer.expr(writer.flat_index(store.buffer, store.index), guarded)
        statement = writer.store_statement(store.buffer, offset, value)
        statements.append(f"if ({condition}) {statement}" if condition is not None else statement)
    for statement in statements:
        writer.emit(statement)


#: The extension a kernel computing in half (``native_half``) enables.
FP16_EXTENSION = "cl_khr_fp16"


def _extensions(native: bool) -> tuple[str, ...]:
    return (FP16_EXTENSION,) if native else ()


def _as_half(arg: ir.Expr) -> ir.Expr | None:
    """``arg`` of a float32 op as a half operand: a widened float16 value, a constant, or a
    non-float argument (a condition); None when it is float32 arithmetic of its own."""
    if isinstance(arg, ir.Call) and arg.op == "cast" and arg.args[0].dtype is ir.DType.F16:
        return arg.args[0]
    if isinstance(arg, ir.Const) and arg.dtype.is_float:
        return ir.Const(ir.round_to(float(arg.value), ir.DType.F16), ir.DType.F16)
    return arg if not arg.dtype.is_float else None


def narrow_to_half(expr: ir.Expr) -> ir.Expr:
    """``expr`` with its float16 ops computed in half (``native_half``): ``cast<f16>(op(cast<f32>(a),
    cast<f32>(b)))`` -- float32 arithmetic rounded to float16, the IR's form -- becomes ``op(a, b)``
    of type float16, which the writer renders in ``half`` registers."""
    memo: dict[ir.Expr, ir.Expr] = {}

    def go(e: ir.Expr) -> ir.Expr:
        if e in memo:
            return memo[e]
        out = e
        if isinstance(e, ir.Call):
            args = tuple(go(a) for a in e.args)
            inner = args[0] if e.op == "cast" else None
            if e.dtype is ir.DType.F16 and isinstance(inner, ir.Call) and inner.op != "cast" \
                    and inner.dtype is ir.DType.F32:
                narrowed = [_as_half(a) for a in inner.args]
                if all(n is not None for n in narrowed):
                    out = ir.Call(inner.op, tuple(n for n in narrowed if n is not None), ir.DType.F16)
                else:
                    out = ir.Call("cast", (inner,), ir.DType.F16)
            elif any(a is not b for a, b in zip(args, e.args, strict=True)):
                out = ir.Call(e.op, args, e.dtype)
        memo[e] = out
        return out

    return go(expr)


def _native_stores(stores: Sequence[Store], params: Mapping[str, Param], native_half: bool) -> tuple[list[Store], bool]:
    """The stores to render and whether they compute in half (``native_half`` and float16 data)."""
    if not native_half or not any(p.dtype is ir.DType.F16 for p in params.values()):
        return list(stores), False
    return [Store(s.buffer, s.index, narrow_to_half(s.value), s.when) for s in stores], True


def render_pointwise(spec: PointwiseKernel, params: dict[str, Param], profile: DeviceProfile,
                     native_half: bool = False) -> tuple[str, tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """Text, global and local size and the extensions of a pointwise kernel: one work-item per
    element, returning early past the last."""
    numel = math.prod(spec.ranges)
    stores, native = _native_stores(spec.stores, params, native_half)
    writer = CodeWriter(params, var_names(spec.loop_vars), native_half=native, linear=("x", spec.loop_vars, spec.ranges))
    write_stores(writer, stores, "x", spec.ranges, spec.loop_vars)
    body = writer.take_lines()
    index_defs = unravel_lines(writer, "x", spec.loop_vars, spec.ranges, used_by=body)
    local = linear_local_size(numel, profile)
    text = "\n".join([
        f"#define INDEX_T {index_ctype_for(params, numel)}",
        *kernel_opening(),
        "    const INDEX_T x = get_global_id(0);",
        f"    if (x >= {numel}) return;",
        *("    " + ln for ln in index_defs + body),
        "}",
        "",
    ])
    return text, (round_up(max(numel, 1), local),), (local,), _extensions(native)


#: Placeholders in a segment's text rendered once for its grouping: its temporaries' prefix and its
#: k-th buffer parameter (characters no generated C contains).
_TEMP_MARK = "@t"
_PARAM_MARK = re.compile(r"@p(\d+)@")


@dataclass(frozen=True)
class _SegmentText:
    """A segment's stores and index definitions with its temporaries as ``@tN`` and its buffers
    as ``@pJ@``, J numbering them in the order the text first uses them (``buffers[J]`` is that
    buffer's position among the kernel's parameters): segments of equal ``lines`` (a model's
    repeated blocks, parameters of one shape) compute the same code on other buffers."""

    start: int
    numel: int
    ranges: tuple[int, ...]
    lines: tuple[str, ...]
    buffers: tuple[int, ...]

    def filled(self, prefix: str, names: Sequence[str]) -> list[str]:
        """The text with temporaries named ``prefix``N and buffer J named ``names[J]``."""
        return [_PARAM_MARK.sub(lambda m: names[int(m.group(1))], ln).replace(_TEMP_MARK, prefix) for ln in self.lines]


def _segment_text(spec: PointwiseKernel, start: int, params: dict[str, Param], native_half: bool) -> _SegmentText:
    marked = {b: replace(p, c_name=f"@p{k}@") for k, (b, p) in enumerate(params.items())}
    stores, native = _native_stores(spec.stores, params, native_half)
    writer = CodeWriter(marked, var_names(spec.loop_vars), prefix=_TEMP_MARK, native_half=native,
                        linear=("x", spec.loop_vars, spec.ranges))
    write_stores(writer, stores, "x", spec.ranges, spec.loop_vars)
    body = writer.take_lines()
    lines = unravel_lines(writer, "x", spec.loop_vars, spec.ranges, used_by=body) + body
    used = list(dict.fromkeys(int(m.group(1)) for ln in lines for m in _PARAM_MARK.finditer(ln)))
    order = {k: j for j, k in enumerate(used)}
    canonical = tuple(_PARAM_MARK.sub(lambda m: f"@p{order[int(m.group(1))]}@", ln) for ln in lines)
    return _SegmentText(start, math.prod(spec.ranges), tuple(spec.ranges), canonical, tuple(used))


def _segment_tree(leaves: list[list[str]], offsets: list[int], lo: int, hi: int) -> list[str]:
    """Statements running leaf ``k`` of ``leaves[lo:hi]`` for the ``gx`` in its range: a balanced
    binary decision on constant offsets (log2(segments) comparisons per work-item)."""
    if hi - lo == 1:
        return leaves[lo]
    mid = (lo + hi) // 2
    return [f"if (gx < {offsets[mid]}) {{", *("    " + ln for ln in _segment_tree(leaves, offsets, lo, mid)),
            "} else {", *("    " + ln for ln in _segment_tree(leaves, offsets, mid, hi)), "}"]


def _segment_leaves(texts: list[_SegmentText], params: dict[str, Param]) -> tuple[list[list[str]], list[str], list[str]]:
    """The decision tree's leaves, the declarations before it and the shared bodies after it.

    A segment whose text no other segment has is its own leaf (its code on its own buffers).
    Segments of equal text are one group: each one's leaf only points the group's buffer
    variables at its buffers and sets its element, and the group's code follows the tree once, so
    the kernel's code grows with its distinct segments, not with all of them (twelve identical
    blocks' optimizer updates compile as one block's).
    """
    c_names = [p.c_name for p in params.values()]
    records = [p.record() for p in params.values()]
    # (keyed by the buffers' pointer types too: one group's variables are declared once)
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[int]] = {}
    for k, text in enumerate(texts):
        if all(records[b].role is Role.BUFFER for b in text.buffers):
            groups.setdefault((text.lines, tuple(records[b].pointer_type() for b in text.buffers)), []).append(k)
    declarations: list[str] = []
    bodies: list[str] = []
    group_of: dict[int, int] = {}
    for members in (m for m in groups.values() if len(m) > 1):
        g = len(set(group_of.values()))
        first = texts[members[0]]
        local = [f"g{g}_p{j}" for j in range(len(first.buffers))]
        # (no ``restrict``: a copy of a restrict parameter in the parameter's own block)
        declarations += [f"{records[b].pointer_type()} {name} = 0;" for b, name in zip(first.buffers, local, strict=True)]
        bodies += [f"{'if' if g == 0 else '} else if'} (segment_group == {g}) {{",
                   "    const INDEX_T x = segment_x;", *("    " + ln for ln in first.filled(f"g{g}_t", local))]
        group_of.update(dict.fromkeys(members, g))
    if bodies:
        bodies.append("}")
        declarations = ["int segment_group = -1;", "INDEX_T segment_x = 0;", *declarations]
    leaves: list[list[str]] = []
    for k, text in enumerate(texts):
        comment = f"// segment {k}: elements [{text.start}, {text.start + text.numel}), pointwise over {list(text.ranges)}"
        group = group_of.get(k)
        if group is None:
            first_line = "const INDEX_T x = gx;" if text.start == 0 else f"const INDEX_T x = gx - {text.start};"
            leaves.append([comment, first_line, *text.filled(f"s{k}_t", [c_names[b] for b in text.buffers])])
        else:
            leaves.append([f"{comment}: group {group}'s code", f"segment_group = {group};",
                           f"segment_x = gx - {text.start};",
                           *(f"g{group}_p{j} = {c_names[b]};" for j, b in enumerate(text.buffers))])
    return leaves, declarations, bodies


def render_segmented(spec: SegmentedKernel, params: dict[str, Param], profile: DeviceProfile,
                     native_half: bool = False) -> tuple[str, tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """Text, global and local size and the extensions of a segmented kernel: one work-item per
    element of every segment, segment ``k`` taking items ``[offsets[k], offsets[k + 1])``."""
    offsets = spec.offsets
    total = offsets[-1]
    texts = [_segment_text(seg, offsets[k], params, native_half) for k, seg in enumerate(spec.segments)]
    leaves, declarations, bodies = _segment_leaves(texts, params)
    native = _native_stores([], params, native_half)[1]
    local = linear_local_size(total, profile)
    text = "\n".join([
        f"#define INDEX_T {index_ctype_for(params, total)}",
        *kernel_opening(),
        "    const INDEX_T gx = get_global_id(0);",
        f"    if (gx >= {total}) return;",
        *("    " + ln for ln in declarations),
        *("    " + ln for ln in _segment_tree(leaves, offsets, 0, len(leaves))),
        *("    " + ln for ln in bodies),
        "}",
        "",
    ])
    return text, (round_up(max(total, 1), local),), (local,), _extensions(native)


def use_workgroup_reduction(outputs: int, reduction_numel: int, choices: KernelChoices) -> bool:
    """One work-group per output when each output has much to reduce and outputs alone would not
    keep the device busy (``choices.workgroup_reduction_outputs``: ~256 work-items per compute unit)."""
    return (reduction_numel >= choices.workgroup_reduction_length
            and outputs < choices.workgroup_reduction_outputs)


class _ReductionWriter:
    """Renders a ReductionKernel: an outer loop, passes over the row, outer stores."""

    def __init__(self, spec: ReductionKernel, params: dict[str, Param], profile: DeviceProfile,
                 choices: KernelChoices) -> None:
        self.spec = spec
        self.outputs = math.prod(spec.outer)
        self.rnumel = spec.inner_numel
        self.workgroup = use_workgroup_reduction(self.outputs, self.rnumel, choices)
        self.local = (reduction_local_size(self.rnumel, profile) if self.workgroup
                      else linear_local_size(self.outputs, profile))
        self.accs = spec.accumulators()
        self.acc_names = {a.buffer: f"acc{k}" for k, a in enumerate(self.accs)}
        registers = {}
        for a in self.accs:
            name = self.acc_names[a.buffer]
            registers[ir.Load(a.buffer, spec.loop_vars, a.dtype)] = f"{name}_index" if self._is_arg(a) else name
        self.writer = CodeWriter(params, var_names(spec.loop_vars), registers=registers)

    @staticmethod
    def _is_arg(acc: Accumulator) -> bool:
        return acc.reduce_op in ("argmax", "argmin")

    def _acc_ctype(self, acc: Accumulator) -> str:
        return value_ctype(acc.value.dtype if self._is_arg(acc) else acc.dtype)

    def _acc_value_dtype(self, acc: Accumulator) -> ir.DType:
        return acc.value.dtype if self._is_arg(acc) else acc.dtype

    @staticmethod
    def _is_compensated(acc: Accumulator) -> bool:
        """Floating-point sums carry a Kahan compensation term through the loop: a plain running sum
        loses O(n) roundings over a long row, where eager's cascade sums lose O(log n), and the
        difference showed as BatchNorm/LayerNorm statistics several times further from float64 than
        eager's. The loop is bandwidth-bound, so the three extra additions per element are free."""
        return acc.reduce_op == "sum" and acc.dtype.is_float

    def _update(self, acc: Accumulator, value: str) -> str:
        name = self.acc_names[acc.buffer]
        if self._is_arg(acc):
            better = arg_better(acc.reduce_op, value, "rl", name, f"{name}_index", self._acc_value_dtype(acc))
            return f"if ({better}) {{ {name} = {value}; {name}_index = rl; }}"
        if self._is_compensated(acc):
            ctype = self._acc_ctype(acc)
            return (f"{{ const {ctype} {name}_y = ({value}) - {name}_c; const {ctype} {name}_t = {name} + {name}_y; "
                    f"{name}_c = ({name}_t - {name}) - {name}_y; {name} = {name}_t; }}")
        return f"{name} = {reduction_combine(acc.reduce_op, name, value, acc.dtype)};"

    def _tree(self, acc: Accumulator) -> list[str]:
        name = self.acc_names[acc.buffer]
        lines = [f"{name}_partial[lid] = {name};"]
        if self._is_arg(acc):
            lines.append(f"{name}_partial_index[lid] = {name}_index;")
        lines += ["barrier(CLK_LOCAL_MEM_FENCE);", f"for (int s = {GROUP_SIZE} / 2; s > 0; s >>= 1) {{",
                  "    if (lid < s) {"]
        if self._is_arg(acc):
            better = arg_better(acc.reduce_op, f"{name}_partial[lid + s]", f"{name}_partial_index[lid + s]",
                                f"{name}_partial[lid]", f"{name}_partial_index[lid]", self._acc_value_dtype(acc))
            lines += [f"        if ({name}_partial_index[lid + s] >= 0 && {better}) {{",
                      f"            {name}_partial[lid] = {name}_partial[lid + s];",
                      f"            {name}_partial_index[lid] = {name}_partial_index[lid + s];",
                      "        }"]
        else:
            combined = reduction_combine(acc.reduce_op, f"{name}_partial[lid]", f"{name}_partial[lid + s]",
                                         acc.dtype)
            lines.append(f"        {name}_partial[lid] = {combined};")
        lines += ["    }", "    barrier(CLK_LOCAL_MEM_FENCE);", "}", f"{name} = {name}_partial[0];"]
        if self._is_arg(acc):
            lines.append(f"{name}_index = {name}_partial_index[0];")
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        return lines

    def render(self) -> tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
        spec, writer = self.spec, self.writer
        body: list[str] = []
        loop = (f"for (INDEX_T rl = lid; rl < {self.rnumel}; rl += {GROUP_SIZE})" if self.workgroup
                else f"for (INDEX_T rl = 0; rl < {self.rnumel}; ++rl)")
        for phase in spec.phases:
            body += writer.take_lines()
            for acc in phase.accumulators:
                acc_name = self.acc_names[acc.buffer]
                body.append(f"{self._acc_ctype(acc)} {acc_name} = "
                            f"{reduction_init(acc.reduce_op, self._acc_value_dtype(acc))};")
                if self._is_arg(acc):
                    body.append(f"long {acc_name}_index = -1;")
                if self._is_compensated(acc):
                    body.append(f"{self._acc_ctype(acc)} {acc_name}_c = 0;")
            writer.open_scope(var_names(spec.reduction_vars))
            updates = [self._update(acc, writer.expr(acc.value)) for acc in phase.accumulators]
            write_stores(writer, phase.stores)
            r_defs = unravel_lines(writer, "rl", spec.reduction_vars, spec.inner)
            inner = writer.close_scope()
            body += writer.take_lines()
            body.append(loop + " {")
            body += ["    " + ln for ln in r_defs + inner + updates]
            body.append("}")
            if self.workgroup:
                for acc in phase.accumulators:
                    body += self._tree(acc)
        outer_writer_lines: list[str] = []
        write_stores(writer, spec.outer_stores)
        outer_writer_lines = writer.take_lines()
        if self.workgroup and outer_writer_lines:
            body += ["if (lid == 0) {", *("    " + ln for ln in outer_writer_lines), "}"]
        else:
            body += outer_writer_lines
        i_defs = unravel_lines(writer, "x", spec.loop_vars, spec.outer)
        writer.close_scope()

        lines = [f"#define INDEX_T {index_ctype_for(writer.params, self.outputs, self.rnumel)}"]
        attribute = f"__attribute__((reqd_work_group_size({GROUP_SIZE}, 1, 1))) " if self.workgroup else ""
        lines += kernel_opening(attribute)
        if self.workgroup:
            for acc in self.accs:
                acc_name = self.acc_names[acc.buffer]
                lines.append(f"    __local {self._acc_ctype(acc)} {acc_name}_partial[{GROUP_SIZE}];")
                if self._is_arg(acc):
                    lines.append(f"    __local long {acc_name}_partial_index[{GROUP_SIZE}];")
            lines += ["    const INDEX_T x = get_group_id(0);", "    const int lid = get_local_id(0);"]
            global_size = (self.outputs * self.local,)
            options: tuple[str, ...] = (f"-D{GROUP_SIZE}={self.local}",)
        else:
            options = ()
            lines += ["    const INDEX_T x = get_global_id(0);", f"    if (x >= {self.outputs}) return;"]
            global_size = (round_up(max(self.outputs, 1), self.local),)
        lines += ["    " + ln for ln in i_defs + body]
        lines += ["}", ""]
        return "\n".join(lines), options, global_size, (self.local,)


def render_reduction(spec: ReductionKernel, params: dict[str, Param], profile: DeviceProfile,
                     choices: KernelChoices) -> tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Text, build options, global and local size of one reduction kernel. A tree reduction (one
    work-group per output) takes its group size as the ``-DGROUP_SIZE`` option; the others, like
    pointwise kernels, return early past their last output, so any local size suits them.
    ``choices``: whether it is a tree reduction (:func:`use_workgroup_reduction`)."""
    return _ReductionWriter(spec, params, profile, choices).render()


def tree_reduction_candidates(outputs: int, default: int, profile: DeviceProfile) -> list[Launch]:
    """Launches a tuner may try for a tree reduction of ``outputs`` rows (one group per row), the
    default group size first."""
    return [Launch((f"-D{GROUP_SIZE}={size}",), (outputs * size,), (size,))
            for size in reduction_local_candidates(default, profile)]


def store_ctype(dtype: ir.DType) -> str:
    return STORAGE_CTYPE[dtype]
