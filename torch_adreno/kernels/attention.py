"""Fused attention launches: ``attention.cl`` with ``-D`` options, the operand and store helpers
written by the code writer (so that strided head layouts are read in place and 16-bit storage is
widened and rounded where eager does).

Three templates (the ``target`` of an :class:`ir.TemplateOp`, see ``lowering/attention.py``):

* ``attention_forward``: inputs (q, k, v), outputs (out, lse);
* ``attention_grad_query``: inputs (grad_out, q, k, v, lse, delta), output grad_q;
* ``attention_grad_key_value``: the same inputs, outputs (grad_k, grad_v).

Attributes: ``causal`` (bool), ``scale`` (float), ``group`` (query heads per key/value head).
Shapes: q, out, grad_out [batch, heads, queries, d]; k, v [batch, heads / group, keys, d];
lse and delta [batch, heads, queries], float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

from torch_adreno import ir
from torch_adreno.fusion import Store, TemplateKernel
from torch_adreno.kernels.params import KernelParam
from torch_adreno.kernels.pointwise_reduction import index_ctype_for, write_stores
from torch_adreno.kernels.program import HELPER_NAMING, HELPER_NAMING_MACROS, helper_name
from torch_adreno.kernels.writer import CodeWriter, Param, records
from torch_adreno.lowering.attention import FORWARD, GRAD_KEY_VALUE, GRAD_QUERY
from torch_adreno.targets import DeviceProfile

#: Template -> (its ATTENTION_PASS, the names its inputs are loaded by, the names its outputs are stored by).
_PASSES: dict[str, tuple[int, tuple[str, ...], tuple[str, ...]]] = {
    FORWARD: (1, ("Q", "K", "V"), ("O", "LSE")),
    GRAD_QUERY: (2, ("DO", "Q", "K", "V", "LSE", "DELTA"), ("DQ",)),
    GRAD_KEY_VALUE: (3, ("DO", "Q", "K", "V", "LSE", "DELTA"), ("DK", "DV")),
}
TEMPLATES = tuple(_PASSES)

#: Blockings tried, first that fits: (rows a group owns, streamed rows per step, micro-tile rows,
#: micro-tile columns). For head dim 64 in float32 every pass takes 32 x 32 in 128 work-items of
#: 4 x 2 scores (forward 30.5 KB, dQ 39.2 KB, dK/dV 43.3 KB: within a GPU's 48 KB); 32 rows
#: rather than 64 give GPT-2's seq 256 (48 heads) 384 groups for a desktop GPU's 100+ compute units and
#: causal blocks of less uneven length (64 x 32, 43.5 KB, is the forward's next: a tuning
#: candidate for long sequences). The later ones serve larger head dims, an Adreno's 32 KB, short
#: sequences and head dims the column groups do not divide.
#: Module attributes so that a tuning run can replace them (benchmarks/attention.py --forward-blocking).
Blocking = tuple[int, int, int, int]
FORWARD_BLOCKINGS: tuple[Blocking, ...] = (
    (32, 32, 4, 2), (64, 32, 4, 2), (32, 32, 2, 2), (32, 16, 2, 1), (16, 16, 2, 2), (16, 16, 1, 1), (16, 16, 4, 4), (16, 16, 16, 16))
BACKWARD_BLOCKINGS: tuple[Blocking, ...] = (
    (32, 32, 4, 2), (32, 16, 2, 1), (16, 16, 2, 2), (16, 16, 1, 1), (16, 16, 4, 4), (16, 16, 16, 16))

_INDEX_NAMES = ("b", "h", "s", "d")


@dataclass(frozen=True)
class AttentionBlocks:
    """A group owns ``rows`` rows and streams ``cols`` rows of the other operand per step; each
    work-item computes ``micro_rows`` x ``micro_cols`` scores. Invariant: both micro sizes divide
    their block sizes."""

    rows: int
    cols: int
    micro_rows: int
    micro_cols: int

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.micro_rows, self.micro_cols) <= 0 or self.rows % self.micro_rows \
                or self.cols % self.micro_cols:
            raise ValueError(f"attention blocking {self}: the micro-tile sizes must be positive and divide "
                             "the block sizes (rows % micro_rows == cols % micro_cols == 0)")

    @property
    def col_groups(self) -> int:
        return self.cols // self.micro_cols

    @property
    def threads(self) -> int:
        return self.rows // self.micro_rows * self.col_groups

    def local_bytes(self, template: str, head_dim: int) -> int:
        """Local memory of one group, as ``attention.cl`` declares it (rows of pitch PITCH)."""
        pitch = head_dim + (4 if head_dim % 4 == 0 else 1)
        rows, cols = self.rows * pitch, self.cols * pitch
        scores = self.rows * self.cols
        floats = {
            # Q rows, the key tile sharing its buffer with P, V, two partials per row group, row max and sum.
            FORWARD: rows + max(cols, scores) + cols + 2 * self.rows * self.col_groups + 2 * self.rows,
            # Q and dO rows, K and V tiles, dS, LSE and DELTA per row.
            GRAD_QUERY: 2 * rows + 2 * cols + scores + 2 * self.rows,
            # K and V rows, Q and dO tiles, P and dS, LSE and DELTA per streamed query.
            GRAD_KEY_VALUE: 2 * rows + 2 * cols + 2 * scores + 2 * self.cols,
        }[template]
        return 4 * floats


def choose_blocks(template: str, head_dim: int, rows_needed: int, profile: DeviceProfile) -> AttentionBlocks:
    """The first blocking that fits the device's local memory and group size with at least one
    head-dim column per work-item, owning no more rows than there are (rounded up to 16) unless
    it is the smallest."""
    cap = max(16, 1 << max(0, rows_needed - 1).bit_length())
    blockings = FORWARD_BLOCKINGS if template == FORWARD else BACKWARD_BLOCKINGS
    for choice in blockings:
        blocks = AttentionBlocks(*choice)
        if (blocks.rows > cap and blocks.rows != 16) or blocks.threads > profile.max_work_group_size:
            continue
        if head_dim < blocks.col_groups or blocks.local_bytes(template, head_dim) > profile.local_mem_bytes:
            continue
        return blocks
    smallest = AttentionBlocks(*blockings[-1])
    raise ValueError(
        f"fused attention with head dimension {head_dim} needs {smallest.local_bytes(template, head_dim)} bytes "
        f"of local memory and {smallest.threads} work-items per group, more than the device's "
        f"{profile.local_mem_bytes} bytes / {profile.max_work_group_size}; use a smaller head dimension")


@dataclass(frozen=True)
class RenderedAttention:
    text: str
    build_options: tuple[str, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    macros: tuple[str, ...]
    arguments: tuple[KernelParam, ...]


def _index_vars(shape: tuple[int, ...]) -> tuple[tuple[ir.Expr, ...], dict[ir.Var, str]]:
    vars_ = tuple(ir.loop_var(name, size) for name, size in zip(_INDEX_NAMES, shape, strict=False))
    return vars_, {v: n for v, n in zip(vars_, _INDEX_NAMES, strict=False) if isinstance(v, ir.Var)}


def _load_helper(name: str, view: ir.View, params: dict[str, Param]) -> str:
    """``LOAD_<name>(b, h, s[, d])``: one element of ``view`` as a float."""
    vars_, names = _index_vars(view.shape)
    writer = CodeWriter(params, names, prefix=f"{name.lower()}_t")
    value = writer.expr(ir.cast(view.load(vars_), ir.DType.F32))
    body = writer.close_scope()
    suffix = f"_load_{name.lower()}"
    index_args = ", ".join(f"const INDEX_T {n}" for n in _INDEX_NAMES[:len(view.shape)])
    decls = ", ".join(p.declaration() for p in params.values())
    arg_names = ", ".join(p.c_name for p in params.values())
    dims = ", ".join(_INDEX_NAMES[:len(view.shape)])
    return "\n".join([f"inline float {helper_name(suffix)}({index_args}, {decls}) {{", *("    " + ln for ln in body),
                      f"    return {value};", "}",
                      f"#define LOAD_{name}({dims}) {helper_name(suffix)}({dims}, {arg_names})"])


def _store_helper(name: str, buffer: str, params: dict[str, Param]) -> str:
    """``STORE_<name>(b, h, s[, d], value)``: a float rounded to the buffer's type and stored."""
    param = params[buffer]
    vars_, names = _index_vars(param.shape)
    register = ir.Load(buffer, vars_, ir.DType.F32)
    writer = CodeWriter(params, names, prefix=f"{name.lower()}_t", registers={register: "value"})
    write_stores(writer, [Store(buffer, vars_, ir.cast(register, param.dtype))])
    body = writer.close_scope()
    suffix = f"_store_{name.lower()}"
    index_args = ", ".join(f"const INDEX_T {n}" for n in _INDEX_NAMES[:len(param.shape)])
    decls = ", ".join(p.declaration() for p in params.values())
    arg_names = ", ".join(p.c_name for p in params.values())
    dims = ", ".join(_INDEX_NAMES[:len(param.shape)])
    return "\n".join([f"inline void {helper_name(suffix)}({index_args}, const float value, {decls}) {{",
                      *("    " + ln for ln in body), "}",
                      f"#define STORE_{name}({dims}, v) {helper_name(suffix)}({dims}, v, {arg_names})"])


def _float_literal(value: float) -> str:
    return f"{float(value)!r}f"


def attention_shapes(node: ir.TemplateOp) -> tuple[int, int, int, int, int, int]:
    """(batch, heads, queries, keys, head dim, group) of a fused attention node."""
    offset = 0 if node.target == FORWARD else 1
    batch, heads, queries, head_dim = node.inputs[offset].shape
    keys = node.inputs[offset + 1].shape[2]
    return batch, heads, queries, keys, head_dim, int(node.attribute("group"))


def attention_flops(node: ir.TemplateOp) -> int:
    """Multiply-adds of the products each pass computes, two FLOPs each (a causal mask halves the
    pairs): forward QK^T and PV; dQ pass QK^T, dO V^T and dS K; dK/dV pass all four."""
    batch, heads, queries, keys, head_dim, _ = attention_shapes(node)
    pairs = batch * heads * queries * keys // (2 if node.attribute("causal") else 1)
    products = {FORWARD: 2, GRAD_QUERY: 3, GRAD_KEY_VALUE: 4}[node.target]
    return 2 * products * pairs * head_dim


def render_attention(spec: TemplateKernel, params: dict[str, Param], profile: DeviceProfile) -> RenderedAttention:
    """The one launch of a fused attention pass."""
    node = spec.node
    attention_pass, input_names, output_names = _PASSES[node.target]
    batch, heads, queries, keys, head_dim, group = attention_shapes(node)
    rows_needed = keys if node.target == GRAD_KEY_VALUE else queries
    blocks = choose_blocks(node.target, head_dim, rows_needed, profile)
    index_t = index_ctype_for(params, batch * heads * max(queries, keys) * head_dim)
    helpers = [_load_helper(name, view, params) for name, view in zip(input_names, node.inputs, strict=True)]
    helpers += [_store_helper(name, buffer, params) for name, buffer in zip(output_names, node.outputs, strict=True)]
    template = resources.files("torch_adreno.kernels").joinpath("attention.cl").read_text()
    text = "\n".join([f"#define INDEX_T {index_t}", *HELPER_NAMING, *helpers, template])
    options = (f"-DATTENTION_PASS={attention_pass}", f"-DHEAD_DIM={head_dim}", f"-DSEQ_Q={queries}",
               f"-DSEQ_K={keys}", f"-DHEADS={heads}", f"-DGROUP={group}", f"-DCAUSAL={int(node.attribute('causal'))}",
               f"-DSCALE={_float_literal(node.attribute('scale'))}", f"-DBLOCK_ROWS={blocks.rows}",
               f"-DBLOCK_COLS={blocks.cols}", f"-DMICRO_ROWS={blocks.micro_rows}", f"-DMICRO_COLS={blocks.micro_cols}")
    row_groups = math.ceil(rows_needed / blocks.rows)
    heads_launched = heads // group if node.target == GRAD_KEY_VALUE else heads
    macros = ("INDEX_T", *HELPER_NAMING_MACROS, *(f"LOAD_{n}" for n in input_names),
              *(f"STORE_{n}" for n in output_names))
    return RenderedAttention(text, options, (row_groups * blocks.threads, batch * heads_launched), (blocks.threads, 1),
                             macros, records(params))
