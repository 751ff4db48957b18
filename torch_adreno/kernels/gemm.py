"""GEMM template instances: operand functions from the code writer plus ``gemm.cl`` with -D options."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from importlib import resources

from torch_adreno import ir
from torch_adreno.fusion import GemmKernel
from torch_adreno.kernels.generated import index_ctype_for, write_stores
from torch_adreno.kernels.params import KernelParam, image_record
from torch_adreno.kernels.program import HELPER_NAMING, HELPER_NAMING_MACROS, ImageOperand, helper_name
from torch_adreno.kernels.workgroup import (
    MAX_CANDIDATE_GROUP,
    Launch,
    candidate_span,
    group_limit,
    linear_local_size,
    round_up,
)
from torch_adreno.kernels.writer import CodeWriter, Param, records
from torch_adreno.target import DeviceProfile


@dataclass(frozen=True)
class DirectTiling:
    """Blocking of ``gemm_direct.cl``: ``wpt_m`` rows x 8 columns per work-item, ``local_n`` items per group."""

    wpt_m: int
    local_n: int


@dataclass(frozen=True)
class GemmTiling:
    tile_m: int
    tile_n: int
    tile_k: int
    wpt_m: int
    wpt_n: int

    @property
    def threads(self) -> tuple[int, int]:
        return (self.tile_n // self.wpt_n, self.tile_m // self.wpt_m)

    @property
    def vector_widths(self) -> tuple[int, int]:
        """Adjacent rows and columns a work-item owns (``VW_M``, ``VW_N``): its local-memory reads
        are float4 (or float2) where its block allows."""
        return (_vector_width(self.wpt_m), _vector_width(self.wpt_n))

    def local_bytes(self) -> int:
        """Both tiles, their rows padded by 4 floats as ``gemm.cl`` lays them out."""
        return 4 * self.tile_k * (self.tile_m + 4 + self.tile_n + 4)


def _vector_width(outputs: int) -> int:
    return 4 if outputs % 4 == 0 else 2 if outputs % 2 == 0 else 1


#: Macros a GEMM kernel's prelude defines (the templates undefine their own).
GEMM_MACROS = ("INDEX_T", "LOAD_A", "LOAD_B", "STORE_C", "STORE_ROW", "A_RAW_T", "B_RAW_T", "FETCH_A", "FETCH_B",
               "FINISH_A", "FINISH_B", *HELPER_NAMING_MACROS)

#: ``gemm.cl`` prefetches at every K step, the last included (``PREFETCH_EVERY_STEP``); False
#: restores the branch around the last one (kept to measure the two against each other).
PREFETCH_EVERY_STEP = True
#: Operands that only widen (or round) one loaded element are held in the prefetch registers as
#: loaded and finished as they are stored into the tiles (``gemm.cl``'s ``FETCH``/``FINISH``);
#: False finishes them at the load, as before (kept to measure).
RAW_PREFETCH = True


def _tile_for(extent: int) -> int:
    return 64 if extent >= 64 else 32 if extent >= 32 else 16


def _threads_per_direction(profile: DeviceProfile) -> int:
    return 16 if profile.max_work_group_size >= 256 else 8


def _fit_local_memory(tiling: GemmTiling, profile: DeviceProfile) -> GemmTiling:
    while tiling.local_bytes() > profile.local_mem_bytes and tiling.tile_k > 4:
        tiling = dataclasses.replace(tiling, tile_k=tiling.tile_k // 2)
    return tiling


#: Devices with at least this many compute units get the 128-wide GEMM tiles by default.
DESKTOP_COMPUTE_UNITS = 16
#: 128 x 128 tiles numbering fewer than this many per compute unit become 128 x 64 (:func:`choose_tiling`).
HALF_FILLED_UNITS = 1.5


def _groups(m: int, n: int, batch: int, tile_m: int, tile_n: int) -> int:
    return math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch


def choose_tiling(m: int, n: int, batch: int, profile: DeviceProfile, sixteen_bit: bool = False) -> GemmTiling:
    """Output tile per work-group of a ``batch`` x ``m`` x ``n`` GEMM: on desktop-class GPUs
    128 x 128 (8 x 8 outputs per work-item, K step 8) where the extents allow and the tiles still
    number at least the device's compute units (128 x 64, K step 8, where they number fewer than
    :data:`HALF_FILLED_UNITS` per unit and no operand is ``sixteen_bit``), then 128 x 64; else 64 where the extent allows,
    down to 16 for thin operands (a 6-channel convolution, a 10-class classifier); 16 work-items
    per direction (8 where the device allows fewer than 256 per group)."""
    threads = _threads_per_direction(profile)
    tile_m, tile_n = max(_tile_for(m), threads), max(_tile_for(n), threads)
    # Larger tiles re-read each operand fewer times (a 128 x 128 tile loads 1/64 of an element per
    # multiply-add, a 64 x 64 one 1/32) but make fewer work-groups: take them only while every
    # compute unit still gets a work-group. 8 x 8 accumulators per work-item were measured on a
    # desktop GPU (H200: 1.2x CLBlast); a phone GPU's smaller register file may lose more occupancy
    # than the tile saves, so mobile-class devices (few compute units) keep 64 x 64 until measured
    # there (``tune=True`` tries the larger tiles on any device).
    for big_m, big_n in ((128, 128), (128, 64), (64, 128)) if profile.compute_units >= DESKTOP_COMPUTE_UNITS else ():
        if (m >= big_m and n >= big_n and big_m * big_n >= tile_m * tile_n
                and _groups(m, n, batch, big_m, big_n) >= profile.compute_units):
            tile_m, tile_n = big_m, big_n
            break
    # A K step of 8 halves the 128 x 128 tile's local memory and prefetch registers: more
    # work-groups per compute unit (measured on the H200: 2048^2 and 4096^2 SGEMM 1.25x faster
    # than with 16, while 64 x 64 tiles do best with 16).
    tile_k = 8 if tile_m * tile_n >= 128 * 128 else 16
    if (tile_m, tile_n) == (128, 128) and n >= 128 and threads == 16 and not sixteen_bit \
            and _groups(m, n, batch, 128, 128) < HALF_FILLED_UNITS * profile.compute_units:
        # Between one and 1.5 work-groups of 128 x 128 per compute unit, most units run a lone
        # work-group, at half the rate of two; 128 x 64 tiles, twice as many, did better at every
        # such shape the tuner was given (H200, benchmarks/results/gemm_shapes_h200.jsonl "tuned":
        # GPT-2's c_attn forward, 144 tiles, 180 -> 158 us; c_fc forward, 192, 179 -> 160; the MLP
        # projection's input gradient, 192, 185 -> 152), with the K step of 8. Not with 16-bit
        # operands: GPT-2's bf16 MLP input gradient went 168 -> 204 us with them (H200,
        # benchmarks/results/frozen_weights_h200_session29*.jsonl).
        tile_n = 64
    return _fit_local_memory(GemmTiling(tile_m, tile_n, tile_k, tile_m // threads, tile_n // threads), profile)


def tiling_candidates(m: int, n: int, batch: int, profile: DeviceProfile) -> list[GemmTiling]:
    """Tilings a tuner may try, the heuristic's first: every output tile of 16 to 128 in either
    direction that the extent there fills (16 always; 128 from 128 rows or columns), with the
    heuristic's work-items per direction; then the heuristic's tile with the other count of
    work-items and with each other K step of 8, 16 and 32. Each fits the device's group size and local memory."""
    default = choose_tiling(m, n, batch, profile)
    threads = _threads_per_direction(profile)

    def fills(tile: int, extent: int) -> bool:
        return tile <= _tile_for(extent) or (tile == 128 and extent >= 128)

    shapes: list[tuple[int, int, int, int]] = [
        (tile_m, tile_n, threads, default.tile_k)
        for tile_m in (16, 32, 64, 128) for tile_n in (16, 32, 64, 128)
        if fills(tile_m, m) and fills(tile_n, n)
    ]
    shapes += [(default.tile_m, default.tile_n, t, default.tile_k) for t in (8, 16) if t != threads]
    shapes += [(default.tile_m, default.tile_n, threads, k) for k in (8, 16, 32) if k != default.tile_k]
    tilings = [default]
    for tile_m, tile_n, t, tile_k in shapes:
        if tile_m < t or tile_n < t or t * t > profile.max_work_group_size or tile_m * tile_n > 64 * t * t:
            continue  # (more than 8 x 8 accumulators per work-item spill out of registers)
        tiling = GemmTiling(tile_m, tile_n, tile_k, tile_m // t, tile_n // t)
        if tiling.local_bytes() <= profile.local_mem_bytes and tiling not in tilings:
            tilings.append(tiling)
    return tilings


def choose_direct_tiling(m: int, n: int, profile: DeviceProfile) -> DirectTiling:
    """Blocking of ``gemm_direct.cl``: 8 rows per work-item where there are 8 (else 4 or 1), and
    groups as wide as the column blocks, at most 16."""
    wpt_m = 8 if m >= 8 else 4 if m >= 4 else 1
    column_blocks = math.ceil(n / 8)
    local_n = max(1, min(16, profile.max_work_group_size, 1 << (column_blocks - 1).bit_length()))
    return DirectTiling(wpt_m, local_n)


def direct_tiling_candidates(m: int, n: int, profile: DeviceProfile) -> list[DirectTiling]:
    """Blockings of the direct template a tuner may try, the heuristic's first: each other row
    blocking (1, 2, 4, 8 rows, no more than the rows there are) with the heuristic's group, and
    each group size a quarter to four times the heuristic's (no wider than the column blocks nor
    the device allows) with the heuristic's row blocking."""
    default = choose_direct_tiling(m, n, profile)
    column_blocks = math.ceil(n / 8)
    widest = min(group_limit(profile), MAX_CANDIDATE_GROUP, 1 << (column_blocks - 1).bit_length())
    tilings = [default]
    tilings += [DirectTiling(w, default.local_n) for w in (1, 2, 4, 8) if w != default.wpt_m and w <= max(m, 1)]
    tilings += [DirectTiling(default.wpt_m, size) for size in candidate_span(default.local_n)[1:]
                if 1 <= size <= widest]
    return list(dict.fromkeys(tilings))


def use_local_memory_tiles(profile: DeviceProfile) -> bool:
    """GPUs get the local-memory tiled template; CPU devices, whose "local memory" is plain cache
    and whose barriers are emulated, get the direct one."""
    return profile.is_gpu


def large_tiles_apply(profile: DeviceProfile) -> bool:
    """Whether GEMMs on ``profile``'s device are multiplied in 128 x 128 tiles where their extents
    allow (:func:`choose_tiling`): a desktop-class GPU running the tiled template. The fusion
    stage splits GEMMs of too few such tiles to fill it (``fusion.split_k``)."""
    return use_local_memory_tiles(profile) and profile.compute_units >= DESKTOP_COMPUTE_UNITS


def _unit_stride(expr: ir.Expr, var: ir.Expr, params: dict[str, Param], writer: CodeWriter) -> bool:
    """Whether the first load of ``expr`` moves by one element when ``var`` grows by one."""
    if not isinstance(var, ir.Var):
        return False
    loaded = ir.loads(expr)
    if not loaded:
        return False
    flat = writer.flat_index(loaded[0].buffer, loaded[0].index)
    _, terms = ir.linear_terms(flat)
    return terms.get(var) == 1


def image_width(shape: tuple[int, ...], profile: DeviceProfile) -> int | None:
    """Texels per row of the RGBA float image a buffer of ``shape`` is read through (see
    :class:`ImageOperand`), or None where none fits the device's image limits.

    Rows of the tensor first (the last dimension, then the last two, ...: neighbouring texels in 2D
    are then neighbouring elements of the tensor, what a texture cache's 2D blocks are for), then any
    width that divides the buffer into whole rows. With ``cl_khr_image2d_from_buffer`` a width
    whose row pitch meets the device's pitch alignment comes first (the one nearest the tensor's
    row, for 2D locality), so that the image can share the buffer's memory instead of being a copy
    kept in step with it.
    """
    numel = math.prod(shape)
    if numel == 0 or numel % 4:
        return None
    texels = numel // 4
    rows: list[int] = []
    extent = 1
    for size in reversed(shape):
        extent *= size
        if extent % 4 == 0:
            rows.append(extent // 4)
    divisors = [d for d in range(1, math.isqrt(texels) + 1) if texels % d == 0]
    divisors = sorted({*divisors, *(texels // d for d in divisors)}, reverse=True)
    fitting = [w for w in dict.fromkeys([*rows, *divisors])
               if w <= profile.image2d_max_width and texels // w <= profile.image2d_max_height]
    align = max(profile.image_pitch_alignment, 1) if profile.image_from_buffer else 1
    if not fitting:
        return None
    aligned = [w for w in fitting if w % align == 0]
    if not aligned:
        return fitting[0]
    return min(aligned, key=lambda w: (abs(math.log(w / fitting[0])), -w))


#: Element types a buffer read through an image may have, with the image's channel type: the
#: kernels read every one with ``LOAD_IMAGE_FLOAT`` (``read_imagef`` widens half channels).
IMAGE_CHANNEL_TYPES: dict[ir.DType, str] = {ir.DType.F32: "float32"}


def image_operands(node: ir.Gemm, params: dict[str, Param], profile: DeviceProfile) -> dict[str, ImageOperand]:
    """The buffers the GEMM's operands load that can be read through images: of a type in
    :data:`IMAGE_CHANNEL_TYPES`, only read by the kernel and sharing no bytes with a buffer it
    writes (an image read of memory the same launch writes is undefined), with an image shape
    within the device's limits."""
    chosen: dict[str, ImageOperand] = {}
    for load in [*ir.loads(node.lhs), *ir.loads(node.rhs)]:
        param = params[load.buffer]
        channel_type = IMAGE_CHANNEL_TYPES.get(param.dtype)
        if load.buffer in chosen or param.written or param.aliased or channel_type is None:
            continue
        width = image_width(param.shape, profile)
        if width is not None:
            chosen[load.buffer] = ImageOperand(load.buffer, width, math.prod(param.shape) // 4 // width, channel_type)
    return chosen


def image_c_name(param: Param) -> str:
    return f"{param.c_name}_image"


def image_records(images: dict[str, ImageOperand], params: dict[str, Param]) -> tuple[KernelParam, ...]:
    """The image arguments of the operands in ``images``, in order (after the buffers)."""
    return tuple(image_record(name, image_c_name(params[name]), params[name].dtype) for name in images)


class _ImageOperandWriter(CodeWriter):
    """The code writer, with loads of the image operands rendered as image reads."""

    def __init__(self, params: dict[str, Param], images: dict[str, ImageOperand], var_names: dict[ir.Var, str],
                 prefix: str) -> None:
        super().__init__(params, var_names, prefix=prefix)
        self.images = images

    def _render(self, expr: ir.Expr, guarded: bool) -> str:
        if isinstance(expr, ir.Load) and expr.buffer in self.images:
            offset = self.expr(self.flat_index(expr.buffer, expr.index), guarded)
            image = self.images[expr.buffer]
            return f"LOAD_IMAGE_FLOAT({image_c_name(self.params[expr.buffer])}, {offset}, {image.width})"
        return super()._render(expr, guarded)


def widened_load(expr: ir.Expr, params: dict[str, Param], images: dict[str, ImageOperand]) -> ir.Load | None:
    """The load of a GEMM operand that is that one element's value cast between float types (a
    16-bit weight widened, an activation rounded to autocast's type): the template holds such an
    operand in registers as loaded and finishes it into a float later (``gemm.cl``). None for any
    other operand, and for a bare float32 load (nothing to finish). Zero finishes to zero, what
    the template's out-of-range elements are."""
    casts = 0
    while isinstance(expr, ir.Call) and expr.op == "cast" and expr.dtype.is_float and expr.args[0].dtype.is_float:
        expr, casts = expr.args[0], casts + 1
    if not isinstance(expr, ir.Load) or expr.buffer in images or not expr.dtype.is_float:
        return None
    dtype = params[expr.buffer].dtype
    return expr if dtype.is_half or casts else None


#: The C type a widened load's raw element is held in, by buffer type.
_RAW_CTYPE = {ir.DType.F32: "float", ir.DType.BF16: "ushort", ir.DType.F16: "ushort"}
#: A raw element ``raw`` as a float, by buffer type.
_RAW_VALUE = {ir.DType.F32: "raw", ir.DType.BF16: "adreno_bf16_load(raw)",
              ir.DType.F16: "vload_half(0, (__private const half *)&raw)"}


class _RawFinishWriter(CodeWriter):
    """The code writer, with the widened load rendered as the raw register ``raw`` converted."""

    def __init__(self, params: dict[str, Param], load: ir.Load, var_names: dict[ir.Var, str]) -> None:
        # (the index variables are in scope for the writer's bookkeeping only: the one load that
        # uses them is rendered as ``raw``)
        super().__init__(params, var_names, prefix="finish_t")
        self.raw_load = load

    def expr(self, expr: ir.Expr, guarded: bool = False) -> str:
        if expr == self.raw_load:
            return _RAW_VALUE[self.params[self.raw_load.buffer].dtype]
        return super().expr(expr, guarded)


def _raw_fetch_functions(suffix: str, expr: ir.Expr, load: ir.Load, names: tuple[str, str, str],
                         vars_: tuple[ir.Expr, ...], params: dict[str, Param]) -> tuple[str, str]:
    """The helpers ``<symbol>_fetch<suffix>`` (the raw element) and ``<symbol>_finish<suffix>`` (it as the operand's float)."""
    param = params[load.buffer]
    raw_t = _RAW_CTYPE[param.dtype]
    var_names = {v: n for v, n in zip(vars_, names, strict=True) if isinstance(v, ir.Var)}
    writer = CodeWriter(params, var_names, prefix=f"fetch{suffix}_t")
    offset = writer.expr(writer.flat_index(load.buffer, load.index))
    body = writer.close_scope()
    pointer = param.c_name if param.dtype is not ir.DType.F16 else f"((__global const ushort *){param.c_name})"
    args = ", ".join(f"const INDEX_T {n}" for n in names)
    decls = ", ".join(r.declaration() for r in records(params))
    fetch = "\n".join([f"inline {raw_t} {helper_name('_fetch' + suffix)}({args}, {decls}) {{",
                        *("    " + ln for ln in body), f"    return {pointer}[{offset}];", "}"])
    finisher = _RawFinishWriter(params, load, var_names)
    value = finisher.expr(expr)
    finish = "\n".join([f"inline float {helper_name('_finish' + suffix)}(const {raw_t} raw) {{",
                         *("    " + ln for ln in finisher.close_scope()), f"    return {value};", "}"])
    return fetch, finish


def _operand_function(suffix: str, expr: ir.Expr, names: tuple[str, str, str], vars_: tuple[ir.Expr, ...],
                      params: dict[str, Param], images: dict[str, ImageOperand]) -> str:
    """The helper ``<symbol><suffix>`` computing one operand element (``_load_a``, ``_load_b``)."""
    var_names = {v: n for v, n in zip(vars_, names, strict=True) if isinstance(v, ir.Var)}
    # (temporaries are the function's own: named after the helper's role, not the kernel)
    writer = _ImageOperandWriter(params, images, var_names, prefix=f"{suffix.strip('_')}_t")
    value = writer.expr(expr)
    body = writer.close_scope()
    args = ", ".join(f"const INDEX_T {n}" for n in names)
    decls = ", ".join(r.declaration() for r in (*records(params), *image_records(images, params)))
    return "\n".join([f"inline float {helper_name(suffix)}({args}, {decls}) {{", *("    " + ln for ln in body),
                      f"    return {value};", "}"])


def _store_function(suffix: str, spec: GemmKernel, params: dict[str, Param]) -> str:
    """The epilogue: every store of the kernel, for one (b, m, n) with its accumulated ``value``."""
    v = spec.gemm.vars()
    names: dict[ir.Var, str] = {}
    for key in ("b", "m", "n"):
        var = v[key]
        if isinstance(var, ir.Var):
            names[var] = key
    writer = CodeWriter(params, names, prefix="store_t", registers={spec.result: "value"})
    write_stores(writer, spec.stores)
    body = writer.close_scope()
    decls = ", ".join(p.declaration() for p in params.values())
    return "\n".join([f"inline void {helper_name(suffix)}(const INDEX_T b, const INDEX_T m, const INDEX_T n, "
                      f"const float value, {decls}) {{", *("    " + ln for ln in body), "}"])


def _row_store_function(suffix: str, spec: GemmKernel, params: dict[str, Param]) -> str:
    assert spec.row_sum is not None and spec.row_sum_register is not None
    v = spec.gemm.vars()
    names = {v[key]: key for key in ("b", "m") if isinstance(v[key], ir.Var)}
    writer = CodeWriter(params, names, prefix="row_t", registers={spec.row_sum_register: "value"})  # type: ignore[arg-type]
    write_stores(writer, [spec.row_sum])
    body = writer.close_scope()
    decls = ", ".join(p.declaration() for p in params.values())
    return "\n".join([f"inline void {helper_name(suffix)}(const INDEX_T b, const INDEX_T m, const float value, "
                      f"{decls}) {{", *("    " + ln for ln in body), "}"])


@dataclass(frozen=True)
class RenderedGemm:
    """One launch of a GEMM kernel: its text (through the record macros), parameter records and
    launch; the caller names it."""

    kind: str
    text: str
    build_options: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    macros: tuple[str, ...]
    arguments: tuple[KernelParam, ...]
    #: Operand buffers the launch also reads through images (arguments after the buffers).
    images: tuple[ImageOperand, ...] = ()


#: Macros of the second launch of a split GEMM.
SPLIT_SUM_MACROS = ("INDEX_T", "STORE_C", "STORE_ROW", "SLICE", "ROW_BASE", *HELPER_NAMING_MACROS)


def _template(file: str) -> str:
    return resources.files("torch_adreno.kernels").joinpath(file).read_text()


def render_gemm(spec: GemmKernel, params: dict[str, Param], profile: DeviceProfile,
                images: bool = False) -> list[RenderedGemm]:
    """The launches of one GEMM kernel: one, or two for a split-K GEMM (``spec.split_k`` slices
    multiplied into ``spec.partials`` by ``gemm.cl``/``gemm_direct.cl``, then added up and stored
    through the epilogue by ``gemm_split_sum.cl``).

    ``images``: the operands' buffers are read through images where :func:`image_operands` allows
    (the multiplying launch takes them as extra arguments; the sum of a split GEMM reads none).
    Helpers are named after each launch's symbol through ``KERNEL_HELPER`` (so the two launches'
    epilogue functions differ in one program)."""
    node = spec.gemm
    v = node.vars()
    split = spec.split_k
    operand_images = image_operands(node, params, profile) if images else {}
    probe = CodeWriter(params)
    a_k_fastest = _unit_stride(node.lhs, v["k"], params, probe) or not _unit_stride(node.lhs, v["m"], params, probe)
    b_n_fastest = _unit_stride(node.rhs, v["n"], params, probe) or not _unit_stride(node.rhs, v["k"], params, probe)
    arg_names = ", ".join(p.c_name for p in params.values())
    index_t = index_ctype_for(params, node.batch * node.m * node.k, node.batch * node.k * node.n,
                              split * node.batch * (node.m * node.n + node.m))
    common = [f"#define INDEX_T {index_t}", *HELPER_NAMING]
    operands = [
        _operand_function("_load_a", node.lhs, ("b", "m", "k"), (v["b"], v["m"], v["k"]), params, operand_images),
        _operand_function("_load_b", node.rhs, ("b", "k", "n"), (v["b"], v["k"], v["n"]), params, operand_images),
    ]
    if operand_images:
        operands.insert(0, _template("gemm_image.cl"))
    operand_args = ", ".join([arg_names, *(image_c_name(params[b]) for b in operand_images)])
    load_a, load_b = helper_name("_load_a"), helper_name("_load_b")
    store_c, store_row = helper_name("_store_c"), helper_name("_store_row")
    epilogue = [
        _store_function("_store_c", spec, params),
        _row_store_function("_store_row", spec, params) if spec.row_sum is not None else "",
        f"#define STORE_ROW(b, m, v) {store_row}(b, m, v, {arg_names})" if spec.row_sum is not None else "",
        f"#define STORE_C(b, m, n, v) {store_c}(b, m, n, v, {arg_names})",
    ]
    slice_k = math.ceil(node.k / split)
    # The tiled template's prefetch: raw elements of widened loads, else the operand values.
    fetches: list[str] = []
    for operand, side, names, operand_vars in (
            (node.lhs, "A", ("b", "m", "k"), (v["b"], v["m"], v["k"])),
            (node.rhs, "B", ("b", "k", "n"), (v["b"], v["k"], v["n"]))):
        # (the direct template has no prefetch: its kernels get the pass-through macros only)
        tiled = use_local_memory_tiles(profile)
        load = widened_load(operand, params, operand_images) if RAW_PREFETCH and tiled else None
        call_args = ", ".join(names)
        if load is None:
            fetches += [f"#define {side}_RAW_T float", f"#define FETCH_{side}({call_args}) LOAD_{side}({call_args})",
                        f"#define FINISH_{side}(raw) (raw)"]
            continue
        suffix = f"_{side.lower()}"
        operands += _raw_fetch_functions(suffix, operand, load, names, operand_vars, params)
        fetch = helper_name("_fetch" + suffix)
        if split == 1:
            fetch_call = f"{fetch}({call_args}, {arg_names})"
        else:
            slice_of = {"b": f"(b) / {split}", "k": f"((INDEX_T)((b) % {split}) * {slice_k} + (k))"}
            sliced = ", ".join(slice_of.get(n, n) for n in names)
            fetch_call = (f"({slice_of['k']} < {node.k} ? {fetch}({sliced}, {arg_names}) "
                          f": ({_RAW_CTYPE[params[load.buffer].dtype]})0)")
        fetches += [f"#define {side}_RAW_T {_RAW_CTYPE[params[load.buffer].dtype]}",
                    f"#define FETCH_{side}({call_args}) {fetch_call}",
                    f"#define FINISH_{side}(raw) {helper_name('_finish' + suffix)}(raw)"]
    if split == 1:
        macros = [f"#define LOAD_A(b, m, k) {load_a}(b, m, k, {operand_args})",
                  f"#define LOAD_B(b, k, n) {load_b}(b, k, n, {operand_args})", *epilogue]
    else:
        # Work-group batch index b' = b * split + slice: operands read k from the slice's start;
        # the slice sums go to the partials buffer, [b'][m][n] then the row sums [b'][m].
        assert spec.partials is not None
        slices = params[spec.partials].c_name
        k_of = f"((INDEX_T)((b) % {split}) * {slice_k} + (k))"
        macros = [
            f"#define LOAD_A(b, m, k) ({k_of} < {node.k} ? {load_a}((b) / {split}, m, {k_of}, {operand_args}) : 0.0f)",
            f"#define LOAD_B(b, k, n) ({k_of} < {node.k} ? {load_b}((b) / {split}, {k_of}, n, {operand_args}) : 0.0f)",
            f"#define STORE_C(b, m, n, v) ({slices}[((INDEX_T)(b) * {node.m} + (m)) * {node.n} + (n)] = (v))",
            f"#define STORE_ROW(b, m, v) ({slices}[{split * node.batch * node.m * node.n} + "
            f"(INDEX_T)(b) * {node.m} + (m)] = (v))",
        ]
    prelude = "\n".join([*common, *operands, *macros, *fetches, ""])
    batch = node.batch * split
    arguments = (*records(params), *image_records(operand_images, params))
    sizes = (f"-DSIZE_M={node.m}", f"-DSIZE_N={node.n}", f"-DSIZE_K={slice_k}", f"-DROW_SUM={int(spec.row_sum is not None)}")
    if not use_local_memory_tiles(profile):
        launch = direct_launch(node.m, node.n, batch, choose_direct_tiling(node.m, node.n, profile))
        first = RenderedGemm("gemm", prelude + _template("gemm_direct.cl"), (*launch.defines, "-cl-mad-enable", *sizes),
                             launch.global_size, launch.local_size, GEMM_MACROS, arguments,
                             tuple(operand_images.values()))
    else:
        sixteen_bit = any(params[ld.buffer].dtype.is_half for ld in [*ir.loads(node.lhs), *ir.loads(node.rhs)])
        launch = tiled_launch(node.m, node.n, batch, choose_tiling(node.m, node.n, batch, profile, sixteen_bit))
        options = (*launch.defines, *sizes, f"-DA_K_FASTEST={int(a_k_fastest)}", f"-DB_N_FASTEST={int(b_n_fastest)}",
                   f"-DPREFETCH_EVERY_STEP={int(PREFETCH_EVERY_STEP)}")
        first = RenderedGemm("gemm", prelude + _template("gemm.cl"), options, launch.global_size,
                             launch.local_size, GEMM_MACROS, arguments, tuple(operand_images.values()))
    if split == 1:
        return [first]
    assert spec.partials is not None
    outputs = node.batch * node.m * node.n
    sum_prelude = "\n".join([
        *common, *epilogue, f"#define SLICE(i) {params[spec.partials].c_name}[i]",
        f"#define ROW_BASE {split * outputs}", ""])
    local = linear_local_size(outputs, profile)
    second = RenderedGemm(
        "pointwise", sum_prelude + _template("gemm_split_sum.cl"),
        (f"-DSPLIT_K={split}", f"-DBATCH={node.batch}", f"-DSIZE_M={node.m}", f"-DSIZE_N={node.n}",
         f"-DROW_SUM={int(spec.row_sum is not None)}"),
        (round_up(outputs, local),), (local,), SPLIT_SUM_MACROS, records(params))
    return [first, second]


def direct_launch(m: int, n: int, batch: int, tiling: DirectTiling) -> Launch:
    """Geometry of ``gemm_direct.cl``: one work-item per ``wpt_m`` x 8 block of C. The template clamps
    its indices and guards its stores, so the column and row extents may be rounded up freely."""
    column_blocks = math.ceil(n / 8)
    global_size = (math.ceil(column_blocks / tiling.local_n) * tiling.local_n, math.ceil(m / tiling.wpt_m), batch)
    return Launch((f"-DWPT_M={tiling.wpt_m}",), global_size, (tiling.local_n, 1, 1))


def tiled_launch(m: int, n: int, batch: int, tiling: GemmTiling) -> Launch:
    """Geometry of ``gemm.cl``: one work-group per output tile, its size fixed by the tiling."""
    vw_m, vw_n = tiling.vector_widths
    defines = (f"-DTILE_M={tiling.tile_m}", f"-DTILE_N={tiling.tile_n}", f"-DTILE_K={tiling.tile_k}",
               f"-DWPT_M={tiling.wpt_m}", f"-DWPT_N={tiling.wpt_n}", f"-DVW_M={vw_m}", f"-DVW_N={vw_n}")
    tn, tm = tiling.threads
    global_size = (math.ceil(n / tiling.tile_n) * tn, math.ceil(m / tiling.tile_m) * tm, batch)
    return Launch(defines, global_size, (tn, tm, 1))


def gemm_candidates(m: int, n: int, batch: int, tiled: bool, profile: DeviceProfile) -> list[Launch]:
    """Launches a tuner may try for a GEMM of the given template (``tiled``: ``gemm.cl``, else
    ``gemm_direct.cl``), the heuristic's first."""
    if tiled:
        return [tiled_launch(m, n, batch, t) for t in tiling_candidates(m, n, batch, profile)]
    return [direct_launch(m, n, batch, t) for t in direct_tiling_candidates(m, n, profile)]
