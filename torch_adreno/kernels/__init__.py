"""Kernels: FusedGraph + MemoryPlan -> KernelProgram (OpenCL C source and launch geometry).

Generated kernels (pointwise, reduction) come from the expression table and the code writer;
heavy ops (GEMM, and the convolutions built on it) instantiate ``.cl`` templates with ``-D``
options, with the fused prologues and epilogues written by the same code writer. Every kernel's
source opens with the FX nodes it came from.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from torch_adreno import ir
from torch_adreno.fusion import (
    FusedGraph,
    FusionGroup,
    GemmKernel,
    HostKernel,
    PointwiseKernel,
    ReductionKernel,
    SegmentedKernel,
    TemplateKernel,
)
from torch_adreno.ir.ops import OPS
from torch_adreno.kernels.attention import attention_flops, render_attention
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.expressions import INDEX_CHECK_CALL
from torch_adreno.kernels.gemm import gemm_candidates, render_gemm
from torch_adreno.kernels.params import KernelParam
from torch_adreno.kernels.pointwise_reduction import (
    GROUP_SIZE,
    buffer_bytes,
    make_params,
    read_bytes,
    render_pointwise,
    render_reduction,
    render_segmented,
    template_read_bytes,
    tree_reduction_candidates,
)
from torch_adreno.kernels.program import (
    HostStep,
    ImageOperand,
    KernelProgram,
    KernelSource,
    Step,
    c_identifier,
)
from torch_adreno.kernels.workgroup import Launch, guarded_linear_candidates
from torch_adreno.kernels.writer import Param, records, with_index_check_params
from torch_adreno.memory import MemoryPlan
from torch_adreno.targets import DeviceProfile

__all__ = ["HostStep", "ImageOperand", "KernelChoices", "KernelProgram", "KernelSource", "launch_candidates",
           "render_program"]


def kernel_name(graph_name: str, index: int, group: FusionGroup, kind: str | None = None) -> str:
    """Deterministic and descriptive: graph, position, kind and the ATen ops it computes.

    ``kind`` overrides the group's (``splitsum``: the second launch of a split-K GEMM).
    """
    ops = list(dict.fromkeys(o.op.split(".")[1] if "." in o.op else o.op for o in group.origins))
    kind = kind or {"pointwise": "pw", "segmented": "seg", "reduction": "red", "gemm": "gemm"}.get(group.kind, group.kind)
    summary = "_".join(ops[:3]) + ("_etc" if len(ops) > 3 else "")
    return c_identifier(f"{graph_name}_{index}_{kind}_{summary}").lower()


def graph_stem(graph_name: str) -> str:
    """The graph's name without its process-wide number (``forward_12`` -> ``forward``): what a
    kernel's symbol starts with; a name without a number is its own stem."""
    stem, _, number = graph_name.rpartition("_")
    return stem if stem and number.isdigit() else graph_name


def kernel_symbol(graph_name: str, index: int, group: FusionGroup, kind: str | None = None) -> str:
    """The C function name of the kernel :func:`kernel_name` names: the same without the graph's
    number (``forward_12_3_gemm_addmm`` -> ``forward_3_gemm_addmm``), so the text of a graph's
    program does not depend on how many graphs the process compiled before it (binary cache hits).
    Unique within a graph (the position is in it), which is all a program needs."""
    return kernel_name(graph_stem(graph_name), index, group, kind)


def _describe(group: FusionGroup) -> str:
    spec = group.spec
    if isinstance(spec, PointwiseKernel):
        return f"pointwise over {list(spec.ranges)}"
    if isinstance(spec, SegmentedKernel):
        return (f"{len(spec.segments)} independent pointwise kernels as segments of one launch, "
                f"{spec.offsets[-1]} elements")
    if isinstance(spec, ReductionKernel):
        ops = ", ".join(a.reduce_op for a in spec.accumulators())
        return f"{ops} over {list(spec.inner)} for each of {list(spec.outer)} in {len(spec.phases)} pass(es)"
    if isinstance(spec, TemplateKernel):
        return f"fused {spec.node.target.replace('_', ' ')} {dict(spec.node.attributes)}"
    assert isinstance(spec, GemmKernel)
    g = spec.gemm
    return f"gemm batch={g.batch} m={g.m} n={g.n} k={g.k}, {len(spec.stores)} store(s)"


def _float_ops(expr: ir.Expr) -> int:
    """Float operations of one evaluation of ``expr``: each distinct call with a float result costs
    its op's ``flops`` (the op table's rule, :mod:`torch_adreno.ir.ops`); other calls cost none."""
    return sum(OPS[e.op].flops for e in ir.walk(expr) if isinstance(e, ir.Call) and e.dtype.is_float)


def estimate_flops(group: FusionGroup) -> int:
    """Float operations of one launch: 2mnk per GEMM (plus its epilogue), per-element expression
    ops (:func:`_float_ops`) times the elements of pointwise and reduction loops, one more per
    element a reduction folds in."""
    spec = group.spec
    if isinstance(spec, GemmKernel):
        g = spec.gemm
        epilogue = sum(_float_ops(s.value) for s in spec.stores)
        return 2 * g.batch * g.m * g.n * g.k + g.batch * g.m * g.n * epilogue
    if isinstance(spec, PointwiseKernel):
        return math.prod(spec.ranges) * sum(_float_ops(s.value) for s in spec.stores)
    if isinstance(spec, SegmentedKernel):
        return sum(math.prod(seg.ranges) * sum(_float_ops(s.value) for s in seg.stores) for seg in spec.segments)
    if isinstance(spec, ReductionKernel):
        inner = sum(_float_ops(a.value) + 1 for a in spec.accumulators())
        inner += sum(_float_ops(s.value) for p in spec.phases for s in p.stores)
        outer = sum(_float_ops(s.value) for s in spec.outer_stores)
        return math.prod(spec.outer) * (spec.inner_numel * inner + outer)
    if isinstance(spec, TemplateKernel):
        return attention_flops(spec.node)
    return 0


def render_program(fused: FusedGraph, plan: MemoryPlan, profile: DeviceProfile,
                   choices: KernelChoices | None = None) -> KernelProgram:
    """The graph's kernels, with the code ``choices`` made for the device (default: the device's
    own under default options, :meth:`KernelChoices.for_device`): the GEMM template and tiles,
    tree reductions, ``images`` (GEMM and convolution operands read through 2D images where their
    buffers allow, :func:`torch_adreno.kernels.gemm.image_operands`) and ``native_half`` (float16
    pointwise kernels compute in ``half`` registers; the device must have cl_khr_fp16, which the
    caller checks)."""
    choices = choices if choices is not None else KernelChoices.for_device(profile)
    steps: list[Step] = []
    graph = fused.graph
    for index, group in enumerate(fused.groups):
        spec = group.spec
        if isinstance(spec, HostKernel):
            steps.append(HostStep(spec.node))
            continue
        storage = {name: plan.storage_root(name) for name in [*group.writes, *group.reads]
                   if name in plan.allocations}
        params = make_params(graph, group.writes, group.reads, storage)
        kernels = _render_group(graph, group, index, params, profile, choices)
        if any(INDEX_CHECK_CALL in k.text for k in kernels):
            # Rendered again with the two arguments the index checks read (the text is the same
            # otherwise): only kernels that index by tensor values take them.
            kernels = _render_group(graph, group, index, with_index_check_params(params), profile, choices)
        steps.extend(kernels)
    return KernelProgram(graph, plan, steps, profile, choices)


def _render_group(graph: ir.Graph, group: FusionGroup, index: int, params: dict[str, Param],
                  profile: DeviceProfile, choices: KernelChoices) -> list[KernelSource]:
    """The launches of one fusion group, each with the records of ``params`` as its arguments."""
    spec = group.spec
    kernel = functools.partial(_kernel, graph, group, index)
    options: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    if isinstance(spec, GemmKernel):
        return _gemm_steps(graph, group, spec, index, params, profile, choices)
    if isinstance(spec, TemplateKernel):
        rendered = render_attention(spec, params, profile)
        return [kernel("attention", rendered.text, rendered.build_options, rendered.arguments, rendered.global_size,
                       rendered.local_size, template_read_bytes(graph, spec.node, group.reads),
                       buffer_bytes(graph, group.writes), estimate_flops(group), writes=tuple(group.writes),
                       reads=tuple(group.reads),
                       name_kind=spec.node.target, macros=rendered.macros)]
    if isinstance(spec, PointwiseKernel):
        text, global_size, local_size, extensions = render_pointwise(spec, params, profile, choices.native_half)
    elif isinstance(spec, SegmentedKernel):
        text, global_size, local_size, extensions = render_segmented(spec, params, profile, choices.native_half)
    else:
        assert isinstance(spec, ReductionKernel)
        text, options, global_size, local_size = render_reduction(spec, params, profile, choices)
    return [kernel(group.kind, text, options, records(params), global_size, local_size,
                   read_bytes(graph, spec, group.reads), buffer_bytes(graph, group.writes), estimate_flops(group),
                   writes=tuple(group.writes), reads=tuple(group.reads), extensions=extensions)]


def _kernel(graph: ir.Graph, group: FusionGroup, index: int, kind: str, text: str, build_options: tuple[str, ...],
            arguments: tuple[KernelParam, ...], global_size: tuple[int, ...], local_size: tuple[int, ...],
            bytes_read: int, bytes_written: int, flops: int, *, writes: tuple[str, ...], reads: tuple[str, ...],
            name_kind: str | None = None, description: str | None = None, macros: tuple[str, ...] = ("INDEX_T",),
            images: tuple[ImageOperand, ...] = (), extensions: tuple[str, ...] = ()) -> KernelSource:
    """One launch of ``group`` (the ``index``-th of its graph), named and described; ``name_kind``
    overrides the kind in its name (a split GEMM's sum)."""
    return KernelSource(
        name=kernel_name(graph.name, index, group, name_kind), symbol=kernel_symbol(graph.name, index, group, name_kind),
        kind=kind, text=text, build_options=build_options, arguments=arguments, global_size=global_size,
        local_size=local_size, origins=group.origins, bytes_read=bytes_read, bytes_written=bytes_written,
        description=_describe(group) if description is None else description, macros=macros, flops=flops,
        images=images, writes=writes, reads=reads, extensions=extensions)


def _gemm_steps(graph: ir.Graph, group: FusionGroup, spec: GemmKernel, index: int, params: dict[str, Param],
                profile: DeviceProfile, choices: KernelChoices) -> list[KernelSource]:
    """One launch, or for a split-K GEMM two: the slices into ``spec.partials``, then their sum
    through the epilogue (each launch counted with the bytes it moves)."""
    kernel = functools.partial(_kernel, graph, group, index)
    launches = render_gemm(spec, params, profile, choices)
    if len(launches) == 1:
        (only,) = launches
        return [kernel(only.kind, only.text, only.build_options, only.arguments, only.global_size, only.local_size,
                       buffer_bytes(graph, group.reads), buffer_bytes(graph, group.writes), estimate_flops(group),
                       writes=tuple(group.writes), reads=tuple(group.reads), macros=only.macros, images=only.images)]
    assert spec.partials is not None
    g = spec.gemm
    operands = {ld.buffer for ld in [*ir.loads(g.lhs), *ir.loads(g.rhs)]}
    stores = [*spec.stores, *([spec.row_sum] if spec.row_sum is not None else [])]
    epilogue_reads = {ld.buffer for s in stores for e in (s.value, *s.index, *([s.when] if s.when is not None else []))
                      for ld in ir.loads(e)} - {g.output}
    results = [w for w in group.writes if w != spec.partials]
    slices, total = launches
    multiply_flops = 2 * g.batch * g.m * g.n * g.k
    return [
        kernel(slices.kind, slices.text, slices.build_options, slices.arguments, slices.global_size,
               slices.local_size, buffer_bytes(graph, sorted(operands)), buffer_bytes(graph, [spec.partials]),
               multiply_flops, writes=(spec.partials,), reads=tuple(r for r in group.reads if r in operands),
               macros=slices.macros, images=slices.images),
        kernel(total.kind, total.text, total.build_options, total.arguments, total.global_size, total.local_size,
               buffer_bytes(graph, [spec.partials, *sorted(epilogue_reads & set(group.reads))]),
               buffer_bytes(graph, results), estimate_flops(group) - multiply_flops, writes=tuple(results),
               reads=(spec.partials, *(r for r in group.reads if r in epilogue_reads)), name_kind="splitsum",
               description=f"adds up {spec.split_k} k slices of {_describe(group)}", macros=total.macros),
    ]


def _defines(options: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name, _, value in (o[2:].partition("=") for o in options if o.startswith("-D"))}


def _with_defines(kernel: KernelSource, defines: tuple[str, ...]) -> tuple[str, ...]:
    """``kernel``'s build options with the ``-D`` options named in ``defines`` given new values."""
    new = _defines(defines)
    missing = set(new) - set(_defines(kernel.build_options))
    if missing:
        raise ValueError(f"kernel {kernel.name} has no build option(s) {sorted(missing)} to vary")
    options = []
    for option in kernel.build_options:
        name = option[2:].partition("=")[0] if option.startswith("-D") else None
        options.append(f"-D{name}={new[name]}" if name in new else option)
    return tuple(options)


def launch_candidates(kernel: KernelSource, profile: DeviceProfile,
                      choices: KernelChoices | None = None) -> list[KernelSource]:
    """The variants of ``kernel`` a tuner may time on ``profile``'s device, ``kernel`` itself first
    (``choices``: those it was rendered with, whose heuristic tiling comes first; default: the device's).

    Every variant computes the same values as ``kernel`` in exact arithmetic; they differ in launch
    geometry and, for the templates, in the ``-D`` options that go with it: the local size of a
    pointwise or per-output reduction kernel (both return early past their last item, so the
    global size is rounded up to any local size), the group size of a tree reduction
    (``-DGROUP_SIZE``), and the tiling of a GEMM (``-DTILE_*``/``-DWPT_*`` of ``gemm.cl``, or
    ``-DWPT_M`` and the group width of ``gemm_direct.cl``). Sources are unchanged: a variant needs
    a build of its own only where its build options differ.
    """
    defines = _defines(kernel.build_options)
    launches: list[Launch]
    if kernel.kind == "gemm":
        granule = int(defines.get("K_GRANULE", "1"))
        launches = gemm_candidates(int(defines["SIZE_M"]), int(defines["SIZE_N"]), kernel.global_size[2],
                                   "TILE_M" in defines, profile, int(defines["TILE_K"]) if granule > 1 else None,
                                   choices)
    elif kernel.kind == "attention":
        launches = []  # (one geometry: its blocks follow from the head dimension and local memory)
    elif GROUP_SIZE in defines:
        launches = tree_reduction_candidates(kernel.global_size[0] // kernel.local_size[0], int(defines[GROUP_SIZE]),
                                             profile)
    else:
        (global_size,), (local_size,) = kernel.global_size, kernel.local_size
        launches = guarded_linear_candidates(global_size, local_size, profile)
    variants = [kernel]
    seen = {(kernel.build_options, kernel.global_size, kernel.local_size)}
    for launch in launches:
        options = _with_defines(kernel, launch.defines)
        key = (options, launch.global_size, launch.local_size)
        if key not in seen:
            seen.add(key)
            variants.append(dataclasses.replace(kernel, build_options=options, global_size=launch.global_size,
                                                local_size=launch.local_size))
    return variants
