"""Stream-K GEMMs (fusion/split_k.py ``choose_stream``, gemm.cl ``STREAM``, gemm_stream_sum.cl):
the schedule (no device), the slices layout of the ONNX bodies against the kernel's (no device),
and on the device forward and gradients against eager with the schedule forced onto the tiled
template (the CPU runs the direct template and has too few compute units otherwise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_adreno
import torch_adreno.backend as backend
from tests.test_onnx_bodies import _evaluate
from torch_adreno import ir
from torch_adreno.export.kernel_bodies import SplitK, flat, split_slices, stream_sums
from torch_adreno.fusion import split_k
from torch_adreno.kernels import gemm as gemm_kernels

F32 = ir.DType.F32


def _gemm(m: int, n: int, k: int, batch: int = 1) -> ir.Gemm:
    mv, nv, kv = ir.Var("m", m), ir.Var("n", n), ir.Var("k", k)
    return ir.Gemm("g", "out", batch, m, n, k, ir.Load("a", (mv, kv), F32), ir.Load("c", (kv, nv), F32), (mv, nv), ())


def test_gpt2_products_on_132_compute_units_get_their_last_wave_shared_out() -> None:
    # 1,024 x 2,304: 144 tiles, 132 in a whole wave, the other 12 cut into 11 slices of 72 (k 768).
    s = split_k.choose_stream(_gemm(1024, 2304, 768), 132)
    assert s is not None and (s.full_tiles, s.split, s.slice_k, s.remainder_tiles(1)) == (132, 11, 72, 12)
    assert s.work_groups(1) == 264 and s.split * s.slice_k >= 768
    # 1,024 x 768: 48 tiles, no whole wave: cut to fill two work-groups per compute unit.
    s = split_k.choose_stream(_gemm(1024, 768, 3072), 132)
    assert s is not None and (s.full_tiles, s.split) == (0, 5) and s.work_groups(1) == 240
    assert s.slice_k % 8 == 0 and (s.split - 1) * s.slice_k < 3072 <= s.split * s.slice_k


@pytest.mark.parametrize(("m", "n", "k", "units", "why"), [
    (1024, 50257, 768, 132, "3,144 tiles: 24 waves, the last one's loss small"),
    (1024, 2304, 768, 144, "144 tiles on 144 compute units: whole waves"),
    (64, 50176, 576, 132, "64 rows: thinner than a 128 x 128 tile"),
    (1024, 2304, 96, 132, "k = 96: too short to slice"),
])
def test_no_stream_where_it_cannot_help(m, n, k, units, why) -> None:
    assert split_k.choose_stream(_gemm(m, n, k), units) is None, why


def test_the_onnx_bodies_lay_out_the_slices_as_the_kernel_stores_them_and_add_them_up() -> None:
    # m 3, n 5 in tiles of 2: 2 x 3 tiles per batch element, batch 2: 12 tiles, 8 full, 4 cut in 2
    # slices of 3 (k 5, the last slice padded).
    batch, m, n, k, tile, full, split, length = 2, 3, 5, 5, 2, 8, 2, 3
    rng = np.random.default_rng(0)
    a, c = rng.standard_normal((batch, m, k)).astype(np.float32), rng.standard_normal((batch, k, n)).astype(np.float32)
    bv, mv, nv, kv = ir.Var("b", batch), ir.Var("m", m), ir.Var("n", n), ir.Var("k", k)
    g = ir.Gemm("g", "out", batch, m, n, k, ir.Load("a", (bv, mv, kv), F32), ir.Load("c", (bv, kv, nv), F32),
                (bv, mv, nv), ())
    tiles_m, tiles_n = math.ceil(m / tile), math.ceil(n / tile)
    spec = SplitK(g, "g_slices", split, length, False, (tile, tiles_m, tiles_n, full))
    buffers = {"a": ir.Buffer("a", a.shape, F32), "c": ir.Buffer("c", c.shape, F32),
               "out": ir.Buffer("out", (batch, m, n), F32)}
    slices = _evaluate(buffers, {"a": a, "c": c}, lambda body, values, shapes: split_slices(body, spec, values, shapes, "k"))

    def tile_of(product: np.ndarray, t: int) -> np.ndarray:  # tile t (batch, row of tiles, column), padded
        b, rest = divmod(t, tiles_m * tiles_n)
        tm, tn = divmod(rest, tiles_n)
        padded = np.zeros((tiles_m * tile, tiles_n * tile), np.float32)
        padded[:m, :n] = product[b]
        return padded[tm * tile:(tm + 1) * tile, tn * tile:(tn + 1) * tile].reshape(-1)

    pa, pc = np.pad(a, ((0, 0), (0, 0), (0, 1))), np.pad(c, ((0, 0), (0, 1), (0, 0)))
    expected = [tile_of(a @ c, t) for t in range(full)]
    for s in range(split):
        part = pa[:, :, s * length:(s + 1) * length] @ pc[:, s * length:(s + 1) * length]
        expected += [tile_of(part, t) for t in range(full, batch * tiles_m * tiles_n)]
    np.testing.assert_allclose(slices, np.concatenate(expected), rtol=1e-5, atol=1e-6)

    buffers["g_slices"] = ir.Buffer("g_slices", (slices.size,), F32)
    total = _evaluate(buffers, {"g_slices": slices}, lambda body, values, shapes: flat(body, stream_sums(body, spec, values["g_slices"])))
    np.testing.assert_allclose(total, (a @ c).reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.fixture
def forced_stream(monkeypatch):
    """The tiled template and stream-K on this device, as if it had ``units`` compute units."""
    units = {"value": 4}
    choose = split_k.choose_stream
    monkeypatch.setattr(gemm_kernels, "use_local_memory_tiles", lambda profile: True)
    monkeypatch.setattr(backend, "stream_k_applies", lambda profile: True)
    monkeypatch.setattr(split_k, "choose_stream", lambda g, compute_units: choose(g, units["value"]))
    torch._dynamo.reset()
    yield units
    torch._dynamo.reset()


def _stream_kernels(prof) -> list[str]:
    return [k.name for k in prof.kernels if "splitsum" in k.name]


@pytest.mark.device
@pytest.mark.parametrize(("units", "shape"), [(4, (300, 200, 260)), (5, (130, 300, 130))],
                         ids=["a_whole_wave_and_the_rest_in_slices", "all_in_slices"])
def test_linear_forward_and_gradients_follow_eager(forced_stream, units, shape) -> None:
    forced_stream["value"] = units
    tokens, d_in, d_out = shape
    torch.manual_seed(0)
    layer = torch.nn.Linear(d_in, d_out)
    x = torch.randn(tokens, d_in, requires_grad=True)
    compiled = torch.compile(lambda x: F.gelu(layer(x)), backend="adreno", options={"compile_cache": False})
    with torch_adreno.profile() as prof:
        y = compiled(x)
        y.square().sum().backward()
    assert _stream_kernels(prof), [k.name for k in prof.kernels]
    ours = (y.detach(), x.grad.clone(), layer.weight.grad.clone())
    x.grad, layer.weight.grad, layer.bias.grad = None, None, None
    y64 = F.gelu(F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    y64.square().sum().backward()
    reference = (y64.detach(), x.grad, layer.weight.grad)
    x.grad, layer.weight.grad = None, None
    ye = F.gelu(layer(x))
    ye.square().sum().backward()
    eager = (ye.detach(), x.grad, layer.weight.grad)
    for o, r, e in zip(ours, reference, eager, strict=True):
        assert (o.double() - r).abs().max() <= 2 * (e.double() - r).abs().max() + 1e-6


@pytest.mark.device
def test_a_batched_product_follows_eager(forced_stream) -> None:
    forced_stream["value"] = 7  # 2 x 4 tiles: 7 in a wave, the last in slices
    torch.manual_seed(0)
    a, b = torch.randn(2, 130, 256), torch.randn(2, 256, 130)
    compiled = torch.compile(torch.bmm, backend="adreno", options={"compile_cache": False})
    with torch_adreno.profile() as prof:
        out = compiled(a, b)
    assert _stream_kernels(prof)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.device
def test_an_exported_step_with_a_stream_k_product_runs_in_onnxruntime_as_ours(forced_stream, tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from tests.test_onnx_export import onnxruntime_losses

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(200, 260), torch.nn.ReLU(), torch.nn.Linear(260, 10))
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.05), momentum=0.9)
    step = torch_adreno.TrainingStep(model, lambda m, x, y: F.cross_entropy(m(x), y), opt)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(300, 200, generator=generator), torch.randint(0, 10, (300,), generator=generator))
               for _ in range(5)]
    step(*batches[0])
    with torch_adreno.profile() as prof:
        step(*batches[1])
    assert step.replay is not None and _stream_kernels(prof)
    exported = step.export(tmp_path / "step.onnx")
    ours = [step(*b).item() for b in batches[2:]]
    theirs = onnxruntime_losses(exported, batches[2:])
    np.testing.assert_allclose(theirs, ours, rtol=1e-4)
