"""GEMM template instances: operand functions from the code writer plus ``gemm.cl`` with -D options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

from torch_adreno import ir
from torch_adreno.fusion import GemmKernel
from torch_adreno.kernels.generated import index_ctype_for, write_stores
from torch_adreno.kernels.writer import CodeWriter, Param
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

    def local_bytes(self) -> int:
        return 4 * self.tile_k * (self.tile_m + self.tile_n)


#: Macros a GEMM kernel's prelude defines (the templates undefine their own).
GEMM_MACROS = ("INDEX_T", "KERNEL_NAME", "KERNEL_PARAMS", "LOAD_A", "LOAD_B", "STORE_C", "STORE_ROW")


def _tile_for(extent: int) -> int:
    return 64 if extent >= 64 else 32 if extent >= 32 else 16


def choose_tiling(node: ir.Gemm, profile: DeviceProfile) -> GemmTiling:
    """Output tile per work-group from the problem shape: 64 where the extent allows, down to 16
    for thin operands (a 6-channel convolution, a 10-class classifier), with 16 work-items per
    direction (8 where the device allows fewer than 256 per group)."""
    threads = 16 if profile.max_work_group_size >= 256 else 8
    tile_m, tile_n = _tile_for(node.m), _tile_for(node.n)
    tile_m, tile_n = max(tile_m, threads), max(tile_n, threads)
    tiling = GemmTiling(tile_m, tile_n, 16, tile_m // threads, tile_n // threads)
    while tiling.local_bytes() > profile.local_mem_bytes and tiling.tile_k > 4:
        tiling = GemmTiling(tiling.tile_m, tiling.tile_n, tiling.tile_k // 2, tiling.wpt_m, tiling.wpt_n)
    return tiling


def choose_direct_tiling(node: ir.Gemm, profile: DeviceProfile) -> DirectTiling:
    wpt_m = 8 if node.m >= 8 else 4 if node.m >= 4 else 1
    column_blocks = math.ceil(node.n / 8)
    local_n = max(1, min(16, profile.max_work_group_size, 1 << (column_blocks - 1).bit_length()))
    return DirectTiling(wpt_m, local_n)


def use_local_memory_tiles(profile: DeviceProfile) -> bool:
    """GPUs get the local-memory tiled template; CPU devices, whose "local memory" is plain cache
    and whose barriers are emulated, get the direct one."""
    return profile.is_gpu


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


def _operand_function(fn_name: str, expr: ir.Expr, names: tuple[str, str, str], vars_: tuple[ir.Expr, ...],
                      params: dict[str, Param]) -> str:
    var_names = {v: n for v, n in zip(vars_, names, strict=True) if isinstance(v, ir.Var)}
    writer = CodeWriter(params, var_names,
                        prefix=f"{fn_name}_t")
    value = writer.expr(expr)
    body = writer.close_scope()
    args = ", ".join(f"const INDEX_T {n}" for n in names)
    decls = ", ".join(p.declaration() for p in params.values())
    return "\n".join([f"inline float {fn_name}({args}, {decls}) {{", *("    " + ln for ln in body),
                      f"    return {value};", "}"])


def _store_function(fn_name: str, spec: GemmKernel, params: dict[str, Param]) -> str:
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
    return "\n".join([f"inline void {fn_name}(const INDEX_T b, const INDEX_T m, const INDEX_T n, const float value, "
                      f"{decls}) {{", *("    " + ln for ln in body), "}"])


def _row_store_function(fn_name: str, spec: GemmKernel, params: dict[str, Param]) -> str:
    assert spec.row_sum is not None and spec.row_sum_register is not None
    v = spec.gemm.vars()
    names = {v[key]: key for key in ("b", "m") if isinstance(v[key], ir.Var)}
    writer = CodeWriter(params, names, prefix="row_t", registers={spec.row_sum_register: "value"})  # type: ignore[arg-type]
    write_stores(writer, [spec.row_sum])
    body = writer.close_scope()
    decls = ", ".join(p.declaration() for p in params.values())
    return "\n".join([f"inline void {fn_name}(const INDEX_T b, const INDEX_T m, const float value, {decls}) {{",
                      *("    " + ln for ln in body), "}"])


def render_gemm(name: str, header: str, spec: GemmKernel, params: dict[str, Param],
                profile: DeviceProfile) -> tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Source, build options, global and local size of one GEMM kernel."""
    node = spec.gemm
    v = node.vars()
    probe = CodeWriter(params)
    a_k_fastest = _unit_stride(node.lhs, v["k"], params, probe) or not _unit_stride(node.lhs, v["m"], params, probe)
    b_n_fastest = _unit_stride(node.rhs, v["n"], params, probe) or not _unit_stride(node.rhs, v["k"], params, probe)
    arg_names = ", ".join(p.c_name for p in params.values())
    prelude = "\n".join([
        header,
        f"#define INDEX_T {index_ctype_for(params, node.batch * node.m * node.k, node.batch * node.k * node.n)}",
        f"#define KERNEL_NAME {name}",
        "#define KERNEL_PARAMS " + ", ".join(p.declaration() for p in params.values()),
        _operand_function(f"{name}_load_a", node.lhs, ("b", "m", "k"), (v["b"], v["m"], v["k"]), params),
        _operand_function(f"{name}_load_b", node.rhs, ("b", "k", "n"), (v["b"], v["k"], v["n"]), params),
        _store_function(f"{name}_store_c", spec, params),
        _row_store_function(f"{name}_store_row", spec, params) if spec.row_sum is not None else "",
        f"#define STORE_ROW(b, m, v) {name}_store_row(b, m, v, {arg_names})" if spec.row_sum is not None else "",
        f"#define LOAD_A(b, m, k) {name}_load_a(b, m, k, {arg_names})",
        f"#define LOAD_B(b, k, n) {name}_load_b(b, k, n, {arg_names})",
        f"#define STORE_C(b, m, n, v) {name}_store_c(b, m, n, v, {arg_names})",
        "",
    ])
    sizes = (f"-DSIZE_M={node.m}", f"-DSIZE_N={node.n}", f"-DSIZE_K={node.k}", f"-DROW_SUM={int(spec.row_sum is not None)}")
    if not use_local_memory_tiles(profile):
        direct = choose_direct_tiling(node, profile)
        template = resources.files("torch_adreno.kernels").joinpath("gemm_direct.cl").read_text()
        column_blocks = math.ceil(node.n / 8)
        global_size = (math.ceil(column_blocks / direct.local_n) * direct.local_n, math.ceil(node.m / direct.wpt_m),
                       node.batch)
        return (prelude + template, (f"-DWPT_M={direct.wpt_m}", "-cl-mad-enable", *sizes), global_size,
                (direct.local_n, 1, 1))
    tiling = choose_tiling(node, profile)
    template = resources.files("torch_adreno.kernels").joinpath("gemm.cl").read_text()
    options = (
        f"-DTILE_M={tiling.tile_m}", f"-DTILE_N={tiling.tile_n}", f"-DTILE_K={tiling.tile_k}",
        f"-DWPT_M={tiling.wpt_m}", f"-DWPT_N={tiling.wpt_n}", *sizes,
        f"-DA_K_FASTEST={int(a_k_fastest)}", f"-DB_N_FASTEST={int(b_n_fastest)}",
    )
    tn, tm = tiling.threads
    global_size = (math.ceil(node.n / tiling.tile_n) * tn, math.ceil(node.m / tiling.tile_m) * tm, node.batch)
    return prelude + template, options, global_size, (tn, tm, 1)
