"""How a GEMM kernel reads its operands: the helper functions computing one element of A or B
from the FX-derived index expressions, through buffers or images, raw (16-bit) fetches finished
into floats later, and the K index written as a K step and an offset within it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_adreno import ir
from torch_adreno.kernels.params import KernelParam, image_record
from torch_adreno.kernels.program import ImageOperand, helper_name
from torch_adreno.kernels.writer import CodeWriter, Param, records
from torch_adreno.targets import DeviceProfile


def unit_stride(expr: ir.Expr, var: ir.Expr, params: dict[str, Param], writer: CodeWriter) -> bool:
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


def _raw_fetch_functions(suffix: str, expr: ir.Expr, load: ir.Load, names: tuple[str, ...],
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


def _operand_function(suffix: str, expr: ir.Expr, names: tuple[str, ...], vars_: tuple[ir.Expr, ...],
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


def _divides(expr: ir.Expr, var: ir.Expr) -> bool:
    """Whether ``expr`` takes ``//`` or ``%`` of an index that ``var`` is part of."""
    return any(isinstance(e, ir.Call) and e.op in ("floordiv", "mod") and any(a == var for a in ir.walk(e.args[0]))
               for e in ir.walk(expr))


@dataclass(frozen=True)
class KSteps:
    """The K index as the tiled template passes it to the operand helpers: ``k = kt * granule + kk``,
    with ``kt`` the K step (one value across a work-group, so the index arithmetic on it, an
    im2col gather's ``k / (3 * C)`` and ``k % C``, is done once per step and not per element) and
    ``kk`` the offset within it. The simplifier splits ``k // d`` and ``k % d`` that way where the
    granule divides ``d`` (``ir.expr._aligned_split``). Granule 1 passes ``k`` itself."""

    granule: int
    k: ir.Expr
    size: int

    @property
    def names(self) -> tuple[str, ...]:
        return ("k",) if self.granule == 1 else ("kt", "kk")

    def variables(self) -> tuple[ir.Expr, ...]:
        if self.granule == 1:
            return (self.k,)
        return (ir.loop_var("kt", math.ceil(self.size / self.granule)), ir.loop_var("kk", self.granule))

    def operand(self, expr: ir.Expr) -> ir.Expr:
        """``expr`` over (kt, kk) in place of k."""
        if self.granule == 1 or not isinstance(self.k, ir.Var):
            return expr
        kt, kk = self.variables()
        return ir.substitute(expr, {self.k: ir.call("add", ir.call("mul", kt, ir.index(self.granule)), kk)})

    def splits(self, expr: ir.Expr) -> bool:
        """Whether ``expr`` divides k (an im2col gather does, a plain matrix does not) and over
        (kt, kk) divides only the step: no ``//`` or ``%`` of the offset is left (else the helper is
        better off taking k itself, as one index it divides once)."""
        if self.granule == 1 or not _divides(expr, self.k):
            return False
        return not _divides(self.operand(expr), self.variables()[1])

    def divides_per_element(self, expr: ir.Expr) -> bool:
        """Whether the helper of operand ``expr`` divides an index that changes from element to
        element: k itself where it takes k (granule 1, or an operand that does not split), the
        offset where it takes the step and offset."""
        if self.splits(expr):
            return False
        return _divides(expr, self.k)

    def arguments(self, split: int, slice_k: int, k_term: str = "(kt) + (kk)") -> tuple[str, str]:
        """(the helpers' K arguments, the GEMM's k) for the template's step ``kt`` and offset ``kk``
        (granule 1: its ``k_term``) in work-group batch ``b``: of slice ``b % split`` when the GEMM
        is split in slices of ``slice_k`` (a multiple of the granule)."""
        slice_start = f"(INDEX_T)((b) % {split}) * " if split > 1 else None
        if self.granule == 1:
            k = f"({slice_start}{slice_k} + {k_term})" if slice_start else f"({k_term})"
            return k, k
        step = f"({slice_start}{slice_k // self.granule} + (kt))" if slice_start else "(kt)"
        return f"{step}, (kk)", f"({step} * {self.granule} + (kk))"


def operand_prelude(node: ir.Gemm, params: dict[str, Param], images: dict[str, ImageOperand], steps: KSteps,
                    tiled: bool, split: int, slice_k: int) -> list[str]:
    """The operand helpers of one GEMM launch and the macros the templates read them through.

    ``gemm_direct.cl`` (``tiled`` False) calls ``LOAD_A(b, m, k)`` and ``LOAD_B(b, k, n)``;
    ``gemm.cl`` calls ``FETCH_A(b, m, kt, kk)`` and ``FETCH_B(b, kt, kk, n)`` (``steps``: an
    operand's helper takes the step and offset where that leaves no division of the offset,
    :meth:`KSteps.splits`, else k) and
    ``FINISH_A``/``FINISH_B`` on what they return (``A_RAW_T``/``B_RAW_T``: a widened load's
    element as loaded, finished only as it is stored into a tile). A split GEMM's work-group batch ``b`` is ``b * split +
    slice``: the helpers read the slice's part of K and return zero past its end."""
    v = node.vars()
    arg_names = ", ".join(p.c_name for p in params.values())
    operand_args = ", ".join([arg_names, *(image_c_name(params[b]) for b in images)])
    batch_arg = f"(b) / {split}" if split > 1 else "b"
    # (the template's k: its step and offset, or k itself in the direct template)
    k_term = "(k)" if not tiled else "(kt) + (kk)" if steps.granule == 1 else f"(kt) * {steps.granule} + (kk)"
    texts: list[str] = []
    macros: list[str] = []
    for side, operand in (("A", node.lhs), ("B", node.rhs)):
        side_steps = steps if tiled and steps.splits(operand) else KSteps(1, steps.k, steps.size)
        k_args, k_global = side_steps.arguments(split, slice_k, k_term)
        template_k = "kt, kk" if tiled else "k"
        if side == "A":  # (the helpers' and the macros' arguments: b, m, k for A; b, k, n for B)
            names, operand_vars = ("b", "m", *side_steps.names), (v["b"], v["m"], *side_steps.variables())
            template_args, call = f"b, m, {template_k}", f"{batch_arg}, m, {k_args}"
        else:
            names, operand_vars = ("b", *side_steps.names, "n"), (v["b"], *side_steps.variables(), v["n"])
            template_args, call = f"b, {template_k}, n", f"{batch_arg}, {k_args}, n"
        suffix = f"_{side.lower()}"
        expr = side_steps.operand(operand)
        texts.append(_operand_function("_load" + suffix, expr, names, operand_vars, params, images))
        load = f"{helper_name('_load' + suffix)}({call}, {operand_args})"
        if split > 1:
            load = f"({k_global} < {node.k} ? {load} : 0.0f)"
        macros.append(f"#define LOAD_{side}({template_args}) {load}")
        widened = widened_load(expr, params, images) if tiled else None
        if widened is None:
            macros += [f"#define {side}_RAW_T float", f"#define FETCH_{side}({template_args}) LOAD_{side}({template_args})",
                       f"#define FINISH_{side}(raw) (raw)"]
            continue
        texts += _raw_fetch_functions(suffix, expr, widened, names, operand_vars, params)
        raw_t = _RAW_CTYPE[params[widened.buffer].dtype]
        fetch = f"{helper_name('_fetch' + suffix)}({call}, {arg_names})"
        if split > 1:
            fetch = f"({k_global} < {node.k} ? {fetch} : ({raw_t})0)"
        macros += [f"#define {side}_RAW_T {raw_t}", f"#define FETCH_{side}({template_args}) {fetch}",
                   f"#define FINISH_{side}(raw) {helper_name('_finish' + suffix)}(raw)"]
    return texts + macros
