"""Kernel and memory stages (no device): rendered source, launch geometry, memory plans."""

from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from helpers import capture_graphs

from torch_adreno import ir
from torch_adreno.config import Config
from torch_adreno.fusion import fuse
from torch_adreno.kernels import render_program
from torch_adreno.kernels.expressions import EXPRESSIONS
from torch_adreno.lowering import lower_graph
from torch_adreno.memory import StorageKind, plan_memory
from torch_adreno.models import MODELS
from torch_adreno.targets import REFERENCE_PROFILE

CPU_PROFILE = dataclasses.replace(REFERENCE_PROFILE, is_gpu=False)


def compile_stages(fn, *inputs, index=0, profile=REFERENCE_PROFILE, num_host_outputs=None):
    gm = capture_graphs(fn, *inputs)[index]
    graph = lower_graph(gm, Config(), "g", num_host_outputs)
    fused = fuse(graph, Config())
    plan = plan_memory(fused, profile)
    return graph, fused, plan, render_program(fused, plan, profile)


def lenet_program(index: int, profile=REFERENCE_PROFILE):
    spec = MODELS["lenet"]
    model = spec.make()
    x, _ = spec.batch()
    names = [n for n, _ in model.named_parameters()]

    def forward(x, *params):
        return torch.func.functional_call(model, dict(zip(names, params, strict=True)), (x,))

    params = [p.detach().requires_grad_() for p in model.parameters()]
    return compile_stages(forward, x, *params, index=index, profile=profile)


def test_every_ir_op_has_a_rendering():
    assert set(ir.OPS) <= set(EXPRESSIONS)


def test_kernels_name_their_fx_nodes_and_have_explicit_geometry():
    for index in (0, 1):
        _, _, _, program = lenet_program(index)
        for k in program.kernels:
            assert k.source.startswith(f"// kernel {k.symbol}:")
            for node in k.fx_nodes:
                assert f"from FX node {node} (" in k.source
            assert k.local_size and all(s > 0 for s in k.local_size)
            assert all(g % loc == 0 for g, loc in zip(k.global_size, k.local_size, strict=True))
            assert re.fullmatch(r"g_\d+_(pw|seg|red|gemm|splitsum)_[a-z0-9_]+", k.name)


def test_rendering_is_deterministic():
    a = [k.source for k in lenet_program(1)[3].kernels]
    b = [k.source for k in lenet_program(1)[3].kernels]
    assert a == b


def test_padded_reads_stay_under_their_guard():
    _, _, _, program = compile_stages(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(1, 2, 5, 5),
                                      torch.randn(3, 2, 3, 3))
    (gemm,) = program.kernels
    load_b = gemm.source.split("KERNEL_HELPER(_load_b)(")[1].split("}")[0]
    # The input is read inside the conditional, never into an unconditional temporary.
    assert re.search(r"\? in\d+\[", load_b)
    assert not re.search(r"const float \w+ = in\d+\[", load_b)


def test_im2col_tap_is_computed_from_the_k_step_alone():
    """The tiled template passes k as (K step, offset): a 3 x 3 convolution over 32 channels, K
    step 16, reads its kernel tap and channel block from the step (the same across a work-group)
    and adds the offset to the channel only. With k itself the helpers divide k per element."""

    def conv(x, w):
        return F.conv2d(x, w, padding=1)

    inputs = (torch.randn(2, 32, 8, 8), torch.randn(16, 32, 3, 3))
    (kernel,) = compile_stages(conv, *inputs)[3].kernels
    granule = re.search(r"-DK_GRANULE=(\d+)", " ".join(kernel.build_options))
    tile_k = re.search(r"-DTILE_K=(\d+)", " ".join(kernel.build_options))
    assert granule and tile_k and granule.group(1) == tile_k.group(1) == "16"
    for helper in ("_load_a", "_load_b"):
        body = kernel.source.split(f"KERNEL_HELPER({helper})(")[1].split("}")[0]
        assert "const INDEX_T kt, const INDEX_T kk" in body
        assert re.search(r"\(kt / 6\)", body) and re.search(r"\(kt % 2\)", body)  # (tap row, channel block)
        assert not re.search(r"kk [/%]", body) and not re.search(r"\bk [/%]", body)
    # The weight gradient's k runs over 2 x 7 x 7 positions: a step of 16 does not divide a row
    # of 7, so its helpers take k itself (one division per element, not two).
    x, w = (t.requires_grad_() for t in (torch.randn(2, 32, 7, 7), torch.randn(16, 32, 3, 3)))
    backward = compile_stages(conv, x, w, index=1)[3].kernels
    signatures = {k.name: k.source.split("KERNEL_HELPER(_load_a)(")[1].split(", __global")[0] for k in backward}
    assert sorted(signatures.values()) == ["const INDEX_T b, const INDEX_T m, const INDEX_T k",
                                           "const INDEX_T b, const INDEX_T m, const INDEX_T kt, const INDEX_T kk"]


def test_gemm_template_choice_follows_the_device():
    _, _, _, gpu = compile_stages(torch.mm, torch.randn(70, 40), torch.randn(40, 33))
    _, _, _, cpu = compile_stages(torch.mm, torch.randn(70, 40), torch.randn(40, 33), profile=CPU_PROFILE)
    assert "__local float a_tile" in gpu.kernels[0].source and "-DTILE_M=64" in gpu.kernels[0].build_options
    assert "float8 acc[WPT_M]" in cpu.kernels[0].source and "__local" not in cpu.kernels[0].source


def test_gemm_tile_grows_while_every_compute_unit_keeps_a_work_group():
    from torch_adreno.kernels.gemm import choose_tiling, tiling_candidates

    desktop_gpu = dataclasses.replace(REFERENCE_PROFILE, compute_units=132, max_work_group_size=1024, local_mem_bytes=49152)
    shape = {size: (t.tile_m, t.tile_n, t.wpt_m, t.wpt_n) for size in (512, 1024, 2048, 4096)
             for t in [choose_tiling(size, size, 1, desktop_gpu)]}
    # 1024^2 in 128 x 128 tiles is 64 work-groups for 132 compute units: 64 x 64 (256 groups) instead.
    assert shape == {512: (64, 64, 4, 4), 1024: (64, 64, 4, 4), 2048: (128, 128, 8, 8), 4096: (128, 128, 8, 8)}
    assert choose_tiling(1024, 1024, 4, desktop_gpu).tile_m == 128  # a batch of four fills the device
    # 128 x 128 tiles between one and 1.5 per compute unit leave most units one work-group:
    # GPT-2's c_attn (144 tiles) and c_fc (192) take 128 x 64, its 50,257-word head (3,144) and
    # 2048^2 (256: nearly two per unit) keep 128 x 128.
    for m, n in ((1024, 2304), (1024, 3072)):
        assert (lambda t: (t.tile_m, t.tile_n, t.tile_k, t.wpt_m, t.wpt_n))(choose_tiling(m, n, 1, desktop_gpu)) == (128, 64, 8, 8, 4)
    # One row of them (a 128-channel convolution over 16 x 28 x 28 positions): 8 x 8 per work-item.
    assert (lambda t: (t.tile_m, t.tile_n, t.wpt_m, t.wpt_n))(choose_tiling(128, 12544, 1, desktop_gpu)) == (128, 64, 8, 8)
    assert (choose_tiling(1024, 50257, 1, desktop_gpu).tile_n, choose_tiling(2048, 2048, 1, desktop_gpu).tile_n) == (128, 128)
    assert choose_tiling(1024, 10, 1, REFERENCE_PROFILE).tile_n == 16
    # A mobile-class GPU (4 compute units) keeps 64 x 64 tiles by default; the tuner may try 128.
    assert (choose_tiling(2048, 2048, 1, REFERENCE_PROFILE).tile_m, choose_tiling(2048, 2048, 1, REFERENCE_PROFILE).tile_n) == (64, 64)
    assert any(t.tile_m == 128 for t in tiling_candidates(2048, 2048, 1, REFERENCE_PROFILE))
    candidates = tiling_candidates(1024, 1024, 1, desktop_gpu)
    assert candidates[0] == choose_tiling(1024, 1024, 1, desktop_gpu)
    assert any(t.tile_m == t.tile_n == 128 for t in candidates)
    assert all(t.wpt_m * t.wpt_n <= 64 and t.local_bytes() <= desktop_gpu.local_mem_bytes for t in candidates)
    # A 64-channel convolution's 64 x 128 tiles, also with 8 x 8 outputs per work-item (128 of them).
    conv = tiling_candidates(64, 50176, 1, desktop_gpu)
    assert (conv[0].tile_m, conv[0].tile_n, conv[0].tile_k, conv[0].wpt_m, conv[0].wpt_n) == (64, 128, 8, 4, 8)
    assert any((t.tile_m, t.tile_n, t.wpt_m, t.wpt_n) == (64, 128, 8, 8) for t in conv)


def test_memory_plan_invariants():
    for index in (0, 1):
        graph, _, plan, _ = lenet_program(index)
        arena = [a for a in plan.allocations.values() if a.kind is StorageKind.ARENA]
        for a in arena:
            assert a.offset % plan.alignment == 0
            assert a.offset + a.nbytes <= plan.arena_bytes[a.arena]
        for a in arena:
            for b in arena:
                if a is not b and a.arena == b.arena:
                    overlap = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
                    live_together = a.first_use <= b.last_use and b.first_use <= a.last_use
                    assert not (overlap and live_together), (a, b)
        for name in graph.input_buffers():
            assert plan.allocations[name].kind is StorageKind.INPUT


def test_saved_activations_get_per_call_storage():
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    gm = capture_graphs(lambda x, w: torch.tanh(x @ w.t()), x, w)[0]
    graph = lower_graph(gm, Config(), "fw", num_host_outputs=1)
    plan = plan_memory(fuse(graph, Config()), REFERENCE_PROFILE)
    device = {o.buffer for o in graph.outputs if o.role is ir.OutputRole.DEVICE}
    assert device - graph.input_buffers(), "the forward saves a computed tensor"
    for out in graph.outputs:
        if out.buffer and out.buffer not in graph.input_buffers():
            # A buffer that escapes to a later graph needs fresh storage per call, also when the
            # user reads it too (tanh's output is both returned and saved here).
            expected = StorageKind.PER_CALL if out.buffer in device else StorageKind.ARENA
            assert plan.allocations[out.buffer].kind is expected


def test_k_step_loop_unrolled_for_8_x_8_blocks_of_adjacent_b_columns_whose_operands_take_the_step():
    """``gemm.k_step_unroll``: the K step's loop is unrolled in full (``-DK_UNROLL`` = the K step)
    for 8 x 8 outputs per work-item whose B has adjacent columns and whose operand helpers divide
    no per-element K index: a plain matrix product and a convolution's forward (its im2col gather
    takes the step); not for x W^T, a weight gradient whose gather divides k per element, nor the
    4 x 8 blocks of 64-row tiles."""
    desktop_gpu = dataclasses.replace(REFERENCE_PROFILE, compute_units=132, max_work_group_size=1024, local_mem_bytes=49152)

    def options(kernel):
        return dict(o[2:].split("=") for o in kernel.build_options if o.startswith("-D"))

    def gemms(fn, *inputs, index=0):
        return [options(k) for k in compile_stages(fn, *inputs, index=index, profile=desktop_gpu)[3].kernels
                if "TILE_M" in options(k)]

    (mm,) = gemms(torch.mm, torch.randn(2048, 512), torch.randn(512, 2048))
    assert (mm["WPT_M"], mm["WPT_N"], mm["K_GRANULE"], mm["B_N_FASTEST"], mm["K_UNROLL"]) == ("8", "8", "1", "1",
                                                                                             mm["TILE_K"])
    # x W^T reads B along k: kept rolled.
    (linear,) = gemms(F.linear, torch.randn(2048, 512), torch.randn(2048, 512))
    assert (linear["WPT_M"], linear["WPT_N"], linear["B_N_FASTEST"], linear["K_UNROLL"]) == ("8", "8", "0", "0")

    def conv(x, w):
        return F.conv2d(x, w, padding=1)

    x, w = torch.randn(16, 128, 28, 28, requires_grad=True), torch.randn(128, 128, 3, 3, requires_grad=True)
    (forward,) = gemms(conv, x, w)
    assert (forward["WPT_M"], forward["WPT_N"], forward["K_UNROLL"]) == ("8", "8", forward["K_GRANULE"])
    # (ResNet-18's layer4 with more input channels: 216 tiles of 128 x 128 unsplit; k runs over 16 x
    # 7 x 7 positions, which a K step of 8 does not divide)
    x, w = torch.randn(16, 768, 7, 7, requires_grad=True), torch.randn(512, 768, 3, 3, requires_grad=True)
    by_n = {g["SIZE_N"]: g for g in gemms(conv, x, w, index=1)}
    weight_gradient = by_n["6912"]
    assert (weight_gradient["WPT_M"], weight_gradient["WPT_N"], weight_gradient["K_GRANULE"]) == ("8", "8", "1")
    assert weight_gradient["K_UNROLL"] == "0"
    (narrow,) = gemms(conv, torch.randn(16, 64, 56, 56), torch.randn(64, 64, 3, 3))
    assert (narrow["TILE_M"], narrow["WPT_M"], narrow["WPT_N"], narrow["K_UNROLL"]) == ("64", "4", "8", "0")


def test_kernel_bytes_count_what_a_gather_or_a_slice_can_reach():
    """A generated kernel's read bytes: each buffer once, but no more of it than its loads reach, one
    element per iteration each: an embedding lookup of 4 tokens reads 4 rows of its 1000-row table
    (fused into a layer norm too), a slice its columns; a full read counts the whole buffer."""
    table, tokens = torch.randn(1000, 16), torch.tensor([3, 7, 900, 3])
    cases = [
        (lambda t, i: F.embedding(i, t) * 2 + 1, (table, tokens), 4 * 16 * 4 + 4 * 8),
        (lambda t, i: F.layer_norm(F.embedding(i, t), (16,)), (table, tokens), 4 * 16 * 4 + 4 * 8),
        (lambda x: x[:, :8] * 2, (torch.randn(64, 64),), 64 * 8 * 4),
        (lambda x: x * 2 + x.sum(), (torch.randn(64, 64),), None),
    ]
    for fn, inputs, expected in cases:
        kernels = compile_stages(fn, *inputs)[3].kernels
        reads = sum(k.bytes_read for k in kernels)
        if expected is not None:
            assert reads == expected, [(k.name, k.bytes_read) for k in kernels]
        else:  # every kernel reads all of x (the sum's and the pointwise one)
            assert all(k.bytes_read >= 64 * 64 * 4 for k in kernels), [(k.name, k.bytes_read) for k in kernels]
