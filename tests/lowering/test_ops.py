"""Per-op forward and gradient tests on the OpenCL device (PoCL in CI) against eager PyTorch."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_follows_float64, assert_matches_eager

import torch_adreno
from torch_adreno.kernels import KernelChoices

pytestmark = pytest.mark.device


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (129, 5), (64, 64)])
def test_linear_shapes(shape):
    m, k = shape
    n = 7
    assert_matches_eager(F.linear, r(m, k), r(n, k), r(n))


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_mm_transposes(ta, tb):
    a = r(5, 33) if not ta else r(33, 5)
    b = r(33, 19) if not tb else r(19, 33)

    def fn(a, b):
        return (a.t() if ta else a) @ (b.t() if tb else b)

    assert_matches_eager(fn, a, b)


def test_bmm():
    assert_matches_eager(torch.bmm, r(3, 9, 17), r(3, 17, 11))


def test_addmm_alpha_beta():
    assert_matches_eager(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), r(4, 6), r(4, 3), r(3, 6))


@pytest.mark.parametrize(
    "stride,padding,dilation,groups,bias",
    [(1, 0, 1, 1, True), (1, 2, 1, 1, True), (2, 1, 1, 1, False), (1, 1, 2, 1, True), (2, 0, 1, 3, True),
     (1, 1, 1, 6, False)],
)
def test_conv2d(stride, padding, dilation, groups, bias):
    x = r(2, 6, 11, 9)
    w = r(12, 6 // groups, 3, 3)
    b = r(12) if bias else None

    def fn(x, w, b=None):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    if bias:
        assert_matches_eager(fn, x, w, b, rtol=1e-4, atol=1e-4)
    else:
        assert_matches_eager(fn, x, w, rtol=1e-4, atol=1e-4)


def test_conv1d():
    assert_matches_eager(lambda x, w: F.conv1d(x, w, padding=1, stride=2), r(2, 3, 10), r(4, 3, 3), atol=1e-4)


@pytest.mark.parametrize("kernel,stride,padding,ceil", [(2, 2, 0, False), (3, 2, 1, False), (3, 1, 1, False),
                                                       (3, 2, 0, True)])
def test_max_pool2d(kernel, stride, padding, ceil):
    def fn(x):
        return F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil)

    assert_matches_eager(fn, r(2, 3, 9, 8))


def test_max_pool2d_indices():
    def fn(x):
        return F.max_pool2d(x, 2, return_indices=True)

    assert_matches_eager(fn, r(2, 3, 8, 8))


def test_relu_and_backward():
    assert_matches_eager(lambda x: F.relu(x) * 2, r(4, 33))


@pytest.mark.parametrize("op", [torch.exp, torch.log1p, torch.tanh, torch.sigmoid, torch.abs, torch.neg,
                                torch.sqrt, torch.rsqrt, torch.sin, torch.cos])
def test_unary(op):
    x = r(5, 7).abs() + 0.1 if op in (torch.sqrt, torch.rsqrt, torch.log1p) else r(5, 7)
    assert_matches_eager(op, x)


@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum])
def test_binary_broadcast(op):
    assert_matches_eager(op, r(4, 1, 5), r(3, 1))


def test_scalars_and_pow():
    assert_matches_eager(lambda x: (x * 3 - 1.5) / 2 + x**2 + x.pow(3) + 1 / (x.abs() + 1), r(6, 5))


def test_comparisons_and_where():
    def fn(x, y):
        return torch.where(x > y, x, y * 2) + (x <= 0).float() - (x == y).float() + (x != 0.5).float()

    assert_matches_eager(fn, r(4, 6), r(4, 6))


def test_clamp():
    assert_matches_eager(lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1), r(5, 9))


@pytest.mark.parametrize("dims,keepdim", [(None, False), ([0], True), ([1], False), ([0, 2], False), ([-1], True)])
def test_sum_mean(dims, keepdim):
    def fn(x):
        if dims is None:
            return x.sum() + x.mean()
        return x.sum(dims, keepdim=keepdim) + x.mean(dims, keepdim=keepdim)

    assert_matches_eager(fn, r(3, 300, 5))


def test_amax_argmax():
    x = r(7, 300)
    assert_matches_eager(lambda x: x.amax(1) + x.amin(0).sum(), x)
    assert_matches_eager(lambda x: (x.argmax(1), x.argmin(0), x.argmax()), x, grad=False)


def test_max_dim():
    assert_matches_eager(lambda x: torch.max(x, 1), r(6, 9))


def test_views():
    def fn(x):
        y = x.permute(2, 0, 1).reshape(6, -1)
        z = y[1:5:2, ::3].t().unsqueeze(0).expand(2, -1, -1)
        return z * x.select(1, 2).sum() + x.view(-1)[3]

    assert_matches_eager(fn, r(4, 5, 6))


def test_log_softmax_and_cross_entropy():
    x, y = r(16, 10), torch.randint(0, 10, (16,))
    assert_matches_eager(lambda x: F.log_softmax(x, 1) * 1.5, x)
    assert_matches_eager(lambda x: F.softmax(x, 0), x)
    assert_matches_eager(lambda x, y: F.cross_entropy(x, y), x, y)
    y_ignored = y.clone()
    y_ignored[::3] = -100
    assert_matches_eager(lambda x, y: F.cross_entropy(x, y), x, y_ignored)
    assert_matches_eager(lambda x, y: F.nll_loss(F.log_softmax(x, 1), y, reduction="sum"), x, y)


def test_gather_scatter():
    x = r(5, 7)
    idx = torch.randint(0, 7, (5, 3))
    assert_matches_eager(lambda x, i: torch.gather(x, 1, i), x, idx)
    assert_matches_eager(lambda x, i: x.scatter(1, i[:, :1], 2.5), x, idx)
    unique = torch.stack([torch.randperm(7)[:3] for _ in range(5)])
    assert_matches_eager(lambda x, i, s: x.scatter(1, i, s), x, unique, r(5, 3))


def test_int_and_bool_outputs():
    def fn(x):
        return (x > 0).sum(), (x * 10).long() // 3, (x > 0) & (x < 1)

    assert_matches_eager(fn, r(8, 5), grad=False)


#: The first line of each GEMM template, as it opens every kernel rendered from it.
_TEMPLATE_HEADERS = {"tiled": "// Tiled GEMM template:", "direct": "// Direct GEMM template"}


class _GemmTemplatesLaunched(torch_adreno.profile):
    """A profile that also keeps the source and build options of each GEMM kernel launched."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: list[tuple[str, tuple[str, ...]]] = []
        self.template = ""
        self.choose: Callable[[KernelChoices], KernelChoices] = lambda choices: choices

    def on_launch(self, record) -> None:
        super().on_launch(record)
        if record.kernel.kind == "gemm":
            self.gemms.append((record.kernel.source, record.kernel.build_options))

    def assert_only(self, template: str) -> None:
        assert self.gemms, "no GEMM kernel launched"
        for source, _ in self.gemms:
            assert _TEMPLATE_HEADERS[template] in source, f"a GEMM kernel not from the {template} template ran"


@pytest.fixture
def gemm_template(request):
    """A recorder of the GEMM kernels launched whose ``choose`` (``kernel_choices=`` of
    ``assert_matches_eager``) selects the GEMM template of ``request.param`` on any device (and the
    128-wide tiles with the tiled one); afterwards it checks that this template is the one that ran
    (the compile cache keys on the choices, ``compile_cache.cache_salt``)."""
    template = request.param
    with _GemmTemplatesLaunched() as launched:
        launched.template = template
        launched.choose = lambda choices: choices.with_gemm_template(template, large_tiles=template == "tiled")
        yield launched
    launched.assert_only(template)


@pytest.mark.parametrize("gemm_template", ["tiled", "direct"], indirect=True)
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 17, 5), (129, 70, 33), (64, 64, 64), (17, 200, 3), (130, 37, 131)])
def test_both_gemm_templates_on_this_device(gemm_template, shape):
    """The local-memory template serves GPUs, the direct one CPUs: check both here, whatever the device."""
    m, k, n = shape
    assert_matches_eager(lambda a, b: a @ b, r(m, k), r(k, n), kernel_choices=gemm_template.choose)
    assert_matches_eager(lambda a, b: a.t() @ b.t(), r(k, m), r(n, k), kernel_choices=gemm_template.choose)


@pytest.mark.parametrize("gemm_template", ["tiled", "direct"], indirect=True)
def test_both_gemm_templates_sum_the_bias_gradient_beside_the_weight_gradient(gemm_template):
    """130 x 140 outputs take 128 x 128 tiles (8 x 8 per work-item, float4 local reads) on the
    tiled template; the bias gradient is the ROW_SUM of the weight-gradient GEMM. (A device of
    many compute units would take smaller tiles for so few outputs: the 128 x 128 ones are asked
    for wherever they fit, tiles filling a single compute unit, so that every device runs this.)"""

    def large_where_they_fit(choices: KernelChoices) -> KernelChoices:
        return dataclasses.replace(gemm_template.choose(choices), tile_fill_units=1)

    assert_matches_eager(lambda x, w, b: torch.tanh(F.linear(x, w, b)), r(33, 140), r(130, 140), r(130), atol=1e-4,
                         kernel_choices=large_where_they_fit)
    assert any("-DROW_SUM=1" in options for _, options in gemm_template.gemms)
    if gemm_template.template == "tiled":
        assert any({"-DTILE_M=128", "-DTILE_N=128"} <= set(options) for _, options in gemm_template.gemms)


@pytest.mark.parametrize("gemm_template", ["tiled", "direct"], indirect=True)
def test_split_k_gemms_match_eager(gemm_template):
    """A weight gradient over k = 8 x 32 x 32 into 5 x 27 outputs, and a 4096-long product, are
    split into k slices (two launches each); the bias gradient's row sums are split alike."""
    with torch_adreno.profile() as prof:
        assert_matches_eager(lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)), r(8, 3, 32, 32), r(5, 3, 3, 3),
                             r(5), atol=1e-3, kernel_choices=gemm_template.choose)
    assert any("_splitsum_" in k.name for k in prof.kernels)
    assert_matches_eager(lambda a, b: a.t() @ b, r(4099, 20), r(4099, 30), atol=1e-3, kernel_choices=gemm_template.choose)


@pytest.mark.parametrize("gemm_template", ["tiled"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_gemm_prefetches_16_bit_operands_as_loaded(gemm_template, dtype):
    """16-bit operands wait in the prefetch registers as their bits (``A_RAW_T``/``B_RAW_T``
    ushort) and are widened only as they are stored into the tiles; float32 ones as floats.
    Forward and both gradients (each a GEMM of 16-bit operands) equal eager's, k ragged."""
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3}[dtype]
    assert_matches_eager(lambda a, b: a @ b, r(70, 37).to(dtype), r(37, 45).to(dtype), rtol=tol, atol=tol,
                         kernel_choices=gemm_template.choose)
    raw = [src for src, _ in gemm_template.gemms if "#define A_RAW_T ushort" in src and "#define B_RAW_T ushort" in src]
    assert len(raw) == len(gemm_template.gemms) >= 3, [s[:200] for s, _ in gemm_template.gemms]
    gemm_template.gemms.clear()
    assert_matches_eager(lambda a, b: a @ b, r(70, 37), r(37, 45), kernel_choices=gemm_template.choose)
    assert all("#define A_RAW_T float" in src and "#define B_RAW_T float" in src for src, _ in gemm_template.gemms)


@pytest.mark.parametrize("gemm_template", ["tiled"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_gemms_take_the_half_filled_tiles(gemm_template, dtype):
    """16-bit operands are tiled as float32 ones: where 128 x 128 tiles would leave most compute
    units a lone work-group, a ragged product of at least one such tile per compute unit (260 x 260
    on a CPU's few units) takes 128 x 64 ones (8 x 4 outputs per work-item), its operands fetched as
    raw 16-bit values; it and its gradients equal eager's."""
    import math

    from torch_adreno.runtime import get_runtime

    def half_filled_everywhere(choices: KernelChoices) -> KernelChoices:
        # (every grid of 128 x 128 tiles counts as "few")
        return dataclasses.replace(gemm_template.choose(choices), half_filled_units=1e6)

    side = 128 * max(2, math.isqrt(get_runtime().profile.compute_units - 1) + 1) + 4
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 1e-3}[dtype]
    assert_matches_eager(lambda a, b: a @ b, r(side, 70).to(dtype), r(70, side).to(dtype), rtol=tol, atol=tol,
                         kernel_choices=half_filled_everywhere)
    forward = [(src, set(options)) for src, options in gemm_template.gemms
               if {f"-DSIZE_M={side}", f"-DSIZE_N={side}", "-DSIZE_K=70"} <= set(options)]
    assert len(forward) == 1, [options for _, options in gemm_template.gemms]
    source, options = forward[0]
    assert {"-DTILE_M=128", "-DTILE_N=64", "-DWPT_N=4"} <= options and "#define A_RAW_T ushort" in source, options


_STEPPED_HELPER = re.compile(r"KERNEL_HELPER\(_(load|fetch)_[ab]\)\([^)]*const INDEX_T kt, const INDEX_T kk")


@pytest.mark.parametrize("gemm_template", ["tiled"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_convolutions_read_their_operands_by_k_step(gemm_template, dtype):
    """A 3 x 3 convolution over 32 channels (forward, input gradient) and its weight gradient over
    k = 8 x 32 x 32 positions, split in k slices: every GEMM's im2col operand takes (K step,
    offset) (``kernels.gemm_operands.KSteps``), the split slices start at whole steps, 16-bit
    operands are fetched raw by step too; results equal eager's (bfloat16: by the float64 rule, as
    eager's own bfloat16 convolution differs with the CPU it runs on)."""
    inputs = r(8, 32, 32, 32).to(dtype), r(16, 32, 3, 3).to(dtype)
    with torch_adreno.profile() as prof:
        if dtype is torch.float32:
            assert_matches_eager(lambda x, w: F.conv2d(x, w, padding=1), *inputs, rtol=1e-3, atol=1e-3,
                                 kernel_choices=gemm_template.choose)
        else:
            assert_follows_float64(lambda x, w: F.conv2d(x, w, padding=1), *inputs, kernel_choices=gemm_template.choose)
    assert any("_splitsum_" in k.name for k in prof.kernels)
    assert len(gemm_template.gemms) >= 3
    for source, options in gemm_template.gemms:
        assert _STEPPED_HELPER.search(source) and "-DK_GRANULE=1" not in options, options
        if dtype is torch.bfloat16:
            assert "#define B_RAW_T ushort" in source or "#define A_RAW_T ushort" in source


def test_a_linear_layer_over_a_reshaped_activation_loads_it_without_division(monkeypatch):
    """GPT-2's linear layers read a [batch, seq, d] activation as [batch * seq, d]: the operand's
    flat index folds back to ``m * d + k`` (it once divided and took the remainder per element,
    in every GEMM's operand loads and their gradients'), and the results equal eager's."""
    from helpers import record_programs

    programs = record_programs(monkeypatch)

    def fn(x, w):
        h = torch.tanh(x)  # an intermediate, so that the view is over a buffer of the graph
        return (h.view(4 * 6, 10) @ w).view(4, 6, 7)

    assert_matches_eager(fn, r(4, 6, 10), r(10, 7), options={"compile_cache": False})  # (compiled here, recorded)
    gemms = [k for prog in programs for k in prog.kernels if k.kind == "gemm"]
    assert len(gemms) >= 3, [k.name for k in gemms]  # forward, and both gradients
    for kernel in gemms:
        operands = kernel.source[kernel.source.index("_load_a)("):kernel.source.index("#define LOAD_A")]
        assert " / " not in operands and " % " not in operands, (kernel.name, operands)


@pytest.mark.parametrize("gemm_template", ["tiled", "direct"], indirect=True)
def test_both_gemm_templates_for_convolution(gemm_template):
    assert_matches_eager(lambda x, w: F.conv2d(x, w, stride=2, padding=1), r(2, 3, 9, 9), r(5, 3, 3, 3), atol=1e-4,
                         kernel_choices=gemm_template.choose)


def test_embedding_and_its_backward():
    idx = torch.randint(0, 20, (3, 5))
    idx[0, 0] = idx[1, 1]  # repeated rows accumulate
    assert_matches_eager(lambda w, i: F.embedding(i, w) * 2, r(20, 4), idx)


def test_boolean_bitwise_ops():
    def fn(x):
        mask = (x > 0) & (x < 1)
        return (~mask).float() + (mask | (x < -1)).float() + (mask ^ (x > 0.5)).float()

    assert_matches_eager(fn, r(6, 7), grad=False)


def test_split_cat_stack():
    def fn(x):
        a, b, c = x.chunk(3, dim=1)
        return torch.cat([c, a * 2], 1) + torch.stack([a, b], 0).sum(0).repeat(1, 2)

    assert_matches_eager(fn, r(4, 9))


def test_var_std_layer_norm_batch_norm():
    assert_matches_eager(lambda x: x.var(1) + x.std(0, correction=0).sum() + x.var(), r(6, 50))
    assert_matches_eager(lambda x, w, b: F.layer_norm(x, (16,), w, b), r(4, 3, 16), r(16), r(16))
    rm, rv = torch.zeros(5), torch.ones(5)
    assert_matches_eager(lambda x, w, b: F.batch_norm(x, rm.clone(), rv.clone(), w, b, training=True),
                         r(8, 5, 3, 3), r(5), r(5), atol=1e-4)


def test_gelu_tanh_and_exact():
    assert_matches_eager(lambda x: F.gelu(x, approximate="tanh") + F.gelu(x), r(7, 9))
