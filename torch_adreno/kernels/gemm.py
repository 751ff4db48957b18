"""GEMM template instances: operand functions from the code writer plus ``gemm.cl`` with -D options."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from importlib import resources

from torch_adreno import ir
from torch_adreno.fusion import GemmKernel
from torch_adreno.kernels.choices import KernelChoices
from torch_adreno.kernels.gemm_operands import (
    KSteps,
    image_operands,
    image_records,
    operand_prelude,
    unit_stride,
)
from torch_adreno.kernels.params import KernelParam
from torch_adreno.kernels.pointwise_reduction import index_ctype_for, write_stores
from torch_adreno.kernels.program import (
    HELPER_NAMING,
    HELPER_NAMING_MACROS,
    ImageOperand,
    helper_name,
)
from torch_adreno.kernels.workgroup import (
    MAX_CANDIDATE_GROUP,
    Launch,
    candidate_span,
    group_limit,
    linear_local_size,
    round_up,
)
from torch_adreno.kernels.writer import CodeWriter, Param, records
from torch_adreno.targets import DeviceProfile


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
        """Both operands' tiles, their rows padded by 4 floats as ``gemm.cl`` lays them out."""
        return 4 * self.tile_k * (self.tile_m + 4 + self.tile_n + 4)


def _vector_width(outputs: int) -> int:
    return 4 if outputs % 4 == 0 else 2 if outputs % 2 == 0 else 1


#: Macros a GEMM kernel's prelude defines (the templates undefine their own).
GEMM_MACROS = ("INDEX_T", "LOAD_A", "LOAD_B", "STORE_C", "STORE_ROW", "A_RAW_T", "B_RAW_T", "FETCH_A", "FETCH_B",
               "FINISH_A", "FINISH_B", *HELPER_NAMING_MACROS)



def _tile_for(extent: int) -> int:
    return 64 if extent >= 64 else 32 if extent >= 32 else 16


def _threads_per_direction(profile: DeviceProfile) -> int:
    return 16 if profile.max_work_group_size >= 256 else 8


def _fit_local_memory(tiling: GemmTiling, profile: DeviceProfile) -> GemmTiling:
    while tiling.local_bytes() > profile.local_mem_bytes and tiling.tile_k > 4:
        tiling = dataclasses.replace(tiling, tile_k=tiling.tile_k // 2)
    return tiling


def _groups(m: int, n: int, batch: int, tile_m: int, tile_n: int) -> int:
    return math.ceil(m / tile_m) * math.ceil(n / tile_n) * batch


def choose_tiling(m: int, n: int, batch: int, profile: DeviceProfile,
                  choices: KernelChoices | None = None) -> GemmTiling:
    """Output tile per work-group of a ``batch`` x ``m`` x ``n`` GEMM: with the large tiles
    (``choices.large_tiles``: desktop-class GPUs) 128 x 128 (8 x 8 outputs per work-item, K step 8)
    where the extents allow and the tiles still number at least ``choices.tile_fill_units`` (128 x 64,
    K step 8, where they number fewer than ``choices.half_filled_units`` per unit), then 128 x 64;
    else 64 where the extent allows, down to 16 for thin operands (a 6-channel convolution, a
    10-class classifier); 16 work-items per direction (8 where the device allows fewer than 256 per
    group). ``choices``: default, the device's own (:meth:`KernelChoices.for_device`)."""
    choices = choices if choices is not None else KernelChoices.for_device(profile)
    units = choices.tile_fill_units
    threads = _threads_per_direction(profile)
    tile_m, tile_n = max(_tile_for(m), threads), max(_tile_for(n), threads)
    # Larger tiles re-read each operand fewer times (a 128 x 128 tile loads 1/64 of an element per
    # multiply-add, a 64 x 64 one 1/32) but make fewer work-groups: take them only while every
    # compute unit still gets a work-group. 8 x 8 accumulators per work-item were measured on a
    # desktop GPU (faster than CLBlast there); a phone GPU's smaller register file may lose more occupancy
    # than the tile saves, so mobile-class devices (few compute units) keep 64 x 64 until measured
    # there (``tune=True`` tries the larger tiles on any device).
    for big_m, big_n in ((128, 128), (128, 64), (64, 128)) if choices.large_tiles else ():
        if (m >= big_m and n >= big_n and big_m * big_n >= tile_m * tile_n
                and _groups(m, n, batch, big_m, big_n) >= units):
            tile_m, tile_n = big_m, big_n
            break
    # A K step of 8 halves the 128 x 128 tile's local memory and prefetch registers: more
    # work-groups per compute unit (measured on a desktop GPU: large square SGEMMs faster than with
    # 16, while 64 x 64 tiles do best with 16).
    tile_k = 8 if tile_m * tile_n >= 128 * 128 else 16
    if (tile_m, tile_n) == (64, 128) and threads == 16:
        # 64-row tiles (a 64-channel convolution) too (benchmarks/gemm_shapes.py on a desktop
        # GPU): ResNet-18's layer1 forward, input and weight gradients and its stem's forward
        # all run faster with the K step of 8.
        tile_k = 8
    if (tile_m, tile_n) == (128, 128) and n >= 128 and threads == 16 \
            and _groups(m, n, batch, 128, 128) < choices.half_filled_units * units:
        # Between one and 1.5 work-groups of 128 x 128 per compute unit, most units run a lone
        # work-group, at half the rate of two; 128 x 64 tiles, twice as many, did better at every
        # such shape the tuner was given on a desktop GPU (benchmarks/gemm_shapes.py --variants
        # tuned: GPT-2's c_attn forward, 144 tiles; c_fc forward, 192; the MLP projection's input
        # gradient, 192), with the K step of 8. 16-bit operands as well: the template holds them
        # as loaded and widens them only as they are stored into the tiles. Inside a replayed
        # 16-bit GPT-2 step the MLP projection's input gradient is slower than bound without the
        # arena: likely the registers its rebuilt form keeps for operand pointers in the arena,
        # which cost ResNet-18's layer1 weight gradient a resident work-group per SM (seen with
        # ptxas; not checked for this one).
        tile_n = 64
    wpt_m, wpt_n = tile_m // threads, tile_n // threads
    if (tile_m, tile_n) == (128, 64) and m <= 128 and threads == 16:
        # One row of 128 x 64 tiles (a 128-channel convolution): 8 x 8 outputs per work-item, 128
        # work-items (benchmarks/gemm_shapes.py --variants items_8x8 on a desktop GPU):
        # ResNet-18's layer2 forward, input gradient and strided forward run faster so;
        # GPT-2's 1024-row products slower (hence only one row of tiles).
        wpt_n = 8
    return _fit_local_memory(GemmTiling(tile_m, tile_n, tile_k, wpt_m, wpt_n), profile)


def tiling_candidates(m: int, n: int, batch: int, profile: DeviceProfile,
                      choices: KernelChoices | None = None) -> list[GemmTiling]:
    """Tilings a tuner may try, the heuristic's first: every output tile of 16 to 128 in either
    direction that the extent there fills (16 always; 128 from 128 rows or columns), with the
    heuristic's work-items per direction; then the heuristic's tile with the other count of
    work-items and with each other K step of 8, 16 and 32. Each fits the device's group size and
    local memory. ``choices``: the heuristic's (default: the device's own)."""
    default = choose_tiling(m, n, batch, profile, choices)
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
    # Rectangular tiles with 8 x 8 outputs per work-item (128 work-items): the 64-row (or column)
    # tile of a 64-channel convolution reads as few operands from local memory per multiply-add
    # as the 128 x 128 one.
    for tile_m, tile_n in ((64, 128), (128, 64)):
        tiling = GemmTiling(tile_m, tile_n, default.tile_k, 8, 8)
        if (fills(tile_m, m) and fills(tile_n, n) and tile_m * tile_n // 64 <= profile.max_work_group_size
                and tiling.local_bytes() <= profile.local_mem_bytes and tiling not in tilings):
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
                choices: KernelChoices) -> list[RenderedGemm]:
    """The launches of one GEMM kernel: one, or two for a split-K GEMM (``spec.split_k`` slices
    multiplied into ``spec.partials`` by ``gemm.cl``/``gemm_direct.cl``, then added up and stored
    through the epilogue by ``gemm_split_sum.cl``).

    ``choices``: the template and its tiling rule (``gemm_template``, :func:`choose_tiling`), and
    ``images``: the operands' buffers are read through images where :func:`image_operands` allows
    (the multiplying launch takes them as extra arguments; the sum of a split GEMM reads none).
    Helpers are named after each launch's symbol through ``KERNEL_HELPER`` (so the two launches'
    epilogue functions differ in one program)."""
    node = spec.gemm
    v = node.vars()
    split = spec.split_k
    operand_images = image_operands(node, params, profile) if choices.images else {}
    probe = CodeWriter(params)
    a_k_fastest = unit_stride(node.lhs, v["k"], params, probe) or not unit_stride(node.lhs, v["m"], params, probe)
    b_n_fastest = unit_stride(node.rhs, v["n"], params, probe) or not unit_stride(node.rhs, v["k"], params, probe)
    arg_names = ", ".join(p.c_name for p in params.values())
    index_t = index_ctype_for(params, node.batch * node.m * node.k, node.batch * node.k * node.n,
                              split * node.batch * (node.m * node.n + node.m))
    common = [f"#define INDEX_T {index_t}", *HELPER_NAMING]
    batch = node.batch * split
    tiled = choices.tiled
    tiling = choose_tiling(node.m, node.n, batch, profile, choices) if tiled else None
    steps = KSteps(tiling.tile_k if tiling is not None else 1, v["k"], node.k)
    if not (steps.splits(node.lhs) or steps.splits(node.rhs)):
        steps = KSteps(1, v["k"], node.k)  # (and the tuner may vary the K step)
    granule = steps.granule
    divides = steps.divides_per_element(node.lhs) or steps.divides_per_element(node.rhs)
    # (slices of whole K steps: a slice's helpers take its first step plus the template's; the
    # helpers return zero past K)
    slice_k = round_up(math.ceil(node.k / split), granule) if split > 1 else node.k
    operands = operand_prelude(node, params, operand_images, steps, tiled, split, slice_k)
    if operand_images:
        operands.insert(0, _template("gemm_image.cl"))
    store_c, store_row = helper_name("_store_c"), helper_name("_store_row")
    epilogue = [
        _store_function("_store_c", spec, params),
        _row_store_function("_store_row", spec, params) if spec.row_sum is not None else "",
        f"#define STORE_ROW(b, m, v) {store_row}(b, m, v, {arg_names})" if spec.row_sum is not None else "",
        f"#define STORE_C(b, m, n, v) {store_c}(b, m, n, v, {arg_names})",
    ]
    stores = epilogue
    if split > 1:
        # Work-group batch index b' = b * split + slice; the slice sums go to the partials buffer,
        # [b'][m][n] then the row sums [b'][m] (the epilogue is the second launch's).
        assert spec.partials is not None
        slices = params[spec.partials].c_name
        stores = [
            f"#define STORE_C(b, m, n, v) ({slices}[((INDEX_T)(b) * {node.m} + (m)) * {node.n} + (n)] = (v))",
            f"#define STORE_ROW(b, m, v) ({slices}[{split * node.batch * node.m * node.n} + "
            f"(INDEX_T)(b) * {node.m} + (m)] = (v))",
        ]
    prelude = "\n".join([*common, *operands, *stores, ""])
    arguments = (*records(params), *image_records(operand_images, params))
    sizes = (f"-DSIZE_M={node.m}", f"-DSIZE_N={node.n}", f"-DSIZE_K={slice_k}", f"-DROW_SUM={int(spec.row_sum is not None)}")
    if tiling is None:
        launch = direct_launch(node.m, node.n, batch, choose_direct_tiling(node.m, node.n, profile))
        first = RenderedGemm("gemm", prelude + _template("gemm_direct.cl"), (*launch.defines, "-cl-mad-enable", *sizes),
                             launch.global_size, launch.local_size, GEMM_MACROS, arguments,
                             tuple(operand_images.values()))
    else:
        launch = tiled_launch(node.m, node.n, batch, tiling)
        options = (*launch.defines, *sizes, f"-DA_K_FASTEST={int(a_k_fastest)}", f"-DB_N_FASTEST={int(b_n_fastest)}",
                   f"-DK_GRANULE={granule}", f"-DK_UNROLL={k_step_unroll(tiling, divides, b_n_fastest)}")
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


def k_step_unroll(tiling: GemmTiling, divides_per_element: bool, b_n_fastest: bool) -> int:
    """How many times ``gemm.cl`` unrolls its loop over one K step (0: the compiler's choice).

    NVIDIA's compiler keeps that loop rolled, so each offset's multiply-adds wait for its own
    local-memory reads. Unrolled in full, 8 x 8 outputs per work-item are faster on a desktop GPU
    where B's columns are adjacent in memory and no operand's helper divides its per-element K index
    (``benchmarks/gemm_shapes.py``, unrolled against rolled: a large SGEMM's input gradient,
    ResNet-18's 3 x 3 forward and input gradients). Where B is read along k (a linear layer's
    forward, x W^T) it is slower so (a large SGEMM's forward, GPT-2's head forward); so it is with
    an im2col operand dividing k per element (a weight gradient), and
    with the 4 x 8 blocks of 64-row tiles."""
    eight_by_eight = (tiling.wpt_m, tiling.wpt_n) == (8, 8)
    return tiling.tile_k if eight_by_eight and b_n_fastest and not divides_per_element else 0


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


def gemm_candidates(m: int, n: int, batch: int, tiled: bool, profile: DeviceProfile,
                    tile_k: int | None = None, choices: KernelChoices | None = None) -> list[Launch]:
    """Launches a tuner may try for a GEMM of the given template (``tiled``: ``gemm.cl``, else
    ``gemm_direct.cl``), the heuristic's first; ``tile_k``: only tilings of that K step (operand
    helpers written for it, ``-DK_GRANULE``); ``choices``: the heuristic's (default: the device's)."""
    if tiled:
        return [tiled_launch(m, n, batch, t) for t in tiling_candidates(m, n, batch, profile, choices)
                if tile_k is None or t.tile_k == tile_k]
    return [direct_launch(m, n, batch, t) for t in direct_tiling_candidates(m, n, profile)]
